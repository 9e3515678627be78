//! The ADS protocol rules of Istio's own tests, against istiod's server with
//! a fixed push context: stale nonces, NACKs, named-type unsubscribe,
//! incremental EDS, delta changes and removals, reconnect with known versions.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use istiod::pushctx::{Proxy, PushContext, PushRequest, Resource, Updates};
use istiod::xds::server::{DiscoveryServer, XdsMetrics};
use istiod::xds::{CLUSTER_TYPE, ENDPOINT_TYPE};
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use proto::pb::google::protobuf::Any;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

struct Fake {
    version: String,
    resources: BTreeMap<&'static str, Vec<(String, String)>>,
}

impl PushContext for Fake {
    fn version(&self) -> &str {
        &self.version
    }
    fn generate(
        &self,
        _: &Proxy,
        type_url: &str,
        names: &BTreeSet<String>,
    ) -> Result<Vec<Arc<Resource>>, istiod::pushctx::push_context::GenerateError> {
        Ok(self
            .resources
            .get(type_url)
            .into_iter()
            .flatten()
            .filter(|(n, _)| names.is_empty() || names.contains(n))
            .map(|(n, body)| {
                Arc::new(Resource::new(
                    n.clone(),
                    Any {
                        type_url: type_url.to_string(),
                        value: body.as_bytes().to_vec(),
                    },
                ))
            })
            .collect())
    }
}

fn ctx(
    version: &str,
    clusters: &[(&str, &str)],
    endpoints: &[(&str, &str)],
) -> Arc<dyn PushContext> {
    let mut resources = BTreeMap::new();
    resources.insert(
        CLUSTER_TYPE,
        clusters
            .iter()
            .map(|(n, b)| (n.to_string(), b.to_string()))
            .collect(),
    );
    resources.insert(
        ENDPOINT_TYPE,
        endpoints
            .iter()
            .map(|(n, b)| (n.to_string(), b.to_string()))
            .collect(),
    );
    Arc::new(Fake {
        version: version.into(),
        resources,
    })
}

struct Harness {
    ready: watch::Sender<bool>,
    pushes: watch::Sender<Option<PushRequest>>,
    client: AggregatedDiscoveryServiceClient<tonic::transport::Channel>,
    registry: prometheus::Registry,
    seq: u64,
}

impl Harness {
    async fn new(initial: Arc<dyn PushContext>) -> Harness {
        Self::start(initial, None).await
    }

    /// A server admitting `stream_limit` new streams a second, if given.
    async fn start(initial: Arc<dyn PushContext>, stream_limit: Option<f64>) -> Harness {
        let registry = prometheus::Registry::new();
        let metrics = XdsMetrics::new(&registry).unwrap();
        let (ready, ready_rx) = watch::channel(true);
        let (pushes, push_rx) = watch::channel(Some(PushRequest::new(
            1,
            initial,
            Updates::everything(),
            Instant::now(),
        )));
        let mut server = DiscoveryServer::new(ready_rx, push_rx, metrics, 10);
        if let Some(rate) = stream_limit {
            server = server.with_stream_limit(rate);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(server.into_service())
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        Harness {
            ready,
            pushes,
            client,
            registry,
            seq: 1,
        }
    }

    fn push(&mut self, ctx: Arc<dyn PushContext>, eds_only: Option<&[&str]>) {
        self.seq += 1;
        let updates = match eds_only {
            Some(hosts) => Updates::eds(hosts.iter().map(|s| s.to_string())),
            None => Updates::everything(),
        };
        let last = self.pushes.borrow().clone().unwrap();
        self.pushes
            .send_replace(Some(last.next(self.seq, ctx, updates, Instant::now())));
    }

    fn metric(&self, name: &str, label: &str) -> u64 {
        self.registry
            .gather()
            .iter()
            .filter(|f| f.name() == name)
            .flat_map(|f| f.get_metric().iter())
            .filter(|m| m.get_label().iter().any(|l| l.value() == label))
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }
}

fn node() -> Option<Node> {
    Some(Node {
        id: "sidecar~10.0.0.1~app-1.default~default.svc.cluster.local".into(),
        ..Default::default()
    })
}

fn req(t: &str, names: &[&str], nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        node: node(),
        type_url: t.into(),
        resource_names: names.iter().map(|s| s.to_string()).collect(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

async fn next<T>(s: &mut Streaming<T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), s.message())
        .await
        .expect("a response")
        .unwrap()
        .unwrap()
}

async fn nothing<T: std::fmt::Debug>(s: &mut Streaming<T>) {
    let r = tokio::time::timeout(Duration::from_millis(300), s.message()).await;
    assert!(r.is_err(), "expected no response, got {r:?}");
}

fn names(r: &DiscoveryResponse) -> Vec<String> {
    r.resources
        .iter()
        .map(|a| String::from_utf8(a.value.clone()).unwrap())
        .collect()
}

async fn sotw(h: &mut Harness) -> (mpsc::Sender<DiscoveryRequest>, Streaming<DiscoveryResponse>) {
    let (tx, rx) = mpsc::channel(16);
    let s = h
        .client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, s)
}

#[tokio::test]
async fn not_ready_is_unavailable_then_served() {
    let mut h = Harness::new(ctx("v1", &[("c1", "C1")], &[])).await;
    h.ready.send_replace(false);
    let (tx, rx) = mpsc::channel(4);
    tx.send(req(CLUSTER_TYPE, &[], "")).await.unwrap();
    let err = h
        .client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(err.message().contains("not ready"), "{err}");
    h.ready.send_replace(true);
    let (tx, mut s) = sotw(&mut h).await;
    tx.send(req(CLUSTER_TYPE, &[], "")).await.unwrap();
    assert_eq!(names(&next(&mut s).await), ["C1"]);
}

type Opened = Result<(mpsc::Sender<DiscoveryRequest>, Streaming<DiscoveryResponse>), tonic::Status>;

async fn open(mut client: AggregatedDiscoveryServiceClient<tonic::transport::Channel>) -> Opened {
    let (tx, rx) = mpsc::channel(4);
    tx.send(req(CLUSTER_TYPE, &[], "")).await.unwrap();
    let s = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok((tx, s))
}

#[tokio::test]
async fn new_streams_beyond_the_rate_are_refused_with_resource_exhausted() {
    let h = Harness::start(ctx("v1", &[("c1", "C1")], &[]), Some(1.0)).await;
    // One stream a second: of three at once the first is admitted now, the
    // second within its second, and the third, two seconds away, is refused.
    let (a, b, c) = tokio::join!(
        open(h.client.clone()),
        open(h.client.clone()),
        open(h.client.clone())
    );
    let mut admitted = Vec::new();
    let mut refused = Vec::new();
    for r in [a, b, c] {
        match r {
            Ok(s) => admitted.push(s),
            Err(e) => refused.push(e),
        }
    }
    assert_eq!((admitted.len(), refused.len()), (2, 1), "{refused:?}");
    assert_eq!(refused[0].code(), tonic::Code::ResourceExhausted);
    assert!(
        refused[0].message().contains("request rate limit exceeded"),
        "{}",
        refused[0]
    );
    for (_tx, s) in &mut admitted {
        assert_eq!(names(&next(s).await), ["C1"]);
    }
    // The refused proxy retries, as Envoy does, and is served in its turn.
    let mut served = None;
    for _ in 0..20 {
        match open(h.client.clone()).await {
            Ok(s) => {
                served = Some(s);
                break;
            }
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let (_tx, mut s) = served.expect("a retry is admitted within four seconds");
    assert_eq!(names(&next(&mut s).await), ["C1"]);
}

#[tokio::test]
async fn sotw_ack_stale_nonce_and_nack_get_no_response() {
    let mut h = Harness::new(ctx("v1", &[("c1", "C1"), ("c2", "C2")], &[])).await;
    let (tx, mut s) = sotw(&mut h).await;
    tx.send(req(CLUSTER_TYPE, &[], "")).await.unwrap();
    let r1 = next(&mut s).await;
    assert_eq!(names(&r1), ["C1", "C2"]);
    assert_eq!(r1.version_info, "v1");
    tx.send(req(CLUSTER_TYPE, &[], &r1.nonce)).await.unwrap(); // ACK
    nothing(&mut s).await;
    tx.send(req(CLUSTER_TYPE, &[], "stale-nonce"))
        .await
        .unwrap();
    nothing(&mut s).await;
    assert_eq!(h.metric("pilot_xds_expired_nonce", "cds"), 1);
    let mut nack = req(CLUSTER_TYPE, &[], &r1.nonce);
    nack.error_detail = Some(proto::pb::google::rpc::Status {
        code: 13,
        message: "bad cluster".into(),
        details: vec![],
    });
    tx.send(nack).await.unwrap();
    nothing(&mut s).await;
    assert_eq!(h.metric("pilot_total_xds_rejects", "cds"), 1);
    // A later push is still sent (Istio retries on the next push).
    h.push(ctx("v2", &[("c1", "C1b")], &[]), None);
    let r2 = next(&mut s).await;
    assert_eq!(
        (names(&r2), r2.version_info.as_str()),
        (vec!["C1b".to_string()], "v2")
    );
}

#[tokio::test]
async fn sotw_named_types_add_names_and_unsubscribe_with_empty_list() {
    let eds = [("outbound|80||a", "A"), ("outbound|80||b", "B")];
    let mut h = Harness::new(ctx("v1", &[], &eds)).await;
    let (tx, mut s) = sotw(&mut h).await;
    tx.send(req(ENDPOINT_TYPE, &["outbound|80||a"], ""))
        .await
        .unwrap();
    let r1 = next(&mut s).await;
    assert_eq!(names(&r1), ["A"]);
    // Adding a name answers with the added name only.
    tx.send(req(
        ENDPOINT_TYPE,
        &["outbound|80||a", "outbound|80||b"],
        &r1.nonce,
    ))
    .await
    .unwrap();
    let r2 = next(&mut s).await;
    assert_eq!(names(&r2), ["B"]);
    // Removing a name needs no answer.
    tx.send(req(ENDPOINT_TYPE, &["outbound|80||b"], &r2.nonce))
        .await
        .unwrap();
    nothing(&mut s).await;
    // An empty list unsubscribes: pushes no longer carry EDS.
    tx.send(req(ENDPOINT_TYPE, &[], &r2.nonce)).await.unwrap();
    nothing(&mut s).await;
    h.push(ctx("v2", &[], &[("outbound|80||b", "B2")]), None);
    nothing(&mut s).await;
}

#[tokio::test]
async fn endpoint_only_push_sends_only_the_changed_clusters_eds() {
    let eds = [("outbound|80||a", "A"), ("outbound|80||b", "B")];
    let mut h = Harness::new(ctx(
        "v1",
        &[("outbound|80||a", "CA"), ("outbound|80||b", "CB")],
        &eds,
    ))
    .await;
    let (tx, mut s) = sotw(&mut h).await;
    tx.send(req(CLUSTER_TYPE, &[], "")).await.unwrap();
    let c = next(&mut s).await;
    tx.send(req(CLUSTER_TYPE, &[], &c.nonce)).await.unwrap();
    tx.send(req(
        ENDPOINT_TYPE,
        &["outbound|80||a", "outbound|80||b"],
        "",
    ))
    .await
    .unwrap();
    let e = next(&mut s).await;
    assert_eq!(names(&e), ["A", "B"]);
    tx.send(req(
        ENDPOINT_TYPE,
        &["outbound|80||a", "outbound|80||b"],
        &e.nonce,
    ))
    .await
    .unwrap();
    nothing(&mut s).await;
    h.push(
        ctx(
            "v2",
            &[("outbound|80||a", "CA"), ("outbound|80||b", "CB")],
            &[("outbound|80||a", "A2"), ("outbound|80||b", "B")],
        ),
        Some(&["a"]),
    );
    let r = next(&mut s).await;
    assert_eq!(r.type_url, ENDPOINT_TYPE, "no CDS on an endpoint-only push");
    assert_eq!(names(&r), ["A2"]);
    nothing(&mut s).await;
}

fn dreq(t: &str, sub: &[&str], nonce: &str, initial: &[(&str, &str)]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: node(),
        type_url: t.into(),
        resource_names_subscribe: sub.iter().map(|s| s.to_string()).collect(),
        response_nonce: nonce.into(),
        initial_resource_versions: initial
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

fn dnames(r: &DeltaDiscoveryResponse) -> Vec<String> {
    r.resources.iter().map(|x| x.name.clone()).collect()
}

#[tokio::test]
async fn delta_sends_only_changes_and_removals_and_honours_known_versions() {
    let v1 = ctx("v1", &[("c1", "C1"), ("c2", "C2"), ("c3", "C3")], &[]);
    let mut h = Harness::new(v1).await;
    let (tx, rx) = mpsc::channel(16);
    let mut s = h
        .client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(dreq(CLUSTER_TYPE, &[], "", &[])).await.unwrap();
    let r1 = next(&mut s).await;
    assert_eq!(dnames(&r1), ["c1", "c2", "c3"]);
    tx.send(dreq(CLUSTER_TYPE, &[], &r1.nonce, &[]))
        .await
        .unwrap();
    nothing(&mut s).await;
    let known: Vec<(String, String)> = r1
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect();

    // c2 changes, c3 goes, c4 comes: only those travel.
    h.push(
        ctx("v2", &[("c1", "C1"), ("c2", "C2b"), ("c4", "C4")], &[]),
        None,
    );
    let r2 = next(&mut s).await;
    assert_eq!(dnames(&r2), ["c2", "c4"]);
    assert_eq!(r2.removed_resources, ["c3"]);
    drop(tx);

    // Reconnect telling the server what the client had before the push.
    let (tx, rx) = mpsc::channel(16);
    let mut s = h
        .client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let initial: Vec<(&str, &str)> = known
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    tx.send(dreq(CLUSTER_TYPE, &[], "", &initial))
        .await
        .unwrap();
    let r3 = next(&mut s).await;
    assert_eq!(
        dnames(&r3),
        ["c2", "c4"],
        "c1 is unchanged and not sent again"
    );
    assert_eq!(r3.removed_resources, ["c3"]);
}

#[tokio::test]
async fn delta_named_subscribe_and_unsubscribe() {
    let mut h = Harness::new(ctx(
        "v1",
        &[],
        &[("outbound|80||a", "A"), ("outbound|80||b", "B")],
    ))
    .await;
    let (tx, rx) = mpsc::channel(16);
    let mut s = h
        .client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(dreq(ENDPOINT_TYPE, &["outbound|80||a"], "", &[]))
        .await
        .unwrap();
    let r1 = next(&mut s).await;
    assert_eq!(dnames(&r1), ["outbound|80||a"]);
    tx.send(dreq(ENDPOINT_TYPE, &["outbound|80||b"], &r1.nonce, &[]))
        .await
        .unwrap();
    let r2 = next(&mut s).await;
    assert_eq!(dnames(&r2), ["outbound|80||b"]);
    let mut unsub = dreq(ENDPOINT_TYPE, &[], &r2.nonce, &[]);
    unsub.resource_names_unsubscribe = vec!["outbound|80||a".into()];
    tx.send(unsub).await.unwrap();
    nothing(&mut s).await;
    h.push(
        ctx(
            "v2",
            &[],
            &[("outbound|80||a", "A2"), ("outbound|80||b", "B")],
        ),
        None,
    );
    nothing(&mut s).await;
}
