//! Builds the test-only guests (the wasmtime test-programs pattern). The real guest comes from
//! `clb-host`, which embeds it.

use std::path::Path;

fn main() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let hostile = clb_build::build_component(
        &clb_build::Guest { package: "clb-hostile-guest", features: &[], output: "hostile_guest.wasm" },
        &[&here.join("hostile-guest/src"), &here.join("hostile-guest/Cargo.toml"), &here.join("../wit")],
    );
    println!("cargo:rustc-env=CLB_HOSTILE_GUEST={}", hostile.display());
    // The next guest includes the real guest's sources, so it is rebuilt when they change.
    let next = clb_build::build_component(
        &clb_build::Guest { package: "clb-next-guest", features: &[], output: "next_guest.wasm" },
        &[
            &here.join("next-guest/src"),
            &here.join("next-guest/Cargo.toml"),
            &here.join("../guest/src"),
            &here.join("../wit"),
        ],
    );
    println!("cargo:rustc-env=CLB_NEXT_GUEST={}", next.display());
}
