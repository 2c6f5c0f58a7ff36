//! Provisioning at the pace ARM allows: 1,000 Services (each with one ready pod) created at once
//! in `simulate`, against the emulator's ARM buckets (ARM's published sizes: 200 writes refilled
//! at 10 a second), paced by ARM's remaining-writes figures (the default) and by the fixed write
//! budgets alone (an ARM whose answers carry no figure). Virtual time, so the figures are exact
//! and the same on every run: how long until every Service is provisioned, the writes, and the
//! 429s. Run with `cargo bench -p clb-tests --bench arm_pace`.

use clb_simulator::native::NativeReconciler;
use clb_simulator::{scenario, simulate};
use clb_tests::scaled;
use std::fmt::Write as _;

/// `count` Services created at once, each with one ready pod on one of 10 nodes; `figures`:
/// whether ARM's answers carry the remaining-writes figure; `other`: the writes a second another
/// client of the subscription spends.
fn scenario_text(count: usize, figures: bool, other: u32) -> String {
    let mut text = String::from(
        "name: Services created at once are provisioned at the pace ARM allows\n\
         config: {loadBalancerBackendPoolConfigurationType: podIP, loadBalancerSku: standardV2}\n",
    );
    let _ = writeln!(text, "azure: {{armLimits: {{reportRemaining: {figures}, otherClientWritesPerSecond: {other}}}}}");
    text.push_str("steps:\n  - apply:\n");
    for node in 0..10 {
        let _ = writeln!(
            text,
            "      - {{apiVersion: v1, kind: Node, metadata: {{name: n{node}}}, \
             status: {{addresses: [{{type: InternalIP, address: 10.224.0.{}}}]}}}}",
            node + 4
        );
    }
    for i in 0..count {
        let uid = format!("00000000-0000-4000-8000-{i:012}");
        let _ = writeln!(
            text,
            "      - {{apiVersion: v1, kind: Service, metadata: {{name: s{i}, namespace: shop, uid: {uid}}}, \
             spec: {{type: LoadBalancer, externalTrafficPolicy: Local, ports: [{{port: 80, targetPort: 8080}}]}}}}"
        );
        let _ = writeln!(
            text,
            "      - {{apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {{name: s{i}-a, namespace: shop, \
             uid: 10000000-0000-4000-8000-{i:012}, ownerReferences: [{{apiVersion: v1, kind: Service, name: s{i}, \
             uid: {uid}}}]}}, addressType: IPv4, endpoints: [{{addresses: [10.244.{}.{}], nodeName: n{}, \
             conditions: {{ready: true}}}}], ports: [{{port: 8080, protocol: TCP}}]}}",
            i / 250,
            i % 250,
            i % 10
        );
    }
    text.push_str("  - settle: 1h\n  - expect: {invariants: true}\n");
    text
}

struct Run {
    settled_after_ms: u64,
    writes: u64,
    throttled: u64,
    settled: bool,
}

fn run(count: usize, figures: bool, other: u32) -> Run {
    let text = scenario_text(count, figures, other);
    let scenario = scenario::parse(std::path::Path::new("arm-pace.yaml"), &text).unwrap_or_else(|e| panic!("{e}"));
    let report = simulate::run(&scenario, &mut NativeReconciler::default()).unwrap_or_else(|e| panic!("{e}"));
    let settle = &report.steps[1];
    let expect = &report.steps[2];
    let commands = report.steps.iter().flat_map(|s| &s.commands);
    let throttled = commands.filter(|c| c.outcome.starts_with("failed 429")).count() as u64;
    let writes = ["put-public-ip", "put-load-balancer", "update-services", "update-address-locations"]
        .iter()
        .map(|op| report.azure_calls.get(*op).copied().unwrap_or(0))
        .sum();
    assert!(expect.checks.iter().all(|c| c.ok), "{:?}", expect.checks);
    Run {
        settled_after_ms: expect.at_ms - settle.at_ms,
        writes,
        throttled,
        settled: settle.checks.iter().all(|c| c.ok),
    }
}

fn main() {
    let count = scaled(1_000);
    println!("{count} Services created at once, against ARM's bucket of 200 writes refilled at 10 a second");
    println!("| another client's writes | paced by | provisioned after (virtual) | ARM-routed writes | 429s |");
    println!("|---:|---|---:|---:|---:|");
    for other in [0, 5] {
        for (name, figures) in [("ARM's remaining-writes figures (default)", true), ("the fixed budgets alone", false)]
        {
            let run = run(count, figures, other);
            assert!(run.settled, "{name}: not provisioned within the hour");
            if figures {
                assert_eq!(run.throttled, 0, "paced by ARM's figures, nothing is throttled");
            }
            println!(
                "| {other}/s | {name} | {:.1} s | {} | {} |",
                run.settled_after_ms as f64 / 1000.0,
                run.writes,
                run.throttled
            );
        }
    }
}
