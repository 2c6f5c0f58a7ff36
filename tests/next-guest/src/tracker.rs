//! The wrapper around the real tracker: what the next version of the logic changes.

use crate::config::{Config, ConfigError};
use crate::model::{
    Command, Event, EventType, Issued, ObjectRef, Observation, Outcome, ResourceKind, ResourceRef, Step,
};
use crate::v1;
use serde::{Deserialize, Serialize};

pub use crate::v1::{Histogram, Operation, ServiceType, StateError, Stats};

/// The schema this version exports: one above the real tracker's.
pub const STATE_VERSION: u32 = v1::STATE_VERSION + 1;
/// Services carrying it get a Warning Event on every observation (the changed rule).
pub const LEGACY_ANNOTATION: &str = "clb.test/legacy";
pub const LEGACY_REASON: &str = "LegacyAnnotation";
/// Observing a Service carrying it panics (the trap trigger).
pub const PANIC_ANNOTATION: &str = "clb.test/panic-on-observe";
/// A tick at a time from this one up to [`DESTRUCTIVE_TICK_FROM_MS`] panics (the trap trigger
/// for time itself: a version whose ticks trap). No real clock gets there.
pub const PANIC_TICK_FROM_MS: u64 = 1 << 61;
/// A tick at or after this time proposes deleting [`DESTRUCTIVE_TICK_TARGET`] (the destructive
/// tick): no real clock gets there, so only a test that asks for it sees it. With the
/// `destructive-tick` feature every tick does: the kind of regression the host's swap
/// self-check exists to refuse.
pub const DESTRUCTIVE_TICK_FROM_MS: u64 = 1 << 62;
pub const DESTRUCTIVE_TICK_TARGET: &str = "next-guest-destructive-tick";
/// The wrapper's own command ids live above this bit, so they never meet the tracker's.
const OWN_ID_BIT: u64 = 1 << 63;

/// This version's state: the real tracker's payload and the new field.
#[derive(Serialize, Deserialize)]
struct StateV2 {
    v1: Vec<u8>,
    next_own_id: u64,
}

pub struct Tracker {
    inner: v1::Tracker,
    next_own_id: u64,
}

impl Tracker {
    pub fn create(config: Config) -> Result<Self, ConfigError> {
        Ok(Self { inner: v1::Tracker::create(config)?, next_own_id: 0 })
    }

    pub fn observe(&mut self, now_ms: u64, batch: Vec<Observation>) -> Step {
        let mut warnings = Vec::new();
        for observation in &batch {
            let Observation::ServiceUpserted(service) = observation else { continue };
            let has = |key: &str| service.annotations.iter().any(|(k, _)| k == key);
            if has(PANIC_ANNOTATION) {
                panic!("next guest: asked to trap by service {}/{}", service.namespace, service.name);
            }
            if has(LEGACY_ANNOTATION) {
                warnings.push(ObjectRef {
                    kind: "Service".into(),
                    namespace: service.namespace.as_str().into(),
                    name: service.name.as_str().into(),
                    uid: service.uid.as_str().into(),
                });
            }
        }
        let mut step = self.inner.observe(now_ms, batch);
        for regarding in warnings {
            let id = self.own_id();
            let event = Event {
                regarding,
                event_type: EventType::Warning,
                reason: LEGACY_REASON.into(),
                message: format!("the annotation {LEGACY_ANNOTATION} is ignored by this version"),
            };
            step.commands.push(Issued { id, command: Command::EmitEvent(event) });
        }
        step
    }

    pub fn complete_paced(
        &mut self,
        now_ms: u64,
        results: Vec<(u64, Outcome)>,
        arm_remaining_writes: Option<u32>,
    ) -> Step {
        // The outcomes of the wrapper's own Events change nothing.
        let results = results.into_iter().filter(|(id, _)| id & OWN_ID_BIT == 0).collect();
        self.inner.complete_paced(now_ms, results, arm_remaining_writes)
    }

    pub fn tick(&mut self, now_ms: u64) -> Step {
        if (PANIC_TICK_FROM_MS..DESTRUCTIVE_TICK_FROM_MS).contains(&now_ms) {
            panic!("next guest: asked to trap by a tick at {now_ms} ms");
        }
        let mut step = self.inner.tick(now_ms);
        if cfg!(feature = "destructive-tick") || now_ms >= DESTRUCTIVE_TICK_FROM_MS {
            let command = Command::DeleteResource(ResourceRef {
                kind: ResourceKind::LoadBalancer,
                name: DESTRUCTIVE_TICK_TARGET.into(),
            });
            step.commands.push(Issued { id: self.own_id(), command });
        }
        step
    }

    fn own_id(&mut self) -> u64 {
        let id = OWN_ID_BIT | self.next_own_id;
        self.next_own_id += 1;
        id
    }

    pub fn export_state(&self) -> (u32, Vec<u8>) {
        let (version, v1) = self.inner.export_state();
        debug_assert_eq!(version, v1::STATE_VERSION);
        let state = StateV2 { v1, next_own_id: self.next_own_id };
        (STATE_VERSION, postcard::to_allocvec(&state).expect("plain data always encodes"))
    }

    pub fn state_version(&self) -> u32 {
        STATE_VERSION
    }

    /// The real tracker's figures: this version changes none.
    pub fn stats(&self, now_ms: u64) -> Stats {
        self.inner.stats(now_ms)
    }

    /// The real tracker's versions migrate by starting the new field at zero.
    pub fn import_state(config: Config, version: u32, payload: &[u8]) -> Result<Self, StateError> {
        match version {
            ..=v1::STATE_VERSION => {
                Ok(Self { inner: v1::Tracker::import_state(config, version, payload)?, next_own_id: 0 })
            }
            STATE_VERSION => {
                let state: StateV2 = postcard::from_bytes(payload)
                    .map_err(|e| StateError::Corrupt(format!("state version {version}: {e}")))?;
                let inner = v1::Tracker::import_state(config, v1::STATE_VERSION, &state.v1)?;
                Ok(Self { inner, next_own_id: state.next_own_id })
            }
            other => Err(StateError::UnsupportedVersion(other)),
        }
    }
}
