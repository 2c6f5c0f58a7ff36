//! The load balancer a Service is found on before multi-SLB placement chooses one, as upstream's
//! `getAzureLoadBalancerName` finds it: where the IP the Service pins lives, else where its
//! primary frontend is.
//!
//! A Service pins an IP with `spec.loadBalancerIP`, the `azure-load-balancer-ipv4`/`-ipv6`
//! annotations or the `azure-pip-name`/`-ipv6` annotations. An internal Service's IP lives on
//! the internal load balancer whose frontend has it as its private address. An external
//! Service's IP is a public IP of the resource group, found by address (which must be a public
//! address) or by name, and it lives on the load balancer its `ipConfiguration` names, unless
//! its cluster tag names another cluster. A Service that pins nothing and names no
//! configuration is found on the load balancer of its kind holding a frontend named after it.
//!
//! What placement reads of Azure, [`PlacementFacts`], lives here too: this module is below
//! [`crate::placement`], which chooses. Errors are upstream's words. Pure.

use crate::model::Service;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// Upstream's suffix of an internal load balancer's name.
pub const INTERNAL_SUFFIX: &str = "-internal";

/// Upstream's per-family annotations of a Service's pinned address.
pub const ANNOTATION_IPV4: &str = "service.beta.kubernetes.io/azure-load-balancer-ipv4";
pub const ANNOTATION_IPV6: &str = "service.beta.kubernetes.io/azure-load-balancer-ipv6";
/// Upstream's per-family annotations of a Service's public IP by name.
pub const ANNOTATION_PIP_NAME: &str = "service.beta.kubernetes.io/azure-pip-name";
pub const ANNOTATION_PIP_NAME_IPV6: &str = "service.beta.kubernetes.io/azure-pip-name-ipv6";
/// Upstream's annotation of the resource group a Service's public IPs are in.
pub const ANNOTATION_RESOURCE_GROUP: &str = "service.beta.kubernetes.io/azure-load-balancer-resource-group";
/// The tags naming the cluster a public IP belongs to, the current one first.
const CLUSTER_TAGS: [&str; 2] = ["k8s-azure-cluster-name", "kubernetes-cluster-name"];
/// The part of a frontend IP configuration's ID before the load balancer's name.
const LOAD_BALANCERS: &str = "/providers/microsoft.network/loadbalancers/";

/// A load balancer of the resource group as Azure holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExistingLoadBalancer {
    /// As Azure names it: a configuration's name, with `-internal` for an internal one.
    pub name: String,
    /// The names of its load-balancing rules.
    pub rules: Vec<String>,
    /// The names of its backend pools.
    pub pools: Vec<String>,
    /// Its frontend IP configurations.
    #[serde(default)]
    pub frontends: Vec<Frontend>,
}

/// A frontend IP configuration of a load balancer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frontend {
    pub name: String,
    /// `properties.privateIPAddress`, as Azure spells it (an internal load balancer's).
    pub private_ip: Option<String>,
}

/// A public IP of the resource group, as Azure lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExistingPublicIp {
    pub name: String,
    /// `properties.ipAddress`, as Azure spells it.
    pub address: Option<String>,
    /// `properties.ipConfiguration.id`: the frontend it is attached to.
    pub ip_configuration: Option<String>,
    pub tags: Vec<(String, String)>,
}

/// What placement reads besides the configurations and the Service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementFacts {
    /// The Service's `metadata.labels` (the WIT `service` carries them; the model's does not,
    /// since the tracker keeps none).
    pub service_labels: Vec<(String, String)>,
    /// The labels of the Service's namespace; `None` when the host does not know it.
    pub namespace_labels: Option<Vec<(String, String)>>,
    /// The configuration the host placed the Service on last.
    pub current_load_balancer: Option<String>,
    /// The resource group's load balancers.
    pub load_balancers: Vec<ExistingLoadBalancer>,
    /// The public IPs of `resource_group` (only an external Service pinning an IP reads them).
    #[serde(default)]
    pub public_ips: Vec<ExistingPublicIp>,
    /// The cloud config's resource group.
    #[serde(default)]
    pub resource_group: String,
    /// `loadBalancerName`, else the controller's cluster name: a public IP tagged with another
    /// cluster's name is not this cluster's.
    #[serde(default)]
    pub cluster_name: String,
}

/// A configuration's name and whether it is an internal load balancer's: `-internal` cut.
pub(crate) fn trim_internal(name: &str) -> (&str, bool) {
    let cut = name.len().checked_sub(INTERNAL_SUFFIX.len()).filter(|at| name.is_char_boundary(*at));
    match cut {
        Some(at) if name[at..].eq_ignore_ascii_case(INTERNAL_SUFFIX) => (&name[..at], true),
        _ => (name, false),
    }
}

/// A non-empty annotation, looked up by its exact key (as upstream's map lookups).
fn annotation<'s>(service: &'s Service, key: &str) -> Option<&'s str> {
    service.annotation(key).filter(|v| !v.is_empty())
}

/// The addresses a Service pins (upstream's `getServiceLoadBalancerIPs`): its per-family
/// annotations, else `spec.loadBalancerIP`.
pub fn pinned_ips(service: &Service) -> Vec<&str> {
    let annotated: Vec<&str> =
        [ANNOTATION_IPV4, ANNOTATION_IPV6].iter().filter_map(|k| annotation(service, k)).collect();
    if !annotated.is_empty() {
        return annotated;
    }
    service.load_balancer_ip.as_deref().filter(|ip| !ip.is_empty()).into_iter().collect()
}

/// The public IP names a Service pins (upstream's `getServicePIPNames`), IPv4's first: a
/// dual-stack Service names each family's with its own annotation; a single-stack IPv6 one
/// reads the IPv6 annotation, else the IPv4 one; any other reads the IPv4 one.
pub fn pinned_pip_names(service: &Service) -> Vec<&str> {
    let has = |family: &str| service.ip_families.iter().any(|f| f == family);
    let (v4, v6) = (has("IPv4"), has("IPv6"));
    let v4 = v4 || !v6;
    let name = |ipv6: bool| {
        if service.ip_families.len() == 2 {
            return annotation(service, if ipv6 { ANNOTATION_PIP_NAME_IPV6 } else { ANNOTATION_PIP_NAME });
        }
        if ipv6
            && v6
            && !v4
            && let Some(name) = annotation(service, ANNOTATION_PIP_NAME_IPV6)
        {
            return Some(name);
        }
        if ipv6 && !v6 {
            return None;
        }
        annotation(service, ANNOTATION_PIP_NAME)
    };
    [false, true].into_iter().filter_map(name).collect()
}

/// Whether the Service pins an IP, by address or by name.
pub fn pins_ip(service: &Service) -> bool {
    !pinned_ips(service).is_empty() || !pinned_pip_names(service).is_empty()
}

/// The configuration whose internal load balancer has a frontend with a pinned address as its
/// private address (upstream's `getLoadBalancerNameByPrivateIP`), lower-cased.
pub fn by_private_ip(service: &Service, facts: &PlacementFacts) -> Option<String> {
    let ips = pinned_ips(service);
    facts.load_balancers.iter().filter(|lb| trim_internal(&lb.name).1).find_map(|lb| {
        let holds = |ip: &&str| {
            lb.frontends.iter().any(|f| f.private_ip.as_deref().is_some_and(|p| p.eq_ignore_ascii_case(ip)))
        };
        ips.iter().any(holds).then(|| trim_internal(&lb.name).0.to_ascii_lowercase())
    })
}

/// The load balancer of the Service's kind holding a frontend named after it (upstream's
/// `getLoadBalancerNameByFrontendIPName`, whose prefix is `GetLoadBalancerName`'s), as its
/// configuration's name, lower-cased.
pub fn by_frontend_name(facts: &PlacementFacts, prefix: &str, internal: bool) -> Option<String> {
    let named_after = |lb: &&ExistingLoadBalancer| lb.frontends.iter().any(|f| f.name.starts_with(prefix));
    let of_kind = |lb: &&ExistingLoadBalancer| trim_internal(&lb.name).1 == internal;
    facts
        .load_balancers
        .iter()
        .filter(of_kind)
        .find(named_after)
        .map(|lb| trim_internal(&lb.name).0.to_ascii_lowercase())
}

/// The load balancer the public IP the Service pins is attached to (upstream's
/// `getLoadBalancerNameByPublicIP`): the pinned addresses first, then the names; `None` when
/// none is attached to a load balancer of this cluster. An address that is not a public one, or
/// a public IP not found, is an error in upstream's words.
pub fn by_public_ip(service: &Service, facts: &PlacementFacts) -> Result<Option<String>, String> {
    let failed =
        |reason: String| format!("look up load balancer by public IP for service {:?}: {reason}", service.name);
    let group = match annotation(service, ANNOTATION_RESOURCE_GROUP).map(str::trim).filter(|g| !g.is_empty()) {
        Some(group) if !group.eq_ignore_ascii_case(&facts.resource_group) => {
            return Err(failed(format!(
                "the public IPs of resource group {group} ({ANNOTATION_RESOURCE_GROUP}) are not listed: this controller \
                 lists those of {} only",
                facts.resource_group
            )));
        }
        _ => facts.resource_group.as_str(),
    };
    for ip in pinned_ips(service) {
        if let Err(reason) = public_candidate(service, ip) {
            return Err(failed(format!("find public IP by address {ip:?}: {reason}")));
        }
        let Some(found) = facts.public_ips.iter().find(|p| p.address.as_deref() == Some(ip)) else {
            return Err(failed(format!(
                "find public IP by address {ip:?}: findMatchedPIPByLoadBalancerIP: cannot find public IP with IP address \
                 {ip} in resource group {group}: getExpectedPIPFromListByIPAddress: cannot find public IP with IP address \
                 {ip}"
            )));
        };
        if let Some(lb) = attached_to(found, &facts.cluster_name) {
            return Ok(Some(lb));
        }
    }
    for name in pinned_pip_names(service) {
        let Some(found) = facts.public_ips.iter().find(|p| p.name.eq_ignore_ascii_case(name)) else {
            return Err(failed(format!(
                "find public IP by name {name:?}: findMatchedPIPByName: failed to find PIP {name} in resource group {group}"
            )));
        };
        if let Some(lb) = attached_to(found, &facts.cluster_name) {
            return Ok(Some(lb));
        }
    }
    Ok(None)
}

/// Upstream's `validatePublicIPCandidate`, in `NewExternalServiceLoadBalancerIPError`'s words:
/// an IP, global unicast, not private, not in Azure's reserved `100.64.0.0/10` or
/// `168.63.129.16`.
fn public_candidate(service: &Service, ip: &str) -> Result<(), String> {
    let who = format!("{}/{}", service.namespace, service.name);
    let Ok(address) = ip.parse::<IpAddr>() else {
        return Err(format!("external Service {who:?} has invalid LoadBalancer IP {ip:?}"));
    };
    let public = match address.to_canonical() {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            let reserved = (a == 100 && (64..128).contains(&b)) || v4 == std::net::Ipv4Addr::new(168, 63, 129, 16);
            !(v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_loopback()
                || v4.is_multicast()
                || v4.is_link_local()
                || v4.is_private()
                || reserved)
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            let link_local = first & 0xffc0 == 0xfe80;
            let unique_local = first & 0xfe00 == 0xfc00;
            !(v6.is_unspecified() || v6.is_loopback() || v6.is_multicast() || link_local || unique_local)
        }
    };
    if public {
        Ok(())
    } else {
        Err(format!(
            "external Service {who:?} cannot use non-public LoadBalancer IP {ip:?}; use an internal LoadBalancer \
             annotation or a valid Azure Public IP address"
        ))
    }
}

/// The cluster a public IP's tags name (upstream's `getClusterFromPIPClusterTags`): the current
/// tag's value, else the legacy one's, else empty.
fn cluster_of(tags: &[(String, String)]) -> &str {
    let tag = |key: &str| tags.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    CLUSTER_TAGS.iter().find_map(|key| tag(key)).unwrap_or_default()
}

/// The load balancer a public IP is attached to (upstream's `getLoadBalancerNameFromPIP`), as its
/// `ipConfiguration` ID spells it; `None` when it is attached to nothing, to something that is
/// not a load balancer's frontend, or is tagged as another cluster's.
fn attached_to(ip: &ExistingPublicIp, cluster: &str) -> Option<String> {
    let id = ip.ip_configuration.as_deref()?;
    let tag = cluster_of(&ip.tags);
    if !tag.is_empty() && !tag.eq_ignore_ascii_case(cluster) {
        return None;
    }
    let at = id.to_ascii_lowercase().find(LOAD_BALANCERS)? + LOAD_BALANCERS.len();
    let (name, _) = id.get(at..)?.split_once('/')?;
    (!name.is_empty()).then(|| name.to_owned())
}

// By path, so that it resolves the same where `tests/next-guest` includes this file by path.
#[cfg(test)]
#[path = "pinning/tests.rs"]
mod tests;
