//! ARM's subscription throttling as the emulator applies it: two token buckets, one for writes
//! (PUT, DELETE, POST: NRP's ServiceGateway actions are POSTs through ARM) and one for reads
//! (GETs and lists), with ARM's published sizes by default — writes 200 tokens refilled 10 a
//! second, reads 250 refilled 25 a second. Another client of the same subscription may spend
//! write tokens too, so the refill the controller sees is lower.
//!
//! Levels are kept in milli-tokens and time in milliseconds, so that a refill is an exact
//! integer product (tokens a second × milliseconds = milli-tokens) and a run on virtual time is
//! the same run every time.

use serde::{Deserialize, Serialize};

/// Milli-tokens in a token.
const MILLI: u64 = 1_000;

/// One bucket's size and refill.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BucketLimits {
    /// Tokens when full: how many calls a quiet subscription may make at once.
    pub burst: u32,
    /// Tokens added a second, up to `burst`.
    pub per_second: u32,
}

/// ARM's subscription limits the emulator enforces; `EmulatorConfig::arm_limits` holds them
/// (`None`: unlimited).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ArmLimits {
    pub writes: BucketLimits,
    pub reads: BucketLimits,
    /// Write tokens another client of the subscription spends a second: the controller's net
    /// refill is `writes.perSecond` less this (below zero, its bucket drains on its own).
    pub other_client_writes_per_second: u32,
    /// Whether answers carry the remaining figures (ARM's do); `false` is an ARM behind a proxy
    /// that strips them, where the controller falls back to its fixed write budgets.
    pub report_remaining: bool,
}

impl ArmLimits {
    /// ARM's published subscription write limit.
    pub const ARM_WRITES: BucketLimits = BucketLimits { burst: 200, per_second: 10 };
    /// ARM's published subscription read limit.
    pub const ARM_READS: BucketLimits = BucketLimits { burst: 250, per_second: 25 };
}

impl Default for ArmLimits {
    /// ARM's published sizes, and no other client.
    fn default() -> Self {
        Self {
            writes: Self::ARM_WRITES,
            reads: Self::ARM_READS,
            other_client_writes_per_second: 0,
            report_remaining: true,
        }
    }
}

/// Which bucket a call draws on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bucket {
    Writes,
    Reads,
}

impl Bucket {
    /// The header of ARM's answers that reports this bucket's remaining tokens.
    pub fn header(self) -> &'static str {
        match self {
            Bucket::Writes => clb_azure::REMAINING_WRITES_HEADER,
            Bucket::Reads => clb_azure::REMAINING_READS_HEADER,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Bucket::Writes => "writes",
            Bucket::Reads => "reads",
        }
    }
}

/// What a bucket said to one call: the figure its answer carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Figure {
    pub bucket: Bucket,
    /// Whole tokens left after this call.
    pub remaining: u32,
}

/// An empty bucket's answer: 429 after this many seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttled {
    pub bucket: Bucket,
    pub retry_after_secs: u64,
}

impl Throttled {
    /// ARM's message for it, naming the bucket.
    pub fn message(self) -> String {
        format!(
            "the subscription's {} bucket is empty (x-ms-ratelimit-remaining-subscription-{}: 0); retry after {}s",
            self.bucket.name(),
            self.bucket.name(),
            self.retry_after_secs
        )
    }
}

/// The current remaining figures, as `GET /emulator/state` shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArmRemaining {
    pub writes: u32,
    pub reads: u32,
}

/// The two buckets and the instant they were last brought up to date.
#[derive(Clone, Debug)]
pub(crate) struct ArmBuckets {
    limits: ArmLimits,
    writes_milli: u64,
    reads_milli: u64,
    last_ms: u64,
}

impl ArmBuckets {
    pub fn report_remaining(&self) -> bool {
        self.limits.report_remaining
    }

    /// Both buckets full at `now_ms`.
    pub fn starting(limits: ArmLimits, now_ms: u64) -> Self {
        Self { writes_milli: capacity(limits.writes), reads_milli: capacity(limits.reads), last_ms: now_ms, limits }
    }

    /// The levels at `now_ms` (milli-tokens), without changing anything. A `now_ms` before the
    /// last instant credits nothing: time as the buckets see it only moves forward.
    fn levels_at(&self, now_ms: u64) -> (u64, u64) {
        let elapsed = i128::from(now_ms.saturating_sub(self.last_ms));
        let net_writes =
            i128::from(self.limits.writes.per_second) - i128::from(self.limits.other_client_writes_per_second);
        let refill = |level: u64, per_second: i128, limits: BucketLimits| {
            let level = i128::from(level) + elapsed * per_second;
            u64::try_from(level.clamp(0, i128::from(capacity(limits)))).unwrap_or(0)
        };
        (
            refill(self.writes_milli, net_writes, self.limits.writes),
            refill(self.reads_milli, i128::from(self.limits.reads.per_second), self.limits.reads),
        )
    }

    fn refill(&mut self, now_ms: u64) {
        (self.writes_milli, self.reads_milli) = self.levels_at(now_ms);
        self.last_ms = self.last_ms.max(now_ms);
    }

    /// Takes one token for a call at `now_ms`, or says how long until there is one.
    pub fn take(&mut self, bucket: Bucket, now_ms: u64) -> Result<Figure, Throttled> {
        self.refill(now_ms);
        let limits = self.limits_of(bucket);
        let level = self.level_mut(bucket);
        if *level < MILLI {
            // ARM's figure comes from its own refill rate: it cannot know that another client
            // will spend what it refills, so a client that waits this long may be refused again.
            let wait_ms = (MILLI - *level).div_ceil(u64::from(limits.per_second.max(1)));
            return Err(Throttled { bucket, retry_after_secs: wait_ms.div_ceil(1_000).max(1) });
        }
        *level -= MILLI;
        Ok(Figure { bucket, remaining: whole(*level) })
    }

    /// Another client spends `writes` and `reads` tokens at `now_ms`, down to empty.
    pub fn spend(&mut self, writes: u32, reads: u32, now_ms: u64) {
        self.refill(now_ms);
        self.writes_milli = self.writes_milli.saturating_sub(u64::from(writes) * MILLI);
        self.reads_milli = self.reads_milli.saturating_sub(u64::from(reads) * MILLI);
    }

    /// Whole tokens left in each bucket at `now_ms`.
    pub fn remaining_at(&self, now_ms: u64) -> ArmRemaining {
        let (writes, reads) = self.levels_at(now_ms);
        ArmRemaining { writes: whole(writes), reads: whole(reads) }
    }

    fn limits_of(&self, bucket: Bucket) -> BucketLimits {
        match bucket {
            Bucket::Writes => self.limits.writes,
            Bucket::Reads => self.limits.reads,
        }
    }

    fn level_mut(&mut self, bucket: Bucket) -> &mut u64 {
        match bucket {
            Bucket::Writes => &mut self.writes_milli,
            Bucket::Reads => &mut self.reads_milli,
        }
    }
}

fn capacity(limits: BucketLimits) -> u64 {
    u64::from(limits.burst) * MILLI
}

fn whole(milli: u64) -> u32 {
    u32::try_from(milli / MILLI).unwrap_or(u32::MAX)
}

/// The emulator's time: virtual (set by whoever drives it: `simulate`, unit tests) until it is
/// served over HTTP, then real time since the emulator was made (only the HTTP server switches
/// it).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Clock {
    Virtual(u64),
    Real(std::time::Instant),
}

impl Default for Clock {
    fn default() -> Self {
        Clock::Virtual(0)
    }
}

impl Clock {
    pub fn now_ms(&self) -> u64 {
        match self {
            Clock::Virtual(ms) => *ms,
            Clock::Real(started) => u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_bucket_waits_for_one_whole_token_at_the_gross_refill_rate() {
        let limits = ArmLimits {
            writes: BucketLimits { burst: 1, per_second: 3 },
            other_client_writes_per_second: 2,
            ..ArmLimits::default()
        };
        let mut buckets = ArmBuckets::starting(limits, 0);
        assert_eq!(buckets.take(Bucket::Writes, 0), Ok(Figure { bucket: Bucket::Writes, remaining: 0 }));
        // 1000 milli-tokens at 3 a millisecond: 334 ms, one whole second.
        assert_eq!(buckets.take(Bucket::Writes, 0), Err(Throttled { bucket: Bucket::Writes, retry_after_secs: 1 }));
        // The net refill is 1 a second: after 999 ms there is not yet a token, after 1 s there is.
        assert!(buckets.take(Bucket::Writes, 999).is_err());
        assert!(buckets.take(Bucket::Writes, 1_000).is_ok());
    }

    #[test]
    fn a_time_before_the_last_one_credits_nothing_and_does_not_move_the_buckets_back() {
        let mut buckets = ArmBuckets::starting(ArmLimits::default(), 0);
        buckets.spend(200, 0, 10_000);
        assert_eq!(buckets.remaining_at(10_000).writes, 0);
        buckets.refill(5_000);
        assert_eq!(buckets.remaining_at(10_000).writes, 0);
        assert_eq!(buckets.remaining_at(11_000).writes, 10);
    }

    #[test]
    fn another_client_spending_more_than_the_refill_drains_the_bucket_to_empty_and_no_lower() {
        let limits = ArmLimits { other_client_writes_per_second: 30, ..ArmLimits::default() };
        let buckets = ArmBuckets::starting(limits, 0);
        assert_eq!(buckets.remaining_at(1_000).writes, 180);
        assert_eq!(buckets.remaining_at(60_000).writes, 0);
        assert_eq!(buckets.remaining_at(60_000).reads, 250);
    }
}
