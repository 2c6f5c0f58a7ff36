//! The emulator's state and the docs/upstream.md §h.3 semantics, on wire types, with no IO. Every request
//! is applied atomically: it is checked and applied to a copy, and the copy replaces the state
//! only when the whole request succeeded — as NRP does with a batch.

mod load_balancers;
mod nat_gateways;
mod public_ips;
mod service_gateway;

use super::faults::{ActiveFault, AsyncOutcome, Fault, FaultMode};
use super::throttle::{ArmBuckets, ArmLimits, ArmRemaining, Bucket, Clock, Figure};
use clb_azure::wire::{self, ErrorBody, IdRef};
use clb_azure::{IpVersion, Operation, Scope, UpdateAction};
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
    /// How it is polled: only over HTTP (`server.rs`); in-process its end is answered at once.
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
    /// 202: poll operation `id` (how is in [`State::operations`]).
    Accepted {
        id: u64,
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
                                retry_after_secs: retry_after_secs.unwrap_or(0),
                                result: value,
                            },
                        );
                        let text = format!("202 async {outcome:?} (fault)");
                        (Dispatch::Accepted { id }, text)
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
    /// associated with this ServiceGateway (upstream creates it so before registering, docs/upstream.md §c.2.1).
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
}

/// The ARM code of an answer from an empty subscription bucket.
pub const THROTTLED_CODE: &str = "SubscriptionRequestsThrottled";

/// The bucket an operation draws on: writes (PUT, DELETE, and NRP's POST actions) or reads.
/// Polls of asynchronous operations draw on neither: ARM counts them apart, and the emulator
/// keeps it simple.
pub(crate) fn bucket_of(op: Operation) -> Bucket {
    if op.is_write() { Bucket::Writes } else { Bucket::Reads }
}

pub fn pool_key(lb: &str, pool: &str) -> String {
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
