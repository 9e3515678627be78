//! What Istio's injection templates share: their input (`SidecarTemplateData`), what a
//! rendered template adds to the pod, the selection of templates by name, and the pieces the
//! built-in templates have in common (canonical labels, images, resources, the agent's
//! environment, `ProxyConfig` as JSON).
//!
//! The built-in templates are Rust, one module each (`sidecar`, `gateway`, `grpc`, each
//! above this one, which `render` runs); templates in Go's template language (the
//! ConfigMap's custom `templates`) are not interpreted: asking for one is an
//! [`InjectError::UnknownTemplate`].

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::{InjectError, InjectionConfig, MeshSettings, Values, ann, quantity};

/// The inputs the template reads (`SidecarTemplateData` in Istio).
pub(crate) struct TemplateInput<'a> {
    pub values: &'a Values,
    pub mesh: &'a MeshSettings,
    /// `proxy.istio.io/config` merged over mesh `defaultConfig`, non-default fields only.
    pub proxy_config: &'a Map<String, Value>,
    pub annotations: &'a BTreeMap<String, String>,
    pub labels: &'a BTreeMap<String, String>,
    /// The pod's containers before injection (istio-proxy excluded by the caller).
    pub containers: &'a [Value],
    pub service_account: &'a str,
    pub deploy_name: &'a str,
    pub deploy_namespace: &'a str,
    pub api_version: &'a str,
    pub kind: &'a str,
    pub native_sidecar: bool,
    pub revision: &'a str,
    pub compliance_policy: Option<&'a str>,
    /// `.ProxyUID`: the namespace's on OpenShift, else the user's own `istio-proxy`
    /// `runAsUser`, when set.
    pub proxy_uid: Option<i64>,
    /// `.ProxyGID`: the user's own `istio-proxy` `runAsGroup`, when it sets one.
    pub proxy_gid: Option<i64>,
    /// `proxy_uid` is the user's own `runAsUser`: Istio's goldens then keep it for
    /// iptables' `-u` even with TPROXY (where the template otherwise writes 1337).
    pub uid_from_user: bool,
}

/// The proxy's UID and GID when nothing else sets them.
const DEFAULT_PROXY_ID: i64 = 1337;

/// What the template adds to the pod, before it is merged in.
#[derive(Debug, Default)]
pub(crate) struct Rendered {
    pub labels: Vec<(String, String)>,
    pub annotations: Vec<(String, String)>,
    pub init_containers: Vec<Value>,
    pub containers: Vec<Value>,
    pub volumes: Vec<Value>,
    pub image_pull_secrets: Vec<Value>,
    /// Fields of the pod's `securityContext` (the `gateway` template's sysctls).
    pub pod_security_context: Option<Value>,
}

impl Rendered {
    /// Merges a later template's output over this one, as Istio overlays each selected
    /// template on the previous ones: items of the same name merge, new ones are appended.
    pub(crate) fn merge(&mut self, later: Rendered) {
        fn pairs(into: &mut Vec<(String, String)>, from: Vec<(String, String)>) {
            for (k, v) in from {
                match into.iter_mut().find(|(key, _)| *key == k) {
                    Some(existing) => existing.1 = v,
                    None => into.push((k, v)),
                }
            }
        }
        fn named(into: &mut Vec<Value>, from: Vec<Value>) {
            for item in from {
                match into.iter_mut().find(|i| i.get("name") == item.get("name")) {
                    Some(existing) => super::strategic_merge(existing, &item),
                    None => into.push(item),
                }
            }
        }
        pairs(&mut self.labels, later.labels);
        pairs(&mut self.annotations, later.annotations);
        named(&mut self.init_containers, later.init_containers);
        named(&mut self.containers, later.containers);
        named(&mut self.volumes, later.volumes);
        named(&mut self.image_pull_secrets, later.image_pull_secrets);
        match (&mut self.pod_security_context, later.pod_security_context) {
            (Some(existing), Some(sc)) => super::strategic_merge(existing, &sc),
            (slot, sc) => {
                if sc.is_some() {
                    *slot = sc;
                }
            }
        }
    }
}

/// The built-in templates, by Istio's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Template {
    /// `sidecar`: the Envoy sidecar and its traffic capture.
    Sidecar,
    /// `gateway`: a pod whose `istio-proxy` is a gateway (`proxy router`).
    Gateway,
    /// `grpc-simple`: proxyless gRPC with a bootstrap file written by an init container.
    GrpcSimple,
    /// `grpc-agent`: proxyless gRPC with the agent (no Envoy) serving certificates and xDS.
    GrpcAgent,
}

impl Template {
    /// All built-in templates.
    pub const ALL: [Template; 4] = [
        Template::Sidecar,
        Template::Gateway,
        Template::GrpcSimple,
        Template::GrpcAgent,
    ];

    /// The template's name in Istio's `inject.istio.io/templates` and `defaultTemplates`.
    pub fn name(self) -> &'static str {
        match self {
            Template::Sidecar => "sidecar",
            Template::Gateway => "gateway",
            Template::GrpcSimple => "grpc-simple",
            Template::GrpcAgent => "grpc-agent",
        }
    }

    /// The built-in template of this name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// Istio's `selectTemplates`: the pod's `inject.istio.io/templates` (comma-separated) or
/// the injector's default templates, each resolved to a built-in one.
pub(crate) fn select(
    annotations: &BTreeMap<String, String>,
    cfg: &InjectionConfig,
) -> Result<Vec<Template>, InjectError> {
    let names: Vec<String> = match annotations.get(ann::TEMPLATES) {
        Some(list) => list.split(',').map(|n| n.trim().to_string()).collect(),
        None => cfg.default_templates.clone(),
    };
    names
        .into_iter()
        .map(|name| {
            Template::from_name(&name).ok_or_else(|| InjectError::UnknownTemplate {
                name,
                known: Template::ALL
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
        })
        .collect()
}

/// The canonical-service labels every built-in template but `grpc-simple` writes.
pub(crate) fn canonical_labels(t: &TemplateInput<'_>) -> Vec<(String, String)> {
    let revision = [
        "service.istio.io/canonical-revision",
        "app.kubernetes.io/version",
        "version",
    ]
    .iter()
    .find_map(|k| t.labels.get(*k).filter(|v| !v.is_empty()).cloned())
    .unwrap_or_else(|| "latest".into());
    vec![
        ("service.istio.io/canonical-name".into(), canonical_name(t)),
        ("service.istio.io/canonical-revision".into(), revision),
    ]
}

/// `istio.io/rev` and, unless the pod sets them, the `kubectl` default containers (the first
/// app container).
pub(crate) fn revision_annotations(t: &TemplateInput<'_>) -> Vec<(String, String)> {
    let rev = if t.revision.is_empty() {
        "default"
    } else {
        t.revision
    };
    let mut out = vec![("istio.io/rev".to_string(), rev.to_string())];
    if let Some(first) = t.app_container_names().first() {
        for key in [
            "kubectl.kubernetes.io/default-logs-container",
            "kubectl.kubernetes.io/default-container",
        ] {
            if !t.annotations.contains_key(key) {
                out.push((key.into(), first.clone()));
            }
        }
    }
    out
}

/// The istio-discovery chart's `global.proxy.clusterDomain`-based `--domain` and log-level
/// arguments of `pilot-agent proxy <kind>`, with `--stsPort` and `--log_as_json` when set.
pub(crate) fn agent_args(t: &TemplateInput<'_>, kind: &str) -> Vec<String> {
    let v = t.values;
    let mut args = vec![
        "proxy".to_string(),
        kind.into(),
        "--domain".into(),
        format!(
            "$(POD_NAMESPACE).svc.{}",
            v.string("global.proxy.clusterDomain")
        ),
        format!(
            "--proxyLogLevel={}",
            t.annotation(ann::LOG_LEVEL, v.string("global.proxy.logLevel"))
        ),
        format!(
            "--proxyComponentLogLevel={}",
            t.annotation(
                ann::COMPONENT_LOG_LEVEL,
                v.string("global.proxy.componentLogLevel")
            )
        ),
        format!(
            "--log_output_level={}",
            t.annotation(ann::AGENT_LOG_LEVEL, v.string("global.logging.level"))
        ),
    ];
    let sts = v.string("global.sts.servicePort");
    if !sts.is_empty() && sts != "0" {
        args.push(format!("--stsPort={sts}"));
    }
    if v.bool("global.logAsJson") {
        args.push("--log_as_json".into());
    }
    args
}

/// The chart's readiness probe of `istio-proxy` on `port`: the initial delay from the
/// values (dropped when zero, as Go's `omitempty` does), the given period and threshold.
pub(crate) fn readiness_probe(
    t: &TemplateInput<'_>,
    port: i64,
    period: i64,
    threshold: i64,
) -> Value {
    let mut probe = Map::new();
    probe.insert(
        "httpGet".into(),
        json!({"path": "/healthz/ready", "port": port}),
    );
    let delay = number(&t.values.string("global.proxy.readinessInitialDelaySeconds"));
    if delay != json!(0) && delay != json!("") {
        probe.insert("initialDelaySeconds".into(), delay);
    }
    probe.insert("periodSeconds".into(), json!(period));
    probe.insert("timeoutSeconds".into(), json!(3));
    probe.insert("failureThreshold".into(), json!(threshold));
    Value::Object(probe)
}

/// The pod's `istio-podinfo` and `istio-token` volumes, as every agent-running template has them.
pub(crate) fn podinfo_and_token_volumes(v: &Values) -> [Value; 2] {
    [
        json!({"name": "istio-podinfo", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
        ]}}),
        json!({"name": "istio-token", "projected": {"sources": [{"serviceAccountToken": {
            "path": "istio-token", "expirationSeconds": 43200, "audience": v.string("global.sds.token.aud"),
        }}]}}),
    ]
}

/// The `istiod-ca-cert` volume: the root certificate from a ConfigMap, or from a
/// ClusterTrustBundle when `ENABLE_CLUSTER_TRUST_BUNDLE_API` is on; none unless istiod
/// provides the certificates.
pub(crate) fn istiod_ca_volume(v: &Values) -> Option<Value> {
    if v.string("global.pilotCertProvider") != "istiod" {
        return None;
    }
    let bundle = v.string("global.trustBundleName");
    Some(if v.bool("pilot.env.ENABLE_CLUSTER_TRUST_BUNDLE_API") {
        let name = if bundle.is_empty() {
            "root-cert".to_string()
        } else {
            bundle
        };
        json!({"name": "istiod-ca-cert", "projected": {"sources": [{"clusterTrustBundle": {
            "name": format!("istio.io:istiod-ca:{name}"), "path": "root-cert.pem"}}]}})
    } else {
        let name = if bundle.is_empty() {
            "istio-ca-root-cert".to_string()
        } else {
            bundle
        };
        json!({"name": "istiod-ca-cert", "configMap": {"name": name}})
    })
}

impl TemplateInput<'_> {
    /// `annotation .ObjectMeta key default`.
    pub(crate) fn annotation(&self, key: &str, default: String) -> String {
        self.annotations.get(key).cloned().unwrap_or(default)
    }

    pub(crate) fn interception_mode(&self) -> String {
        let default = self
            .proxy_config
            .get("interceptionMode")
            .and_then(Value::as_str)
            .unwrap_or(common::InterceptionMode::Redirect.as_str())
            .to_string();
        self.annotation(ann::INTERCEPTION_MODE, default)
    }

    pub(crate) fn status_port(&self) -> String {
        self.annotation(
            ann::STATUS_PORT,
            self.values.string("global.proxy.statusPort"),
        )
    }

    pub(crate) fn proxy_metadata(&self) -> Vec<(String, String)> {
        let mut md: Vec<(String, String)> = self
            .proxy_config
            .get("proxyMetadata")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), scalar_string(v)))
                    .collect()
            })
            .unwrap_or_default();
        md.sort();
        md
    }

    pub(crate) fn hold_application(&self) -> bool {
        let from_proxy_config = self
            .proxy_config
            .get("holdApplicationUntilProxyStarts")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        (from_proxy_config
            || self
                .values
                .bool("global.proxy.holdApplicationUntilProxyStarts"))
            && !self.native_sidecar
    }

    pub(crate) fn app_container_names(&self) -> Vec<String> {
        self.containers
            .iter()
            .filter_map(|c| c.get("name").and_then(Value::as_str))
            .filter(|n| *n != super::PROXY_CONTAINER)
            .map(str::to_string)
            .collect()
    }

    pub(crate) fn proxy_uid(&self) -> i64 {
        self.proxy_uid.unwrap_or(DEFAULT_PROXY_ID)
    }

    /// `.ProxyGID | default "1337"`.
    pub(crate) fn proxy_gid(&self) -> i64 {
        self.proxy_gid.unwrap_or(DEFAULT_PROXY_ID)
    }
}

pub(crate) fn label_or(labels: &BTreeMap<String, String>, key: &str, default: &str) -> String {
    labels
        .get(key)
        .filter(|v| !v.is_empty())
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

/// `service.istio.io/canonical-name`: the first set of the canonical-name label,
/// `app.kubernetes.io/name`, `app`, the workload name; at most 63 characters, trimmed of
/// `-_.` at both ends.
pub(crate) fn canonical_name(t: &TemplateInput<'_>) -> String {
    let name = [
        "service.istio.io/canonical-name",
        "app.kubernetes.io/name",
        "app",
    ]
    .iter()
    .find_map(|k| t.labels.get(*k).filter(|v| !v.is_empty()).cloned())
    .unwrap_or_else(|| t.deploy_name.to_string());
    let truncated: String = name.chars().take(63).collect();
    truncated
        .trim_matches(|c| c == '-' || c == '_' || c == '.')
        .to_string()
}

/// `updateImageTypeIfPresent`: the tag with the image variant (e.g. `-distroless`).
fn tag_with_variant(tag: &str, variant: &str) -> String {
    if variant.is_empty() || variant == "default" {
        return tag.to_string();
    }
    let base = tag
        .strip_suffix("-distroless")
        .or_else(|| tag.strip_suffix("-debug"))
        .unwrap_or(tag);
    format!("{base}-{variant}")
}

/// The image of `istio-proxy` (`values_key` = `global.proxy.image`) or of `istio-init`
/// (`global.proxy_init.image`), as Istio's `ProxyImage`/`ProxyInitImage` plus the template's
/// "a value with a `/` is a full image name" rule.
pub(crate) fn image(t: &TemplateInput<'_>, values_key: &str) -> String {
    let v = t.values;
    let configured = t.annotation(ann::PROXY_IMAGE, v.string(values_key));
    if configured.contains('/') {
        return configured;
    }
    let name = match v.string(values_key) {
        s if s.is_empty() => "proxyv2".to_string(),
        s => s,
    };
    let variant = t
        .annotations
        .get(ann::PROXY_IMAGE_TYPE)
        .cloned()
        .or_else(|| {
            t.proxy_config
                .get("image")
                .and_then(|i| i.get("imageType"))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| v.string("global.variant"));
    format!(
        "{}/{}:{}",
        v.string("global.hub"),
        name,
        tag_with_variant(&v.string("global.tag"), &variant)
    )
}

/// The `resources` block: from the `sidecar.istio.io/proxy{CPU,Memory}[Limit]` annotations
/// when any is set, else `global.proxy.resources`.
pub(crate) fn resources(t: &TemplateInput<'_>) -> Value {
    let a = t.annotations;
    let keys = [
        (ann::PROXY_CPU, "requests", "cpu"),
        (ann::PROXY_MEMORY, "requests", "memory"),
        (ann::PROXY_CPU_LIMIT, "limits", "cpu"),
        (ann::PROXY_MEMORY_LIMIT, "limits", "memory"),
    ];
    if keys.iter().any(|(k, _, _)| a.contains_key(*k)) {
        let mut out = Map::new();
        for (key, part, resource) in keys {
            if let Some(q) = a.get(key) {
                out.entry(part)
                    .or_insert_with(|| json!({}))
                    .as_object_mut()
                    .map(|m| m.insert(resource.into(), json!(quantity::canonical(q))));
            }
        }
        return Value::Object(out);
    }
    let mut out = Map::new();
    if let Some(Value::Object(res)) = t.values.get("global.proxy.resources") {
        for (part, amounts) in res {
            let Value::Object(amounts) = amounts else {
                continue;
            };
            let m: Map<String, Value> = amounts
                .iter()
                .filter(|(_, q)| !q.is_null())
                .map(|(k, q)| (k.clone(), json!(quantity::canonical(&scalar_string(q)))))
                .collect();
            if !m.is_empty() {
                out.insert(part.clone(), Value::Object(m));
            }
        }
    }
    Value::Object(out)
}

pub(crate) fn seccomp(v: &Values, sc: &mut Map<String, Value>) {
    if let Some(p) = v
        .get("global.proxy.seccompProfile")
        .filter(|p| p.as_object().is_some_and(|m| !m.is_empty()))
    {
        sc.insert("seccompProfile".into(), p.clone());
    }
}

/// An env var; an empty value is left out, as Go's `omitempty` does.
pub(crate) fn env(name: &str, value: impl Into<String>) -> Value {
    let value = value.into();
    if value.is_empty() {
        json!({"name": name})
    } else {
        json!({"name": name, "value": value})
    }
}

pub(crate) fn env_field(name: &str, path: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}})
}

pub(crate) fn env_resource(name: &str, resource: &str) -> Value {
    json!({"name": name, "valueFrom": {"resourceFieldRef": {"resource": resource, "divisor": "1"}}})
}

/// `ISTIO_META_POD_PORTS`: the app containers' ports as the template writes them, one
/// JSON object a line in Go's field order.
pub(crate) fn pod_ports(containers: &[Value]) -> String {
    let mut lines = Vec::new();
    for c in containers {
        for p in c
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let mut fields = Vec::new();
            for key in ["name", "hostPort", "containerPort", "protocol", "hostIP"] {
                match p.get(key) {
                    None | Some(Value::Null) => {}
                    Some(Value::String(s)) if s.is_empty() => {}
                    Some(Value::Number(n)) if n.as_i64() == Some(0) && key != "containerPort" => {}
                    Some(val) => fields.push(format!("{}:{}", json!(key), val)),
                }
            }
            let sep = if lines.is_empty() { "" } else { "," };
            lines.push(format!("    {sep}{{{}}}", fields.join(",")));
        }
    }
    if lines.is_empty() {
        "[\n]".to_string()
    } else {
        format!("[\n{}\n]", lines.join("\n"))
    }
}

/// ProxyConfig's fields in proto declaration order, the order `protojson` writes them.
const PROXY_CONFIG_FIELDS: &[&str] = &[
    "configPath",
    "binaryPath",
    "serviceCluster",
    "drainDuration",
    "parentShutdownDuration",
    "discoveryAddress",
    "discoveryRefreshDelay",
    "zipkinAddress",
    "statsdUdpAddress",
    "envoyMetricsServiceAddress",
    "proxyAdminPort",
    "availabilityZone",
    "controlPlaneAuthPolicy",
    "customConfigFile",
    "statNameLength",
    "concurrency",
    "proxyBootstrapTemplatePath",
    "interceptionMode",
    "tracing",
    "sds",
    "envoyAccessLogService",
    "envoyMetricsService",
    "proxyMetadata",
    "runtimeValues",
    "statusPort",
    "extraStatTags",
    "gatewayTopology",
    "terminationDrainDuration",
    "meshId",
    "readinessProbe",
    "proxyStatsMatcher",
    "holdApplicationUntilProxyStarts",
    "caCertificatesPem",
    "image",
    "privateKeyProvider",
    "proxyHeaders",
];

/// `protoToJSON .ProxyConfig` over the non-default fields, in protojson's field order.
pub(crate) fn proxy_config_json(pc: &Map<String, Value>) -> String {
    let mut keys: Vec<&String> = pc.keys().collect();
    keys.sort_by_key(|k| {
        PROXY_CONFIG_FIELDS
            .iter()
            .position(|f| f == k)
            .unwrap_or(usize::MAX)
    });
    let fields: Vec<String> = keys
        .iter()
        .map(|k| format!("{}:{}", json!(k), pc[k.as_str()]))
        .collect();
    format!("{{{}}}", fields.join(","))
}

/// A Helm value as the template prints it: strings bare, numbers and booleans as text,
/// null as empty.
pub(crate) fn scalar_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    }
}

/// A rendered number: integers as JSON numbers, anything else kept as text.
pub(crate) fn number(s: &str) -> Value {
    s.trim()
        .parse::<i64>()
        .map(Value::from)
        .unwrap_or_else(|_| json!(s))
}

/// Which built-in template's variant of the agent's environment to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flavour {
    /// `sidecar`.
    Sidecar,
    /// `gateway`.
    Gateway,
    /// `grpc-agent`.
    GrpcAgent,
}

/// The `istio-proxy` environment of the built-in templates, in the template's order.
pub(crate) fn proxy_env(
    t: &TemplateInput<'_>,
    flavour: Flavour,
    app_containers: &[String],
) -> Vec<Value> {
    let v = t.values;
    let a = t.annotations;
    let mut e = Vec::new();
    if flavour == Flavour::GrpcAgent {
        e.push(env("ISTIO_META_GENERATOR", "grpc"));
        e.push(env("OUTPUT_CERTS", "/var/lib/istio/data"));
    }
    if t.mesh.inbound_traffic_policy_localhost {
        e.push(env("REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION", "true"));
    }
    let cert_provider = v.string("global.pilotCertProvider");
    e.push(env("PILOT_CERT_PROVIDER", cert_provider.clone()));
    let ca_addr = match v.string("global.caAddress") {
        s if !s.is_empty() => s,
        _ => {
            let rev = v.string("revision");
            let suffix = if rev.is_empty() {
                String::new()
            } else {
                format!("-{rev}")
            };
            format!(
                "istiod{suffix}.{}.svc:15012",
                v.string("global.istioNamespace")
            )
        }
    };
    e.push(env("CA_ADDR", ca_addr));
    e.push(env_field("POD_NAME", "metadata.name"));
    e.push(env_field("POD_NAMESPACE", "metadata.namespace"));
    e.push(env_field("INSTANCE_IP", "status.podIP"));
    e.push(env_field("SERVICE_ACCOUNT", "spec.serviceAccountName"));
    e.push(env_field("HOST_IP", "status.hostIP"));
    if flavour != Flavour::GrpcAgent {
        e.push(env_resource("ISTIO_CPU_LIMIT", "limits.cpu"));
    }
    e.push(env(
        "PROXY_CONFIG",
        format!("{}\n", proxy_config_json(t.proxy_config)),
    ));
    e.push(env("ISTIO_META_POD_PORTS", pod_ports(t.containers)));
    match flavour {
        Flavour::Sidecar => {
            e.push(env("ISTIO_META_APP_CONTAINERS", app_containers.join(",")));
            e.push(env_resource("GOMEMLIMIT", "limits.memory"));
        }
        Flavour::Gateway => {
            e.push(env_resource("GOMEMLIMIT", "limits.memory"));
            e.push(env("ISTIO_META_APP_CONTAINERS", app_containers.join(",")));
        }
        Flavour::GrpcAgent => {
            e.push(env("ISTIO_META_APP_CONTAINERS", app_containers.join(",")));
        }
    }
    if let Some(policy) = t.compliance_policy.filter(|p| !p.is_empty()) {
        e.push(env("COMPLIANCE_POLICY", policy));
        if policy == "fips-140-3" {
            e.push(env("GODEBUG", "fips140=only"));
        }
    }
    let cluster = match v.string("global.multiCluster.clusterName") {
        s if s.is_empty() => "Kubernetes".to_string(),
        s => s,
    };
    e.push(env("ISTIO_META_CLUSTER_ID", cluster));
    e.push(env_field("ISTIO_META_NODE_NAME", "spec.nodeName"));
    let meta_mode = a
        .get(ann::INTERCEPTION_MODE)
        .filter(|s| !s.is_empty())
        .cloned()
        .unwrap_or_else(|| {
            t.proxy_config
                .get("interceptionMode")
                .and_then(Value::as_str)
                .unwrap_or(common::InterceptionMode::Redirect.as_str())
                .to_string()
        });
    if flavour != Flavour::GrpcAgent {
        e.push(env("ISTIO_META_INTERCEPTION_MODE", meta_mode));
    }
    let workload = t
        .labels
        .get("service.istio.io/workload-name")
        .filter(|s| !s.is_empty())
        .cloned()
        .unwrap_or_else(|| t.deploy_name.to_string());
    if !workload.is_empty() {
        e.push(env("ISTIO_META_WORKLOAD_NAME", workload));
    }
    if !t.api_version.is_empty() && !t.deploy_name.is_empty() {
        let ns = if t.deploy_namespace.is_empty() {
            "default"
        } else {
            t.deploy_namespace
        };
        e.push(env(
            "ISTIO_META_OWNER",
            format!(
                "kubernetes://apis/{}/namespaces/{ns}/{}s/{}",
                t.api_version,
                t.kind.to_lowercase(),
                t.deploy_name
            ),
        ));
    }
    if flavour == Flavour::Sidecar && a.contains_key(ann::BOOTSTRAP_OVERRIDE) {
        e.push(env(
            "ISTIO_BOOTSTRAP_OVERRIDE",
            "/etc/istio/custom-bootstrap/custom_bootstrap.json",
        ));
    }
    let trust_domain = match t.mesh.trust_domain.as_str() {
        "" => v.string("global.trustDomain"),
        s => s.to_string(),
    };
    let mesh_id = v.string("global.meshID");
    if !mesh_id.is_empty() {
        e.push(env("ISTIO_META_MESH_ID", mesh_id));
    } else if !trust_domain.is_empty() {
        e.push(env("ISTIO_META_MESH_ID", trust_domain.clone()));
    }
    if !trust_domain.is_empty() {
        e.push(env("TRUST_DOMAIN", trust_domain));
    }
    if flavour == Flavour::Sidecar
        && v.string("global.proxy.tracer") == "datadog"
        && let Some(Ok(Value::Object(m))) = a
            .get("apm.datadoghq.com/env")
            .map(|s| serde_json::from_str::<Value>(s))
    {
        for (k, val) in m {
            e.push(env(&k, scalar_string(&val)));
        }
    }
    for (k, val) in t.proxy_metadata() {
        e.push(env(&k, val));
    }
    if flavour == Flavour::GrpcAgent {
        // gRPC resolves with xds:///, so the agent needs no DNS capture, and runs no Envoy.
        e.push(env("ISTIO_META_DNS_CAPTURE", "false"));
        e.push(env("DISABLE_ENVOY", "true"));
    }
    e
}
