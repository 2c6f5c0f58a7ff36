//! The JSON of the ARM and NRP APIs (docs/upstream.md §h.2), and the one mapping between it
//! and the host's request types. The client and the emulator both go through these builders, so
//! the in-process emulator sees exactly the bodies the HTTP client would send.
//!
//! Keys are camelCase; absent optional fields are omitted; lists that NRP reads as "set to
//! empty" (`addresses`, `services`, `loadBalancerBackendPools`) are always sent, `[]` when empty.

use super::{
    BackendAddress, BackendPool, FRONTEND_NAME, IpVersion, LbRule, ListedFrontend, ListedLoadBalancer, ListedLocation,
    ListedNatGateway, ListedPublicIp, ListedService, LoadBalancerSpec, LocationUpdate, NatGatewayLink, NatGatewaySpec,
    PoolRef, Protocol, PublicIpSpec, Scope, ServiceRequest, UpdateAction,
};
use serde::{Deserialize, Serialize};

/// `{"id": …}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdRef {
    pub id: String,
}

/// The ARM error envelope `{"error": {"code", "message"}}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorEnvelope {
    pub error: ErrorBody,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub message: String,
}

/// The body of an `Azure-AsyncOperation` poll.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AsyncOperationStatus {
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

/// A page of a list: `{"value": […], "nextLink"?}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Page<T> {
    pub value: Vec<T>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_link: Option<String>,
}

// ---- serviceGateways/updateServices, /services ----

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateServicesRequest {
    pub action: UpdateAction,
    pub service_requests: Vec<ServiceRequestEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceRequestEntry {
    pub is_delete: bool,
    pub service: GatewayService,
}

/// `ServiceGatewayService`: in requests and in `GET …/services`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayService {
    pub name: String,
    pub properties: GatewayServiceProperties,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayServiceProperties {
    pub service_type: String,
    #[serde(default)]
    pub load_balancer_backend_pools: Vec<PoolEntry>,
    /// Absent: omitted; `Some(None)`: an explicit JSON `null`, which clears the link.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "explicit_null")]
    pub public_nat_gateway_id: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_default: Option<bool>,
}

/// A backend pool reference inside a service: `{id, name, properties.virtualNetwork.id}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolEntry {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub properties: Option<PoolEntryProperties>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolEntryProperties {
    pub virtual_network: IdRef,
}

/// Serde for a field where absent, `null` and a value are three different things.
mod explicit_null {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<Option<String>>, s: S) -> Result<S::Ok, S::Error> {
        value.as_ref().and_then(|v| v.as_ref()).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
        Ok(Some(Option::<String>::deserialize(d)?))
    }
}

// ---- serviceGateways/updateAddressLocations, /addressLocations ----

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateAddressLocationsRequest {
    pub action: UpdateAction,
    pub address_locations: Vec<AddressLocationEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddressLocationEntry {
    pub address_location: String,
    pub address_update_action: UpdateAction,
    pub addresses: Vec<AddressEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressEntry {
    pub address: String,
    pub services: Vec<String>,
}

/// `ServiceGatewayAddressLocationResponse`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddressLocationResponse {
    pub address_location: String,
    #[serde(default, deserialize_with = "listed_addresses")]
    pub addresses: Vec<AddressEntry>,
}

/// The addresses of a listed location, read as NRP may send them: an address without `services` (or with
/// `null`) is bound to none, and an entry without an address names nothing and is skipped, rather than failing
/// the whole listing and with it the read of NRP.
fn listed_addresses<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<AddressEntry>, D::Error> {
    #[derive(Deserialize)]
    struct Listed {
        #[serde(default)]
        address: Option<String>,
        #[serde(default)]
        services: Option<Vec<String>>,
    }
    let listed = Option::<Vec<Listed>>::deserialize(d)?.unwrap_or_default();
    Ok(listed
        .into_iter()
        .filter_map(|a| Some(AddressEntry { address: a.address?, services: a.services.unwrap_or_default() }))
        .collect())
}

// ---- publicIPAddresses ----

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sku {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicIpAddress {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default)]
    pub location: String,
    #[serde(default)]
    pub sku: Sku,
    pub properties: PublicIpProperties,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicIpProperties {
    #[serde(rename = "publicIPAllocationMethod")]
    pub public_ip_allocation_method: String,
    #[serde(rename = "publicIPAddressVersion")]
    pub public_ip_address_version: IpVersion,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_state: Option<String>,
    /// What it is attached to (a load balancer's frontend, a NIC's IP configuration); only
    /// Azure sets it.
    #[serde(rename = "ipConfiguration", default, skip_serializing_if = "Option::is_none")]
    pub ip_configuration: Option<IdRef>,
}

// ---- loadBalancers ----

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    #[serde(default)]
    pub location: String,
    #[serde(default)]
    pub sku: Sku,
    pub properties: LoadBalancerProperties,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerProperties {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    #[serde(rename = "frontendIPConfigurations", default)]
    pub frontend_ip_configurations: Vec<FrontendIpConfiguration>,
    #[serde(default)]
    pub backend_address_pools: Vec<NamedEmpty>,
    #[serde(default)]
    pub load_balancing_rules: Vec<LoadBalancingRule>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrontendIpConfiguration {
    pub name: String,
    pub properties: FrontendIpProperties,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrontendIpProperties {
    /// A public frontend's public IP.
    #[serde(rename = "publicIPAddress", default, skip_serializing_if = "Option::is_none")]
    pub public_ip_address: Option<IdRef>,
    /// An internal frontend's address.
    #[serde(rename = "privateIPAddress", default, skip_serializing_if = "Option::is_none")]
    pub private_ip_address: Option<String>,
}

/// A child resource that is only named here (a pool "with empty properties", docs/upstream.md §h.2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedEmpty {
    pub name: String,
    #[serde(default)]
    pub properties: serde_json::Map<String, serde_json::Value>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadBalancingRule {
    pub name: String,
    pub properties: LoadBalancingRuleProperties,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancingRuleProperties {
    pub protocol: Protocol,
    pub frontend_port: u16,
    pub backend_port: u16,
    pub idle_timeout_in_minutes: u32,
    pub enable_tcp_reset: bool,
    #[serde(rename = "enableFloatingIP")]
    pub enable_floating_ip: bool,
    #[serde(rename = "frontendIPConfiguration")]
    pub frontend_ip_configuration: IdRef,
    pub backend_address_pool: IdRef,
}

// ---- loadBalancers/{lb}/backendAddressPools/{pool} ----

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackendAddressPool {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    #[serde(default)]
    pub properties: BackendAddressPoolProperties,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendAddressPoolProperties {
    #[serde(default)]
    pub load_balancer_backend_addresses: Vec<LoadBalancerBackendAddress>,
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadBalancerBackendAddress {
    pub name: String,
    pub properties: BackendAddressProperties,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendAddressProperties {
    pub ip_address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_network: Option<IdRef>,
}

// ---- natGateways ----

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NatGateway {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    #[serde(default)]
    pub location: String,
    #[serde(default)]
    pub sku: Sku,
    pub properties: NatGatewayProperties,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NatGatewayProperties {
    #[serde(default, deserialize_with = "null_as_empty")]
    pub public_ip_addresses: Vec<IdRef>,
    #[serde(rename = "publicIpAddressesV6", default, deserialize_with = "null_as_empty")]
    pub public_ip_addresses_v6: Vec<IdRef>,
    /// Always sent: JSON `null` is the disassociation, which leaving the key out would not be.
    #[serde(default)]
    pub service_gateway: Option<IdRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_state: Option<String>,
}

/// A list ARM may send as `null` (or leave out) when it is empty.
fn null_as_empty<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

// ---- host types → wire ----

pub fn update_services(scope: &Scope, action: UpdateAction, requests: &[ServiceRequest]) -> UpdateServicesRequest {
    let service_requests = requests
        .iter()
        .map(|r| ServiceRequestEntry {
            is_delete: r.is_delete,
            service: GatewayService {
                name: r.name.clone(),
                properties: GatewayServiceProperties {
                    service_type: r.service_type.as_str().to_owned(),
                    load_balancer_backend_pools: r
                        .backend_pools
                        .iter()
                        .map(|p| PoolEntry {
                            id: scope.backend_pool_id(p),
                            name: Some(p.pool.clone()),
                            properties: Some(PoolEntryProperties { virtual_network: IdRef { id: scope.vnet_id() } }),
                        })
                        .collect(),
                    public_nat_gateway_id: match &r.nat_gateway {
                        NatGatewayLink::Omit => None,
                        NatGatewayLink::Set(name) => Some(Some(scope.nat_gateway_id(name))),
                        NatGatewayLink::Clear => Some(None),
                    },
                    is_default: None,
                },
            },
        })
        .collect();
    UpdateServicesRequest { action, service_requests }
}

pub fn update_address_locations(action: UpdateAction, locations: &[LocationUpdate]) -> UpdateAddressLocationsRequest {
    let address_locations = locations
        .iter()
        .map(|l| AddressLocationEntry {
            address_location: l.location.clone(),
            address_update_action: l.action,
            addresses: l
                .addresses
                .iter()
                .map(|a| AddressEntry { address: a.address.clone(), services: a.services.clone() })
                .collect(),
        })
        .collect();
    UpdateAddressLocationsRequest { action, address_locations }
}

pub fn public_ip(scope: &Scope, spec: &PublicIpSpec) -> PublicIpAddress {
    PublicIpAddress {
        name: None,
        id: None,
        location: scope.location.clone(),
        sku: Sku { name: "StandardV2".into(), tier: Some("Regional".into()) },
        properties: PublicIpProperties {
            public_ip_allocation_method: "Static".into(),
            public_ip_address_version: spec.version,
            ip_address: None,
            provisioning_state: None,
            ip_configuration: None,
        },
        tags: None,
    }
}

pub fn load_balancer(scope: &Scope, spec: &LoadBalancerSpec) -> LoadBalancer {
    let pool_id = scope.backend_pool_id(&PoolRef { load_balancer: spec.name.clone(), pool: spec.backend_pool.clone() });
    let rule = |r: &LbRule| LoadBalancingRule {
        name: r.name.clone(),
        properties: LoadBalancingRuleProperties {
            protocol: r.protocol,
            frontend_port: r.frontend_port,
            backend_port: r.backend_port,
            idle_timeout_in_minutes: r.idle_timeout_minutes,
            enable_tcp_reset: r.enable_tcp_reset,
            enable_floating_ip: false,
            frontend_ip_configuration: IdRef { id: scope.frontend_id(&spec.name) },
            backend_address_pool: IdRef { id: pool_id.clone() },
        },
    };
    LoadBalancer {
        name: None,
        id: None,
        etag: None,
        location: scope.location.clone(),
        sku: Sku { name: "Service".into(), tier: None },
        properties: LoadBalancerProperties {
            scope: Some("Public".into()),
            frontend_ip_configurations: vec![FrontendIpConfiguration {
                name: FRONTEND_NAME.into(),
                properties: FrontendIpProperties {
                    public_ip_address: Some(IdRef { id: scope.public_ip_id(&spec.public_ip) }),
                    private_ip_address: None,
                },
            }],
            backend_address_pools: vec![NamedEmpty { name: spec.backend_pool.clone(), properties: Default::default() }],
            load_balancing_rules: spec.rules.iter().map(rule).collect(),
        },
    }
}

pub fn nat_gateway(scope: &Scope, spec: &NatGatewaySpec) -> NatGateway {
    let ids = |names: &[String]| names.iter().map(|n| IdRef { id: scope.public_ip_id(n) }).collect();
    NatGateway {
        name: None,
        id: None,
        etag: None,
        location: scope.location.clone(),
        sku: Sku { name: "StandardV2".into(), tier: None },
        properties: NatGatewayProperties {
            public_ip_addresses: ids(&spec.public_ips),
            public_ip_addresses_v6: ids(&spec.public_ips_v6),
            service_gateway: spec.associated.then(|| IdRef { id: scope.service_gateway_id() }),
            provisioning_state: None,
        },
    }
}

pub fn backend_pool(scope: &Scope, pool: &PoolRef, content: &BackendPool) -> BackendAddressPool {
    BackendAddressPool {
        name: Some(pool.pool.clone()),
        id: None,
        etag: None,
        properties: BackendAddressPoolProperties {
            load_balancer_backend_addresses: content
                .addresses
                .iter()
                .map(|a| LoadBalancerBackendAddress {
                    name: a.name.clone(),
                    properties: BackendAddressProperties {
                        ip_address: a.ip_address.clone(),
                        virtual_network: Some(IdRef { id: scope.vnet_id() }),
                    },
                })
                .collect(),
            other: content.other_properties.clone(),
        },
    }
}

// ---- wire → host types ----

pub fn listed_service(s: GatewayService) -> ListedService {
    ListedService {
        name: s.name,
        service_type: s.properties.service_type,
        backend_pool_ids: s.properties.load_balancer_backend_pools.into_iter().map(|p| p.id).collect(),
        nat_gateway_id: s.properties.public_nat_gateway_id.flatten(),
        is_default: s.properties.is_default.unwrap_or(false),
    }
}

pub fn listed_location(l: AddressLocationResponse) -> ListedLocation {
    ListedLocation {
        location: l.address_location,
        addresses: l
            .addresses
            .into_iter()
            .map(|a| super::AddressServices { address: a.address, services: a.services })
            .collect(),
    }
}

pub fn pool_content(pool: BackendAddressPool) -> BackendPool {
    BackendPool {
        addresses: pool
            .properties
            .load_balancer_backend_addresses
            .into_iter()
            .map(|a| BackendAddress { name: a.name, ip_address: a.properties.ip_address })
            .collect(),
        other_properties: pool.properties.other,
    }
}

/// A listed public IP, or `None` for an item without a name. ARM lists a public IP still being
/// made with no address and sometimes with no (or empty) properties; such an IP is still there
/// under its name, so the start-up sweep must see it (read as absent, a deleted Service's IP
/// that a crash left mid-creation would leak). What its properties do not say reads as ARM's
/// defaults (IPv4) and never as what a put makes.
pub fn listed_public_ip(value: serde_json::Value) -> Option<ListedPublicIp> {
    let name = value.get("name")?.as_str().filter(|n| !n.is_empty())?.to_owned();
    let properties = value.get("properties").filter(|p| p.is_object());
    let text = |key: &str| properties.and_then(|p| p.get(key)).and_then(|v| v.as_str());
    let version = match text("publicIPAddressVersion") {
        Some(v) if v.eq_ignore_ascii_case("IPv6") => IpVersion::IPv6,
        _ => IpVersion::IPv4,
    };
    let sku = value.get("sku").and_then(|s| s.get("name")).and_then(|n| n.as_str());
    let as_put = sku.is_some_and(|s| s.eq_ignore_ascii_case("StandardV2"))
        && text("publicIPAllocationMethod").is_some_and(|m| m.eq_ignore_ascii_case("Static"))
        && text("publicIPAddressVersion").is_some()
        && succeeded(text("provisioningState"));
    let address = text("ipAddress").filter(|a| !a.is_empty()).map(str::to_owned);
    let ip_configuration = properties
        .and_then(|p| p.pointer("/ipConfiguration/id"))
        .and_then(|id| id.as_str())
        .filter(|id| !id.is_empty())
        .map(str::to_owned);
    let tags = value
        .get("tags")
        .and_then(|t| t.as_object())
        .into_iter()
        .flatten()
        .filter_map(|(key, value)| Some((key.clone(), value.as_str()?.to_owned())))
        .collect();
    Some(ListedPublicIp { name, version, address, as_put, ip_configuration, tags })
}

/// A listed load balancer, or `None` for an item without a name. Its `shape` is the spec
/// [`load_balancer`] would build it from, only if building it from that spec gives back exactly
/// what ARM holds of what a spec says — one frontend on a public IP of this resource group, one
/// pool, rules on them without floating IP — and nothing a spec cannot say (probes, NAT rules or
/// pools, outbound rules, another SKU, a provisioning state other than `Succeeded`).
pub fn listed_load_balancer(scope: &Scope, value: serde_json::Value) -> Option<ListedLoadBalancer> {
    let name = value.get("name")?.as_str()?.to_owned();
    let shape = load_balancer_shape(scope, &name, &value);
    let names = |pointer: &str| -> Vec<String> {
        value
            .pointer(pointer)
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|child| child.get("name")?.as_str().map(str::to_owned))
            .collect()
    };
    let rules = names("/properties/loadBalancingRules");
    let pools = names("/properties/backendAddressPools");
    let frontends = value
        .pointer("/properties/frontendIPConfigurations")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|frontend| {
            let name = frontend.get("name")?.as_str()?.to_owned();
            let private_ip = frontend.pointer("/properties/privateIPAddress").and_then(|ip| ip.as_str());
            Some(ListedFrontend { name, private_ip: private_ip.filter(|ip| !ip.is_empty()).map(str::to_owned) })
        })
        .collect();
    Some(ListedLoadBalancer { name, shape, rules, pools, frontends })
}

fn load_balancer_shape(scope: &Scope, name: &str, value: &serde_json::Value) -> Option<LoadBalancerSpec> {
    let properties = value.get("properties")?;
    let empty = |key: &str| properties.get(key).is_none_or(|v| v.is_null() || v.as_array().is_some_and(Vec::is_empty));
    let only_modelled = ["probes", "inboundNatRules", "inboundNatPools", "outboundRules"].into_iter().all(empty);
    let state = properties.get("provisioningState").and_then(|s| s.as_str());
    if !only_modelled || !succeeded(state) {
        return None;
    }
    let lb: LoadBalancer = serde_json::from_value(value.clone()).ok()?;
    let ([frontend], [pool]) =
        (lb.properties.frontend_ip_configurations.as_slice(), lb.properties.backend_address_pools.as_slice())
    else {
        return None;
    };
    let pip_prefix = scope.public_ip_id("");
    let pip_id = &frontend.properties.public_ip_address.as_ref()?.id;
    let public_ip = pip_id.get(..pip_prefix.len()).filter(|p| p.eq_ignore_ascii_case(&pip_prefix))?;
    let public_ip = pip_id[public_ip.len()..].to_owned();
    if public_ip.is_empty() || public_ip.contains('/') || frontend.name != FRONTEND_NAME {
        return None;
    }
    let rules = lb
        .properties
        .load_balancing_rules
        .iter()
        .map(|r| LbRule {
            name: r.name.clone(),
            protocol: r.properties.protocol,
            frontend_port: r.properties.frontend_port,
            backend_port: r.properties.backend_port,
            idle_timeout_minutes: r.properties.idle_timeout_in_minutes,
            enable_tcp_reset: r.properties.enable_tcp_reset,
        })
        .collect();
    let spec = LoadBalancerSpec { name: name.to_owned(), public_ip, backend_pool: pool.name.clone(), rules };
    // What a PUT of the spec would send, against what ARM holds (IDs compared case-insensitively,
    // as ARM does).
    let built = load_balancer(scope, &spec);
    let same = lb.sku.name.eq_ignore_ascii_case(&built.sku.name)
        && lb.properties.load_balancing_rules.len() == built.properties.load_balancing_rules.len()
        && lb.properties.load_balancing_rules.iter().zip(&built.properties.load_balancing_rules).all(|(a, b)| {
            let (a, b) = (&a.properties, &b.properties);
            a.enable_floating_ip == b.enable_floating_ip
                && a.frontend_ip_configuration.id.eq_ignore_ascii_case(&b.frontend_ip_configuration.id)
                && a.backend_address_pool.id.eq_ignore_ascii_case(&b.backend_address_pool.id)
        });
    same.then_some(spec)
}

/// A listed NAT gateway, or `None` for one that does not decode as a NAT gateway (not one this
/// host made, so nothing to adopt or to sweep). Its public IPs are named only where their ID is
/// a public IP of this resource group; `as_put` says it is what [`nat_gateway`] makes (SKU
/// StandardV2, provisioning succeeded, every public IP of this resource group).
pub fn listed_nat_gateway(scope: &Scope, value: serde_json::Value) -> Option<ListedNatGateway> {
    let name = value.get("name")?.as_str()?.to_owned();
    let gateway: NatGateway = serde_json::from_value(value).ok()?;
    let p = &gateway.properties;
    let ours = |refs: &[IdRef]| -> Vec<String> {
        refs.iter()
            .filter_map(|r| {
                let name = r.id.rsplit('/').next()?;
                r.id.eq_ignore_ascii_case(&scope.public_ip_id(name)).then(|| name.to_owned())
            })
            .collect()
    };
    let (public_ips, public_ips_v6) = (ours(&p.public_ip_addresses), ours(&p.public_ip_addresses_v6));
    let as_put = gateway.sku.name.eq_ignore_ascii_case("StandardV2")
        && succeeded(p.provisioning_state.as_deref())
        && public_ips.len() == p.public_ip_addresses.len()
        && public_ips_v6.len() == p.public_ip_addresses_v6.len();
    let associated = p.service_gateway.as_ref().is_some_and(|g| g.id.eq_ignore_ascii_case(&scope.service_gateway_id()));
    Some(ListedNatGateway { name, public_ips, public_ips_v6, associated, as_put })
}

/// ARM reports `Succeeded` once a resource is ready; a list that leaves it out is taken as ready.
fn succeeded(state: Option<&str>) -> bool {
    state.is_none_or(|s| s.eq_ignore_ascii_case("Succeeded"))
}
