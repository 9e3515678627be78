//! Every metric family istiod exports on `/metrics`, and the agent's own
//! part of `:15020/stats/prometheus`, is one of Istio's, with Istio's type
//! and label names: the list is `tests/data/istio-metrics.txt`, taken from
//! Istio's source. istiod runs on the sample mesh with the `sleep` Pod's
//! agent and Envoy; a config change, a rejected file, a NACK and an
//! expired nonce make the labelled families appear before the scrape.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::service::discovery::v3::DiscoveryRequest;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use tests::sample_mesh::SampleMesh;
use tests::{http_get, wait_for};
use tokio_stream::wrappers::ReceiverStream;

const PLAINTEXT: &str = "127.0.0.1:15010";

/// A family of the list: its type and label names.
struct Known {
    kind: String,
    labels: BTreeSet<String>,
}

fn istio_metrics() -> BTreeMap<String, Known> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/istio-metrics.txt");
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 3, "{}: bad line {l:?}", path.display());
            let labels = match f[2] {
                "-" => BTreeSet::new(),
                ls => ls.split(',').map(String::from).collect(),
            };
            (
                f[0].to_string(),
                Known {
                    kind: f[1].to_string(),
                    labels,
                },
            )
        })
        .collect()
}

/// One exported family: its `# TYPE` and the label names its samples use.
#[derive(Debug, Default)]
struct Family {
    kind: String,
    labels: BTreeSet<String>,
}

/// The label names of one sample line's `{...}` (values may hold commas,
/// quotes escaped as `\"`).
fn label_names(sample: &str) -> Vec<String> {
    let Some(open) = sample.find('{') else {
        return Vec::new();
    };
    let mut names = Vec::new();
    let mut rest = &sample[open + 1..];
    while let Some(eq) = rest.find("=\"") {
        let name = rest[..eq].trim_start_matches([',', ' ']);
        names.push(name.to_string());
        let mut chars = rest[eq + 2..].char_indices();
        let mut end = rest.len() - eq - 2;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        rest = &rest[eq + 2 + end + 1..];
        if rest.starts_with('}') {
            break;
        }
    }
    names
}

/// The families of a Prometheus text exposition, by name.
fn families(text: &str) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let mut f = t.split_whitespace();
            let (name, kind) = (f.next().unwrap(), f.next().unwrap_or(""));
            out.entry(name.to_string()).or_default().kind = kind.to_string();
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let name = line.split(['{', ' ']).next().unwrap();
        let family = [name, "_bucket", "_sum", "_count"]
            .iter()
            .skip(1)
            .find_map(|s| name.strip_suffix(s).filter(|b| out.contains_key(*b)))
            .unwrap_or(name);
        let entry = out.entry(family.to_string()).or_default();
        for l in label_names(line) {
            if l != "le" {
                entry.labels.insert(l);
            }
        }
    }
    out
}

/// What differs from Istio's list, one line per problem.
fn problems(source: &str, exported: &BTreeMap<String, Family>) -> Vec<String> {
    let known = istio_metrics();
    let mut out = Vec::new();
    for (name, f) in exported {
        let Some(k) = known.get(name) else {
            out.push(format!("{source}: {name} is not one of Istio's metrics"));
            continue;
        };
        if k.kind != f.kind {
            out.push(format!(
                "{source}: {name} is a {}, Istio's is a {}",
                f.kind, k.kind
            ));
        }
        let extra: Vec<&String> = f.labels.difference(&k.labels).collect();
        if !extra.is_empty() {
            out.push(format!(
                "{source}: {name} has labels {extra:?} Istio's has not"
            ));
        }
    }
    out
}

/// A proxy on :15010 that answers CDS with a stale nonce and then a NACK.
async fn nack_and_expired_nonce() {
    let meta = common::NodeMetadata {
        namespace: Some("demo".into()),
        istio_version: Some("1.28.0".into()),
        proxy_config: Some(serde_json::Map::new()),
        ..Default::default()
    };
    let node = Node {
        id: "sidecar~198.18.0.9~fake-1.demo~demo.svc.cluster.local".into(),
        metadata: Some(meta.to_struct()),
        ..Default::default()
    };
    let channel = common::tls::grpc_channel(PLAINTEXT, None, Duration::from_secs(5)).unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let cds = common::xds::CLUSTER_TYPE;
    tx.send(DiscoveryRequest {
        node: Some(node),
        type_url: cds.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut responses = AggregatedDiscoveryServiceClient::new(channel)
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), responses.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    for (nonce, error) in [("stale", false), (first.nonce.as_str(), true)] {
        tx.send(DiscoveryRequest {
            type_url: cds.into(),
            response_nonce: nonce.into(),
            error_detail: error.then(|| proto::pb::google::rpc::Status {
                code: 3,
                message: "rejected by the test".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    // Let istiod read both before the stream goes.
    tokio::time::sleep(Duration::from_millis(300)).await;
}

const SERVICE_ENTRY: &str = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: example, namespace: demo}\nspec:\n  hosts: [example.com]\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  resolution: DNS\n";
const BAD_VIRTUAL_SERVICE: &str = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: broken, namespace: demo}\nspec:\n  hosts: [httpbin]\n  http:\n  - route:\n    - destination: {host: httpbin}\n      weight: 150\n";

#[test]
fn istiod_and_the_agent_export_only_istios_metric_families() {
    let mesh = SampleMesh::start_with(
        "metrics",
        &[
            ("TEST_ISTIOD_PLAINTEXT_ADDR", PLAINTEXT),
            ("PILOT_XDS_CACHE_STATS", "true"),
        ],
    );
    std::fs::write(mesh.config.join("zz-example.yaml"), SERVICE_ENTRY).unwrap();
    std::fs::write(mesh.config.join("zz-bad.yaml"), BAD_VIRTUAL_SERVICE).unwrap();
    mesh.ns.run(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(nack_and_expired_nonce())
    });
    let monitoring = mesh.istiod.monitoring;
    let scrape = |addr: std::net::SocketAddr, path: &'static str| {
        mesh.ns.run(move || http_get(addr, path).ok())
    };
    // The labelled families this test provokes, before checking them all.
    let wanted = [
        "pilot_xds",
        "pilot_xds_pushes",
        "pilot_push_triggers",
        "pilot_total_rejected_configs",
        "pilot_total_xds_rejects",
        "pilot_xds_expired_nonce",
        "pilot_xds_config_size_bytes",
        "xds_cache_reads",
    ];
    let istiod = wait_for("istiod's labelled metrics", Duration::from_secs(30), || {
        let (code, body) = scrape(monitoring, "/metrics")?;
        let f = families(&body);
        (code == 200 && wanted.iter().all(|w| f.contains_key(*w))).then_some(f)
    });
    let (code, merged) = scrape("127.0.0.1:15020".parse().unwrap(), "/stats/prometheus").unwrap();
    assert_eq!(code, 200);
    // Envoy's own families (`envoy_*`) are Envoy's names, not checked here.
    let agent: BTreeMap<String, Family> = families(&merged)
        .into_iter()
        .filter(|(n, _)| !n.starts_with("envoy_"))
        .collect();
    assert!(agent.contains_key("istio_agent_scrapes_total"), "{merged}");
    eprintln!("istiod exports {:?}", istiod.keys().collect::<Vec<_>>());
    eprintln!("the agent exports {:?}", agent.keys().collect::<Vec<_>>());
    let mut all = problems("istiod /metrics", &istiod);
    all.extend(problems(":15020/stats/prometheus", &agent));
    assert!(all.is_empty(), "{}", all.join("\n"));
}

#[test]
fn the_check_fails_on_an_invented_name_a_wrong_type_or_label() {
    let text = "# TYPE pilot_xds gauge\npilot_xds{version=\"1.28.0\",color=\"a,b\"} 1\n# TYPE pilot_push_context_builds counter\npilot_push_context_builds 3\n# TYPE pilot_debounce_time histogram\npilot_debounce_time_bucket{le=\"0.01\"} 1\npilot_debounce_time_sum 0.1\npilot_debounce_time_count 1\n# TYPE pilot_xds_pushes gauge\npilot_xds_pushes{type=\"cds\"} 1\n";
    let f = families(text);
    assert_eq!(
        f["pilot_xds"].labels,
        ["color", "version"].map(String::from).into()
    );
    assert!(f["pilot_debounce_time"].labels.is_empty());
    let p = problems("test", &f);
    assert_eq!(p.len(), 3, "{p:?}");
    assert!(
        p[0].contains("pilot_push_context_builds is not one of Istio's"),
        "{p:?}"
    );
    assert!(p[1].contains("pilot_xds has labels [\"color\"]"), "{p:?}");
    assert!(
        p[2].contains("pilot_xds_pushes is a gauge, Istio's is a counter"),
        "{p:?}"
    );
}
