//! The operator page (`GET /`) of a running `clb-host run`, as a real browser renders it:
//! Debian's `chromium`, headless, against the test API server and the emulator. The browser is
//! installed on first use by `harness/browser/chromium.sh` (as the test API server is built by
//! its script); where it cannot be, the test fails saying why: a page test that skips itself
//! proves nothing.

use crate::kube::eventually;
use crate::operations::{Host, Options, create_service, delete_services, in_namespace, post_swap, provisioned};
use clb_host::live::control::EventTarget;
use clb_sandbox::sha256_hex;
use clb_tests::*;
use serde_json::json;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A browser run gets this long; a first start on a cold disk takes a few seconds.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(90);

/// The browser's path, installed by `harness/browser/chromium.sh` where it is missing.
fn browser() -> PathBuf {
    clb_tests::harness_tool("browser/chromium.sh")
}

/// Runs `chromium --headless` on the page with `extra` arguments; its standard output.
fn chromium(addr: SocketAddr, profile: &Path, extra: &[&str]) -> String {
    let mut command = Command::new(browser());
    command
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars"])
        // A profile of its own: a second run, or a developer's open browser, shares nothing.
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(format!("http://{addr}/"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => panic!("starting {}: {error}", browser().display()),
    };
    // Both pipes are read as the browser writes, so a chatty one cannot block on a full pipe.
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("piped")));
    let stderr = read(Box::new(child.stderr.take().expect("piped")));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waits for chromium") {
            break status;
        }
        if started.elapsed() > BROWSER_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within {BROWSER_TIMEOUT:?}: {}", stderr.join().unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (stdout, stderr) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    assert!(status.success(), "chromium failed ({status}): {stderr}\n{stdout}");
    stdout
}

/// The DOM chromium renders of the page, after a load.
async fn rendered(addr: SocketAddr, profile: &Path) -> String {
    let profile = profile.to_owned();
    tokio::task::spawn_blocking(move || chromium(addr, &profile, &["--dump-dom"])).await.unwrap()
}

/// The number in the element of `id` (`<td ... id="ID">N</td>`), if the page has it.
fn figure(dom: &str, id: &str) -> Option<u64> {
    let start = dom.find(&format!("id=\"{id}\">"))? + id.len() + 6;
    dom[start..].split('<').next()?.trim().parse().ok()
}

/// The text of the section of `id`.
fn section<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom.find(&format!("<section id=\"{id}\">")).unwrap_or_else(|| panic!("no section {id} in:\n{dom}"));
    let rest = &dom[start..];
    &rest[..rest.find("</section>").unwrap_or(rest.len())]
}

/// Where the screenshot goes: under the target directory, which CI keeps as an artifact.
fn screenshot_path() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("operator-page");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("operator-page-{}.png", std::process::id()))
}

#[test]
fn the_operator_page_renders_in_chromium_with_the_serving_version_the_provisioned_services_and_a_swaps_result() {
    in_namespace("page", async |client, ns| {
        let events = EventTarget { namespace: ns.to_owned(), name: "clb-swaps".into() };
        let host = Host::start(client, Options { events: Some(events), ..Default::default() }).await;
        let profile = scratch("page-chromium");
        let (builtin_sha, next_sha) = (builtin().info().sha256.clone(), sha256_hex(NEXT_GUEST));

        create_service(client, ns, "page-web", json!({})).await;
        provisioned(client, ns, &["page-web"]).await;
        // The figures are read at most once a second: wait until the page has them.
        eventually("the page's figures count the provisioned Service", async || {
            let (code, page) = host.get("/").await;
            match figure(&page, "k8s-services") {
                Some(n) if code == 200 && n >= 1 => Ok(()),
                _ => Err(format!("{code}: {page}")),
            }
        })
        .await;

        let dom = rendered(host.addr, &profile).await;
        let serving = section(&dom, "serving");
        assert!(serving.contains(&builtin_sha[..12]), "the serving version's sha256 in:\n{serving}");
        // Other tests' Services may be in the API server too: at least this one is counted.
        let services = figure(&dom, "k8s-services").unwrap_or_else(|| panic!("provisioned Services in:\n{dom}"));
        assert!(services >= 1, "{services} provisioned in:\n{dom}");
        assert!(section(&dom, "nrp").contains("load balancers"), "{dom}");
        assert!(section(&dom, "swaps").contains("none since this process started"), "{dom}");
        println!("rendered before the swap: serving {}, {services} Services provisioned", &builtin_sha[..12]);

        let (code, answer) = post_swap(&host, NEXT_GUEST.to_vec(), None).await;
        assert_eq!((code, &answer["result"]), (200, &json!("accepted")), "{answer}");
        host.last_swap("accepted", None).await;
        // Charts need two samples (one every 5 s); the screenshot shows them.
        eventually("the page draws its charts", async || {
            let (_, page) = host.get("/").await;
            if page.contains("<svg id=\"sync-lag\"") { Ok(()) } else { Err(section(&page, "charts").to_owned()) }
        })
        .await;

        let dom = rendered(host.addr, &profile).await;
        assert!(section(&dom, "serving").contains(&next_sha), "the next guest serves:\n{dom}");
        assert!(section(&dom, "serving").contains(&builtin_sha), "the built-in version kept for a rollback:\n{dom}");
        let swaps = section(&dom, "swaps");
        let swapped = format!("accepted</td><td>{} → {}", &builtin_sha[..12], &next_sha[..12]);
        assert!(swaps.contains(&swapped), "{swapped:?} in:\n{swaps}");
        assert!(swaps.contains("endpoint 127.0.0.1:"), "the swap's origin in:\n{swaps}");
        println!("rendered after the swap: {swapped}");

        let screenshot = screenshot_path();
        let shot = format!("--screenshot={}", screenshot.display());
        let (addr, shot_profile) = (host.addr, profile.to_path_buf());
        tokio::task::spawn_blocking(move || chromium(addr, &shot_profile, &[&shot, "--window-size=1280,1600"]))
            .await
            .unwrap();
        let size = std::fs::metadata(&screenshot).map(|m| m.len()).unwrap_or(0);
        assert!(size > 1000, "a screenshot at {} ({size} bytes)", screenshot.display());
        println!("screenshot: {}", screenshot.display());

        // The next guest serves: it releases the Service's finalizer, so the namespace goes
        // clean before the next test's host lists it.
        delete_services(client, ns, "page-").await;
        host.stop().await;
        let _ = std::fs::remove_dir_all(&profile);
    });
}
