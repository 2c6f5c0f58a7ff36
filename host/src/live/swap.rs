//! The swap protocol's records: what a swap request or the supervisor did ([`SwapResult`]), as
//! `/status`, the metrics and the Events show it ([`SwapRecord`]), and the sha256 pin a version
//! must match ([`Sha256Pin`]). Plain data below every layer that handles swaps: the run loop's
//! [`crate::live::control`], the watched [`crate::live::sources`], the metrics registry and its endpoint.

use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::sha256_hex;
use clb_sandbox::supervisor::SwapReport;
use serde::{Deserialize, Serialize};

/// The Event reasons of swap results.
pub const REASON_SWAPPED: &str = "LogicSwapped";
pub const REASON_REFUSED: &str = "LogicSwapRefused";
pub const REASON_ROLLED_BACK: &str = "LogicRolledBack";
pub const REASON_ROLLBACK_FAILED: &str = "LogicRollbackFailed";
pub const REASON_SHADOW_STARTED: &str = "LogicShadowStarted";
pub const REASON_SHADOW_DIVERGED: &str = "LogicShadowDiverged";

/// The refusal kind of bytes that are compressed but give no component (corrupt, truncated, too
/// large decompressed, compressed twice): nothing was compiled.
pub const REFUSED_DECOMPRESS: &str = "decompress";

/// The refusal kind of a source that gave no component at all (a file unreadable, a ConfigMap
/// key missing, a registry down or serving what it should not): nothing was offered.
pub const REFUSED_SOURCE: &str = "source";

/// The refusal kind of an artifact whose signature by the operator's key does not verify (none
/// in the registry, or none by that key): nothing was pulled.
pub const REFUSED_SIGNATURE: &str = "signature";

/// What vouches for a version's bytes when the controller takes only signed versions
/// (`--logic-verify-key`): checked by [`crate::live::control::SwapSender::swap`] before anything
/// else, and ignored when no key is set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signed {
    /// A detached signature of the bytes as they came (compressed or not), as `cosign sign-blob`
    /// writes it (base64 of an ASN.1 DER ECDSA P-256 signature), found `beside` them (a file
    /// `PATH.sig`, a ConfigMap key `KEY.sig`, the `POST /swap` header); `None` when none is there.
    Detached { signature: Option<String>, beside: String },
    /// The source checked its digest's signature in the registry with the same key before it
    /// pulled the artifact ([`clb_oci::signature::verify`]).
    InRegistry,
}

impl Signed {
    /// The detached signature in `text` (a `.sig` file's bytes), or none; surrounding whitespace
    /// (a newline an editor added) is not part of it.
    pub fn detached(text: Option<&[u8]>, beside: impl Into<String>) -> Self {
        let signature = text.map(|text| String::from_utf8_lossy(text).trim().to_owned());
        Signed::Detached { signature, beside: beside.into() }
    }

    /// Why `bytes` are not taken under `key`, if they are not.
    pub fn refusal(&self, key: &clb_oci::signature::PublicKey, bytes: &[u8]) -> Option<String> {
        match self {
            Signed::InRegistry => None,
            Signed::Detached { signature: None, beside } => {
                Some(format!("no signature: {beside} holds none, and --logic-verify-key takes only signed versions"))
            }
            Signed::Detached { signature: Some(signature), beside } if !key.verifies(bytes, signature) => {
                Some(format!(
                    "the signature in {beside} does not verify with the key (a signature by another key, of other bytes, or not a signature)"
                ))
            }
            Signed::Detached { .. } => None,
        }
    }
}

/// Why a pin could not be read, or a component does not match it.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("`{0}` is not a sha256: 64 hex digits expected")]
    BadSha256(String),
    #[error("the sha256 of the component is {actual}, but {expected} is pinned")]
    DigestMismatch { expected: String, actual: String },
}

/// A sha256 pin: 64 lower-case hex digits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sha256Pin(String);

impl Sha256Pin {
    pub fn parse(text: &str) -> Result<Self, PinError> {
        let text = text.trim();
        if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(Self(text.to_ascii_lowercase()))
        } else {
            Err(PinError::BadSha256(text.to_owned()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `Ok` when `bytes` hash to the pin; their sha256 either way.
    pub fn check(&self, bytes: &[u8]) -> Result<String, PinError> {
        let actual = sha256_hex(bytes);
        if actual == self.0 { Ok(actual) } else { Err(PinError::DigestMismatch { expected: self.0.clone(), actual }) }
    }
}

impl std::str::FromStr for Sha256Pin {
    type Err = PinError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

/// What a swap request, or the supervisor on its own, did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "kebab-case", rename_all_fields = "camelCase")]
pub enum SwapResult {
    /// The new version serves, with the state moved into it.
    Accepted {
        from: String,
        to: String,
        sha256: String,
        state_from_version: u32,
        state_from_bytes: usize,
        state_to_version: u32,
        state_to_bytes: usize,
        state_move_ms: f64,
        /// How long inputs waited: the whole swap when the state moved on the loop; for a
        /// staged swap the switch alone, the state move (`state_move_ms`) having run beside
        /// serving.
        took_ms: f64,
        /// For a staged swap, the inputs delivered during its state move and replayed into the
        /// new version at the switch; absent when the state moved whole while inputs waited.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replayed_inputs: Option<usize>,
    },
    /// The bytes are the serving version: nothing to do.
    Unchanged { version: String, sha256: String },
    /// The new version judges at the door (`clb-host admission`, which holds no tracker: no
    /// state moved).
    Adopted { from: String, to: String, sha256: String },
    /// The running version keeps serving; `kind` is the supervisor's refusal kind, or `digest`.
    Refused { kind: String, reason: String, sha256: String },
    /// The supervisor rolled a swapped-in version back after repeated traps.
    RolledBack { from: String, to: String, reason: String },
    /// A rollback failed; `version` keeps serving.
    RollbackFailed { version: String, reason: String },
    /// A candidate runs in shadow beside the serving version (nothing was swapped).
    ShadowStarted {
        version: String,
        sha256: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        promote_after: Option<u64>,
    },
    /// The candidate in shadow answered an input differently from the serving version, for the
    /// first time.
    ShadowDiverged { version: String, sha256: String, kinds: Vec<String>, input: String },
}

impl SwapResult {
    /// Whether it is about a shadow rather than a swap (`/status`'s `lastSwap` leaves it out).
    pub fn is_shadow(&self) -> bool {
        matches!(self, SwapResult::ShadowStarted { .. } | SwapResult::ShadowDiverged { .. })
    }

    pub(crate) fn shadow_diverged(status: &clb_sandbox::supervisor::ShadowStatus) -> Self {
        let last = status.last_divergence.as_ref();
        SwapResult::ShadowDiverged {
            version: status.version.clone(),
            sha256: status.sha256.clone(),
            kinds: last.map(|d| d.kinds.clone()).unwrap_or_default(),
            input: last.map(|d| d.input.clone()).unwrap_or_default(),
        }
    }

    pub(crate) fn accepted(report: &SwapReport, sha256: String) -> Self {
        SwapResult::Accepted {
            from: report.from.clone(),
            to: report.to.clone(),
            sha256,
            state_from_version: report.state_from.0,
            state_from_bytes: report.state_from.1,
            state_to_version: report.state_to.0,
            state_to_bytes: report.state_to.1,
            state_move_ms: report.state_move.as_secs_f64() * 1e3,
            took_ms: report.took.as_secs_f64() * 1e3,
            replayed_inputs: report.replayed,
        }
    }

    /// The Event this result is reported with: reason, type, message; none for `unchanged`.
    pub fn event(&self, origin: &str) -> Option<(&'static str, wit::EventType, String)> {
        use wit::EventType::{Normal, Warning};
        Some(match self {
            SwapResult::Accepted {
                from,
                to,
                sha256,
                state_to_version,
                state_move_ms,
                took_ms,
                replayed_inputs,
                ..
            } => {
                let pause = match replayed_inputs {
                    Some(n) => format!(" beside serving; inputs waited {took_ms:.0} ms ({n} replayed)"),
                    None => String::new(),
                };
                (
                    REASON_SWAPPED,
                    Normal,
                    format!(
                        "logic swapped from {from} to {to} (sha256 {sha256}, from {origin}); state v{state_to_version} moved in {state_move_ms:.0} ms{pause}"
                    ),
                )
            }
            SwapResult::Refused { kind, reason, sha256 } if sha256.is_empty() => (
                REASON_REFUSED,
                Warning,
                format!("no version from {origin} ({kind}); the running version keeps serving: {reason}"),
            ),
            SwapResult::Refused { kind, reason, sha256 } => (
                REASON_REFUSED,
                Warning,
                format!(
                    "swap to sha256 {sha256} (from {origin}) refused ({kind}); the running version keeps serving: {reason}"
                ),
            ),
            SwapResult::RolledBack { from, to, reason } => {
                (REASON_ROLLED_BACK, Warning, format!("logic rolled back from {from} to {to}: {reason}"))
            }
            SwapResult::RollbackFailed { version, reason } => {
                (REASON_ROLLBACK_FAILED, Warning, format!("rolling back failed; {version} keeps serving: {reason}"))
            }
            SwapResult::ShadowStarted { version, sha256, promote_after } => {
                let promotion = match promote_after {
                    Some(n) => format!("; promoted after {n} inputs compared without a divergence"),
                    None => String::new(),
                };
                (
                    REASON_SHADOW_STARTED,
                    Normal,
                    format!(
                        "candidate {version} (sha256 {sha256}, from {origin}) runs in shadow: compared with the serving version on every input, nothing it asks for is carried out{promotion}"
                    ),
                )
            }
            SwapResult::ShadowDiverged { version, kinds, input, .. } => (
                REASON_SHADOW_DIVERGED,
                Warning,
                format!(
                    "candidate {version} in shadow (from {origin}) diverged from the serving version for the first time ({}) on {input}; see /status for the answers",
                    kinds.join(", ")
                ),
            ),
            SwapResult::Unchanged { .. } | SwapResult::Adopted { .. } => return None,
        })
    }
}

/// A swap result with where it came from and when, as `/status` and the Events show it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SwapRecord {
    /// RFC 3339, UTC.
    pub at: String,
    /// `file PATH`, `configmap NS/NAME:KEY`, `endpoint PEER`, or `supervisor` for rollbacks.
    pub origin: String,
    #[serde(flatten)]
    pub result: SwapResult,
}

impl SwapRecord {
    pub fn now(origin: impl Into<String>, result: SwapResult) -> Self {
        Self { at: k8s_openapi::jiff::Timestamp::now().to_string(), origin: origin.into(), result }
    }
}
