//! Reading the operator's files: the cloud configuration and Kubernetes manifests, with errors
//! that name the file, the line and the reason.
//!
//! Every file is read through [`crate::bounded::read`] (so `/dev/zero` or a 2 GB file is
//! refused after its limit, not read to the end), and every YAML text is checked by
//! [`check_yaml`] before it is deserialized: nesting at most [`MAX_DEPTH`] deep, no key twice in one mapping (Kubernetes
//! refuses a manifest with a duplicate key; serde would keep the last), a leading UTF-8 byte
//! order mark ignored (issue 15, defects 5 and 6).

use crate::azure::Scope;
use crate::backend_pools::PoolUpdaterConfig;
use crate::sandbox::bindings::clb::reconciler::types::Config;
use crate::sandbox::bindings::exports::clb::reconciler::backend_pools::SlbConfiguration;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Why an input file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error(transparent)]
    Read(#[from] crate::bounded::ReadError),
    #[error("{path}:{line}: {reason}")]
    Parse { path: PathBuf, line: usize, reason: String },
    #[error("{path}: `{key}` is missing or empty; `clb-host run` needs it to name the Azure resources")]
    Missing { path: PathBuf, key: &'static str },
    #[error("{path}: not UTF-8 text (at byte {at})")]
    NotText { path: PathBuf, at: usize },
}

/// The largest text file read: a ConfigMap's 1 MiB, which bounds any Kubernetes object or
/// cloud configuration an operator could keep in the cluster.
pub const MAX_TEXT_BYTES: u64 = 1 << 20;
/// The deepest nesting of YAML collections accepted; a Kubernetes object, `managedFields`
/// included, stays far below it.
pub const MAX_DEPTH: usize = 64;

/// `text` without a leading byte order mark, once its YAML is known to nest at most
/// [`MAX_DEPTH`] deep and to hold no duplicate key.
pub fn check_yaml<'t>(path: &Path, text: &'t str) -> Result<&'t str, InputError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if let Some(line) = too_deep(text) {
        let reason = format!("nested deeper than {MAX_DEPTH} levels");
        return Err(InputError::Parse { path: path.to_owned(), line, reason });
    }
    // A `Value` refuses a key it already holds (serde_yaml's `Mapping`), with its line.
    for document in serde_yaml::Deserializer::from_str(text) {
        serde_yaml::Value::deserialize(document).map_err(|e| InputError::parse(path, &e))?;
    }
    Ok(text)
}

/// The first line at which `text` may nest deeper than [`MAX_DEPTH`]: a scan, not a parse, that
/// counts a stack of indentations for block collections, the `- ` that open sequences on one
/// line and the open `[` and `{` of flow collections (outside quotes and comments). It may
/// overcount, never by much on a real manifest. It runs before the parser, whose time on deep
/// input grows faster than its size (libyaml reads the whole document before serde_yaml's own
/// recursion limit of 128 applies).
fn too_deep(text: &str) -> Option<usize> {
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    // While in a block scalar (`|`, `>`): the indentation of the line that opened it.
    let mut scalar: Option<usize> = None;
    for (n, line) in text.lines().enumerate() {
        let body = line.trim_start_matches(' ');
        let indent = line.len() - body.len();
        if body.is_empty() || scalar.is_some_and(|opened| indent > opened) {
            continue;
        }
        scalar = None;
        if body.starts_with('#') {
            continue;
        }
        if flow == 0 {
            while indents.last().is_some_and(|&i| i > indent) {
                indents.pop();
            }
            if indents.last() != Some(&indent) {
                indents.push(indent);
            }
        }
        let mut dashes = 0;
        let mut rest = body;
        while let Some(after) = rest.strip_prefix("- ").or_else(|| (rest == "-").then_some("")) {
            dashes += 1;
            rest = after.trim_start_matches(' ');
        }
        let mut deepest = flow;
        let mut quote: Option<char> = None;
        let mut previous = ' ';
        for c in rest.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') if matches!(previous, ' ' | '[' | '{' | ',' | ':') => quote = Some(c),
                (None, '#') if previous == ' ' => break,
                (None, '[' | '{') => {
                    flow += 1;
                    deepest = deepest.max(flow);
                }
                (None, ']' | '}') => flow = flow.saturating_sub(1),
                _ => {}
            }
            previous = c;
        }
        if indents.len().saturating_sub(1) + dashes.max(1) + deepest > MAX_DEPTH {
            return Some(n + 1);
        }
        let end = rest.split(" #").next().unwrap_or(rest).trim_end();
        if flow == 0
            && end.rsplit([' ', ':']).next().is_some_and(|last| {
                last.starts_with(['|', '>']) && last[1..].chars().all(|c| matches!(c, '-' | '+' | '1'..='9'))
            })
        {
            scalar = Some(indent);
        }
    }
    None
}

impl InputError {
    pub(crate) fn parse(path: &Path, err: &serde_yaml::Error) -> Self {
        let line = err.location().map(|l| l.line()).unwrap_or(1);
        // serde_yaml appends " at line L column C"; the line is already in front.
        let reason = err.to_string();
        let reason = reason.split(" at line ").next().unwrap_or(&reason).to_owned();
        Self::Parse { path: path.to_owned(), line, reason }
    }
}

/// The keys of the Azure cloud configuration (`azure.json`, YAML or JSON) this logic reads.
/// Every other key of that file is allowed and ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CloudConfig {
    #[serde(default)]
    load_balancer_backend_pool_configuration_type: String,
    #[serde(default)]
    load_balancer_sku: String,
    #[serde(default)]
    multiple_standard_load_balancer_configurations: Vec<MultipleStandardLoadBalancer>,
    /// `loadBalancerBackendPoolUpdateIntervalInSeconds`: the backend-pool updater's tick
    /// interval in multi-SLB local-service mode; absent or 0 means upstream's 30 s.
    #[serde(default)]
    load_balancer_backend_pool_update_interval_in_seconds: Option<u64>,
}

/// One entry of `multipleStandardLoadBalancerConfigurations`; its other upstream fields are
/// allowed and ignored.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MultipleStandardLoadBalancer {
    name: String,
    #[serde(default)]
    allow_service_placement: Option<bool>,
}

impl CloudConfig {
    /// The multi-SLB entries with the fields Service placement reads (a field copy).
    pub fn slb_configurations(&self) -> Vec<SlbConfiguration> {
        self.multiple_standard_load_balancer_configurations
            .iter()
            .map(|lb| SlbConfiguration { name: lb.name.clone(), allow_service_placement: lb.allow_service_placement })
            .collect()
    }

    /// The backend-pool updater's knobs: the tick interval from
    /// `loadBalancerBackendPoolUpdateIntervalInSeconds` (upstream's default when absent or 0).
    pub fn pool_updater_config(&self) -> PoolUpdaterConfig {
        let interval = self
            .load_balancer_backend_pool_update_interval_in_seconds
            .filter(|seconds| *seconds > 0)
            .map_or(crate::backend_pools::DEFAULT_INTERVAL, std::time::Duration::from_secs);
        PoolUpdaterConfig { interval, ..PoolUpdaterConfig::default() }
    }
}

/// A text file of at most [`MAX_TEXT_BYTES`].
pub(crate) fn read(path: &Path) -> Result<String, InputError> {
    String::from_utf8(crate::bounded::read(path, MAX_TEXT_BYTES)?)
        .map_err(|e| InputError::NotText { path: path.to_owned(), at: e.utf8_error().valid_up_to() })
}

/// Reads the cloud configuration's keys this logic reads ([`read_config`] keeps those of
/// [`Config`]).
pub fn read_cloud_config(path: &Path) -> Result<CloudConfig, InputError> {
    parse_cloud_config(path, &read(path)?)
}

/// Reads the cloud configuration.
pub fn read_config(path: &Path) -> Result<Config, InputError> {
    parse_config(path, &read(path)?)
}

pub fn parse_config(path: &Path, text: &str) -> Result<Config, InputError> {
    Ok(parse_cloud_config(path, text)?.into())
}

/// Reads the cloud configuration's keys this logic reads, for [`Config`] and for
/// [`CloudConfig::slb_configurations`].
pub fn parse_cloud_config(path: &Path, text: &str) -> Result<CloudConfig, InputError> {
    let text = check_yaml(path, text)?;
    if text.trim().is_empty() {
        return Ok(CloudConfig::default());
    }
    serde_yaml::from_str(text).map_err(|e| InputError::parse(path, &e))
}

impl From<CloudConfig> for Config {
    fn from(cloud: CloudConfig) -> Self {
        Config {
            backend_pool_type: cloud.load_balancer_backend_pool_configuration_type,
            load_balancer_sku: cloud.load_balancer_sku,
            multiple_standard_load_balancers: cloud
                .multiple_standard_load_balancer_configurations
                .into_iter()
                .map(|lb| lb.name)
                .collect(),
        }
    }
}

/// The keys of the cloud configuration that say where the Azure resources live.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ScopeKeys {
    #[serde(default)]
    subscription_id: String,
    #[serde(default)]
    resource_group: String,
    #[serde(default)]
    location: String,
    #[serde(default)]
    vnet_name: String,
    #[serde(default)]
    vnet_resource_group: String,
}

/// Reads where the Azure resources live from the cloud configuration: `subscriptionId`,
/// `resourceGroup`, `location` and `vnetName` are required; `vnetResourceGroup` defaults to
/// `resourceGroup`. The ServiceGateway's name is not in that file and is given.
pub fn read_scope(path: &Path, service_gateway: &str) -> Result<Scope, InputError> {
    parse_scope(path, &read(path)?, service_gateway)
}

pub fn parse_scope(path: &Path, text: &str, service_gateway: &str) -> Result<Scope, InputError> {
    let text = check_yaml(path, text)?;
    let keys: ScopeKeys = if text.trim().is_empty() {
        ScopeKeys::default()
    } else {
        serde_yaml::from_str(text).map_err(|e| InputError::parse(path, &e))?
    };
    let required = |value: String, key: &'static str| {
        if value.trim().is_empty() { Err(InputError::Missing { path: path.to_owned(), key }) } else { Ok(value) }
    };
    let resource_group = required(keys.resource_group, "resourceGroup")?;
    Ok(Scope {
        subscription: required(keys.subscription_id, "subscriptionId")?,
        location: required(keys.location, "location")?,
        vnet: required(keys.vnet_name, "vnetName")?,
        vnet_resource_group: Some(keys.vnet_resource_group)
            .filter(|rg| !rg.trim().is_empty())
            .unwrap_or_else(|| resource_group.clone()),
        resource_group,
        service_gateway: service_gateway.to_owned(),
    })
}

/// Reads every document of a manifest file as a `T` (e.g. a Service); `---` separates them.
pub fn read_manifests<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>, InputError> {
    parse_manifests(path, &read(path)?)
}

pub fn parse_manifests<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<Vec<T>, InputError> {
    let text = check_yaml(path, text)?;
    let mut objects = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        // An empty document (e.g. after a trailing `---`) reads as `None`.
        if let Some(object) = Option::<T>::deserialize(document).map_err(|e| InputError::parse(path, &e))? {
            objects.push(object);
        }
    }
    Ok(objects)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn interval(text: &str) -> Duration {
        parse_cloud_config(Path::new("azure.json"), text).unwrap().pool_updater_config().interval
    }

    fn depth_error(text: &str) -> Option<usize> {
        match check_yaml(Path::new("x.yaml"), text) {
            Err(InputError::Parse { line, reason, .. }) if reason.contains("nested deeper") => Some(line),
            _ => None,
        }
    }

    #[test]
    fn yaml_as_deep_as_the_limit_is_read_and_one_level_deeper_is_refused_at_its_line() {
        let block = |levels: usize| -> String { (0..levels).map(|d| format!("{}k{d}:\n", "  ".repeat(d))).collect() };
        assert_eq!(depth_error(&block(MAX_DEPTH)), None);
        assert_eq!(depth_error(&block(MAX_DEPTH + 1)), Some(MAX_DEPTH + 1));
        let flow = |levels: usize| format!("a: {}{}\n", "[".repeat(levels - 1), "]".repeat(levels - 1));
        assert_eq!(depth_error(&flow(MAX_DEPTH)), None);
        assert_eq!(depth_error(&flow(MAX_DEPTH + 1)), Some(1));
        let dashes = |levels: usize| format!("{}x\n", "- ".repeat(levels));
        assert_eq!(depth_error(&dashes(MAX_DEPTH)), None);
        assert_eq!(depth_error(&dashes(MAX_DEPTH + 1)), Some(1));
    }

    #[test]
    fn brackets_in_quotes_comments_and_block_scalars_do_not_count_as_nesting() {
        let brackets = "[".repeat(200);
        let text = format!(
            "a: \"{brackets}\"\nb: '{brackets}'\nc: 1 # {brackets}\nd: |\n  {brackets}\n  don't [ {{\ne: {{f: [1, 2]}}\n"
        );
        assert_eq!(check_yaml(Path::new("x.yaml"), &text).map(|_| ()).map_err(|e| e.to_string()), Ok(()));
    }

    #[test]
    fn a_key_twice_in_one_mapping_is_refused_and_a_byte_order_mark_is_dropped() {
        let err = check_yaml(Path::new("x.yaml"), "a: 1\nb:\n  c: 1\n  c: 2\n").unwrap_err().to_string();
        assert!(err.starts_with("x.yaml:") && err.contains("duplicate entry with key \"c\""), "{err}");
        assert_eq!(check_yaml(Path::new("x.yaml"), "\u{feff}a: 1\n").unwrap(), "a: 1\n");
    }

    #[test]
    fn the_backend_pool_update_interval_comes_from_the_cloud_config_and_defaults_to_upstreams_when_absent_or_zero() {
        assert_eq!(interval("loadBalancerBackendPoolUpdateIntervalInSeconds: 5\n"), Duration::from_secs(5));
        assert_eq!(interval("loadBalancerSku: standard\n"), crate::backend_pools::DEFAULT_INTERVAL);
        assert_eq!(
            interval("loadBalancerBackendPoolUpdateIntervalInSeconds: 0\n"),
            crate::backend_pools::DEFAULT_INTERVAL
        );
    }
}
