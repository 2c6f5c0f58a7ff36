//! Structured inputs: hostile records, outcomes and times read from fuzz bytes through
//! [`arbitrary::Unstructured`], and the encoder that writes the same structures back as bytes
//! (the seed corpora are encoded scenarios).
//!
//! Every value is read with a handful of primitives that take bytes from the front of the input
//! (one byte per choice, a length byte and that many bytes per literal string, a tag byte and up
//! to eight bytes per number), so [`Enc`] can write any value the decoder can read: a literal
//! string is always expressible, next to the pools of known and hostile values the fuzzer
//! reaches with one byte. An exhausted input reads as zeros, and every list has a bound, so
//! no input makes a structure larger than the bounds below.
//!
//! It is longer than 800 lines because each structure's decoder and encoder must stay exact
//! inverses (a seed written by [`Enc`] decodes to the value it came from): they are written
//! next to each other, one pair per type.

use arbitrary::Unstructured;
use clb_sandbox::bindings::clb::reconciler::types as wit;

/// The most entries of an ordinary list (ports, endpoints, addresses, ...).
pub const MAX_LIST: u8 = 6;
/// The most endpoints of a "big" slice.
pub const MAX_BIG: usize = 160;
/// The longest literal string (one length byte).
pub const MAX_TEXT: usize = 255;

/// Reads structures from fuzz bytes.
pub struct Dec<'a> {
    u: Unstructured<'a>,
}

/// A byte that selects a literal string in [`Dec::text`].
const LITERAL: u8 = 0xFF;
/// A byte that selects a hostile string in [`Dec::text`].
const HOSTILE_TAG: u8 = 0xFE;

/// Strings that break naive code: empty, blank, control characters, non-ASCII, very long,
/// separators.
pub fn hostile_strings() -> Vec<String> {
    vec![
        String::new(),
        " ".into(),
        "\0".into(),
        "\n".into(),
        "ß".into(),
        "🙂".into(),
        "a".repeat(300),
        "/".into(),
        ":".into(),
        "-".into(),
        "%".into(),
        "İ".into(),
    ]
}

/// IP texts: canonical and not, both families, IPv4-mapped IPv6, zone ids, padding, junk.
pub const IPS: &[&str] = &[
    "10.0.0.1",
    "10.0.0.2",
    "10.0.1.1",
    "10.244.0.1",
    "10.244.0.2",
    "10.244.0.3",
    "fd00::1",
    "FD00::0001",
    "fd00:0:0:0:0:0:0:1",
    "fd00::10:244:0:1",
    "::ffff:10.244.0.1",
    "::ffff:10.0.0.1",
    "fe80::1%eth0",
    "10.244.0.1%1",
    " 10.244.0.1",
    "10.244.0.1 ",
    "010.244.000.001",
    "10.244.0.256",
    "10.244.0",
    "1.2.3.4/24",
    "0.0.0.0",
    "255.255.255.255",
    "::",
    "::1",
    "127.0.0.1",
    "",
    "not-an-ip",
    "2001:db8::1",
    "[fd00::1]",
];

/// Service UIDs: lower and upper case of the same, a second one, one that is not a UID.
pub const UIDS: &[&str] = &[
    "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e01",
    "0F6F2C2E-1B1A-4A7E-9C61-3F0B0C1D2E01",
    "2d3e4f5a-6b7c-4d8e-9f0a-1b2c3d4e5f02",
    "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c03",
    "egress-a",
    "not-a-uid",
];
pub const NAMESPACES: &[&str] = &["shop", "default", "kube-system", "SHOP"];
pub const NAMES: &[&str] = &["web", "api", "db", "web-abc12", "egress-0", "node-0", "node-1"];
pub const NODES: &[&str] = &["node-0", "node-1", "node-2", "Node-0"];
pub const EGRESS_LABELS: &[&str] =
    &["egress-a", "EGRESS-B", "egress-c", "default-natgw", "bad label", "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e01"];
/// NAT gateways and their public IPs: ours by shape, one on a foreign IP, the RP's default.
pub const EGRESS_NAMES: &[&str] =
    &["egress-a", "egress-c", "egress-a-pip", "egress-c-pip", "egress-c-pip-v6", "default-natgw", "other-pip"];
pub const PHASES: &[&str] = &["Running", "Pending", "Succeeded", "Failed", "Unknown", "running"];
pub const SERVICE_TYPES: &[&str] = &["LoadBalancer", "ClusterIP", "NodePort", "ExternalName", "loadbalancer"];
pub const ETPS: &[&str] = &["Local", "Cluster", "local", "Global"];
pub const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP", "tcp"];
pub const FAMILIES: &[&str] = &["IPv4", "IPv6", "ipv4", "IPv5"];
pub const ADDRESS_TYPES: &[&str] = &["IPv4", "IPv6", "FQDN", "ipv4"];
pub const ANNOTATIONS: &[&str] = &[
    "service.beta.kubernetes.io/azure-load-balancer-internal",
    "service.beta.kubernetes.io/azure-load-balancer-tcp-idle-timeout",
    "service.beta.kubernetes.io/azure-load-balancer-configurations",
    "service.beta.kubernetes.io/azure-pip-name",
];
pub const ANNOTATION_VALUES: &[&str] = &["true", "TRUE", "false", "4", "30", "100", "-1", "lb1", "lb1,lb2"];
/// The egress pod finalizer, and another controller's.
pub const POD_FINALIZERS: &[&str] = &["servicegateway.azure.com/pod-cleanup", "example.com/other"];
pub const FINALIZERS: &[&str] =
    &["servicegateway.azure.com/service-cleanup", "service.kubernetes.io/load-balancer-cleanup"];
pub const CODES: &[&str] = &[
    "Injected",
    "InvalidParameter",
    "QuotaExceeded",
    "ServiceWithOverlayMappingsCannotBeDeleted",
    "NotFound",
    "Conflict",
    "UIDMismatch",
    "InvalidCommand",
    "PublicIPCountLimitReached",
    "RulesUseSameBackendPortProtocolAndPool",
    "TooManyRequests",
];
/// Statuses: no answer, success codes where a failure is expected, every failure class.
pub const STATUSES: &[u16] = &[0, 200, 400, 401, 403, 404, 408, 409, 412, 422, 429, 500, 502, 503, 504];
pub const SERVICE_NAMES: &[&str] = &[
    "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e01",
    "2d3e4f5a-6b7c-4d8e-9f0a-1b2c3d4e5f02",
    "egress-a",
    "egress-b",
    "default-natgw",
    "someone-else",
];
pub const NRP_TYPES: &[&str] = &["Inbound", "Outbound", "inbound", "Other"];

impl<'a> Dec<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { u: Unstructured::new(data) }
    }

    pub fn is_empty(&self) -> bool {
        self.u.is_empty()
    }

    /// One byte; 0 once the input is used up.
    pub fn byte(&mut self) -> u8 {
        self.u.arbitrary::<u8>().unwrap_or(0)
    }

    /// A number below `n` (`n` > 0), from one byte.
    pub fn below(&mut self, n: usize) -> usize {
        usize::from(self.byte()) % n.max(1)
    }

    pub fn flag(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    /// A list length up to `max`.
    pub fn len(&mut self, max: u8) -> usize {
        usize::from(self.byte() % (max + 1))
    }

    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.u.len());
        self.u.bytes(n).unwrap_or(&[])
    }

    /// A number: tag 0 ⇒ 0, 1 ⇒ `u64::MAX`, 2 ⇒ one byte, 3 ⇒ two bytes, 4 ⇒ four, 5 ⇒
    /// eight (little-endian), 6 ⇒ `u64::MAX` less one byte, else a byte times a thousand.
    pub fn u64(&mut self) -> u64 {
        match self.byte() % 8 {
            0 => 0,
            1 => u64::MAX,
            2 => u64::from(self.byte()),
            3 => u64::from(u16::from_le_bytes([self.byte(), self.byte()])),
            4 => u64::from(u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])),
            5 => {
                let mut b = [0u8; 8];
                for x in &mut b {
                    *x = self.byte();
                }
                u64::from_le_bytes(b)
            }
            6 => u64::MAX - u64::from(self.byte()),
            _ => u64::from(self.byte()) * 1_000,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    pub fn i32(&mut self) -> i32 {
        match self.byte() % 8 {
            0 => 80,
            1 => 443,
            2 => 0,
            3 => -1,
            4 => 65_535,
            5 => 65_536,
            6 => i32::MAX,
            _ => i32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()]),
        }
    }

    /// A string: one of `pool`, a hostile one, or a literal.
    pub fn text(&mut self, pool: &[&str]) -> String {
        let tag = self.byte();
        match tag {
            LITERAL => {
                let n = usize::from(self.byte());
                String::from_utf8_lossy(self.bytes(n)).into_owned()
            }
            HOSTILE_TAG => {
                let hostile = hostile_strings();
                let i = self.below(hostile.len());
                hostile[i].clone()
            }
            _ if pool.is_empty() => String::new(),
            _ => pool[usize::from(tag) % pool.len()].to_owned(),
        }
    }

    pub fn opt_text(&mut self, pool: &[&str]) -> Option<String> {
        self.flag().then(|| self.text(pool))
    }

    pub fn texts(&mut self, pool: &[&str], max: u8) -> Vec<String> {
        (0..self.len(max)).map(|_| self.text(pool)).collect()
    }

    pub fn opt_bool(&mut self) -> Option<bool> {
        match self.byte() % 3 {
            0 => None,
            1 => Some(true),
            _ => Some(false),
        }
    }

    pub fn opt_u64(&mut self) -> Option<u64> {
        self.flag().then(|| self.u64())
    }

    // ---- WIT records ----

    pub fn config(&mut self) -> wit::Config {
        let (backend_pool_type, load_balancer_sku, multi, write_budgets) = match self.byte() % 8 {
            0..=3 => ("podIP".into(), "standardV2".into(), vec![], None),
            4 => ("PodIP".into(), "StandardV2".into(), vec![], None),
            5 => ("nodeIP".into(), "standard".into(), vec!["kubernetes".into(), "lb2".into()], None),
            6 => (String::new(), String::new(), vec![], None),
            // Only this arm reads write budgets, so that the corpora's inputs of the others keep
            // their meaning.
            _ => (
                self.text(&["podIP", "nodeIP", "nodeIPConfiguration"]),
                self.text(&["standardV2", "standard", "basic"]),
                self.texts(&["kubernetes", "lb2"], 2),
                self.write_budgets(),
            ),
        };
        wit::Config { backend_pool_type, load_balancer_sku, multiple_standard_load_balancers: multi, write_budgets }
    }

    /// Small budgets, so that writes wait for tokens; 0 now and then, which the logic refuses.
    /// The ARM write reserve comes from the bytes the ARM budget took (none of its own, so that
    /// the corpus from before it decodes to the same configurations): 0 to 228, past ARM's
    /// documented bucket of 200 now and then.
    fn write_budgets(&mut self) -> Option<wit::WriteBudgets> {
        self.flag().then(|| {
            let (update_address_locations, update_services, arm_writes) = (self.budget(), self.budget(), self.budget());
            let arm_write_reserve = arm_writes.map(|b| b.burst * 12);
            wit::WriteBudgets { update_address_locations, update_services, arm_writes, arm_write_reserve }
        })
    }

    fn budget(&mut self) -> Option<wit::Budget> {
        self.flag().then(|| wit::Budget { per_minute: u32::from(self.byte()) * 40, burst: u32::from(self.byte() % 20) })
    }

    pub fn port(&mut self) -> wit::ServicePort {
        wit::ServicePort {
            name: self.opt_text(&["http", "https", "dns"]),
            protocol: self.opt_text(PROTOCOLS),
            port: self.i32(),
            target_port: match self.byte() % 3 {
                0 => None,
                1 => Some(wit::TargetPort::Number(self.i32())),
                _ => Some(wit::TargetPort::Name(self.text(&["http", "web"]))),
            },
            node_port: self.flag().then(|| self.i32()),
        }
    }

    pub fn service(&mut self) -> wit::Service {
        wit::Service {
            uid: self.text(UIDS),
            namespace: self.text(NAMESPACES),
            name: self.text(NAMES),
            service_type: self.opt_text(SERVICE_TYPES),
            external_traffic_policy: self.opt_text(ETPS),
            session_affinity: self.opt_text(&["None", "ClientIP"]),
            load_balancer_ip: self.opt_text(IPS),
            load_balancer_class: self.opt_text(&["service.k8s.aws/nlb", "azure"]),
            ip_families: self.texts(FAMILIES, 3),
            ports: (0..self.len(4)).map(|_| self.port()).collect(),
            annotations: (0..self.len(3)).map(|_| (self.text(ANNOTATIONS), self.text(ANNOTATION_VALUES))).collect(),
            finalizers: self.texts(FINALIZERS, 2),
            deleting: self.flag(),
            ingress_ips: self.texts(IPS, 2),
            labels: (0..self.len(2))
                .map(|_| (self.text(&["app", "tier", "team"]), self.text(&["web", "", "a"])))
                .collect(),
        }
    }

    pub fn endpoint(&mut self) -> wit::Endpoint {
        wit::Endpoint { addresses: self.texts(IPS, 3), node_name: self.opt_text(NODES), ready: self.opt_bool() }
    }

    pub fn slice(&mut self, big: bool) -> wit::EndpointSlice {
        let namespace = self.text(NAMESPACES);
        let name = self.text(NAMES);
        let owner_service_uid = self.opt_text(UIDS);
        let address_type = self.text(ADDRESS_TYPES);
        let count = if big { self.below(MAX_BIG + 1) } else { self.len(MAX_LIST) };
        let endpoints = (0..count)
            .map(|i| {
                if big {
                    // Distinct, canonical addresses: a big slice is about size, not odd values.
                    wit::Endpoint {
                        addresses: vec![format!("10.244.{}.{}", i / 250, i % 250 + 1)],
                        node_name: Some(NODES[i % 3].into()),
                        ready: Some(i % 7 != 0),
                    }
                } else {
                    self.endpoint()
                }
            })
            .collect();
        wit::EndpointSlice { namespace, name, owner_service_uid, address_type, endpoints, deleting: self.flag() }
    }

    pub fn node(&mut self) -> wit::Node {
        wit::Node { name: self.text(NODES), internal_ips: self.texts(IPS, 3) }
    }

    pub fn pod(&mut self) -> wit::Pod {
        wit::Pod {
            namespace: self.text(NAMESPACES),
            name: self.text(NAMES),
            uid: self.text(&["pod-uid-0", "pod-uid-1", "pod-uid-2"]),
            egress_label: self.opt_text(EGRESS_LABELS),
            phase: self.opt_text(PHASES),
            pod_ips: self.texts(IPS, 3),
            pod_ip: self.opt_text(IPS),
            host_ips: self.texts(IPS, 2),
            host_ip: self.opt_text(IPS),
            deleting: self.flag(),
            finalizers: self.texts(POD_FINALIZERS, 2),
        }
    }

    pub fn observation(&mut self) -> wit::Observation {
        match self.byte() % 10 {
            0 | 1 => wit::Observation::ServiceUpserted(self.service()),
            2 => wit::Observation::ServiceDeleted((self.text(NAMESPACES), self.text(NAMES))),
            3 | 4 => wit::Observation::SliceUpserted(self.slice(false)),
            5 => wit::Observation::SliceDeleted((self.text(NAMESPACES), self.text(NAMES))),
            6 => wit::Observation::NodeUpserted(self.node()),
            7 => wit::Observation::NodeDeleted(self.text(NODES)),
            8 => wit::Observation::PodUpserted(self.pod()),
            _ => match self.byte() % 2 {
                0 => wit::Observation::PodDeleted((self.text(NAMESPACES), self.text(NAMES))),
                _ => wit::Observation::ListsComplete,
            },
        }
    }

    pub fn failure(&mut self) -> wit::Failure {
        let status = match self.byte() {
            255 => self.u16(),
            b => STATUSES[usize::from(b) % STATUSES.len()],
        };
        wit::Failure {
            status,
            code: self.opt_text(CODES),
            retry_after_ms: self.opt_u64(),
            message: self.text(&["injected", "boom"]),
        }
    }

    pub fn nrp_state(&mut self) -> wit::NrpState {
        wit::NrpState {
            services: (0..self.len(4))
                .map(|_| wit::NrpService {
                    name: self.text(SERVICE_NAMES),
                    service_type: self.text(NRP_TYPES),
                    backend_pools: vec![],
                    is_default: self.flag(),
                })
                .collect(),
            locations: (0..self.len(4))
                .map(|_| wit::NrpListedLocation {
                    location: self.text(IPS),
                    addresses: (0..self.len(4))
                        .map(|_| wit::NrpAddress { address: self.text(IPS), services: self.texts(SERVICE_NAMES, 3) })
                        .collect(),
                })
                .collect(),
        }
    }

    pub fn outcome(&mut self) -> wit::Outcome {
        match self.byte() % 5 {
            0 => wit::Outcome::Ok,
            1 => wit::Outcome::PublicIpAddress(self.text(IPS)),
            2 => wit::Outcome::NrpSnapshot(self.nrp_state()),
            3 => wit::Outcome::Failed(self.failure()),
            _ => wit::Outcome::ArmInventory(self.arm_inventory()),
        }
    }

    /// A public IP or load balancer name: UIDs (ours or orphans), a `-pip`, foreign names.
    fn resource_name(&mut self) -> String {
        self.text(&[UIDS[0], "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e01-pip", UIDS[2], "lb", "x"])
    }

    fn load_balancer(&mut self) -> wit::LoadBalancer {
        wit::LoadBalancer {
            name: self.resource_name(),
            public_ip: self.resource_name(),
            backend_pool: self.text(&["pool", "p"]),
            rules: (0..self.len(3))
                .map(|_| wit::LbRule {
                    name: self.text(&["TCP-80", "UDP-53", "r"]),
                    protocol: if self.flag() { wit::LbProtocol::Udp } else { wit::LbProtocol::Tcp },
                    frontend_port: self.u16(),
                    backend_port: self.u16(),
                    idle_timeout_minutes: self.byte(),
                    enable_tcp_reset: self.flag(),
                })
                .collect(),
        }
    }

    pub fn arm_inventory(&mut self) -> wit::ArmInventory {
        wit::ArmInventory {
            public_ips: (0..self.len(4))
                .map(|_| wit::ListedPublicIp {
                    name: self.resource_name(),
                    version: if self.flag() { wit::IpVersion::Ipv6 } else { wit::IpVersion::Ipv4 },
                    address: self.opt_text(IPS),
                    as_put: self.flag(),
                })
                .collect(),
            load_balancers: (0..self.len(4))
                .map(|_| wit::ListedLoadBalancer {
                    name: self.resource_name(),
                    shape: if self.flag() { Some(self.load_balancer()) } else { None },
                })
                .collect(),
            nat_gateways: (0..self.len(3))
                .map(|_| wit::ListedNatGateway {
                    name: self.text(EGRESS_NAMES),
                    public_ips: self.texts(EGRESS_NAMES, 2),
                    public_ips_v6: self.texts(EGRESS_NAMES, 2),
                    associated: self.flag(),
                    as_put: self.flag(),
                })
                .collect(),
        }
    }

    pub fn object_ref(&mut self) -> wit::ObjectRef {
        wit::ObjectRef {
            kind: self.text(&["Service", "Pod", "service"]),
            namespace: self.text(NAMESPACES),
            name: self.text(NAMES),
            uid: self.text(UIDS),
        }
    }

    /// A command as a hostile guest might emit it.
    pub fn command(&mut self) -> wit::Command {
        let name = |d: &mut Self| d.resource_name();
        match self.byte() % 11 {
            0 => wit::Command::EmitEvent(wit::Event {
                regarding: self.object_ref(),
                event_type: if self.flag() { wit::EventType::Warning } else { wit::EventType::Normal },
                reason: self.text(&["EnsuredLoadBalancer", "SyncLoadBalancerFailed"]),
                message: self.text(&["m"]),
            }),
            1 => wit::Command::ReadNrp,
            2 => wit::Command::UpdateServices(wit::UpdateServices {
                services: (0..self.len(4))
                    .map(|_| wit::NrpServiceRequest {
                        name: self.text(SERVICE_NAMES),
                        service_type: if self.flag() {
                            wit::NrpServiceType::Outbound
                        } else {
                            wit::NrpServiceType::Inbound
                        },
                        backend_pools: (0..self.len(2))
                            .map(|_| wit::PoolRef { load_balancer: name(self), pool: self.text(&["pool", "p"]) })
                            .collect(),
                        public_nat_gateway: self.opt_text(EGRESS_NAMES),
                        is_delete: self.flag(),
                    })
                    .collect(),
            }),
            3 => wit::Command::UpdateAddressLocations(wit::UpdateAddressLocations {
                locations: (0..self.len(4))
                    .map(|_| wit::NrpLocation {
                        location: self.text(IPS),
                        action: if self.flag() {
                            wit::UpdateAction::FullUpdate
                        } else {
                            wit::UpdateAction::PartialUpdate
                        },
                        addresses: (0..self.len(4))
                            .map(|_| wit::NrpAddress {
                                address: self.text(IPS),
                                services: self.texts(SERVICE_NAMES, 3),
                            })
                            .collect(),
                    })
                    .collect(),
            }),
            4 => wit::Command::PutPublicIp(wit::PublicIp {
                name: name(self),
                version: if self.flag() { wit::IpVersion::Ipv6 } else { wit::IpVersion::Ipv4 },
            }),
            5 => wit::Command::PutLoadBalancer(self.load_balancer()),
            6 => wit::Command::DeleteResource(wit::ResourceRef {
                // 1 and 0 as the flag the kind once was (load balancer, public IP), so older
                // corpora decode as they did.
                kind: match self.byte() % 3 {
                    1 => wit::ResourceKind::LoadBalancer,
                    2 => wit::ResourceKind::NatGateway,
                    _ => wit::ResourceKind::PublicIp,
                },
                name: name(self),
            }),
            7 => wit::Command::PatchServiceStatus(wit::ServiceStatus {
                service: self.object_ref(),
                ingress_ips: self.texts(IPS, 2),
            }),
            8 => wit::Command::SetFinalizer(wit::FinalizerChange {
                service: self.object_ref(),
                finalizer: self.text(FINALIZERS),
                present: self.flag(),
            }),
            9 => wit::Command::ReadArm,
            _ => wit::Command::PutNatGateway(wit::NatGateway {
                name: self.text(EGRESS_NAMES),
                public_ips: self.texts(EGRESS_NAMES, 2),
                public_ips_v6: self.texts(EGRESS_NAMES, 2),
                associated: self.flag(),
            }),
        }
    }
}

/// Writes structures as the bytes [`Dec`] reads them back from (literal strings throughout).
#[derive(Default)]
pub struct Enc {
    pub bytes: Vec<u8>,
}

impl Enc {
    pub fn byte(&mut self, b: u8) {
        self.bytes.push(b);
    }

    pub fn flag(&mut self, b: bool) {
        self.byte(u8::from(b));
    }

    /// A length (truncated to `max`); returns the length written.
    pub fn len(&mut self, n: usize, max: u8) -> usize {
        let n = n.min(usize::from(max));
        self.byte(n as u8);
        n
    }

    pub fn u64(&mut self, v: u64) {
        self.byte(5);
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    pub fn u16(&mut self, v: u16) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    pub fn i32(&mut self, v: i32) {
        self.byte(7);
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    pub fn text(&mut self, s: &str) {
        if let Some(i) = hostile_strings().iter().position(|h| h == s) {
            self.byte(HOSTILE_TAG);
            self.byte(i as u8);
            return;
        }
        let mut end = s.len().min(MAX_TEXT);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.byte(LITERAL);
        self.byte(end as u8);
        self.bytes.extend_from_slice(&s.as_bytes()[..end]);
    }

    pub fn opt_text(&mut self, s: &Option<String>) {
        self.flag(s.is_some());
        if let Some(s) = s {
            self.text(s);
        }
    }

    pub fn texts(&mut self, v: &[String], max: u8) {
        let n = self.len(v.len(), max);
        for s in &v[..n] {
            self.text(s);
        }
    }

    pub fn opt_bool(&mut self, b: Option<bool>) {
        self.byte(match b {
            None => 0,
            Some(true) => 1,
            Some(false) => 2,
        });
    }

    pub fn opt_u64(&mut self, v: Option<u64>) {
        self.flag(v.is_some());
        if let Some(v) = v {
            self.u64(v);
        }
    }

    pub fn config(&mut self, c: &wit::Config) {
        self.byte(7);
        self.text(&c.backend_pool_type);
        self.text(&c.load_balancer_sku);
        self.texts(&c.multiple_standard_load_balancers, 2);
        self.flag(c.write_budgets.is_some());
        if let Some(b) = &c.write_budgets {
            for budget in [&b.update_address_locations, &b.update_services, &b.arm_writes] {
                self.flag(budget.is_some());
                if let Some(budget) = budget {
                    self.byte(u8::try_from(budget.per_minute / 40).unwrap_or(u8::MAX));
                    self.byte((budget.burst % 20) as u8);
                }
            }
        }
    }

    pub fn port(&mut self, p: &wit::ServicePort) {
        self.opt_text(&p.name);
        self.opt_text(&p.protocol);
        self.i32(p.port);
        match &p.target_port {
            None => self.byte(0),
            Some(wit::TargetPort::Number(n)) => {
                self.byte(1);
                self.i32(*n);
            }
            Some(wit::TargetPort::Name(s)) => {
                self.byte(2);
                self.text(s);
            }
        }
        self.flag(p.node_port.is_some());
        if let Some(n) = p.node_port {
            self.i32(n);
        }
    }

    pub fn service(&mut self, s: &wit::Service) {
        self.text(&s.uid);
        self.text(&s.namespace);
        self.text(&s.name);
        self.opt_text(&s.service_type);
        self.opt_text(&s.external_traffic_policy);
        self.opt_text(&s.session_affinity);
        self.opt_text(&s.load_balancer_ip);
        self.opt_text(&s.load_balancer_class);
        self.texts(&s.ip_families, 3);
        let n = self.len(s.ports.len(), 4);
        for p in &s.ports[..n] {
            self.port(p);
        }
        let n = self.len(s.annotations.len(), 3);
        for (k, v) in &s.annotations[..n] {
            self.text(k);
            self.text(v);
        }
        self.texts(&s.finalizers, 2);
        self.flag(s.deleting);
        self.texts(&s.ingress_ips, 2);
        let n = self.len(s.labels.len(), 2);
        for (k, v) in &s.labels[..n] {
            self.text(k);
            self.text(v);
        }
    }

    pub fn slice(&mut self, s: &wit::EndpointSlice) {
        self.text(&s.namespace);
        self.text(&s.name);
        self.opt_text(&s.owner_service_uid);
        self.text(&s.address_type);
        let n = self.len(s.endpoints.len(), MAX_LIST);
        for e in &s.endpoints[..n] {
            self.texts(&e.addresses, 3);
            self.opt_text(&e.node_name);
            self.opt_bool(e.ready);
        }
        self.flag(s.deleting);
    }

    pub fn pod(&mut self, p: &wit::Pod) {
        self.text(&p.namespace);
        self.text(&p.name);
        self.text(&p.uid);
        self.opt_text(&p.egress_label);
        self.opt_text(&p.phase);
        self.texts(&p.pod_ips, 3);
        self.opt_text(&p.pod_ip);
        self.texts(&p.host_ips, 2);
        self.opt_text(&p.host_ip);
        self.flag(p.deleting);
        self.texts(&p.finalizers, 2);
    }

    pub fn observation(&mut self, o: &wit::Observation) {
        match o {
            wit::Observation::ServiceUpserted(s) => {
                self.byte(0);
                self.service(s);
            }
            wit::Observation::ServiceDeleted((ns, name)) => {
                self.byte(2);
                self.text(ns);
                self.text(name);
            }
            wit::Observation::SliceUpserted(s) => {
                self.byte(3);
                self.slice(s);
            }
            wit::Observation::SliceDeleted((ns, name)) => {
                self.byte(5);
                self.text(ns);
                self.text(name);
            }
            wit::Observation::NodeUpserted(n) => {
                self.byte(6);
                self.text(&n.name);
                self.texts(&n.internal_ips, 3);
            }
            wit::Observation::NodeDeleted(name) => {
                self.byte(7);
                self.text(name);
            }
            wit::Observation::PodUpserted(p) => {
                self.byte(8);
                self.pod(p);
            }
            wit::Observation::PodDeleted((ns, name)) => {
                self.byte(9);
                self.byte(0);
                self.text(ns);
                self.text(name);
            }
            wit::Observation::ListsComplete => {
                self.byte(9);
                self.byte(1);
            }
        }
    }

    pub fn failure(&mut self, f: &wit::Failure) {
        self.byte(255);
        self.u16(f.status);
        self.opt_text(&f.code);
        self.opt_u64(f.retry_after_ms);
        self.text(&f.message);
    }

    pub fn outcome(&mut self, o: &wit::Outcome) {
        match o {
            wit::Outcome::Ok => self.byte(0),
            wit::Outcome::PublicIpAddress(ip) => {
                self.byte(1);
                self.text(ip);
            }
            wit::Outcome::NrpSnapshot(state) => {
                self.byte(2);
                let n = self.len(state.services.len(), 4);
                for s in &state.services[..n] {
                    self.text(&s.name);
                    self.text(&s.service_type);
                    self.flag(s.is_default);
                }
                let n = self.len(state.locations.len(), 4);
                for l in &state.locations[..n] {
                    self.text(&l.location);
                    let m = self.len(l.addresses.len(), 4);
                    for a in &l.addresses[..m] {
                        self.text(&a.address);
                        self.texts(&a.services, 3);
                    }
                }
            }
            wit::Outcome::Failed(f) => {
                self.byte(3);
                self.failure(f);
            }
            wit::Outcome::ArmInventory(inventory) => {
                self.byte(4);
                let n = self.len(inventory.public_ips.len(), 4);
                for p in &inventory.public_ips[..n] {
                    self.text(&p.name);
                    self.flag(p.version == wit::IpVersion::Ipv6);
                    self.opt_text(&p.address);
                    self.flag(p.as_put);
                }
                let n = self.len(inventory.load_balancers.len(), 4);
                for l in &inventory.load_balancers[..n] {
                    self.text(&l.name);
                    self.flag(l.shape.is_some());
                    if let Some(lb) = &l.shape {
                        self.load_balancer(lb);
                    }
                }
                let n = self.len(inventory.nat_gateways.len(), 3);
                for g in &inventory.nat_gateways[..n] {
                    self.text(&g.name);
                    self.texts(&g.public_ips, 2);
                    self.texts(&g.public_ips_v6, 2);
                    self.flag(g.associated);
                    self.flag(g.as_put);
                }
            }
        }
    }

    fn load_balancer(&mut self, lb: &wit::LoadBalancer) {
        self.text(&lb.name);
        self.text(&lb.public_ip);
        self.text(&lb.backend_pool);
        let n = self.len(lb.rules.len(), 3);
        for r in &lb.rules[..n] {
            self.text(&r.name);
            self.flag(r.protocol == wit::LbProtocol::Udp);
            self.u16(r.frontend_port);
            self.u16(r.backend_port);
            self.byte(r.idle_timeout_minutes);
            self.flag(r.enable_tcp_reset);
        }
    }

    pub fn object_ref(&mut self, r: &wit::ObjectRef) {
        self.text(&r.kind);
        self.text(&r.namespace);
        self.text(&r.name);
        self.text(&r.uid);
    }

    pub fn command(&mut self, c: &wit::Command) {
        match c {
            wit::Command::EmitEvent(e) => {
                self.byte(0);
                self.object_ref(&e.regarding);
                self.flag(e.event_type == wit::EventType::Warning);
                self.text(&e.reason);
                self.text(&e.message);
            }
            wit::Command::ReadNrp => self.byte(1),
            wit::Command::ReadArm => self.byte(9),
            wit::Command::UpdateServices(u) => {
                self.byte(2);
                let n = self.len(u.services.len(), 4);
                for s in &u.services[..n] {
                    self.text(&s.name);
                    self.flag(s.service_type == wit::NrpServiceType::Outbound);
                    let m = self.len(s.backend_pools.len(), 2);
                    for p in &s.backend_pools[..m] {
                        self.text(&p.load_balancer);
                        self.text(&p.pool);
                    }
                    self.opt_text(&s.public_nat_gateway);
                    self.flag(s.is_delete);
                }
            }
            wit::Command::UpdateAddressLocations(u) => {
                self.byte(3);
                let n = self.len(u.locations.len(), 4);
                for l in &u.locations[..n] {
                    self.text(&l.location);
                    self.flag(l.action == wit::UpdateAction::FullUpdate);
                    let m = self.len(l.addresses.len(), 4);
                    for a in &l.addresses[..m] {
                        self.text(&a.address);
                        self.texts(&a.services, 3);
                    }
                }
            }
            wit::Command::PutPublicIp(ip) => {
                self.byte(4);
                self.text(&ip.name);
                self.flag(ip.version == wit::IpVersion::Ipv6);
            }
            wit::Command::PutLoadBalancer(lb) => {
                self.byte(5);
                self.load_balancer(lb);
            }
            wit::Command::PutNatGateway(n) => {
                self.byte(10);
                self.text(&n.name);
                self.texts(&n.public_ips, 2);
                self.texts(&n.public_ips_v6, 2);
                self.flag(n.associated);
            }
            wit::Command::DeleteResource(r) => {
                self.byte(6);
                self.byte(match r.kind {
                    wit::ResourceKind::PublicIp => 0,
                    wit::ResourceKind::LoadBalancer => 1,
                    wit::ResourceKind::NatGateway => 2,
                });
                self.text(&r.name);
            }
            wit::Command::PatchServiceStatus(s) => {
                self.byte(7);
                self.object_ref(&s.service);
                self.texts(&s.ingress_ips, 2);
            }
            wit::Command::SetFinalizer(f) => {
                self.byte(8);
                self.object_ref(&f.service);
                self.text(&f.finalizer);
                self.flag(f.present);
            }
        }
    }
}

#[cfg(test)]
mod tests;
