//! The records the logic reads, as the host copied them from Kubernetes.
//!
//! They mirror the WIT records one to one; enumerations stay the strings the user wrote so that
//! the logic, not the host, decides what an unknown value means.

use serde::{Deserialize, Serialize};

/// A Service's `spec.ports[].targetPort`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TargetPort {
    Number(i32),
    Name(String),
}

/// One entry of `spec.ports`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicePort {
    pub name: Option<String>,
    pub protocol: Option<String>,
    pub port: i32,
    pub target_port: Option<TargetPort>,
    pub node_port: Option<i32>,
}

impl ServicePort {
    /// The protocol with the API server's default applied.
    pub fn protocol(&self) -> &str {
        self.protocol.as_deref().unwrap_or("TCP")
    }

    /// The backend port: `targetPort` when numeric, else `port` when absent. `None` for a named
    /// target port, which only the kubelet can resolve.
    pub fn backend_port(&self) -> Option<i32> {
        match &self.target_port {
            None => Some(self.port),
            Some(TargetPort::Number(n)) => Some(*n),
            Some(TargetPort::Name(_)) => None,
        }
    }
}

/// A Kubernetes Service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Service {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub service_type: Option<String>,
    pub external_traffic_policy: Option<String>,
    pub session_affinity: Option<String>,
    pub load_balancer_ip: Option<String>,
    pub load_balancer_class: Option<String>,
    pub ip_families: Vec<String>,
    pub ports: Vec<ServicePort>,
    pub annotations: Vec<(String, String)>,
    pub finalizers: Vec<String>,
    pub deleting: bool,
    pub ingress_ips: Vec<String>,
}

impl Service {
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// The identity NRP knows the Service by: its UID, lower-cased.
    pub fn identity(&self) -> String {
        self.uid.to_ascii_lowercase()
    }

    pub fn key(&self) -> ObjectKey {
        ObjectKey::new(&self.namespace, &self.name)
    }
}

/// One endpoint of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub addresses: Vec<String>,
    pub node_name: Option<String>,
    pub ready: Option<bool>,
}

/// A discovery.k8s.io/v1 EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointSlice {
    pub namespace: String,
    pub name: String,
    pub owner_service_uid: Option<String>,
    pub address_type: String,
    pub endpoints: Vec<Endpoint>,
    pub deleting: bool,
}

impl EndpointSlice {
    pub fn key(&self) -> ObjectKey {
        ObjectKey::new(&self.namespace, &self.name)
    }
}

/// A Kubernetes Node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    pub internal_ips: Vec<String>,
}

/// Namespace and name of a namespaced object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: &str, name: &str) -> Self {
        Self { namespace: namespace.to_owned(), name: name.to_owned() }
    }
}

/// A namespaced object an Event is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// Something that happened in Kubernetes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observation {
    ServiceUpserted(Service),
    ServiceDeleted(ObjectKey),
    SliceUpserted(EndpointSlice),
    SliceDeleted(ObjectKey),
    NodeUpserted(Node),
    NodeDeleted(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    Normal,
    Warning,
}

/// A Kubernetes Event to record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub regarding: ObjectRef,
    pub event_type: EventType,
    pub reason: String,
    pub message: String,
}

/// Something the logic wants done.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    EmitEvent(Event),
}

/// A command with the id its outcome refers to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    pub id: u64,
    pub command: Command,
}

/// Why a command failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub status: u16,
    pub code: Option<String>,
    pub retry_after_ms: Option<u64>,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok(Option<Vec<u8>>),
    Failed(Failure),
}

/// What one call asks of the host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    pub commands: Vec<Issued>,
    pub wake_at_ms: Option<u64>,
}
