//! The emulator's state and the §h.3 semantics, on wire types, with no IO. Every request
//! is applied atomically: it is checked and applied to a copy, and the copy replaces the state
//! only when the whole request succeeded — as NRP does with a batch.

use super::faults::{ActiveFault, AsyncOutcome, Fault, FaultMode};
use super::throttle::{ArmBuckets, ArmLimits, ArmRemaining, Bucket, Clock, Figure};
use crate::azure::wire::{self, ErrorBody, IdRef};
use crate::azure::{IpVersion, Operation, Scope, UpdateAction};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The RP-owned default outbound service that exists before CCM starts and that CCM must never
/// disturb.
pub const DEFAULT_SERVICE: &str = "default-natgw";
/// The most request-log entries kept; the per-operation counts are kept whole.
const LOG_CAPACITY: usize = 1000;

/// An ARM error answer: the status, the `error` envelope and, for throttling, `Retry-After`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("HTTP {status} {code}: {message}")]
pub struct Rejection {
    pub status: u16,
    pub code: String,
    pub message: String,
    pub retry_after_secs: Option<u64>,
}

fn reject(status: u16, code: &str, message: impl Into<String>) -> Rejection {
    Rejection { status, code: code.to_owned(), message: message.into(), retry_after_secs: None }
}

/// A registered ServiceGateway service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceRecord {
    pub service_type: String,
    pub backend_pools: Vec<wire::PoolEntry>,
    pub public_nat_gateway_id: Option<String>,
    pub is_default: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicIpRecord {
    pub version: IpVersion,
    pub ip_address: String,
    /// As the last PUT gave them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerRecord {
    pub etag: String,
    pub sku: String,
    pub frontends: Vec<FrontendRecord>,
    pub backend_pools: Vec<String>,
    pub rules: Vec<wire::LoadBalancingRule>,
}

/// A load balancer's frontend: on a public IP of this resource group, or (internal) on a
/// private address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FrontendRecord {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_ip: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NatGatewayRecord {
    pub etag: String,
    pub sku: String,
    /// The names of its public IPs, per family.
    pub public_ips: Vec<String>,
    pub public_ips_v6: Vec<String>,
    /// Associated with the emulated ServiceGateway (`serviceGateway.id`), or not (`null`).
    pub associated: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendPoolRecord {
    pub etag: String,
    pub addresses: Vec<wire::LoadBalancerBackendAddress>,
    pub other_properties: serde_json::Map<String, serde_json::Value>,
}

/// What the emulated Azure holds. Locations and addresses are keyed by canonical IP text.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    pub services: BTreeMap<String, ServiceRecord>,
    pub locations: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    pub public_ips: BTreeMap<String, PublicIpRecord>,
    pub load_balancers: BTreeMap<String, LoadBalancerRecord>,
    /// Keyed `{load balancer}/{pool}`.
    pub backend_pools: BTreeMap<String, BackendPoolRecord>,
    #[serde(default)]
    pub nat_gateways: BTreeMap<String, NatGatewayRecord>,
}

/// One handled request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogEntry {
    pub operation: String,
    pub resources: Vec<String>,
    /// `200`, `404 NotFound`, `202 async`, `hang`, `drop`…
    pub outcome: String,
    /// The bearer token the request carried (the emulator only ever sees test tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer: Option<String>,
}

/// One token exchange served at the emulator's Entra ID endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenExchange {
    pub tenant: String,
    pub client_id: String,
    pub assertion: String,
    pub scope: String,
    pub issued: String,
}

/// The whole state as `GET /emulator/state` shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EmulatorState {
    pub resources: Resources,
    pub faults: Vec<ActiveFault>,
    /// Requests handled per operation name (including the faulted ones).
    pub requests: BTreeMap<String, u64>,
    pub log: Vec<LogEntry>,
    pub token_exchanges: Vec<TokenExchange>,
    /// Answers ARM's throttling gave instead of the call (429 `SubscriptionRequestsThrottled`),
    /// per operation name; they count in `requests` too.
    #[serde(default)]
    pub throttled: BTreeMap<String, u64>,
    /// The tokens left in ARM's subscription buckets now; absent when the emulator is unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arm_remaining: Option<ArmRemaining>,
}

/// An asynchronous operation handed out with a 202, waiting to be polled.
#[derive(Clone, Debug)]
pub(crate) struct AsyncOperation {
    pub polls_left: u32,
    pub outcome: AsyncOutcome,
    pub error: ErrorBody,
    pub via_location: bool,
    pub retry_after_secs: u64,
    /// The answer's body when it ends well (`Location` polling returns it).
    pub result: serde_json::Value,
}

/// What a call turned into after the faults had their say.
pub(crate) enum Dispatch<T> {
    Done(Result<T, Rejection>),
    /// 202: poll operation `id`.
    Accepted {
        id: u64,
        via_location: bool,
        retry_after_secs: u64,
    },
    /// 200 whose body is `{"error": …}`; nothing was applied.
    ErrorBody(ErrorBody),
    Hang,
    Drop,
}

/// The mutable part, behind the emulator's mutex.
#[derive(Default)]
pub(crate) struct State {
    pub resources: Resources,
    pub next_v4: u32,
    pub next_v6: u128,
    pub etag_counter: u64,
    pub faults: Vec<ActiveFault>,
    pub requests: BTreeMap<String, u64>,
    pub log: Vec<LogEntry>,
    pub operations: BTreeMap<u64, AsyncOperation>,
    pub next_operation: u64,
    pub token_exchanges: Vec<TokenExchange>,
    pub clock: Clock,
    /// ARM's subscription buckets; `None`: unlimited.
    pub arm: Option<ArmBuckets>,
    pub throttled: BTreeMap<String, u64>,
    /// The figure the latest answered call carries (its answer's header), until taken.
    pub answer_figure: Option<Figure>,
    /// The remaining-writes figure of the latest write answer, and the same until taken: what
    /// the in-process emulator reports as a client would read it from the headers.
    pub latest_writes: Option<u32>,
    pub untaken_writes: Option<u32>,
}

impl State {
    pub fn new(arm_limits: Option<ArmLimits>) -> Self {
        let mut state = State { arm: arm_limits.map(|limits| ArmBuckets::starting(limits, 0)), ..State::default() };
        state.resources.services.insert(
            DEFAULT_SERVICE.to_owned(),
            ServiceRecord {
                service_type: "Outbound".into(),
                backend_pools: Vec::new(),
                public_nat_gateway_id: None,
                is_default: true,
            },
        );
        state
    }

    pub fn snapshot(&self) -> EmulatorState {
        EmulatorState {
            resources: self.resources.clone(),
            faults: self.faults.clone(),
            requests: self.requests.clone(),
            log: self.log.clone(),
            token_exchanges: self.token_exchanges.clone(),
            throttled: self.throttled.clone(),
            arm_remaining: self.arm.as_ref().map(|arm| arm.remaining_at(self.clock.now_ms())),
        }
    }

    /// ARM's front door: the call named `name` takes a token from its bucket, or is refused
    /// with 429 when the bucket is empty (counted in `throttled`). Either way the figure its
    /// answer carries is left in `answer_figure`. Unlimited, every call passes with no figure.
    pub fn arm_gate(&mut self, bucket: Bucket, name: &str) -> Result<(), Rejection> {
        let now = self.clock.now_ms();
        let Some(arm) = self.arm.as_mut() else {
            self.answer_figure = None;
            return Ok(());
        };
        let (figure, result) = match arm.take(bucket, now) {
            Ok(figure) => (figure, Ok(())),
            Err(throttled) => {
                *self.throttled.entry(name.to_owned()).or_default() += 1;
                let rejection = Rejection {
                    status: 429,
                    code: THROTTLED_CODE.to_owned(),
                    message: throttled.message(),
                    retry_after_secs: Some(throttled.retry_after_secs),
                };
                (Figure { bucket, remaining: 0 }, Err(rejection))
            }
        };
        if !arm.report_remaining() {
            self.answer_figure = None;
            return result;
        }
        if bucket == Bucket::Writes {
            self.latest_writes = Some(figure.remaining);
            self.untaken_writes = Some(figure.remaining);
        }
        self.answer_figure = Some(figure);
        result
    }

    /// ARM's buckets as `limits` say, full from now; `None`: unlimited.
    pub fn set_arm_limits(&mut self, limits: Option<ArmLimits>) {
        let now = self.clock.now_ms();
        self.arm = limits.map(|limits| ArmBuckets::starting(limits, now));
    }

    /// Another client of the subscription spends tokens now, down to empty; nothing when
    /// unlimited.
    pub fn arm_spend(&mut self, writes: u32, reads: u32) {
        let now = self.clock.now_ms();
        if let Some(arm) = self.arm.as_mut() {
            arm.spend(writes, reads, now);
        }
    }

    pub fn record(&mut self, operation: &str, resources: &[String], outcome: String, bearer: Option<String>) {
        *self.requests.entry(operation.to_owned()).or_default() += 1;
        if self.log.len() == LOG_CAPACITY {
            self.log.remove(0);
        }
        self.log.push(LogEntry { operation: operation.to_owned(), resources: resources.to_vec(), outcome, bearer });
    }

    pub fn add_fault(&mut self, fault: Fault) {
        // A fault for no call would otherwise count down from zero forever.
        if fault.count == Some(0) {
            return;
        }
        self.faults.push(ActiveFault { remaining: fault.count, fault });
    }

    /// The first fault that matches, used up by one.
    fn take_fault(&mut self, op: Operation, resources: &[String]) -> Option<FaultMode> {
        let index = self.faults.iter().position(|f| f.fault.matches(op, resources))?;
        let active = &mut self.faults[index];
        let mode = active.fault.mode.clone();
        if let Some(remaining) = active.remaining.as_mut() {
            *remaining -= 1;
            if *remaining == 0 {
                self.faults.remove(index);
            }
        }
        Some(mode)
    }

    /// Runs one call: its fault if one matches, else `apply`; logs it.
    pub fn dispatch<T: Serialize>(
        &mut self,
        op: Operation,
        resources: Vec<String>,
        bearer: Option<String>,
        apply: impl FnOnce(&mut State) -> Result<T, Rejection>,
    ) -> Dispatch<T> {
        // ARM refuses before anything else looks at the call, faults included; a call that
        // passes has spent its token whatever a fault then makes of it.
        if let Err(rejection) = self.arm_gate(bucket_of(op), op.name()) {
            let outcome = format!("{} {} (throttled)", rejection.status, rejection.code);
            self.record(op.name(), &resources, outcome, bearer);
            return Dispatch::Done(Err(rejection));
        }
        let (dispatch, outcome) = match self.take_fault(op, &resources) {
            None => {
                let result = apply(self);
                let outcome = outcome_text(&result);
                (Dispatch::Done(result), outcome)
            }
            Some(FaultMode::Status { status, code, message, retry_after_secs }) => {
                let rejection = Rejection {
                    status,
                    code: if code.is_empty() { default_code(status).to_owned() } else { code },
                    message: if message.is_empty() { format!("injected fault: HTTP {status}") } else { message },
                    retry_after_secs,
                };
                let outcome = format!("{} {} (fault)", rejection.status, rejection.code);
                (Dispatch::Done(Err(rejection)), outcome)
            }
            Some(FaultMode::ErrorBody { code, message }) => {
                (Dispatch::ErrorBody(ErrorBody { code: code.clone(), message }), format!("200 error {code} (fault)"))
            }
            Some(FaultMode::Hang) => (Dispatch::Hang, "hang (fault)".to_owned()),
            Some(FaultMode::Drop) => (Dispatch::Drop, "drop (fault)".to_owned()),
            Some(FaultMode::Async { outcome, polls, via_location, retry_after_secs, error }) => {
                // A request NRP would refuse is refused before it is accepted, as ARM validates
                // synchronously; a failing operation leaves the state as it was.
                let result = match outcome {
                    AsyncOutcome::Succeeded => match apply(self) {
                        Ok(value) => Ok(serde_json::to_value(value).unwrap_or(serde_json::Value::Null)),
                        Err(rejection) => Err(rejection),
                    },
                    AsyncOutcome::Failed | AsyncOutcome::Canceled => Ok(serde_json::Value::Null),
                };
                match result {
                    Err(rejection) => {
                        let outcome = outcome_text::<()>(&Err(rejection.clone()));
                        (Dispatch::Done(Err(rejection)), outcome)
                    }
                    Ok(value) => {
                        self.next_operation += 1;
                        let id = self.next_operation;
                        let retry_after_secs = retry_after_secs.unwrap_or(0);
                        let error = error.unwrap_or_else(|| ErrorBody {
                            code: "InternalServerError".into(),
                            message: "injected fault: the asynchronous operation failed".into(),
                        });
                        self.operations.insert(
                            id,
                            AsyncOperation {
                                polls_left: polls,
                                outcome,
                                error,
                                via_location,
                                retry_after_secs,
                                result: value,
                            },
                        );
                        let text = format!("202 async {outcome:?} (fault)");
                        (Dispatch::Accepted { id, via_location, retry_after_secs }, text)
                    }
                }
            }
        };
        self.record(op.name(), &resources, outcome, bearer);
        dispatch
    }

    fn etag(&mut self) -> String {
        self.etag_counter += 1;
        format!("W/\"{}\"", self.etag_counter)
    }

    fn is_referenced(locations: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>, service: &str) -> bool {
        locations.values().flat_map(|addresses| addresses.values()).any(|services| services.contains(service))
    }

    /// A service may name only a NAT gateway of this resource group that exists and is
    /// associated with this ServiceGateway (upstream creates it so before registering, §c.2.1).
    fn check_registrable_nat_gateway(&self, scope: &Scope, service: &str, id: &str) -> Result<(), Rejection> {
        let gateway = child_name(id, "natGateways")
            .filter(|n| id.eq_ignore_ascii_case(&scope.nat_gateway_id(n)))
            .and_then(|n| self.resources.nat_gateways.get(n));
        match gateway {
            Some(g) if g.associated => Ok(()),
            Some(_) => Err(reject(
                400,
                "NatGatewayNotAssociatedWithServiceGateway",
                format!("service {service}: NAT gateway {id} is not associated with this service gateway"),
            )),
            None => Err(reject(
                400,
                "InvalidResourceReference",
                format!("service {service}: publicNatGatewayId {id} is not a NAT gateway of this resource group"),
            )),
        }
    }

    /// The registered services whose `publicNatGatewayId` is the NAT gateway `name`.
    fn services_on_nat_gateway(&self, scope: &Scope, name: &str) -> Vec<String> {
        let id = scope.nat_gateway_id(name);
        let on = |s: &ServiceRecord| s.public_nat_gateway_id.as_deref().is_some_and(|g| g.eq_ignore_ascii_case(&id));
        self.resources.services.iter().filter(|(_, s)| !s.is_default && on(s)).map(|(n, _)| n.clone()).collect()
    }

    /// The NAT gateway other than `except` whose public IPs include `pip`.
    fn nat_gateway_using(&self, pip: &str, except: Option<&str>) -> Option<&str> {
        self.resources
            .nat_gateways
            .iter()
            .filter(|(n, _)| Some(n.as_str()) != except)
            .find(|(_, g)| g.public_ips.iter().chain(&g.public_ips_v6).any(|p| p == pip))
            .map(|(n, _)| n.as_str())
    }

    /// The load balancer and its frontend on the public IP `name`.
    fn frontend_on(&self, name: &str) -> Option<(&str, &str)> {
        self.resources.load_balancers.iter().find_map(|(lb, record)| {
            let frontend = record.frontends.iter().find(|f| f.public_ip.as_deref() == Some(name))?;
            Some((lb.as_str(), frontend.name.as_str()))
        })
    }

    /// What else uses the public IP `name`: a load balancer or a NAT gateway other than `except`.
    fn public_ip_user(&self, name: &str, except_nat_gateway: Option<&str>) -> Option<String> {
        if let Some((lb, _)) = self.frontend_on(name) {
            return Some(format!("load balancer {lb}"));
        }
        self.nat_gateway_using(name, except_nat_gateway).map(|n| format!("NAT gateway {n}"))
    }

    // ---- serviceGateways ----

    pub fn update_services(&mut self, scope: &Scope, request: &wire::UpdateServicesRequest) -> Result<(), Rejection> {
        let mut services = self.resources.services.clone();
        let locations = &self.resources.locations;
        let default_conflict = |name: &str| {
            reject(
                400,
                "MultipleDefaultServicesNotAllowedInServiceGateway",
                format!("service {name}: the gateway's default service cannot be changed, replaced or duplicated"),
            )
        };
        if request.action == UpdateAction::FullUpdate {
            let listed: BTreeSet<&str> =
                request.service_requests.iter().filter(|r| !r.is_delete).map(|r| r.service.name.as_str()).collect();
            let dropped: Vec<String> = services
                .iter()
                .filter(|(n, s)| !s.is_default && !listed.contains(n.as_str()))
                .map(|(n, _)| n.clone())
                .collect();
            for name in dropped {
                if Self::is_referenced(locations, &name) {
                    return Err(overlay_mappings(&name));
                }
                services.remove(&name);
            }
        }
        for entry in &request.service_requests {
            let name = &entry.service.name;
            if name.is_empty() {
                return Err(reject(400, "InvalidRequestFormat", "a service request has an empty name"));
            }
            if services.get(name).is_some_and(|s| s.is_default) {
                return Err(default_conflict(name));
            }
            if entry.is_delete {
                if !services.contains_key(name) {
                    return Err(reject(404, "NotFound", format!("service {name} is not registered")));
                }
                if Self::is_referenced(locations, name) {
                    return Err(overlay_mappings(name));
                }
                services.remove(name);
                continue;
            }
            let properties = &entry.service.properties;
            if !["Inbound", "Outbound", "InboundOutbound"]
                .iter()
                .any(|t| t.eq_ignore_ascii_case(&properties.service_type))
            {
                return Err(reject(
                    400,
                    "InvalidServiceType",
                    format!(
                        "service {name}: serviceType {:?} is not Inbound, Outbound or InboundOutbound",
                        properties.service_type
                    ),
                ));
            }
            let is_default = properties.is_default.unwrap_or(false);
            if is_default && services.values().any(|s| s.is_default) {
                return Err(default_conflict(name));
            }
            if let Some(Some(id)) = &properties.public_nat_gateway_id {
                self.check_registrable_nat_gateway(scope, name, id)?;
            }
            services.insert(
                name.clone(),
                ServiceRecord {
                    service_type: properties.service_type.clone(),
                    backend_pools: properties.load_balancer_backend_pools.clone(),
                    public_nat_gateway_id: properties.public_nat_gateway_id.clone().flatten(),
                    is_default,
                },
            );
        }
        self.resources.services = services;
        Ok(())
    }

    pub fn update_address_locations(&mut self, request: &wire::UpdateAddressLocationsRequest) -> Result<(), Rejection> {
        let mut seen = BTreeSet::new();
        let mut parsed = Vec::new();
        for entry in &request.address_locations {
            let location = parse_ip(&entry.address_location, "InvalidAddressLocation", "location")?;
            if !seen.insert(location) {
                return Err(reject(
                    400,
                    "DuplicateLocationsInRequest",
                    format!("location {} appears more than once in the request", entry.address_location),
                ));
            }
            parsed.push((location, entry));
        }
        let mut locations =
            if request.action == UpdateAction::FullUpdate { BTreeMap::new() } else { self.resources.locations.clone() };
        for (location, entry) in parsed {
            let key = location.to_string();
            if entry.addresses.is_empty() {
                locations.remove(&key);
                continue;
            }
            let mut addresses = match entry.address_update_action {
                UpdateAction::FullUpdate => BTreeMap::new(),
                UpdateAction::PartialUpdate => locations.get(&key).cloned().unwrap_or_default(),
            };
            let mut seen_addresses = BTreeSet::new();
            for address in &entry.addresses {
                let ip = parse_ip(&address.address, "InvalidAddress", "address")?;
                if ip.is_ipv4() != location.is_ipv4() {
                    return Err(reject(
                        400,
                        "AddressFamilyMismatch",
                        format!("address {} is not of the family of its location {key}", address.address),
                    ));
                }
                if !seen_addresses.insert(ip) {
                    return Err(reject(
                        400,
                        "DuplicateAddressesInLocation",
                        format!("address {} appears more than once in location {key}", address.address),
                    ));
                }
                if let Some(unknown) = address.services.iter().find(|s| !self.resources.services.contains_key(*s)) {
                    return Err(reject(
                        400,
                        "ServiceNotFound",
                        format!("address {} references service {unknown}, which is not registered", address.address),
                    ));
                }
                if address.services.is_empty() {
                    addresses.remove(&ip.to_string());
                } else {
                    addresses.insert(ip.to_string(), address.services.iter().cloned().collect());
                }
            }
            if addresses.is_empty() {
                locations.remove(&key);
            } else {
                locations.insert(key, addresses);
            }
        }
        self.resources.locations = locations;
        Ok(())
    }

    pub fn services(&self) -> Vec<wire::GatewayService> {
        let services = &self.resources.services;
        services
            .iter()
            .map(|(name, s)| wire::GatewayService {
                name: name.clone(),
                properties: wire::GatewayServiceProperties {
                    service_type: s.service_type.clone(),
                    load_balancer_backend_pools: s.backend_pools.clone(),
                    public_nat_gateway_id: s.public_nat_gateway_id.clone().map(Some),
                    is_default: Some(s.is_default),
                },
            })
            .collect()
    }

    /// `upper_v6`: echo IPv6 in upper case, as NRP may, to exercise callers' canonicalisation.
    pub fn address_locations(&self, upper_v6: bool) -> Vec<wire::AddressLocationResponse> {
        let spell = |ip: &str| if upper_v6 && ip.contains(':') { ip.to_ascii_uppercase() } else { ip.to_owned() };
        self.resources
            .locations
            .iter()
            .map(|(location, addresses)| wire::AddressLocationResponse {
                address_location: spell(location),
                addresses: addresses
                    .iter()
                    .map(|(address, services)| wire::AddressEntry {
                        address: spell(address),
                        services: services.iter().cloned().collect(),
                    })
                    .collect(),
            })
            .collect()
    }

    // ---- publicIPAddresses ----

    pub fn put_public_ip(
        &mut self,
        scope: &Scope,
        name: &str,
        body: &wire::PublicIpAddress,
    ) -> Result<wire::PublicIpAddress, Rejection> {
        if !body.properties.public_ip_allocation_method.eq_ignore_ascii_case("Static") {
            return Err(reject(
                400,
                "InvalidRequestFormat",
                format!(
                    "public IP {name}: allocation method {:?}; only Static is supported",
                    body.properties.public_ip_allocation_method
                ),
            ));
        }
        let version = body.properties.public_ip_address_version;
        if let Some(existing) = self.resources.public_ips.get(name) {
            if existing.version != version {
                return Err(reject(
                    400,
                    "InvalidRequestFormat",
                    format!("public IP {name}: the IP version of an existing address cannot change"),
                ));
            }
        } else {
            let ip_address = match version {
                IpVersion::IPv4 => {
                    self.next_v4 += 1;
                    Ipv4Addr::from(u32::from(Ipv4Addr::new(20, 0, 0, 0)) + self.next_v4).to_string()
                }
                IpVersion::IPv6 => {
                    self.next_v6 += 1;
                    Ipv6Addr::from(u128::from(Ipv6Addr::new(0x2603, 0x1030, 0, 0, 0, 0, 0, 0)) + self.next_v6)
                        .to_string()
                }
            };
            let tags = BTreeMap::new();
            self.resources.public_ips.insert(name.to_owned(), PublicIpRecord { version, ip_address, tags });
        }
        if let Some(record) = self.resources.public_ips.get_mut(name) {
            record.tags = body.tags.clone().unwrap_or_default();
        }
        self.get_public_ip(scope, name, body)
    }

    fn get_public_ip(
        &self,
        scope: &Scope,
        name: &str,
        body: &wire::PublicIpAddress,
    ) -> Result<wire::PublicIpAddress, Rejection> {
        let record = self.resources.public_ips.get(name).ok_or_else(|| not_found("public IP", name))?;
        let mut answer = body.clone();
        answer.name = Some(name.to_owned());
        answer.id = Some(scope.public_ip_id(name));
        answer.properties.public_ip_address_version = record.version;
        answer.properties.ip_address = Some(record.ip_address.clone());
        answer.properties.provisioning_state = Some("Succeeded".into());
        answer.properties.ip_configuration = self.frontend_on(name).map(|(lb, frontend)| wire::IdRef {
            id: format!("{}/frontendIPConfigurations/{frontend}", scope.load_balancer_id(lb)),
        });
        answer.tags = Some(record.tags.clone()).filter(|tags| !tags.is_empty());
        Ok(answer)
    }

    /// `GET` of a public IP (what a client reads after a long-running PUT).
    pub fn read_public_ip(&self, scope: &Scope, name: &str) -> Result<wire::PublicIpAddress, Rejection> {
        let record = self.resources.public_ips.get(name).ok_or_else(|| not_found("public IP", name))?;
        let body = wire::PublicIpAddress {
            name: None,
            id: None,
            location: scope.location.clone(),
            sku: wire::Sku { name: "StandardV2".into(), tier: Some("Regional".into()) },
            properties: wire::PublicIpProperties {
                public_ip_allocation_method: "Static".into(),
                public_ip_address_version: record.version,
                ip_address: None,
                provisioning_state: None,
                ip_configuration: None,
            },
            tags: None,
        };
        self.get_public_ip(scope, name, &body)
    }

    /// Every public IP, as a list call pages them (by name).
    pub fn list_public_ips(&self, scope: &Scope) -> Vec<wire::PublicIpAddress> {
        self.resources.public_ips.keys().filter_map(|name| self.read_public_ip(scope, name).ok()).collect()
    }

    pub fn delete_public_ip(&mut self, name: &str) -> Result<(), Rejection> {
        if !self.resources.public_ips.contains_key(name) {
            return Err(not_found("public IP", name));
        }
        if let Some(user) = self.public_ip_user(name, None) {
            return Err(reject(
                400,
                "InUsePublicIpAddressCannotBeDeleted",
                format!("public IP {name} is in use by {user}"),
            ));
        }
        self.resources.public_ips.remove(name);
        Ok(())
    }

    // ---- loadBalancers ----

    pub fn put_load_balancer(
        &mut self,
        scope: &Scope,
        name: &str,
        body: &wire::LoadBalancer,
    ) -> Result<wire::LoadBalancer, Rejection> {
        let invalid_reference =
            |what: String| reject(400, "InvalidResourceReference", format!("load balancer {name}: {what}"));
        let mut frontends = Vec::new();
        for frontend in &body.properties.frontend_ip_configurations {
            let private_ip = frontend.properties.private_ip_address.clone();
            let Some(id) = frontend.properties.public_ip_address.as_ref().map(|p| &p.id) else {
                if private_ip.is_none() {
                    return Err(invalid_reference(format!(
                        "frontend {} has neither a public IP nor a private address",
                        frontend.name
                    )));
                }
                frontends.push(FrontendRecord { name: frontend.name.clone(), public_ip: None, private_ip });
                continue;
            };
            let pip = child_name(id, "publicIPAddresses").filter(|pip| {
                id.eq_ignore_ascii_case(&scope.public_ip_id(pip)) && self.resources.public_ips.contains_key(*pip)
            });
            if let Some(gateway) = pip.and_then(|pip| self.nat_gateway_using(pip, None)) {
                return Err(reject(
                    400,
                    "PublicIPAddressInUse",
                    format!(
                        "load balancer {name}: frontend {} uses {id}, which NAT gateway {gateway} uses",
                        frontend.name
                    ),
                ));
            }
            match pip {
                Some(pip) => frontends.push(FrontendRecord {
                    name: frontend.name.clone(),
                    public_ip: Some(pip.to_owned()),
                    private_ip,
                }),
                None => {
                    return Err(invalid_reference(format!(
                        "frontend {} references {id}, which does not exist",
                        frontend.name
                    )));
                }
            }
        }
        let pools: Vec<String> = body.properties.backend_address_pools.iter().map(|p| p.name.clone()).collect();
        let mut used = BTreeSet::new();
        for rule in &body.properties.load_balancing_rules {
            let p = &rule.properties;
            let frontend_ok = body.properties.frontend_ip_configurations.iter().any(|f| {
                p.frontend_ip_configuration.id.eq_ignore_ascii_case(&format!(
                    "{}/frontendIPConfigurations/{}",
                    scope.load_balancer_id(name),
                    f.name
                ))
            });
            if !frontend_ok {
                return Err(invalid_reference(format!(
                    "rule {} references frontend {}, which is not on it",
                    rule.name, p.frontend_ip_configuration.id
                )));
            }
            let pool = pools.iter().find(|pool| {
                p.backend_address_pool
                    .id
                    .eq_ignore_ascii_case(&format!("{}/backendAddressPools/{pool}", scope.load_balancer_id(name)))
            });
            let Some(pool) = pool else {
                return Err(invalid_reference(format!(
                    "rule {} references pool {}, which is not on it",
                    rule.name, p.backend_address_pool.id
                )));
            };
            if !used.insert((p.protocol, p.backend_port, pool.clone())) {
                return Err(reject(
                    400,
                    "RulesUseSameBackendPortProtocolAndPool",
                    format!(
                        "load balancer {name}: rule {} uses {:?} backend port {} on pool {pool} like another rule",
                        rule.name, p.protocol, p.backend_port
                    ),
                ));
            }
        }
        let etag = self.etag();
        self.backend_pools_of(name).into_iter().filter(|k| !pools.iter().any(|p| pool_key(name, p) == *k)).for_each(
            |k| {
                self.resources.backend_pools.remove(&k);
            },
        );
        for pool in &pools {
            if !self.resources.backend_pools.contains_key(&pool_key(name, pool)) {
                let pool_etag = self.etag();
                self.resources.backend_pools.insert(
                    pool_key(name, pool),
                    BackendPoolRecord { etag: pool_etag, addresses: Vec::new(), other_properties: Default::default() },
                );
            }
        }
        self.resources.load_balancers.insert(
            name.to_owned(),
            LoadBalancerRecord {
                etag,
                sku: body.sku.name.clone(),
                frontends,
                backend_pools: pools,
                rules: body.properties.load_balancing_rules.clone(),
            },
        );
        self.read_load_balancer(scope, name)
    }

    pub fn read_load_balancer(&self, scope: &Scope, name: &str) -> Result<wire::LoadBalancer, Rejection> {
        let lb = self.resources.load_balancers.get(name).ok_or_else(|| not_found("load balancer", name))?;
        Ok(wire::LoadBalancer {
            name: Some(name.to_owned()),
            id: Some(scope.load_balancer_id(name)),
            etag: Some(lb.etag.clone()),
            location: scope.location.clone(),
            sku: wire::Sku { name: lb.sku.clone(), tier: None },
            properties: wire::LoadBalancerProperties {
                scope: Some("Public".into()),
                frontend_ip_configurations: lb
                    .frontends
                    .iter()
                    .map(|f| wire::FrontendIpConfiguration {
                        name: f.name.clone(),
                        properties: wire::FrontendIpProperties {
                            public_ip_address: f
                                .public_ip
                                .as_ref()
                                .map(|pip| wire::IdRef { id: scope.public_ip_id(pip) }),
                            private_ip_address: f.private_ip.clone(),
                        },
                    })
                    .collect(),
                backend_address_pools: lb
                    .backend_pools
                    .iter()
                    .map(|p| wire::NamedEmpty { name: p.clone(), properties: Default::default() })
                    .collect(),
                load_balancing_rules: lb.rules.clone(),
            },
        })
    }

    /// Every load balancer, as a list call pages them (by name).
    pub fn list_load_balancers(&self, scope: &Scope) -> Vec<wire::LoadBalancer> {
        self.resources.load_balancers.keys().filter_map(|name| self.read_load_balancer(scope, name).ok()).collect()
    }

    fn backend_pools_of(&self, lb: &str) -> Vec<String> {
        let prefix = format!("{lb}/");
        self.resources.backend_pools.keys().filter(|k| k.starts_with(&prefix)).cloned().collect()
    }

    pub fn delete_load_balancer(&mut self, name: &str) -> Result<(), Rejection> {
        if self.resources.load_balancers.remove(name).is_none() {
            return Err(not_found("load balancer", name));
        }
        for key in self.backend_pools_of(name) {
            self.resources.backend_pools.remove(&key);
        }
        Ok(())
    }

    // ---- natGateways ----

    /// Creates or replaces the NAT gateway: SKU StandardV2, public IPs of this resource group
    /// of their list's family that no load balancer or other NAT gateway uses, associated with
    /// this ServiceGateway or with none — and not disassociated while a registered service
    /// names it.
    pub fn put_nat_gateway(
        &mut self,
        scope: &Scope,
        name: &str,
        body: &wire::NatGateway,
    ) -> Result<wire::NatGateway, Rejection> {
        let refuse = |code: &str, what: String| reject(400, code, format!("NAT gateway {name}: {what}"));
        if !body.sku.name.eq_ignore_ascii_case("StandardV2") {
            return Err(refuse(
                "InvalidRequestFormat",
                format!("SKU {:?}; only StandardV2 is supported", body.sku.name),
            ));
        }
        let p = &body.properties;
        let mut names = [Vec::new(), Vec::new()];
        for (family, (refs, version)) in
            [(&p.public_ip_addresses, IpVersion::IPv4), (&p.public_ip_addresses_v6, IpVersion::IPv6)]
                .into_iter()
                .enumerate()
        {
            for IdRef { id } in refs {
                let pip =
                    child_name(id, "publicIPAddresses").filter(|n| id.eq_ignore_ascii_case(&scope.public_ip_id(n)));
                let Some((pip, record)) = pip.and_then(|n| self.resources.public_ips.get_key_value(n)) else {
                    return Err(refuse("InvalidResourceReference", format!("public IP {id} does not exist")));
                };
                if record.version != version {
                    return Err(refuse(
                        "InvalidRequestFormat",
                        format!("public IP {pip} is {:?}, listed among the {version:?} addresses", record.version),
                    ));
                }
                if let Some(user) = self.public_ip_user(pip, Some(name)) {
                    return Err(refuse("PublicIPAddressInUse", format!("public IP {pip} is in use by {user}")));
                }
                names[family].push(pip.clone());
            }
        }
        let associated = match &p.service_gateway {
            None => false,
            Some(IdRef { id }) if id.eq_ignore_ascii_case(&scope.service_gateway_id()) => true,
            Some(IdRef { id }) => {
                return Err(refuse("InvalidResourceReference", format!("service gateway {id} is not this one")));
            }
        };
        let users = self.services_on_nat_gateway(scope, name);
        if !associated && !users.is_empty() {
            return Err(refuse(
                "NatGatewayInUseByServiceGateway",
                format!(
                    "cannot be disassociated while services {users:?} name it; clear their publicNatGatewayId first"
                ),
            ));
        }
        let etag = self.etag();
        let [public_ips, public_ips_v6] = names;
        let record = NatGatewayRecord { etag, sku: body.sku.name.clone(), public_ips, public_ips_v6, associated };
        self.resources.nat_gateways.insert(name.to_owned(), record);
        self.read_nat_gateway(scope, name)
    }

    pub fn read_nat_gateway(&self, scope: &Scope, name: &str) -> Result<wire::NatGateway, Rejection> {
        let g = self.resources.nat_gateways.get(name).ok_or_else(|| not_found("NAT gateway", name))?;
        let spec = crate::azure::NatGatewaySpec {
            name: name.to_owned(),
            public_ips: g.public_ips.clone(),
            public_ips_v6: g.public_ips_v6.clone(),
            associated: g.associated,
        };
        let mut answer = wire::nat_gateway(scope, &spec);
        answer.name = Some(name.to_owned());
        answer.id = Some(scope.nat_gateway_id(name));
        answer.etag = Some(g.etag.clone());
        answer.sku.name.clone_from(&g.sku);
        answer.properties.provisioning_state = Some("Succeeded".into());
        Ok(answer)
    }

    /// Every NAT gateway, as a list call pages them (by name).
    pub fn list_nat_gateways(&self, scope: &Scope) -> Vec<wire::NatGateway> {
        self.resources.nat_gateways.keys().filter_map(|name| self.read_nat_gateway(scope, name).ok()).collect()
    }

    /// Deletes the NAT gateway, unless a registered service still names it.
    pub fn delete_nat_gateway(&mut self, scope: &Scope, name: &str) -> Result<(), Rejection> {
        if !self.resources.nat_gateways.contains_key(name) {
            return Err(not_found("NAT gateway", name));
        }
        let users = self.services_on_nat_gateway(scope, name);
        if !users.is_empty() {
            return Err(reject(
                400,
                "InUseNatGatewayCannotBeDeleted",
                format!("NAT gateway {name} is named by services {users:?}; unregister them first"),
            ));
        }
        self.resources.nat_gateways.remove(name);
        Ok(())
    }

    // ---- backendAddressPools ----

    /// ARM's DELETE of a child: a pool already gone is done (204), its load balancer gone is a
    /// 404. A child's write is a write of its parent: the load balancer's ETag changes.
    pub fn delete_backend_pool(&mut self, lb: &str, pool: &str) -> Result<(), Rejection> {
        if !self.resources.load_balancers.contains_key(lb) {
            return Err(not_found("load balancer", lb));
        }
        if self.resources.backend_pools.remove(&pool_key(lb, pool)).is_some() {
            let lb_etag = self.etag();
            if let Some(record) = self.resources.load_balancers.get_mut(lb) {
                record.etag = lb_etag;
                record.backend_pools.retain(|p| p != pool);
            }
        }
        Ok(())
    }

    pub fn get_backend_pool(&self, scope: &Scope, lb: &str, pool: &str) -> Result<wire::BackendAddressPool, Rejection> {
        if !self.resources.load_balancers.contains_key(lb) {
            return Err(not_found("load balancer", lb));
        }
        let record = self
            .resources
            .backend_pools
            .get(&pool_key(lb, pool))
            .ok_or_else(|| not_found("backend pool", &pool_key(lb, pool)))?;
        Ok(wire::BackendAddressPool {
            name: Some(pool.to_owned()),
            id: Some(format!("{}/backendAddressPools/{pool}", scope.load_balancer_id(lb))),
            etag: Some(record.etag.clone()),
            properties: wire::BackendAddressPoolProperties {
                load_balancer_backend_addresses: record.addresses.clone(),
                other: record.other_properties.clone(),
            },
        })
    }

    pub fn put_backend_pool(
        &mut self,
        scope: &Scope,
        lb: &str,
        pool: &str,
        body: &wire::BackendAddressPool,
        if_match: Option<&str>,
    ) -> Result<wire::BackendAddressPool, Rejection> {
        if !self.resources.load_balancers.contains_key(lb) {
            return Err(not_found("load balancer", lb));
        }
        let key = pool_key(lb, pool);
        let current = self.resources.backend_pools.get(&key).map(|p| p.etag.clone());
        if let Some(expected) = if_match {
            let matches = match &current {
                Some(etag) => expected == "*" || expected == etag,
                None => false,
            };
            if !matches {
                return Err(reject(
                    412,
                    "PreconditionFailed",
                    format!(
                        "backend pool {key}: If-Match {expected} but the ETag is {}",
                        current.as_deref().unwrap_or("(none)")
                    ),
                ));
            }
        }
        for address in &body.properties.load_balancer_backend_addresses {
            parse_ip(&address.properties.ip_address, "InvalidRequestFormat", "backend address")?;
        }
        let etag = self.etag();
        self.resources.backend_pools.insert(
            key,
            BackendPoolRecord {
                etag,
                addresses: body.properties.load_balancer_backend_addresses.clone(),
                other_properties: body.properties.other.clone(),
            },
        );
        // A child's write is a write of its parent.
        let lb_etag = self.etag();
        if let Some(record) = self.resources.load_balancers.get_mut(lb) {
            record.etag = lb_etag;
            if !record.backend_pools.iter().any(|p| p == pool) {
                record.backend_pools.push(pool.to_owned());
            }
        }
        self.get_backend_pool(scope, lb, pool)
    }
}

/// The ARM code of an answer from an empty subscription bucket.
pub const THROTTLED_CODE: &str = "SubscriptionRequestsThrottled";

/// The bucket an operation draws on: writes (PUT, DELETE, and NRP's POST actions) or reads.
/// Polls of asynchronous operations draw on neither: ARM counts them apart, and the emulator
/// keeps it simple.
pub(crate) fn bucket_of(op: Operation) -> Bucket {
    if op.is_write() { Bucket::Writes } else { Bucket::Reads }
}

pub(crate) fn pool_key(lb: &str, pool: &str) -> String {
    format!("{lb}/{pool}")
}

/// `…/{kind}/{name}` → `name`.
fn child_name<'a>(id: &'a str, kind: &str) -> Option<&'a str> {
    let (parent, name) = id.rsplit_once('/')?;
    parent.rsplit('/').next().filter(|k| k.eq_ignore_ascii_case(kind))?;
    Some(name).filter(|n| !n.is_empty())
}

fn parse_ip(text: &str, code: &str, what: &str) -> Result<IpAddr, Rejection> {
    text.trim().parse().map_err(|_| reject(400, code, format!("{what} {text:?} is not an IP address")))
}

fn not_found(what: &str, name: &str) -> Rejection {
    reject(404, "ResourceNotFound", format!("{what} {name} was not found"))
}

fn overlay_mappings(name: &str) -> Rejection {
    reject(
        400,
        "ServiceWithOverlayMappingsCannotBeDeleted",
        format!("service {name} is still referenced by addresses; remove them first"),
    )
}

fn outcome_text<T>(result: &Result<T, Rejection>) -> String {
    match result {
        Ok(_) => "200".to_owned(),
        Err(r) => format!("{} {}", r.status, r.code),
    }
}

/// The ARM code an injected status carries when the fault names none.
pub fn default_code(status: u16) -> &'static str {
    match status {
        400 => "BadRequest",
        404 => "ResourceNotFound",
        409 => "Conflict",
        412 => "PreconditionFailed",
        429 => "TooManyRequests",
        500 => "InternalServerError",
        502 => "BadGateway",
        503 => "ServiceUnavailable",
        504 => "GatewayTimeout",
        _ => "InjectedFault",
    }
}
