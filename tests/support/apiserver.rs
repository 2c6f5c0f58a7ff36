//! The test API server (`harness/apiserver`): built once and started once per test binary.
//!
//! [`apiserver`] runs `harness/apiserver/build.sh` (which prints the binary's path and builds
//! only when its sources changed), spawns the binary with stdin piped and waits for its
//! `ready <kubeconfig> <https-url>` line. The child is kept in a static that is never dropped,
//! so the write end of its stdin stays open while the tests run and closes when the test binary
//! exits — the server then shuts down by itself. Tests share the server and keep apart by
//! namespace.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// How long the server may take to say `ready` (it measures 2.5–3 s).
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// A running test API server.
#[derive(Debug)]
pub struct ApiServer {
    /// An admin kubeconfig (user `clb-test-admin`, group `system:masters`).
    pub kubeconfig: PathBuf,
    pub url: String,
}

/// The API server of this test binary, started at the first call. Panics (failing the test)
/// with why when it cannot be built or started.
pub fn apiserver() -> &'static ApiServer {
    static SERVER: OnceLock<ApiServer> = OnceLock::new();
    SERVER.get_or_init(|| start().unwrap_or_else(|e| panic!("the test API server: {e:#}")))
}

/// The child, kept so that its stdin stays open until the test binary exits.
static CHILD: Mutex<Option<Child>> = Mutex::new(None);

fn start() -> anyhow::Result<ApiServer> {
    use anyhow::Context as _;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../harness/apiserver/build.sh");
    let built = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    anyhow::ensure!(built.status.success(), "{} failed: {}", script.display(), built.status);
    let stdout = String::from_utf8(built.stdout).context("build.sh printed something that is not UTF-8")?;
    let binary = stdout.lines().last().map(str::trim).filter(|l| !l.is_empty()).context("build.sh printed no path")?;
    let log = std::env::temp_dir().join(format!("clb-test-apiserver-{}.log", std::process::id()));
    let mut child = Command::new(binary)
        .arg("-log")
        .arg(&log)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {binary}"))?;
    let out = child.stdout.take().context("the child's stdout")?;
    *CHILD.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(out).lines();
        let first = lines.next();
        let _ = send.send(first);
        // Keep reading so that the server never blocks on a full pipe.
        for _ in lines {}
    });
    let line = match receive.recv_timeout(READY_TIMEOUT) {
        Ok(Some(Ok(line))) => line,
        Ok(Some(Err(e))) => anyhow::bail!("reading its stdout: {e}"),
        Ok(None) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            anyhow::bail!("it exited before it was ready (its log: {})", log.display())
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            anyhow::bail!("not ready within {READY_TIMEOUT:?} (its log: {})", log.display())
        }
    };
    match line.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["ready", kubeconfig, url] => Ok(ApiServer { kubeconfig: PathBuf::from(kubeconfig), url: (*url).to_owned() }),
        _ => anyhow::bail!("expected `ready <kubeconfig> <url>`, got {line:?}"),
    }
}
