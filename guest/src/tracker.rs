//! The stateful core: observations and outcomes in, commands out.
//!
//! Today the tracker keeps the Kubernetes side of the world (Services, EndpointSlices, Nodes),
//! decides admission for every Service, remembers the last admitted spec of each, and asks for a
//! Warning Event whenever a Service's rejection changes. The NRP side of the DiffTracker and its
//! commands build on this state.

use crate::admission::{Verdict, admit_service};
use crate::config::{Config, ConfigError, Mode, validate_config};
use crate::model::{
    Command, EndpointSlice, Event, EventType, Issued, Node, ObjectKey, ObjectRef, Observation, Outcome, Service, Step,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The schema version `export_state` writes. Bump it on any change to [`StateV1`] and teach
/// `import_state` to read the old one.
pub const STATE_VERSION: u32 = 1;

/// Why state could not be imported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateError {
    UnsupportedVersion(u32),
    Corrupt(String),
    InvalidConfig(ConfigError),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct ServiceRecord {
    observed: Service,
    /// The spec last admitted; a live Service that becomes invalid keeps it (design §3).
    admitted: Option<Service>,
    verdict: Verdict,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct StateV1 {
    next_command_id: u64,
    services: BTreeMap<ObjectKey, ServiceRecord>,
    slices: BTreeMap<ObjectKey, EndpointSlice>,
    nodes: BTreeMap<String, Node>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracker {
    config: Config,
    mode: Mode,
    state: StateV1,
}

impl Tracker {
    /// A tracker with empty state; refuses a configuration [`validate_config`] refuses.
    pub fn create(config: Config) -> Result<Self, ConfigError> {
        let mode = validate_config(&config)?;
        Ok(Self { config, mode, state: StateV1::default() })
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The verdict last reached for a Service, if the tracker has seen it.
    pub fn verdict(&self, namespace: &str, name: &str) -> Option<&Verdict> {
        self.state.services.get(&ObjectKey::new(namespace, name)).map(|r| &r.verdict)
    }

    /// The spec the tracker provisions a Service with: the last one admitted.
    pub fn admitted_spec(&self, namespace: &str, name: &str) -> Option<&Service> {
        self.state.services.get(&ObjectKey::new(namespace, name)).and_then(|r| r.admitted.as_ref())
    }

    pub fn observe(&mut self, _now_ms: u64, batch: Vec<Observation>) -> Step {
        let mut step = Step::default();
        for observation in batch {
            match observation {
                Observation::ServiceUpserted(service) => self.upsert_service(service, &mut step),
                Observation::ServiceDeleted(key) => {
                    self.state.services.remove(&key);
                }
                Observation::SliceUpserted(slice) => {
                    self.state.slices.insert(slice.key(), slice);
                }
                Observation::SliceDeleted(key) => {
                    self.state.slices.remove(&key);
                }
                Observation::NodeUpserted(node) => {
                    self.state.nodes.insert(node.name.clone(), node);
                }
                Observation::NodeDeleted(name) => {
                    self.state.nodes.remove(&name);
                }
                Observation::ListsComplete => {}
            }
        }
        step
    }

    /// Outcomes of Event commands need no follow-up: Events are best effort, and a lost one is
    /// emitted again when the Service's verdict next changes.
    pub fn complete(&mut self, _now_ms: u64, _results: Vec<(u64, Outcome)>) -> Step {
        Step::default()
    }

    pub fn tick(&mut self, _now_ms: u64) -> Step {
        Step::default()
    }

    fn upsert_service(&mut self, service: Service, step: &mut Step) {
        let verdict = admit_service(&self.config, &service);
        let key = service.key();
        let previous = self.state.services.remove(&key);
        let same_object = previous.as_ref().is_some_and(|p| p.observed.uid == service.uid);
        let previous_admitted = previous.as_ref().filter(|_| same_object).and_then(|p| p.admitted.clone());
        let verdict_changed = !same_object || previous.as_ref().is_some_and(|p| p.verdict != verdict);
        let admitted = match &verdict {
            Verdict::Admitted | Verdict::NothingToProvision => Some(service.clone()),
            _ => previous_admitted,
        };
        if let (Verdict::Rejected(rejection), true) = (&verdict, verdict_changed) {
            let kept = if admitted.is_some() { "; it keeps its last admitted configuration" } else { "" };
            let event = Event {
                regarding: ObjectRef {
                    kind: "Service".into(),
                    namespace: service.namespace.clone(),
                    name: service.name.clone(),
                    uid: service.uid.clone(),
                },
                event_type: EventType::Warning,
                reason: rejection.reason.clone(),
                message: format!("{}{kept}", rejection.message),
            };
            self.issue(Command::EmitEvent(event), step);
        }
        self.state.services.insert(key, ServiceRecord { observed: service, admitted, verdict });
    }

    fn issue(&mut self, command: Command, step: &mut Step) {
        let id = self.state.next_command_id;
        self.state.next_command_id += 1;
        step.commands.push(Issued { id, command });
    }

    /// The whole state: `(version, payload)`.
    pub fn export_state(&self) -> (u32, Vec<u8>) {
        let payload = postcard::to_allocvec(&self.state).expect("the state is plain data and always encodes");
        (STATE_VERSION, payload)
    }

    /// A tracker from exported state.
    pub fn import_state(config: Config, version: u32, payload: &[u8]) -> Result<Self, StateError> {
        let mode = validate_config(&config).map_err(StateError::InvalidConfig)?;
        let state = match version {
            STATE_VERSION => postcard::from_bytes::<StateV1>(payload)
                .map_err(|e| StateError::Corrupt(format!("state version {version}: {e}")))?,
            other => return Err(StateError::UnsupportedVersion(other)),
        };
        Ok(Self { config, mode, state })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clb() -> Config {
        Config { backend_pool_type: "podIP".into(), load_balancer_sku: "standardV2".into(), ..Config::default() }
    }

    fn lb_service(etp: &str) -> Service {
        Service {
            uid: "UID-1".into(),
            namespace: "default".into(),
            name: "web".into(),
            service_type: Some("LoadBalancer".into()),
            external_traffic_policy: Some(etp.into()),
            ports: vec![crate::model::ServicePort {
                name: None,
                protocol: Some("TCP".into()),
                port: 80,
                target_port: None,
                node_port: None,
            }],
            ..Service::default()
        }
    }

    #[test]
    fn a_service_that_becomes_invalid_keeps_its_last_admitted_spec_and_gets_one_warning() {
        let mut tracker = Tracker::create(clb()).unwrap();
        assert!(tracker.observe(0, vec![Observation::ServiceUpserted(lb_service("Local"))]).commands.is_empty());
        let step = tracker.observe(1, vec![Observation::ServiceUpserted(lb_service("Cluster"))]);
        assert_eq!(step.commands.len(), 1);
        let Command::EmitEvent(event) = &step.commands[0].command else { panic!("{:?}", step.commands) };
        assert_eq!(event.reason, "UnsupportedExternalTrafficPolicy");
        assert!(event.message.contains("keeps its last admitted configuration"));
        assert_eq!(tracker.admitted_spec("default", "web").unwrap().external_traffic_policy.as_deref(), Some("Local"));
        let again = tracker.observe(2, vec![Observation::ServiceUpserted(lb_service("Cluster"))]);
        assert!(again.commands.is_empty(), "an unchanged rejection is not reported twice");
    }

    #[test]
    fn export_then_import_then_export_is_a_fixed_point() {
        let mut tracker = Tracker::create(clb()).unwrap();
        tracker.observe(
            0,
            vec![
                Observation::ServiceUpserted(lb_service("Cluster")),
                Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.0.0.4".into()] }),
            ],
        );
        let (version, payload) = tracker.export_state();
        let imported = Tracker::import_state(clb(), version, &payload).unwrap();
        assert_eq!(imported, tracker);
        assert_eq!(imported.export_state(), (version, payload));
    }

    #[test]
    fn import_refuses_a_newer_version_and_a_corrupt_payload() {
        assert_eq!(Tracker::import_state(clb(), 99, &[]), Err(StateError::UnsupportedVersion(99)));
        assert!(matches!(Tracker::import_state(clb(), STATE_VERSION, &[0xff; 3]), Err(StateError::Corrupt(_))));
    }
}
