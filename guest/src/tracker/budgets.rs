//! The write budgets, as the tracker spends them: every Azure write draws a token from what
//! paces its kind (its fixed bucket, the pace ARM's remaining-writes figures set, or both); a
//! write with no token waits, so that a burst of changes coalesces into few calls; a 429 shrinks
//! the budget instead of holding everything behind a backoff (the mechanisms are
//! [`crate::budget`]'s).

use crate::budget::{ArmPace, Buckets, WriteBudgets, WriteKind};
use crate::model::*;

/// The write budgets: a token bucket per kind of write ([`Buckets`]), shaped as the config says
/// ([`WriteBudgets`]: not state, the config's), and the pace ARM's figures set (`None` before the
/// first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Budgets {
    pub(super) shapes: WriteBudgets,
    pub(super) buckets: Buckets,
    pub(super) pace: Option<ArmPace>,
}

impl Budgets {
    /// Full buckets of `shapes`, and no pace yet.
    pub(super) fn full(shapes: WriteBudgets) -> Self {
        Self { shapes, buckets: Buckets::full(&shapes), pace: None }
    }

    /// The pace of ARM's figures, while they are fresh.
    fn fresh_pace(&self, now: u64) -> Option<ArmPace> {
        self.pace.filter(|p| p.fresh(now))
    }

    /// Whether a write of `kind` draws on its fixed bucket: always without fresh figures from
    /// ARM; with them, only address locations, whose budget is what coalesces their batches.
    fn uses_fixed_budget(&self, kind: WriteKind, now: u64) -> bool {
        kind == WriteKind::AddressLocations || self.fresh_pace(now).is_none()
    }

    /// The writes ARM's remaining-writes figure keeps back (the config's).
    pub(super) fn arm_write_reserve(&self) -> u32 {
        self.shapes.arm_write_reserve
    }

    /// The level of the fixed bucket of `kind` at `now`: (tokens, per minute).
    pub(super) fn level(&self, kind: WriteKind, now: u64) -> (i64, u32) {
        self.buckets.level(kind, &self.shapes, now)
    }

    /// The level of the pace ARM's figures set, while they are fresh: (tokens, per minute).
    pub(super) fn pace_level(&self, now: u64) -> Option<(i64, u32)> {
        self.pace.as_ref().and_then(|p| p.level(now))
    }

    /// Takes a token of what paces `kind` (its bucket, ARM's pace or both) if there is one.
    pub(super) fn take_token(&mut self, kind: WriteKind, now: u64) -> bool {
        let (mut buckets, mut pace) = (self.buckets, self.fresh_pace(now));
        let fixed = self.uses_fixed_budget(kind, now);
        // Taken from copies, kept only when every one that paces `kind` had a token.
        let taken = (!fixed || {
            let (bucket, budget) = buckets.of(&self.shapes, kind);
            bucket.try_take(budget, now)
        }) && pace.as_mut().is_none_or(|p| p.try_take(now));
        if taken {
            self.buckets = buckets;
            self.pace = pace.or(self.pace);
        }
        taken
    }

    /// When a write of `kind` may next go, if none may at `now`.
    #[inline(never)] // one copy for its callers in the pump and the wake-up (component size)
    pub(super) fn token_due(&self, kind: WriteKind, now: u64) -> Option<u64> {
        // Not `at > now`: at the end of time a missing token's time saturates to `now`, and
        // `take_token` would then find none.
        let fixed = self.uses_fixed_budget(kind, now).then(|| self.buckets.due(&self.shapes, kind, now)).flatten();
        let pace = self.fresh_pace(now).and_then(|p| p.due(now));
        fixed.into_iter().chain(pace).max()
    }

    /// ARM's remaining-writes figure, with `in_flight` of our writes it may not have counted yet
    /// and the config's `reserve`: it sets the pace of ARM-routed writes.
    pub(super) fn reported(&mut self, remaining: u32, reserve: u32, in_flight: u32, now: u64) {
        self.pace = Some(ArmPace::reported(self.pace, remaining, reserve, in_flight, now));
    }

    /// What Azure answered a write of `kind`: a 429 shrinks its budget (and says so), an
    /// accepted write gives some of a shrunk budget back.
    pub(super) fn answered(&mut self, kind: WriteKind, outcome: &Outcome, now: u64, step: &mut Step) {
        let (throttled, accepted) = match outcome {
            Outcome::Failed(f) => (f.status == 429, false),
            _ => (false, true),
        };
        let (bucket, budget) = self.buckets.of(&self.shapes, kind);
        if throttled {
            let per_minute = bucket.throttled(budget, now);
            let message = format!(
                "{} was throttled (HTTP 429): its write budget shrinks to {per_minute} a minute (configured: {} a \
                 minute) and grows back as writes are accepted",
                kind.name(),
                budget.per_minute
            );
            step.logs.push(LogLine { level: LogLevel::Warn, message });
        } else if accepted {
            bucket.accepted(budget, now);
        }
        let Some(pace) = self.pace.as_mut() else { return };
        if throttled {
            let per_minute = pace.throttled(now);
            let message = format!(
                "ARM throttled {} (HTTP 429): the pace of ARM-routed writes shrinks to {per_minute} a minute and grows \
                 back as writes are accepted",
                kind.name()
            );
            step.logs.push(LogLine { level: LogLevel::Warn, message });
        } else if accepted {
            pace.accepted(now);
        }
    }

    /// No deadline further ahead than the longest delay (see `Tracker::bring_in_deadlines`).
    pub(super) fn bring_in(&mut self, now: u64) {
        self.buckets.bring_in(now);
        if let Some(pace) = self.pace.as_mut() {
            pace.bring_in(now);
        }
    }
}
