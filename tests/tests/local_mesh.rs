//! The whole mesh on one machine: istiod with the sample config, Pods each
//! with pilot-agent and a real Envoy in a network namespace of their own,
//! talking to each other over mutual TLS with the identities istiod signed.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tests::mesh::{Capture, LocalMesh};

fn serial() -> std::sync::MutexGuard<'static, ()> {
    tests::mesh::one_mesh_at_a_time()
}

const SLEEP: &str = "spiffe://cluster.local/ns/demo/sa/sleep";
const HTTPBIN: &str = "spiffe://cluster.local/ns/demo/sa/httpbin";

fn version(body: &str) -> String {
    body.lines()
        .find_map(|l| l.strip_prefix("version="))
        .unwrap_or("?")
        .to_string()
}

/// `n` requests; counts per version and the failures.
fn split(mesh: &LocalMesh, n: usize) -> (BTreeMap<String, usize>, Vec<String>) {
    let mut counts = BTreeMap::new();
    let mut failures = Vec::new();
    for _ in 0..n {
        match mesh.call_httpbin() {
            Ok((200, body)) => *counts.entry(version(&body)).or_default() += 1,
            Ok((code, body)) => failures.push(format!("HTTP {code}: {body}")),
            Err(e) => failures.push(e.to_string()),
        }
    }
    (counts, failures)
}

/// The Sidecar `captureMode: NONE` path (no iptables): sleep's app calls its
/// Envoy on `127.0.0.1:8000`, httpbin's Envoy listens on the Pod's port 8080.
#[test]
fn without_capture_sidecar_listeners_carry_mtls_and_strict_refuses_plaintext() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start_with(tmp.path(), Capture::None, &[]);
    let (code, body) = mesh.call_httpbin().unwrap();
    assert_eq!(code, 200, "{body}");
    let xfcc = body.lines().find_map(|l| l.strip_prefix("xfcc=")).unwrap();
    assert!(
        xfcc.contains(&format!("URI={SLEEP}")),
        "the server saw the client's identity: {xfcc}"
    );
    assert!(
        xfcc.contains(&format!("By={HTTPBIN}")),
        "and its own: {xfcc}"
    );

    // PeerAuthentication STRICT: plain text straight to the server Pod's
    // port matches no filter chain of its Envoy, which closes the
    // connection without a byte.
    let stat = "listener.0.0.0.0_8080.no_filter_chain_match";
    let before = mesh.envoy_stat("httpbin-v1", stat);
    let plain = mesh.pod("sleep-1").ns.run(|| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect_timeout(
            &"198.18.0.3:8080".parse().unwrap(),
            Duration::from_secs(2),
        )?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET / HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n")?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)?;
        Ok::<_, std::io::Error>(buf)
    });
    match plain {
        Ok(bytes) => assert!(
            bytes.is_empty(),
            "plain text must get no answer: {}",
            String::from_utf8_lossy(&bytes)
        ),
        Err(e) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset,
            "closed by Envoy, not timed out: {e}"
        ),
    }
    assert_eq!(
        mesh.envoy_stat("httpbin-v1", stat),
        before + 1,
        "httpbin's Envoy refused it for want of a matching (mTLS) chain"
    );
}

#[test]
fn weighted_routes_split_traffic_and_a_live_edit_changes_it_without_failures() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    let (counts, failures) = split(&mesh, 300);
    assert!(failures.is_empty(), "{failures:?}");
    let v1 = counts.get("v1").copied().unwrap_or(0) as f64 / 300.0;
    assert!(
        (0.84..=0.96).contains(&v1),
        "90/10 expected, got {counts:?}"
    );

    // Change the weights while requests flow.
    let vs = mesh.config_dir.join("istio.yaml");
    let text = std::fs::read_to_string(&vs).unwrap();
    let edited =
        text.replacen("weight: 90", "weight: 50", 1)
            .replacen("weight: 10", "weight: 50", 1);
    assert_ne!(text, edited);
    let tmp_file = mesh.config_dir.join(".istio.yaml.tmp");
    std::fs::write(&tmp_file, edited).unwrap();
    let changed_at = Instant::now();
    std::fs::rename(&tmp_file, &vs).unwrap();
    let mut during = Vec::new();
    let mut recent = Vec::new();
    while changed_at.elapsed() < Duration::from_secs(6) {
        match mesh.call_httpbin() {
            Ok((200, body)) => recent.push(version(&body)),
            Ok((code, b)) => during.push(format!("HTTP {code}: {b}")),
            Err(e) => during.push(e.to_string()),
        }
    }
    assert!(
        during.is_empty(),
        "no request may fail during the change: {during:?}"
    );
    let (counts, failures) = split(&mesh, 300);
    assert!(failures.is_empty(), "{failures:?}");
    let v1 = counts.get("v1").copied().unwrap_or(0) as f64 / 300.0;
    assert!(
        (0.40..=0.60).contains(&v1),
        "50/50 expected after the edit, got {counts:?}"
    );
}

#[test]
fn istiod_restart_while_requests_flow_fails_nothing_and_later_changes_still_arrive() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mut mesh = LocalMesh::start(tmp.path(), &[]);
    mesh.istiod.stop();
    let down_at = Instant::now();
    let mut failures = Vec::new();
    let mut answered = 0;
    while down_at.elapsed() < Duration::from_secs(4) {
        match mesh.call_httpbin() {
            Ok((200, _)) => answered += 1,
            Ok((c, b)) => failures.push(format!("HTTP {c}: {b}")),
            Err(e) => failures.push(e.to_string()),
        }
    }
    mesh.istiod.restart();
    let up_at = Instant::now();
    while up_at.elapsed() < Duration::from_secs(3) {
        match mesh.call_httpbin() {
            Ok((200, _)) => answered += 1,
            Ok((c, b)) => failures.push(format!("HTTP {c}: {b}")),
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failed of {}: {:?}",
        failures.len(),
        answered + failures.len(),
        &failures[..failures.len().min(3)]
    );
    assert!(answered > 50, "requests flowed: {answered}");

    // A change made after the restart reaches the Pods: all traffic to v2.
    let vs = mesh.config_dir.join("istio.yaml");
    let text = std::fs::read_to_string(&vs).unwrap();
    let edited =
        text.replacen("weight: 90", "weight: 0", 1)
            .replacen("weight: 10", "weight: 100", 1);
    std::fs::write(mesh.config_dir.join(".istio.tmp"), &edited).unwrap();
    std::fs::rename(mesh.config_dir.join(".istio.tmp"), &vs).unwrap();
    tests::wait_for(
        "the post-restart change at sleep's Envoy",
        Duration::from_secs(20),
        || {
            let (counts, _) = split(&mesh, 20);
            (counts.get("v2") == Some(&20)).then_some(())
        },
    );
}

#[test]
fn certificates_rotate_several_times_during_a_request_stream() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(
        tmp.path(),
        &[("SECRET_TTL", "4s"), ("ECC_SIGNATURE_ALGORITHM", "ECDSA")],
    );
    let start = Instant::now();
    let mut failures = Vec::new();
    let mut answered = 0;
    while start.elapsed() < Duration::from_secs(9) {
        match mesh.call_httpbin() {
            Ok((200, _)) => answered += 1,
            Ok((c, b)) => failures.push(format!("HTTP {c}: {b}")),
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failed of {}: {:?}",
        failures.len(),
        answered + failures.len(),
        &failures[..failures.len().min(3)]
    );
    for (name, _, _, agent) in &mesh.pods {
        let rotations = agent
            .log()
            .matches("generated new workload certificate")
            .count();
        assert!(rotations >= 3, "{name} rotated {rotations} times");
    }
}

#[test]
fn scaling_a_service_balances_to_the_new_endpoint_with_eds_only() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mut mesh = LocalMesh::start(tmp.path(), &[]);
    // A second v1 replica: its Pod (as the kubelet would report it)...
    std::fs::write(
        mesh.config_dir.join("httpbin-v1b.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: httpbin-v1b\n  namespace: demo\n  labels: {app: httpbin, version: v1, security.istio.io/tlsMode: istio}\nspec:\n  serviceAccountName: httpbin\nstatus:\n  phase: Running\n  podIP: 198.18.0.5\n",
    )
    .unwrap();
    mesh.add_pod("httpbin-v1b", "198.18.0.5", "httpbin", "v1b");
    std::thread::sleep(Duration::from_secs(1));
    let cds = mesh.envoy_stat("sleep-1", "cluster_manager.cds.update_success");
    let lds = mesh.envoy_stat("sleep-1", "listener_manager.lds.update_success");
    let incremental = mesh.istiod.proc.log().matches("EDS: PUSH INC").count();
    // ...then the EndpointSlice lists it once it is ready.
    let slice = mesh.config_dir.join("httpbin.yaml");
    let text = std::fs::read_to_string(&slice).unwrap();
    let edited = text.replacen(
        "- addresses: [198.18.0.4]",
        "- addresses: [198.18.0.5]\n  conditions: {ready: true}\n  targetRef: {kind: Pod, namespace: demo, name: httpbin-v1b}\n- addresses: [198.18.0.4]",
        1,
    );
    std::fs::write(mesh.config_dir.join(".httpbin.tmp"), edited).unwrap();
    std::fs::rename(mesh.config_dir.join(".httpbin.tmp"), &slice).unwrap();
    tests::wait_for("the new replica to answer", Duration::from_secs(20), || {
        let (counts, _) = split(&mesh, 30);
        counts.contains_key("v1b").then_some(())
    });
    let (counts, failures) = split(&mesh, 200);
    assert!(failures.is_empty(), "{failures:?}");
    let (a, b) = (
        counts.get("v1").copied().unwrap_or(0),
        counts.get("v1b").copied().unwrap_or(0),
    );
    assert!(
        a > 40 && b > 40,
        "v1 traffic balances across both replicas: {counts:?}"
    );
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
    assert!(
        mesh.istiod.proc.log().matches("EDS: PUSH INC").count() > incremental,
        "istiod pushed EDS incrementally"
    );
}

/// A DNS query for `name` (type A) to `server` over UDP (or TCP); the answers.
fn resolve(
    ns: &tests::netns::Netns,
    server: &'static str,
    name: &'static str,
    tcp: bool,
) -> Vec<String> {
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RecordType};
    ns.run(move || {
        use std::io::{Read, Write};
        let mut m = Message::query();
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        let q = m.to_vec().unwrap();
        let resp = if tcp {
            let mut s = std::net::TcpStream::connect(server).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut out = (q.len() as u16).to_be_bytes().to_vec();
            out.extend_from_slice(&q);
            s.write_all(&out).unwrap();
            let mut len = [0u8; 2];
            s.read_exact(&mut len).unwrap();
            let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
            s.read_exact(&mut buf).unwrap();
            buf
        } else {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.send_to(&q, server).unwrap();
            let mut buf = vec![0u8; 4096];
            let n = s.recv(&mut buf).unwrap();
            buf.truncate(n);
            buf
        };
        Message::from_vec(&resp)
            .unwrap()
            .answers
            .iter()
            .map(|r| r.data.to_string())
            .collect()
    })
}

/// An upstream resolver inside the Pod, at the nameserver its resolv.conf
/// names, that knows one outside name.
fn fake_upstream(ns: &tests::netns::Netns) {
    use hickory_proto::op::{Message, MessageType, OpCode};
    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{RData, Record};
    let sock = ns.run(|| std::net::UdpSocket::bind((tests::mesh::POD_NAMESERVER, 53)).unwrap());
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        for _ in 0..1000 {
            let Ok((n, peer)) = sock.recv_from(&mut buf) else {
                return;
            };
            let Ok(q) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut r = Message::new(q.metadata.id, MessageType::Response, OpCode::Query);
            if let Some(query) = q.queries.first() {
                r.add_query(query.clone());
                if query.name().to_ascii().trim_end_matches('.') == "example.test" {
                    r.add_answer(Record::from_rdata(
                        query.name().clone(),
                        60,
                        RData::A(A("192.0.2.10".parse().unwrap())),
                    ));
                }
            }
            let _ = sock.send_to(&r.to_vec().unwrap(), peer);
        }
    });
}

#[test]
fn the_dns_proxy_answers_mesh_names_and_forwards_the_rest() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    let sleep = mesh.pod("sleep-1");
    fake_upstream(&sleep.ns);
    let vip = resolve(
        &sleep.ns,
        "127.0.0.1:15053",
        "httpbin.demo.svc.cluster.local.",
        false,
    );
    assert_eq!(vip.len(), 1, "{vip:?}");
    assert!(vip[0].starts_with("198.19."), "the Service's VIP: {vip:?}");
    assert_eq!(
        resolve(&sleep.ns, "127.0.0.1:15053", "httpbin.", false),
        vip,
        "short name in the namespace"
    );
    assert_eq!(
        resolve(&sleep.ns, "127.0.0.1:15053", "httpbin.demo.", true),
        vip,
        "over TCP too"
    );
    assert_eq!(
        resolve(&sleep.ns, "127.0.0.1:15053", "example.test.", false),
        ["192.0.2.10"],
        "forwarded upstream"
    );
}

/// Writes `yaml` into the running mesh: a file of istiod's config
/// directory, or (on Kubernetes) each object created in the API.
fn apply_yaml(mesh: &LocalMesh, file: &str, yaml: &str) {
    match &mesh.kube_api {
        Some(api) => {
            for doc in yaml.split("\n---") {
                let v: serde_json::Value = serde_yaml_ng::from_str(doc).unwrap();
                if !v.is_null() {
                    api.create(v).unwrap();
                }
            }
        }
        None => {
            let tmp = mesh.config_dir.join(format!(".{file}.tmp"));
            std::fs::write(&tmp, yaml).unwrap();
            std::fs::rename(&tmp, mesh.config_dir.join(file)).unwrap();
        }
    }
}

/// A StatefulSet `web` of three Pods behind a headless Service (HTTP 8080,
/// TCP 9000), as the StatefulSet controller writes them: each Pod's
/// `hostname` is its name, its `subdomain` the set's `serviceName`.
fn web_statefulset() -> String {
    let mut yaml = String::from(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\nspec:\n  clusterIP: None\n  selector: {app: web}\n  ports: [{name: http-web, port: 8080}, {name: tcp-echo, port: 9000}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-x1, namespace: demo, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http-web, port: 8080}, {name: tcp-echo, port: 9000}]\nendpoints:\n",
    );
    for i in 0..3 {
        yaml.push_str(&format!(
            "- {{addresses: [198.18.0.2{i}], conditions: {{ready: true}}, targetRef: {{kind: Pod, namespace: demo, name: web-{i}}}}}\n"
        ));
    }
    for i in 0..3 {
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web-{i}\n  namespace: demo\n  labels: {{app: web, security.istio.io/tlsMode: istio}}\n  ownerReferences: [{{apiVersion: apps/v1, kind: StatefulSet, name: web, uid: 5e7a1-web, controller: true}}]\nspec: {{serviceAccountName: web, hostname: web-{i}, subdomain: web}}\nstatus: {{phase: Running, podIP: 198.18.0.2{i}}}\n"
        ));
    }
    yaml
}

/// Istio's headless-service handling: `<pod>.<svc>.<ns>.svc.cluster.local`
/// resolves through the agent's DNS proxy to that Pod alone, the request
/// goes out through the `ORIGINAL_DST` cluster over mutual TLS (the
/// namespace is STRICT), and each Pod's TCP port is served through its own
/// per-address listener.
#[test]
fn a_headless_statefulset_pod_is_reached_by_its_own_name_over_mtls_and_each_pod_over_tcp() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mut mesh = LocalMesh::start(tmp.path(), &[]);
    apply_yaml(&mesh, "web.yaml", &web_statefulset());
    for i in 0..3 {
        mesh.add_pod(
            &format!("web-{i}"),
            &format!("198.18.0.2{i}"),
            "web",
            &format!("web-{i}"),
        );
        let ns = &mesh.pod(&format!("web-{i}")).ns;
        tests::mesh::serve_app(ns, "0.0.0.0:9000".parse().unwrap(), &format!("web-{i}-tcp"));
    }
    // The cluster's DNS, which answers names it does not know (the search
    // list's expansions) with no address, as kube-dns would.
    fake_upstream(&mesh.pod("sleep-1").ns);
    let url = "http://web-1.web.demo.svc.cluster.local:8080/";
    tests::wait_for("web-1 by its name", Duration::from_secs(30), || {
        mesh.app_curl("sleep-1", url)
            .ok()
            .filter(|(code, body)| *code == 200 && version(body) == "web-1")
    });
    let mut answered = BTreeMap::new();
    for _ in 0..20 {
        let (code, body) = mesh.app_curl("sleep-1", url).unwrap();
        assert_eq!(code, 200, "{body}");
        *answered.entry(version(&body)).or_insert(0) += 1;
        let xfcc = body.lines().find_map(|l| l.strip_prefix("xfcc=")).unwrap();
        assert!(
            xfcc.contains("By=spiffe://cluster.local/ns/demo/sa/web")
                && xfcc.contains(&format!("URI={SLEEP}")),
            "mutual TLS between sleep and web-1: {xfcc}"
        );
    }
    assert_eq!(
        answered,
        BTreeMap::from([("web-1".to_string(), 20)]),
        "web-1 only"
    );
    // The other Pods by their names, and the Service's name to all three.
    for pod in ["web-0", "web-2"] {
        let (code, body) = mesh
            .app_curl(
                "sleep-1",
                &format!("http://{pod}.web.demo.svc.cluster.local:8080/"),
            )
            .unwrap();
        assert_eq!((code, version(&body)), (200, pod.to_string()), "{body}");
    }
    let mut all = resolve(
        &mesh.pod("sleep-1").ns,
        "127.0.0.1:15053",
        "web.demo.svc.cluster.local.",
        false,
    );
    all.sort();
    assert_eq!(all, ["198.18.0.20", "198.18.0.21", "198.18.0.22"]);

    // TCP to each Pod's address: through sleep's per-Pod listener and the
    // ORIGINAL_DST cluster, over mTLS (STRICT refuses anything else).
    let handshakes = "cluster.outbound|9000||web.demo.svc.cluster.local;.ssl.handshake";
    let before = mesh.envoy_stat("sleep-1", handshakes);
    for i in 0..3 {
        let listener = format!("listener.198.18.0.2{i}_9000.downstream_cx_total");
        let seen = mesh.envoy_stat("sleep-1", &listener);
        let addr = format!("198.18.0.2{i}:9000").parse().unwrap();
        let (code, body) =
            tests::mesh::http_request(&mesh.pod("sleep-1").ns, addr, "web", "/").unwrap();
        assert_eq!(
            (code, version(&body)),
            (200, format!("web-{i}-tcp")),
            "{body}"
        );
        assert_eq!(
            mesh.envoy_stat("sleep-1", &listener),
            seen + 1,
            "{listener}"
        );
    }
    assert_eq!(
        mesh.envoy_stat("sleep-1", handshakes),
        before + 3,
        "one mutual TLS handshake per connection"
    );
}

/// Two TCP ServiceEntries on port 3306 without `addresses`, on Kubernetes:
/// istiod gives each an address of 240.240.0.0/16, writes it to the entry's
/// `status.addresses`, serves it over NDS, and listens on each, so each
/// client connection reaches its own backend.
#[test]
fn two_tcp_service_entries_on_one_port_get_their_own_addresses_and_backends() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start_kube(tmp.path());
    let backends: Vec<_> = [("a", "198.18.0.31"), ("b", "198.18.0.32")]
        .into_iter()
        .map(|(name, ip)| {
            let pod = mesh.plain_pod(ip);
            tests::mesh::serve_app(
                &pod.ns,
                format!("{ip}:3306").parse().unwrap(),
                &format!("db-{name}"),
            );
            pod
        })
        .collect();
    let entry = |name: &str, ip: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: mysql-{name}, namespace: demo}}\nspec:\n  hosts: [mysql-{name}.db.example]\n  ports: [{{number: 3306, name: tcp-mysql, protocol: TCP}}]\n  location: MESH_EXTERNAL\n  resolution: STATIC\n  endpoints: [{{address: {ip}}}]\n"
        )
    };
    apply_yaml(
        &mesh,
        "mysql.yaml",
        &format!(
            "{}---\n{}",
            entry("a", "198.18.0.31"),
            entry("b", "198.18.0.32")
        ),
    );
    let api = mesh.kube_api.as_ref().unwrap();
    let status = |name: &str| {
        tests::wait_for(
            &format!("mysql-{name}'s status.addresses"),
            Duration::from_secs(20),
            || {
                let se = api.get(
                    "networking.istio.io/v1",
                    "ServiceEntry",
                    "demo",
                    &format!("mysql-{name}"),
                )?;
                let list = se["status"]["addresses"].as_array()?.clone();
                let values: Vec<String> = list
                    .iter()
                    .filter(|a| a["host"] == format!("mysql-{name}.db.example"))
                    .filter_map(|a| a["value"].as_str().map(str::to_string))
                    .collect();
                (values.len() == 2).then_some(values)
            },
        )
    };
    let (a, b) = (status("a"), status("b"));
    assert!(
        a[0].starts_with("240.240.") && a[1].starts_with("2001:2::"),
        "{a:?}"
    );
    assert!(
        b[0].starts_with("240.240.") && b[1].starts_with("2001:2::"),
        "{b:?}"
    );
    assert_ne!(a, b, "distinct addresses");
    let sleep = &mesh.pod("sleep-1").ns;
    fake_upstream(sleep);
    for (name, want) in [("a", &a[0]), ("b", &b[0])] {
        let host: &'static str = Box::leak(format!("mysql-{name}.db.example.").into_boxed_str());
        let got = tests::wait_for(&format!("{host} over NDS"), Duration::from_secs(20), || {
            let ips = resolve(sleep, "127.0.0.1:15053", host, false);
            (!ips.is_empty()).then_some(ips)
        });
        assert_eq!(
            &got,
            std::slice::from_ref(want),
            "sleep resolves {host} to its status address"
        );
    }
    for _ in 0..5 {
        for name in ["a", "b"] {
            let (code, body) = tests::wait_for(
                &format!("mysql-{name} through sleep"),
                Duration::from_secs(20),
                || {
                    mesh.app_curl("sleep-1", &format!("http://mysql-{name}.db.example:3306/"))
                        .ok()
                },
            );
            assert_eq!(
                (code, version(&body)),
                (200, format!("db-{name}")),
                "{body}"
            );
        }
    }
    drop(backends);
}

/// The sample's config without its 90/10 VirtualService for httpbin.
fn sample_without_httpbin_routes(mesh: &LocalMesh) -> String {
    let text = std::fs::read_to_string(mesh.config_dir.join("istio.yaml")).unwrap();
    text.split("\n---")
        .filter(|doc| !doc.contains("kind: VirtualService"))
        .collect::<Vec<_>>()
        .join("\n---")
}

/// A delegate of team `team` for httpbin's routes: `/headers` to `subset`.
fn httpbin_delegate(subset: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: httpbin-routes, namespace: team}}\nspec:\n  http:\n  - name: headers\n    match: [{{uri: {{prefix: /headers}}}}]\n    route:\n    - destination: {{host: httpbin.demo.svc.cluster.local, subset: {subset}, port: {{number: 8000}}}}\n  - name: elsewhere\n    match: [{{uri: {{prefix: /status}}}}]\n    route:\n    - destination: {{host: httpbin.demo.svc.cluster.local, subset: v1, port: {{number: 8000}}}}\n"
    )
}

/// Istio's delegation: the root VirtualService for httpbin hands `/headers`
/// to a delegate of another namespace, whose route names the version that
/// answers; editing the delegate alone moves the traffic.
#[test]
fn a_delegate_virtual_service_routes_under_its_root_and_its_edit_alone_moves_traffic() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    let root = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: httpbin, namespace: demo}\nspec:\n  hosts: [httpbin.demo.svc.cluster.local]\n  http:\n  - name: root\n    match: [{uri: {prefix: /headers}}]\n    timeout: 5s\n    delegate: {name: httpbin-routes, namespace: team}\n";
    apply_yaml(&mesh, "delegate.yaml", &httpbin_delegate("v2"));
    let base = sample_without_httpbin_routes(&mesh);
    apply_yaml(&mesh, "istio.yaml", &format!("{base}\n---\n{root}"));
    // Ten in a row from v2: the sample's 90/10 route is gone (it would
    // give that with a chance of 1e-10).
    tests::wait_for("the delegate's v2 route", Duration::from_secs(30), || {
        (mesh.httpbin_versions(10).get("v2") == Some(&10)).then_some(())
    });
    assert_eq!(
        mesh.httpbin_versions(30),
        BTreeMap::from([("v2".to_string(), 30)]),
        "every request by the delegate's route"
    );
    // The root and the sample are untouched: only the delegate changes.
    apply_yaml(&mesh, "delegate.yaml", &httpbin_delegate("v1"));
    tests::wait_for(
        "the edited delegate's v1 route",
        Duration::from_secs(30),
        || (mesh.httpbin_versions(10).get("v1") == Some(&10)).then_some(()),
    );
    assert_eq!(
        mesh.httpbin_versions(30),
        BTreeMap::from([("v1".to_string(), 30)]),
        "every request by the edited route"
    );
}

/// A TLS server outside the mesh at `addr`, with a self-signed certificate
/// for `name`, answering each request with `version=<name>`.
fn tls_app(ns: &tests::netns::Netns, addr: std::net::SocketAddr, name: &str) {
    use std::io::{Read, Write};
    common::tls::install_crypto_provider();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let key = rustls_pki_types::PrivatePkcs8KeyDer::from(key.serialize_der());
    let config = std::sync::Arc::new(
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key.into())
            .unwrap(),
    );
    let listener = ns.run(move || std::net::TcpListener::bind(addr).unwrap());
    let name = name.to_string();
    std::thread::spawn(move || {
        for sock in listener.incoming().take(10_000) {
            let Ok(mut sock) = sock else { continue };
            let (config, name) = (config.clone(), name.clone());
            std::thread::spawn(move || {
                let _ = sock.set_read_timeout(Some(Duration::from_secs(10)));
                let mut conn = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::Stream::new(&mut conn, &mut sock);
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match tls.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let body = format!("version={name}\n");
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
}

/// A ServiceEntry `host` on `port` at `address`, its endpoint `endpoint`.
fn external(
    name: &str,
    host: &str,
    port: u16,
    protocol: &str,
    address: &str,
    endpoint: &str,
) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: demo}}\nspec:\n  hosts: [{host}]\n  addresses: [{address}]\n  ports: [{{number: {port}, name: p-{port}, protocol: {protocol}}}]\n  location: MESH_EXTERNAL\n  resolution: STATIC\n  endpoints: [{{address: {endpoint}}}]\n---\n"
    )
}

/// `tls` and `tcp` routes bound to `mesh`: sleep's TLS connection to
/// `secure.example.test` is passed, still encrypted, by its SNI to the
/// endpoint of the entry the route names (whose server answers), and its
/// TCP connections to `echo.example.test`'s address on 9000 split 80/20 between the
/// route's two destinations within four standard deviations.
#[test]
fn mesh_tls_routes_pass_through_by_sni_and_tcp_routes_split_by_weight() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    let mut pods = Vec::new();
    for (ip, name) in [("198.18.0.41", "tls-a"), ("198.18.0.42", "tls-b")] {
        let pod = mesh.plain_pod(ip);
        tls_app(&pod.ns, format!("{ip}:443").parse().unwrap(), name);
        pods.push(pod);
    }
    for (ip, name) in [
        ("198.18.0.43", "tcp-main"),
        ("198.18.0.44", "tcp-v1"),
        ("198.18.0.45", "tcp-v2"),
    ] {
        let pod = mesh.plain_pod(ip);
        tests::mesh::serve_app(&pod.ns, format!("{ip}:9000").parse().unwrap(), name);
        pods.push(pod);
    }
    let entries = [
        external(
            "secure",
            "secure.example.test",
            443,
            "TLS",
            "240.240.10.1",
            "198.18.0.41",
        ),
        external(
            "secure-b",
            "secure-b.example.test",
            443,
            "TLS",
            "240.240.10.2",
            "198.18.0.42",
        ),
        external(
            "echo",
            "echo.example.test",
            9000,
            "TCP",
            "240.240.10.3",
            "198.18.0.43",
        ),
        external(
            "echo-v1",
            "echo-v1.example.test",
            9000,
            "TCP",
            "240.240.10.4",
            "198.18.0.44",
        ),
        external(
            "echo-v2",
            "echo-v2.example.test",
            9000,
            "TCP",
            "240.240.10.5",
            "198.18.0.45",
        ),
    ]
    .concat();
    apply_yaml(&mesh, "external.yaml", &entries);
    // The cluster's DNS for the names the DNS proxy does not know.
    fake_upstream(&mesh.pod("sleep-1").ns);
    let https = |host: &str| {
        mesh.app_curl_with("sleep-1", &["-k"], &format!("https://{host}/"))
            .ok()
            .map(|(_, body)| version(&body))
    };
    // Without routes, each name reaches its own entry's endpoint.
    tests::wait_for(
        "secure.example.test unrouted",
        Duration::from_secs(30),
        || (https("secure.example.test").as_deref() == Some("tls-a")).then_some(()),
    );
    let routes = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: secure, namespace: demo}\nspec:\n  hosts: [secure.example.test]\n  tls:\n  - match: [{port: 443, sniHosts: [secure.example.test]}]\n    route:\n    - destination: {host: secure-b.example.test, port: {number: 443}}\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: echo, namespace: demo}\nspec:\n  hosts: [echo.example.test]\n  tcp:\n  - match: [{port: 9000}]\n    route:\n    - destination: {host: echo-v1.example.test, port: {number: 9000}}\n      weight: 80\n    - destination: {host: echo-v2.example.test, port: {number: 9000}}\n      weight: 20\n";
    apply_yaml(&mesh, "routes.yaml", routes);
    tests::wait_for("the tls route", Duration::from_secs(30), || {
        (https("secure.example.test").as_deref() == Some("tls-b")).then_some(())
    });
    for _ in 0..10 {
        assert_eq!(
            https("secure.example.test").as_deref(),
            Some("tls-b"),
            "by SNI to secure-b's endpoint, TLS end to end"
        );
    }
    let tcp = || {
        // By the entry's address: 200 connections, no DNS queries.
        mesh.app_curl("sleep-1", "http://240.240.10.3:9000/")
            .map(|(_, body)| version(&body))
    };
    tests::wait_for("the tcp route", Duration::from_secs(30), || {
        tcp().ok().filter(|v| v != "tcp-main")
    });
    let n = 200;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..n {
        *counts.entry(tcp().unwrap()).or_default() += 1;
    }
    eprintln!("tcp split over {n} connections: {counts:?}");
    let v1 = counts.get("tcp-v1").copied().unwrap_or(0);
    let v2 = counts.get("tcp-v2").copied().unwrap_or(0);
    assert_eq!(v1 + v2, n, "every connection to one of the two: {counts:?}");
    // Binomial(200, 0.8): mean 160, sigma ~5.66; four sigma ~22.6.
    let sigma = (n as f64 * 0.8 * 0.2).sqrt();
    assert!(
        (v1 as f64 - 0.8 * n as f64).abs() <= 4.0 * sigma,
        "80/20 within four sigma: {counts:?}"
    );
    drop(pods);
}

/// In file mode (no Kubernetes API), an auto-registered VM's WorkloadEntry
/// lives in istiod's store: `/debug/configz` lists it while the agent is
/// connected, the VM serves a meshed client over mTLS, and the entry is
/// gone once the agent has stopped for `PILOT_WORKLOAD_ENTRY_GRACE_PERIOD`.
#[test]
fn a_vm_registers_through_a_workload_group_in_file_mode() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mut mesh = LocalMesh::start_tuned(
        tmp.path(),
        &[("PILOT_WORKLOAD_ENTRY_GRACE_PERIOD", "2s")],
        &[],
    );
    apply_yaml(
        &mesh,
        "vm.yaml",
        r#"apiVersion: v1
kind: Service
metadata: {name: vm-app, namespace: demo}
spec:
  clusterIP: 198.19.0.41
  selector: {app: vm}
  ports: [{name: http, port: 8080, targetPort: 8080}]
---
apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata: {name: vm, namespace: demo}
spec:
  metadata: {labels: {app: vm}}
  template: {serviceAccount: vm}
"#,
    );
    let http = mesh.istiod.http;
    let listed = move |ns: &tests::netns::Netns| {
        ns.run(move || {
            let (code, body) = tests::http_get(http, "/debug/configz").unwrap();
            assert_eq!(code, 200, "{body}");
            body.contains("WorkloadEntry/demo/vm-198.18.0.41")
        })
    };
    // The group reaches istiod before the VM connects.
    tests::wait_for("the WorkloadGroup", Duration::from_secs(20), || {
        let ns = &mesh.hub.ns;
        ns.run(move || tests::http_get(http, "/debug/configz").unwrap().1)
            .contains("WorkloadGroup/demo/vm")
            .then_some(())
    });
    mesh.add_vm(
        "vm-2",
        "198.18.0.41",
        "vm",
        &[("ISTIO_META_AUTO_REGISTER_GROUP", "vm")],
        &[],
        "",
    );
    assert!(listed(&mesh.hub.ns), "the entry is in configz");
    let body = tests::wait_for(
        "the VM answering sleep",
        Duration::from_secs(30),
        || match mesh.app_curl("sleep-1", "http://vm-app:8080/") {
            Ok((200, body)) => Some(body),
            _ => None,
        },
    );
    assert!(body.contains("version=vm"), "{body}");
    assert!(body.contains(&format!("URI={SLEEP}")), "{body}");

    let i = mesh.pods.iter().position(|p| p.0 == "vm-2").unwrap();
    let stopped = Instant::now();
    drop(mesh.pods.remove(i));
    tests::wait_for("the entry gone", Duration::from_secs(30), || {
        (!listed(&mesh.hub.ns)).then_some(())
    });
    assert!(
        stopped.elapsed() >= Duration::from_secs(2),
        "removed after {:?}, within the grace period",
        stopped.elapsed()
    );
}
