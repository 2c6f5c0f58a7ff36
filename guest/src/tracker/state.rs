//! The state format: what `export_state` writes ([`STATE_VERSION`]), how each older version is
//! read, and what an import checks before it trusts a payload ([`State::check`]).

use super::*;

/// The schema version `export_state` writes. Bump it on any change to [`State`] and teach
/// `import_state` to read the old one. Version 2 added the egress side ([`Egress`]) after the
/// version-1 payload; a version-1 state imports with no egress pods. Version 3 keeps several
/// address-location batches in flight and per-location backoff ([`NrpSync`]); a version 1 or 2
/// state's one batch in flight carries over. Version 4 adds the start-up inventory of ARM
/// ([`ArmSync`]) after the version-3 payload; an older state imports with it settled (nothing
/// left to adopt). Version 5 adds the write budgets' buckets ([`Buckets`]) after the version-4
/// payload; an older state imports with full buckets. Version 6 adds the outbound lifecycles
/// ([`Outbound`]) after the version-5 payload; an older state imports with none (its egress
/// identities are somebody else's, as they were to it). Version 7 adds the egress pod
/// finalizers ([`PodFinalizers`]) after the version-6 payload; an older state imports with no
/// pod held (the host's next list or a pod's next update reads each pod's finalizer).
pub const STATE_VERSION: u32 = 7;

/// Why state could not be imported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateError {
    UnsupportedVersion(u32),
    Corrupt(String),
    InvalidConfig(ConfigError),
}

/// [`NrpSync`] as state versions 1 and 2 have it: at most one batch in flight, one backoff.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
pub(super) struct NrpSyncV2 {
    pub(super) loaded: bool,
    pub(super) read_in_flight: bool,
    pub(super) read_retries: u32,
    pub(super) next_read_ms: u64,
    pub(super) batch_in_flight: Option<u64>,
    pub(super) batch_retries: u32,
    pub(super) batch_not_before_ms: u64,
    pub(super) batch_limit: usize,
    #[serde(deserialize_with = "crate::name::btree_map")]
    pub(super) quarantined: BTreeMap<String, NrpLocation>,
    pub(super) service_writes_in_flight: u32,
    #[serde(deserialize_with = "crate::name::btree_set")]
    pub(super) foreign: BTreeSet<String>,
}

impl NrpSyncV2 {
    /// The batch in flight keeps its place (issued at time 0: slow, so another may go beside
    /// it); its one backoff, which held every location, still does (as a throttle).
    pub(super) fn upgrade(self) -> NrpSync {
        NrpSync {
            loaded: self.loaded,
            read_in_flight: self.read_in_flight,
            read_retries: self.read_retries,
            next_read_ms: self.next_read_ms,
            batches_in_flight: self.batch_in_flight.map(|id| (id, 0)).into_iter().collect(),
            batch_retries: self.batch_retries,
            batch_not_before_ms: self.batch_not_before_ms,
            batch_limit: self.batch_limit,
            quarantined: self.quarantined,
            location_backoff: BTreeMap::new(),
            service_writes_in_flight: self.service_writes_in_flight,
            foreign: self.foreign,
        }
    }
}

/// `N`: the NRP bookkeeping of the state version read ([`NrpSyncV2`] for versions 1 and 2).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct State<N = NrpSync> {
    pub(super) next_command_id: u64,
    #[serde(deserialize_with = "crate::name::btree_map")]
    pub(super) services: BTreeMap<ObjectKey, ServiceRecord>,
    #[serde(deserialize_with = "crate::name::btree_map")]
    pub(super) service_by_identity: BTreeMap<String, ObjectKey>,
    #[serde(deserialize_with = "crate::name::btree_map")]
    pub(super) slices: BTreeMap<ObjectKey, SliceRecord>,
    #[serde(deserialize_with = "crate::name::btree_map")]
    pub(super) slices_by_owner: BTreeMap<Name, VecSet<ObjectKey>>,
    #[serde(deserialize_with = "crate::name::btree_map")]
    pub(super) slices_by_node: BTreeMap<Name, VecSet<ObjectKey>>,
    /// Node name → its locations per family (computed once per Node change, not per endpoint).
    #[serde(deserialize_with = "crate::name::btree_map")]
    pub(super) nodes: BTreeMap<String, NodeLocations>,
    pub(super) diff: DiffTracker,
    #[serde(deserialize_with = "crate::name::btree_map")]
    pub(super) lifecycles: BTreeMap<String, Lifecycle>,
    #[serde(deserialize_with = "crate::name::btree_map")]
    pub(super) in_flight: BTreeMap<u64, InFlight>,
    pub(super) service_commands_in_flight: usize,
    pub(super) work: WorkSets<String>,
    pub(super) nrp: N,
    pub(super) lists_complete: bool,
    /// Start-up reconciliation against NRP has run.
    pub(super) reconciled: bool,
}

impl Tracker {
    /// A tracker as [`Self::create`], but with its start-up inventory of ARM settled and empty,
    /// as a state from before version 4 imports: for the tests of everything but start-up
    /// adoption, which then see the commands they saw before the inventory existed.
    #[cfg(test)]
    pub(crate) fn create_with_arm_settled(config: Config) -> Result<Self, ConfigError> {
        Ok(Self { arm: ArmSync::settled(), ..Self::create(config)? })
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
        postcard::to_allocvec(&(&self.state, &self.egress, &self.arm, &self.budget, &self.outbound)).expect("plain data")
    }

    /// This tracker's current payload with `state` in place of its own, for tests of states that
    /// must be refused.
    #[cfg(test)]
    pub(super) fn payload_with(&self, state: &State) -> Vec<u8> {
        postcard::to_allocvec(&(state, &self.egress, &self.arm, &self.budget, &self.outbound, &self.pods))
            .expect("plain data")
    }

    // ---- State ----

    /// The whole state: `(version, payload)`. Version 2 is the version-1 payload followed by
    /// the egress side (postcard encodes a pair as one after the other).
    pub fn export_state(&self) -> (u32, Vec<u8>) {
        let payload =
            postcard::to_allocvec(&(&self.state, &self.egress, &self.arm, &self.budget, &self.outbound, &self.pods))
            .expect("the state is plain data and always encodes");
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
        let (state, egress, arm, budget, outbound, pods) = match version {
            // Before egress: no pods.
            1 => {
                let state = decode_exact::<State<NrpSyncV2>>(payload).map_err(corrupt)?.upgrade();
                (state, Egress::default(), ArmSync::settled(), full, none, no_pods())
            }
            2 => {
                let (state, egress) = decode_exact::<(State<NrpSyncV2>, Egress)>(payload).map_err(corrupt)?;
                (state.upgrade(), egress, ArmSync::settled(), full, none, no_pods())
            }
            3 => {
                let (state, egress) = decode_exact::<(State, Egress)>(payload).map_err(corrupt)?;
                (state, egress, ArmSync::settled(), full, none, no_pods())
            }
            4 => {
                let (state, egress, arm) = decode_exact::<(State, Egress, ArmSync)>(payload).map_err(corrupt)?;
                (state, egress, arm, full, none, no_pods())
            }
            5 => {
                let (state, egress, arm, budget) =
                    decode_exact::<(State, Egress, ArmSync, Buckets)>(payload).map_err(corrupt)?;
                (state, egress, arm, budget, none, no_pods())
            }
            6 => {
                let (state, egress, arm, budget, outbound) =
                    decode_exact::<(State, Egress, ArmSync, Buckets, Outbound)>(payload).map_err(corrupt)?;
                (state, egress, arm, budget, outbound, no_pods())
            }
            STATE_VERSION => {
                decode_exact::<(State, Egress, ArmSync, Buckets, Outbound, PodFinalizers)>(payload).map_err(corrupt)?
            }
            other => return Err(StateError::UnsupportedVersion(other)),
        };
        state.check(&arm, &outbound, &pods).map_err(corrupt)?;
        egress.check().map_err(corrupt)?;
        outbound.check().map_err(corrupt)?;
        Ok(Self { config, mode, state, egress, arm, budget, outbound, pods, clock: Clock::default() })
    }
}

/// The largest next command id an imported state may hold (see [`State::check`]).
pub(super) const MAX_NEXT_COMMAND_ID: u64 = 1 << 63;

/// One postcard value that is the whole of `payload`.
pub(super) fn decode_exact<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, String> {
    let (value, rest) = postcard::take_from_bytes::<T>(payload).map_err(|e| e.to_string())?;
    if !rest.is_empty() {
        return Err(format!("{} byte(s) after the payload", rest.len()));
    }
    Ok(value)
}

impl State<NrpSyncV2> {
    pub(super) fn upgrade(self) -> State {
        self.map_nrp(NrpSyncV2::upgrade)
    }
}

impl<N> State<N> {
    pub(super) fn map_nrp<M>(self, f: impl FnOnce(N) -> M) -> State<M> {
        State {
            next_command_id: self.next_command_id,
            services: self.services,
            service_by_identity: self.service_by_identity,
            slices: self.slices,
            slices_by_owner: self.slices_by_owner,
            slices_by_node: self.slices_by_node,
            nodes: self.nodes,
            diff: self.diff,
            lifecycles: self.lifecycles,
            in_flight: self.in_flight,
            service_commands_in_flight: self.service_commands_in_flight,
            work: self.work,
            nrp: f(self.nrp),
            lists_complete: self.lists_complete,
            reconciled: self.reconciled,
        }
    }
}

impl State {
    /// Whether an identity is an inbound Service's (a lifecycle, or a Service observed): one key
    /// space with egress identities (upstream §i.2.7).
    pub(super) fn is_inbound(&self, identity: &str) -> bool {
        self.lifecycles.contains_key(identity) || self.service_by_identity.contains_key(identity)
    }

    /// What an import cannot take on trust, checked cheaply (a pass over the commands in flight
    /// and one over the lifecycles): the counters of commands in flight, which `complete`
    /// decrements, against the commands themselves; each Service command against the lifecycle
    /// that waits for it (and no lifecycle waiting for a command that is not in flight: it would
    /// never run again); the one read and the batches in flight against their flags (at most [`MAX_BATCHES_IN_FLIGHT`], no location in two); and every
    /// id in flight below the next id (a new command would take it); and every lifecycle with work
    /// left in a work set (a pass over the timers and one over the lifecycles): the tracker only
    /// ever looks at those sets for work, so a lifecycle outside them would never run again. The
    /// DiffTracker's own counts are not re-derived: that would cost a pass over every address.
    pub(super) fn check(&self, arm: &ArmSync, outbound: &Outbound, pods: &PodFinalizers) -> Result<(), String> {
        // One id per command, counting up: no real state comes near the end of u64, and
        // refusing the upper half keeps `issue` from ever overflowing.
        if self.next_command_id > MAX_NEXT_COMMAND_ID {
            return Err(format!("the next command id {} is past {MAX_NEXT_COMMAND_ID}", self.next_command_id));
        }
        let (mut service_commands, mut nrp_writes, mut reads, mut arm_reads, mut batches) =
            (0usize, 0u32, 0usize, 0usize, Vec::new());
        let mut pod_commands = BTreeMap::new();
        for (&id, what) in &self.in_flight {
            if id >= self.next_command_id {
                return Err(format!("command {id} is in flight, but the next command id is {}", self.next_command_id));
            }
            match what {
                InFlight::Service { identity, step } => {
                    service_commands += 1;
                    nrp_writes += u32::from(step.writes_nrp());
                    if self.lifecycles.get(identity).and_then(|l| l.attempt.in_flight) != Some((id, *step)) {
                        return Err(format!(
                            "command {id} ({step:?}) is in flight for {identity}, whose lifecycle does not wait for it"
                        ));
                    }
                }
                InFlight::Outbound { identity, step } => {
                    service_commands += 1;
                    nrp_writes += u32::from(step.writes_nrp());
                    if outbound.lifecycles.get(identity).and_then(|l| l.attempt.in_flight) != Some((id, *step)) {
                        return Err(format!(
                            "command {id} ({step:?}) is in flight for egress identity {identity}, whose outbound \
                             lifecycle does not wait for it"
                        ));
                    }
                }
                InFlight::PodFinalizer { key, .. } => {
                    pod_commands.insert(id, key);
                }
                InFlight::Locations(_) => batches.push(id),
                InFlight::ReadNrp => reads += 1,
                InFlight::ReadArm => arm_reads += 1,
                InFlight::Event => {}
            }
        }
        pods.check(&pod_commands)?;
        let waiting = self.lifecycles.values().filter(|l| l.attempt.in_flight.is_some()).count()
            + outbound.lifecycles.values().filter(|l| l.attempt.in_flight.is_some()).count();
        let counts = [
            ("Service commands counted", self.service_commands_in_flight, "Service commands", service_commands),
            ("lifecycles wait for a command", waiting, "Service commands", service_commands),
            ("NRP writes counted", self.nrp.service_writes_in_flight as usize, "NRP writes", nrp_writes as usize),
            ("reads of NRP flagged", usize::from(self.nrp.read_in_flight), "reads of NRP", reads),
            ("reads of ARM flagged", usize::from(arm.read_in_flight), "reads of ARM", arm_reads),
        ];
        if arm.settled && arm.read_in_flight {
            return Err("the ARM inventory is settled, but a read of it is in flight".into());
        }
        if self.reconciled && !arm.settled {
            return Err("start-up reconciliation ran, but the ARM inventory is not settled".into());
        }
        for (what, counted, which, in_flight) in counts {
            if counted != in_flight {
                return Err(format!("{counted} {what} in flight, but {in_flight} {which} are in flight"));
            }
        }
        if !batches.iter().eq(self.nrp.batches_in_flight.keys()) {
            return Err(format!(
                "address-location batches in flight {batches:?}, but the batches counted in flight are {:?}",
                self.nrp.batches_in_flight.keys().collect::<Vec<_>>()
            ));
        }
        if batches.len() > MAX_BATCHES_IN_FLIGHT {
            return Err(format!("{} address-location batches in flight, over {MAX_BATCHES_IN_FLIGHT}", batches.len()));
        }
        // No location in two batches in flight: their answers could arrive in either order.
        let mut locations = BTreeSet::new();
        if let Some(twice) = location_batches(&self.nrp.batches_in_flight, &self.in_flight)
            .flatten()
            .find(|l| !locations.insert(l.location.as_str()))
        {
            return Err(format!("location {:?} is in more than one batch in flight", twice.location));
        }
        // Where the tracker looks for each lifecycle's work: a pending deletion waits in
        // `draining` (and only one does, or the tracker would never be idle), any other work left
        // is in flight, runnable or on a timer.
        self.work.check(&self.lifecycles, "lifecycle")
    }
}
