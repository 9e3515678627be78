//! Each control-plane fault of `tests::fault::control_plane` run once
//! against the whole local mesh, with requests flowing from sleep to
//! httpbin: how many were sent and failed, and how long from the fault's
//! end to the first successful request and to the last proxy's ACK of
//! current config.
//!
//! `cargo build -p istiod -p pilot-agent -p tests --bins && flock /tmp/mesh-e2e.lock target/debug/bench_faults_control_plane`
//! (needs root, iproute2 and iptables). Prints a Markdown table; asserts
//! what the tests assert, nothing about speed.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use tests::fault::Recovery;
use tests::fault::control_plane as cp;
use tests::load::machine_load;

fn main() {
    let faults: [fn(&Path) -> Recovery; 4] = [
        cp::istiod_killed_mid_push,
        cp::config_file_truncated,
        cp::stalled_xds_clients,
        cp::connection_flood,
    ];
    let mut rows = Vec::new();
    for fault in faults {
        let tmp = tempfile::tempdir().unwrap();
        let r = fault(tmp.path());
        eprintln!("{}", r.row());
        rows.push(r.row());
    }
    println!(
        "| fault | requests sent | failed | fault end -> first success (ms) | fault end -> last proxy ACK (ms) | bound (ms) |"
    );
    println!("|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    println!();
    println!("machine load (1, 5, 15 min): {}", machine_load());
}
