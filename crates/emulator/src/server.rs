//! The emulator over HTTP/1.1: the ARM routes of docs/upstream.md §h.2, the operation-status URLs of 202
//! answers, an Entra ID token endpoint, and the control routes:
//!
//! * `GET /emulator/state` — [`EmulatorState`](super::EmulatorState) as JSON;
//! * `POST /emulator/faults` — add a [`Fault`] (or a list of them); `DELETE /emulator/faults` — clear them
//!   (calls they hung end without an answer);
//! * `POST /emulator/arm-spend` — `{"writes": N, "reads": M}`: another client of the
//!   subscription spends that many of ARM's tokens now (down to empty);
//! * `GET /emulator/operations/{id}` — the status of an asynchronous operation;
//! * `POST /{tenant}/oauth2/v2.0/token` — a client-credentials exchange with a JWT assertion.
//!
//! ARM's answers carry the remaining figure of the bucket they drew on
//! (`x-ms-ratelimit-remaining-subscription-writes` or `-reads`) when the emulator throttles; its
//! buckets refill by real time from the moment it is served.
//!
//! It is served with hyper directly rather than through a framework so that a `drop` fault can
//! close the connection without answering (hyper does so when the service fails).

use super::core::{Dispatch, Rejection, TokenExchange, bucket_of, default_code};
use super::faults::{AsyncOutcome, Fault};
use super::throttle::{Bucket, Clock, Figure};
use super::{Emulator, EmulatorError, location_names, service_names};
use clb_azure::wire::{self, ErrorBody, ErrorEnvelope, Page};
use clb_azure::{Operation, Scope};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::net::SocketAddr;
use std::sync::Arc;

/// What only the HTTP server asks of the emulator: real time, and a way to end hung calls.
impl Emulator {
    /// From now on the buckets refill by real time since this call (the HTTP server's clock).
    fn use_real_time(&self) {
        let mut state = self.lock();
        if matches!(state.clock, Clock::Virtual(_)) {
            state.clock = Clock::Real(std::time::Instant::now());
        }
    }

    /// Completes at the next [`Emulator::clear_faults`].
    fn faults_cleared(&self) -> impl std::future::Future<Output = ()> + use<> {
        let mut cleared = self.cleared.subscribe();
        async move {
            // The sender lives as long as the emulator; if it is gone, so is every caller.
            let _ = cleared.changed().await;
        }
    }
}

/// A running server; it stops (with every open connection) when dropped.
pub struct EmulatorServer {
    addr: SocketAddr,
    emulator: Arc<Emulator>,
    task: tokio::task::JoinHandle<()>,
}

impl EmulatorServer {
    /// Listens on `listen` (port 0: any free port) and serves on the current tokio runtime.
    pub async fn start(emulator: Arc<Emulator>, listen: SocketAddr) -> Result<Self, EmulatorError> {
        let bind_error = |source| EmulatorError::Bind { addr: listen, source };
        emulator.use_real_time();
        let listener = tokio::net::TcpListener::bind(listen).await.map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let task = tokio::spawn(accept_loop(listener, emulator.clone()));
        Ok(Self { addr, emulator, task })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`: the base URL for an `ArmClient` and the authority host for
    /// workload identity.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn emulator(&self) -> &Arc<Emulator> {
        &self.emulator
    }
}

impl Drop for EmulatorServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, emulator: Arc<Emulator>) {
    // Owned here so that aborting this task also ends every connection, hung ones included.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                tracing::warn!("emulator: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        while connections.try_join_next().is_some() {}
        let emulator = emulator.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| handle(emulator.clone(), request));
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(e) = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await {
                tracing::debug!("emulator: connection ended: {e}");
            }
        });
    }
}

/// The service's error: hyper closes the connection without an answer.
#[derive(Debug, thiserror::Error)]
#[error("injected fault: connection dropped")]
struct DropConnection;

enum Reply {
    Answer(Response<Full<Bytes>>),
    Hang,
    Drop,
}

/// The largest request body the emulator reads (ARM routes, faults, state): past it the
/// request is answered 413 without reading on, so a huge body costs no more memory than this.
/// Far above any request the host sends: an address-location batch of the 1,000-node benchmark
/// cluster is ~3 MB.
pub const MAX_REQUEST_BYTES: usize = 16 << 20;

async fn handle(emulator: Arc<Emulator>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, DropConnection> {
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, MAX_REQUEST_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            let message = format!("the request body is larger than {MAX_REQUEST_BYTES} bytes");
            return Ok(error_response(&reject(413, "RequestEntityTooLarge", message)));
        }
        Err(e) => {
            return Ok(error_response(&reject(400, "InvalidRequestFormat", format!("cannot read the body: {e}"))));
        }
    };
    let host = parts.headers.get(hyper::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
    let call = Call {
        method: parts.method.clone(),
        query: serde_urlencoded::from_str(parts.uri.query().unwrap_or("")).unwrap_or_default(),
        origin: format!("http://{host}"),
        path: parts.uri.path().to_owned(),
        bearer: parts
            .headers
            .get(hyper::header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::to_owned),
        if_match: parts.headers.get(hyper::header::IF_MATCH).and_then(|h| h.to_str().ok()).map(str::to_owned),
        body,
    };
    // Subscribed before routing, so that a clear racing with this call still ends its hang.
    let cleared = emulator.faults_cleared();
    match route(&emulator, &call) {
        Reply::Answer(response) => Ok(response),
        Reply::Hang => {
            cleared.await;
            Err(DropConnection)
        }
        Reply::Drop => Err(DropConnection),
    }
}

struct Call {
    method: Method,
    path: String,
    query: Vec<(String, String)>,
    origin: String,
    bearer: Option<String>,
    if_match: Option<String>,
    body: Bytes,
}

impl Call {
    fn query(&self, name: &str) -> Option<&str> {
        self.query.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

fn route(emulator: &Emulator, call: &Call) -> Reply {
    let segments: Vec<&str> = call.path.split('/').filter(|s| !s.is_empty()).collect();
    let is = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
    let answer = match (&call.method, segments.as_slice()) {
        (&Method::GET, ["emulator", "state"]) => json(200, &emulator.state()),
        (&Method::POST, ["emulator", "faults"]) => set_faults(emulator, &call.body),
        (&Method::POST, ["emulator", "arm-spend"]) => arm_spend(emulator, &call.body),
        (&Method::DELETE, ["emulator", "faults"]) => {
            emulator.clear_faults();
            json(200, &emulator.state().faults)
        }
        (&Method::GET, ["emulator", "operations", id]) => operation_status(emulator, id, call),
        (&Method::POST, [tenant, oauth, version, "token"]) if is(oauth, "oauth2") && is(version, "v2.0") => {
            exchange_token(emulator, tenant, &call.body)
        }
        (_, ["subscriptions", sub, rg_word, rg, providers, network, rest @ ..])
            if is(rg_word, "resourceGroups") && is(providers, "providers") && is(network, "Microsoft.Network") =>
        {
            let scope = emulator.scope();
            if !is(sub, &scope.subscription) || !is(rg, &scope.resource_group) {
                error_response(&reject(
                    404,
                    "ResourceGroupNotFound",
                    format!("resource group {sub}/{rg} is not emulated"),
                ))
            } else if call.query("api-version").is_none_or(str::is_empty) {
                error_response(&reject(
                    400,
                    "MissingApiVersionParameter",
                    "the api-version query parameter is required",
                ))
            } else {
                return arm(emulator, call, rest);
            }
        }
        _ => error_response(&reject(404, "NotFound", format!("no route for {} {}", call.method, call.path))),
    };
    Reply::Answer(answer)
}

/// The ARM routes below `…/providers/Microsoft.Network/`.
fn arm(emulator: &Emulator, call: &Call, rest: &[&str]) -> Reply {
    let is = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
    let scope = emulator.scope();
    let owned = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    match (&call.method, rest) {
        (_, [kind, gateway, ..]) if is(kind, "serviceGateways") && !is(gateway, &scope.service_gateway) => {
            Reply::Answer(error_response(&reject(
                404,
                "ResourceNotFound",
                format!("service gateway {gateway} was not found"),
            )))
        }
        (&Method::POST, [kind, _, action]) if is(kind, "serviceGateways") && is(action, "updateServices") => {
            let op = Operation::UpdateServices;
            with_body(emulator, call, op, |request: wire::UpdateServicesRequest| {
                serve(emulator, call, op, service_names(&request), |s, scope| s.update_services(scope, &request))
            })
        }
        (&Method::POST, [kind, _, action]) if is(kind, "serviceGateways") && is(action, "updateAddressLocations") => {
            let op = Operation::UpdateAddressLocations;
            with_body(emulator, call, op, |request: wire::UpdateAddressLocationsRequest| {
                serve(emulator, call, op, location_names(&request), |s, _| s.update_address_locations(&request))
            })
        }
        (&Method::GET, [kind, _, list]) if is(kind, "serviceGateways") && is(list, "services") => {
            let (skip, size) = paging(emulator, call);
            serve(emulator, call, Operation::ListServices, Vec::new(), |s, _| Ok(page(call, s.services(), skip, size)))
        }
        (&Method::GET, [kind, _, list]) if is(kind, "serviceGateways") && is(list, "addressLocations") => {
            let (skip, size) = paging(emulator, call);
            let upper = emulator.config().echo_ipv6_upper;
            serve(emulator, call, Operation::ListAddressLocations, Vec::new(), |s, _| {
                Ok(page(call, s.address_locations(upper), skip, size))
            })
        }
        (&Method::GET, [kind]) if is(kind, "publicIPAddresses") => {
            let (skip, size) = paging(emulator, call);
            serve(emulator, call, Operation::ListPublicIps, Vec::new(), |s, scope| {
                Ok(page(call, s.list_public_ips(scope), skip, size))
            })
        }
        (&Method::GET, [kind]) if is(kind, "loadBalancers") => {
            let (skip, size) = paging(emulator, call);
            serve(emulator, call, Operation::ListLoadBalancers, Vec::new(), |s, scope| {
                Ok(page(call, s.list_load_balancers(scope), skip, size))
            })
        }
        (&Method::GET, [kind]) if is(kind, "natGateways") => {
            let (skip, size) = paging(emulator, call);
            serve(emulator, call, Operation::ListNatGateways, Vec::new(), |s, scope| {
                Ok(page(call, s.list_nat_gateways(scope), skip, size))
            })
        }
        (method, [kind, name]) if is(kind, "natGateways") => match *method {
            Method::PUT => {
                let op = Operation::PutNatGateway;
                with_body(emulator, call, op, |body: wire::NatGateway| {
                    serve(emulator, call, op, owned(&[name]), |s, scope| s.put_nat_gateway(scope, name, &body))
                })
            }
            Method::DELETE => serve(emulator, call, Operation::DeleteNatGateway, owned(&[name]), |s, scope| {
                s.delete_nat_gateway(scope, name)
            }),
            Method::GET => read_only(emulator, "get-nat-gateway", name, |s, scope| s.read_nat_gateway(scope, name)),
            _ => Reply::Answer(method_not_allowed(call)),
        },
        (method, [kind, name]) if is(kind, "publicIPAddresses") => match *method {
            Method::PUT => {
                let op = Operation::PutPublicIp;
                with_body(emulator, call, op, |body: wire::PublicIpAddress| {
                    serve(emulator, call, op, owned(&[name]), |s, scope| s.put_public_ip(scope, name, &body))
                })
            }
            Method::DELETE => {
                serve(emulator, call, Operation::DeletePublicIp, owned(&[name]), |s, _| s.delete_public_ip(name))
            }
            Method::GET => read_only(emulator, "get-public-ip", name, |s, scope| s.read_public_ip(scope, name)),
            _ => Reply::Answer(method_not_allowed(call)),
        },
        (method, [kind, name]) if is(kind, "loadBalancers") => match *method {
            Method::PUT => {
                let op = Operation::PutLoadBalancer;
                with_body(emulator, call, op, |body: wire::LoadBalancer| {
                    serve(emulator, call, op, owned(&[name]), |s, scope| s.put_load_balancer(scope, name, &body))
                })
            }
            Method::DELETE => serve(emulator, call, Operation::DeleteLoadBalancer, owned(&[name]), |s, _| {
                s.delete_load_balancer(name)
            }),
            Method::GET => read_only(emulator, "get-load-balancer", name, |s, scope| s.read_load_balancer(scope, name)),
            _ => Reply::Answer(method_not_allowed(call)),
        },
        (method, [kind, lb, pools, pool]) if is(kind, "loadBalancers") && is(pools, "backendAddressPools") => {
            let names = vec![super::core::pool_key(lb, pool)];
            match *method {
                Method::GET => serve(emulator, call, Operation::GetBackendPool, names, |s, scope| {
                    s.get_backend_pool(scope, lb, pool)
                }),
                Method::PUT => {
                    let op = Operation::PutBackendPool;
                    let if_match = call.if_match.as_deref();
                    with_body(emulator, call, op, |body: wire::BackendAddressPool| {
                        serve(emulator, call, op, names, |s, scope| {
                            s.put_backend_pool(scope, lb, pool, &body, if_match)
                        })
                    })
                }
                Method::DELETE => {
                    serve(emulator, call, Operation::DeleteBackendPool, names, |s, _| s.delete_backend_pool(lb, pool))
                }
                _ => Reply::Answer(method_not_allowed(call)),
            }
        }
        _ => Reply::Answer(error_response(&reject(
            404,
            "NotFound",
            format!("no route for {} {}", call.method, call.path),
        ))),
    }
}

/// Decodes the JSON body, or answers 400 (logged under the operation).
fn with_body<T: DeserializeOwned>(
    emulator: &Emulator,
    call: &Call,
    op: Operation,
    then: impl FnOnce(T) -> Reply,
) -> Reply {
    match serde_json::from_slice(&call.body) {
        Ok(body) => then(body),
        Err(e) => {
            // An unreadable body still reached ARM, which throttles before it reads the body.
            let mut state = emulator.lock();
            let rejection = match state.arm_gate(bucket_of(op), op.name()) {
                Ok(()) => reject(400, "InvalidRequestFormat", format!("the body is not a valid {op} request: {e}")),
                Err(throttled) => throttled,
            };
            let outcome = throttled_text(&rejection, format!("{} {}", rejection.status, rejection.code));
            state.record(op.name(), &[], outcome, call.bearer.clone());
            let figure = state.answer_figure.take();
            Reply::Answer(with_figure(error_response(&rejection), figure))
        }
    }
}

/// The log's outcome text, marked when it is ARM's throttling.
fn throttled_text(rejection: &Rejection, text: String) -> String {
    if rejection.status == 429 && rejection.code == super::THROTTLED_CODE {
        format!("{text} (throttled)")
    } else {
        text
    }
}

/// The answer with the remaining figure of the bucket its call drew on, as ARM sends it.
fn with_figure(mut response: Response<Full<Bytes>>, figure: Option<Figure>) -> Response<Full<Bytes>> {
    if let Some(figure) = figure {
        response.headers_mut().insert(figure.bucket.header(), header_value(&figure.remaining.to_string()));
    }
    response
}

/// A call through the faults to the core; the answer as ARM would give it.
fn serve<T: Serialize>(
    emulator: &Emulator,
    call: &Call,
    op: Operation,
    resources: Vec<String>,
    apply: impl FnOnce(&mut super::core::State, &Scope) -> Result<T, Rejection>,
) -> Reply {
    let scope = emulator.scope();
    let (dispatch, figure, polled) = {
        let mut state = emulator.lock();
        let dispatch = state.dispatch(op, resources, call.bearer.clone(), |s| apply(s, scope));
        let polled = match &dispatch {
            Dispatch::Accepted { id } => state.operations.get(id).map(|o| (o.via_location, o.retry_after_secs)),
            _ => None,
        };
        (dispatch, state.answer_figure.take(), polled)
    };
    let reply = match dispatch {
        Dispatch::Done(Ok(value)) => {
            let value = serde_json::to_value(&value).unwrap_or(serde_json::Value::Null);
            let etag = value.get("etag").and_then(|e| e.as_str()).map(str::to_owned);
            let mut response = if value.is_null() { empty(200) } else { json(200, &value) };
            if let Some(etag) = etag {
                response.headers_mut().insert(hyper::header::ETAG, header_value(&etag));
            }
            Reply::Answer(response)
        }
        Dispatch::Done(Err(rejection)) => Reply::Answer(error_response(&rejection)),
        Dispatch::ErrorBody(error) => Reply::Answer(json(200, &ErrorEnvelope { error })),
        Dispatch::Hang => Reply::Hang,
        Dispatch::Drop => Reply::Drop,
        Dispatch::Accepted { id } => {
            let (via_location, retry_after_secs) = polled.expect("an accepted operation is recorded");
            let mut response = empty(202);
            let monitor = format!("{}/emulator/operations/{id}", call.origin);
            let header = if via_location { hyper::header::LOCATION.as_str() } else { "azure-asyncoperation" };
            let headers = response.headers_mut();
            headers.insert(header, header_value(&monitor));
            headers.insert(hyper::header::RETRY_AFTER, header_value(&retry_after_secs.to_string()));
            Reply::Answer(response)
        }
    };
    match reply {
        Reply::Answer(response) => Reply::Answer(with_figure(response, figure)),
        unanswered => unanswered,
    }
}

/// A GET that is not one of the faultable operations (what a client reads after an LRO).
fn read_only<T: Serialize>(
    emulator: &Emulator,
    name: &str,
    resource: &str,
    read: impl FnOnce(&super::core::State, &Scope) -> Result<T, Rejection>,
) -> Reply {
    let mut state = emulator.lock();
    let result = state.arm_gate(Bucket::Reads, name).and_then(|()| read(&state, emulator.scope()));
    let outcome = match &result {
        Ok(_) => "200".to_owned(),
        Err(r) => throttled_text(r, format!("{} {}", r.status, r.code)),
    };
    state.record(name, &[resource.to_owned()], outcome, None);
    let figure = state.answer_figure.take();
    let response = match result {
        Ok(value) => json(200, &value),
        Err(rejection) => error_response(&rejection),
    };
    Reply::Answer(with_figure(response, figure))
}

fn paging(emulator: &Emulator, call: &Call) -> (usize, usize) {
    let skip = call.query("$skiptoken").and_then(|s| s.parse().ok()).unwrap_or(0);
    (skip, emulator.config().page_size.max(1))
}

fn page<T>(call: &Call, items: Vec<T>, skip: usize, size: usize) -> Page<T> {
    let total = items.len();
    let value: Vec<T> = items.into_iter().skip(skip).take(size).collect();
    let next_link = (skip + size < total).then(|| {
        let api_version = call.query("api-version").unwrap_or_default();
        format!("{}{}?api-version={api_version}&$skiptoken={}", call.origin, call.path, skip + size)
    });
    Page { value, next_link }
}

fn operation_status(emulator: &Emulator, id: &str, call: &Call) -> Response<Full<Bytes>> {
    let mut state = emulator.lock();
    let Some(operation) = id.parse().ok().and_then(|id: u64| state.operations.get_mut(&id)) else {
        return error_response(&reject(404, "NotFound", format!("no operation {id}")));
    };
    let retry_after = operation.retry_after_secs.to_string();
    if operation.polls_left > 0 {
        operation.polls_left -= 1;
        let mut response = if operation.via_location {
            let mut response = empty(202);
            let monitor = format!("{}{}", call.origin, call.path);
            response.headers_mut().insert(hyper::header::LOCATION, header_value(&monitor));
            response
        } else {
            json(200, &wire::AsyncOperationStatus { status: "InProgress".into(), error: None })
        };
        response.headers_mut().insert(hyper::header::RETRY_AFTER, header_value(&retry_after));
        return response;
    }
    let (outcome, error) = (operation.outcome, operation.error.clone());
    match (operation.via_location, outcome) {
        (true, AsyncOutcome::Succeeded) if operation.result.is_null() => empty(200),
        (true, AsyncOutcome::Succeeded) => json(200, &operation.result),
        (true, _) => json(500, &ErrorEnvelope { error }),
        (false, AsyncOutcome::Succeeded) => {
            json(200, &wire::AsyncOperationStatus { status: "Succeeded".into(), error: None })
        }
        (false, outcome) => {
            json(200, &wire::AsyncOperationStatus { status: format!("{outcome:?}"), error: Some(error) })
        }
    }
}

fn set_faults(emulator: &Emulator, body: &[u8]) -> Response<Full<Bytes>> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(Fault),
        Many(Vec<Fault>),
    }
    match serde_json::from_slice(body) {
        Ok(faults) => {
            let faults = match faults {
                OneOrMany::One(fault) => vec![fault],
                OneOrMany::Many(faults) => faults,
            };
            for fault in faults {
                emulator.set_fault(fault);
            }
            json(200, &emulator.state().faults)
        }
        Err(e) => {
            error_response(&reject(400, "InvalidFault", format!("the body is not a fault or a list of faults: {e}")))
        }
    }
}

fn arm_spend(emulator: &Emulator, body: &[u8]) -> Response<Full<Bytes>> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Spend {
        #[serde(default)]
        writes: u32,
        #[serde(default)]
        reads: u32,
    }
    match serde_json::from_slice::<Spend>(body) {
        Ok(spend) => {
            emulator.arm_spend(spend.writes, spend.reads);
            json(200, &emulator.state().arm_remaining)
        }
        Err(e) => error_response(&reject(
            400,
            "InvalidArmSpend",
            format!("the body is not {{\"writes\": N, \"reads\": M}}: {e}"),
        )),
    }
}

/// Entra ID's client-credentials grant with a federated assertion, as workload identity uses it.
fn exchange_token(emulator: &Emulator, tenant: &str, body: &[u8]) -> Response<Full<Bytes>> {
    let refuse = |error: &str, description: String| {
        json(400, &serde_json::json!({"error": error, "error_description": description}))
    };
    let form: Vec<(String, String)> = match serde_urlencoded::from_bytes(body) {
        Ok(form) => form,
        Err(e) => return refuse("invalid_request", format!("the body is not a form: {e}")),
    };
    let field = |name: &str| form.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).unwrap_or_default();
    let expected = [
        ("grant_type", "client_credentials"),
        ("client_assertion_type", "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"),
    ];
    for (name, value) in expected {
        if field(name) != value {
            return refuse("invalid_request", format!("{name} must be {value}"));
        }
    }
    for name in ["client_id", "client_assertion", "scope"] {
        if field(name).is_empty() {
            return refuse("invalid_request", format!("{name} is missing"));
        }
    }
    if !field("scope").ends_with("/.default") {
        return refuse("invalid_scope", format!("scope {} is not a .default scope", field("scope")));
    }
    let mut state = emulator.lock();
    let issued = format!("emulator-token-{}", state.token_exchanges.len() + 1);
    state.token_exchanges.push(TokenExchange {
        tenant: tenant.to_owned(),
        client_id: field("client_id"),
        assertion: field("client_assertion"),
        scope: field("scope"),
        issued: issued.clone(),
    });
    let lifetime = emulator.config().token_lifetime_secs;
    json(200, &serde_json::json!({"token_type": "Bearer", "expires_in": lifetime, "access_token": issued}))
}

fn reject(status: u16, code: &str, message: impl Into<String>) -> Rejection {
    Rejection { status, code: code.to_owned(), message: message.into(), retry_after_secs: None }
}

fn method_not_allowed(call: &Call) -> Response<Full<Bytes>> {
    error_response(&reject(405, "MethodNotAllowed", format!("{} is not allowed on {}", call.method, call.path)))
}

fn error_response(rejection: &Rejection) -> Response<Full<Bytes>> {
    let code =
        if rejection.code.is_empty() { default_code(rejection.status).to_owned() } else { rejection.code.clone() };
    let mut response =
        json(rejection.status, &ErrorEnvelope { error: ErrorBody { code, message: rejection.message.clone() } });
    if let Some(secs) = rejection.retry_after_secs {
        response.headers_mut().insert(hyper::header::RETRY_AFTER, header_value(&secs.to_string()));
    }
    response
}

fn json(status: u16, value: &impl Serialize) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec(value)
        .unwrap_or_else(|e| format!("{{\"error\":{{\"code\":\"Encode\",\"message\":\"{e}\"}}}}").into_bytes());
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status_code(status);
    response
        .headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    response
}

fn empty(status: u16) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status_code(status);
    response
}

fn status_code(status: u16) -> hyper::StatusCode {
    hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR)
}

fn header_value(text: &str) -> hyper::header::HeaderValue {
    hyper::header::HeaderValue::from_str(text).unwrap_or_else(|_| hyper::header::HeaderValue::from_static("invalid"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scope;
    use crate::{ArmLimits, BucketLimits, EmulatorConfig, THROTTLED_CODE};
    use clb_arm::{ArmClient, ArmConfig, Credential};
    use clb_azure::{AzureApi, IpVersion, PublicIpSpec};
    use std::time::Duration;

    fn pip(n: usize) -> PublicIpSpec {
        PublicIpSpec { name: format!("pip-{n}"), version: IpVersion::IPv4 }
    }

    #[tokio::test]
    async fn the_arm_client_reads_the_remaining_writes_over_http_and_an_empty_bucket_arrives_as_a_429_with_retry_after()
    {
        let limits = ArmLimits { writes: BucketLimits { burst: 2, per_second: 1 }, ..ArmLimits::default() };
        let config = EmulatorConfig { arm_limits: Some(limits), ..EmulatorConfig::default() };
        let emulator = Arc::new(Emulator::with_config(scope(), config));
        let server = EmulatorServer::start(emulator.clone(), "127.0.0.1:0".parse().unwrap()).await.expect("listens");
        let client =
            ArmClient::new(ArmConfig::new(server.url(), scope()), Credential::None).expect("the client builds");

        client.put_public_ip(&pip(0)).await.expect("the first write passes");
        assert_eq!(client.take_arm_remaining_writes(), Some(1));
        assert_eq!(client.take_arm_remaining_writes(), None, "taken once");
        client.list_services().await.expect("a read passes");
        assert_eq!(client.take_arm_remaining_writes(), None, "a read's answer carries the reads figure only");
        assert_eq!(client.last_arm_remaining_writes(), Some(1));

        client.put_public_ip(&pip(1)).await.expect("the second write passes");
        let refused = client.put_public_ip(&pip(2)).await.expect_err("the third write is throttled");
        assert_eq!((refused.status, refused.code.as_str()), (429, THROTTLED_CODE));
        // One token at one a second: at most a second, whatever real time passed.
        assert_eq!(refused.retry_after, Some(Duration::from_secs(1)));
        assert_eq!(client.take_arm_remaining_writes(), Some(0), "the 429 carries the figure too");
        assert_eq!(emulator.state().throttled.get("put-public-ip"), Some(&1));
        assert!(!emulator.resources().public_ips.contains_key("pip-2"));

        let spend = reqwest::Client::new()
            .post(format!("{}/emulator/arm-spend", server.url()))
            .body(r#"{"reads": 1000}"#)
            .send()
            .await
            .expect("the emulator answers");
        assert_eq!(spend.status(), 200);
        let refused = client.list_services().await.expect_err("another client emptied the reads");
        assert_eq!((refused.status, refused.code.as_str()), (429, THROTTLED_CODE));
    }
}
