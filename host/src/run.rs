//! `clb-host run`: the reconciler against a real cluster and a real (or emulated) Azure, on real
//! time — what [`crate::simulate`] does on virtual time, with watchers instead of the in-memory
//! cluster.
//!
//! * **Watching.** Services, EndpointSlices and Nodes are watched with
//!   [`kube::runtime::watcher`] (it re-lists after a 410 and backs off on errors). Each kind has
//!   a [`Mirror`] of the keys the guest has been told about: a (re-)list is buffered until its
//!   `InitDone`, then delivered as upserts of everything listed and deletions of whatever the
//!   guest knew that the list no longer holds — so an object deleted while the watch was broken
//!   is not forgotten. Once every kind's first list is complete, `lists-complete` follows them.
//!   Then every change is delivered as it comes, batched with whatever else is ready.
//! * **Commands.** Every command of a step is executed in order by the [`Executor`] (Azure
//!   through the [`ArmClient`], Kubernetes through [`KubeClient`]) and their outcomes are handed
//!   back with `complete`; watching waits meanwhile.
//! * **Time.** `now` is milliseconds since the start of this process (monotonic). The guest's
//!   `wake-at-ms` is honoured with a timer that calls `tick`.
//! * **Operations.** With a [`Control`] ([`run_with`]), the supervisor publishes to its
//!   [`Metrics`](crate::metrics::Metrics) (readiness also waits for the initial lists), and the
//!   loop takes swap requests between inputs: see [`crate::control`].
//!
//! There is no leader election and no Lease lock yet (design §6): run one replica.

use crate::azure::ArmClient;
use crate::control::{Control, SwapRequest};
use crate::executor::{Executor, command_name};
use crate::kube::{KubeClient, error_chain};
use crate::records;
use crate::sandbox::Logic;
use crate::sandbox::bindings::clb::reconciler::types as wit;
use crate::supervisor::{Supervisor, SupervisorError};
use ::kube::api::Api;
use ::kube::config::{KubeConfigOptions, Kubeconfig};
use ::kube::runtime::WatchStreamExt as _;
use ::kube::runtime::watcher::{self, watcher};
use futures::future::FutureExt as _;
use futures::stream::{BoxStream, StreamExt as _};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::collections::BTreeSet;
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

/// Observations delivered in one `observe` call at most.
const MAX_BATCH: usize = 1_000;

/// Why `run` stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{path}: cannot read the kubeconfig")]
    Kubeconfig {
        path: String,
        #[source]
        source: ::kube::config::KubeconfigError,
    },
    #[error("no Kubernetes configuration (in-cluster or default kubeconfig)")]
    InferConfig(#[source] ::kube::config::InferConfigError),
    #[error("cannot build the Kubernetes client")]
    Client(#[source] ::kube::Error),
    #[error("the logic failed")]
    Logic(#[source] SupervisorError),
    #[error("the watch of {0} ended")]
    WatchEnded(&'static str),
}

/// A Kubernetes client from `kubeconfig`, or else the in-cluster configuration or the default
/// kubeconfig (`KUBECONFIG`, `~/.kube/config`).
pub async fn connect(kubeconfig: Option<&Path>) -> Result<::kube::Client, RunError> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig_error = |source| RunError::Kubeconfig { path: path.display().to_string(), source };
            let file = Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
            ::kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(kubeconfig_error)?
        }
        None => ::kube::Config::infer().await.map_err(RunError::InferConfig)?,
    };
    ::kube::Client::try_from(config).map_err(RunError::Client)
}

/// What `run` connects.
pub struct Settings {
    pub kube: ::kube::Client,
    pub arm: ArmClient,
    pub config: wit::Config,
    /// Which replica this is, in the Events it records.
    pub instance: String,
}

/// One watched change.
enum Change {
    Service(watcher::Event<Service>),
    Slice(watcher::Event<EndpointSlice>),
    Node(watcher::Event<Node>),
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

impl Watched for Service {
    const NAME: &'static str = "Services";
    fn key(&self) -> (String, String) {
        let meta = &self.metadata;
        (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
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
        let meta = &self.metadata;
        (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
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
}

impl Mirrors {
    fn apply(&mut self, change: Change, out: &mut Vec<wit::Observation>) {
        match change {
            Change::Service(event) => self.services.apply(event, out),
            Change::Slice(event) => self.slices.apply(event, out),
            Change::Node(event) => self.nodes.apply(event, out),
            Change::Failed(kind, error) => {
                tracing::warn!(kind, error = %error_chain(&error), "watch failed; retrying with backoff");
            }
        }
    }

    fn listed(&self) -> bool {
        self.services.listed && self.slices.listed && self.nodes.listed
    }
}

fn watch<K>(api: Api<K>, wrap: fn(watcher::Event<K>) -> Change) -> BoxStream<'static, Change>
where
    K: Watched + ::kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher(api, watcher::Config::default())
        .default_backoff()
        .map(move |event| match event {
            Ok(event) => wrap(event),
            Err(error) => Change::Failed(K::NAME, error),
        })
        .boxed()
}

fn absorb(step: wit::Step, pending: &mut Vec<wit::Issued>, wake: &mut Option<u64>) {
    pending.extend(step.commands);
    *wake = step.wake_at_ms;
}

/// Runs `logic` until `shutdown` completes (then `Ok`) or something fatal happens.
pub async fn run(logic: &Logic, settings: Settings, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    run_with(logic, settings, None, shutdown).await
}

/// The next swap request, or never without a control.
async fn next_swap(control: &mut Option<Control>) -> SwapRequest {
    match control {
        Some(control) => control.next().await,
        None => std::future::pending().await,
    }
}

/// [`run`], taking swap requests from `control` and publishing to its metrics.
pub async fn run_with(
    logic: &Logic,
    settings: Settings,
    mut control: Option<Control>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let started = Instant::now();
    let now_ms = || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let kube = KubeClient::new(settings.kube.clone(), settings.instance);
    let executor = Executor::new(&settings.arm, &kube);
    let client = settings.kube;
    let mut changes = futures::stream::select_all([
        watch(Api::<Service>::all(client.clone()), Change::Service),
        watch(Api::<EndpointSlice>::all(client.clone()), Change::Slice),
        watch(Api::<Node>::all(client), Change::Node),
    ]);
    let mut supervisor = Supervisor::new(logic);
    if let Some(control) = &control {
        control.metrics().await_lists();
        supervisor = supervisor.with_metrics(control.metrics().clone());
    }
    supervisor.start(&settings.config).map_err(RunError::Logic)?;
    let mut mirrors = Mirrors::default();
    let mut lists_sent = false;
    let mut pending: Vec<wit::Issued> = Vec::new();
    let mut wake: Option<u64> = None;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        if !pending.is_empty() {
            let issued = std::mem::take(&mut pending);
            let mut results = Vec::with_capacity(issued.len());
            for command in issued {
                let outcome = executor.execute(&command.command).await;
                match &outcome {
                    wit::Outcome::Failed(failure) => tracing::info!(
                        id = command.id,
                        command = command_name(&command.command),
                        status = failure.status,
                        code = failure.code.as_deref().unwrap_or(""),
                        message = %failure.message,
                        "command failed"
                    ),
                    _ => tracing::debug!(id = command.id, command = command_name(&command.command), "command done"),
                }
                results.push((command.id, outcome));
            }
            let step = supervisor.complete(now_ms(), &results).map_err(RunError::Logic)?;
            absorb(step, &mut pending, &mut wake);
            supervisor.take_quarantined();
            continue;
        }
        let wake_at = wake;
        let timer = async move {
            match wake_at {
                Some(at) => tokio::time::sleep_until((started + Duration::from_millis(at)).into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            change = changes.next() => {
                let Some(change) = change else { return Err(RunError::WatchEnded("Services, EndpointSlices and Nodes")) };
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
                    if let Some(control) = &control {
                        control.metrics().lists_delivered();
                    }
                }
                if !batch.is_empty() {
                    let step = supervisor.observe(now_ms(), &batch).map_err(RunError::Logic)?;
                    absorb(step, &mut pending, &mut wake);
                    supervisor.take_quarantined();
                }
            }
            request = next_swap(&mut control) => {
                if let Some(control) = &control {
                    control.handle(&mut supervisor, request, now_ms());
                }
            }
            () = timer => {
                wake = None;
                let step = supervisor.tick(now_ms()).map_err(RunError::Logic)?;
                absorb(step, &mut pending, &mut wake);
                supervisor.take_quarantined();
            }
        }
    }
}
