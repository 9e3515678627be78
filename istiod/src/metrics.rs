//! istiod's Prometheus metrics, with Istio's names. The `prometheus` crate is
//! used because it writes names as given: Istio's counters carry no `_total`.

use common::metrics::{MetricsError, counter, counter_vec};
use prometheus::{IntCounter, IntCounterVec, Registry};

/// The CA's counters (`security/pkg/server/ca/monitoring.go`).
#[derive(Clone)]
pub struct CaMetrics {
    /// `citadel_server_csr_count`: CSRs received.
    pub csr_count: IntCounter,
    /// `citadel_server_authentication_failure_count`.
    pub authentication_failure_count: IntCounter,
    /// `citadel_server_success_cert_issuance_count`.
    pub success_cert_issuance_count: IntCounter,
    /// `citadel_server_csr_sign_err_count{error}`.
    pub csr_sign_err_count: IntCounterVec,
}

impl CaMetrics {
    /// Registers the CA metrics in `registry`.
    pub fn new(registry: &Registry) -> Result<Self, MetricsError> {
        Ok(Self {
            csr_count: counter(
                registry,
                "citadel_server_csr_count",
                "The number of CSRs received by Citadel server.",
            )?,
            authentication_failure_count: counter(
                registry,
                "citadel_server_authentication_failure_count",
                "The number of authentication failures.",
            )?,
            success_cert_issuance_count: counter(
                registry,
                "citadel_server_success_cert_issuance_count",
                "The number of certificates issuances that have succeeded.",
            )?,
            csr_sign_err_count: counter_vec(
                registry,
                "citadel_server_csr_sign_err_count",
                "The number of errors occurred when signing the CSR.",
                &["error"],
            )?,
        })
    }
}

/// `pilot_total_rejected_configs{type,name}`: configuration istiod had to
/// reject (invalid objects) or ignore (kinds it does not implement); `type`
/// is the kind, `name` the file (or object) it came from.
pub fn rejected_configs(registry: &Registry) -> Result<IntCounterVec, MetricsError> {
    counter_vec(
        registry,
        "pilot_total_rejected_configs",
        "Total number of configs that Pilot had to reject or ignore.",
        &["type", "name"],
    )
}

/// Renders `registry` in Prometheus text format.
pub fn render(registry: &Registry) -> String {
    use prometheus::Encoder;
    let mut buf = Vec::new();
    let _ = prometheus::TextEncoder::new().encode(&registry.gather(), &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}
