//! Who the controller is to a registry: nobody (anonymous), or the user and password a
//! `dockerconfigjson` file holds for that registry (an image pull Secret mounted as a file), sent
//! as the registry asks: HTTP Basic, or to the token service a Bearer challenge names (the
//! registry token flow of Docker Hub, GHCR, ACR and the CNCF registry).

use crate::OciError;
use base64::Engine as _;
use std::collections::BTreeMap;
use std::path::Path;

/// A user and password (or an identity token as the password) for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Login {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login").field("username", &self.username).field("password", &"…").finish()
    }
}

impl Login {
    pub fn basic_header(&self) -> String {
        let pair = format!("{}:{}", self.username, self.password);
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
    }
}

/// The logins of a `dockerconfigjson` file, by registry.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    logins: BTreeMap<String, Login>,
}

/// The most a credentials file may be: a pull Secret is a few hundred bytes.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

impl Credentials {
    pub fn anonymous() -> Self {
        Self::default()
    }

    /// Reads `{"auths": {"REGISTRY": {"auth": base64("user:password")} | {"username", "password"}}}`,
    /// the format of `.dockerconfigjson` and of `~/.docker/config.json`. A registry key may be
    /// written as a URL (`https://index.docker.io/v1/`): its host is what counts.
    pub fn from_file(path: &Path) -> Result<Self, OciError> {
        let unreadable = |why: String| OciError::Credentials { path: path.display().to_string(), why };
        let bytes = clb_sandbox::bounded::read(path, MAX_CONFIG_BYTES).map_err(|e| unreadable(e.to_string()))?;
        let value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| unreadable(format!("not JSON: {e}")))?;
        let auths =
            value.get("auths").and_then(|a| a.as_object()).ok_or_else(|| unreadable("no `auths` object".into()))?;
        let mut logins = BTreeMap::new();
        for (key, entry) in auths {
            let login = if let Some(auth) = entry.get("auth").and_then(|a| a.as_str()) {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(auth)
                    .ok()
                    .and_then(|d| String::from_utf8(d).ok())
                    .ok_or_else(|| unreadable(format!("auths.{key}.auth is not base64 of UTF-8")))?;
                let (username, password) = decoded
                    .split_once(':')
                    .ok_or_else(|| unreadable(format!("auths.{key}.auth is not user:password")))?;
                Login { username: username.to_owned(), password: password.to_owned() }
            } else {
                let field = |name: &str| entry.get(name).and_then(|v| v.as_str()).map(str::to_owned);
                match (field("username"), field("password")) {
                    (Some(username), Some(password)) => Login { username, password },
                    _ => {
                        return Err(unreadable(format!(
                            "auths.{key} has neither `auth` nor `username` and `password`"
                        )));
                    }
                }
            };
            logins.insert(registry_key(key), login);
        }
        Ok(Credentials { logins })
    }

    /// The login for `registry` (as a reference writes it), if the file has one. Docker Hub's
    /// logins are kept under `index.docker.io`, its API host and `docker.io` alike.
    pub fn login(&self, registry: &str) -> Option<&Login> {
        self.logins.get(registry).or_else(|| match registry {
            "docker.io" | "registry-1.docker.io" | "index.docker.io" => {
                ["index.docker.io", "docker.io", "registry-1.docker.io"].iter().find_map(|k| self.logins.get(*k))
            }
            _ => None,
        })
    }
}

fn registry_key(key: &str) -> String {
    let host = key.strip_prefix("https://").or_else(|| key.strip_prefix("http://")).unwrap_or(key);
    host.split('/').next().unwrap_or(host).to_owned()
}

/// What a `401`'s `WWW-Authenticate` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer { realm: String, service: Option<String>, scope: Option<String> },
}

impl Challenge {
    /// `Basic realm="…"` or `Bearer realm="…",service="…",scope="…"`; none for anything else.
    pub fn parse(header: &str) -> Option<Challenge> {
        let (scheme, rest) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return Some(Challenge::Basic);
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let params = parameters(rest);
        Some(Challenge::Bearer {
            realm: params.get("realm")?.clone(),
            service: params.get("service").cloned(),
            scope: params.get("scope").cloned(),
        })
    }
}

/// `key="value", key=value` pairs; a quoted value may hold commas (a scope list does).
fn parameters(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = text.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key.trim().trim_start_matches(',').trim().to_ascii_lowercase();
        let (value, after) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.find('"') {
                Some(end) => (&quoted[..end], &quoted[end + 1..]),
                None => (quoted, ""),
            }
        } else {
            after.split_once(',').unwrap_or((after, ""))
        };
        out.insert(key, value.trim().to_owned());
        rest = after.trim_start_matches([',', ' ']);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse_as_registries_write_them() {
        assert_eq!(
            Challenge::parse(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:org/logic:pull,push""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:org/logic:pull,push".into()),
            })
        );
        assert_eq!(Challenge::parse(r#"Basic realm="Registry Realm""#), Some(Challenge::Basic));
        assert_eq!(Challenge::parse("Bearer service=x"), None, "no realm, no token service to ask");
        assert_eq!(Challenge::parse("Negotiate"), None);
    }

    #[test]
    fn a_docker_config_file_gives_each_registrys_login_and_a_bad_one_says_what_is_wrong() {
        let dir = std::env::temp_dir().join(format!("clb-oci-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        let auth = base64::engine::general_purpose::STANDARD.encode("robot:s3cr:et");
        std::fs::write(
            &path,
            format!(
                r#"{{"auths": {{"ghcr.io": {{"auth": "{auth}"}}, "https://index.docker.io/v1/": {{"username": "u", "password": "p"}}}}}}"#
            ),
        )
        .unwrap();
        let credentials = Credentials::from_file(&path).unwrap();
        assert_eq!(credentials.login("ghcr.io").unwrap().password, "s3cr:et");
        assert_eq!(credentials.login("docker.io").unwrap().username, "u");
        assert!(credentials.login("localhost:5000").is_none());
        assert!(!format!("{:?}", credentials).contains("s3cr"), "a password is never printed");

        for (text, why) in [
            ("[]", "no `auths`"),
            (r#"{"auths": {"x": {"auth": "%%%"}}}"#, "not base64"),
            (r#"{"auths": {"x": {"username": "u"}}}"#, "neither"),
            ("{", "not JSON"),
        ] {
            std::fs::write(&path, text).unwrap();
            let error = Credentials::from_file(&path).unwrap_err().to_string();
            assert!(error.contains(why), "{text}: {error}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
