//! The DiffTracker at scale (issue #3): a cluster of 1,000 nodes, 30,000 ready pods and 1,000
//! LoadBalancer Services, natively and through the component:
//! (a) start-up rebuild: the lists, then a read of NRP and a list of ARM that already hold
//!     everything (a restart), and how many writes and Events that restart costs;
//! (b) one endpoint change: the observation and the sync it causes;
//! (c) state export + import.
//! Run with `cargo bench -p clb-tests --bench difftracker`; prints a Markdown table.

use clb_guest::model;
use clb_guest::tracker::Tracker;
use clb_host::sandbox::bindings::clb::reconciler::types as wit;
use clb_host::sandbox::{Limits, Metering, Runtime, Session};
use clb_tests::cluster::*;
use clb_tests::*;
use std::hint::black_box;
use std::time::{Duration, Instant};
use wasmtime::component::ResourceAny;

/// The tracker, natively or through the component, behind one face.
trait Driver {
    fn observe(&mut self, now: u64, batch: &[wit::Observation]) -> wit::Step;
    fn complete(&mut self, now: u64, results: &[(u64, wit::Outcome)]) -> wit::Step;
}

struct Native(Tracker);

impl Driver for Native {
    fn observe(&mut self, now: u64, batch: &[wit::Observation]) -> wit::Step {
        step_to_wit(self.0.observe(now, batch.iter().map(observation_to_model).collect()))
    }
    fn complete(&mut self, now: u64, results: &[(u64, wit::Outcome)]) -> wit::Step {
        step_to_wit(self.0.complete(now, results.iter().map(|(id, o)| (*id, outcome_to_model(o))).collect()))
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
        self.session.tracker_complete(self.tracker, now, results).unwrap()
    }
}

/// Answers every command until the tracker is idle; returns the commands it sent.
fn drive(driver: &mut dyn Driver, step: wit::Step) -> Vec<wit::Command> {
    settle_commands(step, |results| driver.complete(1, results))
}

/// Azure and Kubernetes writes among `commands`, and Events.
fn writes_and_events(commands: &[wit::Command]) -> (usize, usize) {
    let events = commands.iter().filter(|c| matches!(c, wit::Command::EmitEvent(_))).count();
    let reads = commands.iter().filter(|c| matches!(c, wit::Command::ReadNrp | wit::Command::ReadArm)).count();
    (commands.len() - events - reads, events)
}

fn main() {
    let config = read_config("clb.yaml");
    let lists = lists();
    let native_lists: Vec<model::Observation> = lists.iter().map(observation_to_model).collect();
    let snapshot = nrp_in_sync();
    let native_snapshot = outcome_to_model(&snapshot);
    let inventory = arm_in_sync();
    let native_inventory = outcome_to_model(&inventory);
    let limits = Limits { fuel: u64::MAX / 4, deadline: Duration::from_secs(600), memory_bytes: 4 << 30 };
    let logic = runtime().load(clb_host::BUILTIN_GUEST, limits).unwrap();

    // (a) Start-up rebuild: the lists, then NRP's answer (3 runs each, median).
    let time_startup = |run: &mut dyn FnMut() -> Duration| {
        let mut samples: Vec<Duration> = (0..3).map(|_| run()).collect();
        samples.sort();
        samples[1]
    };
    // Both sides start from the host's records: the component's call copies them into the
    // guest (lowering), the native side builds the library's records from them, as a native
    // host would. Without that copy the native side would skip work the component cannot.
    let native_startup = time_startup(&mut || {
        let mut tracker = Tracker::create(config_to_model(&config)).unwrap();
        let start = Instant::now();
        let step = tracker.observe(0, lists.iter().map(observation_to_model).collect());
        let read = step.commands.iter().find(|c| c.command == model::Command::ReadNrp).unwrap().id;
        let step = tracker.complete(0, vec![(read, outcome_to_model(&snapshot))]);
        let list = step.commands.iter().find(|c| c.command == model::Command::ReadArm).unwrap().id;
        black_box(tracker.complete(0, vec![(list, outcome_to_model(&inventory))]));
        start.elapsed()
    });
    let native_without_copy = time_startup(&mut || {
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
    let startup_through = |logic: &clb_host::sandbox::Logic| {
        time_startup(&mut || {
            let mut session = logic.session().unwrap();
            let tracker = session.tracker_create(&config).unwrap().unwrap();
            let start = Instant::now();
            let step = session.tracker_observe(tracker, 0, &lists).unwrap();
            let read = step.commands.iter().find(|c| c.command == wit::Command::ReadNrp).unwrap().id;
            let step = session.tracker_complete(tracker, 0, &[(read, snapshot.clone())]).unwrap();
            let list = step.commands.iter().find(|c| c.command == wit::Command::ReadArm).unwrap().id;
            black_box(session.tracker_complete(tracker, 0, &[(list, inventory.clone())]).unwrap());
            start.elapsed()
        })
    };
    let component_startup = startup_through(&logic);

    // Both trackers brought to the steady state: every Service Created, NRP in sync.
    let mut native = Native(Tracker::create(config_to_model(&config)).unwrap());
    let first = native.observe(0, &lists);
    let native_commands = drive(&mut native, first);
    let mut session = logic.session().unwrap();
    let tracker = session.tracker_create(&config).unwrap().unwrap();
    let mut component = Component { session, tracker };
    let first = component.observe(0, &lists);
    let component_commands = drive(&mut component, first);
    assert_eq!(native_commands, component_commands, "both trackers sent the same commands");
    let (restart_writes, restart_events) = writes_and_events(&component_commands);
    // The same restart as before the inventory existed: a host that cannot list ARM (answered
    // with something else, which the logic takes as "no inventory").
    let mut blind = Native(Tracker::create(config_to_model(&config)).unwrap());
    let first = blind.observe(0, &lists);
    let no_inventory = |c: &wit::Command| if *c == wit::Command::ReadArm { wit::Outcome::Ok } else { answer(c) };
    let blind_commands = settle_answering(first, no_inventory, |results| blind.complete(1, results));
    let (blind_writes, blind_events) = writes_and_events(&blind_commands);

    // (b) One endpoint change: a pod goes not-ready and back; each observation causes one
    // address-location update, answered with success.
    let changes: Vec<wit::Observation> = (0..2).map(endpoint_change).collect();
    let measure_change = |driver: &mut dyn Driver| {
        let (mut observe, mut sync) = (Vec::new(), Vec::new());
        for round in 0..400 {
            let change = std::slice::from_ref(&changes[round % 2]);
            let start = Instant::now();
            let step = driver.observe(2, change);
            observe.push(start.elapsed());
            assert_eq!(step.commands.len(), 1, "one update per change: {:?}", step.commands);
            let results = [(step.commands[0].id, wit::Outcome::Ok)];
            let start = Instant::now();
            let after = driver.complete(2, &results);
            sync.push(start.elapsed());
            assert!(after.commands.is_empty());
        }
        observe.sort();
        sync.sort();
        (observe[observe.len() / 2], sync[sync.len() / 2])
    };
    let (native_observe, native_sync) = measure_change(&mut native);
    let (component_observe, component_sync) = measure_change(&mut component);

    // (c) State export + import of the whole cluster.
    let native_export_import = median_per_iteration(3, || {
        let (version, payload) = native.0.export_state();
        black_box(Tracker::import_state(config_to_model(&config), version, &payload).unwrap());
    });
    let state_size = component.session.tracker_export(component.tracker).unwrap().payload.len();
    let component_export_import = median_per_iteration(3, || {
        let state = component.session.tracker_export(component.tracker).unwrap();
        black_box(component.session.tracker_import(&config, &state).unwrap().unwrap());
    });

    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!("{}", describe(state_size));
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

    // What the limits cost: the same start-up under engines compiled without fuel metering,
    // and without any metering (never done outside measurement: such a guest can loop forever).
    for (label, metering) in [
        ("(a) start-up, epoch deadline only (no fuel metering)", Metering { fuel: false, epoch: true }),
        ("(a) start-up, no metering at all", Metering { fuel: false, epoch: false }),
    ] {
        let runtime = Runtime::with_metering(metering).unwrap();
        let logic = runtime.load(clb_host::BUILTIN_GUEST, limits).unwrap();
        row(label, native_startup, startup_through(&logic));
    }
}
