//! Every configuration and admission rule of docs/design.md §3 and the warnings beside the
//! verdicts, from the case tables in `tests/fixtures/{configs,admission}.yaml`, run natively and
//! through the component.

use clb_tests::*;
use serde::Deserialize;

#[derive(Deserialize)]
struct ConfigCase {
    case: String,
    file: String,
    mode: Option<String>,
    reason: Option<String>,
    field: Option<String>,
}

#[derive(Deserialize)]
struct AdmissionCase {
    case: String,
    config: String,
    service: String,
    verdict: String,
    reason: Option<String>,
    #[serde(default)]
    warned: Vec<String>,
    #[serde(default)]
    more: usize,
}

fn cases<T: serde::de::DeserializeOwned>(table: &str) -> Vec<T> {
    let path = fixture(table);
    clb_executor::inputs::from_yaml(&path, &std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("{}: empty", path.display()))
}

// Upstream TestRuntimeEnablementAndLoadBalancer (differs: CLB mode comes from podIP and standardV2, there is
// no enable flag).
#[test]
fn every_configuration_case_gets_its_expected_answer_natively_and_through_the_component() {
    let mut session = builtin().session().unwrap();
    let mut failures = Vec::new();
    for case in cases::<ConfigCase>("configs.yaml") {
        let config = read_config(&case.file);
        let native = clb_guest::validate_config(&config_to_model(&config))
            .map(|mode| format!("{mode:?}"))
            .map_err(|e| (e.reason, e.field, e.message));
        let component = session
            .validate_config(&config)
            .unwrap()
            .map(|mode| format!("{:?}", clb_guest_mode_name(mode)))
            .map_err(|e| (e.reason, e.field, e.message));
        let expected_ok = case.mode.clone();
        let holds = match (&native, &expected_ok) {
            (Ok(mode), Some(want)) => mode == want,
            (Err((reason, field, _)), None) => {
                Some(reason) == case.reason.as_ref() && Some(field) == case.field.as_ref()
            }
            _ => false,
        };
        if !holds || native != component {
            failures.push(format!("{}: native {native:?}, component {component:?}", case.case));
        }
    }
    assert!(failures.is_empty(), "failed cases:\n{}", failures.join("\n"));
}

/// The component's mode, spelled as the library spells it.
fn clb_guest_mode_name(mode: clb_sandbox::bindings::clb::reconciler::types::Mode) -> clb_guest::Mode {
    use clb_sandbox::bindings::clb::reconciler::types::Mode;
    match mode {
        Mode::ContainerLoadBalancer => clb_guest::Mode::ContainerLoadBalancer,
        Mode::MultiSlbLocalServices => clb_guest::Mode::MultiSlbLocalServices,
        Mode::Inactive => clb_guest::Mode::Inactive,
    }
}

// Upstream TestExtractInboundConfigFromService_EmptyPorts,
// TestExtractInboundConfigFromService_NamedTargetPort (differs: a named targetPort is refused at admission),
// TestBuildInboundServiceResources_UnsupportedProtocolErrors,
// TestBuildInboundServiceResources_PortOutOfRangeErrors,
// TestBuildInboundServiceResources_IdleTimeoutOutOfRangeErrors, TestBuildInboundServiceResources_IPFamilies,
// TestExtractInboundConfigFromService_NamedTargetPortRecorded,
// TestBuildInboundServiceResources_NamedTargetPortRejected,
// TestBuildInboundServiceResources_DuplicateBackendPortRejected,
// TestBuildInboundServiceResources_SameBackendPortDifferentProtocolAllowed,
// TestAdmitInboundService_AdmitsSupportedService, TestBuildInboundServiceResources_EmptyConfig (differs: a
// Service without ports is admitted with nothing to provision),
// TestProcessK8sServices_ExcludesServicesNotOwnedByServiceGateway and
// TestLoadBalancerEmitsWarningEventForRejectedService.
// Upstream TestValidateInboundConfig: each rejection has its reason and a non-empty message.
// Upstream TestAdmitInboundService_RejectsUnimplementedSpecFields: sessionAffinity ClientIP and loadBalancerIP are
// rejected, an explicit sessionAffinity None is admitted (differs: the "defaults still admitted" control is ETP
// Local, since ETP Cluster is rejected, docs/design.md §3).
// Upstream TestAdmitInboundService_RejectsInternalLoadBalancerCaseInsensitively: the internal annotation
// "true", "TrUe" and "TRUE" are all rejected.
// Upstream TestAdmitInboundService_AdmitsBothExternalTrafficPolicies (differs: ETP Local is admitted, ETP Cluster
// and an unset one are rejected with UnsupportedExternalTrafficPolicy, docs/design.md §3; a deleting Cluster Service is
// still cleaned up).
#[test]
fn every_admission_case_gets_its_expected_verdict_and_warnings_natively_and_through_the_component() {
    let mut session = builtin().session().unwrap();
    let mut failures = Vec::new();
    let mut reasons_seen = std::collections::BTreeSet::new();
    for case in cases::<AdmissionCase>("admission.yaml") {
        let config = read_config(&case.config);
        let service = read_service(&case.service);
        let admission = native_admission(&config_to_model(&config), &service_to_model(&service));
        let component = component_admission(&session.admit_service(&config, &service).unwrap());
        let mut lines = admission.lines();
        let native = lines.next().unwrap_or_default().to_owned();
        let warnings: Vec<&str> = lines.collect();
        let expected = match &case.reason {
            Some(reason) => format!("{}:{reason}:", case.verdict),
            None => case.verdict.clone(),
        };
        // A rejection is read by a person in an Event: the reason alone does not say what to change.
        let holds = if case.reason.is_some() {
            native.starts_with(&expected) && native.trim_end().len() > expected.len()
        } else {
            native == expected || native.starts_with(&format!("{expected}:"))
        };
        // Each warning names its annotation and says it is ignored; the last counts the rest.
        let counted = (case.more > 0).then(|| format!("{} more annotations", case.more));
        let warned = warnings.len() == case.warned.len() + usize::from(counted.is_some())
            && warnings.iter().zip(&case.warned).all(|(w, key)| w.contains(&format!("annotation {key} is ignored")))
            && counted.is_none_or(|counted| warnings.last().is_some_and(|w| w.starts_with(&counted)));
        if !holds || !warned || admission != component {
            failures.push(format!(
                "{}:\n  expected {expected}, warned of {:?} and {} more\n  native    {admission}\n  component {component}",
                case.case, case.warned, case.more
            ));
        }
        if let Some(reason) = case.reason {
            reasons_seen.insert(reason);
        }
    }
    assert!(failures.is_empty(), "failed cases:\n{}", failures.join("\n"));
    // Every Event reason the rules can give is exercised by some case.
    use clb_guest::admission::reason::*;
    for reason in [
        UNSUPPORTED_EXTERNAL_TRAFFIC_POLICY,
        UNSUPPORTED_INTERNAL_LOAD_BALANCER,
        UNSUPPORTED_SESSION_AFFINITY,
        UNSUPPORTED_LOAD_BALANCER_IP,
        UNSUPPORTED_DUAL_STACK,
        UNSUPPORTED_IP_FAMILY,
        INVALID_IDLE_TIMEOUT,
        UNSUPPORTED_NAMED_TARGET_PORT,
        UNSUPPORTED_PROTOCOL,
        INVALID_PORT,
        UNSUPPORTED_BACKEND_PORT_COLLISION,
    ] {
        assert!(reasons_seen.contains(reason), "no admission case covers {reason}");
    }
}

#[test]
fn a_rejection_message_names_the_service_and_what_would_be_accepted() {
    let mut session = builtin().session().unwrap();
    let verdict = session.admit_service(&read_config("clb.yaml"), &read_service("etp-unset.yaml")).unwrap();
    let text = component_admission(&verdict);
    assert!(text.contains("service shop/etp-unset"), "{text}");
    assert!(text.contains("needs spec.externalTrafficPolicy Local"), "{text}");
    assert!(text.contains("defaults it to Cluster"), "{text}");
}
