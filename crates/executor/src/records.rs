//! Kubernetes objects → the guest's WIT records: a mechanical field copy, no policy.
//!
//! Enumerations are copied as the strings the user wrote; defaults the API server applies are
//! left absent, so the guest sees exactly what the object says.

use clb_sandbox::bindings::clb::reconciler::types as wit;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub fn service(svc: &Service) -> wit::Service {
    let meta = &svc.metadata;
    let spec = svc.spec.clone().unwrap_or_default();
    let mut annotations: Vec<(String, String)> = meta.annotations.clone().unwrap_or_default().into_iter().collect();
    annotations.sort();
    let labels: Vec<(String, String)> = meta.labels.clone().unwrap_or_default().into_iter().collect();
    wit::Service {
        uid: meta.uid.clone().unwrap_or_default(),
        namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
        name: meta.name.clone().unwrap_or_default(),
        service_type: spec.type_,
        external_traffic_policy: spec.external_traffic_policy,
        session_affinity: spec.session_affinity,
        load_balancer_ip: spec.load_balancer_ip,
        load_balancer_class: spec.load_balancer_class,
        ip_families: spec.ip_families.unwrap_or_default(),
        ports: spec
            .ports
            .unwrap_or_default()
            .into_iter()
            .map(|p| wit::ServicePort {
                name: p.name,
                protocol: p.protocol,
                port: p.port,
                target_port: p.target_port.map(|t| match t {
                    IntOrString::Int(n) => wit::TargetPort::Number(n),
                    IntOrString::String(s) => wit::TargetPort::Name(s),
                }),
                node_port: p.node_port,
            })
            .collect(),
        annotations,
        finalizers: meta.finalizers.clone().unwrap_or_default(),
        deleting: meta.deletion_timestamp.is_some(),
        ingress_ips: svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .map(|ingress| ingress.iter().filter_map(|i| i.ip.clone()).collect())
            .unwrap_or_default(),
        labels,
    }
}

pub fn endpoint_slice(slice: &EndpointSlice) -> wit::EndpointSlice {
    let meta = &slice.metadata;
    wit::EndpointSlice {
        namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
        name: meta.name.clone().unwrap_or_default(),
        owner_service_uid: meta
            .owner_references
            .as_ref()
            .and_then(|refs| refs.iter().find(|r| r.kind == "Service"))
            .map(|r| r.uid.clone()),
        address_type: slice.address_type.clone(),
        endpoints: slice
            .endpoints
            .iter()
            .map(|e| wit::Endpoint {
                addresses: e.addresses.clone(),
                node_name: e.node_name.clone(),
                ready: e.conditions.as_ref().and_then(|c| c.ready),
            })
            .collect(),
        deleting: meta.deletion_timestamp.is_some(),
    }
}

/// The pod label that names a pod's egress gateway. The host watches only pods that carry it
/// (a label selector on the key) and copies its value; what the value means is the guest's call.
pub const EGRESS_LABEL: &str = "kubernetes.azure.com/service-egress-gateway";

/// The finalizer the logic holds egress pods with (its `set-finalizer` commands name it). A pod
/// whose egress label came off while no controller ran keeps it, and the label's watch never
/// selects that pod again: at start-up the host also lists the pods that hold it without the
/// label, so that the logic hears of them and releases it.
pub const EGRESS_POD_FINALIZER: &str = "servicegateway.azure.com/pod-cleanup";

/// Whether a pod holds [`EGRESS_POD_FINALIZER`] without the egress label: what start-up lists
/// beside the label's selection.
pub fn holds_finalizer_unlabelled(meta: &ObjectMeta) -> bool {
    !labelled(meta) && meta.finalizers.as_ref().is_some_and(|f| f.iter().any(|f| f == EGRESS_POD_FINALIZER))
}

/// Whether a pod carries the egress label (any value): what the watch's label selector selects.
pub fn has_egress_label(pod: &Pod) -> bool {
    labelled(&pod.metadata)
}

fn labelled(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().is_some_and(|labels| labels.contains_key(EGRESS_LABEL))
}

pub fn pod(pod: &Pod) -> wit::Pod {
    let meta = &pod.metadata;
    let status = pod.status.clone().unwrap_or_default();
    wit::Pod {
        namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        egress_label: meta.labels.as_ref().and_then(|labels| labels.get(EGRESS_LABEL)).cloned(),
        phase: status.phase,
        pod_ips: status.pod_ips.unwrap_or_default().into_iter().map(|ip| ip.ip).collect(),
        pod_ip: status.pod_ip,
        host_ips: status.host_ips.unwrap_or_default().into_iter().map(|ip| ip.ip).collect(),
        host_ip: status.host_ip,
        deleting: meta.deletion_timestamp.is_some(),
        finalizers: meta.finalizers.clone().unwrap_or_default(),
    }
}

pub fn node(node: &Node) -> wit::Node {
    wit::Node {
        name: node.metadata.name.clone().unwrap_or_default(),
        internal_ips: node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .map(|addrs| addrs.iter().filter(|a| a.type_ == "InternalIP").map(|a| a.address.clone()).collect())
            .unwrap_or_default(),
    }
}

/// `namespace/name` split in two: both parts non-empty, the name without a `/`. The form every
/// flag and file of this host uses to name a namespaced object.
pub fn namespaced(text: &str) -> Option<(&str, &str)> {
    text.split_once('/').filter(|(namespace, name)| !namespace.is_empty() && !name.is_empty() && !name.contains('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Ports upstream TestNodePrivateIPAddresses_SelectsOnlyInternalIPs: of a Node's addresses
    // only its InternalIPs become its locations, in the order the kubelet reported them.
    #[test]
    fn only_a_nodes_internal_ips_are_copied_in_their_order() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "aks-nodepool1-12345678-vmss000000"},
            "status": {"addresses": [
                {"type": "Hostname", "address": "aks-nodepool1-12345678-vmss000000"},
                {"type": "ExternalIP", "address": "20.1.2.3"},
                {"type": "InternalIP", "address": "10.224.0.4"},
                {"type": "InternalDNS", "address": "aks-nodepool1.internal"},
                {"type": "InternalIP", "address": "fd00::4"}
            ]}
        }))
        .unwrap();
        let record = super::node(&node);
        assert_eq!(record.name, "aks-nodepool1-12345678-vmss000000");
        assert_eq!(record.internal_ips, ["10.224.0.4", "fd00::4"]);
        let bare: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}})).unwrap();
        assert!(super::node(&bare).internal_ips.is_empty());
    }
}
