//! What istiod's access-log generator and the agent's aggregation of Istio's
//! standard metrics agree on: the gRPC access log service Envoy streams
//! per-request and per-connection entries to (its bootstrap cluster and Unix
//! socket), the log names carrying the reporter, and the custom tags that
//! carry the metadata Istio's stats filter reads (upstream host and cluster
//! metadata).
//!
//! Upstream Envoy has no `istio.stats` filter: each sidecar's Envoy reports
//! entries to its own agent, which keeps the `istio_*` metric families.

/// The bootstrap's static cluster of the agent's access log service.
pub const ALS_CLUSTER: &str = "istio-agent-als";

/// The socket file of the agent's access log service, next to the SDS
/// socket (`./var/run/secrets/workload-spiffe-uds/`), relative to the
/// agent's working directory as Envoy's bootstrap names it.
pub const ALS_SOCKET: &str = "./var/run/secrets/workload-spiffe-uds/als";

/// Who reports a metric (Istio's `reporter` label): the client side of a
/// request (sidecar outbound, gateways) or its server side (sidecar inbound).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reporter {
    /// `source`: sidecar outbound traffic and gateways.
    Source,
    /// `destination`: sidecar inbound traffic.
    Destination,
}

impl Reporter {
    /// Istio's label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reporter::Source => "source",
            Reporter::Destination => "destination",
        }
    }

    /// The access log's `log_name` for HTTP entries of this reporter.
    pub fn http_log_name(self) -> &'static str {
        match self {
            Reporter::Source => "istio-stats-http-source",
            Reporter::Destination => "istio-stats-http-destination",
        }
    }

    /// The access log's `log_name` for TCP entries of this reporter.
    pub fn tcp_log_name(self) -> &'static str {
        match self {
            Reporter::Source => "istio-stats-tcp-source",
            Reporter::Destination => "istio-stats-tcp-destination",
        }
    }

    /// The reporter a `log_name` stands for, whatever its protocol.
    pub fn from_log_name(name: &str) -> Option<Reporter> {
        [Reporter::Source, Reporter::Destination]
            .into_iter()
            .find(|r| r.http_log_name() == name || r.tcp_log_name() == name)
    }
}

/// Custom tag: the upstream host's `istio` filter metadata `workload`
/// (`name;namespace;canonical name;canonical revision;cluster`).
pub const TAG_UPSTREAM_WORKLOAD: &str = "istio.upstream_workload";
/// Custom tag: the upstream cluster's `istio` filter metadata `services`
/// (a JSON list of `{host, name, namespace}`).
pub const TAG_CLUSTER_SERVICES: &str = "istio.cluster_services";
/// Custom tag: the URI SAN of the upstream's certificate (mTLS to it).
pub const TAG_UPSTREAM_PEER_PRINCIPAL: &str = "istio.upstream_peer_principal";
/// Custom tag: the URI SAN of the certificate this proxy showed upstream.
pub const TAG_UPSTREAM_LOCAL_PRINCIPAL: &str = "istio.upstream_local_principal";

/// The custom tags, each with the Envoy access log format that fills it.
pub const CUSTOM_TAGS: &[(&str, &str)] = &[
    (TAG_UPSTREAM_WORKLOAD, "%UPSTREAM_METADATA(istio:workload)%"),
    (TAG_CLUSTER_SERVICES, "%CLUSTER_METADATA(istio:services)%"),
    (TAG_UPSTREAM_PEER_PRINCIPAL, "%UPSTREAM_PEER_URI_SAN%"),
    (TAG_UPSTREAM_LOCAL_PRINCIPAL, "%UPSTREAM_LOCAL_URI_SAN%"),
];

/// Request headers the HTTP entries carry: `content-type` tells gRPC.
pub const LOGGED_REQUEST_HEADERS: &[&str] = &["content-type"];
/// Response headers and trailers the HTTP entries carry: `grpc-status`.
pub const LOGGED_RESPONSE_HEADERS: &[&str] = &["grpc-status"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_names_map_back_to_their_reporter() {
        for r in [Reporter::Source, Reporter::Destination] {
            assert_eq!(Reporter::from_log_name(r.http_log_name()), Some(r));
            assert_eq!(Reporter::from_log_name(r.tcp_log_name()), Some(r));
        }
        assert_eq!(Reporter::from_log_name("other"), None);
    }
}
