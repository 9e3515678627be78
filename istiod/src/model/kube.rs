//! The Kubernetes objects the service registry is built from, with the fields
//! istiod uses. Unlike Istio's CRDs, unknown fields are accepted and ignored:
//! real manifests carry much that the mesh does not read (containers, probes,
//! status conditions), and the API server, not istiod, validates them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The label an EndpointSlice names its Service with.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The Service annotation that restricts its visibility (Istio's `exportTo`).
pub const EXPORT_TO_ANNOTATION: &str = "networking.istio.io/exportTo";
/// The Pod label that says its endpoints speak Istio mTLS (set by injection).
pub const TLS_MODE_LABEL: &str = "security.istio.io/tlsMode";

/// A Kubernetes Service (its `spec`; the metadata is in [`super::ObjectMeta`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Service {
    /// The spec.
    pub spec: ServiceSpec,
}

/// `Service.spec`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceSpec {
    /// The ports.
    pub ports: Vec<ServicePort>,
    /// Pods (and WorkloadEntries) backing the service.
    pub selector: BTreeMap<String, String>,
    /// The virtual IP; `None` for a headless service.
    #[serde(rename = "clusterIP", skip_serializing_if = "Option::is_none")]
    pub cluster_ip: Option<String>,
    /// The service type.
    #[serde(rename = "type")]
    pub service_type: ServiceType,
    /// The DNS name of an `ExternalName` service.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_name: Option<String>,
}

/// `Service.spec.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
pub enum ServiceType {
    /// A virtual IP inside the cluster (the default).
    #[default]
    ClusterIP,
    /// Also a port on every node.
    NodePort,
    /// Also an external load balancer.
    LoadBalancer,
    /// A DNS alias (`externalName`).
    ExternalName,
}

/// A port of a Service.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServicePort {
    /// The port name; its prefix gives the protocol (`http-web` is HTTP).
    pub name: String,
    /// The service port.
    pub port: u32,
    /// The port on the Pods, a number or a container port name (defaults to `port`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_port: Option<IntOrString>,
    /// `TCP` (default), `UDP` or `SCTP`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// The application protocol; wins over the name prefix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
}

/// Kubernetes' int-or-string (`targetPort`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum IntOrString {
    /// A port number.
    Int(u32),
    /// A container port name.
    String(String),
}

/// A Kubernetes `discovery.k8s.io/v1` EndpointSlice (its top-level fields).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EndpointSlice {
    /// The address family.
    pub address_type: AddressType,
    /// The endpoints.
    pub endpoints: Vec<Endpoint>,
    /// The ports every endpoint serves.
    pub ports: Vec<EndpointPort>,
}

/// `EndpointSlice.addressType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
pub enum AddressType {
    /// IPv4 addresses.
    #[default]
    IPv4,
    /// IPv6 addresses.
    IPv6,
    /// Host names.
    #[serde(rename = "FQDN")]
    Fqdn,
}

/// One endpoint of a slice.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Endpoint {
    /// Its addresses (consumers use the first).
    pub addresses: Vec<String>,
    /// Readiness.
    pub conditions: EndpointConditions,
    /// The object behind the endpoint (usually a Pod).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<ObjectReference>,
    /// The node it runs on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The zone it runs in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Its host name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// `EndpointSlice.endpoints[].conditions`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EndpointConditions {
    /// Ready; unset means ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// Serving.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serving: Option<bool>,
    /// Terminating.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terminating: Option<bool>,
}

/// A reference to another object.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectReference {
    /// Its kind (`Pod`).
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// A port of an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EndpointPort {
    /// The Service port name it belongs to (empty for an unnamed port).
    pub name: String,
    /// The port on the endpoints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// `TCP`, `UDP` or `SCTP`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// The application protocol.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
}

/// A Kubernetes Pod: the parts of `spec` and `status` istiod uses.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Pod {
    /// The spec.
    pub spec: PodSpec,
    /// The status.
    pub status: PodStatus,
}

/// `Pod.spec`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodSpec {
    /// The service account (its SPIFFE identity); `default` when empty.
    pub service_account_name: String,
    /// The node it runs on.
    pub node_name: String,
    /// Containers, for their named ports.
    pub containers: Vec<Container>,
}

/// A container, for its ports.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Container {
    /// The container name.
    pub name: String,
    /// Its ports.
    pub ports: Vec<ContainerPort>,
}

/// A container port.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerPort {
    /// The name a Service's `targetPort` may use.
    pub name: String,
    /// The port.
    pub container_port: u32,
    /// `TCP`, `UDP` or `SCTP`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

/// `Pod.status`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodStatus {
    /// The Pod's IP.
    #[serde(rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    /// All its IPs (dual stack).
    #[serde(rename = "podIPs")]
    pub pod_ips: Vec<PodIp>,
    /// `Pending`, `Running`, `Succeeded`, `Failed` or `Unknown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

/// One of `Pod.status.podIPs`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodIp {
    /// The IP.
    pub ip: String,
}

/// A Kubernetes Namespace; what istiod uses (labels) is in the metadata.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
pub struct Namespace {}

impl Pod {
    /// The service account, `default` when the spec names none (as Kubernetes does).
    pub fn service_account(&self) -> &str {
        if self.spec.service_account_name.is_empty() {
            "default"
        } else {
            &self.spec.service_account_name
        }
    }

    /// Whether the Pod is running or may run (not `Succeeded` or `Failed`);
    /// Istio ignores finished Pods.
    pub fn is_active(&self) -> bool {
        !matches!(self.status.phase.as_deref(), Some("Succeeded" | "Failed"))
    }
}
