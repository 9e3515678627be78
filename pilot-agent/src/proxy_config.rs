//! Istio's `ProxyConfig` (`istio.mesh.v1alpha1.ProxyConfig`): the fields the
//! agent uses are typed, the rest are accepted as JSON so that any valid Istio
//! ProxyConfig parses. Layers merge in Istio's order (`config.go
//! ConstructProxyConfig`): built-in defaults < the mesh config file's
//! `defaultConfig` < `PROXY_CONFIG` < the Pod annotation `proxy.istio.io/config`.

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use common::{AuthenticationPolicy, InterceptionMode};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// The annotation holding a per-Pod ProxyConfig.
pub const PROXY_CONFIG_ANNOTATION: &str = "proxy.istio.io/config";
/// The downward-API file with the Pod's annotations.
pub const ANNOTATIONS_FILE: &str = "./etc/istio/pod/annotations";
/// The downward-API file with the Pod's labels.
pub const LABELS_FILE: &str = "./etc/istio/pod/labels";

/// A Go/protobuf duration as it appears in ProxyConfig (`45s`, `0.250s`, `1m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtoDuration(pub Duration);

impl Serialize for ProtoDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // protojson's spelling: seconds with an `s` suffix.
        let d = self.0;
        if d.subsec_nanos() == 0 {
            s.serialize_str(&format!("{}s", d.as_secs()))
        } else {
            let frac = format!("{:09}", d.subsec_nanos());
            s.serialize_str(&format!("{}.{}s", d.as_secs(), frac.trim_end_matches('0')))
        }
    }
}

impl<'de> Deserialize<'de> for ProtoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        common::duration::parse(&s)
            .map(ProtoDuration)
            .map_err(serde::de::Error::custom)
    }
}

/// `proxyStatsMatcher`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyStatsMatcher {
    /// Extra stat prefixes to keep.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inclusion_prefixes: Vec<String>,
    /// Extra stat suffixes to keep.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inclusion_suffixes: Vec<String>,
    /// Extra stat regexes to keep.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inclusion_regexps: Vec<String>,
}

/// A remote service address with optional TLS (`envoyMetricsService`, `envoyAccessLogService`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemoteService {
    /// `host:port`.
    #[serde(default)]
    pub address: String,
    /// TLS settings (Istio's `ClientTLSSettings`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_settings: Option<Value>,
    /// TCP keepalive settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_keepalive: Option<Value>,
}

/// Istio's ProxyConfig. Every field is optional so that layers can be merged;
/// [`ProxyConfig::defaults`] fills Istio's defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyConfig {
    /// Where the bootstrap is written (`./etc/istio/proxy`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_path: Option<String>,
    /// The Envoy binary (`/usr/local/bin/envoy`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binary_path: Option<String>,
    /// Service cluster name (`istio-proxy`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_cluster: Option<String>,
    /// Envoy's `--drain-time-s` (45s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_duration: Option<ProtoDuration>,
    /// Deprecated; accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_shutdown_duration: Option<ProtoDuration>,
    /// istiod's address (`istiod.istio-system.svc:15012`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discovery_address: Option<String>,
    /// Deprecated; accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discovery_refresh_delay: Option<ProtoDuration>,
    /// Deprecated zipkin address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zipkin_address: Option<String>,
    /// statsd sink address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statsd_udp_address: Option<String>,
    /// Deprecated metrics service address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envoy_metrics_service_address: Option<String>,
    /// Envoy admin port (15000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_admin_port: Option<u32>,
    /// Deprecated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<String>,
    /// `MUTUAL_TLS` (default) or `NONE`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "control_plane_auth_policy"
    )]
    pub control_plane_auth_policy: Option<AuthenticationPolicy>,
    /// A complete Envoy config file used instead of the generated bootstrap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub custom_config_file: Option<String>,
    /// Maximum stat name length (189).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stat_name_length: Option<u32>,
    /// Envoy worker threads; 0 means all cores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// Bootstrap template path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_bootstrap_template_path: Option<String>,
    /// `REDIRECT`, `TPROXY` or `NONE`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "interception_mode"
    )]
    pub interception_mode: Option<InterceptionMode>,
    /// Tracing configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracing: Option<Value>,
    /// Deprecated SDS settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sds: Option<Value>,
    /// Access log service.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envoy_access_log_service: Option<RemoteService>,
    /// Metrics service.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envoy_metrics_service: Option<RemoteService>,
    /// Extra environment-like metadata, merged key by key across layers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub proxy_metadata: BTreeMap<String, String>,
    /// Envoy runtime values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub runtime_values: BTreeMap<String, String>,
    /// The agent's status port (15020).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_port: Option<u32>,
    /// Extra stat tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_stat_tags: Vec<String>,
    /// Gateway topology (applied by istiod to a router's listeners).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway_topology: Option<common::gateway_topology::GatewayTopology>,
    /// How long the agent waits after draining before stopping Envoy (5s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination_drain_duration: Option<ProtoDuration>,
    /// Mesh ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mesh_id: Option<String>,
    /// VM readiness probe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<Value>,
    /// Stats inclusion lists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_stats_matcher: Option<ProxyStatsMatcher>,
    /// Start the app only once the proxy is ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_application_until_proxy_starts: Option<bool>,
    /// Extra trusted roots.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ca_certificates_pem: Vec<String>,
    /// Proxy image type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<Value>,
    /// Private key provider.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private_key_provider: Option<Value>,
    /// Proxy headers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_headers: Option<Value>,
    /// Envoy `--file-flush-interval-msec` (1s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_flush_interval: Option<ProtoDuration>,
    /// Envoy `--file-flush-min-size-kb`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_flush_min_size_kb: Option<u32>,
    /// Tracing service name style.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracing_service_name: Option<String>,
    /// CA certificates trust settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_certificates: Option<Value>,
}

/// An enum field in Istio's spelling; an unknown value is an error naming
/// the field (serde's own message would only list the variants).
fn named_enum<'de, D, T>(d: D, field: &str) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: std::fmt::Display,
{
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(s) => s
            .parse()
            .map(Some)
            .map_err(|e| serde::de::Error::custom(format!("{field}: {e}"))),
    }
}

fn control_plane_auth_policy<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<AuthenticationPolicy>, D::Error> {
    named_enum(d, "controlPlaneAuthPolicy")
}

fn interception_mode<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<InterceptionMode>, D::Error> {
    named_enum(d, "interceptionMode")
}

/// A bad ProxyConfig layer.
#[derive(Debug, thiserror::Error)]
#[error("{source_name}: {reason}")]
pub struct ProxyConfigError {
    source_name: String,
    reason: String,
}

fn merge(base: &mut Value, overlay: Value) {
    match (base, overlay) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

impl ProxyConfig {
    /// Istio's `DefaultProxyConfig`.
    pub fn defaults() -> Self {
        Self {
            config_path: Some("./etc/istio/proxy".into()),
            binary_path: Some("/usr/local/bin/envoy".into()),
            service_cluster: Some("istio-proxy".into()),
            drain_duration: Some(ProtoDuration(Duration::from_secs(45))),
            termination_drain_duration: Some(ProtoDuration(Duration::from_secs(5))),
            discovery_address: Some("istiod.istio-system.svc:15012".into()),
            proxy_admin_port: Some(15000),
            control_plane_auth_policy: Some(AuthenticationPolicy::MutualTls),
            stat_name_length: Some(189),
            status_port: Some(15020),
            ..Default::default()
        }
    }

    /// Parses one layer (YAML or JSON). Errors name the source and the field.
    pub fn parse_layer(source_name: &str, text: &str) -> Result<Value, ProxyConfigError> {
        let err = |reason: String| ProxyConfigError {
            source_name: source_name.to_string(),
            reason,
        };
        if text.trim().is_empty() {
            return Ok(Value::Object(Default::default()));
        }
        let value: Value = serde_yaml_ng::from_str(text)
            .map_err(|e| err(format!("not valid YAML or JSON: {e}")))?;
        if !value.is_object() {
            return Err(err("must be a mapping of ProxyConfig fields".into()));
        }
        // Type-check the layer on its own so the error points at this layer.
        serde_json::from_value::<ProxyConfig>(value.clone()).map_err(|e| {
            err(format!(
                "{e} (see Istio's ProxyConfig reference for valid fields)"
            ))
        })?;
        Ok(value)
    }

    /// Merges layers over the defaults, later layers winning; objects such as
    /// `proxyMetadata` merge key by key.
    pub fn merged(layers: &[(String, Value)]) -> Result<Self, ProxyConfigError> {
        let mut acc = serde_json::to_value(Self::defaults()).map_err(|e| ProxyConfigError {
            source_name: "defaults".into(),
            reason: e.to_string(),
        })?;
        for (_, layer) in layers {
            merge(&mut acc, layer.clone());
        }
        let names: Vec<&str> = layers.iter().map(|(n, _)| n.as_str()).collect();
        // A field set in any layer and not built is refused, naming it.
        if let Value::Object(merged) = &acc {
            let refused = common::proxy_config_fields::unapplied(merged);
            if !refused.is_empty() {
                return Err(ProxyConfigError {
                    source_name: names.join(" + "),
                    reason: refused
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; "),
                });
            }
        }
        let pc: Self = serde_json::from_value(acc).map_err(|e| ProxyConfigError {
            source_name: names.join(" + "),
            reason: e.to_string(),
        })?;
        pc.validate()?;
        Ok(pc)
    }

    /// Istio's `ValidateMeshConfigProxyConfig`, the parts that matter here.
    pub fn validate(&self) -> Result<(), ProxyConfigError> {
        let mut errs = Vec::new();
        if self.config_path.as_deref().unwrap_or("").is_empty() {
            errs.push("configPath must be set".to_string());
        }
        if self.binary_path.as_deref().unwrap_or("").is_empty() {
            errs.push("binaryPath must be set".to_string());
        }
        if self.drain_duration.is_some_and(|d| d.0.is_zero()) {
            errs.push("drainDuration must be longer than 0s".to_string());
        }
        match self.discovery_address.as_deref() {
            Some(a)
                if a.rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()) => {}
            other => errs.push(format!("discoveryAddress {other:?} must be host:port")),
        }
        for (name, port) in [
            ("proxyAdminPort", self.proxy_admin_port),
            ("statusPort", self.status_port),
        ] {
            if let Some(p) = port
                && (p == 0 || p > 65535)
            {
                errs.push(format!("{name} {p} is not a valid port"));
            }
        }
        if self.status_port.is_some() && self.status_port == self.proxy_admin_port {
            errs.push("statusPort must differ from proxyAdminPort".to_string());
        }
        // Every interception mode parses as a valid one; of the policies,
        // a proxy cannot inherit.
        if let Some(p @ AuthenticationPolicy::Inherit) = self.control_plane_auth_policy {
            errs.push(format!(
                "controlPlaneAuthPolicy {:?} must be MUTUAL_TLS or NONE",
                p.as_str()
            ));
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ProxyConfigError {
                source_name: "ProxyConfig".into(),
                reason: errs.join("; "),
            })
        }
    }

    /// The config path.
    pub fn config_path(&self) -> &str {
        self.config_path.as_deref().unwrap_or("./etc/istio/proxy")
    }

    /// The Envoy binary.
    pub fn binary_path(&self) -> &str {
        self.binary_path
            .as_deref()
            .unwrap_or("/usr/local/bin/envoy")
    }

    /// Envoy's admin port.
    pub fn admin_port(&self) -> u16 {
        self.proxy_admin_port.unwrap_or(15000) as u16
    }

    /// The agent's status port.
    pub fn status_port(&self) -> u16 {
        self.status_port.unwrap_or(15020) as u16
    }

    /// `drainDuration`.
    pub fn drain_duration(&self) -> Duration {
        self.drain_duration
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(45))
    }

    /// `terminationDrainDuration`.
    pub fn termination_drain_duration(&self) -> Duration {
        self.termination_drain_duration
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(5))
    }
}

/// The `defaultConfig` of a mesh config file.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MeshConfigFile {
    #[serde(default)]
    default_config: Option<Value>,
}

/// Reads the mesh config file's `defaultConfig` (absent file: no layer).
pub fn mesh_config_layer(path: &Path) -> Result<Option<Value>, ProxyConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(_) => return Ok(None),
    };
    mesh_config_text_layer(&format!("--meshConfig {}", path.display()), &text)
}

/// [`mesh_config_layer`] of the file's text, `name` saying where it is from.
pub fn mesh_config_text_layer(name: &str, text: &str) -> Result<Option<Value>, ProxyConfigError> {
    let name = name.to_string();
    let mesh: MeshConfigFile = serde_yaml_ng::from_str(text).map_err(|e| ProxyConfigError {
        source_name: name.clone(),
        reason: format!("not valid YAML: {e}"),
    })?;
    match mesh.default_config {
        None => Ok(None),
        Some(v) => {
            let text = serde_json::to_string(&v).unwrap_or_default();
            ProxyConfig::parse_layer(&format!("{name} defaultConfig"), &text).map(Some)
        }
    }
}

/// Parses a downward-API file: `key="strconv-quoted value"` per line.
pub fn parse_downward_api(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim();
        let value = unquote(v).unwrap_or_else(|| v.to_string());
        out.insert(k.trim().to_string(), value);
    }
    out
}

/// Go's `strconv.Unquote` for double-quoted strings.
fn unquote(s: &str) -> Option<String> {
    let inner = s.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next()? {
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'r' => out.push('\r'),
            '\\' => out.push('\\'),
            '"' => out.push('"'),
            '\'' => out.push('\''),
            'u' => {
                let hex: String = chars.by_ref().take(4).collect();
                out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
            }
            other => {
                out.push('\\');
                out.push(other);
            }
        }
    }
    Some(out)
}

/// Builds the effective ProxyConfig from its sources, in Istio's order.
pub fn construct(
    mesh_config: &Path,
    proxy_config_env: Option<&str>,
    annotations: &BTreeMap<String, String>,
) -> Result<ProxyConfig, ProxyConfigError> {
    let mut layers = Vec::new();
    if let Some(layer) = mesh_config_layer(mesh_config)? {
        layers.push(("mesh config defaultConfig".to_string(), layer));
    }
    if let Some(text) = proxy_config_env {
        layers.push((
            "PROXY_CONFIG".to_string(),
            ProxyConfig::parse_layer("PROXY_CONFIG", text)?,
        ));
    }
    if let Some(text) = annotations.get(PROXY_CONFIG_ANNOTATION) {
        let name = format!("annotation {PROXY_CONFIG_ANNOTATION}");
        layers.push((name.clone(), ProxyConfig::parse_layer(&name, text)?));
    }
    let mut pc = ProxyConfig::merged(&layers)?;
    // Istio: these annotations override the merged config.
    if let Some(addr) = annotations.get("sidecar.istio.io/discoveryAddress") {
        pc.discovery_address = Some(addr.clone());
    }
    if let Some(port) = annotations.get("status.sidecar.istio.io/port") {
        pc.status_port = Some(port.parse().map_err(|_| ProxyConfigError {
            source_name: "annotation status.sidecar.istio.io/port".into(),
            reason: format!("{port:?} is not a port number"),
        })?);
    }
    Ok(pc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_istios() {
        let pc = construct(Path::new("/nonexistent"), None, &BTreeMap::new()).unwrap();
        assert_eq!(
            pc.discovery_address.as_deref(),
            Some("istiod.istio-system.svc:15012")
        );
        assert_eq!(pc.drain_duration(), Duration::from_secs(45));
        assert_eq!(pc.termination_drain_duration(), Duration::from_secs(5));
        assert_eq!(pc.admin_port(), 15000);
        assert_eq!(pc.status_port(), 15020);
        assert_eq!(pc.binary_path(), "/usr/local/bin/envoy");
    }

    #[test]
    fn layers_merge_in_istio_order() {
        let dir = tempfile::tempdir().unwrap();
        let mesh = dir.path().join("mesh");
        std::fs::write(
            &mesh,
            "defaultConfig:\n  concurrency: 2\n  proxyMetadata:\n    A: mesh\n    B: mesh\n",
        )
        .unwrap();
        let env = r#"{"concurrency": 3, "proxyMetadata": {"B": "env"}}"#;
        let mut ann = BTreeMap::new();
        ann.insert(
            PROXY_CONFIG_ANNOTATION.to_string(),
            "proxyMetadata:\n  C: pod\ndrainDuration: 10s\n".to_string(),
        );
        let pc = construct(&mesh, Some(env), &ann).unwrap();
        assert_eq!(pc.concurrency, Some(3));
        assert_eq!(pc.drain_duration(), Duration::from_secs(10));
        let md: Vec<(&str, &str)> = pc
            .proxy_metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(md, [("A", "mesh"), ("B", "env"), ("C", "pod")]);
    }

    #[test]
    fn bad_layers_name_the_field() {
        let none = BTreeMap::new();
        let no = Path::new("/nonexistent");
        let e = construct(no, Some("{not: [valid"), &none)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("PROXY_CONFIG: not valid YAML"), "{e}");
        let e = construct(no, Some("drainDurationX: 5s"), &none)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `drainDurationX`"), "{e}");
        let e = construct(no, Some("drainDuration: soon"), &none)
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid duration \"soon\""), "{e}");
        let e = construct(no, Some("statusPort: 15000"), &none)
            .unwrap_err()
            .to_string();
        assert!(e.contains("statusPort must differ"), "{e}");
        // Istio fields the agent does not build stop it, naming the field.
        let e = construct(
            no,
            Some("proxyBootstrapTemplatePath: /t.json\ntracing: {datadog: {address: 'd:8126'}}"),
            &none,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("PROXY_CONFIG: proxyBootstrapTemplatePath is not supported")
                && e.contains("tracing.datadog is not supported"),
            "{e}"
        );
    }

    #[test]
    fn enums_take_istios_spellings_and_name_the_field() {
        let none = BTreeMap::new();
        let no = Path::new("/nonexistent");
        let pc = construct(
            no,
            Some("controlPlaneAuthPolicy: NONE\ninterceptionMode: TPROXY\n"),
            &none,
        )
        .unwrap();
        assert_eq!(
            pc.control_plane_auth_policy,
            Some(AuthenticationPolicy::None)
        );
        assert_eq!(pc.interception_mode, Some(InterceptionMode::Tproxy));
        let v = serde_json::to_value(&pc).unwrap();
        assert_eq!(v["controlPlaneAuthPolicy"], "NONE");
        assert_eq!(v["interceptionMode"], "TPROXY");
        let e = construct(no, Some("interceptionMode: redirect"), &none)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "PROXY_CONFIG: interceptionMode: \"redirect\" is not a valid interception mode"
            ),
            "{e}"
        );
        let e = construct(no, Some("controlPlaneAuthPolicy: TLS"), &none)
            .unwrap_err()
            .to_string();
        assert!(e.contains("controlPlaneAuthPolicy: \"TLS\""), "{e}");
        let e = construct(no, Some("controlPlaneAuthPolicy: INHERIT"), &none)
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be MUTUAL_TLS or NONE"), "{e}");
    }

    #[test]
    fn downward_api_round_trip() {
        let m = parse_downward_api(
            "app=\"x\"\nproxy.istio.io/config=\"holdApplicationUntilProxyStarts: true\\nconcurrency: 2\\n\"\nk=\"a=b\"\n",
        );
        assert_eq!(m["app"], "x");
        assert_eq!(
            m["proxy.istio.io/config"],
            "holdApplicationUntilProxyStarts: true\nconcurrency: 2\n"
        );
        assert_eq!(m["k"], "a=b");
    }

    #[test]
    fn serializes_camel_case_with_proto_durations() {
        let v = serde_json::to_value(ProxyConfig::defaults()).unwrap();
        assert_eq!(v["drainDuration"], "45s");
        assert_eq!(v["proxyAdminPort"], 15000);
        assert!(v.get("tracing").is_none());
    }
}
