//! The xDS node metadata pilot-agent writes into Envoy's bootstrap and istiod
//! reads from each connecting node: Istio's `pkg/model/proxy.go`
//! `NodeMetadata` and `BootstrapNodeMetadata`, one typed definition with
//! Istio's JSON keys, so neither side reads or writes it by string key.
//!
//! Istio's encodings are kept: booleans are the strings `"true"`/`"false"`
//! (`StringBool`), `INSTANCE_IPS` and `REQUESTED_NETWORK_VIEW` are one
//! comma-separated string (`StringList`), ports are JSON numbers and
//! `STS_PORT` a string. Reading is lenient where Istio's types are (a
//! boolean or a port may come as a JSON boolean/number or as a string).
//!
//! Keys without a typed field (the `ISTIO_META_*` variables the agent passes
//! through, the `ISTIO_METAJSON_*` objects merged into the root) are kept in
//! [`NodeMetadata::extra`], as are values of typed keys that do not fit their
//! type: nothing the agent was given is lost, and a node is never rejected
//! for one odd value (Istio's Go unmarshalling would fail the whole node).

use std::collections::BTreeMap;

use proto::pb::google::protobuf::{ListValue, Struct, Value as PbValue, value::Kind};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use crate::model::InterceptionMode;

/// The node metadata (`node.metadata` of the xDS node).
///
/// Every typed field is optional: `None` means the key is absent, so a value
/// read from the agent's environment (say `ISTIO_META_NAMESPACE=""`) writes
/// back exactly as it came. Serialising always yields a JSON object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeMetadata {
    /// Keys with no typed field, and typed keys whose value does not fit the
    /// type, as given. Declared first on purpose: serialising writes these
    /// before the typed fields, so where both hold a key the typed value wins
    /// in the resulting JSON object (Istio's `marshalMetadata`: typed fields,
    /// then raw keys the typed ones left out).
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,

    /// `ISTIO_VERSION`: the agent's Istio version.
    #[serde(
        rename = "ISTIO_VERSION",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub istio_version: Option<String>,
    /// `ISTIO_PROXY_SHA`: the Envoy build.
    #[serde(
        rename = "ISTIO_PROXY_SHA",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub istio_proxy_sha: Option<String>,
    /// `LABELS`: the workload's labels (a superset of `STATIC_LABELS`).
    #[serde(
        rename = "LABELS",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub labels: Option<BTreeMap<String, String>>,
    /// `STATIC_LABELS`: the labels from `ISTIO_METAJSON_LABELS`.
    #[serde(
        rename = "STATIC_LABELS",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub static_labels: Option<BTreeMap<String, String>>,
    /// `ANNOTATIONS`: the workload's annotations.
    #[serde(
        rename = "ANNOTATIONS",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub annotations: Option<BTreeMap<String, String>>,
    /// `INSTANCE_IPS`: the workload's IPs, written as one comma-separated string.
    #[serde(
        rename = "INSTANCE_IPS",
        with = "string_list",
        skip_serializing_if = "Option::is_none"
    )]
    pub instance_ips: Option<Vec<String>>,
    /// `NAME`: the instance (Pod) name.
    #[serde(
        rename = "NAME",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<String>,
    /// `NAMESPACE`: the workload's namespace, istiod's config namespace for it.
    #[serde(
        rename = "NAMESPACE",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub namespace: Option<String>,
    /// `NODE_NAME`: the Kubernetes node.
    #[serde(
        rename = "NODE_NAME",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub node_name: Option<String>,
    /// `WORKLOAD_NAME`: the workload (Deployment, ...) name.
    #[serde(
        rename = "WORKLOAD_NAME",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub workload_name: Option<String>,
    /// `OWNER`: the owning controller, as an opaque string.
    #[serde(
        rename = "OWNER",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub owner: Option<String>,
    /// `SERVICE_ACCOUNT`: the workload's service account.
    #[serde(
        rename = "SERVICE_ACCOUNT",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub service_account: Option<String>,
    /// `INTERCEPTION_MODE`: how traffic is captured (istiod assumes `REDIRECT`
    /// when absent).
    #[serde(
        rename = "INTERCEPTION_MODE",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub interception_mode: Option<InterceptionMode>,
    /// `CLUSTER_ID`: the cluster the workload runs in (`Kubernetes` by default).
    #[serde(
        rename = "CLUSTER_ID",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub cluster_id: Option<String>,
    /// `MESH_ID`.
    #[serde(
        rename = "MESH_ID",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub mesh_id: Option<String>,
    /// `NETWORK`: the workload's network.
    #[serde(
        rename = "NETWORK",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub network: Option<String>,
    /// `AUTO_REGISTER_GROUP`: the WorkloadGroup (in the proxy's namespace)
    /// a VM's proxy registers a WorkloadEntry with (Istio's auto-registration).
    #[serde(
        rename = "AUTO_REGISTER_GROUP",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub auto_register_group: Option<String>,
    /// `REQUESTED_NETWORK_VIEW`: the networks the proxy wants endpoints of,
    /// written as one comma-separated string.
    #[serde(
        rename = "REQUESTED_NETWORK_VIEW",
        with = "string_list",
        skip_serializing_if = "Option::is_none"
    )]
    pub requested_network_view: Option<Vec<String>>,
    /// `PLATFORM_METADATA`: what the cloud platform reports.
    #[serde(
        rename = "PLATFORM_METADATA",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub platform_metadata: Option<BTreeMap<String, String>>,
    /// `APP_CONTAINERS`: the Pod's application containers, comma-separated.
    #[serde(
        rename = "APP_CONTAINERS",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub app_containers: Option<String>,
    /// `POD_PORTS`: the Pod's container ports, a JSON list written as a
    /// string (Istio's `PodPortList`). Kept as the text the injector wrote,
    /// so the bootstrap carries it unchanged; see [`NodeMetadata::pod_ports`].
    #[serde(
        rename = "POD_PORTS",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub pod_ports: Option<String>,
    /// `PROXY_CONFIG`: the effective ProxyConfig as its protojson object.
    #[serde(
        rename = "PROXY_CONFIG",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub proxy_config: Option<Map<String, Value>>,
    /// `GENERATOR`: a non-Envoy client's generator (`grpc` for proxyless gRPC).
    #[serde(
        rename = "GENERATOR",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub generator: Option<String>,
    /// `DNS_CAPTURE`: the agent's DNS proxy answers the workload's queries.
    #[serde(
        rename = "DNS_CAPTURE",
        with = "string_bool",
        skip_serializing_if = "Option::is_none"
    )]
    pub dns_capture: Option<bool>,
    /// `DNS_AUTO_ALLOCATE`: istiod allocates addresses for ServiceEntries.
    #[serde(
        rename = "DNS_AUTO_ALLOCATE",
        with = "string_bool",
        skip_serializing_if = "Option::is_none"
    )]
    pub dns_auto_allocate: Option<bool>,
    /// `ENABLE_HBONE`: the sidecar takes part in ambient (HBONE).
    #[serde(
        rename = "ENABLE_HBONE",
        with = "string_bool",
        skip_serializing_if = "Option::is_none"
    )]
    pub enable_hbone: Option<bool>,
    /// `METADATA_DISCOVERY`: peer metadata comes from discovery.
    #[serde(
        rename = "METADATA_DISCOVERY",
        with = "string_bool",
        skip_serializing_if = "Option::is_none"
    )]
    pub metadata_discovery: Option<bool>,
    /// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`: drain until no connection is left.
    #[serde(
        rename = "EXIT_ON_ZERO_ACTIVE_CONNECTIONS",
        with = "string_bool",
        skip_serializing_if = "Option::is_none"
    )]
    pub exit_on_zero_active_connections: Option<bool>,
    /// `ENVOY_SKIP_DEPRECATED_LOGS`: Envoy hides deprecation warnings.
    #[serde(
        rename = "ENVOY_SKIP_DEPRECATED_LOGS",
        with = "string_bool",
        skip_serializing_if = "Option::is_none"
    )]
    pub envoy_skip_deprecated_logs: Option<bool>,
    /// `STS_PORT`: the security token service port, as a string.
    #[serde(
        rename = "STS_PORT",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub sts_port: Option<String>,
    /// `ENVOY_STATUS_PORT`: Envoy's health listener.
    #[serde(
        rename = "ENVOY_STATUS_PORT",
        with = "port",
        skip_serializing_if = "Option::is_none"
    )]
    pub envoy_status_port: Option<u16>,
    /// `ENVOY_PROMETHEUS_PORT`: Envoy's Prometheus listener.
    #[serde(
        rename = "ENVOY_PROMETHEUS_PORT",
        with = "port",
        skip_serializing_if = "Option::is_none"
    )]
    pub envoy_prometheus_port: Option<u16>,
    /// `ENVOY_SECURE_METRICS_PORT`: the mTLS listener for Envoy's stats.
    #[serde(
        rename = "ENVOY_SECURE_METRICS_PORT",
        with = "port",
        skip_serializing_if = "Option::is_none"
    )]
    pub envoy_secure_metrics_port: Option<u16>,
    /// `ENVOY_SECURE_MERGED_METRICS_PORT`: the mTLS listener for the merged stats.
    #[serde(
        rename = "ENVOY_SECURE_MERGED_METRICS_PORT",
        with = "port",
        skip_serializing_if = "Option::is_none"
    )]
    pub envoy_secure_merged_metrics_port: Option<u16>,
    /// `WORKLOAD_IDENTITY_SOCKET_FILE`: a non-default SDS socket name.
    #[serde(
        rename = "WORKLOAD_IDENTITY_SOCKET_FILE",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub workload_identity_socket_file: Option<String>,
    /// `PILOT_SAN`: the identities the agent accepts for istiod.
    #[serde(
        rename = "PILOT_SAN",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub pilot_san: Option<Vec<String>>,
    /// `OUTLIER_LOG_PATH`: Envoy's outlier detection event log.
    #[serde(
        rename = "OUTLIER_LOG_PATH",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub outlier_log_path: Option<String>,
    /// `TLS_CLIENT_CERT_CHAIN`: client certificate file for upstream TLS.
    #[serde(
        rename = "TLS_CLIENT_CERT_CHAIN",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tls_client_cert_chain: Option<String>,
    /// `TLS_CLIENT_KEY`: client key file for upstream TLS.
    #[serde(
        rename = "TLS_CLIENT_KEY",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tls_client_key: Option<String>,
    /// `TLS_CLIENT_ROOT_CERT`: CA bundle file for upstream TLS.
    #[serde(
        rename = "TLS_CLIENT_ROOT_CERT",
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tls_client_root_cert: Option<String>,
}

/// One container port of `POD_PORTS` (Istio's `PodPort`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodPort {
    /// The port's name; empty when unnamed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The container port.
    #[serde(rename = "containerPort")]
    pub container_port: u16,
    /// `TCP`, `UDP` or `SCTP`.
    #[serde(default)]
    pub protocol: String,
}

impl NodeMetadata {
    /// Reads a metadata object, never failing: a value that does not fit its
    /// typed field stays in [`NodeMetadata::extra`] under its key.
    pub fn from_json_object(object: Map<String, Value>) -> Self {
        // The common case: every value fits, one pass.
        if let Ok(meta) = serde_json::from_value(Value::Object(object.clone())) {
            return meta;
        }
        let fits = |key: &str, value: &Value| {
            let one = Map::from_iter([(key.to_string(), value.clone())]);
            serde_json::from_value::<Self>(Value::Object(one)).is_ok()
        };
        let (fitting, misfits): (Map<String, Value>, Map<String, Value>) =
            object.into_iter().partition(|(k, v)| fits(k, v));
        // Each fitting entry parsed on its own, so together they parse too.
        let mut meta: Self = serde_json::from_value(Value::Object(fitting)).unwrap_or_default();
        meta.extra.extend(misfits);
        meta
    }

    /// Reads the `node.metadata` Struct of an xDS node (see
    /// [`NodeMetadata::from_json_object`]).
    pub fn from_struct(metadata: &Struct) -> Self {
        Self::from_json_object(struct_to_json(metadata))
    }

    /// The metadata as the JSON object Envoy's bootstrap carries, keys sorted.
    pub fn to_json_object(&self) -> Map<String, Value> {
        let object = match serde_json::to_value(self) {
            Ok(Value::Object(object)) => object,
            // Every field serialises to JSON and the struct to an object.
            _ => Map::new(),
        };
        // Collected through a BTreeMap so keys are sorted whatever Map's backing.
        object
            .into_iter()
            .collect::<BTreeMap<_, _>>()
            .into_iter()
            .collect()
    }

    /// The metadata as a protobuf Struct, as an xDS client sends it.
    pub fn to_struct(&self) -> Struct {
        json_to_struct(self.to_json_object())
    }

    /// The parsed `POD_PORTS`; `None` when absent or not Istio's JSON list.
    pub fn pod_ports(&self) -> Option<Vec<PodPort>> {
        serde_json::from_str(self.pod_ports.as_deref()?).ok()
    }
}

/// A protobuf `Struct` as a JSON object.
pub fn struct_to_json(s: &Struct) -> Map<String, Value> {
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), pb_to_json(v)))
        .collect()
}

fn pb_to_json(v: &PbValue) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        // Struct numbers are doubles; whole ones come back as integers, as
        // the agent wrote them (ports).
        Some(Kind::NumberValue(n)) => {
            if n.fract() == 0.0 && n.abs() < 9_007_199_254_740_992.0 {
                Value::Number(Number::from(*n as i64))
            } else {
                Number::from_f64(*n).map_or(Value::Null, Value::Number)
            }
        }
        Some(Kind::StructValue(s)) => Value::Object(struct_to_json(s)),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(pb_to_json).collect()),
    }
}

/// A JSON object as a protobuf `Struct`.
pub fn json_to_struct(object: Map<String, Value>) -> Struct {
    Struct {
        fields: object
            .into_iter()
            .map(|(k, v)| (k, json_to_pb(v)))
            .collect(),
    }
}

fn json_to_pb(v: Value) -> PbValue {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => Kind::StringValue(s),
        Value::Array(a) => Kind::ListValue(ListValue {
            values: a.into_iter().map(json_to_pb).collect(),
        }),
        Value::Object(o) => Kind::StructValue(json_to_struct(o)),
    };
    PbValue { kind: Some(kind) }
}

/// A present value; unlike serde's own `Option`, a JSON `null` does not fit
/// (it stays raw in `extra`, so it writes back as it came).
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// Istio's `StringBool`: written `"true"`/`"false"`; read from those strings
/// or a JSON boolean.
mod string_bool {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_json::Value;

    pub(super) fn serialize<S: Serializer>(v: &Option<bool>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(b) => s.serialize_str(if *b { "true" } else { "false" }),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
        match Value::deserialize(d)? {
            Value::Bool(b) => Ok(Some(b)),
            Value::String(s) if s == "true" => Ok(Some(true)),
            Value::String(s) if s == "false" => Ok(Some(false)),
            other => Err(D::Error::custom(format!(
                "{other} is not \"true\" or \"false\""
            ))),
        }
    }
}

/// Istio's `StringList`: written as one comma-separated string.
mod string_list {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_json::Value;

    pub(super) fn serialize<S: Serializer>(
        v: &Option<Vec<String>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match v {
            Some(list) => s.serialize_str(&list.join(",")),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Vec<String>>, D::Error> {
        match Value::deserialize(d)? {
            // Split only, as Go's `strings.Split`: the list writes back as it came.
            Value::String(s) if s.is_empty() => Ok(Some(Vec::new())),
            Value::String(s) => Ok(Some(s.split(',').map(String::from).collect())),
            other => Err(D::Error::custom(format!(
                "{other} is not a comma-separated string"
            ))),
        }
    }
}

/// A port: written as a JSON number; read from a number or a numeric string.
mod port {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_json::Value;

    pub(super) fn serialize<S: Serializer>(v: &Option<u16>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(p) => s.serialize_u16(*p),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
        let value = Value::deserialize(d)?;
        let port = match &value {
            Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
            Value::String(s) => s.parse().ok(),
            _ => None,
        };
        port.map(Some)
            .ok_or_else(|| D::Error::custom(format!("{value} is not a port")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn istio_encodings_round_trip() {
        let wire = object(json!({
            "ANNOTATIONS": {"a": "b"},
            "DNS_CAPTURE": "true",
            "ENVOY_PROMETHEUS_PORT": 15090,
            "ENVOY_STATUS_PORT": 15021,
            "EXIT_ON_ZERO_ACTIVE_CONNECTIONS": "true",
            "INSTANCE_IPS": "10.0.0.1,fd00::1",
            "INTERCEPTION_MODE": "TPROXY",
            "ISTIO_VERSION": "1.28",
            "LABELS": {"app": "x"},
            "METADATA_DISCOVERY": "false",
            "NAMESPACE": "ns",
            "PILOT_SAN": ["istiod.istio-system.svc"],
            "POD_PORTS": "[\n{\"name\":\"http\",\"containerPort\":8080,\"protocol\":\"TCP\"}\n]",
            "PROXY_CONFIG": {"proxyAdminPort": 15000},
            "STS_PORT": "15463",
            "app": "x",
            "CERT_SIGNER": "signer"
        }));
        let meta = NodeMetadata::from_json_object(wire.clone());
        assert_eq!(meta.dns_capture, Some(true));
        assert_eq!(meta.metadata_discovery, Some(false));
        assert_eq!(meta.envoy_status_port, Some(15021));
        assert_eq!(
            meta.instance_ips.as_deref(),
            Some(&["10.0.0.1".to_string(), "fd00::1".to_string()][..])
        );
        assert_eq!(meta.interception_mode, Some(InterceptionMode::Tproxy));
        assert_eq!(meta.sts_port.as_deref(), Some("15463"));
        assert_eq!(
            meta.pod_ports(),
            Some(vec![PodPort {
                name: "http".into(),
                container_port: 8080,
                protocol: "TCP".into()
            }])
        );
        // Keys without a typed field are kept.
        assert_eq!(meta.extra.len(), 2);
        assert_eq!(meta.extra["CERT_SIGNER"], "signer");
        assert_eq!(meta.to_json_object(), wire);
    }

    #[test]
    fn lenient_where_istio_is() {
        let meta = NodeMetadata::from_json_object(object(json!({
            "DNS_CAPTURE": true,
            "DNS_AUTO_ALLOCATE": "false",
            "ENVOY_STATUS_PORT": "15021",
            "INSTANCE_IPS": "",
        })));
        assert_eq!(meta.dns_capture, Some(true));
        assert_eq!(meta.dns_auto_allocate, Some(false));
        assert_eq!(meta.envoy_status_port, Some(15021));
        assert_eq!(meta.instance_ips, Some(vec![]));
        assert!(meta.extra.is_empty());
    }

    #[test]
    fn misfits_stay_raw_and_typed_values_win() {
        let wire = object(json!({
            "DNS_CAPTURE": "yes",
            "INTERCEPTION_MODE": "SOMETHING",
            "LABELS": "not a map",
            "ENVOY_STATUS_PORT": 99999,
            "NAMESPACE": null,
            "NAME": "pod",
        }));
        let mut meta = NodeMetadata::from_json_object(wire.clone());
        assert_eq!(meta.name.as_deref(), Some("pod"));
        assert_eq!(meta.dns_capture, None);
        assert_eq!(meta.interception_mode, None);
        assert_eq!(meta.labels, None);
        assert_eq!(meta.extra.len(), 5);
        // Written back unchanged.
        assert_eq!(meta.to_json_object(), wire);
        // A typed value set later wins over the raw one.
        meta.labels = Some(BTreeMap::from([("app".into(), "x".into())]));
        let out = meta.to_json_object();
        assert_eq!(out["LABELS"], json!({"app": "x"}));
        assert_eq!(out["DNS_CAPTURE"], "yes");
    }

    #[test]
    fn protobuf_struct_round_trip() {
        let meta = NodeMetadata {
            namespace: Some("ns".into()),
            envoy_status_port: Some(15021),
            dns_capture: Some(true),
            labels: Some(BTreeMap::from([("app".into(), "x".into())])),
            pilot_san: Some(vec!["a".into()]),
            extra: BTreeMap::from([("ratio".into(), json!(0.5)), ("none".into(), Value::Null)]),
            ..Default::default()
        };
        let s = meta.to_struct();
        assert_eq!(
            s.fields["ENVOY_STATUS_PORT"].kind,
            Some(Kind::NumberValue(15021.0))
        );
        assert_eq!(NodeMetadata::from_struct(&s), meta);
    }
}
