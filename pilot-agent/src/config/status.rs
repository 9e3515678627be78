//! The status server's settings, parsed and validated here so that a bad
//! probe or scrape target is reported with every other invalid value:
//!
//! - `ISTIO_KUBE_APP_PROBERS`: the injector rewrites each container's
//!   `httpGet`, `tcpSocket` and `grpc` probes (and lifecycle hooks) to
//!   `/app-health/<container>/<kind>` and `/app-lifecycle/<container>/<kind>`
//!   on the status port and stores the originals here, as a JSON map
//!   (validated as Istio's `validateAppKubeProber` does, plus a range check
//!   on ports).
//! - `ISTIO_PROMETHEUS_ANNOTATIONS`: the application's metrics endpoints
//!   (`{"scrape","path","port","targets"}`), merged into the status port's
//!   `/stats/prometheus` (Istio's `NewServer` normalisation).
//!
//! The messages keep Istio's wording, so the ones users search for match.

use std::collections::BTreeMap;
use std::time::Duration;

use common::ProxyType;
use serde::{Deserialize, Serialize};

use super::error::{AppProberError, ScrapeConfigError};
use super::vars::Vars;
use super::{ENV_KUBE_APP_PROBERS, ENV_PROMETHEUS_ANNOTATIONS};

/// The status-port paths the probes are served under.
pub const APP_PROBER_PREFIXES: [&str; 2] = ["/app-health/", "/app-lifecycle/"];
const APP_PROBER_KINDS: [&str; 5] = ["livez", "readyz", "startupz", "prestopz", "poststartz"];

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

/// The status server's settings.
#[derive(Debug, Clone, Serialize)]
pub struct StatusConfig {
    /// The status port (ProxyConfig `statusPort`, 15020).
    pub port: u16,
    /// `ISTIO_KUBE_APP_PROBERS`, validated: probe path to probe.
    pub app_probers: AppProbes,
    /// `ISTIO_PROMETHEUS_ANNOTATIONS`, validated: the application's metrics
    /// endpoints (none on gateways).
    pub scrape_targets: Vec<ScrapeTarget>,
}

/// Reads and validates the probes and scrape targets; every invalid one is
/// reported.
pub(super) fn parse(v: &mut Vars<'_>, proxy_type: ProxyType, port: u16) -> StatusConfig {
    let app_probers = match parse_app_probers(&v.string(ENV_KUBE_APP_PROBERS, "")) {
        Ok(probes) => probes,
        Err(errors) => {
            errors.into_iter().for_each(|e| v.error(e));
            AppProbes::new()
        }
    };
    let annotations = v.opt_string(ENV_PROMETHEUS_ANNOTATIONS);
    let sidecar = proxy_type == ProxyType::Sidecar;
    let scrape_targets = match parse_scrape_targets(annotations.as_deref(), port, sidecar) {
        Ok(targets) => targets,
        Err(errors) => {
            errors.into_iter().for_each(|e| v.error(e));
            Vec::new()
        }
    };
    StatusConfig {
        port,
        app_probers,
        scrape_targets,
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
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum AppProbe {
    /// `httpGet`.
    Http {
        /// The request path, with a leading `/`.
        path: String,
        /// The application's port.
        port: u16,
        /// `scheme: HTTPS`.
        https: bool,
        /// `timeoutSeconds`; `None` for the kubelet's default.
        #[serde(serialize_with = "serialize_timeout")]
        timeout: Option<Duration>,
    },
    /// `tcpSocket`.
    Tcp {
        /// The application's port.
        port: u16,
        /// `timeoutSeconds`; `None` for the kubelet's default.
        #[serde(serialize_with = "serialize_timeout")]
        timeout: Option<Duration>,
    },
    /// `grpc`.
    Grpc {
        /// The application's port.
        port: u16,
        /// The health service name (empty for the server's overall health).
        service: String,
        /// `timeoutSeconds`; `None` for the kubelet's default.
        #[serde(serialize_with = "serialize_timeout")]
        timeout: Option<Duration>,
    },
}

/// The validated probes, by the status-port path they answer on.
pub type AppProbes = BTreeMap<String, AppProbe>;

fn serialize_timeout<S: serde::Serializer>(t: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(d) => common::duration::serialize(d, s),
        None => s.serialize_none(),
    }
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

fn probe_port(path: &str, port: &IntOrString) -> Result<u16, AppProberError> {
    match port {
        IntOrString::Str(name) => Err(AppProberError::PortNotInt {
            path: path.to_string(),
            port: name.clone(),
        }),
        IntOrString::Int(p) => int_port(path, *p),
    }
}

fn int_port(path: &str, port: i64) -> Result<u16, AppProberError> {
    match u16::try_from(port) {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(AppProberError::PortOutOfRange {
            path: path.to_string(),
            port,
        }),
    }
}

/// Istio's `validateAppKubeProber`, plus a range check on ports.
fn validate_prober(path: &str, raw: &RawProber) -> Result<AppProbe, AppProberError> {
    if !valid_prober_path(path) {
        return Err(AppProberError::InvalidPath {
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
        _ => Err(AppProberError::InvalidType {
            path: path.to_string(),
        }),
    }
}

/// Parses `ISTIO_KUBE_APP_PROBERS` (empty means none); every invalid probe
/// is reported.
pub fn parse_app_probers(json: &str) -> Result<AppProbes, Vec<AppProberError>> {
    let mut probers = AppProbes::new();
    if json.is_empty() {
        return Ok(probers);
    }
    let raw: BTreeMap<String, RawProber> = serde_json::from_str(json).map_err(|e| {
        vec![AppProberError::Decode {
            reason: e.to_string(),
            json: json.to_string(),
        }]
    })?;
    let mut errors = Vec::new();
    for (path, prober) in &raw {
        match validate_prober(path, prober) {
            Ok(probe) => {
                probers.insert(path.clone(), probe);
            }
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(probers)
    } else {
        Err(errors)
    }
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScrapeTarget {
    /// The application's port.
    pub port: u16,
    /// The path, with a leading `/` (`/metrics` by default).
    pub path: String,
}

/// Parses `ISTIO_PROMETHEUS_ANNOTATIONS` (`None` when unset). Only sidecars
/// merge application metrics, as gateways expose the status port in their
/// Services: a gateway's value is not even read. Every invalid target is
/// reported.
pub fn parse_scrape_targets(
    json: Option<&str>,
    status_port: u16,
    sidecar: bool,
) -> Result<Vec<ScrapeTarget>, Vec<ScrapeConfigError>> {
    let Some(json) = json else {
        return Ok(Vec::new());
    };
    if !sidecar {
        return Ok(Vec::new());
    }
    let raw: RawScrapeConfig = serde_json::from_str(json).map_err(|e| {
        vec![ScrapeConfigError::Decode {
            reason: e.to_string(),
        }]
    })?;
    tracing::info!(target: "status", "Prometheus scraping configuration: {json}");
    if raw.scrape == "false" {
        return Ok(Vec::new());
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
            if port == status_port.to_string() {
                return Err(vec![ScrapeConfigError::PortIsStatusPort { status_port }]);
            }
            vec![RawScrapeTarget {
                port,
                path: raw.path,
            }]
        }
    };
    let mut targets = Vec::new();
    let mut errors = Vec::new();
    for t in raw_targets {
        let port = match t.port.parse::<i64>().ok().map(u16::try_from) {
            Some(Ok(p)) if p != 0 => p,
            _ => {
                errors.push(ScrapeConfigError::InvalidPort { port: t.port });
                continue;
            }
        };
        if port == status_port {
            errors.push(ScrapeConfigError::TargetIsStatusPort { port: t.port });
            continue;
        }
        if let Some((_, reason)) = RESERVED_PORTS.iter().find(|(p, _)| *p == port) {
            errors.push(ScrapeConfigError::ReservedPort {
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
    if errors.is_empty() {
        Ok(targets)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // TestNewServer.

    fn prober_errors(json: &str) -> Vec<String> {
        match parse_app_probers(json) {
            Ok(_) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
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
        let probes = parse_app_probers(
            r#"{
                "/app-health/a/readyz": {"httpGet": {"path": "ready", "port": 8080, "scheme": "HTTPS"}, "timeoutSeconds": 3},
                "/app-health/a/livez": {"tcpSocket": {"port": 8081}},
                "/app-health/a/startupz": {"grpc": {"port": 9000, "service": "x"}, "timeoutSeconds": 1}
            }"#,
        )
        .unwrap();
        assert_eq!(
            probes["/app-health/a/readyz"],
            AppProbe::Http {
                path: "/ready".to_string(),
                port: 8080,
                https: true,
                timeout: Some(Duration::from_secs(3)),
            }
        );
        assert_eq!(
            probes["/app-health/a/livez"],
            AppProbe::Tcp {
                port: 8081,
                timeout: None
            }
        );
        assert_eq!(
            probes["/app-health/a/startupz"],
            AppProbe::Grpc {
                port: 9000,
                service: "x".to_string(),
                timeout: Some(Duration::from_secs(1)),
            }
        );
    }

    // TestNewServerPrometheusNormalization, TestIstioReservedPortReason.

    fn scrape_config(json: &str) -> Result<Vec<ScrapeTarget>, Vec<String>> {
        parse_scrape_targets(Some(json), 15020, true)
            .map_err(|errors| errors.iter().map(ToString::to_string).collect())
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
        let targets = parse_scrape_targets(Some(r#"{"port":"8080"}"#), 15020, false).unwrap();
        assert!(targets.is_empty());
    }
}
