//! `clb-host run` in multi-SLB local-service mode (docs/design.md §5, docs/upstream.md §e and §f): the
//! backend-pool producer fed from the run loop's watch stream, and the [`PoolUpdater`] ticking on
//! real time under the Azure resource lock ([`LeaseLock`]).
//!
//! * **Producing.** [`Pools::observe`] takes every batch of observations the guest is given and
//!   keeps the records the producer needs: Services, EndpointSlices and the InternalIPs of
//!   Nodes (both families). It marks as changed only the Services a batch touched — the Service
//!   itself, the owner of a changed slice, the owners of slices with endpoints on a Node whose
//!   IPs changed — and the producer ([`PoolProducer`]) recomputes just those: placement through
//!   the guest's `place-service`, then the node IPs of the ready endpoints against what it
//!   enqueued last.
//!   Nothing is produced before the initial lists are complete (a pool must not lose the IPs of
//!   Nodes not listed yet). A Service new to a pool starts from what the pool holds in Azure
//!   (a pool Azure lacks is ensured); when that read fails the Service stays marked and is
//!   retried at the next tick. A Service's first placement deletes the pools it left (named
//!   after it on a load balancer it is not on), from the listing of load balancers.
//! * **Ticking.** Every `loadBalancerBackendPoolUpdateIntervalInSeconds` (first one interval
//!   after the term starts) the updater ticks: service lock → resource lock → drain → GET/PUT
//!   per pool → Events (see [`clb_executor::backend_pools`]). A tick is started only after checking
//!   that leadership still holds, as [`crate::live::run`] does before each command; the producer only
//!   fills the in-memory queue, so it needs no such check.
//! * **Rechecking.** After the term's second tick the producer reads every pool it knows
//!   and enqueues what makes it hold what was enqueued for it last
//!   ([`PoolProducer::recheck`]): a write the previous leader had in flight may land after this
//!   term wrote the same pool.
//! * **Lifetime.** The queue, the producer's memory and the Lease lock live for one term: a new
//!   leader starts from the lists and from what the pools hold in Azure, like a restart. A term
//!   that stops (shutdown) lets a tick in progress finish within the shutdown grace period, so
//!   it releases the resource lock; one that loses leadership drops the tick at once, and a
//!   resource lock it held stays until the Lease's duration runs out (renewal stops with the
//!   lock), as after a crash.

use crate::live::settings::{RunError, Settings};
use clb_arm::ArmClient;
use clb_azure::{AzureApi as _, PoolRef};
use clb_executor::backend_pools::{PoolUpdater, PoolUpdaterError, ServiceLock, Tick};
use clb_executor::pool_producer::{AzureFacts, PoolProducer, RECHECK_AT_TICK, WatchedCluster, canonical_ip};
use clb_kube::KubeClient;
use clb_kube::lease::{Leadership, LeaseLock};
use clb_sandbox::LoadedLogic;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::bindings::exports::clb::reconciler::backend_pools::{Placement, SlbConfiguration};
use clb_sandbox::error_text::error_chain;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// The backend-pool updater of one term and its producer.
pub(crate) struct Pools {
    updater: PoolUpdater<Arc<ArmClient>, LeaseLock, KubeClient>,
    configurations: Vec<SlbConfiguration>,
    /// Read for a `serviceNamespaceSelector`, as upstream reads them (a GET when placing).
    kube: ::kube::Client,
    /// Whether a configuration has a `serviceNamespaceSelector` (else no Namespace is read).
    reads_namespaces: bool,
    /// The resource group's load balancers and public IPs as last listed, and when: listed again
    /// at most once an updater interval, when a Service is placed (two ARM reads, not two per
    /// change).
    azure: RefCell<Option<(tokio::time::Instant, AzureFacts)>>,
    /// The resource group whose public IPs placement reads.
    resource_group: String,
    /// The cluster's name, as placement reads it.
    cluster_name: String,
    /// What the producer reads of the cluster: the batches the guest is given.
    store: RefCell<WatchedCluster>,
    producer: RefCell<PoolProducer>,
    /// Signalled when a batch marked a Service (a permit is kept while nobody waits).
    changed: tokio::sync::Notify,
    /// A tick is in progress (it may hold the resource lock).
    ticking: Cell<bool>,
    /// Signalled when a tick ends, however it ends.
    tick_ended: tokio::sync::Notify,
    /// The term is stopping: no new tick starts.
    stopping: Cell<bool>,
}

/// Marks a tick in progress until dropped (the tick finished, failed or was dropped).
struct Ticking<'p>(&'p Pools);

impl<'p> Ticking<'p> {
    fn start(pools: &'p Pools) -> Self {
        pools.ticking.set(true);
        Self(pools)
    }
}

impl Drop for Ticking<'_> {
    fn drop(&mut self) {
        self.0.ticking.set(false);
        self.0.tick_ended.notify_one();
    }
}

impl Pools {
    /// The updater, if `settings.config` is multi-SLB local-service mode for `logic`; `None` in
    /// any other mode (a refused configuration is the supervisor's to report).
    pub(crate) fn for_mode(logic: &LoadedLogic, settings: &Settings) -> Result<Option<Self>, RunError> {
        let guest = |e| RunError::Pools(PoolUpdaterError::Guest(e));
        let mode = logic.session().map_err(guest)?.validate_config(&settings.config).map_err(guest)?;
        if mode != Ok(wit::Mode::MultiSlbLocalServices) {
            return Ok(None);
        }
        let lock = LeaseLock::new(settings.kube.clone(), settings.resource_lock.clone())
            .counting_into(settings.stats.resource_lock.clone());
        let kube = KubeClient::new(settings.kube.clone(), settings.instance.clone());
        let updater =
            PoolUpdater::new(logic, settings.arm.clone(), lock, kube, ServiceLock::default(), settings.pool_updater)
                .map_err(RunError::Pools)?
                .counting_into(settings.stats.pool_updater.clone());
        let updater = match &settings.stats.trace {
            Some(recorder) => updater.with_recorder(recorder.clone()),
            None => updater,
        };
        tracing::info!(
            load_balancers = settings.slb_configurations.len(),
            interval = ?settings.pool_updater.interval,
            lock = %format!("{}/{}", settings.resource_lock.namespace, settings.resource_lock.name),
            "multi-SLB local-service mode: the backend-pool updater runs"
        );
        Ok(Some(Self {
            updater,
            configurations: settings.slb_configurations.clone(),
            kube: settings.kube.clone(),
            reads_namespaces: settings.slb_configurations.iter().any(|c| c.service_namespace_selector.is_some()),
            azure: RefCell::default(),
            resource_group: settings.arm.config().scope.resource_group.clone(),
            cluster_name: settings.cluster_name.clone(),
            store: RefCell::default(),
            producer: RefCell::default(),
            changed: tokio::sync::Notify::new(),
            ticking: Cell::new(false),
            tick_ended: tokio::sync::Notify::new(),
            stopping: Cell::new(false),
        }))
    }

    /// Takes in a batch the guest is given; see the module documentation.
    pub(crate) fn observe(&self, batch: &[wit::Observation]) {
        let mut store = self.store.borrow_mut();
        for observation in batch {
            store.apply(observation);
        }
        // Nodes are upserted at every status heartbeat; the updater's names change only with their IPs.
        if let Some(nodes) = store.nodes_if_changed() {
            self.updater.set_nodes(nodes);
        }
        if store.listed() && store.any_changed() {
            self.changed.notify_one();
        }
    }

    /// Produces and ticks until something fatal happens (a guest failure, or leadership lost
    /// before a tick); never returns `Ok`.
    pub(crate) async fn run(&self, leadership: &Leadership) -> Result<(), RunError> {
        let every = self.updater_interval();
        let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut ticks, mut rechecked) = (0, false);
        loop {
            tokio::select! {
                () = self.changed.notified() => self.produce().await?,
                _ = interval.tick() => {
                    // Services whose pool could not be read are retried before the tick.
                    self.produce().await?;
                    if self.stopping.get() {
                        continue;
                    }
                    if !leadership.holds() {
                        return Err(RunError::NotLeader);
                    }
                    let _ticking = Ticking::start(self);
                    match self.updater.tick().await.map_err(RunError::Pools)? {
                        Tick::Ran(summary) => tracing::info!(?summary, "backend-pool tick"),
                        // Already logged (a warning) and counted by the updater.
                        Tick::LockFailed(_) | Tick::Idle => {}
                    }
                    ticks += 1;
                    if ticks >= RECHECK_AT_TICK && !rechecked {
                        rechecked = self.recheck().await?;
                    }
                }
            }
        }
    }

    /// On the way out: no new tick starts, and a tick in progress gets `grace` to finish —
    /// `work` (the future of [`run`](Self::run)) is driven meanwhile — so that it releases the
    /// resource lock rather than leave the Lease held until it expires. After `grace` it is
    /// abandoned, as a crash would.
    pub(crate) async fn finish_tick<F>(&self, mut work: Pin<&mut F>, grace: Duration)
    where
        F: Future<Output = Result<(), RunError>>,
    {
        self.stopping.set(true);
        if !self.ticking.get() {
            return;
        }
        tracing::info!(?grace, "stopping: letting the backend-pool tick in progress finish");
        let finish = async {
            while self.ticking.get() {
                tokio::select! {
                    result = work.as_mut() => {
                        if let Err(error) = result {
                            tracing::warn!(error = %error_chain(&error), "stopping: the backend-pool tick in progress failed");
                        }
                        return;
                    }
                    () = self.tick_ended.notified() => {}
                }
            }
        };
        if tokio::time::timeout(grace, finish).await.is_err() {
            tracing::warn!(
                ?grace,
                "stopping: the backend-pool tick still running after the grace period is abandoned; a resource lock it held stays until the Lease expires"
            );
        }
    }

    fn updater_interval(&self) -> std::time::Duration {
        self.updater.config().interval
    }

    /// Recomputes the Services marked since the last time, under the service reconcile lock.
    async fn produce(&self) -> Result<(), RunError> {
        let changed = {
            let mut store = self.store.borrow_mut();
            if !store.listed() {
                return Ok(());
            }
            store.take_changed()
        };
        if changed.is_empty() {
            return Ok(());
        }
        let service_lock = self.updater.service_lock().clone();
        let reconciling = service_lock.lock().await;
        let mut notes = Vec::new();
        let mut namespaces: BTreeMap<String, Option<Vec<(String, String)>>> = BTreeMap::new();
        for key in changed {
            let name = format!("{}/{}", key.0, key.1);
            let found = self.store.borrow().service(&key);
            let Some((record, ips)) = found else {
                let mut producer = self.producer.borrow_mut();
                producer.gone(&name);
                producer.forget(&self.updater, &reconciling, &name, &mut notes).map_err(RunError::Pools)?;
                continue;
            };
            let facts = match self.facts(&record.namespace, &mut namespaces).await {
                Ok(facts) => facts,
                Err(error) => {
                    tracing::warn!(
                        service = %name,
                        error = %error,
                        "cannot read what placing a local Service needs; retrying at the next tick"
                    );
                    self.store.borrow_mut().mark(key);
                    continue;
                }
            };
            let (namespace, azure) = facts;
            let placed = self
                .producer
                .borrow_mut()
                .place(&self.updater, &self.configurations, &record, namespace, &azure, &mut notes)
                .map_err(RunError::Pools)?;
            let placement = match placed {
                (Placement::At(placement), _) => placement,
                (Placement::NotLocal(_), _) => {
                    self.producer
                        .borrow_mut()
                        .forget(&self.updater, &reconciling, &name, &mut notes)
                        .map_err(RunError::Pools)?;
                    continue;
                }
                (Placement::Refused(message), new) => {
                    // What was enqueued for it stays, as upstream leaves a failed reconcile's work.
                    if new {
                        self.updater.refuse_placement(&name, &message).await;
                    }
                    continue;
                }
            };
            let needed: Vec<String> = {
                let producer = self.producer.borrow();
                producer.pools_needing_contents(&name, &placement).into_iter().map(str::to_owned).collect()
            };
            let contents = match self.pool_contents(&placement.load_balancer, needed).await {
                Ok(contents) => contents,
                Err((pool, error)) => {
                    tracing::warn!(
                        service = %name,
                        load_balancer = %placement.load_balancer,
                        %pool,
                        error = %error_chain(&error),
                        "cannot read the backend pool a local Service starts from; retrying at the next tick"
                    );
                    self.store.borrow_mut().mark(key);
                    continue;
                }
            };
            let contents = |pool: &str| contents.get(pool).cloned().flatten();
            let mut producer = self.producer.borrow_mut();
            producer
                .update(&self.updater, &reconciling, &name, placement, ips, contents, &mut notes)
                .map_err(RunError::Pools)?;
        }
        for note in notes {
            tracing::info!(%note, "backend-pool producer");
        }
        Ok(())
    }

    /// Reads every pool the producer knows and has it [recheck](PoolProducer::recheck) them
    /// against what it enqueued: `false` when the lists are not complete yet or a read failed
    /// (it is tried again at the next tick).
    async fn recheck(&self) -> Result<bool, RunError> {
        if !self.store.borrow().listed() {
            return Ok(false);
        }
        let mut by_load_balancer: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (load_balancer, pool) in self.producer.borrow().pools_known() {
            by_load_balancer.entry(load_balancer).or_default().push(pool);
        }
        let mut contents = BTreeMap::new();
        for (load_balancer, pools) in by_load_balancer {
            match self.pool_contents(&load_balancer, pools).await {
                Ok(read) => {
                    contents.extend(read.into_iter().map(|(pool, ips)| ((load_balancer.clone(), pool), ips)));
                }
                Err((pool, error)) => {
                    self.updater.stats().recheck_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(
                        %load_balancer,
                        %pool,
                        error = %error_chain(&error),
                        "cannot read a backend pool to recheck it against what was enqueued; rechecking at the next tick"
                    );
                    return Ok(false);
                }
            }
        }
        let service_lock = self.updater.service_lock().clone();
        let reconciling = service_lock.lock().await;
        let mut notes = Vec::new();
        let contents_of = |load_balancer: &str, pool: &str| {
            contents.get(&(load_balancer.to_owned(), pool.to_owned())).cloned().flatten()
        };
        let different = self
            .producer
            .borrow()
            .recheck(&self.updater, &reconciling, contents_of, &mut notes)
            .map_err(RunError::Pools)?;
        for note in notes {
            tracing::info!(%note, "backend-pool recheck");
        }
        tracing::info!(pools = contents.len(), different, "backend pools rechecked against Azure once in this term");
        Ok(true)
    }

    /// What placing a Service of `namespace` reads besides the Service: its namespace's labels
    /// (only when a configuration has a namespace selector; `None` when there is no such
    /// namespace; read once per pass into `namespaces`) and the resource group's load balancers
    /// and public IPs.
    async fn facts(
        &self,
        namespace: &str,
        namespaces: &mut BTreeMap<String, Option<Vec<(String, String)>>>,
    ) -> Result<(Option<Vec<(String, String)>>, AzureFacts), String> {
        let labels = if !self.reads_namespaces {
            None
        } else if let Some(known) = namespaces.get(namespace) {
            known.clone()
        } else {
            let api = ::kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(self.kube.clone());
            let found = api.get_opt(namespace).await.map_err(|e| format!("reading Namespace {namespace}: {e}"))?;
            let labels = found.map(|ns| ns.metadata.labels.unwrap_or_default().into_iter().collect());
            namespaces.insert(namespace.to_owned(), labels.clone());
            labels
        };
        let fresh = self
            .azure
            .borrow()
            .as_ref()
            .and_then(|(at, listed)| (at.elapsed() < self.updater_interval()).then(|| listed.clone()));
        let azure = match fresh {
            Some(listed) => listed,
            None => {
                let load_balancers = self.updater.azure().list_load_balancers().await;
                let load_balancers =
                    load_balancers.map_err(|e| format!("listing the load balancers: {}", error_chain(&e)))?;
                let public_ips = self.updater.azure().list_public_ips().await;
                let public_ips = public_ips.map_err(|e| format!("listing the public IPs: {}", error_chain(&e)))?;
                let listed = AzureFacts::listed(load_balancers, public_ips, &self.resource_group, &self.cluster_name);
                *self.azure.borrow_mut() = Some((tokio::time::Instant::now(), listed.clone()));
                listed
            }
        };
        Ok((labels, azure))
    }

    /// The canonical IPs each of `pools` holds in Azure (`None` for one that does not exist
    /// yet); the first pool that could not be read, and why.
    async fn pool_contents(
        &self,
        load_balancer: &str,
        pools: Vec<String>,
    ) -> Result<BTreeMap<String, Option<BTreeSet<String>>>, (String, clb_azure::AzureError)> {
        let mut contents = BTreeMap::new();
        for pool in pools {
            let at = PoolRef { load_balancer: load_balancer.to_owned(), pool: pool.clone() };
            let ips = match self.updater.azure().get_backend_pool(&at).await {
                Ok((read, _)) => Some(read.addresses.iter().map(|a| canonical_ip(&a.ip_address)).collect()),
                Err(error) if error.status == 404 => None,
                Err(error) => return Err((pool, error)),
            };
            contents.insert(pool, ips);
        }
        Ok(contents)
    }
}
