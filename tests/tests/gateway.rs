//! An ingress gateway: `pilot-agent proxy router` with a real Envoy, in a
//! network namespace of its own without iptables capture (as Istio's
//! gateways run), configured by istiod from an Istio `Gateway` and the
//! VirtualService bound to it. A client outside the mesh reaches httpbin
//! through it; inside the mesh the gateway speaks mTLS with its own SPIFFE
//! identity; the sidecars' routing is untouched by a VirtualService bound
//! only to the gateway; removing the Gateway removes its listener.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use tests::gateway_pod::GatewaySpec;
use tests::mesh::{LocalMesh, http_request};
use tests::wait_for;

const WAIT: Duration = Duration::from_secs(60);

/// The gateway Pod's address on the hub.
const GATEWAY_IP: &str = "198.18.0.20";
/// A client outside the mesh.
const CLIENT_IP: &str = "198.18.0.30";
/// The gateway's identity.
const GATEWAY_ID: &str = "spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway";
const HTTPBIN_HOST: &str = "httpbin.demo.svc.cluster.local";

const GATEWAY: &str = r#"apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["*"]
"#;

/// Bound to the gateway only: everything to httpbin v2, marked.
const GATEWAY_ROUTES: &str = r#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: httpbin-ingress, namespace: demo}
spec:
  hosts: [httpbin.demo.svc.cluster.local]
  gateways: [istio-system/ingress]
  http:
  - name: ingress
    match:
    - uri: {prefix: /}
    headers:
      request:
        set: {x-via: ingress}
    route:
    - destination:
        host: httpbin.demo.svc.cluster.local
        subset: v2
        port: {number: 8000}
"#;

fn line<'a>(body: &'a str, key: &str) -> &'a str {
    body.lines().find_map(|l| l.strip_prefix(key)).unwrap_or("")
}

fn write_atomically(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn an_ingress_gateway_routes_outside_clients_into_the_mesh_over_mtls() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);

    // The sample's 90/10 VirtualService goes, so that the sidecars route
    // httpbin by default (both versions): a gateway-only VirtualService
    // applied to them by mistake would show (v2 only, marked).
    let istio_yaml = mesh.config_dir.join("istio.yaml");
    let text = std::fs::read_to_string(&istio_yaml).unwrap();
    let kept: Vec<&str> = text
        .split("\n---\n")
        .filter(|doc| !doc.contains("kind: VirtualService"))
        .collect();
    write_atomically(&istio_yaml, &kept.join("\n---\n"));
    let gateway_file = mesh.config_dir.join("gateway.yaml");
    write_atomically(&gateway_file, &format!("{GATEWAY}---\n{GATEWAY_ROUTES}"));

    // The gateway Pod: no iptables, the agent as `proxy router`.
    let mut gw = mesh.start_gateway(&GatewaySpec::ingress(GATEWAY_IP));

    let client = mesh.plain_pod(CLIENT_IP);
    let gateway: SocketAddr = format!("{GATEWAY_IP}:8080").parse().unwrap();
    let body = wait_for("httpbin through the gateway", WAIT, || {
        gw.assert_alive();
        match http_request(&client.ns, gateway, HTTPBIN_HOST, "/headers") {
            Ok((200, body)) => Some(body),
            _ => None,
        }
    });
    assert_eq!(line(&body, "version="), "v2", "{body}");
    assert!(
        body.lines()
            .any(|l| l.eq_ignore_ascii_case("header=x-via: ingress")),
        "the gateway's route set the header: {body}"
    );
    let xfcc = line(&body, "xfcc=");
    assert!(
        xfcc.contains(&format!("URI={GATEWAY_ID}")),
        "httpbin's sidecar saw the gateway's identity over mTLS: {xfcc}"
    );

    // A host no VirtualService binds: Istio's 404 from the gateway.
    let (code, _) = http_request(&client.ns, gateway, "unknown.example.com", "/").unwrap();
    assert_eq!(code, 404);

    // The sidecars: default routing to both versions, nothing marked.
    let mut versions = std::collections::BTreeSet::new();
    for _ in 0..30 {
        let (code, body) = mesh.call_httpbin().unwrap();
        assert_eq!(code, 200, "{body}");
        assert!(
            !body.to_ascii_lowercase().contains("x-via"),
            "the gateway's VirtualService reached a sidecar: {body}"
        );
        versions.insert(line(&body, "version=").to_string());
    }
    assert_eq!(
        versions.into_iter().collect::<Vec<_>>(),
        ["v1", "v2"],
        "sleep reaches both versions, as without any VirtualService"
    );

    // The Gateway goes (its VirtualService stays): its listener goes with it.
    write_atomically(&gateway_file, GATEWAY_ROUTES);
    wait_for("the gateway's port closed", WAIT, || {
        match http_request(&client.ns, gateway, HTTPBIN_HOST, "/headers") {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(()),
            _ => None,
        }
    });
    gw.assert_alive();
}
