//! Service→load-balancer placement in multi-SLB local-service mode (docs/design.md §3 and §5,
//! docs/upstream.md §e): which Services are local Services, which configured load balancer each one goes on, and
//! the backend pool it owns there.
//!
//! Only a local Service is placed: `spec.type: LoadBalancer` (as admission compares it),
//! `externalTrafficPolicy: Local` (case-insensitive), not deleting, and no other controller's
//! `spec.loadBalancerClass`. Its load balancer is chosen as upstream's
//! `getEligibleLoadBalancersForService` and `getMostEligibleLBForService` choose it:
//!
//! 1. **Eligible**, in the configurations' order:
//!    * the annotation [`ANNOTATION_LB_CONFIGURATIONS`] (comma-separated names, compared
//!      case-insensitively) keeps the configurations it names; naming none that exists is an
//!      error. Without it every configuration is a candidate;
//!    * `allowServicePlacement: false` drops a configuration unless the Service uses it now;
//!    * a `serviceLabelSelector` the Service's labels do not match, or a
//!      `serviceNamespaceSelector` its namespace's labels do not match, drops it;
//!    * none left is an error saying how many each rule dropped;
//!    * when a selector matched, the configurations without any selector are dropped.
//! 2. **Most eligible**: the load balancer the Service uses now, if eligible; else the first
//!    eligible one that exists (of the Service's kind: `-internal` or not) with no
//!    load-balancing rules; else the first that does not exist; else the one with the fewest
//!    rules (fewer than 301).
//!
//! "Uses now", for the placement flag, is what the host placed the Service on last (upstream's
//! `ActiveServices`); when the host has no record (a new leader), a load balancer holding a rule
//! named after the Service (`a` + its UID without dashes, 32 characters at most, then `-`) is the
//! one it uses, as upstream's start-up reconcile finds it. For step 2, as upstream's
//! `getAzureLoadBalancerName` has it, a Service that pins an IP uses the load balancer that IP
//! lives on (none when it lives on none), and one that pins nothing and names no configuration
//! uses the load balancer of its kind holding its primary frontend, if any ([`crate::pinning`]).
//! Pinning an IP and naming configurations is an error, as is an IP on a load balancer that is
//! not eligible.
//!
//! The load balancer is named as Azure names it: the configuration's name, with `-internal` for
//! an internal Service (upstream's `getAzureLoadBalancerName`). Its pools, one per IP family it
//! serves, are named as upstream's `getLocalServiceBackendPoolName` names them
//! ([`local_pools`]). Pools named as a Service's that a configured load balancer holds where the
//! Service is not ([`pools_left`]; all of them for a Service that is not local) are the pools it
//! left, which go.

use crate::admission::ANNOTATION_INTERNAL_LB;
use crate::model::Service;
use crate::pinning::{self, INTERNAL_SUFFIX, trim_internal};
use crate::selector::LabelSelector;
use serde::{Deserialize, Serialize};

pub use crate::pinning::{ExistingLoadBalancer, ExistingPublicIp, Frontend, PlacementFacts};

/// The upstream annotation naming the load-balancer configuration(s) a Service may go on.
pub const ANNOTATION_LB_CONFIGURATIONS: &str = "service.beta.kubernetes.io/azure-load-balancer-configurations";

/// Upstream's bound in `getMostEligibleLBForService`: a load balancer with this many rules or
/// more is never the one with the fewest.
const MAX_RULES: usize = 301;

/// One entry of `multipleStandardLoadBalancerConfigurations`: the fields placement reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlbConfiguration {
    pub name: String,
    /// `allowServicePlacement`; absent means true.
    pub allow_service_placement: Option<bool>,
    pub service_label_selector: Option<LabelSelector>,
    pub service_namespace_selector: Option<LabelSelector>,
}

impl SlbConfiguration {
    /// A configuration of this name that places by nothing but its name.
    pub fn named(name: &str) -> Self {
        Self { name: name.to_owned(), ..Self::default() }
    }

    fn has_selector(&self) -> bool {
        self.service_label_selector.is_some() || self.service_namespace_selector.is_some()
    }
}

/// Where a local Service's backend pools live.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// As Azure names it: the chosen configuration's name, with [`INTERNAL_SUFFIX`] for an
    /// internal Service (upstream's `getAzureLoadBalancerName`).
    pub load_balancer: String,
    /// One per family the Service serves, IPv4 first ([`local_pools`]).
    pub pools: Vec<FamilyPool>,
    /// Pools named as the Service's elsewhere ([`pools_left`]): they go.
    pub left: Vec<LeftPool>,
}

/// A backend pool a Service left, on one of the existing load balancers, as Azure spells both.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeftPool {
    pub load_balancer: String,
    pub pool: String,
}

/// One of a local Service's own backend pools: the nodes' InternalIPs of one family go into it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FamilyPool {
    pub ipv6: bool,
    pub name: String,
}

/// Whether the Service is a local Service this mode places.
pub fn is_local_service(service: &Service) -> bool {
    let other_class = service.load_balancer_class.as_deref().is_some_and(|c| !c.is_empty());
    let load_balancer = service.service_type.as_deref() == Some("LoadBalancer");
    let local = service.external_traffic_policy.as_deref().is_some_and(|p| p.trim().eq_ignore_ascii_case("Local"));
    load_balancer && local && !service.deleting && !other_class
}

/// The backend pool of a local Service's family on its load balancer (upstream's
/// `getLocalServiceBackendPoolName`: `<namespace>-<name>`, `-ipv6` for IPv6, lower-cased).
pub fn local_pool_name(service: &Service, ipv6: bool) -> String {
    let name = format!("{}-{}", service.namespace, service.name).to_ascii_lowercase();
    if ipv6 { format!("{name}-ipv6") } else { name }
}

/// The pools of a local Service, one per family it serves, IPv4 first: upstream's
/// `getServiceIPFamily` reads two families as dual-stack, a family `IPv6` as IPv6, anything
/// else (no family included) as IPv4.
pub fn local_pools(service: &Service) -> Vec<FamilyPool> {
    let families: &[bool] = if service.ip_families.len() > 1 {
        &[false, true]
    } else if service.ip_families.iter().any(|f| f == "IPv6") {
        &[true]
    } else {
        &[false]
    };
    families.iter().map(|&ipv6| FamilyPool { ipv6, name: local_pool_name(service, ipv6) }).collect()
}

/// The names the annotation lists, lower-cased and trimmed (upstream's
/// `GetLoadBalancerConfigurationsNames`: the key is matched case-insensitively, and an empty
/// value names the empty name); empty when the Service has no such annotation.
fn annotated_names(service: &Service) -> Vec<String> {
    service
        .annotations
        .iter()
        .filter(|(key, _)| key.eq_ignore_ascii_case(ANNOTATION_LB_CONFIGURATIONS))
        .flat_map(|(_, value)| value.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect()
}

/// The prefix of the rules upstream names after a Service: `a` + its UID without dashes,
/// 32 characters at most.
fn rule_prefix(service: &Service) -> String {
    std::iter::once('a').chain(service.uid.chars().filter(|c| *c != '-')).take(32).collect()
}

/// The configuration the Service uses now: the host's record (placement's answer, so an
/// internal one's `-internal` is cut), else the one holding a rule named after it.
fn current(service: &Service, facts: &PlacementFacts) -> Option<String> {
    if let Some(current) = &facts.current_load_balancer {
        return Some(trim_internal(current).0.to_owned());
    }
    let prefix = rule_prefix(service);
    let named_after = |rule: &String| rule.split('-').next().is_some_and(|p| p.eq_ignore_ascii_case(&prefix));
    facts
        .load_balancers
        .iter()
        .find(|lb| lb.rules.iter().any(named_after))
        .map(|lb| trim_internal(&lb.name).0.to_owned())
}

/// Step 1 (upstream's `getEligibleLoadBalancersForService`): the eligible configurations, in
/// configuration order. Upstream walks them last to first, so the names in its error, and the
/// first selector it finds invalid, come in that order here too.
pub fn eligible<'c>(
    configurations: &'c [SlbConfiguration],
    service: &Service,
    facts: &PlacementFacts,
    current: Option<&str>,
) -> Result<Vec<&'c SlbConfiguration>, String> {
    let annotated = annotated_names(service);
    let candidates: Vec<&SlbConfiguration> = if annotated.is_empty() {
        configurations.iter().collect()
    } else {
        let named: Vec<_> =
            configurations.iter().filter(|c| annotated.iter().any(|a| c.name.trim().eq_ignore_ascii_case(a))).collect();
        if named.is_empty() {
            return Err(format!(
                "service {:?} selects {} load balancers by annotation, but none of them is defined in cloud provider \
                 configuration",
                service.name,
                annotated.len()
            ));
        }
        named
    };
    let (mut by_flag, mut by_labels, mut by_namespace) = (Vec::new(), Vec::new(), Vec::new());
    let mut selector_matched = false;
    let mut kept = Vec::with_capacity(candidates.len());
    for candidate in candidates.iter().rev() {
        let in_use = current.is_some_and(|c| c.eq_ignore_ascii_case(candidate.name.trim()));
        if candidate.allow_service_placement == Some(false) && !in_use {
            by_flag.push(candidate.name.as_str());
            continue;
        }
        if let Some(selector) = &candidate.service_label_selector {
            if !selector.select(&facts.service_labels)? {
                by_labels.push(candidate.name.as_str());
                continue;
            }
            selector_matched = true;
        }
        if let Some(selector) = &candidate.service_namespace_selector {
            selector.check()?;
            let Some(labels) = &facts.namespace_labels else {
                return Err(format!("namespaces {:?} not found", service.namespace));
            };
            if !selector.satisfied_by(labels) {
                by_namespace.push(candidate.name.as_str());
                continue;
            }
            selector_matched = true;
        }
        kept.push(*candidate);
    }
    kept.reverse();
    if kept.is_empty() {
        let selected: Vec<&str> = candidates.iter().map(|c| c.name.as_str()).collect();
        return Err(format!(
            "service \"{}/{}\" selects {} load balancers ({}), but {} of them ({}) have AllowServicePlacement set to \
             false and the service is not using any of them, {} of them ({}) do not match the service label selector, \
             and {} of them ({}) do not match the service namespace selector",
            service.namespace,
            service.name,
            selected.len(),
            selected.join(", "),
            by_flag.len(),
            by_flag.join(", "),
            by_labels.len(),
            by_labels.join(", "),
            by_namespace.len(),
            by_namespace.join(", "),
        ));
    }
    if selector_matched {
        kept.retain(|c| c.has_selector());
    }
    Ok(kept)
}

/// Step 2 (upstream's `getMostEligibleLBForService`): the most eligible of the `eligible`
/// names, as spelled there; `None` when every one exists with [`MAX_RULES`] rules or more.
pub fn most_eligible<'e>(
    current: Option<&str>,
    eligible: &[&'e str],
    existing: &[ExistingLoadBalancer],
    internal: bool,
) -> Option<&'e str> {
    if let Some(current) = current.and_then(|c| eligible.iter().find(|e| e.eq_ignore_ascii_case(c))) {
        return Some(current);
    }
    // The existing load balancers of the Service's kind, by their configuration's name.
    let of_kind = || {
        existing.iter().filter_map(move |lb| {
            let (name, is_internal) = trim_internal(&lb.name);
            (is_internal == internal).then_some((name, lb.rules.len()))
        })
    };
    let mut first_absent = None;
    for name in eligible {
        match of_kind().find(|(n, _)| n.eq_ignore_ascii_case(name)) {
            Some((_, 0)) => return Some(name),
            Some(_) => {}
            None => first_absent = first_absent.or(Some(*name)),
        }
    }
    if first_absent.is_some() {
        return first_absent;
    }
    let mut fewest: Option<(usize, &str)> = None;
    for (name, rules) in of_kind() {
        let Some(eligible) = eligible.iter().find(|e| e.eq_ignore_ascii_case(name)) else { continue };
        if rules < fewest.map_or(MAX_RULES, |(n, _)| n) {
            fewest = Some((rules, eligible));
        }
    }
    fewest.map(|(_, name)| name)
}

/// The load balancer (and pools) of a Service; `Ok(None)` when it is not a local Service; an
/// error (upstream's words) when it is one that cannot be placed.
pub fn place_service(
    configurations: &[SlbConfiguration],
    service: &Service,
    facts: &PlacementFacts,
) -> Result<Option<Placement>, String> {
    if !is_local_service(service) {
        return Ok(None);
    }
    let pins = pinning::pins_ip(service);
    let annotated = !annotated_names(service).is_empty();
    if pins && annotated {
        return Err(format!(
            "service {:?} has conflicting load balancer configuration: both a load balancer name \
             ({ANNOTATION_LB_CONFIGURATIONS}) and an IP address are specified. When an IP address is specified (via \
             spec.loadBalancerIP, azure-load-balancer-ipv4/ipv6, or azure-pip-name), the service must use the load \
             balancer where that IP resides. To fix, either (1) remove the {ANNOTATION_LB_CONFIGURATIONS} annotation \
             to stay on the load balancer where the IP resides, or (2) remove the IP annotation to move to the \
             specified load balancer (external services only)",
            service.name
        ));
    }
    let recorded = current(service, facts);
    let eligible = eligible(configurations, service, facts, recorded.as_deref())?;
    let names: Vec<&str> = eligible.iter().map(|c| c.name.trim()).collect();
    // Upstream's `requiresInternalLoadBalancer`: exactly `true` (admission, which refuses internal
    // load balancers in CLB mode, reads it more leniently).
    let internal = service.annotation(ANNOTATION_INTERNAL_LB) == Some("true");
    let in_use = if pins {
        let found =
            if internal { pinning::by_private_ip(service, facts) } else { pinning::by_public_ip(service, facts)? };
        if let Some(found) = &found
            && !names.iter().any(|n| n.eq_ignore_ascii_case(found))
        {
            return Err(format!(
                "service {:?} specifies an IP that resides on load balancer {found:?}, which is not in the eligible set \
                 [{}]; check or adjust the load balancer eligibility configuration (ServiceLabelSelector, \
                 ServiceNamespaceSelector, or AllowServicePlacement)",
                service.name,
                names.join(" ")
            ));
        }
        found
    } else if annotated {
        recorded
    } else {
        pinning::by_frontend_name(facts, &rule_prefix(service), internal).or(recorded)
    };
    let Some(chosen) = most_eligible(in_use.as_deref(), &names, &facts.load_balancers, internal) else {
        return Err(format!(
            "every eligible load balancer of service \"{}/{}\" ({}) has {MAX_RULES} load-balancing rules or more",
            service.namespace,
            service.name,
            names.join(", ")
        ));
    };
    let load_balancer = if internal { format!("{chosen}{INTERNAL_SUFFIX}") } else { chosen.to_owned() };
    let pools = local_pools(service);
    let left = pools_left(configurations, service, facts, Some((&load_balancer, &pools)));
    Ok(Some(Placement { load_balancer, pools, left }))
}

/// The pools named as the Service's, either family (upstream's `localServiceOwnsBackendPool`),
/// that a configuration's existing load balancer holds, except those of `kept` (its load
/// balancer and pools, when it is placed): the pools it left, which go, as upstream's
/// `cleanupLocalServiceBackendPool` deletes them. What a host that ran all along would have
/// deleted already; one that starts finds them here.
pub fn pools_left(
    configurations: &[SlbConfiguration],
    service: &Service,
    facts: &PlacementFacts,
    kept: Option<(&str, &[FamilyPool])>,
) -> Vec<LeftPool> {
    let owned = [local_pool_name(service, false), local_pool_name(service, true)];
    let configured = |lb: &str| {
        let name = trim_internal(lb).0;
        configurations.iter().any(|c| c.name.trim().eq_ignore_ascii_case(name))
    };
    let is_kept = |lb: &str, pool: &str| {
        kept.is_some_and(|(on, pools)| {
            on.eq_ignore_ascii_case(lb) && pools.iter().any(|p| p.name.eq_ignore_ascii_case(pool))
        })
    };
    let mut left = Vec::new();
    for lb in facts.load_balancers.iter().filter(|lb| configured(&lb.name)) {
        for pool in &lb.pools {
            if owned.iter().any(|o| o.eq_ignore_ascii_case(pool)) && !is_kept(&lb.name, pool) {
                left.push(LeftPool { load_balancer: lb.name.clone(), pool: pool.clone() });
            }
        }
    }
    left
}

// By path, so that it resolves the same where `tests/next-guest` includes this file by path.
#[cfg(test)]
#[path = "placement/tests.rs"]
mod tests;
