//! Faults that hit one Pod, end to end (real istiod, agents and Envoys in
//! network namespaces): its link cut past the xDS keepalive while its
//! config changes, and its CA unreachable past its certificate's life.
//! Scenarios in `tests::fault::pod`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tests::fault::pod;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    tests::mesh::one_mesh_at_a_time()
}

#[test]
fn a_pod_cut_off_past_the_keepalive_comes_back_current_and_others_never_fail() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let r = pod::link_down(tmp.path());
    eprintln!("{r:#?}\n{}", r.recovery.row());
    assert!(r.outage >= pod::LINK_OUTAGE, "{:?}", r.outage);
    assert!(
        r.dropped_by_istiod,
        "istiod's keepalive dropped the silent proxy's stream during the outage"
    );
    let (before, after) = &r.connections;
    assert!(
        before.is_some() && after.is_some() && before != after,
        "{before:?} -> {after:?}"
    );
    assert!(r.recovery.sent > 0);
    assert_eq!(
        r.bystander_failures,
        Vec::<String>::new(),
        "routes not crossing the cut link never failed"
    );
    let first = r
        .recovery
        .to_first_success
        .expect("a request succeeded after the link returned");
    assert!(first <= r.recovery.bound, "{first:?}");
    let ack = r.recovery.to_last_ack.unwrap();
    assert!(
        ack <= r.recovery.bound,
        "SYNCED on the current push after {ack:?}"
    );
    let seen = r
        .change_seen_after
        .expect("the change made while the link was down took effect");
    assert!(seen <= r.recovery.bound, "{seen:?}");
    for (code, body) in &r.responses_after {
        assert_eq!(*code, 200, "{body}");
        assert!(
            body.contains("version=v2"),
            "every request goes to v2 now: {body}"
        );
        assert!(
            body.to_ascii_lowercase().contains("x-mesh-epoch: 2"),
            "the new route's header reached the app: {body}"
        );
    }
}

#[test]
fn a_pod_without_its_ca_serves_until_expiry_says_why_and_recovers() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let r = pod::ca_unreachable(tmp.path());
    eprintln!("{r:#?}\n{}", r.recovery.row());
    let (valid, failed_while_valid) = &r.while_valid;
    assert!(
        *valid > 0,
        "requests were sent while the certificate was valid"
    );
    assert_eq!(
        failed_while_valid,
        &Vec::<String>::new(),
        "Envoy kept serving with the certificate it had"
    );
    let (code, body) = &r.expired_readiness;
    assert_eq!(*code, 503, "{body}");
    assert!(body.contains("workload certificate expired"), "{body}");
    assert!(body.contains("CA unreachable"), "{body}");
    assert!(
        body.contains(&pod::CaRelay::ca_addr()),
        "the CA's error names where it was sought: {body}"
    );
    assert!(r.ready_after <= r.recovery.bound, "{:?}", r.ready_after);
    assert!(
        r.new_cert_after <= r.recovery.bound,
        "{:?}",
        r.new_cert_after
    );
    let first = r
        .recovery
        .to_first_success
        .expect("a request succeeded after the CA returned");
    assert!(first <= r.recovery.bound, "{first:?}");
    assert!(r.recovery.sent > 0);
    assert_eq!(
        r.bystander_failures,
        Vec::<String>::new(),
        "Pods whose CA stayed reachable never failed"
    );
    assert!(r.outage > Duration::from_secs(1));
}
