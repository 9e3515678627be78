//! The TCP side of a sidecar's outbound listener for one service port, as
//! Istio's `buildSidecarOutboundTLSFilterChainOpts` and
//! `buildSidecarOutboundTCPFilterChainOpts` build it from the `tls` and
//! `tcp` routes of the VirtualServices bound to `mesh` for the host.
//!
//! A match applies to the proxy when its static predicates hold: `port` is
//! the listener's, `gateways` (if any) names `mesh`, `sourceLabels` are a
//! subset of the proxy's labels, `sourceNamespace` is the proxy's. For a
//! `TLS`/`HTTPS` port each applying `tls` match becomes a chain selected by
//! SNI (`server_names`, read by the TLS inspector) and `destinationSubnets`
//! (`prefix_ranges`), the first of a repeated (SNI, subnets) pair kept; with
//! none, the port's default chain. For other TCP ports the first applying
//! `tcp` route without `destinationSubnets` is the match-all chain, routes
//! with subnets become chains by destination address before it; with no
//! match-all route, the default chain to `outbound|<port>||<host>`. The
//! filters are Istio's `buildOutboundNetworkFilters` (one cluster, or
//! weighted clusters).

use std::collections::BTreeSet;

use proto::pb::envoy::config::core::v3::CidrRange;
use proto::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch};

use super::super::util::u32v;
use super::gateway_tcp::route_filters;
use super::{tcp_hash_policy, tcp_proxy_hashed};
use crate::model::istio::{Labels, VirtualService};
use crate::model::security::attributes::parse_cidr;
use crate::pushctx::Proxy;
use crate::pushctx::context::IstioContext;
use crate::pushctx::named::Named;

/// The TCP chains of one service port of a sidecar's outbound listener.
pub(super) struct Port<'a> {
    /// The service's host name.
    pub host: &'a str,
    /// The listener's port.
    pub port: u16,
    /// The port's protocol is `TLS` or `HTTPS`.
    pub tls: bool,
    /// The listener is on the wildcard address, shared by services told
    /// apart by SNI: the default chain matches the host name.
    pub by_sni: bool,
    /// The cluster of the port's default chain.
    pub cluster: &'a str,
}

/// Istio's static match predicates (`matchTCP`, `matchTLS`) for a sidecar.
struct Static<'a> {
    port: Option<u32>,
    gateways: &'a [String],
    source_labels: &'a Labels,
    source_namespace: &'a str,
}

impl Static<'_> {
    fn applies(&self, proxy: &Proxy, port: u16) -> bool {
        self.port.is_none_or(|p| p == u32::from(port))
            && (self.gateways.is_empty() || self.gateways.iter().any(|g| g == "mesh"))
            && self
                .source_labels
                .iter()
                .all(|(k, v)| proxy.labels.get(k) == Some(v))
            && (self.source_namespace.is_empty() || self.source_namespace == proxy.namespace)
    }
}

fn cidrs(subnets: &[String]) -> Vec<CidrRange> {
    subnets
        .iter()
        .filter_map(|s| parse_cidr(s))
        .map(|(ip, len)| CidrRange {
            address_prefix: ip.to_string(),
            prefix_len: Some(u32v(len)),
        })
        .collect()
}

/// The chains, the match-all one (if any) last.
pub(super) fn chains(ctx: &IstioContext, proxy: &Proxy, p: &Port<'_>) -> Vec<FilterChain> {
    let vss = ctx.virtual_services_for(&proxy.namespace, p.host);
    let mut out = if p.tls {
        tls_chains(ctx, proxy, p, &vss)
    } else {
        tcp_chains(ctx, proxy, p, &vss)
    };
    // A TLS port routed by SNI has no default chain (Istio's
    // `hasTLSMatch`); otherwise the service's own cluster takes what no
    // route does.
    let has_default = out.last().is_some_and(|c| c.filter_chain_match.is_none());
    let routed_by_sni = p.tls && !out.is_empty();
    if !has_default && !routed_by_sni {
        out.push(FilterChain {
            filter_chain_match: p.by_sni.then(|| FilterChainMatch {
                server_names: vec![p.host.to_string()],
                ..Default::default()
            }),
            filters: vec![tcp_proxy_hashed(
                p.cluster,
                tcp_hash_policy(ctx, proxy, p.cluster),
            )],
            ..Default::default()
        });
    }
    out
}

fn tls_chains(
    ctx: &IstioContext,
    proxy: &Proxy,
    p: &Port<'_>,
    vss: &[&Named<VirtualService>],
) -> Vec<FilterChain> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for vs in vss {
        for r in vs.spec.tls.iter().filter(|r| !r.route.is_empty()) {
            for m in &r.r#match {
                let s = Static {
                    port: m.port,
                    gateways: &m.gateways,
                    source_labels: &m.source_labels,
                    source_namespace: &m.source_namespace,
                };
                if !s.applies(proxy, p.port) {
                    continue;
                }
                let runtime = format!(
                    "{}|{}",
                    m.sni_hosts.join(","),
                    m.destination_subnets.join(",")
                );
                if !seen.insert(runtime) {
                    continue;
                }
                // A full wildcard SNI matches every name (no server_names).
                let server_names = if m.sni_hosts.iter().any(|h| h == "*") {
                    Vec::new()
                } else {
                    m.sni_hosts.clone()
                };
                let chain_match = FilterChainMatch {
                    server_names,
                    prefix_ranges: cidrs(&m.destination_subnets),
                    ..Default::default()
                };
                out.push(FilterChain {
                    filter_chain_match: (chain_match != FilterChainMatch::default())
                        .then_some(chain_match),
                    filters: route_filters(ctx, proxy, vs, p.port, &r.route),
                    ..Default::default()
                });
            }
        }
    }
    out
}

fn tcp_chains(
    ctx: &IstioContext,
    proxy: &Proxy,
    p: &Port<'_>,
    vss: &[&Named<VirtualService>],
) -> Vec<FilterChain> {
    let mut out = Vec::new();
    for vs in vss {
        for r in vs.spec.tcp.iter().filter(|r| !r.route.is_empty()) {
            let filters = || route_filters(ctx, proxy, vs, p.port, &r.route);
            if r.r#match.is_empty() {
                out.push(FilterChain {
                    filters: filters(),
                    ..Default::default()
                });
                return out;
            }
            let mut subnets: Vec<String> = Vec::new();
            for m in &r.r#match {
                let s = Static {
                    port: m.port,
                    gateways: &m.gateways,
                    source_labels: &m.source_labels,
                    source_namespace: &m.source_namespace,
                };
                if !s.applies(proxy, p.port) {
                    continue;
                }
                if m.destination_subnets.is_empty() {
                    out.push(FilterChain {
                        filters: filters(),
                        ..Default::default()
                    });
                    return out;
                }
                subnets.extend(m.destination_subnets.iter().cloned());
            }
            if !subnets.is_empty() {
                out.push(FilterChain {
                    filter_chain_match: Some(FilterChainMatch {
                        prefix_ranges: cidrs(&subnets),
                        ..Default::default()
                    }),
                    filters: filters(),
                    ..Default::default()
                });
            }
        }
    }
    out
}

/// Whether a `mesh` VirtualService visible in `namespace` matches `tcp` or
/// `tls` routes on `sourceLabels`: then outbound listeners depend on each
/// proxy's labels.
pub(super) fn labels_matter(ctx: &IstioContext, namespace: &str) -> bool {
    ctx.virtual_services.iter().any(|vs| {
        crate::model::service::is_exported_to(&vs.spec.export_to, &vs.namespace, namespace)
            && (vs
                .spec
                .tcp
                .iter()
                .flat_map(|r| &r.r#match)
                .any(|m| !m.source_labels.is_empty())
                || vs
                    .spec
                    .tls
                    .iter()
                    .flat_map(|r| &r.r#match)
                    .any(|m| !m.source_labels.is_empty()))
    })
}

#[cfg(test)]
mod tests;
