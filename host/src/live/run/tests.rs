use super::*;
use clb_emulator::Emulator;
use clb_executor::KubeError;
use std::cell::RefCell;

/// Kubernetes that takes a few polls per call and writes down when each starts and ends.
#[derive(Default)]
struct SlowKube {
    log: RefCell<Vec<String>>,
}

impl SlowKube {
    async fn call(&self, what: String) -> Result<(), KubeError> {
        self.log.borrow_mut().push(format!("start {what}"));
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        self.log.borrow_mut().push(format!("end {what}"));
        Ok(())
    }
}

impl KubeApi for SlowKube {
    async fn patch_service_status(&self, service: &wit::ObjectRef, _: &[String]) -> Result<(), KubeError> {
        self.call(format!("status {}", service.name)).await
    }
    async fn set_finalizer(&self, service: &wit::ObjectRef, _: &str, _: bool) -> Result<(), KubeError> {
        self.call(format!("finalizer {}", service.name)).await
    }
    async fn emit_event(&self, event: &wit::Event) -> Result<(), KubeError> {
        self.call(format!("event {} {}", event.regarding.name, event.reason)).await
    }
}

fn service(name: &str) -> wit::ObjectRef {
    wit::ObjectRef { kind: "Service".into(), namespace: "ns".into(), name: name.into(), uid: format!("uid-{name}") }
}

fn event(name: &str, reason: &str) -> wit::Command {
    wit::Command::EmitEvent(wit::Event {
        regarding: service(name),
        event_type: wit::EventType::Normal,
        reason: reason.into(),
        message: String::new(),
    })
}

fn finalizer(name: &str) -> wit::Command {
    wit::Command::SetFinalizer(wit::FinalizerChange { service: service(name), finalizer: "f".into(), present: true })
}

/// Runs `commands` as `run` does; the ids in the order their outcomes came back.
async fn drive(commands: &mut Commands<'_, Emulator, SlowKube>) -> Vec<u64> {
    let mut completed = Vec::new();
    loop {
        commands.launch().unwrap();
        let Some(first) = commands.running.next().await else { break };
        completed.extend(commands.settle(first).into_iter().map(|(id, _)| id));
    }
    completed
}

/// Calls `test` with these commands queued (ids 0, 1, …) for the in-process emulator and a
/// [`SlowKube`].
fn with_queued(
    issued: impl IntoIterator<Item = wit::Command>,
    test: impl FnOnce(&mut Commands<'_, Emulator, SlowKube>, &SlowKube),
) {
    let azure = Emulator::new(clb_emulator::scope());
    let kube = SlowKube::default();
    let executor = Executor::new(&azure, &kube);
    let mut commands = Commands::new(&executor, Leadership::unconditional(), None);
    let ids = 0u64..;
    commands.queued.extend(ids.zip(issued).map(|(id, command)| wit::Issued { id, command }));
    test(&mut commands, &kube);
}

fn block_on<T>(future: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(future)
}

fn put_public_ip(name: &str) -> wit::Command {
    wit::Command::PutPublicIp(wit::PublicIp { name: name.into(), version: wit::IpVersion::Ipv4 })
}

#[test]
fn arms_figures_and_its_429s_reach_metrics_and_each_figure_reaches_the_logic_once() {
    let azure = Emulator::new(clb_emulator::scope());
    let kube = SlowKube::default();
    let executor = Executor::new(&azure, &kube);
    let metrics = Metrics::new();
    let mut commands = Commands::new(&executor, Leadership::unconditional(), Some(metrics.clone()));
    // Another client leaves 2 writes: the first put is answered with 1 left, the third is
    // throttled (429, 0 left).
    azure.arm_spend(198, 0);
    let issued = [put_public_ip("a"), put_public_ip("b"), put_public_ip("c")];
    commands.queued.extend((0u64..).zip(issued).map(|(id, command)| wit::Issued { id, command }));
    block_on(drive(&mut commands));
    assert_eq!(arm_figure(&azure, Some(&metrics)), Some(0));
    assert_eq!(arm_figure(&azure, Some(&metrics)), None, "no answer since: no figure");
    let text = metrics.render();
    assert!(text.contains("clb_azure_throttled_total{command=\"put-public-ip\"} 1"), "{text}");
    assert!(text.contains("clb_arm_remaining_writes 0"), "{text}");
}

#[test]
fn kubernetes_commands_on_one_object_run_in_issue_order_and_other_objects_run_alongside() {
    let issued = [event("a", "First"), finalizer("a"), event("b", "Other"), event("a", "Last")];
    with_queued(issued, |commands, kube| {
        let mut completed = block_on(drive(commands));
        let log = kube.log.borrow();
        let position = |entry: &str| log.iter().position(|e| e == entry).unwrap_or_else(|| panic!("{entry}: {log:?}"));
        let a = ["event a First", "finalizer a", "event a Last"];
        for pair in a.windows(2) {
            assert!(position(&format!("end {}", pair[0])) < position(&format!("start {}", pair[1])), "{log:?}");
        }
        assert!(position("start event b Other") < position("end event a First"), "b runs alongside a: {log:?}");
        completed.sort_unstable();
        assert_eq!(completed, [0, 1, 2, 3], "every command completes once");
        assert!(commands.is_empty() && commands.busy.is_empty());
    });
}

#[test]
fn no_more_than_the_limit_of_commands_run_at_once() {
    let count = MAX_RUNNING + 8;
    with_queued((0..count).map(|n| event(&format!("s{n}"), "E")), |commands, _| {
        commands.launch().unwrap();
        assert_eq!(commands.running.len(), MAX_RUNNING);
        assert_eq!(commands.queued.len(), 8, "the rest wait in issue order");
        assert_eq!(commands.queued.front().map(|c| c.id), Some(MAX_RUNNING as u64));
        assert_eq!(block_on(drive(commands)).len(), count);
    });
}
