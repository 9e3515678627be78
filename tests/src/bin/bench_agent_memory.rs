//! Resident memory of pilot-agent once it serves the workload certificate to
//! the Envoy it launched (Istio's bootstrap, SDS over the workload socket),
//! with Envoy's and istiod's read in the same run as baselines, and again after
//! a few seconds of TLS requests to Envoy. The Pod runs in a network namespace
//! of its own, as in `tests/tests/identity.rs` (needs root and iproute2).
//!
//! `cargo build --workspace --bins && target/debug/bench_agent_memory` (or the
//! same with `--release` and `target/release/`): the binaries are taken from the
//! directory this program runs from. Prints a table; asserts nothing about size.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use tests::netns::Netns;
use tests::{Istiod, Pod, PodDir, wait_for};

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

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_string())
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

    let ns = Netns::new("bench");
    let istiod = Istiod::start_in(
        &ns,
        &tmp.path().join("istiod"),
        &[("ISTIOD_CUSTOM_HOST", "127.0.0.1")],
    );
    let root = istiod.root_pem();
    let dir = PodDir::new(
        &tmp.path().join("pod"),
        &istiod.token("default", "sleep"),
        Some(&root),
    );
    let ca = istiod.grpc.to_string();
    // Istio's defaults: an RSA 2048 workload key, 24 h certificates (no rotation here).
    let mut pod = Pod::start(
        ns,
        dir,
        &[
            ("POD_NAME", "sleep-1"),
            ("POD_NAMESPACE", "default"),
            ("SERVICE_ACCOUNT", "sleep"),
            ("CA_ADDR", &ca),
            ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
        ],
    );

    let started = Instant::now();
    pod.wait_served(&root, SLEEP_ID, Duration::from_secs(60));
    let served_after = started.elapsed();
    let envoy_pid = wait_for("the agent's Envoy", Duration::from_secs(10), || {
        pod.envoy_pid()
    });
    let pids = [
        ("pilot-agent", pod.agent.pid()),
        ("envoy", envoy_pid),
        ("istiod", istiod.proc.pid()),
    ];
    for (name, pid) in pids {
        // `ip netns exec` execs the program, so the pid is the program's own.
        assert!(
            comm(pid).starts_with(name),
            "pid {pid} is {:?}, not {name}",
            comm(pid)
        );
    }
    let serving: Vec<Mem> = pids.iter().map(|(_, pid)| mem(*pid)).collect();

    // A steady loop of TLS requests (a new connection each) to Envoy's listener.
    let (mut ok, mut failed, mut first_error) = (0usize, 0usize, None);
    let loop_start = Instant::now();
    while loop_start.elapsed() < LOOP_TIME && ok + failed < LOOP_MAX {
        match pod.probe(&root, Some(SLEEP_ID)) {
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
        pod.agent.alive() && pod.envoy_pid() == Some(envoy_pid),
        "the agent or its Envoy exited during the run"
    );

    println!();
    println!(
        "Resident memory from /proc/<pid>/status, {profile} build, {} CPUs, load average before {load_before}, after {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        loadavg()
    );
    println!(
        "Envoy served the certificate {:.1} s after the agent started; then {ok} TLS requests in {:.1} s ({failed} failed)",
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
