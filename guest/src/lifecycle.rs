//! What every lifecycle shares, below the tracker that drives them: one command at a time with
//! per-key backoff ([`Attempt`], [`backoff_ms`]), the work sets a lifecycle waits in whenever it
//! has work left ([`WorkSets`]: runnable, timers, draining), and what the driver needs to know of
//! a lifecycle and its steps ([`Life`], [`Op`]). Inbound Services and outbound egress identities
//! run on the driver (`crate::tracker`, `Kind`); the pod finalizers share `Attempt` and `WorkSets`.

use crate::budget::WriteKind;
use crate::keyed::{Map, Members, Set};
use crate::model::{Failure, LogLevel, LogLine, ObjectKey, Phase, Step};
use crate::name::Name;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Borrow;
use std::collections::{BTreeSet, VecDeque};
use std::marker::PhantomData;

/// Retry and resync timing (milliseconds).
pub mod timing {
    pub const BACKOFF_BASE_MS: u64 = 1_000;
    pub const BACKOFF_CAP_MS: u64 = 30_000;
    /// Jitter adds up to this share (percent) of the backoff.
    pub const JITTER_PERCENT: u64 = 20;
    /// How often NRP is read back to repair drift.
    pub const RESYNC_INTERVAL_MS: u64 = 5 * 60_000;
    /// The longest `Retry-After` the tracker honours: the resync period. A longer one would
    /// hold a Service's retries, every Service's addresses (the address-location batch) or the
    /// read of NRP past the next periodic resync, which is the slowest the tracker otherwise
    /// ever acts on anything; a server asking for more than that is wrong or the header was
    /// misread (the host turns a `Retry-After` of ~1.8e16 s or more into `u64::MAX`). A capped
    /// value is logged (`Step::logs`).
    pub const RETRY_AFTER_CAP_MS: u64 = RESYNC_INTERVAL_MS;
    /// The longest delay the tracker ever schedules: a backoff (at most 36 s, or a capped
    /// `Retry-After`) or the resync period.
    pub const MAX_DELAY_MS: u64 = RESYNC_INTERVAL_MS;
    /// An address-location batch in flight this long is slow: the next batch need not wait for
    /// it (it goes over other locations). Shorter than NRP's request timeout, so that a hung call
    /// holds the other Services' endpoints this long, not until it times out; long enough that a
    /// batch answered at NRP's usual pace lets the changes behind it coalesce into one batch.
    pub const SLOW_BATCH_MS: u64 = 2_000;
    /// Reads of the ARM inventory at start-up before start-up reconciliation goes on without
    /// it (writing what it cannot adopt, as before version 4): the inventory saves writes, it
    /// is never worth holding every Service for.
    pub const ARM_READ_ATTEMPTS: u32 = 3;
    const _: () = assert!(
        BACKOFF_CAP_MS + BACKOFF_CAP_MS * JITTER_PERCENT / 100 <= MAX_DELAY_MS && RETRY_AFTER_CAP_MS <= MAX_DELAY_MS
    );
}

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
pub(crate) fn retry_delay(
    key: &str,
    attempt: u32,
    failure: &Failure,
    what: impl std::fmt::Display,
    step: &mut Step,
) -> u64 {
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
pub(crate) trait Op: Copy + Eq + std::fmt::Debug + 'static {
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
    pub(crate) in_flight: Option<(u64, S)>,
    /// Failures in a row of the current step.
    pub(crate) retries: u32,
    /// No command before this time (the tracker's clock).
    pub(crate) not_before_ms: u64,
}

impl<S: Copy> Attempt<S> {
    pub(crate) fn new() -> Self {
        Self { in_flight: None, retries: 0, not_before_ms: 0 }
    }

    /// Nothing to wait for: the step succeeded, or the operation starts over.
    pub(crate) fn reset(&mut self) {
        self.retries = 0;
        self.not_before_ms = 0;
    }

    /// Whether `id` is the command this waits for; if it is, it waits no longer.
    pub(crate) fn answered(&mut self, id: u64) -> bool {
        let waited = self.in_flight.is_some_and(|(i, _)| i == id);
        if waited {
            self.in_flight = None;
        }
        waited
    }

    /// Never later than `latest` (see `bring_in_deadlines`).
    pub(crate) fn bring_in(&mut self, latest: u64) {
        self.not_before_ms = self.not_before_ms.min(latest);
    }

    /// The step failed: the next try waits out the backoff of `key`'s next attempt (at least
    /// the failure's `Retry-After`, capped, `what` naming it in the log). Returns when.
    pub(crate) fn failed(&mut self, key: &str, failure: &Failure, what: &str, now: u64, step: &mut Step) -> u64 {
        self.retry_at(|retries| now.saturating_add(retry_delay(key, retries, failure, what, step)))
    }

    /// One more failure in a row: the next try waits until `at(retries)`. Returns when.
    pub(crate) fn retry_at(&mut self, at: impl FnOnce(u32) -> u64) -> u64 {
        self.retries = self.retries.saturating_add(1);
        self.not_before_ms = at(self.retries);
        self.not_before_ms
    }
}

/// Where the tracker looks for a kind's work, and the only places: a lifecycle with work left is
/// in flight, runnable, on a timer or (a pending deletion, or a pod whose finalizer waits for
/// NRP) draining. Serialized as the three sets it stands for did before it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(bound(serialize = "K: Serialize", deserialize = "K: Deserialize<'de>"))]
pub struct WorkSets<K: TimerKey> {
    pub(crate) runnable: Set<K>,
    pub(crate) timers: Timers<K>,
    pub(crate) draining: Set<K>,
}

impl<K: TimerKey> Default for WorkSets<K> {
    fn default() -> Self {
        Self { runnable: Set::new(), timers: Timers::default(), draining: Set::new() }
    }
}

impl<K: TimerKey> WorkSets<K> {
    /// The timers due at `now` make their keys runnable.
    pub(crate) fn fire(&mut self, now: u64) {
        while self.timers.set.first().is_some_and(|(at, _)| *at <= now) {
            let (_, key) = self.timers.set.pop_first().expect("a first timer");
            self.runnable.insert(K::of_timer(key));
        }
    }

    /// No timer later than `latest`: each one moved in, its own deadline (`bring_in`) too.
    pub(crate) fn bring_in(&mut self, latest: u64, mut bring_in: impl FnMut(&K::Ref)) {
        while self.timers.set.last().is_some_and(|(at, _)| *at > latest) {
            let (_, key) = self.timers.set.pop_last().expect("a last timer");
            bring_in(K::of_timer_ref(&key));
            self.timers.set.insert((latest, key));
        }
    }

    /// The earliest timer.
    pub(crate) fn next_timer(&self) -> Option<u64> {
        self.timers.set.first().map(|(at, _)| *at)
    }

    /// Nothing runnable, on a timer or draining.
    pub(crate) fn is_empty(&self) -> bool {
        self.runnable.is_empty() && self.timers.is_empty() && self.draining.is_empty()
    }
}

impl WorkSets<String> {
    /// For a state import: each lifecycle is where its phase needs it ([`Phase::misplaced`]).
    pub(crate) fn check<L: Life>(&self, lifecycles: &Map<String, L>, what: &str) -> Result<(), String> {
        let on_timers: Set<&str> = self.timers.iter().map(|(_, identity)| identity).collect();
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

/// The key of a work set's timers. Every kind's timers are held on one B-tree of
/// `(due, ObjectKey)` pairs, so that the component carries one copy of its code, not one per key
/// type: an identity's timer is an object key with no namespace, which orders as the identity
/// does, so the order of the timers (and of what fires together) is the one a set of
/// `(due, identity)` pairs has.
pub trait TimerKey: Ord + Clone + Borrow<Self::Ref> {
    /// What a timer's key is looked up and written as: `str` for an identity.
    type Ref: ?Sized + Serialize;
    fn timer(key: &Self::Ref) -> ObjectKey;
    fn of_timer(timer: ObjectKey) -> Self;
    fn of_timer_ref(timer: &ObjectKey) -> &Self::Ref;
}

impl TimerKey for String {
    type Ref = str;
    fn timer(key: &str) -> ObjectKey {
        ObjectKey { namespace: Name::new(""), name: Name::new(key) }
    }
    fn of_timer(timer: ObjectKey) -> Self {
        timer.name.into()
    }
    fn of_timer_ref(timer: &ObjectKey) -> &str {
        &timer.name
    }
}

impl TimerKey for ObjectKey {
    type Ref = ObjectKey;
    fn timer(key: &ObjectKey) -> ObjectKey {
        key.clone()
    }
    fn of_timer(timer: ObjectKey) -> Self {
        timer
    }
    fn of_timer_ref(timer: &ObjectKey) -> &ObjectKey {
        timer
    }
}

/// A work set's timers: `(due, key)` pairs in that order (see [`TimerKey`]). Serialized as the
/// set of `(due, key)` pairs it stands for was, and read as it was (last first, as
/// [`crate::keyed::Set`] is).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timers<K> {
    set: BTreeSet<(u64, ObjectKey)>,
    key: PhantomData<K>,
}

impl<K> Default for Timers<K> {
    fn default() -> Self {
        Self { set: BTreeSet::new(), key: PhantomData }
    }
}

impl<K: TimerKey> Timers<K> {
    /// Adds the timer of `key` due at `at`; false if it was there.
    pub(crate) fn insert(&mut self, at: u64, key: &K::Ref) -> bool {
        self.set.insert((at, K::timer(key)))
    }

    /// Removes the timer of `key` due at `at`; false if there was none.
    pub(crate) fn remove(&mut self, at: u64, key: &K::Ref) -> bool {
        self.set.remove(&(at, K::timer(key)))
    }

    /// Keeps the timers for which `keep` says so.
    #[cfg(test)]
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u64, &K::Ref) -> bool) {
        self.set.retain(|(at, key)| keep(*at, K::of_timer_ref(key)));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// The timers in order: due time, then key.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &K::Ref)> {
        self.set.iter().map(|(at, key)| (*at, K::of_timer_ref(key)))
    }
}

impl<K: TimerKey> Serialize for Timers<K> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de, K: TimerKey + Deserialize<'de>> Deserialize<'de> for Timers<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(Members {
            make: |members: Vec<(u64, K)>| {
                let mut timers = Timers::default();
                for (at, key) in members.into_iter().rev() {
                    timers.insert(at, key.borrow());
                }
                timers
            },
        })
    }
}

/// A lifecycle, as the driver sees it: a phase, the steps of the running operation, one attempt
/// at a time.
pub(crate) trait Life {
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
        fn phase(&self) -> $crate::model::Phase {
            self.phase
        }
        fn set_phase(&mut self, phase: $crate::model::Phase) {
            self.phase = phase;
        }
        fn steps(&mut self) -> &mut ::std::collections::VecDeque<$op> {
            &mut self.steps
        }
        fn attempt(&self) -> &$crate::lifecycle::Attempt<$op> {
            &self.attempt
        }
        fn attempt_mut(&mut self) -> &mut $crate::lifecycle::Attempt<$op> {
            &mut self.attempt
        }
        fn failing(&mut self) -> &mut bool {
            &mut self.failing
        }
    };
}
pub(crate) use life_fields;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Texts of both of `Name`'s forms (in place and on the heap), the empty one included.
    fn text() -> impl Strategy<Value = String> + Clone {
        prop_oneof![Just(String::new()), "[ab]{1,3}", "[ab]{39,41}"]
    }

    #[derive(Clone, Debug)]
    enum Op<K> {
        Insert(u64, K),
        Remove(u64, K),
        Fire(u64),
        BringIn(u64),
    }

    fn ops<K: Clone + std::fmt::Debug>(key: impl Strategy<Value = K> + Clone) -> impl Strategy<Value = Vec<Op<K>>> {
        let at = 0..8u64;
        let op = prop_oneof![
            (at.clone(), key.clone()).prop_map(|(at, k)| Op::Insert(at, k)),
            (at.clone(), key).prop_map(|(at, k)| Op::Remove(at, k)),
            at.clone().prop_map(Op::Fire),
            at.prop_map(Op::BringIn),
        ];
        proptest::collection::vec(op, 0..60)
    }

    /// Runs `ops` on work sets and on the set of `(due, key)` pairs they replace: the same
    /// answers, the same timers in the same order, the same keys made runnable in the same
    /// order, the same postcard bytes; and the bytes read back are equal.
    fn timers_behave_as_the_pairs_they_replace<K>(ops: Vec<Op<K>>) -> Result<(), TestCaseError>
    where
        K: TimerKey + std::fmt::Debug + Serialize + serde::de::DeserializeOwned,
        K::Ref: PartialEq + std::fmt::Debug,
    {
        let mut ours = WorkSets::<K>::default();
        let mut pairs: BTreeSet<(u64, K)> = BTreeSet::new();
        let mut runnable: Vec<K> = Vec::new();
        for op in ops {
            match op {
                Op::Insert(at, key) => prop_assert_eq!(ours.timers.insert(at, key.borrow()), pairs.insert((at, key))),
                Op::Remove(at, key) => {
                    prop_assert_eq!(ours.timers.remove(at, key.borrow()), pairs.remove(&(at, key)))
                }
                Op::Fire(now) => {
                    ours.runnable = Set::new();
                    ours.fire(now);
                    runnable.clear();
                    while pairs.first().is_some_and(|(at, _)| *at <= now) {
                        runnable.push(pairs.pop_first().unwrap().1);
                    }
                    runnable.sort();
                    runnable.dedup();
                    prop_assert!(ours.runnable.iter().eq(runnable.iter()));
                }
                Op::BringIn(latest) => {
                    let mut brought: Vec<K> = Vec::new();
                    ours.bring_in(latest, |key| brought.push(K::of_timer(K::timer(key))));
                    let mut expected = Vec::new();
                    while let Some((_, key)) = pairs.last().filter(|(at, _)| *at > latest).cloned() {
                        pairs.pop_last();
                        expected.push(key.clone());
                        pairs.insert((latest, key));
                    }
                    prop_assert_eq!(brought, expected);
                }
            }
            prop_assert!(ours.timers.iter().eq(pairs.iter().map(|(at, key)| (*at, key.borrow()))));
            prop_assert_eq!(ours.next_timer(), pairs.first().map(|(at, _)| *at));
            let bytes = postcard::to_allocvec(&ours.timers).unwrap();
            prop_assert_eq!(&bytes, &postcard::to_allocvec(&pairs).unwrap());
            prop_assert_eq!(&postcard::from_bytes::<Timers<K>>(&bytes).unwrap(), &ours.timers);
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn identity_timers_order_fire_and_serialize_as_a_set_of_due_identity_pairs(ops in ops(text())) {
            timers_behave_as_the_pairs_they_replace::<String>(ops)?;
        }

        #[test]
        fn pod_timers_order_fire_and_serialize_as_a_set_of_due_object_key_pairs(
            ops in ops((text(), text()).prop_map(|(ns, name)| ObjectKey::new(&ns, &name)))
        ) {
            timers_behave_as_the_pairs_they_replace::<ObjectKey>(ops)?;
        }

        /// A state written by hand or corrupt may list timers out of order or twice: they read
        /// as the set of pairs reads them.
        #[test]
        fn timers_read_any_list_of_pairs_as_the_set_of_pairs_does(
            listed in proptest::collection::vec((0..4u64, text()), 0..30)
        ) {
            let bytes = postcard::to_allocvec(&listed).unwrap();
            let ours: Timers<String> = postcard::from_bytes(&bytes).unwrap();
            let pairs: BTreeSet<(u64, String)> = postcard::from_bytes(&bytes).unwrap();
            prop_assert!(ours.iter().eq(pairs.iter().map(|(at, key)| (*at, key.as_str()))));
        }
    }
}
