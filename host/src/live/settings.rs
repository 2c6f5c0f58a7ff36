//! What `clb-host run` is given and how it stops: its [`Settings`], why it stopped
//! ([`RunError`]), the Kubernetes client it connects with and the signal that stops it. Below
//! the loop ([`super::run`]) and the backend-pool updater's term ([`super::pools`]), which both
//! read them.

use crate::live::metrics::RunStats;
use ::kube::config::{KubeConfigOptions, Kubeconfig};
use clb_arm::ArmClient;
use clb_executor::backend_pools::{PoolUpdaterConfig, PoolUpdaterError};
use clb_kube::lease::{ElectionConfig, LeaseError, LeaseLockConfig};
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::bindings::exports::clb::reconciler::backend_pools::SlbConfiguration;
use clb_sandbox::supervisor::SupervisorError;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

/// How long a stopping `run` lets the commands it started finish, unless told otherwise.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

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
    #[error("leader election cannot start")]
    Election(#[source] LeaseError),
    /// The backend-pool updater of multi-SLB local-service mode failed (its guest session).
    #[error("the backend-pool updater failed")]
    Pools(#[source] PoolUpdaterError),
    #[error("the backend-pool updater stopped")]
    PoolsEnded,
    /// Leadership ended before a command was started; [`clb_kube::lease::lead`] stands by.
    #[error("not the leader any more")]
    NotLeader,
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

/// SIGTERM or SIGINT (Ctrl-C elsewhere than Unix), whichever comes first, logged. The handlers
/// are installed now, so a signal that arrives before the future is polled is not lost; call
/// it inside the runtime.
pub fn stop_signal() -> std::io::Result<impl Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        Ok(async move {
            let name = tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                _ = interrupt.recv() => "SIGINT",
            };
            tracing::info!(signal = name, "stopping on a signal");
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            if tokio::signal::ctrl_c().await.is_ok() {
                tracing::info!(signal = "Ctrl-C", "stopping on a signal");
            } else {
                std::future::pending::<()>().await;
            }
        })
    }
}

/// What `run` connects.
pub struct Settings {
    pub kube: ::kube::Client,
    /// Shared by the commands and, in multi-SLB mode, the backend-pool updater.
    pub arm: std::sync::Arc<ArmClient>,
    pub config: wit::Config,
    /// Which replica this is, in the Events it records.
    pub instance: String,
    /// How long a stopping `run` lets running commands finish before it abandons them.
    pub shutdown_grace: Duration,
    /// Inputs a swapped-in version serves on probation ([`Supervisor::with_probation_inputs`](clb_sandbox::supervisor::Supervisor::with_probation_inputs)).
    pub probation_inputs: usize,
    /// Inputs it may quarantine within it ([`Supervisor::with_probation_quarantines`](clb_sandbox::supervisor::Supervisor::with_probation_quarantines)).
    pub probation_quarantines: u32,
    /// `None`: no election, this replica writes (run one).
    pub leader_election: Option<ElectionConfig>,
    /// The Azure resource lock (docs/upstream.md §f) the backend-pool updater of multi-SLB
    /// local-service mode takes around each tick that writes pools (`live/pools.rs`). CLB
    /// mode does not take it, as upstream.
    pub resource_lock: LeaseLockConfig,
    /// `multipleStandardLoadBalancerConfigurations`, as Service placement reads them
    /// ([`CloudConfig::slb_configurations`](clb_executor::inputs::CloudConfig::slb_configurations)).
    pub slb_configurations: Vec<SlbConfiguration>,
    /// The cluster's name, as multi-SLB placement reads it
    /// ([`CloudConfig::cluster_name`](clb_executor::inputs::CloudConfig::cluster_name)).
    pub cluster_name: String,
    /// The backend-pool updater's tick interval and retries
    /// ([`CloudConfig::pool_updater_config`](clb_executor::inputs::CloudConfig::pool_updater_config)).
    pub pool_updater: PoolUpdaterConfig,
    /// Where every term's leases and updater count (clones share them).
    pub stats: RunStats,
    /// The admission webhook's versions (`--admission-listen`): the loop moves them along with
    /// the serving version and the candidate in shadow.
    pub door: Option<std::sync::Arc<crate::admission::Door>>,
}

impl Settings {
    /// Settings with the default [`SHUTDOWN_GRACE`], no leader election, the upstream resource
    /// lock and updater interval, and no multi-SLB configurations.
    pub fn new(kube: ::kube::Client, arm: ArmClient, config: wit::Config, instance: impl Into<String>) -> Self {
        Self {
            kube,
            arm: std::sync::Arc::new(arm),
            config,
            instance: instance.into(),
            shutdown_grace: SHUTDOWN_GRACE,
            probation_inputs: clb_sandbox::supervisor::PROBATION_INPUTS,
            probation_quarantines: clb_sandbox::supervisor::PROBATION_QUARANTINES,
            leader_election: None,
            resource_lock: LeaseLockConfig::default(),
            slb_configurations: Vec::new(),
            cluster_name: clb_executor::inputs::DEFAULT_CLUSTER_NAME.to_owned(),
            pool_updater: PoolUpdaterConfig::default(),
            stats: RunStats::default(),
            door: None,
        }
    }
}
