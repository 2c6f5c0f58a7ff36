//! An image reference as docker and the distribution spec write it:
//! `[REGISTRY/]REPOSITORY[:TAG][@sha256:HEX]`, optionally after `oci://`.
//!
//! The first path component is a registry when it holds a `.` or a `:`, or is `localhost`
//! (docker's rule); otherwise the registry is Docker Hub, whose API is at
//! `registry-1.docker.io` and whose one-component names are under `library/`. Only sha256
//! digests are taken: a component's pin is a sha256 everywhere else in the product.

use crate::OciError;

/// Where a component is, and which one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// The registry as written (`localhost:5000`, `ghcr.io`), `docker.io` when none is.
    pub registry: String,
    /// The repository within it (`clb/logic`).
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:<64 hex>`.
    pub digest: Option<String>,
}

const DOCKER_HUB: &str = "docker.io";

impl Reference {
    pub fn parse(text: &str) -> Result<Self, OciError> {
        let bad = |why: &str| OciError::BadReference { reference: text.to_owned(), why: why.to_owned() };
        let rest = text.strip_prefix("oci://").unwrap_or(text);
        if rest.is_empty() || rest.len() > 1024 {
            return Err(bad("empty or longer than 1,024 characters"));
        }
        let (rest, digest) = match rest.split_once('@') {
            Some((rest, digest)) => {
                if !is_sha256_digest(digest) {
                    return Err(bad("a digest is `sha256:` and 64 lowercase hex digits"));
                }
                (rest, Some(digest.to_owned()))
            }
            None => (rest, None),
        };
        // A tag follows the last `:` after the last `/` (a registry's port is before it).
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
            None => (rest, None),
        };
        if let Some(tag) = tag
            && !is_tag(tag)
        {
            return Err(bad("a tag is 1 to 128 of A-Z a-z 0-9 _ . - and starts with neither . nor -"));
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, path)) if first.contains(['.', ':']) || first == "localhost" => {
                (first.to_owned(), path.to_owned())
            }
            _ if name.contains('/') => (DOCKER_HUB.to_owned(), name.to_owned()),
            _ => (DOCKER_HUB.to_owned(), format!("library/{name}")),
        };
        if registry.is_empty() || registry.contains(|c: char| c.is_whitespace() || c == '@') {
            return Err(bad("the registry is not a host[:port]"));
        }
        if !is_repository(&repository) {
            return Err(bad("a repository is lowercase components of a-z 0-9 joined by . _ __ - and /"));
        }
        if tag.is_none() && digest.is_none() {
            return Err(bad("it names neither a tag nor a digest (write `:latest` to mean it)"));
        }
        Ok(Reference { registry, repository, tag: tag.map(str::to_owned), digest })
    }

    /// What the registry's manifest endpoint takes: the digest when there is one, else the tag.
    pub fn manifest_ref(&self) -> &str {
        self.digest.as_deref().or(self.tag.as_deref()).expect("a reference has a tag or a digest")
    }

    /// The host the API is served at (Docker Hub's differs from its name).
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB { "registry-1.docker.io" } else { &self.registry }
    }

    /// The same repository at `digest`, without a tag.
    pub fn at_digest(&self, digest: &str) -> Reference {
        Reference { digest: Some(digest.to_owned()), tag: None, ..self.clone() }
    }

    /// The same repository at `tag`.
    pub fn at_tag(&self, tag: &str) -> Reference {
        Reference { tag: Some(tag.to_owned()), digest: None, ..self.clone() }
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

pub fn is_sha256_digest(text: &str) -> bool {
    text.strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

fn is_tag(tag: &str) -> bool {
    (1..=128).contains(&tag.len())
        && !tag.starts_with(['.', '-'])
        && tag.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn is_repository(path: &str) -> bool {
    path.split('/').all(|component| {
        let bytes = component.as_bytes();
        !bytes.is_empty()
            && bytes.first().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && bytes.last().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
            && !component.contains("..")
    }) && path.len() <= 255
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_as_docker_reads_them() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        type Parts<'a> = (&'a str, &'a str, Option<&'a str>, Option<&'a str>);
        let cases: Vec<(String, Parts)> = vec![
            ("localhost:5000/clb/logic:v1".into(), ("localhost:5000", "clb/logic", Some("v1"), None)),
            ("oci://127.0.0.1:5000/logic:latest".into(), ("127.0.0.1:5000", "logic", Some("latest"), None)),
            ("ghcr.io/org/clb-logic:1.2.3".into(), ("ghcr.io", "org/clb-logic", Some("1.2.3"), None)),
            (format!("ghcr.io/org/logic@{digest}"), ("ghcr.io", "org/logic", None, Some(&digest))),
            (format!("ghcr.io/org/logic:v2@{digest}"), ("ghcr.io", "org/logic", Some("v2"), Some(&digest))),
            ("logic:v1".into(), ("docker.io", "library/logic", Some("v1"), None)),
            ("org/logic:v1".into(), ("docker.io", "org/logic", Some("v1"), None)),
            ("localhost/logic:v1".into(), ("localhost", "logic", Some("v1"), None)),
        ];
        for (text, (registry, repository, tag, digest)) in cases {
            let r = Reference::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(
                (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref(), r.digest.as_deref()),
                (registry, repository, tag, digest),
                "{text}"
            );
        }
        assert_eq!(Reference::parse("logic:v1").unwrap().api_host(), "registry-1.docker.io");
    }

    #[test]
    fn a_reference_without_a_tag_or_digest_or_with_a_bad_part_is_refused_saying_which() {
        for (text, why) in [
            ("localhost:5000/logic", "neither a tag nor a digest"),
            ("localhost:5000/Logic:v1", "lowercase"),
            ("localhost:5000/logic:-v1", "a tag is"),
            ("localhost:5000/logic@sha256:abc", "64 lowercase hex"),
            ("localhost:5000/logic@sha512:abc", "sha256"),
            ("localhost:5000//logic:v1", "lowercase"),
            ("", "empty"),
        ] {
            let error = Reference::parse(text).unwrap_err().to_string();
            assert!(error.contains(why), "{text}: {error}");
        }
    }
}
