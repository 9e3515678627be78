//! `istio.v1.auth.IstioCertificateService/CreateCertificate`, as Istio's
//! `security/pkg/server/ca/server.go` answers it.

use std::sync::Arc;
use std::time::Duration;

use proto::istio_ca::istio_certificate_service_server::IstioCertificateService;
use proto::istio_ca::{IstioCertificateRequest, IstioCertificateResponse};
use tonic::{Request, Response, Status};

use super::authn::Authenticators;
use super::authority::Authority;
use crate::metrics::CaMetrics;

/// The CA gRPC service.
pub struct CaServer {
    authority: Arc<Authority>,
    authn: Authenticators,
    metrics: Arc<CaMetrics>,
}

impl CaServer {
    /// A CA service signing with `authority`'s current signer for callers
    /// `authn` accepts.
    pub fn new(authority: Arc<Authority>, authn: Authenticators, metrics: Arc<CaMetrics>) -> Self {
        Self {
            authority,
            authn,
            metrics,
        }
    }
}

#[tonic::async_trait]
impl IstioCertificateService for CaServer {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        self.metrics.csr_count.inc();
        let peer_certs = request.peer_certs();
        let caller = match self
            .authn
            .authenticate(request.metadata(), peer_certs.as_deref().map(Vec::as_slice))
            .await
        {
            Ok(c) => c,
            Err(e) => {
                self.metrics.authentication_failure_count.inc();
                tracing::warn!(target: "ca", "CSR rejected: {e}");
                return Err(Status::unauthenticated(e.to_string()));
            }
        };
        let req = request.into_inner();
        let ttl = if req.validity_duration <= 0 {
            Duration::ZERO
        } else {
            Duration::from_secs(req.validity_duration as u64)
        };
        let signer = self.authority.signer();
        let identities = caller.identities.clone();
        let csr = req.csr;
        // Signing is CPU work (RSA especially): keep it off the async workers.
        let signed =
            tokio::task::spawn_blocking(move || signer.sign_workload(&csr, &identities, ttl))
                .await
                .map_err(|e| Status::internal(format!("signing task failed: {e}")))?;
        match signed {
            Ok(chain) => {
                self.metrics.success_cert_issuance_count.inc();
                tracing::info!(
                    target: "ca",
                    "generated new workload certificate for {} (authenticated by {}), requested TTL {}s",
                    caller
                        .identities
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(","),
                    caller.authenticator,
                    req.validity_duration
                );
                Ok(Response::new(IstioCertificateResponse {
                    cert_chain: chain,
                }))
            }
            Err(e) => {
                self.metrics
                    .csr_sign_err_count
                    .with_label_values(&[e.label()])
                    .inc();
                tracing::warn!(target: "ca", "CSR signing error for {:?}: {e}", caller.identities);
                Err(Status::new(e.code(), format!("CSR signing error ({e})")))
            }
        }
    }
}
