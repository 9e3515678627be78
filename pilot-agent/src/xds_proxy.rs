//! The xDS proxy (Istio's `pkg/istio-agent/xds_proxy.go`): Envoy's ADS
//! streams arrive on the Unix socket `<configPath>/XDS`; each is forwarded to
//! istiod over its own fresh connection (TLS verified against istiod's root and
//! expected name, authenticated by the workload certificate once there is one,
//! by the projected token before that). Requests keep their order on an
//! unbounded queue, so a slow upstream never loses or reorders them. istiod's
//! DNS name table (NDS) is taken by the agent; only Envoy's types go to Envoy.
//! When a stream fails, the error goes to Envoy, which reconnects with its own
//! backoff while keeping its configuration.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use proto::pb::google::protobuf::Any;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tonic::metadata::{AsciiMetadataValue, MetadataKey};
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use crate::config::Config;
use crate::secret_manager::SecretWatch;

/// The DNS name table type, handled by the agent.
pub const NAME_TABLE_TYPE: &str = "type.googleapis.com/istio.networking.nds.v1.NameTable";
/// LDS, whose first request triggers the NDS subscription.
pub const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

/// Consumes the name table istiod sends (for the DNS proxy).
pub type NdsHandler = Arc<dyn Fn(&Any) -> Result<(), String> + Send + Sync>;

/// The xDS proxy.
#[derive(Clone)]
pub struct XdsProxy {
    config: Arc<Config>,
    secrets: SecretWatch,
    nds: Option<NdsHandler>,
}

fn forwardable(type_url: &str) -> bool {
    type_url.starts_with("type.googleapis.com/envoy.")
        || type_url == "type.googleapis.com/istio.workload.Workload"
}

impl XdsProxy {
    /// A proxy to the discovery address in `config`.
    pub fn new(config: Arc<Config>, secrets: SecretWatch, nds: Option<NdsHandler>) -> Self {
        Self {
            config,
            secrets,
            nds,
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
        let addr = &self.config.discovery_address;
        let current = self.secrets.borrow().clone();
        let with_cert = self.config.xds_root_path.is_some() && current.is_some();
        let tls = match &self.config.xds_root_path {
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
                let name =
                    ServerName::try_from(self.config.xds_server_name.clone()).map_err(|e| {
                        Status::internal(format!(
                            "istiod server name {:?}: {e}",
                            self.config.xds_server_name
                        ))
                    })?;
                Some((source, name))
            }
        };
        let channel = common::tls::grpc_channel(addr, tls, Duration::from_secs(5))
            .map_err(|e| Status::unavailable(format!("connecting to istiod at {addr}: {e}")))?;
        let client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        Ok((client, with_cert))
    }

    fn decorate<T>(&self, req: &mut Request<T>, with_cert: bool) {
        let md = req.metadata_mut();
        let mut put = |k: &str, v: &str| {
            if let (Ok(k), Ok(v)) = (
                MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes()),
                AsciiMetadataValue::try_from(v),
            ) {
                md.insert(k, v);
            }
        };
        if !self.config.cluster_id.is_empty() {
            put("ClusterID", &self.config.cluster_id);
        }
        for (k, v) in &self.config.xds_headers {
            put(k, v);
        }
        if !with_cert
            && let Ok(token) = std::fs::read_to_string(&self.config.token_path)
            && !token.trim().is_empty()
        {
            put("authorization", &format!("Bearer {}", token.trim()));
        }
    }

    fn handle_nds(&self, resources: &[Any]) -> Result<(), String> {
        match (&self.nds, resources.first()) {
            (Some(h), Some(table)) => h(table),
            _ => Ok(()),
        }
    }
}

type Out<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for XdsProxy {
    type StreamAggregatedResourcesStream = Out<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Out<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let (mut client, with_cert) = self.upstream()?;
        let mut inbound = request.into_inner();
        let (up_tx, up_rx) = mpsc::unbounded_channel::<DiscoveryRequest>();
        let dns = self.nds.is_some();
        let reader_tx = up_tx.clone();
        // Envoy's requests, in order, whatever the upstream's speed.
        tokio::spawn(async move {
            let mut lds_seen = false;
            while let Ok(Some(req)) = inbound.message().await {
                let first_lds = req.type_url == LISTENER_TYPE && !lds_seen;
                let node = req.node.clone();
                if reader_tx.send(req).is_err() {
                    break;
                }
                if first_lds {
                    lds_seen = true;
                    if dns {
                        let _ = reader_tx.send(DiscoveryRequest {
                            type_url: NAME_TABLE_TYPE.into(),
                            node,
                            ..Default::default()
                        });
                    }
                }
            }
        });
        let mut upstream = Request::new(UnboundedReceiverStream::new(up_rx));
        self.decorate(&mut upstream, with_cert);
        let mut responses = client
            .stream_aggregated_resources(upstream)
            .await
            .inspect_err(|s| {
                tracing::warn!(target: "xdsproxy", "upstream xDS stream to {} failed: {}", self.config.discovery_address, s.message());
            })?
            .into_inner();
        tracing::info!(target: "xdsproxy", "connected to upstream XDS server: {}", self.config.discovery_address);
        let (tx, rx) = mpsc::channel(1);
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                match responses.message().await {
                    Ok(Some(resp)) if resp.type_url == NAME_TABLE_TYPE => {
                        if resp.resources.is_empty() {
                            continue;
                        }
                        let ack = match this.handle_nds(&resp.resources) {
                            Ok(()) => DiscoveryRequest {
                                type_url: resp.type_url.clone(),
                                version_info: resp.version_info.clone(),
                                response_nonce: resp.nonce.clone(),
                                ..Default::default()
                            },
                            Err(e) => DiscoveryRequest {
                                type_url: resp.type_url.clone(),
                                response_nonce: resp.nonce.clone(),
                                error_detail: Some(proto::pb::google::rpc::Status {
                                    code: 13,
                                    message: e,
                                    details: vec![],
                                }),
                                ..Default::default()
                            },
                        };
                        let _ = up_tx.send(ack);
                    }
                    Ok(Some(resp)) if forwardable(&resp.type_url) => {
                        if tx.send(Ok(resp)).await.is_err() {
                            break;
                        }
                    }
                    Ok(Some(resp)) => {
                        tracing::debug!(target: "xdsproxy", "dropping response of type {}", resp.type_url)
                    }
                    Ok(None) => break,
                    Err(status) => {
                        tracing::info!(target: "xdsproxy", "upstream terminated: {}", status.message());
                        let _ = tx.send(Err(status)).await;
                        break;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let (mut client, with_cert) = self.upstream()?;
        let mut inbound = request.into_inner();
        let (up_tx, up_rx) = mpsc::unbounded_channel::<DeltaDiscoveryRequest>();
        let dns = self.nds.is_some();
        let reader_tx = up_tx.clone();
        tokio::spawn(async move {
            let mut lds_seen = false;
            while let Ok(Some(req)) = inbound.message().await {
                let first_lds = req.type_url == LISTENER_TYPE && !lds_seen;
                let node = req.node.clone();
                if reader_tx.send(req).is_err() {
                    break;
                }
                if first_lds {
                    lds_seen = true;
                    if dns {
                        let _ = reader_tx.send(DeltaDiscoveryRequest {
                            type_url: NAME_TABLE_TYPE.into(),
                            node,
                            ..Default::default()
                        });
                    }
                }
            }
        });
        let mut upstream = Request::new(UnboundedReceiverStream::new(up_rx));
        self.decorate(&mut upstream, with_cert);
        let mut responses = client
            .delta_aggregated_resources(upstream)
            .await
            .inspect_err(|s| {
                tracing::warn!(target: "xdsproxy", "upstream delta xDS stream to {} failed: {}", self.config.discovery_address, s.message());
            })?
            .into_inner();
        tracing::info!(target: "xdsproxy", "connected to delta upstream XDS server: {}", self.config.discovery_address);
        let (tx, rx) = mpsc::channel(1);
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                match responses.message().await {
                    Ok(Some(resp)) if resp.type_url == NAME_TABLE_TYPE => {
                        let tables: Vec<Any> = resp
                            .resources
                            .iter()
                            .filter_map(|r| r.resource.clone())
                            .collect();
                        if tables.is_empty() {
                            continue;
                        }
                        let error_detail = this.handle_nds(&tables).err().map(|e| {
                            proto::pb::google::rpc::Status {
                                code: 13,
                                message: e,
                                details: vec![],
                            }
                        });
                        let _ = up_tx.send(DeltaDiscoveryRequest {
                            type_url: resp.type_url.clone(),
                            response_nonce: resp.nonce.clone(),
                            error_detail,
                            ..Default::default()
                        });
                    }
                    Ok(Some(resp)) if forwardable(&resp.type_url) => {
                        if tx.send(Ok(resp)).await.is_err() {
                            break;
                        }
                    }
                    Ok(Some(resp)) => {
                        tracing::debug!(target: "xdsproxy", "dropping response of type {}", resp.type_url)
                    }
                    Ok(None) => break,
                    Err(status) => {
                        tracing::info!(target: "xdsproxy", "upstream terminated: {}", status.message());
                        let _ = tx.send(Err(status)).await;
                        break;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
