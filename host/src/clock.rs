//! Wall-clock time as the operator surfaces show it (`/status`, the operator page, the last
//! denials at the door): milliseconds since the Unix epoch. The controller's own clock is
//! monotonic (`live::run`); this one is only ever shown.

/// Now, in ms since the epoch (0 before it, the largest value past what a u64 holds).
pub fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
