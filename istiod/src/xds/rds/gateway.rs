//! RDS for routers, as Istio's `buildGatewayHTTPRouteConfig`: one route
//! configuration per plain HTTP port, `http.<port>`, and one per HTTPS
//! server, `https.<port>.<portName>.<gateway>.<namespace>`, with a `<host>:<port>`
//! virtual host for every host where a bound VirtualService's hosts meet
//! the port's server hosts, its routes built as for sidecars; a port no
//! VirtualService reaches answers 404 (`blackhole:<port>`).

use std::collections::BTreeMap;

use proto::pb::envoy::config::route::v3::{
    DirectResponseAction, Route, RouteConfiguration, VirtualHost, route, virtual_host,
};
use proto::pb::google::protobuf::BoolValue;

use super::super::gateway::{
    BoundServer, binds, intersect, names_gateway, server_host_for, servers_for_route,
};
use super::super::util::u32v;
use super::translate::{Clusters, gateway_semantics, route_match, source_matches, vs_route};
use crate::model::gateway::{Server, split_host};
use crate::model::istio::{HttpMatchRequest, VirtualService};
use crate::model::route::MAX_DIRECT_RESPONSE_BODY_BYTES;
use crate::model::service::is_exported_to;
use crate::pushctx::Proxy;
use crate::pushctx::context::{IstioContext, resolve_host};
use crate::pushctx::named::Named;

/// The route configuration `http.<port>` or `https.<port>.<portName>.<gateway>.<namespace>`
/// of a router; `None` when no server of its Gateways has that name.
pub(super) fn route_config(
    ctx: &IstioContext,
    proxy: &Proxy,
    name: &str,
) -> Option<RouteConfiguration> {
    let (port, servers) = servers_for_route(ctx, proxy, name)?;
    // Hosts sorted by name, each with its VirtualServices in the push
    // context's order.
    let mut hosts: BTreeMap<String, Vec<&Named<VirtualService>>> = BTreeMap::new();
    for vs in &ctx.virtual_services {
        if !is_exported_to(&vs.spec.export_to, &vs.namespace, &proxy.namespace) {
            continue;
        }
        for bound in &servers {
            let gw = bound.gateway;
            if !binds(&vs.spec, &vs.namespace, &gw.namespace, &gw.name) {
                continue;
            }
            for vs_host in &vs.spec.hosts {
                let vs_host = resolve_host(vs_host, &vs.namespace, &ctx.domain);
                for server_host in &bound.server.hosts {
                    let Some(server_host) =
                        server_host_for(server_host, &vs.namespace, &gw.namespace)
                    else {
                        continue;
                    };
                    if let Some(host) = intersect(&vs_host, server_host) {
                        let list = hosts.entry(host).or_default();
                        if !list.iter().any(|v| std::ptr::eq(*v, vs)) {
                            list.push(vs);
                        }
                    }
                }
            }
        }
    }
    let mut virtual_hosts: Vec<VirtualHost> = hosts
        .iter()
        .map(|(host, vss)| virtual_host(ctx, proxy, host, port, vss, &servers))
        .filter(|vh| !vh.routes.is_empty())
        .map(|vh| with_redirect(vh, &servers))
        .collect();
    // Istio: a host of an `httpsRedirect` server no VirtualService reaches
    // still redirects.
    for bound in servers.iter().filter(|b| https_redirect(b.server)) {
        for host in &bound.server.hosts {
            let (_, host) = split_host(host);
            if !virtual_hosts
                .iter()
                .any(|vh| vh.domains.iter().any(|d| d == host))
            {
                virtual_hosts.push(VirtualHost {
                    name: format!("{host}:{port}"),
                    domains: vec![host.to_string()],
                    include_request_attempt_count: true,
                    require_tls: virtual_host::TlsRequirementType::All.into(),
                    ..Default::default()
                });
            }
        }
    }
    if virtual_hosts.is_empty() {
        virtual_hosts.push(blackhole(port));
    }
    Some(RouteConfiguration {
        name: name.to_string(),
        virtual_hosts,
        validate_clusters: Some(BoolValue { value: false }),
        max_direct_response_body_size_bytes: Some(u32v(MAX_DIRECT_RESPONSE_BODY_BYTES)),
        ignore_port_in_host_matching: true,
        ..Default::default()
    })
}

fn https_redirect(server: &Server) -> bool {
    server.tls.as_ref().is_some_and(|t| t.https_redirect)
}

/// Istio's `httpsRedirect`: the virtual host of a host served by a server
/// with it answers plain HTTP with a 301 to https (`require_tls: ALL`).
fn with_redirect(mut vh: VirtualHost, servers: &[BoundServer<'_>]) -> VirtualHost {
    let redirected = servers
        .iter()
        .filter(|b| https_redirect(b.server))
        .any(|b| {
            b.server.hosts.iter().any(|h| {
                let (_, h) = split_host(h);
                vh.domains.iter().any(|d| intersect(d, h).is_some())
            })
        });
    if redirected {
        vh.require_tls = virtual_host::TlsRequirementType::All.into();
    }
    vh
}

/// One host's virtual host: the HTTP routes of its VirtualServices whose
/// matches apply on this port to this gateway.
fn virtual_host(
    ctx: &IstioContext,
    proxy: &Proxy,
    host: &str,
    port: u16,
    virtual_services: &[&Named<VirtualService>],
    servers: &[BoundServer<'_>],
) -> VirtualHost {
    let mut routes = Vec::new();
    for vs in virtual_services {
        let clusters = Clusters {
            ctx,
            vs_ns: &vs.namespace,
            client: proxy,
            port,
            gateway_semantics: vs.spec.gateway_semantics,
        };
        let start = routes.len();
        for r in &vs.spec.http {
            // Istio's `sourceMatchHTTP` on a gateway: a match naming
            // gateways applies on those (of this port) only, else by the
            // gateway workload's labels and namespace.
            let applies = |m: &&HttpMatchRequest| {
                m.port.is_none_or(|p| p == u32::from(port))
                    && if m.gateways.is_empty() {
                        source_matches(m, proxy)
                    } else {
                        servers.iter().any(|b| {
                            let gw = b.gateway;
                            binds(&vs.spec, &vs.namespace, &gw.namespace, &gw.name)
                                && names_gateway(
                                    &m.gateways,
                                    &vs.namespace,
                                    &gw.namespace,
                                    &gw.name,
                                )
                        })
                    }
            };
            if r.r#match.is_empty() {
                routes.push(vs_route(&clusters, host, r, None));
            } else {
                for m in r.r#match.iter().filter(applies) {
                    routes.push(vs_route(&clusters, host, r, Some(m)));
                }
            }
        }
        if vs.spec.gateway_semantics {
            routes[start..].iter_mut().for_each(gateway_semantics);
        }
    }
    VirtualHost {
        name: format!("{host}:{port}"),
        domains: vec![host.to_string()],
        routes,
        include_request_attempt_count: true,
        ..Default::default()
    }
}

/// Istio's virtual host for a port no VirtualService reaches: 404.
fn blackhole(port: u16) -> VirtualHost {
    VirtualHost {
        name: format!("blackhole:{port}"),
        domains: vec!["*".into()],
        routes: vec![Route {
            name: "default".into(),
            r#match: Some(route_match(None)),
            action: Some(route::Action::DirectResponse(DirectResponseAction {
                status: 404,
                ..Default::default()
            })),
            ..Default::default()
        }],
        ..Default::default()
    }
}
