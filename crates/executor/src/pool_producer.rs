//! The producer of the backend-pool updater (multi-SLB local-service mode, docs/upstream.md §e, docs/design.md
//! §5): for one local Service at a time, the node IPs of its ready endpoints against what was
//! enqueued for it last, turned into [`PoolOperation`]s (upstream's
//! `applyIPChangesAmongLocalServiceBackendPoolsByIPFamily`: per pool, the IPs of its family, a
//! remove of those no longer expected and an add of the whole expected list). A Service has a
//! pool per family it serves (the guest's placement names them); one that stops serving a
//! family has that family's pool deleted. A Service new to a load balancer (or moved to
//! another) starts from what its pool holds in Azure, as a reconcile that read the load balancer
//! would; its operations queued for the old pool are dropped and the old pool is deleted, as it
//! is when the Service goes (upstream's `cleanupLocalServiceBackendPool`). A pool Azure lacks is
//! ensured (made empty if nothing is to go in yet), and the first time a Service is placed the
//! pools the guest says it left (named after it where it is not: what it left while no producer
//! ran) are deleted. The queue does these writes in the updater's tick, under its locks.
//!
//! Shared by `simulate` (which recomputes every Service when the cluster changes) and `run`
//! (`clb_host::live::pools`, which recomputes only the Services a change touched). Both call it under
//! the service reconcile lock, as upstream's reconcile writes its local-service map.

use crate::KubeApi;
use crate::backend_pools::{PoolUpdater, PoolUpdaterError, ResourceLock};
use clb_azure::AzureApi;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::bindings::exports::clb::reconciler::backend_pools::{
    ExistingLoadBalancer, ExistingPublicIp, FamilyPool, Frontend, LeftPool, OperationKind, Placement, PlacementFacts,
    PoolOperation, ServicePlacement, SlbConfiguration,
};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// What placement reads of Azure (the resource group's load balancers and public IPs, as last
/// listed) and of where it runs (the resource group, the cluster's name).
#[derive(Clone, Debug, Default)]
pub struct AzureFacts {
    pub load_balancers: Vec<ExistingLoadBalancer>,
    pub public_ips: Vec<ExistingPublicIp>,
    /// The resource group `public_ips` are of.
    pub resource_group: String,
    /// The cluster's name ([`cluster_name`](crate::inputs::CloudConfig::cluster_name)).
    pub cluster_name: String,
}

impl AzureFacts {
    /// The facts of the listings of the resource group's load balancers and public IPs.
    pub fn listed(
        load_balancers: Vec<clb_azure::ListedLoadBalancer>,
        public_ips: Vec<clb_azure::ListedPublicIp>,
        resource_group: &str,
        cluster_name: &str,
    ) -> Self {
        Self {
            load_balancers: load_balancers
                .into_iter()
                .map(|lb| ExistingLoadBalancer {
                    name: lb.name,
                    rules: lb.rules,
                    pools: lb.pools,
                    frontends: lb
                        .frontends
                        .into_iter()
                        .map(|f| Frontend { name: f.name, private_ip: f.private_ip })
                        .collect(),
                })
                .collect(),
            public_ips: public_ips
                .into_iter()
                .map(|ip| ExistingPublicIp {
                    name: ip.name,
                    address: ip.address,
                    ip_configuration: ip.ip_configuration,
                    tags: ip.tags,
                })
                .collect(),
            resource_group: resource_group.to_owned(),
            cluster_name: cluster_name.to_owned(),
        }
    }
}

/// The canonical text of an IP, or the trimmed text when it is none.
pub fn canonical_ip(text: &str) -> String {
    text.trim().parse::<IpAddr>().map(|ip| ip.to_string()).unwrap_or_else(|_| text.trim().to_owned())
}

/// A Node's InternalIPs of both families, canonical (what is not an IP left out): the
/// addresses local-service pools hold, each in the pool of its family.
pub fn node_ips(node: &wit::Node) -> Vec<String> {
    node.internal_ips.iter().filter_map(|ip| ip.trim().parse::<IpAddr>().ok()).map(|ip| ip.to_string()).collect()
}

/// Whether a canonical IP belongs in the pool (IPv6 in the IPv6 pool, the rest in the IPv4 one).
fn of_family(ip: &str, pool: &FamilyPool) -> bool {
    ip.parse::<IpAddr>().is_ok_and(|ip| ip.is_ipv6()) == pool.ipv6
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

/// The pools of `placement` as `<lb>:<pool>` text, for notes.
fn pools_text(placement: &ServicePlacement) -> String {
    let names: Vec<&str> = placement.pools.iter().map(|p| p.name.as_str()).collect();
    format!("{}:{}", placement.load_balancer, names.join("+"))
}

fn ip_list(ips: &[String]) -> String {
    format!("[{}]", ips.join(", "))
}

/// The deletion of a pool `service` left.
fn deletion(service: &str, load_balancer: &str, pool: &str) -> PoolOperation {
    PoolOperation {
        service: service.to_owned(),
        load_balancer: load_balancer.to_owned(),
        pool: pool.to_owned(),
        kind: OperationKind::DeletePool,
        node_ips: Vec::new(),
    }
}

/// The note of one enqueued operation (`simulate`'s log, `run`'s debug lines).
fn enqueued(op: &PoolOperation) -> String {
    let (service, lb, pool) = (&op.service, &op.load_balancer, &op.pool);
    match op.kind {
        OperationKind::Add => format!("enqueue {service} add {lb}:{pool} {}", ip_list(&op.node_ips)),
        OperationKind::Remove => format!("enqueue {service} remove {lb}:{pool} {}", ip_list(&op.node_ips)),
        OperationKind::DeletePool => format!("enqueue {service} delete {lb}:{pool}"),
        OperationKind::EnsurePool => format!("enqueue {service} ensure {lb}:{pool}"),
    }
}

/// What the producer last enqueued for one local Service.
struct Produced {
    /// `namespace/name` as spelled.
    service: String,
    placement: ServicePlacement,
    /// Lower-cased pool name → the canonical node IPs of its family enqueued for it last.
    ips: BTreeMap<String, BTreeSet<String>>,
}

/// The producer's memory: per local Service, what it enqueued last.
#[derive(Default)]
pub struct PoolProducer {
    /// Lower-cased `namespace/name` → what was enqueued for it last.
    known: BTreeMap<String, Produced>,
    /// Lower-cased `namespace/name` → why it could not be placed, last time it was asked.
    refused: BTreeMap<String, String>,
    /// Lower-cased `namespace/name` of the Services whose left pools were looked for: once per
    /// Service, at its first placement. From then on the producer's own memory follows where
    /// it goes, and the listing of load balancers may lag behind the deletions it queued.
    swept: BTreeSet<String>,
}

impl PoolProducer {
    pub fn new() -> Self {
        Self::default()
    }

    /// The pools of `placement` whose addresses in Azure [`update`](Self::update) needs: those
    /// the Service is new to (it is new to the producer, moved to another load balancer, or
    /// serves a new family).
    pub fn pools_needing_contents<'p>(&self, service: &str, placement: &'p ServicePlacement) -> Vec<&'p str> {
        let before = self.known.get(&service.to_ascii_lowercase());
        let same_lb = |b: &&Produced| b.placement.load_balancer.eq_ignore_ascii_case(&placement.load_balancer);
        let known = before.filter(same_lb).map(|b| &b.ips);
        let new = |pool: &&FamilyPool| known.is_none_or(|ips| !ips.contains_key(&pool.name.to_ascii_lowercase()));
        placement.pools.iter().filter(new).map(|p| p.name.as_str()).collect()
    }

    /// Where `service` goes (upstream's placement, in the guest): the load balancer it was placed
    /// on last is the one it uses now; `namespace_labels` are its namespace's (`None`: not
    /// known), `azure` what Azure holds. With the answer, whether a refusal is new:
    /// not what was said of the Service last (one Warning Event per distinct reason, not one per
    /// change); what the producer enqueued for a refused Service stays as it was.
    ///
    /// The first time a Service is placed (or found not local), the pools the guest says it left
    /// are deleted: what it left while no producer ran (it moved, turned `Cluster`, or is being
    /// deleted), as upstream's reconcile deletes them. One line per deletion goes to `notes`.
    #[allow(clippy::too_many_arguments)] // each is one thing the caller has in hand
    pub fn place<A: AzureApi, L: ResourceLock, K: KubeApi>(
        &mut self,
        updater: &PoolUpdater<A, L, K>,
        configurations: &[SlbConfiguration],
        service: &wit::Service,
        namespace_labels: Option<Vec<(String, String)>>,
        azure: &AzureFacts,
        notes: &mut Vec<String>,
    ) -> Result<(Placement, bool), PoolUpdaterError> {
        let folded = format!("{}/{}", service.namespace, service.name).to_ascii_lowercase();
        let facts = PlacementFacts {
            namespace_labels,
            current_load_balancer: self.known.get(&folded).map(|p| p.placement.load_balancer.clone()),
            load_balancers: azure.load_balancers.clone(),
            public_ips: azure.public_ips.clone(),
            resource_group: azure.resource_group.clone(),
            cluster_name: azure.cluster_name.clone(),
        };
        let placed = updater.place(configurations, service, &facts)?;
        let left: &[LeftPool] = match &placed {
            Placement::NotLocal(left) => left,
            Placement::At(placement) => &placement.left,
            Placement::Refused(_) => &[],
        };
        if !matches!(placed, Placement::Refused(_)) && self.swept.insert(folded.clone()) && !left.is_empty() {
            let name = format!("{}/{}", service.namespace, service.name);
            let deletions: Vec<PoolOperation> =
                left.iter().map(|pool| deletion(&name, &pool.load_balancer, &pool.pool)).collect();
            updater.enqueue(&deletions)?;
            notes.push(format!("{name} left {} pool(s) named after it where it is not", deletions.len()));
            notes.extend(deletions.iter().map(enqueued));
        }
        Ok(match placed {
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
        self.swept.remove(&service.to_ascii_lowercase());
    }

    /// Forgets the Services not in `present` (lower-cased keys): they are gone.
    pub fn keep_present(&mut self, present: &BTreeSet<String>) {
        self.swept.retain(|key| present.contains(key));
    }

    /// The lower-cased keys of the Services the producer knows.
    pub fn known(&self) -> impl Iterator<Item = &str> {
        self.known.keys().map(String::as_str)
    }

    /// Records that `service` (`namespace/name`) is a local Service at `placement` whose ready
    /// endpoints are on the nodes with `ips` (both families), and enqueues the change of each of
    /// its pools against what was enqueued for it last; `pool_contents` (a pool's canonical IPs
    /// in Azure, `None` when Azure has no such pool) is called for the pools
    /// [`pools_needing_contents`](Self::pools_needing_contents) names. A pool Azure lacks is
    /// ensured, so it is made even before a node holds one of the Service's endpoints, as
    /// upstream's reconcile makes it. A pool the Service left (it moved, or serves a family no
    /// more) is deleted. One line per thing done goes to `notes`.
    #[allow(clippy::too_many_arguments)] // each is one thing the caller has in hand
    pub fn update<A: AzureApi, L: ResourceLock, K: KubeApi>(
        &mut self,
        updater: &PoolUpdater<A, L, K>,
        reconciling: &tokio::sync::MutexGuard<'_, ()>,
        service: &str,
        placement: ServicePlacement,
        ips: BTreeSet<String>,
        mut pool_contents: impl FnMut(&str) -> Option<BTreeSet<String>>,
        notes: &mut Vec<String>,
    ) -> Result<(), PoolUpdaterError> {
        let folded = service.to_ascii_lowercase();
        let mut operations = Vec::new();
        let mut before_ips = match self.known.get(&folded) {
            Some(before) if before.placement.load_balancer.eq_ignore_ascii_case(&placement.load_balancer) => {
                // The same load balancer: a family the Service serves no more loses its pool.
                let wanted: BTreeSet<String> = placement.pools.iter().map(|p| p.name.to_ascii_lowercase()).collect();
                for pool in before.placement.pools.iter().filter(|p| !wanted.contains(&p.name.to_ascii_lowercase())) {
                    operations.push(deletion(service, &before.placement.load_balancer, &pool.name));
                }
                before.ips.clone()
            }
            Some(before) => {
                let dropped = updater.remove_operations(service)?;
                notes.push(format!(
                    "{service} moved {} → {}: {dropped} queued operation(s) dropped",
                    pools_text(&before.placement),
                    pools_text(&placement)
                ));
                for pool in &before.placement.pools {
                    operations.push(deletion(service, &before.placement.load_balancer, &pool.name));
                }
                BTreeMap::new()
            }
            None => BTreeMap::new(),
        };
        updater.assign(reconciling, service, Some(&placement.load_balancer));
        let mut produced = BTreeMap::new();
        for pool in &placement.pools {
            let key = pool.name.to_ascii_lowercase();
            let operation = |kind, node_ips| PoolOperation {
                service: service.to_owned(),
                load_balancer: placement.load_balancer.clone(),
                pool: pool.name.clone(),
                kind,
                node_ips,
            };
            let baseline = match before_ips.remove(&key) {
                Some(enqueued) => enqueued,
                None => pool_contents(&pool.name).unwrap_or_else(|| {
                    operations.push(operation(OperationKind::EnsurePool, Vec::new()));
                    BTreeSet::new()
                }),
            };
            let wanted: BTreeSet<String> = ips.iter().filter(|ip| of_family(ip, pool)).cloned().collect();
            let gone: Vec<String> = baseline.difference(&wanted).cloned().collect();
            if !gone.is_empty() {
                operations.push(operation(OperationKind::Remove, gone));
            }
            if wanted != baseline && !wanted.is_empty() {
                operations.push(operation(OperationKind::Add, wanted.iter().cloned().collect()));
            }
            produced.insert(key, wanted);
        }
        if !operations.is_empty() {
            updater.enqueue(&operations)?;
            for op in &operations {
                notes.push(enqueued(op));
            }
        }
        self.known.insert(folded, Produced { service: service.to_owned(), placement, ips: produced });
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
        let deletions: Vec<PoolOperation> = before
            .placement
            .pools
            .iter()
            .map(|pool| deletion(&before.service, &before.placement.load_balancer, &pool.name))
            .collect();
        updater.enqueue(&deletions)?;
        notes.extend(deletions.iter().map(enqueued));
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
