//! The figures of `tracker.stats` (WIT `tracker-stats`; docs/operations.md, "What to scrape"):
//! what [`Stats`] holds, and [`Figures`], the counters the lifecycle driver feeds as attempts
//! end. The gauges are read from the state when asked (`stats`).
//!
//! [`Figures`] is state (version 9): it travels with the rest through a swap, a checkpoint and a
//! rebuild, so the counts are a function of the inputs alone, whichever way a host got its
//! instance there (trace replays compare them). A state of an older version imports with none:
//! its counters start at zero and its pending operations began, as the tracker counts it, at its
//! first call. Reading the figures changes nothing.

use crate::model::Phase;
use serde::{Deserialize, Serialize};

/// Which side a lifecycle is on (upstream's `service_type` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServiceType {
    Inbound,
    Outbound,
}

/// What an operation does, by the phase it runs in (upstream's `operationLabelForState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    fn of(phase: Phase) -> Self {
        match phase {
            Phase::DeletionPending | Phase::DeletionInProgress => Operation::Delete,
            Phase::UpdateInProgress => Operation::Update,
            Phase::NotStarted | Phase::CreationInProgress | Phase::Created => Operation::Create,
        }
    }
}

/// The phases in the order `Stats::pending` lists them.
pub const PHASES: [Phase; 6] = [
    Phase::NotStarted,
    Phase::CreationInProgress,
    Phase::Created,
    Phase::DeletionPending,
    Phase::DeletionInProgress,
    Phase::UpdateInProgress,
];
pub(super) const TYPES: [ServiceType; 2] = [ServiceType::Inbound, ServiceType::Outbound];
pub(super) const OPERATIONS: [Operation; 3] = [Operation::Create, Operation::Update, Operation::Delete];

/// Upper bounds of the duration buckets, in milliseconds (upstream's, in seconds: 0.1 … 120).
pub const DURATION_BOUNDS_MS: [u64; 9] = [100, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 120_000];
/// Upper bounds of the retry buckets (upstream's).
pub const RETRY_BOUNDS: [u64; 7] = [0, 1, 2, 3, 5, 10, 20];
/// Distinct error codes counted by name; the rest count as [`OTHER_CODE`].
pub const MAX_ERROR_CODES: usize = 16;
pub const OTHER_CODE: &str = "Other";
/// The park reason of a terminal failure (upstream's `terminal_error`).
pub const PARKED_TERMINAL: &str = "terminal_error";
/// The teardown step whose failure is gone past (upstream's `disassociate_nat_gateway`).
pub const SUBSTEP_DISASSOCIATE: &str = "disassociate_nat_gateway";

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Histogram {
    /// Observations per bucket: at most its bound and more than the one before.
    pub counts: Vec<u64>,
    pub count: u64,
    pub sum: u64,
}

impl Histogram {
    fn observe(&mut self, bounds: &[u64], value: u64) {
        if self.counts.len() != bounds.len() {
            self.counts = vec![0; bounds.len()];
        }
        if let Some(i) = bounds.iter().position(|&bound| value <= bound) {
            self.counts[i] += 1;
        }
        self.count += 1;
        self.sum = self.sum.saturating_add(value);
    }

    pub(super) fn or_empty(&self, bounds: &[u64]) -> Self {
        if self.counts.is_empty() { Self { counts: vec![0; bounds.len()], ..Self::default() } } else { self.clone() }
    }
}

/// Attempts that ended one way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptCount {
    pub operation: Operation,
    pub service_type: ServiceType,
    pub success: bool,
    pub error_code: String,
    pub orphan: bool,
    pub count: u64,
}

/// The lifecycles of one phase and type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    pub phase: Phase,
    pub service_type: ServiceType,
    pub count: u32,
    pub oldest_began_ms: Option<u64>,
}

/// A write budget's level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetLevel {
    pub bucket: String,
    pub tokens: i64,
    pub per_minute: u32,
}

/// The answer to `tracker.stats` (see the WIT record `tracker-stats`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stats {
    pub service_gateway_enabled: bool,
    pub pending: Vec<Pending>,
    pub k8s_services: u32,
    pub nrp_load_balancers: u32,
    pub nrp_nat_gateways: u32,
    pub nrp_locations: u32,
    pub nrp_addresses: u32,
    pub pending_deletions: u32,
    pub blocked_by_locations: u32,
    pub pod_finalizers_held: u32,
    pub commands_in_flight: u32,
    pub attempts: Vec<AttemptCount>,
    /// One per operation and type, in that order (create, update, delete × inbound, outbound).
    pub durations: Vec<(Operation, ServiceType, Histogram)>,
    pub retries: Vec<(Operation, ServiceType, Histogram)>,
    pub parked: Vec<(String, u64)>,
    pub orphans_cleaned: u64,
    pub delete_substep_failures: Vec<(String, u64)>,
    pub location_sync_terminal_errors: u64,
    pub initialized_after_ms: Option<u64>,
    pub budgets: Vec<BudgetLevel>,
}

/// An operation as the figures follow it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Running {
    pub(super) service_type: ServiceType,
    pub(super) identity: String,
    operation: Operation,
    pub(super) began_ms: u64,
    /// When its current attempt began: the operation's start or its last failure.
    attempt_ms: u64,
    failures: u32,
    /// A disassociation of this teardown failed and was gone past (counted once).
    disassociation_failed: bool,
}

/// The counters of [`Stats`] and when each pending operation began (state version 9).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Figures {
    pub(super) first_call_ms: Option<u64>,
    pub(super) initialized_after_ms: Option<u64>,
    /// Every lifecycle has been looked at once (the first call after a creation or import).
    pub(super) seen_all: bool,
    /// Sorted by (type, identity): a few entries while quiet, one per pending operation.
    pub(super) running: Vec<Running>,
    pub(super) attempts: Vec<AttemptCount>,
    codes: Vec<String>,
    /// Indexed by [`slot`].
    pub(super) durations: [Histogram; 6],
    pub(super) retries: [Histogram; 6],
    pub(super) parked_terminal: u64,
    pub(super) orphans_cleaned: u64,
    pub(super) disassociate_failures: u64,
    pub(super) location_terminal: u64,
}

pub(super) fn slot(operation: Operation, service_type: ServiceType) -> usize {
    operation as usize * 2 + service_type as usize
}

impl Figures {
    /// Start-up has not been seen to end yet (`note` is told when it has).
    pub(super) fn awaits_start_up_end(&self) -> bool {
        self.initialized_after_ms.is_none()
    }

    /// For a state import: what the counting relies on.
    pub(super) fn check(&self) -> Result<(), String> {
        let sorted = self.running.windows(2).all(|w| {
            (w[0].service_type as u8, w[0].identity.as_str()) < (w[1].service_type as u8, w[1].identity.as_str())
        });
        let shaped = |hs: &[Histogram; 6], bounds: &[u64]| {
            hs.iter().all(|h| h.counts.is_empty() || h.counts.len() == bounds.len())
        };
        if !sorted {
            Err("the figures' pending operations are not in order".into())
        } else if self.codes.len() > MAX_ERROR_CODES {
            Err(format!("the figures name {} error codes, more than {MAX_ERROR_CODES}", self.codes.len()))
        } else if !shaped(&self.durations, &DURATION_BOUNDS_MS) || !shaped(&self.retries, &RETRY_BOUNDS) {
            Err("a histogram of the figures has the wrong number of buckets".into())
        } else {
            Ok(())
        }
    }

    pub(super) fn find(&self, service_type: ServiceType, identity: &str) -> Result<usize, usize> {
        self.running
            .binary_search_by(|r| (r.service_type as u8, r.identity.as_str()).cmp(&(service_type as u8, identity)))
    }

    /// The operation of `identity` now in `phase`: the one followed, restarted if it changed.
    #[inline(never)]
    pub(super) fn running(
        &mut self,
        service_type: ServiceType,
        identity: &str,
        phase: Phase,
        now: u64,
    ) -> &mut Running {
        let operation = Operation::of(phase);
        let i = match self.find(service_type, identity) {
            Ok(i) => {
                let run = &mut self.running[i];
                if run.operation != operation {
                    (run.operation, run.began_ms, run.attempt_ms, run.failures) = (operation, now, now, 0);
                    run.disassociation_failed = false;
                }
                i
            }
            Err(i) => {
                let identity = identity.to_owned();
                self.running.insert(
                    i,
                    Running {
                        service_type,
                        identity,
                        operation,
                        began_ms: now,
                        attempt_ms: now,
                        failures: 0,
                        disassociation_failed: false,
                    },
                );
                i
            }
        };
        &mut self.running[i]
    }

    fn count_attempt(&mut self, run: &Running, success: bool, code: &str, orphan: bool) {
        let known = self.codes.iter().any(|c| c == code);
        let code = if success || known || self.codes.len() < MAX_ERROR_CODES {
            if !success && !known {
                self.codes.push(code.to_owned());
            }
            code
        } else {
            OTHER_CODE
        };
        let (operation, service_type) = (run.operation, run.service_type);
        let same = |a: &&mut AttemptCount| {
            (a.operation, a.service_type, a.success, a.orphan) == (operation, service_type, success, orphan)
                && a.error_code == code
        };
        match self.attempts.iter_mut().find(same) {
            Some(a) => a.count += 1,
            None => {
                let error_code = code.to_owned();
                self.attempts.push(AttemptCount { operation, service_type, success, error_code, orphan, count: 1 });
            }
        }
    }

    /// An attempt failed (`code`: Azure's, else the HTTP status); the operation retries.
    #[inline(never)]
    pub(super) fn failed(
        &mut self,
        service_type: ServiceType,
        identity: &str,
        phase: Phase,
        code: &str,
        orphan: bool,
        now: u64,
    ) {
        let run = self.running(service_type, identity, phase, now);
        let took = now.saturating_sub(run.attempt_ms);
        run.attempt_ms = now;
        run.failures = run.failures.saturating_add(1);
        let run = run.clone();
        self.durations[slot(run.operation, service_type)].observe(&DURATION_BOUNDS_MS, took);
        self.count_attempt(&run, false, code, orphan);
    }

    /// A failed attempt parked the operation until its spec changes.
    #[inline(never)]
    pub(super) fn parked(&mut self, service_type: ServiceType, identity: &str, phase: Phase, code: &str, now: u64) {
        self.failed(service_type, identity, phase, code, false, now);
        self.parked_terminal += 1;
        let run = self.running(service_type, identity, phase, now);
        let (operation, failures) = (run.operation, run.failures.saturating_sub(1));
        self.retries[slot(operation, service_type)].observe(&RETRY_BOUNDS, u64::from(failures));
    }

    /// The operation's last step succeeded.
    #[inline(never)]
    pub(super) fn succeeded(
        &mut self,
        service_type: ServiceType,
        identity: &str,
        phase: Phase,
        orphan: bool,
        now: u64,
    ) {
        let run = self.running(service_type, identity, phase, now).clone();
        let slot = slot(run.operation, service_type);
        self.durations[slot].observe(&DURATION_BOUNDS_MS, now.saturating_sub(run.attempt_ms));
        self.retries[slot].observe(&RETRY_BOUNDS, u64::from(run.failures));
        self.count_attempt(&run, true, "", orphan);
        if orphan && run.operation == Operation::Delete {
            self.orphans_cleaned += 1;
        }
        if let Ok(i) = self.find(service_type, identity) {
            self.running.remove(i);
        }
    }

    /// A half of the disassociation of `identity`'s teardown (NRP's or the NAT gateway's) failed
    /// and the teardown went past it. Counted once per teardown, as upstream counts its one
    /// disassociation step, whichever half failed and however many did.
    pub(super) fn disassociation_failed(&mut self, identity: &str, phase: Phase, now: u64) {
        let run = self.running(ServiceType::Outbound, identity, phase, now);
        if !std::mem::replace(&mut run.disassociation_failed, true) {
            self.disassociate_failures += 1;
        }
    }

    pub(super) fn location_refused(&mut self) {
        self.location_terminal += 1;
    }
}
