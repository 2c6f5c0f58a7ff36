//! `clb-host run`: the reconciler against a real cluster and a real (or emulated) Azure, on real
//! time — what `clb_simulator::simulate` does on virtual time, with watchers instead of the in-memory
//! cluster.
//!
//! * **Watching.** Services, EndpointSlices, Nodes and the Pods that carry the egress label
//!   (a label selector on its key, [`records::EGRESS_LABEL`]: a pod that loses the label leaves
//!   the selection and is seen deleted; at start the pods that hold the egress finalizer without
//!   the label are listed once too, [`held_pods`], so that the logic releases a finalizer whose
//!   pod lost its label while no controller ran) are watched with
//!   [`kube::runtime::watcher`] (it re-lists after a 410 and backs off on errors). Each kind has
//!   a [`Mirror`] of the keys the guest has been told about: a (re-)list is buffered until its
//!   `InitDone`, then delivered as upserts of everything listed and deletions of whatever the
//!   guest knew that the list no longer holds — so an object deleted while the watch was broken
//!   is not forgotten. Once every kind's first list is complete, `lists-complete` follows them.
//!   Then every change is delivered as it comes, batched with whatever else is ready.
//! * **Commands.** A step's commands are queued in issue order and run concurrently by the
//!   [`Executor`] (Azure through the [`ArmClient`], Kubernetes through [`KubeClient`]), at most
//!   [`MAX_RUNNING`] at once; the Kubernetes commands on one object (its status, finalizer and
//!   Events) run one at a time in the order issued. Each outcome goes back with `complete` as
//!   soon as it arrives, together with any others that arrived with it. Watching never waits
//!   for a command: changes are delivered between outcomes, so a slow ARM call delays only what
//!   the guest chose to make depend on it. [`Commands::launch`] is the one place a command
//!   starts.
//! * **Stopping.** When `shutdown` completes no queued command starts; running ones (and a
//!   backend-pool tick in progress, in multi-SLB mode) get [`Settings::shutdown_grace`] to
//!   finish and are then dropped. Both are safe: the next start
//!   rebuilds the guest's state from the cluster and NRP (docs/design.md §4, start-up).
//! * **Time.** `now` is milliseconds since the start of this process (monotonic). The guest's
//!   `wake-at-ms` is honoured with a timer that calls `tick`.
//! * **Operations.** With a [`Control`] ([`run_with`]), the supervisor publishes to its
//!   [`Metrics`](crate::live::metrics::Metrics) (readiness also waits for the initial lists), and the
//!   loop takes swap requests between inputs: it stages each (the state move runs on a
//!   blocking thread while the old version serves) and switches when the import comes back
//!   through the same `select!`; see [`crate::live::control`]. A version swapped in stays the active
//!   one across leadership terms, and a swap still staging when a term ends is staged again by
//!   the next one ([`Control::start_term`]).
//!
//! * **Admission** (`--admission-listen`): after every step the webhook's [`Door`](crate::admission::Door)
//!   follows the supervisor's serving version and candidate in shadow, so a swap, a rollback
//!   or a promotion changes the verdicts at the door with the step that made it. A standby
//!   replica's door keeps the version it last served (or the start one).
//!
//! * **Leader election** (docs/design.md §6, [`clb_kube::lease`]): with [`Settings::leader_election`] set,
//!   a replica that does not lead watches nothing and runs no logic; when it becomes the leader
//!   it starts all of the above afresh — watches, a new supervisor, the start-up reconcile that
//!   re-reads NRP — so nothing a previous leader left half-done is lost. [`Commands::launch`]
//!   starts a command only after checking that leadership still [`holds`](Leadership::holds);
//!   when it is lost the whole loop is dropped, running and queued commands with it, and the
//!   replica stands by. A shutdown while leading stops the term as above (grace included), then
//!   releases the Lease. Without election, run one replica.
//! * **Multi-SLB local-service mode** (docs/design.md §5, `live/pools.rs`): when the guest's
//!   `validate-config` says so, each term also runs the backend-pool producer, fed with every
//!   batch the guest is given, and the [`PoolUpdater`](clb_executor::backend_pools::PoolUpdater)
//!   ticking every [`Settings::pool_updater`] interval under the Azure resource lock
//!   ([`Settings::resource_lock`]); a tick starts only while leadership holds.

use crate::live::control::{Control, ControlEvent};
use crate::live::metrics::Metrics;
use crate::live::pools::Pools;
use crate::live::settings::{RunError, Settings};
use ::kube::api::Api;
use ::kube::runtime::WatchStreamExt as _;
use ::kube::runtime::watcher::{self, watcher};
use clb_azure::AzureApi;
use clb_executor::records;
use clb_executor::{Executor, KubeApi, command_subject};
use clb_kube::KubeClient;
use clb_kube::lease::{Elector, Leadership};
use clb_sandbox::LoadedLogic;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::command_name;
use clb_sandbox::error_text::error_chain;
use clb_sandbox::logic;
use clb_sandbox::supervisor::Supervisor;
use futures::future::{FutureExt as _, LocalBoxFuture};
use futures::stream::{BoxStream, FuturesUnordered, StreamExt as _};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::collections::{BTreeSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Watch events gathered into one batch at most before it is handed over (a list arrives as one
/// event: [`logic::observe_in_calls`] bounds what each call into the guest carries).
const MAX_BATCH: usize = 1_000;
/// Commands running at once, at most. The guest keeps at most 16 Service commands in flight,
/// plus one NRP read or address batch, plus Events; this bounds the requests a burst of Events
/// (a thousand rejected Services at start-up) could open at once.
const MAX_RUNNING: usize = 32;
/// One watched change.
enum Change {
    // Boxed: the three differ in size by hundreds of bytes, and a change is moved a few times.
    Service(Box<watcher::Event<Service>>),
    Slice(Box<watcher::Event<EndpointSlice>>),
    Node(Box<watcher::Event<Node>>),
    Pod(Box<watcher::Event<Pod>>),
    /// The pods that hold the egress finalizer without the label, listed once at start
    /// ([`held_pods`]).
    HeldPods(Vec<Pod>),
    Failed(&'static str, watcher::Error),
}

/// A kind of object the guest observes.
trait Watched: Sized {
    const NAME: &'static str;
    /// `(namespace, name)`; the namespace is empty for Nodes.
    fn key(&self) -> (String, String);
    fn upserted(&self) -> wit::Observation;
    fn deleted(key: (String, String)) -> wit::Observation;
}

/// `(namespace, name)` of a namespaced object.
fn namespaced_key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (String, String) {
    (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
}

impl Watched for Service {
    const NAME: &'static str = "Services";
    fn key(&self) -> (String, String) {
        namespaced_key(&self.metadata)
    }
    fn upserted(&self) -> wit::Observation {
        wit::Observation::ServiceUpserted(records::service(self))
    }
    fn deleted(key: (String, String)) -> wit::Observation {
        wit::Observation::ServiceDeleted(key)
    }
}

impl Watched for EndpointSlice {
    const NAME: &'static str = "EndpointSlices";
    fn key(&self) -> (String, String) {
        namespaced_key(&self.metadata)
    }
    fn upserted(&self) -> wit::Observation {
        wit::Observation::SliceUpserted(records::endpoint_slice(self))
    }
    fn deleted(key: (String, String)) -> wit::Observation {
        wit::Observation::SliceDeleted(key)
    }
}

impl Watched for Node {
    const NAME: &'static str = "Nodes";
    fn key(&self) -> (String, String) {
        (String::new(), self.metadata.name.clone().unwrap_or_default())
    }
    fn upserted(&self) -> wit::Observation {
        wit::Observation::NodeUpserted(records::node(self))
    }
    fn deleted(key: (String, String)) -> wit::Observation {
        wit::Observation::NodeDeleted(key.1)
    }
}

impl Watched for Pod {
    const NAME: &'static str = "Pods";
    fn key(&self) -> (String, String) {
        namespaced_key(&self.metadata)
    }
    fn upserted(&self) -> wit::Observation {
        wit::Observation::PodUpserted(records::pod(self))
    }
    fn deleted(key: (String, String)) -> wit::Observation {
        wit::Observation::PodDeleted(key)
    }
}

/// What the guest knows of one kind; see the module documentation.
struct Mirror<K> {
    known: BTreeSet<(String, String)>,
    /// A list in progress.
    listing: Option<Vec<K>>,
    /// Whether a first list has completed.
    listed: bool,
}

impl<K> Default for Mirror<K> {
    fn default() -> Self {
        Self { known: BTreeSet::new(), listing: None, listed: false }
    }
}

impl<K: Watched> Mirror<K> {
    /// Turns one watcher event into observations.
    fn apply(&mut self, event: watcher::Event<K>, out: &mut Vec<wit::Observation>) {
        match event {
            watcher::Event::Init => self.listing = Some(Vec::new()),
            watcher::Event::InitApply(object) => self.listing.get_or_insert_with(Vec::new).push(object),
            watcher::Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let keys: BTreeSet<_> = listed.iter().map(Watched::key).collect();
                out.extend(self.known.difference(&keys).cloned().map(K::deleted));
                out.extend(listed.iter().map(Watched::upserted));
                self.known = keys;
                self.listed = true;
            }
            watcher::Event::Apply(object) => {
                self.known.insert(object.key());
                out.push(object.upserted());
            }
            watcher::Event::Delete(object) => {
                let key = object.key();
                self.known.remove(&key);
                out.push(K::deleted(key));
            }
        }
    }
}

#[derive(Default)]
struct Mirrors {
    services: Mirror<Service>,
    slices: Mirror<EndpointSlice>,
    nodes: Mirror<Node>,
    pods: Mirror<Pod>,
    /// Whether the pods holding the egress finalizer without the label were listed.
    held_listed: bool,
}

impl Mirrors {
    fn apply(&mut self, change: Change, out: &mut Vec<wit::Observation>) {
        match change {
            Change::Service(event) => self.services.apply(*event, out),
            Change::Slice(event) => self.slices.apply(*event, out),
            Change::Node(event) => self.nodes.apply(*event, out),
            Change::Pod(event) => self.pods.apply(*event, out),
            Change::HeldPods(pods) => {
                // Not in the pods' mirror: the label's watch never shows them, so its re-lists
                // must not report them deleted. Once released, the logic forgets them.
                out.extend(pods.iter().map(|pod| wit::Observation::PodUpserted(records::pod(pod))));
                if !pods.is_empty() {
                    tracing::info!(pods = pods.len(), "pods holding the egress finalizer without the label listed");
                }
                self.held_listed = true;
            }
            Change::Failed(kind, error) => {
                tracing::warn!(kind, error = %error_chain(&error), "watch failed; retrying with backoff");
            }
        }
    }

    fn listed(&self) -> bool {
        self.services.listed && self.slices.listed && self.nodes.listed && self.pods.listed && self.held_listed
    }
}

/// Lists, once, the pods that hold the egress finalizer without the egress label (by pages of
/// their metadata: a label selector cannot select by finalizer); a failed list is retried with
/// backoff, as a watch's is.
fn held_pods(api: Api<Pod>) -> BoxStream<'static, Change> {
    futures::stream::once(async move {
        let mut backoff = Duration::from_millis(500);
        loop {
            match list_held_pods(&api).await {
                Ok(pods) => return Change::HeldPods(pods),
                Err(error) => {
                    tracing::warn!(
                        error = %error_chain(&error),
                        "listing the pods that hold the egress finalizer failed; retrying with backoff"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
    })
    .boxed()
}

async fn list_held_pods(api: &Api<Pod>) -> Result<Vec<Pod>, ::kube::Error> {
    let mut held = Vec::new();
    let mut params = ::kube::api::ListParams::default().limit(500);
    loop {
        let page = api.list_metadata(&params).await?;
        held.extend(
            page.items
                .into_iter()
                .filter(|pod| records::holds_finalizer_unlabelled(&pod.metadata))
                .map(|pod| Pod { metadata: pod.metadata, ..Pod::default() }),
        );
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(held),
        }
    }
}

fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    wrap: fn(Box<watcher::Event<K>>) -> Change,
) -> BoxStream<'static, Change>
where
    K: Watched + ::kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher(api, config)
        .default_backoff()
        .map(move |event| match event {
            Ok(event) => wrap(Box::new(event)),
            Err(error) => Change::Failed(K::NAME, error),
        })
        .boxed()
}

/// The object whose Kubernetes commands (status, finalizer, Events) run in the order issued,
/// as `(kind, namespace, name)`.
type Lane = (String, String, String);

/// The lane of a command, if it has one. Azure commands have none: the guest keeps at most one
/// command per Service in flight and never lets an address batch, a Service write and an NRP
/// read overlap where their order matters (`guest/src/tracker/`), so they may finish in any
/// order. A Service's Events and writes keep their order, so an Event never appears before the
/// change it announces.
fn lane(command: &wit::Command) -> Option<Lane> {
    let object = match command {
        wit::Command::EmitEvent(event) => &event.regarding,
        wit::Command::PatchServiceStatus(status) => &status.service,
        wit::Command::SetFinalizer(change) => &change.service,
        _ => return None,
    };
    Some((object.kind.clone(), object.namespace.clone(), object.name.clone()))
}

/// A command that has its outcome.
struct Finished {
    id: u64,
    lane: Option<Lane>,
    outcome: wit::Outcome,
}

/// The guest's commands between `step` and `complete`: queued in issue order, then running
/// concurrently (at most [`MAX_RUNNING`], one at a time per [`Lane`]).
struct Commands<'a, A, K> {
    executor: &'a Executor<'a, A, K>,
    leadership: Leadership,
    queued: VecDeque<wit::Issued>,
    running: FuturesUnordered<LocalBoxFuture<'a, Finished>>,
    /// Lanes with a command running.
    busy: BTreeSet<Lane>,
    /// Where each command's latency goes (`/metrics`), when the endpoint serves.
    metrics: Option<Arc<Metrics>>,
}

impl<'a, A: AzureApi, K: KubeApi> Commands<'a, A, K> {
    fn new(executor: &'a Executor<'a, A, K>, leadership: Leadership, metrics: Option<Arc<Metrics>>) -> Self {
        Self {
            executor,
            leadership,
            queued: VecDeque::new(),
            running: FuturesUnordered::new(),
            busy: BTreeSet::new(),
            metrics,
        }
    }

    fn is_empty(&self) -> bool {
        self.queued.is_empty() && self.running.is_empty()
    }

    /// Starts queued commands in issue order, as far as the slots and the lanes allow. The only
    /// place a command starts, and so where leadership is checked: per command, so that a step
    /// begun as the leader is not carried on after.
    fn launch(&mut self) -> Result<(), RunError> {
        let mut index = 0;
        while index < self.queued.len() && self.running.len() < MAX_RUNNING {
            if !self.leadership.holds() {
                return Err(RunError::NotLeader);
            }
            let lane = lane(&self.queued[index].command);
            if lane.as_ref().is_some_and(|lane| self.busy.contains(lane)) {
                index += 1;
                continue;
            }
            let Some(issued) = self.queued.remove(index) else { break };
            if let Some(lane) = &lane {
                self.busy.insert(lane.clone());
            }
            let executor = self.executor;
            let metrics = self.metrics.clone();
            self.running.push(
                async move {
                    let started = Instant::now();
                    let outcome = executor.execute(&issued.command).await;
                    if let Some(metrics) = &metrics {
                        let failed = matches!(outcome, wit::Outcome::Failed(_));
                        metrics.observe_command(command_name(&issued.command), failed, started.elapsed());
                        if let wit::Outcome::Failed(failure) = &outcome {
                            if failure.status == 429 {
                                metrics.observe_throttled(command_name(&issued.command));
                            }
                            let subject = command_subject(&issued.command);
                            metrics.record_command_error(
                                command_name(&issued.command),
                                &subject,
                                &failure_text(failure),
                            );
                        }
                    }
                    log_outcome(&issued, &outcome);
                    Finished { id: issued.id, lane, outcome }
                }
                .boxed_local(),
            );
        }
        Ok(())
    }

    /// `first` and every other command that has finished too, as `complete` takes them; their
    /// lanes are free again.
    fn settle(&mut self, first: Finished) -> Vec<(u64, wit::Outcome)> {
        let mut results = Vec::new();
        let mut next = Some(first);
        while let Some(finished) = next {
            if let Some(lane) = &finished.lane {
                self.busy.remove(lane);
            }
            results.push((finished.id, finished.outcome));
            next = self.running.next().now_or_never().flatten();
        }
        results
    }

    /// On the way out: queued commands are not started; running ones get `grace` to finish,
    /// then are dropped (their requests cancelled). Either is safe: the guest's state ends with
    /// this process, and the next start rebuilds it from the cluster and from NRP, which is
    /// where a command that did or did not take effect shows.
    async fn stop(mut self, grace: Duration) {
        let (queued, running) = (self.queued.len(), self.running.len());
        tracing::info!(
            running,
            queued,
            ?grace,
            "stopping: letting running commands finish; queued ones are not started"
        );
        let finish = async { while self.running.next().await.is_some() {} };
        if tokio::time::timeout(grace, finish).await.is_err() {
            tracing::warn!(
                abandoned = self.running.len(),
                ?grace,
                "stopping: commands still running after the grace period are abandoned; the next start repairs what they left"
            );
        }
    }
}

/// A failed command is a WARN with what it was about: the guest retries it, but an operator
/// reading the log must see which Service or location waits, and why.
fn log_outcome(issued: &wit::Issued, outcome: &wit::Outcome) {
    let command = command_name(&issued.command);
    match outcome {
        wit::Outcome::Failed(failure) => tracing::warn!(
            id = issued.id,
            command,
            subject = %command_subject(&issued.command),
            status = failure.status,
            code = failure.code.as_deref().unwrap_or(""),
            retry_after_ms = failure.retry_after_ms,
            message = %failure.message,
            "command failed"
        ),
        _ => tracing::debug!(id = issued.id, command, "command done"),
    }
}

/// A failure in one line, for the operator page: what the log line's fields say.
fn failure_text(failure: &wit::Failure) -> String {
    let status = match failure.status {
        0 => "no response".to_owned(),
        status => format!("HTTP {status}"),
    };
    match &failure.code {
        Some(code) => format!("{status} {code}: {}", failure.message),
        None => format!("{status}: {}", failure.message),
    }
}

fn absorb<A: AzureApi, K: KubeApi>(step: wit::Step, commands: &mut Commands<'_, A, K>, wake: &mut Option<u64>) {
    commands.queued.extend(step.commands);
    *wake = step.wake_at_ms;
}

/// Runs `logic` until `shutdown` completes (then `Ok`, after [`Settings::shutdown_grace`] at
/// most) or something fatal happens; with leader election, only while this replica leads.
pub async fn run(logic: &LoadedLogic, settings: Settings, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    run_with(logic, settings, None, shutdown).await
}

/// [`run`], taking swap requests from `control` and publishing to its metrics.
pub async fn run_with(
    logic: &LoadedLogic,
    settings: Settings,
    mut control: Option<Control>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    // The version serving, when a swap or a rollback replaced `logic`: the next term starts
    // with it, so a leadership change does not undo an accepted swap.
    let active = std::cell::RefCell::new(None::<LoadedLogic>);
    let Some(election) = settings.leader_election.clone() else {
        return reconcile(logic, &active, &settings, Leadership::unconditional(), &mut control, shutdown).await;
    };
    let mut elector = Elector::new(settings.kube.clone(), election)
        .map_err(RunError::Election)?
        .counting_into(settings.stats.leader.clone());
    let settings = &settings;
    let control = &mut control;
    if let Some(control) = control {
        control.metrics().standing_by(true);
    }
    // Both see the shutdown: `lead` while standing by, the term to stop with its grace period.
    let shutdown = shutdown.shared();
    clb_kube::lease::lead(&mut elector, shutdown.clone(), async |leadership| {
        reconcile(logic, &active, settings, leadership, control, shutdown.clone()).await
    })
    .await
}

/// The next swap request or the end of a staging import, or never without a control.
async fn next_swap(control: &mut Option<Control>) -> ControlEvent {
    match control {
        Some(control) => control.next().await,
        None => std::future::pending().await,
    }
}

/// Marks the metrics as standing by again when a term ends, however it ends.
struct Term(Option<Arc<Metrics>>);

impl Drop for Term {
    fn drop(&mut self) {
        if let Some(metrics) = &self.0 {
            metrics.standing_by(true);
        }
    }
}

/// Records the supervisor's version as the active one when a swap or a rollback changed it.
fn remember_active(active: &std::cell::RefCell<Option<LoadedLogic>>, supervisor: &Supervisor<'_>) {
    let serving = supervisor.logic();
    let known = active.borrow().as_ref().map(|logic| logic.info().sha256.clone());
    if known.as_deref() != Some(serving.info().sha256.as_str()) {
        *active.borrow_mut() = Some(serving.clone());
    }
}

/// Moves the admission webhook's door, if it serves, to the supervisor's versions: what
/// reconciles judges at the door from the step that swapped it in.
fn follow_door(settings: &Settings, supervisor: &Supervisor<'_>) {
    if let Some(door) = &settings.door {
        door.follow(supervisor.logic(), supervisor.shadow_handle());
    }
}

/// The loop of one term (or of the whole process without election).
async fn reconcile(
    logic: &LoadedLogic,
    active: &std::cell::RefCell<Option<LoadedLogic>>,
    settings: &Settings,
    leadership: Leadership,
    control: &mut Option<Control>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let started = Instant::now();
    let now_ms = || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let kube = KubeClient::new(settings.kube.clone(), settings.instance.clone());
    let executor = Executor::new(&settings.arm, &kube);
    let client = settings.kube.clone();
    let mut changes = futures::stream::select_all([
        watch(Api::<Service>::all(client.clone()), watcher::Config::default(), Change::Service),
        watch(Api::<EndpointSlice>::all(client.clone()), watcher::Config::default(), Change::Slice),
        watch(Api::<Node>::all(client.clone()), watcher::Config::default(), Change::Node),
        watch(Api::<Pod>::all(client.clone()), watcher::Config::default().labels(records::EGRESS_LABEL), Change::Pod),
        held_pods(Api::<Pod>::all(client)),
    ]);
    let mut supervisor = match active.borrow().clone() {
        Some(swapped) => Supervisor::new(swapped),
        None => Supervisor::new(logic),
    }
    .with_probation_inputs(settings.probation_inputs)
    .with_probation_quarantines(settings.probation_quarantines);
    if let Some(recorder) = &settings.stats.trace {
        supervisor.record_into(recorder.clone());
    }
    let _term = Term(control.as_ref().map(|control| control.metrics().clone()));
    if let Some(control) = control.as_mut() {
        control.start_term();
        control.metrics().standing_by(false);
        control.metrics().await_lists();
        supervisor = supervisor.with_metrics(control.metrics().clone());
    }
    logic::Logic::start(&mut supervisor, &settings.config).map_err(RunError::Logic)?;
    if let Some(control) = control.as_mut() {
        control.resume_shadow(&mut supervisor);
    }
    follow_door(settings, &supervisor);
    // Multi-SLB local-service mode: the backend-pool producer sees every batch the guest sees,
    // and the updater ticks alongside the loop (`run_pools`).
    let pools = Pools::for_mode(supervisor.logic(), settings)?;
    let pool_leadership = leadership.clone();
    let mut pool_work = std::pin::pin!(async {
        match &pools {
            Some(pools) => pools.run(&pool_leadership).await,
            None => std::future::pending().await,
        }
    });
    let mut mirrors = Mirrors::default();
    let mut lists_sent = false;
    let mut commands = Commands::new(&executor, leadership, control.as_ref().map(|control| control.metrics().clone()));
    let mut wake: Option<u64> = None;
    // The logic's figures (`tracker.stats`) are read at most once a second, and within a second
    // of the last step.
    let mut figures_at = Instant::now();
    let mut figures_stale = true;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        commands.launch()?;
        let wake_at = wake;
        let timer = async move {
            match wake_at {
                Some(at) => tokio::time::sleep_until((started + Duration::from_millis(at)).into()).await,
                None => std::future::pending().await,
            }
        };
        // Whichever comes first: a watched change, a finished command, or the guest's timer; none
        // waits for another, so a slow Azure call delays only what depends on its outcome.
        let step = tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep_until((figures_at + FIGURES_EVERY).into()), if figures_stale && control.is_some() => {
                read_figures(&mut supervisor, control.as_ref(), now_ms());
                (figures_at, figures_stale) = (Instant::now(), false);
                continue;
            }
            result = &mut pool_work => {
                // It returns only on failure; an `Ok` would mean it stopped, which it must not.
                result?;
                return Err(RunError::PoolsEnded);
            }
            Some(finished) = commands.running.next(), if !commands.running.is_empty() => {
                let results = commands.settle(finished);
                let figure = arm_figure(&*settings.arm, control.as_ref().map(|control| &**control.metrics()));
                logic::Logic::complete(&mut supervisor, now_ms(), &results, figure)
            }
            change = changes.next() => {
                let Some(change) = change else { return Err(RunError::WatchEnded("Services, EndpointSlices, Nodes and Pods")) };
                let mut batch = Vec::new();
                mirrors.apply(change, &mut batch);
                while batch.len() < MAX_BATCH {
                    match changes.next().now_or_never() {
                        Some(Some(change)) => mirrors.apply(change, &mut batch),
                        _ => break,
                    }
                }
                if !lists_sent && mirrors.listed() {
                    batch.push(wit::Observation::ListsComplete);
                    lists_sent = true;
                    tracing::info!("initial lists delivered");
                    if let Some(control) = control.as_ref() {
                        control.metrics().lists_delivered();
                    }
                }
                if batch.is_empty() {
                    continue;
                }
                if let Some(pools) = &pools {
                    pools.observe(&batch);
                }
                // A (re-)list arrives whole: it reaches the guest in calls of bounded size.
                logic::observe_in_calls(&mut supervisor, now_ms(), &batch, |step| absorb(step, &mut commands, &mut wake))
            }
            event = next_swap(control) => {
                let Some(control) = control.as_mut() else { continue };
                let first_step = control.handle(&mut supervisor, event, now_ms());
                // A shadow started or stopped without a step: the door follows it now.
                let Some(first_step) = first_step else {
                    follow_door(settings, &supervisor);
                    continue;
                };
                Ok(first_step)
            }
            () = timer => {
                wake = None;
                logic::Logic::tick(&mut supervisor, now_ms())
            }
        };
        absorb(step.map_err(RunError::Logic)?, &mut commands, &mut wake);
        let quarantined = supervisor.take_quarantined();
        if let Some(control) = control.as_ref() {
            control.metrics().record_quarantined(quarantined);
        }
        remember_active(active, &supervisor);
        follow_door(settings, &supervisor);
        figures_stale = true;
        if figures_at.elapsed() >= FIGURES_EVERY {
            read_figures(&mut supervisor, control.as_ref(), now_ms());
            (figures_at, figures_stale) = (Instant::now(), false);
        }
    }
    tracing::info!("shutdown requested");
    let grace = settings.shutdown_grace;
    let stop_commands = async {
        if !commands.is_empty() {
            commands.stop(grace).await;
        }
    };
    let finish_tick = async {
        if let Some(pools) = &pools {
            pools.finish_tick(pool_work.as_mut(), grace).await;
        }
    };
    futures::join!(stop_commands, finish_tick);
    tracing::info!("stopped");
    Ok(())
}

/// How often the logic's figures are read for `/metrics` at most.
const FIGURES_EVERY: Duration = Duration::from_secs(1);

/// Reads the serving logic's figures into `/metrics`. A trap is logged and counted by the
/// supervisor (which rebuilds the instance); the figures stay as last read.
fn read_figures(supervisor: &mut Supervisor, control: Option<&Control>, now_ms: u64) {
    let Some(control) = control else { return };
    let sha256 = supervisor.logic().info().sha256.clone();
    match supervisor.logic_stats(now_ms) {
        Ok(stats) => {
            control.metrics().publish_figures(&sha256, stats, crate::clock::epoch_ms(), now_ms);
        }
        Err(error) => {
            tracing::warn!(%error, version = %&sha256[..12.min(sha256.len())], "reading the logic's figures failed")
        }
    }
}

/// What ARM's latest answer since the last call said is left of the subscription's writes: shown
/// on `/metrics`, and handed to the logic with the outcomes.
fn arm_figure<A: AzureApi>(arm: &A, metrics: Option<&Metrics>) -> Option<u32> {
    let figure = arm.take_arm_remaining_writes();
    if let (Some(remaining), Some(metrics)) = (figure, metrics) {
        metrics.arm_remaining_writes(remaining);
    }
    figure
}

#[cfg(test)]
mod tests;
