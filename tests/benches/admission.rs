//! The admission webhook's cost (`clb-host admission`, docs/operations.md "Admission"): its own
//! latency over TLS (p50, p99) one request after another on one connection, its throughput with
//! eight clients at once, and what it adds to a Service created through the test API server
//! (the median create with and without the webhook registered). The reviews are of a Local
//! LoadBalancer Service, which the logic admits. Run with `cargo bench -p clb-tests --bench
//! admission`.

use clb_tests::apiserver::apiserver;
use clb_tests::scaled;
use clb_tests::webhook::webhook;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn review(name: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Service"},
            "resource": {"group": "", "version": "v1", "resource": "services"},
            "name": name, "namespace": "shop", "operation": "CREATE", "userInfo": {"username": "bench"},
            "object": service(name), "dryRun": false
        }
    }))
    .unwrap()
}

fn service(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                 "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}]}
    })
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let hook = webhook("bench", &[]).await;
    let body = review("shop");
    // Warm: the connection, the TLS session, the first instances.
    for _ in 0..10 {
        assert_eq!(hook.post(body.clone()).await.0, 200);
    }
    let n = scaled(2_000);
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let (status, answer) = hook.post(body.clone()).await;
        times.push(start.elapsed());
        assert!(status == 200 && answer.contains("\"allowed\":true"), "{answer}");
    }
    times.sort();
    println!(
        "one request after another, {n} over one connection: p50 {:.0?}, p99 {:.0?}",
        percentile(&times, 50),
        percentile(&times, 99)
    );

    let (clients, each) = (8, scaled(500));
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, url, body) =
                (clb_tests::webhook::client(&clb_tests::fixture("tls/ca.crt")), hook.url.clone(), body.clone());
            tokio::spawn(async move {
                for _ in 0..each {
                    let answer = client.post(&url).body(body.clone()).send().await.unwrap();
                    assert_eq!(answer.status(), 200);
                    answer.bytes().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = start.elapsed();
    let total = clients * each;
    println!(
        "{clients} clients at once, {total} requests: {:.0} requests a second ({elapsed:.2?})",
        total as f64 / elapsed.as_secs_f64()
    );

    // Through the test API server: the same Service created in a namespace the webhook does not
    // judge, then in one it does.
    let admin = apiserver().admin().await;
    let pid = std::process::id();
    let namespaces: Api<DynamicObject> =
        Api::all_with(admin.clone(), &ApiResource::erase::<k8s_openapi::api::core::v1::Namespace>(&()));
    let configs: Api<DynamicObject> = Api::all_with(
        admin.clone(),
        &ApiResource::erase::<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration>(&()),
    );
    let apply = PatchParams::apply("clb-bench").force();
    let (plain, judged) = (format!("clb-bench-plain-{pid}"), format!("clb-bench-judged-{pid}"));
    for namespace in [&plain, &judged] {
        let object = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {"clb-bench": namespace}}});
        namespaces.patch(namespace, &apply, &Patch::Apply(&object)).await.unwrap();
    }
    let ca = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(clb_tests::fixture("tls/ca.crt")).unwrap())
    };
    let name = format!("clb-bench-{pid}");
    let config = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "services.clb-bench.test", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Fail", "timeoutSeconds": 5,
            "clientConfig": {"url": hook.url, "caBundle": ca},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                       "resources": ["services"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"clb-bench": judged}}
        }]
    });
    configs.patch(&name, &apply, &Patch::Apply(&config)).await.unwrap();
    let judged_before = requests(&hook).await;
    let creates = scaled(100);
    let mut medians = Vec::new();
    for namespace in [&plain, &judged] {
        let services: Api<DynamicObject> = Api::namespaced_with(
            admin.clone(),
            namespace,
            &ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&()),
        );
        let mut times = Vec::with_capacity(creates);
        for i in 0..creates {
            let object: DynamicObject = serde_json::from_value(service(&format!("s{i}"))).unwrap();
            let start = Instant::now();
            // The webhook configuration takes a moment to reach the API server's admission:
            // until its first request, a create into the judged namespace is retried.
            loop {
                services.create(&PostParams::default(), &object).await.unwrap();
                if namespace == &plain || i > 0 || requests(&hook).await > judged_before {
                    break;
                }
                services.delete(&format!("s{i}"), &DeleteParams::default()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            times.push(start.elapsed());
        }
        times.sort();
        medians.push(percentile(&times, 50));
    }
    let judged_requests = requests(&hook).await - judged_before;
    assert!(judged_requests >= creates as u64, "every create in the judged namespace went through the webhook");
    println!(
        "a Service created through the test API server, median of {creates}: {:.1?} without the webhook, {:.1?} with it",
        medians[0], medians[1]
    );
    let _ = configs.delete(&name, &DeleteParams::default()).await;
    for namespace in [&plain, &judged] {
        let _ = namespaces.delete(namespace, &DeleteParams::default()).await;
    }
}

/// Reviews the webhook has answered so far.
async fn requests(hook: &clb_tests::webhook::Webhook) -> u64 {
    let metrics = hook.get("/metrics").await.1;
    metrics
        .lines()
        .filter(|l| l.starts_with("clb_admission_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}
