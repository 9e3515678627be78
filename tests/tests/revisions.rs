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
//! - with the sample mesh and real Envoys: a Pod whose discovery address is
//!   `istiod-canary.istio-system.svc:15012` (what the canary's injection
//!   gives) connects to the canary istiod and not the default one, talks
//!   mTLS to the default revision's Pods (both istiods share the root of
//!   `istio-ca-secret`), and a VirtualService labelled
//!   `istio.io/rev=canary` routes its traffic only.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};
use tests::kube_api::KubeApi;
use tests::mesh::{HTTPBIN_VIP, LocalMesh, http_request};
use tests::revisions::{
    MeshRevision, RevisionIstiod, adsz_clients, manifest_file, revision_objects,
};

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

/// The canary istiod's address on the hub.
const CANARY_IP: &str = "198.18.254.100";
/// The Pod the canary serves.
const CANARY_POD: &str = "sleep-canary";

/// `n` calls to httpbin from `pod`: the version of each answer; panics on
/// a failed call or one not made over the mesh's mTLS as `sleep`.
fn versions_from(mesh: &LocalMesh, pod: &str, n: usize) -> Vec<String> {
    let ns = &mesh.pod(pod).ns;
    let addr = format!("{HTTPBIN_VIP}:8000").parse().unwrap();
    (0..n)
        .map(|_| {
            let (code, body) = http_request(ns, addr, "httpbin:8000", "/headers").unwrap();
            assert_eq!(code, 200, "{pod}: {body}");
            let field = |k: &str| {
                body.lines()
                    .find_map(|l| l.strip_prefix(k))
                    .unwrap_or_default()
                    .to_string()
            };
            assert!(
                field("xfcc=").contains("/ns/demo/sa/sleep"),
                "{pod}'s call not made with its mesh identity: {body}"
            );
            field("version=")
        })
        .collect()
}

/// The httpbin VirtualService of the sample relabelled for `revision` with
/// weights `v1`/`v2`, under `name`.
fn httpbin_route(api: &KubeApi, name: &str, revision: &str, v1: u32, v2: u32) -> Value {
    let mut vs = api
        .get(
            "networking.istio.io/v1",
            "VirtualService",
            "demo",
            "httpbin",
        )
        .unwrap();
    let meta = &mut vs["metadata"];
    *meta = json!({"name": name, "namespace": "demo", "labels": {"istio.io/rev": revision},
                   "resourceVersion": meta["resourceVersion"]});
    vs["spec"]["http"][0]["route"][0]["weight"] = v1.into();
    vs["spec"]["http"][0]["route"][1]["weight"] = v2.into();
    vs
}

#[test]
fn a_canary_pod_connects_to_the_canary_istiod_and_gets_only_its_config() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mut mesh = LocalMesh::start_kube(tmp.path());
    let root_before = mesh.istiod.root_pem();
    let canary = MeshRevision::start(&mut mesh, "canary", CANARY_IP);
    let discovery = format!("{}:15012", MeshRevision::service_host("canary"));
    assert_eq!(discovery, "istiod-canary.istio-system.svc:15012");
    // The canary's serving certificate names its Service and chains to the
    // one root: the agent's TLS to it verifies (else the Pod is never ready).
    mesh.add_vm(
        CANARY_POD,
        "198.18.0.20",
        "sleep",
        &[("CA_ADDR", &discovery)],
        &[("app", "sleep")],
        &format!(r#", "discoveryAddress": "{discovery}""#),
    );
    assert_eq!(mesh.istiod.root_pem(), root_before, "one root");
    let on_canary = |mesh: &LocalMesh, canary: &MeshRevision| {
        let default = adsz_clients(Some(&mesh.hub.ns.name), mesh.istiod.http);
        let of_canary = canary.clients();
        let has = |cs: &[String], pod: &str| cs.iter().any(|c| c.contains(pod));
        (has(&of_canary, CANARY_POD)
            && !has(&default, CANARY_POD)
            && has(&default, "sleep-1")
            && !has(&of_canary, "sleep-1"))
        .then_some(())
        .ok_or((default, of_canary))
    };
    tests::wait_for(
        "the canary Pod on the canary istiod only, sleep-1 on the default only",
        Duration::from_secs(30),
        || on_canary(&mesh, &canary).ok(),
    );
    // mTLS to the default revision's Pods, with the sample's routing.
    versions_from(&mesh, CANARY_POD, 5);

    // Each revision gets its own route for httpbin: the default's 50/50,
    // the canary's all to v2.
    let api = mesh.kube_api.as_ref().unwrap();
    api.update(httpbin_route(api, "httpbin", "default", 50, 50))
        .unwrap();
    let mut canary_vs = httpbin_route(api, "httpbin-canary", "canary", 0, 100);
    canary_vs["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    api.create(canary_vs).unwrap();
    tests::wait_for(
        "the canary Pod's traffic all to v2",
        Duration::from_secs(30),
        || {
            versions_from(&mesh, CANARY_POD, 20)
                .iter()
                .all(|v| v == "v2")
                .then_some(())
        },
    );
    // The default revision's Pod keeps both versions (50/50: 40 calls all
    // to v2 by chance is one in 10^12).
    let seen = tests::wait_for(
        "sleep-1's traffic to both versions",
        Duration::from_secs(30),
        || {
            let vs = versions_from(&mesh, "sleep-1", 40);
            (vs.iter().any(|v| v == "v1") && vs.iter().any(|v| v == "v2")).then_some(vs)
        },
    );
    assert!(seen.iter().any(|v| v == "v1"), "{seen:?}");
    // And the canary Pod stays on v2, still served by the canary alone.
    assert!(
        versions_from(&mesh, CANARY_POD, 20)
            .iter()
            .all(|v| v == "v2")
    );
    if let Err((default, of_canary)) = on_canary(&mesh, &canary) {
        panic!("clients moved: default {default:?}, canary {of_canary:?}");
    }
}
