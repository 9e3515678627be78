//! Istio's CRD specs, as `networking.istio.io` and `security.istio.io` define
//! them, with the fields sidecar generation uses. Field names are Istio's
//! (camelCase); unknown fields are rejected, as Istio's validation does, so a
//! typo is an error naming the field rather than a rule that silently does
//! nothing. Durations are Go/protobuf strings (`5s`, `100ms`, `1.5s`).
//!
//! Fields that istiod accepts but does not interpret yet (tunnel and proxy
//! protocol settings, locality LB, TLS settings of Sidecar ingress) are kept as
//! opaque JSON so that valid Istio config still loads.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Labels, as `key: value`.
pub type Labels = BTreeMap<String, String>;

/// Opaque JSON for fields accepted but not interpreted.
pub type Opaque = serde_json::Value;

mod destination_rule;
mod workload_group;
pub use destination_rule::*;
pub use workload_group::*;

/// (De)serializes the `Option<Duration>` of a Gateway API object: reads
/// as [`go_duration`], writes Go's form (`500ms`, `10s`), the form the
/// Gateway API's duration fields take (GEP-2257), not protobuf's.
pub(crate) mod gateway_api_duration {
    use std::time::Duration;

    use serde::Serializer;

    pub use super::go_duration::deserialize;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => common::duration::serialize(d, s),
            None => s.serialize_none(),
        }
    }
}

/// (De)serializes `Option<Duration>`: reads a Go or protobuf duration
/// string (`1ms`, `0.001s`), writes protobuf's JSON form (`0.001s`), as
/// Istio shows its config objects.
pub(crate) mod go_duration {
    use std::time::Duration;

    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => common::duration::serialize_proto(d, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        d.deserialize_option(OptionVisitor)
    }

    struct OptionVisitor;

    impl<'de> Visitor<'de> for OptionVisitor {
        type Value = Option<Duration>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration such as 5s or 100ms")
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(DurationVisitor).map(Some)
        }
    }

    /// Accepts numbers too, so that `timeout: 5` gets the duration error
    /// ("missing unit") rather than a type error.
    struct DurationVisitor;

    impl DurationVisitor {
        fn parse<E: de::Error>(s: &str) -> Result<Duration, E> {
            common::duration::parse(s).map_err(E::custom)
        }
    }

    impl Visitor<'_> for DurationVisitor {
        type Value = Duration;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration such as 5s or 100ms")
        }

        fn visit_str<E: de::Error>(self, s: &str) -> Result<Duration, E> {
            Self::parse(s)
        }

        fn visit_u64<E: de::Error>(self, n: u64) -> Result<Duration, E> {
            Self::parse(&n.to_string())
        }

        fn visit_i64<E: de::Error>(self, n: i64) -> Result<Duration, E> {
            Self::parse(&n.to_string())
        }

        fn visit_f64<E: de::Error>(self, n: f64) -> Result<Duration, E> {
            Self::parse(&n.to_string())
        }
    }
}

/// `workloadSelector` / `selector`: the workloads a config applies to.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct WorkloadSelector {
    /// Labels a workload must carry (all of them).
    pub labels: Labels,
}

/// `selector` of the security policies (Istio's
/// `istio.type.v1beta1.WorkloadSelector`, spelled `matchLabels`, unlike the
/// networking kinds' `workloadSelector.labels`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PolicySelector {
    /// Labels a workload must carry (all of them).
    pub match_labels: Labels,
}

/// A port in a ServiceEntry or a Sidecar listener.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Port {
    /// The port number (1-65535).
    pub number: u32,
    /// `HTTP`, `HTTPS`, `GRPC`, `HTTP2`, `MONGO`, `TCP`, `TLS`, ... (case-insensitive);
    /// empty means auto-detection.
    pub protocol: String,
    /// The port's name (required in a ServiceEntry).
    pub name: String,
    /// The port on the endpoints, when it differs from `number`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_port: Option<u32>,
}

/// `ServiceEntry.location`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Location {
    /// Outside the mesh: no mTLS by default (Istio's default).
    #[default]
    MeshExternal,
    /// Part of the mesh.
    MeshInternal,
}

/// `ServiceEntry.resolution`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Resolution {
    /// Forward to the address the client asked for (`ORIGINAL_DST`, Istio's default).
    #[default]
    None,
    /// Endpoints are IPs (EDS).
    Static,
    /// Endpoints are resolved by DNS, all addresses used (`STRICT_DNS`).
    Dns,
    /// Endpoints resolved by DNS, first address used (`LOGICAL_DNS`).
    DnsRoundRobin,
    /// Dynamic forward proxy.
    DynamicDns,
}

/// A `networking.istio.io` ServiceEntry.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ServiceEntry {
    /// Host names of the service (required).
    pub hosts: Vec<String>,
    /// Virtual IPs or CIDRs.
    pub addresses: Vec<String>,
    /// Ports.
    pub ports: Vec<Port>,
    /// Inside or outside the mesh.
    pub location: Location,
    /// How endpoints are found.
    pub resolution: Resolution,
    /// Inline endpoints.
    pub endpoints: Vec<WorkloadEntry>,
    /// Selects WorkloadEntries and Pods as endpoints instead of `endpoints`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<WorkloadSelector>,
    /// Namespaces the service is visible to (`.`, `*`, `~` or names).
    pub export_to: Vec<String>,
    /// Identities the endpoints' certificates must carry.
    pub subject_alt_names: Vec<String>,
    /// The object's `status.addresses`: what IP auto-allocation wrote
    /// (read from the status, never from the spec).
    #[serde(skip)]
    pub status_addresses: Vec<ServiceEntryAddress>,
}

/// One of a ServiceEntry's `status.addresses` (Istio's `ServiceEntryAddress`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceEntryAddress {
    /// The address.
    pub value: String,
    /// The host it was allocated for.
    pub host: String,
}

/// A `networking.istio.io` WorkloadEntry (also the shape of a ServiceEntry endpoint).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct WorkloadEntry {
    /// IP, host name (DNS resolution) or `unix://` path.
    pub address: String,
    /// Port overrides by service port name.
    pub ports: BTreeMap<String, u32>,
    /// The workload's labels.
    pub labels: Labels,
    /// The network the workload is on.
    pub network: String,
    /// `region/zone/subzone`.
    pub locality: String,
    /// Load-balancing weight.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// The workload's service account (its SPIFFE identity).
    pub service_account: String,
    /// The object's `status.conditions` (a WorkloadEntry's `Healthy`
    /// condition; read from the status, never from the spec).
    #[serde(skip)]
    pub status_conditions: Vec<IstioCondition>,
}

/// A `networking.istio.io` VirtualService.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct VirtualService {
    /// Destination hosts the rules apply to (required).
    pub hosts: Vec<String>,
    /// Gateways and sidecars the rules apply to (`mesh` when empty).
    pub gateways: Vec<String>,
    /// HTTP routes, in order.
    pub http: Vec<HttpRoute>,
    /// TLS (SNI) routes.
    pub tls: Vec<TlsRoute>,
    /// TCP routes.
    pub tcp: Vec<TcpRoute>,
    /// Namespaces the rules are visible to.
    pub export_to: Vec<String>,
    /// Istio's `internal.istio.io/route-semantics: gateway`: set only on the
    /// VirtualServices translated from Gateway API routes (never read from
    /// a document): a backend without a cluster answers 500, and a path
    /// prefix matches whole segments.
    #[serde(skip)]
    pub gateway_semantics: bool,
}

impl VirtualService {
    /// The hosts its HTTP routes and mirrors send to, as written.
    pub fn destination_hosts(&self) -> impl Iterator<Item = &str> {
        self.http.iter().flat_map(|r| {
            r.route
                .iter()
                .map(|d| d.destination.host.as_str())
                .chain(r.mirror.iter().map(|m| m.host.as_str()))
                .chain(r.mirrors.iter().map(|m| m.destination.host.as_str()))
        })
    }
}

/// One HTTP route of a VirtualService.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpRoute {
    /// Route name (used for the Envoy route name).
    pub name: String,
    /// Conditions, ORed; empty matches everything.
    pub r#match: Vec<HttpMatchRequest>,
    /// Weighted destinations.
    pub route: Vec<HttpRouteDestination>,
    /// A redirect instead of a route.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redirect: Option<HttpRedirect>,
    /// A fixed response instead of a route.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_response: Option<HttpDirectResponse>,
    /// Delegation to another VirtualService.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delegate: Option<Delegate>,
    /// URI/authority rewrite.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<HttpRewrite>,
    /// Request timeout (disabled when unset).
    #[serde(with = "go_duration", skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Retry policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retries: Option<HttpRetry>,
    /// Fault injection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault: Option<HttpFaultInjection>,
    /// Mirror traffic to this destination.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirror: Option<Destination>,
    /// Share of traffic mirrored to `mirror`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirror_percentage: Option<Percent>,
    /// Several mirrors.
    pub mirrors: Vec<HttpMirrorPolicy>,
    /// CORS policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cors_policy: Option<CorsPolicy>,
    /// Header manipulation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
}

/// Match conditions of an HTTP route, ANDed.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpMatchRequest {
    /// Name of the match (prefixed to the route name).
    pub name: String,
    /// The path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri: Option<StringMatch>,
    /// The URI scheme.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheme: Option<StringMatch>,
    /// The HTTP method.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<StringMatch>,
    /// The authority (Host header).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authority: Option<StringMatch>,
    /// Request headers (lower-case names); an empty match means "present".
    pub headers: BTreeMap<String, StringMatch>,
    /// The port the request was addressed to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Labels of the calling workload.
    pub source_labels: Labels,
    /// Gateways this match applies to.
    pub gateways: Vec<String>,
    /// Query parameters.
    pub query_params: BTreeMap<String, StringMatch>,
    /// Case-insensitive `uri` match.
    pub ignore_uri_case: bool,
    /// Headers that must not match.
    pub without_headers: BTreeMap<String, StringMatch>,
    /// Namespace of the calling workload.
    pub source_namespace: String,
    /// Stat prefix for the route.
    pub stat_prefix: String,
}

/// Istio's `StringMatch`: at most one of `exact`, `prefix`, `regex` (RE2 syntax).
/// An empty match is allowed where Istio allows it (header presence).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct StringMatch {
    /// Exact value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exact: Option<String>,
    /// Prefix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// RE2 regular expression.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
}

/// The one matcher a valid [`StringMatch`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matcher<'a> {
    /// `exact`.
    Exact(&'a str),
    /// `prefix`.
    Prefix(&'a str),
    /// `regex`.
    Regex(&'a str),
}

impl StringMatch {
    /// The matcher, or `None` for an empty match (validation rejects more than one).
    pub fn matcher(&self) -> Option<Matcher<'_>> {
        if let Some(v) = &self.exact {
            Some(Matcher::Exact(v))
        } else if let Some(v) = &self.prefix {
            Some(Matcher::Prefix(v))
        } else {
            self.regex.as_deref().map(Matcher::Regex)
        }
    }
}

/// A weighted destination of an HTTP route.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpRouteDestination {
    /// Where to send the traffic.
    pub destination: Destination,
    /// Share of the traffic (0-100).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    /// Header manipulation for this destination.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
}

/// A weighted destination of a TCP or TLS route.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RouteDestination {
    /// Where to send the traffic.
    pub destination: Destination,
    /// Share of the traffic (0-100).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
}

/// A service (and subset and port) to send traffic to.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Destination {
    /// A service host name (short names are relative to the rule's namespace).
    pub host: String,
    /// A subset defined in the host's DestinationRule.
    pub subset: String,
    /// The service port, required when the service has several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<PortSelector>,
}

/// Selects a port by number.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PortSelector {
    /// The port number.
    pub number: u32,
}

/// Header operations for requests and responses.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Headers {
    /// On the request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<HeaderOperations>,
    /// On the response.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response: Option<HeaderOperations>,
}

/// Set, add and remove headers.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HeaderOperations {
    /// Overwrite these headers.
    pub set: BTreeMap<String, String>,
    /// Append these headers.
    pub add: BTreeMap<String, String>,
    /// Remove these headers.
    pub remove: Vec<String>,
}

/// An HTTP redirect.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpRedirect {
    /// Replacement path.
    pub uri: String,
    /// Replacement of the matched path prefix (Istio's `prefixRewrite`; the
    /// Gateway API's `ReplacePrefixMatch`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prefix_rewrite: String,
    /// Replacement authority.
    pub authority: String,
    /// Replacement port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// `FROM_PROTOCOL_DEFAULT` or `FROM_REQUEST_PORT`.
    pub derive_port: String,
    /// Replacement scheme.
    pub scheme: String,
    /// Status code (301 by default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redirect_code: Option<u32>,
}

/// A fixed response.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpDirectResponse {
    /// Status code.
    pub status: u32,
    /// Body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<HttpBody>,
}

/// A direct response body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpBody {
    /// Text body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    /// Base64 body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<String>,
}

/// Delegation to another VirtualService.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Delegate {
    /// Its name.
    pub name: String,
    /// Its namespace (the delegating one's when empty).
    pub namespace: String,
}

/// A URI/authority rewrite.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpRewrite {
    /// Replaces the matched part of the path.
    pub uri: String,
    /// Replaces the authority.
    pub authority: String,
    /// Regex rewrite of the path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri_regex_rewrite: Option<RegexRewrite>,
}

/// A regex rewrite.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RegexRewrite {
    /// RE2 pattern.
    pub r#match: String,
    /// Substitution.
    pub rewrite: String,
}

/// Retry policy.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpRetry {
    /// Number of retries (Istio's default is 2 when no policy is given).
    pub attempts: i32,
    /// Timeout per try.
    #[serde(with = "go_duration", skip_serializing_if = "Option::is_none")]
    pub per_try_timeout: Option<Duration>,
    /// Envoy `retry_on` conditions, comma-separated.
    pub retry_on: String,
    /// Retry in other localities.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_remote_localities: Option<bool>,
    /// Avoid hosts already tried.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_ignore_previous_hosts: Option<bool>,
    /// Base retry back-off.
    #[serde(with = "go_duration", skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Duration>,
}

/// Fault injection.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpFaultInjection {
    /// Delay some requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<FaultDelay>,
    /// Abort some requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub abort: Option<FaultAbort>,
}

/// A fault delay.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FaultDelay {
    /// How long (required).
    #[serde(with = "go_duration", skip_serializing_if = "Option::is_none")]
    pub fixed_delay: Option<Duration>,
    /// Share of requests delayed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
    /// Deprecated integer percentage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percent: Option<i32>,
}

/// A fault abort.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FaultAbort {
    /// HTTP status to return.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_status: Option<i32>,
    /// gRPC status to return.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<String>,
    /// Share of requests aborted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
}

/// A percentage, 0-100.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Percent {
    /// The value.
    pub value: f64,
}

/// One of several mirrors.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpMirrorPolicy {
    /// Where to mirror.
    pub destination: Destination,
    /// Share mirrored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
}

/// CORS policy.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CorsPolicy {
    /// Allowed origins.
    pub allow_origins: Vec<StringMatch>,
    /// Allowed methods.
    pub allow_methods: Vec<String>,
    /// Allowed request headers.
    pub allow_headers: Vec<String>,
    /// Exposed response headers.
    pub expose_headers: Vec<String>,
    /// Preflight cache duration.
    #[serde(with = "go_duration", skip_serializing_if = "Option::is_none")]
    pub max_age: Option<Duration>,
    /// Allow credentials.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_credentials: Option<bool>,
    /// `UNSPECIFIED`, `FORWARD` or `IGNORE`.
    pub unmatched_preflights: String,
}

/// A TCP route.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TcpRoute {
    /// Conditions, ORed.
    pub r#match: Vec<L4MatchAttributes>,
    /// Weighted destinations.
    pub route: Vec<RouteDestination>,
}

/// L4 match conditions.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct L4MatchAttributes {
    /// Destination IPs/CIDRs.
    pub destination_subnets: Vec<String>,
    /// Destination port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Labels of the calling workload.
    pub source_labels: Labels,
    /// Gateways.
    pub gateways: Vec<String>,
    /// Namespace of the calling workload.
    pub source_namespace: String,
}

/// A TLS (SNI) route.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TlsRoute {
    /// Conditions, ORed (required).
    pub r#match: Vec<TlsMatchAttributes>,
    /// Weighted destinations.
    pub route: Vec<RouteDestination>,
}

/// TLS match conditions.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TlsMatchAttributes {
    /// SNI values (required).
    pub sni_hosts: Vec<String>,
    /// Destination IPs/CIDRs.
    pub destination_subnets: Vec<String>,
    /// Destination port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Labels of the calling workload.
    pub source_labels: Labels,
    /// Gateways.
    pub gateways: Vec<String>,
    /// Namespace of the calling workload.
    pub source_namespace: String,
}

/// A `networking.istio.io` Sidecar.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Sidecar {
    /// Workloads it applies to (every workload of the namespace when unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<WorkloadSelector>,
    /// Inbound listeners.
    pub ingress: Vec<IstioIngressListener>,
    /// Outbound scope (`ns/host` entries).
    pub egress: Vec<IstioEgressListener>,
    /// What happens to traffic for unknown destinations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outbound_traffic_policy: Option<OutboundTrafficPolicy>,
    /// The connection pool of every inbound cluster of the workload, unless
    /// its ingress listener sets its own (it replaces a DestinationRule's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inbound_connection_pool: Option<ConnectionPoolSettings>,
}

/// `captureMode` of a Sidecar listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CaptureMode {
    /// The environment's mode.
    #[default]
    Default,
    /// Traffic is redirected by iptables.
    Iptables,
    /// No redirection: the listener binds.
    None,
}

/// An inbound listener of a Sidecar.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct IstioIngressListener {
    /// The port (required).
    pub port: Port,
    /// Address to bind.
    pub bind: String,
    /// Capture mode.
    pub capture_mode: CaptureMode,
    /// `127.0.0.1:PORT`, `0.0.0.0:PORT`, `[::1]:PORT`, `[::]:PORT` or `unix://`.
    pub default_endpoint: String,
    /// TLS terminated on the port (Istio applies it with
    /// `ENABLE_TLS_ON_SIDECAR_INGRESS` when the port's mTLS mode is DISABLE).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<super::gateway::tls::ServerTlsSettings>,
    /// The connection pool of this port's inbound cluster (over
    /// `inboundConnectionPool`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<ConnectionPoolSettings>,
}

/// An outbound listener (scope) of a Sidecar.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct IstioEgressListener {
    /// The port, or all ports when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<Port>,
    /// Address to bind.
    pub bind: String,
    /// Capture mode.
    pub capture_mode: CaptureMode,
    /// `namespace/host` entries (`*`, `.` or `~` for the namespace).
    pub hosts: Vec<String>,
}

/// `outboundTrafficPolicy`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OutboundTrafficPolicy {
    /// The mode.
    pub mode: OutboundMode,
    /// Where unknown traffic goes instead of the passthrough cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_proxy: Option<Destination>,
}

/// A Sidecar's policy without a mode is `REGISTRY_ONLY`: the first value of
/// Istio's enum, which a proto reader gets for an unset field (the mesh
/// config differs: it is merged over defaults that say `ALLOW_ANY`).
impl Default for OutboundTrafficPolicy {
    fn default() -> Self {
        OutboundTrafficPolicy {
            mode: OutboundMode::RegistryOnly,
            egress_proxy: None,
        }
    }
}

/// `outboundTrafficPolicy.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OutboundMode {
    /// Only services in the registry are reachable.
    RegistryOnly,
    /// Unknown destinations pass through (mesh default).
    #[default]
    AllowAny,
}

/// A `security.istio.io` PeerAuthentication.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PeerAuthentication {
    /// Workloads it applies to (the whole namespace when unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<PolicySelector>,
    /// The mTLS mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtls: Option<PeerMtls>,
    /// Modes per workload port (needs a selector).
    pub port_level_mtls: BTreeMap<u32, PeerMtls>,
}

/// `PeerAuthentication.mtls`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PeerMtls {
    /// The mode.
    pub mode: MtlsMode,
}

/// The inbound mTLS mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MtlsMode {
    /// Inherit from the parent scope.
    #[default]
    Unset,
    /// Plain text only.
    Disable,
    /// mTLS and plain text.
    Permissive,
    /// mTLS only.
    Strict,
}

#[cfg(test)]
mod duration_form_tests {
    use std::time::Duration;

    use super::HttpRetry;

    #[test]
    fn istio_objects_write_protobuf_durations_gateway_api_objects_go_ones() {
        let t = crate::model::gateway_api::HttpRouteTimeouts {
            request: Some(Duration::from_millis(500)),
            backend_request: None,
        };
        assert_eq!(
            serde_json::to_value(&t).unwrap(),
            serde_json::json!({"request": "500ms"})
        );
        let r = HttpRetry {
            per_try_timeout: Some(Duration::from_millis(500)),
            ..Default::default()
        };
        assert_eq!(serde_json::to_value(&r).unwrap()["perTryTimeout"], "0.500s");
        let back: HttpRetry =
            serde_json::from_value(serde_json::json!({"perTryTimeout": "0.500s"})).unwrap();
        assert_eq!(back.per_try_timeout, Some(Duration::from_millis(500)));
    }
}
