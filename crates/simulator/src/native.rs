//! The native library (`clb-guest`) behind the simulator's traits (feature `native`):
//! [`NativeReconciler`], the library behind the host's [`Logic`] and the simulator's
//! [`Reconciler`] traits, with [`NativePools`] behind the backend-pool updater's [`PoolLogic`],
//! through the conversions the guest's adapter makes (`clb_sandbox::native`). Differential runs
//! feed the same records to the library and to the component and compare what comes back: the
//! integration tests (`clb-tests`) and the fuzz crate's `differential` target (`fuzz-lib/`).

use crate::simulate::{LogicError, PoolReconciler, Reconciler, Supervised};
use clb_executor::backend_pools::PoolLogic;
use clb_sandbox::GuestError;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::bindings::exports::clb::reconciler::backend_pools as wit_pools;
use clb_sandbox::logic::Logic;
use clb_sandbox::native::{
    WitPoolQueue, config_to_model, observation_to_model, outcome_to_model, place_service_wit, step_to_wit,
};

/// The native library's backend-pool logic behind the updater's [`PoolLogic`]: it cannot trap,
/// so every call answers.
pub struct NativePools(WitPoolQueue);

impl NativePools {
    pub fn new(max_retries: u32) -> Self {
        Self(WitPoolQueue::new(max_retries))
    }
}

impl PoolLogic for NativePools {
    fn place(
        &mut self,
        configurations: &[wit_pools::SlbConfiguration],
        service: &wit::Service,
        facts: &wit_pools::PlacementFacts,
    ) -> Result<wit_pools::Placement, GuestError> {
        Ok(place_service_wit(configurations.to_vec(), service.clone(), facts.clone()))
    }

    fn enqueue(&mut self, operations: &[wit_pools::PoolOperation]) -> Result<(), GuestError> {
        self.0.enqueue(operations.to_vec());
        Ok(())
    }

    fn remove_operations(&mut self, service: &str) -> Result<u32, GuestError> {
        Ok(self.0.remove_operations(service))
    }

    fn status(&mut self, now_ms: u64) -> Result<wit_pools::QueueStatus, GuestError> {
        Ok(self.0.status(now_ms))
    }

    fn drain_and_group(
        &mut self,
        now_ms: u64,
        assignment: &[wit_pools::ServiceAssignment],
    ) -> Result<Vec<wit_pools::PoolGroup>, GuestError> {
        Ok(self.0.drain_and_group(now_ms, assignment.to_vec()))
    }

    fn report(
        &mut self,
        now_ms: u64,
        group: u64,
        outcome: &wit_pools::GroupOutcome,
    ) -> Result<Option<wit_pools::GroupReport>, GuestError> {
        Ok(self.0.report(now_ms, group, outcome.clone()))
    }
}

/// The native library behind [`Logic`] and the simulator's [`Reconciler`], for the differential
/// runs: the same scenario through this and through the component must give the same commands.
#[derive(Default)]
pub struct NativeReconciler {
    tracker: Option<clb_guest::tracker::Tracker>,
}

impl NativeReconciler {
    /// The tracker, once started (the fuzz seeds export its state).
    pub fn state(&self) -> Option<&clb_guest::tracker::Tracker> {
        self.tracker.as_ref()
    }

    fn tracker(&mut self) -> Result<&mut clb_guest::tracker::Tracker, LogicError> {
        self.tracker.as_mut().ok_or(LogicError::NotStarted)
    }
}

impl Logic for NativeReconciler {
    type Error = LogicError;

    fn start(&mut self, config: &wit::Config) -> Result<(), LogicError> {
        let tracker = clb_guest::tracker::Tracker::create(config_to_model(config))
            .map_err(|e| LogicError::ConfigRefused { field: e.field, reason: e.reason, message: e.message })?;
        self.tracker = Some(tracker);
        Ok(())
    }

    fn observe(&mut self, now_ms: u64, batch: &[wit::Observation]) -> Result<wit::Step, LogicError> {
        let batch = batch.iter().map(observation_to_model).collect();
        Ok(step_to_wit(self.tracker()?.observe(now_ms, batch)))
    }

    fn complete(
        &mut self,
        now_ms: u64,
        results: &[(u64, wit::Outcome)],
        arm_remaining_writes: Option<u32>,
    ) -> Result<wit::Step, LogicError> {
        let results = results.iter().map(|(id, outcome)| (*id, outcome_to_model(outcome))).collect();
        Ok(step_to_wit(self.tracker()?.complete_paced(now_ms, results, arm_remaining_writes)))
    }

    fn tick(&mut self, now_ms: u64) -> Result<wit::Step, LogicError> {
        Ok(step_to_wit(self.tracker()?.tick(now_ms)))
    }

    fn stats(&mut self, now_ms: u64) -> Result<wit::TrackerStats, LogicError> {
        Ok(self.tracker()?.stats(now_ms).into())
    }
}

impl Reconciler for NativeReconciler {
    fn pools(&mut self) -> Option<&mut dyn PoolReconciler> {
        Some(self)
    }

    /// The library runs bare: swaps, shadows and traces are the component's.
    fn supervised(&mut self) -> Option<&mut dyn Supervised> {
        None
    }
}

impl PoolReconciler for NativeReconciler {
    fn validate_config(&mut self, config: &wit::Config) -> Result<Result<wit::Mode, wit::ConfigError>, LogicError> {
        Ok(clb_guest::config::validate_config(&config_to_model(config)).map(Into::into).map_err(Into::into))
    }

    fn pool_logic(&mut self, max_retries: u32) -> Result<Box<dyn PoolLogic>, LogicError> {
        Ok(Box::new(NativePools::new(max_retries)))
    }
}
