//! xDS push at Istio's published load-test shape (1000 services, 2000 pods,
//! 2000 connected sidecars), scaled down by flags or environment.
//!
//! One run measures, on the same generated mesh:
//! 1. building the push context from a `ConfigStore` snapshot;
//! 2. generating one sidecar's full config (CDS, EDS, LDS, RDS) against the
//!    baseline of only prost-encoding the same resources;
//! 3. the in-process `DiscoveryServer` (plaintext, 127.0.0.1) with P state of
//!    the world ADS clients multiplexed over a few HTTP/2 connections, each
//!    subscribing CDS and LDS (wildcard), EDS and RDS (by name) and ACKing every
//!    response: initial sync, a full push after one Service changed and an
//!    incremental EDS push after one EndpointSlice changed, timed from publish
//!    to each client's ACK, with CPU and resident memory.
//!
//! `cargo bench -p istiod --bench xds_load [-- --services N --clients P ...]`
//! or `XDS_SERVICES`, `XDS_CLIENTS`, `XDS_NAMESPACES`, `XDS_ENDPOINTS`,
//! `XDS_CONNECTIONS`, `XDS_CAP_SECS`. Fails when clients do not converge
//! within the cap.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use istiod::model::{ConfigStore, Decoded, Object, RegistryOptions, Update, decode};
use istiod::xds::context::IstioContext;
use istiod::xds::server::{DiscoveryServer, XdsMetrics};
use istiod::xds::{
    CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, Proxy, PushContext, PushRequest, ROUTE_TYPE,
    Resource,
};
use prost::Message;
use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use proto::pb::envoy::config::listener::v3::Listener;
use proto::pb::envoy::config::route::v3::RouteConfiguration;
use proto::pb::envoy::service::discovery::v3::DiscoveryRequest;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

const TYPES: [&str; 4] = [CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE];
const ALL_TYPES: u8 = 0b1111;
const EDS_ONLY: u8 = 0b0010;
/// Repetitions of the single-proxy measurements; the median is reported.
const REPS: usize = 5;
/// HTTP/2 windows, as large as Envoy's defaults allow, so that a hundred
/// streams sharing one connection are not held back by flow control.
const CONN_WINDOW: u32 = 64 * 1024 * 1024;
const STREAM_WINDOW: u32 = 16 * 1024 * 1024;

struct Shape {
    services: usize,
    namespaces: usize,
    endpoints: usize,
    clients: usize,
    connections: usize,
    cap: Duration,
}

impl Shape {
    fn from_args() -> anyhow::Result<Shape> {
        let args: Vec<String> = std::env::args().collect();
        let get = |flag: &str, env: &str, default: usize| -> anyhow::Result<usize> {
            let from_flag = args
                .iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
                .cloned()
                .or_else(|| {
                    args.iter()
                        .find_map(|a| a.strip_prefix(&format!("{flag}=")).map(str::to_string))
                });
            match from_flag.or_else(|| std::env::var(env).ok()) {
                Some(v) => v
                    .parse()
                    .with_context(|| format!("{flag} / {env}: not a number: {v}")),
                None => Ok(default),
            }
        };
        let shape = Shape {
            services: get("--services", "XDS_SERVICES", 1000)?,
            namespaces: get("--namespaces", "XDS_NAMESPACES", 10)?,
            endpoints: get("--endpoints", "XDS_ENDPOINTS", 2)?,
            clients: get("--clients", "XDS_CLIENTS", 2000)?,
            connections: get("--connections", "XDS_CONNECTIONS", 20)?,
            cap: Duration::from_secs(get("--cap-secs", "XDS_CAP_SECS", 120)? as u64),
        };
        ensure!(shape.services >= 1 && shape.namespaces >= 1 && shape.endpoints >= 1);
        ensure!(shape.clients >= 1 && shape.connections >= 1);
        ensure!(
            shape.clients <= shape.services * shape.endpoints,
            "each client is one of the mesh's pods: at most services x endpoints clients"
        );
        Ok(shape)
    }
}

fn object(v: Value) -> Arc<Object> {
    match decode(v) {
        Ok(Decoded::Object(o)) => Arc::new(o),
        Ok(_) => panic!("not an object"),
        Err(e) => panic!("invalid object: {e:?}"),
    }
}

fn namespace(shape: &Shape, svc: usize) -> String {
    format!("ns-{}", svc % shape.namespaces)
}

fn pod_ip(pod: usize) -> String {
    format!(
        "10.{}.{}.{}",
        128 + pod / 62500,
        (pod / 250) % 250,
        pod % 250 + 1
    )
}

/// The pod index of endpoint `e` of service `s`.
fn pod_index(shape: &Shape, s: usize, e: usize) -> usize {
    s * shape.endpoints + e
}

/// A Service with its Pods and EndpointSlice; `moved` gives endpoint 0 another
/// pod IP (an endpoint-only change).
fn service_objects(shape: &Shape, s: usize, rev: u32, moved: Option<usize>) -> Vec<Arc<Object>> {
    let ns = namespace(shape, s);
    let name = format!("svc-{s}");
    let mut out = vec![object(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {"app": name, "bench/rev": rev.to_string()}},
        "spec": {"clusterIP": format!("10.96.{}.{}", s / 250, s % 250 + 1),
                 "selector": {"app": name},
                 "ports": [{"name": "http", "port": 8000, "targetPort": 8080}]}
    }))];
    let mut eps = Vec::new();
    for e in 0..shape.endpoints {
        let p = match moved {
            Some(m) if e == 0 => m,
            _ => pod_index(shape, s, e),
        };
        let pod = format!("{name}-{e}");
        out.push(object(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": ns,
                         "labels": {"app": name, "version": "v1",
                                    "security.istio.io/tlsMode": "istio"}},
            "spec": {"serviceAccountName": name,
                     "containers": [{"name": "app", "image": "app",
                                     "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": pod_ip(p)}
        })));
        eps.push(
            json!({"addresses": [pod_ip(p)], "conditions": {"ready": true},
                        "targetRef": {"kind": "Pod", "namespace": ns, "name": pod}}),
        );
    }
    out.push(object(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-slice"), "namespace": ns,
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps
    })));
    out
}

fn node_id(shape: &Shape, client: usize) -> String {
    let s = client / shape.endpoints;
    let e = client % shape.endpoints;
    let ns = namespace(shape, s);
    format!(
        "sidecar~{}~svc-{s}-{e}.{ns}~{ns}.svc.cluster.local",
        pod_ip(pod_index(shape, s, e))
    )
}

struct Mem {
    rss_mb: f64,
    hwm_mb: f64,
}

fn mem() -> Mem {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|kb| kb.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    Mem {
        rss_mb: field("VmRSS:"),
        hwm_mb: field("VmHWM:"),
    }
}

/// User plus system CPU time of the whole process, from `/proc/self/stat`
/// (utime and stime, fields 14 and 15, in ticks of Linux's fixed 1/100 s).
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// The single-proxy generation of every type, as the server does it.
fn generate_all(
    ctx: &IstioContext,
    proxy: &Proxy,
    eds: &BTreeSet<String>,
    rds: &BTreeSet<String>,
) -> Vec<Vec<Arc<Resource>>> {
    let none = BTreeSet::new();
    [
        (CLUSTER_TYPE, &none),
        (ENDPOINT_TYPE, eds),
        (LISTENER_TYPE, &none),
        (ROUTE_TYPE, rds),
    ]
    .iter()
    .map(|(t, names)| ctx.generate(proxy, t, names).unwrap())
    .collect()
}

/// The decoded messages of one proxy's config, to re-encode as the baseline.
struct Decoded4 {
    clusters: Vec<Cluster>,
    endpoints: Vec<ClusterLoadAssignment>,
    listeners: Vec<Listener>,
    routes: Vec<RouteConfiguration>,
}

fn decode_all(generated: &[Vec<Arc<Resource>>]) -> Decoded4 {
    let d = |i: usize| generated[i].iter().map(|r| r.resource.value.as_slice());
    Decoded4 {
        clusters: d(0).map(|b| Cluster::decode(b).unwrap()).collect(),
        endpoints: d(1)
            .map(|b| ClusterLoadAssignment::decode(b).unwrap())
            .collect(),
        listeners: d(2).map(|b| Listener::decode(b).unwrap()).collect(),
        routes: d(3)
            .map(|b| RouteConfiguration::decode(b).unwrap())
            .collect(),
    }
}

fn encode_all(d: &Decoded4) -> usize {
    d.clusters
        .iter()
        .map(|m| m.encode_to_vec().len())
        .sum::<usize>()
        + d.endpoints
            .iter()
            .map(|m| m.encode_to_vec().len())
            .sum::<usize>()
        + d.listeners
            .iter()
            .map(|m| m.encode_to_vec().len())
            .sum::<usize>()
        + d.routes
            .iter()
            .map(|m| m.encode_to_vec().len())
            .sum::<usize>()
}

/// One client's ACK of a response.
struct Ack {
    client: usize,
    type_bit: u8,
    version: Arc<str>,
    at: Instant,
}

async fn run_client(
    client: usize,
    channel: Channel,
    node: String,
    eds: Arc<Vec<String>>,
    rds: Arc<Vec<String>>,
    acks: mpsc::UnboundedSender<Ack>,
) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::channel(8);
    let names = |t: &str| -> Vec<String> {
        match t {
            ENDPOINT_TYPE => eds.to_vec(),
            ROUTE_TYPE => rds.to_vec(),
            _ => Vec::new(),
        }
    };
    for t in TYPES {
        tx.send(DiscoveryRequest {
            node: Some(Node {
                id: node.clone(),
                ..Default::default()
            }),
            type_url: t.into(),
            resource_names: names(t),
            ..Default::default()
        })
        .await?;
    }
    let mut stream = AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(usize::MAX)
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await?
        .into_inner();
    let mut versions: HashMap<String, Arc<str>> = HashMap::new();
    while let Some(resp) = stream.message().await? {
        let Some(i) = TYPES.iter().position(|t| *t == resp.type_url) else {
            bail!("unexpected type {}", resp.type_url);
        };
        let version = versions
            .entry(resp.version_info.clone())
            .or_insert_with(|| resp.version_info.as_str().into())
            .clone();
        tx.send(DiscoveryRequest {
            type_url: resp.type_url,
            version_info: resp.version_info,
            response_nonce: resp.nonce,
            resource_names: names(TYPES[i]),
            ..Default::default()
        })
        .await?;
        let _ = acks.send(Ack {
            client,
            type_bit: 1 << i,
            version,
            at: Instant::now(),
        });
    }
    Ok(())
}

/// Per-client convergence for one version: waits until every client has
/// ACKed every type in `mask` at `version`; returns each client's time from
/// `start` to its last such ACK.
async fn converge(
    acks: &mut mpsc::UnboundedReceiver<Ack>,
    clients: usize,
    version: &str,
    mask: u8,
    start: Instant,
    cap: Duration,
) -> anyhow::Result<Vec<Duration>> {
    let mut got = vec![0u8; clients];
    let mut last = vec![Duration::ZERO; clients];
    let mut done = 0;
    let deadline = tokio::time::Instant::from_std(start + cap);
    while done < clients {
        let ack = match tokio::time::timeout_at(deadline, acks.recv()).await {
            Ok(Some(a)) => a,
            Ok(None) => bail!("every client stream ended before convergence"),
            Err(_) => {
                bail!("only {done} of {clients} clients converged on {version} within {cap:?}")
            }
        };
        if &*ack.version != version || got[ack.client] & ack.type_bit != 0 {
            continue;
        }
        got[ack.client] |= ack.type_bit;
        last[ack.client] = last[ack.client].max(ack.at.saturating_duration_since(start));
        if got[ack.client] == mask {
            done += 1;
        }
    }
    Ok(last)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

struct Phase {
    name: &'static str,
    all: Duration,
    p50: Duration,
    p99: Duration,
    cpu: Duration,
    mem: Mem,
}

impl Phase {
    fn new(name: &'static str, mut per_client: Vec<Duration>, cpu: Duration) -> Phase {
        per_client.sort();
        Phase {
            name,
            all: *per_client.last().unwrap(),
            p50: percentile(&per_client, 0.5),
            p99: percentile(&per_client, 0.99),
            cpu,
            mem: mem(),
        }
    }
}

fn main() -> anyhow::Result<()> {
    let shape = Shape::from_args()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .enable_all()
        .build()?;
    runtime.block_on(run(shape, cores))
}

async fn run(shape: Shape, cores: usize) -> anyhow::Result<()> {
    let mem0 = mem();
    println!(
        "xds_load: {} services in {} namespaces, {} endpoints (pods) each = {} pods; {} ADS clients over {} HTTP/2 connections; {} cores; cap {:?}",
        shape.services,
        shape.namespaces,
        shape.endpoints,
        shape.services * shape.endpoints,
        shape.clients,
        shape.connections,
        cores,
        shape.cap
    );

    // 1. The mesh in a ConfigStore, and the push context.
    let store = ConfigStore::new();
    let objects: Vec<Arc<Object>> = (0..shape.services)
        .flat_map(|s| service_objects(&shape, s, 1, None))
        .collect();
    let t = Instant::now();
    store.apply(objects.into_iter().map(Update::Upsert));
    let store_time = t.elapsed();
    let options = RegistryOptions::default();
    let snapshot = store.snapshot();
    let mut builds = Vec::new();
    let mut ctx = None;
    for _ in 0..REPS {
        let t = Instant::now();
        let c = IstioContext::new("bench/1".into(), &snapshot, &options);
        builds.push(t.elapsed());
        ctx = Some(c);
    }
    let ctx = Arc::new(ctx.unwrap());
    let build = median(builds);
    println!(
        "store: {} objects applied in {}; push context build (median of {REPS}): {}",
        snapshot.len(),
        ms(store_time),
        ms(build)
    );

    // 2. One sidecar's full config against prost-encoding it.
    let proxy = Proxy::from_node(&Node {
        id: node_id(&shape, 0),
        ..Default::default()
    })
    .map_err(anyhow::Error::msg)?;
    let none = BTreeSet::new();
    let eds: BTreeSet<String> = ctx
        .generate(&proxy, CLUSTER_TYPE, &none)
        .map_err(anyhow::Error::msg)?
        .into_iter()
        .map(|r| r.name.clone())
        .filter(|n| n.starts_with("outbound|"))
        .collect();
    let rds: BTreeSet<String> = ctx
        .generate(&proxy, ROUTE_TYPE, &none)
        .map_err(anyhow::Error::msg)?
        .into_iter()
        .map(|r| r.name.clone())
        .collect();
    let mut gen_times = Vec::new();
    let mut per_type = vec![Vec::new(); 4];
    let mut generated = Vec::new();
    for _ in 0..REPS {
        let t = Instant::now();
        generated = generate_all(&ctx, &proxy, &eds, &rds);
        gen_times.push(t.elapsed());
        for (i, ty) in TYPES.iter().enumerate() {
            let names = match i {
                1 => &eds,
                3 => &rds,
                _ => &none,
            };
            let t = Instant::now();
            let r = ctx.generate(&proxy, ty, names).unwrap();
            per_type[i].push(t.elapsed());
            std::hint::black_box(r);
        }
    }
    let generate = median(gen_times);
    let per_type: Vec<Duration> = per_type.into_iter().map(median).collect();
    let counts: Vec<usize> = generated.iter().map(Vec::len).collect();
    let bytes: usize = generated
        .iter()
        .flatten()
        .map(|r| r.resource.value.len())
        .sum();
    let decoded = decode_all(&generated);
    let mut enc_times = Vec::new();
    let mut dec_enc_times = Vec::new();
    for _ in 0..REPS {
        let t = Instant::now();
        let n = encode_all(&decoded);
        enc_times.push(t.elapsed());
        ensure!(n == bytes, "re-encoding gave {n} bytes, generated {bytes}");
        let t = Instant::now();
        let d = decode_all(&generated);
        std::hint::black_box(encode_all(&d));
        dec_enc_times.push(t.elapsed());
    }
    let encode = median(enc_times);
    let dec_enc = median(dec_enc_times);
    println!(
        "one sidecar: {} clusters, {} endpoints, {} listeners, {} routes, {:.1} KiB",
        counts[0],
        counts[1],
        counts[2],
        counts[3],
        bytes as f64 / 1024.0
    );
    println!(
        "  generate CDS+EDS+LDS+RDS (median of {REPS}): {} (CDS {}, EDS {}, LDS {}, RDS {})",
        ms(generate),
        ms(per_type[0]),
        ms(per_type[1]),
        ms(per_type[2]),
        ms(per_type[3])
    );
    println!(
        "  baseline prost encode only: {} -> generate is {:.1}x encode; decode+encode: {} -> {:.1}x",
        ms(encode),
        generate.as_secs_f64() / encode.as_secs_f64(),
        ms(dec_enc),
        generate.as_secs_f64() / dec_enc.as_secs_f64()
    );
    println!(
        "  push context build is {:.1}x one sidecar's generation; {} sidecars x generation / {} cores = {} (lower bound for a full push)",
        build.as_secs_f64() / generate.as_secs_f64(),
        shape.clients,
        cores,
        ms(generate * shape.clients as u32 / cores as u32)
    );
    let mem_ctx = mem();

    // 3. The server with P clients.
    let registry = prometheus::Registry::new();
    let metrics = XdsMetrics::new(&registry)?;
    let (_ready, ready_rx) = watch::channel(true);
    let (pushes, push_rx) = watch::channel(Some(PushRequest::new(
        1,
        ctx.clone() as Arc<dyn PushContext>,
        istiod::xds::Updates::everything(),
        Instant::now(),
    )));
    // Istio's PILOT_PUSH_THROTTLE default: min(15 + 5 * cores, 100).
    let throttle = (15 + 5 * cores).min(100);
    let server = DiscoveryServer::new(ready_rx, push_rx, metrics, throttle);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .max_concurrent_streams(Some(u32::MAX))
            .initial_connection_window_size(Some(CONN_WINDOW))
            .initial_stream_window_size(Some(STREAM_WINDOW))
            .add_service(server.into_service())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut channels = Vec::new();
    for _ in 0..shape.connections {
        channels.push(
            Endpoint::from_shared(format!("http://{addr}"))?
                .initial_connection_window_size(Some(CONN_WINDOW))
                .initial_stream_window_size(Some(STREAM_WINDOW))
                .connect()
                .await?,
        );
    }
    let eds_names = Arc::new(eds.iter().cloned().collect::<Vec<_>>());
    let rds_names = Arc::new(rds.iter().cloned().collect::<Vec<_>>());
    let (ack_tx, mut acks) = mpsc::unbounded_channel();
    let cpu0 = cpu();
    let start = Instant::now();
    let finished = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..shape.clients {
        let fut = run_client(
            c,
            channels[c % channels.len()].clone(),
            node_id(&shape, c),
            eds_names.clone(),
            rds_names.clone(),
            ack_tx.clone(),
        );
        let finished = finished.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = fut.await
                && !finished.load(Ordering::Relaxed)
            {
                eprintln!("client {c}: {e:#}");
            }
        }));
    }
    drop(ack_tx);
    let initial = converge(
        &mut acks,
        shape.clients,
        "bench/1",
        ALL_TYPES,
        start,
        shape.cap,
    )
    .await
    .context("initial sync")?;
    let initial = Phase::new(
        "initial sync (connect + full config)",
        initial,
        cpu() - cpu0,
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A full push: one Service changed (a label), a new push context.
    let t = Instant::now();
    let mut changed = service_objects(&shape, 0, 2, None);
    store.apply([Update::Upsert(changed.remove(0))]);
    let ctx2: Arc<dyn PushContext> = Arc::new(IstioContext::new(
        "bench/2".into(),
        &store.snapshot(),
        &options,
    ));
    let rebuild = t.elapsed();
    let cpu0 = cpu();
    let start = Instant::now();
    let first = pushes.borrow().clone().unwrap();
    pushes.send_replace(Some(first.next(
        2,
        ctx2,
        istiod::xds::Updates::everything(),
        start,
    )));
    let full = converge(
        &mut acks,
        shape.clients,
        "bench/2",
        ALL_TYPES,
        start,
        shape.cap,
    )
    .await
    .context("full push")?;
    let full = Phase::new("full push (one Service changed)", full, cpu() - cpu0);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // An incremental EDS push: one endpoint of svc-0 moved to a new IP.
    let ns0 = namespace(&shape, 0);
    let host0 = format!("svc-0.{ns0}.svc.cluster.local");
    let moved = shape.services * shape.endpoints + 1;
    let updates = service_objects(&shape, 0, 2, Some(moved))
        .into_iter()
        .map(Update::Upsert);
    store.apply(updates);
    let ctx3: Arc<dyn PushContext> = Arc::new(IstioContext::new(
        "bench/3".into(),
        &store.snapshot(),
        &options,
    ));
    let cpu0 = cpu();
    let start = Instant::now();
    let second = pushes.borrow().clone().unwrap();
    pushes.send_replace(Some(second.next(
        3,
        ctx3,
        istiod::xds::Updates::eds([host0]),
        start,
    )));
    let inc = converge(
        &mut acks,
        shape.clients,
        "bench/3",
        EDS_ONLY,
        start,
        shape.cap,
    )
    .await
    .context("incremental EDS push")?;
    let inc = Phase::new("incremental EDS (one endpoint moved)", inc, cpu() - cpu0);

    println!(
        "memory: start {:.0} MB; after mesh and contexts {:.0} MB RSS",
        mem0.rss_mb, mem_ctx.rss_mb
    );
    println!(
        "push context rebuild for the change (store apply + build): {}",
        ms(rebuild)
    );
    for p in [&initial, &full, &inc] {
        println!(
            "{}: all {} ACKed in {}; per client p50 {}, p99 {}; CPU {:.2} s ({:.2} cores); RSS {:.0} MB, peak {:.0} MB",
            p.name,
            shape.clients,
            ms(p.all),
            ms(p.p50),
            ms(p.p99),
            p.cpu.as_secs_f64(),
            p.cpu.as_secs_f64() / p.all.as_secs_f64(),
            p.mem.rss_mb,
            p.mem.hwm_mb
        );
    }
    println!(
        "full push: {:.2} ms CPU per sidecar (all 4 types, server and simulated client together); one sidecar's generation alone: {}",
        full.cpu.as_secs_f64() * 1000.0 / shape.clients as f64,
        ms(generate)
    );
    finished.store(true, Ordering::Relaxed);
    for t in tasks {
        t.abort();
    }
    Ok(())
}
