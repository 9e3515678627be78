//! Gateways that forward connections instead of HTTP requests, and an
//! egress gateway, with real Envoys configured by istiod:
//! - a `TLS` server in `PASSTHROUGH` mode routes a client outside the mesh
//!   by SNI to a server that terminates TLS itself (the client sees that
//!   server's certificate, not a gateway's); an SNI no route names is
//!   closed by the gateway;
//! - a `TCP` server forwards bytes to a backend and back;
//! - the sleep Pod's request to a ServiceEntry host goes, by a
//!   VirtualService bound to `mesh`, to the egress gateway Pod, which sends
//!   it out of the mesh by a VirtualService bound to its Gateway.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use tests::PodDir;
use tests::backends::{echo_backend, tls_backend, tls_exchange};
use tests::mesh::{LocalMesh, MESH_PROXY_CONFIG, serve_app};
use tests::netns::Netns;
use tests::wait_for;

const WAIT: Duration = Duration::from_secs(60);

/// The ingress gateway Pod's address on the hub.
const GATEWAY_IP: &str = "198.18.0.20";
/// The egress gateway Pod's address.
const EGRESS_IP: &str = "198.18.0.21";
/// A client outside the mesh.
const CLIENT_IP: &str = "198.18.0.30";
/// A TLS server outside the mesh, `a.example.com`.
const TLS_BACKEND_IP: &str = "198.18.0.60";
/// A TCP server outside the mesh, `echo.example.com`.
const ECHO_IP: &str = "198.18.0.61";
/// An HTTP server outside the mesh, `external.example.com`.
const EXTERNAL_IP: &str = "198.18.0.62";

const INGRESS: &str = r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: a, namespace: demo}
spec:
  hosts: [a.example.com]
  ports: [{number: 443, name: tls, protocol: TLS}]
  resolution: STATIC
  location: MESH_EXTERNAL
  endpoints: [{address: 198.18.0.60}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: echo, namespace: demo}
spec:
  hosts: [echo.example.com]
  ports: [{number: 9000, name: tcp, protocol: TCP}]
  resolution: STATIC
  location: MESH_EXTERNAL
  endpoints: [{address: 198.18.0.61}]
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: edge, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8443, name: tls, protocol: TLS}
    hosts: ["*.example.com"]
    tls: {mode: PASSTHROUGH}
  - port: {number: 31400, name: tcp, protocol: TCP}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: a-by-sni, namespace: demo}
spec:
  hosts: [a.example.com]
  gateways: [istio-system/edge]
  tls:
  - match: [{sniHosts: [a.example.com], port: 8443}]
    route: [{destination: {host: a.example.com, port: {number: 443}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo-tcp, namespace: demo}
spec:
  hosts: ["*"]
  gateways: [istio-system/edge]
  tcp:
  - match: [{port: 31400}]
    route: [{destination: {host: echo.example.com, port: {number: 9000}}}]
"#;

/// Istio's egress gateway task for plain HTTP: the gateway's Pod and
/// Service, the external host, a Gateway for it on the egress gateway, and
/// the two VirtualServices (sidecars to the gateway; the gateway out).
const EGRESS: &str = r#"apiVersion: v1
kind: Service
metadata: {name: istio-egressgateway, namespace: istio-system, labels: {istio: egressgateway}}
spec:
  clusterIP: 198.19.0.30
  selector: {istio: egressgateway}
  ports: [{name: http, port: 80, targetPort: 80}]
---
apiVersion: v1
kind: Pod
metadata:
  name: istio-egressgateway-1
  namespace: istio-system
  labels: {istio: egressgateway, app: istio-egressgateway}
spec:
  serviceAccountName: istio-egressgateway
  containers: [{name: istio-proxy, image: proxyv2}]
status: {phase: Running, podIP: 198.18.0.21}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: istio-egressgateway-x1
  namespace: istio-system
  labels: {kubernetes.io/service-name: istio-egressgateway}
addressType: IPv4
ports: [{name: http, port: 80, protocol: TCP}]
endpoints:
- addresses: [198.18.0.21]
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: istio-system, name: istio-egressgateway-1}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: external, namespace: demo}
spec:
  hosts: [external.example.com]
  addresses: [198.19.0.50]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  location: MESH_EXTERNAL
  endpoints: [{address: 198.18.0.62}]
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: istio-egressgateway, namespace: istio-system}
spec:
  selector: {istio: egressgateway}
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: [external.example.com]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: external-via-egress, namespace: demo}
spec:
  hosts: [external.example.com]
  gateways: [mesh]
  http:
  - route:
    - destination:
        host: istio-egressgateway.istio-system.svc.cluster.local
        port: {number: 80}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: external-from-egress, namespace: demo}
spec:
  hosts: [external.example.com]
  gateways: [istio-system/istio-egressgateway]
  http:
  - route:
    - destination:
        host: external.example.com
        port: {number: 80}
"#;

/// A gateway Pod: its own network, no iptables, `pilot-agent proxy router`
/// with the given identity and `istio: <istio_label>`.
fn start_gateway(
    mesh: &LocalMesh,
    name: &str,
    ip: &str,
    istio_label: &str,
) -> (tests::mesh::PodNet, tests::Proc) {
    let net = mesh.hub.pod("gw", ip);
    let pod_dir = PodDir::new(
        &mesh.dir.join(name),
        &mesh.istiod.token("istio-system", name),
        Some(&mesh.istiod.root_pem()),
    );
    pod_dir.write_labels(&[("istio", istio_label), ("app", name)]);
    let agent = pod_dir.start_router_with(
        &net.ns,
        &[
            ("POD_NAME", &format!("{name}-1")),
            ("POD_NAMESPACE", "istio-system"),
            ("SERVICE_ACCOUNT", name),
            ("INSTANCE_IP", ip),
            ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
        ],
        MESH_PROXY_CONFIG,
    );
    (net, agent)
}

/// A CA and a server certificate it signs for `dns`: (CA PEM, leaf PEM, key PEM).
fn server_cert(dns: &str) -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "backend CA");
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let mut leaf = rcgen::CertificateParams::new(vec![dns.to_string()]).unwrap();
    leaf.distinguished_name.push(rcgen::DnType::CommonName, dns);
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    (ca_pem, cert.pem(), key.serialize_pem())
}

/// One exchange over plain TCP from `ns`: sends `data`, reads one answer.
fn tcp_exchange(ns: &Netns, addr: SocketAddr, data: &'static [u8]) -> std::io::Result<String> {
    ns.run(move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(data)?;
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    })
}

/// A counter from the Envoy `/stats` of the Pod network `ns`.
fn envoy_stat(ns: &Netns, name: &str) -> u64 {
    let name = name.to_string();
    ns.run(move || {
        let (_, body) = tests::http_get(SocketAddr::from(([127, 0, 0, 1], 15000)), "/stats")
            .unwrap_or_default();
        body.lines()
            .find_map(|l| {
                l.strip_prefix(&format!("{name}: "))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    })
}

/// The Envoy `/stats` lines of `ns` containing `needle` (for failures).
fn stats_matching(ns: &Netns, needle: &'static str) -> String {
    ns.run(move || {
        let (_, body) = tests::http_get(SocketAddr::from(([127, 0, 0, 1], 15000)), "/stats")
            .unwrap_or_default();
        body.lines()
            .filter(|l| l.contains(needle))
            .collect::<Vec<_>>()
            .join("\n")
    })
}

#[test]
fn a_gateway_passes_tls_through_by_sni_and_forwards_tcp() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    tests::write_atomically(&mesh.config_dir.join("gateway-tcp.yaml"), INGRESS);

    let (ca_pem, cert, key) = server_cert("a.example.com");
    let backend = mesh.plain_pod(TLS_BACKEND_IP);
    tls_backend(
        &backend.ns,
        format!("{TLS_BACKEND_IP}:443").parse().unwrap(),
        &cert,
        &key,
    );
    let echo = mesh.plain_pod(ECHO_IP);
    echo_backend(&echo.ns, format!("{ECHO_IP}:9000").parse().unwrap());
    let (_gw_net, mut agent) =
        start_gateway(&mesh, "istio-ingressgateway", GATEWAY_IP, "ingressgateway");
    let client = mesh.plain_pod(CLIENT_IP);

    // PASSTHROUGH: the handshake is the backend's, verified for a.example.com
    // against the backend's own CA, and the bytes reach it and come back.
    let tls_port: SocketAddr = format!("{GATEWAY_IP}:8443").parse().unwrap();
    let (leaf, answer) = wait_for("a.example.com through the gateway", WAIT, || {
        assert!(
            agent.alive(),
            "the gateway's agent exited:\n{}",
            agent.log()
        );
        tls_exchange(&client.ns, tls_port, "a.example.com", &ca_pem).ok()
    });
    let backend_der = common::pki::pem_certs("server", &cert).unwrap()[0]
        .as_ref()
        .to_vec();
    assert_eq!(
        leaf, backend_der,
        "the client saw the backend's certificate"
    );
    assert_eq!(answer, "tls-backend:a.example.com:hello");

    // An SNI no route names: the gateway has no filter chain for it and
    // closes the connection before any certificate is sent.
    let refused = tls_exchange(&client.ns, tls_port, "b.example.com", &ca_pem).unwrap_err();
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::ConnectionReset,
        "{refused:?}"
    );

    // TCP: bytes to the echo backend and back.
    let tcp_port: SocketAddr = format!("{GATEWAY_IP}:31400").parse().unwrap();
    let echoed = wait_for("echo through the gateway", WAIT, || {
        tcp_exchange(&client.ns, tcp_port, b"ping").ok()
    });
    assert_eq!(echoed, "echo:ping");
    assert!(agent.alive(), "{}", agent.log());
}

#[test]
fn an_egress_gateway_takes_a_service_entry_host_out_of_the_mesh() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    tests::write_atomically(&mesh.config_dir.join("egress.yaml"), EGRESS);

    let external = mesh.plain_pod(EXTERNAL_IP);
    serve_app(
        &external.ns,
        format!("{EXTERNAL_IP}:80").parse().unwrap(),
        "external",
    );
    let (gw_net, mut agent) =
        start_gateway(&mesh, "istio-egressgateway", EGRESS_IP, "egressgateway");

    let body = wait_for("external.example.com from sleep", WAIT, || {
        assert!(
            agent.alive(),
            "the egress gateway's agent exited:\n{}",
            agent.log()
        );
        match mesh.app_curl("sleep-1", "http://external.example.com/") {
            Ok((200, body)) => Some(body),
            _ => None,
        }
    });
    assert!(body.contains("version=external"), "{body}");
    assert!(
        body.contains(&format!("\npeer={EGRESS_IP}\n")),
        "the external server saw the egress gateway as its client: {body}"
    );
    assert!(
        envoy_stat(
            &gw_net.ns,
            "cluster.outbound|80||external.example.com;.upstream_rq_200"
        ) >= 1,
        "the gateway's Envoy counted the request to the external host: {}",
        stats_matching(&gw_net.ns, "external")
    );
    assert!(
        mesh.envoy_stat(
            "sleep-1",
            "cluster.outbound|80||istio-egressgateway.istio-system.svc.cluster.local;.upstream_rq_200"
        ) >= 1,
        "sleep's sidecar sent it to the egress gateway"
    );
}
