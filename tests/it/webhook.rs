//! `clb-host admission`, served in-process over TLS (the test certificates of
//! `tests/fixtures/tls/`) and asked as the API server asks a `ValidatingAdmissionWebhook`:
//! verdicts, hostile requests, a misbehaving logic and a rotated certificate.

use clb_sandbox::sha256_hex;
use clb_tests::webhook::{Webhook, client, webhook};
use clb_tests::*;
use serde_json::{Value, json};
use std::time::Duration;

fn service(name: &str, service_type: &str, policy: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "shop", "name": name, "uid": "0b1c2d3e-0000-4000-8000-000000000001"},
        "spec": {"type": service_type, "externalTrafficPolicy": policy,
                 "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}]}
    })
}

fn review(operation: &str, object: Value, old: Value, dry_run: bool) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Service"},
            "resource": {"group": "", "version": "v1", "resource": "services"},
            "name": object.get("metadata").or(old.get("metadata")).map_or(Value::Null, |m| m["name"].clone()),
            "namespace": "shop", "operation": operation, "userInfo": {"username": "admin"},
            "object": object, "oldObject": old, "dryRun": dry_run
        }
    })
}

#[tokio::test]
async fn the_webhook_denies_what_the_logic_rejects_allows_the_rest_and_warns_of_what_it_ignores_as_the_api_server_asks()
{
    let hook = webhook("verdicts", &[]).await;
    let (local, cluster) = (service("shop", "LoadBalancer", "Local"), service("legacy", "LoadBalancer", "Cluster"));
    let mut deleting = cluster.clone();
    deleting["metadata"]["deletionTimestamp"] = json!("2026-12-06T00:00:00Z");
    // (what, the review, allowed)
    let cases = [
        ("a Cluster-policy LoadBalancer Service created", review("CREATE", cluster.clone(), Value::Null, false), false),
        ("the same as a server-side dry run", review("CREATE", cluster.clone(), Value::Null, true), false),
        ("a Local one created", review("CREATE", local.clone(), Value::Null, false), true),
        ("an update Local to Cluster", review("UPDATE", cluster.clone(), local.clone(), false), false),
        (
            "an update LoadBalancer to ClusterIP",
            review("UPDATE", service("legacy", "ClusterIP", "Cluster"), cluster.clone(), false),
            true,
        ),
        ("a deletion", review("DELETE", Value::Null, cluster.clone(), false), true),
        ("an update that only finishes a deletion", review("UPDATE", deleting, cluster.clone(), false), true),
    ];
    for (what, review, allowed) in cases {
        let response = hook.judge(&review).await;
        assert_eq!(response["allowed"], allowed, "{what}: {response}");
        assert!(response.get("warnings").is_none_or(Value::is_null), "{what}: nothing to warn of: {response}");
        if !allowed {
            assert_eq!(response["status"]["code"], 403, "{what}");
            assert_eq!(response["status"]["reason"], "UnsupportedExternalTrafficPolicy", "{what}");
            let message = response["status"]["message"].as_str().unwrap();
            assert!(
                message.starts_with("UnsupportedExternalTrafficPolicy: service shop/legacy: "),
                "{what}: {message}"
            );
        }
    }
    // Soft findings go to `response.warnings`, allowed or denied.
    for (policy, allowed) in [("Local", true), ("Cluster", false)] {
        let mut annotated = service("annotated", "LoadBalancer", policy);
        annotated["metadata"]["annotations"] = json!({
            "service.beta.kubernetes.io/azure-load-balancer-tcp-idle-timeout": "10",
            "service.beta.kubernetes.io/azure-pip-tags": "cost-center=shop",
        });
        let response = hook.judge(&review("UPDATE", annotated, local.clone(), false)).await;
        assert_eq!(response["allowed"], allowed, "{policy}: {response}");
        let warnings = response["warnings"].as_array().unwrap_or_else(|| panic!("{policy}: warned: {response}"));
        assert_eq!(warnings.len(), 1, "the idle timeout is read, not warned of: {response}");
        assert!(warnings[0].as_str().unwrap().contains("service.beta.kubernetes.io/azure-pip-tags is ignored"));
    }
    let (status, metrics) = hook.get("/metrics").await;
    assert_eq!(status, 200);
    let sha = &builtin().info().sha256;
    for line in [
        format!("clb_admission_requests_total{{operation=\"CREATE\",verdict=\"denied\",sha256=\"{sha}\"}} 2"),
        format!("clb_admission_requests_total{{operation=\"DELETE\",verdict=\"skipped\",sha256=\"{sha}\"}} 1"),
        format!("clb_admission_warnings_total{{sha256=\"{sha}\"}} 2"),
    ] {
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    assert_eq!(hook.get("/healthz").await.0, 200);
}

#[tokio::test]
async fn hostile_requests_each_get_their_answer_and_the_webhook_keeps_serving() {
    let hook = webhook("hostile", &[]).await;
    // A 10 MB body declared is answered before a byte of it is sent.
    let head = "POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 10485760\r\n\r\n";
    let answer = raw(&hook.url, head).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("the body is over 3145728 bytes"), "{answer}");
    // One streamed in chunks, its length said nowhere, is cut at the limit as it is read.
    let mut chunked =
        b"POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec();
    for _ in 0..64 {
        chunked.extend_from_slice(b"10000\r\n");
        chunked.extend(std::iter::repeat_n(b' ', 0x10000));
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let answer = raw(&hook.url, chunked).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("the body is over 3145728 bytes"), "{answer}");
    let not_a_review = json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}});
    let cases: [(Vec<u8>, u16, &str); 3] = [
        (b"{ not json".to_vec(), 400, "not an AdmissionReview"),
        (serde_json::to_vec(&not_a_review).unwrap(), 400, "admission.k8s.io/v1"),
        (
            serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"})).unwrap(),
            400,
            "no request",
        ),
    ];
    for (body, expected, why) in cases {
        let (status, text) = hook.post(body).await;
        assert_eq!(status, expected, "{text}");
        assert!(text.contains(why) && text.lines().count() == 1, "{text}");
    }
    let pod = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "name": "p", "operation": "CREATE",
        "userInfo": {}, "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}}});
    assert_eq!(hook.judge(&pod).await["allowed"], true, "another kind is allowed unjudged");
    assert_eq!(hook.get("/validate").await.0, 405);
    assert_eq!(hook.get("/nothing").await.0, 404);
    // Still serving: a Service is judged after all of it.
    let response =
        hook.judge(&review("CREATE", service("legacy", "LoadBalancer", "Cluster"), Value::Null, false)).await;
    assert_eq!(response["allowed"], false);
}

#[tokio::test]
async fn a_logic_that_traps_or_spins_is_answered_by_the_failure_policy_within_the_timeout() {
    let component = process_dir().join("webhook-hostile.wasm");
    std::fs::write(&component, HOSTILE_GUEST).unwrap();
    let component = component.display().to_string();
    let limits = ["--deadline-ms", "2000", "--admission-timeout-ms", "300"];
    let open = webhook("open", &[&["--component", &component], &limits[..]].concat()).await;
    let closed =
        webhook("closed", &[&["--component", &component, "--admission-failure", "closed"], &limits[..]].concat()).await;
    // (the Service's name, which the hostile guest acts on, and the cause the warning names)
    for (name, cause) in [("panic", "panicked"), ("spin", "admission timeout")] {
        let review = review("CREATE", service(name, "LoadBalancer", "Local"), Value::Null, false);
        let response = open.judge(&review).await;
        assert_eq!(response["allowed"], true, "{name}: {response}");
        assert!(response["warnings"][0].as_str().unwrap().contains(cause), "{name}: {response}");
        let response = closed.judge(&review).await;
        assert_eq!((response["allowed"].as_bool(), response["status"]["code"].as_u64()), (Some(false), Some(500)));
        assert!(response["status"]["message"].as_str().unwrap().contains(cause), "{name}: {response}");
    }
    // Each request had its own instance: the next is judged as ever.
    let review = review("CREATE", service("fine", "LoadBalancer", "Local"), Value::Null, false);
    let response = open.judge(&review).await;
    assert_eq!((response["allowed"].as_bool(), response.get("warnings")), (Some(true), None), "{response}");
    let metrics = open.get("/metrics").await.1;
    for cause in ["panic", "timeout"] {
        assert!(metrics.contains(&format!("clb_admission_failures_total{{cause=\"{cause}\"")), "{cause}: {metrics}");
    }
}

#[tokio::test]
async fn a_rotated_certificate_is_served_from_the_next_connection_without_a_restart() {
    let hook = webhook("rotate", &[]).await;
    let review = review("CREATE", service("shop", "LoadBalancer", "Local"), Value::Null, false);
    assert_eq!(hook.judge(&review).await["allowed"], true);
    for file in ["crt", "key"] {
        std::fs::copy(fixture(&format!("tls/rotated.{file}")), hook.dir.join(format!("webhook.{file}"))).unwrap();
    }
    // A client that trusts only the new certificate gets through; one trusting only the old no
    // longer does (each request a new connection).
    let rotated =
        Webhook { client: client(&fixture("tls/rotated-ca.crt")), url: hook.url.clone(), dir: hook.dir.clone() };
    assert_eq!(rotated.judge(&review).await["allowed"], true);
    let old = client(&fixture("tls/ca.crt"));
    assert!(old.post(&hook.url).body("{}").send().await.is_err(), "the old certificate is no longer served");
}

/// The example manifest (`examples/deploy/admission.yaml`) starts `clb-host admission` with flags
/// it takes, serves the path and port its webhook configuration calls, and sends only CREATE and
/// UPDATE of Services.
#[test]
fn the_example_webhook_manifest_runs_clb_host_admission_with_flags_it_takes_on_the_path_it_serves() {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/deploy/admission.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let documents: Vec<Value> =
        clb_executor::inputs::from_yaml_documents(&path, &text).unwrap_or_else(|e| panic!("{e}"));
    let of_kind = |kind: &str| documents.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"));
    let container = &of_kind("Deployment")["spec"]["template"]["spec"]["containers"][0];
    let mut args: Vec<String> = vec!["clb-host".into()];
    args.extend(container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()));
    assert_eq!(args[1], "admission");
    // Every flag parses (an unknown one, or a bad value, is an error before `--help` is read).
    args.push("--help".into());
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = clb_host::cli::run(args.clone(), &mut out, &mut err);
    assert_eq!(code, clb_host::cli::EXIT_OK, "{args:?}: {}", String::from_utf8_lossy(&err));
    let listen = args.iter().find_map(|a| a.strip_prefix("--listen=")).unwrap();
    let port = container["ports"][0]["containerPort"].as_u64().unwrap();
    assert!(listen.ends_with(&format!(":{port}")), "{listen} against {port}");
    let webhook = &of_kind("ValidatingWebhookConfiguration")["webhooks"][0];
    assert_eq!(webhook["clientConfig"]["service"]["path"], "/validate");
    assert_eq!(webhook["rules"][0]["operations"], json!(["CREATE", "UPDATE"]));
    assert_eq!(webhook["rules"][0]["resources"], json!(["services"]));
    assert_eq!(webhook["admissionReviewVersions"], json!(["v1"]));
    let timeout_ms = args.iter().find_map(|a| a.strip_prefix("--admission-timeout-ms=")).unwrap();
    let below = timeout_ms.parse::<u64>().unwrap() < webhook["timeoutSeconds"].as_u64().unwrap() * 1000;
    assert!(below, "the admission timeout is below the webhook's timeoutSeconds");
}

/// Posts `object` to the API server as `api` would, as admin; the API server's error message
/// when it refuses.
async fn create(api: &kube::Api<DynamicObject>, object: &Value, dry_run: bool) -> Result<(), String> {
    let object: DynamicObject = serde_json::from_value(object.clone()).unwrap();
    let params = kube::api::PostParams { dry_run, ..Default::default() };
    api.create(&params, &object).await.map(|_| ()).map_err(|e| e.to_string())
}

use kube::api::DynamicObject;

// The API server's side, end to end: a webhook registered with its CA bundle and the example's
// match condition, then Services created and updated through the API as a user would.
#[test]
fn the_api_server_refuses_at_the_door_what_the_logic_rejects_and_admits_the_rest() {
    // In the reconcilers' turn: a controller of another test watches every namespace and would
    // update this test's Services (their finalizer), which the webhook judges too, so its count
    // of reviews would not be this test's alone.
    let _turn = crate::kube::reconcilers_slot();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(refused_at_the_door());
}

async fn refused_at_the_door() {
    use base64::Engine as _;
    use kube::api::{Api, ApiResource, DeleteParams, Patch, PatchParams};
    let hook = webhook("apiserver", &[]).await;
    let admin = clb_tests::apiserver::apiserver().admin().await;
    let namespace = format!("clb-webhook-{}", std::process::id());
    let namespaces: Api<DynamicObject> =
        Api::all_with(admin.clone(), &ApiResource::erase::<k8s_openapi::api::core::v1::Namespace>(&()));
    let labelled = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": {"clb-webhook-test": namespace}}});
    namespaces.patch(&namespace, &PatchParams::apply("clb-tests").force(), &Patch::Apply(&labelled)).await.unwrap();
    // The example's webhook, pointed at this test's server and scoped to this test's namespace
    // (other tests share the API server).
    let example = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/deploy/admission.yaml");
    let documents: Vec<Value> =
        clb_executor::inputs::from_yaml_documents(&example, &std::fs::read_to_string(&example).unwrap()).unwrap();
    let mut config = documents.into_iter().find(|d| d["kind"] == "ValidatingWebhookConfiguration").unwrap();
    let name = format!("clb-webhook-test-{}", std::process::id());
    config["metadata"] = json!({"name": name});
    let ca = base64::engine::general_purpose::STANDARD.encode(std::fs::read(fixture("tls/ca.crt")).unwrap());
    config["webhooks"][0]["clientConfig"] = json!({"url": hook.url, "caBundle": ca});
    config["webhooks"][0]["namespaceSelector"] = json!({"matchLabels": {"clb-webhook-test": namespace}});
    let configs: Api<DynamicObject> = Api::all_with(
        admin.clone(),
        &ApiResource::erase::<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration>(&()),
    );
    configs.patch(&name, &PatchParams::apply("clb-tests").force(), &Patch::Apply(&config)).await.unwrap();
    let services: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        &namespace,
        &ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&()),
    );
    let with = |name: &str, service_type: &str, policy: &str| {
        let mut object = service(name, service_type, policy);
        object["metadata"] = json!({"name": name});
        if service_type != "LoadBalancer" {
            object["spec"].as_object_mut().unwrap().remove("externalTrafficPolicy");
        }
        object
    };
    // The API server picks a new webhook configuration up within moments: until it refuses.
    let refused = async {
        loop {
            match create(&services, &with("legacy", "LoadBalancer", "Cluster"), true).await {
                Err(message) => break message,
                Ok(()) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    };
    let message = tokio::time::timeout(Duration::from_secs(60), refused).await.expect("the webhook takes effect");
    assert!(message.contains("UnsupportedExternalTrafficPolicy: service"), "{message}");
    // (what, the Service, a dry run, whether the API server admits it)
    let cases = [
        ("a Cluster-policy LoadBalancer Service", with("legacy", "LoadBalancer", "Cluster"), false, false),
        ("a Local one", with("shop", "LoadBalancer", "Local"), false, true),
        (
            "a ClusterIP Service (the match condition keeps it from the webhook)",
            with("internal", "ClusterIP", ""),
            false,
            true,
        ),
    ];
    let judged_before = judged(&hook).await;
    for (what, object, dry_run, admitted) in &cases {
        let created = create(&services, object, *dry_run).await;
        assert_eq!(created.is_ok(), *admitted, "{what}: {created:?}");
    }
    assert_eq!(judged(&hook).await - judged_before, 2, "the ClusterIP Service never reached the webhook");
    // A Local Service carrying an annotation the CLB does not act on is created, and the API
    // server hands the webhook's warning on as a `Warning` header, which kubectl prints.
    let mut annotated = with("annotated", "LoadBalancer", "Local");
    annotated["metadata"]["annotations"] = json!({"service.beta.kubernetes.io/azure-dns-label-name": "shop"});
    let request = kube::core::Request::new(format!("/api/v1/namespaces/{namespace}/services"))
        .create(&kube::api::PostParams::default(), serde_json::to_vec(&annotated).unwrap())
        .unwrap();
    let response = admin.send(request.map(kube::client::Body::from)).await.unwrap();
    assert_eq!(response.status(), 201, "created");
    let warnings: Vec<&str> = response.headers().get_all("warning").iter().map(|v| v.to_str().unwrap()).collect();
    let warned = "annotation service.beta.kubernetes.io/azure-dns-label-name is ignored";
    assert!(warnings.iter().any(|w| w.contains(warned)), "{warnings:?}");
    // An update Local → Cluster is refused.
    let update = json!({"apiVersion": "v1", "kind": "Service", "spec": {"externalTrafficPolicy": "Cluster"}});
    let updated = services.patch("shop", &PatchParams::default(), &Patch::Merge(&update)).await;
    let message = updated.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("UnsupportedExternalTrafficPolicy"), "the update: {message:?}");
    // The webhook down, with failurePolicy Ignore: the Service is created.
    config["webhooks"][0]["clientConfig"]["url"] = json!(format!("https://127.0.0.1:{}/validate", closed_port()));
    configs.patch(&name, &PatchParams::apply("clb-tests").force(), &Patch::Apply(&config)).await.unwrap();
    let admitted = async {
        loop {
            if create(&services, &with("legacy", "LoadBalancer", "Cluster"), false).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), admitted).await.expect("admitted with the webhook down");
    let _ = configs.delete(&name, &DeleteParams::default()).await;
    let _ = namespaces.delete(&namespace, &DeleteParams::default()).await;
}

/// Reviews the webhook judged (allowed or denied) so far.
async fn judged(hook: &Webhook) -> u64 {
    let metrics = hook.get("/metrics").await.1;
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("clb_admission_requests_total{") && (l.contains("\"allowed\"") || l.contains("\"denied\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Sends `head` over a TLS connection of its own to the server of `url` and reads the answer
/// until the server closes or 5 s pass.
async fn raw(url: &str, request: impl Into<Vec<u8>>) -> String {
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from_pem_file(fixture("tls/ca.crt")).unwrap()).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let address = url.trim_start_matches("https://").split('/').next().unwrap().to_owned();
    let tcp = tokio::net::TcpStream::connect(&address).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp).await.unwrap();
    let (mut reader, mut writer) = tokio::io::split(tls);
    let request = request.into();
    // Written beside the reading: a server that answers before the body ends stops reading it.
    let writing = tokio::spawn(async move {
        let _ = writer.write_all(&request).await;
        writer
    });
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), reader.read_to_end(&mut answer)).await;
    writing.abort();
    String::from_utf8_lossy(&answer).into_owned()
}

/// `clb-host admission` with `args` after the subcommand: its exit code and what it wrote to
/// stderr (it returns only when it cannot serve).
fn admission_exit(args: &[String]) -> (u8, String) {
    let mut all = vec!["clb-host".to_owned(), "admission".to_owned()];
    all.extend(args.iter().cloned());
    let mut err = Vec::new();
    let code = clb_host::cli::run(all, &mut std::io::sink(), &mut err);
    (code, String::from_utf8_lossy(&err).into_owned())
}

#[test]
fn clb_host_admission_exits_two_when_an_input_is_unreadable_a_flag_is_wrong_or_it_cannot_listen_and_one_on_a_refused_configuration()
 {
    use clb_host::cli::{EXIT_BAD_INPUT, EXIT_REFUSED};
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let path = |p: &str| fixture(p).display().to_string();
    let flags = |config: &str, cert: &str, listen: &str| {
        [
            "--cloud-config",
            config,
            "--tls-cert-file",
            cert,
            "--tls-key-file",
            &path("tls/webhook.key"),
            "--listen",
            listen,
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let (clb, cert) = (path("configs/clb.yaml"), path("tls/webhook.crt"));
    // (what, the flags, the exit code, what stderr says)
    let cases = [
        (
            "a missing certificate",
            flags(&clb, "/nonexistent/tls.crt", "127.0.0.1:0"),
            EXIT_BAD_INPUT,
            "/nonexistent/tls.crt",
        ),
        (
            "a certificate file with none in it",
            flags(&clb, &path("configs/clb.yaml"), "127.0.0.1:0"),
            EXIT_BAD_INPUT,
            "no certificate",
        ),
        (
            "a missing configuration",
            flags("/nonexistent/azure.json", &cert, "127.0.0.1:0"),
            EXIT_BAD_INPUT,
            "/nonexistent/azure.json",
        ),
        ("a port already taken", flags(&clb, &cert, &address), EXIT_BAD_INPUT, "cannot listen on"),
        (
            "a configuration the logic refuses",
            flags(&path("configs/pod-ip-on-standard.yaml"), &cert, "127.0.0.1:0"),
            EXIT_REFUSED,
            "PodIPRequiresStandardV2",
        ),
        (
            "a pin without a source",
            [flags(&clb, &cert, "127.0.0.1:0"), vec!["--logic-sha256".into(), "ab".repeat(32)]].concat(),
            EXIT_BAD_INPUT,
            "--logic-file <PATH>|--logic-configmap",
        ),
        (
            "two sources",
            [
                flags(&clb, &cert, "127.0.0.1:0"),
                ["--logic-file", "a.wasm", "--logic-configmap", "ns/cm:k"].map(str::to_owned).to_vec(),
            ]
            .concat(),
            EXIT_BAD_INPUT,
            "cannot be used with",
        ),
    ];
    for (what, args, code, says) in cases {
        let (got, err) = admission_exit(&args);
        assert_eq!(got, code, "{what}: {err}");
        assert!(err.contains(says), "{what}: {err}");
    }
}

// The traces: an admission server run with --record writes every review it judged as an
// admit-service call, so clb-host replay and the other hosts reproduce its verdicts.
#[tokio::test]
async fn the_webhook_records_each_review_it_judged_as_a_call_that_replay_reproduces_in_every_host() {
    use super::hosts::{Host, replay};
    // The webhook serves until the process ends: its folders are the process's.
    let dir = process_dir().join("webhook-recorded");
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("admission.jsonl");
    let hook = webhook("record", &["--record", trace.to_str().unwrap()]).await;
    let mut marked = service("marked", "LoadBalancer", "Local");
    marked["metadata"]["annotations"] = json!({"clb.test/denied-by-next": "true"});
    // Warned of an annotation it ignores: every host replays the warnings with the verdict.
    let mut shop = service("shop", "LoadBalancer", "Local");
    shop["metadata"]["annotations"] = json!({"service.beta.kubernetes.io/azure-dns-label-name": "shop"});
    let judged = [shop, service("legacy", "LoadBalancer", "Cluster"), marked, service("internal", "ClusterIP", "")];
    for object in judged {
        hook.judge(&review("CREATE", object, Value::Null, false)).await;
    }
    // Not judged, so not a call: a DELETE.
    hook.judge(&review("DELETE", Value::Null, service("shop", "LoadBalancer", "Local"), false)).await;
    // Written in the background: wait for the header and the four calls.
    let lines = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let text = std::fs::read_to_string(&trace).unwrap_or_default();
            if text.lines().count() >= 5 {
                break text;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the trace is written");
    let calls: Vec<Value> = lines.lines().skip(1).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(calls.len(), 4, "{lines}");
    assert!(calls.iter().all(|c| c["call"] == "admit-service"), "{lines}");
    assert!(calls[0]["result"]["warnings"][0].as_str().unwrap().contains("azure-dns-label-name"), "{lines}");
    assert!(calls[1]["result"].to_string().contains("UnsupportedExternalTrafficPolicy"), "{lines}");
    let (code, out, err) = super::traces::clb_replay(&[&trace], &[]);
    assert_eq!(code, 0, "the same verdicts on replay: {out}{err}");
    let next = super::traces::guest_files().1.display().to_string();
    let (code, rust, err) = super::traces::clb_replay(&[&trace], &["--component", &next, "--json"]);
    assert_eq!(code, 1, "the next guest judges the marked Service otherwise: {rust}{err}");
    for host in [Host::Python, Host::Js, Host::Go] {
        let (code, out, err) = replay(host, &[&trace], None, &[]);
        assert_eq!(code, 0, "{out}{err}");
        let (code, theirs, err) = replay(host, &[&trace], Some(&super::traces::guest_files().1), &["--json"]);
        assert_eq!((code, theirs), (1, rust.clone()), "the same divergence as clb-host: {err}");
    }
}

/// The first answer to `review` that denies it, asked every 100 ms for up to a minute: a new
/// version judges from the request after its swap on.
async fn first_denial(hook: &Webhook, review: &Value) -> Value {
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let response = hook.judge(review).await;
            if response["allowed"] == false {
                break response;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("a new version judges within a minute")
}

// The "same logic flags as run": the policy swapped by a watched file, without a restart.
#[tokio::test]
async fn the_webhook_judges_with_each_new_version_of_its_watched_file_from_the_next_request_on() {
    let dir = process_dir().join("webhook-source");
    std::fs::create_dir_all(&dir).unwrap();
    let logic = dir.join("logic.wasm");
    std::fs::write(&logic, clb_sandbox::BUILTIN_GUEST).unwrap();
    let pin = sha256_hex(NEXT_GUEST);
    let hook = webhook("source", &["--logic-file", logic.to_str().unwrap()]).await;
    let mut marked = service("marked", "LoadBalancer", "Local");
    marked["metadata"]["annotations"] = json!({"clb.test/denied-by-next": "true"});
    let marked = review("CREATE", marked, Value::Null, false);
    assert_eq!(hook.judge(&marked).await["allowed"], true, "the built-in logic allows it");
    super::operations::replace_file(&logic, NEXT_GUEST);
    let denied = first_denial(&hook, &marked).await;
    assert_eq!(denied["status"]["reason"], "DeniedByNextGuest", "{denied}");
    let metrics = hook.get("/metrics").await.1;
    let labels = ["verdict=\"denied\"", &format!("sha256=\"{pin}\"")[..]];
    assert!(super::operations::sample(&metrics, "clb_admission_requests_total", &labels) >= 1.0, "{metrics}");
}

// `admission` takes run's sources, an OCI reference among them.
#[tokio::test]
async fn the_webhook_with_logic_oci_judges_with_the_component_its_tag_names() {
    let registry = clb_tests::registry::Registry::start(process_dir().join("webhook-oci-registry"));
    let tag = format!("{}/clb/policy:v1", registry.address);
    let file = process_dir().join("webhook-oci-next.wasm");
    std::fs::write(&file, NEXT_GUEST).unwrap();
    let pushed = {
        let (tag, file) = (tag.clone(), file.display().to_string());
        tokio::task::spawn_blocking(move || super::cli::clb_host(&["component", "--push", &tag, "--component", &file]))
            .await
            .unwrap()
    };
    assert_eq!(pushed.0, 0, "{pushed:?}");
    let hook = webhook("oci", &["--logic-oci", &tag, "--logic-poll", "1"]).await;
    let mut marked = service("marked", "LoadBalancer", "Local");
    marked["metadata"]["annotations"] = json!({"clb.test/denied-by-next": "true"});
    let marked = review("CREATE", marked, Value::Null, false);
    let denied = first_denial(&hook, &marked).await;
    assert_eq!(denied["status"]["reason"], "DeniedByNextGuest", "{denied}");
    drop(registry);
}

// `admission --logic-verify-key`: a version from the webhook's source judges only once a
// signature by the key is beside it (the refusal itself is `run`'s path, tested in signatures.rs).
#[tokio::test]
async fn the_webhook_with_logic_verify_key_judges_with_a_watched_file_once_its_signature_by_the_key_is_beside_it() {
    let dir = process_dir().join("webhook-signed");
    std::fs::create_dir_all(&dir).unwrap();
    let key = clb_oci::signature::SigningKey::generate();
    let (public, logic) = (dir.join("release.pub"), dir.join("logic.wasm"));
    std::fs::write(&public, key.public().to_pem()).unwrap();
    std::fs::write(&logic, NEXT_GUEST).unwrap();
    let args = ["--logic-file", logic.to_str().unwrap(), "--logic-verify-key", public.to_str().unwrap()];
    let hook = webhook("signed", &args).await;
    let mut marked = service("marked", "LoadBalancer", "Local");
    marked["metadata"]["annotations"] = json!({"clb.test/denied-by-next": "true"});
    let marked = review("CREATE", marked, Value::Null, false);
    // Unsigned, through two polls of the file: the built-in logic still judges.
    for _ in 0..2 {
        tokio::time::sleep(clb_host::live::sources::FILE_POLL).await;
        assert_eq!(hook.judge(&marked).await["allowed"], true, "an unsigned version does not judge");
    }
    std::fs::write(dir.join("logic.wasm.sig"), key.sign(NEXT_GUEST)).unwrap();
    let denied = first_denial(&hook, &marked).await;
    assert_eq!(denied["status"]["reason"], "DeniedByNextGuest", "{denied}");
}

/// `clb-host run` with its webhook, the built-in logic serving from a watched file and the next
/// guest in shadow, in a process of its own: its endpoint's and its webhook's URLs, and the
/// process (stopped with the test).
async fn run_with_webhook(env: &crate::kube::Env, dir: &std::path::Path) -> (String, String, crate::kube::Child) {
    use std::io::BufRead as _;
    std::fs::write(dir.join("azure.json"), &env.cloud_config).unwrap();
    std::fs::write(dir.join("logic.wasm"), clb_sandbox::BUILTIN_GUEST).unwrap();
    std::fs::write(dir.join("candidate.wasm"), NEXT_GUEST).unwrap();
    let path = |name: &str| dir.join(name).display().to_string();
    let command_line = [
        "clb-host".to_owned(),
        "run".into(),
        format!("--kubeconfig={}", env.controller_kubeconfig.display()),
        format!("--cloud-config={}", path("azure.json")),
        format!("--azure-url={}", env.azure.url()),
        "--credential=none".into(),
        "--leader-elect=false".into(),
        "--listen=127.0.0.1:0".into(),
        format!("--swap-events-configmap={}/clb-swaps", env.namespace),
        format!("--logic-file={}", path("logic.wasm")),
        format!("--shadow-logic-file={}", path("candidate.wasm")),
        format!("--shadow-record={}", path("divergences")),
        "--admission-listen=127.0.0.1:0".into(),
        format!("--tls-cert-file={}", fixture("tls/webhook.crt").display()),
        format!("--tls-key-file={}", fixture("tls/webhook.key").display()),
    ];
    let test = "webhook::in_run_the_door_judges_with_the_version_that_reconciles_and_a_candidate_in_shadow_counts_admission_divergences";
    let mut child = crate::kube::clb_host_child(test, &command_line, true);
    let stdout = child.0.stdout.take().unwrap();
    let urls = tokio::task::spawn_blocking(move || {
        let (mut endpoint, mut hook) = (None, None);
        for line in std::io::BufReader::new(stdout).lines() {
            // The test harness's own "test … ... " has no line end of its own: it starts the
            // child's first line.
            let line = line.expect("the child's output");
            if let Some((_, url)) = line.split_once("listening on ") {
                endpoint = Some(url.to_owned());
            }
            if let Some((_, url)) = line.split_once("admission webhook on ") {
                hook = Some(url.to_owned());
            }
            if let (Some(endpoint), Some(hook)) = (&endpoint, &hook) {
                return (endpoint.clone(), hook.clone());
            }
        }
        panic!("clb-host run ended before it said where it listens");
    });
    let (endpoint, hook) = tokio::time::timeout(Duration::from_secs(120), urls).await.expect("it starts").unwrap();
    (endpoint, hook, child)
}

async fn get_json(url: String) -> Value {
    let body = reqwest::get(url).await.expect("the endpoint answers").text().await.unwrap();
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

// The "in run" test: a swap changes the verdict at the door without a restart, and a
// candidate that would judge differently counts admission divergences.
#[test]
fn in_run_the_door_judges_with_the_version_that_reconciles_and_a_candidate_in_shadow_counts_admission_divergences() {
    crate::kube::run_if_child();
    crate::kube::e2e(20, async |env| {
        let dir = scratch("webhook-in-run");
        let (endpoint, url, _child) = run_with_webhook(env, &dir).await;
        let hook = Webhook { url, client: client(&fixture("tls/ca.crt")), dir: dir.to_path_buf() };
        let status = || get_json(format!("{endpoint}/status"));
        let mut marked = service("marked", "LoadBalancer", "Local");
        marked["metadata"]["annotations"] = json!({"clb.test/denied-by-next": "true"});
        let marked = review("CREATE", marked, Value::Null, false);
        crate::kube::eventually("the candidate in step", async || {
            let status = status().await;
            if status["shadow"]["state"] == "in-step" { Ok(()) } else { Err(status.to_string()) }
        })
        .await;

        // The built-in logic serves: it allows what only the next guest refuses, and the
        // candidate's different verdict is an admission divergence, with its trace.
        let allowed = hook.judge(&marked).await;
        assert_eq!(allowed["allowed"], true, "{allowed}");
        let diverged = crate::kube::eventually("an admission divergence", async || {
            let status = status().await;
            let shadow = &status["shadow"];
            if shadow["divergences"]["admission"].as_u64() >= Some(1) { Ok(status) } else { Err(status.to_string()) }
        })
        .await;
        let last = &diverged["shadow"]["lastDivergence"];
        assert_eq!(last["kinds"], json!(["admission"]), "{diverged}");
        assert!(last["input"].as_str().is_some_and(|i| i.contains("CREATE of Service shop/marked")), "{diverged}");
        assert!(last["candidate"]["only"].to_string().contains("DeniedByNextGuest"), "{diverged}");
        assert!(last["serving"]["only"].to_string().to_lowercase().contains("admitted"), "{diverged}");
        assert!(diverged["shadow"]["admissions"].as_u64() >= Some(1), "{diverged}");
        let trace = last["trace"].as_str().expect("written to --shadow-record").to_owned();
        let (code, out, err) = super::traces::clb_replay(&[std::path::Path::new(&trace)], &[]);
        assert_eq!(code, 0, "the serving version answers its trace as recorded: {out}{err}");
        let candidate = dir.join("candidate.wasm").display().to_string();
        let (code, out, err) = super::traces::clb_replay(&[std::path::Path::new(&trace)], &["--component", &candidate]);
        assert_eq!(code, 1, "the candidate does not: {out}{err}");
        let exposition = reqwest::get(format!("{endpoint}/metrics")).await.unwrap().text().await.unwrap();
        let builtin_sha = format!("sha256=\"{}\"", builtin().info().sha256);
        let counted = ["operation=\"CREATE\"", "verdict=\"allowed\"", &builtin_sha[..]];
        assert!(super::operations::sample(&exposition, "clb_admission_requests_total", &counted) >= 1.0);
        assert!(super::operations::sample(&exposition, "clb_shadow_divergences_total", &["kind=\"admission\""]) >= 1.0);

        // A swap to the next guest: the same request is denied from then on, without a restart,
        // with the rule's message, and the page's last denials name it.
        super::operations::replace_file(&dir.join("logic.wasm"), NEXT_GUEST);
        crate::kube::eventually("the next guest serving", async || {
            let status = status().await;
            if status["active"]["sha256"] == sha256_hex(NEXT_GUEST) { Ok(()) } else { Err(status.to_string()) }
        })
        .await;
        let denied = hook.judge(&marked).await;
        assert_eq!(denied["allowed"], false, "{denied}");
        assert_eq!(denied["status"]["code"], 403, "{denied}");
        assert_eq!(denied["status"]["reason"], "DeniedByNextGuest", "{denied}");
        let message = denied["status"]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with("DeniedByNextGuest: service shop/marked: "), "{message}");
        let status = status().await;
        let denial = &status["lastDenials"][0];
        assert_eq!(
            (denial["reason"].as_str(), denial["service"].as_str()),
            (Some("DeniedByNextGuest"), Some("shop/marked"))
        );
        assert_eq!(denial["version"], sha256_hex(NEXT_GUEST)[..12], "{status}");
        let page = reqwest::get(format!("{endpoint}/")).await.unwrap().text().await.unwrap();
        assert!(page.contains("<td>DeniedByNextGuest</td>"), "{page}");
        // A rule both versions share still holds.
        let cluster =
            hook.judge(&review("CREATE", service("legacy", "LoadBalancer", "Cluster"), Value::Null, false)).await;
        assert_eq!(cluster["status"]["reason"], "UnsupportedExternalTrafficPolicy", "{cluster}");
        let exposition = reqwest::get(format!("{endpoint}/metrics")).await.unwrap().text().await.unwrap();
        let next_sha = format!("sha256=\"{}\"", sha256_hex(NEXT_GUEST));
        let counted = ["operation=\"CREATE\"", "verdict=\"denied\"", &next_sha[..]];
        assert_eq!(super::operations::sample(&exposition, "clb_admission_requests_total", &counted), 2.0);
    });
}
