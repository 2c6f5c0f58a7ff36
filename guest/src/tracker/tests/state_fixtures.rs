//! The bytes of every state version, pinned before the state format moves apart from the
//! in-memory layout: one tracker state holding every part each version added, built through the
//! tracker's inputs alone ([`every_part`]), exported by each version's exporter and compared with
//! `tests/fixtures/state/v<N>-every-part.bin`; and every fixture, version 1's too, imports as its
//! version says a state of it does. `CLB_BLESS_STATE_FIXTURES=1` writes the fixtures from today's
//! exporters instead of comparing (then run again without it).

use super::super::egress::finalizers::FINALIZER as POD_FINALIZER;
use super::upstream_outbound::{IDENTITY, pod};
use super::*;
use std::path::PathBuf;

/// The Services of the state, all in namespace `default`: (UID, name).
const WEB: (&str, &str) = (UID, "web");
const OLD: (&str, &str) = ("0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e02", "old");
const FLAKY: (&str, &str) = ("0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e03", "flaky");
const ADOPTED: (&str, &str) = ("0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e04", "adopted");
/// Another controller's service in NRP: left alone, kept as foreign.
const FOREIGN: &str = "aks-managed-outbound";
/// An egress identity whose teardown ended a moment ago.
const TORN_DOWN: &str = "egress-gone";
/// ARM's remaining-writes figure before the first write.
const ARM_WRITES_LEFT: u32 = 150;
/// The versions with a fixture of [`every_part`] (version 1's is older: `v1-small-cluster.bin`).
const VERSIONS: std::ops::RangeInclusive<u32> = 2..=STATE_VERSION;

fn service((uid, name): (&str, &str), backend_port: i32) -> Service {
    Service { name: name.into(), ..ported(uid, &[(TCP, 80, to(backend_port))], &[]) }
}

fn slice((uid, name): (&str, &str), endpoints: &[(&str, &str)]) -> EndpointSlice {
    EndpointSlice { name: format!("{name}-1"), owner_service_uid: Some(uid.into()), ..slice_on(endpoints) }
}

fn node(name: &str, ip: &str) -> Observation {
    Observation::NodeUpserted(Node { name: name.into(), internal_ips: vec![ip.into()] })
}

fn load_balancer_of(command: &Command, (uid, _): (&str, &str)) -> bool {
    matches!(command, Command::PutLoadBalancer(lb) if lb.name.as_str() == uid)
}

fn public_ip_of(command: &Command, (uid, _): (&str, &str)) -> bool {
    matches!(command, Command::PutPublicIp(ip) if ip.name.as_str() == format!("{uid}-pip"))
}

/// ARM's inventory at start-up: the public IP and load balancer of [`ADOPTED`], as a controller
/// before a restart left them.
fn inventory() -> ArmInventory {
    let config = LbConfig::for_service(&service(ADOPTED, 8080));
    ArmInventory {
        public_ips: vec![ListedPublicIp {
            name: config.public_ip.name.to_string(),
            version: config.public_ip.version,
            address: Some("20.0.0.5".into()),
            as_put: true,
        }],
        load_balancers: vec![ListedLoadBalancer {
            name: config.load_balancer.name.to_string(),
            shape: Some(config.load_balancer),
        }],
        nat_gateways: Vec::new(),
    }
}

/// Azure and the API server: every command answered as it goes well, except the first each of
/// `fail_once` matches (a 500) and the first each of `hold` matches (left in flight); every
/// answer to a step with an ARM write carries ARM's remaining-writes figure.
struct World {
    remaining: u32,
    fail_once: Vec<fn(&Command) -> bool>,
    hold: Vec<fn(&Command) -> bool>,
    held: Vec<u64>,
}

impl World {
    fn answer(command: &Command) -> Outcome {
        match command {
            Command::ReadNrp => Outcome::NrpSnapshot(NrpState {
                services: [(ADOPTED.0, "Inbound"), (FOREIGN, "Outbound")]
                    .map(|(name, service_type)| NrpService {
                        name: name.into(),
                        service_type: service_type.into(),
                        backend_pools: vec![],
                        is_default: false,
                    })
                    .into(),
                locations: vec![],
            }),
            Command::ReadArm => Outcome::ArmInventory(inventory()),
            Command::PutPublicIp(_) => Outcome::PublicIpAddress("20.0.0.1".into()),
            _ => Outcome::Ok,
        }
    }

    /// Answers `step`'s commands and every one that follows at `now`; returns the last step.
    fn run(&mut self, tracker: &mut Tracker, now: u64, mut step: Step) -> Step {
        for _ in 0..1_000 {
            let (mut results, mut figure) = (Vec::new(), None);
            for issued in &step.commands {
                let command = &issued.command;
                if let Some(i) = self.hold.iter().position(|hold| hold(command)) {
                    self.hold.remove(i);
                    self.held.push(issued.id);
                    continue;
                }
                let outcome = match self.fail_once.iter().position(|fail| fail(command)) {
                    Some(i) => {
                        self.fail_once.remove(i);
                        failed(500)
                    }
                    None => Self::answer(command),
                };
                if command.writes_arm() {
                    self.remaining -= 1;
                    figure = Some(self.remaining);
                }
                results.push((issued.id, outcome));
            }
            if results.is_empty() {
                return step;
            }
            step = tracker.complete_paced(now, results, figure);
        }
        panic!("the tracker kept issuing commands");
    }
}

/// One state with every part each version added, built through the tracker's inputs, with
/// nothing in flight that an older version could not hold (no outbound or pod finalizer command,
/// no read of ARM, one address-location batch):
///
/// * version 1: nodes n1…n3; four Services with their EndpointSlices: `web` created with two
///   endpoints in NRP (n1, n2), `old` turned ClusterIP and pending deletion with the batch that
///   drains its endpoint in flight, `flaky` creating and backing off after its public IP's PUT
///   failed, `adopted` (found whole in ARM's inventory and NRP) updating to a new backend port
///   with its load balancer's PUT in flight; a foreign service in NRP;
/// * version 2: two egress pods carrying `egress-c` on n3, registered in NRP;
/// * version 4: the ARM inventory, read once after a failure, then settled;
/// * version 5: write budgets partly spent;
/// * version 6: `egress-c`'s outbound lifecycle, created;
/// * version 7: both pods held by the pod finalizer (one added, one already there);
/// * version 8: the pace ARM's remaining-writes figures set;
/// * version 9: the figures of every attempt;
/// * version 10: an identity whose teardown ended, remembered. Set directly, not through the
///   inputs: a teardown run here would change the parts every earlier version holds, and so
///   their fixtures' bytes.
fn every_part() -> Tracker {
    let mut tracker = Tracker::create(clb()).unwrap();
    let mut world = World {
        remaining: ARM_WRITES_LEFT,
        fail_once: vec![|c| *c == Command::ReadArm, |c| public_ip_of(c, FLAKY)],
        hold: Vec::new(),
        held: Vec::new(),
    };
    let holding = Pod { finalizers: vec![POD_FINALIZER.into()], ..pod("q", "10.244.2.11") };
    let observations = vec![
        node("n1", "10.224.0.4"),
        node("n2", "10.224.0.5"),
        node("n3", "10.224.0.6"),
        Observation::ServiceUpserted(service(WEB, 8080)),
        Observation::SliceUpserted(slice(WEB, &[("10.244.0.5", "n1"), ("10.244.1.5", "n2")])),
        Observation::ServiceUpserted(service(OLD, 8080)),
        Observation::SliceUpserted(slice(OLD, &[("10.244.0.7", "n1")])),
        Observation::ServiceUpserted(service(FLAKY, 8080)),
        Observation::ServiceUpserted(service(ADOPTED, 8080)),
        Observation::PodUpserted(pod("p", "10.244.2.10")),
        Observation::PodUpserted(holding),
        Observation::ListsComplete,
    ];
    // NRP is read, then ARM, which fails once and is read again after its backoff.
    let step = tracker.observe(NOW, observations);
    let step = world.run(&mut tracker, NOW, step);
    assert_eq!((tracker.startup.arm.settled, tracker.startup.arm.read_retries), (false, 1), "{step:?}");
    let now = step.wake_at_ms.expect("a wake-up for the second read of ARM");
    let step = tracker.tick(now);
    let step = world.run(&mut tracker, now, step);
    assert!(tracker.startup.arm.settled, "{step:?}");
    // `old` goes, and `adopted` changes its backend port.
    let old = Service { service_type: Some("ClusterIP".into()), ..service(OLD, 8080) };
    world.hold.push(is_location_update);
    world.hold.push(|c| load_balancer_of(c, ADOPTED));
    let changes = vec![Observation::ServiceUpserted(old), Observation::ServiceUpserted(service(ADOPTED, 8081))];
    let step = tracker.observe(now, changes);
    let step = world.run(&mut tracker, now, step);
    assert!(world.hold.is_empty() && world.fail_once.is_empty(), "{step:?}");
    assert_eq!(world.held.len(), 2);

    let phases = [WEB, OLD, FLAKY, ADOPTED].map(|(uid, _)| tracker.phase(uid));
    let expected = [Phase::Created, Phase::DeletionPending, Phase::CreationInProgress, Phase::UpdateInProgress];
    assert_eq!(phases, expected.map(Some));
    assert_eq!(tracker.inbound.lifecycles[FLAKY.0].attempt.retries, 1, "flaky backs off");
    assert!(tracker.inbound.lifecycles[FLAKY.0].attempt.in_flight.is_none());
    let in_flight: Vec<&InFlight> = tracker.outbox.in_flight.values().collect();
    assert_eq!(in_flight.len(), 2, "{in_flight:?}");
    assert!(
        in_flight.iter().all(|f| matches!(f, InFlight::Service { .. } | InFlight::Locations(_))),
        "nothing an older version cannot hold: {in_flight:?}"
    );
    assert_eq!(tracker.nrp.sync.batches_in_flight.len(), 1);
    assert!(tracker.nrp.sync.foreign.contains(FOREIGN));
    let view = tracker.nrp_view();
    assert!(view["10.224.0.4"].contains_key("10.244.0.5") && view["10.224.0.5"].contains_key("10.244.1.5"));
    assert!(view["10.224.0.6"]["10.244.2.10"].contains(IDENTITY), "{view:?}");
    assert!(tracker.egress.identities.is_registered(IDENTITY) && tracker.egress.identities.carries(IDENTITY));
    assert_eq!(tracker.egress.outbound.lifecycles[IDENTITY].phase, Phase::Created);
    assert_eq!(tracker.egress.finalizers.held_count(), 2);
    assert_ne!(tracker.budgets.buckets, Buckets::full(&clb().write_budgets()), "write budgets partly spent");
    assert!(tracker.budgets.pace.is_some());
    assert_ne!(tracker.figures, Default::default());
    tracker.egress.torn_down.record(TORN_DOWN, now);
    tracker
}

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/state")
}

fn fixture_path(version: u32) -> PathBuf {
    fixtures_dir().join(format!("v{version}-every-part.bin"))
}

fn blessing() -> bool {
    std::env::var("CLB_BLESS_STATE_FIXTURES").is_ok_and(|v| v == "1")
}

/// [`every_part`] as version `version` writes it.
fn export(tracker: &Tracker, version: u32) -> Vec<u8> {
    match version {
        2 => tracker.export_state_as(2),
        3 => tracker.export_state_as(3),
        4 => tracker.export_state_as(4),
        5 => tracker.export_state_as(5),
        6 => tracker.export_state_as(6),
        7 => tracker.export_state_as(7),
        8 => tracker.export_state_as(8),
        9 => tracker.export_state_as(9),
        STATE_VERSION => tracker.export_state().1,
        _ => panic!("no exporter of version {version}: teach format::export_older it and add a fixture"),
    }
}

/// Every fixture, version 1's first: as the files hold them (as today's exporters write them
/// while blessing, so that this does not race the test that writes the files).
fn fixtures() -> Vec<(u32, Vec<u8>)> {
    let v1 = std::fs::read(fixtures_dir().join("v1-small-cluster.bin")).unwrap();
    let tracker = blessing().then(every_part);
    let read = |version| match &tracker {
        Some(tracker) => export(tracker, version),
        None => std::fs::read(fixture_path(version)).unwrap_or_else(|e| {
            panic!("{}: {e} (CLB_BLESS_STATE_FIXTURES=1 writes it)", fixture_path(version).display())
        }),
    };
    std::iter::once((1, v1)).chain(VERSIONS.map(|version| (version, read(version)))).collect()
}

/// What an import of [`every_part`] at `version` holds: the tracker, with each part the version
/// lacks as the import starts it.
fn as_imported_from(version: u32, tracker: &Tracker) -> Tracker {
    let mut tracker = tracker.clone();
    if version < 10 {
        tracker.egress.torn_down = Default::default();
    }
    if version < 9 {
        tracker.figures = Default::default();
    }
    if version < 8 {
        tracker.budgets.pace = None;
    }
    if version < 7 {
        tracker.egress.finalizers = Default::default();
    }
    if version < 6 {
        tracker.egress.outbound = Default::default();
    }
    if version < 5 {
        tracker.budgets.buckets = Buckets::full(&clb().write_budgets());
    }
    if version < 4 {
        tracker.startup.arm = ArmSync::settled();
    }
    if version < 3 {
        // Version 2 did not keep when its batch was issued: at time 0.
        tracker.nrp.sync.batches_in_flight.values_mut().for_each(|at| *at = 0);
    }
    tracker
}

#[test]
fn every_state_version_exports_exactly_the_bytes_of_its_fixture() {
    let tracker = every_part();
    assert_eq!(tracker, every_part(), "the state is a function of the inputs alone");
    for version in VERSIONS {
        let bytes = export(&tracker, version);
        if version > 3 {
            let before = export(&tracker, version - 1);
            assert!(bytes.starts_with(&before), "version {version} is version {} and its new part", version - 1);
        }
        assert!(bytes.len() <= 6_144, "version {version}: {} bytes, keep the fixture small", bytes.len());
        let path = fixture_path(version);
        if blessing() {
            std::fs::write(&path, &bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        let fixture = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (CLB_BLESS_STATE_FIXTURES=1 writes it)", path.display()));
        assert!(
            bytes == fixture,
            "version {version} no longer writes {}: a change to the state's format needs a new version \
             (and a fixture of it), never new bytes for an old one",
            path.display()
        );
    }
}

#[test]
fn every_state_fixture_imports_as_its_version_implies_and_exports_the_current_version_as_a_fixed_point() {
    let fixtures = fixtures();
    let (_, current) = fixtures.last().unwrap();
    let full = Tracker::import_state(clb(), STATE_VERSION, current).expect("the current version's fixture");
    assert_eq!(full.export_state(), (STATE_VERSION, current.clone()), "the current fixture exports as itself");
    for (version, bytes) in &fixtures {
        let imported = Tracker::import_state(clb(), *version, bytes)
            .unwrap_or_else(|e| panic!("the version-{version} fixture does not import: {e:?}"));
        if *version > 1 {
            assert!(imported == as_imported_from(*version, &full), "version {version}: not the state it implies");
        }
        // Written at the current version, it imports as the same tracker, and writes the same again.
        let (written, payload) = imported.export_state();
        assert_eq!(written, STATE_VERSION);
        let again = Tracker::import_state(clb(), written, &payload).unwrap();
        assert!(again == imported, "version {version}: not the same tracker after a round trip");
        assert!(again.export_state().1 == payload, "version {version}: the export is not a fixed point");
        if *version == STATE_VERSION {
            assert!(payload == *current);
        }
    }
}

// Version 3 reshaped the NRP bookkeeping, so its payload does not read as version 2's at all;
// every other version added a part after the payload of the version before, left over when read
// as that version.
#[test]
fn every_state_fixture_offered_as_the_version_before_its_own_is_refused_as_corrupt() {
    for (version, bytes) in fixtures().into_iter().skip(1) {
        let older = version - 1;
        let why = corrupt(Tracker::import_state(clb(), older, &bytes));
        assert!(why.starts_with(&format!("state version {older}:")), "{why}");
        assert_eq!(why.contains("byte(s) after the payload"), version != 3, "version {version}: {why}");
    }
}
