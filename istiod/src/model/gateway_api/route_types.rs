//! The HTTPRoute (and GRPCRoute) filter and rule fields Istio maps beyond
//! headers, redirects and rewrites: `RequestMirror`, `CORS` and `retry`
//! (Gateway API v1.6 CRDs).

use serde::{Deserialize, Serialize};

/// A backend named by a mirror (`BackendObjectReference`).
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct BackendObjectReference {
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
    /// The port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
}

/// `RequestMirror`: a copy of the requests to another backend.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RequestMirror {
    /// Where the copies go.
    pub backend_ref: BackendObjectReference,
    /// The share of requests mirrored, in percent (all when unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percent: Option<u32>,
    /// The share of requests mirrored as a fraction.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fraction: Option<Fraction>,
}

/// A fraction (`denominator` 100 when unset).
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Fraction {
    /// The numerator.
    pub numerator: u32,
    /// The denominator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub denominator: Option<u32>,
}

/// `CORS`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CorsFilter {
    /// Origins allowed (`*` for any, `*` wildcards within).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_origins: Vec<String>,
    /// Whether credentials are allowed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_credentials: Option<bool>,
    /// Methods allowed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_methods: Vec<String>,
    /// Request headers allowed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_headers: Vec<String>,
    /// Response headers exposed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub expose_headers: Vec<String>,
    /// How long a preflight answer may be cached, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_age: Option<u32>,
}

/// A rule's `retry`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpRouteRetry {
    /// HTTP status codes retried (besides connection errors).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub codes: Vec<u32>,
    /// How many retries (2 when unset, as Istio's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// The pause between retries.
    #[serde(
        with = "crate::model::istio::gateway_api_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub backoff: Option<std::time::Duration>,
}
