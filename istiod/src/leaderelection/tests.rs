use super::*;

#[test]
fn the_default_revision_takes_locks_from_others() {
    // The default revision takes a lock another revision holds.
    assert!(takes_over("default", "canary", "default"));
    // No one takes from the default revision, nor when no default is known.
    assert!(!takes_over("canary", "default", "default"));
    assert!(!takes_over("canary", "stable", ""));
    // The same revision waits for expiry...
    assert!(!takes_over("default", "default", "default"));
    // ...unless a remote istiod of it holds the lock.
    assert!(takes_over("default", "^default", "default"));
    assert!(takes_over("canary", "^canary", "default"));
}

#[test]
fn elections_are_named_as_istio_names_them() {
    let e = Election::per_revision(GATEWAY_DEPLOYMENT_CONTROLLER, "canary");
    assert_eq!(e.name, "istio-gateway-deployment-canary");
    assert_eq!(e.kind, LockKind::Lease);
    assert!(!e.prioritized);
    assert_eq!(
        Election::per_revision(GATEWAY_STATUS_CONTROLLER, "").name,
        "istio-gateway-status-leader-default"
    );
    let e = Election::configmap(NAMESPACE_CONTROLLER);
    assert_eq!(e.name, "istio-namespace-controller-election");
    assert_eq!(e.kind, LockKind::ConfigMap);
    assert!(e.prioritized);
    assert_eq!(Election::lease(STATUS_CONTROLLER).kind, LockKind::Lease);
}

#[test]
fn timings_are_istios() {
    assert_eq!(LEASE_DURATION, Duration::from_secs(30));
    assert_eq!(RENEW_DEADLINE, LEASE_DURATION / 2);
    assert_eq!(RETRY_PERIOD, LEASE_DURATION / 4);
}

#[test]
fn enable_leader_election_is_read() {
    let env = |v: &str| common::env::MapEnv::from_pairs([(ENV_ENABLE_LEADER_ELECTION, v)]);
    assert!(enabled(&common::env::MapEnv::from_pairs([])).unwrap());
    assert!(!enabled(&env("false")).unwrap());
    assert!(enabled(&env("maybe")).is_err());
}

#[test]
fn lease_timestamps_are_micro_time() {
    let t = timestamp(LockKind::Lease);
    // 2026-12-07T12:00:00.123456Z
    assert_eq!(t.len(), 27, "{t}");
    assert!(t.ends_with('Z') && t.as_bytes()[19] == b'.', "{t}");
    assert_eq!(timestamp(LockKind::ConfigMap).len(), 20);
}

#[tokio::test]
async fn always_held_without_kubernetes() {
    let (_tx, shutdown) = watch::channel(false);
    let mut elections = Elections::new(None, shutdown);
    let l = elections.join(Election::configmap(NAMESPACE_CONTROLLER));
    assert!(l.is_leader());
    let mut l2 = l.clone();
    let (_tx2, mut sd) = watch::channel(false);
    assert!(l2.acquired(&mut sd).await);
}
