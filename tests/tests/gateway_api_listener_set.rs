//! Gateway API `ListenerSet`s, with real Envoys configured by istiod through
//! the file source, as Istio's gateway controller translates them:
//! - a Gateway whose `allowedListeners` admits its own namespace takes the
//!   HTTP listener of a ListenerSet there on a second port; an HTTPRoute
//!   whose parent is the ListenerSet answers 200 through the gateway on
//!   that port, and the ListenerSet's status is `Accepted` and
//!   `Programmed` with its listener's route counted;
//! - a ListenerSet of another namespace, which the Gateway does not admit,
//!   is `NotAllowed` and its port stays closed (connection refused) once
//!   the gateway has the configuration that opened the admitted one.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use tests::gateway_pod::GatewaySpec;
use tests::mesh::{LocalMesh, http_request};
use tests::wait_for;

const WAIT: Duration = Duration::from_secs(60);

/// The gateway Pod's address on the hub.
const GATEWAY_IP: &str = "198.18.0.23";
/// A client outside the mesh.
const CLIENT_IP: &str = "198.18.0.33";
const HOST: &str = "httpbin.example.com";
/// The Gateway's own listener.
const GATEWAY_PORT: u16 = 8080;
/// The admitted ListenerSet's listener.
const SET_PORT: u16 = 8081;
/// The ListenerSet the Gateway does not admit.
const DENIED_PORT: u16 = 8082;

/// The Gateway, its Service (Istio's automated deployment's, so that the
/// listeners are `Programmed`), the two ListenerSets and the route.
const CONFIG: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: ingress, namespace: istio-system}
spec:
  gatewayClassName: istio
  allowedListeners: {namespaces: {from: Same}}
  listeners:
  - name: http
    port: 8080
    protocol: HTTP
    allowedRoutes: {namespaces: {from: All}}
---
apiVersion: v1
kind: Service
metadata: {name: ingress-istio, namespace: istio-system}
spec:
  clusterIP: 198.19.0.23
  selector: {gateway.networking.k8s.io/gateway-name: ingress}
  ports: [{name: http, port: 8080}, {name: http-set, port: 8081}, {name: http-denied, port: 8082}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: extra, namespace: istio-system}
spec:
  parentRef: {name: ingress}
  listeners:
  - name: second
    port: 8081
    protocol: HTTP
    hostname: httpbin.example.com
    allowedRoutes: {namespaces: {from: All}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: uninvited, namespace: demo}
spec:
  parentRef: {name: ingress, namespace: istio-system}
  listeners:
  - name: third
    port: 8082
    protocol: HTTP
    allowedRoutes: {namespaces: {from: All}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: httpbin-set, namespace: demo}
spec:
  parentRefs: [{group: gateway.networking.k8s.io, kind: ListenerSet, name: extra, namespace: istio-system}]
  hostnames: [httpbin.example.com]
  rules:
  - backendRefs: [{name: httpbin, port: 8000}]
"#;

#[test]
fn listener_sets_join_the_gateway_that_allows_them() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    tests::write_atomically(&mesh.config_dir.join("gateway-api.yaml"), CONFIG);
    let mut gw = mesh.start_gateway(&GatewaySpec::gateway_api_ingress(GATEWAY_IP));
    let client = mesh.plain_pod(CLIENT_IP);

    let get = |port: u16| {
        let addr: SocketAddr = format!("{GATEWAY_IP}:{port}").parse().unwrap();
        http_request(&client.ns, addr, HOST, "/headers")
    };
    // The admitted ListenerSet's port, routed by the route attached to it.
    let status = wait_for("httpbin through the ListenerSet's listener", WAIT, || {
        gw.assert_alive();
        get(SET_PORT).ok().filter(|(s, _)| *s == 200)
    });
    assert_eq!(status.0, 200, "{}", status.1);
    assert!(status.1.contains("httpbin"), "{}", status.1);
    // The Gateway's own listener has no route: Envoy answers 404 there,
    // which shows the port is the Gateway's while the route is the set's.
    let own = get(GATEWAY_PORT).unwrap();
    assert_eq!(own.0, 404, "{}", own.1);

    // The uninvited ListenerSet came in the same configuration that
    // opened the admitted one: nothing listens on its port.
    match get(DENIED_PORT) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
        other => panic!("expected the uninvited ListenerSet's port refused, got {other:?}"),
    }

    let set = mesh.gateway_api_status("ListenerSet/istio-system/extra");
    assert!(set.contains("Accepted=True (Accepted)"), "{set}");
    assert!(
        set.contains("Programmed=True (Programmed): Resource programmed, assigned to service(s) ingress-istio.istio-system.svc.cluster.local:8081"),
        "{set}"
    );
    assert!(
        set.contains("listener second (1 routes): Programmed=True"),
        "{set}"
    );
    let denied = mesh.gateway_api_status("ListenerSet/demo/uninvited");
    assert!(
        denied.contains(
            "Accepted=False (NotAllowed): The parent Gateway does not allow this reference"
        ),
        "{denied}"
    );
    let gateway = mesh.gateway_api_status("Gateway/istio-system/ingress");
    assert!(
        gateway.contains("ingress-istio.istio-system.svc.cluster.local:8080 and ingress-istio.istio-system.svc.cluster.local:8081"),
        "{gateway}"
    );
    let route = mesh.gateway_api_status("HTTPRoute/demo/httpbin-set");
    assert!(
        route.contains("parent istio-system/extra: Accepted=True"),
        "{route}"
    );
    gw.assert_alive();
}
