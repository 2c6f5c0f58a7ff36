//! Where new versions of the logic come from while `clb-host run` runs (docs/design.md §7): a file
//! (`--logic-file`), a ConfigMap key (`--logic-configmap NAMESPACE/NAME:KEY`) or an OCI reference
//! (`--logic-oci REF`), each watched, each optionally pinned by sha256 (`--logic-sha256`). The built-in logic (or `--component`) serves
//! from the start; a source's content is then offered as a swap, and so is every change of it.
//!
//! * **A file** is polled ([`FILE_POLL`]): when its modification time or size changes it is read,
//!   and when its sha256 differs from the last one offered, it is offered. Polling needs no
//!   dependency and works the same on every filesystem (a ConfigMap volume swaps a symlink).
//! * **An OCI reference** is resolved every `--logic-poll` (a `HEAD` of its manifest; a registry
//!   counts no pull for it) and, when the digest it names changes, the component is pulled at that
//!   digest ([`clb_oci::artifact::pull`]: capped, every digest checked) and offered.
//! * **A ConfigMap** is watched through the API server with a [`kube::runtime::watcher()`] on its
//!   name (it re-lists and backs off on errors). The key is read from `binaryData`, else from
//!   `data` as base64. A missing object or key is logged and waited out.
//!
//! * **Signatures.** When the sender takes only signed versions (`--logic-verify-key`,
//!   [`SwapSender::verifying`]), a file is offered with its detached signature `PATH.sig` (a
//!   change of either is a change), a ConfigMap key with the key `KEY.sig` beside it, and an OCI
//!   reference only once its registry holds a signature of the digest by the key (checked before
//!   the pull). The check of a detached signature is the sender's ([`Signed`]).
//!
//! The content may be gzip- or zstd-compressed (a ConfigMap holds 1 MiB): it is offered as it is
//! found, and [`SwapSender::swap`] decompresses it ([`clb_sandbox::compression`]) before the pin — the
//! sha256 of the decompressed component — is checked.
//!
//! Each source offers a given sha256 (of the content as found) once: a refused (or rolled back) version is not retried
//! until the content changes. A source never stops the running version: everything that goes
//! wrong — unreadable, missing, not base64, a registry down or lying, refused — is logged with
//! the source and recorded as a swap refused at its `source` (an Event, `clb_swaps_total`), once
//! per distinct problem, and the version serving keeps serving. The swap itself, the pin check and the records are [`crate::live::control`]'s.

use crate::live::control::{ControlError, SwapSender};
use crate::live::swap::{Sha256Pin, Signed, SwapResult};
use base64::Engine as _;
use clb_sandbox::error_text::error_chain;
use clb_sandbox::sha256_hex;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, watcher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How often a file source is looked at.
pub const FILE_POLL: Duration = Duration::from_secs(2);

/// Why a source could not give a component.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("`{0}` does not name a ConfigMap key as NAMESPACE/NAME:KEY")]
    BadConfigMapRef(String),
    #[error("{path}: cannot read the component")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("ConfigMap {configmap} has no key `{key}` in binaryData or data")]
    KeyMissing { configmap: String, key: String },
    #[error("ConfigMap {configmap}: data.{key} is not base64")]
    Base64 {
        configmap: String,
        key: String,
        #[source]
        source: base64::DecodeError,
    },
    #[error("ConfigMap {configmap} was deleted")]
    Deleted { configmap: String },
    #[error("watching ConfigMap {configmap}")]
    Watch {
        configmap: String,
        #[source]
        source: watcher::Error,
    },
    #[error("{reference}: no component from the registry")]
    Registry {
        reference: String,
        #[source]
        source: clb_oci::OciError,
    },
    #[error("{reference}: the artifact {digest} is not loaded")]
    Unverified {
        reference: String,
        digest: String,
        #[source]
        source: clb_oci::signature::SignatureError,
    },
}

impl SourceError {
    /// The refusal kind it is recorded with: `signature` for an artifact whose signature does not
    /// verify, `source` for everything else.
    fn kind(&self) -> &'static str {
        match self {
            SourceError::Unverified { .. } => crate::live::swap::REFUSED_SIGNATURE,
            _ => crate::live::swap::REFUSED_SOURCE,
        }
    }
}

/// A ConfigMap key holding a component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigMapKey {
    pub namespace: String,
    pub name: String,
    pub key: String,
}

impl ConfigMapKey {
    pub fn parse(text: &str) -> Result<Self, SourceError> {
        let bad = || SourceError::BadConfigMapRef(text.to_owned());
        let (object, key) = text.rsplit_once(':').filter(|(_, key)| !key.is_empty()).ok_or_else(bad)?;
        let (namespace, name) = clb_executor::records::namespaced(object).ok_or_else(bad)?;
        Ok(Self { namespace: namespace.into(), name: name.into(), key: key.into() })
    }

    fn object(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The component in `configmap`: `binaryData[key]`, else `data[key]` decoded from base64.
    pub fn component(&self, configmap: &ConfigMap) -> Result<Vec<u8>, SourceError> {
        if let Some(bytes) = configmap.binary_data.as_ref().and_then(|d| d.get(&self.key)) {
            return Ok(bytes.0.clone());
        }
        let text = configmap
            .data
            .as_ref()
            .and_then(|d| d.get(&self.key))
            .ok_or_else(|| SourceError::KeyMissing { configmap: self.object(), key: self.key.clone() })?;
        // `kubectl create configmap --from-literal` keeps line breaks a base64 tool wrapped in.
        let text: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        base64::engine::general_purpose::STANDARD.decode(text).map_err(|source| SourceError::Base64 {
            configmap: self.object(),
            key: self.key.clone(),
            source,
        })
    }

    /// The detached signature beside the component in `configmap`: the key `KEY.sig`, as text in
    /// `data` or bytes in `binaryData`.
    pub fn signature(&self, configmap: &ConfigMap) -> Signed {
        let name = format!("{}.sig", self.key);
        let text = configmap.data.as_ref().and_then(|d| d.get(&name)).map(|text| text.as_bytes());
        let bytes = configmap.binary_data.as_ref().and_then(|d| d.get(&name)).map(|bytes| bytes.0.as_slice());
        Signed::detached(text.or(bytes), format!("ConfigMap {} key {name}", self.object()))
    }
}

impl std::str::FromStr for ConfigMapKey {
    type Err = SourceError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl std::fmt::Display for ConfigMapKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}:{}", self.namespace, self.name, self.key)
    }
}

/// A component in an OCI registry: a tag, polled, or a digest.
#[derive(Clone)]
pub struct OciSource {
    pub reference: clb_oci::Reference,
    pub client: Arc<clb_oci::Client>,
    /// How often the reference is resolved.
    pub poll: Duration,
}

impl std::fmt::Debug for OciSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OciSource").field("reference", &self.reference).field("poll", &self.poll).finish()
    }
}

/// A watched source of the logic.
#[derive(Clone, Debug)]
pub enum LogicSource {
    File(PathBuf),
    ConfigMap(ConfigMapKey),
    Oci(OciSource),
}

impl LogicSource {
    /// How records and logs name it.
    pub fn origin(&self) -> String {
        match self {
            LogicSource::File(path) => format!("file {}", path.display()),
            LogicSource::ConfigMap(key) => format!("configmap {key}"),
            LogicSource::Oci(source) => format!("oci {}", source.reference),
        }
    }

    /// Watches the source and offers its content through `swaps` (to serve, or to run in shadow)
    /// until the run loop stops.
    /// A ConfigMap is watched through `client`; without one (`clb-host admission` with no
    /// Kubernetes configuration) it is not watched, and that is logged.
    pub async fn watch(self, client: Option<kube::Client>, pin: Option<Sha256Pin>, swaps: SwapSender, poll: Duration) {
        let origin = if swaps.is_shadow() { format!("shadow {}", self.origin()) } else { self.origin() };
        let mut offer = Offer { origin, pin, swaps, offered: None, last_problem: None };
        match (self, client) {
            (LogicSource::File(path), _) => watch_file(path, poll, &mut offer).await,
            (LogicSource::Oci(source), _) => watch_oci(source, &mut offer).await,
            (LogicSource::ConfigMap(key), Some(client)) => watch_configmap(client, key, &mut offer).await,
            (LogicSource::ConfigMap(key), None) => {
                return tracing::error!(configmap = %key, "no Kubernetes client: the ConfigMap is not watched");
            }
        }
        tracing::debug!(origin = %offer.origin, "the run loop stopped; no longer watching the logic source");
    }
}

/// Offers a source's content once per sha256, and reports its problems once per change.
struct Offer {
    origin: String,
    pin: Option<Sha256Pin>,
    swaps: SwapSender,
    offered: Option<String>,
    last_problem: Option<String>,
}

impl Offer {
    /// Offers `bytes` and what vouches for them, unless they were offered last with the same
    /// signature (a signature arriving after its component is a change). `Err` when the run loop
    /// is gone.
    async fn offer(&mut self, bytes: Vec<u8>, signed: Signed) -> Result<(), ControlError> {
        self.last_problem = None;
        let sha256 = sha256_hex(&bytes);
        let offered = match &signed {
            Signed::Detached { signature: Some(signature), .. } if self.swaps.verify_key().is_some() => {
                format!("{sha256} {signature}")
            }
            _ => sha256.clone(),
        };
        if self.offered.as_ref() == Some(&offered) {
            return Ok(());
        }
        self.offered = Some(offered);
        tracing::info!(origin = %self.origin, %sha256, "the logic source changed; offering its content");
        match self.swaps.swap(bytes, signed, self.pin.clone(), self.origin.clone()).await? {
            SwapResult::Refused { kind, .. } => {
                tracing::debug!(origin = %self.origin, %sha256, %kind, "not retried until the source changes")
            }
            other => tracing::debug!(origin = %self.origin, result = ?other, "swap done"),
        }
        Ok(())
    }

    /// Logs and records `error` unless it is the one reported last (a file stays missing, a
    /// registry down, for many polls).
    fn problem(&mut self, error: &SourceError) {
        let text = error_chain(error);
        if self.last_problem.as_ref() != Some(&text) {
            tracing::warn!(origin = %self.origin, error = %text, "the logic source gives no component; the running version keeps serving");
            self.swaps.source_failed(self.origin.clone(), error.kind(), text.clone());
            self.last_problem = Some(text);
        }
    }

    /// The source gives what it gave before: a later problem is reported even if it is the last.
    fn recovered(&mut self) {
        self.last_problem = None;
    }
}

/// What a file's metadata says of it: changed when either differs.
type Stamp = (Option<SystemTime>, u64);

async fn watch_file(path: PathBuf, poll: Duration, offer: &mut Offer) {
    let signature_path = detached_signature_path(&path);
    let signed = offer.swaps.verify_key().is_some();
    let mut seen: Option<(Stamp, Option<Stamp>)> = None;
    loop {
        let (read_path, read_signature) = (path.clone(), signature_path.clone());
        let known = seen;
        // Metadata first: the file (and its signature) is read only when it looks changed.
        let read = tokio::task::spawn_blocking(move || -> Result<Option<_>, std::io::Error> {
            let stamp = |path: &std::path::Path| {
                std::fs::metadata(path).map(|meta| -> Stamp { (meta.modified().ok(), meta.len()) })
            };
            let stamps = (stamp(&read_path)?, if signed { stamp(&read_signature).ok() } else { None });
            if known == Some(stamps) {
                return Ok(None);
            }
            let limit = clb_sandbox::compression::MAX_COMPONENT_BYTES as u64;
            let bytes = clb_sandbox::bounded::read(&read_path, limit).map_err(std::io::Error::other)?;
            // A signature that cannot be read is none: the version is refused, saying so.
            let signature =
                stamps.1.and_then(|_| clb_sandbox::bounded::read(&read_signature, MAX_SIGNATURE_BYTES).ok());
            Ok(Some((stamps, bytes, signature)))
        })
        .await;
        match read {
            Ok(Ok(Some((stamps, bytes, signature)))) => {
                seen = Some(stamps);
                let signed = Signed::detached(signature.as_deref(), signature_path.display().to_string());
                if offer.offer(bytes, signed).await.is_err() {
                    return;
                }
            }
            Ok(Ok(None)) => {}
            Ok(Err(source)) => {
                seen = None;
                offer.problem(&SourceError::Read { path: path.display().to_string(), source });
            }
            // The blocking task panicked or the runtime is shutting down.
            Err(_) => return,
        }
        tokio::time::sleep(poll).await;
    }
}

/// A detached signature is base64 of ~72 bytes; a file much larger is not one.
pub const MAX_SIGNATURE_BYTES: u64 = 4 << 10;

/// The detached signature in `path`, or none when it cannot be read (missing, too large): the
/// version is then refused as unsigned, saying where the signature was looked for.
pub fn read_detached_signature(path: &std::path::Path) -> Option<Vec<u8>> {
    clb_sandbox::bounded::read(path, MAX_SIGNATURE_BYTES).ok()
}

/// Where a file's detached signature is looked for: `PATH.sig`, as `cosign sign-blob
/// --output-signature` is told to write it.
pub fn detached_signature_path(path: &std::path::Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".sig");
    PathBuf::from(name)
}

async fn watch_oci(source: OciSource, offer: &mut Offer) {
    let mut pulled: Option<String> = None;
    loop {
        match pull_if_moved(&source, offer.swaps.verify_key(), pulled.as_deref()).await {
            Ok(Some((digest, bytes))) => {
                tracing::info!(origin = %offer.origin, %digest, "the reference names a new artifact; pulled");
                pulled = Some(digest);
                if offer.offer(bytes, Signed::InRegistry).await.is_err() {
                    return;
                }
            }
            Ok(None) => offer.recovered(),
            Err(error) => offer.problem(&error),
        }
        tokio::time::sleep(source.poll).await;
    }
}

/// The digest the reference names now and the component at it, unless it is `last`. Pulled at
/// the digest resolved, so that a tag moving between the two calls cannot mix two artifacts; with
/// a key, only once its signature verifies (an artifact signed after it was pushed is pulled at
/// the first poll that finds the signature).
async fn pull_if_moved(
    source: &OciSource,
    verify: Option<&clb_oci::signature::PublicKey>,
    last: Option<&str>,
) -> Result<Option<(String, Vec<u8>)>, SourceError> {
    let reference = source.reference.to_string();
    let registry = |source| SourceError::Registry { reference: reference.clone(), source };
    let digest = source.client.resolve(&source.reference).await.map_err(registry)?;
    if last == Some(digest.as_str()) {
        return Ok(None);
    }
    if let Some(key) = verify {
        clb_oci::signature::verify(&source.client, &source.reference, &digest, key).await.map_err(|error| {
            SourceError::Unverified { reference: reference.clone(), digest: digest.clone(), source: error }
        })?;
    }
    let cap = clb_sandbox::compression::MAX_COMPONENT_BYTES as u64;
    let pulled =
        clb_oci::artifact::pull(&source.client, &source.reference.at_digest(&digest), cap).await.map_err(registry)?;
    Ok(Some((pulled.digest, pulled.component)))
}

async fn watch_configmap(client: kube::Client, key: ConfigMapKey, offer: &mut Offer) {
    let api = Api::<ConfigMap>::namespaced(client, &key.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", key.name));
    let mut events = watcher(api, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        let found = match event {
            Ok(watcher::Event::Apply(configmap) | watcher::Event::InitApply(configmap)) => {
                key.component(&configmap).map(|bytes| (bytes, key.signature(&configmap)))
            }
            Ok(watcher::Event::Delete(_)) => Err(SourceError::Deleted { configmap: key.object() }),
            Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
            Err(source) => Err(SourceError::Watch { configmap: key.object(), source }),
        };
        match found {
            Ok((bytes, signed)) => {
                if offer.offer(bytes, signed).await.is_err() {
                    return;
                }
            }
            Err(error) => offer.problem(&error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn configmap_keys_parse_as_namespace_name_and_key_and_anything_else_is_refused() {
        let parsed = ConfigMapKey::parse("kube-system/clb-logic:logic.wasm").unwrap();
        assert_eq!(
            parsed,
            ConfigMapKey { namespace: "kube-system".into(), name: "clb-logic".into(), key: "logic.wasm".into() }
        );
        assert_eq!(parsed.to_string(), "kube-system/clb-logic:logic.wasm");
        for bad in ["clb-logic:logic.wasm", "kube-system/clb-logic", "/clb:k", "ns/:k", "ns/name:", "a/b/c:k"] {
            assert!(matches!(ConfigMapKey::parse(bad), Err(SourceError::BadConfigMapRef(_))), "{bad}");
        }
    }

    #[test]
    fn a_component_is_read_from_binary_data_first_then_from_base64_data() {
        let key = ConfigMapKey::parse("ns/cm:logic.wasm").unwrap();
        let mut configmap = ConfigMap::default();
        assert!(matches!(key.component(&configmap), Err(SourceError::KeyMissing { .. })));
        configmap.data = Some([("logic.wasm".to_owned(), "AGFz\nbQ==".to_owned())].into());
        assert_eq!(key.component(&configmap).unwrap(), b"\0asm");
        configmap.data = Some([("logic.wasm".to_owned(), "not base64!".to_owned())].into());
        assert!(matches!(key.component(&configmap), Err(SourceError::Base64 { .. })));
        configmap.binary_data = Some([("logic.wasm".to_owned(), ByteString(vec![1, 2, 3]))].into());
        assert_eq!(key.component(&configmap).unwrap(), vec![1, 2, 3]);
    }
}
