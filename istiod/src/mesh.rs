//! Istio's mesh config (`pkg/config/mesh`): the parts istiod applies, parsed
//! the same way from the `--meshConfig` file and from the `mesh` key of the
//! `istio` ConfigMap.
//!
//! As in Istio, the file wins when it exists (it is read once, at start);
//! without it, on Kubernetes, the ConfigMap is watched and every change is
//! applied live: the generators' settings through a full push, and
//! `discoverySelectors` through the namespaces the Kubernetes source uses.

use std::collections::BTreeMap;

use crate::model::istio::OutboundMode;
use crate::model::kube::LabelSelector;

mod fields;
mod providers;
pub use providers::{
    BodyInCheck, ExtAuthzGrpc, ExtAuthzHttp, ExtensionProvider, ExtensionProviderKind,
    FileAccessLog, LogFormat, OpenTelemetry, OtelGrpc, OtelHttp, Zipkin, extension_providers,
};

/// The parts of Istio's `MeshConfig` that the xDS generators apply;
/// `trustDomain` is [`Mesh::trust_domain`]. Read from the `--meshConfig`
/// file at start-up, or live from the `istio` ConfigMap.
#[derive(Debug, Clone, PartialEq)]
pub struct MeshConfig {
    /// `outboundTrafficPolicy.mode`: where traffic to destinations outside
    /// the registry goes (`ALLOW_ANY`, the default, or `REGISTRY_ONLY`). A
    /// Sidecar's `outboundTrafficPolicy` overrides it for its workloads.
    pub outbound_traffic_policy: OutboundMode,
    /// `extensionProviders`: what CUSTOM AuthorizationPolicies and
    /// Telemetry resources name.
    pub extension_providers: Vec<ExtensionProvider>,
    /// Access logging and tracing settings (boxed: the mesh config is
    /// passed by value).
    pub telemetry: Box<MeshTelemetry>,
    /// `defaultConfig.gatewayTopology`: a router's topology when its node
    /// sent no ProxyConfig (Istio's `ProxyConfigOrDefault`).
    pub default_gateway_topology: common::gateway_topology::GatewayTopology,
    /// `localityLbSetting`: the locality load balancing of every cluster
    /// whose DestinationRule sets none. `None` is Istio's default
    /// (`enabled: true`: failover by locality when outlier detection is on).
    pub locality_lb_setting: Option<crate::model::istio::LocalityLbSetting>,
    /// `pathNormalization.normalization`: how every HTTP connection manager
    /// normalizes request paths before routing and authorization.
    pub path_normalization: PathNormalization,
    /// `connectTimeout`: every cluster's connect timeout unless a
    /// DestinationRule (or Sidecar) sets one (Istio's default: 10s).
    pub connect_timeout: std::time::Duration,
    /// `dnsRefreshRate`: how often DNS clusters resolve again when a lookup
    /// fails (answers keep their TTL; Istio's default: 60s).
    pub dns_refresh_rate: std::time::Duration,
}

impl Default for MeshConfig {
    fn default() -> Self {
        Self {
            outbound_traffic_policy: OutboundMode::default(),
            extension_providers: Vec::new(),
            telemetry: Box::default(),
            default_gateway_topology: Default::default(),
            locality_lb_setting: None,
            path_normalization: PathNormalization::default(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            dns_refresh_rate: DEFAULT_DNS_REFRESH_RATE,
        }
    }
}

/// Istio's default `connectTimeout`.
pub const DEFAULT_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Istio's default `dnsRefreshRate`.
pub const DEFAULT_DNS_REFRESH_RATE: std::time::Duration = std::time::Duration::from_secs(60);

/// Istio's `ProxyPathNormalization.NormalizationType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PathNormalization {
    /// `NONE`: paths reach routing and authorization as sent.
    None,
    /// `BASE` (and `DEFAULT`, Istio's default): RFC 3986 normalization.
    #[default]
    Base,
    /// `MERGE_SLASHES`: `BASE`, and repeated slashes merged.
    MergeSlashes,
    /// `DECODE_AND_MERGE_SLASHES`: `MERGE_SLASHES`, and escaped slashes
    /// (`%2F`, `%5C`) decoded.
    DecodeAndMergeSlashes,
}

/// `pathNormalization` as written.
#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MeshPathNormalization {
    #[serde(default)]
    normalization: Option<String>,
}

fn path_normalization(
    p: Option<&MeshPathNormalization>,
    errors: &mut Vec<String>,
) -> PathNormalization {
    match p.and_then(|p| p.normalization.as_deref()) {
        None | Some("DEFAULT" | "BASE") => PathNormalization::Base,
        Some("NONE") => PathNormalization::None,
        Some("MERGE_SLASHES") => PathNormalization::MergeSlashes,
        Some("DECODE_AND_MERGE_SLASHES") => PathNormalization::DecodeAndMergeSlashes,
        Some(other) => {
            errors.push(format!(
                "pathNormalization.normalization {other:?} is not a normalization (use DEFAULT, NONE, BASE, MERGE_SLASHES or DECODE_AND_MERGE_SLASHES)"
            ));
            PathNormalization::Base
        }
    }
}

/// The mesh config's access logging and tracing fields.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MeshTelemetry {
    /// `accessLogFile`: every proxy logs here when no Telemetry says
    /// otherwise (empty: off).
    pub access_log_file: String,
    /// `accessLogEncoding`.
    pub access_log_encoding: AccessLogEncoding,
    /// `accessLogFormat` (Istio's default format when empty).
    pub access_log_format: String,
    /// `enableTracing` as written (Istio's default: true).
    pub enable_tracing: Option<bool>,
    /// `defaultConfig.tracing.sampling`: the sampling percentage when a
    /// Telemetry sets none (Istio's default: 1).
    pub default_sampling: Option<f64>,
    /// `defaultProviders`.
    pub default_providers: crate::model::telemetry::TelemetryDefaults,
}

/// `accessLogEncoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AccessLogEncoding {
    /// Lines of text (the default).
    #[default]
    Text,
    /// JSON objects, one a line.
    Json,
}

/// `defaultProviders` as written.
#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
struct MeshDefaultProviders {
    tracing: Vec<String>,
    metrics: Vec<String>,
    access_logging: Vec<String>,
}

/// The ConfigMap Istio keeps the mesh config in (in istiod's namespace).
pub const MESH_CONFIGMAP: &str = "istio";
/// The ConfigMap key of the mesh config.
pub const MESH_CONFIGMAP_KEY: &str = "mesh";

/// The mesh config istiod applies.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Mesh {
    /// `trustDomain`, when set.
    pub trust_domain: Option<String>,
    /// What the generators apply.
    pub config: MeshConfig,
    /// `discoverySelectors`: the namespaces whose objects istiod uses (any
    /// selector matching the Namespace's labels); empty means every namespace.
    pub discovery_selectors: Vec<LabelSelector>,
    /// What the sidecar injector reads.
    pub injection: MeshInjection,
}

/// The mesh config fields the sidecar injector reads (Istio's injection
/// template takes them from the mesh config in force).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MeshInjection {
    /// `defaultConfig`, the ProxyConfig every proxy starts from, as written.
    pub default_config: serde_json::Map<String, serde_json::Value>,
    /// `enablePrometheusMerge` (Istio's default: true).
    pub enable_prometheus_merge: Option<bool>,
    /// `proxyListenPort` (15001).
    pub proxy_listen_port: Option<u16>,
    /// `proxyInboundListenPort` (15006).
    pub proxy_inbound_listen_port: Option<u16>,
    /// `inboundTrafficPolicy.mode` is `LOCALHOST`.
    pub inbound_traffic_policy_localhost: bool,
}

/// The applied fields of the mesh config (`fields.rs` lists every field).
#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MeshConfigFile {
    #[serde(default)]
    trust_domain: Option<String>,
    #[serde(default)]
    outbound_traffic_policy: Option<MeshOutboundTrafficPolicy>,
    #[serde(default)]
    discovery_selectors: Option<Vec<LabelSelector>>,
    #[serde(default)]
    default_config: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    enable_prometheus_merge: Option<bool>,
    #[serde(default)]
    proxy_listen_port: Option<u16>,
    #[serde(default)]
    proxy_inbound_listen_port: Option<u16>,
    #[serde(default)]
    inbound_traffic_policy: Option<MeshInboundTrafficPolicy>,
    #[serde(default)]
    extension_providers: Vec<serde_json::Value>,
    #[serde(default)]
    root_namespace: Option<String>,
    #[serde(default)]
    access_log_file: Option<String>,
    #[serde(default)]
    access_log_encoding: Option<String>,
    #[serde(default)]
    access_log_format: Option<String>,
    #[serde(default)]
    enable_tracing: Option<bool>,
    #[serde(default)]
    default_providers: Option<MeshDefaultProviders>,
    #[serde(default)]
    enable_envoy_access_log_service: Option<bool>,
    #[serde(default)]
    locality_lb_setting: Option<crate::model::istio::LocalityLbSetting>,
    #[serde(default)]
    path_normalization: Option<MeshPathNormalization>,
    #[serde(default)]
    connect_timeout: Option<String>,
    #[serde(default)]
    dns_refresh_rate: Option<String>,
}

/// A positive duration field of the mesh config, Go's or protobuf's
/// spelling (`10s`, `1m`, `0.5s`); `default` when left out.
fn positive_duration(
    field: &str,
    value: Option<&str>,
    default: std::time::Duration,
    errors: &mut Vec<String>,
) -> std::time::Duration {
    match value.map(common::duration::parse) {
        None => default,
        Some(Ok(d)) if !d.is_zero() => d,
        Some(Ok(_)) => {
            errors.push(format!("{field} must be longer than 0s"));
            default
        }
        Some(Err(e)) => {
            errors.push(format!("{field}: {e}"));
            default
        }
    }
}

/// The telemetry fields of the mesh config, every problem added to `errors`.
fn telemetry(file: &MeshConfigFile, errors: &mut Vec<String>) -> MeshTelemetry {
    let access_log_encoding = match file.access_log_encoding.as_deref() {
        None | Some("TEXT") => AccessLogEncoding::Text,
        Some("JSON") => AccessLogEncoding::Json,
        Some(other) => {
            errors.push(format!(
                "accessLogEncoding {other:?} is not an encoding (use TEXT or JSON)"
            ));
            AccessLogEncoding::Text
        }
    };
    if file.enable_envoy_access_log_service == Some(true) {
        errors.push(
            "enableEnvoyAccessLogService is not supported (it needs defaultConfig.envoyAccessLogService; use accessLogFile or an envoyFileAccessLog provider)".into(),
        );
    }
    if access_log_encoding == AccessLogEncoding::Json
        && let Some(format) = file.access_log_format.as_deref().filter(|f| !f.is_empty())
        && serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(format).is_err()
    {
        errors.push(
            "accessLogFormat is not a JSON object, as accessLogEncoding JSON needs (give {\"key\": \"%FORMAT%\", ...})".into(),
        );
    }
    let default_sampling = file
        .default_config
        .as_ref()
        .and_then(|c| c.get("tracing"))
        .and_then(|t| t.get("sampling"));
    let default_sampling = match default_sampling {
        None => None,
        Some(v) => match v.as_f64() {
            Some(p) if (0.0..=100.0).contains(&p) => Some(p),
            _ => {
                errors.push(format!(
                    "defaultConfig.tracing.sampling {v} is not a percentage (use 0.0 to 100.0)"
                ));
                None
            }
        },
    };
    let providers = file.default_providers.as_ref();
    MeshTelemetry {
        access_log_file: file.access_log_file.clone().unwrap_or_default(),
        access_log_encoding,
        access_log_format: file.access_log_format.clone().unwrap_or_default(),
        enable_tracing: file.enable_tracing,
        default_sampling,
        default_providers: crate::model::telemetry::TelemetryDefaults {
            access_logging: providers
                .map(|p| p.access_logging.clone())
                .unwrap_or_default(),
            tracing: providers.map(|p| p.tracing.clone()).unwrap_or_default(),
            metrics: providers.map(|p| p.metrics.clone()).unwrap_or_default(),
        },
    }
}

/// Istio's `MeshConfig.InboundTrafficPolicy`: only `mode` exists there.
#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MeshInboundTrafficPolicy {
    #[serde(default)]
    mode: Option<String>,
}

/// Istio's `MeshConfig.OutboundTrafficPolicy`: only `mode` exists there.
#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MeshOutboundTrafficPolicy {
    #[serde(default)]
    mode: Option<String>,
}

/// Why `outboundTrafficPolicy.mode` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum OutboundModeError {
    /// Istio's mode this istiod does not build.
    #[error(
        "outboundTrafficPolicy.mode ALLOW_ANY_DYNAMIC_DNS is not supported (it needs Istio's dynamic forward proxy set-up; use ALLOW_ANY or REGISTRY_ONLY)"
    )]
    DynamicDns,
    /// Not one of Istio's modes.
    #[error("outboundTrafficPolicy.mode {0:?} is not a mode (use ALLOW_ANY or REGISTRY_ONLY)")]
    Unknown(String),
}

/// `outboundTrafficPolicy.mode` of the mesh config, Istio's spellings; a
/// missing mode keeps Istio's default, `ALLOW_ANY`.
fn outbound_mode(mode: Option<&str>) -> Result<OutboundMode, OutboundModeError> {
    match mode {
        None | Some("ALLOW_ANY") => Ok(OutboundMode::AllowAny),
        Some("REGISTRY_ONLY") => Ok(OutboundMode::RegistryOnly),
        Some("ALLOW_ANY_DYNAMIC_DNS") => Err(OutboundModeError::DynamicDns),
        Some(other) => Err(OutboundModeError::Unknown(other.to_string())),
    }
}

/// Every problem of a mesh config document, one message each, naming its
/// field (what a start-up or a ConfigMap reload reports, one line each).
#[derive(Debug, Clone, Default, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.join("; "))]
pub struct MeshConfigErrors(pub Vec<String>);

impl std::ops::Deref for MeshConfigErrors {
    type Target = [String];
    fn deref(&self) -> &[String] {
        &self.0
    }
}

impl IntoIterator for MeshConfigErrors {
    type Item = String;
    type IntoIter = std::vec::IntoIter<String>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl Mesh {
    /// Parses mesh config YAML; an empty document is Istio's defaults.
    /// Returns every problem found.
    pub fn parse(text: &str) -> Result<Mesh, MeshConfigErrors> {
        let all =
            serde_yaml_ng::from_str::<Option<serde_json::Map<String, serde_json::Value>>>(text)
                .map_err(|e| MeshConfigErrors(vec![e.to_string()]))?
                .unwrap_or_default();
        let mut errors = Vec::new();
        fields::check(&all, &mut errors);
        let applied = all
            .into_iter()
            .filter(|(k, _)| fields::applied(k))
            .collect::<serde_json::Map<_, _>>();
        let file = serde_json::from_value::<MeshConfigFile>(applied.into())
            .map_err(|e| MeshConfigErrors(vec![e.to_string()]))?;
        let mode = file
            .outbound_traffic_policy
            .as_ref()
            .and_then(|p| p.mode.as_deref());
        let outbound_traffic_policy = outbound_mode(mode).unwrap_or_else(|e| {
            errors.push(e.to_string());
            OutboundMode::AllowAny
        });
        let telemetry = telemetry(&file, &mut errors);
        let discovery_selectors = file.discovery_selectors.unwrap_or_default();
        for (i, s) in discovery_selectors.iter().enumerate() {
            if let Err(e) = s.validate(&format!("discoverySelectors[{i}]")) {
                errors.push(e.to_string());
            }
        }
        let extension_providers = extension_providers(&file.extension_providers, &mut errors);
        let defaults = &telemetry.default_providers;
        for (field, names) in [
            ("accessLogging", &defaults.access_logging),
            ("tracing", &defaults.tracing),
            ("metrics", &defaults.metrics),
        ] {
            for name in names {
                let builtin = matches!(
                    name.as_str(),
                    crate::model::telemetry::BUILTIN_ENVOY_PROVIDER
                        | crate::model::telemetry::BUILTIN_PROMETHEUS_PROVIDER
                );
                if !builtin && !extension_providers.iter().any(|p| &p.name == name) {
                    errors.push(format!(
                        "defaultProviders.{field}: {name:?} is not an extensionProviders[].name"
                    ));
                }
            }
        }
        if let Some(l) = &file.locality_lb_setting {
            errors.extend(
                crate::model::validate::locality_lb_setting("localityLbSetting", l)
                    .iter()
                    .map(|e| e.to_string()),
            );
        }
        // The root namespace decides which policies (Sidecar, PeerAuthentication,
        // AuthorizationPolicy, RequestAuthentication) apply mesh-wide: one that
        // is not applied must not be accepted.
        if let Some(root) = file.root_namespace.as_deref()
            && !root.is_empty()
            && root != crate::model::ROOT_NAMESPACE
        {
            errors.push(format!(
                "rootNamespace {root:?} is not supported: this istiod's root namespace is {:?} (remove rootNamespace or set it to that)",
                crate::model::ROOT_NAMESPACE
            ));
        }
        if let Some(pc) = &file.default_config {
            errors.extend(
                common::proxy_config_fields::unapplied(pc)
                    .iter()
                    .map(|u| format!("defaultConfig.{u}")),
            );
        }
        let path_normalization = path_normalization(file.path_normalization.as_ref(), &mut errors);
        let connect_timeout = positive_duration(
            "connectTimeout",
            file.connect_timeout.as_deref(),
            DEFAULT_CONNECT_TIMEOUT,
            &mut errors,
        );
        let dns_refresh_rate = positive_duration(
            "dnsRefreshRate",
            file.dns_refresh_rate.as_deref(),
            DEFAULT_DNS_REFRESH_RATE,
            &mut errors,
        );
        let default_gateway_topology = file
            .default_config
            .as_ref()
            .and_then(|c| c.get("gatewayTopology"))
            .map(|t| serde_json::from_value(t.clone()))
            .transpose()
            .unwrap_or_else(|e| {
                errors.push(format!("defaultConfig.gatewayTopology: {e}"));
                None
            })
            .unwrap_or_default();
        if !errors.is_empty() {
            return Err(MeshConfigErrors(errors));
        }
        Ok(Mesh {
            trust_domain: file.trust_domain.filter(|t| !t.is_empty()),
            config: MeshConfig {
                outbound_traffic_policy,
                extension_providers,
                telemetry: Box::new(telemetry),
                default_gateway_topology,
                locality_lb_setting: file.locality_lb_setting,
                path_normalization,
                connect_timeout,
                dns_refresh_rate,
            },
            discovery_selectors,
            injection: MeshInjection {
                default_config: file.default_config.unwrap_or_default(),
                enable_prometheus_merge: file.enable_prometheus_merge,
                proxy_listen_port: file.proxy_listen_port,
                proxy_inbound_listen_port: file.proxy_inbound_listen_port,
                inbound_traffic_policy_localhost: file
                    .inbound_traffic_policy
                    .and_then(|p| p.mode)
                    .is_some_and(|m| m == "LOCALHOST"),
            },
        })
    }

    /// Whether a namespace with these labels is one istiod uses.
    pub fn selects_namespace(&self, labels: &BTreeMap<String, String>) -> bool {
        self.discovery_selectors.is_empty()
            || self.discovery_selectors.iter().any(|s| s.matches(labels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_istiod_applies() {
        let m = Mesh::parse(
            "trustDomain: example.org\noutboundTrafficPolicy: {mode: REGISTRY_ONLY}\ndiscoverySelectors:\n- matchLabels: {mesh: \"on\"}\n",
        )
        .unwrap();
        assert_eq!(m.trust_domain.as_deref(), Some("example.org"));
        assert_eq!(m.config.outbound_traffic_policy, OutboundMode::RegistryOnly);
        let on: BTreeMap<String, String> = [("mesh".to_string(), "on".to_string())].into();
        assert!(m.selects_namespace(&on));
        assert!(!m.selects_namespace(&BTreeMap::new()));
        assert!(Mesh::parse("").unwrap().selects_namespace(&BTreeMap::new()));
    }

    #[test]
    fn reports_every_problem() {
        let errors = Mesh::parse(
            "outboundTrafficPolicy: {mode: DENY}\ndiscoverySelectors: [{matchExpressions: [{key: a, operator: Exists, values: [x]}]}]\n",
        )
        .unwrap_err();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("\"DENY\" is not a mode"));
        assert!(errors[1].contains("discoverySelectors[0].matchExpressions[0]"));
        assert!(Mesh::parse("discoverySelectors: [{matchLabel: {}}]").is_err());
    }

    #[test]
    fn a_root_namespace_other_than_istiods_is_refused() {
        assert!(Mesh::parse("rootNamespace: istio-system\n").is_ok());
        let errors = Mesh::parse("rootNamespace: mesh-root\n").unwrap_err();
        assert!(
            errors[0].contains("rootNamespace \"mesh-root\" is not supported"),
            "{errors:?}"
        );
    }

    #[test]
    fn default_gateway_topology_is_read_and_checked() {
        let m = Mesh::parse("defaultConfig: {gatewayTopology: {numTrustedProxies: 2}}\n").unwrap();
        assert_eq!(m.config.default_gateway_topology.num_trusted_proxies, 2);
        let errors =
            Mesh::parse("defaultConfig: {gatewayTopology: {numTrustedProxy: 2}}\n").unwrap_err();
        assert!(
            errors
                .iter()
                .any(|e| e.contains("defaultConfig.gatewayTopology")
                    && e.contains("numTrustedProxy")),
            "{errors:?}"
        );
    }

    #[test]
    fn connect_timeout_and_dns_refresh_rate_are_read_and_checked() {
        let m = Mesh::parse("connectTimeout: 2.5s\ndnsRefreshRate: 1m\n").unwrap();
        assert_eq!(
            m.config.connect_timeout,
            std::time::Duration::from_millis(2500)
        );
        assert_eq!(
            m.config.dns_refresh_rate,
            std::time::Duration::from_secs(60)
        );
        assert_eq!(
            Mesh::parse("").unwrap().config.connect_timeout,
            DEFAULT_CONNECT_TIMEOUT
        );
        let errors = Mesh::parse("connectTimeout: 0s\ndnsRefreshRate: soon\n").unwrap_err();
        assert!(
            errors[0].contains("connectTimeout must be longer than 0s"),
            "{errors:?}"
        );
        assert!(errors[1].starts_with("dnsRefreshRate:"), "{errors:?}");
    }

    #[test]
    fn path_normalization_is_read_with_istios_names() {
        assert_eq!(
            Mesh::parse("").unwrap().config.path_normalization,
            PathNormalization::Base
        );
        for (name, want) in [
            ("DEFAULT", PathNormalization::Base),
            ("NONE", PathNormalization::None),
            ("MERGE_SLASHES", PathNormalization::MergeSlashes),
            (
                "DECODE_AND_MERGE_SLASHES",
                PathNormalization::DecodeAndMergeSlashes,
            ),
        ] {
            let m = Mesh::parse(&format!("pathNormalization: {{normalization: {name}}}\n"));
            assert_eq!(m.unwrap().config.path_normalization, want, "{name}");
        }
        let errors = Mesh::parse("pathNormalization: {normalization: SLASHES}\n").unwrap_err();
        assert!(
            errors[0].contains("\"SLASHES\" is not a normalization"),
            "{errors:?}"
        );
    }

    #[test]
    fn locality_lb_setting_is_read_and_validated() {
        let mesh = Mesh::parse("localityLbSetting: {enabled: false}\n").unwrap();
        assert_eq!(
            mesh.config.locality_lb_setting.and_then(|l| l.enabled),
            Some(false)
        );
        assert_eq!(Mesh::parse("").unwrap().config.locality_lb_setting, None);
        let errors = Mesh::parse(
            "localityLbSetting: {distribute: [{from: r1, to: {r1: 100}}], failover: [{from: r1, to: r2}]}\n",
        )
        .unwrap_err();
        assert!(
            errors[0].starts_with("localityLbSetting:")
                && errors[0].contains("'distribute' and 'failover'"),
            "{errors:?}"
        );
    }

    #[test]
    fn telemetry_fields_are_applied_or_refused() {
        let m = Mesh::parse(
            "accessLogFile: /dev/stdout\naccessLogEncoding: JSON\naccessLogFormat: '{\"m\": \"%REQ(:METHOD)%\"}'\nenableTracing: true\ndefaultConfig: {tracing: {sampling: 10}}\ndefaultProviders: {accessLogging: [envoy], metrics: [prometheus], tracing: [z]}\nextensionProviders:\n- {name: z, zipkin: {service: zipkin.istio-system.svc.cluster.local, port: 9411}}\n",
        )
        .unwrap();
        let t = &m.config.telemetry;
        assert_eq!(t.access_log_file, "/dev/stdout");
        assert_eq!(t.access_log_encoding, AccessLogEncoding::Json);
        assert_eq!(t.enable_tracing, Some(true));
        assert_eq!(t.default_sampling, Some(10.0));
        assert_eq!(t.default_providers.tracing, ["z"]);
        let errors = Mesh::parse("accessLogEncoding: XML\n").unwrap_err();
        assert!(
            errors[0].contains("accessLogEncoding \"XML\""),
            "{errors:?}"
        );
        let errors = Mesh::parse("defaultProviders: {logging: [x]}\n").unwrap_err();
        assert!(errors[0].contains("unknown field `logging`"), "{errors:?}");
        let errors = Mesh::parse(
            "accessLogEncoding: JSON\naccessLogFormat: '[%START_TIME%]'\ndefaultProviders: {tracing: [missing]}\nenableEnvoyAccessLogService: true\n",
        )
        .unwrap_err();
        let all = errors.join("\n");
        assert!(
            all.contains("accessLogFormat is not a JSON object"),
            "{all}"
        );
        assert!(
            all.contains("defaultProviders.tracing: \"missing\""),
            "{all}"
        );
        assert!(all.contains("enableEnvoyAccessLogService"), "{all}");
        let errors = Mesh::parse(
            "extensionProviders:\n- {name: z, zipkin: {service: s, port: 1, headers: {a: b}}}\n- {name: o, opentelemetry: {service: s, port: 1, resourceDetectors: {}}}\n- {name: f, envoyFileAccessLog: {path: ''}}\n- {name: p, prometheus: {x: 1}}\n",
        )
        .unwrap_err();
        let all = errors.join("\n");
        for needle in [
            "zipkin: unknown field `headers`",
            "opentelemetry: unknown field `resourceDetectors`",
            "envoyFileAccessLog.path is required",
            "prometheus: unknown field `x`",
        ] {
            assert!(all.contains(needle), "{needle}: {all}");
        }
    }
}
