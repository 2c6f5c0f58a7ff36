//! Cosign signatures, both ways, with the real `cosign` CLI (sigstore's, built from the Go module
//! proxy by `harness/cosign/build.sh`, pinned and cached): what `cosign sign --key` signs,
//! `inspect --verify-key` verifies; what `component --push --sign-key` signs, `cosign verify
//! --key` accepts; with cosign's own encrypted key pair (its password in `COSIGN_PASSWORD`) and
//! with a PKCS#8 P-256 key pair as `openssl` writes it. And `run --logic-oci --logic-verify-key`
//! swaps only to what the operator's key signed.

use super::cli::clb_host;
use clb_sandbox::sha256_hex;
use clb_tests::registry::Registry;
use clb_tests::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

const PASSWORD: &str = "correct horse battery staple";

fn cosign_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../harness/cosign/build.sh");
        let output = Command::new("bash")
            .arg(&script)
            .env("CLB_CACHE", cache_dir())
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("harness/cosign/build.sh");
        assert!(output.status.success(), "harness/cosign/build.sh: {}", output.status);
        PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
    })
}

/// `cosign ARGS` in `dir`, with the key pair's password; offline (no transparency log).
fn cosign(dir: &Path, args: &[&str]) -> Output {
    Command::new(cosign_binary())
        .args(args)
        .current_dir(dir)
        .env("COSIGN_PASSWORD", PASSWORD)
        .env("HOME", dir)
        .output()
        .expect("cosign")
}

/// `openssl ARGS` in `dir` (installed where missing, with the registry's tools).
fn openssl(dir: &Path, args: &[&str]) {
    clb_tests::registry::install_tools();
    let output = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl");
    assert!(output.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
}

/// `clb-host ARGS` with `COSIGN_PASSWORD` set: this test binary run again for `test` alone (the
/// variable is the process's, so not set in this one). Its stdout.
fn clb_host_with_password(test: &str, args: &[&str]) -> String {
    let command_line: Vec<String> = std::iter::once("clb-host").chain(args.iter().copied()).map(String::from).collect();
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(super::kube::CHILD_COMMAND_LINE, serde_json::to_string(&command_line).unwrap())
        .env("COSIGN_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

#[test]
fn what_cosign_signs_clb_host_verifies_and_what_clb_host_signs_cosign_verifies_with_cosigns_and_openssls_keys() {
    super::kube::run_if_child();
    let scratch = scratch("signatures");
    let registry = Registry::start(scratch.join("registry"));
    let dir = scratch.join("keys");
    std::fs::create_dir_all(&dir).unwrap();
    let generated = cosign(&dir, &["generate-key-pair"]);
    assert!(generated.status.success(), "{}", String::from_utf8_lossy(&generated.stderr));
    openssl(&dir, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "openssl.key"]);
    openssl(&dir, &["pkey", "-in", "openssl.key", "-pubout", "-out", "openssl.pub"]);
    let key = |name: &str| dir.join(name).display().to_string();
    let repository = format!("{}/clb/logic", registry.address);
    let inspect = |tag: &str, public: &str| {
        clb_host(&["inspect", &format!("oci://{repository}:{tag}"), "--verify-key", &key(public)])
    };
    let cosign_verify = |digest: &str, public: &str| {
        let at = format!("{repository}@{digest}");
        cosign(
            &dir,
            &["verify", "--key", &key(public), "--insecure-ignore-tlog=true", "--allow-http-registry=true", &at],
        )
    };

    // What cosign signs, clb-host verifies (and an unsigned artifact, or another key, it refuses).
    let (code, pushed, err) = clb_host(&["component", "--push", &format!("{repository}:by-cosign")]);
    assert_eq!(code, 0, "{err}");
    let digest = pushed.trim();
    let (code, out, _) = inspect("by-cosign", "cosign.pub");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("signature: NOT verified: no signature"), "{out}");
    let at = format!("{repository}@{digest}");
    let signed = cosign(
        &dir,
        &["sign", "--key", &key("cosign.key"), "--tlog-upload=false", "--allow-http-registry=true", "-y", &at],
    );
    assert!(signed.status.success(), "cosign sign: {}", String::from_utf8_lossy(&signed.stderr));
    let (code, out, err) = inspect("by-cosign", "cosign.pub");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("signature: verified with"), "{out}");
    let (code, out, _) = inspect("by-cosign", "openssl.pub");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("a signature by another key"), "{out}");

    // What clb-host signs with cosign's encrypted key, cosign verifies, and with no other key.
    let test = "signatures::what_cosign_signs_clb_host_verifies_and_what_clb_host_signs_cosign_verifies_with_cosigns_and_openssls_keys";
    let next = scratch.join("next.wasm");
    std::fs::write(&next, NEXT_GUEST).unwrap();
    let printed = clb_host_with_password(
        test,
        &[
            "component",
            "--push",
            &format!("{repository}:by-clb-host"),
            "--component",
            next.to_str().unwrap(),
            "--sign-key",
            &key("cosign.key"),
        ],
    );
    // The harness prints its own words before the child's on the line.
    let ours = printed
        .split_whitespace()
        .find(|w| w.starts_with("sha256:") && w.len() == 71)
        .unwrap_or_else(|| panic!("{printed}"))
        .to_owned();
    let verified = cosign_verify(&ours, "cosign.pub");
    assert!(verified.status.success(), "cosign verify: {}", String::from_utf8_lossy(&verified.stderr));
    assert!(String::from_utf8_lossy(&verified.stdout).contains(&ours));
    assert!(!cosign_verify(&ours, "openssl.pub").status.success(), "another key verifies nothing");

    // And with openssl's PKCS#8 key (no password).
    let (code, out, err) =
        clb_host(&["component", "--push", &format!("{repository}:by-openssl"), "--sign-key", &key("openssl.key")]);
    assert_eq!(code, 0, "{out}{err}");
    let verified = cosign_verify(out.trim(), "openssl.pub");
    assert!(verified.status.success(), "cosign verify: {}", String::from_utf8_lossy(&verified.stderr));
    let (code, out, _) = inspect("by-openssl", "openssl.pub");
    assert_eq!(code, 0, "{out}");

    // A wrong password opens nothing, and says so before anything is pushed.
    let (code, _, err) =
        clb_host(&["component", "--push", &format!("{repository}:nothing"), "--sign-key", &key("cosign.key")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no password given (COSIGN_PASSWORD)"), "{err}");
}

#[test]
fn run_with_logic_verify_key_refuses_an_unsigned_artifact_and_one_signed_by_another_key_and_swaps_once_the_key_signs_it()
 {
    use super::operations::{Host, Options, event_on, in_namespace, sample};
    use clb_host::live::control::EventTarget;
    use clb_host::live::sources::{LogicSource, OciSource};
    use clb_oci::signature::{PublicKey, SigningKey, push_signature};
    in_namespace("signed", async |client, ns| {
        let scratch = scratch("signatures-run");
        let registry = Registry::start(scratch.join("registry"));
        let dir = scratch.join("keys");
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["trusted", "other"] {
            openssl(
                &dir,
                &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", &format!("{name}.key")],
            );
            openssl(&dir, &["pkey", "-in", &format!("{name}.key"), "-pubout", "-out", &format!("{name}.pub")]);
        }
        let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
        let (trusted, other) = (
            SigningKey::from_pem("trusted", &read("trusted.key"), None).unwrap(),
            SigningKey::from_pem("other", &read("other.key"), None).unwrap(),
        );
        let tag = format!("{}/clb/logic:signed", registry.address);
        let reference = clb_oci::Reference::parse(&tag).unwrap();
        let oci = clb_oci::Client::new(clb_oci::ClientOptions::default()).unwrap();
        let digest = clb_oci::artifact::push(&oci, &reference, NEXT_GUEST, &Default::default()).await.unwrap();

        let source = LogicSource::Oci(OciSource {
            reference: reference.clone(),
            client: std::sync::Arc::new(clb_oci::Client::new(clb_oci::ClientOptions::default()).unwrap()),
            poll: std::time::Duration::from_millis(100),
            verify: Some(PublicKey::from_pem("trusted.pub", &read("trusted.pub")).unwrap()),
        });
        let events = EventTarget { namespace: ns.to_owned(), name: "clb-swaps".into() };
        let host =
            Host::start(client, Options { source: Some(source), events: Some(events), ..Default::default() }).await;
        let (builtin_sha, next_sha) = (builtin().info().sha256.clone(), sha256_hex(NEXT_GUEST));

        // Unsigned: refused, said, counted; the built-in serves.
        let status = host.last_swap("refused", Some("signature")).await;
        assert_eq!(status["active"]["sha256"], builtin_sha, "{status}");
        assert!(status["lastSwap"]["reason"].as_str().is_some_and(|r| r.contains("no signature")), "{status}");
        let refused = event_on(client, ns, "clb-swaps", "LogicSwapRefused", None).await;
        assert!(refused.message.as_deref().is_some_and(|m| m.contains("(signature)")), "{refused:?}");

        // Signed by another key: refused again, saying so.
        push_signature(&oci, &reference, &digest, &other).await.unwrap();
        crate::kube::eventually("the other key's signature refused", async || {
            let status = host.status().await;
            let reason = status["lastSwap"]["reason"].as_str().unwrap_or_default().to_owned();
            if reason.contains("a signature by another key") { Ok(()) } else { Err(status.to_string()) }
        })
        .await;
        assert_eq!(host.status().await["active"]["sha256"], builtin_sha);
        let metrics = host.get("/metrics").await.1;
        let serving = format!("sha256=\"{builtin_sha}\"");
        assert_eq!(
            sample(&metrics, "clb_supervisor_swaps_total", &[&serving, "result=\"signature\""]),
            2.0,
            "{metrics}"
        );

        // Signed by the key: pulled and swapped in.
        push_signature(&oci, &reference, &digest, &trusted).await.unwrap();
        let status = host.last_swap("accepted", None).await;
        assert_eq!(status["active"]["sha256"], next_sha, "{status}");
        host.stop().await;
    });
}

#[test]
fn logic_verify_key_with_a_file_source_is_refused_at_start_rather_than_left_unchecked() {
    let config = fixture("configs/clb-azure.json").display().to_string();
    let key = scratch("signatures-refused");
    openssl(&key, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "k.key"]);
    openssl(&key, &["pkey", "-in", "k.key", "-pubout", "-out", "k.pub"]);
    let public = key.join("k.pub").display().to_string();
    let (code, _, err) = clb_host(&[
        "run",
        "--cloud-config",
        &config,
        "--azure-url",
        "http://127.0.0.1:1",
        "--credential",
        "none",
        "--listen",
        "127.0.0.1:0",
        "--logic-file",
        "/nonexistent/logic.wasm",
        "--logic-verify-key",
        &public,
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--logic-verify-key checks signatures in a registry"), "{err}");
}
