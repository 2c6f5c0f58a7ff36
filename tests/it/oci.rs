//! The logic as an OCI artifact: `clb-host component --push` writes the CNCF wasm layout to a
//! real registry (Debian's `docker-registry`, the CNCF distribution registry, on loopback), a
//! third tool (`skopeo`) reads it as that layout, and `clb-host inspect oci://` pulls it back by
//! tag and by digest. What goes wrong is said and exits as documented: a registry that is down, a
//! tag it lacks, an artifact that is no component, a registry serving other bytes than the
//! digest asked.

use super::cli::clb_host;
use clb_guest::tracker::STATE_VERSION;
use clb_sandbox::sha256_hex;
use clb_tests::registry::Registry;
use clb_tests::*;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::Command;

fn is_digest(text: &str) -> bool {
    text.strip_prefix("sha256:").is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// What `skopeo inspect --raw` reads at `reference` (plain HTTP: the registry is loopback).
fn skopeo_raw(reference: &str) -> serde_json::Value {
    let output = Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false", &format!("docker://{reference}")])
        .output()
        .expect("skopeo");
    assert!(output.status.success(), "skopeo: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn the_built_in_component_pushed_to_a_registry_is_the_cncf_wasm_artifact_and_inspect_pulls_it_by_tag_and_by_digest() {
    let scratch = scratch("oci-push");
    let registry = Registry::start(scratch.join("registry"));
    let reference = format!("{}/clb/logic:v1", registry.address);

    let (code, out, err) = clb_host(&["component", "--push", &reference]);
    assert_eq!(code, 0, "{out}{err}");
    let digest = out.trim().to_owned();
    assert!(is_digest(&digest), "the push prints the manifest's digest: {out}");
    let (code, again, err) = clb_host(&["component", "--push", &reference]);
    assert_eq!((code, again.trim()), (0, digest.as_str()), "one component is one digest: {err}");

    // Another tool reads the layout the issue names.
    let manifest = skopeo_raw(&reference);
    assert_eq!(manifest["config"]["mediaType"], "application/vnd.wasm.config.v0+json", "{manifest:#}");
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest:#}");
    assert_eq!(layers[0]["mediaType"], "application/wasm");
    assert_eq!(layers[0]["digest"].as_str().unwrap(), format!("sha256:{}", sha256_hex(clb_sandbox::BUILTIN_GUEST)));
    assert_eq!(manifest["annotations"]["io.github.clb-reconciler.state-version"], STATE_VERSION.to_string());
    let package = manifest["annotations"]["io.github.clb-reconciler.wit-package"].as_str().unwrap();
    assert!(package.starts_with("clb:reconciler@"), "{package}");

    for at in [reference.clone(), format!("{}/clb/logic@{digest}", registry.address)] {
        let (code, out, err) = clb_host(&["inspect", &format!("oci://{at}")]);
        assert_eq!(code, 0, "{at}: {out}{err}");
        assert!(out.contains(&format!("digest:   {digest}")), "{out}");
        assert!(out.contains(&format!("sha256:   {}", sha256_hex(clb_sandbox::BUILTIN_GUEST))), "{out}");
        assert!(out.contains(&format!("annotation: io.github.clb-reconciler.state-version={STATE_VERSION}")), "{out}");
        assert!(out.contains("verdict:  this host loads it"), "{out}");
    }

    // Another component, from a file (compressed as a ConfigMap would hold it), is another digest.
    let file = scratch.join("next.wasm.gz");
    std::fs::write(&file, gzip(NEXT_GUEST)).unwrap();
    let next = format!("{}/clb/logic:v2", registry.address);
    let (code, out, err) = clb_host(&["component", "--push", &next, "--component", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(is_digest(out.trim()) && out.trim() != digest, "{out}");
    let layer = &skopeo_raw(&next)["layers"][0];
    assert_eq!(layer["digest"].as_str().unwrap(), format!("sha256:{}", sha256_hex(NEXT_GUEST)), "pushed decompressed");
}

#[test]
fn inspect_oci_exits_2_for_a_registry_down_a_tag_it_lacks_or_a_bad_reference_and_1_for_an_artifact_that_is_no_component()
 {
    let scratch = scratch("oci-errors");
    let registry = Registry::start(scratch.join("registry"));

    let down = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let (code, _, err) = clb_host(&["inspect", &format!("oci://{down}/clb/logic:v1")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot be reached"), "{err}");

    let (code, _, err) = clb_host(&["inspect", &format!("oci://{}/clb/logic:missing", registry.address)]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("answered 404"), "{err}");

    let (code, _, err) = clb_host(&["inspect", &format!("oci://{}/clb/logic", registry.address)]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("neither a tag nor a digest"), "{err}");

    // An image (an OCI image config, a tar layer) where a component was expected.
    let image = format!("{}/clb/image:v1", registry.address);
    let reference = clb_oci::Reference::parse(&image).unwrap();
    let client = clb_oci::Client::new(clb_oci::ClientOptions::default()).unwrap();
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    tokio.block_on(async {
        let config = br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
        let layer = b"not a tar, and no component";
        let config_digest = client.push_blob(&reference, config).await.unwrap();
        let layer_digest = client.push_blob(&reference, layer).await.unwrap();
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer.len()}],
        });
        let bytes = serde_json::to_vec(&manifest).unwrap();
        client.push_manifest(&reference, "v1", "application/vnd.oci.image.manifest.v1+json", &bytes).await.unwrap();
    });
    let (code, out, err) = clb_host(&["inspect", &format!("oci://{image}")]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("verdict:  refused") && out.contains("not `application/vnd.wasm.config.v0+json`"), "{out}");
}

/// A fake registry on loopback, for as long as the test runs: each connection's request head is
/// read, then `answer` writes what it will to it; the connection is kept open afterwards only
/// when `answer` says so.
fn fake_registry(answer: impl Fn(&mut std::net::TcpStream) -> bool + Send + 'static) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            if answer(&mut stream) {
                held.push(stream);
            }
        }
    });
    address
}

/// The head of a manifest answer whose `Docker-Content-Digest` is `said`.
fn manifest_head(said: &str, length: usize, close: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nDocker-Content-Digest: {said}\r\nContent-Length: {length}\r\n{close}\r\n"
    )
}

/// A registry that answers every manifest request with `body` and a `Docker-Content-Digest`
/// header of `said`.
fn lying_registry(body: &'static [u8], said: String) -> std::net::SocketAddr {
    fake_registry(move |stream| {
        let _ = stream.write_all(manifest_head(&said, body.len(), "Connection: close\r\n").as_bytes());
        let _ = stream.write_all(body);
        false
    })
}

#[test]
fn a_registry_serving_other_bytes_than_the_digest_asked_is_refused_naming_both_digests() {
    let asked = format!("sha256:{}", "0".repeat(64));
    let body: &'static [u8] = br#"{"schemaVersion":2,"config":{},"layers":[]}"#;
    // Its header agrees with what it asked: the bytes themselves are checked.
    let address = lying_registry(body, asked.clone());
    let (code, _, err) = clb_host(&["inspect", &format!("oci://{address}/clb/logic@{asked}")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("not the {asked} asked")), "{err}");
    assert!(err.contains(&format!("sha256:{}", sha256_hex(body))), "{err}");

    // By tag: the header says a digest the bytes do not have.
    let address = lying_registry(body, asked.clone());
    let (code, _, err) = clb_host(&["inspect", &format!("oci://{address}/clb/logic:v1")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("served sha256:{}", sha256_hex(body))), "{err}");
}

/// A registry that takes connections and then stalls: it reads each request and answers
/// nothing, or (with `head`) the head of a manifest whose body never comes, and keeps the
/// connection open, so the client sees a peer that is there and says nothing more.
fn stalled_registry(head: bool) -> std::net::SocketAddr {
    fake_registry(move |stream| {
        if head {
            let digest = format!("sha256:{}", "0".repeat(64));
            let _ = stream.write_all((manifest_head(&digest, 4096, "") + "{").as_bytes());
        }
        true
    })
}

#[test]
fn a_registry_that_stalls_before_answering_or_in_the_body_is_a_typed_error_at_the_request_timeout_not_a_hang() {
    let options = clb_oci::ClientOptions { timeout: std::time::Duration::from_millis(300), ..Default::default() };
    let client = clb_oci::Client::new(options).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for head in [false, true] {
        let address = stalled_registry(head);
        let reference = clb_oci::Reference::parse(&format!("{address}/clb/logic:v1")).unwrap();
        let error = runtime
            .block_on(clb_oci::artifact::pull(&client, &reference, 1 << 20))
            .expect_err("a stalled registry gives no component");
        let text = clb_sandbox::error_text::error_chain(&error);
        let typed = if head {
            matches!(error, clb_oci::OciError::Body { .. })
        } else {
            matches!(error, clb_oci::OciError::Http { .. })
        };
        assert!(typed, "head {head}: {text}");
        assert!(text.contains(&address.to_string()) && text.contains("timed out"), "head {head}: {text}");
    }
}

/// The registry token flow in front of a real registry: a request without the token is answered
/// `401` with a Bearer challenge naming `/token` here; `/token` hands the token out only for the
/// HTTP Basic login `robot:s3cret`, counting each time; a request with the token is forwarded.
struct TokenGate {
    address: std::net::SocketAddr,
    tokens_issued: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

const TOKEN: &str = "token-for-robot";

impl TokenGate {
    fn start(registry: std::net::SocketAddr) -> TokenGate {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let tokens_issued = std::sync::Arc::new(AtomicUsize::new(0));
        let issued = tokens_issued.clone();
        let basic = format!("Basic {}", base64_of("robot:s3cret"));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut client) = stream else { continue };
                let Some((head, body)) = read_request(&mut client) else { continue };
                let header = |name: &str| {
                    head.lines().find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
                    })
                };
                let target = head.split_whitespace().nth(1).unwrap_or_default().to_owned();
                if target.starts_with("/token") {
                    let answer = if header("authorization").as_deref() == Some(basic.as_str()) {
                        issued.fetch_add(1, Ordering::SeqCst);
                        let body = format!(r#"{{"token":"{TOKEN}"}}"#);
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    } else {
                        "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned()
                    };
                    let _ = client.write_all(answer.as_bytes());
                } else if header("authorization").as_deref() != Some(&format!("Bearer {TOKEN}")) {
                    let challenge = format!(
                        "Bearer realm=\"http://{address}/token\",service=\"clb-test\",scope=\"repository:clb/logic:pull\""
                    );
                    let answer = format!(
                        "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: {challenge}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    );
                    let _ = client.write_all(answer.as_bytes());
                } else {
                    // Forwarded as it came (its Host is this gate's, so the registry's Locations
                    // point here), answered as the registry answers until it closes.
                    let mut upstream = std::net::TcpStream::connect(registry).unwrap();
                    let head: String = head
                        .lines()
                        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
                        .map(|l| format!("{l}\r\n"))
                        .collect();
                    upstream.write_all(format!("{head}Connection: close\r\n\r\n").as_bytes()).unwrap();
                    upstream.write_all(&body).unwrap();
                    let _ = std::io::copy(&mut upstream, &mut client);
                }
            }
        });
        TokenGate { address, tokens_issued }
    }
}

fn base64_of(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// A request's head (without its blank line) and its body (by Content-Length).
fn read_request(stream: &mut std::net::TcpStream) -> Option<(String, Vec<u8>)> {
    use std::io::Read as _;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        head.push_str(line.trim_end_matches(['\r', '\n']));
        head.push('\n');
    }
    let length = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-length")))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((head.trim_end().to_owned(), body))
}

#[test]
fn a_registry_behind_the_token_flow_is_pushed_to_and_pulled_from_with_a_docker_config_login_and_refuses_none() {
    use std::sync::atomic::Ordering;
    let scratch = scratch("oci-token");
    let registry = Registry::start(scratch.join("registry"));
    let gate = TokenGate::start(registry.address);
    let config = scratch.join("config.json");
    // The gate is on loopback: plain HTTP, as for the registry itself.
    std::fs::write(
        &config,
        format!(r#"{{"auths": {{"{}": {{"auth": "{}"}}}}}}"#, gate.address, base64_of("robot:s3cret")),
    )
    .unwrap();
    let reference = format!("{}/clb/logic:v1", gate.address);
    let login = ["--registry-config", config.to_str().unwrap()];

    let (code, out, err) = clb_host(&[&["component", "--push", &reference][..], &login].concat());
    assert_eq!(code, 0, "{out}{err}");
    let digest = out.trim().to_owned();
    // One token for the push's every request (its HEADs, uploads, the manifest): it is kept per
    // registry and scope.
    let issued = gate.tokens_issued.load(Ordering::SeqCst);
    assert_eq!(issued, 1, "the push went through the token service once");
    let (code, out, err) = clb_host(&[&["inspect", &format!("oci://{reference}")][..], &login].concat());
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("digest:   {digest}")), "{out}");
    assert_eq!(
        gate.tokens_issued.load(Ordering::SeqCst),
        issued + 1,
        "one token for the whole pull, kept across its requests"
    );

    // Without the login the token service refuses, and so the pull is refused, saying so.
    let (code, _, err) = clb_host(&["inspect", &format!("oci://{reference}")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unauthorized") && err.contains("token service answered 401"), "{err}");
}

/// `clb-host component --push` from within a test's runtime (it makes its own).
async fn push(component: Option<std::path::PathBuf>, reference: String) -> String {
    tokio::task::spawn_blocking(move || {
        let mut args = vec!["component".to_owned(), "--push".into(), reference];
        if let Some(file) = component {
            args.extend(["--component".into(), file.display().to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out, err) = clb_host(&args);
        assert_eq!(code, 0, "{out}{err}");
        out.trim().to_owned()
    })
    .await
    .unwrap()
}

#[test]
fn run_with_logic_oci_swaps_when_the_tag_moves_and_keeps_serving_through_a_registry_missing_the_tag_or_away() {
    use super::operations::{Host, Options, event_on, in_namespace, sample};
    use clb_host::live::control::EventTarget;
    use clb_host::live::sources::{LogicSource, OciSource};
    in_namespace("oci", async |client, ns| {
        let scratch = scratch("oci-run");
        let mut registry = Registry::start(scratch.join("registry"));
        let tag = format!("{}/clb/logic:live", registry.address);
        let next_file = scratch.join("next.wasm");
        std::fs::write(&next_file, NEXT_GUEST).unwrap();
        let source = LogicSource::Oci(OciSource {
            reference: clb_oci::Reference::parse(&tag).unwrap(),
            client: std::sync::Arc::new(clb_oci::Client::new(clb_oci::ClientOptions::default()).unwrap()),
            // Quick to notice, so the test waits less; the product resolves every 30 s.
            poll: std::time::Duration::from_millis(100),
        });
        let events = EventTarget { namespace: ns.to_owned(), name: "clb-swaps".into() };
        let host =
            Host::start(client, Options { source: Some(source), events: Some(events), ..Default::default() }).await;
        let (builtin_sha, next_sha) = (builtin().info().sha256.clone(), sha256_hex(NEXT_GUEST));

        // No artifact at the tag yet: said once, as an Event and a count; the built-in serves.
        let status = host.last_swap("refused", Some("source")).await;
        assert_eq!(status["active"]["sha256"], builtin_sha, "{status}");
        assert!(status["lastSwap"]["reason"].as_str().is_some_and(|r| r.contains("answered 404")), "{status}");
        let refused = event_on(client, ns, "clb-swaps", "LogicSwapRefused", None).await;
        assert!(
            refused.message.as_deref().is_some_and(|m| m.contains(&format!("no version from oci {tag}"))),
            "{refused:?}"
        );

        // The tag is pushed: pulled and swapped in.
        push(Some(next_file), tag.clone()).await;
        let status = host.last_swap("accepted", None).await;
        assert_eq!(status["active"]["sha256"], next_sha, "{status}");
        assert_eq!(status["lastSwap"]["origin"], format!("oci {tag}"), "{status}");

        // The registry goes away: said, and the next guest keeps serving.
        registry.stop();
        let status = host.last_swap("refused", Some("source")).await;
        assert_eq!(status["active"]["sha256"], next_sha, "{status}");
        assert!(status["lastSwap"]["reason"].as_str().is_some_and(|r| r.contains("cannot be reached")), "{status}");
        let metrics = host.get("/metrics").await.1;
        let serving = format!("sha256=\"{next_sha}\"");
        assert_eq!(sample(&metrics, "clb_supervisor_swaps_total", &[&serving, "result=\"source\""]), 2.0, "{metrics}");

        // Back, and the tag moved to a version the next guest's state cannot go to: pulled and
        // offered (and refused by the swap's own check, as from any source).
        registry.restart();
        push(None, tag.clone()).await;
        let status = host.last_swap("refused", Some("state-refused")).await;
        assert_eq!(status["lastSwap"]["sha256"], builtin_sha, "the moved tag's component was pulled: {status}");
        assert_eq!(status["active"]["sha256"], next_sha, "{status}");
        host.stop().await;
    });
}
