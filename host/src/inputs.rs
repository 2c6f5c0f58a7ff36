//! Reading the operator's files: the cloud configuration and Kubernetes manifests, with errors
//! that name the file, the line and the reason.

use crate::azure::Scope;
use crate::backend_pools::PoolUpdaterConfig;
use crate::sandbox::bindings::clb::reconciler::types::Config;
use crate::sandbox::bindings::exports::clb::reconciler::backend_pools::SlbConfiguration;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Why an input file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {reason}")]
    Parse { path: PathBuf, line: usize, reason: String },
    #[error("{path}: `{key}` is missing or empty; `clb-host run` needs it to name the Azure resources")]
    Missing { path: PathBuf, key: &'static str },
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

pub(crate) fn read(path: &Path) -> Result<String, InputError> {
    std::fs::read_to_string(path).map_err(|source| InputError::Read { path: path.to_owned(), source })
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
