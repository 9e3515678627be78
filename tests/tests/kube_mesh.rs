//! The local mesh with istiod on Kubernetes: the sample's objects live in
//! the API stand-in, istiod reads them with `--kubeconfig` (no config
//! directory), and real Envoys in captured Pods follow what the API says:
//! a VirtualService edited or deleted changes the route, and an
//! EndpointSlice change reaches Envoy as EDS alone; a Kubernetes Ingress
//! of Istio's class routes outside clients through the ingress gateway.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use tests::gateway_pod::GatewaySpec;
use tests::mesh::{LocalMesh, http_request};

const SLEEP: &str = "spiffe://cluster.local/ns/demo/sa/sleep";
/// The ingress gateway Pod's address on the hub.
const GATEWAY_IP: &str = "198.18.0.20";
/// A client outside the mesh.
const CLIENT_IP: &str = "198.18.0.30";
const GATEWAY_ID: &str = "spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway";

fn versions(mesh: &LocalMesh, n: usize) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        let (code, body) = mesh.call_httpbin().unwrap();
        assert_eq!(code, 200, "{body}");
        let v = body
            .lines()
            .find_map(|l| l.strip_prefix("version="))
            .unwrap_or("?");
        *counts.entry(v.to_string()).or_default() += 1;
    }
    counts
}

#[test]
fn envoys_follow_the_kubernetes_api() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start_kube(tmp.path());
    let api = mesh.kube_api.as_ref().unwrap();

    // Services, EndpointSlices, Pods and Istio's objects from the API: the
    // app calls httpbin by name over mTLS.
    let (code, body) = mesh
        .app_curl("sleep-1", "http://httpbin:8000/headers")
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(&format!("URI={SLEEP}")), "{body}");

    // Editing the VirtualService object changes the route: all to v2.
    let mut vs = api
        .get(
            "networking.istio.io/v1",
            "VirtualService",
            "demo",
            "httpbin",
        )
        .unwrap();
    vs["spec"]["http"][0]["route"][0]["weight"] = 0.into();
    vs["spec"]["http"][0]["route"][1]["weight"] = 100.into();
    api.update(vs).unwrap();
    tests::wait_for("all traffic to v2", Duration::from_secs(20), || {
        (versions(&mesh, 20).get("v2") == Some(&20)).then_some(())
    });

    // Deleting it removes the route: both versions answer again.
    api.delete(
        "networking.istio.io/v1",
        "VirtualService",
        "demo",
        "httpbin",
    )
    .unwrap();
    tests::wait_for("both versions again", Duration::from_secs(20), || {
        let c = versions(&mesh, 40);
        (c.get("v1").copied().unwrap_or(0) > 5 && c.get("v2").copied().unwrap_or(0) > 5)
            .then_some(())
    });

    // Scaling the EndpointSlice down to v1 reaches sleep's Envoy as EDS
    // only: no cluster or listener update.
    let cds = mesh.envoy_stat("sleep-1", "cluster_manager.cds.update_success");
    let lds = mesh.envoy_stat("sleep-1", "listener_manager.lds.update_success");
    let mut slice = api
        .get(
            "discovery.k8s.io/v1",
            "EndpointSlice",
            "demo",
            "httpbin-4c5d6",
        )
        .unwrap();
    let endpoints = slice["endpoints"].as_array().unwrap().clone();
    slice["endpoints"] = endpoints
        .into_iter()
        .filter(|e| e["addresses"][0] != "198.18.0.4")
        .collect::<Vec<_>>()
        .into();
    api.update(slice).unwrap();
    tests::wait_for("only v1 left", Duration::from_secs(20), || {
        (versions(&mesh, 20).get("v1") == Some(&20)).then_some(())
    });
    assert_eq!(
        mesh.envoy_stat("sleep-1", "cluster_manager.cds.update_success"),
        cds,
        "no CDS push"
    );
    assert_eq!(
        mesh.envoy_stat("sleep-1", "listener_manager.lds.update_success"),
        lds,
        "no LDS push"
    );

    // A Kubernetes Ingress of Istio's class (by its IngressClass): the
    // ingress gateway serves its host on port 80 and routes it to httpbin
    // over mTLS with its own identity; other hosts are Istio's 404.
    api.create(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
        "metadata": {"name": "istio"},
        "spec": {"controller": "istio.io/ingress-controller"}
    }))
    .unwrap();
    api.create(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "httpbin", "namespace": "demo"},
        "spec": {
            "ingressClassName": "istio",
            "rules": [{"host": "httpbin.example.com", "http": {"paths": [
                {"path": "/status", "pathType": "Prefix",
                 "backend": {"service": {"name": "httpbin", "port": {"number": 8000}}}},
                {"path": "/headers", "pathType": "Exact",
                 "backend": {"service": {"name": "httpbin", "port": {"number": 8000}}}}
            ]}}]
        }
    }))
    .unwrap();
    let mut gw = mesh.start_gateway(&GatewaySpec::ingress(GATEWAY_IP));
    let client = mesh.plain_pod(CLIENT_IP);
    let gateway: std::net::SocketAddr = format!("{GATEWAY_IP}:80").parse().unwrap();
    let body = tests::wait_for(
        "httpbin through the Ingress",
        Duration::from_secs(60),
        || {
            gw.assert_alive();
            match http_request(&client.ns, gateway, "httpbin.example.com", "/headers") {
                Ok((200, body)) => Some(body),
                _ => None,
            }
        },
    );
    assert!(
        body.contains(&format!("URI={GATEWAY_ID}")),
        "httpbin saw the gateway's identity over mTLS: {body}"
    );
    // `Exact` /headers: a longer path is not routed; `Prefix` /status is.
    let (code, _) =
        http_request(&client.ns, gateway, "httpbin.example.com", "/headers/more").unwrap();
    assert_eq!(code, 404);
    let (code, body) =
        http_request(&client.ns, gateway, "httpbin.example.com", "/status/200").unwrap();
    assert_eq!(code, 200, "{body}");
    let (code, _) = http_request(&client.ns, gateway, "other.example.com", "/headers").unwrap();
    assert_eq!(code, 404);

    // Deleting the Ingress removes its routes and its gateway server.
    api.delete("networking.k8s.io/v1", "Ingress", "demo", "httpbin")
        .unwrap();
    tests::wait_for(
        "the Ingress's port closed",
        Duration::from_secs(30),
        || match http_request(&client.ns, gateway, "httpbin.example.com", "/headers") {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(()),
            _ => None,
        },
    );
}
