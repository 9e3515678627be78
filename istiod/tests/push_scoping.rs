//! The push pipeline's decisions, checked against regeneration from
//! scratch: after each config change the builder publishes a push context
//! whose cached output must equal what a fresh, uncached context
//! generates for every proxy and type (the cache is invalidated by what
//! changed, and by nothing else), and each proxy's push plan must name the
//! types the change can alter for it, nothing for proxies that cannot see
//! it (Istio's `ProxyNeedsPush`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use istiod::mesh::Mesh;
use istiod::model::{ConfigStore, Kind, ObjectKey, RegistryOptions, Update, parse_file};
use istiod::push::{Builder, Pending};
use istiod::pushctx::cache::{CacheSettings, XdsCache};
use istiod::pushctx::context::IstioContext;
use istiod::pushctx::{Proxy, PushContext, PushPlan, Types, Updates};
use istiod::xds::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, NAME_TABLE_TYPE, ROUTE_TYPE};
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::google::protobuf::{Struct, Value, value::Kind as PbKind};

const TYPES: [&str; 5] = [
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
    NAME_TABLE_TYPE,
];

fn service(ns: &str, name: &str, vip: &str, pods: &[(&str, &str)]) -> String {
    let mut out = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{clusterIP: {vip}, selector: {{app: {name}}}, ports: [{{name: http, port: 8000, targetPort: 8080}}]}}\n"
    );
    let mut eps = String::new();
    for (pod, ip) in pods {
        let version = pod.rsplit('-').next().unwrap();
        out.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: {ns}, labels: {{app: {name}, version: {version}, security.istio.io/tlsMode: istio}}}}\nspec: {{serviceAccountName: {name}}}\nstatus: {{phase: Running, podIP: {ip}}}\n"
        ));
        eps.push_str(&format!(
            "- {{addresses: [{ip}], conditions: {{ready: true}}, targetRef: {{kind: Pod, namespace: {ns}, name: {pod}}}}}\n"
        ));
    }
    out.push_str(&format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints:\n{eps}"
    ));
    out
}

fn virtual_service(ns: &str, host: &str, timeout: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {host}, namespace: {ns}}}\nspec: {{hosts: [{host}], http: [{{timeout: {timeout}, route: [{{destination: {{host: {host}, subset: v1}}}}]}}]}}\n"
    )
}

fn destination_rule(ns: &str, host: &str, subsets: &[&str]) -> String {
    let subsets: Vec<String> = subsets
        .iter()
        .map(|s| format!("{{name: {s}, labels: {{version: {s}}}}}"))
        .collect();
    format!(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {host}, namespace: {ns}}}\nspec: {{host: {host}, subsets: [{}]}}\n",
        subsets.join(", ")
    )
}

/// A DestinationRule of `ns` for `host` that applies to `app` only.
fn selector_rule(ns: &str, host: &str, app: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: for-{app}, namespace: {ns}}}\nspec: {{host: {host}, workloadSelector: {{matchLabels: {{app: {app}}}}}, trafficPolicy: {{connectionPool: {{tcp: {{maxConnections: 7}}}}}}}}\n"
    )
}

fn sidecar(ns: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: default, namespace: {ns}}}\nspec: {{egress: [{{hosts: [\"./*\", \"istio-system/*\"]}}]}}\n"
    )
}

/// An EnvoyFilter in `ns` adding a response header on every outbound
/// virtual host and merging every outbound cluster's connect timeout.
fn envoy_filter(ns: &str, selector: &str, header: &str) -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {{name: ef, namespace: {ns}}}
spec:
  {selector}
  configPatches:
  - applyTo: VIRTUAL_HOST
    match: {{context: SIDECAR_OUTBOUND}}
    patch: {{operation: MERGE, value: {{response_headers_to_add: [{{header: {{key: {header}, value: "1"}}}}]}}}}
  - applyTo: CLUSTER
    match: {{context: SIDECAR_OUTBOUND}}
    patch: {{operation: MERGE, value: {{connect_timeout: 3s}}}}
"#
    )
}

fn s(v: &str) -> Value {
    Value {
        kind: Some(PbKind::StringValue(v.into())),
    }
}

fn proxy(pod: &str, ns: &str, ip: &str, app: &str) -> Proxy {
    let labels = Struct {
        fields: [("app".to_string(), s(app))].into_iter().collect(),
    };
    let fields: BTreeMap<String, Value> = [
        ("NAMESPACE".to_string(), s(ns)),
        ("INSTANCE_IPS".to_string(), s(ip)),
        ("DNS_CAPTURE".to_string(), s("true")),
        (
            "LABELS".to_string(),
            Value {
                kind: Some(PbKind::StructValue(labels)),
            },
        ),
    ]
    .into_iter()
    .collect();
    Proxy::from_node(&Node {
        id: format!("sidecar~{ip}~{pod}.{ns}~{ns}.svc.cluster.local"),
        metadata: Some(Struct {
            fields: fields.into_iter().collect(),
        }),
        ..Default::default()
    })
    .unwrap()
}

struct Mesh2 {
    store: ConfigStore,
    builder: Builder,
    cache: Arc<XdsCache>,
    seq: u64,
    ctx: Arc<IstioContext>,
}

impl Mesh2 {
    /// Two namespaces: `a` (svc-a, svc-a2, a VirtualService and a
    /// DestinationRule for svc-a) and `b` (svc-b).
    fn new() -> Mesh2 {
        let store = ConfigStore::new();
        let cache = Arc::new(XdsCache::new(CacheSettings::default(), None));
        let (_tx, mesh) = tokio::sync::watch::channel(Arc::new(Mesh::default()));
        let mut builder = Builder::new(
            store.clone(),
            RegistryOptions::default(),
            mesh,
            Arc::default(),
            cache.clone(),
        );
        let mut m = Mesh2 {
            ctx: builder.initial(1),
            store,
            builder,
            cache,
            seq: 1,
        };
        m.apply(&[
            service(
                "a",
                "svc-a",
                "198.19.1.1",
                &[("svc-a-v1", "198.18.1.1"), ("svc-a-v2", "198.18.1.2")],
            ),
            service("a", "svc-a2", "198.19.1.2", &[("svc-a2-v1", "198.18.1.3")]),
            service(
                "b",
                "svc-b",
                "198.19.2.1",
                &[("svc-b-v1", "198.18.2.1"), ("svc-b-v2", "198.18.2.2")],
            ),
            virtual_service("a", "svc-a", "5s"),
            destination_rule("a", "svc-a", &["v1", "v2"]),
        ]);
        m
    }

    /// Applies YAML documents; returns the push's updates.
    fn apply(&mut self, docs: &[String]) -> Arc<Updates> {
        let objects = docs
            .iter()
            .flat_map(|d| parse_file("test.yaml", d).unwrap().objects)
            .map(|o| Update::Upsert(Arc::new(o)));
        let batch = self.store.apply(objects).expect("a change");
        self.build(&Pending::from_batch(&batch))
    }

    fn delete(&mut self, key: ObjectKey) -> Arc<Updates> {
        let batch = self.store.apply([Update::Delete(key)]).expect("a change");
        self.build(&Pending::from_batch(&batch))
    }

    fn build(&mut self, pending: &Pending) -> Arc<Updates> {
        self.seq += 1;
        let (ctx, updates) = self.builder.build(self.seq, pending);
        self.ctx = ctx;
        Arc::new(updates)
    }

    fn proxies() -> Vec<Proxy> {
        vec![
            proxy("svc-a-v1", "a", "198.18.1.1", "svc-a"),
            proxy("svc-a2-v1", "a", "198.18.1.3", "svc-a2"),
            proxy("svc-b-v1", "b", "198.18.2.1", "svc-b"),
        ]
    }

    /// Every proxy's every type from the cached context equals a fresh,
    /// uncached context's.
    fn assert_cache_agrees(&self, after: &str) {
        let fresh = IstioContext::new(
            "fresh".into(),
            &self.store.snapshot(),
            &RegistryOptions::default(),
        )
        .with_cache(Arc::new(XdsCache::disabled()), 0);
        for p in Self::proxies() {
            for t in TYPES {
                let none = BTreeSet::new();
                let cached = self.ctx.generate(&p, t, &none).unwrap();
                let want = fresh.generate(&p, t, &none).unwrap();
                let cached: Vec<_> = cached.iter().map(|r| (&r.name, &r.resource)).collect();
                let want: Vec<_> = want.iter().map(|r| (&r.name, &r.resource)).collect();
                assert_eq!(cached, want, "{t} of {} after {after}", p.id);
            }
        }
    }

    fn plan(&self, p: &Proxy, updates: &Arc<Updates>) -> PushPlan {
        self.ctx.plan_push(p, std::slice::from_ref(updates))
    }
}

fn hosts(h: &[&str]) -> Option<BTreeSet<String>> {
    Some(h.iter().map(|s| s.to_string()).collect())
}

#[test]
fn cached_generation_equals_fresh_generation_after_every_change() {
    let mut m = Mesh2::new();
    m.assert_cache_agrees("the initial mesh");
    // Everyone generated: the second reading of the same push hits.
    let before = m.cache.stats();
    m.assert_cache_agrees("a second reading");
    let after = m.cache.stats();
    assert_eq!(after.misses, before.misses, "nothing new was built");
    assert!(after.hits > before.hits);

    let edits: Vec<(&str, Vec<String>)> = vec![
        ("a VirtualService edit", vec![virtual_service("a", "svc-a", "7s")]),
        ("a subset added", vec![destination_rule("a", "svc-a", &["v1", "v2", "v3"])]),
        (
            "an endpoint move",
            vec![service("b", "svc-b", "198.19.2.1", &[("svc-b-v1", "198.18.2.9"), ("svc-b-v2", "198.18.2.2")])],
        ),
        (
            "a port change",
            vec![service("a", "svc-a2", "198.19.1.2", &[("svc-a2-v1", "198.18.1.3")]).replace("port: 8000", "port: 9000")],
        ),
        ("a Sidecar in b", vec![sidecar("b")]),
        (
            "a PeerAuthentication in a",
            vec!["apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: default, namespace: a}\nspec: {mtls: {mode: DISABLE}}\n".to_string()],
        ),
        ("a DestinationRule in b for svc-a", vec![destination_rule("b", "svc-a.a.svc.cluster.local", &["v1"])]),
        ("a DestinationRule in a for svc-b selecting svc-a", vec![selector_rule("a", "svc-b.b.svc.cluster.local", "svc-a")]),
        ("the selector rule now selecting svc-a2", vec![selector_rule("a", "svc-b.b.svc.cluster.local", "svc-a").replace("app: svc-a}", "app: svc-a2}")]),
        ("an EnvoyFilter in a", vec![envoy_filter("a", "workloadSelector: {labels: {app: svc-a}}", "x-a")]),
        ("an EnvoyFilter in a edited", vec![envoy_filter("a", "", "x-a2")]),
        ("an EnvoyFilter in the root namespace", vec![envoy_filter("istio-system", "", "x-root")]),
    ];
    for (what, docs) in edits {
        m.apply(&docs);
        m.assert_cache_agrees(what);
    }
    m.delete(ObjectKey::new(Kind::VirtualService, "a", "svc-a"));
    m.assert_cache_agrees("the VirtualService deleted");
    m.delete(ObjectKey::new(Kind::EnvoyFilter, "a", "ef"));
    m.assert_cache_agrees("the EnvoyFilter in a deleted");
    m.delete(ObjectKey::new(Kind::Service, "b", "svc-b"));
    m.assert_cache_agrees("svc-b deleted");
    assert!(
        m.cache.stats().evictions_clear > 0,
        "changes cleared entries"
    );
}

#[test]
fn a_change_reaches_only_the_proxies_that_can_see_it_with_only_the_types_it_alters() {
    let mut m = Mesh2::new();
    m.apply(&[sidecar("b")]);
    let [a, a2, b] = <[Proxy; 3]>::try_from(Mesh2::proxies()).unwrap();

    // A VirtualService in namespace a: RDS for a's proxies; nothing for b,
    // whose Sidecar sees only its own namespace.
    let u = m.apply(&[virtual_service("a", "svc-a", "9s")]);
    assert_eq!(m.plan(&a, &u).types, Types::RDS);
    assert_eq!(m.plan(&a2, &u).types, Types::RDS);
    assert!(m.plan(&b, &u).is_empty(), "b cannot see namespace a");

    // An endpoint of svc-a moves: EDS for svc-a's clusters only, for the
    // proxies that see it; the moved endpoint's own proxy (svc-a-v1 is now
    // elsewhere) and the new IP's get everything.
    let u = m.apply(&[service(
        "a",
        "svc-a",
        "198.19.1.1",
        &[("svc-a-v1", "198.18.1.9"), ("svc-a-v2", "198.18.1.2")],
    )]);
    let plan = m.plan(&a2, &u);
    assert_eq!(plan.types, Types::EDS);
    assert_eq!(plan.eds_hosts, hosts(&["svc-a.a.svc.cluster.local"]));
    assert!(plan.incremental());
    assert!(m.plan(&b, &u).is_empty());
    assert_eq!(m.plan(&a, &u).types, Types::ALL, "its own workload changed");

    // A DestinationRule: clusters and endpoints, and the listeners and
    // routes that carry its hash policies, for the proxies that see its
    // host.
    let u = m.apply(&[destination_rule("a", "svc-a", &["v1"])]);
    let plan = m.plan(&a2, &u);
    assert_eq!(
        plan.types,
        Types::CDS | Types::EDS | Types::LDS | Types::RDS
    );
    assert_eq!(plan.eds_hosts, None);
    assert!(m.plan(&b, &u).is_empty());

    // A rule with a workloadSelector: only its own namespace's proxies
    // that see the host (it decides which rule each of them gets), never
    // another namespace's, though b's proxies see svc-b.
    let u = m.apply(&[selector_rule("a", "svc-b.b.svc.cluster.local", "svc-a")]);
    assert!(m.plan(&a, &u).types.contains(Types::CDS));
    assert!(m.plan(&a2, &u).types.contains(Types::CDS));
    assert!(m.plan(&b, &u).is_empty(), "a selector rule is not exported");

    // A Service in b: everything for b's proxies; namespace a sees b's
    // services (no Sidecar there), so a's proxies get it too.
    let u = m.apply(&[service(
        "b",
        "svc-b",
        "198.19.2.1",
        &[("svc-b-v1", "198.18.2.1"), ("svc-b-v2", "198.18.2.2")],
    )
    .replace("port: 8000", "port: 8001")]);
    assert_eq!(m.plan(&b, &u).types, Types::ALL);
    assert_eq!(m.plan(&a2, &u).types, Types::ALL);

    // An AuthorizationPolicy in b: listeners of b's proxies only.
    let u = m.apply(&["apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: deny, namespace: b}\nspec: {}\n".to_string()]);
    assert_eq!(m.plan(&b, &u).types, Types::LDS);
    assert!(m.plan(&a, &u).is_empty());

    // An EnvoyFilter in a: listeners, routes and clusters of a's proxies
    // (patched after the cache, so nothing cached is cleared); one in the
    // root namespace: every proxy's (a CDS push brings EDS along).
    let all_but_nds = Types::LDS | Types::RDS | Types::CDS | Types::EDS;
    let u = m.apply(&[envoy_filter("a", "", "x-a")]);
    assert_eq!(m.plan(&a, &u).types, all_but_nds);
    assert_eq!(m.plan(&a2, &u).types, all_but_nds);
    assert!(m.plan(&b, &u).is_empty());
    let u = m.apply(&[envoy_filter("istio-system", "", "x-root")]);
    assert_eq!(m.plan(&b, &u).types, all_but_nds);

    // The Sidecar of b removed: everything for b's proxies, nothing for a's.
    let u = m.delete(ObjectKey::new(Kind::Sidecar, "b", "default"));
    assert_eq!(m.plan(&b, &u).types, Types::ALL);
    assert!(m.plan(&a, &u).is_empty());

    // A deleted service reaches those that saw it.
    let u = m.delete(ObjectKey::new(Kind::Service, "a", "svc-a2"));
    assert_eq!(m.plan(&b, &u).types, Types::ALL);
}
