//! The HTTPS server of `--httpsAddr`: TLS with istiod's serving certificate
//! (no client certificate: the API server authenticates the webhook, not the
//! other way round), HTTP/1.1, and the webhooks' routes.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::inject::Injector;
use super::validation::Validator;

/// How long a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; more wait in the accept queue.
const HANDSHAKES_IN_FLIGHT: usize = 256;

/// The TLS config of the webhook server.
pub fn tls_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<ServerConfig, common::tls::TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A listener yielding completed TLS connections: handshakes run in their own
/// tasks, so a slow or broken client delays nobody else.
pub struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Starts accepting on `listener`.
    pub fn new(listener: TcpListener, acceptor: TlsAcceptor) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let (tx, rx) = mpsc::channel(HANDSHAKES_IN_FLIGHT);
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(target: "webhook", "accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    break;
                }
                let _ = tcp.set_nodelay(true);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(target: "webhook", %peer, "TLS handshake failed: {e}")
                        }
                        Err(_) => {
                            tracing::debug!(target: "webhook", %peer, "TLS handshake timed out")
                        }
                    }
                });
            }
        });
        Ok(Self { rx, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The accept loop only ends with the server; wait for shutdown.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// The routes of `--httpsAddr`. `/ready` answers 503 until xDS is served
/// (`ready`) and, when injection is on, until the injector has settings, as
/// Istio's readiness probes "discovery" and "sidecar injector" on this port.
pub fn router(
    injector: Option<Arc<Injector>>,
    validator: Arc<Validator>,
    ready: watch::Receiver<bool>,
) -> Router {
    let probe = injector.clone();
    let mut app = Router::new()
        .route(
            "/ready",
            get(move || {
                let why = if !*ready.borrow() {
                    Some("discovery not ready")
                } else if probe.as_ref().is_some_and(|i| !i.is_ready()) {
                    Some("sidecar injector has no settings")
                } else {
                    None
                };
                async move {
                    match why {
                        None => (axum::http::StatusCode::OK, ""),
                        Some(why) => (axum::http::StatusCode::SERVICE_UNAVAILABLE, why),
                    }
                }
            }),
        )
        .route("/validate", post(super::validation::serve))
        .route("/validate/{*rest}", post(super::validation::serve))
        .with_state(validator);
    if let Some(injector) = injector {
        app = app.merge(
            Router::new()
                .route("/inject", post(super::inject::serve))
                .route("/inject/", post(super::inject::serve))
                .route("/inject/{*params}", post(super::inject::serve))
                .with_state(injector),
        );
    }
    app
}
