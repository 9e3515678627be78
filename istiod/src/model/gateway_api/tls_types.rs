//! The Gateway API types of TLS and layer-4 routing: a listener's `tls`,
//! the Gateway's `spec.tls` (frontend client validation), and the
//! `TCPRoute` and `TLSRoute` kinds (v1, and v1alpha2 / v1alpha3 as the
//! experimental CRDs serve them), with every field of the v1.6 CRDs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ParentReference;

/// A listener's `tls`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ListenerTls {
    /// `Terminate` (the default) or `Passthrough`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The server certificates (Secrets), at most 2 as Istio serves them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub certificate_refs: Vec<SecretObjectReference>,
    /// Implementation options; Istio reads
    /// `gateway.istio.io/tls-terminate-mode` and
    /// `gateway.istio.io/tls-cipher-suites`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, String>,
}

/// A reference to a Secret (or another kind, which is refused in status).
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SecretObjectReference {
    /// `""` (core) when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `Secret` when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The name.
    pub name: String,
    /// The referring object's namespace when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A Gateway's `spec.tls`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GatewayTls {
    /// Client certificate validation of the listeners (frontend).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frontend: Option<FrontendTls>,
    /// The certificate the gateway presents to backends; refused (not
    /// implemented).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<Value>,
}

/// `spec.tls.frontend`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FrontendTls {
    /// For every port without its own entry.
    pub default: TlsConfig,
    /// Per port.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub per_port: Vec<TlsPortConfig>,
}

/// One `perPort` entry.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TlsPortConfig {
    /// The listener port.
    pub port: u32,
    /// Its settings.
    pub tls: TlsConfig,
}

/// Frontend TLS settings.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TlsConfig {
    /// Client certificate validation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validation: Option<FrontendValidation>,
}

/// `validation`: the CA that verifies client certificates.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FrontendValidation {
    /// ConfigMaps or Secrets holding the CA (Istio takes one).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ca_certificate_refs: Vec<ObjectReference>,
    /// `AllowValidOnly` (the default) or `AllowInsecureFallback`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// A typed reference (group and kind required by the CRD).
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ObjectReference {
    /// The group (`""` for core).
    pub group: String,
    /// The kind.
    pub kind: String,
    /// The name.
    pub name: String,
    /// The referring object's namespace when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A `TCPRoute`'s `spec`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TcpRoute {
    /// The Gateways (and listeners) it attaches to.
    pub parent_refs: Vec<ParentReference>,
    /// The rules (one, as the v1 CRD allows).
    pub rules: Vec<L4RouteRule>,
    /// Refused (not implemented).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_default_gateways: Option<Value>,
}

/// A `TLSRoute`'s `spec`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TlsRoute {
    /// The Gateways (and listeners) it attaches to.
    pub parent_refs: Vec<ParentReference>,
    /// The SNI host names it serves.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    /// The rules.
    pub rules: Vec<L4RouteRule>,
    /// Refused (not implemented).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_default_gateways: Option<Value>,
}

/// A rule of a TCPRoute or TLSRoute.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct L4RouteRule {
    /// An optional name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Where connections go, by weight.
    pub backend_refs: Vec<BackendRef>,
}

/// A `backendRefs` entry of a layer-4 route.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct BackendRef {
    /// `""` (core) when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `Service` when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The name.
    pub name: String,
    /// The route's namespace when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The port (required for Services).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// The share of connections (1 when unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}
