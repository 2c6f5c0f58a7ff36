//! The run's perturbation applied (`crate::perturbation`), where it is not a crash of the loop
//! itself (`run_instant` and `pool_tick` restart there): a rebuild of the logic before a call,
//! a backend-pool tick cut short by the controller's death or by a lost lease, a delivery of watch events as the
//! stale or unobserved class changes it, and a deposed leader's write landing late. Each says
//! what it did in the step's report.

use super::report::Ms;
use super::watch::{changes_since, objects, reorder};
use super::{Delivery, Late, LogicError, Simulation, SwapResult};
use crate::perturbation::{FAILOVER_LATE_MS, Perturbation, RELIST_AFTER_MS};
use clb_executor::Executor;
use clb_executor::backend_pools::{PoolWrite, Tick};
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::bindings::exports::clb::reconciler::backend_pools::GroupOutcome;
use clb_sandbox::supervisor::describe_observation;

impl Simulation<'_> {
    /// Counts a call into the logic about to be made; the swap class's rebuild happens here.
    pub(super) fn before_input(&mut self) -> Result<(), LogicError> {
        let index = self.points.inputs;
        self.points.inputs += 1;
        if self.perturbation != Some(Perturbation::Swap(index)) {
            return Ok(());
        }
        self.perturb("the logic rebuilt from its own state".to_owned());
        let now = self.now;
        match self.supervised("a rebuild")?.rebuild(now)? {
            SwapResult::Accepted { first_step, .. } => self.absorb(first_step),
            SwapResult::Refused(why) => return Err(LogicError::RebuildRefused(why)),
        }
        Ok(())
    }

    /// `crash-in-pool-tick`: the backend-pool tick due now carries out its first `after` groups
    /// and the controller dies (the rest of what it drained is never written, its queue and the
    /// resource lock die with it); a new one starts.
    pub(super) fn die_in_pool_tick(&mut self, after: u64) -> Result<(), LogicError> {
        let Some(pools) = self.pools.as_mut() else { return Ok(()) };
        let tick = pools.updater.tick_dying_after(self.now, usize::try_from(after).unwrap_or(usize::MAX));
        let (groups, left) = match self.runtime.block_on(tick)? {
            Tick::Ran(s) => (s.groups, s.left),
            Tick::Idle | Tick::LockFailed(_) => (0, 0),
        };
        self.points.pool_groups.push(groups as u64);
        let carried_out = groups - left;
        self.perturb(format!(
            "the controller dies during the backend-pool tick, {carried_out} of its {groups} group(s) carried out; a \
             new one starts"
        ));
        self.restart()
    }

    /// The perturbation is reached; `what` it does goes into the step's report.
    pub(super) fn perturb(&mut self, what: String) {
        self.perturbed = true;
        let perturbation = self.perturbation.map(|p| p.to_string()).unwrap_or_default();
        self.perturbed_lines.push(format!("{perturbation} at {}: {what}", Ms(self.now)));
    }

    /// The failover class: the leader loses its lease with `command` sent; Azure (or the API
    /// server) applies it [`FAILOVER_LATE_MS`] later, after the other replica took over, and its
    /// answer reaches nobody.
    pub(super) fn in_flight(&mut self, command: wit::Command) {
        let at = self.now.saturating_add(FAILOVER_LATE_MS);
        let what = super::describe_command(&command);
        self.perturb(format!(
            "the leader loses its lease with {what} in flight, applied at {}; the other replica takes over",
            Ms(at)
        ));
        self.late = Some((Late::Command(command), at));
    }

    /// `failover-in-pool-tick`: the backend-pool tick due now carries out its first `group`
    /// groups and the leader loses its lease with the next group's write in flight; the write
    /// lands [`FAILOVER_LATE_MS`] after the other replica's first tick, one interval from now.
    /// The rest of what the tick drained is never written; its queue dies with the leader.
    pub(super) fn lose_lease_in_pool_tick(&mut self, group: u64) -> Result<(), LogicError> {
        let Some(pools) = self.pools.as_mut() else { return Ok(()) };
        let at = self.now.saturating_add(pools.interval).saturating_add(FAILOVER_LATE_MS);
        let tick = pools.updater.tick_losing_lease_at(self.now, usize::try_from(group).unwrap_or(usize::MAX));
        let (tick, write) = self.runtime.block_on(tick)?;
        let groups = match tick {
            Tick::Ran(s) => s.groups,
            Tick::Idle | Tick::LockFailed(_) => 0,
        };
        self.points.pool_groups.push(groups as u64);
        let carried_out = usize::try_from(group).unwrap_or(usize::MAX).min(groups);
        let what = match &write {
            Some(write) => format!("its {} in flight, applied at {}", describe_pool_write(write), Ms(at)),
            None => "no write in flight".to_owned(),
        };
        self.perturb(format!(
            "the leader loses its lease during the backend-pool tick, {carried_out} of its {groups} group(s) carried \
             out, {what}; the other replica takes over"
        ));
        self.late = write.map(|write| (Late::PoolWrite(write), at));
        self.restart()
    }

    /// Applies the deposed leader's write in flight once it is due.
    pub(super) fn land_late(&mut self) -> Result<(), LogicError> {
        if self.late.as_ref().is_none_or(|(_, at)| *at > self.now) {
            return Ok(());
        }
        let Some((late, _)) = self.late.take() else { return Ok(()) };
        self.emulator.set_now_ms(self.now);
        let (emulator, cluster) = (self.emulator.clone(), self.cluster.clone());
        let logged = emulator.state().log.len();
        let landed = match &late {
            Late::Command(command) => {
                let outcome = self.runtime.block_on(Executor::new(&*emulator, &*cluster).execute(command));
                let what = super::describe_command(command);
                format!("the deposed leader's {what} lands → {}", super::describe_outcome(&outcome))
            }
            Late::PoolWrite(write) => {
                let outcome = self.runtime.block_on(write.send(&*emulator));
                format!("the deposed leader's {} lands → {}", describe_pool_write(write), outcome_text(&outcome))
            }
        };
        self.excused.push(logged..emulator.state().log.len());
        self.perturbed_lines.push(landed);
        Ok(())
    }

    /// Delivers a batch of watch events, perturbed as the run's perturbation says (the stale and
    /// unobserved classes, `crate::perturbation`).
    pub(super) fn deliver(&mut self, mut events: Vec<wit::Observation>) -> Result<(), LogicError> {
        let index = self.points.deliveries.len() as u64;
        let objects = objects(&events) as u64;
        self.points.deliveries.push(Delivery { events: events.len() as u64, objects });
        let relist_at = self.now.saturating_add(RELIST_AFTER_MS);
        let mut twice = false;
        match self.perturbation {
            Some(Perturbation::Stale { listed_at, .. }) if listed_at == index + 1 => {
                self.watch.snapshot = Some(self.cluster.list());
            }
            Some(Perturbation::Stale { at, .. }) if at == index => {
                let stale = self.watch.snapshot.take().unwrap_or_else(|| self.cluster.list());
                let since = changes_since(&stale, &self.cluster.list());
                self.perturb(format!(
                    "the controller dies; the new one lists an earlier cluster, and the watch then brings {}",
                    described(&since)
                ));
                self.start_from(&stale)?;
                self.watch.hold(since, self.now);
                return Ok(());
            }
            Some(Perturbation::Coalesce(n)) if n == index => {
                self.perturb(format!("held back, to come with the next delivery: {}", described(&events)));
                self.watch.hold(events, relist_at);
                return Ok(());
            }
            Some(Perturbation::Drop { delivery, event }) if delivery == index && event < events.len() as u64 => {
                let lost = events.remove(event as usize);
                let lost = describe_observation(&lost);
                self.perturb(format!("lost: {lost}; the watch re-lists at {}", Ms(relist_at)));
                self.watch.relist_at(relist_at);
            }
            Some(Perturbation::Duplicate(n)) if n == index => {
                self.perturb(format!("delivered twice: {}", described(&events)));
                twice = true;
            }
            Some(Perturbation::Reorder(n)) if n == index && objects > 1 => {
                events = reorder(events);
                self.perturb(format!("delivered in the reverse order of objects: {}", described(&events)));
            }
            _ => {}
        }
        self.observe(&events)?;
        if twice {
            self.observe(&events)?;
        }
        Ok(())
    }
}

/// A backend-pool write for a person.
fn describe_pool_write(write: &PoolWrite) -> String {
    let at = write.pool();
    match write {
        PoolWrite::Delete(_) => format!("DELETE of pool {}/{}", at.load_balancer, at.pool),
        PoolWrite::Put { pool, etag, .. } => {
            let ips: Vec<&str> = pool.addresses.iter().map(|a| a.ip_address.as_str()).collect();
            let condition = if etag.is_some() { "If-Match its GET" } else { "creating it" };
            format!("PUT of pool {}/{} [{}] ({condition})", at.load_balancer, at.pool, ips.join(", "))
        }
    }
}

/// A backend-pool write's outcome for a person.
fn outcome_text(outcome: &GroupOutcome) -> String {
    match outcome {
        GroupOutcome::Updated => "updated".to_owned(),
        GroupOutcome::Created => "written without If-Match (created or replaced)".to_owned(),
        GroupOutcome::Deleted => "deleted".to_owned(),
        GroupOutcome::Unchanged => "nothing to do".to_owned(),
        GroupOutcome::Failed(f) => format!("HTTP {}: {}", f.status, f.message),
    }
}

/// Observations for a person, comma-separated.
fn described(observations: &[wit::Observation]) -> String {
    let all: Vec<String> = observations.iter().map(describe_observation).collect();
    if all.is_empty() { "nothing".to_owned() } else { all.join(", ") }
}
