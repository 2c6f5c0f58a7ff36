//! The outbound lifecycle of egress identities (docs/upstream.md §c.2.1 "create outbound" and
//! "delete outbound", docs/upstream.md §c.2.3): state version 6's addition.
//!
//! An identity that a pod of this cluster carries and that NRP does not list gets an
//! [`OutboundLifecycle`]: its public IP `<id>-pip` (and `<id>-pip-v6` when a Node of the cluster
//! has an IPv6 address, decided once, at creation), its NAT gateway `<id>` associated with the
//! ServiceGateway, then the Outbound service `<id>` registered with that NAT gateway
//! ([`ENSURE`]). Only then are its pods' addresses programmed. When the last pod carrying it
//! goes, its addresses are drained first; then the service's NAT gateway reference is cleared,
//! the NAT gateway disassociated, the service unregistered, the NAT gateway and its public IPs
//! deleted ([`DELETE`]).
//!
//! It is the inbound lifecycle's state machine (`crate::tracker`): one command at a time, pods
//! held while the identity is created, a delete that pre-empts a creation (the command in flight
//! finishes, then the teardown starts), a pod that comes back while the identity is drained
//! keeps it, one that comes back during the teardown recreates it after, backoff per identity.
//! The tracker drives it with the same work sets, write budgets and command counters; this
//! module holds what is particular to outbound: the steps, their commands, what already holds.
//!
//! An identity NRP already lists when a pod first carries it is somebody else's (or ours from
//! a state this tracker does not have) and gets no lifecycle: its pods are programmed, and it is
//! never torn down. The RP's `default-natgw` is never an identity (`super::identities`).

use crate::budget::WriteKind;
use crate::keyed::Map;
use crate::lifecycle::{Attempt, Life, Op, WorkSets, life_fields, timing};
use crate::model::{
    Command, IpVersion, NatGateway, NrpServiceRequest, NrpServiceType, Phase, PublicIp, ResourceKind, ResourceRef,
};
use crate::name::Name;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// One command of an identity's outbound operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutStep {
    PutPublicIp,
    PutPublicIpV6,
    PutNatGateway,
    Register,
    /// The Outbound service without its NAT gateway (`publicNatGatewayId: null`).
    Unlink,
    /// The NAT gateway without its ServiceGateway (`serviceGateway: null`).
    Disassociate,
    Unregister,
    DeleteNatGateway,
    DeletePublicIp,
    DeletePublicIpV6,
}

/// Upstream "create outbound": public IP(s) → NAT gateway → register.
pub const ENSURE: [OutStep; 4] =
    [OutStep::PutPublicIp, OutStep::PutPublicIpV6, OutStep::PutNatGateway, OutStep::Register];
/// Upstream "delete outbound", after the drain: disassociate (NRP's side, then the NAT
/// gateway's) → unregister → delete the NAT gateway → delete its public IPs.
pub const DELETE: [OutStep; 6] = [
    OutStep::Unlink,
    OutStep::Disassociate,
    OutStep::Unregister,
    OutStep::DeleteNatGateway,
    OutStep::DeletePublicIp,
    OutStep::DeletePublicIpV6,
];

impl Op for OutStep {
    fn is_delete_step(self) -> bool {
        DELETE.contains(&self)
    }

    fn writes_nrp(self) -> bool {
        matches!(self, OutStep::Register | OutStep::Unlink | OutStep::Unregister)
    }

    /// Every outbound step is an Azure write: NRP's registration, or ARM's resources.
    fn write_kind(self) -> Option<WriteKind> {
        Some(if self.writes_nrp() { WriteKind::Services } else { WriteKind::Arm })
    }
}

impl OutStep {
    /// A failure of the disassociation is logged and the teardown goes on, as upstream: the
    /// unregister and the delete that follow are what must succeed, and they say so.
    pub fn failure_is_ignored(self) -> bool {
        matches!(self, OutStep::Unlink | OutStep::Disassociate)
    }

    /// A 404 means what the step would do is done.
    pub fn gone_is_done(self) -> bool {
        matches!(
            self,
            OutStep::Unlink
                | OutStep::Unregister
                | OutStep::DeleteNatGateway
                | OutStep::DeletePublicIp
                | OutStep::DeletePublicIpV6
        )
    }
}

/// The name of an identity's public IP of a family (docs/upstream.md §a.4).
pub fn public_ip_name(identity: &str, v6: bool) -> String {
    if v6 { format!("{identity}-pip-v6") } else { format!("{identity}-pip") }
}

/// One identity's outbound lifecycle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboundLifecycle {
    pub phase: Phase,
    /// It has an IPv6 public IP (the cluster's families when it was created; never updated).
    pub v6: bool,
    pub steps: VecDeque<OutStep>,
    pub(crate) attempt: Attempt<OutStep>,
    /// A Warning was logged for the current run of failures.
    pub failing: bool,
    /// Created, and no step of a teardown has run since: a pod that comes back while its
    /// addresses drain keeps it as it is.
    pub whole: bool,
    /// A pod carries it again during its teardown: created anew once the teardown ends.
    pub recreate: bool,
    /// A `PutPublicIp` or a `PutNatGateway` was sent (it may have taken effect whatever the
    /// answer): what a teardown must undo. Nothing sent, nothing to disassociate or delete.
    pub public_ips_put: bool,
    pub nat_gateway_put: bool,
}

impl OutboundLifecycle {
    /// A lifecycle about to be created.
    pub fn creating(v6: bool) -> Self {
        Self::new(Phase::NotStarted, v6, ENSURE.into())
    }

    /// A lifecycle of what is already there (start-up adoption), or of what is to be torn down.
    pub fn new(phase: Phase, v6: bool, steps: VecDeque<OutStep>) -> Self {
        Self {
            phase,
            v6,
            steps,
            attempt: Attempt::new(),
            failing: false,
            whole: phase == Phase::Created,
            recreate: false,
            public_ips_put: phase != Phase::NotStarted,
            nat_gateway_put: phase != Phase::NotStarted,
        }
    }

    /// Steps to run, not waiting for a drain.
    pub fn has_work_left(&self) -> bool {
        self.phase != Phase::Created || !self.steps.is_empty()
    }

    /// Whether what `op` would write already holds (`registered`: NRP lists the service).
    pub fn holds_already(&self, op: OutStep, registered: bool) -> bool {
        match op {
            OutStep::PutPublicIpV6 => !self.v6,
            OutStep::DeletePublicIpV6 => !self.v6 || !self.public_ips_put,
            OutStep::DeletePublicIp => !self.public_ips_put,
            OutStep::Disassociate | OutStep::DeleteNatGateway => !self.nat_gateway_put,
            OutStep::Register => registered,
            OutStep::Unlink | OutStep::Unregister => !registered,
            OutStep::PutPublicIp | OutStep::PutNatGateway => false,
        }
    }

    /// `op` is about to be sent: what it may leave behind.
    pub fn sending(&mut self, op: OutStep) {
        match op {
            OutStep::PutPublicIp | OutStep::PutPublicIpV6 => self.public_ips_put = true,
            OutStep::PutNatGateway => self.nat_gateway_put = true,
            _ => {}
        }
        if op.is_delete_step() {
            self.whole = false;
        }
    }

    /// `op` succeeded (or found its work done): what is gone now.
    pub fn succeeded(&mut self, op: OutStep) {
        match op {
            OutStep::DeleteNatGateway => self.nat_gateway_put = false,
            // The IPv6 one goes last: both are gone then.
            OutStep::DeletePublicIpV6 => self.public_ips_put = false,
            OutStep::DeletePublicIp if !self.v6 => self.public_ips_put = false,
            _ => {}
        }
    }

    /// The command that carries out `op` for `identity`.
    pub fn command(&self, identity: &str, op: OutStep) -> Command {
        let service = |public_nat_gateway: Option<String>, is_delete: bool| {
            Command::UpdateServices(vec![NrpServiceRequest {
                name: identity.to_owned(),
                service_type: NrpServiceType::Outbound,
                backend_pools: Vec::new(),
                public_nat_gateway,
                is_delete,
            }])
        };
        let nat_gateway = |associated: bool| {
            Command::PutNatGateway(NatGateway {
                name: identity.to_owned(),
                public_ips: vec![public_ip_name(identity, false)],
                public_ips_v6: if self.v6 { vec![public_ip_name(identity, true)] } else { Vec::new() },
                associated,
            })
        };
        let delete = |kind, name: String| Command::DeleteResource(ResourceRef { kind, name });
        match op {
            OutStep::PutPublicIp => Command::PutPublicIp(PublicIp {
                name: Name::new(&public_ip_name(identity, false)),
                version: IpVersion::Ipv4,
            }),
            OutStep::PutPublicIpV6 => Command::PutPublicIp(PublicIp {
                name: Name::new(&public_ip_name(identity, true)),
                version: IpVersion::Ipv6,
            }),
            OutStep::PutNatGateway => nat_gateway(true),
            OutStep::Register => service(Some(identity.to_owned()), false),
            OutStep::Unlink => service(None, false),
            OutStep::Disassociate => nat_gateway(false),
            OutStep::Unregister => service(None, true),
            OutStep::DeleteNatGateway => delete(ResourceKind::NatGateway, identity.to_owned()),
            OutStep::DeletePublicIp => delete(ResourceKind::PublicIp, public_ip_name(identity, false)),
            OutStep::DeletePublicIpV6 => delete(ResourceKind::PublicIp, public_ip_name(identity, true)),
        }
    }
}

/// The outbound side of the tracker's state: the lifecycles and their own work sets (an egress
/// identity and an inbound one never share a lifecycle, and keeping their sets apart keeps
/// either from ever running the other's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outbound {
    pub lifecycles: Map<String, OutboundLifecycle>,
    /// `draining`: identities waiting for their addresses to leave NRP before their teardown.
    pub(crate) work: WorkSets<String>,
}

impl Outbound {
    /// Whether an identity of ours may have its pods' addresses in NRP: created and registered.
    /// `None` when it has no lifecycle.
    pub fn ready(&self, identity: &str, registered: bool) -> Option<bool> {
        self.lifecycles.get(identity).map(|l| l.phase == Phase::Created && registered)
    }

    /// Whether the identity has an outbound lifecycle (being created, serving or torn down).
    pub fn has(&self, identity: &str) -> bool {
        self.lifecycles.contains_key(identity)
    }

    /// Nothing to do but wait for the periodic resync.
    pub fn is_quiet(&self) -> bool {
        self.work.is_empty()
    }

    /// For a state import: every lifecycle with work left is in a work set, every pending
    /// deletion drains and nothing else does (as the import check of `tracker::format` for inbound lifecycles).
    pub fn check(&self) -> Result<(), String> {
        for identity in self.work.draining.iter().chain(&self.work.runnable) {
            if !self.lifecycles.contains_key(identity) {
                return Err(format!("outbound identity {identity:?} is in a work set but has no lifecycle"));
            }
        }
        self.work.check(&self.lifecycles, "outbound lifecycle")
    }
}

/// How long an identity this tracker tore down is remembered ([`TornDown`]): a read interval
/// beyond the longest delay the tracker schedules, so that at least one periodic read of NRP
/// falls after any write of the teardown's time could still land (a write in flight when its
/// writer lost the lease is answered, or given up, within the host's request timeout, far less).
pub const TORN_DOWN_WINDOW_MS: u64 = timing::MAX_DELAY_MS + timing::RESYNC_INTERVAL_MS;

/// The most identities remembered as torn down at once; past it the first recorded goes
/// first. Teardowns are paced by the write budgets (six writes each), so the window holds far
/// fewer at the default budgets.
pub const TORN_DOWN_CAP: usize = 1024;

/// The egress identities whose teardown this tracker finished lately, each with when it is
/// forgotten (state version 10's addition). A write of ours that lands after the teardown —
/// the unlink of a leader that lost its lease with it in flight, which NRP takes as an upsert
/// of the registration — would leave the identity registered with no NAT gateway and no pod,
/// which nothing else would ever undo: a registration this tracker did not make when a pod
/// first carried the identity is somebody else's and is left alone. A read of NRP that finds
/// one of these registered and carried by no pod tears it down again
/// (`EgressSide::reconcile_outbound`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TornDown {
    /// (identity, when it is forgotten), in the order the teardowns ended, so by when each is
    /// forgotten too (the clock does not go back, and [`Self::bring_in`] keeps the order): a
    /// list, not a map, because it is short, and a map of a new value type costs the component
    /// kilobytes.
    until: Vec<(String, u64)>,
}

impl TornDown {
    /// `identity`'s teardown finished at `now`.
    pub fn record(&mut self, identity: &str, now: u64) {
        self.forget(identity);
        if self.until.len() >= TORN_DOWN_CAP {
            self.until.remove(0);
        }
        self.until.push((identity.to_owned(), now.saturating_add(TORN_DOWN_WINDOW_MS)));
    }

    /// The identity is ours again (a pod carries it, or its teardown starts again).
    pub fn forget(&mut self, identity: &str) {
        if let Some(at) = self.until.iter().position(|(id, _)| id == identity) {
            self.until.remove(at);
        }
    }

    /// The identities remembered.
    pub fn identities(&self) -> impl Iterator<Item = &str> {
        self.until.iter().map(|(id, _)| id.as_str())
    }

    /// Forgets those whose window has passed at `now`.
    pub fn expire(&mut self, now: u64) {
        let passed = self.until.iter().take_while(|(_, until)| *until <= now).count();
        self.until.drain(..passed);
    }

    /// No window ends later than a teardown finished at the latest time now allows would
    /// (`Tracker::bring_in_deadlines`: a state from a clock ahead of this one).
    pub fn bring_in(&mut self, latest: u64) {
        let cap = latest.saturating_add(timing::RESYNC_INTERVAL_MS);
        for (_, until) in &mut self.until {
            *until = (*until).min(cap);
        }
    }

    /// For a state import: at most [`TORN_DOWN_CAP`] identities, each a valid identity, none
    /// twice, in the order they are forgotten.
    pub fn check(&self) -> Result<(), String> {
        if self.until.len() > TORN_DOWN_CAP {
            return Err(format!("{} identities remembered as torn down, over {TORN_DOWN_CAP}", self.until.len()));
        }
        for (i, (id, until)) in self.until.iter().enumerate() {
            let before = &self.until[..i];
            if !super::identities::is_valid_identity(id)
                || before.iter().any(|(seen, _)| seen == id)
                || before.last().is_some_and(|(_, last)| last > until)
            {
                return Err(format!(
                    "{id:?}, remembered as torn down, is not a valid egress identity, is there twice or out of order"
                ));
            }
        }
        Ok(())
    }
}

impl Life for OutboundLifecycle {
    life_fields!(OutStep);
    fn holds_already(&self, op: OutStep, registered: bool) -> bool {
        OutboundLifecycle::holds_already(self, op, registered)
    }
    fn has_work_left(&self) -> bool {
        OutboundLifecycle::has_work_left(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Upstream TestBuildOutboundResourceNames: an identity's public IPs are `<id>-pip` and `<id>-pip-v6`, its
    // NAT gateway and its Outbound service `<id>`, each command naming them so.
    #[test]
    fn an_identitys_resources_are_named_after_it() {
        assert_eq!(
            (public_ip_name("egress-a", false), public_ip_name("egress-a", true)),
            ("egress-a-pip".into(), "egress-a-pip-v6".into())
        );
        let lifecycle = OutboundLifecycle::creating(true);
        let Command::PutNatGateway(nat) = lifecycle.command("egress-a", OutStep::PutNatGateway) else { panic!() };
        assert_eq!(
            (nat.name.as_str(), nat.public_ips.as_slice(), nat.public_ips_v6.as_slice()),
            ("egress-a", &["egress-a-pip".to_owned()][..], &["egress-a-pip-v6".to_owned()][..])
        );
        let Command::UpdateServices(requests) = lifecycle.command("egress-a", OutStep::Register) else { panic!() };
        assert_eq!(
            (requests[0].name.as_str(), requests[0].public_nat_gateway.as_deref()),
            ("egress-a", Some("egress-a"))
        );
        let Command::DeleteResource(pip) = lifecycle.command("egress-a", OutStep::DeletePublicIpV6) else { panic!() };
        assert_eq!((pip.kind, pip.name.as_str()), (ResourceKind::PublicIp, "egress-a-pip-v6"));
    }
}
