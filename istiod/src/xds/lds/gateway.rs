//! LDS for routers, as Istio's `buildGatewayListeners`: one listener per
//! port the proxy's Gateways ask for, `0.0.0.0_<port>` bound to that port
//! (no `virtualOutbound`, no `virtualInbound`: a gateway's traffic is not
//! captured). A plain HTTP port has one chain routing by `http.<port>`; an
//! HTTPS port has one chain per server, matched by SNI from its hosts,
//! terminating TLS (see [`super::gateway_tls`]) and routing by
//! `https.<port>.<portName>.<gateway>.<namespace>`, with the
//! `tls_inspector` listener filter.

use proto::pb::envoy::config::core::v3::TrafficDirection;
use proto::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};
use proto::pb::envoy::extensions::filters::http::cors::v3::Cors;
use proto::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use proto::pb::envoy::extensions::filters::http::router::v3::Router;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, Rds, http_connection_manager,
};
use proto::pb::google::protobuf::BoolValue;

use super::super::context::IstioContext;
use super::super::gateway::{BoundServer, listener_name, route_name, servers_by_port, sni_hosts};
use super::super::util::{IpMode, ads_source, socket, transport_socket};
use super::super::{Proxy, rds};
use super::{gateway_tls, http_filter, network_filter, tls_inspector};

/// The listeners of a router.
pub(super) fn listeners(ctx: &IstioContext, proxy: &Proxy) -> Vec<Listener> {
    let ip = IpMode::of(&proxy.ips);
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
                https_chains(port, &http)
            } else if http.is_empty() {
                Vec::new()
            } else {
                vec![http_chain(port)]
            };
            if !forwarded.is_empty() {
                filter_chains.extend(super::gateway_tcp::chains(ctx, proxy, port, &forwarded));
            }
            if filter_chains.is_empty() {
                // Istio omits a listener with no chain (no route binds it).
                return None;
            }
            let tls = filter_chains
                .iter()
                .any(|c| c.transport_socket.is_some() || c.filter_chain_match.is_some());
            Some(Listener {
                name: listener_name(port),
                address: Some(socket(ip.wildcard(), port.into())),
                traffic_direction: TrafficDirection::Outbound.into(),
                filter_chains,
                listener_filters: if tls {
                    vec![tls_inspector()]
                } else {
                    Vec::new()
                },
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
fn http_chain(port: u16) -> FilterChain {
    FilterChain {
        filters: vec![gateway_hcm(port, &route_name(port))],
        ..Default::default()
    }
}

/// One chain per HTTPS server, matched by SNI from its hosts (none when a
/// host is `*`; servers with the same SNI hosts are merged away before).
fn https_chains(port: u16, servers: &[BoundServer<'_>]) -> Vec<FilterChain> {
    servers
        .iter()
        .filter_map(|bound| https_chain(port, bound, sni_hosts(bound.server)))
        .collect()
}

/// The chain of one HTTPS server.
fn https_chain(port: u16, bound: &BoundServer<'_>, names: Vec<String>) -> Option<FilterChain> {
    let tls = bound.server.tls.as_ref()?;
    Some(FilterChain {
        filter_chain_match: Some(FilterChainMatch {
            server_names: names,
            ..Default::default()
        }),
        filters: vec![gateway_hcm(port, &bound.route_name())],
        transport_socket: Some(transport_socket(
            "envoy.transport_sockets.tls",
            &gateway_tls::downstream_tls_context(tls),
        )),
        ..Default::default()
    })
}

/// The gateway's HTTP connection manager: the client's address is the
/// remote address (Istio sets `use_remote_address` on gateways, which face
/// clients directly), with the sidecars' HTTP filters.
fn gateway_hcm(
    port: u16,
    route_config_name: &str,
) -> proto::pb::envoy::config::listener::v3::Filter {
    network_filter(
        "envoy.filters.network.http_connection_manager",
        &HttpConnectionManager {
            stat_prefix: format!("outbound_0.0.0.0_{port}"),
            route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
                config_source: Some(ads_source()),
                route_config_name: route_config_name.to_string(),
            })),
            use_remote_address: Some(BoolValue { value: true }),
            http_filters: vec![
                http_filter("envoy.filters.http.fault", &HttpFault::default()),
                http_filter(rds::CORS_FILTER, &Cors::default()),
                http_filter("envoy.filters.http.router", &Router::default()),
            ],
            ..Default::default()
        },
    )
}
