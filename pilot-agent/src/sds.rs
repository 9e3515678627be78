//! The SDS server Envoy reads its workload certificate from: state of the
//! world `StreamSecrets` on the Unix socket
//! `./var/run/secrets/workload-spiffe-uds/socket`, serving `default` (key and
//! chain) and `ROOTCA` (trust bundle), and pushing a secret again whenever the
//! secret manager publishes a new one. Request handling follows Istio's
//! `ShouldRespond` (`pkg/xds/server.go`).

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::xds::SECRET_TYPE;
use prost::Message;
use proto::pb::envoy::config::core::v3::{DataSource, data_source};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, Secret, TlsCertificate, secret,
};
use proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use proto::pb::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use proto::pb::google::protobuf::Any;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::secret_manager::{SecretWatch, WorkloadSecret};
use common::xds::ResponseStream;

use common::xds::{SDS_ROOT_SECRET, SDS_WORKLOAD_SECRET};

/// The SDS service.
#[derive(Clone)]
pub struct SdsServer {
    secrets: SecretWatch,
    version: Arc<AtomicU64>,
}

impl SdsServer {
    /// Serves the secrets published on `secrets`.
    pub fn new(secrets: SecretWatch) -> Self {
        Self {
            secrets,
            version: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The tonic service.
    pub fn into_service(self) -> SecretDiscoveryServiceServer<Self> {
        SecretDiscoveryServiceServer::new(self)
    }
}

/// What a secret looked like when last sent, to tell whether it changed.
fn fingerprint(name: &str, s: &WorkloadSecret) -> String {
    match name {
        SDS_ROOT_SECRET => s.root_pem.clone(),
        _ => format!("{}/{}", s.serial, s.cert_chain_pem.len()),
    }
}

fn inline(pem: &str) -> Option<DataSource> {
    Some(DataSource {
        specifier: Some(data_source::Specifier::InlineBytes(pem.as_bytes().to_vec())),
        ..Default::default()
    })
}

/// A secret Envoy asked for that this agent does not serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "failed to generate secret for {0}: unknown resource (this agent serves {SDS_WORKLOAD_SECRET} and {SDS_ROOT_SECRET})"
)]
pub struct UnknownSecret(pub String);

impl From<UnknownSecret> for Status {
    fn from(e: UnknownSecret) -> Self {
        Status::not_found(e.to_string())
    }
}

/// Encodes one secret as Istio does.
pub fn encode_secret(name: &str, s: &WorkloadSecret) -> Result<Secret, UnknownSecret> {
    let r#type = match name {
        SDS_WORKLOAD_SECRET => secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: inline(&s.cert_chain_pem),
            private_key: inline(&s.key_pem),
            ..Default::default()
        }),
        SDS_ROOT_SECRET => secret::Type::ValidationContext(CertificateValidationContext {
            trusted_ca: inline(&s.root_pem),
            ..Default::default()
        }),
        other => return Err(UnknownSecret(other.to_string())),
    };
    Ok(Secret {
        name: name.to_string(),
        r#type: Some(r#type),
    })
}

/// One SDS stream's state.
#[derive(Default)]
struct StreamState {
    node_seen: bool,
    /// Resource names Envoy watches; `None` until the first request.
    watched: Option<BTreeSet<String>>,
    /// Nonce of the last response.
    last_nonce: Option<String>,
    /// What each name looked like when last sent.
    sent: HashMap<String, String>,
    /// Names to send as soon as a secret is available.
    pending: BTreeSet<String>,
}

impl StreamState {
    /// Applies a request; returns the names to answer with, or an error that ends the stream.
    fn on_request(&mut self, req: &DiscoveryRequest) -> Result<(), Status> {
        if !self.node_seen {
            if req.node.as_ref().is_none_or(|n| n.id.is_empty()) {
                return Err(Status::invalid_argument("missing node information"));
            }
            self.node_seen = true;
        }
        if let Some(err) = &req.error_detail {
            tracing::warn!(target: "sds", "Envoy rejected secrets {:?} (nonce {}): {}", req.resource_names, req.response_nonce, err.message);
            return Ok(());
        }
        let names: BTreeSet<String> = req.resource_names.iter().cloned().collect();
        if names.is_empty() {
            // Secrets are not a wildcard type: an empty list unsubscribes.
            self.watched = Some(BTreeSet::new());
            self.pending.clear();
            return Ok(());
        }
        let new: BTreeSet<String> = match (&self.watched, req.response_nonce.is_empty()) {
            (None, _) | (_, true) => names.clone(),
            (Some(prev), false) => {
                if self.last_nonce.as_deref() != Some(req.response_nonce.as_str()) {
                    tracing::debug!(target: "sds", "ignoring stale nonce {}", req.response_nonce);
                    return Ok(());
                }
                names.difference(prev).cloned().collect()
            }
        };
        self.pending.retain(|n| names.contains(n));
        self.pending.extend(new);
        self.watched = Some(names);
        Ok(())
    }

    /// Queues every watched name whose secret differs from what was sent.
    fn on_secret(&mut self, s: &WorkloadSecret) {
        if let Some(watched) = &self.watched {
            for name in watched {
                if self.sent.get(name) != Some(&fingerprint(name, s)) {
                    self.pending.insert(name.clone());
                }
            }
        }
    }
}

impl SdsServer {
    async fn run_stream(
        self,
        mut inbound: Streaming<DiscoveryRequest>,
        tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    ) {
        let mut secrets = self.secrets.clone();
        let mut state = StreamState::default();
        loop {
            tokio::select! {
                req = inbound.message() => match req {
                    Ok(Some(req)) => {
                        if let Err(status) = state.on_request(&req) {
                            let _ = tx.send(Err(status)).await;
                            return;
                        }
                    }
                    Ok(None) => return,
                    Err(e) => {
                        tracing::debug!(target: "sds", "stream closed: {e}");
                        return;
                    }
                },
                changed = secrets.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if let Some(s) = secrets.borrow_and_update().clone() {
                        state.on_secret(&s);
                    }
                },
                _ = tx.closed() => return,
            }
            if state.pending.is_empty() {
                continue;
            }
            // Until the first certificate exists, Envoy's request waits here
            // (its listener stays warming) instead of failing.
            let Some(current) = secrets.borrow().clone() else {
                continue;
            };
            let names: Vec<String> = std::mem::take(&mut state.pending).into_iter().collect();
            let mut resources = Vec::with_capacity(names.len());
            for name in &names {
                match encode_secret(name, &current) {
                    Ok(secret) => resources.push(Any {
                        type_url: SECRET_TYPE.to_string(),
                        value: secret.encode_to_vec(),
                    }),
                    Err(e) => {
                        tracing::warn!(target: "sds", "{e}");
                        let _ = tx.send(Err(e.into())).await;
                        return;
                    }
                }
            }
            for name in &names {
                state.sent.insert(name.clone(), fingerprint(name, &current));
            }
            let nonce = uuid::Uuid::new_v4().to_string();
            let version = format!(
                "{}/{}",
                common::clock::now_rfc3339(),
                self.version.fetch_add(1, Ordering::Relaxed) + 1
            );
            tracing::info!(target: "sds", "SDS: PUSH resources={:?} version={version} serial={}", names, current.serial);
            state.last_nonce = Some(nonce.clone());
            let response = DiscoveryResponse {
                version_info: version,
                resources,
                type_url: SECRET_TYPE.to_string(),
                nonce,
                ..Default::default()
            };
            if tx.send(Ok(response)).await.is_err() {
                return;
            }
        }
    }
}

#[tonic::async_trait]
impl SecretDiscoveryService for SdsServer {
    type DeltaSecretsStream = ResponseStream<DeltaDiscoveryResponse>;
    type StreamSecretsStream = ResponseStream<DiscoveryResponse>;

    async fn delta_secrets(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaSecretsStream>, Status> {
        Err(Status::unimplemented(
            "DeltaSecrets is not implemented; use StreamSecrets",
        ))
    }

    async fn stream_secrets(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamSecretsStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(self.clone().run_stream(request.into_inner(), tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn fetch_secrets(
        &self,
        _request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        Err(Status::unimplemented(
            "FetchSecrets is not implemented; use StreamSecrets",
        ))
    }
}

/// Binds a Unix socket for a gRPC server the way Istio does: parent directory
/// created, a stale socket removed, the socket made 0666 so Envoy (another
/// user) can connect.
pub fn bind_uds(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::envoy::config::core::v3::Node;
    use proto::pb::envoy::service::secret::v3::secret_discovery_service_client::SecretDiscoveryServiceClient;
    use std::time::{Duration, SystemTime};
    use tokio::sync::watch;

    fn secret(serial: &str, root: &str) -> WorkloadSecret {
        WorkloadSecret {
            cert_chain_pem: format!("chain-{serial}"),
            key_pem: "key".into(),
            root_pem: root.into(),
            serial: serial.into(),
            created: SystemTime::now(),
            expires: SystemTime::now() + Duration::from_secs(60),
        }
    }

    fn req(names: &[&str], nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            node: Some(Node {
                id: "sidecar~10.0.0.1~pod.ns~ns.svc.cluster.local".into(),
                ..Default::default()
            }),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            type_url: SECRET_TYPE.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    struct Harness {
        tx: watch::Sender<Option<Arc<WorkloadSecret>>>,
        client: SecretDiscoveryServiceClient<tonic::transport::Channel>,
        _dir: tempfile::TempDir,
    }

    async fn harness(initial: Option<WorkloadSecret>) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("socket");
        let (tx, rx) = watch::channel(initial.map(Arc::new));
        let listener = bind_uds(&path).unwrap();
        let svc = SdsServer::new(rx).into_service();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let channel = tonic::transport::Endpoint::from_static("http://sds")
            .connect_with_connector(tower::service_fn(move |_| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }))
            .await
            .unwrap();
        Harness {
            tx,
            client: SecretDiscoveryServiceClient::new(channel),
            _dir: dir,
        }
    }

    fn names(r: &DiscoveryResponse) -> Vec<String> {
        r.resources
            .iter()
            .map(|a| Secret::decode(a.value.as_slice()).unwrap().name)
            .collect()
    }

    async fn next(s: &mut Streaming<DiscoveryResponse>) -> DiscoveryResponse {
        tokio::time::timeout(Duration::from_secs(5), s.message())
            .await
            .expect("response in time")
            .unwrap()
            .unwrap()
    }

    async fn nothing(s: &mut Streaming<DiscoveryResponse>) {
        assert!(
            tokio::time::timeout(Duration::from_millis(300), s.message())
                .await
                .is_err(),
            "no response expected"
        );
    }

    #[tokio::test]
    async fn multiplexed_then_ack_then_push() {
        let mut h = harness(Some(secret("01", "root1"))).await;
        let (req_tx, req_rx) = mpsc::channel(8);
        let mut stream = h
            .client
            .stream_secrets(ReceiverStream::new(req_rx))
            .await
            .unwrap()
            .into_inner();
        req_tx.send(req(&["default"], "")).await.unwrap();
        let r1 = next(&mut stream).await;
        assert_eq!(names(&r1), ["default"]);
        // Adding ROOTCA with the nonce: only the new name comes back.
        req_tx
            .send(req(&["default", "ROOTCA"], &r1.nonce))
            .await
            .unwrap();
        let r2 = next(&mut stream).await;
        assert_eq!(names(&r2), ["ROOTCA"]);
        // A pure ACK gets nothing.
        req_tx
            .send(req(&["default", "ROOTCA"], &r2.nonce))
            .await
            .unwrap();
        nothing(&mut stream).await;
        // Rotation with the same root pushes only `default`.
        h.tx.send_replace(Some(Arc::new(secret("02", "root1"))));
        let r3 = next(&mut stream).await;
        assert_eq!(names(&r3), ["default"]);
        let s = Secret::decode(r3.resources[0].value.as_slice()).unwrap();
        let Some(secret::Type::TlsCertificate(tls)) = s.r#type else {
            panic!("not a certificate")
        };
        let Some(data_source::Specifier::InlineBytes(chain)) =
            tls.certificate_chain.unwrap().specifier
        else {
            panic!("not inline")
        };
        assert_eq!(chain, b"chain-02");
        // A new root pushes both.
        h.tx.send_replace(Some(Arc::new(secret("03", "root2"))));
        let r4 = next(&mut stream).await;
        assert_eq!(names(&r4), ["ROOTCA", "default"]);
    }

    #[tokio::test]
    async fn stale_nonce_nack_and_unsubscribe_get_nothing() {
        let mut h = harness(Some(secret("01", "root"))).await;
        let (req_tx, req_rx) = mpsc::channel(8);
        let mut stream = h
            .client
            .stream_secrets(ReceiverStream::new(req_rx))
            .await
            .unwrap()
            .into_inner();
        req_tx.send(req(&["ROOTCA"], "")).await.unwrap();
        let r1 = next(&mut stream).await;
        req_tx
            .send(req(&["ROOTCA", "default"], "stale-nonce"))
            .await
            .unwrap();
        nothing(&mut stream).await;
        let mut nack = req(&["ROOTCA"], &r1.nonce);
        nack.error_detail = Some(proto::pb::google::rpc::Status {
            code: 13,
            message: "bad".into(),
            details: vec![],
        });
        req_tx.send(nack).await.unwrap();
        nothing(&mut stream).await;
        req_tx.send(req(&[], &r1.nonce)).await.unwrap();
        nothing(&mut stream).await;
        // Unsubscribed: a rotation pushes nothing.
        h.tx.send_replace(Some(Arc::new(secret("02", "root9"))));
        nothing(&mut stream).await;
    }

    #[tokio::test]
    async fn waits_for_first_certificate() {
        let mut h = harness(None).await;
        let (req_tx, req_rx) = mpsc::channel(8);
        let mut stream = h
            .client
            .stream_secrets(ReceiverStream::new(req_rx))
            .await
            .unwrap()
            .into_inner();
        req_tx.send(req(&["default"], "")).await.unwrap();
        nothing(&mut stream).await;
        h.tx.send_replace(Some(Arc::new(secret("01", "root"))));
        assert_eq!(names(&next(&mut stream).await), ["default"]);
    }

    #[tokio::test]
    async fn unknown_name_and_missing_node_are_errors() {
        let mut h = harness(Some(secret("01", "root"))).await;
        let (req_tx, req_rx) = mpsc::channel(8);
        let mut stream = h
            .client
            .stream_secrets(ReceiverStream::new(req_rx))
            .await
            .unwrap()
            .into_inner();
        req_tx
            .send(req(&["file-cert:/nope~/nope"], ""))
            .await
            .unwrap();
        let err = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .unwrap()
            .unwrap_err();
        assert!(err.message().contains("failed to generate secret"), "{err}");

        let (req_tx, req_rx) = mpsc::channel(8);
        let mut stream = h
            .client
            .stream_secrets(ReceiverStream::new(req_rx))
            .await
            .unwrap()
            .into_inner();
        let mut r = req(&["default"], "");
        r.node = None;
        req_tx.send(r).await.unwrap();
        let err = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        // The server keeps serving other streams.
        let (req_tx, req_rx) = mpsc::channel(8);
        let mut stream = h
            .client
            .stream_secrets(ReceiverStream::new(req_rx))
            .await
            .unwrap()
            .into_inner();
        req_tx.send(req(&["default"], "")).await.unwrap();
        assert_eq!(names(&next(&mut stream).await), ["default"]);
    }
}
