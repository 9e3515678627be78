//! A fake upstream ADS server (istiod's side of Envoy's
//! `AggregatedDiscoveryService`, state of the world and delta). It answers
//! nothing by itself: it records every request in arrival order, and the
//! test pushes responses on demand, ends streams, drops connections or stops
//! the whole server, and watches live counts of open streams and
//! connections.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::metadata::MetadataMap;
use tonic::transport::Server;
use tonic::{Request, Response, Status, Streaming};

use super::{Connections, FakeError, TestRoot, Transport, listen, lock, wait_until};
use crate::xds::ResponseStream;

/// A request as the server received it.
#[derive(Debug, Clone, PartialEq)]
pub enum XdsRequest {
    /// State of the world.
    Sotw(DiscoveryRequest),
    /// Delta.
    Delta(DeltaDiscoveryRequest),
}

impl XdsRequest {
    /// The request's type URL.
    pub fn type_url(&self) -> &str {
        match self {
            XdsRequest::Sotw(r) => &r.type_url,
            XdsRequest::Delta(r) => &r.type_url,
        }
    }
}

/// One request and the stream it came on.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    /// The stream's number (from 1, in the order streams opened).
    pub stream: u64,
    /// The request.
    pub request: XdsRequest,
}

/// An open stream, as a test sees it.
#[derive(Debug, Clone)]
pub struct StreamInfo {
    /// The stream's number.
    pub id: u64,
    /// Whether it is a delta stream.
    pub delta: bool,
    /// The gRPC metadata it opened with (`authorization`, `clusterid`, ...).
    pub metadata: MetadataMap,
}

enum Sender {
    Sotw(mpsc::UnboundedSender<Result<DiscoveryResponse, Status>>),
    Delta(mpsc::UnboundedSender<Result<DeltaDiscoveryResponse, Status>>),
}

struct OpenStream {
    sender: Sender,
    metadata: MetadataMap,
    /// Ends the stream's reader.
    stop: CancellationToken,
}

struct State {
    next_stream: AtomicU64,
    streams: Mutex<BTreeMap<u64, OpenStream>>,
    received: Mutex<Vec<Received>>,
    changed: Arc<watch::Sender<u64>>,
}

impl State {
    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    fn close(&self, id: u64) {
        if lock(&self.streams).remove(&id).is_some() {
            self.bump();
        }
    }

    fn record(&self, stream: u64, request: XdsRequest) {
        lock(&self.received).push(Received { stream, request });
        self.bump();
    }
}

/// A running fake ADS server; stops when dropped.
pub struct FakeAds {
    state: Arc<State>,
    addr: SocketAddr,
    tls_root_pem: Option<String>,
    connections: Arc<Connections>,
    stop: CancellationToken,
    server: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for FakeAds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeAds")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// A response stream that ends its stream's reader when tonic drops it
/// (the client went away).
struct Outbound<T> {
    rx: UnboundedReceiverStream<Result<T, Status>>,
    _stop: DropGuard,
}

impl<T> Stream for Outbound<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.rx).poll_next(cx)
    }
}

#[derive(Clone)]
struct Service(Arc<State>);

impl Service {
    /// Registers a stream and reads its requests until the client ends it,
    /// the response side is dropped, or the test ends it.
    fn open<Req: Send + 'static, Resp>(
        &self,
        request: Request<Streaming<Req>>,
        sender: impl FnOnce(mpsc::UnboundedSender<Result<Resp, Status>>) -> Sender,
        wrap: fn(Req) -> XdsRequest,
    ) -> Outbound<Resp> {
        let metadata = request.metadata().clone();
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let id = self.0.next_stream.fetch_add(1, Ordering::SeqCst);
        lock(&self.0.streams).insert(
            id,
            OpenStream {
                sender: sender(tx),
                metadata,
                stop: stop.clone(),
            },
        );
        self.0.bump();
        let state = self.0.clone();
        let reader_stop = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = reader_stop.cancelled() => break,
                    msg = inbound.message() => match msg {
                        Ok(Some(req)) => state.record(id, wrap(req)),
                        // Istio's server ends the stream on EOF as on an error.
                        Ok(None) | Err(_) => break,
                    },
                }
            }
            state.close(id);
        });
        Outbound {
            rx: UnboundedReceiverStream::new(rx),
            _stop: stop.drop_guard(),
        }
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Service {
    type StreamAggregatedResourcesStream = ResponseStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = ResponseStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let out = self.open(request, Sender::Sotw, XdsRequest::Sotw);
        Ok(Response::new(Box::pin(out)))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let out = self.open(request, Sender::Delta, XdsRequest::Delta);
        Ok(Response::new(Box::pin(out)))
    }
}

impl FakeAds {
    /// Starts the server on `127.0.0.1:0`.
    pub async fn start(transport: Transport) -> Result<Self, FakeError> {
        let changed = Arc::new(watch::channel(0).0);
        let state = Arc::new(State {
            next_stream: AtomicU64::new(1),
            streams: Mutex::new(BTreeMap::new()),
            received: Mutex::new(Vec::new()),
            changed: changed.clone(),
        });
        let connections = Connections::new(changed);
        let stop = CancellationToken::new();
        let (addr, incoming) = listen(connections.clone(), stop.clone()).await?;
        let mut builder = Server::builder();
        let tls_root_pem = match transport {
            Transport::Plaintext => None,
            Transport::Tls => {
                let root = TestRoot::generate("cluster.local")?;
                builder = builder.tls_config(root.server_tls()?)?;
                Some(root.pem)
            }
        };
        let service = AggregatedDiscoveryServiceServer::new(Service(state.clone()))
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        let server = tokio::spawn(async move {
            if let Err(e) = builder
                .add_service(service)
                .serve_with_incoming(incoming)
                .await
            {
                tracing::debug!("fake ADS: {e}");
            }
        });
        Ok(Self {
            state,
            addr,
            tls_root_pem,
            connections,
            stop,
            server,
        })
    }

    /// The address it listens on (`host:port` for the agent's discovery address).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The root a TLS client must trust; `None` in plaintext.
    pub fn tls_root_pem(&self) -> Option<&str> {
        self.tls_root_pem.as_deref()
    }

    /// Every request so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        lock(&self.state.received).clone()
    }

    /// The state-of-the-world requests so far, in arrival order.
    pub fn requests(&self) -> Vec<DiscoveryRequest> {
        lock(&self.state.received)
            .iter()
            .filter_map(|r| match &r.request {
                XdsRequest::Sotw(r) => Some(r.clone()),
                XdsRequest::Delta(_) => None,
            })
            .collect()
    }

    /// The delta requests so far, in arrival order.
    pub fn delta_requests(&self) -> Vec<DeltaDiscoveryRequest> {
        lock(&self.state.received)
            .iter()
            .filter_map(|r| match &r.request {
                XdsRequest::Delta(r) => Some(r.clone()),
                XdsRequest::Sotw(_) => None,
            })
            .collect()
    }

    /// Waits until at least `n` requests (of either kind) have arrived and
    /// returns them all.
    pub async fn wait_received(
        &self,
        n: usize,
        limit: Duration,
    ) -> Result<Vec<Received>, FakeError> {
        wait_until(
            &self.state.changed,
            &format!("{n} xDS requests"),
            limit,
            || {
                let all = self.received();
                (all.len() >= n).then_some(all)
            },
        )
        .await
    }

    /// The streams open now, oldest first.
    pub fn streams(&self) -> Vec<StreamInfo> {
        lock(&self.state.streams)
            .iter()
            .map(|(id, s)| StreamInfo {
                id: *id,
                delta: matches!(s.sender, Sender::Delta(_)),
                metadata: s.metadata.clone(),
            })
            .collect()
    }

    /// How many streams are open now.
    pub fn open_streams(&self) -> usize {
        lock(&self.state.streams).len()
    }

    /// How many TCP connections are open now.
    pub fn open_connections(&self) -> usize {
        self.connections.open()
    }

    /// How many TCP connections were ever accepted.
    pub fn accepted_connections(&self) -> usize {
        self.connections.accepted()
    }

    /// Waits until exactly `n` streams are open.
    pub async fn wait_open_streams(&self, n: usize, limit: Duration) -> Result<(), FakeError> {
        wait_until(
            &self.state.changed,
            &format!("{n} open streams"),
            limit,
            || (self.open_streams() == n).then_some(()),
        )
        .await
    }

    /// Waits until exactly `n` connections are open.
    pub async fn wait_open_connections(&self, n: usize, limit: Duration) -> Result<(), FakeError> {
        wait_until(
            &self.state.changed,
            &format!("{n} open connections"),
            limit,
            || (self.open_connections() == n).then_some(()),
        )
        .await
    }

    /// Sends `response` on every open state-of-the-world stream; returns how many.
    pub fn push(&self, response: DiscoveryResponse) -> usize {
        lock(&self.state.streams)
            .values()
            .filter(|s| match &s.sender {
                Sender::Sotw(tx) => tx.send(Ok(response.clone())).is_ok(),
                Sender::Delta(_) => false,
            })
            .count()
    }

    /// Sends `response` on every open delta stream; returns how many.
    pub fn push_delta(&self, response: DeltaDiscoveryResponse) -> usize {
        lock(&self.state.streams)
            .values()
            .filter(|s| match &s.sender {
                Sender::Delta(tx) => tx.send(Ok(response.clone())).is_ok(),
                Sender::Sotw(_) => false,
            })
            .count()
    }

    /// Ends every open stream from the server's side: with `status` as its
    /// error, or cleanly (`OK`, as istiod's `MaxServerConnectionAge` does)
    /// when `None`. The connections stay open.
    pub fn end_streams(&self, status: Option<Status>) {
        let ended = std::mem::take(&mut *lock(&self.state.streams));
        for s in ended.into_values() {
            if let Some(st) = &status {
                // A stream whose client already left has nobody to tell.
                match &s.sender {
                    Sender::Sotw(tx) => drop(tx.send(Err(st.clone()))),
                    Sender::Delta(tx) => drop(tx.send(Err(st.clone()))),
                }
            }
            s.stop.cancel();
        }
        self.state.bump();
    }

    /// Closes every open connection at once, as a crashed istiod would;
    /// the server keeps accepting new ones.
    pub fn drop_connections(&self) {
        self.connections.kill_all();
    }

    /// Stops the whole server: no new connections, every open one closed.
    pub fn stop(&self) {
        self.stop.cancel();
        self.connections.kill_all();
    }
}

impl Drop for FakeAds {
    fn drop(&mut self) {
        self.stop();
        self.server.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
    use tonic::transport::Channel;

    const LIMIT: Duration = Duration::from_secs(5);

    fn request(type_url: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: type_url.into(),
            ..Default::default()
        }
    }

    async fn client(ads: &FakeAds) -> AggregatedDiscoveryServiceClient<Channel> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", ads.addr()))
            .unwrap()
            .connect()
            .await
            .unwrap();
        AggregatedDiscoveryServiceClient::new(channel)
    }

    #[tokio::test]
    async fn records_in_order_pushes_and_counts_streams() {
        let ads = FakeAds::start(Transport::Plaintext).await.unwrap();
        let mut client = client(&ads).await;
        let (tx, rx) = mpsc::unbounded_channel();
        let mut req = Request::new(UnboundedReceiverStream::new(rx));
        req.metadata_mut()
            .insert("clusterid", "c1".parse().unwrap());
        tx.send(request("a")).unwrap();
        tx.send(request("b")).unwrap();
        let mut responses = client
            .stream_aggregated_resources(req)
            .await
            .unwrap()
            .into_inner();
        ads.wait_received(2, LIMIT).await.unwrap();
        let types: Vec<_> = ads.requests().into_iter().map(|r| r.type_url).collect();
        assert_eq!(types, ["a", "b"]);
        assert_eq!(ads.open_streams(), 1);
        assert_eq!(ads.open_connections(), 1);
        assert_eq!(ads.streams()[0].metadata.get("clusterid").unwrap(), "c1");

        let sent = ads.push(DiscoveryResponse {
            type_url: "a".into(),
            nonce: "n1".into(),
            ..Default::default()
        });
        assert_eq!(sent, 1);
        let got = responses.message().await.unwrap().unwrap();
        assert_eq!(got.nonce, "n1");

        // The client going away closes the stream on the server.
        drop(tx);
        drop(responses);
        ads.wait_open_streams(0, LIMIT).await.unwrap();
    }

    #[tokio::test]
    async fn ends_streams_and_drops_connections() {
        let ads = FakeAds::start(Transport::Plaintext).await.unwrap();
        let mut client = client(&ads).await;
        let (_tx, rx) = mpsc::unbounded_channel::<DiscoveryRequest>();
        let mut responses = client
            .stream_aggregated_resources(UnboundedReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        ads.wait_open_streams(1, LIMIT).await.unwrap();
        ads.end_streams(Some(Status::unavailable("going away")));
        let err = responses.message().await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert_eq!(ads.open_streams(), 0);

        let (_tx, rx) = mpsc::unbounded_channel::<DiscoveryRequest>();
        let mut responses = client
            .stream_aggregated_resources(UnboundedReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        ads.wait_open_streams(1, LIMIT).await.unwrap();
        assert_eq!(ads.open_connections(), 1);
        ads.drop_connections();
        assert!(responses.message().await.is_err());
        ads.wait_open_connections(0, LIMIT).await.unwrap();
        ads.wait_open_streams(0, LIMIT).await.unwrap();
        assert_eq!(ads.accepted_connections(), 1);

        ads.stop();
        let refused = tonic::transport::Endpoint::from_shared(format!("http://{}", ads.addr()))
            .unwrap()
            .connect()
            .await;
        assert!(refused.is_err(), "a stopped server accepts nothing");
    }
}
