//! AuthorizationPolicy to Envoy's RBAC and ext_authz filters (Istio's
//! `authz` builder).

use proto::pb::envoy::config::listener::v3::Filter;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;

use super::Proxy;
use super::context::IstioContext;

/// The HTTP authorization filters for `proxy`'s inbound chains.
pub fn http_filters(_ctx: &IstioContext, _proxy: &Proxy) -> Vec<HttpFilter> {
    Vec::new()
}

/// The network authorization filters for `proxy`'s inbound TCP chains.
pub fn network_filters(_ctx: &IstioContext, _proxy: &Proxy) -> Vec<Filter> {
    Vec::new()
}
