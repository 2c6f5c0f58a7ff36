//! Builds the built-in guest component that the host embeds as its default logic.

fn main() {
    let here = clb_build::package_dir();
    let root = here.parent().and_then(|crates| crates.parent()).expect("crates/sandbox/ is inside the workspace");
    let path = clb_build::build_component(
        &clb_build::Guest {
            package: "clb-guest",
            features: &[],
            output: "clb_guest.wasm",
            profile: clb_build::PROFILE,
        },
        &[&root.join("guest/src"), &root.join("guest/Cargo.toml"), &root.join("wit")],
    );
    println!("cargo:rustc-env=CLB_BUILTIN_GUEST={}", path.display());
}
