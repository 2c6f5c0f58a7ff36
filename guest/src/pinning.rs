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

#[cfg(test)]
mod tests {
    use crate::admission::ANNOTATION_INTERNAL_LB;
    use crate::model::Service;
    use crate::placement::{
        ANNOTATION_LB_CONFIGURATIONS, ExistingLoadBalancer, ExistingPublicIp, Frontend, PlacementFacts,
        SlbConfiguration, place_service,
    };
    use crate::selector::{LabelSelector, Requirement};

    use super::*;

    const CONFLICT: &str = "service \"test\" has conflicting load balancer configuration: both a load balancer name \
        (service.beta.kubernetes.io/azure-load-balancer-configurations) and an IP address are specified. When an IP \
        address is specified (via spec.loadBalancerIP, azure-load-balancer-ipv4/ipv6, or azure-pip-name), the service \
        must use the load balancer where that IP resides. To fix, either (1) remove the \
        service.beta.kubernetes.io/azure-load-balancer-configurations annotation to stay on the load balancer where the \
        IP resides, or (2) remove the IP annotation to move to the specified load balancer (external services only)";

    fn not_eligible(lb: &str, set: &str) -> String {
        format!(
            "service \"test\" specifies an IP that resides on load balancer \"{lb}\", which is not in the eligible set \
             [{set}]; check or adjust the load balancer eligibility configuration (ServiceLabelSelector, \
             ServiceNamespaceSelector, or AllowServicePlacement)"
        )
    }

    fn pairs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn config(name: &str) -> SlbConfiguration {
        SlbConfiguration::named(name)
    }

    fn with_labels(name: &str, labels: &[(&str, &str)]) -> SlbConfiguration {
        let selector = LabelSelector { match_labels: pairs(labels), ..LabelSelector::default() };
        SlbConfiguration { service_label_selector: Some(selector), ..config(name) }
    }

    fn lb(name: &str, frontends: &[(&str, Option<&str>)], rules: usize) -> ExistingLoadBalancer {
        ExistingLoadBalancer {
            name: name.into(),
            rules: (0..rules).map(|i| format!("rule-{i}")).collect(),
            pools: Vec::new(),
            frontends: frontends
                .iter()
                .map(|(name, ip)| Frontend { name: (*name).into(), private_ip: ip.map(str::to_owned) })
                .collect(),
        }
    }

    fn pip(name: &str, address: &str, on: Option<&str>) -> ExistingPublicIp {
        ExistingPublicIp {
            name: name.into(),
            address: Some(address.into()),
            ip_configuration: on.map(|on| {
                format!("/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/{on}")
            }),
            tags: Vec::new(),
        }
    }

    /// One case of upstream's table (the test below), its Service named `default/test`
    /// with UID `test` (its primary frontend's prefix is `atest`), in cluster `azure`, with
    /// public IPs in resource group `rg`.
    struct Case {
        name: &'static str,
        configurations: Vec<SlbConfiguration>,
        internal: bool,
        annotations: &'static [(&'static str, &'static str)],
        labels: &'static [(&'static str, &'static str)],
        spec_ip: Option<&'static str>,
        /// Upstream's `ActiveServices`: the load balancer the host placed it on last.
        active: Option<&'static str>,
        load_balancers: Vec<ExistingLoadBalancer>,
        public_ips: Vec<ExistingPublicIp>,
        expected: Result<&'static str, String>,
    }

    impl Default for Case {
        fn default() -> Self {
            Self {
                name: "",
                configurations: vec![config("lb1"), config("lb2")],
                internal: false,
                annotations: &[],
                labels: &[],
                spec_ip: None,
                active: None,
                load_balancers: Vec::new(),
                public_ips: Vec::new(),
                expected: Ok(""),
            }
        }
    }

    fn placed(case: &Case) -> Result<String, String> {
        let mut annotations = pairs(case.annotations);
        if case.internal {
            annotations.push((ANNOTATION_INTERNAL_LB.to_owned(), "true".to_owned()));
        }
        let service = Service {
            uid: "test".into(),
            namespace: "default".into(),
            name: "test".into(),
            service_type: Some("LoadBalancer".into()),
            external_traffic_policy: Some("Local".into()),
            load_balancer_ip: case.spec_ip.map(str::to_owned),
            annotations,
            ..Service::default()
        };
        let facts = PlacementFacts {
            service_labels: pairs(case.labels),
            namespace_labels: Some(Vec::new()),
            current_load_balancer: case.active.map(str::to_owned),
            load_balancers: case.load_balancers.clone(),
            public_ips: case.public_ips.clone(),
            resource_group: "rg".into(),
            cluster_name: "azure".into(),
        };
        place_service(&case.configurations, &service, &facts).map(|p| p.expect("a local Service").load_balancer)
    }

    const IPV4: &str = ANNOTATION_IPV4;

    // upstream TestGetAzureLoadBalancerName
    #[test]
    fn a_service_goes_on_the_load_balancer_its_pinned_ip_or_primary_frontend_lives_on_as_upstream_names_it() {
        let on_lb2 = || vec![pip("pip1", "1.2.3.4", Some("lb2/frontendIPConfigurations/aprimary-svc-uid"))];
        let cases = vec![
            Case {
                name: "should select the most eligible load balancer when using multi-slb",
                configurations: vec![
                    with_labels("a", &[("k1", "v1")]),
                    SlbConfiguration {
                        service_label_selector: Some(LabelSelector {
                            match_expressions: vec![Requirement {
                                key: "k2".into(),
                                operator: "In".into(),
                                values: vec!["v1".into(), "v2".into(), "v3".into()],
                            }],
                            ..LabelSelector::default()
                        }),
                        ..config("b")
                    },
                    SlbConfiguration {
                        service_namespace_selector: Some(LabelSelector {
                            match_labels: pairs(&[("k2", "v2")]),
                            ..LabelSelector::default()
                        }),
                        ..config("c")
                    },
                ],
                annotations: &[(ANNOTATION_LB_CONFIGURATIONS, "a,b")],
                labels: &[("k2", "v2")],
                internal: true,
                expected: Ok("b-internal"),
                ..Case::default()
            },
            Case {
                name: "should report an error if failed to select eligible load balancers",
                configurations: vec![with_labels("a", &[("k1", "v1")])],
                expected: Err("service \"default/test\" selects 1 load balancers (a), but 0 of them () have \
                    AllowServicePlacement set to false and the service is not using any of them, 1 of them (a) do not \
                    match the service label selector, and 0 of them () do not match the service namespace selector"
                    .into()),
                ..Case::default()
            },
            Case {
                name: "multi-slb external: IP annotation returns lb2 where IP resides",
                annotations: &[(IPV4, "1.2.3.4")],
                public_ips: on_lb2(),
                expected: Ok("lb2"),
                ..Case::default()
            },
            Case {
                name: "multi-slb external: PIP name annotation returns lb2 where IP resides",
                annotations: &[(ANNOTATION_PIP_NAME, "pip1")],
                public_ips: on_lb2(),
                expected: Ok("lb2"),
                ..Case::default()
            },
            Case {
                name: "multi-slb external: spec.loadBalancerIP returns lb2 where IP resides",
                spec_ip: Some("1.2.3.4"),
                public_ips: on_lb2(),
                expected: Ok("lb2"),
                ..Case::default()
            },
            Case {
                name: "multi-slb external: LB annotation lb2 returns lb2",
                annotations: &[(ANNOTATION_LB_CONFIGURATIONS, "lb2")],
                expected: Ok("lb2"),
                ..Case::default()
            },
            Case {
                name: "multi-slb external: new IP not on LB returns error",
                annotations: &[(IPV4, "5.6.7.8")],
                load_balancers: vec![lb("lb1", &[("aprimary-svc-uid", None)], 0)],
                public_ips: vec![pip("pip1", "1.2.3.4", None)],
                expected: Err("look up load balancer by public IP for service \"test\": find public IP by address \
                    \"5.6.7.8\": findMatchedPIPByLoadBalancerIP: cannot find public IP with IP address 5.6.7.8 in \
                    resource group rg: getExpectedPIPFromListByIPAddress: cannot find public IP with IP address 5.6.7.8"
                    .into()),
                ..Case::default()
            },
            Case {
                name: "multi-slb external: non-public LoadBalancer IP returns validation error",
                annotations: &[(IPV4, "10.0.0.5")],
                expected: Err("look up load balancer by public IP for service \"test\": find public IP by address \
                    \"10.0.0.5\": external Service \"default/test\" cannot use non-public LoadBalancer IP \"10.0.0.5\"; \
                    use an internal LoadBalancer annotation or a valid Azure Public IP address"
                    .into()),
                ..Case::default()
            },
            Case {
                name: "multi-slb external: PIP name not found returns error",
                annotations: &[(ANNOTATION_PIP_NAME, "nonexistent")],
                public_ips: vec![pip("pip1", "1.2.3.4", None)],
                expected: Err("look up load balancer by public IP for service \"test\": find public IP by name \
                    \"nonexistent\": findMatchedPIPByName: failed to find PIP nonexistent in resource group rg"
                    .into()),
                ..Case::default()
            },
            Case {
                name: "multi-slb external: IP annotation and LB annotation conflicts",
                annotations: &[(IPV4, "1.2.3.4"), (ANNOTATION_LB_CONFIGURATIONS, "lb1")],
                expected: Err(CONFLICT.into()),
                ..Case::default()
            },
            Case {
                name: "multi-slb external: PIP name annotation and LB annotation conflicts",
                annotations: &[(ANNOTATION_PIP_NAME, "pip1"), (ANNOTATION_LB_CONFIGURATIONS, "lb1")],
                expected: Err(CONFLICT.into()),
                ..Case::default()
            },
            Case {
                name: "multi-slb external: spec.loadBalancerIP and LB annotation conflicts",
                spec_ip: Some("1.2.3.4"),
                annotations: &[(ANNOTATION_LB_CONFIGURATIONS, "lb1")],
                expected: Err(CONFLICT.into()),
                ..Case::default()
            },
            Case {
                name: "multi-slb external: IP resides on LB excluded by label selector should error",
                configurations: vec![with_labels("lb1", &[("app", "web")]), config("lb2")],
                annotations: &[(IPV4, "1.2.3.4")],
                labels: &[("app", "api")],
                public_ips: vec![pip("pip1", "1.2.3.4", Some("lb1/frontendIPConfigurations/fip1"))],
                expected: Err(not_eligible("lb1", "lb2")),
                ..Case::default()
            },
            Case {
                name: "multi-slb external: existing service on lb1 shares IP with service on lb2",
                active: Some("lb1"),
                annotations: &[(IPV4, "1.2.3.4")],
                public_ips: vec![pip("pip1", "1.2.3.4", Some("lb2/frontendIPConfigurations/fip1"))],
                expected: Ok("lb2"),
                ..Case::default()
            },
            Case {
                name: "multi-slb external: primary FIP on external LB determines placement when service does not specify IP",
                load_balancers: vec![lb("lb1", &[], 0), lb("lb2", &[("atest", None)], 0)],
                expected: Ok("lb2"),
                ..Case::default()
            },
            Case {
                name: "multi-slb external: primary FIP on internal LB is ignored when service does not specify IP",
                active: Some("lb1"),
                load_balancers: vec![lb("lb1-internal", &[("atest", None)], 0)],
                expected: Ok("lb1"),
                ..Case::default()
            },
            Case {
                name: "multi-slb external: prefer lb1 with existing primary FIP over ActiveServices on lb2 when both eligible",
                active: Some("lb2"),
                load_balancers: vec![lb("lb1", &[("atest", None)], 0), lb("lb2", &[], 0)],
                expected: Ok("lb1"),
                ..Case::default()
            },
            Case {
                name: "multi-slb external: primary FIP on ineligible LB is ignored",
                configurations: vec![config("lb1"), SlbConfiguration { allow_service_placement: Some(false), ..config("lb2") }],
                load_balancers: vec![lb("lb1", &[], 0), lb("lb2", &[("atest", None)], 0)],
                expected: Ok("lb1"),
                ..Case::default()
            },
            Case {
                name: "multi-slb internal: IP annotation returns lb2-internal where IP resides",
                internal: true,
                annotations: &[(IPV4, "10.0.0.5")],
                load_balancers: vec![lb("lb2-internal", &[("aprimary-svc-uid", Some("10.0.0.5"))], 0)],
                expected: Ok("lb2-internal"),
                ..Case::default()
            },
            Case {
                name: "multi-slb internal: spec.loadBalancerIP returns lb2-internal where IP resides",
                internal: true,
                spec_ip: Some("10.0.0.5"),
                load_balancers: vec![lb("lb2-internal", &[("aprimary-svc-uid", Some("10.0.0.5"))], 0)],
                expected: Ok("lb2-internal"),
                ..Case::default()
            },
            Case {
                name: "multi-slb internal: LB annotation lb2 returns lb2-internal",
                internal: true,
                annotations: &[(ANNOTATION_LB_CONFIGURATIONS, "lb2")],
                expected: Ok("lb2-internal"),
                ..Case::default()
            },
            Case {
                name: "multi-slb internal: new IP not on LB returns fewest rules lb2-internal",
                internal: true,
                annotations: &[(IPV4, "10.0.0.99")],
                load_balancers: vec![lb("lb1-internal", &[("aprimary-svc-uid", Some("10.0.0.5"))], 1)],
                expected: Ok("lb2-internal"),
                ..Case::default()
            },
            Case {
                name: "multi-slb internal: IP annotation and LB annotation conflicts",
                internal: true,
                annotations: &[(IPV4, "10.0.0.5"), (ANNOTATION_LB_CONFIGURATIONS, "lb1")],
                expected: Err(CONFLICT.into()),
                ..Case::default()
            },
            Case {
                name: "multi-slb internal: spec.loadBalancerIP and LB annotation conflicts",
                internal: true,
                spec_ip: Some("10.0.0.5"),
                annotations: &[(ANNOTATION_LB_CONFIGURATIONS, "lb1")],
                expected: Err(CONFLICT.into()),
                ..Case::default()
            },
            Case {
                name: "multi-slb internal: IP resides on LB excluded by label selector should error",
                configurations: vec![with_labels("lb1", &[("app", "web")]), config("lb2")],
                internal: true,
                annotations: &[(IPV4, "10.0.0.5")],
                labels: &[("app", "api")],
                load_balancers: vec![lb("lb1-internal", &[("fip1", Some("10.0.0.5"))], 0)],
                expected: Err(not_eligible("lb1", "lb2")),
                ..Case::default()
            },
            Case {
                name: "multi-slb internal: existing service on lb1-internal shares IP with service on lb2-internal",
                internal: true,
                active: Some("lb1"),
                annotations: &[(IPV4, "10.0.0.5")],
                load_balancers: vec![lb("lb2-internal", &[("fip1", Some("10.0.0.5"))], 0)],
                expected: Ok("lb2-internal"),
                ..Case::default()
            },
            Case {
                name: "multi-slb internal: primary FIP on internal LB determines placement when service does not specify IP",
                internal: true,
                load_balancers: vec![lb("lb1-internal", &[], 0), lb("lb2-internal", &[("atest", None)], 0)],
                expected: Ok("lb2-internal"),
                ..Case::default()
            },
            Case {
                name: "multi-slb internal: primary FIP on external LB is ignored when service does not specify IP",
                internal: true,
                active: Some("lb1"),
                load_balancers: vec![lb("lb1", &[("atest", None)], 0)],
                expected: Ok("lb1-internal"),
                ..Case::default()
            },
            Case {
                name: "multi-slb internal: prefer lb1-internal with existing primary FIP over ActiveServices on lb2 when both eligible",
                internal: true,
                active: Some("lb2"),
                load_balancers: vec![lb("lb1-internal", &[("atest", None)], 0), lb("lb2-internal", &[], 0)],
                expected: Ok("lb1-internal"),
                ..Case::default()
            },
            Case {
                name: "multi-slb internal: primary FIP on ineligible LB is ignored",
                internal: true,
                configurations: vec![config("lb1"), SlbConfiguration { allow_service_placement: Some(false), ..config("lb2") }],
                load_balancers: vec![lb("lb1-internal", &[], 0), lb("lb2-internal", &[("atest", None)], 0)],
                expected: Ok("lb1-internal"),
                ..Case::default()
            },
        ];
        for case in &cases {
            assert_eq!(placed(case), case.expected.clone().map(str::to_owned), "{}", case.name);
        }
    }

    #[test]
    fn a_public_ip_tagged_for_another_cluster_or_attached_to_no_load_balancer_pins_nothing() {
        let tagged = |key: &str, value: &str| ExistingPublicIp {
            tags: pairs(&[(key, value)]),
            ..pip("pip1", "1.2.3.4", Some("lb2/frontendIPConfigurations/fip1"))
        };
        let nic = ExistingPublicIp {
            ip_configuration: Some(
                "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/nic/ipConfigurations/ip".into(),
            ),
            ..pip("pip1", "1.2.3.4", None)
        };
        let with = |public_ips: Vec<ExistingPublicIp>| Case {
            annotations: &[(IPV4, "1.2.3.4")],
            active: Some("lb1"),
            public_ips,
            ..Case::default()
        };
        // Another cluster's IP, by the current tag or, without it, the legacy one: found, on no
        // load balancer of this cluster, so the Service is on none and goes where placement puts
        // it (the first that does not exist), not where the host's record says.
        assert_eq!(placed(&with(vec![tagged("k8s-azure-cluster-name", "other")])), Ok("lb1".into()));
        assert_eq!(placed(&with(vec![tagged("kubernetes-cluster-name", "other")])), Ok("lb1".into()));
        assert_eq!(placed(&with(vec![tagged("k8s-azure-cluster-name", "AZURE")])), Ok("lb2".into()));
        assert_eq!(placed(&with(vec![nic])), Ok("lb1".into()));
        let attached = |lb2_rules| Case {
            load_balancers: vec![lb("lb1", &[], 5), lb("lb2", &[], lb2_rules)],
            ..with(vec![pip("pip1", "1.2.3.4", None)])
        };
        // Pinned to an IP on no load balancer, the Service does not stay where the record says:
        // upstream's in-use name is the IP's, here none, and the emptier load balancer wins.
        assert_eq!(placed(&attached(1)), Ok("lb2".into()));
    }

    // upstream TestGetClusterFromPIPClusterTags
    #[test]
    fn a_public_ips_cluster_is_its_cluster_tag_else_its_legacy_one_else_none() {
        assert_eq!(cluster_of(&[]), "");
        assert_eq!(cluster_of(&pairs(&[("service", "x")])), "");
        assert_eq!(cluster_of(&pairs(&[("k8s-azure-cluster-name", "test-cluster")])), "test-cluster");
        assert_eq!(cluster_of(&pairs(&[("kubernetes-cluster-name", "test-cluster")])), "test-cluster");
        let both = pairs(&[("kubernetes-cluster-name", "legacy"), ("k8s-azure-cluster-name", "current")]);
        assert_eq!(cluster_of(&both), "current");
    }

    #[test]
    fn a_pinned_ip_is_read_by_upstreams_rules_of_families_and_addresses() {
        let service = |families: &[&str], annotations: &[(&str, &str)]| Service {
            ip_families: families.iter().map(|f| (*f).to_owned()).collect(),
            annotations: pairs(annotations),
            load_balancer_ip: Some("1.2.3.4".into()),
            ..Service::default()
        };
        let both = [(ANNOTATION_PIP_NAME, "v4"), (ANNOTATION_PIP_NAME_IPV6, "v6")];
        assert_eq!(pinned_pip_names(&service(&["IPv4", "IPv6"], &both)), ["v4", "v6"]);
        assert_eq!(pinned_pip_names(&service(&["IPv4"], &both)), ["v4"]);
        assert_eq!(pinned_pip_names(&service(&[], &both)), ["v4"]);
        assert_eq!(pinned_pip_names(&service(&["IPv6"], &both)), ["v4", "v6"]);
        assert_eq!(pinned_pip_names(&service(&["IPv6"], &both[..1])), ["v4", "v4"]);
        assert_eq!(pinned_pip_names(&service(&["IPv4"], &[(ANNOTATION_PIP_NAME, "")])), Vec::<&str>::new());
        // The per-family annotations hide `spec.loadBalancerIP`; empty ones do not.
        assert_eq!(pinned_ips(&service(&[], &[(ANNOTATION_IPV6, "2001:db8::1")])), ["2001:db8::1"]);
        assert_eq!(pinned_ips(&service(&[], &[(ANNOTATION_IPV4, "")])), ["1.2.3.4"]);
        let external = Service { namespace: "default".into(), name: "test".into(), ..Service::default() };
        for ip in [
            "100.64.0.1",
            "168.63.129.16",
            "::ffff:10.1.2.3",
            "fd00::1",
            "fe80::1",
            "127.0.0.1",
            "0.0.0.0",
            "224.0.0.1",
        ] {
            assert!(public_candidate(&external, ip).unwrap_err().contains("cannot use non-public"), "{ip}");
        }
        assert!(public_candidate(&external, "1.2.3").unwrap_err().contains("has invalid LoadBalancer IP \"1.2.3\""));
        for ip in ["20.1.2.3", "100.128.0.1", "2603:1030::1", "::ffff:20.1.2.3"] {
            assert_eq!(public_candidate(&external, ip), Ok(()), "{ip}");
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn a_service_pinning_a_public_ip_goes_where_the_ip_is_attached_when_that_is_eligible_and_is_refused_otherwise(
                allow in prop::collection::vec(prop::option::of(any::<bool>()), 3),
                attached in 0..3usize,
                recorded in prop::option::of(0..3usize),
                rules in prop::collection::vec(0..3usize, 3),
                by_name in any::<bool>(),
            ) {
                let name = |i: usize| format!("lb{i}");
                let configurations: Vec<SlbConfiguration> = allow
                    .iter()
                    .enumerate()
                    .map(|(i, allow)| SlbConfiguration { allow_service_placement: *allow, ..config(&name(i)) })
                    .collect();
                let on = format!("lb{attached}/frontendIPConfigurations/fip");
                let annotations: &'static [(&'static str, &'static str)] =
                    if by_name { &[(ANNOTATION_PIP_NAME, "pinned")] } else { &[(IPV4, "20.1.2.3")] };
                let case = Case {
                    configurations,
                    annotations,
                    active: recorded.map(|i| ["lb0", "lb1", "lb2"][i]),
                    load_balancers: (0..3).map(|i| lb(&name(i), &[], rules[i])).collect(),
                    public_ips: vec![pip("pinned", "20.1.2.3", Some(on.as_str()))],
                    ..Case::default()
                };
                let eligible = |i: usize| allow[i] != Some(false) || recorded == Some(i);
                let placed = placed(&case);
                if !(0..3).any(eligible) {
                    prop_assert!(placed.unwrap_err().contains("AllowServicePlacement set to false"));
                } else if eligible(attached) {
                    prop_assert_eq!(placed, Ok(name(attached)));
                } else {
                    prop_assert!(placed.unwrap_err().contains("which is not in the eligible set"));
                }
            }
        }
    }

    #[test]
    fn a_public_ip_resource_group_other_than_the_listed_one_is_refused_and_the_listed_one_is_read() {
        let case = |group: &'static str| Case {
            annotations: if group.is_empty() {
                &[(ANNOTATION_PIP_NAME, "pip1")]
            } else if group == "RG" {
                &[(ANNOTATION_PIP_NAME, "pip1"), (ANNOTATION_RESOURCE_GROUP, " RG ")]
            } else {
                &[(ANNOTATION_PIP_NAME, "pip1"), (ANNOTATION_RESOURCE_GROUP, "other")]
            },
            public_ips: vec![pip("pip1", "1.2.3.4", Some("lb2/frontendIPConfigurations/fip1"))],
            ..Case::default()
        };
        assert_eq!(placed(&case("")), Ok("lb2".into()));
        assert_eq!(placed(&case("RG")), Ok("lb2".into()));
        let refused = placed(&case("other")).unwrap_err();
        assert!(refused.contains("the public IPs of resource group other"), "{refused}");
    }
}
