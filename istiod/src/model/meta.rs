//! What every object has, whatever its kind: the kinds istiod understands
//! (Istio's CRDs and the Kubernetes objects the service registry is built
//! from), Kubernetes-style metadata, and the typed object itself.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::config_map::ConfigMap;
use super::envoy_filter::EnvoyFilter;
use super::gateway::Gateway;
use super::gateway_api::backend_tls_policy::BackendTlsPolicy;
use super::gateway_api::grpc_types::GrpcRoute;
use super::gateway_api::listener_set::ListenerSet;
use super::gateway_api::reference_grant::ReferenceGrant;
use super::gateway_api::tls_types::{TcpRoute, TlsRoute};
use super::gateway_api::{GatewayClass, HttpRoute, KubernetesGateway};
use super::ingress::spec::{Ingress, IngressClass};
use super::istio::{
    DestinationRule, PeerAuthentication, ServiceEntry, Sidecar, VirtualService, WorkloadEntry,
    WorkloadGroup,
};
use super::kube::{EndpointSlice, Namespace, Node, Pod, Service};
use super::proxy_config::spec::ProxyConfig;
use super::secret::Secret;
use super::security::{AuthorizationPolicy, RequestAuthentication};
use super::telemetry::Telemetry;

/// Istio's networking API group.
pub const NETWORKING_GROUP: &str = "networking.istio.io";
/// Istio's security API group.
pub const SECURITY_GROUP: &str = "security.istio.io";
/// Istio's telemetry API group.
pub const TELEMETRY_GROUP: &str = "telemetry.istio.io";
/// The Kubernetes Gateway API group.
pub const GATEWAY_API_GROUP: &str = super::gateway_api::GROUP;
/// The Kubernetes discovery API group (EndpointSlice).
pub const DISCOVERY_GROUP: &str = "discovery.k8s.io";
/// The Kubernetes networking API group (Ingress, IngressClass).
pub const K8S_NETWORKING_GROUP: &str = "networking.k8s.io";
/// The namespace an object of a namespaced kind gets when its metadata names none
/// (Istio's file source treats it the same way).
pub const DEFAULT_NAMESPACE: &str = "default";

/// The kinds istiod reads. Any other kind in a config directory is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Kind {
    /// `networking.istio.io` ServiceEntry: services outside the Kubernetes registry.
    ServiceEntry,
    /// `networking.istio.io` WorkloadEntry: a non-Kubernetes workload (VM).
    WorkloadEntry,
    /// `networking.istio.io` WorkloadGroup: the template VMs register
    /// WorkloadEntries from (auto-registration).
    WorkloadGroup,
    /// `networking.istio.io` VirtualService: routing rules.
    VirtualService,
    /// `networking.istio.io` DestinationRule: policies applied after routing.
    DestinationRule,
    /// `networking.istio.io` Sidecar: scope and listeners of a sidecar.
    Sidecar,
    /// `networking.istio.io` Gateway: what a gateway (`router`) listens for.
    Gateway,
    /// `networking.istio.io/v1alpha3` EnvoyFilter: patches to the generated Envoy config.
    EnvoyFilter,
    /// `security.istio.io` PeerAuthentication: inbound mTLS mode.
    PeerAuthentication,
    /// `security.istio.io` AuthorizationPolicy: access control.
    AuthorizationPolicy,
    /// `security.istio.io` RequestAuthentication: end-user JWTs.
    RequestAuthentication,
    /// Kubernetes `v1` Service.
    Service,
    /// Kubernetes `discovery.k8s.io/v1` EndpointSlice.
    EndpointSlice,
    /// Kubernetes `v1` Pod.
    Pod,
    /// Kubernetes `v1` Namespace (cluster-scoped).
    Namespace,
    /// Kubernetes `v1` Node (cluster-scoped): the locality of its Pods.
    Node,
    /// Gateway API `GatewayClass` (cluster-scoped).
    GatewayClass,
    /// Gateway API `Gateway` (Istio's `KubernetesGateway`, apart from its own Gateway).
    KubernetesGateway,
    /// Gateway API `HTTPRoute`.
    HttpRoute,
    /// Kubernetes `v1` Secret: gateway credentials (`credentialName`).
    Secret,
    /// `telemetry.istio.io` Telemetry: access logging, tracing, metrics.
    Telemetry,
    /// `networking.istio.io/v1beta1` ProxyConfig: per-namespace and
    /// per-workload proxy settings, applied at injection.
    ProxyConfig,
    /// Kubernetes `networking.k8s.io/v1` Ingress: translated to a Gateway
    /// and VirtualServices when it is of Istio's class.
    Ingress,
    /// Kubernetes `networking.k8s.io/v1` IngressClass (cluster-scoped).
    IngressClass,
    /// Gateway API `ReferenceGrant`: cross-namespace references allowed.
    ReferenceGrant,
    /// Gateway API `TCPRoute`.
    TcpRoute,
    /// Gateway API `TLSRoute`.
    TlsRoute,
    /// Gateway API `GRPCRoute`.
    GrpcRoute,
    /// Gateway API `BackendTLSPolicy`: TLS to a Service or ServiceEntry.
    BackendTlsPolicy,
    /// Kubernetes `v1` ConfigMap: CA certificates named by the Gateway API.
    ConfigMap,
    /// Gateway API `ListenerSet`: listeners added to a Gateway that allows them.
    ListenerSet,
}

impl Kind {
    /// Every kind, in a stable order.
    pub const ALL: [Kind; 31] = [
        Kind::ServiceEntry,
        Kind::WorkloadEntry,
        Kind::WorkloadGroup,
        Kind::VirtualService,
        Kind::DestinationRule,
        Kind::Sidecar,
        Kind::Gateway,
        Kind::EnvoyFilter,
        Kind::PeerAuthentication,
        Kind::AuthorizationPolicy,
        Kind::RequestAuthentication,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Pod,
        Kind::Namespace,
        Kind::Node,
        Kind::GatewayClass,
        Kind::KubernetesGateway,
        Kind::HttpRoute,
        Kind::Secret,
        Kind::Telemetry,
        Kind::ProxyConfig,
        Kind::Ingress,
        Kind::IngressClass,
        Kind::ReferenceGrant,
        Kind::TcpRoute,
        Kind::TlsRoute,
        Kind::GrpcRoute,
        Kind::BackendTlsPolicy,
        Kind::ConfigMap,
        Kind::ListenerSet,
    ];

    /// The kind's name as written in `kind:`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::ServiceEntry => "ServiceEntry",
            Kind::WorkloadEntry => "WorkloadEntry",
            Kind::WorkloadGroup => "WorkloadGroup",
            Kind::VirtualService => "VirtualService",
            Kind::DestinationRule => "DestinationRule",
            Kind::Sidecar => "Sidecar",
            Kind::Gateway => "Gateway",
            Kind::EnvoyFilter => "EnvoyFilter",
            Kind::PeerAuthentication => "PeerAuthentication",
            Kind::AuthorizationPolicy => "AuthorizationPolicy",
            Kind::RequestAuthentication => "RequestAuthentication",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Pod => "Pod",
            Kind::Namespace => "Namespace",
            Kind::Node => "Node",
            Kind::GatewayClass => "GatewayClass",
            Kind::KubernetesGateway => "Gateway",
            Kind::HttpRoute => "HTTPRoute",
            Kind::Secret => "Secret",
            Kind::Telemetry => "Telemetry",
            Kind::ProxyConfig => "ProxyConfig",
            Kind::Ingress => "Ingress",
            Kind::IngressClass => "IngressClass",
            Kind::ReferenceGrant => "ReferenceGrant",
            Kind::TcpRoute => "TCPRoute",
            Kind::TlsRoute => "TLSRoute",
            Kind::GrpcRoute => "GRPCRoute",
            Kind::BackendTlsPolicy => "BackendTLSPolicy",
            Kind::ConfigMap => "ConfigMap",
            Kind::ListenerSet => "ListenerSet",
        }
    }

    /// The API group (`""` for the Kubernetes core group).
    pub fn group(self) -> &'static str {
        match self {
            Kind::ServiceEntry
            | Kind::WorkloadEntry
            | Kind::WorkloadGroup
            | Kind::VirtualService
            | Kind::DestinationRule
            | Kind::Sidecar
            | Kind::Gateway
            | Kind::EnvoyFilter
            | Kind::ProxyConfig => NETWORKING_GROUP,
            Kind::PeerAuthentication | Kind::AuthorizationPolicy | Kind::RequestAuthentication => {
                SECURITY_GROUP
            }
            Kind::Telemetry => TELEMETRY_GROUP,
            Kind::EndpointSlice => DISCOVERY_GROUP,
            Kind::Ingress | Kind::IngressClass => K8S_NETWORKING_GROUP,
            Kind::GatewayClass
            | Kind::KubernetesGateway
            | Kind::HttpRoute
            | Kind::ReferenceGrant
            | Kind::TcpRoute
            | Kind::TlsRoute
            | Kind::GrpcRoute
            | Kind::BackendTlsPolicy
            | Kind::ListenerSet => GATEWAY_API_GROUP,
            Kind::Service
            | Kind::Pod
            | Kind::Namespace
            | Kind::Node
            | Kind::Secret
            | Kind::ConfigMap => "",
        }
    }

    /// The versions of the group accepted for this kind, preferred first.
    pub fn versions(self) -> &'static [&'static str] {
        if self == Kind::EnvoyFilter {
            // Istio serves EnvoyFilter at v1alpha3 only.
            return &["v1alpha3"];
        }
        match self {
            // The experimental channel's versions, as its CRDs serve them.
            Kind::TcpRoute => return &["v1", "v1alpha2"],
            Kind::TlsRoute => return &["v1", "v1alpha3", "v1alpha2"],
            // The CRD serves GRPCRoute at v1 only.
            Kind::GrpcRoute => return &["v1"],
            // v1 (standard channel), v1alpha3 (experimental, same fields).
            Kind::BackendTlsPolicy => return &["v1", "v1alpha3"],
            // The standard channel's ListenerSet (Gateway API v1.5).
            Kind::ListenerSet => return &["v1"],
            _ => {}
        }
        if self == Kind::ProxyConfig {
            // Istio serves ProxyConfig at v1beta1 only.
            return &["v1beta1"];
        }
        match self.group() {
            NETWORKING_GROUP => &["v1", "v1beta1", "v1alpha3"],
            SECURITY_GROUP | GATEWAY_API_GROUP => &["v1", "v1beta1"],
            TELEMETRY_GROUP => &["v1", "v1alpha1"],
            _ => &["v1"],
        }
    }

    /// The preferred `apiVersion`, e.g. `networking.istio.io/v1`.
    pub fn api_version(self) -> String {
        match self.group() {
            "" => self.versions()[0].to_string(),
            group => format!("{group}/{}", self.versions()[0]),
        }
    }

    /// Whether objects of this kind live in a namespace.
    pub fn is_namespaced(self) -> bool {
        !matches!(
            self,
            Kind::Namespace | Kind::Node | Kind::GatewayClass | Kind::IngressClass
        )
    }

    /// Whether this is a Gateway API kind.
    pub fn is_gateway_api(self) -> bool {
        self.group() == GATEWAY_API_GROUP
    }

    /// Whether objects of this kind are a `spec` (and a `status` istiod
    /// does not read): Istio's CRDs and the Gateway API's.
    pub fn has_spec_body(self) -> bool {
        self.is_istio() || self.is_gateway_api()
    }

    /// Whether the kind is served by a CustomResourceDefinition that may
    /// not be installed (Istio's and the Gateway API's).
    pub fn is_custom_resource(self) -> bool {
        self.has_spec_body()
    }

    /// Whether this is one of Istio's CRDs (whose `spec` is validated strictly).
    pub fn is_istio(self) -> bool {
        matches!(
            self.group(),
            NETWORKING_GROUP | SECURITY_GROUP | TELEMETRY_GROUP
        )
    }

    /// Looks a document's `apiVersion` and `kind` up.
    ///
    /// `Ok(None)` means a kind istiod does not read (it is ignored).
    /// `Err` means one of our kinds in its own group but at a version that is
    /// not served; the message lists the versions that are.
    pub fn resolve(api_version: &str, kind: &str) -> Result<Option<Kind>, VersionNotServed> {
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let Some(found) = Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == kind && k.group() == group)
        else {
            return Ok(None);
        };
        if found.versions().contains(&version) {
            Ok(Some(found))
        } else {
            let served: Vec<String> = found
                .versions()
                .iter()
                .map(|v| match group {
                    "" => v.to_string(),
                    g => format!("{g}/{v}"),
                })
                .collect();
            Err(VersionNotServed {
                kind: found,
                api_version: api_version.to_string(),
                served,
            })
        }
    }
}

/// One of istiod's kinds at an `apiVersion` it does not serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("apiVersion {api_version} is not served for {kind} (use {})", served.join(", "))]
pub struct VersionNotServed {
    /// The kind.
    pub kind: Kind,
    /// The `apiVersion` as written.
    pub api_version: String,
    /// The `apiVersion`s that are served for it.
    pub served: Vec<String>,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identifies one object: kind, namespace (empty for cluster-scoped kinds) and name.
/// Displayed as Istio's config keys are, `Kind/namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ObjectKey {
    /// The kind.
    pub kind: Kind,
    /// The namespace; empty for cluster-scoped kinds (`Namespace`, `Node`).
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl ObjectKey {
    /// Builds a key.
    pub fn new(kind: Kind, namespace: &str, name: &str) -> Self {
        Self {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.name.is_empty() {
            "<unnamed>"
        } else {
            &self.name
        };
        if self.kind.is_namespaced() {
            write!(f, "{}/{}/{}", self.kind, self.namespace, name)
        } else {
            write!(f, "{}/{}", self.kind, name)
        }
    }
}

/// The part of Kubernetes' `metadata` istiod uses; other fields (`uid`,
/// `managedFields`, ...) are accepted and ignored.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectMeta {
    /// The object's name (required).
    pub name: String,
    /// The namespace; `default` when a namespaced object names none.
    pub namespace: String,
    /// Labels (subset selection, workload selectors, `security.istio.io/tlsMode`).
    pub labels: BTreeMap<String, String>,
    /// Annotations (`networking.istio.io/exportTo` on Services).
    pub annotations: BTreeMap<String, String>,
    /// The resource version, when the object came from an API server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// The generation, when the object came from an API server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// When the API server created it (RFC 3339); where policies conflict,
    /// Istio lets the oldest win.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<String>,
    /// The API server's id of the object (an owner reference names it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The objects this one belongs to (an auto-registered WorkloadEntry's
    /// WorkloadGroup).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub owner_references: Vec<OwnerReference>,
}

/// One of `metadata.ownerReferences`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OwnerReference {
    /// The owner's `apiVersion`.
    pub api_version: String,
    /// The owner's kind.
    pub kind: String,
    /// The owner's name.
    pub name: String,
    /// The owner's uid.
    pub uid: String,
    /// Whether the owner is the managing controller.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller: Option<bool>,
}

/// The typed body of an object, one variant per [`Kind`].
// Objects live behind an `Arc` in the store, one allocation each; boxing the
// larger variants would only add an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Spec {
    /// A ServiceEntry's `spec`.
    ServiceEntry(ServiceEntry),
    /// A WorkloadEntry's `spec`.
    WorkloadEntry(WorkloadEntry),
    /// A WorkloadGroup's `spec`.
    WorkloadGroup(WorkloadGroup),
    /// A VirtualService's `spec`.
    VirtualService(VirtualService),
    /// A DestinationRule's `spec`.
    DestinationRule(DestinationRule),
    /// A Sidecar's `spec`.
    Sidecar(Sidecar),
    /// A Gateway's `spec`.
    Gateway(Gateway),
    /// An EnvoyFilter's `spec`.
    EnvoyFilter(EnvoyFilter),
    /// A PeerAuthentication's `spec`.
    PeerAuthentication(PeerAuthentication),
    /// An AuthorizationPolicy's `spec`.
    AuthorizationPolicy(AuthorizationPolicy),
    /// A RequestAuthentication's `spec`.
    RequestAuthentication(RequestAuthentication),
    /// A Service (its `spec`).
    Service(Service),
    /// An EndpointSlice (its top-level fields).
    EndpointSlice(EndpointSlice),
    /// A Pod (the `spec` and `status` fields istiod uses).
    Pod(Pod),
    /// A Namespace (everything istiod uses is in the metadata).
    Namespace(Namespace),
    /// A Node (everything istiod uses is in the metadata).
    Node(Node),
    /// A GatewayClass's `spec`.
    GatewayClass(GatewayClass),
    /// A Gateway API Gateway's `spec`.
    KubernetesGateway(KubernetesGateway),
    /// An HTTPRoute's `spec`.
    HttpRoute(HttpRoute),
    /// A Secret (its data redacted whenever shown).
    Secret(Secret),
    /// A Telemetry's `spec`.
    Telemetry(Telemetry),
    /// A ProxyConfig's `spec`.
    ProxyConfig(ProxyConfig),
    /// An Ingress (its `spec`).
    Ingress(Ingress),
    /// An IngressClass (its `spec`).
    IngressClass(IngressClass),
    /// A ReferenceGrant's `spec`.
    ReferenceGrant(ReferenceGrant),
    /// A TCPRoute's `spec`.
    TcpRoute(TcpRoute),
    /// A TLSRoute's `spec`.
    TlsRoute(TlsRoute),
    /// A GRPCRoute's `spec`.
    GrpcRoute(GrpcRoute),
    /// A BackendTLSPolicy's `spec`.
    BackendTlsPolicy(BackendTlsPolicy),
    /// A ConfigMap (its CA keys only).
    ConfigMap(ConfigMap),
    /// A ListenerSet's `spec`.
    ListenerSet(ListenerSet),
}

impl Spec {
    /// The kind of this body.
    pub fn kind(&self) -> Kind {
        match self {
            Spec::ServiceEntry(_) => Kind::ServiceEntry,
            Spec::WorkloadEntry(_) => Kind::WorkloadEntry,
            Spec::WorkloadGroup(_) => Kind::WorkloadGroup,
            Spec::VirtualService(_) => Kind::VirtualService,
            Spec::DestinationRule(_) => Kind::DestinationRule,
            Spec::Sidecar(_) => Kind::Sidecar,
            Spec::Gateway(_) => Kind::Gateway,
            Spec::EnvoyFilter(_) => Kind::EnvoyFilter,
            Spec::PeerAuthentication(_) => Kind::PeerAuthentication,
            Spec::AuthorizationPolicy(_) => Kind::AuthorizationPolicy,
            Spec::RequestAuthentication(_) => Kind::RequestAuthentication,
            Spec::Service(_) => Kind::Service,
            Spec::EndpointSlice(_) => Kind::EndpointSlice,
            Spec::Pod(_) => Kind::Pod,
            Spec::Namespace(_) => Kind::Namespace,
            Spec::Node(_) => Kind::Node,
            Spec::GatewayClass(_) => Kind::GatewayClass,
            Spec::KubernetesGateway(_) => Kind::KubernetesGateway,
            Spec::HttpRoute(_) => Kind::HttpRoute,
            Spec::Secret(_) => Kind::Secret,
            Spec::Telemetry(_) => Kind::Telemetry,
            Spec::ProxyConfig(_) => Kind::ProxyConfig,
            Spec::Ingress(_) => Kind::Ingress,
            Spec::IngressClass(_) => Kind::IngressClass,
            Spec::ReferenceGrant(_) => Kind::ReferenceGrant,
            Spec::TcpRoute(_) => Kind::TcpRoute,
            Spec::TlsRoute(_) => Kind::TlsRoute,
            Spec::GrpcRoute(_) => Kind::GrpcRoute,
            Spec::BackendTlsPolicy(_) => Kind::BackendTlsPolicy,
            Spec::ConfigMap(_) => Kind::ConfigMap,
            Spec::ListenerSet(_) => Kind::ListenerSet,
        }
    }
}

/// One typed object: Istio's `config.Config` (metadata + spec).
///
/// Serializes in Kubernetes' shape (`apiVersion`, `kind`, `metadata`, then
/// `spec` or the kind's top-level fields), so a dump reads like the input and
/// decodes back to an equal object.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    /// The `apiVersion` the object was written with (e.g. `networking.istio.io/v1beta1`).
    pub api_version: String,
    /// The metadata; `namespace` is filled in for namespaced kinds.
    pub metadata: ObjectMeta,
    /// The typed body.
    pub spec: Spec,
}

impl Serialize for Object {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeMap};
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("apiVersion", &self.api_version)?;
        map.serialize_entry("kind", self.kind().as_str())?;
        map.serialize_entry("metadata", &self.metadata)?;
        if self.kind().has_spec_body() {
            map.serialize_entry("spec", &self.spec)?;
            if let Spec::WorkloadEntry(we) = &self.spec
                && !we.status_conditions.is_empty()
            {
                map.serialize_entry(
                    "status",
                    &serde_json::json!({ "conditions": we.status_conditions }),
                )?;
            }
        } else {
            // Kubernetes kinds keep their own top-level fields (`spec`,
            // `status`, or EndpointSlice's `endpoints` and `ports`).
            let body = serde_json::to_value(&self.spec).map_err(S::Error::custom)?;
            if let serde_json::Value::Object(fields) = body {
                for (k, v) in fields {
                    map.serialize_entry(&k, &v)?;
                }
            }
        }
        map.end()
    }
}

impl Object {
    /// The object's kind.
    pub fn kind(&self) -> Kind {
        self.spec.kind()
    }

    /// The object's key, `Kind/namespace/name`.
    pub fn key(&self) -> ObjectKey {
        ObjectKey::new(self.kind(), &self.metadata.namespace, &self.metadata.name)
    }

    /// The typed body, if this object is of kind `T`.
    pub fn spec_as<T: KindSpec>(&self) -> Option<&T> {
        T::from_spec(&self.spec)
    }
}

/// A spec type that belongs to one [`Kind`]; lets callers ask a snapshot for
/// "every VirtualService" with the type, not a match on [`Spec`].
pub trait KindSpec: Sized + 'static {
    /// The kind whose body this is.
    const KIND: Kind;
    /// The body, if `spec` is of this kind.
    fn from_spec(spec: &Spec) -> Option<&Self>;
}

macro_rules! kind_spec {
    ($($ty:ident),* $(,)?) => {$(
        impl KindSpec for $ty {
            const KIND: Kind = Kind::$ty;
            fn from_spec(spec: &Spec) -> Option<&Self> {
                match spec {
                    Spec::$ty(s) => Some(s),
                    _ => None,
                }
            }
        }
    )*};
}

kind_spec!(
    ServiceEntry,
    WorkloadEntry,
    WorkloadGroup,
    VirtualService,
    DestinationRule,
    Sidecar,
    Gateway,
    EnvoyFilter,
    PeerAuthentication,
    AuthorizationPolicy,
    RequestAuthentication,
    Service,
    EndpointSlice,
    Pod,
    Namespace,
    Node,
    GatewayClass,
    KubernetesGateway,
    HttpRoute,
    Secret,
    Telemetry,
    ProxyConfig,
    Ingress,
    IngressClass,
    ReferenceGrant,
    TcpRoute,
    TlsRoute,
    GrpcRoute,
    BackendTlsPolicy,
    ConfigMap,
    ListenerSet,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_served_versions_and_names_the_others() {
        for v in ["v1", "v1beta1", "v1alpha3"] {
            assert_eq!(
                Kind::resolve(&format!("networking.istio.io/{v}"), "VirtualService"),
                Ok(Some(Kind::VirtualService))
            );
        }
        assert_eq!(
            Kind::resolve("security.istio.io/v1beta1", "PeerAuthentication"),
            Ok(Some(Kind::PeerAuthentication))
        );
        assert_eq!(Kind::resolve("v1", "Service"), Ok(Some(Kind::Service)));
        assert_eq!(
            Kind::resolve("discovery.k8s.io/v1", "EndpointSlice"),
            Ok(Some(Kind::EndpointSlice))
        );
        // A kind of another group with the same name is not ours.
        assert_eq!(Kind::resolve("serving.knative.dev/v1", "Service"), Ok(None));
        assert_eq!(
            Kind::resolve("networking.istio.io/v1alpha3", "EnvoyFilter"),
            Ok(Some(Kind::EnvoyFilter))
        );
        assert_eq!(
            Kind::resolve("networking.istio.io/v1beta1", "ProxyConfig"),
            Ok(Some(Kind::ProxyConfig))
        );
        assert!(Kind::resolve("networking.istio.io/v1", "ProxyConfig").is_err());
        assert_eq!(
            Kind::resolve("extensions.istio.io/v1alpha1", "WasmPlugin"),
            Ok(None)
        );
        assert!(Kind::resolve("networking.istio.io/v1", "EnvoyFilter").is_err());
        let err = Kind::resolve("security.istio.io/v1alpha1", "PeerAuthentication").unwrap_err();
        assert_eq!(err.kind, Kind::PeerAuthentication);
        assert_eq!(
            err.served,
            ["security.istio.io/v1", "security.istio.io/v1beta1"]
        );
        assert_eq!(
            err.to_string(),
            "apiVersion security.istio.io/v1alpha1 is not served for PeerAuthentication (use security.istio.io/v1, security.istio.io/v1beta1)"
        );
    }

    #[test]
    fn keys_display_as_istio_config_keys() {
        assert_eq!(
            ObjectKey::new(Kind::VirtualService, "demo", "httpbin").to_string(),
            "VirtualService/demo/httpbin"
        );
        assert_eq!(
            ObjectKey::new(Kind::Namespace, "", "demo").to_string(),
            "Namespace/demo"
        );
    }
}
