//! LDS for routers, as Istio's `buildGatewayListeners`: one listener per
//! port the proxy's Gateways ask for, `0.0.0.0_<port>` bound to that port
//! (no `virtualOutbound`, no `virtualInbound`: a gateway's traffic is not
//! captured). A plain HTTP port has one chain routing by `http.<port>`; an
//! HTTPS port has one chain per server, matched by SNI from its hosts,
//! terminating TLS (see [`super::gateway_tls`]) and routing by
//! `https.<port>.<portName>.<gateway>.<namespace>`, with the
//! `tls_inspector` listener filter.
//!
//! The request-level policies that attach to the router (see
//! [`super::super::policy_attachment`]) are on every chain, as Istio's
//! gateway authz builds them: `jwt_authn` and the RBAC/ext_authz filters
//! ahead of fault, CORS and the router in each HTTP connection manager, and
//! network RBAC ahead of `tcp_proxy` on TCP and TLS-passthrough chains. The
//! router's `gatewayTopology` (its ProxyConfig's, else the mesh's
//! `defaultConfig`) sets `xff_num_trusted_hops`, so `remoteIpBlocks` and
//! `remote.ip` match the client address `X-Forwarded-For` gives, while
//! `ipBlocks` keeps matching the connection's peer; its
//! `forwardClientCertDetails` sets how `X-Forwarded-Client-Cert` is
//! forwarded, and `proxyProtocol` adds the `proxy_protocol` listener filter.

use proto::pb::envoy::config::core::v3::TrafficDirection;
use proto::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};
use proto::pb::envoy::extensions::filters::http::cors::v3::Cors;
use proto::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use proto::pb::envoy::extensions::filters::http::router::v3::Router;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, Rds, http_connection_manager,
};
use proto::pb::google::protobuf::BoolValue;

use common::gateway_topology::GatewayTopology;

use super::super::gateway::{BoundServer, listener_name, route_name, servers_by_port, sni_hosts};
use super::super::rds::ops::CORS_FILTER;
use super::super::security::InboundSecurity;
use super::super::util::{IpMode, ads_source, socket, transport_socket};
use super::{gateway_tls, http_filter, network_filter, tls_inspector};
use crate::pushctx::Proxy;
use crate::pushctx::context::IstioContext;

/// What every chain of one router shares: the policies that attach to it
/// and its topology.
pub(super) struct GatewayChainContext {
    /// Authentication and authorization filters.
    pub security: InboundSecurity,
    /// The router's `gatewayTopology`.
    pub topology: GatewayTopology,
}

impl GatewayChainContext {
    fn build(ctx: &IstioContext, proxy: &Proxy) -> Self {
        Self {
            security: InboundSecurity::build(ctx, proxy),
            topology: proxy
                .gateway_topology
                .unwrap_or(ctx.mesh.default_gateway_topology),
        }
    }
}

/// The listeners of a router.
pub(super) fn listeners(ctx: &IstioContext, proxy: &Proxy) -> Vec<Listener> {
    let ip = IpMode::of(&proxy.ips);
    let chain_ctx = GatewayChainContext::build(ctx, proxy);
    servers_by_port(ctx, proxy)
        .into_iter()
        .filter_map(|(port, servers)| {
            // A port's servers, as Istio merges them: plain HTTP servers share
            // one chain; HTTPS servers that terminate TLS get one chain each;
            // TCP servers and PASSTHROUGH servers are forwarded (see
            // `gateway_tcp`); TLS chains of both kinds share a TLS port.
            let (http, forwarded): (Vec<BoundServer<'_>>, Vec<BoundServer<'_>>) =
                servers.iter().partition(|b| b.is_http());
            let mut filter_chains = if http.first().is_some_and(BoundServer::is_https) {
                https_chains(&chain_ctx, port, &http)
            } else if http.is_empty() {
                Vec::new()
            } else {
                vec![http_chain(&chain_ctx, port)]
            };
            if !forwarded.is_empty() {
                let mut tcp = super::gateway_tcp::chains(ctx, proxy, port, &forwarded);
                for chain in &mut tcp {
                    let mut filters = chain_ctx.security.tcp.clone();
                    filters.append(&mut chain.filters);
                    chain.filters = filters;
                }
                filter_chains.extend(tcp);
            }
            if filter_chains.is_empty() {
                // Istio omits a listener with no chain (no route binds it).
                return None;
            }
            let tls = filter_chains
                .iter()
                .any(|c| c.transport_socket.is_some() || c.filter_chain_match.is_some());
            let mut listener_filters = Vec::new();
            if chain_ctx.topology.proxy_protocol.is_some() {
                // Istio puts the PROXY protocol reader first, so the TLS
                // inspector reads the ClientHello that follows it.
                listener_filters.push(super::proxy_protocol_listener_filter());
            }
            if tls {
                listener_filters.push(tls_inspector());
            }
            Some(Listener {
                name: listener_name(port),
                address: Some(socket(ip.wildcard(), port.into())),
                traffic_direction: TrafficDirection::Outbound.into(),
                filter_chains,
                listener_filters,
                ..Default::default()
            })
        })
        .collect()
}

/// The route configuration names of a router's listeners.
pub fn route_names(ctx: &IstioContext, proxy: &Proxy) -> std::collections::BTreeSet<String> {
    servers_by_port(ctx, proxy)
        .into_values()
        .flatten()
        .filter(BoundServer::is_http)
        .map(|b| b.route_name())
        .collect()
}

/// The one chain of a plain HTTP port: every server there shares `http.<port>`.
fn http_chain(chain_ctx: &GatewayChainContext, port: u16) -> FilterChain {
    FilterChain {
        filters: vec![gateway_hcm(chain_ctx, port, &route_name(port))],
        ..Default::default()
    }
}

/// One chain per HTTPS server, matched by SNI from its hosts (none when a
/// host is `*`; servers with the same SNI hosts are merged away before).
fn https_chains(
    chain_ctx: &GatewayChainContext,
    port: u16,
    servers: &[BoundServer<'_>],
) -> Vec<FilterChain> {
    servers
        .iter()
        .filter_map(|bound| https_chain(chain_ctx, port, bound, sni_hosts(bound.server)))
        .collect()
}

/// The chain of one HTTPS server.
fn https_chain(
    chain_ctx: &GatewayChainContext,
    port: u16,
    bound: &BoundServer<'_>,
    names: Vec<String>,
) -> Option<FilterChain> {
    let tls = bound.server.tls.as_ref()?;
    Some(FilterChain {
        filter_chain_match: Some(FilterChainMatch {
            server_names: names,
            ..Default::default()
        }),
        filters: vec![gateway_hcm(chain_ctx, port, &bound.route_name())],
        transport_socket: Some(transport_socket(
            "envoy.transport_sockets.tls",
            &gateway_tls::downstream_tls_context(tls),
        )),
        ..Default::default()
    })
}

/// The gateway's HTTP connection manager, as Istio's
/// `buildGatewayConnectionManager`: the client's address is the remote
/// address (`use_remote_address`: gateways face clients), read
/// `numTrustedProxies` back in `X-Forwarded-For`; the client certificate is
/// forwarded as `forwardClientCertDetails` says (`SANITIZE_SET` by
/// default, with the current certificate's details set); the router's
/// security filters run ahead of fault, CORS and the router.
fn gateway_hcm(
    chain_ctx: &GatewayChainContext,
    port: u16,
    route_config_name: &str,
) -> proto::pb::envoy::config::listener::v3::Filter {
    let fcc = chain_ctx.topology.forward_client_cert_details;
    let mut http_filters = chain_ctx.security.http.clone();
    http_filters.extend([
        http_filter("envoy.filters.http.fault", &HttpFault::default()),
        http_filter(CORS_FILTER, &Cors::default()),
        http_filter("envoy.filters.http.router", &Router::default()),
    ]);
    network_filter(
        "envoy.filters.network.http_connection_manager",
        &HttpConnectionManager {
            stat_prefix: format!("outbound_0.0.0.0_{port}"),
            route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
                config_source: Some(ads_source()),
                route_config_name: route_config_name.to_string(),
            })),
            use_remote_address: Some(BoolValue { value: true }),
            xff_num_trusted_hops: chain_ctx.topology.num_trusted_proxies,
            forward_client_cert_details: fcc.envoy_value(),
            set_current_client_cert_details: fcc.sets_current_details().then(|| {
                http_connection_manager::SetCurrentClientCertDetails {
                    subject: Some(BoolValue { value: true }),
                    cert: true,
                    dns: true,
                    uri: true,
                    ..Default::default()
                }
            }),
            http_filters,
            ..super::normalized(chain_ctx.security.path_normalization)
        },
    )
}

#[cfg(test)]
mod tests;
