//! An in-memory Kubernetes API server for `simulate`: Services, EndpointSlices, Nodes and Pods
//! as k8s-openapi objects, and the watch events their changes produce, turned into WIT
//! observations by [`records`] exactly as the real watchers will.
//!
//! It behaves like the API server where the guest can tell: a Service or a Pod with finalizers is not
//! removed by a delete but gets a `deletionTimestamp`, and goes away when its last finalizer is
//! released; `status` and finalizers survive an apply (they are written by controllers, not by
//! the manifest); writes from the guest are guarded by UID ([`KubeApi`]). Every apply is
//! delivered as a watch event even when nothing changed, as an informer's resync delivers an
//! unchanged object again: that is how scenarios replay duplicate events. Pods are watched as
//! `clb-host run` watches them, through a label selector on the egress label's key: a pod
//! without the label is not seen, and one that loses it is seen deleted.

use clb_executor::records;
use clb_executor::{KubeApi, KubeError};
use clb_sandbox::bindings::clb::reconciler::types as wit;
use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Namespace, Node, Pod, Service, ServiceStatus,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// An object a scenario applies.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
    Node(Box<Node>),
    Pod(Box<Pod>),
    /// Read only by multi-SLB placement (a `serviceNamespaceSelector`); never watched by the
    /// guest, so applying one delivers no watch event.
    Namespace(Box<Namespace>),
}

/// The kinds of objects the cluster holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Kind {
    Service,
    EndpointSlice,
    Node,
    Pod,
    Namespace,
}

impl Kind {
    /// The kind as Kubernetes names it (and `clb_sandbox::supervisor::observed_object`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Node => "Node",
            Kind::Pod => "Pod",
            Kind::Namespace => "Namespace",
        }
    }
}

/// Why a change to the cluster was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    #[error("{kind:?} {key} already exists with UID {existing}; delete it before applying UID {applied}")]
    UidTaken { kind: Kind, key: String, existing: String, applied: String },
    #[error(
        "{kind:?} {key} (UID {existing}) is terminating, held by its finalizers: `settle` until it is gone, or delete \
         it with `force: true`, before applying UID {applied}"
    )]
    Terminating { kind: Kind, key: String, existing: String, applied: String },
    #[error("{kind:?} {key} does not exist")]
    NotFound { kind: Kind, key: String },
    #[error("{kind:?} {key} has UID {uid}, which {kind:?} {holder} has; no two objects share a UID")]
    UidInUse { kind: Kind, key: String, uid: String, holder: String },
}

/// An Event the guest had recorded.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RecordedEvent {
    pub reason: String,
    /// `namespace/name` of the object it is about.
    pub object: String,
    /// `Normal` or `Warning`.
    pub event_type: String,
    pub message: String,
}

#[derive(Default)]
struct Inner {
    services: BTreeMap<(String, String), Service>,
    slices: BTreeMap<(String, String), EndpointSlice>,
    nodes: BTreeMap<String, Node>,
    pods: BTreeMap<(String, String), Pod>,
    /// Name → labels.
    namespaces: BTreeMap<String, Vec<(String, String)>>,
    /// Watch events not yet delivered.
    watch: Vec<wit::Observation>,
    events: Vec<RecordedEvent>,
}

/// The fake API server. Shared by reference between the simulator and the executor.
#[derive(Default)]
pub struct Cluster {
    inner: Mutex<Inner>,
}

fn namespace_of(meta: &ObjectMeta) -> String {
    meta.namespace.clone().unwrap_or_else(|| "default".into())
}

/// Controllers own finalizers: an apply whose manifest lacks them does not clear them.
fn kept_finalizers(existing: &ObjectMeta, applied: &mut ObjectMeta) {
    let mut finalizers = existing.finalizers.clone().unwrap_or_default();
    for f in applied.finalizers.take().unwrap_or_default() {
        if !finalizers.contains(&f) {
            finalizers.push(f);
        }
    }
    applied.finalizers = Some(finalizers).filter(|f| !f.is_empty());
}

fn key_text((namespace, name): &(String, String)) -> String {
    format!("{namespace}/{name}")
}

impl Cluster {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates or updates an object, as `kubectl apply` does.
    pub fn apply(&self, object: Object) -> Result<(), ClusterError> {
        let mut inner = self.lock();
        match object {
            Object::Service(service) => {
                let mut service = *service;
                let key = (namespace_of(&service.metadata), service.metadata.name.clone().unwrap_or_default());
                if let Some(existing) = inner.services.get(&key) {
                    let (old_uid, new_uid) = (&existing.metadata.uid, &service.metadata.uid);
                    if old_uid != new_uid {
                        return Err(ClusterError::UidTaken {
                            kind: Kind::Service,
                            key: key_text(&key),
                            existing: old_uid.clone().unwrap_or_default(),
                            applied: new_uid.clone().unwrap_or_default(),
                        });
                    }
                    kept_finalizers(&existing.metadata, &mut service.metadata);
                    service.metadata.deletion_timestamp = existing.metadata.deletion_timestamp.clone();
                    service.status = existing.status.clone();
                } else if let Some(uid) = service.metadata.uid.as_deref().filter(|uid| !uid.is_empty())
                    && let Some((holder, _)) = inner
                        .services
                        .iter()
                        .find(|(_, other)| other.metadata.uid.as_deref().is_some_and(|o| o.eq_ignore_ascii_case(uid)))
                {
                    // A second Service with the same UID is refused (it was once accepted).
                    return Err(ClusterError::UidInUse {
                        kind: Kind::Service,
                        key: key_text(&key),
                        uid: uid.to_owned(),
                        holder: key_text(holder),
                    });
                }
                inner.watch.push(wit::Observation::ServiceUpserted(records::service(&service)));
                inner.services.insert(key, service);
            }
            Object::EndpointSlice(slice) => {
                let key = (namespace_of(&slice.metadata), slice.metadata.name.clone().unwrap_or_default());
                inner.watch.push(wit::Observation::SliceUpserted(records::endpoint_slice(&slice)));
                inner.slices.insert(key, *slice);
            }
            Object::Node(node) => {
                inner.watch.push(wit::Observation::NodeUpserted(records::node(&node)));
                inner.nodes.insert(node.metadata.name.clone().unwrap_or_default(), *node);
            }
            Object::Pod(pod) => {
                let mut pod = pod;
                let key = (namespace_of(&pod.metadata), pod.metadata.name.clone().unwrap_or_default());
                if pod.metadata.uid.as_deref().is_none_or(str::is_empty) {
                    // The API server names every object; a manifest need not.
                    pod.metadata.uid = Some(format!("sim-pod-{}-{}", key.0, key.1));
                }
                if let Some(existing) = inner.pods.get(&key) {
                    if existing.metadata.deletion_timestamp.is_some() && existing.metadata.uid != pod.metadata.uid {
                        // The name is taken until the deleting pod's finalizers are released.
                        return Err(ClusterError::Terminating {
                            kind: Kind::Pod,
                            key: key_text(&key),
                            existing: existing.metadata.uid.clone().unwrap_or_default(),
                            applied: pod.metadata.uid.clone().unwrap_or_default(),
                        });
                    }
                    if existing.metadata.uid == pod.metadata.uid {
                        kept_finalizers(&existing.metadata, &mut pod.metadata);
                        pod.metadata.deletion_timestamp = existing.metadata.deletion_timestamp.clone();
                    }
                }
                let had_label = inner.pods.get(&key).is_some_and(records::has_egress_label);
                if records::has_egress_label(&pod) {
                    inner.watch.push(wit::Observation::PodUpserted(records::pod(&pod)));
                } else if had_label {
                    // It no longer matches the watch's label selector: the watch says deleted.
                    inner.watch.push(wit::Observation::PodDeleted(key.clone()));
                }
                inner.pods.insert(key, *pod);
            }
            Object::Namespace(namespace) => {
                let labels = namespace.metadata.labels.clone().unwrap_or_default().into_iter().collect();
                inner.namespaces.insert(namespace.metadata.name.clone().unwrap_or_default(), labels);
            }
        }
        Ok(())
    }

    /// The labels of a Namespace, or `None` when it was not applied.
    pub fn namespace_labels(&self, name: &str) -> Option<Vec<(String, String)>> {
        self.lock().namespaces.get(name).cloned()
    }

    /// Deletes an object. A Service with finalizers only gets a `deletionTimestamp`, unless
    /// `force` (the finalizers are stripped first, as an operator may do by hand).
    pub fn delete(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
        force: bool,
        now_ms: u64,
    ) -> Result<(), ClusterError> {
        let mut inner = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        let not_found = || ClusterError::NotFound { kind, key: key_text(&key) };
        match kind {
            Kind::Service => {
                let service = inner.services.get_mut(&key).ok_or_else(not_found)?;
                if held_by_finalizers(&mut service.metadata, force, now_ms) {
                    let observed = records::service(service);
                    inner.watch.push(wit::Observation::ServiceUpserted(observed));
                } else {
                    inner.services.remove(&key);
                    inner.watch.push(wit::Observation::ServiceDeleted(key));
                }
            }
            Kind::EndpointSlice => {
                inner.slices.remove(&key).ok_or_else(not_found)?;
                inner.watch.push(wit::Observation::SliceDeleted(key));
            }
            Kind::Node => {
                inner.nodes.remove(name).ok_or_else(|| ClusterError::NotFound { kind, key: name.to_owned() })?;
                inner.watch.push(wit::Observation::NodeDeleted(name.to_owned()));
            }
            Kind::Namespace => {
                inner.namespaces.remove(name).ok_or_else(|| ClusterError::NotFound { kind, key: name.to_owned() })?;
            }
            Kind::Pod => {
                let pod = inner.pods.get_mut(&key).ok_or_else(not_found)?;
                if held_by_finalizers(&mut pod.metadata, force, now_ms) {
                    if records::has_egress_label(pod) {
                        let observed = records::pod(pod);
                        inner.watch.push(wit::Observation::PodUpserted(observed));
                    }
                } else {
                    let pod = inner.pods.remove(&key).expect("read above");
                    if records::has_egress_label(&pod) {
                        inner.watch.push(wit::Observation::PodDeleted(key));
                    }
                }
            }
        }
        Ok(())
    }

    /// The watch events since the last call, in order.
    pub fn take_watch_events(&self) -> Vec<wit::Observation> {
        std::mem::take(&mut self.lock().watch)
    }

    /// Forgets undelivered watch events: a restarting controller lists instead.
    pub fn drop_watch_events(&self) {
        self.lock().watch.clear();
    }

    /// What a fresh list of Services, EndpointSlices, Nodes and egress Pods delivers (the pods
    /// the label selects, and those that hold the egress finalizer without it), then
    /// `lists-complete`.
    pub fn list(&self) -> Vec<wit::Observation> {
        let inner = self.lock();
        let mut observations: Vec<wit::Observation> =
            inner.nodes.values().map(|n| wit::Observation::NodeUpserted(records::node(n))).collect();
        observations.extend(inner.services.values().map(|s| wit::Observation::ServiceUpserted(records::service(s))));
        observations.extend(inner.slices.values().map(|s| wit::Observation::SliceUpserted(records::endpoint_slice(s))));
        let labelled = inner
            .pods
            .values()
            .filter(|p| records::has_egress_label(p) || records::holds_finalizer_unlabelled(&p.metadata));
        observations.extend(labelled.map(|p| wit::Observation::PodUpserted(records::pod(p))));
        observations.push(wit::Observation::ListsComplete);
        observations
    }

    pub fn service(&self, namespace: &str, name: &str) -> Option<Service> {
        self.lock().services.get(&(namespace.to_owned(), name.to_owned())).cloned()
    }

    pub fn services(&self) -> Vec<Service> {
        self.lock().services.values().cloned().collect()
    }

    pub fn slices(&self) -> Vec<EndpointSlice> {
        self.lock().slices.values().cloned().collect()
    }

    pub fn nodes(&self) -> Vec<Node> {
        self.lock().nodes.values().cloned().collect()
    }

    pub fn pods(&self) -> Vec<Pod> {
        self.lock().pods.values().cloned().collect()
    }

    /// Every Event recorded so far, in order.
    pub fn events(&self) -> Vec<RecordedEvent> {
        self.lock().events.clone()
    }

    /// The Service a guest write is about, checked by UID.
    fn guarded<'a>(
        inner: &'a mut Inner,
        target: &wit::ObjectRef,
    ) -> Result<(&'a mut Service, (String, String)), KubeError> {
        let key = (target.namespace.clone(), target.name.clone());
        let service = inner.services.get_mut(&key).ok_or_else(|| KubeError::not_found(target))?;
        let uid = service.metadata.uid.clone().unwrap_or_default();
        if !uid.eq_ignore_ascii_case(&target.uid) {
            return Err(KubeError::uid_mismatch(target, &uid));
        }
        Ok((service, key))
    }
}

impl Cluster {
    /// A pod's finalizer, guarded by its UID as a Service's is; a pod being deleted goes once its
    /// last finalizer is released.
    fn set_pod_finalizer(&self, target: &wit::ObjectRef, finalizer: &str, present: bool) -> Result<(), KubeError> {
        let mut inner = self.lock();
        let key = (target.namespace.clone(), target.name.clone());
        let pod = inner.pods.get_mut(&key).ok_or_else(|| KubeError::not_found(target))?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if !uid.eq_ignore_ascii_case(&target.uid) {
            return Err(KubeError::uid_mismatch(target, &uid));
        }
        let watched = records::has_egress_label(pod);
        match write_finalizer(&mut pod.metadata, "Pod", &key, finalizer, present)? {
            FinalizerWrite::Unchanged => {}
            FinalizerWrite::Gone => {
                inner.pods.remove(&key);
                if watched {
                    inner.watch.push(wit::Observation::PodDeleted(key));
                }
            }
            FinalizerWrite::Changed if watched => {
                let observed = records::pod(pod);
                inner.watch.push(wit::Observation::PodUpserted(observed));
            }
            FinalizerWrite::Changed => {}
        }
        Ok(())
    }
}

/// What a finalizer write did to an object.
enum FinalizerWrite {
    Unchanged,
    Changed,
    /// It was being deleted and its last finalizer went: the API server removes it.
    Gone,
}

/// A finalizer added or removed as the API server does it: a change already in place changes
/// nothing, and an object being deleted takes no new finalizer (422).
fn write_finalizer(
    meta: &mut ObjectMeta,
    kind: &str,
    key: &(String, String),
    finalizer: &str,
    present: bool,
) -> Result<FinalizerWrite, KubeError> {
    let mut finalizers = meta.finalizers.clone().unwrap_or_default();
    if finalizers.iter().any(|f| f == finalizer) == present {
        return Ok(FinalizerWrite::Unchanged);
    }
    if present {
        if meta.deletion_timestamp.is_some() {
            return Err(KubeError {
                status: 422,
                reason: Some("Invalid".into()),
                message: format!("{kind} {}: no new finalizers can be added while it is being deleted", key_text(key)),
            });
        }
        finalizers.push(finalizer.to_owned());
    } else {
        finalizers.retain(|f| f != finalizer);
    }
    if finalizers.is_empty() && meta.deletion_timestamp.is_some() {
        return Ok(FinalizerWrite::Gone);
    }
    meta.finalizers = Some(finalizers).filter(|f| !f.is_empty());
    Ok(FinalizerWrite::Changed)
}

/// A delete as the API server takes it: an object with finalizers (none left when `force`
/// strips them first) only gets a `deletionTimestamp` and is held; returns whether it is.
fn held_by_finalizers(meta: &mut ObjectMeta, force: bool, now_ms: u64) -> bool {
    if force {
        meta.finalizers = None;
    }
    let held = meta.finalizers.as_ref().is_some_and(|f| !f.is_empty());
    if held && meta.deletion_timestamp.is_none() {
        meta.deletion_timestamp = Some(time_at(now_ms));
    }
    held
}

fn time_at(now_ms: u64) -> Time {
    let millis = i64::try_from(now_ms).unwrap_or(i64::MAX);
    Time(k8s_openapi::jiff::Timestamp::from_millisecond(millis).unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
}

impl KubeApi for Cluster {
    async fn patch_service_status(&self, target: &wit::ObjectRef, ingress_ips: &[String]) -> Result<(), KubeError> {
        let mut inner = self.lock();
        let (service, _) = Self::guarded(&mut inner, target)?;
        let ingress: Vec<LoadBalancerIngress> =
            ingress_ips.iter().map(|ip| LoadBalancerIngress { ip: Some(ip.clone()), ..Default::default() }).collect();
        let status = service.status.get_or_insert_with(ServiceStatus::default);
        let new = Some(LoadBalancerStatus { ingress: Some(ingress).filter(|i| !i.is_empty()) });
        // A patch that changes nothing produces no watch event.
        if status.load_balancer != new {
            status.load_balancer = new;
            let observed = records::service(service);
            inner.watch.push(wit::Observation::ServiceUpserted(observed));
        }
        Ok(())
    }

    async fn set_finalizer(&self, target: &wit::ObjectRef, finalizer: &str, present: bool) -> Result<(), KubeError> {
        if target.kind == "Pod" {
            return self.set_pod_finalizer(target, finalizer, present);
        }
        let mut inner = self.lock();
        let (service, key) = Self::guarded(&mut inner, target)?;
        match write_finalizer(&mut service.metadata, "Service", &key, finalizer, present)? {
            FinalizerWrite::Unchanged => {}
            FinalizerWrite::Gone => {
                inner.services.remove(&key);
                inner.watch.push(wit::Observation::ServiceDeleted(key));
            }
            FinalizerWrite::Changed => {
                let observed = records::service(service);
                inner.watch.push(wit::Observation::ServiceUpserted(observed));
            }
        }
        Ok(())
    }

    async fn emit_event(&self, event: &wit::Event) -> Result<(), KubeError> {
        let recorded = RecordedEvent {
            reason: event.reason.clone(),
            object: format!("{}/{}", event.regarding.namespace, event.regarding.name),
            event_type: match event.event_type {
                wit::EventType::Normal => "Normal".into(),
                wit::EventType::Warning => "Warning".into(),
            },
            message: event.message.clone(),
        };
        self.lock().events.push(recorded);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(label: Option<&str>) -> Object {
        let labels = label.map(|value| serde_json::json!({(records::EGRESS_LABEL): value}));
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "shop", "uid": "u-1", "labels": labels},
            "status": {"phase": "Running", "podIPs": [{"ip": "10.244.0.5"}], "hostIPs": [{"ip": "10.224.0.4"}]},
        }))
        .unwrap();
        Object::Pod(Box::new(pod))
    }

    fn kinds(observations: &[wit::Observation]) -> Vec<String> {
        observations
            .iter()
            .map(|o| match o {
                wit::Observation::PodUpserted(p) => format!("upserted {:?}", p.egress_label),
                wit::Observation::PodDeleted((ns, name)) => format!("deleted {ns}/{name}"),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn pods_are_seen_through_the_egress_label_so_one_without_it_is_not_seen_and_one_that_loses_it_is_seen_deleted() {
        let cluster = Cluster::new();
        cluster.apply(pod(None)).unwrap();
        assert!(cluster.take_watch_events().is_empty(), "no label: not selected");
        cluster.apply(pod(Some("egress-a"))).unwrap();
        assert_eq!(kinds(&cluster.take_watch_events()), ["upserted Some(\"egress-a\")"]);
        assert_eq!(kinds(&cluster.list()[..1]), ["upserted Some(\"egress-a\")"], "listed with the label");
        cluster.apply(pod(None)).unwrap();
        assert_eq!(kinds(&cluster.take_watch_events()), ["deleted shop/p"]);
        assert_eq!(kinds(&cluster.list()), ["Observation::ListsComplete"], "not listed without it");
        cluster.apply(pod(Some("egress-a"))).unwrap();
        cluster.delete(Kind::Pod, "shop", "p", false, 0).unwrap();
        assert_eq!(kinds(&cluster.take_watch_events()), ["upserted Some(\"egress-a\")", "deleted shop/p"]);
    }

    #[test]
    fn a_pod_holding_a_finalizer_is_terminating_until_it_is_released_and_its_name_is_taken_until_then() {
        let cluster = Cluster::new();
        cluster.apply(pod(Some("egress-a"))).unwrap();
        let target =
            wit::ObjectRef { kind: "Pod".into(), namespace: "shop".into(), name: "p".into(), uid: "u-1".into() };
        let finalizer = "servicegateway.azure.com/pod-cleanup";
        let stale = wit::ObjectRef { uid: "another".into(), ..target.clone() };
        let refused = cluster.set_pod_finalizer(&stale, finalizer, true).unwrap_err();
        assert_eq!((refused.status, refused.reason.as_deref()), (409, Some(clb_executor::UID_MISMATCH)));
        cluster.set_pod_finalizer(&target, finalizer, true).unwrap();
        cluster.delete(Kind::Pod, "shop", "p", false, 5).unwrap();
        let held = cluster.pods().pop().expect("held by its finalizer");
        assert!(held.metadata.deletion_timestamp.is_some());
        let Object::Pod(mut replacement) = pod(Some("egress-a")) else { unreachable!() };
        replacement.metadata.uid = Some("new".into());
        let refused = cluster.apply(Object::Pod(replacement.clone())).unwrap_err();
        assert!(matches!(refused, ClusterError::Terminating { .. }), "{refused}");
        assert_eq!(cluster.set_pod_finalizer(&target, "example.com/other", true).unwrap_err().status, 422);
        cluster.take_watch_events();
        cluster.set_pod_finalizer(&target, finalizer, false).unwrap();
        assert!(cluster.pods().is_empty());
        assert_eq!(kinds(&cluster.take_watch_events()), ["deleted shop/p"]);
        cluster.apply(Object::Pod(replacement)).unwrap();
    }

    // Regression: two Services with one UID were accepted.
    #[test]
    fn a_service_with_the_uid_of_another_service_is_refused_and_changes_nothing() {
        let service = |name: &str, uid: &str| {
            let service: Service = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "shop", "uid": uid},
                "spec": {"type": "LoadBalancer"},
            }))
            .unwrap();
            Object::Service(Box::new(service))
        };
        let cluster = Cluster::new();
        cluster.apply(service("web", "6a1f0c8e-0000-4000-8000-000000000001")).unwrap();
        cluster.take_watch_events();
        let err = cluster.apply(service("api", "6A1F0C8E-0000-4000-8000-000000000001")).unwrap_err();
        assert!(
            matches!(&err, ClusterError::UidInUse { key, holder, .. } if key == "shop/api" && holder == "shop/web"),
            "{err}"
        );
        assert!(cluster.take_watch_events().is_empty(), "nothing delivered");
        cluster.apply(service("web", "6a1f0c8e-0000-4000-8000-000000000001")).expect("the same object again");
    }
}
