//! `clb-host run` against a real kube-apiserver (`harness/apiserver`) and the Azure emulator
//! over HTTP: the watchers, the Kubernetes writes and the loop on real time, end to end.

use ::kube::api::{Api, DeleteParams, PostParams};
use clb_host::azure::{ArmClient, ArmConfig, Credential};
use clb_host::emulator::{Emulator, EmulatorServer};
use clb_host::sandbox::bindings::clb::reconciler::types as wit;
use clb_tests::apiserver::apiserver;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::sync::Arc;
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

pub(crate) fn manifest<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("a valid manifest")
}

/// The emulated Azure over HTTP, an ARM client of it, and a CLB-mode cloud config in its scope.
/// Keep the server: the emulator stops serving when it is dropped.
pub(crate) async fn emulated_azure() -> (Arc<Emulator>, EmulatorServer, ArmClient, wit::Config) {
    let emulator = Arc::new(Emulator::new(clb_host::simulate::scope()));
    let azure = EmulatorServer::start(emulator.clone(), "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let scope = clb_host::simulate::scope();
    let cloud_config = format!(
        "loadBalancerBackendPoolConfigurationType: podIP\nloadBalancerSku: standardV2\n\
         subscriptionId: {}\nresourceGroup: {}\nlocation: {}\nvnetName: {}\n",
        scope.subscription, scope.resource_group, scope.location, scope.vnet
    );
    let path = std::path::Path::new("azure.json");
    let config = clb_host::inputs::parse_config(path, &cloud_config).unwrap();
    let scope = clb_host::inputs::parse_scope(path, &cloud_config, &scope.service_gateway).unwrap();
    let arm = ArmClient::new(ArmConfig::new(azure.url(), scope), Credential::None).unwrap();
    (emulator, azure, arm, config)
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

#[test]
fn a_service_created_through_the_api_server_gets_its_pods_in_nrp_and_an_ingress_ip_and_is_released_after_deletion() {
    let server = apiserver();
    let test = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    test.block_on(async {
        let client = clb_host::run::connect(Some(&server.kubeconfig)).await.expect("connects to the test API server");
        let namespace = format!("clb-e2e-{}", std::process::id());
        let node_name = format!("{namespace}-node");

        let (emulator, _azure, arm, config) = emulated_azure().await;

        // `run`, on its own thread and runtime as in the binary, until `stop` is sent.
        let settings = clb_host::run::Settings { kube: client.clone(), arm, config, instance: "clb-e2e".into() };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let reconciler = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(clb_host::run::run(clb_tests::builtin(), settings, async {
                let _ = stopped.await;
            }))
        });

        let params = PostParams::default();
        Api::<Namespace>::all(client.clone())
            .create(&params, &manifest(serde_json::json!({"metadata": {"name": namespace}})))
            .await
            .expect("creates the namespace");
        let nodes = Api::<Node>::all(client.clone());
        let node: Node = manifest(serde_json::json!({
            "metadata": {"name": node_name},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.224.0.4"}]},
        }));
        let created = nodes.create(&params, &node).await.expect("creates the Node");
        // A Node's status is not taken on create: it is written through its subresource.
        nodes
            .replace_status(&node_name, &params, &Node { status: node.status, ..created })
            .await
            .expect("writes the Node's addresses");

        let services = Api::<Service>::namespaced(client.clone(), &namespace);
        let service = services
            .create(
                &params,
                &manifest(serde_json::json!({
                    "metadata": {"name": "web"},
                    "spec": {
                        "type": "LoadBalancer",
                        "externalTrafficPolicy": "Local",
                        "selector": {"app": "web"},
                        "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                    },
                })),
            )
            .await
            .expect("creates the Service");
        let uid = service.metadata.uid.clone().expect("the API server gives a UID");
        Api::<EndpointSlice>::namespaced(client.clone(), &namespace)
            .create(
                &params,
                &manifest(serde_json::json!({
                    "metadata": {
                        "name": "web-abc12",
                        "labels": {"kubernetes.io/service-name": "web"},
                        "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": uid}],
                    },
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": ["10.244.1.10"], "nodeName": node_name, "conditions": {"ready": true}}],
                    "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                })),
            )
            .await
            .expect("creates the EndpointSlice");

        eventually("the service registered in NRP with its pod under the node's IP", async || {
            let resources = emulator.resources();
            let bound = resources.locations.get("10.224.0.4").and_then(|l| l.get("10.244.1.10"));
            match bound {
                Some(services) if resources.services.contains_key(&uid) && services.contains(&uid) => Ok(()),
                _ => Err(format!("services {:?}, locations {:?}", resources.services.keys(), resources.locations)),
            }
        })
        .await;
        let ip = eventually("the Service's ingress IP", async || {
            let service = services.get("web").await.map_err(|e| e.to_string())?;
            let ips = ingress_ips(&service);
            match ips.as_slice() {
                [ip] => Ok(ip.clone()),
                _ => Err(format!("ingress {ips:?}, finalizers {:?}", service.metadata.finalizers)),
            }
        })
        .await;
        let public_ips: Vec<String> = emulator.resources().public_ips.values().map(|p| p.ip_address.clone()).collect();
        assert!(public_ips.contains(&ip), "the ingress IP {ip} is a public IP of the emulator: {public_ips:?}");

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

        services.delete("web", &DeleteParams::default()).await.expect("deletes the Service");
        eventually("the Service gone from the API server (its finalizer released)", async || {
            match services.get_opt("web").await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(s) => Err(format!("still there with finalizers {:?}", s.metadata.finalizers)),
            }
        })
        .await;
        eventually("the service gone from NRP", async || {
            let resources = emulator.resources();
            let bound = resources.locations.values().flat_map(|l| l.values()).any(|s| s.contains(&uid));
            if resources.services.contains_key(&uid) || bound {
                Err(format!("services {:?}, locations {:?}", resources.services.keys(), resources.locations))
            } else {
                Ok(())
            }
        })
        .await;

        stop.send(()).expect("the reconciler is still running");
        let result = tokio::task::spawn_blocking(move || reconciler.join()).await.unwrap();
        result.expect("the reconciler thread did not panic").expect("the reconciler stopped cleanly");
        nodes.delete(&node_name, &DeleteParams::default()).await.expect("deletes the Node");
        Api::<Namespace>::all(client)
            .delete(&namespace, &DeleteParams::default())
            .await
            .expect("deletes the namespace");
    });
}
