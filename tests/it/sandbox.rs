//! The host never trusts the guest: hostile components are stopped or refused, each with a
//! typed error, and the host keeps serving.

use clb_sandbox::{GuestError, Limits, LoadError, LoadedLogic};
use clb_tests::*;
use std::time::Duration;

fn hostile(limits: Limits) -> LoadedLogic {
    runtime().load(HOSTILE_GUEST, limits).expect("the hostile guest is a valid component")
}

/// Asks the hostile guest to misbehave as `name` says, then proves the host still serves.
fn provoke(logic: &LoadedLogic, name: &str) -> GuestError {
    let config = read_config("clb.yaml");
    let mut service = read_service("etp-local.yaml");
    service.name = name.into();
    let mut session = logic.session().unwrap();
    let err = session.admit_service(&config, &service).expect_err("the guest misbehaves");
    // The trapped instance refuses further calls with a typed error ...
    let again = session.admit_service(&config, &read_service("etp-local.yaml")).unwrap_err();
    assert!(matches!(again, GuestError::Poisoned { .. }), "{again:?}");
    // ... and a fresh instance of the same logic serves normally.
    let mut fresh = logic.session().unwrap();
    let verdict = fresh.admit_service(&config, &read_service("etp-local.yaml")).unwrap();
    assert_eq!(component_admission(&verdict), "admitted");
    err
}

#[test]
fn an_endless_loop_is_stopped_by_the_fuel_budget() {
    let logic = hostile(Limits { fuel: 5_000_000, deadline: Duration::from_secs(600), ..Limits::default() });
    let err = provoke(&logic, "spin");
    assert!(matches!(err, GuestError::FuelExhausted { budget: 5_000_000, .. }), "{err:?}");
    assert_eq!(logic.stats().failures_fuel.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn an_endless_loop_is_stopped_by_the_epoch_deadline_when_fuel_is_plenty() {
    let logic = hostile(Limits { fuel: u64::MAX / 2, deadline: Duration::from_millis(50), ..Limits::default() });
    let err = provoke(&logic, "spin");
    assert!(matches!(err, GuestError::DeadlineExceeded { .. }), "{err:?}");
}

#[test]
fn a_memory_bomb_hits_the_cap_with_a_typed_error() {
    let cap = 32 << 20;
    let logic = hostile(Limits { memory_bytes: cap, ..Limits::default() });
    let err = provoke(&logic, "grow");
    match err {
        GuestError::MemoryCapExceeded { requested, cap: reported, .. } => {
            assert_eq!(reported, cap);
            assert!(requested > cap, "requested {requested}");
        }
        other => panic!("expected a memory cap error, got {other:?}"),
    }
}

// Upstream TestServiceUpdaterWorker_RecoversFromPanic.
#[test]
fn a_guest_panic_is_reported_with_its_message() {
    let err = provoke(&hostile(Limits::default()), "panic");
    match err {
        GuestError::Panicked { message, .. } => {
            assert!(message.contains("asked to panic by service shop/panic"), "{message}");
        }
        other => panic!("expected a panic, got {other:?}"),
    }
}

/// A component that asks for WASI: the host links none, so it must refuse it at load, naming
/// the import, before any of its code runs.
#[test]
fn a_component_importing_a_filesystem_or_sockets_is_refused_at_load_naming_the_import() {
    for import in ["wasi:filesystem/preopens@0.2.0", "wasi:sockets/tcp@0.2.0", "wasi:cli/environment@0.2.0"] {
        let wat = format!(r#"(component (import "{import}" (instance)))"#);
        let bytes = wat::parse_str(&wat).unwrap();
        match runtime().load(&bytes, Limits::default()) {
            Err(LoadError::ForbiddenImport { name }) => assert_eq!(name, import),
            Err(other) => panic!("{import}: wrong refusal {other}"),
            Ok(_) => panic!("{import}: a component importing it was loaded"),
        }
    }
}

#[test]
fn a_component_of_another_package_version_or_none_is_refused() {
    let empty = wat::parse_str("(component)").unwrap();
    let err = runtime().load(&empty, Limits::default()).err().expect("refused");
    assert!(matches!(err, LoadError::MissingExport { .. }), "{err}");
    // Before 1.0 the minor version is the compatibility line: a newer one and an older one.
    for version in ["0.15.0", "0.13.0"] {
        let wat = format!(r#"(component (import "clb:reconciler/diagnostics@{version}" (instance)))"#);
        let err = runtime().load(&wat::parse_str(&wat).unwrap(), Limits::default()).err().expect("refused");
        assert!(matches!(err, LoadError::ForbiddenImport { .. }), "{version}: {err}");
    }
}

#[test]
fn bytes_that_are_not_a_component_are_refused_with_a_clear_error() {
    let err = runtime().load(b"\0asm garbage", Limits::default()).err().expect("refused");
    assert!(matches!(err, LoadError::Invalid(_)), "{err}");
}

#[test]
fn the_built_in_guest_imports_only_what_the_host_grants() {
    let info = builtin().info();
    assert!(info.imports.iter().all(|(_, granted)| *granted), "{:?}", info.imports);
    assert!(info.imports.iter().all(|(name, _)| name.starts_with("clb:reconciler/")), "{:?}", info.imports);
    assert_eq!(info.package_version().map(|v| v.to_string()).as_deref(), Some("0.14.0"));
}

#[test]
fn limits_are_per_call_so_many_small_calls_never_add_up_to_a_failure() {
    // A budget that one validation fits in easily; a thousand calls on one instance must not
    // exhaust it, since each call starts with a full budget.
    let logic = runtime().load(clb_sandbox::BUILTIN_GUEST, Limits { fuel: 2_000_000, ..Limits::default() }).unwrap();
    let mut session = logic.session().unwrap();
    let (config, service) = (read_config("clb.yaml"), read_service("etp-local.yaml"));
    for _ in 0..1000 {
        session.admit_service(&config, &service).unwrap();
    }
}

/// The engine recycles guest memories (`clb_sandbox::linear_memory`): an instance after another
/// still sees its data segments, zeroes elsewhere, and traps past its memory's end.
#[cfg(unix)]
#[test]
fn an_instance_on_a_recycled_memory_sees_its_data_zeroes_elsewhere_and_traps_past_the_end() {
    use wasmtime::{Instance, Module, Store, Trap};
    let engine = runtime().engine();
    let wasm = wat::parse_str(
        r#"(module
            (memory (export "memory") 2)
            (data (i32.const 16) "segment")
            (func (export "load") (param i32) (result i32) local.get 0 i32.load8_u)
            (func (export "store") (param i32 i32) local.get 0 local.get 1 i32.store8)
            (func (export "grow") (param i32) (result i32) local.get 0 memory.grow))"#,
    )
    .unwrap();
    let module = Module::new(engine, wasm).unwrap();
    let recycled_before = runtime().memories().stats().recycled;
    // Instances one after the other, each writing over all it has; later ones run on the
    // memories of earlier ones once the zeroing thread has taken them back.
    for round in 0..20 {
        let mut store = Store::new(engine, ());
        store.set_fuel(u64::MAX).unwrap();
        store.set_epoch_deadline(u64::MAX / 2);
        let instance = Instance::new(&mut store, &module, &[]).unwrap();
        let load = instance.get_typed_func::<i32, i32>(&mut store, "load").unwrap();
        let store8 = instance.get_typed_func::<(i32, i32), ()>(&mut store, "store").unwrap();
        let grow = instance.get_typed_func::<i32, i32>(&mut store, "grow").unwrap();
        let text: Vec<u8> = (16..23).map(|at| load.call(&mut store, at).unwrap() as u8).collect();
        assert_eq!(text, b"segment", "round {round}: the data segment");
        let traps_at = |store: &mut Store<()>, at: i32| {
            let past = load.call(store, at).unwrap_err();
            assert_eq!(past.downcast_ref::<Trap>(), Some(&Trap::MemoryOutOfBounds), "round {round}: {past:?}");
        };
        traps_at(&mut store, 2 * 65536);
        assert_eq!(grow.call(&mut store, 1).unwrap(), 2);
        let end = 3 * 65536;
        traps_at(&mut store, end);
        for at in (0..end).step_by(4096).chain([end - 1]) {
            if !(16..23).contains(&at) {
                assert_eq!(load.call(&mut store, at).unwrap(), 0, "round {round}: byte {at} of a fresh instance");
            }
            store8.call(&mut store, (at, 0xab)).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(runtime().memories().stats().recycled > recycled_before, "some instance ran on a recycled memory");
}
