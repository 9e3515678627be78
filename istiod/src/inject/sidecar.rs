//! Istio's default `sidecar` injection template, written as Rust.
//!
//! Each piece mirrors a block of the istio-discovery chart's `files/injection-template.yaml`
//! (the `istio-init` / `istio-validation` init container, the `istio-proxy` container as a
//! native sidecar or a regular container, the volumes, labels and annotations), driven by the
//! same inputs: Helm values, mesh config's `defaultConfig`, and the pod's annotations.
//! Rendering Go templates is not needed: only the default template is supported, and the
//! logic reads better as code than as a template engine port.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::{MeshSettings, Values, ann, quantity};

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
}

/// What the template adds to the pod, before it is merged in.
#[derive(Debug, Default)]
pub(crate) struct Rendered {
    pub labels: Vec<(String, String)>,
    pub annotations: Vec<(String, String)>,
    pub init_containers: Vec<Value>,
    pub containers: Vec<Value>,
    pub volumes: Vec<Value>,
    pub image_pull_secrets: Vec<Value>,
}

impl TemplateInput<'_> {
    /// `annotation .ObjectMeta key default`.
    fn annotation(&self, key: &str, default: String) -> String {
        self.annotations.get(key).cloned().unwrap_or(default)
    }

    fn interception_mode(&self) -> String {
        let default = self
            .proxy_config
            .get("interceptionMode")
            .and_then(Value::as_str)
            .unwrap_or("REDIRECT")
            .to_string();
        self.annotation(ann::INTERCEPTION_MODE, default)
    }

    fn status_port(&self) -> String {
        self.annotation(
            ann::STATUS_PORT,
            self.values.string("global.proxy.statusPort"),
        )
    }

    fn proxy_metadata(&self) -> Vec<(String, String)> {
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

    fn hold_application(&self) -> bool {
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

    fn app_container_names(&self) -> Vec<String> {
        self.containers
            .iter()
            .filter_map(|c| c.get("name").and_then(Value::as_str))
            .filter(|n| *n != super::PROXY_CONTAINER)
            .map(str::to_string)
            .collect()
    }

    fn proxy_uid(&self) -> i64 {
        1337
    }
}

/// Renders the template.
pub(crate) fn render(t: &TemplateInput<'_>) -> Rendered {
    let mut out = Rendered::default();
    let mode = t.interception_mode();
    let tproxy = mode == "TPROXY";
    let cni = t.values.bool("pilot.cni.enabled");
    let containers = t.app_container_names();

    // metadata.labels
    let tls_mode = label_or(t.labels, "security.istio.io/tlsMode", "istio");
    out.labels
        .push(("security.istio.io/tlsMode".into(), tls_mode));
    let md = t.proxy_metadata();
    if md
        .iter()
        .any(|(k, v)| k == "ISTIO_META_ENABLE_HBONE" && v == "true")
    {
        let tunnel = label_or(t.labels, "networking.istio.io/tunnel", "http");
        out.labels
            .push(("networking.istio.io/tunnel".into(), tunnel));
    }
    out.labels
        .push(("service.istio.io/canonical-name".into(), canonical_name(t)));
    let revision = [
        "service.istio.io/canonical-revision",
        "app.kubernetes.io/version",
        "version",
    ]
    .iter()
    .find_map(|k| t.labels.get(*k).filter(|v| !v.is_empty()).cloned())
    .unwrap_or_else(|| "latest".into());
    out.labels
        .push(("service.istio.io/canonical-revision".into(), revision));

    // metadata.annotations
    let rev = if t.revision.is_empty() {
        "default"
    } else {
        t.revision
    };
    out.annotations.push(("istio.io/rev".into(), rev.into()));
    if let Some(first) = containers.first() {
        for key in [
            "kubectl.kubernetes.io/default-logs-container",
            "kubectl.kubernetes.io/default-container",
        ] {
            if !t.annotations.contains_key(key) {
                out.annotations.push((key.into(), first.clone()));
            }
        }
    }
    if cni {
        cni_annotations(t, &mode, &mut out.annotations);
    }

    // spec.initContainers
    let no_init = mode == "NONE" && !t.native_sidecar;
    if !no_init && mode != "NONE" {
        out.init_containers
            .push(init_container(t, &mode, tproxy, cni, &md));
    }
    let proxy = proxy_container(t, &mode, tproxy, &containers, &md);
    if t.native_sidecar {
        out.init_containers.push(proxy);
    } else {
        out.containers.push(proxy);
    }
    out.volumes = volumes(t);
    if let Some(secrets) = t
        .values
        .get("global.imagePullSecrets")
        .and_then(Value::as_array)
    {
        out.image_pull_secrets = secrets
            .iter()
            .map(|s| json!({"name": scalar_string(s)}))
            .collect();
    }
    out
}

fn label_or(labels: &BTreeMap<String, String>, key: &str, default: &str) -> String {
    labels
        .get(key)
        .filter(|v| !v.is_empty())
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

/// `service.istio.io/canonical-name`: the first set of the canonical-name label,
/// `app.kubernetes.io/name`, `app`, the workload name; at most 63 characters, trimmed of
/// `-_.` at both ends.
fn canonical_name(t: &TemplateInput<'_>) -> String {
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

fn cni_annotations(t: &TemplateInput<'_>, mode: &str, out: &mut Vec<(String, String)>) {
    let v = t.values;
    if v.string("pilot.cni.provider") == "multus" {
        let existing = t
            .annotations
            .get("k8s.v1.cni.cncf.io/networks")
            .cloned()
            .unwrap_or_default();
        out.push((
            "k8s.v1.cni.cncf.io/networks".into(),
            append_multus_network(&existing, "default/istio-cni"),
        ));
    }
    out.push((ann::INTERCEPTION_MODE.into(), mode.into()));
    for (key, value) in [
        (
            ann::INCLUDE_OUTBOUND_IP_RANGES,
            "global.proxy.includeIPRanges",
        ),
        (
            ann::EXCLUDE_OUTBOUND_IP_RANGES,
            "global.proxy.excludeIPRanges",
        ),
    ] {
        let s = t.annotation(key, v.string(value));
        if !s.is_empty() {
            out.push((key.into(), s));
        }
    }
    out.push((
        ann::INCLUDE_INBOUND_PORTS.into(),
        t.annotation(
            ann::INCLUDE_INBOUND_PORTS,
            v.string("global.proxy.includeInboundPorts"),
        ),
    ));
    out.push((ann::EXCLUDE_INBOUND_PORTS.into(), excluded_inbound(t)));
    if t.annotations.contains_key(ann::INCLUDE_OUTBOUND_PORTS)
        || !v.string("global.proxy.includeOutboundPorts").is_empty()
    {
        out.push((
            ann::INCLUDE_OUTBOUND_PORTS.into(),
            t.annotation(
                ann::INCLUDE_OUTBOUND_PORTS,
                v.string("global.proxy.includeOutboundPorts"),
            ),
        ));
    }
    if t.annotations.contains_key(ann::EXCLUDE_OUTBOUND_PORTS)
        || !v.string("global.proxy.excludeOutboundPorts").is_empty()
    {
        out.push((
            ann::EXCLUDE_OUTBOUND_PORTS.into(),
            t.annotation(
                ann::EXCLUDE_OUTBOUND_PORTS,
                v.string("global.proxy.excludeOutboundPorts"),
            ),
        ));
    }
    for key in [
        ann::KUBEVIRT_INTERFACES,
        ann::REROUTE_VIRTUAL_INTERFACES,
        ann::EXCLUDE_INTERFACES,
    ] {
        if let Some(s) = t.annotations.get(key).filter(|s| !s.is_empty()) {
            out.push((key.into(), s.clone()));
        }
    }
}

/// Istio's `appendMultusNetwork`: adds `network` to a `k8s.v1.cni.cncf.io/networks` value
/// given as a comma list or as a JSON list of objects.
pub(crate) fn append_multus_network(existing: &str, network: &str) -> String {
    let trimmed = existing.trim();
    if trimmed.is_empty() {
        return network.to_string();
    }
    if trimmed.starts_with('[') {
        if let Ok(Value::Array(mut items)) = serde_json::from_str::<Value>(trimmed) {
            let present = items
                .iter()
                .any(|i| i.get("name").and_then(Value::as_str) == Some("istio-cni"));
            if !present {
                let (ns, name) = network.split_once('/').unwrap_or(("", network));
                items.push(json!({"name": name, "namespace": ns}));
            }
            return serde_json::to_string(&items).unwrap_or_else(|_| existing.to_string());
        }
        return existing.to_string();
    }
    let present = trimmed.split(',').any(|n| {
        let n = n.trim();
        n == network || n == "istio-cni"
    });
    if present {
        existing.to_string()
    } else {
        format!("{existing}, {network}")
    }
}

/// Istio's `excludeInboundPort`: the excluded inbound ports plus the status port.
fn excluded_inbound(t: &TemplateInput<'_>) -> String {
    let status = t.status_port().trim().to_string();
    let excluded = t.annotation(
        ann::EXCLUDE_INBOUND_PORTS,
        t.values.string("global.proxy.excludeInboundPorts"),
    );
    if status.is_empty() || status == "0" {
        return excluded;
    }
    let mut out = Vec::new();
    for port in excluded.split(',') {
        if port == status {
            return excluded;
        }
        let port = port.trim();
        if !port.is_empty() {
            out.push(port.to_string());
        }
    }
    out.push(status);
    out.join(",")
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
fn image(t: &TemplateInput<'_>, values_key: &str) -> String {
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
fn resources(t: &TemplateInput<'_>) -> Value {
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

fn init_container(
    t: &TemplateInput<'_>,
    mode: &str,
    tproxy: bool,
    cni: bool,
    md: &[(String, String)],
) -> Value {
    let v = t.values;
    let a = t.annotations;
    let uid = if tproxy { 1337 } else { t.proxy_uid() };
    let mut args: Vec<String> = vec!["istio-iptables".into()];
    let mut push = |k: &str, val: String| {
        args.push(k.into());
        args.push(val);
    };
    push("-p", t.mesh.proxy_listen_port.to_string());
    push("-z", t.mesh.proxy_inbound_listen_port.to_string());
    push("-u", uid.to_string());
    push("-m", mode.to_string());
    push(
        "-i",
        t.annotation(
            ann::INCLUDE_OUTBOUND_IP_RANGES,
            v.string("global.proxy.includeIPRanges"),
        ),
    );
    push(
        "-x",
        t.annotation(
            ann::EXCLUDE_OUTBOUND_IP_RANGES,
            v.string("global.proxy.excludeIPRanges"),
        ),
    );
    push(
        "-b",
        t.annotation(
            ann::INCLUDE_INBOUND_PORTS,
            v.string("global.proxy.includeInboundPorts"),
        ),
    );
    let excluded = excluded_inbound(t);
    push(
        "-d",
        if excluded.is_empty() {
            "15090,15021".into()
        } else {
            format!("15090,15021,{excluded}")
        },
    );
    if a.contains_key(ann::INCLUDE_OUTBOUND_PORTS)
        || !v.string("global.proxy.includeOutboundPorts").is_empty()
    {
        push(
            "-q",
            t.annotation(
                ann::INCLUDE_OUTBOUND_PORTS,
                v.string("global.proxy.includeOutboundPorts"),
            ),
        );
    }
    if a.contains_key(ann::EXCLUDE_OUTBOUND_PORTS)
        || !v.string("global.proxy.excludeOutboundPorts").is_empty()
    {
        push(
            "-o",
            t.annotation(
                ann::EXCLUDE_OUTBOUND_PORTS,
                v.string("global.proxy.excludeOutboundPorts"),
            ),
        );
    }
    if let Some(k) = a
        .get(ann::REROUTE_VIRTUAL_INTERFACES)
        .or_else(|| a.get(ann::KUBEVIRT_INTERFACES))
    {
        push("-k", k.clone());
    }
    if let Some(c) = a.get(ann::EXCLUDE_INTERFACES) {
        push("-c", c.clone());
    }
    args.push(format!(
        "--log_output_level={}",
        t.annotation(ann::AGENT_LOG_LEVEL, v.string("global.logging.level"))
    ));
    if v.bool("global.logAsJson") {
        args.push("--log_as_json".into());
    }
    if cni {
        args.push("--run-validation".into());
        args.push("--skip-rule-apply".into());
    } else if v.bool("global.proxy_init.forceApplyIptables") {
        args.push("--force-apply".into());
    }
    if v.bool("global.nativeNftables") {
        args.push("--native-nftables".into());
    }

    let mut c = Map::new();
    c.insert(
        "name".into(),
        json!(if cni {
            "istio-validation"
        } else {
            "istio-init"
        }),
    );
    c.insert("image".into(), json!(image(t, "global.proxy_init.image")));
    c.insert("args".into(), json!(args));
    let pull = v.string("global.imagePullPolicy");
    if !pull.is_empty() {
        c.insert("imagePullPolicy".into(), json!(pull));
    }
    if !md.is_empty() {
        c.insert(
            "env".into(),
            Value::Array(
                md.iter()
                    .map(|(k, v)| json!({"name": k, "value": v}))
                    .collect(),
            ),
        );
    }
    c.insert("resources".into(), resources(t));
    let privileged = v.bool("global.proxy.privileged");
    let mut sc = Map::new();
    sc.insert("allowPrivilegeEscalation".into(), json!(privileged));
    sc.insert("privileged".into(), json!(privileged));
    if cni {
        sc.insert("capabilities".into(), json!({"drop": ["ALL"]}));
        let id = if tproxy { 1337 } else { t.proxy_uid() };
        sc.insert("readOnlyRootFilesystem".into(), json!(true));
        sc.insert("runAsGroup".into(), json!(id));
        sc.insert("runAsUser".into(), json!(id));
        sc.insert("runAsNonRoot".into(), json!(true));
    } else {
        sc.insert(
            "capabilities".into(),
            json!({"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]}),
        );
        sc.insert("readOnlyRootFilesystem".into(), json!(false));
        sc.insert("runAsGroup".into(), json!(0));
        sc.insert("runAsNonRoot".into(), json!(false));
        sc.insert("runAsUser".into(), json!(0));
    }
    seccomp(v, &mut sc);
    c.insert("securityContext".into(), Value::Object(sc));
    Value::Object(c)
}

fn seccomp(v: &Values, sc: &mut Map<String, Value>) {
    if let Some(p) = v
        .get("global.proxy.seccompProfile")
        .filter(|p| p.as_object().is_some_and(|m| !m.is_empty()))
    {
        sc.insert("seccompProfile".into(), p.clone());
    }
}

fn env(name: &str, value: impl Into<String>) -> Value {
    json!({"name": name, "value": value.into()})
}

fn env_field(name: &str, path: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}})
}

fn env_resource(name: &str, resource: &str) -> Value {
    json!({"name": name, "valueFrom": {"resourceFieldRef": {"resource": resource, "divisor": "1"}}})
}

fn proxy_container(
    t: &TemplateInput<'_>,
    mode: &str,
    tproxy: bool,
    app_containers: &[String],
    md: &[(String, String)],
) -> Value {
    let v = t.values;
    let a = t.annotations;
    let status_port = t.status_port();
    let cap_net_bind = t.annotation(
        ann::CAP_NET_BIND_SERVICE,
        v.string("global.proxy.capNetBindService"),
    ) == "true";
    let mut c = Map::new();
    c.insert("name".into(), json!(super::PROXY_CONTAINER));
    c.insert("image".into(), json!(image(t, "global.proxy.image")));
    if t.native_sidecar {
        c.insert("restartPolicy".into(), json!("Always"));
    }
    c.insert(
        "ports".into(),
        json!([{"containerPort": 15090, "protocol": "TCP", "name": "http-envoy-prom"}]),
    );
    let mut args = vec![
        "proxy".to_string(),
        "sidecar".into(),
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
    let outlier = v.string("global.proxy.outlierLogPath");
    if !outlier.is_empty() {
        args.push(format!("--outlierLogPath={outlier}"));
    }
    c.insert("args".into(), json!(args));
    if let Some(l) = v
        .get("global.proxy.lifecycle")
        .filter(|l| l.as_object().is_some_and(|m| !m.is_empty()))
    {
        c.insert("lifecycle".into(), l.clone());
    } else if t.hold_application() {
        c.insert(
            "lifecycle".into(),
            json!({"postStart": {"exec": {"command": ["pilot-agent", "wait"]}}}),
        );
    } else if t.native_sidecar {
        c.insert(
            "lifecycle".into(),
            json!({"preStop": {"exec": {"command": [
                "pilot-agent", "request", format!("--debug-port={status_port}"), "POST", "drain"
            ]}}}),
        );
    }

    let mut e = Vec::new();
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
    e.push(env_resource("ISTIO_CPU_LIMIT", "limits.cpu"));
    e.push(env(
        "PROXY_CONFIG",
        format!("{}\n", proxy_config_json(t.proxy_config)),
    ));
    e.push(env("ISTIO_META_POD_PORTS", pod_ports(t.containers)));
    e.push(env("ISTIO_META_APP_CONTAINERS", app_containers.join(",")));
    e.push(env_resource("GOMEMLIMIT", "limits.memory"));
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
                .unwrap_or("REDIRECT")
                .to_string()
        });
    let _ = mode;
    e.push(env("ISTIO_META_INTERCEPTION_MODE", meta_mode));
    let network = v.string("global.network");
    if !network.is_empty() {
        e.push(env("ISTIO_META_NETWORK", network));
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
    if a.contains_key(ann::BOOTSTRAP_OVERRIDE) {
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
    if v.string("global.proxy.tracer") == "datadog"
        && let Some(Ok(Value::Object(m))) = a
            .get("apm.datadoghq.com/env")
            .map(|s| serde_json::from_str::<Value>(s))
    {
        for (k, val) in m {
            e.push(env(&k, scalar_string(&val)));
        }
    }
    for (k, val) in md {
        e.push(env(k, val.clone()));
    }
    c.insert("env".into(), Value::Array(e));
    let pull = v.string("global.imagePullPolicy");
    if !pull.is_empty() {
        c.insert("imagePullPolicy".into(), json!(pull));
    }
    if status_port != "0" {
        if v.bool("global.proxy.startupProbe.enabled") {
            c.insert(
                "startupProbe".into(),
                json!({
                    "httpGet": {"path": "/healthz/ready", "port": 15021},
                    "periodSeconds": 1,
                    "timeoutSeconds": 3,
                    "failureThreshold": number(&v.string("global.proxy.startupProbe.failureThreshold")),
                }),
            );
        }
        let mut probe = Map::new();
        probe.insert(
            "httpGet".into(),
            json!({"path": "/healthz/ready", "port": 15021}),
        );
        for (key, ann_key, value) in [
            (
                "initialDelaySeconds",
                ann::READINESS_INITIAL_DELAY,
                "global.proxy.readinessInitialDelaySeconds",
            ),
            (
                "periodSeconds",
                ann::READINESS_PERIOD,
                "global.proxy.readinessPeriodSeconds",
            ),
            (
                "failureThreshold",
                ann::READINESS_FAILURE_THRESHOLD,
                "global.proxy.readinessFailureThreshold",
            ),
        ] {
            let n = number(&t.annotation(ann_key, v.string(value)));
            // Go's omitempty drops a zero.
            if n != json!(0) {
                probe.insert(key.into(), n);
            }
        }
        probe.insert("timeoutSeconds".into(), json!(3));
        c.insert("readinessProbe".into(), Value::Object(probe));
    }
    let privileged = v.bool("global.proxy.privileged");
    let iptables_trace = md
        .iter()
        .any(|(k, v)| k == "IPTABLES_TRACE_LOGGING" && v == "true");
    let mut sc = Map::new();
    if iptables_trace {
        sc.insert("allowPrivilegeEscalation".into(), json!(true));
        sc.insert(
            "capabilities".into(),
            json!({"add": ["NET_ADMIN"], "drop": ["ALL"]}),
        );
        sc.insert("privileged".into(), json!(true));
        sc.insert("readOnlyRootFilesystem".into(), json!(true));
        sc.insert("runAsGroup".into(), json!(t.proxy_uid()));
        sc.insert("runAsNonRoot".into(), json!(false));
        sc.insert("runAsUser".into(), json!(0));
    } else {
        sc.insert("allowPrivilegeEscalation".into(), json!(privileged));
        let mut caps = Map::new();
        let mut add = Vec::new();
        if tproxy {
            add.push("NET_ADMIN");
        }
        if cap_net_bind {
            add.push("NET_BIND_SERVICE");
        }
        if !add.is_empty() {
            caps.insert("add".into(), json!(add));
        }
        caps.insert("drop".into(), json!(["ALL"]));
        sc.insert("capabilities".into(), Value::Object(caps));
        sc.insert("privileged".into(), json!(privileged));
        sc.insert("readOnlyRootFilesystem".into(), json!(true));
        if tproxy || cap_net_bind {
            sc.insert("runAsNonRoot".into(), json!(false));
            sc.insert("runAsUser".into(), json!(0));
            sc.insert("runAsGroup".into(), json!(1337));
        } else {
            sc.insert("runAsNonRoot".into(), json!(true));
            sc.insert("runAsUser".into(), json!(t.proxy_uid()));
            sc.insert("runAsGroup".into(), json!(t.proxy_uid()));
        }
    }
    seccomp(v, &mut sc);
    c.insert("securityContext".into(), Value::Object(sc));
    c.insert("resources".into(), resources(t));
    c.insert("volumeMounts".into(), volume_mounts(t));
    Value::Object(c)
}

fn volume_mounts(t: &TemplateInput<'_>) -> Value {
    let v = t.values;
    let mut m = vec![
        json!({"name": "workload-socket", "mountPath": "/var/run/secrets/workload-spiffe-uds"}),
        json!({"name": "credential-socket", "mountPath": "/var/run/secrets/credential-uds"}),
    ];
    if v.string("global.caName") == "GkeWorkloadCertificate" {
        m.push(json!({"name": "gke-workload-certificate", "mountPath": "/var/run/secrets/workload-spiffe-credentials", "readOnly": true}));
    } else {
        m.push(json!({"name": "workload-certs", "mountPath": "/var/run/secrets/workload-spiffe-credentials"}));
    }
    if v.string("global.pilotCertProvider") == "istiod" {
        m.push(json!({"mountPath": "/var/run/secrets/istio", "name": "istiod-ca-cert"}));
        m.push(json!({"mountPath": "/var/run/secrets/istio/crl", "name": "istio-ca-crl"}));
    }
    m.push(json!({"mountPath": "/var/lib/istio/data", "name": "istio-data"}));
    if t.annotations.contains_key(ann::BOOTSTRAP_OVERRIDE) {
        m.push(
            json!({"mountPath": "/etc/istio/custom-bootstrap", "name": "custom-bootstrap-volume"}),
        );
    }
    m.push(json!({"mountPath": "/etc/istio/proxy", "name": "istio-envoy"}));
    m.push(json!({"mountPath": "/var/run/secrets/tokens", "name": "istio-token"}));
    if v.bool("global.mountMtlsCerts") {
        m.push(json!({"mountPath": "/etc/certs/", "name": "istio-certs", "readOnly": true}));
    }
    m.push(json!({"name": "istio-podinfo", "mountPath": "/etc/istio/pod"}));
    if let Some(Ok(Value::Object(user))) = t
        .annotations
        .get(ann::USER_VOLUME_MOUNT)
        .map(|s| serde_json::from_str::<Value>(s))
    {
        for (name, spec) in user {
            let mut e = spec.as_object().cloned().unwrap_or_default();
            e.insert("name".into(), json!(name));
            m.push(Value::Object(e));
        }
    }
    Value::Array(m)
}

fn volumes(t: &TemplateInput<'_>) -> Vec<Value> {
    let v = t.values;
    let mut out = vec![
        json!({"name": "workload-socket"}),
        json!({"name": "credential-socket"}),
    ];
    if v.string("global.caName") == "GkeWorkloadCertificate" {
        out.push(json!({"name": "gke-workload-certificate", "csi": {"driver": "workloadcertificates.security.cloud.google.com"}}));
    } else {
        out.push(json!({"name": "workload-certs"}));
    }
    if let Some(cm) = t.annotations.get(ann::BOOTSTRAP_OVERRIDE) {
        out.push(json!({"name": "custom-bootstrap-volume", "configMap": {"name": cm}}));
    }
    out.push(json!({"name": "istio-envoy", "emptyDir": {"medium": "Memory"}}));
    out.push(json!({"name": "istio-data", "emptyDir": {}}));
    out.push(json!({"name": "istio-podinfo", "downwardAPI": {"items": [
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
    ]}}));
    out.push(json!({"name": "istio-token", "projected": {"sources": [{"serviceAccountToken": {
        "path": "istio-token", "expirationSeconds": 43200, "audience": v.string("global.sds.token.aud"),
    }}]}}));
    if v.string("global.pilotCertProvider") == "istiod" {
        let bundle = v.string("global.trustBundleName");
        if v.bool("pilot.env.ENABLE_CLUSTER_TRUST_BUNDLE_API") {
            let name = if bundle.is_empty() {
                "root-cert".to_string()
            } else {
                bundle
            };
            out.push(
                json!({"name": "istiod-ca-cert", "projected": {"sources": [{"clusterTrustBundle": {
                "name": format!("istio.io:istiod-ca:{name}"), "path": "root-cert.pem"}}]}}),
            );
        } else {
            let name = if bundle.is_empty() {
                "istio-ca-root-cert".to_string()
            } else {
                bundle
            };
            out.push(json!({"name": "istiod-ca-cert", "configMap": {"name": name}}));
        }
    }
    let crl = match v.string("pilot.crlConfigMapName") {
        s if s.is_empty() => "istio-ca-crl".to_string(),
        s => s,
    };
    out.push(json!({"name": "istio-ca-crl", "configMap": {"name": crl, "optional": true}}));
    if v.bool("global.mountMtlsCerts") {
        let secret = if t.service_account.is_empty() {
            "istio.default".to_string()
        } else {
            format!("istio.{}", t.service_account)
        };
        out.push(
            json!({"name": "istio-certs", "secret": {"optional": true, "secretName": secret}}),
        );
    }
    if let Some(Ok(Value::Object(user))) = t
        .annotations
        .get(ann::USER_VOLUME)
        .map(|s| serde_json::from_str::<Value>(s))
    {
        for (name, spec) in user {
            let mut e = spec.as_object().cloned().unwrap_or_default();
            e.insert("name".into(), json!(name));
            out.push(Value::Object(e));
        }
    }
    out
}

/// `ISTIO_META_POD_PORTS`: the app containers' ports as the template writes them, one
/// JSON object a line in Go's field order.
fn pod_ports(containers: &[Value]) -> String {
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
fn number(s: &str) -> Value {
    s.trim()
        .parse::<i64>()
        .map(Value::from)
        .unwrap_or_else(|_| json!(s))
}
