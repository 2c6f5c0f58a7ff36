//! Grouping in the backend-pool updater: 100,000 queued operations over 500 pools,
//! natively and through the component. One in ten Services has moved to another load balancer
//! since its operations were queued, so their operations are dropped; every pool gets adds and
//! removes that partly cancel out. Run with `cargo bench -p clb-tests --bench backend_pools`.

use clb_guest::backend_pools as native;
use clb_sandbox::bindings::exports::clb::reconciler::backend_pools as wit;
use clb_tests::*;
use std::hint::black_box;
use std::time::{Duration, Instant};

const OPERATIONS: usize = 100_000;
const POOLS: usize = 500;
const NODES: usize = 1_000;

fn node_ip(node: usize) -> String {
    format!("10.{}.{}.4", node / 250, node % 250)
}

/// Operation `k`: Service `k % POOLS` (one pool per Service), alternately adding and removing
/// one or two node IPs.
fn operations() -> Vec<native::PoolOperation> {
    (0..scaled(OPERATIONS))
        .map(|k| {
            let service = k % POOLS;
            let ips = (0..1 + k % 2).map(|i| node_ip((k * 7 + i * 13) % NODES)).collect();
            native::PoolOperation {
                service: format!("shop/svc-{service}"),
                load_balancer: format!("lb-{}", service % 4),
                pool: format!("svc-{service}-pool"),
                kind: if (k / POOLS) % 3 == 2 { native::OperationKind::Remove } else { native::OperationKind::Add },
                node_ips: ips,
            }
        })
        .collect()
}

fn assignment() -> Vec<native::ServiceAssignment> {
    (0..POOLS)
        .map(|service| native::ServiceAssignment {
            service: format!("shop/svc-{service}"),
            // One Service in ten now lives on another load balancer.
            load_balancer: format!("lb-{}", if service % 10 == 0 { (service + 1) % 4 } else { service % 4 }),
        })
        .collect()
}

fn to_wit(op: &native::PoolOperation) -> wit::PoolOperation {
    wit::PoolOperation {
        service: op.service.clone(),
        load_balancer: op.load_balancer.clone(),
        pool: op.pool.clone(),
        kind: match op.kind {
            native::OperationKind::Add => wit::OperationKind::Add,
            native::OperationKind::Remove => wit::OperationKind::Remove,
            native::OperationKind::DeletePool => wit::OperationKind::DeletePool,
            native::OperationKind::EnsurePool => wit::OperationKind::EnsurePool,
        },
        node_ips: op.node_ips.clone(),
    }
}

fn main() {
    let operations = operations();
    let assignment = assignment();
    let wit_operations: Vec<wit::PoolOperation> = operations.iter().map(to_wit).collect();
    let wit_assignment: Vec<wit::ServiceAssignment> = assignment
        .iter()
        .map(|a| wit::ServiceAssignment { service: a.service.clone(), load_balancer: a.load_balancer.clone() })
        .collect();

    let (mut native_enqueue, mut native_group, mut groups) = (Vec::new(), Vec::new(), 0);
    for _ in 0..5 {
        let mut queue = native::PoolQueue::new(3);
        let batch = operations.clone();
        let start = Instant::now();
        queue.enqueue(batch);
        native_enqueue.push(start.elapsed());
        let start = Instant::now();
        let result = queue.drain_and_group(0, &assignment);
        native_group.push(start.elapsed());
        groups = result.len();
        black_box(result);
    }

    let logic = runtime().load(clb_sandbox::BUILTIN_GUEST, bench_limits()).unwrap();
    let (mut component_enqueue, mut component_group, mut component_groups) = (Vec::new(), Vec::new(), 0);
    for _ in 0..5 {
        let mut session = logic.session().unwrap();
        let queue = session.pool_queue_create(3).unwrap();
        let start = Instant::now();
        session.pool_queue_enqueue(queue, &wit_operations).unwrap();
        component_enqueue.push(start.elapsed());
        let start = Instant::now();
        let result = session.pool_queue_drain_and_group(queue, 0, &wit_assignment).unwrap();
        component_group.push(start.elapsed());
        component_groups = result.len();
        black_box(result);
    }
    assert_eq!(groups, component_groups, "both give the same number of groups");

    let (ne, ng, ce, cg) =
        (median(native_enqueue), median(native_group), median(component_enqueue), median(component_group));
    let ratio = |c: Duration, n: Duration| c.as_secs_f64() / n.as_secs_f64();
    println!(
        "{} operations over {POOLS} pools; {groups} groups written (one Service in ten moved away).",
        scaled(OPERATIONS)
    );
    println!();
    println!("| measure (median of 5) | native | component | component / native |");
    println!("|---|---|---|---|");
    println!("| enqueue 100,000 operations | {ne:.2?} | {ce:.2?} | {:.2}× |", ratio(ce, ne));
    println!("| drain and group them | {ng:.2?} | {cg:.2?} | {:.2}× |", ratio(cg, ng));
    println!("| total | {:.2?} | {:.2?} | {:.2}× |", ne + ng, ce + cg, ratio(ce + cg, ne + ng));
}
