//! istiod's LDS + RDS + CDS generation time for one sidecar proxy (sleep in
//! the sample mesh, with `SERVICES` more services in its namespace) with no
//! EnvoyFilter and with 50, in one run: the filters select the proxy (half
//! by workload selector in its namespace, half from the root namespace) and
//! mix virtual host MERGEs, HTTP filter INSERT_BEFOREs, network filter
//! MERGEs and cluster MERGEs and ADDs. Runs istiod's generators in process
//! (the library the binary runs), timing:
//!
//! - `context`: the push context build (where patch values are decoded);
//! - `cold`: the first generation in a new push context (Sidecar scope
//!   caches empty, as after a config change);
//! - `warm`: a later generation in the same context (scope caches shared,
//!   as for the second proxy of a push).
//!
//! A second table, in the same run, compares DestinationRules on every
//! service (the sample's httpbin and each added one) with consistent
//! hashing and locality failover (`consistentHash`, `localityLbSetting`
//! with `failover`, and the outlier detection failover needs) against the
//! same rules without them, generating EDS too (locality priorities are
//! per proxy there); the Pods sit on Nodes in two zones.
//!
//! `cargo build --release -p tests --bin bench_envoy_filter &&
//! target/release/bench_envoy_filter`. `ROUNDS` (default 30) and `SERVICES`
//! (default 100) set the size. Prints medians and the ratio to the
//! baselines; asserts nothing about speed.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use istiod::model::{ConfigStore, RegistryOptions, Update, parse_file};
use istiod::pushctx::context::IstioContext;
use istiod::pushctx::{Proxy, PushContext};
use istiod::xds::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The sample mesh plus `services` more HTTP services in demo.
fn mesh(services: usize) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../istiod/samples/mesh");
    let mut yaml = String::new();
    for f in ["namespace.yaml", "sleep.yaml", "httpbin.yaml", "istio.yaml"] {
        yaml.push_str(&std::fs::read_to_string(dir.join(f)).unwrap());
        yaml.push_str("\n---\n");
    }
    for i in 0..services {
        yaml.push_str(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: demo}}\nspec:\n  clusterIP: 198.19.{}.{}\n  selector: {{app: svc-{i}}}\n  ports: [{{name: http, port: {}, targetPort: 8080}}]\n---\n",
            1 + i / 200,
            1 + i % 200,
            9000 + i % 20,
        ));
    }
    yaml
}

/// EnvoyFilter number `i`: one of four kinds of patch, in demo (selecting
/// sleep) or in the root namespace.
fn envoy_filter(i: usize) -> String {
    let (ns, selector) = if i.is_multiple_of(2) {
        ("demo", "  workloadSelector: {labels: {app: sleep}}\n")
    } else {
        ("istio-system", "")
    };
    let patch = match i % 4 {
        0 => format!(
            r#"  - applyTo: VIRTUAL_HOST
    match: {{context: SIDECAR_OUTBOUND, routeConfiguration: {{portNumber: 8000}}}}
    patch: {{operation: MERGE, value: {{response_headers_to_add: [{{header: {{key: x-ef-{i}, value: "1"}}}}]}}}}
"#
        ),
        1 => format!(
            r#"  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener: {{filterChain: {{filter: {{name: envoy.filters.network.http_connection_manager, subFilter: {{name: envoy.filters.http.router}}}}}}}}
    patch:
      operation: INSERT_BEFORE
      value:
        name: ef-{i}
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
          mutations: {{response_mutations: [{{append: {{header: {{key: x-ef-{i}, value: "1"}}}}}}]}}
"#
        ),
        2 => r#"  - applyTo: NETWORK_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager}}}
    patch:
      operation: MERGE
      value:
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          server_name: bench
"#
        .to_string(),
        _ => format!(
            r#"  - applyTo: CLUSTER
    match: {{context: SIDECAR_OUTBOUND, cluster: {{portNumber: {}}}}}
    patch: {{operation: MERGE, value: {{connect_timeout: 3s}}}}
  - applyTo: CLUSTER
    patch: {{operation: ADD, value: {{name: ef-{i}, type: STATIC, connect_timeout: 1s}}}}
"#,
            9000 + i % 20
        ),
    };
    format!(
        "apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {{name: ef-{i}, namespace: {ns}}}\nspec:\n{selector}  configPatches:\n{patch}---\n"
    )
}

fn store_of(yaml: &str) -> ConfigStore {
    let store = ConfigStore::new();
    let parsed = parse_file("bench.yaml", yaml).unwrap_or_else(|e| panic!("{e:?}"));
    store.apply(
        parsed
            .objects
            .into_iter()
            .map(|o| Update::Upsert(Arc::new(o))),
    );
    store
}

fn sleep() -> Proxy {
    Proxy {
        proxy_type: common::ProxyType::Sidecar,
        ip: "198.18.0.2".into(),
        ips: vec!["198.18.0.2".into()],
        namespace: "demo".into(),
        interception_mode: common::InterceptionMode::Redirect,
        ..Default::default()
    }
}

/// One LDS + RDS + CDS (+ EDS with `eds`) generation: (time, resources,
/// bytes).
fn generate(ctx: &IstioContext, proxy: &Proxy, eds: bool) -> (Duration, usize, usize) {
    let start = Instant::now();
    let mut out = ctx
        .generate(proxy, LISTENER_TYPE, &BTreeSet::new())
        .unwrap();
    let routes = istiod::xds::lds::route_names(ctx, proxy);
    out.extend(ctx.generate(proxy, ROUTE_TYPE, &routes).unwrap());
    out.extend(ctx.generate(proxy, CLUSTER_TYPE, &BTreeSet::new()).unwrap());
    if eds {
        out.extend(
            ctx.generate(proxy, ENDPOINT_TYPE, &BTreeSet::new())
                .unwrap(),
        );
    }
    let took = start.elapsed();
    let bytes = out.iter().map(|r| r.resource.value.len()).sum();
    (took, out.len(), bytes)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

struct Row {
    filters: usize,
    context: Duration,
    cold: Duration,
    warm: Duration,
    resources: usize,
    bytes: usize,
}

fn measure(filters: usize, rounds: usize, base: &str) -> Row {
    let yaml: String = std::iter::once(base.to_string())
        .chain((0..filters).map(envoy_filter))
        .collect();
    measure_yaml(filters, rounds, &yaml, false)
}

/// The traffic policy parts of every DestinationRule in the
/// load-balancing comparison: with consistent hashing and locality
/// failover, or a plain connection pool.
fn lb_policy(lb: bool) -> &'static [&'static str] {
    if lb {
        &[
            "loadBalancer: {consistentHash: {httpHeaderName: x-user}, localityLbSetting: {failover: [{from: r1, to: r2}]}}",
            "outlierDetection: {consecutive5xxErrors: 3}",
        ]
    } else {
        &["connectionPool: {tcp: {maxConnections: 100}}"]
    }
}

/// `base` with Pods on Nodes in two zones and a DestinationRule on every
/// service (see [`lb_policy`]).
fn lb_mesh(base: &str, services: usize, lb: bool) -> String {
    let parts = lb_policy(lb);
    let block: String = parts.iter().map(|p| format!("    {p}\n")).collect();
    let flow = format!("{{{}}}", parts.join(", "));
    let mut yaml = base
        .replace(
            "    tls:\n      mode: ISTIO_MUTUAL\n",
            &format!("    tls:\n      mode: ISTIO_MUTUAL\n{block}"),
        )
        .replace(
            "  serviceAccountName: sleep\n",
            "  serviceAccountName: sleep\n  nodeName: node-a\n",
        )
        .replacen(
            "  serviceAccountName: httpbin\n",
            "  serviceAccountName: httpbin\n  nodeName: node-a\n",
            1,
        )
        .replacen(
            "  serviceAccountName: httpbin\n  containers",
            "  serviceAccountName: httpbin\n  nodeName: node-b\n  containers",
            1,
        );
    for (node, zone) in [("node-a", "zone-a"), ("node-b", "zone-b")] {
        yaml.push_str(&format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: {node}, labels: {{topology.kubernetes.io/region: r1, topology.kubernetes.io/zone: {zone}}}}}\n---\n"
        ));
    }
    for i in 0..services {
        yaml.push_str(&format!(
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: svc-{i}, namespace: demo}}\nspec:\n  host: svc-{i}\n  trafficPolicy: {flow}\n---\n"
        ));
    }
    yaml
}

fn measure_yaml(label: usize, rounds: usize, yaml: &str, eds: bool) -> Row {
    measure_for(label, rounds, yaml, eds, &sleep())
}

/// `lb_mesh`'s plain rules, plus on every service a second rule with a
/// `workloadSelector` for `app: <app>` (a connection pool of its own).
fn selector_mesh(plain: &str, services: usize, app: &str) -> String {
    let mut yaml = plain.to_string();
    for i in 0..services {
        yaml.push_str(&format!(
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: svc-{i}-{app}, namespace: demo}}\nspec:\n  host: svc-{i}\n  workloadSelector: {{matchLabels: {{app: {app}}}}}\n  trafficPolicy: {{connectionPool: {{tcp: {{maxConnections: 7}}}}}}\n---\n"
        ));
    }
    yaml
}

fn measure_for(label: usize, rounds: usize, yaml: &str, eds: bool, proxy: &Proxy) -> Row {
    let store = store_of(yaml);
    let snapshot = store.snapshot();
    let options = RegistryOptions::default();
    let proxy = proxy.clone();
    let (mut context, mut cold, mut warm) = (Vec::new(), Vec::new(), Vec::new());
    let (mut resources, mut bytes) = (0, 0);
    for round in 0..rounds {
        let start = Instant::now();
        let ctx = IstioContext::new(format!("bench/{round}"), &snapshot, &options);
        context.push(start.elapsed());
        let (t, n, b) = generate(&ctx, &proxy, eds);
        cold.push(t);
        (resources, bytes) = (n, b);
        warm.push(generate(&ctx, &proxy, eds).0);
    }
    Row {
        filters: label,
        context: median(context),
        cold: median(cold),
        warm: median(warm),
        resources,
        bytes,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let rounds = env_usize("ROUNDS", 30).max(1);
    let services = env_usize("SERVICES", 100);
    let sample = mesh(services);
    // One unmeasured pass each, so both cases start with warm allocators.
    measure(0, 1, &sample);
    measure(50, 1, &sample);
    let rows = [measure(0, rounds, &sample), measure(50, rounds, &sample)];
    println!(
        "LDS+RDS+CDS for one sidecar, {} services, {rounds} rounds (medians)",
        services + 3
    );
    println!(
        "{:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "envoyfilters", "context ms", "cold ms", "warm ms", "cold x", "warm x", "resources"
    );
    let base = &rows[0];
    for r in &rows {
        println!(
            "{:>12} {:>12.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10}",
            r.filters,
            ms(r.context),
            ms(r.cold),
            ms(r.warm),
            ms(r.cold) / ms(base.cold),
            ms(r.warm) / ms(base.warm),
            r.resources,
        );
    }
    println!(
        "bytes generated: {} (0 filters), {} (50 filters)",
        rows[0].bytes, rows[1].bytes
    );

    // DestinationRules with and without consistent hashing and locality.
    let plain = lb_mesh(&sample, services, false);
    let hashed = lb_mesh(&sample, services, true);
    measure_yaml(0, 1, &plain, true);
    measure_yaml(1, 1, &hashed, true);
    let rows = [
        measure_yaml(0, rounds, &plain, true),
        measure_yaml(1, rounds, &hashed, true),
    ];
    println!();
    println!(
        "LDS+RDS+CDS+EDS for one sidecar, a DestinationRule on each of {} services, {rounds} rounds (medians)",
        services + 3
    );
    println!(
        "{:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "rules", "context ms", "cold ms", "warm ms", "cold x", "warm x", "resources", "bytes"
    );
    for r in &rows {
        println!(
            "{:>12} {:>12.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10} {:>10}",
            if r.filters == 0 {
                "plain"
            } else {
                "hash+locality"
            },
            ms(r.context),
            ms(r.cold),
            ms(r.warm),
            ms(r.cold) / ms(rows[0].cold),
            ms(r.warm) / ms(rows[0].warm),
            r.resources,
            r.bytes,
        );
    }

    // DestinationRules with a workloadSelector: for another workload (sleep
    // keeps the namespace's rules and shares their scope), and for sleep
    // (a scope of its own).
    let mut labelled = sleep();
    labelled.labels = [("app".to_string(), "sleep".to_string())].into();
    let others = selector_mesh(&plain, services, "web");
    let own = selector_mesh(&plain, services, "sleep");
    measure_for(0, 1, &others, true, &labelled);
    let rows = [
        ("none", measure_for(0, rounds, &plain, true, &labelled)),
        (
            "other app",
            measure_for(0, rounds, &others, true, &labelled),
        ),
        ("this app", measure_for(0, rounds, &own, true, &labelled)),
    ];
    println!();
    println!(
        "LDS+RDS+CDS+EDS for one sidecar (app: sleep), plain rules on {} services, plus selector rules, {rounds} rounds (medians)",
        services + 3
    );
    println!(
        "{:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "selecting", "context ms", "cold ms", "warm ms", "cold x", "warm x", "resources", "bytes"
    );
    for (name, r) in &rows {
        println!(
            "{:>12} {:>12.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10} {:>10}",
            name,
            ms(r.context),
            ms(r.cold),
            ms(r.warm),
            ms(r.cold) / ms(rows[0].1.cold),
            ms(r.warm) / ms(rows[0].1.warm),
            r.resources,
            r.bytes,
        );
    }
}
