//! Istio's `kube-gateway` template (the istio-discovery chart's
//! `files/kube-gateway.yaml`), written as Rust: the ServiceAccount,
//! Deployment and Service Istio's gateway deployment controller creates for
//! a Gateway API `Gateway` of class `istio`, and the customization it
//! allows (`spec.infrastructure.parametersRef` ConfigMap overlays, merged as
//! strategic merge patches).
//!
//! The Deployment runs `pilot-agent proxy router` with the chart's agent
//! arguments, environment, ports, probes and volumes; everything carries the
//! Gateway's `infrastructure` labels and annotations, the
//! `gateway.networking.k8s.io/gateway-name` label and an owner reference to
//! the Gateway, as Istio writes them.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::template::{self, TemplateInput, env, env_field, env_resource, scalar_string};
use super::{MeshSettings, Values};

/// The label naming a Gateway on its generated objects and Pods.
pub const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
/// The label naming a Gateway's class on its generated objects.
pub const GATEWAY_CLASS_LABEL: &str = "gateway.networking.k8s.io/gateway-class-name";
/// The label Istio's gateway controller marks what it manages with.
pub const MANAGED_LABEL: &str = "gateway.istio.io/managed";
/// Its value: the controller name with `/` replaced by `-`.
pub const MANAGED_VALUE: &str = "istio.io-gateway-controller";

/// Annotations never copied from the Gateway to what it generates.
const OMITTED_ANNOTATIONS: [&str; 4] = [
    "kubectl.kubernetes.io/last-applied-configuration",
    "gateway.istio.io/name-override",
    "gateway.istio.io/service-account",
    "gateway.istio.io/controller-version",
];

pub use crate::model::gateway_api::infrastructure::{Infrastructure, ParametersRef};

/// Why the generated objects could not be rendered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KubeGatewayError {
    /// A customization names a key Istio does not support.
    #[error(
        "unsupported overlay {0:?} (supported: deployment, horizontalPodAutoscaler, podDisruptionBudget, service, serviceAccount)"
    )]
    UnsupportedOverlay(String),
    /// A customization is not YAML, or not an object.
    #[error("overlay {key:?}: {reason}")]
    BadOverlay {
        /// The ConfigMap key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A customization changes what must stay (name, namespace, owner).
    #[error("overlay {0:?}: illegal metadata change")]
    IllegalMetadataChange(String),
    /// A customization uses a strategic merge directive this istiod does
    /// not apply.
    #[error("overlay {key:?}: the directive {directive:?} is not implemented by this istiod")]
    Directive {
        /// The ConfigMap key.
        key: String,
        /// The `$...` key.
        directive: String,
    },
}

/// Istio's annotation naming the generated Deployment and Service.
pub const NAME_OVERRIDE_ANNOTATION: &str = "gateway.istio.io/name-override";
/// Istio's annotation naming the generated ServiceAccount.
pub const SERVICE_ACCOUNT_ANNOTATION: &str = "gateway.istio.io/service-account";
/// Istio's annotation choosing the Service's type.
pub const SERVICE_TYPE_ANNOTATION: &str = "networking.istio.io/service-type";

/// What the controller knows of a Gateway, as the template's inputs come
/// from it.
#[derive(Debug, Clone, Default)]
pub struct GatewayFacts {
    /// Its name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its uid.
    pub uid: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its annotations.
    pub annotations: BTreeMap<String, String>,
    /// `spec.gatewayClassName`.
    pub class: String,
    /// Each listener's name, port and protocol.
    pub listeners: Vec<(String, u32, String)>,
    /// `spec.addresses[*].value`.
    pub addresses: Vec<String>,
    /// `spec.infrastructure`.
    pub infrastructure: Option<Infrastructure>,
}

/// The template inputs derived from a Gateway (Istio's
/// `configureIstioGateway`): names, ports, Service type, infrastructure
/// labels and annotations.
#[derive(Debug, Clone, PartialEq)]
pub struct Derived {
    /// The Deployment and Service name (`<name>-<class>` unless overridden).
    pub deployment_name: String,
    /// The ServiceAccount name (same default).
    pub service_account: String,
    /// The Service's ports.
    pub ports: Vec<Value>,
    /// `LoadBalancer` unless the annotation says otherwise.
    pub service_type: String,
    /// Labels for the generated objects.
    pub infra_labels: BTreeMap<String, String>,
    /// Annotations for the generated objects.
    pub infra_annotations: BTreeMap<String, String>,
}

/// Derives the template inputs; `copy_labels_annotations` is
/// `PILOT_ENABLE_GATEWAY_API_COPY_LABELS_ANNOTATIONS`.
pub fn derive(gw: &GatewayFacts, copy_labels_annotations: bool) -> Derived {
    let default_name = format!("{}-{}", gw.name, gw.class);
    let pick = |key: &str| {
        gw.annotations
            .get(key)
            .filter(|v| !v.is_empty())
            .cloned()
            .unwrap_or_else(|| default_name.clone())
    };
    let infra = gw.infrastructure.clone().unwrap_or_default();
    let meta = |given: Option<BTreeMap<String, String>>, own: &BTreeMap<String, String>| match given
    {
        Some(m) => m
            .into_iter()
            .filter(|(k, _)| !k.starts_with("gateway.networking.k8s.io/"))
            .collect(),
        None if copy_labels_annotations => own.clone(),
        None => BTreeMap::new(),
    };
    Derived {
        deployment_name: pick(NAME_OVERRIDE_ANNOTATION),
        service_account: pick(SERVICE_ACCOUNT_ANNOTATION),
        ports: service_ports(&gw.listeners),
        service_type: gw
            .annotations
            .get(SERVICE_TYPE_ANNOTATION)
            .cloned()
            .unwrap_or_else(|| "LoadBalancer".into()),
        infra_labels: meta(infra.labels, &gw.labels),
        infra_annotations: meta(infra.annotations, &gw.annotations),
    }
}

/// Whether Istio deploys this Gateway (`IsManaged`, with
/// `ENABLE_GATEWAY_API_MANUAL_DEPLOYMENT` at its default): no address, or
/// one IP address; a `Hostname` address names a gateway deployed by hand.
pub fn is_managed(address_types: &[Option<String>]) -> bool {
    match address_types {
        [] => true,
        [one] => one.as_deref().is_none_or(|t| t == "IPAddress"),
        _ => false,
    }
}

/// The Service's ports (Istio's `extractServicePorts`): the status port,
/// then one per listener port (first listener wins), named after the
/// listener, `appProtocol` its protocol in lower case.
pub fn service_ports(listeners: &[(String, u32, String)]) -> Vec<Value> {
    let mut out = vec![
        json!({"name": "status-port", "port": 15021, "protocol": "TCP", "appProtocol": "tcp"}),
    ];
    let mut used: Vec<String> = vec!["status-port".into()];
    let mut ports = Vec::new();
    for (i, (name, port, protocol)) in listeners.iter().enumerate() {
        if ports.contains(port) {
            continue;
        }
        ports.push(*port);
        let mut n: String = name.replace('.', "-").chars().take(63).collect();
        if n.is_empty() {
            n = format!("{}-{i}", protocol.to_lowercase());
        }
        let n = unique_port_name(&n, *port, &mut used);
        out.push(json!({"name": n, "port": port, "protocol": "TCP", "appProtocol": protocol.to_lowercase()}));
    }
    out
}

fn unique_port_name(name: &str, port: u32, used: &mut Vec<String>) -> String {
    let name: String = name.chars().take(63).collect();
    let mut candidate = name.clone();
    let mut suffix = format!("-{port}");
    while used.contains(&candidate) {
        let keep = 63usize.saturating_sub(suffix.len()).min(name.len());
        candidate = format!("{}{suffix}", &name[..keep]);
        suffix.push('x');
    }
    used.push(candidate.clone());
    candidate
}

/// What the template reads (Istio's `TemplateInput` and `derivedInput`).
pub struct KubeGatewayInput<'a> {
    /// The Gateway's name, namespace and uid.
    pub name: &'a str,
    /// Its namespace.
    pub namespace: &'a str,
    /// Its uid (the owner references').
    pub uid: &'a str,
    /// Its class.
    pub class: &'a str,
    /// Its own annotations (`sidecar.istio.io/*` read from them).
    pub gateway_annotations: &'a BTreeMap<String, String>,
    /// The Deployment and Service name.
    pub deployment_name: String,
    /// The ServiceAccount name.
    pub service_account: String,
    /// The Service's ports.
    pub ports: Vec<Value>,
    /// The Service's type.
    pub service_type: String,
    /// The first requested address (`loadBalancerIP` of a LoadBalancer).
    pub address: Option<String>,
    /// `--clusterID`.
    pub cluster_id: &'a str,
    /// istiod's revision.
    pub revision: &'a str,
    /// The labels for every generated object.
    pub infra_labels: BTreeMap<String, String>,
    /// The annotations for every generated object.
    pub infra_annotations: BTreeMap<String, String>,
    /// Chart values (the injector ConfigMap's).
    pub values: &'a Values,
    /// The mesh settings injection reads.
    pub mesh: &'a MeshSettings,
    /// The effective ProxyConfig (non-default fields).
    pub proxy_config: &'a Map<String, Value>,
}

fn owner(t: &KubeGatewayInput<'_>) -> Value {
    json!([{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "name": t.name, "uid": t.uid}])
}

fn metadata(t: &KubeGatewayInput<'_>, name: &str) -> Value {
    let mut labels = t.infra_labels.clone();
    labels.insert(GATEWAY_NAME_LABEL.into(), t.name.into());
    labels.insert(GATEWAY_CLASS_LABEL.into(), t.class.into());
    // The controller marks every object it applies.
    labels.insert(MANAGED_LABEL.into(), MANAGED_VALUE.into());
    json!({"name": name, "namespace": t.namespace, "annotations": annotations(t),
        "labels": labels, "ownerReferences": owner(t)})
}

fn annotations(t: &KubeGatewayInput<'_>) -> BTreeMap<String, String> {
    let mut a = t.infra_annotations.clone();
    a.retain(|k, _| !OMITTED_ANNOTATIONS.contains(&k.as_str()));
    a
}

/// The ServiceAccount, Deployment and Service, in the template's order.
pub fn render(t: &KubeGatewayInput<'_>) -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": metadata(t, &t.service_account)}),
        deployment(t),
        service(t),
    ]
}

fn service(t: &KubeGatewayInput<'_>) -> Value {
    let mut spec = json!({
        "ipFamilyPolicy": "PreferDualStack",
        "ports": t.ports,
        "selector": {GATEWAY_NAME_LABEL: t.name},
        "type": t.service_type,
    });
    if let Some(ip) = t
        .address
        .as_ref()
        .filter(|_| t.service_type == "LoadBalancer")
    {
        spec["loadBalancerIP"] = json!(ip);
    }
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": metadata(t, &t.deployment_name), "spec": spec})
}

fn deployment(t: &KubeGatewayInput<'_>) -> Value {
    let mut pod_annotations = annotations(t);
    let rev = if t.revision.is_empty() {
        "default"
    } else {
        t.revision
    };
    for (k, v) in [
        ("istio.io/rev", rev),
        ("prometheus.io/path", "/stats/prometheus"),
        ("prometheus.io/port", "15020"),
        ("prometheus.io/scrape", "true"),
    ] {
        pod_annotations.insert(k.into(), v.into());
    }
    let mut pod_labels: BTreeMap<String, String> = [
        ("sidecar.istio.io/inject", "false"),
        (
            "service.istio.io/canonical-name",
            t.deployment_name.as_str(),
        ),
        ("service.istio.io/canonical-revision", "latest"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    pod_labels.extend(t.infra_labels.clone());
    pod_labels.insert(GATEWAY_NAME_LABEL.into(), t.name.into());
    pod_labels.insert(GATEWAY_CLASS_LABEL.into(), t.class.into());
    pod_labels.insert(MANAGED_LABEL.into(), MANAGED_VALUE.into());
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": metadata(t, &t.deployment_name),
        "spec": {
            "selector": {"matchLabels": {GATEWAY_NAME_LABEL: t.name}},
            "template": {
                "metadata": {"annotations": pod_annotations, "labels": pod_labels},
                "spec": pod_spec(t),
            }
        }
    })
}

fn pod_spec(t: &KubeGatewayInput<'_>) -> Value {
    let v = t.values;
    let mut spec = Map::new();
    let custom = v
        .get("gateways.securityContext")
        .filter(|sc| sc.as_object().is_some_and(|m| !m.is_empty()));
    let security = match custom {
        Some(sc) => sc.clone(),
        None => {
            let mut sc =
                json!({"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]});
            if let Some(p) = v
                .get("gateways.seccompProfile")
                .filter(|p| p.as_object().is_some_and(|m| !m.is_empty()))
            {
                sc["seccompProfile"] = p.clone();
            }
            sc
        }
    };
    spec.insert("securityContext".into(), security);
    spec.insert("serviceAccountName".into(), json!(t.service_account));
    spec.insert("containers".into(), json!([container(t)]));
    spec.insert("volumes".into(), Value::Array(volumes(v)));
    if let Some(secrets) = v
        .get("global.imagePullSecrets")
        .and_then(Value::as_array)
        .filter(|s| !s.is_empty())
    {
        let list: Vec<Value> = secrets
            .iter()
            .map(|s| json!({"name": scalar_string(s)}))
            .collect();
        spec.insert("imagePullSecrets".into(), Value::Array(list));
    }
    Value::Object(spec)
}

/// The template input the shared helpers (image, ProxyConfig) read.
fn shared_input<'a>(
    t: &'a KubeGatewayInput<'a>,
    labels: &'a BTreeMap<String, String>,
) -> TemplateInput<'a> {
    TemplateInput {
        values: t.values,
        mesh: t.mesh,
        proxy_config: t.proxy_config,
        annotations: t.gateway_annotations,
        labels,
        containers: &[],
        service_account: &t.service_account,
        deploy_name: &t.deployment_name,
        deploy_namespace: t.namespace,
        api_version: "apps/v1",
        kind: "Deployment",
        native_sidecar: false,
        revision: t.revision,
        compliance_policy: None,
        proxy_uid: None,
        proxy_gid: None,
        uid_from_user: false,
    }
}

fn container(t: &KubeGatewayInput<'_>) -> Value {
    let v = t.values;
    let labels = BTreeMap::new();
    let shared = shared_input(t, &labels);
    let ann = |key: &str, value_key: &str| shared.annotation(key, v.string(value_key));
    let mut c = Map::new();
    c.insert("name".into(), json!(super::PROXY_CONTAINER));
    c.insert(
        "image".into(),
        json!(template::image(&shared, "global.proxy.image")),
    );
    if let Some(r) = v
        .get("global.proxy.resources")
        .filter(|r| r.as_object().is_some_and(|m| !m.is_empty()))
    {
        c.insert("resources".into(), omit_nil(r));
    }
    let pull = v.string("global.imagePullPolicy");
    if !pull.is_empty() {
        c.insert("imagePullPolicy".into(), json!(pull));
    }
    c.insert(
        "securityContext".into(),
        json!({"capabilities": {"drop": ["ALL"]}, "allowPrivilegeEscalation": false,
            "privileged": false, "readOnlyRootFilesystem": true,
            "runAsUser": shared.proxy_uid(), "runAsGroup": shared.proxy_gid(), "runAsNonRoot": true}),
    );
    c.insert(
        "ports".into(),
        json!([
            {"containerPort": 15020, "name": "metrics", "protocol": "TCP"},
            {"containerPort": 15021, "name": "status-port", "protocol": "TCP"},
            {"containerPort": 15090, "protocol": "TCP", "name": "http-envoy-prom"},
        ]),
    );
    let mut args = vec![
        "proxy".to_string(),
        "router".into(),
        "--domain".into(),
        format!(
            "$(POD_NAMESPACE).svc.{}",
            v.string("global.proxy.clusterDomain")
        ),
        "--proxyLogLevel".into(),
        ann(super::ann::LOG_LEVEL, "global.proxy.logLevel"),
        "--proxyComponentLogLevel".into(),
        ann(
            super::ann::COMPONENT_LOG_LEVEL,
            "global.proxy.componentLogLevel",
        ),
        "--log_output_level".into(),
        ann(super::ann::AGENT_LOG_LEVEL, "global.logging.level"),
    ];
    let sts = v.string("global.sts.servicePort");
    if !sts.is_empty() && sts != "0" {
        args.push(format!("--stsPort={sts}"));
    }
    if v.bool("global.logAsJson") {
        args.push("--log_as_json".into());
    }
    c.insert("args".into(), json!(args));
    if let Some(l) = v
        .get("global.proxy.lifecycle")
        .filter(|l| l.as_object().is_some_and(|m| !m.is_empty()))
    {
        c.insert("lifecycle".into(), l.clone());
    }
    c.insert("env".into(), Value::Array(container_env(t, &shared)));
    let probe = |threshold: i64, delay: i64, period: i64| {
        json!({"failureThreshold": threshold, "httpGet": {"path": "/healthz/ready", "port": 15021, "scheme": "HTTP"},
            "initialDelaySeconds": delay, "periodSeconds": period, "successThreshold": 1, "timeoutSeconds": 1})
    };
    c.insert("startupProbe".into(), probe(30, 1, 1));
    c.insert("readinessProbe".into(), probe(4, 0, 15));
    c.insert("volumeMounts".into(), Value::Array(volume_mounts(v)));
    Value::Object(c)
}

fn container_env(t: &KubeGatewayInput<'_>, shared: &TemplateInput<'_>) -> Vec<Value> {
    let v = t.values;
    let mut e = vec![env(
        "PILOT_CERT_PROVIDER",
        v.string("global.pilotCertProvider"),
    )];
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
        format!("{}\n", template::proxy_config_json(t.proxy_config)),
    ));
    e.push(env("ISTIO_META_POD_PORTS", "[]"));
    e.push(env("ISTIO_META_APP_CONTAINERS", ""));
    e.push(env_resource("GOMEMLIMIT", "limits.memory"));
    let cluster = match v.string("global.multiCluster.clusterName") {
        s if s.is_empty() => t.cluster_id.to_string(),
        s => s,
    };
    e.push(env("ISTIO_META_CLUSTER_ID", cluster));
    e.push(env_field("ISTIO_META_NODE_NAME", "spec.nodeName"));
    let mode = t
        .proxy_config
        .get("interceptionMode")
        .and_then(Value::as_str)
        .unwrap_or(common::InterceptionMode::Redirect.as_str());
    e.push(env("ISTIO_META_INTERCEPTION_MODE", mode));
    let network_label = t.infra_labels.get("topology.istio.io/network").cloned();
    let network = network_label
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| v.string("global.network"));
    if !network.is_empty() {
        e.push(env("ISTIO_META_NETWORK", network));
    }
    e.push(env("ISTIO_META_WORKLOAD_NAME", t.deployment_name.clone()));
    e.push(env(
        "ISTIO_META_OWNER",
        format!(
            "kubernetes://apis/apps/v1/namespaces/{}/deployments/{}",
            t.namespace, t.deployment_name
        ),
    ));
    let trust_domain = if t.mesh.trust_domain.is_empty() {
        v.string("global.trustDomain")
    } else {
        t.mesh.trust_domain.clone()
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
    for (k, val) in shared.proxy_metadata() {
        e.push(env(&k, val));
    }
    if let Some(n) = network_label.filter(|n| !n.is_empty()) {
        e.push(env("ISTIO_META_REQUESTED_NETWORK_VIEW", n));
    }
    e
}

fn gke(v: &Values) -> bool {
    v.string("global.caName") == "GkeWorkloadCertificate"
}

fn volume_mounts(v: &Values) -> Vec<Value> {
    let mut m = vec![
        json!({"name": "workload-socket", "mountPath": "/var/run/secrets/workload-spiffe-uds"}),
        json!({"name": "credential-socket", "mountPath": "/var/run/secrets/credential-uds"}),
    ];
    m.push(if gke(v) {
        json!({"name": "gke-workload-certificate", "mountPath": "/var/run/secrets/workload-spiffe-credentials", "readOnly": true})
    } else {
        json!({"name": "workload-certs", "mountPath": "/var/run/secrets/workload-spiffe-credentials"})
    });
    if v.string("global.pilotCertProvider") == "istiod" {
        m.push(json!({"mountPath": "/var/run/secrets/istio", "name": "istiod-ca-cert"}));
    }
    m.extend([
        json!({"mountPath": "/var/lib/istio/data", "name": "istio-data"}),
        json!({"mountPath": "/etc/istio/proxy", "name": "istio-envoy"}),
        json!({"mountPath": "/var/run/secrets/tokens", "name": "istio-token"}),
        json!({"name": "istio-podinfo", "mountPath": "/etc/istio/pod"}),
    ]);
    m
}

fn volumes(v: &Values) -> Vec<Value> {
    let mut out = vec![
        json!({"emptyDir": null, "name": "workload-socket"}),
        json!({"emptyDir": {}, "name": "credential-socket"}),
    ];
    out.push(if gke(v) {
        json!({"name": "gke-workload-certificate", "csi": {"driver": "workloadcertificates.security.cloud.google.com"}})
    } else {
        json!({"emptyDir": {}, "name": "workload-certs"})
    });
    out.push(json!({"emptyDir": {"medium": "Memory"}, "name": "istio-envoy"}));
    out.push(json!({"name": "istio-data", "emptyDir": {}}));
    out.push(json!({"name": "istio-podinfo", "downwardAPI": {"items": [
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
    ]}}));
    out.push(
        json!({"name": "istio-token", "projected": {"sources": [{"serviceAccountToken": {
        "path": "istio-token", "expirationSeconds": 43200,
        "audience": v.string("global.sds.token.aud")}}]}}),
    );
    if let Some(ca) = template::istiod_ca_volume(v) {
        out.push(ca);
    }
    out
}

/// `omitNil`: the map without null values, at every depth.
fn omit_nil(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, x)| !x.is_null())
                .map(|(k, x)| (k.clone(), omit_nil(x)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The overlay key of a generated object's kind.
fn overlay_key(kind: &str) -> &'static str {
    match kind {
        "Deployment" => "deployment",
        "Service" => "service",
        "ServiceAccount" => "serviceAccount",
        "HorizontalPodAutoscaler" => "horizontalPodAutoscaler",
        _ => "podDisruptionBudget",
    }
}

const SUPPORTED_OVERLAYS: [&str; 5] = [
    "deployment",
    "service",
    "serviceAccount",
    "horizontalPodAutoscaler",
    "podDisruptionBudget",
];

/// The objects an overlay alone brings (Istio renders a
/// HorizontalPodAutoscaler and a PodDisruptionBudget, and keeps them only
/// when a customization patches them).
fn optional_objects(t: &KubeGatewayInput<'_>) -> Vec<Value> {
    vec![
        json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": metadata(t, &t.deployment_name),
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": t.deployment_name},
                "maxReplicas": 1}}),
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": metadata(t, &t.deployment_name),
            "spec": {"selector": {"matchLabels": {GATEWAY_NAME_LABEL: t.name}}}}),
    ]
}

/// The objects for `t` with `overlays` (the class defaults' ConfigMap data,
/// then the `parametersRef` ConfigMap's) merged over them, as Istio's
/// `applyOverlay` does.
pub fn render_with_overlays(
    t: &KubeGatewayInput<'_>,
    overlays: &[BTreeMap<String, String>],
) -> Result<Vec<Value>, KubeGatewayError> {
    let mut parsed: Vec<BTreeMap<String, Value>> = Vec::new();
    for o in overlays {
        let mut m = BTreeMap::new();
        for (k, text) in o {
            if !SUPPORTED_OVERLAYS.contains(&k.as_str()) {
                return Err(KubeGatewayError::UnsupportedOverlay(k.clone()));
            }
            let v: Value =
                serde_yaml_ng::from_str(text).map_err(|e| KubeGatewayError::BadOverlay {
                    key: k.clone(),
                    reason: e.to_string(),
                })?;
            let v = if v.is_null() { json!({}) } else { v };
            if !v.is_object() {
                return Err(KubeGatewayError::BadOverlay {
                    key: k.clone(),
                    reason: "not an object".into(),
                });
            }
            if let Some(d) = directive(&v) {
                return Err(KubeGatewayError::Directive {
                    key: k.clone(),
                    directive: d,
                });
            }
            m.insert(k.clone(), v);
        }
        parsed.push(m);
    }
    let mut out = Vec::new();
    let required = optional_objects(t);
    for (obj, optional) in render(t)
        .into_iter()
        .map(|o| (o, false))
        .chain(required.into_iter().map(|o| (o, true)))
    {
        let key = overlay_key(obj["kind"].as_str().unwrap_or_default());
        let mut merged = obj.clone();
        let mut applied = false;
        for o in &parsed {
            if let Some(patch) = o.get(key) {
                strategic_merge(&mut merged, patch, "");
                applied = true;
            }
        }
        if optional && !applied {
            continue;
        }
        let fixed = [
            "name",
            "namespace",
            "ownerReferences",
            "uid",
            "resourceVersion",
            "generation",
        ];
        if fixed
            .iter()
            .any(|f| merged["metadata"].get(*f) != obj["metadata"].get(*f))
            || merged["metadata"].get("managedFields").is_some()
        {
            return Err(KubeGatewayError::IllegalMetadataChange(key.to_string()));
        }
        out.push(merged);
    }
    Ok(out)
}

/// The first `$...` key (a strategic merge directive) in `v`.
fn directive(v: &Value) -> Option<String> {
    match v {
        Value::Object(m) => m.iter().find_map(|(k, x)| {
            if k.starts_with('$') {
                Some(k.clone())
            } else {
                directive(x)
            }
        }),
        Value::Array(a) => a.iter().find_map(directive),
        _ => None,
    }
}

/// The merge key of a list at `path` (its parent's field names joined by
/// `.`), as Kubernetes' strategic merge patch defines it for these types.
fn merge_key(path: &str) -> Option<&'static str> {
    let last = path.rsplit('.').next().unwrap_or(path);
    match last {
        "containers" | "initContainers" | "volumes" | "env" | "imagePullSecrets" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "ports" if path.ends_with("spec.ports") && !path.contains("containers") => Some("port"),
        "ports" => Some("containerPort"),
        "tolerations" | "topologySpreadConstraints" => None,
        _ => None,
    }
}

/// Strategic merge of `patch` into `target`: maps key by key (a null
/// deletes), lists with a merge key item by item (new items appended),
/// other lists and scalars replaced.
fn strategic_merge(target: &mut Value, patch: &Value, path: &str) {
    let (Value::Object(t), Value::Object(p)) = (&mut *target, patch) else {
        *target = patch.clone();
        return;
    };
    for (k, v) in p {
        let here = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match (t.get_mut(k), merge_key(&here), v) {
            (Some(Value::Array(existing)), Some(key), Value::Array(items)) => {
                for item in items {
                    match existing
                        .iter_mut()
                        .find(|e| e.get(key).is_some() && e.get(key) == item.get(key))
                    {
                        Some(e) => strategic_merge(e, item, &here),
                        None => existing.push(item.clone()),
                    }
                }
            }
            (Some(existing), _, Value::Object(_)) if existing.is_object() => {
                strategic_merge(existing, v, &here)
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

#[cfg(test)]
#[path = "kube_gateway_tests.rs"]
mod tests;
