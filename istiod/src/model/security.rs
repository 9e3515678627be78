//! Istio's `security.istio.io` request-level policies, as its API defines
//! them: AuthorizationPolicy (RBAC and external authorization) and
//! RequestAuthentication (end-user JWTs). PeerAuthentication, which only
//! picks the inbound mTLS mode, lives with the networking kinds in `istio`.
//!
//! Field names are Istio's (camelCase); unknown fields are rejected, so a
//! typo is an error naming the field rather than a rule that silently does
//! nothing.

pub mod attributes;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::istio::{PolicySelector, go_duration};

/// `targetRef` / `targetRefs` of a policy (Istio's `PolicyTargetReference`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PolicyTargetReference {
    /// The target's API group (`gateway.networking.k8s.io`, or empty for core).
    pub group: String,
    /// The target's kind (`Gateway`, `GatewayClass`, `Service`, `ServiceEntry`).
    pub kind: String,
    /// The target's name.
    pub name: String,
    /// The target's namespace (must be the policy's own when set).
    pub namespace: String,
}

/// The Gateway API group a `Gateway` reference carries.
pub const GATEWAY_API_GROUP: &str = "gateway.networking.k8s.io";

impl PolicyTargetReference {
    /// Whether it names a Gateway API `Gateway`.
    pub fn names_gateway(&self) -> bool {
        self.group == GATEWAY_API_GROUP && self.kind == "Gateway"
    }

    /// Whether it names a Kubernetes `Service` (group empty or `core`, as
    /// Istio's `CanonicalGroup`).
    pub fn names_service(&self) -> bool {
        (self.group.is_empty() || self.group == "core") && self.kind == "Service"
    }
}

/// A `security.istio.io` AuthorizationPolicy.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AuthorizationPolicy {
    /// Workloads it applies to (the whole namespace, or the mesh in the root
    /// namespace, when unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<PolicySelector>,
    /// The resource it attaches to (gateways and waypoints, not sidecars).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<PolicyTargetReference>,
    /// The resources it attaches to.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<PolicyTargetReference>,
    /// The rules; a request matching any of them gets the action.
    pub rules: Vec<Rule>,
    /// What a match does.
    pub action: AuthorizationAction,
    /// The extension provider of a CUSTOM policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<ExtensionProvider>,
}

/// `AuthorizationPolicy.action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AuthorizationAction {
    /// Allow a request only if it matches a rule (the default).
    #[default]
    Allow,
    /// Deny a request that matches a rule.
    Deny,
    /// Audit a request that matches a rule (never denies).
    Audit,
    /// Ask the extension provider about a request that matches a rule.
    Custom,
}

/// `AuthorizationPolicy.provider`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ExtensionProvider {
    /// The name of one of the mesh config's `extensionProviders`.
    pub name: String,
}

/// One rule: every present part must match (`from` any source, `to` any
/// operation, every `when`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Rule {
    /// Sources; a request matches if it comes from any of them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<RuleFrom>,
    /// Operations; a request matches if it is any of them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<RuleTo>,
    /// Extra conditions, all of which must hold.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<Condition>,
}

/// `Rule.from[]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RuleFrom {
    /// The source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
}

/// `Rule.to[]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RuleTo {
    /// The operation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation: Option<Operation>,
}

/// Who a request comes from. Every present field must match; within a
/// field any value matches; `not*` fields must not match.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Source {
    /// Peer identities (`<trust domain>/ns/<ns>/sa/<sa>`), `*` prefix/suffix allowed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub principals: Vec<String>,
    /// Peer identities that must not match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_principals: Vec<String>,
    /// End-user identities (`<iss>/<sub>`) from a validated JWT.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub request_principals: Vec<String>,
    /// End-user identities that must not match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_request_principals: Vec<String>,
    /// Namespaces of the peer identity.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Namespaces that must not match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_namespaces: Vec<String>,
    /// Service accounts of the peer identity (`<ns>/<sa>`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub service_accounts: Vec<String>,
    /// Service accounts that must not match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_service_accounts: Vec<String>,
    /// Peer addresses (IP or CIDR) of the connection.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ip_blocks: Vec<String>,
    /// Peer addresses that must not match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_ip_blocks: Vec<String>,
    /// Client addresses as `X-Forwarded-For` / proxy protocol report them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub remote_ip_blocks: Vec<String>,
    /// Client addresses that must not match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_remote_ip_blocks: Vec<String>,
}

/// What a request does. Every present field must match; within a field
/// any value matches; `not*` fields must not match.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Operation {
    /// `Host`/`:authority` values (case-insensitive), `*` prefix/suffix allowed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// Hosts that must not match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_hosts: Vec<String>,
    /// Destination ports, as strings.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
    /// Ports that must not match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_ports: Vec<String>,
    /// HTTP methods.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Methods that must not match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_methods: Vec<String>,
    /// Paths: exact, `*` prefix/suffix/presence, or `{*}`/`{**}` templates.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// Paths that must not match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_paths: Vec<String>,
}

/// `Rule.when[]`: a key (`request.headers[x]`, `source.ip`, ...) and the
/// values it must (`values`) or must not (`notValues`) have.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Condition {
    /// The attribute.
    pub key: String,
    /// Values of which one must match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    /// Values none of which may match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_values: Vec<String>,
}

/// A `security.istio.io` RequestAuthentication.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RequestAuthentication {
    /// Workloads it applies to (the whole namespace, or the mesh in the root
    /// namespace, when unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<PolicySelector>,
    /// The resource it attaches to (gateways and waypoints, not sidecars).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<PolicyTargetReference>,
    /// The resources it attaches to.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<PolicyTargetReference>,
    /// The issuers whose tokens are validated.
    pub jwt_rules: Vec<JwtRule>,
}

/// `RequestAuthentication.jwtRules[]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct JwtRule {
    /// The token's `iss`.
    pub issuer: String,
    /// Accepted `aud` values (any audience when empty).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub audiences: Vec<String>,
    /// Where the public keys are fetched from (by istiod, then inlined).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub jwks_uri: String,
    /// The public keys, inline (a JWKS JSON document).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub jwks: String,
    /// Headers the token is read from (default `Authorization: Bearer`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from_headers: Vec<JwtHeader>,
    /// Query parameters the token is read from (default `access_token`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from_params: Vec<String>,
    /// Cookies the token is read from.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from_cookies: Vec<String>,
    /// A header that receives the token's payload, base64url-encoded.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub output_payload_to_header: String,
    /// Keep the token in the request sent upstream.
    pub forward_original_token: bool,
    /// Claims copied into request headers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub output_claim_to_headers: Vec<ClaimToHeader>,
    /// How long fetching `jwksUri` may take (default 5s).
    #[serde(with = "go_duration", skip_serializing_if = "Option::is_none", default)]
    pub timeout: Option<Duration>,
    /// Claims whose space-separated string value is read as a list.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub space_delimited_claims: Vec<String>,
}

/// `JwtRule.fromHeaders[]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct JwtHeader {
    /// The header name.
    pub name: String,
    /// A prefix the value starts with (`Bearer `), stripped before validation.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prefix: String,
}

/// `JwtRule.outputClaimToHeaders[]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ClaimToHeader {
    /// The header to set.
    pub header: String,
    /// The claim (a top-level claim of the token).
    pub claim: String,
}
