//! The local mesh with istiod on Kubernetes: the sample's objects live in
//! the API stand-in, istiod reads them with `--kubeconfig` (no config
//! directory), and real Envoys in captured Pods follow what the API says:
//! a VirtualService edited or deleted changes the route, and an
//! EndpointSlice change reaches Envoy as EDS alone; a Kubernetes Ingress
//! of Istio's class routes outside clients through the ingress gateway.
//! A VM-shaped workload (an agent and an app, no Pod object) joins through
//! a WorkloadGroup: its WorkloadEntry is written to the API, its probe's
//! result becomes the entry's `Healthy` condition, and the entry is gone
//! once the agent has stopped for the grace period.

#![allow(clippy::unwrap_used)]

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
/// The VM's address on the hub, and the name Istio gives its entry.
const VM_IP: &str = "198.18.0.40";
const VM_ENTRY: &str = "vm-198.18.0.40";
const VM_ID: &str = "spiffe://cluster.local/ns/demo/sa/vm";

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
        (mesh.httpbin_versions(20).get("v2") == Some(&20)).then_some(())
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
        let c = mesh.httpbin_versions(40);
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
        (mesh.httpbin_versions(20).get("v1") == Some(&20)).then_some(())
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

/// Serves `GET /ready` on `port` inside `ns`: 200 while `healthy` holds,
/// else 503 (the VM application's health endpoint).
fn serve_health(
    ns: &tests::netns::Netns,
    port: u16,
    healthy: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use std::io::{Read, Write};
    let listener =
        ns.run(move || std::net::TcpListener::bind(("0.0.0.0", port)).expect("bind health"));
    std::thread::spawn(move || {
        for conn in listener.incoming().take(100_000) {
            let Ok(mut c) = conn else { continue };
            let mut buf = [0u8; 2048];
            let _ = c.read(&mut buf);
            let status = if healthy.load(std::sync::atomic::Ordering::SeqCst) {
                "200 OK"
            } else {
                "503 Service Unavailable"
            };
            let _ = c.write_all(
                format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            );
        }
    });
}

fn healthy_condition(entry: &serde_json::Value) -> Option<String> {
    entry["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Healthy")
        .and_then(|c| c["status"].as_str())
        .map(String::from)
}

#[test]
fn a_vm_joins_through_a_workload_group() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mut mesh = LocalMesh::start_kube(tmp.path());
    // The API is held here; the mesh is changed below (a VM added, stopped).
    let api = mesh.kube_api.take().unwrap();
    api.create(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "vm-app", "namespace": "demo"},
        "spec": {"clusterIP": "198.19.0.40", "selector": {"app": "vm"},
                 "ports": [{"name": "http", "port": 8080, "targetPort": 8080}]}
    }))
    .unwrap();
    api.create(json!({
        "apiVersion": "networking.istio.io/v1", "kind": "WorkloadGroup",
        "metadata": {"name": "vm", "namespace": "demo"},
        "spec": {
            "metadata": {"labels": {"app": "vm"}},
            "template": {"serviceAccount": "vm"},
            "probe": {"periodSeconds": 1, "httpGet": {"path": "/ready", "port": 8081}}
        }
    }))
    .unwrap();

    // The VM: an agent with the group's probe (as `istioctl x workload
    // entry configure` writes it into the mesh config), no Pod object.
    mesh.add_vm(
        "vm-1",
        VM_IP,
        "vm",
        &[("ISTIO_META_AUTO_REGISTER_GROUP", "vm")],
        &[("version", "vm")],
        r#", "readinessProbe": {"periodSeconds": 1, "httpGet": {"path": "/ready", "port": 8081}}"#,
    );
    let healthy = Arc::new(AtomicBool::new(true));
    serve_health(&mesh.pod("vm-1").ns, 8081, healthy.clone());

    // Registered as Istio names it, from the group, owned by it; healthy
    // once the probe has passed.
    let entry = tests::wait_for(
        "the WorkloadEntry, Healthy=True",
        Duration::from_secs(30),
        || {
            api.get("networking.istio.io/v1", "WorkloadEntry", "demo", VM_ENTRY)
                .filter(|e| healthy_condition(e).as_deref() == Some("True"))
        },
    );
    assert_eq!(entry["spec"]["address"], VM_IP, "{entry}");
    assert_eq!(entry["spec"]["serviceAccount"], "vm", "{entry}");
    assert_eq!(entry["metadata"]["labels"]["app"], "vm", "{entry}");
    assert_eq!(entry["metadata"]["labels"]["version"], "vm", "{entry}");
    let annotations = &entry["metadata"]["annotations"];
    assert_eq!(
        annotations["istio.io/autoRegistrationGroup"], "vm",
        "{entry}"
    );
    assert!(
        annotations["istio.io/workloadController"].is_string(),
        "{entry}"
    );
    assert!(annotations["istio.io/connectedAt"].is_string(), "{entry}");
    assert_eq!(annotations["proxy.istio.io/health-checks-enabled"], "true");
    let owner = &entry["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["kind"], &owner["name"]),
        (&json!("WorkloadGroup"), &json!("vm"))
    );

    // A meshed client reaches it by the Service's name, over mTLS (the
    // namespace is STRICT): the VM's Envoy saw sleep's identity.
    let body = tests::wait_for(
        "the VM answering sleep",
        Duration::from_secs(30),
        || match mesh.app_curl("sleep-1", "http://vm-app:8080/") {
            Ok((200, body)) => Some(body),
            _ => None,
        },
    );
    assert!(body.contains("version=vm"), "{body}");
    assert!(body.contains(&format!("By={VM_ID}")), "{body}");
    assert!(body.contains(&format!("URI={SLEEP}")), "{body}");

    // The probe fails: the entry says Healthy=False with the probe's
    // message, and the client's Envoy has no endpoint left for it.
    healthy.store(false, Ordering::SeqCst);
    let entry = tests::wait_for("Healthy=False", Duration::from_secs(30), || {
        api.get("networking.istio.io/v1", "WorkloadEntry", "demo", VM_ENTRY)
            .filter(|e| healthy_condition(e).as_deref() == Some("False"))
    });
    assert!(
        entry["status"]["conditions"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("503")),
        "{entry}"
    );
    tests::wait_for(
        "no traffic to the VM",
        Duration::from_secs(30),
        || match mesh.app_curl("sleep-1", "http://vm-app:8080/") {
            Ok((503, body)) if body.contains("no healthy upstream") => Some(()),
            _ => None,
        },
    );
    for _ in 0..10 {
        let (code, body) = mesh.app_curl("sleep-1", "http://vm-app:8080/").unwrap();
        assert_eq!(code, 503, "an unhealthy VM got traffic: {body}");
    }

    // Healthy again: traffic comes back.
    healthy.store(true, Ordering::SeqCst);
    tests::wait_for("the VM answering again", Duration::from_secs(30), || {
        matches!(
            mesh.app_curl("sleep-1", "http://vm-app:8080/"),
            Ok((200, _))
        )
        .then_some(())
    });

    // The agent stops: the entry is marked disconnected, kept for the
    // grace period (10s), then deleted.
    let i = mesh.pods.iter().position(|p| p.0 == "vm-1").unwrap();
    let (_, _net, _dir, agent) = mesh.pods.remove(i);
    let stopped = std::time::Instant::now();
    drop(agent);
    let entry = tests::wait_for("disconnectedAt", Duration::from_secs(30), || {
        api.get("networking.istio.io/v1", "WorkloadEntry", "demo", VM_ENTRY)
            .filter(|e| e["metadata"]["annotations"]["istio.io/disconnectedAt"].is_string())
    });
    assert!(
        entry["metadata"]["annotations"]["istio.io/connectedAt"].is_null(),
        "{entry}"
    );
    tests::wait_for("the WorkloadEntry gone", Duration::from_secs(60), || {
        api.get("networking.istio.io/v1", "WorkloadEntry", "demo", VM_ENTRY)
            .is_none()
            .then_some(())
    });
    assert!(
        stopped.elapsed() >= Duration::from_secs(9),
        "deleted after {:?}, before the grace period",
        stopped.elapsed()
    );
}
