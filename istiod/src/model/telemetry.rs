//! `telemetry.istio.io` Telemetry: access logging, tracing and metrics
//! settings per workload, and their resolution for one workload as Istio's
//! `pilot/pkg/model/telemetry.go` does it: the root namespace's Telemetry
//! without a selector, then the workload namespace's without a selector,
//! then one selecting the workload; each more specific level overrides the
//! ones before it, section by section and provider by provider.
//!
//! This is the model only: what applies to a workload, in the mesh config's
//! terms (provider names, percentages, tags). The xDS generators turn it
//! into Envoy's access loggers and tracers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ROOT_NAMESPACE;
use super::istio::{Labels, PolicySelector};
use super::security::PolicyTargetReference;

/// A `telemetry.istio.io` Telemetry (`v1`, `v1alpha1`).
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Telemetry {
    /// Workloads it applies to (the whole namespace, or the mesh in the root
    /// namespace, when unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<PolicySelector>,
    /// Not supported (refused by validation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<PolicyTargetReference>,
    /// Not supported (refused by validation).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<PolicyTargetReference>,
    /// Tracing settings.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tracing: Vec<Tracing>,
    /// Metrics settings.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<Metrics>,
    /// Access logging settings.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub access_logging: Vec<AccessLogging>,
}

/// `ProviderRef`: an `extensionProviders[].name` of the mesh config.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ProviderRef {
    /// The provider's name.
    pub name: String,
}

/// Istio's `WorkloadMode`: which side of a connection a setting is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WorkloadMode {
    /// Both (the default).
    #[default]
    ClientAndServer,
    /// Outbound traffic (sidecar outbound listeners, gateways).
    Client,
    /// Inbound traffic (sidecar inbound listeners).
    Server,
}

impl WorkloadMode {
    /// Whether a setting for `self` applies to traffic in `mode` (`Client`
    /// or `Server`).
    pub fn covers(self, mode: WorkloadMode) -> bool {
        self == WorkloadMode::ClientAndServer || self == mode
    }
}

/// `WorkloadModeSelector` / `TracingSelector`: `{mode}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ModeSelector {
    /// The mode.
    pub mode: WorkloadMode,
}

/// `Telemetry.tracing[]`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Tracing {
    /// Which traffic.
    #[serde(rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_: Option<ModeSelector>,
    /// The provider (Istio uses the first one only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<ProviderRef>,
    /// Share of requests traced, 0-100.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub random_sampling_percentage: Option<f64>,
    /// Trace, but do not report spans.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_span_reporting: Option<bool>,
    /// Tags added to every span, by tag name.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub custom_tags: BTreeMap<String, CustomTag>,
    /// Not supported (refused by validation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_request_id_for_trace_sampling: Option<bool>,
    /// Not supported (refused by validation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable_istio_tags: Option<bool>,
}

/// `Tracing.CustomTag`: one of literal, environment, header.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CustomTag {
    /// A fixed value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub literal: Option<LiteralTag>,
    /// The value of an environment variable of the proxy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub environment: Option<NamedTag>,
    /// The value of a request header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header: Option<NamedTag>,
    /// Not supported (refused by validation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub formatter: Option<serde_json::Value>,
}

/// `Tracing.Literal`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LiteralTag {
    /// The value.
    pub value: String,
}

/// `Tracing.Environment` and `Tracing.RequestHeader`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NamedTag {
    /// The variable's or header's name.
    pub name: String,
    /// The value when it is missing.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub default_value: String,
}

/// `Telemetry.accessLogging[]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AccessLogging {
    /// Which traffic.
    #[serde(rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_: Option<ModeSelector>,
    /// The providers (the inherited ones when empty).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<ProviderRef>,
    /// Turns the providers off (or back on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// Which requests are logged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<AccessLogFilter>,
}

/// `AccessLogging.Filter`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AccessLogFilter {
    /// A CEL expression; a request is logged when it is true.
    pub expression: String,
}

/// `Telemetry.metrics[]`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Metrics {
    /// The providers (the inherited ones when empty).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<ProviderRef>,
    /// Per-metric settings.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<MetricsOverride>,
    /// Not supported (refused by validation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reporting_interval: Option<String>,
}

/// `MetricsOverrides`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MetricsOverride {
    /// Which metrics and traffic.
    #[serde(rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_: Option<MetricSelector>,
    /// Turns the metrics off (or back on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// Not supported (refused by validation).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tag_overrides: BTreeMap<String, serde_json::Value>,
}

/// `MetricSelector`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MetricSelector {
    /// One of Istio's standard metrics (`ALL_METRICS` when unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// A metric by name (not supported: refused by validation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub custom_metric: Option<String>,
    /// Which traffic.
    pub mode: WorkloadMode,
}

/// One Telemetry with its name and namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTelemetry {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The spec.
    pub spec: Telemetry,
}

/// The mesh config's `defaultProviders`, and the legacy mesh-wide access
/// log (`accessLogFile`), which Telemetry resources refine.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TelemetryDefaults {
    /// `defaultProviders.accessLogging`; when empty and `accessLogFile` is
    /// set, the built-in `envoy` provider.
    pub access_logging: Vec<String>,
    /// `defaultProviders.tracing`.
    pub tracing: Vec<String>,
    /// `defaultProviders.metrics` (Istio's default: `prometheus`).
    pub metrics: Vec<String>,
}

/// The Telemetry resources that apply to one workload, least specific first.
#[derive(Debug, Clone, Copy, Default)]
pub struct Applicable<'a> {
    /// The root namespace's, without a selector.
    pub mesh: Option<&'a NamedTelemetry>,
    /// The workload namespace's, without a selector.
    pub namespace: Option<&'a NamedTelemetry>,
    /// One of the workload namespace's selecting the workload.
    pub workload: Option<&'a NamedTelemetry>,
}

impl<'a> Applicable<'a> {
    /// Istio's `applicableTelemetries`: where several apply at one level,
    /// the first by name wins (Istio takes the oldest; names are stable).
    pub fn find(all: &'a [NamedTelemetry], namespace: &str, labels: &Labels) -> Self {
        let mut sorted: Vec<&NamedTelemetry> = all.iter().collect();
        sorted.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        let wide = |t: &&NamedTelemetry| {
            t.spec
                .selector
                .as_ref()
                .is_none_or(|s| s.match_labels.is_empty())
        };
        let mesh = sorted
            .iter()
            .find(|t| t.namespace == ROOT_NAMESPACE && wide(t))
            .copied();
        let ns = (namespace != ROOT_NAMESPACE)
            .then(|| {
                sorted
                    .iter()
                    .find(|t| t.namespace == namespace && wide(t))
                    .copied()
            })
            .flatten();
        let workload = sorted
            .iter()
            .find(|t| {
                t.namespace == namespace
                    && t.spec.selector.as_ref().is_some_and(|s| {
                        !s.match_labels.is_empty()
                            && s.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
                    })
            })
            .copied();
        Applicable {
            mesh,
            namespace: ns,
            workload,
        }
    }

    /// Whether no Telemetry applies (tests).
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.levels().next().is_none()
    }

    /// The levels that exist, least specific first.
    fn levels(&self) -> impl Iterator<Item = &'a Telemetry> {
        [self.mesh, self.namespace, self.workload]
            .into_iter()
            .flatten()
            .map(|t| &t.spec)
    }
}

/// One access log provider in force for a workload and mode.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LoggingProvider {
    /// The provider's name (`extensionProviders[].name`, or `envoy`).
    pub name: String,
    /// The CEL filter expression, when one is set.
    pub filter: Option<String>,
}

/// Istio's `mergeLogs`: the access log providers in force for traffic in
/// `mode`, in the order they were named. A level's entry naming providers
/// replaces the inherited list; `disabled` and `filter` apply to the entry's
/// providers (the inherited ones when it names none).
pub fn access_logging(
    applicable: &Applicable<'_>,
    defaults: &TelemetryDefaults,
    legacy_file: bool,
    mode: WorkloadMode,
) -> Vec<LoggingProvider> {
    let mut names: Vec<String> = defaults.access_logging.clone();
    if names.is_empty() && legacy_file {
        names.push(BUILTIN_ENVOY_PROVIDER.to_string());
    }
    let mut disabled: BTreeMap<String, bool> = BTreeMap::new();
    let mut filters: BTreeMap<String, String> = BTreeMap::new();
    for t in applicable.levels() {
        for entry in &t.access_logging {
            if !entry.match_.as_ref().is_none_or(|m| m.mode.covers(mode)) {
                continue;
            }
            if !entry.providers.is_empty() {
                names = entry.providers.iter().map(|p| p.name.clone()).collect();
            }
            for name in &names {
                if let Some(d) = entry.disabled {
                    disabled.insert(name.clone(), d);
                }
                if let Some(f) = &entry.filter {
                    filters.insert(name.clone(), f.expression.clone());
                }
            }
        }
    }
    let mut out: Vec<LoggingProvider> = Vec::new();
    for name in names {
        if disabled.get(&name).copied().unwrap_or(false) || out.iter().any(|p| p.name == name) {
            continue;
        }
        out.push(LoggingProvider {
            filter: filters.get(&name).filter(|f| !f.is_empty()).cloned(),
            name,
        });
    }
    out
}

/// The name of the built-in file access log provider (Istio's default
/// mesh config defines `envoy` as `envoyFileAccessLog` to `/dev/stdout`).
pub const BUILTIN_ENVOY_PROVIDER: &str = "envoy";

/// The tracing in force for a workload and mode (Istio's `mergeTracing`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TracingSpec {
    /// The provider (Istio supports one).
    pub provider: String,
    /// `randomSamplingPercentage`, when some level set it.
    pub random_sampling_percentage: Option<f64>,
    /// Trace but do not report.
    pub disable_span_reporting: bool,
    /// Custom tags, by name.
    pub custom_tags: BTreeMap<String, CustomTag>,
}

/// Istio's `mergeTracing`: each level's entries override what they set; the
/// first provider named wins. `None` when no provider is in force.
pub fn tracing(
    applicable: &Applicable<'_>,
    defaults: &TelemetryDefaults,
    mode: WorkloadMode,
) -> Option<TracingSpec> {
    let mut spec = TracingSpec {
        provider: defaults.tracing.first().cloned().unwrap_or_default(),
        ..Default::default()
    };
    for t in applicable.levels() {
        for entry in &t.tracing {
            if !entry.match_.as_ref().is_none_or(|m| m.mode.covers(mode)) {
                continue;
            }
            if let Some(p) = entry.providers.first() {
                spec.provider.clone_from(&p.name);
            }
            if let Some(p) = entry.random_sampling_percentage {
                spec.random_sampling_percentage = Some(p);
            }
            if let Some(d) = entry.disable_span_reporting {
                spec.disable_span_reporting = d;
            }
            for (k, v) in &entry.custom_tags {
                spec.custom_tags.insert(k.clone(), v.clone());
            }
        }
    }
    (!spec.provider.is_empty()).then_some(spec)
}

/// Whether the standard metrics are reported by the Prometheus provider,
/// per side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsReporting {
    /// `reporter="source"` metrics (outbound).
    pub client: bool,
    /// `reporter="destination"` metrics (inbound).
    pub server: bool,
}

/// The name of the built-in Prometheus provider.
pub const BUILTIN_PROMETHEUS_PROVIDER: &str = "prometheus";

/// Istio's `mergeMetrics` reduced to what can be applied: whether a
/// Prometheus provider (`prometheus`, or one in `prometheus_providers`) is
/// in force and not disabled for `ALL_METRICS`, per mode. Istio's default:
/// enabled on both sides.
pub fn metrics_reporting(
    applicable: &Applicable<'_>,
    defaults: &TelemetryDefaults,
    prometheus_providers: &[String],
) -> MetricsReporting {
    let side = |mode: WorkloadMode| {
        let mut names: Vec<String> = if defaults.metrics.is_empty() {
            vec![BUILTIN_PROMETHEUS_PROVIDER.to_string()]
        } else {
            defaults.metrics.clone()
        };
        let mut disabled: BTreeMap<String, bool> = BTreeMap::new();
        for t in applicable.levels() {
            for entry in &t.metrics {
                if !entry.providers.is_empty() {
                    names = entry.providers.iter().map(|p| p.name.clone()).collect();
                }
                for o in &entry.overrides {
                    let m = o.match_.clone().unwrap_or_default();
                    let all = m.custom_metric.is_none()
                        && m.metric.as_deref().is_none_or(|x| x == "ALL_METRICS");
                    if !all || !m.mode.covers(mode) {
                        continue;
                    }
                    if let Some(d) = o.disabled {
                        for n in &names {
                            disabled.insert(n.clone(), d);
                        }
                    }
                }
            }
        }
        names.iter().any(|n| {
            (n == BUILTIN_PROMETHEUS_PROVIDER || prometheus_providers.contains(n))
                && !disabled.get(n).copied().unwrap_or(false)
        })
    };
    MetricsReporting {
        client: side(WorkloadMode::Client),
        server: side(WorkloadMode::Server),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tel(ns: &str, name: &str, yaml: &str) -> NamedTelemetry {
        NamedTelemetry {
            namespace: ns.into(),
            name: name.into(),
            spec: serde_yaml_ng::from_str(yaml).unwrap(),
        }
    }

    fn labels(app: &str) -> Labels {
        [("app".to_string(), app.to_string())].into()
    }

    fn names(p: &[LoggingProvider]) -> Vec<&str> {
        p.iter().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn workload_overrides_namespace_overrides_root() {
        let all = vec![
            tel(
                "istio-system",
                "mesh",
                "accessLogging: [{providers: [{name: a}]}]",
            ),
            tel("demo", "ns", "accessLogging: [{providers: [{name: b}]}]"),
            tel(
                "demo",
                "sleep",
                "selector: {matchLabels: {app: sleep}}\naccessLogging: [{disabled: true}]",
            ),
            // Another namespace's workload Telemetry never applies here.
            tel(
                "other",
                "x",
                "selector: {matchLabels: {app: httpbin}}\naccessLogging: [{disabled: true}]",
            ),
        ];
        let d = TelemetryDefaults::default();
        let c = WorkloadMode::Client;
        let sleep = Applicable::find(&all, "demo", &labels("sleep"));
        assert!(access_logging(&sleep, &d, false, c).is_empty());
        let httpbin = Applicable::find(&all, "demo", &labels("httpbin"));
        assert_eq!(names(&access_logging(&httpbin, &d, false, c)), ["b"]);
        let elsewhere = Applicable::find(&all, "other", &labels("sleep"));
        assert_eq!(names(&access_logging(&elsewhere, &d, false, c)), ["a"]);
        assert!(Applicable::find(&[], "demo", &labels("x")).is_empty());
    }

    #[test]
    fn legacy_file_and_defaults_are_the_starting_providers() {
        let d = TelemetryDefaults {
            access_logging: vec!["json".into()],
            ..Default::default()
        };
        let none = Applicable::default();
        let c = WorkloadMode::Client;
        assert_eq!(names(&access_logging(&none, &d, true, c)), ["json"]);
        let plain = TelemetryDefaults::default();
        assert_eq!(
            names(&access_logging(&none, &plain, true, c)),
            [BUILTIN_ENVOY_PROVIDER]
        );
        assert!(access_logging(&none, &plain, false, c).is_empty());
        // A mode-matched disable turns off one side only, and a filter
        // applies to the inherited providers.
        let all = vec![tel(
            "demo",
            "ns",
            "accessLogging:\n- {match: {mode: SERVER}, disabled: true}\n- {filter: {expression: 'response.code >= 400'}}",
        )];
        let a = Applicable::find(&all, "demo", &labels("x"));
        assert!(access_logging(&a, &plain, true, WorkloadMode::Server).is_empty());
        let client = access_logging(&a, &plain, true, c);
        assert_eq!(client[0].filter.as_deref(), Some("response.code >= 400"));
    }

    #[test]
    fn tracing_merges_field_by_field() {
        let all = vec![
            tel(
                "istio-system",
                "mesh",
                "tracing: [{providers: [{name: zipkin}], randomSamplingPercentage: 10, customTags: {a: {literal: {value: x}}}}]",
            ),
            tel(
                "demo",
                "w",
                "selector: {matchLabels: {app: sleep}}\ntracing: [{randomSamplingPercentage: 100, customTags: {b: {header: {name: x-b}}}}]",
            ),
        ];
        let d = TelemetryDefaults::default();
        let t = tracing(
            &Applicable::find(&all, "demo", &labels("sleep")),
            &d,
            WorkloadMode::Client,
        )
        .unwrap();
        assert_eq!(t.provider, "zipkin");
        assert_eq!(t.random_sampling_percentage, Some(100.0));
        assert_eq!(t.custom_tags.len(), 2);
        assert!(tracing(&Applicable::default(), &d, WorkloadMode::Client).is_none());
        let with_default = TelemetryDefaults {
            tracing: vec!["otel".into()],
            ..Default::default()
        };
        let t = tracing(&Applicable::default(), &with_default, WorkloadMode::Server).unwrap();
        assert_eq!(t.provider, "otel");
    }

    #[test]
    fn metrics_are_on_by_default_and_off_per_mode() {
        let d = TelemetryDefaults::default();
        let on = MetricsReporting {
            client: true,
            server: true,
        };
        assert_eq!(metrics_reporting(&Applicable::default(), &d, &[]), on);
        let all = vec![tel(
            "demo",
            "m",
            "metrics: [{providers: [{name: prometheus}], overrides: [{match: {metric: ALL_METRICS, mode: CLIENT}, disabled: true}]}]",
        )];
        let a = Applicable::find(&all, "demo", &labels("x"));
        assert_eq!(
            metrics_reporting(&a, &d, &[]),
            MetricsReporting {
                client: false,
                server: true
            }
        );
        let other = vec![tel(
            "demo",
            "m",
            "metrics: [{providers: [{name: stackdriver}]}]",
        )];
        let a = Applicable::find(&other, "demo", &labels("x"));
        assert!(!metrics_reporting(&a, &d, &[]).server);
        assert_eq!(metrics_reporting(&a, &d, &["stackdriver".to_string()]), on);
    }
}
