//! The controller's image as an operator builds and ships it: `deploy/image.sh` (a static
//! `clb-host` in an image `FROM scratch`, built by buildah as root without a daemon), the
//! README's first scenario run inside it (`buildah run`), its user and labels read back, then
//! pushed to a registry this test starts (Debian's `docker-registry`, the CNCF distribution
//! registry, on loopback) and pulled back by digest, and run again. The tools are installed on
//! first use by `harness/image/tools.sh`; where they cannot be, the test fails saying why: an
//! image test that skips itself proves nothing.

use clb_tests::registry::Registry;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

/// The README's first scenario, which the image runs.
const FIRST_SCENARIO: &str =
    "examples/scenarios/a-first-service-with-endpoints-gets-a-load-balancer-and-its-pods-in-nrp.yaml";

/// The name the test builds, pushes and pulls.
const NAME: &str = "clb-reconciler";
const TAG: &str = "image-test";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("the workspace")
}

fn run(what: &str, command: &mut Command) -> Output {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        output.status.success(),
        "{what}: {}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("UTF-8 output")
}

/// buildah with a storage of this test's own (vfs: no overlay mounts), removed at the end.
struct Buildah {
    root: PathBuf,
}

impl Buildah {
    fn command(&self) -> Command {
        let mut command = Command::new("buildah");
        command
            .arg("--storage-driver")
            .arg("vfs")
            .arg("--root")
            .arg(self.root.join("root"))
            .arg("--runroot")
            .arg(self.root.join("runroot"));
        command
    }

    fn run(&self, what: &str, args: &[&str]) -> String {
        stdout(&run(what, self.command().args(args)))
    }

    fn inspect(&self, image: &str) -> serde_json::Value {
        serde_json::from_str(&self.run("buildah inspect", &["inspect", "--type", "image", image])).unwrap()
    }

    /// Runs the README's first scenario in a container of `image` (the scenario copied in; the
    /// image holds only the controller) and returns what `clb-host simulate` printed.
    fn simulate_in(&self, image: &str) -> String {
        let container = self.run("buildah from", &["from", "--pull-never", image]).trim().to_owned();
        let scenario = workspace().join(FIRST_SCENARIO);
        self.run(
            "buildah copy",
            &["copy", "--chown", "65532:65532", &container, scenario.to_str().unwrap(), "/home/nonroot/first.yaml"],
        );
        let ran = self
            .command()
            .args(["run", "--isolation", "chroot", &container, "--"])
            .args(["/usr/local/bin/clb-host", "simulate", "/home/nonroot/first.yaml"])
            .output()
            .expect("buildah run");
        self.run("buildah rm", &["rm", &container]);
        let printed = format!("{}{}", stdout(&ran), String::from_utf8_lossy(&ran.stderr));
        assert!(ran.status.success(), "clb-host simulate in the image: {}\n{printed}", ran.status);
        printed
    }
}

impl Drop for Buildah {
    fn drop(&mut self) {
        // vfs leaves files only root may remove through buildah itself; then the folder.
        let _ = self.command().args(["rmi", "--all", "--force"]).output();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The label `key` of an image's OCI config, as `buildah inspect` reports it.
fn label<'a>(image: &'a serde_json::Value, key: &str) -> &'a str {
    image["OCIv1"]["config"]["Labels"][key].as_str().unwrap_or_else(|| panic!("no label {key}: {image:#}"))
}

#[test]
fn the_image_runs_the_readme_scenario_as_user_65532_with_its_labels_and_comes_back_from_a_registry_by_digest() {
    let root = workspace();
    let scratch = clb_tests::scratch("image-test");
    let buildah = Buildah { root: scratch.join("buildah") };
    let image = format!("{NAME}:{TAG}");

    // Build as an operator does; the script installs the tools it needs.
    let started = Instant::now();
    let built = run(
        "deploy/image.sh",
        Command::new("bash")
            .arg(root.join("deploy/image.sh"))
            .arg(&image)
            .current_dir(&root)
            .env("CLB_BUILDAH_ROOT", &buildah.root)
            .stderr(Stdio::inherit()),
    );
    let printed = stdout(&built);
    let (name, id) = printed.trim().rsplit_once(' ').expect("image.sh prints the name and the ID");
    assert_eq!(name, image);
    let hex = id.strip_prefix("sha256:").unwrap_or_default();
    assert!(hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()), "an image ID: {id}");

    // Its user, entrypoint and labels.
    let inspected = buildah.inspect(&image);
    let config = &inspected["OCIv1"]["config"];
    assert_eq!(config["User"], "65532:65532", "{config:#}");
    assert_eq!(config["Entrypoint"], serde_json::json!(["/usr/local/bin/clb-host"]));
    let revision = stdout(&run("git", Command::new("git").args(["rev-parse", "HEAD"]).current_dir(&root)));
    assert_eq!(label(&inspected, "org.opencontainers.image.revision"), revision.trim());
    assert_eq!(label(&inspected, "org.opencontainers.image.version"), env!("CARGO_PKG_VERSION"));
    assert!(label(&inspected, "org.opencontainers.image.source").starts_with("https://"), "{config:#}");
    let size = buildah.run("buildah images", &["images", "--format", "{{.Size}}", &image]);
    eprintln!("image {image}: built in {:.1} s, {}", started.elapsed().as_secs_f64(), size.trim());

    // The README's first scenario inside it, as the non-root user.
    let output = buildah.simulate_in(&image);
    assert!(output.contains("result: PASS") && output.contains("1 of 1 scenarios passed"), "{output}");

    // Pushed to a registry, pulled back by its digest, and the same image.
    let registry = Registry::start(scratch.join("registry"));
    let digest_file = scratch.join("digest");
    let destination = format!("docker://{}/{NAME}:{TAG}", registry.address);
    buildah.run(
        "buildah push",
        &["push", "--tls-verify=false", "--digestfile", digest_file.to_str().unwrap(), &image, &destination],
    );
    let digest = std::fs::read_to_string(&digest_file).unwrap().trim().to_owned();
    assert!(digest.starts_with("sha256:") && digest.len() == 71, "a digest: {digest}");
    let by_digest = format!("docker://{}/{NAME}@{digest}", registry.address);
    let remote: serde_json::Value = serde_json::from_str(&stdout(&run(
        "skopeo inspect",
        Command::new("skopeo").args(["inspect", "--tls-verify=false", &by_digest]),
    )))
    .unwrap();
    assert_eq!(remote["Digest"], digest.as_str(), "{remote:#}");
    assert_eq!(remote["Labels"], config["Labels"], "the registry serves the labels built");
    buildah.run("buildah rmi", &["rmi", "--force", &image]);
    buildah.run("buildah pull", &["pull", "--tls-verify=false", "--quiet", &by_digest]);
    let pulled = buildah.inspect(&by_digest.replacen("docker://", "", 1));
    assert_eq!(pulled["OCIv1"]["config"], *config, "the image pulled by digest is the one built");
    let output = buildah.simulate_in(&by_digest.replacen("docker://", "", 1));
    assert!(output.contains("result: PASS"), "{output}");
    drop(registry);
    drop(buildah);
}
