//! The agent's xDS proxy with the real istiod and a real Envoy: a stream
//! that leaves the agent's XDS socket closes its istiod stream at once,
//! not at istiod's next push.
//!
//! The agent exits when its Envoy exits, so the stream that leaves is a
//! second client's on the agent's socket (`./etc/istio/proxy/XDS`), as
//! Envoy's `xds-grpc` cluster connects, while the Pod's Envoy keeps running.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::service::discovery::v3::DiscoveryRequest;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::pb::google::protobuf::{Struct, Value, value::Kind};
use tests::sample_mesh::SampleMesh;
use tests::{http_get, wait_for};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Endpoint;

/// The sample mesh, with this test's queries on it.
struct Mesh(SampleMesh);

impl std::ops::Deref for Mesh {
    type Target = SampleMesh;
    fn deref(&self) -> &SampleMesh {
        &self.0
    }
}

impl std::ops::DerefMut for Mesh {
    fn deref_mut(&mut self) -> &mut SampleMesh {
        &mut self.0
    }
}

/// istiod on the sample mesh and the `sleep` Pod's agent and Envoy, ready.
fn start() -> Mesh {
    Mesh(SampleMesh::start("xdsproxy"))
}

impl Mesh {
    /// The sum of a metric's series on istiod's monitoring port.
    fn metric(&self, name: &str) -> f64 {
        let addr = self.istiod.monitoring;
        let (_, body) = self.ns.run(move || http_get(addr, "/metrics")).unwrap();
        body.lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// istiod's connected proxies (`pilot_xds`).
    fn connected(&self) -> f64 {
        self.metric("pilot_xds")
    }
}

/// A CDS request as another sidecar of the same Pod identity sends it.
fn cds_request() -> DiscoveryRequest {
    let s = |v: &str| Value {
        kind: Some(Kind::StringValue(v.into())),
    };
    DiscoveryRequest {
        node: Some(Node {
            id: "sidecar~198.18.0.3~probe-1.demo~demo.svc.cluster.local".into(),
            metadata: Some(Struct {
                fields: [
                    ("NAMESPACE".to_string(), s("demo")),
                    ("SERVICE_ACCOUNT".to_string(), s("sleep")),
                    ("CLUSTER_ID".to_string(), s("Kubernetes")),
                ]
                .into_iter()
                .collect(),
            }),
            ..Default::default()
        }),
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
        ..Default::default()
    }
}

#[test]
fn a_stream_leaving_the_agent_closes_its_istiod_stream_before_any_push() {
    let mut mesh = start();
    wait_for(
        "istiod to count the Pod's Envoy",
        Duration::from_secs(10),
        || (mesh.connected() == 1.0).then_some(()),
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let socket: PathBuf = mesh.pod.xds_socket();
    let (tx, responses) = rt.block_on(async {
        let channel = Endpoint::from_static("http://localhost")
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let socket = socket.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(socket).await?,
                    ))
                }
            }))
            .await
            .unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(cds_request()).unwrap();
        let mut responses = AggregatedDiscoveryServiceClient::new(channel)
            .stream_aggregated_resources(UnboundedReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let first = tokio::time::timeout(Duration::from_secs(10), responses.message())
            .await
            .expect("istiod answers through the agent")
            .unwrap()
            .unwrap();
        assert!(!first.resources.is_empty(), "istiod's clusters");
        (tx, responses)
    });
    wait_for(
        "istiod to count the second stream",
        Duration::from_secs(10),
        || (mesh.connected() == 2.0).then_some(()),
    );
    let pushes = mesh.metric("pilot_xds_pushes");

    // The client leaves; nothing in the mesh changes, so istiod pushes nothing.
    drop(tx);
    drop(responses);
    drop(rt);
    let started = Instant::now();
    wait_for(
        "istiod to see the stream that left closed (the agent kept it open until the next push)",
        Duration::from_secs(10),
        || (mesh.connected() == 1.0).then_some(()),
    );
    eprintln!("istiod saw the stream closed after {:?}", started.elapsed());
    assert_eq!(
        mesh.metric("pilot_xds_pushes"),
        pushes,
        "no push happened that could have closed it"
    );
    // The Pod's own Envoy keeps its stream and the agent keeps running.
    assert!(mesh.agent.alive(), "{}", mesh.agent.log());
    assert_eq!(mesh.connected(), 1.0);
    assert_eq!(mesh.get(15021, "/healthz/ready").map(|(c, _)| c), Some(200));
}
