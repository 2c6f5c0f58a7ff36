//! The WebAssembly adapter: WIT records in, logic types through, WIT records out.
//!
//! Field copies only; no rule lives here. A panic anywhere in the logic is reported through the
//! `diagnostics` import before the instance traps, so the host can say why.

use crate::{admission, config, model, tracker};
use std::cell::RefCell;

wit_bindgen::generate!({
    path: "../wit",
    world: "clb",
});

use clb::reconciler::diagnostics;
use clb::reconciler::types as wit;
use exports::clb::reconciler::{
    backend_pools as wit_pools, reconciler as wit_reconciler, validation as wit_validation,
};

struct Component;
export!(Component);

fn install_panic_hook() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        std::panic::set_hook(Box::new(|info| diagnostics::panicked(&info.to_string())));
    });
}

impl wit_validation::Guest for Component {
    fn validate_config(config: wit::Config) -> Result<wit::Mode, wit::ConfigError> {
        install_panic_hook();
        config::validate_config(&config.into()).map(Into::into).map_err(Into::into)
    }

    fn admit_service(config: wit::Config, service: wit::Service) -> wit_validation::Admission {
        install_panic_hook();
        let (config, service) = (config.into(), service.into());
        let verdict = match admission::admit_service(&config, &service) {
            admission::Verdict::Admitted => wit_validation::Verdict::Admitted,
            admission::Verdict::NothingToProvision => wit_validation::Verdict::NothingToProvision,
            admission::Verdict::Cleanup => wit_validation::Verdict::Cleanup,
            admission::Verdict::Ignored(why) => wit_validation::Verdict::Ignored(why),
            admission::Verdict::Rejected(r) => {
                wit_validation::Verdict::Rejected(wit_validation::Rejection { reason: r.reason, message: r.message })
            }
        };
        wit_validation::Admission { verdict, warnings: admission::warnings(&config, &service) }
    }
}

/// The resource behind `tracker`: WIT methods take `&self`, the logic takes `&mut self`.
struct TrackerResource(RefCell<tracker::Tracker>);

impl wit_reconciler::Guest for Component {
    type Tracker = TrackerResource;
}

impl wit_reconciler::GuestTracker for TrackerResource {
    fn create(config: wit::Config) -> Result<wit_reconciler::Tracker, wit::ConfigError> {
        install_panic_hook();
        let tracker = tracker::Tracker::create(config.into()).map_err(wit::ConfigError::from)?;
        Ok(wit_reconciler::Tracker::new(TrackerResource(RefCell::new(tracker))))
    }

    fn observe(&self, now_ms: u64, batch: Vec<wit::Observation>) -> wit::Step {
        install_panic_hook();
        let batch = batch.into_iter().map(Into::into).collect();
        deliver(self.0.borrow_mut().observe(now_ms, batch))
    }

    fn complete(&self, now_ms: u64, results: Vec<(u64, wit::Outcome)>, arm_remaining_writes: Option<u32>) -> wit::Step {
        install_panic_hook();
        let results = results.into_iter().map(|(id, o)| (id, o.into())).collect();
        deliver(self.0.borrow_mut().complete_paced(now_ms, results, arm_remaining_writes))
    }

    fn tick(&self, now_ms: u64) -> wit::Step {
        install_panic_hook();
        deliver(self.0.borrow_mut().tick(now_ms))
    }

    fn export_state(&self) -> wit::VersionedState {
        install_panic_hook();
        let (version, payload) = self.0.borrow().export_state();
        wit::VersionedState { version, payload }
    }

    fn stats(&self, now_ms: u64) -> wit::TrackerStats {
        install_panic_hook();
        self.0.borrow().stats(now_ms).into()
    }

    fn state_version(&self) -> u32 {
        install_panic_hook();
        self.0.borrow().state_version()
    }

    fn import_state(
        config: wit::Config,
        state: wit::VersionedState,
    ) -> Result<wit_reconciler::Tracker, wit::StateError> {
        install_panic_hook();
        let tracker =
            tracker::Tracker::import_state(config.into(), state.version, &state.payload).map_err(|e| match e {
                tracker::StateError::UnsupportedVersion(v) => wit::StateError::UnsupportedVersion(v),
                tracker::StateError::Corrupt(why) => wit::StateError::Corrupt(why),
                tracker::StateError::InvalidConfig(err) => wit::StateError::InvalidConfig(err.into()),
            })?;
        Ok(wit_reconciler::Tracker::new(TrackerResource(RefCell::new(tracker))))
    }
}

crate::pool_adapter!();

/// The resource behind `pool-queue`.
struct PoolQueueResource(RefCell<WitPoolQueue>);

impl wit_pools::Guest for Component {
    type PoolQueue = PoolQueueResource;

    fn place_service(
        configurations: Vec<wit_pools::SlbConfiguration>,
        service: wit::Service,
        facts: wit_pools::PlacementFacts,
    ) -> wit_pools::Placement {
        install_panic_hook();
        place_service_wit(configurations, service, facts)
    }
}

impl wit_pools::GuestPoolQueue for PoolQueueResource {
    fn create(max_retries: u32) -> wit_pools::PoolQueue {
        install_panic_hook();
        wit_pools::PoolQueue::new(PoolQueueResource(RefCell::new(WitPoolQueue::new(max_retries))))
    }

    fn enqueue(&self, operations: Vec<wit_pools::PoolOperation>) {
        install_panic_hook();
        self.0.borrow_mut().enqueue(operations);
    }

    fn remove_operations(&self, service: String) -> u32 {
        install_panic_hook();
        self.0.borrow_mut().remove_operations(&service)
    }

    fn status(&self, now_ms: u64) -> wit_pools::QueueStatus {
        install_panic_hook();
        self.0.borrow().status(now_ms)
    }

    fn drain_and_group(&self, now_ms: u64, assignment: Vec<wit_pools::ServiceAssignment>) -> Vec<wit_pools::PoolGroup> {
        install_panic_hook();
        self.0.borrow_mut().drain_and_group(now_ms, assignment)
    }

    fn report(&self, now_ms: u64, group: u64, outcome: wit_pools::GroupOutcome) -> Option<wit_pools::GroupReport> {
        install_panic_hook();
        self.0.borrow_mut().report(now_ms, group, outcome)
    }
}

crate::wit_conversions!();

/// A step for the host: its log lines go out through the `diagnostics` import first.
fn deliver(step: model::Step) -> wit::Step {
    for line in &step.logs {
        let level = match line.level {
            model::LogLevel::Debug => diagnostics::Level::Debug,
            model::LogLevel::Info => diagnostics::Level::Info,
            model::LogLevel::Warn => diagnostics::Level::Warn,
            model::LogLevel::Error => diagnostics::Level::Error,
        };
        diagnostics::log(level, &line.message);
    }
    step.into()
}
