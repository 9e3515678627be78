//! Offline validation of the high-availability settings of the base install and of the
//! revision overlays in `manifests/revisions/`, rendered with `kubectl kustomize` (Debian's
//! `kubectl` package; `scripts/setup.sh` installs it) as a user renders them.
//!
//! - The base rendered by kustomize is exactly the files `kubectl apply -f manifests/istiod/`
//!   applies, with 2 replicas, a PodDisruptionBudget, a HorizontalPodAutoscaler and a
//!   preferred anti-affinity by hostname, as Istio's chart has them.
//! - The `canary` overlay: every object survives the typed round trip, carries
//!   `istio.io/rev: canary` and Istio's revisioned name, collides with no object of the base,
//!   and its selectors tell its Pods from the default revision's.
//! - Which istiod a namespace's Pods are sent to: the webhooks' selectors evaluated on
//!   namespace labels (`istio-injection=enabled`, `istio.io/rev=canary`, the `prod` tag).
//! - istiod reads the overlay: `REVISION=canary` names the injector ConfigMap and the mesh
//!   ConfigMap the overlay installs; the mesh config's discovery address is the canary's.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::admissionregistration::v1 as admission;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

type Labels = BTreeMap<String, String>;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("istiod sits in the workspace")
        .to_path_buf()
}

/// `kubectl kustomize <dir>` (relative to the repository), as documents.
fn kustomize(dir: &str) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(repo_root().join(dir))
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run kubectl ({e}): install Debian's kubectl (scripts/setup.sh does)")
        });
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_documents(&String::from_utf8(out.stdout).unwrap())
}

fn yaml_documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|de| serde::Deserialize::deserialize(de).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// The documents of the plain files of `dir`, but kustomize's own.
fn files_under(dir: &str) -> Vec<Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|f| yaml_documents(&std::fs::read_to_string(f).unwrap()))
        .collect()
}

fn id(v: &Value) -> (String, String, String) {
    let s = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or_default();
    (
        s("/kind").into(),
        s("/metadata/namespace").into(),
        s("/metadata/name").into(),
    )
}

fn find<T: DeserializeOwned>(docs: &[Value], kind: &str, name: &str) -> T {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| id(d).0 == kind && id(d).2 == name)
        .collect();
    assert_eq!(found.len(), 1, "expected exactly one {kind} {name}");
    serde_json::from_value(found[0].clone()).unwrap_or_else(|e| panic!("{kind} {name}: {e}"))
}

fn roundtrip<T: DeserializeOwned + Serialize>(v: &Value) -> Value {
    let typed: T =
        serde_path_to_error::deserialize(v.clone()).unwrap_or_else(|e| panic!("{:?}: {e}", id(v)));
    serde_json::to_value(&typed).unwrap()
}

/// `v` through the k8s-openapi type of its kind: unknown or mistyped fields are lost.
fn typed_roundtrip(v: &Value) -> Value {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    match id(v).0.as_str() {
        "ServiceAccount" => roundtrip::<ServiceAccount>(v),
        "ConfigMap" => roundtrip::<ConfigMap>(v),
        "Service" => roundtrip::<Service>(v),
        "Deployment" => roundtrip::<Deployment>(v),
        "PodDisruptionBudget" => roundtrip::<PodDisruptionBudget>(v),
        "HorizontalPodAutoscaler" => roundtrip::<HorizontalPodAutoscaler>(v),
        "Role" => roundtrip::<Role>(v),
        "RoleBinding" => roundtrip::<RoleBinding>(v),
        "ClusterRole" => roundtrip::<ClusterRole>(v),
        "ClusterRoleBinding" => roundtrip::<ClusterRoleBinding>(v),
        "MutatingWebhookConfiguration" => roundtrip::<admission::MutatingWebhookConfiguration>(v),
        "ValidatingWebhookConfiguration" => {
            roundtrip::<admission::ValidatingWebhookConfiguration>(v)
        }
        other => panic!("no schema here for {other}"),
    }
}

/// Whether `selector` selects `labels` (matchLabels and the four operators).
fn selects(selector: &LabelSelector, labels: &Labels) -> bool {
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        match (e.operator.as_str(), labels.get(&e.key)) {
            ("In", Some(v)) => values.contains(v),
            ("In", None) => false,
            ("NotIn", v) => v.is_none_or(|v| !values.contains(v)),
            ("Exists", v) => v.is_some(),
            ("DoesNotExist", v) => v.is_none(),
            (op, _) => panic!("operator {op}"),
        }
    });
    labels_ok && exprs_ok
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn pod_labels(d: &Deployment) -> Labels {
    d.spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap()
}

fn env(d: &Deployment, name: &str) -> Option<String> {
    d.spec.as_ref()?.template.spec.as_ref()?.containers[0]
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

#[test]
fn the_base_is_the_files_with_two_replicas_a_budget_and_an_autoscaler() {
    let rendered = kustomize("manifests/istiod");
    let ids = |docs: &[Value]| docs.iter().map(id).collect::<BTreeSet<_>>();
    assert_eq!(
        ids(&rendered),
        ids(&files_under("manifests/istiod")),
        "kustomization.yaml lists every file of manifests/istiod"
    );
    let d: Deployment = find(&rendered, "Deployment", "istiod");
    let spec = d.spec.clone().unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pods = pod_labels(&d);
    let anti = spec
        .template
        .spec
        .unwrap()
        .affinity
        .unwrap()
        .pod_anti_affinity
        .unwrap();
    let preferred = anti
        .preferred_during_scheduling_ignored_during_execution
        .unwrap();
    assert_eq!(
        preferred[0].pod_affinity_term.topology_key,
        "kubernetes.io/hostname"
    );
    assert!(selects(
        preferred[0]
            .pod_affinity_term
            .label_selector
            .as_ref()
            .unwrap(),
        &pods
    ));
    let pdb: PodDisruptionBudget = find(&rendered, "PodDisruptionBudget", "istiod");
    let pdb = pdb.spec.unwrap();
    assert_eq!(
        pdb.min_available,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );
    assert!(selects(pdb.selector.as_ref().unwrap(), &pods));
    let hpa: HorizontalPodAutoscaler = find(&rendered, "HorizontalPodAutoscaler", "istiod");
    let hpa = hpa.spec.unwrap();
    assert_eq!((hpa.min_replicas, hpa.max_replicas), (Some(2), 5));
    assert_eq!(
        (
            hpa.scale_target_ref.kind.as_str(),
            hpa.scale_target_ref.name.as_str()
        ),
        ("Deployment", "istiod")
    );
    let cpu = hpa.metrics.unwrap()[0].resource.clone().unwrap();
    assert_eq!(
        (cpu.name.as_str(), cpu.target.average_utilization),
        ("cpu", Some(80))
    );
}

#[test]
fn the_canary_overlay_is_a_second_revision_beside_the_base() {
    let base = kustomize("manifests/istiod");
    let canary = kustomize("manifests/revisions/canary");
    let base_ids: BTreeSet<_> = base.iter().map(id).collect();
    for doc in &canary {
        let (kind, ns, name) = id(doc);
        assert_eq!(
            &typed_roundtrip(doc),
            doc,
            "{kind} {name}: unknown or mistyped fields"
        );
        assert!(
            !base_ids.contains(&id(doc)),
            "{kind} {ns}/{name} would replace the default revision's"
        );
        assert_eq!(
            doc.pointer("/metadata/labels/istio.io~1rev"),
            Some(&Value::from("canary")),
            "{kind} {name}"
        );
        assert!(
            name.contains("canary"),
            "{kind} {name} has no revisioned name"
        );
        assert!(kind != "Namespace", "the Namespace is the base's");
    }
    // Istio's chart names for revision `canary`.
    let _: Service = find(&canary, "Service", "istiod-canary");
    let _: ConfigMap = find(&canary, "ConfigMap", "istio-canary");
    let _: ConfigMap = find(&canary, "ConfigMap", "istio-sidecar-injector-canary");
    let _: admission::ValidatingWebhookConfiguration = find(
        &canary,
        "ValidatingWebhookConfiguration",
        "istio-validator-canary-istio-system",
    );
    let _: HorizontalPodAutoscaler = find(&canary, "HorizontalPodAutoscaler", "istiod-canary");

    // Each revision's selectors pick its own Pods only.
    let d_base: Deployment = find(&base, "Deployment", "istiod");
    let d_canary: Deployment = find(&canary, "Deployment", "istiod-canary");
    assert_eq!(env(&d_canary, "REVISION").as_deref(), Some("canary"));
    let (p_base, p_canary) = (pod_labels(&d_base), pod_labels(&d_canary));
    let sel = |d: &Deployment| d.spec.as_ref().unwrap().selector.clone();
    assert!(selects(&sel(&d_canary), &p_canary) && !selects(&sel(&d_canary), &p_base));
    assert!(selects(&sel(&d_base), &p_base) && !selects(&sel(&d_base), &p_canary));
    let svc_sel = |docs: &[Value], name: &str| LabelSelector {
        match_labels: find::<Service>(docs, "Service", name)
            .spec
            .unwrap()
            .selector,
        ..Default::default()
    };
    assert!(selects(&svc_sel(&canary, "istiod-canary"), &p_canary));
    assert!(!selects(&svc_sel(&canary, "istiod-canary"), &p_base));
    assert!(!selects(&svc_sel(&base, "istiod"), &p_canary));
    let pdb: PodDisruptionBudget = find(&canary, "PodDisruptionBudget", "istiod-canary");
    let pdb_sel = pdb.spec.unwrap().selector.unwrap();
    assert!(selects(&pdb_sel, &p_canary) && !selects(&pdb_sel, &p_base));
}

/// The Services the injection webhooks of `docs` send a Pod with `pod` labels in a
/// namespace with `ns` labels to.
fn injectors(docs: &[Value], ns: &Labels, pod: &Labels) -> BTreeSet<String> {
    docs.iter()
        .filter(|d| id(d).0 == "MutatingWebhookConfiguration")
        .flat_map(|d| {
            let mwc: admission::MutatingWebhookConfiguration =
                serde_json::from_value(d.clone()).unwrap();
            mwc.webhooks.unwrap_or_default()
        })
        .filter(|h| {
            let all = LabelSelector::default();
            selects(h.namespace_selector.as_ref().unwrap_or(&all), ns)
                && selects(h.object_selector.as_ref().unwrap_or(&all), pod)
        })
        .map(|h| h.client_config.service.unwrap().name)
        .collect()
}

#[test]
fn namespaces_reach_the_revision_their_label_names() {
    let mut docs = kustomize("manifests/istiod");
    docs.extend(kustomize("manifests/revisions/canary"));
    docs.extend(files_under("manifests/revisions"));
    let none = labels(&[]);
    let set = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let cases = [
        (
            labels(&[("istio-injection", "enabled")]),
            none.clone(),
            set(&["istiod"]),
        ),
        (
            labels(&[("istio.io/rev", "canary")]),
            none.clone(),
            set(&["istiod-canary"]),
        ),
        (
            labels(&[("istio.io/rev", "default")]),
            none.clone(),
            set(&["istiod"]),
        ),
        // The tag `prod` points at the default revision.
        (
            labels(&[("istio.io/rev", "prod")]),
            none.clone(),
            set(&["istiod"]),
        ),
        (
            none.clone(),
            labels(&[("istio.io/rev", "canary")]),
            set(&["istiod-canary"]),
        ),
        (
            labels(&[("istio.io/rev", "canary")]),
            labels(&[("sidecar.istio.io/inject", "false")]),
            set(&[]),
        ),
        (none.clone(), none.clone(), set(&[])),
    ];
    for (ns, pod, want) in cases {
        assert_eq!(
            injectors(&docs, &ns, &pod),
            want,
            "namespace {ns:?}, pod {pod:?}"
        );
    }
    // The tag's webhook is named, labelled and served as `istioctl tag set` has it, so the
    // default revision's istiod counts `prod` among its tags and patches its caBundle.
    let tag: admission::MutatingWebhookConfiguration = find(
        &docs,
        "MutatingWebhookConfiguration",
        "istio-revision-tag-prod",
    );
    let l = tag.metadata.labels.unwrap();
    assert_eq!(l.get("istio.io/tag").map(String::as_str), Some("prod"));
    assert_eq!(l.get("istio.io/rev").map(String::as_str), Some("default"));
}

#[test]
fn the_canary_istiod_reads_the_overlays_configmaps() {
    let base = kustomize("manifests/istiod");
    let canary = kustomize("manifests/revisions/canary");
    let env = common::env::MapEnv(labels(&[("REVISION", "canary")]));
    let mut r = common::env::Reader::new(&env);
    let hooks = istiod::webhooks::WebhookConfig::read(None, "istio-system", &mut r);
    r.finish().unwrap();
    assert_eq!(hooks.revision, "canary");
    let injector: ConfigMap = find(&canary, "ConfigMap", &hooks.injector_configmap);
    let _: admission::MutatingWebhookConfiguration = find(
        &canary,
        "MutatingWebhookConfiguration",
        &hooks.injection_webhook_config_name,
    );
    let _: admission::ValidatingWebhookConfiguration = find(
        &canary,
        "ValidatingWebhookConfiguration",
        &hooks.validation_webhook_config_name,
    );
    let mesh_cm = istiod::model::revision::revisioned_name(istiod::mesh::MESH_CONFIGMAP, "canary");
    let mesh: ConfigMap = find(&canary, "ConfigMap", &mesh_cm);
    let mesh_text = &mesh.data.unwrap()["mesh"];
    istiod::mesh::Mesh::parse(mesh_text).unwrap();
    let mesh_yaml: Value = serde_yaml_ng::from_str(mesh_text).unwrap();
    assert_eq!(
        mesh_yaml["defaultConfig"]["discoveryAddress"], "istiod-canary.istio-system.svc:15012",
        "the canary's proxies connect to the canary's Service"
    );
    // The injector's values are the base's but for the revision.
    let values =
        |cm: ConfigMap| -> Value { serde_json::from_str(&cm.data.unwrap()["values"]).unwrap() };
    let mut canary_values = values(injector);
    let base_values = values(find(&base, "ConfigMap", "istio-sidecar-injector"));
    assert_eq!(canary_values["revision"], "canary");
    canary_values["revision"] = base_values["revision"].clone();
    assert_eq!(
        canary_values, base_values,
        "injector-values.patch.yaml drifted from the base"
    );
    let parsed = istiod::inject::Values::from_yaml(
        &serde_json::to_string(&values(find(
            &canary,
            "ConfigMap",
            &hooks.injector_configmap,
        )))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(parsed.string("revision"), "canary");
}

#[test]
fn a_revision_serves_under_its_own_service_name_and_filters_by_its_revision() {
    use clap::{Args, FromArgMatches};
    let matches = istiod::config::DiscoveryArgs::augment_args(clap::Command::new("discovery"))
        .try_get_matches_from(["discovery", "--meshConfig", "/nonexistent"])
        .unwrap();
    let args = istiod::config::DiscoveryArgs::from_arg_matches(&matches).unwrap();
    let read = |pairs: &[(&str, &str)]| {
        istiod::config::Config::from_args(&args, &common::env::MapEnv(labels(pairs))).unwrap()
    };
    let canary = read(&[("REVISION", "canary")]);
    assert!(
        canary
            .server
            .istiod_sans
            .contains(&"istiod-canary.istio-system.svc".to_string()),
        "{:?}",
        canary.server.istiod_sans
    );
    assert_eq!(canary.source_settings().revision, "canary");
    // Unset, the revision is Istio's empty one: every object is taken.
    let unset = read(&[]);
    assert_eq!(unset.source_settings().revision, "");
    assert!(
        !unset
            .server
            .istiod_sans
            .iter()
            .any(|s| s.starts_with("istiod-default"))
    );
    assert_eq!(unset.webhooks.revision, "default");
}
