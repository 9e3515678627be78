//! The bootstrap's static clusters: Envoy's own stats, the agent (status
//! port), the agent's SDS, access log and xDS sockets, and the optional telemetry
//! services (zipkin, metrics service, access log service).

use common::NodeMetadata;
use common::istio_stats::{ALS_CLUSTER, ALS_SOCKET};
use prost::Name;
use proto::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use serde_json::{Value, json};

use super::tls::{RemoteService, SDS_CLUSTER, upstream_tls};
use super::{BootstrapOptions, Family};
use crate::config::SDS_SOCKET_DIR;

fn load_assignment(cluster: &str, address: Value) -> Value {
    json!({
        "cluster_name": cluster,
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}]
    })
}

/// `typed_extension_protocol_options` forcing HTTP/2 (gRPC upstreams).
fn http2_options() -> Value {
    json!({
        (HttpProtocolOptions::full_name()): {
            "@type": HttpProtocolOptions::type_url(),
            "explicit_http_config": {"http2_protocol_options": {}}
        }
    })
}

fn local_tcp(family: &Family, port: u16) -> Value {
    json!({"socket_address": {"protocol": "TCP", "address": family.localhost, "port_value": port}})
}

fn pipe(path: &str) -> Value {
    json!({"pipe": {"path": path}})
}

/// The static clusters; `metadata` may override the telemetry services' TLS files.
pub(super) fn clusters(
    opts: &BootstrapOptions,
    family: &Family,
    metadata: &NodeMetadata,
) -> Vec<Value> {
    let xds_path = opts.config_path.join("XDS");
    let sds_path = format!("{SDS_SOCKET_DIR}/{}", opts.workload_identity_socket_file);
    let mut clusters = vec![
        json!({
            "name": "prometheus_stats",
            "alt_stat_name": "prometheus_stats;",
            "type": "STATIC",
            "connect_timeout": "0.250s",
            "lb_policy": "ROUND_ROBIN",
            "load_assignment": load_assignment("prometheus_stats", local_tcp(family, opts.proxy_admin_port))
        }),
        json!({
            "name": "agent",
            "alt_stat_name": "agent;",
            "type": "STATIC",
            "connect_timeout": "0.250s",
            "lb_policy": "ROUND_ROBIN",
            "load_assignment": load_assignment("agent", local_tcp(family, opts.status_port))
        }),
        json!({
            "name": SDS_CLUSTER,
            "alt_stat_name": "sds-grpc;",
            "type": "STATIC",
            "typed_extension_protocol_options": http2_options(),
            "connect_timeout": "1s",
            "lb_policy": "ROUND_ROBIN",
            "load_assignment": load_assignment(SDS_CLUSTER, pipe(&sds_path))
        }),
        // The agent's access log service, which keeps Istio's standard
        // metrics from the entries Envoy streams to it.
        json!({
            "name": ALS_CLUSTER,
            "alt_stat_name": format!("{ALS_CLUSTER};"),
            "type": "STATIC",
            "typed_extension_protocol_options": http2_options(),
            "connect_timeout": "1s",
            "lb_policy": "ROUND_ROBIN",
            "load_assignment": load_assignment(ALS_CLUSTER, pipe(ALS_SOCKET))
        }),
        json!({
            "name": "xds-grpc",
            "alt_stat_name": "xds-grpc;",
            "type": "STATIC",
            "connect_timeout": "1s",
            "lb_policy": "ROUND_ROBIN",
            "load_assignment": load_assignment("xds-grpc", pipe(&xds_path.to_string_lossy())),
            "circuit_breakers": {
                "thresholds": [
                    {"priority": "DEFAULT", "max_connections": 100000, "max_pending_requests": 100000, "max_requests": 100000},
                    {"priority": "HIGH", "max_connections": 100000, "max_pending_requests": 100000, "max_requests": 100000}
                ]
            },
            "upstream_connection_options": {"tcp_keepalive": {"keepalive_time": 300}},
            // One stream per connection: the agent's xDS proxy is the multiplexer.
            "max_requests_per_connection": 1,
            "typed_extension_protocol_options": http2_options()
        }),
    ];
    if let Some(zipkin) = &opts.zipkin_address {
        clusters.push(json!({
            "name": "zipkin",
            "alt_stat_name": "zipkin;",
            "type": "STRICT_DNS",
            "respect_dns_ttl": true,
            "dns_lookup_family": family.dns_lookup_family,
            "dns_refresh_rate": "30s",
            "connect_timeout": "1s",
            "lb_policy": "ROUND_ROBIN",
            "load_assignment": load_assignment("zipkin", json!({"socket_address": zipkin.socket_address()}))
        }));
    }
    for (name, service) in [
        ("envoy_metrics_service", &opts.envoy_metrics_service),
        ("envoy_accesslog_service", &opts.envoy_access_log_service),
    ] {
        if let Some(service) = service {
            clusters.push(grpc_service_cluster(name, service, metadata, family));
        }
    }
    clusters
}

fn grpc_service_cluster(
    name: &str,
    service: &RemoteService,
    metadata: &NodeMetadata,
    family: &Family,
) -> Value {
    let mut cluster = json!({
        "name": name,
        "alt_stat_name": format!("{name};"),
        "type": "STRICT_DNS",
        "respect_dns_ttl": true,
        "dns_lookup_family": family.dns_lookup_family,
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "typed_extension_protocol_options": http2_options(),
        "load_assignment": load_assignment(name, json!({"socket_address": service.address.socket_address()}))
    });
    if let Some(tls) = &service.tls
        && let Some(socket) = upstream_tls(tls, name, metadata)
        && let Some(obj) = cluster.as_object_mut()
    {
        obj.insert("transport_socket".into(), socket);
    }
    cluster
}
