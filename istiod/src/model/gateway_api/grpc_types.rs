//! The Gateway API `GRPCRoute` kind (v1), with every field of the v1.6
//! CRDs: its matches name a gRPC service and method and headers; its
//! filters are the header modifiers, mirrors and extension references.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::route_types::RequestMirror;
use super::{HeaderFilter, NameMatch, ParentReference};

/// A `GRPCRoute`'s `spec`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GrpcRoute {
    /// The Gateways (and listeners), or Services for mesh routes, it
    /// attaches to.
    pub parent_refs: Vec<ParentReference>,
    /// The hosts it serves; the listener's when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    /// The rules, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<GrpcRouteRule>,
    /// Refused (not implemented).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_default_gateways: Option<Value>,
}

/// One rule of a GRPCRoute.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GrpcRouteRule {
    /// An optional name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Any one of them selects the rule; every request when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<GrpcRouteMatch>,
    /// Applied in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<GrpcRouteFilter>,
    /// Where requests go, by weight.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub backend_refs: Vec<GrpcBackendRef>,
    /// Refused (not implemented).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_persistence: Option<Value>,
}

/// One `matches` entry: every condition must hold.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GrpcRouteMatch {
    /// The gRPC service and method; any when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<GrpcMethodMatch>,
    /// Header (metadata) conditions.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<NameMatch>,
}

/// A method condition: `/<service>/<method>` of the request's path.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GrpcMethodMatch {
    /// `Exact` (the default) or `RegularExpression`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub r#type: Option<String>,
    /// The fully qualified service (`package.Service`); any when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The method; any when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// One `filters` entry of a rule or a backend.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GrpcRouteFilter {
    /// Which filter this is.
    pub r#type: String,
    /// For `RequestHeaderModifier`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_header_modifier: Option<HeaderFilter>,
    /// For `ResponseHeaderModifier`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_header_modifier: Option<HeaderFilter>,
    /// For `RequestMirror` (rules only, as Istio applies it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_mirror: Option<RequestMirror>,
    /// Refused (not implemented).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extension_ref: Option<Value>,
}

/// A `backendRefs` entry.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GrpcBackendRef {
    /// `""` (core) when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `Service` when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The Service's name (or host name for `Hostname`).
    pub name: String,
    /// The route's namespace when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The Service port (required for Services).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// The share of requests, relative to the others (1 when unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Header modifiers of this backend's requests and responses.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<GrpcRouteFilter>,
}
