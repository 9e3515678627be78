//! The xDS proxy (Istio's `pkg/istio-agent/xds_proxy.go`): Envoy's ADS
//! streams arrive on the Unix socket `<configPath>/XDS`; each is forwarded to
//! istiod over its own fresh connection (TLS verified against istiod's root and
//! expected name, authenticated by the workload certificate once there is one,
//! by the projected token before that). Requests keep their order on an
//! unbounded queue, so a slow upstream never loses or reorders them. istiod's
//! DNS name table (NDS) is taken by the agent; only Envoy's types go to Envoy.
//! When a stream fails, the error goes to Envoy, which reconnects with its own
//! backoff while keeping its configuration; when Envoy leaves, the upstream
//! stream and its connection close at once, not at istiod's next push.
//! With a `readinessProbe`, the application's health goes upstream too, as
//! `istio.io/health` requests once the first LDS request has gone (Istio's
//! `sendHealthCheckRequest`), and again on every new upstream stream.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use proto::pb::google::protobuf::Any;
use proto::pb::google::rpc::Status as RpcStatus;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tonic::metadata::{AsciiMetadataValue, MetadataKey};
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use common::xds::{
    ENVOY_TYPE_PREFIX, HEALTH_INFO_TYPE, LISTENER_TYPE, NAME_TABLE_TYPE, WORKLOAD_TYPE,
};

use crate::health_check::ProbeEvent;

use crate::config::Config;
use crate::dns::NameTableError;
use crate::secret_manager::SecretWatch;
use common::xds::ResponseStream;

/// Consumes the name table istiod sends (for the DNS proxy).
pub type NdsHandler = Arc<dyn Fn(&Any) -> Result<(), NameTableError> + Send + Sync>;

/// The xDS proxy.
#[derive(Clone)]
pub struct XdsProxy {
    config: Arc<Config>,
    secrets: SecretWatch,
    nds: Option<NdsHandler>,
    health: Option<watch::Receiver<Option<ProbeEvent>>>,
}

/// Whether a response goes on to Envoy: Envoy's own types and ambient
/// workloads; the name table (NDS) is the agent's.
fn forwardable(type_url: &str) -> bool {
    type_url.starts_with(ENVOY_TYPE_PREFIX) || type_url == WORKLOAD_TYPE
}

impl XdsProxy {
    /// A proxy to the discovery address in `config`.
    pub fn new(config: Arc<Config>, secrets: SecretWatch, nds: Option<NdsHandler>) -> Self {
        Self {
            config,
            secrets,
            nds,
            health: None,
        }
    }

    /// The same proxy, sending the application's health upstream.
    pub fn with_health(self, health: watch::Receiver<Option<ProbeEvent>>) -> Self {
        Self {
            health: Some(health),
            ..self
        }
    }

    /// The tonic service for Envoy's socket.
    pub fn into_service(self) -> AggregatedDiscoveryServiceServer<Self> {
        AggregatedDiscoveryServiceServer::new(self)
            .max_decoding_message_size(4 * 1024 * 1024)
            .max_encoding_message_size(usize::MAX)
    }

    /// A fresh upstream connection; whether it authenticates with the workload certificate.
    fn upstream(&self) -> Result<(AggregatedDiscoveryServiceClient<Channel>, bool), Status> {
        let xds = &self.config.xds_proxy;
        let addr = &xds.discovery_address;
        let current = self.secrets.borrow().clone();
        let with_cert = xds.root_path.is_some() && current.is_some();
        let tls = match &xds.root_path {
            None => None,
            Some(root) => {
                let root = root.clone();
                let secret = current.clone();
                let source: common::tls::ClientConfigSource = Arc::new(move || {
                    let pem = std::fs::read_to_string(&root).map_err(|e| {
                        common::tls::TlsError::Root {
                            what: root.display().to_string(),
                            reason: format!("root CA file for XDS cannot be read: {e}"),
                        }
                    })?;
                    let store = common::tls::root_store(&root.display().to_string(), &pem)?;
                    let client = match &secret {
                        Some(s) => {
                            let chain: Vec<CertificateDer<'static>> =
                                common::pki::pem_certs("workload certificate", &s.cert_chain_pem)?;
                            let key = <PrivateKeyDer<'static> as rustls::pki_types::pem::PemObject>::from_pem_slice(s.key_pem.as_bytes())
                                .map_err(|e| common::tls::TlsError::Root { what: "workload key".into(), reason: e.to_string() })?;
                            Some((chain, key))
                        }
                        None => None,
                    };
                    Ok(Arc::new(common::tls::grpc_client_config(store, client)?))
                });
                let name = ServerName::try_from(xds.server_name.clone()).map_err(|e| {
                    Status::internal(format!("istiod server name {:?}: {e}", xds.server_name))
                })?;
                Some((source, name))
            }
        };
        let channel =
            common::tls::grpc_channel_with(addr, tls, Duration::from_secs(5), xds.keepalive)
                .map_err(|e| Status::unavailable(format!("connecting to istiod at {addr}: {e}")))?;
        let client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        Ok((client, with_cert))
    }

    /// Istio's outgoing metadata: `ClusterID`, `XDS_HEADER_*`, and the token
    /// (re-read for every stream, off the async workers) until the workload
    /// certificate authenticates instead.
    async fn decorate<T>(&self, req: &mut Request<T>, with_cert: bool) {
        let token = if with_cert {
            None
        } else {
            tokio::fs::read_to_string(&self.config.identity.token_path)
                .await
                .ok()
        };
        let md = req.metadata_mut();
        let mut put = |k: &str, v: &str| {
            if let (Ok(k), Ok(v)) = (
                MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes()),
                AsciiMetadataValue::try_from(v),
            ) {
                md.insert(k, v);
            }
        };
        if !self.config.pod.cluster_id.is_empty() {
            put("ClusterID", &self.config.pod.cluster_id);
        }
        for (k, v) in &self.config.xds_proxy.headers {
            put(k, v);
        }
        if let Some(token) = token
            && !token.trim().is_empty()
        {
            put("authorization", &format!("Bearer {}", token.trim()));
        }
    }

    fn handle_nds(&self, resources: &[Any]) -> Result<(), NameTableError> {
        match (&self.nds, resources.first()) {
            (Some(h), Some(table)) => h(table),
            _ => Ok(()),
        }
    }
}

/// What differs between state-of-the-world and delta streams; the proxying
/// itself ([`XdsProxy::proxy`]) is the same for both, as Istio's
/// `xds_proxy.go` and `xds_proxy_delta.go` mirror each other.
trait Flavor: Send + 'static {
    /// Envoy's request.
    type Req: Send + 'static;
    /// istiod's response.
    type Resp: Send + 'static;
    /// "delta " or "", for logs.
    const LABEL: &'static str;

    fn req_type_url(req: &Self::Req) -> &str;
    fn req_node(req: &Self::Req) -> Option<Node>;
    /// The agent's own NDS subscription.
    fn nds_request(node: Option<Node>) -> Self::Req;
    fn resp_type_url(resp: &Self::Resp) -> &str;
    /// The name tables an NDS response carries.
    fn tables(resp: &Self::Resp) -> Vec<Any>;
    /// The agent's ACK (no error) or NACK of an NDS response.
    fn ack(resp: &Self::Resp, error: Option<RpcStatus>) -> Self::Req;
    /// The agent's health report.
    fn health_request(error: Option<RpcStatus>) -> Self::Req;
    /// Opens the upstream stream.
    fn open(
        client: AggregatedDiscoveryServiceClient<Channel>,
        requests: Request<UnboundedReceiverStream<Self::Req>>,
    ) -> impl Future<Output = Result<Response<Streaming<Self::Resp>>, Status>> + Send;
}

/// `StreamAggregatedResources`.
struct Sotw;

impl Flavor for Sotw {
    type Req = DiscoveryRequest;
    type Resp = DiscoveryResponse;
    const LABEL: &'static str = "";

    fn req_type_url(req: &DiscoveryRequest) -> &str {
        &req.type_url
    }

    fn req_node(req: &DiscoveryRequest) -> Option<Node> {
        req.node.clone()
    }

    fn nds_request(node: Option<Node>) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: NAME_TABLE_TYPE.into(),
            node,
            ..Default::default()
        }
    }

    fn resp_type_url(resp: &DiscoveryResponse) -> &str {
        &resp.type_url
    }

    fn tables(resp: &DiscoveryResponse) -> Vec<Any> {
        resp.resources.clone()
    }

    fn ack(resp: &DiscoveryResponse, error: Option<RpcStatus>) -> DiscoveryRequest {
        // As Istio: a NACK carries no version.
        let version_info = match error {
            None => resp.version_info.clone(),
            Some(_) => String::new(),
        };
        DiscoveryRequest {
            type_url: resp.type_url.clone(),
            version_info,
            response_nonce: resp.nonce.clone(),
            error_detail: error,
            ..Default::default()
        }
    }

    fn health_request(error: Option<RpcStatus>) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: HEALTH_INFO_TYPE.into(),
            error_detail: error,
            ..Default::default()
        }
    }

    async fn open(
        mut client: AggregatedDiscoveryServiceClient<Channel>,
        requests: Request<UnboundedReceiverStream<DiscoveryRequest>>,
    ) -> Result<Response<Streaming<DiscoveryResponse>>, Status> {
        client.stream_aggregated_resources(requests).await
    }
}

/// `DeltaAggregatedResources`.
struct Delta;

impl Flavor for Delta {
    type Req = DeltaDiscoveryRequest;
    type Resp = DeltaDiscoveryResponse;
    const LABEL: &'static str = "delta ";

    fn req_type_url(req: &DeltaDiscoveryRequest) -> &str {
        &req.type_url
    }

    fn req_node(req: &DeltaDiscoveryRequest) -> Option<Node> {
        req.node.clone()
    }

    fn nds_request(node: Option<Node>) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: NAME_TABLE_TYPE.into(),
            node,
            ..Default::default()
        }
    }

    fn resp_type_url(resp: &DeltaDiscoveryResponse) -> &str {
        &resp.type_url
    }

    fn tables(resp: &DeltaDiscoveryResponse) -> Vec<Any> {
        resp.resources
            .iter()
            .filter_map(|r| r.resource.clone())
            .collect()
    }

    fn ack(resp: &DeltaDiscoveryResponse, error: Option<RpcStatus>) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            error_detail: error,
            ..Default::default()
        }
    }

    fn health_request(error: Option<RpcStatus>) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: HEALTH_INFO_TYPE.into(),
            error_detail: error,
            ..Default::default()
        }
    }

    async fn open(
        mut client: AggregatedDiscoveryServiceClient<Channel>,
        requests: Request<UnboundedReceiverStream<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Streaming<DeltaDiscoveryResponse>>, Status> {
        client.delta_aggregated_resources(requests).await
    }
}

impl XdsProxy {
    /// Proxies one Envoy stream over a fresh upstream stream. Either side
    /// ending ends both, as Istio's `handleUpstream` returns on the first of
    /// the upstream and downstream errors: an upstream end is passed to
    /// Envoy (which reconnects with its own backoff), and Envoy leaving
    /// closes the upstream stream and its connection at once.
    async fn proxy<F: Flavor>(
        &self,
        request: Request<Streaming<F::Req>>,
    ) -> Result<Response<ResponseStream<F::Resp>>, Status> {
        let (client, with_cert) = self.upstream()?;
        let inbound = request.into_inner();
        let (up_tx, up_rx) = mpsc::unbounded_channel::<F::Req>();
        // Dropped by the reader when Envoy's requests end, and by the
        // responder when the proxied stream ends: each side waits on the other.
        let (envoy_gone, envoy_gone_rx) = oneshot::channel::<()>();
        let (proxy_done, proxy_done_rx) = oneshot::channel::<()>();
        tokio::spawn(read_envoy::<F>(
            inbound,
            up_tx.clone(),
            self.nds.is_some(),
            self.health.clone(),
            envoy_gone,
            proxy_done_rx,
        ));
        let mut upstream = Request::new(UnboundedReceiverStream::new(up_rx));
        self.decorate(&mut upstream, with_cert).await;
        let responses = F::open(client, upstream)
            .await
            .inspect_err(|s| {
                tracing::warn!(target: "xdsproxy", "upstream {}xDS stream to {} failed: {}", F::LABEL, self.config.xds_proxy.discovery_address, s.message());
            })?
            .into_inner();
        tracing::info!(target: "xdsproxy", "connected to {}upstream XDS server: {}", F::LABEL, self.config.xds_proxy.discovery_address);
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(self.clone().forward_responses::<F>(
            responses,
            up_tx,
            tx,
            envoy_gone_rx,
            proxy_done,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    /// istiod's responses to Envoy, in order, NDS to the agent's handler,
    /// until either side ends. Returning drops the upstream stream, its
    /// request queue and (with them) its connection.
    async fn forward_responses<F: Flavor>(
        self,
        mut responses: Streaming<F::Resp>,
        up_tx: mpsc::UnboundedSender<F::Req>,
        tx: mpsc::Sender<Result<F::Resp, Status>>,
        mut envoy_gone: oneshot::Receiver<()>,
        _done: oneshot::Sender<()>,
    ) {
        loop {
            let next = tokio::select! {
                _ = &mut envoy_gone => {
                    tracing::debug!(target: "xdsproxy", "Envoy closed its {}xDS stream; closing the upstream stream", F::LABEL);
                    return;
                }
                () = tx.closed() => {
                    tracing::debug!(target: "xdsproxy", "Envoy's {}xDS stream is gone; closing the upstream stream", F::LABEL);
                    return;
                }
                next = responses.message() => next,
            };
            match next {
                Ok(Some(resp)) if F::resp_type_url(&resp) == NAME_TABLE_TYPE => {
                    let tables = F::tables(&resp);
                    if tables.is_empty() {
                        continue;
                    }
                    let error = self.handle_nds(&tables).err().map(|e| RpcStatus {
                        code: 13,
                        message: e.to_string(),
                        details: vec![],
                    });
                    let _ = up_tx.send(F::ack(&resp, error));
                }
                Ok(Some(resp)) if forwardable(F::resp_type_url(&resp)) => {
                    if tx.send(Ok(resp)).await.is_err() {
                        return;
                    }
                }
                Ok(Some(resp)) => {
                    tracing::debug!(target: "xdsproxy", "dropping response of type {}", F::resp_type_url(&resp))
                }
                Ok(None) => return,
                Err(status) => {
                    tracing::info!(target: "xdsproxy", "upstream terminated: {}", status.message());
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            }
        }
    }
}

/// Envoy's requests, in order, onto the unbounded upstream queue whatever
/// the upstream's speed (istio#39209); the first LDS request brings the
/// agent's NDS subscription after it. Ends when Envoy's requests end (then
/// dropping `_envoy_gone` tells the responder) or the proxied stream ends.
async fn read_envoy<F: Flavor>(
    mut inbound: Streaming<F::Req>,
    up_tx: mpsc::UnboundedSender<F::Req>,
    dns: bool,
    mut health: Option<watch::Receiver<Option<ProbeEvent>>>,
    _envoy_gone: oneshot::Sender<()>,
    mut proxy_done: oneshot::Receiver<()>,
) {
    let mut lds_seen = false;
    loop {
        let req = tokio::select! {
            _ = &mut proxy_done => return,
            event = next_health(&mut health), if lds_seen => {
                if let Some(event) = event
                    && up_tx.send(F::health_request(health_error(&event))).is_err()
                {
                    return;
                }
                continue;
            }
            msg = inbound.message() => match msg {
                Ok(Some(req)) => req,
                // EOF or an error: Istio ends the proxied stream either way.
                Ok(None) | Err(_) => return,
            },
        };
        let first_lds = F::req_type_url(&req) == LISTENER_TYPE && !lds_seen;
        let node = F::req_node(&req);
        if up_tx.send(req).is_err() {
            return;
        }
        if first_lds {
            lds_seen = true;
            if dns {
                let _ = up_tx.send(F::nds_request(node));
            }
            // The health known so far goes with the first LDS request.
            if let Some(event) = health.as_mut().and_then(|h| h.borrow_and_update().clone()) {
                let _ = up_tx.send(F::health_request(health_error(&event)));
            }
        }
    }
}

/// The next health change; pending for ever without a health checker (or
/// once it is gone).
async fn next_health(
    health: &mut Option<watch::Receiver<Option<ProbeEvent>>>,
) -> Option<ProbeEvent> {
    let Some(rx) = health.as_mut() else {
        return std::future::pending().await;
    };
    if rx.changed().await.is_err() {
        *health = None;
        return None;
    }
    rx.borrow_and_update().clone()
}

/// Istio's health request's `error_detail`: code Internal with the probe's
/// message when unhealthy.
fn health_error(event: &ProbeEvent) -> Option<RpcStatus> {
    (!event.healthy).then(|| RpcStatus {
        code: 13,
        message: event.message.clone(),
        details: vec![],
    })
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for XdsProxy {
    type StreamAggregatedResourcesStream = ResponseStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = ResponseStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        self.proxy::<Sotw>(request).await
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        self.proxy::<Delta>(request).await
    }
}

#[cfg(test)]
mod tests;
