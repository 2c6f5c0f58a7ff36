//! The `differential` target: one hostile [`Program`] through the native library and through
//! the built component (`clb_sandbox::BUILTIN_GUEST`) under wasmtime with the production limits
//! (`Limits::default()`). Every call must give the same answer, compared in the host's WIT
//! types (`clb_sandbox::native` converts the library's); a trap in the component where the native
//! library did not panic is a failure (a native panic is one too: the `tracker` target's).
//!
//! Answers are taken as the program says, lies included, and the same answers go to both: the
//! command ids agree as long as the outputs do. `Truth` is a plain success here (an address for
//! `put-public-ip`, an empty NRP for `read-nrp`, else `ok`). Each `service-upserted` also goes
//! through `admit-service` on both sides; each round trip exports both states (the bytes must
//! be equal) and imports each side's into a new tracker of the same side.

use crate::input::Dec;
use crate::program::{Answer, Program, Step, Time};
use clb_guest::tracker::{StateError, Tracker};
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::native::{
    component_admission, config_to_model, native_admission, observation_to_model, outcome_to_model, service_to_model,
    step_to_wit,
};
use clb_sandbox::{Limits, LoadedLogic, Runtime, Session};
use std::sync::OnceLock;
use wasmtime::component::ResourceAny;

/// The built-in component, compiled once per process, with the production limits.
pub fn logic() -> &'static LoadedLogic {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    static LOGIC: OnceLock<LoadedLogic> = OnceLock::new();
    LOGIC.get_or_init(|| {
        let runtime = RUNTIME.get_or_init(|| Runtime::new().expect("the engine starts"));
        runtime.load(clb_sandbox::BUILTIN_GUEST, Limits::default()).expect("the built-in guest loads")
    })
}

/// The fuzz target.
pub fn differential(data: &[u8]) {
    let program = Dec::new(data).program();
    run(&program);
}

fn state_error(e: &StateError) -> String {
    match e {
        StateError::UnsupportedVersion(v) => format!("unsupported-version({v})"),
        StateError::Corrupt(why) => format!("corrupt({why})"),
        StateError::InvalidConfig(c) => format!("invalid-config({}/{}/{})", c.field, c.reason, c.message),
    }
}

fn wit_state_error(e: &wit::StateError) -> String {
    match e {
        wit::StateError::UnsupportedVersion(v) => format!("unsupported-version({v})"),
        wit::StateError::Corrupt(why) => format!("corrupt({why})"),
        wit::StateError::InvalidConfig(c) => format!("invalid-config({}/{}/{})", c.field, c.reason, c.message),
    }
}

/// The component's answer, or the failure of the run when it trapped.
fn ok<T>(call: &str, result: Result<T, clb_sandbox::GuestError>) -> T {
    result.unwrap_or_else(|e| panic!("the component failed in {call} where the native library did not: {e}"))
}

struct Sides {
    native: Tracker,
    session: Session,
    component: ResourceAny,
    config: wit::Config,
    now: u64,
    in_flight: Vec<wit::Issued>,
    seen: Vec<wit::Observation>,
}

impl Sides {
    fn compare(&mut self, call: &str, native: clb_guest::model::Step, component: wit::Step) {
        let native = step_to_wit(native);
        assert_eq!(native, component, "{call} at {}: native and component differ", self.now);
        self.in_flight.extend(component.commands);
        // The figures too, after every step (both sides read only: `stats` takes `&self`).
        let native: wit::TrackerStats = self.native.stats(self.now).into();
        let component = ok("stats", self.session.tracker_stats(self.component, self.now));
        assert_eq!(native, component, "stats after {call} at {}: native and component differ", self.now);
    }

    fn observe(&mut self, batch: Vec<wit::Observation>) {
        let model = batch.iter().map(observation_to_model).collect();
        let native = self.native.observe(self.now, model);
        let component = ok("observe", self.session.tracker_observe(self.component, self.now, &batch));
        self.compare("observe", native, component);
        self.seen.extend(batch);
    }

    fn complete(&mut self, results: Vec<(u64, wit::Outcome)>) {
        // Any figure from ARM, the same to both: one of the ids answered, as a count of writes
        // left (past ARM's bucket of 200 now and then).
        let figure = results.first().map(|(id, _)| (id % 251) as u32);
        let model = results.iter().map(|(id, o)| (*id, outcome_to_model(o))).collect();
        let native = self.native.complete_paced(self.now, model, figure);
        let component = ok("complete", self.session.tracker_complete(self.component, self.now, &results, figure));
        self.compare("complete", native, component);
    }

    fn admit(&mut self, service: &wit::Service) {
        let native = native_admission(&config_to_model(&self.config), &service_to_model(service));
        let component = ok("admit-service", self.session.admit_service(&self.config, service));
        assert_eq!(native, component_admission(&component), "admit-service differs");
    }

    fn round_trip(&mut self) {
        let (version, payload) = self.native.export_state();
        let exported = ok("export-state", self.session.tracker_export(self.component));
        assert_eq!((version, &payload), (exported.version, &exported.payload), "export-state differs");
        let native = Tracker::import_state(config_to_model(&self.config), version, &payload);
        let component = ok("import-state", self.session.tracker_import(&self.config, &exported));
        match (native, component) {
            (Ok(native), Ok(component)) => {
                self.native = native;
                self.component = component;
            }
            (native, component) => panic!(
                "import-state of an exported state: native {:?}, component {:?}",
                native.map(|_| ()).map_err(|e| state_error(&e)),
                component.map(|_| ()).map_err(|e| wit_state_error(&e))
            ),
        }
    }

    fn step(&mut self, step: &Step) {
        match step {
            Step::Observe(batch) => {
                for o in batch {
                    if let wit::Observation::ServiceUpserted(s) = o {
                        self.admit(s);
                    }
                }
                self.observe(batch.clone());
            }
            Step::Big(slice) => self.observe(vec![wit::Observation::SliceUpserted(slice.clone())]),
            Step::Answer(answers) => {
                let mut results = Vec::new();
                for (index, answer) in answers {
                    if self.in_flight.is_empty() {
                        break;
                    }
                    let issued = self.in_flight.remove(usize::from(*index) % self.in_flight.len());
                    let outcome = match answer {
                        Answer::Truth => match issued.command {
                            wit::Command::PutPublicIp(_) => wit::Outcome::PublicIpAddress("20.0.0.7".into()),
                            wit::Command::ReadNrp => {
                                wit::Outcome::NrpSnapshot(wit::NrpState { services: vec![], locations: vec![] })
                            }
                            wit::Command::ReadArm => wit::Outcome::ArmInventory(wit::ArmInventory {
                                public_ips: vec![],
                                load_balancers: vec![],
                                nat_gateways: vec![],
                            }),
                            _ => wit::Outcome::Ok,
                        },
                        Answer::FailBefore(f) | Answer::FailAfter(f) => wit::Outcome::Failed(f.clone()),
                        Answer::Literal(o) => o.clone(),
                    };
                    results.push((issued.id, outcome));
                }
                self.complete(results);
            }
            Step::Stray(answers) => self.complete(answers.clone()),
            Step::Tick => {
                let native = self.native.tick(self.now);
                let component = ok("tick", self.session.tracker_tick(self.component, self.now));
                self.compare("tick", native, component);
            }
            Step::Time(t) => {
                self.now = match *t {
                    Time::Forward(ms) => self.now.saturating_add(ms),
                    Time::Back(ms) => self.now.saturating_sub(ms),
                    Time::Still => self.now,
                    Time::Set(ms) => ms,
                }
            }
            Step::RoundTrip => self.round_trip(),
            Step::Deliver => {}
            Step::Relist => {
                let mut all = std::mem::take(&mut self.seen);
                all.push(wit::Observation::ListsComplete);
                // Bounded: a re-list of a long program is its last few hundred observations.
                let keep = all.len().saturating_sub(256);
                self.observe(all.split_off(keep));
            }
        }
    }
}

/// Runs a program through both sides.
pub fn run(program: &Program) {
    let config = program.config.clone();
    let native = Tracker::create(config_to_model(&config));
    let mut session = logic().session().expect("a session of the built-in guest");
    let native_mode = clb_guest::validate_config(&config_to_model(&config));
    let component_mode = ok("validate-config", session.validate_config(&config));
    let native_mode = native_mode.map(|m| match m {
        clb_guest::Mode::ContainerLoadBalancer => wit::Mode::ContainerLoadBalancer,
        clb_guest::Mode::MultiSlbLocalServices => wit::Mode::MultiSlbLocalServices,
        clb_guest::Mode::Inactive => wit::Mode::Inactive,
    });
    assert_eq!(
        native_mode.as_ref().map_err(|e| (&e.field, &e.reason, &e.message)),
        component_mode.as_ref().map_err(|e| (&e.field, &e.reason, &e.message)),
        "validate-config differs"
    );
    let component = ok("tracker.create", session.tracker_create(&config));
    let (native, component) = match (native, component) {
        (Ok(n), Ok(c)) => (n, c),
        (Err(n), Err(c)) => {
            assert_eq!((n.field, n.reason, n.message), (c.field, c.reason, c.message), "create refused differently");
            return;
        }
        (n, c) => panic!("tracker.create: native {:?}, component {:?}", n.map(|_| ()), c.map(|_| ())),
    };
    let mut sides =
        Sides { native, session, component, config, now: 1_700_000_000_000, in_flight: Vec::new(), seen: Vec::new() };
    for step in &program.steps {
        sides.step(step);
    }
    sides.round_trip();
}
