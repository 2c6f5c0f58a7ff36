//! A local emulator of the Azure API surface the host uses: the NRP `serviceGateways` calls,
//! public IPs, load balancers and backend pools (upstream-reference §h.3), plus an Entra ID
//! token endpoint for workload-identity tests.
//!
//! [`Emulator`] is the in-process core: a state behind a mutex and the semantics of [`core`],
//! with switchable [`faults`]. It implements [`AzureApi`] itself, so `simulate` and unit tests
//! drive it with no network and no real time (a hang is the timeout error at once). [`server`]
//! serves the same core over HTTP for the real client, where a hang really hangs and a drop
//! really closes the connection.

pub mod core;
pub mod faults;
#[cfg(feature = "live")]
pub mod server;

pub use self::core::{DEFAULT_SERVICE, EmulatorState, Rejection, Resources};
pub use faults::{AsyncOutcome, Fault, FaultMode};
#[cfg(feature = "live")]
pub use server::EmulatorServer;

use self::core::{Dispatch, State};
use crate::azure::{self, AzureApi, AzureError, ErrorKind, Operation, Scope, wire};
use std::sync::{Mutex, MutexGuard};

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
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        Self { page_size: 100, echo_ipv6_upper: false, token_lifetime_secs: 3600 }
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
        Self { scope, config, state: Mutex::new(State::new()), cleared: tokio::sync::watch::Sender::new(0) }
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

    /// Completes at the next [`Emulator::clear_faults`].
    pub(crate) fn faults_cleared(&self) -> impl std::future::Future<Output = ()> + use<> {
        let mut cleared = self.cleared.subscribe();
        async move {
            // The sender lives as long as the emulator; if it is gone, so is every caller.
            let _ = cleared.changed().await;
        }
    }

    /// Everything: resources, active faults, request counts and log, token exchanges.
    pub fn state(&self) -> EmulatorState {
        self.lock().snapshot()
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
        match state.dispatch(op, resources, None, |s| apply(s, scope)) {
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
}
