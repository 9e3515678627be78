//! Gateway API `ListenerSet`s, with real Envoys configured by istiod through
//! the file source, as Istio's gateway controller translates them:
//! - a Gateway whose `allowedListeners` admits its own namespace takes the
//!   HTTP listener of a ListenerSet there on a second port; an HTTPRoute
//!   whose parent is the ListenerSet answers 200 through the gateway on
//!   that port, and the ListenerSet's status is `Accepted` and
//!   `Programmed` with its listener's route counted;
//! - a ListenerSet of another namespace, which the Gateway does not admit,
//!   is `NotAllowed` and its port stays closed (connection refused) once
//!   the gateway has the configuration that opened the admitted one;
//! - a mesh `TCPRoute` (its parent the Service `echo-a`) sends sleep's
//!   sidecar's TCP connections for `echo-a` to `echo-b`: the echo that
//!   answers says which it is.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use tests::gateway_pod::GatewaySpec;
use tests::mesh::{LocalMesh, http_request};
use tests::netns::Netns;
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

/// Two TCP echo Services whose endpoints are Pods outside the mesh.
const ECHOES: &str = r#"apiVersion: v1
kind: Service
metadata: {name: echo-a, namespace: demo}
spec:
  clusterIP: 198.19.0.67
  ports: [{name: tcp, port: 9000, targetPort: 9000}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: echo-a-1, namespace: demo, labels: {kubernetes.io/service-name: echo-a}}
addressType: IPv4
ports: [{name: tcp, port: 9000, protocol: TCP}]
endpoints:
- addresses: [198.18.0.67]
  conditions: {ready: true}
---
apiVersion: v1
kind: Service
metadata: {name: echo-b, namespace: demo}
spec:
  clusterIP: 198.19.0.68
  ports: [{name: tcp, port: 9000, targetPort: 9000}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: echo-b-1, namespace: demo, labels: {kubernetes.io/service-name: echo-b}}
addressType: IPv4
ports: [{name: tcp, port: 9000, protocol: TCP}]
endpoints:
- addresses: [198.18.0.68]
  conditions: {ready: true}
"#;

/// The mesh route: connections for `echo-a` go to `echo-b`.
const MESH_TCP_ROUTE: &str = r#"apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: {name: echo-a-to-b, namespace: demo}
spec:
  parentRefs: [{group: "", kind: Service, name: echo-a}]
  rules:
  - backendRefs: [{name: echo-b, port: 9000}]
"#;

/// A TCP server in `ns` answering each read with `<name>:<bytes>`.
fn named_echo(ns: &Netns, addr: SocketAddr, name: &'static str) {
    let listener = ns.run(move || std::net::TcpListener::bind(addr).unwrap());
    std::thread::spawn(move || {
        for sock in listener.incoming().take(1_000) {
            let Ok(mut sock) = sock else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 256];
                while let Ok(n) = sock.read(&mut buf) {
                    if n == 0
                        || sock
                            .write_all(&[name.as_bytes(), b":", &buf[..n]].concat())
                            .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
}

/// One exchange over a new TCP connection from `ns`: the answer.
fn exchange(ns: &Netns, addr: SocketAddr) -> std::io::Result<String> {
    ns.run(move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"ping")?;
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    })
}

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

    // A mesh TCPRoute: sleep's connections for echo-a reach echo-b.
    let a = mesh.plain_pod("198.18.0.67");
    named_echo(&a.ns, "198.18.0.67:9000".parse().unwrap(), "a");
    let b = mesh.plain_pod("198.18.0.68");
    named_echo(&b.ns, "198.18.0.68:9000".parse().unwrap(), "b");
    tests::write_atomically(&mesh.config_dir.join("echoes.yaml"), ECHOES);
    let sleep = &mesh.pod("sleep-1").ns;
    let echo_a: SocketAddr = "198.19.0.67:9000".parse().unwrap();
    wait_for("echo-a answering sleep before the route", WAIT, || {
        exchange(sleep, echo_a).ok().filter(|r| r == "a:ping")
    });
    tests::write_atomically(&mesh.config_dir.join("mesh-tcp.yaml"), MESH_TCP_ROUTE);
    wait_for(
        "echo-b answering for echo-a through the TCPRoute",
        WAIT,
        || exchange(sleep, echo_a).ok().filter(|r| r == "b:ping"),
    );
    // Every later connection follows the route.
    for _ in 0..5 {
        assert_eq!(exchange(sleep, echo_a).unwrap(), "b:ping");
    }
    let route = mesh.gateway_api_status("TCPRoute/demo/echo-a-to-b");
    assert!(
        route.contains("parent echo-a: Accepted=True (Accepted): Route was valid"),
        "{route}"
    );
}
