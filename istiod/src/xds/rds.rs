//! RDS for sidecars: one route configuration per outbound HTTP port, named by
//! the port, with a `host:port` virtual host per service (Istio's domains:
//! FQDN, short names in the service's namespace, VIPs, each with and without
//! the port) and the `allow_any` catch-all. Routes come from VirtualServices
//! (matches, weighted destinations, retries, timeouts, rewrites, faults), else
//! one default route to `outbound|<port>||<host>`.

use std::collections::BTreeSet;
use std::time::Duration;

use proto::pb::envoy::config::route::v3::{
    HeaderMatcher, RetryPolicy, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
    WeightedCluster, header_matcher, route, route_action, route_match, weighted_cluster,
};
use proto::pb::envoy::extensions::filters::common::fault::v3::{FaultDelay, fault_delay};
use proto::pb::envoy::extensions::filters::http::fault::v3::{FaultAbort, HttpFault, fault_abort};
use proto::pb::envoy::r#type::matcher::v3::{RegexMatcher, StringMatcher, string_matcher};
use proto::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent};
use proto::pb::google::protobuf::BoolValue;

use super::cds::outbound_name;
use super::context::{IstioContext, resolve_host};
use super::util::{any, duration, u32v};
use super::{Proxy, Resource};
use crate::model::istio::{HttpMatchRequest, HttpRoute, StringMatch};
use crate::model::service::Service;

/// Istio's default retry policy (2 attempts).
fn default_retries() -> RetryPolicy {
    RetryPolicy {
        retry_on: "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
            .into(),
        num_retries: Some(u32v(2)),
        retry_host_predicate: vec![],
        host_selection_retry_max_attempts: 5,
        retriable_status_codes: vec![503],
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
        timeout: Some(duration(r.timeout.unwrap_or(Duration::ZERO))),
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
        ..Default::default()
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

/// Istio's virtual host domains for a service port.
fn domains(svc: &Service, port: u16, client_ns: &str, domain: &str) -> Vec<String> {
    let mut names = vec![svc.hostname.clone()];
    let suffix = format!(".svc.{domain}");
    if let Some(short) = svc.hostname.strip_suffix(&suffix) {
        // name.ns.svc, name.ns, and the bare name inside the namespace.
        names.push(format!("{short}.svc"));
        names.push(short.to_string());
        if svc.namespace == client_ns
            && let Some(name) = short.strip_suffix(&format!(".{}", svc.namespace))
        {
            names.push(name.to_string());
        }
    }
    names.extend(svc.addresses.iter().cloned());
    let mut out = Vec::new();
    for n in names {
        out.push(n.clone());
        out.push(format!("{n}:{port}"));
    }
    out
}

/// Route configurations for `names` (every outbound HTTP port when empty).
pub fn build(ctx: &IstioContext, proxy: &Proxy, names: &BTreeSet<String>) -> Vec<Resource> {
    let services = ctx.services_for(proxy);
    let ports: BTreeSet<u16> = if names.is_empty() {
        services
            .iter()
            .flat_map(|s| {
                s.ports
                    .iter()
                    .filter(|p| p.protocol.is_http())
                    .map(|p| p.port)
            })
            .collect()
    } else {
        names.iter().filter_map(|n| n.parse().ok()).collect()
    };
    let mut out = Vec::new();
    for port in ports {
        let mut vhosts = Vec::new();
        for svc in services
            .iter()
            .filter(|s| s.port(port).is_some_and(|p| p.protocol.is_http()))
        {
            let mut routes = Vec::new();
            for vs in ctx.virtual_services_for(&proxy.namespace, &svc.hostname) {
                for r in &vs.spec.http {
                    let applies =
                        |m: &&HttpMatchRequest| m.port.is_none_or(|p| p == u32::from(port));
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
                routes.push(Route {
                    name: "default".into(),
                    r#match: Some(route_match(None)),
                    action: Some(route::Action::Route(RouteAction {
                        cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
                            outbound_name(port, "", &svc.hostname),
                        )),
                        timeout: Some(duration(Duration::ZERO)),
                        retry_policy: Some(default_retries()),
                        ..Default::default()
                    })),
                    ..Default::default()
                });
            }
            vhosts.push(VirtualHost {
                name: format!("{}:{port}", svc.hostname),
                domains: domains(svc, port, &proxy.namespace, &ctx.domain),
                routes,
                ..Default::default()
            });
        }
        vhosts.push(VirtualHost {
            name: "allow_any".into(),
            domains: vec!["*".into()],
            routes: vec![Route {
                name: "allow_any".into(),
                r#match: Some(route_match(None)),
                action: Some(route::Action::Route(RouteAction {
                    cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
                        "PassthroughCluster".into(),
                    )),
                    timeout: Some(duration(Duration::ZERO)),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        });
        let rc = RouteConfiguration {
            name: port.to_string(),
            virtual_hosts: vhosts,
            validate_clusters: Some(BoolValue { value: false }),
            ..Default::default()
        };
        out.push(Resource {
            name: rc.name.clone(),
            resource: any(&rc),
        });
    }
    out
}
