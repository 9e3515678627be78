//! Recovery from the Pod faults of `tests::fault::pod`, each run once: a
//! Pod's link cut past the xDS keepalive (while its routes change), and its
//! CA unreachable past its certificate's life. Prints a Markdown table of
//! requests sent and failed on the routes the fault does not touch, and the
//! time from the fault's end to the first successful request at the Pod and
//! to the last proxy's ACK of current config (istiod's `/debug/syncz`).
//!
//! `cargo build -p istiod -p pilot-agent -p tests --bins &&
//! flock /tmp/mesh-e2e.lock target/debug/bench_faults_pod` (needs root,
//! iproute2 and iptables). Asserts nothing about speed.

#![allow(clippy::unwrap_used)]

use tests::fault::pod;
use tests::load::{machine_load, ms};

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let load_before = machine_load();
    let link = pod::link_down(&tmp.path().join("link"));
    let ca = pod::ca_unreachable(&tmp.path().join("ca"));
    println!("| fault | requests sent | failed | first success | last ACK | bound |");
    println!("|---|---|---|---|---|---|");
    println!("{}", link.recovery.row());
    println!("{}", ca.recovery.row());
    println!();
    println!(
        "link: down {} ms; istiod dropped the stream: {}; the change seen at the Pod after {} ms",
        ms(link.outage),
        link.dropped_by_istiod,
        link.change_seen_after.map_or("-".into(), ms)
    );
    println!(
        "CA: unreachable {} ms; readiness while expired: {} {:?}; readiness 200 after {} ms, new certificate at Envoy after {} ms; requests while valid {} (failed {}), the Pod's failed requests in all {}",
        ms(ca.outage),
        ca.expired_readiness.0,
        ca.expired_readiness.1.trim(),
        ms(ca.ready_after),
        ms(ca.new_cert_after),
        ca.while_valid.0,
        ca.while_valid.1.len(),
        ca.cut_off_failures.len()
    );
    println!(
        "machine load (1/5/15 min): before {load_before}, after {}",
        machine_load()
    );
}
