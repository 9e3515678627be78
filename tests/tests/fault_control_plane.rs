//! Faults of the control plane against the whole local mesh, each with
//! requests flowing from sleep to httpbin throughout: none may fail, and
//! every proxy must be on current config within the stated bound
//! (`tests::fault::control_plane`).

#![allow(clippy::unwrap_used)]

use tests::fault::Recovery;
use tests::fault::control_plane as cp;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    tests::mesh::one_mesh_at_a_time()
}

fn check(r: &Recovery) {
    eprintln!("{}", r.row());
    assert_eq!(r.failed, 0, "{r:?}");
    let last = r.to_last_ack.expect("every proxy ACKed current config");
    assert!(last <= r.bound, "recovered within {:?}: {r:?}", r.bound);
}

#[test]
fn istiod_killed_mid_push_and_restarted_every_proxy_converges_and_no_request_fails() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    check(&cp::istiod_killed_mid_push(tmp.path()));
}

#[test]
fn a_config_file_cut_mid_write_keeps_the_last_good_state_until_the_write_completes() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    check(&cp::config_file_truncated(tmp.path()));
}

#[test]
fn clients_that_never_read_or_never_ack_slow_no_other_proxy() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    check(&cp::stalled_xds_clients(tmp.path()));
}

#[test]
fn a_flood_of_dropped_connections_leaves_istiod_serving_and_its_memory_near_its_level() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    check(&cp::connection_flood(tmp.path()));
}
