//! istiod's xDS on :15012 authenticates callers as its CA does and checks
//! that the caller's identity matches the proxy's node metadata.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::service::discovery::v3::DiscoveryRequest;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::pb::google::protobuf::{Struct, Value, value::Kind};
use tests::Istiod;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

fn request(ns: &str, sa: &str) -> DiscoveryRequest {
    let meta = |v: &str| Value {
        kind: Some(Kind::StringValue(v.into())),
    };
    DiscoveryRequest {
        node: Some(Node {
            id: format!("sidecar~10.0.0.1~app-1.{ns}~{ns}.svc.cluster.local"),
            metadata: Some(Struct {
                fields: [
                    ("NAMESPACE".to_string(), meta(ns)),
                    ("SERVICE_ACCOUNT".to_string(), meta(sa)),
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

/// Opens a stream with `token`, sends one CDS request; returns the first answer's status.
async fn first_answer(
    istiod: &Istiod,
    token: Option<String>,
    req: DiscoveryRequest,
) -> Result<(), tonic::Status> {
    let mut client = AggregatedDiscoveryServiceClient::new(istiod.channel());
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(req).await.unwrap();
    let mut r = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    let mut stream = client.stream_aggregated_resources(r).await?.into_inner();
    let msg = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("an answer");
    drop(tx);
    msg.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_on_15012_checks_credentials_and_identity() {
    let tmp = tempfile::tempdir().unwrap();
    let istiod = Istiod::start(tmp.path(), &[]);

    let err = first_answer(&istiod, None, request("default", "sleep"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");

    let token = istiod.token("default", "sleep");
    let err = first_answer(
        &istiod,
        Some(token.clone()),
        request("istio-system", "istiod"),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("authorization failed"), "{err:?}");
    let err = first_answer(&istiod, Some(token.clone()), request("default", "other"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    // The right identity is served, and istiod kept serving throughout.
    first_answer(&istiod, Some(token), request("default", "sleep"))
        .await
        .unwrap();
}

/// Istio's `XDS_AUTH=false`: istiod serves xDS on :15012 without
/// authenticating the caller (the CA still does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_auth_false_serves_callers_without_credentials() {
    let tmp = tempfile::tempdir().unwrap();
    let istiod = Istiod::start(tmp.path(), &[("XDS_AUTH", "false")]);
    first_answer(&istiod, None, request("default", "sleep"))
        .await
        .unwrap();
}
