//! Access loggers for the providers a workload's Telemetry puts in force:
//! Envoy's file access logger with Istio's default TEXT format or JSON
//! labels, a custom format, and a CEL filter (`filter.expression`).

use proto::pb::envoy::config::accesslog::v3::{
    AccessLog, AccessLogFilter, ExtensionFilter, access_log, access_log_filter, extension_filter,
};
use proto::pb::envoy::config::core::v3::{
    DataSource, SubstitutionFormatString, data_source, substitution_format_string,
};
use proto::pb::envoy::extensions::access_loggers::file::v3::{FileAccessLog, file_access_log};
use proto::pb::envoy::extensions::access_loggers::filters::cel::v3::ExpressionFilter;
use proto::pb::google::protobuf::{ListValue, Struct, Value, value};

use crate::mesh::{AccessLogEncoding, ExtensionProviderKind, MeshConfig};
use crate::model::telemetry::{BUILTIN_ENVOY_PROVIDER, LoggingProvider};

use super::super::util::any;
use super::ProviderError;

/// Envoy's file access logger.
pub const FILE_ACCESS_LOG: &str = "envoy.access_loggers.file";
/// Envoy's CEL access log filter.
pub const CEL_FILTER: &str = "envoy.access_loggers.extension_filters.cel";
/// Where the built-in `envoy` provider writes when `accessLogFile` is unset.
const STDOUT: &str = "/dev/stdout";

/// Istio's default TEXT access log format (`EnvoyTextLogFormat`).
pub const DEFAULT_TEXT_FORMAT: &str = concat!(
    "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" ",
    "%RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% ",
    "\"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% ",
    "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" ",
    "\"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" %UPSTREAM_CLUSTER_RAW% ",
    "%UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% ",
    "%REQUESTED_SERVER_NAME% %ROUTE_NAME%\n"
);

/// Istio's default JSON labels (`EnvoyJSONLogFormatIstio`).
pub const DEFAULT_JSON_LABELS: [(&str, &str); 24] = [
    ("start_time", "%START_TIME%"),
    ("route_name", "%ROUTE_NAME%"),
    ("method", "%REQ(:METHOD)%"),
    ("path", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"),
    ("protocol", "%PROTOCOL%"),
    ("response_code", "%RESPONSE_CODE%"),
    ("response_flags", "%RESPONSE_FLAGS%"),
    ("response_code_details", "%RESPONSE_CODE_DETAILS%"),
    (
        "connection_termination_details",
        "%CONNECTION_TERMINATION_DETAILS%",
    ),
    ("bytes_received", "%BYTES_RECEIVED%"),
    ("bytes_sent", "%BYTES_SENT%"),
    ("duration", "%DURATION%"),
    (
        "upstream_service_time",
        "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    ),
    ("x_forwarded_for", "%REQ(X-FORWARDED-FOR)%"),
    ("user_agent", "%REQ(USER-AGENT)%"),
    ("request_id", "%REQ(X-REQUEST-ID)%"),
    ("authority", "%REQ(:AUTHORITY)%"),
    ("upstream_host", "%UPSTREAM_HOST%"),
    ("upstream_cluster", "%UPSTREAM_CLUSTER_RAW%"),
    ("upstream_local_address", "%UPSTREAM_LOCAL_ADDRESS%"),
    ("downstream_local_address", "%DOWNSTREAM_LOCAL_ADDRESS%"),
    ("downstream_remote_address", "%DOWNSTREAM_REMOTE_ADDRESS%"),
    ("requested_server_name", "%REQUESTED_SERVER_NAME%"),
    (
        "upstream_transport_failure_reason",
        "%UPSTREAM_TRANSPORT_FAILURE_REASON%",
    ),
];

/// What a file logger writes: a text format or JSON labels.
enum Format {
    Text(String),
    Json(serde_json::Map<String, serde_json::Value>),
}

/// The access loggers of `providers`; a provider that names no file
/// access logger is reported and left out.
pub fn access_logs(mesh: &MeshConfig, providers: &[LoggingProvider]) -> Vec<AccessLog> {
    providers
        .iter()
        .filter_map(|p| {
            let (path, format, omit_empty) = match file_logger(mesh, &p.name) {
                Ok(l) => l,
                Err(why) => {
                    tracing::warn!(target: "telemetry", provider = %p.name, "access log provider not applied: {why}");
                    return None;
                }
            };
            Some(file_access_log(path, format, omit_empty, p.filter.as_deref()))
        })
        .collect()
}

/// The path and format of the file logger `name` names.
fn file_logger(mesh: &MeshConfig, name: &str) -> Result<(String, Format, bool), ProviderError> {
    match mesh.extension_providers.iter().find(|p| p.name == name) {
        Some(p) => match &p.kind {
            ExtensionProviderKind::FileAccessLog(f) => {
                let fmt = f.log_format.as_ref();
                let format = match (
                    fmt.and_then(|f| f.text.clone()),
                    fmt.and_then(|f| f.labels.clone()),
                ) {
                    (Some(text), _) => Format::Text(with_newline(text)),
                    (None, Some(labels)) => Format::Json(labels),
                    (None, None) => Format::Text(DEFAULT_TEXT_FORMAT.into()),
                };
                Ok((
                    f.path.clone(),
                    format,
                    fmt.is_some_and(|f| f.omit_empty_values),
                ))
            }
            other => Err(ProviderError::WrongKind {
                kind: other.key().to_string(),
                wanted: "envoyFileAccessLog",
                section: "accessLogging",
            }),
        },
        None if name == BUILTIN_ENVOY_PROVIDER => {
            let t = &mesh.telemetry;
            let path = if t.access_log_file.is_empty() {
                STDOUT.to_string()
            } else {
                t.access_log_file.clone()
            };
            Ok((path, mesh_format(mesh), false))
        }
        None => Err(ProviderError::NotFound),
    }
}

/// The mesh config's format: `accessLogFormat` in `accessLogEncoding`, or
/// Istio's default for the encoding.
fn mesh_format(mesh: &MeshConfig) -> Format {
    let t = &mesh.telemetry;
    match t.access_log_encoding {
        AccessLogEncoding::Text if t.access_log_format.is_empty() => {
            Format::Text(DEFAULT_TEXT_FORMAT.into())
        }
        AccessLogEncoding::Text => Format::Text(with_newline(t.access_log_format.clone())),
        AccessLogEncoding::Json => Format::Json(
            serde_json::from_str(&t.access_log_format).unwrap_or_else(|_| {
                DEFAULT_JSON_LABELS
                    .iter()
                    .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
                    .collect()
            }),
        ),
    }
}

fn with_newline(mut text: String) -> String {
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

fn file_access_log(
    path: String,
    format: Format,
    omit_empty: bool,
    filter: Option<&str>,
) -> AccessLog {
    let format = match format {
        Format::Text(text) => substitution_format_string::Format::TextFormatSource(DataSource {
            specifier: Some(data_source::Specifier::InlineString(text)),
            ..Default::default()
        }),
        Format::Json(labels) => substitution_format_string::Format::JsonFormat(to_struct(labels)),
    };
    let config = FileAccessLog {
        path,
        access_log_format: Some(file_access_log::AccessLogFormat::LogFormat(
            SubstitutionFormatString {
                format: Some(format),
                omit_empty_values: omit_empty,
                ..Default::default()
            },
        )),
    };
    AccessLog {
        name: FILE_ACCESS_LOG.into(),
        filter: filter.map(cel_filter),
        config_type: Some(access_log::ConfigType::TypedConfig(any(&config))),
    }
}

fn cel_filter(expression: &str) -> AccessLogFilter {
    AccessLogFilter {
        filter_specifier: Some(access_log_filter::FilterSpecifier::ExtensionFilter(
            ExtensionFilter {
                name: CEL_FILTER.into(),
                config_type: Some(extension_filter::ConfigType::TypedConfig(any(
                    &ExpressionFilter {
                        expression: expression.into(),
                        ..Default::default()
                    },
                ))),
            },
        )),
    }
}

/// A JSON object as a `google.protobuf.Struct`.
pub fn to_struct(map: serde_json::Map<String, serde_json::Value>) -> Struct {
    Struct {
        fields: map.into_iter().map(|(k, v)| (k, to_value(v))).collect(),
    }
}

fn to_value(v: serde_json::Value) -> Value {
    use serde_json::Value as J;
    let kind = match v {
        J::Null => value::Kind::NullValue(0),
        J::Bool(b) => value::Kind::BoolValue(b),
        J::Number(n) => value::Kind::NumberValue(n.as_f64().unwrap_or_default()),
        J::String(s) => value::Kind::StringValue(s),
        J::Array(a) => value::Kind::ListValue(ListValue {
            values: a.into_iter().map(to_value).collect(),
        }),
        J::Object(o) => value::Kind::StructValue(to_struct(o)),
    };
    Value { kind: Some(kind) }
}
