//! An ingress gateway terminating TLS with certificates istiod serves over
//! SDS from Secrets (`credentialName`), through the agent's xDS proxy: a
//! client outside the mesh reaches httpbin over HTTPS with SNI and sees the
//! Secret's certificate; MUTUAL refuses a client without a certificate and
//! admits one from the Secret's CA; a replaced Secret is served without a
//! failed request; a gateway in another namespace cannot read the Secret;
//! `httpsRedirect` answers plain HTTP with a 301.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tests::mesh::{LocalMesh, MESH_PROXY_CONFIG};
use tests::tls::{HttpsError, HttpsResponse, https_request};
use tests::wait_for;

const WAIT: Duration = Duration::from_secs(60);

/// The gateway Pod in `istio-system`.
const GATEWAY_IP: &str = "198.18.0.20";
/// A second gateway Pod, in namespace `other`, selected by the same Gateway.
const OTHER_GATEWAY_IP: &str = "198.18.0.21";
/// A client outside the mesh.
const CLIENT_IP: &str = "198.18.0.30";
const GATEWAY_ID: &str = "spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway";
const HOST: &str = "httpbin.example.com";

const CONFIG: &str = r#"apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: [httpbin.example.com]
    tls: {httpsRedirect: true}
  - port: {number: 8443, name: https, protocol: HTTPS}
    hosts: [httpbin.example.com]
    tls: {mode: SIMPLE, credentialName: httpbin-cred}
  - port: {number: 8444, name: https-ns, protocol: HTTPS}
    hosts: [httpbin.example.com]
    tls: {mode: SIMPLE, credentialName: istio-system/httpbin-cred, minProtocolVersion: TLSV1_2}
  - port: {number: 9443, name: mtls, protocol: HTTPS}
    hosts: [httpbin.example.com]
    tls: {mode: MUTUAL, credentialName: httpbin-mtls}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: httpbin-ingress, namespace: demo}
spec:
  hosts: [httpbin.example.com]
  gateways: [istio-system/ingress]
  http:
  - route:
    - destination:
        host: httpbin.demo.svc.cluster.local
        port: {number: 8000}
"#;

/// A CA and the certificates it signs, as PEM.
struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

impl TestCa {
    fn new(name: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let pem = params.self_signed(&key).unwrap().pem();
        TestCa {
            issuer: rcgen::Issuer::new(params, key),
            pem,
        }
    }

    /// (certificate PEM, key PEM) for DNS name `dns`, with common name `cn`.
    fn leaf(&self, dns: &str, cn: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![dns.to_string()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// YAML block scalar lines of `pem`, indented for a `stringData` value.
fn block(pem: &str) -> String {
    pem.lines()
        .map(|l| format!("      {l}\n"))
        .collect::<String>()
}

/// The Secrets: `httpbin-cred` (`kubernetes.io/tls`), `httpbin-mtls`
/// (generic) with its `-cacert` companion holding the client CA.
fn secrets(server: &(String, String), client_ca: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: httpbin-cred, namespace: istio-system}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}---\napiVersion: v1\nkind: Secret\nmetadata: {{name: httpbin-mtls, namespace: istio-system}}\nstringData:\n  cert: |\n{}  key: |\n{}---\napiVersion: v1\nkind: Secret\nmetadata: {{name: httpbin-mtls-cacert, namespace: istio-system}}\nstringData:\n  cacert: |\n{}",
        block(&server.0),
        block(&server.1),
        block(&server.0),
        block(&server.1),
        block(client_ca),
    )
}

fn der(pem: &str) -> Vec<u8> {
    common::pki::pem_certs("cert", pem).unwrap()[0]
        .as_ref()
        .to_vec()
}

fn line<'a>(body: &'a str, key: &str) -> &'a str {
    body.lines().find_map(|l| l.strip_prefix(key)).unwrap_or("")
}

/// An HTTPS request from the client's namespace.
fn https(
    client: &tests::netns::Netns,
    port: u16,
    root: &str,
    identity: Option<&(String, String)>,
) -> Result<HttpsResponse, HttpsError> {
    https_from(client, GATEWAY_IP, port, root, identity)
}

fn https_from(
    client: &tests::netns::Netns,
    ip: &str,
    port: u16,
    root: &str,
    identity: Option<&(String, String)>,
) -> Result<HttpsResponse, HttpsError> {
    let addr: SocketAddr = format!("{ip}:{port}").parse().unwrap();
    let root = root.to_string();
    let identity = identity.cloned();
    client.run(move || {
        https_request(
            addr,
            HOST,
            &root,
            identity.as_ref().map(|(c, k)| (c.as_str(), k.as_str())),
            "/headers",
        )
    })
}

/// A plain HTTP request: (status line, `location` header).
fn plain_head(client: &tests::netns::Netns, port: u16) -> std::io::Result<(String, String)> {
    let addr: SocketAddr = format!("{GATEWAY_IP}:{port}").parse().unwrap();
    client.run(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let req = format!("GET /headers?x=1 HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes())?;
        let mut buf = String::new();
        s.read_to_string(&mut buf)?;
        let status = buf.lines().next().unwrap_or("").to_string();
        let location = buf
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .starts_with("location:")
                    .then(|| l["location:".len()..].trim().to_string())
            })
            .unwrap_or_default();
        Ok((status, location))
    })
}

#[test]
fn an_ingress_gateway_terminates_tls_with_certificates_from_secrets() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);

    let server_ca = TestCa::new("server CA");
    let client_ca = TestCa::new("client CA");
    let first = server_ca.leaf(HOST, "httpbin first");
    let secrets_file = mesh.config_dir.join("secrets.yaml");
    tests::write_atomically(&secrets_file, &secrets(&first, &client_ca.pem));
    tests::write_atomically(&mesh.config_dir.join("gateway.yaml"), CONFIG);

    let net = mesh.hub.pod("gw", GATEWAY_IP);
    let pod_dir = tests::PodDir::new(
        &mesh.dir.join("ingress"),
        &mesh.istiod.token("istio-system", "istio-ingressgateway"),
        Some(&mesh.istiod.root_pem()),
    );
    pod_dir.write_labels(&[("istio", "ingressgateway"), ("app", "istio-ingressgateway")]);
    let mut agent = pod_dir.start_router_with(
        &net.ns,
        &[
            ("POD_NAME", "istio-ingressgateway-1"),
            ("POD_NAMESPACE", "istio-system"),
            ("SERVICE_ACCOUNT", "istio-ingressgateway"),
            ("INSTANCE_IP", GATEWAY_IP),
            ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
        ],
        MESH_PROXY_CONFIG,
    );
    let client = mesh.plain_pod(CLIENT_IP);

    // SIMPLE: the Secret's certificate, httpbin behind it over mTLS.
    let resp = wait_for("httpbin over HTTPS through the gateway", WAIT, || {
        assert!(
            agent.alive(),
            "the gateway's agent exited:\n{}",
            agent.log()
        );
        https(&client.ns, 8443, &server_ca.pem, None)
            .ok()
            .filter(|r| r.status == 200)
    });
    assert_eq!(resp.leaf, der(&first.0), "the certificate from the Secret");
    let info = common::pki::cert_info(&resp.leaf).unwrap();
    assert_eq!(info.dns_sans, [HOST]);
    assert!(
        line(&resp.body, "xfcc=").contains(&format!("URI={GATEWAY_ID}")),
        "httpbin's sidecar saw the gateway's identity over mTLS: {}",
        resp.body
    );
    // `kubernetes://istio-system/httpbin-cred`: the namespaced form, same namespace.
    let resp = https(&client.ns, 8444, &server_ca.pem, None).unwrap();
    assert_eq!((resp.status, resp.leaf), (200, der(&first.0)));

    // MUTUAL: no client certificate, Envoy's TLS 1.3 alert; one from the CA is admitted.
    let refused = wait_for("the MUTUAL server's listener", WAIT, || {
        match https(&client.ns, 9443, &server_ca.pem, None) {
            Err(HttpsError::Alert(a)) => Some(a),
            _ => None,
        }
    });
    assert_eq!(refused, rustls::AlertDescription::CertificateRequired);
    let client_cert = client_ca.leaf("client.example.com", "client");
    let resp = https(&client.ns, 9443, &server_ca.pem, Some(&client_cert)).unwrap();
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.leaf, der(&first.0));
    // A certificate from another CA is refused too.
    let stranger = server_ca.leaf("client.example.com", "stranger");
    assert!(matches!(
        https(&client.ns, 9443, &server_ca.pem, Some(&stranger)),
        Err(HttpsError::Alert(rustls::AlertDescription::UnknownCA))
    ));

    // httpsRedirect: plain HTTP gets a 301 to https.
    let (status, location) = plain_head(&client.ns, 8080).unwrap();
    assert!(status.starts_with("HTTP/1.1 301"), "{status}");
    assert_eq!(location, format!("https://{HOST}/headers?x=1"));

    // The Secret replaced: the new certificate within a bounded wait, while
    // a client sends requests throughout without a failure.
    let second = server_ca.leaf(HOST, "httpbin second");
    let stop = Arc::new(AtomicBool::new(false));
    let looping = {
        let (stop, root) = (stop.clone(), server_ca.pem.clone());
        let addr: SocketAddr = format!("{GATEWAY_IP}:8443").parse().unwrap();
        client.ns.spawn(move || {
            let mut outcomes = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let r = https_request(addr, HOST, &root, None, "/status/200");
                outcomes.push(r.map(|r| (r.status, r.leaf)));
            }
            outcomes
        })
    };
    tests::write_atomically(&secrets_file, &secrets(&second, &client_ca.pem));
    wait_for("the replaced certificate served", WAIT, || {
        https(&client.ns, 8443, &server_ca.pem, None)
            .ok()
            .filter(|r| r.leaf == der(&second.0))
    });
    // A few more requests on the new certificate, then stop.
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let outcomes = looping.join().unwrap();
    let failures: Vec<_> = outcomes
        .iter()
        .filter(|o| !matches!(o, Ok((200, _))))
        .collect();
    assert!(
        failures.is_empty(),
        "failed during the change: {failures:?}"
    );
    let served: std::collections::BTreeSet<bool> = outcomes
        .iter()
        .flatten()
        .map(|(_, leaf)| *leaf == der(&second.0))
        .collect();
    assert_eq!(
        served.into_iter().collect::<Vec<_>>(),
        [false, true],
        "the loop saw both certificates ({} requests)",
        outcomes.len()
    );
    assert!(agent.alive(), "{}", agent.log());

    other_namespace_gateway_cannot_read_the_secret(&mesh, &client.ns, &server_ca.pem, &second.0);
}

/// A gateway in another namespace, selected by the same Gateway, gets no
/// Secret of istio-system: its handshakes fail and istiod says why.
fn other_namespace_gateway_cannot_read_the_secret(
    mesh: &LocalMesh,
    client: &tests::netns::Netns,
    root: &str,
    served_cert: &str,
) {
    // A gateway in another namespace, selected by the same Gateway: no
    // Secret of istio-system for it, its handshakes fail.
    let other_net = mesh.hub.pod("gw-other", OTHER_GATEWAY_IP);
    let other_dir = tests::PodDir::new(
        &mesh.dir.join("other-gateway"),
        &mesh.istiod.token("other", "other-gateway"),
        Some(&mesh.istiod.root_pem()),
    );
    other_dir.write_labels(&[("istio", "ingressgateway"), ("app", "other-gateway")]);
    let mut other = other_dir.start_router_with(
        &other_net.ns,
        &[
            ("POD_NAME", "other-gateway-1"),
            ("POD_NAMESPACE", "other"),
            ("SERVICE_ACCOUNT", "other-gateway"),
            ("INSTANCE_IP", OTHER_GATEWAY_IP),
            ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
        ],
        MESH_PROXY_CONFIG,
    );
    // Until its listener is there, connections are refused (or wait).
    let failure = wait_for("the other gateway's HTTPS listener", WAIT, || {
        assert!(
            other.alive(),
            "the other gateway's agent exited:\n{}",
            other.log()
        );
        match https_from(client, OTHER_GATEWAY_IP, 8444, root, None) {
            Err(HttpsError::Io(k))
                if k == std::io::ErrorKind::WouldBlock || k == std::io::ErrorKind::TimedOut =>
            {
                None
            }
            Err(HttpsError::Connect(_)) => None,
            other => Some(other),
        }
    });
    // Envoy has no certificate for the chain (`downstream_context_secrets_not_ready`)
    // and closes the connection with the ClientHello unread: a reset.
    assert!(
        matches!(
            failure,
            Err(HttpsError::Io(std::io::ErrorKind::ConnectionReset))
        ),
        "{failure:?}"
    );
    let log = mesh.istiod.proc.log();
    assert!(
        log.lines().any(|l| l.contains(
            "requested secret kubernetes://istio-system/httpbin-cred not accessible for proxy other-gateway-1.other"
        ) && l.contains("may only read Secrets of its own namespace")),
        "istiod says why:\n{}",
        log.lines().filter(|l| l.contains("secret")).collect::<Vec<_>>().join("\n")
    );
    // The plain name resolves to its own namespace, where there is none.
    assert!(matches!(
        https_from(client, OTHER_GATEWAY_IP, 8443, root, None),
        Err(HttpsError::Io(std::io::ErrorKind::ConnectionReset))
    ));
    // The first gateway is unaffected.
    let resp = https(client, 8444, root, None).unwrap();
    assert_eq!((resp.status, resp.leaf), (200, der(served_cert)));
}
