//! Components in OCI registries, the way the ecosystem ships wasm: [`reference`] parses where
//! one is, [`auth`] says who the controller is to the registry, [`client`] speaks the
//! distribution API's few calls a component needs, [`artifact`] lays a component out as the CNCF
//! wasm OCI artifact and reads one back, [`signature`] signs and verifies it as cosign does.
//!
//! Nothing here loads or trusts what it pulls: the bytes go to the sandbox's checks like a file's.
//! Every read is capped and every digest checked; every failure is an [`OciError`] naming the URL.

pub mod artifact;
pub mod auth;
pub mod client;
pub mod reference;
pub mod signature;

pub use artifact::{Description, Pulled};
pub use auth::Credentials;
pub use client::{Client, ClientOptions};
pub use reference::Reference;

/// Why a registry could not give or take a component.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("`{reference}` is not an image reference: {why}")]
    BadReference { reference: String, why: String },
    #[error("{path}: not registry credentials: {why}")]
    Credentials { path: String, why: String },
    #[error("{url}: the registry cannot be reached")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url}: the answer broke off (the body did not come whole within the request's time)")]
    Body {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url}: answered {status}: {body}")]
    Status { url: String, status: u16, body: String },
    #[error("{url}: unauthorized: {why}")]
    Unauthorized { url: String, why: String },
    #[error("{url}: more than {cap} bytes")]
    TooLarge { url: String, cap: u64 },
    #[error("{url}: served {actual}, not the {expected} asked")]
    DigestMismatch { url: String, expected: String, actual: String },
    #[error("{url}: {why}")]
    Protocol { url: String, why: String },
    #[error("{reference} is not a wasm component artifact: {why}")]
    NotAComponent { reference: String, why: String },
}
