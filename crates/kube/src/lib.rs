//! [`KubeClient`]: the [`KubeApi`] the executor writes to Kubernetes through, over a
//! [`kube::Client`].
//!
//! Every write is guarded by the object's UID (a Service's, or for the egress pod finalizer a
//! Pod's), race-free: the object is read, its UID compared
//! (absent → 404 `NotFound`, another UID → 409 [`UID_MISMATCH`]), and the change is sent as a
//! JSON merge patch that carries the `metadata.resourceVersion` just read, so that the API server
//! refuses it (409 `Conflict`) if the object changed — or was deleted and re-created — in between.
//! Such a conflict is retried at once from a fresh read, up to [`ATTEMPTS`] writes (as client-go's
//! `RetryOnConflict` with `retry.DefaultRetry`): another writer's change (its own finalizer, a label)
//! costs no backoff of the guest's and is kept, since the new patch is computed from what the read
//! found. A re-read that finds another UID (the object was replaced) or none is refused as above,
//! so a replacement never gets a write meant for the object it replaced. Every other failure, and a
//! conflict still there after the last attempt, is handed to the guest like any other failure.
//!
//! * the status: `status.loadBalancer.ingress` becomes exactly the given IPs (the `status`
//!   subresource);
//! * a finalizer of a Service or a Pod: added at the end of `metadata.finalizers` or removed, the
//!   rest of the list kept in order; a change that is already in place sends nothing;
//! * an Event: a core `v1` Event regarding the Service (reason, type, message as the guest gave
//!   them), reported by [`COMPONENT`].

pub mod lease;

use clb_executor::{KubeApi, KubeError};
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::error_text::error_chain;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::de::DeserializeOwned;
use serde_json::json;

/// The `source.component` and `reportingComponent` of the Events this host records.
pub const COMPONENT: &str = "clb-reconciler";

/// How many writes of one change are sent while the object keeps changing under them; client-go's
/// `retry.DefaultRetry.Steps`.
pub const ATTEMPTS: u32 = 5;

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

    /// Reads the object `what` names and sends the patch `patch` makes of it and its resourceVersion (to
    /// the `status` subresource with `status`); again from a fresh read while the API server answers
    /// that the object changed in between (409 `Conflict`), up to [`ATTEMPTS`] patches. `patch` gives
    /// `None` when the object already is as wanted.
    async fn patch_guarded<K>(
        &self,
        what: &wit::ObjectRef,
        change: &str,
        status: bool,
        patch: impl Fn(&K, &str) -> Option<serde_json::Value>,
    ) -> Result<(), KubeError>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let api = self.api::<K>(&what.namespace);
        let mut attempt = 1;
        loop {
            let (current, version) = self.guarded::<K>(what).await?;
            let Some(patch) = patch(&current, &version) else { return Ok(()) };
            let params = PatchParams::default();
            let sent = if status {
                api.patch_status(&what.name, &params, &Patch::Merge(&patch)).await
            } else {
                api.patch(&what.name, &params, &Patch::Merge(&patch)).await
            };
            match sent.map_err(api_error) {
                Ok(_) => return Ok(()),
                // A replacement fails the uid precondition with a plain Conflict too: the next read finds
                // the other UID and refuses.
                Err(error) if is_conflict(&error) && attempt < ATTEMPTS => {
                    tracing::info!(
                        kind = %what.kind, namespace = %what.namespace, name = %what.name, uid = %what.uid, change,
                        read_version = %version, attempt, %error,
                        "the object changed between its read and the write; reading it again"
                    );
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Adds or removes one finalizer of a `K`, guarded by its UID and resourceVersion.
    async fn patch_finalizer<K>(&self, what: &wit::ObjectRef, finalizer: &str, present: bool) -> Result<(), KubeError>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let change = if present { "add finalizer" } else { "remove finalizer" };
        self.patch_guarded::<K>(what, change, false, |current, version| {
            let mut finalizers = current.meta().finalizers.clone().unwrap_or_default();
            let had = finalizers.iter().any(|f| f == finalizer);
            match (had, present) {
                (true, true) | (false, false) => return None,
                (false, true) => finalizers.push(finalizer.to_owned()),
                (true, false) => finalizers.retain(|f| f != finalizer),
            }
            Some(json!({
                "metadata": { "uid": what.uid, "resourceVersion": version, "finalizers": finalizers },
            }))
        })
        .await
    }
}

/// The API server's answer to a write whose resourceVersion (or uid) precondition no longer holds.
fn is_conflict(error: &KubeError) -> bool {
    error.status == 409 && error.reason.as_deref() == Some("Conflict")
}

impl KubeApi for KubeClient {
    async fn patch_service_status(&self, service: &wit::ObjectRef, ingress_ips: &[String]) -> Result<(), KubeError> {
        let ingress: Vec<_> = ingress_ips.iter().map(|ip| json!({ "ip": ip })).collect();
        self.patch_guarded::<Service>(service, "status", true, |_, version| {
            Some(json!({
                "metadata": { "uid": service.uid, "resourceVersion": version },
                "status": { "loadBalancer": { "ingress": ingress } },
            }))
        })
        .await
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
