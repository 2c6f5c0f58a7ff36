//! Hot swap, checkpoints and limits at scale, on the cluster of `benches/difftracker.rs`
//! (1,000 nodes, 30,000 ready pods, 1,000 Services) in steady state, behind the [`Supervisor`]:
//! (a) a swap to a precompiled version, up to the first call served by it, state move included;
//! (b) the state move alone (export from the old instance, import into a fresh one, whose
//!     memory is recycled from an earlier instance, and again on freshly mapped memory);
//! (c) one checkpoint (`export-state`), and what the checkpoint policy costs per input;
//! (d) one endpoint change with the limits on and off;
//! (e) a staged swap: the state imported (and the journal replayed) on another thread while the old version serves, then
//!     the switch (replay of what was delivered meanwhile, checks, first tick): the total and
//!     the pauses during which inputs wait;
//! (f) the same in the product path, `clb-host run`'s [`Control`]: the request staged on the
//!     loop, the import on a tokio blocking thread, its end taken as the loop takes it, the
//!     switch recorded and answered — built-in → next guest, each on a fresh supervisor;
//! (g) a candidate in shadow on its own thread (the product's queue): the reconcile thread's CPU
//!     time per endpoint change with and without it, and what the candidate compared.
//! Run with `cargo bench -p clb-tests --bench swap`; prints a Markdown table.

use clb_host::live::control::{Control, ControlEvent};
use clb_host::live::swap::SwapResult;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::supervisor::shadow::SHADOW_QUEUE;
use clb_sandbox::supervisor::{CheckpointPolicy, ShadowOptions, Supervisor};
use clb_sandbox::{LoadedLogic, Metering, Runtime};
use clb_tests::cluster::*;
use clb_tests::*;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Swaps measured (alternating between two loads of the built-in logic); at least 2 in the
/// small mode, so that both directions run.
fn swaps() -> usize {
    scaled(5).max(2)
}
/// Endpoint changes served by the old version while a staged swap imports.
const CHANGES_WHILE_STAGING: usize = 10;
/// Swaps measured through `clb-host run`'s `Control` (each on a fresh cluster: v1 → v2 once).
fn product_swaps() -> usize {
    scaled(3)
}
/// Endpoint changes per policy when measuring what checkpoints cost per input; more than the
/// default policy's period even in the small mode, so that it checkpoints.
fn changes() -> usize {
    scaled(4_096).max(2 * CheckpointPolicy::default().every_inputs)
}

/// A supervisor over `logic` with the whole cluster created and NRP in sync.
fn steady<'a>(logic: &'a LoadedLogic, policy: CheckpointPolicy, config: &wit::Config) -> Supervisor<'a> {
    let mut supervisor = Supervisor::with_policy(logic, policy);
    supervisor.start(config).unwrap();
    // The lists as the hosts hand them over, in calls of bounded size.
    let mut first = wit::Step { commands: Vec::new(), wake_at_ms: None, idle: false };
    let last =
        clb_sandbox::logic::observe_in_calls(&mut supervisor, 0, &lists(), |step| first.commands.extend(step.commands));
    first.commands.extend(last.unwrap().commands);
    settle(first, |results| supervisor.complete(1, results).unwrap());
    supervisor
}

/// One endpoint change and its sync; returns how long the two calls took.
fn change(supervisor: &mut Supervisor, round: usize, now: u64) -> Duration {
    let start = Instant::now();
    let step = supervisor.observe(now, &[endpoint_change(round)]).unwrap();
    assert_eq!(step.commands.len(), 1, "one update per change: {:?}", step.commands);
    let after = supervisor.complete(now, &[(step.commands[0].id, wit::Outcome::Ok)]).unwrap();
    assert!(after.commands.is_empty());
    start.elapsed()
}

/// The CPU time the calling thread has used.
fn thread_cpu() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec for the call to fill.
    let done = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(done, 0, "the thread CPU clock");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// Endpoint changes per block, and blocks, of (g).
fn shadow_blocks() -> (usize, usize) {
    (scaled(200).max(20), 10)
}

fn main() {
    // The changes come faster than any budget refills: they would wait for tokens.
    let config = unbounded(&read_config("clb.yaml"));
    let runtime = runtime();
    // Two loads of the same bytes are two versions to the supervisor: a swap between them does
    // all the work of a real one. `Runtime::load` (compilation) is done beforehand, as in
    // production, where the new component is precompiled off the serving path.
    let a = runtime.load(clb_sandbox::BUILTIN_GUEST, bench_limits()).unwrap();
    let b = runtime.load(clb_sandbox::BUILTIN_GUEST, bench_limits()).unwrap();
    let next = runtime.load(NEXT_GUEST, bench_limits()).unwrap();

    let never = CheckpointPolicy { every_inputs: usize::MAX, journal_items: usize::MAX };
    let mut supervisor = steady(&a, never, &config);
    let state_size = supervisor.export_state().unwrap().payload.len();

    // (a) Swaps, each followed by the first call on the new version.
    let (mut swap_total, mut swap_call, mut swap_move) = (Vec::new(), Vec::new(), Vec::new());
    let mut swap_memory = Vec::new();
    // A change first, so that every swap moves a state changed since the last checkpoint (an
    // export and an import), the first one too.
    change(&mut supervisor, 0, 5);
    for i in 0..swaps() {
        let target = if i % 2 == 0 { &b } else { &a };
        let recycled = runtime.memories().stats().recycled;
        let start = Instant::now();
        let report = supervisor.swap(target, 10).unwrap();
        assert!(report.first_step.commands.is_empty(), "steady state: the first tick asks for nothing");
        change(&mut supervisor, i + 1, 10);
        swap_total.push(start.elapsed());
        swap_memory.push(if runtime.memories().stats().recycled > recycled { "recycled" } else { "mapped" });
        swap_call.push(report.took);
        swap_move.push(report.state_move);
    }
    // To the next guest (state version 1 → 2, a migration): once, since it cannot go back.
    let start = Instant::now();
    let to_next = supervisor.swap(&next, 20).unwrap();
    assert!(to_next.first_step.commands.is_empty());
    change(&mut supervisor, swaps() + 1, 20);
    let to_next_total = start.elapsed();

    // (e) Staged swaps, on the default checkpoint policy: stage (a checkpoint when the journal
    // is long: inputs wait), import on another thread while the old version serves a few
    // changes, switch (inputs wait), first call.
    let mut staged_supervisor = steady(&a, CheckpointPolicy::default(), &config);
    let (mut staged_total, mut stage_pause, mut staged_import, mut switch_pause, mut replayed) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), 0);
    for i in 0..swaps() {
        let target = if i % 2 == 0 { &b } else { &a };
        // Every change flips the pod: rounds run on across swaps, so none repeats the last.
        let mut round = i * (CHANGES_WHILE_STAGING + 1);
        let start = Instant::now();
        let staging = staged_supervisor.stage(target).unwrap();
        stage_pause.push(start.elapsed());
        let staged = std::thread::scope(|scope| {
            let import = scope.spawn(|| staging.import());
            for _ in 0..CHANGES_WHILE_STAGING {
                change(&mut staged_supervisor, round, 50);
                round += 1;
            }
            import.join().unwrap().unwrap()
        });
        staged_import.push(staged.import_took());
        let report = staged_supervisor.swap_staged(staged, 50).unwrap();
        assert!(report.first_step.commands.is_empty());
        replayed = report.replayed.expect("the switch replays, it does not fall back");
        switch_pause.push(report.took);
        change(&mut staged_supervisor, round, 50);
        staged_total.push(start.elapsed());
    }

    // (f) The product path: what `clb-host run`'s loop does with a swap request. The compile
    // (in `SwapSender::swap`, before the loop sees the request) is not counted.
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (mut product_total, mut product_stage, mut product_switch, mut product_took) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut stage_checkpoints = 0;
    for _ in 0..product_swaps() {
        let mut serving = steady(&a, CheckpointPolicy::default(), &config);
        let (mut control, sender) = Control::new(runtime, bench_limits(), clb_host::live::metrics::Metrics::new());
        tokio.block_on(async {
            let asked = tokio::spawn(async move {
                sender
                    .swap(NEXT_GUEST.to_vec(), clb_host::live::swap::Signed::detached(None, "the bench"), None, "bench")
                    .await
            });
            let ControlEvent::Request(request) = control.next().await else { unreachable!("nothing staged yet") };
            let before = serving.stats().checkpoints;
            let start = Instant::now();
            assert!(control.begin(&mut serving, request, 50).is_none(), "staged, not switched");
            product_stage.push(start.elapsed());
            stage_checkpoints += serving.stats().checkpoints - before;
            for round in 0..CHANGES_WHILE_STAGING {
                change(&mut serving, round, 50);
            }
            let event = control.next().await;
            let ControlEvent::Imported(imported) = event else { unreachable!("one swap at a time") };
            let switch = Instant::now();
            let first_step = control.finish(&mut serving, imported, 50).expect("accepted");
            product_switch.push(switch.elapsed());
            assert!(first_step.commands.is_empty());
            change(&mut serving, CHANGES_WHILE_STAGING, 50);
            product_total.push(start.elapsed());
            match asked.await.unwrap().unwrap() {
                SwapResult::Accepted { took_ms, replayed_inputs: Some(_), .. } => {
                    product_took.push(Duration::from_secs_f64(took_ms / 1e3))
                }
                other => panic!("a staged swap, accepted: {other:?}"),
            }
        });
    }

    // (b) The state move alone: the serving version's export, a fresh instance's import.
    let mut steady_a = steady(&a, never, &config);
    let mut export = Vec::new();
    let mut import = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        let state = steady_a.export_state().unwrap();
        export.push(start.elapsed());
        let mut session = b.session().unwrap();
        let start = Instant::now();
        black_box(session.tracker_import(&config, &state).unwrap().unwrap());
        import.push(start.elapsed());
    }
    let (export, import) = (median(export), median(import));
    // The import again on freshly mapped memory: a runtime of its own (its own memories) whose
    // sessions all stay alive, so that none is recycled.
    let cold_runtime = Runtime::new().unwrap();
    let cold_logic = cold_runtime.load(clb_sandbox::BUILTIN_GUEST, bench_limits()).unwrap();
    let state = steady_a.export_state().unwrap();
    let (mut cold_import, mut alive) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let mut session = cold_logic.session().unwrap();
        let start = Instant::now();
        black_box(session.tracker_import(&config, &state).unwrap().unwrap());
        cold_import.push(start.elapsed());
        alive.push(session);
    }
    assert_eq!(cold_runtime.memories().stats().recycled, 0, "every import on a fresh mapping");
    let cold_import = median(cold_import);

    // (c) What checkpoints cost per input: the same endpoint changes under each policy. Every
    // change is two inputs (the observation, then the outcome of its update).
    let policies = [
        ("never".to_owned(), never),
        ("every 64 inputs (the first default)".to_owned(), CheckpointPolicy { every_inputs: 64, journal_items: 4_096 }),
        (
            format!("every {} inputs (the default)", CheckpointPolicy::default().every_inputs),
            CheckpointPolicy::default(),
        ),
    ];
    let mut per_input = Vec::new();
    for (name, policy) in policies {
        let mut s = steady(&a, policy, &config);
        let checkpoints_before = s.stats().checkpoints;
        let start = Instant::now();
        for round in 0..changes() {
            change(&mut s, round, 30);
        }
        let took = start.elapsed() / (2 * changes() as u32);
        per_input.push((name, took, s.stats().checkpoints - checkpoints_before));
    }

    // (d) One endpoint change (observation + sync) with the limits on and off.
    let change_median =
        |supervisor: &mut Supervisor| median((0..scaled(400)).map(|round| change(supervisor, round, 40)).collect());
    let metered = change_median(&mut steady_a);
    let bare_runtime = Runtime::with_metering(Metering { fuel: false, epoch: false }).unwrap();
    let bare_logic = bare_runtime.load(clb_sandbox::BUILTIN_GUEST, bench_limits()).unwrap();
    let mut bare = steady(&bare_logic, never, &config);
    let unmetered = change_median(&mut bare);

    // (g) The reconcile thread's CPU per endpoint change, without and with a candidate in shadow
    // (the same built-in logic, so that it compares every input and never diverges), in
    // alternating blocks so that both see the same machine.
    let mut plain = steady(&a, CheckpointPolicy::default(), &config);
    let mut shadowed = steady(&a, CheckpointPolicy::default(), &config);
    let options = ShadowOptions { queue: Some(SHADOW_QUEUE), ..Default::default() };
    let shadow = shadowed.shadow(b.clone(), options).unwrap();
    // In step before the clock starts (its first import of the state, on its own thread).
    while shadow.status().state != clb_sandbox::supervisor::ShadowState::InStep {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (block, blocks) = shadow_blocks();
    let (mut cpu_plain, mut cpu_shadowed) = (Duration::ZERO, Duration::ZERO);
    // The candidate is given a block's time to catch up after each block (not counted): a
    // reconcile thread in production is not busy all the time, as this loop is.
    let caught_up = |inputs: u64| {
        (0..6_000).find_map(|_| {
            let status = shadow.status();
            if status.compared + status.resyncing >= inputs {
                Some(status)
            } else {
                std::thread::sleep(Duration::from_millis(1));
                None
            }
        })
    };
    for n in 0..blocks {
        for (supervisor, cpu) in [(&mut plain, &mut cpu_plain), (&mut shadowed, &mut cpu_shadowed)] {
            let start = thread_cpu();
            for round in n * block..(n + 1) * block {
                change(supervisor, round, 60);
            }
            *cpu += thread_cpu() - start;
        }
        caught_up(2 * ((n + 1) * block) as u64).expect("the candidate takes every input, compared or not");
    }
    let inputs = 2 * (block * blocks) as u64;
    let shadow_status = caught_up(inputs).expect("the candidate takes every input, compared or not");
    assert!(shadow_status.divergences.is_empty(), "the same logic never diverges: {shadow_status:?}");
    let per_change = |cpu: Duration| cpu / (block * blocks) as u32;

    println!("{}", describe(state_size));
    println!();
    println!("| measure | value |");
    println!("|---|---|");
    let row = |name: &str, d: Duration| println!("| {name} | {d:.2?} |");
    row(
        &format!("(a) swap + first call on the new version (median of {}, v1 → v1)", swaps()),
        median(swap_total.clone()),
    );
    row("(a) of which the swap itself (`Supervisor::swap`)", median(swap_call));
    row("(a) of which its state move (export unless the checkpoint is fresh, import)", median(swap_move));
    let each: Vec<String> = swap_total.iter().zip(&swap_memory).map(|(d, m)| format!("{d:.2?} ({m})")).collect();
    println!(
        "| (a) each swap + first call, in order (the new instance's memory: freshly mapped, or recycled) | {} |",
        each.join(", ")
    );
    row("(a) swap + first call, built-in → next guest (v1 → v2, one run)", to_next_total);
    row("(a) of which the swap itself", to_next.took);
    row(
        &format!(
            "(e) staged swap, total: stage, import while {CHANGES_WHILE_STAGING} changes are served, switch, first call (median of {})",
            swaps()
        ),
        median(staged_total),
    );
    row("(e) of which the pause at `stage` (a copy of the journal since the checkpoint)", median(stage_pause));
    row(
        "(e) of which the import and the replay of the staged journal, on another thread (no pause)",
        median(staged_import),
    );
    row(
        &format!(
            "(e) of which the pause at the switch (`swap_staged`: replay of {replayed} inputs, checks, first tick)"
        ),
        median(switch_pause),
    );
    row(
        &format!(
            "(f) product path (`Control`), built-in → next guest, total: stage, import while {CHANGES_WHILE_STAGING} changes are served, switch, first call (median of {})",
            product_swaps()
        ),
        median(product_total.clone()),
    );
    row(
        &format!(
            "(f) of which the pause at `Control::begin` (stage, spawn the import; checkpoints taken there: {stage_checkpoints} in {})",
            product_swaps()
        ),
        median(product_stage.clone()),
    );
    row("(f) of which the pause at `Control::finish` (switch, record, answer)", median(product_switch.clone()));
    row("(f) the pause as the accepted result reports it (`tookMs`)", median(product_took));
    let pause = median(product_stage) + median(product_switch);
    println!("| (f) inputs wait / total | {:.3} |", pause.as_secs_f64() / median(product_total).as_secs_f64());
    row("(b) state move alone: export", export);
    row("(b) state move alone: import into a fresh instance", import);
    row("(b) the same import into a fresh instance on freshly mapped memory (median of 5)", cold_import);
    row("(b) state move alone: export + import", export + import);
    row("(c) one checkpoint (`export-state`)", export);
    for (name, took, checkpoints) in &per_input {
        row(&format!("(c) per input, checkpoints {name}: {checkpoints} in {} inputs", 2 * changes()), *took);
    }
    row("(d) one endpoint change, limits on (fuel + epoch)", metered);
    row("(d) one endpoint change, limits off", unmetered);
    println!("| (d) limits on / off | {:.2}× |", metered.as_secs_f64() / unmetered.as_secs_f64());
    let changes = block * blocks;
    row(&format!("(g) reconcile-thread CPU per endpoint change, no shadow ({changes} changes)"), per_change(cpu_plain));
    row("(g) reconcile-thread CPU per endpoint change, a candidate in shadow", per_change(cpu_shadowed));
    println!("| (g) with a shadow / without | {:.3}× |", cpu_shadowed.as_secs_f64() / cpu_plain.as_secs_f64());
    println!(
        "| (g) the candidate's inputs: compared / not compared (resyncing) / resyncs | {} / {} / {:?} |",
        shadow_status.compared, shadow_status.resyncing, shadow_status.resyncs
    );
}
