//! Golden xDS for the sample mesh: the CDS, LDS, RDS and EDS istiod
//! generates for each Pod of `istiod/samples/mesh`, as checked-in JSON
//! under `tests/testdata/sample-golden/<pod>/<type>.json`.
//!
//! The sample is loaded as the `istiod` binary loads a config directory
//! (the file source into the config store, the default mesh config and
//! registry options); each Pod's proxy is parsed from the xDS node its
//! pilot-agent would send. RDS asks for the route names the listeners
//! use, EDS for the clusters that take their endpoints from EDS.
//!
//! Resources are rendered as canonical protobuf JSON (every `Any`
//! expanded with its `@type`, from Envoy's own protos compiled at test
//! time), object keys sorted, resources sorted by name. Nothing in the
//! generated resources is known to vary between runs today; `normalise`
//! still replaces the fields that would (`versionInfo`, `nonce`,
//! timestamps) with `"<normalised>"`, so a golden never pins them.
//!
//! A mismatch fails with the first differing lines.
//! `UPDATE_GOLDEN=1 cargo test -p istiod --test sample_golden` rewrites the
//! files; a change to them in a commit must be an intended change of the
//! generated configuration.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use istiod::mesh::MeshConfig;
use istiod::model::{ConfigStore, RegistryOptions};
use istiod::pushctx::context::IstioContext;
use istiod::pushctx::{Proxy, PushContext};
use istiod::source::FileSource;
use istiod::xds::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE};
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use proto::pb::envoy::config::cluster::v3::{Cluster, cluster};
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::config::listener::v3::{Filter, Listener, filter};
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager,
};
use proto::pb::google::protobuf::{Struct, Value as PbValue, value::Kind};
use serde_json::Value;

/// What replaces a value that may differ between runs.
const PLACEHOLDER: &str = "<normalised>";

/// Keys whose values are not part of the configuration's meaning.
const VOLATILE_KEYS: [&str; 4] = ["versionInfo", "nonce", "lastUpdated", "generatedAt"];

const UPDATE_HINT: &str = "UPDATE_GOLDEN=1 cargo test -p istiod --test sample_golden";

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn sample_dir() -> PathBuf {
    manifest_dir().join("samples/mesh")
}

fn golden_dir() -> PathBuf {
    manifest_dir().join("tests/testdata/sample-golden")
}

/// The sample loaded as istiod loads a config directory.
fn sample_context() -> IstioContext {
    let store = ConfigStore::new();
    let source = FileSource::new(sample_dir(), store.clone());
    source.reload().expect("the sample directory reads");
    assert!(
        source.errors().is_empty(),
        "the sample is valid: {:?}",
        source.errors()
    );
    IstioContext::new(
        "golden/1".into(),
        &store.snapshot(),
        &RegistryOptions::default(),
    )
    .with_mesh(MeshConfig::default())
}

/// The Pods of the sample, by name, as parsed YAML.
fn sample_pods() -> BTreeMap<String, serde_json::Value> {
    let mut pods = BTreeMap::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(sample_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let v: Value = serde::Deserialize::deserialize(doc).unwrap();
            if v["kind"] == "Pod" {
                let name = v["metadata"]["name"].as_str().unwrap().to_string();
                pods.insert(name, v);
            }
        }
    }
    pods
}

fn pb_string(s: &str) -> PbValue {
    PbValue {
        kind: Some(Kind::StringValue(s.into())),
    }
}

/// The proxy of a Pod, parsed from the node its pilot-agent sends.
fn pod_proxy(pod: &Value) -> Proxy {
    let name = pod["metadata"]["name"].as_str().unwrap();
    let namespace = pod["metadata"]["namespace"].as_str().unwrap();
    let ip = pod["status"]["podIP"].as_str().unwrap();
    let labels = pod["metadata"]["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), pb_string(v.as_str().unwrap())))
                .collect()
        })
        .unwrap_or_default();
    let mut fields = BTreeMap::from([
        ("NAMESPACE".to_string(), pb_string(namespace)),
        ("INSTANCE_IPS".to_string(), pb_string(ip)),
        ("INTERCEPTION_MODE".to_string(), pb_string("REDIRECT")),
        ("CLUSTER_ID".to_string(), pb_string("Kubernetes")),
        (
            "LABELS".to_string(),
            PbValue {
                kind: Some(Kind::StructValue(Struct { fields: labels })),
            },
        ),
    ]);
    if let Some(sa) = pod["spec"]["serviceAccountName"].as_str() {
        fields.insert("SERVICE_ACCOUNT".into(), pb_string(sa));
    }
    let node = Node {
        id: format!("sidecar~{ip}~{name}.{namespace}~{namespace}.svc.cluster.local"),
        metadata: Some(Struct {
            fields: fields.into_iter().collect(),
        }),
        ..Default::default()
    };
    Proxy::from_node(&node).unwrap()
}

/// Envoy's protos (shipped in the `envoy-types` package), compiled once.
fn envoy_pool() -> &'static DescriptorPool {
    static POOL: std::sync::OnceLock<DescriptorPool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let root = envoy_types_protos();
        let includes: Vec<PathBuf> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_dir())
            .collect();
        let api = root.join("data-plane-api");
        let mut files: Vec<PathBuf> = walk_protos(&api.join("envoy"))
            .into_iter()
            .map(|p| p.strip_prefix(&api).unwrap().to_path_buf())
            .collect();
        files.sort();
        compile_envoy_protos(&includes, files)
    })
}

/// One pool of every file that compiles. A relative type reference
/// resolves against every package already loaded (protobuf's scoping), so
/// a package such as `envoy.extensions.config.*` makes `config.core.v3.X`
/// unresolvable in files compiled after it: the files that fail are
/// compiled again first, until no more of them succeed. Files that never
/// compile define nothing istiod sends; a type missing from the pool fails
/// the rendering by name.
fn compile_envoy_protos(includes: &[PathBuf], mut order: Vec<PathBuf>) -> DescriptorPool {
    let mut failed_before = usize::MAX;
    loop {
        let mut compiler = protox::Compiler::new(includes).unwrap();
        compiler.include_imports(true);
        let (ok, failed): (Vec<PathBuf>, Vec<PathBuf>) = order
            .into_iter()
            .partition(|f| compiler.open_file(f).is_ok());
        if failed.is_empty() || failed.len() >= failed_before {
            return compiler.descriptor_pool();
        }
        failed_before = failed.len();
        order = failed.into_iter().chain(ok).collect();
    }
}

fn walk_protos(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk_protos(&p));
        } else if p.extension().is_some_and(|x| x == "proto") {
            out.push(p);
        }
    }
    out
}

/// The `proto` directory of the `envoy-types` package the workspace builds
/// with: the version in `Cargo.lock`, unpacked in cargo's registry.
fn envoy_types_protos() -> PathBuf {
    let lock = std::fs::read_to_string(manifest_dir().join("../Cargo.lock")).unwrap();
    let version = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"envoy-types\"\n"))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
        .map(|v| v.trim_matches('"').to_string())
        .expect("Cargo.lock names envoy-types");
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cargo"));
    let package = format!("envoy-types-{version}");
    std::fs::read_dir(cargo_home.join("registry/src"))
        .unwrap()
        .map(|e| e.unwrap().path().join(&package).join("proto"))
        .find(|p| p.is_dir())
        .unwrap_or_else(|| panic!("{package} is unpacked under {}", cargo_home.display()))
}

/// A resource as canonical protobuf JSON, keys sorted, volatile values
/// replaced.
fn to_json(type_url: &str, bytes: &[u8]) -> Value {
    let pool = envoy_pool();
    let full_name = type_url.rsplit('/').next().unwrap();
    let desc = pool
        .get_message_by_name(full_name)
        .unwrap_or_else(|| panic!("{full_name} is in Envoy's protos"));
    let msg = DynamicMessage::decode(desc, bytes).unwrap();
    let options = SerializeOptions::new().stringify_64_bit_integers(false);
    let mut v = msg
        .serialize_with_options(serde_json::value::Serializer, &options)
        .unwrap();
    normalise(&mut v);
    sort_keys(v)
}

/// Replaces the values of `VOLATILE_KEYS` anywhere in `v`.
fn normalise(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, val) in m.iter_mut() {
                if VOLATILE_KEYS.contains(&k.as_str()) {
                    *val = Value::String(PLACEHOLDER.into());
                } else {
                    normalise(val);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(normalise),
        _ => {}
    }
}

/// The same value with every object's keys in order, whatever map type
/// `serde_json` was built with.
fn sort_keys(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<String, Value> =
                m.into_iter().map(|(k, v)| (k, sort_keys(v))).collect();
            Value::Object(sorted.into_iter().collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(sort_keys).collect()),
        other => other,
    }
}

/// The RDS names the listeners' HTTP connection managers ask for.
fn rds_names(listeners: &[std::sync::Arc<istiod::pushctx::Resource>]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for r in listeners {
        let l = Listener::decode(r.resource.value.as_slice()).unwrap();
        let filters = l
            .filter_chains
            .iter()
            .chain(l.default_filter_chain.iter())
            .flat_map(|c| c.filters.iter());
        for f in filters {
            if let Some(hcm) = hcm(f)
                && let Some(http_connection_manager::RouteSpecifier::Rds(rds)) = hcm.route_specifier
            {
                names.insert(rds.route_config_name);
            }
        }
    }
    names
}

fn hcm(f: &Filter) -> Option<HttpConnectionManager> {
    match &f.config_type {
        Some(filter::ConfigType::TypedConfig(a))
            if a.type_url.ends_with(".HttpConnectionManager") =>
        {
            Some(HttpConnectionManager::decode(a.value.as_slice()).unwrap())
        }
        _ => None,
    }
}

/// The clusters that take their endpoints from EDS (their service name,
/// else their own name).
fn eds_names(clusters: &[std::sync::Arc<istiod::pushctx::Resource>]) -> BTreeSet<String> {
    clusters
        .iter()
        .map(|r| Cluster::decode(r.resource.value.as_slice()).unwrap())
        .filter(|c| {
            matches!(
                c.cluster_discovery_type,
                Some(cluster::ClusterDiscoveryType::Type(t)) if t == cluster::DiscoveryType::Eds as i32
            )
        })
        .map(|c| {
            c.eds_cluster_config
                .as_ref()
                .map(|e| e.service_name.clone())
                .filter(|s| !s.is_empty())
                .unwrap_or(c.name)
        })
        .collect()
}

/// Every resource of each type for one proxy, as pretty JSON, by file name.
fn render(ctx: &IstioContext, proxy: &Proxy) -> BTreeMap<&'static str, String> {
    let generate = |type_url: &str, names: &BTreeSet<String>| {
        let mut rs = ctx
            .generate(proxy, type_url, names)
            .unwrap_or_else(|e| panic!("{type_url} for {}: {e}", proxy.id));
        rs.sort_by(|a, b| a.name.cmp(&b.name));
        rs
    };
    let none = BTreeSet::new();
    let clusters = generate(CLUSTER_TYPE, &none);
    let listeners = generate(LISTENER_TYPE, &none);
    let routes = generate(ROUTE_TYPE, &rds_names(&listeners));
    let endpoints = generate(ENDPOINT_TYPE, &eds_names(&clusters));
    let json = |rs: &[std::sync::Arc<istiod::pushctx::Resource>]| {
        let items: Vec<Value> = rs
            .iter()
            .map(|r| {
                assert!(!r.name.is_empty(), "every resource has a name");
                serde_json::json!({"name": r.name, "resource": to_json(&r.resource.type_url, &r.resource.value)})
            })
            .collect();
        let mut s = serde_json::to_string_pretty(&Value::Array(items)).unwrap();
        s.push('\n');
        s
    };
    BTreeMap::from([
        ("cds", json(&clusters)),
        ("lds", json(&listeners)),
        ("rds", json(&routes)),
        ("eds", json(&endpoints)),
    ])
}

/// The first differing lines of two texts, as a short unified-style diff:
/// three lines of context, then up to eight lines removed and added, up
/// to where the texts agree again.
fn first_difference(want: &str, got: &str) -> String {
    let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let Some(at) = (0..w.len().max(g.len())).find(|&i| w.get(i) != g.get(i)) else {
        return "(the texts differ only in line endings)".into();
    };
    // The lines both end with, after the first difference.
    let same_tail = w[at..]
        .iter()
        .rev()
        .zip(g[at..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    // Where the lines agree again at the same offset (a changed value).
    let resync = (at..w.len().min(g.len()))
        .find(|&i| w[i] == g[i])
        .unwrap_or(usize::MAX);
    let (w_end, g_end) = (
        (w.len() - same_tail).min(resync.max(at)),
        (g.len() - same_tail).min(resync.max(at)),
    );
    let mut out = format!("@@ line {} @@\n", at + 1);
    for line in &w[at.saturating_sub(3)..at] {
        out.push_str(&format!("  {line}\n"));
    }
    for line in w[at..w_end].iter().take(8) {
        out.push_str(&format!("- {line}\n"));
    }
    for line in g[at..g_end].iter().take(8) {
        out.push_str(&format!("+ {line}\n"));
    }
    out
}

#[test]
fn sample_mesh_configuration_matches_the_golden_files() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let ctx = sample_context();
    let pods = sample_pods();
    for expected in ["sleep-1", "httpbin-v1", "httpbin-v2"] {
        assert!(pods.contains_key(expected), "the sample defines {expected}");
    }
    let mut failures = Vec::new();
    for (name, pod) in &pods {
        let proxy = pod_proxy(pod);
        for (kind, got) in render(&ctx, &proxy) {
            let path = golden_dir().join(name).join(format!("{kind}.json"));
            if update {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &got).unwrap();
                continue;
            }
            let want = std::fs::read_to_string(&path).unwrap_or_default();
            if want != got {
                failures.push(format!(
                    "{} differs from what istiod generates:\n{}",
                    path.display(),
                    first_difference(&want, &got)
                ));
            }
        }
    }
    // A golden of a Pod the sample no longer defines is stale.
    for entry in std::fs::read_dir(golden_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() && !pods.contains_key(&name) {
            failures.push(format!(
                "{} is the golden of a Pod the sample does not define",
                path.display()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}\nIf the change is intended, regenerate with `{UPDATE_HINT}` and review the diff.",
        failures.join("\n")
    );
}
