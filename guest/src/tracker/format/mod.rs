//! The state format: what `export_state` writes and `import_state` reads, apart from the
//! tracker's layout. A payload is the parts its version has, one after the other (postcard writes
//! a tuple so); [`record`] holds the records whose shape a version fixed and the upgrade of each
//! older one; [`check`] what an import verifies before it trusts a payload. Every version's bytes
//! are pinned by a fixture (`tests/fixtures/state/`), so the tracker's parts may change their
//! layout freely: only this module knows the order and shapes of the bytes (docs/design.md).

mod check;
mod record;

use super::egress::finalizers::PodFinalizers;
use super::egress::identities::Egress;
use super::egress::outbound::{Outbound, TornDown};
use crate::budget::Buckets;
use crate::config::{Config, ConfigError, validate_config};
use crate::model::Clock;

use super::budgets::Budgets;
use super::cache::KubeCache;
use super::egress::EgressSide;
use super::figures::Figures;
use super::inbound::Inbound;
use super::nrp::*;
use super::outbox::Outbox;
use super::startup::*;
use super::state::*;
use record::{Core, CoreRef, NrpSyncV2};

/// The schema version `export_state` writes. Bump it on any change to what a payload holds
/// (a record here, or a leaf's serde layout) and teach [`import`] to read the old one. Version 2 added the egress side ([`Egress`]) after the
/// version-1 payload ([`record::Core`]); a version-1 state imports with no egress pods. Version 3 keeps several
/// address-location batches in flight and per-location backoff ([`NrpSync`]); a version 1 or 2
/// state's one batch in flight carries over. Version 4 adds the start-up inventory of ARM
/// ([`ArmSync`]) after the version-3 payload; an older state imports with it settled (nothing
/// left to adopt). Version 5 adds the write budgets' buckets ([`Buckets`]) after the version-4
/// payload; an older state imports with full buckets. Version 6 adds the outbound lifecycles
/// ([`Outbound`]) after the version-5 payload; an older state imports with none (its egress
/// identities are somebody else's, as they were to it). Version 7 adds the egress pod
/// finalizers ([`PodFinalizers`]) after the version-6 payload; an older state imports with no
/// pod held (the host's next list or a pod's next update reads each pod's finalizer). Version 8
/// adds the pace set by ARM's remaining-writes figures ([`ArmPace`]) after the version-7
/// payload; an older state imports with none (the fixed budgets pace until ARM's next answer).
/// Version 9 adds the figures of `tracker.stats` ([`Figures`]) after the version-8 payload; an
/// older state imports with none (counters at zero, pending operations aged from the next call).
/// Version 10 adds the egress identities whose teardown ended lately ([`TornDown`]) after the
/// version-9 payload; an older state imports with none (a late write of its time is left as
/// before).
pub const STATE_VERSION: u32 = 10;

/// Why state could not be imported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateError {
    UnsupportedVersion(u32),
    Corrupt(String),
    InvalidConfig(ConfigError),
}

/// The next postcard value of `rest`, which moves past it.
fn take<T: serde::de::DeserializeOwned>(rest: &mut &[u8]) -> Result<T, String> {
    let (value, after) = postcard::take_from_bytes::<T>(rest).map_err(|e| e.to_string())?;
    *rest = after;
    Ok(value)
}

/// The payload of the current version: every part, in the order the versions added them.
pub(super) fn export(tracker: &Tracker) -> Vec<u8> {
    let (egress, budgets) = (&tracker.egress, &tracker.budgets);
    let parts = (
        CoreRef::of(tracker),
        &egress.identities,
        &tracker.startup.arm,
        &budgets.buckets,
        &egress.outbound,
        &egress.finalizers,
        &budgets.pace,
        &tracker.figures,
        &egress.torn_down,
    );
    // Counted first, then written into a buffer of that size, which never grows (see [`Exact`]).
    let size = exact(&parts, Exact::Count(0)).len();
    let Exact::Write(payload) = exact(&parts, Exact::Write(Vec::with_capacity(size))) else {
        unreachable!("a buffer being written stays one")
    };
    payload
}

/// `parts` through [`Exact`] from `start`.
fn exact(parts: &impl serde::Serialize, start: Exact) -> Exact {
    postcard::serialize_with_flavor(parts, start).expect("the state is plain data and always encodes")
}

/// Where [`export`] writes: counting the bytes only, or into a buffer sized beforehand. Grown by
/// doubling instead, the buffer for a large cluster's state held up to twice the state, beside
/// the old copy while it moved, in a linear memory that never shrinks: at 20,000 nodes and
/// 600,000 pods a checkpoint's 150 MB took the guest from 640 to 836 MiB. The price is a second
/// pass (a sixth more for an export and import at 1×, BENCHMARKS.md). One flavor for both
/// passes, so the serializer is compiled into the component once, not twice.
enum Exact {
    Count(usize),
    Write(Vec<u8>),
}

impl Exact {
    /// The bytes counted or written.
    fn len(&self) -> usize {
        match self {
            Exact::Count(size) => *size,
            Exact::Write(payload) => payload.len(),
        }
    }
}

impl postcard::ser_flavors::Flavor for Exact {
    type Output = Exact;

    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        match self {
            Exact::Count(size) => *size += bytes.len(),
            Exact::Write(payload) => payload.extend_from_slice(bytes),
        }
        Ok(())
    }

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.try_extend(&[byte])
    }

    fn finalize(self) -> postcard::Result<Exact> {
        Ok(self)
    }
}

/// A tracker from a payload of `version`. The payload must be exactly one value of its version
/// (bytes after it are refused: a version-2 payload offered as version 1 would otherwise import
/// without its egress side), and what [`check::check`], [`Egress::check`] and the other parts'
/// checks verify must hold; anything else is [`StateError::Corrupt`].
pub(super) fn import(config: Config, version: u32, payload: &[u8]) -> Result<Tracker, StateError> {
    let mode = validate_config(&config).map_err(StateError::InvalidConfig)?;
    let corrupt = |why: String| StateError::Corrupt(format!("state version {version}: {why}"));
    if !(1..=STATE_VERSION).contains(&version) {
        return Err(StateError::UnsupportedVersion(version));
    }
    // Each part the version has, one after the other, then nothing: one decoder per part for
    // every version. A part a version lacks starts as that version implies: no egress pods, the
    // ARM inventory settled, full write budgets, no outbound lifecycles, no pod held, no pace set
    // by ARM's figures, no figures counted, no identity remembered as torn down.
    let mut rest = payload;
    let core = if version <= 2 {
        take::<Core<NrpSyncV2>>(&mut rest).map_err(corrupt)?.upgrade()
    } else {
        take::<Core<NrpSync>>(&mut rest).map_err(corrupt)?
    };
    let identities = if version >= 2 { take(&mut rest).map_err(corrupt)? } else { Egress::default() };
    let arm = if version >= 4 { take(&mut rest).map_err(corrupt)? } else { ArmSync::settled() };
    let shapes = config.write_budgets();
    let buckets = if version >= 5 { take(&mut rest).map_err(corrupt)? } else { Buckets::full(&shapes) };
    let outbound = if version >= 6 { take(&mut rest).map_err(corrupt)? } else { Outbound::default() };
    let finalizers = if version >= 7 { take(&mut rest).map_err(corrupt)? } else { PodFinalizers::default() };
    let pace = if version >= 8 { take(&mut rest).map_err(corrupt)? } else { None };
    let figures: Figures = if version >= 9 { take(&mut rest).map_err(corrupt)? } else { Figures::default() };
    let torn_down: TornDown = if version >= 10 { take(&mut rest).map_err(corrupt)? } else { TornDown::default() };
    if !rest.is_empty() {
        return Err(corrupt(format!("{} byte(s) after the payload", rest.len())));
    }
    let outbox = Outbox {
        next_command_id: core.next_command_id,
        in_flight: core.in_flight,
        service_commands_in_flight: core.service_commands_in_flight,
    };
    let kube = KubeCache {
        services: core.services,
        service_by_identity: core.service_by_identity,
        slices: core.slices,
        slices_by_owner: core.slices_by_owner,
        slices_by_node: core.slices_by_node,
        nodes: core.nodes,
        lists_complete: core.lists_complete,
    };
    let tracker = Tracker {
        config,
        mode,
        clock: Clock::default(),
        outbox,
        kube,
        inbound: Inbound { lifecycles: core.lifecycles, work: core.work },
        nrp: Nrp { diff: core.diff, sync: core.nrp },
        egress: EgressSide { identities, outbound, finalizers, torn_down },
        budgets: Budgets { shapes, buckets, pace },
        startup: Startup { arm, reconciled: core.reconciled },
        figures,
    };
    check::check(&tracker).map_err(corrupt)?;
    tracker.egress.identities.check().map_err(corrupt)?;
    tracker.egress.outbound.check().map_err(corrupt)?;
    tracker.egress.torn_down.check().map_err(corrupt)?;
    tracker.figures.check().map_err(corrupt)?;
    Ok(tracker)
}

/// The payload `tracker` would have had under an older `version` (1 to 9), for the tests of
/// older payloads: the parts that version has, its NRP bookkeeping in its shape (versions 1 and 2
/// hold at most one batch in flight and no per-location backoff; a state holding more has no
/// such form, and this panics).
#[cfg(test)]
pub(super) fn export_older(tracker: &Tracker, version: u32) -> Vec<u8> {
    use serde::Serialize;
    fn bytes(value: &impl Serialize) -> Vec<u8> {
        postcard::to_allocvec(value).expect("plain data")
    }
    let (egress, budgets, arm) = (&tracker.egress, &tracker.budgets, &tracker.startup.arm);
    let (identities, outbound, finalizers) = (&egress.identities, &egress.outbound, &egress.finalizers);
    let old = || CoreRef::with_nrp(tracker, NrpSyncV2::downgrade(&tracker.nrp.sync));
    let core = CoreRef::of(tracker);
    match version {
        1 => bytes(&old()),
        2 => bytes(&(old(), identities)),
        3 => bytes(&(core, identities)),
        4 => bytes(&(core, identities, arm)),
        5 => bytes(&(core, identities, arm, &budgets.buckets)),
        6 => bytes(&(core, identities, arm, &budgets.buckets, outbound)),
        7 => bytes(&(core, identities, arm, &budgets.buckets, outbound, finalizers)),
        8 => bytes(&(core, identities, arm, &budgets.buckets, outbound, finalizers, &budgets.pace)),
        9 => bytes(&(core, identities, arm, &budgets.buckets, outbound, finalizers, &budgets.pace, &tracker.figures)),
        _ => panic!("no older version {version}"),
    }
}
