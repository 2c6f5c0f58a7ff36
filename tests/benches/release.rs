//! A logic release, from the tag moving in the registry to the new version serving, on the
//! cluster of `benches/difftracker.rs` (1,000 nodes, 30,000 ready pods, 1,000 Services) in steady
//! state: the CNCF registry on loopback (Debian's `docker-registry`, installed where missing),
//! `--logic-oci REF --logic-poll 1 --logic-verify-key KEY` as `clb-host run` watches it (the
//! product's [`LogicSource::watch`] and [`Control`]), the built-in logic serving and the next guest
//! released as an operator would: pushed to its own tag, signed, then the followed tag moved to it.
//!
//! Each release is timed from the moment the registry has taken the moved tag to the moment the
//! loop has switched to the new version (the swap answered); the request's arrival at the loop
//! splits it into what came before (the poll's wait, the resolution, the signature check, the
//! pull, the compile) and the staged swap. The fetch's steps are then timed one by one against the
//! same registry. Run with `cargo bench -p clb-tests --bench release`; prints a Markdown table.

use clb_host::live::control::{Control, ControlEvent};
use clb_host::live::sources::{LogicSource, OciSource};
use clb_oci::signature::{SigningKey, push_signature};
use clb_sandbox::LoadedLogic;
use clb_sandbox::supervisor::Supervisor;
use clb_tests::cluster::*;
use clb_tests::registry::Registry;
use clb_tests::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Releases measured, each on a fresh controller.
fn releases() -> usize {
    scaled(5).max(2)
}

/// `--logic-poll`'s least value: the poll's wait is at most this.
const POLL: Duration = Duration::from_secs(1);

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// A supervisor over `logic` with the whole cluster created and NRP in sync.
fn steady<'a>(
    logic: &'a LoadedLogic,
    config: &clb_sandbox::bindings::clb::reconciler::types::Config,
) -> Supervisor<'a> {
    let mut supervisor = Supervisor::new(logic);
    supervisor.start(config).unwrap();
    let first = supervisor.observe(0, &lists()).unwrap();
    settle(first, |results| supervisor.complete(1, results).unwrap());
    supervisor
}

fn main() {
    let config = unbounded(&read_config("clb.yaml"));
    let runtime = runtime();
    let builtin = runtime.load(clb_sandbox::BUILTIN_GUEST, bench_limits()).unwrap();
    let scratch = scratch("bench-release");
    let registry = Registry::start(scratch.join("registry"));
    let key = SigningKey::generate();
    let client = Arc::new(clb_oci::Client::new(clb_oci::ClientOptions::default()).unwrap());
    let repository = format!("{}/clb/logic", registry.address);
    let stable = clb_oci::Reference::parse(&format!("{repository}:stable")).unwrap();
    let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();

    // Both versions pushed to tags of their own and signed, as a release pipeline does.
    let description = clb_oci::Description::default();
    let publish = |component: &'static [u8], tag: &str| {
        let reference = stable.at_tag(tag);
        tokio.block_on(async {
            let digest = clb_oci::artifact::push(&client, &reference, component, &description).await.unwrap();
            push_signature(&client, &reference, &digest, &key).await.unwrap();
        });
        component
    };
    let move_stable_to =
        |component: &[u8]| tokio.block_on(clb_oci::artifact::push(&client, &stable, component, &description)).unwrap();
    publish(clb_sandbox::BUILTIN_GUEST, "0.1.0");
    publish(NEXT_GUEST, "0.2.0");

    let (mut total, mut before_loop, mut staged) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..releases() {
        move_stable_to(clb_sandbox::BUILTIN_GUEST);
        let mut serving = steady(&builtin, &config);
        let metrics = clb_host::live::metrics::Metrics::new();
        // What the run loop publishes: the sender answers the version serving `unchanged`.
        metrics.publish(serving.snapshot());
        let (mut control, sender) = Control::new(runtime, bench_limits(), metrics);
        let sender = sender.verifying(Some(key.public()));
        let source = LogicSource::Oci(OciSource { reference: stable.clone(), client: client.clone(), poll: POLL });
        let (moved, request, answered) = tokio.block_on(async {
            let watching = tokio::spawn(source.watch(None, None, sender, POLL));
            // The first poll finds the version serving, answered `unchanged` before the loop.
            tokio::time::sleep(POLL + POLL / 2).await;
            let moved = tokio::task::block_in_place(|| {
                move_stable_to(NEXT_GUEST);
                Instant::now()
            });
            // The loop's part, as `run` does it.
            let next_sha = clb_sandbox::sha256_hex(NEXT_GUEST);
            let mut arrived = moved;
            while serving.logic().info().sha256 != next_sha {
                match control.next().await {
                    ControlEvent::Request(request) => {
                        arrived = Instant::now();
                        assert!(control.begin(&mut serving, request, 50).is_none(), "staged, not switched");
                    }
                    ControlEvent::Imported(imported) => {
                        control.finish(&mut serving, imported, 50);
                    }
                    _ => {}
                }
            }
            let answered = Instant::now();
            watching.abort();
            (moved, arrived, answered)
        });
        assert_eq!(serving.logic().info().sha256, clb_sandbox::sha256_hex(NEXT_GUEST), "the next guest serves");
        total.push(answered - moved);
        before_loop.push(request - moved);
        staged.push(answered - request);
    }

    // The fetch's steps one by one, against the same registry (the tag at the next guest).
    let (mut resolve, mut verify, mut pull, mut compile) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let cap = clb_sandbox::compression::MAX_COMPONENT_BYTES as u64;
    for _ in 0..releases() {
        tokio.block_on(async {
            let start = Instant::now();
            let digest = client.resolve(&stable).await.unwrap();
            resolve.push(start.elapsed());
            let start = Instant::now();
            clb_oci::signature::verify(&client, &stable, &digest, &key.public()).await.unwrap();
            verify.push(start.elapsed());
            let start = Instant::now();
            let pulled = clb_oci::artifact::pull(&client, &stable.at_digest(&digest), cap).await.unwrap();
            pull.push(start.elapsed());
            let start = Instant::now();
            runtime.load(&pulled.component, bench_limits()).unwrap();
            compile.push(start.elapsed());
        });
    }

    let (nodes, services) = (node_count(), service_count());
    let pods = services * PODS_PER_SERVICE;
    println!("## A logic release through a registry ({nodes} nodes, {pods} ready pods, {services} Services)\n");
    println!("`--logic-poll 1`, `--logic-verify-key`; medians of {} releases.\n", releases());
    println!("| | median |");
    println!("|---|---:|");
    println!("| **the tag moved → the new version serving** | **{}** |", ms(median(total)));
    println!(
        "| of which before the loop: the poll's wait (0 to 1 s), resolve, signature check, pull, compile | {} |",
        ms(median(before_loop))
    );
    println!("| of which the staged swap: stage, import of the state, switch | {} |", ms(median(staged)));
    println!("| resolve the tag (`HEAD` of the manifest) | {} |", ms(median(resolve)));
    println!("| check the signature (the `.sig` manifest, its payload) | {} |", ms(median(verify)));
    println!("| pull at the digest (manifest, layer: {} bytes) | {} |", NEXT_GUEST.len(), ms(median(pull)));
    println!("| compile and check the component | {} |", ms(median(compile)));
    drop(registry);
}
