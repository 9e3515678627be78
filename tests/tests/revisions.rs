//! Two control-plane revisions on one Kubernetes API (the stand-in): the
//! default one and `canary`, each installed from the repository's manifests
//! (the canary with `kubectl kustomize manifests/revisions/canary`) and run
//! as its own istiod with `REVISION`. What a user observes:
//! - config labelled `istio.io/rev=canary` is in the canary's store and not
//!   the default's; unlabelled config is in both; config labelled with the
//!   tag `prod` follows the tag;
//! - a Pod created in a namespace labelled `istio.io/rev=canary` is injected
//!   by the canary istiod, with the canary's discovery and CA address;
//! - moving the tag `prod` moves its namespace's new Pods and its config to
//!   the canary.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};
use tests::kube_api::KubeApi;
use tests::revisions::{RevisionIstiod, manifest_file, revision_objects};

const TAG_WEBHOOK: &str = "manifests/revisions/istio-revision-tag-prod.yaml";

fn namespace(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

fn virtual_service(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": name, "namespace": "demo", "labels": labels},
        "spec": {"hosts": [format!("{name}.example.com")],
                 "http": [{"route": [{"destination": {"host": "httpbin.demo.svc.cluster.local"}}]}]}
    })
}

fn vs_key(name: &str) -> String {
    format!("VirtualService/demo/{name}")
}

fn sleep_pod(name: &str, namespace: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "sleep"}},
        "spec": {"serviceAccountName": "sleep",
                 "containers": [{"name": "sleep", "image": "curlimages/curl", "command": ["sleep", "infinity"]}]}
    })
}

/// What an injected Pod says of the istiod that injected it: its
/// `istio.io/rev` annotation, and the proxy's CA address and discovery
/// address.
#[derive(Debug, PartialEq)]
struct InjectedBy {
    revision: String,
    ca_addr: String,
    discovery_address: String,
}

fn injected_by(pod: &Value) -> Option<InjectedBy> {
    let proxy = ["initContainers", "containers"]
        .iter()
        .filter_map(|list| pod["spec"][list].as_array())
        .flatten()
        .find(|c| c["name"] == "istio-proxy")?;
    let env = |name: &str| {
        proxy["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    let proxy_config: Value = serde_json::from_str(&env("PROXY_CONFIG")).unwrap_or_default();
    Some(InjectedBy {
        revision: pod["metadata"]["annotations"]["istio.io/rev"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        ca_addr: env("CA_ADDR"),
        discovery_address: proxy_config["discoveryAddress"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    })
}

fn by(revision: &str) -> InjectedBy {
    let svc = if revision == "default" {
        "istiod".to_string()
    } else {
        format!("istiod-{revision}")
    };
    InjectedBy {
        revision: revision.into(),
        ca_addr: format!("{svc}.istio-system.svc:15012"),
        discovery_address: format!("{svc}.istio-system.svc:15012"),
    }
}

/// Creates Pods in `namespace` through admission until one is admitted
/// (the webhook's caBundle may not be patched yet, and its failure policy
/// is `Fail`); returns the stored Pod.
fn create_injected(
    rt: &tokio::runtime::Runtime,
    api: &KubeApi,
    namespace: &str,
    name: &str,
) -> Value {
    let mut attempt = 0;
    tests::wait_for(
        &format!("a Pod admitted in {namespace}"),
        Duration::from_secs(30),
        || {
            attempt += 1;
            let pod = sleep_pod(&format!("{name}-{attempt}"), namespace);
            rt.block_on(api.create_admitted(pod)).ok()
        },
    )
}

#[test]
fn two_revisions_split_config_and_injection_and_a_tag_moves_a_namespace() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let api = KubeApi::start_local();
    for ns in [
        namespace("istio-system", json!({})),
        namespace("demo", json!({})),
        namespace("canary-apps", json!({"istio.io/rev": "canary"})),
        namespace("prod-apps", json!({"istio.io/rev": "prod"})),
    ] {
        api.create(ns).unwrap();
    }
    for o in revision_objects("default")
        .into_iter()
        .chain(revision_objects("canary"))
        .chain(manifest_file(TAG_WEBHOOK))
    {
        api.create(o).unwrap();
    }
    let default = RevisionIstiod::start(&api, &tmp.path().join("default"), "default");
    let canary = RevisionIstiod::start(&api, &tmp.path().join("canary"), "canary");
    // The API server reaches each revision through its Service.
    api.set_service_address("istio-system", "istiod", default.https);
    api.set_service_address("istio-system", "istiod-canary", canary.https);

    // Config: each revision's own, the tag's for the revision it points at,
    // unlabelled for both. `global` is created last: once a store has it,
    // it has seen the others.
    for vs in [
        virtual_service("for-canary", json!({"istio.io/rev": "canary"})),
        virtual_service("for-default", json!({"istio.io/rev": "default"})),
        virtual_service("for-prod", json!({"istio.io/rev": "prod"})),
        virtual_service("global", json!({})),
    ] {
        api.create(vs).unwrap();
    }
    let keys = |names: &[&str]| names.iter().map(|n| vs_key(n)).collect::<Vec<_>>();
    canary.wait_config(
        &keys(&["global", "for-canary"]),
        &keys(&["for-default", "for-prod"]),
    );
    default.wait_config(
        &keys(&["global", "for-default", "for-prod"]),
        &keys(&["for-canary"]),
    );

    // Injection: the namespace's label chooses the revision; the tag `prod`
    // points at the default one.
    let pod = create_injected(&rt, &api, "canary-apps", "sleep");
    assert_eq!(injected_by(&pod), Some(by("canary")), "{pod}");
    let pod = create_injected(&rt, &api, "prod-apps", "sleep");
    assert_eq!(injected_by(&pod), Some(by("default")), "{pod}");

    // Move the tag to the canary, as `istioctl tag set prod --revision
    // canary --overwrite` does: the webhook's revision label and Service.
    let mut tag = api
        .get(
            "admissionregistration.k8s.io/v1",
            "MutatingWebhookConfiguration",
            "",
            "istio-revision-tag-prod",
        )
        .unwrap();
    tag["metadata"]["labels"]["istio.io/rev"] = json!("canary");
    for hook in tag["webhooks"].as_array_mut().unwrap() {
        hook["clientConfig"]["service"]["name"] = json!("istiod-canary");
    }
    api.update(tag).unwrap();

    canary.wait_config(
        &keys(&["global", "for-canary", "for-prod"]),
        &keys(&["for-default"]),
    );
    default.wait_config(
        &keys(&["global", "for-default"]),
        &keys(&["for-canary", "for-prod"]),
    );
    // New Pods of the tagged namespace go to the canary once its istiod has
    // written its root into the moved webhook.
    let moved = tests::wait_for(
        "the prod-apps namespace's new Pods to be injected by the canary",
        Duration::from_secs(30),
        || {
            let pod = create_injected(&rt, &api, "prod-apps", "moved");
            (injected_by(&pod) == Some(by("canary"))).then_some(pod)
        },
    );
    assert_eq!(injected_by(&moved), Some(by("canary")), "{moved}");
    drop((default, canary));
}
