//! The faults `explore` injects into a run, and the classes they fall in: one place for their
//! meaning, their text (`crash-after:17`, as a divergence's reproducer prints it and a scenario's
//! `perturbation:` names it) and how that text is read back.
//!
//! Points are counted over the whole run, from 0, in the order the run reaches them: commands
//! sent, calls into the logic, ticks of the backend-pool updater, and *deliveries* — the batches
//! of watch events handed to the logic after its start-up lists (not the lists themselves).

use std::fmt;

/// One fault in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Perturbation {
    /// The controller dies just before it sends its n-th command, and a new one starts from the
    /// cluster and Azure alone (a `restart`): that command and those issued with it are never
    /// sent.
    CrashBefore(u64),
    /// The n-th command is applied, and the controller dies before its answer reaches the logic.
    CrashAfter(u64),
    /// Multi-SLB local-service mode: the controller dies just before the n-th tick of the
    /// backend-pool updater (its queue dies with it).
    CrashBeforePoolTick(u64),
    /// Multi-SLB local-service mode: the controller dies during the `tick`-th tick of the
    /// backend-pool updater, once the first `after` groups it drained are carried out (each
    /// pool's GET and PUT or DELETE done): the tick's other groups are never written, and the queue and
    /// the Azure resource lock die with it. `after` ≥ 1 (0 is [`Self::CrashBeforePoolTick`]'s
    /// point, the queue drained or not).
    CrashInPoolTick { tick: u64, after: u64 },
    /// The controller dies just before the `at`-th delivery, and the new one's lists are the
    /// cluster as it was at an earlier moment (an informer cache behind the API server): at the
    /// first start if `listed_at` is 0, else at the (`listed_at` − 1)-th delivery, so
    /// `listed_at ≤ at`. Its watches then deliver what changed since, coalesced to the last
    /// state of each object.
    Stale { at: u64, listed_at: u64 },
    /// The n-th delivery is held back and arrives with the next one, coalesced to the last event
    /// of each object (an intermediate state never seen); with no next one, a re-list brings the
    /// truth [`RELIST_AFTER_MS`] later.
    Coalesce(u64),
    /// The `event`-th event of the `delivery`-th delivery is lost; a re-list [`RELIST_AFTER_MS`]
    /// later delivers the truth: every object the watches select, and the deletion of every
    /// object they had brought that they no longer select (as `clb-host run` turns a watch's
    /// re-list into observations).
    Drop { delivery: u64, event: u64 },
    /// The n-th delivery arrives twice, the second right after the first.
    Duplicate(u64),
    /// The n-th delivery's events arrive with the objects in the reverse order (each object's own
    /// events keep theirs, as a watch per kind does).
    Reorder(u64),
    /// The leader loses its lease just as it sends its n-th command: the command is in flight
    /// and lands [`FAILOVER_LATE_MS`] later, after the other replica took over (a new controller
    /// from the cluster and Azure, as after a crash); the deposed leader sends nothing more.
    Failover(u64),
    /// Multi-SLB local-service mode: the leader loses its lease during the `tick`-th tick of the
    /// backend-pool updater, once its first `group` groups are carried out, with the next
    /// group's write (its GET done, its PUT or DELETE sent) in flight: that write lands after
    /// the other replica took over and ran its first tick ([`FAILOVER_LATE_MS`] after it), the
    /// tick's other groups are never written. `group` < the tick's groups.
    FailoverInPoolTick { tick: u64, group: u64 },
    /// Just before the n-th call into the logic (`observe`, `complete`, `tick`), the logic is
    /// swapped to a rebuilt copy of itself: its state exported and imported into a fresh instance.
    Swap(u64),
}

/// How long after a lost event the watch's re-list delivers the truth, and the longest a held
/// delivery waits for a next one: a watch's reconnection, in virtual time.
pub const RELIST_AFTER_MS: u64 = 60_000;

/// How long after the lease was lost a deposed leader's command in flight lands: after the
/// successor's start-up (its reads and first writes run at the instant it takes over); and how
/// long after the successor's first backend-pool tick a pool write in flight lands.
pub const FAILOVER_LATE_MS: u64 = 1_000;

/// A kind of perturbation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    Crash,
    Stale,
    Unobserved,
    Swap,
    Failover,
}

impl Class {
    pub const ALL: [Class; 5] = [Class::Crash, Class::Stale, Class::Unobserved, Class::Swap, Class::Failover];

    pub fn name(self) -> &'static str {
        match self {
            Class::Crash => "crash",
            Class::Stale => "stale",
            Class::Unobserved => "unobserved",
            Class::Swap => "swap",
            Class::Failover => "failover",
        }
    }

    /// The class a perturbation belongs to.
    pub fn of(perturbation: Perturbation) -> Class {
        use Perturbation::*;
        match perturbation {
            CrashBefore(_) | CrashAfter(_) | CrashBeforePoolTick(_) | CrashInPoolTick { .. } => Class::Crash,
            Stale { .. } => Class::Stale,
            Coalesce(_) | Drop { .. } | Duplicate(_) | Reorder(_) => Class::Unobserved,
            Swap(_) => Class::Swap,
            Failover(_) | FailoverInPoolTick { .. } => Class::Failover,
        }
    }
}

/// Why a class or a perturbation's text is not one.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PerturbationError {
    #[error("unknown class {0:?}: the classes are crash, stale, unobserved, swap and failover")]
    UnknownClass(String),
    #[error(
        "{0:?} is not a perturbation: crash-before:N, crash-after:N, crash-before-pool-tick:N, \
         crash-in-pool-tick:N:K (K ≥ 1), stale:N:M (M ≤ N), coalesce:N, drop:N:K, duplicate:N, reorder:N, swap:N, \
         failover:N or failover-in-pool-tick:N:K"
    )]
    Bad(String),
}

impl std::str::FromStr for Class {
    type Err = PerturbationError;

    fn from_str(s: &str) -> Result<Class, PerturbationError> {
        let s = s.trim();
        Class::ALL.into_iter().find(|c| c.name() == s).ok_or_else(|| PerturbationError::UnknownClass(s.to_owned()))
    }
}

impl fmt::Display for Perturbation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Perturbation::*;
        match self {
            CrashBefore(n) => write!(f, "crash-before:{n}"),
            CrashAfter(n) => write!(f, "crash-after:{n}"),
            CrashBeforePoolTick(n) => write!(f, "crash-before-pool-tick:{n}"),
            CrashInPoolTick { tick, after } => write!(f, "crash-in-pool-tick:{tick}:{after}"),
            Stale { at, listed_at } => write!(f, "stale:{at}:{listed_at}"),
            Coalesce(n) => write!(f, "coalesce:{n}"),
            Drop { delivery, event } => write!(f, "drop:{delivery}:{event}"),
            Duplicate(n) => write!(f, "duplicate:{n}"),
            Reorder(n) => write!(f, "reorder:{n}"),
            Swap(n) => write!(f, "swap:{n}"),
            Failover(n) => write!(f, "failover:{n}"),
            FailoverInPoolTick { tick, group } => write!(f, "failover-in-pool-tick:{tick}:{group}"),
        }
    }
}

/// Reads a perturbation as its `Display` writes it.
impl std::str::FromStr for Perturbation {
    type Err = PerturbationError;

    fn from_str(s: &str) -> Result<Perturbation, PerturbationError> {
        use Perturbation::*;
        let bad = || PerturbationError::Bad(s.to_owned());
        let mut parts = s.trim().split(':');
        let kind = parts.next().ok_or_else(bad)?;
        let numbers: Vec<u64> = parts.map(|n| n.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
        let perturbation = match (kind, numbers.as_slice()) {
            ("crash-before", &[n]) => CrashBefore(n),
            ("crash-after", &[n]) => CrashAfter(n),
            ("crash-before-pool-tick", &[n]) => CrashBeforePoolTick(n),
            ("crash-in-pool-tick", &[tick, after]) if after >= 1 => CrashInPoolTick { tick, after },
            ("stale", &[at, listed_at]) if listed_at <= at => Stale { at, listed_at },
            ("coalesce", &[n]) => Coalesce(n),
            ("drop", &[delivery, event]) => Drop { delivery, event },
            ("duplicate", &[n]) => Duplicate(n),
            ("reorder", &[n]) => Reorder(n),
            ("swap", &[n]) => Swap(n),
            ("failover", &[n]) => Failover(n),
            ("failover-in-pool-tick", &[tick, group]) => FailoverInPoolTick { tick, group },
            _ => return Err(bad()),
        };
        Ok(perturbation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_perturbation_reads_back_as_it_is_written_and_malformed_texts_are_refused() {
        use Perturbation::*;
        let all = [
            CrashBefore(3),
            CrashAfter(0),
            CrashBeforePoolTick(7),
            CrashInPoolTick { tick: 4, after: 2 },
            Stale { at: 5, listed_at: 2 },
            Coalesce(1),
            Drop { delivery: 4, event: 9 },
            Duplicate(2),
            Reorder(6),
            Swap(11),
            Failover(8),
            FailoverInPoolTick { tick: 2, group: 0 },
        ];
        for p in all {
            assert_eq!(p.to_string().parse::<Perturbation>(), Ok(p));
        }
        for bad in [
            "crash:3",
            "swap",
            "swap:x",
            "stale:3",
            "stale:2:3",
            "drop:1",
            "swap:1:2",
            "",
            "coalesce:-1",
            "crash-in-pool-tick:3",
            "crash-in-pool-tick:3:0",
            "failover-in-pool-tick:3",
        ] {
            assert_eq!(bad.parse::<Perturbation>(), Err(PerturbationError::Bad(bad.to_owned())), "{bad}");
        }
    }
}
