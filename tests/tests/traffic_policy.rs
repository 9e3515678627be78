//! VirtualService and DestinationRule traffic policy applied by real Envoys
//! in the local mesh, as a client observes it: a redirect's status and
//! `location`, a direct response's status and body, request headers the
//! backend receives and response headers the client gets, a mirror's copy
//! arriving at another subset, CORS preflights answered by Envoy, and TLS
//! originated to a server outside the mesh (its SNI, the server verified
//! against the rule's CA, the client certificate of MUTUAL, from files or,
//! for the workloads a rule selects, from a Secret over SDS), and TLS
//! terminated by a sidecar on its ingress port (Sidecar `ingress[].tls`).

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tests::mesh::LocalMesh;
use tests::netns::Netns;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    tests::mesh::one_mesh_at_a_time()
}

const HTTPBIN: &str = "http://httpbin.demo.svc.cluster.local:8000";
/// Envoy's count of requests httpbin-v2's sidecar passed to its app (Istio's
/// stat names end the cluster name with `;`).
const V2_INBOUND_REQUESTS: &str = "cluster.inbound|8080||;.upstream_rq_total";

/// Writes `file` in istiod's config directory in one rename, as an editor would.
fn write_config(mesh: &LocalMesh, file: &str, text: &str) {
    let tmp = mesh.config_dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, mesh.config_dir.join(file)).unwrap();
}

/// The sample's `istio.yaml` with its canary VirtualService replaced by
/// `vs` (the PeerAuthentication and the subsets' DestinationRule stay).
fn replace_virtual_service(mesh: &LocalMesh, vs: &str) {
    let text = std::fs::read_to_string(mesh.config_dir.join("istio.yaml")).unwrap();
    let (head, _) = text
        .split_once("---\n# 90% of the traffic")
        .expect("the sample's canary VirtualService");
    write_config(mesh, "istio.yaml", &format!("{head}---\n{vs}"));
}

const ROUTES: &str = r#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: httpbin, namespace: demo}
spec:
  hosts: [httpbin.demo.svc.cluster.local]
  http:
  - name: moved
    match: [{uri: {prefix: /old}}]
    redirect: {uri: /moved, authority: elsewhere.example}
  - name: teapot
    match: [{uri: {exact: /teapot}}]
    directResponse: {status: 418, body: {string: "short and stout"}}
  - name: cors
    match: [{uri: {prefix: /cors}}]
    route: [{destination: {host: httpbin, subset: v1}}]
    corsPolicy:
      allowOrigins: [{exact: "https://allowed.example"}]
      allowMethods: [GET, POST]
      allowHeaders: [x-custom]
      maxAge: 1h
  - name: headers
    match: [{uri: {prefix: /headers}}]
    headers:
      request:
        set: {x-route-set: from-route}
        remove: [x-drop-me]
      response:
        add: {x-route-added: "yes"}
    route:
    - destination: {host: httpbin, subset: v1}
      headers:
        request: {set: {x-destination: v1}}
  - name: mirrored
    route: [{destination: {host: httpbin, subset: v1}}]
    mirror: {host: httpbin, subset: v2}
    mirrorPercentage: {value: 100}
"#;

/// The value of response header `name` in curl's `-i` output.
fn response_header(out: &str, name: &str) -> Option<String> {
    let head = out.split("\r\n\r\n").next().unwrap_or_default();
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

/// The `header=<name>: <value>` lines the app echoed, lower-cased names.
fn app_headers(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("header="))
        .map(|h| match h.split_once(':') {
            Some((k, v)) => format!("{}: {}", k.to_ascii_lowercase(), v.trim()),
            None => h.to_string(),
        })
        .collect()
}

#[test]
fn virtual_service_redirect_direct_response_headers_mirror_and_cors() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    replace_virtual_service(&mesh, ROUTES);
    // directResponse: Envoy answers with the rule's status and body.
    let (code, body) = tests::wait_for(
        "the routes at sleep's Envoy",
        Duration::from_secs(20),
        || {
            mesh.app_curl("sleep-1", &format!("{HTTPBIN}/teapot"))
                .ok()
                .filter(|(c, _)| *c == 418)
        },
    );
    assert_eq!((code, body.as_str()), (418, "short and stout"));

    // redirect: 301 (the default) to the new authority and path.
    let (code, out) = mesh
        .app_curl_with("sleep-1", &["-i"], &format!("{HTTPBIN}/old/page"))
        .unwrap();
    assert_eq!(code, 301, "{out}");
    assert_eq!(
        response_header(&out, "location").as_deref(),
        Some("http://elsewhere.example/moved"),
        "{out}"
    );

    // headers: the route's set and remove and the destination's set reach
    // the app; the route's response header reaches the client.
    let (code, out) = mesh
        .app_curl_with(
            "sleep-1",
            &["-i", "-H", "x-drop-me: secret", "-H", "x-route-set: client"],
            &format!("{HTTPBIN}/headers"),
        )
        .unwrap();
    assert_eq!(code, 200, "{out}");
    let seen = app_headers(&out);
    assert!(
        seen.contains(&"x-route-set: from-route".to_string()),
        "{seen:#?}"
    );
    assert!(
        !seen.iter().any(|h| h.starts_with("x-route-set: client")),
        "set overwrites the client's value: {seen:#?}"
    );
    assert!(seen.contains(&"x-destination: v1".to_string()), "{seen:#?}");
    assert!(
        !seen.iter().any(|h| h.starts_with("x-drop-me")),
        "removed before the app: {seen:#?}"
    );
    assert!(out.contains("version=v1"), "{out}");
    assert_eq!(
        response_header(&out, "x-route-added").as_deref(),
        Some("yes"),
        "{out}"
    );

    // CORS: a preflight from an allowed origin is answered by Envoy's CORS
    // filter; one from another origin gets no permission.
    let preflight = |origin: &str| {
        mesh.app_curl_with(
            "sleep-1",
            &[
                "-i",
                "-X",
                "OPTIONS",
                "-H",
                &format!("origin: {origin}"),
                "-H",
                "access-control-request-method: POST",
            ],
            &format!("{HTTPBIN}/cors"),
        )
        .unwrap()
    };
    let (code, out) = preflight("https://allowed.example");
    assert_eq!(code, 200, "{out}");
    assert_eq!(
        response_header(&out, "access-control-allow-origin").as_deref(),
        Some("https://allowed.example"),
        "{out}"
    );
    assert_eq!(
        response_header(&out, "access-control-allow-methods").as_deref(),
        Some("GET,POST"),
        "{out}"
    );
    assert_eq!(
        response_header(&out, "access-control-max-age").as_deref(),
        Some("3600"),
        "{out}"
    );
    assert!(
        !out.contains("version="),
        "answered by Envoy, not the app: {out}"
    );
    let (_, out) = preflight("https://evil.example");
    assert_eq!(
        response_header(&out, "access-control-allow-origin"),
        None,
        "{out}"
    );
    // A simple request from the allowed origin carries the permission too.
    let (code, out) = mesh
        .app_curl_with(
            "sleep-1",
            &["-i", "-H", "origin: https://allowed.example"],
            &format!("{HTTPBIN}/cors"),
        )
        .unwrap();
    assert_eq!(code, 200, "{out}");
    assert_eq!(
        response_header(&out, "access-control-allow-origin").as_deref(),
        Some("https://allowed.example"),
        "{out}"
    );

    // mirror: every request answered by v1, and a copy reaches v2's sidecar.
    let before = mesh.envoy_stat("httpbin-v2", V2_INBOUND_REQUESTS);
    for _ in 0..5 {
        let (code, body) = mesh.app_curl("sleep-1", &format!("{HTTPBIN}/ip")).unwrap();
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("version=v1"), "the route's answer: {body}");
    }
    tests::wait_for("5 mirrored requests at v2", Duration::from_secs(10), || {
        (mesh.envoy_stat("httpbin-v2", V2_INBOUND_REQUESTS) >= before + 5).then_some(())
    });

    // Auto mTLS follows PeerAuthentication: with DISABLE for namespace demo
    // and no TLS in the DestinationRule, sleep's Envoy sends plain text
    // (httpbin's Envoy then adds no client certificate header).
    let (_, mtls) = mesh.app_curl("sleep-1", &format!("{HTTPBIN}/ip")).unwrap();
    assert!(mtls.contains("xfcc=By="), "mTLS before the change: {mtls}");
    let text = std::fs::read_to_string(mesh.config_dir.join("istio.yaml")).unwrap();
    let edited = text.replacen("mode: STRICT", "mode: DISABLE", 1).replacen(
        "  trafficPolicy:\n    tls:\n      mode: ISTIO_MUTUAL\n",
        "",
        1,
    );
    assert_ne!(text, edited);
    write_config(&mesh, "istio.yaml", &edited);
    let (_, plain) = tests::wait_for(
        "plain text to httpbin under DISABLE",
        Duration::from_secs(20),
        || {
            mesh.app_curl("sleep-1", &format!("{HTTPBIN}/ip"))
                .ok()
                .filter(|(c, b)| *c == 200 && b.contains("\nxfcc=\n"))
        },
    );
    assert!(plain.contains("version=v1"), "{plain}");
}

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

    /// (certificate PEM, key PEM) for DNS name `dns`.
    fn leaf(&self, dns: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![dns.to_string()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, dns);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A TLS server outside the mesh: presents `cert`, asks for (but does not
/// require) a client certificate from `client_ca`, and answers each
/// request with the SNI it was sent and the client certificate's DNS names
/// (`client=none` without one). Returns the SNIs seen, failed handshakes
/// included.
fn tls_server(
    ns: &Netns,
    addr: SocketAddr,
    (cert, key): &(String, String),
    client_ca: &str,
) -> Arc<Mutex<Vec<String>>> {
    common::tls::install_crypto_provider();
    let chain = common::pki::pem_certs("server", cert).unwrap();
    let key = {
        use rustls_pki_types::pem::PemObject as _;
        rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap()
    };
    let roots = common::tls::root_store("client CA", client_ca).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
        .allow_unauthenticated()
        .build()
        .unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .unwrap(),
    );
    let listener = ns.run(move || std::net::TcpListener::bind(addr).unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for sock in listener.incoming().take(10_000) {
            let Ok(mut sock) = sock else { continue };
            let (config, record) = (config.clone(), record.clone());
            std::thread::spawn(move || {
                let _ = sock.set_read_timeout(Some(Duration::from_secs(10)));
                let mut conn = rustls::ServerConnection::new(config).unwrap();
                let handshake = conn.complete_io(&mut sock);
                record
                    .lock()
                    .unwrap()
                    .push(conn.server_name().unwrap_or("none").to_string());
                if handshake.is_err() {
                    return;
                }
                let sni = conn.server_name().unwrap_or("none").to_string();
                let client = conn
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| {
                        common::pki::cert_info(c.as_ref())
                            .unwrap()
                            .dns_sans
                            .join(",")
                    })
                    .unwrap_or_else(|| "none".into());
                let mut tls = rustls::Stream::new(&mut conn, &mut sock);
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match tls.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let body = format!("sni={sni}\nclient={client}\n");
                let _ = tls.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    seen
}

/// Outside service `tls.example`: VIP 198.19.0.50 port 80 (HTTP for the
/// client), its endpoint a TLS server on 198.18.0.9:8443.
const SERVICE_ENTRY: &str = r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: tls-example, namespace: demo}
spec:
  hosts: [tls.example]
  addresses: [198.19.0.50]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints: [{address: 198.18.0.9, ports: {http: 8443}}]
"#;
const SERVER_IP: &str = "198.18.0.9";
/// sleep's Envoy's count of upstream handshakes whose server certificate
/// failed verification.
const VERIFY_FAILED: &str = "cluster.outbound|80||tls.example;.ssl.fail_verify_error";

fn destination_rule(tls: &str) -> String {
    format!(
        "{SERVICE_ENTRY}---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: tls-example, namespace: demo}}\nspec:\n  host: tls.example\n  trafficPolicy:\n    tls: {tls}\n"
    )
}

#[test]
fn destination_rule_originates_tls_simple_and_mutual_to_a_server_outside_the_mesh() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    // Istio's flag for Sidecar ingress TLS (the last part of the test).
    let mesh = LocalMesh::start_tuned(
        tmp.path(),
        &[("ENABLE_TLS_ON_SIDECAR_INGRESS", "true")],
        &[],
    );
    // The server's CA, another CA, and the client's certificate (signed by
    // the server's CA), in files the proxy user (1337) can read.
    let ca = TestCa::new("tls.example test CA");
    let other = TestCa::new("unrelated test CA");
    let files = mesh.dir.join("tls-files");
    std::fs::create_dir_all(&files).unwrap();
    let (client_cert, client_key) = ca.leaf("client.sleep.example");
    for (name, text) in [
        ("ca.pem", ca.pem.as_str()),
        ("other-ca.pem", other.pem.as_str()),
        ("client.pem", client_cert.as_str()),
        ("client-key.pem", client_key.as_str()),
    ] {
        std::fs::write(files.join(name), text).unwrap();
        std::fs::set_permissions(
            files.join(name),
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o644),
        )
        .unwrap();
    }
    std::fs::set_permissions(
        &files,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
    )
    .unwrap();
    let path = |f: &str| files.join(f).display().to_string();
    let server = mesh.plain_pod(SERVER_IP);
    let snis = tls_server(
        &server.ns,
        "0.0.0.0:8443".parse().unwrap(),
        &ca.leaf("tls.example"),
        &ca.pem,
    );
    let call = || {
        mesh.app_curl_with(
            "sleep-1",
            &["-m", "3", "--resolve", "tls.example:80:198.19.0.50"],
            "http://tls.example/",
        )
    };

    // SIMPLE: TLS with the configured SNI, the server verified against
    // caCertificates and its name.
    write_config(
        &mesh,
        "tls-example.yaml",
        &destination_rule(&format!(
            "{{mode: SIMPLE, caCertificates: {}, sni: sni.tls.example, subjectAltNames: [tls.example]}}",
            path("ca.pem")
        )),
    );
    let (_, body) = tests::wait_for("TLS to tls.example", Duration::from_secs(20), || {
        call().ok().filter(|(c, _)| *c == 200)
    });
    assert_eq!(body, "sni=sni.tls.example\nclient=none\n");
    assert!(
        snis.lock()
            .unwrap()
            .contains(&"sni.tls.example".to_string()),
        "{:?}",
        snis.lock().unwrap()
    );

    assert_eq!(mesh.envoy_stat("sleep-1", VERIFY_FAILED), 0);

    // A CA that did not sign the server's certificate: Envoy refuses it.
    write_config(
        &mesh,
        "tls-example.yaml",
        &destination_rule(&format!(
            "{{mode: SIMPLE, caCertificates: {}, sni: sni.tls.example}}",
            path("other-ca.pem")
        )),
    );
    let (code, body) = tests::wait_for(
        "the wrong CA at sleep's Envoy",
        Duration::from_secs(20),
        || call().ok().filter(|(c, _)| *c != 200),
    );
    assert_eq!(code, 503, "{body}");
    assert!(
        body.starts_with("upstream connect error") && body.contains("remote connection failure"),
        "Envoy's answer for a failed upstream connection: {body}"
    );
    assert!(
        mesh.envoy_stat("sleep-1", VERIFY_FAILED) > 0,
        "the failure is Envoy's verification of the server's certificate"
    );

    // MUTUAL: the client certificate from the rule's files.
    write_config(
        &mesh,
        "tls-example.yaml",
        &destination_rule(&format!(
            "{{mode: MUTUAL, caCertificates: {}, clientCertificate: {}, privateKey: {}, sni: tls.example}}",
            path("ca.pem"),
            path("client.pem"),
            path("client-key.pem")
        )),
    );
    let (_, body) = tests::wait_for("mTLS to tls.example", Duration::from_secs(20), || {
        call()
            .ok()
            .filter(|(c, b)| *c == 200 && !b.contains("client=none"))
    });
    assert_eq!(body, "sni=tls.example\nclient=client.sleep.example\n");

    // MUTUAL for sleep only: a rule with a workloadSelector whose client
    // certificate and CA come from a Secret over SDS (`credentialName`);
    // httpbin-v1, another client of the namespace, gets the rule without
    // selector (SIMPLE: no client certificate).
    let (selected_cert, selected_key) = ca.leaf("selected.sleep.example");
    write_config(
        &mesh,
        "tls-example.yaml",
        &format!(
            "{}---\n{}",
            destination_rule(&format!(
                "{{mode: SIMPLE, caCertificates: {}, sni: tls.example}}",
                path("ca.pem")
            )),
            selector_rule_with_secret(&selected_cert, &selected_key, &ca.pem),
        ),
    );
    let (_, body) = tests::wait_for(
        "mTLS from the Secret for sleep",
        Duration::from_secs(20),
        || {
            call()
                .ok()
                .filter(|(c, b)| *c == 200 && b.contains("selected.sleep.example"))
        },
    );
    assert_eq!(body, "sni=tls.example\nclient=selected.sleep.example\n");
    let (code, body) = mesh
        .app_curl_with(
            "httpbin-v1",
            &["-m", "3", "--resolve", "tls.example:80:198.19.0.50"],
            "http://tls.example/",
        )
        .unwrap();
    assert_eq!(
        (code, body.as_str()),
        (200, "sni=tls.example\nclient=none\n"),
        "httpbin-v1 is not selected: the namespace's rule without selector"
    );

    // Sidecar ingress TLS: httpbin-v1's sidecar terminates TLS on its port
    // 8080 with the Secret's certificate (its PeerAuthentication is
    // DISABLE); a client outside the mesh verifies that certificate
    // against the test CA and the name in it, and reaches the app.
    let (app_cert, app_key) = ca.leaf("httpbin.example");
    let ca_file = path("ca.pem");
    let https = || {
        let out = server
            .command_as(0, "curl")
            .args(["-sS", "-m", "3", "--cacert", &ca_file])
            .args(["--resolve", "httpbin.example:8080:198.18.0.3"])
            .arg("https://httpbin.example:8080/ingress")
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).to_string())
    };
    assert_eq!(https(), None, "no TLS on the port before the Sidecar");
    write_config(
        &mesh,
        "ingress-tls.yaml",
        &ingress_tls_config(&app_cert, &app_key),
    );
    let body = tests::wait_for(
        "TLS terminated by httpbin-v1's sidecar",
        Duration::from_secs(20),
        https,
    );
    assert!(
        body.starts_with("version=v1\n") && body.contains("request=GET /ingress HTTP/1.1"),
        "{body}"
    );
}

/// For httpbin-v1: the Secret `httpbin-ingress` (its certificate for
/// `httpbin.example`), PeerAuthentication DISABLE, and a Sidecar whose
/// ingress port 8080 terminates TLS with that Secret.
fn ingress_tls_config(cert: &str, key: &str) -> String {
    let block = |pem: &str| {
        pem.lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    };
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: httpbin-ingress, namespace: demo}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}---\napiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {{name: httpbin-v1, namespace: demo}}\nspec:\n  selector: {{matchLabels: {{app: httpbin, version: v1}}}}\n  mtls: {{mode: DISABLE}}\n---\napiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: httpbin-v1, namespace: demo}}\nspec:\n  workloadSelector: {{labels: {{app: httpbin, version: v1}}}}\n  ingress:\n  - port: {{number: 8080, protocol: HTTPS, name: https}}\n    tls: {{mode: SIMPLE, credentialName: httpbin-ingress}}\n",
        block(cert),
        block(key),
    )
}

/// The Secret `tls-example-client` of namespace `demo` (certificate, key and
/// the CA that verifies the server) and a MUTUAL rule for `app: sleep`
/// naming it in `credentialName`.
fn selector_rule_with_secret(cert: &str, key: &str, ca: &str) -> String {
    let block = |pem: &str| {
        pem.lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    };
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: tls-example-client, namespace: demo}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}  ca.crt: |\n{}---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: tls-example-sleep, namespace: demo}}\nspec:\n  host: tls.example\n  workloadSelector: {{matchLabels: {{app: sleep}}}}\n  trafficPolicy:\n    tls: {{mode: MUTUAL, credentialName: tls-example-client, sni: tls.example}}\n",
        block(cert),
        block(key),
        block(ca),
    )
}

// Load balancing by DestinationRule: consistent hashing and locality.

const WEB: &str = "http://web.demo.svc.cluster.local:8000/";
/// Envoy's count of healthy hosts of sleep's cluster for `web` (Istio's
/// stat names end the cluster name with `;`).
const WEB_HEALTHY: &str = "cluster.outbound|8000||web.demo.svc.cluster.local;.membership_healthy";
/// Hosts of that cluster outlier detection has ejected now.
const WEB_EJECTED: &str =
    "cluster.outbound|8000||web.demo.svc.cluster.local;.outlier_detection.ejections_active";

/// Two Nodes in two zones of region `r1`, and Service `web` with one Pod
/// per `(name, ip, node)`, its DestinationRule's `trafficPolicy` as given.
fn web_config(pods: &[(&str, &str, &str)], traffic_policy: &str) -> String {
    let mut out = String::new();
    for (node, zone) in [("node-a", "zone-a"), ("node-b", "zone-b")] {
        out.push_str(&format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: {node}, labels: {{topology.kubernetes.io/region: r1, topology.kubernetes.io/zone: {zone}}}}}\n---\n"
        ));
    }
    out.push_str("apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo, labels: {app: web}}\nspec: {clusterIP: 198.19.0.20, selector: {app: web}, ports: [{name: http, port: 8000, targetPort: 8080}]}\n---\n");
    let mut endpoints = String::new();
    for (name, ip, node) in pods {
        out.push_str(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: demo, labels: {{app: web, version: {name}, security.istio.io/tlsMode: istio}}}}\nspec: {{serviceAccountName: web, nodeName: {node}, containers: [{{name: web, image: web}}]}}\nstatus: {{phase: Running, podIP: {ip}}}\n---\n"
        ));
        endpoints.push_str(&format!(
            "- {{addresses: [{ip}], conditions: {{ready: true}}, targetRef: {{kind: Pod, namespace: demo, name: {name}}}}}\n"
        ));
    }
    out.push_str(&format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: demo, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints:\n{endpoints}---\n"
    ));
    out.push_str(&format!(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: web, namespace: demo}}\nspec:\n  host: web.demo.svc.cluster.local\n  trafficPolicy: {traffic_policy}\n"
    ));
    out
}

/// Puts sleep-1's Pod on `node-a` (zone `r1/zone-a`).
fn sleep_on_node_a(mesh: &LocalMesh) {
    let text = std::fs::read_to_string(mesh.config_dir.join("sleep.yaml")).unwrap();
    let edited = text.replace(
        "  serviceAccountName: sleep\n",
        "  serviceAccountName: sleep\n  nodeName: node-a\n",
    );
    assert_ne!(text, edited, "sleep.yaml has sleep-1's Pod spec");
    write_config(mesh, "sleep.yaml", &edited);
}

/// Starts the mesh with Service `web` (its Pods serving their own names as
/// versions), sleep-1 on node-a, and waits until sleep's Envoy has every
/// `web` endpoint healthy.
fn mesh_with_web(dir: &std::path::Path, pods: &[(&str, &str, &str)], policy: &str) -> LocalMesh {
    let mut mesh = LocalMesh::start(dir, &[]);
    sleep_on_node_a(&mesh);
    write_config(&mesh, "web.yaml", &web_config(pods, policy));
    for (name, ip, _) in pods {
        mesh.add_pod(name, ip, "web", name);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while mesh.envoy_stat("sleep-1", WEB_HEALTHY) != pods.len() as u64 {
        if std::time::Instant::now() > deadline {
            let clusters = mesh.pod("sleep-1").ns.run(|| {
                tests::http_get(SocketAddr::from(([127, 0, 0, 1], 15000)), "/clusters")
                    .map(|(_, body)| body)
                    .unwrap_or_default()
            });
            let web: Vec<&str> = clusters
                .lines()
                .filter(|l| l.contains("web.demo"))
                .collect();
            panic!("sleep's Envoy does not have every web endpoint healthy: {web:#?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    mesh
}

/// One request from sleep-1 to `web`: which Pod answered, or the status
/// (or curl's error) of a failure.
fn web_answer(mesh: &LocalMesh, args: &[&str]) -> Result<String, String> {
    match mesh.app_curl_with("sleep-1", args, WEB) {
        Ok((200, body)) => body
            .lines()
            .find_map(|l| l.strip_prefix("version="))
            .map(String::from)
            .ok_or(format!("no version in {body:?}")),
        Ok((code, body)) => Err(format!("{code}: {body}")),
        Err(e) => Err(e),
    }
}

#[test]
fn consistent_hash_on_a_header_sends_one_key_to_one_endpoint() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let pods = [
        ("web-1", "198.18.0.21", "node-a"),
        ("web-2", "198.18.0.22", "node-a"),
        ("web-3", "198.18.0.23", "node-a"),
    ];
    let mesh = mesh_with_web(
        tmp.path(),
        &pods,
        "{loadBalancer: {consistentHash: {httpHeaderName: x-user}}}",
    );
    tests::wait_for("web answers sleep", Duration::from_secs(20), || {
        web_answer(&mesh, &["-H", "x-user: probe"]).ok()
    });
    let one_key: std::collections::BTreeMap<String, usize> =
        (0..50).fold(Default::default(), |mut m, _| {
            *m.entry(web_answer(&mesh, &["-H", "x-user: alice"]).unwrap())
                .or_default() += 1;
            m
        });
    assert_eq!(
        one_key.len(),
        1,
        "50 requests with x-user: alice reach one endpoint: {one_key:?}"
    );
    let keys: std::collections::BTreeSet<String> = (0..30)
        .map(|i| web_answer(&mesh, &["-H", &format!("x-user: user-{i}")]).unwrap())
        .collect();
    assert!(
        keys.len() > 1,
        "30 different keys reach more than one of the three endpoints: {keys:?}"
    );
}

#[test]
fn locality_failover_keeps_traffic_in_zone_until_its_endpoint_is_ejected() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let pods = [
        ("web-a", "198.18.0.21", "node-a"),
        ("web-b", "198.18.0.22", "node-b"),
    ];
    // Istio's default locality load balancing, on because outlier
    // detection is.
    let mesh = mesh_with_web(
        tmp.path(),
        &pods,
        "{outlierDetection: {consecutive5xxErrors: 1, interval: 1s, baseEjectionTime: 3m, maxEjectionPercent: 100}}",
    );
    tests::wait_for("web answers sleep", Duration::from_secs(20), || {
        web_answer(&mesh, &[]).ok()
    });
    let in_zone: Vec<String> = (0..30).map(|_| web_answer(&mesh, &[]).unwrap()).collect();
    assert!(
        in_zone.iter().all(|v| v == "web-a"),
        "sleep (zone-a) reaches web-a (zone-a) only: {in_zone:?}"
    );

    // web-a's app refuses connections: its Envoy answers 503, which
    // ejects it, and traffic moves to zone-b.
    let status = mesh
        .pod("web-a")
        .ns
        .command("iptables")
        .args(["-I", "INPUT", "-p", "tcp", "--dport", "8080"])
        .args(["-j", "REJECT", "--reject-with", "tcp-reset"])
        .status()
        .unwrap();
    assert!(status.success(), "iptables in web-a's namespace");
    let after: Vec<Result<String, String>> = (0..30).map(|_| web_answer(&mesh, &[])).collect();
    let failed = after.iter().filter(|r| r.is_err()).count();
    eprintln!("requests failed while web-a was ejected: {failed} of 30");
    assert!(
        failed <= 3,
        "at most the requests before the ejection fail (Envoy retries the rest elsewhere): {after:?}"
    );
    assert!(
        after[10..].iter().all(|r| r.as_deref() == Ok("web-b")),
        "after the ejection web-b (zone-b) answers: {after:?}"
    );
    assert_eq!(
        mesh.envoy_stat("sleep-1", WEB_EJECTED),
        1,
        "web-a is ejected"
    );
}

#[test]
fn locality_distribute_weights_hold_within_a_binomial_bound() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let pods = [
        ("web-a", "198.18.0.21", "node-a"),
        ("web-b", "198.18.0.22", "node-b"),
    ];
    let mesh = mesh_with_web(
        tmp.path(),
        &pods,
        "{loadBalancer: {localityLbSetting: {distribute: [{from: r1/zone-a/*, to: {r1/zone-a/*: 80, r1/zone-b/*: 20}}]}}}",
    );
    tests::wait_for("web answers sleep", Duration::from_secs(20), || {
        web_answer(&mesh, &[]).ok()
    });
    const N: usize = 200;
    let in_zone = (0..N)
        .filter(|_| web_answer(&mesh, &[]).unwrap() == "web-a")
        .count();
    eprintln!("{in_zone} of {N} requests answered in zone-a (80% asked)");
    // 80% of 200 is 160, with a standard deviation of sqrt(200 * 0.8 *
    // 0.2) = 5.7: four of them either side. Even balancing would give 100.
    assert!(
        (137..=183).contains(&in_zone),
        "{in_zone} of {N} requests went to zone-a, where 80% should"
    );
}
