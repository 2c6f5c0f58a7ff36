//! [`ArmClient`]: [`AzureApi`] over HTTP, against real ARM or the emulator.
//!
//! Answers are read the ARM way: 200/201/204 are success unless a 200/201 body carries an
//! `error` object (real NRP answers `updateServices` with a synchronous 200 that may do so);
//! 201/202 with an `Azure-AsyncOperation` (or `Location`) header are polled, honouring
//! `Retry-After`, until the operation ends or [`ArmConfig::operation_timeout`] passes. Every
//! other answer is an [`AzureError`] with the status, the ARM code and `Retry-After`.
//!
//! Every answer's `x-ms-ratelimit-remaining-subscription-writes`, success or error, polls
//! included, is kept: the latest one received is what
//! [`AzureApi::take_arm_remaining_writes`] and [`AzureApi::last_arm_remaining_writes`] report.

pub mod auth;

pub use auth::Credential;

use clb_azure::wire::{self, AsyncOperationStatus, ErrorEnvelope, Page};
use clb_azure::*;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use std::time::Duration;
use std::time::Instant;

pub const DEFAULT_BASE_URL: &str = "https://management.azure.com";
/// The api-version of `Microsoft.Network/serviceGateways` (armnetwork v9).
pub const SERVICE_GATEWAY_API_VERSION: &str = "2025-05-01";
/// The api-version of public IPs, load balancers and backend pools.
pub const NETWORK_API_VERSION: &str = "2024-05-01";
/// A list that pages on past this many pages is taken as a server loop.
const MAX_PAGES: usize = 10_000;

/// [`ArmConfig::request_timeout`] by default (`--arm-request-timeout`).
pub const DEFAULT_ARM_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// [`ArmConfig::nrp_request_timeout`] by default (`--nrp-request-timeout`): NRP answers in
/// well under a second when healthy.
pub const DEFAULT_NRP_REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// How the client reaches ARM.
#[derive(Clone, Debug)]
pub struct ArmConfig {
    pub base_url: String,
    pub scope: Scope,
    pub service_gateway_api_version: String,
    pub network_api_version: String,
    /// The longest one HTTP request to ARM (public IPs, load balancers, backend pools: connect,
    /// send, read the answer) may take.
    pub request_timeout: Duration,
    /// The same for NRP (the ServiceGateway's services and address locations), whose calls every
    /// Service's endpoints wait for: shorter, so that one hung call holds them less long.
    pub nrp_request_timeout: Duration,
    /// The longest polling of an asynchronous operation may take, all polls together.
    pub operation_timeout: Duration,
    /// The wait between polls when the server gives no `Retry-After`.
    pub poll_interval: Duration,
}

impl ArmConfig {
    pub fn new(base_url: impl Into<String>, scope: Scope) -> Self {
        Self {
            base_url: base_url.into(),
            scope,
            service_gateway_api_version: SERVICE_GATEWAY_API_VERSION.to_owned(),
            network_api_version: NETWORK_API_VERSION.to_owned(),
            request_timeout: DEFAULT_ARM_REQUEST_TIMEOUT,
            nrp_request_timeout: DEFAULT_NRP_REQUEST_TIMEOUT,
            operation_timeout: Duration::from_secs(5 * 60),
            poll_interval: Duration::from_secs(5),
        }
    }
}

/// The ARM client. Cheap to share by reference; holds one connection pool.
pub struct ArmClient {
    config: ArmConfig,
    base: reqwest::Url,
    credential: Credential,
    http: reqwest::Client,
    /// ARM's remaining-writes figure as the answers reported it; shared by concurrent calls,
    /// so it is the latest answer received, whichever call it ended.
    remaining_writes: std::sync::Mutex<RemainingWrites>,
}

#[derive(Default)]
struct RemainingWrites {
    latest: Option<u32>,
    untaken: Option<u32>,
}

/// A successful answer, after any polling.
struct Answer {
    headers: HeaderMap,
    /// The final body: the initial one for a synchronous answer, else the `Location` poll's last
    /// one or, for a PUT, the resource read back; empty after a polled POST.
    body: Vec<u8>,
}

impl ArmClient {
    pub fn new(config: ArmConfig, credential: Credential) -> Result<Self, AzureError> {
        let invalid = |message: String| AzureError::new(Operation::ListServices, ErrorKind::Invalid, message);
        let base = reqwest::Url::parse(&config.base_url)
            .map_err(|e| invalid(format!("the base URL {:?} is not a URL: {e}", config.base_url)))?;
        if base.cannot_be_a_base() || !matches!(base.scheme(), "http" | "https") {
            return Err(invalid(format!("the base URL {:?} is not an http(s) URL", config.base_url)));
        }
        // ARM and NRP requests set their own timeout (by operation); this one bounds the rest
        // (the token requests of a workload identity).
        let http = reqwest::Client::builder()
            .timeout(config.request_timeout.max(config.nrp_request_timeout))
            .build()
            .map_err(|e| invalid(format!("the HTTP client cannot be built: {e}")).with_source(e))?;
        Ok(Self { config, base, credential, http, remaining_writes: Default::default() })
    }

    fn remaining_writes(&self) -> std::sync::MutexGuard<'_, RemainingWrites> {
        // Two plain fields: a panic elsewhere cannot leave them half-written.
        self.remaining_writes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps the answer's remaining-writes figure, if it carries a readable one.
    fn note_remaining_writes(&self, op: Operation, headers: &HeaderMap) {
        let Some(value) = headers.get(REMAINING_WRITES_HEADER) else { return };
        match value.to_str().ok().and_then(|v| v.trim().parse::<u32>().ok()) {
            Some(remaining) => {
                let mut figures = self.remaining_writes();
                figures.latest = Some(remaining);
                figures.untaken = Some(remaining);
            }
            None => tracing::debug!("{op}: ignoring the malformed {REMAINING_WRITES_HEADER} value {value:?}"),
        }
    }

    pub fn config(&self) -> &ArmConfig {
        &self.config
    }

    fn url(
        &self,
        op: Operation,
        resource_path: &str,
        extra: &[&str],
        api_version: &str,
    ) -> Result<reqwest::Url, AzureError> {
        let mut url = self.base.clone();
        {
            let mut segments = url
                .path_segments_mut()
                .map_err(|()| AzureError::new(op, ErrorKind::Invalid, "the base URL cannot take a path"))?;
            segments.pop_if_empty();
            for segment in resource_path.split('/').filter(|s| !s.is_empty()) {
                segments.push(segment);
            }
            for segment in extra {
                // A name with a slash would address another resource.
                if segment.is_empty() || segment.contains('/') {
                    return Err(AzureError::new(op, ErrorKind::Invalid, format!("{segment:?} is not a resource name")));
                }
                segments.push(segment);
            }
        }
        url.query_pairs_mut().append_pair("api-version", api_version);
        Ok(url)
    }

    fn gateway_url(&self, op: Operation, action: &str) -> Result<reqwest::Url, AzureError> {
        let api = &self.config.service_gateway_api_version;
        self.url(op, &self.config.scope.service_gateway_id(), &[action], api)
    }

    fn network_url(&self, op: Operation, names: &[&str]) -> Result<reqwest::Url, AzureError> {
        let scope = &self.config.scope;
        let rg = format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Network",
            scope.subscription, scope.resource_group
        );
        self.url(op, &rg, names, &self.config.network_api_version)
    }

    async fn send_once(
        &self,
        op: Operation,
        method: Method,
        url: reqwest::Url,
        body: Option<Vec<u8>>,
        if_match: Option<&ETag>,
    ) -> Result<(StatusCode, HeaderMap, Vec<u8>), AzureError> {
        let token = self
            .credential
            .token(&self.http)
            .await
            .map_err(|e| AzureError::new(op, ErrorKind::Auth, e.to_string()).with_source(e))?;
        let timeout = if op.is_nrp() { self.config.nrp_request_timeout } else { self.config.request_timeout };
        let mut request = self.http.request(method, url).timeout(timeout);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(etag) = if_match {
            request = request.header(reqwest::header::IF_MATCH, &etag.0);
        }
        if let Some(body) = body {
            request = request.header(reqwest::header::CONTENT_TYPE, "application/json").body(body);
        }
        let response = request.send().await.map_err(|e| transport_error(op, e))?;
        let status = response.status();
        let headers = response.headers().clone();
        self.note_remaining_writes(op, &headers);
        let body = response.bytes().await.map_err(|e| transport_error(op, e))?;
        Ok((status, headers, body.to_vec()))
    }

    /// One call, with polling; any failure becomes an [`AzureError`].
    async fn call(
        &self,
        op: Operation,
        method: Method,
        url: reqwest::Url,
        body: Option<Vec<u8>>,
        if_match: Option<&ETag>,
    ) -> Result<Answer, AzureError> {
        let reads_back = matches!(method, Method::PUT | Method::GET);
        let (status, headers, body) = self.send_once(op, method, url.clone(), body, if_match).await?;
        if !status.is_success() {
            return Err(error_answer(op, status, &headers, &body));
        }
        if matches!(status, StatusCode::CREATED | StatusCode::ACCEPTED)
            && let Some((monitor, via_async_header)) = monitor_url(&headers)
        {
            let answer = self.poll(op, &monitor, via_async_header, &headers).await?;
            if !(answer.body.is_empty() && reads_back) {
                return Ok(answer);
            }
            // ARM's rule for a PUT (or a GET) that ended through a status monitor: the
            // resource itself is the result.
            let (status, headers, body) = self.send_once(op, Method::GET, url, None, None).await?;
            if !status.is_success() {
                return Err(error_answer(op, status, &headers, &body));
            }
            return Ok(Answer { headers, body });
        }
        check_error_body(op, status, &body)?;
        Ok(Answer { headers, body })
    }

    async fn poll(
        &self,
        op: Operation,
        monitor: &str,
        via_async_header: bool,
        first: &HeaderMap,
    ) -> Result<Answer, AzureError> {
        let url = reqwest::Url::parse(monitor).map_err(|e| {
            AzureError::new(op, ErrorKind::Decode, format!("the operation URL {monitor:?} is not a URL: {e}"))
        })?;
        let deadline = Instant::now() + self.config.operation_timeout;
        let mut wait = retry_after(first).unwrap_or(self.config.poll_interval);
        loop {
            if Instant::now() + wait > deadline {
                return Err(AzureError::new(
                    op,
                    ErrorKind::Timeout,
                    format!("the operation did not end within {:?}", self.config.operation_timeout),
                ));
            }
            tokio::time::sleep(wait).await;
            let (status, headers, body) = self.send_once(op, Method::GET, url.clone(), None, None).await?;
            if !status.is_success() {
                let mut error = error_answer(op, status, &headers, &body);
                if !via_async_header {
                    // Through `Location`, a failed operation's end is an error answer.
                    error.kind = ErrorKind::AsyncFailed;
                }
                return Err(error);
            }
            wait = retry_after(&headers).unwrap_or(self.config.poll_interval);
            if !via_async_header {
                // `Location` polling: 202 while running, the final answer after.
                if status == StatusCode::ACCEPTED {
                    continue;
                }
                check_error_body(op, status, &body)?;
                return Ok(Answer { headers, body });
            }
            let state: AsyncOperationStatus = decode(op, &body)?;
            match state.status.to_ascii_lowercase().as_str() {
                "succeeded" => return Ok(Answer { headers, body: Vec::new() }),
                "failed" | "canceled" | "cancelled" => {
                    let error = state.error.unwrap_or_default();
                    let message = if error.message.is_empty() {
                        format!("the operation ended {}", state.status)
                    } else {
                        error.message
                    };
                    return Err(AzureError {
                        status: status.as_u16(),
                        code: error.code,
                        ..AzureError::new(op, ErrorKind::AsyncFailed, message)
                    });
                }
                _ => continue,
            }
        }
    }

    /// Follows `nextLink` to the end.
    async fn list<T: DeserializeOwned>(&self, op: Operation, first: reqwest::Url) -> Result<Vec<T>, AzureError> {
        let mut items = Vec::new();
        let mut next = Some(first);
        let mut pages = 0;
        while let Some(url) = next.take() {
            pages += 1;
            if pages > MAX_PAGES {
                return Err(AzureError::new(
                    op,
                    ErrorKind::Decode,
                    format!("the list did not end after {MAX_PAGES} pages"),
                ));
            }
            let answer = self.call(op, Method::GET, url, None, None).await?;
            let page: Page<T> = decode(op, &answer.body)?;
            items.extend(page.value);
            if let Some(link) = page.next_link.filter(|l| !l.is_empty()) {
                let url = reqwest::Url::parse(&link).map_err(|e| {
                    AzureError::new(op, ErrorKind::Decode, format!("nextLink {link:?} is not a URL: {e}"))
                })?;
                next = Some(url);
            }
        }
        Ok(items)
    }
}

fn transport_error(op: Operation, e: reqwest::Error) -> AzureError {
    let kind = if e.is_timeout() { ErrorKind::Timeout } else { ErrorKind::Transport };
    let message = if e.is_timeout() { "no answer within the request timeout".to_owned() } else { describe_chain(&e) };
    AzureError::new(op, kind, message).with_source(e)
}

fn describe_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The URL to poll and whether it is an `Azure-AsyncOperation` (status body) or a `Location`.
fn monitor_url(headers: &HeaderMap) -> Option<(String, bool)> {
    let header =
        |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).filter(|v| !v.is_empty()).map(str::to_owned);
    header("azure-asyncoperation").map(|u| (u, true)).or_else(|| header("location").map(|u| (u, false)))
}

/// `Retry-After` in seconds (ARM never sends the HTTP-date form).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(HeaderName::from_static("retry-after"))?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

fn error_answer(op: Operation, status: StatusCode, headers: &HeaderMap, body: &[u8]) -> AzureError {
    let envelope: ErrorEnvelope = serde_json::from_slice(body).unwrap_or_default();
    let message = if envelope.error.message.is_empty() {
        let text = String::from_utf8_lossy(body);
        let reason = status.canonical_reason().unwrap_or("error");
        if text.trim().is_empty() { reason.to_owned() } else { format!("{reason}: {}", text.trim()) }
    } else {
        envelope.error.message
    };
    AzureError::http(op, status.as_u16(), envelope.error.code, message).with_retry_after(retry_after(headers))
}

/// A 200 whose body carries `error` is a failure (real NRP answers so).
fn check_error_body(op: Operation, status: StatusCode, body: &[u8]) -> Result<(), AzureError> {
    if body.is_empty() {
        return Ok(());
    }
    #[derive(serde::Deserialize)]
    struct MaybeError {
        error: Option<serde_json::Value>,
    }
    let Ok(MaybeError { error: Some(error) }) = serde_json::from_slice::<MaybeError>(body) else {
        return Ok(());
    };
    if error.is_null() {
        return Ok(());
    }
    let error: wire::ErrorBody = serde_json::from_value(error).unwrap_or_default();
    let message = if error.message.is_empty() { "the answer carries an error".to_owned() } else { error.message };
    Err(AzureError::http(op, status.as_u16(), error.code, message))
}

fn decode<T: DeserializeOwned>(op: Operation, body: &[u8]) -> Result<T, AzureError> {
    serde_json::from_slice(body).map_err(|e| {
        let shown: String = String::from_utf8_lossy(body).chars().take(200).collect();
        AzureError::new(op, ErrorKind::Decode, format!("cannot decode the answer ({e}): {shown}")).with_source(e)
    })
}

fn encode(op: Operation, value: &impl serde::Serialize) -> Result<Vec<u8>, AzureError> {
    serde_json::to_vec(value)
        .map_err(|e| AzureError::new(op, ErrorKind::Invalid, format!("cannot encode the request: {e}")).with_source(e))
}

fn etag_of(op: Operation, headers: &HeaderMap, body_etag: Option<String>) -> Result<ETag, AzureError> {
    headers
        .get(reqwest::header::ETAG)
        .and_then(|v: &HeaderValue| v.to_str().ok())
        .map(str::to_owned)
        .or(body_etag)
        .map(ETag)
        .ok_or_else(|| AzureError::new(op, ErrorKind::Decode, "the answer has no ETag"))
}

impl AzureApi for ArmClient {
    fn take_arm_remaining_writes(&self) -> Option<u32> {
        self.remaining_writes().untaken.take()
    }

    fn last_arm_remaining_writes(&self) -> Option<u32> {
        self.remaining_writes().latest
    }

    async fn update_services(&self, action: UpdateAction, requests: &[ServiceRequest]) -> Result<(), AzureError> {
        let op = Operation::UpdateServices;
        let body = encode(op, &wire::update_services(&self.config.scope, action, requests))?;
        self.call(op, Method::POST, self.gateway_url(op, "updateServices")?, Some(body), None).await.map(drop)
    }

    async fn update_address_locations(
        &self,
        action: UpdateAction,
        locations: &[LocationUpdate],
    ) -> Result<(), AzureError> {
        let op = Operation::UpdateAddressLocations;
        let body = encode(op, &wire::update_address_locations(action, locations))?;
        self.call(op, Method::POST, self.gateway_url(op, "updateAddressLocations")?, Some(body), None).await.map(drop)
    }

    async fn list_services(&self) -> Result<Vec<ListedService>, AzureError> {
        let op = Operation::ListServices;
        let items: Vec<wire::GatewayService> = self.list(op, self.gateway_url(op, "services")?).await?;
        Ok(items.into_iter().map(wire::listed_service).collect())
    }

    async fn list_address_locations(&self) -> Result<Vec<ListedLocation>, AzureError> {
        let op = Operation::ListAddressLocations;
        let items: Vec<wire::AddressLocationResponse> =
            self.list(op, self.gateway_url(op, "addressLocations")?).await?;
        Ok(items.into_iter().map(wire::listed_location).collect())
    }

    async fn list_public_ips(&self) -> Result<Vec<ListedPublicIp>, AzureError> {
        let op = Operation::ListPublicIps;
        let items: Vec<serde_json::Value> = self.list(op, self.network_url(op, &["publicIPAddresses"])?).await?;
        Ok(items.into_iter().filter_map(wire::listed_public_ip).collect())
    }

    async fn list_load_balancers(&self) -> Result<Vec<ListedLoadBalancer>, AzureError> {
        let op = Operation::ListLoadBalancers;
        let items: Vec<serde_json::Value> = self.list(op, self.network_url(op, &["loadBalancers"])?).await?;
        let scope = &self.config.scope;
        Ok(items.into_iter().filter_map(|item| wire::listed_load_balancer(scope, item)).collect())
    }

    async fn put_public_ip(&self, spec: &PublicIpSpec) -> Result<String, AzureError> {
        let op = Operation::PutPublicIp;
        let url = self.network_url(op, &["publicIPAddresses", &spec.name])?;
        let body = encode(op, &wire::public_ip(&self.config.scope, spec))?;
        let answer = self.call(op, Method::PUT, url, Some(body), None).await?;
        let address = decode::<wire::PublicIpAddress>(op, &answer.body)?.properties.ip_address;
        address.filter(|a| !a.is_empty()).ok_or_else(|| {
            AzureError::new(op, ErrorKind::Decode, format!("public IP {} has no properties.ipAddress", spec.name))
        })
    }

    async fn delete_public_ip(&self, name: &str) -> Result<(), AzureError> {
        let op = Operation::DeletePublicIp;
        self.call(op, Method::DELETE, self.network_url(op, &["publicIPAddresses", name])?, None, None).await.map(drop)
    }

    async fn put_load_balancer(&self, spec: &LoadBalancerSpec) -> Result<(), AzureError> {
        let op = Operation::PutLoadBalancer;
        let body = encode(op, &wire::load_balancer(&self.config.scope, spec))?;
        let url = self.network_url(op, &["loadBalancers", &spec.name])?;
        self.call(op, Method::PUT, url, Some(body), None).await.map(drop)
    }

    async fn delete_load_balancer(&self, name: &str) -> Result<(), AzureError> {
        let op = Operation::DeleteLoadBalancer;
        self.call(op, Method::DELETE, self.network_url(op, &["loadBalancers", name])?, None, None).await.map(drop)
    }

    async fn list_nat_gateways(&self) -> Result<Vec<ListedNatGateway>, AzureError> {
        let op = Operation::ListNatGateways;
        let items: Vec<serde_json::Value> = self.list(op, self.network_url(op, &["natGateways"])?).await?;
        let scope = &self.config.scope;
        Ok(items.into_iter().filter_map(|item| wire::listed_nat_gateway(scope, item)).collect())
    }

    async fn put_nat_gateway(&self, spec: &NatGatewaySpec) -> Result<(), AzureError> {
        let op = Operation::PutNatGateway;
        let body = encode(op, &wire::nat_gateway(&self.config.scope, spec))?;
        let url = self.network_url(op, &["natGateways", &spec.name])?;
        self.call(op, Method::PUT, url, Some(body), None).await.map(drop)
    }

    async fn delete_nat_gateway(&self, name: &str) -> Result<(), AzureError> {
        let op = Operation::DeleteNatGateway;
        self.call(op, Method::DELETE, self.network_url(op, &["natGateways", name])?, None, None).await.map(drop)
    }

    async fn get_backend_pool(&self, pool: &PoolRef) -> Result<(BackendPool, ETag), AzureError> {
        let op = Operation::GetBackendPool;
        let url = self.network_url(op, &["loadBalancers", &pool.load_balancer, "backendAddressPools", &pool.pool])?;
        let answer = self.call(op, Method::GET, url, None, None).await?;
        let wire_pool: wire::BackendAddressPool = decode(op, &answer.body)?;
        let etag = etag_of(op, &answer.headers, wire_pool.etag.clone())?;
        Ok((wire::pool_content(wire_pool), etag))
    }

    async fn put_backend_pool(
        &self,
        pool: &PoolRef,
        content: &BackendPool,
        if_match: Option<&ETag>,
    ) -> Result<(), AzureError> {
        let op = Operation::PutBackendPool;
        let url = self.network_url(op, &["loadBalancers", &pool.load_balancer, "backendAddressPools", &pool.pool])?;
        let body = encode(op, &wire::backend_pool(&self.config.scope, pool, content))?;
        self.call(op, Method::PUT, url, Some(body), if_match).await.map(drop)
    }

    async fn delete_backend_pool(&self, pool: &PoolRef) -> Result<(), AzureError> {
        let op = Operation::DeleteBackendPool;
        let url = self.network_url(op, &["loadBalancers", &pool.load_balancer, "backendAddressPools", &pool.pool])?;
        self.call(op, Method::DELETE, url, None, None).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(REMAINING_WRITES_HEADER, HeaderValue::from_str(value).expect("a header value"));
        headers
    }

    #[test]
    fn a_malformed_remaining_writes_value_is_ignored_and_the_latest_good_one_is_kept() {
        let scope = clb_emulator::scope();
        let client = ArmClient::new(ArmConfig::new("http://127.0.0.1:1", scope), Credential::None).expect("builds");
        client.note_remaining_writes(Operation::PutPublicIp, &headers("42"));
        client.note_remaining_writes(Operation::PutPublicIp, &headers("many"));
        client.note_remaining_writes(Operation::ListServices, &HeaderMap::new());
        assert_eq!(client.take_arm_remaining_writes(), Some(42));
        assert_eq!(client.take_arm_remaining_writes(), None);
        client.note_remaining_writes(Operation::PutPublicIp, &headers("-1"));
        assert_eq!(client.last_arm_remaining_writes(), Some(42));
    }
}
