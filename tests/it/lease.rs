//! The Leases of docs/design.md §6 against the real kube-apiserver (`harness/apiserver`): the Azure
//! resource lock (docs/upstream.md §f) under a foreign holder, concurrency, renewal and release; leader
//! election on its own and with two `clb-host run` replicas sharing one emulator. Durations are
//! seconds so that expiry happens within a test; every wait is "until the behaviour shows".

use crate::kube::{azure_side, eventually, ingress_ips, manifest, reconcilers_slot};
use ::kube::api::{Api, DeleteParams, PostParams};
use clb_arm::Credential;
use clb_arm::auth::TokenFile;
use clb_azure::{AzureApi, IpVersion, LoadBalancerSpec, PublicIpSpec};
use clb_emulator::{Emulator, EmulatorServer};
use clb_executor::backend_pools::{PoolUpdater, PoolUpdaterConfig, ServiceLock, Tick};
use clb_host::live::settings::RunError;
use clb_kube::COMPONENT;
use clb_kube::lease::{
    ElectionConfig, Elector, LeaseError, LeaseLock, LeaseLockConfig, PREVIOUS_HOLDER_ANNOTATION, RESOURCE_LOCK_HOLDER,
    lead,
};
use clb_sandbox::bindings::exports::clb::reconciler::backend_pools::{OperationKind, PoolOperation};
use clb_simulator::cluster::Cluster;
use clb_tests::apiserver::apiserver;
use futures::FutureExt as _;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Runs `test` with a client of the shared API server and a fresh namespace, deleted after.
fn in_namespace<F: AsyncFnOnce(::kube::Client, String)>(prefix: &str, test: F) {
    let server = apiserver();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let client = connect(server).await;
        let namespace = format!("{prefix}-{}", std::process::id());
        create_namespace(&client, &namespace).await;
        test(client.clone(), namespace.clone()).await;
        delete_namespace(&client, &namespace).await;
    });
}

async fn connect(server: &clb_tests::apiserver::ApiServer) -> ::kube::Client {
    clb_host::live::settings::connect(Some(&server.kubeconfig)).await.expect("connects to the test API server")
}

fn lock_config(namespace: &str, holder: &str, duration: Duration) -> LeaseLockConfig {
    LeaseLockConfig {
        namespace: namespace.into(),
        holder: holder.into(),
        duration,
        renew_period: duration / 4,
        ..LeaseLockConfig::default()
    }
}

async fn read_lease(client: &::kube::Client, namespace: &str, name: &str) -> Lease {
    Api::<Lease>::namespaced(client.clone(), namespace).get(name).await.expect("reads the Lease")
}

fn holder(lease: &Lease) -> String {
    lease.spec.as_ref().and_then(|s| s.holder_identity.clone()).unwrap_or_default()
}

fn previous_holder(lease: &Lease) -> Option<String> {
    lease.metadata.annotations.as_ref().and_then(|a| a.get(PREVIOUS_HOLDER_ANNOTATION).cloned())
}

/// The Lease as another component (the AKS RP) writes it: held since now, for `seconds`.
pub(crate) async fn hold_as_foreign(client: &::kube::Client, namespace: &str, name: &str, who: &str, seconds: i32) {
    let now = MicroTime(Timestamp::now());
    let lease = Lease {
        metadata: ObjectMeta { name: Some(name.into()), namespace: Some(namespace.into()), ..Default::default() },
        spec: Some(LeaseSpec {
            holder_identity: Some(who.into()),
            lease_duration_seconds: Some(seconds),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            ..Default::default()
        }),
    };
    Api::<Lease>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &lease)
        .await
        .expect("creates the foreign Lease");
}

#[test]
fn a_resource_lock_held_by_a_foreign_holder_refuses_by_name_and_no_pool_is_written_until_it_expires_and_is_taken_over()
{
    in_namespace("clb-lock-foreign", async |client, namespace| {
        let name = clb_kube::lease::RESOURCE_LOCK_NAME;
        hold_as_foreign(&client, &namespace, name, "aks-resource-provider", 3).await;

        // The backend-pool updater, with the Lease as its resource lock, against the emulator.
        let emulator = Arc::new(Emulator::new(clb_tests::test_scope()));
        emulator.put_public_ip(&PublicIpSpec { name: "pip".into(), version: IpVersion::IPv4 }).await.unwrap();
        let lb = LoadBalancerSpec {
            name: "lb1".into(),
            public_ip: "pip".into(),
            backend_pool: "pool".into(),
            rules: vec![],
        };
        emulator.put_load_balancer(&lb).await.unwrap();
        let lock =
            LeaseLock::new(client.clone(), lock_config(&namespace, RESOURCE_LOCK_HOLDER, Duration::from_secs(30)));
        let updater = PoolUpdater::new(
            clb_tests::builtin(),
            emulator.clone(),
            lock,
            Cluster::new(),
            ServiceLock::default(),
            PoolUpdaterConfig::default(),
        )
        .unwrap();
        {
            let reconciling = updater.service_lock().lock().await;
            updater.assign(&reconciling, "ns/a", Some("lb1"));
        }
        let add = PoolOperation {
            service: "ns/a".into(),
            load_balancer: "lb1".into(),
            pool: "pool".into(),
            kind: OperationKind::Add,
            node_ips: vec!["10.0.0.4".into()],
        };
        updater.enqueue(&[add]).unwrap();
        let pool_ips = || -> Vec<String> {
            emulator.resources().backend_pools["lb1/pool"]
                .addresses
                .iter()
                .map(|a| a.properties.ip_address.clone())
                .collect()
        };

        let Tick::LockFailed(refused) = updater.tick().await.unwrap() else { panic!("the tick must not get the lock") };
        let cause = refused.source.as_deref().and_then(|s| s.downcast_ref::<LeaseError>());
        let Some(LeaseError::HeldByOther { holder: by, until, .. }) = cause else {
            panic!("a typed 'held by another holder': {refused:?}")
        };
        assert_eq!(by, "aks-resource-provider");
        let lease = read_lease(&client, &namespace, name).await;
        let renewed = lease.spec.as_ref().and_then(|s| s.renew_time.clone()).unwrap().0;
        assert_eq!(*until, renewed.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(3)).unwrap());
        assert!(pool_ips().is_empty(), "no pool write while the foreign holder's Lease runs");
        assert_eq!(emulator.state().requests.get("put-backend-pool"), None);

        // Once it expires the tick takes it over, writes, and releases.
        let summary =
            eventually("the tick runs once the foreign Lease expired", async || match updater.tick().await.unwrap() {
                Tick::Ran(summary) => Ok(summary),
                other => Err(format!("{other:?}")),
            })
            .await;
        assert_eq!((summary.written, summary.unlock_failed), (1, false));
        assert_eq!(pool_ips(), vec!["10.0.0.4"]);
        let stats = updater.resource_lock().stats();
        assert_eq!((stats.acquired.load(Ordering::Relaxed), stats.released.load(Ordering::Relaxed)), (1, 1));
        let lease = read_lease(&client, &namespace, name).await;
        assert_eq!((holder(&lease), previous_holder(&lease)), (String::new(), Some(RESOURCE_LOCK_HOLDER.into())));

        // The takeover itself, seen while held: the previous holder names the foreign holder.
        let again = "clb-lock-foreign-again";
        hold_as_foreign(&client, &namespace, again, "aks-resource-provider", 1).await;
        let lock = LeaseLock::new(
            client.clone(),
            LeaseLockConfig {
                name: again.into(),
                ..lock_config(&namespace, RESOURCE_LOCK_HOLDER, Duration::from_secs(30))
            },
        );
        let acquired = eventually("the foreign Lease taken over after it expired", async || {
            lock.acquire().await.map_err(|e| e.to_string())
        })
        .await;
        assert_eq!(acquired.foreign_previous_holder.as_deref(), Some("aks-resource-provider"));
        let lease = read_lease(&client, &namespace, again).await;
        assert_eq!(
            (holder(&lease), previous_holder(&lease)),
            (RESOURCE_LOCK_HOLDER.to_owned(), Some("aks-resource-provider".into()))
        );
        lock.release().await.expect("releases");
    });
}

#[test]
fn concurrent_attempts_on_one_resource_lock_let_exactly_one_holder_win_and_losers_see_a_conflict_or_the_winner() {
    const CONTENDERS: usize = 8;
    const ROUNDS: usize = 10;
    let server = apiserver();
    in_namespace("clb-lock-race", async |client, namespace| {
        let mut locks = Vec::new();
        for i in 0..CONTENDERS {
            let config = LeaseLockConfig {
                name: "race".into(),
                ..lock_config(&namespace, &format!("holder-{i}"), Duration::from_secs(30))
            };
            // A client each: separate connections, as separate processes would have.
            locks.push(Arc::new(LeaseLock::new(connect(server).await, config)));
        }
        let leases = Api::<Lease>::namespaced(client.clone(), &namespace);
        let mut conflicts = 0;
        // Rounds alternate: the Lease absent (the creates race) and present but free (the updates race).
        for round in 0..ROUNDS {
            if round % 2 == 0 {
                let _ = leases.delete("race", &DeleteParams::default()).await;
                eventually("the Lease deleted", async || match leases.get_opt("race").await {
                    Ok(None) => Ok(()),
                    other => Err(format!("{other:?}")),
                })
                .await;
            }
            let barrier = Arc::new(tokio::sync::Barrier::new(CONTENDERS));
            let attempts: Vec<_> = locks
                .iter()
                .cloned()
                .map(|lock| {
                    let barrier = barrier.clone();
                    tokio::spawn(async move {
                        barrier.wait().await;
                        lock.acquire().await
                    })
                })
                .collect();
            let mut winners = Vec::new();
            for (i, attempt) in attempts.into_iter().enumerate() {
                match attempt.await.unwrap() {
                    Ok(_) => winners.push(i),
                    Err(LeaseError::Conflict { .. }) => conflicts += 1,
                    Err(LeaseError::HeldByOther { .. }) => {}
                    Err(other) => panic!("round {round}: contender {i}: {other}"),
                }
            }
            assert_eq!(winners.len(), 1, "round {round}: exactly one winner, got {winners:?}");
            let lease = read_lease(&client, &namespace, "race").await;
            assert_eq!(holder(&lease), format!("holder-{}", winners[0]), "round {round}: the Lease names the winner");
            locks[winners[0]].release().await.expect("the winner releases");
        }
        assert!(conflicts > 0, "over {ROUNDS} rounds some loser must have lost on the write itself (409)");
        let refused: u64 = locks.iter().map(|l| l.stats().conflicts.load(Ordering::Relaxed)).sum();
        assert_eq!(refused, conflicts, "each conflict is counted");
    });
}

#[test]
fn a_held_resource_lock_is_renewed_past_its_duration_and_its_release_lets_another_holder_in_at_once() {
    in_namespace("clb-lock-renew", async |client, namespace| {
        let duration = Duration::from_secs(2);
        let first = LeaseLock::new(client.clone(), lock_config(&namespace, "first", duration));
        let second = LeaseLock::new(client.clone(), lock_config(&namespace, "second", duration));
        first.acquire().await.expect("a free lock is taken");
        let name = clb_kube::lease::RESOURCE_LOCK_NAME;

        // Held for longer than its duration: the renewals moved renewTime on past acquireTime + duration.
        let lease = eventually("renewals beyond the first duration", async || {
            let lease = read_lease(&client, &namespace, name).await;
            let spec = lease.spec.clone().unwrap_or_default();
            let (acquired, renewed) = (spec.acquire_time.unwrap().0, spec.renew_time.unwrap().0);
            if renewed.duration_since(acquired) > k8s_openapi::jiff::SignedDuration::try_from(duration).unwrap() {
                Ok(lease)
            } else {
                Err(format!("acquired {acquired}, renewed {renewed}"))
            }
        })
        .await;
        assert_eq!(holder(&lease), "first");
        match second.acquire().await {
            Err(LeaseError::HeldByOther { holder, .. }) => assert_eq!(holder, "first"),
            other => panic!("the renewed lock is still held: {other:?}"),
        }
        assert!(first.stats().renewed.load(Ordering::Relaxed) >= 1);

        first.release().await.expect("releases");
        let taken = second.acquire().await.expect("a released lock is free at once");
        assert_eq!(taken.foreign_previous_holder.as_deref(), Some("first"));
        let lease = read_lease(&client, &namespace, name).await;
        assert_eq!((holder(&lease), previous_holder(&lease)), ("second".into(), Some("first".into())));
        // Releasing what another holder has is a no-op, not an error (upstream Unlock).
        first.release().await.expect("a release of someone else's lock does nothing");
        assert_eq!(holder(&read_lease(&client, &namespace, name).await), "second");
        second.release().await.expect("releases");
    });
}

fn election(namespace: &str, identity: &str) -> ElectionConfig {
    ElectionConfig {
        namespace: namespace.into(),
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1_200),
        retry_period: Duration::from_millis(200),
        ..ElectionConfig::new(identity)
    }
}

/// Sends `message` when dropped: the end of a term's work, however it ended.
struct OnDrop(tokio::sync::mpsc::UnboundedSender<&'static str>, &'static str);

impl Drop for OnDrop {
    fn drop(&mut self) {
        let _ = self.0.send(self.1);
    }
}

#[test]
fn a_leader_whose_lease_is_taken_drops_its_work_at_once_stands_by_and_leads_again_once_the_taker_lets_it_expire() {
    in_namespace("clb-elect", async |client, namespace| {
        let mut elector = Elector::new(client.clone(), election(&namespace, "replica-a")).unwrap();
        let probe = elector.leadership();
        let (events, mut seen) = tokio::sync::mpsc::unbounded_channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stopped = async { drop(stopped.await) }.shared();
        let leading = lead(&mut elector, stopped.clone(), async |leadership| {
            assert!(leadership.holds(), "work starts only as the leader");
            events.send("began").unwrap();
            let _ended = OnDrop(events.clone(), "ended");
            stopped.clone().await;
            Ok::<(), std::convert::Infallible>(())
        });
        let leases = Api::<Lease>::namespaced(client.clone(), &namespace);
        let observe = async {
            assert_eq!(seen.recv().await, Some("began"));
            assert!(probe.holds());
            let mut lease = leases.get("clb-reconciler").await.unwrap();
            assert_eq!(holder(&lease), "replica-a");

            // Another writer takes the Lease (as a successor would after a partition).
            let spec = lease.spec.as_mut().unwrap();
            spec.holder_identity = Some("usurper".into());
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            leases.replace("clb-reconciler", &PostParams::default(), &lease).await.expect("the usurper writes");
            assert_eq!(seen.recv().await, Some("ended"), "the work is dropped when the renewal finds the Lease taken");
            assert!(!probe.holds(), "a replica that lost the Lease does not write");

            // The usurper never renews: the standby takes the Lease back after its duration.
            assert_eq!(seen.recv().await, Some("began"), "a second term");
            let lease = leases.get("clb-reconciler").await.unwrap();
            assert_eq!(holder(&lease), "replica-a");
            assert_eq!(lease.spec.as_ref().unwrap().lease_transitions, Some(1));
            stop.send(()).unwrap();
        };
        let (result, ()) = tokio::join!(leading, observe);
        result.expect("a shutdown ends leading cleanly");
        assert_eq!(seen.recv().await, Some("ended"));
        assert_eq!(holder(&leases.get("clb-reconciler").await.unwrap()), "", "the shutdown released the Lease");
        let stats = elector.stats();
        assert_eq!(
            (
                stats.acquired.load(Ordering::Relaxed),
                stats.lost.load(Ordering::Relaxed),
                stats.released.load(Ordering::Relaxed)
            ),
            (2, 1, 1)
        );
    });
}

/// One `clb-host run` replica on its own thread and runtime, as in the binary.
struct Replica {
    identity: String,
    token: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    /// `None` when killed.
    thread: Option<std::thread::JoinHandle<Option<Result<(), RunError>>>>,
    /// What its terms counted, as `/metrics` shows them.
    stats: clb_host::live::metrics::RunStats,
}

impl Replica {
    fn start(client: &::kube::Client, azure_url: &str, namespace: &str, identity: &str) -> Self {
        let token = format!("token-of-{identity}");
        let dir = clb_tests::process_dir().join("lease");
        std::fs::create_dir_all(&dir).unwrap();
        let token_file = dir.join(format!("{namespace}-{identity}.token"));
        std::fs::write(&token_file, &token).unwrap();
        let (config, arm) = azure_side(azure_url.into(), Credential::TokenFile(TokenFile::new(token_file)));
        let settings = clb_host::live::settings::Settings {
            leader_election: Some(ElectionConfig {
                lease_duration: Duration::from_secs(3),
                renew_deadline: Duration::from_secs(2),
                retry_period: Duration::from_millis(300),
                ..election(namespace, identity)
            }),
            ..clb_host::live::settings::Settings::new(client.clone(), arm, config, identity)
        };
        let stats = settings.stats.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (kill, killed) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let run = clb_host::live::run::run(clb_tests::builtin(), settings, async { drop(stopped.await) });
                // A kill drops `run` where it stands: no release, no cleanup, as SIGKILL.
                tokio::select! {
                    result = run => Some(result),
                    _ = killed => None,
                }
            })
        });
        Self { identity: identity.into(), token, stop: Some(stop), kill: Some(kill), thread: Some(thread), stats }
    }

    async fn end(&mut self, kill: bool) -> Option<Result<(), RunError>> {
        let signal = if kill { self.kill.take() } else { self.stop.take() };
        signal.unwrap().send(()).expect("the replica is still running");
        let thread = self.thread.take().unwrap();
        tokio::task::spawn_blocking(move || thread.join()).await.unwrap().expect("the replica did not panic")
    }
}

#[test]
fn two_run_replicas_write_only_through_the_leader_and_when_it_is_killed_the_other_takes_over_and_loses_nothing() {
    let _slot = reconcilers_slot();
    in_namespace("clb-replicas", async |client, namespace| {
        let node = format!("{namespace}-node");
        create_node(&client, &node, "10.224.0.5").await;
        let emulator = Arc::new(Emulator::new(clb_emulator::scope()));
        let azure = EmulatorServer::start(emulator.clone(), "127.0.0.1:0".parse().unwrap()).await.unwrap();
        let mut replicas = [
            Replica::start(&client, &azure.url(), &namespace, "replica-a"),
            Replica::start(&client, &azure.url(), &namespace, "replica-b"),
        ];
        let leases = Api::<Lease>::namespaced(client.clone(), &namespace);
        let leader = eventually("a leader", async || {
            let lease = leases.get_opt("clb-reconciler").await.map_err(|e| e.to_string())?;
            let holder = lease.as_ref().map(holder).unwrap_or_default();
            replicas.iter().position(|r| r.identity == holder).ok_or(format!("holder {holder:?}"))
        })
        .await;
        let standby = 1 - leader;

        let services = Api::<Service>::namespaced(client.clone(), &namespace);
        let first = create_service_with_pod(&client, &namespace, "web-1", &node, "10.244.2.10").await;
        registered_in_nrp(&emulator, &first, "10.224.0.5", "10.244.2.10").await;
        let first_ip = ingress_ip(&services, "web-1", &emulator).await;

        // Only the leader spoke to Azure and wrote Events.
        let log = emulator.state().log;
        let callers: std::collections::BTreeSet<_> = log.iter().map(|entry| entry.bearer.clone()).collect();
        assert_eq!(callers, [Some(replicas[leader].token.clone())].into(), "Azure callers");
        // The Events follow the status patch: wait for them. The set of writers only grows, so
        // a standby's Event would keep it from ever equalling the expected one.
        let events = Api::<Event>::namespaced(client.clone(), &namespace);
        let writers_are = async |expected: std::collections::BTreeSet<Option<String>>| {
            eventually("the Event writers", async || {
                let listed = events.list(&Default::default()).await.map_err(|e| e.to_string())?;
                // The API server's own controllers (the ClusterIP repair) record Events too.
                let ours = listed.items.iter().filter(|e| e.reporting_component.as_deref() == Some(COMPONENT));
                let writers: std::collections::BTreeSet<_> = ours.map(|e| e.reporting_instance.clone()).collect();
                if writers == expected { Ok(()) } else { Err(format!("{writers:?}, expected {expected:?}")) }
            })
            .await
        };
        writers_are([Some(replicas[leader].identity.clone())].into()).await;

        // Kill the leader without releasing; a Service created meanwhile must still converge.
        assert!(replicas[leader].end(true).await.is_none(), "killed, not stopped");
        let killed_at = emulator.state().log.len();
        let second = create_service_with_pod(&client, &namespace, "web-2", &node, "10.244.2.11").await;
        registered_in_nrp(&emulator, &second, "10.224.0.5", "10.244.2.11").await;
        ingress_ip(&services, "web-2", &emulator).await;
        let lease = leases.get("clb-reconciler").await.unwrap();
        assert_eq!(holder(&lease), replicas[standby].identity, "the standby took the Lease");
        let after: std::collections::BTreeSet<_> =
            emulator.state().log[killed_at..].iter().map(|entry| entry.bearer.clone()).collect();
        assert_eq!(after, [Some(replicas[standby].token.clone())].into(), "Azure callers after the kill");
        // Nothing of the first term was lost or redone differently.
        registered_in_nrp(&emulator, &first, "10.224.0.5", "10.244.2.10").await;
        assert_eq!(ingress_ip(&services, "web-1", &emulator).await, first_ip);
        // The first leader's Events, then the second's.
        writers_are(replicas.iter().map(|r| Some(r.identity.clone())).collect()).await;

        delete_service(&services, "web-1", &first, &emulator).await;
        delete_service(&services, "web-2", &second, &emulator).await;
        let stopped = replicas[standby].end(false).await.expect("stopped, not killed");
        stopped.expect("the new leader stopped cleanly");
        assert_eq!(holder(&leases.get("clb-reconciler").await.unwrap()), "", "a stopped leader releases");
        // Each replica's settings carried the counters of its terms (`/metrics` shows them).
        let leader_stats = |r: &Replica| {
            (r.stats.leader.acquired.load(Ordering::Relaxed), r.stats.leader.released.load(Ordering::Relaxed))
        };
        assert_eq!(leader_stats(&replicas[leader]), (1, 0), "killed in its one term, without a release");
        assert_eq!(leader_stats(&replicas[standby]), (1, 1), "took over once, released when stopped");
        delete_node(&client, &node).await;
    });
}

// Fixtures of these tests (the end-to-end tests of `kube.rs` have their own `Env`).

async fn create_namespace(client: &::kube::Client, namespace: &str) {
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &manifest(serde_json::json!({"metadata": {"name": namespace}})))
        .await
        .expect("creates the namespace");
}

/// A Node with one InternalIP.
async fn create_node(client: &::kube::Client, name: &str, ip: &str) {
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
async fn create_service_with_pod(
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
async fn registered_in_nrp(emulator: &Emulator, uid: &str, node_ip: &str, pod_ip: &str) {
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
async fn ingress_ip(services: &Api<Service>, name: &str, emulator: &Emulator) -> String {
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
async fn delete_service(services: &Api<Service>, name: &str, uid: &str, emulator: &Emulator) {
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

async fn delete_node(client: &::kube::Client, node: &str) {
    Api::<Node>::all(client.clone()).delete(node, &DeleteParams::default()).await.expect("deletes the Node");
}

async fn delete_namespace(client: &::kube::Client, namespace: &str) {
    Api::<Namespace>::all(client.clone())
        .delete(namespace, &DeleteParams::default())
        .await
        .expect("deletes the namespace");
}
