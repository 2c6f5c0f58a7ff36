//! Build-script support: compiles a guest crate of this workspace for `wasm32-unknown-unknown`
//! and encodes the core module as a component (what `wasm-tools component new` does).
//!
//! Used by `crates/sandbox/build.rs` (the built-in guest) and `tests/build.rs` (test-only guests), the
//! pattern of wasmtime's test-programs. The nested cargo uses its own target directory so it
//! never waits on the lock of the build that runs it.

use std::path::{Path, PathBuf};
use std::process::Command;

pub const WASM_TARGET: &str = "wasm32-unknown-unknown";

/// Makes sure the standard library for [`WASM_TARGET`] is installed for the toolchain running
/// this build, installing it with rustup when it is missing. `RUSTUP_AUTO_INSTALL=0` means a
/// `targets` line in `rust-toolchain.toml` alone installs nothing, so this is what does.
pub fn ensure_wasm_target() {
    let sysroot = match guest_toolchain() {
        Some(toolchain) => Command::new("rustup").args(["run", &toolchain, "rustc", "--print", "sysroot"]).output(),
        None => Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
            .args(["--print", "sysroot"])
            .output(),
    };
    let sysroot = sysroot.ok().filter(|o| o.status.success());
    let sysroot = sysroot.map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let installed = |root: &Path| root.join("lib/rustlib").join(WASM_TARGET).join("lib").is_dir();
    if sysroot.as_deref().is_some_and(installed) {
        return;
    }
    let toolchain = guest_toolchain().or_else(|| std::env::var("RUSTUP_TOOLCHAIN").ok());
    let mut add = Command::new("rustup");
    add.args(["target", "add", WASM_TARGET]);
    if let Some(toolchain) = &toolchain {
        add.args(["--toolchain", toolchain]);
    }
    let command_line = format!(
        "rustup target add {WASM_TARGET}{}",
        toolchain.as_deref().map(|t| format!(" --toolchain {t}")).unwrap_or_default()
    );
    match add.status() {
        Ok(status) if status.success() => {}
        Ok(status) => panic!("`{command_line}` failed ({status}); run it by hand, then build again"),
        Err(err) => {
            panic!("the {WASM_TARGET} target is missing and rustup could not be run ({err}); run `{command_line}`")
        }
    }
}

/// The toolchain to build guests with when it is not the one running the build:
/// `CLB_GUEST_TOOLCHAIN` (a rustup toolchain name). The fuzz build sets it (`fuzz/run.sh`,
/// `fuzz/.cargo/config.toml`): it runs on nightly, which has no `wasm32-unknown-unknown`
/// standard library installed here, while the guest is the pinned toolchain's either way.
fn guest_toolchain() -> Option<String> {
    println!("cargo:rerun-if-env-changed=CLB_GUEST_TOOLCHAIN");
    std::env::var("CLB_GUEST_TOOLCHAIN").ok().filter(|t| !t.is_empty())
}

/// One guest crate of the workspace to build as a component.
pub struct Guest<'a> {
    /// The cargo package name.
    pub package: &'a str,
    /// Cargo features to enable.
    pub features: &'a [&'a str],
    /// The file name of the component written into `OUT_DIR`.
    pub output: &'a str,
    /// The cargo profile: [`PROFILE`], or [`PROFILE_SMALL`] for a guest that must be small
    /// rather than fast.
    pub profile: &'a str,
}

/// The profile of the built-in guest (the workspace manifest says why its settings).
pub const PROFILE: &str = "guest";
/// The same, optimised for size.
pub const PROFILE_SMALL: &str = "guest-small";

/// The directory of the package whose build script runs, read when it runs. Never
/// `env!("CARGO_MANIFEST_DIR")` in a build script: that is the checkout the script was
/// compiled in, and checkouts sharing `CARGO_TARGET_DIR` share one compiled script, so every
/// other checkout would watch (and judge fresh by) the first one's files and embed a stale
/// guest.
pub fn package_dir() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run from a build script"))
}

/// Builds the guest and writes the component to `OUT_DIR/<output>`; returns its path.
/// `watch` names the files and folders whose change must rebuild it.
pub fn build_component(guest: &Guest<'_>, watch: &[&Path]) -> PathBuf {
    let manifest_dir = package_dir();
    let workspace = workspace_root(&manifest_dir);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("run from a build script"));
    // One nested target directory per checkout: two clones sharing CARGO_TARGET_DIR must never
    // read each other's guest (cargo uplifts both to the same file name).
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(|d| workspace.join(d).join("wasm-guests").join(checkout_key(&workspace)))
        .unwrap_or_else(|| out_dir.join("wasm-guests"));
    // Relative to the package, which cargo resolves against the checkout it builds: clones
    // that share CARGO_TARGET_DIR share this script's output, and with absolute paths one clone
    // would judge it fresh by another clone's files (a fresh clone of a changed guest then got
    // the old one whenever the previous clone's path still existed).
    // The workspace manifest holds the `guest` profile the build uses.
    let (lock, manifest) = (workspace.join("Cargo.lock"), workspace.join("Cargo.toml"));
    for path in watch.iter().copied().chain([lock.as_path(), manifest.as_path()]) {
        println!("cargo:rerun-if-changed={}", relative_to(&manifest_dir, path).display());
    }

    ensure_wasm_target();
    let mut build = match guest_toolchain() {
        Some(toolchain) => {
            let mut rustup = Command::new("rustup");
            rustup.args(["run", &toolchain, "cargo"]);
            // The running toolchain's own tools must not leak into the other one's build.
            rustup.env_remove("RUSTC").env_remove("RUSTUP_TOOLCHAIN").env_remove("RUSTDOC").env_remove("CARGO");
            rustup
        }
        None => Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())),
    };
    build
        .current_dir(&workspace)
        .args(["build", "--profile", guest.profile, "--target", WASM_TARGET, "-p", guest.package, "--target-dir"])
        .arg(&target_dir)
        // Flags meant for the host build must not leak into the guest's.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_TARGET_DIR")
        // Under `cargo clippy` the guest is still built, not linted: clippy's driver and its
        // `-D warnings` would otherwise wrap this build too and miss the cached artifacts.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .env_remove("CLIPPY_CONF_DIR");
    if !guest.features.is_empty() {
        build.args(["--features", &guest.features.join(",")]);
    }
    let output = build.output().unwrap_or_else(|e| panic!("could not run cargo for {}: {e}", guest.package));
    if !output.status.success() {
        panic!(
            "building the guest {} for {WASM_TARGET} failed:\n{}",
            guest.package,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let module_path =
        target_dir.join(WASM_TARGET).join(guest.profile).join(format!("{}.wasm", guest.package.replace('-', "_")));
    let module = std::fs::read(&module_path).unwrap_or_else(|e| panic!("reading {}: {e}", module_path.display()));
    let component = wit_component::ComponentEncoder::default()
        .module(&module)
        .and_then(|encoder| encoder.validate(true).encode())
        .unwrap_or_else(|e| panic!("encoding {} as a component: {e:?}", module_path.display()));
    let path = out_dir.join(guest.output);
    std::fs::write(&path, component).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    path
}

/// `path` relative to the directory `base` (both absolute, as build scripts get them).
fn relative_to(base: &Path, path: &Path) -> PathBuf {
    let (base, path) = (normalize(base), normalize(path));
    let common = base.iter().zip(path.iter()).take_while(|(a, b)| a == b).count();
    let up = base.iter().skip(common).map(|_| std::ffi::OsStr::new(".."));
    up.chain(path.iter().skip(common)).collect()
}

/// The path with its `..` and `.` components resolved lexically (the watch list writes
/// `tests/../wit`).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// A short stable name for a checkout's path (FNV-1a).
fn checkout_key(workspace: &Path) -> String {
    let hash = workspace
        .to_string_lossy()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
    format!("{hash:016x}")
}

fn workspace_root(manifest_dir: &Path) -> PathBuf {
    manifest_dir
        .ancestors()
        .find(|dir| std::fs::read_to_string(dir.join("Cargo.toml")).is_ok_and(|t| t.contains("[workspace]")))
        .unwrap_or(manifest_dir)
        .to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: both build scripts took their checkout from `env!`, so after another
    /// checkout sharing the target directory compiled the script, edits to the guest here were
    /// not seen and the benchmarks measured the other checkout's guest.
    #[test]
    fn the_workspace_build_scripts_find_their_checkout_when_they_run() {
        let workspace = workspace_root(&package_dir());
        for script in ["crates/sandbox/build.rs", "tests/build.rs"] {
            let text = std::fs::read_to_string(workspace.join(script)).unwrap();
            assert!(!text.contains("env!(\"CARGO_MANIFEST_DIR\")"), "{script} reads its checkout at compile time");
            assert!(text.contains("clb_build::package_dir()"), "{script}");
        }
    }

    #[test]
    fn watched_paths_are_written_relative_to_the_package_so_each_checkout_checks_its_own_files() {
        let cases = [
            ("/w/host", "/w/guest/src", "../guest/src"),
            ("/w/tests", "/w/tests/../wit", "../wit"),
            ("/w/tests", "/w/tests/next-guest/src", "next-guest/src"),
            ("/w/host", "/w/Cargo.lock", "../Cargo.lock"),
        ];
        for (base, path, want) in cases {
            assert_eq!(relative_to(Path::new(base), Path::new(path)), PathBuf::from(want), "{path} from {base}");
        }
    }
}
