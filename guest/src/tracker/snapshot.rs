//! Export and import of the tracker's state (the format is `state`).

use crate::budget::Buckets;
#[cfg(test)]
use crate::config::ConfigError;
use crate::config::{Config, validate_config};
use crate::egress::Egress;

use crate::model::*;
use crate::outbound::Outbound;
use crate::pod_finalizers::PodFinalizers;

use super::figures::Figures;
use super::state::*;

impl Tracker {
    /// A tracker as [`Self::create`], but with its start-up inventory of ARM settled and empty,
    /// as a state from before version 4 imports: for the tests of everything but start-up
    /// adoption, which then see the commands they saw before the inventory existed.
    #[cfg(test)]
    pub(crate) fn create_with_arm_settled(config: Config) -> Result<Self, ConfigError> {
        Ok(Self { arm: ArmSync::settled(), ..Self::create(config)? })
    }

    /// The state as versions 1 and 2 hold it: at most one address-location batch in flight, not
    /// when it was issued, and no per-location backoff ([`NrpSyncV2`]). A state holding more than
    /// that has no such form, and this panics.
    #[cfg(test)]
    fn state_v2(&self) -> State<NrpSyncV2> {
        self.state.clone().map_nrp(|n| {
            assert!(n.batches_in_flight.len() <= 1 && n.location_backoff.is_empty(), "no version-2 form: {n:?}");
            NrpSyncV2 {
                loaded: n.loaded,
                read_in_flight: n.read_in_flight,
                read_retries: n.read_retries,
                next_read_ms: n.next_read_ms,
                batch_in_flight: n.batches_in_flight.keys().next().copied(),
                batch_retries: n.batch_retries,
                batch_not_before_ms: n.batch_not_before_ms,
                batch_limit: n.batch_limit,
                quarantined: n.quarantined,
                service_writes_in_flight: n.service_writes_in_flight,
                foreign: n.foreign,
            }
        })
    }

    /// The state as version 1 wrote it ([`Self::state_v2`] alone), for tests of older payloads.
    #[cfg(test)]
    pub(crate) fn export_state_v1(&self) -> Vec<u8> {
        postcard::to_allocvec(&self.state_v2()).expect("plain data")
    }

    /// The state as version 2 wrote it (the version-1 payload, then the egress side), for tests
    /// of older payloads.
    #[cfg(test)]
    pub(crate) fn export_state_v2(&self) -> Vec<u8> {
        postcard::to_allocvec(&(&self.state_v2(), &self.egress)).expect("plain data")
    }

    /// The state as version 3 wrote it (no ARM inventory), for tests of older payloads.
    #[cfg(test)]
    pub(crate) fn export_state_v3(&self) -> Vec<u8> {
        postcard::to_allocvec(&(&self.state, &self.egress)).expect("plain data")
    }

    /// The state as version 4 wrote it (no write budgets), for tests of older payloads.
    #[cfg(test)]
    pub(crate) fn export_state_v4(&self) -> Vec<u8> {
        postcard::to_allocvec(&(&self.state, &self.egress, &self.arm)).expect("plain data")
    }

    /// The state as version 5 wrote it (no outbound lifecycles), for tests of older payloads.
    #[cfg(test)]
    pub(crate) fn export_state_v5(&self) -> Vec<u8> {
        postcard::to_allocvec(&(&self.state, &self.egress, &self.arm, &self.budget)).expect("plain data")
    }

    /// The state as version 6 wrote it (no pod finalizers), for tests of older payloads.
    #[cfg(test)]
    pub(crate) fn export_state_v6(&self) -> Vec<u8> {
        postcard::to_allocvec(&(&self.state, &self.egress, &self.arm, &self.budget, &self.outbound))
            .expect("plain data")
    }

    /// The state as version 7 wrote it (no pace set by ARM's figures), for tests of older
    /// payloads.
    #[cfg(test)]
    pub(crate) fn export_state_v7(&self) -> Vec<u8> {
        postcard::to_allocvec(&(&self.state, &self.egress, &self.arm, &self.budget, &self.outbound, &self.pods))
            .expect("plain data")
    }

    /// The state as version 8 wrote it (no figures), for tests of older payloads.
    #[cfg(test)]
    pub(crate) fn export_state_v8(&self) -> Vec<u8> {
        let parts = (&self.state, &self.egress, &self.arm, &self.budget, &self.outbound, &self.pods, &self.pace);
        postcard::to_allocvec(&parts).expect("plain data")
    }

    /// This tracker's current payload with `state` in place of its own, for tests of states that
    /// must be refused.
    #[cfg(test)]
    pub(super) fn payload_with(&self, state: &State) -> Vec<u8> {
        postcard::to_allocvec(&self.parts_with(state)).expect("plain data")
    }

    /// The whole state: `(version, payload)`. Version 2 is the version-1 payload followed by
    /// the egress side (postcard encodes a pair as one after the other).
    pub fn export_state(&self) -> (u32, Vec<u8>) {
        let payload =
            postcard::to_allocvec(&self.parts_with(&self.state)).expect("the state is plain data and always encodes");
        (STATE_VERSION, payload)
    }

    /// The schema version [`Self::export_state`] writes.
    pub fn state_version(&self) -> u32 {
        STATE_VERSION
    }

    /// A tracker from exported state. The payload must be exactly one value of its version
    /// (bytes after it are refused: a version-2 payload offered as version 1 would otherwise
    /// import without its egress side), and what [`State::check`] and [`Egress::check`] verify
    /// must hold; anything else is [`StateError::Corrupt`].
    pub fn import_state(config: Config, version: u32, payload: &[u8]) -> Result<Self, StateError> {
        let mode = validate_config(&config).map_err(StateError::InvalidConfig)?;
        let corrupt = |why: String| StateError::Corrupt(format!("state version {version}: {why}"));
        let full = Buckets::full(&config.write_budgets());
        let none = Outbound::default();
        let no_pods = PodFinalizers::default;
        if !(1..=STATE_VERSION).contains(&version) {
            return Err(StateError::UnsupportedVersion(version));
        }
        // Each part the version has, one after the other (postcard writes a tuple so), then
        // nothing: one decoder per part for every version. A part a version lacks starts as that
        // version implies: no egress pods, the ARM inventory settled, full write budgets, no
        // outbound lifecycles, no pod held, no pace set by ARM's figures, no figures counted.
        let mut rest = payload;
        let state = if version <= 2 {
            take::<State<NrpSyncV2>>(&mut rest).map_err(corrupt)?.upgrade()
        } else {
            take::<State>(&mut rest).map_err(corrupt)?
        };
        let egress = if version >= 2 { take(&mut rest).map_err(corrupt)? } else { Egress::default() };
        let arm = if version >= 4 { take(&mut rest).map_err(corrupt)? } else { ArmSync::settled() };
        let budget = if version >= 5 { take(&mut rest).map_err(corrupt)? } else { full };
        let outbound = if version >= 6 { take(&mut rest).map_err(corrupt)? } else { none };
        let pods = if version >= 7 { take(&mut rest).map_err(corrupt)? } else { no_pods() };
        let pace = if version >= 8 { take(&mut rest).map_err(corrupt)? } else { None };
        let figures: Figures = if version >= 9 { take(&mut rest).map_err(corrupt)? } else { Figures::default() };
        if !rest.is_empty() {
            return Err(corrupt(format!("{} byte(s) after the payload", rest.len())));
        }
        state.check(&arm, &outbound, &pods).map_err(corrupt)?;
        egress.check().map_err(corrupt)?;
        outbound.check().map_err(corrupt)?;
        figures.check().map_err(corrupt)?;
        Ok(Self { config, mode, state, egress, arm, budget, outbound, pods, pace, clock: Clock::default(), figures })
    }
}
