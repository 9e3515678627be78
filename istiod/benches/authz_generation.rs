//! istiod's listener generation for one sidecar with 0, 10 and 100
//! AuthorizationPolicies selecting it (rules of the common shapes:
//! principals, namespaces, paths, methods, a header condition, a DENY on
//! paths), in one run; the 0-policy case is the baseline.
//!
//! `cargo bench -p istiod --bench authz_generation [-- --iterations N]`

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use istiod::model::{ConfigStore, RegistryOptions, Update, parse_file};
use istiod::pushctx::context::IstioContext;
use istiod::pushctx::{Proxy, PushContext};
use istiod::xds::LISTENER_TYPE;

/// httpbin's Service, Pod and endpoints, as the sample mesh has them.
const MESH: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: httpbin, namespace: demo}
spec:
  clusterIP: 198.19.0.10
  selector: {app: httpbin}
  ports:
  - {name: http, port: 8000, targetPort: 8080}
  - {name: tcp-echo, port: 9000, targetPort: 9000}
---
apiVersion: v1
kind: Pod
metadata:
  name: httpbin-v1
  namespace: demo
  labels: {app: httpbin, version: v1, security.istio.io/tlsMode: istio}
spec:
  serviceAccountName: httpbin
  containers: [{name: httpbin, image: httpbin}]
status: {phase: Running, podIP: 198.18.0.3}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: httpbin-1
  namespace: demo
  labels: {kubernetes.io/service-name: httpbin}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
- {name: tcp-echo, port: 9000, protocol: TCP}
endpoints:
- addresses: [198.18.0.3]
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: demo, name: httpbin-v1}
"#;

/// Policy `i` of a mesh with many: ALLOWs of the common shapes, and one
/// DENY in ten.
pub fn policy(i: usize) -> String {
    if i % 10 == 9 {
        return format!(
            r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: deny-{i}, namespace: demo}}
spec:
  selector: {{matchLabels: {{app: httpbin}}}}
  action: DENY
  rules:
  - to:
    - operation: {{paths: ["/admin-{i}*"]}}
"#
        );
    }
    format!(
        r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: allow-{i}, namespace: demo}}
spec:
  selector: {{matchLabels: {{app: httpbin}}}}
  action: ALLOW
  rules:
  - from:
    - source: {{principals: ["cluster.local/ns/demo/sa/sleep-{i}"]}}
    - source: {{namespaces: ["team-{i}"]}}
    to:
    - operation: {{methods: ["GET", "HEAD"], paths: ["/api/{i}/*", "/status"]}}
    when:
    - key: request.headers[x-tenant]
      values: ["tenant-{i}"]
"#
    )
}

fn context(policies: usize) -> IstioContext {
    let mut text = MESH.to_string();
    for i in 0..policies {
        text.push_str("\n---\n");
        text.push_str(&policy(i));
    }
    let parsed = parse_file("bench.yaml", &text).unwrap();
    assert_eq!(parsed.objects.len(), 3 + policies, "every policy is valid");
    let store = ConfigStore::new();
    store.apply(
        parsed
            .objects
            .into_iter()
            .map(|o| Update::Upsert(std::sync::Arc::new(o))),
    );
    IstioContext::new(
        "bench/1".into(),
        &store.snapshot(),
        &RegistryOptions::default(),
    )
}

fn httpbin() -> Proxy {
    Proxy {
        proxy_type: common::ProxyType::Sidecar,
        ip: "198.18.0.3".into(),
        ips: vec!["198.18.0.3".into()],
        id: "httpbin-v1.demo".into(),
        node_id: "sidecar~198.18.0.3~httpbin-v1.demo~demo.svc.cluster.local".into(),
        namespace: "demo".into(),
        domain: "demo.svc.cluster.local".into(),
        labels: [("app", "httpbin"), ("version", "v1")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        interception_mode: common::InterceptionMode::Redirect,
        ..Default::default()
    }
}

/// (median time per generation, listener bytes) over `passes` passes of
/// `iterations` generations each.
fn measure(
    ctx: &IstioContext,
    proxy: &Proxy,
    iterations: usize,
    passes: usize,
) -> (Duration, usize) {
    let names = BTreeSet::new();
    let bytes: usize = ctx
        .generate(proxy, LISTENER_TYPE, &names)
        .unwrap()
        .iter()
        .map(|r| r.resource.value.len())
        .sum();
    let mut per_pass = Vec::new();
    for _ in 0..passes {
        let start = Instant::now();
        for _ in 0..iterations {
            std::hint::black_box(ctx.generate(proxy, LISTENER_TYPE, &names).unwrap());
        }
        per_pass.push(start.elapsed() / iterations as u32);
    }
    per_pass.sort();
    (per_pass[passes / 2], bytes)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let iterations = args
        .iter()
        .position(|a| a == "--iterations")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let proxy = httpbin();
    let contexts: Vec<(usize, IstioContext)> =
        [0, 10, 100].into_iter().map(|n| (n, context(n))).collect();
    println!(
        "listeners (LDS) for httpbin's sidecar, {iterations} generations per pass, median of 5 passes"
    );
    println!("| policies | µs per generation | listener bytes | time ratio |");
    println!("|---:|---:|---:|---|");
    let mut baseline = None;
    for (n, ctx) in &contexts {
        let (t, bytes) = measure(ctx, &proxy, iterations, 5);
        let base = *baseline.get_or_insert(t);
        println!(
            "| {n} | {:.1} | {bytes} | {:.2} × 0 policies |",
            t.as_secs_f64() * 1e6,
            t.as_secs_f64() / base.as_secs_f64()
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
