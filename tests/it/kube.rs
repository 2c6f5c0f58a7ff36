//! `clb-host run` against a real kube-apiserver (`harness/apiserver`) and the Azure emulator
//! over HTTP, end to end: the watchers, the Kubernetes writes and the loop on real time.
//!
//! Every test runs the host under a token of the ServiceAccount of `examples/deploy/rbac.yaml`
//! (applied as admin first), so a right the example lacks fails here. The tests' own writes go
//! through the admin client. Every `run` watches the whole cluster, so the tests take turns
//! ([`e2e`]); each keeps to its own namespace, Node and IP ranges (its `index`), so that what an
//! earlier, failed test left behind does not change what a later one sees.

use ::kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use clb_arm::{ArmClient, ArmConfig, Credential};
use clb_azure::{
    self as azure, AzureApi as _, BackendPool, IpVersion, LoadBalancerSpec, Operation, PoolRef, PublicIpSpec,
};
use clb_emulator::{Emulator, EmulatorServer, Fault, FaultMode};
use clb_host::live::settings::RunError;
use clb_kube::lease::{LeaseLockConfig, RESOURCE_LOCK_NAMESPACE};
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_tests::apiserver::apiserver;
use clb_tests::watch_proxy::{BeforeForward, WatchProxy};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long the system may take to converge after a change.
const CONVERGE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);
/// The field manager of the tests' own writes.
const MANAGER: &str = "clb-e2e";

/// Polls `check` until it gives `Ok`, or fails the test after [`CONVERGE`] with what it last
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
    let emulator = Arc::new(Emulator::new(clb_emulator::scope()));
    let azure = EmulatorServer::start(emulator.clone(), "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let (config, arm) = azure_side(azure.url(), Credential::None);
    (emulator, azure, arm, config)
}

/// The CLB-mode cloud config in the emulator's scope, and an ARM client for `url`.
pub(crate) fn azure_side(url: String, credential: Credential) -> (wit::Config, ArmClient) {
    let scope = clb_emulator::scope();
    let cloud_config = format!(
        "loadBalancerBackendPoolConfigurationType: podIP\nloadBalancerSku: standardV2\n\
         subscriptionId: {}\nresourceGroup: {}\nlocation: {}\nvnetName: {}\n",
        scope.subscription, scope.resource_group, scope.location, scope.vnet
    );
    let path = std::path::Path::new("azure.json");
    let config = clb_executor::inputs::parse_config(path, &cloud_config).unwrap();
    let scope = clb_executor::inputs::parse_scope(path, &cloud_config, &scope.service_gateway).unwrap();
    (config, ArmClient::new(ArmConfig::new(url, scope), credential).unwrap())
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

/// Held by a test while it runs reconcilers: they watch every namespace of the shared API
/// server, so two tests' reconcilers would fight over each other's Services. Shared with the
/// leader-election tests (`lease.rs`).
pub(crate) fn reconcilers_slot() -> MutexGuard<'static, ()> {
    static SLOT: Mutex<()> = Mutex::new(());
    SLOT.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs one end-to-end test: one at a time, on its own runtime, with a fresh [`Env`] that is
/// cleaned up after the test passes.
pub(crate) fn e2e(index: u8, test: impl AsyncFnOnce(&Env)) {
    let _turn = reconcilers_slot();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let env = Env::new(index).await;
        test(&env).await;
        env.clean_up().await;
    });
}

/// One test's world: its namespace and Nodes in the test API server, its emulated Azure, and
/// the controller's credentials.
pub(crate) struct Env {
    index: u8,
    pub(crate) admin: ::kube::Client,
    pub(crate) namespace: String,
    /// The ServiceAccount's kubeconfig (`examples/deploy/rbac.yaml`).
    pub(crate) controller_kubeconfig: PathBuf,
    pub(crate) emulator: Arc<Emulator>,
    pub(crate) azure: EmulatorServer,
    pub(crate) cloud_config: String,
}

impl Env {
    async fn new(index: u8) -> Self {
        let server = apiserver();
        let admin = server.admin().await;
        let controller_kubeconfig = server.controller_kubeconfig(&admin, None).await;
        let namespace = format!("clb-e2e-{}-{index}", std::process::id());
        apply(&Api::<Namespace>::all(admin.clone()), &namespace, serde_json::json!({})).await;
        let scope = clb_emulator::scope();
        let emulator = Arc::new(Emulator::new(scope.clone()));
        let azure = EmulatorServer::start(emulator.clone(), "127.0.0.1:0".parse().unwrap()).await.unwrap();
        let cloud_config = format!(
            "loadBalancerBackendPoolConfigurationType: podIP\nloadBalancerSku: standardV2\n\
             subscriptionId: {}\nresourceGroup: {}\nlocation: {}\nvnetName: {}\n",
            scope.subscription, scope.resource_group, scope.location, scope.vnet
        );
        let env = Self { index, admin, namespace, controller_kubeconfig, emulator, azure, cloud_config };
        env.node(1).await;
        env
    }

    /// Node `n` of this test, with the InternalIP [`Env::location`]`(n)`.
    async fn node(&self, n: u8) {
        let name = self.node_name(n);
        let nodes = Api::<Node>::all(self.admin.clone());
        apply(&nodes, &name, serde_json::json!({})).await;
        // A Node's status is not taken with the object: it is written through its subresource.
        let status = serde_json::json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"addresses": [{"type": "InternalIP", "address": self.location(n)}]},
        });
        nodes
            .patch_status(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&status))
            .await
            .expect("writes the Node's addresses");
    }

    fn node_name(&self, n: u8) -> String {
        format!("{}-node-{n}", self.namespace)
    }

    fn location(&self, n: u8) -> String {
        format!("10.224.{}.{n}", self.index)
    }

    fn pod(&self, n: u8) -> String {
        format!("10.244.{}.{n}", self.index)
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.admin.clone(), &self.namespace)
    }

    fn slices(&self) -> Api<EndpointSlice> {
        Api::namespaced(self.admin.clone(), &self.namespace)
    }

    /// A LoadBalancer Service on port 80 → 8080 with this `externalTrafficPolicy`; its UID.
    async fn service(&self, name: &str, traffic_policy: &str) -> String {
        let service = apply(
            &self.services(),
            name,
            serde_json::json!({
                "spec": {
                    "type": "LoadBalancer",
                    "externalTrafficPolicy": traffic_policy,
                    "selector": {"app": name},
                    "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                },
            }),
        )
        .await;
        service.metadata.uid.expect("the API server gives a UID")
    }

    /// The EndpointSlice `<service>-1` of a Service, with exactly these endpoints: pod `n` on
    /// node `m` for each `(n, m)`, all ready.
    async fn endpoints(&self, service: &str, uid: &str, endpoints: &[(u8, u8)]) {
        let endpoints: Vec<_> = endpoints
            .iter()
            .map(|&(pod, node)| {
                serde_json::json!({
                    "addresses": [self.pod(pod)], "nodeName": self.node_name(node), "conditions": {"ready": true},
                })
            })
            .collect();
        apply(
            &self.slices(),
            &format!("{service}-1"),
            serde_json::json!({
                "metadata": {
                    "labels": {"kubernetes.io/service-name": service},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service, "uid": uid}],
                },
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            }),
        )
        .await;
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.admin.clone(), &self.namespace)
    }

    /// An Outbound service registered in NRP, as the outbound lifecycle registers one.
    async fn outbound_service(&self, name: &str) {
        let request = azure::ServiceRequest {
            name: name.into(),
            service_type: azure::ServiceType::Outbound,
            backend_pools: vec![],
            nat_gateway: azure::NatGatewayLink::Omit,
            is_delete: false,
        };
        self.emulator.update_services(azure::UpdateAction::PartialUpdate, &[request]).await.expect("registers it");
    }

    /// A running Pod `name` with pod IP `pod` on node `node`, labelled for egress with `label`
    /// (no label: `None`). Its status is written as a kubelet would, through the subresource.
    async fn egress_pod(&self, name: &str, label: Option<&str>, pod: u8, node: u8) {
        // Without a controller manager nobody makes the namespace's default ServiceAccount, which
        // the API server's admission requires of a Pod.
        apply(
            &Api::<ServiceAccount>::namespaced(self.admin.clone(), &self.namespace),
            "default",
            serde_json::json!({}),
        )
        .await;
        let labels = match label {
            Some(value) => serde_json::json!({"app": name, (clb_executor::records::EGRESS_LABEL): value}),
            None => serde_json::json!({"app": name}),
        };
        let body = serde_json::json!({
            "metadata": {"labels": labels},
            "spec": {
                "nodeName": self.node_name(node),
                "automountServiceAccountToken": false,
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
            },
        });
        apply(&self.pods(), name, body).await;
        let status = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "status": {
                "phase": "Running",
                "podIP": self.pod(pod), "podIPs": [{"ip": self.pod(pod)}],
                "hostIP": self.location(node), "hostIPs": [{"ip": self.location(node)}],
            },
        });
        self.pods()
            .patch_status(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&status))
            .await
            .expect("writes the Pod's status");
    }

    /// `(location, address)` for every NRP address bound to `uid`.
    fn bound(&self, uid: &str) -> BTreeSet<(String, String)> {
        let mut bound = BTreeSet::new();
        for (location, addresses) in self.emulator.resources().locations {
            for (address, services) in addresses {
                if services.contains(uid) {
                    bound.insert((location.clone(), address));
                }
            }
        }
        bound
    }

    /// Waits until NRP registers `uid` and binds exactly these `(pod, node)` pairs to it.
    async fn nrp_binds(&self, uid: &str, endpoints: &[(u8, u8)]) {
        let want: BTreeSet<_> = endpoints.iter().map(|&(pod, node)| (self.location(node), self.pod(pod))).collect();
        eventually(&format!("NRP binds {want:?} to {uid}"), async || {
            let registered = self.emulator.resources().services.contains_key(uid);
            let bound = self.bound(uid);
            if registered && bound == want { Ok(()) } else { Err(format!("registered {registered}, bound {bound:?}")) }
        })
        .await;
    }

    /// Waits until NRP has nothing of `uid`: not registered, no address bound to it.
    async fn nrp_forgets(&self, uid: &str) {
        eventually(&format!("NRP forgets {uid}"), async || {
            let registered = self.emulator.resources().services.contains_key(uid);
            let bound = self.bound(uid);
            if !registered && bound.is_empty() {
                Ok(())
            } else {
                Err(format!("registered {registered}, bound {bound:?}"))
            }
        })
        .await;
    }

    /// Waits for the Service's one ingress IP and checks that it is one of the emulator's public IPs.
    async fn ingress_ip(&self, name: &str) -> String {
        let ip = eventually(&format!("{name}'s ingress IP"), async || {
            let service = self.services().get(name).await.map_err(|e| e.to_string())?;
            match ingress_ips(&service).as_slice() {
                [ip] => Ok(ip.clone()),
                other => Err(format!("ingress {other:?}, finalizers {:?}", service.metadata.finalizers)),
            }
        })
        .await;
        let public_ips: Vec<String> =
            self.emulator.resources().public_ips.values().map(|p| p.ip_address.clone()).collect();
        assert!(public_ips.contains(&ip), "the ingress IP {ip} is a public IP of the emulator: {public_ips:?}");
        ip
    }

    /// A `Local` Service with these endpoints, once NRP binds them and it has its ingress IP;
    /// its UID.
    pub(crate) async fn provisioned(&self, name: &str, endpoints: &[(u8, u8)]) -> String {
        let uid = self.service(name, "Local").await;
        self.endpoints(name, &uid, endpoints).await;
        self.nrp_binds(&uid, endpoints).await;
        self.ingress_ip(name).await;
        uid
    }

    /// How many calls of `operation` the emulator answered with an outcome starting so (`500`,
    /// `hang`…).
    fn calls(&self, operation: Operation, outcome: &str) -> usize {
        let log = self.emulator.state().log;
        log.iter().filter(|e| e.operation == operation.name() && e.outcome.starts_with(outcome)).count()
    }

    /// Checks that the Service is terminating and its finalizer holds it.
    async fn held(&self, name: &str) {
        let service = self.services().get(name).await.expect("the Service is still there");
        assert!(service.metadata.deletion_timestamp.is_some(), "{name} is terminating");
        let finalizers = service.metadata.finalizers.unwrap_or_default();
        assert!(
            finalizers.iter().any(|f| f == clb_guest::tracker::FINALIZER),
            "the finalizer holds {name}: {finalizers:?}"
        );
    }

    /// Waits until the controller's finalizer is on the Service.
    async fn held_by_finalizer(&self, name: &str) {
        eventually(&format!("the finalizer on {name}"), async || {
            let service = self.services().get(name).await.map_err(|e| e.to_string())?;
            let finalizers = service.metadata.finalizers.unwrap_or_default();
            let held = finalizers.iter().any(|f| f == clb_guest::tracker::FINALIZER);
            if held { Ok(()) } else { Err(format!("{finalizers:?}")) }
        })
        .await;
    }

    /// Deletes a Service as a user would; its finalizer may hold it.
    async fn delete(&self, name: &str) {
        self.services().delete(name, &DeleteParams::default()).await.expect("deletes the Service");
    }

    /// Waits until the Service is gone from the API server (its finalizer released).
    async fn gone(&self, name: &str) {
        eventually(&format!("{name} gone from the API server"), async || {
            match self.services().get_opt(name).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(s) => Err(format!("still there with finalizers {:?}", s.metadata.finalizers)),
            }
        })
        .await;
    }

    /// Waits until the deleted Service is gone from the API server and from NRP.
    async fn released(&self, name: &str, uid: &str) {
        self.gone(name).await;
        self.nrp_forgets(uid).await;
    }

    /// Waits for an Event of this type and reason regarding the Service with `uid`.
    async fn event(&self, event_type: &str, reason: &str, uid: &str) -> Event {
        let events = Api::<Event>::namespaced(self.admin.clone(), &self.namespace);
        eventually(&format!("a {event_type} {reason} Event regarding {uid}"), async || {
            let listed = events.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
            let seen: Vec<_> = listed.items.iter().map(|e| (e.type_.clone(), e.reason.clone())).collect();
            listed
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.type_.as_deref() == Some(event_type)
                        && e.involved_object.uid.as_deref() == Some(uid)
                })
                .ok_or_else(|| format!("events {seen:?}"))
        })
        .await
    }

    /// `clb-host run` against this test's API server and emulator as a command line (for
    /// [`clb_host_child`]), then `extra`; its cloud config written to a file named after `tag`,
    /// which is returned for the test to remove.
    pub(crate) fn run_command_line(&self, tag: &str, extra: &[String]) -> (PathBuf, Vec<String>) {
        let cloud_config = clb_tests::process_dir().join(format!("e2e-{tag}-azure.json"));
        std::fs::write(&cloud_config, &self.cloud_config).unwrap();
        let path = |p: &Path| p.to_str().expect("a UTF-8 path").to_owned();
        let mut command_line = vec![
            "clb-host".to_owned(),
            "run".into(),
            format!("--kubeconfig={}", path(&self.controller_kubeconfig)),
            format!("--cloud-config={}", path(&cloud_config)),
            format!("--azure-url={}", self.azure.url()),
            "--credential=none".into(),
        ];
        command_line.extend_from_slice(extra);
        (cloud_config, command_line)
    }

    /// Starts `clb-host run` under the ServiceAccount's token against this test's emulator.
    fn start(&self) -> Controller {
        self.start_through(self.controller_kubeconfig.clone())
    }

    /// Starts `clb-host run` with this kubeconfig, on its own thread and runtime as in the
    /// binary; the client is made there, so that it lives on the runtime that uses it.
    fn start_through(&self, kubeconfig: PathBuf) -> Controller {
        self.start_with(kubeconfig, &self.cloud_config, None, None)
    }

    /// Starts `clb-host run` recording its calls into the logic (`run --record`).
    fn start_recording(&self, trace: Arc<clb_sandbox::trace::Recorder>) -> Controller {
        self.start_with(self.controller_kubeconfig.clone(), &self.cloud_config, None, Some(trace))
    }

    /// Starts `clb-host run` under the ServiceAccount's token with this cloud config (read as
    /// the binary reads it) and, if given, this Azure resource lock.
    fn start_with(
        &self,
        kubeconfig: PathBuf,
        cloud_config: &str,
        resource_lock: Option<LeaseLockConfig>,
        trace: Option<Arc<clb_sandbox::trace::Recorder>>,
    ) -> Controller {
        let path = Path::new("azure.json");
        let cloud = clb_executor::inputs::parse_cloud_config(path, cloud_config).unwrap();
        let (slb_configurations, pool_updater) = (cloud.slb_configurations(), cloud.pool_updater_config());
        let config: wit::Config = cloud.into();
        let scope = clb_executor::inputs::parse_scope(path, cloud_config, clb_azure::DEFAULT_SERVICE_GATEWAY).unwrap();
        let arm_config = ArmConfig::new(self.azure.url(), scope);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let kube = clb_host::live::settings::connect(Some(&kubeconfig)).await?;
                let arm = ArmClient::new(arm_config, Credential::None).expect("an ARM client");
                let mut settings = clb_host::live::settings::Settings::new(kube, arm, config, "clb-e2e");
                settings.slb_configurations = slb_configurations;
                settings.pool_updater = pool_updater;
                if let Some(resource_lock) = resource_lock {
                    settings.resource_lock = resource_lock;
                }
                settings.stats.trace = trace;
                clb_host::live::run::run(clb_tests::builtin(), settings, async {
                    let _ = stopped.await;
                })
                .await
            })
        });
        Controller { stop, thread }
    }

    /// This test's standard load balancer in multi-SLB local-service mode.
    fn load_balancer(&self) -> String {
        format!("lb-{}", self.index)
    }

    /// A multi-SLB local-service cloud config: one load balancer, [`Env::load_balancer`], and
    /// the backend-pool updater ticking every second.
    fn multi_slb_cloud_config(&self) -> String {
        let scope = clb_emulator::scope();
        format!(
            "loadBalancerBackendPoolConfigurationType: nodeIP\nloadBalancerSku: standard\n\
             multipleStandardLoadBalancerConfigurations:\n- name: {}\n  primaryVMSet: nodepool1\n\
             loadBalancerBackendPoolUpdateIntervalInSeconds: 1\n\
             subscriptionId: {}\nresourceGroup: {}\nlocation: {}\nvnetName: {}\n",
            self.load_balancer(),
            scope.subscription,
            scope.resource_group,
            scope.location,
            scope.vnet
        )
    }

    /// This test's Azure resource lock: a Lease of its own in kube-system, where the example
    /// RBAC lets the controller take it.
    fn resource_lock(&self) -> LeaseLockConfig {
        LeaseLockConfig { name: format!("{}-lock", self.namespace), ..LeaseLockConfig::default() }
    }

    /// Starts `clb-host run` in multi-SLB local-service mode with [`Env::resource_lock`].
    fn start_multi_slb(&self) -> Controller {
        self.start_with(
            self.controller_kubeconfig.clone(),
            &self.multi_slb_cloud_config(),
            Some(self.resource_lock()),
            None,
        )
    }

    /// The load balancer in the emulator with the local Service's own pool (`<namespace>-<name>`,
    /// where placement puts it), empty.
    async fn slb_pool(&self, service: &str) -> PoolRef {
        let lb = self.load_balancer();
        let public_ip = format!("{lb}-frontend");
        let spec = PublicIpSpec { name: public_ip.clone(), version: IpVersion::IPv4 };
        self.emulator.put_public_ip(&spec).await.expect("creates the public IP");
        let pool = format!("{}-{service}", self.namespace);
        let spec = LoadBalancerSpec { name: lb.clone(), public_ip, backend_pool: pool.clone(), rules: vec![] };
        self.emulator.put_load_balancer(&spec).await.expect("creates the load balancer");
        PoolRef { load_balancer: lb, pool }
    }

    /// The IPs the pool holds in the emulator.
    async fn pool_ips(&self, pool: &PoolRef) -> BTreeSet<String> {
        let (content, _) = self.emulator.get_backend_pool(pool).await.expect("reads the pool");
        content.addresses.into_iter().map(|a| a.ip_address).collect()
    }

    /// Waits until the pool holds exactly the IPs of these Nodes, each named after its Node.
    async fn pool_holds(&self, pool: &PoolRef, nodes: &[u8]) {
        let want: BTreeMap<String, String> = nodes.iter().map(|&n| (self.location(n), self.node_name(n))).collect();
        eventually(&format!("{}/{} holds {want:?}", pool.load_balancer, pool.pool), async || {
            let (content, _) = self.emulator.get_backend_pool(pool).await.map_err(|e| e.to_string())?;
            let held: BTreeMap<String, String> =
                content.addresses.into_iter().map(|a| (a.ip_address, a.name)).collect();
            if held == want { Ok(()) } else { Err(format!("{held:?}")) }
        })
        .await;
    }

    /// Removes what the test made, whether or not a controller still runs: finalizers are taken
    /// off by hand, so nothing waits for one.
    async fn clean_up(self) {
        let params = PatchParams::default();
        let no_finalizers = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
        for service in self.services().list(&ListParams::default()).await.expect("lists the Services").items {
            let name = service.metadata.name.unwrap_or_default();
            let _ = self.services().patch(&name, &params, &no_finalizers).await;
            let _ = self.services().delete(&name, &DeleteParams::default()).await;
        }
        let _ = self.slices().delete_collection(&DeleteParams::default(), &ListParams::default()).await;
        for pod in self.pods().list(&ListParams::default()).await.expect("lists the Pods").items {
            let _ = self.pods().patch(&pod.metadata.name.unwrap_or_default(), &params, &no_finalizers).await;
        }
        // No kubelet confirms a graceful deletion: Pods go at once.
        let _ = self.pods().delete_collection(&DeleteParams::default().grace_period(0), &ListParams::default()).await;
        let nodes = Api::<Node>::all(self.admin.clone());
        for node in nodes.list(&ListParams::default()).await.expect("lists the Nodes").items {
            let name = node.metadata.name.unwrap_or_default();
            if name.starts_with(&self.namespace) {
                let _ = nodes.delete(&name, &DeleteParams::default()).await;
            }
        }
        let leases = Api::<Lease>::namespaced(self.admin.clone(), RESOURCE_LOCK_NAMESPACE);
        let _ = leases.delete(&self.resource_lock().name, &DeleteParams::default()).await;
        // There is no namespace controller: the namespace stays Terminating, empty.
        let _ = Api::<Namespace>::all(self.admin.clone()).delete(&self.namespace, &DeleteParams::default()).await;
        let _ = std::fs::remove_file(&self.controller_kubeconfig);
    }
}

/// Server-side apply of `body` as `name` (apiVersion, kind and name filled in); the result.
async fn apply<K>(api: &Api<K>, name: &str, mut body: serde_json::Value) -> K
where
    K: ::kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    body["apiVersion"] = K::api_version(&()).into();
    body["kind"] = K::kind(&()).into();
    body["metadata"]["name"] = name.into();
    api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body))
        .await
        .unwrap_or_else(|e| panic!("applies {} {name}: {e}", K::kind(&())))
}

/// A running `clb-host run`.
struct Controller {
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<Result<(), RunError>>,
}

impl Controller {
    /// Stops it as a signal would and checks that it stopped cleanly.
    async fn stop(self) {
        self.stop.send(()).expect("the controller is still running");
        let joined = tokio::task::spawn_blocking(move || self.thread.join()).await.unwrap();
        joined.expect("the controller thread did not panic").expect("the controller stopped cleanly");
    }
}

// Upstream TestGetServiceByUID_UIDMismatchReturnsNotFound: the production client acts on no
// same-name Service of another UID: its status patch and both finalizer changes are refused 409
// UIDMismatch and the object is left as it was (same resourceVersion); with the Service's own UID
// a write lands.
#[test]
fn the_kube_client_writes_nothing_to_a_same_name_service_of_another_uid() {
    use clb_executor::{KubeApi as _, UID_MISMATCH};
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let admin = apiserver().admin().await;
        let namespace = format!("clb-uid-guard-{}", std::process::id());
        apply(&Api::<Namespace>::all(admin.clone()), &namespace, serde_json::json!({})).await;
        let services = Api::<Service>::namespaced(admin.clone(), &namespace);
        // ClusterIP, so that no controller another test runs acts on it.
        let body = serde_json::json!({
            "metadata": { "finalizers": ["example.com/keep"] },
            "spec": { "type": "ClusterIP", "ports": [{ "protocol": "TCP", "port": 80, "targetPort": 8080 }] },
        });
        let created = apply(&services, "web", body).await;
        let uid = created.metadata.uid.clone().expect("a UID");
        let reference = |uid: &str| wit::ObjectRef {
            kind: "Service".into(),
            namespace: namespace.clone(),
            name: "web".into(),
            uid: uid.into(),
        };
        let other = reference("00000000-0000-0000-0000-0000000000ff");
        let client = clb_kube::KubeClient::new(admin.clone(), "uid-guard-test");
        let refused = client.patch_service_status(&other, &["20.0.0.9".into()]).await.unwrap_err();
        assert_eq!((refused.status, refused.reason.as_deref()), (409, Some(UID_MISMATCH)), "{refused:?}");
        let refused = client.set_finalizer(&other, "servicegateway.azure.com/service-cleanup", true).await.unwrap_err();
        assert_eq!((refused.status, refused.reason.as_deref()), (409, Some(UID_MISMATCH)), "{refused:?}");
        let refused = client.set_finalizer(&other, "example.com/keep", false).await.unwrap_err();
        assert_eq!((refused.status, refused.reason.as_deref()), (409, Some(UID_MISMATCH)), "{refused:?}");
        let after = services.get("web").await.unwrap();
        assert_eq!(after.metadata.resource_version, created.metadata.resource_version, "nothing was written");
        assert!(ingress_ips(&after).is_empty());
        assert_eq!(after.metadata.finalizers, Some(vec!["example.com/keep".to_owned()]));

        // (A ClusterIP Service may hold no ingress: the API server itself would refuse that, 422.)
        client.set_finalizer(&reference(&uid), "example.com/keep", false).await.unwrap();
        let written = services.get("web").await.unwrap();
        assert_eq!(written.metadata.finalizers, None, "with its own UID the write lands");

        let _ = services.delete("web", &DeleteParams::default()).await;
        let _ = Api::<Namespace>::all(admin.clone()).delete(&namespace, &DeleteParams::default()).await;
    });
}

/// What the race's proxy does before it forwards the `n`th PATCH (from 0): another writer's change,
/// made straight to the API server through the admin's Service API.
type Interference = Box<dyn Fn(Api<Service>, usize) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// A [`WatchProxy`] in front of the test API server that makes the race between a client's read and its
/// write deterministic: before it forwards a PATCH it lets another writer change the object, so the patch
/// arrives carrying the resourceVersion of a read that no longer holds. It records what it forwards.
struct RacingProxy {
    proxy: WatchProxy,
    /// `METHOD path` of each request, in the order they came.
    requests: Arc<Mutex<Vec<String>>>,
}

impl RacingProxy {
    async fn start(upstream: &str, services: Api<Service>, interfere: Interference) -> Self {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (recorded, patches, interfere) = (requests.clone(), Arc::new(AtomicUsize::new(0)), Arc::new(interfere));
        let before: BeforeForward = Box::new(move |method, path| {
            recorded.lock().unwrap().push(format!("{method} {path}"));
            let patch = (*method == hyper::Method::PATCH).then(|| patches.fetch_add(1, Ordering::SeqCst));
            let (services, interfere) = (services.clone(), interfere.clone());
            Box::pin(async move {
                if let Some(n) = patch {
                    interfere(services, n).await;
                }
            })
        });
        Self { proxy: WatchProxy::with_hook(upstream, before).await, requests }
    }

    fn url(&self) -> String {
        self.proxy.url()
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

/// The world of one race.
struct Race {
    /// The production client, with the controller's rights (`examples/deploy/rbac.yaml`), through the proxy.
    client: clb_kube::KubeClient,
    /// The Service `web` as first created.
    web: wit::ObjectRef,
    /// The admin's Service API of the race's namespace, straight to the API server.
    services: Api<Service>,
    proxy: RacingProxy,
}

impl Race {
    /// The requests the client sent, as `METHOD path` with `web`'s path shortened to `web`.
    fn calls(&self) -> Vec<String> {
        let path = format!("/api/v1/namespaces/{}/services/web", self.web.namespace);
        self.proxy.requests().iter().map(|request| request.replacen(&path, "web", 1)).collect()
    }
}

/// Runs `test` on a [`Race`] over the Service `web` made of `spec` with `finalizers`, in a namespace of its own
/// (named after `tag`), with `interfere` before each PATCH; the namespace is deleted after.
fn race(
    tag: &str,
    spec: serde_json::Value,
    finalizers: &[&str],
    interfere: Interference,
    test: impl AsyncFnOnce(&Race),
) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let server = apiserver();
        let admin = server.admin().await;
        let namespace = format!("clb-race-{tag}-{}", std::process::id());
        apply(&Api::<Namespace>::all(admin.clone()), &namespace, serde_json::json!({})).await;
        let services = Api::<Service>::namespaced(admin.clone(), &namespace);
        let created = create_web(&services, &spec, finalizers).await;
        let proxy = RacingProxy::start(&server.url, services.clone(), interfere).await;
        let kubeconfig = server.controller_kubeconfig(&admin, Some(&proxy.url())).await;
        let controller =
            clb_host::live::settings::connect(Some(&kubeconfig)).await.expect("connects through the proxy");
        let web = wit::ObjectRef {
            kind: "Service".into(),
            namespace: namespace.clone(),
            name: "web".into(),
            uid: created.metadata.uid.expect("a UID"),
        };
        let race = Race { client: clb_kube::KubeClient::new(controller, "race-test"), web, services, proxy };
        test(&race).await;

        let gone = serde_json::json!({ "metadata": { "finalizers": null } });
        let _ = race.services.patch("web", &PatchParams::default(), &Patch::Merge(&gone)).await;
        let _ = race.services.delete("web", &DeleteParams::default()).await;
        let _ = Api::<Namespace>::all(admin).delete(&namespace, &DeleteParams::default()).await;
    });
}

/// A ClusterIP `spec`, so that no controller another test runs acts on the Service.
fn cluster_ip() -> serde_json::Value {
    serde_json::json!({ "type": "ClusterIP", "ports": [{ "protocol": "TCP", "port": 80, "targetPort": 8080 }] })
}

async fn create_web(services: &Api<Service>, spec: &serde_json::Value, finalizers: &[&str]) -> Service {
    let body = manifest(serde_json::json!({ "metadata": { "name": "web", "finalizers": finalizers }, "spec": spec }));
    services.create(&Default::default(), &body).await.expect("creates the Service web")
}

/// Another controller adds its finalizer to `web`: a change of the object between a read and a write.
async fn add_finalizer_as_another_writer(services: &Api<Service>, finalizer: &str) {
    let current = services.get("web").await.expect("reads web");
    let mut finalizers = current.metadata.finalizers.unwrap_or_default();
    finalizers.push(finalizer.to_owned());
    let patch = serde_json::json!({ "metadata": { "finalizers": finalizers } });
    let written = services.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await;
    written.expect("the other writer's change lands");
}

/// `web` deleted and created again under the same name (a new UID), carrying `finalizers`.
async fn replace_web(services: &Api<Service>, finalizers: &[&str]) {
    let released = serde_json::json!({ "metadata": { "finalizers": null } });
    services.patch("web", &PatchParams::default(), &Patch::Merge(&released)).await.expect("releases web");
    services.delete("web", &DeleteParams::default()).await.expect("deletes web");
    // A plain loop, not `eventually`: its async closure would keep the proxy's future from being `Send`.
    let started = Instant::now();
    while services.get_opt("web").await.expect("reads web").is_some() {
        assert!(started.elapsed() < CONVERGE, "web not gone within {CONVERGE:?}");
        tokio::time::sleep(POLL).await;
    }
    create_web(services, &cluster_ip(), finalizers).await;
}

/// The finalizer the race tests write. Not the controller's own: reconcilers other tests run watch every
/// namespace and strip the controller's finalizer from a Service that is not a LoadBalancer, which would race
/// these tests' reads (the client treats every finalizer name alike).
const OURS: &str = "clb.test/race-ours";
const OTHER: &str = "example.com/other";

fn finalizers(service: &Service) -> Vec<String> {
    service.metadata.finalizers.clone().unwrap_or_default()
}

// Upstream TestAddServiceGatewayFinalizer ("does not duplicate finalizer", and the retry its "replaced between
// get and update" subtest takes) and TestGuardAddPodFinalizerRetriesOnConflict: a patch refused 409 Conflict
// because another writer changed the Service after the client's read is sent again at once from a fresh read,
// so the finalizer lands beside the other writer's, which is kept.
#[test]
fn a_finalizer_added_while_another_writer_changes_the_service_lands_on_a_fresh_read_and_keeps_the_writers_finalizer() {
    let interfere: Interference = Box::new(|services, n| {
        Box::pin(async move {
            if n == 0 {
                add_finalizer_as_another_writer(&services, OTHER).await;
            }
        })
    });
    race("add", cluster_ip(), &["example.com/keep"], interfere, async |race| {
        use clb_executor::KubeApi as _;
        race.client.set_finalizer(&race.web, OURS, true).await.expect("the conflict is retried, and the retry lands");
        let after = race.services.get("web").await.unwrap();
        assert_eq!(finalizers(&after), ["example.com/keep", OTHER, OURS], "ours added once, beside the other writer's");
        assert_eq!(race.calls(), ["GET web", "PATCH web", "GET web", "PATCH web"]);

        race.client.set_finalizer(&race.web, OURS, true).await.unwrap();
        assert_eq!(race.calls()[4..], ["GET web"], "a read, and nothing written");
        assert_eq!(race.services.get("web").await.unwrap().metadata.resource_version, after.metadata.resource_version);
    });
}

// Upstream TestRemoveServiceGatewayFinalizer ("removes finalizer from service", and the retry its "replaced
// between get and update" subtest takes): the removal that meets another writer's change is sent again from a
// fresh read; our finalizer goes, the other writer's and the one that was there stay.
#[test]
fn a_finalizer_removed_while_another_writer_changes_the_service_goes_on_a_fresh_read_and_keeps_the_writers_finalizer() {
    let interfere: Interference = Box::new(|services, n| {
        Box::pin(async move {
            if n == 0 {
                add_finalizer_as_another_writer(&services, OTHER).await;
            }
        })
    });
    race("remove", cluster_ip(), &[OURS, "example.com/keep"], interfere, async |race| {
        use clb_executor::KubeApi as _;
        race.client.set_finalizer(&race.web, OURS, false).await.expect("the conflict is retried, and the retry lands");
        let after = race.services.get("web").await.unwrap();
        assert_eq!(finalizers(&after), ["example.com/keep", OTHER]);
        assert_eq!(race.calls(), ["GET web", "PATCH web", "GET web", "PATCH web"]);
    });
}

// Upstream TestAddServiceGatewayFinalizer "does not add finalizers when the Service is replaced between get and
// update": the patch meant for the old Service fails against its same-name replacement, and the fresh read finds
// the new UID: the client refuses (409 UIDMismatch, which the guest takes as the old Service gone) and the
// replacement gets no finalizer.
#[test]
fn a_service_replaced_between_the_read_and_the_finalizer_patch_is_refused_and_its_replacement_gets_no_finalizer() {
    let interfere: Interference = Box::new(|services, n| {
        Box::pin(async move {
            if n == 0 {
                replace_web(&services, &[]).await;
            }
        })
    });
    race("add-replaced", cluster_ip(), &[], interfere, async |race| {
        use clb_executor::{KubeApi as _, UID_MISMATCH};
        let refused = race.client.set_finalizer(&race.web, OURS, true).await.unwrap_err();
        assert_eq!((refused.status, refused.reason.as_deref()), (409, Some(UID_MISMATCH)), "{refused:?}");
        let after = race.services.get("web").await.unwrap();
        assert_ne!(after.metadata.uid.as_deref(), Some(race.web.uid.as_str()), "web was replaced");
        assert_eq!(after.metadata.finalizers, None, "the replacement got no finalizer");
        assert_eq!(race.calls(), ["GET web", "PATCH web", "GET web"]);
    });
}

// Upstream TestRemoveServiceGatewayFinalizer "does not remove finalizers when the Service is replaced between get
// and update": the replacement, which carries our finalizer too, keeps all of its finalizers. Upstream answers
// nil there; this client answers 409 UIDMismatch, which the guest takes as done for the old Service.
#[test]
fn a_service_replaced_between_the_read_and_the_finalizer_removal_is_refused_and_its_replacement_keeps_its_finalizers() {
    let interfere: Interference = Box::new(|services, n| {
        Box::pin(async move {
            if n == 0 {
                replace_web(&services, &[OURS, OTHER]).await;
            }
        })
    });
    race("remove-replaced", cluster_ip(), &[OURS], interfere, async |race| {
        use clb_executor::{KubeApi as _, UID_MISMATCH};
        let refused = race.client.set_finalizer(&race.web, OURS, false).await.unwrap_err();
        assert_eq!((refused.status, refused.reason.as_deref()), (409, Some(UID_MISMATCH)), "{refused:?}");
        let after = race.services.get("web").await.unwrap();
        assert_ne!(after.metadata.uid.as_deref(), Some(race.web.uid.as_str()), "web was replaced");
        assert_eq!(finalizers(&after), [OURS, OTHER], "the replacement keeps its finalizers");
        assert_eq!(race.calls(), ["GET web", "PATCH web", "GET web"]);
    });
}

// Upstream's bound (retry.DefaultRetry's and finalizerRetryBackoff's 5 steps): a Service that changes before every
// patch costs 5 reads and 5 patches, then the last conflict goes to the guest as before, and nothing of ours is
// written.
#[test]
fn a_service_that_changes_before_every_finalizer_patch_is_given_up_after_the_last_attempt_with_the_conflict() {
    let interfere: Interference = Box::new(|services, n| {
        Box::pin(async move { add_finalizer_as_another_writer(&services, &format!("example.com/other-{n}")).await })
    });
    race("bounded", cluster_ip(), &[], interfere, async |race| {
        use clb_executor::KubeApi as _;
        let refused = race.client.set_finalizer(&race.web, OURS, true).await.unwrap_err();
        assert_eq!((refused.status, refused.reason.as_deref()), (409, Some("Conflict")), "{refused:?}");
        let attempts = 5;
        let after = race.services.get("web").await.unwrap();
        let others: Vec<_> = (0..attempts).map(|n| format!("example.com/other-{n}")).collect();
        assert_eq!(finalizers(&after), others, "every write of the other writer kept, none of ours");
        assert_eq!(race.calls(), ["GET web", "PATCH web"].repeat(attempts));
    });
}

// The status patch takes the same retry: an ingress IP written while another writer relabels the Service lands
// on a fresh read, and the label stays.
#[test]
fn a_status_patch_while_another_writer_changes_the_service_lands_on_a_fresh_read_and_keeps_the_writers_change() {
    // A LoadBalancer Service (a ClusterIP one may hold no ingress): no reconciler may run meanwhile.
    let _turn = reconcilers_slot();
    let interfere: Interference = Box::new(|services, n| {
        Box::pin(async move {
            if n == 0 {
                let label = serde_json::json!({ "metadata": { "labels": { "example.com/other": "yes" } } });
                services.patch("web", &PatchParams::default(), &Patch::Merge(&label)).await.expect("relabels web");
            }
        })
    });
    let spec = serde_json::json!({
        "type": "LoadBalancer", "externalTrafficPolicy": "Local",
        "ports": [{ "protocol": "TCP", "port": 80, "targetPort": 8080 }],
    });
    race("status", spec, &[], interfere, async |race| {
        use clb_executor::KubeApi as _;
        race.client.patch_service_status(&race.web, &["20.0.0.9".into()]).await.expect("the retry lands");
        let after = race.services.get("web").await.unwrap();
        assert_eq!(ingress_ips(&after), ["20.0.0.9"]);
        let labels = after.metadata.labels.unwrap_or_default();
        assert_eq!(labels.get("example.com/other").map(String::as_str), Some("yes"), "the other writer's label kept");
        assert_eq!(race.calls(), ["GET web", "PATCH web/status", "GET web", "PATCH web/status"]);
    });
}

// Upstream TestRegisterInformers_DeliversEndpointSliceEventsToTracker,
// TestLoadBalancerEnsureTracksExternalService, TestServiceUpdaterDeleteInboundService_Succeeds and
// TestCreateInboundService_PopulatesIngressOnSuccess.
#[test]
fn a_service_created_through_the_api_server_gets_its_pods_in_nrp_and_an_ingress_ip_and_is_released_after_deletion() {
    e2e(1, async |env| {
        let controller = env.start();
        let uid = env.provisioned("web", &[(10, 1)]).await;
        env.event("Normal", "EnsuredLoadBalancer", &uid).await;

        env.delete("web").await;
        env.released("web", &uid).await;
        controller.stop().await;
    });
}

// Upstream TestRegisterInformers_DeliversEndpointSliceEventsToTracker and TestUpdateK8sEndpoints.
#[test]
fn endpoints_added_and_removed_through_the_api_server_are_followed_by_the_addresses_in_nrp() {
    e2e(2, async |env| {
        env.node(2).await;
        let controller = env.start();
        let uid = env.service("web", "Local").await;
        // Each row is the slice's endpoints (pod, node) after one change: scale up across two
        // nodes, move, scale down, scale to zero, and back.
        let steps: &[&[(u8, u8)]] =
            &[&[(10, 1)], &[(10, 1), (11, 1), (12, 2)], &[(11, 1), (13, 2)], &[(13, 2)], &[], &[(14, 1)]];
        for endpoints in steps {
            env.endpoints("web", &uid, endpoints).await;
            env.nrp_binds(&uid, endpoints).await;
        }
        env.ingress_ip("web").await;
        controller.stop().await;
    });
}

// Upstream TestUpdateEndpoints_UntrackedServiceIsNotBuffered and
// TestLoadBalancerEmitsWarningEventForRejectedService.
#[test]
fn a_service_with_external_traffic_policy_cluster_gets_a_warning_event_and_nothing_in_nrp_and_its_deletion_completes() {
    e2e(3, async |env| {
        let controller = env.start();
        let rejected = env.service("legacy", "Cluster").await;
        env.endpoints("legacy", &rejected, &[(10, 1)]).await;
        let event = env.event("Warning", "UnsupportedExternalTrafficPolicy", &rejected).await;
        assert!(event.message.is_some_and(|m| !m.is_empty()), "the Event says why");
        // A Service admitted after it is provisioned: had the rejected one been provisioned, it
        // would be by now.
        env.provisioned("web", &[(11, 1)]).await;
        let resources = env.emulator.resources();
        assert!(!resources.services.contains_key(&rejected), "the rejected Service is not registered");
        assert!(env.bound(&rejected).is_empty(), "no address is bound to the rejected Service");
        assert!(
            resources.load_balancers.keys().all(|lb| lb != &rejected),
            "the rejected Service has no load balancer: {:?}",
            resources.load_balancers.keys()
        );
        let service = env.services().get("legacy").await.unwrap();
        assert!(ingress_ips(&service).is_empty(), "the rejected Service has no ingress IP");

        env.delete("legacy").await;
        env.gone("legacy").await;
        controller.stop().await;
    });
}

// Upstream TestGuardCheckPendingServiceDeletions_BlockedWhenLocationsRemain,
// TestGuardCheckPendingServiceDeletions_AdvancesWhenLocationsCleared,
// TestCheckPendingServiceDeletions_LocationsClearedAfterCheck and
// TestLoadBalancerEnsureDeletedSchedulesTeardown.
#[test]
fn the_finalizer_is_released_only_after_nrp_is_drained() {
    e2e(4, async |env| {
        let controller = env.start();
        let uid = env.provisioned("web", &[(10, 1)]).await;

        env.emulator.set_fault(Fault::always(Operation::UpdateAddressLocations, FaultMode::status(500)));
        env.delete("web").await;
        eventually("two drains of the Service refused by NRP", async || {
            let refused = env.calls(Operation::UpdateAddressLocations, "500");
            if refused >= 2 { Ok(()) } else { Err(format!("{refused} refused")) }
        })
        .await;
        env.held("web").await;
        assert!(env.emulator.resources().services.contains_key(&uid), "the Service is still registered in NRP");
        assert_eq!(env.bound(&uid).len(), 1, "its address is still bound");

        env.emulator.clear_faults();
        env.released("web", &uid).await;
        controller.stop().await;
    });
}

// Upstream TestLocationsUpdater_HungSyncTimesOutAndRecovers and
// TestLocationsUpdater_DrainKeepsRetryingPastAttemptCap.
#[test]
fn a_service_is_provisioned_while_a_call_for_another_hangs() {
    e2e(5, async |env| {
        let controller = env.start();
        let stuck = env.provisioned("stuck", &[(10, 1)]).await;

        // The drain of `stuck` gets no answer until the faults are cleared.
        env.emulator.set_fault(Fault::always(Operation::UpdateAddressLocations, FaultMode::Hang));
        env.delete("stuck").await;
        eventually("the drain of the deleted Service hanging", async || {
            let hung = env.calls(Operation::UpdateAddressLocations, "hang");
            if hung > 0 { Ok(()) } else { Err("no hung call yet".to_owned()) }
        })
        .await;
        let other = env.service("other", "Local").await;
        env.ingress_ip("other").await;
        assert!(env.emulator.resources().services.contains_key(&other), "the other Service is registered");
        env.held("stuck").await;

        env.emulator.clear_faults();
        env.released("stuck", &stuck).await;
        controller.stop().await;
    });
}

#[test]
fn a_watch_answered_410_gone_re_lists_and_an_endpoint_slice_deleted_while_it_was_broken_is_noticed() {
    e2e(7, async |env| {
        let server = apiserver();
        let proxy = WatchProxy::start(&server.url).await;
        let kubeconfig = server.controller_kubeconfig(&env.admin, Some(&proxy.url())).await;
        let controller = env.start_through(kubeconfig.clone());
        let kept = env.provisioned("kept", &[(10, 1)]).await;
        let emptied = env.provisioned("emptied", &[(20, 1)]).await;

        proxy.break_watches();
        eventually("the watches of all three kinds broken and held", async || {
            let held = proxy.held();
            if held >= 3 { Ok(()) } else { Err(format!("{held} held")) }
        })
        .await;
        // While the watches are down: a slice deleted (only a re-list can tell), another changed.
        env.slices().delete("emptied-1", &DeleteParams::default()).await.expect("deletes the EndpointSlice");
        env.endpoints("kept", &kept, &[(10, 1), (11, 1)]).await;
        proxy.expire_watches();

        env.nrp_binds(&emptied, &[]).await;
        env.nrp_binds(&kept, &[(10, 1), (11, 1)]).await;
        assert!(proxy.expired() >= 3, "every kind's watch was answered 410 and re-listed: {}", proxy.expired());
        controller.stop().await;
        let _ = std::fs::remove_file(kubeconfig);
    });
}

// Upstream TestEngineUpdateEndpoints_AfterRestart, TestEngineMultipleOperations_AfterRestart,
// TestShouldTriggerInitialLocationSync and TestInitializeDiffTracker.
#[test]
fn a_restarted_controller_converges_on_what_changed_while_it_was_down() {
    e2e(6, async |env| {
        let controller = env.start();
        let kept = env.provisioned("kept", &[(10, 1)]).await;
        let removed = env.provisioned("removed", &[(20, 1)]).await;
        controller.stop().await;

        // While no controller runs: a Service deleted, endpoints added, and NRP tampered with —
        // an address of `kept` unbound and a stray one bound to it.
        env.delete("removed").await;
        env.endpoints("kept", &kept, &[(10, 1), (11, 1)]).await;
        let tamper = azure::LocationUpdate {
            location: env.location(1),
            action: azure::UpdateAction::PartialUpdate,
            addresses: vec![
                azure::AddressServices { address: env.pod(10), services: vec![] },
                azure::AddressServices { address: env.pod(99), services: vec![kept.clone()] },
            ],
        };
        env.emulator.update_address_locations(azure::UpdateAction::PartialUpdate, &[tamper]).await.unwrap();
        assert_eq!(env.bound(&kept), BTreeSet::from([(env.location(1), env.pod(99))]), "NRP drifted");

        let controller = env.start();
        env.nrp_binds(&kept, &[(10, 1), (11, 1)]).await;
        env.released("removed", &removed).await;
        controller.stop().await;
    });
}

// Upstream TestGetServiceByUIDViaList_FindsServiceRetypedAwayFromLoadBalancer: a Service retyped to ClusterIP
// through the API server is still watched, and its load balancer, public IP, NRP registration, ingress IP and
// finalizer all go, while the Service itself stays.
#[test]
fn a_service_retyped_to_cluster_ip_through_the_api_server_is_torn_down_and_released() {
    e2e(13, async |env| {
        let controller = env.start();
        let uid = env.provisioned("web", &[(10, 1)]).await;
        let ours = |resources: &clb_emulator::Resources| {
            let lbs = resources.load_balancers.keys().filter(|name| name.contains(&uid)).count();
            let ips = resources.public_ips.keys().filter(|name| name.contains(&uid)).count();
            (lbs, ips)
        };
        assert_eq!(ours(&env.emulator.resources()), (1, 1), "a load balancer and a public IP of its own");
        env.held_by_finalizer("web").await;

        // The fields only a LoadBalancer may have go with the type: they were this manager's.
        let body = serde_json::json!({
            "spec": {
                "type": "ClusterIP",
                "selector": {"app": "web"},
                "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
            },
        });
        apply(&env.services(), "web", body).await;
        env.nrp_forgets(&uid).await;
        eventually("the retyped Service's Azure resources, ingress IP and finalizer gone", async || {
            let found = ours(&env.emulator.resources());
            let service = env.services().get("web").await.map_err(|e| e.to_string())?;
            let finalizers = service.metadata.finalizers.clone().unwrap_or_default();
            let ingress = ingress_ips(&service);
            if found == (0, 0) && finalizers.is_empty() && ingress.is_empty() {
                Ok(())
            } else {
                Err(format!("(load balancers, public IPs) {found:?}, finalizers {finalizers:?}, ingress {ingress:?}"))
            }
        })
        .await;
        controller.stop().await;
    });
}

// Upstream TestPodInformerRemovePod.
#[test]
fn a_pod_labelled_for_egress_in_the_api_server_gets_its_identity_in_nrp_beside_its_service_and_loses_only_that_when_the_label_goes()
 {
    e2e(12, async |env| {
        env.outbound_service("egress-12").await;
        let controller = env.start();
        let uid = env.provisioned("web", &[(10, 1)]).await;
        env.egress_pod("web-0", Some("Egress-12"), 10, 1).await;
        env.egress_pod("plain", None, 11, 1).await;
        env.egress_pod("reserved", Some("default-natgw"), 12, 1).await;
        let want = BTreeSet::from([(env.location(1), env.pod(10))]);
        eventually("NRP binds the pod's address to its egress identity", async || {
            let bound = env.bound("egress-12");
            if bound == want { Ok(()) } else { Err(format!("{bound:?}")) }
        })
        .await;
        let reserved = env.pods().get("reserved").await.expect("the Pod").metadata.uid.expect("a UID");
        env.event("Warning", "ServiceGatewayReservedEgressLabel", &reserved).await;

        // The label comes off: the watch's label selector no longer selects the Pod, and only
        // its egress identity leaves the address.
        env.egress_pod("web-0", None, 10, 1).await;
        eventually("NRP unbinds only the egress identity", async || {
            let bound = env.bound("egress-12");
            if bound.is_empty() { Ok(()) } else { Err(format!("{bound:?}")) }
        })
        .await;
        env.nrp_binds(&uid, &[(10, 1)]).await;
        controller.stop().await;
    });
}

// Upstream TestGuardNonLastPodFinalizerRemovedOnlyAfterNRPDrain and TestOutboundWorkflow, end to end:
// a labelled pod gets the pod finalizer and its identity provisioned (public IP, NAT gateway,
// Outbound service) in the emulator; deleted, it is held by the finalizer until its address has
// left NRP and, as the identity's last pod, until the NAT gateway is gone.
#[test]
fn an_egress_pod_gets_its_finalizer_and_its_nat_gateway_and_is_released_only_after_the_drain_and_the_teardown() {
    e2e(15, async |env| {
        let controller = env.start();
        env.egress_pod("job-0", Some("egress-15"), 20, 1).await;
        let want = BTreeSet::from([(env.location(1), env.pod(20))]);
        eventually("NRP binds the pod's address to its new egress identity", async || {
            let resources = env.emulator.resources();
            let registered = resources.services.get("egress-15").and_then(|s| s.public_nat_gateway_id.clone());
            let bound = env.bound("egress-15");
            match registered {
                Some(nat) if bound == want && resources.nat_gateways.contains_key("egress-15") => {
                    assert!(nat.ends_with("/natGateways/egress-15"), "{nat}");
                    Ok(())
                }
                _ => Err(format!("registered with {registered:?}, bound {bound:?}")),
            }
        })
        .await;
        eventually("the pod finalizer on job-0", async || {
            let pod = env.pods().get("job-0").await.map_err(|e| e.to_string())?;
            let finalizers = pod.metadata.finalizers.unwrap_or_default();
            if finalizers.iter().any(|f| f == clb_guest::tracker::egress::finalizers::FINALIZER) {
                Ok(())
            } else {
                Err(format!("{finalizers:?}"))
            }
        })
        .await;

        // The drain gets no answer until the faults are cleared: the pod stays, held.
        env.emulator.set_fault(Fault::always(Operation::UpdateAddressLocations, FaultMode::Hang));
        env.pods().delete("job-0", &DeleteParams::default().grace_period(0)).await.expect("deletes the Pod");
        eventually("the drain of the deleted pod hanging", async || {
            let hung = env.calls(Operation::UpdateAddressLocations, "hang");
            if hung > 0 { Ok(()) } else { Err("no hung call yet".to_owned()) }
        })
        .await;
        let pod = env.pods().get("job-0").await.expect("held by the finalizer while NRP has its address");
        assert!(pod.metadata.deletion_timestamp.is_some(), "job-0 is terminating");
        assert_eq!(env.bound("egress-15"), want, "NRP still has its address");

        env.emulator.clear_faults();
        eventually("job-0 gone from the API server", async || {
            match env.pods().get_opt("job-0").await.map_err(|e| e.to_string())? {
                Some(p) => Err(format!("still there with finalizers {:?}", p.metadata.finalizers)),
                None => Ok(()),
            }
        })
        .await;
        let resources = env.emulator.resources();
        assert!(env.bound("egress-15").is_empty(), "released only after the drain");
        assert!(!resources.nat_gateways.contains_key("egress-15"), "and after the NAT gateway went");
        assert!(!resources.services.contains_key("egress-15"), "unregistered");
        controller.stop().await;
    });
}

// Found by `clb-host explore`: an egress pod whose label came off while no controller ran kept
// the pod finalizer for good, as the label's watch never selects it again. The next controller
// lists the pods holding the finalizer without the label at start-up, drains the address,
// releases the finalizer and tears the identity down.
#[test]
fn a_pod_whose_egress_label_came_off_while_no_controller_ran_has_its_finalizer_released_by_the_next() {
    e2e(21, async |env| {
        let finalizer = clb_executor::records::EGRESS_POD_FINALIZER;
        assert_eq!(
            finalizer,
            clb_guest::tracker::egress::finalizers::FINALIZER,
            "the host lists what the logic writes"
        );
        let controller = env.start();
        env.egress_pod("job-0", Some("egress-21"), 30, 1).await;
        let finalizers = async || env.pods().get("job-0").await.map(|p| p.metadata.finalizers.unwrap_or_default());
        eventually("the pod finalizer on job-0 and its address in NRP", async || {
            let held = finalizers().await.map_err(|e| e.to_string())?;
            let bound = env.bound("egress-21");
            if held.iter().any(|f| f == finalizer) && !bound.is_empty() {
                Ok(())
            } else {
                Err(format!("finalizers {held:?}, bound {bound:?}"))
            }
        })
        .await;
        controller.stop().await;

        env.egress_pod("job-0", None, 30, 1).await;
        let controller = env.start();
        eventually("the finalizer released, the address drained and the identity torn down", async || {
            let held = finalizers().await.map_err(|e| e.to_string())?;
            let (bound, resources) = (env.bound("egress-21"), env.emulator.resources());
            if held.is_empty() && bound.is_empty() && !resources.nat_gateways.contains_key("egress-21") {
                Ok(())
            } else {
                Err(format!("finalizers {held:?}, bound {bound:?}"))
            }
        })
        .await;
        controller.stop().await;
    });
}

/// What `examples/deploy/rbac.yaml` must grant the controller's ServiceAccount, and some of what
/// it must not: `(verb, group, resource, namespace, allowed)`.
const RIGHTS: &[(&str, &str, &str, &str, bool)] = &[
    ("list", "", "services", "", true),
    ("watch", "", "services", "", true),
    ("get", "", "services", "shop", true),
    ("patch", "", "services", "shop", true),
    ("patch", "", "services/status", "shop", true),
    ("list", "discovery.k8s.io", "endpointslices", "", true),
    ("watch", "discovery.k8s.io", "endpointslices", "", true),
    ("list", "", "nodes", "", true),
    ("watch", "", "nodes", "", true),
    // Egress pods (through a label selector, which RBAC cannot express), and their finalizer:
    // read, then patched under the UID guard.
    ("list", "", "pods", "", true),
    ("watch", "", "pods", "", true),
    ("get", "", "pods", "shop", true),
    ("patch", "", "pods", "shop", true),
    ("create", "", "events", "shop", true),
    ("patch", "", "events", "shop", true),
    // A Service's Namespace, read by name for multi-SLB placement by namespace selector.
    ("get", "", "namespaces", "", true),
    ("get", "coordination.k8s.io", "leases", "kube-system", true),
    ("create", "coordination.k8s.io", "leases", "kube-system", true),
    ("update", "coordination.k8s.io", "leases", "kube-system", true),
    // Not: writing Services beyond finalizers and status, Pods beyond their finalizer, touching
    // Nodes or EndpointSlices, Leases elsewhere, secrets anywhere.
    ("create", "", "services", "shop", false),
    ("update", "", "services", "shop", false),
    ("delete", "", "services", "shop", false),
    ("update", "", "services/status", "shop", false),
    ("patch", "", "nodes", "", false),
    ("create", "discovery.k8s.io", "endpointslices", "shop", false),
    ("delete", "", "events", "shop", false),
    ("delete", "coordination.k8s.io", "leases", "kube-system", false),
    ("get", "coordination.k8s.io", "leases", "shop", false),
    ("create", "coordination.k8s.io", "leases", "shop", false),
    ("get", "", "secrets", "kube-system", false),
    ("create", "", "pods", "shop", false),
    ("update", "", "pods", "shop", false),
    ("delete", "", "pods", "shop", false),
    ("list", "", "namespaces", "", false),
    ("update", "", "namespaces", "", false),
];

/// Rights on named objects, as [`RIGHTS`] plus the object's name.
const NAMED_RIGHTS: &[(&str, &str, &str, &str, &str, bool)] = &[
    ("get", "", "configmaps", "kube-system", "clb-logic", true),
    ("watch", "", "configmaps", "kube-system", "clb-logic", true),
    ("get", "", "configmaps", "kube-system", "clb-reconciler", true),
    // Not: other ConfigMaps, nor writing these.
    ("get", "", "configmaps", "kube-system", "kubeadm-config", false),
    ("update", "", "configmaps", "kube-system", "clb-logic", false),
];

/// `run --record`: what a live controller recorded replays identically, and a trace that
/// cannot be written costs counted lines, never a reconcile.
#[test]
fn a_controller_run_with_record_writes_a_trace_that_replays_identically_and_an_unwritable_one_costs_only_lines() {
    use clb_sandbox::trace::{ComponentRef, RecordOptions, Recorder};
    use std::sync::atomic::Ordering;
    e2e(14, async |env| {
        let dir = clb_tests::scratch("e2e-record");
        let path = dir.join("run.jsonl");
        let logic = clb_tests::builtin();
        let start = |path: PathBuf| {
            Recorder::start(
                RecordOptions::live(path),
                clb_sandbox::trace::Signatures::of(logic),
                &ComponentRef::of(logic, Some("builtin")),
            )
            .unwrap()
        };
        let recorder = start(path.clone());
        let controller = env.start_recording(recorder.clone());
        let uid = env.provisioned("web", &[(10, 1)]).await;
        env.endpoints("web", &uid, &[(10, 1), (11, 1)]).await;
        env.nrp_binds(&uid, &[(10, 1), (11, 1)]).await;
        controller.stop().await;
        recorder.flush();
        assert_eq!(recorder.stats().lines_dropped.load(Ordering::Relaxed), 0);
        let (code, out, err) = super::traces::clb_replay(&[&path], &[]);
        assert_eq!(code, clb_host::cli::EXIT_OK, "{out}{err}");
        assert!(out.contains("identical"), "{out}");

        let unwritable = start(PathBuf::from("/nonexistent-clb-e2e/run.jsonl"));
        let controller = env.start_recording(unwritable.clone());
        let uid = env.provisioned("api", &[(12, 1)]).await;
        env.nrp_binds(&uid, &[(12, 1)]).await;
        controller.stop().await;
        let stats = unwritable.stats();
        assert!(stats.lines_dropped.load(Ordering::Relaxed) > 0, "{stats:?}");
        assert_eq!(stats.lines_written.load(Ordering::Relaxed), 0, "{stats:?}");
    });
}

#[test]
fn the_example_rbac_grants_the_controller_what_it_needs_and_no_more() {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let server = apiserver();
        let admin = server.admin().await;
        let kubeconfig = server.controller_kubeconfig(&admin, None).await;
        let _ = std::fs::remove_file(kubeconfig);
        let (namespace, name) = clb_tests::apiserver::CONTROLLER_ACCOUNT;
        let reviews = Api::<SubjectAccessReview>::all(admin);
        let mut wrong = Vec::new();
        let unnamed = RIGHTS.iter().map(|&(verb, group, resource, namespace, allowed)| {
            (verb, group, resource, namespace, "", allowed)
        });
        for (verb, group, resource, in_namespace, object, allowed) in unnamed.chain(NAMED_RIGHTS.iter().copied()) {
            let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
            let review: SubjectAccessReview = serde_json::from_value(serde_json::json!({
                "spec": {
                    "user": format!("system:serviceaccount:{namespace}:{name}"),
                    "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{namespace}"), "system:authenticated"],
                    "resourceAttributes": {
                        "verb": verb, "group": group, "resource": resource,
                        "subresource": subresource, "namespace": in_namespace, "name": object,
                    },
                },
            }))
            .unwrap();
            let answer = reviews.create(&Default::default(), &review).await.expect("the API server reviews access");
            let granted = answer.status.is_some_and(|s| s.allowed);
            if granted != allowed {
                wrong.push(format!(
                    "{verb} {group}/{resource}/{subresource} {object:?} in {in_namespace:?}: granted {granted}"
                ));
            }
        }
        assert!(wrong.is_empty(), "rights not as examples/deploy/rbac.yaml should grant them: {wrong:#?}");
    });
}

/// Set in a child process of [`clb_host_child`]: the command line it runs, as JSON.
pub(crate) const CHILD_COMMAND_LINE: &str = "CLB_E2E_CHILD_COMMAND_LINE";

/// In a child of [`clb_host_child`]: runs its command line in-process and exits with its code.
/// Called first by each test that starts one.
pub(crate) fn run_if_child() {
    if let Ok(command_line) = std::env::var(CHILD_COMMAND_LINE) {
        let args: Vec<String> = serde_json::from_str(&command_line).expect("a JSON list of arguments");
        let code = clb_host::cli::run(args, &mut std::io::stdout(), &mut std::io::stderr());
        std::process::exit(code.into());
    }
}

/// `clb-host` with `command_line` in a process of its own (so that a signal reaches it alone, or
/// so that it is stopped with the test): this test binary run again for `test` alone (a path
/// such as `kube::name`), which calls [`run_if_child`] first; its stdout piped when `piped`.
pub(crate) fn clb_host_child(test: &str, command_line: &[String], piped: bool) -> Child {
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_COMMAND_LINE, serde_json::to_string(command_line).unwrap());
    if piped {
        command.stdout(std::process::Stdio::piped());
    }
    Child(command.spawn().expect("starts the child"))
}

// Upstream TestLocationsUpdater_StopWaitsForInFlightSync (differs: running commands get the shutdown grace,
// then are dropped).
#[test]
fn clb_host_run_stops_with_exit_code_0_on_sigterm_while_a_call_hangs() {
    // The signal goes to a process of its own: this test binary run again for this test alone.
    run_if_child();
    e2e(8, async |env| {
        let (cloud_config, command_line) = env.run_command_line("sigterm", &["--shutdown-grace-secs=1".into()]);
        let test = "kube::clb_host_run_stops_with_exit_code_0_on_sigterm_while_a_call_hangs";
        let mut child = clb_host_child(test, &command_line, false);

        // Once it has provisioned a Service, its signal handlers are in place (they come first).
        let uid = env.provisioned("web", &[(10, 1)]).await;
        env.emulator.set_fault(Fault::always(Operation::UpdateAddressLocations, FaultMode::Hang));
        env.delete("web").await;
        eventually("the drain hanging", async || {
            if env.calls(Operation::UpdateAddressLocations, "hang") > 0 { Ok(()) } else { Err("not yet".into()) }
        })
        .await;
        let pid = child.0.id().to_string();
        let killed = std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("runs kill");
        assert!(killed.success(), "kill -TERM {pid}");
        let status = eventually("the child stopped", async || match child.0.try_wait() {
            Ok(Some(status)) => Ok(status),
            other => Err(format!("{other:?}")),
        })
        .await;
        assert_eq!(status.code(), Some(0), "clb-host run exits 0 on SIGTERM: {status}");
        env.held("web").await;
        assert!(env.emulator.resources().services.contains_key(&uid), "nothing was half-done: still registered");
        let _ = std::fs::remove_file(cloud_config);
    });
}

/// A child process, killed if the test ends before it does.
pub(crate) struct Child(pub(crate) std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

// Upstream TestEndpointSlicesInformer: its first case, a moved endpoint replaces the old node's IP by the new one's
// in one GET and one PUT of the pool.
#[test]
fn in_multi_slb_mode_a_local_services_endpoints_on_two_nodes_put_both_node_ips_into_its_pool_and_a_moved_endpoint_updates_it()
 {
    e2e(9, async |env| {
        env.node(2).await;
        env.node(3).await;
        let pool = env.slb_pool("web").await;
        let controller = env.start_multi_slb();
        let uid = env.service("web", "Local").await;
        env.endpoints("web", &uid, &[(10, 1), (11, 2)]).await;
        env.pool_holds(&pool, &[1, 2]).await;
        // The term rechecks its pools against Azure after its second tick (a GET each); ticks
        // come every second, so three seconds from here that is behind us.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let pool_calls = || (env.calls(Operation::GetBackendPool, ""), env.calls(Operation::PutBackendPool, ""));
        let before = pool_calls();

        // The endpoint on node 2 moves to node 3.
        env.endpoints("web", &uid, &[(10, 1), (12, 3)]).await;
        // The test's own reads of the pool are logged too: none until the calls are counted.
        eventually("the move's pool write", async || {
            let puts = pool_calls().1 - before.1;
            if puts > 0 { Ok(()) } else { Err("no PUT yet".into()) }
        })
        .await;
        // Ticks come every second: a second tick that wrote again would show by now.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = pool_calls();
        assert_eq!((after.0 - before.0, after.1 - before.1), (1, 1), "one GET and one PUT for the move");
        env.pool_holds(&pool, &[1, 3]).await;
        controller.stop().await;
    });
}

// Regression: a pool write the previous leader had in flight (a creation or a DELETE carries no
// If-Match) could land after the new leader wrote the same pool, and nothing noticed until the
// Service changed again. Against the real API server: once the controller's first tick wrote the
// pool, the test writes it as such a late write would, and the controller's recheck after its
// second tick (the updater ticking every 4 s) puts it right at the third.
#[test]
fn in_multi_slb_mode_a_pool_changed_behind_the_controller_after_its_first_tick_is_put_right_after_its_second() {
    e2e(24, async |env| {
        let pool = env.slb_pool("web").await;
        let uid = env.service("web", "Local").await;
        env.endpoints("web", &uid, &[(10, 1)]).await;
        let cloud_config = env.multi_slb_cloud_config().replace(
            "loadBalancerBackendPoolUpdateIntervalInSeconds: 1",
            "loadBalancerBackendPoolUpdateIntervalInSeconds: 4",
        );
        let controller =
            env.start_with(env.controller_kubeconfig.clone(), &cloud_config, Some(env.resource_lock()), None);
        env.pool_holds(&pool, &[1]).await;
        // The late write: the pool as the previous leader last wanted it, empty, written
        // without If-Match, well before the second tick (4 s after the first).
        env.emulator.put_backend_pool(&pool, &BackendPool::default(), None).await.expect("writes the pool");
        assert!(env.pool_ips(&pool).await.is_empty());
        env.pool_holds(&pool, &[1]).await;
        controller.stop().await;
    });
}

// Upstream makes a local Service's pool with its load balancer and deletes it once the Service
// stops being local (cleanupLocalServiceBackendPool, "the service is changed from local to
// cluster"): against the real API server, the controller's tick creates the pool the load
// balancer lacks, holding the node of the Service's endpoint, and deletes it once the Service
// turns `externalTrafficPolicy: Cluster`.
#[test]
fn in_multi_slb_mode_a_local_services_missing_pool_is_created_and_deleted_once_the_service_turns_cluster() {
    e2e(17, async |env| {
        let pool = env.slb_pool("web").await;
        env.emulator.delete_backend_pool(&pool).await.expect("deletes the pool");
        let deletes = || env.calls(Operation::DeleteBackendPool, "");
        let before = deletes();
        let controller = env.start_multi_slb();
        let uid = env.service("web", "Local").await;
        env.endpoints("web", &uid, &[(10, 1)]).await;
        eventually("the pool is created", async || match env.emulator.get_backend_pool(&pool).await {
            Ok(_) => Ok(()),
            Err(error) => Err(error.to_string()),
        })
        .await;
        env.pool_holds(&pool, &[1]).await;
        assert_eq!(deletes(), before, "nothing deleted while the Service is local");

        env.service("web", "Cluster").await;
        eventually("the pool is deleted", async || match env.emulator.get_backend_pool(&pool).await {
            Err(error) if error.status == 404 => Ok(()),
            other => Err(format!("{other:?}")),
        })
        .await;
        controller.stop().await;
    });
}

// Upstream's getServiceIPFamily and getLocalServiceBackendPoolName against the real API server,
// whose service range is dual-stack: a Service with `ipFamilies: [IPv4, IPv6]` gets its IPv4 pool
// and its IPv6 pool (`-ipv6`), each holding its family's InternalIP of the node of its endpoint,
// named after the node; turned single-stack, it loses the IPv6 pool and keeps the IPv4 one.
#[test]
fn in_multi_slb_mode_a_dual_stack_local_service_gets_a_pool_per_family_and_loses_the_ipv6_one_when_single_stack() {
    e2e(18, async |env| {
        let ipv6 = format!("fd00:224:{}::1", env.index);
        // Two InternalIPs: a merge patch, since server-side apply keys the addresses by type.
        let status = serde_json::json!({"status": {"addresses": [
            {"type": "InternalIP", "address": env.location(1)},
            {"type": "InternalIP", "address": ipv6},
        ]}});
        Api::<Node>::all(env.admin.clone())
            .patch_status(&env.node_name(1), &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("writes the Node's addresses");
        let v4 = env.slb_pool("web").await;
        let v6 = PoolRef { load_balancer: v4.load_balancer.clone(), pool: format!("{}-ipv6", v4.pool) };
        let controller = env.start_multi_slb();
        let service = |policy: &str, families: &[&str]| {
            serde_json::json!({"spec": {
                "type": "LoadBalancer", "externalTrafficPolicy": "Local", "selector": {"app": "web"},
                "ipFamilyPolicy": policy, "ipFamilies": families,
                "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
            }})
        };
        let web = apply(&env.services(), "web", service("RequireDualStack", &["IPv4", "IPv6"])).await;
        let families = web.spec.as_ref().and_then(|s| s.ip_families.clone());
        assert_eq!(families.as_deref(), Some(&["IPv4".to_owned(), "IPv6".to_owned()][..]), "both families given");
        env.endpoints("web", &web.metadata.uid.expect("the API server gives a UID"), &[(10, 1)]).await;
        env.pool_holds(&v4, &[1]).await;
        let node = env.node_name(1);
        eventually("the IPv6 pool holds the node's IPv6 InternalIP", async || {
            let (content, _) = env.emulator.get_backend_pool(&v6).await.map_err(|e| e.to_string())?;
            let held: Vec<(String, String)> = content.addresses.into_iter().map(|a| (a.ip_address, a.name)).collect();
            if held == [(ipv6.clone(), node.clone())] { Ok(()) } else { Err(format!("{held:?}")) }
        })
        .await;

        apply(&env.services(), "web", service("SingleStack", &["IPv4"])).await;
        eventually("the IPv6 pool is deleted", async || match env.emulator.get_backend_pool(&v6).await {
            Err(error) if error.status == 404 => Ok(()),
            other => Err(format!("{other:?}")),
        })
        .await;
        env.pool_holds(&v4, &[1]).await;
        controller.stop().await;
    });
}

// Placement by a namespace selector against the real API server (upstream's
// getEligibleLoadBalancersForService reads the Service's Namespace): the controller, under the
// example RBAC's `get namespaces`, puts the pool on the load balancer whose selector matches the
// namespace's labels, never on the one without a selector listed first (the pool named after the
// Service there is one it left, and is deleted); a Service naming no
// configured load balancer gets upstream's Warning and no pool.
#[test]
fn in_multi_slb_mode_a_service_goes_on_the_load_balancer_its_namespace_selector_matches_and_an_unplaceable_one_is_warned()
 {
    e2e(16, async |env| {
        apply(
            &Api::<Namespace>::all(env.admin.clone()),
            &env.namespace,
            serde_json::json!({"metadata": {"labels": {"clb-e2e/team": "payments"}}}),
        )
        .await;
        let plain = env.slb_pool("web").await;
        let team = PoolRef { load_balancer: format!("{}-team", env.load_balancer()), pool: plain.pool.clone() };
        let public_ip = format!("{}-frontend", team.load_balancer);
        let spec = PublicIpSpec { name: public_ip.clone(), version: IpVersion::IPv4 };
        env.emulator.put_public_ip(&spec).await.expect("creates the public IP");
        let spec = LoadBalancerSpec {
            name: team.load_balancer.clone(),
            public_ip,
            backend_pool: team.pool.clone(),
            rules: vec![],
        };
        env.emulator.put_load_balancer(&spec).await.expect("creates the load balancer");
        let config = env.multi_slb_cloud_config().replace(
            "  primaryVMSet: nodepool1\n",
            &format!(
                "  primaryVMSet: nodepool1\n- name: {}\n  primaryVMSet: nodepool2\n  serviceNamespaceSelector: \
                 {{matchLabels: {{clb-e2e/team: payments}}}}\n",
                team.load_balancer
            ),
        );
        let controller = env.start_with(env.controller_kubeconfig.clone(), &config, Some(env.resource_lock()), None);
        let uid = env.service("web", "Local").await;
        env.endpoints("web", &uid, &[(10, 1)]).await;
        env.pool_holds(&team, &[1]).await;
        // The load balancer without a selector is not used: the pool named after the Service
        // there is one it left, and is deleted at its first placement.
        eventually("web's pool on the load balancer without a selector deleted", async || {
            match env.emulator.get_backend_pool(&plain).await {
                Err(error) if error.status == 404 => Ok(()),
                Ok((pool, _)) => Err(format!("still there, holding {:?}", pool.addresses)),
                Err(error) => Err(error.to_string()),
            }
        })
        .await;

        let api = apply(
            &env.services(),
            "api",
            serde_json::json!({
                "metadata": {"annotations": {"service.beta.kubernetes.io/azure-load-balancer-configurations": "nope"}},
                "spec": {
                    "type": "LoadBalancer",
                    "externalTrafficPolicy": "Local",
                    "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                },
            }),
        )
        .await;
        let api_uid = api.metadata.uid.expect("the API server gives a UID");
        env.endpoints("api", &api_uid, &[(11, 1)]).await;
        let events = Api::<Event>::namespaced(env.admin.clone(), &env.namespace);
        let warning = eventually("a Warning SyncLoadBalancerFailed regarding api", async || {
            let listed = events.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
            listed
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("SyncLoadBalancerFailed")
                        && e.type_.as_deref() == Some("Warning")
                        && e.involved_object.name.as_deref() == Some("api")
                })
                .ok_or_else(|| "no such Event yet".to_owned())
        })
        .await;
        let message = warning.message.unwrap_or_default();
        assert!(message.contains("none of them is defined in cloud provider configuration"), "{message}");
        env.pool_holds(&team, &[1]).await;
        controller.stop().await;
    });
}

#[test]
fn in_multi_slb_mode_a_service_pinning_a_public_ip_goes_on_the_load_balancer_the_ip_is_attached_to_not_the_first() {
    e2e(19, async |env| {
        // Two configured load balancers with no rules: placement alone would take the first.
        let first = env.slb_pool("web").await;
        let pinned = PoolRef { load_balancer: format!("{}-pinned", env.load_balancer()), pool: first.pool.clone() };
        let public_ip = format!("{}-frontend", pinned.load_balancer);
        let spec = PublicIpSpec { name: public_ip.clone(), version: IpVersion::IPv4 };
        env.emulator.put_public_ip(&spec).await.expect("creates the public IP");
        let spec = LoadBalancerSpec {
            name: pinned.load_balancer.clone(),
            public_ip: public_ip.clone(),
            backend_pool: pinned.load_balancer.clone(),
            rules: vec![],
        };
        env.emulator.put_load_balancer(&spec).await.expect("creates the load balancer");
        let config = env.multi_slb_cloud_config().replace(
            "  primaryVMSet: nodepool1\n",
            &format!("  primaryVMSet: nodepool1\n- name: {}\n  primaryVMSet: nodepool2\n", pinned.load_balancer),
        );
        let controller = env.start_with(env.controller_kubeconfig.clone(), &config, Some(env.resource_lock()), None);
        let web = apply(
            &env.services(),
            "web",
            serde_json::json!({
                "metadata": {"annotations": {"service.beta.kubernetes.io/azure-pip-name": public_ip}},
                "spec": {
                    "type": "LoadBalancer",
                    "externalTrafficPolicy": "Local",
                    "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                },
            }),
        )
        .await;
        let uid = web.metadata.uid.expect("the API server gives a UID");
        env.endpoints("web", &uid, &[(10, 1)]).await;
        // The producer read ARM's listing of public IPs: the one the Service names is attached to
        // the second load balancer's frontend, so its pool is made there, and the pool named
        // after it on the first is one it left.
        env.pool_holds(&pinned, &[1]).await;
        eventually("web's pool on the first load balancer deleted", async || {
            match env.emulator.get_backend_pool(&first).await {
                Err(error) if error.status == 404 => Ok(()),
                Ok((pool, _)) => Err(format!("still there, holding {:?}", pool.addresses)),
                Err(error) => Err(error.to_string()),
            }
        })
        .await;
        assert!(env.calls(Operation::ListPublicIps, "200") > 0, "the public IPs were listed");
        controller.stop().await;
    });
}

#[test]
fn in_multi_slb_mode_no_pool_is_written_while_a_foreign_holder_has_the_resource_lock_and_the_pool_converges_once_it_releases_it()
 {
    e2e(10, async |env| {
        let lock = env.resource_lock();
        crate::lease::hold_as_foreign(&env.admin, &lock.namespace, &lock.name, "aks-resource-provider", 600).await;
        let pool = env.slb_pool("web").await;
        let controller = env.start_multi_slb();
        let uid = env.service("web", "Local").await;
        env.endpoints("web", &uid, &[(10, 1)]).await;

        // The producer read the pool it starts from: the Service's operations are queued. Ticks
        // come every second and each finds the Lease held; several pass with nothing written.
        eventually("the producer reads the Service's pool", async || {
            let reads = env.calls(Operation::GetBackendPool, "200");
            if reads > 0 { Ok(()) } else { Err("no read yet".into()) }
        })
        .await;
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(
                env.calls(Operation::PutBackendPool, ""),
                0,
                "no pool write while the foreign holder has the lock"
            );
        }
        assert!(env.pool_ips(&pool).await.is_empty());

        // The foreign holder releases the Lease, as upstream's holders do.
        let leases = Api::<Lease>::namespaced(env.admin.clone(), &lock.namespace);
        let release = Patch::Merge(serde_json::json!({"spec": {"holderIdentity": ""}}));
        leases.patch(&lock.name, &PatchParams::default(), &release).await.expect("releases the foreign Lease");
        env.pool_holds(&pool, &[1]).await;
        // The controller took the lock and gave it back after its tick.
        let lease = leases.get(&lock.name).await.expect("reads the Lease");
        let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
        assert_ne!(holder, "aks-resource-provider", "the foreign holder does not hold it any more");
        controller.stop().await;
    });
}

// Upstream TestLocationsUpdater_StopWaitsForInFlightSync (differs: running commands get the shutdown grace,
// then are dropped).
#[test]
fn in_multi_slb_mode_a_shutdown_during_a_pool_write_lets_the_tick_finish_and_release_the_resource_lock() {
    e2e(11, async |env| {
        // Every pool PUT is accepted asynchronously and polled for a few seconds.
        let slow = FaultMode::Async {
            outcome: Default::default(),
            polls: 3,
            via_location: false,
            retry_after_secs: Some(1),
            error: None,
        };
        env.emulator.set_fault(Fault::always(Operation::PutBackendPool, slow));
        let pool = env.slb_pool("web").await;
        let controller = env.start_multi_slb();
        let uid = env.service("web", "Local").await;
        env.endpoints("web", &uid, &[(10, 1)]).await;
        let lock = env.resource_lock();
        let leases = Api::<Lease>::namespaced(env.admin.clone(), &lock.namespace);
        eventually("a tick writes the pool under the resource lock", async || {
            let puts = env.calls(Operation::PutBackendPool, "");
            let lease = leases.get_opt(&lock.name).await.map_err(|e| e.to_string())?;
            let holder = lease.and_then(|l| l.spec).and_then(|s| s.holder_identity).unwrap_or_default();
            if puts > 0 && holder == lock.holder { Ok(()) } else { Err(format!("{puts} PUT(s), holder {holder:?}")) }
        })
        .await;

        controller.stop().await;
        let lease = leases.get(&lock.name).await.expect("reads the Lease");
        let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
        assert_eq!(holder, "", "the tick finished and released the resource lock");
        assert_eq!(env.pool_ips(&pool).await, BTreeSet::from([env.location(1)]), "the write completed");
    });
}

/// Rounds of [`clb_host_run_killed_with_sigkill_at_seeded_points_leaves_the_world_an_uninterrupted_run_would`]:
/// `CLB_KILL_ROUNDS` (default 3, CI's), its points drawn by `CLB_KILL_SEED` (default 0).
fn kill_rounds_and_seed() -> (u8, u64) {
    let read = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    (read("CLB_KILL_ROUNDS", 3).clamp(1, 100) as u8, read("CLB_KILL_SEED", 0))
}

// Fault exploration's crash class against real processes: two replicas of `clb-host run` (each
// its own process, leader election on a short Lease) against the test API server and the
// emulator over HTTP. Each round changes the cluster (a Service created, the previous one scaled
// down, the one before deleted), and once the emulator has answered a seeded number of further
// requests the leader is killed with SIGKILL — wherever it is: between an Azure write and its
// answer, between a write and its finalizer or status — and a new standby started; the other
// replica takes over once the Lease expires. In the end every live Service is provisioned with
// exactly its endpoints, every deleted one is released and gone from NRP, and Azure holds no
// public IP or load balancer that no live Service accounts for.
#[test]
fn clb_host_run_killed_with_sigkill_at_seeded_points_leaves_the_world_an_uninterrupted_run_would() {
    run_if_child();
    e2e(22, async |env| {
        env.node(2).await;
        let lease_name = format!("clb-kill-{}", env.namespace);
        let mut cloud_config = PathBuf::new();
        let mut replica = |identity: String| {
            let (written, command_line) = env.run_command_line(
                "kill",
                &[
                    "--listen=127.0.0.1:0".into(),
                    format!("--leader-elect-resource-name={lease_name}"),
                    format!("--leader-elect-identity={identity}"),
                    "--leader-elect-lease-duration=2s".into(),
                    "--leader-elect-renew-deadline=1200ms".into(),
                    "--leader-elect-retry-period=200ms".into(),
                ],
            );
            cloud_config = written;
            let test =
                "kube::clb_host_run_killed_with_sigkill_at_seeded_points_leaves_the_world_an_uninterrupted_run_would";
            (identity, clb_host_child(test, &command_line, false))
        };
        let leases = Api::<Lease>::namespaced(env.admin.clone(), "kube-system");
        let requests = || env.emulator.state().requests.values().sum::<u64>();
        let (rounds, seed) = kill_rounds_and_seed();
        let mut replicas = vec![replica("replica-0".into()), replica("replica-1".into())];
        // Name → (UID, its endpoints now); and the deleted ones.
        let mut live: BTreeMap<String, (String, Vec<(u8, u8)>)> = BTreeMap::new();
        let mut deleted: Vec<(String, String)> = Vec::new();
        let mut kills = Vec::new();
        for round in 0..rounds {
            let before = requests();
            let name = format!("web-{round}");
            let uid = env.service(&name, "Local").await;
            let endpoints = vec![(2 * round + 1, 1), (2 * round + 2, 2)];
            env.endpoints(&name, &uid, &endpoints).await;
            live.insert(name, (uid, endpoints));
            if round >= 1 {
                let previous = format!("web-{}", round - 1);
                let (uid, endpoints) = live.get_mut(&previous).expect("created a round before");
                endpoints.truncate(1);
                env.endpoints(&previous, &uid.clone(), &endpoints.clone()).await;
            }
            if round >= 2 {
                let gone = format!("web-{}", round - 2);
                let (uid, _) = live.remove(&gone).expect("created two rounds before");
                env.delete(&gone).await;
                deleted.push((gone, uid));
            }
            // A new Service takes at least four writes (public IP, load balancer, registration,
            // locations): the leader reaches the point whichever it is.
            let draw = clb_simulator::explore::splitmix64(seed.wrapping_add(u64::from(round) << 32));
            let after = 1 + draw % 4;
            let started = Instant::now();
            while requests() < before + after {
                assert!(
                    started.elapsed() < CONVERGE,
                    "round {round}: {after} requests not answered within {CONVERGE:?}"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let holder = leases
                .get_opt(&lease_name)
                .await
                .expect("reads the Lease")
                .and_then(|l| l.spec?.holder_identity)
                .unwrap_or_default();
            for (identity, child) in &mut replicas {
                let exited = child.0.try_wait().expect("asks after the replica");
                assert_eq!(exited, None, "round {round}: {identity} is running");
            }
            let leader = replicas.iter().position(|(identity, _)| *identity == holder);
            let leader = leader.unwrap_or_else(|| panic!("round {round}: the Lease's holder {holder:?} is no replica"));
            let (identity, mut child) = replicas.remove(leader);
            child.0.kill().expect("sends SIGKILL");
            child.0.wait().expect("the killed replica is reaped");
            kills.push(format!("round {round}: {identity} after {after} requests"));
            replicas.push(replica(format!("replica-{}", round + 2)));
        }
        for (name, (uid, endpoints)) in &live {
            env.nrp_binds(uid, endpoints).await;
            env.ingress_ip(name).await;
        }
        for (name, uid) in &deleted {
            env.released(name, uid).await;
        }
        let accounted: BTreeSet<String> = live.values().map(|(uid, _)| uid.clone()).collect();
        eventually(&format!("Azure holds only what the live Services account for (kills: {kills:?})"), async || {
            let resources = env.emulator.resources();
            let ips: BTreeSet<String> = resources.public_ips.keys().cloned().collect();
            let lbs: BTreeSet<String> = resources.load_balancers.keys().cloned().collect();
            let want_ips: BTreeSet<String> = accounted.iter().map(|uid| format!("{uid}-pip")).collect();
            if ips == want_ips && lbs == accounted {
                Ok(())
            } else {
                Err(format!("public IPs {ips:?}, load balancers {lbs:?}"))
            }
        })
        .await;
        drop(replicas);
        let _ = leases.delete(&lease_name, &DeleteParams::default()).await;
        let _ = std::fs::remove_file(cloud_config);
    });
}
