//! What the integration tests and the benchmarks share: one runtime per process, the built-in
//! and hostile guests, fixture paths, and the WIT → logic conversion of the differential runs.

use clb_guest::model;
use clb_host::sandbox::bindings::clb::reconciler::types as wit;
use clb_host::sandbox::bindings::exports::clb::reconciler::validation as wit_validation;
use clb_host::sandbox::{Limits, Logic, Runtime};
use std::path::PathBuf;
use std::sync::OnceLock;

pub const HOSTILE_GUEST: &[u8] = include_bytes!(env!("CLB_HOSTILE_GUEST"));

/// One engine per process, as in production.
pub fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| Runtime::new().expect("the engine starts"))
}

/// The built-in logic, compiled once.
pub fn builtin() -> &'static Logic {
    static LOGIC: OnceLock<Logic> = OnceLock::new();
    LOGIC.get_or_init(|| runtime().load(clb_host::BUILTIN_GUEST, Limits::default()).expect("the built-in guest loads"))
}

pub fn fixture(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(relative)
}

pub fn read_service(file: &str) -> wit::Service {
    let path = fixture(&format!("services/{file}"));
    let services = clb_host::inputs::read_manifests::<k8s_openapi::api::core::v1::Service>(&path)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(services.len(), 1, "{file} holds one Service");
    clb_host::records::service(&services[0])
}

pub fn read_config(file: &str) -> wit::Config {
    clb_host::inputs::read_config(&fixture(&format!("configs/{file}"))).unwrap_or_else(|e| panic!("{e}"))
}

// The conversion below is the guest adapter's, seen from the host's generated types: the
// differential tests feed the same record to the library and to the component.

pub fn config_to_model(c: &wit::Config) -> clb_guest::Config {
    clb_guest::Config {
        backend_pool_type: c.backend_pool_type.clone(),
        load_balancer_sku: c.load_balancer_sku.clone(),
        multiple_standard_load_balancers: c.multiple_standard_load_balancers.clone(),
    }
}

pub fn service_to_model(s: &wit::Service) -> model::Service {
    model::Service {
        uid: s.uid.clone(),
        namespace: s.namespace.clone(),
        name: s.name.clone(),
        service_type: s.service_type.clone(),
        external_traffic_policy: s.external_traffic_policy.clone(),
        session_affinity: s.session_affinity.clone(),
        load_balancer_ip: s.load_balancer_ip.clone(),
        load_balancer_class: s.load_balancer_class.clone(),
        ip_families: s.ip_families.clone(),
        ports: s
            .ports
            .iter()
            .map(|p| model::ServicePort {
                name: p.name.clone(),
                protocol: p.protocol.clone(),
                port: p.port,
                target_port: p.target_port.as_ref().map(|t| match t {
                    wit::TargetPort::Number(n) => model::TargetPort::Number(*n),
                    wit::TargetPort::Name(n) => model::TargetPort::Name(n.clone()),
                }),
                node_port: p.node_port,
            })
            .collect(),
        annotations: s.annotations.clone(),
        finalizers: s.finalizers.clone(),
        deleting: s.deleting,
        ingress_ips: s.ingress_ips.clone(),
    }
}

/// A verdict as comparable text: `kind` or `rejected:Reason:message`.
pub fn native_verdict(v: &clb_guest::Verdict) -> String {
    match v {
        clb_guest::Verdict::Admitted => "admitted".into(),
        clb_guest::Verdict::NothingToProvision => "nothing-to-provision".into(),
        clb_guest::Verdict::Cleanup => "cleanup".into(),
        clb_guest::Verdict::Ignored(why) => format!("ignored:{why}"),
        clb_guest::Verdict::Rejected(r) => format!("rejected:{}:{}", r.reason, r.message),
    }
}

pub fn component_verdict(v: &wit_validation::Verdict) -> String {
    match v {
        wit_validation::Verdict::Admitted => "admitted".into(),
        wit_validation::Verdict::NothingToProvision => "nothing-to-provision".into(),
        wit_validation::Verdict::Cleanup => "cleanup".into(),
        wit_validation::Verdict::Ignored(why) => format!("ignored:{why}"),
        wit_validation::Verdict::Rejected(r) => format!("rejected:{}:{}", r.reason, r.message),
    }
}
