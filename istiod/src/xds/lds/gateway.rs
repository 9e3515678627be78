//! LDS for routers, as Istio's `buildGatewayListeners`: one listener per
//! port the proxy's Gateways ask for, `0.0.0.0_<port>` bound to that port
//! (no `virtualOutbound`, no `virtualInbound`: a gateway's traffic is not
//! captured), whose HTTP connection manager routes by `http.<port>`.

use proto::pb::envoy::config::core::v3::TrafficDirection;
use proto::pb::envoy::config::listener::v3::{FilterChain, Listener};
use proto::pb::envoy::extensions::filters::http::cors::v3::Cors;
use proto::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use proto::pb::envoy::extensions::filters::http::router::v3::Router;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, Rds, http_connection_manager,
};
use proto::pb::google::protobuf::BoolValue;

use super::super::context::IstioContext;
use super::super::gateway::{listener_name, route_name, servers_by_port};
use super::super::util::{IpMode, ads_source, socket};
use super::super::{Proxy, rds};
use super::{http_filter, network_filter};

/// The listeners of a router.
pub(super) fn listeners(ctx: &IstioContext, proxy: &Proxy) -> Vec<Listener> {
    let ip = IpMode::of(&proxy.ips);
    servers_by_port(ctx, proxy)
        .into_iter()
        .filter_map(|(port, servers)| {
            if super::gateway_tcp::serves(&servers) {
                return super::gateway_tcp::listener(ctx, proxy, port, &servers);
            }
            Some(Listener {
                name: listener_name(port),
                address: Some(socket(ip.wildcard(), port.into())),
                traffic_direction: TrafficDirection::Outbound.into(),
                filter_chains: vec![FilterChain {
                    filters: vec![gateway_hcm(port)],
                    ..Default::default()
                }],
                ..Default::default()
            })
        })
        .collect()
}

/// The route configuration names of a router's listeners.
pub fn route_names(ctx: &IstioContext, proxy: &Proxy) -> std::collections::BTreeSet<String> {
    servers_by_port(ctx, proxy)
        .into_iter()
        .filter(|(_, servers)| !super::gateway_tcp::serves(servers))
        .map(|(port, _)| route_name(port))
        .collect()
}

/// The gateway's HTTP connection manager: the client's address is the
/// remote address (Istio sets `use_remote_address` on gateways, which face
/// clients directly), with the sidecars' HTTP filters.
fn gateway_hcm(port: u16) -> proto::pb::envoy::config::listener::v3::Filter {
    network_filter(
        "envoy.filters.network.http_connection_manager",
        &HttpConnectionManager {
            stat_prefix: format!("outbound_0.0.0.0_{port}"),
            route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
                config_source: Some(ads_source()),
                route_config_name: route_name(port),
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
