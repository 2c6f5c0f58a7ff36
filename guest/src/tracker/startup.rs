//! Start-up: the one read of ARM's inventory and what it is for: adopting what already holds
//! what a Service or an egress identity wants, and sweeping what Services and egress identities
//! deleted while no controller ran left behind.

use super::cache::KubeCache;
use super::egress::EgressSide;
use super::egress::outbound;
use super::inbound::Inbound;
use super::nrp::*;
use super::outbox::*;
use super::service::*;
use crate::keyed::Map;
use crate::lifecycle::{retry_delay, timing};
use crate::model::*;
use serde::{Deserialize, Serialize};

/// Start-up: the inventory of ARM, read once ([`ArmSync`]), and whether start-up reconciliation
/// against NRP has run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Startup {
    pub(super) arm: ArmSync,
    pub(super) reconciled: bool,
}

/// The start-up inventory of ARM (state version 4): the resource group's public IPs and load
/// balancers, read once so that what already holds what a Service wants is
/// adopted instead of written again, and so that load balancers and public IPs of Services
/// deleted while no controller ran are found. It is read once the lists are complete and NRP is
/// read, and used the moment it arrives (start-up reconciliation waits for it), so the state
/// never holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ArmSync {
    /// Start-up reconciliation may run: the inventory was used, or reading it was given up.
    pub(super) settled: bool,
    pub(super) read_in_flight: bool,
    pub(super) read_retries: u32,
    pub(super) next_read_ms: u64,
}

impl ArmSync {
    /// A state from before version 4: nothing to read, nothing to adopt.
    pub(super) fn settled() -> Self {
        Self { settled: true, ..Self::default() }
    }
}

/// Whether a listed load balancer holds what `wanted` says: rules compared as a set (ARM may
/// list them in another order; rule names are unique on a load balancer). A few rules each: a
/// scan, not a sort, which would cost the component a sort's code.
pub(super) fn same_load_balancer(listed: &LoadBalancer, wanted: &LoadBalancer) -> bool {
    (&listed.name, &listed.public_ip, &listed.backend_pool) == (&wanted.name, &wanted.public_ip, &wanted.backend_pool)
        && listed.rules.len() == wanted.rules.len()
        && wanted.rules.iter().all(|rule| listed.rules.contains(rule))
}

/// What start-up adoption writes through: the lifecycles it adopts or creates to tear down
/// (inbound and outbound), the NRP part (a drain to run), and what it reads of the Kubernetes
/// cache (the Services observed).
pub(super) struct Adoption<'a> {
    pub(super) inbound: &'a mut Inbound,
    pub(super) egress: &'a mut EgressSide,
    pub(super) kube: &'a KubeCache,
    pub(super) nrp: &'a mut Nrp,
}

impl Adoption<'_> {
    /// Whether an identity is an inbound Service's (a lifecycle, or a Service observed).
    fn is_inbound(&self, identity: &str) -> bool {
        self.inbound.has(identity) || self.kube.knows_identity(identity)
    }

    /// A UID-named identity that no Service, NRP registration, egress identity or foreign
    /// service explains: a Service deleted while no controller ran left it.
    fn sweepable(&self, identity: &str) -> bool {
        looks_like_uid(identity)
            && !self.is_inbound(identity)
            && !self.nrp.is_registered(identity)
            && !self.nrp.is_foreign(identity)
            && self.egress.class(identity).is_none()
    }
}

impl Startup {
    /// Start-up reconciliation has run: from then on the egress side decides, and writes go.
    pub(super) fn reconciled(&self) -> bool {
        self.reconciled
    }

    /// Start-up reconciliation runs once: when the lists are complete, NRP has been read and the
    /// ARM inventory is settled. Returns whether it is to run now (it counts as run from here).
    pub(super) fn reconcile_now(&mut self, kube: &KubeCache, nrp: &Nrp) -> bool {
        let now = !self.reconciled && kube.lists_complete() && nrp.loaded() && self.arm.settled;
        self.reconciled |= now;
        now
    }

    /// Issues the read of ARM's inventory when it is wanted and due.
    pub(super) fn read_arm_if_due(
        &mut self,
        now: u64,
        kube: &KubeCache,
        nrp: &Nrp,
        outbox: &mut Outbox,
        step: &mut Step,
    ) {
        if self.inventory_wanted(kube, nrp) && now >= self.arm.next_read_ms {
            self.arm.read_in_flight = true;
            outbox.issue(Command::ReadArm, InFlight::ReadArm, step);
        }
    }

    /// The read of ARM's inventory is out.
    pub(super) fn reading_arm(&self) -> bool {
        self.arm.read_in_flight
    }

    /// When ARM's inventory is next to be read, if it is wanted.
    pub(super) fn next_read(&self, now: u64, kube: &KubeCache, nrp: &Nrp) -> Option<u64> {
        self.inventory_wanted(kube, nrp).then(|| self.arm.next_read_ms.max(now))
    }

    /// Brings the next read in to `latest` (`Tracker::bring_in_deadlines`).
    pub(super) fn bring_in(&mut self, latest: u64) {
        self.arm.next_read_ms = self.arm.next_read_ms.min(latest);
    }

    /// As a state from before version 4 imports: nothing to read, nothing to adopt.
    #[cfg(test)]
    pub(super) fn settle_arm(&mut self) {
        self.arm = ArmSync::settled();
    }

    /// The start-up inventory is to be read: not settled, not out, and asked for only once the
    /// lists are complete and NRP is read (start-up reconciliation uses it the moment it comes).
    pub(super) fn inventory_wanted(&self, kube: &KubeCache, nrp: &Nrp) -> bool {
        !self.arm.settled && !self.arm.read_in_flight && kube.lists_complete() && nrp.loaded()
    }

    // ---- The start-up inventory of ARM ----

    /// The answer to the read of ARM's inventory: the inventory, which start-up reconciliation
    /// and adoption use next; `None` when the read failed (it is retried, or given up on).
    pub(super) fn arm_outcome(&mut self, outcome: Outcome, now: u64, step: &mut Step) -> Option<ArmInventory> {
        let arm = &mut self.arm;
        arm.read_in_flight = false;
        match outcome {
            Outcome::ArmInventory(inventory) => {
                arm.settled = true;
                return Some(inventory);
            }
            Outcome::Failed(failure) if arm.read_retries.saturating_add(1) < timing::ARM_READ_ATTEMPTS => {
                arm.read_retries += 1;
                let delay = retry_delay("read-arm", arm.read_retries, &failure, "read-arm", step);
                arm.next_read_ms = now.saturating_add(delay);
            }
            other => {
                // No `Debug` of the answer: it would pull the formatting of every record into the
                // component for one log line.
                let why = match other {
                    Outcome::Failed(f) => format!("HTTP {} {}: {}", f.status, f.code.unwrap_or_default(), f.message),
                    _ => "the host answered with another outcome than an inventory".to_owned(),
                };
                let message = format!(
                    "read-arm failed {} time(s) ({why}); start-up goes on without the ARM inventory: \
                     every Service's public IP and load balancer is written once, none is adopted",
                    arm.read_retries + 1
                );
                step.logs.push(LogLine { level: LogLevel::Warn, message });
                arm.settled = true;
            }
        }
        None
    }

    /// Start-up adoption: a Service not yet provisioned by this tracker whose public IP (and
    /// load balancer) ARM already holds as it wants them skips those writes, and one that needs
    /// nothing written at all is created as it is, with no second `EnsuredLoadBalancer` Event.
    /// Then the sweep: a UID-named load balancer of our shape, or a UID-named `-pip` public IP,
    /// that no Service, NRP registration, egress identity or foreign service explains is ours
    /// from a Service deleted while no controller ran, and is deleted.
    pub(super) fn adopt_from_arm(inventory: &ArmInventory, to: &mut Adoption<'_>, step: &mut Step) {
        // Names sorted with their index, not maps: each map or sort of another type costs the
        // component kilobytes of code, and both lists share this one.
        fn by_name(mut names: Vec<(&str, usize)>) -> Vec<(&str, usize)> {
            crate::keyed::sort(&mut names);
            names
        }
        let public_ips = by_name(inventory.public_ips.iter().enumerate().map(|(i, p)| (p.name.as_str(), i)).collect());
        let shaped = inventory.load_balancers.iter().enumerate().filter(|(_, l)| l.shape.is_some());
        let load_balancers = by_name(shaped.map(|(i, l)| (l.name.as_str(), i)).collect());
        let find = |sorted: &[(&str, usize)], name: &str| {
            sorted.binary_search_by_key(&name, |(n, _)| n).ok().map(|i| sorted[i].1)
        };
        let public_ip_named = |name: &str| find(&public_ips, name).map(|i| &inventory.public_ips[i]);
        let load_balancer_named =
            |name: &str| find(&load_balancers, name).and_then(|i| inventory.load_balancers[i].shape.as_ref());
        let (adopted, whole) = to.inbound.adopt_held(to.nrp, |config| {
            let public_ip = public_ip_named(&config.public_ip.name)
                .filter(|p| p.as_put && p.version == config.public_ip.version)
                .and_then(|p| p.address.clone())?;
            let load_balancer_holds = load_balancer_named(&config.load_balancer.name)
                .is_some_and(|lb| same_load_balancer(lb, &config.load_balancer));
            Some((public_ip, load_balancer_holds))
        });
        let mut orphans = 0usize;
        for &(name, index) in &load_balancers {
            let Some(lb) = inventory.load_balancers[index].shape.as_ref() else { continue };
            let ours = lb.backend_pool == name && lb.public_ip == format!("{name}-pip");
            if ours && to.sweepable(name) {
                to.inbound.adopt_for_deletion(name, orphan(name), ObjectState::gone(), to.nrp);
                orphans += 1;
            }
        }
        // Then the public IPs left without a load balancer (those with one are adopted above).
        for &(name, _) in &public_ips {
            if let Some(identity) = name.strip_suffix("-pip").filter(|id| to.sweepable(id)) {
                to.inbound.adopt_for_deletion(identity, orphan(identity), ObjectState::gone(), to.nrp);
                orphans += 1;
            }
        }
        let (outbound_adopted, outbound_orphans) = Self::adopt_outbound_from_arm(inventory, to);
        let message = format!(
            "start-up inventory: {} public IP(s), {} load balancer(s), {} NAT gateway(s); {adopted} Service(s) \
             adopted their public IP, {whole} of them with nothing to write; {} orphan(s) of deleted Services to \
             delete; {outbound_adopted} egress identit(y/ies) adopted, {outbound_orphans} no pod carries to tear down",
            inventory.public_ips.len(),
            inventory.load_balancers.len(),
            inventory.nat_gateways.len(),
            orphans
        );
        step.logs.push(LogLine { level: LogLevel::Info, message });
    }

    /// Start-up adoption of egress identities. A NAT gateway of ours is one named as a valid
    /// identity that is exactly what `PutNatGateway` makes of it (its public IPs `<id>-pip`
    /// and, if any, `<id>-pip-v6`). Carried by a pod and registered: ours, created (no write). Carried
    /// and being created: what already holds is not written again. Carried by no pod: left from
    /// before (its pods went while no controller ran, or a teardown was cut short) and torn down,
    /// after a drain if NRP still maps its addresses. Nothing else is touched, and never the RP's
    /// `default-natgw` (not a valid identity). Public IPs a teardown cut short left after deleting
    /// their NAT gateway are not swept: `<id>-pip` alone does not prove a public IP ours (the
    /// inventory test keeps `kubernetes-pip`). Returns (adopted, torn down).
    fn adopt_outbound_from_arm(inventory: &ArmInventory, to: &mut Adoption<'_>) -> (usize, usize) {
        let (mut adopted, mut orphans) = (0, 0);
        let pip = outbound::public_ip_name;
        for nat in &inventory.nat_gateways {
            let id = nat.name.to_ascii_lowercase();
            let v6 = !nat.public_ips_v6.is_empty();
            let shaped =
                nat.as_put && nat.public_ips == [pip(&id, false)] && (!v6 || nat.public_ips_v6 == [pip(&id, true)]);
            if !shaped || !super::egress::identities::is_valid_identity(&id) || to.is_inbound(&id) {
                continue;
            }
            let listed_as_put =
                |name: &str| inventory.public_ips.iter().any(|p| p.name.eq_ignore_ascii_case(name) && p.as_put);
            let holds = || nat.associated && listed_as_put(&pip(&id, false)) && (!v6 || listed_as_put(&pip(&id, true)));
            match to.egress.adopt_nat_gateway(&id, v6, holds, to.nrp) {
                Some(true) => adopted += 1,
                Some(false) => orphans += 1,
                None => {}
            }
        }
        (adopted, orphans + Self::sweep_egress_public_ips(inventory, to))
    }

    /// The public IPs a teardown cut short left after deleting their NAT gateway (upstream
    /// `TestGuardEgressPublicIPsAreSweptOnceNATGatewayIsGone`): `<id>-pip` / `<id>-pip-v6` of our
    /// shape (StandardV2, static, of their family) for a valid identity that is no Service's, has no
    /// outbound lifecycle (a NAT gateway of ours above made one), no pod carries, NRP does not
    /// reference, and that no load balancer or NAT gateway of the resource group uses. NRP may
    /// register it only when the resource group has no NAT gateway of its name: no controller's
    /// creation or teardown leaves an identity so (each registers only with its NAT gateway in
    /// place and unregisters before deleting it), only a write of a teardown that landed after
    /// the teardown had unregistered it (a deposed leader's unlink, found by `clb-host explore`),
    /// so the teardown unregisters it again. They go through the outbound teardown, whose other
    /// steps hold already. The RP's
    /// `default-natgw-pip` is never one (`default-natgw` is no valid identity); UID-shaped names
    /// are the inbound sweep's. Returns how many identities are swept.
    fn sweep_egress_public_ips(inventory: &ArmInventory, to: &mut Adoption<'_>) -> usize {
        let used = |name: &str| {
            inventory
                .nat_gateways
                .iter()
                .any(|n| n.public_ips.iter().chain(&n.public_ips_v6).any(|p| p.eq_ignore_ascii_case(name)))
                || inventory
                    .load_balancers
                    .iter()
                    .any(|l| l.shape.as_ref().is_some_and(|s| s.public_ip.eq_ignore_ascii_case(name)))
        };
        let mut found: Map<String, (bool, bool)> = Map::new();
        for ip in inventory.public_ips.iter().filter(|p| p.as_put) {
            let name = ip.name.to_ascii_lowercase();
            let (id, v6) = match (name.strip_suffix("-pip-v6"), name.strip_suffix("-pip")) {
                (Some(id), _) if ip.version == IpVersion::Ipv6 => (id, true),
                (None, Some(id)) if ip.version == IpVersion::Ipv4 => (id, false),
                _ => continue,
            };
            let unexplained = super::egress::identities::is_valid_identity(id)
                && !looks_like_uid(id)
                && !to.is_inbound(id)
                && !to.egress.outbound().has(id)
                && !to.egress.identities().carries(id)
                && !to.nrp.references(id)
                && !used(&name);
            let ours = unexplained
                && if to.egress.identities().is_registered(id) {
                    !inventory.nat_gateways.iter().any(|n| n.name.eq_ignore_ascii_case(id))
                } else {
                    !to.nrp.is_foreign(id)
                };
            if ours {
                let entry = found.entry(id.to_owned()).or_default();
                if v6 { entry.1 = true } else { entry.0 = true }
            }
        }
        let swept = found.len();
        for (id, (_, v6)) in found {
            to.egress.sweep_public_ips(id, v6);
        }
        swept
    }
}
