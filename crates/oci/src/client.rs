//! The distribution API's few calls a component needs: resolve a tag, read a manifest and a blob
//! (size-capped, their digests checked), upload a blob and a manifest. Over HTTPS, or plain HTTP
//! for a loopback registry (as docker treats `localhost`) or a host the operator names insecure.
//!
//! Each request that comes back `401` is sent once more with what the challenge asks: HTTP Basic
//! with the registry's login, or a Bearer token fetched from the challenge's realm (with the login
//! when there is one, anonymously otherwise) and kept per registry and scope until refused.

use crate::OciError;
use crate::auth::{Challenge, Credentials};
use crate::reference::{Reference, is_sha256_digest};
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

/// The manifest media types this client asks for and writes.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// containerd's cap on a manifest: what a registry answers beyond it is not a manifest.
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// A token answer is a few kilobytes.
const MAX_TOKEN_BYTES: u64 = 1 << 20;

/// How the client reaches registries.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    pub credentials: Credentials,
    /// Hosts (`host[:port]`) spoken to over plain HTTP besides loopback ones.
    pub insecure: BTreeSet<String>,
    /// Each request's whole time, body included.
    pub timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self { credentials: Credentials::anonymous(), insecure: BTreeSet::new(), timeout: Duration::from_secs(30) }
    }
}

/// A manifest as the registry served it.
#[derive(Clone, Debug)]
pub struct Fetched {
    /// `sha256:…` of `bytes`, checked against what was asked and what the registry said.
    pub digest: String,
    pub media_type: String,
    pub bytes: Vec<u8>,
}

pub struct Client {
    http: reqwest::Client,
    options: ClientOptions,
    /// Bearer tokens by (registry, scope).
    tokens: Mutex<BTreeMap<(String, String), String>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Pull,
    Push,
}

impl Client {
    pub fn new(options: ClientOptions) -> Result<Self, OciError> {
        let http = reqwest::Client::builder()
            .timeout(options.timeout)
            .connect_timeout(options.timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("clb-host/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| OciError::Http { url: String::new(), source: e })?;
        Ok(Self { http, options, tokens: Mutex::new(BTreeMap::new()) })
    }

    fn base(&self, reference: &Reference) -> String {
        let host = reference.api_host();
        let scheme = if is_loopback(host) || self.options.insecure.contains(host) { "http" } else { "https" };
        format!("{scheme}://{host}/v2/{}", reference.repository)
    }

    /// The digest a tag (or digest) names now, by `HEAD` (a registry counts no pull for it);
    /// falls back to reading the manifest when the registry does not say.
    pub async fn resolve(&self, reference: &Reference) -> Result<String, OciError> {
        let url = format!("{}/manifests/{}", self.base(reference), reference.manifest_ref());
        let response = self.send(reference, Access::Pull, || self.http.head(&url).header("Accept", accept())).await?;
        let response = ok(response, &url).await?;
        match response.headers().get("docker-content-digest").and_then(|v| v.to_str().ok()) {
            Some(digest) if is_sha256_digest(digest) => {
                check_asked(reference, digest, &url)?;
                Ok(digest.to_owned())
            }
            _ => Ok(self.manifest(reference).await?.digest),
        }
    }

    /// The manifest `reference` names, its digest computed from its bytes.
    pub async fn manifest(&self, reference: &Reference) -> Result<Fetched, OciError> {
        let url = format!("{}/manifests/{}", self.base(reference), reference.manifest_ref());
        let response = self.send(reference, Access::Pull, || self.http.get(&url).header("Accept", accept())).await?;
        let response = ok(response, &url).await?;
        let media_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
        let said = response.headers().get("docker-content-digest").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let bytes = read_capped(response, MAX_MANIFEST_BYTES, &url).await?;
        let digest = sha256_digest(&bytes);
        check_asked(reference, &digest, &url)?;
        if let Some(said) = said.filter(|s| is_sha256_digest(s))
            && said != digest
        {
            return Err(OciError::DigestMismatch { url, expected: said, actual: digest });
        }
        Ok(Fetched { digest, media_type, bytes })
    }

    /// The blob `digest` of `reference`'s repository, at most `cap` bytes, its digest checked.
    pub async fn blob(&self, reference: &Reference, digest: &str, cap: u64) -> Result<Vec<u8>, OciError> {
        let url = format!("{}/blobs/{digest}", self.base(reference));
        let response = self.send(reference, Access::Pull, || self.http.get(&url)).await?;
        let response = ok(response, &url).await?;
        let bytes = read_capped(response, cap, &url).await?;
        let actual = sha256_digest(&bytes);
        if actual != digest {
            return Err(OciError::DigestMismatch { url, expected: digest.to_owned(), actual });
        }
        Ok(bytes)
    }

    /// Uploads `bytes` as a blob (monolithically), unless the repository has it; its digest.
    pub async fn push_blob(&self, reference: &Reference, bytes: &[u8]) -> Result<String, OciError> {
        let digest = sha256_digest(bytes);
        let base = self.base(reference);
        let head = format!("{base}/blobs/{digest}");
        if self.send(reference, Access::Push, || self.http.head(&head)).await?.status().is_success() {
            return Ok(digest);
        }
        let start = format!("{base}/blobs/uploads/");
        let response =
            self.send(reference, Access::Push, || self.http.post(&start).header("Content-Length", "0")).await?;
        let response = ok(response, &start).await?;
        let location = response
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| OciError::Protocol { url: start.clone(), why: "an upload began with no Location".into() })?;
        let mut upload = response.url().join(location).map_err(|e| OciError::Protocol {
            url: start.clone(),
            why: format!("the upload's Location `{location}` is not a URL: {e}"),
        })?;
        upload.query_pairs_mut().append_pair("digest", &digest);
        let upload = upload.to_string();
        let body = bytes.to_vec();
        let response = self
            .send(reference, Access::Push, || {
                self.http.put(&upload).header("Content-Type", "application/octet-stream").body(body.clone())
            })
            .await?;
        ok(response, &upload).await?;
        Ok(digest)
    }

    /// Puts `bytes` as the manifest at `tag_or_digest`; the manifest's digest.
    pub async fn push_manifest(
        &self,
        reference: &Reference,
        tag_or_digest: &str,
        media_type: &str,
        bytes: &[u8],
    ) -> Result<String, OciError> {
        let url = format!("{}/manifests/{tag_or_digest}", self.base(reference));
        let body = bytes.to_vec();
        let response = self
            .send(reference, Access::Push, || self.http.put(&url).header("Content-Type", media_type).body(body.clone()))
            .await?;
        ok(response, &url).await?;
        Ok(sha256_digest(bytes))
    }

    /// Sends the request `build` makes; on `401`, once more with what the challenge asks.
    async fn send(
        &self,
        reference: &Reference,
        access: Access,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, OciError> {
        let scope = format!(
            "repository:{}:{}",
            reference.repository,
            if access == Access::Push { "pull,push" } else { "pull" }
        );
        let key = (reference.registry.clone(), scope.clone());
        let cached = self.tokens.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
        let mut request = build();
        if let Some(token) = &cached {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(http_error)?;
        if response.status() != reqwest::StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        let url = response.url().to_string();
        let challenge = response
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .and_then(Challenge::parse)
            .ok_or_else(|| OciError::Unauthorized {
                url: url.clone(),
                why: "401 with no challenge this client answers".into(),
            })?;
        let login = self.options.credentials.login(&reference.registry);
        let authorization = match challenge {
            Challenge::Basic => {
                let login = login.ok_or_else(|| OciError::Unauthorized {
                    url: url.clone(),
                    why: format!(
                        "the registry asks for a login and the credentials have none for {}",
                        reference.registry
                    ),
                })?;
                login.basic_header()
            }
            Challenge::Bearer { realm, service, scope: asked } => {
                let token = self.token(&realm, service.as_deref(), asked.as_deref().unwrap_or(&scope), login).await?;
                self.tokens.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), token.clone());
                format!("Bearer {token}")
            }
        };
        let response = build().header("Authorization", authorization).send().await.map_err(http_error)?;
        if response.status() == reqwest::StatusCode::UNAUTHORIZED {
            self.tokens.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
            return Err(OciError::Unauthorized { url, why: "refused with the login or token it asked for".into() });
        }
        Ok(response)
    }

    /// A token from the realm a Bearer challenge names.
    async fn token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: &str,
        login: Option<&crate::auth::Login>,
    ) -> Result<String, OciError> {
        let mut url = reqwest::Url::parse(realm).map_err(|e| OciError::Protocol {
            url: realm.to_owned(),
            why: format!("the token realm is not a URL: {e}"),
        })?;
        if url.scheme() != "https" && !url.host_str().is_some_and(is_loopback) {
            let host = url.host_str().unwrap_or_default();
            let with_port = url.port().map_or_else(|| host.to_owned(), |p| format!("{host}:{p}"));
            if !self.options.insecure.contains(&with_port) && !self.options.insecure.contains(host) {
                return Err(OciError::Protocol {
                    url: realm.to_owned(),
                    why: "a token realm over plain HTTP that is neither loopback nor named insecure".into(),
                });
            }
        }
        {
            let mut query = url.query_pairs_mut();
            if let Some(service) = service {
                query.append_pair("service", service);
            }
            query.append_pair("scope", scope);
        }
        let url_text = url.to_string();
        let mut request = self.http.get(url);
        if let Some(login) = login {
            request = request.header("Authorization", login.basic_header());
        }
        let response = request.send().await.map_err(http_error)?;
        if response.status() == reqwest::StatusCode::UNAUTHORIZED || response.status() == reqwest::StatusCode::FORBIDDEN
        {
            return Err(OciError::Unauthorized {
                url: url_text,
                why: format!("the token service answered {}", response.status()),
            });
        }
        let response = ok(response, &url_text).await?;
        let bytes = read_capped(response, MAX_TOKEN_BYTES, &url_text).await?;
        let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| OciError::Protocol {
            url: url_text.clone(),
            why: format!("the token answer is not JSON: {e}"),
        })?;
        value
            .get("token")
            .or_else(|| value.get("access_token"))
            .and_then(|t| t.as_str())
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| OciError::Protocol { url: url_text, why: "the token answer has no `token`".into() })
    }
}

fn accept() -> String {
    format!("{OCI_MANIFEST}, {DOCKER_MANIFEST}")
}

fn http_error(error: reqwest::Error) -> OciError {
    let url = error.url().map(|u| u.to_string()).unwrap_or_default();
    OciError::Http { url, source: error }
}

/// The response when it is a success; else its status and the start of its body as the error.
async fn ok(response: reqwest::Response, url: &str) -> Result<reqwest::Response, OciError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = read_capped(response, 64 << 10, url).await.unwrap_or_default();
    let text: String = String::from_utf8_lossy(&body).chars().take(300).collect();
    Err(OciError::Status { url: url.to_owned(), status: status.as_u16(), body: text.trim().to_owned() })
}

/// The body, refused as soon as it passes `cap` (whatever Content-Length said).
async fn read_capped(mut response: reqwest::Response, cap: u64, url: &str) -> Result<Vec<u8>, OciError> {
    if let Some(length) = response.content_length()
        && length > cap
    {
        return Err(OciError::TooLarge { url: url.to_owned(), cap });
    }
    let mut bytes = Vec::new();
    // A body error carries no URL of its own.
    let broke_off = |source| OciError::Body { url: url.to_owned(), source };
    while let Some(chunk) = response.chunk().await.map_err(broke_off)? {
        if bytes.len() as u64 + chunk.len() as u64 > cap {
            return Err(OciError::TooLarge { url: url.to_owned(), cap });
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

fn check_asked(reference: &Reference, digest: &str, url: &str) -> Result<(), OciError> {
    match &reference.digest {
        Some(asked) if asked != digest => {
            Err(OciError::DigestMismatch { url: url.to_owned(), expected: asked.clone(), actual: digest.to_owned() })
        }
        _ => Ok(()),
    }
}

pub fn sha256_digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let mut out = String::with_capacity(71);
    out.push_str("sha256:");
    for byte in hash {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// `localhost`, `127.x.y.z` and `::1`, with or without a port.
pub fn is_loopback(host: &str) -> bool {
    if host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()) {
        return true;
    }
    let name = if let Some(v6) = host.strip_prefix('[') {
        v6.split(']').next().unwrap_or(v6)
    } else {
        host.rsplit_once(':').filter(|(_, port)| port.parse::<u16>().is_ok()).map_or(host, |(name, _)| name)
    };
    name == "localhost" || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_localhost_127_and_the_v6_loopback_with_or_without_a_port() {
        for host in ["localhost", "localhost:5000", "127.0.0.1:5000", "127.8.9.1", "[::1]:5000", "::1"] {
            assert!(is_loopback(host), "{host}");
        }
        for host in ["ghcr.io", "10.0.0.1:5000", "localhost.example.com", "[::2]:5000"] {
            assert!(!is_loopback(host), "{host}");
        }
    }
}
