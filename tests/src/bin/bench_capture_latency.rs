//! Latency a request gains through two Envoys: sleep's app calling httpbin
//! through the mesh with iptables capture (`http://<Service IP>:8000/`,
//! both Envoys, mTLS), and through Sidecar `captureMode: NONE` listeners
//! (`127.0.0.1:8000`), against the same app called directly: a client in a
//! Pod without a sidecar calling a server Pod without one, same bridge, same
//! app code. One request per connection (`Connection: close`), as the
//! tests' clients send them; p50 and p99 over N requests each, in one run.
//!
//! `cargo build --release --workspace --bins && target/release/bench_capture_latency [N]`
//! (needs root, iproute2 and iptables). Prints a table; asserts nothing about speed.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tests::load::{machine_load, ms, pct};
use tests::mesh::{Capture, HTTPBIN_VIP, LocalMesh, http_request, serve_app};
use tests::netns::Netns;

/// `n` requests to `addr` from `ns` (after 100 to warm up): sorted latencies.
fn measure(ns: &Netns, addr: SocketAddr, host: &str, n: usize) -> Vec<Duration> {
    for _ in 0..100 {
        let (code, body) = http_request(ns, addr, host, "/").unwrap();
        assert_eq!(code, 200, "{body}");
    }
    let mut out = Vec::with_capacity(n);
    let mut failed = 0;
    for _ in 0..n {
        let t = Instant::now();
        match http_request(ns, addr, host, "/") {
            Ok((200, _)) => out.push(t.elapsed()),
            _ => failed += 1,
        }
    }
    assert_eq!(failed, 0, "requests failed");
    out.sort();
    out
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    println!("load average at start: {}", machine_load());

    let tmp = tempfile::Builder::new()
        .prefix("bench-capture.")
        .tempdir()
        .unwrap();
    // Each mesh's own baseline, interleaved with it in blocks, so drift in
    // the machine's load hits both: (label, baseline, through the mesh).
    let mut rows = Vec::new();
    for capture in [Capture::Iptables, Capture::None] {
        let dir = tmp.path().join(format!("{capture:?}"));
        let mesh = LocalMesh::start_with(&dir, capture, &[]);
        // Baseline: two Pods without sidecars on the same bridge.
        let client = mesh.plain_pod("198.18.0.40");
        let server = mesh.plain_pod("198.18.0.41");
        let direct: SocketAddr = "198.18.0.41:8080".parse().unwrap();
        serve_app(&server.ns, direct, "direct");
        let (target, label): (SocketAddr, _) = match capture {
            Capture::Iptables => (
                format!("{HTTPBIN_VIP}:8000").parse().unwrap(),
                "iptables capture, two Envoys, mTLS",
            ),
            Capture::None => (
                "127.0.0.1:8000".parse().unwrap(),
                "captureMode NONE listeners, two Envoys, mTLS",
            ),
        };
        let sleep = &mesh.pod("sleep-1").ns;
        let (mut base, mut meshed) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            base.extend(measure(&client.ns, direct, "198.18.0.41:8080", n / 5));
            meshed.extend(measure(sleep, target, "httpbin:8000", n / 5));
        }
        base.sort();
        meshed.sort();
        rows.push((label, base, meshed));
    }
    println!("load average at end: {}", machine_load());
    println!(
        "\n| path | requests | p50 ms | p99 ms | baseline p50 ms | baseline p99 ms | p50 × baseline | p99 × baseline |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (name, base, v) in &rows {
        let (p50, p99) = (pct(v, 0.50), pct(v, 0.99));
        let (b50, b99) = (pct(base, 0.50), pct(base, 0.99));
        println!(
            "| {name} | {} | {} | {} | {} | {} | {:.2} | {:.2} |",
            v.len(),
            ms(p50),
            ms(p99),
            ms(b50),
            ms(b99),
            p50.as_secs_f64() / b50.as_secs_f64(),
            p99.as_secs_f64() / b99.as_secs_f64()
        );
    }
}
