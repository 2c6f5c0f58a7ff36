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
//! * **The versions come from a [`Door`]**: `clb-host admission` serves the one it loaded; in
//!   `run` (`--admission-listen`) the loop moves the door along with every swap and rollback,
//!   and a candidate in shadow judges each request too, after the answer is sent (its different
//!   verdicts are the shadow's `admission` divergences).

pub mod door;
pub mod review;
pub mod tls;

pub use door::Door;

use crate::clock::epoch_ms;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::bindings::exports::clb::reconciler::validation::{Admission, Verdict};
use clb_sandbox::supervisor::version_name;
use clb_sandbox::trace::{self, ComponentRef, Ended, Recorder, lazy};
use door::{Denial, Judges};
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
    pub door: Arc<Door>,
    pub config: wit::Config,
    pub timeout: Duration,
    pub failure: FailurePolicy,
    /// Where every `admit-service` call is recorded (`clb-host admission --record`): a new file
    /// whenever the version judging changes, so each file replays with the component it names.
    pub record: Option<Arc<Recorder>>,
}

/// A metric's labels.
type Labels = Vec<(&'static str, String)>;

/// The server's counters, served on its `/metrics` (and, in `run`, on the controller's too:
/// [`Metrics::register`] into its registry as well).
#[derive(Clone)]
pub struct Metrics {
    requests: Family<Labels, Counter>,
    failures: Family<Labels, Counter>,
    warnings: Family<Labels, Counter>,
    invalid: Family<Labels, Counter>,
    seconds: Family<Labels, Histogram, fn() -> Histogram>,
}

impl Metrics {
    pub fn new() -> Self {
        let seconds: Family<_, _, fn() -> Histogram> =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.000_1, 3.0, 12)));
        Self {
            requests: Family::default(),
            failures: Family::default(),
            warnings: Family::default(),
            invalid: Family::default(),
            seconds,
        }
    }

    /// Shows the counters in `registry` too (they are shared, not copied).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "clb_admission_requests",
            "AdmissionReviews answered, by operation and verdict (allowed, denied, skipped: not judged, failed: the failure policy answered)",
            self.requests.clone(),
        );
        registry.register(
            "clb_admission_failures",
            "AdmissionReviews the logic did not judge, by cause (trap, fuel, deadline, timeout, …)",
            self.failures.clone(),
        );
        registry.register(
            "clb_admission_warnings",
            "Warnings given with answers (an annotation the Container Load Balancer does not act on, …)",
            self.warnings.clone(),
        );
        registry.register(
            "clb_admission_invalid",
            "Requests refused before judging: 400 (not an AdmissionReview), 404, 405, 413 (too large)",
            self.invalid.clone(),
        );
        registry.register(
            "clb_admission_request_duration_seconds",
            "Time from a request's body read to its answer, by verdict",
            self.seconds.clone(),
        );
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The server's shared state.
struct Server {
    settings: Settings,
    /// The sha256 of the component the trace's current file names (with `record`); held while a
    /// line is recorded, so that a new file and its lines keep their order.
    recording: std::sync::Mutex<String>,
    judging: Arc<Semaphore>,
    /// Its own `/metrics`: the counters of `metrics` alone.
    registry: Registry,
    metrics: Metrics,
}

/// Serves `/validate` (and the probes and metrics) on `listener`, over TLS with `tls`, until
/// the task is dropped; counting into `metrics` when given (`run`'s, registered with its
/// own), else into counters of its own.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    settings: Settings,
    metrics: Option<Metrics>,
) -> std::convert::Infallible {
    let mut registry = Registry::default();
    let metrics = metrics.unwrap_or_default();
    metrics.register(&mut registry);
    let recording = std::sync::Mutex::new(settings.door.sha256());
    let judging = Arc::new(Semaphore::new(MAX_JUDGING));
    let server = Arc::new(Server { settings, recording, judging, registry, metrics });
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
            self.metrics
                .invalid
                .get_or_create(&labels(&self.settings.door.sha256(), &[("code", &status.as_u16().to_string())]))
                .inc();
            tracing::info!(status = status.as_u16(), "admission: a request refused: {why}");
            reply(status, TEXT, format!("{why}\n"))
        };
        match (request.method(), request.uri().path()) {
            (&Method::POST, "/validate") => self.validate(request, refused).await,
            (_, "/validate") => refused(StatusCode::METHOD_NOT_ALLOWED, "/validate takes POST".into()),
            (&Method::GET, "/healthz" | "/readyz") => reply(StatusCode::OK, TEXT, "ok\n"),
            (&Method::GET, "/metrics") => {
                let mut out = String::new();
                let _ = encode(&mut out, &self.registry);
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
        let judges = self.settings.door.judges();
        let sha256 = judges.serving.info().sha256.clone();
        let (answer, outcome) = match review.service() {
            None => review.skip(),
            Some(service) => match self.judge(&judges, service.clone()).await {
                Ok(judged) => {
                    self.record(&judges, service, || Ended::Returned(lazy(judged.clone())));
                    let answered = review.answer(&judged);
                    let warned = judged.warnings.len().min(review::MAX_WARNINGS) as u64;
                    if warned > 0 {
                        self.metrics.warnings.get_or_create(&labels(&sha256, &[])).inc_by(warned);
                    }
                    if let Verdict::Rejected(rejection) = &judged.verdict {
                        self.settings.door.denied(Denial {
                            at_ms: epoch_ms(),
                            operation: review.operation(),
                            service: review.subject(),
                            reason: rejection.reason.clone(),
                            message: rejection.message.clone(),
                            version: version_name(&judges.serving),
                        });
                    }
                    self.ask_shadow(&judges, service, &review, judged);
                    answered
                }
                Err((cause, why)) => {
                    // A call the host gave up on has no outcome to record; one the guest ended has.
                    if !matches!(cause, "timeout" | "panic") {
                        self.record(&judges, service, || Ended::Trapped(why.clone()));
                    }
                    self.metrics.failures.get_or_create(&labels(&sha256, &[("cause", cause)])).inc();
                    tracing::warn!(subject = %review.subject(), cause, "admission: the logic did not judge: {why}");
                    review.failed(self.settings.failure, &why)
                }
            },
        };
        if outcome == Outcome::Denied {
            tracing::info!(subject = %review.subject(), operation = review.operation(), "admission: denied");
        }
        let counted = labels(&sha256, &[("operation", review.operation()), ("verdict", outcome.label())]);
        self.metrics.requests.get_or_create(&counted).inc();
        let verdict = labels(&sha256, &[("verdict", outcome.label())]);
        self.metrics.seconds.get_or_create(&verdict).observe(started.elapsed().as_secs_f64());
        let body = serde_json::to_vec(&answer).expect("an AdmissionReview encodes");
        reply(StatusCode::OK, "application/json", body)
    }

    /// Records the call that judged `service` (with `--record`), in a file of the version that
    /// judged it.
    fn record(&self, judges: &Judges, service: &wit::Service, ended: impl FnOnce() -> Ended) {
        let Some(recorder) = &self.settings.record else { return };
        let mut current = self.recording.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let sha256 = &judges.serving.info().sha256;
        if (*current != *sha256 || recorder.needs_state())
            && recorder.begin_file(&ComponentRef::of(&judges.serving, None))
        {
            current.clone_from(sha256);
        }
        if *current != *sha256 {
            // No new file for this version yet (the writer's queue was full): not in the trace.
            return;
        }
        let args = vec![trace::arg(self.settings.config.clone()), trace::arg(service.clone())];
        recorder.call("admit-service", args, ended());
    }

    /// Has the candidate in shadow, if one runs, judge `service` too, on a blocking thread after
    /// the answer is sent; only when a slot is free, so that the shadow never makes a request
    /// wait (a request it skips is only not compared).
    fn ask_shadow(&self, judges: &Judges, service: &wit::Service, review: &Review, judged: Admission) {
        let Some(shadow) = judges.shadow.clone() else { return };
        let Ok(slot) = self.judging.clone().try_acquire_owned() else {
            return tracing::debug!(subject = %review.subject(), "admission: no free slot; the shadow does not judge this request");
        };
        let (serving, config, service) = (judges.serving.clone(), self.settings.config.clone(), service.clone());
        let input = format!("AdmissionReview {} of Service {}", review.operation(), review.subject());
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            shadow.admit_service(&serving, &config, &service, &judged, || input);
        });
    }

    /// The logic's verdict on `service`, within the timeout; else the cause and why.
    async fn judge(&self, judges: &Judges, service: wit::Service) -> Result<Admission, (&'static str, String)> {
        let timeout = self.settings.timeout;
        let work = async {
            // Held until the call ends, not until the answer is given up on: a call past the
            // timeout still runs to its own deadline, and counts against the bound until then.
            let slot = self.judging.clone().acquire_owned().await.expect("the semaphore is never closed");
            let (logic, config) = (judges.serving.clone(), self.settings.config.clone());
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

/// A metric's labels: `pairs`, and the sha256 of the version that judged.
fn labels(sha256: &str, pairs: &[(&'static str, &str)]) -> Labels {
    let mut labels: Vec<_> = pairs.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
    labels.push(("sha256", sha256.to_owned()));
    labels
}
