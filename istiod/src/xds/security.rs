//! The security filters of a proxy's inbound chains, as Istio's
//! `buildInboundFilterchains` places them: request authentication
//! (`jwt_authn`) first, then authorization (ext_authz for CUSTOM, RBAC for
//! DENY, AUDIT and ALLOW), ahead of the router on HTTP chains and of
//! `tcp_proxy` on TCP chains. Built once per proxy and shared by its chains.

use proto::pb::envoy::config::listener::v3::Filter;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;

use super::{authn, authz};
use crate::pushctx::Proxy;
use crate::pushctx::context::IstioContext;

/// The filters every inbound chain of one proxy carries.
#[derive(Debug, Clone, Default)]
pub struct InboundSecurity {
    /// HTTP filters, in order, before the router.
    pub http: Vec<HttpFilter>,
    /// Network filters, in order, before `tcp_proxy`.
    pub tcp: Vec<Filter>,
    /// How request paths are normalized before the HTTP filters match them
    /// (the mesh's `pathNormalization`).
    pub path_normalization: crate::mesh::PathNormalization,
}

impl InboundSecurity {
    /// The filters for `proxy`'s workload under the policies that select it.
    pub fn build(ctx: &IstioContext, proxy: &Proxy) -> Self {
        let mut http = authn::http_filters(ctx, proxy);
        http.extend(authz::http_filters(ctx, proxy));
        Self {
            http,
            tcp: authz::network_filters(ctx, proxy),
            path_normalization: ctx.mesh.path_normalization,
        }
    }
}
