//! The `state_import` target: arbitrary bytes into `Tracker::import_state`, in every version
//! it accepts (1 and 2) and some it does not. The answer is a state or an error, never a panic;
//! a state it accepts exports and imports back to the same tracker, and its export is a fixed
//! point (the bytes need not be the input's: an unsorted set or a repeated key is read as a
//! `BTreeMap` would read it, and written sorted); and an accepted state must be usable: ticks,
//! the lists, answers to ids it may hold in flight, time at the end of `u64`.
//!
//! Allocation is bounded by the input, not by the lengths it claims: postcard reads a length
//! prefix and serde's sequences preallocate at most 1 MiB whatever it says (`size_hint::
//! cautious`), the state's own readers (`name.rs`) at most 4,096 entries, and strings and byte
//! strings are copied from the input; a claimed length beyond the input fails at its end.
//! Inputs longer than [`MAX_PAYLOAD`] are skipped rather than decoded slowly.

use clb_guest::model::{Failure, Observation, Outcome};
use clb_guest::tracker::{STATE_VERSION, Tracker};

/// The longest payload tried (real states of the example scenarios are a few KB).
pub const MAX_PAYLOAD: usize = 1 << 20;

/// The input: one byte for the version (0 ⇒ 1, 1 ⇒ 2, 2 ⇒ 3, else four more bytes), one for
/// the configuration, then the payload.
pub fn state_import(data: &[u8]) {
    let Some((&version, rest)) = data.split_first() else { return };
    let (version, rest) = match version {
        0 => (1, rest),
        1 => (STATE_VERSION, rest),
        2 => (STATE_VERSION + 1, rest),
        _ if rest.len() >= 4 => (u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]), &rest[4..]),
        _ => (STATE_VERSION, rest),
    };
    let Some((&config, payload)) = rest.split_first() else { return };
    if payload.len() > MAX_PAYLOAD {
        return;
    }
    let config = match config % 4 {
        0 | 1 => clb_guest::Config {
            backend_pool_type: "podIP".into(),
            load_balancer_sku: "standardV2".into(),
            ..Default::default()
        },
        2 => clb_guest::Config {
            backend_pool_type: "nodeIP".into(),
            multiple_standard_load_balancers: vec!["kubernetes".into()],
            ..Default::default()
        },
        _ => clb_guest::Config { backend_pool_type: "bogus".into(), ..Default::default() },
    };
    let Ok(mut tracker) = Tracker::import_state(config.clone(), version, payload) else { return };
    let (v2, p2) = tracker.export_state();
    let again = Tracker::import_state(config.clone(), v2, &p2)
        .unwrap_or_else(|e| panic!("an accepted state re-exported does not import: {e:?}"));
    assert_eq!(again, tracker, "import(export(import(x))) is import(x)");
    assert_eq!(again.export_state(), (v2, p2), "export is a fixed point");
    // An accepted state must run.
    let now = 1_700_000_000_000;
    let _ = tracker.tick(now);
    let _ = tracker.observe(now, vec![Observation::ListsComplete]);
    let failure = |status| {
        Outcome::Failed(Failure { status, code: None, retry_after_ms: Some(u64::MAX), message: "fuzz".into() })
    };
    let answers = (0..16u64).map(|id| (id, if id % 2 == 0 { Outcome::Ok } else { failure(409) })).collect();
    let _ = tracker.complete(now + 1, answers);
    let _ = tracker.tick(now + 600_000);
    let _ = tracker.tick(u64::MAX);
    let _ = tracker.export_state();
}
