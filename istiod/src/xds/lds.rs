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
mod outbound_l4;

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

use super::istio_stats;
use super::util::{ads_source, any, u32v};
use crate::pushctx::context::IstioContext;
use crate::pushctx::{Proxy, Resource};
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
        outbound::listener_key(ctx, &scope, proxy),
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
    let Some((_, subset, host)) = crate::pushctx::names::parse_cluster(cluster) else {
        return Vec::new();
    };
    ctx.registry
        .by_hostname(host)
        .next()
        .and_then(|svc| ctx.destination_rule(client, svc))
        .map(|dr| super::rds::hash::tcp_hash_policy(&dr.spec, subset))
        .unwrap_or_default()
}

/// An HTTP connection manager with the mesh's path normalization set
/// (Istio's `buildHTTPConnectionManager`), for `..normalized(n)` in a
/// literal.
pub(super) fn normalized(n: crate::mesh::PathNormalization) -> HttpConnectionManager {
    use crate::mesh::PathNormalization as N;
    use http_connection_manager::PathWithEscapedSlashesAction as Escaped;
    HttpConnectionManager {
        normalize_path: Some(proto::pb::google::protobuf::BoolValue {
            value: n != N::None,
        }),
        merge_slashes: matches!(n, N::MergeSlashes | N::DecodeAndMergeSlashes),
        path_with_escaped_slashes_action: if n == N::DecodeAndMergeSlashes {
            Escaped::UnescapeAndForward
        } else {
            Escaped::KeepUnchanged
        }
        .into(),
        ..Default::default()
    }
}

/// The outbound HTTP connection manager: routes by RDS name.
fn outbound_hcm(
    stat_prefix: &str,
    route_name: &str,
    normalization: crate::mesh::PathNormalization,
) -> Filter {
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
                http_filter(super::rds::ops::CORS_FILTER, &Cors::default()),
                http_filter("envoy.filters.http.router", &Router::default()),
            ],
            ..normalized(normalization)
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

#[cfg(test)]
mod path_normalization_tests {
    #![allow(clippy::unwrap_used)]

    use prost::Message;
    use proto::pb::envoy::config::listener::v3::{Listener, filter};

    use super::*;
    use crate::mesh::Mesh;

    /// Every HTTP connection manager of `proxy`'s listeners.
    fn hcms(ctx: &IstioContext, proxy: &Proxy) -> Vec<HttpConnectionManager> {
        build(ctx, proxy)
            .iter()
            .map(|r| Listener::decode(r.resource.value.as_slice()).unwrap())
            .flat_map(|l| l.filter_chains.into_iter().chain(l.default_filter_chain))
            .flat_map(|c| c.filters)
            .filter(|f| f.name == "envoy.filters.network.http_connection_manager")
            .map(|f| match f.config_type {
                Some(filter::ConfigType::TypedConfig(a)) => {
                    HttpConnectionManager::decode(a.value.as_slice()).unwrap()
                }
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn every_connection_manager_normalizes_paths_as_the_mesh_says() {
        let sample = include_str!("../../samples/mesh/httpbin.yaml");
        let proxy = |app: &str, ip: &str| Proxy {
            proxy_type: common::ProxyType::Sidecar,
            ip: ip.into(),
            ips: vec![ip.into()],
            namespace: "demo".into(),
            labels: [("app".to_string(), app.to_string())].into(),
            ..Default::default()
        };
        for (mesh, normalize, merge, escaped) in [
            ("", true, false, "KeepUnchanged"),
            (
                "pathNormalization: {normalization: NONE}",
                false,
                false,
                "KeepUnchanged",
            ),
            (
                "pathNormalization: {normalization: DECODE_AND_MERGE_SLASHES}",
                true,
                true,
                "UnescapeAndForward",
            ),
        ] {
            let ctx = crate::pushctx::context::context_of_yaml(sample)
                .with_mesh(Mesh::parse(mesh).unwrap().config);
            // Outbound (sleep's) and inbound (httpbin's) managers alike.
            for (app, ip) in [("sleep", "198.18.0.2"), ("httpbin", "198.18.0.3")] {
                let all = hcms(&ctx, &proxy(app, ip));
                assert!(!all.is_empty(), "{app}: no connection manager");
                if app == "httpbin" {
                    assert!(
                        all.iter().any(|h| h.stat_prefix.starts_with("inbound")),
                        "no inbound manager"
                    );
                }
                for h in all {
                    assert_eq!(
                        h.normalize_path.map(|b| b.value),
                        Some(normalize),
                        "{mesh} {app} {}",
                        h.stat_prefix
                    );
                    assert_eq!(h.merge_slashes, merge, "{mesh} {app}");
                    assert_eq!(
                        format!("{:?}", h.path_with_escaped_slashes_action()),
                        escaped,
                        "{mesh} {app}"
                    );
                }
            }
        }
    }
}
