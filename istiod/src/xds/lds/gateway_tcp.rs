//! The filter chains of a router's TCP and TLS-passthrough ports, as
//! Istio's `buildGatewayTCPBasedFilterChains` builds them: a `TCP` server
//! forwards every connection by the first `tcp` route of a bound
//! VirtualService whose match applies (one chain, no match); a `TLS` (or
//! `HTTPS`) server in `PASSTHROUGH` mode gets one chain per `tls` route
//! match, selected by
//! SNI (`server_names` from the match's `sniHosts`, read by the TLS
//! inspector) and forwarded without terminating TLS. The forwarding filter
//! is Istio's `buildOutboundNetworkFilters`: a `tcp_proxy` to
//! `outbound|<port>|<subset>|<host>` (stat prefix the cluster) for one
//! destination, else weighted clusters (stat prefix `<vs name>.<vs
//! namespace>`, destinations of weight 0 left out). A port with no chain
//! gets no listener, as in Istio (which logs that the listener "missed
//! network filter").

use std::collections::BTreeSet;

use proto::pb::envoy::config::listener::v3::{Filter, FilterChain, FilterChainMatch};
use proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};

use super::super::gateway::{BoundServer, binds, intersect, names_gateway, server_host_for};
use super::super::rds::translate::Clusters;
use super::super::util::duration;
use super::{network_filter, tcp_hash_policy};
use crate::model::gateway::{Server, ServerTlsMode};
use crate::model::istio::{RouteDestination, VirtualService};
use crate::model::service::{Protocol, is_exported_to};
use crate::pushctx::Proxy;
use crate::pushctx::context::{IstioContext, resolve_host};
use crate::pushctx::named::Named;

fn passthrough(s: &Server) -> bool {
    s.tls
        .as_ref()
        .is_some_and(|t| t.mode == ServerTlsMode::Passthrough)
}

fn protocol(s: &Server) -> Protocol {
    s.port
        .as_ref()
        .map_or(Protocol::Unsupported, |p| Protocol::parse(&p.protocol))
}

/// The chains of a port's TCP and TLS PASSTHROUGH servers; none for a
/// server no VirtualService gives a route.
pub(super) fn chains(
    ctx: &IstioContext,
    proxy: &Proxy,
    port: u16,
    servers: &[BoundServer<'_>],
) -> Vec<FilterChain> {
    let mut chains: Vec<FilterChain> = Vec::new();
    let mut sni_seen: BTreeSet<String> = BTreeSet::new();
    let mut opaque = false;
    for bound in servers {
        let s = bound.server;
        match protocol(s) {
            Protocol::Tcp if s.tls.is_none() => {
                // Envoy refuses two chains with the same (empty) match:
                // the first TCP server on a port is the one served.
                if opaque {
                    tracing::warn!(target: "model", gateway = %format!("{}/{}", bound.gateway.namespace, bound.gateway.name), port, "a second TCP server on the port is ignored");
                    continue;
                }
                match tcp_filters(ctx, proxy, bound) {
                    Some(filters) => {
                        opaque = true;
                        chains.push(FilterChain {
                            filters,
                            ..Default::default()
                        });
                    }
                    None => {
                        tracing::warn!(target: "model", gateway = %format!("{}/{}", bound.gateway.namespace, bound.gateway.name), port, "gateway listener missed network filter (no tcp route binds)");
                    }
                }
            }
            Protocol::Tls | Protocol::Https if passthrough(s) => {
                chains.extend(tls_chains(ctx, proxy, bound, &mut sni_seen));
            }
            _ => {
                tracing::warn!(target: "model", gateway = %format!("{}/{}", bound.gateway.namespace, bound.gateway.name), port, "server is not TCP or TLS PASSTHROUGH on a TCP port; ignored");
            }
        }
    }
    chains
}

/// The VirtualServices bound to this server's Gateway, visible to the
/// proxy, with a host the server admits (Istio's `pickMatchingGatewayHosts`).
fn bound_virtual_services<'a>(
    ctx: &'a IstioContext,
    proxy: &Proxy,
    bound: &BoundServer<'_>,
) -> Vec<&'a Named<VirtualService>> {
    let gw = bound.gateway;
    ctx.virtual_services
        .iter()
        .filter(|vs| is_exported_to(&vs.spec.export_to, &vs.namespace, &proxy.namespace))
        .filter(|vs| binds(&vs.spec, &vs.namespace, &gw.namespace, &gw.name))
        .filter(|vs| {
            vs.spec.hosts.iter().any(|h| {
                let h = resolve_host(h, &vs.namespace, &ctx.domain);
                bound.server.hosts.iter().any(|sh| {
                    server_host_for(sh, &vs.namespace, &gw.namespace)
                        .is_some_and(|sh| intersect(&h, sh).is_some())
                })
            })
        })
        .collect()
}

/// Istio's `l4SingleMatch`: the match's port, if any, is the server's, and
/// its gateways, if any, name this server's Gateway (short names are in
/// the VirtualService's namespace).
fn l4_matches(
    port: Option<u32>,
    gateways: &[String],
    vs_ns: &str,
    bound: &BoundServer<'_>,
) -> bool {
    let gw = bound.gateway;
    port.is_none_or(|p| p == u32::from(bound.server.port_number()))
        && (gateways.is_empty() || names_gateway(gateways, vs_ns, &gw.namespace, &gw.name))
}

/// The first `tcp` route of the bound VirtualServices that applies
/// (Istio's `buildGatewayNetworkFiltersFromTCPRoutes`).
fn tcp_filters(ctx: &IstioContext, proxy: &Proxy, bound: &BoundServer<'_>) -> Option<Vec<Filter>> {
    for vs in bound_virtual_services(ctx, proxy, bound) {
        for r in &vs.spec.tcp {
            let applies = r.r#match.is_empty()
                || r.r#match
                    .iter()
                    .any(|m| l4_matches(m.port, &m.gateways, &vs.namespace, bound));
            if applies && !r.route.is_empty() {
                return Some(route_filters(
                    ctx,
                    proxy,
                    vs,
                    bound.server.port_number(),
                    &r.route,
                ));
            }
        }
    }
    None
}

/// One chain per applying `tls` route match, its SNI hosts not already
/// taken on the port (Istio skips a match with a duplicate SNI host, as
/// Envoy would refuse two chains with the same match).
fn tls_chains(
    ctx: &IstioContext,
    proxy: &Proxy,
    bound: &BoundServer<'_>,
    sni_seen: &mut BTreeSet<String>,
) -> Vec<FilterChain> {
    let mut out = Vec::new();
    for vs in bound_virtual_services(ctx, proxy, bound) {
        for r in vs.spec.tls.iter().filter(|r| !r.route.is_empty()) {
            for m in &r.r#match {
                if !l4_matches(m.port, &m.gateways, &vs.namespace, bound) {
                    continue;
                }
                if m.sni_hosts.iter().any(|h| sni_seen.contains(h)) {
                    tracing::warn!(target: "model", virtual_service = %format!("{}/{}", vs.namespace, vs.name), port = bound.server.port_number(), "skipping a tls match with duplicate SNI host names");
                    continue;
                }
                // The match's SNI hosts are used as written, not narrowed
                // to the server's hosts: Istio only requires a host of the
                // VirtualService to meet the server's (validation keeps the
                // SNI hosts within the VirtualService's hosts).
                sni_seen.extend(m.sni_hosts.iter().cloned());
                out.push(FilterChain {
                    filter_chain_match: Some(FilterChainMatch {
                        server_names: m.sni_hosts.clone(),
                        transport_protocol: "tls".into(),
                        ..Default::default()
                    }),
                    filters: route_filters(ctx, proxy, vs, bound.server.port_number(), &r.route),
                    ..Default::default()
                });
            }
        }
    }
    out
}

/// Istio's `buildOutboundNetworkFilters` for a route's destinations, with
/// the first destination's DestinationRule `tcp.maxConnectionDuration` as
/// the proxy's maximum downstream connection duration, as Istio sets it.
/// Sidecars' `tcp` and `tls` routes use it too, `port` being the listener's.
pub(super) fn route_filters(
    ctx: &IstioContext,
    proxy: &Proxy,
    vs: &Named<VirtualService>,
    port: u16,
    route: &[RouteDestination],
) -> Vec<Filter> {
    let clusters = Clusters {
        ctx,
        vs_ns: &vs.namespace,
        client: proxy,
        port,
        gateway_semantics: vs.spec.gateway_semantics,
    };
    let max_duration = {
        let host = resolve_host(&route[0].destination.host, &vs.namespace, &ctx.domain);
        ctx.registry
            .by_hostname(&host)
            .next()
            .and_then(|svc| ctx.destination_rule(proxy, svc))
            .and_then(|dr| dr.spec.traffic_policy.as_ref())
            .and_then(|tp| tp.connection_pool.as_ref())
            .and_then(|cp| cp.tcp.as_ref())
            .and_then(|tcp| tcp.max_connection_duration)
            .map(duration)
    };
    if let [only] = route {
        let cluster = clusters.of(&only.destination);
        return vec![tcp_proxy(TcpProxy {
            stat_prefix: cluster.clone(),
            hash_policy: tcp_hash_policy(ctx, proxy, &cluster),
            cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(cluster)),
            max_downstream_connection_duration: max_duration,
            ..Default::default()
        })];
    }
    let weighted = route
        .iter()
        .filter(|d| d.weight.unwrap_or(0) > 0)
        .map(|d| tcp_proxy::weighted_cluster::ClusterWeight {
            name: clusters.of(&d.destination),
            weight: d.weight.unwrap_or(0) as u32,
            ..Default::default()
        })
        .collect();
    // Istio hashes a weighted split on the first destination's rule.
    let first = clusters.of(&route[0].destination);
    vec![tcp_proxy(TcpProxy {
        hash_policy: tcp_hash_policy(ctx, proxy, &first),
        stat_prefix: format!("{}.{}", vs.name, vs.namespace),
        cluster_specifier: Some(tcp_proxy::ClusterSpecifier::WeightedClusters(
            tcp_proxy::WeightedCluster { clusters: weighted },
        )),
        max_downstream_connection_duration: max_duration,
        ..Default::default()
    })]
}

fn tcp_proxy(config: TcpProxy) -> Filter {
    network_filter("envoy.filters.network.tcp_proxy", &config)
}

#[cfg(test)]
mod tests;
