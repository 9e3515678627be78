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

use tests::mesh::{Capture, HTTPBIN_VIP, LocalMesh, http_request, serve_app};
use tests::netns::Netns;

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

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

fn pct(v: &[Duration], p: f64) -> Duration {
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    println!("load average at start: {}", load());

    let tmp = tempfile::Builder::new()
        .prefix("bench-capture.")
        .tempdir()
        .unwrap();
    let mut rows = Vec::new();
    {
        let mesh = LocalMesh::start_with(&tmp.path().join("iptables"), Capture::Iptables, &[]);
        // Baseline: two Pods without sidecars on the same bridge.
        let client = mesh.plain_pod("198.18.0.40");
        let server = mesh.plain_pod("198.18.0.41");
        let direct: SocketAddr = "198.18.0.41:8080".parse().unwrap();
        serve_app(&server.ns, direct, "direct");
        let vip: SocketAddr = format!("{HTTPBIN_VIP}:8000").parse().unwrap();
        let sleep = &mesh.pod("sleep-1").ns;
        // Interleaved in blocks so drift in the machine's load hits both.
        let (mut base, mut captured) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            base.extend(measure(&client.ns, direct, "198.18.0.41:8080", n / 5));
            captured.extend(measure(sleep, vip, "httpbin:8000", n / 5));
        }
        base.sort();
        captured.sort();
        rows.push(("direct, no sidecars (baseline)", base));
        rows.push(("iptables capture, two Envoys, mTLS", captured));
    }
    {
        let mesh = LocalMesh::start_with(&tmp.path().join("none"), Capture::None, &[]);
        let local: SocketAddr = "127.0.0.1:8000".parse().unwrap();
        let none = measure(&mesh.pod("sleep-1").ns, local, "httpbin:8000", n);
        rows.push(("captureMode NONE listeners, two Envoys, mTLS", none));
    }
    println!("load average at end: {}", load());
    let (b50, b99) = (pct(&rows[0].1, 0.50), pct(&rows[0].1, 0.99));
    println!("\n| path | requests | p50 ms | p99 ms | p50 − baseline | p99 − baseline |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, v) in &rows {
        let (p50, p99) = (pct(v, 0.50), pct(v, 0.99));
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            v.len(),
            ms(p50),
            ms(p99),
            ms(p50.saturating_sub(b50)),
            ms(p99.saturating_sub(b99))
        );
    }
}
