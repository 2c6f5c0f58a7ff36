//! `clb-host run` assembled: the HTTP endpoint, the watched source of new versions, the
//! operator page's sampler and the swap Event reporter started around the loop ([`run_with`]) with its [`Control`]. The top of
//! the live controller: nothing in it is imported by the parts it assembles.

use crate::clock::epoch_ms;
use crate::live::control::{Control, EventTarget, ShadowPolicy, report_events};
use crate::live::endpoint::{Admin, EndpointError, MetricsServer};
use crate::live::metrics::{Metrics, SAMPLE_EVERY};
use crate::live::run::run_with;
use crate::live::settings::{RunError, Settings};
use crate::live::sources::LogicSource;
use crate::live::swap::Sha256Pin;
use clb_kube::KubeClient;
use clb_sandbox::{Limits, LoadedLogic, Runtime};
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::task::JoinHandle;

/// How long shutdown waits for the Event reporter.
const EVENT_DRAIN: Duration = Duration::from_secs(10);

/// What `clb-host run` serves around its loop.
pub struct OperationsConfig {
    /// The HTTP endpoint: `/` (the operator page), `/metrics`, `/healthz`, `/readyz`, `/status`, `POST /swap`.
    pub listen: SocketAddr,
    /// See [`Admin::token`].
    pub admin_token: Option<String>,
    /// A watched source of new versions.
    pub source: Option<LogicSource>,
    /// The sha256 every version from the source must have.
    pub pin: Option<Sha256Pin>,
    /// When set, every version (from the sources and `POST /swap`) must be signed by this key
    /// ([`crate::live::control::SwapSender::verifying`]).
    pub verify_key: Option<clb_oci::signature::PublicKey>,
    /// Where swap Events go; default: the ConfigMap source, else [`EventTarget::DEFAULT`].
    pub events: Option<EventTarget>,
    /// Limits of the versions swapped in.
    pub limits: Limits,
    /// How often a file source is looked at.
    pub poll: Duration,
    /// A watched source of a candidate to run in shadow.
    pub shadow: Option<ShadowSource>,
    /// The admission webhook's counters and door, when `run` serves it: shown on `/metrics`,
    /// `/status` and the page.
    pub admission: Option<(crate::admission::Metrics, std::sync::Arc<crate::admission::Door>)>,
}

/// Where a candidate in shadow comes from, and how it is run and promoted.
#[derive(Clone, Debug)]
pub struct ShadowSource {
    pub source: LogicSource,
    /// The sha256 every candidate from it must have.
    pub pin: Option<Sha256Pin>,
    pub policy: ShadowPolicy,
}

/// The endpoint, the source's watcher and the Event reporter, started; [`Operations::run`] runs
/// the loop with them.
pub struct Operations {
    server: MetricsServer,
    control: Control,
    source: Option<JoinHandle<()>>,
    shadow_source: Option<JoinHandle<()>>,
    events: JoinHandle<()>,
    /// Samples the operator page's time series.
    sampler: JoinHandle<()>,
    target: EventTarget,
}

impl Operations {
    /// Binds the endpoint and starts the tasks on the current tokio runtime.
    pub async fn start(
        runtime: &Runtime,
        settings: &Settings,
        config: OperationsConfig,
    ) -> Result<Self, EndpointError> {
        let metrics = match &config.admission {
            Some((admission, door)) => {
                let metrics = Metrics::registering(|registry| admission.register(registry));
                metrics.track_door(door.clone());
                metrics
            }
            None => Metrics::new(),
        };
        #[cfg(unix)]
        metrics.track_memories(runtime.memories().clone());
        metrics.track_run(settings.stats.clone());
        let (control, swaps) = Control::new(runtime, config.limits, metrics.clone());
        let swaps = swaps.verifying(config.verify_key);
        let policy = config.shadow.as_ref().map(|shadow| shadow.policy.clone()).unwrap_or_default();
        let control = control.with_shadow_policy(policy);
        let admin = Admin { swaps: swaps.clone(), token: config.admin_token };
        let server = MetricsServer::start_with_admin(metrics.clone(), config.listen, Some(admin)).await?;
        let target = match (config.events, &config.source) {
            (Some(target), _) => target,
            (None, Some(LogicSource::ConfigMap(key))) => {
                EventTarget { namespace: key.namespace.clone(), name: key.name.clone() }
            }
            (None, _) => EventTarget::parse(EventTarget::DEFAULT).expect("the default names an object"),
        };
        let kube = KubeClient::new(settings.kube.clone(), settings.instance.clone());
        let events = tokio::spawn(report_events(kube, target.clone(), metrics.clone(), metrics.subscribe_swaps()));
        let source = config.source.map(|source| {
            tokio::spawn(source.watch(Some(settings.kube.clone()), config.pin, swaps.clone(), config.poll))
        });
        let shadow_source = config.shadow.map(|shadow| {
            let watch = shadow.source.watch(Some(settings.kube.clone()), shadow.pin, swaps.for_shadow(), config.poll);
            tokio::spawn(watch)
        });
        // On its own timer rather than the loop's: a quiet controller still draws its flat line,
        // and a stuck loop shows as a lag that keeps growing.
        let sampled = metrics.clone();
        let sampler = tokio::spawn(async move {
            let mut every = tokio::time::interval(SAMPLE_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                sampled.sample(epoch_ms());
            }
        });
        tracing::info!(addr = %server.local_addr(), events = %target, "serving / (the operator page), /metrics, /healthz, /readyz, /status and POST /swap");
        Ok(Self { server, control, source, shadow_source, events, sampler, target })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// The ConfigMap swap Events regard.
    pub fn event_target(&self) -> &EventTarget {
        &self.target
    }

    /// Runs the loop until `shutdown`; then stops the endpoint and the source, and lets the
    /// Event reporter write what it holds.
    pub async fn run(
        self,
        logic: &LoadedLogic,
        settings: Settings,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), RunError> {
        let Operations { server, control, source, shadow_source, events, sampler, .. } = self;
        let metrics = control.metrics().clone();
        let result = run_with(logic, settings, Some(control), shutdown).await;
        drop(server);
        for source in [source, shadow_source, Some(sampler)].into_iter().flatten() {
            source.abort();
        }
        metrics.unsubscribe_swaps();
        if tokio::time::timeout(EVENT_DRAIN, events).await.is_err() {
            tracing::warn!("swap Events still unwritten at shutdown are dropped (they are in the log)");
        }
        result
    }
}
