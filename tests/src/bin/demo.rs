//! The local demo: istiod's CA issues a workload certificate, pilot-agent
//! serves it to a real Envoy over SDS, and a client watches Envoy present it
//! over TLS while the certificate rotates.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tests::envoy::{listener_port, sds_tls_bootstrap};
use tests::{Envoy, Istiod, PodDir, tls, wait_for};

fn main() {
    let seconds: u64 = std::env::args()
        .skip_while(|a| a != "--seconds")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let keep = std::env::args().any(|a| a == "--keep");
    let tmp = tempfile::Builder::new()
        .prefix("mesh-demo.")
        .tempdir()
        .unwrap();
    let root_dir = if keep {
        tmp.keep()
    } else {
        tmp.path().to_path_buf()
    };
    println!("demo directory: {}", root_dir.display());

    let istiod = Istiod::start(
        &root_dir.join("istiod"),
        &[("ISTIOD_CUSTOM_HOST", "127.0.0.1")],
    );
    println!(
        "istiod is ready: CA on {} (TLS), root in {}/etc/istio-ca-secret",
        istiod.grpc,
        istiod.dir.display()
    );
    let root = istiod.root_pem();
    let token = istiod.token("default", "sleep");
    let pod = PodDir::new(&root_dir.join("pod-sleep"), &token, Some(&root));
    let ca = istiod.grpc.to_string();
    let _agent = pod.start_agent(&[
        ("POD_NAME", "sleep-1"),
        ("POD_NAMESPACE", "default"),
        ("SERVICE_ACCOUNT", "sleep"),
        ("CA_ADDR", &ca),
        ("SECRET_TTL", "10s"),
    ]);
    println!(
        "pilot-agent started for default/sleep with 10s certificates (SDS socket {})",
        pod.sds_socket().display()
    );
    let port = listener_port();
    let _envoy = Envoy::start(&pod.dir, &sds_tls_bootstrap(port, &pod.sds_socket()));
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    println!(
        "Envoy started; its TLS listener on {addr} takes `default` and `ROOTCA` from the agent"
    );

    let first = wait_for(
        "Envoy to serve a certificate",
        Duration::from_secs(30),
        || tls::probe(addr, &root, None).ok(),
    );
    println!(
        "Envoy presents: URI SAN {:?}, verified against istiod's root",
        first.0.uri_sans
    );

    let mut serials = BTreeSet::new();
    let (mut ok, mut failed) = (0u32, 0u32);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(seconds) {
        match tls::probe(
            addr,
            &root,
            Some("spiffe://cluster.local/ns/default/sa/sleep"),
        ) {
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
        "summary: {ok} TLS requests answered, {failed} failed, {} certificates seen in {seconds}s, Envoy never restarted",
        serials.len()
    );
    if failed > 0 {
        std::process::exit(1);
    }
}
