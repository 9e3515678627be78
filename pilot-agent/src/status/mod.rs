//! The agent's status server on `:15020`, as Istio's
//! `pilot/cmd/pilot-agent/status/server.go` serves it, in rooms of one job:
//!
//! - `server`: the hyper server and its routes: `/healthz/ready`,
//!   `/stats/prometheus` and `/metrics`, `/app-health/...` and
//!   `/app-lifecycle/...`, `POST /quitquitquit` and `POST /drain` from
//!   loopback.
//! - `ready`: Envoy's readiness from its admin stats (`status/ready/probe.go`);
//!   the kubelet reaches `/healthz/ready` through Envoy's `:15021` listener.
//! - `prober`: the application's probes, rewritten by the injector into
//!   `ISTIO_KUBE_APP_PROBERS` (parsed and validated with the rest of the
//!   configuration) and sent from `127.0.0.6` so the iptables rules let them
//!   through to the application.
//! - `metrics`: the agent's `istio_agent_*` metrics, Envoy's `:15090` output
//!   and the application's metrics, concatenated in a negotiated format.
//! - `upstream`: the requests probes and scrapes make.
//!
//! [`StatusState`] is what the server serves from. Readiness conditions of
//! other parts, drain and quit requests and the termination cause live in
//! [`Lifecycle`], which the server only routes to.

mod metrics;
mod prober;
mod ready;
mod server;
#[cfg(test)]
mod testing;
mod upstream;

use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};
use prometheus::Registry;

use crate::config::{AppProbes, ScrapeTarget};
use crate::envoy::admin::AdminClient;
use crate::lifecycle::{Lifecycle, NotReady};

pub use metrics::AgentMetrics;
#[cfg(feature = "fuzzing")]
pub(crate) use prober::{is_probe_path, redirect_target};
pub use server::serve;

/// Istio's `statusPort` default.
pub const DEFAULT_STATUS_PORT: u16 = 15020;
/// Envoy's admin port (`ProxyConfig.proxyAdminPort`).
pub const DEFAULT_ADMIN_PORT: u16 = 15000;
/// Envoy's Prometheus listener (`ENVOY_PROMETHEUS_PORT`).
pub const DEFAULT_ENVOY_PROMETHEUS_PORT: u16 = 15090;
/// Istio's `PROXY_READINESS_PROBE_TIMEOUT` default: each admin request made
/// by the readiness probe.
pub const DEFAULT_READINESS_TIMEOUT: Duration = Duration::from_secs(3);

/// The status server's errors.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// An agent metric could not be registered.
    #[error("registering agent metric: {0}")]
    Metric(#[from] common::metrics::MetricsError),
    /// The TLS client for HTTPS probes could not be built.
    #[error("TLS client for HTTPS application probes: {0}")]
    Tls(#[from] rustls::Error),
    /// The listener failed in a way retrying cannot fix; the agent should
    /// terminate (Istio sends itself SIGTERM), since readiness can never pass.
    #[error("status server stopped accepting connections: {0}")]
    Accept(io::Error),
}

/// What the status server is told at start-up, already validated (the
/// probes and scrape targets by the configuration); the defaults are Istio's.
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
    /// `ISTIO_KUBE_APP_PROBERS`: probe path to the container's original
    /// probe. Empty means none.
    pub app_probers: AppProbes,
    /// `ISTIO_PROMETHEUS_ANNOTATIONS`: the application metrics to merge
    /// (none on gateways).
    pub scrape_targets: Vec<ScrapeTarget>,
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
            app_probers: AppProbes::new(),
            scrape_targets: Vec::new(),
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
// The shared state

/// What the status server serves from, shared with its connections in an `Arc`.
pub struct StatusState {
    options: StatusOptions,
    probers: prober::AppProbers,
    merger: metrics::MetricsMerger,
    envoy: ready::EnvoyProbe,
    lifecycle: Arc<Lifecycle>,
    registry: Registry,
    /// Read by the tests; the merger and Envoy's probe hold their own handles.
    #[cfg(test)]
    metrics: AgentMetrics,
    /// For logging "Envoy proxy is ready" on the transition only.
    last_probe_successful: AtomicBool,
}

impl StatusState {
    /// Builds the server's state from validated `options` (Istio's
    /// `NewServer`) and registers the agent metrics in a new registry. Only
    /// the HTTPS probes' TLS client and the metrics' registration can fail.
    pub fn new(options: StatusOptions, lifecycle: Arc<Lifecycle>) -> Result<Self, StatusError> {
        let probers = prober::AppProbers::new(options.app_probers.clone(), &options)?;
        let registry = Registry::new();
        let metrics = AgentMetrics::register(&registry)?;
        let admin = AdminClient::at_ip(envoy_localhost(&options), options.admin_port)
            .with_timeout(options.readiness_timeout);
        let envoy = ready::EnvoyProbe::new(
            admin,
            metrics.startup_duration_seconds.clone(),
            options.started_at.unwrap_or_else(std::time::Instant::now),
        );
        let merger = metrics::MetricsMerger::new(
            options.scrape_targets.clone(),
            &options,
            registry.clone(),
            metrics.clone(),
        );
        Ok(Self {
            options,
            probers,
            merger,
            envoy,
            lifecycle,
            registry,
            #[cfg(test)]
            metrics,
            last_probe_successful: AtomicBool::new(false),
        })
    }

    /// The agent's registry, written first on `/stats/prometheus`; other
    /// parts register their `istio_agent_*` metrics here.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The metrics the status server maintains.
    #[cfg(test)]
    pub(crate) fn metrics(&self) -> &AgentMetrics {
        &self.metrics
    }

    /// The lifecycle the server routes readiness, drain and quit to.
    #[cfg(test)]
    pub(crate) fn lifecycle(&self) -> &Arc<Lifecycle> {
        &self.lifecycle
    }

    /// `/healthz/ready`'s check: Envoy's probe (unless there is no Envoy),
    /// then the lifecycle's conditions; the first error wins.
    pub async fn check_ready(&self) -> Result<(), NotReady> {
        if self.options.envoy {
            self.envoy.check(&self.lifecycle).await?;
        }
        self.lifecycle.check_ready()
    }
}

/// Envoy admin's host: `127.0.0.1`, or `::1` for IPv6 Pods. Istio: an IPv6
/// Pod IP (not link-local, not IPv4-mapped) means an IPv6 loopback, even
/// without the IPv6 option.
fn envoy_localhost(options: &StatusOptions) -> IpAddr {
    let instance_ip = options.instance_ip.parse::<IpAddr>().ok();
    let ipv6 = options.ipv6
        || matches!(instance_ip, Some(IpAddr::V6(ip))
            if ip.to_ipv4_mapped().is_none() && !ip.is_unicast_link_local());
    if ipv6 {
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }
}

// ---------------------------------------------------------------------------
// Responses

/// The body of every status response: whole, or streamed (merged metrics).
type Body = UnsyncBoxBody<Bytes, Infallible>;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localhost_follows_the_pod_ip_family() {
        let localhost = |ip: &str, ipv6: bool| {
            envoy_localhost(&StatusOptions {
                instance_ip: ip.to_string(),
                ipv6,
                ..StatusOptions::default()
            })
        };
        assert_eq!(
            localhost("10.0.0.1", false),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        assert_eq!(localhost("", false), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(localhost("fd00::1", false), IpAddr::V6(Ipv6Addr::LOCALHOST));
        assert_eq!(localhost("fe80::1", false), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(
            localhost("::ffff:10.0.0.1", false),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        assert_eq!(localhost("10.0.0.1", true), IpAddr::V6(Ipv6Addr::LOCALHOST));
    }
}
