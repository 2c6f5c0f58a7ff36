//! The two `coordination.k8s.io/v1` Leases of docs/design.md §6: the **Azure resource lock**
//! ([`LeaseLock`]) and **leader election** ([`Elector`], [`lead`]).
//!
//! Both are optimistic: a Lease is read, changed and written back with the `resourceVersion`
//! just read (`PUT`), so of two concurrent writers exactly one succeeds and the other gets
//! 409 `Conflict` ([`LeaseError::Conflict`]). Kubernetes is the only arbiter; nothing here is
//! a consensus of its own.
//!
//! # The Azure resource lock (docs/upstream.md §f, compatible with it)
//!
//! The Lease `kube-system/aks-managed-resource-locker`, holder `cloud-controller-manager`, 900 s,
//! and the `aks-managed-resource-locker-previous-holder` annotation, so that it keeps out — and
//! is kept out by — the other components that honour upstream's lock (the AKS resource provider).
//! The holder is one constant for every replica on purpose: the lock excludes *other
//! components*, replicas of this one are serialised by leader election.
//!
//! * **Acquire:** create the Lease held, or take it when it is free (no holder), expired
//!   (`renewTime + leaseDurationSeconds` passed, or never renewed) or already ours (a previous
//!   release failed). Held by another holder and not expired: [`LeaseError::HeldByOther`] with
//!   the holder and until when. Taking over an expired foreign holder records it in the
//!   previous-holder annotation; finding a foreign previous holder is logged (upstream rebuilds
//!   its load-balancer cache then; this host caches nothing — every pool write is a GET and an
//!   `If-Match` PUT — so there is nothing to rebuild).
//! * **Renewal while held** (improvement over upstream, docs/upstream.md §i.4 #2): a background task renews
//!   `renewTime` every [`LeaseLockConfig::renew_period`] until release. Renew-on-use would not
//!   help: the lock is held across one tick's many ARM calls, and it is exactly a long tick that
//!   must not lose exclusivity silently. A renewal that finds the Lease taken logs an error and
//!   counts `lost`.
//! * **Release:** clear the holder, set the previous-holder annotation to ours. A Lease that is
//!   gone, expired or someone else's is left alone. Through [`ResourceLock`] a failed release is
//!   a warning and a counter of the caller, never a failed tick (docs/upstream.md §i.4 #4).
//!
//! # Leader election
//!
//! A second Lease (default `kube-system/clb-reconciler`) whose holder is a per-replica identity
//! ([`replica_identity`]), with client-go's semantics and defaults (15 s lease, 10 s renew
//! deadline, 2 s retry period): a candidate takes the Lease only when it has seen the same
//! record (`resourceVersion`) unchanged for the Lease's duration *on its own clock*, so clock
//! skew between replicas does not matter. The leader renews every retry period.
//!
//! A [`Leadership`] says whether this replica may write *now*: until the instant of the last
//! successful renewal's request plus the renew deadline. Because the deadline is shorter than
//! the lease duration, and a successor waits a full lease duration after it last saw the record
//! change, a leader has stopped writing before anyone else may start. Writers check it before
//! every command ([`Leadership::holds`]); [`lead`] also drops the leader's work the moment the
//! deadline passes, so a step begun under leadership is not carried on after it.
//!
//! On losing leadership the replica goes back to **standby** (upstream's controller-manager exits
//! instead): the work future is dropped with all of its state, and a later term starts it afresh,
//! exactly as a restarted process would — so nothing of the old term is executed twice or later.
//! On shutdown the leader releases its Lease so a standby takes over at once.
//!
//! It is longer than 800 lines because both Leases share one optimistic read-modify-write (the
//! `resourceVersion` guard, the holder and transition rules, the clock they are judged by), and
//! the rules are client-go's and upstream's to be read side by side with them.

use clb_executor::backend_pools::{LockError, ResourceLock};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Upstream `AzureResourceLockLeaseName`.
pub const RESOURCE_LOCK_NAME: &str = "aks-managed-resource-locker";
/// Upstream `AzureResourceLockLeaseNamespace`.
pub const RESOURCE_LOCK_NAMESPACE: &str = "kube-system";
/// Upstream `AzureResourceLockHolderNameCloudControllerManager`.
pub const RESOURCE_LOCK_HOLDER: &str = "cloud-controller-manager";
/// Upstream `AzureResourceLockPreviousHolderNameAnnotation`.
pub const PREVIOUS_HOLDER_ANNOTATION: &str = "aks-managed-resource-locker-previous-holder";
/// Upstream `AzureResourceLockLeaseDuration`.
pub const RESOURCE_LOCK_DURATION: Duration = Duration::from_secs(900);
/// A third of the duration: two renewals may fail before the lock expires.
pub const RESOURCE_LOCK_RENEW_PERIOD: Duration = Duration::from_secs(300);

/// The leader-election Lease's default name. Not upstream's `cloud-controller-manager`: this
/// reconciler may run next to a cloud-controller-manager, and sharing its Lease would make the
/// two exclude each other.
pub const LEADER_ELECTION_NAME: &str = "clb-reconciler";
/// client-go / component-base defaults.
pub const LEADER_ELECTION_NAMESPACE: &str = "kube-system";
pub const LEADER_ELECTION_LEASE_DURATION: Duration = Duration::from_secs(15);
pub const LEADER_ELECTION_RENEW_DEADLINE: Duration = Duration::from_secs(10);
pub const LEADER_ELECTION_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// Why a Lease could not be taken, renewed or released.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("Lease {namespace}/{name} is held by {holder:?} until {until}")]
    HeldByOther { namespace: String, name: String, holder: String, until: Timestamp },
    #[error("Lease {namespace}/{name} changed under this {action} (409 Conflict): another holder was faster")]
    Conflict {
        namespace: String,
        name: String,
        action: &'static str,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("Lease {namespace}/{name}: the {action} failed")]
    Api {
        namespace: String,
        name: String,
        action: &'static str,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("Lease {namespace}/{name} was taken by {holder:?} while this process held it")]
    Lost { namespace: String, name: String, holder: String },
    #[error("inconsistent settings: {0}")]
    Settings(&'static str),
}

impl LeaseError {
    /// The label of the `failures` counter this error counts in.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::HeldByOther { .. } => "held",
            Self::Conflict { .. } => "conflict",
            Self::Api { .. } => "api",
            Self::Lost { .. } => "lost",
            Self::Settings(_) => "settings",
        }
    }
}

/// Counters of one Lease, for metrics and tests.
#[derive(Debug, Default)]
pub struct LeaseStats {
    /// Acquisitions (resource lock) or terms begun (leader election).
    pub acquired: AtomicU64,
    pub renewed: AtomicU64,
    pub released: AtomicU64,
    /// Attempts refused because another holder has the Lease.
    pub held_elsewhere: AtomicU64,
    pub conflicts: AtomicU64,
    pub api_failures: AtomicU64,
    pub renew_failures: AtomicU64,
    pub release_failures: AtomicU64,
    /// Times the Lease was found taken while held, or leadership ended without a release.
    pub lost: AtomicU64,
}

impl LeaseStats {
    /// Every counter with the `result` label `/metrics` gives it.
    pub fn by_result(&self) -> [(&'static str, u64); 9] {
        let n = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        [
            ("acquired", n(&self.acquired)),
            ("renewed", n(&self.renewed)),
            ("released", n(&self.released)),
            ("held-elsewhere", n(&self.held_elsewhere)),
            ("conflict", n(&self.conflicts)),
            ("api-failure", n(&self.api_failures)),
            ("renew-failure", n(&self.renew_failures)),
            ("release-failure", n(&self.release_failures)),
            ("lost", n(&self.lost)),
        ]
    }

    fn failed(&self, error: &LeaseError) {
        let counter = match error {
            LeaseError::HeldByOther { .. } => &self.held_elsewhere,
            LeaseError::Conflict { .. } => &self.conflicts,
            LeaseError::Lost { .. } => &self.lost,
            LeaseError::Api { .. } | LeaseError::Settings(_) => &self.api_failures,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// One Lease object: reads and optimistic writes with typed errors.
#[derive(Clone)]
struct LeaseObject {
    api: Api<Lease>,
    namespace: String,
    name: String,
}

impl LeaseObject {
    fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self { api: Api::namespaced(client, namespace), namespace: namespace.to_owned(), name: name.to_owned() }
    }

    fn error(&self, action: &'static str, source: kube::Error) -> LeaseError {
        let (namespace, name) = (self.namespace.clone(), self.name.clone());
        let conflict = matches!(&source, kube::Error::Api(status) if status.code == 409);
        let source = Box::new(source);
        // A create that lost to another create says AlreadyExists; an update that lost says
        // Conflict: both are 409 and both mean someone else was faster.
        if conflict {
            LeaseError::Conflict { namespace, name, action, source }
        } else {
            LeaseError::Api { namespace, name, action, source }
        }
    }

    async fn get(&self) -> Result<Option<Lease>, LeaseError> {
        self.api.get_opt(&self.name).await.map_err(|e| self.error("read", e))
    }

    async fn create(&self, spec: LeaseSpec, annotations: Option<Annotations>) -> Result<Lease, LeaseError> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                annotations,
                ..Default::default()
            },
            spec: Some(spec),
        };
        self.api.create(&PostParams::default(), &lease).await.map_err(|e| self.error("create", e))
    }

    /// Writes `lease` back; it carries the `resourceVersion` it was read with.
    async fn replace(&self, lease: &Lease, action: &'static str) -> Result<Lease, LeaseError> {
        self.api.replace(&self.name, &PostParams::default(), lease).await.map_err(|e| self.error(action, e))
    }
}

type Annotations = std::collections::BTreeMap<String, String>;

fn seconds(duration: Duration) -> i32 {
    i32::try_from(duration.as_secs().max(1)).unwrap_or(i32::MAX)
}

fn holder_of(lease: &Lease) -> &str {
    lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()).unwrap_or("")
}

/// Until when the Lease's holder may hold it by its own record (upstream's expiry rule); `None`
/// when it is free: no holder, or never renewed.
fn held_until(lease: &Lease, default_duration: Duration) -> Option<Timestamp> {
    let spec = lease.spec.as_ref()?;
    if spec.holder_identity.as_deref().unwrap_or("").is_empty() {
        return None;
    }
    let renewed = spec.renew_time.as_ref()?.0;
    let duration = spec.lease_duration_seconds.map_or(seconds(default_duration), |s| s.max(0));
    renewed.checked_add(SignedDuration::from_secs(i64::from(duration))).ok()
}

/// What the Azure resource lock uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseLockConfig {
    pub name: String,
    pub namespace: String,
    /// Upstream compares it case-insensitively; so does this.
    pub holder: String,
    pub duration: Duration,
    pub renew_period: Duration,
}

impl Default for LeaseLockConfig {
    fn default() -> Self {
        Self {
            name: RESOURCE_LOCK_NAME.into(),
            namespace: RESOURCE_LOCK_NAMESPACE.into(),
            holder: RESOURCE_LOCK_HOLDER.into(),
            duration: RESOURCE_LOCK_DURATION,
            renew_period: RESOURCE_LOCK_RENEW_PERIOD,
        }
    }
}

impl LeaseLockConfig {
    /// A renewal must come before the lock expires, and the holder must be named.
    pub fn validate(&self) -> Result<(), LeaseError> {
        if self.holder.is_empty() {
            return Err(LeaseError::Settings("the azure resource lock's holder is empty"));
        }
        if self.renew_period.is_zero() || self.renew_period >= self.duration {
            return Err(LeaseError::Settings(
                "the azure resource lock's renew period must be positive and shorter than its duration",
            ));
        }
        Ok(())
    }
}

/// What an acquisition found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acquired {
    /// The previous-holder annotation, when it names another component: it may have written the
    /// same Azure resources since this holder last released.
    pub foreign_previous_holder: Option<String>,
}

/// The Azure resource lock on a Lease; see the module documentation.
pub struct LeaseLock {
    lease: LeaseObject,
    config: LeaseLockConfig,
    renewal: Mutex<Option<tokio::task::AbortHandle>>,
    stats: Arc<LeaseStats>,
}

impl LeaseLock {
    pub fn new(client: kube::Client, config: LeaseLockConfig) -> Self {
        Self {
            lease: LeaseObject::new(client, &config.namespace, &config.name),
            config,
            renewal: Mutex::new(None),
            stats: Arc::default(),
        }
    }

    pub fn config(&self) -> &LeaseLockConfig {
        &self.config
    }

    pub fn stats(&self) -> &LeaseStats {
        &self.stats
    }

    /// Counts into `stats` (shared with earlier locks of the same Lease, for `/metrics`).
    pub fn counting_into(mut self, stats: Arc<LeaseStats>) -> Self {
        self.stats = stats;
        self
    }

    fn ours(&self, holder: &str) -> bool {
        holder.eq_ignore_ascii_case(&self.config.holder)
    }

    /// Takes the lock (see the module documentation) and starts renewing it in the background.
    pub async fn acquire(&self) -> Result<Acquired, LeaseError> {
        let result = self.try_acquire().await;
        match &result {
            Ok(acquired) => {
                self.stats.acquired.fetch_add(1, Ordering::Relaxed);
                if let Some(previous) = &acquired.foreign_previous_holder {
                    tracing::info!(
                        lease = %self.lease.name,
                        previous_holder = %previous,
                        "azure resource lock taken; another component held it since our last release"
                    );
                }
                self.start_renewal();
            }
            Err(error) => {
                self.stats.failed(error);
                tracing::debug!(error = %clb_sandbox::error_text::error_chain(error), "azure resource lock not taken");
            }
        }
        result
    }

    async fn try_acquire(&self) -> Result<Acquired, LeaseError> {
        let now = Timestamp::now();
        let held = LeaseSpec {
            holder_identity: Some(self.config.holder.clone()),
            lease_duration_seconds: Some(seconds(self.config.duration)),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        };
        let Some(mut lease) = self.lease.get().await? else {
            self.lease.create(held, None).await?;
            return Ok(Acquired { foreign_previous_holder: None });
        };
        let holder = holder_of(&lease).to_owned();
        let until = held_until(&lease, self.config.duration);
        if !self.ours(&holder)
            && let Some(until) = until.filter(|until| *until > now)
        {
            return Err(LeaseError::HeldByOther {
                namespace: self.lease.namespace.clone(),
                name: self.lease.name.clone(),
                holder,
                until,
            });
        }
        let annotations = lease.metadata.annotations.get_or_insert_with(Default::default);
        if !holder.is_empty() && !self.ours(&holder) {
            // An expired foreign holder: it stopped without releasing, possibly mid-write.
            annotations.insert(PREVIOUS_HOLDER_ANNOTATION.into(), holder);
        }
        let previous = annotations.get(PREVIOUS_HOLDER_ANNOTATION).filter(|p| !self.ours(p)).cloned();
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = held.holder_identity;
        spec.lease_duration_seconds = held.lease_duration_seconds;
        spec.acquire_time = held.acquire_time;
        spec.renew_time = held.renew_time;
        self.lease.replace(&lease, "update").await?;
        Ok(Acquired { foreign_previous_holder: previous })
    }

    fn start_renewal(&self) {
        let (lease, config, stats) = (self.lease.clone(), self.config.clone(), self.stats.clone());
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(config.renew_period).await;
                match renew(&lease, &config).await {
                    Ok(()) => {
                        stats.renewed.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error @ LeaseError::Lost { .. }) => {
                        stats.failed(&error);
                        tracing::error!(error = %error, "azure resource lock lost while held; renewal stops");
                        return;
                    }
                    Err(error) => {
                        stats.renew_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            error = %clb_sandbox::error_text::error_chain(&error),
                            "azure resource lock: renewal failed; retrying at the next period"
                        );
                    }
                }
            }
        });
        if let Some(previous) = self.renewal.lock().unwrap_or_else(|p| p.into_inner()).replace(task.abort_handle()) {
            previous.abort();
        }
    }

    /// Stops renewing and gives the Lease back (see the module documentation).
    pub async fn release(&self) -> Result<(), LeaseError> {
        if let Some(renewal) = self.renewal.lock().unwrap_or_else(|p| p.into_inner()).take() {
            renewal.abort();
        }
        let result = self.try_release().await;
        match &result {
            Ok(()) => self.stats.released.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.stats.release_failures.fetch_add(1, Ordering::Relaxed),
        };
        result
    }

    async fn try_release(&self) -> Result<(), LeaseError> {
        let Some(mut lease) = self.lease.get().await? else { return Ok(()) };
        let expired = held_until(&lease, self.config.duration).is_none_or(|until| until <= Timestamp::now());
        if !self.ours(holder_of(&lease)) || expired {
            return Ok(());
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = Some(String::new());
        }
        lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(PREVIOUS_HOLDER_ANNOTATION.into(), self.config.holder.clone());
        self.lease.replace(&lease, "release").await?;
        Ok(())
    }
}

impl Drop for LeaseLock {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            renewal.abort();
        }
    }
}

/// One renewal of the resource lock: only if it is still ours.
async fn renew(lease: &LeaseObject, config: &LeaseLockConfig) -> Result<(), LeaseError> {
    let Some(mut current) = lease.get().await? else {
        return Err(LeaseError::Lost {
            namespace: lease.namespace.clone(),
            name: lease.name.clone(),
            holder: String::new(),
        });
    };
    let holder = holder_of(&current);
    if !holder.eq_ignore_ascii_case(&config.holder) {
        return Err(LeaseError::Lost {
            namespace: lease.namespace.clone(),
            name: lease.name.clone(),
            holder: holder.to_owned(),
        });
    }
    if let Some(spec) = current.spec.as_mut() {
        spec.renew_time = Some(MicroTime(Timestamp::now()));
    }
    lease.replace(&current, "renewal").await?;
    Ok(())
}

impl ResourceLock for LeaseLock {
    async fn lock(&self) -> Result<(), LockError> {
        self.acquire().await.map(|_| ()).map_err(lock_error)
    }

    async fn unlock(&self) -> Result<(), LockError> {
        self.release().await.map_err(lock_error)
    }
}

fn lock_error(error: LeaseError) -> LockError {
    LockError { message: error.to_string(), source: Some(Box::new(error)) }
}

/// What leader election uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectionConfig {
    pub name: String,
    pub namespace: String,
    /// This replica's holder identity: unique per replica ([`replica_identity`]).
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl ElectionConfig {
    pub fn new(identity: impl Into<String>) -> Self {
        Self {
            name: LEADER_ELECTION_NAME.into(),
            namespace: LEADER_ELECTION_NAMESPACE.into(),
            identity: identity.into(),
            lease_duration: LEADER_ELECTION_LEASE_DURATION,
            renew_deadline: LEADER_ELECTION_RENEW_DEADLINE,
            retry_period: LEADER_ELECTION_RETRY_PERIOD,
        }
    }

    /// client-go's rules: the deadline leaves the lease time to expire after a leader stopped
    /// (deadline < duration), and several retries fit in the deadline (retry < deadline).
    pub fn validate(&self) -> Result<(), LeaseError> {
        if self.identity.is_empty() {
            return Err(LeaseError::Settings("the leader-election identity is empty"));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(LeaseError::Settings(
                "the leader-election renew deadline must be shorter than its lease duration",
            ));
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return Err(LeaseError::Settings(
                "the leader-election retry period must be positive and shorter than its renew deadline",
            ));
        }
        Ok(())
    }
}

/// A per-replica holder identity: `base` when given (an operator's unique name), else the pod's
/// or host's name (`POD_NAME`, `HOSTNAME`) with a random suffix, as client-go's `hostname_uuid`,
/// so two processes on one host (or a restarted pod) never share an identity.
pub fn replica_identity(base: Option<&str>, env: impl Fn(&str) -> Option<String>) -> String {
    if let Some(base) = base.filter(|b| !b.is_empty()) {
        return base.to_owned();
    }
    let host =
        env("POD_NAME").or_else(|| env("HOSTNAME")).filter(|h| !h.is_empty()).unwrap_or_else(|| "clb-host".into());
    format!("{host}_{:016x}", random_u64())
}

/// 64 random bits from the standard library's per-process random hash keys (no RNG dependency).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher
        .write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// Whether this replica may write now. Cheap to clone and to ask.
#[derive(Clone, Debug)]
pub struct Leadership(Inner);

#[derive(Clone, Debug)]
enum Inner {
    Unconditional,
    /// Leader until the instant inside, if any.
    Elected(watch::Receiver<Option<Instant>>),
}

impl Leadership {
    /// No election: always allowed to write (one replica).
    pub fn unconditional() -> Self {
        Self(Inner::Unconditional)
    }

    /// True while this replica is the leader and its last renewal is within the renew deadline.
    pub fn holds(&self) -> bool {
        match &self.0 {
            Inner::Unconditional => true,
            Inner::Elected(until) => until.borrow().is_some_and(|until| Instant::now() < until),
        }
    }
}

/// Leader election for one replica; see the module documentation.
pub struct Elector {
    lease: LeaseObject,
    config: ElectionConfig,
    /// The record last seen, and when this replica first saw it (its own clock).
    observed: Option<(String, Instant)>,
    until: watch::Sender<Option<Instant>>,
    stats: Arc<LeaseStats>,
}

impl Elector {
    pub fn new(client: kube::Client, config: ElectionConfig) -> Result<Self, LeaseError> {
        config.validate()?;
        Ok(Self {
            lease: LeaseObject::new(client, &config.namespace, &config.name),
            config,
            observed: None,
            until: watch::Sender::new(None),
            stats: Arc::default(),
        })
    }

    pub fn config(&self) -> &ElectionConfig {
        &self.config
    }

    pub fn stats(&self) -> &LeaseStats {
        &self.stats
    }

    /// Counts into `stats` (for `/metrics`).
    pub fn counting_into(mut self, stats: Arc<LeaseStats>) -> Self {
        self.stats = stats;
        self
    }

    /// The view of this elector's leadership that writers check.
    pub fn leadership(&self) -> Leadership {
        Leadership(Inner::Elected(self.until.subscribe()))
    }

    /// One attempt to take or renew the Lease. On success this replica leads until the attempt's
    /// start plus the renew deadline (the answer may arrive late; the start is the safe side).
    pub async fn try_acquire_or_renew(&mut self) -> Result<(), LeaseError> {
        let started = Instant::now();
        let result = self.attempt(started).await;
        match &result {
            Ok(()) => {
                let was_leading = self.until.borrow().is_some();
                self.until.send_replace(Some(started + self.config.renew_deadline));
                let counter = if was_leading { &self.stats.renewed } else { &self.stats.acquired };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => self.stats.failed(error),
        }
        result
    }

    async fn attempt(&mut self, now: Instant) -> Result<(), LeaseError> {
        let stamp = MicroTime(Timestamp::now());
        let identity = self.config.identity.clone();
        let duration = seconds(self.config.lease_duration);
        let Some(mut lease) = self.lease.get().await? else {
            let spec = LeaseSpec {
                holder_identity: Some(identity),
                lease_duration_seconds: Some(duration),
                acquire_time: Some(stamp.clone()),
                renew_time: Some(stamp),
                lease_transitions: Some(0),
                ..Default::default()
            };
            let created = self.lease.create(spec, None).await?;
            self.observed = created.metadata.resource_version.map(|v| (v, now));
            return Ok(());
        };
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let seen_at = match &self.observed {
            Some((seen, at)) if *seen == version => *at,
            _ => now,
        };
        self.observed = Some((version, seen_at));
        let holder = holder_of(&lease).to_owned();
        let ours = holder == identity;
        let spec = lease.spec.get_or_insert_with(Default::default);
        let their_duration = spec
            .lease_duration_seconds
            .map_or(self.config.lease_duration, |s| Duration::from_secs(u64::try_from(s).unwrap_or(0)));
        if !holder.is_empty() && !ours && now < seen_at + their_duration {
            return Err(LeaseError::HeldByOther {
                namespace: self.lease.namespace.clone(),
                name: self.lease.name.clone(),
                until: Timestamp::now()
                    .checked_add(SignedDuration::try_from((seen_at + their_duration) - now).unwrap_or_default())
                    .unwrap_or(Timestamp::MAX),
                holder,
            });
        }
        if !ours {
            spec.acquire_time = Some(stamp.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        spec.holder_identity = Some(identity);
        spec.lease_duration_seconds = Some(duration);
        spec.renew_time = Some(stamp);
        let written = self.lease.replace(&lease, if ours { "renewal" } else { "takeover" }).await?;
        self.observed = written.metadata.resource_version.map(|v| (v, now));
        Ok(())
    }

    /// Waits until this replica leads (retrying every retry period), or `None` if `shutdown`
    /// completes first.
    async fn campaign(&mut self, shutdown: &mut (impl Future<Output = ()> + Unpin)) -> Option<()> {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(()) => {
                    tracing::info!(
                        identity = %self.config.identity,
                        lease = %format!("{}/{}", self.config.namespace, self.config.name),
                        "became the leader"
                    );
                    return Some(());
                }
                Err(LeaseError::HeldByOther { holder, .. }) => {
                    tracing::debug!(leader = %holder, "standing by: another replica leads");
                }
                Err(error) => {
                    tracing::info!(error = %clb_sandbox::error_text::error_chain(&error), "standing by: the leader Lease was not taken");
                }
            }
            tokio::select! {
                () = &mut *shutdown => return None,
                () = tokio::time::sleep(self.config.retry_period) => {}
            }
        }
    }

    /// Renews every retry period while leading; completes when leadership is lost (the renew
    /// deadline passed without a successful renewal, or another holder took the Lease).
    async fn hold(&mut self) {
        loop {
            let Some(until) = *self.until.borrow() else { return };
            let retry = Instant::now() + self.config.retry_period;
            if until <= Instant::now() {
                return;
            }
            tokio::time::sleep_until(retry.min(until).into()).await;
            if Instant::now() >= until {
                return;
            }
            let attempt = tokio::time::timeout_at(until.into(), self.try_acquire_or_renew()).await;
            match attempt {
                Ok(Ok(())) => {}
                Ok(Err(error @ LeaseError::HeldByOther { .. })) => {
                    tracing::error!(error = %error, "leadership taken over by another replica");
                    return;
                }
                Ok(Err(error)) => tracing::warn!(
                    error = %clb_sandbox::error_text::error_chain(&error),
                    "leader renewal failed; retrying until the renew deadline"
                ),
                Err(_) => return,
            }
        }
    }

    fn step_down(&mut self) {
        self.until.send_replace(None);
    }

    /// Gives the Lease up so a standby takes over at once: no holder, a one-second duration.
    pub async fn release(&mut self) -> Result<(), LeaseError> {
        self.step_down();
        let Some(mut lease) = self.lease.get().await? else { return Ok(()) };
        if holder_of(&lease) != self.config.identity {
            return Ok(());
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(Timestamp::now()));
        }
        self.lease.replace(&lease, "release").await?;
        self.stats.released.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Runs `work` during every term this replica leads, until `shutdown` completes while standing
/// by, or a term's `work` ends while still leading (the Lease is released and its result
/// returned).
///
/// `work` gets the term's [`Leadership`] and must check it before every write. It must also see
/// the shutdown itself (pass it a clone of a shared `shutdown`) and end with `Ok`: a term is not
/// cut short by the shutdown here, so that it can let its running writes finish within its own
/// grace period before the Lease is released. When leadership is lost, its future is dropped at
/// once — whatever it was doing — and the replica stands by for the next term, which calls
/// `work` afresh. An error from `work` after leadership was already lost counts as the loss,
/// not as a failure.
pub async fn lead<E>(
    elector: &mut Elector,
    shutdown: impl Future<Output = ()>,
    mut work: impl AsyncFnMut(Leadership) -> Result<(), E>,
) -> Result<(), E> {
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        if elector.campaign(&mut shutdown).await.is_none() {
            return Ok(());
        }
        let leadership = elector.leadership();
        let outcome = {
            let term = work(leadership.clone());
            let mut term = std::pin::pin!(term);
            // `hold` borrows the elector mutably; `term` only through its own Leadership.
            let hold = elector.hold();
            tokio::select! {
                biased;
                () = hold => None,
                result = &mut term => {
                    if leadership.holds() { Some(result) } else { None }
                }
            }
        };
        match outcome {
            Some(result) => {
                if let Err(error) = elector.release().await {
                    elector.stats.release_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        error = %clb_sandbox::error_text::error_chain(&error),
                        "releasing the leader Lease failed; a standby takes over when it expires"
                    );
                }
                return result;
            }
            None => {
                elector.step_down();
                elector.stats.lost.fetch_add(1, Ordering::Relaxed);
                tracing::error!(identity = %elector.config.identity, "lost leadership: stopped writing; standing by");
            }
        }
    }
}

#[cfg(test)]
mod tests;
