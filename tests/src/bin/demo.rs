//! The local demo: istiod's CA issues a workload certificate; pilot-agent
//! starts a real Envoy with Istio's bootstrap and serves it the certificate
//! over SDS; a client watches Envoy present it over TLS while it rotates.
//! The Pod is a network namespace of its own, so Envoy keeps Istio's ports.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tests::netns::Netns;
use tests::{Istiod, Pod, PodDir, TLS_PORT, wait_for};

const IDENTITY: &str = "spiffe://cluster.local/ns/default/sa/sleep";

fn main() {
    let seconds: u64 = std::env::args()
        .skip_while(|a| a != "--seconds")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let tmp = tempfile::Builder::new()
        .prefix("mesh-demo.")
        .tempdir()
        .unwrap();
    println!("demo directory: {}", tmp.path().display());

    let ns = Netns::new("demo-pod");
    let istiod = Istiod::start_in(
        &ns,
        &tmp.path().join("istiod"),
        &[("ISTIOD_CUSTOM_HOST", "127.0.0.1")],
    );
    println!(
        "istiod is ready: CA on {} (TLS), root in {}/etc/istio-ca-secret",
        istiod.grpc,
        istiod.dir.display()
    );
    let root = istiod.root_pem();
    let dir = PodDir::new(
        &tmp.path().join("pod-sleep"),
        &istiod.token("default", "sleep"),
        Some(&root),
    );
    let ca = istiod.grpc.to_string();
    let pod = Pod::start(
        ns,
        dir,
        &[
            ("POD_NAME", "sleep-1"),
            ("POD_NAMESPACE", "default"),
            ("SERVICE_ACCOUNT", "sleep"),
            ("CA_ADDR", &ca),
            ("SECRET_TTL", "10s"),
        ],
    );
    println!(
        "pilot-agent started for default/sleep in network namespace {} with 10s certificates; it wrote {} and launched Envoy",
        pod.ns.name,
        pod.dir.dir.join("etc/istio/proxy/envoy-rev.json").display()
    );
    println!(
        "(istiod does not serve xDS yet: the demo hands Envoy its TLS listener from a small ADS server of its own on the agent's XDS socket)"
    );
    let first = pod.wait_served(&root, IDENTITY, Duration::from_secs(30));
    println!(
        "Envoy's TLS listener on :{TLS_PORT} presents URI SAN {:?}, verified against istiod's root",
        first.uri_sans
    );
    let ready = wait_for("readiness", Duration::from_secs(10), || {
        pod.ns.run(|| {
            tests::http_get(
                std::net::SocketAddr::from(([127, 0, 0, 1], 15021)),
                "/healthz/ready",
            )
            .ok()
        })
    });
    println!(
        "Envoy's :15021/healthz/ready (through the agent's :15020) says {}",
        ready.0
    );

    let mut serials = BTreeSet::new();
    let (mut ok, mut failed) = (0u32, 0u32);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(seconds) {
        match pod.probe(&root, Some(IDENTITY)) {
            Ok((info, _)) => {
                ok += 1;
                if serials.insert(info.serial.clone()) {
                    println!(
                        "  t={:>4.1}s  new certificate serial {}",
                        start.elapsed().as_secs_f64(),
                        info.serial
                    );
                }
            }
            Err(e) => {
                failed += 1;
                println!(
                    "  t={:>4.1}s  handshake failed: {e}",
                    start.elapsed().as_secs_f64()
                );
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "summary: {ok} TLS requests answered, {failed} failed, {} certificates seen in {seconds}s, one Envoy process throughout (pid {})",
        serials.len(),
        pod.envoy_pid()
            .map(|p| p.to_string())
            .unwrap_or_else(|| "?".into())
    );
    if failed > 0 {
        std::process::exit(1);
    }
}
