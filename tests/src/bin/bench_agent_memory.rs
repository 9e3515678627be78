//! Resident memory of pilot-agent with the Envoy it launched (Istio's
//! bootstrap, SDS over the workload socket): once the certificate is served
//! and the agent is idle, and across ten certificate rotations (each one a new
//! key, a CSR to istiod and an SDS push to Envoy). Envoy's and istiod's memory
//! are read in the same run as context. Each Pod runs in a network namespace of
//! its own, as in `tests/tests/identity.rs` (needs root and iproute2).
//!
//! `AGENT_BASELINE=<path to another pilot-agent build>` runs the same scenario
//! with that binary first, so a before/after pair is measured in one run on
//! the same machine; the ratio is printed. `ROTATIONS` (default 10) and
//! `SECRET_TTL` (default `30s`: a rotation every ~15 s, longer than the 5 s
//! the agent waits before releasing memory) set the rotation phase.
//!
//! `cargo build --release --workspace --bins && target/release/bench_agent_memory`:
//! the binaries are taken from the directory this program runs from. Prints a
//! table and, for each agent, where its resident pages are (`/proc/<pid>/smaps`);
//! asserts nothing about size.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tests::netns::Netns;
use tests::{Istiod, Pod, PodDir, wait_for};

const SLEEP_ID: &str = "spiffe://cluster.local/ns/default/sa/sleep";
/// How long the agent is left alone before the idle reading.
const SETTLE: Duration = Duration::from_secs(10);
/// The rotation phase gives up after this long.
const ROTATION_LIMIT: Duration = Duration::from_secs(240);

/// What `/proc/<pid>/status` says about a process's memory, in KiB.
#[derive(Clone, Copy)]
struct Mem {
    rss_kib: u64,
    hwm_kib: u64,
    /// Anonymous pages: the process's own (heap, stacks, buffers).
    anon_kib: u64,
    /// File-backed pages: the binary's and libraries' pages it touched,
    /// shared with every process mapping the same files.
    file_kib: u64,
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
        anon_kib: field("RssAnon:"),
        file_kib: field("RssFile:"),
        threads: field("Threads:"),
    }
}

/// Resident KiB by kind of mapping, from `/proc/<pid>/smaps`.
fn breakdown(pid: u32) -> BTreeMap<&'static str, u64> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let exe = exe.to_string_lossy().into_owned();
    let mut out = BTreeMap::new();
    let mut kind = "";
    for line in smaps.lines() {
        let mut parts = line.split_whitespace();
        let first = parts.next().unwrap_or_default();
        if let Some((lo, hi)) = first.split_once('-')
            && let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16))
        {
            let perms = parts.next().unwrap_or_default();
            let path = parts.nth(3).unwrap_or_default();
            let size_kib = (hi - lo) / 1024;
            kind = match path {
                p if p == exe && perms.contains('x') => "binary: code",
                p if p == exe && perms.contains('w') => "binary: data",
                p if p == exe => "binary: read-only data",
                p if p.contains(".so") => "shared libraries",
                "[heap]" => "anonymous: main heap",
                "[stack]" => "anonymous: main thread stack",
                "" if size_kib == 2048 || size_kib == 2052 => "anonymous: thread stacks (2 MiB)",
                "" => "anonymous: other (thread arenas, mmap'd buffers)",
                _ => "other",
            };
            continue;
        }
        if first == "Rss:" {
            let kib: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            *out.entry(kind).or_insert(0) += kib;
        }
    }
    out
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

/// One agent's figures.
struct Run {
    label: String,
    idle: Mem,
    rotated: Mem,
    rotations: usize,
    /// VmRSS sampled every 200 ms across the rotations: min, median, max.
    rotating_kib: [u64; 3],
    rotation_time: Duration,
    envoy: Mem,
    istiod: Mem,
    idle_breakdown: BTreeMap<&'static str, u64>,
    rotated_breakdown: BTreeMap<&'static str, u64>,
}

fn run(label: &str, agent: &Path, rotations: usize, ttl: &str) -> Run {
    let tmp = tempfile::Builder::new()
        .prefix("bench-agent-memory.")
        .tempdir()
        .unwrap();
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
    // Istio's default key (RSA 2048); a short certificate life, so the agent
    // rotates at half of it.
    let mut pod = Pod::start_with_agent(
        ns,
        dir,
        &[
            ("POD_NAME", "sleep-1"),
            ("POD_NAMESPACE", "default"),
            ("SERVICE_ACCOUNT", "sleep"),
            ("CA_ADDR", &ca),
            ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
            ("SECRET_TTL", ttl),
        ],
        agent,
    );
    let first = pod.wait_served(&root, SLEEP_ID, Duration::from_secs(60));
    let envoy_pid = wait_for("the agent's Envoy", Duration::from_secs(10), || {
        pod.envoy_pid()
    });
    let agent_pid = pod.agent.pid();
    for (name, pid) in [
        ("pilot-agent", agent_pid),
        ("envoy", envoy_pid),
        ("istiod", istiod.proc.pid()),
    ] {
        // `ip netns exec` execs the program, so the pid is the program's own.
        assert!(
            comm(pid).starts_with(name),
            "pid {pid} is {:?}, not {name}",
            comm(pid)
        );
    }
    std::thread::sleep(SETTLE);
    let idle = mem(agent_pid);
    let idle_breakdown = breakdown(agent_pid);

    // Rotations: each new serial Envoy presents is one.
    let mut serials = BTreeSet::from([first.serial]);
    let mut samples = Vec::new();
    let start = Instant::now();
    while serials.len() <= rotations && start.elapsed() < ROTATION_LIMIT {
        if let Ok((info, _)) = pod.probe(&root, Some(SLEEP_ID)) {
            serials.insert(info.serial);
        }
        samples.push(mem(agent_pid).rss_kib);
        std::thread::sleep(Duration::from_millis(200));
    }
    samples.sort_unstable();
    let rotation_time = start.elapsed();
    let rotated = mem(agent_pid);
    let rotated_breakdown = breakdown(agent_pid);
    assert!(
        pod.agent.alive() && pod.envoy_pid() == Some(envoy_pid),
        "the agent or its Envoy exited during the run"
    );
    Run {
        label: label.to_string(),
        idle,
        rotated,
        rotations: serials.len() - 1,
        rotating_kib: [
            samples.first().copied().unwrap_or(0),
            samples.get(samples.len() / 2).copied().unwrap_or(0),
            samples.last().copied().unwrap_or(0),
        ],
        rotation_time,
        envoy: mem(envoy_pid),
        istiod: mem(istiod.proc.pid()),
        idle_breakdown,
        rotated_breakdown,
    }
}

fn print_breakdown(r: &Run) {
    println!();
    println!(
        "{}: resident pages by mapping (idle / after rotations)",
        r.label
    );
    let kinds: BTreeSet<_> = r
        .idle_breakdown
        .keys()
        .chain(r.rotated_breakdown.keys())
        .collect();
    for k in kinds {
        println!(
            "  {:<52} {:>9} {:>9}",
            k,
            mib(r.idle_breakdown.get(k).copied().unwrap_or(0)),
            mib(r.rotated_breakdown.get(k).copied().unwrap_or(0))
        );
    }
}

fn main() {
    let rotations: usize = std::env::var("ROTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let ttl = std::env::var("SECRET_TTL").unwrap_or_else(|_| "30s".into());
    let profile = std::env::current_exe()
        .ok()
        .and_then(|p| {
            p.parent()?
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    let load_before = loadavg();
    let mut agents: Vec<(String, PathBuf)> = Vec::new();
    if let Ok(base) = std::env::var("AGENT_BASELINE") {
        agents.push(("baseline".into(), PathBuf::from(base)));
    }
    agents.push(("current".into(), tests::bin("pilot-agent")));
    let runs: Vec<Run> = agents
        .iter()
        .map(|(label, path)| run(label, path, rotations, &ttl))
        .collect();

    println!();
    println!(
        "Resident memory from /proc/<pid>/status, {profile} build, {} CPUs, load average before {load_before}, after {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        loadavg()
    );
    for ((label, path), r) in agents.iter().zip(&runs) {
        println!(
            "{label}: {} ({} rotations of a {ttl} certificate in {:.0} s)",
            path.display(),
            r.rotations,
            r.rotation_time.as_secs_f64()
        );
    }
    println!();
    println!(
        "{:<10} {:>11} {:>11} {:>17} {:>7}  {:>11} {:>11} {:>17} {:>7}  {:>11} {:>11}",
        "agent",
        "idle RSS",
        "idle HWM",
        "anon + file",
        "threads",
        "rotated RSS",
        "rotated HWM",
        "anon + file",
        "threads",
        "Envoy RSS",
        "istiod RSS"
    );
    for r in &runs {
        println!(
            "{:<10} {:>11} {:>11} {:>17} {:>7}  {:>11} {:>11} {:>17} {:>7}  {:>11} {:>11}",
            r.label,
            mib(r.idle.rss_kib),
            mib(r.idle.hwm_kib),
            format!("{} + {}", mib(r.idle.anon_kib), mib(r.idle.file_kib)),
            r.idle.threads,
            mib(r.rotated.rss_kib),
            mib(r.rotated.hwm_kib),
            format!("{} + {}", mib(r.rotated.anon_kib), mib(r.rotated.file_kib)),
            r.rotated.threads,
            mib(r.envoy.rss_kib),
            mib(r.istiod.rss_kib)
        );
    }
    println!();
    for r in &runs {
        let [lo, mid, hi] = r.rotating_kib;
        println!(
            "{}: VmRSS across the rotations min {} / median {} / max {}",
            r.label,
            mib(lo),
            mib(mid),
            mib(hi)
        );
    }
    for r in &runs {
        print_breakdown(r);
    }
    if let [base, cur] = &runs[..] {
        let ratio = |a: u64, b: u64| a as f64 / b as f64;
        println!();
        println!(
            "current / baseline: idle RSS {:.2} (anon {:.2}), idle HWM {:.2}, rotated RSS {:.2}, rotated HWM {:.2}",
            ratio(cur.idle.rss_kib, base.idle.rss_kib),
            ratio(cur.idle.anon_kib, base.idle.anon_kib),
            ratio(cur.idle.hwm_kib, base.idle.hwm_kib),
            ratio(cur.rotated.rss_kib, base.rotated.rss_kib),
            ratio(cur.rotated.hwm_kib, base.rotated.hwm_kib)
        );
    }
    if runs.iter().any(|r| r.rotations < rotations) {
        eprintln!("fewer rotations than asked were seen");
        std::process::exit(1);
    }
}
