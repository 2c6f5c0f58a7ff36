//! The walking skeleton's costs: component size, cold start, and one validation call through
//! the component against the same call natively. Run with
//! `cargo bench -p clb-tests --bench skeleton`; prints a Markdown table for BENCHMARKS.md.
//!
//! Each figure is the median of several timed batches, and the comparisons are ratios taken in
//! the same run, since the machine is shared and noisy.

use clb_sandbox::{Limits, Runtime};
use clb_tests::median_per_iteration;
use std::hint::black_box;
use std::time::Duration;

fn main() {
    let bytes = clb_sandbox::BUILTIN_GUEST;
    let config = clb_tests::read_config("clb.yaml");
    // It breaks the last rule, so every check runs.
    let service = clb_tests::read_service("backend-port-collision.yaml");

    // Cold start: a new engine, compiling the component, and the first instance.
    let cold = median_per_iteration(1, || {
        let runtime = Runtime::new().unwrap();
        let logic = runtime.load(bytes, Limits::default()).unwrap();
        black_box(logic.session().unwrap());
    });
    let runtime = Runtime::new().unwrap();
    let compile = median_per_iteration(1, || {
        black_box(runtime.load(bytes, Limits::default()).unwrap());
    });
    let logic = runtime.load(bytes, Limits::default()).unwrap();
    let instantiate = median_per_iteration(200, || {
        black_box(logic.session().unwrap());
    });

    let (native_config, native_service) = (clb_tests::config_to_model(&config), clb_tests::service_to_model(&service));
    let mut session = logic.session().unwrap();
    let native = median_per_iteration(20_000, || {
        black_box(clb_guest::admit_service(black_box(&native_config), black_box(&native_service)));
    });
    let component = median_per_iteration(5_000, || {
        black_box(session.admit_service(&config, &service).unwrap());
    });
    let fresh = median_per_iteration(500, || {
        let mut s = logic.session().unwrap();
        black_box(s.admit_service(&config, &service).unwrap());
    });
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!("| measure | value |");
    println!("|---|---|");
    println!("| guest component size | {} bytes |", bytes.len());
    println!("| cold start (engine + compile + first instance) | {cold:.1?} |");
    println!("| compile the component (engine already up) | {compile:.1?} |");
    println!("| instantiate from `InstancePre` | {instantiate:.1?} |");
    println!("| `admit-service`, native | {native:.2?} |");
    println!("| `admit-service`, through the component (warm instance) | {component:.2?} |");
    println!("| `admit-service`, fresh instance per call | {fresh:.2?} |");
    println!("| ratio component / native | {:.1}× |", ratio(component, native));
    println!("| ratio fresh instance / native | {:.1}× |", ratio(fresh, native));
}
