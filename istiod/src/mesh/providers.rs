//! Mesh config `extensionProviders` (Istio's `MeshConfig.ExtensionProvider`):
//! the external authorizers CUSTOM AuthorizationPolicies name, and the
//! access loggers, tracers and metrics providers Telemetry names.
//!
//! The ext_authz kinds, `envoyFileAccessLog`, `zipkin`, `opentelemetry` and
//! `prometheus` are decoded field by field and every field is applied; an
//! unknown field (including Istio's deprecated `includeHeadersInCheck`, and
//! the fields of these kinds this istiod does not apply) is a mesh config
//! error naming it. Other provider kinds are kept by name and kind only: a
//! CUSTOM policy naming one is denied, as Istio does for a provider it
//! cannot use for authorization, and a Telemetry naming one is reported
//! when its configuration is generated.

use std::time::Duration;

use serde::Deserialize;

use crate::model::istio::go_duration;

/// One `extensionProviders[]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtensionProvider {
    /// `name`, what a policy's `provider.name` refers to.
    pub name: String,
    /// The provider.
    pub kind: ExtensionProviderKind,
}

/// What an extension provider is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtensionProviderKind {
    /// `envoyExtAuthzHttp`.
    ExtAuthzHttp(ExtAuthzHttp),
    /// `envoyExtAuthzGrpc`.
    ExtAuthzGrpc(ExtAuthzGrpc),
    /// `envoyFileAccessLog`.
    FileAccessLog(FileAccessLog),
    /// `zipkin`.
    Zipkin(Zipkin),
    /// `opentelemetry`.
    OpenTelemetry(OpenTelemetry),
    /// `prometheus` (the standard metrics; no fields).
    Prometheus,
    /// Any other kind (`zipkin`, `envoyFileAccessLog`, ...), by its key:
    /// parsed, not used by authorization.
    Other(String),
}

impl ExtensionProviderKind {
    /// The kind's key as written in the mesh config (`zipkin`, ...).
    pub fn key(&self) -> &str {
        match self {
            ExtensionProviderKind::ExtAuthzHttp(_) => "envoyExtAuthzHttp",
            ExtensionProviderKind::ExtAuthzGrpc(_) => "envoyExtAuthzGrpc",
            ExtensionProviderKind::FileAccessLog(_) => "envoyFileAccessLog",
            ExtensionProviderKind::Zipkin(_) => "zipkin",
            ExtensionProviderKind::OpenTelemetry(_) => "opentelemetry",
            ExtensionProviderKind::Prometheus => "prometheus",
            ExtensionProviderKind::Other(key) => key,
        }
    }
}

/// `envoyExtAuthzHttp`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ExtAuthzHttp {
    /// The authorizer's service: `<name>.<ns>.svc.<domain>` or `<ns>/<host>`.
    pub service: String,
    /// The service port.
    #[serde(deserialize_with = "port")]
    pub port: u32,
    /// Prefix of the check request's path (the request's path follows it).
    pub path_prefix: String,
    /// How long a check may take (Envoy's default 200ms when unset).
    #[serde(with = "go_duration")]
    pub timeout: Option<Duration>,
    /// Allow the request when the authorizer cannot be reached.
    pub fail_open: bool,
    /// The status returned when the authorizer fails (default 403).
    pub status_on_error: String,
    /// Clear the route cache after the check (headers may have changed).
    pub clear_route_cache: bool,
    /// Request headers sent in the check (besides Envoy's defaults).
    pub include_request_headers_in_check: Vec<String>,
    /// Headers added to the check request.
    pub include_additional_headers_in_check: std::collections::BTreeMap<String, String>,
    /// Send the request body in the check.
    pub include_request_body_in_check: Option<BodyInCheck>,
    /// Authorizer response headers sent upstream on allow.
    pub headers_to_upstream_on_allow: Vec<String>,
    /// Authorizer response headers sent to the client on deny.
    pub headers_to_downstream_on_deny: Vec<String>,
    /// Authorizer response headers sent to the client on allow.
    pub headers_to_downstream_on_allow: Vec<String>,
}

/// `envoyExtAuthzGrpc`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ExtAuthzGrpc {
    /// The authorizer's service: `<name>.<ns>.svc.<domain>` or `<ns>/<host>`.
    pub service: String,
    /// The service port.
    #[serde(deserialize_with = "port")]
    pub port: u32,
    /// How long a check may take.
    #[serde(with = "go_duration")]
    pub timeout: Option<Duration>,
    /// Allow the request when the authorizer cannot be reached.
    pub fail_open: bool,
    /// The status returned when the authorizer fails (default 403).
    pub status_on_error: String,
    /// Clear the route cache after the check.
    pub clear_route_cache: bool,
    /// Send the request body in the check.
    pub include_request_body_in_check: Option<BodyInCheck>,
}

/// `envoyFileAccessLog`: Envoy's file access logger.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FileAccessLog {
    /// The file (`/dev/stdout` writes to Envoy's standard output).
    pub path: String,
    /// The format; Istio's default TEXT format when unset.
    pub log_format: Option<LogFormat>,
}

/// `envoyFileAccessLog.logFormat`: one of `text` and `labels`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LogFormat {
    /// An Envoy format string.
    pub text: Option<String>,
    /// JSON lines: key to Envoy format string (or any JSON value).
    pub labels: Option<serde_json::Map<String, serde_json::Value>>,
    /// Leave out fields whose value is empty.
    pub omit_empty_values: bool,
}

/// `zipkin`: a Zipkin collector, `/api/v2/spans` in JSON (v2).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Zipkin {
    /// The collector's service: `<name>.<ns>.svc.<domain>` or `<ns>/<host>`.
    pub service: String,
    /// The service port.
    #[serde(deserialize_with = "port")]
    pub port: u32,
    /// Longest path tag (Envoy's default 256 when unset).
    pub max_tag_length: Option<u32>,
    /// 64-bit trace IDs instead of 128-bit ones.
    pub enable64bit_trace_id: bool,
    /// The collector's path (default `/api/v2/spans`).
    pub path: Option<String>,
}

/// `opentelemetry`: an OTLP collector, over gRPC or HTTP.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OpenTelemetry {
    /// The collector's service: `<name>.<ns>.svc.<domain>` or `<ns>/<host>`.
    pub service: String,
    /// The service port.
    #[serde(deserialize_with = "port")]
    pub port: u32,
    /// Longest path tag (Envoy's default 256 when unset).
    pub max_tag_length: Option<u32>,
    /// Export over gRPC (the default).
    pub grpc: Option<OtelGrpc>,
    /// Export over HTTP (OTLP/HTTP protobuf).
    pub http: Option<OtelHttp>,
}

/// `opentelemetry.grpc`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OtelGrpc {
    /// How long an export may take.
    #[serde(with = "go_duration")]
    pub timeout: Option<Duration>,
}

/// `opentelemetry.http`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OtelHttp {
    /// The collector's path (e.g. `/v1/traces`).
    pub path: String,
    /// How long an export may take.
    #[serde(with = "go_duration")]
    pub timeout: Option<Duration>,
}

/// `prometheus`: no fields.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Prometheus {}

/// `includeRequestBodyInCheck` (Envoy's `BufferSettings`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct BodyInCheck {
    /// At most this many body bytes are buffered and sent.
    pub max_request_bytes: u32,
    /// Send a partial body when it exceeds `maxRequestBytes`, instead of 413.
    pub allow_partial_message: bool,
    /// Send the body as raw bytes (gRPC).
    pub pack_as_bytes: bool,
}

/// A port as a number or a numeric string (protobuf JSON accepts both).
fn port<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum P {
        N(u32),
        S(String),
    }
    match P::deserialize(d)? {
        P::N(n) => Ok(n),
        P::S(s) => s
            .parse()
            .map_err(|_| serde::de::Error::custom(format!("port {s:?} is not a number"))),
    }
}

fn status_ok(field: &str, status: &str, errors: &mut Vec<String>) {
    if !status.is_empty() && !matches!(status.parse::<u16>(), Ok(100..=599)) {
        errors.push(format!(
            "{field}.statusOnError {status:?} is not an HTTP status (use e.g. \"500\")"
        ));
    }
}

fn common_ok(field: &str, service: &str, port: u32, errors: &mut Vec<String>) {
    if service.is_empty() {
        errors.push(format!(
            "{field}.service is required (the provider's host, <name>.<ns>.svc.<domain> or <ns>/<host>)"
        ));
    }
    if !(1..=65535).contains(&port) {
        errors.push(format!("{field}.port {port} is not a port (1-65535)"));
    }
}

fn file_access_log_ok(field: &str, f: &FileAccessLog, errors: &mut Vec<String>) {
    if f.path.is_empty() {
        errors.push(format!("{field}.path is required (e.g. /dev/stdout)"));
    }
    if let Some(fmt) = &f.log_format
        && fmt.text.is_some() == fmt.labels.is_some()
    {
        errors.push(format!(
            "{field}.logFormat must have exactly one of text and labels"
        ));
    }
}

/// Parses `extensionProviders`, adding every problem to `errors`.
pub fn extension_providers(
    raw: &[serde_json::Value],
    errors: &mut Vec<String>,
) -> Vec<ExtensionProvider> {
    let mut out: Vec<ExtensionProvider> = Vec::new();
    for (i, v) in raw.iter().enumerate() {
        let field = format!("extensionProviders[{i}]");
        let Some(obj) = v.as_object() else {
            errors.push(format!("{field} is not an object"));
            continue;
        };
        let name = obj.get("name").and_then(|n| n.as_str()).unwrap_or_default();
        if name.is_empty() {
            errors.push(format!("{field}.name is required"));
        } else if out.iter().any(|p| p.name == name) {
            errors.push(format!("{field}.name {name:?} is used by another provider"));
        }
        let kinds: Vec<&String> = obj.keys().filter(|k| *k != "name").collect();
        let [kind] = kinds.as_slice() else {
            errors.push(format!(
                "{field} must have exactly one provider kind (e.g. envoyExtAuthzHttp), has {kinds:?}"
            ));
            continue;
        };
        let body = &obj[kind.as_str()];
        let kind = match kind.as_str() {
            "envoyExtAuthzHttp" => match ExtAuthzHttp::deserialize(body) {
                Ok(h) => {
                    let f = format!("{field}.envoyExtAuthzHttp");
                    common_ok(&f, &h.service, h.port, errors);
                    status_ok(&f, &h.status_on_error, errors);
                    ExtensionProviderKind::ExtAuthzHttp(h)
                }
                Err(e) => {
                    errors.push(format!("{field}.envoyExtAuthzHttp: {e}"));
                    continue;
                }
            },
            "envoyExtAuthzGrpc" => match ExtAuthzGrpc::deserialize(body) {
                Ok(g) => {
                    let f = format!("{field}.envoyExtAuthzGrpc");
                    common_ok(&f, &g.service, g.port, errors);
                    status_ok(&f, &g.status_on_error, errors);
                    ExtensionProviderKind::ExtAuthzGrpc(g)
                }
                Err(e) => {
                    errors.push(format!("{field}.envoyExtAuthzGrpc: {e}"));
                    continue;
                }
            },
            "envoyFileAccessLog" => match FileAccessLog::deserialize(body) {
                Ok(f) => {
                    file_access_log_ok(&format!("{field}.envoyFileAccessLog"), &f, errors);
                    ExtensionProviderKind::FileAccessLog(f)
                }
                Err(e) => {
                    errors.push(format!("{field}.envoyFileAccessLog: {e}"));
                    continue;
                }
            },
            "zipkin" => match Zipkin::deserialize(body) {
                Ok(z) => {
                    common_ok(&format!("{field}.zipkin"), &z.service, z.port, errors);
                    ExtensionProviderKind::Zipkin(z)
                }
                Err(e) => {
                    errors.push(format!("{field}.zipkin: {e}"));
                    continue;
                }
            },
            "opentelemetry" => match OpenTelemetry::deserialize(body) {
                Ok(o) => {
                    let f = format!("{field}.opentelemetry");
                    common_ok(&f, &o.service, o.port, errors);
                    if o.grpc.is_some() && o.http.is_some() {
                        errors.push(format!("{f}: set one of grpc and http, not both"));
                    }
                    ExtensionProviderKind::OpenTelemetry(o)
                }
                Err(e) => {
                    errors.push(format!("{field}.opentelemetry: {e}"));
                    continue;
                }
            },
            "prometheus" => match Prometheus::deserialize(body) {
                Ok(_) => ExtensionProviderKind::Prometheus,
                Err(e) => {
                    errors.push(format!("{field}.prometheus: {e}"));
                    continue;
                }
            },
            other => ExtensionProviderKind::Other(other.to_string()),
        };
        out.push(ExtensionProvider {
            name: name.to_string(),
            kind,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::Mesh;
    use super::*;

    #[test]
    fn parses_ext_authz_providers() {
        let m = Mesh::parse(
            r#"
extensionProviders:
- name: http
  envoyExtAuthzHttp:
    service: ext-authz.demo.svc.cluster.local
    port: "8000"
    pathPrefix: /check
    timeout: 2s
    failOpen: true
    statusOnError: "503"
    includeRequestHeadersInCheck: [x-ext-authz]
    includeAdditionalHeadersInCheck: {x-added: v}
    headersToUpstreamOnAllow: [x-user]
    headersToDownstreamOnDeny: [x-reason]
    includeRequestBodyInCheck: {maxRequestBytes: 100}
- name: grpc
  envoyExtAuthzGrpc: {service: demo/ext-authz, port: 9000}
- name: tracing
  zipkin: {service: zipkin.istio-system.svc.cluster.local, port: 9411}
"#,
        )
        .unwrap();
        let p = &m.config.extension_providers;
        assert_eq!(p.len(), 3);
        let ExtensionProviderKind::ExtAuthzHttp(h) = &p[0].kind else {
            panic!("{p:?}")
        };
        assert_eq!(h.port, 8000);
        assert_eq!(h.timeout, Some(Duration::from_secs(2)));
        assert_eq!(
            h.include_request_body_in_check.unwrap().max_request_bytes,
            100
        );
        assert!(matches!(&p[1].kind, ExtensionProviderKind::ExtAuthzGrpc(g) if g.port == 9000));
        assert!(matches!(&p[2].kind, ExtensionProviderKind::Zipkin(z) if z.port == 9411));
    }

    #[test]
    fn refuses_what_it_cannot_apply() {
        let errors = Mesh::parse(
            r#"
extensionProviders:
- name: a
  envoyExtAuthzHttp: {service: s.demo.svc.cluster.local, port: 80, includeHeadersInCheck: [x]}
- name: b
  envoyExtAuthzGrpc: {service: "", port: 0, statusOnError: abc}
- name: b
  envoyExtAuthzGrpc: {service: s, port: 1}
  envoyExtAuthzHttp: {service: s, port: 1}
"#,
        )
        .unwrap_err();
        let all = errors.join("\n");
        assert!(
            all.contains("unknown field `includeHeadersInCheck`"),
            "{all}"
        );
        assert!(
            all.contains("extensionProviders[1].envoyExtAuthzGrpc.service is required"),
            "{all}"
        );
        assert!(all.contains("port 0 is not a port"), "{all}");
        assert!(all.contains("statusOnError \"abc\""), "{all}");
        assert!(all.contains("used by another provider"), "{all}");
        assert!(all.contains("exactly one provider kind"), "{all}");
    }
}
