use crate::admission::ANNOTATION_INTERNAL_LB;
use crate::model::Service;
use crate::placement::{
    ANNOTATION_LB_CONFIGURATIONS, ExistingLoadBalancer, ExistingPublicIp, Frontend, PlacementFacts, SlbConfiguration,
    place_service,
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
        ip_configuration: on
            .map(|on| format!("/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/{on}")),
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
            configurations: vec![
                config("lb1"),
                SlbConfiguration { allow_service_placement: Some(false), ..config("lb2") },
            ],
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
            configurations: vec![
                config("lb1"),
                SlbConfiguration { allow_service_placement: Some(false), ..config("lb2") },
            ],
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
    for ip in
        ["100.64.0.1", "168.63.129.16", "::ffff:10.1.2.3", "fd00::1", "fe80::1", "127.0.0.1", "0.0.0.0", "224.0.0.1"]
    {
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
