//! Transparent capture as Istio users run it: each Pod's namespace gets the
//! injection template's `istio-init` step (`pilot-agent istio-iptables`),
//! pilot-agent and Envoy run as uid 1337, and the apps, unaware of the mesh,
//! call `http://httpbin:8000/` and listen on their Pod port.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tests::mesh::{APP_UID, HTTPBIN_VIP, LocalMesh, PROXY_UID, serve_app};

fn serial() -> std::sync::MutexGuard<'static, ()> {
    tests::mesh::one_mesh_at_a_time()
}

const SLEEP: &str = "spiffe://cluster.local/ns/demo/sa/sleep";
const HTTPBIN: &str = "spiffe://cluster.local/ns/demo/sa/httpbin";
/// A Pod outside the mesh (no sidecar) and outside the registry.
const OUTSIDER_IP: &str = "198.18.0.20";

fn field<'a>(body: &'a str, key: &str) -> &'a str {
    body.lines().find_map(|l| l.strip_prefix(key)).unwrap_or("")
}

/// Edits a file of istiod's config directory in one rename, as an editor would.
fn edit(mesh: &LocalMesh, file: &str, from: &str, to: &str) {
    let path = mesh.config_dir.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let edited = text.replacen(from, to, 1);
    assert_ne!(text, edited, "{from:?} in {file}");
    let tmp = mesh.config_dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, edited).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
}

/// What a client outside the mesh gets from `addr`: the bytes of the answer
/// to a plain-text GET (empty when the peer closed without a word).
fn plain_get(ns: &tests::netns::Netns, addr: &str) -> std::io::Result<Vec<u8>> {
    let addr: SocketAddr = addr.parse().unwrap();
    ns.run(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET / HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n")?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)?;
        Ok(buf)
    })
}

#[test]
fn apps_call_services_by_name_and_ip_through_both_envoys_over_mtls() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);

    // The app's ordinary resolver (glibc, the Pod's resolv.conf) is answered
    // by the agent: nothing serves the nameserver resolv.conf names.
    let out = mesh
        .pod("sleep-1")
        .command_as(APP_UID, "getent")
        .args(["hosts", "httpbin.demo.svc.cluster.local"])
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(
        answer.starts_with(&format!("{HTTPBIN_VIP} ")),
        "getent: {answer} {}",
        String::from_utf8_lossy(&out.stderr)
    );

    for url in [
        "http://httpbin:8000/headers".to_string(),
        "http://httpbin.demo:8000/headers".into(),
        "http://httpbin.demo.svc.cluster.local:8000/headers".into(),
        format!("http://{HTTPBIN_VIP}:8000/headers"),
    ] {
        let (code, body) = mesh.app_curl("sleep-1", &url).unwrap();
        assert_eq!(code, 200, "{url}: {body}");
        let xfcc = field(&body, "xfcc=");
        assert!(
            xfcc.contains(&format!("URI={SLEEP}")),
            "{url}: the server saw the client's identity: {xfcc}"
        );
        assert!(
            xfcc.contains(&format!("By={HTTPBIN}")),
            "{url}: and its own: {xfcc}"
        );
        assert_eq!(
            field(&body, "peer="),
            "127.0.0.6",
            "{url}: the app was handed the request by its Envoy"
        );
    }

    // The VirtualService's 90/10 split holds for captured traffic.
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..300 {
        let (code, body) = mesh.call_httpbin().unwrap();
        assert_eq!(code, 200, "{body}");
        *counts
            .entry(field(&body, "version=").to_string())
            .or_default() += 1;
    }
    let v1 = counts.get("v1").copied().unwrap_or(0) as f64 / 300.0;
    assert!((0.84..=0.96).contains(&v1), "90/10 expected: {counts:?}");
}

#[test]
fn clients_without_a_sidecar_get_plain_text_under_permissive_and_nothing_under_strict() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    let outsider = mesh.plain_pod(OUTSIDER_IP);
    let server = "198.18.0.3:8080";

    // STRICT (the sample): no chain of httpbin's inbound listener takes plain
    // text, and Envoy closes the connection without a byte.
    let refused = "listener.0.0.0.0_15006.no_filter_chain_match";
    let before = mesh.envoy_stat("httpbin-v1", refused);
    match plain_get(&outsider.ns, server) {
        Ok(bytes) => assert!(
            bytes.is_empty(),
            "STRICT must not answer plain text: {}",
            String::from_utf8_lossy(&bytes)
        ),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    assert_eq!(mesh.envoy_stat("httpbin-v1", refused), before + 1);
    // Mesh clients reach the same port over mTLS.
    let (code, body) = mesh.app_curl("sleep-1", "http://httpbin:8000/").unwrap();
    assert_eq!((code, field(&body, "xfcc=").is_empty()), (200, false));

    // PERMISSIVE: plain text is served on the same port, through the Envoy.
    edit(&mesh, "istio.yaml", "mode: STRICT", "mode: PERMISSIVE");
    let body = tests::wait_for("PERMISSIVE at httpbin-v1", Duration::from_secs(20), || {
        plain_get(&outsider.ns, server)
            .ok()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .filter(|b| b.starts_with("HTTP/1.1 200"))
    });
    assert_eq!(field(&body, "xfcc="), "", "no client certificate: {body}");
    assert_eq!(
        field(&body, "peer="),
        "127.0.0.6",
        "delivered by httpbin's Envoy: {body}"
    );
    let (code, body) = mesh.app_curl("sleep-1", "http://httpbin:8000/").unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(
        field(&body, "xfcc=").contains(&format!("URI={SLEEP}")),
        "mesh clients still use mTLS under PERMISSIVE: {body}"
    );
}

#[test]
fn unknown_destinations_pass_through_under_allow_any_and_hit_the_black_hole_under_registry_only() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mut mesh = LocalMesh::start(tmp.path(), &[]);
    let outsider = mesh.plain_pod(OUTSIDER_IP);
    for port in [9090, 8000] {
        serve_app(
            &outsider.ns,
            format!("{OUTSIDER_IP}:{port}").parse().unwrap(),
            "outsider",
        );
    }
    let url = format!("http://{OUTSIDER_IP}:9090/");
    let passthrough = "cluster.PassthroughCluster;.upstream_cx_total";

    // ALLOW_ANY (the default): through sleep's Envoy to the original destination.
    let before = mesh.envoy_stat("sleep-1", passthrough);
    let (code, body) = mesh.app_curl("sleep-1", &url).unwrap();
    assert_eq!(
        (code, field(&body, "version=")),
        (200, "outsider"),
        "{body}"
    );
    assert_eq!(field(&body, "peer="), "198.18.0.2", "{body}");
    assert_eq!(mesh.envoy_stat("sleep-1", passthrough), before + 1);
    // On a port where the mesh has HTTP services, an unknown host takes the
    // route's `allow_any` virtual host to the same place.
    let http_port_url = format!("http://{OUTSIDER_IP}:8000/");
    let (code, body) = mesh.app_curl("sleep-1", &http_port_url).unwrap();
    assert_eq!(
        (code, field(&body, "version=")),
        (200, "outsider"),
        "{body}"
    );
    let before = mesh.envoy_stat("sleep-1", passthrough);

    // The proxy's own traffic (uid 1337) is not captured: same answer, the
    // Envoy never sees it.
    let out = mesh
        .pod("sleep-1")
        .command_as(PROXY_UID, "curl")
        .args(["-sS", "-m", "5", &url])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("version=outsider"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        mesh.envoy_stat("sleep-1", passthrough),
        before,
        "the proxy user's connection never reached the Envoy"
    );

    // Envoy's and the agent's ports stay reachable directly (excluded from
    // inbound capture), even under STRICT.
    for (port, path, want) in [
        (15021, "/healthz/ready", ""),
        (15020, "/healthz/ready", ""),
        (15090, "/stats/prometheus", "envoy_server_live"),
    ] {
        let (code, body) = outsider
            .ns
            .run(move || tests::http_get(format!("198.18.0.3:{port}").parse().unwrap(), path))
            .unwrap();
        assert_eq!(code, 200, ":{port}{path}: {body}");
        assert!(body.contains(want), ":{port}{path}: {body}");
    }

    // REGISTRY_ONLY from mesh config: the same call ends in BlackHoleCluster,
    // which closes the connection at once.
    std::fs::write(
        mesh.istiod.dir.join("mesh.yaml"),
        "outboundTrafficPolicy:\n  mode: REGISTRY_ONLY\n",
    )
    .unwrap();
    mesh.istiod.restart();
    let black_hole = "cluster.BlackHoleCluster;.upstream_cx_none_healthy";
    let err = tests::wait_for(
        "REGISTRY_ONLY at sleep's Envoy",
        Duration::from_secs(20),
        || mesh.app_curl("sleep-1", &url).err(),
    );
    // curl's "Empty reply from server" (52) or "Recv failure" (56), not a
    // timeout (28): the Envoy closed it.
    assert!(
        err.contains("exit Some(52)") || err.contains("exit Some(56)"),
        "{err}"
    );
    let holes = mesh.envoy_stat("sleep-1", black_hole);
    assert!(mesh.app_curl("sleep-1", &url).is_err());
    assert_eq!(mesh.envoy_stat("sleep-1", black_hole), holes + 1);
    // On the HTTP port, the route's `block_all` virtual host answers 502.
    let (code, body) = mesh.app_curl("sleep-1", &http_port_url).unwrap();
    assert_eq!(code, 502, "{body}");
    // Mesh services still work.
    let (code, _) = mesh.app_curl("sleep-1", "http://httpbin:8000/").unwrap();
    assert_eq!(code, 200);
}

/// The init step's rules, without a mesh: idempotent, removable, and checked
/// by the validation mode of CNI installs.
#[test]
fn capture_rules_apply_once_clean_up_and_pass_validation_only_when_capturing() {
    let hub = tests::mesh::Hub::new();
    let pilot_agent = tests::bin("pilot-agent");
    let pod = hub.pod("pod", "198.18.0.30");
    pod.istio_init(&pilot_agent, true);
    let rules = |save: &str| -> Vec<String> {
        let mut v: Vec<String> = save
            .lines()
            .filter(|l| l.starts_with("-A ") || l.starts_with(":ISTIO"))
            .map(|l| {
                if l.starts_with(':') {
                    // ":CHAIN POLICY [packets:bytes]": the chain's name.
                    l.split_whitespace().next().unwrap().to_string()
                } else {
                    l.to_string()
                }
            })
            .collect();
        v.sort();
        v
    };
    let first = rules(&pod.iptables_save());
    for chain in [
        "ISTIO_INBOUND",
        "ISTIO_IN_REDIRECT",
        "ISTIO_OUTPUT",
        "ISTIO_REDIRECT",
    ] {
        assert!(
            first.iter().any(|l| l == &format!(":{chain}")),
            "{chain} in {first:#?}"
        );
    }
    assert!(
        first
            .iter()
            .any(|l| l.contains("--dport 53") && l.contains("--to-ports 15053")),
        "DNS to the agent: {first:#?}"
    );
    pod.istio_init(&pilot_agent, true);
    assert_eq!(
        rules(&pod.iptables_save()),
        first,
        "a second run adds nothing"
    );

    // Validation (`istio-validation`, before the proxy starts, as the proxy
    // user): passes where the rules capture, fails where there are none.
    let dir = tempfile::tempdir().unwrap();
    let as_proxy = tests::mesh::runnable_by_proxy(&pilot_agent, dir.path());
    let validate = |net: &tests::mesh::PodNet| {
        net.command_as(PROXY_UID, &as_proxy)
            .args(["istio-iptables", "--run-validation", "--skip-rule-apply"])
            .output()
            .unwrap()
    };
    let ok = validate(&pod);
    assert!(
        ok.status.success(),
        "validation in a captured Pod: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let bare = hub.pod("bare", "198.18.0.31");
    let failed = validate(&bare);
    assert_eq!(
        failed.status.code(),
        Some(126),
        "validation without rules fails as Istio's does"
    );
    let message = String::from_utf8_lossy(&failed.stderr);
    assert!(
        message.contains("iptables validation failed"),
        "Istio's message: {message}"
    );

    let out = pod
        .ns
        .command(&pilot_agent)
        .arg("istio-clean-iptables")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left = pod.iptables_save();
    assert!(
        !left.contains("ISTIO_"),
        "nothing of Istio's is left:\n{left}"
    );
}
