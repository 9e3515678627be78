//! The xDS proxy between a gRPC client standing in for Envoy (on a Unix
//! socket, as Envoy connects) and the fake istiod ADS server.

use std::sync::Mutex;

use common::testing::Transport;
use common::testing::ads::{FakeAds, XdsRequest};
use hyper_util::rt::TokioIo;
use proto::pb::envoy::service::discovery::v3::Resource;
use tokio::net::UnixStream;
use tonic::Code;
use tonic::transport::{Endpoint, Server};

use super::*;
use common::xds::{CLUSTER_TYPE, ENDPOINT_TYPE};

const LIMIT: Duration = Duration::from_secs(5);

/// The agent's xDS proxy on a Unix socket in front of a fake istiod.
struct Harness {
    ads: FakeAds,
    envoy: AggregatedDiscoveryServiceClient<Channel>,
    /// The name tables the agent's NDS handler was given.
    tables: Arc<Mutex<Vec<Any>>>,
    _dir: tempfile::TempDir,
}

/// A table the test's NDS handler refuses.
const BAD_TABLE: &[u8] = b"bad";

async fn harness(dns: bool) -> Harness {
    let ads = FakeAds::start(Transport::Plaintext).await.unwrap();
    harness_to(ads, dns).await
}

async fn harness_to(ads: FakeAds, dns: bool) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("istio-token");
    std::fs::write(&token, "token-1\n").unwrap();
    let addr = ads.addr().to_string();
    let config = crate::test_support::config(|c| {
        c.xds_proxy.discovery_address = addr;
        c.xds_proxy.root_path = None;
        c.identity.token_path = token;
        c.pod.cluster_id = "Kubernetes".into();
        c.xds_proxy.headers = vec![("X-Extra".into(), "yes".into())];
    });
    let tables = Arc::new(Mutex::new(Vec::new()));
    let nds: Option<NdsHandler> = dns.then(|| {
        let tables = tables.clone();
        Arc::new(move |any: &Any| {
            tables.lock().unwrap().push(any.clone());
            if any.value == BAD_TABLE {
                // The handler's real error: `bad` is not a NameTable.
                <proto::nds::NameTable as prost::Message>::decode(BAD_TABLE)?;
            }
            Ok(())
        }) as NdsHandler
    });
    let (_tx, secrets) = tokio::sync::watch::channel(None);
    let proxy = XdsProxy::new(config, secrets, nds);
    let socket = dir.path().join("XDS");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(
        Server::builder()
            .add_service(proxy.into_service())
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let envoy = AggregatedDiscoveryServiceClient::new(envoy_channel(socket));
    Harness {
        ads,
        envoy,
        tables,
        _dir: dir,
    }
}

/// A channel over the agent's socket, as Envoy's `xds-grpc` cluster connects.
fn envoy_channel(socket: std::path::PathBuf) -> Channel {
    Endpoint::from_static("http://localhost").connect_with_connector_lazy(tower::service_fn(
        move |_: tonic::transport::Uri| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        },
    ))
}

/// One Envoy stream: what it sends and what it receives.
struct EnvoyStream<Req, Resp> {
    tx: mpsc::UnboundedSender<Req>,
    rx: Streaming<Resp>,
}

impl<Req, Resp> EnvoyStream<Req, Resp> {
    async fn next(&mut self) -> Result<Option<Resp>, Status> {
        tokio::time::timeout(LIMIT, self.rx.message())
            .await
            .expect("Envoy's stream neither answered nor ended in time")
    }
}

impl Harness {
    async fn sotw(&mut self) -> EnvoyStream<DiscoveryRequest, DiscoveryResponse> {
        let (tx, rx) = mpsc::unbounded_channel();
        let rx = self
            .envoy
            .stream_aggregated_resources(UnboundedReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        EnvoyStream { tx, rx }
    }

    async fn delta(&mut self) -> EnvoyStream<DeltaDiscoveryRequest, DeltaDiscoveryResponse> {
        let (tx, rx) = mpsc::unbounded_channel();
        let rx = self
            .envoy
            .delta_aggregated_resources(UnboundedReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        EnvoyStream { tx, rx }
    }

    /// The type URLs istiod received, in order.
    async fn upstream_types(&self, n: usize) -> Vec<String> {
        self.ads
            .wait_received(n, LIMIT)
            .await
            .unwrap()
            .iter()
            .map(|r| r.request.type_url().to_string())
            .collect()
    }
}

fn request(type_url: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: type_url.into(),
        node: Some(Node {
            id: "sidecar~10.0.0.1~app.ns~ns.svc.cluster.local".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn response(type_url: &str, version: &str) -> DiscoveryResponse {
    DiscoveryResponse {
        type_url: type_url.into(),
        version_info: version.into(),
        nonce: format!("nonce-{version}"),
        resources: vec![Any {
            type_url: type_url.into(),
            value: version.as_bytes().to_vec(),
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn envoys_requests_reach_istiod_in_order_with_the_agents_metadata() {
    let mut h = harness(true).await;
    let s = h.sotw().await;
    for t in [CLUSTER_TYPE, LISTENER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE] {
        s.tx.send(request(t)).unwrap();
    }
    // The first LDS request brings the agent's NDS subscription right after it.
    assert_eq!(
        h.upstream_types(5).await,
        [
            CLUSTER_TYPE,
            LISTENER_TYPE,
            NAME_TABLE_TYPE,
            ENDPOINT_TYPE,
            LISTENER_TYPE
        ]
    );
    let nds = &h.ads.requests()[2];
    assert_eq!(nds.node.as_ref().unwrap().id, request("").node.unwrap().id);
    let streams = h.ads.streams();
    assert_eq!(streams.len(), 1);
    let md = &streams[0].metadata;
    assert_eq!(md.get("authorization").unwrap(), "Bearer token-1");
    assert_eq!(md.get("clusterid").unwrap(), "Kubernetes");
    assert_eq!(md.get("x-extra").unwrap(), "yes");
}

#[tokio::test]
async fn without_the_dns_proxy_no_name_table_is_asked_for() {
    let mut h = harness(false).await;
    let s = h.sotw().await;
    s.tx.send(request(LISTENER_TYPE)).unwrap();
    s.tx.send(request(CLUSTER_TYPE)).unwrap();
    assert_eq!(h.upstream_types(2).await, [LISTENER_TYPE, CLUSTER_TYPE]);
}

#[tokio::test]
async fn the_token_is_read_again_for_each_stream() {
    let mut h = harness(false).await;
    let s = h.sotw().await;
    s.tx.send(request(CLUSTER_TYPE)).unwrap();
    h.ads.wait_received(1, LIMIT).await.unwrap();
    std::fs::write(h._dir.path().join("istio-token"), "token-2").unwrap();
    drop(s);
    h.ads.wait_open_streams(0, LIMIT).await.unwrap();
    let s = h.sotw().await;
    s.tx.send(request(CLUSTER_TYPE)).unwrap();
    h.ads.wait_received(2, LIMIT).await.unwrap();
    let md = &h.ads.streams()[0].metadata;
    assert_eq!(md.get("authorization").unwrap(), "Bearer token-2");
}

#[tokio::test]
async fn istiods_responses_reach_envoy_in_order_and_name_tables_stay_in_the_agent() {
    let mut h = harness(true).await;
    let mut s = h.sotw().await;
    s.tx.send(request(CLUSTER_TYPE)).unwrap();
    h.ads.wait_open_streams(1, LIMIT).await.unwrap();
    h.ads.push(response(CLUSTER_TYPE, "1"));
    h.ads.push(response(NAME_TABLE_TYPE, "t1"));
    h.ads.push(response(
        "type.googleapis.com/istio.mesh.v1alpha1.Other",
        "x",
    ));
    h.ads.push(response(LISTENER_TYPE, "2"));
    h.ads.push(response(CLUSTER_TYPE, "3"));
    let mut seen = Vec::new();
    for _ in 0..3 {
        let r = s.next().await.unwrap().unwrap();
        seen.push((r.type_url, r.version_info));
    }
    assert_eq!(
        seen,
        [
            (CLUSTER_TYPE.to_string(), "1".to_string()),
            (LISTENER_TYPE.to_string(), "2".to_string()),
            (CLUSTER_TYPE.to_string(), "3".to_string()),
        ]
    );
    // The table went to the agent's handler, which ACKed it upstream itself.
    assert_eq!(h.tables.lock().unwrap().len(), 1);
    assert_eq!(h.tables.lock().unwrap()[0].value, b"t1");
    let ack = h
        .ads
        .requests()
        .into_iter()
        .find(|r| r.type_url == NAME_TABLE_TYPE)
        .expect("the agent ACKs the name table");
    assert_eq!(ack.version_info, "t1");
    assert_eq!(ack.response_nonce, "nonce-t1");
    assert!(ack.error_detail.is_none());
}

#[tokio::test]
async fn a_name_table_the_agent_cannot_use_is_nacked_and_an_empty_one_ignored() {
    let mut h = harness(true).await;
    let mut s = h.sotw().await;
    s.tx.send(request(CLUSTER_TYPE)).unwrap();
    h.ads.wait_received(1, LIMIT).await.unwrap();
    h.ads.push(DiscoveryResponse {
        type_url: NAME_TABLE_TYPE.into(),
        version_info: "empty".into(),
        nonce: "nonce-empty".into(),
        ..Default::default()
    });
    let mut bad = response(NAME_TABLE_TYPE, "bad");
    bad.resources[0].value = BAD_TABLE.to_vec();
    h.ads.push(bad);
    h.ads.push(response(CLUSTER_TYPE, "1"));
    assert_eq!(s.next().await.unwrap().unwrap().version_info, "1");
    let received = h.ads.wait_received(2, LIMIT).await.unwrap();
    let XdsRequest::Sotw(nack) = &received[1].request else {
        panic!("a state-of-the-world stream")
    };
    assert_eq!(nack.type_url, NAME_TABLE_TYPE);
    assert_eq!(
        nack.response_nonce, "nonce-bad",
        "the empty table is not ACKed"
    );
    assert_eq!(nack.version_info, "", "Istio's NACK carries no version");
    let detail = nack.error_detail.as_ref().unwrap();
    assert_eq!(detail.code, 13);
    assert!(
        detail.message.starts_with("bad NameTable: "),
        "{}",
        detail.message
    );
    assert_eq!(received.len(), 2, "{received:?}");
    assert_eq!(
        h.tables.lock().unwrap().len(),
        1,
        "the empty table never reaches the handler"
    );
}

#[tokio::test]
async fn istiod_ending_the_stream_ends_envoys_and_the_next_stream_uses_a_fresh_connection() {
    let mut h = harness(false).await;
    let mut s = h.sotw().await;
    s.tx.send(request(CLUSTER_TYPE)).unwrap();
    h.ads.wait_open_streams(1, LIMIT).await.unwrap();
    h.ads
        .end_streams(Some(Status::unavailable("istiod is shutting down")));
    let err = s.next().await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(err.message(), "istiod is shutting down");

    // Envoy reconnects; the agent dials istiod again, as Istio does per stream.
    let mut s = h.sotw().await;
    s.tx.send(request(CLUSTER_TYPE)).unwrap();
    h.ads.wait_open_streams(1, LIMIT).await.unwrap();
    assert_eq!(h.ads.accepted_connections(), 2);
    h.ads.push(response(CLUSTER_TYPE, "1"));
    assert_eq!(s.next().await.unwrap().unwrap().version_info, "1");

    // A clean end (istiod's MaxServerConnectionAge) ends Envoy's stream cleanly.
    h.ads.end_streams(None);
    assert!(s.next().await.unwrap().is_none());
    // The old upstream connection is closed with its stream.
    h.ads.wait_open_connections(0, LIMIT).await.unwrap();
}

#[tokio::test]
async fn istiod_going_away_fails_envoys_stream_and_envoy_reconnects() {
    let mut h = harness(false).await;
    let mut s = h.sotw().await;
    s.tx.send(request(CLUSTER_TYPE)).unwrap();
    h.ads.wait_received(1, LIMIT).await.unwrap();
    h.ads.drop_connections();
    // tonic reports the broken connection as it saw it (an h2 error), and
    // the agent passes that on, as Istio passes on gRPC's error.
    let err = s.next().await.unwrap_err();
    assert!(err.message().contains("connection"), "{err:?}");

    let mut s = h.sotw().await;
    s.tx.send(request(LISTENER_TYPE)).unwrap();
    h.ads.wait_open_streams(1, LIMIT).await.unwrap();
    h.ads.push(response(LISTENER_TYPE, "2"));
    assert_eq!(s.next().await.unwrap().unwrap().version_info, "2");
    assert_eq!(h.upstream_types(2).await, [CLUSTER_TYPE, LISTENER_TYPE]);
}

#[tokio::test]
async fn istiod_down_fails_envoys_stream_at_once() {
    let ads = FakeAds::start(Transport::Plaintext).await.unwrap();
    ads.stop();
    let mut h = harness_to(ads, false).await;
    let (_tx, rx) = mpsc::unbounded_channel::<DiscoveryRequest>();
    let err = tokio::time::timeout(
        LIMIT,
        h.envoy
            .stream_aggregated_resources(UnboundedReceiverStream::new(rx)),
    )
    .await
    .expect("the agent answers at once")
    .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
}

/// The defect this guards: the upstream stream stayed open until istiod's
/// next push after Envoy had gone.
#[tokio::test]
async fn envoy_leaving_closes_the_upstream_stream_at_once() {
    let mut h = harness(true).await;
    let s = h.sotw().await;
    s.tx.send(request(LISTENER_TYPE)).unwrap();
    h.ads.wait_received(2, LIMIT).await.unwrap();
    assert_eq!((h.ads.open_streams(), h.ads.open_connections()), (1, 1));
    // Envoy resets its stream (as when it exits or its connection breaks).
    drop(s);
    h.ads.wait_open_streams(0, LIMIT).await.unwrap();
    h.ads.wait_open_connections(0, LIMIT).await.unwrap();

    // Envoy half-closing its stream ends the proxied stream too, as Istio
    // ends it on any downstream receive error, EOF included.
    let mut s = h.sotw().await;
    s.tx.send(request(CLUSTER_TYPE)).unwrap();
    h.ads.wait_open_streams(1, LIMIT).await.unwrap();
    drop(s.tx);
    h.ads.wait_open_streams(0, LIMIT).await.unwrap();
    h.ads.wait_open_connections(0, LIMIT).await.unwrap();
    assert!(s.rx.message().await.unwrap().is_none());
}

#[tokio::test]
async fn delta_requests_and_responses_keep_their_order_and_envoy_leaving_closes_upstream() {
    let mut h = harness(true).await;
    let mut s = h.delta().await;
    for t in [CLUSTER_TYPE, LISTENER_TYPE, ENDPOINT_TYPE] {
        s.tx.send(DeltaDiscoveryRequest {
            type_url: t.into(),
            ..Default::default()
        })
        .unwrap();
    }
    assert_eq!(
        h.upstream_types(4).await,
        [CLUSTER_TYPE, LISTENER_TYPE, NAME_TABLE_TYPE, ENDPOINT_TYPE]
    );
    assert!(h.ads.streams()[0].delta);
    let delta = |type_url: &str, nonce: &str, value: &[u8]| DeltaDiscoveryResponse {
        type_url: type_url.into(),
        nonce: nonce.into(),
        resources: vec![Resource {
            name: "r".into(),
            resource: Some(Any {
                type_url: type_url.into(),
                value: value.to_vec(),
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    h.ads.push_delta(delta(CLUSTER_TYPE, "n1", b"c"));
    h.ads.push_delta(delta(NAME_TABLE_TYPE, "n2", b"table"));
    h.ads.push_delta(delta(LISTENER_TYPE, "n3", b"l"));
    assert_eq!(s.next().await.unwrap().unwrap().nonce, "n1");
    assert_eq!(s.next().await.unwrap().unwrap().nonce, "n3");
    assert_eq!(h.tables.lock().unwrap()[0].value, b"table");
    let acks = h.ads.delta_requests();
    let ack = acks.last().unwrap();
    assert_eq!(
        (ack.type_url.as_str(), ack.response_nonce.as_str()),
        (NAME_TABLE_TYPE, "n2")
    );
    assert!(ack.error_detail.is_none());

    drop(s);
    h.ads.wait_open_streams(0, LIMIT).await.unwrap();
    h.ads.wait_open_connections(0, LIMIT).await.unwrap();
}
