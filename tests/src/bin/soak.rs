//! The soak: the local mesh (istiod, `sleep-1`, `httpbin-v1`, `httpbin-v2`
//! with real Envoys and Istio's iptables capture) under steady traffic from
//! sleep to httpbin, with workload certificates rotating every 10 s
//! (`SECRET_TTL` 20 s, rotated at `SECRET_GRACE_PERIOD_RATIO` 0.5 of their
//! life) and the VirtualService's weights edited every 20 s (alternately
//! 10/90 and 90/10, written whole and renamed into place). Rotations are
//! counted from the serial numbers each Envoy's admin `/certs` shows; each
//! edit is checked in sleep's Envoy route configuration (`/config_dump`).
//!
//! Prints the duration, requests sent and failed (the first few failures),
//! rotations and edits, and the resident memory (VmRSS) of istiod, each agent
//! and each Envoy after the warm-up and at the end, with growth. Exits
//! non-zero if any request failed, an edit never reached Envoy, a Pod saw no
//! rotation, or istiod's or an agent's RSS grew by 5 % or more.
//!
//! `cargo build --workspace --bins && flock /tmp/mesh-e2e.lock target/debug/soak [FLAGS]`
//! (as root: network namespaces and iptables). Flags, each a duration such
//! as `90s`, `2m`, `1h`:
//!
//! - `--duration D`: traffic after the warm-up (default `30m`);
//! - `--warmup D`: traffic before the start RSS reading (default `2m`);
//! - `--pace D`: at most one request per `D` (default `50ms`);
//! - `--secret-ttl D`: the agents' `SECRET_TTL` (default `20s`);
//! - `--edit-every D`: time between weight edits (default `20s`).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tests::soak::{SoakConfig, run};

/// The RSS growth, in percent, at which the soak fails.
const RSS_LIMIT_PCT: f64 = 5.0;

fn parse_args(cfg: &mut SoakConfig) -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let d: Duration =
            common::duration::parse(value).map_err(|e| format!("{flag} {value}: {e}"))?;
        match flag.as_str() {
            "--duration" => cfg.duration = d,
            "--warmup" => cfg.warmup = d,
            "--pace" => cfg.pace = d,
            "--secret-ttl" => cfg.secret_ttl = d,
            "--edit-every" => cfg.edit_every = d,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(())
}

fn main() {
    let tmp = tempfile::Builder::new().prefix("soak").tempdir().unwrap();
    let mut cfg = SoakConfig::new(tmp.path().to_path_buf());
    if let Err(e) = parse_args(&mut cfg) {
        eprintln!(
            "soak: {e}\nflags: --duration --warmup --pace --secret-ttl --edit-every (durations)"
        );
        std::process::exit(2);
    }
    let started = time::OffsetDateTime::now_utc();
    let load_start = tests::load::machine_load();
    println!("soak started {started} UTC; machine load {load_start}");
    let report = run(cfg, |line| eprintln!("soak: {line}"));
    let load_end = tests::load::machine_load();
    print!("{}", report.render());
    println!("machine load: {load_start} at start, {load_end} at end");
    let mut verdict = Vec::new();
    if !report.failures.is_empty() {
        verdict.push(format!("{} requests failed", report.failures.len()));
    }
    if report.edits_seen() < report.edits.len() || report.edits.is_empty() {
        verdict.push("not every weight edit reached sleep's Envoy".to_string());
    }
    if report.rotations.values().any(|n| *n == 0) {
        verdict.push("a Pod's Envoy saw no certificate rotation".to_string());
    }
    for r in report.grown(RSS_LIMIT_PCT) {
        verdict.push(format!(
            "{} RSS grew {:.2} % (limit {RSS_LIMIT_PCT} %)",
            r.label,
            r.growth_pct()
        ));
    }
    if verdict.is_empty() {
        println!("PASS");
    } else {
        println!("FAIL: {}", verdict.join("; "));
        std::process::exit(1);
    }
}
