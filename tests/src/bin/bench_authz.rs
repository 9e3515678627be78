//! Requests per second and p99 latency through the server's Envoy with 0,
//! 10 and 100 AuthorizationPolicies selecting it, in one run: sleep's app
//! calls httpbin through the mesh (iptables capture, both Envoys, mTLS) on
//! keep-alive connections; only the number of policies on httpbin's
//! sidecars changes between rounds. The 0-policy round is the baseline and
//! is measured again at the end, so drift in the machine's load shows.
//!
//! Policy shapes, as a mesh with many has them: ALLOWs naming principals,
//! namespaces, methods, paths and a header condition, one DENY on paths in
//! ten, and one ALLOW for sleep's identity, so the measured requests are
//! allowed after every rule was evaluated.
//!
//! `cargo build --release --workspace --bins && target/release/bench_authz [SECONDS]`
//! (needs root, iproute2 and iptables). Prints a table; asserts nothing about speed.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use tests::mesh::{HTTPBIN_VIP, LocalMesh, http_request};
use tests::netns::Netns;

/// Client connections, each with one request in flight.
const CONNECTIONS: usize = 4;
/// The most requests one round sends, whatever its length.
const MAX_REQUESTS: usize = 2_000_000;

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `n` policies on httpbin: fillers of the common shapes, and the ALLOW
/// that admits sleep, and a DENY on `/sentinel-<n>` to tell when they are in.
fn policies(n: usize) -> String {
    let mut out = String::new();
    if n == 0 {
        return out;
    }
    out.push_str(&format!(
        r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: sentinel, namespace: demo}}
spec:
  selector: {{matchLabels: {{app: httpbin}}}}
  action: DENY
  rules:
  - to:
    - operation: {{paths: ["/sentinel-{n}"]}}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: allow-sleep, namespace: demo}}
spec:
  selector: {{matchLabels: {{app: httpbin}}}}
  action: ALLOW
  rules:
  - from:
    - source: {{principals: ["cluster.local/ns/demo/sa/sleep"]}}
    to:
    - operation: {{methods: ["GET"], paths: ["/headers"]}}
---
"#
    ));
    for i in 0..n - 2 {
        if i % 10 == 9 {
            out.push_str(&format!(
                r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: deny-{i}, namespace: demo}}
spec:
  selector: {{matchLabels: {{app: httpbin}}}}
  action: DENY
  rules:
  - to:
    - operation: {{paths: ["/admin-{i}*"]}}
---
"#
            ));
        } else {
            out.push_str(&format!(
                r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: allow-{i}, namespace: demo}}
spec:
  selector: {{matchLabels: {{app: httpbin}}}}
  action: ALLOW
  rules:
  - from:
    - source: {{principals: ["cluster.local/ns/demo/sa/client-{i}"]}}
    - source: {{namespaces: ["team-{i}"]}}
    to:
    - operation: {{methods: ["GET", "HEAD"], paths: ["/api/{i}/*", "/status"]}}
    when:
    - key: request.headers[x-tenant]
      values: ["tenant-{i}"]
---
"#
            ));
        }
    }
    out
}

/// Waits until the policies of round `n` serve on every httpbin sidecar:
/// 20 requests in a row to the round's sentinel path refused (any
/// subset), or, for 0, requests to the last round's sentinel allowed.
fn wait_converged(sleep: &Netns, addr: SocketAddr, n: usize, previous: usize) {
    let (path, want) = if n == 0 {
        (format!("/sentinel-{previous}"), 200)
    } else {
        (format!("/sentinel-{n}"), 403)
    };
    let start = Instant::now();
    let mut in_a_row = 0;
    for _ in 0..10_000 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "round {n}: policies not in force after 60 s"
        );
        match http_request(sleep, addr, "httpbin:8000", &path) {
            Ok((code, _)) if code == want => in_a_row += 1,
            _ => in_a_row = 0,
        }
        if in_a_row == 20 {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("round {n}: policies not in force");
}

/// Reads one HTTP/1.1 response with a `content-length`: its status.
fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<u16> {
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    buf.drain(..head_end + length);
    Ok(status)
}

/// One round: `CONNECTIONS` keep-alive clients for `length`; (requests
/// per second, sorted latencies, failures).
fn round(sleep: &Netns, addr: SocketAddr, length: Duration) -> (f64, Vec<Duration>, usize) {
    let threads: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            sleep.spawn(move || {
                let mut latencies = Vec::new();
                let mut failed = 0;
                let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
                s.set_nodelay(true).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let request = b"GET /headers HTTP/1.1\r\nHost: httpbin:8000\r\n\r\n";
                let mut buf = Vec::new();
                let start = Instant::now();
                while start.elapsed() < length && latencies.len() < MAX_REQUESTS / CONNECTIONS {
                    let t = Instant::now();
                    s.write_all(request).unwrap();
                    match read_response(&mut s, &mut buf) {
                        Ok(200) => latencies.push(t.elapsed()),
                        Ok(_) => failed += 1,
                        Err(e) => panic!("connection failed mid-round: {e}"),
                    }
                }
                (latencies, failed, start.elapsed())
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut failed = 0;
    let mut longest = Duration::ZERO;
    for t in threads {
        let (l, f, e) = t.join().unwrap();
        all.extend(l);
        failed += f;
        longest = longest.max(e);
    }
    all.sort();
    (all.len() as f64 / longest.as_secs_f64(), all, failed)
}

fn pct(v: &[Duration], p: f64) -> Duration {
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
}

fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let length = Duration::from_secs(seconds);
    println!("load average at start: {}", load());
    let tmp = tempfile::Builder::new()
        .prefix("bench-authz.")
        .tempdir()
        .unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    let sleep = &mesh.pod("sleep-1").ns;
    let addr: SocketAddr = format!("{HTTPBIN_VIP}:8000").parse().unwrap();
    let file = mesh.config_dir.join("bench-authz.yaml");
    let mut rows = Vec::new();
    let mut previous = 0;
    for n in [0, 10, 100, 0] {
        std::fs::write(&file, policies(n)).unwrap();
        wait_converged(sleep, addr, n, previous);
        previous = n;
        // Warm the connections' path up before measuring.
        round(sleep, addr, Duration::from_secs(1));
        let (rps, latencies, failed) = round(sleep, addr, length);
        rows.push((
            n,
            rps,
            pct(&latencies, 0.50),
            pct(&latencies, 0.99),
            latencies.len(),
            failed,
        ));
    }
    println!("load average at end: {}", load());
    let (_, base_rps, _, base_p99, _, _) = rows[0];
    println!(
        "\n| policies on httpbin | requests | failed | requests/s | p50 ms | p99 ms | requests/s × 0 policies | p99 × 0 policies |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (n, rps, p50, p99, count, failed) in rows {
        println!(
            "| {n} | {count} | {failed} | {rps:.0} | {:.3} | {:.3} | {:.2} | {:.2} |",
            p50.as_secs_f64() * 1000.0,
            p99.as_secs_f64() * 1000.0,
            rps / base_rps,
            p99.as_secs_f64() / base_p99.as_secs_f64()
        );
    }
}
