//! Per-Service admission in CLB mode (docs/design.md §3; docs/upstream.md §d.1 and §d.2).
//!
//! The order of the checks is part of the contract: a Service that breaks several rules is
//! reported with the first one, so its Event reason is stable.

use crate::config::{Config, Mode, validate_config};
use crate::model::{Service, TargetPort};
use crate::name::VecSet;
use serde::{Deserialize, Serialize};

pub const ANNOTATION_INTERNAL_LB: &str = "service.beta.kubernetes.io/azure-load-balancer-internal";
pub const ANNOTATION_IDLE_TIMEOUT: &str = "service.beta.kubernetes.io/azure-load-balancer-tcp-idle-timeout";
pub const IDLE_TIMEOUT_MINUTES: std::ops::RangeInclusive<i64> = 4..=30;

/// Event reasons, one per rule. Operators alert on them: never rename one.
pub mod reason {
    pub const UNSUPPORTED_EXTERNAL_TRAFFIC_POLICY: &str = "UnsupportedExternalTrafficPolicy";
    pub const UNSUPPORTED_INTERNAL_LOAD_BALANCER: &str = "UnsupportedInternalLoadBalancer";
    pub const UNSUPPORTED_SESSION_AFFINITY: &str = "UnsupportedSessionAffinity";
    pub const UNSUPPORTED_LOAD_BALANCER_IP: &str = "UnsupportedLoadBalancerIP";
    pub const UNSUPPORTED_DUAL_STACK: &str = "UnsupportedDualStack";
    pub const UNSUPPORTED_IP_FAMILY: &str = "UnsupportedIPFamily";
    pub const INVALID_IDLE_TIMEOUT: &str = "InvalidIdleTimeout";
    pub const UNSUPPORTED_NAMED_TARGET_PORT: &str = "UnsupportedNamedTargetPort";
    pub const UNSUPPORTED_PROTOCOL: &str = "UnsupportedProtocol";
    pub const INVALID_PORT: &str = "InvalidPort";
    pub const UNSUPPORTED_BACKEND_PORT_COLLISION: &str = "UnsupportedBackendPortCollision";
}

/// A Service the logic will not provision, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

/// What the logic does with one Service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    Admitted,
    NothingToProvision,
    Cleanup,
    Ignored(String),
    Rejected(Rejection),
}

fn reject(reason: &str, service: &Service, detail: String) -> Verdict {
    Verdict::Rejected(Rejection {
        reason: reason.to_owned(),
        message: format!("service {}/{}: {detail}", service.namespace, service.name),
    })
}

/// Decides what to do with one Service under a configuration.
///
/// Deletion is never blocked by validation (upstream A blocked cleanup of `Cluster` Services,
/// docs/upstream.md §d.1): a deleting LoadBalancer Service always gets `Cleanup`.
pub fn admit_service(config: &Config, service: &Service) -> Verdict {
    match judged_in_clb_mode(config, service) {
        Err(verdict) => verdict,
        Ok(()) => check_service(service).unwrap_or(Verdict::Admitted),
    }
}

/// Whether the Service's own rules decide it: a LoadBalancer Service of no other class, not
/// being deleted, under a configuration in CLB mode. Otherwise the verdict that ends it there.
fn judged_in_clb_mode(config: &Config, service: &Service) -> Result<(), Verdict> {
    if let Some(class) = service.load_balancer_class.as_deref().filter(|c| !c.is_empty()) {
        return Err(Verdict::Ignored(format!("spec.loadBalancerClass is {class:?}: another controller's Service")));
    }
    let service_type = service.service_type.as_deref().unwrap_or("ClusterIP");
    if service_type != "LoadBalancer" {
        return Err(Verdict::Ignored(format!("spec.type is {service_type}, not LoadBalancer")));
    }
    if service.deleting {
        return Err(Verdict::Cleanup);
    }
    match validate_config(config) {
        Err(err) => Err(Verdict::Rejected(Rejection { reason: err.reason, message: err.message })),
        Ok(Mode::ContainerLoadBalancer) => Ok(()),
        Ok(mode) => {
            Err(Verdict::Ignored(format!("the configuration is in {mode:?} mode, not Container Load Balancer")))
        }
    }
}

/// The cloud provider's Service annotations are those under these prefixes (its per-port ones
/// are `service.beta.kubernetes.io/port_<port>_…`).
const PROVIDER_ANNOTATION_PREFIXES: [&str; 2] =
    ["service.beta.kubernetes.io/azure-", "service.beta.kubernetes.io/port_"];

/// The provider's annotations the Container Load Balancer reads; it reads no other, as
/// upstream's CLB path reads no other (docs/upstream.md §d.2).
const ANNOTATIONS_ACTED_ON: [&str; 2] = [ANNOTATION_INTERNAL_LB, ANNOTATION_IDLE_TIMEOUT];

/// The most warnings one Service gets: the API server keeps a response's warnings small, and a
/// person reads the first few.
pub const MAX_WARNINGS: usize = 10;

/// The soft findings on a Service that do not change its verdict: each provider annotation it
/// carries that the Container Load Balancer does not act on, in the order of the annotations
/// (sorted by key), at most [`MAX_WARNINGS`] (the last then counts the rest). None for a
/// Service not judged in CLB mode (another class, not a LoadBalancer, being deleted, or a
/// configuration not in CLB mode or refused): its author has nothing to change for this logic.
pub fn warnings(config: &Config, service: &Service) -> Vec<String> {
    if judged_in_clb_mode(config, service).is_err() {
        return Vec::new();
    }
    let mut warnings = Vec::new();
    let mut more = 0;
    for (key, _) in &service.annotations {
        let provider = PROVIDER_ANNOTATION_PREFIXES.iter().any(|prefix| key.starts_with(prefix));
        if !provider || ANNOTATIONS_ACTED_ON.contains(&key.as_str()) {
            continue;
        }
        if warnings.len() < MAX_WARNINGS {
            warnings.push(format!("annotation {key} is ignored: the Container Load Balancer does not act on it"));
        } else {
            more += 1;
        }
    }
    if more > 0 {
        // The tenth warning counts itself and the rest.
        warnings[MAX_WARNINGS - 1] = format!(
            "{} more annotations of the cloud provider are ignored: the Container Load Balancer does not act on them",
            more + 1
        );
    }
    warnings
}

/// The per-Service rules of CLB mode, in contract order; `None` means admitted.
fn check_service(svc: &Service) -> Option<Verdict> {
    match svc.external_traffic_policy.as_deref() {
        Some(p) if p.eq_ignore_ascii_case("Local") => {}
        other => {
            let what = match other {
                None | Some("") => "unset (Kubernetes defaults it to Cluster)".to_owned(),
                Some(p) => format!("{p:?}"),
            };
            return Some(reject(
                reason::UNSUPPORTED_EXTERNAL_TRAFFIC_POLICY,
                svc,
                format!("the Container Load Balancer needs spec.externalTrafficPolicy Local, but it is {what}"),
            ));
        }
    }
    if svc.annotation(ANNOTATION_INTERNAL_LB).is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Some(reject(
            reason::UNSUPPORTED_INTERNAL_LOAD_BALANCER,
            svc,
            format!("internal load balancers ({ANNOTATION_INTERNAL_LB}: true) are not supported"),
        ));
    }
    match svc.session_affinity.as_deref() {
        None | Some("") | Some("None") => {}
        Some(other) => {
            return Some(reject(
                reason::UNSUPPORTED_SESSION_AFFINITY,
                svc,
                format!("spec.sessionAffinity {other:?} is not supported; only None is"),
            ));
        }
    }
    if let Some(ip) = svc.load_balancer_ip.as_deref().filter(|ip| !ip.is_empty()) {
        return Some(reject(
            reason::UNSUPPORTED_LOAD_BALANCER_IP,
            svc,
            format!("spec.loadBalancerIP ({ip}) is not supported: the public IP is allocated per Service"),
        ));
    }
    if svc.ports.is_empty() {
        return Some(Verdict::NothingToProvision);
    }
    if svc.ip_families.len() > 1 {
        return Some(reject(
            reason::UNSUPPORTED_DUAL_STACK,
            svc,
            format!("dual-stack Services ({}) are not supported", svc.ip_families.join(", ")),
        ));
    }
    if let Some(family) = svc.ip_families.iter().find(|f| *f != "IPv4" && *f != "IPv6") {
        return Some(reject(
            reason::UNSUPPORTED_IP_FAMILY,
            svc,
            format!("spec.ipFamilies has {family:?}; known families are IPv4 and IPv6"),
        ));
    }
    if let Some(raw) = svc.annotation(ANNOTATION_IDLE_TIMEOUT) {
        let in_range = raw.trim().parse::<i64>().is_ok_and(|m| IDLE_TIMEOUT_MINUTES.contains(&m));
        if !in_range {
            return Some(reject(
                reason::INVALID_IDLE_TIMEOUT,
                svc,
                format!(
                    "{ANNOTATION_IDLE_TIMEOUT} is {raw:?}; it must be a whole number of minutes from {} to {}",
                    IDLE_TIMEOUT_MINUTES.start(),
                    IDLE_TIMEOUT_MINUTES.end()
                ),
            ));
        }
    }
    if let Some((port, name)) = svc.ports.iter().find_map(|p| match &p.target_port {
        Some(TargetPort::Name(name)) => Some((p.port, name)),
        _ => None,
    }) {
        return Some(reject(
            reason::UNSUPPORTED_NAMED_TARGET_PORT,
            svc,
            format!("port {port} has the named targetPort {name:?}; pod IP backends need a number"),
        ));
    }
    if let Some(port) = svc.ports.iter().find(|p| !matches!(p.protocol(), "TCP" | "UDP")) {
        return Some(reject(
            reason::UNSUPPORTED_PROTOCOL,
            svc,
            format!("port {} uses protocol {}; only TCP and UDP are supported", port.port, port.protocol()),
        ));
    }
    for port in &svc.ports {
        // Azure reserves the frontend port 65535; every backend port is valid.
        let backend = port.backend_port().unwrap_or(port.port);
        if !(1..=65534).contains(&port.port) || !(1..=65535).contains(&backend) {
            return Some(reject(
                reason::INVALID_PORT,
                svc,
                format!(
                    "port {} (targetPort {backend}) is out of range: frontend ports are 1-65534, backend ports 1-65535",
                    port.port
                ),
            ));
        }
    }
    let mut backends = VecSet::new();
    for port in &svc.ports {
        let backend = port.backend_port().unwrap_or(port.port);
        if !backends.insert((port.protocol(), backend)) {
            return Some(reject(
                reason::UNSUPPORTED_BACKEND_PORT_COLLISION,
                svc,
                format!(
                    "two ports send {} to backend port {backend}; with floating IP off Azure refuses \
                     rules that share a protocol and backend port",
                    port.protocol()
                ),
            ));
        }
    }
    None
}
