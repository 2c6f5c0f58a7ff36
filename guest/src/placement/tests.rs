use super::*;
use crate::selector::Requirement;

fn lb(name: &str, allow: Option<bool>) -> SlbConfiguration {
    SlbConfiguration { allow_service_placement: allow, ..SlbConfiguration::named(name) }
}

fn by_labels(name: &str, pairs: &[(&str, &str)]) -> SlbConfiguration {
    SlbConfiguration { service_label_selector: Some(match_labels(pairs)), ..SlbConfiguration::named(name) }
}

fn by_namespace(name: &str, pairs: &[(&str, &str)]) -> SlbConfiguration {
    SlbConfiguration { service_namespace_selector: Some(match_labels(pairs)), ..SlbConfiguration::named(name) }
}

fn match_labels(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector { match_labels: labels(pairs), ..LabelSelector::default() }
}

fn match_in(key: &str, values: &[&str]) -> LabelSelector {
    let values = values.iter().map(|v| (*v).to_owned()).collect();
    LabelSelector {
        match_expressions: vec![Requirement { key: key.into(), operator: "In".into(), values }],
        ..Default::default()
    }
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn local(annotation: Option<&str>) -> Service {
    Service {
        uid: "8e3b2c10-4d5e-4f6a-8b7c-9d0e1f2a3b01".into(),
        namespace: "shop".into(),
        name: "web".into(),
        service_type: Some("LoadBalancer".into()),
        external_traffic_policy: Some("Local".into()),
        annotations: annotation
            .map(|v| vec![(ANNOTATION_LB_CONFIGURATIONS.to_owned(), v.to_owned())])
            .unwrap_or_default(),
        ..Service::default()
    }
}

fn placed_on(configurations: &[SlbConfiguration], service: &Service) -> Option<String> {
    place_service(configurations, service, &PlacementFacts::default()).unwrap().map(|p| p.load_balancer)
}

fn existing(name: &str, rules: usize) -> ExistingLoadBalancer {
    ExistingLoadBalancer {
        name: name.into(),
        rules: (0..rules).map(|i| format!("rule-{i}")).collect(),
        ..ExistingLoadBalancer::default()
    }
}

fn holding(name: &str, pools: &[&str]) -> ExistingLoadBalancer {
    ExistingLoadBalancer { pools: pools.iter().map(|p| p.to_string()).collect(), ..existing(name, 0) }
}

fn left(pairs: &[(&str, &str)]) -> Vec<LeftPool> {
    pairs.iter().map(|(lb, pool)| LeftPool { load_balancer: lb.to_string(), pool: pool.to_string() }).collect()
}

// Upstream getAzureLoadBalancerName: an internal Service's load balancer is its
// configuration's name with `-internal`; the host hands that back as the one in use.
#[test]
fn an_internal_service_goes_on_its_configurations_internal_load_balancer_and_stays_there() {
    let mut service = local(None);
    service.annotations.push((ANNOTATION_INTERNAL_LB.into(), "true".into()));
    let configs = [lb("lb1", None), lb("lb2", None)];
    let facts = PlacementFacts { load_balancers: vec![existing("lb1-internal", 2)], ..PlacementFacts::default() };
    let placed = place_service(&configs, &service, &facts).unwrap().unwrap();
    assert_eq!(placed.load_balancer, "lb2-internal", "lb1-internal has rules, lb2's does not exist");
    let again = PlacementFacts { current_load_balancer: Some(placed.load_balancer.clone()), ..facts };
    assert_eq!(place_service(&configs, &service, &again).unwrap().unwrap().load_balancer, "lb2-internal");
}

// Upstream cleanupLocalServiceBackendPool: the pools a Service owns by name (either family,
// localServiceOwnsBackendPool) on the cluster's load balancers, except where it is now.
#[test]
fn the_pools_a_service_left_are_those_named_as_its_own_on_a_configured_load_balancer_it_is_not_on() {
    let configs = [lb("lb1", None), lb("lb2", None)];
    let facts = PlacementFacts {
        current_load_balancer: Some("lb2".into()),
        load_balancers: vec![
            holding("lb1", &["Shop-Web", "shop-web-ipv6", "kubernetes"]),
            holding("lb2", &["shop-web", "shop-web-IPv6", "shop-webx"]),
            holding("lb1-internal", &["shop-web"]),
            holding("elsewhere", &["shop-web"]),
        ],
        ..PlacementFacts::default()
    };
    let placed = place_service(&configs, &local(None), &facts).unwrap().unwrap();
    assert_eq!(placed.load_balancer, "lb2");
    assert_eq!(
        placed.left,
        left(&[("lb1", "Shop-Web"), ("lb1", "shop-web-ipv6"), ("lb2", "shop-web-IPv6"), ("lb1-internal", "shop-web")]),
        "its IPv6 pool on lb2 too: it serves IPv4 only"
    );
    let mut cluster = local(None);
    cluster.external_traffic_policy = Some("Cluster".into());
    assert_eq!(place_service(&configs, &cluster, &facts), Ok(None));
    assert_eq!(
        pools_left(&configs, &cluster, &facts, None).len(),
        5,
        "every pool it owns by name on the configured ones goes"
    );
}

/// Upstream's `getEligibleLoadBalancersForService` on one case: the names, or the error.
fn eligible_names(
    configurations: &[SlbConfiguration],
    service: &Service,
    facts: &PlacementFacts,
    current: Option<&str>,
) -> Result<Vec<String>, String> {
    eligible(configurations, service, facts, current).map(|e| e.iter().map(|c| c.name.clone()).collect())
}

// Upstream TestGetEligibleLoadBalancers: each case, with upstream's Service `default/test`
// (a namespace case moves it to `ns1`) and its exact error texts. `ActiveServices` holding
// the Service is `current` here.
#[test]
fn eligible_load_balancers_follow_the_annotation_the_placement_flag_and_the_selectors_as_upstream() {
    let mut svc = local(None);
    (svc.namespace, svc.name) = ("default".into(), "test".into());
    let with_annotation = |value: &str| {
        let mut s = svc.clone();
        s.annotations = vec![(ANNOTATION_LB_CONFIGURATIONS.into(), value.into())];
        s
    };
    let in_ns1 = |mut s: Service| {
        s.namespace = "ns1".into();
        s
    };
    let facts = |service: &[(&str, &str)], namespace: Option<&[(&str, &str)]>| PlacementFacts {
        service_labels: labels(service),
        namespace_labels: namespace.map(labels),
        ..PlacementFacts::default()
    };
    let none = PlacementFacts::default();
    // should respect service annotation
    let configs = [SlbConfiguration::named("a"), SlbConfiguration::named("c")];
    assert_eq!(eligible_names(&configs, &with_annotation("A ,b"), &none, None), Ok(vec!["a".into()]));
    // should report an error if a service selects a load balancer that is not defined in the configuration
    assert_eq!(
        eligible_names(&configs, &with_annotation("b"), &none, None),
        Err("service \"test\" selects 1 load balancers by annotation, but none of them is defined in cloud provider configuration".into())
    );
    // should respect namespace selector
    let configs =
        [by_namespace("a", &[("k1", "v1")]), by_namespace("b", &[("k2", "v2")]), SlbConfiguration::named("c")];
    let ns1 = facts(&[], Some(&[("k1", "v1")]));
    assert_eq!(eligible_names(&configs, &in_ns1(svc.clone()), &ns1, None), Ok(vec!["a".into()]));
    // should respect label selector
    let configs = [by_labels("a", &[("k1", "v1")]), by_labels("b", &[("k2", "v2")]), SlbConfiguration::named("c")];
    let labelled = facts(&[("k2", "v2"), ("k3", "v3")], None);
    assert_eq!(eligible_names(&configs, &svc, &labelled, None), Ok(vec!["b".into()]));
    // should put the service to the load balancers that does not have label/namespace selector if there is no other choice
    let configs = [
        by_labels("fails to match service label", &[("k1", "v1")]),
        by_namespace("fails to match service namespace", &[("k2", "v2")]),
        SlbConfiguration::named("empty"),
    ];
    let both = facts(&[("k2", "v2"), ("k3", "v3")], Some(&[("k1", "v1")]));
    assert_eq!(eligible_names(&configs, &in_ns1(svc.clone()), &both, None), Ok(vec!["empty".into()]));
    // should return the intersection of annotation, namespace and label selector
    let configs = [
        by_labels("a", &[("k1", "v1")]),
        SlbConfiguration {
            service_label_selector: Some(match_in("k2", &["v1", "v2", "v3"])),
            service_namespace_selector: Some(match_in("k2", &["v1", "v2", "v3"])),
            ..SlbConfiguration::named("b")
        },
        by_namespace("c", &[("k2", "v2")]),
    ];
    let both = facts(&[("k2", "v2")], Some(&[("k1", "v1"), ("k2", "v2")]));
    assert_eq!(eligible_names(&configs, &in_ns1(with_annotation("a,b")), &both, None), Ok(vec!["b".into()]));
    // should return an error if there is no matching lb config
    let configs = [
        by_labels("a", &[("k1", "v1")]),
        SlbConfiguration {
            service_namespace_selector: Some(match_in("k2", &["v1", "v3"])),
            ..SlbConfiguration::named("b")
        },
        by_namespace("c", &[("k2", "v3")]),
        SlbConfiguration { allow_service_placement: Some(false), ..by_namespace("d", &[("k2", "v2")]) },
    ];
    let ns = facts(&[], Some(&[("k1", "v1"), ("k2", "v2")]));
    assert_eq!(
        eligible_names(&configs, &in_ns1(with_annotation("a,b,c")), &ns, Some("d")),
        Err("service \"ns1/test\" selects 3 load balancers (a, b, c), but 0 of them () have AllowServicePlacement set to \
             false and the service is not using any of them, 1 of them (a) do not match the service label selector, and 2 \
             of them (c, b) do not match the service namespace selector"
            .into())
    );
    // should report an error if failed to convert label selector as a selector
    let empty_in = match_in("k2", &[]);
    let configs = [SlbConfiguration { service_label_selector: Some(empty_in.clone()), ..SlbConfiguration::named("a") }];
    let invalid = Err("values: Invalid value: null: for 'in', 'notin' operators, values set can't be empty".to_owned());
    assert_eq!(eligible_names(&configs, &svc, &none, None), invalid);
    // should report an error if failed to convert namespace selector as a selector
    let configs = [SlbConfiguration { service_namespace_selector: Some(empty_in), ..SlbConfiguration::named("a") }];
    assert_eq!(eligible_names(&configs, &svc, &facts(&[], Some(&[])), None), invalid);
    // should respect allowServicePlacement flag
    let configs = [lb("a", Some(false)), lb("b", None), lb("c", None), lb("d", None)];
    let annotated = with_annotation("a,c");
    assert_eq!(eligible_names(&configs, &annotated, &none, Some("a")), Ok(vec!["a".into(), "c".into()]));
}

#[test]
fn a_namespace_selector_on_a_namespace_the_host_does_not_know_is_an_error_not_a_mismatch() {
    let configs = [by_namespace("a", &[("team", "x")]), SlbConfiguration::named("b")];
    let error = place_service(&configs, &local(None), &PlacementFacts::default()).unwrap_err();
    assert_eq!(error, "namespaces \"shop\" not found");
}

#[test]
fn a_configuration_that_disallows_placement_is_kept_only_for_the_service_that_uses_it() {
    let configs = [lb("lb1", Some(false)), lb("lb2", None)];
    let service = local(Some("lb1"));
    let facts = PlacementFacts { current_load_balancer: Some("LB1".into()), ..PlacementFacts::default() };
    assert_eq!(place_service(&configs, &service, &facts).unwrap().unwrap().load_balancer, "lb1");
    let error = place_service(&configs, &service, &PlacementFacts::default()).unwrap_err();
    assert!(error.contains("1 of them (lb1) have AllowServicePlacement set to false"), "{error}");
}

// Upstream TestGetMostEligibleLBName: each case (an existing load balancer with nil
// properties is one with no rules here).
#[test]
fn the_most_eligible_load_balancer_is_the_current_then_an_empty_one_then_a_missing_one_then_the_least_used() {
    // (description, current, eligible, existing, internal, expected)
    type Case<'a> = (&'a str, Option<&'a str>, &'a [&'a str], Vec<ExistingLoadBalancer>, bool, Option<&'a str>);
    let cases: [Case; 10] = [
        ("should return current LB name if it is eligible", Some("lb1"), &["lb1", "lb2"], vec![], false, Some("lb1")),
        (
            "should return eligible LBs with fewest rules",
            Some("lb1"),
            &["lb2", "lb3"],
            vec![existing("lb2", 3), existing("lb3", 2), existing("lb4", 1)],
            false,
            Some("lb3"),
        ),
        (
            "should return the first eligible LB if there is no existing eligible LBs",
            None,
            &["lb1", "lb2"],
            vec![],
            false,
            Some("lb1"),
        ),
        (
            "should return the first eligible LB that does not exist",
            None,
            &["lb1", "lb2", "lb3"],
            vec![existing("lb3", 1)],
            false,
            Some("lb1"),
        ),
        (
            "should respect internal load balancers",
            None,
            &["lb1", "lb2", "lb3"],
            vec![existing("lb1-internal", 1), existing("lb2-internal", 0), existing("lb3-internal", 0)],
            true,
            Some("lb2"),
        ),
        (
            "should return the first eligible LB if it exists with no rules",
            None,
            &["lb1", "lb2"],
            vec![existing("lb1", 0)],
            false,
            Some("lb1"),
        ),
        (
            "should return the first eligible LB if it exists with nil properties",
            None,
            &["lb1", "lb2"],
            vec![existing("lb1", 0)],
            false,
            Some("lb1"),
        ),
        (
            "should return the first eligible LB for internal service when only external LBs exist with no rules",
            None,
            &["lb1", "lb2"],
            vec![existing("lb1", 0)],
            true,
            Some("lb1"),
        ),
        (
            "should skip existing LB with rules and return the one with no rules",
            None,
            &["lb1", "lb2", "lb3"],
            vec![existing("lb1", 3), existing("lb2", 0)],
            false,
            Some("lb2"),
        ),
        (
            "should prefer existing LB with no rules over non-existent one",
            None,
            &["lb1", "lb2", "lb3"],
            vec![existing("lb3", 0)],
            false,
            Some("lb3"),
        ),
    ];
    for (description, current, eligible, existing, internal, want) in cases {
        assert_eq!(most_eligible(current, eligible, &existing, internal), want, "{description}");
    }
}

#[test]
fn a_load_balancer_with_301_rules_is_never_the_least_used_and_none_left_is_an_error() {
    assert_eq!(most_eligible(None, &["lb1", "lb2"], &[existing("lb1", 301), existing("lb2", 300)], false), Some("lb2"));
    assert_eq!(most_eligible(None, &["lb1"], &[existing("lb1", 301)], false), None);
    let facts = PlacementFacts { load_balancers: vec![existing("lb1", 301)], ..PlacementFacts::default() };
    let error = place_service(&[SlbConfiguration::named("lb1")], &local(None), &facts).unwrap_err();
    assert!(error.contains("301 load-balancing rules or more"), "{error}");
}

#[test]
fn without_the_hosts_record_a_load_balancer_holding_a_rule_named_after_the_service_is_the_one_it_uses() {
    let configs = [lb("lb1", None), lb("lb2", Some(false))];
    let rule =
        ExistingLoadBalancer { rules: vec!["a8e3b2c104d5e4f6a8b7c9d0e1f2a3b0-TCP-80".into()], ..existing("LB2", 0) };
    let facts = PlacementFacts { load_balancers: vec![existing("lb1", 0), rule], ..PlacementFacts::default() };
    assert_eq!(place_service(&configs, &local(None), &facts).unwrap().unwrap().load_balancer, "lb2");
    let other = ExistingLoadBalancer { rules: vec!["a0000-TCP-80".into()], ..existing("lb2", 0) };
    let facts = PlacementFacts { load_balancers: vec![existing("lb1", 0), other], ..PlacementFacts::default() };
    assert_eq!(place_service(&configs, &local(None), &facts).unwrap().unwrap().load_balancer, "lb1");
}

#[test]
fn a_local_service_without_the_annotation_goes_on_the_first_configuration() {
    let facts = PlacementFacts::default();
    let placement = place_service(&[lb("kubernetes", None), lb("lb2", None)], &local(None), &facts).unwrap();
    let pools = vec![FamilyPool { ipv6: false, name: "shop-web".into() }];
    assert_eq!(placement, Some(Placement { load_balancer: "kubernetes".into(), pools, left: Vec::new() }));
}

#[test]
fn the_annotation_keeps_the_configurations_it_names_in_configuration_order() {
    let configs = [lb("kubernetes", None), lb("lb2", None), lb("lb3", None)];
    assert_eq!(placed_on(&configs, &local(Some("missing, lb3 ,lb2"))).as_deref(), Some("lb2"));
}

#[test]
fn annotation_names_match_case_insensitively_and_keep_the_configured_spelling() {
    let configs = [lb("kubernetes", None), lb("LB-Two", None)];
    assert_eq!(placed_on(&configs, &local(Some("lb-two"))).as_deref(), Some("LB-Two"));
}

#[test]
fn an_annotation_naming_only_unknown_configurations_is_an_error() {
    let configs = [lb("kubernetes", Some(false)), lb("lb2", None)];
    let error = place_service(&configs, &local(Some("nope, ,")), &PlacementFacts::default()).unwrap_err();
    assert!(error.contains("selects 3 load balancers by annotation, but none of them is defined"), "{error}");
}

#[test]
fn an_explicitly_named_configuration_that_disallows_placement_is_not_eligible_for_a_new_service() {
    let configs = [lb("kubernetes", None), lb("lb2", Some(false))];
    assert!(place_service(&configs, &local(Some("lb2")), &PlacementFacts::default()).is_err());
}

#[test]
fn external_traffic_policy_local_is_read_case_insensitively() {
    let mut service = local(None);
    service.external_traffic_policy = Some("local".into());
    assert!(is_local_service(&service));
}

#[test]
fn a_cluster_or_unset_traffic_policy_service_is_not_placed() {
    for policy in [Some("Cluster"), None] {
        let mut service = local(None);
        service.external_traffic_policy = policy.map(Into::into);
        assert_eq!(placed_on(&[lb("kubernetes", None)], &service), None, "{policy:?}");
    }
}

#[test]
fn a_service_that_is_not_of_type_load_balancer_is_not_placed() {
    for service_type in [Some("ClusterIP"), Some("NodePort"), None] {
        let mut service = local(None);
        service.service_type = service_type.map(Into::into);
        assert_eq!(placed_on(&[lb("kubernetes", None)], &service), None, "{service_type:?}");
    }
}

#[test]
fn a_deleting_service_is_not_placed() {
    let mut service = local(None);
    service.deleting = true;
    assert_eq!(placed_on(&[lb("kubernetes", None)], &service), None);
}

#[test]
fn a_service_of_another_load_balancer_class_is_not_placed_but_an_empty_class_is_ours() {
    let mut service = local(None);
    service.load_balancer_class = Some("example.com/other".into());
    assert_eq!(placed_on(&[lb("kubernetes", None)], &service), None);
    service.load_balancer_class = Some(String::new());
    assert_eq!(placed_on(&[lb("kubernetes", None)], &service).as_deref(), Some("kubernetes"));
}

// Upstream TestGetBackendPoolNamesAndIDsForService (which only calls the functions) and
// getLocalServiceBackendPoolName with getServiceIPFamily: a local Service's pools are named
// after its namespace and name, lower-cased, `-ipv6` for the IPv6 one, one per family it
// serves.
#[test]
fn a_local_service_has_a_pool_per_family_it_serves_named_after_its_namespace_and_name() {
    let names = |families: &[&str]| {
        let mut service = local(None);
        service.name = "Web".into();
        service.ip_families = families.iter().map(|f| f.to_string()).collect();
        local_pools(&service).into_iter().map(|p| (p.ipv6, p.name)).collect::<Vec<_>>()
    };
    let v4 = (false, "shop-web".to_owned());
    let v6 = (true, "shop-web-ipv6".to_owned());
    assert_eq!(names(&[]), std::slice::from_ref(&v4), "no family: IPv4, as upstream's default");
    assert_eq!(names(&["IPv4"]), std::slice::from_ref(&v4));
    assert_eq!(names(&["IPv6"]), std::slice::from_ref(&v6));
    assert_eq!(names(&["IPv6", "IPv4"]), [v4.clone(), v6.clone()], "dual-stack: both, IPv4 first");
    assert_eq!(names(&["IPv4", "IPv6"]), [v4, v6]);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    const NAMES: [&str; 4] = ["lb1", "LB2", "lb3", "kubernetes"];
    const KEYS: [&str; 2] = ["team", "tier"];
    const VALUES: [&str; 2] = ["a", "b"];

    fn pairs() -> impl Strategy<Value = Vec<(String, String)>> {
        prop::collection::vec((0..2usize, 0..2usize), 0..3)
            .prop_map(|v| v.into_iter().map(|(k, w)| (KEYS[k].to_owned(), VALUES[w].to_owned())).collect())
    }

    fn selector() -> impl Strategy<Value = Option<LabelSelector>> {
        let operators = prop::sample::select(vec!["In", "NotIn", "Exists", "DoesNotExist", "in"]);
        let requirement =
            (0..2usize, operators, prop::collection::vec(0..2usize, 0..2)).prop_map(|(k, op, vs)| Requirement {
                key: KEYS[k].to_owned(),
                operator: op.to_owned(),
                values: vs.into_iter().map(|v| VALUES[v].to_owned()).collect(),
            });
        prop::option::weighted(
            0.4,
            (pairs(), prop::collection::vec(requirement, 0..2))
                .prop_map(|(match_labels, match_expressions)| LabelSelector { match_labels, match_expressions }),
        )
    }

    fn configurations() -> impl Strategy<Value = Vec<SlbConfiguration>> {
        prop::collection::vec((prop::option::of(any::<bool>()), selector(), selector()), 1..4).prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (allow, labels, namespace))| SlbConfiguration {
                    name: NAMES[i].to_owned(),
                    allow_service_placement: allow,
                    service_label_selector: labels,
                    service_namespace_selector: namespace,
                })
                .collect()
        })
    }

    fn facts() -> impl Strategy<Value = PlacementFacts> {
        let pool = prop::sample::select(vec!["shop-web", "SHOP-WEB-ipv6", "kubernetes", "shop-webby"]);
        let lb = (0..4usize, any::<bool>(), 0..3usize, prop::collection::vec(pool, 0..3)).prop_map(
            |(i, internal, rules, pools)| ExistingLoadBalancer {
                name: format!("{}{}", NAMES[i].to_ascii_lowercase(), if internal { "-internal" } else { "" }),
                rules: (0..rules).map(|r| format!("rule-{r}")).collect(),
                pools: pools.into_iter().map(str::to_owned).collect(),
                ..ExistingLoadBalancer::default()
            },
        );
        (pairs(), prop::option::of(pairs()), prop::option::of(0..4usize), prop::collection::vec(lb, 0..4)).prop_map(
            |(service_labels, namespace_labels, current, load_balancers)| PlacementFacts {
                service_labels,
                namespace_labels,
                current_load_balancer: current.map(|i| NAMES[i].to_owned()),
                load_balancers,
                ..PlacementFacts::default()
            },
        )
    }

    fn annotation() -> impl Strategy<Value = Option<String>> {
        prop::option::weighted(0.3, prop::sample::select(vec!["lb1", "lb2, LB3", " kubernetes ", "nope", ""]))
            .prop_map(|a| a.map(str::to_owned))
    }

    proptest! {
        // Placement is total, picks only an eligible configuration, and is stable: placed
        // again with its answer as the load balancer in use (what the host records), a
        // Service stays where it is while nothing else changes, as upstream's first rule
        // keeps a Service on the load balancer it uses.
        #[test]
        fn a_placed_service_goes_on_an_eligible_configuration_and_stays_there(
            configurations in configurations(),
            facts in facts(),
            annotation in annotation(),
        ) {
            let service = local(annotation.as_deref());
            let Ok(Some(placed)) = place_service(&configurations, &service, &facts) else { return Ok(()) };
            let current = current(&service, &facts);
            let eligible = eligible(&configurations, &service, &facts, current.as_deref()).unwrap();
            prop_assert!(eligible.iter().any(|c| c.name == placed.load_balancer), "{placed:?} not in {eligible:?}");
            // What it left is named as its own, and is not where it is now.
            for gone in &placed.left {
                prop_assert!(gone.pool.eq_ignore_ascii_case("shop-web") || gone.pool.eq_ignore_ascii_case("shop-web-ipv6"));
                let kept = gone.load_balancer.eq_ignore_ascii_case(&placed.load_balancer)
                    && placed.pools.iter().any(|p| p.name.eq_ignore_ascii_case(&gone.pool));
                prop_assert!(!kept, "{gone:?} is in use");
            }
            let again = PlacementFacts { current_load_balancer: Some(placed.load_balancer.clone()), ..facts };
            prop_assert_eq!(place_service(&configurations, &service, &again), Ok(Some(placed)));
        }
    }
}
