//! `networking.istio.io` WorkloadGroup: the template of the WorkloadEntries
//! that VMs register (Istio's auto-registration), and the probe their agents
//! run; with the `Healthy` condition a WorkloadEntry's status carries.

use serde::{Deserialize, Serialize};

use super::{Labels, WorkloadEntry};

/// A `networking.istio.io` WorkloadGroup.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct WorkloadGroup {
    /// Labels and annotations copied onto every generated WorkloadEntry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<GroupMetadata>,
    /// The WorkloadEntry every member gets (its address is the proxy's IP).
    pub template: Option<WorkloadEntry>,
    /// The readiness probe the members' agents run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<ReadinessProbe>,
}

/// A WorkloadGroup's `metadata`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GroupMetadata {
    /// Labels of the generated entries.
    pub labels: Labels,
    /// Annotations of the generated entries.
    pub annotations: Labels,
}

/// Istio's `ReadinessProbe` (a WorkloadGroup's `probe`, a ProxyConfig's
/// `readinessProbe`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ReadinessProbe {
    /// Seconds before the first probe.
    pub initial_delay_seconds: i32,
    /// Seconds before a probe times out (1 when 0).
    pub timeout_seconds: i32,
    /// Seconds between probes (10 when 0).
    pub period_seconds: i32,
    /// Successes in a row that make the workload healthy (1 when 0).
    pub success_threshold: i32,
    /// Failures in a row that make it unhealthy (1 when 0).
    pub failure_threshold: i32,
    /// An HTTP GET to the workload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HttpHealthCheck>,
    /// A TCP connect to the workload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_socket: Option<TcpHealthCheck>,
    /// A command run by the agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecHealthCheck>,
    /// A gRPC health check (Istio's validation refuses it in a group).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc: Option<serde_json::Value>,
}

/// `httpGet`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpHealthCheck {
    /// The path (`/` when empty).
    pub path: String,
    /// The port (required).
    pub port: u32,
    /// The host (the proxy's IP when empty).
    pub host: String,
    /// `HTTP` or `HTTPS`.
    pub scheme: String,
    /// Extra request headers.
    pub http_headers: Vec<HealthCheckHeader>,
}

/// One of `httpGet.httpHeaders`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HealthCheckHeader {
    /// Header name.
    pub name: String,
    /// Header value.
    pub value: String,
}

/// `tcpSocket`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TcpHealthCheck {
    /// The host (the proxy's IP when empty).
    pub host: String,
    /// The port (required).
    pub port: u32,
}

/// `exec`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ExecHealthCheck {
    /// The command and its arguments.
    pub command: Vec<String>,
}

/// One of an Istio object's `status.conditions` (Istio's `IstioCondition`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IstioCondition {
    /// The condition's type (`Healthy`).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// When it was last probed (RFC 3339).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub last_probe_time: String,
    /// When the status last changed (RFC 3339).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub last_transition_time: String,
    /// Why, in a word.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Why, for a person.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The condition type the health of a WorkloadEntry is kept in.
pub const CONDITION_HEALTHY: &str = "Healthy";
/// The annotation marking a WorkloadEntry whose health is reported by its
/// agent (Istio's `WorkloadEntryHealthCheckAnnotation`).
pub const HEALTH_CHECK_ANNOTATION: &str = "proxy.istio.io/health-checks-enabled";

/// Istio's `isHealthy`: a WorkloadEntry with health checks enabled is
/// healthy only once its `Healthy` condition says `True` (new entries are
/// unhealthy until a probe passes); any other entry is healthy.
pub fn is_healthy(annotations: &Labels, conditions: &[IstioCondition]) -> bool {
    let enabled = annotations
        .get(HEALTH_CHECK_ANNOTATION)
        .is_some_and(|v| parse_go_bool(v) == Some(true));
    if !enabled {
        return true;
    }
    conditions
        .iter()
        .find(|c| c.type_ == CONDITION_HEALTHY)
        .is_some_and(|c| c.status == "True")
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}
