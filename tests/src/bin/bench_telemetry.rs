//! Requests per second and p99 latency through the mesh with Istio's
//! telemetry on (access logs to the proxies' stdout and the standard
//! `istio_*` metrics, both sidecars) against both off, in one run: sleep's
//! app calls httpbin through the mesh (iptables capture, both Envoys, mTLS)
//! on keep-alive connections; only a root-namespace Telemetry resource
//! changes between rounds. Rounds alternate off, on, off, on so drift in the
//! machine's load shows; the first "off" round is the baseline.
//!
//! `cargo build --release --workspace --bins && target/release/bench_telemetry [SECONDS]`
//! (needs root, iproute2 and iptables). Prints a table; asserts nothing about speed.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tests::load::{Target, machine_load, table, warm_round};
use tests::mesh::{HTTPBIN_VIP, LocalMesh, http_request};

/// Client connections, each with one request in flight.
const CONNECTIONS: usize = 4;

/// The mesh-wide Telemetry of a round: access logs through the built-in
/// `envoy` provider and the Prometheus metrics, both on or both off.
fn telemetry(on: bool) -> String {
    let disabled = !on;
    format!(
        r#"apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {{name: mesh-default, namespace: istio-system}}
spec:
  accessLogging:
  - providers: [{{name: envoy}}]
    disabled: {disabled}
  metrics:
  - providers: [{{name: prometheus}}]
    overrides:
    - match: {{metric: ALL_METRICS, mode: CLIENT_AND_SERVER}}
      disabled: {disabled}
"#
    )
}

/// The type of Envoy's file access log configuration.
const FILE_LOG: &str = "envoy.extensions.access_loggers.file.v3.FileAccessLog";
/// The type of the gRPC access log the standard metrics come from.
const GRPC_LOG: &str = "envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig";

/// Whether a Pod's Envoy has the file and the gRPC access loggers in its
/// dynamic listeners, and the size of what it answered.
fn loggers(mesh: &LocalMesh, pod: &str) -> (bool, bool, usize) {
    let dump = mesh.pod(pod).ns.run(|| {
        tests::http_get(
            SocketAddr::from(([127, 0, 0, 1], 15000)),
            "/config_dump?resource=dynamic_listeners",
        )
        .map(|(_, body)| body)
        .unwrap_or_default()
    });
    (dump.contains(FILE_LOG), dump.contains(GRPC_LOG), dump.len())
}

/// Whether a Pod's Envoy has access loggers of both kinds (file and the
/// gRPC one the standard metrics come from) in its listeners, or neither.
fn telemetry_state(mesh: &LocalMesh, pod: &str) -> Option<bool> {
    let (file, grpc, _) = loggers(mesh, pod);
    (file == grpc).then_some(file)
}

/// Waits until both sidecars of the path serve the round's config.
fn wait_converged(mesh: &LocalMesh, on: bool) {
    let start = Instant::now();
    for _ in 0..1_200 {
        if ["sleep-1", "httpbin-v1", "httpbin-v2"]
            .iter()
            .all(|p| telemetry_state(mesh, p) == Some(on))
        {
            return;
        }
        if start.elapsed() > Duration::from_secs(60) {
            for p in ["sleep-1", "httpbin-v1", "httpbin-v2"] {
                let (file, grpc, size) = loggers(mesh, p);
                eprintln!("{p}: {size} bytes, file log {file}, grpc log {grpc}");
            }
            panic!("telemetry {on}: not in force after 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("telemetry {on}: not in force");
}

fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let length = Duration::from_secs(seconds);
    println!("load average at start: {}", machine_load());
    let tmp = tempfile::Builder::new()
        .prefix("bench-telemetry.")
        .tempdir()
        .unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    let sleep = &mesh.pod("sleep-1").ns;
    let addr: SocketAddr = format!("{HTTPBIN_VIP}:8000").parse().unwrap();
    let file = mesh.config_dir.join("bench-telemetry.yaml");
    let mut rows = Vec::new();
    for on in [false, true, false, true] {
        std::fs::write(&file, telemetry(on)).unwrap();
        wait_converged(&mesh, on);
        assert_eq!(
            http_request(sleep, addr, "httpbin:8000", "/headers")
                .unwrap()
                .0,
            200
        );
        let r = warm_round(
            sleep,
            &Target::Plain(addr),
            "httpbin:8000",
            "/headers",
            CONNECTIONS,
            length,
        );
        rows.push((if on { "on" } else { "off" }.to_string(), r));
    }
    println!("load average at end: {}", machine_load());
    println!(
        "\n{}",
        table("access logs + istio_* metrics", "× off", &rows, 0)
    );
}
