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
//! (`clb_host::live::pools`, which recomputes only the Services a change touched); both read the
//! cluster as the logic was told it ([`WatchedCluster`]). Both call it under
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
use std::sync::atomic::Ordering;

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

/// The tick of a term (counted from 1) after which its producer [rechecks](PoolProducer::recheck)
/// the pools it knows against Azure, once: its first tick wrote what its start-up found to do,
/// the second what came since, and a write its predecessor had in flight has had two intervals
/// to land. Right after a tick the queue holds only what failed and waits for a retry, so a
/// difference found is, but for those, a write this term did not make.
pub const RECHECK_AT_TICK: u64 = 2;

/// `(namespace, name)` of a Service or an EndpointSlice.
pub type ObjectKey = (String, String);

/// What the producer reads of the cluster: the Services, EndpointSlices and Nodes' InternalIPs
/// as the watches delivered them to the logic — the same batches, so a stale list or a lost
/// event misleads the producer exactly as it misleads the logic, and the next event or re-list
/// mends both — and which Services a batch touched since the producer last ran.
#[derive(Default)]
pub struct WatchedCluster {
    services: BTreeMap<ObjectKey, wit::Service>,
    /// Lower-cased UID → Service, to find the owner of a slice.
    by_uid: BTreeMap<String, ObjectKey>,
    slices: BTreeMap<ObjectKey, wit::EndpointSlice>,
    /// Node name → its InternalIPs, both families, canonical.
    nodes: BTreeMap<String, Vec<String>>,
    /// The IPs of [`nodes`](Self::nodes) changed since they were last taken.
    nodes_changed: bool,
    /// Services to recompute.
    changed: BTreeSet<ObjectKey>,
    /// Whether the initial lists are complete.
    listed: bool,
}

impl WatchedCluster {
    fn mark_owner(&mut self, slice: Option<&wit::EndpointSlice>) {
        let owner = slice.and_then(|s| s.owner_service_uid.as_ref()).map(|uid| uid.to_ascii_lowercase());
        if let Some(key) = owner.and_then(|uid| self.by_uid.get(&uid)) {
            self.changed.insert(key.clone());
        }
    }

    /// Marks the owners of the slices with an endpoint on `node`.
    fn mark_on_node(&mut self, node: &str) {
        let owners: Vec<ObjectKey> = self
            .slices
            .values()
            .filter(|s| s.endpoints.iter().any(|e| e.node_name.as_deref() == Some(node)))
            .filter_map(|s| s.owner_service_uid.as_ref())
            .filter_map(|uid| self.by_uid.get(&uid.to_ascii_lowercase()).cloned())
            .collect();
        self.changed.extend(owners);
    }

    /// Takes in one observation the logic is given, marking the Services it touches: the
    /// Service itself, the owner of a changed slice, the owners of slices with endpoints on a
    /// Node whose IPs changed; all of them once the initial lists are complete.
    pub fn apply(&mut self, observation: &wit::Observation) {
        match observation {
            wit::Observation::ServiceUpserted(service) => {
                let key = (service.namespace.clone(), service.name.clone());
                if let Some(before) = self.services.insert(key.clone(), service.clone()) {
                    self.by_uid.remove(&before.uid.to_ascii_lowercase());
                }
                self.by_uid.insert(service.uid.to_ascii_lowercase(), key.clone());
                self.changed.insert(key);
            }
            wit::Observation::ServiceDeleted(key) => {
                if let Some(before) = self.services.remove(key) {
                    self.by_uid.remove(&before.uid.to_ascii_lowercase());
                }
                self.changed.insert(key.clone());
            }
            wit::Observation::SliceUpserted(slice) => {
                let before = self.slices.insert((slice.namespace.clone(), slice.name.clone()), slice.clone());
                self.mark_owner(before.as_ref());
                self.mark_owner(Some(slice));
            }
            wit::Observation::SliceDeleted(key) => {
                let before = self.slices.remove(key);
                self.mark_owner(before.as_ref());
            }
            wit::Observation::NodeUpserted(node) => {
                let ips = node_ips(node);
                // Nodes change at every status heartbeat; only their IPs matter here.
                if self.nodes.get(&node.name) != Some(&ips) {
                    self.nodes.insert(node.name.clone(), ips);
                    self.nodes_changed = true;
                    self.mark_on_node(&node.name);
                }
            }
            wit::Observation::NodeDeleted(name) => {
                if self.nodes.remove(name).is_some() {
                    self.nodes_changed = true;
                    self.mark_on_node(name);
                }
            }
            // Egress pods do not place Services.
            wit::Observation::PodUpserted(_) | wit::Observation::PodDeleted(_) => {}
            wit::Observation::ListsComplete => {
                self.listed = true;
                self.changed.extend(self.services.keys().cloned());
            }
        }
    }

    /// Whether the initial lists are complete: nothing is to be produced before (a pool must
    /// not lose the IPs of Nodes not listed yet).
    pub fn listed(&self) -> bool {
        self.listed
    }

    /// The Services touched since this was last called.
    pub fn take_changed(&mut self) -> BTreeSet<ObjectKey> {
        std::mem::take(&mut self.changed)
    }

    /// Marks a Service to be recomputed next time (what placing it needed could not be read).
    pub fn mark(&mut self, key: ObjectKey) {
        self.changed.insert(key);
    }

    /// Whether a batch touched any Service since [`take_changed`](Self::take_changed).
    pub fn any_changed(&self) -> bool {
        !self.changed.is_empty()
    }

    /// The Nodes' IPs, if they changed since this was last called (the updater names pool
    /// addresses after them).
    pub fn nodes_if_changed(&mut self) -> Option<&BTreeMap<String, Vec<String>>> {
        std::mem::take(&mut self.nodes_changed).then_some(&self.nodes)
    }

    /// The keys of the Services known, in order.
    pub fn services(&self) -> impl Iterator<Item = &ObjectKey> {
        self.services.keys()
    }

    /// The Service's record, if it exists, and the node IPs of its ready endpoints.
    pub fn service(&self, key: &ObjectKey) -> Option<(wit::Service, BTreeSet<String>)> {
        let service = self.services.get(key)?;
        let in_namespace = self
            .slices
            .range((key.0.clone(), String::new())..)
            .take_while(|((namespace, _), _)| *namespace == key.0)
            .map(|(_, slice)| slice);
        Some((service.clone(), ready_node_ips(&service.uid, in_namespace, &self.nodes)))
    }
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

    /// The pools of every Service it knows, as `(load balancer, pool)`: what
    /// [`recheck`](Self::recheck) reads.
    pub fn pools_known(&self) -> BTreeSet<(String, String)> {
        let pools = self.known.values().flat_map(|p| p.placement.pools.iter().map(move |pool| (p, pool)));
        pools.map(|(p, pool)| (p.placement.load_balancer.clone(), pool.name.clone())).collect()
    }

    /// Compares every pool of every Service it knows (but those whose writes the queue
    /// abandoned) with what it enqueued for it last, and
    /// enqueues what makes Azure's match again: an add of the whole list (a pool gone is ensured
    /// first), a remove of what should not be there. `pool_contents(load balancer, pool)` is the
    /// pool's canonical IPs in Azure (`None`: no such pool). A new term does it once, after its
    /// [`RECHECK_AT_TICK`]-th tick: a write its predecessor had in flight when it lost its lease
    /// may land after this term wrote the same pool — a creation carries no `If-Match`, and a
    /// DELETE none either — and nothing else would notice until the Service changes again.
    /// Called right after that tick.
    /// Returns the number of pools found different; one line each goes to `notes`.
    pub fn recheck<A: AzureApi, L: ResourceLock, K: KubeApi>(
        &self,
        updater: &PoolUpdater<A, L, K>,
        _reconciling: &tokio::sync::MutexGuard<'_, ()>,
        mut pool_contents: impl FnMut(&str, &str) -> Option<BTreeSet<String>>,
        notes: &mut Vec<String>,
    ) -> Result<usize, PoolUpdaterError> {
        let mut operations = Vec::new();
        let mut different = 0;
        // A Service whose writes were abandoned stays as it is until it changes, as at run time.
        for produced in self.known.values().filter(|p| !updater.abandoned(&p.service)) {
            let load_balancer = &produced.placement.load_balancer;
            for pool in &produced.placement.pools {
                let operation = |kind, node_ips| PoolOperation {
                    service: produced.service.clone(),
                    load_balancer: load_balancer.clone(),
                    pool: pool.name.clone(),
                    kind,
                    node_ips,
                };
                let wanted = produced.ips.get(&pool.name.to_ascii_lowercase()).cloned().unwrap_or_default();
                let held = pool_contents(load_balancer, &pool.name);
                if held.as_ref() == Some(&wanted) {
                    updater.stats().recheck_same.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                updater.stats().recheck_different.fetch_add(1, Ordering::Relaxed);
                different += 1;
                let held_text = held.as_ref().map_or("nothing (no such pool)".to_owned(), |ips| {
                    ip_list(&ips.iter().cloned().collect::<Vec<_>>())
                });
                notes.push(format!(
                    "{} {load_balancer}:{} holds {held_text} in Azure, not {} as enqueued",
                    produced.service,
                    pool.name,
                    ip_list(&wanted.iter().cloned().collect::<Vec<_>>())
                ));
                let held = held.unwrap_or_else(|| {
                    operations.push(operation(OperationKind::EnsurePool, Vec::new()));
                    BTreeSet::new()
                });
                let extra: Vec<String> = held.difference(&wanted).cloned().collect();
                if !extra.is_empty() {
                    operations.push(operation(OperationKind::Remove, extra));
                }
                if !wanted.is_empty() && !wanted.is_subset(&held) {
                    operations.push(operation(OperationKind::Add, wanted.iter().cloned().collect()));
                }
            }
        }
        if !operations.is_empty() {
            updater.enqueue(&operations)?;
            notes.extend(operations.iter().map(enqueued));
        }
        Ok(different)
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
    use serde_json::json;

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

    fn service(name: &str) -> wit::Observation {
        let service = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": name, "uid": format!("uid-{name}")},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local"},
        }))
        .unwrap();
        wit::Observation::ServiceUpserted(crate::records::service(&service))
    }

    fn slice(service: &str, node: &str) -> wit::Observation {
        let slice = serde_json::from_value(json!({
            "metadata": {
                "namespace": "ns", "name": format!("{service}-1"),
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service, "uid": format!("UID-{service}")}],
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.0.1"], "nodeName": node}],
        }))
        .unwrap();
        wit::Observation::SliceUpserted(crate::records::endpoint_slice(&slice))
    }

    fn node(name: &str, ip: &str) -> wit::Observation {
        wit::Observation::NodeUpserted(wit::Node { name: name.into(), internal_ips: vec![ip.into()] })
    }

    fn key(name: &str) -> ObjectKey {
        ("ns".into(), name.into())
    }

    /// A store with Services a (endpoint on n1) and b (endpoint on n2), listed, nothing marked.
    fn listed() -> WatchedCluster {
        let mut store = WatchedCluster::default();
        let initial = [
            service("a"),
            service("b"),
            slice("a", "n1"),
            slice("b", "n2"),
            node("n1", "10.0.0.1"),
            node("n2", "10.0.0.2"),
            wit::Observation::ListsComplete,
        ];
        for observation in &initial {
            store.apply(observation);
        }
        assert_eq!(store.changed, BTreeSet::from([key("a"), key("b")]), "the initial lists mark every Service");
        store.changed.clear();
        store
    }

    fn marked_by(observation: wit::Observation) -> BTreeSet<ObjectKey> {
        let mut store = listed();
        store.apply(&observation);
        store.changed
    }

    #[test]
    fn a_change_marks_only_the_services_it_touches() {
        assert_eq!(
            marked_by(slice("a", "n2")),
            BTreeSet::from([key("a")]),
            "a slice marks its owner (UIDs in any case)"
        );
        assert_eq!(marked_by(wit::Observation::SliceDeleted(("ns".into(), "b-1".into()))), BTreeSet::from([key("b")]));
        assert_eq!(
            marked_by(node("n2", "10.0.0.9")),
            BTreeSet::from([key("b")]),
            "new node IPs mark the Services on it"
        );
        assert_eq!(marked_by(wit::Observation::NodeDeleted("n1".into())), BTreeSet::from([key("a")]));
        assert_eq!(marked_by(service("a")), BTreeSet::from([key("a")]));
        assert_eq!(marked_by(wit::Observation::ServiceDeleted(key("b"))), BTreeSet::from([key("b")]));
    }

    // Upstream TestEndpointSlicesInformer: its "skip non-local services" and "skip an endpoint slice that don't
    // belong to a service" cases, a slice whose owner is not a known Service or that has no owner touches no pool.
    #[test]
    fn a_slice_of_an_unknown_service_or_of_none_marks_nothing() {
        assert!(marked_by(slice("unknown", "n1")).is_empty());
        let orphan = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "orphan-1"},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.0.1"], "nodeName": "n1"}],
        }))
        .unwrap();
        let orphan = crate::records::endpoint_slice(&orphan);
        assert_eq!(orphan.owner_service_uid, None);
        assert!(marked_by(wit::Observation::SliceUpserted(orphan)).is_empty());
    }

    #[test]
    fn a_node_heartbeat_with_the_same_ips_marks_nothing() {
        assert!(marked_by(node("n1", "10.0.0.1")).is_empty());
    }

    #[test]
    fn a_services_node_ips_are_those_of_its_ready_endpoints_in_its_namespace() {
        let mut store = listed();
        store.apply(&slice("a", "n2"));
        let (record, ips) = store.service(&key("a")).expect("a is known");
        assert_eq!(record.name, "a");
        assert_eq!(ips, BTreeSet::from(["10.0.0.2".to_owned()]));
        assert!(store.service(&key("gone")).is_none());
    }
}
