//! The Envoy bootstrap the agent writes before starting Envoy: what Istio's
//! template `tools/packaging/common/envoy_bootstrap.json` renders, built here
//! from typed options instead of a text template, and the node metadata
//! (`pkg/bootstrap/config.go GetNodeMetaData`) that goes into it.
//!
//! Why not a template engine or the `envoy-types` protos: Istio's template is
//! Go `text/template` with sprig, which no Rust crate reproduces, and the
//! prost types of `envoy-types` carry no protojson serialisation. Building the
//! document with `serde_json::json!` keeps the structure visible next to
//! Istio's and lets the output be compared with Istio's goldens as JSON. The
//! `@type` of each typed config comes from the `envoy-types` message's name.
//!
//! The rooms: this module holds the options and the top-level document;
//! `metadata` the node metadata (typed, [`common::NodeMetadata`]) and the
//! node's cluster and locality; `clusters`, `listeners` and `stats` the
//! static resources and stats config; `tls` the upstream TLS of the
//! telemetry services.
//!
//! What is not rendered, and why:
//! - the `metadata_discovery` bootstrap extension (`istio.workload.BootstrapExtension`,
//!   with its `workload_discovery` stats prefix) exists only in Istio's Envoy
//!   build; upstream Envoy rejects the bootstrap with it;
//! - lightstep, datadog and the other tracers (only zipkin is supported);
//! - LRS (`load_stats_config`), the `local_cluster` for self discovery, the
//!   `sds-files-grpc` cluster, dual-stack additional addresses, the proxy
//!   protocol filter on the status port, histogram buckets and the stats
//!   flush/eviction intervals: none is used by this agent yet.

mod clusters;
mod listeners;
mod metadata;
mod stats;
mod tls;

use std::collections::BTreeMap;
use std::path::PathBuf;

use prost::Name;
use proto::pb::envoy::config::trace::v3::ZipkinConfig;
use proto::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog;
use proto::pb::envoy::extensions::bootstrap::internal_listener::v3::InternalListener;
use proto::pb::envoy::extensions::resource_monitors::downstream_connections::v3::DownstreamConnectionsConfig;
use serde_json::{Map, Value, json};

pub use metadata::{
    AsNodeMetadata, ClusterName, ISTIO_META_PREFIX, ISTIO_METAJSON_LABELS, ISTIO_METAJSON_PREFIX,
    LOCALITY_LABEL, Locality, MetadataInputs, POD_TEMPLATE_HASH_LABEL, TOPOLOGY_LOCALITY_LABEL,
    TracingServiceName, build_node_metadata, node_locality, node_metadata, service_cluster,
};
pub use stats::StatsInclusion;
pub use tls::{ClientTls, RemoteService, TlsMode};

use metadata::DEFAULT_SERVICE_CLUSTER;

/// Whether every Pod IP is IPv6, which picks the bootstrap's address family
/// (defined with the Pod's configuration, which needs it too).
pub use crate::config::all_ipv6;

/// `ProxyConfig.proxyAdminPort` default: the Envoy admin port.
pub const DEFAULT_PROXY_ADMIN_PORT: u16 = 15000;
/// `ProxyConfig.statusPort` default: the agent's status server.
pub const DEFAULT_STATUS_PORT: u16 = 15020;
/// `ENVOY_STATUS_PORT` default: Envoy's health listener.
pub const DEFAULT_ENVOY_STATUS_PORT: u16 = 15021;
/// `ENVOY_PROMETHEUS_PORT` default: Envoy's Prometheus listener.
pub const DEFAULT_ENVOY_PROMETHEUS_PORT: u16 = 15090;
/// `ProxyConfig.configPath` default: where `envoy-rev.json` and the `XDS` socket live.
pub const DEFAULT_CONFIG_PATH: &str = "./etc/istio/proxy";
/// `WORKLOAD_IDENTITY_SOCKET_FILE` default: the SDS socket file name.
pub const DEFAULT_WORKLOAD_IDENTITY_SOCKET_FILE: &str = "socket";
/// Istio's default overload-manager limit on downstream connections (MaxInt32).
pub const DEFAULT_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS: u64 = 2_147_483_647;
/// `proxyMetadata` key for the downstream connection limit.
pub const META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS: &str =
    "ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS";
/// Runtime flag for the downstream connection limit (`ProxyConfig.runtimeValues`).
pub const RUNTIME_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS: &str =
    "overload.global_downstream_max_connections";

/// Errors building bootstrap inputs.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// An address that is not `host:port`.
    #[error("invalid {what} address {addr:?}: {reason}; use host:port ([host]:port for IPv6)")]
    InvalidAddress {
        /// Which setting held the address.
        what: &'static str,
        /// The address as given.
        addr: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// A `host:port` address, as Istio's `addressConverter` splits it for an
/// Envoy `socket_address`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// Host name or IP (IPv6 without brackets).
    pub host: String,
    /// Port.
    pub port: u16,
}

impl HostPort {
    /// Parses `host:port` or `[v6]:port`; `what` names the setting in errors.
    /// Istio's `$(HOST_IP)` substitution in tracer addresses is the caller's job.
    pub fn parse(what: &'static str, addr: &str) -> Result<Self, BootstrapError> {
        let err = |reason| BootstrapError::InvalidAddress {
            what,
            addr: addr.to_string(),
            reason,
        };
        let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
            rest.split_once("]:")
                .ok_or_else(|| err("missing ]: after an IPv6 host"))?
        } else {
            let (h, p) = addr.rsplit_once(':').ok_or_else(|| err("missing port"))?;
            if h.contains(':') {
                return Err(err("too many colons"));
            }
            (h, p)
        };
        if host.is_empty() {
            return Err(err("missing host"));
        }
        let port = port
            .parse()
            .map_err(|_| err("port is not a number 0-65535"))?;
        Ok(Self {
            host: host.to_string(),
            port,
        })
    }

    fn socket_address(&self) -> Value {
        json!({"address": self.host, "port_value": self.port})
    }
}

/// `ads_config.api_type`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum XdsApiType {
    /// Incremental xDS (`ISTIO_DELTA_XDS=true`, Istio's default).
    #[default]
    DeltaGrpc,
    /// State of the world.
    Grpc,
}

impl XdsApiType {
    /// From `ISTIO_DELTA_XDS`.
    pub fn from_delta(delta: bool) -> Self {
        if delta { Self::DeltaGrpc } else { Self::Grpc }
    }

    /// Envoy's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DeltaGrpc => "DELTA_GRPC",
            Self::Grpc => "GRPC",
        }
    }
}

/// Everything the bootstrap template needs.
#[derive(Debug, Clone)]
pub struct BootstrapOptions {
    /// `node.id`: `TYPE~IP~POD.NAMESPACE~DOMAIN`.
    pub node_id: String,
    /// `node.cluster` (see [`service_cluster`]).
    pub cluster: String,
    /// `node.locality` (see [`node_locality`]; else the platform's).
    pub locality: Locality,
    /// `node.metadata`, as [`node_metadata`] builds it.
    pub metadata: Map<String, Value>,
    /// `ProxyConfig.proxyAdminPort`: Envoy admin, also behind `prometheus_stats`.
    pub proxy_admin_port: u16,
    /// `ProxyConfig.statusPort`: the agent, behind cluster `agent`.
    pub status_port: u16,
    /// `ENVOY_STATUS_PORT`: the `/healthz/ready` listener.
    pub envoy_status_port: u16,
    /// `ENVOY_PROMETHEUS_PORT`: the `/stats/prometheus` listener.
    pub envoy_prometheus_port: u16,
    /// `ENVOY_SECURE_METRICS_PORT`: mTLS listener for Envoy's stats; 0 = off.
    pub envoy_secure_metrics_port: u16,
    /// `ENVOY_SECURE_MERGED_METRICS_PORT`: mTLS listener for the agent's merged stats; 0 = off.
    pub envoy_secure_merged_metrics_port: u16,
    /// `ProxyConfig.configPath`: the `xds-grpc` cluster dials `<configPath>/XDS`.
    pub config_path: PathBuf,
    /// `WORKLOAD_IDENTITY_SOCKET_FILE`: SDS socket name under `./var/run/secrets/workload-spiffe-uds/`.
    pub workload_identity_socket_file: String,
    /// `ISTIO_DELTA_XDS`: ADS flavour.
    pub xds_api_type: XdsApiType,
    /// Every instance IP is IPv6 (see [`all_ipv6`]): `::1`/`::` and `V6_ONLY`
    /// instead of `127.0.0.1`/`0.0.0.0` and `V4_ONLY`.
    pub all_ipv6: bool,
    /// `--outlierLogPath`: outlier detection event log; none when empty.
    pub outlier_log_path: String,
    /// `ProxyConfig.statsdUdpAddress`, already resolved: adds the statsd sink.
    pub statsd_address: Option<HostPort>,
    /// `ProxyConfig.tracing.zipkin.address`: adds the `zipkin` cluster and tracer.
    pub zipkin_address: Option<HostPort>,
    /// `ProxyConfig.envoyMetricsService`: adds the cluster and the metrics-service sink.
    pub envoy_metrics_service: Option<RemoteService>,
    /// `ProxyConfig.envoyAccessLogService`: adds the cluster (istiod configures the logger).
    pub envoy_access_log_service: Option<RemoteService>,
    /// Extra stats to keep.
    pub stats_inclusion: StatsInclusion,
    /// `ProxyConfig.extraStatTags` and annotation `sidecar.istio.io/extraStatTags`.
    pub extra_stat_tags: Vec<String>,
    /// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`: keeps `downstream_cx_active`, which draining polls.
    pub exit_on_zero_active_connections: bool,
    /// Overload-manager downstream connection limit (see [`global_downstream_max_connections`]).
    pub global_downstream_max_connections: u64,
    /// `ProxyConfig.runtimeValues`: `""` removes a default flag, `"true"`/`"false"` become booleans.
    pub runtime_values: BTreeMap<String, String>,
    /// Compress `/stats/prometheus` (brotli, zstd, gzip); Istio's default is on.
    pub stats_compression: bool,
    /// `--log_as_json`: Envoy's application log as JSON.
    pub log_as_json: bool,
}

impl Default for BootstrapOptions {
    fn default() -> Self {
        Self {
            node_id: String::new(),
            cluster: DEFAULT_SERVICE_CLUSTER.to_string(),
            locality: Locality::default(),
            metadata: Map::new(),
            proxy_admin_port: DEFAULT_PROXY_ADMIN_PORT,
            status_port: DEFAULT_STATUS_PORT,
            envoy_status_port: DEFAULT_ENVOY_STATUS_PORT,
            envoy_prometheus_port: DEFAULT_ENVOY_PROMETHEUS_PORT,
            envoy_secure_metrics_port: 0,
            envoy_secure_merged_metrics_port: 0,
            config_path: PathBuf::from(DEFAULT_CONFIG_PATH),
            workload_identity_socket_file: DEFAULT_WORKLOAD_IDENTITY_SOCKET_FILE.to_string(),
            xds_api_type: XdsApiType::DeltaGrpc,
            all_ipv6: false,
            outlier_log_path: String::new(),
            statsd_address: None,
            zipkin_address: None,
            envoy_metrics_service: None,
            envoy_access_log_service: None,
            stats_inclusion: StatsInclusion::default(),
            extra_stat_tags: Vec::new(),
            exit_on_zero_active_connections: false,
            global_downstream_max_connections: DEFAULT_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS,
            runtime_values: BTreeMap::new(),
            stats_compression: true,
            log_as_json: false,
        }
    }
}

/// Address spellings that depend on the IP family.
struct Family {
    localhost: &'static str,
    wildcard: &'static str,
    dns_lookup_family: &'static str,
}

impl Family {
    fn of(all_ipv6: bool) -> Self {
        if all_ipv6 {
            Self {
                localhost: "::1",
                wildcard: "::",
                dns_lookup_family: "V6_ONLY",
            }
        } else {
            Self {
                localhost: "127.0.0.1",
                wildcard: "0.0.0.0",
                dns_lookup_family: "V4_ONLY",
            }
        }
    }
}

/// Renders the bootstrap. Top-level keys follow the template; the result is
/// what Envoy reads from `<configPath>/envoy-rev.json`.
pub fn render(opts: &BootstrapOptions) -> Value {
    let family = Family::of(opts.all_ipv6);
    // The renderer reads a few metadata values back (instance IPs, the
    // `TLS_CLIENT_*` overrides): typed, from the object the node carries.
    let metadata = opts.metadata.as_node_metadata();
    let mut root = Map::new();
    root.insert(
        "application_log_config".into(),
        application_log_config(opts.log_as_json),
    );
    root.insert("node".into(), node(opts));
    root.insert(
        "layered_runtime".into(),
        json!({
            "layers": [
                {"name": "global config", "static_layer": runtime_flags(&opts.runtime_values)},
                {"name": "admin", "admin_layer": {}}
            ]
        }),
    );
    root.insert(
        "bootstrap_extensions".into(),
        json!([{
            "name": "envoy.bootstrap.internal_listener",
            "typed_config": {
                // Istio's template wraps it in the legacy TypedStruct, which
                // `envoy-types` does not compile.
                "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
                "type_url": InternalListener::type_url(),
                "value": {"buffer_size_kb": 64}
            }
        }]),
    );
    root.insert("stats_config".into(), stats::stats_config(opts, &metadata));
    root.insert(
        "admin".into(),
        json!({
            "access_log": [{
                "name": "envoy.access_loggers.file",
                "typed_config": {
                    "@type": FileAccessLog::type_url(),
                    "path": "/dev/null"
                }
            }],
            "profile_path": "/var/lib/istio/data/envoy.prof",
            "address": {"socket_address": {"address": family.localhost, "port_value": opts.proxy_admin_port}}
        }),
    );
    let ads = json!({"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"});
    root.insert(
        "dynamic_resources".into(),
        json!({
            "lds_config": ads,
            "cds_config": ads,
            "ads_config": {
                "api_type": opts.xds_api_type.as_str(),
                "set_node_on_first_message_only": true,
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}]
            }
        }),
    );
    root.insert(
        "static_resources".into(),
        json!({
            "clusters": clusters::clusters(opts, &family, &metadata),
            "listeners": listeners::listeners(opts, &family)
        }),
    );
    root.insert(
        "overload_manager".into(),
        json!({
            "resource_monitors": [{
                "name": "envoy.resource_monitors.global_downstream_max_connections",
                "typed_config": {
                    "@type": DownstreamConnectionsConfig::type_url(),
                    "max_active_downstream_connections": opts.global_downstream_max_connections
                }
            }]
        }),
    );
    if opts.zipkin_address.is_some() {
        root.insert(
            "tracing".into(),
            json!({
                "http": {
                    "name": "envoy.tracers.zipkin",
                    "typed_config": {
                        "@type": ZipkinConfig::type_url(),
                        "collector_cluster": "zipkin",
                        "collector_endpoint": "/api/v2/spans",
                        "collector_endpoint_version": "HTTP_JSON",
                        "trace_id_128bit": true,
                        "shared_span_context": false
                    }
                }
            }),
        );
    }
    let sinks = stats::stats_sinks(opts);
    if !sinks.is_empty() {
        root.insert("stats_sinks".into(), Value::Array(sinks));
    }
    // Istio emits `cluster_manager` with deferred cluster creation on even
    // without an outlier log path (as generated `envoy-rev.json` files show).
    let mut cluster_manager = Map::new();
    if !opts.outlier_log_path.is_empty() {
        cluster_manager.insert(
            "outlier_detection".into(),
            json!({"event_log_path": opts.outlier_log_path}),
        );
    }
    cluster_manager.insert("enable_deferred_cluster_creation".into(), Value::Bool(true));
    root.insert("cluster_manager".into(), Value::Object(cluster_manager));
    root.insert(
        "deferred_stat_options".into(),
        json!({"enable_deferred_creation_stats": true}),
    );
    Value::Object(root)
}

fn application_log_config(log_as_json: bool) -> Value {
    // The same fields as Istio's own log lines, so both logs parse alike.
    let format = if log_as_json {
        json!({"json_format": {
            "time": "%Y-%m-%dT%T.%fZ",
            "level": "%l",
            "scope": "envoy %n",
            "msg": "%j",
            "caller": "%g:%#",
            "thread": "%t"
        }})
    } else {
        json!({"text_format": "%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t"})
    };
    json!({"log_format": format})
}

fn node(opts: &BootstrapOptions) -> Value {
    let mut locality = Map::new();
    for (key, value) in [
        ("region", &opts.locality.region),
        ("zone", &opts.locality.zone),
        ("sub_zone", &opts.locality.sub_zone),
    ] {
        if !value.is_empty() {
            locality.insert(key.into(), Value::String(value.clone()));
        }
    }
    json!({
        "id": opts.node_id,
        "cluster": opts.cluster,
        "locality": locality,
        "metadata": opts.metadata
    })
}

/// Istio's default runtime flags overlaid with `ProxyConfig.runtimeValues`.
fn runtime_flags(overrides: &BTreeMap<String, String>) -> Map<String, Value> {
    let mut flags = Map::new();
    flags.insert("re2.max_program_size.error_level".into(), json!("32768"));
    flags.insert(
        "envoy.deprecated_features:envoy.config.listener.v3.Listener.hidden_envoy_deprecated_use_original_dst".into(),
        json!(true),
    );
    flags.insert(
        "envoy.reloadable_features.http_reject_path_with_fragment".into(),
        json!(false),
    );
    flags.insert(
        "envoy.reloadable_features.fixed_heap_use_allocated".into(),
        json!(true),
    );
    flags.insert(
        "envoy.reloadable_features.coalesce_lb_rebuilds_on_batch_update".into(),
        json!(false),
    );
    for (key, value) in overrides {
        match value.as_str() {
            // The API only has strings; "" is how a user removes a default.
            "" => {
                flags.remove(key);
            }
            // Envoy no longer reads "true"/"false" strings as booleans.
            "true" => {
                flags.insert(key.clone(), json!(true));
            }
            "false" => {
                flags.insert(key.clone(), json!(false));
            }
            other => {
                flags.insert(key.clone(), json!(other));
            }
        }
    }
    flags
}

/// The overload-manager connection limit, by Istio's precedence:
/// `ProxyConfig.connectionSettings.globalDownstreamConnectionLimit`, then
/// `proxyMetadata` `ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS`, then the
/// runtime value `overload.global_downstream_max_connections`, then MaxInt32.
/// Values that are not numbers are skipped with a warning.
pub fn global_downstream_max_connections(
    connection_limit: Option<u64>,
    proxy_metadata: &BTreeMap<String, String>,
    runtime_values: &BTreeMap<String, String>,
) -> u64 {
    if let Some(limit) = connection_limit {
        return limit;
    }
    for (source, value) in [
        (
            META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS,
            proxy_metadata.get(META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS),
        ),
        (
            RUNTIME_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS,
            runtime_values.get(RUNTIME_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS),
        ),
    ] {
        if let Some(value) = value.filter(|v| !v.is_empty()) {
            match value.parse() {
                Ok(n) => return n,
                Err(_) => tracing::warn!(%source, %value, "not a connection count; ignored"),
            }
        }
    }
    DEFAULT_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port() {
        let hp = HostPort::parse("statsd", "10.1.1.1:9125").unwrap();
        assert_eq!((hp.host.as_str(), hp.port), ("10.1.1.1", 9125));
        let hp = HostPort::parse("zipkin", "[::1]:9411").unwrap();
        assert_eq!((hp.host.as_str(), hp.port), ("::1", 9411));
        for bad in ["zipkin", "::1:9411", "host:port", ":9411", "h:70000"] {
            let err = HostPort::parse("zipkin", bad).unwrap_err().to_string();
            assert!(err.contains("zipkin") && err.contains(bad), "{err}");
        }
    }

    #[test]
    fn connection_limit_precedence() {
        let map = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        let meta = map(META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS, "100");
        let runtime = map(RUNTIME_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS, "200");
        let none = BTreeMap::new();
        assert_eq!(
            global_downstream_max_connections(Some(50), &meta, &runtime),
            50
        );
        assert_eq!(
            global_downstream_max_connections(None, &meta, &runtime),
            100
        );
        assert_eq!(
            global_downstream_max_connections(None, &none, &runtime),
            200
        );
        let bad = map(META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS, "lots");
        assert_eq!(global_downstream_max_connections(None, &bad, &runtime), 200);
        assert_eq!(
            global_downstream_max_connections(None, &none, &none),
            DEFAULT_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS
        );
    }

    #[test]
    fn ip_family() {
        let ips = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(all_ipv6(&ips(&["fd00::1", "::2"])));
        assert!(!all_ipv6(&ips(&["fd00::1", "10.0.0.1"])));
        assert!(!all_ipv6(&ips(&["::ffff:10.0.0.1"])));
        assert!(!all_ipv6(&[]));
        let v = render(&BootstrapOptions {
            all_ipv6: true,
            ..Default::default()
        });
        assert_eq!(v["admin"]["address"]["socket_address"]["address"], "::1");
        assert_eq!(v["static_resources"]["listeners"][0]["name"], "::_15090");
    }

    #[test]
    fn runtime_values_override_defaults() {
        let v = render(&BootstrapOptions {
            runtime_values: [
                ("re2.max_program_size.error_level", ""),
                ("a", "true"),
                ("b", "false"),
                ("c", "5"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            ..Default::default()
        });
        let layer = &v["layered_runtime"]["layers"][0]["static_layer"];
        assert!(layer.get("re2.max_program_size.error_level").is_none());
        assert_eq!(
            (&layer["a"], &layer["b"], &layer["c"]),
            (&json!(true), &json!(false), &json!("5"))
        );
    }
}
