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

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tests::load::{Target, machine_load, table, warm_round};

use tests::mesh::{HTTPBIN_VIP, LocalMesh, http_request};
use tests::netns::Netns;

/// Client connections, each with one request in flight.
const CONNECTIONS: usize = 4;

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

fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let length = Duration::from_secs(seconds);
    println!("load average at start: {}", machine_load());
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
        let r = warm_round(
            sleep,
            &Target::Plain(addr),
            "httpbin:8000",
            "/headers",
            CONNECTIONS,
            length,
        );
        rows.push((n.to_string(), r));
    }
    println!("load average at end: {}", machine_load());
    println!(
        "\n{}",
        table("policies on httpbin", "× 0 policies", &rows, 0)
    );
}
