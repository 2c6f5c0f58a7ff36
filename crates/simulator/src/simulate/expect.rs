//! A scenario's expectations, checked against the emulator and the cluster: the NRP state, the
//! commands and Events, the Services' status and finalizers, the pools, the logic's figures
//! (`expect.metrics`), and the invariants every settled run must hold (P1-P6 as the simulator
//! sees them; a pod finalizer released only after its addresses left NRP).

use super::*;

impl Simulation<'_> {
    /// `expect.metrics`: the logic's figures read now, rendered as `/metrics` renders them (its
    /// counters kept monotonic across restarts and swaps, as there).
    pub(super) fn expect_metrics(&mut self, want: &BTreeMap<String, f64>) -> Result<Vec<Check>, LogicError> {
        if want.is_empty() {
            return Ok(Vec::new());
        }
        let stats = self.logic.stats(self.now)?;
        self.figures.update("logic", stats, self.now);
        let exposition = self.figures.exposition("logic", self.now);
        Ok(want
            .iter()
            .map(|(sample, value)| {
                let found = exposition
                    .lines()
                    .find_map(|line| line.strip_prefix(sample.as_str())?.strip_prefix(' '))
                    .map(|v| v.split(' ').next().unwrap_or(v).parse::<f64>().unwrap_or(f64::NAN));
                let detail = match found {
                    Some(found) if found == *value => None,
                    Some(found) => Some(format!("found {found}")),
                    None => {
                        let family = sample.split('{').next().unwrap_or(sample);
                        let near: Vec<&str> = exposition.lines().filter(|l| l.starts_with(family)).collect();
                        Some(format!(
                            "no such sample; {family} has: {}",
                            if near.is_empty() { "nothing".into() } else { near.join(", ") }
                        ))
                    }
                };
                Check { what: format!("metric {sample} = {value}"), ok: detail.is_none(), detail }
            })
            .collect())
    }

    pub(super) fn expect(&mut self, expectation: &Expectation) -> Vec<Check> {
        let mut checks = Vec::new();
        let resources = self.emulator.resources();
        let view = nrp_view(&resources);
        let mut check = |what: String, found: Option<String>| {
            checks.push(Check { what, ok: found.is_none(), detail: found });
        };
        if let Some(nrp) = &expectation.nrp {
            if let Some(services) = &nrp.services {
                let found = (&view.services != services).then(|| format!("found {:?}", view.services));
                check(format!("nrp.services = {services:?}"), found);
            }
            if let Some(locations) = &nrp.locations {
                let want: NrpLocations = locations
                    .iter()
                    .map(|(l, a)| (l.0.clone(), a.iter().map(|(a, s)| (a.0.clone(), s.clone())).collect()))
                    .collect();
                let found = (view.locations != want).then(|| format!("found {}", locations_text(&view.locations)));
                check(format!("nrp.locations = {}", locations_text(&want)), found);
            }
            if let Some(outbound) = &nrp.outbound_services {
                let found: BTreeSet<String> = resources
                    .services
                    .iter()
                    .filter(|(_, s)| !s.is_default && s.service_type.eq_ignore_ascii_case("Outbound"))
                    .map(|(name, _)| name.clone())
                    .collect();
                let what = format!("nrp.outboundServices = {outbound:?}");
                check(what, (&found != outbound).then(|| format!("found {found:?}")));
            }
        }
        for (object, want) in &expectation.status {
            let service = self.cluster.service(&object.namespace, &object.name);
            let ingress: Vec<String> = service
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .map(|i| i.iter().filter_map(|i| i.ip.clone()).collect())
                .unwrap_or_default();
            let holds = match want {
                StatusExpectation::Present => !ingress.is_empty(),
                StatusExpectation::Absent => ingress.is_empty(),
                StatusExpectation::Deleted => service.is_none(),
                StatusExpectation::Ip(ip) => ingress == [ip.clone()],
            };
            let found = match &service {
                None => "the Service does not exist".to_owned(),
                Some(_) if ingress.is_empty() => "no ingress IP".to_owned(),
                Some(_) => format!("ingress {ingress:?}"),
            };
            check(format!("status {object}: {want}"), (!holds).then_some(found));
        }
        let pods = self.cluster.pods();
        for (object, want) in &expectation.pod_finalizers {
            let pod = pods.iter().find(|p| {
                p.metadata.namespace.as_deref() == Some(object.namespace.as_str())
                    && p.metadata.name.as_deref() == Some(object.name.as_str())
            });
            let finalizers: Option<BTreeSet<String>> =
                pod.map(|p| p.metadata.finalizers.clone().unwrap_or_default().into_iter().collect());
            let holds = match want {
                PodFinalizersExpectation::Exactly(want) => finalizers.as_ref() == Some(want),
                PodFinalizersExpectation::Deleted => finalizers.is_none(),
            };
            let found = match &finalizers {
                None => "the Pod does not exist".to_owned(),
                Some(f) => format!("finalizers {f:?}"),
            };
            check(format!("podFinalizers {object}: {want}"), (!holds).then_some(found));
        }
        let events = self.cluster.events();
        for want in &expectation.events {
            let object = want.object.to_string();
            let type_name = want.event_type.map(|t| match t {
                EventTypeName::Normal => "Normal",
                EventTypeName::Warning => "Warning",
            });
            let matching = events
                .iter()
                .filter(|e| {
                    e.reason == want.reason && e.object == object && type_name.is_none_or(|t| e.event_type == t)
                })
                .count();
            let holds = want.count.map_or(matching > 0, |n| matching == n);
            let found = events.iter().filter(|e| e.object == object).map(|e| e.reason.as_str()).collect::<Vec<_>>();
            let times = want.count.map(|n| format!(" ×{n}")).unwrap_or_default();
            let what = format!(
                "event {}{} on {object}{times}",
                type_name.map(|t| format!("{t} ")).unwrap_or_default(),
                want.reason
            );
            check(what, (!holds).then(|| format!("events on {object}: {found:?}")));
        }
        if let Some(want) = &expectation.logic {
            match self.logic.supervised().map(|logic| logic.logic_status()) {
                None => check("logic".into(), Some("this run's reconciler has no supervised logic".into())),
                Some(status) => {
                    if let Some(serving) = &want.serving {
                        let found =
                            (status.serving != serving.to_string()).then(|| format!("found {}", status.serving));
                        check(format!("logic.serving = {serving}"), found);
                    }
                    if let Some(rollbacks) = want.rollbacks {
                        let found = (status.rollbacks != rollbacks).then(|| format!("found {}", status.rollbacks));
                        check(format!("logic.rollbacks = {rollbacks}"), found);
                    }
                    if let Some(quarantined) = want.quarantined_inputs {
                        let found =
                            (status.quarantined != quarantined).then(|| format!("found {}", status.quarantined));
                        check(format!("logic.quarantinedInputs = {quarantined}"), found);
                    }
                }
            }
        }
        if let Some(want) = &expectation.shadow {
            match self.logic.supervised().and_then(|logic| logic.shadow_status()) {
                None => check("shadow".into(), Some("no candidate ran in shadow".into())),
                Some(status) => {
                    if let Some(divergences) = &want.divergences {
                        let found =
                            (&status.divergences != divergences).then(|| format!("found {:?}", status.divergences));
                        check(format!("shadow.divergences = {divergences:?}"), found);
                    }
                    if let Some(promoted) = want.promoted {
                        let is = status.state == ShadowState::Promoted;
                        let found = (is != promoted).then(|| {
                            format!("found {is} ({} inputs compared, the last {} clean)", status.compared, status.clean)
                        });
                        check(format!("shadow.promoted = {promoted}"), found);
                    }
                }
            }
        }
        if !expectation.azure_calls.is_empty() {
            let calls = self.emulator.state().requests;
            for (op, want) in &expectation.azure_calls {
                let made = calls.get(op.name()).copied().unwrap_or(0);
                check(format!("azure calls {op} = {want}"), (made != *want).then(|| format!("found {made}")));
            }
        }
        if let Some(want) = &expectation.resources {
            if let Some(ips) = &want.public_ips {
                let found: BTreeSet<String> = resources.public_ips.keys().cloned().collect();
                check(format!("resources.publicIps = {ips:?}"), (&found != ips).then(|| format!("found {found:?}")));
            }
            if let Some(lbs) = &want.load_balancers {
                let found: BTreeSet<String> = resources.load_balancers.keys().cloned().collect();
                let what = format!("resources.loadBalancers = {lbs:?}");
                check(what, (&found != lbs).then(|| format!("found {found:?}")));
            }
            if let Some(gateways) = &want.nat_gateways {
                let found: BTreeSet<String> = resources.nat_gateways.keys().cloned().collect();
                let what = format!("resources.natGateways = {gateways:?}");
                check(what, (&found != gateways).then(|| format!("found {found:?}")));
            }
        }
        for (name, want) in &expectation.backend_pools {
            let found = pools::azure_pool(&resources, &name.load_balancer, &name.pool);
            let detail = match (want, found) {
                (PoolExpectation::Deleted, None) => None,
                (PoolExpectation::Deleted, Some(found)) => Some(format!("found a pool holding {found:?}")),
                (PoolExpectation::Holds(_), None) => Some("no such backend pool".to_owned()),
                (PoolExpectation::Holds(ips), Some(found)) => {
                    let ips: BTreeSet<String> = ips.iter().map(|ip| ip.0.clone()).collect();
                    (found != ips).then(|| format!("found {found:?}"))
                }
            };
            check(format!("backendPools {name} = {want}"), detail);
        }
        if expectation.invariants {
            checks.extend(self.invariants(&view));
        }
        checks
    }

    /// P5/P6 of upstream §j, from what NRP refused, and the convergence of NRP to the cluster.
    pub(super) fn invariants(&self, view: &NrpView) -> Vec<Check> {
        let log = self.emulator.state().log;
        // A deposed leader's late write that Azure refused is Azure guarding the order against
        // a writer that no longer leads, not this controller breaking it.
        let excused = |i: &usize| self.excused.iter().any(|r| r.contains(i));
        let refused = |code: &str| -> Vec<String> {
            log.iter()
                .enumerate()
                .filter(|(i, _)| !excused(i))
                .map(|(_, e)| e)
                .filter(|e| !e.outcome.ends_with("(fault)") && e.outcome.split(' ').nth(1) == Some(code))
                .map(|e| format!("{} [{}]", e.operation, e.resources.join(", ")))
                .collect()
        };
        let mut checks = Vec::new();
        for (what, codes) in [
            (
                "no service unregistered while addresses reference it",
                &["ServiceWithOverlayMappingsCannotBeDeleted"][..],
            ),
            ("no address names an unregistered service", &["ServiceNotFound"]),
            (
                "the outbound order held: public IPs before their NAT gateway, the NAT gateway before the \
                 registration, disassociation and unregistering before the deletes",
                &[
                    "InvalidResourceReference",
                    "NatGatewayNotAssociatedWithServiceGateway",
                    "NatGatewayInUseByServiceGateway",
                    "InUseNatGatewayCannotBeDeleted",
                    "PublicIPAddressInUse",
                ],
            ),
        ] {
            let found: Vec<String> = codes.iter().flat_map(|code| refused(code)).collect();
            let detail =
                (!found.is_empty()).then(|| format!("Azure refused with {}: {}", codes.join("/"), found.join("; ")));
            checks.push(Check { what: what.to_owned(), ok: detail.is_none(), detail });
        }
        let (mut expected, strays) = self.ready_view(&view.services);
        self.add_egress(&mut expected);
        let detail = (!strays.is_empty())
            .then(|| format!("registered, but no live Service has the UID: {strays:?}"))
            .or_else(|| {
                (expected != view.locations)
                    .then(|| format!("the cluster's ready endpoints give {}", locations_text(&expected)))
            });
        checks.push(Check {
            what: "NRP holds exactly the ready endpoints of the registered live Services and the egress pods of the \
                   registered Outbound services"
                .into(),
            ok: detail.is_none(),
            detail,
        });
        checks.extend(self.egress_invariants());
        checks
    }

    /// The outbound rules, from the emulator's resources and the cluster: an Outbound service
    /// registered with a NAT gateway has that NAT gateway, associated (NRP refuses the
    /// reference otherwise, but a later delete could break it); every NAT gateway belongs to a
    /// registered Outbound service that names it (none is left behind by a teardown); and an
    /// Outbound service the controller registered with its NAT gateway is carried by a live pod
    /// (the last pod's going tears it down). Outbound services registered before the first step
    /// carry no NAT gateway: somebody else's, left alone.
    pub(super) fn egress_invariants(&self) -> Vec<Check> {
        let resources = self.emulator.resources();
        let linked: BTreeMap<String, String> = resources
            .services
            .iter()
            .filter(|(_, s)| s.service_type.eq_ignore_ascii_case("Outbound") && !s.is_default)
            .filter_map(|(name, s)| {
                let id = s.public_nat_gateway_id.as_ref()?;
                Some((name.to_ascii_lowercase(), id.rsplit('/').next().unwrap_or_default().to_owned()))
            })
            .collect();
        let carried: BTreeSet<String> = self
            .cluster
            .pods()
            .iter()
            .map(clb_executor::records::pod)
            .filter(|p| matches!(p.phase.as_deref(), Some("Running" | "Pending")) && !p.deleting)
            .filter_map(|p| p.egress_label.map(|l| l.to_ascii_lowercase()))
            .collect();
        let broken: Vec<String> = linked
            .iter()
            .filter(|(_, nat)| !resources.nat_gateways.get(*nat).is_some_and(|n| n.associated))
            .map(|(service, nat)| format!("{service} → {nat}"))
            .collect();
        let stray: Vec<&String> =
            resources.nat_gateways.keys().filter(|nat| !linked.values().any(|l| l == *nat)).collect();
        let uncarried: Vec<&String> = linked.keys().filter(|service| !carried.contains(*service)).collect();
        let check = |what: &str, detail: Option<String>| Check { what: what.to_owned(), ok: detail.is_none(), detail };
        let early = &self.early_releases;
        vec![
            check(
                "an egress pod's finalizer was released only after its addresses left NRP (the last pod's, after the teardown)",
                (!early.is_empty()).then(|| early.join("; ")),
            ),
            check(
                "an Outbound service registered with a NAT gateway has it, associated",
                (!broken.is_empty()).then(|| format!("missing or not associated: {broken:?}")),
            ),
            check(
                "every NAT gateway belongs to a registered Outbound service",
                (!stray.is_empty()).then(|| format!("named by no registered Outbound service: {stray:?}")),
            ),
            check(
                "an Outbound service registered with its NAT gateway is carried by a live pod",
                (!uncarried.is_empty()).then(|| format!("no live pod carries {uncarried:?}")),
            ),
        ]
    }

    /// The egress pod a command releases the pod finalizer of, as it is before the release.
    pub(super) fn pod_release(&self, command: &wit::Command) -> Option<wit::Pod> {
        let wit::Command::SetFinalizer(change) = command else { return None };
        if change.present || change.service.kind != "Pod" {
            return None;
        }
        let (namespace, name) = (&change.service.namespace, &change.service.name);
        let pods = self.cluster.pods();
        let pod = pods.iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace.as_str()) && p.metadata.name.as_deref() == Some(name)
        })?;
        Some(clb_executor::records::pod(pod))
    }

    /// The invariant "a pod is released only after its addresses left NRP": once an egress
    /// pod's finalizer is released, NRP maps none of its IPs to the identity its label
    /// names (unless a live pod with that label has the IP now), and an identity no live pod
    /// carries any more has no NAT gateway left (the last pod waits for the teardown).
    pub(super) fn release_checked(&mut self, pod: &wit::Pod) {
        let Some(identity) = pod.egress_label.as_deref().map(str::to_ascii_lowercase).filter(|l| !l.is_empty()) else {
            return;
        };
        let live: Vec<wit::Pod> = self
            .cluster
            .pods()
            .iter()
            .map(clb_executor::records::pod)
            .filter(|p| matches!(p.phase.as_deref(), Some("Running" | "Pending")) && !p.deleting)
            .filter(|p| p.egress_label.as_deref().is_some_and(|l| l.eq_ignore_ascii_case(&identity)))
            .collect();
        let ips = |p: &wit::Pod| -> BTreeSet<String> {
            p.pod_ips.iter().chain(&p.pod_ip).map(|ip| clb_executor::pool_producer::canonical_ip(ip)).collect()
        };
        let kept: BTreeSet<String> = live.iter().flat_map(ips).collect();
        let view = nrp_view(&self.emulator.resources());
        for ip in ips(pod).difference(&kept) {
            if view.locations.values().filter_map(|a| a.get(ip)).any(|services| services.contains(&identity)) {
                self.early_releases
                    .push(format!("pod {}/{} released while NRP maps {ip} to {identity}", pod.namespace, pod.name));
            }
        }
        if live.is_empty() && self.emulator.resources().nat_gateways.contains_key(&identity) {
            self.early_releases.push(format!(
                "pod {}/{}, the last pod of {identity}, released before its NAT gateway was deleted",
                pod.namespace, pod.name
            ));
        }
    }

    /// Adds what NRP should hold for egress: each IP of a Running or Pending pod, not being
    /// deleted, whose egress label (lower-cased) names a registered Outbound service, under the
    /// pod's smallest host IP of the same family (the checker's own statement of the rule).
    pub(super) fn add_egress(&self, expected: &mut NrpLocations) {
        let outbound: BTreeSet<String> = self
            .emulator
            .resources()
            .services
            .iter()
            .filter(|(_, s)| s.service_type.eq_ignore_ascii_case("Outbound") && !s.is_default)
            .map(|(name, _)| name.to_ascii_lowercase())
            .collect();
        let ips = |list: Vec<String>, single: Option<String>| -> Vec<std::net::IpAddr> {
            let texts = if list.is_empty() { single.into_iter().collect() } else { list };
            texts.iter().filter_map(|ip| ip.trim().parse().ok()).collect()
        };
        for pod in self.cluster.pods() {
            let pod = clb_executor::records::pod(&pod);
            let Some(identity) = pod.egress_label.as_ref().map(|l| l.to_ascii_lowercase()) else { continue };
            let live = matches!(pod.phase.as_deref(), Some("Running" | "Pending")) && !pod.deleting;
            if !live || !outbound.contains(&identity) {
                continue;
            }
            let hosts = ips(pod.host_ips, pod.host_ip);
            for address in ips(pod.pod_ips, pod.pod_ip) {
                let host = hosts.iter().filter(|h| h.is_ipv4() == address.is_ipv4()).map(|h| h.to_string()).min();
                if let Some(location) = host {
                    let services = expected.entry(location).or_default().entry(address.to_string()).or_default();
                    services.insert(identity.clone());
                }
            }
        }
    }

    /// The locations NRP should hold for `registered`, from the cluster's objects: each ready
    /// endpoint of a live Service's slices, under its node's smallest InternalIP of the same
    /// family. This is the checker's own statement of the rule, independent of the guest's.
    /// Also returns the registered services that belong to no live Service.
    pub(super) fn ready_view(&self, registered: &BTreeSet<String>) -> (NrpLocations, Vec<String>) {
        let live: BTreeSet<String> = self
            .cluster
            .services()
            .iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none())
            .filter_map(|s| s.metadata.uid.as_ref().map(|u| u.to_ascii_lowercase()))
            .collect();
        let strays: Vec<String> = registered.iter().filter(|s| !live.contains(*s)).cloned().collect();
        let nodes: BTreeMap<String, Vec<std::net::IpAddr>> = self
            .cluster
            .nodes()
            .iter()
            .map(|n| {
                let ips = clb_executor::records::node(n)
                    .internal_ips
                    .iter()
                    .filter_map(|ip| ip.trim().parse().ok())
                    .collect();
                (n.metadata.name.clone().unwrap_or_default(), ips)
            })
            .collect();
        let mut expected = NrpLocations::new();
        for slice in self.cluster.slices() {
            let slice = clb_executor::records::endpoint_slice(&slice);
            let Some(owner) = slice.owner_service_uid.as_ref().map(|u| u.to_ascii_lowercase()) else { continue };
            if slice.deleting || !registered.contains(&owner) || !live.contains(&owner) {
                continue;
            }
            for endpoint in slice.endpoints.iter().filter(|e| e.ready != Some(false)) {
                let Some(node_ips) = endpoint.node_name.as_ref().and_then(|n| nodes.get(n)) else { continue };
                for address in endpoint.addresses.iter().filter_map(|a| a.trim().parse::<std::net::IpAddr>().ok()) {
                    let location =
                        node_ips.iter().filter(|ip| ip.is_ipv4() == address.is_ipv4()).map(|ip| ip.to_string()).min();
                    if let Some(location) = location {
                        let services = expected.entry(location).or_default().entry(address.to_string()).or_default();
                        services.insert(owner.clone());
                    }
                }
            }
        }
        (expected, strays)
    }
}
