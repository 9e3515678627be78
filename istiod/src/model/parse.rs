//! Turns Kubernetes-style YAML documents into typed, validated [`Object`]s,
//! as Istio's `crd.ParseInputs` does for the file source: multi-document
//! streams, unknown kinds ignored, every object validated, and any error
//! failing the document's file.
//!
//! Documents go through `serde_json::Value` so that one decoder serves YAML
//! files and JSON from an API server alike, and `serde_path_to_error` gives
//! the path of a bad field.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::error::{ConfigError, FieldError};
use super::istio::Opaque;
use super::meta::{DEFAULT_NAMESPACE, Kind, Object, ObjectKey, ObjectMeta, Spec};
use super::validate;

/// What one document decodes to.
// Short-lived: each decoded object moves into the store right away.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    /// A valid object of a kind istiod reads.
    Object(Object),
    /// An object of a kind istiod does not read.
    Ignored {
        /// Its `apiVersion`.
        api_version: String,
        /// Its `kind`.
        kind: String,
    },
    /// An empty document (for example after a trailing `---`).
    Empty,
}

/// Why one document was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Not an object at all: no identity to report.
    Document(String),
    /// An object with invalid fields.
    Object {
        /// The object.
        key: ObjectKey,
        /// Every problem found.
        errors: Vec<FieldError>,
    },
}

/// The objects of one file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedFile {
    /// Valid objects, in document order.
    pub objects: Vec<Object>,
    /// Each document of a kind istiod does not read.
    pub ignored: Vec<IgnoredKind>,
}

/// A document of a kind istiod does not read: displayed `apiVersion kind`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct IgnoredKind {
    /// Its `apiVersion`.
    pub api_version: String,
    /// Its `kind`.
    pub kind: String,
}

impl IgnoredKind {
    /// Whether it is Istio configuration that this istiod does not implement
    /// (a kind of Istio's groups, of the Kubernetes Gateway API and its
    /// experimental `x-k8s.io` group, or of the inference extension, all of
    /// which Istio reads), rather than an object that is no configuration
    /// for istiod at all.
    pub fn is_unimplemented_config(&self) -> bool {
        let group = self.api_version.split_once('/').map_or("", |(g, _)| g);
        group.ends_with(".istio.io")
            || matches!(
                group,
                "gateway.networking.k8s.io"
                    | "gateway.networking.x-k8s.io"
                    | "inference.networking.k8s.io"
                    | "inference.networking.x-k8s.io"
            )
    }
}

impl std::fmt::Display for IgnoredKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.api_version, self.kind)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IstioBody<T> {
    #[serde(default)]
    spec: T,
    #[serde(default)]
    status: Option<Opaque>,
}

/// Parses a multi-document YAML (or JSON) file. `file` names it in errors.
/// Any invalid document fails the file; every error found is returned.
pub fn parse_file(file: &str, text: &str) -> Result<ParsedFile, Vec<ConfigError>> {
    let mut parsed = ParsedFile::default();
    let mut errors = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let document = i + 1;
        let value = match Value::deserialize(doc) {
            Ok(v) => v,
            Err(e) => {
                errors.push(ConfigError::Yaml {
                    file: file.to_string(),
                    document,
                    reason: e.to_string(),
                });
                // The parser cannot resynchronise after a syntax error.
                break;
            }
        };
        match decode(value) {
            Ok(Decoded::Object(o)) => parsed.objects.push(o),
            Ok(Decoded::Ignored { api_version, kind }) => {
                tracing::debug!(target: "config", "{file}: document {document}: ignoring {kind} ({api_version}): not a kind istiod reads");
                parsed.ignored.push(IgnoredKind { api_version, kind });
            }
            Ok(Decoded::Empty) => {}
            Err(DecodeError::Document(reason)) => errors.push(ConfigError::Document {
                file: file.to_string(),
                document,
                reason,
            }),
            Err(DecodeError::Object { key, errors: errs }) => {
                errors.extend(errs.into_iter().map(|e| ConfigError::Invalid {
                    file: file.to_string(),
                    object: key.clone(),
                    field: e.field,
                    message: e.message,
                }))
            }
        }
    }
    if errors.is_empty() {
        Ok(parsed)
    } else {
        Err(errors)
    }
}

/// Decodes and validates one document.
pub fn decode(value: Value) -> Result<Decoded, DecodeError> {
    let mut map = match value {
        Value::Null => return Ok(Decoded::Empty),
        Value::Object(m) => m,
        _ => {
            return Err(DecodeError::Document(
                "expected a Kubernetes-style object (a map with apiVersion, kind, metadata and spec)"
                    .into(),
            ));
        }
    };
    let kind_name = take_string(&mut map, "kind").ok_or_else(|| {
        DecodeError::Document("kind is missing (every object needs apiVersion and kind)".into())
    })?;
    let api_version = take_string(&mut map, "apiVersion").ok_or_else(|| {
        DecodeError::Document(format!(
            "{kind_name}: apiVersion is missing (every object needs apiVersion and kind)"
        ))
    })?;
    let kind = match Kind::resolve(&api_version, &kind_name) {
        Ok(Some(kind)) => kind,
        Ok(None) => {
            return Ok(Decoded::Ignored {
                api_version,
                kind: kind_name,
            });
        }
        Err(not_served) => {
            return Err(DecodeError::Object {
                key: lenient_key(not_served.kind, map.get("metadata")),
                errors: vec![FieldError::new("apiVersion", not_served.to_string())],
            });
        }
    };

    let meta_value = map.remove("metadata").unwrap_or(Value::Null);
    let mut key = lenient_key(kind, Some(&meta_value));
    let mut errors = Vec::new();
    let metadata = if meta_value.is_null() {
        Some(ObjectMeta::default())
    } else {
        typed::<ObjectMeta>(meta_value)
            .map_err(|e| errors.push(prefixed("metadata", e)))
            .ok()
    };
    let spec = decode_body(kind, map).map_err(|e| errors.push(e)).ok();
    let (Some(mut metadata), Some(spec)) = (metadata, spec) else {
        return Err(DecodeError::Object { key, errors });
    };
    if kind.is_namespaced() {
        if metadata.namespace.is_empty() {
            metadata.namespace = DEFAULT_NAMESPACE.to_string();
        }
    } else {
        metadata.namespace.clear();
    }
    key.namespace.clone_from(&metadata.namespace);
    let object = Object {
        api_version,
        metadata,
        spec,
    };
    let errors = validate::validate(&object);
    if errors.is_empty() {
        Ok(Decoded::Object(object))
    } else {
        Err(DecodeError::Object { key, errors })
    }
}

fn decode_body(kind: Kind, map: Map<String, Value>) -> Result<Spec, FieldError> {
    let body = Value::Object(map);
    Ok(match kind {
        Kind::ServiceEntry => Spec::ServiceEntry(service_entry(body)?),
        Kind::WorkloadEntry => Spec::WorkloadEntry(workload_entry(body)?),
        Kind::WorkloadGroup => Spec::WorkloadGroup(istio(body)?),
        Kind::VirtualService => Spec::VirtualService(istio(body)?),
        Kind::DestinationRule => Spec::DestinationRule(istio(body)?),
        Kind::Sidecar => Spec::Sidecar(istio(body)?),
        Kind::Gateway => Spec::Gateway(istio(body)?),
        Kind::EnvoyFilter => Spec::EnvoyFilter(istio(body)?),
        Kind::PeerAuthentication => Spec::PeerAuthentication(istio(body)?),
        Kind::AuthorizationPolicy => Spec::AuthorizationPolicy(istio(body)?),
        Kind::RequestAuthentication => Spec::RequestAuthentication(istio(body)?),
        Kind::Service => Spec::Service(typed(body)?),
        Kind::EndpointSlice => Spec::EndpointSlice(typed(body)?),
        Kind::Pod => Spec::Pod(typed(body)?),
        Kind::Namespace => Spec::Namespace(typed(body)?),
        Kind::Node => Spec::Node(typed(body)?),
        // Istio reads the Gateway API's `spec` and writes its `status`.
        Kind::GatewayClass => Spec::GatewayClass(istio(body)?),
        Kind::KubernetesGateway => Spec::KubernetesGateway(istio(body)?),
        Kind::HttpRoute => Spec::HttpRoute(istio(body)?),
        Kind::Secret => Spec::Secret(typed(body)?),
        Kind::Telemetry => Spec::Telemetry(istio(body)?),
        Kind::ProxyConfig => Spec::ProxyConfig(istio(body)?),
        Kind::Ingress => Spec::Ingress(typed(body)?),
        Kind::IngressClass => Spec::IngressClass(typed(body)?),
        Kind::ReferenceGrant => Spec::ReferenceGrant(istio(body)?),
        Kind::TcpRoute => Spec::TcpRoute(istio(body)?),
        Kind::TlsRoute => Spec::TlsRoute(istio(body)?),
        Kind::GrpcRoute => Spec::GrpcRoute(istio(body)?),
        Kind::BackendTlsPolicy => Spec::BackendTlsPolicy(istio(body)?),
        Kind::ConfigMap => Spec::ConfigMap(typed(body)?),
        Kind::ListenerSet => Spec::ListenerSet(istio(body)?),
    })
}

/// A ServiceEntry's `spec`, with the addresses its `status` holds (IP
/// auto-allocation writes them there; an unreadable status is no address).
fn service_entry(body: Value) -> Result<super::istio::ServiceEntry, FieldError> {
    let b = typed::<IstioBody<super::istio::ServiceEntry>>(body)?;
    let mut se = b.spec;
    se.status_addresses = b
        .status
        .and_then(|s| s.get("addresses").cloned())
        .and_then(|a| serde_json::from_value(a).ok())
        .unwrap_or_default();
    Ok(se)
}

/// A WorkloadEntry's `spec`, with the conditions its `status` holds (the
/// health the autoregistration controller writes; an unreadable status is
/// no condition).
fn workload_entry(body: Value) -> Result<super::istio::WorkloadEntry, FieldError> {
    let b = typed::<IstioBody<super::istio::WorkloadEntry>>(body)?;
    let mut we = b.spec;
    we.status_conditions = b
        .status
        .and_then(|s| s.get("conditions").cloned())
        .and_then(|a| serde_json::from_value(a).ok())
        .unwrap_or_default();
    Ok(we)
}

fn istio<T: DeserializeOwned + Default>(body: Value) -> Result<T, FieldError> {
    typed::<IstioBody<T>>(body).map(|b| b.spec)
}

fn typed<T: DeserializeOwned>(value: Value) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        FieldError::new(field, describe(&e.into_inner().to_string()))
    })
}

fn prefixed(prefix: &str, e: FieldError) -> FieldError {
    let field = if e.field == "." {
        prefix.to_string()
    } else {
        format!("{prefix}.{}", e.field)
    };
    FieldError::new(field, e.message)
}

/// Adds what to do to serde's message.
fn describe(message: &str) -> String {
    if message.starts_with("unknown field") {
        format!(
            "{message} (remove it or correct its spelling: Istio rejects fields it does not know)"
        )
    } else if message.starts_with("unknown variant") {
        format!("{message} (use one of the listed values)")
    } else if message.starts_with("invalid duration") {
        message.to_string()
    } else {
        format!("{message} (correct the value's type)")
    }
}

fn take_string(map: &mut Map<String, Value>, key: &str) -> Option<String> {
    match map.remove(key) {
        Some(Value::String(s)) if !s.is_empty() => Some(s),
        _ => None,
    }
}

/// The object's key as far as it can be read, for errors about objects whose
/// metadata does not decode.
fn lenient_key(kind: Kind, meta: Option<&Value>) -> ObjectKey {
    let get = |k: &str| {
        meta.and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let mut namespace = get("namespace");
    if !kind.is_namespaced() {
        namespace.clear();
    } else if namespace.is_empty() {
        namespace = DEFAULT_NAMESPACE.to_string();
    }
    ObjectKey {
        kind,
        namespace,
        name: get("name"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::istio::{MtlsMode, VirtualService};

    fn one(yaml: &str) -> Result<Object, Vec<ConfigError>> {
        let mut parsed = parse_file("test.yaml", yaml)?;
        assert_eq!(parsed.objects.len(), 1, "{parsed:?}");
        Ok(parsed.objects.remove(0))
    }

    fn errors(yaml: &str) -> Vec<String> {
        parse_file("bad.yaml", yaml)
            .expect_err("the document should be rejected")
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn parses_a_virtual_service_with_istio_field_names() {
        let o = one(r#"
apiVersion: networking.istio.io/v1beta1
kind: VirtualService
metadata: {name: reviews, namespace: bookinfo}
spec:
  hosts: [reviews]
  http:
  - name: canary
    match:
    - uri: {prefix: /api}
      headers: {end-user: {exact: jason}, x-present: {}}
      ignoreUriCase: true
    route:
    - destination: {host: reviews, subset: v2, port: {number: 9080}}
      weight: 25
    - destination: {host: reviews, subset: v1}
      weight: 75
    timeout: 1.5s
    retries: {attempts: 3, perTryTimeout: 100ms, retryOn: "5xx,connect-failure"}
    fault: {delay: {fixedDelay: 5s, percentage: {value: 10}}}
"#)
        .unwrap();
        assert_eq!(
            o.key(),
            ObjectKey::new(Kind::VirtualService, "bookinfo", "reviews")
        );
        assert_eq!(o.api_version, "networking.istio.io/v1beta1");
        let vs: &VirtualService = o.spec_as().unwrap();
        let http = &vs.http[0];
        assert_eq!(http.route[0].destination.subset, "v2");
        assert_eq!(http.route[1].weight, Some(75));
        assert_eq!(http.timeout, Some(std::time::Duration::from_millis(1500)));
        let retries = http.retries.as_ref().unwrap();
        assert_eq!(
            retries.per_try_timeout,
            Some(std::time::Duration::from_millis(100))
        );
        assert_eq!(
            http.r#match[0].uri.as_ref().unwrap().prefix.as_deref(),
            Some("/api")
        );
        assert!(http.r#match[0].headers["x-present"].matcher().is_none());
        // Durations dump in protobuf's JSON form, as Istio shows them, and
        // decode back.
        let json = serde_json::to_value(&o).unwrap();
        assert_eq!(json["spec"]["http"][0]["timeout"], "1.500s");
        assert_eq!(decode(json).unwrap(), Decoded::Object(o.clone()));
    }

    #[test]
    fn a_sidecar_policy_without_a_mode_is_registry_only_as_in_istio() {
        let o = one(r#"
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: s, namespace: demo}
spec:
  outboundTrafficPolicy: {}
"#)
        .unwrap();
        let Spec::Sidecar(sc) = &o.spec else {
            panic!("{o:?}")
        };
        assert_eq!(
            sc.outbound_traffic_policy.as_ref().unwrap().mode,
            crate::model::istio::OutboundMode::RegistryOnly
        );
    }

    #[test]
    fn defaults_the_namespace_and_reads_port_level_mtls() {
        let o = one(r#"
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: p}
spec:
  selector: {labels: {}}
"#);
        // Security policies spell it `matchLabels`: `labels` is the
        // networking kinds' field, and the path names it.
        let e = o.unwrap_err();
        assert_eq!(e[0].field(), Some("spec.selector.labels"), "{e:?}");
        assert!(e[0].to_string().contains("unknown field `labels`"));

        let o = one(r#"
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: p}
spec:
  selector: {matchLabels: {app: a}}
  mtls: {mode: STRICT}
  portLevelMtls:
    8080: {mode: DISABLE}
"#)
        .unwrap();
        assert_eq!(o.metadata.namespace, "default");
        let Spec::PeerAuthentication(pa) = &o.spec else {
            panic!("{o:?}")
        };
        assert_eq!(pa.mtls.as_ref().unwrap().mode, MtlsMode::Strict);
        assert_eq!(pa.port_level_mtls[&8080].mode, MtlsMode::Disable);
    }

    #[test]
    fn kubernetes_objects_tolerate_fields_istiod_does_not_read() {
        let o = one(r#"
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: demo, labels: {app: a}, uid: "123"}
spec:
  serviceAccountName: sa
  containers: [{name: app, image: x, ports: [{name: http, containerPort: 8080}]}]
status: {podIP: 10.244.0.9, phase: Running, conditions: []}
"#)
        .unwrap();
        let Spec::Pod(pod) = &o.spec else {
            panic!("{o:?}")
        };
        assert_eq!(pod.status.pod_ip.as_deref(), Some("10.244.0.9"));
        assert_eq!(pod.service_account(), "sa");
        assert_eq!(pod.spec.containers[0].ports[0].container_port, 8080);
    }

    #[test]
    fn ignores_unknown_kinds_and_empty_documents() {
        let parsed = parse_file(
            "f.yaml",
            r#"
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: g}
spec: {url: oci://example.com/filter:1}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
---
"#,
        )
        .unwrap();
        assert!(parsed.objects.is_empty());
        let shown: Vec<String> = parsed.ignored.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            vec![
                "extensions.istio.io/v1alpha1 WasmPlugin",
                "apps/v1 Deployment"
            ]
        );
        let unimplemented: Vec<bool> = parsed
            .ignored
            .iter()
            .map(IgnoredKind::is_unimplemented_config)
            .collect();
        assert_eq!(unimplemented, vec![true, false]);
    }

    #[test]
    fn experimental_gateway_api_and_inference_kinds_are_unimplemented_config() {
        for (api_version, want) in [
            ("gateway.networking.x-k8s.io/v1alpha1", true),
            ("inference.networking.k8s.io/v1", true),
            ("inference.networking.x-k8s.io/v1alpha2", true),
            ("networking.k8s.io/v1", false),
        ] {
            let kind = IgnoredKind {
                api_version: api_version.into(),
                kind: "K".into(),
            };
            assert_eq!(kind.is_unimplemented_config(), want, "{api_version}");
        }
    }

    #[test]
    fn objects_serialize_in_kubernetes_shape_and_decode_back() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/mesh");
        let mut count = 0;
        for file in ["namespace.yaml", "sleep.yaml", "httpbin.yaml", "istio.yaml"] {
            let text = std::fs::read_to_string(dir.join(file)).unwrap();
            for object in parse_file(file, &text).unwrap().objects {
                let json = serde_json::to_value(&object).unwrap();
                assert_eq!(json["kind"], object.kind().as_str());
                assert_eq!(json["metadata"]["name"], object.metadata.name.as_str());
                match decode(json.clone()).unwrap() {
                    Decoded::Object(back) => assert_eq!(back, object, "{json}"),
                    other => panic!("{other:?}"),
                }
                count += 1;
            }
        }
        assert_eq!(count, 11);
        let slice = parse_file(
            "s.yaml",
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s, namespace: n}\naddressType: IPv4\nendpoints: [{addresses: [10.244.0.1]}]\n",
        )
        .unwrap();
        let json = serde_json::to_value(&slice.objects[0]).unwrap();
        assert_eq!(json["endpoints"][0]["addresses"][0], "10.244.0.1");
        assert_eq!(json["addressType"], "IPv4");
    }

    #[test]
    fn names_bad_documents() {
        let e = errors("apiVersion: v1\nkind: [\n");
        assert!(
            e[0].starts_with("bad.yaml: document 1: invalid YAML"),
            "{e:?}"
        );
        let e = errors("---\napiVersion: v1\nmetadata: {name: x}\n");
        assert!(e[0].contains("document 1: kind is missing"), "{e:?}");
        let e = errors("- a\n- b\n");
        assert!(e[0].contains("expected a Kubernetes-style object"), "{e:?}");
        let e = errors(
            "apiVersion: networking.istio.io/v2\nkind: VirtualService\nmetadata: {name: r, namespace: n}\nspec: {hosts: [a]}\n",
        );
        assert!(
            e[0].starts_with("bad.yaml: VirtualService/n/r: apiVersion: apiVersion networking.istio.io/v2 is not served"),
            "{e:?}"
        );
    }

    #[test]
    fn bad_values_name_the_field() {
        let e = errors(
            r#"
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: d, namespace: n}
spec:
  host: a
  trafficPolicy:
    connectionPool: {tcp: {connectTimeout: 5 seconds}}
"#,
        );
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with(
                "bad.yaml: DestinationRule/n/d: spec.trafficPolicy.connectionPool.tcp.connectTimeout: invalid duration \"5 seconds\""
            ),
            "{e:?}"
        );
        let e = errors(
            "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: p, namespace: n}\nspec: {mtls: {mode: STRCT}}\n",
        );
        assert!(
            e[0].contains("spec.mtls.mode: unknown variant `STRCT`, expected one of `UNSET`, `DISABLE`, `PERMISSIVE`, `STRICT`"),
            "{e:?}"
        );
        let e = errors(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r, namespace: n}\nsepc: {hosts: [a]}\n",
        );
        assert!(
            e[0].contains("VirtualService/n/r: sepc: unknown field `sepc`"),
            "{e:?}"
        );
    }
}
