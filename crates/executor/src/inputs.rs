//! Reading the operator's files: the cloud configuration and Kubernetes manifests, with errors
//! that name the file, the line and the reason.
//!
//! Every file is read through [`clb_sandbox::bounded::read`] (so `/dev/zero` or a 2 GB file is
//! refused after its limit, not read to the end), and every YAML text is parsed by
//! [`from_yaml`] or [`from_yaml_documents`] (serde-saphyr, a pure-Rust parser that enforces its
//! limits while it parses): nesting at most [`MAX_DEPTH`] deep, a bounded number of nodes, no
//! key twice in one mapping (Kubernetes refuses a manifest with a duplicate key), a leading
//! UTF-8 byte order mark ignored.

use crate::backend_pools::PoolUpdaterConfig;
use clb_azure::Scope;
use clb_sandbox::bindings::clb::reconciler::types::Config;
use clb_sandbox::bindings::exports::clb::reconciler::backend_pools::{
    LabelRequirement as LabelRequirementRecord, LabelSelector as WitLabelSelector, SlbConfiguration,
};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Why an input file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error(transparent)]
    Read(#[from] clb_sandbox::bounded::ReadError),
    #[error("{path}:{line}: {reason}")]
    Parse { path: PathBuf, line: usize, reason: String },
    #[error("{path}: `{key}` is missing or empty; `clb-host run` needs it to name the Azure resources")]
    Missing { path: PathBuf, key: &'static str },
    #[error("{path}: not UTF-8 text (at byte {at})")]
    NotText { path: PathBuf, at: usize },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// The largest text file read: a ConfigMap's 1 MiB, which bounds any Kubernetes object or
/// cloud configuration an operator could keep in the cluster.
pub const MAX_TEXT_BYTES: u64 = 1 << 20;
/// The deepest nesting of YAML collections accepted; a Kubernetes object, `managedFields`
/// included, stays far below it.
pub const MAX_DEPTH: usize = 64;

/// The parser's limits: serde-saphyr's budget (at most 250,000 nodes, 1,000,000 events and
/// 1,024 documents; anchors and aliases bounded against alias bombs), nesting at most
/// [`MAX_DEPTH`] deep (flow collections included), and no key twice in one mapping — anywhere,
/// even in fields the reader ignores.
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! { max_depth: MAX_DEPTH, flow_nesting_limit: MAX_DEPTH },
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
    }
}

/// Reads one YAML (or JSON) document as a `T`: `None` when it holds nothing (empty, or only
/// comments). A leading byte order mark is skipped.
pub fn from_yaml<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<Option<T>, InputError> {
    serde_saphyr::from_str_with_options(text, yaml_options()).map_err(|e| InputError::parse(path, text, &e))
}

/// Reads every document of a YAML stream (`---` separates them) as a `T`; empty ones are
/// skipped.
pub fn from_yaml_documents<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<Vec<T>, InputError> {
    serde_saphyr::from_multiple_with_options(text, yaml_options()).map_err(|e| InputError::parse(path, text, &e))
}

impl InputError {
    fn parse(path: &Path, text: &str, err: &serde_saphyr::Error) -> Self {
        let location = err.location();
        let line = location.map_or(1, |l| usize::try_from(l.line()).unwrap_or(usize::MAX));
        let plain = err.without_snippet();
        // The parser's own recursion guard fires before the budget on deep flow collections.
        let message = plain.render_with_formatter(&serde_saphyr::UserMessageFormatter);
        let too_deep = matches!(
            plain,
            serde_saphyr::Error::Budget { breach: serde_saphyr::budget::BudgetBreach::Depth { .. }, .. }
        ) || message.starts_with("recursion limit exceeded");
        let mut reason = if too_deep {
            format!("nested deeper than {MAX_DEPTH} levels")
        } else {
            // The message ends with " at line L, column C"; the line is already in front.
            message.split(" at line ").next().unwrap_or(&message).to_owned()
        };
        // "invalid i32" says what was expected, not what was found: quote the scalar.
        if reason.starts_with("invalid ")
            && let Some(found) = location.and_then(|l| scalar_at(text, line, usize::try_from(l.column()).ok()?))
        {
            reason = format!("{reason}, found {found:?}");
        }
        Self::Parse { path: path.to_owned(), line, reason }
    }
}

/// The scalar that starts at `line`:`column` (1-based) of `text`, as written: up to the end of
/// the line, a comment or a flow delimiter, and at most 64 characters.
fn scalar_at(text: &str, line: usize, column: usize) -> Option<String> {
    let rest: String = text.lines().nth(line.checked_sub(1)?)?.chars().skip(column.checked_sub(1)?).collect();
    let end = rest.find([',', ']', '}']).unwrap_or(rest.len()).min(rest.find(" #").unwrap_or(rest.len()));
    let found: String = rest[..end].trim().chars().take(64).collect();
    (!found.is_empty()).then_some(found)
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
    /// `loadBalancerName`: in multi-SLB local-service mode, the cluster's name when it is set
    /// ([`CloudConfig::cluster_name`]).
    #[serde(default)]
    load_balancer_name: String,
}

/// The cluster's name when nothing says another: upstream's `--cluster-name` default.
pub const DEFAULT_CLUSTER_NAME: &str = "kubernetes";

/// One entry of `multipleStandardLoadBalancerConfigurations`: every key upstream's entry has is
/// read. `primaryVMSet` (required, unique, as upstream's `checkEnableMultipleStandardLoadBalancers`
/// requires it) and `nodeSelector` choose the nodes of the cluster's own pools, which this
/// controller never writes (a local Service's pool holds its endpoints' nodes), so they are
/// checked and otherwise unused.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MultipleStandardLoadBalancer {
    name: String,
    #[serde(default, rename = "primaryVMSet", alias = "primaryVmSet")]
    primary_vm_set: String,
    #[serde(default)]
    allow_service_placement: Option<bool>,
    #[serde(default)]
    service_label_selector: Option<LabelSelector>,
    #[serde(default)]
    service_namespace_selector: Option<LabelSelector>,
}

/// A Kubernetes `LabelSelector` as written (`metav1.LabelSelector`); the guest checks it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    #[serde(default)]
    match_labels: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    match_expressions: Option<Vec<LabelRequirement>>,
}

/// One `matchExpressions` entry.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelRequirement {
    key: String,
    operator: String,
    #[serde(default)]
    values: Option<Vec<String>>,
}

impl From<&LabelSelector> for WitLabelSelector {
    fn from(s: &LabelSelector) -> Self {
        WitLabelSelector {
            match_labels: s.match_labels.clone().unwrap_or_default().into_iter().collect(),
            match_expressions: s
                .match_expressions
                .iter()
                .flatten()
                .map(|r| LabelRequirementRecord {
                    key: r.key.clone(),
                    operator: r.operator.clone(),
                    values: r.values.clone().unwrap_or_default(),
                })
                .collect(),
        }
    }
}

impl CloudConfig {
    /// The multi-SLB entries with the fields Service placement reads (a field copy).
    pub fn slb_configurations(&self) -> Vec<SlbConfiguration> {
        self.multiple_standard_load_balancer_configurations
            .iter()
            .map(|lb| SlbConfiguration {
                name: lb.name.clone(),
                allow_service_placement: lb.allow_service_placement,
                service_label_selector: lb.service_label_selector.as_ref().map(Into::into),
                service_namespace_selector: lb.service_namespace_selector.as_ref().map(Into::into),
            })
            .collect()
    }

    /// Upstream's `checkEnableMultipleStandardLoadBalancers` on the entries, in its words: each
    /// has a `primaryVMSet`, and no two share one (compared case-insensitively, as upstream's set
    /// compares them). A name twice is the guest's `validate-config` refusal, in the same words.
    pub fn check(&self, path: &Path) -> Result<(), InputError> {
        let mut vm_sets = std::collections::BTreeSet::new();
        for lb in &self.multiple_standard_load_balancer_configurations {
            let reason = if lb.primary_vm_set.is_empty() {
                format!("multiple standard load balancer configuration {} must have primary VMSet", lb.name)
            } else if !vm_sets.insert(lb.primary_vm_set.to_ascii_lowercase()) {
                format!(
                    "duplicated primary VMSet {} in multiple standard load balancer configurations {}",
                    lb.primary_vm_set, lb.name
                )
            } else {
                continue;
            };
            return Err(InputError::Invalid { path: path.to_owned(), reason });
        }
        Ok(())
    }

    /// The cluster's name as upstream's `getAzureLoadBalancerName` reads it: `loadBalancerName`
    /// when set, else `flag` (the controller's `--cluster-name`). Multi-SLB placement ignores a
    /// public IP tagged with another cluster's name.
    pub fn cluster_name(&self, flag: &str) -> String {
        let name = &self.load_balancer_name;
        if name.is_empty() { flag.to_owned() } else { name.clone() }
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
pub fn read(path: &Path) -> Result<String, InputError> {
    String::from_utf8(clb_sandbox::bounded::read(path, MAX_TEXT_BYTES)?)
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
    let config: CloudConfig = from_yaml(path, text)?.unwrap_or_default();
    config.check(path)?;
    Ok(config)
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
            // Not a key of the cloud config: `--write-budget` (`cli/args.rs`) sets it.
            write_budgets: None,
        }
    }
}

/// The keys of the cloud configuration that say where the Azure resources live.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ScopeKeys {
    #[serde(default)]
    subscription_id: String,
    /// Upstream's key, spelled as upstream spells it (Go's decoder also takes other cases).
    #[serde(default, rename = "networkResourceSubscriptionID", alias = "networkResourceSubscriptionId")]
    network_resource_subscription_id: String,
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
/// `resourceGroup`. The network resources (and so every ID and URL here) are in
/// `networkResourceSubscriptionID` when it names one, else in `subscriptionId`, as upstream's.
/// The ServiceGateway's name is not in that file and is given.
pub fn read_scope(path: &Path, service_gateway: &str) -> Result<Scope, InputError> {
    parse_scope(path, &read(path)?, service_gateway)
}

pub fn parse_scope(path: &Path, text: &str, service_gateway: &str) -> Result<Scope, InputError> {
    let keys: ScopeKeys = from_yaml(path, text)?.unwrap_or_default();
    let required = |value: String, key: &'static str| {
        if value.trim().is_empty() { Err(InputError::Missing { path: path.to_owned(), key }) } else { Ok(value) }
    };
    let subscription = required(keys.subscription_id, "subscriptionId")?;
    let resource_group = required(keys.resource_group, "resourceGroup")?;
    Ok(Scope {
        subscription: Some(keys.network_resource_subscription_id)
            .filter(|sub| !sub.trim().is_empty())
            .unwrap_or(subscription),
        location: required(keys.location, "location")?,
        vnet: required(keys.vnet_name, "vnetName")?,
        vnet_resource_group: Some(keys.vnet_resource_group)
            .filter(|rg| !rg.trim().is_empty())
            .unwrap_or_else(|| resource_group.clone()),
        resource_group,
        service_gateway: required(service_gateway.to_owned(), "--service-gateway")?,
    })
}

/// Reads every document of a manifest file as a `T` (e.g. a Service); `---` separates them.
pub fn read_manifests<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>, InputError> {
    parse_manifests(path, &read(path)?)
}

pub fn parse_manifests<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<Vec<T>, InputError> {
    from_yaml_documents(path, text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn interval(text: &str) -> Duration {
        parse_cloud_config(Path::new("azure.json"), text).unwrap().pool_updater_config().interval
    }

    fn depth_error(text: &str) -> Option<usize> {
        match from_yaml::<serde::de::IgnoredAny>(Path::new("x.yaml"), text) {
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
        let read = from_yaml::<serde::de::IgnoredAny>(Path::new("x.yaml"), &text);
        assert_eq!(read.map(|_| ()).map_err(|e| e.to_string()), Ok(()));
    }

    #[test]
    fn a_key_twice_in_one_mapping_is_refused_and_a_byte_order_mark_is_dropped() {
        type Map = std::collections::BTreeMap<String, serde::de::IgnoredAny>;
        let err = from_yaml::<Map>(Path::new("x.yaml"), "a: 1\nb:\n  c: 1\n  c: 2\n").unwrap_err().to_string();
        assert_eq!(err, "x.yaml:4: duplicate mapping key `c` is not allowed here");
        // Even where the reader ignores the field (a struct without `b`).
        let err = parse_cloud_config(Path::new("x.yaml"), "b:\n  c: 1\n  c: 2\n").unwrap_err().to_string();
        assert!(err.starts_with("x.yaml:3: duplicate mapping key"), "{err}");
        let read = from_yaml::<std::collections::BTreeMap<String, u32>>(Path::new("x.yaml"), "\u{feff}a: 1\n").unwrap();
        assert_eq!(read, Some([("a".to_owned(), 1)].into()));
    }

    #[test]
    fn a_value_of_the_wrong_type_is_refused_with_its_line_and_the_text_found() {
        let text = "loadBalancerSku: standard\nloadBalancerBackendPoolUpdateIntervalInSeconds: soon # later\n";
        let err = parse_cloud_config(Path::new("azure.yaml"), text).unwrap_err().to_string();
        assert_eq!(err, "azure.yaml:2: invalid u64, found \"soon\"");
        assert_eq!(scalar_at("a: [1, x2]\n", 1, 8).as_deref(), Some("x2"));
        assert_eq!(scalar_at("a: 1\n", 3, 1), None);
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

    const SCOPE: &str = "subscriptionId: sub-1\nresourceGroup: rg-aks\nlocation: westeurope\nvnetName: aks-vnet\n";

    // Ports upstream TestDiffTrackerConfig and TestVNetResourceGroupOrDefault: the cloud
    // config's keys become the scope every ARM ID is built from, and the VNet's resource group
    // defaults to the cluster's when absent or blank.
    // Upstream TestConvertServiceDTOsToServiceRequests_VNetResourceGroup and TestConfigValidationInWorkflow.
    // Upstream TestConfigValidate "valid config".
    #[test]
    fn the_cloud_config_names_the_scope_and_the_vnet_resource_group_defaults_to_the_clusters() {
        let path = Path::new("azure.json");
        let scope = parse_scope(path, SCOPE, "servicegateway").unwrap();
        assert_eq!(
            (scope.subscription.as_str(), scope.resource_group.as_str(), scope.location.as_str(), scope.vnet.as_str()),
            ("sub-1", "rg-aks", "westeurope", "aks-vnet")
        );
        assert_eq!(scope.vnet_resource_group, "rg-aks");
        assert_eq!(scope.service_gateway, "servicegateway");
        let blank = parse_scope(path, &format!("{SCOPE}vnetResourceGroup: \"  \"\n"), "servicegateway").unwrap();
        assert_eq!(blank.vnet_resource_group, "rg-aks");
        let own = parse_scope(path, &format!("{SCOPE}vnetResourceGroup: rg-net\n"), "servicegateway").unwrap();
        assert_eq!(own.vnet_resource_group, "rg-net");
        assert!(own.vnet_id().starts_with("/subscriptions/sub-1/resourceGroups/rg-net/"), "{}", own.vnet_id());
    }

    // Upstream TestCheckEnableMultipleStandardLoadBalancers, its last two cases: an entry without
    // `primaryVMSet`, and a VM set twice, are each refused with upstream's words after the file's
    // name; `parse_config` (what `validate` and `run` read) refuses them too. Its first case (a
    // name twice) is the guest's `duplicate_multi_slb_names_are_refused`.
    #[test]
    fn multi_slb_entries_need_unique_names_and_each_its_own_primary_vm_set() {
        let path = Path::new("azure.json");
        let entries = |list: &str| {
            format!(
                "loadBalancerBackendPoolConfigurationType: nodeIP\nmultipleStandardLoadBalancerConfigurations: [{list}]\n"
            )
        };
        for (list, reason) in [
            (
                "{name: kubernetes, primaryVMSet: vmss-0}, {name: lb1}",
                "multiple standard load balancer configuration lb1 must have primary VMSet",
            ),
            (
                "{name: kubernetes, primaryVMSet: vmss-0}, {name: lb1, primaryVMSet: vmss-2}, {name: lb2, primaryVMSet: vmss-2}",
                "duplicated primary VMSet vmss-2 in multiple standard load balancer configurations lb2",
            ),
        ] {
            let refused = parse_cloud_config(path, &entries(list)).unwrap_err().to_string();
            assert_eq!(refused, format!("azure.json: {reason}"));
            assert!(matches!(parse_config(path, &entries(list)), Err(InputError::Invalid { .. })), "{list}");
        }
        let fine = entries("{name: kubernetes, primaryVMSet: vmss-0}, {name: lb1, primaryVMSet: vmss-1}");
        assert_eq!(parse_cloud_config(path, &fine).unwrap().slb_configurations().len(), 2);
    }

    // Upstream's service selectors are read whole: `matchLabels` and `matchExpressions` (values
    // absent read as none), `null` as no selector; a key a LabelSelector does not have is refused
    // with its line, not ignored.
    #[test]
    fn multi_slb_service_selectors_are_read_whole_and_an_unknown_selector_key_is_refused() {
        let path = Path::new("azure.json");
        let entry = |extra: &str| {
            format!(
                "loadBalancerBackendPoolConfigurationType: nodeIP\nmultipleStandardLoadBalancerConfigurations:\n\
                 - name: lb1\n  primaryVMSet: pool1\n  nodeSelector: {{matchLabels: {{pool: a}}}}\n{extra}"
            )
        };
        let text = entry(
            "  serviceLabelSelector: {matchLabels: {app: web, tier: front}}\n  serviceNamespaceSelector: \
             {matchExpressions: [{key: team, operator: In, values: [a, b]}, {key: legacy, operator: DoesNotExist}]}\n",
        );
        let config = parse_cloud_config(path, &text).unwrap();
        let [lb] = &config.slb_configurations()[..] else { panic!("one entry") };
        let labels = lb.service_label_selector.as_ref().unwrap();
        let pairs = [("app".to_owned(), "web".to_owned()), ("tier".to_owned(), "front".to_owned())];
        assert_eq!(labels.match_labels, pairs);
        let namespace = lb.service_namespace_selector.as_ref().unwrap();
        let expressions: Vec<_> =
            namespace.match_expressions.iter().map(|r| (r.key.as_str(), r.operator.as_str(), r.values.len())).collect();
        assert_eq!(expressions, [("team", "In", 2), ("legacy", "DoesNotExist", 0)]);
        let none = parse_cloud_config(path, &entry("  serviceLabelSelector: null\n")).unwrap();
        let [none] = &none.slb_configurations()[..] else { panic!("one entry") };
        assert!(none.service_label_selector.is_none() && none.service_namespace_selector.is_none());
        let unknown = parse_cloud_config(path, &entry("  serviceLabelSelector: {matchLabel: {app: web}}\n"));
        assert!(matches!(unknown, Err(InputError::Parse { line: 6, .. })), "{unknown:?}");
    }

    // Ports upstream TestConfigServiceGatewayResourceID and the network half of TestDiffTrackerConfig:
    // `networkResourceSubscriptionID` moves every network resource's ID (the ServiceGateway's, the
    // VNet's, the public IPs', load balancers' and NAT gateways') to that subscription; blank or
    // absent, they stay in `subscriptionId`, which is required either way.
    #[test]
    fn a_network_resource_subscription_holds_every_network_resource_id() {
        let path = Path::new("azure.json");
        let sgw = "/resourceGroups/rg-aks/providers/Microsoft.Network/serviceGateways/servicegateway";
        let own = parse_scope(path, SCOPE, "servicegateway").unwrap();
        assert_eq!(own.service_gateway_id(), format!("/subscriptions/sub-1{sgw}"));
        for key in ["networkResourceSubscriptionID", "networkResourceSubscriptionId"] {
            let text = format!("{SCOPE}{key}: network-sub\n");
            let scope = parse_scope(path, &text, "servicegateway").unwrap();
            assert_eq!(scope.service_gateway_id(), format!("/subscriptions/network-sub{sgw}"), "{key}");
            for id in [
                scope.vnet_id(),
                scope.public_ip_id("u-pip"),
                scope.load_balancer_id("u"),
                scope.nat_gateway_id("egress-a"),
                scope.frontend_id("u"),
            ] {
                assert!(id.starts_with("/subscriptions/network-sub/resourceGroups/rg-aks/"), "{key}: {id}");
            }
        }
        let blank = parse_scope(path, &format!("{SCOPE}networkResourceSubscriptionID: \" \"\n"), "servicegateway");
        assert_eq!(blank.unwrap().subscription, "sub-1");
        let alone = SCOPE.replace("subscriptionId: sub-1", "networkResourceSubscriptionID: network-sub");
        let missing = parse_scope(path, &alone, "servicegateway");
        assert!(matches!(missing, Err(InputError::Missing { key: "subscriptionId", .. })), "{missing:?}");
    }

    // Ports upstream TestConfigValidate: each key the scope needs is required, missing or blank,
    // and the error names it; so is the ServiceGateway's name (`--service-gateway`, upstream's
    // ServiceGatewayResourceName). The valid case is the_cloud_config_names_the_scope_....
    // Upstream TestConfigValidationInWorkflow.
    #[test]
    fn a_cloud_config_without_a_key_the_scope_needs_is_refused_naming_it() {
        for key in ["subscriptionId", "resourceGroup", "location", "vnetName"] {
            for text in [
                SCOPE.lines().filter(|l| !l.starts_with(key)).collect::<Vec<_>>().join("\n"),
                SCOPE
                    .lines()
                    .map(|l| if l.starts_with(key) { format!("{key}: \"\"") } else { l.to_owned() })
                    .collect::<Vec<_>>()
                    .join("\n"),
            ] {
                match parse_scope(Path::new("azure.json"), &text, "servicegateway") {
                    Err(InputError::Missing { key: missing, .. }) => assert_eq!(missing, key, "{text}"),
                    other => panic!("{key}: {other:?}"),
                }
            }
        }
        for service_gateway in ["", "  "] {
            match parse_scope(Path::new("azure.json"), SCOPE, service_gateway) {
                Err(InputError::Missing { key, .. }) => assert_eq!(key, "--service-gateway"),
                other => panic!("{service_gateway:?}: {other:?}"),
            }
        }
    }
}
