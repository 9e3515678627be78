//! One Envoy route for one VirtualService HTTP route and match, as Istio's
//! `translateRoute` builds it: the match, then the action (`redirect`,
//! `directResponse`, or the destinations with retries, timeout, rewrite and
//! mirrors), the route's and destinations' header operations, and the fault
//! and CORS policies as per-filter config.

use std::time::Duration;

use proto::pb::envoy::config::route::v3::{
    HeaderMatcher, QueryParameterMatcher, RetryPolicy, Route, RouteAction, RouteMatch,
    WeightedCluster, header_matcher, query_parameter_matcher, retry_policy, route, route_action,
    route_match, weighted_cluster,
};
use proto::pb::envoy::extensions::filters::common::fault::v3::{FaultDelay, fault_delay};
use proto::pb::envoy::extensions::filters::http::fault::v3::{FaultAbort, HttpFault, fault_abort};
use proto::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use proto::pb::envoy::extensions::retry::priority::previous_priorities::v3::PreviousPrioritiesConfig;
use proto::pb::envoy::r#type::matcher::v3::{RegexMatchAndSubstitute, RegexMatcher};
use proto::pb::google::protobuf::BoolValue;

use std::sync::Arc;

use proto::pb::envoy::config::route::v3::route_action::HashPolicy;

use super::hash;
use super::ops::{self, HeaderLists, percent, string_matcher};
use crate::model::istio::{
    Destination, HttpFaultInjection, HttpMatchRequest, HttpRoute, StringMatch,
};
use crate::model::route::grpc_code;
use crate::model::service::Service;
use crate::pushctx::context::{IstioContext, resolve_host};
use crate::pushctx::names::outbound_name;
use crate::xds::util::{any, duration, u32v};

/// Istio's default retry policy: 2 retries, each on another host, on
/// connection failures and on a 503 (its `retriable-status-codes` names
/// 503 only).
pub(super) fn default_retries() -> RetryPolicy {
    RetryPolicy {
        retry_on: "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
            .into(),
        retriable_status_codes: vec![503],
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
pub(super) fn timed(timeout: Duration) -> RouteAction {
    RouteAction {
        timeout: Some(duration(timeout)),
        max_grpc_timeout: Some(duration(timeout)),
        ..Default::default()
    }
}

/// A header condition; an empty match means "present" (inverted:
/// "absent"), as Istio documents for `headers` and `withoutHeaders`.
fn header(name: &str, m: &StringMatch, invert: bool) -> HeaderMatcher {
    let specifier = match string_matcher(m, false) {
        Some(sm) => header_matcher::HeaderMatchSpecifier::StringMatch(sm),
        None => header_matcher::HeaderMatchSpecifier::PresentMatch(true),
    };
    HeaderMatcher {
        name: name.to_string(),
        invert_match: invert,
        header_match_specifier: Some(specifier),
        ..Default::default()
    }
}

/// A query parameter condition; an empty match means "present".
fn query_param(name: &str, m: &StringMatch) -> QueryParameterMatcher {
    use query_parameter_matcher::QueryParameterMatchSpecifier as Spec;
    QueryParameterMatcher {
        name: name.to_string(),
        query_parameter_match_specifier: Some(match string_matcher(m, false) {
            Some(sm) => Spec::StringMatch(sm),
            None => Spec::PresentMatch(true),
        }),
    }
}

/// The route match of one `match` entry (`/` prefix for none).
pub(super) fn route_match(m: Option<&HttpMatchRequest>) -> RouteMatch {
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
        rm.headers.push(header(name, sm, false));
    }
    for (name, sm) in &m.without_headers {
        rm.headers.push(header(name, sm, true));
    }
    for (name, sm) in [
        (":scheme", &m.scheme),
        (":method", &m.method),
        (":authority", &m.authority),
    ] {
        if let Some(sm) = sm {
            rm.headers.push(header(name, sm, false));
        }
    }
    for (name, sm) in &m.query_params {
        rm.query_parameters.push(query_param(name, sm));
    }
    rm
}

/// Whether a match applies to this sidecar (Istio's `sourceMatchHTTP`):
/// its `gateways` must name `mesh` when given; else its `sourceLabels`
/// must be among the proxy's labels and its `sourceNamespace`, if any, the
/// proxy's namespace.
pub(super) fn source_matches(m: &HttpMatchRequest, proxy: &crate::pushctx::Proxy) -> bool {
    if !m.gateways.is_empty() {
        return m.gateways.iter().any(|g| g == "mesh");
    }
    m.source_labels
        .iter()
        .all(|(k, v)| proxy.labels.get(k) == Some(v))
        && (m.source_namespace.is_empty() || m.source_namespace == proxy.namespace)
}

/// Where a route's destination (or mirror) goes: Istio's
/// `outbound|<port>|<subset>|<host>`, the port from the destination, else
/// the service's only port, else the route's; `BlackHoleCluster` for a
/// host the registry does not know.
pub(crate) struct Clusters<'a> {
    pub ctx: &'a IstioContext,
    pub vs_ns: &'a str,
    /// The proxy (which DestinationRule applies).
    pub client: &'a crate::pushctx::Proxy,
    pub port: u16,
    /// A Gateway API route's VirtualService: an unknown host keeps its
    /// `outbound|<port>||<host>` name (no such cluster: a 500, see
    /// [`gateway_semantics`]) instead of `BlackHoleCluster`.
    pub gateway_semantics: bool,
}

impl Clusters<'_> {
    /// The destination's service and port.
    fn resolve(&self, dest: &Destination) -> (String, Option<(Arc<Service>, u16)>) {
        let ctx = self.ctx;
        let host = resolve_host(&dest.host, self.vs_ns, &ctx.domain);
        let found = ctx.registry.by_hostname(&host).next().cloned().map(|svc| {
            let dport = dest
                .port
                .as_ref()
                .map(|p| p.number as u16)
                .or_else(|| (svc.ports.len() == 1).then(|| svc.ports[0].port))
                .unwrap_or(self.port);
            (svc, dport)
        });
        (host, found)
    }

    pub fn of(&self, dest: &Destination) -> String {
        match self.resolve(dest) {
            (host, Some((_, port))) => outbound_name(port, &dest.subset, &host),
            (host, None) if self.gateway_semantics => {
                let port = dest.port.as_ref().map_or(self.port, |p| p.number as u16);
                outbound_name(port, &dest.subset, &host)
            }
            _ => "BlackHoleCluster".to_string(),
        }
    }

    /// The hash policy of a route to `dest`, when its DestinationRule (as
    /// the proxy sees it) hashes consistently for the cluster's port and
    /// subset.
    pub fn hash(&self, dest: &Destination) -> Option<HashPolicy> {
        let (_, Some((svc, port))) = self.resolve(dest) else {
            return None;
        };
        let dr = self.ctx.destination_rule(self.client, &svc)?;
        hash::for_destination(&dr.spec, port, &dest.subset).and_then(hash::hash_policy)
    }
}

/// `retryOn` as Istio's `parseRetryOn` splits it: HTTP status codes become
/// `retriable_status_codes` (with `retriable-status-codes` added to the
/// conditions), the rest stays Envoy's `retry_on`.
fn parse_retry_on(retry_on: &str) -> (String, Vec<u32>) {
    let mut on = Vec::new();
    let mut codes = Vec::new();
    for cond in retry_on.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        match cond.parse::<u32>() {
            Ok(code) => codes.push(code),
            Err(_) => on.push(cond),
        }
    }
    if !codes.is_empty() && !on.contains(&"retriable-status-codes") {
        on.push("retriable-status-codes");
    }
    (on.join(","), codes)
}

/// `retries` as Istio's `retry.ConvertPolicy`: attempts, conditions and
/// status codes, per-try timeout, `retryRemoteLocalities` (Envoy's
/// previous-priorities plugin), `retryIgnorePreviousHosts: false` (no
/// previous-hosts predicate) and `backoff`.
fn retry_policy(r: &HttpRoute) -> RetryPolicy {
    let Some(retry) = &r.retries else {
        return default_retries();
    };
    if retry.attempts <= 0 {
        return RetryPolicy {
            num_retries: Some(u32v(0)),
            ..default_retries()
        };
    }
    let mut out = RetryPolicy {
        num_retries: Some(u32v(retry.attempts as u32)),
        per_try_timeout: retry.per_try_timeout.map(duration),
        ..default_retries()
    };
    if !retry.retry_on.is_empty() {
        (out.retry_on, out.retriable_status_codes) = parse_retry_on(&retry.retry_on);
    }
    if retry.retry_remote_localities == Some(true) {
        out.retry_priority = Some(retry_policy::RetryPriority {
            name: "envoy.retry_priorities.previous_priorities".into(),
            config_type: Some(retry_policy::retry_priority::ConfigType::TypedConfig(any(
                &PreviousPrioritiesConfig {
                    update_frequency: retry.attempts + 1,
                },
            ))),
        });
    }
    if retry.retry_ignore_previous_hosts == Some(false) {
        out.retry_host_predicate.clear();
    }
    if let Some(b) = retry.backoff {
        out.retry_back_off = Some(retry_policy::RetryBackOff {
            base_interval: Some(duration(b)),
            ..Default::default()
        });
    }
    out
}

/// The route action to the destinations (Istio's `applyHTTPRouteDestination`):
/// weighted clusters (0-weight ones dropped) each with its destination's
/// header operations, collapsed to one cluster whose operations join the
/// route's when only one is left; retries, timeout, rewrite and mirrors.
fn destinations(
    clusters: &Clusters<'_>,
    host: &str,
    r: &HttpRoute,
    headers: &mut HeaderLists,
) -> RouteAction {
    let mut action = RouteAction {
        retry_policy: Some(retry_policy(r)),
        ..timed(r.timeout.unwrap_or(Duration::ZERO))
    };
    let mut weighted: Vec<(weighted_cluster::ClusterWeight, HeaderLists)> = Vec::new();
    for d in &r.route {
        let weight = match d.weight.unwrap_or(0) {
            0 if r.route.len() == 1 => 100,
            0 => continue,
            w => w as u32,
        };
        let ops = ops::header_lists(d.headers.as_ref());
        action.hash_policy.extend(clusters.hash(&d.destination));
        weighted.push((
            weighted_cluster::ClusterWeight {
                name: clusters.of(&d.destination),
                weight: Some(u32v(weight)),
                request_headers_to_add: ops.request_add.clone(),
                request_headers_to_remove: ops.request_remove.clone(),
                response_headers_to_add: ops.response_add.clone(),
                response_headers_to_remove: ops.response_remove.clone(),
                ..Default::default()
            },
            ops,
        ));
    }
    // Retries stay on the hashed host (Istio's `ConvertPolicy` with a
    // hash policy has no previous-hosts predicate).
    if !action.hash_policy.is_empty()
        && let Some(retry) = action.retry_policy.as_mut()
    {
        retry.retry_host_predicate.clear();
    }
    action.cluster_specifier = Some(match weighted.len() {
        0 => route_action::ClusterSpecifier::Cluster(outbound_name(clusters.port, "", host)),
        1 => {
            let (cw, ops) = weighted.remove(0);
            headers.extend(ops);
            route_action::ClusterSpecifier::Cluster(cw.name)
        }
        _ => route_action::ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: weighted.into_iter().map(|(cw, _)| cw).collect(),
            ..Default::default()
        }),
    });
    if let Some(rw) = &r.rewrite {
        if !rw.uri.is_empty() {
            action.prefix_rewrite = rw.uri.clone();
        }
        if !rw.authority.is_empty() {
            action.host_rewrite_specifier = Some(
                route_action::HostRewriteSpecifier::HostRewriteLiteral(rw.authority.clone()),
            );
        }
        if let Some(rr) = &rw.uri_regex_rewrite {
            action.regex_rewrite = Some(RegexMatchAndSubstitute {
                pattern: Some(RegexMatcher {
                    regex: rr.r#match.clone(),
                    ..Default::default()
                }),
                substitution: rr.rewrite.clone(),
            });
        }
    }
    let mirrors = r
        .mirror
        .iter()
        .map(|m| (m, r.mirror_percentage.as_ref()))
        .chain(
            r.mirrors
                .iter()
                .map(|m| (&m.destination, m.percentage.as_ref())),
        );
    for (dest, pct) in mirrors {
        let Some(fraction) = ops::mirror_fraction(pct) else {
            continue;
        };
        action
            .request_mirror_policies
            .push(route_action::RequestMirrorPolicy {
                cluster: clusters.of(dest),
                runtime_fraction: Some(fraction),
                trace_sampled: Some(BoolValue { value: false }),
                ..Default::default()
            });
    }
    action
}

/// `fault` as Istio's `TranslateFault`: a fixed delay and an HTTP or gRPC
/// abort, each for `percentage` (else the deprecated integer `percent`,
/// else every request).
fn fault(f: &HttpFaultInjection) -> HttpFault {
    let delay = f.delay.as_ref().and_then(|d| {
        let share = d
            .percentage
            .as_ref()
            .map(|p| p.value)
            .or(d.percent.map(f64::from))
            .unwrap_or(100.0);
        Some(FaultDelay {
            percentage: Some(percent(share)),
            fault_delay_secifier: Some(fault_delay::FaultDelaySecifier::FixedDelay(duration(
                d.fixed_delay?,
            ))),
        })
    });
    let abort = f.abort.as_ref().and_then(|a| {
        let error_type = match (a.http_status, &a.grpc_status) {
            (Some(s), _) => fault_abort::ErrorType::HttpStatus(s as u32),
            (None, Some(g)) => fault_abort::ErrorType::GrpcStatus(grpc_code(g)?),
            (None, None) => return None,
        };
        Some(FaultAbort {
            percentage: Some(percent(
                a.percentage.as_ref().map(|p| p.value).unwrap_or(100.0),
            )),
            error_type: Some(error_type),
            ..Default::default()
        })
    });
    HttpFault {
        delay,
        abort,
        ..Default::default()
    }
}

/// The Envoy route for one VirtualService HTTP route and match.
/// `host` is the virtual host's service, where a route without a
/// destination goes.
pub(super) fn vs_route(
    clusters: &Clusters<'_>,
    host: &str,
    r: &HttpRoute,
    m: Option<&HttpMatchRequest>,
) -> Route {
    let mut headers = ops::header_lists(r.headers.as_ref());
    let action = if let Some(redirect) = &r.redirect {
        route::Action::Redirect(ops::redirect(redirect, clusters.port))
    } else if let Some(direct) = &r.direct_response {
        route::Action::DirectResponse(ops::direct_response(direct))
    } else {
        route::Action::Route(destinations(clusters, host, r, &mut headers))
    };
    let name = match m.filter(|m| !m.name.is_empty()) {
        Some(m) => format!("{}.{}", r.name, m.name),
        None => r.name.clone(),
    };
    let mut out = Route {
        name,
        r#match: Some(route_match(m)),
        stat_prefix: m.map(|m| m.stat_prefix.clone()).unwrap_or_default(),
        action: Some(action),
        request_headers_to_add: headers.request_add,
        request_headers_to_remove: headers.request_remove,
        response_headers_to_add: headers.response_add,
        response_headers_to_remove: headers.response_remove,
        ..Default::default()
    };
    if let Some(f) = &r.fault {
        out.typed_per_filter_config
            .insert("envoy.filters.http.fault".into(), any(&fault(f)));
    }
    if let Some(c) = &r.cors_policy {
        out.typed_per_filter_config
            .insert(ops::CORS_FILTER.into(), any(&ops::cors(c)));
    }
    out
}

/// Istio's route semantics for Gateway API routes
/// (`internal.istio.io/route-semantics: gateway`): a destination whose
/// cluster does not exist answers 500 (`INTERNAL_SERVER_ERROR`, the Gateway
/// API's answer for an invalid backend), and a path prefix other than `/`
/// matches whole path segments (`path_separated_prefix`).
pub(super) fn gateway_semantics(route: &mut Route) {
    if let Some(m) = route.r#match.as_mut()
        && let Some(route_match::PathSpecifier::Prefix(p)) = &m.path_specifier
        && p != "/"
    {
        let p = p.trim_end_matches('/').to_string();
        m.path_specifier = Some(route_match::PathSpecifier::PathSeparatedPrefix(p));
    }
    if let Some(route::Action::Route(action)) = route.action.as_mut() {
        action.cluster_not_found_response_code =
            route_action::ClusterNotFoundResponseCode::InternalServerError.into();
    }
}
