//! The sandbox the guest runs in.
//!
//! One [`Runtime`] (one `Engine` and its epoch ticker) per process; one [`LoadedLogic`] (a compiled
//! `Component` with its `InstancePre`) per version of the logic; a [`Session`] (a `Store` and an
//! instance) per run of calls. The host grants the guest nothing but the project's own
//! `diagnostics` interface and refuses at load a component that imports anything else. Every
//! call runs under a fuel budget, an epoch deadline and a memory cap; hitting one, or any other
//! trap, is a [`GuestError`] and never takes the host down.
//!
//! Around it, in layers (ARCHITECTURE.md, invariant 12), what keeps a logic serving: the
//! [`supervisor`] (checkpoints, trap recovery, rollback, hot and staged swaps, a candidate in
//! [`supervisor::shadow`]), the [`trace`]s of its calls, the logic's own [`figures`], and what
//! every way a component comes in shares ([`compression`], [`bounded`] reads, [`error_text`]);
//! and [`logic::Logic`], the logic's calls as every driver makes them.

pub mod bounded;
pub mod compression;
pub mod error_text;
pub mod figures;
#[cfg(unix)]
pub mod linear_memory;
pub mod logic;
#[cfg(feature = "native")]
pub mod native;
pub mod supervisor;
pub mod trace;

/// The logic this host was built with, used when no other component is given.
pub const BUILTIN_GUEST: &[u8] = include_bytes!(env!("CLB_BUILTIN_GUEST"));
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use wasmtime::component::{Component, Func, Instance, Linker, ResourceAny, Val, types::ComponentItem};
use wasmtime::{Config as EngineConfig, Engine, Store, Trap};

/// Generated bindings of the `clb` world.
pub mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "clb",
        // Serialize: traces encode the host's values through serde (`trace::canonical`).
        additional_derives: [PartialEq, Eq, Hash, serde::Serialize],
    });
}

use bindings::clb::reconciler::types::{Config, ConfigError, Mode, Observation, Outcome, Step, VersionedState};
use bindings::exports::clb::reconciler::backend_pools::{
    GroupOutcome, GroupReport, Placement, PlacementFacts, PoolGroup, PoolOperation, QueueStatus, ServiceAssignment,
    SlbConfiguration,
};
use bindings::exports::clb::reconciler::validation::Admission;
use bindings::{Clb, ClbPre};

/// Every name [`command_name`] gives: the WIT's names of the `command` cases.
pub const COMMAND_NAMES: [&str; 11] = [
    "emit-event",
    "read-nrp",
    "read-arm",
    "update-services",
    "update-address-locations",
    "put-public-ip",
    "put-load-balancer",
    "put-nat-gateway",
    "delete-resource",
    "patch-service-status",
    "set-finalizer",
];

/// The name of a command in logs and reports, as the WIT spells it.
pub fn command_name(command: &bindings::clb::reconciler::types::Command) -> &'static str {
    let index = match command {
        bindings::clb::reconciler::types::Command::EmitEvent(_) => 0,
        bindings::clb::reconciler::types::Command::ReadNrp => 1,
        bindings::clb::reconciler::types::Command::ReadArm => 2,
        bindings::clb::reconciler::types::Command::UpdateServices(_) => 3,
        bindings::clb::reconciler::types::Command::UpdateAddressLocations(_) => 4,
        bindings::clb::reconciler::types::Command::PutPublicIp(_) => 5,
        bindings::clb::reconciler::types::Command::PutLoadBalancer(_) => 6,
        bindings::clb::reconciler::types::Command::PutNatGateway(_) => 7,
        bindings::clb::reconciler::types::Command::DeleteResource(_) => 8,
        bindings::clb::reconciler::types::Command::PatchServiceStatus(_) => 9,
        bindings::clb::reconciler::types::Command::SetFinalizer(_) => 10,
    };
    COMMAND_NAMES[index]
}

/// The WIT package this host speaks.
pub const PACKAGE: &str = "clb:reconciler";
/// Its version; a component is compatible when its package version is semver-compatible.
pub const PACKAGE_VERSION: semver::Version = semver::Version::new(0, 14, 0);
/// Interfaces of [`PACKAGE`] a component may import. `types` has no functions: it is imported
/// implicitly by interfaces that `use` it.
pub const GRANTED_INTERFACES: &[&str] = &["diagnostics", "types"];
/// Interfaces of [`PACKAGE`] a component must export.
pub const REQUIRED_EXPORTS: &[&str] = &["validation", "reconciler", "backend-pools"];

/// How often the epoch advances; deadlines are rounded up to it.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Bounds on every call into the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Fuel (roughly, wasm instructions) one call may use.
    pub fuel: u64,
    /// Wall-clock time one call may take.
    pub deadline: Duration,
    /// The most linear memory the instance may hold, in bytes.
    pub memory_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { fuel: 20_000_000_000, deadline: Duration::from_secs(10), memory_bytes: 512 << 20 }
    }
}

/// Why a component could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("creating the wasmtime engine failed: {0}")]
    Engine(String),
    #[error("the file is not a valid WebAssembly component: {0}")]
    Invalid(String),
    #[error("the component imports `{name}`, which this host does not grant (it grants only {PACKAGE}/{{{}}}@{PACKAGE_VERSION} and compatible versions)", GRANTED_INTERFACES.join(","))]
    ForbiddenImport { name: String },
    #[error(
        "the component does not export `{PACKAGE}/{interface}@{PACKAGE_VERSION}` or a semver-compatible version (its exports: {exports})"
    )]
    MissingExport { interface: String, exports: String },
    #[error("linking the component against this host failed: {0}")]
    Link(String),
}

/// Why a call into the guest failed. The host survives every one of these; after any but
/// `Refused` the session's instance is unusable and a new session is needed.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    #[error("`{call}` used its whole fuel budget of {budget}")]
    FuelExhausted { call: &'static str, budget: u64 },
    #[error("`{call}` ran past its deadline of {deadline:?}")]
    DeadlineExceeded { call: &'static str, deadline: Duration },
    #[error("`{call}` asked for {requested} bytes of linear memory, over the cap of {cap}")]
    MemoryCapExceeded { call: &'static str, requested: usize, cap: usize },
    #[error("`{call}` panicked: {message}")]
    Panicked { call: &'static str, message: String },
    #[error("`{call}` trapped: {trap}")]
    Trapped { call: &'static str, trap: String },
    #[error("`{call}` was refused: an earlier call trapped and left this instance unusable")]
    Poisoned { call: &'static str },
    #[error("instantiating the guest failed: {0}")]
    Instantiate(String),
}

impl GuestError {
    /// A short label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            GuestError::FuelExhausted { .. } => "fuel",
            GuestError::DeadlineExceeded { .. } => "deadline",
            GuestError::MemoryCapExceeded { .. } => "memory",
            GuestError::Panicked { .. } => "panic",
            GuestError::Trapped { .. } => "trap",
            GuestError::Poisoned { .. } => "poisoned",
            GuestError::Instantiate(_) => "instantiate",
        }
    }
}

/// The error the memory limiter raises; carried through the trap to classify it.
#[derive(Debug, thiserror::Error)]
#[error("linear memory of {requested} bytes requested, cap {cap}")]
struct MemoryCapHit {
    requested: usize,
    cap: usize,
}

/// Counters of one [`LoadedLogic`]: what its calls cost and how they ended.
#[derive(Debug, Default)]
pub struct GuestStats {
    pub calls: AtomicU64,
    pub fuel_used: AtomicU64,
    pub failures_fuel: AtomicU64,
    pub failures_deadline: AtomicU64,
    pub failures_memory: AtomicU64,
    pub failures_panic: AtomicU64,
    pub failures_trap: AtomicU64,
    pub failures_other: AtomicU64,
}

impl GuestStats {
    fn record_failure(&self, err: &GuestError) {
        let counter = match err {
            GuestError::FuelExhausted { .. } => &self.failures_fuel,
            GuestError::DeadlineExceeded { .. } => &self.failures_deadline,
            GuestError::MemoryCapExceeded { .. } => &self.failures_memory,
            GuestError::Panicked { .. } => &self.failures_panic,
            GuestError::Trapped { .. } => &self.failures_trap,
            GuestError::Poisoned { .. } | GuestError::Instantiate(_) => &self.failures_other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Which limits the engine compiles into guest code. Both are on in every command of
/// `clb-host`; turning them off exists to measure what they cost (BENCHMARKS.md), since a
/// guest without them can loop forever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metering {
    pub fuel: bool,
    pub epoch: bool,
}

impl Default for Metering {
    fn default() -> Self {
        Self { fuel: true, epoch: true }
    }
}

/// The process-wide engine and the thread that advances its epoch.
pub struct Runtime {
    engine: Engine,
    metering: Metering,
    stop: Arc<AtomicBool>,
    #[cfg(unix)]
    memories: Arc<linear_memory::RecyclingMemories>,
}

impl Runtime {
    pub fn new() -> Result<Self, LoadError> {
        Self::with_metering(Metering::default())
    }

    pub fn with_metering(metering: Metering) -> Result<Self, LoadError> {
        let mut config = EngineConfig::new();
        config.wasm_component_model(true).consume_fuel(metering.fuel).epoch_interruption(metering.epoch);
        // For `perf`: the guest's compiled functions named in /tmp/perf-PID.map (BENCHMARKS.md,
        // "Profiling the guest"). Off unless asked for; it costs nothing when off.
        if std::env::var_os("CLB_PERF_MAP").is_some() {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        // Recycled memories are plain mappings: the copy-on-write data image needs wasmtime's
        // own, so data segments are copied in at instantiation instead (a few kilobytes).
        #[cfg(unix)]
        let memories = Arc::new(linear_memory::RecyclingMemories::new());
        #[cfg(unix)]
        config.with_host_memory(memories.clone()).memory_init_cow(false);
        let engine = Engine::new(&config).map_err(|e| LoadError::Engine(e.to_string()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (ticker_engine, ticker_stop) = (engine.weak(), stop.clone());
        std::thread::Builder::new()
            .name("clb-epoch".into())
            .spawn(move || {
                while !ticker_stop.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    match ticker_engine.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .map_err(|e| LoadError::Engine(format!("starting the epoch thread: {e}")))?;
        Ok(Self {
            engine,
            metering,
            stop,
            #[cfg(unix)]
            memories,
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The engine's memory creator, whose counts `/metrics` shows.
    #[cfg(unix)]
    pub fn memories(&self) -> &Arc<linear_memory::RecyclingMemories> {
        &self.memories
    }

    /// Compiles a component without judging it (for `inspect`).
    pub fn compile(&self, bytes: &[u8]) -> Result<Component, LoadError> {
        self.loader().compile(bytes)
    }

    /// Compiles, checks and prepares a component for cheap instantiation.
    pub fn load(&self, bytes: &[u8], limits: Limits) -> Result<LoadedLogic, LoadError> {
        self.loader().load(bytes, limits)
    }

    /// What loads components on another thread than the one holding the runtime.
    pub fn loader(&self) -> Loader {
        Loader { engine: self.engine.clone(), metering: self.metering }
    }
}

/// Loads components for a [`Runtime`]: its engine (shared), cheap to clone and to move into a
/// blocking task, so that compiling a new version does not hold up the thread that serves the
/// running one. The epoch thread stays the runtime's.
#[derive(Clone)]
pub struct Loader {
    engine: Engine,
    metering: Metering,
}

impl Loader {
    /// See [`Runtime::compile`].
    pub fn compile(&self, bytes: &[u8]) -> Result<Component, LoadError> {
        Component::new(&self.engine, bytes).map_err(|e| LoadError::Invalid(format!("{e:#}")))
    }

    /// See [`Runtime::load`].
    pub fn load(&self, bytes: &[u8], limits: Limits) -> Result<LoadedLogic, LoadError> {
        let component = self.compile(bytes)?;
        let info = ComponentInfo::of(&self.engine, &component, bytes);
        info.check()?;
        let mut linker = Linker::<HostState>::new(&self.engine);
        Clb::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(&mut linker, |state| state)
            .map_err(|e| LoadError::Link(format!("{e:#}")))?;
        let pre = linker.instantiate_pre(&component).map_err(|e| LoadError::Link(format!("{e:#}")))?;
        let pre = ClbPre::new(pre).map_err(|e| LoadError::Link(format!("{e:#}")))?;
        Ok(LoadedLogic {
            engine: self.engine.clone(),
            metering: self.metering,
            pre,
            info,
            limits,
            stats: Arc::default(),
        })
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What a component says about itself.
#[derive(Clone, Debug)]
pub struct ComponentInfo {
    pub sha256: String,
    pub size: usize,
    /// Every import, and whether this host grants it.
    pub imports: Vec<(String, bool)>,
    pub exports: Vec<String>,
}

impl ComponentInfo {
    pub fn of(engine: &Engine, component: &Component, bytes: &[u8]) -> Self {
        let ty = component.component_type();
        let imports = ty.imports(engine).map(|(name, _)| (name.to_owned(), is_granted(name))).collect();
        let exports = ty
            .exports(engine)
            .filter(|(_, item)| matches!(item.ty, ComponentItem::ComponentInstance(_)))
            .map(|(name, _)| name.to_owned())
            .collect();
        Self { sha256: hex(&Sha256::digest(bytes)), size: bytes.len(), imports, exports }
    }

    /// The version of [`PACKAGE`] the component exports, if it exports it at all.
    pub fn package_version(&self) -> Option<semver::Version> {
        self.exports.iter().find_map(|name| split_interface_name(name).map(|(_, _, version)| version))
    }

    /// Refuses a component that imports what the host does not grant or lacks an export.
    pub fn check(&self) -> Result<(), LoadError> {
        if let Some((name, _)) = self.imports.iter().find(|(_, granted)| !granted) {
            return Err(LoadError::ForbiddenImport { name: name.clone() });
        }
        for interface in REQUIRED_EXPORTS {
            let exported = self.exports.iter().any(|name| {
                split_interface_name(name).is_some_and(|(package, iface, version)| {
                    package == PACKAGE && iface == *interface && compatible(&version)
                })
            });
            if !exported {
                return Err(LoadError::MissingExport {
                    interface: interface.to_string(),
                    exports: if self.exports.is_empty() { "none".into() } else { self.exports.join(", ") },
                });
            }
        }
        Ok(())
    }
}

/// The sha256 of `bytes` in lower-case hex, as [`ComponentInfo::sha256`] gives it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `ns:pkg/iface@version` → (`ns:pkg`, `iface`, version).
fn split_interface_name(name: &str) -> Option<(&str, &str, semver::Version)> {
    let (path, version) = name.split_once('@')?;
    let (package, interface) = path.split_once('/')?;
    Some((package, interface, semver::Version::parse(version).ok()?))
}

/// Semver compatibility with [`PACKAGE_VERSION`] (for 0.x, the same minor version).
fn compatible(version: &semver::Version) -> bool {
    let host = &PACKAGE_VERSION;
    if host.major == 0 { version.major == 0 && version.minor == host.minor } else { version.major == host.major }
}

fn is_granted(import: &str) -> bool {
    split_interface_name(import).is_some_and(|(package, interface, version)| {
        package == PACKAGE && GRANTED_INTERFACES.contains(&interface) && compatible(&version)
    })
}

/// A loaded version of the logic. Cheap to clone: the compiled code and its counters are
/// shared.
#[derive(Clone)]
pub struct LoadedLogic {
    engine: Engine,
    metering: Metering,
    pre: ClbPre<HostState>,
    info: ComponentInfo,
    limits: Limits,
    stats: Arc<GuestStats>,
}

impl LoadedLogic {
    pub fn info(&self) -> &ComponentInfo {
        &self.info
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn stats(&self) -> &GuestStats {
        &self.stats
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The compiled component (what a trace's schema reads its exports from).
    pub fn component(&self) -> &wasmtime::component::Component {
        self.pre.instance_pre().component()
    }

    /// A fresh instance in its own store.
    pub fn session(&self) -> Result<Session, GuestError> {
        let mut store = Store::new(&self.engine, HostState::new(self.limits.memory_bytes));
        store.limiter(|state| &mut state.limiter);
        store.epoch_deadline_trap();
        // What one call may hand the host (wasmtime's "hostcall fuel", 128 MiB by default): as
        // much as the guest may hold. The default refused the exported state of a cluster of
        // 20,000 nodes and 600,000 pods (about 150 MB), so every checkpoint and swap failed; the
        // memory cap already bounds what the guest can hand over.
        store.set_hostcall_fuel(self.limits.memory_bytes);
        // Instantiation runs guest code (start functions, data segments) under the same limits.
        set_budget(&mut store, self.limits, self.metering).map_err(|e| GuestError::Instantiate(format!("{e:#}")))?;
        let instance = self
            .pre
            .instance_pre()
            .instantiate(&mut store)
            .map_err(|e| classify(&e, "instantiate", self.limits, &store))?;
        let bindings = Clb::new(&mut store, &instance).map_err(|e| classify(&e, "instantiate", self.limits, &store))?;
        Ok(Session {
            store,
            instance,
            bindings,
            limits: self.limits,
            metering: self.metering,
            stats: self.stats.clone(),
            poisoned: false,
        })
    }
}

fn set_budget(store: &mut Store<HostState>, limits: Limits, metering: Metering) -> wasmtime::Result<()> {
    if metering.fuel {
        store.set_fuel(limits.fuel)?;
    }
    if !metering.epoch {
        return Ok(());
    }
    let ticks = limits.deadline.as_nanos().div_ceil(EPOCH_TICK.as_nanos()).max(1);
    // One tick more: the ticker may advance the epoch right after the deadline is set.
    store.set_epoch_deadline(u64::try_from(ticks).unwrap_or(u64::MAX).saturating_add(1));
    Ok(())
}

/// Turns a failed call into a typed error.
fn classify(err: &wasmtime::Error, call: &'static str, limits: Limits, store: &Store<HostState>) -> GuestError {
    if let Some(hit) = err.downcast_ref::<MemoryCapHit>() {
        return GuestError::MemoryCapExceeded { call, requested: hit.requested, cap: hit.cap };
    }
    match err.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => GuestError::FuelExhausted { call, budget: limits.fuel },
        Some(Trap::Interrupt) => GuestError::DeadlineExceeded { call, deadline: limits.deadline },
        _ => match store.data().panic.clone() {
            Some(message) => GuestError::Panicked { call, message },
            None => GuestError::Trapped { call, trap: format!("{err:#}") },
        },
    }
}

/// An instance and its store: one run of calls.
pub struct Session {
    store: Store<HostState>,
    instance: Instance,
    bindings: Clb,
    limits: Limits,
    metering: Metering,
    stats: Arc<GuestStats>,
    poisoned: bool,
}

impl Session {
    /// Runs one call under the limits. Any failure poisons the session: wasmtime leaves a
    /// trapped instance unusable.
    pub fn call<R>(
        &mut self,
        call: &'static str,
        f: impl FnOnce(&Clb, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R, GuestError> {
        if self.poisoned {
            let err = GuestError::Poisoned { call };
            self.stats.record_failure(&err);
            return Err(err);
        }
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        self.store.data_mut().panic = None;
        set_budget(&mut self.store, self.limits, self.metering)
            .map_err(|e| GuestError::Trapped { call, trap: format!("{e:#}") })?;
        let result = f(&self.bindings, &mut self.store);
        if let Ok(left) = self.store.get_fuel() {
            self.stats.fuel_used.fetch_add(self.limits.fuel.saturating_sub(left), Ordering::Relaxed);
        }
        result.map_err(|e| {
            self.poisoned = true;
            let err = classify(&e, call, self.limits, &self.store);
            self.stats.record_failure(&err);
            tracing::warn!(call, kind = err.kind(), error = %err, "guest call failed");
            err
        })
    }

    /// The exported function `export` of `interface` (names as the component gives them), for
    /// calls by value ([`Self::call_dynamic`]): replaying a trace through any component.
    pub fn export(&mut self, interface: &str, export: &str) -> Option<Func> {
        let outer = self.instance.get_export_index(&mut self.store, None, interface)?;
        let index = self.instance.get_export_index(&mut self.store, Some(&outer), export)?;
        self.instance.get_func(&mut self.store, index)
    }

    /// Calls `func` with `params` under the limits, like every typed call.
    pub fn call_dynamic(&mut self, call: &'static str, func: Func, params: &[Val]) -> Result<Vec<Val>, GuestError> {
        let results = func.ty(&self.store).results().len();
        self.call(call, |_, store| {
            let mut out = vec![Val::Bool(false); results];
            func.call(&mut *store, params, &mut out)?;
            Ok(out)
        })
    }

    /// Bytes of the instance's linear memory (a guest's memory only grows).
    pub fn memory_bytes(&self) -> usize {
        self.store.data().limiter.size
    }

    /// Fuel the last call left unused.
    pub fn fuel_left(&self) -> u64 {
        self.store.get_fuel().unwrap_or(0)
    }

    pub fn validate_config(&mut self, config: &Config) -> Result<Result<Mode, ConfigError>, GuestError> {
        self.call("validate-config", |b, s| b.clb_reconciler_validation().call_validate_config(s, config))
    }

    pub fn admit_service(
        &mut self,
        config: &Config,
        service: &bindings::clb::reconciler::types::Service,
    ) -> Result<Admission, GuestError> {
        self.call("admit-service", |b, s| b.clb_reconciler_validation().call_admit_service(s, config, service))
    }

    pub fn tracker_create(&mut self, config: &Config) -> Result<Result<ResourceAny, ConfigError>, GuestError> {
        self.call("tracker.create", |b, s| b.clb_reconciler_reconciler().tracker().call_create(s, config))
    }

    pub fn tracker_import(
        &mut self,
        config: &Config,
        state: &VersionedState,
    ) -> Result<Result<ResourceAny, bindings::clb::reconciler::types::StateError>, GuestError> {
        self.call("tracker.import-state", |b, s| {
            b.clb_reconciler_reconciler().tracker().call_import_state(s, config, state)
        })
    }

    pub fn tracker_observe(
        &mut self,
        tracker: ResourceAny,
        now_ms: u64,
        batch: &[Observation],
    ) -> Result<Step, GuestError> {
        self.call("tracker.observe", |b, s| {
            b.clb_reconciler_reconciler().tracker().call_observe(s, tracker, now_ms, batch)
        })
    }

    pub fn tracker_complete(
        &mut self,
        tracker: ResourceAny,
        now_ms: u64,
        results: &[(u64, Outcome)],
        arm_remaining_writes: Option<u32>,
    ) -> Result<Step, GuestError> {
        self.call("tracker.complete", |b, s| {
            b.clb_reconciler_reconciler().tracker().call_complete(s, tracker, now_ms, results, arm_remaining_writes)
        })
    }

    pub fn tracker_tick(&mut self, tracker: ResourceAny, now_ms: u64) -> Result<Step, GuestError> {
        self.call("tracker.tick", |b, s| b.clb_reconciler_reconciler().tracker().call_tick(s, tracker, now_ms))
    }

    pub fn tracker_export(&mut self, tracker: ResourceAny) -> Result<VersionedState, GuestError> {
        self.call("tracker.export-state", |b, s| b.clb_reconciler_reconciler().tracker().call_export_state(s, tracker))
    }

    pub fn tracker_stats(
        &mut self,
        tracker: ResourceAny,
        now_ms: u64,
    ) -> Result<bindings::clb::reconciler::types::TrackerStats, GuestError> {
        self.call("tracker.stats", |b, s| b.clb_reconciler_reconciler().tracker().call_stats(s, tracker, now_ms))
    }

    pub fn tracker_state_version(&mut self, tracker: ResourceAny) -> Result<u32, GuestError> {
        self.call("tracker.state-version", |b, s| {
            b.clb_reconciler_reconciler().tracker().call_state_version(s, tracker)
        })
    }

    pub fn place_service(
        &mut self,
        configurations: &[SlbConfiguration],
        service: &bindings::clb::reconciler::types::Service,
        facts: &PlacementFacts,
    ) -> Result<Placement, GuestError> {
        self.call("place-service", |b, s| {
            b.clb_reconciler_backend_pools().call_place_service(s, configurations, service, facts)
        })
    }

    pub fn pool_queue_create(&mut self, max_retries: u32) -> Result<ResourceAny, GuestError> {
        self.call("pool-queue.create", |b, s| b.clb_reconciler_backend_pools().pool_queue().call_create(s, max_retries))
    }

    pub fn pool_queue_enqueue(&mut self, queue: ResourceAny, operations: &[PoolOperation]) -> Result<(), GuestError> {
        self.call("pool-queue.enqueue", |b, s| {
            b.clb_reconciler_backend_pools().pool_queue().call_enqueue(s, queue, operations)
        })
    }

    pub fn pool_queue_remove_operations(&mut self, queue: ResourceAny, service: &str) -> Result<u32, GuestError> {
        self.call("pool-queue.remove-operations", |b, s| {
            b.clb_reconciler_backend_pools().pool_queue().call_remove_operations(s, queue, service)
        })
    }

    pub fn pool_queue_status(&mut self, queue: ResourceAny, now_ms: u64) -> Result<QueueStatus, GuestError> {
        self.call("pool-queue.status", |b, s| {
            b.clb_reconciler_backend_pools().pool_queue().call_status(s, queue, now_ms)
        })
    }

    pub fn pool_queue_drain_and_group(
        &mut self,
        queue: ResourceAny,
        now_ms: u64,
        assignment: &[ServiceAssignment],
    ) -> Result<Vec<PoolGroup>, GuestError> {
        self.call("pool-queue.drain-and-group", |b, s| {
            b.clb_reconciler_backend_pools().pool_queue().call_drain_and_group(s, queue, now_ms, assignment)
        })
    }

    pub fn pool_queue_report(
        &mut self,
        queue: ResourceAny,
        now_ms: u64,
        group: u64,
        outcome: &GroupOutcome,
    ) -> Result<Option<GroupReport>, GuestError> {
        self.call("pool-queue.report", |b, s| {
            b.clb_reconciler_backend_pools().pool_queue().call_report(s, queue, now_ms, group, outcome)
        })
    }
}

/// The store's data: the memory limiter and what the guest reported through `diagnostics`.
pub struct HostState {
    limiter: MemoryLimiter,
    panic: Option<String>,
}

impl HostState {
    fn new(memory_cap: usize) -> Self {
        Self { limiter: MemoryLimiter { cap: memory_cap, size: 0 }, panic: None }
    }
}

/// Caps linear memory with a typed error (wasmtime's `StoreLimits` only makes growth fail), and
/// keeps the size it let the memory grow to.
struct MemoryLimiter {
    cap: usize,
    /// Bytes of linear memory: the initial allocation (which wasmtime asks for too) and every
    /// growth since.
    size: usize,
}

/// Tables hold function references; a guest has no reason to grow one past this.
const TABLE_ELEMENTS_CAP: usize = 100_000;

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.cap {
            return Err(wasmtime::Error::new(MemoryCapHit { requested: desired, cap: self.cap }));
        }
        self.size = desired;
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= TABLE_ELEMENTS_CAP)
    }
}

impl bindings::clb::reconciler::diagnostics::Host for HostState {
    fn log(&mut self, level: bindings::clb::reconciler::diagnostics::Level, message: String) {
        use bindings::clb::reconciler::diagnostics::Level;
        match level {
            Level::Debug => tracing::debug!(target: "clb_guest", "{message}"),
            Level::Info => tracing::info!(target: "clb_guest", "{message}"),
            Level::Warn => tracing::warn!(target: "clb_guest", "{message}"),
            Level::Error => tracing::error!(target: "clb_guest", "{message}"),
        }
    }

    fn panicked(&mut self, message: String) {
        tracing::error!(target: "clb_guest", "guest panic: {message}");
        self.panic = Some(message);
    }
}

impl bindings::clb::reconciler::types::Host for HostState {}
