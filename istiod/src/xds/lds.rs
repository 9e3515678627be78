//! LDS for sidecars, in Istio's shapes and names. iptables sends a Pod's
//! outbound traffic to `virtualOutbound` (15001), which hands each
//! connection to the per-port listener of its original destination
//! (`0.0.0.0_<port>` for HTTP, `<vip>_<port>` for TCP and detected
//! protocols) or to its catch-all chain; inbound traffic goes to
//! `virtualInbound` (15006), one set of chains per workload port following
//! PeerAuthentication, plus passthrough chains for ports no Service names.
//! Sidecar `captureMode: NONE` listeners bind their own ports.
//!
//! Only upstream Envoy extensions are used: Istio-proxy's filters
//! (`istio.metadata_exchange`, `istio.stats`, `istio_authn`, `istio.alpn`)
//! are left out.

mod gateway;
mod gateway_tcp;
mod gateway_tls;
mod inbound;
mod outbound;

pub use outbound::uses_auto_addresses;

use common::InterceptionMode;
use proto::pb::envoy::config::listener::v3::{
    Filter, Listener, ListenerFilter, ListenerFilterChainMatchPredicate, filter, listener_filter,
    listener_filter_chain_match_predicate,
};
use proto::pb::envoy::extensions::filters::http::cors::v3::Cors;
use proto::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use proto::pb::envoy::extensions::filters::http::router::v3::Router;
use proto::pb::envoy::extensions::filters::listener::http_inspector::v3::HttpInspector;
use proto::pb::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use proto::pb::envoy::extensions::filters::listener::original_src::v3::OriginalSrc;
use proto::pb::envoy::extensions::filters::listener::proxy_protocol::v3::ProxyProtocol;
use proto::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager, http_filter,
};
use proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use proto::pb::envoy::r#type::v3::Int32Range;

use std::sync::Arc;

use super::context::IstioContext;
use super::istio_stats;
use super::util::{ads_source, any, u32v};
use super::{Proxy, Resource};
use common::istio_stats::Reporter;

/// The route configuration names a proxy's listeners use.
pub fn route_names(ctx: &IstioContext, proxy: &Proxy) -> std::collections::BTreeSet<String> {
    if proxy.proxy_type == common::ProxyType::Router {
        gateway::route_names(ctx, proxy)
    } else {
        outbound::route_names(ctx, proxy)
    }
}

/// HTTP ALPN values the HTTP inspector reports for plain text (Istio's
/// `plaintextHTTPALPNs` without HTTP/1.0): chains matching them take HTTP.
pub const PLAINTEXT_HTTP_ALPNS: &[&str] = &["http/1.1", "h2c"];

/// The listeners of one proxy: the outbound ones, built once per push
/// context for the proxies of a Sidecar scope with the same IP families
/// and interception mode, then its own inbound ones.
pub fn build(ctx: &IstioContext, proxy: &Proxy) -> Vec<Arc<Resource>> {
    let encode = |l: Listener| Arc::new(Resource::encode(l.name.clone(), &l));
    // Access logs and tracing (Telemetry, mesh config) go into the built
    // listeners' connection managers and TCP proxies, with Istio's standard
    // metrics (on both sides unless a Telemetry turns them off).
    let telemetry = super::telemetry::for_proxy(ctx, proxy);
    let reporting = istio_stats::Reporting::from(super::telemetry::metrics_reporting(ctx, proxy));
    let with_stats = |mut l: Listener, reporter: Reporter| {
        istio_stats::apply(&mut l, reporter, reporting.enabled(reporter));
        l
    };
    if proxy.proxy_type == common::ProxyType::Router {
        let mut listeners = gateway::listeners(ctx, proxy);
        super::telemetry::apply(&telemetry.client, &mut listeners);
        // Gateways report as the client side, as Istio's do.
        return listeners
            .into_iter()
            .map(|l| encode(with_stats(l, Reporter::Source)))
            .collect();
    }
    let scope = ctx.scope(proxy);
    let key = format!(
        "{:?}/{}/{}/{}/{}",
        super::util::IpMode::of(&proxy.ips),
        proxy.interception_mode,
        telemetry.client.key,
        reporting.client,
        outbound::listener_key(&scope, proxy),
    );
    let outbound = scope.outbound_listeners(&key, || {
        let mut out: Vec<Listener> = outbound::listeners(ctx, proxy);
        out.extend(outbound::virtual_outbound(ctx, proxy));
        super::telemetry::apply(&telemetry.client, &mut out);
        out.into_iter()
            .map(|l| encode(with_stats(l, Reporter::Source)))
            .collect()
    });
    let mut out = outbound.to_vec();
    let mut inbound = inbound::listeners(ctx, proxy);
    super::telemetry::apply(&telemetry.server, &mut inbound);
    out.extend(
        inbound
            .into_iter()
            .map(|l| encode(with_stats(l, Reporter::Destination))),
    );
    out
}

/// Whether iptables captures in TPROXY mode (transparent listeners).
fn tproxy(proxy: &Proxy) -> bool {
    proxy.interception_mode == InterceptionMode::Tproxy
}

/// Whether the proxy's traffic is not captured at all.
fn no_interception(proxy: &Proxy) -> bool {
    proxy.interception_mode == InterceptionMode::None
}

fn network_filter<M: prost::Message + prost::Name>(name: &str, m: &M) -> Filter {
    Filter {
        name: name.into(),
        config_type: Some(filter::ConfigType::TypedConfig(any(m))),
    }
}

fn http_filter<M: prost::Message + prost::Name>(name: &str, m: &M) -> HttpFilter {
    HttpFilter {
        name: name.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(m))),
        ..Default::default()
    }
}

/// A TCP proxy to `cluster`; Istio's stat prefix is the cluster's name.
fn tcp_proxy_to(cluster: &str) -> Filter {
    tcp_proxy_hashed(cluster, Vec::new())
}

fn tcp_proxy_hashed(
    cluster: &str,
    hash_policy: Vec<proto::pb::envoy::r#type::v3::HashPolicy>,
) -> Filter {
    network_filter(
        "envoy.filters.network.tcp_proxy",
        &TcpProxy {
            stat_prefix: cluster.into(),
            cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(cluster.into())),
            hash_policy,
            ..Default::default()
        },
    )
}

/// The source-IP hash of a TCP proxy to the outbound `cluster`, when its
/// service's DestinationRule (as `client` sees it) asks for one.
fn tcp_hash_policy(
    ctx: &IstioContext,
    client: &Proxy,
    cluster: &str,
) -> Vec<proto::pb::envoy::r#type::v3::HashPolicy> {
    let Some((_, subset, host)) = super::eds::parse_cluster(cluster) else {
        return Vec::new();
    };
    ctx.registry
        .by_hostname(host)
        .next()
        .and_then(|svc| ctx.destination_rule(client, svc))
        .map(|dr| super::rds::hash::tcp_hash_policy(&dr.spec, subset))
        .unwrap_or_default()
}

/// The outbound HTTP connection manager: routes by RDS name.
fn outbound_hcm(stat_prefix: &str, route_name: &str) -> Filter {
    network_filter(
        "envoy.filters.network.http_connection_manager",
        &HttpConnectionManager {
            stat_prefix: stat_prefix.into(),
            route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
                config_source: Some(ads_source()),
                route_config_name: route_name.into(),
            })),
            // The fault and CORS filters serve VirtualService `fault` and
            // `corsPolicy` (per-route configs), in Istio's order.
            http_filters: vec![
                http_filter("envoy.filters.http.fault", &HttpFault::default()),
                http_filter(super::rds::CORS_FILTER, &Cors::default()),
                http_filter("envoy.filters.http.router", &Router::default()),
            ],
            ..Default::default()
        },
    )
}

fn listener_filter<M: prost::Message + prost::Name>(name: &str, m: &M) -> ListenerFilter {
    ListenerFilter {
        name: name.into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(any(m))),
        ..Default::default()
    }
}

/// Restores the original destination of a redirected connection.
fn original_dst() -> ListenerFilter {
    listener_filter("envoy.filters.listener.original_dst", &OriginalDst {})
}

/// Keeps the client's source address (TPROXY), marking packets as Istio does.
fn original_src() -> ListenerFilter {
    listener_filter(
        "envoy.filters.listener.original_src",
        &OriginalSrc {
            mark: 1337,
            ..Default::default()
        },
    )
}

/// Istio's TLS inspector: reads at most 512 bytes of the client hello.
fn tls_inspector() -> ListenerFilter {
    listener_filter(
        "envoy.filters.listener.tls_inspector",
        &TlsInspector {
            initial_read_buffer_size: Some(u32v(512)),
            ..Default::default()
        },
    )
}

/// The PROXY protocol reader a gateway with `gatewayTopology.proxyProtocol`
/// puts first (Istio's `xdsfilters.ProxyProtocol`).
fn proxy_protocol_listener_filter() -> ListenerFilter {
    listener_filter(
        "envoy.filters.listener.proxy_protocol",
        &ProxyProtocol::default(),
    )
}

fn http_inspector() -> ListenerFilter {
    listener_filter(
        "envoy.filters.listener.http_inspector",
        &HttpInspector::default(),
    )
}

/// A listener filter predicate matching connections to any of `ports`
/// (Istio's `listenerPredicateExcludePorts`: as `filter_disabled`, the
/// filter skips these ports).
fn any_port(ports: &[u32]) -> ListenerFilterChainMatchPredicate {
    use listener_filter_chain_match_predicate::{MatchSet, Rule};
    let range = |p: u32| ListenerFilterChainMatchPredicate {
        rule: Some(Rule::DestinationPortRange(Int32Range {
            start: p as i32,
            end: p as i32 + 1,
        })),
    };
    match ports {
        [one] => range(*one),
        _ => ListenerFilterChainMatchPredicate {
            rule: Some(Rule::OrMatch(MatchSet {
                rules: ports.iter().map(|p| range(*p)).collect(),
            })),
        },
    }
}

/// The negation of [`any_port`] (Istio's `listenerPredicateIncludePorts`).
fn not_any_port(ports: &[u32]) -> ListenerFilterChainMatchPredicate {
    use listener_filter_chain_match_predicate::Rule;
    ListenerFilterChainMatchPredicate {
        rule: Some(Rule::NotMatch(Box::new(any_port(ports)))),
    }
}
