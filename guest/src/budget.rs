//! Write budgets: a token bucket for each NRP write operation and one for every ARM write, so
//! that a burst of changes coalesces into few calls while the budget refills, and a throttled
//! (429) operation slows down instead of stalling.
//!
//! Everything is integer arithmetic on the tracker's `now`: the same inputs give the same
//! decisions on every host. A token is [`UNITS_PER_TOKEN`] units and each millisecond adds the
//! rate *per minute* in units, so a rate of any whole number of writes per minute refills exactly,
//! with no rounding to accumulate.
//!
//! A 429 halves the operation's rate (never below [`FLOOR_DIVISOR`]th of the configured one) and
//! empties its bucket; each accepted write gives back an eighth of the configured rate. The shrunk
//! rate lives in the exported state (version 5), so a hot swap keeps the pace Azure asked for.
//!
//! The fixed budgets are guesses; ARM says how much room is left on every answer
//! (`x-ms-ratelimit-remaining-subscription-writes`), counting what every other client of the
//! subscription spent too. While those figures come, [`ArmPace`] paces every ARM-routed write
//! (NRP's are POST actions through ARM) instead of the `arm-writes` and `update-services`
//! budgets: it spends down to a reserve left to the other clients, then at ARM's refill rate. The
//! `update-address-locations` budget still applies as well: it is what coalesces a burst of
//! endpoint changes into few batches, not a guess at ARM's limit.

use serde::{Deserialize, Serialize};

/// Units per token: a millisecond at one write per minute adds one unit.
pub const UNITS_PER_TOKEN: u64 = 60_000;
/// A token in [`ArmPace`]'s signed units.
const TOKEN: i64 = UNITS_PER_TOKEN as i64;
/// A throttled rate never falls below the configured one divided by this (and never below one
/// write a minute).
pub const FLOOR_DIVISOR: u32 = 32;
/// An accepted write gives back the configured rate divided by this.
pub const RECOVERY_DIVISOR: u32 = 8;
/// The highest rate and burst a budget may have: far above what any Azure API accepts, low
/// enough that no arithmetic on them overflows.
pub const MAX_PER_MINUTE: u32 = 600_000;
pub const MAX_BURST: u32 = 100_000;

/// A token bucket's shape: `burst` writes at once, refilled at `per_minute`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    pub per_minute: u32,
    pub burst: u32,
}

/// The budgets of the writes the tracker issues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteBudgets {
    /// NRP `update-address-locations`: the endpoint changes of every Service.
    pub update_address_locations: Budget,
    /// NRP `update-services`: registering, unlinking and unregistering a Service.
    pub update_services: Budget,
    /// ARM writes and deletes of public IPs, load balancers and NAT gateways.
    pub arm_writes: Budget,
    /// The writes [`ArmPace`] leaves to other clients of the subscription.
    pub arm_write_reserve: u32,
}

impl WriteBudgets {
    /// The defaults (docs/operations.md, "Write budgets"). ARM's documented limit for one
    /// principal is a bucket of 200 writes (and one of 200 deletes) refilled at 10 a second, per
    /// subscription and region; the controller takes half of the refill and half of the writes'
    /// bucket, leaving the rest to everything else the cluster's identity does. NRP publishes no
    /// limit: 5 calls a second each, with a burst of 10 (address locations: each call carries up
    /// to 200 locations, so a burst of changes coalesces within 200 ms) and 20 (registrations).
    pub const DEFAULT: WriteBudgets = WriteBudgets {
        update_address_locations: Budget { per_minute: 300, burst: 10 },
        update_services: Budget { per_minute: 300, burst: 20 },
        arm_writes: Budget { per_minute: 300, burst: 100 },
        arm_write_reserve: DEFAULT_ARM_WRITE_RESERVE,
    };
}

impl Default for WriteBudgets {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Which bucket a write draws on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    AddressLocations,
    Services,
    Arm,
}

impl WriteKind {
    /// The name operators see in logs and flags.
    pub fn name(self) -> &'static str {
        match self {
            WriteKind::AddressLocations => "update-address-locations",
            WriteKind::Services => "update-services",
            WriteKind::Arm => "arm-writes",
        }
    }
}

/// The level of one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    /// Tokens held, in units ([`UNITS_PER_TOKEN`] per token).
    units: u64,
    /// The rate now: the configured one, or less after a 429.
    per_minute: u32,
    /// The time (tracker's) up to which `units` is counted.
    at_ms: u64,
}

impl Bucket {
    /// A full bucket at the configured rate.
    pub fn full(budget: Budget) -> Self {
        Self { units: u64::from(budget.burst) * UNITS_PER_TOKEN, per_minute: budget.per_minute, at_ms: 0 }
    }

    /// Counts the time since the last look. A bucket from a state exported under another budget
    /// (or by a host whose clock was ahead) is brought within this one; time before `at_ms` is
    /// never credited twice, and a `now` before it credits nothing.
    fn refill(&mut self, budget: Budget, now: u64) {
        self.per_minute = self.per_minute.clamp(floor(budget), budget.per_minute);
        let elapsed = now.saturating_sub(self.at_ms);
        let added = elapsed.saturating_mul(u64::from(self.per_minute));
        self.units = self.units.saturating_add(added).min(u64::from(budget.burst) * UNITS_PER_TOKEN);
        self.at_ms = now;
    }

    /// A bucket counted up to a time after `now` (a state from a host whose clock was ahead)
    /// counts from `now` on: otherwise it would refill only once `now` passed that time.
    pub fn bring_in(&mut self, now: u64) {
        self.at_ms = self.at_ms.min(now);
    }

    /// Takes a token if there is one.
    pub fn try_take(&mut self, budget: Budget, now: u64) -> bool {
        self.refill(budget, now);
        if self.units >= UNITS_PER_TOKEN {
            self.units -= UNITS_PER_TOKEN;
            true
        } else {
            false
        }
    }

    /// When the next token comes, if none is there at `now`. Whether one is there is what
    /// [`Bucket::try_take`] finds, not whether that time is after `now`: at the end of time the
    /// time saturates to `now` while no token ever comes.
    pub fn due(&self, budget: Budget, now: u64) -> Option<u64> {
        let mut probe = *self;
        probe.refill(budget, now);
        let missing = UNITS_PER_TOKEN.checked_sub(probe.units).filter(|&m| m > 0)?;
        Some(now.saturating_add(missing.div_ceil(u64::from(probe.per_minute))))
    }

    /// Azure throttled the operation: half the rate, nothing left in the bucket. Returns the
    /// new rate.
    pub fn throttled(&mut self, budget: Budget, now: u64) -> u32 {
        self.refill(budget, now);
        self.per_minute = (self.per_minute / 2).max(floor(budget));
        self.units = 0;
        self.per_minute
    }

    /// Azure accepted a write: part of a throttled rate comes back.
    pub fn accepted(&mut self, budget: Budget, now: u64) {
        self.refill(budget, now);
        let step = (budget.per_minute / RECOVERY_DIVISOR).max(1);
        self.per_minute = self.per_minute.saturating_add(step).min(budget.per_minute);
    }

    /// The rate now (writes per minute).
    pub fn per_minute(&self) -> u32 {
        self.per_minute
    }

    /// Whole tokens it would give at `now`, and its rate; changes nothing.
    pub fn level(&self, budget: Budget, now: u64) -> (i64, u32) {
        let mut probe = *self;
        probe.refill(budget, now);
        (i64::try_from(probe.units / UNITS_PER_TOKEN).unwrap_or(i64::MAX), probe.per_minute)
    }

    /// Whether the rate is below the configured one (a 429 shrank it).
    pub fn is_shrunk(&self, budget: Budget) -> bool {
        self.per_minute < budget.per_minute
    }
}

fn floor(budget: Budget) -> u32 {
    (budget.per_minute / FLOOR_DIVISOR).max(1).min(budget.per_minute)
}

/// ARM's documented subscription write bucket: 200 writes, refilled at 10 a second.
pub const ARM_WRITE_BUCKET: u32 = 200;
pub const ARM_REFILL_PER_MINUTE: u32 = 600;
/// The writes left to other clients by default: a fifth of ARM's bucket.
pub const DEFAULT_ARM_WRITE_RESERVE: u32 = 40;
/// A figure older than this paces no more: the fixed budgets do again (ARM refills its whole
/// bucket in 20 s, so an older figure says nothing about now).
pub const ARM_FIGURE_FRESH_MS: u64 = 60_000;

/// The pace of ARM-routed writes set by ARM's remaining-writes figures (state version 8).
///
/// A mirror of ARM's bucket less the reserve: each figure sets the level to what ARM reported
/// less the reserve and less the writes still in flight (ARM may not have counted them yet; so
/// the tracker never overshoots on their account). Between figures it refills at ARM's
/// documented rate. The level may be below zero: when other clients spend as fast as ARM
/// refills, each figure finds the bucket below the reserve again, the tracker waits for the
/// refill of the whole shortfall before its next write, and its writes settle at the rate the
/// headers show is left: the pace it observes, never ARM's 429. A 429 halves the refill rate (to
/// no less than a 32nd) and accepted writes give it back in eighths, as for the fixed budgets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArmPace {
    /// Writes left above the reserve, in units ([`UNITS_PER_TOKEN`] per write); negative: ARM's
    /// bucket is below the reserve.
    units: i64,
    /// The refill rate now: ARM's, or less after a 429.
    per_minute: u32,
    /// The time (tracker's) up to which `units` is counted.
    at_ms: u64,
    /// Most writes the refill reaches: ARM's bucket (200, or the largest figure seen) less the
    /// reserve.
    cap: u32,
    /// When ARM's figure last came.
    seen_at_ms: u64,
}

impl ArmPace {
    /// ARM reported `remaining` writes at `now` while `in_flight` ARM-routed writes were
    /// unanswered.
    pub fn reported(previous: Option<ArmPace>, remaining: u32, reserve: u32, in_flight: u32, now: u64) -> Self {
        let largest = previous.map_or(0, |p| p.cap.saturating_add(reserve));
        // At least one: a pace that never refilled would hold every write while figures come.
        let cap = ARM_WRITE_BUCKET.max(remaining).max(largest).saturating_sub(reserve).clamp(1, MAX_BURST);
        let left = i64::from(remaining) - i64::from(reserve) - i64::from(in_flight);
        Self {
            units: left.clamp(-i64::from(MAX_BURST), i64::from(cap)) * TOKEN,
            per_minute: previous.map_or(ARM_REFILL_PER_MINUTE, |p| p.per_minute),
            at_ms: now,
            cap,
            seen_at_ms: now,
        }
    }

    /// Whether the last figure is recent enough to pace by.
    pub fn fresh(&self, now: u64) -> bool {
        now.saturating_sub(self.seen_at_ms) < ARM_FIGURE_FRESH_MS
    }

    fn refill(&mut self, now: u64) {
        self.per_minute = self.per_minute.clamp(pace_floor(), ARM_REFILL_PER_MINUTE);
        // Capped so that the product fits: a day refills any shortfall.
        let elapsed = now.saturating_sub(self.at_ms).min(86_400_000);
        let added = (elapsed * u64::from(self.per_minute)) as i64;
        self.units = self.units.saturating_add(added).min(i64::from(self.cap) * TOKEN);
        self.at_ms = self.at_ms.max(now);
    }

    /// A state from a host whose clock was ahead counts from `now` on (as [`Bucket::bring_in`]).
    pub fn bring_in(&mut self, now: u64) {
        self.at_ms = self.at_ms.min(now);
        self.seen_at_ms = self.seen_at_ms.min(now);
    }

    /// Takes a write if there is one.
    pub fn try_take(&mut self, now: u64) -> bool {
        self.refill(now);
        let taken = self.units >= TOKEN;
        if taken {
            self.units -= TOKEN;
        }
        taken
    }

    /// When the next write may go, if none may at `now` (as [`Bucket::due`]).
    pub fn due(&self, now: u64) -> Option<u64> {
        let mut probe = *self;
        probe.refill(now);
        let missing = u64::try_from(TOKEN.saturating_sub(probe.units)).ok().filter(|&m| m > 0)?;
        Some(now.saturating_add(missing.div_ceil(u64::from(probe.per_minute))))
    }

    /// ARM throttled a write: half the refill rate, nothing left above the reserve.
    pub fn throttled(&mut self, now: u64) -> u32 {
        self.refill(now);
        self.per_minute = (self.per_minute / 2).max(pace_floor());
        self.units = self.units.min(0);
        self.per_minute
    }

    /// ARM accepted a write: an eighth of a throttled rate comes back.
    pub fn accepted(&mut self, now: u64) {
        self.refill(now);
        let step = ARM_REFILL_PER_MINUTE / RECOVERY_DIVISOR;
        self.per_minute = self.per_minute.saturating_add(step).min(ARM_REFILL_PER_MINUTE);
    }

    /// The refill rate now (writes per minute).
    pub fn per_minute(&self) -> u32 {
        self.per_minute
    }

    /// Whole writes it would allow at `now` (negative: that many short of the reserve) and its
    /// rate, while its figure is fresh; changes nothing.
    pub fn level(&self, now: u64) -> Option<(i64, u32)> {
        let mut probe = *self;
        probe.refill(now);
        self.fresh(now).then_some((probe.units.div_euclid(TOKEN), probe.per_minute))
    }
}

fn pace_floor() -> u32 {
    ARM_REFILL_PER_MINUTE / FLOOR_DIVISOR
}

/// The buckets of the tracker (state version 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Buckets {
    pub address_locations: Bucket,
    pub services: Bucket,
    pub arm: Bucket,
}

impl Buckets {
    pub fn full(budgets: &WriteBudgets) -> Self {
        Self {
            address_locations: Bucket::full(budgets.update_address_locations),
            services: Bucket::full(budgets.update_services),
            arm: Bucket::full(budgets.arm_writes),
        }
    }

    /// The bucket of `kind` and its configured shape.
    pub fn of(&mut self, budgets: &WriteBudgets, kind: WriteKind) -> (&mut Bucket, Budget) {
        match kind {
            WriteKind::AddressLocations => (&mut self.address_locations, budgets.update_address_locations),
            WriteKind::Services => (&mut self.services, budgets.update_services),
            WriteKind::Arm => (&mut self.arm, budgets.arm_writes),
        }
    }

    /// [`Bucket::bring_in`] for each bucket.
    pub fn bring_in(&mut self, now: u64) {
        for bucket in [&mut self.address_locations, &mut self.services, &mut self.arm] {
            bucket.bring_in(now);
        }
    }

    /// [`Bucket::level`] of `kind`.
    pub fn level(&self, kind: WriteKind, budgets: &WriteBudgets, now: u64) -> (i64, u32) {
        let mut probe = *self;
        let (bucket, budget) = probe.of(budgets, kind);
        bucket.level(budget, now)
    }

    /// When a write of `kind` may go, if none may at `now` ([`Bucket::due`]).
    pub fn due(&self, budgets: &WriteBudgets, kind: WriteKind, now: u64) -> Option<u64> {
        let mut probe = *self;
        let (bucket, budget) = probe.of(budgets, kind);
        bucket.due(budget, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEN_A_SECOND: Budget = Budget { per_minute: 600, burst: 3 };

    #[test]
    fn a_full_bucket_gives_its_burst_at_once_and_then_one_token_per_refill_interval() {
        let mut bucket = Bucket::full(TEN_A_SECOND);
        assert!((0..3).all(|_| bucket.try_take(TEN_A_SECOND, 1_000)));
        assert!(!bucket.try_take(TEN_A_SECOND, 1_000));
        assert_eq!(bucket.due(TEN_A_SECOND, 1_000), Some(1_100));
        assert!(!bucket.try_take(TEN_A_SECOND, 1_099));
        assert!(bucket.try_take(TEN_A_SECOND, 1_100));
        // An hour idle refills no more than the burst.
        assert!((0..3).all(|_| bucket.try_take(TEN_A_SECOND, 3_601_100)));
        assert!(!bucket.try_take(TEN_A_SECOND, 3_601_100));
    }

    #[test]
    fn a_rate_of_one_a_minute_refills_exactly_with_no_rounding_drift() {
        let slow = Budget { per_minute: 1, burst: 1 };
        let mut bucket = Bucket::full(slow);
        assert!(bucket.try_take(slow, 0));
        for minute in 1..=1_000u64 {
            assert!(!bucket.try_take(slow, minute * 60_000 - 1), "minute {minute}");
            assert!(bucket.try_take(slow, minute * 60_000), "minute {minute}");
        }
    }

    #[test]
    fn a_429_halves_the_rate_down_to_a_floor_and_accepted_writes_give_it_back_in_eighths() {
        let budget = Budget { per_minute: 320, burst: 10 };
        let mut bucket = Bucket::full(budget);
        assert_eq!(bucket.throttled(budget, 0), 160);
        assert_eq!(bucket.due(budget, 0), Some(375), "empty: the next token at the halved rate");
        let rates: Vec<u32> = (0..8).map(|_| bucket.throttled(budget, 0)).collect();
        assert_eq!(rates, [80, 40, 20, 10, 10, 10, 10, 10], "floor: 320 / 32");
        for _ in 0..8 {
            bucket.accepted(budget, 0);
        }
        assert_eq!(bucket.per_minute(), 320, "8 accepted writes of 40 each, capped at the configured rate");
        assert!(!bucket.is_shrunk(budget));
    }

    #[test]
    fn a_bucket_from_a_larger_budget_or_a_clock_ahead_is_brought_within_this_one() {
        let large = Budget { per_minute: 6_000, burst: 100 };
        let small = Budget { per_minute: 60, burst: 2 };
        let mut bucket = Bucket::full(large);
        bucket.at_ms = 10_000;
        assert!(bucket.try_take(small, 5_000));
        assert!(bucket.try_take(small, 5_000));
        assert!(!bucket.try_take(small, 5_000), "no more than the smaller burst");
        assert_eq!(bucket.per_minute(), 60);
        assert_eq!(bucket.due(small, 5_000), Some(6_000));
    }

    // Regression: the property test after_any_event_sequence_with_failures_nrp_converges_… with
    // a clock stepped back an hour, then a state round trip (the new tracker's clock is the
    // host's): an empty bucket counted up to the old clock's time would refill only an hour
    // later, so the tracker did not settle.
    #[test]
    fn an_empty_bucket_counted_up_to_a_clock_an_hour_ahead_refills_from_now_once_brought_in() {
        let budget = Budget { per_minute: 150, burst: 10 };
        let mut bucket = Bucket { units: 0, per_minute: 150, at_ms: 3_600_000 };
        assert_eq!(bucket.due(budget, 1_000), Some(1_400), "not an hour ahead");
        bucket.bring_in(1_000);
        assert!(!bucket.try_take(budget, 1_399));
        assert!(bucket.try_take(budget, 1_400));
    }

    #[test]
    fn arms_figure_is_spent_down_to_the_reserve_less_what_is_in_flight_then_at_arms_refill_rate() {
        let mut pace = ArmPace::reported(None, 200, 40, 10, 1_000);
        assert!((0..150).all(|_| pace.try_take(1_000)), "200 - 40 reserved - 10 in flight");
        assert!(!pace.try_take(1_000));
        assert_eq!(pace.due(1_000), Some(1_100), "ARM refills 10 a second");
        assert!(pace.try_take(1_100));
        // A minute idle refills up to ARM's bucket less the reserve, no more.
        let mut idle = pace;
        assert!((0..160).all(|_| idle.try_take(61_100)));
        assert!(!idle.try_take(61_100));
    }

    #[test]
    fn any_figure_lets_exactly_what_is_above_the_reserve_and_the_writes_in_flight_go_at_once_and_then_one_a_refill() {
        for remaining in (0..=1_000).step_by(7) {
            for reserve in [0, 1, 40, 199] {
                for in_flight in [0, 1, 17, 300] {
                    let mut pace = ArmPace::reported(None, remaining, reserve, in_flight, 0);
                    let at_once = (0..=2_000).take_while(|_| pace.try_take(0)).count();
                    let room = i64::from(remaining) - i64::from(reserve) - i64::from(in_flight);
                    let what = format!("{remaining} left, {reserve} reserved, {in_flight} in flight");
                    assert_eq!(at_once as i64, room.max(0), "{what}");
                    // Then one write per 100 ms of ARM's refill, once any shortfall is made up.
                    let next = pace.due(0).expect("no write left at once");
                    assert_eq!(next, (100 * (1 - room.min(0))) as u64, "{what}");
                    assert!(!pace.try_take(next - 1) && pace.try_take(next), "{what}");
                }
            }
        }
    }

    #[test]
    fn a_figure_below_the_reserve_waits_for_the_refill_of_the_whole_shortfall() {
        // Another client spent ARM's bucket down to 30 of the 40 reserved: 11 writes of refill
        // before the next one.
        let pace = ArmPace::reported(None, 30, 40, 0, 0);
        assert_eq!(pace.due(0), Some(1_100));
        // A figure of a larger bucket than ARM documents raises the ceiling.
        let mut large = ArmPace::reported(Some(pace), 1_000, 40, 0, 0);
        assert!((0..960).all(|_| large.try_take(0)));
        assert!(!large.try_take(0));
        assert!((0..960).all(|_| large.try_take(600_000)), "refilled to the largest figure seen less the reserve");
    }

    #[test]
    fn a_429_halves_arms_pace_and_empties_it_and_accepted_writes_give_it_back() {
        let mut pace = ArmPace::reported(None, 100, 40, 0, 0);
        assert_eq!(pace.throttled(0), 300);
        assert_eq!(pace.due(0), Some(200), "one write at 5 a second");
        let rates: Vec<u32> = (0..6).map(|_| pace.throttled(0)).collect();
        assert_eq!(rates, [150, 75, 37, 18, 18, 18], "floor: 600 / 32");
        // A new figure keeps the shrunk rate.
        let mut pace = ArmPace::reported(Some(pace), 100, 40, 0, 0);
        assert_eq!(pace.per_minute(), 18);
        (0..8).for_each(|_| pace.accepted(0));
        assert_eq!(pace.per_minute(), ARM_REFILL_PER_MINUTE);
    }

    #[test]
    fn a_figure_paces_for_a_minute_and_a_state_from_a_clock_ahead_counts_from_now() {
        let pace = ArmPace::reported(None, 100, 40, 0, 10_000);
        assert!(pace.fresh(69_999));
        assert!(!pace.fresh(70_000));
        let mut ahead = ArmPace::reported(None, 40, 40, 0, 3_600_000);
        ahead.bring_in(1_000);
        assert!(ahead.fresh(1_000));
        assert_eq!(ahead.due(1_000), Some(1_100));
    }

    #[test]
    fn the_largest_budget_at_the_end_of_time_saturates_instead_of_overflowing() {
        let largest = Budget { per_minute: MAX_PER_MINUTE, burst: MAX_BURST };
        let mut bucket = Bucket::full(largest);
        assert!((0..MAX_BURST).all(|_| bucket.try_take(largest, u64::MAX)));
        assert_eq!(bucket.due(largest, u64::MAX), Some(u64::MAX), "never, and not `now`'s token either");
        assert!(!bucket.try_take(largest, u64::MAX));
        let slowest = Budget { per_minute: 1, burst: 1 };
        let mut bucket = Bucket::full(slowest);
        assert!(bucket.try_take(slowest, u64::MAX - 1));
        assert_eq!(bucket.due(slowest, u64::MAX - 1), Some(u64::MAX), "saturated, not wrapped");
    }
}
