//! The HTTP endpoint of `clb-host run` (a small hyper server): `/` (the operator page,
//! [`crate::live::page`]), `/metrics` (the [`Metrics`] registry's OpenMetrics exposition), `/healthz` (200 while a version serves, else 503),
//! `/readyz` (200 once ready, else 503), `/status` (JSON for people and scripts) and `POST
//! /swap`.
//!
//! * `POST /swap` (only with an [`Admin`]): the body is a component, gzip- or zstd-compressed or
//!   not ([`clb_sandbox::compression`]); the optional header [`SHA256_HEADER`] pins the digest of the
//!   decompressed component, and [`SIGNATURE_HEADER`] a detached signature of the body (needed
//!   with `--logic-verify-key`). Accepted only from a loopback peer, or — when the admin
//!   has a token — from any peer presenting `Authorization: Bearer <token>`. The request goes to
//!   the run loop through the [`SwapSender`]; the answer is a [`SwapResult`] as JSON: 200 when
//!   accepted or unchanged, 409 when refused, 400 when refused as compressed bytes that give no
//!   component (kind `decompress`).

use crate::live::control::SwapSender;
use crate::live::metrics::Metrics;
use crate::live::swap::{REFUSED_DECOMPRESS, Sha256Pin, Signed, SwapResult};
use clb_sandbox::compression::MAX_COMPONENT_BYTES;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::Arc;

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("listening for /metrics on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The header of `POST /swap` that pins the component's sha256.
pub const SHA256_HEADER: &str = "x-clb-sha256";

/// The header of `POST /swap` that carries a detached signature of the body as sent (what
/// `cosign sign-blob` writes): needed when the host takes only signed versions
/// (`--logic-verify-key`).
pub const SIGNATURE_HEADER: &str = "x-clb-signature";

/// What `POST /swap` needs: where requests go, and who may send them.
#[derive(Clone)]
pub struct Admin {
    pub swaps: SwapSender,
    /// When set, any peer presenting it as a bearer token may swap; else only loopback peers.
    pub token: Option<String>,
}

/// A running `/metrics` server; it stops when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsServer {
    /// Listens on `listen` (port 0: any free port) and serves on the current tokio runtime.
    pub async fn start(metrics: Arc<Metrics>, listen: SocketAddr) -> Result<Self, EndpointError> {
        Self::start_with_admin(metrics, listen, None).await
    }

    /// The same, and `POST /swap` when `admin` is given.
    pub async fn start_with_admin(
        metrics: Arc<Metrics>,
        listen: SocketAddr,
        admin: Option<Admin>,
    ) -> Result<Self, EndpointError> {
        let bind_error = |source| EndpointError::Bind { addr: listen, source };
        let listener = tokio::net::TcpListener::bind(listen).await.map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let task = tokio::spawn(accept_loop(listener, metrics, admin));
        Ok(Self { addr, task })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, metrics: Arc<Metrics>, admin: Option<Admin>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: wait rather than spin.
                tracing::warn!(%error, "accepting a /metrics connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let (metrics, admin) = (metrics.clone(), admin.clone());
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let (metrics, admin) = (metrics.clone(), admin.clone());
                async move { Ok::<_, std::convert::Infallible>(handle(&metrics, admin.as_ref(), peer, request).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(error) = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await {
                tracing::debug!(%error, "a /metrics connection ended with an error");
            }
        });
        // Reap finished connections so the set does not grow.
        while connections.try_join_next().is_some() {}
    }
}

async fn handle(
    metrics: &Metrics,
    admin: Option<&Admin>,
    peer: SocketAddr,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let text = "text/plain";
    match (request.method(), request.uri().path()) {
        (&Method::POST, "/swap") => match admin {
            Some(admin) => swap(metrics, admin, peer, request).await,
            None => reply(StatusCode::NOT_FOUND, text, "this endpoint takes no swaps\n".into()),
        },
        (&Method::GET, "/metrics") => {
            reply(StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", metrics.render())
        }
        (&Method::GET, "/healthz") if metrics.healthy() => reply(StatusCode::OK, text, "ok\n".into()),
        (&Method::GET, "/healthz") => reply(StatusCode::SERVICE_UNAVAILABLE, text, "no logic version serving\n".into()),
        (&Method::GET, "/readyz") if metrics.ready() => reply(StatusCode::OK, text, "ready\n".into()),
        (&Method::GET, "/readyz") => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            text,
            "the initial lists are not delivered, or the tracker has not reported idle since it started\n".into(),
        ),
        (&Method::GET, "/status") => json(StatusCode::OK, &metrics.status()),
        (&Method::GET, "/") => {
            reply(StatusCode::OK, "text/html; charset=utf-8", crate::live::page::render(&metrics.overview()))
        }
        (&Method::GET, _) => reply(StatusCode::NOT_FOUND, text, "not found\n".into()),
        _ => reply(StatusCode::METHOD_NOT_ALLOWED, text, "only GET, and POST /swap\n".into()),
    }
}

/// `POST /swap`; see the module documentation.
async fn swap(metrics: &Metrics, admin: &Admin, peer: SocketAddr, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let text = "text/plain";
    let authorization = request.headers().get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if let Err(why) = admitted(admin.token.as_deref(), peer, authorization) {
        metrics.count_denied();
        tracing::warn!(%peer, "a swap request was denied: {why}");
        return after_body(request, reply(StatusCode::FORBIDDEN, text, format!("{why}\n"))).await;
    }
    let pin = match request.headers().get(SHA256_HEADER).map(|v| v.to_str().unwrap_or_default()) {
        None => None,
        Some(value) => match Sha256Pin::parse(value) {
            Ok(pin) => Some(pin),
            Err(error) => {
                let refusal = reply(StatusCode::BAD_REQUEST, text, format!("{SHA256_HEADER}: {error}\n"));
                return after_body(request, refusal).await;
            }
        },
    };
    let signature = request.headers().get(SIGNATURE_HEADER).map(|v| v.as_bytes().to_vec());
    let signed = Signed::detached(signature.as_deref(), format!("the {SIGNATURE_HEADER} header"));
    let bytes = match Limited::new(request.into_body(), MAX_COMPONENT_BYTES).collect().await {
        Ok(body) => body.to_bytes().to_vec(),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            return reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                text,
                format!("a component may be at most {MAX_COMPONENT_BYTES} bytes\n"),
            );
        }
        Err(error) => return reply(StatusCode::BAD_REQUEST, text, format!("reading the body: {error}\n")),
    };
    match admin.swaps.swap(bytes, signed, pin, format!("endpoint {peer}")).await {
        Ok(result) => {
            let status = match &result {
                // Compressed, but not a component: the request is wrong, not the version.
                SwapResult::Refused { kind, .. } if kind == REFUSED_DECOMPRESS => StatusCode::BAD_REQUEST,
                SwapResult::Refused { .. } => StatusCode::CONFLICT,
                _ => StatusCode::OK,
            };
            json(status, &result)
        }
        Err(error) => reply(StatusCode::SERVICE_UNAVAILABLE, text, format!("{error}\n")),
    }
}

/// Whether a `POST /swap` from `peer` carrying `authorization` is taken; else why not.
fn admitted(token: Option<&str>, peer: SocketAddr, authorization: Option<&str>) -> Result<(), &'static str> {
    match token {
        Some(token) => match authorization.and_then(|a| a.strip_prefix("Bearer ")) {
            Some(presented) if same_secret(presented, token) => Ok(()),
            _ => Err("POST /swap needs the admin token (Authorization: Bearer ...)"),
        },
        None if peer.ip().is_loopback() => Ok(()),
        None => Err("POST /swap is taken only from loopback (or with an admin token, see --admin-token-file)"),
    }
}

/// Compares without stopping at the first difference, so the time taken says nothing of the
/// token.
fn same_secret(presented: &str, token: &str) -> bool {
    let (a, b) = (presented.as_bytes(), token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn json(status: StatusCode, value: &impl Serialize) -> Response<Full<Bytes>> {
    match serde_json::to_string_pretty(value) {
        Ok(body) => reply(status, "application/json", body + "\n"),
        Err(error) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("encoding JSON: {error}\n")),
    }
}

/// `answer`, once the request's body (at most a component's worth) has been read and dropped.
/// Answering a refused upload before reading it closes the connection under a client that is
/// still sending, which then sees a broken pipe instead of the refusal (regression: the admin
/// token test failed this way once the next guest passed ~800 KB).
async fn after_body(request: Request<Incoming>, answer: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    let _ = Limited::new(request.into_body(), MAX_COMPONENT_BYTES).collect().await;
    answer
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::admitted;

    #[test]
    fn swap_requests_are_taken_from_loopback_or_with_the_token_and_from_nowhere_else() {
        let (local, local6, remote) =
            ("127.0.0.1:40000".parse().unwrap(), "[::1]:40000".parse().unwrap(), "10.0.0.7:40000".parse().unwrap());
        let cases = [
            (None, local, None, true),
            (None, local6, None, true),
            (None, remote, None, false),
            (None, remote, Some("Bearer anything"), false),
            (Some("s3cret"), remote, Some("Bearer s3cret"), true),
            (Some("s3cret"), local, None, false),
            (Some("s3cret"), local, Some("Bearer s3cre"), false),
            (Some("s3cret"), local, Some("Bearer s3cretx"), false),
            (Some("s3cret"), remote, Some("s3cret"), false),
        ];
        for (token, peer, authorization, expected) in cases {
            assert_eq!(admitted(token, peer, authorization).is_ok(), expected, "{token:?} {peer} {authorization:?}");
        }
    }
}
