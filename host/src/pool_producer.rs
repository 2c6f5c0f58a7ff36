//! The producer of the backend-pool updater (multi-SLB local-service mode, upstream §e, design
//! §5): for one local Service at a time, the node IPs of its ready endpoints against what was
//! enqueued for it last, turned into [`PoolOperation`]s (upstream's
//! `applyIPChangesAmongLocalServiceBackendPoolsByIPFamily`: a remove of the IPs no longer
//! expected, an add of the whole expected list). A Service new to a load balancer (or moved to
//! another) starts from what its pool holds in Azure, as a reconcile that read the load balancer
//! would; its operations queued for the old pool are dropped.
//!
//! Shared by `simulate` (which recomputes every Service when the cluster changes) and `run`
//! (`crate::live::pools`, which recomputes only the Services a change touched). Both call it under
//! the service reconcile lock, as upstream's reconcile writes its local-service map.

use crate::azure::AzureApi;
use crate::backend_pools::{PoolUpdater, PoolUpdaterError, ResourceLock};
use crate::executor::KubeApi;
use crate::sandbox::bindings::clb::reconciler::types as wit;
use crate::sandbox::bindings::exports::clb::reconciler::backend_pools::{
    ExistingLoadBalancer, OperationKind, Placement, PlacementFacts, PoolOperation, ServicePlacement, SlbConfiguration,
};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// The canonical text of an IP, or the trimmed text when it is none.
pub fn canonical_ip(text: &str) -> String {
    text.trim().parse::<IpAddr>().map(|ip| ip.to_string()).unwrap_or_else(|_| text.trim().to_owned())
}

/// A Node's IPv4 InternalIPs, canonical: the addresses local-service pools hold.
pub fn node_ipv4s(node: &wit::Node) -> Vec<String> {
    node.internal_ips
        .iter()
        .filter_map(|ip| ip.trim().parse::<IpAddr>().ok())
        .filter(IpAddr::is_ipv4)
        .map(|ip| ip.to_string())
        .collect()
}

/// The node IPs of the ready endpoints of the Service with `uid` among `slices` (a slice being
/// deleted counts for nothing; an endpoint without `ready` counts as ready).
pub fn ready_node_ips<'s>(
    uid: &str,
    slices: impl IntoIterator<Item = &'s wit::EndpointSlice>,
    node_ips: &BTreeMap<String, Vec<String>>,
) -> BTreeSet<String> {
    slices
        .into_iter()
        .filter(|s| !s.deleting && s.owner_service_uid.as_ref().is_some_and(|o| o.eq_ignore_ascii_case(uid)))
        .flat_map(|s| &s.endpoints)
        .filter(|e| e.ready != Some(false))
        .filter_map(|e| e.node_name.as_ref().and_then(|n| node_ips.get(n)))
        .flatten()
        .cloned()
        .collect()
}

fn same_placement(a: &ServicePlacement, b: &ServicePlacement) -> bool {
    a.load_balancer.eq_ignore_ascii_case(&b.load_balancer) && a.pool.eq_ignore_ascii_case(&b.pool)
}

fn ip_list(ips: &[String]) -> String {
    format!("[{}]", ips.join(", "))
}

/// What the producer last enqueued for one local Service.
struct Produced {
    /// `namespace/name` as spelled.
    service: String,
    placement: ServicePlacement,
    /// Canonical node IPs.
    ips: BTreeSet<String>,
}

/// The producer's memory: per local Service, what it enqueued last.
#[derive(Default)]
pub struct PoolProducer {
    /// Lower-cased `namespace/name` → what was enqueued for it last.
    known: BTreeMap<String, Produced>,
    /// Lower-cased `namespace/name` → why it could not be placed, last time it was asked.
    refused: BTreeMap<String, String>,
}

impl PoolProducer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether [`update`](Self::update) needs the pool's addresses in Azure for this Service: it
    /// is new to the producer, or placed on another pool than before.
    pub fn needs_pool_contents(&self, service: &str, placement: &ServicePlacement) -> bool {
        self.known.get(&service.to_ascii_lowercase()).is_none_or(|before| !same_placement(&before.placement, placement))
    }

    /// Where `service` goes (upstream's placement, in the guest): the load balancer it was placed
    /// on last is the one it uses now; `namespace_labels` are its namespace's (`None`: not
    /// known), `load_balancers` the resource group's. With the answer, whether a refusal is new:
    /// not what was said of the Service last (one Warning Event per distinct reason, not one per
    /// change); what the producer enqueued for a refused Service stays as it was.
    pub fn place<A: AzureApi, L: ResourceLock, K: KubeApi>(
        &mut self,
        updater: &PoolUpdater<A, L, K>,
        configurations: &[SlbConfiguration],
        service: &wit::Service,
        namespace_labels: Option<Vec<(String, String)>>,
        load_balancers: &[ExistingLoadBalancer],
    ) -> Result<(Placement, bool), PoolUpdaterError> {
        let folded = format!("{}/{}", service.namespace, service.name).to_ascii_lowercase();
        let facts = PlacementFacts {
            namespace_labels,
            current_load_balancer: self.known.get(&folded).map(|p| p.placement.load_balancer.clone()),
            load_balancers: load_balancers.to_vec(),
        };
        Ok(match updater.place(configurations, service, &facts)? {
            Placement::Refused(message) => {
                let new = self.refused.get(&folded) != Some(&message);
                self.refused.insert(folded, message.clone());
                (Placement::Refused(message), new)
            }
            placed => {
                self.refused.remove(&folded);
                (placed, false)
            }
        })
    }

    /// Forgets what was said of the Services not in `present` (lower-cased keys): they are
    /// gone, or placed since.
    pub fn keep_refused(&mut self, present: &BTreeSet<String>) {
        self.refused.retain(|key, _| present.contains(key));
    }

    /// Forgets what was said of one Service (any case): it is gone.
    pub fn gone(&mut self, service: &str) {
        self.refused.remove(&service.to_ascii_lowercase());
    }

    /// The lower-cased keys of the Services the producer knows.
    pub fn known(&self) -> impl Iterator<Item = &str> {
        self.known.keys().map(String::as_str)
    }

    /// Records that `service` (`namespace/name`) is a local Service at `placement` whose ready
    /// endpoints are on the nodes with `ips`, and enqueues the change against what was enqueued
    /// for it last; `pool_contents` (canonical IPs) is called when
    /// [`needs_pool_contents`](Self::needs_pool_contents) says so. One line per thing done goes
    /// to `notes`.
    #[allow(clippy::too_many_arguments)] // each is one thing the caller has in hand
    pub fn update<A: AzureApi, L: ResourceLock, K: KubeApi>(
        &mut self,
        updater: &PoolUpdater<A, L, K>,
        reconciling: &tokio::sync::MutexGuard<'_, ()>,
        service: &str,
        placement: ServicePlacement,
        ips: BTreeSet<String>,
        pool_contents: impl FnOnce() -> BTreeSet<String>,
        notes: &mut Vec<String>,
    ) -> Result<(), PoolUpdaterError> {
        let folded = service.to_ascii_lowercase();
        let baseline = match self.known.get(&folded) {
            Some(before) if same_placement(&before.placement, &placement) => before.ips.clone(),
            before => {
                if let Some(before) = before {
                    let dropped = updater.remove_operations(service)?;
                    notes.push(format!(
                        "{service} moved {}:{} → {}:{}: {dropped} queued operation(s) dropped",
                        before.placement.load_balancer, before.placement.pool, placement.load_balancer, placement.pool
                    ));
                }
                pool_contents()
            }
        };
        updater.assign(reconciling, service, Some(&placement.load_balancer));
        let operation = |kind, node_ips| PoolOperation {
            service: service.to_owned(),
            load_balancer: placement.load_balancer.clone(),
            pool: placement.pool.clone(),
            kind,
            node_ips,
        };
        let mut operations = Vec::new();
        let gone: Vec<String> = baseline.difference(&ips).cloned().collect();
        if !gone.is_empty() {
            operations.push(operation(OperationKind::Remove, gone));
        }
        if ips != baseline && !ips.is_empty() {
            operations.push(operation(OperationKind::Add, ips.iter().cloned().collect()));
        }
        if !operations.is_empty() {
            updater.enqueue(&operations)?;
            for op in &operations {
                let sign = if op.kind == OperationKind::Add { "add" } else { "remove" };
                let (lb, pool) = (&op.load_balancer, &op.pool);
                notes.push(format!("enqueue {service} {sign} {lb}:{pool} {}", ip_list(&op.node_ips)));
            }
        }
        self.known.insert(folded, Produced { service: service.to_owned(), placement, ips });
        Ok(())
    }

    /// `service` (any case) is not a local Service any more (deleted, or changed out of the
    /// mode): its queued operations are dropped and its assignment forgotten. Nothing happens
    /// for a Service the producer does not know.
    pub fn forget<A: AzureApi, L: ResourceLock, K: KubeApi>(
        &mut self,
        updater: &PoolUpdater<A, L, K>,
        reconciling: &tokio::sync::MutexGuard<'_, ()>,
        service: &str,
        notes: &mut Vec<String>,
    ) -> Result<(), PoolUpdaterError> {
        let Some(before) = self.known.remove(&service.to_ascii_lowercase()) else { return Ok(()) };
        let dropped = updater.remove_operations(&before.service)?;
        updater.assign(reconciling, &before.service, None);
        notes.push(format!("{} is no longer a local Service: {dropped} queued operation(s) dropped", before.service));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Ports upstream TestEndpointSlicesInformerDeduplicatesNodeIPs: several ready endpoints on
    // one node, in one slice or in two, put that node's IP in the Service's pool once; not-ready
    // endpoints, deleting slices and other Services' slices add nothing.
    #[test]
    fn many_endpoints_on_one_node_give_its_ip_once() {
        let endpoint = |node: &str, ready: Option<bool>| wit::Endpoint {
            addresses: vec!["10.244.0.5".into()],
            node_name: Some(node.into()),
            ready,
        };
        let slice = |name: &str, owner: &str, deleting: bool, endpoints: Vec<wit::Endpoint>| wit::EndpointSlice {
            namespace: "shop".into(),
            name: name.into(),
            owner_service_uid: Some(owner.into()),
            address_type: "IPv4".into(),
            endpoints,
            deleting,
        };
        let slices = [
            slice(
                "web-a",
                "UID-1",
                false,
                vec![endpoint("n1", Some(true)), endpoint("n1", None), endpoint("n2", Some(false))],
            ),
            slice("web-b", "uid-1", false, vec![endpoint("n1", Some(true)), endpoint("n3", Some(true))]),
            slice("web-c", "uid-1", true, vec![endpoint("n4", Some(true))]),
            slice("api-a", "uid-2", false, vec![endpoint("n5", Some(true))]),
        ];
        let node_ips: BTreeMap<String, Vec<String>> =
            (1..=5).map(|n| (format!("n{n}"), vec![format!("10.224.0.{n}")])).collect();
        let ips = ready_node_ips("uid-1", &slices, &node_ips);
        assert_eq!(ips.into_iter().collect::<Vec<_>>(), ["10.224.0.1", "10.224.0.3"]);
    }
}
