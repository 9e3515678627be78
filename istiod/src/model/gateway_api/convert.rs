//! The Gateway API translated to Istio's own Gateway and VirtualService, as
//! Istio's gateway controller does (`pilot/pkg/config/kube/gateway/`), with
//! the status it reports. This file only orchestrates:
//! [`super::gateway_collection`] turns Gateways into Istio Gateways,
//! [`super::route_collections`] attaches routes and assembles
//! VirtualServices, [`super::http_route`] converts one rule.

use crate::model::store::Snapshot;

pub use super::output::{
    GATEWAY_SEMANTICS_ANNOTATION, GATEWAY_SERVICE_ANNOTATION, Generated, Output,
    PARENTS_ANNOTATION, ROUTE_SEMANTICS_ANNOTATION, SERVICE_ACCOUNT_ANNOTATION,
};

/// Translates every Gateway API object in `snapshot`.
pub fn convert(snapshot: &Snapshot, domain: &str) -> Output {
    let mut out = Output::default();
    let (mut parents, gateway_status) =
        super::gateway_collection::gateways(snapshot, domain, &mut out);
    super::route_collections::http_routes(snapshot, domain, &mut parents, &mut out);
    super::tcp_route::l4_routes(snapshot, domain, &mut parents, &mut out);
    super::gateway_collection::gateway_status(&parents, gateway_status, &mut out);
    super::backend_policies::backend_tls_policies(snapshot, domain, &mut out);
    out
}

#[cfg(test)]
#[path = "convert_tests.rs"]
pub(crate) mod tests;
