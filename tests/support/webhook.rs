//! `clb-host admission` served in-process over TLS with the test certificates of
//! `tests/fixtures/tls/` ([`webhook`]), and a client that trusts their CA: for the webhook's tests
//! and its benchmark.

use crate::{LineSender, fixture};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A webhook served until the test process ends, and a client that trusts its certificate.
pub struct Webhook {
    pub url: String,
    pub client: reqwest::Client,
    /// The folder holding the serving pair (a test may rotate it).
    pub dir: PathBuf,
}

/// A folder of this test's own, with the serving pair copied in (a test may rotate it).
fn scratch(name: &str) -> PathBuf {
    let dir = crate::process_dir().join(format!("webhook-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["webhook.crt", "webhook.key"] {
        std::fs::copy(fixture(&format!("tls/{file}")), dir.join(file)).unwrap();
    }
    dir
}

/// A client that trusts only the CA of `ca` (PEM).
pub fn client(ca: &Path) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Starts `clb-host admission` with `extra` flags in a folder named `name`.
pub async fn webhook(name: &str, extra: &[&str]) -> Webhook {
    let dir = scratch(name);
    let (sender, lines) = std::sync::mpsc::channel();
    let mut args: Vec<String> = ["clb-host", "admission", "--listen", "127.0.0.1:0"].map(String::from).into();
    args.extend(["--cloud-config".into(), fixture("configs/clb.yaml").display().to_string()]);
    args.extend(["--tls-cert-file".into(), dir.join("webhook.crt").display().to_string()]);
    args.extend(["--tls-key-file".into(), dir.join("webhook.key").display().to_string()]);
    args.extend(extra.iter().map(|a| a.to_string()));
    std::thread::spawn(move || {
        let mut out = LineSender(sender, Vec::new());
        let mut err = Vec::new();
        let code = clb_host::cli::run(args, &mut out, &mut err);
        panic!("clb-host admission ended with {code}: {}", String::from_utf8_lossy(&err));
    });
    let line = tokio::task::spawn_blocking(move || lines.recv_timeout(Duration::from_secs(120)).expect("a line"))
        .await
        .unwrap();
    let url = line.strip_prefix("listening on ").unwrap_or_else(|| panic!("{line}")).to_owned();
    let client = client(&fixture("tls/ca.crt"));
    Webhook { url, client, dir }
}

impl Webhook {
    /// Posts `body` to `/validate`: the status and the body of the answer.
    pub async fn post(&self, body: impl Into<reqwest::Body>) -> (u16, String) {
        let answer = self.client.post(&self.url).header("content-type", "application/json").body(body).send().await;
        let answer = answer.expect("an answer");
        (answer.status().as_u16(), answer.text().await.unwrap())
    }

    /// The `response` of the review sent.
    pub async fn judge(&self, review: &Value) -> Value {
        let (status, body) = self.post(serde_json::to_vec(review).unwrap()).await;
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (answer["apiVersion"].as_str(), answer["kind"].as_str()),
            (Some("admission.k8s.io/v1"), Some("AdmissionReview"))
        );
        assert_eq!(answer["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002", "{answer}");
        answer["response"].clone()
    }

    /// Gets `path` of the server: the status and the body.
    pub async fn get(&self, path: &str) -> (u16, String) {
        let url = self.url.replace("/validate", path);
        let answer = self.client.get(url).send().await.expect("an answer");
        (answer.status().as_u16(), answer.text().await.unwrap())
    }
}
