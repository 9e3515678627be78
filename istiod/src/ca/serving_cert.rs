//! istiod's own TLS on :15012 and :15017 following the CA, as Istio's
//! `updateRootCertAndGenKeyCert` does: when the trust bundle changes, the
//! serving certificate is issued again by the current signer (unless
//! `--tlsCertFile`/`--tlsKeyFile` give one) and :15012's client-certificate
//! verifier trusts every root of the new bundle. Handshakes after the change
//! use the new material; established connections are not disturbed.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use tokio::sync::watch;

use super::authority::Authority;

/// Why istiod's TLS material could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ServingCertError {
    /// The signer refused.
    #[error("issuing istiod's serving certificate: {0}")]
    Sign(#[from] super::SignError),
    /// A PEM or key did not parse.
    #[error("istiod's serving certificate: {0}")]
    Pki(#[from] common::pki::PkiError),
    /// rustls refused the material.
    #[error("istiod's TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// The client verifier could not be built.
    #[error("istiod's client-certificate verifier: {0}")]
    Verifier(String),
}

/// The certificate both listeners present, swapped when the CA changes.
#[derive(Debug)]
pub struct ServingCert {
    provider: Arc<CryptoProvider>,
    key: RwLock<Arc<CertifiedKey>>,
    verifier: RwLock<Arc<dyn ClientCertVerifier>>,
    /// Issued by the CA (re-issued on change) rather than given as files.
    issued: Option<IssueSettings>,
}

#[derive(Debug, Clone)]
struct IssueSettings {
    sans: Vec<String>,
    ttl: Duration,
}

impl ServingCert {
    /// Serving material from `authority` (or the given files' `custom`
    /// chain and key), trusting client certificates of its roots.
    pub fn new(
        authority: &Authority,
        sans: &[String],
        ttl: Duration,
        custom: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    ) -> Result<Arc<Self>, ServingCertError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let issued = custom.is_none().then(|| IssueSettings {
            sans: sans.to_vec(),
            ttl,
        });
        let (chain, key) = match custom {
            Some(given) => given,
            None => issue(authority, sans, ttl)?,
        };
        let certified = CertifiedKey::from_der(chain, key, &provider)?;
        let verifier = verifier(&provider, &authority.signer().bundle().roots)?;
        Ok(Arc::new(Self {
            provider,
            key: RwLock::new(Arc::new(certified)),
            verifier: RwLock::new(verifier),
            issued,
        }))
    }

    /// Takes up `authority`'s current material: a new serving certificate
    /// (when issued by the CA) and the current roots for client certificates.
    pub fn refresh(&self, authority: &Authority) -> Result<(), ServingCertError> {
        let roots = authority.signer().bundle().roots.clone();
        let verifier = verifier(&self.provider, &roots)?;
        if let Some(IssueSettings { sans, ttl }) = &self.issued {
            let (chain, key) = issue(authority, sans, *ttl)?;
            let certified = CertifiedKey::from_der(chain, key, &self.provider)?;
            *self.key.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(certified);
        }
        *self.verifier.write().unwrap_or_else(|e| e.into_inner()) = verifier;
        tracing::info!(target: "ca", "istiod's TLS now trusts {} root(s){}", roots.len(),
            if self.issued.is_some() { " and presents a new serving certificate" } else { "" });
        Ok(())
    }

    /// :15012's config: this certificate, client certificates of the CA's
    /// roots requested but optional, HTTP/2.
    pub fn grpc_config(self: &Arc<Self>) -> Result<ServerConfig, ServingCertError> {
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(Arc::new(Verifier(self.clone())))
            .with_cert_resolver(Arc::new(Resolver(self.clone())));
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }

    /// :15017's config: this certificate, no client certificates, HTTP/1.1.
    pub fn webhook_config(self: &Arc<Self>) -> Result<ServerConfig, ServingCertError> {
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(self.clone())));
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    /// Refreshes on every change of `authority`'s trust bundle until it ends.
    pub async fn follow(
        self: Arc<Self>,
        authority: Arc<Authority>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut roots = authority.subscribe();
        roots.borrow_and_update();
        loop {
            tokio::select! {
                r = roots.changed() => if r.is_err() { return },
                _ = shutdown.wait_for(|v| *v) => return,
            }
            roots.borrow_and_update();
            if let Err(e) = self.refresh(&authority) {
                tracing::error!(target: "ca", "cannot take up the CA's new material for istiod's TLS: {e}");
            }
        }
    }

    fn current_verifier(&self) -> Arc<dyn ClientCertVerifier> {
        self.verifier
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

fn issue(
    authority: &Authority,
    sans: &[String],
    ttl: Duration,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), ServingCertError> {
    let (chain_pem, key) = authority.signer().sign_server_cert(sans, ttl)?;
    let chain = common::pki::pem_certs("istiod serving certificate", &chain_pem)?;
    Ok((chain, PrivateKeyDer::Pkcs8(key.serialize_der().into())))
}

fn verifier(
    provider: &Arc<CryptoProvider>,
    roots: &[CertificateDer<'static>],
) -> Result<Arc<dyn ClientCertVerifier>, ServingCertError> {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r.clone())?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| ServingCertError::Verifier(e.to_string()))
}

#[derive(Debug)]
struct Resolver(Arc<ServingCert>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.key.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// Delegates to the verifier of the current roots.
#[derive(Debug)]
struct Verifier(Arc<ServingCert>);

impl ClientCertVerifier for Verifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    // No hints: which roots are trusted changes; clients send their
    // certificate regardless.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0
            .current_verifier()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .current_verifier()
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .current_verifier()
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.current_verifier().supported_verify_schemes()
    }
}
