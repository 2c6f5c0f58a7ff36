//! The one lifecycle driver: what inbound Services, outbound egress identities and egress pod
//! finalizers share. A lifecycle runs one command at a time ([`Attempt`]), backs off per key after
//! a failure ([`backoff_ms`]), and waits in exactly one of its kind's [`WorkSets`] (runnable, on a
//! timer, draining) whenever it has work left; the tracker only ever looks for work there. A kind
//! of lifecycle ([`Kind`]) says what is particular to it: its steps, their commands, what already
//! holds, what ends an operation.

use super::*;

/// Capped exponential backoff with deterministic jitter, never shorter than `Retry-After` up to
/// [`timing::RETRY_AFTER_CAP_MS`].
pub fn backoff_ms(key: &str, attempt: u32, retry_after_ms: Option<u64>) -> u64 {
    let exponent = attempt.saturating_sub(1).min(5);
    let base = (timing::BACKOFF_BASE_MS << exponent).min(timing::BACKOFF_CAP_MS);
    // FNV-1a over the key and the attempt: the same inputs give the same jitter on every host.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes().chain(attempt.to_le_bytes()) {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let jitter = base * (hash % (timing::JITTER_PERCENT + 1)) / 100;
    (base + jitter).max(retry_after_ms.unwrap_or(0).min(timing::RETRY_AFTER_CAP_MS))
}

/// [`backoff_ms`] after a failure, logging a `Retry-After` longer than the cap: what it was
/// asked for (`what`) and what is honoured instead.
pub(super) fn retry_delay(key: &str, attempt: u32, failure: &Failure, what: impl std::fmt::Display, step: &mut Step) -> u64 {
    let delay = backoff_ms(key, attempt, failure.retry_after_ms);
    if let Some(asked) = failure.retry_after_ms.filter(|&ms| ms > timing::RETRY_AFTER_CAP_MS) {
        let message = format!(
            "{what}: HTTP {} asked to retry after {asked} ms; retrying after {delay} ms (Retry-After is capped at {} ms)",
            failure.status,
            timing::RETRY_AFTER_CAP_MS
        );
        step.logs.push(LogLine { level: LogLevel::Warn, message });
    }
    delay
}

/// A command of a lifecycle: what the driver needs to know of it.
pub(super) trait Op: Copy + Eq + std::fmt::Debug + 'static {
    /// It writes NRP's service registration (held while NRP is read, counted in flight).
    fn writes_nrp(self) -> bool;
    /// The write budget it draws on; `None` for Kubernetes writes.
    fn write_kind(self) -> Option<WriteKind>;
    /// It belongs to the teardown (a create or update step pre-empted by one is not retried).
    fn is_delete_step(self) -> bool;
}

/// One command at a time, and the backoff after a failure. Serialized as the three fields it
/// stands for did before it (postcard writes a struct as its fields in order): the state format
/// does not change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt<S> {
    /// The command in flight (its id) and what it was for.
    pub(super) in_flight: Option<(u64, S)>,
    /// Failures in a row of the current step.
    pub(super) retries: u32,
    /// No command before this time (the tracker's clock).
    pub(super) not_before_ms: u64,
}

impl<S: Copy> Attempt<S> {
    pub(super) fn new() -> Self {
        Self { in_flight: None, retries: 0, not_before_ms: 0 }
    }

    /// Nothing to wait for: the step succeeded, or the operation starts over.
    pub(super) fn reset(&mut self) {
        self.retries = 0;
        self.not_before_ms = 0;
    }

    /// Whether `id` is the command this waits for; if it is, it waits no longer.
    pub(super) fn answered(&mut self, id: u64) -> bool {
        let waited = self.in_flight.is_some_and(|(i, _)| i == id);
        if waited {
            self.in_flight = None;
        }
        waited
    }

    /// Never later than `latest` (see `bring_in_deadlines`).
    pub(super) fn bring_in(&mut self, latest: u64) {
        self.not_before_ms = self.not_before_ms.min(latest);
    }

    /// The step failed: the next try waits out the backoff of `key`'s next attempt (at least
    /// the failure's `Retry-After`, capped, `what` naming it in the log). Returns when.
    pub(super) fn failed(&mut self, key: &str, failure: &Failure, what: &str, now: u64, step: &mut Step) -> u64 {
        self.retries = self.retries.saturating_add(1);
        self.not_before_ms = now.saturating_add(retry_delay(key, self.retries, failure, what, step));
        self.not_before_ms
    }
}

/// Where the tracker looks for a kind's work, and the only places: a lifecycle with work left is
/// in flight, runnable, on a timer or (a pending deletion, or a pod whose finalizer waits for
/// NRP) draining. Serialized as the three sets it stands for did before it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(bound(deserialize = "K: Deserialize<'de> + Ord"))]
pub struct WorkSets<K: Ord> {
    #[serde(deserialize_with = "crate::name::btree_set")]
    pub(super) runnable: BTreeSet<K>,
    #[serde(deserialize_with = "crate::name::btree_set")]
    pub(super) timers: BTreeSet<(u64, K)>,
    #[serde(deserialize_with = "crate::name::btree_set")]
    pub(super) draining: BTreeSet<K>,
}

impl<K: Ord> Default for WorkSets<K> {
    fn default() -> Self {
        Self { runnable: BTreeSet::new(), timers: BTreeSet::new(), draining: BTreeSet::new() }
    }
}

impl<K: Ord + Clone> WorkSets<K> {
    /// The timers due at `now` make their keys runnable.
    pub(super) fn fire(&mut self, now: u64) {
        while let Some((at, key)) = self.timers.first().cloned() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            self.runnable.insert(key);
        }
    }

    /// No timer later than `latest`: each one moved in, its own deadline (`bring_in`) too.
    pub(super) fn bring_in(&mut self, latest: u64, mut bring_in: impl FnMut(&K)) {
        while let Some((_, key)) = self.timers.last().filter(|(at, _)| *at > latest).cloned() {
            self.timers.pop_last();
            bring_in(&key);
            self.timers.insert((latest, key));
        }
    }

    /// The earliest timer.
    pub(super) fn next_timer(&self) -> Option<u64> {
        self.timers.first().map(|(at, _)| *at)
    }

    /// Nothing runnable, on a timer or draining.
    pub(super) fn is_empty(&self) -> bool {
        self.runnable.is_empty() && self.timers.is_empty() && self.draining.is_empty()
    }
}

impl WorkSets<String> {
    /// For a state import: each lifecycle is where its phase needs it ([`Phase::misplaced`]).
    pub(super) fn check<L: Life>(&self, lifecycles: &BTreeMap<String, L>, what: &str) -> Result<(), String> {
        let on_timers: BTreeSet<&str> = self.timers.iter().map(|(_, identity)| identity.as_str()).collect();
        for (identity, l) in lifecycles {
            let scheduled = l.attempt().in_flight.is_some()
                || self.runnable.contains(identity)
                || on_timers.contains(identity.as_str());
            if let Some(why) = l.phase().misplaced(l.has_work_left(), scheduled, self.draining.contains(identity)) {
                return Err(format!("the {what} of {identity:?} ({:?}): {why}", l.phase()));
            }
        }
        Ok(())
    }
}

/// A lifecycle, as the driver sees it: a phase, the steps of the running operation, one attempt
/// at a time.
pub(super) trait Life {
    type Op: Op;
    fn phase(&self) -> Phase;
    fn set_phase(&mut self, phase: Phase);
    fn steps(&mut self) -> &mut VecDeque<Self::Op>;
    fn attempt(&self) -> &Attempt<Self::Op>;
    fn attempt_mut(&mut self) -> &mut Attempt<Self::Op>;
    /// Set while a run of failures has been reported (once per run).
    fn failing(&mut self) -> &mut bool;
    /// Waits for something no step can bring (a new spec).
    fn parked(&self) -> bool {
        false
    }
    /// What `op` would write already holds (`registered`: NRP lists the identity): skipped.
    fn holds_already(&self, op: Self::Op, registered: bool) -> bool;
    fn has_work_left(&self) -> bool;
}

/// The [`Life`] accessors of a lifecycle whose fields have the driver's names: `phase`, `steps`,
/// `attempt`, `failing`.
macro_rules! life_fields {
    ($op:ty) => {
        type Op = $op;
        fn phase(&self) -> Phase {
            self.phase
        }
        fn set_phase(&mut self, phase: Phase) {
            self.phase = phase;
        }
        fn steps(&mut self) -> &mut VecDeque<$op> {
            &mut self.steps
        }
        fn attempt(&self) -> &Attempt<$op> {
            &self.attempt
        }
        fn attempt_mut(&mut self) -> &mut Attempt<$op> {
            &mut self.attempt
        }
        fn failing(&mut self) -> &mut bool {
            &mut self.failing
        }
    };
}
pub(super) use life_fields;

/// A kind of lifecycle: where its lifecycles and work sets live in the tracker, and what is
/// particular to it.
pub(super) trait Kind {
    type Life: Life;
    /// Its teardown, run once its addresses have drained.
    const DELETE: &'static [<Self::Life as Life>::Op];
    /// The step that unregisters it from NRP.
    const UNREGISTER: <Self::Life as Life>::Op;
    fn lifecycles(tracker: &Tracker) -> &BTreeMap<String, Self::Life>;
    fn parts(tracker: &mut Tracker) -> (&mut BTreeMap<String, Self::Life>, &mut WorkSets<String>);
    /// NRP lists the identity as registered (as the mirror has it).
    fn registered(tracker: &Tracker, identity: &str) -> bool;
    /// Waits for another lifecycle of the same name to end first.
    fn blocked(_tracker: &Tracker, _identity: &str) -> bool {
        false
    }
    /// The command that carries out `op`; called as it is sent.
    fn command(tracker: &mut Tracker, identity: &str, op: <Self::Life as Life>::Op) -> Command;
    fn in_flight(identity: &str, op: <Self::Life as Life>::Op) -> InFlight;
    /// Every step of the operation is done.
    fn finish(tracker: &mut Tracker, identity: &str, step: &mut Step);
}

type OpOf<K> = <<K as Kind>::Life as Life>::Op;

impl Tracker {
    /// Advances `K`'s runnable lifecycles while there is room in flight; those that must wait
    /// for a read of NRP or a token stay runnable.
    pub(super) fn run<K: Kind>(&mut self, now: u64, hold_nrp_writes: bool, step: &mut Step) {
        let mut held = Vec::new();
        while self.state.service_commands_in_flight < MAX_SERVICE_COMMANDS_IN_FLIGHT {
            let Some(identity) = K::parts(self).1.runnable.pop_first() else { break };
            if !self.advance::<K>(&identity, now, hold_nrp_writes, step) {
                held.push(identity);
            }
        }
        K::parts(self).1.runnable.extend(held);
    }

    /// Issues the next command of a lifecycle's operation, skipping the steps that hold
    /// already. Returns false when it must wait (for a read of NRP, a token, or the other
    /// lifecycle of its name).
    pub(super) fn advance<K: Kind>(&mut self, identity: &str, now: u64, hold_nrp_writes: bool, step: &mut Step) -> bool {
        if K::blocked(self, identity) {
            return false;
        }
        loop {
            let registered = K::registered(self, identity);
            let (lifecycles, work) = K::parts(self);
            let Some(lifecycle) = lifecycles.get_mut(identity) else { return true };
            let phase = lifecycle.phase();
            if lifecycle.attempt().in_flight.is_some() || lifecycle.parked() || phase == Phase::DeletionPending {
                return true;
            }
            if phase == Phase::Created && lifecycle.steps().is_empty() {
                return true;
            }
            let attempt = lifecycle.attempt_mut();
            if attempt.not_before_ms > now {
                // As `bring_in_deadlines`: never further ahead than the longest delay.
                attempt.not_before_ms = attempt.not_before_ms.min(now.saturating_add(timing::MAX_DELAY_MS));
                work.timers.insert((attempt.not_before_ms, identity.to_owned()));
                return true;
            }
            let Some(&next) = lifecycle.steps().front() else {
                K::finish(self, identity, step);
                return true;
            };
            if lifecycle.holds_already(next, registered) {
                lifecycle.steps().pop_front();
                continue;
            }
            if next.writes_nrp() && hold_nrp_writes {
                return false;
            }
            if next.write_kind().is_some_and(|kind| !self.take_token(kind, now)) {
                return false; // `next_wake` wakes for the token
            }
            let command = K::command(self, identity, next);
            let lifecycle = K::parts(self).0.get_mut(identity).expect("checked above");
            if lifecycle.phase() == Phase::NotStarted {
                lifecycle.set_phase(Phase::CreationInProgress);
            }
            if next.writes_nrp() {
                self.state.nrp.service_writes_in_flight += 1;
            }
            self.state.service_commands_in_flight += 1;
            let id = self.issue(command, K::in_flight(identity, next), step);
            K::parts(self).0.get_mut(identity).expect("checked above").attempt_mut().in_flight = Some((id, next));
            return true;
        }
    }

    /// An answer to one of `K`'s commands. Azure's answer counts for its write budget whether or
    /// not the lifecycle still waits for it; returns whether it does (it is runnable again).
    pub(super) fn answered<K: Kind>(&mut self, identity: &str, id: u64, op: OpOf<K>, outcome: &Outcome, now: u64, step: &mut Step) -> bool {
        if let Some(kind) = op.write_kind() {
            self.budget_answered(kind, outcome, now, step);
        }
        let (lifecycles, work) = K::parts(self);
        let waited = lifecycles.get_mut(identity).is_some_and(|l| l.attempt_mut().answered(id));
        if waited {
            work.runnable.insert(identity.to_owned());
        }
        waited
    }

    /// A step's work is done (the caller recorded its own facts): its backoff ends, and the
    /// operation moves past it unless a teardown pre-empted the operation it was part of.
    pub(super) fn step_done<K: Kind>(&mut self, identity: &str, op: OpOf<K>) {
        let lifecycle = K::parts(self).0.get_mut(identity).expect("caller checked");
        lifecycle.attempt_mut().reset();
        *lifecycle.failing() = false;
        if lifecycle.phase().is_deleting() && !op.is_delete_step() {
            return;
        }
        if lifecycle.steps().front() == Some(&op) {
            lifecycle.steps().pop_front();
        }
    }

    /// A failed step waits out its backoff. Returns whether the failure starts a run of
    /// failures, which the caller reports (once per run).
    pub(super) fn retry_later<K: Kind>(&mut self, identity: &str, failure: &Failure, what: &str, now: u64, step: &mut Step) -> bool {
        let (lifecycles, work) = K::parts(self);
        let lifecycle = lifecycles.get_mut(identity).expect("caller checked");
        let at = lifecycle.attempt_mut().failed(identity, failure, what, now, step);
        work.timers.insert((at, identity.to_owned()));
        !std::mem::replace(lifecycle.failing(), true)
    }

    /// The lifecycle waits, deletion pending, for NRP to map no address to it any more.
    pub(super) fn start_drain<K: Kind>(&mut self, identity: &str) {
        let (lifecycles, work) = K::parts(self);
        let lifecycle = lifecycles.get_mut(identity).expect("caller checked");
        lifecycle.set_phase(Phase::DeletionPending);
        lifecycle.steps().clear();
        work.draining.insert(identity.to_owned());
        self.state.diff.touch_identity(identity);
    }

    /// NRP refused to unregister it (`ServiceWithOverlayMappingsCannotBeDeleted`): NRP still
    /// maps addresses to it, so the mirror was wrong. It drains again, and NRP is read back.
    pub(super) fn drain_again<K: Kind>(&mut self, identity: &str, now: u64) {
        self.start_drain::<K>(identity);
        self.state.nrp.next_read_ms = now;
    }

    /// After a read of NRP: a teardown about to unregister whose drain ended on a mirror NRP now
    /// contradicts (after an overlay-mappings refusal the drain ends before NRP is read back)
    /// drains again before the unregistration.
    pub(super) fn drain_again_where_referenced<K: Kind>(&mut self) {
        let contradicted: Vec<String> = K::lifecycles(self)
            .iter()
            .filter(|(identity, l)| {
                l.phase() == Phase::DeletionInProgress
                    && l.attempt().in_flight.is_none()
                    && self.state.diff.nrp_references(identity)
            })
            .map(|(identity, _)| identity.clone())
            .collect();
        for identity in contradicted {
            let lifecycle = K::parts(self).0.get_mut(&identity).expect("listed above");
            if lifecycle.steps().contains(&K::UNREGISTER) {
                self.start_drain::<K>(&identity);
                K::parts(self).1.runnable.remove(&identity);
            }
        }
    }

    /// The draining lifecycles of `K` whose addresses have left NRP start their teardown.
    pub(super) fn check_drained<K: Kind>(&mut self) {
        let draining: Vec<String> = K::parts(self).1.draining.iter().cloned().collect();
        for identity in draining {
            let Some(lifecycle) = K::lifecycles(self).get(&identity) else {
                K::parts(self).1.draining.remove(&identity);
                continue;
            };
            if lifecycle.phase() != Phase::DeletionPending
                || lifecycle.attempt().in_flight.is_some()
                || !self.drained(&identity)
            {
                continue;
            }
            let (lifecycles, work) = K::parts(self);
            let lifecycle = lifecycles.get_mut(&identity).expect("read above");
            lifecycle.set_phase(Phase::DeletionInProgress);
            *lifecycle.steps() = K::DELETE.iter().copied().collect();
            work.draining.remove(&identity);
            work.runnable.insert(identity);
        }
    }
}
