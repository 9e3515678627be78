//! The bootstrap's static listeners: Prometheus (`ENVOY_PROMETHEUS_PORT`),
//! the optional mTLS metrics listeners, and the health listener
//! (`ENVOY_STATUS_PORT`) that forwards `/healthz/ready` to the agent.

use prost::Name;
use proto::pb::envoy::extensions::compression::brotli::compressor::v3::Brotli;
use proto::pb::envoy::extensions::compression::gzip::compressor::v3::Gzip;
use proto::pb::envoy::extensions::compression::zstd::compressor::v3::Zstd;
use proto::pb::envoy::extensions::filters::http::compressor::v3::Compressor;
use proto::pb::envoy::extensions::filters::http::router::v3::Router;
use proto::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use proto::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
use serde_json::{Map, Value, json};

use super::tls::sds_secret;
use super::{BootstrapOptions, Family};
use common::xds::{SDS_ROOT_SECRET, SDS_WORKLOAD_SECRET};

fn router() -> Value {
    json!({"name": "envoy.filters.http.router", "typed_config": {"@type": Router::type_url()}})
}

/// An HTTP connection manager routing path prefixes to clusters.
fn http_connection_manager(
    stat_prefix: &str,
    routes: &[(&str, &str)],
    filters: Vec<Value>,
) -> Value {
    let routes: Vec<Value> = routes
        .iter()
        .map(
            |(prefix, cluster)| json!({"match": {"prefix": prefix}, "route": {"cluster": cluster}}),
        )
        .collect();
    json!({
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": HttpConnectionManager::type_url(),
            "codec_type": "AUTO",
            "stat_prefix": stat_prefix,
            "route_config": {
                "virtual_hosts": [{"name": "backend", "domains": ["*"], "routes": routes}]
            },
            "http_filters": filters
        }
    })
}

/// A response compressor for `algorithm` with the library `L` (brotli, zstd, gzip).
fn compressor<L: Name>(algorithm: &str) -> Value {
    json!({
        "name": format!("envoy.filters.http.compressor.{algorithm}"),
        "typed_config": {
            "@type": Compressor::type_url(),
            "compressor_library": {
                "name": format!("stats_{algorithm}"),
                "typed_config": {"@type": L::type_url()}
            },
            "response_direction_config": {
                "common_config": {
                    "content_type": [
                        "text/plain",
                        "application/vnd.google.protobuf",
                        "application/openmetrics-text",
                        "application/openmetrics-protobuf"
                    ]
                }
            }
        }
    })
}

/// A listener the kubelet or Prometheus reach; exempt from the connection
/// limit and the overload manager so probes and scrapes work under load.
fn admin_listener(family: &Family, port: u16, mut extra: Map<String, Value>) -> Value {
    let mut listener = Map::new();
    listener.insert("name".into(), json!(format!("{}_{port}", family.wildcard)));
    listener.insert(
        "address".into(),
        json!({"socket_address": {"protocol": "TCP", "address": family.wildcard, "port_value": port}}),
    );
    listener.insert("ignore_global_conn_limit".into(), json!(true));
    listener.insert("bypass_overload_manager".into(), json!(true));
    listener.append(&mut extra);
    Value::Object(listener)
}

/// A metrics listener requiring a client certificate from the mesh
/// (the workload certificate and trust bundle from the agent's SDS).
fn secure_metrics_listener(
    family: &Family,
    port: u16,
    stat_prefix: &str,
    routes: &[(&str, &str)],
) -> Value {
    let mut extra = Map::new();
    extra.insert(
        "listener_filters".into(),
        json!([{
            "name": "envoy.filters.listener.tls_inspector",
            "typed_config": {"@type": TlsInspector::type_url()}
        }]),
    );
    extra.insert(
        "filter_chains".into(),
        json!([{
            "filter_chain_match": {"transport_protocol": "tls"},
            "transport_socket": {
                "name": "envoy.transport_sockets.tls",
                "typed_config": {
                    "@type": DownstreamTlsContext::type_url(),
                    "require_client_certificate": true,
                    "common_tls_context": {
                        "tls_certificate_sds_secret_configs": [sds_secret(SDS_WORKLOAD_SECRET)],
                        "combined_validation_context": {
                            "default_validation_context": {},
                            "validation_context_sds_secret_config": sds_secret(SDS_ROOT_SECRET)
                        }
                    }
                }
            },
            "filters": [http_connection_manager(stat_prefix, routes, vec![router()])]
        }]),
    );
    admin_listener(family, port, extra)
}

/// The static listeners.
pub(super) fn listeners(opts: &BootstrapOptions, family: &Family) -> Vec<Value> {
    let mut prometheus_filters = Vec::new();
    if opts.stats_compression {
        prometheus_filters.extend([
            compressor::<Brotli>("brotli"),
            compressor::<Zstd>("zstd"),
            compressor::<Gzip>("gzip"),
        ]);
    }
    prometheus_filters.push(router());
    let chains = |hcm: Value| {
        let mut m = Map::new();
        m.insert("filter_chains".into(), json!([{"filters": [hcm]}]));
        m
    };
    let mut listeners = vec![admin_listener(
        family,
        opts.envoy_prometheus_port,
        chains(http_connection_manager(
            "stats",
            &[("/stats/prometheus", "prometheus_stats")],
            prometheus_filters,
        )),
    )];
    if opts.envoy_secure_metrics_port != 0 {
        listeners.push(secure_metrics_listener(
            family,
            opts.envoy_secure_metrics_port,
            "secure_stats",
            &[("/stats/prometheus", "prometheus_stats")],
        ));
    }
    if opts.envoy_secure_merged_metrics_port != 0 {
        listeners.push(secure_metrics_listener(
            family,
            opts.envoy_secure_merged_metrics_port,
            "secure_merged_stats",
            &[("/stats/prometheus", "agent"), ("/metrics", "agent")],
        ));
    }
    listeners.push(admin_listener(
        family,
        opts.envoy_status_port,
        chains(http_connection_manager(
            "agent",
            &[("/healthz/ready", "agent")],
            vec![router()],
        )),
    ));
    listeners
}
