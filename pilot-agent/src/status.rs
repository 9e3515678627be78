//! The agent's status server on `:15020`, as Istio's
//! `pilot/cmd/pilot-agent/status/server.go` serves it:
//!
//! - `/healthz/ready`: Envoy's readiness (config received from the XDS server,
//!   server LIVE, workers started), then any checks other parts register; the
//!   kubelet reaches it through Envoy's `:15021` listener.
//! - `/stats/prometheus` and `/metrics`: the agent's `istio_agent_*` metrics,
//!   Envoy's `:15090` output and the application's metrics, concatenated.
//! - `/app-health/<container>/{livez,readyz,startupz}` and
//!   `/app-lifecycle/<container>/{prestopz,poststartz}`: the application's
//!   probes, rewritten by the injector into `ISTIO_KUBE_APP_PROBERS`, sent from
//!   `127.0.0.6` so the iptables rules let them through to the application.
//! - `POST /quitquitquit` and `POST /drain` from loopback.
//!
//! [`StatusState`] is what the rest of the agent shares with the server: the
//! termination cause set on SIGTERM, the quit and drain requests the agent
//! awaits, extra readiness checks and the agent's Prometheus registry.
//!
//! The HTTP clients are hyper's connection-level clients over sockets dialled
//! here, because probes must bind their source address and send
//! `Connection: close`, which pooled clients do not allow.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::http::request::Parts;
use hyper::http::uri::{Authority, PathAndQuery};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus::{Gauge, IntCounter, IntCounterVec, Opts, Registry};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use serde::Deserialize;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

/// Istio's `statusPort` default.
pub const DEFAULT_STATUS_PORT: u16 = 15020;
/// Envoy's admin port (`ProxyConfig.proxyAdminPort`).
pub const DEFAULT_ADMIN_PORT: u16 = 15000;
/// Envoy's Prometheus listener (`ENVOY_PROMETHEUS_PORT`).
pub const DEFAULT_ENVOY_PROMETHEUS_PORT: u16 = 15090;
/// Istio's `PROXY_READINESS_PROBE_TIMEOUT` default: each admin request made
/// by the readiness probe.
pub const DEFAULT_READINESS_TIMEOUT: Duration = Duration::from_secs(3);

/// The readiness path.
pub const READY_PATH: &str = "/healthz/ready";
/// The path that makes the agent exit.
pub const QUIT_PATH: &str = "/quitquitquit";
/// The path that starts draining Envoy's listeners.
pub const DRAIN_PATH: &str = "/drain";

/// The form of `ISTIO_KUBE_APP_PROBERS` keys, as Istio's error message shows it.
const APP_PROBER_PATTERN: &str =
    r"^/(app-health|app-lifecycle)/[^/]+/(livez|readyz|startupz|prestopz|poststartz)$";
const APP_PROBER_PREFIXES: [&str; 2] = ["/app-health/", "/app-lifecycle/"];
const APP_PROBER_KINDS: [&str; 5] = ["livez", "readyz", "startupz", "prestopz", "poststartz"];

/// Envoy admin queries of the readiness probe (`status/util/stats.go`); sent
/// unescaped, as Go's client sends them.
const UPDATE_STATS_PATH: &str = r"/stats?usedonly&filter=^(cluster_manager\.cds|listener_manager\.lds)\.(update_success|update_rejected)$";
const READY_STATS_PATH: &str =
    r"/stats?usedonly&filter=^(server\.state|listener_manager\.workers_started)";
const STAT_CDS_SUCCESS: &str = "cluster_manager.cds.update_success";
const STAT_CDS_REJECTED: &str = "cluster_manager.cds.update_rejected";
const STAT_LDS_SUCCESS: &str = "listener_manager.lds.update_success";
const STAT_LDS_REJECTED: &str = "listener_manager.lds.update_rejected";
const STAT_SERVER_STATE: &str = "server.state";
const STAT_WORKERS_STARTED: &str = "listener_manager.workers_started";

/// Source of application probes: iptables passes traffic from these addresses
/// to the application instead of redirecting it into Envoy.
const UPSTREAM_LOCAL_V4: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6));
const UPSTREAM_LOCAL_V6: IpAddr = IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6));

/// How much of an application probe's response body is passed back.
const MAX_PROBE_BODY: usize = 10 * 1024;
/// The cap on each target's body when several application targets are merged.
const MAX_APP_METRICS_BODY: usize = 10 * 1024 * 1024;
/// Kubelet's redirect limit.
const MAX_REDIRECTS: usize = 10;
/// How long open connections may finish their request after shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

const FMT_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
const FMT_OPENMETRICS_0_0_1: &str = "application/openmetrics-text; version=0.0.1; charset=utf-8";
const FMT_OPENMETRICS_1_0_0: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const OPENMETRICS_EOF: &[u8] = b"# EOF";
const SCRAPE_TIMEOUT_HEADER: &str = "x-prometheus-scrape-timeout-seconds";
const GRPC_HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// Ports of the Istio data plane that a metrics target may not name.
const RESERVED_PORTS: &[(u16, &str)] = &[
    (15000, "Envoy admin"),
    (15001, "outbound traffic capture"),
    (15004, "pilot debug"),
    (15006, "inbound traffic capture"),
    (15008, "HBONE tunnel"),
    (15020, "pilot-agent status / merged Prometheus"),
    (15021, "Envoy health"),
    (15053, "DNS proxy"),
    (15090, "Envoy Prometheus (already merged)"),
];

/// Label values of `istio_agent_scrape_failures_total{type}`.
const SCRAPE_ENVOY: &str = "envoy";
const SCRAPE_APP: &str = "application";
const SCRAPE_AGENT: &str = "agent";

/// The status server's errors.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// `ISTIO_KUBE_APP_PROBERS` or `ISTIO_PROMETHEUS_ANNOTATIONS` is invalid;
    /// every problem found is listed.
    #[error("invalid status server configuration: {}", join_errors(.0))]
    Config(Vec<ConfigError>),
    /// An agent metric could not be registered.
    #[error("registering agent metric {name}: {source}")]
    Metric {
        /// The metric.
        name: &'static str,
        /// Why.
        source: prometheus::Error,
    },
    /// The TLS client for HTTPS probes could not be built.
    #[error("TLS client for HTTPS application probes: {0}")]
    Tls(#[from] rustls::Error),
    /// The listener failed in a way retrying cannot fix; the agent should
    /// terminate (Istio sends itself SIGTERM), since readiness can never pass.
    #[error("status server stopped accepting connections: {0}")]
    Accept(io::Error),
}

/// One invalid value of the status server's configuration, with Istio's
/// wording so the messages users search for still match.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `ISTIO_KUBE_APP_PROBERS` is not the JSON map the injector writes.
    #[error("failed to decode app prober err = {reason}, json string = {json}")]
    DecodeAppProbers {
        /// The JSON error.
        reason: String,
        /// The value.
        json: String,
    },
    /// A key of `ISTIO_KUBE_APP_PROBERS` is not a probe path.
    #[error("invalid path {path:?}, must be in form of regex pattern {APP_PROBER_PATTERN}")]
    InvalidProberPath {
        /// The key.
        path: String,
    },
    /// A probe has none or several of `httpGet`, `tcpSocket` and `grpc`.
    #[error("invalid prober type for {path}, must be one of type httpGet, tcpSocket or gRPC")]
    InvalidProberType {
        /// The key.
        path: String,
    },
    /// A probe names its port (`"http"`): the injector resolves names to numbers.
    #[error("invalid prober config for {path}, the port must be int type, not {port:?}")]
    PortNotInt {
        /// The key.
        path: String,
        /// The port name given.
        port: String,
    },
    /// A probe's port is not a TCP port.
    #[error("invalid prober config for {path}, the port {port} is not in 1-65535")]
    PortOutOfRange {
        /// The key.
        path: String,
        /// The port given.
        port: i64,
    },
    /// `ISTIO_PROMETHEUS_ANNOTATIONS` is not valid JSON of the expected shape.
    #[error("failed to unmarshal ISTIO_PROMETHEUS_ANNOTATIONS: {reason}")]
    DecodePrometheus {
        /// The JSON error.
        reason: String,
    },
    /// The legacy `port` is the status port itself, which would scrape itself.
    #[error(
        "invalid prometheus scrape configuration: application port is the same as agent port, which may lead to a recursive loop. Ensure pod does not have prometheus.io/port={status_port} label, or that injection is not happening multiple times"
    )]
    ScrapePortIsStatusPort {
        /// The status port.
        status_port: u16,
    },
    /// A target port is not a number in 1..65535.
    #[error("invalid prometheus scrape configuration: invalid target port {port:?}")]
    InvalidScrapePort {
        /// The port given.
        port: String,
    },
    /// A target port is the status port.
    #[error(
        "invalid prometheus scrape configuration: target port {port} is the same as agent port, which may lead to a recursive loop"
    )]
    ScrapeTargetIsStatusPort {
        /// The port given.
        port: String,
    },
    /// A target port belongs to the Istio data plane.
    #[error(
        "invalid prometheus scrape configuration: target port {port} is reserved for Istio ({reason}) and cannot be scraped"
    )]
    ReservedScrapePort {
        /// The port given.
        port: String,
        /// What uses it.
        reason: &'static str,
    },
}

fn join_errors(errors: &[ConfigError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// What the status server is told at start-up; the defaults are Istio's.
/// [`StatusState::new`] validates it.
#[derive(Debug, Clone)]
pub struct StatusOptions {
    /// The status server's own port (`statusPort`, 15020): a scrape target may
    /// not name it, and a forwarded probe's `Host` port is rewritten from it.
    pub status_port: u16,
    /// Envoy's admin port (`proxyAdminPort`, 15000), read by the readiness probe.
    pub admin_port: u16,
    /// Envoy's Prometheus port (`ENVOY_PROMETHEUS_PORT`, 15090), merged into
    /// `/stats/prometheus`.
    pub envoy_prometheus_port: u16,
    /// `INSTANCE_IP`: the Pod IP, where application probes are sent (as the
    /// kubelet would). Empty means `localhost`.
    pub instance_ip: String,
    /// The Pod is IPv6-only: Envoy's admin is reached on `::1`. An IPv6
    /// `instance_ip` has the same effect.
    pub ipv6: bool,
    /// `ISTIO_KUBE_APP_PROBERS`: the injector's JSON map from probe path to the
    /// container's original probe. Empty means none.
    pub kube_app_probers: String,
    /// `ISTIO_PROMETHEUS_ANNOTATIONS`: `{"scrape","path","port","targets"}`,
    /// the application metrics to merge. `None` when unset.
    pub prometheus_annotations: Option<String>,
    /// The proxy is a sidecar: only sidecars merge application metrics, as
    /// gateways expose `:15020` in their Services.
    pub sidecar: bool,
    /// Envoy runs beside the agent (`DISABLE_ENVOY` unset): readiness checks
    /// it and its metrics are merged.
    pub envoy: bool,
    /// `PILOT_AGENT_MERGE_ENVOY_STATS` (true): include Envoy's metrics.
    pub merge_envoy_stats: bool,
    /// `METRICS_LOCALHOST_ACCESS_ONLY` (false): serve metrics to loopback only.
    pub metrics_localhost_only: bool,
    /// `REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION` (false): send application
    /// probes to `localhost` instead of `instance_ip`.
    pub probe_localhost: bool,
    /// `ISTIO_ENABLE_HTTP2_PROBING` (true): offer HTTP/2 to HTTPS probes.
    pub http2_probing: bool,
    /// `PROXY_READINESS_PROBE_TIMEOUT` (3s): each Envoy admin request of the
    /// readiness probe.
    pub readiness_timeout: Duration,
    /// When the agent started, for `istio_agent_startup_duration_seconds`;
    /// `None` means when the [`StatusState`] was created.
    pub started_at: Option<std::time::Instant>,
}

impl Default for StatusOptions {
    fn default() -> Self {
        Self {
            status_port: DEFAULT_STATUS_PORT,
            admin_port: DEFAULT_ADMIN_PORT,
            envoy_prometheus_port: DEFAULT_ENVOY_PROMETHEUS_PORT,
            instance_ip: String::new(),
            ipv6: false,
            kube_app_probers: String::new(),
            prometheus_annotations: None,
            sidecar: true,
            envoy: true,
            merge_envoy_stats: true,
            metrics_localhost_only: false,
            probe_localhost: false,
            http2_probing: true,
            readiness_timeout: DEFAULT_READINESS_TIMEOUT,
            started_at: None,
        }
    }
}

// ---------------------------------------------------------------------------
// ISTIO_KUBE_APP_PROBERS

/// A container probe as the injector stores it (Kubernetes' `Probe`, the
/// fields the agent uses). Unknown fields (`exec`, `periodSeconds`) are ignored.
#[derive(Debug, Deserialize)]
struct RawProber {
    #[serde(rename = "httpGet")]
    http_get: Option<RawHttpGet>,
    #[serde(rename = "tcpSocket")]
    tcp_socket: Option<RawTcpSocket>,
    // Go's JSON decoding ignores case; the injector and Istio's tests write `gRPC`.
    #[serde(rename = "grpc", alias = "gRPC", alias = "GRPC")]
    grpc: Option<RawGrpc>,
    #[serde(rename = "timeoutSeconds", default)]
    timeout_seconds: i32,
}

#[derive(Debug, Deserialize)]
struct RawHttpGet {
    #[serde(default)]
    path: String,
    #[serde(default)]
    port: IntOrString,
    #[serde(default)]
    scheme: String,
}

#[derive(Debug, Deserialize)]
struct RawTcpSocket {
    #[serde(default)]
    port: IntOrString,
}

#[derive(Debug, Deserialize)]
struct RawGrpc {
    #[serde(default)]
    port: i64,
    #[serde(default)]
    service: Option<String>,
}

/// Kubernetes' `IntOrString`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum IntOrString {
    Int(i64),
    Str(String),
}

impl Default for IntOrString {
    fn default() -> Self {
        IntOrString::Int(0)
    }
}

/// A validated application probe.
#[derive(Debug, Clone, PartialEq)]
enum AppProbe {
    Http {
        path: String,
        port: u16,
        https: bool,
        timeout: Option<Duration>,
    },
    Tcp {
        port: u16,
        timeout: Option<Duration>,
    },
    Grpc {
        port: u16,
        service: String,
        timeout: Option<Duration>,
    },
}

fn valid_prober_path(path: &str) -> bool {
    let Some(rest) = APP_PROBER_PREFIXES
        .iter()
        .find_map(|prefix| path.strip_prefix(prefix))
    else {
        return false;
    };
    match rest.split_once('/') {
        Some((container, kind)) => !container.is_empty() && APP_PROBER_KINDS.contains(&kind),
        None => false,
    }
}

fn probe_port(path: &str, port: &IntOrString) -> Result<u16, ConfigError> {
    match port {
        IntOrString::Str(name) => Err(ConfigError::PortNotInt {
            path: path.to_string(),
            port: name.clone(),
        }),
        IntOrString::Int(p) => int_port(path, *p),
    }
}

fn int_port(path: &str, port: i64) -> Result<u16, ConfigError> {
    match u16::try_from(port) {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(ConfigError::PortOutOfRange {
            path: path.to_string(),
            port,
        }),
    }
}

/// Istio's `validateAppKubeProber`, plus a range check on ports.
fn validate_prober(path: &str, raw: &RawProber) -> Result<AppProbe, ConfigError> {
    if !valid_prober_path(path) {
        return Err(ConfigError::InvalidProberPath {
            path: path.to_string(),
        });
    }
    let timeout = u64::try_from(raw.timeout_seconds)
        .ok()
        .filter(|s| *s > 0)
        .map(Duration::from_secs);
    match (&raw.http_get, &raw.tcp_socket, &raw.grpc) {
        (Some(h), None, None) => Ok(AppProbe::Http {
            path: if h.path.starts_with('/') {
                h.path.clone()
            } else {
                format!("/{}", h.path)
            },
            port: probe_port(path, &h.port)?,
            // Kubernetes' URIScheme is exactly "HTTP" or "HTTPS".
            https: h.scheme == "HTTPS",
            timeout,
        }),
        (None, Some(t), None) => Ok(AppProbe::Tcp {
            port: probe_port(path, &t.port)?,
            timeout,
        }),
        (None, None, Some(g)) => Ok(AppProbe::Grpc {
            port: int_port(path, g.port)?,
            service: g.service.clone().unwrap_or_default(),
            timeout,
        }),
        _ => Err(ConfigError::InvalidProberType {
            path: path.to_string(),
        }),
    }
}

fn parse_app_probers(json: &str, errors: &mut Vec<ConfigError>) -> BTreeMap<String, AppProbe> {
    let mut probers = BTreeMap::new();
    if json.is_empty() {
        return probers;
    }
    let raw: BTreeMap<String, RawProber> = match serde_json::from_str(json) {
        Ok(raw) => raw,
        Err(e) => {
            errors.push(ConfigError::DecodeAppProbers {
                reason: e.to_string(),
                json: json.to_string(),
            });
            return probers;
        }
    };
    for (path, prober) in &raw {
        match validate_prober(path, prober) {
            Ok(probe) => {
                probers.insert(path.clone(), probe);
            }
            Err(e) => errors.push(e),
        }
    }
    probers
}

// ---------------------------------------------------------------------------
// ISTIO_PROMETHEUS_ANNOTATIONS

#[derive(Debug, Deserialize)]
struct RawScrapeConfig {
    #[serde(default)]
    scrape: String,
    #[serde(default)]
    path: String,
    #[serde(default)]
    port: String,
    #[serde(default)]
    targets: Option<Vec<RawScrapeTarget>>,
}

#[derive(Debug, Deserialize)]
struct RawScrapeTarget {
    #[serde(default)]
    port: String,
    #[serde(default)]
    path: String,
}

/// One application metrics endpoint, scraped at `http://localhost:<port><path>`.
#[derive(Debug, Clone, PartialEq)]
struct ScrapeTarget {
    port: u16,
    path: String,
}

fn parse_scrape_targets(
    options: &StatusOptions,
    errors: &mut Vec<ConfigError>,
) -> Vec<ScrapeTarget> {
    let Some(json) = options.prometheus_annotations.as_deref() else {
        return Vec::new();
    };
    if !options.sidecar {
        return Vec::new();
    }
    let raw: RawScrapeConfig = match serde_json::from_str(json) {
        Ok(raw) => raw,
        Err(e) => {
            errors.push(ConfigError::DecodePrometheus {
                reason: e.to_string(),
            });
            return Vec::new();
        }
    };
    tracing::info!(target: "status", "Prometheus scraping configuration: {json}");
    if raw.scrape == "false" {
        return Vec::new();
    }
    let raw_targets = match raw.targets {
        Some(targets) if !targets.is_empty() => targets,
        _ => {
            // The legacy single target, with its defaults.
            let port = if raw.port.is_empty() {
                "80".to_string()
            } else {
                raw.port
            };
            if port == options.status_port.to_string() {
                errors.push(ConfigError::ScrapePortIsStatusPort {
                    status_port: options.status_port,
                });
                return Vec::new();
            }
            vec![RawScrapeTarget {
                port,
                path: raw.path,
            }]
        }
    };
    let mut targets = Vec::new();
    for t in raw_targets {
        let port = match t.port.parse::<i64>().ok().map(u16::try_from) {
            Some(Ok(p)) if p != 0 => p,
            _ => {
                errors.push(ConfigError::InvalidScrapePort { port: t.port });
                continue;
            }
        };
        if port == options.status_port {
            errors.push(ConfigError::ScrapeTargetIsStatusPort { port: t.port });
            continue;
        }
        if let Some((_, reason)) = RESERVED_PORTS.iter().find(|(p, _)| *p == port) {
            errors.push(ConfigError::ReservedScrapePort {
                port: t.port,
                reason,
            });
            continue;
        }
        let path = match t.path.as_str() {
            "" => "/metrics".to_string(),
            p if p.starts_with('/') => p.to_string(),
            p => format!("/{p}"),
        };
        targets.push(ScrapeTarget { port, path });
    }
    targets
}

// ---------------------------------------------------------------------------
// Metrics

/// The agent metrics the status server maintains, with Istio's names.
#[derive(Clone)]
pub struct AgentMetrics {
    /// `istio_agent_scrapes_total`: scrapes of `/stats/prometheus`.
    pub scrapes_total: IntCounter,
    /// `istio_agent_scrape_failures_total{type=envoy|application|agent}`.
    pub scrape_failures_total: IntCounterVec,
    /// `istio_agent_startup_duration_seconds`: from start until Envoy was
    /// first ready.
    pub startup_duration_seconds: Gauge,
}

impl AgentMetrics {
    fn register(registry: &Registry) -> Result<Self, StatusError> {
        let metric = |name: &'static str| move |source| StatusError::Metric { name, source };
        let scrapes_total =
            IntCounter::new("istio_agent_scrapes_total", "The total number of scrapes.")
                .map_err(metric("istio_agent_scrapes_total"))?;
        let scrape_failures_total = IntCounterVec::new(
            Opts::new(
                "istio_agent_scrape_failures_total",
                "The total number of failed scrapes.",
            ),
            &["type"],
        )
        .map_err(metric("istio_agent_scrape_failures_total"))?;
        let startup_duration_seconds = Gauge::new(
            "istio_agent_startup_duration_seconds",
            "The time from the process starting to being marked ready.",
        )
        .map_err(metric("istio_agent_startup_duration_seconds"))?;
        registry
            .register(Box::new(scrapes_total.clone()))
            .map_err(metric("istio_agent_scrapes_total"))?;
        registry
            .register(Box::new(scrape_failures_total.clone()))
            .map_err(metric("istio_agent_scrape_failures_total"))?;
        registry
            .register(Box::new(startup_duration_seconds.clone()))
            .map_err(metric("istio_agent_startup_duration_seconds"))?;
        Ok(Self {
            scrapes_total,
            scrape_failures_total,
            startup_duration_seconds,
        })
    }

    fn scrape_failed(&self, kind: &str) {
        self.scrape_failures_total.with_label_values(&[kind]).inc();
    }
}

// ---------------------------------------------------------------------------
// Extra readiness checks

type CheckFn = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

struct ReadinessEntry {
    id: u64,
    name: String,
    /// `None` for a [`ReadinessGuard`]: not ready while it lives.
    check: Option<CheckFn>,
}

#[derive(Default)]
struct ReadinessChecks {
    next_id: AtomicU64,
    entries: Mutex<Vec<ReadinessEntry>>,
}

impl ReadinessChecks {
    fn add(&self, name: String, check: Option<CheckFn>) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.entries).push(ReadinessEntry { id, name, check });
        id
    }

    fn remove(&self, id: u64) {
        lock(&self.entries).retain(|e| e.id != id);
    }

    /// The first failing check's message, in registration order.
    fn check(&self) -> Result<(), String> {
        let entries: Vec<(String, Option<CheckFn>)> = lock(&self.entries)
            .iter()
            .map(|e| (e.name.clone(), e.check.clone()))
            .collect();
        for (name, check) in entries {
            match check {
                None => return Err(name),
                Some(check) => check().inspect_err(|e| {
                    tracing::debug!(target: "status", "readiness check {name} failed: {e}");
                })?,
            }
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock cannot leave the list inconsistent.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Keeps `/healthz/ready` failing with its reason until dropped. Returned by
/// [`StatusState::readiness_pending`].
#[must_use = "readiness is blocked only while the guard lives"]
pub struct ReadinessGuard {
    checks: Arc<ReadinessChecks>,
    id: u64,
}

impl ReadinessGuard {
    /// Marks the condition as met (the same as dropping the guard).
    pub fn ready(self) {}
}

impl Drop for ReadinessGuard {
    fn drop(&mut self) {
        self.checks.remove(self.id);
    }
}

// ---------------------------------------------------------------------------
// The shared state

/// The status server's state, shared with the rest of the agent in an `Arc`.
pub struct StatusState {
    options: StatusOptions,
    probers: BTreeMap<String, AppProbe>,
    scrape_targets: Vec<ScrapeTarget>,
    /// Envoy admin host: `127.0.0.1`, or `::1` for IPv6 Pods.
    localhost: IpAddr,
    /// Where application probes go: `INSTANCE_IP` or `localhost`.
    probe_host: String,
    probe_tls: Arc<ClientConfig>,
    registry: Registry,
    metrics: AgentMetrics,
    started_at: std::time::Instant,
    termination: watch::Sender<Option<String>>,
    drain: watch::Sender<bool>,
    quit: watch::Sender<bool>,
    checks: Arc<ReadinessChecks>,
    /// Envoy has had CDS and LDS once (cached, as Istio does).
    config_received: AtomicBool,
    /// Envoy has been LIVE with workers started once (cached, as Istio does).
    envoy_ready_once: AtomicBool,
    /// For logging "Envoy proxy is ready" on the transition only.
    last_probe_successful: AtomicBool,
}

impl StatusState {
    /// Validates `options` (Istio's `NewServer`) and registers the agent
    /// metrics in a new registry. Every invalid probe and scrape target is
    /// reported in one [`StatusError::Config`].
    pub fn new(options: StatusOptions) -> Result<Self, StatusError> {
        let mut errors = Vec::new();
        let probers = parse_app_probers(&options.kube_app_probers, &mut errors);
        let scrape_targets = parse_scrape_targets(&options, &mut errors);
        if !errors.is_empty() {
            return Err(StatusError::Config(errors));
        }
        let instance_ip = options.instance_ip.parse::<IpAddr>().ok();
        let ipv6 = options.ipv6
            || matches!(instance_ip, Some(IpAddr::V6(ip)) if !ip.is_unicast_link_local());
        let localhost = if ipv6 {
            IpAddr::V6(Ipv6Addr::LOCALHOST)
        } else {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        };
        let probe_host = if options.probe_localhost || options.instance_ip.is_empty() {
            "localhost".to_string()
        } else {
            options.instance_ip.clone()
        };
        let probe_tls = Arc::new(insecure_client_config(options.http2_probing)?);
        let registry = Registry::new();
        let metrics = AgentMetrics::register(&registry)?;
        Ok(Self {
            started_at: options.started_at.unwrap_or_else(std::time::Instant::now),
            options,
            probers,
            scrape_targets,
            localhost,
            probe_host,
            probe_tls,
            registry,
            metrics,
            termination: watch::channel(None).0,
            drain: watch::channel(false).0,
            quit: watch::channel(false).0,
            checks: Arc::default(),
            config_received: AtomicBool::new(false),
            envoy_ready_once: AtomicBool::new(false),
            last_probe_successful: AtomicBool::new(false),
        })
    }

    /// The options the server was built from.
    pub fn options(&self) -> &StatusOptions {
        &self.options
    }

    /// The agent's registry, written first on `/stats/prometheus`; other
    /// parts register their `istio_agent_*` metrics here.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The metrics the status server maintains.
    pub fn metrics(&self) -> &AgentMetrics {
        &self.metrics
    }

    /// Marks the agent as terminating (Istio cancels the agent context with
    /// this cause): `/healthz/ready` answers `server is terminated: <cause>`
    /// from now on. The first cause wins; returns whether this call set it.
    pub fn terminate(&self, cause: impl Into<String>) -> bool {
        let cause = cause.into();
        self.termination.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            *current = Some(cause);
            true
        })
    }

    /// Why the agent is terminating, once it is.
    pub fn termination_cause(&self) -> Option<String> {
        self.termination.borrow().clone()
    }

    /// Waits until [`terminate`](Self::terminate) is called (SIGTERM or
    /// `/quitquitquit`) and returns the cause.
    pub async fn terminated(&self) -> String {
        let mut rx = self.termination.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(cause) => cause.clone().unwrap_or_default(),
            // The sender lives in `self`, so this cannot happen.
            Err(_) => std::future::pending().await,
        }
    }

    /// Asks the agent to drain Envoy's listeners now (`POST /drain`, the
    /// native sidecar's preStop hook).
    pub fn request_drain(&self) {
        self.drain.send_replace(true);
    }

    /// Whether a drain was requested.
    pub fn is_drain_requested(&self) -> bool {
        *self.drain.borrow()
    }

    /// Waits until a drain is requested; returns at once if it already was.
    pub async fn drain_requested(&self) {
        let mut rx = self.drain.subscribe();
        if rx.wait_for(|v| *v).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Asks the agent to exit (`POST /quitquitquit`): sets the quit flag, then
    /// terminates with the cause `/quitquitquit called`.
    pub fn request_quit(&self) {
        self.quit.send_replace(true);
        self.terminate(format!("{QUIT_PATH} called"));
    }

    /// Whether `/quitquitquit` was called.
    pub fn is_quit_requested(&self) -> bool {
        *self.quit.borrow()
    }

    /// Waits until `/quitquitquit` is called; returns at once if it was.
    pub async fn quit_requested(&self) {
        let mut rx = self.quit.subscribe();
        if rx.wait_for(|v| *v).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Whether termination should skip draining and kill Envoy at once:
    /// true after `/quitquitquit` (Istio's `DisableDraining`) or `/drain`
    /// (already drained).
    pub fn skip_drain(&self) -> bool {
        self.is_quit_requested() || self.is_drain_requested()
    }

    /// Adds a readiness condition checked after Envoy's, in registration
    /// order; its error text is `/healthz/ready`'s answer (e.g. Istio's
    /// `istio DNS capture is turned ON and DNS lookup table is not ready yet`).
    pub fn add_readiness_check(
        &self,
        name: impl Into<String>,
        check: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) {
        self.checks.add(name.into(), Some(Arc::new(check)));
    }

    /// Keeps readiness failing with `reason` until the guard is dropped.
    pub fn readiness_pending(&self, reason: impl Into<String>) -> ReadinessGuard {
        let id = self.checks.add(reason.into(), None);
        ReadinessGuard {
            checks: self.checks.clone(),
            id,
        }
    }

    /// `/healthz/ready`'s check: Envoy's probe (unless there is no Envoy),
    /// then the registered checks; the first error wins.
    pub async fn check_ready(&self) -> Result<(), String> {
        if self.options.envoy {
            self.check_envoy().await?;
        }
        self.checks.check()
    }

    /// Istio's `ready.Probe.Check`.
    async fn check_envoy(&self) -> Result<(), String> {
        if !self.config_received.load(Ordering::Acquire) {
            let body = self.admin_get(UPDATE_STATS_PATH).await?;
            let [cds_success, cds_rejected, lds_success, lds_rejected] = parse_stats(
                &body,
                [
                    STAT_CDS_SUCCESS,
                    STAT_CDS_REJECTED,
                    STAT_LDS_SUCCESS,
                    STAT_LDS_REJECTED,
                ],
            )?;
            let summary = format!(
                "cds updates: {cds_success} successful, {cds_rejected} rejected; lds updates: {lds_success} successful, {lds_rejected} rejected"
            );
            match (cds_success > 0, lds_success > 0) {
                (true, true) => self.config_received.store(true, Ordering::Release),
                (false, false) => {
                    return Err(format!(
                        "config not received from XDS server (is Istiod running?): {summary}"
                    ));
                }
                _ if cds_rejected > 0 || lds_rejected > 0 => {
                    return Err(format!(
                        "config received from XDS server, but was rejected: {summary}"
                    ));
                }
                _ => {
                    return Err(format!(
                        "config not fully received from XDS server: {summary}"
                    ));
                }
            }
        }
        if let Some(cause) = self.termination_cause() {
            return Err(format!("server is terminated: {cause}"));
        }
        // LIVE and workers started do not go back during Envoy's life.
        if self.envoy_ready_once.load(Ordering::Acquire) {
            return Ok(());
        }
        self.check_envoy_live().await?;
        if !self.envoy_ready_once.swap(true, Ordering::AcqRel) {
            self.metrics
                .startup_duration_seconds
                .set(self.started_at.elapsed().as_secs_f64());
        }
        Ok(())
    }

    /// Istio's `checkEnvoyStats`.
    async fn check_envoy_live(&self) -> Result<(), String> {
        let body = self
            .admin_get(READY_STATS_PATH)
            .await
            .map_err(|e| format!("failed to get readiness stats: {e}"))?;
        for stat in [STAT_SERVER_STATE, STAT_WORKERS_STARTED] {
            if !body.contains(stat) {
                return Err(format!(
                    "failed to get readiness stats: {stat} is not yet updated: {body}"
                ));
            }
        }
        let [state, workers] = parse_stats(&body, [STAT_SERVER_STATE, STAT_WORKERS_STARTED])
            .map_err(|e| format!("failed to get readiness stats: {e}"))?;
        if state != 0 {
            return Err(format!(
                "server is not live, current state is: {}",
                server_state_name(state)
            ));
        }
        if workers != 1 {
            return Err("workers have not yet started".to_string());
        }
        Ok(())
    }

    /// GET on Envoy's admin, bounded by the readiness timeout.
    async fn admin_get(&self, path: &str) -> Result<String, String> {
        let host = self.localhost.to_string();
        let authority = host_port(&host, self.options.admin_port);
        let url = format!("http://{authority}{path}");
        let upstream = Upstream {
            host: &host,
            port: self.options.admin_port,
            tls: None,
            bind_source: false,
        };
        let fetch = async {
            let resp =
                send_request(&upstream, Method::GET, path, &authority, &HeaderMap::new()).await?;
            if resp.status() != StatusCode::OK {
                return Err(FetchError::Status(resp.status().as_u16()));
            }
            let body = resp.into_body().collect().await?.to_bytes();
            Ok(String::from_utf8_lossy(&body).into_owned())
        };
        match tokio::time::timeout(self.options.readiness_timeout, fetch).await {
            Ok(Ok(body)) => Ok(body),
            Ok(Err(e)) => Err(format!("Get \"{url}\": {e}")),
            Err(_) => Err(format!(
                "Get \"{url}\": {}",
                FetchError::Timeout(self.options.readiness_timeout)
            )),
        }
    }
}

/// Istio's `parseStats`: the first line starting with each name, `name: value`.
/// Missing stats are 0.
fn parse_stats<const N: usize>(body: &str, names: [&str; N]) -> Result<[u64; N], String> {
    let mut values = [0u64; N];
    let mut found = [false; N];
    let mut errors = Vec::new();
    for line in body.lines() {
        for (i, name) in names.iter().enumerate() {
            if found[i] || !line.starts_with(name) {
                continue;
            }
            found[i] = true;
            let parts: Vec<&str> = line.split(':').collect();
            if parts.len() != 2 {
                errors.push(format!("envoy stat {name} missing separator. line:{line}"));
                continue;
            }
            match parts[1].trim().parse::<u64>() {
                Ok(v) => values[i] = v,
                Err(e) => errors.push(format!(
                    "failed parsing Envoy stat {name} (error: {e}) line: {line}"
                )),
            }
        }
    }
    if errors.is_empty() {
        Ok(values)
    } else {
        Err(errors.join("; "))
    }
}

/// Envoy's `ServerInfo.State` names.
fn server_state_name(state: u64) -> String {
    match state {
        0 => "LIVE".to_string(),
        1 => "DRAINING".to_string(),
        2 => "PRE_INITIALIZING".to_string(),
        3 => "INITIALIZING".to_string(),
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------
// The server

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Serves the status endpoints on `listener` until `shutdown` completes, then
/// stops accepting, lets open requests finish (up to 5 s) and returns.
///
/// Istio closes the status port when the agent terminates, so the kubelet's
/// probes through Envoy fail; pass `async move { state.terminated().await }`
/// as `shutdown` to do the same. Transient accept errors (e.g. out of file
/// descriptors) are retried with backoff; any other is returned, and the
/// agent should then terminate since it can never become ready.
pub async fn serve(
    listener: TcpListener,
    state: Arc<StatusState>,
    shutdown: impl Future,
) -> Result<(), StatusError> {
    let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
    tracing::info!(target: "status", "Opening status port {port}");
    let (stop, stopped) = watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut backoff = Duration::ZERO;
    tokio::pin!(shutdown);
    let result = loop {
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, remote)) => {
                    backoff = Duration::ZERO;
                    connections.spawn(serve_connection(stream, remote, state.clone(), stopped.clone()));
                }
                Err(e) if is_transient_accept_error(&e) => {
                    // Go's http.Serve backoff.
                    backoff = (backoff * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
                    tracing::warn!(target: "status", "status server: accept error: {e}; retrying in {backoff:?}");
                    tokio::time::sleep(backoff).await;
                }
                Err(e) => {
                    tracing::error!(target: "status", "status server: accept failed: {e}");
                    break Err(StatusError::Accept(e));
                }
            },
        }
    };
    drop(listener);
    stop.send_replace(true);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(target: "status", "closing {} status connections still busy after {SHUTDOWN_GRACE:?}", connections.len());
        connections.abort_all();
    }
    tracing::info!(target: "status", "Status server has successfully terminated");
    result
}

fn is_transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::TimedOut
            | io::ErrorKind::OutOfMemory
    ) || matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EPROTO)
    )
}

async fn serve_connection(
    stream: TcpStream,
    remote: SocketAddr,
    state: Arc<StatusState>,
    mut stopped: watch::Receiver<bool>,
) {
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(route(&state, req, remote).await) }
    });
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    // The watch guard must not live across the awaits below.
    let stop = async move {
        let _ = stopped.wait_for(|v| *v).await;
    };
    tokio::select! {
        res = conn.as_mut() => {
            if let Err(e) = res {
                tracing::debug!(target: "status", "status connection from {remote}: {e}");
            }
        }
        () = stop => {
            conn.as_mut().graceful_shutdown();
            if let Err(e) = conn.await {
                tracing::debug!(target: "status", "status connection from {remote}: {e}");
            }
        }
    }
}

/// Dispatches one request. The body is never read: every endpoint is a GET
/// or an empty POST.
async fn route<B>(state: &Arc<StatusState>, req: Request<B>, remote: SocketAddr) -> Response<Body> {
    let (parts, body) = req.into_parts();
    drop(body);
    let path = parts.uri.path();
    match path {
        READY_PATH => state.handle_ready().await,
        "/metrics" | "/stats/prometheus" => state.handle_stats(&parts, remote).await,
        QUIT_PATH => state.handle_quit(&parts.method, remote),
        DRAIN_PATH => state.handle_drain(&parts.method, remote),
        p if APP_PROBER_PREFIXES
            .iter()
            .any(|prefix| p.starts_with(prefix)) =>
        {
            state.handle_app_probe(p, &parts.headers).await
        }
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(Full::new(body.into()).boxed_unsync());
    *resp.status_mut() = status;
    resp
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = full(status, body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

fn empty(status: StatusCode) -> Response<Body> {
    full(status, Bytes::new())
}

/// Loopback, including IPv4-mapped IPv6 loopback (as Go's `IsLoopback`).
fn is_localhost(remote: SocketAddr) -> bool {
    remote.ip().to_canonical().is_loopback()
}

fn forbidden() -> Response<Body> {
    text(
        StatusCode::FORBIDDEN,
        "Only requests from localhost are allowed\n",
    )
}

impl StatusState {
    async fn handle_ready(&self) -> Response<Body> {
        match self.check_ready().await {
            Ok(()) => {
                if !self.last_probe_successful.swap(true, Ordering::AcqRel) {
                    tracing::info!(target: "status", "Envoy proxy is ready");
                }
                empty(StatusCode::OK)
            }
            Err(e) => {
                self.last_probe_successful.store(false, Ordering::Release);
                tracing::warn!(target: "status", "Envoy proxy is NOT ready: {e}");
                text(StatusCode::SERVICE_UNAVAILABLE, e)
            }
        }
    }

    fn handle_quit(&self, method: &Method, remote: SocketAddr) -> Response<Body> {
        if !is_localhost(remote) {
            return forbidden();
        }
        if *method != Method::POST {
            return text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n");
        }
        tracing::info!(target: "status", "handling {QUIT_PATH}, notifying pilot-agent to exit");
        self.request_quit();
        full(StatusCode::OK, "OK")
    }

    fn handle_drain(&self, method: &Method, remote: SocketAddr) -> Response<Body> {
        if !is_localhost(remote) {
            return forbidden();
        }
        if *method != Method::POST {
            return text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n");
        }
        tracing::info!(target: "status", "handling {DRAIN_PATH}, starting drain");
        self.request_drain();
        full(StatusCode::OK, "OK")
    }
}

// ---------------------------------------------------------------------------
// Merged metrics

/// Application metrics gathered for one scrape.
enum AppMetrics {
    None,
    /// One target, streamed.
    Stream(Incoming),
    /// Several targets, buffered in target order (failed ones left out).
    Buffered {
        bodies: Vec<Bytes>,
        openmetrics: bool,
    },
}

impl StatusState {
    /// Istio's `handleStats`: never fails the scrape because a source did.
    async fn handle_stats(self: &Arc<Self>, parts: &Parts, remote: SocketAddr) -> Response<Body> {
        if self.options.metrics_localhost_only && !is_localhost(remote) {
            return forbidden();
        }
        self.metrics.scrapes_total.inc();
        let deadline = scrape_deadline(&parts.headers);

        let envoy = if self.options.envoy && self.options.merge_envoy_stats {
            let mut path = "/stats/prometheus".to_string();
            if let Some(query) = parts.uri.query().filter(|q| !q.is_empty()) {
                path.push('?');
                path.push_str(query);
            }
            let scraped = self
                .scrape(
                    self.options.envoy_prometheus_port,
                    &path,
                    &parts.headers,
                    false,
                    deadline,
                )
                .await;
            match scraped {
                Ok(resp) => Some(resp.into_body()),
                Err(e) => {
                    tracing::error!(target: "status", "failed scraping envoy metrics: {e}");
                    self.metrics.scrape_failed(SCRAPE_ENVOY);
                    None
                }
            }
        } else {
            None
        };

        let (format, app) = match self.scrape_targets.as_slice() {
            [] => (FMT_TEXT, AppMetrics::None),
            [target] => {
                let scraped = self
                    .scrape(target.port, &target.path, &parts.headers, true, deadline)
                    .await;
                match scraped {
                    Ok(resp) => (
                        negotiate_metrics_format(content_type(resp.headers())),
                        AppMetrics::Stream(resp.into_body()),
                    ),
                    Err(e) => {
                        tracing::error!(target: "status", "failed scraping application metrics: {e}");
                        self.metrics.scrape_failed(SCRAPE_APP);
                        (FMT_TEXT, AppMetrics::None)
                    }
                }
            }
            targets => self.scrape_many(targets, &parts.headers, deadline).await,
        };

        let agent = match self.render_agent_metrics() {
            Ok(text) => Bytes::from(text),
            Err(e) => {
                tracing::error!(target: "status", "failed scraping and writing agent metrics: {e}");
                self.metrics.scrape_failed(SCRAPE_AGENT);
                Bytes::new()
            }
        };

        let (tx, rx) = mpsc::channel(8);
        let metrics = self.metrics.clone();
        tokio::spawn(write_metrics(
            Sink::new(tx),
            metrics,
            agent,
            envoy,
            app,
            deadline,
        ));
        let mut resp = Response::new(StreamBody::new(ReceiverStream::new(rx)).boxed_unsync());
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(format));
        resp
    }

    fn render_agent_metrics(&self) -> Result<Vec<u8>, prometheus::Error> {
        use prometheus::Encoder;
        let mut buf = Vec::new();
        prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        Ok(buf)
    }

    /// GET `http://localhost:<port><path>` with Prometheus' headers.
    async fn scrape(
        &self,
        port: u16,
        path: &str,
        incoming: &HeaderMap,
        openmetrics: bool,
        deadline: Option<Instant>,
    ) -> Result<Response<Incoming>, String> {
        let authority = format!("localhost:{port}");
        let url = format!("http://{authority}{path}");
        let mut headers = HeaderMap::new();
        if let Some(accept) = incoming.get(header::ACCEPT).and_then(|v| v.to_str().ok())
            && let Ok(value) = HeaderValue::from_str(&filter_accept(accept, openmetrics))
        {
            headers.insert(header::ACCEPT, value);
        }
        for name in [
            header::USER_AGENT,
            HeaderName::from_static(SCRAPE_TIMEOUT_HEADER),
        ] {
            if let Some(value) = incoming.get(&name).filter(|v| !v.is_empty()) {
                headers.insert(name, value.clone());
            }
        }
        let upstream = Upstream {
            host: "localhost",
            port,
            tls: None,
            bind_source: false,
        };
        let fetch = send_request(&upstream, Method::GET, path, &authority, &headers);
        let resp = match until(deadline, fetch).await {
            Some(Ok(resp)) => resp,
            Some(Err(e)) => return Err(format!("error scraping {url}: {e}")),
            None => return Err(format!("error scraping {url}: context deadline exceeded")),
        };
        if resp.status() != StatusCode::OK {
            return Err(format!(
                "error scraping {url}, status code: {}",
                resp.status().as_u16()
            ));
        }
        Ok(resp)
    }

    /// Scrapes several targets concurrently, keeping their order. The format
    /// is the first successful target's, or text when targets disagree.
    async fn scrape_many(
        &self,
        targets: &[ScrapeTarget],
        incoming: &HeaderMap,
        deadline: Option<Instant>,
    ) -> (&'static str, AppMetrics) {
        let scrapes = targets.iter().map(|t| async move {
            let resp = self
                .scrape(t.port, &t.path, incoming, true, deadline)
                .await?;
            let format = negotiate_metrics_format(content_type(resp.headers()));
            let body = match until(
                deadline,
                read_capped(resp.into_body(), MAX_APP_METRICS_BODY),
            )
            .await
            {
                Some(Ok(body)) => body,
                Some(Err(e)) => return Err(format!("read failed: {e}")),
                None => return Err("read failed: context deadline exceeded".to_string()),
            };
            Ok::<_, String>((format, body))
        });
        let mut format: Option<&'static str> = None;
        let mut bodies = Vec::new();
        for (target, result) in targets.iter().zip(futures::future::join_all(scrapes).await) {
            match result {
                Ok((f, body)) => {
                    format = match format {
                        None => Some(f),
                        Some(prev) if prev == f => Some(prev),
                        Some(_) => Some(FMT_TEXT),
                    };
                    bodies.push(body);
                }
                Err(e) => {
                    tracing::error!(target: "status", "scrape target {:?}:{:?}: {e}", target.port, target.path);
                    self.metrics.scrape_failed(SCRAPE_APP);
                }
            }
        }
        let format = format.unwrap_or(FMT_TEXT);
        let openmetrics = format != FMT_TEXT;
        (
            format,
            AppMetrics::Buffered {
                bodies,
                openmetrics,
            },
        )
    }
}

/// The client went away.
struct Closed;

/// The response body being written, remembering whether the last byte was a
/// newline so concatenated sources stay on separate lines.
struct Sink {
    tx: mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
    at_line_start: bool,
}

impl Sink {
    fn new(tx: mpsc::Sender<Result<Frame<Bytes>, Infallible>>) -> Self {
        Self {
            tx,
            at_line_start: true,
        }
    }

    async fn send(&mut self, data: Bytes) -> Result<(), Closed> {
        if data.is_empty() {
            return Ok(());
        }
        self.at_line_start = data.ends_with(b"\n");
        self.tx
            .send(Ok(Frame::data(data)))
            .await
            .map_err(|_| Closed)
    }

    async fn end_line(&mut self) -> Result<(), Closed> {
        if self.at_line_start {
            return Ok(());
        }
        self.send(Bytes::from_static(b"\n")).await
    }

    /// Copies `body`; `Ok(Err(_))` when the source failed midway.
    async fn copy(
        &mut self,
        mut body: Incoming,
        deadline: Option<Instant>,
    ) -> Result<Result<(), String>, Closed> {
        loop {
            match until(deadline, body.frame()).await {
                None => return Ok(Err("context deadline exceeded".to_string())),
                Some(None) => return Ok(Ok(())),
                Some(Some(Err(e))) => return Ok(Err(e.to_string())),
                Some(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.send(data).await?;
                    }
                }
            }
        }
    }
}

/// Writes agent, Envoy and application metrics in that order: application
/// metrics go last, because an OpenMetrics body ends with `# EOF`.
async fn write_metrics(
    mut sink: Sink,
    metrics: AgentMetrics,
    agent: Bytes,
    envoy: Option<Incoming>,
    app: AppMetrics,
    deadline: Option<Instant>,
) -> Result<(), Closed> {
    sink.send(agent).await?;
    if let Some(body) = envoy {
        sink.end_line().await?;
        if let Err(e) = sink.copy(body, deadline).await? {
            tracing::error!(target: "status", "failed to scraping and writing envoy metrics: {e}");
            metrics.scrape_failed(SCRAPE_ENVOY);
        }
    }
    match app {
        AppMetrics::None => {}
        AppMetrics::Stream(body) => {
            sink.end_line().await?;
            if let Err(e) = sink.copy(body, deadline).await? {
                tracing::error!(target: "status", "failed to scraping and writing application metrics: {e}");
                metrics.scrape_failed(SCRAPE_APP);
            }
        }
        AppMetrics::Buffered {
            bodies,
            openmetrics,
        } => {
            for body in bodies {
                sink.end_line().await?;
                sink.send(strip_openmetrics_eof(body)).await?;
            }
            if openmetrics {
                sink.end_line().await?;
                sink.send(Bytes::from_static(b"# EOF\n")).await?;
            }
        }
    }
    Ok(())
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// The response format for an application's `Content-Type` (Istio's
/// `negotiateMetricsFormat`): OpenMetrics 0.0.1 or 1.0.0, else text 0.0.4.
fn negotiate_metrics_format(content_type: &str) -> &'static str {
    let mut parts = content_type.split(';');
    let media = parts.next().unwrap_or_default().trim();
    if !media.eq_ignore_ascii_case("application/openmetrics-text") {
        return FMT_TEXT;
    }
    let version = parts
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("version"))
        .map(|(_, v)| v.trim().trim_matches('"'));
    match version {
        Some("1.0.0") => FMT_OPENMETRICS_1_0_0,
        None | Some("0.0.1") => FMT_OPENMETRICS_0_0_1,
        Some(_) => FMT_TEXT,
    }
}

/// The `Accept` sent upstream: text (and OpenMetrics for the application)
/// only, since sources are concatenated and protobuf cannot be.
fn filter_accept(accept: &str, openmetrics: bool) -> String {
    let mut kept = Vec::new();
    for entry in accept.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (media, params) = match entry.split_once(';') {
            Some((m, p)) => (m.trim(), Some(p.trim())),
            None => (entry, None),
        };
        let media = media.to_ascii_lowercase();
        let replacement = match media.as_str() {
            "text/plain" => Some(entry.to_string()),
            "application/openmetrics-text" if openmetrics => Some(entry.to_string()),
            "*/*" | "text/*" => Some(with_params("text/plain;version=0.0.4", params)),
            "application/*" if openmetrics => Some(with_params(
                "application/openmetrics-text;version=0.0.1",
                params,
            )),
            _ => None,
        };
        kept.extend(replacement);
    }
    if kept.is_empty() {
        "text/plain;version=0.0.4".to_string()
    } else {
        kept.join(", ")
    }
}

fn with_params(media: &str, params: Option<&str>) -> String {
    match params {
        Some(p) if !p.is_empty() => format!("{media};{p}"),
        _ => media.to_string(),
    }
}

/// `X-Prometheus-Scrape-Timeout-Seconds`, which also bounds each scrape.
fn scrape_deadline(headers: &HeaderMap) -> Option<Instant> {
    let value = headers.get(SCRAPE_TIMEOUT_HEADER)?.to_str().ok()?;
    match value
        .trim()
        .parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
    {
        Some(timeout) => Some(Instant::now() + timeout),
        None => {
            tracing::warn!(target: "status", "Failed to parse timeout header {value}");
            None
        }
    }
}

fn strip_openmetrics_eof(body: Bytes) -> Bytes {
    let trimmed = body.trim_ascii_end();
    if trimmed.ends_with(OPENMETRICS_EOF) {
        let end = trimmed.len() - OPENMETRICS_EOF.len();
        return body.slice(..end);
    }
    body
}

// ---------------------------------------------------------------------------
// Application probes

/// Where a probe request goes, possibly after redirects.
#[derive(Debug, Clone, PartialEq)]
struct ProbeUrl {
    https: bool,
    host: String,
    port: u16,
    path: String,
}

impl ProbeUrl {
    /// Resolves a `Location`; the authority is returned for absolute ones.
    fn resolve(&self, location: &str) -> Result<(ProbeUrl, Option<String>), String> {
        let lower = location.to_ascii_lowercase();
        let absolute = if lower.starts_with("http://") || lower.starts_with("https://") {
            Some(location.to_string())
        } else if location.starts_with("//") {
            Some(format!(
                "{}:{location}",
                if self.https { "https" } else { "http" }
            ))
        } else {
            None
        };
        if let Some(absolute) = absolute {
            let uri = Uri::from_str(&absolute)
                .map_err(|e| format!("failed to parse Location header {location:?}: {e}"))?;
            let https = uri.scheme_str() == Some("https");
            let authority = uri
                .authority()
                .ok_or_else(|| format!("failed to parse Location header {location:?}: no host"))?;
            let host = authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
            let path = uri
                .path_and_query()
                .map(PathAndQuery::as_str)
                .filter(|p| !p.is_empty())
                .unwrap_or("/")
                .to_string();
            let next = ProbeUrl {
                https,
                host,
                port,
                path,
            };
            return Ok((next, Some(authority.as_str().to_string())));
        }
        let path = if location.starts_with('/') {
            location.to_string()
        } else {
            let current = self.path.split('?').next().unwrap_or_default();
            let dir = current.rfind('/').map_or("/", |i| &current[..=i]);
            format!("{dir}{location}")
        };
        Ok((
            ProbeUrl {
                path,
                ..self.clone()
            },
            None,
        ))
    }
}

/// Request headers never forwarded to a probed application.
const HOP_BY_HOP: [&str; 7] = [
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
];

impl StatusState {
    async fn handle_app_probe(&self, path: &str, headers: &HeaderMap) -> Response<Body> {
        let Some(probe) = self.probers.get(path) else {
            tracing::error!(target: "status", "Prober does not exists url {path}");
            return text(
                StatusCode::BAD_REQUEST,
                format!("app prober config does not exists for {path}"),
            );
        };
        match probe {
            AppProbe::Http {
                path: app_path,
                port,
                https,
                timeout,
            } => {
                self.probe_http(path, app_path, *port, *https, *timeout, headers)
                    .await
            }
            AppProbe::Tcp { port, timeout } => self.probe_tcp(*port, *timeout).await,
            AppProbe::Grpc {
                port,
                service,
                timeout,
            } => self.probe_grpc(*port, service, *timeout, headers).await,
        }
    }

    /// The `Host` to send: the kubelet's, with the status port replaced by
    /// the application's.
    fn forwarded_host(&self, incoming: &HeaderMap, app_port: u16) -> Option<String> {
        let host = incoming.get(header::HOST)?.to_str().ok()?;
        match Authority::from_str(host) {
            Ok(a) if a.port_u16() == Some(self.options.status_port) => {
                Some(format!("{}:{app_port}", a.host()))
            }
            _ => Some(host.to_string()),
        }
    }

    async fn probe_http(
        &self,
        probe_path: &str,
        app_path: &str,
        port: u16,
        https: bool,
        timeout: Option<Duration>,
        incoming: &HeaderMap,
    ) -> Response<Body> {
        let authority = self
            .forwarded_host(incoming, port)
            .unwrap_or_else(|| host_port(&self.probe_host, port));
        // The kubelet already applied the probe's httpHeaders; forward what it sent.
        let mut headers = incoming.clone();
        for name in HOP_BY_HOP {
            headers.remove(name);
        }
        // As the kubelet: no keep-alive, so idle timeouts cannot fail probes.
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        let url = ProbeUrl {
            https,
            host: self.probe_host.clone(),
            port,
            path: app_path.to_string(),
        };
        let run = async {
            let resp = self.follow_redirects(url, authority, &headers).await?;
            let status = resp.status();
            if status.is_redirection() {
                // A 3xx without a followable Location: kubelet counts it a success.
                return Ok((StatusCode::OK, Bytes::new()));
            }
            Ok::<_, FetchError>((status, read_at_most(resp.into_body(), MAX_PROBE_BODY).await))
        };
        let result = match timeout {
            Some(t) => tokio::time::timeout(t, run)
                .await
                .unwrap_or_else(|_| Err(FetchError::Timeout(t))),
            None => run.await,
        };
        match result {
            Ok((status, body)) => full(status, body),
            Err(e) => {
                tracing::error!(target: "probes", "Request to probe app failed: {e}, original URL path = {probe_path}\napp URL path = {app_path}");
                empty(StatusCode::INTERNAL_SERVER_ERROR)
            }
        }
    }

    /// Kubelet's redirect rules: follow redirects to the same host (up to 10
    /// requests); a redirect elsewhere is returned as it is.
    async fn follow_redirects(
        &self,
        mut url: ProbeUrl,
        mut authority: String,
        headers: &HeaderMap,
    ) -> Result<Response<Incoming>, FetchError> {
        let original_host = url.host.clone();
        let mut requests = 0;
        loop {
            let upstream = Upstream {
                host: &url.host,
                port: url.port,
                tls: url.https.then_some(&self.probe_tls),
                bind_source: true,
            };
            let resp = send_request(&upstream, Method::GET, &url.path, &authority, headers).await?;
            requests += 1;
            let followable = matches!(resp.status().as_u16(), 301 | 302 | 303 | 307 | 308);
            let location = resp
                .headers()
                .get(header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .filter(|l| followable && !l.is_empty());
            let Some(location) = location else {
                return Ok(resp);
            };
            let (next, next_authority) = url.resolve(location).map_err(FetchError::Request)?;
            if !next.host.eq_ignore_ascii_case(&original_host) {
                return Ok(resp);
            }
            if requests >= MAX_REDIRECTS {
                return Err(FetchError::TooManyRedirects);
            }
            if let Some(a) = next_authority {
                authority = a;
            }
            url = next;
        }
    }

    async fn probe_tcp(&self, port: u16, timeout: Option<Duration>) -> Response<Body> {
        let connect = dial(&self.probe_host, port, true);
        let result = match timeout {
            Some(t) => tokio::time::timeout(t, connect)
                .await
                .unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, "timeout"))),
            None => connect.await,
        };
        match result {
            Ok(_) => empty(StatusCode::OK),
            Err(e) => {
                tracing::debug!(target: "probes", "tcp probe of {} failed: {e}", host_port(&self.probe_host, port));
                empty(StatusCode::INTERNAL_SERVER_ERROR)
            }
        }
    }

    /// `grpc.health.v1.Health/Check`, as the kubelet's gRPC probe.
    async fn probe_grpc(
        &self,
        port: u16,
        service: &str,
        timeout: Option<Duration>,
        incoming: &HeaderMap,
    ) -> Response<Body> {
        let user_agent = incoming
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let host = self.probe_host.clone();
        let run = async move {
            let mut endpoint = tonic::transport::Endpoint::from_shared(format!(
                "http://{}",
                host_port(&host, port)
            ))
            .map_err(|e| GrpcProbeError::Connect(e.to_string()))?;
            if let Some(ua) = user_agent {
                endpoint = endpoint
                    .user_agent(ua)
                    .map_err(|e| GrpcProbeError::Connect(e.to_string()))?;
            }
            let connector = tower::service_fn(move |_: Uri| {
                let host = host.clone();
                async move { dial(&host, port, true).await.map(TokioIo::new) }
            });
            let channel = endpoint
                .connect_with_connector(connector)
                .await
                .map_err(|e| GrpcProbeError::Connect(e.to_string()))?;
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready()
                .await
                .map_err(|e| GrpcProbeError::Connect(e.to_string()))?;
            let request = tonic::Request::new(HealthCheckRequest {
                service: service.to_string(),
            });
            let response: tonic::Response<HealthCheckResponse> = grpc
                .unary(
                    request,
                    PathAndQuery::from_static(GRPC_HEALTH_CHECK),
                    tonic_prost::ProstCodec::default(),
                )
                .await
                .map_err(GrpcProbeError::Rpc)?;
            Ok::<_, GrpcProbeError>(response.into_inner().status)
        };
        let result = match timeout {
            Some(t) => tokio::time::timeout(t, run).await.unwrap_or_else(|_| {
                Err(GrpcProbeError::Rpc(tonic::Status::deadline_exceeded(
                    "timeout",
                )))
            }),
            None => run.await,
        };
        match result {
            Ok(SERVING) => empty(StatusCode::OK),
            Ok(status) => {
                tracing::debug!(target: "probes", "grpc probe: service {service:?} status {status}");
                empty(StatusCode::INTERNAL_SERVER_ERROR)
            }
            Err(GrpcProbeError::Connect(e)) => {
                tracing::error!(target: "probes", "Failed to create grpc connection to probe app: {e}");
                empty(StatusCode::INTERNAL_SERVER_ERROR)
            }
            Err(GrpcProbeError::Rpc(status)) => {
                match status.code() {
                    tonic::Code::Unimplemented => {
                        tracing::error!(target: "probes", "server does not implement the grpc health protocol (grpc.health.v1.Health): {status}")
                    }
                    tonic::Code::DeadlineExceeded => {
                        tracing::error!(target: "probes", "grpc request not finished within timeout: {status}")
                    }
                    _ => tracing::error!(target: "probes", "grpc probe failed: {status}"),
                }
                empty(StatusCode::INTERNAL_SERVER_ERROR)
            }
        }
    }
}

enum GrpcProbeError {
    Connect(String),
    Rpc(tonic::Status),
}

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

/// `grpc.health.v1.HealthCheckResponse`; `status` is the `ServingStatus` enum.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

/// `ServingStatus.SERVING`.
const SERVING: i32 = 1;

// ---------------------------------------------------------------------------
// HTTP client

/// Why an upstream request failed.
#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("dial tcp {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    #[error("TLS handshake: {0}")]
    Tls(io::Error),
    #[error("{0}")]
    Request(String),
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("unexpected status {0}")]
    Status(u16),
    #[error("context deadline exceeded (timeout {0:?})")]
    Timeout(Duration),
    #[error("stopped after {MAX_REDIRECTS} redirects")]
    TooManyRedirects,
    #[error("response exceeds {0} bytes")]
    TooLarge(usize),
}

/// Where to send a request.
struct Upstream<'a> {
    host: &'a str,
    port: u16,
    tls: Option<&'a Arc<ClientConfig>>,
    /// Bind `127.0.0.6` / `::6` (application probes).
    bind_source: bool,
}

/// `host:port`, bracketing IPv6 literals.
fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Runs `fut` until `deadline`; `None` when it passed first.
async fn until<T>(deadline: Option<Instant>, fut: impl Future<Output = T>) -> Option<T> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d, fut).await.ok(),
        None => Some(fut.await),
    }
}

/// Connects to each address of `host` in turn.
async fn dial(host: &str, port: u16, bind_source: bool) -> io::Result<TcpStream> {
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        match dial_addr(addr, bind_source).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, format!("no address for {host}"))
    }))
}

async fn dial_addr(addr: SocketAddr, bind_source: bool) -> io::Result<TcpStream> {
    let (socket, source) = if addr.is_ipv4() {
        (TcpSocket::new_v4()?, UPSTREAM_LOCAL_V4)
    } else {
        (TcpSocket::new_v6()?, UPSTREAM_LOCAL_V6)
    };
    if bind_source && let Err(e) = socket.bind(SocketAddr::new(source, 0)) {
        // `::6` exists only where the Pod's network setup adds it to `lo`.
        tracing::debug!(target: "probes", "cannot bind probe source {source}: {e}; using the default source address");
    }
    let stream = socket.connect(addr).await?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// One request on a new connection; HTTPS negotiates HTTP/2 through ALPN.
async fn send_request(
    upstream: &Upstream<'_>,
    method: Method,
    path_and_query: &str,
    authority: &str,
    headers: &HeaderMap,
) -> Result<Response<Incoming>, FetchError> {
    let stream = dial(upstream.host, upstream.port, upstream.bind_source)
        .await
        .map_err(|source| FetchError::Connect {
            addr: host_port(upstream.host, upstream.port),
            source,
        })?;
    let Some(tls) = upstream.tls else {
        let req = build_request(method, path_and_query, authority, headers, false)?;
        return send_h1(TokioIo::new(stream), req).await;
    };
    let name = ServerName::try_from(upstream.host.to_string())
        .map_err(|e| FetchError::Request(format!("server name {}: {e}", upstream.host)))?;
    let stream = tokio_rustls::TlsConnector::from(tls.clone())
        .connect(name, stream)
        .await
        .map_err(FetchError::Tls)?;
    if stream.get_ref().1.alpn_protocol() == Some(b"h2".as_slice()) {
        let req = build_request(method, path_and_query, authority, headers, true)?;
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender.send_request(req).await?)
    } else {
        let req = build_request(method, path_and_query, authority, headers, false)?;
        send_h1(TokioIo::new(stream), req).await
    }
}

async fn send_h1<T>(io: T, req: Request<Empty<Bytes>>) -> Result<Response<Incoming>, FetchError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender.send_request(req).await?)
}

/// HTTP/1 requests carry the authority in `Host`; HTTP/2 ones in the URI
/// (`:authority`), without connection-specific headers.
fn build_request(
    method: Method,
    path_and_query: &str,
    authority: &str,
    headers: &HeaderMap,
    h2: bool,
) -> Result<Request<Empty<Bytes>>, FetchError> {
    let bad = |e: &dyn std::fmt::Display| FetchError::Request(format!("invalid request: {e}"));
    let uri = if h2 {
        format!("https://{authority}{path_and_query}")
    } else {
        path_and_query.to_string()
    };
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .body(Empty::new())
        .map_err(|e| bad(&e))?;
    *req.headers_mut() = headers.clone();
    if h2 {
        req.headers_mut().remove(header::HOST);
        req.headers_mut().remove(header::CONNECTION);
    } else {
        let host = HeaderValue::from_str(authority).map_err(|e| bad(&e))?;
        req.headers_mut().insert(header::HOST, host);
    }
    Ok(req)
}

/// Reads a whole body, failing beyond `cap` bytes.
async fn read_capped(mut body: Incoming, cap: usize) -> Result<Bytes, FetchError> {
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            if buf.len() + data.len() > cap {
                return Err(FetchError::TooLarge(cap));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(buf))
}

/// Reads up to `cap` bytes of a body; errors end it early.
async fn read_at_most(mut body: Incoming, cap: usize) -> Bytes {
    let mut buf = Vec::new();
    while buf.len() < cap {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    let take = data.len().min(cap - buf.len());
                    buf.extend_from_slice(&data[..take]);
                }
            }
            _ => break,
        }
    }
    Bytes::from(buf)
}

/// A TLS client that accepts any server certificate, as the kubelet's HTTPS
/// probes do (`InsecureSkipVerify`); handshake signatures are still checked.
fn insecure_client_config(http2: bool) -> Result<ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(SkipServerVerification(provider)))
        .with_no_client_auth();
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(config)
}

#[derive(Debug)]
struct SkipServerVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for SkipServerVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::server::conn::{http1, http2};
    use hyper::service::service_fn;
    use prost::Message;
    use rustls::pki_types::PrivateKeyDer;
    use tokio::sync::oneshot;

    /// Every wait in these tests is bounded by this.
    const WAIT: Duration = Duration::from_secs(10);

    const LIVE_STATS: &str = "cluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: 1\nserver.state: 0\nlistener_manager.workers_started: 1";

    type Handler = dyn Fn(&Parts, SocketAddr) -> Response<Full<Bytes>> + Send + Sync;

    /// A fake HTTP/1 server on 127.0.0.1; the handler sees the peer address.
    async fn fake_http(
        handler: impl Fn(&Parts, SocketAddr) -> Response<Full<Bytes>> + Send + Sync + 'static,
    ) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let handler: Arc<Handler> = Arc::new(handler);
        tokio::spawn(async move {
            while let Ok((stream, peer)) = listener.accept().await {
                let handler = handler.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (parts, _) = req.into_parts();
                        let resp = handler(&parts, peer);
                        async move { Ok::<_, Infallible>(resp) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        port
    }

    fn reply(status: u16, headers: &[(&str, &str)], body: &str) -> Response<Full<Bytes>> {
        let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
        *resp.status_mut() = StatusCode::from_u16(status).unwrap();
        for (k, v) in headers {
            resp.headers_mut().insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        resp
    }

    /// A fake Envoy admin serving `/stats`; `None` answers 503.
    async fn fake_admin(stats: Option<&str>) -> (u16, Arc<Mutex<Option<String>>>) {
        let shared = Arc::new(Mutex::new(stats.map(str::to_string)));
        let stats = shared.clone();
        let port = fake_http(
            move |parts, _| match (parts.uri.path(), &*stats.lock().unwrap()) {
                ("/stats", Some(body)) => reply(200, &[], body),
                _ => reply(503, &[], ""),
            },
        )
        .await;
        (port, shared)
    }

    /// A port nothing listens on.
    fn dead_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }

    fn options(admin_port: u16) -> StatusOptions {
        StatusOptions {
            admin_port,
            instance_ip: "127.0.0.1".to_string(),
            ..StatusOptions::default()
        }
    }

    fn new_state(options: StatusOptions) -> Arc<StatusState> {
        Arc::new(StatusState::new(options).unwrap())
    }

    struct Running {
        addr: SocketAddr,
        state: Arc<StatusState>,
        stop: oneshot::Sender<()>,
        task: tokio::task::JoinHandle<Result<(), StatusError>>,
    }

    async fn start(mut options: StatusOptions) -> Running {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        options.status_port = addr.port();
        let state = new_state(options);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, state.clone(), stopped));
        Running {
            addr,
            state,
            stop,
            task,
        }
    }

    async fn call(
        addr: SocketAddr,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, HeaderMap, String) {
        let mut map = HeaderMap::new();
        let mut authority = addr.to_string();
        for (k, v) in headers {
            if k.eq_ignore_ascii_case("host") {
                authority = v.to_string();
            } else {
                map.append(
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
        }
        let upstream = Upstream {
            host: "127.0.0.1",
            port: addr.port(),
            tls: None,
            bind_source: false,
        };
        let resp = tokio::time::timeout(
            WAIT,
            send_request(&upstream, method, path, &authority, &map),
        )
        .await
        .unwrap()
        .unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = tokio::time::timeout(WAIT, resp.into_body().collect())
            .await
            .unwrap()
            .unwrap()
            .to_bytes();
        (status, headers, String::from_utf8(body.to_vec()).unwrap())
    }

    async fn get(addr: SocketAddr, path: &str) -> (StatusCode, String) {
        let (status, _, body) = call(addr, Method::GET, path, &[]).await;
        (status, body)
    }

    // --- readiness (ready.TestEnvoyStats and friends) ---

    #[tokio::test]
    async fn envoy_stats_error_strings() {
        let cases = [
            (
                "only lds",
                "listener_manager.lds.update_success: 1",
                "config not fully received from XDS server: cds updates: 0 successful, 0 rejected; lds updates: 1 successful, 0 rejected",
            ),
            (
                "only cds",
                "cluster_manager.cds.update_success: 1",
                "config not fully received from XDS server: cds updates: 1 successful, 0 rejected; lds updates: 0 successful, 0 rejected",
            ),
            (
                "reject CDS",
                "cluster_manager.cds.update_rejected: 1\nlistener_manager.lds.update_success: 1",
                "config received from XDS server, but was rejected: cds updates: 0 successful, 1 rejected; lds updates: 1 successful, 0 rejected",
            ),
            (
                "no config",
                "",
                "config not received from XDS server (is Istiod running?): cds updates: 0 successful, 0 rejected; lds updates: 0 successful, 0 rejected",
            ),
            (
                "workers not started",
                "\ncluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: 1\nlistener_manager.workers_started: 0\nserver.state: 0",
                "workers have not yet started",
            ),
            (
                "not live",
                "cluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: 1\nlistener_manager.workers_started: 1\nserver.state: 2",
                "server is not live, current state is: PRE_INITIALIZING",
            ),
            (
                "draining",
                "cluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: 1\nlistener_manager.workers_started: 1\nserver.state: 1",
                "server is not live, current state is: DRAINING",
            ),
            (
                "initializing without workers stat (TestEnvoyInitializing)",
                "cluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: 1\nserver.state: 2",
                "failed to get readiness stats: listener_manager.workers_started is not yet updated: cluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: 1\nserver.state: 2",
            ),
            (
                "only server stats (TestEnvoyNoClusterManagerStats)",
                "server.state: 0",
                "config not received from XDS server (is Istiod running?): cds updates: 0 successful, 0 rejected; lds updates: 0 successful, 0 rejected",
            ),
            (
                "unparsable stat",
                "cluster_manager.cds.update_success: x\nlistener_manager.lds.update_success: 1",
                "failed parsing Envoy stat cluster_manager.cds.update_success (error: invalid digit found in string) line: cluster_manager.cds.update_success: x",
            ),
        ];
        for (name, stats, want) in cases {
            let (port, _) = fake_admin(Some(stats)).await;
            let state = new_state(options(port));
            assert_eq!(state.check_ready().await, Err(want.to_string()), "{name}");
        }
        let (port, _) = fake_admin(Some(&format!("\n{LIVE_STATS}"))).await;
        assert_eq!(new_state(options(port)).check_ready().await, Ok(()), "full");
    }

    #[tokio::test]
    async fn envoy_admin_unreachable() {
        let port = dead_port();
        let err = new_state(options(port)).check_ready().await.unwrap_err();
        let url = format!("Get \"http://127.0.0.1:{port}/stats?usedonly&filter=");
        assert!(err.starts_with(&url), "{err}");
        assert!(err.contains("dial tcp 127.0.0.1:"), "{err}");

        let (port, _) = fake_admin(None).await;
        let err = new_state(options(port)).check_ready().await.unwrap_err();
        assert!(err.ends_with("unexpected status 503"), "{err}");
    }

    #[tokio::test]
    async fn readiness_is_cached_once_ready() {
        // TestEnvoyReadinessCache: once ready, Envoy's stats are not read again.
        let (port, stats) = fake_admin(Some("")).await;
        let state = new_state(options(port));
        assert!(state.check_ready().await.is_err());
        assert!(state.check_ready().await.is_err());
        assert_eq!(state.metrics().startup_duration_seconds.get(), 0.0);

        *stats.lock().unwrap() = Some(LIVE_STATS.to_string());
        assert_eq!(state.check_ready().await, Ok(()));
        assert!(state.metrics().startup_duration_seconds.get() > 0.0);

        *stats.lock().unwrap() = Some(String::new());
        assert_eq!(state.check_ready().await, Ok(()));
        *stats.lock().unwrap() = None;
        assert_eq!(state.check_ready().await, Ok(()));
    }

    #[tokio::test]
    async fn terminated_fails_readiness_even_when_cached() {
        let (port, _) = fake_admin(Some(LIVE_STATS)).await;
        let state = new_state(options(port));
        assert_eq!(state.check_ready().await, Ok(()));
        assert!(state.terminate("received signal: terminated"));
        assert!(!state.terminate("something else"), "the first cause wins");
        assert_eq!(
            state.check_ready().await,
            Err("server is terminated: received signal: terminated".to_string())
        );
        let cause = tokio::time::timeout(WAIT, state.terminated())
            .await
            .unwrap();
        assert_eq!(cause, "received signal: terminated");
    }

    #[tokio::test]
    async fn ready_endpoint_answers_503_with_the_reason_then_200() {
        let (port, stats) = fake_admin(Some("")).await;
        let server = start(options(port)).await;
        let (status, body) = get(server.addr, READY_PATH).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body.starts_with("config not received from XDS server"),
            "{body}"
        );

        *stats.lock().unwrap() = Some(LIVE_STATS.to_string());
        assert_eq!(get(server.addr, READY_PATH).await.0, StatusCode::OK);

        // Extra conditions are AND-ed after Envoy's, with their own message.
        let guard = server
            .state
            .readiness_pending("waiting for the first NDS push");
        assert_eq!(
            get(server.addr, READY_PATH).await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "waiting for the first NDS push".to_string()
            )
        );
        guard.ready();
        assert_eq!(get(server.addr, READY_PATH).await.0, StatusCode::OK);

        let dns_ready = Arc::new(AtomicBool::new(false));
        let flag = dns_ready.clone();
        server.state.add_readiness_check("dns", move || {
            if flag.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err(
                    "istio DNS capture is turned ON and DNS lookup table is not ready yet"
                        .to_string(),
                )
            }
        });
        assert_eq!(
            get(server.addr, READY_PATH).await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "istio DNS capture is turned ON and DNS lookup table is not ready yet".to_string()
            )
        );
        dns_ready.store(true, Ordering::SeqCst);
        assert_eq!(get(server.addr, READY_PATH).await.0, StatusCode::OK);

        server.state.terminate("received signal: terminated");
        assert_eq!(
            get(server.addr, READY_PATH).await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "server is terminated: received signal: terminated".to_string()
            )
        );
    }

    #[tokio::test]
    async fn without_envoy_readiness_skips_envoy() {
        let state = new_state(StatusOptions {
            envoy: false,
            ..options(dead_port())
        });
        assert_eq!(state.check_ready().await, Ok(()));
    }

    // --- merged metrics (TestStats, TestStatsError, TestStatsContentType) ---

    type Seen = Arc<Mutex<Vec<(String, HeaderMap)>>>;

    async fn fake_metrics(content_type: &str, body: &str) -> (u16, Seen) {
        let seen: Seen = Arc::default();
        let record = seen.clone();
        let (content_type, body) = (content_type.to_string(), body.to_string());
        let port = fake_http(move |parts, _| {
            record
                .lock()
                .unwrap()
                .push((parts.uri.to_string(), parts.headers.clone()));
            reply(200, &[("content-type", &content_type)], &body)
        })
        .await;
        (port, seen)
    }

    fn metrics_options(envoy_port: u16, app_ports: &[u16]) -> StatusOptions {
        let annotations = match app_ports {
            [] => None,
            [port] => Some(format!(
                r#"{{"scrape":"true","path":"/metrics","port":"{port}"}}"#
            )),
            ports => Some(format!(
                r#"{{"scrape":"true","targets":[{}]}}"#,
                ports
                    .iter()
                    .map(|p| format!(r#"{{"port":"{p}","path":"/metrics"}}"#))
                    .collect::<Vec<_>>()
                    .join(",")
            )),
        };
        StatusOptions {
            envoy_prometheus_port: envoy_port,
            prometheus_annotations: annotations,
            ..options(dead_port())
        }
    }

    const ENVOY_METRICS: &str = "# TYPE envoy_metric counter\nenvoy_metric{} 0\n";
    const APP_METRICS: &str = "# TYPE app_metric counter\napp_metric{} 3\n";

    fn position(body: &str, needle: &str) -> usize {
        body.find(needle)
            .unwrap_or_else(|| panic!("{needle:?} missing from:\n{body}"))
    }

    #[tokio::test]
    async fn metrics_merge_agent_then_envoy_then_app() {
        let (envoy, envoy_seen) = fake_metrics("text/plain; version=0.0.4", ENVOY_METRICS).await;
        let (app, app_seen) = fake_metrics("text/plain; version=0.0.4", APP_METRICS).await;
        let server = start(metrics_options(envoy, &[app])).await;
        let accept = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.1";
        let (status, headers, body) = call(
            server.addr,
            Method::GET,
            "/stats/prometheus?usedonly",
            &[
                ("accept", accept),
                ("user-agent", "Prometheus/3.0"),
                ("x-prometheus-scrape-timeout-seconds", "10"),
            ],
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers[header::CONTENT_TYPE], FMT_TEXT);
        let agent = position(
            &body,
            "# TYPE istio_agent_scrapes_total counter\nistio_agent_scrapes_total 1\n",
        );
        let envoy_at = position(&body, ENVOY_METRICS);
        let app_at = position(&body, APP_METRICS);
        assert!(agent < envoy_at && envoy_at < app_at, "{body}");
        assert!(body.ends_with(APP_METRICS));

        {
            let envoy_seen = envoy_seen.lock().unwrap();
            assert_eq!(envoy_seen[0].0, "/stats/prometheus?usedonly");
            assert_eq!(
                envoy_seen[0].1[header::ACCEPT],
                "text/plain;version=0.0.4;q=0.3, text/plain;version=0.0.4;q=0.1"
            );
            assert_eq!(envoy_seen[0].1[header::USER_AGENT], "Prometheus/3.0");
            assert_eq!(envoy_seen[0].1[SCRAPE_TIMEOUT_HEADER], "10");
            let app_seen = app_seen.lock().unwrap();
            assert_eq!(app_seen[0].0, "/metrics");
            assert!(
                !app_seen[0].1[header::ACCEPT]
                    .to_str()
                    .unwrap()
                    .contains("protobuf")
            );
        }

        // `/metrics` is the same endpoint.
        let (status, body) = get(server.addr, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("istio_agent_scrapes_total 2\n"), "{body}");
    }

    #[tokio::test]
    async fn metrics_survive_failing_sources() {
        let (envoy, _) = fake_metrics("text/plain", ENVOY_METRICS).await;
        let server = start(metrics_options(envoy, &[dead_port()])).await;
        let (status, body) = get(server.addr, "/stats/prometheus").await;
        assert_eq!(status, StatusCode::OK);
        position(&body, ENVOY_METRICS);
        position(&body, "istio_agent_scrapes_total 1\n");
        position(
            &body,
            "istio_agent_scrape_failures_total{type=\"application\"} 1\n",
        );
        let failures = &server.state.metrics().scrape_failures_total;
        assert_eq!(failures.with_label_values(&[SCRAPE_APP]).get(), 1);

        // Envoy down, application up.
        let (app, _) = fake_metrics("text/plain", APP_METRICS).await;
        let server = start(metrics_options(dead_port(), &[app])).await;
        let (status, body) = get(server.addr, "/stats/prometheus").await;
        assert_eq!(status, StatusCode::OK);
        position(&body, APP_METRICS);
        position(
            &body,
            "istio_agent_scrape_failures_total{type=\"envoy\"} 1\n",
        );

        // An application answering 500 counts as a failure too.
        let app = fake_http(|_, _| reply(500, &[], "boom")).await;
        let (envoy, _) = fake_metrics("text/plain", ENVOY_METRICS).await;
        let server = start(metrics_options(envoy, &[app])).await;
        let (status, body) = get(server.addr, "/stats/prometheus").await;
        assert_eq!(status, StatusCode::OK);
        assert!(!body.contains("boom"));
        let failures = &server.state.metrics().scrape_failures_total;
        assert_eq!(failures.with_label_values(&[SCRAPE_APP]).get(), 1);
    }

    #[tokio::test]
    async fn openmetrics_application_keeps_its_content_type() {
        let om = "# TYPE jvm info\njvm_info{version=\"16\"} 1.0\n# EOF\n";
        let (envoy, _) = fake_metrics("text/plain", ENVOY_METRICS).await;
        let (app, _) = fake_metrics(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            om,
        )
        .await;
        let server = start(metrics_options(envoy, &[app])).await;
        let (_, headers, body) = call(
            server.addr,
            Method::GET,
            "/stats/prometheus",
            &[(
                "accept",
                "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
            )],
        )
        .await;
        assert_eq!(headers[header::CONTENT_TYPE], FMT_OPENMETRICS_1_0_0);
        assert!(body.ends_with(om), "{body}");
        assert_eq!(body.matches("# EOF").count(), 1);
    }

    #[tokio::test]
    async fn multiple_targets_keep_order_and_one_eof() {
        let om = "application/openmetrics-text; version=0.0.1";
        let (first, _) = fake_metrics(om, "# TYPE first counter\nfirst_total 1\n# EOF\n").await;
        let (second, _) = fake_metrics(om, "# TYPE second counter\nsecond_total 2\n# EOF").await;
        let server = start(metrics_options(dead_port(), &[first, dead_port(), second])).await;
        let (status, headers, body) = call(server.addr, Method::GET, "/metrics", &[]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers[header::CONTENT_TYPE], FMT_OPENMETRICS_0_0_1);
        assert!(position(&body, "first_total 1\n") < position(&body, "second_total 2\n"));
        assert!(body.ends_with("second_total 2\n# EOF\n"), "{body}");
        assert_eq!(body.matches("# EOF").count(), 1);
        let failures = &server.state.metrics().scrape_failures_total;
        assert_eq!(failures.with_label_values(&[SCRAPE_APP]).get(), 1);
    }

    #[tokio::test]
    async fn metrics_localhost_only() {
        let state = new_state(StatusOptions {
            metrics_localhost_only: true,
            ..metrics_options(dead_port(), &[])
        });
        let req = Request::get("/stats/prometheus")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = route(&state, req, "10.0.0.1:5555".parse().unwrap()).await;
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    }

    #[test]
    fn negotiates_metrics_format() {
        for (content_type, want) in [
            (
                "application/openmetrics-text; version=0.0.1",
                FMT_OPENMETRICS_0_0_1,
            ),
            (
                "application/openmetrics-text; version=1.0.0",
                FMT_OPENMETRICS_1_0_0,
            ),
            (
                "application/openmetrics-text; version=0.0.1; charset=utf-8",
                FMT_OPENMETRICS_0_0_1,
            ),
            (
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                FMT_OPENMETRICS_1_0_0,
            ),
            ("application/openmetrics-text", FMT_OPENMETRICS_0_0_1),
            ("application/openmetrics-text; version=9", FMT_TEXT),
            ("text/plain; version=0.0.4; charset=utf-8", FMT_TEXT),
            ("", FMT_TEXT),
        ] {
            assert_eq!(
                negotiate_metrics_format(content_type),
                want,
                "{content_type}"
            );
        }
    }

    #[test]
    fn accept_never_asks_for_protobuf() {
        let proto = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited";
        assert_eq!(filter_accept(proto, true), "text/plain;version=0.0.4");
        assert_eq!(filter_accept("*/*", false), "text/plain;version=0.0.4");
        assert_eq!(
            filter_accept("application/*;q=0.5", true),
            "application/openmetrics-text;version=0.0.1;q=0.5"
        );
        assert_eq!(
            filter_accept("application/*", false),
            "text/plain;version=0.0.4"
        );
        assert_eq!(
            filter_accept(
                "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
                false
            ),
            "text/plain;q=0.5"
        );
        assert_eq!(filter_accept("garbage", true), "text/plain;version=0.0.4");
    }

    #[test]
    fn strips_openmetrics_eof() {
        assert_eq!(
            strip_openmetrics_eof(Bytes::from_static(b"a 1\n# EOF\r\n")),
            Bytes::from_static(b"a 1\n")
        );
        assert_eq!(
            strip_openmetrics_eof(Bytes::from_static(b"a 1\n")),
            Bytes::from_static(b"a 1\n")
        );
    }

    // --- application probes (TestAppProbe, TestHttpsAppProbe, TestGRPCAppProbe) ---

    async fn fake_app() -> u16 {
        fake_http(|parts, peer| {
            let header = |name: &str| {
                parts
                    .headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string()
            };
            let path = parts.uri.path();
            match path {
                "/hello" => reply(200, &[], "welcome, it works"),
                "/redirect" => reply(301, &[("location", "/hello")], ""),
                "/redirect-loop" => reply(301, &[("location", "/redirect-loop")], ""),
                "/remote-redirect" => reply(301, &[("location", "http://example.com/foo")], ""),
                "/relative-redirect" => reply(302, &[("location", "hello")], ""),
                "/header" => {
                    if header("host") == "test.com:9999" && header("some-header") == "some-value" {
                        reply(200, &[], "")
                    } else {
                        reply(400, &[], "")
                    }
                }
                "/host" => reply(200, &[], &header("host")),
                "/connection" => reply(200, &[], &header("connection")),
                "/source" => reply(200, &[], &peer.ip().to_string()),
                "/big" => reply(200, &[], &"x".repeat(3 * MAX_PROBE_BODY)),
                p if p.starts_with("/status/") => {
                    let code: u16 = p["/status/".len()..].parse().unwrap();
                    reply(code, &[("location", "/hello")], "")
                }
                _ => reply(404, &[], ""),
            }
        })
        .await
    }

    fn probers(entries: &[(&str, String)]) -> String {
        let fields: Vec<String> = entries
            .iter()
            .map(|(path, probe)| format!("{path:?}: {probe}"))
            .collect();
        format!("{{{}}}", fields.join(","))
    }

    fn http_get(path: &str, port: u16) -> String {
        format!(r#"{{"httpGet": {{"path": "{path}", "port": {port}}}, "timeoutSeconds": 5}}"#)
    }

    async fn probe(server: &Running, path: &str, headers: &[(&str, &str)]) -> (StatusCode, String) {
        let (status, _, body) = call(server.addr, Method::GET, path, headers).await;
        (status, body)
    }

    #[tokio::test]
    async fn http_probes_pass_the_application_answer_through() {
        let app = fake_app().await;
        let dead = dead_port();
        let paths = [
            "hello",
            "redirect",
            "redirect-loop",
            "remote-redirect",
            "relative-redirect",
            "header",
            "host",
            "connection",
            "source",
            "big",
            "status/503",
            "status/404",
            "status/302",
            "status/304",
            "status/511",
        ];
        let mut entries: Vec<(String, String)> = paths
            .iter()
            .map(|p| {
                let container = p.replace('/', "-");
                (
                    format!("/app-health/{container}/livez"),
                    http_get(&format!("/{p}"), app),
                )
            })
            .collect();
        entries.push(("/app-health/relative/readyz".into(), http_get("hello", app)));
        entries.push((
            "/app-lifecycle/hello/prestopz".into(),
            http_get("/hello", app),
        ));
        entries.push(("/app-health/dead/readyz".into(), http_get("/hello", dead)));
        let entries: Vec<(&str, String)> = entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        let server = start(StatusOptions {
            kube_app_probers: probers(&entries),
            ..options(dead_port())
        })
        .await;

        let ok = (StatusCode::OK, "welcome, it works".to_string());
        assert_eq!(probe(&server, "/app-health/hello/livez", &[]).await, ok);
        assert_eq!(probe(&server, "/app-health/relative/readyz", &[]).await, ok);
        assert_eq!(
            probe(&server, "/app-lifecycle/hello/prestopz", &[]).await,
            ok
        );
        assert_eq!(probe(&server, "/app-health/redirect/livez", &[]).await, ok);
        assert_eq!(
            probe(&server, "/app-health/relative-redirect/livez", &[]).await,
            ok
        );
        assert_eq!(
            probe(&server, "/app-health/status-302/livez", &[]).await,
            ok
        );
        // Redirects elsewhere and unfollowable 3xx count as success, as for the kubelet.
        assert_eq!(
            probe(&server, "/app-health/remote-redirect/livez", &[]).await,
            (StatusCode::OK, String::new())
        );
        assert_eq!(
            probe(&server, "/app-health/status-304/livez", &[]).await.0,
            StatusCode::OK
        );
        assert_eq!(
            probe(&server, "/app-health/redirect-loop/livez", &[])
                .await
                .0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        for (path, code) in [
            ("/app-health/status-503/livez", 503),
            ("/app-health/status-404/livez", 404),
            ("/app-health/status-511/livez", 511),
        ] {
            assert_eq!(probe(&server, path, &[]).await.0.as_u16(), code, "{path}");
        }
        // The kubelet's headers (which carry the probe's httpHeaders) are forwarded.
        assert_eq!(
            probe(
                &server,
                "/app-health/header/livez",
                &[("host", "test.com:9999"), ("some-header", "some-value")]
            )
            .await
            .0,
            StatusCode::OK
        );
        // A Host naming the status port is rewritten to the application's port.
        let status_host = format!("10.1.2.3:{}", server.addr.port());
        assert_eq!(
            probe(&server, "/app-health/host/livez", &[("host", &status_host)]).await,
            (StatusCode::OK, format!("10.1.2.3:{app}"))
        );
        assert_eq!(
            probe(
                &server,
                "/app-health/connection/livez",
                &[("connection", "keep-alive")]
            )
            .await,
            (StatusCode::OK, "close".to_string())
        );
        // Sent from 127.0.0.6, which iptables lets through to the application.
        assert_eq!(
            probe(&server, "/app-health/source/livez", &[]).await,
            (StatusCode::OK, "127.0.0.6".to_string())
        );
        let (status, body) = probe(&server, "/app-health/big/livez", &[]).await;
        assert_eq!((status, body.len()), (StatusCode::OK, MAX_PROBE_BODY));
        assert_eq!(
            probe(&server, "/app-health/dead/readyz", &[]).await.0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(
            probe(&server, "/app-health/unknown/readyz", &[]).await,
            (
                StatusCode::BAD_REQUEST,
                "app prober config does not exists for /app-health/unknown/readyz".to_string()
            )
        );
        assert_eq!(
            probe(&server, "/bad-path-should-be-404", &[]).await.0,
            StatusCode::NOT_FOUND
        );
    }

    #[tokio::test]
    async fn http_probe_times_out() {
        // Accepts and never answers.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let _silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let probe_json =
            format!(r#"{{"httpGet": {{"path": "/", "port": {port}}}, "timeoutSeconds": 1}}"#);
        let server = start(StatusOptions {
            kube_app_probers: probers(&[("/app-health/slow/readyz", probe_json)]),
            ..options(dead_port())
        })
        .await;
        let started = std::time::Instant::now();
        assert_eq!(
            probe(&server, "/app-health/slow/readyz", &[]).await.0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert!(started.elapsed() < WAIT);
    }

    #[tokio::test]
    async fn tcp_probes() {
        let app = fake_app().await;
        let tcp = |port: u16| format!(r#"{{"tcpSocket": {{"port": {port}}}}}"#);
        let json = probers(&[
            ("/app-health/up/livez", tcp(app)),
            ("/app-health/down/livez", tcp(dead_port())),
        ]);
        for instance_ip in ["127.0.0.1", "localhost", ""] {
            let server = start(StatusOptions {
                kube_app_probers: json.clone(),
                instance_ip: instance_ip.to_string(),
                ..options(dead_port())
            })
            .await;
            assert_eq!(
                probe(&server, "/app-health/up/livez", &[]).await.0,
                StatusCode::OK,
                "{instance_ip:?}"
            );
            assert_eq!(
                probe(&server, "/app-health/down/livez", &[]).await.0,
                StatusCode::INTERNAL_SERVER_ERROR
            );
        }
        // Istio's "tcp-livez-wrapped-ipv6": a bracketed INSTANCE_IP cannot be dialled.
        let server = start(StatusOptions {
            kube_app_probers: json,
            instance_ip: "[::1]".to_string(),
            ..options(dead_port())
        })
        .await;
        assert_eq!(
            probe(&server, "/app-health/up/livez", &[]).await.0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    async fn fake_https(alpn: &[&str]) -> u16 {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let cert = certified.cert.der().clone();
        let key = PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
        config.alpn_protocols = alpn.iter().map(|a| a.as_bytes().to_vec()).collect();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
                    let svc = service_fn(|req: Request<Incoming>| async move {
                        let version = format!("{:?}", req.version());
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(version))))
                    });
                    let io = TokioIo::new(tls);
                    if h2 {
                        let _ = http2::Builder::new(TokioExecutor::new())
                            .serve_connection(io, svc)
                            .await;
                    } else {
                        let _ = http1::Builder::new().serve_connection(io, svc).await;
                    }
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn https_probes_negotiate_the_protocol() {
        for (alpn, http2_probing, want) in [
            (&[][..], true, "HTTP/1.1"),
            (&["http/1.1"][..], true, "HTTP/1.1"),
            (&["h2"][..], true, "HTTP/2.0"),
            (&["h2", "http/1.1"][..], true, "HTTP/2.0"),
            (&["h2", "http/1.1"][..], false, "HTTP/1.1"),
        ] {
            let app = fake_https(alpn).await;
            let probe_json = format!(
                r#"{{"httpGet": {{"path": "/hello", "port": {app}, "scheme": "HTTPS"}}, "timeoutSeconds": 5}}"#
            );
            let server = start(StatusOptions {
                kube_app_probers: probers(&[("/app-health/tls/readyz", probe_json)]),
                http2_probing,
                ..options(dead_port())
            })
            .await;
            assert_eq!(
                probe(
                    &server,
                    "/app-health/tls/readyz",
                    &[("host", "127.0.0.1:15020")]
                )
                .await,
                (StatusCode::OK, want.to_string()),
                "{alpn:?} {http2_probing}"
            );
        }
        // No protocol in common: the handshake fails.
        let app = fake_https(&["foo"]).await;
        let probe_json = format!(
            r#"{{"httpGet": {{"path": "/hello", "port": {app}, "scheme": "HTTPS"}}, "timeoutSeconds": 5}}"#
        );
        let server = start(StatusOptions {
            kube_app_probers: probers(&[("/app-health/tls/readyz", probe_json)]),
            ..options(dead_port())
        })
        .await;
        assert_eq!(
            probe(&server, "/app-health/tls/readyz", &[]).await.0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    /// A fake `grpc.health.v1.Health` over h2c: "" and "foo" are SERVING,
    /// "sick" NOT_SERVING, anything else NOT_FOUND.
    async fn fake_grpc_health() -> (u16, Arc<Mutex<Option<String>>>) {
        let user_agent = Arc::new(Mutex::new(None));
        let seen = user_agent.clone();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let seen = seen.clone();
                        async move {
                            *seen.lock().unwrap() = req
                                .headers()
                                .get(header::USER_AGENT)
                                .map(|v| v.to_str().unwrap().to_string());
                            let path = req.uri().path().to_string();
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let (status, grpc_status) = if path == GRPC_HEALTH_CHECK {
                                let request = HealthCheckRequest::decode(&body[5..]).unwrap();
                                match request.service.as_str() {
                                    "" | "foo" => (Some(SERVING), "0"),
                                    "sick" => (Some(2), "0"),
                                    _ => (None, "5"),
                                }
                            } else {
                                (None, "12")
                            };
                            let mut frames = Vec::new();
                            if let Some(status) = status {
                                let message = HealthCheckResponse { status }.encode_to_vec();
                                let mut data = vec![0u8];
                                data.extend_from_slice(&(message.len() as u32).to_be_bytes());
                                data.extend_from_slice(&message);
                                frames.push(Ok::<_, Infallible>(Frame::data(Bytes::from(data))));
                            }
                            let mut trailers = HeaderMap::new();
                            trailers.insert("grpc-status", HeaderValue::from_static(grpc_status));
                            frames.push(Ok(Frame::trailers(trailers)));
                            let mut resp =
                                Response::new(StreamBody::new(futures::stream::iter(frames)));
                            resp.headers_mut().insert(
                                header::CONTENT_TYPE,
                                HeaderValue::from_static("application/grpc"),
                            );
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        (port, user_agent)
    }

    #[tokio::test]
    async fn grpc_probes() {
        let (app, user_agent) = fake_grpc_health().await;
        let grpc = |port: u16, service: &str| {
            format!(r#"{{"gRPC": {{"port": {port}, "service": {service}}}, "timeoutSeconds": 5}}"#)
        };
        let server = start(StatusOptions {
            kube_app_probers: probers(&[
                ("/app-health/default/readyz", grpc(app, "null")),
                ("/app-health/foo/readyz", grpc(app, r#""foo""#)),
                ("/app-health/sick/readyz", grpc(app, r#""sick""#)),
                ("/app-health/missing/readyz", grpc(app, r#""missing""#)),
                ("/app-health/dead/readyz", grpc(dead_port(), r#""foo""#)),
            ]),
            ..options(dead_port())
        })
        .await;
        let kubelet = [("user-agent", "kube-probe/1.30")];
        assert_eq!(
            probe(&server, "/app-health/default/readyz", &kubelet)
                .await
                .0,
            StatusCode::OK
        );
        let ua = user_agent.lock().unwrap().clone().unwrap();
        assert!(ua.starts_with("kube-probe/1.30"), "{ua}");
        assert_eq!(
            probe(&server, "/app-health/foo/readyz", &[]).await.0,
            StatusCode::OK
        );
        for path in [
            "/app-health/sick/readyz",
            "/app-health/missing/readyz",
            "/app-health/dead/readyz",
        ] {
            assert_eq!(
                probe(&server, path, &[]).await.0,
                StatusCode::INTERNAL_SERVER_ERROR,
                "{path}"
            );
        }
    }

    // --- quit and drain (TestHandleQuit) ---

    #[tokio::test]
    async fn quit_and_drain_from_localhost() {
        let server = start(StatusOptions {
            envoy: false,
            ..options(dead_port())
        })
        .await;
        let state = &server.state;
        for path in [QUIT_PATH, DRAIN_PATH] {
            let (status, _, body) = call(server.addr, Method::GET, path, &[]).await;
            assert_eq!(
                (status, body.as_str()),
                (StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n")
            );
        }
        assert!(!state.skip_drain());
        assert_eq!(state.termination_cause(), None);

        let (status, _, body) = call(server.addr, Method::POST, DRAIN_PATH, &[]).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "OK"));
        tokio::time::timeout(WAIT, state.drain_requested())
            .await
            .unwrap();
        assert!(state.is_drain_requested() && state.skip_drain());
        assert!(!state.is_quit_requested());
        assert_eq!(
            state.termination_cause(),
            None,
            "draining does not terminate"
        );

        let (status, _, body) = call(server.addr, Method::POST, QUIT_PATH, &[]).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "OK"));
        tokio::time::timeout(WAIT, state.quit_requested())
            .await
            .unwrap();
        assert!(state.is_quit_requested());
        let cause = tokio::time::timeout(WAIT, state.terminated())
            .await
            .unwrap();
        assert_eq!(cause, "/quitquitquit called");
    }

    #[tokio::test]
    async fn quit_and_drain_refuse_other_hosts() {
        let state = new_state(options(dead_port()));
        for path in [QUIT_PATH, DRAIN_PATH] {
            let post = || Request::post(path).body(Empty::<Bytes>::new()).unwrap();
            let resp = route(&state, post(), "10.1.2.3:4567".parse().unwrap()).await;
            assert_eq!(resp.status(), StatusCode::FORBIDDEN);
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"Only requests from localhost are allowed\n");
            assert!(!state.skip_drain());
            // Even a GET from elsewhere is refused before the method is checked.
            let get = Request::get(path).body(Empty::<Bytes>::new()).unwrap();
            let resp = route(&state, get, "10.1.2.3:4567".parse().unwrap()).await;
            assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        }
        let resp = route(
            &state,
            Request::post(DRAIN_PATH)
                .body(Empty::<Bytes>::new())
                .unwrap(),
            "[::1]:1".parse().unwrap(),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let resp = route(
            &state,
            Request::post(QUIT_PATH)
                .body(Empty::<Bytes>::new())
                .unwrap(),
            "[::ffff:127.0.0.1]:1".parse().unwrap(),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(state.is_quit_requested());
    }

    #[tokio::test]
    async fn serve_stops_when_shutdown_completes() {
        let server = start(options(dead_port())).await;
        assert_eq!(get(server.addr, "/nope").await.0, StatusCode::NOT_FOUND);
        server.stop.send(()).unwrap();
        let result = tokio::time::timeout(WAIT, server.task)
            .await
            .unwrap()
            .unwrap();
        assert!(result.is_ok());
        assert!(
            TcpStream::connect(server.addr).await.is_err(),
            "the port is closed"
        );
    }

    // --- validation (TestNewServer, TestIstioReservedPortReason, TestNewServerPrometheusNormalization) ---

    fn config_errors(options: StatusOptions) -> Vec<String> {
        match StatusState::new(options) {
            Ok(_) => Vec::new(),
            Err(StatusError::Config(errors)) => errors.iter().map(ToString::to_string).collect(),
            Err(e) => panic!("unexpected error {e}"),
        }
    }

    fn prober_errors(json: &str) -> Vec<String> {
        config_errors(StatusOptions {
            kube_app_probers: json.to_string(),
            ..StatusOptions::default()
        })
    }

    #[test]
    fn validates_app_probers() {
        let cases = [
            (
                "invalid-prober-json-encoding",
                Some("failed to decode app prober"),
            ),
            (
                r#"{"abc": {"path": "/app-foo/health"}}"#,
                Some(r#"invalid path "abc""#),
            ),
            (
                r#"{"/app-health/hello-world/readyz": {"exec": {"command": [ "true" ]}}}"#,
                Some("invalid prober type for /app-health/hello-world/readyz"),
            ),
            (
                r#"{"/app-health/hello-world/readyz": {"tcpSocket": {"port": 8888}}}"#,
                None,
            ),
            (
                r#"{"/app-health/hello-world/readyz": {"tcpSocket": {"port": 8888}, "httpGet": {"path": "/", "port": 7777}}}"#,
                Some("must be one of type httpGet, tcpSocket or gRPC"),
            ),
            (
                r#"{"/app-health/hello-world/readyz": {"grpc": {"port": 8888}, "httpGet": {"path": "/", "port": 7777}}}"#,
                Some("must be one of type httpGet, tcpSocket or gRPC"),
            ),
            (
                r#"{"/app-health/hello-world/readyz": {"tcpSocket": {"port": "tcp"}}}"#,
                Some(
                    r#"invalid prober config for /app-health/hello-world/readyz, the port must be int type, not "tcp""#,
                ),
            ),
            (
                r#"{"/app-health/hello-world/readyz": {"httpGet": {"path": "/hello/sunnyvale", "port": "container-port-dontknow"}}}"#,
                Some("must be int type"),
            ),
            (
                r#"{"/app-health/hello-world/readyz": {"httpGet": {"path": "/", "port": 70000}}}"#,
                Some("the port 70000 is not in 1-65535"),
            ),
            (
                r#"{"/app-health/hello-world/readyz": {"httpGet": {"path": "/hello/sunnyvale", "port": 8080}}, "/app-health/business/livez": {"httpGet": {"path": "/business/live", "port": 9090}}}"#,
                None,
            ),
            (
                r#"{"/app-health/hello-world/readyz": {"httpGet": {"path": "/hello/sunnyvale", "port": 8080}, "initialDelaySeconds": 120, "timeoutSeconds": 10, "periodSeconds": 20}}"#,
                None,
            ),
            (
                r#"{"/app-health/business/livez": {"httpGet": {"port": 9090}}}"#,
                None,
            ),
            ("{}", None),
            ("", None),
            (
                r#"{"/app-health/hello-world/readyz": {"httpGet": {"path": "hello/sunnyvale", "port": 8080}}}"#,
                None,
            ),
            (
                r#"{"/app-lifecycle/hello-world/prestopz": {"httpGet": {"path": "/stop", "port": 8080}}}"#,
                None,
            ),
            (
                r#"{"/app-health/hello-world/readyz": {"gRPC": {"port": 8080}}}"#,
                None,
            ),
            (
                r#"{"/app-health/hello-world/readyz": {"gRPC": {"port": 8080, "service": null}}}"#,
                None,
            ),
            (
                r#"{"/app-health/hello-world/readyz": {"gRPC": {"port": 8080, "service": "foo"}, "timeoutSeconds": 10}}"#,
                None,
            ),
            (
                r#"{"/app-health/a/b/readyz": {"tcpSocket": {"port": 1}}}"#,
                Some("invalid path"),
            ),
            (
                r#"{"/app-health//readyz": {"tcpSocket": {"port": 1}}}"#,
                Some("invalid path"),
            ),
            (
                r#"{"/app-health/a/healthz": {"tcpSocket": {"port": 1}}}"#,
                Some("invalid path"),
            ),
        ];
        for (json, want) in cases {
            let errors = prober_errors(json);
            match want {
                None => assert!(errors.is_empty(), "{json}: {errors:?}"),
                Some(want) => assert!(
                    errors.len() == 1 && errors[0].contains(want),
                    "{json}: want {want:?}, got {errors:?}"
                ),
            }
        }
        // Every invalid probe is reported at once.
        let errors = prober_errors(
            r#"{"/bad": {"tcpSocket": {"port": 1}}, "/app-health/x/livez": {"tcpSocket": {"port": "tcp"}}}"#,
        );
        assert_eq!(errors.len(), 2, "{errors:?}");
    }

    #[test]
    fn parses_app_probers() {
        let state = StatusState::new(StatusOptions {
            kube_app_probers: r#"{
                "/app-health/a/readyz": {"httpGet": {"path": "ready", "port": 8080, "scheme": "HTTPS"}, "timeoutSeconds": 3},
                "/app-health/a/livez": {"tcpSocket": {"port": 8081}},
                "/app-health/a/startupz": {"grpc": {"port": 9000, "service": "x"}, "timeoutSeconds": 1}
            }"#
            .to_string(),
            ..StatusOptions::default()
        })
        .unwrap();
        assert_eq!(
            state.probers["/app-health/a/readyz"],
            AppProbe::Http {
                path: "/ready".to_string(),
                port: 8080,
                https: true,
                timeout: Some(Duration::from_secs(3)),
            }
        );
        assert_eq!(
            state.probers["/app-health/a/livez"],
            AppProbe::Tcp {
                port: 8081,
                timeout: None
            }
        );
        assert_eq!(
            state.probers["/app-health/a/startupz"],
            AppProbe::Grpc {
                port: 9000,
                service: "x".to_string(),
                timeout: Some(Duration::from_secs(1)),
            }
        );
    }

    fn scrape_config(json: &str) -> Result<Vec<ScrapeTarget>, Vec<String>> {
        let options = StatusOptions {
            prometheus_annotations: Some(json.to_string()),
            ..StatusOptions::default()
        };
        match StatusState::new(options) {
            Ok(state) => Ok(state.scrape_targets.clone()),
            Err(StatusError::Config(errors)) => {
                Err(errors.iter().map(ToString::to_string).collect())
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }

    fn target(port: u16, path: &str) -> ScrapeTarget {
        ScrapeTarget {
            port,
            path: path.to_string(),
        }
    }

    #[test]
    fn validates_prometheus_annotations() {
        assert_eq!(
            scrape_config(r#"{"scrape":"true","path":"/metrics","port":"8080"}"#),
            Ok(vec![target(8080, "/metrics")])
        );
        assert_eq!(scrape_config("{}"), Ok(vec![target(80, "/metrics")]));
        assert_eq!(
            scrape_config(r#"{"scrape":"false","port":"8080"}"#),
            Ok(vec![])
        );
        assert_eq!(
            scrape_config(r#"{"targets":[{"port":"9100","path":"/a"},{"port":"8080"}]}"#),
            Ok(vec![target(9100, "/a"), target(8080, "/metrics")])
        );
        let err = |json: &str| scrape_config(json).unwrap_err().join("\n");
        assert!(
            err(r#"{"port":"15020"}"#).contains(
                "application port is the same as agent port, which may lead to a recursive loop. Ensure pod does not have prometheus.io/port=15020 label"
            )
        );
        assert!(err(r#"{"port":"15090"}"#).contains(
            "target port 15090 is reserved for Istio (Envoy Prometheus (already merged)) and cannot be scraped"
        ));
        assert!(
            err(r#"{"targets":[{"port":"015020"}]}"#)
                .contains("target port 015020 is the same as agent port")
        );
        assert!(err(r#"{"port":"http"}"#).contains(r#"invalid target port "http""#));
        assert!(err(r#"{"port":"70000"}"#).contains(r#"invalid target port "70000""#));
        assert!(
            err(r#"{"port":8080}"#).starts_with("failed to unmarshal ISTIO_PROMETHEUS_ANNOTATIONS")
        );
        for (port, _) in RESERVED_PORTS {
            let json = format!(r#"{{"targets":[{{"port":"{port}"}}]}}"#);
            assert!(scrape_config(&json).is_err(), "{port}");
        }
        // Gateways never merge application metrics.
        let state = StatusState::new(StatusOptions {
            prometheus_annotations: Some(r#"{"port":"8080"}"#.to_string()),
            sidecar: false,
            ..StatusOptions::default()
        })
        .unwrap();
        assert!(state.scrape_targets.is_empty());
    }

    #[test]
    fn localhost_follows_the_pod_ip_family() {
        let localhost = |ip: &str, ipv6: bool| {
            StatusState::new(StatusOptions {
                instance_ip: ip.to_string(),
                ipv6,
                ..StatusOptions::default()
            })
            .unwrap()
            .localhost
        };
        assert_eq!(
            localhost("10.0.0.1", false),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        assert_eq!(localhost("", false), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(localhost("fd00::1", false), IpAddr::V6(Ipv6Addr::LOCALHOST));
        assert_eq!(localhost("fe80::1", false), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(localhost("10.0.0.1", true), IpAddr::V6(Ipv6Addr::LOCALHOST));
    }

    #[test]
    fn resolves_redirects() {
        let url = ProbeUrl {
            https: false,
            host: "10.0.0.1".to_string(),
            port: 8080,
            path: "/a/b?x=1".to_string(),
        };
        let (next, authority) = url.resolve("/c").unwrap();
        assert_eq!((next.path.as_str(), authority), ("/c", None));
        assert_eq!(url.resolve("c").unwrap().0.path, "/a/c");
        let (next, authority) = url.resolve("https://10.0.0.1:9443/d").unwrap();
        assert_eq!(
            next,
            ProbeUrl {
                https: true,
                host: "10.0.0.1".to_string(),
                port: 9443,
                path: "/d".to_string(),
            }
        );
        assert_eq!(authority.as_deref(), Some("10.0.0.1:9443"));
        let (next, _) = url.resolve("//example.com").unwrap();
        assert_eq!(
            (next.host.as_str(), next.port, next.path.as_str()),
            ("example.com", 80, "/")
        );
        assert_eq!(url.resolve("http://[::1]:81/").unwrap().0.host, "::1");
    }
}
