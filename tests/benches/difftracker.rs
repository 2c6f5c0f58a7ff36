//! The DiffTracker at scale: a cluster of 1,000 nodes, 30,000 ready pods and 1,000
//! LoadBalancer Services, natively and through the component:
//! (a) start-up rebuild: the lists, then a read of NRP and a list of ARM that already hold
//!     everything (a restart), and how many writes and Events that restart costs;
//! (b) one endpoint change: the observation and the sync it causes;
//! (c) state export + import;
//! (d) a burst of 3,000 endpoint changes in 5 s with NRP answering at once: the
//!     `update-address-locations` calls the default write budget lets through, against an
//!     unbounded budget, and how long after the last change NRP holds them all;
//! (e) start-up of the same cluster with 100 egress identities and 3,000 egress pods,
//!     and what that restart writes.
//! Run with `cargo bench -p clb-tests --bench difftracker`; prints a Markdown table.
//! `CLB_BENCH_SCALE=5` multiplies the cluster (nodes and Services × 5, 30 pods per Service).

use clb_guest::model;
use clb_guest::tracker::Tracker;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::{Metering, Runtime, Session};
use clb_tests::cluster::*;
use clb_tests::*;
use std::hint::black_box;
use std::time::{Duration, Instant};
use wasmtime::component::ResourceAny;

/// The tracker, natively or through the component, behind one face.
trait Driver {
    fn observe(&mut self, now: u64, batch: &[wit::Observation]) -> wit::Step;
    fn complete(&mut self, now: u64, results: &[(u64, wit::Outcome)]) -> wit::Step;
    fn tick(&mut self, now: u64) -> wit::Step;
}

struct Native(Tracker);

impl Driver for Native {
    fn observe(&mut self, now: u64, batch: &[wit::Observation]) -> wit::Step {
        step_to_wit(self.0.observe(now, batch.iter().map(observation_to_model).collect()))
    }
    fn complete(&mut self, now: u64, results: &[(u64, wit::Outcome)]) -> wit::Step {
        step_to_wit(self.0.complete(now, results.iter().map(|(id, o)| (*id, outcome_to_model(o))).collect()))
    }
    fn tick(&mut self, now: u64) -> wit::Step {
        step_to_wit(self.0.tick(now))
    }
}

struct Component {
    session: Session,
    tracker: ResourceAny,
}

impl Driver for Component {
    fn observe(&mut self, now: u64, batch: &[wit::Observation]) -> wit::Step {
        self.session.tracker_observe(self.tracker, now, batch).unwrap()
    }
    fn complete(&mut self, now: u64, results: &[(u64, wit::Outcome)]) -> wit::Step {
        self.session.tracker_complete(self.tracker, now, results, None).unwrap()
    }
    fn tick(&mut self, now: u64) -> wit::Step {
        self.session.tracker_tick(self.tracker, now).unwrap()
    }
}

/// Answers every command at once (with `answer`), and ticks at each wake-up, until the tracker
/// is idle: time runs as the write budgets need. Returns each command with when it was sent,
/// and the time it ended at.
fn run_until_idle(
    driver: &mut dyn Driver,
    mut now: u64,
    mut step: wit::Step,
    answer: impl Fn(&wit::Command) -> wit::Outcome,
) -> (Vec<(u64, wit::Command)>, u64) {
    let mut sent = Vec::new();
    loop {
        let (answered, last) = answer_at(driver, now, step, &answer);
        sent.extend(answered);
        match last.wake_at_ms {
            Some(at) if !last.idle => {
                now = at.max(now);
                step = driver.tick(now);
            }
            _ => return (sent, now),
        }
    }
}

/// `lists` observed at time 0 as the hosts hand them over ([`clb_sandbox::logic::calls`]):
/// one step with every call's commands, and the last call's wake-up.
fn observe_lists(driver: &mut dyn Driver, lists: &[wit::Observation]) -> wit::Step {
    let mut step = wit::Step { commands: Vec::new(), wake_at_ms: None, idle: false };
    for call in clb_sandbox::logic::calls(lists) {
        let next = driver.observe(0, call);
        step.commands.extend(next.commands);
        (step.wake_at_ms, step.idle) = (next.wake_at_ms, next.idle);
    }
    step
}

/// [`run_until_idle`] from time 1 with the benchmark's answers; the commands only.
fn drive(driver: &mut dyn Driver, step: wit::Step) -> Vec<wit::Command> {
    run_until_idle(driver, 1, step, answer).0.into_iter().map(|(_, c)| c).collect()
}

/// What (d) measures of one burst.
struct Burst {
    calls: usize,
    busiest_second: usize,
    converged_after_last_change_ms: u64,
}

/// (d): `changes` slice updates spread evenly over `over_ms`, from a tracker in the steady
/// state; every command answered at once, the tracker ticked at each wake-up in between.
fn burst(driver: &mut dyn Driver, start: u64, changes: usize, over_ms: u64) -> Burst {
    let mut calls_at = Vec::new();
    let mut count = |sent: &[(u64, wit::Command)]| {
        calls_at.extend(
            sent.iter().filter(|(_, c)| matches!(c, wit::Command::UpdateAddressLocations(_))).map(|(at, _)| *at),
        );
    };
    let (mut now, mut wake) = (start, None::<u64>);
    let last_change = start + (changes as u64 - 1) * over_ms / changes as u64;
    for i in 0..changes {
        let at = start + i as u64 * over_ms / changes as u64;
        // The host ticks at every wake-up that comes before the next change.
        while let Some(due) = wake.filter(|&due| due <= at) {
            now = due.max(now);
            let step = driver.tick(now);
            let (sent, last) = answer_at(driver, now, step, answer);
            count(&sent);
            wake = last.wake_at_ms;
            if wake == Some(due) {
                break;
            }
        }
        now = at.max(now);
        // Service i % n, its pod (i / n) % 30 not ready: each update changes a pod or two.
        let (service, pod) = (i % service_count(), (i / service_count()) % PODS_PER_SERVICE);
        let step = driver.observe(now, &[wit::Observation::SliceUpserted(slice(service, Some(pod)))]);
        let (sent, last) = answer_at(driver, now, step, answer);
        count(&sent);
        wake = last.wake_at_ms;
    }
    let step = driver.tick(now);
    let (sent, _) = run_until_idle(driver, now, step, answer);
    count(&sent);
    let busiest_second = calls_at
        .iter()
        .map(|&from| calls_at.iter().filter(|&&at| at >= from && at < from + 1_000).count())
        .max()
        .unwrap_or(0);
    let converged = calls_at.last().copied().unwrap_or(start);
    Burst {
        calls: calls_at.len(),
        busiest_second,
        converged_after_last_change_ms: converged.saturating_sub(last_change),
    }
}

/// Answers `step`'s commands and those that follow at `now`, with `answer`; returns each with
/// when it was sent, and the last step (which sent nothing).
fn answer_at(
    driver: &mut dyn Driver,
    now: u64,
    mut step: wit::Step,
    answer: impl Fn(&wit::Command) -> wit::Outcome,
) -> (Vec<(u64, wit::Command)>, wit::Step) {
    let mut sent = Vec::new();
    while !step.commands.is_empty() {
        sent.extend(step.commands.iter().map(|c| (now, c.command.clone())));
        let results: Vec<(u64, wit::Outcome)> = step.commands.iter().map(|c| (c.id, answer(&c.command))).collect();
        step = driver.complete(now, &results);
    }
    (sent, step)
}

/// Azure and Kubernetes writes among `commands`, and Events.
fn writes_and_events(commands: &[wit::Command]) -> (usize, usize) {
    let events = commands.iter().filter(|c| matches!(c, wit::Command::EmitEvent(_))).count();
    let reads = commands.iter().filter(|c| matches!(c, wit::Command::ReadNrp | wit::Command::ReadArm)).count();
    (commands.len() - events - reads, events)
}

/// The median of three runs ([`scaled`]).
fn median_of_3(run: &mut dyn FnMut() -> Duration) -> Duration {
    median_of(3, run)
}

/// The median of `runs` runs ([`scaled`]), each timing itself.
fn median_of(runs: usize, run: &mut dyn FnMut() -> Duration) -> Duration {
    let mut samples: Vec<Duration> = (0..scaled(runs)).map(|_| run()).collect();
    samples.sort();
    samples[samples.len() / 2]
}

/// (a): the lists (in the calls the hosts make, [`clb_sandbox::logic::calls`]), then NRP's
/// answer, then ARM's, natively (median of 3). Both sides start from
/// the host's records: the component's call copies them into the guest (lowering), the native
/// side builds the library's records from them, as a native host would. Without that copy the
/// native side would skip work the component cannot.
fn startup_native(
    config: &wit::Config,
    lists: &[wit::Observation],
    snapshot: &wit::Outcome,
    inventory: &wit::Outcome,
) -> Duration {
    median_of_3(&mut || {
        let mut tracker = Tracker::create(config_to_model(config)).unwrap();
        let start = Instant::now();
        let mut read = None;
        for call in clb_sandbox::logic::calls(lists) {
            let step = tracker.observe(0, call.iter().map(observation_to_model).collect());
            read = read.or(step.commands.iter().find(|c| c.command == model::Command::ReadNrp).map(|c| c.id));
        }
        let read = read.unwrap();
        let step = tracker.complete(0, vec![(read, outcome_to_model(snapshot))]);
        let list = step.commands.iter().find(|c| c.command == model::Command::ReadArm).unwrap().id;
        black_box(tracker.complete(0, vec![(list, outcome_to_model(inventory))]));
        start.elapsed()
    })
}

/// [`startup_native`] through the component: [`startup_batched`]'s total.
fn startup_component(
    logic: &clb_sandbox::LoadedLogic,
    config: &wit::Config,
    lists: &[wit::Observation],
    snapshot: &wit::Outcome,
    inventory: &wit::Outcome,
) -> Duration {
    startup_batched(logic, config, lists, snapshot, inventory)[0]
}

/// The start-up through the component, the lists handed over as `clb-host run` hands them, in
/// calls of at most `MAX_OBJECTS_PER_CALL` objects ([`clb_sandbox::logic::calls`]): the total,
/// and each kind of call's longest (the lists' calls, NRP's answer, ARM's), of the run whose
/// total is the median of 3.
fn startup_batched(
    logic: &clb_sandbox::LoadedLogic,
    config: &wit::Config,
    lists: &[wit::Observation],
    snapshot: &wit::Outcome,
    inventory: &wit::Outcome,
) -> [Duration; 4] {
    let mut runs: Vec<[Duration; 4]> = (0..3)
        .map(|_| {
            let mut session = logic.session().unwrap();
            let tracker = session.tracker_create(config).unwrap().unwrap();
            let start = Instant::now();
            let (mut longest_list, mut read) = (Duration::ZERO, None);
            for chunk in clb_sandbox::logic::calls(lists) {
                let call = Instant::now();
                let step = session.tracker_observe(tracker, 0, chunk).unwrap();
                longest_list = longest_list.max(call.elapsed());
                read = read.or(step.commands.iter().find(|c| c.command == wit::Command::ReadNrp).map(|c| c.id));
            }
            let call = Instant::now();
            let step = session.tracker_complete(tracker, 0, &[(read.unwrap(), snapshot.clone())], None).unwrap();
            let nrp = call.elapsed();
            let list = step.commands.iter().find(|c| c.command == wit::Command::ReadArm).unwrap().id;
            let call = Instant::now();
            black_box(session.tracker_complete(tracker, 0, &[(list, inventory.clone())], None).unwrap());
            [start.elapsed(), longest_list, nrp, call.elapsed()]
        })
        .collect();
    runs.sort();
    runs[1]
}

fn main() {
    let config = read_config("clb.yaml");
    let lists = lists();
    let native_lists: Vec<model::Observation> = lists.iter().map(observation_to_model).collect();
    let snapshot = nrp_in_sync();
    let native_snapshot = outcome_to_model(&snapshot);
    let inventory = arm_in_sync();
    let native_inventory = outcome_to_model(&inventory);
    let limits = bench_limits();
    let logic = runtime().load(clb_sandbox::BUILTIN_GUEST, limits).unwrap();

    // (a) Start-up rebuild: the lists, then NRP's answer (3 runs each, median).
    let native_startup = startup_native(&config, &lists, &snapshot, &inventory);
    let native_without_copy = median_of_3(&mut || {
        let mut tracker = Tracker::create(config_to_model(&config)).unwrap();
        let (lists, snapshot, inventory) = (native_lists.clone(), native_snapshot.clone(), native_inventory.clone());
        let start = Instant::now();
        let step = tracker.observe(0, lists);
        let read = step.commands.iter().find(|c| c.command == model::Command::ReadNrp).unwrap().id;
        let step = tracker.complete(0, vec![(read, snapshot)]);
        let list = step.commands.iter().find(|c| c.command == model::Command::ReadArm).unwrap().id;
        black_box(tracker.complete(0, vec![(list, inventory)]));
        start.elapsed()
    });
    let startup_through =
        |logic: &clb_sandbox::LoadedLogic| startup_component(logic, &config, &lists, &snapshot, &inventory);
    // The lists in calls of bounded size, as `clb-host run` hands them over; each call's longest.
    let batched = startup_batched(&logic, &config, &lists, &snapshot, &inventory);
    let component_startup = batched[0];

    // Both trackers brought to the steady state: every Service Created, NRP in sync.
    let mut native = Native(Tracker::create(config_to_model(&config)).unwrap());
    let first = observe_lists(&mut native, &lists);
    let native_commands = drive(&mut native, first);
    let mut session = logic.session().unwrap();
    let tracker = session.tracker_create(&config).unwrap().unwrap();
    let mut component = Component { session, tracker };
    let first = observe_lists(&mut component, &lists);
    let component_commands = drive(&mut component, first);
    assert_eq!(native_commands, component_commands, "both trackers sent the same commands");
    let (restart_writes, restart_events) = writes_and_events(&component_commands);
    // What `clb_guest_memory_bytes` shows once the cluster is in: for `--memory-mib`.
    let guest_memory = component.session.memory_bytes();
    // The same restart as before the inventory existed: a host that cannot list ARM (answered
    // with something else, which the logic takes as "no inventory").
    let mut blind = Native(Tracker::create(config_to_model(&config)).unwrap());
    let first = observe_lists(&mut blind, &lists);
    let no_inventory = |c: &wit::Command| if *c == wit::Command::ReadArm { wit::Outcome::Ok } else { answer(c) };
    let (blind_sent, _) = run_until_idle(&mut blind, 1, first, no_inventory);
    let blind_commands: Vec<wit::Command> = blind_sent.into_iter().map(|(_, c)| c).collect();
    let (blind_writes, blind_events) = writes_and_events(&blind_commands);

    // (b) One endpoint change: a pod goes not-ready and back; each observation causes one
    // address-location update, answered with success.
    let changes: Vec<wit::Observation> = (0..2).map(endpoint_change).collect();
    let measure_change = |driver: &mut dyn Driver| {
        let (mut observe, mut sync) = (Vec::new(), Vec::new());
        // One refill interval of the default address-location budget apart, so that each change
        // finds a token; all within the first resync period.
        let interval = 60_000 / u64::from(clb_guest::budget::WriteBudgets::DEFAULT.update_address_locations.per_minute);
        for round in 0..scaled(400) as u64 {
            let now = CHANGES_FROM + round * interval;
            let change = std::slice::from_ref(&changes[round as usize % 2]);
            let start = Instant::now();
            let step = driver.observe(now, change);
            observe.push(start.elapsed());
            assert_eq!(step.commands.len(), 1, "one update per change: {:?}", step.commands);
            let results = [(step.commands[0].id, wit::Outcome::Ok)];
            let start = Instant::now();
            let after = driver.complete(now, &results);
            sync.push(start.elapsed());
            assert!(after.commands.is_empty());
        }
        observe.sort();
        sync.sort();
        (observe[observe.len() / 2], sync[sync.len() / 2])
    };
    const CHANGES_FROM: u64 = 1_000;
    let (native_observe, native_sync) = measure_change(&mut native);
    let (component_observe, component_sync) = measure_change(&mut component);

    // (c) State export + import of the whole cluster.
    let native_export_import = median_per_iteration(3, || {
        let (version, payload) = native.0.export_state();
        black_box(Tracker::import_state(config_to_model(&config), version, &payload).unwrap());
    });
    let state_size = component.session.tracker_export(component.tracker).unwrap().payload.len();
    // And once it has exported its state, as every checkpoint and swap has it do.
    let guest_memory_exported = component.session.memory_bytes();
    // Each import into an instance of its own, made before the clock starts and dropped after:
    // imports kept alive in one instance would fill its memory at 5× and beyond.
    let component_export_import = median_of(15, &mut || {
        let mut fresh = logic.session().unwrap();
        let start = Instant::now();
        let state = component.session.tracker_export(component.tracker).unwrap();
        black_box(fresh.tracker_import(&config, &state).unwrap().unwrap());
        start.elapsed()
    });

    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!("{}", describe(state_size));
    let mib = |bytes: usize| bytes as f64 / 1_048_576.0;
    println!(
        "Guest linear memory after the start-up: {:.1} MiB; after a checkpoint (an export of the state): {:.1} MiB.",
        mib(guest_memory),
        mib(guest_memory_exported)
    );
    println!();
    println!("| measure | native | component | component / native |");
    println!("|---|---|---|---|");
    let row = |name: &str, n: Duration, c: Duration| println!("| {name} | {n:.2?} | {c:.2?} | {:.2}× |", ratio(c, n));
    row("(a) start-up rebuild (lists + NRP read + ARM list)", native_startup, component_startup);
    row("(a) same, native given its records for free", native_without_copy, component_startup);
    row("(b) one endpoint change: observation", native_observe, component_observe);
    row("(b) one endpoint change: its sync completing", native_sync, component_sync);
    row("(b) one endpoint change: total", native_observe + native_sync, component_observe + component_sync);
    row("(c) state export + import", native_export_import, component_export_import);
    println!(
        "| (a) start-up, the lists in calls of at most {} objects: total / the longest list call / NRP's answer / ARM's | | {:.2?} / {:.2?} / {:.2?} / {:.2?} | |",
        clb_sandbox::logic::MAX_OBJECTS_PER_CALL,
        batched[0],
        batched[1],
        batched[2],
        batched[3]
    );
    // One line for harness/upstream-go/side-by-side.py, which runs this bench beside upstream's.
    let (ms, us) = (|d: Duration| d.as_secs_f64() * 1e3, |d: Duration| d.as_secs_f64() * 1e6);
    println!(
        "RUST_RESULT nodes={} services={} startup_native_ms={:.3} startup_component_ms={:.3} change_native_us={:.3} change_component_us={:.3}",
        node_count(),
        service_count(),
        ms(native_startup),
        ms(component_startup),
        us(native_observe + native_sync),
        us(component_observe + component_sync)
    );
    println!();
    println!(
        "Restart with nothing changed (the start-up above, answered until idle): {} commands, of which {restart_writes} \
         writes (Azure or Kubernetes) and {restart_events} Events.",
        component_commands.len()
    );
    println!(
        "The same restart without the inventory (as before it existed): {} commands, of which {blind_writes} \
         writes and {blind_events} Events.",
        blind_commands.len()
    );

    // (d) A burst of 3,000 endpoint changes in 5 s, natively (the decisions are the same through
    // the component: the golden traces check that), under the default budget and an unbounded one.
    let unbounded = unbounded(&config);
    let burst_from = 100_000;
    let changes = scaled(3_000);
    let budgeted = burst(&mut native, burst_from, changes, 5_000);
    let mut free = Native(Tracker::create(config_to_model(&unbounded)).unwrap());
    let first = observe_lists(&mut free, &lists);
    drive(&mut free, first);
    let free = burst(&mut free, burst_from, changes, 5_000);
    let default_budget = clb_guest::budget::WriteBudgets::DEFAULT.update_address_locations;
    let allowed = default_budget.burst as usize + (default_budget.per_minute as usize * 5).div_ceil(60) + 1;
    assert!(budgeted.calls <= allowed, "the default budget let {} calls through, at most {allowed}", budgeted.calls);
    assert!(free.calls > budgeted.calls, "an unbounded budget lets more through: {} vs {}", free.calls, budgeted.calls);
    println!();
    println!(
        "Burst of {changes} endpoint changes in 5 s, NRP answering at once: {} update-address-locations calls under the \
         default budget ({}/min, burst {}; at most {allowed} in the 5 s), at most {} in any second, converged {} ms \
         after the last change; {} calls ({:.1}× as many) with an unbounded budget, at most {} in any second, \
         converged {} ms after the last change.",
        budgeted.calls,
        default_budget.per_minute,
        default_budget.burst,
        budgeted.busiest_second,
        budgeted.converged_after_last_change_ms,
        free.calls,
        free.calls as f64 / budgeted.calls.max(1) as f64,
        free.busiest_second,
        free.converged_after_last_change_ms,
    );

    // (e) Start-up with egress: the same cluster with 100 egress identities carried by
    // 3,000 pods that hold the pod finalizer, NRP and ARM holding their Outbound services, NAT
    // gateways and public IPs: a restart that adopts all of it.
    let (egress_lists, egress_snapshot, egress_inventory) =
        (lists_with_egress(), nrp_in_sync_with_egress(), arm_in_sync_with_egress());
    let native_egress = startup_native(&config, &egress_lists, &egress_snapshot, &egress_inventory);
    let component_egress = startup_component(&logic, &config, &egress_lists, &egress_snapshot, &egress_inventory);
    let mut egress_tracker = Native(Tracker::create(config_to_model(&config)).unwrap());
    let first = observe_lists(&mut egress_tracker, &egress_lists);
    let (egress_sent, _) = run_until_idle(&mut egress_tracker, 1, first, answer_with_egress);
    let egress_commands: Vec<wit::Command> = egress_sent.into_iter().map(|(_, c)| c).collect();
    let (egress_writes, egress_events) = writes_and_events(&egress_commands);
    println!();
    println!("| measure | native | component | component / native |");
    println!("|---|---|---|---|");
    row(
        &format!("(e) start-up with {EGRESS_IDENTITIES} egress identities and {EGRESS_PODS} egress pods"),
        native_egress,
        component_egress,
    );
    row("(a) the same run's start-up without egress, for comparison", native_startup, component_startup);
    println!();
    println!(
        "Restart with egress and nothing changed: {} commands, of which {egress_writes} writes (Azure or Kubernetes) \
         and {egress_events} Events.",
        egress_commands.len()
    );
    println!();

    println!("| measure | native | component | component / native |");
    println!("|---|---|---|---|");
    // What the limits cost: the same start-up under engines compiled without fuel metering,
    // and without any metering (never done outside measurement: such a guest can loop forever).
    for (label, metering) in [
        ("(a) start-up, epoch deadline only (no fuel metering)", Metering { fuel: false, epoch: true }),
        ("(a) start-up, no metering at all", Metering { fuel: false, epoch: false }),
    ] {
        let runtime = Runtime::with_metering(metering).unwrap();
        let logic = runtime.load(clb_sandbox::BUILTIN_GUEST, limits).unwrap();
        row(label, native_startup, startup_through(&logic));
    }
}
