//! Resident memory of pilot-agent once it serves the workload certificate to a
//! real Envoy over SDS, with Envoy's and istiod's read in the same run as
//! baselines, and again after a few seconds of TLS requests to Envoy.
//!
//! `cargo build --workspace --bins && target/debug/bench_agent_memory` (or the
//! same with `--release` and `target/release/`): the binaries are taken from the
//! directory this program runs from. Prints a table; asserts nothing about size.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tests::envoy::{listener_port, sds_tls_bootstrap};
use tests::{Envoy, Istiod, PodDir, tls, wait_for};

const SLEEP_ID: &str = "spiffe://cluster.local/ns/default/sa/sleep";
/// How long the request loop runs.
const LOOP_TIME: Duration = Duration::from_secs(5);
/// The request loop stops here even if `LOOP_TIME` has not passed.
const LOOP_MAX: usize = 5000;

/// What `/proc/<pid>/status` says about a process's memory, in KiB.
struct Mem {
    rss_kib: u64,
    hwm_kib: u64,
    threads: u64,
}

fn mem(pid: u32) -> Mem {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    Mem {
        rss_kib: field("VmRSS:"),
        hwm_kib: field("VmHWM:"),
        threads: field("Threads:"),
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let tmp = tempfile::Builder::new()
        .prefix("bench-agent-memory.")
        .tempdir()
        .unwrap();
    let profile = std::env::current_exe()
        .ok()
        .and_then(|p| {
            p.parent()?
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    let load_before = loadavg();

    let istiod = Istiod::start(
        &tmp.path().join("istiod"),
        &[("ISTIOD_CUSTOM_HOST", "127.0.0.1")],
    );
    let root = istiod.root_pem();
    let pod = PodDir::new(
        &tmp.path().join("pod"),
        &istiod.token("default", "sleep"),
        Some(&root),
    );
    let ca = istiod.grpc.to_string();
    // Istio's defaults: an RSA 2048 workload key, 24 h certificates (no rotation here).
    let mut agent = pod.start_agent(&[
        ("POD_NAME", "sleep-1"),
        ("POD_NAMESPACE", "default"),
        ("SERVICE_ACCOUNT", "sleep"),
        ("CA_ADDR", &ca),
        ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
    ]);
    let port = listener_port();
    let mut envoy = Envoy::start(&pod.dir, &sds_tls_bootstrap(port, &pod.sds_socket()));
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();

    let started = Instant::now();
    wait_for(
        "Envoy to serve the workload certificate",
        Duration::from_secs(60),
        || tls::probe(addr, &root, Some(SLEEP_ID)).ok(),
    );
    let served_after = started.elapsed();
    let pids = [
        ("pilot-agent", agent.pid()),
        ("envoy", envoy.proc.pid()),
        ("istiod", istiod.proc.pid()),
    ];
    let serving: Vec<Mem> = pids.iter().map(|(_, pid)| mem(*pid)).collect();

    // A steady loop of TLS requests (a new connection each) to Envoy's listener.
    let (mut ok, mut failed, mut first_error) = (0usize, 0usize, None);
    let loop_start = Instant::now();
    while loop_start.elapsed() < LOOP_TIME && ok + failed < LOOP_MAX {
        match tls::probe(addr, &root, Some(SLEEP_ID)) {
            Ok((_, body)) if body.ends_with("hello") => ok += 1,
            Ok((_, body)) => {
                failed += 1;
                first_error.get_or_insert(format!("unexpected body {body:?}"));
            }
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    let loop_time = loop_start.elapsed();
    let after: Vec<Mem> = pids.iter().map(|(_, pid)| mem(*pid)).collect();
    assert!(
        agent.alive() && envoy.proc.alive(),
        "a process exited during the run"
    );

    println!();
    println!(
        "Resident memory from /proc/<pid>/status, {profile} build, {} CPUs, load average before {load_before}, after {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        loadavg()
    );
    println!(
        "Envoy served the certificate {:.1} s after it started; then {ok} TLS requests in {:.1} s ({failed} failed)",
        served_after.as_secs_f64(),
        loop_time.as_secs_f64()
    );
    if let Some(e) = first_error {
        println!("first failure: {e}");
    }
    println!();
    println!(
        "{:<12} {:>8}  {:>11} {:>11} {:>7}  {:>11} {:>11} {:>7}",
        "", "", "serving SDS", "", "", "after loop", "", ""
    );
    println!(
        "{:<12} {:>8}  {:>11} {:>11} {:>7}  {:>11} {:>11} {:>7}",
        "process", "pid", "VmRSS", "VmHWM", "threads", "VmRSS", "VmHWM", "threads"
    );
    for (((name, pid), s), a) in pids.iter().zip(&serving).zip(&after) {
        println!(
            "{:<12} {:>8}  {:>11} {:>11} {:>7}  {:>11} {:>11} {:>7}",
            name,
            pid,
            mib(s.rss_kib),
            mib(s.hwm_kib),
            s.threads,
            mib(a.rss_kib),
            mib(a.hwm_kib),
            a.threads
        );
    }
    let ratio = |i: usize| serving[0].rss_kib as f64 / serving[i].rss_kib as f64;
    println!();
    println!(
        "pilot-agent VmRSS while serving SDS = {:.2} x Envoy's, {:.2} x istiod's",
        ratio(1),
        ratio(2)
    );
    if failed > 0 {
        std::process::exit(1);
    }
}
