//! `istioctl proxy-status` against our istiod: the debug types over ADS.
//! istiod on the sample mesh with the `sleep` Pod's agent and real Envoy;
//! a test client asks `istio.io/debug/syncz` on the plaintext :15010 and
//! gets every connected proxy with its per-type sync state, as the HTTP
//! `/debug/syncz` says; a second, hand-driven proxy NACKs CDS and leaves
//! LDS unACKed, so STALE shows. On :15012 a caller without a client
//! certificate is refused with `Unauthenticated`, one with a workload
//! certificate is answered, for its own namespace only.
//! `istio.io/debug/config_dump` returns the proxy's clusters and listeners.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::{Message, Name};
use proto::pb::envoy::admin::v3::{ClustersConfigDump, ListenersConfigDump};
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use proto::pb::envoy::service::status::v3::ConfigStatus;
use proto::pb::google::protobuf::Any;
use tests::proxy_status::{self, Row, debug_node};
use tests::sample_mesh::SampleMesh;
use tests::{ISTIOD_SAN, http_get};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::transport::Channel;

/// istiod's plaintext xDS port, inside the mesh's network namespace.
const PLAINTEXT: &str = "127.0.0.1:15010";
const CDS: &str = common::xds::CLUSTER_TYPE;
const LDS: &str = common::xds::LISTENER_TYPE;
const HTTPBIN_CLUSTER: &str = "outbound|8000||httpbin.demo.svc.cluster.local";

fn plaintext() -> Channel {
    common::tls::grpc_channel(PLAINTEXT, None, Duration::from_secs(5)).unwrap()
}

/// A TLS channel to istiod's :15012, with `client` as the client certificate.
fn tls(
    addr: std::net::SocketAddr,
    root: &str,
    client: Option<(
        Vec<rustls_pki_types::CertificateDer<'static>>,
        rustls_pki_types::PrivateKeyDer<'static>,
    )>,
) -> Channel {
    common::tls::install_crypto_provider();
    let root = root.to_string();
    let client = Arc::new(client);
    let source: common::tls::ClientConfigSource = Arc::new(move || {
        let store = common::tls::root_store("root", &root)?;
        let cert = client
            .as_ref()
            .as_ref()
            .map(|(c, k)| (c.clone(), k.clone_key()));
        Ok(Arc::new(common::tls::grpc_client_config(store, cert)?))
    });
    let name = rustls_pki_types::ServerName::try_from(ISTIOD_SAN).unwrap();
    common::tls::grpc_channel(
        &addr.to_string(),
        Some((source, name)),
        Duration::from_secs(5),
    )
    .unwrap()
}

/// A TLS channel to :15012 with a workload certificate of `ns/sa`, signed
/// by istiod's CA for `token`.
async fn workload_tls(
    grpc: std::net::SocketAddr,
    root: &str,
    token: &str,
    ns: &str,
    sa: &str,
) -> Channel {
    let key = common::pki::generate_key(common::pki::KeyType::EcdsaP256).unwrap();
    let csr = common::pki::csr_pem(&common::Identity::new("cluster.local", ns, sa), &key).unwrap();
    let mut req = tonic::Request::new(proto::istio_ca::IstioCertificateRequest {
        csr,
        validity_duration: 3600,
        metadata: None,
    });
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let mut ca =
        proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient::new(tls(
            grpc, root, None,
        ));
    let chain = ca
        .create_certificate(req)
        .await
        .unwrap()
        .into_inner()
        .cert_chain;
    let chain = common::pki::pem_certs("workload", &chain.concat()).unwrap();
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    tls(grpc, root, Some((chain, key)))
}

/// The code of a refused debug request.
fn refused(r: Result<DiscoveryResponse, proxy_status::ProxyStatusError>) -> Code {
    match r {
        Err(proxy_status::ProxyStatusError::Status(s)) => s.code(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A proxy driven by hand on :15010: it receives CDS and NACKs it, and
/// receives LDS without ACKing it.
struct HandProxy {
    _requests: mpsc::Sender<DiscoveryRequest>,
    _responses: tonic::Streaming<DiscoveryResponse>,
}

const NACK_MESSAGE: &str = "rejected by the test";

async fn hand_proxy(id: &str, namespace: &str) -> HandProxy {
    let meta = common::NodeMetadata {
        namespace: Some(namespace.into()),
        istio_version: Some("1.28.0".into()),
        cluster_id: Some("Kubernetes".into()),
        proxy_config: Some(serde_json::Map::new()),
        ..Default::default()
    };
    let node = Node {
        id: format!("sidecar~198.18.0.9~{id}~{namespace}.svc.cluster.local"),
        metadata: Some(meta.to_struct()),
        ..Default::default()
    };
    let (tx, rx) = mpsc::channel(4);
    let mut client = AggregatedDiscoveryServiceClient::new(plaintext());
    tx.send(DiscoveryRequest {
        node: Some(node),
        type_url: CDS.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut responses = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let cds = next(&mut responses).await;
    assert_eq!(cds.type_url, CDS);
    tx.send(DiscoveryRequest {
        type_url: CDS.into(),
        response_nonce: cds.nonce.clone(),
        error_detail: Some(proto::pb::google::rpc::Status {
            code: Code::InvalidArgument as i32,
            message: NACK_MESSAGE.into(),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    tx.send(DiscoveryRequest {
        type_url: LDS.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let lds = next(&mut responses).await;
    assert_eq!(lds.type_url, LDS);
    HandProxy {
        _requests: tx,
        _responses: responses,
    }
}

async fn next(r: &mut tonic::Streaming<DiscoveryResponse>) -> DiscoveryResponse {
    tokio::time::timeout(Duration::from_secs(10), r.message())
        .await
        .expect("a response in time")
        .unwrap()
        .expect("a response")
}

/// istioctl's reading of the HTTP syncz's nonces (`xdsStatus`), in the
/// CSDS names.
fn http_state(entry: &serde_json::Value, prefix: &str) -> String {
    let sent = entry[format!("{prefix}_sent")].as_str().unwrap_or("");
    let acked = entry[format!("{prefix}_acked")].as_str().unwrap_or("");
    if sent.is_empty() {
        "NOT_SENT"
    } else if sent == acked {
        "SYNCED"
    } else {
        "STALE"
    }
    .to_string()
}

/// Each proxy's (CDS, LDS, EDS, RDS, ECDS) states from the HTTP syncz.
/// Like Istio's, it lists every connection; the debug clients' own (the
/// `istioctl.*` nodes, while their stream lasts) are not proxies.
fn http_syncz(http: std::net::SocketAddr) -> BTreeMap<String, [String; 5]> {
    let (code, body) = http_get(http, "/debug/syncz").unwrap();
    assert_eq!(code, 200, "{body}");
    let list: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    list.iter()
        .filter(|e| !e["proxy"].as_str().unwrap().starts_with("istioctl."))
        .map(|e| {
            let s = |p| http_state(e, p);
            (
                e["proxy"].as_str().unwrap().to_string(),
                [
                    s("cluster"),
                    s("listener"),
                    s("endpoint"),
                    s("route"),
                    s("extensionconfig"),
                ],
            )
        })
        .collect()
}

fn ads_states(rows: &[Row]) -> BTreeMap<String, [String; 5]> {
    rows.iter()
        .map(|r| {
            (
                r.name.clone(),
                [&r.cds, &r.lds, &r.eds, &r.rds, &r.ecds].map(|s| s.clone()),
            )
        })
        .collect()
}

fn states(s: [&str; 5]) -> [String; 5] {
    s.map(String::from)
}

/// Polls the ADS and HTTP syncz until both agree and show what the test
/// set up; returns the last ADS answer.
async fn settled_syncz(http: std::net::SocketAddr) -> DiscoveryResponse {
    let want: BTreeMap<String, [String; 5]> = [
        (
            "sleep-1.demo".to_string(),
            states(["SYNCED", "SYNCED", "SYNCED", "SYNCED", "NOT_SENT"]),
        ),
        (
            "fake-1.other".to_string(),
            states(["STALE", "STALE", "NOT_SENT", "NOT_SENT", "NOT_SENT"]),
        ),
    ]
    .into_iter()
    .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    for _ in 0..300 {
        let answer = proxy_status::syncz(plaintext(), debug_node("istio-system", "default"))
            .await
            .unwrap();
        let ads = ads_states(&proxy_status::rows(&answer).unwrap());
        let http_view = http_syncz(http);
        if ads == want && http_view == want {
            return answer;
        }
        last = format!("ADS: {ads:?}\nHTTP: {http_view:?}");
        assert!(Instant::now() < deadline, "syncz never settled:\n{last}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("syncz never settled:\n{last}");
}

fn unpack<M: Message + Name + Default>(configs: &[Any]) -> M {
    let a = configs
        .iter()
        .find(|a| a.type_url == M::type_url())
        .unwrap_or_else(|| panic!("no {} in the dump", M::type_url()));
    M::decode(a.value.as_slice()).unwrap()
}

/// The proxies of a syncz answer on a delta stream on :15010.
async fn delta_syncz() -> Vec<String> {
    use proto::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
    let (tx, rx) = mpsc::channel(1);
    tx.send(DeltaDiscoveryRequest {
        node: Some(debug_node("istio-system", "default")),
        type_url: common::xds::DEBUG_SYNCZ_TYPE.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut stream = AggregatedDiscoveryServiceClient::new(plaintext())
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let answer = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("an answer in time")
        .unwrap()
        .expect("an answer");
    answer
        .resources
        .iter()
        .map(|r| {
            let any = r.resource.as_ref().unwrap();
            assert_eq!(any.type_url, common::xds::CLIENT_CONFIG_TYPE);
            let cc =
                proto::pb::envoy::service::status::v3::ClientConfig::decode(any.value.as_slice())
                    .unwrap();
            cc.node.unwrap().id
        })
        .collect()
}

/// `istio.io/debug/config_dump` returns the proxy's clusters and listeners,
/// the same names the HTTP config_dump lists; an unknown proxy, nothing.
async fn config_dump_over_ads_matches_http(http: std::net::SocketAddr) {
    // config_dump over ADS: the proxy's clusters and listeners, the
    // same names the HTTP config_dump lists.
    let dump = proxy_status::request(
        plaintext(),
        debug_node("istio-system", "default"),
        common::xds::DEBUG_CONFIG_DUMP_TYPE,
        &["sleep-1.demo"],
    )
    .await
    .unwrap();
    let clusters: ClustersConfigDump = unpack(&dump.resources);
    let listeners: ListenersConfigDump = unpack(&dump.resources);
    let mut cluster_names: Vec<String> = clusters
        .dynamic_active_clusters
        .iter()
        .map(|c| {
            let raw = c.cluster.as_ref().unwrap();
            proto::pb::envoy::config::cluster::v3::Cluster::decode(raw.value.as_slice())
                .unwrap()
                .name
        })
        .collect();
    cluster_names.sort();
    assert!(
        cluster_names.iter().any(|n| n == HTTPBIN_CLUSTER),
        "{cluster_names:?}"
    );
    let mut listener_names: Vec<String> = listeners
        .dynamic_listeners
        .iter()
        .map(|l| l.name.clone())
        .collect();
    listener_names.sort();
    assert!(!listener_names.is_empty());
    let (code, body) = http_get(http, "/debug/config_dump?proxyID=sleep-1.demo").unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let names = |k: &str| {
        let mut n: Vec<String> = v[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect();
        n.sort();
        n
    };
    assert_eq!(cluster_names, names("clusters"));
    assert_eq!(listener_names, names("listeners"));
    // An unknown proxy: an empty answer, as Istio gives.
    let none = proxy_status::request(
        plaintext(),
        debug_node("istio-system", "default"),
        common::xds::DEBUG_CONFIG_DUMP_TYPE,
        &["nobody.nowhere"],
    )
    .await
    .unwrap();
    assert!(none.resources.is_empty());
}

/// :15012: refused without a client certificate, answered for a workload
/// certificate within its namespace; `istio.io/debug` paths.
async fn the_authenticated_port(
    grpc: std::net::SocketAddr,
    root: &str,
    token: &str,
    system_token: &str,
) {
    // :15012 without a client certificate (or token): Unauthenticated.
    let err = proxy_status::syncz(tls(grpc, root, None), debug_node("demo", "sleep"))
        .await
        .unwrap_err();
    match err {
        proxy_status::ProxyStatusError::Status(s) => {
            assert_eq!(s.code(), Code::Unauthenticated, "{s:?}")
        }
        other => panic!("expected Unauthenticated, got {other}"),
    }

    // With a workload certificate of demo/sleep: answered, for the
    // caller's namespace only; another namespace's dump is refused.
    let secure = workload_tls(grpc, root, token, "demo", "sleep").await;
    let caller = || debug_node("demo", "sleep");
    let answer = proxy_status::syncz(secure.clone(), caller()).await.unwrap();
    let names: Vec<String> = proxy_status::rows(&answer)
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, vec!["sleep-1.demo".to_string()]);
    let dump = |names: &'static [&'static str], ch: Channel, node: Node| {
        proxy_status::request(ch, node, common::xds::DEBUG_CONFIG_DUMP_TYPE, names)
    };
    let other = dump(&["fake-1.other"], secure.clone(), caller()).await;
    assert_eq!(refused(other), Code::PermissionDenied);

    // `istio.io/debug` with a debug path: the HTTP endpoint's body,
    // for verified callers only; another namespace than istiod's
    // reads only config_dump of its own proxies.
    let debug = |path: &'static str, ch: Channel, node: Node| async move {
        proxy_status::request(ch, node, common::xds::DEBUG_TYPE, &[path]).await
    };
    let plain = debug("syncz", plaintext(), debug_node("istio-system", "default")).await;
    assert_eq!(refused(plain), Code::Unauthenticated);
    let syncz = debug("syncz", secure.clone(), caller()).await;
    assert_eq!(refused(syncz), Code::PermissionDenied);
    let own = debug("config_dump?proxyID=sleep-1.demo", secure.clone(), caller())
        .await
        .unwrap();
    assert_eq!(own.resources.len(), 1);
    assert_eq!(own.resources[0].type_url, common::xds::DEBUG_TYPE);
    let body: serde_json::Value = serde_json::from_slice(&own.resources[0].value).unwrap();
    assert!(
        body["clusters"].to_string().contains(HTTPBIN_CLUSTER),
        "{body}"
    );
    let system = workload_tls(grpc, root, system_token, "istio-system", "default").await;
    let all = debug("syncz", system, debug_node("istio-system", "default"))
        .await
        .unwrap();
    let list: Vec<serde_json::Value> = serde_json::from_slice(&all.resources[0].value).unwrap();
    let proxies: Vec<&str> = list.iter().filter_map(|e| e["proxy"].as_str()).collect();
    assert!(
        proxies.contains(&"sleep-1.demo") && proxies.contains(&"fake-1.other"),
        "{proxies:?}"
    );
}

#[test]
fn proxy_status_over_ads_matches_http_syncz_and_tls_requires_a_workload_certificate() {
    let mesh = SampleMesh::start_with("syncz", &[("TEST_ISTIOD_PLAINTEXT_ADDR", PLAINTEXT)]);
    let (http, grpc) = (mesh.istiod.http, mesh.istiod.grpc);
    let root = mesh.istiod.root_pem();
    let token = mesh.istiod.token("demo", "sleep");
    let system_token = mesh.istiod.token("istio-system", "default");
    let table = mesh.ns.run(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let _hand = hand_proxy("fake-1.other", "other").await;

            // :15010: every proxy, each type's state, as HTTP says; the
            // debug client itself is no proxy.
            let answer = settled_syncz(http).await;
            assert_eq!(answer.type_url, common::xds::DEBUG_SYNCZ_TYPE);
            let configs = proxy_status::client_configs(&answer).unwrap();
            let fake = configs
                .iter()
                .find(|c| c.node.as_ref().unwrap().id == "fake-1.other")
                .unwrap();
            let cds = fake
                .generic_xds_configs
                .iter()
                .find(|g| g.type_url == CDS)
                .unwrap();
            assert_eq!(cds.config_status(), ConfigStatus::Stale);
            assert_eq!(cds.error_state.as_ref().unwrap().details, NACK_MESSAGE);
            let rows = proxy_status::rows(&answer).unwrap();
            assert!(
                rows.iter().all(|r| !r.name.starts_with("istioctl.")),
                "{rows:?}"
            );
            let sleep = rows.iter().find(|r| r.name == "sleep-1.demo").unwrap();
            assert!(
                !sleep.istiod.is_empty() && sleep.istiod != "MISSING",
                "{sleep:?}"
            );
            assert_eq!(sleep.version, env!("CARGO_PKG_VERSION"));

            // A delta stream is answered the same way.
            let delta = delta_syncz().await;
            assert!(delta.contains(&"sleep-1.demo".to_string()), "{delta:?}");
            assert!(delta.contains(&"fake-1.other".to_string()), "{delta:?}");

            config_dump_over_ads_matches_http(http).await;
            the_authenticated_port(grpc, &root, &token, &system_token).await;

            // The command-line client prints istioctl's table.
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxy_status"))
                .args(["--addr", PLAINTEXT])
                .output()
                .await
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        })
    });
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        [
            "NAME", "CLUSTER", "CDS", "LDS", "EDS", "RDS", "ECDS", "ISTIOD", "VERSION"
        ],
        "{table}"
    );
    let fake = lines.iter().find(|l| l[0] == "fake-1.other").expect(&table);
    assert_eq!(
        fake[1..7],
        [
            "Kubernetes",
            "STALE",
            "STALE",
            "NOT_SENT",
            "NOT_SENT",
            "NOT_SENT"
        ],
        "{table}"
    );
    let sleep = lines.iter().find(|l| l[0] == "sleep-1.demo").expect(&table);
    // Its CLUSTER is empty (the harness's agent sets no CLUSTER_ID): read
    // the states from the right.
    let n = sleep.len();
    assert_eq!(
        sleep[n - 7..n - 2],
        ["SYNCED", "SYNCED", "SYNCED", "SYNCED", "NOT_SENT"],
        "{table}"
    );
}
