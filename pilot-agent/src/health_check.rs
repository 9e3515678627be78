//! The workload's health for istiod (Istio's `pkg/istio-agent/health`):
//! when the ProxyConfig has a `readinessProbe` (a VM's agent gets its
//! WorkloadGroup's probe there), the agent probes the application with
//! `httpGet`, `tcpSocket` or `exec`, with Istio's defaults and thresholds,
//! and publishes each change between healthy and unhealthy; the xDS proxy
//! sends it to istiod as an `istio.io/health` request.

use std::time::Duration;

use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use tokio::sync::watch;

use crate::http_client::{build_request, dial, host_port, send_h1};

/// A `readinessProbe` that cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum HealthCheckError {
    /// It does not parse.
    #[error("readinessProbe: {0}")]
    Parse(String),
    /// It is not one this agent runs.
    #[error("readinessProbe.{field}: {reason}")]
    Unsupported {
        /// The field.
        field: &'static str,
        /// Why, and what to use.
        reason: &'static str,
    },
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
struct RawProbe {
    initial_delay_seconds: i32,
    timeout_seconds: i32,
    period_seconds: i32,
    success_threshold: i32,
    failure_threshold: i32,
    http_get: Option<RawHttp>,
    tcp_socket: Option<RawTcp>,
    exec: Option<RawExec>,
    grpc: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
struct RawHttp {
    path: String,
    port: u16,
    host: String,
    scheme: String,
    http_headers: Vec<RawHeader>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawHeader {
    name: String,
    value: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawTcp {
    host: String,
    port: u16,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawExec {
    command: Vec<String>,
}

/// How the application is probed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum Method {
    /// An HTTP GET; 2xx and 3xx are healthy.
    Http {
        /// Host (the proxy's IP when unset).
        host: String,
        /// Port.
        port: u16,
        /// Path (`/` when unset).
        path: String,
        /// Extra headers.
        headers: Vec<(String, String)>,
    },
    /// A TCP connect.
    Tcp {
        /// Host (the proxy's IP when unset).
        host: String,
        /// Port.
        port: u16,
    },
    /// A command; exit status 0 is healthy.
    Exec {
        /// The command and its arguments.
        command: Vec<String>,
    },
}

/// A parsed `readinessProbe` with Istio's defaults filled in
/// (`fillInDefaults`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HealthCheckConfig {
    /// Before the first probe.
    pub initial_delay: Duration,
    /// Each probe's limit (1s).
    pub timeout: Duration,
    /// Between probes (10s).
    pub period: Duration,
    /// Successes in a row that make it healthy (1).
    pub success_threshold: u32,
    /// Failures in a row that make it unhealthy (1).
    pub failure_threshold: u32,
    /// The probe.
    pub method: Method,
}

fn or_default(v: i32, default: u32) -> u32 {
    u32::try_from(v).ok().filter(|v| *v > 0).unwrap_or(default)
}

impl HealthCheckConfig {
    /// Parses a ProxyConfig `readinessProbe`; unset hosts become
    /// `default_host` (the proxy's first IP, Istio's `resolveDefaultHost`).
    pub fn parse(value: &serde_json::Value, default_host: &str) -> Result<Self, HealthCheckError> {
        let raw: RawProbe = serde_json::from_value(value.clone())
            .map_err(|e| HealthCheckError::Parse(e.to_string()))?;
        let host = |h: String| {
            if h.is_empty() {
                default_host.to_string()
            } else {
                h
            }
        };
        let method = match (raw.http_get, raw.tcp_socket, raw.exec, raw.grpc) {
            (Some(h), None, None, None) => {
                if !h.scheme.is_empty() && !h.scheme.eq_ignore_ascii_case("http") {
                    return Err(HealthCheckError::Unsupported {
                        field: "httpGet.scheme",
                        reason: "only HTTP is probed by this agent (HTTPS probes are not built; use tcpSocket or an HTTP port)",
                    });
                }
                Method::Http {
                    host: host(h.host),
                    port: h.port,
                    path: if h.path.is_empty() {
                        "/".into()
                    } else {
                        h.path
                    },
                    headers: h
                        .http_headers
                        .into_iter()
                        .map(|x| (x.name, x.value))
                        .collect(),
                }
            }
            (None, Some(t), None, None) => Method::Tcp {
                host: host(t.host),
                port: t.port,
            },
            (None, None, Some(x), None) if !x.command.is_empty() => {
                Method::Exec { command: x.command }
            }
            (None, None, None, Some(_)) => {
                return Err(HealthCheckError::Unsupported {
                    field: "grpc",
                    reason: "gRPC health probes are not built in this agent (use httpGet, tcpSocket or exec)",
                });
            }
            _ => {
                return Err(HealthCheckError::Parse(
                    "give exactly one of httpGet, tcpSocket or exec (with a command)".into(),
                ));
            }
        };
        Ok(Self {
            initial_delay: Duration::from_secs(u64::from(or_default(raw.initial_delay_seconds, 0))),
            timeout: Duration::from_secs(u64::from(or_default(raw.timeout_seconds, 1))),
            period: Duration::from_secs(u64::from(or_default(raw.period_seconds, 10))),
            success_threshold: or_default(raw.success_threshold, 1),
            failure_threshold: or_default(raw.failure_threshold, 1),
            method,
        })
    }
}

/// A change of health (Istio's `ProbeEvent`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeEvent {
    /// Whether the application is healthy.
    pub healthy: bool,
    /// Why not.
    pub message: String,
}

/// Why a probe failed; its text is the message istiod writes into the
/// WorkloadEntry's `Healthy` condition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// No answer within the probe's timeout.
    #[error("probe timed out after {}s", .0.as_secs_f64())]
    Timeout(Duration),
    /// The application's port refused or could not be reached.
    #[error("dial tcp {addr}: {reason}")]
    Dial {
        /// `host:port`.
        addr: String,
        /// The socket's error.
        reason: String,
    },
    /// The HTTP exchange failed before a status.
    #[error("{0}")]
    Http(String),
    /// The application answered with a status other than 2xx or 3xx.
    #[error("HTTP probe failed with status code {0}")]
    Status(u16),
    /// The command could not be started.
    #[error("exec {command}: {reason}")]
    Spawn {
        /// The program.
        command: String,
        /// The error.
        reason: String,
    },
    /// The command exited unsuccessfully.
    #[error("command {command:?} failed: {status}")]
    Exit {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
    },
}

/// Runs one probe within the timeout.
pub async fn probe(method: &Method, timeout: Duration) -> Result<(), ProbeError> {
    match tokio::time::timeout(timeout, probe_once(method)).await {
        Ok(r) => r,
        Err(_) => Err(ProbeError::Timeout(timeout)),
    }
}

async fn probe_once(method: &Method) -> Result<(), ProbeError> {
    let dial_error = |host: &str, port: u16, e: std::io::Error| ProbeError::Dial {
        addr: host_port(host, port),
        reason: e.to_string(),
    };
    match method {
        Method::Tcp { host, port } => dial(host, *port, true)
            .await
            .map(drop)
            .map_err(|e| dial_error(host, *port, e)),
        Method::Http {
            host,
            port,
            path,
            headers,
        } => {
            let stream = dial(host, *port, true)
                .await
                .map_err(|e| dial_error(host, *port, e))?;
            let mut map = HeaderMap::new();
            for (k, v) in headers {
                if let (Ok(k), Ok(v)) = (HeaderName::try_from(k.as_str()), HeaderValue::from_str(v))
                {
                    map.insert(k, v);
                }
            }
            map.insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
            let req = build_request(
                hyper::Method::GET,
                path,
                &host_port(host, *port),
                &map,
                false,
                http_body_util::Empty::<hyper::body::Bytes>::new(),
            )
            .map_err(|e| ProbeError::Http(e.to_string()))?;
            let resp = send_h1(stream, req)
                .await
                .map_err(|e| ProbeError::Http(e.to_string()))?;
            let status = resp.status();
            if status.is_success() || status.is_redirection() {
                Ok(())
            } else {
                Err(ProbeError::Status(status.as_u16()))
            }
        }
        Method::Exec { command } => {
            let out = tokio::process::Command::new(&command[0])
                .args(&command[1..])
                .kill_on_drop(true)
                .output()
                .await
                .map_err(|e| ProbeError::Spawn {
                    command: command[0].clone(),
                    reason: e.to_string(),
                })?;
            if out.status.success() {
                Ok(())
            } else {
                Err(ProbeError::Exit {
                    command: command.join(" "),
                    status: out.status.to_string(),
                })
            }
        }
    }
}

/// What the thresholds make of one probe result (Istio's `doCheck`).
#[derive(Debug, Default)]
pub struct Thresholds {
    successes: u32,
    failures: u32,
    last: Option<bool>,
}

impl Thresholds {
    /// The event to publish after a probe, if the state changes.
    pub fn observe(
        &mut self,
        cfg: &HealthCheckConfig,
        result: Result<(), ProbeError>,
    ) -> Option<ProbeEvent> {
        match result {
            Ok(()) => {
                self.successes += 1;
                self.failures = 0;
                if self.successes >= cfg.success_threshold && self.last != Some(true) {
                    self.successes = 0;
                    self.last = Some(true);
                    return Some(ProbeEvent {
                        healthy: true,
                        message: String::new(),
                    });
                }
            }
            Err(error) => {
                self.failures += 1;
                self.successes = 0;
                if self.failures >= cfg.failure_threshold && self.last != Some(false) {
                    self.failures = 0;
                    self.last = Some(false);
                    return Some(ProbeEvent {
                        healthy: false,
                        message: error.to_string(),
                    });
                }
            }
        }
        None
    }
}

/// Probes every period until `events` has no receiver left, publishing
/// each change (Istio's `PerformApplicationHealthCheck`).
pub async fn run(cfg: HealthCheckConfig, events: watch::Sender<Option<ProbeEvent>>) {
    tracing::info!(target: "healthcheck", "starting health check for {:?} in {:?}", cfg.method, cfg.initial_delay);
    tokio::time::sleep(cfg.initial_delay).await;
    let mut thresholds = Thresholds::default();
    let mut ticker = tokio::time::interval(cfg.period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = events.closed() => return,
        }
        let result = probe(&cfg.method, cfg.timeout).await;
        if let Some(event) = thresholds.observe(&cfg, result) {
            if event.healthy {
                tracing::info!(target: "healthcheck", "success threshold hit, marking as healthy");
            } else {
                tracing::info!(target: "healthcheck", "failure threshold hit, marking as unhealthy: {}", event.message);
            }
            events.send_replace(Some(event));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fills_in_istio_defaults() {
        let cfg =
            HealthCheckConfig::parse(&json!({"httpGet": {"port": 8080}}), "10.0.0.5").unwrap();
        assert_eq!(cfg.period, Duration::from_secs(10));
        assert_eq!(cfg.timeout, Duration::from_secs(1));
        assert_eq!((cfg.success_threshold, cfg.failure_threshold), (1, 1));
        assert_eq!(
            cfg.method,
            Method::Http {
                host: "10.0.0.5".into(),
                port: 8080,
                path: "/".into(),
                headers: vec![]
            }
        );
        let cfg = HealthCheckConfig::parse(
            &json!({"periodSeconds": 2, "failureThreshold": 3, "tcpSocket": {"port": 22, "host": "127.0.0.1"}}),
            "10.0.0.5",
        )
        .unwrap();
        assert_eq!(cfg.period, Duration::from_secs(2));
        assert_eq!(cfg.failure_threshold, 3);
        assert_eq!(
            cfg.method,
            Method::Tcp {
                host: "127.0.0.1".into(),
                port: 22
            }
        );
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        for bad in [
            json!({}),
            json!({"exec": {"command": []}}),
            json!({"tcpSocket": {"port": 1}, "exec": {"command": ["true"]}}),
            json!({"httpGet": {"port": 1, "scheme": "HTTPS"}}),
            json!({"grpc": {"port": 1}}),
            json!({"httpGet": {"port": 1, "bogus": 1}}),
        ] {
            assert!(HealthCheckConfig::parse(&bad, "h").is_err(), "{bad}");
        }
    }

    #[test]
    fn thresholds_publish_changes_only() {
        let cfg = HealthCheckConfig {
            initial_delay: Duration::ZERO,
            timeout: Duration::from_secs(1),
            period: Duration::from_secs(1),
            success_threshold: 2,
            failure_threshold: 2,
            method: Method::Exec {
                command: vec!["true".into()],
            },
        };
        let mut t = Thresholds::default();
        let ok = || Ok(());
        let bad = || Err(ProbeError::Status(503));
        assert_eq!(t.observe(&cfg, ok()), None);
        assert_eq!(t.observe(&cfg, ok()).map(|e| e.healthy), Some(true));
        assert_eq!(t.observe(&cfg, ok()), None);
        assert_eq!(t.observe(&cfg, ok()), None);
        assert_eq!(t.observe(&cfg, bad()), None);
        let e = t.observe(&cfg, bad()).unwrap();
        assert!(!e.healthy);
        assert_eq!(e.message, "HTTP probe failed with status code 503");
        assert_eq!(t.observe(&cfg, bad()), None);
    }

    #[tokio::test]
    async fn probes_tcp_http_and_exec() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            for status in ["200 OK", "503 Service Unavailable"] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        let http = Method::Http {
            host: "127.0.0.1".into(),
            port,
            path: "/ready".into(),
            headers: vec![("x-probe".into(), "1".into())],
        };
        let t = Duration::from_secs(2);
        assert_eq!(probe(&http, t).await, Ok(()));
        assert_eq!(probe(&http, t).await, Err(ProbeError::Status(503)));
        // Nothing listens any more: TCP and HTTP fail.
        let tcp = Method::Tcp {
            host: "127.0.0.1".into(),
            port,
        };
        assert!(matches!(probe(&tcp, t).await, Err(ProbeError::Dial { .. })));
        assert_eq!(
            probe(
                &Method::Exec {
                    command: vec!["true".into()]
                },
                t
            )
            .await,
            Ok(())
        );
        assert!(
            probe(
                &Method::Exec {
                    command: vec!["false".into()]
                },
                t
            )
            .await
            .is_err_and(|e| matches!(e, ProbeError::Exit { .. }))
        );
    }
}
