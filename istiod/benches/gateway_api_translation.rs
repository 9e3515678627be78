//! The Gateway API's translation to Istio's Gateway and VirtualService, in
//! one run, for two inputs: Istio's own `benchmark-httproute.yaml` golden
//! input (vendored under `istiod/tests/testdata/gateway-api/`), and 1,000
//! HTTPRoutes attached to 10 Gateways (two rules each, 50 Services).
//!
//! For each input it prints the translation alone (the gateway controller's
//! work, `convert`), the push context built from the Gateway API objects
//! (translation included), and the baseline: the push context built from
//! the same routes written as Istio Gateways and VirtualServices (the
//! translation's own output, stored as Istio config), so the ratio is what
//! taking routes through the Gateway API costs istiod per push-context
//! build.
//!
//! `cargo bench -p istiod --bench gateway_api_translation [-- --iterations N]`

#![allow(clippy::unwrap_used)]

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use istiod::model::gateway_api::convert::convert;
use istiod::model::{ConfigStore, RegistryOptions, Snapshot, Update, parse_file};
use istiod::pushctx::context::IstioContext;

/// Istio's benchmark input (`pilot/pkg/config/kube/gateway/testdata`).
const ISTIO_BENCHMARK: &str =
    include_str!("../tests/testdata/gateway-api/benchmark-httproute.yaml");
const DOMAIN: &str = "cluster.local";

/// The Namespaces and Services Istio's benchmark input refers to.
const ISTIO_BENCHMARK_WORLD: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: allowed-1, labels: {istio.io/test-name-part: allowed}}
---
apiVersion: v1
kind: Namespace
metadata: {name: allowed-2, labels: {istio.io/test-name-part: allowed}}
---
apiVersion: v1
kind: Namespace
metadata: {name: default}
---
apiVersion: v1
kind: Namespace
metadata: {name: istio-system}
"#;

fn service(ns: &str, name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\n\
         spec:\n  clusterIP: {ip}\n  selector: {{app: {name}}}\n  ports:\n  - {{name: http, port: 80, targetPort: 8080}}\n"
    )
}

/// Istio's input with the Services it names (every backend of its routes),
/// without its routes' second parent, Istio's retired `kind: Mesh` parent,
/// which this istiod refuses (a mesh route names its Service instead).
fn istio_benchmark() -> String {
    let input = ISTIO_BENCHMARK.replace("  - kind: Mesh\n    name: istio\n", "");
    assert_ne!(
        input, ISTIO_BENCHMARK,
        "the Mesh parents are where they were"
    );
    let mut text = format!("{ISTIO_BENCHMARK_WORLD}\n---\n{input}");
    let mut n = 0;
    for ns in ["allowed-1", "allowed-2", "default", "istio-system"] {
        for svc in ["svc1", "svc2", "svc3", "svc4", "istio-ingressgateway"] {
            n += 1;
            let ip = format!("198.19.{}.{}", n / 250, n % 250 + 1);
            write!(text, "\n---\n{}", service(ns, svc, &ip)).unwrap();
        }
    }
    text
}

/// 1,000 HTTPRoutes in 10 namespaces, route `i` attached to Gateway `i % 10`
/// with its own hostname and two rules, to 50 Services.
fn thousand_routes() -> String {
    let mut text = String::new();
    for g in 0..10 {
        write!(
            text,
            "---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: team-{g}}}\n\
             ---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
             metadata: {{name: gw-{g}, namespace: istio-system}}\n\
             spec:\n  gatewayClassName: istio\n  listeners:\n\
             \x20 - {{name: http, port: 80, protocol: HTTP, hostname: \"*.team-{g}.example.com\", allowedRoutes: {{namespaces: {{from: All}}}}}}\n"
        )
        .unwrap();
    }
    for s in 0..50 {
        write!(
            text,
            "---\n{}",
            service(
                &format!("team-{}", s % 10),
                &format!("svc-{s}"),
                &format!("198.19.1.{}", s + 1)
            )
        )
        .unwrap();
    }
    for i in 0..1000 {
        let g = i % 10;
        let s = (i % 5) * 10 + g;
        write!(
            text,
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
             metadata: {{name: route-{i}, namespace: team-{g}}}\n\
             spec:\n  parentRefs: [{{name: gw-{g}, namespace: istio-system}}]\n\
             \x20 hostnames: [\"r{i}.team-{g}.example.com\"]\n  rules:\n\
             \x20 - matches: [{{path: {{type: PathPrefix, value: /api/{i}}}, headers: [{{name: x-tenant, value: t{i}}}]}}]\n\
             \x20   backendRefs: [{{name: svc-{s}, port: 80}}]\n\
             \x20 - matches: [{{path: {{type: PathPrefix, value: /}}}}]\n\
             \x20   filters: [{{type: RequestHeaderModifier, requestHeaderModifier: {{set: [{{name: x-route, value: r{i}}}]}}}}]\n\
             \x20   backendRefs: [{{name: svc-{s}, port: 80, weight: 90}}, {{name: svc-{}, port: 80, weight: 10}}]\n",
            (s + 10) % 50
        )
        .unwrap();
    }
    text
}

fn snapshot(text: &str) -> std::sync::Arc<Snapshot> {
    let parsed = parse_file("bench.yaml", text).unwrap();
    assert!(parsed.ignored.is_empty(), "{:?}", parsed.ignored);
    let store = ConfigStore::new();
    store.apply(
        parsed
            .objects
            .into_iter()
            .map(|o| Update::Upsert(std::sync::Arc::new(o))),
    );
    store.snapshot()
}

/// The same snapshot with the Gateway API objects replaced by what they
/// translate to, stored as Istio config.
fn as_istio_config(text: &str, snap: &Snapshot) -> (std::sync::Arc<Snapshot>, usize, usize) {
    let out = convert(snap, DOMAIN);
    let (gateways, virtual_services) = (out.gateways.len(), out.virtual_services.len());
    let mut istio = String::new();
    for doc in text.split("\n---") {
        if !doc.contains("gateway.networking.k8s.io") {
            write!(istio, "{doc}\n---").unwrap();
        }
    }
    // Derived names (`<gw>~istio-autogenerated-k8s-gateway~<listener>`) are
    // reserved to the controller: hand-written config gets plain names, and
    // the VirtualServices' gateway references follow.
    let mut renamed = std::collections::HashMap::new();
    for (i, mut doc) in out.documents().into_iter().enumerate() {
        let meta = doc["metadata"].as_object_mut().unwrap();
        // Annotations only mark derived objects; hand-written config has none.
        meta.remove("annotations");
        let name = format!("derived-{i}");
        let old = std::mem::replace(&mut meta["name"], name.clone().into());
        let ns = meta["namespace"].as_str().unwrap().to_string();
        renamed.insert(
            format!("{ns}/{}", old.as_str().unwrap()),
            format!("{ns}/{name}"),
        );
        if let Some(gws) = doc["spec"]
            .get_mut("gateways")
            .and_then(|g| g.as_array_mut())
        {
            for g in gws {
                let new = renamed[g.as_str().unwrap()].clone();
                *g = new.into();
            }
        }
        write!(istio, "\n{}\n---", serde_yaml_ng::to_string(&doc).unwrap()).unwrap();
    }
    (snapshot(&istio), gateways, virtual_services)
}

/// The median over 5 passes of `iterations` runs of `f`.
fn median(iterations: usize, mut f: impl FnMut()) -> Duration {
    let mut passes: Vec<Duration> = (0..5)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iterations {
                f();
            }
            start.elapsed() / iterations as u32
        })
        .collect();
    passes.sort();
    passes[2]
}

fn context(snap: &Snapshot) -> IstioContext {
    IstioContext::new("bench/1".into(), snap, &RegistryOptions::default())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let iterations: usize = args
        .iter()
        .position(|a| a == "--iterations")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("median of 5 passes of {iterations} runs each");
    println!(
        "| input | Gateways / VirtualServices derived | translation alone | push context from the Gateway API | push context from the same Istio config (baseline) | ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, text) in [
        ("Istio's benchmark-httproute.yaml", istio_benchmark()),
        ("1,000 HTTPRoutes on 10 Gateways", thousand_routes()),
    ] {
        let gateway_api = snapshot(&text);
        let (istio, gateways, virtual_services) = as_istio_config(&text, &gateway_api);
        let translate = median(iterations, || {
            std::hint::black_box(convert(&gateway_api, DOMAIN));
        });
        let from_gateway_api = median(iterations, || {
            std::hint::black_box(context(&gateway_api));
        });
        let baseline = median(iterations, || {
            std::hint::black_box(context(&istio));
        });
        println!(
            "| {name} | {gateways} / {virtual_services} | {:.1} µs | {:.1} µs | {:.1} µs | {:.2} × baseline |",
            translate.as_secs_f64() * 1e6,
            from_gateway_api.as_secs_f64() * 1e6,
            baseline.as_secs_f64() * 1e6,
            from_gateway_api.as_secs_f64() / baseline.as_secs_f64()
        );
    }
    println!(
        "load average before {}, after {}",
        load_before.trim(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
}
