//! The webhook's certificate, re-read when its files change: cert-manager (or an operator)
//! rotates the Secret mounted as files, and the next handshake takes the new pair without a
//! restart. A pair that does not load keeps the last good one serving, with a warning.

use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// Why a certificate and key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {why}")]
    Read { path: PathBuf, why: String },
    #[error("{0}: no certificate in the file")]
    NoCertificate(PathBuf),
    #[error("{path}: the key is not one rustls signs with: {why}")]
    Key { path: PathBuf, why: String },
}

/// The certificate chain and key files, and the pair last loaded from them.
#[derive(Debug)]
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    loaded: Mutex<(Stamp, Arc<CertifiedKey>)>,
}

/// When each file last changed (and its length), as last read.
type Stamp = [(Option<SystemTime>, u64); 2];

fn stamp(paths: [&Path; 2]) -> Stamp {
    paths.map(|p| std::fs::metadata(p).map(|m| (m.modified().ok(), m.len())).unwrap_or((None, 0)))
}

fn load(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let read =
        |path: &Path, why: &dyn std::fmt::Display| TlsError::Read { path: path.to_owned(), why: why.to_string() };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| read(cert, &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| read(cert, &e))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(cert.to_owned()));
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| read(key, &e))?;
    let signing =
        any_supported_type(&private).map_err(|e| TlsError::Key { path: key.to_owned(), why: e.to_string() })?;
    Ok(CertifiedKey::new(chain, signing))
}

impl ReloadingCert {
    /// Loads the pair now: a pair that does not load is an error at start.
    pub fn new(cert: PathBuf, key: PathBuf) -> Result<Self, TlsError> {
        let at = stamp([&cert, &key]);
        let pair = Arc::new(load(&cert, &key)?);
        Ok(Self { cert, key, loaded: Mutex::new((at, pair)) })
    }

    /// The webhook's TLS: rustls' safe defaults, no client certificates (the API server does
    /// not present one), HTTP/1.1, this pair.
    pub fn server_config(self) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports rustls' default protocol versions")
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(self));
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(tls)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = stamp([&self.cert, &self.key]);
        if now != loaded.0 {
            // Stamped first: a pair caught half-written is read again only when it changes next.
            loaded.0 = now;
            match load(&self.cert, &self.key) {
                Ok(pair) => {
                    tracing::info!(cert = %self.cert.display(), "admission: the certificate changed; serving the new one");
                    loaded.1 = Arc::new(pair);
                }
                Err(e) => tracing::warn!(
                    "admission: the certificate changed but does not load ({e}); the last good one serves"
                ),
            }
        }
        Some(loaded.1.clone())
    }
}
