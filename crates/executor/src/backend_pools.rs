//! The backend-pool updater of multi-SLB local-service mode (docs/upstream.md §e, docs/design.md §5 and §6): the
//! host half. The queue, the grouping and the retry policy live in the guest's `pool-queue`; this
//! module holds the locks, makes the Azure calls and records the Events.
//!
//! Lock order, always (the main reconcile path takes them in the same order, so no cycle):
//! 1. the **service reconcile lock** ([`ServiceLock`]), shared with every reconcile, held for the
//!    whole tick, so the tick never writes a load balancer a reconcile is writing, and the
//!    Service→LB assignment cannot change under the grouping;
//! 2. the **Azure resource lock** ([`ResourceLock`]; the Kubernetes Lease of docs/upstream.md §f is
//!    `clb_kube::lease::LeaseLock`), taken only when something is ready to drain;
//! 3. the **queue**: the guest session behind its own `std::sync::Mutex`, held only for one short
//!    guest call at a time and never across an Azure call, so producers ([`PoolUpdater::enqueue`],
//!    [`PoolUpdater::remove_operations`]) never wait for ARM.
//!
//! The drain happens inside the guest call `drain-and-group`, after both outer locks: a lock
//! failure drains nothing (nothing to requeue), and a `remove_operations` from a reconcile still
//! cancels anything queued. An unlock failure is a warning and a counter: the pools were written.
//!
//! Pools are made and removed here too, under the same locks: a group whose pool does not exist
//! creates it (upstream creates it with the load balancer's reconcile), and a group that deletes
//! (its Service went or moved: upstream's `cleanupLocalServiceBackendPool`) deletes it.

use crate::KubeApi;
use clb_azure::{AzureApi, AzureError, BackendAddress, BackendPool, ETag, PoolRef};
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::bindings::exports::clb::reconciler::backend_pools::{
    Disposition, GroupOutcome, GroupReport, Placement, PlacementFacts, PoolGroup, PoolOperation, QueueStatus,
    ServiceAssignment, ServiceEvent, SlbConfiguration,
};
use clb_sandbox::trace::{Arg, Ended, Recorder, arg, lazy};
use clb_sandbox::{GuestError, LoadedLogic, Session};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use wasmtime::component::ResourceAny;

/// The in-process lock every reconcile and every tick holds (upstream `serviceReconcileLock`).
pub type ServiceLock = Arc<tokio::sync::Mutex<()>>;

/// Upstream's `loadBalancerBackendPoolUpdateIntervalInSeconds` default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
/// Upstream's (DOC-10417) default retry budget.
pub const DEFAULT_MAX_RETRIES: u32 = 3;

/// Why the updater could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum PoolUpdaterError {
    /// A guest call trapped; the session is unusable and the queue in it is lost.
    #[error("the guest's backend-pool queue failed")]
    Guest(#[source] GuestError),
}

/// Why the Azure resource lock could not be taken or released.
#[derive(Debug, thiserror::Error)]
#[error("azure resource lock: {message}")]
pub struct LockError {
    pub message: String,
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl LockError {
    pub fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), source: None }
    }
}

/// The distributed lock that keeps other writers of the same Azure resources (the AKS resource
/// provider) out while a tick writes pools: `clb_kube::lease::LeaseLock` on a Kubernetes Lease;
/// [`InMemoryLock`] stands in for `simulate` and tests.
#[allow(async_fn_in_trait)] // used generically, never as `dyn`
pub trait ResourceLock {
    async fn lock(&self) -> Result<(), LockError>;
    async fn unlock(&self) -> Result<(), LockError>;
}

/// A process-local [`ResourceLock`] whose lock and unlock can be made to fail.
#[derive(Debug, Default)]
pub struct InMemoryLock {
    held: AtomicBool,
    fail_lock: AtomicBool,
    fail_unlock: AtomicBool,
    pub locks: AtomicU64,
    pub unlocks: AtomicU64,
}

impl InMemoryLock {
    pub fn new() -> Self {
        Self::default()
    }

    /// From now on, `lock` fails (as a Lease held by another component would).
    pub fn fail_lock(&self, fail: bool) {
        self.fail_lock.store(fail, Ordering::SeqCst);
    }

    /// From now on, `unlock` fails (as a failed Lease UPDATE would).
    pub fn fail_unlock(&self, fail: bool) {
        self.fail_unlock.store(fail, Ordering::SeqCst);
    }

    pub fn is_held(&self) -> bool {
        self.held.load(Ordering::SeqCst)
    }
}

impl ResourceLock for InMemoryLock {
    async fn lock(&self) -> Result<(), LockError> {
        self.locks.fetch_add(1, Ordering::SeqCst);
        if self.fail_lock.load(Ordering::SeqCst) {
            return Err(LockError::new("held by another component (injected)"));
        }
        // Same holder re-acquiring after a failed unlock is allowed, as upstream's Lease does.
        self.held.store(true, Ordering::SeqCst);
        Ok(())
    }

    async fn unlock(&self) -> Result<(), LockError> {
        self.unlocks.fetch_add(1, Ordering::SeqCst);
        if self.fail_unlock.load(Ordering::SeqCst) {
            return Err(LockError::new("release failed (injected)"));
        }
        self.held.store(false, Ordering::SeqCst);
        Ok(())
    }
}

impl<T: ResourceLock> ResourceLock for Arc<T> {
    async fn lock(&self) -> Result<(), LockError> {
        (**self).lock().await
    }

    async fn unlock(&self) -> Result<(), LockError> {
        (**self).unlock().await
    }
}

/// Knobs of the updater.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolUpdaterConfig {
    /// Time between ticks; the first tick comes one interval after start, as upstream's.
    pub interval: Duration,
    /// Retries of a group that failed with 409, 412 or 429.
    pub max_retries: u32,
}

impl Default for PoolUpdaterConfig {
    fn default() -> Self {
        Self { interval: DEFAULT_INTERVAL, max_retries: DEFAULT_MAX_RETRIES }
    }
}

/// Counters, for metrics and tests.
#[derive(Debug, Default)]
pub struct PoolUpdaterStats {
    pub ticks: AtomicU64,
    pub idle_ticks: AtomicU64,
    pub lock_failures: AtomicU64,
    pub unlock_failures: AtomicU64,
    pub groups_written: AtomicU64,
    pub groups_unchanged: AtomicU64,
    /// Pools that did not exist and were created (also counted in `groups_written`).
    pub pools_created: AtomicU64,
    /// Pools deleted because their Service went or moved (also counted in `groups_written`).
    pub pools_deleted: AtomicU64,
    pub groups_failed: AtomicU64,
    pub event_failures: AtomicU64,
    /// Local Services placement refused, counted once per distinct reason.
    pub placements_refused: AtomicU64,
    /// Pools a term's recheck (`PoolProducer::recheck`) found as enqueued, and found changed
    /// by a write the term did not make (or one of its own waiting for a retry).
    pub recheck_same: AtomicU64,
    pub recheck_different: AtomicU64,
    /// Rechecks that could not read a pool (tried again after the next tick).
    pub recheck_failures: AtomicU64,
}

/// What one tick did.
#[derive(Debug)]
pub enum Tick {
    /// Nothing was ready: no lock was taken, no Azure call made.
    Idle,
    /// The resource lock could not be taken: nothing was drained.
    LockFailed(LockError),
    /// Groups were drained and carried out.
    Ran(TickSummary),
}

/// The groups of a tick that ran, by what became of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TickSummary {
    pub groups: usize,
    pub written: usize,
    /// Of `written`: pools that did not exist and were created, and pools deleted.
    pub created: usize,
    pub deleted: usize,
    pub unchanged: usize,
    pub requeued: usize,
    pub dropped: usize,
    pub abandoned: usize,
    /// The resource lock could not be released (the pools were written all the same).
    pub unlock_failed: bool,
    /// Groups drained but never carried out: the controller died in the tick
    /// ([`PoolUpdater::tick_dying_after`]), or lost its lease with one of them in flight
    /// ([`PoolUpdater::tick_losing_lease_at`], that one counted); 0 for every other tick.
    pub left: usize,
}

/// Where a tick stops short of its drained groups (`clb-host explore`'s perturbations).
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// The controller dies once this many groups are carried out.
    DiesAfter(usize),
    /// The leader loses its lease once this many groups are carried out, the next one's write
    /// in flight.
    LosesLeaseAt(usize),
}

/// One group's write to Azure, as the tick sends it.
#[derive(Clone, Debug, PartialEq)]
pub enum PoolWrite {
    /// The pool deleted.
    Delete(PoolRef),
    /// The pool written whole: with `If-Match` of the `etag` its GET read, or created (no etag).
    Put { at: PoolRef, pool: BackendPool, etag: Option<ETag> },
}

impl PoolWrite {
    /// The pool the write is to.
    pub fn pool(&self) -> &PoolRef {
        match self {
            PoolWrite::Delete(at) | PoolWrite::Put { at, .. } => at,
        }
    }

    /// Sends the write. A DELETE of a pool already gone (ARM's 204) and one whose load balancer
    /// is gone (404) leave it unchanged.
    pub async fn send<A: AzureApi>(&self, azure: &A) -> GroupOutcome {
        match self {
            PoolWrite::Delete(at) => match azure.delete_backend_pool(at).await {
                Ok(()) => GroupOutcome::Deleted,
                Err(err) if err.status == 404 => GroupOutcome::Unchanged,
                Err(err) => GroupOutcome::Failed(failure_of(&err)),
            },
            PoolWrite::Put { at, pool, etag } => match azure.put_backend_pool(at, pool, etag.as_ref()).await {
                Ok(()) if etag.is_none() => GroupOutcome::Created,
                Ok(()) => GroupOutcome::Updated,
                Err(err) => GroupOutcome::Failed(failure_of(&err)),
            },
        }
    }
}

/// The logic the updater drives: the `backend-pools` interface's `place-service` and one
/// `pool-queue`. [`PoolUpdater::new`] runs it in a session of the component; the native library
/// runs it too (`clb_simulator::native`, feature `native`), so the differential runs compare the two on
/// the multi-SLB scenarios.
pub trait PoolLogic: Send {
    fn place(
        &mut self,
        configurations: &[SlbConfiguration],
        service: &wit::Service,
        facts: &PlacementFacts,
    ) -> Result<Placement, GuestError>;
    fn enqueue(&mut self, operations: &[PoolOperation]) -> Result<(), GuestError>;
    fn remove_operations(&mut self, service: &str) -> Result<u32, GuestError>;
    fn status(&mut self, now_ms: u64) -> Result<QueueStatus, GuestError>;
    fn drain_and_group(&mut self, now_ms: u64, assignment: &[ServiceAssignment]) -> Result<Vec<PoolGroup>, GuestError>;
    fn report(&mut self, now_ms: u64, group: u64, outcome: &GroupOutcome) -> Result<Option<GroupReport>, GuestError>;
}

/// The component's queue: a session and the `pool-queue` resource in it.
pub struct GuestQueue {
    session: Session,
    queue: ResourceAny,
}

impl GuestQueue {
    /// An empty queue in a new session of `logic`.
    pub fn new(logic: &LoadedLogic, max_retries: u32) -> Result<Self, GuestError> {
        let mut session = logic.session()?;
        let queue = session.pool_queue_create(max_retries)?;
        Ok(Self { session, queue })
    }
}

impl PoolLogic for GuestQueue {
    fn place(
        &mut self,
        configurations: &[SlbConfiguration],
        service: &wit::Service,
        facts: &PlacementFacts,
    ) -> Result<Placement, GuestError> {
        self.session.place_service(configurations, service, facts)
    }

    fn enqueue(&mut self, operations: &[PoolOperation]) -> Result<(), GuestError> {
        self.session.pool_queue_enqueue(self.queue, operations)
    }

    fn remove_operations(&mut self, service: &str) -> Result<u32, GuestError> {
        self.session.pool_queue_remove_operations(self.queue, service)
    }

    fn status(&mut self, now_ms: u64) -> Result<QueueStatus, GuestError> {
        self.session.pool_queue_status(self.queue, now_ms)
    }

    fn drain_and_group(&mut self, now_ms: u64, assignment: &[ServiceAssignment]) -> Result<Vec<PoolGroup>, GuestError> {
        self.session.pool_queue_drain_and_group(self.queue, now_ms, assignment)
    }

    fn report(&mut self, now_ms: u64, group: u64, outcome: &GroupOutcome) -> Result<Option<GroupReport>, GuestError> {
        self.session.pool_queue_report(self.queue, now_ms, group, outcome)
    }
}

/// The updater: producers call [`enqueue`](Self::enqueue) and
/// [`remove_operations`](Self::remove_operations) at any time; [`run`](Self::run) ticks.
pub struct PoolUpdater<A, L, K> {
    azure: A,
    resource_lock: L,
    kube: K,
    service_lock: ServiceLock,
    config: PoolUpdaterConfig,
    guest: Mutex<Box<dyn PoolLogic>>,
    /// Lower-cased `namespace/name` → load balancer, as the last reconcile wrote it.
    assignment: Mutex<BTreeMap<String, (String, String)>>,
    /// Canonical node IP → the node's name, as the producer last read the Nodes.
    node_names: Mutex<BTreeMap<String, String>>,
    /// Lower-cased `namespace/name` of the Services whose writes the queue abandoned (retries
    /// spent) and that nothing was enqueued for since: left alone until they change.
    abandoned: Mutex<BTreeSet<String>>,
    stats: Arc<PoolUpdaterStats>,
    /// The trace its guest calls go to, and the queue's handle there.
    trace: Option<(Arc<Recorder>, u64)>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}

/// A plain lock whose holder cannot leave the data half-written (every guest call is one
/// step), so a panic elsewhere does not make it unusable.
fn plain<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Compares backend addresses as IPs when they parse, so two spellings of one IPv6 address
/// are one address; the guest sends canonical text, ARM may answer in another.
fn address_key(text: &str) -> String {
    text.trim().parse::<IpAddr>().map(|ip| ip.to_string()).unwrap_or_else(|_| text.trim().to_owned())
}

/// The name of a backend address whose node is not known (the node left between the operation
/// and the write): the IP, with `:` made `-`, which ARM names refuse.
fn address_name(ip: &str) -> String {
    ip.replace(':', "-")
}

fn failure_of(err: &AzureError) -> wit::Failure {
    wit::Failure {
        status: err.status,
        code: (!err.code.is_empty()).then(|| err.code.clone()),
        retry_after_ms: err.retry_after.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        message: err.to_string(),
    }
}

impl<A: AzureApi, L: ResourceLock, K: KubeApi> PoolUpdater<A, L, K> {
    /// An updater with an empty queue in a new session of `logic`.
    pub fn new(
        logic: &LoadedLogic,
        azure: A,
        resource_lock: L,
        kube: K,
        service_lock: ServiceLock,
        config: PoolUpdaterConfig,
    ) -> Result<Self, PoolUpdaterError> {
        let queue = GuestQueue::new(logic, config.max_retries).map_err(PoolUpdaterError::Guest)?;
        Ok(Self::over(Box::new(queue), azure, resource_lock, kube, service_lock, config))
    }

    /// An updater driving `logic`, whose queue was made with `config.max_retries`.
    pub fn over(
        logic: Box<dyn PoolLogic>,
        azure: A,
        resource_lock: L,
        kube: K,
        service_lock: ServiceLock,
        config: PoolUpdaterConfig,
    ) -> Self {
        Self {
            azure,
            resource_lock,
            kube,
            service_lock,
            config,
            guest: Mutex::new(logic),
            assignment: Mutex::new(BTreeMap::new()),
            node_names: Mutex::new(BTreeMap::new()),
            abandoned: Mutex::new(BTreeSet::new()),
            stats: Arc::default(),
            trace: None,
        }
    }

    /// Records the queue's guest calls (`docs/traces.md`), from its creation on.
    pub fn with_recorder(mut self, recorder: Arc<Recorder>) -> Self {
        let handle = recorder.new_handle();
        let max_retries = self.config.max_retries;
        recorder.call("pool-queue.create", vec![arg(max_retries)], Ended::Returned(lazy(handle)));
        self.trace = Some((recorder, handle));
        self
    }

    /// Records one guest call of the queue (`queue`: a method of it) and passes its result on.
    fn traced<R: serde::Serialize + Clone + Send + 'static>(
        &self,
        call: &'static str,
        queue: bool,
        args: impl FnOnce() -> Vec<Arg>,
        result: Result<R, PoolUpdaterError>,
    ) -> Result<R, PoolUpdaterError> {
        if let Some((recorder, handle)) = &self.trace {
            let ended = match &result {
                Ok(value) => Ended::Returned(lazy(value.clone())),
                Err(error) => Ended::Trapped(error.to_string()),
            };
            let mut all = if queue { vec![Arg::Handle(*handle)] } else { Vec::new() };
            all.extend(args());
            recorder.call(call, all, ended);
        }
        result
    }

    pub fn stats(&self) -> &PoolUpdaterStats {
        &self.stats
    }

    /// Counts into `stats` (shared with the updaters of earlier leadership terms, for
    /// `/metrics`).
    pub fn counting_into(mut self, stats: Arc<PoolUpdaterStats>) -> Self {
        self.stats = stats;
        self
    }

    pub fn config(&self) -> &PoolUpdaterConfig {
        &self.config
    }

    pub fn azure(&self) -> &A {
        &self.azure
    }

    pub fn kube(&self) -> &K {
        &self.kube
    }

    pub fn resource_lock(&self) -> &L {
        &self.resource_lock
    }

    /// The Nodes as the producer reads them (node name → its IPs): a backend address added for
    /// one of those IPs is named after its node, as upstream names it.
    pub fn set_nodes<'n>(&self, nodes: impl IntoIterator<Item = (&'n String, &'n Vec<String>)>) {
        let names = nodes.into_iter().flat_map(|(name, ips)| ips.iter().map(|ip| (address_key(ip), name.clone())));
        *plain(&self.node_names) = names.collect();
    }

    /// Whether the queue abandoned the writes of `service` (any case) and nothing was
    /// enqueued for it since.
    pub fn abandoned(&self, service: &str) -> bool {
        plain(&self.abandoned).contains(&service.to_ascii_lowercase())
    }

    /// The lock this updater shares with reconciles.
    pub fn service_lock(&self) -> &ServiceLock {
        &self.service_lock
    }

    /// One short guest call under the queue lock; never held across an await.
    fn with_guest<R>(
        &self,
        f: impl FnOnce(&mut dyn PoolLogic) -> Result<R, GuestError>,
    ) -> Result<R, PoolUpdaterError> {
        f(plain(&self.guest).as_mut()).map_err(PoolUpdaterError::Guest)
    }

    /// Queues operations (EndpointSlice changes, the end of a reconcile). Waits for at most one
    /// short guest call, never for a tick's Azure calls.
    pub fn enqueue(&self, operations: &[PoolOperation]) -> Result<(), PoolUpdaterError> {
        {
            let mut abandoned = plain(&self.abandoned);
            for op in operations {
                abandoned.remove(&op.service.to_ascii_lowercase());
            }
        }
        let result = self.with_guest(|q| q.enqueue(operations));
        if let Some((recorder, handle)) = &self.trace {
            let ended = match &result {
                Ok(()) => Ended::Unit,
                Err(error) => Ended::Trapped(error.to_string()),
            };
            recorder.call("pool-queue.enqueue", vec![Arg::Handle(*handle), arg(operations.to_vec())], ended);
        }
        result
    }

    /// Cancels a Service's queued operations (a reconcile moved it off its load balancer).
    pub fn remove_operations(&self, service: &str) -> Result<u32, PoolUpdaterError> {
        let result = self.with_guest(|q| q.remove_operations(service));
        self.traced("pool-queue.remove-operations", true, || vec![arg(service.to_owned())], result)
    }

    /// How full the queue is now.
    pub fn status(&self) -> Result<QueueStatus, PoolUpdaterError> {
        self.status_at(now_ms())
    }

    /// [`status`](Self::status) at a given instant of the caller's clock (virtual time in
    /// `simulate`, which must not read the real clock: its runs are deterministic).
    pub fn status_at(&self, now: u64) -> Result<QueueStatus, PoolUpdaterError> {
        let result = self.with_guest(|q| q.status(now));
        self.traced("pool-queue.status", true, || vec![arg(now)], result)
    }

    /// Asks the guest where a Service belongs (or that it is not a local Service in this mode,
    /// or why no load balancer may take it, in upstream's words). The reconcile calls it under
    /// the service reconcile lock and records the answer with [`assign`](Self::assign).
    pub fn place(
        &self,
        configurations: &[SlbConfiguration],
        service: &wit::Service,
        facts: &PlacementFacts,
    ) -> Result<Placement, PoolUpdaterError> {
        let result = self.with_guest(|q| q.place(configurations, service, facts));
        let args = || vec![arg(configurations.to_vec()), arg(service.clone()), arg(facts.clone())];
        self.traced("place-service", false, args, result)
    }

    /// Records where a local Service lives (`None`: not a local Service in this mode any more).
    /// The guard proves the caller holds the service reconcile lock, as upstream writes its
    /// `localServiceNameToServiceInfoMap` only under it; the tick reads it under the same lock.
    pub fn assign(&self, _reconciling: &tokio::sync::MutexGuard<'_, ()>, service: &str, load_balancer: Option<&str>) {
        let mut assignment = plain(&self.assignment);
        match load_balancer {
            Some(lb) => assignment.insert(service.to_ascii_lowercase(), (service.to_owned(), lb.to_owned())),
            None => assignment.remove(&service.to_ascii_lowercase()),
        };
    }

    /// One tick: service lock → resource lock → drain and group → per group GET, PUT if changed,
    /// report. Completes when unlocking fails.
    pub async fn tick(&self) -> Result<Tick, PoolUpdaterError> {
        self.tick_with(now_ms, None).await.map(|(tick, _)| tick)
    }

    /// [`tick`](Self::tick) at a given instant of the caller's clock (virtual time in
    /// `simulate`): every guest call of the tick is made at `now_ms`.
    pub async fn tick_at(&self, now_ms: u64) -> Result<Tick, PoolUpdaterError> {
        self.tick_with(move || now_ms, None).await.map(|(tick, _)| tick)
    }

    /// What a controller that dies in the middle of a tick leaves (`clb-host explore`'s
    /// `crash-in-pool-tick`): [`tick_at`](Self::tick_at) that carries out the first `groups`
    /// groups it drained and stops there, the resource lock still held, the rest of the drained
    /// groups never written. The updater is not to be ticked again: its process is dead.
    pub async fn tick_dying_after(&self, now_ms: u64, groups: usize) -> Result<Tick, PoolUpdaterError> {
        self.tick_with(move || now_ms, Some(Cut::DiesAfter(groups))).await.map(|(tick, _)| tick)
    }

    /// What a leader that loses its lease in the middle of a tick leaves (`clb-host explore`'s
    /// `failover-in-pool-tick`): [`tick_dying_after`](Self::tick_dying_after) `group` groups,
    /// with the next group's write (its GET done) handed back unsent — in flight, for the caller
    /// to land in Azure later — if it has one. The updater is not to be ticked again.
    pub async fn tick_losing_lease_at(
        &self,
        now_ms: u64,
        group: usize,
    ) -> Result<(Tick, Option<PoolWrite>), PoolUpdaterError> {
        self.tick_with(move || now_ms, Some(Cut::LosesLeaseAt(group))).await
    }

    async fn tick_with(
        &self,
        clock: impl Fn() -> u64,
        cut: Option<Cut>,
    ) -> Result<(Tick, Option<PoolWrite>), PoolUpdaterError> {
        let _reconciling = self.service_lock.lock().await;
        self.stats.ticks.fetch_add(1, Ordering::Relaxed);
        let now = clock();
        // An idle (or wholly parked) queue costs no lock traffic (upstream `countOperations`).
        if !self.status_at(now)?.ready {
            self.stats.idle_ticks.fetch_add(1, Ordering::Relaxed);
            return Ok((Tick::Idle, None));
        }
        if let Err(err) = self.resource_lock.lock().await {
            self.stats.lock_failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %err, "backend-pool tick skipped: the Azure resource lock is not available; operations stay queued");
            return Ok((Tick::LockFailed(err), None));
        }
        let result = self.drain_and_apply(now, &clock, cut).await;
        if cut.is_some() {
            return result.map(|(summary, in_flight)| (Tick::Ran(summary), in_flight));
        }
        let unlock_failed = match self.resource_lock.unlock().await {
            Ok(()) => false,
            Err(err) => {
                self.stats.unlock_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %err, "the Azure resource lock could not be released after a backend-pool tick");
                true
            }
        };
        result.map(|(summary, _)| (Tick::Ran(TickSummary { unlock_failed, ..summary }), None))
    }

    async fn drain_and_apply(
        &self,
        now: u64,
        clock: &impl Fn() -> u64,
        cut: Option<Cut>,
    ) -> Result<(TickSummary, Option<PoolWrite>), PoolUpdaterError> {
        let assignment: Vec<ServiceAssignment> = plain(&self.assignment)
            .values()
            .map(|(service, lb)| ServiceAssignment { service: service.clone(), load_balancer: lb.clone() })
            .collect();
        let groups = self.with_guest(|q| q.drain_and_group(now, &assignment));
        let groups =
            self.traced("pool-queue.drain-and-group", true, || vec![arg(now), arg(assignment.clone())], groups)?;
        let carried_out = groups.len().min(match cut {
            Some(Cut::DiesAfter(n) | Cut::LosesLeaseAt(n)) => n,
            None => usize::MAX,
        });
        let mut summary =
            TickSummary { groups: groups.len(), left: groups.len() - carried_out, ..TickSummary::default() };
        for group in &groups[..carried_out] {
            let outcome = match self.prepare(group).await {
                Ok(write) => write.send(&self.azure).await,
                Err(outcome) => outcome,
            };
            match &outcome {
                GroupOutcome::Updated | GroupOutcome::Created | GroupOutcome::Deleted => {
                    summary.written += 1;
                    self.stats.groups_written.fetch_add(1, Ordering::Relaxed);
                    let made = match outcome {
                        GroupOutcome::Created => Some((&mut summary.created, &self.stats.pools_created, "created")),
                        GroupOutcome::Deleted => Some((&mut summary.deleted, &self.stats.pools_deleted, "deleted")),
                        _ => None,
                    };
                    if let Some((count, counter, what)) = made {
                        *count += 1;
                        counter.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(load_balancer = %group.load_balancer, pool = %group.pool, services = ?group.services, "backend pool {what}");
                    }
                }
                GroupOutcome::Unchanged => {
                    summary.unchanged += 1;
                    self.stats.groups_unchanged.fetch_add(1, Ordering::Relaxed);
                }
                GroupOutcome::Failed(f) => {
                    self.stats.groups_failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(load_balancer = %group.load_balancer, pool = %group.pool, status = f.status, "backend pool update failed: {}", f.message);
                }
            }
            let now = clock();
            let report = self.with_guest(|q| q.report(now, group.id, &outcome));
            let id = group.id;
            let traced_outcome = outcome.clone();
            let report =
                self.traced("pool-queue.report", true, || vec![arg(now), arg(id), arg(traced_outcome)], report)?;
            let Some(report) = report else {
                continue;
            };
            match report.disposition {
                Disposition::Done => {}
                Disposition::Dropped => summary.dropped += 1,
                Disposition::Requeued => summary.requeued += 1,
                Disposition::Abandoned => {
                    summary.abandoned += 1;
                    plain(&self.abandoned).extend(group.services.iter().map(|s| s.to_ascii_lowercase()));
                }
            }
            for event in &report.events {
                self.record(event).await;
            }
        }
        let in_flight = match (cut, groups.get(carried_out)) {
            (Some(Cut::LosesLeaseAt(_)), Some(group)) => self.prepare(group).await.ok(),
            _ => None,
        };
        Ok((summary, in_flight))
    }

    /// The group's write: GET the pool, apply the group's change, PUT with `If-Match` only when
    /// it changed; a pool that is not there is created when the group adds to it or ensures it
    /// (a PUT without `If-Match`, empty included), and a group that deletes with nothing to add
    /// and nothing to ensure deletes it. `Err` is the group's outcome when there is nothing to
    /// write (unchanged) or the GET failed.
    async fn prepare(&self, group: &PoolGroup) -> Result<PoolWrite, GroupOutcome> {
        let pool_ref = PoolRef { load_balancer: group.load_balancer.clone(), pool: group.pool.clone() };
        if group.delete && group.add.is_empty() && !group.ensure {
            return Ok(PoolWrite::Delete(pool_ref));
        }
        let (mut pool, etag) = match self.azure.get_backend_pool(&pool_ref).await {
            Ok((pool, etag)) => (pool, Some(etag)),
            // Not there, and the group has something for it or ensures it: made now. Were its
            // load balancer gone, the PUT answers 404 too, and the guest drops the group.
            Err(err) if err.status == 404 && (!group.add.is_empty() || group.ensure) => (BackendPool::default(), None),
            Err(err) => return Err(GroupOutcome::Failed(failure_of(&err))),
        };
        let before = pool.addresses.len();
        if group.delete {
            // The Service left the pool and came back: it holds exactly what came since.
            let keep: BTreeSet<String> = group.add.iter().map(|ip| address_key(ip)).collect();
            pool.addresses.retain(|a| keep.contains(&address_key(&a.ip_address)));
        } else {
            let remove: BTreeSet<String> = group.remove.iter().map(|ip| address_key(ip)).collect();
            pool.addresses.retain(|a| !remove.contains(&address_key(&a.ip_address)));
        }
        let mut changed = etag.is_none() || pool.addresses.len() != before;
        let mut present: BTreeSet<String> = pool.addresses.iter().map(|a| address_key(&a.ip_address)).collect();
        {
            let node_names = plain(&self.node_names);
            for ip in &group.add {
                let key = address_key(ip);
                if present.insert(key.clone()) {
                    let name = node_names.get(&key).cloned().unwrap_or_else(|| address_name(ip));
                    pool.addresses.push(BackendAddress { name, ip_address: ip.clone() });
                    changed = true;
                }
            }
        }
        if !changed {
            return Err(GroupOutcome::Unchanged);
        }
        Ok(PoolWrite::Put { at: pool_ref, pool, etag })
    }

    /// A local Service that cannot be placed (`message`: upstream's words): logged, counted, and
    /// told on the Service as upstream's service controller tells it (a Warning
    /// `SyncLoadBalancerFailed`). The producer calls it once per distinct reason.
    pub async fn refuse_placement(&self, service: &str, message: &str) {
        self.stats.placements_refused.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%service, reason = %message, "a local Service cannot be placed on any load balancer");
        let event = ServiceEvent {
            service: service.to_owned(),
            event_type: wit::EventType::Warning,
            reason: "SyncLoadBalancerFailed".into(),
            message: format!("Error syncing load balancer: failed to place the Service: {message}"),
        };
        self.record(&event).await;
    }

    /// Records one Event; a failure is counted and logged, never fails the tick.
    async fn record(&self, event: &ServiceEvent) {
        let (namespace, name) = event.service.split_once('/').unwrap_or(("", &event.service));
        let event = wit::Event {
            regarding: wit::ObjectRef {
                kind: "Service".into(),
                namespace: namespace.into(),
                name: name.into(),
                uid: String::new(),
            },
            event_type: event.event_type,
            reason: event.reason.clone(),
            message: event.message.clone(),
        };
        if let Err(err) = self.kube.emit_event(&event).await {
            self.stats.event_failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %err, reason = %event.reason, "recording a backend-pool Event failed");
        }
    }

    /// Ticks every interval (the first one interval after start) until `shutdown` completes. A
    /// guest failure ends the loop: the session is unusable.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> Result<(), PoolUpdaterError> {
        tokio::pin!(shutdown);
        let mut interval =
            tokio::time::interval_at(tokio::time::Instant::now() + self.config.interval, self.config.interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                _ = interval.tick() => {}
            }
            match self.tick().await? {
                Tick::Ran(summary) => tracing::debug!(?summary, "backend-pool tick"),
                Tick::Idle | Tick::LockFailed(_) => {}
            }
        }
    }
}
