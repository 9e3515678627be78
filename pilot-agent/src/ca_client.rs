//! The CSR client for istiod's CA (Istio's `citadel` provider): sends the CSR
//! with the projected token, re-read on every call, over TLS verified against
//! the mounted root and the server name Istio expects.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use proto::istio_ca::IstioCertificateRequest;
use proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient;
use proto::protobuf::{Struct, Value, value::Kind};
use rustls::pki_types::ServerName;
use tonic::metadata::{AsciiMetadataValue, MetadataKey};
use tonic::transport::Channel;

use crate::config::Config;

/// How long one CSR call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a CSR failed.
#[derive(Debug, thiserror::Error)]
pub enum CaClientError {
    /// The CA could not be reached or refused the call.
    #[error("CSR to {addr} failed: {:?}: {}", status.code(), status.message())]
    Rpc {
        /// The CA address.
        addr: String,
        /// The gRPC status.
        status: Box<tonic::Status>,
    },
    /// The CA answered with too short a chain.
    #[error("invalid empty CertChain from {0}")]
    EmptyChain(String),
    /// The channel could not be built.
    #[error("CA client setup: {0}")]
    Setup(String),
}

impl CaClientError {
    /// The gRPC code, when the CA answered.
    #[cfg(test)]
    pub(crate) fn code(&self) -> Option<tonic::Code> {
        match self {
            CaClientError::Rpc { status, .. } => Some(status.code()),
            _ => None,
        }
    }
}

/// A client of `IstioCertificateService`.
#[derive(Clone)]
pub struct CaClient {
    channel: Channel,
    addr: String,
    token_path: PathBuf,
    headers: Vec<(MetadataKey<tonic::metadata::Ascii>, AsciiMetadataValue)>,
    cert_signer: Option<String>,
    ttl: Duration,
}

impl CaClient {
    /// A client for the CA named in `config`. Connects lazily.
    pub fn new(config: &Config) -> Result<Self, CaClientError> {
        Self::with_channel(config, Self::channel(config)?)
    }

    /// The TLS channel (plaintext for `:15010`) to the CA in `config`.
    fn channel(config: &Config) -> Result<Channel, CaClientError> {
        let identity = &config.identity;
        let tls = match &identity.ca_root_path {
            None => None,
            Some(root) => {
                let root = root.clone();
                let source: common::tls::ClientConfigSource = Arc::new(move || {
                    // Re-read on every connection, so a rotated root is picked up.
                    let pem = std::fs::read_to_string(&root).map_err(|e| {
                        common::tls::TlsError::Root {
                            what: root.display().to_string(),
                            reason: format!("cannot read the root certificate: {e}"),
                        }
                    })?;
                    let store = common::tls::root_store(&root.display().to_string(), &pem)?;
                    Ok(Arc::new(common::tls::grpc_client_config(store, None)?))
                });
                let name = ServerName::try_from(identity.ca_server_name.clone()).map_err(|e| {
                    CaClientError::Setup(format!("server name {:?}: {e}", identity.ca_server_name))
                })?;
                Some((source, name))
            }
        };
        common::tls::grpc_channel(&identity.ca_addr, tls, Duration::from_secs(5))
            .map_err(|e| CaClientError::Setup(e.to_string()))
    }

    /// A client calling over `channel` with `config`'s token, headers and
    /// certificate settings (tests pass an in-memory channel).
    pub fn with_channel(config: &Config, channel: Channel) -> Result<Self, CaClientError> {
        let mut headers = Vec::new();
        let mut push = |k: &str, v: &str| -> Result<(), CaClientError> {
            let key = MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
                .map_err(|e| CaClientError::Setup(format!("header name {k:?}: {e}")))?;
            let value = AsciiMetadataValue::try_from(v)
                .map_err(|e| CaClientError::Setup(format!("header {k} value: {e}")))?;
            headers.push((key, value));
            Ok(())
        };
        if !config.pod.cluster_id.is_empty() {
            push("ClusterID", &config.pod.cluster_id)?;
        }
        let identity = &config.identity;
        for (k, v) in &identity.ca_headers {
            push(k, v)?;
        }
        Ok(Self {
            channel,
            addr: identity.ca_addr.clone(),
            token_path: identity.token_path.clone(),
            headers,
            cert_signer: identity.cert_signer.clone(),
            ttl: identity.secret_ttl,
        })
    }

    /// The projected token, read again for every CSR (kubelet rotates it)
    /// off the async workers.
    async fn token(&self) -> Option<String> {
        match tokio::fs::read_to_string(&self.token_path).await {
            Ok(t) if !t.trim().is_empty() => Some(t.trim().to_string()),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(target: "cache", "cannot read token {}: {e}; calling the CA without one", self.token_path.display());
                None
            }
        }
    }

    /// Sends `csr_pem` and returns the chain `[leaf, ..., root]`.
    pub async fn sign(&self, csr_pem: &str) -> Result<Vec<String>, CaClientError> {
        let mut fields = std::collections::BTreeMap::new();
        fields.insert(
            "CertSigner".to_string(),
            Value {
                kind: Some(Kind::StringValue(
                    self.cert_signer.clone().unwrap_or_default(),
                )),
            },
        );
        let mut request = tonic::Request::new(IstioCertificateRequest {
            csr: csr_pem.to_string(),
            validity_duration: self.ttl.as_secs() as i64,
            metadata: Some(Struct {
                fields: fields.into_iter().collect(),
            }),
        });
        request.set_timeout(CALL_TIMEOUT);
        for (k, v) in &self.headers {
            request.metadata_mut().insert(k.clone(), v.clone());
        }
        if let Some(token) = self.token().await
            && let Ok(v) = AsciiMetadataValue::try_from(format!("Bearer {token}"))
        {
            request.metadata_mut().insert("authorization", v);
        }
        let mut client = IstioCertificateServiceClient::new(self.channel.clone());
        let response = client
            .create_certificate(request)
            .await
            .map_err(|status| CaClientError::Rpc {
                addr: self.addr.clone(),
                status: Box::new(status),
            })?
            .into_inner();
        if response.cert_chain.len() <= 1 {
            return Err(CaClientError::EmptyChain(self.addr.clone()));
        }
        Ok(response.cert_chain)
    }
}

#[cfg(test)]
mod tests;
