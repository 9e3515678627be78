//! The labels of Istio's standard metrics for one access log entry, as
//! Istio's stats filter computes them: this proxy's own workload from its
//! node metadata, the peer from what Envoy knows about the connection (the
//! upstream host's `istio.workload` metadata, the cluster's
//! `istio.services`, the certificates' URI SANs). What only Istio's
//! metadata exchange would tell (the downstream peer's workload, app and
//! version on the server side) is `unknown`, as Istio reports it when the
//! exchange fails.

use std::collections::HashMap;

use common::NodeMetadata;
use common::istio_stats::{
    Reporter, TAG_CLUSTER_SERVICES, TAG_UPSTREAM_LOCAL_PRINCIPAL, TAG_UPSTREAM_PEER_PRINCIPAL,
    TAG_UPSTREAM_WORKLOAD,
};
use proto::pb::envoy::data::accesslog::v3::{
    AccessLogCommon, HttpAccessLogEntry, ResponseFlags, TlsProperties,
    tls_properties::certificate_properties::subject_alt_name::San,
};

/// Istio's value for a label it cannot know.
pub const UNKNOWN: &str = "unknown";

/// The label names of the HTTP families, in Istio's order.
pub const HTTP_LABELS: [&str; 25] = [
    "reporter",
    "source_workload",
    "source_canonical_service",
    "source_canonical_revision",
    "source_workload_namespace",
    "source_principal",
    "source_app",
    "source_version",
    "source_cluster",
    "destination_workload",
    "destination_workload_namespace",
    "destination_principal",
    "destination_app",
    "destination_version",
    "destination_service",
    "destination_service_name",
    "destination_service_namespace",
    "destination_canonical_service",
    "destination_canonical_revision",
    "destination_cluster",
    "request_protocol",
    "response_code",
    "grpc_response_status",
    "response_flags",
    "connection_security_policy",
];

/// The label names of the TCP families: the HTTP ones without
/// `response_code` and `grpc_response_status`, as Istio's.
pub const TCP_LABELS: [&str; 23] = [
    "reporter",
    "source_workload",
    "source_canonical_service",
    "source_canonical_revision",
    "source_workload_namespace",
    "source_principal",
    "source_app",
    "source_version",
    "source_cluster",
    "destination_workload",
    "destination_workload_namespace",
    "destination_principal",
    "destination_app",
    "destination_version",
    "destination_service",
    "destination_service_name",
    "destination_service_namespace",
    "destination_canonical_service",
    "destination_canonical_revision",
    "destination_cluster",
    "request_protocol",
    "response_flags",
    "connection_security_policy",
];

/// One side of a request: a workload as the `source_*`/`destination_*`
/// labels describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// `*_workload`.
    pub workload: String,
    /// `*_workload_namespace`.
    pub namespace: String,
    /// `*_app`.
    pub app: String,
    /// `*_version`.
    pub version: String,
    /// `*_canonical_service`.
    pub canonical_service: String,
    /// `*_canonical_revision`.
    pub canonical_revision: String,
    /// `*_cluster`.
    pub cluster: String,
}

impl Peer {
    /// A peer nothing is known about.
    pub fn unknown() -> Self {
        Self {
            workload: UNKNOWN.into(),
            namespace: UNKNOWN.into(),
            app: UNKNOWN.into(),
            version: UNKNOWN.into(),
            canonical_service: UNKNOWN.into(),
            canonical_revision: UNKNOWN.into(),
            cluster: UNKNOWN.into(),
        }
    }

    /// This proxy's workload, from its node metadata (`WORKLOAD_NAME`,
    /// `NAMESPACE`, `LABELS`, `CLUSTER_ID`).
    pub fn local(metadata: &NodeMetadata) -> Self {
        let or_unknown = |v: Option<&String>| {
            v.filter(|s| !s.is_empty())
                .cloned()
                .unwrap_or_else(|| UNKNOWN.into())
        };
        let labels = metadata.labels.clone().unwrap_or_default();
        let label = |keys: &[&str]| keys.iter().find_map(|k| labels.get(*k).cloned());
        let workload = or_unknown(metadata.workload_name.as_ref());
        Self {
            canonical_service: label(&[
                "service.istio.io/canonical-name",
                "app.kubernetes.io/name",
                "app",
            ])
            .unwrap_or_else(|| workload.clone()),
            canonical_revision: label(&[
                "service.istio.io/canonical-revision",
                "app.kubernetes.io/version",
                "version",
            ])
            .unwrap_or_else(|| "latest".into()),
            app: label(&["app"]).unwrap_or_else(|| UNKNOWN.into()),
            version: label(&["version"]).unwrap_or_else(|| UNKNOWN.into()),
            namespace: or_unknown(metadata.namespace.as_ref()),
            cluster: or_unknown(metadata.cluster_id.as_ref()),
            workload,
        }
    }

    /// The upstream host's `istio.workload` metadata
    /// (`name;namespace;canonical name;canonical revision;cluster`); app
    /// and version are the canonical ones, as Istio reads endpoint metadata.
    pub fn from_workload_metadata(value: &str) -> Option<Self> {
        let parts: Vec<&str> = value.split(';').collect();
        let [name, namespace, canonical, revision, cluster] = parts.as_slice() else {
            return None;
        };
        let v = |s: &str| {
            if s.is_empty() {
                UNKNOWN.to_string()
            } else {
                s.to_string()
            }
        };
        Some(Self {
            workload: v(name),
            namespace: v(namespace),
            app: v(canonical),
            version: v(revision),
            canonical_service: v(canonical),
            canonical_revision: v(revision),
            cluster: v(cluster),
        })
    }
}

/// The `destination_service*` labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationService {
    /// `destination_service`: the host.
    pub host: String,
    /// `destination_service_name`.
    pub name: String,
    /// `destination_service_namespace`.
    pub namespace: String,
}

impl DestinationService {
    /// From the cluster's `istio.services` (the first service), else from
    /// an `outbound|port|subset|host` name, else (passthrough, black hole,
    /// unknown clusters) the cluster's name with the request's authority.
    pub fn of(tags: &HashMap<String, String>, cluster: &str, authority: Option<&str>) -> Self {
        if let Some(svc) = tags
            .get(TAG_CLUSTER_SERVICES)
            .and_then(|json| serde_json::from_str::<Vec<serde_json::Value>>(json).ok())
            .and_then(|list| list.into_iter().next())
        {
            let field = |k: &str| {
                svc.get(k)
                    .and_then(|v| v.as_str())
                    .filter(|s| !s.is_empty())
                    .unwrap_or(UNKNOWN)
                    .to_string()
            };
            return Self {
                host: field("host"),
                name: field("name"),
                namespace: field("namespace"),
            };
        }
        let mut parts = cluster.split('|');
        if let (Some("outbound"), Some(_port), Some(_subset), Some(host)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        {
            let mut labels = host.split('.');
            let (name, namespace) = match (labels.next(), labels.next(), labels.next()) {
                (Some(n), Some(ns), Some("svc")) => (n.to_string(), ns.to_string()),
                _ => (host.to_string(), UNKNOWN.to_string()),
            };
            return Self {
                host: host.to_string(),
                name,
                namespace,
            };
        }
        let host = authority
            .map(|a| a.rsplit_once(':').map(|(h, _)| h).unwrap_or(a))
            .filter(|h| !h.is_empty())
            .unwrap_or(UNKNOWN);
        Self {
            host: host.to_string(),
            name: if cluster.is_empty() {
                UNKNOWN.to_string()
            } else {
                cluster.to_string()
            },
            namespace: UNKNOWN.to_string(),
        }
    }
}

/// The labels both protocols share, for one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Common {
    /// `reporter`.
    pub reporter: Reporter,
    /// `source_*`.
    pub source: Peer,
    /// `source_principal`.
    pub source_principal: String,
    /// `destination_*`.
    pub destination: Peer,
    /// `destination_principal`.
    pub destination_principal: String,
    /// `destination_service*`.
    pub service: DestinationService,
    /// `response_flags`.
    pub response_flags: String,
    /// `connection_security_policy`.
    pub security_policy: &'static str,
}

fn first_uri_san(tls: Option<&TlsProperties>, peer: bool) -> Option<String> {
    let cert = if peer {
        tls?.peer_certificate_properties.as_ref()?
    } else {
        tls?.local_certificate_properties.as_ref()?
    };
    cert.subject_alt_name.iter().find_map(|s| match &s.san {
        Some(San::Uri(uri)) if !uri.is_empty() => Some(uri.clone()),
        _ => None,
    })
}

/// A custom tag's value; Envoy leaves a missing value empty (or `-`).
fn tag<'a>(tags: &'a HashMap<String, String>, name: &str) -> Option<&'a str> {
    tags.get(name)
        .map(String::as_str)
        .filter(|v| !v.is_empty() && *v != "-")
}

/// The first of several comma-separated URI SANs.
fn first_of(list: &str) -> String {
    list.split(',').next().unwrap_or(list).trim().to_string()
}

impl Common {
    /// The labels of an entry's common properties, as `reporter` sees them.
    pub fn of(
        reporter: Reporter,
        local: &Peer,
        common: &AccessLogCommon,
        authority: Option<&str>,
    ) -> Self {
        let tags = &common.custom_tags;
        let service = DestinationService::of(tags, &common.upstream_cluster, authority);
        let response_flags = flags(common.response_flags.as_ref());
        match reporter {
            Reporter::Source => Self {
                reporter,
                source: local.clone(),
                source_principal: tag(tags, TAG_UPSTREAM_LOCAL_PRINCIPAL)
                    .map(first_of)
                    .unwrap_or_else(|| UNKNOWN.into()),
                destination: tag(tags, TAG_UPSTREAM_WORKLOAD)
                    .and_then(Peer::from_workload_metadata)
                    .unwrap_or_else(Peer::unknown),
                destination_principal: tag(tags, TAG_UPSTREAM_PEER_PRINCIPAL)
                    .map(first_of)
                    .unwrap_or_else(|| UNKNOWN.into()),
                service,
                response_flags,
                // Istio's client side does not judge the connection.
                security_policy: UNKNOWN,
            },
            Reporter::Destination => {
                let tls = common.tls_properties.as_ref();
                let peer = first_uri_san(tls, true);
                Self {
                    reporter,
                    source: Peer::unknown(),
                    security_policy: if peer.is_some() { "mutual_tls" } else { "none" },
                    source_principal: peer.unwrap_or_else(|| UNKNOWN.into()),
                    destination: local.clone(),
                    destination_principal: first_uri_san(tls, false)
                        .unwrap_or_else(|| UNKNOWN.into()),
                    service,
                    response_flags,
                }
            }
        }
    }

    /// The label values up to `destination_cluster`, in Istio's order.
    fn values(&self) -> Vec<String> {
        let (s, d) = (&self.source, &self.destination);
        vec![
            self.reporter.as_str().to_string(),
            s.workload.clone(),
            s.canonical_service.clone(),
            s.canonical_revision.clone(),
            s.namespace.clone(),
            self.source_principal.clone(),
            s.app.clone(),
            s.version.clone(),
            s.cluster.clone(),
            d.workload.clone(),
            d.namespace.clone(),
            self.destination_principal.clone(),
            d.app.clone(),
            d.version.clone(),
            self.service.host.clone(),
            self.service.name.clone(),
            self.service.namespace.clone(),
            d.canonical_service.clone(),
            d.canonical_revision.clone(),
            d.cluster.clone(),
        ]
    }

    /// The values of [`TCP_LABELS`].
    pub fn tcp_values(&self) -> Vec<String> {
        let mut v = self.values();
        v.push("tcp".into());
        v.push(self.response_flags.clone());
        v.push(self.security_policy.to_string());
        v
    }
}

/// The values of [`HTTP_LABELS`] for an HTTP entry.
pub fn http_values(reporter: Reporter, local: &Peer, entry: &HttpAccessLogEntry) -> Vec<String> {
    let default = AccessLogCommon::default();
    let common_props = entry.common_properties.as_ref().unwrap_or(&default);
    let request = entry.request.as_ref();
    let authority = request.map(|r| r.authority.as_str());
    let common = Common::of(reporter, local, common_props, authority);
    let grpc = request
        .and_then(|r| r.request_headers.get("content-type"))
        .is_some_and(|ct| ct.starts_with("application/grpc"));
    let response = entry.response.as_ref();
    let code = response
        .and_then(|r| r.response_code)
        .map(|c| c.value)
        .unwrap_or(0);
    let grpc_status = if grpc {
        response
            .and_then(|r| {
                r.response_trailers
                    .get("grpc-status")
                    .or_else(|| r.response_headers.get("grpc-status"))
            })
            .cloned()
            .unwrap_or_default()
    } else {
        String::new()
    };
    let mut v = common.values();
    v.push(if grpc { "grpc" } else { "http" }.into());
    v.push(code.to_string());
    v.push(grpc_status);
    v.push(common.response_flags);
    v.push(common.security_policy.to_string());
    v
}

/// Envoy's short response flags (`UH,UF`), `-` when none, in Envoy's order.
pub fn flags(f: Option<&ResponseFlags>) -> String {
    let Some(f) = f else {
        return "-".into();
    };
    let all = [
        (f.failed_local_healthcheck, "LH"),
        (f.no_healthy_upstream, "UH"),
        (f.upstream_request_timeout, "UT"),
        (f.local_reset, "LR"),
        (f.upstream_remote_reset, "UR"),
        (f.upstream_connection_failure, "UF"),
        (f.upstream_connection_termination, "UC"),
        (f.upstream_overflow, "UO"),
        (f.no_route_found, "NR"),
        (f.delay_injected, "DI"),
        (f.fault_injected, "FI"),
        (f.rate_limited, "RL"),
        (f.unauthorized_details.is_some(), "UAEX"),
        (f.rate_limit_service_error, "RLSE"),
        (f.downstream_connection_termination, "DC"),
        (f.upstream_retry_limit_exceeded, "URX"),
        (f.stream_idle_timeout, "SI"),
        (f.invalid_envoy_request_headers, "IH"),
        (f.downstream_protocol_error, "DPE"),
        (f.upstream_max_stream_duration_reached, "UMSDR"),
        (f.response_from_cache_filter, "RFCF"),
        (f.no_filter_config_found, "NFCF"),
        (f.duration_timeout, "DT"),
        (f.upstream_protocol_error, "UPE"),
        (f.no_cluster_found, "NC"),
        (f.overload_manager, "OM"),
        (f.dns_resolution_failure, "DF"),
        (f.downstream_remote_reset, "DR"),
    ];
    let set: Vec<&str> = all.iter().filter(|(on, _)| *on).map(|(_, s)| *s).collect();
    if set.is_empty() {
        "-".into()
    } else {
        set.join(",")
    }
}
