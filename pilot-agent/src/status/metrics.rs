//! Merged metrics on `/stats/prometheus` and `/metrics`, as Istio's
//! `handleStats`: the agent's `istio_agent_*` metrics, Envoy's `:15090`
//! output and the application's metrics (`ISTIO_PROMETHEUS_ANNOTATIONS`),
//! concatenated in that order, in the format the application's
//! `Content-Type` negotiates (Prometheus text or OpenMetrics). The agent's
//! registry also holds Istio's standard `istio_*` families
//! ([`crate::telemetry`]), which Istio's Envoy would export: they come
//! with the agent's metrics, ahead of Envoy's. A failing
//! source is counted in `istio_agent_scrape_failures_total` and left out;
//! the scrape itself never fails.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use common::metrics::{MetricsError, build, counter, counter_vec};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use prometheus::{Gauge, IntCounter, IntCounterVec, Registry};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::upstream::{FetchError, Upstream, read_capped, send_request};
use super::{Body, StatusOptions};
use crate::config::ScrapeTarget;

/// The cap on each target's body when several application targets are merged.
const MAX_APP_METRICS_BODY: usize = 10 * 1024 * 1024;

pub(super) const FMT_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
pub(super) const FMT_OPENMETRICS_0_0_1: &str =
    "application/openmetrics-text; version=0.0.1; charset=utf-8";
pub(super) const FMT_OPENMETRICS_1_0_0: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
const OPENMETRICS_EOF: &[u8] = b"# EOF";
const SCRAPE_TIMEOUT_HEADER: &str = "x-prometheus-scrape-timeout-seconds";

/// Label values of `istio_agent_scrape_failures_total{type}`.
const SCRAPE_ENVOY: &str = "envoy";
const SCRAPE_APP: &str = "application";
const SCRAPE_AGENT: &str = "agent";

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
    pub(super) fn register(registry: &Registry) -> Result<Self, MetricsError> {
        let scrapes_total = counter(
            registry,
            "istio_agent_scrapes_total",
            "The total number of scrapes.",
        )?;
        let scrape_failures_total = counter_vec(
            registry,
            "istio_agent_scrape_failures_total",
            "The total number of failed scrapes.",
            &["type"],
        )?;
        let startup_duration_seconds = build(
            registry,
            "istio_agent_startup_duration_seconds",
            Gauge::new(
                "istio_agent_startup_duration_seconds",
                "The time from the process starting to being marked ready.",
            ),
        )?;
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

/// Why a scrape of Envoy or an application target failed (logged, and
/// counted in `istio_agent_scrape_failures_total`).
#[derive(Debug, thiserror::Error)]
enum ScrapeError {
    /// The request failed.
    #[error("error scraping {url}: {source}")]
    Fetch { url: String, source: FetchError },
    /// No response before the scrape's deadline.
    #[error("error scraping {url}: context deadline exceeded")]
    Deadline { url: String },
    /// A response other than 200.
    #[error("error scraping {url}, status code: {code}")]
    Status { url: String, code: u16 },
    /// The body could not be read (or was too large).
    #[error("read failed: {0}")]
    Read(FetchError),
    /// The body did not arrive before the deadline.
    #[error("read failed: context deadline exceeded")]
    ReadDeadline,
}

/// Why copying a streamed body stopped midway.
#[derive(Debug, thiserror::Error)]
enum CopyError {
    /// The scrape's deadline passed.
    #[error("context deadline exceeded")]
    Deadline,
    /// The source failed.
    #[error("{0}")]
    Body(hyper::Error),
}

// ---------------------------------------------------------------------------
// Merging

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

/// What one scrape of `/stats/prometheus` merges.
pub(super) struct MetricsMerger {
    targets: Vec<ScrapeTarget>,
    /// Envoy's Prometheus port, when its metrics are merged.
    envoy_port: Option<u16>,
    registry: Registry,
    metrics: AgentMetrics,
}

impl MetricsMerger {
    pub(super) fn new(
        targets: Vec<ScrapeTarget>,
        options: &StatusOptions,
        registry: Registry,
        metrics: AgentMetrics,
    ) -> Self {
        let envoy_port =
            (options.envoy && options.merge_envoy_stats).then_some(options.envoy_prometheus_port);
        Self {
            targets,
            envoy_port,
            registry,
            metrics,
        }
    }

    /// Istio's `handleStats`: never fails the scrape because a source did.
    pub(super) async fn handle(&self, parts: &Parts) -> Response<Body> {
        self.metrics.scrapes_total.inc();
        let deadline = scrape_deadline(&parts.headers);

        let envoy = match self.envoy_port {
            Some(port) => {
                let mut path = "/stats/prometheus".to_string();
                if let Some(query) = parts.uri.query().filter(|q| !q.is_empty()) {
                    path.push('?');
                    path.push_str(query);
                }
                match self
                    .scrape(port, &path, &parts.headers, false, deadline)
                    .await
                {
                    Ok(resp) => Some(resp.into_body()),
                    Err(e) => {
                        tracing::error!(target: "status", "failed scraping envoy metrics: {e}");
                        self.metrics.scrape_failed(SCRAPE_ENVOY);
                        None
                    }
                }
            }
            None => None,
        };

        let (format, app) = match self.targets.as_slice() {
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
    ) -> Result<Response<Incoming>, ScrapeError> {
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
            Some(Err(source)) => return Err(ScrapeError::Fetch { url, source }),
            None => return Err(ScrapeError::Deadline { url }),
        };
        if resp.status() != StatusCode::OK {
            return Err(ScrapeError::Status {
                url,
                code: resp.status().as_u16(),
            });
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
                Some(Err(e)) => return Err(ScrapeError::Read(e)),
                None => return Err(ScrapeError::ReadDeadline),
            };
            Ok::<_, ScrapeError>((format, body))
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
    ) -> Result<Result<(), CopyError>, Closed> {
        loop {
            match until(deadline, body.frame()).await {
                None => return Ok(Err(CopyError::Deadline)),
                Some(None) => return Ok(Ok(())),
                Some(Some(Err(e))) => return Ok(Err(CopyError::Body(e))),
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

/// Runs `fut` until `deadline`; `None` when it passed first.
async fn until<T>(deadline: Option<Instant>, fut: impl Future<Output = T>) -> Option<T> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d, fut).await.ok(),
        None => Some(fut.await),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::super::testing::{call, dead_port, fake_http, get, metrics_options, reply, start};
    use super::*;

    // TestStats, TestStatsError, TestStatsContentType.

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

    const ENVOY_METRICS: &str = "# TYPE envoy_metric counter\nenvoy_metric{} 0\n";
    const APP_METRICS: &str = "# TYPE app_metric counter\napp_metric{} 3\n";

    fn position(body: &str, needle: &str) -> usize {
        body.find(needle)
            .unwrap_or_else(|| panic!("{needle:?} missing from:\n{body}"))
    }

    #[tokio::test]
    async fn standard_metrics_come_with_the_agents_before_envoys() {
        use proto::pb::envoy::data::accesslog::v3::{HttpAccessLogEntry, HttpResponseProperties};
        let (envoy, _seen) = fake_metrics("text/plain; version=0.0.4", ENVOY_METRICS).await;
        let server = start(metrics_options(envoy, &[])).await;
        let standard = crate::telemetry::StandardMetrics::register(
            server.state.registry(),
            crate::telemetry::labels::Peer::unknown(),
        )
        .unwrap();
        standard.record_http(
            common::istio_stats::Reporter::Source,
            &HttpAccessLogEntry {
                response: Some(HttpResponseProperties {
                    response_code: Some(proto::pb::google::protobuf::UInt32Value { value: 200 }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        let (status, _, body) = call(server.addr, Method::GET, "/stats/prometheus", &[]).await;
        assert_eq!(status, StatusCode::OK);
        let agent = position(&body, "# TYPE istio_agent_scrapes_total counter");
        let requests = position(&body, "# TYPE istio_requests_total counter");
        let envoy_at = position(&body, ENVOY_METRICS);
        assert!(agent < requests && requests < envoy_at, "{body}");
        for family in [
            "istio_requests_total",
            "istio_request_duration_milliseconds",
            "istio_request_bytes",
            "istio_response_bytes",
        ] {
            let typed = format!("# TYPE {family} ");
            assert_eq!(body.matches(&typed).count(), 1, "{family} in {body}");
        }
        assert!(
            body.contains("istio_request_duration_milliseconds_bucket{"),
            "{body}"
        );
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

        // The fakes lock these lists too: release them before scraping again.
        let envoy_seen = envoy_seen.lock().unwrap().remove(0);
        assert_eq!(envoy_seen.0, "/stats/prometheus?usedonly");
        assert_eq!(
            envoy_seen.1[header::ACCEPT],
            "text/plain;version=0.0.4;q=0.3, text/plain;version=0.0.4;q=0.1"
        );
        assert_eq!(envoy_seen.1[header::USER_AGENT], "Prometheus/3.0");
        assert_eq!(envoy_seen.1[SCRAPE_TIMEOUT_HEADER], "10");
        let app_seen = app_seen.lock().unwrap().remove(0);
        assert_eq!(app_seen.0, "/metrics");
        assert_eq!(
            app_seen.1[header::ACCEPT],
            "text/plain;version=0.0.4;q=0.3, text/plain;version=0.0.4;q=0.1"
        );

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
}
