//! rustls configurations for the mesh: one crypto provider (ring), a verifier
//! for SPIFFE peers (no DNS names, identity in the URI SAN), and a gRPC
//! channel that runs over our own rustls client so the server name, roots and
//! client certificate are ours to choose (as ztunnel's control channel does).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::pki;

/// Errors building TLS configurations.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Certificates or keys could not be read.
    #[error(transparent)]
    Pki(#[from] pki::PkiError),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// A root certificate was refused.
    #[error("{what}: root certificate refused: {reason}")]
    Root {
        /// Where the root came from.
        what: String,
        /// Why.
        reason: String,
    },
    /// An address could not be used.
    #[error("invalid address {addr:?}: {reason}")]
    Address {
        /// The address.
        addr: String,
        /// Why.
        reason: String,
    },
}

/// Installs ring as the process-wide rustls provider. Idempotent.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn provider() -> Arc<CryptoProvider> {
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

/// Builds a root store from a PEM bundle.
pub fn root_store(what: &str, pem: &str) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in pki::pem_certs(what, pem)? {
        store.add(cert).map_err(|e| TlsError::Root {
            what: what.to_string(),
            reason: e.to_string(),
        })?;
    }
    Ok(store)
}

/// A client config that verifies the server's DNS name against `roots`, with an
/// optional client certificate, speaking HTTP/2 (gRPC).
pub fn grpc_client_config(
    roots: RootCertStore,
    client_cert: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match client_cert {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key)?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Produces the TLS client config for each new connection, so a root or client
/// certificate that changed on disk is picked up on reconnect. It may block
/// (it reads files): [`grpc_channel`] calls it on the blocking pool.
pub type ClientConfigSource = Arc<dyn Fn() -> Result<Arc<ClientConfig>, TlsError> + Send + Sync>;

/// gRPC HTTP/2 keepalive: a PING after `interval` without activity, the
/// connection closed when its answer takes longer than `timeout` (Istio's
/// `pkg/keepalive` options).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct GrpcKeepalive {
    /// `GRPC_KEEPALIVE_INTERVAL` (30s).
    pub interval: Duration,
    /// `GRPC_KEEPALIVE_TIMEOUT` (10s).
    pub timeout: Duration,
}

impl Default for GrpcKeepalive {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
        }
    }
}

/// A lazily connecting gRPC channel to `addr` (`host:port`). With `tls`, the
/// server certificate must be valid for `server_name`. Istio's default
/// keepalive ([`GrpcKeepalive::default`]).
pub fn grpc_channel(
    addr: &str,
    tls: Option<(ClientConfigSource, ServerName<'static>)>,
    connect_timeout: Duration,
) -> Result<Channel, TlsError> {
    grpc_channel_with(addr, tls, connect_timeout, GrpcKeepalive::default())
}

/// [`grpc_channel`] with its keepalive.
pub fn grpc_channel_with(
    addr: &str,
    tls: Option<(ClientConfigSource, ServerName<'static>)>,
    connect_timeout: Duration,
    keepalive: GrpcKeepalive,
) -> Result<Channel, TlsError> {
    let bad = |reason: String| TlsError::Address {
        addr: addr.to_string(),
        reason,
    };
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| bad(e.to_string()))?
        .connect_timeout(connect_timeout)
        .http2_keep_alive_interval(keepalive.interval)
        .keep_alive_timeout(keepalive.timeout)
        .keep_alive_while_idle(true);
    let Some((source, server_name)) = tls else {
        return Ok(endpoint.connect_lazy());
    };
    let target = addr.to_string();
    let connector = tower::service_fn(move |_: Uri| {
        let source = source.clone();
        let server_name = server_name.clone();
        let target = target.clone();
        async move {
            // The source reads root and key files: off the async workers.
            let config = tokio::task::spawn_blocking(move || source())
                .await
                .map_err(io::Error::other)?
                .map_err(io::Error::other)?;
            let tcp =
                tokio::time::timeout(connect_timeout, tokio::net::TcpStream::connect(&target))
                    .await
                    .map_err(|_| {
                        io::Error::new(io::ErrorKind::TimedOut, format!("connecting to {target}"))
                    })??;
            let _ = tcp.set_nodelay(true);
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(server_name, tcp)
                .await?;
            Ok::<_, io::Error>(TokioIo::new(tls))
        }
    });
    Ok(endpoint.connect_with_connector_lazy(connector))
}

/// The handshake-signature half of a [`ServerCertVerifier`]: checks TLS 1.2
/// and 1.3 handshake signatures with a provider's algorithms, whatever the
/// verifier decides about the certificate itself.
#[derive(Debug, Clone)]
pub struct HandshakeSignatures(Arc<CryptoProvider>);

impl HandshakeSignatures {
    /// Checks with `provider`'s signature verification algorithms.
    pub fn new(provider: Arc<CryptoProvider>) -> Self {
        Self(provider)
    }

    /// The provider whose algorithms check the signatures.
    pub fn provider(&self) -> &CryptoProvider {
        &self.0
    }

    /// [`ServerCertVerifier::verify_tls12_signature`].
    pub fn tls12(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    /// [`ServerCertVerifier::verify_tls13_signature`].
    pub fn tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    /// [`ServerCertVerifier::supported_verify_schemes`].
    pub fn schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Verifies a server by SPIFFE identity: the chain must lead to `roots` and the
/// leaf's URI SAN must be one of `allowed` (any SPIFFE identity when empty).
/// The TLS server name is not checked: mesh certificates carry no DNS names.
#[derive(Debug)]
pub struct SpiffeServerVerifier {
    roots: Arc<RootCertStore>,
    allowed: Vec<String>,
    signatures: HandshakeSignatures,
}

impl SpiffeServerVerifier {
    /// A verifier trusting `roots` and accepting the `allowed` identities.
    pub fn new(roots: RootCertStore, allowed: Vec<String>) -> Self {
        Self {
            roots: Arc::new(roots),
            allowed,
            signatures: HandshakeSignatures::new(provider()),
        }
    }
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.signatures
                .provider()
                .signature_verification_algorithms
                .all,
        )?;
        let info = pki::cert_info(end_entity.as_ref())
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        let ids: Vec<&String> = info
            .uri_sans
            .iter()
            .filter(|u| u.starts_with("spiffe://"))
            .collect();
        let ok = if self.allowed.is_empty() {
            !ids.is_empty()
        } else {
            ids.iter().any(|id| self.allowed.contains(id))
        };
        if ok {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "peer identity {:?} is not one of {:?}",
                info.uri_sans, self.allowed
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signatures.tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signatures.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.signatures.schemes()
    }
}

/// A client config that trusts SPIFFE peers chaining to `roots`.
pub fn spiffe_client_config(
    roots: RootCertStore,
    allowed: Vec<String>,
    client_cert: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(SpiffeServerVerifier::new(roots, allowed)));
    Ok(match client_cert {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key)?,
        None => builder.with_no_client_auth(),
    })
}
