//! `clb-host admission`: the logic's policy at the door, as a `ValidatingAdmissionWebhook`
//! (docs/operations.md, "Admission"). `POST /validate` takes an `admission.k8s.io/v1`
//! AdmissionReview and answers it with the verdict of the component's `admit-service` (the
//! same logic version that reconciles, read from the same flags), over TLS; `GET /healthz`,
//! `/readyz` and `/metrics` beside it.
//!
//! * **Bounded.** A body over [`MAX_BODY_BYTES`] is answered 413 (a `Content-Length` over it
//!   before the body is read); one that is not an AdmissionReview 400, with its reason; each in
//!   one line, and the server goes on. A handshake, a request's head and its body each have
//!   [`IO_TIMEOUT`]; at most [`MAX_JUDGING`] requests are judged at once.
//! * **Answered in time.** A request is answered within `--admission-timeout` whatever the
//!   logic does: a trap, its fuel or deadline, or no free slot in time is answered as
//!   `--admission-failure` says (open: allowed, with a warning naming the cause; closed:
//!   denied), and counted.
//! * **One instance per request**, from the loaded component's `InstancePre` (microseconds): a
//!   request that traps poisons nothing for the next.

pub mod review;
pub mod tls;

use clb_sandbox::LoadedLogic;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use review::{FailurePolicy, Outcome, Review};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// The largest AdmissionReview read (the API server caps an object at 3 MiB, and a review holds
/// the object twice at most for an update; anything larger is no review of a Service).
pub const MAX_BODY_BYTES: usize = 3 << 20;
/// How long a TLS handshake, a request's head or its body may take.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests judged at once (each holds a guest instance); more wait for a slot, within their
/// timeout.
pub const MAX_JUDGING: usize = 16;

/// What the server judges with and how.
pub struct Settings {
    pub logic: LoadedLogic,
    pub config: wit::Config,
    pub timeout: Duration,
    pub failure: FailurePolicy,
}

/// A metric's labels.
type Labels = Vec<(&'static str, String)>;

/// The server's counters, served on `/metrics`.
struct Metrics {
    registry: Registry,
    requests: Family<Labels, Counter>,
    failures: Family<Labels, Counter>,
    invalid: Family<Labels, Counter>,
    seconds: Family<Labels, Histogram, fn() -> Histogram>,
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::default();
        let failures = Family::default();
        let invalid = Family::default();
        let seconds: Family<_, _, fn() -> Histogram> =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.000_1, 3.0, 12)));
        registry.register(
            "clb_admission_requests",
            "AdmissionReviews answered, by operation and verdict (allowed, denied, skipped: not judged, failed: the failure policy answered)",
            requests.clone(),
        );
        registry.register(
            "clb_admission_failures",
            "AdmissionReviews the logic did not judge, by cause (trap, fuel, deadline, timeout, …)",
            failures.clone(),
        );
        registry.register(
            "clb_admission_invalid",
            "Requests refused before judging: 400 (not an AdmissionReview), 404, 405, 413 (too large)",
            invalid.clone(),
        );
        registry.register(
            "clb_admission_request_duration_seconds",
            "Time from a request's body read to its answer, by verdict",
            seconds.clone(),
        );
        Self { registry, requests, failures, invalid, seconds }
    }
}

/// The server's shared state.
struct Server {
    settings: Settings,
    sha256: String,
    judging: Arc<Semaphore>,
    metrics: Metrics,
}

/// Serves `/validate` (and the probes and metrics) on `listener`, over TLS with `tls`, until
/// the task is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    settings: Settings,
) -> std::convert::Infallible {
    let sha256 = settings.logic.info().sha256.clone();
    let server =
        Arc::new(Server { settings, sha256, judging: Arc::new(Semaphore::new(MAX_JUDGING)), metrics: Metrics::new() });
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: wait rather than spin.
                tracing::warn!(%error, "admission: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (server, acceptor) = (server.clone(), acceptor.clone());
        connections.spawn(async move {
            let stream = match tokio::time::timeout(IO_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => return tracing::debug!(%error, %peer, "admission: a TLS handshake failed"),
                Err(_) => return tracing::debug!(%peer, "admission: a TLS handshake timed out"),
            };
            let service = hyper::service::service_fn(move |request| {
                let server = server.clone();
                async move { Ok::<_, std::convert::Infallible>(server.handle(request).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(IO_TIMEOUT);
            if let Err(error) = http.serve_connection(io, service).await {
                tracing::debug!(%error, %peer, "admission: a connection ended with an error");
            }
        });
        // Reap finished connections so the set does not grow.
        while connections.try_join_next().is_some() {}
    }
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body.into()))
        .expect("a status, a header and a body make a response")
}

impl Server {
    async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        const TEXT: &str = "text/plain; charset=utf-8";
        let refused = |status: StatusCode, why: String| {
            self.metrics.invalid.get_or_create(&self.labels(&[("code", &status.as_u16().to_string())])).inc();
            tracing::info!(status = status.as_u16(), "admission: a request refused: {why}");
            reply(status, TEXT, format!("{why}\n"))
        };
        match (request.method(), request.uri().path()) {
            (&Method::POST, "/validate") => self.validate(request, refused).await,
            (_, "/validate") => refused(StatusCode::METHOD_NOT_ALLOWED, "/validate takes POST".into()),
            (&Method::GET, "/healthz" | "/readyz") => reply(StatusCode::OK, TEXT, "ok\n"),
            (&Method::GET, "/metrics") => {
                let mut out = String::new();
                let _ = encode(&mut out, &self.metrics.registry);
                reply(StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", out)
            }
            (_, path) => refused(StatusCode::NOT_FOUND, format!("no route {path}")),
        }
    }

    async fn validate(
        &self,
        request: Request<Incoming>,
        refused: impl Fn(StatusCode, String) -> Response<Full<Bytes>>,
    ) -> Response<Full<Bytes>> {
        let too_large = || format!("the body is over {MAX_BODY_BYTES} bytes: no AdmissionReview of a Service is");
        let declared = request.headers().get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
        if declared.is_some_and(|length: u64| length > MAX_BODY_BYTES as u64) {
            return refused(StatusCode::PAYLOAD_TOO_LARGE, too_large());
        }
        let body = Limited::new(request.into_body(), MAX_BODY_BYTES).collect();
        let body = match tokio::time::timeout(IO_TIMEOUT, body).await {
            Ok(Ok(body)) => body.to_bytes(),
            Ok(Err(error)) if error.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
                return refused(StatusCode::PAYLOAD_TOO_LARGE, too_large());
            }
            Ok(Err(error)) => return refused(StatusCode::BAD_REQUEST, format!("reading the body failed: {error}")),
            Err(_) => return refused(StatusCode::REQUEST_TIMEOUT, format!("the body took over {IO_TIMEOUT:?}")),
        };
        let started = Instant::now();
        let review = match Review::read(&body) {
            Ok(review) => review,
            Err(error) => return refused(StatusCode::BAD_REQUEST, error.to_string()),
        };
        let (answer, outcome) = match review.service() {
            None => review.skip(),
            Some(service) => match self.judge(service.clone()).await {
                Ok(verdict) => review.answer(&verdict),
                Err((cause, why)) => {
                    self.metrics.failures.get_or_create(&self.labels(&[("cause", cause)])).inc();
                    tracing::warn!(subject = %review.subject(), cause, "admission: the logic did not judge: {why}");
                    review.failed(self.settings.failure, &why)
                }
            },
        };
        if outcome == Outcome::Denied {
            tracing::info!(subject = %review.subject(), operation = review.operation(), "admission: denied");
        }
        let labels = self.labels(&[("operation", review.operation()), ("verdict", outcome.label())]);
        self.metrics.requests.get_or_create(&labels).inc();
        let verdict = self.labels(&[("verdict", outcome.label())]);
        self.metrics.seconds.get_or_create(&verdict).observe(started.elapsed().as_secs_f64());
        let body = serde_json::to_vec(&answer).expect("an AdmissionReview encodes");
        reply(StatusCode::OK, "application/json", body)
    }

    fn labels(&self, pairs: &[(&'static str, &str)]) -> Labels {
        let mut labels: Vec<_> = pairs.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        labels.push(("sha256", self.sha256.clone()));
        labels
    }

    /// The logic's verdict on `service`, within the timeout; else the cause and why.
    async fn judge(
        &self,
        service: wit::Service,
    ) -> Result<clb_sandbox::bindings::exports::clb::reconciler::validation::Verdict, (&'static str, String)> {
        let timeout = self.settings.timeout;
        let work = async {
            // Held until the call ends, not until the answer is given up on: a call past the
            // timeout still runs to its own deadline, and counts against the bound until then.
            let slot = self.judging.clone().acquire_owned().await.expect("the semaphore is never closed");
            let (logic, config) = (self.settings.logic.clone(), self.settings.config.clone());
            let judged = tokio::task::spawn_blocking(move || {
                let _slot = slot;
                logic.session()?.admit_service(&config, &service)
            });
            match judged.await {
                Ok(judged) => judged.map_err(|e| (e.kind(), e.to_string())),
                Err(e) => Err(("panic", format!("the call into the logic panicked: {e}"))),
            }
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(judged) => judged,
            Err(_) => Err(("timeout", format!("no verdict within the admission timeout of {timeout:?}"))),
        }
    }
}
