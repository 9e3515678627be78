//! Istio's standard metric families, kept by the agent from the entries its
//! Envoy streams: `istio_requests_total`, the request duration and size
//! histograms (Envoy's default buckets, as Istio's stats filter gets them),
//! and the TCP connection and byte counters. TCP entries carry running byte
//! totals of a connection (on open, periodically, on close), so the
//! counters add what changed since the connection's previous entry.
//!
//! The number of series is capped: entries that would create one more are
//! dropped, and that is logged once.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use common::istio_stats::Reporter;
use common::metrics::MetricsError;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Registry};
use proto::pb::envoy::data::accesslog::v3::{AccessLogType, HttpAccessLogEntry, TcpAccessLogEntry};

use super::labels::{self, Common, HTTP_LABELS, Peer, TCP_LABELS};

/// Envoy's default histogram buckets, which Istio's families use.
pub const ISTIO_BUCKETS: [f64; 19] = [
    0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0,
    60000.0, 300000.0, 600000.0, 1800000.0, 3600000.0,
];

/// The most label sets kept (over every family).
pub const MAX_SERIES: usize = 10_000;
/// The most TCP connections whose byte totals are remembered.
const MAX_CONNECTIONS: usize = 100_000;

/// The byte totals last reported for a TCP connection.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    received: u64,
    sent: u64,
}

#[derive(Default)]
struct State {
    series: HashSet<Vec<String>>,
    connections: HashMap<String, Seen>,
}

/// The families, registered in the agent's registry.
pub struct StandardMetrics {
    local: Peer,
    requests_total: IntCounterVec,
    request_duration: HistogramVec,
    request_bytes: HistogramVec,
    response_bytes: HistogramVec,
    tcp_sent: IntCounterVec,
    tcp_received: IntCounterVec,
    tcp_opened: IntCounterVec,
    tcp_closed: IntCounterVec,
    state: Mutex<State>,
    cap_logged: AtomicBool,
}

impl StandardMetrics {
    /// Registers the families in `registry`; `local` is this proxy's workload.
    pub fn register(registry: &Registry, local: Peer) -> Result<Self, MetricsError> {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            common::metrics::counter_vec(registry, name, help, labels)
        };
        let histogram = |name: &str, help: &str| {
            common::metrics::build(
                registry,
                name,
                HistogramVec::new(
                    HistogramOpts::new(name, help).buckets(ISTIO_BUCKETS.to_vec()),
                    &HTTP_LABELS,
                ),
            )
        };
        Ok(Self {
            local,
            requests_total: counter(
                "istio_requests_total",
                "The requests this proxy handled.",
                &HTTP_LABELS,
            )?,
            request_duration: histogram(
                "istio_request_duration_milliseconds",
                "The duration of requests.",
            )?,
            request_bytes: histogram("istio_request_bytes", "The sizes of requests.")?,
            response_bytes: histogram("istio_response_bytes", "The sizes of responses.")?,
            tcp_sent: counter(
                "istio_tcp_sent_bytes_total",
                "The bytes sent during responses of TCP connections.",
                &TCP_LABELS,
            )?,
            tcp_received: counter(
                "istio_tcp_received_bytes_total",
                "The bytes received during requests of TCP connections.",
                &TCP_LABELS,
            )?,
            tcp_opened: counter(
                "istio_tcp_connections_opened_total",
                "The TCP connections opened.",
                &TCP_LABELS,
            )?,
            tcp_closed: counter(
                "istio_tcp_connections_closed_total",
                "The TCP connections closed.",
                &TCP_LABELS,
            )?,
            state: Mutex::default(),
            cap_logged: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a series with `values` may be written (known, or room left).
    fn admit(&self, state: &mut State, values: &[String]) -> bool {
        if state.series.contains(values) {
            return true;
        }
        if state.series.len() >= MAX_SERIES {
            if !self.cap_logged.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    target: "telemetry",
                    "standard metrics reached {MAX_SERIES} series; entries with new labels are dropped"
                );
            }
            return false;
        }
        state.series.insert(values.to_vec());
        true
    }

    /// Counts one finished HTTP request.
    pub fn record_http(&self, reporter: Reporter, entry: &HttpAccessLogEntry) {
        let common = entry.common_properties.as_ref();
        // Only whole requests: periodic or start entries are not requests.
        let kind = common.map(|c| c.access_log_type).unwrap_or_default();
        if kind != AccessLogType::NotSet as i32 && kind != AccessLogType::DownstreamEnd as i32 {
            return;
        }
        let values = labels::http_values(reporter, &self.local, entry);
        if !self.admit(&mut self.lock(), &values) {
            return;
        }
        let v: Vec<&str> = values.iter().map(String::as_str).collect();
        self.requests_total.with_label_values(&v).inc();
        let millis = common
            .and_then(|c| c.duration.or(c.time_to_last_downstream_tx_byte))
            .map(|d| (d.seconds.max(0) as f64) * 1000.0 + f64::from(d.nanos.max(0) / 1_000_000))
            .unwrap_or(0.0);
        self.request_duration.with_label_values(&v).observe(millis);
        let (req, resp) = (entry.request.as_ref(), entry.response.as_ref());
        let request_size = req
            .map(|r| r.request_headers_bytes + r.request_body_bytes)
            .unwrap_or(0);
        let response_size = resp
            .map(|r| r.response_headers_bytes + r.response_body_bytes)
            .unwrap_or(0);
        self.request_bytes
            .with_label_values(&v)
            .observe(request_size as f64);
        self.response_bytes
            .with_label_values(&v)
            .observe(response_size as f64);
    }

    /// Counts a TCP connection's open, progress or close.
    pub fn record_tcp(&self, reporter: Reporter, entry: &TcpAccessLogEntry) {
        let default = Default::default();
        let common = entry.common_properties.as_ref().unwrap_or(&default);
        let kind = common.access_log_type;
        // A periodic entry before any upstream was picked has no labels yet:
        // the connection is counted by its next entries.
        if kind == AccessLogType::TcpPeriodic as i32 && common.upstream_cluster.is_empty() {
            return;
        }
        let labels = Common::of(reporter, &self.local, common, None);
        let values = labels.tcp_values();
        let totals = entry
            .connection_properties
            .as_ref()
            .map(|p| Seen {
                received: p.received_bytes,
                sent: p.sent_bytes,
            })
            .unwrap_or_default();
        let key = connection_key(common);
        let end =
            kind == AccessLogType::TcpConnectionEnd as i32 || kind == AccessLogType::NotSet as i32;
        let mut state = self.lock();
        if !self.admit(&mut state, &values) {
            state.connections.remove(&key);
            return;
        }
        let previous = state.connections.get(&key).copied();
        if end {
            state.connections.remove(&key);
        } else if previous.is_some() || state.connections.len() < MAX_CONNECTIONS {
            state.connections.insert(key, totals);
        }
        drop(state);
        let v: Vec<&str> = values.iter().map(String::as_str).collect();
        if previous.is_none() {
            // The first entry of a connection: its open (or, for one that
            // never reached its upstream, its only entry).
            self.tcp_opened.with_label_values(&v).inc();
        }
        let before = previous.unwrap_or_default();
        self.tcp_received
            .with_label_values(&v)
            .inc_by(totals.received.saturating_sub(before.received));
        self.tcp_sent
            .with_label_values(&v)
            .inc_by(totals.sent.saturating_sub(before.sent));
        if end {
            self.tcp_closed.with_label_values(&v).inc();
        }
    }
}

/// What identifies a connection across its entries: Envoy's stream id, else
/// its addresses.
fn connection_key(common: &proto::pb::envoy::data::accesslog::v3::AccessLogCommon) -> String {
    if !common.stream_id.is_empty() {
        return common.stream_id.clone();
    }
    let addr = |a: &Option<proto::pb::envoy::config::core::v3::Address>| {
        a.as_ref().map(|a| format!("{a:?}")).unwrap_or_default()
    };
    format!(
        "{}|{}",
        addr(&common.downstream_remote_address),
        addr(&common.downstream_local_address)
    )
}

#[cfg(test)]
mod tests;
