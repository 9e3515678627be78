//! The gRPC service `envoy.service.discovery.v3.AggregatedDiscoveryService`,
//! written by hand rather than generated: each stream's requests are read by
//! [`Requests`] and its responses written by its [`ResponseBody`] straight
//! from the shared resources ([`super::wire`]), so no stream keeps a
//! response, or a buffer the size of its largest message.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use proto::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use tonic::Status;
use tonic::body::Body;
use tonic::server::NamedService;

use super::outbox::{Outbox, ResponseBody, STREAM_QUEUE_BYTES};
use super::requests::Requests;
use super::server::DiscoveryServer;

/// The largest request accepted, as Istio's gRPC server sets it.
const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;
const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// The ADS service for a tonic router.
#[derive(Clone)]
pub struct AdsService {
    server: DiscoveryServer,
}

impl DiscoveryServer {
    /// The gRPC service, for a tonic router.
    pub fn into_service(self) -> AdsService {
        AdsService { server: self }
    }
}

impl NamedService for AdsService {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

fn grpc_response(body: ResponseBody) -> http::Response<Body> {
    let mut response = http::Response::new(Body::new(body));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// The stream's requests.
fn requests<M: prost::Message + Default>(body: Body) -> Requests<M> {
    Requests::new(body, MAX_REQUEST_BYTES)
}

async fn serve(server: DiscoveryServer, req: http::Request<Body>) -> http::Response<Body> {
    let delta = match req.uri().path() {
        SOTW_PATH => false,
        DELTA_PATH => true,
        _ => return Status::unimplemented("").into_http(),
    };
    let (parts, body) = req.into_parts();
    let metadata = tonic::Request::from_http(http::Request::from_parts(parts, ()));
    let identities = match server.admit(&metadata).await {
        Ok(identities) => identities,
        Err(status) => return status.into_http(),
    };
    let (outbox, response) = Outbox::new(STREAM_QUEUE_BYTES);
    if delta {
        let inbound = requests::<DeltaDiscoveryRequest>(body);
        tokio::spawn(super::delta::run(server, identities, inbound, outbox));
    } else {
        let inbound = requests::<DiscoveryRequest>(body);
        tokio::spawn(super::sotw::run(server, identities, inbound, outbox));
    }
    grpc_response(response)
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

impl tower::Service<http::Request<Body>> for AdsService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let server = self.server.clone();
        Box::pin(async move { Ok(serve(server, req).await) })
    }
}
