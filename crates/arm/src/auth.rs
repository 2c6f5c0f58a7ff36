//! Where the ARM client's bearer token comes from.
//!
//! * [`Credential::TokenFile`]: a file holding the token, re-read whenever its modification time
//!   or size changes — something else (a sidecar, `az account get-access-token`) keeps it fresh.
//! * [`Credential::WorkloadIdentity`]: Azure workload identity. The projected service-account
//!   token (re-read on every exchange, because the kubelet rotates it) is exchanged at Entra ID
//!   for an ARM token, which is cached until [`REFRESH_MARGIN`] before it expires.
//! * [`Credential::None`]: no `Authorization` header, for the emulator.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// A token closer than this to its expiry is exchanged again, so that no request carries a
/// token that expires in flight.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);
/// The Entra ID authority when `AZURE_AUTHORITY_HOST` is not set.
pub const DEFAULT_AUTHORITY: &str = "https://login.microsoftonline.com/";
/// The scope of an ARM token.
pub const ARM_SCOPE: &str = "https://management.azure.com/.default";
const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// Why no token could be had.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("{}: cannot read the token file", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: the token file is empty", path.display())]
    Empty { path: PathBuf },
    #[error("workload identity needs the environment variable {0}")]
    MissingEnv(&'static str),
    #[error("the token exchange at {url} failed")]
    Exchange {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the token exchange at {url} was refused (HTTP {status}): {error}: {description}")]
    Refused { url: String, status: u16, error: String, description: String },
    #[error("the token exchange at {url} answered something that is not a token response")]
    Decode {
        url: String,
        #[source]
        source: serde_json::Error,
    },
}

/// A source of bearer tokens.
pub enum Credential {
    None,
    TokenFile(TokenFile),
    WorkloadIdentity(WorkloadIdentity),
}

impl Credential {
    /// The token to send, or `None` for no `Authorization` header.
    pub async fn token(&self, http: &reqwest::Client) -> Result<Option<String>, AuthError> {
        match self {
            Credential::None => Ok(None),
            Credential::TokenFile(file) => file.token().map(Some),
            Credential::WorkloadIdentity(wi) => wi.token(http).await.map(Some),
        }
    }
}

/// A token kept in a file by someone else.
pub struct TokenFile {
    path: PathBuf,
    cached: std::sync::Mutex<Option<(FileStamp, String)>>,
}

/// What tells that a file changed without reading it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
}

impl TokenFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into(), cached: std::sync::Mutex::new(None) }
    }

    pub fn token(&self) -> Result<String, AuthError> {
        let read_error = |source| AuthError::Read { path: self.path.clone(), source };
        let meta = std::fs::metadata(&self.path).map_err(read_error)?;
        let stamp = FileStamp { modified: meta.modified().ok(), len: meta.len() };
        let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((seen, token)) = cached.as_ref()
            && *seen == stamp
        {
            return Ok(token.clone());
        }
        let token = read_trimmed(&self.path)?;
        *cached = Some((stamp, token.clone()));
        Ok(token)
    }
}

/// The largest token file read: a JWT is a few kilobytes.
pub const MAX_TOKEN_BYTES: u64 = 64 << 10;

fn read_trimmed(path: &Path) -> Result<String, AuthError> {
    let error = |source| AuthError::Read { path: path.to_owned(), source };
    let bytes = clb_sandbox::bounded::read(path, MAX_TOKEN_BYTES).map_err(|e| error(std::io::Error::other(e)))?;
    let text = String::from_utf8(bytes).map_err(|e| error(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(AuthError::Empty { path: path.to_owned() });
    }
    Ok(token.to_owned())
}

/// Azure workload identity: a federated service-account token exchanged for an ARM token.
pub struct WorkloadIdentity {
    pub client_id: String,
    pub tenant_id: String,
    pub federated_token_file: PathBuf,
    /// `https://login.microsoftonline.com/` or a sovereign cloud's (or a test server).
    pub authority_host: String,
    pub scope: String,
    cached: tokio::sync::Mutex<Option<(Instant, String)>>,
}

#[derive(serde::Deserialize)]
struct TokenResponse {
    access_token: String,
    /// Seconds; Entra sends a number, some proxies a string.
    expires_in: NumberOrString,
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum NumberOrString {
    Number(u64),
    String(String),
}

#[derive(serde::Deserialize, Default)]
struct TokenErrorResponse {
    #[serde(default)]
    error: String,
    #[serde(default)]
    error_description: String,
}

impl WorkloadIdentity {
    pub fn new(client_id: String, tenant_id: String, federated_token_file: PathBuf, authority_host: String) -> Self {
        Self {
            client_id,
            tenant_id,
            federated_token_file,
            authority_host,
            scope: ARM_SCOPE.to_owned(),
            cached: tokio::sync::Mutex::new(None),
        }
    }

    /// From the variables the workload-identity webhook injects. `lookup` is `std::env::var`
    /// in production; tests pass their own.
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, AuthError> {
        let need = |name: &'static str| lookup(name).filter(|v| !v.is_empty()).ok_or(AuthError::MissingEnv(name));
        Ok(Self::new(
            need("AZURE_CLIENT_ID")?,
            need("AZURE_TENANT_ID")?,
            need("AZURE_FEDERATED_TOKEN_FILE")?.into(),
            lookup("AZURE_AUTHORITY_HOST").filter(|v| !v.is_empty()).unwrap_or_else(|| DEFAULT_AUTHORITY.to_owned()),
        ))
    }

    pub fn token_url(&self) -> String {
        format!("{}/{}/oauth2/v2.0/token", self.authority_host.trim_end_matches('/'), self.tenant_id)
    }

    pub async fn token(&self, http: &reqwest::Client) -> Result<String, AuthError> {
        // One exchange at a time: callers that queue behind it find the fresh token cached.
        let mut cached = self.cached.lock().await;
        if let Some((expires, token)) = cached.as_ref()
            && Instant::now() + REFRESH_MARGIN < *expires
        {
            return Ok(token.clone());
        }
        let assertion = read_trimmed(&self.federated_token_file)?;
        let url = self.token_url();
        let form = [
            ("grant_type", "client_credentials"),
            ("client_id", &self.client_id),
            ("client_assertion_type", JWT_BEARER),
            ("client_assertion", &assertion),
            ("scope", &self.scope),
        ];
        let started = Instant::now();
        let response = http
            .post(&url)
            .form(&form)
            .send()
            .await
            .map_err(|source| AuthError::Exchange { url: url.clone(), source })?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(|source| AuthError::Exchange { url: url.clone(), source })?;
        if !(200..300).contains(&status) {
            let refusal: TokenErrorResponse = serde_json::from_slice(&body).unwrap_or_default();
            return Err(AuthError::Refused {
                url,
                status,
                error: refusal.error,
                description: refusal.error_description,
            });
        }
        let answer: TokenResponse =
            serde_json::from_slice(&body).map_err(|source| AuthError::Decode { url: url.clone(), source })?;
        let lifetime = match answer.expires_in {
            NumberOrString::Number(n) => n,
            // An unparseable lifetime means "use once": the next call exchanges again.
            NumberOrString::String(s) => s.trim().parse().unwrap_or(0),
        };
        // Counted from before the request, so the cache never outlives the real token.
        *cached = Some((started + Duration::from_secs(lifetime), answer.access_token.clone()));
        Ok(answer.access_token)
    }
}
