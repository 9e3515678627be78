//! RDS for sidecars: one route configuration per outbound HTTP port, named by
//! the port (`"8000"`), with a `<host>:<port>` virtual host per service and
//! Istio's catch-all last (`allow_any` to `PassthroughCluster` under
//! `ALLOW_ANY`, `block_all` answering 502 under `REGISTRY_ONLY`); and one per
//! detected-protocol listener on a service address (`"<host>:<port>"`), with
//! that service's virtual host only. Domains follow Istio's sidecar rules:
//! host, absolute host, short names relative to the client's namespace and
//! VIPs, without ports, matched with `ignore_port_in_host_matching`. Routes
//! come from VirtualServices (matches, weighted destinations, retries,
//! timeouts, rewrites, faults), else one default route to
//! `outbound|<port>||<host>`.

use std::collections::BTreeSet;
use std::time::Duration;

use proto::pb::envoy::config::route::v3::{
    Decorator, DirectResponseAction, HeaderMatcher, RetryPolicy, Route, RouteAction,
    RouteConfiguration, RouteMatch, VirtualHost, WeightedCluster, header_matcher, retry_policy,
    route, route_action, route_match, weighted_cluster,
};
use proto::pb::envoy::extensions::filters::common::fault::v3::{FaultDelay, fault_delay};
use proto::pb::envoy::extensions::filters::http::fault::v3::{FaultAbort, HttpFault, fault_abort};
use proto::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use proto::pb::envoy::r#type::matcher::v3::{RegexMatcher, StringMatcher, string_matcher};
use proto::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent};
use proto::pb::google::protobuf::BoolValue;

use super::cds::outbound_name;
use super::context::{IstioContext, OutboundPolicy, resolve_host};
use super::util::{MAX_DIRECT_RESPONSE_BODY_BYTES, any, duration, u32v};
use super::{Proxy, Resource};
use crate::model::istio::{HttpMatchRequest, HttpRoute, StringMatch};
use crate::model::service::{Service, ServiceResolution, ServiceSource};

/// Istio's default retry policy: 2 retries, each on another host.
fn default_retries() -> RetryPolicy {
    RetryPolicy {
        retry_on: "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
            .into(),
        num_retries: Some(u32v(2)),
        retry_host_predicate: vec![retry_policy::RetryHostPredicate {
            name: "envoy.retry_host_predicates.previous_hosts".into(),
            config_type: Some(retry_policy::retry_host_predicate::ConfigType::TypedConfig(
                any(&PreviousHostsPredicate::default()),
            )),
        }],
        host_selection_retry_max_attempts: 5,
        ..Default::default()
    }
}

/// A route action with Istio's timeouts: the route's (none by default),
/// and gRPC's `grpc-timeout` header honoured up to it.
#[allow(deprecated)] // Istio still sets `max_grpc_timeout`; Envoy 1.40 accepts it.
fn timed(timeout: Duration) -> RouteAction {
    RouteAction {
        timeout: Some(duration(timeout)),
        max_grpc_timeout: Some(duration(timeout)),
        ..Default::default()
    }
}

fn string_matcher(m: &StringMatch, ignore_case: bool) -> Option<StringMatcher> {
    let pattern = if let Some(e) = &m.exact {
        string_matcher::MatchPattern::Exact(e.clone())
    } else if let Some(p) = &m.prefix {
        string_matcher::MatchPattern::Prefix(p.clone())
    } else if let Some(r) = &m.regex {
        string_matcher::MatchPattern::SafeRegex(RegexMatcher {
            regex: r.clone(),
            ..Default::default()
        })
    } else {
        return None;
    };
    Some(StringMatcher {
        match_pattern: Some(pattern),
        ignore_case,
    })
}

fn header(name: &str, m: &StringMatch, invert: bool) -> Option<HeaderMatcher> {
    Some(HeaderMatcher {
        name: name.to_string(),
        invert_match: invert,
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(
            string_matcher(m, false)?,
        )),
        ..Default::default()
    })
}

fn route_match(m: Option<&HttpMatchRequest>) -> RouteMatch {
    let mut rm = RouteMatch {
        path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
        ..Default::default()
    };
    let Some(m) = m else { return rm };
    if let Some(uri) = &m.uri {
        rm.path_specifier = Some(if let Some(e) = &uri.exact {
            route_match::PathSpecifier::Path(e.clone())
        } else if let Some(p) = &uri.prefix {
            route_match::PathSpecifier::Prefix(p.clone())
        } else if let Some(r) = &uri.regex {
            route_match::PathSpecifier::SafeRegex(RegexMatcher {
                regex: r.clone(),
                ..Default::default()
            })
        } else {
            route_match::PathSpecifier::Prefix("/".into())
        });
        if m.ignore_uri_case {
            rm.case_sensitive = Some(BoolValue { value: false });
        }
    }
    for (name, sm) in &m.headers {
        rm.headers.extend(header(name, sm, false));
    }
    for (name, sm) in &m.without_headers {
        rm.headers.extend(header(name, sm, true));
    }
    if let Some(method) = &m.method {
        rm.headers.extend(header(":method", method, false));
    }
    if let Some(authority) = &m.authority {
        rm.headers.extend(header(":authority", authority, false));
    }
    rm
}

fn percent(v: f64) -> FractionalPercent {
    // Istio uses millionths for its float percentages.
    FractionalPercent {
        numerator: (v.clamp(0.0, 100.0) * 10_000.0).round() as u32,
        denominator: fractional_percent::DenominatorType::Million.into(),
    }
}

/// The Envoy route for one VirtualService HTTP route and match.
fn vs_route(
    ctx: &IstioContext,
    vs_ns: &str,
    svc: &Service,
    port: u16,
    r: &HttpRoute,
    m: Option<&HttpMatchRequest>,
) -> Route {
    let cluster_of = |dest: &crate::model::istio::Destination| {
        let host = resolve_host(&dest.host, vs_ns, &ctx.domain);
        let dport = dest
            .port
            .as_ref()
            .map(|p| p.number as u16)
            .unwrap_or_else(|| {
                ctx.registry
                    .by_hostname(&host)
                    .next()
                    .and_then(|s| {
                        if s.ports.len() == 1 {
                            Some(s.ports[0].port)
                        } else {
                            None
                        }
                    })
                    .unwrap_or(port)
            });
        if ctx.registry.by_hostname(&host).next().is_none() {
            "BlackHoleCluster".to_string()
        } else {
            outbound_name(dport, &dest.subset, &host)
        }
    };
    let mut action = RouteAction {
        retry_policy: Some(match &r.retries {
            Some(retry) if retry.attempts == 0 => RetryPolicy {
                num_retries: Some(u32v(0)),
                ..default_retries()
            },
            Some(retry) => RetryPolicy {
                retry_on: if retry.retry_on.is_empty() {
                    default_retries().retry_on
                } else {
                    retry.retry_on.clone()
                },
                num_retries: Some(u32v(retry.attempts.max(0) as u32)),
                per_try_timeout: retry.per_try_timeout.map(duration),
                ..default_retries()
            },
            None => default_retries(),
        }),
        ..timed(r.timeout.unwrap_or(Duration::ZERO))
    };
    if r.route.len() == 1 {
        action.cluster_specifier = Some(route_action::ClusterSpecifier::Cluster(cluster_of(
            &r.route[0].destination,
        )));
    } else if !r.route.is_empty() {
        action.cluster_specifier = Some(route_action::ClusterSpecifier::WeightedClusters(
            WeightedCluster {
                clusters: r
                    .route
                    .iter()
                    .filter(|d| d.weight.unwrap_or(0) > 0)
                    .map(|d| weighted_cluster::ClusterWeight {
                        name: cluster_of(&d.destination),
                        weight: Some(u32v(d.weight.unwrap_or(0) as u32)),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
        ));
    } else {
        action.cluster_specifier = Some(route_action::ClusterSpecifier::Cluster(outbound_name(
            port,
            "",
            &svc.hostname,
        )));
    }
    if let Some(rw) = &r.rewrite {
        if !rw.uri.is_empty() {
            action.prefix_rewrite = rw.uri.clone();
        }
        if !rw.authority.is_empty() {
            action.host_rewrite_specifier = Some(
                route_action::HostRewriteSpecifier::HostRewriteLiteral(rw.authority.clone()),
            );
        }
    }
    let mut out = Route {
        name: r.name.clone(),
        r#match: Some(route_match(m)),
        action: Some(route::Action::Route(action)),
        ..Default::default()
    };
    if let Some(fault) = &r.fault {
        let delay = fault.delay.as_ref().and_then(|d| {
            Some(FaultDelay {
                percentage: Some(percent(
                    d.percentage.as_ref().map(|p| p.value).unwrap_or(100.0),
                )),
                fault_delay_secifier: Some(fault_delay::FaultDelaySecifier::FixedDelay(duration(
                    d.fixed_delay?,
                ))),
            })
        });
        let abort = fault.abort.as_ref().and_then(|a| {
            Some(FaultAbort {
                percentage: Some(percent(
                    a.percentage.as_ref().map(|p| p.value).unwrap_or(100.0),
                )),
                error_type: Some(fault_abort::ErrorType::HttpStatus(a.http_status? as u32)),
                ..Default::default()
            })
        });
        out.typed_per_filter_config.insert(
            "envoy.filters.http.fault".into(),
            any(&HttpFault {
                delay,
                abort,
                ..Default::default()
            }),
        );
    }
    out
}

/// Istio's virtual host domains for a service, seen from a sidecar in
/// `client_ns` (`generateVirtualHostDomains` with sidecars' port-less hosts):
/// the host, the absolute host, for a Kubernetes service `name`,
/// `name.ns.svc` and `name.ns` in the client's namespace (`name.ns` and
/// `name.ns.svc` from elsewhere), `*.` forms for headless services, and the
/// VIPs.
fn domains(svc: &Service, client_ns: &str, domain: &str) -> Vec<String> {
    let mut out = vec![svc.hostname.clone()];
    if svc.hostname.parse::<std::net::IpAddr>().is_err() {
        out.push(format!("{}.", svc.hostname));
    }
    if let Some(name_ns) = svc.hostname.strip_suffix(&format!(".svc.{domain}"))
        && let Some((name, ns)) = name_ns.split_once('.')
    {
        if ns == client_ns {
            out.extend([
                name.to_string(),
                format!("{name_ns}.svc"),
                name_ns.to_string(),
            ]);
        } else {
            out.extend([name_ns.to_string(), format!("{name_ns}.svc")]);
        }
    }
    if svc.resolution == ServiceResolution::Passthrough && svc.source == ServiceSource::Kubernetes {
        let wildcards: Vec<String> = out.iter().map(|d| format!("*.{d}")).collect();
        out.extend(wildcards);
    }
    for vip in svc.addresses.iter().filter(|a| a.as_str() != "0.0.0.0") {
        out.push(match vip.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(_)) => format!("[{vip}]"),
            _ => vip.clone(),
        });
    }
    out
}

/// Istio's last virtual host of a port's routes: `allow_any` to the
/// passthrough (or the Sidecar's egress proxy), or `block_all`, which
/// answers 502 with no body.
fn catch_all(policy: &OutboundPolicy) -> VirtualHost {
    let (name, action) = if policy.allow_any {
        let mut to = timed(Duration::ZERO);
        to.cluster_specifier = Some(route_action::ClusterSpecifier::Cluster(
            policy.cluster.clone(),
        ));
        ("allow_any", route::Action::Route(to))
    } else {
        (
            "block_all",
            route::Action::DirectResponse(DirectResponseAction {
                status: 502,
                ..Default::default()
            }),
        )
    };
    VirtualHost {
        name: name.into(),
        domains: vec!["*".into()],
        routes: vec![Route {
            name: name.into(),
            r#match: Some(route_match(None)),
            action: Some(action),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The virtual host of one service port: its VirtualService routes, else
/// Istio's default route.
fn virtual_host(ctx: &IstioContext, proxy: &Proxy, svc: &Service, port: u16) -> VirtualHost {
    let mut routes = Vec::new();
    for vs in ctx.virtual_services_for(&proxy.namespace, &svc.hostname) {
        for r in &vs.spec.http {
            let applies = |m: &&HttpMatchRequest| m.port.is_none_or(|p| p == u32::from(port));
            if r.r#match.is_empty() {
                routes.push(vs_route(ctx, &vs.namespace, svc, port, r, None));
            } else {
                for m in r.r#match.iter().filter(applies) {
                    routes.push(vs_route(ctx, &vs.namespace, svc, port, r, Some(m)));
                }
            }
        }
    }
    if routes.is_empty() {
        let mut action = timed(Duration::ZERO);
        action.cluster_specifier = Some(route_action::ClusterSpecifier::Cluster(outbound_name(
            port,
            "",
            &svc.hostname,
        )));
        action.retry_policy = Some(default_retries());
        routes.push(Route {
            name: "default".into(),
            r#match: Some(route_match(None)),
            action: Some(route::Action::Route(action)),
            decorator: Some(Decorator {
                operation: format!("{}:{port}/*", svc.hostname),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    VirtualHost {
        name: format!("{}:{port}", svc.hostname),
        domains: domains(svc, &proxy.namespace, &ctx.domain),
        routes,
        ..Default::default()
    }
}

/// One route configuration: `"<port>"`, or `"<host>:<port>"` for a
/// detected-protocol listener. `None` for a name no listener of this proxy
/// could use.
fn route_config(ctx: &IstioContext, proxy: &Proxy, name: &str) -> Option<RouteConfiguration> {
    let (host, port) = match name.rsplit_once(':') {
        Some((host, port)) => (Some(host), port.parse::<u16>().ok()?),
        None => (None, name.parse::<u16>().ok()?),
    };
    // Istio's `GetEgressListenerForRDS`: the Sidecar's listener for this
    // port, else its catch-all (always the catch-all for detected ports).
    let scopes = ctx.egress_scopes(proxy);
    let port_of = |s: &&super::context::EgressScope<'_>| {
        s.listener
            .and_then(|l| l.port.as_ref())
            .map(|p| p.number)
            .unwrap_or(0)
    };
    let catch_all_scope = scopes.iter().find(|s| port_of(s) == 0);
    let scope = match host {
        Some(_) => catch_all_scope,
        None => scopes
            .iter()
            .find(|s| port_of(s) == u32::from(port))
            .or(catch_all_scope),
    }?;
    let mut vhosts: Vec<VirtualHost> = ctx
        .scope_services(proxy, *scope)
        .into_iter()
        .filter(|s| host.is_none_or(|h| s.hostname == h))
        .filter(|s| {
            s.port(port)
                .is_some_and(|p| p.protocol.is_http() || p.protocol.is_unsupported())
        })
        .map(|s| virtual_host(ctx, proxy, s, port))
        .collect();
    vhosts.sort_by(|a, b| a.name.cmp(&b.name));
    vhosts.dedup_by(|a, b| a.name == b.name);
    if host.is_none() {
        vhosts.push(catch_all(&ctx.outbound_policy(proxy)));
    }
    Some(RouteConfiguration {
        name: name.to_string(),
        virtual_hosts: vhosts,
        validate_clusters: Some(BoolValue { value: false }),
        max_direct_response_body_size_bytes: Some(u32v(MAX_DIRECT_RESPONSE_BODY_BYTES)),
        ignore_port_in_host_matching: true,
        ..Default::default()
    })
}

/// Route configurations for `names` (every name the proxy's listeners use
/// when empty).
pub fn build(ctx: &IstioContext, proxy: &Proxy, names: &BTreeSet<String>) -> Vec<Resource> {
    let all;
    let names = if names.is_empty() {
        all = super::lds::route_names(ctx, proxy);
        &all
    } else {
        names
    };
    names
        .iter()
        .filter_map(|n| route_config(ctx, proxy, n))
        .map(|rc| Resource {
            name: rc.name.clone(),
            resource: any(&rc),
        })
        .collect()
}
