//! Cosign's key-pair signatures, both ways: what `cosign sign --key` writes, this verifies, and
//! what this signs, `cosign verify --key` accepts.
//!
//! * **The payload** is cosign's "simple signing" JSON naming the repository and the manifest
//!   digest; the signature is ECDSA P-256 over its SHA-256, ASN.1 DER, base64.
//! * **In a registry** the signatures of the manifest `sha256:HEX` are the layers of the image
//!   tagged `sha256-HEX.sig` in the same repository: each layer is a payload
//!   (`application/vnd.dev.cosign.simplesigning.v1+json`) whose descriptor carries the signature
//!   in the annotation `dev.cosignproject.cosign/signature`.
//! * **Keys**: a public key as PEM `PUBLIC KEY` (PKIX: `cosign.pub`, or what `openssl ec -pubout`
//!   writes); a private key as PEM `PRIVATE KEY` (PKCS#8, as `openssl genpkey` writes) or as
//!   `cosign generate-key-pair` writes it (`ENCRYPTED SIGSTORE PRIVATE KEY`: scrypt and NaCl
//!   secretbox over the PKCS#8, opened with the password). P-256 only, as cosign's default.
//!
//! Keyless signing (Fulcio certificates, the Rekor log) needs the public-good instances on the
//! internet and is not done here; signatures are checked against the operator's key alone (what
//! `cosign verify --key K --insecure-ignore-tlog` checks).

use crate::OciError;
use crate::client::{Client, OCI_MANIFEST};
use crate::reference::Reference;
use base64::Engine as _;
use ring::signature::{ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, UnparsedPublicKey};
use serde_json::{Value, json};

pub const PAYLOAD_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// A payload is a few hundred bytes; a signature image holds a handful of them.
const MAX_PAYLOAD_BYTES: u64 = 64 << 10;
const MAX_SIGNATURES: usize = 64;

/// Why a key could not be read or a signature not be had.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    #[error("{what}: not a key this host reads: {why}")]
    Key { what: String, why: String },
    #[error("no signature: the registry has no {tag} for {digest}")]
    Unsigned { tag: String, digest: String },
    #[error("no signature of {digest} verifies with the key: {why}")]
    NotVerified { digest: String, why: String },
    #[error("reading the signatures")]
    Registry(#[from] OciError),
}

/// The DER prefix of every P-256 public key in PKIX form: SEQUENCE { SEQUENCE { id-ecPublicKey,
/// prime256v1 }, BIT STRING (0 unused bits) } before the 65-byte uncompressed point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce,
    0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// A P-256 public key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey {
    /// The uncompressed point (65 bytes).
    point: Vec<u8>,
}

impl PublicKey {
    /// A PEM `PUBLIC KEY` holding a P-256 key in PKIX form.
    pub fn from_pem(what: &str, text: &[u8]) -> Result<Self, SignatureError> {
        let bad = |why: String| SignatureError::Key { what: what.to_owned(), why };
        let block = pem::parse(text).map_err(|e| bad(format!("not PEM: {e}")))?;
        if block.tag() != "PUBLIC KEY" {
            return Err(bad(format!("a PEM `{}`, not `PUBLIC KEY`", block.tag())));
        }
        let der = block.contents();
        match der.strip_prefix(&P256_SPKI_PREFIX[..]) {
            Some(point) if point.len() == 65 && point[0] == 4 => Ok(PublicKey { point: point.to_vec() }),
            _ => Err(bad("not an ECDSA P-256 public key (cosign's default)".into())),
        }
    }

    /// PEM `PUBLIC KEY`, as `cosign.pub` is written.
    pub fn to_pem(&self) -> String {
        let mut der = P256_SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.point);
        pem::encode(&pem::Pem::new("PUBLIC KEY", der))
    }

    /// Whether `signature` (base64 of ASN.1 DER) signs `payload`.
    pub fn verifies(&self, payload: &[u8], signature: &str) -> bool {
        let Ok(der) = base64::engine::general_purpose::STANDARD.decode(signature.trim()) else { return false };
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &self.point).verify(payload, &der).is_ok()
    }
}

/// A P-256 private key.
pub struct SigningKey {
    pair: EcdsaKeyPair,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey").field("public", &self.public()).finish()
    }
}

impl SigningKey {
    /// A PEM `PRIVATE KEY` (PKCS#8), or cosign's `ENCRYPTED SIGSTORE PRIVATE KEY` (also its
    /// older name, `ENCRYPTED COSIGN PRIVATE KEY`) opened with `password`.
    pub fn from_pem(what: &str, text: &[u8], password: Option<&[u8]>) -> Result<Self, SignatureError> {
        let bad = |why: String| SignatureError::Key { what: what.to_owned(), why };
        let block = pem::parse(text).map_err(|e| bad(format!("not PEM: {e}")))?;
        let pkcs8 = match block.tag() {
            "PRIVATE KEY" => block.contents().to_vec(),
            "ENCRYPTED SIGSTORE PRIVATE KEY" | "ENCRYPTED COSIGN PRIVATE KEY" => {
                let password =
                    password.ok_or_else(|| bad("encrypted, and no password given (COSIGN_PASSWORD)".into()))?;
                decrypt_cosign(block.contents(), password).map_err(bad)?
            }
            "EC PRIVATE KEY" => {
                return Err(bad("SEC1 (`EC PRIVATE KEY`): convert it with `openssl pkcs8 -topk8 -nocrypt`".into()));
            }
            tag => return Err(bad(format!("a PEM `{tag}`, not `PRIVATE KEY` or cosign's encrypted key"))),
        };
        let rng = ring::rand::SystemRandom::new();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &pkcs8, &rng)
            .map_err(|e| bad(format!("not an ECDSA P-256 PKCS#8 key: {e}")))?;
        Ok(SigningKey { pair })
    }

    /// A new key from the system's randomness (for tests and benchmarks: an operator's key is
    /// made by `cosign generate-key-pair` or `openssl genpkey` and kept off the cluster).
    pub fn generate() -> Self {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).expect("the system RNG");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
            .expect("a key ring just made");
        SigningKey { pair }
    }

    pub fn public(&self) -> PublicKey {
        use ring::signature::KeyPair as _;
        PublicKey { point: self.pair.public_key().as_ref().to_vec() }
    }

    /// The signature of `payload`, base64 of ASN.1 DER.
    pub fn sign(&self, payload: &[u8]) -> String {
        let rng = ring::rand::SystemRandom::new();
        let signature = self.pair.sign(&rng, payload).expect("signing with a valid key and a system RNG");
        base64::engine::general_purpose::STANDARD.encode(signature.as_ref())
    }
}

/// Opens cosign's encrypted key: `{"kdf": {"name": "scrypt", "params": {N, r, p}, "salt"},
/// "cipher": {"name": "nacl/secretbox", "nonce"}, "ciphertext"}`, byte fields base64.
fn decrypt_cosign(json: &[u8], password: &[u8]) -> Result<Vec<u8>, String> {
    use crypto_secretbox::aead::{Aead as _, KeyInit as _};
    let value: Value = serde_json::from_slice(json).map_err(|e| format!("the encrypted key is not JSON: {e}"))?;
    let bytes = |pointer: &str| -> Result<Vec<u8>, String> {
        let text = value.pointer(pointer).and_then(Value::as_str).ok_or_else(|| format!("no {pointer}"))?;
        base64::engine::general_purpose::STANDARD.decode(text).map_err(|e| format!("{pointer} is not base64: {e}"))
    };
    let number = |pointer: &str| value.pointer(pointer).and_then(Value::as_u64).ok_or_else(|| format!("no {pointer}"));
    if value.pointer("/kdf/name").and_then(Value::as_str) != Some("scrypt")
        || value.pointer("/cipher/name").and_then(Value::as_str) != Some("nacl/secretbox")
    {
        return Err("not scrypt and nacl/secretbox".into());
    }
    let (n, r, p) = (number("/kdf/params/N")?, number("/kdf/params/r")?, number("/kdf/params/p")?);
    if !n.is_power_of_two() || !(2..=1 << 22).contains(&n) || !(1..=64).contains(&r) || !(1..=16).contains(&p) {
        return Err(format!("scrypt parameters out of bounds (N {n}, r {r}, p {p})"));
    }
    let params = scrypt::Params::new(n.trailing_zeros() as u8, r as u32, p as u32, 32)
        .map_err(|e| format!("scrypt parameters: {e}"))?;
    let mut key = [0u8; 32];
    scrypt::scrypt(password, &bytes("/kdf/salt")?, &params, &mut key).map_err(|e| format!("scrypt: {e}"))?;
    let nonce = bytes("/cipher/nonce")?;
    if nonce.len() != 24 {
        return Err("the nonce is not 24 bytes".into());
    }
    let cipher = crypto_secretbox::XSalsa20Poly1305::new(&key.into());
    cipher
        .decrypt(crypto_secretbox::Nonce::from_slice(&nonce), bytes("/ciphertext")?.as_slice())
        .map_err(|_| "the password does not open it".into())
}

/// Cosign's payload for the manifest `digest` of `reference`'s repository.
pub fn payload(reference: &Reference, digest: &str) -> Vec<u8> {
    let identity = format!("{}/{}", reference.registry, reference.repository);
    serde_json::to_vec(&json!({
        "critical": {
            "identity": {"docker-reference": identity},
            "image": {"docker-manifest-digest": digest},
            "type": "cosign container image signature",
        },
        "optional": null,
    }))
    .expect("a JSON value always prints")
}

/// The tag cosign keeps the signatures of `digest` under.
pub fn signature_tag(digest: &str) -> String {
    digest.replacen(':', "-", 1) + ".sig"
}

/// Signs the manifest `digest` of `reference`'s repository and pushes the signature as cosign
/// does (replacing any signatures already at the tag).
pub async fn push_signature(
    client: &Client,
    reference: &Reference,
    digest: &str,
    key: &SigningKey,
) -> Result<String, SignatureError> {
    let payload = payload(reference, digest);
    let signature = key.sign(&payload);
    let payload_digest = client.push_blob(reference, &payload).await?;
    let config = serde_json::to_vec(&json!({
        "architecture": "", "os": "", "config": {},
        "rootfs": {"type": "layers", "diff_ids": [payload_digest]},
    }))
    .expect("a JSON value always prints");
    let config_digest = client.push_blob(reference, &config).await?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
        "layers": [{
            "mediaType": PAYLOAD_MEDIA_TYPE,
            "digest": payload_digest,
            "size": payload.len(),
            "annotations": {SIGNATURE_ANNOTATION: signature},
        }],
    }))
    .expect("a JSON value always prints");
    Ok(client.push_manifest(reference, &signature_tag(digest), OCI_MANIFEST, &manifest).await?)
}

/// Whether a signature of the manifest `digest` by `key` is in the registry: `Ok` when one of the
/// signature image's payloads names `digest` and its signature verifies.
pub async fn verify(
    client: &Client,
    reference: &Reference,
    digest: &str,
    key: &PublicKey,
) -> Result<(), SignatureError> {
    let tag = signature_tag(digest);
    let manifest = match client.manifest(&reference.at_tag(&tag)).await {
        Ok(manifest) => manifest,
        Err(OciError::Status { status: 404, .. }) => {
            return Err(SignatureError::Unsigned { tag, digest: digest.to_owned() });
        }
        Err(error) => return Err(error.into()),
    };
    let value: Value = serde_json::from_slice(&manifest.bytes).unwrap_or(Value::Null);
    let layers = value["layers"].as_array().map(Vec::as_slice).unwrap_or_default();
    let mut seen = Vec::new();
    for layer in layers.iter().filter(|l| l["mediaType"] == PAYLOAD_MEDIA_TYPE).take(MAX_SIGNATURES) {
        let (Some(payload_digest), Some(signature)) =
            (layer["digest"].as_str(), layer["annotations"][SIGNATURE_ANNOTATION].as_str())
        else {
            seen.push("a payload without a signature annotation".to_owned());
            continue;
        };
        let payload = client.blob(reference, payload_digest, MAX_PAYLOAD_BYTES).await?;
        let named = serde_json::from_slice::<Value>(&payload).ok().and_then(|p| {
            p.pointer("/critical/image/docker-manifest-digest").and_then(Value::as_str).map(str::to_owned)
        });
        if named.as_deref() != Some(digest) {
            seen.push(format!("a payload naming {}", named.as_deref().unwrap_or("no digest")));
        } else if key.verifies(&payload, signature) {
            return Ok(());
        } else {
            seen.push("a signature by another key".to_owned());
        }
    }
    if seen.is_empty() {
        seen.push(format!("{tag} holds no cosign payload"));
    }
    Err(SignatureError::NotVerified { digest: digest.to_owned(), why: seen.join("; ") })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test key, as `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256` writes one.
    const PKCS8: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg2o/wAr+wF/ak8def\nctX//MsK8YtGSGwIl7Jd5/LYUkahRANCAAQoiqmfkuMOsU6iFNzLss/W4OiBFwoZ\nmW7OjMnBE32yCGc1ULXtGSx0tnYHx2bm75aGYsAukbgfD7drnEYNw4j6\n-----END PRIVATE KEY-----\n";

    #[test]
    fn a_pkcs8_key_signs_what_its_public_key_verifies_and_nothing_else() {
        let key = SigningKey::from_pem("test", PKCS8.as_bytes(), None).unwrap();
        let public = PublicKey::from_pem("test", key.public().to_pem().as_bytes()).unwrap();
        let signed = key.sign(b"payload");
        assert!(public.verifies(b"payload", &signed));
        assert!(!public.verifies(b"payloaD", &signed));
        assert!(!public.verifies(b"payload", "not base64"));
        let reference = Reference::parse("localhost:5000/clb/logic:v1").unwrap();
        let text = String::from_utf8(payload(&reference, "sha256:ab")).unwrap();
        assert!(text.contains(r#""docker-manifest-digest":"sha256:ab""#), "{text}");
        assert_eq!(signature_tag(&format!("sha256:{}", "a".repeat(64))), format!("sha256-{}.sig", "a".repeat(64)));
    }

    #[test]
    fn keys_that_are_not_p256_pem_are_refused_saying_what_they_are() {
        for (text, why) in [
            ("not pem", "not PEM"),
            ("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "`CERTIFICATE`"),
            ("-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n", "openssl pkcs8"),
            (
                "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n",
                "no password",
            ),
        ] {
            let error = SigningKey::from_pem("k", text.as_bytes(), None).unwrap_err().to_string();
            assert!(error.contains(why), "{text}: {error}");
        }
        let error =
            PublicKey::from_pem("k", b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n").unwrap_err();
        assert!(error.to_string().contains("P-256"), "{error}");
    }
}
