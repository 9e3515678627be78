//! `networking.istio.io` DestinationRule: traffic policy (load balancing,
//! locality, connection pools, outlier detection, client TLS) and subsets,
//! with Istio's field names (camelCase; unknown fields refused).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::*;

/// A `networking.istio.io` DestinationRule.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DestinationRule {
    /// The service the rule applies to (required).
    pub host: String,
    /// Policies for every port and subset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_policy: Option<TrafficPolicy>,
    /// Named subsets (by endpoint labels).
    pub subsets: Vec<Subset>,
    /// Namespaces the rule is visible to.
    pub export_to: Vec<String>,
    /// Workloads of the rule's namespace it applies to (Istio's
    /// `istio.type.v1beta1.WorkloadSelector`, spelled `matchLabels`); unset:
    /// every client it is exported to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<PolicySelector>,
}

/// A traffic policy.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TrafficPolicy {
    /// Load balancing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerSettings>,
    /// Connection pool (circuit breakers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<ConnectionPoolSettings>,
    /// Outlier detection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetection>,
    /// Upstream TLS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClientTlsSettings>,
    /// Overrides per port.
    pub port_level_settings: Vec<PortTrafficPolicy>,
    /// Tunnel settings (accepted, not interpreted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<Opaque>,
    /// PROXY protocol sent upstream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<ProxyProtocol>,
}

/// A traffic policy for one port.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PortTrafficPolicy {
    /// The port (required).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<PortSelector>,
    /// Load balancing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerSettings>,
    /// Connection pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<ConnectionPoolSettings>,
    /// Outlier detection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetection>,
    /// Upstream TLS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClientTlsSettings>,
}

/// Load-balancer settings: `simple` or `consistentHash`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LoadBalancerSettings {
    /// A simple policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simple: Option<SimpleLb>,
    /// Consistent hashing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consistent_hash: Option<ConsistentHashLb>,
    /// Locality load balancing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locality_lb_setting: Option<LocalityLbSetting>,
    /// Slow-start window.
    #[serde(with = "go_duration", skip_serializing_if = "Option::is_none")]
    pub warmup_duration_secs: Option<Duration>,
}

/// `TrafficPolicy.proxyProtocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ProxyProtocol {
    /// The PROXY protocol version (V1 when unset, as Istio's proto default).
    pub version: ProxyProtocolVersion,
}

/// `ProxyProtocol.version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
pub enum ProxyProtocolVersion {
    /// Text header.
    #[default]
    V1,
    /// Binary header.
    V2,
}

/// `LocalityLoadBalancerSetting`, in a DestinationRule or the mesh config.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LocalityLbSetting {
    /// Weights by destination locality, per source locality.
    pub distribute: Vec<LocalityDistribute>,
    /// Region failover (`from` region to `to` region).
    pub failover: Vec<LocalityFailover>,
    /// Labels ordering endpoints into failover priorities.
    pub failover_priority: Vec<String>,
    /// On (the default) or off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// `LocalityLoadBalancerSetting.Distribute`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LocalityDistribute {
    /// Source locality (`region/zone/subzone`, `*` matching any part).
    pub from: String,
    /// Destination locality to weight (percent; the weights sum to 100).
    pub to: BTreeMap<String, u32>,
}

/// `LocalityLoadBalancerSetting.Failover`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LocalityFailover {
    /// Source region.
    pub from: String,
    /// Region to fail over to.
    pub to: String,
}

/// `LoadBalancerSettings.simple`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SimpleLb {
    /// Let Istio choose (LEAST_REQUEST).
    Unspecified,
    /// Deprecated alias of LEAST_REQUEST.
    LeastConn,
    /// Random.
    Random,
    /// Original destination.
    Passthrough,
    /// Round robin.
    RoundRobin,
    /// Least request.
    LeastRequest,
}

/// Consistent hashing: exactly one hash key.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ConsistentHashLb {
    /// Hash on a header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_header_name: Option<String>,
    /// Hash on a cookie.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_cookie: Option<HttpCookie>,
    /// Hash on the source IP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_source_ip: Option<bool>,
    /// Hash on a query parameter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_query_parameter_name: Option<String>,
    /// Ring hash settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ring_hash: Option<RingHash>,
    /// Maglev settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maglev: Option<Maglev>,
    /// Deprecated ring size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minimum_ring_size: Option<u64>,
}

/// Hash cookie.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpCookie {
    /// Cookie name (required).
    pub name: String,
    /// Cookie path.
    pub path: String,
    /// Cookie lifetime.
    #[serde(with = "go_duration", skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Duration>,
}

/// Ring hash.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RingHash {
    /// Minimum ring size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minimum_ring_size: Option<u64>,
}

/// Maglev.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Maglev {
    /// Table size (prime).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table_size: Option<u64>,
}

/// Connection pool settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ConnectionPoolSettings {
    /// TCP settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp: Option<TcpSettings>,
    /// HTTP settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSettings>,
}

/// TCP connection pool settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TcpSettings {
    /// Maximum connections.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<i32>,
    /// Connect timeout (mesh `connectTimeout`, 10s, when unset).
    #[serde(with = "go_duration", skip_serializing_if = "Option::is_none")]
    pub connect_timeout: Option<Duration>,
    /// TCP keepalive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_keepalive: Option<TcpKeepalive>,
    /// Maximum connection lifetime.
    #[serde(with = "go_duration", skip_serializing_if = "Option::is_none")]
    pub max_connection_duration: Option<Duration>,
    /// Idle timeout.
    #[serde(with = "go_duration", skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<Duration>,
}

/// TCP keepalive.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TcpKeepalive {
    /// Probes before the connection is dead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probes: Option<u32>,
    /// Idle time before probes.
    #[serde(with = "go_duration", skip_serializing_if = "Option::is_none")]
    pub time: Option<Duration>,
    /// Interval between probes.
    #[serde(with = "go_duration", skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
}

/// HTTP connection pool settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpSettings {
    /// Pending HTTP/1 requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http1_max_pending_requests: Option<i32>,
    /// Concurrent requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http2_max_requests: Option<i32>,
    /// Requests per connection (0 = unlimited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_requests_per_connection: Option<i32>,
    /// Concurrent retries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<i32>,
    /// Idle timeout.
    #[serde(with = "go_duration", skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<Duration>,
    /// `DEFAULT`, `DO_NOT_UPGRADE` or `UPGRADE`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub h2_upgrade_policy: Option<H2UpgradePolicy>,
    /// Use the client's protocol upstream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_client_protocol: Option<bool>,
    /// Concurrent HTTP/2 streams per connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent_streams: Option<i32>,
}

/// `HTTPSettings.h2UpgradePolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum H2UpgradePolicy {
    /// Mesh default.
    Default,
    /// Keep HTTP/1.1.
    DoNotUpgrade,
    /// Upgrade to HTTP/2.
    Upgrade,
}

/// Outlier detection.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OutlierDetection {
    /// Split local-origin errors from external ones.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split_external_local_origin_errors: Option<bool>,
    /// Local-origin failures before ejection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consecutive_local_origin_failures: Option<u32>,
    /// 502/503/504 errors before ejection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consecutive_gateway_errors: Option<u32>,
    /// 5xx errors before ejection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consecutive_5xx_errors: Option<u32>,
    /// Analysis interval.
    #[serde(with = "go_duration", skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    /// Minimum ejection time.
    #[serde(with = "go_duration", skip_serializing_if = "Option::is_none")]
    pub base_ejection_time: Option<Duration>,
    /// Maximum share of hosts ejected (0-100).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ejection_percent: Option<i32>,
    /// Minimum healthy share for ejection to apply (0-100).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_health_percent: Option<i32>,
}

/// Upstream TLS settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ClientTlsSettings {
    /// The TLS mode.
    pub mode: TlsMode,
    /// Client certificate file (MUTUAL).
    pub client_certificate: String,
    /// Client key file (MUTUAL).
    pub private_key: String,
    /// CA bundle file.
    pub ca_certificates: String,
    /// Secret with the certificates (instead of files).
    pub credential_name: String,
    /// Accepted server identities.
    pub subject_alt_names: Vec<String>,
    /// SNI to send.
    pub sni: String,
    /// Skip server verification.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
    /// CRL file.
    pub ca_crl: String,
}

/// `ClientTLSSettings.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TlsMode {
    /// Plain text (the default).
    #[default]
    Disable,
    /// TLS, server verified.
    Simple,
    /// mTLS with given certificates.
    Mutual,
    /// mTLS with the workload's Istio certificate.
    IstioMutual,
}

/// A named subset of a service's endpoints.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Subset {
    /// The name (required, unique in the rule).
    pub name: String,
    /// Endpoint labels that select the subset.
    pub labels: Labels,
    /// Overrides for this subset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_policy: Option<TrafficPolicy>,
}
