//! RequestAuthentication to Envoy's `jwt_authn` filter (Istio's `authn`
//! builder).

use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;

use super::Proxy;
use super::context::IstioContext;

/// The HTTP authentication filters for `proxy`'s inbound chains.
pub fn http_filters(_ctx: &IstioContext, _proxy: &Proxy) -> Vec<HttpFilter> {
    Vec::new()
}
