//! Istio's leader election against the Kubernetes API stand-in: the lock
//! objects as Istio writes them, one holder at a time, release on shutdown,
//! and the default revision taking a lock from another revision.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use istiod::leaderelection::lock::{HOLDER_KEY_ANNOTATION, RECORD_ANNOTATION};
use istiod::leaderelection::{
    Candidate, DefaultRevision, Election, Elector, GATEWAY_STATUS_CONTROLLER, Leadership,
    NAMESPACE_CONTROLLER, RETRY_PERIOD,
};
use tests::kube_api::KubeApi;
use tokio::sync::watch;

async fn client(api: &KubeApi, dir: &Path) -> kube::Client {
    client_as(api, dir, tests::kube_api::TOKEN).await
}

/// A client sending `token` (the stand-in records it with each request).
async fn client_as(api: &KubeApi, dir: &Path, token: &str) -> kube::Client {
    let path = dir.join(format!("kubeconfig-{token}"));
    api.kubeconfig(&path);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace(tests::kube_api::TOKEN, token)).unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let options = kube::config::KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn candidate(client: &kube::Client, identity: &str, revision: &str) -> Candidate {
    Candidate {
        client: client.clone(),
        namespace: "istio-system".into(),
        identity: identity.into(),
        revision: revision.into(),
        default_revision: DefaultRevision::fixed("default"),
    }
}

/// Starts an elector; returns its leadership and its stop switch.
fn start(
    election: Election,
    c: Candidate,
) -> (Leadership, watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let (stop, stop_rx) = watch::channel(false);
    let (elector, leadership) = Elector::new(election, c);
    let task = tokio::spawn(elector.run(stop_rx));
    (leadership, stop, task)
}

async fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

fn record(api: &KubeApi, name: &str) -> serde_json::Value {
    let cm = api
        .get("v1", "ConfigMap", "istio-system", name)
        .expect("the lock ConfigMap exists");
    let raw = cm["metadata"]["annotations"][RECORD_ANNOTATION]
        .as_str()
        .expect("the record annotation")
        .to_string();
    serde_json::from_str(&raw).expect("the record is JSON")
}

fn namespace(api: &KubeApi) {
    api.create(serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_holder_at_a_time_and_the_lock_passes_on_release() {
    common::tls::install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = KubeApi::start_local();
    namespace(&api);
    let client = client(&api, tmp.path()).await;
    let (a, stop_a, task_a) = start(
        Election::configmap(NAMESPACE_CONTROLLER),
        candidate(&client, "istiod-a", "default"),
    );
    wait_until("istiod-a leads", Duration::from_secs(10), || a.is_leader()).await;
    let client_b = client_as(&api, tmp.path(), "istiod-b-token").await;
    let (b, _stop_b, _task_b) = start(
        Election::configmap(NAMESPACE_CONTROLLER),
        candidate(&client_b, "istiod-b", "default"),
    );
    // b tries (twice, as the stand-in's record of its requests for the
    // lock shows) and stays a follower while a renews.
    let lock_path = format!("/api/v1/namespaces/istio-system/configmaps/{NAMESPACE_CONTROLLER}");
    wait_until("istiod-b tries the lock twice", RETRY_PERIOD * 4, || {
        api.requests()
            .iter()
            .filter(|r| {
                r.bearer.as_deref() == Some("istiod-b-token")
                    && r.path == lock_path
                    && r.status.is_some()
            })
            .count()
            >= 2
    })
    .await;
    assert!(a.is_leader() && !b.is_leader());
    let r = record(&api, NAMESPACE_CONTROLLER);
    assert_eq!(r["holderIdentity"], "istiod-a");
    assert_eq!(r["holderKey"], "default");
    assert_eq!(r["leaseDurationSeconds"], 30);

    // Graceful stop: the record is emptied (lease 1 s), b takes over at
    // its next attempt rather than after a whole lease.
    stop_a.send(true).unwrap();
    task_a.await.unwrap();
    assert!(!a.is_leader());
    let r = record(&api, NAMESPACE_CONTROLLER);
    assert_eq!(r["holderIdentity"], "", "released: {r}");
    assert_eq!(r["leaseDurationSeconds"], 1);
    let took = wait_until("istiod-b leads", RETRY_PERIOD * 2, || b.is_leader()).await;
    let r = record(&api, NAMESPACE_CONTROLLER);
    assert_eq!(r["holderIdentity"], "istiod-b");
    assert_eq!(r["leaderTransitions"], 1);
    eprintln!("the lock passed on {took:?} after its release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_revision_takes_the_lock_from_a_canary() {
    common::tls::install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = KubeApi::start_local();
    namespace(&api);
    let client = client(&api, tmp.path()).await;
    let (canary, _s1, _t1) = start(
        Election::configmap(NAMESPACE_CONTROLLER),
        candidate(&client, "istiod-canary", "canary"),
    );
    wait_until("the canary leads", Duration::from_secs(10), || {
        canary.is_leader()
    })
    .await;
    let (default, _s2, _t2) = start(
        Election::configmap(NAMESPACE_CONTROLLER),
        candidate(&client, "istiod-default", "default"),
    );
    // Well before the canary's lease could expire.
    wait_until("the default revision leads", Duration::from_secs(5), || {
        default.is_leader()
    })
    .await;
    assert_eq!(record(&api, NAMESPACE_CONTROLLER)["holderKey"], "default");
    // The canary notices at its next renewal and stops leading.
    wait_until("the canary steps down", Duration::from_secs(20), || {
        !canary.is_leader()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_revision_locks_are_leases_named_by_revision() {
    common::tls::install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = KubeApi::start_local();
    namespace(&api);
    let client = client(&api, tmp.path()).await;
    let (l, _s, _t) = start(
        Election::per_revision(GATEWAY_STATUS_CONTROLLER, "canary"),
        candidate(&client, "istiod-canary", "canary"),
    );
    wait_until("leads", Duration::from_secs(10), || l.is_leader()).await;
    let lease = api
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            "istio-system",
            "istio-gateway-status-leader-canary",
        )
        .expect("the Lease exists");
    assert_eq!(lease["spec"]["holderIdentity"], "istiod-canary");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 30);
    // Per-revision locks carry no priority key.
    assert!(
        lease["metadata"]["annotations"][HOLDER_KEY_ANNOTATION].is_null(),
        "{lease}"
    );
}
