//! istiod's admission webhooks on `--httpsAddr`, called as the API server
//! calls them: HTTPS verified against istiod's CA for
//! `istiod.istio-system.svc`, `admission.k8s.io/v1` AdmissionReviews in,
//! answers with JSON patches or refusals out.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use base64::Engine;
use serde_json::{Value, json};
use tests::{ISTIOD_SAN, Istiod};

/// The injector settings Istio's chart mounts at `./var/lib/istio/inject`.
fn write_injector_files(istiod_dir: &Path, config: &str) {
    let dir = istiod_dir.join("var/lib/istio/inject");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config"), config).unwrap();
    let values = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../istiod/tests/testdata/inject/istio-discovery-values.yaml");
    std::fs::copy(values, dir.join("values")).unwrap();
}

const INJECTOR_CONFIG: &str = "policy: enabled\nalwaysInjectSelector: []\nneverInjectSelector:\n- matchLabels: {never: inject}\ninjectedAnnotations: {}\ndefaultTemplates: [sidecar]\n";

fn start(tmp: &Path) -> Istiod {
    write_injector_files(tmp, INJECTOR_CONFIG);
    Istiod::start(tmp, &[])
}

fn review(object: Value, namespace: &str) -> Vec<u8> {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "4b8c1a0e-0000-4000-8000-000000000001",
            "kind": {"group": "", "version": "v1", "kind": object["kind"].as_str().unwrap_or("Pod")},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace, "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": object, "oldObject": null, "dryRun": false,
        }
    })
    .to_string()
    .into_bytes()
}

fn post(istiod: &Istiod, path: &str, body: &[u8]) -> (u16, String) {
    tests::tls::https_post(
        istiod.https,
        ISTIOD_SAN,
        &istiod.root_pem(),
        path,
        "application/json",
        body,
    )
    .unwrap()
}

/// The AdmissionReview's `response`.
fn response(istiod: &Istiod, path: &str, body: &[u8]) -> Value {
    let (code, text) = post(istiod, path, body);
    assert_eq!(code, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    v["response"].clone()
}

fn pod(name: &str, labels: Value, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {
            "serviceAccountName": "sleep",
            "containers": [{"name": "sleep", "image": "curlimages/curl", "command": ["sleep", "infinity"],
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}}}],
        }
    })
}

/// Applies a response's patch to `object`.
fn patched(object: &Value, response: &Value) -> Value {
    assert_eq!(response["patchType"], "JSONPatch", "{response}");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().unwrap())
        .unwrap();
    let ops: Vec<Value> = serde_json::from_slice(&bytes).unwrap();
    istiod::inject::patch::apply(object, &ops).expect("the patch applies")
}

fn container<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    ["initContainers", "containers"].iter().find_map(|list| {
        pod["spec"][list]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == name))
    })
}

fn env<'a>(c: &'a Value, name: &str) -> Option<&'a Value> {
    c["env"].as_array()?.iter().find(|e| e["name"] == name)
}

#[test]
fn injects_istios_pod_and_leaves_opted_out_pods_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let istiod = start(tmp.path());

    let input = pod("sleep-1", json!({"app": "sleep"}), json!({}));
    let r = response(&istiod, "/inject", &review(input.clone(), "demo"));
    assert_eq!(r["uid"], "4b8c1a0e-0000-4000-8000-000000000001");
    assert_eq!(r["allowed"], true, "{r}");
    let injected = patched(&input, &r);
    let proxy = container(&injected, "istio-proxy").expect("an istio-proxy container");
    assert_eq!(proxy["args"][0], "proxy");
    assert_eq!(proxy["args"][1], "sidecar");
    assert_eq!(proxy["securityContext"]["runAsUser"], 1337);
    assert_eq!(
        env(proxy, "POD_NAMESPACE").unwrap()["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert!(container(&injected, "istio-init").is_some());
    assert!(
        injected["metadata"]["annotations"]["sidecar.istio.io/status"].is_string(),
        "{injected}"
    );
    // The app's probe now goes through the agent.
    let app = container(&injected, "sleep").unwrap();
    assert_eq!(app["readinessProbe"]["httpGet"]["port"], 15020);
    assert_eq!(
        app["readinessProbe"]["httpGet"]["path"],
        "/app-health/sleep/readyz"
    );

    // Opted out by annotation, by label, by the never-inject selector, and a
    // host-network Pod: admitted with no patch.
    for input in [
        pod("a", json!({}), json!({"sidecar.istio.io/inject": "false"})),
        pod("b", json!({"sidecar.istio.io/inject": "false"}), json!({})),
        pod("c", json!({"never": "inject"}), json!({})),
        {
            let mut p = pod("d", json!({}), json!({}));
            p["spec"]["hostNetwork"] = json!(true);
            p
        },
    ] {
        let r = response(&istiod, "/inject", &review(input.clone(), "demo"));
        assert_eq!(r["allowed"], true, "{r}");
        assert!(r.get("patch").is_none(), "{input} was patched: {r}");
    }

    // Istio's path parameters set the cluster and network of the proxy.
    let input = pod("e", json!({}), json!({}));
    let r = response(
        &istiod,
        "/inject/cluster/cluster-2/net/network-2",
        &review(input.clone(), "demo"),
    );
    let injected = patched(&input, &r);
    let proxy = container(&injected, "istio-proxy").unwrap();
    assert_eq!(
        env(proxy, "ISTIO_META_CLUSTER_ID").unwrap()["value"],
        "cluster-2"
    );
    assert_eq!(
        env(proxy, "ISTIO_META_NETWORK").unwrap()["value"],
        "network-2"
    );

    // Istio's counters, by their names.
    let (_, metrics) = tests::http_get(istiod.monitoring, "/metrics").unwrap();
    let count = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or_else(|| panic!("{name} missing:\n{metrics}"))
    };
    assert_eq!(count("sidecar_injection_requests_total"), 6);
    assert_eq!(count("sidecar_injection_success_total"), 2);
    assert_eq!(count("sidecar_injection_skip_total"), 4);
}

#[test]
fn bad_requests_get_errors_and_the_webhook_keeps_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let istiod = start(tmp.path());

    // Not an AdmissionReview: a refusal carrying the decoder's error.
    let r = response(&istiod, "/inject", b"{\"apiVersion\": 7");
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("could not decode body"),
        "{r}"
    );
    let r = response(
        &istiod,
        "/inject",
        br#"{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "x"}}"#,
    );
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("admission.k8s.io/v1beta1"),
        "{r}"
    );

    // No body, and the wrong media type: plain HTTP errors, as Istio's.
    let (code, text) = post(&istiod, "/inject", b"");
    assert_eq!((code, text.as_str()), (400, "no body found"));
    let (code, text) = tests::tls::https_post(
        istiod.https,
        ISTIOD_SAN,
        &istiod.root_pem(),
        "/inject",
        "text/plain",
        b"{}",
    )
    .unwrap();
    assert_eq!(code, 415, "{text}");

    // An object the injector cannot patch (not a Pod) is admitted unchanged,
    // with a warning the client sees.
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {}});
    let r = response(&istiod, "/inject", &review(deployment, "demo"));
    assert_eq!(r["allowed"], true);
    assert!(r.get("patch").is_none());
    assert!(
        r["warnings"][0].as_str().unwrap().contains("not a Pod"),
        "{r}"
    );

    // A Pod with a malformed traffic annotation is refused, naming it.
    let bad = pod(
        "bad",
        json!({}),
        json!({"traffic.sidecar.istio.io/excludeOutboundPorts": "80,x"}),
    );
    let r = response(&istiod, "/inject", &review(bad, "demo"));
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("traffic.sidecar.istio.io/excludeOutboundPorts"),
        "{r}"
    );

    // And the next good request is injected.
    let input = pod("ok", json!({}), json!({}));
    let r = response(&istiod, "/inject", &review(input.clone(), "demo"));
    assert!(container(&patched(&input, &r), "istio-proxy").is_some());
}

#[test]
fn validation_refuses_a_bad_weight_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let istiod = start(tmp.path());
    let vs = |w: i64| {
        json!({
            "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "httpbin", "namespace": "demo"},
            "spec": {"hosts": ["httpbin"], "http": [{"route": [
                {"destination": {"host": "httpbin", "subset": "v1"}, "weight": w},
                {"destination": {"host": "httpbin", "subset": "v2"}, "weight": 100 - w}]}]}
        })
    };
    let body = |object: Value| {
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": "CREATE", "namespace": "demo", "name": "httpbin",
                "kind": {"group": "networking.istio.io", "version": "v1", "kind": "VirtualService"},
                "resource": {"group": "networking.istio.io", "version": "v1", "resource": "virtualservices"},
                "object": object}
        })
        .to_string()
        .into_bytes()
    };
    let r = response(&istiod, "/validate", &body(vs(150)));
    assert_eq!(r["allowed"], false);
    let message = r["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("configuration is invalid: VirtualService/demo/httpbin:"),
        "{message}"
    );
    assert!(
        message.contains("spec.http[0].route[0].weight"),
        "{message}"
    );
    let r = response(&istiod, "/validate", &body(vs(80)));
    assert_eq!(r["allowed"], true, "{r}");
    let (_, metrics) = tests::http_get(istiod.monitoring, "/metrics").unwrap();
    assert!(
        metrics.contains(r#"galley_validation_failed{group="networking.istio.io",reason="invalid_config",resource="virtualservices",version="v1"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"galley_validation_passed{group="networking.istio.io",resource="virtualservices",version="v1"} 1"#),
        "{metrics}"
    );
}
