//! Cosign signatures, both ways, with the real `cosign` CLI (sigstore's, built from the Go module
//! proxy by `harness/cosign/build.sh`, pinned and cached): what `cosign sign --key` signs,
//! `inspect --verify-key` verifies; what `component --push --sign-key` signs, `cosign verify
//! --key` accepts; with cosign's own encrypted key pair (its password in `COSIGN_PASSWORD`) and
//! with a PKCS#8 P-256 key pair as `openssl` writes it; the same for detached signatures
//! (`cosign sign-blob`, `verify-blob`). And `run --logic-verify-key` swaps only to what the
//! operator's key signed, from a registry, a file, a ConfigMap and `POST /swap`, in-process and
//! as a process of its own.

use super::cli::clb_host;
use clb_sandbox::sha256_hex;
use clb_tests::registry::Registry;
use clb_tests::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const PASSWORD: &str = "correct horse battery staple";

fn cosign_binary() -> PathBuf {
    harness_tool("cosign/build.sh")
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
    use super::operations::{Host, Options, event_on, in_namespace};
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
        });
        let events = EventTarget { namespace: ns.to_owned(), name: "clb-swaps".into() };
        let verify_key = Some(PublicKey::from_pem("trusted.pub", &read("trusted.pub")).unwrap());
        let options = Options { source: Some(source), events: Some(events), verify_key, ..Default::default() };
        let host = Host::start(client, options).await;
        let (builtin_sha, next_sha) = (builtin().info().sha256.clone(), sha256_hex(NEXT_GUEST));

        // Unsigned: refused, said, counted; the built-in serves.
        let status = host.last_swap("refused", Some("signature")).await;
        assert_eq!(status["active"]["sha256"], builtin_sha, "{status}");
        assert!(status["lastSwap"]["reason"].as_str().is_some_and(|r| r.contains("no signature")), "{status}");
        let refused = event_on(client, ns, "clb-swaps", "LogicSwapRefused", None).await;
        assert!(refused.message.as_deref().is_some_and(|m| m.contains("(signature)")), "{refused:?}");

        // Signed by another key: refused again, saying so.
        push_signature(&oci, &reference, &digest, &other).await.unwrap();
        let status = host.last_reason("a signature by another key").await;
        assert_eq!(status["active"]["sha256"], builtin_sha, "{status}");
        assert_eq!(host.swaps_counted(&builtin_sha, "signature").await, 2.0);

        // Signed by the key: pulled and swapped in.
        push_signature(&oci, &reference, &digest, &trusted).await.unwrap();
        let status = host.last_swap("accepted", None).await;
        assert_eq!(status["active"]["sha256"], next_sha, "{status}");
        host.stop().await;
    });
}

/// A fresh directory holding cosign's encrypted pair (`cosign.key`, `cosign.pub`) and openssl's
/// PKCS#8 pair (`openssl.key`, `openssl.pub`).
fn two_key_pairs(name: &str) -> Scratch {
    let dir = scratch(name);
    let generated = cosign(&dir, &["generate-key-pair"]);
    assert!(generated.status.success(), "{}", String::from_utf8_lossy(&generated.stderr));
    openssl(&dir, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "openssl.key"]);
    openssl(&dir, &["pkey", "-in", "openssl.key", "-pubout", "-out", "openssl.pub"]);
    dir
}

/// `cosign sign-blob` of `file` with the key in `dir`, written to `FILE.sig`, offline.
fn cosign_sign_blob(dir: &Path, key: &str, file: &Path) {
    let signature = format!("{}.sig", file.display());
    let key = dir.join(key).display().to_string();
    let args = ["sign-blob", "--key", &key, "--tlog-upload=false", "--output-signature", &signature, "-y"];
    let signed = cosign(dir, &[&args[..], &[file.to_str().unwrap()]].concat());
    assert!(signed.status.success(), "cosign sign-blob: {}", String::from_utf8_lossy(&signed.stderr));
}

#[test]
fn a_file_signed_by_cosign_sign_blob_is_verified_by_inspect_and_one_clb_host_signs_by_cosign_verify_blob() {
    let keys = two_key_pairs("signatures-blob");
    let key = |name: &str| keys.join(name).display().to_string();
    let file = keys.join("logic.wasm.gz");

    // What clb-host writes and signs (openssl's key: no password), cosign verifies.
    let (code, out, err) = clb_host(&[
        "component",
        "--out",
        file.to_str().unwrap(),
        "--compress",
        "gzip",
        "--sign-key",
        &key("openssl.key"),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("logic.wasm.gz.sig: its signature"), "{out}");
    let verify_blob = |public: &str| {
        let signature = format!("{}.sig", file.display());
        let args = ["verify-blob", "--key", &key(public), "--signature", &signature, "--insecure-ignore-tlog=true"];
        cosign(&keys, &[&args[..], &[file.to_str().unwrap()]].concat())
    };
    let verified = verify_blob("openssl.pub");
    assert!(verified.status.success(), "cosign verify-blob: {}", String::from_utf8_lossy(&verified.stderr));
    assert!(!verify_blob("cosign.pub").status.success(), "another key verifies nothing");
    let inspect = |public: &str| clb_host(&["inspect", file.to_str().unwrap(), "--verify-key", &key(public)]);
    let (code, out, err) = inspect("openssl.pub");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("signature: verified with"), "{out}");

    // What cosign signs, clb-host verifies; another key, or none, it refuses.
    cosign_sign_blob(&keys, "cosign.key", &file);
    let (code, out, err) = inspect("cosign.pub");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("signature: verified with"), "{out}");
    let (code, out, _) = inspect("openssl.pub");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("signature: NOT verified: the signature in") && out.contains("does not verify"), "{out}");
    std::fs::remove_file(format!("{}.sig", file.display())).unwrap();
    let (code, out, _) = inspect("cosign.pub");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("signature: NOT verified: no signature"), "{out}");
}

#[test]
fn with_logic_verify_key_a_logic_file_and_post_swap_take_only_versions_whose_detached_signature_by_the_key_verifies() {
    use super::operations::{Host, Options, clb_host_swap, event_on, in_namespace};
    use clb_host::live::control::EventTarget;
    use clb_host::live::sources::LogicSource;
    use clb_oci::signature::{PublicKey, SigningKey};
    in_namespace("signed-file", async |client, ns| {
        let keys = two_key_pairs("signatures-file");
        let file = keys.join("logic.wasm");
        std::fs::write(&file, NEXT_GUEST).unwrap();
        let trusted = PublicKey::from_pem("cosign.pub", &std::fs::read(keys.join("cosign.pub")).unwrap()).unwrap();
        let other =
            SigningKey::from_pem("openssl.key", &std::fs::read(keys.join("openssl.key")).unwrap(), None).unwrap();
        let events = EventTarget { namespace: ns.to_owned(), name: "clb-swaps".into() };
        let source = Some(LogicSource::File(file.clone()));
        let options = Options { source, events: Some(events), verify_key: Some(trusted), ..Default::default() };
        let host = Host::start(client, options).await;
        let (builtin_sha, next_sha) = (builtin().info().sha256.clone(), sha256_hex(NEXT_GUEST));

        // No signature beside it: refused, said, counted; the built-in serves.
        let status = host.last_swap("refused", Some("signature")).await;
        assert_eq!(status["active"]["sha256"], builtin_sha, "{status}");
        let reason = status["lastSwap"]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("no signature") && reason.contains("logic.wasm.sig"), "{status}");
        let refused = event_on(client, ns, "clb-swaps", "LogicSwapRefused", None).await;
        assert!(refused.message.as_deref().is_some_and(|m| m.contains("(signature)")), "{refused:?}");

        // A signature by another key arriving beside it: looked at, refused.
        std::fs::write(format!("{}.sig", file.display()), other.sign(NEXT_GUEST)).unwrap();
        let status = host.last_reason("does not verify with the key").await;
        assert_eq!(status["active"]["sha256"], builtin_sha, "{status}");
        assert_eq!(host.swaps_counted(&builtin_sha, "signature").await, 2.0);

        // Signed by cosign with the key: swapped in.
        cosign_sign_blob(&keys, "cosign.key", &file);
        let status = host.last_swap("accepted", None).await;
        assert_eq!(status["active"]["sha256"], next_sha, "{status}");

        // POST /swap, through `clb-host swap`: the bytes as sent need the signature, taken from
        // FILE.sig beside them or --signature.
        let gz = keys.join("next.wasm.gz");
        std::fs::write(&gz, gzip(NEXT_GUEST)).unwrap();
        let endpoint = format!("http://{}", host.addr);
        let swap = |extra: &[&str]| {
            let args = ["--to", gz.to_str().unwrap(), "--endpoint", &endpoint].into_iter().chain(extra.iter().copied());
            clb_host_swap(args.map(|a| a.to_string()).collect())
        };
        let (code, out, _) = swap(&[]).await;
        assert_eq!(code, clb_host::cli::EXIT_REFUSED, "{out}");
        assert!(out.contains("refused (signature): no signature: the x-clb-signature header holds none"), "{out}");
        let by_other = keys.join("by-other.sig");
        std::fs::write(&by_other, other.sign(&gzip(NEXT_GUEST))).unwrap();
        let (code, out, _) = swap(&["--signature", by_other.to_str().unwrap()]).await;
        assert_eq!(code, clb_host::cli::EXIT_REFUSED, "{out}");
        assert!(out.contains("does not verify with the key"), "{out}");
        cosign_sign_blob(&keys, "cosign.key", &gz);
        let (code, out, err) = swap(&[]).await;
        assert_eq!(code, clb_host::cli::EXIT_OK, "{out}{err}");
        assert!(out.contains("unchanged"), "signed, decompressed, and the version already serving: {out}");
        host.stop().await;
    });
}

#[test]
fn with_logic_verify_key_a_logic_configmap_is_taken_once_its_sig_key_holds_a_signature_by_the_key() {
    use super::operations::{Host, Options, in_namespace};
    use ::kube::api::{Api, PostParams};
    use clb_host::live::control::EventTarget;
    use clb_host::live::sources::{ConfigMapKey, LogicSource};
    use clb_oci::signature::SigningKey;
    use k8s_openapi::api::core::v1::ConfigMap;
    in_namespace("signed-configmap", async |client, ns| {
        let keys = two_key_pairs("signatures-configmap");
        let read = |name: &str| std::fs::read(keys.join(name)).unwrap();
        let trusted = SigningKey::from_pem("openssl.key", &read("openssl.key"), None).unwrap();
        let public = clb_oci::signature::PublicKey::from_pem("openssl.pub", &read("openssl.pub")).unwrap();
        let compressed = zstd(NEXT_GUEST);
        let holding = |signature: Option<String>| ConfigMap {
            metadata: ::kube::api::ObjectMeta { name: Some("clb-logic".into()), ..Default::default() },
            binary_data: Some([("logic.wasm.zst".to_owned(), k8s_openapi::ByteString(compressed.clone()))].into()),
            data: signature.map(|s| [("logic.wasm.zst.sig".to_owned(), s)].into()),
            ..Default::default()
        };
        let configmaps = Api::<ConfigMap>::namespaced(client.clone(), ns);
        let created = configmaps.create(&PostParams::default(), &holding(None)).await.unwrap();
        let source = LogicSource::ConfigMap(ConfigMapKey::parse(&format!("{ns}/clb-logic:logic.wasm.zst")).unwrap());
        let events = EventTarget { namespace: ns.to_owned(), name: "clb-swaps".into() };
        let options =
            Options { source: Some(source), events: Some(events), verify_key: Some(public), ..Default::default() };
        let host = Host::start(client, options).await;

        let status = host.last_swap("refused", Some("signature")).await;
        assert_eq!(status["active"]["sha256"], builtin().info().sha256, "{status}");
        let reason = status["lastSwap"]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains(&format!("ConfigMap {ns}/clb-logic key logic.wasm.zst.sig holds none")), "{status}");

        // The signature added beside the same component (a trailing newline, as `kubectl create
        // configmap --from-file` keeps it, is not part of it).
        let mut signed = holding(Some(trusted.sign(&compressed) + "\n"));
        signed.metadata.resource_version = created.metadata.resource_version;
        configmaps.replace("clb-logic", &PostParams::default(), &signed).await.unwrap();
        let status = host.last_swap("accepted", None).await;
        assert_eq!(status["active"]["sha256"], sha256_hex(NEXT_GUEST), "{status}");
        host.stop().await;
    });
}

/// Writes to Azure the emulator answered so far.
fn azure_writes(emulator: &clb_emulator::Emulator) -> usize {
    let writes: Vec<&str> =
        clb_azure::Operation::ALL.into_iter().filter(|op| op.is_write()).map(|op| op.name()).collect();
    emulator.state().log.iter().filter(|entry| writes.contains(&entry.operation.as_str())).count()
}

// The end-to-end case: `clb-host run` as a process of its own, against the test API
// server, a local registry and the emulator over HTTP, with the real cosign signing.
#[test]
fn clb_host_run_with_logic_oci_and_logic_verify_key_swaps_when_the_tag_moves_to_what_cosign_signed_and_refuses_the_rest()
 {
    super::kube::run_if_child();
    super::kube::e2e(23, async |env| {
        use super::operations::Endpoint;
        let keys = two_key_pairs("signatures-e2e");
        let mut registry = Registry::start(keys.join("registry"));
        let repository = format!("{}/clb/logic", registry.address);
        let tag = format!("{repository}:live");
        let key = |name: &str| keys.join(name).display().to_string();
        let cosign_sign = |key_file: &str, digest: &str| {
            let at = format!("{repository}@{digest}");
            let args =
                ["sign", "--key", &key(key_file), "--tlog-upload=false", "--allow-http-registry=true", "-y", &at];
            let signed = tokio::task::block_in_place(|| cosign(&keys, &args));
            assert!(signed.status.success(), "cosign sign: {}", String::from_utf8_lossy(&signed.stderr));
        };
        let push = |component: &[u8]| {
            let file = keys.join("pushed.wasm");
            std::fs::write(&file, component).unwrap();
            // It runs a runtime of its own; this thread drives the test's.
            let (code, out, err) = tokio::task::block_in_place(|| {
                clb_host(&["component", "--push", &tag, "--component", file.to_str().unwrap()])
            });
            assert_eq!(code, 0, "{err}");
            out.trim().to_owned()
        };
        // The tag first names the built-in logic, signed with the key.
        let builtin_digest = push(clb_sandbox::BUILTIN_GUEST);
        cosign_sign("cosign.key", &builtin_digest);

        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let extra = [
            format!("--listen=127.0.0.1:{port}"),
            format!("--logic-oci={tag}"),
            "--logic-poll=1".into(),
            format!("--logic-verify-key={}", key("cosign.pub")),
        ];
        let (cloud_config, command_line) = env.run_command_line("signed-oci", &extra);
        let test = "signatures::clb_host_run_with_logic_oci_and_logic_verify_key_swaps_when_the_tag_moves_to_what_cosign_signed_and_refuses_the_rest";
        let _child = super::kube::clb_host_child(test, &command_line, false);
        let host = Endpoint { addr: format!("127.0.0.1:{port}").parse().unwrap() };
        let (builtin_sha, next_sha) = (builtin().info().sha256.clone(), sha256_hex(NEXT_GUEST));

        // Verified, and the version serving already: nothing to do (no record); it provisions.
        env.provisioned("web", &[(10, 1)]).await;
        let status = host.status().await;
        assert_eq!((&status["active"]["sha256"], &status["lastSwap"]), (&json!(builtin_sha), &json!(null)), "{status}");
        let writes = azure_writes(&env.emulator);

        // The tag moves to the next guest, unsigned: refused, and the built-in keeps serving.
        let next_digest = push(NEXT_GUEST);
        let status = host.last_swap("refused", Some("signature")).await;
        assert!(status["lastSwap"]["reason"].as_str().is_some_and(|r| r.contains("no signature")), "{status}");
        // Signed by cosign with another key: refused again.
        let other =
            tokio::task::block_in_place(|| cosign(&keys, &["generate-key-pair", "--output-key-prefix", "other"]));
        assert!(other.status.success(), "{}", String::from_utf8_lossy(&other.stderr));
        cosign_sign("other.key", &next_digest);
        host.last_reason("a signature by another key").await;
        // The registry goes away: said once, and the controller keeps serving.
        registry.stop();
        let status = host.last_swap("refused", Some("source")).await;
        assert_eq!(status["active"]["sha256"], builtin_sha, "{status}");
        let counted =
            (host.swaps_counted(&builtin_sha, "signature").await, host.swaps_counted(&builtin_sha, "source").await);
        assert_eq!(counted, (2.0, 1.0));
        assert_eq!(azure_writes(&env.emulator), writes, "nothing written to Azure while versions were refused");

        // Back, and the key signs the artifact the tag names: pulled and swapped in.
        registry.restart();
        cosign_sign("cosign.key", &next_digest);
        let status = host.last_swap("accepted", None).await;
        assert_eq!(status["active"]["sha256"], next_sha, "{status}");
        assert_eq!(status["lastSwap"]["origin"], format!("oci {tag}"), "{status}");

        // Each refusal is an Event regarding the controller's ConfigMap.
        let events = ::kube::Api::<k8s_openapi::api::core::v1::Event>::namespaced(env.admin.clone(), "kube-system");
        let refusals = super::kube::eventually("the refusals as Events", async || {
            let listed = events.list(&Default::default()).await.map_err(|e| e.to_string())?;
            let ours: Vec<String> = listed
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("LogicSwapRefused"))
                .filter_map(|e| e.message)
                .filter(|m| m.contains(&tag))
                .collect();
            if ours.len() >= 3 { Ok(ours) } else { Err(format!("{ours:#?}")) }
        })
        .await;
        assert!(refusals.iter().filter(|m| m.contains("(signature)")).count() == 2, "{refusals:#?}");
        assert!(refusals.iter().any(|m| m.contains("(source)")), "{refusals:#?}");
        let _ = std::fs::remove_file(cloud_config);
    });
}
