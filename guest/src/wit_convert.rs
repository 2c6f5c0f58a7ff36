//! The one mapping between the WIT records (`wit/`) and the logic's model and config, as a macro.
//!
//! Two generators make Rust types from the same WIT: wit-bindgen for the guest's adapter
//! (`component.rs`, also built into `tests/next-guest`) and wasmtime's `bindgen!` for the host's
//! view of the native library (`clb_sandbox::native`, where the bindings are; the differential
//! runs drive it as `clb_simulator::native`). Both name every type,
//! field and case as the WIT does, so this one text compiles against either and the native and
//! sandboxed paths cannot convert differently. Field copies only; no rule lives here.

/// Expands to the `From` conversions between the WIT types and `$crate`'s `model` and
/// `config`, both ways where the logic needs both. The caller has `wit` in scope: the generated
/// module of the `clb:reconciler/types` interface.
#[doc(hidden)]
#[macro_export]
macro_rules! wit_conversions {
    () => {
        // In a block of its own so that these names cannot clash with the caller's imports;
        // the impls inside are global as any.
        const _: () = {
            use $crate::{config, model};

            impl From<wit::Config> for config::Config {
                fn from(c: wit::Config) -> Self {
                    Self {
                        backend_pool_type: c.backend_pool_type,
                        load_balancer_sku: c.load_balancer_sku,
                        multiple_standard_load_balancers: c.multiple_standard_load_balancers,
                        write_budgets: c.write_budgets.map(Into::into),
                    }
                }
            }

            impl From<wit::WriteBudgets> for $crate::budget::WriteBudgets {
                fn from(b: wit::WriteBudgets) -> Self {
                    let default = $crate::budget::WriteBudgets::DEFAULT;
                    let budget = |b: Option<wit::Budget>, default: $crate::budget::Budget| {
                        b.map_or(default, |b| $crate::budget::Budget { per_minute: b.per_minute, burst: b.burst })
                    };
                    Self {
                        update_address_locations: budget(b.update_address_locations, default.update_address_locations),
                        update_services: budget(b.update_services, default.update_services),
                        arm_writes: budget(b.arm_writes, default.arm_writes),
                        arm_write_reserve: b.arm_write_reserve.unwrap_or(default.arm_write_reserve),
                    }
                }
            }

            impl From<config::ConfigError> for wit::ConfigError {
                fn from(e: config::ConfigError) -> Self {
                    Self { field: e.field, reason: e.reason, message: e.message }
                }
            }

            impl From<config::Mode> for wit::Mode {
                fn from(m: config::Mode) -> Self {
                    match m {
                        config::Mode::ContainerLoadBalancer => Self::ContainerLoadBalancer,
                        config::Mode::MultiSlbLocalServices => Self::MultiSlbLocalServices,
                        config::Mode::Inactive => Self::Inactive,
                    }
                }
            }

            impl From<wit::Service> for model::Service {
                fn from(s: wit::Service) -> Self {
                    Self {
                        uid: s.uid,
                        namespace: s.namespace,
                        name: s.name,
                        service_type: s.service_type,
                        external_traffic_policy: s.external_traffic_policy,
                        session_affinity: s.session_affinity,
                        load_balancer_ip: s.load_balancer_ip,
                        load_balancer_class: s.load_balancer_class,
                        ip_families: s.ip_families,
                        ports: s
                            .ports
                            .into_iter()
                            .map(|p| model::ServicePort {
                                name: p.name,
                                protocol: p.protocol,
                                port: p.port,
                                target_port: p.target_port.map(|t| match t {
                                    wit::TargetPort::Number(n) => model::TargetPort::Number(n),
                                    wit::TargetPort::Name(n) => model::TargetPort::Name(n),
                                }),
                                node_port: p.node_port,
                            })
                            .collect(),
                        annotations: s.annotations,
                        finalizers: s.finalizers,
                        deleting: s.deleting,
                        ingress_ips: s.ingress_ips,
                    }
                }
            }

            impl From<wit::Observation> for model::Observation {
                fn from(o: wit::Observation) -> Self {
                    match o {
                        wit::Observation::ServiceUpserted(s) => Self::ServiceUpserted(s.into()),
                        wit::Observation::ServiceDeleted((ns, name)) => {
                            Self::ServiceDeleted(model::ObjectKey { namespace: ns.into(), name: name.into() })
                        }
                        wit::Observation::SliceUpserted(s) => Self::SliceUpserted(model::EndpointSlice {
                            namespace: s.namespace,
                            name: s.name,
                            owner_service_uid: s.owner_service_uid,
                            address_type: s.address_type,
                            endpoints: s
                                .endpoints
                                .into_iter()
                                .map(|e| model::Endpoint {
                                    addresses: e.addresses,
                                    node_name: e.node_name,
                                    ready: e.ready,
                                })
                                .collect(),
                            deleting: s.deleting,
                        }),
                        wit::Observation::SliceDeleted((ns, name)) => {
                            Self::SliceDeleted(model::ObjectKey { namespace: ns.into(), name: name.into() })
                        }
                        wit::Observation::NodeUpserted(n) => {
                            Self::NodeUpserted(model::Node { name: n.name, internal_ips: n.internal_ips })
                        }
                        wit::Observation::NodeDeleted(name) => Self::NodeDeleted(name),
                        wit::Observation::PodUpserted(p) => Self::PodUpserted(model::Pod {
                            namespace: p.namespace,
                            name: p.name,
                            uid: p.uid,
                            egress_label: p.egress_label,
                            phase: p.phase,
                            pod_ips: p.pod_ips,
                            pod_ip: p.pod_ip,
                            host_ips: p.host_ips,
                            host_ip: p.host_ip,
                            deleting: p.deleting,
                            finalizers: p.finalizers,
                        }),
                        wit::Observation::PodDeleted((ns, name)) => {
                            Self::PodDeleted(model::ObjectKey { namespace: ns.into(), name: name.into() })
                        }
                        wit::Observation::ListsComplete => Self::ListsComplete,
                    }
                }
            }

            impl From<wit::Outcome> for model::Outcome {
                fn from(o: wit::Outcome) -> Self {
                    match o {
                        wit::Outcome::Ok => Self::Ok,
                        wit::Outcome::PublicIpAddress(ip) => Self::PublicIpAddress(ip),
                        wit::Outcome::NrpSnapshot(state) => Self::NrpSnapshot(model::NrpState {
                            services: state
                                .services
                                .into_iter()
                                .map(|s| model::NrpService {
                                    name: s.name,
                                    service_type: s.service_type,
                                    backend_pools: s.backend_pools.into_iter().map(Into::into).collect(),
                                    is_default: s.is_default,
                                })
                                .collect(),
                            locations: state
                                .locations
                                .into_iter()
                                .map(|l| model::NrpListedLocation {
                                    location: l.location,
                                    addresses: l.addresses.into_iter().map(Into::into).collect(),
                                })
                                .collect(),
                        }),
                        wit::Outcome::ArmInventory(inventory) => Self::ArmInventory(model::ArmInventory {
                            public_ips: inventory
                                .public_ips
                                .into_iter()
                                .map(|p| model::ListedPublicIp {
                                    name: p.name,
                                    version: p.version.into(),
                                    address: p.address,
                                    as_put: p.as_put,
                                })
                                .collect(),
                            load_balancers: inventory
                                .load_balancers
                                .into_iter()
                                .map(|l| model::ListedLoadBalancer { name: l.name, shape: l.shape.map(Into::into) })
                                .collect(),
                            nat_gateways: inventory
                                .nat_gateways
                                .into_iter()
                                .map(|n| model::ListedNatGateway {
                                    name: n.name,
                                    public_ips: n.public_ips,
                                    public_ips_v6: n.public_ips_v6,
                                    associated: n.associated,
                                    as_put: n.as_put,
                                })
                                .collect(),
                        }),
                        wit::Outcome::Failed(f) => Self::Failed(model::Failure {
                            status: f.status,
                            code: f.code,
                            retry_after_ms: f.retry_after_ms,
                            message: f.message,
                        }),
                    }
                }
            }

            impl From<wit::IpVersion> for model::IpVersion {
                fn from(v: wit::IpVersion) -> Self {
                    match v {
                        wit::IpVersion::Ipv4 => Self::Ipv4,
                        wit::IpVersion::Ipv6 => Self::Ipv6,
                    }
                }
            }

            impl From<model::IpVersion> for wit::IpVersion {
                fn from(v: model::IpVersion) -> Self {
                    match v {
                        model::IpVersion::Ipv4 => Self::Ipv4,
                        model::IpVersion::Ipv6 => Self::Ipv6,
                    }
                }
            }

            impl From<wit::LoadBalancer> for model::LoadBalancer {
                fn from(lb: wit::LoadBalancer) -> Self {
                    Self {
                        name: lb.name.into(),
                        public_ip: lb.public_ip.into(),
                        backend_pool: lb.backend_pool.into(),
                        rules: lb
                            .rules
                            .into_iter()
                            .map(|r| model::LbRule {
                                name: r.name.into(),
                                protocol: match r.protocol {
                                    wit::LbProtocol::Tcp => model::LbProtocol::Tcp,
                                    wit::LbProtocol::Udp => model::LbProtocol::Udp,
                                },
                                frontend_port: r.frontend_port,
                                backend_port: r.backend_port,
                                idle_timeout_minutes: r.idle_timeout_minutes,
                                enable_tcp_reset: r.enable_tcp_reset,
                            })
                            .collect(),
                    }
                }
            }

            impl From<model::LoadBalancer> for wit::LoadBalancer {
                fn from(lb: model::LoadBalancer) -> Self {
                    Self {
                        name: lb.name.into(),
                        public_ip: lb.public_ip.into(),
                        backend_pool: lb.backend_pool.into(),
                        rules: lb
                            .rules
                            .into_iter()
                            .map(|r| wit::LbRule {
                                name: r.name.into(),
                                protocol: match r.protocol {
                                    model::LbProtocol::Tcp => wit::LbProtocol::Tcp,
                                    model::LbProtocol::Udp => wit::LbProtocol::Udp,
                                },
                                frontend_port: r.frontend_port,
                                backend_port: r.backend_port,
                                idle_timeout_minutes: r.idle_timeout_minutes,
                                enable_tcp_reset: r.enable_tcp_reset,
                            })
                            .collect(),
                    }
                }
            }

            impl From<wit::PoolRef> for model::PoolRef {
                fn from(p: wit::PoolRef) -> Self {
                    Self { load_balancer: p.load_balancer, pool: p.pool }
                }
            }

            impl From<model::PoolRef> for wit::PoolRef {
                fn from(p: model::PoolRef) -> Self {
                    Self { load_balancer: p.load_balancer, pool: p.pool }
                }
            }

            impl From<wit::NrpAddress> for model::NrpAddress {
                fn from(a: wit::NrpAddress) -> Self {
                    Self { address: a.address, services: a.services }
                }
            }

            impl From<model::NrpAddress> for wit::NrpAddress {
                fn from(a: model::NrpAddress) -> Self {
                    Self { address: a.address, services: a.services }
                }
            }

            impl From<model::ObjectRef> for wit::ObjectRef {
                fn from(r: model::ObjectRef) -> Self {
                    Self { kind: r.kind.into(), namespace: r.namespace.into(), name: r.name.into(), uid: r.uid.into() }
                }
            }

            impl From<model::Command> for wit::Command {
                fn from(c: model::Command) -> Self {
                    use model::Command as M;
                    match c {
                        M::EmitEvent(e) => wit::Command::EmitEvent(wit::Event {
                            regarding: e.regarding.into(),
                            event_type: match e.event_type {
                                model::EventType::Normal => wit::EventType::Normal,
                                model::EventType::Warning => wit::EventType::Warning,
                            },
                            reason: e.reason,
                            message: e.message,
                        }),
                        M::ReadNrp => wit::Command::ReadNrp,
                        M::ReadArm => wit::Command::ReadArm,
                        M::UpdateServices(services) => wit::Command::UpdateServices(wit::UpdateServices {
                            services: services
                                .into_iter()
                                .map(|s| wit::NrpServiceRequest {
                                    name: s.name,
                                    service_type: match s.service_type {
                                        model::NrpServiceType::Inbound => wit::NrpServiceType::Inbound,
                                        model::NrpServiceType::Outbound => wit::NrpServiceType::Outbound,
                                    },
                                    backend_pools: s.backend_pools.into_iter().map(Into::into).collect(),
                                    public_nat_gateway: s.public_nat_gateway,
                                    is_delete: s.is_delete,
                                })
                                .collect(),
                        }),
                        M::UpdateAddressLocations(locations) => {
                            wit::Command::UpdateAddressLocations(wit::UpdateAddressLocations {
                                locations: locations
                                    .into_iter()
                                    .map(|l| wit::NrpLocation {
                                        location: l.location,
                                        action: match l.action {
                                            model::UpdateAction::PartialUpdate => wit::UpdateAction::PartialUpdate,
                                            model::UpdateAction::FullUpdate => wit::UpdateAction::FullUpdate,
                                        },
                                        addresses: l.addresses.into_iter().map(Into::into).collect(),
                                    })
                                    .collect(),
                            })
                        }
                        M::PutPublicIp(ip) => wit::Command::PutPublicIp(wit::PublicIp {
                            name: ip.name.into(),
                            version: ip.version.into(),
                        }),
                        M::PutLoadBalancer(lb) => wit::Command::PutLoadBalancer(lb.into()),
                        M::PutNatGateway(n) => wit::Command::PutNatGateway(wit::NatGateway {
                            name: n.name,
                            public_ips: n.public_ips,
                            public_ips_v6: n.public_ips_v6,
                            associated: n.associated,
                        }),
                        M::DeleteResource(r) => wit::Command::DeleteResource(wit::ResourceRef {
                            kind: match r.kind {
                                model::ResourceKind::PublicIp => wit::ResourceKind::PublicIp,
                                model::ResourceKind::LoadBalancer => wit::ResourceKind::LoadBalancer,
                                model::ResourceKind::NatGateway => wit::ResourceKind::NatGateway,
                            },
                            name: r.name,
                        }),
                        M::PatchServiceStatus { service, ingress_ips } => {
                            wit::Command::PatchServiceStatus(wit::ServiceStatus {
                                service: service.into(),
                                ingress_ips,
                            })
                        }
                        M::SetFinalizer { service, finalizer, present } => {
                            wit::Command::SetFinalizer(wit::FinalizerChange {
                                service: service.into(),
                                finalizer,
                                present,
                            })
                        }
                    }
                }
            }

            impl From<$crate::tracker::Stats> for wit::TrackerStats {
                fn from(s: $crate::tracker::Stats) -> Self {
                    use $crate::tracker::{Operation, ServiceType};
                    let service_type = |t: ServiceType| match t {
                        ServiceType::Inbound => wit::ServiceType::Inbound,
                        ServiceType::Outbound => wit::ServiceType::Outbound,
                    };
                    let operation = |o: Operation| match o {
                        Operation::Create => wit::Operation::Create,
                        Operation::Update => wit::Operation::Update,
                        Operation::Delete => wit::Operation::Delete,
                    };
                    let state = |p: model::Phase| match p {
                        model::Phase::NotStarted => wit::OperationState::NotStarted,
                        model::Phase::CreationInProgress => wit::OperationState::CreationInProgress,
                        model::Phase::Created => wit::OperationState::Created,
                        model::Phase::UpdateInProgress => wit::OperationState::UpdateInProgress,
                        model::Phase::DeletionPending => wit::OperationState::DeletionPending,
                        model::Phase::DeletionInProgress => wit::OperationState::DeletionInProgress,
                    };
                    let histograms = |hs: Vec<(Operation, ServiceType, $crate::tracker::Histogram)>| {
                        hs.into_iter()
                            .map(|(o, t, h)| wit::Histogram {
                                operation: operation(o),
                                service_type: service_type(t),
                                counts: h.counts,
                                count: h.count,
                                sum: h.sum,
                            })
                            .collect()
                    };
                    let named = |ns: Vec<(String, u64)>| {
                        ns.into_iter().map(|(name, count)| wit::NamedCount { name, count }).collect()
                    };
                    Self {
                        service_gateway_enabled: s.service_gateway_enabled,
                        pending: s
                            .pending
                            .into_iter()
                            .map(|p| wit::PendingOperations {
                                state: state(p.phase),
                                service_type: service_type(p.service_type),
                                count: p.count,
                                oldest_began_ms: p.oldest_began_ms,
                            })
                            .collect(),
                        k8s_services: s.k8s_services,
                        nrp_load_balancers: s.nrp_load_balancers,
                        nrp_nat_gateways: s.nrp_nat_gateways,
                        nrp_locations: s.nrp_locations,
                        nrp_addresses: s.nrp_addresses,
                        pending_deletions: s.pending_deletions,
                        blocked_by_locations: s.blocked_by_locations,
                        pod_finalizers_held: s.pod_finalizers_held,
                        commands_in_flight: s.commands_in_flight,
                        attempts: s
                            .attempts
                            .into_iter()
                            .map(|a| wit::AttemptCount {
                                operation: operation(a.operation),
                                service_type: service_type(a.service_type),
                                success: a.success,
                                error_code: a.error_code,
                                orphan: a.orphan,
                                count: a.count,
                            })
                            .collect(),
                        durations: histograms(s.durations),
                        retries: histograms(s.retries),
                        parked: named(s.parked),
                        orphans_cleaned: s.orphans_cleaned,
                        delete_substep_failures: named(s.delete_substep_failures),
                        location_sync_terminal_errors: s.location_sync_terminal_errors,
                        initialized_after_ms: s.initialized_after_ms,
                        budgets: s
                            .budgets
                            .into_iter()
                            .map(|b| wit::BudgetLevel { bucket: b.bucket, tokens: b.tokens, per_minute: b.per_minute })
                            .collect(),
                    }
                }
            }

            impl From<model::Step> for wit::Step {
                fn from(s: model::Step) -> Self {
                    Self {
                        commands: s
                            .commands
                            .into_iter()
                            .map(|issued| wit::Issued { id: issued.id, command: issued.command.into() })
                            .collect(),
                        wake_at_ms: s.wake_at_ms,
                        idle: s.idle,
                    }
                }
            }
        };
    };
}

/// Expands to `WitPoolQueue` (the logic's [`PoolQueue`](crate::backend_pools::PoolQueue) with
/// the `pool-queue` resource's methods over WIT records) and `place_service_wit` (the
/// `place-service` function over WIT records): the one mapping of the `backend-pools` interface,
/// for the guest's adapter and for the host's native pool logic, as [`wit_conversions`] is for
/// the tracker. The caller has `wit` (`clb:reconciler/types`) and `wit_pools` (the generated
/// module of the exported `clb:reconciler/backend-pools`) in scope. Field copies only.
#[doc(hidden)]
#[macro_export]
macro_rules! pool_adapter {
    () => {
        /// The logic's pool queue, spoken to in the `backend-pools` interface's records.
        pub struct WitPoolQueue($crate::backend_pools::PoolQueue);

        impl WitPoolQueue {
            pub fn new(max_retries: u32) -> Self {
                Self($crate::backend_pools::PoolQueue::new(max_retries))
            }

            pub fn enqueue(&mut self, operations: Vec<wit_pools::PoolOperation>) {
                use $crate::backend_pools as pools;
                self.0.enqueue(operations.into_iter().map(|o| pools::PoolOperation {
                    service: o.service,
                    load_balancer: o.load_balancer,
                    pool: o.pool,
                    kind: match o.kind {
                        wit_pools::OperationKind::Add => pools::OperationKind::Add,
                        wit_pools::OperationKind::Remove => pools::OperationKind::Remove,
                        wit_pools::OperationKind::DeletePool => pools::OperationKind::DeletePool,
                        wit_pools::OperationKind::EnsurePool => pools::OperationKind::EnsurePool,
                    },
                    node_ips: o.node_ips,
                }));
            }

            pub fn remove_operations(&mut self, service: &str) -> u32 {
                u32::try_from(self.0.remove_operations(service)).unwrap_or(u32::MAX)
            }

            pub fn status(&self, now_ms: u64) -> wit_pools::QueueStatus {
                let s = self.0.status(now_ms);
                wit_pools::QueueStatus { queued: s.queued, ready: s.ready, wake_at_ms: s.wake_at_ms }
            }

            pub fn drain_and_group(
                &mut self,
                now_ms: u64,
                assignment: Vec<wit_pools::ServiceAssignment>,
            ) -> Vec<wit_pools::PoolGroup> {
                let assignment: Vec<$crate::backend_pools::ServiceAssignment> = assignment
                    .into_iter()
                    .map(|a| $crate::backend_pools::ServiceAssignment {
                        service: a.service,
                        load_balancer: a.load_balancer,
                    })
                    .collect();
                self.0
                    .drain_and_group(now_ms, &assignment)
                    .into_iter()
                    .map(|g| wit_pools::PoolGroup {
                        id: g.id,
                        load_balancer: g.load_balancer,
                        pool: g.pool,
                        add: g.add,
                        remove: g.remove,
                        services: g.services,
                        delete: g.delete,
                        ensure: g.ensure,
                    })
                    .collect()
            }

            pub fn report(
                &mut self,
                now_ms: u64,
                group: u64,
                outcome: wit_pools::GroupOutcome,
            ) -> Option<wit_pools::GroupReport> {
                use $crate::backend_pools as pools;
                let outcome = match outcome {
                    wit_pools::GroupOutcome::Updated => pools::GroupOutcome::Updated,
                    wit_pools::GroupOutcome::Created => pools::GroupOutcome::Created,
                    wit_pools::GroupOutcome::Deleted => pools::GroupOutcome::Deleted,
                    wit_pools::GroupOutcome::Unchanged => pools::GroupOutcome::Unchanged,
                    wit_pools::GroupOutcome::Failed(f) => pools::GroupOutcome::Failed(pools::Failure {
                        status: f.status,
                        code: f.code,
                        retry_after_ms: f.retry_after_ms,
                        message: f.message,
                    }),
                };
                let report = self.0.report(now_ms, group, &outcome)?;
                Some(wit_pools::GroupReport {
                    disposition: match report.disposition {
                        pools::Disposition::Done => wit_pools::Disposition::Done,
                        pools::Disposition::Dropped => wit_pools::Disposition::Dropped,
                        pools::Disposition::Requeued => wit_pools::Disposition::Requeued,
                        pools::Disposition::Abandoned => wit_pools::Disposition::Abandoned,
                    },
                    not_before_ms: report.not_before_ms,
                    events: report
                        .events
                        .into_iter()
                        .map(|e| wit_pools::ServiceEvent {
                            service: e.service,
                            event_type: match e.event_type {
                                pools::EventType::Normal => wit::EventType::Normal,
                                pools::EventType::Warning => wit::EventType::Warning,
                            },
                            reason: e.reason,
                            message: e.message,
                        })
                        .collect(),
                })
            }
        }

        /// `place-service` over the interface's records.
        pub fn place_service_wit(
            configurations: Vec<wit_pools::SlbConfiguration>,
            service: wit::Service,
            facts: wit_pools::PlacementFacts,
        ) -> wit_pools::Placement {
            use $crate::{placement, selector};
            let selector = |s: wit_pools::LabelSelector| selector::LabelSelector {
                match_labels: s.match_labels,
                match_expressions: s
                    .match_expressions
                    .into_iter()
                    .map(|r| selector::Requirement { key: r.key, operator: r.operator, values: r.values })
                    .collect(),
            };
            let configurations: Vec<placement::SlbConfiguration> = configurations
                .into_iter()
                .map(|c| placement::SlbConfiguration {
                    name: c.name,
                    allow_service_placement: c.allow_service_placement,
                    service_label_selector: c.service_label_selector.map(selector),
                    service_namespace_selector: c.service_namespace_selector.map(selector),
                })
                .collect();
            let facts = placement::PlacementFacts {
                service_labels: service.labels.clone(),
                namespace_labels: facts.namespace_labels,
                current_load_balancer: facts.current_load_balancer,
                load_balancers: facts
                    .load_balancers
                    .into_iter()
                    .map(|lb| placement::ExistingLoadBalancer {
                        name: lb.name,
                        rules: lb.rules,
                        pools: lb.pools,
                        frontends: lb
                            .frontends
                            .into_iter()
                            .map(|f| placement::Frontend { name: f.name, private_ip: f.private_ip })
                            .collect(),
                    })
                    .collect(),
                public_ips: facts
                    .public_ips
                    .into_iter()
                    .map(|ip| placement::ExistingPublicIp {
                        name: ip.name,
                        address: ip.address,
                        ip_configuration: ip.ip_configuration,
                        tags: ip.tags,
                    })
                    .collect(),
                resource_group: facts.resource_group,
                cluster_name: facts.cluster_name,
            };
            let left = |pools: Vec<placement::LeftPool>| -> Vec<wit_pools::LeftPool> {
                pools
                    .into_iter()
                    .map(|p| wit_pools::LeftPool { load_balancer: p.load_balancer, pool: p.pool })
                    .collect()
            };
            let service = service.into();
            match placement::place_service(&configurations, &service, &facts) {
                Ok(None) => {
                    wit_pools::Placement::NotLocal(left(placement::pools_left(&configurations, &service, &facts, None)))
                }
                Ok(Some(p)) => wit_pools::Placement::At(wit_pools::ServicePlacement {
                    load_balancer: p.load_balancer,
                    pools: p.pools.into_iter().map(|f| wit_pools::FamilyPool { ipv6: f.ipv6, name: f.name }).collect(),
                    left: left(p.left),
                }),
                Err(why) => wit_pools::Placement::Refused(why),
            }
        }
    };
}
