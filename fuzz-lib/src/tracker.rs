//! The `tracker` target: the guest's tracker, natively, under hostile input (part A), then the
//! P1–P6 property run of `guest/src/properties.rs` on fuzzer-chosen operations (part B).
//!
//! **Part A** ([`Hostile`]) drives a tracker with a [`Program`]: odd observations (bad IPs,
//! IPv4-mapped IPv6, zone ids, unknown enum strings, duplicates, deletions of what was never
//! there, out-of-order), answers to the commands it issued in any order (the truth, a failure
//! of any status and `Retry-After` before or after the change took effect, any outcome at
//! all), stray answers, and a clock that jumps, stands still, steps back and sits at the ends
//! of `u64`. Azure is the property model's [`World`] (its Kubernetes half is unused), Kubernetes
//! a store of the last object of each key, changed by the tracker's status and finalizer
//! writes as the API server would. Nothing may panic. At the end every command is answered
//! truthfully and time runs until the tracker is quiet (it must get there), and then:
//! * P2: a tick sends nothing; P4: the egress reference counts agree with the pods; export →
//!   import is the same tracker and export is a fixed point;
//! * when no answer claimed that something was not found (a 404 it did not earn, which makes
//!   the tracker drop what it believes gone) and no literal outcome lied: P3 (every object seen
//!   again causes no write; after an egress label collision, from the second re-list: egress.rs
//!   re-admits a refused pod only when it is read again), P5/P6 and the ordering rules the World checks as it executes, and
//!   the mirror equals NRP (after a refusal, once NRP has been read since: the drive to idle
//!   runs twice, a resync period apart);
//! * when, in addition, nothing was refused for good (400, 422, a terminal code, a literal
//!   outcome), P1 in the model-free form: NRP holds exactly what the tracker wants it to hold.
//!
//! **Part B** runs [`Op`]s (bounded, as the proptest draws them, with any status the model
//! treats as transient and any `Retry-After`, and any jump or step back of the clock) through
//! the property [`Harness`], with the checks after every operation and, at the end, `settle`
//! and `check`: P1–P6 against the independent model.
//!
//! The expensive part (drive to idle, the checks) runs once per input, after at most
//! [`crate::program::MAX_STEPS`] steps and [`MAX_OPS`] operations.

use crate::input::Dec;
use crate::program::{Answer, Program, Step, Time};
use clb_executor::UID_MISMATCH;
use clb_guest::invariants::{Harness, LABELS, Op, PHASES, World, assert_round_trip};
use clb_guest::model::{self, Command, Issued, Observation, Outcome};
use clb_guest::tracker::Tracker;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::native::{config_to_model, observation_to_model, outcome_to_model};
use std::collections::{BTreeMap, BTreeSet};

/// The most property operations of part B.
pub const MAX_OPS: usize = 48;
/// Part A checks the round-trip invariant after every this many steps.
const ROUND_TRIP_EVERY: usize = 4;
/// Rounds of answering and waiting before the tracker must be quiet.
const SETTLE_ROUNDS: usize = 2_000;

/// The fuzz target.
pub fn tracker(data: &[u8]) {
    let mut d = Dec::new(data);
    let program = d.program();
    let ops = ops(&mut d);
    run_hostile(&program);
    run_modelled(&ops);
}

/// Statuses the property model treats as transient: a 404 would claim that something it holds
/// is gone, 400/422 refuse for good, which the model does not predict.
const TRANSIENT: &[u16] = &[0, 401, 403, 408, 409, 412, 429, 500, 502, 503, 504];

/// A status or finalizer write applied to the stored Service, or the outcome that refuses it.
type ServiceWrite = Box<dyn Fn(&mut model::Service) -> Result<(), Outcome>>;

/// Part B's operations, drawn as `properties.rs` draws them, wider where the model allows.
pub fn ops(d: &mut Dec<'_>) -> Vec<Op> {
    let count = d.below(MAX_OPS + 1);
    let mut ops = Vec::new();
    for _ in 0..count {
        if d.is_empty() {
            break;
        }
        let op = match d.byte() % 16 {
            0 => Op::Node { node: d.byte() % 4, variant: d.byte() % 2 },
            1 => Op::DeleteNode { node: d.byte() % 4 },
            2 => Op::Service { service: d.byte() % 3, local: !d.byte().is_multiple_of(5), port: [80, 443][d.below(2)] },
            3 => Op::DeleteService { service: d.byte() % 3 },
            4 | 5 => Op::Slice {
                slice: d.byte() % 4,
                owner: d.byte() % 3,
                endpoints: (0..d.len(4)).map(|_| (d.byte() % 6, d.byte() % 4, d.opt_bool())).collect(),
            },
            6 => Op::DeleteSlice { slice: d.byte() % 4 },
            7 => Op::ToggleReady { slice: d.byte() % 4, endpoint: d.byte() % 4 },
            8 => Op::EgressPod {
                pod: d.byte() % 6,
                label: d.byte() % LABELS.len() as u8,
                node: d.byte() % 4,
                phase: d.byte() % PHASES.len() as u8,
            },
            9 => Op::DeleteEgressPod { pod: d.byte() % 6 },
            10 | 11 => Op::Fail {
                count: 1 + d.byte() % 3,
                after: d.flag(),
                status: TRANSIENT[d.below(TRANSIENT.len())],
                retry_after_ms: d.opt_u64(),
            },
            12 => Op::Advance { ms: u32::from_le_bytes([d.byte(), d.byte(), d.byte(), d.byte()]) },
            // At most 2^32 ms back per operation: the model's clock starts at 1.7e12 ms.
            13 => Op::StepBack { ms: u32::from_le_bytes([d.byte(), d.byte(), d.byte(), d.byte()]) },
            14 => Op::Restart,
            _ => Op::RoundTrip,
        };
        ops.push(op);
    }
    ops
}

/// Part B.
pub fn run_modelled(ops: &[Op]) {
    if ops.is_empty() {
        return;
    }
    let mut harness = Harness::new();
    for op in ops {
        harness.run(op);
        assert!(harness.world.violations.is_empty(), "after {op:?}: {:?}", harness.world.violations);
        harness.check_ref_counts();
        harness.check_round_trip();
    }
    harness.settle();
    harness.check();
}

/// Kubernetes as the API server keeps it: the last object of each key.
#[derive(Default)]
struct Objects {
    services: BTreeMap<(String, String), model::Service>,
    slices: BTreeMap<(String, String), model::EndpointSlice>,
    nodes: BTreeMap<String, model::Node>,
    pods: BTreeMap<(String, String), model::Pod>,
}

impl Objects {
    fn see(&mut self, o: &Observation) {
        let key = |k: &model::ObjectKey| (k.namespace.to_string(), k.name.to_string());
        match o {
            Observation::ServiceUpserted(s) => {
                self.services.insert((s.namespace.clone(), s.name.clone()), s.clone());
            }
            Observation::ServiceDeleted(k) => {
                self.services.remove(&key(k));
            }
            Observation::SliceUpserted(s) => {
                self.slices.insert((s.namespace.clone(), s.name.clone()), s.clone());
            }
            Observation::SliceDeleted(k) => {
                self.slices.remove(&key(k));
            }
            Observation::NodeUpserted(n) => {
                self.nodes.insert(n.name.clone(), n.clone());
            }
            Observation::NodeDeleted(name) => {
                self.nodes.remove(name);
            }
            Observation::PodUpserted(p) => {
                self.pods.insert((p.namespace.clone(), p.name.clone()), p.clone());
            }
            Observation::PodDeleted(k) => {
                self.pods.remove(&key(k));
            }
            Observation::ListsComplete => {}
        }
    }

    fn list(&self) -> Vec<Observation> {
        let mut all: Vec<Observation> = self.nodes.values().cloned().map(Observation::NodeUpserted).collect();
        all.extend(self.services.values().cloned().map(Observation::ServiceUpserted));
        all.extend(self.slices.values().cloned().map(Observation::SliceUpserted));
        all.extend(self.pods.values().cloned().map(Observation::PodUpserted));
        all.push(Observation::ListsComplete);
        all
    }
}

fn failed(status: u16, code: &str) -> Outcome {
    Outcome::Failed(model::Failure { status, code: Some(code.into()), retry_after_ms: None, message: code.into() })
}

/// ARM's subscription write bucket as the tracker's answers report it: 200 writes refilled at 10
/// a second, spent by each write answered and, now and then, by another client of the
/// subscription; the figure each `complete` carries.
#[derive(Default)]
struct ArmBucket {
    spent: u32,
    at_ms: u64,
}

impl ArmBucket {
    /// The figure after `writes` more at `now` (a clock that went back refills nothing).
    fn answer(&mut self, now: u64, writes: usize) -> Option<u32> {
        if writes == 0 {
            return None;
        }
        let refilled = u32::try_from(now.saturating_sub(self.at_ms) / 100).unwrap_or(u32::MAX);
        self.at_ms = self.at_ms.max(now);
        let writes = u32::try_from(writes).unwrap_or(u32::MAX);
        self.spent = self.spent.saturating_sub(refilled).saturating_add(writes).min(200);
        Some(200 - self.spent)
    }
}

/// Part A's world: the tracker, Azure (the model's [`World`]), Kubernetes ([`Objects`]).
pub struct Hostile {
    /// ARM's figures for `complete` (the bucket is not enforced: the answers say what happened).
    arm: ArmBucket,
    tracker: Tracker,
    config: clb_guest::Config,
    azure: World,
    objects: Objects,
    /// Watch events the tracker's writes caused, not yet delivered.
    pending: Vec<Observation>,
    in_flight: Vec<Issued>,
    answered: BTreeSet<u64>,
    /// Service identity → the UID spelling and key it belongs to; identities whose object is gone.
    uids: BTreeMap<String, (String, (String, String))>,
    dead: BTreeSet<String>,
    /// A pod was refused for an egress label equal to a Service's UID.
    collided: bool,
    /// The host's clock went back at some point (the tracker's clock then runs ahead of it).
    stepped_back: bool,
    /// The host's clock was within [`NEAR_THE_END_MS`] of `u64::MAX` since the tracker was last
    /// made from its state: the tracker's clock is there for good (it never goes back), whatever
    /// the host's says now, and a wait longer than what is left of time never ends.
    ended: bool,
    now: u64,
    /// An answer claimed a 404 the world did not give, or a literal outcome answered a command.
    lied: bool,
    /// Something was refused for good (400, 422, a terminal code).
    refused: bool,
    /// NRP was read (truthfully) since the last refusal: a refused batch leaves the mirror
    /// uncertain until then.
    read_since_refusal: bool,
}

impl Hostile {
    fn absorb(&mut self, step: model::Step) {
        let collision = clb_guest::tracker::egress::identities::reason::EGRESS_LABEL_COLLISION;
        self.collided |=
            step.commands.iter().any(|c| matches!(&c.command, Command::EmitEvent(e) if e.reason == collision));
        self.in_flight.extend(step.commands);
    }

    /// Delivers the watch events of the tracker's own writes: already applied to [`Objects`].
    fn deliver_pending(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        let step = self.tracker.observe(self.now, pending);
        self.absorb(step);
    }

    /// A change in Kubernetes, delivered after the watch events still pending (a watch keeps
    /// each object's events in order).
    fn observe(&mut self, batch: Vec<Observation>) {
        // A UID names one object, once (the API server's rule; the tracker's identities are
        // UIDs lower-cased): a Service whose identity belongs to another UID spelling or key,
        // or to an object that is gone, cannot be observed, and is not delivered.
        let mut delivered = std::mem::take(&mut self.pending);
        for o in batch {
            if let Observation::ServiceUpserted(s) = &o {
                let key = (s.namespace.clone(), s.name.clone());
                let identity = s.identity();
                match self.uids.get(&identity) {
                    None => {
                        // A new object under a key replaces the one there.
                        if let Some(old) = self.objects.services.get(&key) {
                            self.dead.insert(old.identity());
                        }
                        self.uids.insert(identity, (s.uid.clone(), key));
                    }
                    Some((uid, owner)) if *uid == s.uid && *owner == key && !self.dead.contains(&identity) => {}
                    Some(_) => continue,
                }
            }
            if let Observation::ServiceDeleted(k) = &o
                && let Some(old) = self.objects.services.get(&(k.namespace.to_string(), k.name.to_string()))
            {
                self.dead.insert(old.identity());
            }
            self.objects.see(&o);
            delivered.push(o);
        }
        let step = self.tracker.observe(self.now, delivered);
        self.absorb(step);
    }

    /// What Kubernetes does with an egress pod's finalizer: the same UID guard, and a pod being
    /// deleted goes with its last finalizer.
    fn pod_finalizer(&mut self, target: &model::ObjectRef, finalizer: &str, present: bool) -> Outcome {
        let key = (target.namespace.to_string(), target.name.to_string());
        let Some(pod) = self.objects.pods.get_mut(&key) else { return failed(404, "NotFound") };
        if pod.uid != target.uid.as_str() {
            return failed(409, UID_MISMATCH);
        }
        let had = pod.finalizers.iter().any(|f| f == finalizer);
        if had == present {
            return Outcome::Ok;
        }
        if present {
            if pod.deleting {
                return failed(422, "Invalid");
            }
            pod.finalizers.push(finalizer.to_owned());
        } else {
            pod.finalizers.retain(|f| f != finalizer);
        }
        if pod.deleting && pod.finalizers.is_empty() {
            self.objects.pods.remove(&key);
            self.pending.push(Observation::PodDeleted(model::ObjectKey::new(&key.0, &key.1)));
        } else {
            self.pending.push(Observation::PodUpserted(pod.clone()));
        }
        Outcome::Ok
    }

    /// What Kubernetes does with a status or finalizer write.
    fn kubernetes(&mut self, command: &Command) -> Outcome {
        if let Command::SetFinalizer { service, finalizer, present } = command
            && service.kind.as_str() == "Pod"
        {
            return self.pod_finalizer(service, finalizer, *present);
        }
        let (target, change): (&model::ObjectRef, ServiceWrite) = match command {
            Command::PatchServiceStatus { service, ingress_ips } => {
                let ips = ingress_ips.clone();
                (
                    service,
                    Box::new(move |s: &mut model::Service| {
                        s.ingress_ips = ips.clone();
                        Ok(())
                    }),
                )
            }
            Command::SetFinalizer { service, finalizer, present } => {
                let (finalizer, present) = (finalizer.clone(), *present);
                (
                    service,
                    Box::new(move |s: &mut model::Service| {
                        let had = s.finalizers.contains(&finalizer);
                        if present && !had {
                            if s.deleting {
                                return Err(failed(422, "Invalid"));
                            }
                            s.finalizers.push(finalizer.clone());
                        } else if !present {
                            s.finalizers.retain(|f| *f != finalizer);
                        }
                        Ok(())
                    }),
                )
            }
            _ => return Outcome::Ok, // an Event
        };
        let key = (target.namespace.to_string(), target.name.to_string());
        let Some(service) = self.objects.services.get_mut(&key) else { return failed(404, "NotFound") };
        if service.uid != target.uid.as_str() {
            return failed(409, UID_MISMATCH);
        }
        let before = service.clone();
        if let Err(refused) = change(service) {
            return refused;
        }
        if service.deleting && service.finalizers.is_empty() {
            self.objects.services.remove(&key);
            self.dead.insert(target.uid.to_ascii_lowercase());
            self.pending.push(Observation::ServiceDeleted(model::ObjectKey::new(&key.0, &key.1)));
        } else if *service != before {
            self.pending.push(Observation::ServiceUpserted(service.clone()));
        }
        Outcome::Ok
    }

    /// Carries a command out truthfully.
    fn truth(&mut self, command: &Command) -> Outcome {
        match command {
            Command::EmitEvent(_) | Command::PatchServiceStatus { .. } | Command::SetFinalizer { .. } => {
                self.kubernetes(command)
            }
            Command::ReadNrp => {
                self.read_since_refusal = true;
                self.azure.carry_out(command)
            }
            _ => self.azure.carry_out(command),
        }
    }

    fn note(&mut self, failure: &model::Failure) {
        // A 404, or the host's UID guard saying the object is another one now (409
        // `UIDMismatch`), tells the tracker the object it wrote about is gone: a lie when it is not.
        if failure.object_gone() {
            self.lied = true;
        }
        const TERMINAL: &[&str] =
            &["InvalidParameter", "QuotaExceeded", "PublicIPCountLimitReached", "MaxPublicIpCountLimitReached"];
        let code = failure.code.as_deref().unwrap_or("");
        if matches!(failure.status, 400 | 422)
            || TERMINAL.contains(&code)
            || code == "RulesUseSameBackendPortProtocolAndPool"
            || code == "ServiceWithOverlayMappingsCannotBeDeleted"
        {
            self.refused = true;
            self.read_since_refusal = false;
        }
    }

    fn answer(&mut self, issued: &Issued, answer: &Answer) -> Outcome {
        let to_model = |f: &wit::Failure| match outcome_to_model(&wit::Outcome::Failed(f.clone())) {
            Outcome::Failed(f) => f,
            _ => unreachable!(),
        };
        match answer {
            Answer::Truth => self.truth(&issued.command),
            Answer::FailBefore(f) => {
                let f = to_model(f);
                self.note(&f);
                Outcome::Failed(f)
            }
            Answer::FailAfter(f) => {
                let f = to_model(f);
                self.note(&f);
                let _ = self.truth(&issued.command);
                Outcome::Failed(f)
            }
            Answer::Literal(o) => {
                let o = outcome_to_model(o);
                match &o {
                    Outcome::Failed(f) => self.note(f),
                    _ => {
                        self.lied = true;
                        self.refused = true;
                    }
                }
                o
            }
        }
    }

    fn step(&mut self, step: &Step) {
        match step {
            Step::Observe(batch) => self.observe(batch.iter().map(observation_to_model).collect()),
            Step::Big(slice) => {
                self.observe(vec![observation_to_model(&wit::Observation::SliceUpserted(slice.clone()))])
            }
            Step::Answer(answers) => {
                let (mut results, mut writes) = (Vec::new(), 0);
                for (index, answer) in answers {
                    if self.in_flight.is_empty() {
                        break;
                    }
                    let issued = self.in_flight.remove(usize::from(*index) % self.in_flight.len());
                    writes += usize::from(issued.command.writes_arm());
                    results.push((issued.id, self.answer(&issued, answer)));
                    self.answered.insert(issued.id);
                }
                let figure = self.arm.answer(self.now, writes);
                let step = self.tracker.complete_paced(self.now, results, figure);
                self.absorb(step);
            }
            Step::Stray(answers) => {
                // Ids answered already, or far beyond any the tracker issued: never in flight.
                let answered: Vec<u64> = self.answered.iter().copied().collect();
                let results = answers
                    .iter()
                    .map(|(id, outcome)| {
                        let id = if answered.is_empty() || id % 2 == 0 {
                            id | (1 << 63)
                        } else {
                            answered[(id / 2) as usize % answered.len()]
                        };
                        (id, outcome_to_model(outcome))
                    })
                    .collect();
                let step = self.tracker.complete(self.now, results);
                self.absorb(step);
            }
            Step::Tick => {
                let step = self.tracker.tick(self.now);
                self.absorb(step);
            }
            Step::Time(t) => {
                let before = self.now;
                self.now = match *t {
                    Time::Forward(ms) => self.now.saturating_add(ms),
                    Time::Back(ms) => self.now.saturating_sub(ms),
                    Time::Still => self.now,
                    Time::Set(ms) => ms,
                };
                self.stepped_back |= self.now < before;
                self.ended |= near_the_end(self.now);
            }
            Step::RoundTrip => self.round_trip(),
            Step::Deliver => self.deliver_pending(),
            Step::Relist => {
                self.pending.clear();
                let all = self.objects.list();
                self.observe(all);
            }
        }
    }

    fn round_trip(&mut self) {
        self.tracker = assert_round_trip(&self.tracker, &self.config, self.now, !self.stepped_back);
        // An imported tracker's clock starts from the host's.
        self.ended = near_the_end(self.now);
    }

    /// Every command answered truthfully, time running, until the tracker is idle; false when it
    /// is not within the bound after a lie (told that a public IP exists that does not, it
    /// rightly retries its load balancer for ever), a panic when it is not without one.
    fn settle(&mut self) -> bool {
        // The last answers given, for the report of a tracker that does not settle.
        let mut last: std::collections::VecDeque<String> = std::collections::VecDeque::new();
        for _ in 0..SETTLE_ROUNDS {
            if !self.in_flight.is_empty() {
                let issued = std::mem::take(&mut self.in_flight);
                let results: Vec<(u64, Outcome)> = issued.iter().map(|i| (i.id, self.truth(&i.command))).collect();
                let figure = self.arm.answer(self.now, issued.iter().filter(|i| i.command.writes_arm()).count());
                for (issued, (_, outcome)) in issued.iter().zip(&results) {
                    if last.len() == 8 {
                        last.pop_front();
                    }
                    last.push_back(format!("at {}: {:?} -> {outcome:?}", self.now, issued.command));
                }
                let step = self.tracker.complete_paced(self.now, results, figure);
                self.absorb(step);
                continue;
            }
            if !self.pending.is_empty() {
                self.deliver_pending();
                continue;
            }
            let step = self.tracker.tick(self.now);
            let (wake, idle) = (step.wake_at_ms, step.idle);
            self.absorb(step);
            // Idle as the host sees it: nothing in flight, nothing to do but the resync.
            if self.in_flight.is_empty() && idle {
                return true;
            }
            if self.in_flight.is_empty() {
                let next = wake.filter(|w| *w > self.now).unwrap_or(self.now.saturating_add(1_000));
                self.now = next.min(self.now.saturating_add(60_000));
                self.ended |= near_the_end(self.now);
            }
        }
        // A refused location waits for the next read of NRP, and there is none at the end of
        // time (the tracker's clock is the host's, or ahead of it after a step back). And once
        // the tracker's clock is near `u64::MAX` (the host's was, even if it went back since) too
        // little time is left for a write budget that is empty (spent by a burst, or emptied by
        // a 429) to refill. No host's clock gets there; the harness's does.
        let end_of_time = self.now > u64::MAX / 2 || self.stepped_back;
        if self.lied || (self.refused && end_of_time) || self.ended {
            return false;
        }
        panic!(
            "the tracker did not settle with every command answered: {:#?}\nthe last answers:\n{}",
            self.tracker,
            Vec::from(last).join("\n")
        );
    }

    fn check(&mut self) {
        // P2: a quiet tracker sends nothing more.
        let step = self.tracker.tick(self.now);
        assert!(step.commands.is_empty(), "P2: a quiet tracker sent {:?}", step.commands);
        // P4: the reference counts are the pods'.
        let egress = self.tracker.egress();
        assert_eq!(egress.recount(), *egress.ref_counts(), "P4: the counts agree with the pods");
        self.round_trip();
        if !self.lied {
            assert!(self.azure.violations.is_empty(), "P5/P6 or ordering violated: {:?}", self.azure.violations);
            if !self.refused || self.read_since_refusal {
                assert_eq!(self.tracker.nrp_view(), self.azure.nrp, "the mirror equals NRP");
            }
            if !self.refused {
                assert_eq!(self.azure.nrp, self.tracker.desired_view(), "P1: NRP holds what the tracker wants");
            }
        }
        if self.lied {
            return;
        }
        if self.collided {
            // A pod refused for a label that collided with a Service's UID is re-admitted only
            // when it is read again, by design (egress.rs): once the Service is gone, the first
            // re-list writes its egress addresses. P3 holds from the second.
            let all = self.objects.list();
            self.observe(all);
            if !self.settle() {
                panic!("the tracker did not settle after a re-list");
            }
        }
        // P3: every object seen again changes nothing. (After a 404 it did not earn the tracker
        // rightly provisions again a Service it was told is gone.)
        let all = self.objects.list();
        let before = self.tracker.clone();
        let step = self.tracker.observe(self.now, all);
        let writes: Vec<&Command> =
            step.commands.iter().map(|c| &c.command).filter(|c| !matches!(c, Command::EmitEvent(_))).collect();
        assert!(
            writes.is_empty(),
            "P3: seeing every object again wrote {writes:?}\nServices: {:#?}\ntracker before: {before:#?}",
            self.objects.services
        );
    }
}

/// Part A.
pub fn run_hostile(program: &Program) {
    let config = config_to_model(&program.config);
    let Ok(tracker) = Tracker::create(config.clone()) else { return };
    let now = 1_700_000_000_000;
    let mut world = Hostile {
        arm: ArmBucket::default(),
        tracker,
        config,
        azure: World { now, ..World::default() },
        objects: Objects::default(),
        pending: Vec::new(),
        in_flight: Vec::new(),
        answered: BTreeSet::new(),
        uids: BTreeMap::new(),
        dead: BTreeSet::new(),
        collided: false,
        stepped_back: false,
        ended: false,
        now,
        lied: false,
        refused: false,
        read_since_refusal: false,
    };
    for (index, step) in program.steps.iter().enumerate() {
        world.step(step);
        // The round-trip invariant after every few steps, the tracker left as it is (a step that
        // is a round trip replaces it with the import).
        if index % ROUND_TRIP_EVERY == ROUND_TRIP_EVERY - 1 {
            assert_round_trip(&world.tracker, &world.config, world.now, !world.stepped_back);
        }
    }
    // The initial lists end at the latest here: a tracker waits for them before it writes.
    world.observe(vec![Observation::ListsComplete]);
    // Idle, then a resync period later idle again: the periodic read has repaired the mirror.
    if world.settle() {
        world.now = world.now.saturating_add(clb_guest::tracker::timing::RESYNC_INTERVAL_MS);
        if world.settle() {
            world.check();
        }
    }
}

/// How near the end of `u64` time the harness's clock may come before a wait can outlast time:
/// a day, more than any write budget's refill or backoff the tracker waits for.
const NEAR_THE_END_MS: u64 = 86_400_000;

fn near_the_end(now: u64) -> bool {
    now >= u64::MAX - NEAR_THE_END_MS
}
