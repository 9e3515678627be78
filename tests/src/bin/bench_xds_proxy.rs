//! The agent's xDS proxy overhead: time and bytes for Envoy to receive its
//! configuration from istiod (the sample mesh) through pilot-agent's proxy
//! (TLS to `:15012`), against the same Envoy with the same bootstrap connected
//! straight to istiod's plaintext `:15010`, in the same run; and the agent's
//! resident memory under a steady request stream in the local mesh.
//!
//! `cargo build --release --workspace --bins && target/release/bench_xds_proxy [rounds]`
//! (needs root and iproute2). Prints a table; asserts nothing about speed.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tests::mesh::{HUB_IP, Hub, LocalMesh};
use tests::netns::Netns;
use tests::{Istiod, PodDir, Proc, envoy_bin, http_get, wait_for};

fn stats(ns: &Netns) -> Option<String> {
    ns.run(|| http_get(SocketAddr::from(([127, 0, 0, 1], 15000)), "/stats").ok())
        .filter(|(c, _)| *c == 200)
        .map(|(_, b)| b)
}

fn stat(body: &str, name: &str) -> Option<u64> {
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: "))?.trim().parse().ok())
}

/// Waits until Envoy has CDS and LDS; returns the time and the bytes its
/// xDS connection received once the configuration settled.
fn configured(ns: &Netns, start: Instant) -> (Duration, u64) {
    let t = wait_for("Envoy configured", Duration::from_secs(60), || {
        let s = stats(ns)?;
        (stat(&s, "cluster_manager.cds.update_success")? > 0
            && stat(&s, "listener_manager.lds.update_success")? > 0)
            .then(|| start.elapsed())
    });
    std::thread::sleep(Duration::from_secs(1));
    let bytes = stats(ns)
        .and_then(|s| stat(&s, "cluster.xds-grpc;.upstream_cx_rx_bytes_total"))
        .unwrap_or(0);
    (t, bytes)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .clamp(1, 10);
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config");
    std::fs::create_dir_all(&config).unwrap();
    let sample = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../istiod/samples/mesh");
    for e in std::fs::read_dir(&sample).unwrap().flatten() {
        std::fs::copy(e.path(), config.join(e.file_name())).unwrap();
    }
    let hub = Hub::new();
    let istiod = Istiod::start_hub_plaintext(&hub.ns, &tmp.path().join("istiod"), &config);
    let root = istiod.root_pem();
    let (mut via_t, mut via_b, mut direct_t, mut direct_b) = (vec![], vec![], vec![], vec![]);
    for round in 0..rounds {
        // Through the agent. Each Pod gets an address of its own (a reused
        // address would wait for istiod's ARP entry to expire); INSTANCE_IP
        // stays sleep-1's, so the configuration is sleep-1's.
        let net = hub.pod("pod", &format!("198.18.1.{}", round + 2));
        let dir = PodDir::new(
            &tmp.path().join(format!("via-{round}")),
            &istiod.token("demo", "sleep"),
            Some(&root),
        );
        dir.write_labels(&[("app", "sleep"), ("version", "v1")]);
        let start = Instant::now();
        let agent = dir.start_agent_with(
            &net.ns,
            &[
                ("POD_NAME", "sleep-1"),
                ("POD_NAMESPACE", "demo"),
                ("SERVICE_ACCOUNT", "sleep"),
                ("INSTANCE_IP", "198.18.0.2"),
            ],
            r#""statusPort": 15020"#,
        );
        let (t, b) = configured(&net.ns, start);
        via_t.push(t.as_secs_f64() * 1000.0);
        via_b.push(b as f64);
        let bootstrap =
            std::fs::read_to_string(dir.dir.join("etc/istio/proxy/envoy-rev.json")).unwrap();

        // Straight to istiod's plaintext port, same bootstrap otherwise.
        let mut json: serde_json::Value = serde_json::from_str(&bootstrap).unwrap();
        for c in json["static_resources"]["clusters"].as_array_mut().unwrap() {
            if c["name"] == "xds-grpc" {
                c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] =
                    serde_json::json!({"socket_address": {"address": HUB_IP, "port_value": 15010}});
            }
            // Certificates still come from an agent's SDS (the first Pod's, still
            // running), so both Envoys warm the same ISTIO_MUTUAL clusters.
            if c["name"] == "sds-grpc" {
                c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] =
                    serde_json::json!({"pipe": {"path": dir.sds_socket().display().to_string()}});
            }
        }
        let via_net = net;
        let net = hub.pod("pod", &format!("198.18.2.{}", round + 2));
        let ddir = tmp.path().join(format!("direct-{round}"));
        std::fs::create_dir_all(&ddir).unwrap();
        std::fs::write(ddir.join("envoy.json"), json.to_string()).unwrap();
        let mut cmd = net.ns.command(envoy_bin());
        cmd.current_dir(&ddir).args([
            "-c",
            "envoy.json",
            "--drain-time-s",
            "45",
            "--drain-strategy",
            "immediate",
            "--local-address-ip-version",
            "v4",
            "--disable-hot-restart",
            "--allow-unknown-static-fields",
            "-l",
            "warning",
            "--concurrency",
            "1",
        ]);
        let start = Instant::now();
        let envoy = Proc::spawn("envoy", cmd, &ddir.join("envoy.log"));
        let (t, b) = configured(&net.ns, start);
        direct_t.push(t.as_secs_f64() * 1000.0);
        direct_b.push(b as f64);
        drop(envoy);
        drop(net);
        drop(agent);
        drop(via_net);
    }
    drop(istiod);
    drop(hub);
    let (vt, dt, vb, db) = (
        median(via_t),
        median(direct_t),
        median(via_b),
        median(direct_b),
    );
    println!("rounds: {rounds} (median); the sample mesh, sleep-1's configuration");
    println!("{:<46} {:>9} {:>14}", "", "time ms", "bytes received");
    println!(
        "{:<46} {:>9.0} {:>14.0}",
        "Envoy -> istiod :15010 directly (baseline)", dt, db
    );
    println!(
        "{:<46} {:>9.0} {:>14.0}",
        "Envoy -> pilot-agent xDS proxy -> :15012 TLS", vt, vb
    );
    println!(
        "ratio via proxy / direct: time {:.2}, bytes {:.2}",
        vt / dt,
        vb / db
    );

    // The agent's memory under a steady request stream in the local mesh.
    let mtmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(mtmp.path(), &[]);
    let sleep_agent = mesh.pods.iter().find(|p| p.0 == "sleep-1").unwrap();
    let agent_pid = sleep_agent.3.pid();
    let envoy_pid: u32 = String::from_utf8_lossy(
        &std::process::Command::new("pgrep")
            .args(["-P", &agent_pid.to_string()])
            .output()
            .unwrap()
            .stdout,
    )
    .lines()
    .next()
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    let before = rss_kib(agent_pid);
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < Duration::from_secs(10) && n < 5000 {
        if mesh.call_httpbin().is_ok() {
            n += 1;
        }
    }
    println!(
        "agent RSS under a steady stream ({n} requests in 10 s): {:.1} MiB before, {:.1} MiB after; its Envoy (baseline): {:.1} MiB",
        before as f64 / 1024.0,
        rss_kib(agent_pid) as f64 / 1024.0,
        rss_kib(envoy_pid) as f64 / 1024.0
    );
}
