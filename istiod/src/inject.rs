//! The sidecar injector's core: turns a Pod (or a workload's pod template) into Istio's
//! injected Pod, as istiod's `/inject` webhook and `istioctl kube-inject` do.
//!
//! The pipeline follows Istio's `injectPod`: validate the traffic annotations, select the
//! templates (`inject.istio.io/templates` or the injector's `defaultTemplates`) among the
//! built-in ones ([`Template`]: `sidecar`, `gateway`, `grpc-simple`, `grpc-agent`, written
//! in Rust; Go-template custom templates are refused), render them, merge them into the pod
//! the way a strategic merge patch does (lists keyed by name), merge the user's own
//! containers of the same names back over the rendered ones and record them in
//! `proxy.istio.io/overrides` ([`overrides`]), merge Prometheus annotations, rewrite app
//! probes to the agent ([`probes`]), record `sidecar.istio.io/status`, and order the
//! containers. The webhook answers with [`patch::diff`] between the admitted pod and the
//! result; whether to inject at all is [`policy`]; the injector ConfigMap's `config` key is
//! [`InjectorConfig`].

pub(crate) mod config;
mod gateway;
mod grpc;
pub mod kube_gateway;
mod objects;
mod overrides;
pub mod patch;
pub mod policy;
mod probes;
#[cfg(test)]
mod proxy_config_tests;
pub(crate) mod quantity;
mod render;
mod sidecar;
mod template;

pub use config::InjectorConfig;
pub use objects::{inject_object, inject_object_in_namespace, parse_yaml_documents};
pub use template::Template;

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde_json::{Map, Value, json};

use crate::model::proxy_config::WorkloadProxyConfig;

/// The sidecar container's name.
pub const PROXY_CONTAINER: &str = "istio-proxy";
/// The iptables init container's name.
pub const INIT_CONTAINER: &str = "istio-init";
/// The CNI validation init container's name.
pub const VALIDATION_CONTAINER: &str = "istio-validation";
/// The core-dump init container's name.
const ENABLE_CORE_DUMP_CONTAINER: &str = "enable-core-dump";
/// The pod label naming its network in a multi-network mesh.
const NETWORK_LABEL: &str = "topology.istio.io/network";
/// The agent's status port, where Prometheus scrapes the merged metrics.
const STATUS_PORT: i64 = 15020;

/// Istio's annotation names the injector reads.
pub(crate) mod ann {
    /// Records what was injected; its presence means "already injected".
    pub const STATUS: &str = "sidecar.istio.io/status";
    /// Per-pod ProxyConfig overrides (YAML or JSON).
    pub const PROXY_CONFIG: &str = "proxy.istio.io/config";
    /// The user's own fields for the injected containers.
    pub const OVERRIDES: &str = "proxy.istio.io/overrides";
    /// Run `istio-proxy` as a native sidecar (`true`/`false`).
    pub const NATIVE_SIDECAR: &str = "sidecar.istio.io/nativeSidecar";
    /// `REDIRECT`, `TPROXY` or `NONE`.
    pub const INTERCEPTION_MODE: &str = "sidecar.istio.io/interceptionMode";
    /// Outbound CIDRs to capture.
    pub const INCLUDE_OUTBOUND_IP_RANGES: &str = "traffic.sidecar.istio.io/includeOutboundIPRanges";
    /// Outbound CIDRs not to capture.
    pub const EXCLUDE_OUTBOUND_IP_RANGES: &str = "traffic.sidecar.istio.io/excludeOutboundIPRanges";
    /// Inbound ports to capture.
    pub const INCLUDE_INBOUND_PORTS: &str = "traffic.sidecar.istio.io/includeInboundPorts";
    /// Inbound ports not to capture.
    pub const EXCLUDE_INBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeInboundPorts";
    /// Outbound ports to capture.
    pub const INCLUDE_OUTBOUND_PORTS: &str = "traffic.sidecar.istio.io/includeOutboundPorts";
    /// Outbound ports not to capture.
    pub const EXCLUDE_OUTBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeOutboundPorts";
    /// Interfaces whose traffic is not captured.
    pub const EXCLUDE_INTERFACES: &str = "traffic.sidecar.istio.io/excludeInterfaces";
    /// Virtual interfaces whose traffic is captured as inbound (deprecated name).
    pub const KUBEVIRT_INTERFACES: &str = "traffic.sidecar.istio.io/kubevirtInterfaces";
    /// Virtual interfaces whose traffic is captured as inbound.
    pub const REROUTE_VIRTUAL_INTERFACES: &str = "istio.io/reroute-virtual-interfaces";
    /// The agent's status port (0 disables the readiness probe and probe rewriting).
    pub const STATUS_PORT: &str = "status.sidecar.istio.io/port";
    /// The sidecar readiness probe's `initialDelaySeconds`.
    pub const READINESS_INITIAL_DELAY: &str =
        "readiness.status.sidecar.istio.io/initialDelaySeconds";
    /// The sidecar readiness probe's `periodSeconds`.
    pub const READINESS_PERIOD: &str = "readiness.status.sidecar.istio.io/periodSeconds";
    /// The sidecar readiness probe's `failureThreshold`.
    pub const READINESS_FAILURE_THRESHOLD: &str =
        "readiness.status.sidecar.istio.io/failureThreshold";
    /// Proxy CPU request.
    pub const PROXY_CPU: &str = "sidecar.istio.io/proxyCPU";
    /// Proxy memory request.
    pub const PROXY_MEMORY: &str = "sidecar.istio.io/proxyMemory";
    /// Proxy CPU limit.
    pub const PROXY_CPU_LIMIT: &str = "sidecar.istio.io/proxyCPULimit";
    /// Proxy memory limit.
    pub const PROXY_MEMORY_LIMIT: &str = "sidecar.istio.io/proxyMemoryLimit";
    /// The proxy image.
    pub const PROXY_IMAGE: &str = "sidecar.istio.io/proxyImage";
    /// The proxy image variant (`distroless`, `debug`).
    pub const PROXY_IMAGE_TYPE: &str = "sidecar.istio.io/proxyImageType";
    /// Envoy's log level.
    pub const LOG_LEVEL: &str = "sidecar.istio.io/logLevel";
    /// Envoy's per-component log levels.
    pub const COMPONENT_LOG_LEVEL: &str = "sidecar.istio.io/componentLogLevel";
    /// The agent's log level.
    pub const AGENT_LOG_LEVEL: &str = "sidecar.istio.io/agentLogLevel";
    /// Add `NET_BIND_SERVICE` to the proxy.
    pub const CAP_NET_BIND_SERVICE: &str = "sidecar.istio.io/capNetBindService";
    /// A ConfigMap holding a custom bootstrap.
    pub const BOOTSTRAP_OVERRIDE: &str = "sidecar.istio.io/bootstrapOverride";
    /// Extra volumes (JSON map of name to volume source).
    pub const USER_VOLUME: &str = "sidecar.istio.io/userVolume";
    /// Extra proxy volume mounts (JSON map of name to mount).
    pub const USER_VOLUME_MOUNT: &str = "sidecar.istio.io/userVolumeMount";
    /// Whether to rewrite app probes to the agent.
    pub const REWRITE_APP_PROBERS: &str = "sidecar.istio.io/rewriteAppHTTPProbers";
    /// The templates to inject, comma-separated (`sidecar`, `gateway`, ...).
    pub const TEMPLATES: &str = "inject.istio.io/templates";
    /// Several `port:path` endpoints for the agent to scrape and merge.
    pub const PROMETHEUS_SCRAPE_TARGETS: &str = "prometheus.istio.io/scrape-targets";
    /// Opt out of Prometheus metrics merging.
    pub const PROMETHEUS_MERGE: &str = "prometheus.istio.io/merge-metrics";
}

/// Why injection failed.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// A traffic annotation's value is malformed.
    #[error("invalid annotation {key}={value:?}: {reason}; fix or remove the annotation")]
    InvalidAnnotation {
        /// The annotation.
        key: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: AnnotationValueError,
    },
    /// `proxy.istio.io/config` is not a YAML/JSON object.
    #[error(
        "invalid proxy.istio.io/config annotation: {0}; it must be a ProxyConfig in YAML or JSON"
    )]
    InvalidProxyConfig(String),
    /// The values or an input document could not be parsed.
    #[error("cannot parse {what}: {reason}")]
    Parse {
        /// What was being parsed.
        what: String,
        /// The parser's message.
        reason: String,
    },
    /// The pod (or the injector's `defaultTemplates`) asks for a template that is not built
    /// in. Custom templates in Go's template language are not interpreted.
    #[error(
        "injection template {name:?} is not available (built-in templates: {known}); \
         custom templates in Go's template language are not supported: use a built-in one"
    )]
    UnknownTemplate {
        /// The template asked for.
        name: String,
        /// The built-in templates, comma-separated.
        known: String,
    },
    /// The object has no pod spec where its kind says it should.
    #[error("{kind} has no pod template at {path}")]
    NoPodTemplate {
        /// The object's kind.
        kind: String,
        /// Where the template was expected.
        path: &'static str,
    },
}

/// Helm values of the istio-discovery chart (`values.global.*`, `values.pilot.*`, ...),
/// kept as a JSON tree so any key the template reads can be set.
#[derive(Clone, Debug)]
pub struct Values(Value);

impl Values {
    /// Parses a chart `values.yaml`; the chart's `_internal_defaults_do_not_set` wrapper is
    /// unwrapped when present.
    pub fn from_yaml(text: &str) -> Result<Self, InjectError> {
        let mut v: Value = serde_yaml_ng::from_str(text).map_err(|e| InjectError::Parse {
            what: "values".into(),
            reason: e.to_string(),
        })?;
        if let Some(inner) = v.get_mut("_internal_defaults_do_not_set") {
            v = inner.take();
        }
        Ok(Self(v))
    }

    /// Values already parsed into a JSON tree (the `values` key of the
    /// `istio-sidecar-injector` ConfigMap is JSON).
    pub fn from_json(v: Value) -> Self {
        Self(v)
    }

    /// The whole tree.
    pub fn json(&self) -> &Value {
        &self.0
    }

    /// Sets the value at a dotted path (`global.proxy.statusPort`), creating objects.
    pub fn set(&mut self, path: &str, value: Value) {
        let mut cur = &mut self.0;
        for part in path.split('.') {
            if !cur.is_object() {
                *cur = json!({});
            }
            let Value::Object(m) = cur else {
                unreachable!("just made an object")
            };
            cur = m.entry(part.to_string()).or_insert(Value::Null);
        }
        *cur = value;
    }

    /// The value at a dotted path.
    pub fn get(&self, path: &str) -> Option<&Value> {
        path.split('.').try_fold(&self.0, |v, part| v.get(part))
    }

    /// The value at `path` as the template prints it (empty when unset).
    pub fn string(&self, path: &str) -> String {
        self.get(path)
            .map(template::scalar_string)
            .unwrap_or_default()
    }

    /// Whether the value at `path` is `true` (or `"true"`).
    pub fn bool(&self, path: &str) -> bool {
        match self.get(path) {
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) => s == "true",
            _ => false,
        }
    }
}

/// The parts of MeshConfig injection reads.
#[derive(Clone, Debug)]
pub struct MeshSettings {
    /// Fields of `defaultConfig` that differ from ProxyConfig's defaults (camelCase JSON).
    pub default_config: Map<String, Value>,
    /// `trustDomain`.
    pub trust_domain: String,
    /// `enablePrometheusMerge`.
    pub enable_prometheus_merge: bool,
    /// `proxyListenPort`.
    pub proxy_listen_port: u16,
    /// `proxyInboundListenPort`.
    pub proxy_inbound_listen_port: u16,
    /// `inboundTrafficPolicy.mode == LOCALHOST`.
    pub inbound_traffic_policy_localhost: bool,
}

impl Default for MeshSettings {
    fn default() -> Self {
        Self {
            default_config: Map::new(),
            trust_domain: "cluster.local".into(),
            enable_prometheus_merge: true,
            proxy_listen_port: 15001,
            proxy_inbound_listen_port: 15006,
            inbound_traffic_policy_localhost: false,
        }
    }
}

/// Everything the injector needs besides the pod.
#[derive(Clone, Debug)]
pub struct InjectionConfig {
    /// Chart values.
    pub values: Values,
    /// Mesh config.
    pub mesh: MeshSettings,
    /// Run `istio-proxy` as a native sidecar unless the pod says otherwise
    /// (Istio's `ENABLE_NATIVE_SIDECARS`, resolved for the cluster's node versions).
    pub native_sidecars: bool,
    /// This injector's revision (`default` for the default one).
    pub revision: String,
    /// `COMPLIANCE_POLICY` (e.g. `fips-140-3`), passed to the proxy.
    pub compliance_policy: Option<String>,
    /// The templates injected into a pod without an `inject.istio.io/templates` annotation
    /// (the injector config's `defaultTemplates`; Istio's default is `[sidecar]`). Each must
    /// be a built-in [`Template`]'s name, or injection fails with
    /// [`InjectError::UnknownTemplate`].
    pub default_templates: Vec<String>,
    /// Annotations added to every injected pod, over the pod's own (the injector config's
    /// `injectedAnnotations`).
    pub injected_annotations: BTreeMap<String, String>,
    /// The cluster is OpenShift (Istio's `PLATFORM=openshift`): the proxy's UID and GID come
    /// from the pod's namespace (see [`inject_pod_in_namespace`]), not from 1337 or the
    /// user's own `istio-proxy`.
    pub openshift: bool,
}

impl InjectionConfig {
    /// A config with these values, default mesh settings, native sidecars on, the
    /// `default` revision and the `sidecar` template.
    pub fn new(values: Values) -> Self {
        Self {
            values,
            mesh: MeshSettings::default(),
            native_sidecars: true,
            revision: "default".into(),
            compliance_policy: None,
            default_templates: vec![Template::Sidecar.name().to_string()],
            injected_annotations: BTreeMap::new(),
            openshift: false,
        }
    }
}

/// The workload a pod belongs to (Istio's `DeploymentMeta` and `TypeMeta`), which names the
/// proxy's workload and owner.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkloadMeta {
    /// The workload's name (e.g. the Deployment's).
    pub name: String,
    /// The workload's namespace (empty means `default`).
    pub namespace: String,
    /// Its `apiVersion` (`apps/v1`, `v1` for a bare Pod).
    pub api_version: String,
    /// Its `kind`.
    pub kind: String,
    /// The ProxyConfig objects that apply to the pod, by its namespace and
    /// labels (empty where none are known, as for `istioctl kube-inject`).
    pub proxy_config: WorkloadProxyConfig,
}

impl WorkloadMeta {
    /// The workload a pod admitted by the webhook belongs to, from its controller owner
    /// reference: a ReplicaSet whose pods carry `pod-template-hash` names its Deployment,
    /// a Job named `<cronjob>-<digits>` its CronJob; a pod without owner is its own workload.
    pub fn from_pod(pod: &Value) -> Self {
        let meta = pod.get("metadata");
        let s = |v: Option<&Value>, k: &str| {
            v.and_then(|v| v.get(k))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let namespace = s(meta, "namespace");
        let mut name = s(meta, "name");
        if name.is_empty() {
            name = s(meta, "generateName").trim_end_matches('-').to_string();
        }
        let owner = meta
            .and_then(|m| m.get("ownerReferences"))
            .and_then(Value::as_array)
            .and_then(|o| {
                o.iter()
                    .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
            });
        let Some(owner) = owner else {
            return Self {
                name,
                namespace,
                api_version: "v1".into(),
                kind: "Pod".into(),
                proxy_config: WorkloadProxyConfig::default(),
            };
        };
        let (kind, owner_name, api) = (
            s(Some(owner), "kind"),
            s(Some(owner), "name"),
            s(Some(owner), "apiVersion"),
        );
        let hash = s(meta.and_then(|m| m.get("labels")), "pod-template-hash");
        if kind == "ReplicaSet"
            && !hash.is_empty()
            && let Some(deploy) = owner_name.strip_suffix(&format!("-{hash}"))
        {
            return Self {
                name: deploy.into(),
                namespace,
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                proxy_config: WorkloadProxyConfig::default(),
            };
        }
        if kind == "Job"
            && let Some((cron, suffix)) = owner_name.rsplit_once('-')
            && !suffix.is_empty()
            && suffix.chars().all(|c| c.is_ascii_digit())
        {
            return Self {
                name: cron.into(),
                namespace,
                api_version: "batch/v1".into(),
                kind: "CronJob".into(),
                proxy_config: WorkloadProxyConfig::default(),
            };
        }
        Self {
            name: owner_name,
            namespace,
            api_version: api,
            kind,
            proxy_config: WorkloadProxyConfig::default(),
        }
    }
}

/// What [`inject_pod`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The injected pod.
    Injected(Value),
    /// Not injected: the pod uses the host's network.
    SkippedHostNetwork,
    /// Not injected: the pod already carries `sidecar.istio.io/status`.
    AlreadyInjected,
}

/// Injects the sidecar into `pod` (a Pod, or a pod template: an object with `metadata` and
/// `spec`) belonging to `workload`.
pub fn inject_pod(
    pod: &Value,
    workload: &WorkloadMeta,
    cfg: &InjectionConfig,
) -> Result<Outcome, InjectError> {
    inject_pod_in_namespace(pod, workload, &BTreeMap::new(), cfg)
}

/// [`inject_pod`] for a pod of a namespace with these annotations. Only OpenShift
/// ([`InjectionConfig::openshift`]) reads them: the proxy's UID and GID are the last of the
/// namespace's `openshift.io/sa.scc.uid-range` and `openshift.io/sa.scc.supplemental-groups`.
pub fn inject_pod_in_namespace(
    pod: &Value,
    workload: &WorkloadMeta,
    namespace_annotations: &BTreeMap<String, String>,
    cfg: &InjectionConfig,
) -> Result<Outcome, InjectError> {
    let mut pod = pod.clone();
    let annotations = string_map(pod.pointer("/metadata/annotations"));
    let labels = string_map(pod.pointer("/metadata/labels"));
    if pod.pointer("/spec/hostNetwork").and_then(Value::as_bool) == Some(true) {
        return Ok(Outcome::SkippedHostNetwork);
    }
    if annotations.contains_key(ann::STATUS) {
        return Ok(Outcome::AlreadyInjected);
    }
    validate_annotations(&annotations)?;
    let templates = template::select(&annotations, cfg)?;
    let proxy_config = proxy_config(&cfg.mesh, &annotations, &workload.proxy_config)?;
    let native_sidecar = annotations
        .get(ann::NATIVE_SIDECAR)
        .map(|v| v != "false")
        .unwrap_or(cfg.native_sidecars);

    // The user's own istio-proxy / istio-init are overrides, taken out before rendering.
    let spec = pod
        .as_object_mut()
        .map(|o| o.entry("spec").or_insert_with(|| json!({})))
        .filter(|s| s.is_object());
    let Some(spec) = spec else {
        return Err(InjectError::NoPodTemplate {
            kind: workload.kind.clone(),
            path: "spec",
        });
    };
    let original_spec = spec.clone();
    // The user's own istio-proxy / istio-init are overrides, taken out before rendering and
    // merged back over the rendered ones (below).
    for list in ["initContainers", "containers"] {
        if let Some(Value::Array(items)) = spec.get_mut(list) {
            items.retain(|c| {
                let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
                ![PROXY_CONTAINER, INIT_CONTAINER, VALIDATION_CONTAINER].contains(&name)
            });
        }
    }
    let containers: Vec<Value> = spec
        .get("containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let service_account = spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let (proxy_uid, proxy_gid, uid_from_user) =
        proxy_ids(&original_spec, namespace_annotations, cfg.openshift);
    let input = template::TemplateInput {
        values: &cfg.values,
        mesh: &cfg.mesh,
        proxy_config: &proxy_config,
        annotations: &annotations,
        labels: &labels,
        containers: &containers,
        service_account: &service_account,
        deploy_name: &workload.name,
        deploy_namespace: &workload.namespace,
        api_version: &workload.api_version,
        kind: &workload.kind,
        native_sidecar,
        revision: &cfg.revision,
        compliance_policy: cfg.compliance_policy.as_deref(),
        proxy_uid,
        proxy_gid,
        uid_from_user,
    };
    let tproxy = input.interception_mode() == common::InterceptionMode::Tproxy.as_str();
    let rendered = render::render_all(&templates, &input);

    let status = status_annotation(&rendered, &cfg.revision);
    let (rendered_containers, rendered_inits) = (
        rendered_names(&rendered.containers),
        rendered_names(&rendered.init_containers),
    );

    merge_rendered(
        spec,
        [
            ("initContainers", rendered.init_containers),
            ("containers", rendered.containers),
            ("volumes", rendered.volumes),
            ("imagePullSecrets", rendered.image_pull_secrets),
        ],
        rendered.pod_security_context,
    );
    let overrides = overrides::reapply(
        spec,
        &original_spec,
        [&rendered_containers, &rendered_inits],
        overrides::ProxyRunAs {
            tproxy,
            openshift: cfg.openshift,
        },
    );

    // Istio adds the network of a multi-network mesh after the template, as the last of the
    // template's variables and as the pod's network label.
    let network = cfg.values.string("global.network");
    if !network.is_empty() {
        push_proxy_env(
            spec,
            &[json!({"name": "ISTIO_META_NETWORK", "value": network})],
        );
    }

    // Metadata: the template's labels and annotations over the pod's.
    let mut annotations_out = annotations.clone();
    for (k, v) in rendered.annotations {
        annotations_out.insert(k, v);
    }
    post_process(spec, &annotations, &mut annotations_out, &proxy_config, cfg);

    // Metadata last: the injector's annotations, the overrides and the status record.
    for (k, v) in &cfg.injected_annotations {
        annotations_out.insert(k.clone(), v.clone());
    }
    if !overrides.is_empty() {
        annotations_out.insert(ann::OVERRIDES.into(), overrides.annotation());
    }
    annotations_out.insert(ann::STATUS.into(), status);
    let mut labels_out = labels;
    for (k, v) in rendered.labels {
        labels_out.insert(k, v);
    }
    if !network.is_empty() {
        labels_out
            .entry(NETWORK_LABEL.into())
            .or_insert(network.clone());
    }
    let meta = pod
        .as_object_mut()
        .map(|o| o.entry("metadata").or_insert_with(|| json!({})));
    if let Some(Value::Object(meta)) = meta {
        meta.insert("annotations".into(), to_value(annotations_out));
        meta.insert("labels".into(), to_value(labels_out));
    }
    Ok(Outcome::Injected(pod))
}

/// Istio's `GetProxyIDs`: the proxy's UID and GID from the namespace's ranges on OpenShift,
/// else from the user's own `istio-proxy`, else unset (1337); and whether the UID is the
/// user's.
fn proxy_ids(
    original_spec: &Value,
    namespace_annotations: &BTreeMap<String, String>,
    openshift: bool,
) -> (Option<i64>, Option<i64>, bool) {
    let user_proxy_sc = overrides::find_container(original_spec, PROXY_CONTAINER)
        .and_then(|c| c.get("securityContext"))
        .cloned()
        .unwrap_or(Value::Null);
    let user_id = |key: &str| user_proxy_sc.get(key).and_then(Value::as_i64);
    if openshift {
        let top = |key: &str| {
            namespace_annotations
                .get(key)
                .and_then(|r| overrides::range_top(r))
        };
        (
            top(overrides::OPENSHIFT_UID_RANGE),
            top(overrides::OPENSHIFT_GROUPS),
            false,
        )
    } else {
        (
            user_id("runAsUser"),
            user_id("runAsGroup"),
            user_id("runAsUser").is_some(),
        )
    }
}

/// The names of rendered items.
fn rendered_names(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .filter_map(|i| i.get("name").and_then(Value::as_str).map(str::to_string))
        .collect()
}

/// Merges the rendered lists (by name) and pod `securityContext` into the pod's spec.
fn merge_rendered(
    spec: &mut Value,
    lists: [(&str, Vec<Value>); 4],
    pod_security_context: Option<Value>,
) {
    for (list, items) in lists {
        let names = rendered_names(&items);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        for item in items {
            merge_named(spec, list, item, &names);
        }
    }
    if let (Some(sc), Some(obj)) = (pod_security_context, spec.as_object_mut()) {
        strategic_merge(
            obj.entry("securityContext").or_insert_with(|| json!({})),
            &sc,
        );
    }
}

/// The `sidecar.istio.io/status` annotation: the names of what the templates added, keys in
/// the order Istio's `SidecarInjectionStatus` struct writes them.
fn status_annotation(rendered: &template::Rendered, revision: &str) -> String {
    let status = json!({
        "initContainers": names_or_null(&rendered.init_containers),
        "containers": names_or_null(&rendered.containers),
        "volumes": names_or_null(&rendered.volumes),
        "imagePullSecrets": names_or_null(&rendered.image_pull_secrets),
        "revision": revision,
    });
    // Key order as Istio's SidecarInjectionStatus struct writes it.
    format!(
        "{{\"initContainers\":{},\"containers\":{},\"volumes\":{},\"imagePullSecrets\":{},\"revision\":{}}}",
        status["initContainers"],
        status["containers"],
        status["volumes"],
        status["imagePullSecrets"],
        status["revision"]
    )
}

/// Istio's `postProcessPod` steps after the templates: Prometheus merge, app probes
/// rewritten to the agent, and the containers' order.
fn post_process(
    spec: &mut Value,
    annotations: &BTreeMap<String, String>,
    annotations_out: &mut BTreeMap<String, String>,
    proxy_config: &Map<String, Value>,
    cfg: &InjectionConfig,
) {
    // Prometheus merge, probe rewriting.
    let status_port = annotations
        .get(ann::STATUS_PORT)
        .cloned()
        .unwrap_or_else(|| cfg.values.string("global.proxy.statusPort"));
    let status_port: i64 = status_port.trim().parse().unwrap_or(0);
    let mut proxy_env = Vec::new();
    prometheus_merge(&cfg.mesh, annotations_out, &mut proxy_env);
    let rewrite = annotations_out
        .get(ann::REWRITE_APP_PROBERS)
        .map(|v| v == "true")
        .unwrap_or_else(|| {
            cfg.values.get("sidecarInjectorWebhook.rewriteAppHTTPProbe") != Some(&json!(false))
        });
    if rewrite
        && status_port != 0
        && let Some(probers) = probes::rewrite(spec, status_port)
    {
        proxy_env.push(json!({"name": "ISTIO_KUBE_APP_PROBERS", "value": probers}));
    }
    push_proxy_env(spec, &proxy_env);
    let hold = proxy_config
        .get("holdApplicationUntilProxyStarts")
        .and_then(Value::as_bool)
        .unwrap_or(false)
        || cfg
            .values
            .bool("global.proxy.holdApplicationUntilProxyStarts");
    reorder(spec, hold);
}

/// Appends `envs` to the `istio-proxy` container's env, wherever the templates put it.
fn push_proxy_env(spec: &mut Value, envs: &[Value]) {
    for list in ["initContainers", "containers"] {
        if let Some(Value::Array(items)) = spec.get_mut(list)
            && let Some(proxy) = items
                .iter_mut()
                .find(|c| c.get("name").and_then(Value::as_str) == Some(PROXY_CONTAINER))
            && let Some(Value::Array(env)) = proxy.get_mut("env")
        {
            env.extend(envs.iter().cloned());
        }
    }
}

fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), template::scalar_string(v)))
                .collect()
        })
        .unwrap_or_default()
}

fn to_value(m: BTreeMap<String, String>) -> Value {
    Value::Object(m.into_iter().map(|(k, v)| (k, Value::String(v))).collect())
}

fn names_or_null(items: &[Value]) -> Value {
    if items.is_empty() {
        return Value::Null;
    }
    Value::Array(
        items
            .iter()
            .map(|i| i.get("name").cloned().unwrap_or(Value::Null))
            .collect(),
    )
}

/// The effective ProxyConfig (Istio's `EffectiveProxyConfig`): mesh `defaultConfig`, the
/// namespace-wide ProxyConfig objects, the pod's `proxy.istio.io/config` and the ProxyConfig
/// selecting the workload, each merged over the one before.
fn proxy_config(
    mesh: &MeshSettings,
    annotations: &BTreeMap<String, String>,
    objects: &WorkloadProxyConfig,
) -> Result<Map<String, Value>, InjectError> {
    let annotation = match annotations.get(ann::PROXY_CONFIG) {
        Some(text) => {
            let overlay: Value = serde_yaml_ng::from_str(text)
                .map_err(|e| InjectError::InvalidProxyConfig(e.to_string()))?;
            if !overlay.is_object() {
                return Err(InjectError::InvalidProxyConfig(format!(
                    "{text:?} is not an object"
                )));
            }
            let refused = overlay
                .as_object()
                .map(common::proxy_config_fields::unapplied)
                .unwrap_or_default();
            if let Some(first) = refused.first() {
                return Err(InjectError::InvalidProxyConfig(first.to_string()));
            }
            Some(overlay)
        }
        None => None,
    };
    Ok(objects.effective(&mesh.default_config, annotation.as_ref()))
}

/// The merge key of a list in a container or pod spec, as Kubernetes' strategic merge
/// patch defines it.
fn merge_key(list: &str) -> Option<&'static str> {
    match list {
        "containers" | "initContainers" | "volumes" | "env" | "imagePullSecrets" => Some("name"),
        "ports" => Some("containerPort"),
        "volumeMounts" => Some("mountPath"),
        _ => None,
    }
}

/// Strategic merge of `overlay` into `target`: objects key by key, keyed lists item by item
/// (new items appended), anything else replaced.
fn strategic_merge(target: &mut Value, overlay: &Value) {
    let (Value::Object(t), Value::Object(o)) = (&mut *target, overlay) else {
        *target = overlay.clone();
        return;
    };
    for (k, v) in o {
        match (t.get_mut(k), merge_key(k), v) {
            (Some(Value::Array(existing)), Some(key), Value::Array(items)) => {
                for item in items {
                    match existing.iter_mut().find(|e| e.get(key) == item.get(key)) {
                        Some(e) => strategic_merge(e, item),
                        None => existing.push(item.clone()),
                    }
                }
            }
            (Some(existing), None, Value::Object(_)) if existing.is_object() => {
                strategic_merge(existing, v)
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Merges `item` into `spec[list]` by name.
fn merge_named(spec: &mut Value, list: &str, item: Value, injected_names: &[&str]) {
    let Some(obj) = spec.as_object_mut() else {
        return;
    };
    let entry = obj.entry(list).or_insert_with(|| json!([]));
    if !entry.is_array() {
        *entry = json!([]);
    }
    let Value::Array(items) = entry else {
        return;
    };
    // A strategic merge patch lists the patch's items first, then the original's others.
    let mut merged = match items.iter().position(|c| c.get("name") == item.get("name")) {
        Some(i) => {
            let mut existing = items.remove(i);
            strategic_merge(&mut existing, &item);
            existing
        }
        None => item,
    };
    let pos = items
        .iter()
        .position(|c| {
            !injected_names.contains(&c.get("name").and_then(Value::as_str).unwrap_or_default())
        })
        .unwrap_or(items.len());
    items.insert(pos, std::mem::take(&mut merged));
}

/// Istio's `applyPrometheusMerge`: points Prometheus at the agent's merged metrics and hands
/// the app's own scrape settings to the agent.
fn prometheus_merge(
    mesh: &MeshSettings,
    annotations: &mut BTreeMap<String, String>,
    proxy_env: &mut Vec<Value>,
) {
    if !mesh.enable_prometheus_merge
        || annotations.get(ann::PROMETHEUS_MERGE).map(String::as_str) == Some("false")
    {
        return;
    }
    let port = STATUS_PORT.to_string();
    if annotations.get("prometheus.io/port") == Some(&port) {
        return;
    }
    let find = |suffix: &str| {
        ["prometheus.io/", "prometheus.io.", "prometheus-io/"]
            .iter()
            .find_map(|p| annotations.get(&format!("{p}{suffix}")).cloned())
            .unwrap_or_default()
    };
    let (scrape, mut path, mut p) = (find("scrape"), find("path"), find("port"));
    if scrape == "false" {
        return;
    }
    // `prometheus.istio.io/scrape-targets: "port:path,..."`: the agent scrapes each; the
    // first fills an unset port or path.
    let targets: Vec<(String, String)> = annotations
        .get(ann::PROMETHEUS_SCRAPE_TARGETS)
        .map(|t| {
            t.split(',')
                .filter_map(|t| t.trim().split_once(':'))
                .map(|(port, path)| (port.trim().to_string(), path.trim().to_string()))
                .collect()
        })
        .unwrap_or_default();
    if let Some((first_port, first_path)) = targets.first() {
        if p.is_empty() {
            p.clone_from(first_port);
        }
        if path.is_empty() {
            path.clone_from(first_path);
        }
    }
    if !(scrape.is_empty() && path.is_empty() && p.is_empty()) {
        let mut v = format!(
            "{{\"scrape\":{},\"path\":{},\"port\":{}",
            json!(scrape),
            json!(path),
            json!(p)
        );
        if !targets.is_empty() {
            let items: Vec<String> = targets
                .iter()
                .map(|(port, path)| {
                    format!("{{\"port\":{},\"path\":{}}}", json!(port), json!(path))
                })
                .collect();
            v.push_str(&format!(",\"targets\":[{}]", items.join(",")));
        }
        v.push('}');
        proxy_env.push(json!({"name": "ISTIO_PROMETHEUS_ANNOTATIONS", "value": v}));
    }
    annotations.retain(|k, _| {
        k != ann::PROMETHEUS_SCRAPE_TARGETS
            && !["prometheus.io/", "prometheus.io.", "prometheus-io/"]
                .iter()
                .any(|p| k.starts_with(p))
    });
    annotations.insert("prometheus.io/port".into(), port);
    annotations.insert("prometheus.io/path".into(), "/stats/prometheus".into());
    annotations.insert("prometheus.io/scrape".into(), "true".into());
}

/// Istio's `reorderPod`: with a native sidecar, `istio-init`/`istio-validation` then the proxy
/// run first so later init containers are in the mesh; otherwise the iptables setup runs last
/// and the proxy container is last (first when it must hold the application).
fn reorder(spec: &mut Value, hold: bool) {
    fn move_to(list: &mut Vec<Value>, name: &str, first: bool) {
        if let Some(i) = list
            .iter()
            .position(|c| c.get("name").and_then(Value::as_str) == Some(name))
        {
            let c = list.remove(i);
            if first {
                list.insert(0, c);
            } else {
                list.push(c);
            }
        }
    }
    if let Some(Value::Array(c)) = spec.get_mut("containers") {
        move_to(c, PROXY_CONTAINER, hold);
    }
    if let Some(Value::Array(init)) = spec.get_mut("initContainers") {
        let native = init
            .iter()
            .any(|c| c.get("name").and_then(Value::as_str) == Some(PROXY_CONTAINER));
        for name in if native {
            [
                ENABLE_CORE_DUMP_CONTAINER,
                PROXY_CONTAINER,
                VALIDATION_CONTAINER,
                INIT_CONTAINER,
            ]
        } else {
            [
                ENABLE_CORE_DUMP_CONTAINER,
                VALIDATION_CONTAINER,
                INIT_CONTAINER,
                "",
            ]
        } {
            move_to(init, name, native);
        }
    }
}

/// Istio's `validateAnnotations` for the traffic annotations that become iptables flags.
fn validate_annotations(a: &BTreeMap<String, String>) -> Result<(), InjectError> {
    let err = |key: &'static str, value: &str, reason| InjectError::InvalidAnnotation {
        key,
        value: value.into(),
        reason,
    };
    for key in [
        ann::INCLUDE_OUTBOUND_IP_RANGES,
        ann::EXCLUDE_OUTBOUND_IP_RANGES,
    ] {
        if let Some(v) = a.get(key) {
            if key == ann::INCLUDE_OUTBOUND_IP_RANGES && v == "*" {
                continue;
            }
            for cidr in v.split(',').map(str::trim).filter(|c| !c.is_empty()) {
                valid_cidr(cidr).map_err(|r| err(key, v, r))?;
            }
        }
    }
    for key in [
        ann::INCLUDE_INBOUND_PORTS,
        ann::EXCLUDE_INBOUND_PORTS,
        ann::EXCLUDE_OUTBOUND_PORTS,
        ann::INCLUDE_OUTBOUND_PORTS,
    ] {
        if let Some(v) = a.get(key) {
            if key == ann::INCLUDE_INBOUND_PORTS && v == "*" {
                continue;
            }
            for port in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                port.parse::<u16>()
                    .map_err(|_| err(key, v, AnnotationValueError::NotPort(port.into())))?;
            }
        }
    }
    Ok(())
}

/// What is wrong with one item of a traffic annotation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationValueError {
    /// No `/` between address and prefix.
    #[error("{0:?} is not a CIDR (address/prefix)")]
    NotCidr(String),
    /// The address part is not an IP address.
    #[error("{0:?} is not an IP address")]
    NotIp(String),
    /// The prefix is not a length for the address's family.
    #[error("{len:?} is not a prefix length for {ip}")]
    PrefixLength {
        /// The prefix as written.
        len: String,
        /// The address.
        ip: IpAddr,
    },
    /// A port list item is not a port number.
    #[error("{0:?} is not a port number")]
    NotPort(String),
}

fn valid_cidr(cidr: &str) -> Result<(), AnnotationValueError> {
    let (ip, len) = cidr
        .split_once('/')
        .ok_or_else(|| AnnotationValueError::NotCidr(cidr.into()))?;
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| AnnotationValueError::NotIp(ip.into()))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    match len.parse::<u8>() {
        Ok(n) if n <= max => Ok(()),
        _ => Err(AnnotationValueError::PrefixLength {
            len: len.into(),
            ip,
        }),
    }
}
