//! What every part of the supervisor shares: an input as the journal keeps it, a running
//! instance of a version and its rebuild from a state and a journal, the supervisor's errors.
//! Below both the supervisor and its shadow, which each rebuild instances from the same state.

use crate::bindings::clb::reconciler::types as wit;
use crate::trace::{Arg, Ended, Recorder, arg};
use crate::{GuestError, LoadError, LoadedLogic, Session};
use std::sync::Arc;
use wasmtime::component::ResourceAny;

/// Why the supervisor could not do what it was asked. The swap variants leave the old version
/// serving, untouched.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("the tracker was called before it was started")]
    NotStarted,
    #[error("the logic refuses the configuration: {reason} ({field}): {message}")]
    ConfigRefused { field: String, reason: String, message: String },
    #[error("{stage}: {source}")]
    Guest {
        stage: &'static str,
        #[source]
        source: GuestError,
    },
    #[error("{stage}: the logic refuses the state of version {version}: {reason}")]
    StateRefused { stage: &'static str, version: u32, reason: String },
    #[error("swap refused: the new component cannot be loaded: {0}")]
    SwapLoad(#[source] LoadError),
    #[error(
        "swap refused: the new version imported state version {imported} but exports version {exported}, so it would lose state"
    )]
    SwapStateRegression { imported: u32, exported: u32 },
    #[error("swap refused: at the self-check tick the new version proposes what the old one does not: {}", destructive.join("; "))]
    SwapSelfCheck { destructive: Vec<String> },
}

impl SupervisorError {
    /// A short label for counters and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            SupervisorError::NotStarted => "not-started",
            SupervisorError::ConfigRefused { .. } => "config-refused",
            SupervisorError::Guest { .. } => "trap",
            SupervisorError::StateRefused { .. } => "state-refused",
            SupervisorError::SwapLoad(_) => "load",
            SupervisorError::SwapStateRegression { .. } => "state-regression",
            SupervisorError::SwapSelfCheck { .. } => "self-check",
        }
    }
}

/// The stage of a failed checkpoint's [`SupervisorError::Guest`].
pub(super) const EXPORT_STAGE: &str = "export-state";

pub(super) fn guest(stage: &'static str) -> impl FnOnce(GuestError) -> SupervisorError {
    move |source| SupervisorError::Guest { stage, source }
}

pub(super) fn state_refused(stage: &'static str, version: u32, error: &wit::StateError) -> SupervisorError {
    let reason = match error {
        wit::StateError::UnsupportedVersion(v) => format!("unsupported state version {v}"),
        wit::StateError::Corrupt(why) => format!("corrupt: {why}"),
        wit::StateError::InvalidConfig(e) => {
            format!("configuration refused: {} ({}): {}", e.reason, e.field, e.message)
        }
    };
    SupervisorError::StateRefused { stage, version, reason }
}

/// One input to the tracker, as the journal keeps it. The payload is shared: the journal is
/// copied whole at a staged swap and for a probation, while inputs wait, and a deep copy of
/// a journal that holds the initial lists was ~7 ms of each such pause on a 30,000-pod cluster.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    Observe {
        now_ms: u64,
        batch: Arc<[wit::Observation]>,
    },
    /// With ARM's remaining-writes figure on the latest answer among `results` that carried one.
    Complete {
        now_ms: u64,
        results: Arc<[(u64, wit::Outcome)]>,
        arm_remaining_writes: Option<u32>,
    },
    Tick {
        now_ms: u64,
    },
}

impl Input {
    /// The time it was given at.
    pub(super) fn now_ms(&self) -> u64 {
        match self {
            Input::Observe { now_ms, .. } | Input::Complete { now_ms, .. } | Input::Tick { now_ms } => *now_ms,
        }
    }

    /// Observations or outcomes it carries (a tick counts as one).
    pub(super) fn items(&self) -> usize {
        match self {
            Input::Observe { batch, .. } => batch.len().max(1),
            Input::Complete { results, .. } => results.len().max(1),
            Input::Tick { .. } => 1,
        }
    }

    /// The same input one observation or outcome at a time.
    pub(super) fn split(&self) -> Vec<Input> {
        match self {
            Input::Observe { now_ms, batch } => {
                batch.iter().map(|o| Input::Observe { now_ms: *now_ms, batch: Arc::from([o.clone()]) }).collect()
            }
            Input::Complete { now_ms, results, arm_remaining_writes } => results
                .iter()
                .map(|r| Input::Complete {
                    now_ms: *now_ms,
                    results: Arc::from([r.clone()]),
                    arm_remaining_writes: *arm_remaining_writes,
                })
                .collect(),
            Input::Tick { .. } => vec![self.clone()],
        }
    }

    /// One line for logs and reports.
    pub fn describe(&self) -> String {
        match self {
            Input::Observe { now_ms, batch } => {
                let what: Vec<String> = batch.iter().map(describe_observation).collect();
                format!("observe at {now_ms}ms: {}", what.join(", "))
            }
            Input::Complete { now_ms, results, .. } => {
                let ids: Vec<String> = results.iter().map(|(id, _)| format!("#{id}")).collect();
                format!("complete at {now_ms}ms: {}", ids.join(", "))
            }
            Input::Tick { now_ms } => format!("tick at {now_ms}ms"),
        }
    }

    /// The objects it observes, by kind and key (`namespace/name`, a Node's name alone).
    pub fn objects(&self) -> Vec<(&'static str, String)> {
        let Input::Observe { batch, .. } = self else { return Vec::new() };
        batch
            .iter()
            .filter_map(observed_object)
            .map(|(kind, ns, name)| (kind, if ns.is_empty() { name.to_owned() } else { format!("{ns}/{name}") }))
            .collect()
    }
}

/// The object an observation is about: its kind (`Service`, `EndpointSlice`, `Node`, `Pod`), its
/// namespace (empty for a Node) and its name; `None` for `lists-complete`.
pub fn observed_object(observation: &wit::Observation) -> Option<(&'static str, &str, &str)> {
    use wit::Observation as O;
    match observation {
        O::ServiceUpserted(s) => Some(("Service", &s.namespace, &s.name)),
        O::ServiceDeleted((ns, name)) => Some(("Service", ns, name)),
        O::SliceUpserted(s) => Some(("EndpointSlice", &s.namespace, &s.name)),
        O::SliceDeleted((ns, name)) => Some(("EndpointSlice", ns, name)),
        O::NodeUpserted(n) => Some(("Node", "", &n.name)),
        O::NodeDeleted(name) => Some(("Node", "", name)),
        O::PodUpserted(p) => Some(("Pod", &p.namespace, &p.name)),
        O::PodDeleted((ns, name)) => Some(("Pod", ns, name)),
        O::ListsComplete => None,
    }
}

/// One observation, for a person: its kind, key and, for a deletion, "deleted".
pub fn describe_observation(observation: &wit::Observation) -> String {
    match observation {
        wit::Observation::ServiceUpserted(s) => format!("Service {}/{}", s.namespace, s.name),
        wit::Observation::ServiceDeleted((ns, name)) => format!("Service {ns}/{name} deleted"),
        wit::Observation::SliceUpserted(s) => format!("EndpointSlice {}/{}", s.namespace, s.name),
        wit::Observation::SliceDeleted((ns, name)) => format!("EndpointSlice {ns}/{name} deleted"),
        wit::Observation::NodeUpserted(n) => format!("Node {}", n.name),
        wit::Observation::NodeDeleted(name) => format!("Node {name} deleted"),
        wit::Observation::PodUpserted(p) => format!("Pod {}/{}", p.namespace, p.name),
        wit::Observation::PodDeleted((ns, name)) => format!("Pod {ns}/{name} deleted"),
        wit::Observation::ListsComplete => "lists-complete".into(),
    }
}

/// Records `input` to the tracker `handle` into `recorder`, as it `ended`.
pub(super) fn record_input(recorder: &Recorder, handle: u64, input: &Input, ended: Ended) {
    let this = Arg::Handle(handle);
    match input {
        Input::Observe { now_ms, batch } => {
            let batch = batch.clone();
            let batch = Arg::Value(Box::new(move || serde_json::to_value(&*batch).expect("serializes")));
            recorder.call("tracker.observe", vec![this, arg(*now_ms), batch], ended);
        }
        Input::Complete { now_ms, results, arm_remaining_writes } => {
            let results = results.clone();
            let results = Arg::Value(Box::new(move || serde_json::to_value(&*results).expect("serializes")));
            recorder.call("tracker.complete", vec![this, arg(*now_ms), results, arg(*arm_remaining_writes)], ended);
        }
        Input::Tick { now_ms } => recorder.call("tracker.tick", vec![this, arg(*now_ms)], ended),
    }
}

pub(super) struct Running {
    pub(super) session: Session,
    pub(super) tracker: ResourceAny,
}

impl Running {
    pub(super) fn call(&mut self, input: &Input) -> Result<wit::Step, GuestError> {
        match input {
            Input::Observe { now_ms, batch } => self.session.tracker_observe(self.tracker, *now_ms, batch),
            Input::Complete { now_ms, results, arm_remaining_writes } => {
                self.session.tracker_complete(self.tracker, *now_ms, results, *arm_remaining_writes)
            }
            Input::Tick { now_ms } => self.session.tracker_tick(self.tracker, *now_ms),
        }
    }

    /// A fresh instance of `logic` holding `state`, with `journal` replayed into it.
    pub(super) fn rebuild(
        logic: &LoadedLogic,
        config: &wit::Config,
        state: &wit::VersionedState,
        journal: &[Input],
    ) -> Result<Self, SupervisorError> {
        let mut session = logic.session().map_err(guest("instantiating"))?;
        let tracker = session
            .tracker_import(config, state)
            .map_err(guest("import-state"))?
            .map_err(|e| state_refused("import-state", state.version, &e))?;
        let mut running = Running { session, tracker };
        for input in journal {
            // What the replay issues was handed out the first time: it is dropped.
            running.call(input).map_err(guest("replaying the journal"))?;
        }
        Ok(running)
    }
}
