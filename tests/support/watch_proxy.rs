//! A plain-HTTP proxy in front of the test API server that can break watches the way a real
//! cluster does: the open watch streams end, the watches that follow are held (the connection
//! is "down"), and then each kind's next watch is answered as an API server answers a watch
//! from a compacted resourceVersion — `200` with one `ERROR` event of code 410 `Expired` — so
//! that the client must re-list. Everything else is passed through unchanged.
//!
//! The host's client talks plain HTTP to the proxy with its own bearer token; the proxy speaks
//! TLS to the API server and forwards the token, so RBAC applies as without it.
//!
//! A proxy started [`WatchProxy::with_hook`] also awaits a hook before it forwards each request:
//! what a test needs to happen between a client's requests (another writer's change, to race a
//! client's read and its write), and a record of them.

use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Request, Response};
use std::collections::BTreeSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

type Body = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// What a proxy awaits before it forwards a request, given the request's method and path.
pub type BeforeForward = Box<dyn Fn(&hyper::Method, &str) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// What a watch meets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Passed through.
    Open,
    /// Open watches have ended; new ones wait.
    Broken,
    /// Each path's next watch gets 410 `Expired`, then watches pass again.
    Expiring,
}

struct Shared {
    upstream: String,
    client: reqwest::Client,
    /// The mode, and a count bumped at every break so that open streams notice.
    mode: tokio::sync::watch::Sender<(Mode, u64)>,
    /// Paths whose watch has been answered with 410 since the last break.
    expired: Mutex<BTreeSet<String>>,
    expired_total: AtomicUsize,
    held: AtomicUsize,
    before: Option<BeforeForward>,
}

/// A running proxy; it stops when dropped.
pub struct WatchProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl WatchProxy {
    /// A proxy to `upstream` (the API server's `https://` URL) on a free loopback port.
    pub async fn start(upstream: &str) -> Self {
        Self::start_with(upstream, None).await
    }

    /// [`start`](Self::start), awaiting `before` ahead of every request it forwards.
    pub async fn with_hook(upstream: &str, before: BeforeForward) -> Self {
        Self::start_with(upstream, Some(before)).await
    }

    async fn start_with(upstream: &str, before: Option<BeforeForward>) -> Self {
        // The upstream is the loopback test API server with a throwaway CA; the proxy is test
        // plumbing, so it does not check that certificate.
        let client = reqwest::Client::builder().danger_accept_invalid_certs(true).build().expect("an HTTP client");
        let shared = Arc::new(Shared {
            upstream: upstream.trim_end_matches('/').to_owned(),
            client,
            mode: tokio::sync::watch::Sender::new((Mode::Open, 0)),
            expired: Mutex::new(BTreeSet::new()),
            expired_total: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            before,
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds a loopback port");
        let addr = listener.local_addr().expect("a local address");
        let task = tokio::spawn(accept_loop(listener, shared.clone()));
        Self { addr, shared, task }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Ends every open watch stream and holds the watches that follow.
    pub fn break_watches(&self) {
        self.shared.held.store(0, Ordering::SeqCst);
        self.shared.expired.lock().unwrap().clear();
        self.shared.mode.send_modify(|(mode, breaks)| {
            *mode = Mode::Broken;
            *breaks += 1;
        });
    }

    /// Watches held since the last break.
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// Releases the held watches: each path's next watch is answered 410 `Expired`.
    pub fn expire_watches(&self) {
        self.shared.mode.send_modify(|(mode, _)| *mode = Mode::Expiring);
    }

    /// Watches answered 410 since the proxy started.
    pub fn expired(&self) -> usize {
        self.shared.expired_total.load(Ordering::SeqCst)
    }
}

impl Drop for WatchProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    // Owned here, so that aborting this task also ends every connection.
    let mut connections = tokio::task::JoinSet::new();
    while let Ok((stream, _)) = listener.accept().await {
        while connections.try_join_next().is_some() {}
        let shared = shared.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| forward(shared.clone(), request));
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
        });
    }
}

fn is_watch(request: &Request<Incoming>) -> bool {
    request.uri().query().is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
}

fn text(status: u16, body: String) -> Response<Body> {
    let body = Full::new(Bytes::from(body)).map_err(|never: Infallible| match never {}).boxed();
    let mut response = Response::new(body);
    *response.status_mut() = hyper::StatusCode::from_u16(status).expect("a valid status");
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, "application/json".parse().unwrap());
    response
}

async fn forward(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let watch = is_watch(&request);
    let mut modes = shared.mode.subscribe();
    let breaks_at_start = modes.borrow().1;
    if watch {
        if modes.borrow().0 == Mode::Broken {
            shared.held.fetch_add(1, Ordering::SeqCst);
            let _ = modes.wait_for(|(mode, _)| *mode != Mode::Broken).await;
        }
        let path = request.uri().path().to_owned();
        if modes.borrow().0 == Mode::Expiring && shared.expired.lock().unwrap().insert(path) {
            shared.expired_total.fetch_add(1, Ordering::SeqCst);
            let event = serde_json::json!({"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "too old resource version (the watch proxy expired it)", "reason": "Expired", "code": 410,
            }});
            return Ok(text(200, format!("{event}\n")));
        }
    }
    let (parts, body) = request.into_parts();
    let url = format!("{}{}", shared.upstream, parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    let body = match body.collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => return Ok(text(400, format!("{{\"message\": \"the proxy could not read the body: {e}\"}}"))),
    };
    if let Some(before) = &shared.before {
        before(&parts.method, parts.uri.path()).await;
    }
    let mut upstream = shared.client.request(parts.method, url).body(body);
    for (name, value) in &parts.headers {
        if name != hyper::header::HOST {
            upstream = upstream.header(name, value);
        }
    }
    let answer = match upstream.send().await {
        Ok(answer) => answer,
        Err(e) => return Ok(text(502, format!("{{\"message\": \"the proxy's upstream failed: {e}\"}}"))),
    };
    let mut response = Response::builder().status(answer.status().as_u16());
    for (name, value) in answer.headers() {
        if name != reqwest::header::CONTENT_LENGTH && name != reqwest::header::TRANSFER_ENCODING {
            response = response.header(name.as_str(), value.as_bytes());
        }
    }
    // The body chunk by chunk, so that watch events flow as they come; a watch also ends at the
    // next break.
    let chunks = futures::stream::unfold(Some((answer, modes)), move |state| async move {
        let (mut answer, mut modes) = state?;
        let chunk = tokio::select! {
            chunk = answer.chunk() => chunk,
            _ = modes.wait_for(|(_, breaks)| watch && *breaks != breaks_at_start) => return None,
        };
        match chunk {
            Ok(Some(bytes)) => Some((Ok(Frame::data(bytes)), Some((answer, modes)))),
            Ok(None) => None,
            Err(e) => Some((Err(std::io::Error::other(e)), None)),
        }
    });
    Ok(response.body(StreamBody::new(chunks).boxed()).expect("a valid response"))
}
