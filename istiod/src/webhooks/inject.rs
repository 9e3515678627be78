//! The sidecar injection webhook (`/inject`), as Istio's
//! `pkg/kube/inject/webhook.go`: a Pod under admission is checked against the
//! injector's policy and selectors ([`crate::inject::policy`]), injected
//! ([`crate::inject::inject_pod`]) and answered with the JSON patch from the
//! admitted Pod to the injected one.
//!
//! The injector's settings are Istio's: the `config` (policy, selectors,
//! `injectedAnnotations`, `defaultTemplates`) and `values` (the chart's
//! values, JSON) of the `istio-sidecar-injector` ConfigMap, read from the
//! files the chart mounts at `./var/lib/istio/inject/` when they exist, else
//! watched on the Kubernetes API; plus the mesh config in force. A change is
//! applied to the next request; a setting that does not parse is reported
//! and the last good one stays.
//!
//! Istio's choices kept on purpose:
//! - a Pod whose injection fails (a malformed traffic annotation, an unknown
//!   template) is refused with the reason, so its owner fixes it rather than
//!   running it outside the mesh;
//! - `/inject/cluster/<id>/net/<network>` path parameters set
//!   `ISTIO_META_CLUSTER_ID` and `ISTIO_META_NETWORK` (other keys become their
//!   upper-cased name, `--slash--` stands for `/`), replacing the template's
//!   value and appended in name order, as Istio's `updateClusterEnvs` does.
//!
//! What Istio leaves to the API server's `failurePolicy` we do too: an object
//! that is not a Pod is admitted unchanged, with a warning.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use common::metrics::{MetricsError, build, counter};
use k8s_openapi::api::core::v1::ConfigMap;
use prometheus::{Histogram, HistogramOpts, IntCounter, Registry};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use super::WebhookConfig;
use super::review::{self, AdmissionRequest, AdmissionResponse};
use crate::inject::policy::{self, Decision, PodFacts};
use crate::inject::{
    self, InjectionConfig, InjectorConfig, MeshSettings, Outcome, PROXY_CONTAINER, Values,
    WorkloadMeta,
};
use crate::mesh::Mesh;
use crate::model::Snapshot;
use crate::model::proxy_config::WorkloadProxyConfig;

/// How often the injector files are checked for changes.
const FILE_POLL: Duration = Duration::from_secs(2);

/// Istio's `sidecar_injection_*` metrics.
#[derive(Clone)]
pub struct InjectMetrics {
    requests: IntCounter,
    success: IntCounter,
    failure: IntCounter,
    skip: IntCounter,
    time: Histogram,
}

impl InjectMetrics {
    /// Registers the metrics in `registry`.
    pub fn new(registry: &Registry) -> Result<Self, MetricsError> {
        let time = build(
            registry,
            "sidecar_injection_time_seconds",
            Histogram::with_opts(
                HistogramOpts::new(
                    "sidecar_injection_time_seconds",
                    "Total time taken for injection in seconds.",
                )
                .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]),
            ),
        )?;
        Ok(Self {
            requests: counter(
                registry,
                "sidecar_injection_requests_total",
                "Total number of sidecar injection requests.",
            )?,
            success: counter(
                registry,
                "sidecar_injection_success_total",
                "Total number of successful sidecar injection requests.",
            )?,
            failure: counter(
                registry,
                "sidecar_injection_failure_total",
                "Total number of failed sidecar injection requests.",
            )?,
            skip: counter(
                registry,
                "sidecar_injection_skip_total",
                "Total number of skipped sidecar injection requests.",
            )?,
            time,
        })
    }
}

/// The injector's settings at one moment.
#[derive(Debug, Clone)]
pub struct InjectorState {
    /// The ConfigMap's `config`.
    pub config: InjectorConfig,
    /// Values, mesh settings and flags the templates read.
    pub injection: InjectionConfig,
}

impl InjectorState {
    /// The state the ConfigMap's `config` and `values` texts give under
    /// `mesh` and `settings` (what a live reload builds).
    pub fn from_texts(
        config: &str,
        values: &str,
        mesh: &Mesh,
        settings: &WebhookConfig,
    ) -> Result<Self, inject::InjectError> {
        let texts = InjectorTexts {
            config: config.to_string(),
            values: values.to_string(),
            origin: "the caller".into(),
        };
        build_state(&texts, mesh, settings)
    }
}

/// The `config` and `values` texts of the injector ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
struct InjectorTexts {
    config: String,
    values: String,
    origin: String,
}

/// The injection webhook's state.
pub struct Injector {
    state: watch::Receiver<Option<Arc<InjectorState>>>,
    metrics: InjectMetrics,
    config: Option<watch::Receiver<Arc<Snapshot>>>,
}

impl Injector {
    /// An injector whose settings come from `state`.
    pub fn new(state: watch::Receiver<Option<Arc<InjectorState>>>, metrics: InjectMetrics) -> Self {
        Self {
            state,
            metrics,
            config: None,
        }
    }

    /// Applies the ProxyConfig objects of the config store's snapshots to
    /// the Pods it injects, as Istio's injector does.
    pub fn with_config(mut self, snapshots: watch::Receiver<Arc<Snapshot>>) -> Self {
        self.config = Some(snapshots);
        self
    }

    /// Whether the injector has settings to inject with.
    pub fn is_ready(&self) -> bool {
        self.state.borrow().is_some()
    }

    /// Answers one admission request; `proxy_envs` come from the path.
    pub fn inject(
        &self,
        req: &AdmissionRequest,
        proxy_envs: &BTreeMap<String, String>,
    ) -> AdmissionResponse {
        self.metrics.requests.inc();
        let start = Instant::now();
        let response = self.decide(req, proxy_envs);
        self.metrics.time.observe(start.elapsed().as_secs_f64());
        response
    }

    fn decide(
        &self,
        req: &AdmissionRequest,
        proxy_envs: &BTreeMap<String, String>,
    ) -> AdmissionResponse {
        let Some(state) = self.state.borrow().clone() else {
            self.metrics.failure.inc();
            return AdmissionResponse::deny(
                &req.uid,
                "sidecar injector has no configuration yet (the istio-sidecar-injector ConfigMap, or ./var/lib/istio/inject/config and values)",
            );
        };
        let mut pod = req.object.clone();
        let is_pod = pod
            .get("kind")
            .and_then(Value::as_str)
            .is_none_or(|k| k == "Pod")
            && pod.get("metadata").is_some_and(Value::is_object);
        if !is_pod {
            self.metrics.skip.inc();
            let mut r = AdmissionResponse::allow(&req.uid);
            r.warnings.push(format!(
                "sidecar injector: not a Pod ({} {}); admitted unchanged",
                req.kind.kind, req.name
            ));
            return r;
        }
        if pod
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .is_empty()
        {
            pod["metadata"]["namespace"] = json!(req.namespace);
        }
        let labels = string_map(pod.pointer("/metadata/labels"));
        let annotations = string_map(pod.pointer("/metadata/annotations"));
        let facts = PodFacts {
            namespace: &req.namespace,
            labels: &labels,
            annotations: &annotations,
            host_network: pod.pointer("/spec/hostNetwork").and_then(Value::as_bool) == Some(true),
        };
        let decision = policy::inject_required(
            &facts,
            state.config.policy,
            &state.config.never_inject_selector,
            &state.config.always_inject_selector,
        );
        if decision != Decision::Inject {
            tracing::debug!(target: "inject", "skipping {}/{}: {decision:?}", req.namespace, pod_name(&pod));
            self.metrics.skip.inc();
            return AdmissionResponse::allow(&req.uid);
        }
        let mut workload = WorkloadMeta::from_pod(&pod);
        if let Some(config) = &self.config {
            let snapshot = config.borrow().clone();
            workload.proxy_config = WorkloadProxyConfig::lookup(&snapshot, &req.namespace, &labels);
        }
        match inject::inject_pod(&pod, &workload, &state.injection) {
            Ok(Outcome::Injected(mut injected)) => {
                update_cluster_envs(&mut injected, proxy_envs);
                let ops = inject::patch::diff(&pod, &injected);
                self.metrics.success.inc();
                tracing::debug!(target: "inject", "injected {}/{} ({} patch operations)", req.namespace, pod_name(&pod), ops.len());
                AdmissionResponse::patched(&req.uid, &ops)
            }
            Ok(Outcome::SkippedHostNetwork | Outcome::AlreadyInjected) => {
                self.metrics.skip.inc();
                AdmissionResponse::allow(&req.uid)
            }
            Err(e) => {
                self.metrics.failure.inc();
                tracing::warn!(target: "inject", "Pod injection failed for {}/{}: {e}", req.namespace, pod_name(&pod));
                AdmissionResponse::deny(&req.uid, format!("Pod injection failed: {e}"))
            }
        }
    }
}

fn pod_name(pod: &Value) -> &str {
    let meta = pod.get("metadata");
    meta.and_then(|m| m.get("name"))
        .or_else(|| meta.and_then(|m| m.get("generateName")))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// Istio's `parseInjectEnvs`: `/inject/k1/v1/k2/v2` (or the deprecated
/// `/inject/:ENV:K=V:ENV:...`) to proxy environment variables.
pub fn parse_inject_envs(path: &str) -> BTreeMap<String, String> {
    let path = path.trim_end_matches('/');
    let mut parts = path.splitn(3, '/');
    let (_, _, rest) = (parts.next(), parts.next(), parts.next());
    let mut pairs: Vec<String> = Vec::new();
    if let Some(rest) = rest {
        if rest.starts_with(":ENV:") {
            for pair in rest.split(":ENV:").skip(1) {
                if let Some((k, v)) = pair.split_once('=')
                    && !k.is_empty()
                {
                    pairs.push(k.into());
                    pairs.push(v.into());
                }
            }
        } else {
            pairs = rest
                .split('/')
                .enumerate()
                .map(|(i, s)| {
                    if i % 2 == 1 {
                        s.replace("--slash--", "/")
                    } else {
                        s.to_string()
                    }
                })
                .collect();
        }
    }
    let mut envs = BTreeMap::new();
    for kv in pairs.chunks(2) {
        let [k, v] = kv else {
            tracing::warn!(target: "inject", "odd number of inject env entries, ignoring the last key {}", kv[0]);
            break;
        };
        let env = match k.as_str() {
            "cluster" => "ISTIO_META_CLUSTER_ID".to_string(),
            "net" => "ISTIO_META_NETWORK".to_string(),
            other => other.to_ascii_uppercase(),
        };
        if !v.is_empty() {
            envs.insert(env, v.clone());
        }
    }
    envs
}

/// Istio's `updateClusterEnvs`: the proxy's variables named in `envs` are
/// replaced, and appended in name order.
fn update_cluster_envs(pod: &mut Value, envs: &BTreeMap<String, String>) {
    if envs.is_empty() {
        return;
    }
    for list in ["initContainers", "containers"] {
        let Some(Value::Array(containers)) = pod.pointer_mut(&format!("/spec/{list}")) else {
            continue;
        };
        for c in containers.iter_mut() {
            if c.get("name").and_then(Value::as_str) != Some(PROXY_CONTAINER) {
                continue;
            }
            let mut env: Vec<Value> = c
                .get("env")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            env.retain(|e| {
                e.get("name")
                    .and_then(Value::as_str)
                    .is_none_or(|n| !envs.contains_key(n))
            });
            env.extend(envs.iter().map(|(k, v)| json!({"name": k, "value": v})));
            c["env"] = Value::Array(env);
        }
    }
}

/// `POST /inject` and `/inject/...`.
pub async fn serve(
    State(injector): State<Arc<Injector>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err((status, message)) = super::validation::check_request(&headers, &body) {
        injector.metrics.failure.inc();
        return (status, message).into_response();
    }
    let response = match review::parse(&body) {
        Ok(req) => {
            let envs = parse_inject_envs(uri.path());
            let injector = injector.clone();
            // Injection is CPU work (a few hundred microseconds); keep it off
            // the threads that serve connections.
            match tokio::task::spawn_blocking(move || injector.inject(&req, &envs)).await {
                Ok(r) => r,
                Err(e) => {
                    return (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("injection task failed: {e}"),
                    )
                        .into_response();
                }
            }
        }
        Err(e) => {
            injector.metrics.failure.inc();
            AdmissionResponse::deny("", e.to_string())
        }
    };
    axum::Json(response.into_review()).into_response()
}

/// Builds the injector's state from the ConfigMap texts and the mesh config.
fn build_state(
    texts: &InjectorTexts,
    mesh: &Mesh,
    settings: &WebhookConfig,
) -> Result<InjectorState, inject::InjectError> {
    let config = InjectorConfig::parse(&texts.config)?;
    let values = Values::from_yaml(&texts.values)?;
    let mut injection = InjectionConfig::new(values);
    let m = &mesh.injection;
    let defaults = MeshSettings::default();
    injection.mesh = MeshSettings {
        default_config: m.default_config.clone(),
        trust_domain: mesh.trust_domain.clone().unwrap_or(defaults.trust_domain),
        enable_prometheus_merge: m
            .enable_prometheus_merge
            .unwrap_or(defaults.enable_prometheus_merge),
        proxy_listen_port: m.proxy_listen_port.unwrap_or(defaults.proxy_listen_port),
        proxy_inbound_listen_port: m
            .proxy_inbound_listen_port
            .unwrap_or(defaults.proxy_inbound_listen_port),
        inbound_traffic_policy_localhost: m.inbound_traffic_policy_localhost,
    };
    injection.native_sidecars = settings.native_sidecars.enabled();
    injection.revision.clone_from(&settings.revision);
    injection
        .compliance_policy
        .clone_from(&settings.compliance_policy);
    injection
        .default_templates
        .clone_from(&config.default_templates);
    injection
        .injected_annotations
        .clone_from(&config.injected_annotations);
    Ok(InjectorState { config, injection })
}

fn read_files(dir: &Path) -> Option<InjectorTexts> {
    let config = std::fs::read_to_string(dir.join("config")).ok()?;
    let values = std::fs::read_to_string(dir.join("values")).unwrap_or_default();
    Some(InjectorTexts {
        config,
        values,
        origin: dir.display().to_string(),
    })
}

fn stamp(dir: &Path) -> Vec<Option<(SystemTime, u64)>> {
    ["config", "values"]
        .iter()
        .map(|f| {
            std::fs::metadata(dir.join(f))
                .ok()
                .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()))
        })
        .collect()
}

/// Starts the injector's settings: from the files in `settings.injection_dir`
/// when they exist (checked for changes every two seconds), else from the
/// ConfigMap on Kubernetes; rebuilt when the mesh config changes.
pub fn start(
    settings: &WebhookConfig,
    namespace: &str,
    kube: Option<kube::Client>,
    mut mesh: watch::Receiver<Arc<Mesh>>,
    shutdown: watch::Receiver<bool>,
) -> watch::Receiver<Option<Arc<InjectorState>>> {
    let (texts_tx, mut texts_rx) = mpsc::channel::<Option<InjectorTexts>>(8);
    let dir = settings.injection_dir.clone();
    if read_files(&dir).is_some() {
        tracing::info!(target: "inject", "sidecar injector settings from {}", dir.display());
        tokio::spawn(poll_files(dir.clone(), texts_tx, shutdown.clone()));
    } else if let Some(client) = kube {
        tracing::info!(target: "inject", "sidecar injector settings from ConfigMap {namespace}/{}", settings.injector_configmap);
        tokio::spawn(watch_configmap(
            client,
            namespace.to_string(),
            settings.injector_configmap.clone(),
            texts_tx,
            shutdown.clone(),
        ));
    } else {
        tracing::info!(target: "inject", "no sidecar injector settings ({} has no config file and there is no Kubernetes API): /inject refuses requests", dir.display());
    }
    // From files, the first state is there before the webhook serves.
    let initial = read_files(&dir).and_then(|t| {
        build_state(&t, &mesh.borrow(), settings)
            .map_err(|e| tracing::error!(target: "inject", "sidecar injector settings from {}: {e}", t.origin))
            .ok()
    });
    let (state_tx, state_rx) = watch::channel(initial.map(Arc::new));
    let settings = settings.clone();
    tokio::spawn(async move {
        let mut texts: Option<InjectorTexts> = None;
        // Without a live mesh config (a file read at start) there are no changes to follow.
        let mut mesh_live = true;
        loop {
            tokio::select! {
                next = texts_rx.recv() => match next {
                    Some(t) => texts = t,
                    None => return,
                },
                changed = mesh.changed(), if mesh_live => if changed.is_err() {
                    mesh_live = false;
                    continue;
                },
            }
            let Some(t) = &texts else {
                state_tx.send_replace(None);
                continue;
            };
            let current = mesh.borrow().clone();
            match build_state(t, &current, &settings) {
                Ok(state) => {
                    tracing::info!(target: "inject", "sidecar injector settings applied from {}", t.origin);
                    state_tx.send_replace(Some(Arc::new(state)));
                }
                Err(e) => {
                    tracing::error!(target: "inject", "sidecar injector settings from {}: {e}; the last good settings stay", t.origin)
                }
            }
        }
    });
    state_rx
}

async fn poll_files(
    dir: PathBuf,
    tx: mpsc::Sender<Option<InjectorTexts>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last = None;
    loop {
        let now = stamp(&dir);
        if last.as_ref() != Some(&now) {
            last = Some(now);
            if tx.send(read_files(&dir)).await.is_err() {
                return;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(FILE_POLL) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}

fn texts_of(cm: &ConfigMap, origin: &str) -> InjectorTexts {
    let data = cm.data.clone().unwrap_or_default();
    InjectorTexts {
        config: data.get("config").cloned().unwrap_or_default(),
        values: data.get("values").cloned().unwrap_or_default(),
        origin: origin.to_string(),
    }
}

async fn watch_configmap(
    client: kube::Client,
    namespace: String,
    name: String,
    tx: mpsc::Sender<Option<InjectorTexts>>,
    shutdown: watch::Receiver<bool>,
) {
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, &namespace);
    let config = kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
    let origin = format!("ConfigMap {namespace}/{name}");
    let mut listed: Option<InjectorTexts> = None;
    crate::kube::run_watcher(
        origin.clone(),
        api,
        config,
        &tx,
        |event| {
            use kube::runtime::watcher::Event;
            match event {
                Event::Init => {
                    listed = None;
                    None
                }
                Event::InitApply(cm) => {
                    listed = Some(texts_of(&cm, &origin));
                    None
                }
                Event::InitDone => Some(listed.take()),
                Event::Apply(cm) => Some(Some(texts_of(&cm, &origin))),
                Event::Delete(_) => Some(None),
            }
        },
        shutdown,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_parameters_become_proxy_envs_as_istio_parses_them() {
        let envs = parse_inject_envs("/inject/cluster/c1/net/n--slash--1/");
        assert_eq!(envs.get("ISTIO_META_CLUSTER_ID").unwrap(), "c1");
        assert_eq!(envs.get("ISTIO_META_NETWORK").unwrap(), "n/1");
        let envs = parse_inject_envs("/inject/:ENV:cluster=c2:ENV:FOO=bar:ENV:=x");
        assert_eq!(envs.get("ISTIO_META_CLUSTER_ID").unwrap(), "c2");
        assert_eq!(envs.get("FOO").unwrap(), "bar");
        assert_eq!(envs.len(), 2);
        assert!(parse_inject_envs("/inject").is_empty());
        assert_eq!(parse_inject_envs("/inject/a/1/odd").len(), 1);
        assert!(parse_inject_envs("/inject/empty/").is_empty());
    }

    #[test]
    fn cluster_envs_replace_the_templates_and_are_appended_in_order() {
        let mut pod = json!({"spec": {"containers": [
            {"name": "app"},
            {"name": "istio-proxy", "env": [
                {"name": "ISTIO_META_CLUSTER_ID", "value": "Kubernetes"},
                {"name": "POD_NAME", "valueFrom": {}}]}]}});
        let envs = BTreeMap::from([
            ("ISTIO_META_NETWORK".to_string(), "n1".to_string()),
            ("ISTIO_META_CLUSTER_ID".to_string(), "c1".to_string()),
        ]);
        update_cluster_envs(&mut pod, &envs);
        let names: Vec<&str> = pod["spec"]["containers"][1]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["POD_NAME", "ISTIO_META_CLUSTER_ID", "ISTIO_META_NETWORK"]
        );
        assert_eq!(pod["spec"]["containers"][1]["env"][1]["value"], "c1");
        assert!(pod["spec"]["containers"][0].get("env").is_none());
    }
}
