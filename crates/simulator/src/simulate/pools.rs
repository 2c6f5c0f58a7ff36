//! The simulation's side of multi-SLB local-service mode: the host's backend-pool updater on
//! the emulator and the cluster, its producer reading the cluster as the logic was told it, and
//! its ticks on virtual time (`explore`'s crash and failover within a tick are in `perturb`).

use super::report::Ms;
use super::{LogicError, PoolSim, Simulation};
use crate::perturbation::Perturbation;
use clb_executor::backend_pools::{
    DEFAULT_MAX_RETRIES, InMemoryLock, PoolUpdater, PoolUpdaterConfig, ServiceLock, Tick,
};
use clb_executor::pool_producer::{AzureFacts, PoolProducer, RECHECK_AT_TICK, canonical_ip};
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::bindings::exports::clb::reconciler::backend_pools::Placement;
use clb_sandbox::trace::{Ended, arg, lazy};
use std::collections::BTreeSet;
use std::time::Duration;

impl Simulation<'_> {
    /// In multi-SLB local-service mode (the guest's `validate-config` says so), a new
    /// backend-pool updater and producer for the controller that starts; nothing in any other.
    pub(super) fn start_pools(&mut self) -> Result<(), LogicError> {
        let scenario = self.scenario;
        if scenario.config.multiple_standard_load_balancers.is_empty() {
            return Ok(());
        }
        let recorder = self.logic.supervised().and_then(|logic| logic.recorder());
        let pools = self.logic.pools().ok_or(LogicError::PoolsUnsupported)?;
        let mode = pools.validate_config(&scenario.config);
        if let Some(recorder) = &recorder {
            let ended = match &mode {
                Ok(mode) => Ended::Returned(lazy(mode.clone())),
                Err(error) => Ended::Trapped(error.to_string()),
            };
            recorder.call("validate-config", vec![arg(scenario.config.clone())], ended);
        }
        let mode = mode?;
        if mode == Ok(wit::Mode::MultiSlbLocalServices) {
            let interval = scenario.azure.pool_update_interval_ms();
            let config =
                PoolUpdaterConfig { interval: Duration::from_millis(interval), max_retries: DEFAULT_MAX_RETRIES };
            let mut updater = PoolUpdater::over(
                pools.pool_logic(config.max_retries)?,
                self.emulator.clone(),
                InMemoryLock::new(),
                self.cluster.clone(),
                ServiceLock::default(),
                config,
            );
            if let Some(recorder) = recorder {
                updater = updater.with_recorder(recorder);
            }
            self.pools = Some(PoolSim {
                updater,
                configurations: scenario.slb_configurations.clone(),
                cluster_name: scenario.cluster_name.clone(),
                interval,
                next_tick: self.now.saturating_add(interval),
                ticks: 0,
                producer: PoolProducer::new(),
            });
            self.produce_pool_operations()?;
        }
        Ok(())
    }

    /// The producer: every Service's placement and the node IPs of its ready endpoints, against
    /// what was enqueued for it last, from the cluster as the logic was told it
    /// ([`Simulation::watched`]). Runs as a reconcile does, under the service reconcile lock.
    pub(super) fn produce_pool_operations(&mut self) -> Result<(), LogicError> {
        let Some(pools) = self.pools.as_mut() else { return Ok(()) };
        if !self.watched.listed() {
            return Ok(());
        }
        if let Some(nodes) = self.watched.nodes_if_changed() {
            pools.updater.set_nodes(nodes);
        }
        // Every Service is recomputed, which a scenario's size makes cheap (`run` recomputes
        // those a batch touched).
        self.watched.take_changed();
        let resources = self.emulator.resources();
        // Read as the reconcile's listing of the resource group would, without an Azure call.
        let (load_balancers, public_ips) = self.emulator.listing();
        let resource_group = &self.emulator.scope().resource_group;
        let azure = AzureFacts::listed(load_balancers, public_ips, resource_group, &pools.cluster_name);
        let service_lock = pools.updater.service_lock().clone();
        let reconciling = self.runtime.block_on(service_lock.lock());
        let (mut placed, mut present) = (BTreeSet::new(), BTreeSet::new());
        for key in self.watched.services() {
            let Some((record, ips)) = self.watched.service(key) else { continue };
            let key = format!("{}/{}", record.namespace, record.name);
            present.insert(key.to_ascii_lowercase());
            let namespace = self.cluster.namespace_labels(&record.namespace);
            let placement = match pools.producer.place(
                &pools.updater,
                &pools.configurations,
                &record,
                namespace,
                &azure,
                &mut self.pool_lines,
            )? {
                (Placement::NotLocal(_), _) => continue,
                (Placement::Refused(message), new) => {
                    // What was enqueued for it stays, as upstream leaves a failed reconcile's work.
                    placed.insert(key.to_ascii_lowercase());
                    if new {
                        self.pool_lines.push(format!("{key} cannot be placed: {message}"));
                        self.runtime.block_on(pools.updater.refuse_placement(&key, &message));
                    }
                    continue;
                }
                (Placement::At(placement), _) => placement,
            };
            placed.insert(key.to_ascii_lowercase());
            let load_balancer = placement.load_balancer.clone();
            let pool_contents = |pool: &str| azure_pool(&resources, &load_balancer, pool);
            let notes = &mut self.pool_lines;
            pools.producer.update(&pools.updater, &reconciling, &key, placement, ips, pool_contents, notes)?;
        }
        let unplaced: Vec<String> =
            pools.producer.known().filter(|k| !placed.contains(*k)).map(str::to_owned).collect();
        for folded in unplaced {
            pools.producer.forget(&pools.updater, &reconciling, &folded, &mut self.pool_lines)?;
        }
        pools.producer.keep_refused(&placed);
        pools.producer.keep_present(&present);
        Ok(())
    }

    /// One tick of the backend-pool updater at the current instant.
    pub(super) fn pool_tick(&mut self) -> Result<(), LogicError> {
        if self.pools.is_none() {
            return Ok(());
        }
        // Every tick is a point, with work queued or not: asking the queue would be a call into
        // the logic, which a run's trace would record.
        let index = self.points.pool_ticks;
        self.points.pool_ticks += 1;
        if self.perturbation == Some(Perturbation::CrashBeforePoolTick(index)) {
            self.perturb("the controller dies before the backend-pool tick; a new one starts".to_owned());
            return self.restart();
        }
        let Some(pools) = self.pools.as_mut() else { return Ok(()) };
        pools.next_tick = self.now.saturating_add(pools.interval);
        self.emulator.set_now_ms(self.now);
        match self.perturbation {
            Some(Perturbation::CrashInPoolTick { tick, after }) if tick == index => {
                return self.die_in_pool_tick(after);
            }
            Some(Perturbation::FailoverInPoolTick { tick, group }) if tick == index => {
                return self.lose_lease_in_pool_tick(group);
            }
            _ => {}
        }
        let tick = self.runtime.block_on(pools.updater.tick_at(self.now))?;
        pools.ticks += 1;
        if pools.ticks == RECHECK_AT_TICK {
            let resources = self.emulator.resources();
            let contents = |load_balancer: &str, pool: &str| azure_pool(&resources, load_balancer, pool);
            let reconciling = self.runtime.block_on(pools.updater.service_lock().lock());
            pools.producer.recheck(&pools.updater, &reconciling, contents, &mut self.pool_lines)?;
        }
        self.points.pool_groups.push(match &tick {
            Tick::Ran(s) => s.groups as u64,
            Tick::Idle | Tick::LockFailed(_) => 0,
        });
        match tick {
            Tick::Idle => {}
            Tick::LockFailed(err) => self.pool_lines.push(format!("tick at {}: {err}", Ms(self.now))),
            Tick::Ran(s) => {
                let made = if s.created + s.deleted > 0 {
                    format!(" ({} created, {} deleted)", s.created, s.deleted)
                } else {
                    String::new()
                };
                self.pool_lines.push(format!(
                    "tick at {}: {} group(s): {} written{made}, {} unchanged, {} requeued, {} dropped, {} abandoned",
                    Ms(self.now),
                    s.groups,
                    s.written,
                    s.unchanged,
                    s.requeued,
                    s.dropped,
                    s.abandoned
                ));
            }
        }
        Ok(())
    }

    /// Nothing queued for the backend-pool updater (always, outside multi-SLB mode).
    pub(super) fn pools_idle(&self) -> Result<bool, LogicError> {
        match &self.pools {
            None => Ok(true),
            Some(pools) => Ok(pools.updater.status_at(self.now)?.queued == 0),
        }
    }
}

/// The canonical IPs a backend pool holds in the emulated Azure (`None`: no such pool), read
/// without an Azure call.
pub(super) fn azure_pool(
    resources: &clb_emulator::core::Resources,
    load_balancer: &str,
    pool: &str,
) -> Option<BTreeSet<String>> {
    let pool = resources.backend_pools.get(&clb_emulator::core::pool_key(load_balancer, pool))?;
    Some(pool.addresses.iter().map(|a| canonical_ip(&a.properties.ip_address)).collect())
}
