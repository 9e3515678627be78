//! The Envoy bootstrap the agent writes before starting Envoy: what Istio's
//! template `tools/packaging/common/envoy_bootstrap.json` renders, built here
//! from typed options instead of a text template, and the node metadata
//! (`pkg/bootstrap/config.go GetNodeMetaData`) that goes into it.
//!
//! Why not a template engine or the `envoy-types` protos: Istio's template is
//! Go `text/template` with sprig, which no Rust crate reproduces, and the
//! prost types of `envoy-types` carry no protojson serialisation. Building the
//! document with `serde_json::json!` keeps the structure visible next to
//! Istio's and lets the output be compared with Istio's goldens as JSON.
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

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv6Addr;
use std::path::PathBuf;

use serde_json::{Map, Value, json};

use crate::config::SDS_SOCKET_DIR;
use crate::sds::{ROOT_SECRET, WORKLOAD_SECRET};

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
/// Prefix of environment variables (and `proxyMetadata` keys) copied into the
/// node metadata as strings, prefix stripped.
pub const ISTIO_META_PREFIX: &str = "ISTIO_META_";
/// Prefix of environment variables whose JSON object value is merged into the
/// root of the node metadata.
pub const ISTIO_METAJSON_PREFIX: &str = "ISTIO_METAJSON_";
/// The variable whose JSON object also becomes `LABELS` and `STATIC_LABELS`.
pub const ISTIO_METAJSON_LABELS: &str = "ISTIO_METAJSON_LABELS";
/// Legacy locality label (`region.zone.subzone`, `.` standing for `/`).
pub const LOCALITY_LABEL: &str = "istio-locality";
/// Locality label, read before the legacy one.
pub const TOPOLOGY_LOCALITY_LABEL: &str = "topology.istio.io/locality";
/// Label the pod labels file carries but Istio leaves out of `LABELS`.
pub const POD_TEMPLATE_HASH_LABEL: &str = "pod-template-hash";
/// `proxyMetadata` key for the downstream connection limit.
pub const META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS: &str =
    "ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS";
/// Runtime flag for the downstream connection limit (`ProxyConfig.runtimeValues`).
pub const RUNTIME_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS: &str =
    "overload.global_downstream_max_connections";

/// Istio's service cluster default, treated as "not set".
const DEFAULT_SERVICE_CLUSTER: &str = "istio-proxy";
const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
const SDS_CLUSTER: &str = "sds-grpc";

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

/// `ClientTLSSettings.mode` for the connections Envoy opens to telemetry services.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// Plaintext.
    #[default]
    Disable,
    /// TLS, verifying the server against `ca_certificates`.
    Simple,
    /// Mutual TLS with the given client certificate and key.
    Mutual,
    /// Mutual TLS with the workload certificate (`default`/`ROOTCA` over SDS).
    IstioMutual,
}

/// `ClientTLSSettings` of a telemetry service (`ProxyConfig.envoyMetricsService.tlsSettings`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// TLS mode.
    pub mode: TlsMode,
    /// Client certificate chain file (`Mutual`).
    pub client_certificate: String,
    /// Client private key file (`Mutual`).
    pub private_key: String,
    /// CA bundle file verifying the server (`Simple`, `Mutual`).
    pub ca_certificates: String,
    /// SNI; for `IstioMutual` the cluster name when empty.
    pub sni: String,
    /// Server SANs to accept (exact match); any when empty.
    pub subject_alt_names: Vec<String>,
}

/// A gRPC telemetry service Envoy connects to (`ProxyConfig.envoyMetricsService`,
/// `envoyAccessLogService`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteService {
    /// The service address.
    pub address: HostPort,
    /// TLS settings; `None` (or mode `Disable`) for plaintext.
    pub tls: Option<ClientTls>,
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

/// `node.locality`; empty parts are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Locality {
    /// Region.
    pub region: String,
    /// Zone.
    pub zone: String,
    /// Sub-zone.
    pub sub_zone: String,
}

impl Locality {
    /// Parses a locality label: `region/zone/subzone`, or with `.` instead of
    /// `/` when the value holds no `/` (Kubernetes labels cannot hold `/`).
    pub fn from_label(label: &str) -> Self {
        let label = sanitize_locality(label);
        let mut parts = label.split('/');
        let mut next = || parts.next().unwrap_or_default().to_string();
        Self {
            region: next(),
            zone: next(),
            sub_zone: next(),
        }
    }
}

fn sanitize_locality(label: &str) -> String {
    if label.contains('/') {
        label.to_string()
    } else {
        label.replace('.', "/")
    }
}

/// Stats names Envoy keeps beyond Istio's required ones (annotations
/// `sidecar.istio.io/statsInclusion{Prefixes,Suffixes,Regexps}`, else
/// `ProxyConfig.proxyStatsMatcher`). `{pod_ip}` is expanded for each instance IP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsInclusion {
    /// Extra prefixes.
    pub prefixes: Vec<String>,
    /// Extra suffixes.
    pub suffixes: Vec<String>,
    /// Extra RE2 regular expressions.
    pub regexps: Vec<String>,
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
                "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
                "type_url": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener",
                "value": {"buffer_size_kb": 64}
            }
        }]),
    );
    root.insert("stats_config".into(), stats_config(opts));
    root.insert(
        "admin".into(),
        json!({
            "access_log": [{
                "name": "envoy.access_loggers.file",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
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
        json!({"clusters": clusters(opts, &family), "listeners": listeners(opts, &family)}),
    );
    root.insert(
        "overload_manager".into(),
        json!({
            "resource_monitors": [{
                "name": "envoy.resource_monitors.global_downstream_max_connections",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
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
                        "@type": "type.googleapis.com/envoy.config.trace.v3.ZipkinConfig",
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
    let sinks = stats_sinks(opts);
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

/// Istio's stats tags, in the template's order; `extra` tags go after `mongo_prefix`.
fn stats_tags(extra: &[String]) -> Vec<Value> {
    let tag = |name: &str, regex: &str| json!({"tag_name": name, "regex": regex});
    let mut tags = vec![
        tag("cluster_name", r"^cluster(\.(.+);)"),
        tag(
            "http_conn_manager_prefix",
            r"^http\.(((?:[_.[:digit:]\w]*|[_\[\]aAbBcCdDeEfF[:digit:]\w\:]*));\.)",
        ),
        tag("thread_name", r"^server(\.(.+))\.watchdog"),
        tag("tcp_prefix", r"^tcp\.((.*?)\.)\w+?$"),
        tag("response_code", r"_rq(_(\d{3}))$"),
        tag("response_code_class", r"_rq(_(\dxx))$"),
        tag(
            "http_conn_manager_listener_prefix",
            r"^listener(?=\.).*?\.http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)",
        ),
        tag(
            "listener_address",
            r"^listener\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)",
        ),
        tag(
            "mongo_prefix",
            r"^mongo\.(.+?)\.(collection|cmd|cx_|op_|delays_|decoding_)(.*?)$",
        ),
    ];
    let mut seen = BTreeSet::new();
    for name in extra {
        if !name.is_empty() && seen.insert(name.as_str()) {
            tags.push(tag(name, &format!(r"({name}=\.=(.*?);\.;)")));
        }
    }
    tags.extend([
        tag("cache", r"(cache\.(.+?)\.)"),
        tag("component", r"(component\.(.+?)\.)"),
        tag("tag", r"(tag\.(.+?);\.)"),
        tag("wasm_filter", r"(wasm_filter\.(.+?)\.)"),
        tag("authz_enforce_result", r"rbac(\.(allowed|denied))"),
        tag("authz_dry_run_action", r"(\.istio_dry_run_(allow|deny)_)"),
        tag("authz_dry_run_result", r"(\.shadow_(allowed|denied))"),
    ]);
    tags
}

/// Extra patterns followed by the required ones, `{pod_ip}` expanded per IP
/// (Istio's `parseOption` + `substituteValues`).
fn inclusion(extra: &[String], required: &[&str], ips: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for pattern in extra
        .iter()
        .map(String::as_str)
        .chain(required.iter().copied())
    {
        if pattern.contains("{pod_ip}") {
            out.extend(ips.iter().map(|ip| pattern.replace("{pod_ip}", ip)));
        } else {
            out.push(pattern.to_string());
        }
    }
    out
}

fn stats_config(opts: &BootstrapOptions) -> Value {
    let ips: Vec<&str> = opts
        .metadata
        .get("INSTANCE_IPS")
        .and_then(Value::as_str)
        .map(|s| s.split(',').filter(|ip| !ip.is_empty()).collect())
        .unwrap_or_default();
    // Readiness reads these stats.
    const REQUIRED_PREFIXES: &[&str] = &[
        "cluster_manager",
        "listener_manager",
        "server",
        "cluster.xds-grpc",
        "wasm",
    ];
    let mut required_suffixes = vec![
        "rbac.allowed",
        "rbac.denied",
        "shadow_allowed",
        "shadow_denied",
    ];
    if opts.exit_on_zero_active_connections {
        // Draining polls the active connection count.
        required_suffixes.push("downstream_cx_active");
    }
    // Route-level metrics named by a VirtualService `stat_prefix`.
    const REQUIRED_REGEXPS: &[&str] = &[r"vhost\..*\.route\..*"];

    let extra = &opts.stats_inclusion;
    let mut patterns = vec![json!({"prefix": "reporter="})];
    patterns.extend(
        inclusion(&extra.prefixes, REQUIRED_PREFIXES, &ips)
            .into_iter()
            .map(|p| json!({"prefix": p})),
    );
    patterns.extend(
        inclusion(&extra.suffixes, &required_suffixes, &ips)
            .into_iter()
            .map(|s| json!({"suffix": s})),
    );
    patterns.extend(
        inclusion(&extra.regexps, REQUIRED_REGEXPS, &ips)
            .into_iter()
            .map(|r| json!({"safe_regex": {"regex": r}})),
    );
    patterns.push(json!({"prefix": "component"}));
    patterns.push(json!({"prefix": "istio"}));
    json!({
        "use_all_default_tags": false,
        "stats_tags": stats_tags(&opts.extra_stat_tags),
        "stats_matcher": {"inclusion_list": {"patterns": patterns}}
    })
}

fn load_assignment(cluster: &str, address: Value) -> Value {
    json!({
        "cluster_name": cluster,
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}]
    })
}

/// `typed_extension_protocol_options` forcing HTTP/2 (gRPC upstreams).
fn http2_options() -> Value {
    json!({
        HTTP_PROTOCOL_OPTIONS: {
            "@type": format!("type.googleapis.com/{HTTP_PROTOCOL_OPTIONS}"),
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

fn clusters(opts: &BootstrapOptions, family: &Family) -> Vec<Value> {
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
            clusters.push(grpc_service_cluster(name, service, opts, family));
        }
    }
    clusters
}

fn grpc_service_cluster(
    name: &str,
    service: &RemoteService,
    opts: &BootstrapOptions,
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
        && let Some(socket) = upstream_tls(tls, name, &opts.metadata)
        && let Some(obj) = cluster.as_object_mut()
    {
        obj.insert("transport_socket".into(), socket);
    }
    cluster
}

/// An SDS secret served by the agent over `sds-grpc`.
fn sds_secret(name: &str) -> Value {
    json!({
        "name": name,
        "sds_config": {
            "api_config_source": {
                "api_type": "GRPC",
                "grpc_services": [{"envoy_grpc": {"cluster_name": SDS_CLUSTER}}],
                "set_node_on_first_message_only": true,
                "transport_api_version": "V3"
            },
            "resource_api_version": "V3"
        }
    })
}

fn meta_or<'a>(metadata: &'a Map<String, Value>, key: &str, default: &'a str) -> &'a str {
    metadata
        .get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(default)
}

/// Istio's `tlsContextConvert` for a telemetry cluster (gRPC, so ALPN `h2`).
/// Files are served by the agent's SDS as `file-cert:`/`file-root:` secrets;
/// `ISTIO_META_TLS_CLIENT_*` metadata overrides the file paths.
fn upstream_tls(tls: &ClientTls, cluster: &str, metadata: &Map<String, Value>) -> Option<Value> {
    let ca = meta_or(metadata, "TLS_CLIENT_ROOT_CERT", &tls.ca_certificates);
    let root_secret = |name: Option<String>| {
        let mut validation = json!({
            "default_validation_context": if tls.subject_alt_names.is_empty() {
                json!({})
            } else {
                json!({"match_subject_alt_names": tls.subject_alt_names.iter().map(|s| json!({"exact": s})).collect::<Vec<_>>()})
            }
        });
        if let (Some(name), Some(obj)) = (name, validation.as_object_mut()) {
            obj.insert(
                "validation_context_sds_secret_config".into(),
                sds_secret(&name),
            );
        }
        validation
    };
    let file_root = (!ca.is_empty()).then(|| format!("file-root:{ca}"));
    let mut common = Map::new();
    let mut sni = tls.sni.clone();
    match tls.mode {
        TlsMode::Disable => return None,
        TlsMode::Simple => {
            common.insert("combined_validation_context".into(), root_secret(file_root));
            common.insert("alpn_protocols".into(), json!(["h2"]));
        }
        TlsMode::Mutual => {
            let cert = meta_or(metadata, "TLS_CLIENT_CERT_CHAIN", &tls.client_certificate);
            let key = meta_or(metadata, "TLS_CLIENT_KEY", &tls.private_key);
            if !cert.is_empty() && !key.is_empty() {
                common.insert(
                    "tls_certificate_sds_secret_configs".into(),
                    json!([sds_secret(&format!("file-cert:{cert}~{key}"))]),
                );
            }
            common.insert("combined_validation_context".into(), root_secret(file_root));
            common.insert("alpn_protocols".into(), json!(["h2"]));
        }
        TlsMode::IstioMutual => {
            common.insert(
                "tls_certificate_sds_secret_configs".into(),
                json!([sds_secret(WORKLOAD_SECRET)]),
            );
            common.insert(
                "combined_validation_context".into(),
                root_secret(Some(ROOT_SECRET.to_string())),
            );
            common.insert("alpn_protocols".into(), json!(["istio", "h2"]));
            if sni.is_empty() {
                sni = cluster.to_string();
            }
        }
    }
    let mut context = Map::new();
    context.insert(
        "@type".into(),
        json!("type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"),
    );
    context.insert("common_tls_context".into(), Value::Object(common));
    if !sni.is_empty() {
        context.insert("sni".into(), Value::String(sni));
    }
    Some(json!({"name": "envoy.transport_sockets.tls", "typed_config": context}))
}

fn router() -> Value {
    json!({"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER_TYPE}})
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
            "@type": HCM_TYPE,
            "codec_type": "AUTO",
            "stat_prefix": stat_prefix,
            "route_config": {
                "virtual_hosts": [{"name": "backend", "domains": ["*"], "routes": routes}]
            },
            "http_filters": filters
        }
    })
}

fn compressor(algorithm: &str, library_type: &str) -> Value {
    json!({
        "name": format!("envoy.filters.http.compressor.{algorithm}"),
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor",
            "compressor_library": {
                "name": format!("stats_{algorithm}"),
                "typed_config": {"@type": format!("type.googleapis.com/{library_type}")}
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
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"}
        }]),
    );
    extra.insert(
        "filter_chains".into(),
        json!([{
            "filter_chain_match": {"transport_protocol": "tls"},
            "transport_socket": {
                "name": "envoy.transport_sockets.tls",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                    "require_client_certificate": true,
                    "common_tls_context": {
                        "tls_certificate_sds_secret_configs": [sds_secret(WORKLOAD_SECRET)],
                        "combined_validation_context": {
                            "default_validation_context": {},
                            "validation_context_sds_secret_config": sds_secret(ROOT_SECRET)
                        }
                    }
                }
            },
            "filters": [http_connection_manager(stat_prefix, routes, vec![router()])]
        }]),
    );
    admin_listener(family, port, extra)
}

fn listeners(opts: &BootstrapOptions, family: &Family) -> Vec<Value> {
    let mut prometheus_filters = Vec::new();
    if opts.stats_compression {
        prometheus_filters.extend([
            compressor(
                "brotli",
                "envoy.extensions.compression.brotli.compressor.v3.Brotli",
            ),
            compressor(
                "zstd",
                "envoy.extensions.compression.zstd.compressor.v3.Zstd",
            ),
            compressor(
                "gzip",
                "envoy.extensions.compression.gzip.compressor.v3.Gzip",
            ),
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

fn stats_sinks(opts: &BootstrapOptions) -> Vec<Value> {
    let mut sinks = Vec::new();
    if opts.envoy_metrics_service.is_some() {
        sinks.push(json!({
            "name": "envoy.stat_sinks.metrics_service",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.metrics.v3.MetricsServiceConfig",
                "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": "envoy_metrics_service"}}
            }
        }));
    }
    if let Some(statsd) = &opts.statsd_address {
        sinks.push(json!({
            "name": "envoy.stat_sinks.statsd",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.metrics.v3.StatsdSink",
                "address": {"socket_address": statsd.socket_address()}
            }
        }));
    }
    sinks
}

/// Whether every IP is IPv6 (IPv4-mapped addresses count as IPv4); false for
/// none, so an agent without IPs gets IPv4 loopback and wildcard, as in Istio.
pub fn all_ipv6(ips: &[String]) -> bool {
    !ips.is_empty()
        && ips.iter().all(|ip| {
            ip.parse::<Ipv6Addr>()
                .is_ok_and(|a| a.to_ipv4_mapped().is_none())
        })
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

/// `ProxyConfig.tracingServiceName`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TracingServiceName {
    /// `<app label>.<namespace>` (Istio's default).
    #[default]
    AppLabelAndNamespace,
    /// The canonical service name.
    CanonicalNameOnly,
    /// `<canonical service name>.<namespace>`.
    CanonicalNameAndNamespace,
}

/// `ProxyConfig.clusterName`: the deprecated `serviceCluster` or `tracingServiceName`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterName {
    /// `serviceCluster` (`istio-proxy` by default, which means "derive it").
    ServiceCluster(String),
    /// `tracingServiceName`.
    TracingServiceName(TracingServiceName),
}

impl Default for ClusterName {
    fn default() -> Self {
        Self::ServiceCluster(DEFAULT_SERVICE_CLUSTER.to_string())
    }
}

fn meta_str<'a>(metadata: &'a Map<String, Value>, key: &str) -> &'a str {
    metadata
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn meta_label<'a>(metadata: &'a Map<String, Value>, keys: &[&str]) -> Option<&'a str> {
    let labels = metadata.get("LABELS")?.as_object()?;
    keys.iter().find_map(|k| labels.get(*k)?.as_str())
}

/// `node.cluster` (Istio's `getServiceCluster`), from the node metadata's
/// `LABELS`, `WORKLOAD_NAME` and `NAMESPACE`: a service cluster other than
/// `istio-proxy` as is; else `<app>.<namespace>` (first of labels `app`,
/// `app.kubernetes.io/name`, `service.istio.io/canonical-name`); else
/// `<WORKLOAD_NAME>.<namespace>`; else `istio-proxy.<namespace>`; else `istio-proxy`.
pub fn service_cluster(name: &ClusterName, metadata: &Map<String, Value>) -> String {
    let namespace = meta_str(metadata, "NAMESPACE");
    let workload = meta_str(metadata, "WORKLOAD_NAME");
    let or_default = |name: &str| -> String {
        if !name.is_empty() && name != DEFAULT_SERVICE_CLUSTER {
            return name.to_string();
        }
        if let Some(app) = meta_label(
            metadata,
            &[
                "app",
                "app.kubernetes.io/name",
                "service.istio.io/canonical-name",
            ],
        ) {
            return format!("{app}.{namespace}");
        }
        if !workload.is_empty() {
            return format!("{workload}.{namespace}");
        }
        if !namespace.is_empty() {
            return format!("{DEFAULT_SERVICE_CLUSTER}.{namespace}");
        }
        DEFAULT_SERVICE_CLUSTER.to_string()
    };
    let canonical = || -> String {
        let fallback = if workload.is_empty() {
            DEFAULT_SERVICE_CLUSTER
        } else {
            workload
        };
        meta_label(
            metadata,
            &[
                "service.istio.io/canonical-name",
                "app.kubernetes.io/name",
                "app",
            ],
        )
        .unwrap_or(fallback)
        .to_string()
    };
    match name {
        ClusterName::ServiceCluster(name) => or_default(name),
        ClusterName::TracingServiceName(TracingServiceName::AppLabelAndNamespace) => {
            or_default(DEFAULT_SERVICE_CLUSTER)
        }
        ClusterName::TracingServiceName(TracingServiceName::CanonicalNameOnly) => {
            or_default(&canonical())
        }
        ClusterName::TracingServiceName(TracingServiceName::CanonicalNameAndNamespace) => {
            let name = canonical();
            if namespace.is_empty() {
                or_default(&name)
            } else {
                format!("{name}.{namespace}")
            }
        }
    }
}

/// `node.locality` from the metadata's `LABELS` (`topology.istio.io/locality`,
/// else `istio-locality`); `None` when neither is set, so the caller can ask
/// the platform.
pub fn node_locality(metadata: &Map<String, Value>) -> Option<Locality> {
    meta_label(metadata, &[TOPOLOGY_LOCALITY_LABEL, LOCALITY_LABEL])
        .filter(|l| !l.is_empty())
        .map(Locality::from_label)
}

/// What the node metadata is built from (Istio's `MetadataOptions`).
#[derive(Debug, Clone)]
pub struct MetadataInputs {
    /// The agent's environment, `(key, value)` in order; later entries win.
    pub env: Vec<(String, String)>,
    /// `ProxyConfig.proxyMetadata`; `ISTIO_META_*` keys become metadata, env wins.
    pub proxy_metadata: BTreeMap<String, String>,
    /// The effective ProxyConfig as its camelCase protojson object (`PROXY_CONFIG`).
    pub proxy_config: Map<String, Value>,
    /// `ISTIO_VERSION` unless `ISTIO_META_ISTIO_VERSION` sets it.
    pub istio_version: String,
    /// The instance IPs, first is the node id's; duplicates are dropped.
    pub instance_ips: Vec<String>,
    /// `--stsPort`; `STS_PORT` only when not 0.
    pub sts_port: u16,
    /// `ENVOY_STATUS_PORT`.
    pub envoy_status_port: u16,
    /// `ENVOY_PROMETHEUS_PORT`.
    pub envoy_prometheus_port: u16,
    /// `ENVOY_SECURE_METRICS_PORT`; left out when 0.
    pub envoy_secure_metrics_port: u16,
    /// `ENVOY_SECURE_MERGED_METRICS_PORT`; left out when 0.
    pub envoy_secure_merged_metrics_port: u16,
    /// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`; `"true"` or left out.
    pub exit_on_zero_active_connections: bool,
    /// `METADATA_DISCOVERY` (`PEER_METADATA_DISCOVERY`, else `ENABLE_HBONE`).
    pub metadata_discovery: bool,
    /// `ENVOY_SKIP_DEPRECATED_LOGS`; `"true"` or left out.
    pub envoy_skip_deprecated_logs: bool,
    /// `WORKLOAD_IDENTITY_SOCKET_FILE`; only a non-default name is recorded.
    pub workload_identity_socket_file: String,
    /// Labels from `./etc/istio/pod/labels`; `None` when the file is absent.
    pub pod_labels: Option<BTreeMap<String, String>>,
    /// Annotations from `./etc/istio/pod/annotations` (`ANNOTATIONS`).
    pub annotations: BTreeMap<String, String>,
    /// `PILOT_SAN`: istiod's expected identities.
    pub pilot_san: Vec<String>,
    /// `--outlierLogPath` (`OUTLIER_LOG_PATH`).
    pub outlier_log_path: String,
    /// An external credential SDS socket is serving: raw `credential: "true"`.
    pub credential_socket_exists: bool,
}

impl Default for MetadataInputs {
    fn default() -> Self {
        Self {
            env: Vec::new(),
            proxy_metadata: BTreeMap::new(),
            proxy_config: Map::new(),
            istio_version: crate::VERSION.to_string(),
            instance_ips: Vec::new(),
            sts_port: 0,
            envoy_status_port: DEFAULT_ENVOY_STATUS_PORT,
            envoy_prometheus_port: DEFAULT_ENVOY_PROMETHEUS_PORT,
            envoy_secure_metrics_port: 0,
            envoy_secure_merged_metrics_port: 0,
            exit_on_zero_active_connections: false,
            metadata_discovery: false,
            envoy_skip_deprecated_logs: false,
            workload_identity_socket_file: DEFAULT_WORKLOAD_IDENTITY_SOCKET_FILE.to_string(),
            pod_labels: None,
            annotations: BTreeMap::new(),
            pilot_san: Vec::new(),
            outlier_log_path: String::new(),
            credential_socket_exists: false,
        }
    }
}

fn string_map(value: &str, source: &str) -> BTreeMap<String, String> {
    match serde_json::from_str::<Map<String, Value>>(value) {
        // Go's unmarshal into map[string]string keeps the string entries.
        Ok(m) => m
            .into_iter()
            .filter_map(|(k, v)| Some((k, v.as_str()?.to_string())))
            .collect(),
        Err(e) => {
            tracing::warn!(%source, %value, error = %e, "not a JSON object of strings; ignored");
            BTreeMap::new()
        }
    }
}

fn to_object(m: &BTreeMap<String, String>) -> Value {
    Value::Object(
        m.iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect(),
    )
}

/// The node metadata (Istio's `GetNodeMetaData` then `marshalMetadata`).
///
/// Raw entries come first: `proxyMetadata` `ISTIO_META_*`, then env
/// `ISTIO_META_*` (prefix stripped, strings), then every `ISTIO_METAJSON_*`
/// object merged into the root (Istio's quirk: `ISTIO_METAJSON_LABELS={"app":"x"}`
/// also yields a top-level `app`), then `DNS_PROXY_ADDR`. Istio's typed fields
/// are then set over them; a typed field Istio leaves out (empty) keeps the raw
/// value. Keys come out sorted.
pub fn node_metadata(inputs: &MetadataInputs) -> Map<String, Value> {
    let mut meta: BTreeMap<String, Value> = BTreeMap::new();
    for (key, value) in &inputs.proxy_metadata {
        if let Some(key) = key.strip_prefix(ISTIO_META_PREFIX) {
            meta.insert(key.to_string(), Value::String(value.clone()));
        }
    }
    for (key, value) in &inputs.env {
        if let Some(key) = key.strip_prefix(ISTIO_META_PREFIX) {
            meta.insert(key.to_string(), Value::String(value.clone()));
        }
    }
    for (key, value) in &inputs.env {
        if key.starts_with(ISTIO_METAJSON_PREFIX) {
            match serde_json::from_str::<Map<String, Value>>(value) {
                Ok(object) => meta.extend(object),
                Err(e) => tracing::warn!(%key, %value, error = %e, "not a JSON object; ignored"),
            }
        }
    }
    let env_value = |name: &str| {
        inputs
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    };
    if let Some(addr) = env_value("DNS_PROXY_ADDR") {
        meta.insert("DNS_PROXY_ADDR".into(), json!(addr));
    }

    // Typed fields. ISTIO_VERSION is the one a raw value (ISTIO_META_ISTIO_VERSION) beats.
    if !inputs.istio_version.is_empty()
        && !matches!(meta.get("ISTIO_VERSION").and_then(Value::as_str), Some(v) if !v.is_empty())
    {
        meta.insert("ISTIO_VERSION".into(), json!(inputs.istio_version));
    }
    let mut set = |key: &str, value: Value| {
        meta.insert(key.to_string(), value);
    };
    let mut seen = BTreeSet::new();
    let ips: Vec<&str> = inputs
        .instance_ips
        .iter()
        .map(String::as_str)
        .filter(|ip| seen.insert(*ip))
        .collect();
    if !ips.is_empty() {
        set("INSTANCE_IPS", json!(ips.join(",")));
    }
    if inputs.sts_port != 0 {
        set("STS_PORT", json!(inputs.sts_port.to_string()));
    }
    for (key, port) in [
        ("ENVOY_STATUS_PORT", inputs.envoy_status_port),
        ("ENVOY_PROMETHEUS_PORT", inputs.envoy_prometheus_port),
        (
            "ENVOY_SECURE_METRICS_PORT",
            inputs.envoy_secure_metrics_port,
        ),
        (
            "ENVOY_SECURE_MERGED_METRICS_PORT",
            inputs.envoy_secure_merged_metrics_port,
        ),
    ] {
        if port != 0 {
            set(key, json!(port));
        }
    }
    if inputs.exit_on_zero_active_connections {
        set("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", json!("true"));
    }
    set(
        "METADATA_DISCOVERY",
        json!(inputs.metadata_discovery.to_string()),
    );
    if inputs.envoy_skip_deprecated_logs {
        set("ENVOY_SKIP_DEPRECATED_LOGS", json!("true"));
    }
    let socket = &inputs.workload_identity_socket_file;
    if !socket.is_empty() && socket != DEFAULT_WORKLOAD_IDENTITY_SOCKET_FILE {
        set("WORKLOAD_IDENTITY_SOCKET_FILE", json!(socket));
    }
    set("PROXY_CONFIG", Value::Object(inputs.proxy_config.clone()));
    if let Some(name) = env_value("POD_NAME") {
        set("NAME", json!(name));
    }
    if let Some(namespace) = env_value("POD_NAMESPACE") {
        set("NAMESPACE", json!(namespace));
    }
    if let Some(sa) = env_value("SERVICE_ACCOUNT") {
        set("SERVICE_ACCOUNT", json!(sa));
    }

    // LABELS and STATIC_LABELS: the last non-empty ISTIO_METAJSON_LABELS.
    let mut static_labels = BTreeMap::new();
    for (key, value) in &inputs.env {
        if key == ISTIO_METAJSON_LABELS {
            let m = string_map(value, key);
            if !m.is_empty() {
                static_labels = m;
            }
        }
    }
    // Istio assigns one Go map to both fields, so the locality fix-up below
    // reaches STATIC_LABELS too unless the labels file replaced LABELS.
    let mut labels = static_labels.clone();
    let shared = inputs.pod_labels.is_none();
    if let Some(pod_labels) = &inputs.pod_labels {
        labels.extend(
            pod_labels
                .iter()
                .filter(|(k, _)| k.as_str() != POD_TEMPLATE_HASH_LABEL)
                .map(|(k, v)| (k.clone(), v.clone())),
        );
    }
    let locality = labels
        .get(TOPOLOGY_LOCALITY_LABEL)
        .or_else(|| labels.get(LOCALITY_LABEL))
        .filter(|l| !l.is_empty())
        .map(|l| sanitize_locality(l));
    if let Some(locality) = locality {
        labels.insert(LOCALITY_LABEL.to_string(), locality.clone());
        if shared {
            static_labels.insert(LOCALITY_LABEL.to_string(), locality);
        }
    }
    if !labels.is_empty() {
        set("LABELS", to_object(&labels));
    }
    if !static_labels.is_empty() {
        set("STATIC_LABELS", to_object(&static_labels));
    }
    if !inputs.annotations.is_empty() {
        set("ANNOTATIONS", to_object(&inputs.annotations));
    }
    if !inputs.pilot_san.is_empty() {
        set("PILOT_SAN", json!(inputs.pilot_san));
    }
    if !inputs.outlier_log_path.is_empty() {
        set("OUTLIER_LOG_PATH", json!(inputs.outlier_log_path));
    }
    if inputs.credential_socket_exists {
        set("credential", json!("true"));
    }
    // Collected through a BTreeMap so keys are sorted whatever Map's backing.
    meta.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

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
    fn meta_prefix_stripped_and_env_wins() {
        let inputs = MetadataInputs {
            env: env(&[
                ("ISTIO_META_A", "env"),
                ("NOT_META", "x"),
                ("ISTIO_METAJSON_X", r#"{"j": {"n": 1}, "A": "json"}"#),
                ("ISTIO_METAJSON_BAD", "not json"),
            ]),
            proxy_metadata: [
                ("ISTIO_META_A", "pc"),
                ("ISTIO_META_B", "pc"),
                ("OTHER", "o"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            istio_version: "1.0".into(),
            ..Default::default()
        };
        let m = node_metadata(&inputs);
        // METAJSON is applied after META and merges into the root.
        assert_eq!(m["A"], "json");
        assert_eq!(m["B"], "pc");
        assert_eq!(m["j"], json!({"n": 1}));
        assert!(!m.contains_key("NOT_META") && !m.contains_key("OTHER"));
        assert_eq!(m["ISTIO_VERSION"], "1.0");
        assert_eq!(m["METADATA_DISCOVERY"], "false");
        assert!(!m.contains_key("WORKLOAD_IDENTITY_SOCKET_FILE"));
        let keys: Vec<_> = m.keys().cloned().collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn typed_fields() {
        let inputs = MetadataInputs {
            env: env(&[
                ("ISTIO_META_ISTIO_VERSION", "override"),
                ("POD_NAME", "p"),
                ("POD_NAMESPACE", "ns"),
                ("SERVICE_ACCOUNT", "sa"),
                (
                    "ISTIO_METAJSON_LABELS",
                    r#"{"topology.istio.io/locality":"r.z"}"#,
                ),
            ]),
            instance_ips: vec!["1.1.1.1".into(), "2.2.2.2".into(), "1.1.1.1".into()],
            sts_port: 15463,
            envoy_secure_metrics_port: 15091,
            exit_on_zero_active_connections: true,
            workload_identity_socket_file: "other".into(),
            pod_labels: Some(
                [("pod-template-hash", "h"), ("version", "v1")]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        };
        let m = node_metadata(&inputs);
        assert_eq!(m["ISTIO_VERSION"], "override");
        assert_eq!(m["INSTANCE_IPS"], "1.1.1.1,2.2.2.2");
        assert_eq!(m["STS_PORT"], "15463");
        assert_eq!(m["ENVOY_SECURE_METRICS_PORT"], 15091);
        assert!(!m.contains_key("ENVOY_SECURE_MERGED_METRICS_PORT"));
        assert_eq!(m["EXIT_ON_ZERO_ACTIVE_CONNECTIONS"], "true");
        assert_eq!(m["WORKLOAD_IDENTITY_SOCKET_FILE"], "other");
        assert_eq!(
            (&m["NAME"], &m["NAMESPACE"], &m["SERVICE_ACCOUNT"]),
            (&json!("p"), &json!("ns"), &json!("sa"))
        );
        // The labels file replaces LABELS, so only it gets the sanitized locality.
        assert_eq!(
            m["LABELS"],
            json!({"topology.istio.io/locality": "r.z", "istio-locality": "r/z", "version": "v1"})
        );
        assert_eq!(
            m["STATIC_LABELS"],
            json!({"topology.istio.io/locality": "r.z"})
        );
        assert_eq!(
            node_locality(&m),
            Some(Locality {
                region: "r".into(),
                zone: "z".into(),
                sub_zone: String::new()
            })
        );
    }

    #[test]
    fn service_cluster_rules() {
        let meta = |pairs: Value| pairs.as_object().unwrap().clone();
        let sc = |s: &str| ClusterName::ServiceCluster(s.into());
        assert_eq!(service_cluster(&sc("mine"), &Map::new()), "mine");
        assert_eq!(
            service_cluster(&sc("istio-proxy"), &Map::new()),
            "istio-proxy"
        );
        let m = meta(json!({"NAMESPACE": "ns"}));
        assert_eq!(service_cluster(&sc(""), &m), "istio-proxy.ns");
        let m = meta(json!({"NAMESPACE": "ns", "WORKLOAD_NAME": "wl"}));
        assert_eq!(service_cluster(&sc("istio-proxy"), &m), "wl.ns");
        let m = meta(json!({"NAMESPACE": "ns", "WORKLOAD_NAME": "wl",
            "LABELS": {"app.kubernetes.io/name": "k8s", "service.istio.io/canonical-name": "canon"}}));
        assert_eq!(service_cluster(&sc("istio-proxy"), &m), "k8s.ns");
        let tracing = |t| ClusterName::TracingServiceName(t);
        assert_eq!(
            service_cluster(&tracing(TracingServiceName::CanonicalNameOnly), &m),
            "canon"
        );
        assert_eq!(
            service_cluster(&tracing(TracingServiceName::CanonicalNameAndNamespace), &m),
            "canon.ns"
        );
        assert_eq!(
            service_cluster(&tracing(TracingServiceName::AppLabelAndNamespace), &m),
            "k8s.ns"
        );
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

    #[test]
    fn stats_inclusion_expands_pod_ip_and_keeps_required() {
        let mut metadata = Map::new();
        metadata.insert("INSTANCE_IPS".into(), json!("10.0.0.1,10.0.0.2"));
        let v = render(&BootstrapOptions {
            metadata,
            stats_inclusion: StatsInclusion {
                prefixes: vec!["http.{pod_ip}_".into()],
                suffixes: vec!["upstream_rq_timeout".into()],
                regexps: vec![r"http\.[0-9.]+_8080\..*".into()],
            },
            exit_on_zero_active_connections: true,
            extra_stat_tags: vec!["dest".into(), "dest".into(), String::new()],
            ..Default::default()
        });
        let patterns = v["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"]
            .as_array()
            .unwrap()
            .clone();
        let want = [
            json!({"prefix": "reporter="}),
            json!({"prefix": "http.10.0.0.1_"}),
            json!({"prefix": "http.10.0.0.2_"}),
            json!({"prefix": "cluster_manager"}),
        ];
        assert_eq!(patterns[..4], want);
        assert!(patterns.contains(&json!({"suffix": "upstream_rq_timeout"})));
        assert!(patterns.contains(&json!({"suffix": "downstream_cx_active"})));
        assert!(patterns.contains(&json!({"safe_regex": {"regex": r"http\.[0-9.]+_8080\..*"}})));
        let tags = v["stats_config"]["stats_tags"].as_array().unwrap();
        assert_eq!(tags.iter().filter(|t| t["tag_name"] == "dest").count(), 1);
        assert_eq!(
            tags[9],
            json!({"tag_name": "dest", "regex": r"(dest=\.=(.*?);\.;)"})
        );
    }

    #[test]
    fn istio_mutual_telemetry_uses_workload_certificate() {
        let v = render(&BootstrapOptions {
            envoy_access_log_service: Some(RemoteService {
                address: HostPort::parse("als", "als:9000").unwrap(),
                tls: Some(ClientTls {
                    mode: TlsMode::IstioMutual,
                    subject_alt_names: vec!["spiffe://td/ns/x/sa/y".into()],
                    ..Default::default()
                }),
            }),
            ..Default::default()
        });
        let cluster = &v["static_resources"]["clusters"][4];
        assert_eq!(cluster["name"], "envoy_accesslog_service");
        let ctx = &cluster["transport_socket"]["typed_config"];
        assert_eq!(ctx["sni"], "envoy_accesslog_service");
        let common = &ctx["common_tls_context"];
        assert_eq!(common["alpn_protocols"], json!(["istio", "h2"]));
        assert_eq!(
            common["tls_certificate_sds_secret_configs"][0]["name"],
            "default"
        );
        let cvc = &common["combined_validation_context"];
        assert_eq!(
            cvc["validation_context_sds_secret_config"]["name"],
            "ROOTCA"
        );
        assert_eq!(
            cvc["default_validation_context"]["match_subject_alt_names"],
            json!([{"exact": "spiffe://td/ns/x/sa/y"}])
        );
        // No sink for an access log service: istiod configures the logger.
        assert!(v.get("stats_sinks").is_none());
    }
}
