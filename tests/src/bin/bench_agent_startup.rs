//! Time from start to a configured, live Envoy and resident memory: Envoy
//! launched by pilot-agent (bootstrap written by the agent, xDS through the
//! agent's proxy) against the same Envoy started directly with the same
//! bootstrap and an ADS server on its XDS socket, in the same run. Each start
//! is a fresh Pod network namespace (needs root and iproute2).
//!
//! `cargo build --release --workspace --bins && target/release/bench_agent_startup [rounds]`.
//! Prints a table; asserts nothing about speed.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tests::netns::Netns;
use tests::{PodDir, Proc, envoy_bin, http_get, wait_for};

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

/// Envoy is LIVE and has CDS and LDS: what the agent's readiness waits for.
fn envoy_configured(ns: &Netns) -> bool {
    let stats = ns.run(|| http_get(SocketAddr::from(([127, 0, 0, 1], 15000)), "/stats?filter=^(server.state|cluster_manager.cds.update_success|listener_manager.lds.update_success)$").ok());
    let Some((200, body)) = stats else {
        return false;
    };
    let get = |name: &str| {
        body.lines().find_map(|l| {
            l.strip_prefix(&format!("{name}: "))?
                .trim()
                .parse::<u64>()
                .ok()
        })
    };
    get("server.state") == Some(0)
        && get("cluster_manager.cds.update_success").is_some_and(|v| v > 0)
        && get("listener_manager.lds.update_success").is_some_and(|v| v > 0)
}

fn envoy_child(agent: u32) -> Option<u32> {
    let out = std::process::Command::new("pgrep")
        .args(["-P", &agent.to_string()])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

struct Sample {
    ready: Duration,
    agent_kib: u64,
    envoy_kib: u64,
}

fn via_agent(rt: &tokio::runtime::Runtime) -> (Sample, String) {
    let tmp = tempfile::tempdir().unwrap();
    let ns = Netns::new("bench");
    let dir = PodDir::new(tmp.path(), "", None);
    let listener =
        ns.run(|| std::net::TcpListener::bind(("127.0.0.1", tests::ads::ADS_PORT)).unwrap());
    rt.block_on(async {
        tests::ads::serve_tcp(listener, tests::ads::inbound_http(8000, 8080)).unwrap()
    });
    let start = Instant::now();
    let agent = dir.start_agent_with(
        &ns,
        &[
            ("POD_NAME", "bench-1"),
            ("POD_NAMESPACE", "default"),
            ("SERVICE_ACCOUNT", "bench"),
            ("INSTANCE_IP", "127.0.0.1"),
            ("CA_ADDR", "127.0.0.1:1"),
        ],
        tests::ads::PROXY_CONFIG_FIELDS,
    );
    wait_for("Envoy configured (agent)", Duration::from_secs(60), || {
        envoy_configured(&ns).then_some(())
    });
    let ready = start.elapsed();
    let envoy = envoy_child(agent.pid()).unwrap();
    let sample = Sample {
        ready,
        agent_kib: rss_kib(agent.pid()),
        envoy_kib: rss_kib(envoy),
    };
    let bootstrap =
        std::fs::read_to_string(dir.dir.join("etc/istio/proxy/envoy-rev.json")).unwrap();
    drop(agent);
    (sample, bootstrap)
}

fn direct(rt: &tokio::runtime::Runtime, bootstrap: &str) -> Sample {
    let tmp = tempfile::tempdir().unwrap();
    let ns = Netns::new("bench");
    let conf = tmp.path().join("etc/istio/proxy");
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(conf.join("envoy-rev.json"), bootstrap).unwrap();
    rt.block_on(async {
        tests::ads::serve_uds(&conf.join("XDS"), tests::ads::inbound_http(8000, 8080)).unwrap()
    });
    let start = Instant::now();
    let mut cmd = ns.command(envoy_bin());
    cmd.current_dir(tmp.path()).args([
        "-c",
        "./etc/istio/proxy/envoy-rev.json",
        "--drain-time-s",
        "45",
        "--drain-strategy",
        "immediate",
        "--local-address-ip-version",
        "v4",
        "--file-flush-interval-msec",
        "1000",
        "--disable-hot-restart",
        "--allow-unknown-static-fields",
        "-l",
        "warning",
        "--skip-deprecated-logs",
        "--concurrency",
        "1",
    ]);
    let envoy = Proc::spawn("envoy", cmd, &tmp.path().join("envoy.log"));
    wait_for("Envoy configured (direct)", Duration::from_secs(60), || {
        envoy_configured(&ns).then_some(())
    });
    Sample {
        ready: start.elapsed(),
        agent_kib: 0,
        envoy_kib: rss_kib(envoy.pid()),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
        .clamp(1, 20);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (mut agent_s, mut direct_s) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (a, bootstrap) = via_agent(&rt);
        // The agent's own bootstrap, minus nothing: the same file Envoy read.
        let d = direct(&rt, &bootstrap);
        agent_s.push(a);
        direct_s.push(d);
    }
    let ms = |v: &[Sample]| median(v.iter().map(|s| s.ready.as_secs_f64() * 1000.0).collect());
    let kib = |v: Vec<u64>| median(v.into_iter().map(|x| x as f64).collect()) / 1024.0;
    let (ta, td) = (ms(&agent_s), ms(&direct_s));
    println!("rounds: {rounds} (median)");
    println!("{:<44} {:>10} {:>12}", "", "ready ms", "RSS MiB");
    println!(
        "{:<44} {:>10.0} {:>12.1}",
        "Envoy started directly (baseline)",
        td,
        kib(direct_s.iter().map(|s| s.envoy_kib).collect())
    );
    println!(
        "{:<44} {:>10.0} {:>12.1}",
        "Envoy started by pilot-agent",
        ta,
        kib(agent_s.iter().map(|s| s.envoy_kib).collect())
    );
    println!(
        "{:<44} {:>10} {:>12.1}",
        "pilot-agent itself",
        "",
        kib(agent_s.iter().map(|s| s.agent_kib).collect())
    );
    println!(
        "ratio: time to ready via the agent / direct = {:.2}",
        ta / td
    );
    println!(
        "ratio: (agent + its Envoy) RSS / direct Envoy RSS = {:.2}",
        (kib(agent_s.iter().map(|s| s.agent_kib).collect())
            + kib(agent_s.iter().map(|s| s.envoy_kib).collect()))
            / kib(direct_s.iter().map(|s| s.envoy_kib).collect())
    );
}
