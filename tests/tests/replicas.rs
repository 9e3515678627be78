//! Two istiods on one Kubernetes API (the stand-in) with real Envoys: only
//! the holder of a lock writes, the other takes over when the holder is
//! killed, Pods follow a killed istiod to the other, and a rolling restart
//! under traffic loses no request.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use tests::fault::control_plane::sleep_traffic;
use tests::fault::failures;
use tests::kube_api::{KubeApi, RequestRecord};
use tests::mesh::LocalMesh;
use tests::replicas::{self, replica_bearer, replica_name};

const LOCK: &str = "istio-namespace-controller-election";
const ROOT_CM: &str = "istio-ca-root-cert";
/// The longest the background traffic is waited for.
const TRAFFIC_WAIT: Duration = Duration::from_secs(60);

/// Who holds the namespace controller's lock (empty: no one).
fn holder(api: &KubeApi) -> String {
    api.get("v1", "ConfigMap", "istio-system", LOCK)
        .and_then(|cm| {
            let raw = cm["metadata"]["annotations"]["control-plane.alpha.kubernetes.io/leader"]
                .as_str()?
                .to_string();
            let v: serde_json::Value = serde_json::from_str(&raw).ok()?;
            v["holderIdentity"].as_str().map(str::to_string)
        })
        .unwrap_or_default()
}

/// Writes of `istio-ca-root-cert` ConfigMaps (creates outside istiod's
/// namespace, where lock ConfigMaps are also created, and every update):
/// the bearer of each.
fn root_cert_writes(requests: &[RequestRecord]) -> Vec<String> {
    requests
        .iter()
        .filter(|r| {
            let update = matches!(r.method.as_str(), "PUT" | "PATCH")
                && r.path.ends_with(&format!("/configmaps/{ROOT_CM}"));
            let create = r.method == "POST"
                && r.path.ends_with("/configmaps")
                && !r.path.contains("/namespaces/istio-system/");
            update || create
        })
        .map(|r| r.bearer.clone().unwrap_or_default())
        .collect()
}

fn index_of(name: &str) -> usize {
    (0..2).find(|i| replica_name(*i) == name).unwrap()
}

#[test]
fn only_the_leader_writes_and_the_other_takes_over_after_sigkill() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mut mesh = LocalMesh::start_kube_replicas(tmp.path(), 2);
    let leader = {
        let api = mesh.kube_api.as_ref().unwrap();
        let name = tests::wait_for(
            "a namespace controller leader",
            Duration::from_secs(60),
            || Some(holder(api)).filter(|h| !h.is_empty()),
        );
        tests::wait_for("demo's root ConfigMap", Duration::from_secs(30), || {
            api.get("v1", "ConfigMap", "demo", ROOT_CM)
        });
        index_of(&name)
    };
    let other = 1 - leader;
    {
        let api = mesh.kube_api.as_ref().unwrap();
        let writes = root_cert_writes(&api.requests());
        assert!(!writes.is_empty(), "the leader wrote the root ConfigMaps");
        assert!(
            writes.iter().all(|b| *b == replica_bearer(leader)),
            "only {} writes {ROOT_CM}: {writes:?}",
            replica_name(leader)
        );
    }
    // Both replicas serve meanwhile (the follower is ready too).
    mesh.replica(other).wait_ready();

    let before = mesh.kube_api.as_ref().unwrap().requests().len();
    let killed = Instant::now();
    mesh.kill_replica(leader);
    let api = mesh.kube_api.as_ref().unwrap();
    api.delete("v1", "ConfigMap", "demo", ROOT_CM).unwrap();
    // A whole lease unrenewed (30 s), then the next attempt (7.5 s, +20 %).
    tests::wait_for(
        "the other replica holds the lock",
        Duration::from_secs(50),
        || (holder(api) == replica_name(other)).then_some(()),
    );
    let took = killed.elapsed();
    eprintln!("BENCH {LOCK}: held by the other replica {took:?} after SIGKILL of the leader");
    tests::wait_for(
        "the deleted root ConfigMap is back",
        Duration::from_secs(20),
        || api.get("v1", "ConfigMap", "demo", ROOT_CM),
    );
    let writes = root_cert_writes(&api.requests()[before..]);
    assert!(
        !writes.is_empty() && writes.iter().all(|b| *b == replica_bearer(other)),
        "the new leader alone repaired it: {writes:?}"
    );
}

fn all_on(mesh: &LocalMesh, i: usize, n: usize) -> bool {
    let istiod = if i == 0 {
        &mesh.istiod
    } else {
        &mesh.replicas.as_ref().unwrap().others[i - 1]
    };
    replicas::clients(mesh.replica_net(i), istiod).len() >= n
}

#[test]
fn pods_follow_a_killed_istiod_and_a_rolling_restart_loses_no_request() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mut mesh = LocalMesh::start_kube_replicas(tmp.path(), 2);
    let pods = mesh.pods.len();
    tests::wait_for("every Pod on istiod-0", Duration::from_secs(30), || {
        all_on(&mesh, 0, pods).then_some(())
    });

    // SIGKILL of the istiod every Pod uses: they reconnect to the other
    // and traffic goes on.
    let traffic = sleep_traffic(&mesh);
    traffic.wait_successes(10, Instant::now(), TRAFFIC_WAIT);
    let pid = mesh.istiod.proc.pid();
    let started = Instant::now();
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
    tests::wait_for("every Pod on istiod-1", Duration::from_secs(60), || {
        all_on(&mesh, 1, pods).then_some(())
    });
    eprintln!(
        "BENCH {pods} proxies of a killed istiod connected to the other in {:?}",
        started.elapsed()
    );
    traffic.wait_successes(20, Instant::now(), TRAFFIC_WAIT);
    let outcomes = traffic.stop();
    // Reaped.
    replicas::kill(&mut mesh.istiod);
    assert_eq!(
        failures(&outcomes),
        Vec::<String>::new(),
        "no failed request after SIGKILL"
    );
    assert!(outcomes.len() > 10);

    // A change made now reaches the Pods (through istiod-1).
    {
        let api = mesh.kube_api.as_ref().unwrap();
        let mut vs = api
            .get(
                "networking.istio.io/v1",
                "VirtualService",
                "demo",
                "httpbin",
            )
            .unwrap();
        vs["spec"]["http"][0]["route"][0]["weight"] = 0.into();
        vs["spec"]["http"][0]["route"][1]["weight"] = 100.into();
        api.update(vs).unwrap();
    }
    tests::wait_for("all traffic to v2", Duration::from_secs(30), || {
        (mesh.httpbin_versions(20).get("v2") == Some(&20)).then_some(())
    });

    // Rolling restart: istiod-0 back, then istiod-1 stopped (SIGTERM) and
    // back, under steady traffic.
    mesh.replica(0).restart();
    let mut other = mesh.replicas.take().unwrap();
    let traffic = sleep_traffic(&mesh);
    traffic.wait_successes(10, Instant::now(), TRAFFIC_WAIT);
    let begun = Instant::now();
    other.others[0].stop();
    let stopped_in = begun.elapsed();
    eprintln!("istiod-1 exited {stopped_in:?} after SIGTERM");
    assert!(
        stopped_in < Duration::from_secs(12),
        "within --shutdownDuration (10 s)"
    );
    tests::wait_for(
        "every Pod back on istiod-0",
        Duration::from_secs(60),
        || (replicas::clients(&other.nets[0], &mesh.istiod).len() >= pods).then_some(()),
    );
    other.others[0].restart();
    traffic.wait_successes(20, Instant::now(), TRAFFIC_WAIT);
    let outcomes = traffic.stop();
    mesh.replicas = Some(other);
    assert_eq!(
        failures(&outcomes),
        Vec::<String>::new(),
        "no failed request across the rolling restart"
    );
    assert!(outcomes.len() > 10);
    // Still converged.
    assert_eq!(mesh.httpbin_versions(10).get("v2"), Some(&10));
}
