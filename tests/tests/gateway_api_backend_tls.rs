//! `BackendTLSPolicy` end to end, with a real gateway Envoy configured by
//! istiod through the file source: a Gateway API gateway routes an
//! HTTPRoute to a Service whose backend serves TLS only, with a certificate
//! for `secure.example.com` from a test CA.
//! - without a policy the gateway sends plain text: the backend sees a
//!   failed handshake and the client a 502 (an upstream protocol error);
//! - with a BackendTLSPolicy naming a ConfigMap that holds the test CA and
//!   the certificate's host name, the gateway originates TLS with that SNI,
//!   verifies the backend against the CA served over SDS
//!   (`configmap://demo/backend-ca-cacert`), and the client gets 200;
//! - with the ConfigMap holding another CA, verification fails: 503, and
//!   the cluster's `ssl.fail_verify_error` counter rises.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
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
/// The TLS-only backend outside the mesh (Service `secure`).
const BACKEND_IP: &str = "198.18.0.65";
/// The host the backend's certificate is for, and the policy's hostname.
const BACKEND_HOST: &str = "secure.example.com";
const HTTP_PORT: u16 = 8080;

const GATEWAY: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: ingress, namespace: istio-system}
spec:
  gatewayClassName: istio
  listeners:
  - name: http
    port: 8080
    protocol: HTTP
    allowedRoutes: {namespaces: {from: All}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: secure, namespace: demo}
spec:
  parentRefs: [{name: ingress, namespace: istio-system}]
  hostnames: [app.example.com]
  rules:
  - backendRefs: [{name: secure, port: 8443}]
---
apiVersion: v1
kind: Service
metadata: {name: secure, namespace: demo}
spec:
  clusterIP: 198.19.0.65
  ports: [{name: http, port: 8443, targetPort: 8443}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: secure-a, namespace: demo, labels: {kubernetes.io/service-name: secure}}
addressType: IPv4
ports: [{name: http, port: 8443, protocol: TCP}]
endpoints:
- addresses: [198.18.0.65]
  conditions: {ready: true}
"#;

const POLICY: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: secure, namespace: demo}
spec:
  targetRefs: [{group: "", kind: Service, name: secure}]
  validation:
    caCertificateRefs: [{group: "", kind: ConfigMap, name: backend-ca}]
    hostname: secure.example.com
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

/// The ConfigMap `demo/backend-ca` holding `ca` under `ca.crt`.
fn config_map(ca: &str) -> String {
    let block: String = ca.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: backend-ca, namespace: demo}}\ndata:\n  ca.crt: |\n{block}"
    )
}

/// What the backend saw, one entry per connection: `tls sni=<sni>` or
/// `handshake failed: <reason>`.
type Seen = Arc<Mutex<Vec<String>>>;

/// An HTTPS server outside the mesh: TLS only, answers each request with
/// 200 and `sni=<the SNI it was sent>`, and records every connection.
fn https_backend(ns: &Netns, addr: SocketAddr, cert: &str, key: &str) -> Seen {
    common::tls::install_crypto_provider();
    let chain = common::pki::pem_certs("server", cert).unwrap();
    let key = {
        use rustls_pki_types::pem::PemObject as _;
        rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap()
    };
    let config = Arc::new(
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap(),
    );
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let listener = ns.run(move || std::net::TcpListener::bind(addr).unwrap());
    std::thread::spawn(move || {
        for sock in listener.incoming().take(10_000) {
            let Ok(mut sock) = sock else { continue };
            let (config, record) = (config.clone(), record.clone());
            std::thread::spawn(move || {
                let _ = sock.set_read_timeout(Some(Duration::from_secs(10)));
                let mut conn = rustls::ServerConnection::new(config).unwrap();
                if let Err(e) = conn.complete_io(&mut sock) {
                    record
                        .lock()
                        .unwrap()
                        .push(format!("handshake failed: {e}"));
                    return;
                }
                let sni = conn.server_name().unwrap_or("none").to_string();
                record.lock().unwrap().push(format!("tls sni={sni}"));
                let mut tls = rustls::Stream::new(&mut conn, &mut sock);
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                // Up to the end of the request's headers (bounded).
                while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 65_536 {
                    match tls.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let body = format!("sni={sni}");
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(response.as_bytes());
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    seen
}

/// The sum of the gateway Envoy's `ssl.fail_verify_error` counters of the
/// `secure` Service's clusters.
fn fail_verify_errors(gw: &Netns) -> u64 {
    gw.run(|| {
        let (_, body) = tests::http_get(SocketAddr::from(([127, 0, 0, 1], 15000)), "/stats")
            .unwrap_or_default();
        body.lines()
            .filter(|l| l.contains("secure.demo.svc") && l.contains(".ssl.fail_verify_error: "))
            .filter_map(|l| l.rsplit(": ").next()?.trim().parse::<u64>().ok())
            .sum()
    })
}

#[test]
fn backend_tls_policy_originates_tls_verified_by_a_configmap_ca() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);

    let (ca, cert, key) = signed_cert("backend CA", BACKEND_HOST);
    let (other_ca, _, _) = signed_cert("another CA", BACKEND_HOST);
    tests::write_atomically(&mesh.config_dir.join("gateway-api.yaml"), GATEWAY);
    let backend = mesh.plain_pod(BACKEND_IP);
    let seen = https_backend(
        &backend.ns,
        format!("{BACKEND_IP}:8443").parse().unwrap(),
        &cert,
        &key,
    );
    let mut gw = mesh.start_gateway(&GatewaySpec::gateway_api_ingress(GATEWAY_IP));
    let client = mesh.plain_pod(CLIENT_IP);
    let addr: SocketAddr = format!("{GATEWAY_IP}:{HTTP_PORT}").parse().unwrap();
    let get = || http_request(&client.ns, addr, "app.example.com", "/").ok();

    // No policy: plain text to a TLS-only backend, which answers the
    // request line with a TLS alert: Envoy reports an upstream protocol
    // error (502).
    let (_, body) = wait_for("502 from the plain-text route", WAIT, || {
        gw.assert_alive();
        get().filter(|(status, _)| *status == 502)
    });
    assert!(body.contains("reset reason: protocol error"), "{body}");
    wait_for("the backend's failed handshake", WAIT, || {
        let seen = seen.lock().unwrap();
        seen.iter()
            .any(|s| s.starts_with("handshake failed"))
            .then_some(())
    });
    assert!(
        !seen.lock().unwrap().iter().any(|s| s.starts_with("tls ")),
        "{:?}",
        seen.lock().unwrap()
    );

    // The policy and its CA: TLS with the policy's SNI, verified.
    tests::write_atomically(&mesh.config_dir.join("ca.yaml"), &config_map(&ca));
    tests::write_atomically(&mesh.config_dir.join("policy.yaml"), POLICY);
    let (_, body) = wait_for("200 over TLS once the policy applies", WAIT, || {
        gw.assert_alive();
        get().filter(|(status, _)| *status == 200)
    });
    assert_eq!(body, format!("sni={BACKEND_HOST}"));
    assert!(
        seen.lock()
            .unwrap()
            .contains(&format!("tls sni={BACKEND_HOST}")),
        "{:?}",
        seen.lock().unwrap()
    );
    let status = mesh.gateway_api_status("BackendTLSPolicy/demo/secure");
    assert!(
        status.contains("ancestor Service/secure: Accepted=True (Accepted)")
            && status.contains("ancestor Service/secure: ResolvedRefs=True"),
        "{status}"
    );
    assert!(
        status.contains("ancestor Gateway/ingress: Accepted=True"),
        "{status}"
    );

    // Another CA in the ConfigMap: the backend's certificate fails
    // verification at the gateway.
    let before = fail_verify_errors(&gw.net.ns);
    tests::write_atomically(&mesh.config_dir.join("ca.yaml"), &config_map(&other_ca));
    wait_for(
        "503 and a verification failure with another CA",
        WAIT,
        || {
            gw.assert_alive();
            let failed = get().is_some_and(|(status, _)| status == 503);
            (failed && fail_verify_errors(&gw.net.ns) > before).then_some(())
        },
    );

    // The right CA again: 200 again (the ConfigMap is watched).
    tests::write_atomically(&mesh.config_dir.join("ca.yaml"), &config_map(&ca));
    wait_for("200 with the CA restored", WAIT, || {
        gw.assert_alive();
        get().filter(|(status, _)| *status == 200)
    });

    // A policy naming a ConfigMap that does not exist is refused in status
    // and blocks the traffic (Istio's `invalid://` credential, which no
    // proxy is ever served: Envoy's cluster waits for it, then fails every
    // handshake), rather than sending it unverified.
    tests::write_atomically(
        &mesh.config_dir.join("policy.yaml"),
        &POLICY.replace("name: backend-ca", "name: missing-ca"),
    );
    wait_for("the missing CA reported", WAIT, || {
        let status = mesh.gateway_api_status("BackendTLSPolicy/demo/secure");
        status
            .contains("Accepted=False (NoValidCACertificate): Certificate reference invalid: reference demo/missing-ca (of kind ConfigMap) not found")
            .then_some(())
    });
    wait_for("503 with the missing CA", WAIT, || {
        get().filter(|(status, _)| *status == 503)
    });
    gw.assert_alive();
}
