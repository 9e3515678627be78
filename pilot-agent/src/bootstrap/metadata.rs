//! The node metadata (Istio's `pkg/bootstrap/config.go GetNodeMetaData`),
//! built as the typed [`NodeMetadata`] shared with istiod, and what the
//! bootstrap's `node` derives from it: the service cluster and the locality.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use common::NodeMetadata;
use serde_json::{Map, Value, json};

use super::DEFAULT_WORKLOAD_IDENTITY_SOCKET_FILE;
use super::{DEFAULT_ENVOY_PROMETHEUS_PORT, DEFAULT_ENVOY_STATUS_PORT};

/// Prefix of environment variables (and `proxyMetadata` keys) copied into the
/// node metadata as strings, prefix stripped.
pub const ISTIO_META_PREFIX: &str = "ISTIO_META_";
/// Prefix of environment variables whose JSON object value is merged into the
/// root of the node metadata.
pub const ISTIO_METAJSON_PREFIX: &str = "ISTIO_METAJSON_";
/// The variable whose JSON object also becomes `LABELS` and `STATIC_LABELS`.
pub const ISTIO_METAJSON_LABELS: &str = "ISTIO_METAJSON_LABELS";
/// Legacy locality label (`region.zone.subzone`, `.` standing for `/`).
pub const LOCALITY_LABEL: &str = "istio-locality";
/// Locality label, read before the legacy one.
pub const TOPOLOGY_LOCALITY_LABEL: &str = "topology.istio.io/locality";
/// Label the pod labels file carries but Istio leaves out of `LABELS`.
pub const POD_TEMPLATE_HASH_LABEL: &str = "pod-template-hash";
/// Raw metadata key for the DNS proxy's address (Istio writes it untyped).
const DNS_PROXY_ADDR: &str = "DNS_PROXY_ADDR";
/// Raw metadata key set to `"true"` when an external credential SDS serves.
const CREDENTIAL: &str = "credential";
/// Istio's service cluster default, treated as "not set".
pub(super) const DEFAULT_SERVICE_CLUSTER: &str = "istio-proxy";

/// `node.locality`; empty parts are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Locality {
    /// Region.
    pub region: String,
    /// Zone.
    pub zone: String,
    /// Sub-zone.
    pub sub_zone: String,
}

impl Locality {
    /// Parses a locality label: `region/zone/subzone`, or with `.` instead of
    /// `/` when the value holds no `/` (Kubernetes labels cannot hold `/`).
    pub fn from_label(label: &str) -> Self {
        let label = sanitize_locality(label);
        let mut parts = label.split('/');
        let mut next = || parts.next().unwrap_or_default().to_string();
        Self {
            region: next(),
            zone: next(),
            sub_zone: next(),
        }
    }
}

fn sanitize_locality(label: &str) -> String {
    if label.contains('/') {
        label.to_string()
    } else {
        label.replace('.', "/")
    }
}

/// `ProxyConfig.tracingServiceName`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TracingServiceName {
    /// `<app label>.<namespace>` (Istio's default).
    #[default]
    AppLabelAndNamespace,
    /// The canonical service name.
    CanonicalNameOnly,
    /// `<canonical service name>.<namespace>`.
    CanonicalNameAndNamespace,
}

/// `ProxyConfig.clusterName`: the deprecated `serviceCluster` or `tracingServiceName`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterName {
    /// `serviceCluster` (`istio-proxy` by default, which means "derive it").
    ServiceCluster(String),
    /// `tracingServiceName`.
    TracingServiceName(TracingServiceName),
}

impl Default for ClusterName {
    fn default() -> Self {
        Self::ServiceCluster(DEFAULT_SERVICE_CLUSTER.to_string())
    }
}

/// Node metadata in the two forms the bootstrap handles: typed, or the JSON
/// object already in [`super::BootstrapOptions::metadata`].
pub trait AsNodeMetadata {
    /// The typed view (parsed when `self` is the JSON object).
    fn as_node_metadata(&self) -> Cow<'_, NodeMetadata>;
}

impl AsNodeMetadata for NodeMetadata {
    fn as_node_metadata(&self) -> Cow<'_, NodeMetadata> {
        Cow::Borrowed(self)
    }
}

impl AsNodeMetadata for Map<String, Value> {
    fn as_node_metadata(&self) -> Cow<'_, NodeMetadata> {
        Cow::Owned(NodeMetadata::from_json_object(self.clone()))
    }
}

/// The first of `keys` among the metadata's `LABELS`.
fn label<'a>(metadata: &'a NodeMetadata, keys: &[&str]) -> Option<&'a str> {
    let labels = metadata.labels.as_ref()?;
    keys.iter().find_map(|k| labels.get(*k).map(String::as_str))
}

/// `node.cluster` (Istio's `getServiceCluster`), from the node metadata's
/// `LABELS`, `WORKLOAD_NAME` and `NAMESPACE`: a service cluster other than
/// `istio-proxy` as is; else `<app>.<namespace>` (first of labels `app`,
/// `app.kubernetes.io/name`, `service.istio.io/canonical-name`); else
/// `<WORKLOAD_NAME>.<namespace>`; else `istio-proxy.<namespace>`; else `istio-proxy`.
pub fn service_cluster(name: &ClusterName, metadata: &impl AsNodeMetadata) -> String {
    let metadata = metadata.as_node_metadata();
    let metadata = metadata.as_ref();
    let namespace = metadata.namespace.as_deref().unwrap_or_default();
    let workload = metadata.workload_name.as_deref().unwrap_or_default();
    let or_default = |name: &str| -> String {
        if !name.is_empty() && name != DEFAULT_SERVICE_CLUSTER {
            return name.to_string();
        }
        if let Some(app) = label(
            metadata,
            &[
                "app",
                "app.kubernetes.io/name",
                "service.istio.io/canonical-name",
            ],
        ) {
            return format!("{app}.{namespace}");
        }
        if !workload.is_empty() {
            return format!("{workload}.{namespace}");
        }
        if !namespace.is_empty() {
            return format!("{DEFAULT_SERVICE_CLUSTER}.{namespace}");
        }
        DEFAULT_SERVICE_CLUSTER.to_string()
    };
    let canonical = || -> String {
        let fallback = if workload.is_empty() {
            DEFAULT_SERVICE_CLUSTER
        } else {
            workload
        };
        label(
            metadata,
            &[
                "service.istio.io/canonical-name",
                "app.kubernetes.io/name",
                "app",
            ],
        )
        .unwrap_or(fallback)
        .to_string()
    };
    match name {
        ClusterName::ServiceCluster(name) => or_default(name),
        ClusterName::TracingServiceName(TracingServiceName::AppLabelAndNamespace) => {
            or_default(DEFAULT_SERVICE_CLUSTER)
        }
        ClusterName::TracingServiceName(TracingServiceName::CanonicalNameOnly) => {
            or_default(&canonical())
        }
        ClusterName::TracingServiceName(TracingServiceName::CanonicalNameAndNamespace) => {
            let name = canonical();
            if namespace.is_empty() {
                or_default(&name)
            } else {
                format!("{name}.{namespace}")
            }
        }
    }
}

/// `node.locality` from the metadata's `LABELS` (`topology.istio.io/locality`,
/// else `istio-locality`); `None` when neither is set, so the caller can ask
/// the platform.
pub fn node_locality(metadata: &impl AsNodeMetadata) -> Option<Locality> {
    label(
        &metadata.as_node_metadata(),
        &[TOPOLOGY_LOCALITY_LABEL, LOCALITY_LABEL],
    )
    .filter(|l| !l.is_empty())
    .map(Locality::from_label)
}

/// What the node metadata is built from (Istio's `MetadataOptions`).
#[derive(Debug, Clone)]
pub struct MetadataInputs {
    /// The agent's environment, `(key, value)` in order; later entries win.
    pub env: Vec<(String, String)>,
    /// `ProxyConfig.proxyMetadata`; `ISTIO_META_*` keys become metadata, env wins.
    pub proxy_metadata: BTreeMap<String, String>,
    /// The effective ProxyConfig as its camelCase protojson object (`PROXY_CONFIG`).
    pub proxy_config: Map<String, Value>,
    /// `ISTIO_VERSION` unless `ISTIO_META_ISTIO_VERSION` sets it.
    pub istio_version: String,
    /// The instance IPs, first is the node id's; duplicates are dropped.
    pub instance_ips: Vec<String>,
    /// `--stsPort`; `STS_PORT` only when not 0.
    pub sts_port: u16,
    /// `ENVOY_STATUS_PORT`.
    pub envoy_status_port: u16,
    /// `ENVOY_PROMETHEUS_PORT`.
    pub envoy_prometheus_port: u16,
    /// `ENVOY_SECURE_METRICS_PORT`; left out when 0.
    pub envoy_secure_metrics_port: u16,
    /// `ENVOY_SECURE_MERGED_METRICS_PORT`; left out when 0.
    pub envoy_secure_merged_metrics_port: u16,
    /// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`; `"true"` or left out.
    pub exit_on_zero_active_connections: bool,
    /// `METADATA_DISCOVERY` (`PEER_METADATA_DISCOVERY`, else `ENABLE_HBONE`).
    pub metadata_discovery: bool,
    /// `ENVOY_SKIP_DEPRECATED_LOGS`; `"true"` or left out.
    pub envoy_skip_deprecated_logs: bool,
    /// `WORKLOAD_IDENTITY_SOCKET_FILE`; only a non-default name is recorded.
    pub workload_identity_socket_file: String,
    /// Labels from `./etc/istio/pod/labels`; `None` when the file is absent.
    pub pod_labels: Option<BTreeMap<String, String>>,
    /// Annotations from `./etc/istio/pod/annotations` (`ANNOTATIONS`).
    pub annotations: BTreeMap<String, String>,
    /// `PILOT_SAN`: istiod's expected identities.
    pub pilot_san: Vec<String>,
    /// `--outlierLogPath` (`OUTLIER_LOG_PATH`).
    pub outlier_log_path: String,
    /// An external credential SDS socket is serving: raw `credential: "true"`.
    pub credential_socket_exists: bool,
}

impl Default for MetadataInputs {
    fn default() -> Self {
        Self {
            env: Vec::new(),
            proxy_metadata: BTreeMap::new(),
            proxy_config: Map::new(),
            istio_version: crate::VERSION.to_string(),
            instance_ips: Vec::new(),
            sts_port: 0,
            envoy_status_port: DEFAULT_ENVOY_STATUS_PORT,
            envoy_prometheus_port: DEFAULT_ENVOY_PROMETHEUS_PORT,
            envoy_secure_metrics_port: 0,
            envoy_secure_merged_metrics_port: 0,
            exit_on_zero_active_connections: false,
            metadata_discovery: false,
            envoy_skip_deprecated_logs: false,
            workload_identity_socket_file: DEFAULT_WORKLOAD_IDENTITY_SOCKET_FILE.to_string(),
            pod_labels: None,
            annotations: BTreeMap::new(),
            pilot_san: Vec::new(),
            outlier_log_path: String::new(),
            credential_socket_exists: false,
        }
    }
}

fn string_map(value: &str, source: &str) -> BTreeMap<String, String> {
    match serde_json::from_str::<Map<String, Value>>(value) {
        // Go's unmarshal into map[string]string keeps the string entries.
        Ok(m) => m
            .into_iter()
            .filter_map(|(k, v)| Some((k, v.as_str()?.to_string())))
            .collect(),
        Err(e) => {
            tracing::warn!(%source, %value, error = %e, "not a JSON object of strings; ignored");
            BTreeMap::new()
        }
    }
}

/// The raw entries, before any typed field: `proxyMetadata` `ISTIO_META_*`,
/// then env `ISTIO_META_*` (prefix stripped, strings), then every
/// `ISTIO_METAJSON_*` object merged into the root (Istio's quirk:
/// `ISTIO_METAJSON_LABELS={"app":"x"}` also yields a top-level `app`), then
/// `DNS_PROXY_ADDR`; later entries win.
fn raw_metadata(inputs: &MetadataInputs) -> Map<String, Value> {
    let mut raw = Map::new();
    for (key, value) in &inputs.proxy_metadata {
        if let Some(key) = key.strip_prefix(ISTIO_META_PREFIX) {
            raw.insert(key.to_string(), Value::String(value.clone()));
        }
    }
    for (key, value) in &inputs.env {
        if let Some(key) = key.strip_prefix(ISTIO_META_PREFIX) {
            raw.insert(key.to_string(), Value::String(value.clone()));
        }
    }
    for (key, value) in &inputs.env {
        if key.starts_with(ISTIO_METAJSON_PREFIX) {
            match serde_json::from_str::<Map<String, Value>>(value) {
                Ok(object) => raw.extend(object),
                Err(e) => tracing::warn!(%key, %value, error = %e, "not a JSON object; ignored"),
            }
        }
    }
    if let Some(addr) = inputs.env_value(DNS_PROXY_ADDR) {
        raw.insert(DNS_PROXY_ADDR.into(), json!(addr));
    }
    raw
}

impl MetadataInputs {
    /// The last non-empty value of an environment variable.
    fn env_value(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }
}

/// Sets `LABELS` and `STATIC_LABELS`: the last non-empty
/// `ISTIO_METAJSON_LABELS`, the labels file over it (without
/// `pod-template-hash`), and the sanitized locality label.
fn set_labels(meta: &mut NodeMetadata, inputs: &MetadataInputs) {
    let mut static_labels = BTreeMap::new();
    for (key, value) in &inputs.env {
        if key == ISTIO_METAJSON_LABELS {
            let m = string_map(value, key);
            if !m.is_empty() {
                static_labels = m;
            }
        }
    }
    // Istio assigns one Go map to both fields, so the locality fix-up below
    // reaches STATIC_LABELS too unless the labels file replaced LABELS.
    let mut labels = static_labels.clone();
    let shared = inputs.pod_labels.is_none();
    if let Some(pod_labels) = &inputs.pod_labels {
        labels.extend(
            pod_labels
                .iter()
                .filter(|(k, _)| k.as_str() != POD_TEMPLATE_HASH_LABEL)
                .map(|(k, v)| (k.clone(), v.clone())),
        );
    }
    let locality = labels
        .get(TOPOLOGY_LOCALITY_LABEL)
        .or_else(|| labels.get(LOCALITY_LABEL))
        .filter(|l| !l.is_empty())
        .map(|l| sanitize_locality(l));
    if let Some(locality) = locality {
        labels.insert(LOCALITY_LABEL.to_string(), locality.clone());
        if shared {
            static_labels.insert(LOCALITY_LABEL.to_string(), locality);
        }
    }
    if !labels.is_empty() {
        meta.labels = Some(labels);
    }
    if !static_labels.is_empty() {
        meta.static_labels = Some(static_labels);
    }
}

/// The node metadata, typed (Istio's `GetNodeMetaData`).
///
/// The raw entries (`ISTIO_META_*`, `ISTIO_METAJSON_*`, `DNS_PROXY_ADDR`)
/// are read into [`NodeMetadata`] first, so a raw value of a typed key lands
/// in its field; Istio's typed fields are then set over them. A typed field Istio leaves out (empty)
/// keeps the raw value; a raw value that does not fit its field stays raw
/// unless the field is set.
pub fn build_node_metadata(inputs: &MetadataInputs) -> NodeMetadata {
    let mut meta = NodeMetadata::from_json_object(raw_metadata(inputs));

    // ISTIO_VERSION is the one a raw value (ISTIO_META_ISTIO_VERSION) beats.
    if !inputs.istio_version.is_empty() && meta.istio_version.as_deref().is_none_or(str::is_empty) {
        meta.istio_version = Some(inputs.istio_version.clone());
    }
    let mut seen = BTreeSet::new();
    let ips: Vec<String> = inputs
        .instance_ips
        .iter()
        .filter(|ip| seen.insert(ip.as_str()))
        .cloned()
        .collect();
    if !ips.is_empty() {
        meta.instance_ips = Some(ips);
    }
    if inputs.sts_port != 0 {
        meta.sts_port = Some(inputs.sts_port.to_string());
    }
    for (field, port) in [
        (&mut meta.envoy_status_port, inputs.envoy_status_port),
        (
            &mut meta.envoy_prometheus_port,
            inputs.envoy_prometheus_port,
        ),
        (
            &mut meta.envoy_secure_metrics_port,
            inputs.envoy_secure_metrics_port,
        ),
        (
            &mut meta.envoy_secure_merged_metrics_port,
            inputs.envoy_secure_merged_metrics_port,
        ),
    ] {
        if port != 0 {
            *field = Some(port);
        }
    }
    if inputs.exit_on_zero_active_connections {
        meta.exit_on_zero_active_connections = Some(true);
    }
    meta.metadata_discovery = Some(inputs.metadata_discovery);
    if inputs.envoy_skip_deprecated_logs {
        meta.envoy_skip_deprecated_logs = Some(true);
    }
    let socket = &inputs.workload_identity_socket_file;
    if !socket.is_empty() && socket != DEFAULT_WORKLOAD_IDENTITY_SOCKET_FILE {
        meta.workload_identity_socket_file = Some(socket.clone());
    }
    meta.proxy_config = Some(inputs.proxy_config.clone());
    for (field, var) in [
        (&mut meta.name, "POD_NAME"),
        (&mut meta.namespace, "POD_NAMESPACE"),
        (&mut meta.service_account, "SERVICE_ACCOUNT"),
    ] {
        if let Some(value) = inputs.env_value(var) {
            *field = Some(value.to_string());
        }
    }
    set_labels(&mut meta, inputs);
    if !inputs.annotations.is_empty() {
        meta.annotations = Some(inputs.annotations.clone());
    }
    if !inputs.pilot_san.is_empty() {
        meta.pilot_san = Some(inputs.pilot_san.clone());
    }
    if !inputs.outlier_log_path.is_empty() {
        meta.outlier_log_path = Some(inputs.outlier_log_path.clone());
    }
    if inputs.credential_socket_exists {
        meta.extra.insert(CREDENTIAL.into(), json!("true"));
    }
    meta
}

/// The node metadata as the JSON object the bootstrap carries (Istio's
/// `GetNodeMetaData` then `marshalMetadata`); keys come out sorted.
pub fn node_metadata(inputs: &MetadataInputs) -> Map<String, Value> {
    build_node_metadata(inputs).to_json_object()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn meta_prefix_stripped_and_env_wins() {
        let inputs = MetadataInputs {
            env: env(&[
                ("ISTIO_META_A", "env"),
                ("NOT_META", "x"),
                ("ISTIO_METAJSON_X", r#"{"j": {"n": 1}, "A": "json"}"#),
                ("ISTIO_METAJSON_BAD", "not json"),
            ]),
            proxy_metadata: [
                ("ISTIO_META_A", "pc"),
                ("ISTIO_META_B", "pc"),
                ("OTHER", "o"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            istio_version: "1.0".into(),
            ..Default::default()
        };
        let m = node_metadata(&inputs);
        // METAJSON is applied after META and merges into the root.
        assert_eq!(m["A"], "json");
        assert_eq!(m["B"], "pc");
        assert_eq!(m["j"], json!({"n": 1}));
        assert!(!m.contains_key("NOT_META") && !m.contains_key("OTHER"));
        assert_eq!(m["ISTIO_VERSION"], "1.0");
        assert_eq!(m["METADATA_DISCOVERY"], "false");
        assert!(!m.contains_key("WORKLOAD_IDENTITY_SOCKET_FILE"));
        let keys: Vec<_> = m.keys().cloned().collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn typed_fields() {
        let inputs = MetadataInputs {
            env: env(&[
                ("ISTIO_META_ISTIO_VERSION", "override"),
                ("POD_NAME", "p"),
                ("POD_NAMESPACE", "ns"),
                ("SERVICE_ACCOUNT", "sa"),
                (
                    "ISTIO_METAJSON_LABELS",
                    r#"{"topology.istio.io/locality":"r.z"}"#,
                ),
            ]),
            instance_ips: vec!["1.1.1.1".into(), "2.2.2.2".into(), "1.1.1.1".into()],
            sts_port: 15463,
            envoy_secure_metrics_port: 15091,
            exit_on_zero_active_connections: true,
            workload_identity_socket_file: "other".into(),
            pod_labels: Some(
                [("pod-template-hash", "h"), ("version", "v1")]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        };
        let m = node_metadata(&inputs);
        assert_eq!(m["ISTIO_VERSION"], "override");
        assert_eq!(m["INSTANCE_IPS"], "1.1.1.1,2.2.2.2");
        assert_eq!(m["STS_PORT"], "15463");
        assert_eq!(m["ENVOY_SECURE_METRICS_PORT"], 15091);
        assert!(!m.contains_key("ENVOY_SECURE_MERGED_METRICS_PORT"));
        assert_eq!(m["EXIT_ON_ZERO_ACTIVE_CONNECTIONS"], "true");
        assert_eq!(m["WORKLOAD_IDENTITY_SOCKET_FILE"], "other");
        assert_eq!(
            (&m["NAME"], &m["NAMESPACE"], &m["SERVICE_ACCOUNT"]),
            (&json!("p"), &json!("ns"), &json!("sa"))
        );
        // The labels file replaces LABELS, so only it gets the sanitized locality.
        assert_eq!(
            m["LABELS"],
            json!({"topology.istio.io/locality": "r.z", "istio-locality": "r/z", "version": "v1"})
        );
        assert_eq!(
            m["STATIC_LABELS"],
            json!({"topology.istio.io/locality": "r.z"})
        );
        assert_eq!(
            node_locality(&m),
            Some(Locality {
                region: "r".into(),
                zone: "z".into(),
                sub_zone: String::new()
            })
        );
    }

    #[test]
    fn raw_values_that_fit_no_type_pass_through() {
        let inputs = MetadataInputs {
            env: env(&[
                ("ISTIO_META_DNS_CAPTURE", "yes"),
                ("ISTIO_META_INTERCEPTION_MODE", "TPROXY"),
                ("ISTIO_META_LABELS", "not an object"),
                ("ISTIO_META_CERT_SIGNER", "signer"),
                ("ISTIO_METAJSON_X", r#"{"ENVOY_STATUS_PORT": "x"}"#),
            ]),
            pod_labels: Some(BTreeMap::from([("app".into(), "a".into())])),
            ..Default::default()
        };
        let typed = build_node_metadata(&inputs);
        assert_eq!(
            typed.interception_mode,
            Some(common::InterceptionMode::Tproxy)
        );
        assert_eq!(typed.dns_capture, None);
        let m = node_metadata(&inputs);
        assert_eq!(m["DNS_CAPTURE"], "yes");
        assert_eq!(m["INTERCEPTION_MODE"], "TPROXY");
        assert_eq!(m["CERT_SIGNER"], "signer");
        // Typed values the agent sets win over raw ones that do not fit.
        assert_eq!(m["LABELS"], json!({"app": "a"}));
        assert_eq!(m["ENVOY_STATUS_PORT"], DEFAULT_ENVOY_STATUS_PORT);
    }

    #[test]
    fn service_cluster_rules() {
        let meta = |pairs: Value| pairs.as_object().unwrap().clone();
        let sc = |s: &str| ClusterName::ServiceCluster(s.into());
        assert_eq!(service_cluster(&sc("mine"), &Map::new()), "mine");
        assert_eq!(
            service_cluster(&sc("istio-proxy"), &Map::new()),
            "istio-proxy"
        );
        let m = meta(json!({"NAMESPACE": "ns"}));
        assert_eq!(service_cluster(&sc(""), &m), "istio-proxy.ns");
        let m = meta(json!({"NAMESPACE": "ns", "WORKLOAD_NAME": "wl"}));
        assert_eq!(service_cluster(&sc("istio-proxy"), &m), "wl.ns");
        let m = meta(json!({"NAMESPACE": "ns", "WORKLOAD_NAME": "wl",
            "LABELS": {"app.kubernetes.io/name": "k8s", "service.istio.io/canonical-name": "canon"}}));
        assert_eq!(service_cluster(&sc("istio-proxy"), &m), "k8s.ns");
        let tracing = |t| ClusterName::TracingServiceName(t);
        assert_eq!(
            service_cluster(&tracing(TracingServiceName::CanonicalNameOnly), &m),
            "canon"
        );
        assert_eq!(
            service_cluster(&tracing(TracingServiceName::CanonicalNameAndNamespace), &m),
            "canon.ns"
        );
        assert_eq!(
            service_cluster(&tracing(TracingServiceName::AppLabelAndNamespace), &m),
            "k8s.ns"
        );
    }
}
