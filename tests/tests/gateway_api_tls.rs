//! Gateway API listeners beyond HTTP, with real Envoys configured by
//! istiod as Istio's gateway controller translates them, once with istiod
//! on the file source and once on Kubernetes (the API stand-in: objects
//! created and deleted through the API, status read back from the objects
//! as istiod writes it):
//! - an `HTTPS` listener whose `certificateRefs` names a Secret of another
//!   namespace reports `ResolvedRefs=False` (`RefNotPermitted`) and serves
//!   nothing (Istio emits no Gateway for it: the port is closed); once a
//!   `ReferenceGrant` in the Secret's namespace allows it, a client outside
//!   the mesh gets 200 over TLS and sees the Secret's certificate, which
//!   istiod served over SDS to the gateway of the other namespace;
//! - a `TLS` `Passthrough` listener with a `TLSRoute` forwards by SNI to a
//!   server whose own certificate the client sees;
//! - a `TCP` listener with a `TCPRoute` forwards bytes both ways.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use tests::backends::{echo_backend, tls_backend, tls_exchange};
use tests::gateway_api_source::{GatewayApiMesh, Source};
use tests::gateway_pod::GatewaySpec;
use tests::netns::Netns;
use tests::tls::{HttpsError, https_request};
use tests::wait_for;

const WAIT: Duration = Duration::from_secs(60);

/// The gateway Pod's address on the hub.
const GATEWAY_IP: &str = "198.18.0.22";
/// A client outside the mesh.
const CLIENT_IP: &str = "198.18.0.32";
/// A TLS server outside the mesh (Service `tls-backend`).
const TLS_BACKEND_IP: &str = "198.18.0.63";
/// A TCP echo server outside the mesh (Service `echo`).
const ECHO_IP: &str = "198.18.0.64";
const HOST: &str = "httpbin.example.com";
const HTTPS_PORT: u16 = 8443;
const TLS_PORT: u16 = 9443;
const TCP_PORT: u16 = 9400;

const GATEWAY: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: ingress, namespace: istio-system}
spec:
  gatewayClassName: istio
  listeners:
  - name: https
    hostname: httpbin.example.com
    port: 8443
    protocol: HTTPS
    tls:
      mode: Terminate
      certificateRefs: [{name: httpbin-cert, namespace: cert}]
    allowedRoutes: {namespaces: {from: All}}
  - name: tls
    port: 9443
    protocol: TLS
    tls: {mode: Passthrough}
    allowedRoutes: {namespaces: {from: All}}
  - name: tcp
    port: 9400
    protocol: TCP
    allowedRoutes: {namespaces: {from: All}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: httpbin, namespace: demo}
spec:
  parentRefs: [{name: ingress, namespace: istio-system, sectionName: https}]
  hostnames: [httpbin.example.com]
  rules:
  - backendRefs: [{name: httpbin, port: 8000}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {name: backend-by-sni, namespace: demo}
spec:
  parentRefs: [{name: ingress, namespace: istio-system, sectionName: tls}]
  hostnames: [a.example.com]
  rules:
  - backendRefs: [{name: tls-backend, port: 443}]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: {name: echo, namespace: demo}
spec:
  parentRefs: [{name: ingress, namespace: istio-system, sectionName: tcp}]
  rules:
  - backendRefs: [{name: echo, port: 9000}]
"#;

/// The layer-4 backends: Services whose endpoints are Pods outside the mesh.
const BACKENDS: &str = r#"apiVersion: v1
kind: Service
metadata: {name: tls-backend, namespace: demo}
spec:
  clusterIP: 198.19.0.63
  ports: [{name: tls, port: 443, targetPort: 443}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: tls-backend-a, namespace: demo, labels: {kubernetes.io/service-name: tls-backend}}
addressType: IPv4
ports: [{name: tls, port: 443, protocol: TCP}]
endpoints:
- addresses: [198.18.0.63]
  conditions: {ready: true}
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: demo}
spec:
  clusterIP: 198.19.0.64
  ports: [{name: tcp, port: 9000, targetPort: 9000}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: echo-a, namespace: demo, labels: {kubernetes.io/service-name: echo}}
addressType: IPv4
ports: [{name: tcp, port: 9000, protocol: TCP}]
endpoints:
- addresses: [198.18.0.64]
  conditions: {ready: true}
"#;

/// The namespaces of the test's objects beyond the sample's (the API
/// refuses objects in a namespace that does not exist).
const NAMESPACES: &str = r#"apiVersion: v1
kind: Namespace
metadata: {name: cert}
"#;

const GRANT: &str = r#"apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: gateways-of-istio-system, namespace: cert}
spec:
  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: istio-system}]
  to: [{group: "", kind: Secret, name: httpbin-cert}]
"#;

/// A CA and a certificate it signs for `dns`: (CA PEM, leaf PEM, key PEM).
fn signed_cert(ca_name: &str, dns: &str) -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, ca_name);
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let mut leaf = rcgen::CertificateParams::new(vec![dns.to_string()]).unwrap();
    leaf.distinguished_name.push(rcgen::DnType::CommonName, dns);
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    (ca_pem, cert.pem(), key.serialize_pem())
}

fn der(pem: &str) -> Vec<u8> {
    common::pki::pem_certs("cert", pem).unwrap()[0]
        .as_ref()
        .to_vec()
}

/// The Secret `cert/httpbin-cert` (`kubernetes.io/tls`).
fn secret(cert: &str, key: &str) -> String {
    let block = |pem: &str| {
        pem.lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    };
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: httpbin-cert, namespace: cert}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
        block(cert),
        block(key)
    )
}

/// Two exchanges over one TCP connection: each answer read back.
fn tcp_exchange(ns: &Netns, addr: SocketAddr) -> std::io::Result<(String, String)> {
    ns.run(move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut one = |data: &[u8]| -> std::io::Result<String> {
            s.write_all(data)?;
            let mut buf = [0u8; 256];
            let n = s.read(&mut buf)?;
            Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
        };
        Ok((one(b"ping")?, one(b"pong")?))
    })
}

#[test]
fn gateway_api_tls_listeners_and_layer_4_routes_on_files() {
    tls_listeners_and_layer_4_routes(Source::Files);
}

#[test]
fn gateway_api_tls_listeners_and_layer_4_routes_on_kubernetes() {
    tls_listeners_and_layer_4_routes(Source::Kube);
}

fn tls_listeners_and_layer_4_routes(source: Source) {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let m = GatewayApiMesh::start(source, tmp.path());
    let mesh = &m.mesh;

    let (server_ca, server_cert, server_key) = signed_cert("gateway CA", HOST);
    let (backend_ca, backend_cert, backend_key) = signed_cert("backend CA", "a.example.com");
    m.apply("namespaces.yaml", NAMESPACES);
    m.apply("secret.yaml", &secret(&server_cert, &server_key));
    m.apply("backends.yaml", BACKENDS);
    m.apply("gateway-api.yaml", GATEWAY);

    let backend = mesh.plain_pod(TLS_BACKEND_IP);
    tls_backend(
        &backend.ns,
        format!("{TLS_BACKEND_IP}:443").parse().unwrap(),
        &backend_cert,
        &backend_key,
    );
    let echo = mesh.plain_pod(ECHO_IP);
    echo_backend(&echo.ns, format!("{ECHO_IP}:9000").parse().unwrap());

    // The gateway Pod, labelled as Istio's automated deployment labels it.
    let mut gw = mesh.start_gateway(&GatewaySpec::gateway_api_ingress(GATEWAY_IP));
    let client = mesh.plain_pod(CLIENT_IP);

    // TCP: bytes to the echo backend and back, twice on one connection.
    let tcp: SocketAddr = format!("{GATEWAY_IP}:{TCP_PORT}").parse().unwrap();
    let echoed = wait_for("echo through the TCPRoute", WAIT, || {
        assert!(
            gw.agent.alive(),
            "the gateway's agent exited:\n{}",
            gw.agent.log()
        );
        tcp_exchange(&client.ns, tcp).ok()
    });
    assert_eq!(echoed, ("echo:ping".to_string(), "echo:pong".to_string()));

    // Passthrough: the handshake is the backend's own, for its SNI.
    let tls: SocketAddr = format!("{GATEWAY_IP}:{TLS_PORT}").parse().unwrap();
    let (leaf, answer) = wait_for("a.example.com through the TLSRoute", WAIT, || {
        tls_exchange(&client.ns, tls, "a.example.com", &backend_ca).ok()
    });
    assert_eq!(leaf, der(&backend_cert), "the backend's certificate");
    assert_eq!(answer, "tls-backend:a.example.com:hello");

    // The Secret of another namespace without a grant: the listener is
    // refused in status and no Gateway is generated for it, so the
    // gateway (whose other listeners are up) has nothing on the port.
    m.expect_status(
        "Gateway/istio-system/ingress",
        &[
            "listener https (1 routes): ResolvedRefs=False (RefNotPermitted): certificateRef httpbin-cert/cert not accessible to a Gateway in namespace \\\"istio-system\\\" (missing a ReferenceGrant?)",
            "listener https (1 routes): Programmed=False (Invalid): Bad TLS configuration",
        ],
        WAIT,
    );
    let https = |root: &str| {
        let root = root.to_string();
        let addr: SocketAddr = format!("{GATEWAY_IP}:{HTTPS_PORT}").parse().unwrap();
        client
            .ns
            .run(move || https_request(addr, HOST, &root, None, "/headers"))
    };
    match https(&server_ca) {
        Err(HttpsError::Connect(std::io::ErrorKind::ConnectionRefused)) => {}
        other => panic!("expected the HTTPS port closed, got {other:?}"),
    }

    // The grant: the listener is programmed, istiod serves the Secret of
    // namespace cert to the gateway of istio-system, and the client sees it.
    m.apply("grant.yaml", GRANT);
    let resp = wait_for("httpbin over HTTPS once granted", WAIT, || {
        assert!(gw.agent.alive(), "{}", gw.agent.log());
        https(&server_ca).ok().filter(|r| r.status == 200)
    });
    assert_eq!(resp.leaf, der(&server_cert), "the Secret's certificate");
    m.expect_status(
        "Gateway/istio-system/ingress",
        &["listener https (1 routes): ResolvedRefs=True"],
        WAIT,
    );
    m.expect_status(
        "TLSRoute/demo/backend-by-sni",
        &["Accepted=True (Accepted)"],
        WAIT,
    );
    m.expect_status("TCPRoute/demo/echo", &["ResolvedRefs=True"], WAIT);

    // The grant withdrawn: the port closes again, and the status says why.
    m.remove("grant.yaml");
    wait_for("the HTTPS port closed without the grant", WAIT, || {
        matches!(
            https(&server_ca),
            Err(HttpsError::Connect(std::io::ErrorKind::ConnectionRefused))
        )
        .then_some(())
    });
    m.expect_status(
        "Gateway/istio-system/ingress",
        &["listener https (1 routes): ResolvedRefs=False (RefNotPermitted)"],
        WAIT,
    );
    assert!(gw.agent.alive(), "{}", gw.agent.log());
}
