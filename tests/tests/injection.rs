//! Inject, then run: the project's manifests installed in the API stand-in
//! (the injector ConfigMap and the webhook configurations), a labelled
//! namespace, and a Pod created over the API as `kubectl` would. The API
//! calls istiod's webhook, stores the injected Pod, and the harness runs the
//! Pod's Istio containers from that spec alone ([`tests::injected`]): the
//! Pod gets its certificate from istiod, its configuration, and calls
//! httpbin over mTLS.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use tests::kube_api::KubeApi;
use tests::mesh::{HTTPBIN_VIP, HUB_IP, LocalMesh};

const SLEEP: &str = "spiffe://cluster.local/ns/demo/sa/sleep";

/// Every object of a manifest file, as `kubectl apply -f` reads it.
fn manifest(name: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../manifests/istiod")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    istiod::inject::parse_yaml_documents(&text).unwrap()
}

/// A request to the API over HTTP from inside the hub, as `kubectl` sends
/// it (so admission runs): (status, body).
fn api_request(mesh: &LocalMesh, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let addr = mesh.kube_api.as_ref().unwrap().addr();
    let (method, path, body) = (method.to_string(), path.to_string(), body.to_string());
    mesh.hub.ns.run(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let body = if head.to_ascii_lowercase().contains("chunked") {
            // One chunk is all the stand-in writes for a single object.
            body.split_once("\r\n").map(|(_, b)| b).unwrap_or(body)
        } else {
            body
        };
        let end = body.rfind('}').map_or(0, |i| i + 1);
        (status, serde_json::from_str(&body[..end]).unwrap_or(Value::Null))
    })
}

fn create_pod(mesh: &LocalMesh, namespace: &str, pod: Value) -> (u16, Value) {
    api_request(
        mesh,
        "POST",
        &format!("/api/v1/namespaces/{namespace}/pods"),
        &pod,
    )
}

fn has_proxy(pod: &Value) -> bool {
    ["initContainers", "containers"].iter().any(|list| {
        pod["spec"][list]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["name"] == "istio-proxy"))
    })
}

fn sleep_pod(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "serviceAccountName": "sleep",
            "containers": [{"name": "sleep", "image": "curlimages/curl", "command": ["sleep", "infinity"]}]
        }
    })
}

/// Installs the injector ConfigMap and webhook configurations from
/// `manifests/istiod`, routes the `istiod` Service to istiod's webhook port,
/// and waits for istiod to write its root into the webhooks' caBundle.
fn install_webhooks(mesh: &LocalMesh, api: &KubeApi) {
    for o in manifest("31-configmap-injector.yaml")
        .into_iter()
        .chain(manifest("60-webhooks.yaml"))
    {
        api.create(o).unwrap();
    }
    // The API server reaches istiod through its Service (443 to 15017).
    let endpoint = mesh.hub.ns.forward_to(mesh.istiod.https);
    api.set_service_address("istio-system", "istiod", endpoint);
    let root = mesh.istiod.root_pem();
    let want = base64::engine::general_purpose::STANDARD.encode(root.as_bytes());
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        tests::wait_for(
            &format!("istiod to patch the {kind}'s caBundle"),
            Duration::from_secs(30),
            || {
                let list = api.list("admissionregistration.k8s.io/v1", kind, None);
                let hooks: Vec<Value> = list
                    .iter()
                    .flat_map(|c| c["webhooks"].as_array().cloned().unwrap_or_default())
                    .collect();
                (!hooks.is_empty()
                    && hooks
                        .iter()
                        .all(|w| w["clientConfig"]["caBundle"] == want.as_str()))
                .then_some(())
            },
        );
    }
}

/// Waits until istiod's config store holds `key` (`Kind/namespace/name`).
fn wait_for_configz(mesh: &LocalMesh, key: &str) {
    let http = mesh.istiod.http;
    let key = key.to_string();
    mesh.hub.ns.run(move || {
        tests::wait_for(&format!("{key} in istiod"), Duration::from_secs(30), || {
            let (_, body) = tests::http_get(http, "/debug/configz").ok()?;
            let c: Value = serde_json::from_str(&body).ok()?;
            c["objects"]
                .as_array()?
                .iter()
                .any(|o| o == key.as_str())
                .then_some(())
        })
    })
}

/// The command line of the Envoy among the descendants of `pid`.
fn envoy_cmdline(pid: u32) -> Option<Vec<String>> {
    let mut queue = vec![pid];
    for _ in 0..64 {
        let p = queue.pop()?;
        let raw = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args
            .first()
            .is_some_and(|a| Path::new(a).file_name().is_some_and(|f| f == "envoy"))
        {
            return Some(args);
        }
        let children = std::process::Command::new("pgrep")
            .args(["-P", &p.to_string()])
            .output()
            .ok()?;
        queue.extend(
            String::from_utf8_lossy(&children.stdout)
                .lines()
                .filter_map(|l| l.trim().parse::<u32>().ok()),
        );
    }
    None
}

#[test]
fn an_injected_pod_joins_the_mesh_and_others_are_left_alone() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start_kube(tmp.path());
    let api = mesh.kube_api.as_ref().unwrap();
    install_webhooks(&mesh, api);

    // An unlabelled namespace: the webhook is not even called.
    api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "plain"}}))
        .unwrap();
    let (code, stored) = create_pod(&mesh, "plain", sleep_pod("plain-1", json!({})));
    assert_eq!(code, 201, "{stored}");
    assert!(!has_proxy(&stored), "{stored}");

    // `istio-injection=enabled` on the namespace.
    let mut ns = api.get("v1", "Namespace", "", "demo").unwrap();
    ns["metadata"]["labels"]["istio-injection"] = json!("enabled");
    api.update(ns).unwrap();

    // Opted out: by label, and a host-network Pod.
    let (code, stored) = create_pod(
        &mesh,
        "demo",
        sleep_pod("opted-out", json!({"sidecar.istio.io/inject": "false"})),
    );
    assert_eq!(code, 201, "{stored}");
    assert!(!has_proxy(&stored), "{stored}");
    let mut host = sleep_pod("host-net", json!({}));
    host["spec"]["hostNetwork"] = json!(true);
    let (code, stored) = create_pod(&mesh, "demo", host);
    assert_eq!(code, 201, "{stored}");
    assert!(!has_proxy(&stored), "{stored}");

    // ProxyConfig objects: the namespace's and the one selecting sleep,
    // which wins; the root namespace's environment variables join in.
    for (namespace, name, spec) in [
        (
            "istio-system",
            "mesh-wide",
            json!({"environmentVariables": {"FROM_ROOT_PROXYCONFIG": "yes"}}),
        ),
        ("demo", "namespace-wide", json!({"concurrency": 3})),
        (
            "demo",
            "sleep",
            json!({"selector": {"matchLabels": {"app": "sleep"}}, "concurrency": 1}),
        ),
    ] {
        api.create(json!({
            "apiVersion": "networking.istio.io/v1beta1", "kind": "ProxyConfig",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec
        }))
        .unwrap();
    }
    wait_for_configz(&mesh, "ProxyConfig/demo/sleep");

    // Injected.
    let (code, stored) = create_pod(
        &mesh,
        "demo",
        sleep_pod("sleep-injected", json!({"app": "sleep"})),
    );
    assert_eq!(code, 201, "{stored}");
    assert!(has_proxy(&stored), "{stored}");
    let pod = api.get("v1", "Pod", "demo", "sleep-injected").unwrap();
    assert!(pod["metadata"]["annotations"]["sidecar.istio.io/status"].is_string());

    // Run it from the stored spec alone.
    let root_cm = api
        .get("v1", "ConfigMap", "demo", "istio-ca-root-cert")
        .expect("istiod publishes istio-ca-root-cert in every namespace");
    let configmaps: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::from([(
        "istio-ca-root-cert".to_string(),
        serde_json::from_value(root_cm["data"].clone()).unwrap(),
    )]);
    let token = mesh.istiod.token("demo", "sleep");
    let facts = tests::injected::PodFacts {
        ip: "198.18.0.20".into(),
        node_name: "node-1".into(),
        host_ip: HUB_IP.into(),
        configmaps,
        token: Box::new(move |audience| {
            assert_eq!(
                audience, "istio-ca",
                "the template asks for Istio's audience"
            );
            token.clone()
        }),
    };
    let pilot_agent = tests::mesh::runnable_by_proxy(&tests::bin("pilot-agent"), tmp.path());
    let mut running = tests::injected::run(
        &mesh.hub,
        &pod,
        &facts,
        &pilot_agent,
        &tmp.path().join("sleep-injected"),
    );

    // The selected workload's ProxyConfig reaches its Envoy's command line
    // (through the PROXY_CONFIG the agent reads), and the root's
    // environment variables its proxy's environment.
    let proxy = running.container("istio-proxy").pid();
    let cmdline = tests::wait_for("Envoy's command line", Duration::from_secs(30), || {
        envoy_cmdline(proxy)
    });
    assert!(
        cmdline.windows(2).any(|w| w == ["--concurrency", "1"]),
        "{cmdline:?}"
    );
    let proxy_env = ["initContainers", "containers"]
        .iter()
        .filter_map(|list| pod["spec"][list].as_array())
        .flatten()
        .find(|c| c["name"] == "istio-proxy")
        .map(|c| c["env"].clone())
        .unwrap();
    assert!(
        proxy_env
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "FROM_ROOT_PROXYCONFIG" && e["value"] == "yes"),
        "{proxy_env}"
    );

    // Its traffic to httpbin's Service IP is captured and leaves over mTLS
    // with the Pod's identity, as the server side reports.
    let target: SocketAddr = format!("{HTTPBIN_VIP}:8000").parse().unwrap();
    let (code, body) = tests::wait_for(
        "a call through the injected sidecar",
        Duration::from_secs(30),
        || {
            tests::mesh::http_request(&running.net.ns, target, "httpbin:8000", "/headers")
                .ok()
                .filter(|(c, _)| *c == 200)
        },
    );
    assert_eq!(code, 200);
    assert!(body.contains(&format!("URI={SLEEP}")), "{body}");

    // The validation webhook, through the API: a bad weight is refused,
    // naming the field.
    let mut vs = api
        .get(
            "networking.istio.io/v1",
            "VirtualService",
            "demo",
            "httpbin",
        )
        .unwrap();
    vs["spec"]["http"][0]["route"][0]["weight"] = json!(150);
    // Istio's validator selects objects of its revision.
    vs["metadata"]["labels"] = json!({"istio.io/rev": "default"});
    let (code, status) = api_request(
        &mesh,
        "PUT",
        "/apis/networking.istio.io/v1/namespaces/demo/virtualservices/httpbin",
        &vs,
    );
    assert_eq!(code, 400, "{status}");
    let message = status["message"].as_str().unwrap();
    assert!(message.contains("denied the request"), "{message}");
    assert!(
        message.contains("spec.http[0].route[0].weight"),
        "{message}"
    );
}
