//! `clb-host run` against a real kube-apiserver (`harness/apiserver`) and the Azure emulator
//! over HTTP: the watchers, the Kubernetes writes and the loop on real time, end to end. The
//! helpers here are shared with the leader-election tests (`lease.rs`).

use ::kube::api::{Api, DeleteParams, PostParams};
use clb_host::azure::{ArmClient, ArmConfig, Credential};
use clb_host::emulator::{Emulator, EmulatorServer};
use clb_host::sandbox::bindings::clb::reconciler::types as wit;
use clb_tests::apiserver::apiserver;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long the system may take to converge after a change.
const CONVERGE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

/// Polls `check` until it gives `Some`, or fails the test after [`CONVERGE`] with what it last
/// saw.
pub(crate) async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Result<T, String>) -> T {
    let started = Instant::now();
    loop {
        match check().await {
            Ok(found) => return found,
            Err(last) if started.elapsed() > CONVERGE => panic!("{what}: not within {CONVERGE:?}; last: {last}"),
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// Held by a test while it runs reconcilers: they watch every namespace of the shared API
/// server, so two tests' reconcilers would fight over each other's Services.
pub(crate) fn reconcilers_slot() -> MutexGuard<'static, ()> {
    static SLOT: Mutex<()> = Mutex::new(());
    SLOT.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn manifest<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("a valid manifest")
}

pub(crate) fn ingress_ips(service: &Service) -> Vec<String> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|i| i.iter().filter_map(|i| i.ip.clone()).collect())
        .unwrap_or_default()
}

/// The CLB-mode cloud config in the emulator's scope, and an ARM client for `url`.
pub(crate) fn azure_side(url: String, credential: Credential) -> (wit::Config, ArmClient) {
    let scope = clb_host::simulate::scope();
    let cloud_config = format!(
        "loadBalancerBackendPoolConfigurationType: podIP\nloadBalancerSku: standardV2\n\
         subscriptionId: {}\nresourceGroup: {}\nlocation: {}\nvnetName: {}\n",
        scope.subscription, scope.resource_group, scope.location, scope.vnet
    );
    let path = std::path::Path::new("azure.json");
    let config = clb_host::inputs::parse_config(path, &cloud_config).unwrap();
    let scope = clb_host::inputs::parse_scope(path, &cloud_config, &scope.service_gateway).unwrap();
    (config, ArmClient::new(ArmConfig::new(url, scope), credential).unwrap())
}

pub(crate) async fn create_namespace(client: &::kube::Client, namespace: &str) {
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &manifest(serde_json::json!({"metadata": {"name": namespace}})))
        .await
        .expect("creates the namespace");
}

/// A Node with one InternalIP.
pub(crate) async fn create_node(client: &::kube::Client, name: &str, ip: &str) {
    let params = PostParams::default();
    let nodes = Api::<Node>::all(client.clone());
    let node: Node = manifest(serde_json::json!({
        "metadata": {"name": name},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
    }));
    let created = nodes.create(&params, &node).await.expect("creates the Node");
    // A Node's status is not taken on create: it is written through its subresource.
    nodes
        .replace_status(name, &params, &Node { status: node.status, ..created })
        .await
        .expect("writes the Node's addresses");
}

/// A `LoadBalancer` Service `name` with one ready pod `pod_ip` on `node`; its UID.
pub(crate) async fn create_service_with_pod(
    client: &::kube::Client,
    namespace: &str,
    name: &str,
    node: &str,
    pod_ip: &str,
) -> String {
    let params = PostParams::default();
    let service = Api::<Service>::namespaced(client.clone(), namespace)
        .create(
            &params,
            &manifest(serde_json::json!({
                "metadata": {"name": name},
                "spec": {
                    "type": "LoadBalancer",
                    "externalTrafficPolicy": "Local",
                    "selector": {"app": name},
                    "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                },
            })),
        )
        .await
        .expect("creates the Service");
    let uid = service.metadata.uid.clone().expect("the API server gives a UID");
    Api::<EndpointSlice>::namespaced(client.clone(), namespace)
        .create(
            &params,
            &manifest(serde_json::json!({
                "metadata": {
                    "name": format!("{name}-abc12"),
                    "labels": {"kubernetes.io/service-name": name},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name, "uid": uid}],
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [pod_ip], "nodeName": node, "conditions": {"ready": true}}],
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            })),
        )
        .await
        .expect("creates the EndpointSlice");
    uid
}

/// Waits until NRP has the service `uid` with `pod_ip` under `node_ip`.
pub(crate) async fn registered_in_nrp(emulator: &Emulator, uid: &str, node_ip: &str, pod_ip: &str) {
    eventually("the service registered in NRP with its pod under the node's IP", async || {
        let resources = emulator.resources();
        let bound = resources.locations.get(node_ip).and_then(|l| l.get(pod_ip));
        match bound {
            Some(services) if resources.services.contains_key(uid) && services.contains(uid) => Ok(()),
            _ => Err(format!("services {:?}, locations {:?}", resources.services.keys(), resources.locations)),
        }
    })
    .await;
}

/// Waits for the Service's one ingress IP and checks that it is a public IP of the emulator.
pub(crate) async fn ingress_ip(services: &Api<Service>, name: &str, emulator: &Emulator) -> String {
    let ip = eventually("the Service's ingress IP", async || {
        let service = services.get(name).await.map_err(|e| e.to_string())?;
        let ips = ingress_ips(&service);
        match ips.as_slice() {
            [ip] => Ok(ip.clone()),
            _ => Err(format!("ingress {ips:?}, finalizers {:?}", service.metadata.finalizers)),
        }
    })
    .await;
    let public_ips: Vec<String> = emulator.resources().public_ips.values().map(|p| p.ip_address.clone()).collect();
    assert!(public_ips.contains(&ip), "the ingress IP {ip} is a public IP of the emulator: {public_ips:?}");
    ip
}

/// Deletes the Service and waits until it is gone from the API server (its finalizer released
/// by a running reconciler) and from NRP.
pub(crate) async fn delete_service(services: &Api<Service>, name: &str, uid: &str, emulator: &Emulator) {
    services.delete(name, &DeleteParams::default()).await.expect("deletes the Service");
    eventually("the Service gone from the API server (its finalizer released)", async || {
        match services.get_opt(name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(s) => Err(format!("still there with finalizers {:?}", s.metadata.finalizers)),
        }
    })
    .await;
    eventually("the service gone from NRP", async || {
        let resources = emulator.resources();
        let bound = resources.locations.values().flat_map(|l| l.values()).any(|s| s.contains(uid));
        if resources.services.contains_key(uid) || bound {
            Err(format!("services {:?}, locations {:?}", resources.services.keys(), resources.locations))
        } else {
            Ok(())
        }
    })
    .await;
}

pub(crate) async fn delete_node(client: &::kube::Client, node: &str) {
    Api::<Node>::all(client.clone()).delete(node, &DeleteParams::default()).await.expect("deletes the Node");
}

pub(crate) async fn delete_namespace(client: &::kube::Client, namespace: &str) {
    Api::<Namespace>::all(client.clone())
        .delete(namespace, &DeleteParams::default())
        .await
        .expect("deletes the namespace");
}

#[test]
fn a_service_created_through_the_api_server_gets_its_pods_in_nrp_and_an_ingress_ip_and_is_released_after_deletion() {
    let server = apiserver();
    let _slot = reconcilers_slot();
    let test = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    test.block_on(async {
        let client = clb_host::run::connect(Some(&server.kubeconfig)).await.expect("connects to the test API server");
        let namespace = format!("clb-e2e-{}", std::process::id());
        let node_name = format!("{namespace}-node");

        // The emulated Azure, over HTTP, in the scope the cloud config names.
        let emulator = Arc::new(Emulator::new(clb_host::simulate::scope()));
        let azure = EmulatorServer::start(emulator.clone(), "127.0.0.1:0".parse().unwrap()).await.unwrap();
        let (config, arm) = azure_side(azure.url(), Credential::None);

        // `run`, on its own thread and runtime as in the binary, until `stop` is sent.
        let settings = clb_host::run::Settings {
            kube: client.clone(),
            arm,
            config,
            instance: "clb-e2e".into(),
            leader_election: None,
            resource_lock: Default::default(),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let reconciler = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(clb_host::run::run(clb_tests::builtin(), settings, async {
                let _ = stopped.await;
            }))
        });

        create_namespace(&client, &namespace).await;
        create_node(&client, &node_name, "10.224.0.4").await;
        let uid = create_service_with_pod(&client, &namespace, "web", &node_name, "10.244.1.10").await;
        let services = Api::<Service>::namespaced(client.clone(), &namespace);

        registered_in_nrp(&emulator, &uid, "10.224.0.4", "10.244.1.10").await;
        ingress_ip(&services, "web", &emulator).await;

        let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), &namespace);
        eventually("an EnsuredLoadBalancer Event regarding the Service", async || {
            let listed = events.list(&Default::default()).await.map_err(|e| e.to_string())?;
            let reasons: Vec<_> =
                listed.items.iter().map(|e| (e.reason.clone(), e.involved_object.uid.clone())).collect();
            let found = listed.items.iter().any(|e| {
                e.reason.as_deref() == Some("EnsuredLoadBalancer")
                    && e.involved_object.uid.as_deref() == Some(uid.as_str())
                    && e.type_.as_deref() == Some("Normal")
            });
            if found { Ok(()) } else { Err(format!("events {reasons:?}")) }
        })
        .await;

        delete_service(&services, "web", &uid, &emulator).await;

        stop.send(()).expect("the reconciler is still running");
        let result = tokio::task::spawn_blocking(move || reconciler.join()).await.unwrap();
        result.expect("the reconciler thread did not panic").expect("the reconciler stopped cleanly");
        delete_node(&client, &node_name).await;
        delete_namespace(&client, &namespace).await;
    });
}
