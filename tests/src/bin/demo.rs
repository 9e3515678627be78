//! The local mesh demo (the README's first command): istiod on the sample
//! config, three Pods (sleep, httpbin v1 and v2) each with pilot-agent and a
//! real Envoy in a network namespace of its own, captured by Istio's
//! iptables rules as `istio-init` writes them; sleep's app (curl, as an
//! ordinary user) calls `http://httpbin:8000/` as if there were no mesh, and
//! both Envoys carry it over mutual TLS. A summary says what happened.
//!
//! `--seconds N` sets how long requests flow (default 20); `--keep` leaves
//! the mesh running until Ctrl-C so the config directory can be edited live.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tests::mesh::LocalMesh;

fn field<'a>(body: &'a str, key: &str) -> &'a str {
    body.lines().find_map(|l| l.strip_prefix(key)).unwrap_or("")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds: u64 = args
        .iter()
        .skip_while(|a| *a != "--seconds")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let keep = args.iter().any(|a| a == "--keep");
    // Ctrl-C ends the request loop, so the Pods and namespaces are cleaned up.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let _ = tokio::signal::ctrl_c().await;
            });
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
        });
    }
    let tmp = tempfile::Builder::new()
        .prefix("mesh-demo.")
        .tempdir()
        .unwrap();
    println!("Starting the local mesh in {} ...", tmp.path().display());
    let mesh = LocalMesh::start(tmp.path(), &[("SECRET_TTL", "1h")]);
    println!(
        "istiod: hub namespace {}, config from {}",
        mesh.hub.ns.name,
        mesh.config_dir.display()
    );
    for (name, net, dir, agent) in &mesh.pods {
        println!(
            "  Pod {name:<11} {:<11} pilot-agent pid {} (Envoy bootstrap {})",
            net.ip,
            agent.pid(),
            dir.dir.join("etc/istio/proxy/envoy-rev.json").display()
        );
    }
    let rules = mesh
        .pod("sleep-1")
        .iptables_save()
        .lines()
        .filter(|l| l.starts_with("-A ISTIO_") || l.contains("-j ISTIO_"))
        .count();
    println!(
        "  each Pod: `pilot-agent istio-iptables` wrote Istio's rules ({rules} in sleep-1); pilot-agent and Envoy run as uid 1337, sleep's curl as uid 1000"
    );
    if keep {
        println!(
            "Edit {} to change the split; Ctrl-C to stop.",
            mesh.config_dir.join("istio.yaml").display()
        );
    }
    println!(
        "sleep-1's app runs `curl http://httpbin:8000/headers` for {seconds}s (VirtualService: 90% v1, 10% v2) ..."
    );

    let mut by_version: BTreeMap<String, usize> = BTreeMap::new();
    let mut client_ids = BTreeMap::new();
    let mut server_ids = BTreeMap::new();
    let mut failed = 0usize;
    let mut window: BTreeMap<String, usize> = BTreeMap::new();
    let start = Instant::now();
    let mut last_report = Instant::now();
    while (start.elapsed() < Duration::from_secs(seconds) || keep)
        && !stop.load(std::sync::atomic::Ordering::SeqCst)
    {
        match mesh.app_curl("sleep-1", "http://httpbin:8000/headers") {
            Ok((200, body)) => {
                let v = field(&body, "version=").to_string();
                *by_version.entry(v.clone()).or_default() += 1;
                *window.entry(v).or_default() += 1;
                let xfcc = field(&body, "xfcc=");
                for part in xfcc.split(';') {
                    if let Some(uri) = part.strip_prefix("URI=") {
                        *client_ids.entry(uri.to_string()).or_insert(0) += 1;
                    }
                    if let Some(by) = part.strip_prefix("By=") {
                        *server_ids.entry(by.to_string()).or_insert(0) += 1;
                    }
                }
            }
            Ok(_) | Err(_) => failed += 1,
        }
        if last_report.elapsed() >= Duration::from_secs(5) {
            println!(
                "  t={:>3}s  last 5s: {:?}",
                start.elapsed().as_secs(),
                window
            );
            window.clear();
            last_report = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let total: usize = by_version.values().sum();
    println!("\nSummary");
    println!("  requests answered: {total}, failed: {failed}");
    for (v, n) in &by_version {
        println!(
            "  httpbin {v}: {n} ({:.1}%)",
            *n as f64 * 100.0 / total.max(1) as f64
        );
    }
    for (id, n) in &client_ids {
        println!("  client identity as the server saw it (XFCC URI): {id} ({n} requests)");
    }
    for (id, n) in &server_ids {
        println!("  server identity as its sidecar presented it (XFCC By): {id} ({n} requests)");
    }
    println!(
        "\nTo watch the split change live: run `scripts/demo.sh --keep`, then edit the weights in\n  {} (VirtualService httpbin) while it runs; istiod pushes the change within a second. Ctrl-C stops it.",
        mesh.config_dir.join("istio.yaml").display()
    );
    if failed > 0 || total == 0 {
        std::process::exit(1);
    }
}
