//! A guest that misbehaves on purpose, for the sandbox tests. It exports the real `clb` world;
//! `admit-service` does what the Service's name says:
//!
//! * `spin` loops forever (stopped by fuel or the epoch deadline);
//! * `grow` allocates until the memory cap stops it;
//! * `panic` panics with a message the host must report;
//! * anything else is admitted.
//!
//! Never built into the product: only `tests/build.rs` builds it.

wit_bindgen::generate!({ path: "../../wit", world: "clb" });

use clb::reconciler::types::{
    Config, ConfigError, Mode, Observation, Outcome, Service, StateError, Step, TrackerStats, VersionedState,
};
use exports::clb::reconciler::backend_pools::{
    GroupOutcome, GroupReport, Guest as PoolsGuest, GuestPoolQueue, Placement, PlacementFacts, PoolGroup,
    PoolOperation, PoolQueue, QueueStatus, ServiceAssignment, SlbConfiguration,
};
use exports::clb::reconciler::reconciler::{Guest as ReconcilerGuest, GuestTracker, Tracker};
use exports::clb::reconciler::validation::{Admission, Guest as ValidationGuest, Verdict};

struct Hostile;
// Only a wasm build exports: the export names (`clb:reconciler/...#admit-service`) are not
// symbols a native linker accepts, and the workspace is built and linted natively too.
#[cfg(target_arch = "wasm32")]
export!(Hostile);

fn report_panics() {
    std::panic::set_hook(Box::new(|info| clb::reconciler::diagnostics::panicked(&info.to_string())));
}

impl ValidationGuest for Hostile {
    fn validate_config(_config: Config) -> Result<Mode, ConfigError> {
        Ok(Mode::Inactive)
    }

    fn admit_service(_config: Config, service: Service) -> Admission {
        report_panics();
        match service.name.as_str() {
            "spin" => {
                let mut n = 0u64;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "grow" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(std::hint::black_box(vec![1u8; 1 << 20]));
                }
            }
            "panic" => panic!("hostile guest: asked to panic by service {}/{}", service.namespace, service.name),
            _ => Admission { verdict: Verdict::Admitted, warnings: Vec::new() },
        }
    }
}

struct NoState;

impl ReconcilerGuest for Hostile {
    type Tracker = NoState;
}

impl GuestTracker for NoState {
    fn create(_config: Config) -> Result<Tracker, ConfigError> {
        Ok(Tracker::new(NoState))
    }
    fn observe(&self, _now_ms: u64, _batch: Vec<Observation>) -> Step {
        Step { commands: Vec::new(), wake_at_ms: None, idle: true }
    }
    fn complete(&self, _now_ms: u64, _results: Vec<(u64, Outcome)>, _arm_remaining_writes: Option<u32>) -> Step {
        Step { commands: Vec::new(), wake_at_ms: None, idle: true }
    }
    fn tick(&self, _now_ms: u64) -> Step {
        Step { commands: Vec::new(), wake_at_ms: None, idle: true }
    }
    fn export_state(&self) -> VersionedState {
        VersionedState { version: 0, payload: Vec::new() }
    }
    fn state_version(&self) -> u32 {
        0
    }
    fn stats(&self, _now_ms: u64) -> TrackerStats {
        TrackerStats {
            service_gateway_enabled: false,
            pending: Vec::new(),
            k8s_services: 0,
            nrp_load_balancers: 0,
            nrp_nat_gateways: 0,
            nrp_locations: 0,
            nrp_addresses: 0,
            pending_deletions: 0,
            blocked_by_locations: 0,
            pod_finalizers_held: 0,
            commands_in_flight: 0,
            attempts: Vec::new(),
            durations: Vec::new(),
            retries: Vec::new(),
            parked: Vec::new(),
            orphans_cleaned: 0,
            delete_substep_failures: Vec::new(),
            location_sync_terminal_errors: 0,
            initialized_after_ms: None,
            budgets: Vec::new(),
        }
    }
    fn import_state(_config: Config, _state: VersionedState) -> Result<Tracker, StateError> {
        Ok(Tracker::new(NoState))
    }
}

/// A queue that forgets everything: the sandbox tests never call it.
struct NoQueue;

impl PoolsGuest for Hostile {
    type PoolQueue = NoQueue;

    fn place_service(_configurations: Vec<SlbConfiguration>, _service: Service, _facts: PlacementFacts) -> Placement {
        Placement::NotLocal(Vec::new())
    }
}

impl GuestPoolQueue for NoQueue {
    fn create(_max_retries: u32) -> PoolQueue {
        PoolQueue::new(NoQueue)
    }
    fn enqueue(&self, _operations: Vec<PoolOperation>) {}
    fn remove_operations(&self, _service: String) -> u32 {
        0
    }
    fn status(&self, _now_ms: u64) -> QueueStatus {
        QueueStatus { queued: 0, ready: false, wake_at_ms: None }
    }
    fn drain_and_group(&self, _now_ms: u64, _assignment: Vec<ServiceAssignment>) -> Vec<PoolGroup> {
        Vec::new()
    }
    fn report(&self, _now_ms: u64, _group: u64, _outcome: GroupOutcome) -> Option<GroupReport> {
        None
    }
}
