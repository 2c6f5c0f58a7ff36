//! The host's edges: what comes in from Kubernetes (`records`), from a user's file
//! (`scenario`), and from the guest (`commands`).

use crate::input::Dec;
use clb_emulator::Emulator;
use clb_executor::records;
use clb_executor::{self as executor, Executor};
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::native::observation_to_model;
use clb_simulator::cluster::{Cluster, Object};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// `records`: the first byte picks the kind, the rest is JSON. Only what serde_json reads as a
/// valid k8s-openapi object reaches `records.rs`, which must copy it without panicking; the
/// copy must be the field copy it claims (a few fields checked), and the record must pass
/// through the logic (admission, a tracker in CLB mode) without a panic.
pub fn records(data: &[u8]) {
    let Some((&kind, json)) = data.split_first() else { return };
    let observation = match kind % 4 {
        0 => {
            let Ok(svc) = serde_json::from_slice::<Service>(json) else { return };
            let record = records::service(&svc);
            assert_eq!(record.uid, svc.metadata.uid.clone().unwrap_or_default(), "the UID is copied");
            assert_eq!(record.deleting, svc.metadata.deletion_timestamp.is_some());
            assert!(record.annotations.windows(2).all(|w| w[0] <= w[1]), "annotations come sorted");
            assert_eq!(
                record.ports.len(),
                svc.spec.as_ref().and_then(|s| s.ports.as_ref()).map_or(0, Vec::len),
                "every port is copied"
            );
            wit::Observation::ServiceUpserted(record)
        }
        1 => {
            let Ok(slice) = serde_json::from_slice::<EndpointSlice>(json) else { return };
            let record = records::endpoint_slice(&slice);
            assert_eq!(record.endpoints.len(), slice.endpoints.len(), "every endpoint is copied");
            wit::Observation::SliceUpserted(record)
        }
        2 => {
            let Ok(node) = serde_json::from_slice::<Node>(json) else { return };
            wit::Observation::NodeUpserted(records::node(&node))
        }
        _ => {
            let Ok(pod) = serde_json::from_slice::<Pod>(json) else { return };
            let _ = records::has_egress_label(&pod);
            wit::Observation::PodUpserted(records::pod(&pod))
        }
    };
    let config = clb_guest::Config {
        backend_pool_type: "podIP".into(),
        load_balancer_sku: "standardV2".into(),
        ..clb_guest::Config::default()
    };
    let observation = observation_to_model(&observation);
    if let clb_guest::model::Observation::ServiceUpserted(s) = &observation {
        assert_eq!(clb_guest::admit_service(&config, s), clb_guest::admit_service(&config, s));
    }
    let mut tracker = clb_guest::tracker::Tracker::create(config).expect("CLB mode");
    let _ = tracker.observe(0, vec![observation, clb_guest::model::Observation::ListsComplete]);
}

/// `scenario`: any text through the scenario parser: a scenario or an error, never a panic.
pub fn scenario(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(scenario) = clb_simulator::scenario::parse(std::path::Path::new("fuzz.yaml"), &text) {
        for step in &scenario.steps {
            let _ = step.summary();
        }
    }
}

/// A Service for the commands to name: `default/web` with the first fuzz UID.
fn web() -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default", "uid": crate::input::UIDS[0]},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": [{"port": 80}]}
    }))
    .expect("a Service")
}

/// `commands`: up to 16 commands as a hostile guest would emit them, through the executor
/// against the in-process emulator and cluster. A command the executor's checks refuse is
/// answered `InvalidCommand` with status 0 and reaches neither Azure nor Kubernetes; one they
/// pass is carried out, and its answer is never `InvalidCommand`. Never a panic.
pub fn commands(data: &[u8]) {
    let mut d = Dec::new(data);
    let emulator = Emulator::new(clb_emulator::scope());
    let cluster = Cluster::new();
    cluster.apply(Object::Service(Box::new(web()))).expect("an empty cluster takes a Service");
    let executor = Executor::new(&emulator, &cluster);
    let count = d.len(16);
    for _ in 0..count {
        if d.is_empty() {
            break;
        }
        let command = d.command();
        let checked = executor::check(&command);
        let before = (emulator.state().requests, cluster.events().len(), cluster.services());
        let outcome = futures::executor::block_on(executor.execute(&command));
        let refused =
            matches!(&outcome, wit::Outcome::Failed(f) if f.code.as_deref() == Some(executor::INVALID_COMMAND));
        match checked {
            Err(why) => {
                assert!(refused, "{command:?} failed the checks ({why}) but was answered {outcome:?}");
                assert!(matches!(&outcome, wit::Outcome::Failed(f) if f.status == 0));
                let after = (emulator.state().requests, cluster.events().len(), cluster.services());
                assert!(before == after, "a refused command reached Azure or Kubernetes: {command:?}");
            }
            Ok(()) => assert!(!refused, "{command:?} passed the checks but was refused: {outcome:?}"),
        }
    }
}
