//! `tracker.stats`: the gauges, read from the state when asked, beside the counters of
//! [`Figures`]; and noting, after every call, when start-up ended and when each pending
//! operation began.

use super::budgets::Budgets;
use super::driver::Kind;
use super::egress::EgressSide;
use super::figures::*;
use super::inbound::Inbound;
use super::nrp::Nrp;
use super::outbox::*;
use crate::budget::WriteKind;
use crate::lifecycle::Life;
use crate::model::{Clock, Phase};

/// Whether a lifecycle has an operation under way (upstream: an entry of `pendingServiceOps`).
fn pending(life: &impl Life) -> bool {
    life.phase() != Phase::Created || life.parked()
}

/// What the figures read of the other parts: the lifecycles of both sides, the commands in
/// flight, the NRP part, the egress side's counts and the write budgets.
pub(super) struct FiguresView<'a> {
    pub(super) inbound: &'a Inbound,
    pub(super) egress: &'a EgressSide,
    pub(super) outbox: &'a Outbox,
    pub(super) nrp: &'a Nrp,
    pub(super) budgets: &'a Budgets,
    /// The tracker provisions (CLB mode).
    pub(super) provisions: bool,
}

impl FiguresView<'_> {
    /// The phase of the lifecycle of `identity` on `side`, if it has an operation under way.
    #[inline(never)]
    fn pending_phase(&self, side: ServiceType, identity: &str) -> Option<Phase> {
        match side {
            ServiceType::Inbound => self.inbound.lifecycle(identity).filter(|l| pending(*l)).map(|l| l.phase),
            ServiceType::Outbound => {
                self.egress.outbound().lifecycles.get(identity).filter(|l| pending(*l)).map(|l| l.phase)
            }
        }
    }
}

impl Figures {
    /// Called at the end of every `observe`, `complete` and `tick`: notes when start-up ended and
    /// when each operation now pending began. Looks at the work sets and the operations already
    /// followed, not at every lifecycle (but once, on the first call).
    /// `start_up_ended`: whether start-up has ended (the caller need only ask while
    /// `initialized_after_ms` is unset).
    #[inline(never)]
    pub(super) fn note(&mut self, now: u64, view: &FiguresView<'_>, start_up_ended: bool) {
        let figures = self;
        let first = *figures.first_call_ms.get_or_insert(now);
        if figures.initialized_after_ms.is_none() && start_up_ended {
            figures.initialized_after_ms = Some(now.saturating_sub(first));
        }
        figures.running.retain(|r| view.pending_phase(r.service_type, &r.identity).is_some());
        let mut candidates: Vec<(ServiceType, &str)> = Vec::new();
        if figures.seen_all {
            for (side, work) in
                [(ServiceType::Inbound, view.inbound.work()), (ServiceType::Outbound, view.egress.outbound().work())]
            {
                let sets = work.runnable.iter().chain(&work.draining).map(String::as_str);
                candidates.extend(sets.chain(work.timers.iter().map(|(_, id)| id)).map(|id| (side, id)));
            }
            candidates.extend(view.outbox.in_flight().values().filter_map(|what| match what {
                InFlight::Service { identity, .. } => Some((ServiceType::Inbound, identity.as_str())),
                InFlight::Outbound { identity, .. } => Some((ServiceType::Outbound, identity.as_str())),
                _ => None,
            }));
        } else {
            candidates.extend(view.inbound.lifecycles().keys().map(|id| (ServiceType::Inbound, id.as_str())));
            candidates.extend(view.egress.outbound().lifecycles.keys().map(|id| (ServiceType::Outbound, id.as_str())));
        }
        for (side, identity) in candidates {
            if let Some(phase) = view.pending_phase(side, identity) {
                figures.running(side, identity, phase, now);
            }
        }
        figures.seen_all = true;
    }

    /// What the tracker is doing (WIT `tracker.stats`), the budgets' levels taken at `now` (the
    /// tracker's time; `clock` gives the host's times back); nothing changes.
    #[inline(never)]
    pub(super) fn stats(&self, now: u64, clock: &Clock, view: &FiguresView<'_>) -> Stats {
        let figures = self;
        let mut pending_ops: Vec<Pending> = TYPES
            .iter()
            .flat_map(|&service_type| {
                PHASES.iter().map(move |&phase| Pending { phase, service_type, count: 0, oldest_began_ms: None })
            })
            .collect();
        let mut count = |service_type: ServiceType, identity: &str, phase: Phase| {
            let began = figures.find(service_type, identity).ok().map(|i| figures.running[i].began_ms);
            let entry = &mut pending_ops
                [service_type as usize * PHASES.len() + PHASES.iter().position(|p| *p == phase).unwrap_or(0)];
            entry.count += 1;
            if let Some(began) = began {
                let began = clock.to_host(began);
                entry.oldest_began_ms = Some(entry.oldest_began_ms.map_or(began, |b| b.min(began)));
            }
        };
        let mut deletions = 0;
        let mut blocked = 0;
        let mut provisioned = 0;
        for (identity, life) in view.inbound.lifecycles() {
            provisioned += u32::from(life.desired.is_some() && !life.phase.is_deleting());
            if pending(life) {
                count(ServiceType::Inbound, identity, life.phase);
            }
        }
        for (identity, life) in &view.egress.outbound().lifecycles {
            if pending(life) {
                count(ServiceType::Outbound, identity, life.phase);
            }
        }
        let draining = view.inbound.work().draining.iter().chain(&view.egress.outbound().work().draining);
        for identity in draining {
            deletions += 1;
            blocked += u32::from(!view.nrp.drained(view.outbox.in_flight(), identity));
        }
        let (locations, addresses) = view.nrp.totals();
        let histograms = |of: &[Histogram; 6], bounds: &[u64]| {
            OPERATIONS
                .iter()
                .flat_map(|&o| TYPES.iter().map(move |&t| (o, t)))
                .map(|(o, t)| (o, t, of[slot(o, t)].or_empty(bounds)))
                .collect()
        };
        let mut budgets: Vec<BudgetLevel> = [WriteKind::AddressLocations, WriteKind::Services, WriteKind::Arm]
            .into_iter()
            .map(|kind| {
                let (tokens, per_minute) = view.budgets.level(kind, now);
                BudgetLevel { bucket: kind.name().to_owned(), tokens, per_minute }
            })
            .collect();
        if let Some((tokens, per_minute)) = view.budgets.pace_level(now) {
            budgets.push(BudgetLevel { bucket: "arm-pace".to_owned(), tokens, per_minute });
        }
        let small = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Stats {
            service_gateway_enabled: view.provisions,
            pending: pending_ops,
            k8s_services: provisioned,
            nrp_load_balancers: small(view.nrp.registered().len()),
            nrp_nat_gateways: small(view.egress.registered_count()),
            nrp_locations: small(locations),
            nrp_addresses: small(addresses),
            pending_deletions: deletions,
            blocked_by_locations: blocked,
            pod_finalizers_held: small(view.egress.finalizers_held()),
            commands_in_flight: small(view.outbox.in_flight().len()),
            attempts: figures.attempts.clone(),
            durations: histograms(&figures.durations, &DURATION_BOUNDS_MS),
            retries: histograms(&figures.retries, &RETRY_BOUNDS),
            parked: vec![(PARKED_TERMINAL.to_owned(), figures.parked_terminal)],
            orphans_cleaned: figures.orphans_cleaned,
            delete_substep_failures: vec![(SUBSTEP_DISASSOCIATE.to_owned(), figures.disassociate_failures)],
            location_sync_terminal_errors: figures.location_terminal,
            initialized_after_ms: figures.initialized_after_ms,
            budgets,
        }
    }
}
