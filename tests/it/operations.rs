//! Swaps in a running `clb-host run`, end to end against the test API server and the emulator:
//! a watched file and a watched ConfigMap, `clb-host swap` against the endpoint, the
//! pin, the self-check refusing a destructive version, and what an operator sees of each —
//! `/status`, `/metrics` and Events on the well-known ConfigMap.

use crate::kube::{emulated_azure, eventually, ingress_ips, manifest, reconcilers_slot};
use ::kube::api::{Api, DeleteParams, PostParams};
use clb_guest::tracker::STATE_VERSION;
use clb_host::live::control::EventTarget;
use clb_host::live::operations::{Operations, OperationsConfig, ShadowSource};
use clb_host::live::sources::{ConfigMapKey, LogicSource};
use clb_host::live::swap::{Sha256Pin, Signed};
use clb_sandbox::sha256_hex;
use clb_tests::apiserver::apiserver;
use clb_tests::*;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Service};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The HTTP endpoint of a `clb-host run` (in-process or a child process): `/status`, `/metrics`.
pub(crate) struct Endpoint {
    pub(crate) addr: SocketAddr,
}

impl Endpoint {
    pub(crate) async fn get(&self, path: &str) -> (u16, String) {
        let response = reqwest::get(format!("http://{}{path}", self.addr)).await.expect("the endpoint answers");
        (response.status().as_u16(), response.text().await.unwrap())
    }

    pub(crate) async fn status(&self) -> Value {
        self.try_status().await.unwrap_or_else(|why| panic!("/status: {why}"))
    }

    /// `/status`, or why not (a child process not listening yet, an answer other than 200).
    async fn try_status(&self) -> Result<Value, String> {
        let response = reqwest::get(format!("http://{}/status", self.addr)).await.map_err(|e| e.to_string())?;
        let code = response.status().as_u16();
        let text = response.text().await.map_err(|e| e.to_string())?;
        if code != 200 {
            return Err(format!("{code}: {text}"));
        }
        serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}: {text}"))
    }

    /// Waits until `/status` satisfies `done` (said as `what`) and returns it.
    pub(crate) async fn status_where(&self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        eventually(what, async || {
            let status = self.try_status().await?;
            if done(&status) { Ok(status) } else { Err(status.to_string()) }
        })
        .await
    }

    /// Waits until `/status` says the last swap's reason contains `what`.
    pub(crate) async fn last_reason(&self, what: &str) -> Value {
        self.status_where(&format!("a last swap saying {what:?} in /status"), |status| {
            status["lastSwap"]["reason"].as_str().is_some_and(|reason| reason.contains(what))
        })
        .await
    }

    /// `clb_supervisor_swaps_total` with `result` while the version `sha256` serves.
    pub(crate) async fn swaps_counted(&self, sha256: &str, result: &str) -> f64 {
        let metrics = self.get("/metrics").await.1;
        sample(
            &metrics,
            "clb_supervisor_swaps_total",
            &[&format!("sha256=\"{sha256}\""), &format!("result=\"{result}\"")],
        )
    }

    /// Waits until `/status` says the last swap had `result` (and `kind`, for a refusal).
    pub(crate) async fn last_swap(&self, result: &str, kind: Option<&str>) -> Value {
        self.status_where(&format!("a last swap {result} {kind:?} in /status"), |status| {
            let last = &status["lastSwap"];
            last["result"] == result && kind.is_none_or(|k| last["kind"] == k)
        })
        .await
    }
}

/// A `clb-host run` with its endpoint, on its own thread and runtime as in the binary.
pub(crate) struct Host {
    endpoint: Endpoint,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<Result<(), clb_host::live::settings::RunError>>,
    _azure: clb_emulator::EmulatorServer,
    /// What Azure holds, to check what the host reports against it.
    emulator: std::sync::Arc<clb_emulator::Emulator>,
}

/// What a test's host watches, pins, reports to and requires.
#[derive(Default)]
pub(crate) struct Options {
    pub(crate) source: Option<LogicSource>,
    pub(crate) pin: Option<Sha256Pin>,
    pub(crate) events: Option<EventTarget>,
    pub(crate) admin_token: Option<String>,
    /// `--probation-inputs`; the default when `None`.
    pub(crate) probation_inputs: Option<usize>,
    /// `--shadow-logic-file` or `--shadow-logic-configmap`, and its policy.
    pub(crate) shadow: Option<clb_host::live::operations::ShadowSource>,
    /// `--logic-verify-key`.
    pub(crate) verify_key: Option<clb_oci::signature::PublicKey>,
}

impl Host {
    pub(crate) async fn start(client: &::kube::Client, options: Options) -> Self {
        let Options { source, pin, events, admin_token, probation_inputs, shadow, verify_key } = options;
        let (emulator, azure, arm, config) = emulated_azure().await;
        let mut settings = clb_host::live::settings::Settings::new(client.clone(), arm, config, "clb-ops-test");
        if let Some(inputs) = probation_inputs {
            settings.probation_inputs = inputs;
        }
        let operations = OperationsConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin_token,
            source,
            pin,
            verify_key,
            events,
            limits: Default::default(),
            // Quick to notice a change, so the tests wait less; the product polls every 2 s.
            poll: Duration::from_millis(50),
            shadow,
            admission: None,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (bound, listening) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let operations = Operations::start(clb_tests::runtime(), &settings, operations).await.expect("binds");
                bound.send(operations.local_addr()).unwrap();
                operations
                    .run(builtin(), settings, async {
                        let _ = stopped.await;
                    })
                    .await
            })
        });
        let addr = listening.await.expect("the host starts");
        Self { endpoint: Endpoint { addr }, stop, thread, _azure: azure, emulator }
    }

    pub(crate) async fn stop(self) {
        self.stop.send(()).expect("the host is still running");
        let thread = self.thread;
        let result = tokio::task::spawn_blocking(move || thread.join()).await.unwrap();
        result.expect("the host thread did not panic").expect("the host stopped cleanly");
    }
}

impl std::ops::Deref for Host {
    type Target = Endpoint;
    fn deref(&self) -> &Endpoint {
        &self.endpoint
    }
}

/// Waits for an Event `reason` regarding the ConfigMap `name` and returns its message.
pub(crate) async fn event_on(
    client: &::kube::Client,
    namespace: &str,
    name: &str,
    reason: &str,
    with_uid: Option<&str>,
) -> Event {
    let events = Api::<Event>::namespaced(client.clone(), namespace);
    eventually(&format!("an Event {reason} regarding ConfigMap {namespace}/{name}"), async || {
        let listed = events.list(&Default::default()).await.map_err(|e| e.to_string())?;
        let found = listed.items.iter().find(|e| {
            e.reason.as_deref() == Some(reason)
                && e.involved_object.kind.as_deref() == Some("ConfigMap")
                && e.involved_object.name.as_deref() == Some(name)
                && with_uid.is_none_or(|uid| e.involved_object.uid.as_deref() == Some(uid))
        });
        let seen: Vec<_> = listed.items.iter().map(|e| (&e.reason, &e.involved_object.name, &e.message)).collect();
        found.cloned().ok_or_else(|| format!("{seen:?}"))
    })
    .await
}

/// Creates a Service the next guest (and not the built-in logic) warns about on every
/// observation, and waits for that Warning: proof that the next guest serves live inputs.
async fn next_guest_serves(client: &::kube::Client, namespace: &str) {
    create_service(client, namespace, "legacy", json!({"clb.test/legacy": "true"})).await;
    let events = Api::<Event>::namespaced(client.clone(), namespace);
    eventually("the next guest's LegacyAnnotation Warning on the new Service", async || {
        let listed = events.list(&Default::default()).await.map_err(|e| e.to_string())?;
        let reasons: Vec<_> = listed.items.iter().map(|e| e.reason.clone()).collect();
        let found = listed.items.iter().any(|e| {
            e.reason.as_deref() == Some("LegacyAnnotation") && e.involved_object.name.as_deref() == Some("legacy")
        });
        if found { Ok(()) } else { Err(format!("{reasons:?}")) }
    })
    .await;
    // Gone before the host stops (it removes its finalizer): the API server keeps a deleted
    // namespace's objects, and a later test's host would list this one, which the next guest
    // answers differently from the built-in logic — a staged swap's replay would not match.
    let services = Api::<Service>::namespaced(client.clone(), namespace);
    services.delete("legacy", &DeleteParams::default()).await.expect("deletes the legacy Service");
    eventually("the legacy Service gone", async || match services.get_opt("legacy").await {
        Ok(None) => Ok(()),
        other => Err(format!("{other:?}")),
    })
    .await;
}

/// A LoadBalancer Service the logic provisions (no endpoints needed).
pub(crate) async fn create_service(client: &::kube::Client, namespace: &str, name: &str, annotations: Value) {
    let service: Service = manifest(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": [{"port": 80, "protocol": "TCP"}]},
    }));
    Api::<Service>::namespaced(client.clone(), namespace).create(&PostParams::default(), &service).await.unwrap();
}

/// Waits until each of the Services named has its one ingress IP.
pub(crate) async fn provisioned(client: &::kube::Client, namespace: &str, names: &[&str]) {
    let services = Api::<Service>::namespaced(client.clone(), namespace);
    for name in names {
        eventually(&format!("the Service {name} provisioned"), async || {
            let service = services.get(name).await.map_err(|e| e.to_string())?;
            if ingress_ips(&service).len() == 1 { Ok(()) } else { Err(format!("{:?}", service.status)) }
        })
        .await;
    }
}

/// Deletes the Services whose names start with `prefix` and waits until they are gone (the
/// serving logic releases its finalizer), before the next test's host lists them.
pub(crate) async fn delete_services(client: &::kube::Client, namespace: &str, prefix: &str) {
    let services = Api::<Service>::namespaced(client.clone(), namespace);
    let named = |listed: &::kube::api::ObjectList<Service>| -> Vec<String> {
        listed.items.iter().filter_map(|s| s.metadata.name.clone()).filter(|n| n.starts_with(prefix)).collect()
    };
    for name in named(&services.list(&Default::default()).await.unwrap()) {
        services.delete(&name, &DeleteParams::default()).await.unwrap();
    }
    eventually(&format!("the Services {prefix}* gone"), async || {
        let left = named(&services.list(&Default::default()).await.map_err(|e| e.to_string())?);
        if left.is_empty() { Ok(()) } else { Err(format!("{left:?}")) }
    })
    .await;
}

/// Changes the endpoints of the Service `name` (UID `uid`) `rounds` times, 20 ms apart, on a
/// task of its own: a bounded churn of EndpointSlice updates.
fn churn(client: &::kube::Client, namespace: &str, name: &str, uid: &str, rounds: u32) -> tokio::task::JoinHandle<()> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), namespace);
    let (name, uid) = (name.to_owned(), uid.to_owned());
    tokio::spawn(async move {
        for round in 0..rounds {
            let slice: EndpointSlice = manifest(json!({
                "metadata": {
                    "name": format!("{name}-churn"),
                    "labels": {"kubernetes.io/service-name": name},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name, "uid": uid}],
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [format!("10.244.9.{}", 1 + round % 200)], "conditions": {"ready": true}}],
            }));
            let params = ::kube::api::PatchParams::apply("churn").force();
            slices.patch(&format!("{name}-churn"), &params, &::kube::api::Patch::Apply(&slice)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// The value of the one sample of `name` whose line contains every fragment.
pub(crate) fn sample(exposition: &str, name: &str, fragments: &[&str]) -> f64 {
    let found: Vec<f64> = exposition
        .lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name) && fragments.iter().all(|f| l.contains(f)))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(found.len(), 1, "one sample of {name} with {fragments:?} in:\n{exposition}");
    found[0]
}

fn temp_dir(test: &str) -> PathBuf {
    let dir = process_dir().join(format!("ops-{test}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Replaces `path` the way an operator should: write beside it, then rename over it.
pub(crate) fn replace_file(path: &Path, bytes: &[u8]) {
    let staged = path.with_extension("staged");
    std::fs::write(&staged, bytes).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

/// Runs `test` against the test API server in a namespace of its own, deleted afterwards.
pub(crate) fn in_namespace(name: &str, test: impl AsyncFnOnce(&::kube::Client, &str)) {
    let server = apiserver();
    // Hosts watch every namespace: they take turns with the other tests' reconcilers.
    let _turn = reconcilers_slot();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let client =
            clb_host::live::settings::connect(Some(&server.kubeconfig)).await.expect("connects to the test API server");
        let namespaces = Api::<Namespace>::all(client.clone());
        let namespace = format!("clb-ops-{name}-{}", std::process::id());
        let created = manifest(json!({"metadata": {"name": namespace}}));
        namespaces.create(&PostParams::default(), &created).await.expect("creates the namespace");
        test(&client, &namespace).await;
        namespaces.delete(&namespace, &DeleteParams::default()).await.expect("deletes the namespace");
    });
}

#[test]
fn a_logic_file_is_swapped_in_at_start_and_a_change_the_running_version_cannot_take_is_refused() {
    in_namespace("file", async |client, ns| {
        let file = temp_dir("file").join("logic.wasm");
        std::fs::write(&file, NEXT_GUEST).unwrap();
        let events = EventTarget { namespace: ns.to_owned(), name: "clb-swaps".into() };
        let host = Host::start(
            client,
            Options { source: Some(LogicSource::File(file.clone())), events: Some(events), ..Default::default() },
        )
        .await;
        let (builtin_sha, next_sha) = (builtin().info().sha256.clone(), sha256_hex(NEXT_GUEST));

        let status = host.last_swap("accepted", None).await;
        assert_eq!(status["active"]["sha256"], next_sha, "{status}");
        assert_eq!(status["previous"]["sha256"], builtin_sha, "the built-in version is kept for a rollback: {status}");
        let last = &status["lastSwap"];
        assert_eq!(last["origin"], format!("file {}", file.display()), "{status}");
        assert_eq!((last["from"].as_str(), last["to"].as_str()), (Some(&builtin_sha[..12]), Some(&next_sha[..12])));
        let next_version = STATE_VERSION + 1;
        assert_eq!(
            last["stateToVersion"], next_version,
            "the next guest re-exports the state one version up: {status}"
        );
        assert!(last["at"].as_str().is_some_and(|at| at.ends_with('Z')), "{status}");
        assert_eq!(status["quarantinedInputs"], 0);
        assert!(status["stateBytes"].as_u64().is_some_and(|b| b > 0), "{status}");
        // A wasm memory grows by 64 KiB pages.
        let memory = status["guestMemoryBytes"].as_u64().expect("the serving tracker's memory");
        assert!(memory > 0 && memory % 65_536 == 0, "{status}");
        let swapped = event_on(client, ns, "clb-swaps", "LogicSwapped", None).await;
        assert_eq!(swapped.type_.as_deref(), Some("Normal"));
        assert!(swapped.message.as_deref().is_some_and(|m| m.contains(&next_sha)), "{swapped:?}");
        next_guest_serves(client, ns).await;
        eventually("ready: the lists delivered and the tracker idle", async || match host.get("/readyz").await {
            (200, _) => Ok(()),
            other => Err(format!("{other:?}")),
        })
        .await;

        // The built-in logic cannot read the next guest's state version: the change is refused
        // and the next guest keeps serving.
        replace_file(&file, clb_sandbox::BUILTIN_GUEST);
        let status = host.last_swap("refused", Some("state-refused")).await;
        assert_eq!(status["active"]["sha256"], next_sha, "{status}");
        assert!(
            status["lastSwap"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains(&format!("unsupported state version {next_version}"))),
            "{status}"
        );
        let refused = event_on(client, ns, "clb-swaps", "LogicSwapRefused", None).await;
        assert_eq!(refused.type_.as_deref(), Some("Warning"));
        let metrics = host.get("/metrics").await.1;
        let serving = format!("sha256=\"{next_sha}\"");
        assert_eq!(sample(&metrics, "clb_logic_serving", &[&serving]), 1.0);
        // `run`'s own counters are tracked too (CLB mode: no pool updater ticks).
        assert_eq!(sample(&metrics, "clb_pool_updater_ticks_total", &["result=\"busy\""]), 0.0);
        assert!(sample(&metrics, "clb_guest_memories_total", &["origin=\"mapped\""]) > 0.0);
        assert_eq!(sample(&metrics, "clb_supervisor_swaps_total", &[&serving, "result=\"accepted\""]), 1.0);
        assert_eq!(sample(&metrics, "clb_supervisor_swaps_total", &[&serving, "result=\"state-refused\""]), 1.0);

        host.stop().await;
    });
}

#[test]
fn a_logic_file_whose_sha256_is_not_the_pinned_one_is_refused_before_load_until_the_pinned_bytes_arrive() {
    in_namespace("pin", async |client, ns| {
        let file = temp_dir("pin").join("logic.wasm");
        std::fs::write(&file, DESTRUCTIVE_GUEST).unwrap();
        let pin = Sha256Pin::parse(&sha256_hex(NEXT_GUEST)).unwrap();
        let events = EventTarget { namespace: ns.to_owned(), name: "clb-swaps".into() };
        let host = Host::start(
            client,
            Options {
                source: Some(LogicSource::File(file.clone())),
                pin: Some(pin),
                events: Some(events),
                ..Default::default()
            },
        )
        .await;

        let status = host.last_swap("refused", Some("digest")).await;
        let builtin_sha = builtin().info().sha256.clone();
        assert_eq!(status["active"]["sha256"], builtin_sha, "the built-in version keeps serving: {status}");
        assert_eq!(status["lastSwap"]["sha256"], sha256_hex(DESTRUCTIVE_GUEST), "{status}");
        assert!(status["lastSwap"]["reason"].as_str().is_some_and(|r| r.contains("is pinned")), "{status}");
        assert_eq!(status["swaps"], json!({"digest": 1}), "nothing reached the supervisor: {status}");
        let metrics = host.get("/metrics").await.1;
        assert_eq!(sample(&metrics, "clb_supervisor_swaps_total", &["result=\"digest\""]), 1.0);
        let refused = event_on(client, ns, "clb-swaps", "LogicSwapRefused", None).await;
        assert!(refused.message.as_deref().is_some_and(|m| m.contains("(digest)")), "{refused:?}");

        replace_file(&file, NEXT_GUEST);
        let status = host.last_swap("accepted", None).await;
        assert_eq!(status["active"]["sha256"], sha256_hex(NEXT_GUEST), "{status}");

        host.stop().await;
    });
}

#[test]
fn a_logic_configmap_swaps_through_the_api_server_and_a_version_the_self_check_refuses_leaves_the_old_one_serving() {
    use base64::Engine as _;
    in_namespace("configmap", async |client, ns| {
        let configmaps = Api::<ConfigMap>::namespaced(client.clone(), ns);
        let created = configmaps
            .create(
                &PostParams::default(),
                &ConfigMap {
                    metadata: manifest(json!({"name": "clb-logic"})),
                    // Compressed, as docs/operations.md says: a component (the next guest is over
                    // 1 MiB) does not fit a ConfigMap's 1 MiB as it is.
                    binary_data: Some([("logic.wasm".to_owned(), k8s_openapi::ByteString(gzip(NEXT_GUEST)))].into()),
                    ..Default::default()
                },
            )
            .await
            .expect("creates the ConfigMap");
        let uid = created.metadata.uid.clone().unwrap();
        let source = LogicSource::ConfigMap(ConfigMapKey::parse(&format!("{ns}/clb-logic:logic.wasm")).unwrap());
        let host = Host::start(client, Options { source: Some(source), ..Default::default() }).await;
        let next_sha = sha256_hex(NEXT_GUEST);

        let status = host.last_swap("accepted", None).await;
        assert_eq!(status["active"]["sha256"], next_sha, "{status}");
        assert_eq!(status["lastSwap"]["origin"], format!("configmap {ns}/clb-logic:logic.wasm"));
        // With no other target named, the Events regard the source ConfigMap itself.
        event_on(client, ns, "clb-logic", "LogicSwapped", Some(&uid)).await;

        // The destructive variant, as base64 text in `data` this time.
        let text = base64::engine::general_purpose::STANDARD.encode(gzip(DESTRUCTIVE_GUEST));
        let mut changed = created.clone();
        changed.binary_data = None;
        changed.data = Some([("logic.wasm".to_owned(), text)].into());
        changed.metadata.resource_version = None;
        configmaps.replace("clb-logic", &PostParams::default(), &changed).await.expect("updates the ConfigMap");
        let status = host.last_swap("refused", Some("self-check")).await;
        assert_eq!(status["active"]["sha256"], next_sha, "the next guest keeps serving: {status}");
        let reason = status["lastSwap"]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("LoadBalancer next-guest-destructive-tick"), "{status}");
        let refused = event_on(client, ns, "clb-logic", "LogicSwapRefused", Some(&uid)).await;
        assert_eq!(refused.type_.as_deref(), Some("Warning"));
        assert!(refused.message.as_deref().is_some_and(|m| m.contains("(self-check)")), "{refused:?}");
        let metrics = host.get("/metrics").await.1;
        let serving = format!("sha256=\"{next_sha}\"");
        assert_eq!(sample(&metrics, "clb_supervisor_swaps_total", &[&serving, "result=\"self-check\""]), 1.0);
        assert_eq!(sample(&metrics, "clb_logic_serving", &[&serving]), 1.0);
        // Inputs after the refusal go to the version that kept serving.
        next_guest_serves(client, ns).await;

        host.stop().await;
    });
}

/// `clb-host swap ARGS`, in-process on a blocking thread (it runs its own runtime).
pub(crate) async fn clb_host_swap(args: Vec<String>) -> (u8, String, String) {
    tokio::task::spawn_blocking(move || {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let args = ["clb-host".to_owned(), "swap".to_owned()].into_iter().chain(args);
        let code = clb_host::cli::run(args, &mut out, &mut err);
        (code, String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap())
    })
    .await
    .unwrap()
}

#[test]
fn clb_host_swap_asks_the_running_host_and_prints_what_it_did_with_the_exit_code() {
    in_namespace("admin", async |client, ns| {
        let events = EventTarget { namespace: ns.to_owned(), name: "clb-swaps".into() };
        let host = Host::start(client, Options { events: Some(events), ..Default::default() }).await;
        let dir = temp_dir("admin");
        let file = |name: &str, bytes: &[u8]| {
            let path = dir.join(name);
            std::fs::write(&path, bytes).unwrap();
            path.display().to_string()
        };
        let (next, destructive) = (file("next.wasm", NEXT_GUEST), file("destructive.wasm", DESTRUCTIVE_GUEST));
        let wasi = wat::parse_str(r#"(component (import "wasi:filesystem/types@0.2.0" (instance)))"#).unwrap();
        let wasi = file("wasi.wasm", &wasi);
        let endpoint = format!("http://{}", host.addr);
        let (b, n) = (builtin().info().sha256.clone(), sha256_hex(NEXT_GUEST));
        let swap = |to: &str, extra: &[&str]| {
            let mut args = vec!["--to".to_owned(), to.to_owned(), "--endpoint".to_owned(), endpoint.clone()];
            args.extend(extra.iter().map(|a| a.to_string()));
            clb_host_swap(args)
        };

        let wrong_pin = sha256_hex(b"something else");
        let cases: [(&str, &[&str], u8, String); 5] = [
            (&next, &[], 0, format!("accepted: {} → {} (sha256 {n})", &b[..12], &n[..12])),
            (&next, &["--sha256", &n], 0, format!("unchanged: {} is already serving", &n[..12])),
            (&destructive, &[], 1, "refused (self-check): swap refused: at the self-check tick".into()),
            (&next, &["--sha256", &wrong_pin], 1, format!("refused (digest): the sha256 of the component is {n}")),
            (&wasi, &[], 1, "refused (load): swap refused: the new component cannot be loaded: the component imports `wasi:filesystem/types@0.2.0`".into()),
        ];
        for (to, extra, code, printed) in cases {
            let (got, out, err) = swap(to, extra).await;
            assert_eq!(got, code, "{to} {extra:?}: {out}{err}");
            assert!(out.contains(&printed), "{to} {extra:?}: expected {printed:?} in:\n{out}{err}");
        }
        let status = host.status().await;
        assert_eq!(status["active"]["sha256"], n, "{status}");
        assert_eq!(status["swaps"], json!({"accepted": 1, "self-check": 1, "digest": 1, "load": 1}), "{status}");
        assert_eq!(status["lastSwap"]["kind"], "load", "{status}");
        assert!(
            status["lastSwap"]["origin"].as_str().is_some_and(|o| o.starts_with("endpoint 127.0.0.1:")),
            "{status}"
        );
        event_on(client, ns, "clb-swaps", "LogicSwapped", None).await;
        event_on(client, ns, "clb-swaps", "LogicSwapRefused", None).await;

        // Nothing listens there any more once the host stopped: exit 2, with why.
        host.stop().await;
        let (code, out, err) = swap(&next, &[]).await;
        assert_eq!(code, 2, "{out}{err}");
        assert!(err.contains("no answer"), "{err}");
    });
}

#[test]
fn with_an_admin_token_a_swap_is_taken_only_from_a_caller_presenting_it() {
    in_namespace("token", async |client, ns| {
        let events = EventTarget { namespace: ns.to_owned(), name: "clb-swaps".into() };
        let token = "correct horse battery staple";
        let options = Options { events: Some(events), admin_token: Some(token.into()), ..Default::default() };
        let host = Host::start(client, options).await;
        let dir = temp_dir("token");
        let (next, right, wrong) = (dir.join("next.wasm"), dir.join("token"), dir.join("wrong-token"));
        std::fs::write(&next, NEXT_GUEST).unwrap();
        std::fs::write(&right, format!("{token}\n")).unwrap();
        std::fs::write(&wrong, "guess").unwrap();
        let swap = |token_file: Option<&Path>| {
            let mut args =
                vec!["--to".into(), next.display().to_string(), "--endpoint".into(), format!("http://{}", host.addr)];
            if let Some(file) = token_file {
                args.extend(["--token-file".into(), file.display().to_string()]);
            }
            clb_host_swap(args)
        };

        for denied in [None, Some(wrong.as_path())] {
            let (code, out, err) = swap(denied).await;
            assert_eq!(code, 2, "{denied:?}: {out}{err}");
            assert!(err.contains("403") && err.contains("admin token"), "{denied:?}: {err}");
        }
        let metrics = host.get("/metrics").await.1;
        assert_eq!(sample(&metrics, "clb_swap_requests_denied_total", &[]), 2.0);
        assert!(host.status().await["lastSwap"].is_null(), "a denied request is no swap attempt");
        let (code, out, err) = swap(Some(&right)).await;
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.starts_with("accepted: "), "{out}");
        host.stop().await;
    });
}

#[test]
fn run_refuses_two_logic_sources_a_pin_without_one_a_malformed_pin_or_reference_and_half_a_webhook_before_it_connects()
{
    let cases: [(&[&str], &str); 7] = [
        (&["--logic-file", "a.wasm", "--logic-configmap", "ns/cm:key"], "cannot be used with"),
        (&["--admission-listen", "127.0.0.1:0"], "--tls-cert-file <CERT>"),
        (&["--tls-cert-file", "tls.crt", "--tls-key-file", "tls.key"], "--admission-listen <ADDR>"),
        (&["--logic-file", "a.wasm", "--logic-sha256", "abc"], "is not a sha256"),
        (&["--logic-sha256", &"ab".repeat(32)], "--logic-file <PATH>|--logic-configmap"),
        (&["--logic-configmap", "cm:key"], "does not name a ConfigMap key as NAMESPACE/NAME:KEY"),
        (&["--swap-events-configmap", "just-a-name"], "does not name an object as NAMESPACE/NAME"),
    ];
    for (args, expected) in cases {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let all = ["clb-host", "run", "--cloud-config", "azure.json"].iter().chain(args);
        let code = clb_host::cli::run(all, &mut out, &mut err);
        let err = String::from_utf8(err).unwrap();
        assert_eq!(code, clb_host::cli::EXIT_BAD_INPUT, "{args:?}: {err}");
        assert!(err.contains(expected), "{args:?}: expected {expected:?} in {err}");
    }
}

/// Asks `host` for a swap to `bytes` with `clb-host swap` while `SERVICES` Services are created
/// one after the other: whichever way they interleave with the staging and the switch, every
/// watch event must reach one version, once. What `clb-host swap` answered.
async fn swap_during_a_burst(client: &::kube::Client, ns: &str, host: &Host, bytes: &[u8]) -> (u8, String, String) {
    let file = temp_dir(ns).join("logic.wasm");
    std::fs::write(&file, bytes).unwrap();
    let args = vec!["--to".into(), file.display().to_string(), "--endpoint".into(), format!("http://{}", host.addr)];
    let create = async {
        for i in 0..SERVICES {
            create_service(client, ns, &format!("web-{i}"), json!({})).await;
        }
    };
    let ((), answer) = tokio::join!(create, clb_host_swap(args));
    answer
}

/// Services [`swap_during_a_burst`] creates.
const SERVICES: usize = 8;

/// Waits until the burst's Services all have their one ingress IP.
async fn every_service_provisioned(client: &::kube::Client, ns: &str) {
    let services = Api::<Service>::namespaced(client.clone(), ns);
    eventually("every Service provisioned with one ingress IP", async || {
        let listed = services.list(&Default::default()).await.map_err(|e| e.to_string())?;
        let ips: Vec<_> = listed.items.iter().map(|s| (s.metadata.name.clone(), ingress_ips(s))).collect();
        if ips.len() == SERVICES && ips.iter().all(|(_, ips)| ips.len() == 1) {
            Ok(())
        } else {
            Err(format!("{ips:?}"))
        }
    })
    .await;
}

#[test]
fn a_swap_requested_while_services_are_created_is_staged_every_service_is_provisioned_and_the_new_version_serves_what_follows()
 {
    in_namespace("during", async |client, ns| {
        let events = EventTarget { namespace: ns.to_owned(), name: "clb-swaps".into() };
        let host = Host::start(client, Options { events: Some(events), ..Default::default() }).await;

        let (code, out, err) = swap_during_a_burst(client, ns, &host, NEXT_GUEST).await;
        assert_eq!(code, 0, "{out}{err}");
        // Staged: the state moved beside serving and the switch replayed what came meanwhile.
        assert!(out.contains("beside serving; inputs waited") && out.contains("replayed at the switch"), "{out}");
        every_service_provisioned(client, ns).await;
        let status = host.status().await;
        assert_eq!(status["active"]["sha256"], sha256_hex(NEXT_GUEST), "{status}");
        assert_eq!(status["quarantinedInputs"], 0, "{status}");
        let last = &status["lastSwap"];
        assert_eq!(last["result"], "accepted", "{status}");
        let replayed = last["replayedInputs"].as_u64().expect("a staged swap reports the inputs it replayed");
        assert!(out.contains(&format!("({replayed} replayed at the switch)")), "the same count: {out}\n{status}");
        let swapped = event_on(client, ns, "clb-swaps", "LogicSwapped", None).await;
        assert!(swapped.message.as_deref().is_some_and(|m| m.contains("beside serving")), "{swapped:?}");
        next_guest_serves(client, ns).await;
        host.stop().await;
    });
}

// Regression: the probation journal began as a copy of the inputs since the last checkpoint, so
// a swap into a busy controller ended its probation at once and three quarantines never rolled
// back. And: a staged swap after a restart reported the empty start-up checkpoint's size as the
// state it moved.
#[test]
fn a_staged_swap_in_run_serves_its_probation_on_its_own_inputs_and_three_traps_in_it_roll_back() {
    in_namespace("probation", async |client, ns| {
        // Far fewer inputs than the Services below cost before the swap (each one an
        // observation and the outcomes of its writes), and more than the new version takes
        // before the traps (its self-check tick).
        let options = Options { probation_inputs: Some(8), ..Default::default() };
        let host = Host::start(client, options).await;
        for i in 0..SERVICES {
            create_service(client, ns, &format!("web-{i}"), json!({})).await;
        }
        every_service_provisioned(client, ns).await;

        let file = temp_dir(ns).join("logic.wasm");
        std::fs::write(&file, NEXT_GUEST).unwrap();
        let args =
            vec!["--to".into(), file.display().to_string(), "--endpoint".into(), format!("http://{}", host.addr)];
        let (code, out, err) = clb_host_swap(args).await;
        assert_eq!(code, 0, "{out}{err}");
        let status = host.status().await;
        assert_eq!(status["active"]["sha256"], sha256_hex(NEXT_GUEST), "{status}");
        assert_eq!(status["previous"]["sha256"], builtin().info().sha256, "on probation: {status}");
        let last = &status["lastSwap"];
        let (from, to) = (last["stateFromBytes"].as_u64().unwrap(), last["stateToBytes"].as_u64().unwrap());
        assert!(to > from, "the state moved holds {SERVICES} Services, the start-up checkpoint none: {status}");
        assert_eq!(status["stateBytes"], last["stateToBytes"], "the moved state is the checkpoint now: {status}");

        // The next guest's trap trigger (`tests/next-guest`, `PANIC_ANNOTATION`).
        let trap = json!({"clb.test/panic-on-observe": "true"});
        for n in 0..3 {
            create_service(client, ns, &format!("boom-{n}"), trap.clone()).await;
        }
        let status = host.last_swap("rolled-back", None).await;
        assert_eq!(status["active"]["sha256"], builtin().info().sha256, "{status}");
        assert!(status["previous"].is_null(), "{status}");
        assert_eq!(
            (status["rollbacks"].as_u64(), status["quarantinedInputs"].as_u64()),
            (Some(1), Some(3)),
            "{status}"
        );
        let reason = status["lastSwap"]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("3 inputs were quarantined within its probation"), "{status}");

        // The built-in logic serves what follows, with every Service the new version took, and
        // the three it quarantined, which the rollback delivered to it.
        create_service(client, ns, "after", json!({})).await;
        provisioned(client, ns, &["after", "boom-0", "boom-1", "boom-2"]).await;
        delete_services(client, ns, "boom").await;
        host.stop().await;
    });
}

// Regression: a swapped-in version was rolled back only after three quarantined inputs *in a
// row*; in a busy controller other inputs always come between two bad ones, so a version that
// trapped on every new Service of a kind kept serving, and its probation ended.
#[test]
fn a_swapped_in_version_in_run_that_quarantines_three_services_among_a_churn_of_endpoint_changes_is_rolled_back() {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    in_namespace("churn", async |client, ns| {
        let host = Host::start(client, Options::default()).await;
        create_service(client, ns, "web", json!({})).await;
        provisioned(client, ns, &["web"]).await;
        let web = Api::<Service>::namespaced(client.clone(), ns).get("web").await.unwrap();
        let uid = web.metadata.uid.expect("a UID");

        let file = temp_dir(ns).join("logic.wasm");
        std::fs::write(&file, NEXT_GUEST).unwrap();
        let args =
            vec!["--to".into(), file.display().to_string(), "--endpoint".into(), format!("http://{}", host.addr)];
        let (code, out, err) = clb_host_swap(args).await;
        assert_eq!(code, 0, "{out}{err}");

        // A churn of endpoint changes on `web` for as long as the traps take: a bounded loop.
        let slices = Api::<EndpointSlice>::namespaced(client.clone(), ns);
        let churn = churn(client, ns, "web", &uid, 300);
        let inputs = |status: &Value| status["inputs"].as_u64().unwrap_or_default();
        let before = inputs(&host.status().await);
        let trap = json!({"clb.test/panic-on-observe": "true"});
        for n in 0..3 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            create_service(client, ns, &format!("boom-{n}"), trap.clone()).await;
        }
        let status = host.last_swap("rolled-back", None).await;
        churn.abort();
        assert_eq!(status["active"]["sha256"], builtin().info().sha256, "{status}");
        assert_eq!(
            (status["rollbacks"].as_u64(), status["quarantinedInputs"].as_u64()),
            (Some(1), Some(3)),
            "{status}"
        );
        assert!(inputs(&status) > before + 10, "the churn's inputs were served between the traps: {status}");
        // The three Services are the built-in logic's now, and so is the churn.
        provisioned(client, ns, &["boom-0", "boom-1", "boom-2"]).await;
        delete_services(client, ns, "boom").await;
        slices.delete("web-churn", &DeleteParams::default()).await.unwrap();
        host.stop().await;
    });
}
#[test]
fn a_staged_swap_the_self_check_refuses_leaves_the_old_version_serving_with_every_input_it_took() {
    in_namespace("refused-during", async |client, ns| {
        let host = Host::start(client, Default::default()).await;

        let (code, out, err) = swap_during_a_burst(client, ns, &host, DESTRUCTIVE_GUEST).await;
        assert_eq!(code, 1, "{out}{err}");
        assert!(out.contains("refused (self-check)"), "{out}");
        // The old version took every Service, those delivered while the refused one staged too.
        every_service_provisioned(client, ns).await;
        let status = host.status().await;
        assert_eq!(status["active"]["sha256"], builtin().info().sha256, "{status}");
        assert_eq!(status["swaps"], json!({"self-check": 1}), "{status}");
        assert_eq!(status["quarantinedInputs"], 0, "{status}");
        // And serves what follows: one more Service, provisioned by it.
        create_service(client, ns, "after", json!({})).await;
        let services = Api::<Service>::namespaced(client.clone(), ns);
        eventually("the Service created after the refusal provisioned", async || {
            let after = services.get("after").await.map_err(|e| e.to_string())?;
            if ingress_ips(&after).len() == 1 { Ok(()) } else { Err(format!("{:?}", after.status)) }
        })
        .await;
        assert_eq!(host.status().await["active"]["sha256"], builtin().info().sha256);
        host.stop().await;
    });
}

#[test]
fn a_swap_staging_when_its_term_ends_is_staged_again_by_the_next_term_and_answered_once() {
    use clb_host::live::control::{Control, ControlEvent};
    use clb_host::live::swap::SwapResult;
    use clb_sandbox::supervisor::{Supervisor, version_name};
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    tokio.block_on(async {
        let metrics = clb_host::live::metrics::Metrics::new();
        let (mut control, sender) = Control::new(clb_tests::runtime(), Default::default(), metrics.clone());
        let asked = tokio::spawn(async move {
            sender.swap(NEXT_GUEST.to_vec(), Signed::detached(None, "the test"), None, "test").await
        });

        // A term stages the swap and ends (leadership lost) before the import comes back.
        let mut first = crate::supervisor::start(Supervisor::new(builtin()));
        let ControlEvent::Request(request) = control.next().await else { panic!("a request comes first") };
        assert!(control.begin(&mut first, request, 10).is_none(), "staged: nothing switched yet");
        assert!(control.is_staging());
        drop(first);

        // The next term stages it again against its own supervisor, and switches.
        control.start_term();
        assert!(!control.is_staging(), "the stale import is dropped");
        let mut second = crate::supervisor::start(Supervisor::new(builtin()));
        let ControlEvent::Request(request) = control.next().await else { panic!("the request is taken again") };
        assert!(control.begin(&mut second, request, 20).is_none());
        let ControlEvent::Imported(imported) = control.next().await else { panic!("the import ends") };
        assert!(control.finish(&mut second, imported, 30).is_some(), "accepted: the first step to carry out");

        let answer = asked.await.unwrap().expect("answered, not dropped");
        assert!(matches!(answer, SwapResult::Accepted { replayed_inputs: Some(_), .. }), "{answer:?}");
        assert_eq!(version_name(second.logic()), sha256_hex(NEXT_GUEST)[..12]);
        let status = metrics.status();
        let last = status.last_swap.expect("the swap is recorded");
        assert_eq!((last.origin.as_str(), &last.result), ("test", &answer), "recorded once, as answered");
    });
}

/// `POST /swap` of `body` (with the pin header when given): the status and the JSON answer.
pub(crate) async fn post_swap(host: &Host, body: Vec<u8>, pin: Option<&str>) -> (u16, Value) {
    let mut request = reqwest::Client::new().post(format!("http://{}/swap", host.addr)).body(body);
    if let Some(pin) = pin {
        request = request.header(clb_host::live::endpoint::SHA256_HEADER, pin);
    }
    let response = request.send().await.expect("the endpoint answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("{status}: not JSON: {text}")))
}

#[test]
fn a_gzip_or_zstd_component_swaps_through_post_swap_pinned_by_the_sha256_of_the_decompressed_component() {
    in_namespace("compressed", async |client, ns| {
        let events = EventTarget { namespace: ns.to_owned(), name: "clb-swaps".into() };
        let host = Host::start(client, Options { events: Some(events), ..Default::default() }).await;
        let (builtin_sha, next_sha) = (builtin().info().sha256.clone(), sha256_hex(NEXT_GUEST));
        let (zstd_next, gzip_next) = (zstd(NEXT_GUEST), gzip(NEXT_GUEST));

        // A pin names the component, not the bytes it travels in.
        let (code, answer) = post_swap(&host, zstd_next.clone(), Some(&sha256_hex(&zstd_next))).await;
        assert_eq!((code, &answer["kind"]), (409, &json!("digest")), "{answer}");
        assert!(answer["reason"].as_str().is_some_and(|r| r.contains(&format!("of the component is {next_sha}"))));
        // Compressed bytes that give no component: 400, refused before anything compiles.
        let bad: [(Vec<u8>, &str); 3] = [
            (zstd_next[..zstd_next.len() - 8].to_vec(), "the zstd stream is truncated or corrupt"),
            (gzip(&gzip_next), "the gzip stream holds a gzip stream"),
            ([gzip_next.as_slice(), &b"junk"[..]].concat(), "4 bytes follow the end of the gzip stream"),
        ];
        for (body, reason) in bad {
            let (code, answer) = post_swap(&host, body, None).await;
            assert_eq!((code, &answer["result"], &answer["kind"]), (400, &json!("refused"), &json!("decompress")));
            assert!(answer["reason"].as_str().is_some_and(|r| r.contains(reason)), "expected {reason:?}: {answer}");
        }
        assert_eq!(host.status().await["active"]["sha256"], builtin_sha, "the built-in version keeps serving");

        // `clb-host swap` sends a zstd file as it is, pinned by the component's sha256.
        let dir = temp_dir("compressed");
        let file = |name: &str, bytes: &[u8]| {
            let path = dir.join(name);
            std::fs::write(&path, bytes).unwrap();
            path.display().to_string()
        };
        let endpoint = format!("http://{}", host.addr);
        let swap = |to: String, extra: &[&str]| {
            let mut args = vec!["--to".to_owned(), to, "--endpoint".to_owned(), endpoint.clone()];
            args.extend(extra.iter().map(|a| a.to_string()));
            clb_host_swap(args)
        };
        let (code, out, err) = swap(file("next.wasm.zst", &zstd_next), &["--sha256", &next_sha]).await;
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.contains(&format!("accepted: {} → {} (sha256 {next_sha})", &builtin_sha[..12], &next_sha[..12])));
        // The same component gzipped is the same version.
        let (code, out, err) = swap(file("next.wasm.gz", &gzip_next), &[]).await;
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.contains(&format!("unchanged: {} is already serving", &next_sha[..12])), "{out}");
        // A file that does not decompress is refused by `clb-host swap` itself: exit 2.
        let (code, out, err) = swap(file("truncated.wasm.gz", &gzip_next[..100]), &[]).await;
        assert_eq!(code, 2, "{out}{err}");
        assert!(err.contains("not a component: the gzip stream is truncated or corrupt"), "{err}");

        let status = host.status().await;
        assert_eq!(status["active"]["sha256"], next_sha, "{status}");
        assert_eq!(status["swaps"], json!({"accepted": 1, "digest": 1, "decompress": 3}), "{status}");
        let metrics = host.get("/metrics").await.1;
        assert_eq!(sample(&metrics, "clb_supervisor_swaps_total", &["result=\"decompress\""]), 3.0);
        let refused = event_on(client, ns, "clb-swaps", "LogicSwapRefused", None).await;
        assert_eq!(refused.type_.as_deref(), Some("Warning"));
        host.stop().await;
    });
}

#[test]
fn a_zstd_component_in_a_configmap_swaps_in_under_its_pin_and_a_truncated_one_is_refused_with_a_warning() {
    in_namespace("compressed-configmap", async |client, ns| {
        let configmaps = Api::<ConfigMap>::namespaced(client.clone(), ns);
        let holding = |bytes: Vec<u8>| ConfigMap {
            metadata: manifest(json!({"name": "clb-logic"})),
            binary_data: Some([("logic.wasm.zst".to_owned(), k8s_openapi::ByteString(bytes))].into()),
            ..Default::default()
        };
        let created = configmaps.create(&PostParams::default(), &holding(zstd(NEXT_GUEST))).await.unwrap();
        let uid = created.metadata.uid.clone().unwrap();
        let next_sha = sha256_hex(NEXT_GUEST);
        let source = LogicSource::ConfigMap(ConfigMapKey::parse(&format!("{ns}/clb-logic:logic.wasm.zst")).unwrap());
        let pin = Sha256Pin::parse(&next_sha).unwrap();
        let host = Host::start(client, Options { source: Some(source), pin: Some(pin), ..Default::default() }).await;

        let status = host.last_swap("accepted", None).await;
        assert_eq!(status["active"]["sha256"], next_sha, "{status}");
        event_on(client, ns, "clb-logic", "LogicSwapped", Some(&uid)).await;

        let truncated = zstd(NEXT_GUEST);
        let mut changed = holding(truncated[..truncated.len() / 2].to_vec());
        changed.metadata.resource_version = None;
        configmaps.replace("clb-logic", &PostParams::default(), &changed).await.expect("updates the ConfigMap");
        let status = host.last_swap("refused", Some("decompress")).await;
        assert_eq!(status["active"]["sha256"], next_sha, "the swapped-in version keeps serving: {status}");
        let refused = event_on(client, ns, "clb-logic", "LogicSwapRefused", Some(&uid)).await;
        assert_eq!(refused.type_.as_deref(), Some("Warning"));
        let message = refused.message.unwrap_or_default();
        assert!(message.contains("(decompress)") && message.contains("the zstd stream is truncated or corrupt"));
        host.stop().await;
    });
}

/// A shadow of `bytes` (written to a file the host watches) with `policy`.
fn shadow_of(ns: &str, bytes: &[u8], policy: clb_host::live::control::ShadowPolicy) -> Option<ShadowSource> {
    let file = temp_dir(ns).join("candidate.wasm");
    std::fs::write(&file, bytes).unwrap();
    Some(ShadowSource { source: LogicSource::File(file), pin: None, policy })
}

/// Waits until `/status` shows a shadow for which `done` holds, and returns that status.
async fn shadow_until(host: &Host, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    host.status_where(what, |status| done(&status["shadow"])).await
}

/// The Events in `namespace` with this reason.
async fn events_with(client: &::kube::Client, namespace: &str, reason: &str) -> Vec<Event> {
    let events = Api::<Event>::namespaced(client.clone(), namespace).list(&Default::default()).await.unwrap();
    events.items.into_iter().filter(|e| e.reason.as_deref() == Some(reason)).collect()
}

#[test]
fn a_shadow_of_the_next_guest_in_run_counts_its_extra_warning_as_a_divergence_and_writes_nothing() {
    in_namespace("shadow", async |client, ns| {
        let record = temp_dir(ns).join("divergences");
        let policy = clb_host::live::control::ShadowPolicy { record: Some(record.clone()), ..Default::default() };
        let events = EventTarget { namespace: ns.to_owned(), name: "clb-swaps".into() };
        let options = Options { shadow: shadow_of(ns, NEXT_GUEST, policy), events: Some(events), ..Default::default() };
        let host = Host::start(client, options).await;
        let in_step = shadow_until(&host, "the candidate in step", |s| s["state"] == "in-step").await;
        assert_eq!(in_step["shadow"]["sha256"], sha256_hex(NEXT_GUEST), "{in_step}");
        assert_eq!(in_step["active"]["sha256"], builtin().info().sha256, "the built-in logic serves: {in_step}");
        let started = event_on(client, ns, "clb-swaps", "LogicShadowStarted", None).await;
        assert!(started.message.as_deref().is_some_and(|m| m.contains("nothing it asks for is carried out")));

        create_service(client, ns, "web", json!({})).await;
        create_service(client, ns, "legacy", json!({"clb.test/legacy": "true"})).await;
        provisioned(client, ns, &["web", "legacy"]).await;
        let status =
            shadow_until(&host, "an emit-event divergence", |s| s["divergences"]["emit-event"].as_u64() > Some(0))
                .await;
        let shadow = &status["shadow"];
        assert_eq!(shadow["divergences"].as_object().map(|d| d.len()), Some(1), "emit-event only: {status}");
        let last = &shadow["lastDivergence"];
        assert!(last["input"].as_str().is_some_and(|i| i.contains("legacy")), "{status}");
        assert!(last["candidate"]["only"].to_string().contains("LegacyAnnotation"), "{status}");
        assert_eq!(last["serving"]["only"], json!([]), "{status}");
        assert!(status["lastSwap"].is_null(), "a shadow is no swap: {status}");

        // Nothing of the candidate's was carried out: its Warning is not in the API server (and it
        // proposed nothing else the serving version did not: emit-event is its only divergence).
        let diverged = event_on(client, ns, "clb-swaps", "LogicShadowDiverged", None).await;
        assert!(diverged.message.as_deref().is_some_and(|m| m.contains("emit-event")), "{diverged:?}");
        assert!(
            events_with(client, ns, "LegacyAnnotation").await.is_empty(),
            "the candidate's Warning was never written"
        );
        let exposition = host.get("/metrics").await.1;
        assert!(sample(&exposition, "clb_shadow_divergences_total", &["kind=\"emit-event\""]) >= 1.0);
        assert!(sample(&exposition, "clb_shadow_inputs_total", &["result=\"compared\""]) >= 1.0);
        let version = format!("version=\"{}\"", &sha256_hex(NEXT_GUEST)[..12]);
        assert_eq!(sample(&exposition, "clb_shadow_state", &[&version]), 1.0, "one state: {exposition}");

        // The divergence's trace: identical on the serving version, different on the candidate.
        let trace = last["trace"].as_str().expect("written to --shadow-record").to_owned();
        assert!(trace.starts_with(&record.display().to_string()), "{trace}");
        let (code, out, err) = super::traces::clb_replay(&[Path::new(&trace)], &[]);
        assert_eq!(code, 0, "{out}{err}");
        let candidate = temp_dir(ns).join("candidate.wasm").display().to_string();
        let (code, out, err) = super::traces::clb_replay(&[Path::new(&trace)], &["--component", &candidate]);
        assert_eq!(code, 1, "{out}{err}");

        delete_services(client, ns, "").await;
        host.stop().await;
    });
}

#[test]
fn a_shadow_of_the_serving_version_in_run_compares_a_churn_without_a_divergence() {
    in_namespace("shadow-self", async |client, ns| {
        let options =
            Options { shadow: shadow_of(ns, clb_sandbox::BUILTIN_GUEST, Default::default()), ..Default::default() };
        let host = Host::start(client, options).await;
        shadow_until(&host, "the candidate in step", |s| s["state"] == "in-step").await;
        create_service(client, ns, "web", json!({})).await;
        provisioned(client, ns, &["web"]).await;
        let web = Api::<Service>::namespaced(client.clone(), ns).get("web").await.unwrap();
        let churn = churn(client, ns, "web", &web.metadata.uid.unwrap(), 150);
        churn.await.unwrap();
        let status = shadow_until(&host, "the churn compared", |s| s["compared"].as_u64() >= Some(100)).await;
        assert_eq!(status["shadow"]["divergences"], json!({}), "{status}");
        assert_eq!(status["shadow"]["resyncs"].get("divergence"), None, "{status}");
        let slices = Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(client.clone(), ns);
        slices.delete("web-churn", &DeleteParams::default()).await.unwrap();
        delete_services(client, ns, "").await;
        host.stop().await;
    });
}

#[test]
fn a_shadow_in_run_with_promote_after_is_held_back_by_a_divergence_and_then_promoted_after_its_clean_inputs() {
    in_namespace("promote", async |client, ns| {
        let policy = clb_host::live::control::ShadowPolicy { promote_after: Some(60), ..Default::default() };
        let events = EventTarget { namespace: ns.to_owned(), name: "clb-swaps".into() };
        let options = Options { shadow: shadow_of(ns, NEXT_GUEST, policy), events: Some(events), ..Default::default() };
        let host = Host::start(client, options).await;
        shadow_until(&host, "the candidate in step", |s| s["state"] == "in-step").await;

        // A divergence: the count starts again, and the candidate is not promoted meanwhile.
        create_service(client, ns, "legacy", json!({"clb.test/legacy": "true"})).await;
        provisioned(client, ns, &["legacy"]).await;
        let held = shadow_until(&host, "a divergence", |s| s["divergences"]["emit-event"].as_u64() > Some(0)).await;
        assert_eq!(held["active"]["sha256"], builtin().info().sha256, "not promoted: {held}");
        assert!(held["shadow"]["clean"].as_u64() < Some(60), "{held}");
        Api::<Service>::namespaced(client.clone(), ns).delete("legacy", &DeleteParams::default()).await.unwrap();

        // Clean inputs: a churn of endpoint changes, until the candidate is promoted.
        create_service(client, ns, "web", json!({})).await;
        provisioned(client, ns, &["web"]).await;
        let web = Api::<Service>::namespaced(client.clone(), ns).get("web").await.unwrap();
        let churn = churn(client, ns, "web", &web.metadata.uid.unwrap(), 200);
        let status = host.last_swap("accepted", None).await;
        churn.abort();
        assert_eq!(status["active"]["sha256"], sha256_hex(NEXT_GUEST), "{status}");
        assert_eq!(status["previous"]["sha256"], builtin().info().sha256, "it serves its probation: {status}");
        assert_eq!(status["shadow"]["state"], "promoted", "{status}");
        let origin = status["lastSwap"]["origin"].as_str().unwrap_or_default();
        assert!(origin.starts_with("shadow promotion after 60 clean inputs"), "{status}");
        let swapped = event_on(client, ns, "clb-swaps", "LogicSwapped", None).await;
        assert!(swapped.message.as_deref().is_some_and(|m| m.contains("shadow promotion")), "{swapped:?}");

        let slices = Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(client.clone(), ns);
        slices.delete("web-churn", &DeleteParams::default()).await.unwrap();
        delete_services(client, ns, "").await;
        host.stop().await;
    });
}

/// Writes the EndpointSlice `<service>-pods` of the Service `service` (UID `uid`): `addresses`,
/// ready, on the Node `node`.
async fn endpoints_on(
    client: &::kube::Client,
    namespace: &str,
    service: &str,
    uid: &str,
    node: &str,
    addresses: &[String],
) {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), namespace);
    let endpoints: Vec<Value> =
        addresses.iter().map(|a| json!({"addresses": [a], "nodeName": node, "conditions": {"ready": true}})).collect();
    let slice: EndpointSlice = manifest(json!({
        "metadata": {
            "name": format!("{service}-pods"),
            "labels": {"kubernetes.io/service-name": service},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service, "uid": uid}],
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
    }));
    let params = ::kube::api::PatchParams::apply("clb-test").force();
    slices.patch(&format!("{service}-pods"), &params, &::kube::api::Patch::Apply(&slice)).await.unwrap();
}

#[test]
fn run_serves_upstreams_difftracker_engine_metrics_that_match_the_cluster_and_the_emulator_after_a_churn() {
    use k8s_openapi::api::core::v1::Node;
    in_namespace("figures", async |client, ns| {
        let host = Host::start(client, Options::default()).await;
        // Every upstream-named family is there from start-up, before any Service.
        let (_, first) = host.get("/metrics").await;
        for family in ["difftracker_engine_servicegateway_enabled", "difftracker_engine_pending_deletions"] {
            eventually(&format!("{family} on /metrics"), async || {
                let (_, text) = host.get("/metrics").await;
                if text.contains(family) { Ok(()) } else { Err(first.clone()) }
            })
            .await;
        }
        let nodes = Api::<Node>::all(client.clone());
        let node = format!("{ns}-node");
        nodes.create(&PostParams::default(), &manifest(json!({"metadata": {"name": node}}))).await.unwrap();
        let status = json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.224.250.1"}]},
        });
        nodes
            .patch_status(
                &node,
                &::kube::api::PatchParams::apply("clb-test").force(),
                &::kube::api::Patch::Apply(&status),
            )
            .await
            .unwrap();

        let services = Api::<Service>::namespaced(client.clone(), ns);
        let names = ["figures-a", "figures-b", "figures-c"];
        for (i, name) in names.iter().enumerate() {
            create_service(client, ns, name, json!({})).await;
            let uid = services.get(name).await.unwrap().metadata.uid.unwrap();
            let addresses = [format!("10.244.250.{}", 10 * i + 1), format!("10.244.250.{}", 10 * i + 2)];
            endpoints_on(client, ns, name, &uid, &node, &addresses).await;
        }
        provisioned(client, ns, &names).await;
        // A churn of figures-a's endpoints, then figures-c goes.
        let uid_a = services.get("figures-a").await.unwrap().metadata.uid.unwrap();
        for round in 0..20u32 {
            let addresses = [format!("10.244.251.{}", 1 + round % 5)];
            endpoints_on(client, ns, "figures-a", &uid_a, &node, &addresses).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        delete_services(client, ns, "figures-c").await;

        // Settled: nothing pending, and NRP's totals are the emulator's.
        let text = eventually("the figures settled and equal to what the emulator holds", async || {
            let (_, text) = host.get("/metrics").await;
            let nrp = clb_simulator::simulate::nrp_view(&host.emulator.resources());
            let addresses: usize = nrp.locations.values().map(|a| a.len()).sum();
            let pending: f64 = text
                .lines()
                .filter(|l| l.starts_with("difftracker_engine_pending_service_operations{"))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
                .sum();
            let want = [
                (r#"difftracker_engine_tracked_services_total{state="nrp_loadbalancers"}"#, nrp.services.len() as f64),
                ("difftracker_engine_locations_total", nrp.locations.len() as f64),
                ("difftracker_engine_addresses_total", addresses as f64),
            ];
            let off: Vec<String> = want
                .iter()
                .filter(|(sample, value)| !text.lines().any(|l| l == format!("{sample} {value:?}")))
                .map(|(sample, value)| format!("{sample} != {value}"))
                .collect();
            if pending == 0.0 && off.is_empty() && nrp.locations.get("10.224.250.1").is_some_and(|a| a.len() == 3) {
                Ok(text)
            } else {
                Err(format!("pending {pending}; {off:?}; emulator {:?}", nrp.locations.get("10.224.250.1")))
            }
        })
        .await;
        // figures-a's one churned address and figures-b's two stay at the node.
        let nrp = clb_simulator::simulate::nrp_view(&host.emulator.resources());
        assert_eq!(nrp.locations["10.224.250.1"].len(), 3, "{:?}", nrp.locations);
        assert_eq!(sample(&text, "difftracker_engine_servicegateway_enabled", &[]), 1.0);
        let k8s = sample(&text, "difftracker_engine_tracked_services_total", &[r#"state="k8s_services""#]);
        let registered = sample(&text, "difftracker_engine_tracked_services_total", &[r#"state="nrp_loadbalancers""#]);
        assert_eq!(k8s, registered, "every Service provisioned is registered once settled:\n{text}");
        assert!(registered >= 2.0, "{text}");
        let created = [r#"operation="create""#, r#"service_type="inbound""#, r#"result="success""#];
        assert!(sample(&text, "difftracker_engine_service_operations_total", &created) >= 3.0, "{text}");
        let deleted = [r#"operation="delete""#, r#"service_type="inbound""#, r#"result="success""#];
        assert!(sample(&text, "difftracker_engine_service_operations_total", &deleted) >= 1.0, "{text}");
        for state in
            ["not_started", "creation_in_progress", "deletion_pending", "deletion_in_progress", "update_in_progress"]
        {
            let labels = [&format!(r#"state="{state}""#) as &str, r#"service_type="inbound""#];
            assert_eq!(
                sample(&text, "difftracker_engine_pending_operation_oldest_age_seconds", &labels),
                0.0,
                "{text}"
            );
        }
        assert!(sample(&text, "difftracker_engine_initialization_duration_seconds", &[]) >= 0.0);
        assert_eq!(sample(&text, "difftracker_engine_pending_deletions", &[]), 0.0);
        let sha = host.status().await["active"]["sha256"].as_str().unwrap().to_owned();
        let in_flight = sample(&text, "clb_logic_commands_in_flight", &[&format!(r#"sha256="{sha}""#)]);
        assert_eq!(in_flight, 0.0, "{text}");

        delete_services(client, ns, "figures-").await;
        host.stop().await;
        nodes.delete(&node, &DeleteParams::default()).await.unwrap();
    });
}
