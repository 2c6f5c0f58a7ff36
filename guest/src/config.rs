//! The configuration rules of docs/design.md §3: which combinations of backend-pool type, SKU and
//! multi-SLB list the logic runs under, and the mode each one turns on.

use crate::budget::{self, Budget, WriteBudgets};
use serde::{Deserialize, Serialize};
use std::fmt;

pub const FIELD_BACKEND_POOL_TYPE: &str = "loadBalancerBackendPoolConfigurationType";
pub const FIELD_SKU: &str = "loadBalancerSku";
pub const FIELD_MULTI_SLB: &str = "multipleStandardLoadBalancerConfigurations";
/// Not a key of the cloud config: the hosts take write budgets from their flags
/// (`clb-host --write-budget`), and name them so.
pub const FIELD_WRITE_BUDGETS: &str = "writeBudgets";

/// The configuration as the operator wrote it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub backend_pool_type: String,
    pub load_balancer_sku: String,
    pub multiple_standard_load_balancers: Vec<String>,
    /// `None`: [`WriteBudgets::DEFAULT`].
    pub write_budgets: Option<WriteBudgets>,
}

impl Config {
    /// The write budgets the tracker keeps to.
    pub fn write_budgets(&self) -> WriteBudgets {
        self.write_budgets.unwrap_or_default()
    }
}

/// What a valid configuration turns on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    ContainerLoadBalancer,
    MultiSlbLocalServices,
    Inactive,
}

/// A configuration the logic refuses to run under.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
    pub message: String,
}

impl ConfigError {
    #[inline(never)] // one copy for its many callers (component size, BENCHMARKS.md)
    fn new(field: &str, reason: &str, message: String) -> Self {
        Self { field: field.to_owned(), reason: reason.to_owned(), message }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.reason, self.field, self.message)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BackendPoolType {
    NodeIpConfiguration,
    NodeIp,
    PodIp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sku {
    Basic,
    Standard,
    StandardV2,
}

fn parse_backend_pool_type(raw: &str) -> Result<BackendPoolType, ConfigError> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "" | "nodeipconfiguration" => Ok(BackendPoolType::NodeIpConfiguration),
        "nodeip" => Ok(BackendPoolType::NodeIp),
        "podip" => Ok(BackendPoolType::PodIp),
        _ => Err(ConfigError::new(
            FIELD_BACKEND_POOL_TYPE,
            "UnsupportedBackendPoolType",
            format!(
                "{FIELD_BACKEND_POOL_TYPE} {raw:?} is not supported; supported values are \
                 nodeIPConfiguration, nodeIP and podIP"
            ),
        )),
    }
}

fn parse_sku(raw: &str) -> Result<Sku, ConfigError> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "basic" => Ok(Sku::Basic),
        "" | "standard" => Ok(Sku::Standard),
        "standardv2" => Ok(Sku::StandardV2),
        _ => Err(ConfigError::new(
            FIELD_SKU,
            "UnsupportedLoadBalancerSku",
            format!("{FIELD_SKU} {raw:?} is not supported; supported values are basic, standard and standardV2"),
        )),
    }
}

fn check_multi_slb_names(names: &[String]) -> Result<(), ConfigError> {
    let mut seen = crate::keyed::Set::new();
    for name in names {
        let folded = name.trim().to_ascii_lowercase();
        if folded.is_empty() {
            return Err(ConfigError::new(
                FIELD_MULTI_SLB,
                "InvalidMultipleStandardLoadBalancerConfiguration",
                format!("{FIELD_MULTI_SLB} has an entry with an empty name"),
            ));
        }
        if !seen.insert(folded) {
            return Err(ConfigError::new(
                FIELD_MULTI_SLB,
                "InvalidMultipleStandardLoadBalancerConfiguration",
                // Upstream's words (`checkEnableMultipleStandardLoadBalancers`); names compare
                // case-insensitively, as its set compares them.
                format!("duplicated multiple standard load balancer configuration name {name}"),
            ));
        }
    }
    Ok(())
}

/// A budget of no writes would never write; one above the maxima cannot be meant (and is where
/// the bucket arithmetic would stop being exact).
fn check_write_budgets(budgets: &WriteBudgets) -> Result<(), ConfigError> {
    let named = [
        ("update-address-locations", budgets.update_address_locations),
        ("update-services", budgets.update_services),
        ("arm-writes", budgets.arm_writes),
    ];
    for (name, Budget { per_minute, burst }) in named {
        let rate_ok = (1..=budget::MAX_PER_MINUTE).contains(&per_minute);
        if !rate_ok || !(1..=budget::MAX_BURST).contains(&burst) {
            return Err(ConfigError::new(
                FIELD_WRITE_BUDGETS,
                "InvalidWriteBudget",
                format!(
                    "the write budget of {name} is {per_minute} per minute with a burst of {burst}; the rate must be \
                     1 to {} per minute and the burst 1 to {}",
                    budget::MAX_PER_MINUTE,
                    budget::MAX_BURST
                ),
            ));
        }
    }
    // A reserve of ARM's whole documented bucket would leave the logic no write on a
    // subscription of that bucket, ever.
    if budgets.arm_write_reserve >= budget::ARM_WRITE_BUCKET {
        return Err(ConfigError::new(
            "armWriteReserve",
            "InvalidWriteBudget",
            format!(
                "the ARM write reserve is {}; it must be 0 to {}, below ARM's documented bucket of {} writes (what \
                 is left to other clients of the subscription)",
                budgets.arm_write_reserve,
                budget::ARM_WRITE_BUCKET - 1,
                budget::ARM_WRITE_BUCKET
            ),
        ));
    }
    Ok(())
}

/// Checks a configuration and tells the mode it turns on.
///
/// CLB mode is `podIP` **and** `standardV2`; `podIP` on another SKU is refused (upstream silently
/// installed no backend pool at all), and so is CLB together with a multi-SLB list.
pub fn validate_config(config: &Config) -> Result<Mode, ConfigError> {
    let pool_type = parse_backend_pool_type(&config.backend_pool_type)?;
    let sku = parse_sku(&config.load_balancer_sku)?;
    let multi_slb = &config.multiple_standard_load_balancers;
    check_multi_slb_names(multi_slb)?;
    if let Some(budgets) = &config.write_budgets {
        check_write_budgets(budgets)?;
    }
    match (pool_type, sku) {
        (BackendPoolType::PodIp, Sku::StandardV2) if !multi_slb.is_empty() => Err(ConfigError::new(
            FIELD_MULTI_SLB,
            "MultipleStandardLoadBalancersNotSupported",
            format!(
                "the Container Load Balancer (podIP with standardV2) does not support multiple standard \
                 load balancers; remove the {} entries of {FIELD_MULTI_SLB} or use another backend pool type",
                multi_slb.len()
            ),
        )),
        (BackendPoolType::PodIp, Sku::StandardV2) => Ok(Mode::ContainerLoadBalancer),
        (BackendPoolType::PodIp, other) => Err(ConfigError::new(
            FIELD_SKU,
            "PodIPRequiresStandardV2",
            format!(
                "{FIELD_BACKEND_POOL_TYPE} podIP requires {FIELD_SKU} standardV2, but it is {}",
                match other {
                    Sku::Basic => "basic",
                    Sku::Standard if config.load_balancer_sku.trim().is_empty() => "unset (standard)",
                    _ => "standard",
                }
            ),
        )),
        _ if !multi_slb.is_empty() => Ok(Mode::MultiSlbLocalServices),
        _ => Ok(Mode::Inactive),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pool: &str, sku: &str, multi: &[&str]) -> Config {
        Config {
            backend_pool_type: pool.into(),
            load_balancer_sku: sku.into(),
            multiple_standard_load_balancers: multi.iter().map(|s| s.to_string()).collect(),
            write_budgets: None,
        }
    }

    // Upstream TestRuntimeEnablementAndLoadBalancer (differs: CLB mode comes from podIP and standardV2,
    // there is no enable flag).
    #[test]
    fn pod_ip_with_standard_v2_is_clb_mode_whatever_the_case() {
        assert_eq!(validate_config(&config("PODIP", "StandardV2", &[])), Ok(Mode::ContainerLoadBalancer));
        assert_eq!(validate_config(&config("podIP", "standardv2", &[])), Ok(Mode::ContainerLoadBalancer));
    }

    // Upstream TestRuntimeEnablementAndLoadBalancer (differs: CLB mode comes from podIP and standardV2,
    // there is no enable flag).
    #[test]
    fn empty_configuration_means_node_ip_configuration_and_no_clb() {
        assert_eq!(validate_config(&Config::default()), Ok(Mode::Inactive));
    }

    #[test]
    fn multi_slb_without_pod_ip_turns_on_local_service_mode() {
        assert_eq!(validate_config(&config("nodeIP", "standard", &["lb1"])), Ok(Mode::MultiSlbLocalServices));
    }

    #[test]
    fn pod_ip_on_standard_is_refused_naming_the_sku() {
        let err = validate_config(&config("podIP", "", &[])).unwrap_err();
        assert_eq!(err.reason, "PodIPRequiresStandardV2");
        assert_eq!(err.field, FIELD_SKU);
        assert!(err.message.contains("unset (standard)"), "{}", err.message);
    }

    #[test]
    fn a_write_budget_of_no_writes_or_past_the_maxima_is_refused_naming_the_operation() {
        let mut budgets = WriteBudgets::DEFAULT;
        budgets.update_services.burst = 0;
        let clb = config("podIP", "standardV2", &[]);
        let err = validate_config(&Config { write_budgets: Some(budgets), ..clb.clone() }).unwrap_err();
        assert_eq!((err.field.as_str(), err.reason.as_str()), (FIELD_WRITE_BUDGETS, "InvalidWriteBudget"));
        assert!(err.message.contains("update-services"), "{}", err.message);
        budgets.update_services.burst = 1;
        budgets.arm_writes.per_minute = budget::MAX_PER_MINUTE + 1;
        let err = validate_config(&Config { write_budgets: Some(budgets), ..clb.clone() }).unwrap_err();
        assert!(err.message.contains("arm-writes"), "{}", err.message);
        budgets.arm_writes.per_minute = budget::MAX_PER_MINUTE;
        assert_eq!(validate_config(&Config { write_budgets: Some(budgets), ..clb }), Ok(Mode::ContainerLoadBalancer));
        // Regression: a reserve of ARM's whole bucket or more left a pace that never refilled, so
        // no ARM-routed write went while ARM's figures came.
        let reserve = |r| Config {
            write_budgets: Some(WriteBudgets { arm_write_reserve: r, ..WriteBudgets::DEFAULT }),
            ..config("podIP", "standardV2", &[])
        };
        let err = validate_config(&reserve(budget::ARM_WRITE_BUCKET)).unwrap_err();
        assert_eq!((err.field.as_str(), err.reason.as_str()), ("armWriteReserve", "InvalidWriteBudget"));
        assert!(err.message.contains("must be 0 to 199"), "{}", err.message);
        assert_eq!(validate_config(&reserve(budget::ARM_WRITE_BUCKET - 1)), Ok(Mode::ContainerLoadBalancer));
    }

    // Upstream TestCheckEnableMultipleStandardLoadBalancers, its first case: a name twice (in any
    // case) is refused in upstream's words; its other cases are the host's (inputs.rs).
    #[test]
    fn duplicate_multi_slb_names_are_refused() {
        let err = validate_config(&config("nodeIP", "standard", &["lb1", "LB1"])).unwrap_err();
        assert_eq!(err.reason, "InvalidMultipleStandardLoadBalancerConfiguration");
        assert_eq!(err.message, "duplicated multiple standard load balancer configuration name LB1");
    }
}
