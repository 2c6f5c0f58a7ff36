//! Builds the test-only guests (the wasmtime test-programs pattern). The real guest comes from
//! `clb-host`, which embeds it.

use std::path::Path;

fn main() {
    let here = clb_build::package_dir();
    let hostile = clb_build::build_component(
        &clb_build::Guest {
            package: "clb-hostile-guest",
            features: &[],
            output: "hostile_guest.wasm",
            profile: clb_build::PROFILE,
        },
        &[&here.join("hostile-guest/src"), &here.join("hostile-guest/Cargo.toml"), &here.join("../wit")],
    );
    println!("cargo:rustc-env=CLB_HOSTILE_GUEST={}", hostile.display());
    // The next guest includes the real guest's sources, so it is rebuilt when they change. Its
    // destructive variant is the same crate with a feature; the builds run one after the other,
    // each encoding its own output before the next overwrites cargo's. The destructive variant
    // is built for size: the operations tests carry it as base64 text in a ConfigMap, which
    // holds at most 1 MiB, and it is never measured for speed.
    let watch = [
        &here.join("next-guest/src"),
        &here.join("next-guest/Cargo.toml"),
        &here.join("../guest/src"),
        &here.join("../wit"),
    ];
    let watch: Vec<&Path> = watch.iter().map(|p| p.as_path()).collect();
    for (features, output, env, profile) in [
        (&[][..], "next_guest.wasm", "CLB_NEXT_GUEST", clb_build::PROFILE),
        (&["destructive-tick"][..], "destructive_guest.wasm", "CLB_DESTRUCTIVE_GUEST", clb_build::PROFILE_SMALL),
    ] {
        let guest = clb_build::Guest { package: "clb-next-guest", features, output, profile };
        let built = clb_build::build_component(&guest, &watch);
        println!("cargo:rustc-env={env}={}", built.display());
    }
}
