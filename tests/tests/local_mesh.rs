//! The whole mesh on one machine: istiod with the sample config, Pods each
//! with pilot-agent and a real Envoy in a network namespace of their own,
//! talking to each other over mutual TLS with the identities istiod signed.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tests::mesh::LocalMesh;

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

#[test]
fn pods_talk_over_mtls_with_istiod_identities_and_strict_refuses_plaintext() {
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
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

    // PeerAuthentication STRICT: plain text straight to the server Pod is refused.
    let plain = mesh.pod("sleep-1").ns.run(|| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect_timeout(
            &"10.244.0.3:8080".parse().unwrap(),
            Duration::from_secs(2),
        )?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET / HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n")?;
        let mut buf = String::new();
        s.read_to_string(&mut buf)?;
        Ok::<_, std::io::Error>(buf)
    });
    // An error is a reset: refused.
    if let Ok(answer) = plain {
        assert!(
            !answer.starts_with("HTTP/1.1 200"),
            "plain text must not be served: {answer}"
        );
    }
}

#[test]
fn weighted_routes_split_traffic_and_a_live_edit_changes_it_without_failures() {
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
