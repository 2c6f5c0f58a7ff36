//! The test API server (`harness/apiserver`): built once and started once per test binary.
//!
//! [`apiserver`] runs `harness/apiserver/build.sh` (which prints the binary's path and builds
//! only when its sources changed), spawns the binary with stdin piped and waits for its
//! `ready <kubeconfig> <https-url>` line. The child is kept in a static that is never dropped,
//! so the write end of its stdin stays open while the tests run and closes when the test binary
//! exits — the server then shuts down by itself. Tests share the server and keep apart by
//! namespace.
//!
//! [`ApiServer::controller_kubeconfig`] applies `examples/deploy/rbac.yaml` and gives a
//! kubeconfig with a token of its ServiceAccount, so that the host runs with exactly the rights
//! the example grants.

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::Api;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
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
    let log = crate::process_dir().join("apiserver.log");
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

/// The ServiceAccount of `examples/deploy/rbac.yaml`, as `(namespace, name)`.
pub const CONTROLLER_ACCOUNT: (&str, &str) = ("kube-system", "clb-reconciler");

impl ApiServer {
    /// A client with the admin kubeconfig. Make it on the runtime that uses it.
    pub async fn admin(&self) -> kube::Client {
        clb_host::live::settings::connect(Some(&self.kubeconfig))
            .await
            .expect("connects to the test API server as admin")
    }

    /// Applies `examples/deploy/rbac.yaml` as admin (server-side apply, so every test may do it
    /// again), asks for a token of its ServiceAccount with the TokenRequest API, and writes a
    /// kubeconfig that carries only that token: the rights the example grants and no more. With
    /// `via`, the kubeconfig names that plain-HTTP URL (a [`crate::watch_proxy::WatchProxy`])
    /// instead of the API server.
    pub async fn controller_kubeconfig(&self, admin: &kube::Client, via: Option<&str>) -> PathBuf {
        let manifests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/deploy/rbac.yaml");
        apply_file(admin, &manifests).await;
        let (namespace, name) = CONTROLLER_ACCOUNT;
        let request: TokenRequest = serde_json::from_value(serde_json::json!({
            "spec": {"audiences": [], "expirationSeconds": 3600},
        }))
        .expect("a valid TokenRequest");
        let token = Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
            .create_token_request(name, &Default::default(), &request)
            .await
            .expect("the API server issues a ServiceAccount token")
            .status
            .expect("a TokenRequest answer has a status")
            .token;
        let admin_config = kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("reads the admin kubeconfig");
        let cluster = admin_config.clusters.first().and_then(|c| c.cluster.as_ref()).expect("one cluster");
        let server = match via {
            Some(url) => format!("server: {url}"),
            None => format!(
                "server: {}\n    certificate-authority-data: {}",
                cluster.server.as_deref().expect("a server URL"),
                cluster.certificate_authority_data.as_deref().expect("the CA"),
            ),
        };
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: clb-test\n  cluster:\n    {server}\n\
             users:\n- name: {name}\n  user:\n    token: {token}\n\
             contexts:\n- name: clb-test\n  context:\n    cluster: clb-test\n    user: {name}\n\
             current-context: clb-test\n",
        );
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = crate::process_dir().join(format!("controller-{}.kubeconfig", NEXT.fetch_add(1, Ordering::Relaxed)));
        std::fs::write(&path, kubeconfig).expect("writes the controller's kubeconfig");
        path
    }
}

/// Applies every document of a YAML file as `clb-tests` (server-side apply, forced), finding
/// each kind through discovery.
pub async fn apply_file(client: &kube::Client, path: &Path) {
    let unserved = apply_documents(client, &path.display().to_string(), &read(path), false).await;
    assert!(unserved.is_empty(), "{}: the API server does not serve {unserved:?}", path.display());
}

/// [`apply_file`] as a server-side dry run: the API server decodes, defaults, validates and
/// admits every object of a kind it serves as it would store it, and stores nothing. Panics with
/// the server's refusal; returns the kinds it does not serve (`group/version Kind`), whose
/// objects it could not judge.
pub async fn dry_run_file(client: &kube::Client, path: &Path) -> Vec<String> {
    apply_documents(client, &path.display().to_string(), &read(path), true).await
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Applies every document of `text` (from `origin`) as `clb-tests` (server-side apply, forced;
/// a dry run when `dry_run`), finding each kind through discovery. Panics with the server's
/// refusal; returns the kinds it does not serve (`group/version Kind`), whose objects it skipped.
pub async fn apply_documents(client: &kube::Client, origin: &str, text: &str, dry_run: bool) -> Vec<String> {
    use kube::api::{DynamicObject, Patch};
    use kube::discovery::{Scope, pinned_kind};
    let mut params = kube::api::PatchParams::apply("clb-tests").force();
    params.dry_run = dry_run;
    let objects: Vec<DynamicObject> = clb_executor::inputs::from_yaml_documents(Path::new(origin), text)
        .unwrap_or_else(|e| panic!("Kubernetes objects in {origin}: {e}"));
    let mut unserved = Vec::new();
    for object in objects {
        let types = object.types.clone().expect("apiVersion and kind");
        let gvk = kube::api::GroupVersionKind::try_from(&types).expect("a valid apiVersion");
        let (resource, capabilities) = match pinned_kind(client, &gvk).await {
            Ok(found) => found,
            Err(kube::Error::Api(status)) if status.code == 404 => {
                unserved.push(format!("{} {}", types.api_version, types.kind));
                continue;
            }
            Err(e) => panic!("{origin}: discovering {gvk:?}: {e}"),
        };
        let name = object.metadata.name.clone().expect("a name");
        let api: Api<DynamicObject> = match capabilities.scope {
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                object.metadata.namespace.as_deref().unwrap_or("default"),
                &resource,
            ),
            Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        api.patch(&name, &params, &Patch::Apply(&object))
            .await
            .unwrap_or_else(|e| panic!("{origin}: applying {} {name}: {e}", types.kind));
    }
    unserved
}
