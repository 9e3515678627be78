//! AuthorizationPolicy enforced by real Envoys in the local mesh: the
//! policies in istiod's config directory become the RBAC and ext_authz
//! filters of httpbin's inbound chains, and what the clients observe
//! (`403 RBAC: access denied`, a closed TCP connection, the external
//! authorizer's own answer) follows the policy as it is edited live.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tests::mesh::LocalMesh;
use tests::netns::Netns;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    tests::mesh::one_mesh_at_a_time()
}

/// What Envoy's RBAC filter answers a denied request with.
const DENIED: &str = "RBAC: access denied";
/// httpbin's Service address, as the clients' resolvers would give it (a
/// name outside a Pod's own namespace costs the search-path misses).
const HTTPBIN: &str = "http://198.19.0.10:8000";
/// A client in namespace demo with service account `other`.
const OTHER: (&str, &str) = ("other-1", "198.18.0.5");
/// A client in namespace prod with service account `sleep`.
const PROD: (&str, &str) = ("prod-1", "198.18.0.6");
/// The ext_authz server's Pod (no sidecar).
const EXT_AUTHZ_IP: &str = "198.18.0.7";
/// Service `tcp-echo`: port 9000 (TCP) on the httpbin Pods.
const TCP_ECHO_VIP: &str = "198.19.0.30";
const TCP_PORT: u16 = 9000;

/// Writes `file` in istiod's config directory in one rename, as an editor would.
fn write_config(mesh: &LocalMesh, file: &str, text: &str) {
    let tmp = mesh.config_dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, mesh.config_dir.join(file)).unwrap();
}

/// An AuthorizationPolicy on httpbin (`selector: app: httpbin`) in demo;
/// `body` is the rest of its spec, indented by two spaces.
fn policy(name: &str, body: &str) -> String {
    format!(
        "---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: {name}, namespace: demo}}\nspec:\n  selector:\n    matchLabels: {{app: httpbin}}\n{body}\n"
    )
}

/// A client Pod's Kubernetes object, as the kubelet would report it.
/// A namespace other than the sample's demo comes with its Namespace.
fn pod_object(name: &str, ns: &str, ip: &str, sa: &str) -> String {
    let namespace = if ns == "demo" {
        String::new()
    } else {
        format!("---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n")
    };
    format!(
        "{namespace}---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels: {{app: {name}, security.istio.io/tlsMode: istio}}\nspec:\n  serviceAccountName: {sa}\nstatus:\n  phase: Running\n  podIP: {ip}\n"
    )
}

/// Adds a client Pod (its object, then its network, agent and Envoy).
fn add_client(mesh: &mut LocalMesh, (name, ip): (&str, &str), ns: &str, sa: &str) {
    write_config(mesh, &format!("{name}.yaml"), &pod_object(name, ns, ip, sa));
    mesh.add_pod_in(ns, name, ip, sa, name);
}

/// A JSON document from a Pod's Envoy admin.
fn envoy_admin(ns: &Netns, path: &'static str) -> serde_json::Value {
    ns.run(move || {
        let (code, body) =
            tests::http_get(SocketAddr::from(([127, 0, 0, 1], 15000)), path).unwrap();
        assert_eq!(code, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap()
    })
}

/// The AuthorizationPolicy names (`policy[<name>]` in Istio's RBAC policy
/// names) in the active listeners of a Pod's Envoy, and whether they carry
/// an HTTP RBAC filter at all.
fn active_policies(ns: &Netns) -> (BTreeSet<String>, bool) {
    let dump = envoy_admin(ns, "/config_dump");
    let mut text = String::new();
    for c in dump["configs"].as_array().unwrap() {
        for l in c["dynamic_listeners"].as_array().into_iter().flatten() {
            text.push_str(&l["active_state"].to_string());
        }
    }
    let names = text
        .split("-policy[")
        .skip(1)
        .filter_map(|s| s.split_once(']').map(|(n, _)| n.to_string()))
        .collect();
    (names, text.contains("envoy.filters.http.rbac"))
}

/// Waits until both httpbin Envoys' active listeners carry exactly the
/// policies `names` (and an RBAC filter when `rbac`).
fn wait_policies(mesh: &LocalMesh, names: &[&str], rbac: bool) {
    let want: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
    for pod in ["httpbin-v1", "httpbin-v2"] {
        let ns = &mesh.pod(pod).ns;
        let mut last = None;
        let start = Instant::now();
        loop {
            let got = active_policies(ns);
            if got.0 == want && got.1 == rbac {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{pod}'s Envoy never got policies {want:?} (rbac filter {rbac}); last {last:?}"
            );
            last = Some(got);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Sends all of httpbin's traffic to v1 and waits until sleep's Envoy
/// does. A policy edit replaces the server's inbound chains, and Envoy
/// answers the next request on each connection of a replaced chain before
/// closing it (its drain); with one server Pod in use, each client holds
/// one such connection, and two rounds of checks in a row see the edit.
/// The policies still go to (and are awaited at) both httpbin Envoys.
fn all_to_v1(mesh: &LocalMesh) {
    let path = mesh.config_dir.join("istio.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let edited =
        text.replacen("weight: 10", "weight: 0", 1)
            .replacen("weight: 90", "weight: 100", 1);
    assert_ne!(text, edited);
    write_config(mesh, "istio.yaml", &edited);
    let mut running = 0;
    tests::wait_for(
        "all of sleep's traffic to v1",
        Duration::from_secs(30),
        || {
            let v1 = matches!(mesh.call_httpbin(), Ok((200, b)) if b.starts_with("version=v1\n"));
            running = if v1 { running + 1 } else { 0 };
            (running == 30).then_some(())
        },
    );
}

/// One request and what it must get.
struct Check {
    pod: &'static str,
    args: Vec<&'static str>,
    path: &'static str,
    status: u16,
    /// The exact body for a denial; for an answer of the app, a line it
    /// must hold (the request line it saw).
    body: String,
}

fn check(pod: &'static str, args: &[&'static str], path: &'static str, status: u16) -> Check {
    let body = if status == 200 {
        let method = args
            .windows(2)
            .find(|w| w[0] == "-X")
            .map_or("GET", |w| w[1]);
        format!("request={method} {path} HTTP/1.1")
    } else {
        DENIED.to_string()
    };
    Check {
        pod,
        args: args.to_vec(),
        path,
        status,
        body,
    }
}

impl Check {
    /// What went wrong, if anything.
    fn run(&self, mesh: &LocalMesh) -> Option<String> {
        let url = format!("{HTTPBIN}{}", self.path);
        let got = mesh.app_curl_with(self.pod, &self.args, &url);
        let ok = match &got {
            Ok((code, body)) if *code == self.status => {
                if self.status == 200 {
                    body.lines().any(|l| l == self.body)
                } else {
                    body == &self.body
                }
            }
            _ => false,
        };
        (!ok).then(|| {
            format!(
                "{} {:?} {}: want {} {:?}, got {got:?}",
                self.pod, self.args, self.path, self.status, self.body
            )
        })
    }
}

/// Applies `policies` (the whole `authz.yaml`), waits for the httpbin
/// Envoys to hold exactly `names`, then until every check holds in two
/// rounds running (the Envoys close connections of the replaced chains as
/// they drain; a request may still finish on one). Fails naming the checks
/// that never held.
fn step(mesh: &LocalMesh, what: &str, policies: &str, names: &[&str], checks: &[Check]) {
    let written = Instant::now();
    write_config(mesh, "authz.yaml", policies);
    wait_policies(mesh, names, !names.is_empty() || !policies.is_empty());
    eprintln!(
        "{what}: at both httpbin Envoys after {:?}",
        written.elapsed()
    );
    converge(mesh, what, checks);
    eprintln!("{what}: checks held after {:?}", written.elapsed());
}

/// Waits until every check holds in two rounds running; fails naming the
/// checks that never did.
fn converge(mesh: &LocalMesh, what: &str, checks: &[Check]) {
    let start = Instant::now();
    let mut passed = 0;
    while passed < 2 {
        let failures: Vec<String> = checks.iter().filter_map(|c| c.run(mesh)).collect();
        if failures.is_empty() {
            passed += 1;
            continue;
        }
        passed = 0;
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{what}:\n{}",
            failures.join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The RBAC stat lines of a Pod's Envoy (for failure messages).
fn rbac_stats(mesh: &LocalMesh, pod: &str) -> String {
    mesh.pod(pod).ns.run(|| {
        let (_, body) = tests::http_get(SocketAddr::from(([127, 0, 0, 1], 15000)), "/stats")
            .unwrap_or_default();
        body.lines()
            .filter(|l| l.contains("rbac"))
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// The sum of a counter over both httpbin Envoys.
fn httpbin_stat(mesh: &LocalMesh, name: &str) -> u64 {
    mesh.envoy_stat("httpbin-v1", name) + mesh.envoy_stat("httpbin-v2", name)
}

#[test]
fn http_policies_admit_and_refuse_by_identity_path_method_namespace_ip_and_header() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mut mesh = LocalMesh::start(tmp.path(), &[]);
    all_to_v1(&mesh);
    add_client(&mut mesh, OTHER, "demo", "other");
    add_client(&mut mesh, PROD, "prod", "sleep");
    let (sleep, other, prod) = ("sleep-1", OTHER.0, PROD.0);

    // No policy: everyone in.
    step(
        &mesh,
        "no policy",
        "",
        &[],
        &[
            check(sleep, &[], "/headers", 200),
            check(other, &[], "/headers", 200),
            check(prod, &[], "/headers", 200),
        ],
    );

    // Deny by default: an ALLOW policy with no rules matches nothing.
    step(
        &mesh,
        "ALLOW without rules",
        &policy("allow-nothing", "  action: ALLOW"),
        &[],
        &[
            check(sleep, &[], "/headers", 403),
            check(other, &[], "/headers", 403),
        ],
    );
    // Istio's inbound HTTP stat prefix ends in `;`.
    let denied_stat = "http.inbound_0.0.0.0_8080;.rbac.denied";
    let before = httpbin_stat(&mesh, denied_stat);
    check(sleep, &[], "/headers", 403).run(&mesh);
    assert_eq!(
        httpbin_stat(&mesh, denied_stat),
        before + 1,
        "the inbound HTTP RBAC filter counted the denial: {}",
        rbac_stats(&mesh, "httpbin-v1")
    );

    // principals: sleep's identity only (prod's sleep is another namespace's).
    step(
        &mesh,
        "ALLOW principals",
        &policy(
            "allow-sleep",
            "  rules:\n  - from:\n    - source:\n        principals: [cluster.local/ns/demo/sa/sleep]",
        ),
        &["allow-sleep"],
        &[
            check(sleep, &[], "/headers", 200),
            check(other, &[], "/headers", 403),
            check(prod, &[], "/headers", 403),
        ],
    );

    // DENY wins over an ALLOW of everything; methods: GET only.
    let deny_admin = policy(
        "deny-admin",
        "  action: DENY\n  rules:\n  - to:\n    - operation:\n        paths: [\"/admin*\"]",
    );
    let allow_get = policy(
        "allow-get",
        "  rules:\n  - to:\n    - operation:\n        methods: [GET]",
    );
    step(
        &mesh,
        "DENY paths over ALLOW methods",
        &format!("{deny_admin}{allow_get}"),
        &["deny-admin", "allow-get"],
        &[
            check(sleep, &[], "/headers", 200),
            check(other, &[], "/headers", 200),
            check(sleep, &[], "/admin/x", 403),
            // Paths are normalized before policy (Istio's default BASE):
            // a dot-segment sent as is does not slip past the DENY.
            check(sleep, &["--path-as-is"], "/ip/../admin/x", 403),
            check(other, &[], "/administrator", 403),
            check(sleep, &["-X", "POST"], "/headers", 403),
            check(sleep, &["-X", "DELETE"], "/headers", 403),
            check(sleep, &[], "/ip", 200),
        ],
    );

    // namespaces: prod only (prod's Pod has sleep's service account name).
    step(
        &mesh,
        "ALLOW namespaces",
        &policy(
            "allow-prod",
            "  rules:\n  - from:\n    - source:\n        namespaces: [prod]",
        ),
        &["allow-prod"],
        &[
            check(prod, &[], "/headers", 200),
            check(sleep, &[], "/headers", 403),
            check(other, &[], "/headers", 403),
        ],
    );

    // ipBlocks: the caller Pod's address (the connection's source).
    step(
        &mesh,
        "ALLOW ipBlocks",
        &policy(
            "allow-ip",
            &format!(
                "  rules:\n  - from:\n    - source:\n        ipBlocks: [{}/32, 198.18.1.0/24]",
                OTHER.1
            ),
        ),
        &["allow-ip"],
        &[
            check(other, &[], "/headers", 200),
            check(sleep, &[], "/headers", 403),
            check(prod, &[], "/headers", 403),
        ],
    );

    // when: a request header, and notValues beside it.
    step(
        &mesh,
        "ALLOW when request.headers",
        &policy(
            "allow-header",
            "  rules:\n  - when:\n    - key: request.headers[x-user]\n      values: [alice, \"admin-*\"]\n      notValues: [admin-root]",
        ),
        &["allow-header"],
        &[
            check(sleep, &["-H", "x-user: alice"], "/headers", 200),
            check(other, &["-H", "x-user: admin-ops"], "/headers", 200),
            check(sleep, &["-H", "x-user: admin-root"], "/headers", 403),
            check(sleep, &["-H", "x-user: bob"], "/headers", 403),
            check(sleep, &[], "/headers", 403),
        ],
    );

    // Negated sources, workload ports, notPaths, source.ip and a path
    // template, each refusing and admitting the right request.
    let deny_outside = policy(
        "deny-outside-demo",
        "  action: DENY\n  rules:\n  - from:\n    - source:\n        notNamespaces: [demo]",
    );
    let allow_by_ip = policy(
        "allow-by-ip",
        "  rules:\n  - to:\n    - operation:\n        ports: [\"8080\"]\n        notPaths: [\"/status*\"]\n    when:\n    - key: source.ip\n      values: [198.18.0.2, 198.18.0.6]\n  - from:\n    - source:\n        principals: [cluster.local/ns/demo/sa/other]\n    to:\n    - operation:\n        paths: [\"/things/{*}/ok\"]",
    );
    step(
        &mesh,
        "notNamespaces, ports, notPaths, source.ip, path template",
        &format!("{deny_outside}{allow_by_ip}"),
        &["deny-outside-demo", "allow-by-ip"],
        &[
            check(sleep, &[], "/headers", 200),
            check(sleep, &[], "/status/1", 403),
            check(prod, &[], "/headers", 403),
            check(other, &[], "/headers", 403),
            check(other, &[], "/things/a/ok", 200),
            check(other, &[], "/things/a/b/ok", 403),
        ],
    );

    live_edit_keeps_allowed_traffic(&mesh);
}

/// A stream of sleep's requests while the policy is edited (other's rule
/// removed): none fails, and other is refused once the edit arrives.
fn live_edit_keeps_allowed_traffic(mesh: &LocalMesh) {
    let rules = |other: bool| {
        let mut principals = vec!["cluster.local/ns/demo/sa/sleep"];
        if other {
            principals.push("cluster.local/ns/demo/sa/other");
        }
        policy(
            "allow-clients",
            &format!(
                "  rules:\n  - from:\n    - source:\n        principals: {principals:?}\n    to:\n    - operation:\n        methods: [GET]"
            ),
        )
    };
    step(
        mesh,
        "before the edit",
        &rules(true),
        &["allow-clients"],
        &[
            check("sleep-1", &[], "/headers", 200),
            check(OTHER.0, &[], "/headers", 200),
        ],
    );
    let stop = AtomicBool::new(false);
    let answered = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                match mesh.call_httpbin() {
                    Ok((200, _)) => {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok((code, body)) => failures
                        .lock()
                        .unwrap()
                        .push(format!("HTTP {code}: {body}")),
                    Err(e) => failures.lock().unwrap().push(e.to_string()),
                }
            }
        });
        let before = answered.load(Ordering::Relaxed);
        write_config(mesh, "authz.yaml", &rules(false));
        let changed = Instant::now();
        // Refused twice running: the first request on a connection of
        // the replaced chain may still be answered by it.
        let mut running = 0;
        let refused = tests::wait_for(
            "other refused after the edit",
            Duration::from_secs(30),
            || match mesh.app_curl(OTHER.0, &format!("{HTTPBIN}/headers")) {
                Ok((403, body)) if body == DENIED => {
                    running += 1;
                    (running == 2).then(|| changed.elapsed())
                }
                _ => {
                    running = 0;
                    None
                }
            },
        );
        // Keep the stream going across the httpbin Envoys' listener updates.
        while changed.elapsed() < refused + Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, Ordering::Relaxed);
        assert!(
            answered.load(Ordering::Relaxed) > before + 20,
            "sleep's requests flowed during the edit"
        );
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of sleep's requests failed during the edit (of {}): {:?}",
        failures.len(),
        answered.load(Ordering::Relaxed) + failures.len(),
        &failures[..failures.len().min(3)]
    );
    converge(
        mesh,
        "after the edit",
        &[
            check(OTHER.0, &[], "/headers", 403),
            check("sleep-1", &[], "/headers", 200),
        ],
    );
}

/// A TCP echo server on `port` in `ns`.
fn tcp_echo(ns: &Netns, port: u16) {
    let listener = ns.run(move || std::net::TcpListener::bind(("0.0.0.0", port)).unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming().take(10_000) {
            let Ok(mut c) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n) = c.read(&mut buf) {
                    if n == 0 || c.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
}

/// What a TCP client in `pod` gets back for `ping\n` sent to the echo
/// Service: the bytes, or the error that ended the connection.
fn tcp_ping(mesh: &LocalMesh, pod: &str) -> std::io::Result<Vec<u8>> {
    let addr: SocketAddr = format!("{TCP_ECHO_VIP}:{TCP_PORT}").parse().unwrap();
    mesh.pod(pod).ns.run(move || {
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"ping\n")?;
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        while got.len() < 5 {
            match s.read(&mut buf)? {
                0 => break,
                n => got.extend_from_slice(&buf[..n]),
            }
        }
        Ok(got)
    })
}

/// Whether the connection was closed by the far side without a byte.
fn refused(r: &std::io::Result<Vec<u8>>) -> bool {
    match r {
        Ok(bytes) => bytes.is_empty(),
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

const TCP_ECHO_SERVICE: &str = "apiVersion: v1
kind: Service
metadata: {name: tcp-echo, namespace: demo}
spec:
  clusterIP: 198.19.0.30
  selector: {app: httpbin}
  ports:
  - {name: tcp-echo, port: 9000, targetPort: 9000, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: tcp-echo-1
  namespace: demo
  labels: {kubernetes.io/service-name: tcp-echo}
addressType: IPv4
ports:
- {name: tcp-echo, port: 9000, protocol: TCP}
endpoints:
- addresses: [198.18.0.3]
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: demo, name: httpbin-v1}
- addresses: [198.18.0.4]
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: demo, name: httpbin-v2}
";

#[test]
fn a_tcp_port_admits_and_refuses_connections_by_identity() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mut mesh = LocalMesh::start(tmp.path(), &[]);
    all_to_v1(&mesh);
    add_client(&mut mesh, OTHER, "demo", "other");
    for pod in ["httpbin-v1", "httpbin-v2"] {
        tcp_echo(&mesh.pod(pod).ns, TCP_PORT);
    }
    write_config(&mesh, "tcp-echo.yaml", TCP_ECHO_SERVICE);
    // Without a policy both clients reach the echo over the mesh.
    for pod in ["sleep-1", OTHER.0] {
        tests::wait_for(
            &format!("{pod} echoed through the mesh"),
            Duration::from_secs(30),
            || tcp_ping(&mesh, pod).ok().filter(|b| b == b"ping\n"),
        );
    }

    let denied_stat = "tcp.rbac.denied";
    let allowed_stat = "tcp.rbac.allowed";
    let allow_sleep = policy(
        "allow-sleep",
        "  rules:\n  - from:\n    - source:\n        principals: [cluster.local/ns/demo/sa/sleep]",
    );
    write_config(&mesh, "authz.yaml", &allow_sleep);
    wait_policies(&mesh, &["allow-sleep"], true);
    tests::wait_for("other refused on TCP", Duration::from_secs(20), || {
        refused(&tcp_ping(&mesh, OTHER.0)).then_some(())
    });
    let (denied, allowed) = (
        httpbin_stat(&mesh, denied_stat),
        httpbin_stat(&mesh, allowed_stat),
    );
    for _ in 0..3 {
        let r = tcp_ping(&mesh, OTHER.0);
        assert!(
            refused(&r),
            "other's connection is closed with no data: {r:?}"
        );
        assert_eq!(tcp_ping(&mesh, "sleep-1").unwrap(), b"ping\n");
    }
    assert_eq!(
        httpbin_stat(&mesh, denied_stat),
        denied + 3,
        "the network RBAC filter denied other's three connections"
    );
    assert_eq!(
        httpbin_stat(&mesh, allowed_stat),
        allowed + 3,
        "and allowed sleep's three"
    );

    // An ALLOW rule with an HTTP-only attribute is dropped on TCP chains
    // (it would allow more): other is refused on TCP, served on HTTP GET.
    let allow_other_get = policy(
        "allow-other-get",
        "  rules:\n  - from:\n    - source:\n        principals: [cluster.local/ns/demo/sa/other]\n    to:\n    - operation:\n        methods: [GET]",
    );
    write_config(
        &mesh,
        "authz.yaml",
        &format!("{allow_sleep}{allow_other_get}"),
    );
    wait_policies(&mesh, &["allow-sleep", "allow-other-get"], true);
    converge(
        &mesh,
        "other served on HTTP",
        &[check(OTHER.0, &[], "/headers", 200)],
    );
    let r = tcp_ping(&mesh, OTHER.0);
    assert!(
        refused(&r),
        "the HTTP-only ALLOW rule is not applied on TCP: {r:?}"
    );
    assert_eq!(tcp_ping(&mesh, "sleep-1").unwrap(), b"ping\n");

    // A DENY rule with an HTTP-only attribute keeps the rest of its rule on
    // TCP chains (it denies more): sleep's connections are refused, while
    // on HTTP only the paths it names are.
    let deny_sleep_admin = policy(
        "deny-sleep-admin",
        "  action: DENY\n  rules:\n  - from:\n    - source:\n        principals: [cluster.local/ns/demo/sa/sleep]\n    to:\n    - operation:\n        paths: [\"/admin*\"]",
    );
    write_config(
        &mesh,
        "authz.yaml",
        &format!("{allow_sleep}{deny_sleep_admin}"),
    );
    wait_policies(&mesh, &["allow-sleep", "deny-sleep-admin"], true);
    tests::wait_for("sleep refused on TCP", Duration::from_secs(20), || {
        refused(&tcp_ping(&mesh, "sleep-1")).then_some(())
    });
    let denied = httpbin_stat(&mesh, denied_stat);
    let r = tcp_ping(&mesh, "sleep-1");
    assert!(refused(&r), "{r:?}");
    assert_eq!(httpbin_stat(&mesh, denied_stat), denied + 1);
    converge(
        &mesh,
        "the DENY rule on HTTP",
        &[
            check("sleep-1", &[], "/headers", 200),
            check("sleep-1", &[], "/admin", 403),
        ],
    );
}

fn has_line(body: &str, line: &str) -> bool {
    body.lines().any(|l| l == line)
}

/// The ext_authz server's record: the paths it was asked about.
type Asked = Arc<Mutex<Vec<String>>>;

/// A small HTTP authorizer on `addr` in `ns`: denies (403, its own body
/// and `x-ext-reason`) a request carrying `x-ext-deny`, allows any other
/// and names the user for the app in `x-ext-user`.
fn ext_authz_server(ns: &Netns, addr: SocketAddr) -> Asked {
    let listener = ns.run(move || std::net::TcpListener::bind(addr).unwrap());
    let asked: Asked = Arc::default();
    let record = asked.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(10_000) {
            let Ok(mut c) = conn else { continue };
            let record = record.clone();
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        match c.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end);
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                    record.lock().unwrap().push(path);
                    let deny = head
                        .lines()
                        .any(|l| l.to_ascii_lowercase().starts_with("x-ext-deny:"));
                    let response = if deny {
                        let body = "denied by ext-authz\n";
                        format!(
                            "HTTP/1.1 403 Forbidden\r\nx-ext-reason: test-says-no\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        )
                    } else {
                        "HTTP/1.1 200 OK\r\nx-ext-user: alice\r\nContent-Length: 0\r\n\r\n".into()
                    };
                    if c.write_all(response.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    asked
}

const EXT_AUTHZ_SERVICE: &str = "apiVersion: v1
kind: Service
metadata: {name: ext-authz, namespace: demo}
spec:
  clusterIP: 198.19.0.40
  ports:
  - {name: http, port: 8000, targetPort: 8000}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: ext-authz-1
  namespace: demo
  labels: {kubernetes.io/service-name: ext-authz}
addressType: IPv4
ports:
- {name: http, port: 8000, protocol: TCP}
endpoints:
- addresses: [198.18.0.7]
  conditions: {ready: true}
";

const MESH_CONFIG: &str = "extensionProviders:
- name: test-ext-authz
  envoyExtAuthzHttp:
    service: ext-authz.demo.svc.cluster.local
    port: 8000
    pathPrefix: /check
    timeout: 5s
    includeRequestHeadersInCheck: [x-ext-deny]
    headersToUpstreamOnAllow: [x-ext-user]
    headersToDownstreamOnDeny: [x-ext-reason]
";

#[test]
fn a_custom_policy_hands_the_verdict_to_the_ext_authz_server() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    // istiod reads ./mesh.yaml from its directory at start-up.
    std::fs::create_dir_all(tmp.path().join("istiod")).unwrap();
    std::fs::write(tmp.path().join("istiod/mesh.yaml"), MESH_CONFIG).unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    let authz_pod = mesh.plain_pod(EXT_AUTHZ_IP);
    let asked = ext_authz_server(
        &authz_pod.ns,
        format!("{EXT_AUTHZ_IP}:8000").parse().unwrap(),
    );
    write_config(&mesh, "ext-authz.yaml", EXT_AUTHZ_SERVICE);
    let custom = policy(
        "ext-authz",
        "  action: CUSTOM\n  provider: {name: test-ext-authz}\n  rules:\n  - to:\n    - operation:\n        paths: [\"/headers*\"]",
    );
    write_config(&mesh, "authz.yaml", &custom);
    wait_policies(&mesh, &["ext-authz"], true);

    let url = |path: &str| format!("{HTTPBIN}{path}");
    // Allowed by the server: the app gets the request with the header the
    // server added for it (`headersToUpstreamOnAllow`).
    let mut last: Option<Result<(u16, String), String>> = None;
    let start = Instant::now();
    while !matches!(&last, Some(Ok((200, body))) if has_line(body, "header=x-ext-user: alice")) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the authorizer's allow and x-ext-user never reached the app: {last:?}"
        );
        last = Some(mesh.app_curl("sleep-1", &url("/headers")));
    }
    assert!(
        asked.lock().unwrap().iter().any(|p| p == "/check/headers"),
        "the authorizer was asked at pathPrefix + path: {:?}",
        asked.lock().unwrap()
    );

    // Denied by the server: its status, body and the header it allowed to
    // the client are what the client sees.
    let (code, out) = mesh
        .app_curl_with(
            "sleep-1",
            &["-i", "-H", "x-ext-deny: yes"],
            &url("/headers"),
        )
        .unwrap();
    assert_eq!(code, 403, "{out}");
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert_eq!(body, "denied by ext-authz\n");
    assert!(
        head.lines()
            .any(|l| l.eq_ignore_ascii_case("x-ext-reason: test-says-no")),
        "{head}"
    );

    // A path the CUSTOM rules do not select is not sent to the server.
    let n = asked.lock().unwrap().len();
    let (code, body) = mesh
        .app_curl_with("sleep-1", &["-H", "x-ext-deny: yes"], &url("/ip"))
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(
        body.lines().any(|l| l == "request=GET /ip HTTP/1.1"),
        "{body}"
    );
    assert_eq!(
        asked.lock().unwrap().len(),
        n,
        "the authorizer was not asked"
    );

    // A deeper path the rules' `/headers*` selects is asked about too.
    let (code, body) = mesh
        .app_curl_with("sleep-1", &["-H", "x-ext-deny: 1"], &url("/headers/x"))
        .unwrap();
    assert_eq!((code, body.as_str()), (403, "denied by ext-authz\n"));
    assert!(
        asked
            .lock()
            .unwrap()
            .iter()
            .any(|p| p == "/check/headers/x"),
        "{:?}",
        asked.lock().unwrap()
    );

    // A provider the mesh config does not have: no check can be made, so
    // every request to the workload is refused (never let through).
    let missing = policy(
        "ext-authz-missing",
        "  action: CUSTOM\n  provider: {name: no-such-provider}\n  rules:\n  - to:\n    - operation:\n        paths: [\"/headers*\"]",
    );
    write_config(&mesh, "authz.yaml", &missing);
    wait_policies(&mesh, &["ext-authz-missing"], true);
    let refused = [
        check("sleep-1", &[], "/headers", 403),
        check("sleep-1", &[], "/ip", 403),
    ];
    // Each upstream connection sleep's Envoy opened under the previous chain
    // answers one more request with it (asking the authorizer) while Envoy
    // drains it; once they are gone, rounds of requests ask nothing.
    let mut quiet_round = false;
    for _ in 0..10 {
        let n = asked.lock().unwrap().len();
        converge(&mesh, "a missing provider", &refused);
        if asked.lock().unwrap().len() == n {
            quiet_round = true;
            break;
        }
    }
    assert!(
        quiet_round,
        "the authorizer was still asked under a provider the mesh does not have: {:?}",
        asked.lock().unwrap()
    );
}
