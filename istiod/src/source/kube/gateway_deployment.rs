//! Istio's gateway deployment controller
//! (`pilot/pkg/config/kube/gatewaycommon/deploymentcontroller.go`): for
//! every Gateway API `Gateway` whose class is served by
//! `istio.io/gateway-controller` (a GatewayClass naming it, or the built-in
//! class `istio`) and that asks for no address of its own (or one IP),
//! istiod server-side applies (field manager `istio.io/gateway-controller`,
//! forced) the objects of Istio's `kube-gateway` template
//! ([`crate::inject::kube_gateway`]): a ServiceAccount, a Deployment running
//! `pilot-agent proxy router`, and a Service whose ports are the
//! listeners', all owned by the Gateway (deleting it deletes them, by the
//! API's garbage collection). Customizations come from the
//! `spec.infrastructure.parametersRef` ConfigMap and from ConfigMaps in
//! istiod's namespace labelled `gateway.istio.io/defaults-for-class`.
//!
//! The Gateway's `status.addresses` come from that Service, as Istio's
//! status does for a class whose address type is `Hostname`: the load
//! balancer's ingress addresses once it has them (none while a
//! LoadBalancer is pending), otherwise the Service's host name.
//!
//! Only the holder of Istio's per-revision `istio-gateway-deployment` Lease
//! writes. Objects that exist without the `gateway.istio.io/managed` label
//! are left alone (Istio's `canManage`); a Gateway whose
//! `gateway.istio.io/controller-version` annotation is newer than this
//! controller's (5), or not a number, is left to that controller. Unlike
//! Istio this controller does not write that annotation itself.
//!
//! Istio reacts to changes of the generated objects and ConfigMaps through
//! informers; this controller reads them when it reconciles, on every change
//! of the config store or the injector's settings and every [`RESYNC`]:
//! each pass lists the managed ServiceAccounts, Deployments and Services
//! (one list per kind) and applies a Gateway's objects again when its
//! rendering changed or one of them was deleted or changed by another.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::inject::kube_gateway::{
    self, GatewayFacts, Infrastructure, KubeGatewayInput, MANAGED_LABEL,
};
use crate::model::gateway_api::{BUILTIN_CLASS, CONTROLLER_NAME, GatewayClass, KubernetesGateway};
use crate::model::proxy_config::WorkloadProxyConfig;
use crate::model::{ConfigStore, ObjectKey, Snapshot};
use crate::webhooks::inject::InjectorState;

/// The field manager of the controller's writes (Istio's
/// `PILOT_GATEWAY_API_CONTROLLER_NAME` default).
pub const FIELD_MANAGER: &str = "istio.io/gateway-controller";
/// The controller's version (Istio's `ControllerVersion`).
pub const CONTROLLER_VERSION: i64 = 5;
/// The annotation recording which controller version manages a Gateway.
pub const CONTROLLER_VERSION_ANNOTATION: &str = "gateway.istio.io/controller-version";
/// The label of a ConfigMap of class-wide customizations (Istio's
/// `GatewayClassDefaults`).
pub const CLASS_DEFAULTS_LABEL: &str = "gateway.istio.io/defaults-for-class";
/// `PILOT_ENABLE_GATEWAY_API_COPY_LABELS_ANNOTATIONS` (Istio's, default
/// true): a Gateway without `infrastructure` labels/annotations passes its
/// own to what it generates.
pub const ENV_COPY_LABELS_ANNOTATIONS: &str = "PILOT_ENABLE_GATEWAY_API_COPY_LABELS_ANNOTATIONS";

/// How long changes gather before a pass.
const SETTLE: Duration = Duration::from_millis(100);
/// How often every Gateway is reconciled without a change (the generated
/// objects and ConfigMaps are read, not watched).
pub const RESYNC: Duration = Duration::from_secs(5);

/// What the controller runs with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// istiod's revision (`istio.io/rev` of the Pods).
    pub revision: String,
    /// `CLUSTER_ID`.
    pub cluster_id: String,
    /// The cluster's DNS domain (`--domain`).
    pub domain: String,
    /// istiod's namespace (class defaults ConfigMaps live there).
    pub system_namespace: String,
    /// [`ENV_COPY_LABELS_ANNOTATIONS`].
    pub copy_labels_annotations: bool,
}

impl Settings {
    /// Reads [`ENV_COPY_LABELS_ANNOTATIONS`] from `env`.
    pub fn copy_from_env(env: &dyn common::env::Env) -> Result<bool, common::env::ConfigErrors> {
        let mut r = common::env::Reader::new(env);
        let on = r.bool(ENV_COPY_LABELS_ANNOTATIONS, true);
        r.finish().map(|()| on)
    }
}

/// Why reconciling one Gateway failed.
#[derive(Debug, thiserror::Error)]
pub enum DeploymentError {
    /// The API refused or could not be reached.
    #[error("{0}")]
    Api(#[from] kube::Error),
    /// The template or a customization could not be applied.
    #[error("{0}")]
    Render(#[from] kube_gateway::KubeGatewayError),
    /// `parametersRef` names a ConfigMap that does not exist.
    #[error("parametersRef targeting configmap {0:?}, but configmap does not exist")]
    MissingParameters(String),
    /// `parametersRef` is not a ConfigMap (the Gateway's status says so).
    #[error("{0}")]
    InvalidParameters(String),
}

/// Starts the controller with its `settings` (built by the composition
/// root from istiod's config), the Kubernetes slice of the config store and
/// the injector's settings.
pub fn start(
    client: kube::Client,
    store: &ConfigStore,
    injector: watch::Receiver<Option<Arc<InjectorState>>>,
    settings: Settings,
    leadership: crate::leaderelection::Leadership,
    shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(run(
        client,
        store.clone(),
        injector,
        settings,
        leadership,
        shutdown,
    ));
}

/// Runs the controller while this replica holds the
/// `istio-gateway-deployment` Lease, until `shutdown`.
pub async fn run(
    client: kube::Client,
    store: ConfigStore,
    injector: watch::Receiver<Option<Arc<InjectorState>>>,
    settings: Settings,
    leadership: crate::leaderelection::Leadership,
    shutdown: watch::Receiver<bool>,
) {
    crate::leaderelection::run_while_leader(
        "gateway deployment controller",
        leadership,
        shutdown,
        |stop| {
            reconcile_while(
                client.clone(),
                store.clone(),
                injector.clone(),
                settings.clone(),
                stop,
            )
        },
    )
    .await
}

/// What was last applied and written, so unchanged Gateways cost no writes.
#[derive(Default)]
struct Written {
    objects: HashMap<ObjectKey, Vec<Value>>,
    addresses: HashMap<ObjectKey, Value>,
    /// The resourceVersion each applied object had after the apply.
    versions: HashMap<ObjRef, String>,
}

/// A generated object: kind, namespace, name.
type ObjRef = (String, String, String);

/// The kinds whose objects are listed every pass: one deleted or changed
/// by someone else is applied again (Istio reacts to their events).
const TRACKED: [(&str, &str); 3] = [
    ("v1", "ServiceAccount"),
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
];

/// The managed objects that exist, as one pass lists them.
#[derive(Default)]
struct Existing {
    versions: HashMap<ObjRef, String>,
    services: HashMap<(String, String), Value>,
}

async fn existing(client: &kube::Client) -> Result<Existing, kube::Error> {
    let mut out = Existing::default();
    let selector = format!("{MANAGED_LABEL}={}", kube_gateway::MANAGED_VALUE);
    for (api_version, kind) in TRACKED {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource(api_version, kind));
        for o in api.list(&ListParams::default().labels(&selector)).await? {
            let ns = o.metadata.namespace.clone().unwrap_or_default();
            let name = o.metadata.name.clone().unwrap_or_default();
            let rv = o.metadata.resource_version.clone().unwrap_or_default();
            out.versions
                .insert((kind.to_string(), ns.clone(), name.clone()), rv);
            if kind == "Service" {
                out.services
                    .insert((ns, name), serde_json::to_value(&o).unwrap_or_default());
            }
        }
    }
    Ok(out)
}

fn obj_ref(namespace: &str, o: &Value) -> ObjRef {
    (
        o["kind"].as_str().unwrap_or_default().to_string(),
        namespace.to_string(),
        o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

async fn reconcile_while(
    client: kube::Client,
    store: ConfigStore,
    mut injector: watch::Receiver<Option<Arc<InjectorState>>>,
    settings: Settings,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut snapshots = store.watch();
    snapshots.mark_changed();
    let mut written = Written::default();
    let mut warned_no_injector = false;
    loop {
        tokio::select! {
            changed = snapshots.changed() => if changed.is_err() { return },
            changed = injector.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(RESYNC) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        tokio::time::sleep(SETTLE).await;
        let snapshot = snapshots.borrow_and_update().clone();
        let Some(state) = injector.borrow_and_update().clone() else {
            if !warned_no_injector {
                tracing::warn!(target: "gateway", "no injector settings (istio-sidecar-injector): gateway deployments wait for them");
                warned_no_injector = true;
            }
            continue;
        };
        warned_no_injector = false;
        let ours: Vec<ObjectKey> = store
            .slice_objects()
            .iter()
            .filter(|o| o.kind() == crate::model::Kind::KubernetesGateway)
            .map(|o| o.key())
            .collect();
        written.objects.retain(|k, _| ours.contains(k));
        written.versions.retain(|(_, ns, name), _| {
            ours.iter()
                .any(|k| &k.namespace == ns && name.starts_with(k.name.as_str()))
        });
        written.addresses.retain(|k, _| ours.contains(k));
        let defaults = match class_defaults(&client, &settings.system_namespace).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(target: "gateway", "listing the class defaults ConfigMaps failed: {e}; retrying");
                continue;
            }
        };
        let existing = match existing(&client).await {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(target: "gateway", "listing the managed gateway objects failed: {e}; retrying");
                continue;
            }
        };
        let pass = Pass {
            existing: &existing,
            client: &client,
            snapshot: &snapshot,
            state: &state,
            settings: &settings,
            defaults: &defaults,
        };
        for key in &ours {
            let Some(gw) = snapshot.get_typed::<KubernetesGateway>(&key.namespace, &key.name)
            else {
                continue;
            };
            if let Err(e) = reconcile(&pass, gw, &mut written).await {
                tracing::warn!(target: "gateway", "{key}: reconciling its deployment failed: {e}");
                written.objects.remove(key);
            }
        }
    }
}

/// The controller serving a class: its GatewayClass's, or Istio's for the
/// built-in class.
fn class_controller(snapshot: &Snapshot, class: &str) -> Option<String> {
    match snapshot.get_typed::<GatewayClass>("", class) {
        Some(gc) => Some(gc.spec.controller_name.clone()),
        None => (class == BUILTIN_CLASS).then(|| CONTROLLER_NAME.to_string()),
    }
}

/// Whether this controller version may manage a Gateway (Istio's
/// `ManagedGatewayControllerVersion`).
pub fn version_allows(annotations: &BTreeMap<String, String>) -> bool {
    match annotations.get(CONTROLLER_VERSION_ANNOTATION) {
        None => true,
        Some(v) => v.parse::<i64>().is_ok_and(|n| n <= CONTROLLER_VERSION),
    }
}

fn facts(gw: crate::model::Typed<'_, KubernetesGateway>) -> GatewayFacts {
    let m = &gw.object.metadata;
    GatewayFacts {
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone().unwrap_or_default(),
        labels: m.labels.clone(),
        annotations: m.annotations.clone(),
        class: gw.spec.gateway_class_name.clone(),
        listeners: gw
            .spec
            .listeners
            .iter()
            .map(|l| (l.name.clone(), l.port, l.protocol.clone()))
            .collect(),
        addresses: gw.spec.addresses.iter().map(|a| a.value.clone()).collect(),
        infrastructure: gw
            .spec
            .infrastructure
            .as_ref()
            .and_then(|i| serde_json::from_value::<Infrastructure>(i.clone()).ok()),
    }
}

fn resource(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let plural = match kind {
        "ServiceAccount" => "serviceaccounts",
        "Deployment" => "deployments",
        "Service" => "services",
        "HorizontalPodAutoscaler" => "horizontalpodautoscalers",
        _ => "poddisruptionbudgets",
    };
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// What one reconciliation pass reads.
struct Pass<'a> {
    client: &'a kube::Client,
    snapshot: &'a Snapshot,
    state: &'a InjectorState,
    settings: &'a Settings,
    /// Class name to its defaults' ConfigMap data.
    defaults: &'a BTreeMap<String, BTreeMap<String, String>>,
    /// The managed objects that exist.
    existing: &'a Existing,
}

async fn reconcile(
    pass: &Pass<'_>,
    gw: crate::model::Typed<'_, KubernetesGateway>,
    written: &mut Written,
) -> Result<(), DeploymentError> {
    let (client, snapshot, state, settings) =
        (pass.client, pass.snapshot, pass.state, pass.settings);
    let key = gw.object.key();
    let facts = facts(gw);
    if class_controller(snapshot, &facts.class).as_deref() != Some(CONTROLLER_NAME) {
        return Ok(());
    }
    let types: Vec<Option<String>> = gw.spec.addresses.iter().map(|a| a.r#type.clone()).collect();
    if !kube_gateway::is_managed(&types) {
        tracing::debug!(target: "gateway", "{key}: deployed by hand (spec.addresses), skipping");
        return Ok(());
    }
    if !version_allows(&facts.annotations) {
        tracing::debug!(target: "gateway", "{key}: managed by another controller version, skipping");
        return Ok(());
    }
    let overlays = overlays(client, &facts, pass.defaults).await?;
    let derived = kube_gateway::derive(&facts, settings.copy_labels_annotations);
    let labels = BTreeMap::from([(
        kube_gateway::GATEWAY_NAME_LABEL.to_string(),
        facts.name.clone(),
    )]);
    let injection = &state.injection;
    let proxy_config = WorkloadProxyConfig::lookup(snapshot, &facts.namespace, &labels)
        .effective(&injection.mesh.default_config, None);
    let service_name = derived.deployment_name.clone();
    let input = KubeGatewayInput {
        name: &facts.name,
        namespace: &facts.namespace,
        uid: &facts.uid,
        class: &facts.class,
        gateway_annotations: &facts.annotations,
        deployment_name: derived.deployment_name,
        service_account: derived.service_account,
        ports: derived.ports,
        service_type: derived.service_type,
        address: facts.addresses.first().cloned(),
        cluster_id: &settings.cluster_id,
        revision: &settings.revision,
        infra_labels: derived.infra_labels,
        infra_annotations: derived.infra_annotations,
        values: &injection.values,
        mesh: &injection.mesh,
        proxy_config: &proxy_config,
    };
    let objects = kube_gateway::render_with_overlays(&input, &overlays)?;
    let tracked = |o: &&Value| TRACKED.iter().any(|(_, k)| o["kind"] == *k);
    let stale = objects.iter().filter(tracked).any(|o| {
        let r = obj_ref(&facts.namespace, o);
        pass.existing.versions.get(&r) != written.versions.get(&r)
    });
    if stale || written.objects.get(&key) != Some(&objects) {
        for o in &objects {
            if let Some(rv) = apply(client, &facts.namespace, o).await? {
                written.versions.insert(obj_ref(&facts.namespace, o), rv);
            }
        }
        tracing::info!(target: "gateway", "{key}: gateway deployment applied ({} objects)", objects.len());
        written.objects.insert(key.clone(), objects);
    }
    let service = pass
        .existing
        .services
        .get(&(facts.namespace.clone(), service_name));
    write_addresses(client, &key, service, &settings.domain, written).await
}

/// The class defaults' ConfigMaps in istiod's namespace (labelled
/// [`CLASS_DEFAULTS_LABEL`] with the class): for each class, the oldest's
/// data.
async fn class_defaults(
    client: &kube::Client,
    namespace: &str,
) -> Result<BTreeMap<String, BTreeMap<String, String>>, kube::Error> {
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), namespace);
    let mut all = cms
        .list(&ListParams::default().labels(CLASS_DEFAULTS_LABEL))
        .await?
        .items;
    all.sort_by(|a, b| {
        (
            a.metadata.creation_timestamp.as_ref().map(|t| t.0),
            &a.metadata.name,
        )
            .cmp(&(
                b.metadata.creation_timestamp.as_ref().map(|t| t.0),
                &b.metadata.name,
            ))
    });
    let mut out = BTreeMap::new();
    for cm in all {
        let class = cm
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(CLASS_DEFAULTS_LABEL))
            .cloned()
            .unwrap_or_default();
        out.entry(class)
            .or_insert_with(|| cm.data.unwrap_or_default());
    }
    Ok(out)
}

/// The class defaults' ConfigMap data, then the `parametersRef`
/// ConfigMap's.
async fn overlays(
    client: &kube::Client,
    gw: &GatewayFacts,
    defaults: &BTreeMap<String, BTreeMap<String, String>>,
) -> Result<Vec<BTreeMap<String, String>>, DeploymentError> {
    let mut out: Vec<BTreeMap<String, String>> =
        defaults.get(&gw.class).cloned().into_iter().collect();
    if let Some(problem) = gw.infrastructure.as_ref().and_then(|i| i.problem()) {
        return Err(DeploymentError::InvalidParameters(problem));
    }
    if let Some(p) = gw
        .infrastructure
        .as_ref()
        .and_then(|i| i.parameters_ref.as_ref())
    {
        let own: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(client.clone(), &gw.namespace);
        match own.get_opt(&p.name).await? {
            Some(cm) => out.push(cm.data.unwrap_or_default()),
            None => {
                return Err(DeploymentError::MissingParameters(format!(
                    "{}/{}",
                    gw.namespace, p.name
                )));
            }
        }
    }
    Ok(out)
}

/// Server-side applies one object, unless it exists without the managed
/// label (Istio's `canManage`).
/// Returns the applied object's resourceVersion; `None` when skipped.
async fn apply(
    client: &kube::Client,
    namespace: &str,
    o: &Value,
) -> Result<Option<String>, DeploymentError> {
    let kind = o["kind"].as_str().unwrap_or_default();
    let name = o["metadata"]["name"].as_str().unwrap_or_default();
    let res = resource(o["apiVersion"].as_str().unwrap_or_default(), kind);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &res);
    if let Some(existing) = api.get_opt(name).await?
        && !existing
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(MANAGED_LABEL))
    {
        tracing::debug!(target: "gateway", "{kind} {namespace}/{name} exists and is not managed by istiod, skipping");
        return Ok(None);
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let applied = api.patch(name, &params, &Patch::Apply(o)).await?;
    Ok(applied.metadata.resource_version)
}

/// The addresses the Gateway's status reports for its Service `svc`.
pub fn service_addresses(svc: &Value, domain: &str) -> Vec<Value> {
    let typed = |a: &str| {
        let t = if a.parse::<std::net::IpAddr>().is_ok() {
            "IPAddress"
        } else {
            "Hostname"
        };
        json!({"type": t, "value": a})
    };
    let external: Vec<Value> = svc["status"]["loadBalancer"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["ip"].as_str().or(i["hostname"].as_str()))
        .map(typed)
        .collect();
    if !external.is_empty() {
        return external;
    }
    if svc["spec"]["type"] == "LoadBalancer" {
        // Pending: no address until the load balancer has one.
        return Vec::new();
    }
    let name = svc["metadata"]["name"].as_str().unwrap_or_default();
    let ns = svc["metadata"]["namespace"].as_str().unwrap_or_default();
    vec![typed(&format!("{name}.{ns}.svc.{domain}"))]
}

async fn write_addresses(
    client: &kube::Client,
    key: &ObjectKey,
    service: Option<&Value>,
    domain: &str,
    written: &mut Written,
) -> Result<(), DeploymentError> {
    let Some(svc) = service else {
        return Ok(());
    };
    let addresses = service_addresses(svc, domain);
    // Istio never removes an address once reported.
    if addresses.is_empty() {
        return Ok(());
    }
    let addresses = Value::Array(addresses);
    if written.addresses.get(key) == Some(&addresses) {
        return Ok(());
    }
    let gateways: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &key.namespace,
        &super::api_resource(crate::model::Kind::KubernetesGateway, "v1"),
    );
    let current = gateways.get_status(&key.name).await?;
    if current.data["status"]["addresses"] != addresses {
        gateways
            .patch_status(
                &key.name,
                &PatchParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                },
                &Patch::Merge(json!({"status": {"addresses": addresses}})),
            )
            .await?;
        tracing::info!(target: "gateway", "{key}: status addresses {addresses}");
    }
    written.addresses.insert(key.clone(), addresses);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_come_from_the_service() {
        let lb = json!({"metadata": {"name": "gw-istio", "namespace": "demo"},
            "spec": {"type": "LoadBalancer"},
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}, {"hostname": "lb.example.com"}]}}});
        assert_eq!(
            service_addresses(&lb, "cluster.local"),
            [
                json!({"type": "IPAddress", "value": "203.0.113.7"}),
                json!({"type": "Hostname", "value": "lb.example.com"})
            ]
        );
        let pending = json!({"metadata": {"name": "gw-istio", "namespace": "demo"}, "spec": {"type": "LoadBalancer"}});
        assert!(service_addresses(&pending, "cluster.local").is_empty());
        let cluster_ip = json!({"metadata": {"name": "gw-istio", "namespace": "demo"}, "spec": {"type": "ClusterIP"}});
        assert_eq!(
            service_addresses(&cluster_ip, "cluster.local"),
            [json!({"type": "Hostname", "value": "gw-istio.demo.svc.cluster.local"})]
        );
    }

    #[test]
    fn newer_or_unreadable_controller_versions_are_left_alone() {
        let with =
            |v: &str| BTreeMap::from([(CONTROLLER_VERSION_ANNOTATION.to_string(), v.to_string())]);
        assert!(version_allows(&BTreeMap::new()));
        assert!(version_allows(&with("4")));
        assert!(version_allows(&with("5")));
        assert!(!version_allows(&with("6")));
        assert!(!version_allows(&with("x")));
    }
}
