//! Push latency and memory of istiod fed by the Kubernetes API (the
//! `tests::kube_api` stand-in, `--kubeconfig`) against the same objects
//! fed from `--configDir`, in the same run.
//!
//! The mesh: S Services in 10 namespaces, each with two Pods and an
//! EndpointSlice of two endpoints, and one VirtualService splitting svc-0's
//! traffic between svc-0 and svc-1. P ADS clients (state of the world, one
//! plaintext gRPC connection each, in this process) are sidecars of the first
//! P Pods; each subscribes CDS and LDS, then EDS for every `outbound|` cluster
//! and RDS for every route its listeners name, and ACKs every response.
//!
//! For each source, after the initial sync and a settling pause:
//! - istiod's VmRSS and VmHWM (`/proc/<pid>/status`);
//! - E EndpointSlice events (one Service scaled from two endpoints to three)
//!   and E VirtualService events (svc-0's weights changed), one at a time:
//!   the time from the write (the stand-in's store, or the YAML file
//!   rewritten) to the last ACK any client sends for the responses the event
//!   caused (every client has ACKed at least one response, then nothing for
//!   a quiet period, which is not counted).
//!
//! `cargo build --release -p tests --bin bench_kube_push -p istiod &&
//! target/release/bench_kube_push [--services S] [--proxies P] [--events E]`
//! Prints a markdown table; asserts nothing about speed.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use prost::Message;
use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::config::listener::v3::Listener;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager,
};
use proto::pb::envoy::service::discovery::v3::DiscoveryRequest;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use serde_json::{Value, json};
use tests::kube_api::KubeApi;
use tests::{Proc, bin, free_port, http_get, wait_for};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const NAMESPACES: usize = 10;
/// No ACK for this long after every client has ACKed once ends an event.
const QUIET: Duration = Duration::from_millis(700);
/// Longest wait for one event's push to reach every client.
const EVENT_CAP: Duration = Duration::from_secs(60);
/// Pause after the initial sync before memory is read.
const SETTLE: Duration = Duration::from_secs(5);

struct Shape {
    services: usize,
    proxies: usize,
    events: usize,
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ns(s: usize) -> String {
    format!("ns-{}", s % NAMESPACES)
}

fn pod_ip(p: usize) -> String {
    format!("10.{}.{}.{}", 128 + p / 62500, (p / 250) % 250, p % 250 + 1)
}

/// Service `s`'s objects; `extra` adds a third endpoint to its slice.
fn service_objects(shape: &Shape, s: usize, extra: bool) -> Vec<Value> {
    let (ns, name) = (ns(s), format!("svc-{s}"));
    let mut out = vec![json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"clusterIP": format!("10.96.{}.{}", s / 250, s % 250 + 1),
                 "selector": {"app": name},
                 "ports": [{"name": "http", "port": 8000, "targetPort": 8080}]}
    })];
    let mut eps = Vec::new();
    for e in 0..2 {
        let pod = format!("{name}-{e}");
        let ip = pod_ip(s * 2 + e);
        out.push(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": ns,
                         "labels": {"app": name, "version": "v1",
                                    "security.istio.io/tlsMode": "istio"}},
            "spec": {"serviceAccountName": name,
                     "containers": [{"name": "app", "image": "app",
                                     "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": ip}
        }));
        eps.push(json!({"addresses": [ip], "conditions": {"ready": true},
                        "targetRef": {"kind": "Pod", "namespace": ns, "name": pod}}));
    }
    if extra {
        eps.push(json!({"addresses": [pod_ip(shape.services * 2 + s)],
                        "conditions": {"ready": true}}));
    }
    out.push(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-slice"), "namespace": ns,
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps
    }));
    out
}

fn virtual_service(weight: u32) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "svc-0-split", "namespace": "ns-0"},
        "spec": {"hosts": ["svc-0.ns-0.svc.cluster.local"],
                 "http": [{"route": [
                     {"destination": {"host": "svc-0.ns-0.svc.cluster.local"}, "weight": weight},
                     {"destination": {"host": "svc-1.ns-1.svc.cluster.local"}, "weight": 100 - weight}
                 ]}]}
    })
}

fn namespaces() -> Vec<Value> {
    (0..NAMESPACES)
        .map(|n| format!("ns-{n}"))
        .chain(["istio-system".to_string()])
        .map(|n| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}))
        .collect()
}

fn yaml(objs: &[Value]) -> String {
    objs.iter()
        .map(|o| serde_yaml_ng::to_string(o).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

fn node_id(p: usize) -> String {
    let (s, e) = (p / 2, p % 2);
    let ns = ns(s);
    format!(
        "sidecar~{}~svc-{s}-{e}.{ns}~{ns}.svc.cluster.local",
        pod_ip(p)
    )
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// One ACK a client sent.
struct Ack {
    client: usize,
    at: Instant,
}

/// The EDS names of a CDS response: its `outbound|` clusters.
fn eds_names<'a>(resources: impl Iterator<Item = &'a [u8]>) -> BTreeSet<String> {
    resources
        .filter_map(|b| Cluster::decode(b).ok())
        .map(|c| c.name)
        .filter(|n| n.starts_with("outbound|"))
        .collect()
}

/// The RDS names the HTTP connection managers of an LDS response refer to.
fn rds_names<'a>(resources: impl Iterator<Item = &'a [u8]>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for l in resources.filter_map(|b| Listener::decode(b).ok()) {
        for chain in l.filter_chains.iter().chain(l.default_filter_chain.iter()) {
            for f in &chain.filters {
                let Some(proto::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(
                    any,
                )) = &f.config_type
                else {
                    continue;
                };
                if !any.type_url.ends_with("HttpConnectionManager") {
                    continue;
                }
                if let Ok(hcm) = HttpConnectionManager::decode(any.value.as_slice())
                    && let Some(http_connection_manager::RouteSpecifier::Rds(rds)) =
                        hcm.route_specifier
                {
                    out.insert(rds.route_config_name);
                }
            }
        }
    }
    out
}

#[derive(Default)]
struct TypeState {
    version: String,
    nonce: String,
    names: BTreeSet<String>,
    subscribed: bool,
}

async fn run_client(
    client: usize,
    addr: SocketAddr,
    acks: mpsc::UnboundedSender<Ack>,
) -> anyhow::Result<()> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .initial_connection_window_size(64 * 1024 * 1024)
        .initial_stream_window_size(16 * 1024 * 1024)
        .connect()
        .await?;
    let (tx, rx) = mpsc::channel(16);
    let node = Node {
        id: node_id(client),
        ..Default::default()
    };
    for t in [CDS, LDS] {
        tx.send(DiscoveryRequest {
            node: Some(node.clone()),
            type_url: t.into(),
            ..Default::default()
        })
        .await?;
    }
    let mut stream = AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(usize::MAX)
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await?
        .into_inner();
    let mut eds = TypeState::default();
    let mut rds = TypeState::default();
    while let Some(resp) = stream.message().await? {
        let names = |s: &TypeState| s.names.iter().cloned().collect::<Vec<_>>();
        let (ack_names, follow) = match resp.type_url.as_str() {
            CDS => (
                vec![],
                Some((
                    eds_names(resp.resources.iter().map(|a| a.value.as_slice())),
                    EDS,
                )),
            ),
            LDS => (
                vec![],
                Some((
                    rds_names(resp.resources.iter().map(|a| a.value.as_slice())),
                    RDS,
                )),
            ),
            EDS => {
                eds.version.clone_from(&resp.version_info);
                eds.nonce.clone_from(&resp.nonce);
                (names(&eds), None)
            }
            RDS => {
                rds.version.clone_from(&resp.version_info);
                rds.nonce.clone_from(&resp.nonce);
                (names(&rds), None)
            }
            t => anyhow::bail!("unexpected type {t}"),
        };
        tx.send(DiscoveryRequest {
            type_url: resp.type_url.clone(),
            version_info: resp.version_info.clone(),
            response_nonce: resp.nonce.clone(),
            resource_names: ack_names,
            ..Default::default()
        })
        .await?;
        let _ = acks.send(Ack {
            client,
            at: Instant::now(),
        });
        if let Some((wanted, t)) = follow {
            let st = if t == EDS { &mut eds } else { &mut rds };
            if !st.subscribed || st.names != wanted {
                st.names = wanted;
                st.subscribed = true;
                tx.send(DiscoveryRequest {
                    type_url: t.into(),
                    version_info: st.version.clone(),
                    response_nonce: st.nonce.clone(),
                    resource_names: st.names.iter().cloned().collect(),
                    ..Default::default()
                })
                .await?;
            }
        }
    }
    Ok(())
}

/// Waits until every client has ACKed at least once since `start` and then
/// nothing more has come for [`QUIET`]; returns the time of the last ACK and
/// the ACK count.
async fn settle(
    acks: &mut mpsc::UnboundedReceiver<Ack>,
    clients: usize,
    start: Instant,
    cap: Duration,
) -> anyhow::Result<(Duration, usize)> {
    let mut seen = vec![false; clients];
    let (mut n_seen, mut count, mut last) = (0, 0, Duration::ZERO);
    let deadline = start + cap;
    loop {
        let wait = if n_seen < clients {
            deadline.saturating_duration_since(Instant::now())
        } else {
            QUIET
        };
        match tokio::time::timeout(wait, acks.recv()).await {
            Ok(Some(a)) => {
                if a.at < start {
                    continue;
                }
                count += 1;
                last = last.max(a.at - start);
                if !seen[a.client] {
                    seen[a.client] = true;
                    n_seen += 1;
                }
            }
            Ok(None) => anyhow::bail!("every client stream ended"),
            Err(_) if n_seen == clients => return Ok((last, count)),
            Err(_) => anyhow::bail!("only {n_seen} of {clients} clients ACKed within {cap:?}"),
        }
        if Instant::now() > deadline + QUIET * 4 {
            anyhow::bail!("pushes did not stop within {cap:?}");
        }
    }
}

fn drain(acks: &mut mpsc::UnboundedReceiver<Ack>) {
    while acks.try_recv().is_ok() {}
}

/// How an event is written.
enum Writer<'a> {
    Kube(&'a KubeApi),
    Files(&'a Path),
}

impl Writer<'_> {
    fn scale(&self, shape: &Shape, s: usize) {
        let objs = service_objects(shape, s, true);
        match self {
            Writer::Kube(api) => {
                api.update(objs.last().unwrap().clone()).unwrap();
            }
            Writer::Files(dir) => {
                std::fs::write(dir.join(format!("svc-{s}.yaml")), yaml(&objs)).unwrap();
            }
        }
    }

    fn weight(&self, w: u32) {
        match self {
            Writer::Kube(api) => {
                api.update(virtual_service(w)).unwrap();
            }
            Writer::Files(dir) => {
                std::fs::write(dir.join("vs.yaml"), yaml(&[virtual_service(w)])).unwrap();
            }
        }
    }
}

struct Run {
    rss_kib: u64,
    hwm_kib: u64,
    sync: Duration,
    eds: Vec<Duration>,
    vs: Vec<Duration>,
    acks_eds: usize,
    acks_vs: usize,
}

fn start_istiod(dir: &Path, source_flag: &str) -> (Proc, SocketAddr) {
    std::fs::create_dir_all(dir).unwrap();
    let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut cmd = Command::new(bin("istiod"));
    cmd.current_dir(dir)
        .arg("discovery")
        .arg(source_flag)
        .arg(format!("--grpcAddr={grpc}"))
        .arg(format!("--secureGRPCAddr=127.0.0.1:{}", free_port()))
        .arg(format!("--httpAddr={http}"))
        .arg("--httpsAddr=")
        .arg(format!("--monitoringAddr=127.0.0.1:{}", free_port()))
        .arg("--meshConfig=./mesh.yaml")
        .env("XDS_AUTH", "false")
        .env("RUST_LOG", "warn");
    let mut proc = Proc::spawn("istiod", cmd, &dir.join("istiod.log"));
    wait_for("istiod /ready", Duration::from_secs(180), || {
        assert!(proc.alive(), "istiod exited:\n{}", proc.log());
        matches!(http_get(http, "/ready"), Ok((200, _))).then_some(())
    });
    (proc, grpc)
}

async fn measure(shape: &Shape, istiod: &Proc, grpc: SocketAddr, w: &Writer<'_>) -> Run {
    let (tx, mut acks) = mpsc::unbounded_channel();
    let start = Instant::now();
    let mut clients = Vec::new();
    for c in 0..shape.proxies {
        let tx = tx.clone();
        clients.push(tokio::spawn(async move {
            if let Err(e) = run_client(c, grpc, tx).await {
                eprintln!("client {c}: {e:#}");
            }
        }));
    }
    drop(tx);
    let (sync, _) = settle(&mut acks, shape.proxies, start, Duration::from_secs(300))
        .await
        .unwrap();
    tokio::time::sleep(SETTLE).await;
    let rss_kib = status_kib(istiod.pid(), "VmRSS:");
    let hwm_kib = status_kib(istiod.pid(), "VmHWM:");
    let (mut eds, mut vs, mut acks_eds, mut acks_vs) = (vec![], vec![], 0, 0);
    for i in 0..shape.events {
        drain(&mut acks);
        let t = Instant::now();
        // Services not among the proxies' own, each scaled once.
        w.scale(shape, shape.services - 1 - i);
        let (d, n) = settle(&mut acks, shape.proxies, t, EVENT_CAP)
            .await
            .unwrap();
        eds.push(d);
        acks_eds += n;
        drain(&mut acks);
        let t = Instant::now();
        w.weight(11 + i as u32 % 80);
        let (d, n) = settle(&mut acks, shape.proxies, t, EVENT_CAP)
            .await
            .unwrap();
        vs.push(d);
        acks_vs += n;
    }
    for c in clients {
        c.abort();
    }
    Run {
        rss_kib,
        hwm_kib,
        sync,
        eds,
        vs,
        acks_eds,
        acks_vs,
    }
}

fn pct(v: &[Duration], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
}

fn main() {
    let shape = Shape {
        services: arg("--services", 1000).clamp(60, 5000),
        proxies: arg("--proxies", 100).clamp(1, 100),
        events: arg("--events", 20).clamp(1, 50),
    };
    assert!(shape.events + shape.proxies / 2 < shape.services);
    let load_start = loadavg();
    let command: Vec<String> = std::env::args().collect();
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut objects: Vec<Value> = namespaces();
    for s in 0..shape.services {
        objects.extend(service_objects(&shape, s, false));
    }
    objects.push(virtual_service(10));
    eprintln!("{} objects", objects.len());

    // Kubernetes: the stand-in, written before istiod starts.
    let kube = {
        let api = KubeApi::start_local();
        for o in &objects {
            api.apply(o.clone()).unwrap();
        }
        let kc = tmp.path().join("kubeconfig");
        api.kubeconfig(&kc);
        let dir = tmp.path().join("kube");
        let (mut istiod, grpc) = start_istiod(&dir, &format!("--kubeconfig={}", kc.display()));
        let run = rt.block_on(measure(&shape, &istiod, grpc, &Writer::Kube(&api)));
        istiod.terminate(Duration::from_secs(15));
        run
    };
    eprintln!("kube source done");

    // Files: one YAML file per Service, one for the namespaces and the VirtualService.
    let files = {
        let config = tmp.path().join("config");
        std::fs::create_dir_all(&config).unwrap();
        std::fs::write(config.join("namespaces.yaml"), yaml(&namespaces())).unwrap();
        for s in 0..shape.services {
            std::fs::write(
                config.join(format!("svc-{s}.yaml")),
                yaml(&service_objects(&shape, s, false)),
            )
            .unwrap();
        }
        std::fs::write(config.join("vs.yaml"), yaml(&[virtual_service(10)])).unwrap();
        let dir = tmp.path().join("files");
        let (mut istiod, grpc) = start_istiod(&dir, &format!("--configDir={}", config.display()));
        let run = rt.block_on(measure(&shape, &istiod, grpc, &Writer::Files(&config)));
        istiod.terminate(Duration::from_secs(15));
        run
    };
    let load_end = loadavg();

    let ratio = |a: f64, b: f64| format!("{:.2}", a / b);
    println!(
        "\n`{}`: {} Services ({} objects), {} proxies, {} events of each kind\n",
        command.join(" "),
        shape.services,
        objects.len(),
        shape.proxies,
        shape.events
    );
    println!("| measure | --kubeconfig (stand-in) | --configDir (baseline) | ratio |");
    println!("|---|---|---|---|");
    let row = |name: &str, k: f64, f: f64, unit: &str| {
        println!(
            "| {name} | {k:.1} {unit} | {f:.1} {unit} | {} |",
            ratio(k, f)
        );
    };
    row(
        "initial sync, all proxies ACKed",
        kube.sync.as_secs_f64() * 1000.0,
        files.sync.as_secs_f64() * 1000.0,
        "ms",
    );
    for (name, p) in [("p50", 0.5), ("p99", 0.99)] {
        row(
            &format!("EndpointSlice event to last ACK, {name}"),
            pct(&kube.eds, p),
            pct(&files.eds, p),
            "ms",
        );
    }
    for (name, p) in [("p50", 0.5), ("p99", 0.99)] {
        row(
            &format!("VirtualService event to last ACK, {name}"),
            pct(&kube.vs, p),
            pct(&files.vs, p),
            "ms",
        );
    }
    row(
        "ACKs per EndpointSlice event",
        kube.acks_eds as f64 / shape.events as f64,
        files.acks_eds as f64 / shape.events as f64,
        "",
    );
    row(
        "ACKs per VirtualService event",
        kube.acks_vs as f64 / shape.events as f64,
        files.acks_vs as f64 / shape.events as f64,
        "",
    );
    row(
        "istiod VmRSS after sync",
        kube.rss_kib as f64 / 1024.0,
        files.rss_kib as f64 / 1024.0,
        "MiB",
    );
    row(
        "istiod VmHWM after sync",
        kube.hwm_kib as f64 / 1024.0,
        files.hwm_kib as f64 / 1024.0,
        "MiB",
    );
    println!("\nload average (1/5/15 min): start {load_start}, end {load_end}");
}
