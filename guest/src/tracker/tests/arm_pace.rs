//! Writes paced by ARM's remaining-writes figures (`complete_paced`): spent down to the reserve,
//! then at ARM's refill rate, instead of by the fixed `arm-writes` and `update-services` budgets.

use super::*;
use crate::budget::{ARM_FIGURE_FRESH_MS, ArmPace, DEFAULT_ARM_WRITE_RESERVE, WriteBudgets, WriteKind};

/// `count` LoadBalancer Services with their own UIDs, and the lists complete.
fn services(count: u32) -> Vec<Observation> {
    let mut observations: Vec<Observation> = (0..count)
        .map(|i| {
            let mut service = lb_service("Local");
            service.uid = format!("0f6f2c2e-1b1a-4a7e-9c61-{i:012}");
            service.name = format!("web-{i}");
            Observation::ServiceUpserted(service)
        })
        .collect();
    observations.push(Observation::ListsComplete);
    observations
}

/// ARM as one subscription's write bucket: each write spends a token and every answer reports
/// what is left, as `x-ms-ratelimit-remaining-subscription-writes` does.
struct Arm {
    remaining: u32,
    writes: Vec<Command>,
    throttled: u32,
}

impl Arm {
    fn with(remaining: u32) -> Self {
        Self { remaining, writes: Vec::new(), throttled: 0 }
    }

    /// Runs `step`'s commands and all that follow at `now`; returns the last step.
    fn drive(&mut self, tracker: &mut Tracker, now: u64, mut step: Step) -> Step {
        let answer = answer_ok(&[]);
        for _ in 0..1_000 {
            if step.commands.is_empty() {
                return step;
            }
            let mut figure = None;
            let results = step
                .commands
                .iter()
                .map(|c| {
                    if !c.command.writes_arm() {
                        return (c.id, answer(&c.command));
                    }
                    if self.remaining == 0 {
                        self.throttled += 1;
                        figure = Some(0);
                        return (c.id, failed(429));
                    }
                    self.remaining -= 1;
                    self.writes.push(c.command.clone());
                    figure = Some(self.remaining);
                    (c.id, answer(&c.command))
                })
                .collect();
            step = tracker.complete_paced(now, results, figure);
        }
        panic!("the tracker kept issuing commands");
    }

    fn count(&self, what: fn(&Command) -> bool) -> usize {
        self.writes.iter().filter(|c| what(c)).count()
    }
}

fn is_put_public_ip(command: &Command) -> bool {
    matches!(command, Command::PutPublicIp(_))
}

fn registers(command: &Command) -> bool {
    matches!(command, Command::UpdateServices(requests) if requests.iter().all(|r| !r.is_delete))
}

#[test]
fn with_arms_figures_sixty_services_spend_arms_bucket_down_to_the_reserve_at_once_and_the_rest_at_its_refill_rate() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let mut arm = Arm::with(200);
    let step = tracker.observe(NOW, services(60));
    let step = arm.drive(&mut tracker, NOW, step);
    assert_eq!(arm.remaining, DEFAULT_ARM_WRITE_RESERVE, "spent down to the reserve, no further");
    assert_eq!(arm.writes.len(), 160, "the fixed budgets would have let 120 go: 100 to ARM, 20 registrations");
    assert_eq!(step.wake_at_ms, Some(NOW + 100), "ARM refills a write every 100 ms");
    // ARM refills as the tracker expects; 2 s later every Service is registered.
    let (mut now, mut step) = (NOW, step);
    while arm.count(registers) < 60 {
        let at = step.wake_at_ms.filter(|&at| at <= NOW + 10_000).expect("a wake-up for the next token");
        arm.remaining = (arm.remaining + u32::try_from((at - now) / 100).unwrap()).min(200);
        now = at;
        let tick = tracker.tick(now);
        step = arm.drive(&mut tracker, now, tick);
    }
    for (what, is) in
        [("public IPs", is_put_public_ip as fn(&Command) -> bool), ("load balancers", is_put_load_balancer)]
    {
        assert_eq!(arm.count(is), 60, "{what}");
    }
    assert_eq!(arm.count(registers), 60);
    assert_eq!((arm.throttled, arm.writes.len()), (0, 180), "no 429, no write twice");
    assert!(now <= NOW + 2_000, "the last registration at {}", now - NOW);
}

#[test]
fn without_arms_figures_the_fixed_budgets_pace_as_before() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.observe(NOW, services(60));
    let (issued, _, _) = drive(&mut tracker, NOW, step, answer_ok(&[]));
    assert_eq!(issued.iter().filter(|c| registers(c)).count(), 20, "update-services' burst");
}

#[test]
fn a_figure_below_the_reserve_holds_writes_for_the_refill_of_the_shortfall_instead_of_meeting_a_429() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    // Another client of the subscription spends ARM's bucket: one Service's public IP goes on
    // the fixed budget, and its answer says 30 are left, under the reserve of 40.
    let mut arm = Arm::with(31);
    let step = tracker.observe(NOW, services(1));
    let step = arm.drive(&mut tracker, NOW, step);
    assert_eq!(arm.writes.len(), 1);
    assert_eq!(step.wake_at_ms, Some(NOW + 1_100), "10 writes short of the reserve, then one");
    assert!(tracker.tick(NOW + 1_099).commands.is_empty());
    let step = tracker.tick(NOW + 1_100);
    assert!(matches!(&step.commands[..], [c] if matches!(c.command, Command::PutLoadBalancer(_))));
    assert_eq!(arm.throttled, 0);
}

#[test]
fn a_429_under_arms_figures_halves_the_pace_and_says_so() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.observe(NOW, services(1));
    let put = step_until(&mut tracker, step, |c| matches!(c, Command::PutPublicIp(_)));
    let step = tracker.complete_paced(NOW, vec![(put, failed(429))], Some(0));
    assert_eq!(tracker.budgets.pace.unwrap().per_minute(), 300);
    assert!(step.logs.iter().any(|l| l.message.contains("ARM throttled arm-writes (HTTP 429)")), "{:?}", step.logs);
}

#[test]
fn a_figure_older_than_a_minute_paces_no_more_and_the_fixed_budgets_take_over() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let mut arm = Arm::with(41);
    let step = tracker.observe(NOW, services(1));
    arm.drive(&mut tracker, NOW, step);
    // ARM's figure said nothing is left above the reserve; a minute on it is stale, and 60 new
    // Services go at the fixed budgets' pace again: ARM's burst of 100 public IPs and load
    // balancers (the figure's pace, refilled, would have let 160 go).
    let later = NOW + ARM_FIGURE_FRESH_MS;
    let observations = services(61).into_iter().skip(1).collect();
    let step = tracker.observe(later, observations);
    let (issued, _, _) = drive(&mut tracker, later, step, answer_ok(&[]));
    let arm_writes = issued.iter().filter(|c| is_put_public_ip(c) || is_put_load_balancer(c)).count();
    assert_eq!(arm_writes, 100);
}

#[test]
fn the_pace_is_state_version_8_and_a_version_7_state_imports_without_one() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.observe(NOW, services(3));
    Arm::with(100).drive(&mut tracker, NOW, step);
    assert!(tracker.budgets.pace.is_some());
    let (version, payload) = tracker.export_state();
    assert_eq!(version, STATE_VERSION);
    assert_eq!(Tracker::import_state(clb(), version, &payload).unwrap(), tracker);
    let v7 = Tracker::import_state(clb(), 7, &tracker.export_state_as(7)).unwrap();
    assert_eq!(v7.budgets.pace, None);
    let core = |t: &Tracker| (t.outbox.clone(), t.kube.clone(), t.inbound.clone(), t.nrp.clone());
    assert_eq!(core(&v7), core(&tracker));
    let reserve =
        |r| Config { write_budgets: Some(WriteBudgets { arm_write_reserve: r, ..WriteBudgets::DEFAULT }), ..clb() };
    // The reserve is the config's: the same figure leaves more to spend under a smaller one.
    let mut small = Tracker::create_with_arm_settled(reserve(0)).unwrap();
    small.budgets.pace = Some(ArmPace::reported(None, 10, 0, 0, NOW));
    assert_eq!(small.budgets.token_due(WriteKind::Arm, NOW), None);
}

/// Runs `step`'s commands (all answered ok, with no figure from ARM) until one matches `what`;
/// returns that one's id, unanswered.
fn step_until(tracker: &mut Tracker, mut step: Step, what: fn(&Command) -> bool) -> u64 {
    let answer = answer_ok(&[]);
    for _ in 0..100 {
        if let Some(found) = step.commands.iter().find(|c| what(&c.command)) {
            return found.id;
        }
        let results = step.commands.iter().map(|c| (c.id, answer(&c.command))).collect();
        step = tracker.complete(NOW, results);
    }
    panic!("no such command");
}
