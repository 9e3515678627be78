//! One sidecar's configuration at Istio's load-test shape (1000 services,
//! 2000 pods; the mesh `pilot-load` writes), generated in process:
//!
//! 1. building the push context from the store's snapshot;
//! 2. CDS, EDS, LDS and RDS for one sidecar three ways: cold (a new push
//!    context and an empty XDS cache, what the first proxy after istiod's
//!    start pays), the first proxy of its Sidecar scope in a new push
//!    context whose cache is warm (what a push after an unrelated change
//!    costs the first proxy of each scope), and a second proxy of the same
//!    scope in the same push context (what every other proxy pays);
//! 3. the baseline: prost-encoding the same resources.
//!
//! The server, the transport and many proxies are measured by `pilot-load`
//! against the istiod binary (`scripts/bench-scale.sh`).
//!
//! `cargo bench -p istiod --bench xds_generation [-- --services N]`

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use istiod::model::{ConfigStore, Decoded, RegistryOptions, Update, decode};
use istiod::pushctx::cache::XdsCache;
use istiod::pushctx::context::IstioContext;
use istiod::pushctx::{Proxy, PushContext, Resource};
use istiod::xds::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE};
use pilot_load::mesh::{Shape, documents, pod_ip};
use prost::Message;
use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use proto::pb::envoy::config::listener::v3::Listener;
use proto::pb::envoy::config::route::v3::RouteConfiguration;

const TYPES: [&str; 4] = [CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE];
/// Repetitions; the median is reported.
const REPS: usize = 7;

fn arg(flag: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// The proxy of pod `pod`.
fn proxy(shape: &Shape, pod: usize) -> Proxy {
    let (s, e) = shape.pod_service(pod);
    let ns = shape.namespace(s);
    Proxy::from_node(&Node {
        id: format!(
            "sidecar~{}~svc-{s}-{e}.{ns}~{ns}.svc.cluster.local",
            pod_ip(pod)
        ),
        ..Default::default()
    })
    .unwrap()
}

/// Everything a sidecar asks for: CDS and LDS, then EDS for its EDS
/// clusters and RDS for the routes its listeners name.
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

/// Decodes the generated messages, to re-encode them as the baseline.
fn reencode(generated: &[Vec<Arc<Resource>>]) -> impl Fn() -> usize {
    let d = |i: usize| {
        generated[i]
            .iter()
            .map(|r| r.resource.value.clone())
            .collect::<Vec<_>>()
    };
    let clusters: Vec<Cluster> = d(0)
        .iter()
        .map(|b| Cluster::decode(b.as_slice()).unwrap())
        .collect();
    let endpoints: Vec<ClusterLoadAssignment> = d(1)
        .iter()
        .map(|b| ClusterLoadAssignment::decode(b.as_slice()).unwrap())
        .collect();
    let listeners: Vec<Listener> = d(2)
        .iter()
        .map(|b| Listener::decode(b.as_slice()).unwrap())
        .collect();
    let routes: Vec<RouteConfiguration> = d(3)
        .iter()
        .map(|b| RouteConfiguration::decode(b.as_slice()).unwrap())
        .collect();
    move || {
        clusters
            .iter()
            .map(|m| m.encode_to_vec().len())
            .sum::<usize>()
            + endpoints
                .iter()
                .map(|m| m.encode_to_vec().len())
                .sum::<usize>()
            + listeners
                .iter()
                .map(|m| m.encode_to_vec().len())
                .sum::<usize>()
            + routes
                .iter()
                .map(|m| m.encode_to_vec().len())
                .sum::<usize>()
    }
}

fn main() {
    let shape = Shape {
        services: arg("--services", 1000),
        ..Shape::istio_reference()
    };
    let store = ConfigStore::new();
    let objects = documents(&shape).into_iter().map(|v| match decode(v) {
        Ok(Decoded::Object(o)) => Update::Upsert(Arc::new(o)),
        other => panic!("not an object: {other:?}"),
    });
    store.apply(objects);
    let snapshot = store.snapshot();
    let options = RegistryOptions::default();
    let context = |cache: &Arc<XdsCache>, seq: u64| {
        IstioContext::new(format!("bench/{seq}"), &snapshot, &options)
            .with_cache(cache.clone(), seq)
    };
    println!(
        "xds_generation: {} services, {} pods in {} namespaces; {} objects",
        shape.services,
        shape.pods(),
        shape.namespaces,
        snapshot.len()
    );

    let build = median(
        (0..REPS)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(context(&Arc::new(XdsCache::disabled()), 0));
                t.elapsed()
            })
            .collect(),
    );
    let registry = median(
        (0..REPS)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(istiod::model::ServiceRegistry::build(&snapshot, &options));
                t.elapsed()
            })
            .collect(),
    );
    println!(
        "push context build (median of {REPS}): {} (of which the service registry {})",
        ms(build),
        ms(registry)
    );

    // The names a sidecar subscribes to, and the resources it gets.
    let first = proxy(&shape, 0);
    // Pod 20 is in the same namespace as pod 0 (another service).
    let second = proxy(&shape, 2 * shape.namespaces);
    assert_eq!(first.namespace, second.namespace);
    let probe = context(&Arc::new(XdsCache::disabled()), 0);
    let none = BTreeSet::new();
    let eds: BTreeSet<String> = probe
        .generate(&first, CLUSTER_TYPE, &none)
        .unwrap()
        .iter()
        .map(|r| r.name.clone())
        .filter(|n| n.starts_with("outbound|"))
        .collect();
    let rds: BTreeSet<String> = probe
        .generate(&first, ROUTE_TYPE, &none)
        .unwrap()
        .iter()
        .map(|r| r.name.clone())
        .collect();
    let generated = generate_all(&probe, &first, &eds, &rds);
    let counts: Vec<usize> = generated.iter().map(Vec::len).collect();
    let bytes: usize = generated
        .iter()
        .flatten()
        .map(|r| r.resource.value.len())
        .sum();

    let mut cold = Vec::new();
    let mut warm = Vec::new();
    let mut shared = Vec::new();
    let mut per_type_cold = vec![Vec::new(); 4];
    for rep in 0..REPS {
        let cache = Arc::new(XdsCache::default());
        let ctx = context(&cache, 1);
        let t = Instant::now();
        std::hint::black_box(generate_all(&ctx, &first, &eds, &rds));
        cold.push(t.elapsed());
        let t = Instant::now();
        std::hint::black_box(generate_all(&ctx, &second, &eds, &rds));
        shared.push(t.elapsed());
        let next = context(&cache, 2);
        let t = Instant::now();
        std::hint::black_box(generate_all(&next, &first, &eds, &rds));
        warm.push(t.elapsed());
        // Per type, cold.
        let ctx = context(&Arc::new(XdsCache::default()), 3 + rep as u64);
        for (i, ty) in TYPES.iter().enumerate() {
            let names = match i {
                1 => &eds,
                3 => &rds,
                _ => &none,
            };
            let t = Instant::now();
            std::hint::black_box(ctx.generate(&first, ty, names).unwrap());
            per_type_cold[i].push(t.elapsed());
        }
    }
    let encode = reencode(&generated);
    let enc = median(
        (0..REPS)
            .map(|_| {
                let t = Instant::now();
                assert_eq!(std::hint::black_box(encode()), bytes);
                t.elapsed()
            })
            .collect(),
    );
    let (cold, warm, shared) = (median(cold), median(warm), median(shared));
    let per_type: Vec<Duration> = per_type_cold.into_iter().map(median).collect();
    println!(
        "one sidecar: {} clusters, {} load assignments, {} listeners, {} route configurations, {:.1} KiB",
        counts[0],
        counts[1],
        counts[2],
        counts[3],
        bytes as f64 / 1024.0
    );
    println!(
        "  cold (new context, empty cache): {} (CDS {}, EDS {}, LDS {}, RDS {})",
        ms(cold),
        ms(per_type[0]),
        ms(per_type[1]),
        ms(per_type[2]),
        ms(per_type[3])
    );
    println!("  first of its scope, warm cache (next push): {}", ms(warm));
    println!("  second proxy of the scope, same push: {}", ms(shared));
    println!(
        "  baseline prost encode of the same messages: {} -> cold {:.2}x, warm {:.2}x, shared {:.2}x encode",
        ms(enc),
        cold.as_secs_f64() / enc.as_secs_f64(),
        warm.as_secs_f64() / enc.as_secs_f64(),
        shared.as_secs_f64() / enc.as_secs_f64()
    );
}
