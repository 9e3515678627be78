//! In-process fakes of the other side of the agent, for fast unit tests: a CA
//! speaking Istio's `IstioCertificateService` ([`ca::FakeCa`]) and an
//! upstream ADS server ([`ads::FakeAds`]). Both bind `127.0.0.1:0`, over TLS
//! (a serving certificate for [`SERVER_NAME`] from a root of their own) or
//! plaintext, record what they receive, and let a test make them fail.
//!
//! Only built with the `testing` feature: the binaries never carry them.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use rcgen::{
    CertificateParams, DistinguishedName, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, SanType,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

pub mod ads;
pub mod ca;

/// The name the fakes' TLS certificates carry: istiod's Service name, as the
/// agent expects it (`ISTIOD_SAN`'s default for a `localhost` address).
pub const SERVER_NAME: &str = "istiod.istio-system.svc";

/// Why a fake could not start, or a wait ran out.
#[derive(Debug, thiserror::Error)]
pub enum FakeError {
    /// Binding or serving failed.
    #[error("fake server I/O: {0}")]
    Io(#[from] io::Error),
    /// A certificate could not be made.
    #[error("fake PKI: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// tonic refused the TLS configuration.
    #[error("fake server TLS: {0}")]
    Tls(#[from] tonic::transport::Error),
    /// What a test waited for did not happen in time.
    #[error("timed out after {limit:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long the test allowed.
        limit: Duration,
    },
}

/// How a fake listens on `127.0.0.1:0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Plain HTTP/2 (istiod's `:15010`).
    Plaintext,
    /// TLS with a certificate for [`SERVER_NAME`] (istiod's `:15012`).
    Tls,
}

/// A self-signed root CA and the key that signs with it.
pub struct TestRoot {
    /// The root certificate, PEM.
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestRoot").finish_non_exhaustive()
    }
}

impl TestRoot {
    /// A fresh ECDSA P-256 root named `org` (Istio's self-signed root carries
    /// the trust domain as its organisation), valid for ten years.
    pub fn generate(org: &str) -> Result<Self, rcgen::Error> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let now = time::OffsetDateTime::now_utc();
        let params = crate::pki::root_ca_params(
            org,
            now - time::Duration::hours(1),
            now + time::Duration::days(3650),
        );
        let cert = params.self_signed(&key)?;
        Ok(Self {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The issuer that signs with this root.
    pub fn issuer(&self) -> &Issuer<'static, KeyPair> {
        &self.issuer
    }

    /// A serving certificate for `names` (DNS names or IPs): `(chain PEM, key PEM)`.
    pub fn server_cert(&self, names: &[&str]) -> Result<(String, String), rcgen::Error> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = names
            .iter()
            .map(|n| match n.parse::<std::net::IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => Ok(SanType::DnsName((*n).try_into()?)),
            })
            .collect::<Result<_, rcgen::Error>>()?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(365);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// tonic's server TLS settings with a certificate for [`SERVER_NAME`],
    /// `localhost` and `127.0.0.1` from this root.
    pub fn server_tls(&self) -> Result<tonic::transport::ServerTlsConfig, rcgen::Error> {
        let (chain, key) = self.server_cert(&[SERVER_NAME, "localhost", "127.0.0.1"])?;
        Ok(tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(chain, key)))
    }
}

/// Locks a fake's state; a test that panicked while holding it leaves nothing
/// half-done (every update is a single push or insert).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits until `check` returns `Some`, re-checking on each bump of `changed`.
async fn wait_until<T>(
    changed: &watch::Sender<u64>,
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Result<T, FakeError> {
    // Subscribing first: a change after the check below wakes the loop.
    let mut rx = changed.subscribe();
    let wait = async {
        loop {
            if let Some(v) = check() {
                return v;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::time::timeout(limit, wait)
        .await
        .map_err(|_| FakeError::Timeout {
            what: what.to_string(),
            limit,
        })
}

/// Counts the open connections of a fake server and can close them all at
/// once, as a crashed or killed istiod would.
#[derive(Debug)]
struct Connections {
    open: AtomicUsize,
    accepted: AtomicUsize,
    /// Cancelled to kill every connection accepted under it.
    kill: Mutex<CancellationToken>,
    changed: Arc<watch::Sender<u64>>,
}

impl Connections {
    fn new(changed: Arc<watch::Sender<u64>>) -> Arc<Self> {
        Arc::new(Self {
            open: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
            kill: Mutex::new(CancellationToken::new()),
            changed,
        })
    }

    fn accept(self: &Arc<Self>, io: TcpStream) -> Conn {
        self.open.fetch_add(1, Ordering::SeqCst);
        self.accepted.fetch_add(1, Ordering::SeqCst);
        self.changed.send_modify(|v| *v += 1);
        let kill = lock(&self.kill).clone().cancelled_owned();
        Conn {
            io,
            kill: Box::pin(kill),
            killed: false,
            owner: self.clone(),
        }
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Kills every open connection; later ones are accepted as usual.
    fn kill_all(&self) {
        let old = std::mem::take(&mut *lock(&self.kill));
        old.cancel();
    }
}

/// An accepted connection: a TCP stream that fails every read and write once
/// its server kills it, so hyper drops it and the peer sees it close.
struct Conn {
    io: TcpStream,
    kill: Pin<Box<WaitForCancellationFutureOwned>>,
    killed: bool,
    owner: Arc<Connections>,
}

impl Conn {
    fn killed(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.killed && self.kill.as_mut().poll(cx).is_ready() {
            self.killed = true;
        }
        self.killed
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.owner.open.fetch_sub(1, Ordering::SeqCst);
        self.owner.changed.send_modify(|v| *v += 1);
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.killed(cx) {
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.killed(cx) {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

/// Binds `127.0.0.1:0` and feeds accepted connections to a tonic server
/// until `stop` is cancelled; returns the address and the incoming stream.
async fn listen(
    connections: Arc<Connections>,
    stop: CancellationToken,
) -> io::Result<(
    std::net::SocketAddr,
    tokio_stream::wrappers::UnboundedReceiverStream<io::Result<Conn>>,
)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((io, _)) => {
                        let _ = io.set_nodelay(true);
                        if tx.send(Ok(connections.accept(io))).is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::debug!("fake server accept: {e}"),
                },
            }
        }
    });
    Ok((
        addr,
        tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
    ))
}
