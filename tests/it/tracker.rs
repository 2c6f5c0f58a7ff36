//! The tracker through the component behaves exactly as the library: the same observations
//! give the same commands and the same exported state, byte for byte.

use clb_guest::tracker::Tracker;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_tests::*;

fn observations() -> Vec<wit::Observation> {
    let mut went_cluster = read_service("etp-local.yaml");
    went_cluster.external_traffic_policy = Some("Cluster".into());
    vec![
        wit::Observation::NodeUpserted(wit::Node {
            name: "aks-node-1".into(),
            internal_ips: vec!["10.224.0.4".into()],
        }),
        wit::Observation::ServiceUpserted(read_service("etp-local.yaml")),
        wit::Observation::ServiceUpserted(read_service("etp-cluster.yaml")),
        wit::Observation::ServiceUpserted(read_service("internal-lb.yaml")),
        wit::Observation::ServiceUpserted(went_cluster),
        wit::Observation::ServiceDeleted(("shop".into(), "internal-lb".into())),
        wit::Observation::NodeDeleted("aks-node-1".into()),
    ]
}

/// A command stream as comparable text.
fn describe(step: &wit::Step) -> Vec<String> {
    step.commands
        .iter()
        .map(|issued| match &issued.command {
            wit::Command::EmitEvent(e) => format!(
                "{} event {:?} {} {}/{}: {}",
                issued.id, e.event_type, e.reason, e.regarding.namespace, e.regarding.name, e.message
            ),
            other => format!("{} {other:?}", issued.id),
        })
        .collect()
}

#[test]
fn the_same_observations_give_the_same_commands_and_state_natively_and_through_the_component() {
    let config = read_config("clb.yaml");
    let mut native = Tracker::create(config_to_model(&config)).unwrap();
    let mut session = builtin().session().unwrap();
    let tracker = session.tracker_create(&config).unwrap().unwrap();
    let (mut native_stream, mut component_stream) = (Vec::new(), Vec::new());
    for (now, observation) in observations().into_iter().enumerate() {
        let now = now as u64 * 1000;
        native_stream.extend(describe(&step_to_wit(native.observe(now, vec![observation_to_model(&observation)]))));
        component_stream.extend(describe(&session.tracker_observe(tracker, now, &[observation]).unwrap()));
    }
    assert_eq!(native_stream, component_stream);
    // Two rejections and one Service that went from admitted to rejected.
    let events: Vec<&String> = native_stream.iter().filter(|c| c.contains(" event ")).collect();
    assert_eq!(events.len(), 3, "{native_stream:#?}");
    assert!(events[2].contains("keeps its last admitted configuration"), "{}", events[2]);
    let (version, payload) = native.export_state();
    let exported = session.tracker_export(tracker).unwrap();
    assert_eq!((exported.version, &exported.payload), (version, &payload), "state bytes differ");
}

#[test]
fn state_exported_by_the_component_imports_back_to_the_same_state() {
    let config = read_config("clb.yaml");
    let mut session = builtin().session().unwrap();
    let tracker = session.tracker_create(&config).unwrap().unwrap();
    session.tracker_observe(tracker, 0, &observations()).unwrap();
    let first = session.tracker_export(tracker).unwrap();
    let imported = session.tracker_import(&config, &first).unwrap().unwrap();
    let second = session.tracker_export(imported).unwrap();
    assert_eq!(first, second);
    // An unchanged rejection seen again after the import is not reported twice.
    let mut still_cluster = read_service("etp-local.yaml");
    still_cluster.external_traffic_policy = Some("Cluster".into());
    let step = session.tracker_observe(imported, 10, &[wit::Observation::ServiceUpserted(still_cluster)]).unwrap();
    assert!(step.commands.iter().all(|c| !matches!(c.command, wit::Command::EmitEvent(_))), "{:?}", step.commands);
}

#[test]
fn the_component_refuses_state_of_a_newer_version_and_corrupt_state() {
    let config = read_config("clb.yaml");
    let mut session = builtin().session().unwrap();
    let newer = wit::VersionedState { version: 99, payload: vec![] };
    assert_eq!(session.tracker_import(&config, &newer).unwrap().err(), Some(wit::StateError::UnsupportedVersion(99)));
    let corrupt = wit::VersionedState { version: 1, payload: vec![0xff, 0xff, 0xff] };
    assert!(matches!(session.tracker_import(&config, &corrupt).unwrap(), Err(wit::StateError::Corrupt(_))));
}

#[test]
fn the_tracker_refuses_a_configuration_that_validation_refuses() {
    let mut session = builtin().session().unwrap();
    let refused = session.tracker_create(&read_config("pod-ip-on-standard.yaml")).unwrap();
    assert_eq!(refused.err().map(|e| e.reason), Some("PodIPRequiresStandardV2".to_owned()));
}
