//! The backend-pool updater through the component, against the in-process emulator: the lock
//! order of upstream PR #10328 with real tasks, the read-modify-write with `If-Match`,
//! and the retry classification end to end. Ports of upstream's `azure_local_services_test.go`
//! cases that need locks and Azure (the pure ones are unit tests in `clb-guest`).

use clb_azure::*;
use clb_emulator::{Emulator, Fault, FaultMode};
use clb_executor::backend_pools::*;
use clb_sandbox::bindings::exports::clb::reconciler::backend_pools::{OperationKind, PoolOperation};
use clb_simulator::cluster::Cluster;
use clb_tests::test_scope;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};

/// Holds one kind of call at its start until released, and says when one arrived: a real
/// ARM call that takes as long as the test wants.
struct Gate {
    gated: Mutex<Option<Operation>>,
    entered: Notify,
    release: Semaphore,
}

impl Default for Gate {
    fn default() -> Self {
        Self { gated: Mutex::new(None), entered: Notify::new(), release: Semaphore::new(0) }
    }
}

impl Gate {
    fn close(&self, op: Operation) {
        *self.gated.lock().unwrap() = Some(op);
    }

    fn open(&self) {
        *self.gated.lock().unwrap() = None;
        self.release.add_permits(1_000);
    }

    async fn pass(&self, op: Operation) {
        if *self.gated.lock().unwrap() == Some(op) {
            self.entered.notify_one();
            self.release.acquire().await.expect("the gate is never closed for good").forget();
        }
    }
}

/// The emulator behind a [`Gate`].
struct Gated {
    emulator: Arc<Emulator>,
    gate: Arc<Gate>,
}

impl AzureApi for Gated {
    async fn update_services(&self, action: UpdateAction, requests: &[ServiceRequest]) -> Result<(), AzureError> {
        self.emulator.update_services(action, requests).await
    }
    async fn update_address_locations(&self, action: UpdateAction, l: &[LocationUpdate]) -> Result<(), AzureError> {
        self.emulator.update_address_locations(action, l).await
    }
    async fn list_services(&self) -> Result<Vec<ListedService>, AzureError> {
        self.emulator.list_services().await
    }
    async fn list_address_locations(&self) -> Result<Vec<ListedLocation>, AzureError> {
        self.emulator.list_address_locations().await
    }
    async fn list_public_ips(&self) -> Result<Vec<ListedPublicIp>, AzureError> {
        self.emulator.list_public_ips().await
    }
    async fn list_load_balancers(&self) -> Result<Vec<ListedLoadBalancer>, AzureError> {
        self.emulator.list_load_balancers().await
    }
    async fn put_public_ip(&self, spec: &PublicIpSpec) -> Result<String, AzureError> {
        self.emulator.put_public_ip(spec).await
    }
    async fn delete_public_ip(&self, name: &str) -> Result<(), AzureError> {
        self.emulator.delete_public_ip(name).await
    }
    async fn put_load_balancer(&self, spec: &LoadBalancerSpec) -> Result<(), AzureError> {
        self.emulator.put_load_balancer(spec).await
    }
    async fn delete_load_balancer(&self, name: &str) -> Result<(), AzureError> {
        self.emulator.delete_load_balancer(name).await
    }
    async fn get_backend_pool(&self, pool: &PoolRef) -> Result<(BackendPool, ETag), AzureError> {
        self.gate.pass(Operation::GetBackendPool).await;
        self.emulator.get_backend_pool(pool).await
    }
    async fn put_backend_pool(&self, pool: &PoolRef, c: &BackendPool, m: Option<&ETag>) -> Result<(), AzureError> {
        self.gate.pass(Operation::PutBackendPool).await;
        self.emulator.put_backend_pool(pool, c, m).await
    }
    async fn delete_backend_pool(&self, pool: &PoolRef) -> Result<(), AzureError> {
        self.gate.pass(Operation::DeleteBackendPool).await;
        self.emulator.delete_backend_pool(pool).await
    }
    async fn list_nat_gateways(&self) -> Result<Vec<ListedNatGateway>, AzureError> {
        self.emulator.list_nat_gateways().await
    }
    async fn put_nat_gateway(&self, spec: &NatGatewaySpec) -> Result<(), AzureError> {
        self.emulator.put_nat_gateway(spec).await
    }
    async fn delete_nat_gateway(&self, name: &str) -> Result<(), AzureError> {
        self.emulator.delete_nat_gateway(name).await
    }
}

type Updater = PoolUpdater<Gated, Arc<InMemoryLock>, Cluster>;

struct Fixture {
    updater: Arc<Updater>,
    emulator: Arc<Emulator>,
    gate: Arc<Gate>,
    lock: Arc<InMemoryLock>,
}

const POOL: &str = "svc-a";

/// Two load balancers, `lb1` and `lb2`, each with an empty pool `svc-a`; `ns/a` is on `lb1`.
async fn fixture() -> Fixture {
    let emulator = Arc::new(Emulator::new(test_scope()));
    emulator.put_public_ip(&PublicIpSpec { name: "pip".into(), version: IpVersion::IPv4 }).await.unwrap();
    for lb in ["lb1", "lb2"] {
        let spec =
            LoadBalancerSpec { name: lb.into(), public_ip: "pip".into(), backend_pool: POOL.into(), rules: vec![] };
        emulator.put_load_balancer(&spec).await.unwrap();
    }
    let gate = Arc::new(Gate::default());
    let lock = Arc::new(InMemoryLock::new());
    let azure = Gated { emulator: emulator.clone(), gate: gate.clone() };
    let service_lock = ServiceLock::default();
    let updater = PoolUpdater::new(
        clb_tests::builtin(),
        azure,
        lock.clone(),
        Cluster::new(),
        service_lock,
        PoolUpdaterConfig::default(),
    )
    .expect("the updater starts");
    let updater = Arc::new(updater);
    assign(&updater, "ns/a", Some("lb1")).await;
    Fixture { updater, emulator, gate, lock }
}

async fn assign(updater: &Updater, service: &str, lb: Option<&str>) {
    let held = updater.service_lock().lock().await;
    updater.assign(&held, service, lb);
}

fn op(service: &str, lb: &str, kind: OperationKind, ips: &[&str]) -> PoolOperation {
    PoolOperation {
        service: service.into(),
        load_balancer: lb.into(),
        pool: POOL.into(),
        kind,
        node_ips: ips.iter().map(|s| s.to_string()).collect(),
    }
}

fn add(lb: &str, ips: &[&str]) -> PoolOperation {
    op("ns/a", lb, OperationKind::Add, ips)
}

fn requests(emulator: &Emulator, op: Operation) -> u64 {
    emulator.state().requests.get(op.name()).copied().unwrap_or(0)
}

fn pool_ips(emulator: &Emulator, lb: &str) -> Vec<String> {
    let mut ips: Vec<String> = emulator.resources().backend_pools[&format!("{lb}/{POOL}")]
        .addresses
        .iter()
        .map(|a| a.properties.ip_address.clone())
        .collect();
    ips.sort();
    ips
}

fn ran(tick: Tick) -> TickSummary {
    match tick {
        Tick::Ran(summary) => summary,
        other => panic!("expected the tick to run, got {other:?}"),
    }
}

/// Lets every other task on this (current-thread) runtime run until it blocks.
async fn let_others_run() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Queues one add for lb1, takes the service lock as a reconcile would, and starts a tick that
/// must wait behind it; returns the held lock and the waiting tick.
async fn tick_behind_a_reconcile(
    f: &Fixture,
) -> (tokio::sync::MutexGuard<'_, ()>, tokio::task::JoinHandle<Result<Tick, PoolUpdaterError>>) {
    f.updater.enqueue(&[add("lb1", &["10.0.0.4"])]).unwrap();
    let reconciling = f.updater.service_lock().lock().await;
    let updater = f.updater.clone();
    let tick = tokio::spawn(async move { updater.tick().await });
    let_others_run().await;
    (reconciling, tick)
}

// Upstream TestLoadBalancerBackendPoolUpdater "Add node IPs to backend pool" and "empty queue
// returns without ARM calls", end to end.
#[tokio::test]
async fn a_queued_add_is_written_with_one_get_and_one_put_and_an_idle_tick_takes_no_lock() {
    let f = fixture().await;
    assert!(matches!(f.updater.tick().await.unwrap(), Tick::Idle));
    assert_eq!(f.lock.locks.load(Ordering::SeqCst), 0, "an idle queue makes no lock traffic");
    f.updater.enqueue(&[add("lb1", &["10.0.0.5", "10.0.0.4"])]).unwrap();
    let summary = ran(f.updater.tick().await.unwrap());
    assert_eq!((summary.groups, summary.written), (1, 1));
    assert_eq!(pool_ips(&f.emulator, "lb1"), vec!["10.0.0.4", "10.0.0.5"]);
    assert_eq!(
        (requests(&f.emulator, Operation::GetBackendPool), requests(&f.emulator, Operation::PutBackendPool)),
        (1, 1)
    );
    assert!(!f.lock.is_held(), "released after the tick");
    let events = f.updater.kube().events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!((events[0].reason.as_str(), events[0].object.as_str()), ("LoadBalancerBackendPoolUpdated", "ns/a"));
}

// A backend address is named after its node, as upstream's addNodeIPAddressesToBackendPool names it from the
// node-IP map (IPv6 spelled any way finds its node); an IP whose node the producer no longer reads is named
// after the IP, ':' made '-'. The nodes read later name what is added later.
#[tokio::test]
async fn a_backend_address_is_named_after_its_node_and_after_its_ip_when_no_node_has_it() {
    let f = fixture().await;
    let nodes = BTreeMap::from([
        ("aks-nodepool1-0".to_owned(), vec!["10.0.0.4".to_owned()]),
        ("aks-nodepool1-1".to_owned(), vec!["FD00:0:0:0:0:0:0:5".to_owned()]),
    ]);
    f.updater.set_nodes(&nodes);
    f.updater.enqueue(&[add("lb1", &["10.0.0.4", "fd00::5", "10.0.0.9"])]).unwrap();
    assert_eq!(ran(f.updater.tick().await.unwrap()).written, 1);
    let named = |emulator: &Emulator| -> BTreeMap<String, String> {
        emulator.resources().backend_pools[&format!("lb1/{POOL}")]
            .addresses
            .iter()
            .map(|a| (a.properties.ip_address.to_lowercase(), a.name.clone()))
            .collect()
    };
    let want = [("10.0.0.4", "aks-nodepool1-0"), ("10.0.0.9", "10.0.0.9"), ("fd00::5", "aks-nodepool1-1")];
    assert_eq!(named(&f.emulator), want.map(|(ip, n)| (ip.to_owned(), n.to_owned())).into());
    f.updater.set_nodes(&BTreeMap::from([("aks-nodepool1-2".to_owned(), vec!["10.0.0.10".to_owned()])]));
    f.updater.enqueue(&[add("lb1", &["10.0.0.10"])]).unwrap();
    assert_eq!(ran(f.updater.tick().await.unwrap()).written, 1);
    assert_eq!(named(&f.emulator)["10.0.0.10"], "aks-nodepool1-2");
    assert_eq!(named(&f.emulator)["10.0.0.4"], "aks-nodepool1-0", "a name once written stays");
}

// Upstream TestLoadBalancerBackendPoolUpdater "Remove node IPs from backend pool", "Multiple
// operations in two batches" and "add-then-remove deduplicates IPs and removes target": a later
// batch reads the pool an earlier one wrote (GET {1, 2}) and PUTs it without the removed IP.
#[tokio::test]
async fn a_removal_in_a_later_batch_takes_the_ip_out_of_the_pool_the_first_batch_wrote() {
    let f = fixture().await;
    f.updater.enqueue(&[add("lb1", &["10.0.0.1", "10.0.0.2"])]).unwrap();
    assert_eq!(ran(f.updater.tick().await.unwrap()).written, 1);
    assert_eq!(pool_ips(&f.emulator, "lb1"), vec!["10.0.0.1", "10.0.0.2"]);
    f.updater
        .enqueue(&[
            add("lb1", &["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2", "10.0.0.3", "10.0.0.3"]),
            op("ns/a", "lb1", OperationKind::Remove, &["10.0.0.2"]),
        ])
        .unwrap();
    let summary = ran(f.updater.tick().await.unwrap());
    assert_eq!((summary.groups, summary.written), (1, 1), "{summary:?}");
    assert_eq!(pool_ips(&f.emulator, "lb1"), vec!["10.0.0.1", "10.0.0.3"], "10.0.0.2 removed, 10.0.0.3 added once");
    assert_eq!(
        (requests(&f.emulator, Operation::GetBackendPool), requests(&f.emulator, Operation::PutBackendPool)),
        (2, 2)
    );
    f.updater.enqueue(&[op("ns/a", "lb1", OperationKind::Remove, &["10.0.0.1", "10.0.0.3"])]).unwrap();
    assert_eq!(ran(f.updater.tick().await.unwrap()).written, 1);
    assert!(pool_ips(&f.emulator, "lb1").is_empty(), "every IP removed");
    assert_eq!(requests(&f.emulator, Operation::PutBackendPool), 3);
    assert_eq!(pool_ips(&f.emulator, "lb2"), Vec::<String>::new(), "the other load balancer's pool is untouched");
}

// Upstream TestLoadBalancerBackendPoolUpdater "adding already-present IPs does not trigger
// CreateOrUpdate" and "removing non-existent IPs does not trigger CreateOrUpdate".
#[tokio::test]
async fn a_change_already_in_the_pool_is_not_written() {
    let f = fixture().await;
    f.updater.enqueue(&[add("lb1", &["10.0.0.4"])]).unwrap();
    ran(f.updater.tick().await.unwrap());
    f.updater.enqueue(&[add("lb1", &["10.0.0.4"]), op("ns/a", "lb1", OperationKind::Remove, &["10.0.0.9"])]).unwrap();
    let summary = ran(f.updater.tick().await.unwrap());
    assert_eq!((summary.groups, summary.unchanged, summary.written), (1, 1, 0));
    assert_eq!(requests(&f.emulator, Operation::PutBackendPool), 1, "only the first tick wrote");
}

// Upstream TestEndpointSlicesInformerDeduplicatesNodeIPs: the endpoints moving from node1 to
// three on node2 enqueue exactly a remove of node1's IP and an add of node2's, and the same node
// set again (whatever the endpoint count behind it) enqueues nothing.
#[tokio::test]
async fn the_producer_enqueues_a_remove_and_an_add_when_the_node_set_changes_and_nothing_when_it_does_not() {
    use clb_executor::pool_producer::{PoolProducer, ready_node_ips};
    use clb_sandbox::bindings::clb::reconciler::types as wit;
    use clb_sandbox::bindings::exports::clb::reconciler::backend_pools::{FamilyPool, ServicePlacement};
    use std::collections::{BTreeMap, BTreeSet};
    let f = fixture().await;
    let node_ips: BTreeMap<String, Vec<String>> =
        [("node1", "10.0.0.1"), ("node2", "10.0.0.2")].map(|(n, ip)| (n.to_string(), vec![ip.to_string()])).into();
    let slice = |nodes: &[&str]| wit::EndpointSlice {
        namespace: "test".into(),
        name: "eps1".into(),
        owner_service_uid: Some("uid-1".into()),
        address_type: "IPv4".into(),
        endpoints: nodes
            .iter()
            .enumerate()
            .map(|(i, n)| wit::Endpoint {
                addresses: vec![format!("10.244.0.{}", i + 5)],
                node_name: Some(n.to_string()),
                ready: Some(true),
            })
            .collect(),
        deleting: false,
    };
    let placement = || ServicePlacement {
        load_balancer: "lb1".into(),
        pools: vec![FamilyPool { ipv6: false, name: POOL.into() }],
        left: vec![],
    };
    let mut producer = PoolProducer::new();
    let mut update = |nodes: &[&str]| {
        let ips = ready_node_ips("uid-1", [&slice(nodes)], &node_ips);
        let mut notes = Vec::new();
        let held = f.updater.service_lock().try_lock().expect("the service lock is free");
        producer
            .update(&f.updater, &held, "test/svc1", placement(), ips, |_: &str| Some(BTreeSet::new()), &mut notes)
            .unwrap();
        notes
    };
    assert_eq!(update(&["node1"]), vec![format!("enqueue test/svc1 add lb1:{POOL} [10.0.0.1]")]);
    assert_eq!(f.updater.status().unwrap().queued, 1);
    assert_eq!(
        update(&["node2", "node2", "node2"]),
        vec![
            format!("enqueue test/svc1 remove lb1:{POOL} [10.0.0.1]"),
            format!("enqueue test/svc1 add lb1:{POOL} [10.0.0.2]"),
        ]
    );
    assert_eq!(f.updater.status().unwrap().queued, 3, "exactly one remove and one add more");
    assert!(update(&["node2", "node2"]).is_empty(), "the same node set with fewer endpoints is a no-op");
    assert!(update(&["node2", "node2", "node2", "node2"]).is_empty(), "and with more");
    assert_eq!(f.updater.status().unwrap().queued, 3, "nothing more queued");
    assert_eq!(ran(f.updater.tick().await.unwrap()).written, 1);
    assert_eq!(pool_ips(&f.emulator, "lb1"), vec!["10.0.0.2"]);
}

// Upstream TestCheckAndApplyLocalServiceBackendPoolUpdates "should update backend pool as
// expected": nodes with an IPv4 and an IPv6 InternalIP, a Service with a pool of each family on
// lb1 holding node1's address of that family, its endpoints now on node2: the tick writes each
// pool once (one GET and one PUT each) to hold node2's address of its family. Here the pools are
// the Service's families' (a dual-stack Service); upstream keeps every pool the Service owns on
// the load balancer in line, whatever its family. "should not report an error if failed to get
// the endpointslice": with no endpoints here the pools are emptied, where upstream leaves them.
#[tokio::test]
async fn a_dual_stack_local_services_pools_each_hold_the_addresses_of_their_family_of_its_endpoints_nodes() {
    use clb_executor::pool_producer::{PoolProducer, ready_node_ips};
    use clb_sandbox::bindings::clb::reconciler::types as wit;
    use clb_sandbox::bindings::exports::clb::reconciler::backend_pools::{FamilyPool, ServicePlacement};
    use std::collections::{BTreeMap, BTreeSet};
    let f = fixture().await;
    let (v4, v6) = (
        PoolRef { load_balancer: "lb1".into(), pool: "default-svc1".into() },
        PoolRef { load_balancer: "lb1".into(), pool: "default-svc1-ipv6".into() },
    );
    for (pool, ip) in [(&v4, "10.0.0.1"), (&v6, "fd00::1")] {
        let content = BackendPool {
            addresses: vec![BackendAddress { name: "node1".into(), ip_address: ip.into() }],
            ..BackendPool::default()
        };
        f.emulator.put_backend_pool(pool, &content, None).await.unwrap();
    }
    let node_ips: BTreeMap<String, Vec<String>> =
        [("node1", ["10.0.0.1", "fd00::1"]), ("node2", ["10.0.0.2", "fd00::2"])]
            .map(|(n, ips)| (n.to_string(), ips.map(str::to_owned).to_vec()))
            .into();
    f.updater.set_nodes(&node_ips);
    let slice = wit::EndpointSlice {
        namespace: "default".into(),
        name: "eps1".into(),
        owner_service_uid: Some("uid-1".into()),
        address_type: "IPv4".into(),
        endpoints: vec![wit::Endpoint {
            addresses: vec!["10.244.0.5".into()],
            node_name: Some("node2".into()),
            ready: None,
        }],
        deleting: false,
    };
    let pools = [(false, &v4), (true, &v6)].map(|(ipv6, p)| FamilyPool { ipv6, name: p.pool.clone() }).to_vec();
    let placement = ServicePlacement { load_balancer: "lb1".into(), pools, left: vec![] };
    assign(&f.updater, "default/svc1", Some("lb1")).await;
    let before = (requests(&f.emulator, Operation::GetBackendPool), requests(&f.emulator, Operation::PutBackendPool));
    let contents = |pool: &str| -> Option<BTreeSet<String>> {
        let ip = if pool.ends_with("-ipv6") { "fd00::1" } else { "10.0.0.1" };
        Some([ip.to_owned()].into())
    };
    let mut producer = PoolProducer::new();
    let mut notes = Vec::new();
    {
        let held = f.updater.service_lock().lock().await;
        let ips = ready_node_ips("uid-1", [&slice], &node_ips);
        producer.update(&f.updater, &held, "default/svc1", placement.clone(), ips, contents, &mut notes).unwrap();
    }
    let summary = ran(f.updater.tick().await.unwrap());
    assert_eq!((summary.groups, summary.written), (2, 2), "{notes:?}");
    let after = (requests(&f.emulator, Operation::GetBackendPool), requests(&f.emulator, Operation::PutBackendPool));
    assert_eq!((after.0 - before.0, after.1 - before.1), (2, 2));
    for (pool, want) in [(&v4, "10.0.0.2"), (&v6, "fd00::2")] {
        let (content, _) = f.emulator.get_backend_pool(pool).await.unwrap();
        let held: Vec<(&str, &str)> =
            content.addresses.iter().map(|a| (a.name.as_str(), a.ip_address.as_str())).collect();
        assert_eq!(held, [("node2", want)], "{}", pool.pool);
    }
    // No endpoints: both pools are emptied.
    {
        let held = f.updater.service_lock().lock().await;
        producer
            .update(
                &f.updater,
                &held,
                "default/svc1",
                placement,
                BTreeSet::new(),
                |_: &str| Some(BTreeSet::new()),
                &mut notes,
            )
            .unwrap();
    }
    assert_eq!(ran(f.updater.tick().await.unwrap()).written, 2);
    for pool in [&v4, &v6] {
        assert!(f.emulator.get_backend_pool(pool).await.unwrap().0.addresses.is_empty(), "{}", pool.pool);
    }
}

// Upstream TestLoadBalancerBackendPoolUpdaterSerializesWithServiceReconcileLock.
#[tokio::test]
async fn a_reconcile_holding_the_service_lock_keeps_the_tick_from_azure_until_it_ends() {
    let f = fixture().await;
    let (reconciling, tick) = tick_behind_a_reconcile(&f).await;
    assert!(!tick.is_finished());
    assert_eq!(requests(&f.emulator, Operation::GetBackendPool), 0, "no ARM call while a reconcile holds the lock");
    assert_eq!(f.lock.locks.load(Ordering::SeqCst), 0, "nor a resource lock call");
    drop(reconciling);
    assert_eq!(ran(tick.await.unwrap().unwrap()).written, 1);
    assert_eq!(pool_ips(&f.emulator, "lb1"), vec!["10.0.0.4"]);
}

// Upstream TestLoadBalancerBackendPoolUpdaterAddOperationNotBlockedDuringProcess.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_do_not_wait_while_a_tick_is_inside_an_arm_call() {
    let f = fixture().await;
    f.updater.enqueue(&[add("lb1", &["10.0.0.4"])]).unwrap();
    f.gate.close(Operation::GetBackendPool);
    let updater = f.updater.clone();
    let tick = tokio::spawn(async move { updater.tick().await });
    f.gate.entered.notified().await;
    // On a blocking thread, so that a queue lock held across the ARM call would show as a
    // timeout here rather than hang the test.
    let updater = f.updater.clone();
    let produce = tokio::task::spawn_blocking(move || {
        updater.enqueue(&[add("lb1", &["10.0.0.5"])]).unwrap();
        updater.remove_operations("ns/other").unwrap();
        updater.status().unwrap()
    });
    let status = tokio::time::timeout(Duration::from_secs(5), produce)
        .await
        .expect("enqueue returned while the tick was inside the GET")
        .unwrap();
    assert_eq!(status.queued, 1);
    assert!(!tick.is_finished(), "the tick is still inside its ARM call");
    f.gate.open();
    assert_eq!(ran(tick.await.unwrap().unwrap()).written, 1);
    assert_eq!(ran(f.updater.tick().await.unwrap()).written, 1, "the op queued meanwhile is the next batch");
    assert_eq!(pool_ips(&f.emulator, "lb1"), vec!["10.0.0.4", "10.0.0.5"]);
}

// Upstream TestLoadBalancerBackendPoolUpdaterPreservesOperationsOnLeaseLockFailure.
#[tokio::test]
async fn operations_stay_queued_when_the_resource_lock_cannot_be_taken() {
    let f = fixture().await;
    f.updater.enqueue(&[add("lb1", &["10.0.0.4"])]).unwrap();
    f.lock.fail_lock(true);
    assert!(matches!(f.updater.tick().await.unwrap(), Tick::LockFailed(_)));
    assert_eq!(requests(&f.emulator, Operation::GetBackendPool), 0);
    assert_eq!(f.updater.status().unwrap().queued, 1, "nothing drained");
    assert_eq!(f.updater.stats().lock_failures.load(Ordering::Relaxed), 1);
    f.lock.fail_lock(false);
    assert_eq!(ran(f.updater.tick().await.unwrap()).written, 1);
}

// Upstream TestLoadBalancerBackendPoolUpdaterCompletesOnUnlockFailure.
#[tokio::test]
async fn the_tick_completes_when_the_resource_lock_cannot_be_released() {
    let f = fixture().await;
    f.updater.enqueue(&[add("lb1", &["10.0.0.4"])]).unwrap();
    f.lock.fail_unlock(true);
    let summary = ran(f.updater.tick().await.unwrap());
    assert!(summary.unlock_failed);
    assert_eq!(summary.written, 1);
    assert_eq!(
        (requests(&f.emulator, Operation::GetBackendPool), requests(&f.emulator, Operation::PutBackendPool)),
        (1, 1)
    );
    assert_eq!(f.updater.status().unwrap().queued, 0, "the queue is empty");
    assert_eq!(f.updater.stats().unlock_failures.load(Ordering::Relaxed), 1);
}

// Upstream TestLoadBalancerBackendPoolUpdaterFiltersOperationsWhenLBChangedDuringProcess.
#[tokio::test]
async fn an_operation_for_lb1_is_dropped_when_the_service_moved_to_lb2_while_the_tick_waited() {
    let f = fixture().await;
    let (reconciling, tick) = tick_behind_a_reconcile(&f).await;
    f.updater.assign(&reconciling, "ns/a", Some("lb2"));
    drop(reconciling);
    let summary = ran(tick.await.unwrap().unwrap());
    assert_eq!(summary.groups, 0);
    assert_eq!(requests(&f.emulator, Operation::GetBackendPool), 0, "no ARM call");
    assert_eq!(f.updater.status().unwrap().queued, 0);
}

// Upstream TestLoadBalancerBackendPoolUpdaterRemoveOperationCancelsOperationsBeforeDrain.
#[tokio::test]
async fn remove_operations_during_a_waiting_tick_cancels_the_work() {
    let f = fixture().await;
    let (reconciling, tick) = tick_behind_a_reconcile(&f).await;
    assert_eq!(f.updater.remove_operations("NS/A").unwrap(), 1);
    drop(reconciling);
    assert!(matches!(tick.await.unwrap().unwrap(), Tick::Idle));
    assert_eq!(requests(&f.emulator, Operation::GetBackendPool), 0, "no ARM call");
    assert_eq!(f.updater.status().unwrap().queued, 0);
}

// The lost update upstream's backend-pool updater was written against: a concurrent writer makes
// the PUT fail with 412; the group is requeued and the next tick writes on top of the other
// writer's change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_412_from_a_concurrent_writer_is_retried_on_top_of_its_change() {
    let f = fixture().await;
    f.updater.enqueue(&[add("lb1", &["10.0.0.4"])]).unwrap();
    f.gate.close(Operation::PutBackendPool);
    let updater = f.updater.clone();
    let tick = tokio::spawn(async move { updater.tick().await });
    f.gate.entered.notified().await;
    // Between the tick's GET and its PUT, someone else writes the pool.
    let pool = PoolRef { load_balancer: "lb1".into(), pool: POOL.into() };
    let (mut theirs, etag) = f.emulator.get_backend_pool(&pool).await.unwrap();
    theirs.addresses.push(BackendAddress { name: "other".into(), ip_address: "10.0.0.9".into() });
    f.emulator.put_backend_pool(&pool, &theirs, Some(&etag)).await.unwrap();
    f.gate.open();
    let first = ran(tick.await.unwrap().unwrap());
    assert_eq!((first.written, first.requeued), (0, 1), "{first:?}");
    assert_eq!(f.updater.status().unwrap().queued, 1, "requeued");
    let second = ran(f.updater.tick().await.unwrap());
    assert_eq!(second.written, 1, "{second:?}");
    assert_eq!(pool_ips(&f.emulator, "lb1"), vec!["10.0.0.4", "10.0.0.9"], "neither write is lost");
    let reasons: Vec<String> = f.updater.kube().events().into_iter().map(|e| e.reason).collect();
    assert_eq!(reasons, vec!["LoadBalancerBackendPoolUpdateRetrying", "LoadBalancerBackendPoolUpdated"]);
}

// Upstream TestLoadBalancerBackendPoolUpdaterFailed "Non-retriable error when updating backend
// pool", with one Warning per distinct Service instead of the first one only.
#[tokio::test]
async fn a_terminal_failure_warns_every_service_of_the_group_once() {
    let f = fixture().await;
    assign(&f.updater, "ns/b", Some("lb1")).await;
    f.updater
        .enqueue(&[
            add("lb1", &["10.0.0.4"]),
            op("ns/b", "lb1", OperationKind::Add, &["10.0.0.5"]),
            add("lb1", &["10.0.0.6"]),
        ])
        .unwrap();
    f.emulator.set_fault(Fault::times(Operation::PutBackendPool, 1, FaultMode::status(500)));
    let summary = ran(f.updater.tick().await.unwrap());
    assert_eq!(summary.abandoned, 1);
    let warned: Vec<(String, String, String)> =
        f.updater.kube().events().into_iter().map(|e| (e.object, e.event_type, e.reason)).collect();
    let expected = |s: &str| (s.to_string(), "Warning".to_string(), "LoadBalancerBackendPoolUpdateFailed".to_string());
    assert_eq!(warned, vec![expected("ns/a"), expected("ns/b")]);
    assert_eq!(f.updater.status().unwrap().queued, 0, "dropped");
}

// Upstream TestLoadBalancerBackendPoolUpdaterFailed "Non-retriable error when getting backend
// pool": the GET fails, so no PUT follows, the pool is left as it was and the group is dropped.
#[tokio::test]
async fn a_terminal_failure_of_the_get_sends_no_put_and_leaves_the_pool_unchanged() {
    let f = fixture().await;
    f.updater.enqueue(&[add("lb1", &["10.0.0.4"])]).unwrap();
    f.emulator.set_fault(Fault::times(Operation::GetBackendPool, 1, FaultMode::status(500)));
    let summary = ran(f.updater.tick().await.unwrap());
    assert_eq!((summary.abandoned, summary.written), (1, 0), "{summary:?}");
    assert_eq!(requests(&f.emulator, Operation::PutBackendPool), 0, "no PUT after a failed GET");
    assert!(pool_ips(&f.emulator, "lb1").is_empty(), "the pool is unchanged");
    let warned: Vec<(String, String, String)> =
        f.updater.kube().events().into_iter().map(|e| (e.object, e.event_type, e.reason)).collect();
    assert_eq!(
        warned,
        vec![("ns/a".to_string(), "Warning".to_string(), "LoadBalancerBackendPoolUpdateFailed".to_string())]
    );
    assert_eq!(f.updater.status().unwrap().queued, 0, "dropped");
    assert!(!f.lock.is_held(), "released after the tick");
}

// Upstream TestLoadBalancerBackendPoolUpdaterFailed "Backend pool not found": here a missing
// pool is created (below), so only a pool whose load balancer is gone is not found for good:
// the GET and the PUT that would create it both answer 404, and the group is dropped silently.
#[tokio::test]
async fn a_pool_whose_load_balancer_does_not_exist_is_dropped_without_an_event() {
    let f = fixture().await;
    f.emulator.delete_load_balancer("lb1").await.unwrap();
    f.updater.enqueue(&[add("lb1", &["10.0.0.4"])]).unwrap();
    let summary = ran(f.updater.tick().await.unwrap());
    assert_eq!((summary.dropped, summary.created), (1, 0));
    assert_eq!(
        (requests(&f.emulator, Operation::GetBackendPool), requests(&f.emulator, Operation::PutBackendPool)),
        (1, 1),
        "the creation was tried"
    );
    assert!(f.updater.kube().events().is_empty());
    assert_eq!(f.updater.status().unwrap().queued, 0);
}

// Upstream creates a local Service's pool with its load balancer and deletes it when the Service
// leaves (cleanupLocalServiceBackendPool); here the tick does both, under its locks: a pool its
// load balancer lacks is created by a PUT without If-Match, the pool a Service left is deleted,
// and deleting a pool already gone is no error.
#[tokio::test]
async fn a_missing_pool_is_created_by_the_tick_and_the_pool_a_service_left_is_deleted_by_the_next() {
    let f = fixture().await;
    let pool = PoolRef { load_balancer: "lb1".into(), pool: POOL.into() };
    f.emulator.delete_backend_pool(&pool).await.unwrap();
    assert_eq!(f.emulator.get_backend_pool(&pool).await.unwrap_err().status, 404);
    f.updater.enqueue(&[add("lb1", &["10.0.0.4"])]).unwrap();
    let summary = ran(f.updater.tick().await.unwrap());
    assert_eq!((summary.written, summary.created, summary.deleted), (1, 1, 0));
    assert_eq!(pool_ips(&f.emulator, "lb1"), vec!["10.0.0.4"]);
    assert_eq!(f.updater.stats().pools_created.load(Ordering::Relaxed), 1);
    let events = f.updater.kube().events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].message.contains("created"), "{events:?}");

    // The Service moved to lb2: its queued work for lb1 is cancelled, the deletion is not.
    assign(&f.updater, "ns/a", Some("lb2")).await;
    f.updater.enqueue(&[op("ns/a", "lb1", OperationKind::DeletePool, &[]), add("lb2", &["10.0.0.4"])]).unwrap();
    assert_eq!(f.updater.remove_operations("ns/a").unwrap(), 1, "the add only");
    let summary = ran(f.updater.tick().await.unwrap());
    assert_eq!((summary.written, summary.deleted), (1, 1));
    assert_eq!(f.emulator.get_backend_pool(&pool).await.unwrap_err().status, 404);
    assert_eq!(f.updater.stats().pools_deleted.load(Ordering::Relaxed), 1);
    assert_eq!(f.updater.kube().events().len(), 1, "a deletion tells no one");

    // ARM answers the DELETE of a pool already gone with 204: done, and no error.
    f.updater.enqueue(&[op("ns/a", "lb1", OperationKind::DeletePool, &[])]).unwrap();
    let summary = ran(f.updater.tick().await.unwrap());
    assert_eq!((summary.deleted, summary.abandoned, summary.dropped), (1, 0, 0), "already gone");
    assert_eq!(requests(&f.emulator, Operation::DeleteBackendPool), 3, "the test's own, then one a tick");
    assert_eq!(f.updater.status().unwrap().queued, 0);
}

// Upstream's load-balancer reconcile makes a local Service's pool before any node holds one of
// its endpoints: an ensured pool Azure lacks is created empty (a GET 404, a PUT without
// If-Match), and one it has costs a GET and no write; a deletion queued after the ensure wins,
// an ensure queued after a deletion keeps the pool, emptied.
#[tokio::test]
async fn an_ensured_pool_is_created_empty_when_missing_and_left_alone_when_there() {
    let f = fixture().await;
    let pool = PoolRef { load_balancer: "lb1".into(), pool: POOL.into() };
    f.emulator.delete_backend_pool(&pool).await.unwrap();
    let ensure = || op("ns/a", "lb1", OperationKind::EnsurePool, &["10.0.0.9"]);
    f.updater.enqueue(&[ensure()]).unwrap();
    let summary = ran(f.updater.tick().await.unwrap());
    assert_eq!((summary.written, summary.created), (1, 1));
    assert!(pool_ips(&f.emulator, "lb1").is_empty(), "created empty: an ensure's node IPs are ignored");
    let puts = || requests(&f.emulator, Operation::PutBackendPool);
    assert_eq!(puts(), 1);

    f.updater.enqueue(&[ensure()]).unwrap();
    let summary = ran(f.updater.tick().await.unwrap());
    assert_eq!((summary.written, summary.unchanged), (0, 1));
    assert_eq!(puts(), 1, "there already: no write");

    f.updater.enqueue(&[add("lb1", &["10.0.0.4"])]).unwrap();
    ran(f.updater.tick().await.unwrap());
    f.updater.enqueue(&[op("ns/a", "lb1", OperationKind::DeletePool, &[]), ensure()]).unwrap();
    let summary = ran(f.updater.tick().await.unwrap());
    assert_eq!((summary.written, summary.deleted), (1, 0), "kept, emptied");
    assert!(pool_ips(&f.emulator, "lb1").is_empty());
    f.updater.enqueue(&[ensure(), op("ns/a", "lb1", OperationKind::DeletePool, &[])]).unwrap();
    let summary = ran(f.updater.tick().await.unwrap());
    assert_eq!(summary.deleted, 1);
    assert_eq!(f.emulator.get_backend_pool(&pool).await.unwrap_err().status, 404);
}

/// A small deterministic generator, so that a failing interleaving can be replayed by seed.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

async fn maybe_yield(rng: &Mutex<Lcg>) {
    let spins = rng.lock().unwrap().below(4);
    for _ in 0..spins {
        tokio::task::yield_now().await;
    }
}

// The lock order under contention: ticks, reconciles (service lock, then assignment, enqueue
// and cancel) and EndpointSlice producers, with lock and unlock failures switched at random.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_interleavings_of_ticks_reconciles_and_producers_never_deadlock() {
    for seed in 0..200u64 {
        let f = fixture().await;
        let rng = Arc::new(Mutex::new(Lcg(seed)));
        let ticker = {
            let (updater, rng, lock) = (f.updater.clone(), rng.clone(), f.lock.clone());
            tokio::spawn(async move {
                for _ in 0..3 {
                    let (fail_lock, fail_unlock) = {
                        let mut r = rng.lock().unwrap();
                        (r.below(4) == 0, r.below(4) == 0)
                    };
                    lock.fail_lock(fail_lock);
                    lock.fail_unlock(fail_unlock);
                    updater.tick().await.unwrap();
                    maybe_yield(&rng).await;
                }
            })
        };
        let reconciler = {
            let (updater, rng) = (f.updater.clone(), rng.clone());
            tokio::spawn(async move {
                for _ in 0..3 {
                    let held = updater.service_lock().lock().await;
                    let (lb, cancel) = {
                        let mut r = rng.lock().unwrap();
                        (if r.below(2) == 0 { "lb1" } else { "lb2" }, r.below(3) == 0)
                    };
                    updater.assign(&held, "ns/a", Some(lb));
                    if cancel {
                        updater.remove_operations("ns/a").unwrap();
                    }
                    maybe_yield(&rng).await;
                    updater.enqueue(&[add(lb, &["10.0.0.4"])]).unwrap();
                    drop(held);
                    maybe_yield(&rng).await;
                }
            })
        };
        let producer = {
            let (updater, rng) = (f.updater.clone(), rng.clone());
            tokio::spawn(async move {
                for i in 0..5 {
                    let lb = if rng.lock().unwrap().below(2) == 0 { "lb1" } else { "lb2" };
                    let kind = if i % 2 == 0 { OperationKind::Add } else { OperationKind::Remove };
                    updater.enqueue(&[op("ns/a", lb, kind, &["10.0.0.5"])]).unwrap();
                    maybe_yield(&rng).await;
                }
            })
        };
        tokio::time::timeout(Duration::from_secs(10), async {
            ticker.await.unwrap();
            reconciler.await.unwrap();
            producer.await.unwrap();
        })
        .await
        .unwrap_or_else(|_| panic!("seed {seed}: deadlock"));
        // Quiesce: with the lock healthy, the queue drains and the lock ends released.
        f.lock.fail_lock(false);
        f.lock.fail_unlock(false);
        for _ in 0..3 {
            if matches!(f.updater.tick().await.unwrap(), Tick::Idle) {
                break;
            }
        }
        assert_eq!(f.updater.status().unwrap().queued, 0, "seed {seed}: the queue drains");
        assert!(f.updater.service_lock().try_lock().is_ok(), "seed {seed}: the service lock ends free");
    }
}

// What `clb-host explore`'s crash-in-pool-tick leaves: a tick that dies after its first group
// carried out that group (GET and PUT), wrote nothing for the other it drained, and still holds
// the resource lock, as a process that died would.
#[tokio::test]
async fn a_tick_whose_controller_dies_after_one_group_writes_only_that_group_and_keeps_the_lock() {
    let f = fixture().await;
    assign(&f.updater, "ns/b", Some("lb2")).await;
    f.updater.enqueue(&[add("lb1", &["10.0.0.4"]), op("ns/b", "lb2", OperationKind::Add, &["10.0.0.5"])]).unwrap();
    let summary = ran(f.updater.tick_dying_after(1_000, 1).await.unwrap());
    assert_eq!((summary.groups, summary.written, summary.left), (2, 1, 1), "{summary:?}");
    assert_eq!(requests(&f.emulator, Operation::PutBackendPool), 1);
    let written: Vec<Vec<String>> = ["lb1", "lb2"].iter().map(|lb| pool_ips(&f.emulator, lb)).collect();
    assert_eq!(written.iter().filter(|ips| ips.is_empty()).count(), 1, "one pool written, one not: {written:?}");
    assert!(f.lock.is_held(), "a dead controller releases nothing");
}
