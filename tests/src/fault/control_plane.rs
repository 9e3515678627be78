//! Faults of the control plane, each against the whole local mesh (real
//! istiod, pilot-agents and Envoys in network namespaces) with requests
//! flowing from sleep to httpbin the whole time:
//!
//! - [`istiod_killed_mid_push`]: istiod SIGKILLed while a push to the
//!   Envoys and to [`SIMULATED`] simulated ADS clients is in flight, then
//!   started again;
//! - [`config_file_truncated`]: a file of `--configDir` cut mid-write, at
//!   a syntax error, at a half object that is valid YAML, and at a document
//!   boundary;
//! - [`stalled_xds_clients`]: an ADS client that never reads its stream and
//!   one that never ACKs, while config keeps changing;
//! - [`connection_flood`]: 1000 connections opened and dropped at once on
//!   each of `:15010` and `:15012`.
//!
//! Each returns its [`Recovery`] after asserting what the fault must not
//! break; the tests and the benchmark both run them.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use pilot_load::client::{ClientSettings, Event, ProxySpec, run_proxy};
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use tokio::sync::{mpsc, watch};

use super::{Outcome, Recovery, Traffic, failures, first_success_after};
use crate::mesh::{HTTPBIN_VIP, LocalMesh};
use crate::netns::Netns;

/// How many simulated ADS clients share istiod with the real Envoys.
pub const SIMULATED: usize = 150;
/// The recovery bound of every fault here: generous, for a loaded two-core
/// machine (istiod restarts, proxies reconnect with a backoff of up to 4 s).
pub const BOUND: Duration = Duration::from_secs(60);
/// The route configuration sleep's and httpbin's Envoys (and the simulated
/// clients, sidecars of namespace demo) receive httpbin's routes in.
const HTTPBIN_ROUTE: &str = "8000";
/// Between two requests of the background traffic.
const PACE: Duration = Duration::from_millis(25);
/// The longest any background traffic runs.
const TRAFFIC_LIMIT: Duration = Duration::from_secs(300);
/// istiod's plaintext xDS port, opened in the hub for the simulated clients.
const PLAINTEXT_XDS: &str = "0.0.0.0:15010";

/// The sample mesh with istiod's plaintext port (`:15010`) open too.
pub fn start_mesh(dir: &Path) -> LocalMesh {
    let mut mesh = LocalMesh::start(dir, &[]);
    mesh.istiod
        .set_env("TEST_ISTIOD_PLAINTEXT_ADDR", PLAINTEXT_XDS);
    mesh.istiod.restart();
    mesh
}

/// sleep's app calling httpbin through the mesh every [`PACE`], from its
/// own thread inside sleep's Pod.
pub fn sleep_traffic(mesh: &LocalMesh) -> Traffic {
    let path = format!("/var/run/netns/{}", mesh.pod("sleep-1").ns.name);
    let mut entered = false;
    Traffic::start(PACE, TRAFFIC_LIMIT, move || {
        if !entered {
            let file = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("entering {path}: {e}"))?;
            entered = true;
        }
        get_httpbin().map_err(|e| e.to_string())
    })
}

/// One `GET /headers` to httpbin's Service IP, as sleep's app sends it.
fn get_httpbin() -> std::io::Result<u16> {
    let addr: SocketAddr = format!("{HTTPBIN_VIP}:8000")
        .parse()
        .map_err(std::io::Error::other)?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_nodelay(true)?;
    s.write_all(b"GET /headers HTTP/1.1\r\nHost: httpbin:8000\r\nConnection: close\r\n\r\n")?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    Ok(buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0))
}

/// The weights of every weighted route in Pod `pod`'s Envoy (its
/// `/config_dump` of dynamic route configurations), in order; empty when
/// none. `None` when Envoy does not answer.
pub fn envoy_weights(mesh: &LocalMesh, pod: &str) -> Option<Vec<u64>> {
    let (code, body) = mesh.pod(pod).ns.run(|| {
        crate::http_get(
            SocketAddr::from(([127, 0, 0, 1], 15000)),
            "/config_dump?resource=dynamic_route_configs",
        )
        .ok()
    })?;
    if code != 200 {
        return None;
    }
    let dump: serde_json::Value = serde_json::from_str(&body).ok()?;
    let mut out = Vec::new();
    collect_weights(&dump, &mut out);
    Some(out)
}

fn collect_weights(v: &serde_json::Value, out: &mut Vec<u64>) {
    match v {
        serde_json::Value::Object(m) => {
            if let Some(clusters) = m
                .get("weighted_clusters")
                .and_then(|w| w["clusters"].as_array())
            {
                out.extend(clusters.iter().map(|c| c["weight"].as_u64().unwrap_or(0)));
            }
            for (k, x) in m {
                if k != "weighted_clusters" {
                    collect_weights(x, out);
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| collect_weights(x, out)),
        _ => {}
    }
}

/// Whether every Pod's Envoy routes with exactly `want`.
fn every_envoy_has(mesh: &LocalMesh, want: &[u64]) -> bool {
    mesh.pods
        .iter()
        .all(|(name, ..)| envoy_weights(mesh, name).as_deref() == Some(want))
}

/// istiod's `/debug/syncz`: each proxy's id and whether every type it was
/// sent is ACKed (Istio's `SYNCED`), for proxies whose id `select` accepts.
pub fn syncz(mesh: &LocalMesh, select: impl Fn(&str) -> bool) -> Option<BTreeMap<String, bool>> {
    let http = mesh.istiod.http;
    let (code, body) = mesh
        .hub
        .ns
        .run(move || crate::http_get(http, "/debug/syncz").ok())?;
    if code != 200 {
        return None;
    }
    let list: Vec<serde_json::Value> = serde_json::from_str(&body).ok()?;
    Some(
        list.iter()
            .filter_map(|e| {
                let id = e["proxy"].as_str()?;
                if !select(id) {
                    return None;
                }
                let synced = ["cluster", "listener", "endpoint", "route"]
                    .iter()
                    .all(|t| {
                        let sent = e[format!("{t}_sent")].as_str().unwrap_or("");
                        sent.is_empty() || e[format!("{t}_acked")].as_str() == Some(sent)
                    })
                    && !e["cluster_sent"].as_str().unwrap_or("").is_empty();
                Some((id.to_string(), synced))
            })
            .collect(),
    )
}

/// Whether the real Envoys' proxies (the mesh's Pods) are all connected
/// and `SYNCED` in `/debug/syncz`.
fn envoys_synced(mesh: &LocalMesh) -> bool {
    let pods: Vec<String> = mesh.pods.iter().map(|p| p.0.clone()).collect();
    let Some(s) = syncz(mesh, |id| pods.iter().any(|p| id.starts_with(p.as_str()))) else {
        return false;
    };
    s.len() == pods.len() && s.values().all(|ok| *ok)
}

/// Writes `text` to `path` as editors and `kubectl cp` should: a temporary
/// file renamed over it.
fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_file_name(".fault-edit.tmp");
    std::fs::write(&tmp, text).expect("write the edit");
    std::fs::rename(&tmp, path).expect("rename the edit into place");
}

/// The sample's `istio.yaml` with httpbin's weights `v1`/`v2`.
fn with_weights(sample: &str, v1: u64, v2: u64) -> String {
    let edited = sample
        .replacen("weight: 90", &format!("weight: {v1}"), 1)
        .replacen("weight: 10", &format!("weight: {v2}"), 1);
    assert_ne!(edited, sample, "the sample routes 90/10");
    edited
}

/// istiod's resident set, from `/proc/<pid>/status`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Asserts no request failed and returns how many were sent.
fn assert_none_failed(fault: &str, outcomes: &[Outcome]) -> usize {
    let failed = failures(outcomes);
    assert!(
        failed.is_empty(),
        "{fault}: {} of {} requests failed on the unchanged route: {:?}",
        failed.len(),
        outcomes.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(
        outcomes.len() > 20,
        "{fault}: requests flowed: {}",
        outcomes.len()
    );
    outcomes.len()
}

/// What the simulated clients last ACKed, shared with the test.
#[derive(Default)]
struct FleetState {
    /// Per proxy: the content hash of each route configuration it ACKed.
    routes: HashMap<usize, HashMap<String, u64>>,
    /// Streams ended (istiod gone), all proxies together.
    ended: usize,
    /// SIGKILL istiod (this pid) at the first ACK of a route `8000`
    /// other than this hash.
    kill: Option<(u32, u64)>,
    /// When it was killed, and how many proxies had the new route then.
    killed: Option<(Instant, usize)>,
}

/// [`SIMULATED`]-style ADS clients (pilot-load's) connected to istiod's
/// plaintext port from inside the hub, half of them state of the world and
/// half delta, as sidecars of namespace demo.
pub struct Fleet {
    state: Arc<Mutex<FleetState>>,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
    count: usize,
}

impl Fleet {
    /// Starts `count` clients inside `hub` against `127.0.0.1:15010`.
    pub fn start(hub: &Netns, count: usize) -> Fleet {
        let state = Arc::new(Mutex::new(FleetState::default()));
        let (stop, stop_rx) = watch::channel(false);
        let shared = state.clone();
        let thread = hub.spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime for the simulated clients");
            rt.block_on(run_fleet(count, shared, stop_rx));
        });
        Fleet {
            state,
            stop,
            thread: Some(thread),
            count,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut FleetState) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The hash of route `8000` every client holds, once they all hold the
    /// same one (and it is not `other`).
    pub fn converged(&self, other: Option<u64>) -> Option<u64> {
        self.with(|s| {
            let mut hashes = (0..self.count)
                .map(|i| s.routes.get(&i).and_then(|r| r.get(HTTPBIN_ROUTE)).copied());
            let first = hashes.next()??;
            (hashes.all(|h| h == Some(first)) && Some(first) != other).then_some(first)
        })
    }

    /// Arms a SIGKILL of `pid` at the first ACK of a route `8000` other
    /// than `old`.
    fn kill_on_change(&self, pid: u32, old: u64) {
        self.with(|s| s.kill = Some((pid, old)));
    }

    fn killed(&self) -> Option<(Instant, usize)> {
        self.with(|s| s.killed)
    }

    fn ended(&self) -> usize {
        self.with(|s| s.ended)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn fleet_spec(i: usize) -> ProxySpec {
    let ip = format!("198.18.{}.{}", 100 + i / 200, 1 + i % 200);
    ProxySpec {
        index: i,
        node_id: format!("sidecar~{ip}~sim-{i}.demo~demo.svc.cluster.local"),
        namespace: "demo".into(),
        ip,
        labels: vec![("app".into(), "sim".into())],
        service_account: "sim".into(),
        delta: i % 2 == 1,
    }
}

async fn run_fleet(count: usize, state: Arc<Mutex<FleetState>>, stop: watch::Receiver<bool>) {
    let (tx, mut events) = mpsc::unbounded_channel();
    let (_reconnect, reconnect_rx) = watch::channel(0);
    let settings = ClientSettings {
        record_names: true,
        ..Default::default()
    };
    for i in 0..count {
        let Ok(endpoint) = tonic::transport::Endpoint::from_shared("http://127.0.0.1:15010") else {
            return;
        };
        tokio::spawn(run_proxy(
            fleet_spec(i),
            endpoint.connect_lazy(),
            settings.clone(),
            tx.clone(),
            reconnect_rx.clone(),
            stop.clone(),
        ));
    }
    drop(tx);
    let mut stop = stop;
    loop {
        let event = tokio::select! {
            e = events.recv() => e,
            _ = stop.changed() => return,
        };
        let Some(event) = event else { return };
        let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
        match event {
            Event::Ended { .. } => s.ended += 1,
            // Route configurations are type 3 (`pilot_load::client::TYPES`).
            Event::Ack(a) if a.kind == 3 => {
                let routes = s.routes.entry(a.proxy).or_default();
                routes.extend(a.names);
                let new = routes.get(HTTPBIN_ROUTE).copied();
                if let (Some((pid, old)), Some(new)) = (s.kill, new)
                    && new != old
                {
                    #[allow(unsafe_code)]
                    // SAFETY: a plain kill(2) of istiod's pid.
                    unsafe {
                        libc::kill(pid as i32, libc::SIGKILL);
                    }
                    let had = s
                        .routes
                        .values()
                        .filter(|r| r.get(HTTPBIN_ROUTE).is_some_and(|h| *h != old))
                        .count();
                    s.killed = Some((Instant::now(), had));
                    s.kill = None;
                }
            }
            Event::Ack(_) => {}
        }
    }
}

/// istiod SIGKILLed while a weight change is being pushed to the three
/// Envoys and [`SIMULATED`] simulated clients, then started again: every
/// proxy converges on the new routes, and no request of sleep's fails.
pub fn istiod_killed_mid_push(dir: &Path) -> Recovery {
    const FAULT: &str = "istiod SIGKILLed mid-push, restarted";
    let mut mesh = start_mesh(dir);
    let traffic = sleep_traffic(&mesh);
    let fleet = Fleet::start(&mesh.hub.ns, SIMULATED);
    let old = crate::wait_for("the simulated clients' routes", BOUND, || {
        fleet.converged(None)
    });
    let total = SIMULATED + mesh.pods.len();
    crate::wait_for("every proxy SYNCED before the change", BOUND, || {
        syncz(&mesh, |id| !id.starts_with("istioctl."))
            .filter(|s| s.len() == total && s.values().all(|ok| *ok))
    });

    let vs = mesh.config_dir.join("istio.yaml");
    let sample = std::fs::read_to_string(&vs).expect("the sample's istio.yaml");
    fleet.kill_on_change(mesh.istiod.proc.pid(), old);
    let changed = Instant::now();
    write_atomically(&vs, &with_weights(&sample, 60, 40));
    let (killed_at, had_it) = crate::wait_for("the push to begin", BOUND, || fleet.killed());
    let istiod = &mut mesh.istiod.proc;
    crate::wait_for("istiod to die", Duration::from_secs(10), || {
        (!istiod.alive()).then_some(())
    });
    assert!(
        had_it < SIMULATED,
        "the push was in flight when istiod was killed: {had_it} of {SIMULATED} had it"
    );
    // The proxies notice and retry against nothing for a moment.
    crate::wait_for("the clients to see istiod gone", BOUND, || {
        (fleet.ended() > 0).then_some(())
    });

    let restarted = Instant::now();
    mesh.istiod.restart();
    let new = crate::wait_for("every proxy on the new routes", BOUND, || {
        let new = fleet.converged(Some(old))?;
        let envoys = every_envoy_has(&mesh, &[60, 40]);
        let all = syncz(&mesh, |id| !id.starts_with("istioctl."))?;
        (envoys && all.len() == total && all.values().all(|ok| *ok)).then_some(new)
    });
    let to_last_ack = restarted.elapsed();
    assert_ne!(new, old);
    eprintln!(
        "killed {:?} after the edit, at the first simulated client's ACK of it ({had_it} of {SIMULATED} had it); every proxy converged {to_last_ack:?} after the restart",
        killed_at - changed
    );
    std::thread::sleep(Duration::from_millis(500));
    let outcomes = traffic.stop();
    let sent = assert_none_failed(FAULT, &outcomes);
    Recovery {
        fault: FAULT,
        sent,
        failed: 0,
        to_first_success: first_success_after(&outcomes, restarted),
        to_last_ack: Some(to_last_ack),
        bound: BOUND,
    }
}

/// istiod's `/debug/configz` errors (each names file, object and field).
fn config_errors(mesh: &LocalMesh) -> Vec<String> {
    let http = mesh.istiod.http;
    let Some((200, body)) = mesh
        .hub
        .ns
        .run(move || crate::http_get(http, "/debug/configz").ok())
    else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["errors"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// `pilot_total_rejected_configs` summed over the series of file `file`.
fn rejected(mesh: &LocalMesh, file: &Path) -> u64 {
    let monitoring = mesh.istiod.monitoring;
    let Some((200, body)) = mesh
        .hub
        .ns
        .run(move || crate::http_get(monitoring, "/metrics").ok())
    else {
        return 0;
    };
    let label = format!("name=\"{}\"", file.display());
    body.lines()
        .filter(|l| l.starts_with("pilot_total_rejected_configs{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// Truncates `path` and writes `text` into it in place (no rename), as a
/// writer that has not finished leaves it.
fn write_in_place(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .expect("open the config file in place");
    f.write_all(text.as_bytes())
        .expect("write part of the file");
    f.sync_all().expect("flush the partial write");
}

/// Appends the rest of a write begun with [`write_in_place`].
fn finish_in_place(path: &Path, rest: &str) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open the config file to append");
    f.write_all(rest.as_bytes()).expect("write the rest");
    f.sync_all().expect("flush the rest");
}

/// Holds for `hold` that every Envoy keeps routing with `want` (polling;
/// what a rejected or unchanged config must look like).
fn envoys_keep(mesh: &LocalMesh, want: &[u64], hold: Duration, what: &str) {
    let start = Instant::now();
    while start.elapsed() < hold {
        for (name, ..) in &mesh.pods {
            let got = envoy_weights(mesh, name);
            assert_eq!(
                got.as_deref(),
                Some(want),
                "{what}: {name}'s Envoy must keep the last good routes"
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A cut write that istiod must refuse: the error shows in
/// `pilot_total_rejected_configs` and `/debug/configz` (naming what
/// `names` lists), and the Envoys keep the last good weights.
fn refused_cut(mesh: &LocalMesh, vs: &Path, cut: &str, names: &[&str], keep: &[u64], what: &str) {
    let before = rejected(mesh, vs);
    write_in_place(vs, cut);
    crate::wait_for(&format!("{what}: the rejection counted"), BOUND, || {
        (rejected(mesh, vs) > before).then_some(())
    });
    let errors = config_errors(mesh);
    let file = vs.display().to_string();
    assert!(
        errors
            .iter()
            .any(|e| e.contains(&file) && names.iter().all(|n| e.contains(n))),
        "{what}: /debug/configz names {file} and {names:?}: {errors:?}"
    );
    // Longer than the watcher's debounce: nothing else arrives.
    envoys_keep(mesh, keep, Duration::from_secs(2), what);
}

/// A config file of `--configDir` written in place and read while the
/// write is unfinished. Three cuts of a weight change 90/10 -> 60/40 of
/// httpbin's VirtualService:
///
/// 1. in the middle of a token (`port: {num`), which is not YAML;
/// 2. after `route:`, valid YAML but a half object (an HTTP route with no
///    destination), which validation refuses;
///
/// both refused as a whole file: the last good objects keep serving and the
/// error names the file (and the object and field for the second). Then
/// the write completes and 60/40 applies.
///
/// 3. at a document boundary, before the VirtualService's document: the
///    file is valid and simply holds fewer objects. istiod cannot tell an
///    unfinished write from a file shortened on purpose, and Istio's file
///    controller treats every parse of a file as its whole content (its
///    tests assert that emptying a file deletes its configs), so istiod does
///    the same: the VirtualService is deleted until the write completes.
///    Here that is safe (httpbin's default route still answers); writers
///    that must never expose a half state rename a finished file into place.
pub fn config_file_truncated(dir: &Path) -> Recovery {
    const FAULT: &str = "config file truncated mid-write";
    let mesh = start_mesh(dir);
    let traffic = sleep_traffic(&mesh);
    crate::wait_for("the sample's 90/10 at every Envoy", BOUND, || {
        every_envoy_has(&mesh, &[90, 10]).then_some(())
    });
    let vs = mesh.config_dir.join("istio.yaml");
    let sample = std::fs::read_to_string(&vs).expect("the sample's istio.yaml");
    let edit = with_weights(&sample, 60, 40);

    let token = edit.find("port: {number").expect("a destination port") + "port: {num".len();
    refused_cut(&mesh, &vs, &edit[..token], &[], &[90, 10], "a cut token");
    let route = edit.find("    route:\n").expect("the canary route") + "    route:\n".len();
    refused_cut(
        &mesh,
        &vs,
        &edit[..route],
        &["VirtualService/demo/httpbin", "spec.http[0]"],
        &[90, 10],
        "a half object",
    );
    finish_in_place(&vs, &edit[route..]);
    let completed = Instant::now();
    crate::wait_for("the completed write at every Envoy", BOUND, || {
        (every_envoy_has(&mesh, &[60, 40]) && envoys_synced(&mesh)).then_some(())
    });
    let to_last_ack = completed.elapsed();
    assert!(
        !config_errors(&mesh)
            .iter()
            .any(|e| e.contains("istio.yaml")),
        "the error is gone once the file is whole"
    );

    // A cut at a document boundary: the VirtualService vanishes.
    let boundary = sample
        .find("---\n# 90%")
        .expect("the VirtualService's document");
    write_in_place(&vs, &sample[..boundary]);
    crate::wait_for("the VirtualService deleted at every Envoy", BOUND, || {
        every_envoy_has(&mesh, &[]).then_some(())
    });
    finish_in_place(&vs, &sample[boundary..]);
    crate::wait_for("the sample restored at every Envoy", BOUND, || {
        (every_envoy_has(&mesh, &[90, 10]) && envoys_synced(&mesh)).then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    let outcomes = traffic.stop();
    let sent = assert_none_failed(FAULT, &outcomes);
    Recovery {
        fault: FAULT,
        sent,
        failed: 0,
        to_first_success: first_success_after(&outcomes, completed),
        to_last_ack: Some(to_last_ack),
        bound: BOUND,
    }
}

/// An ADS client of `127.0.0.1:15010` (to be run inside the hub) that
/// subscribes to clusters, listeners and httpbin's routes and then either
/// never reads its stream (`read` false: its HTTP/2 windows, Envoy's
/// smallest, fill) or reads every response and never ACKs one.
async fn stalled_client(node_id: String, read: bool, mut stop: watch::Receiver<bool>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let node = Node {
        id: node_id,
        metadata: Some(
            common::NodeMetadata {
                namespace: Some("demo".into()),
                proxy_config: Some(serde_json::Map::new()),
                ..Default::default()
            }
            .to_struct(),
        ),
        ..Default::default()
    };
    let subscribe = [
        (pilot_load::client::CLUSTER, vec![]),
        (pilot_load::client::LISTENER, vec![]),
        (pilot_load::client::ROUTE, vec![HTTPBIN_ROUTE.to_string()]),
    ];
    for (i, (type_url, names)) in subscribe.into_iter().enumerate() {
        let _ = tx.send(DiscoveryRequest {
            node: (i == 0).then(|| node.clone()),
            type_url: type_url.into(),
            resource_names: names,
            ..Default::default()
        });
    }
    let Ok(endpoint) = tonic::transport::Endpoint::from_shared("http://127.0.0.1:15010") else {
        return;
    };
    let channel = match endpoint
        .initial_stream_window_size(Some(65_535))
        .initial_connection_window_size(Some(65_535))
        .connect()
        .await
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("stalled client {}: connecting: {e}", node.id);
            return;
        }
    };
    let mut client =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(usize::MAX);
    let resp = match client
        .stream_aggregated_resources(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("stalled client {}: opening the stream: {e}", node.id);
            return;
        }
    };
    let mut stream: tonic::Streaming<DiscoveryResponse> = resp.into_inner();
    // The request sender stays alive (the stream stays open) until stop.
    let _requests = tx;
    if read {
        loop {
            tokio::select! {
                m = stream.message() => if !matches!(m, Ok(Some(_))) { break },
                _ = stop.changed() => return,
            }
        }
    }
    let _ = stop.changed().await;
}

/// The stalled clients' proxy ids (`<pod>.<namespace>`, as syncz names them).
const NEVER_READS: &str = "never-reads.demo";
const NEVER_ACKS: &str = "never-acks.demo";

/// A sidecar's node id for proxy id `id` (`<pod>.<namespace>`).
fn node_id(id: &str, ip: &str) -> String {
    format!("sidecar~{ip}~{id}~demo.svc.cluster.local")
}

/// How many config changes the stalled clients miss.
const CHANGES: u64 = 12;
/// How much istiod's RSS may grow while the stalled clients miss
/// [`CHANGES`] pushes (allocator slack, not a queue per push).
const STALLED_RSS_SLACK_KIB: u64 = 32 * 1024;

/// A client that never reads its stream and one that never ACKs stay
/// connected while httpbin's weights change [`CHANGES`] times: every
/// change reaches the three Envoys within the bound, their traffic never
/// fails, and istiod's memory stays flat.
pub fn stalled_xds_clients(dir: &Path) -> Recovery {
    const FAULT: &str = "stalled xDS clients (never read, never ACK)";
    let mesh = start_mesh(dir);
    let traffic = sleep_traffic(&mesh);
    let (stop, stop_rx) = watch::channel(false);
    let clients = mesh.hub.ns.spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            let a = tokio::spawn(stalled_client(
                node_id(NEVER_READS, "198.18.99.1"),
                false,
                stop_rx.clone(),
            ));
            let b = tokio::spawn(stalled_client(
                node_id(NEVER_ACKS, "198.18.99.2"),
                true,
                stop_rx,
            ));
            let _ = tokio::join!(a, b);
        });
    });
    crate::wait_for("both stalled clients connected", BOUND, || {
        syncz(&mesh, |id| id == NEVER_READS || id == NEVER_ACKS).filter(|s| s.len() == 2)
    });
    let pid = mesh.istiod.proc.pid();
    let rss_before = rss_kib(pid);
    let vs = mesh.config_dir.join("istio.yaml");
    let sample = std::fs::read_to_string(&vs).expect("the sample's istio.yaml");
    let mut slowest = Duration::ZERO;
    let mut last_change = Instant::now();
    for i in 1..=CHANGES {
        let v2 = 10 + i * 5;
        write_atomically(&vs, &with_weights(&sample, 100 - v2, v2));
        last_change = Instant::now();
        crate::wait_for(&format!("change {i} at every Envoy"), BOUND, || {
            (every_envoy_has(&mesh, &[100 - v2, v2]) && envoys_synced(&mesh)).then_some(())
        });
        slowest = slowest.max(last_change.elapsed());
    }
    let stalled = syncz(&mesh, |id| id == NEVER_READS || id == NEVER_ACKS).unwrap_or_default();
    assert_eq!(
        stalled.len(),
        2,
        "the stalled clients are still connected: {stalled:?}"
    );
    assert!(
        stalled.values().all(|synced| !synced),
        "neither stalled client ACKed the pushes: {stalled:?}"
    );
    let rss_after = rss_kib(pid);
    eprintln!("istiod RSS {rss_before} KiB before {CHANGES} changes, {rss_after} KiB after");
    assert!(
        rss_after <= rss_before + STALLED_RSS_SLACK_KIB,
        "istiod's RSS grew from {rss_before} KiB to {rss_after} KiB with two stalled clients"
    );
    let _ = stop.send(true);
    let _ = clients.join();
    std::thread::sleep(Duration::from_millis(500));
    let outcomes = traffic.stop();
    let sent = assert_none_failed(FAULT, &outcomes);
    Recovery {
        fault: FAULT,
        sent,
        failed: 0,
        to_first_success: first_success_after(&outcomes, last_change),
        to_last_ack: Some(slowest),
        bound: BOUND,
    }
}

/// Connections per port in [`connection_flood`].
pub const FLOOD: usize = 1000;
/// How far above its level before the flood istiod's RSS may stay once the
/// connections are gone (istiod hands freed pages back every 10 s): a
/// tenth, plus 8 MiB of allocator slack. A flood of this size lifts it by
/// about 15-20 MiB, which stays without that hand-back.
fn flood_rss_tolerance(before_kib: u64) -> u64 {
    before_kib + before_kib / 10 + 8 * 1024
}

/// Floods, one after another.
const FLOOD_ROUNDS: usize = 2;
/// How much more istiod's RSS may be after the last flood than after the
/// first, once the connections are gone.
const FLOOD_REPEAT_SLACK_KIB: u64 = 8 * 1024;

/// The first bytes of a TLS handshake (a real ClientHello) to istiod.
fn client_hello() -> Vec<u8> {
    common::tls::install_crypto_provider();
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from(crate::ISTIOD_SAN).expect("a server name");
    let mut conn =
        rustls::ClientConnection::new(Arc::new(config), name).expect("a TLS client connection");
    let mut out = Vec::new();
    let _ = conn.write_tls(&mut out);
    out
}

/// The HTTP/2 connection preface and an empty SETTINGS frame.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Raises this process's open-file limit to at least `want`.
fn raise_fd_limit(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    #[allow(unsafe_code)]
    // SAFETY: getrlimit/setrlimit on a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max.max(want));
            lim.rlim_max = lim.rlim_max.max(lim.rlim_cur);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Opens [`FLOOD`] connections to each of `ports` inside `ns`, a third
/// silent, a third sending the HTTP/2 preface, a third a TLS ClientHello;
/// returns them open.
fn open_flood(ns: &Netns, ports: &[u16]) -> Vec<TcpStream> {
    let ports = ports.to_vec();
    ns.run(move || {
        let hello = client_hello();
        let mut conns = Vec::new();
        for port in ports {
            for i in 0..FLOOD {
                let Ok(mut c) = TcpStream::connect_timeout(
                    &SocketAddr::from(([127, 0, 0, 1], port)),
                    Duration::from_secs(5),
                ) else {
                    continue;
                };
                let _ = match i % 3 {
                    1 => c.write_all(H2_PREFACE),
                    2 => c.write_all(&hello),
                    _ => Ok(()),
                };
                conns.push(c);
            }
        }
        conns
    })
}

/// 1000 connections opened at once on each of `:15010` and `:15012`, some
/// silent, some with the HTTP/2 preface, some starting TLS, held while a
/// new ADS client asks for its config, then all dropped at once: istiod
/// keeps serving (the new client syncs, a change reaches the Envoys) and
/// its RSS returns near its level before.
pub fn connection_flood(dir: &Path) -> Recovery {
    const FAULT: &str = "1000 connections each on :15010 and :15012, dropped at once";
    raise_fd_limit(4 * FLOOD as u64 + 1024);
    let mesh = start_mesh(dir);
    let traffic = sleep_traffic(&mesh);
    let pid = mesh.istiod.proc.pid();
    // A client once, so the level before includes a served proxy's state.
    {
        let warm = Fleet::start(&mesh.hub.ns, 1);
        crate::wait_for("a client before the flood", BOUND, || warm.converged(None));
    }
    let rss_before = rss_kib(pid);
    let limit = flood_rss_tolerance(rss_before);
    let vs = mesh.config_dir.join("istio.yaml");
    let sample = std::fs::read_to_string(&vs).expect("the sample's istio.yaml");
    let mut levels = Vec::new();
    let mut first_drop = None;
    for round in 0..FLOOD_ROUNDS {
        let conns = open_flood(&mesh.hub.ns, &[15010, 15012]);
        assert!(
            conns.len() >= FLOOD,
            "the flood opened {} connections",
            conns.len()
        );
        let rss_flood = rss_kib(pid);
        let fresh = Fleet::start(&mesh.hub.ns, 1);
        crate::wait_for("a new client's config during the flood", BOUND, || {
            fresh.converged(None)
        });
        drop(fresh);
        drop(conns);
        let dropped = Instant::now();
        let v2 = 30 + 10 * round as u64;
        write_atomically(&vs, &with_weights(&sample, 100 - v2, v2));
        crate::wait_for("the change at every Envoy after the flood", BOUND, || {
            (every_envoy_has(&mesh, &[100 - v2, v2]) && envoys_synced(&mesh)).then_some(())
        });
        let to_last_ack = dropped.elapsed();
        // After the first flood, back near the level that one left: the
        // scavenger hands freed pages back every 10 s, so this is polled,
        // not sampled once.
        let target = levels.first().map_or(limit, |first: &u64| {
            limit.min(first + FLOOD_REPEAT_SLACK_KIB)
        });
        let rss_after = crate::wait_for("istiod's RSS back near its level", BOUND, || {
            let now = rss_kib(pid);
            (now <= target).then_some(now)
        });
        eprintln!(
            "flood {round}: istiod RSS {rss_before} KiB before, {rss_flood} KiB with the flood, {rss_after} KiB after (limit {limit} KiB)"
        );
        levels.push(rss_after);
        first_drop.get_or_insert((dropped, to_last_ack));
    }
    // Memory a flood leaves behind is reused by the next, not added to.
    let (first, last) = (levels[0], levels[levels.len() - 1]);
    assert!(
        last <= first + FLOOD_REPEAT_SLACK_KIB,
        "istiod's RSS after each flood: {levels:?} KiB (each flood must not add more than {FLOOD_REPEAT_SLACK_KIB} KiB)"
    );
    let (dropped, to_last_ack) = first_drop.expect("one flood at least");
    std::thread::sleep(Duration::from_millis(500));
    let outcomes = traffic.stop();
    let sent = assert_none_failed(FAULT, &outcomes);
    Recovery {
        fault: FAULT,
        sent,
        failed: 0,
        to_first_success: first_success_after(&outcomes, dropped),
        to_last_ack: Some(to_last_ack),
        bound: BOUND,
    }
}
