//! `pilot_envoy_filter_status{name, patch, result}` (Istio's
//! `pilot/pkg/networking/core/envoyfilter/monitoring.go`): 1 for each
//! EnvoyFilter (`namespace/name`) and kind of patch that applied
//! (`result="applied"`) or failed (`result="error"`) at generation.
//! Generation has no handle on istiod's registry, so the gauge is one per
//! process, registered into each registry that asks (Istio's is global too).

use std::sync::OnceLock;

use common::metrics::MetricsError;
use prometheus::{IntGaugeVec, Opts, Registry};

/// Istio's `PatchType` label values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `cluster`.
    Cluster,
    /// `listener`.
    Listener,
    /// `filterchain`.
    FilterChain,
    /// `networkfilter`.
    NetworkFilter,
    /// `httpfilter`.
    HttpFilter,
    /// `route`.
    Route,
    /// `vhost`.
    VirtualHost,
}

impl PatchType {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            PatchType::Cluster => "cluster",
            PatchType::Listener => "listener",
            PatchType::FilterChain => "filterchain",
            PatchType::NetworkFilter => "networkfilter",
            PatchType::HttpFilter => "httpfilter",
            PatchType::Route => "route",
            PatchType::VirtualHost => "vhost",
        }
    }
}

fn gauge() -> &'static IntGaugeVec {
    static GAUGE: OnceLock<IntGaugeVec> = OnceLock::new();
    GAUGE.get_or_init(|| {
        IntGaugeVec::new(
            Opts::new(
                "pilot_envoy_filter_status",
                "Status of Envoy filters whether it was applied or errored.",
            ),
            &["name", "patch", "result"],
        )
        .unwrap_or_else(|e| panic!("metric pilot_envoy_filter_status: {e}"))
    })
}

/// Registers the gauge in `registry`.
pub fn register(registry: &Registry) -> Result<(), MetricsError> {
    common::metrics::register(registry, "pilot_envoy_filter_status", gauge().clone()).map(drop)
}

/// Records that a patch of `name` applied or failed.
pub(super) fn record(name: &str, patch: PatchType, applied: bool) {
    let result = if applied { "applied" } else { "error" };
    gauge()
        .with_label_values(&[name, patch.as_str(), result])
        .set(1);
}

#[cfg(test)]
pub(super) fn value(name: &str, patch: PatchType, result: &str) -> i64 {
    gauge()
        .with_label_values(&[name, patch.as_str(), result])
        .get()
}
