//! Service→load-balancer placement in multi-SLB local-service mode (design §3 and §5, upstream
//! §e): which Services are local Services, which configured load balancer each one goes on, and
//! the backend pool it owns there.
//!
//! The rules, in order:
//! 1. only a local Service is placed: `spec.type: LoadBalancer` (as admission compares it),
//!    `externalTrafficPolicy: Local` (case-insensitive), not deleting, and no other controller's
//!    `spec.loadBalancerClass`;
//! 2. the annotation [`ANNOTATION_LB_CONFIGURATIONS`] (a comma-separated list of configuration
//!    names) places it on the first name that is in the configuration list, compared
//!    case-insensitively and spelled as the configuration spells it;
//! 3. else (no annotation, or none of its names is configured) it goes on the first configuration
//!    that allows placement (`allowServicePlacement`, absent meaning true);
//! 4. else it is not placed.
//!
//! The pool is named after the Service as upstream's `getLocalServiceBackendPoolName` does for
//! IPv4: `namespace/name` with the `/` made `-`.

use crate::model::Service;
use serde::{Deserialize, Serialize};

/// The upstream annotation naming the load-balancer configuration(s) a Service may go on.
pub const ANNOTATION_LB_CONFIGURATIONS: &str = "service.beta.kubernetes.io/azure-load-balancer-configurations";

/// One entry of `multipleStandardLoadBalancerConfigurations`: the fields placement reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlbConfiguration {
    pub name: String,
    /// `allowServicePlacement`; absent means true.
    pub allow_service_placement: Option<bool>,
}

impl SlbConfiguration {
    fn allows_placement(&self) -> bool {
        self.allow_service_placement.unwrap_or(true)
    }
}

/// Where a local Service's backend pool lives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub load_balancer: String,
    pub pool: String,
}

/// Rule 1: whether the Service is a local Service this mode places.
pub fn is_local_service(service: &Service) -> bool {
    let other_class = service.load_balancer_class.as_deref().is_some_and(|c| !c.is_empty());
    let load_balancer = service.service_type.as_deref() == Some("LoadBalancer");
    let local = service.external_traffic_policy.as_deref().is_some_and(|p| p.trim().eq_ignore_ascii_case("Local"));
    load_balancer && local && !service.deleting && !other_class
}

/// The backend pool of a local Service on its load balancer.
pub fn local_pool_name(service: &Service) -> String {
    format!("{}-{}", service.namespace, service.name)
}

/// The load balancer (and pool) of a Service, or `None` when it is not placed (rules above).
pub fn place_service(configurations: &[SlbConfiguration], service: &Service) -> Option<Placement> {
    if !is_local_service(service) {
        return None;
    }
    let named =
        service.annotation(ANNOTATION_LB_CONFIGURATIONS).into_iter().flat_map(|v| v.split(',')).find_map(|want| {
            let want = want.trim();
            configurations.iter().find(|c| !want.is_empty() && c.name.trim().eq_ignore_ascii_case(want))
        });
    let chosen = named.or_else(|| configurations.iter().find(|c| c.allows_placement()))?;
    Some(Placement { load_balancer: chosen.name.trim().to_owned(), pool: local_pool_name(service) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lb(name: &str, allow: Option<bool>) -> SlbConfiguration {
        SlbConfiguration { name: name.into(), allow_service_placement: allow }
    }

    fn local(annotation: Option<&str>) -> Service {
        Service {
            uid: "u1".into(),
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
        place_service(configurations, service).map(|p| p.load_balancer)
    }

    #[test]
    fn a_local_service_without_the_annotation_goes_on_the_first_configuration() {
        let placement = place_service(&[lb("kubernetes", None), lb("lb2", None)], &local(None));
        assert_eq!(placement, Some(Placement { load_balancer: "kubernetes".into(), pool: "shop-web".into() }));
    }

    #[test]
    fn a_configuration_that_disallows_placement_is_skipped_without_the_annotation() {
        let configs = [lb("kubernetes", Some(false)), lb("lb2", Some(true))];
        assert_eq!(placed_on(&configs, &local(None)).as_deref(), Some("lb2"));
    }

    #[test]
    fn no_configuration_allowing_placement_leaves_the_service_unplaced() {
        assert_eq!(placed_on(&[lb("kubernetes", Some(false))], &local(None)), None);
        assert_eq!(placed_on(&[], &local(None)), None);
    }

    #[test]
    fn the_annotation_places_the_service_on_the_first_named_configuration_that_exists() {
        let configs = [lb("kubernetes", None), lb("lb2", None), lb("lb3", None)];
        assert_eq!(placed_on(&configs, &local(Some("missing, lb3 ,lb2"))).as_deref(), Some("lb3"));
    }

    #[test]
    fn annotation_names_match_case_insensitively_and_keep_the_configured_spelling() {
        let configs = [lb("kubernetes", None), lb("LB-Two", None)];
        assert_eq!(placed_on(&configs, &local(Some("lb-two"))).as_deref(), Some("LB-Two"));
    }

    #[test]
    fn an_annotation_naming_only_unknown_configurations_falls_back_to_the_first_that_allows_placement() {
        let configs = [lb("kubernetes", Some(false)), lb("lb2", None)];
        assert_eq!(placed_on(&configs, &local(Some("nope, ,"))).as_deref(), Some("lb2"));
    }

    #[test]
    fn an_explicitly_named_configuration_is_used_even_when_it_disallows_new_placement() {
        let configs = [lb("kubernetes", None), lb("lb2", Some(false))];
        assert_eq!(placed_on(&configs, &local(Some("lb2"))).as_deref(), Some("lb2"));
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

    #[test]
    fn the_pool_is_named_after_the_namespace_and_the_name() {
        assert_eq!(local_pool_name(&local(None)), "shop-web");
    }
}
