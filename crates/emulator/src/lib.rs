//! A local emulator of the Azure API surface the host uses: the NRP `serviceGateways` calls,
//! public IPs, load balancers and backend pools (docs/upstream.md §h.3), plus an Entra ID
//! token endpoint for workload-identity tests.
//!
//! [`Emulator`] is the in-process core: a state behind a mutex and the semantics of [`core`],
//! with switchable [`faults`]. It implements [`AzureApi`] itself, so `simulate` and unit tests
//! drive it with no network and no real time (a hang is the timeout error at once). [`server`]
//! serves the same core over HTTP for the real client, where a hang really hangs and a drop
//! really closes the connection.
//!
//! Both throttle as ARM does ([`throttle`]): by default a subscription's write and read
//! buckets of ARM's published sizes, on the emulator's clock — virtual in-process (set by
//! [`Emulator::set_now_ms`]), real over HTTP.

pub mod core;
pub mod faults;
pub mod server;
pub mod throttle;

pub use self::core::{DEFAULT_SERVICE, EmulatorState, Rejection, Resources, THROTTLED_CODE};
pub use faults::{AsyncOutcome, Fault, FaultMode};
pub use server::EmulatorServer;
pub use throttle::{ArmLimits, ArmRemaining, BucketLimits};

use self::core::{Dispatch, State};
use clb_azure::{self as azure, AzureApi, AzureError, ErrorKind, Operation, Scope, wire};
use std::sync::{Mutex, MutexGuard};

/// The scope of an emulated Azure: the one the simulator starts with, and the tests'.
pub fn scope() -> Scope {
    Scope {
        subscription: "00000000-0000-0000-0000-000000000000".into(),
        resource_group: "rg".into(),
        location: "eastus".into(),
        vnet_resource_group: "rg".into(),
        vnet: "vnet".into(),
        service_gateway: azure::DEFAULT_SERVICE_GATEWAY.into(),
    }
}

/// Why the emulator could not start.
#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    #[error("cannot listen on {addr}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Knobs of the emulator that are not Azure state.
#[derive(Clone, Debug)]
pub struct EmulatorConfig {
    /// Items per page of the lists (so that clients must follow `nextLink`).
    pub page_size: usize,
    /// List IPv6 locations and addresses in upper case, as NRP may.
    pub echo_ipv6_upper: bool,
    /// `expires_in` of the tokens the Entra ID endpoint issues, in seconds.
    pub token_lifetime_secs: u64,
    /// ARM's subscription throttling; `None`: unlimited. By default ARM's published sizes, so
    /// that what runs against the emulator meets the limits it will meet in Azure.
    pub arm_limits: Option<ArmLimits>,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        Self {
            page_size: 100,
            echo_ipv6_upper: false,
            token_lifetime_secs: 3600,
            arm_limits: Some(ArmLimits::default()),
        }
    }
}

/// The emulated Azure of one subscription, resource group and ServiceGateway.
pub struct Emulator {
    scope: Scope,
    config: EmulatorConfig,
    state: Mutex<State>,
    /// Counts [`Emulator::clear_faults`] calls: hung HTTP calls wait for it to change.
    cleared: tokio::sync::watch::Sender<u64>,
}

impl Emulator {
    /// An emulator whose gateway holds only the RP-owned [`DEFAULT_SERVICE`].
    pub fn new(scope: Scope) -> Self {
        Self::with_config(scope, EmulatorConfig::default())
    }

    pub fn with_config(scope: Scope, config: EmulatorConfig) -> Self {
        let state = Mutex::new(State::new(config.arm_limits));
        Self { scope, config, state, cleared: tokio::sync::watch::Sender::new(0) }
    }

    /// Sets the virtual clock ARM's buckets refill by. A time before the last one is taken but
    /// credits nothing.
    pub fn set_now_ms(&self, now_ms: u64) {
        self.lock().clock = throttle::Clock::Virtual(now_ms);
    }

    /// Puts ARM's throttling to `limits` (`None`: unlimited), both buckets full from now.
    pub fn set_arm_limits(&self, limits: Option<ArmLimits>) {
        self.lock().set_arm_limits(limits);
    }

    /// Another client of the subscription spends `writes` and `reads` tokens now, down to
    /// empty (not below); nothing when the emulator is unlimited.
    pub fn arm_spend(&self, writes: u32, reads: u32) {
        self.lock().arm_spend(writes, reads);
    }

    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    pub fn config(&self) -> &EmulatorConfig {
        &self.config
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere cannot leave the state half-written: requests apply to a copy.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_fault(&self, fault: Fault) {
        self.lock().add_fault(fault);
    }

    /// Clears every fault; calls hung by a `hang` fault over HTTP then end without an answer.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
        self.cleared.send_modify(|count| *count += 1);
    }

    /// Everything: resources, active faults, request counts and log, token exchanges.
    pub fn state(&self) -> EmulatorState {
        self.lock().snapshot()
    }

    /// The resource group's load balancers and public IPs as their list calls give them, without
    /// a request (nothing counted, no fault applied).
    pub fn listing(&self) -> (Vec<azure::ListedLoadBalancer>, Vec<azure::ListedPublicIp>) {
        let state = self.lock();
        let scope = &self.scope;
        let load_balancers = state
            .list_load_balancers(scope)
            .into_iter()
            .filter_map(|lb| wire::listed_load_balancer(scope, serde_json::to_value(lb).ok()?))
            .collect();
        let public_ips = state
            .list_public_ips(scope)
            .into_iter()
            .filter_map(|ip| wire::listed_public_ip(serde_json::to_value(ip).ok()?))
            .collect();
        (load_balancers, public_ips)
    }

    /// Puts a load balancer as the body says (frontends of any kind included), as the ARM API
    /// does: what `simulate` sets up that [`LoadBalancerSpec`](azure::LoadBalancerSpec) cannot
    /// say.
    pub fn put_load_balancer_body(&self, name: &str, body: &wire::LoadBalancer) -> Result<(), AzureError> {
        self.call(Operation::PutLoadBalancer, vec![name.to_owned()], |s, scope| s.put_load_balancer(scope, name, body))
            .map(drop)
    }

    /// Puts a public IP as the body says (its tags included), as the ARM API does.
    pub fn put_public_ip_body(&self, name: &str, body: &wire::PublicIpAddress) -> Result<(), AzureError> {
        self.call(Operation::PutPublicIp, vec![name.to_owned()], |s, scope| s.put_public_ip(scope, name, body))
            .map(drop)
    }

    /// Only the Azure resources.
    pub fn resources(&self) -> Resources {
        self.lock().resources.clone()
    }

    /// Runs one in-process call and turns what the faults made of it into the client's result.
    fn call<T: serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        op: Operation,
        resources: Vec<String>,
        apply: impl FnOnce(&mut State, &Scope) -> Result<T, Rejection>,
    ) -> Result<T, AzureError> {
        let mut state = self.lock();
        let scope = &self.scope;
        let dispatch = state.dispatch(op, resources, None, |s| apply(s, scope));
        // In-process there are no headers: the figures are read from the state instead.
        state.answer_figure = None;
        match dispatch {
            Dispatch::Done(Ok(value)) => Ok(value),
            Dispatch::Done(Err(r)) => Err(rejection_error(op, r)),
            Dispatch::ErrorBody(e) => Err(AzureError::http(op, 200, e.code, e.message)),
            Dispatch::Hang => {
                Err(AzureError::new(op, ErrorKind::Timeout, "no answer within the request timeout (injected hang)"))
            }
            Dispatch::Drop => {
                Err(AzureError::new(op, ErrorKind::Transport, "connection closed without an answer (injected drop)"))
            }
            Dispatch::Accepted { id, .. } => {
                let operation = state.operations.remove(&id).expect("an accepted operation is recorded");
                // The fault already decided the end; in-process there is nothing to wait for.
                let result = match operation.outcome {
                    AsyncOutcome::Succeeded => {
                        return serde_json::from_value(operation.result).map_err(|e| {
                            AzureError::new(op, ErrorKind::Decode, format!("cannot decode the operation result: {e}"))
                                .with_source(e)
                        });
                    }
                    AsyncOutcome::Failed | AsyncOutcome::Canceled => operation.error,
                };
                let status = if operation.via_location { 500 } else { 200 };
                Err(AzureError {
                    status,
                    code: result.code,
                    ..AzureError::new(op, ErrorKind::AsyncFailed, result.message)
                })
            }
        }
    }
}

pub(crate) fn rejection_error(op: Operation, r: Rejection) -> AzureError {
    AzureError::http(op, r.status, r.code, r.message)
        .with_retry_after(r.retry_after_secs.map(std::time::Duration::from_secs))
}

/// The names a call is about, for fault matching and the log.
pub(crate) fn service_names(request: &wire::UpdateServicesRequest) -> Vec<String> {
    request.service_requests.iter().map(|r| r.service.name.clone()).collect()
}

pub(crate) fn location_names(request: &wire::UpdateAddressLocationsRequest) -> Vec<String> {
    request.address_locations.iter().map(|l| l.address_location.clone()).collect()
}

impl AzureApi for Emulator {
    fn take_arm_remaining_writes(&self) -> Option<u32> {
        self.lock().untaken_writes.take()
    }

    fn last_arm_remaining_writes(&self) -> Option<u32> {
        self.lock().latest_writes
    }

    async fn update_services(
        &self,
        action: azure::UpdateAction,
        requests: &[azure::ServiceRequest],
    ) -> Result<(), AzureError> {
        let request = wire::update_services(&self.scope, action, requests);
        self.call(Operation::UpdateServices, service_names(&request), |s, scope| s.update_services(scope, &request))
    }

    async fn update_address_locations(
        &self,
        action: azure::UpdateAction,
        locations: &[azure::LocationUpdate],
    ) -> Result<(), AzureError> {
        let request = wire::update_address_locations(action, locations);
        self.call(Operation::UpdateAddressLocations, location_names(&request), |s, _| {
            s.update_address_locations(&request)
        })
    }

    async fn list_services(&self) -> Result<Vec<azure::ListedService>, AzureError> {
        let services = self.call(Operation::ListServices, Vec::new(), |s, _| Ok(s.services()))?;
        Ok(services.into_iter().map(wire::listed_service).collect())
    }

    async fn list_address_locations(&self) -> Result<Vec<azure::ListedLocation>, AzureError> {
        let upper = self.config.echo_ipv6_upper;
        let locations =
            self.call(Operation::ListAddressLocations, Vec::new(), |s, _| Ok(s.address_locations(upper)))?;
        Ok(locations.into_iter().map(wire::listed_location).collect())
    }

    async fn list_public_ips(&self) -> Result<Vec<azure::ListedPublicIp>, AzureError> {
        let ips = self.call(Operation::ListPublicIps, Vec::new(), |s, scope| Ok(s.list_public_ips(scope)))?;
        Ok(ips.into_iter().filter_map(|ip| wire::listed_public_ip(serde_json::to_value(ip).ok()?)).collect())
    }

    async fn list_load_balancers(&self) -> Result<Vec<azure::ListedLoadBalancer>, AzureError> {
        let lbs = self.call(Operation::ListLoadBalancers, Vec::new(), |s, scope| Ok(s.list_load_balancers(scope)))?;
        let listed = |lb: wire::LoadBalancer| wire::listed_load_balancer(&self.scope, serde_json::to_value(lb).ok()?);
        Ok(lbs.into_iter().filter_map(listed).collect())
    }

    async fn put_public_ip(&self, spec: &azure::PublicIpSpec) -> Result<String, AzureError> {
        let op = Operation::PutPublicIp;
        let body = wire::public_ip(&self.scope, spec);
        let answer = self.call(op, vec![spec.name.clone()], |s, scope| s.put_public_ip(scope, &spec.name, &body))?;
        answer.properties.ip_address.ok_or_else(|| AzureError::new(op, ErrorKind::Decode, "no properties.ipAddress"))
    }

    async fn delete_public_ip(&self, name: &str) -> Result<(), AzureError> {
        self.call(Operation::DeletePublicIp, vec![name.to_owned()], |s, _| s.delete_public_ip(name))
    }

    async fn put_load_balancer(&self, spec: &azure::LoadBalancerSpec) -> Result<(), AzureError> {
        let body = wire::load_balancer(&self.scope, spec);
        self.call(Operation::PutLoadBalancer, vec![spec.name.clone()], |s, scope| {
            s.put_load_balancer(scope, &spec.name, &body)
        })
        .map(drop)
    }

    async fn delete_load_balancer(&self, name: &str) -> Result<(), AzureError> {
        self.call(Operation::DeleteLoadBalancer, vec![name.to_owned()], |s, _| s.delete_load_balancer(name))
    }

    async fn list_nat_gateways(&self) -> Result<Vec<azure::ListedNatGateway>, AzureError> {
        let gateways = self.call(Operation::ListNatGateways, Vec::new(), |s, scope| Ok(s.list_nat_gateways(scope)))?;
        let listed = |g: wire::NatGateway| wire::listed_nat_gateway(&self.scope, serde_json::to_value(g).ok()?);
        Ok(gateways.into_iter().filter_map(listed).collect())
    }

    async fn put_nat_gateway(&self, spec: &azure::NatGatewaySpec) -> Result<(), AzureError> {
        let body = wire::nat_gateway(&self.scope, spec);
        self.call(Operation::PutNatGateway, vec![spec.name.clone()], |s, scope| {
            s.put_nat_gateway(scope, &spec.name, &body)
        })
        .map(drop)
    }

    async fn delete_nat_gateway(&self, name: &str) -> Result<(), AzureError> {
        self.call(Operation::DeleteNatGateway, vec![name.to_owned()], |s, scope| s.delete_nat_gateway(scope, name))
    }

    async fn get_backend_pool(&self, pool: &azure::PoolRef) -> Result<(azure::BackendPool, azure::ETag), AzureError> {
        let op = Operation::GetBackendPool;
        let names = vec![self::core::pool_key(&pool.load_balancer, &pool.pool)];
        let answer = self.call(op, names, |s, scope| s.get_backend_pool(scope, &pool.load_balancer, &pool.pool))?;
        let etag = answer.etag.clone().ok_or_else(|| AzureError::new(op, ErrorKind::Decode, "the pool has no ETag"))?;
        Ok((wire::pool_content(answer), azure::ETag(etag)))
    }

    async fn put_backend_pool(
        &self,
        pool: &azure::PoolRef,
        content: &azure::BackendPool,
        if_match: Option<&azure::ETag>,
    ) -> Result<(), AzureError> {
        let body = wire::backend_pool(&self.scope, pool, content);
        let names = vec![self::core::pool_key(&pool.load_balancer, &pool.pool)];
        let if_match = if_match.map(|e| e.0.as_str());
        self.call(Operation::PutBackendPool, names, |s, scope| {
            s.put_backend_pool(scope, &pool.load_balancer, &pool.pool, &body, if_match)
        })
        .map(drop)
    }

    async fn delete_backend_pool(&self, pool: &azure::PoolRef) -> Result<(), AzureError> {
        let names = vec![self::core::pool_key(&pool.load_balancer, &pool.pool)];
        self.call(Operation::DeleteBackendPool, names, |s, _| s.delete_backend_pool(&pool.load_balancer, &pool.pool))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clb_azure::{IpVersion, PublicIpSpec};

    fn emulator(arm_limits: Option<ArmLimits>) -> Emulator {
        Emulator::with_config(crate::scope(), EmulatorConfig { arm_limits, ..Default::default() })
    }

    async fn put_ip(emulator: &Emulator, n: usize) -> Result<String, AzureError> {
        emulator.put_public_ip(&PublicIpSpec { name: format!("pip-{n}"), version: IpVersion::IPv4 }).await
    }

    #[tokio::test]
    async fn a_full_write_bucket_answers_200_writes_then_429_with_retry_after_1_and_a_remaining_figure_of_0() {
        let emulator = emulator(Some(ArmLimits::default()));
        put_ip(&emulator, 0).await.expect("the first write passes");
        assert_eq!(emulator.take_arm_remaining_writes(), Some(199));
        assert_eq!(emulator.take_arm_remaining_writes(), None, "taken once");
        for n in 1..200 {
            put_ip(&emulator, n).await.expect("the bucket holds 200 writes");
        }
        assert_eq!(emulator.take_arm_remaining_writes(), Some(0));
        let refused = put_ip(&emulator, 200).await.expect_err("the 201st write is throttled");
        assert_eq!((refused.status, refused.code.as_str()), (429, THROTTLED_CODE));
        assert_eq!(refused.retry_after, Some(std::time::Duration::from_secs(1)));
        assert!(refused.message.contains("writes"), "the message names the bucket: {}", refused.message);
        assert_eq!(emulator.take_arm_remaining_writes(), Some(0));
        assert_eq!(emulator.last_arm_remaining_writes(), Some(0));
        let state = emulator.state();
        assert_eq!(state.resources.public_ips.len(), 200, "the throttled write applied nothing");
        assert_eq!(state.requests["put-public-ip"], 201, "the 429 counts as a request");
        assert_eq!(state.throttled.get("put-public-ip"), Some(&1));
        assert_eq!(state.log.last().map(|e| e.outcome.as_str()), Some("429 SubscriptionRequestsThrottled (throttled)"));
        assert_eq!(state.arm_remaining, Some(ArmRemaining { writes: 0, reads: 250 }));
    }

    #[tokio::test]
    async fn the_write_bucket_refills_10_tokens_a_second_on_the_virtual_clock_and_never_backwards() {
        let emulator = emulator(Some(ArmLimits::default()));
        emulator.arm_spend(200, 0);
        assert!(put_ip(&emulator, 0).await.is_err());
        emulator.set_now_ms(1_000);
        for n in 0..10 {
            put_ip(&emulator, n).await.expect("ten tokens came back in a second");
        }
        assert_eq!(emulator.take_arm_remaining_writes(), Some(0));
        assert_eq!(put_ip(&emulator, 10).await.expect_err("no eleventh").status, 429);
        emulator.set_now_ms(500);
        assert_eq!(put_ip(&emulator, 10).await.expect_err("going back credits nothing").status, 429);
        emulator.set_now_ms(1_100);
        put_ip(&emulator, 10).await.expect("a tenth of a second refills one token");
    }

    #[tokio::test]
    async fn reads_draw_on_their_own_bucket_and_leave_the_writes_figure_alone() {
        let emulator = emulator(Some(ArmLimits::default()));
        emulator.arm_spend(200, 0);
        for _ in 0..250 {
            emulator.list_services().await.expect("reads pass while writes are empty");
        }
        assert_eq!(emulator.take_arm_remaining_writes(), None, "a read carries no writes figure");
        let refused = emulator.list_public_ips().await.expect_err("the 251st read is throttled");
        assert_eq!((refused.status, refused.retry_after), (429, Some(std::time::Duration::from_secs(1))));
        assert!(refused.message.contains("reads"), "the message names the bucket: {}", refused.message);
        assert_eq!(emulator.state().throttled.get("list-public-ips"), Some(&1));
    }

    #[tokio::test]
    async fn another_clients_spend_lowers_the_figure_and_its_steady_writes_the_refill() {
        let limits = ArmLimits { other_client_writes_per_second: 4, ..ArmLimits::default() };
        let emulator = emulator(Some(limits));
        emulator.arm_spend(50, 0);
        put_ip(&emulator, 0).await.expect("150 tokens are left");
        assert_eq!(emulator.take_arm_remaining_writes(), Some(149));
        emulator.arm_spend(1_000, 0);
        assert_eq!(emulator.state().arm_remaining.map(|r| r.writes), Some(0), "down to empty, not below");
        emulator.set_now_ms(1_000);
        assert_eq!(emulator.state().arm_remaining.map(|r| r.writes), Some(6), "10 a second less the other's 4");
    }

    #[tokio::test]
    async fn an_injected_fault_still_spends_a_token_because_the_call_reached_arm() {
        let emulator = emulator(Some(ArmLimits::default()));
        emulator.set_fault(Fault::times(Operation::PutPublicIp, 1, FaultMode::status(500)));
        assert_eq!(put_ip(&emulator, 0).await.expect_err("the fault answers").status, 500);
        assert_eq!(emulator.take_arm_remaining_writes(), Some(199));
    }

    #[tokio::test]
    async fn an_unlimited_emulator_never_throttles_and_reports_no_figure() {
        let emulator = emulator(None);
        for n in 0..500 {
            put_ip(&emulator, n).await.expect("no limit");
        }
        emulator.arm_spend(1_000, 1_000);
        emulator.list_services().await.expect("no limit");
        assert_eq!(emulator.take_arm_remaining_writes(), None);
        assert_eq!(emulator.last_arm_remaining_writes(), None);
        let state = emulator.state();
        assert!(state.throttled.is_empty());
        assert_eq!(state.arm_remaining, None);
    }
}
