//! The Azure side of the host: the calls the executor makes to ARM and to the network resource
//! provider's `serviceGateways` API (docs/upstream.md §h.2), in host terms.
//!
//! [`AzureApi`] is what the executor is generic over. It takes names, not ARM IDs: the
//! implementation knows its subscription, resource group, VNet and gateway ([`Scope`]) and builds
//! the IDs. Two implementations exist: `clb_arm::ArmClient` over HTTP, and the in-process
//! emulator (`clb_emulator::Emulator`), which reaches the same semantics through the same wire
//! types ([`wire`]) with no network and no real time.
//!
//! Every failure is one [`AzureError`] carrying what a retry policy needs — the HTTP status, the
//! ARM error code, `Retry-After` and a [`ErrorKind`]. Nothing here retries: the guest decides.

pub mod wire;

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// The default name of the ServiceGateway resource; CCM never uses another (docs/upstream.md §a.4).
pub const DEFAULT_SERVICE_GATEWAY: &str = "servicegateway";

/// The header of ARM's answers to writes (PUT, DELETE, POST): the subscription's write tokens
/// left after the call.
pub const REMAINING_WRITES_HEADER: &str = "x-ms-ratelimit-remaining-subscription-writes";
/// The same for reads (GET and lists).
pub const REMAINING_READS_HEADER: &str = "x-ms-ratelimit-remaining-subscription-reads";

/// Every call of [`AzureApi`], named as in logs, metrics and emulator faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operation {
    UpdateServices,
    UpdateAddressLocations,
    ListServices,
    ListAddressLocations,
    ListPublicIps,
    ListLoadBalancers,
    PutPublicIp,
    DeletePublicIp,
    PutLoadBalancer,
    DeleteLoadBalancer,
    GetBackendPool,
    PutBackendPool,
    DeleteBackendPool,
    ListNatGateways,
    PutNatGateway,
    DeleteNatGateway,
}

impl Operation {
    pub const ALL: [Operation; 16] = [
        Operation::UpdateServices,
        Operation::UpdateAddressLocations,
        Operation::ListServices,
        Operation::ListAddressLocations,
        Operation::ListPublicIps,
        Operation::ListLoadBalancers,
        Operation::PutPublicIp,
        Operation::DeletePublicIp,
        Operation::PutLoadBalancer,
        Operation::DeleteLoadBalancer,
        Operation::GetBackendPool,
        Operation::PutBackendPool,
        Operation::DeleteBackendPool,
        Operation::ListNatGateways,
        Operation::PutNatGateway,
        Operation::DeleteNatGateway,
    ];

    /// Whether NRP (the ServiceGateway) answers it, rather than ARM's network resources.
    pub fn is_nrp(self) -> bool {
        matches!(
            self,
            Operation::UpdateServices
                | Operation::UpdateAddressLocations
                | Operation::ListServices
                | Operation::ListAddressLocations
        )
    }

    /// Whether it changes Azure: the calls ARM's and NRP's write budgets count.
    pub fn is_write(self) -> bool {
        !matches!(
            self,
            Operation::ListServices
                | Operation::ListAddressLocations
                | Operation::ListPublicIps
                | Operation::ListLoadBalancers
                | Operation::GetBackendPool
                | Operation::ListNatGateways
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Operation::UpdateServices => "update-services",
            Operation::UpdateAddressLocations => "update-address-locations",
            Operation::ListServices => "list-services",
            Operation::ListAddressLocations => "list-address-locations",
            Operation::ListPublicIps => "list-public-ips",
            Operation::ListLoadBalancers => "list-load-balancers",
            Operation::PutPublicIp => "put-public-ip",
            Operation::DeletePublicIp => "delete-public-ip",
            Operation::PutLoadBalancer => "put-load-balancer",
            Operation::DeleteLoadBalancer => "delete-load-balancer",
            Operation::GetBackendPool => "get-backend-pool",
            Operation::PutBackendPool => "put-backend-pool",
            Operation::DeleteBackendPool => "delete-backend-pool",
            Operation::ListNatGateways => "list-nat-gateways",
            Operation::PutNatGateway => "put-nat-gateway",
            Operation::DeleteNatGateway => "delete-nat-gateway",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What went wrong, coarsely: the first thing a retry policy looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// No answer within the per-request timeout, or polling outlived the operation timeout.
    Timeout,
    /// The connection failed or was closed before an answer.
    Transport,
    /// An HTTP answer that says failure: a non-2xx status, or a 200 whose body has an `error`.
    Http,
    /// The asynchronous operation ended `Failed` or `Canceled`.
    AsyncFailed,
    /// An answer that does not parse as what the API promises.
    Decode,
    /// No bearer token could be had.
    Auth,
    /// The request itself is unusable (a bad base URL, a name that cannot be part of a path).
    Invalid,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::Transport => "transport",
            ErrorKind::Http => "http",
            ErrorKind::AsyncFailed => "async-failed",
            ErrorKind::Decode => "decode",
            ErrorKind::Auth => "auth",
            ErrorKind::Invalid => "invalid",
        })
    }
}

/// A failed call. `status` is 0 when there was no HTTP answer; `code` is the ARM `error.code`
/// (empty when there was none).
#[derive(Debug, thiserror::Error)]
#[error("{operation}: {kind} error{}{}: {message}{}", status_text(*.status), code_text(.code), retry_text(*.retry_after))]
pub struct AzureError {
    pub operation: Operation,
    pub kind: ErrorKind,
    pub status: u16,
    pub code: String,
    pub message: String,
    pub retry_after: Option<Duration>,
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

fn status_text(status: u16) -> String {
    if status == 0 { String::new() } else { format!(" (HTTP {status})") }
}

fn code_text(code: &str) -> String {
    if code.is_empty() { String::new() } else { format!(" {code}") }
}

fn retry_text(retry_after: Option<Duration>) -> String {
    retry_after.map(|d| format!(" (retry after {}s)", d.as_secs_f64())).unwrap_or_default()
}

impl AzureError {
    pub fn new(operation: Operation, kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            operation,
            kind,
            status: 0,
            code: String::new(),
            message: message.into(),
            retry_after: None,
            source: None,
        }
    }

    /// An ARM error answer: a status and the `error` envelope.
    pub fn http(operation: Operation, status: u16, code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { status, code: code.into(), ..Self::new(operation, ErrorKind::Http, message) }
    }

    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    pub fn with_retry_after(mut self, retry_after: Option<Duration>) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// A 404: what the guest treats as success for deletes and unregisters (docs/upstream.md §c.2.1).
    pub fn is_not_found(&self) -> bool {
        self.status == 404
    }
}

/// The `action` of an update request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpdateAction {
    #[default]
    PartialUpdate,
    FullUpdate,
}

/// The kind of a ServiceGateway service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServiceType {
    Inbound,
    Outbound,
    InboundOutbound,
}

impl ServiceType {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceType::Inbound => "Inbound",
            ServiceType::Outbound => "Outbound",
            ServiceType::InboundOutbound => "InboundOutbound",
        }
    }
}

/// A backend pool by name: the pool `pool` of the load balancer `load_balancer`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolRef {
    pub load_balancer: String,
    pub pool: String,
}

/// The NAT gateway field of a service request. Omitting it and clearing it differ on the wire
/// (`publicNatGatewayId` absent vs. JSON `null`): disassociating an outbound service is a clear.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NatGatewayLink {
    #[default]
    Omit,
    Set(String),
    Clear,
}

/// One entry of `updateServices`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRequest {
    pub name: String,
    pub service_type: ServiceType,
    pub backend_pools: Vec<PoolRef>,
    pub nat_gateway: NatGatewayLink,
    pub is_delete: bool,
}

/// One service as `GET …/services` lists it. The type stays the string NRP sent: what an
/// unknown type means is the guest's call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedService {
    pub name: String,
    pub service_type: String,
    pub backend_pool_ids: Vec<String>,
    pub nat_gateway_id: Option<String>,
    pub is_default: bool,
}

/// One address of a location and the services it belongs to; `services: []` removes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressServices {
    pub address: String,
    pub services: Vec<String>,
}

/// One entry of `updateAddressLocations`; `addresses: []` removes the location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocationUpdate {
    pub location: String,
    pub action: UpdateAction,
    pub addresses: Vec<AddressServices>,
}

/// One location as `GET …/addressLocations` lists it, spelt as NRP spelt it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedLocation {
    pub location: String,
    pub addresses: Vec<AddressServices>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IpVersion {
    IPv4,
    IPv6,
}

/// A public IP address to create or keep (SKU StandardV2, static).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicIpSpec {
    pub name: String,
    pub version: IpVersion,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Protocol {
    Tcp,
    Udp,
}

/// One load-balancing rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LbRule {
    pub name: String,
    pub protocol: Protocol,
    pub frontend_port: u16,
    pub backend_port: u16,
    pub idle_timeout_minutes: u32,
    pub enable_tcp_reset: bool,
}

/// A per-service load balancer: SKU `Service`, one frontend `frontend` on `public_ip`, one
/// backend pool, the rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadBalancerSpec {
    pub name: String,
    pub public_ip: String,
    pub backend_pool: String,
    pub rules: Vec<LbRule>,
}

/// A public IP address of the resource group as ARM lists it (start-up adoption).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedPublicIp {
    pub name: String,
    pub version: IpVersion,
    pub address: Option<String>,
    /// SKU StandardV2, static, provisioning succeeded (or not reported): what
    /// [`AzureApi::put_public_ip`] makes.
    pub as_put: bool,
    /// `properties.ipConfiguration.id`: what it is attached to (multi-SLB placement finds the
    /// load balancer a Service's pinned public IP is on by it).
    pub ip_configuration: Option<String>,
    /// Its tags (placement reads the cluster's name in them).
    pub tags: Vec<(String, String)>,
}

/// A load balancer of the resource group as ARM lists it: `shape` is the [`LoadBalancerSpec`]
/// it is exactly, or `None` when it holds anything a spec cannot say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedLoadBalancer {
    pub name: String,
    pub shape: Option<LoadBalancerSpec>,
    /// The names of its load-balancing rules, whatever its shape (multi-SLB placement counts
    /// them and finds a Service's among them).
    pub rules: Vec<String>,
    /// The names of its backend pools, whatever its shape (multi-SLB placement finds the pools
    /// a Service left among them).
    pub pools: Vec<String>,
    /// Its frontends, whatever its shape (multi-SLB placement finds a Service's pinned private
    /// IP and its primary frontend among them).
    pub frontends: Vec<ListedFrontend>,
}

/// A frontend IP configuration of a listed load balancer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedFrontend {
    pub name: String,
    /// `properties.privateIPAddress`: an internal frontend's.
    pub private_ip: Option<String>,
}

/// An egress identity's NAT gateway (SKU StandardV2) to create or change: its public IPs by
/// name, per family, and whether it is associated with the ServiceGateway (`serviceGateway.id`;
/// `false` sends an explicit `null`, the disassociation before a teardown, docs/upstream.md §c.2.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatGatewaySpec {
    pub name: String,
    pub public_ips: Vec<String>,
    pub public_ips_v6: Vec<String>,
    pub associated: bool,
}

/// A NAT gateway of the resource group as ARM lists it (start-up adoption and the orphan
/// sweep): its public IPs by name (only those of this resource group), and whether it is
/// associated with this cluster's ServiceGateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedNatGateway {
    pub name: String,
    pub public_ips: Vec<String>,
    pub public_ips_v6: Vec<String>,
    pub associated: bool,
    /// SKU StandardV2, provisioning succeeded (or not reported), every public IP of this
    /// resource group: what [`AzureApi::put_nat_gateway`] makes.
    pub as_put: bool,
}

/// The ETag of a resource, as ARM sent it (opaque).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ETag(pub String);

/// One backend address of a pool (multi-SLB mode): an IP in the cluster's VNet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendAddress {
    pub name: String,
    pub ip_address: String,
}

/// A backend pool as read for a read-modify-write. `other_properties` holds what this host
/// does not model, so that a PUT sends it back unchanged.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BackendPool {
    pub addresses: Vec<BackendAddress>,
    pub other_properties: serde_json::Map<String, serde_json::Value>,
}

/// Where the resources live; from it come every ARM ID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    /// The subscription of the network resources: the cloud configuration's
    /// `networkResourceSubscriptionID` when it names one, else its `subscriptionId`.
    pub subscription: String,
    pub resource_group: String,
    /// The Azure region of created resources.
    pub location: String,
    /// The resource group of the VNet (often the cluster's, sometimes its own).
    pub vnet_resource_group: String,
    pub vnet: String,
    pub service_gateway: String,
}

impl Scope {
    fn network(&self, resource_group: &str) -> String {
        format!("/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Network", self.subscription, resource_group)
    }

    pub fn service_gateway_id(&self) -> String {
        format!("{}/serviceGateways/{}", self.network(&self.resource_group), self.service_gateway)
    }

    pub fn vnet_id(&self) -> String {
        format!("{}/virtualNetworks/{}", self.network(&self.vnet_resource_group), self.vnet)
    }

    pub fn public_ip_id(&self, name: &str) -> String {
        format!("{}/publicIPAddresses/{name}", self.network(&self.resource_group))
    }

    pub fn load_balancer_id(&self, name: &str) -> String {
        format!("{}/loadBalancers/{name}", self.network(&self.resource_group))
    }

    pub fn backend_pool_id(&self, pool: &PoolRef) -> String {
        format!("{}/backendAddressPools/{}", self.load_balancer_id(&pool.load_balancer), pool.pool)
    }

    pub fn frontend_id(&self, load_balancer: &str) -> String {
        format!("{}/frontendIPConfigurations/{FRONTEND_NAME}", self.load_balancer_id(load_balancer))
    }

    pub fn nat_gateway_id(&self, name: &str) -> String {
        format!("{}/natGateways/{name}", self.network(&self.resource_group))
    }
}

/// The name of the one frontend of a per-service load balancer (docs/upstream.md §a.4).
pub const FRONTEND_NAME: &str = "frontend";

/// What the executor calls. Implemented by [`ArmClient`] and by the in-process emulator.
#[allow(async_fn_in_trait)] // used generically, never as `dyn`, so `Send`-bounds are inferred at the call site
pub trait AzureApi {
    async fn update_services(&self, action: UpdateAction, requests: &[ServiceRequest]) -> Result<(), AzureError>;
    async fn update_address_locations(
        &self,
        action: UpdateAction,
        locations: &[LocationUpdate],
    ) -> Result<(), AzureError>;
    async fn list_services(&self) -> Result<Vec<ListedService>, AzureError>;
    async fn list_address_locations(&self) -> Result<Vec<ListedLocation>, AzureError>;
    /// The resource group's public IP addresses, every page.
    async fn list_public_ips(&self) -> Result<Vec<ListedPublicIp>, AzureError>;
    /// The resource group's load balancers, every page.
    async fn list_load_balancers(&self) -> Result<Vec<ListedLoadBalancer>, AzureError>;
    /// Creates or keeps the public IP; returns its allocated address.
    async fn put_public_ip(&self, spec: &PublicIpSpec) -> Result<String, AzureError>;
    async fn delete_public_ip(&self, name: &str) -> Result<(), AzureError>;
    async fn put_load_balancer(&self, spec: &LoadBalancerSpec) -> Result<(), AzureError>;
    async fn delete_load_balancer(&self, name: &str) -> Result<(), AzureError>;
    async fn get_backend_pool(&self, pool: &PoolRef) -> Result<(BackendPool, ETag), AzureError>;
    /// The resource group's NAT gateways, every page.
    async fn list_nat_gateways(&self) -> Result<Vec<ListedNatGateway>, AzureError>;
    async fn put_nat_gateway(&self, spec: &NatGatewaySpec) -> Result<(), AzureError>;
    async fn delete_nat_gateway(&self, name: &str) -> Result<(), AzureError>;
    /// Writes the pool; with `if_match`, only if its ETag is still that one (else 412).
    async fn put_backend_pool(
        &self,
        pool: &PoolRef,
        content: &BackendPool,
        if_match: Option<&ETag>,
    ) -> Result<(), AzureError>;
    /// Deletes the pool; a pool already gone is no error (ARM answers 204), a load balancer
    /// gone is a 404.
    async fn delete_backend_pool(&self, pool: &PoolRef) -> Result<(), AzureError>;

    /// What ARM's `x-ms-ratelimit-remaining-subscription-writes` said on the latest answer that
    /// carried it since the last call of this; `None` when no answer carried it since.
    fn take_arm_remaining_writes(&self) -> Option<u32> {
        None
    }

    /// What ARM's `x-ms-ratelimit-remaining-subscription-writes` said on the latest answer that
    /// carried it, ever (for metrics); `None` when none did.
    fn last_arm_remaining_writes(&self) -> Option<u32> {
        None
    }
}

/// A shared client is a client (the simulator shares its emulator with the backend-pool updater).
impl<T: AzureApi> AzureApi for std::sync::Arc<T> {
    async fn update_services(&self, action: UpdateAction, requests: &[ServiceRequest]) -> Result<(), AzureError> {
        (**self).update_services(action, requests).await
    }
    async fn update_address_locations(
        &self,
        action: UpdateAction,
        locations: &[LocationUpdate],
    ) -> Result<(), AzureError> {
        (**self).update_address_locations(action, locations).await
    }
    async fn list_services(&self) -> Result<Vec<ListedService>, AzureError> {
        (**self).list_services().await
    }
    async fn list_address_locations(&self) -> Result<Vec<ListedLocation>, AzureError> {
        (**self).list_address_locations().await
    }
    async fn list_public_ips(&self) -> Result<Vec<ListedPublicIp>, AzureError> {
        (**self).list_public_ips().await
    }
    async fn list_load_balancers(&self) -> Result<Vec<ListedLoadBalancer>, AzureError> {
        (**self).list_load_balancers().await
    }
    async fn put_public_ip(&self, spec: &PublicIpSpec) -> Result<String, AzureError> {
        (**self).put_public_ip(spec).await
    }
    async fn delete_public_ip(&self, name: &str) -> Result<(), AzureError> {
        (**self).delete_public_ip(name).await
    }
    async fn put_load_balancer(&self, spec: &LoadBalancerSpec) -> Result<(), AzureError> {
        (**self).put_load_balancer(spec).await
    }
    async fn delete_load_balancer(&self, name: &str) -> Result<(), AzureError> {
        (**self).delete_load_balancer(name).await
    }
    async fn get_backend_pool(&self, pool: &PoolRef) -> Result<(BackendPool, ETag), AzureError> {
        (**self).get_backend_pool(pool).await
    }
    async fn list_nat_gateways(&self) -> Result<Vec<ListedNatGateway>, AzureError> {
        (**self).list_nat_gateways().await
    }
    async fn put_nat_gateway(&self, spec: &NatGatewaySpec) -> Result<(), AzureError> {
        (**self).put_nat_gateway(spec).await
    }
    async fn delete_nat_gateway(&self, name: &str) -> Result<(), AzureError> {
        (**self).delete_nat_gateway(name).await
    }
    async fn put_backend_pool(
        &self,
        pool: &PoolRef,
        content: &BackendPool,
        if_match: Option<&ETag>,
    ) -> Result<(), AzureError> {
        (**self).put_backend_pool(pool, content, if_match).await
    }
    async fn delete_backend_pool(&self, pool: &PoolRef) -> Result<(), AzureError> {
        (**self).delete_backend_pool(pool).await
    }
    fn take_arm_remaining_writes(&self) -> Option<u32> {
        (**self).take_arm_remaining_writes()
    }
    fn last_arm_remaining_writes(&self) -> Option<u32> {
        (**self).last_arm_remaining_writes()
    }
}
