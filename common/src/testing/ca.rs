//! A fake of istiod's CA: `istio.v1.auth.IstioCertificateService`'s
//! `CreateCertificate`, signing each CSR with a root it generated. It trusts
//! the CSR's SANs (the real CA takes them from the caller's token), records
//! the bearer token and the request of every call, can be told to fail the
//! next calls or to switch to a new root, and answers as Istio does:
//! `[leaf, root]`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use proto::istio_ca::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use proto::istio_ca::{IstioCertificateRequest, IstioCertificateResponse};
use rcgen::CertificateSigningRequestParams;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status};

use super::{Connections, FakeError, TestRoot, Transport, listen, lock, wait_until};

/// Istio's default workload certificate lifetime, used when a request asks
/// for none (`DEFAULT_WORKLOAD_CERT_TTL`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);

/// One call the CA received.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    /// The bearer token of the `authorization` header, without `Bearer `.
    pub token: Option<String>,
    /// The `ClusterID` header, when sent.
    pub cluster_id: Option<String>,
    /// The request.
    pub request: IstioCertificateRequest,
}

#[derive(Debug)]
struct State {
    root: Mutex<Arc<TestRoot>>,
    seen: Mutex<Vec<SeenRequest>>,
    /// Failures still to return, with their code and message.
    failures: Mutex<(usize, Code, String)>,
    changed: Arc<watch::Sender<u64>>,
}

/// A running fake CA; stops when dropped.
#[derive(Debug)]
pub struct FakeCa {
    state: Arc<State>,
    addr: SocketAddr,
    tls_root_pem: Option<String>,
    memory: mpsc::UnboundedSender<std::io::Result<tokio::io::DuplexStream>>,
    connections: Arc<Connections>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

#[derive(Clone)]
struct Service(Arc<State>);

fn header(req: &Request<IstioCertificateRequest>, name: &str) -> Option<String> {
    req.metadata()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

#[tonic::async_trait]
impl IstioCertificateService for Service {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        let token = header(&request, "authorization")
            .map(|v| v.strip_prefix("Bearer ").unwrap_or(&v).to_string());
        let cluster_id = header(&request, "clusterid");
        let request = request.into_inner();
        lock(&self.0.seen).push(SeenRequest {
            token,
            cluster_id,
            request: request.clone(),
        });
        self.0.changed.send_modify(|v| *v += 1);
        {
            let mut failures = lock(&self.0.failures);
            if failures.0 > 0 {
                failures.0 -= 1;
                return Err(Status::new(failures.1, failures.2.clone()));
            }
        }
        let root = lock(&self.0.root).clone();
        let ttl = match request.validity_duration {
            s if s > 0 => Duration::from_secs(s.unsigned_abs()),
            _ => DEFAULT_TTL,
        };
        let leaf = sign(&root, &request.csr, ttl)?;
        Ok(Response::new(IstioCertificateResponse {
            cert_chain: vec![leaf, root.pem.clone()],
        }))
    }
}

/// Signs `csr_pem` for the SANs it asks for, valid from two minutes ago (as
/// Istio back-dates) for `ttl`.
fn sign(root: &TestRoot, csr_pem: &str, ttl: Duration) -> Result<String, Status> {
    let mut csr = CertificateSigningRequestParams::from_pem(csr_pem)
        .map_err(|e| Status::invalid_argument(format!("CSR: {e}")))?;
    let now = time::OffsetDateTime::now_utc();
    csr.params.not_before = now - time::Duration::minutes(2);
    csr.params.not_after = now + ttl;
    csr.params.serial_number = Some(rcgen::SerialNumber::from_slice(
        &rand::random::<[u8; 16]>().map(|b| b & 0x7f),
    ));
    csr.params.use_authority_key_identifier_extension = true;
    let cert = csr
        .signed_by(root.issuer())
        .map_err(|e| Status::internal(format!("signing: {e}")))?;
    Ok(cert.pem())
}

impl FakeCa {
    /// Starts a CA with a fresh root on `127.0.0.1:0`.
    pub async fn start(transport: Transport) -> Result<Self, FakeError> {
        let root = Arc::new(TestRoot::generate("cluster.local")?);
        let changed = Arc::new(watch::channel(0).0);
        let state = Arc::new(State {
            root: Mutex::new(root.clone()),
            seen: Mutex::new(Vec::new()),
            failures: Mutex::new((0, Code::Unavailable, String::new())),
            changed: changed.clone(),
        });
        let connections = Connections::new(changed);
        let stop = CancellationToken::new();
        let (addr, incoming) = listen(connections.clone(), stop.clone()).await?;
        let mut tcp = Server::builder();
        let tls_root_pem = match transport {
            Transport::Plaintext => None,
            Transport::Tls => {
                tcp = tcp.tls_config(root.server_tls()?)?;
                Some(root.pem.clone())
            }
        };
        let service = IstioCertificateServiceServer::new(Service(state.clone()));
        let mut tasks = vec![tokio::spawn({
            let service = service.clone();
            async move {
                if let Err(e) = tcp.add_service(service).serve_with_incoming(incoming).await {
                    tracing::debug!("fake CA: {e}");
                }
            }
        })];
        // The same service over in-memory pipes, for tests with paused time.
        let (memory, pipes) = mpsc::unbounded_channel();
        tasks.push(tokio::spawn(async move {
            let pipes = tokio_stream::wrappers::UnboundedReceiverStream::new(pipes);
            if let Err(e) = Server::builder()
                .add_service(service)
                .serve_with_incoming(pipes)
                .await
            {
                tracing::debug!("fake CA (in memory): {e}");
            }
        }));
        Ok(Self {
            state,
            addr,
            tls_root_pem,
            memory,
            connections,
            stop,
            tasks,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The root a TLS client must trust (the first root, which signed the
    /// serving certificate for [`super::SERVER_NAME`]); `None` in plaintext.
    pub fn tls_root_pem(&self) -> Option<&str> {
        self.tls_root_pem.as_deref()
    }

    /// The root signing workload certificates now (the last element of
    /// every answer).
    pub fn root_pem(&self) -> String {
        lock(&self.state.root).pem.clone()
    }

    /// Switches to a new root for every later certificate and returns it.
    /// The TLS serving certificate keeps chaining to the first root, as a
    /// client's mounted root does not change with it.
    pub fn rotate_root(&self) -> Result<String, FakeError> {
        let root = Arc::new(TestRoot::generate("cluster.local")?);
        let pem = root.pem.clone();
        *lock(&self.state.root) = root;
        Ok(pem)
    }

    /// Fails the next `n` calls with `code` and `message`.
    pub fn fail_next(&self, n: usize, code: Code, message: &str) {
        *lock(&self.state.failures) = (n, code, message.to_string());
    }

    /// Every call so far, in order.
    pub fn requests(&self) -> Vec<SeenRequest> {
        lock(&self.state.seen).clone()
    }

    /// The bearer token of every call so far, in order.
    pub fn tokens(&self) -> Vec<Option<String>> {
        lock(&self.state.seen)
            .iter()
            .map(|s| s.token.clone())
            .collect()
    }

    /// How many calls arrived (failed ones included).
    pub fn calls(&self) -> usize {
        lock(&self.state.seen).len()
    }

    /// Waits until at least `n` calls have arrived.
    pub async fn wait_calls(&self, n: usize, limit: Duration) -> Result<(), FakeError> {
        wait_until(&self.state.changed, &format!("{n} CSRs"), limit, || {
            (self.calls() >= n).then_some(())
        })
        .await
    }

    /// Connections open now (TCP only).
    pub fn open_connections(&self) -> usize {
        self.connections.open()
    }

    /// Closes every open TCP connection at once; new ones are accepted.
    pub fn drop_connections(&self) {
        self.connections.kill_all();
    }

    /// A plaintext channel to this CA over an in-memory pipe: no sockets,
    /// so a test with paused time never sees its clock jump while a call
    /// waits for the network.
    pub fn in_memory_channel(&self) -> Channel {
        let memory = self.memory.clone();
        // The URI is only a placeholder: the connector below ignores it.
        Endpoint::from_static("http://fake-ca.in-memory").connect_with_connector_lazy(
            tower::service_fn(move |_: tonic::transport::Uri| {
                let (client, server) = tokio::io::duplex(64 * 1024);
                let sent = memory.send(Ok(server));
                async move {
                    sent.map_err(|_| std::io::Error::other("the fake CA has stopped"))?;
                    Ok::<_, std::io::Error>(TokioIo::new(client))
                }
            }),
        )
    }
}

impl Drop for FakeCa {
    fn drop(&mut self) {
        self.stop.cancel();
        self.connections.kill_all();
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Identity;
    use crate::pki::{self, KeyType};
    use proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient;

    fn tls_channel(ca: &FakeCa) -> Channel {
        crate::tls::install_crypto_provider();
        let root = ca.tls_root_pem().unwrap().to_string();
        let source: crate::tls::ClientConfigSource = Arc::new(move || {
            let store = crate::tls::root_store("fake CA root", &root)?;
            Ok(Arc::new(crate::tls::grpc_client_config(store, None)?))
        });
        let name = rustls_pki_types::ServerName::try_from(super::super::SERVER_NAME).unwrap();
        crate::tls::grpc_channel(
            &ca.addr().to_string(),
            Some((source, name)),
            Duration::from_secs(5),
        )
        .unwrap()
    }

    fn csr() -> String {
        let key = pki::generate_key(KeyType::EcdsaP256).unwrap();
        pki::csr_pem(&Identity::new("cluster.local", "ns", "sa"), &key).unwrap()
    }

    async fn call(channel: Channel, token: &str) -> Result<Vec<String>, Status> {
        let mut req = Request::new(IstioCertificateRequest {
            csr: csr(),
            validity_duration: 3600,
            metadata: None,
        });
        req.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        let resp = IstioCertificateServiceClient::new(channel)
            .create_certificate(req)
            .await?;
        Ok(resp.into_inner().cert_chain)
    }

    #[tokio::test]
    async fn signs_over_tls_records_tokens_fails_on_demand_and_rotates() {
        let ca = FakeCa::start(Transport::Tls).await.unwrap();
        let channel = tls_channel(&ca);
        let first_root = ca.root_pem();

        let chain = call(channel.clone(), "one").await.unwrap();
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[1], first_root);
        let leaf = pki::pem_certs("leaf", &chain[0]).unwrap().remove(0);
        let root = pki::pem_certs("root", &chain[1]).unwrap().remove(0);
        assert!(pki::signed_by(&leaf, &root));
        let info = pki::cert_info(&leaf).unwrap();
        assert_eq!(info.uri_sans, vec!["spiffe://cluster.local/ns/ns/sa/sa"]);
        let lifetime = info.lifetime().as_secs();
        assert!((3600..=3600 + 121).contains(&lifetime), "{lifetime}");

        ca.fail_next(1, Code::Unavailable, "down");
        let err = call(channel.clone(), "two").await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable);

        let new_root = ca.rotate_root().unwrap();
        assert_ne!(new_root, first_root);
        let chain = call(channel, "three").await.unwrap();
        assert_eq!(chain[1], new_root);
        assert_eq!(
            ca.tokens(),
            vec![Some("one".into()), Some("two".into()), Some("three".into())]
        );
        assert_eq!(ca.calls(), 3);
    }

    #[tokio::test]
    async fn answers_in_memory_too() {
        let ca = FakeCa::start(Transport::Plaintext).await.unwrap();
        assert!(ca.tls_root_pem().is_none());
        let chain = call(ca.in_memory_channel(), "t").await.unwrap();
        assert_eq!(chain[1], ca.root_pem());
        ca.wait_calls(1, Duration::from_secs(5)).await.unwrap();
    }
}
