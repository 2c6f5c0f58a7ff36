//! [`KubeClient`]: the [`KubeApi`] the executor writes to Kubernetes through, over a
//! [`kube::Client`].
//!
//! Every write is guarded by the object's UID (a Service's, or for the egress pod finalizer a
//! Pod's), race-free: the object is read, its UID compared
//! (absent → 404 `NotFound`, another UID → 409 [`UID_MISMATCH`]), and the change is sent as a
//! JSON merge patch that carries the `metadata.resourceVersion` just read, so that the API server
//! refuses it (409 `Conflict`) if the object changed — or was deleted and re-created — in between.
//! The host retries nothing: a conflict is handed to the guest like any other failure.
//!
//! * the status: `status.loadBalancer.ingress` becomes exactly the given IPs (the `status`
//!   subresource);
//! * a finalizer of a Service or a Pod: added at the end of `metadata.finalizers` or removed, the
//!   rest of the list kept in order; a change that is already in place sends nothing;
//! * an Event: a core `v1` Event regarding the Service (reason, type, message as the guest gave
//!   them), reported by [`COMPONENT`].

use crate::executor::{KubeApi, KubeError};
use crate::sandbox::bindings::clb::reconciler::types as wit;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::de::DeserializeOwned;
use serde_json::json;

/// The `source.component` and `reportingComponent` of the Events this host records.
pub const COMPONENT: &str = "clb-reconciler";

/// The Kubernetes writes of `clb-host run`.
#[derive(Clone)]
pub struct KubeClient {
    client: kube::Client,
    /// `reportingInstance` of Events: which replica wrote them.
    instance: String,
}

impl KubeClient {
    pub fn new(client: kube::Client, instance: impl Into<String>) -> Self {
        Self { client, instance: instance.into() }
    }

    /// The client it writes through.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    fn api<K>(&self, namespace: &str) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// The object if it is the one `what` names; its resourceVersion, for the patch.
    async fn guarded<K>(&self, what: &wit::ObjectRef) -> Result<(K, String), KubeError>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let object = self
            .api::<K>(&what.namespace)
            .get_opt(&what.name)
            .await
            .map_err(api_error)?
            .ok_or_else(|| KubeError::not_found(what))?;
        let uid = object.meta().uid.clone().unwrap_or_default();
        if uid != what.uid {
            return Err(KubeError::uid_mismatch(what, &uid));
        }
        let version = object.meta().resource_version.clone().unwrap_or_default();
        Ok((object, version))
    }

    /// Adds or removes one finalizer of a `K`, guarded by its UID and resourceVersion.
    async fn patch_finalizer<K>(&self, what: &wit::ObjectRef, finalizer: &str, present: bool) -> Result<(), KubeError>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let (current, version) = self.guarded::<K>(what).await?;
        let mut finalizers = current.meta().finalizers.clone().unwrap_or_default();
        let had = finalizers.iter().any(|f| f == finalizer);
        match (had, present) {
            (true, true) | (false, false) => return Ok(()),
            (false, true) => finalizers.push(finalizer.to_owned()),
            (true, false) => finalizers.retain(|f| f != finalizer),
        }
        let patch = json!({
            "metadata": { "uid": what.uid, "resourceVersion": version, "finalizers": finalizers },
        });
        self.api::<K>(&what.namespace)
            .patch(&what.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api_error)?;
        Ok(())
    }
}

impl KubeApi for KubeClient {
    async fn patch_service_status(&self, service: &wit::ObjectRef, ingress_ips: &[String]) -> Result<(), KubeError> {
        let (_, version) = self.guarded::<Service>(service).await?;
        let ingress: Vec<_> = ingress_ips.iter().map(|ip| json!({ "ip": ip })).collect();
        let patch = json!({
            "metadata": { "uid": service.uid, "resourceVersion": version },
            "status": { "loadBalancer": { "ingress": ingress } },
        });
        self.api::<Service>(&service.namespace)
            .patch_status(&service.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api_error)?;
        Ok(())
    }

    async fn set_finalizer(&self, object: &wit::ObjectRef, finalizer: &str, present: bool) -> Result<(), KubeError> {
        match object.kind.as_str() {
            "Pod" => self.patch_finalizer::<Pod>(object, finalizer, present).await,
            _ => self.patch_finalizer::<Service>(object, finalizer, present).await,
        }
    }

    async fn emit_event(&self, event: &wit::Event) -> Result<(), KubeError> {
        let regarding = &event.regarding;
        let now = k8s_openapi::jiff::Timestamp::now();
        let event_type = match event.event_type {
            wit::EventType::Normal => "Normal",
            wit::EventType::Warning => "Warning",
        };
        let record = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", regarding.name)),
                namespace: Some(regarding.namespace.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some(regarding.kind.clone()),
                namespace: Some(regarding.namespace.clone()),
                name: Some(regarding.name.clone()),
                uid: Some(regarding.uid.clone()).filter(|uid| !uid.is_empty()),
                ..Default::default()
            },
            reason: Some(event.reason.clone()),
            message: Some(event.message.clone()),
            type_: Some(event_type.into()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            action: Some(event.reason.clone()),
            source: Some(EventSource { component: Some(COMPONENT.into()), host: None }),
            reporting_component: Some(COMPONENT.into()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        Api::<Event>::namespaced(self.client.clone(), &regarding.namespace)
            .create(&PostParams::default(), &record)
            .await
            .map_err(api_error)?;
        Ok(())
    }
}

/// A client error as the executor reports it: the API server's status, reason and message, or
/// status 0 when no answer arrived.
pub fn api_error(error: kube::Error) -> KubeError {
    match error {
        kube::Error::Api(status) => KubeError {
            status: status.code,
            reason: Some(status.reason.clone()).filter(|r| !r.is_empty()),
            message: status.message.clone(),
        },
        other => KubeError { status: 0, reason: None, message: error_chain(&other) },
    }
}

/// `namespace/name` split in two: both parts non-empty, the name without a `/`. The form every
/// flag and file of this host uses to name a namespaced object.
pub fn namespaced(text: &str) -> Option<(&str, &str)> {
    text.split_once('/').filter(|(namespace, name)| !namespace.is_empty() && !name.is_empty() && !name.contains('/'))
}

/// An error and its sources on one line.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
