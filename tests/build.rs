//! Builds the test-only guests (the wasmtime test-programs pattern). The real guest comes from
//! `clb-host`, which embeds it.

use std::path::Path;

fn main() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = clb_build::build_component(
        &clb_build::Guest { package: "clb-hostile-guest", features: &[], output: "hostile_guest.wasm" },
        &[&here.join("hostile-guest/src"), &here.join("hostile-guest/Cargo.toml"), &here.join("../wit")],
    );
    println!("cargo:rustc-env=CLB_HOSTILE_GUEST={}", path.display());
}
