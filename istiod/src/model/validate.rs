//! Istio's validation rules (`pkg/config/validation`) for the kinds istiod
//! reads: a selection of the rules that catch real mistakes, each with a
//! message that says what to do. Type errors (unknown fields, bad enum values,
//! durations) are caught earlier, when the object is decoded.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use super::error::FieldError;
use super::istio::{
    ClientTlsSettings, Destination, DestinationRule, HttpRoute, LoadBalancerSettings,
    PeerAuthentication, Percent, PolicySelector, Port, RouteDestination, ServiceEntry, Sidecar,
    StringMatch, TlsMode, TrafficPolicy, VirtualService, WorkloadEntry, WorkloadSelector,
};
use super::kube::{AddressType, EndpointSlice, IntOrString, Pod, Service, ServiceType};
use super::meta::{Object, Spec};
use super::service::Protocol;

mod authn;
mod authz;

/// Envoy's `retry_on` conditions that Istio accepts (besides status codes).
const RETRY_ON: &[&str] = &[
    "5xx",
    "gateway-error",
    "reset",
    "reset-before-request",
    "connect-failure",
    "envoy-ratelimited",
    "retriable-4xx",
    "refused-stream",
    "retriable-status-codes",
    "retriable-headers",
    "http3-post-connect-failure",
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
];

#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError::new(field, message));
    }
}

/// Validates an object; returns every problem found (empty when valid).
pub fn validate(object: &Object) -> Vec<FieldError> {
    let mut e = Errors::default();
    validate_metadata(object, &mut e);
    match &object.spec {
        Spec::VirtualService(vs) => virtual_service(vs, &mut e),
        Spec::DestinationRule(dr) => destination_rule(dr, &mut e),
        Spec::ServiceEntry(se) => service_entry(se, &mut e),
        Spec::WorkloadEntry(we) => workload_entry("spec", we, None, &mut e),
        Spec::Sidecar(sc) => sidecar(sc, &mut e),
        Spec::PeerAuthentication(pa) => peer_authentication(pa, &mut e),
        Spec::AuthorizationPolicy(ap) => authz::authorization_policy(ap, &mut e),
        Spec::RequestAuthentication(ra) => authn::request_authentication(ra, &mut e),
        Spec::Service(svc) => service(svc, &mut e),
        Spec::EndpointSlice(slice) => endpoint_slice(slice, &mut e),
        Spec::Pod(pod) => self::pod(pod, &mut e),
        Spec::Namespace(_) | Spec::Node(_) => {}
    }
    e.0
}

fn validate_metadata(object: &Object, e: &mut Errors) {
    let meta = &object.metadata;
    if meta.name.is_empty() {
        e.add(
            "metadata.name",
            "is required (give the object a name, unique for its kind in its namespace)",
        );
    } else if !is_dns1123_subdomain(&meta.name) {
        e.add(
            "metadata.name",
            format!(
                "{:?} is not a valid name (use lower-case letters, digits, '-' and '.', starting and ending with a letter or digit)",
                meta.name
            ),
        );
    }
    if object.kind().is_namespaced() && !is_dns1123_label(&meta.namespace) {
        e.add(
            "metadata.namespace",
            format!(
                "{:?} is not a valid namespace (use lower-case letters, digits and '-', at most 63 characters)",
                meta.namespace
            ),
        );
    }
}

// ---------------------------------------------------------------------------
// VirtualService

fn virtual_service(vs: &VirtualService, e: &mut Errors) {
    if vs.hosts.is_empty() {
        e.add(
            "spec.hosts",
            "at least one host is required (list the service names this rule routes, e.g. reviews or reviews.default.svc.cluster.local)",
        );
    }
    let mesh_bound = vs.gateways.is_empty() || vs.gateways.iter().any(|g| g == "mesh");
    for (i, host) in vs.hosts.iter().enumerate() {
        let field = format!("spec.hosts[{i}]");
        if host == "*" && mesh_bound {
            e.add(
                field,
                "the wildcard host * is not allowed for rules that apply to sidecars (gateway mesh); name the services instead",
            );
        } else {
            check_host(&field, host, e);
        }
    }
    for (i, gw) in vs.gateways.iter().enumerate() {
        if gw.is_empty() || gw.split('/').count() > 2 {
            e.add(
                format!("spec.gateways[{i}]"),
                format!(
                    "{gw:?} is not a gateway reference (use mesh, <name> or <namespace>/<name>)"
                ),
            );
        }
    }
    check_export_to("spec.exportTo", &vs.export_to, e);
    if vs.http.is_empty() && vs.tcp.is_empty() && vs.tls.is_empty() {
        e.add(
            "spec",
            "the rule has no http, tcp or tls routes (add at least one route)",
        );
    }
    for (i, route) in vs.http.iter().enumerate() {
        http_route(&format!("spec.http[{i}]"), route, e);
    }
    for (i, route) in vs.tcp.iter().enumerate() {
        let field = format!("spec.tcp[{i}]");
        for (j, m) in route.r#match.iter().enumerate() {
            if let Some(p) = m.port {
                check_port(&format!("{field}.match[{j}].port"), p, e);
            }
            check_subnets(&format!("{field}.match[{j}]"), &m.destination_subnets, e);
        }
        route_destinations(&field, &route.route, e);
    }
    for (i, route) in vs.tls.iter().enumerate() {
        let field = format!("spec.tls[{i}]");
        if route.r#match.is_empty() {
            e.add(
                format!("{field}.match"),
                "a TLS route needs at least one match (give the SNI host names it applies to)",
            );
        }
        for (j, m) in route.r#match.iter().enumerate() {
            if m.sni_hosts.is_empty() {
                e.add(
                    format!("{field}.match[{j}].sniHosts"),
                    "at least one SNI host is required",
                );
            }
            if let Some(p) = m.port {
                check_port(&format!("{field}.match[{j}].port"), p, e);
            }
            check_subnets(&format!("{field}.match[{j}]"), &m.destination_subnets, e);
        }
        route_destinations(&field, &route.route, e);
    }
}

fn http_route(field: &str, r: &HttpRoute, e: &mut Errors) {
    let actions = [
        !r.route.is_empty(),
        r.redirect.is_some(),
        r.direct_response.is_some(),
        r.delegate.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if actions == 0 {
        e.add(
            field,
            "an HTTP route needs one of route, redirect, directResponse or delegate (add a route with a destination)",
        );
    } else if actions > 1 {
        e.add(
            field,
            "route, redirect, directResponse and delegate are mutually exclusive (keep one of them)",
        );
    }
    for (j, m) in r.r#match.iter().enumerate() {
        let mf = format!("{field}.match[{j}]");
        for (name, sm) in [
            ("uri", &m.uri),
            ("scheme", &m.scheme),
            ("method", &m.method),
            ("authority", &m.authority),
        ] {
            if let Some(sm) = sm {
                string_match(&format!("{mf}.{name}"), sm, false, e);
            }
        }
        for (name, map) in [
            ("headers", &m.headers),
            ("withoutHeaders", &m.without_headers),
        ] {
            for (header, sm) in map {
                let hf = format!("{mf}.{name}.{header}");
                if header.is_empty() || header.chars().any(|c| c.is_ascii_uppercase()) {
                    e.add(
                        &hf,
                        "header names must be non-empty and lower case (write the name in lower case)",
                    );
                }
                string_match(&hf, sm, true, e);
            }
        }
        for (param, sm) in &m.query_params {
            string_match(&format!("{mf}.queryParams.{param}"), sm, true, e);
        }
        if let Some(p) = m.port {
            check_port(&format!("{mf}.port"), p, e);
        }
    }
    let dests: Vec<(&Destination, Option<i32>)> =
        r.route.iter().map(|d| (&d.destination, d.weight)).collect();
    destinations(&format!("{field}.route"), &dests, e);
    if let Some(redirect) = &r.redirect {
        if let Some(code) = redirect.redirect_code
            && !(300..=399).contains(&code)
        {
            e.add(
                format!("{field}.redirect.redirectCode"),
                format!("{code} is not a redirect status (use a 3xx code such as 301 or 302)"),
            );
        }
        if let Some(p) = redirect.port {
            check_port(&format!("{field}.redirect.port"), p, e);
        }
    }
    if let Some(dr) = &r.direct_response
        && !(200..=599).contains(&dr.status)
    {
        e.add(
            format!("{field}.directResponse.status"),
            format!(
                "{} is not an HTTP status (use a code between 200 and 599)",
                dr.status
            ),
        );
    }
    if let Some(rw) = &r.rewrite
        && let Some(rr) = &rw.uri_regex_rewrite
    {
        if !rw.uri.is_empty() {
            e.add(
                format!("{field}.rewrite"),
                "uri and uriRegexRewrite are mutually exclusive (keep one of them)",
            );
        }
        check_regex(
            &format!("{field}.rewrite.uriRegexRewrite.match"),
            &rr.r#match,
            e,
        );
    }
    if let Some(retries) = &r.retries {
        let rf = format!("{field}.retries");
        if retries.attempts < 0 {
            e.add(
                format!("{rf}.attempts"),
                "cannot be negative (use 0 to disable retries)",
            );
        }
        if let Some(t) = retries.per_try_timeout {
            check_min_duration(&format!("{rf}.perTryTimeout"), t, e);
        }
        for cond in retries
            .retry_on
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
        {
            let is_status = cond.parse::<u16>().is_ok_and(|c| (100..=599).contains(&c));
            if !is_status && !RETRY_ON.contains(&cond) {
                e.add(
                    format!("{rf}.retryOn"),
                    format!(
                        "{cond:?} is not a retry condition (use Envoy's conditions such as 5xx, connect-failure, reset, or HTTP status codes)"
                    ),
                );
            }
        }
    }
    if let Some(fault) = &r.fault {
        let ff = format!("{field}.fault");
        if fault.delay.is_none() && fault.abort.is_none() {
            e.add(&ff, "a fault needs a delay or an abort");
        }
        if let Some(delay) = &fault.delay {
            if delay.fixed_delay.is_none() {
                e.add(
                    format!("{ff}.delay.fixedDelay"),
                    "is required (say how long to delay, e.g. 5s)",
                );
            }
            if let Some(p) = &delay.percentage {
                check_percent(&format!("{ff}.delay.percentage.value"), p, e);
            }
        }
        if let Some(abort) = &fault.abort {
            match abort.http_status {
                Some(s) if !(200..=599).contains(&s) => e.add(
                    format!("{ff}.abort.httpStatus"),
                    format!("{s} is not an HTTP status (use a code between 200 and 599)"),
                ),
                None if abort.grpc_status.is_none() => e.add(
                    format!("{ff}.abort"),
                    "an abort needs httpStatus or grpcStatus",
                ),
                _ => {}
            }
            if let Some(p) = &abort.percentage {
                check_percent(&format!("{ff}.abort.percentage.value"), p, e);
            }
        }
    }
    if let Some(m) = &r.mirror {
        destination(&format!("{field}.mirror"), m, e);
    }
    if let Some(p) = &r.mirror_percentage {
        check_percent(&format!("{field}.mirrorPercentage.value"), p, e);
    }
    for (i, m) in r.mirrors.iter().enumerate() {
        destination(
            &format!("{field}.mirrors[{i}].destination"),
            &m.destination,
            e,
        );
        if let Some(p) = &m.percentage {
            check_percent(&format!("{field}.mirrors[{i}].percentage.value"), p, e);
        }
    }
    if let Some(cors) = &r.cors_policy {
        for (i, sm) in cors.allow_origins.iter().enumerate() {
            string_match(
                &format!("{field}.corsPolicy.allowOrigins[{i}]"),
                sm,
                false,
                e,
            );
        }
    }
}

fn route_destinations(field: &str, route: &[RouteDestination], e: &mut Errors) {
    if route.is_empty() {
        e.add(
            format!("{field}.route"),
            "at least one destination is required (add a route with a destination host)",
        );
    }
    let dests: Vec<(&Destination, Option<i32>)> =
        route.iter().map(|d| (&d.destination, d.weight)).collect();
    destinations(&format!("{field}.route"), &dests, e);
}

/// Destinations and weights: each weight 0-100, summing to 100 when there
/// are several destinations.
fn destinations(field: &str, dests: &[(&Destination, Option<i32>)], e: &mut Errors) {
    let mut total: i64 = 0;
    for (i, (dest, weight)) in dests.iter().enumerate() {
        destination(&format!("{field}[{i}].destination"), dest, e);
        let w = weight.unwrap_or(0);
        if !(0..=100).contains(&w) {
            e.add(
                format!("{field}[{i}].weight"),
                format!("{w} is out of range (use a weight between 0 and 100)"),
            );
        }
        total += i64::from(w);
    }
    if dests.len() > 1 && total != 100 {
        e.add(
            format!("{field}[{}].weight", dests.len() - 1),
            format!(
                "the weights of the {} destinations add up to {total}, not 100 (adjust them so they add up to 100)",
                dests.len()
            ),
        );
    }
}

fn destination(field: &str, d: &Destination, e: &mut Errors) {
    if d.host.is_empty() {
        e.add(
            format!("{field}.host"),
            "is required (name the service to send traffic to, e.g. reviews)",
        );
    } else {
        check_host(&format!("{field}.host"), &d.host, e);
    }
    if !d.subset.is_empty() && !is_dns1123_label(&d.subset) {
        e.add(
            format!("{field}.subset"),
            format!(
                "{:?} is not a valid subset name (use the name of a subset in the host's DestinationRule)",
                d.subset
            ),
        );
    }
    if let Some(p) = &d.port {
        check_port(&format!("{field}.port.number"), p.number, e);
    }
}

fn string_match(field: &str, sm: &StringMatch, empty_ok: bool, e: &mut Errors) {
    let set = [&sm.exact, &sm.prefix, &sm.regex]
        .iter()
        .filter(|v| v.is_some())
        .count();
    if set > 1 {
        e.add(
            field,
            "only one of exact, prefix and regex may be set (keep one of them)",
        );
    } else if set == 0 && !empty_ok {
        e.add(field, "needs one of exact, prefix or regex");
    }
    if let Some(re) = &sm.regex {
        check_regex(&format!("{field}.regex"), re, e);
    }
}

fn check_regex(field: &str, re: &str, e: &mut Errors) {
    if let Err(err) = regex::Regex::new(re) {
        let first = err.to_string();
        let first = first.lines().last().unwrap_or("invalid").trim().to_string();
        e.add(
            field,
            format!("{re:?} is not a valid regular expression: {first} (use RE2 syntax)"),
        );
    }
}

// ---------------------------------------------------------------------------
// DestinationRule

fn destination_rule(dr: &DestinationRule, e: &mut Errors) {
    if dr.host.is_empty() {
        e.add(
            "spec.host",
            "is required (name the service the rule applies to, e.g. reviews)",
        );
    } else {
        check_host("spec.host", &dr.host, e);
    }
    if let Some(tp) = &dr.traffic_policy {
        traffic_policy("spec.trafficPolicy", tp, true, e);
    }
    let mut names = BTreeSet::new();
    for (i, subset) in dr.subsets.iter().enumerate() {
        let field = format!("spec.subsets[{i}]");
        if subset.name.is_empty() {
            e.add(
                format!("{field}.name"),
                "is required (name the subset, e.g. v1)",
            );
        } else if !is_dns1123_label(&subset.name) {
            e.add(
                format!("{field}.name"),
                format!(
                    "{:?} is not a valid subset name (use lower-case letters, digits and '-')",
                    subset.name
                ),
            );
        } else if !names.insert(subset.name.as_str()) {
            e.add(
                format!("{field}.name"),
                format!(
                    "subset {:?} is defined twice (give each subset a unique name)",
                    subset.name
                ),
            );
        }
        if let Some(tp) = &subset.traffic_policy {
            traffic_policy(&format!("{field}.trafficPolicy"), tp, true, e);
        }
    }
    check_export_to("spec.exportTo", &dr.export_to, e);
    if let Some(sel) = &dr.workload_selector {
        check_selector("spec.workloadSelector", sel, e);
    }
}

fn traffic_policy(field: &str, tp: &TrafficPolicy, port_level: bool, e: &mut Errors) {
    if let Some(lb) = &tp.load_balancer {
        load_balancer(&format!("{field}.loadBalancer"), lb, e);
    }
    if let Some(cp) = &tp.connection_pool {
        connection_pool(&format!("{field}.connectionPool"), cp, e);
    }
    if let Some(od) = &tp.outlier_detection {
        outlier_detection(&format!("{field}.outlierDetection"), od, e);
    }
    if let Some(tls) = &tp.tls {
        client_tls(&format!("{field}.tls"), tls, e);
    }
    if !port_level {
        return;
    }
    let mut ports = BTreeSet::new();
    for (i, p) in tp.port_level_settings.iter().enumerate() {
        let pf = format!("{field}.portLevelSettings[{i}]");
        match &p.port {
            None => e.add(
                format!("{pf}.port"),
                "is required (give the port number the settings apply to)",
            ),
            Some(port) => {
                check_port(&format!("{pf}.port.number"), port.number, e);
                if !ports.insert(port.number) {
                    e.add(
                        format!("{pf}.port.number"),
                        format!(
                            "port {} has settings twice (merge them into one entry)",
                            port.number
                        ),
                    );
                }
            }
        }
        if let Some(lb) = &p.load_balancer {
            load_balancer(&format!("{pf}.loadBalancer"), lb, e);
        }
        if let Some(cp) = &p.connection_pool {
            connection_pool(&format!("{pf}.connectionPool"), cp, e);
        }
        if let Some(od) = &p.outlier_detection {
            outlier_detection(&format!("{pf}.outlierDetection"), od, e);
        }
        if let Some(tls) = &p.tls {
            client_tls(&format!("{pf}.tls"), tls, e);
        }
    }
}

fn load_balancer(field: &str, lb: &LoadBalancerSettings, e: &mut Errors) {
    if lb.simple.is_some() && lb.consistent_hash.is_some() {
        e.add(
            field,
            "simple and consistentHash are mutually exclusive (keep one of them)",
        );
    }
    if let Some(ch) = &lb.consistent_hash {
        let keys = [
            ch.http_header_name.is_some(),
            ch.http_cookie.is_some(),
            ch.use_source_ip.is_some(),
            ch.http_query_parameter_name.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if keys != 1 {
            e.add(
                format!("{field}.consistentHash"),
                "exactly one of httpHeaderName, httpCookie, useSourceIp and httpQueryParameterName is required",
            );
        }
        if let Some(c) = &ch.http_cookie
            && c.name.is_empty()
        {
            e.add(
                format!("{field}.consistentHash.httpCookie.name"),
                "is required (name the cookie to hash on)",
            );
        }
        if ch.ring_hash.is_some() && ch.maglev.is_some() {
            e.add(
                format!("{field}.consistentHash"),
                "ringHash and maglev are mutually exclusive (keep one of them)",
            );
        }
    }
}

fn connection_pool(field: &str, cp: &super::istio::ConnectionPoolSettings, e: &mut Errors) {
    if let Some(tcp) = &cp.tcp {
        non_negative(
            &format!("{field}.tcp.maxConnections"),
            tcp.max_connections,
            e,
        );
        if let Some(t) = tcp.connect_timeout {
            check_min_duration(&format!("{field}.tcp.connectTimeout"), t, e);
        }
    }
    if let Some(http) = &cp.http {
        for (name, v) in [
            ("http1MaxPendingRequests", http.http1_max_pending_requests),
            ("http2MaxRequests", http.http2_max_requests),
            ("maxRequestsPerConnection", http.max_requests_per_connection),
            ("maxRetries", http.max_retries),
            ("maxConcurrentStreams", http.max_concurrent_streams),
        ] {
            non_negative(&format!("{field}.http.{name}"), v, e);
        }
        if let Some(t) = http.idle_timeout {
            check_min_duration(&format!("{field}.http.idleTimeout"), t, e);
        }
    }
}

fn outlier_detection(field: &str, od: &super::istio::OutlierDetection, e: &mut Errors) {
    for (name, v) in [
        ("maxEjectionPercent", od.max_ejection_percent),
        ("minHealthPercent", od.min_health_percent),
    ] {
        if let Some(v) = v
            && !(0..=100).contains(&v)
        {
            e.add(
                format!("{field}.{name}"),
                format!("{v} is out of range (use a percentage between 0 and 100)"),
            );
        }
    }
    for (name, v) in [
        ("interval", od.interval),
        ("baseEjectionTime", od.base_ejection_time),
    ] {
        if let Some(v) = v {
            check_min_duration(&format!("{field}.{name}"), v, e);
        }
    }
}

fn client_tls(field: &str, tls: &ClientTlsSettings, e: &mut Errors) {
    match tls.mode {
        TlsMode::Mutual if tls.credential_name.is_empty() => {
            if tls.client_certificate.is_empty() {
                e.add(
                    format!("{field}.clientCertificate"),
                    "is required for MUTUAL (give the certificate file, or a credentialName)",
                );
            }
            if tls.private_key.is_empty() {
                e.add(
                    format!("{field}.privateKey"),
                    "is required for MUTUAL (give the key file, or a credentialName)",
                );
            }
        }
        TlsMode::IstioMutual
            if !tls.client_certificate.is_empty()
                || !tls.private_key.is_empty()
                || !tls.ca_certificates.is_empty()
                || !tls.credential_name.is_empty() =>
        {
            e.add(
                field,
                "ISTIO_MUTUAL uses the workload's Istio certificate: remove clientCertificate, privateKey, caCertificates and credentialName (or use MUTUAL)",
            );
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------
// ServiceEntry and WorkloadEntry

fn service_entry(se: &ServiceEntry, e: &mut Errors) {
    use super::istio::Resolution;
    if se.hosts.is_empty() {
        e.add(
            "spec.hosts",
            "at least one host is required (list the host names of the service, e.g. api.example.com)",
        );
    }
    for (i, host) in se.hosts.iter().enumerate() {
        let field = format!("spec.hosts[{i}]");
        if host == "*" {
            e.add(
                field,
                "a ServiceEntry cannot be for every host (*); name the hosts, or use *.<domain>",
            );
        } else {
            check_host(&field, host, e);
        }
    }
    for (i, addr) in se.addresses.iter().enumerate() {
        if !is_ip_or_cidr(addr) {
            e.add(
                format!("spec.addresses[{i}]"),
                format!("{addr:?} is not an IP address or CIDR (e.g. 10.1.2.3 or 10.1.0.0/16)"),
            );
        }
    }
    if se.ports.is_empty() {
        e.add(
            "spec.ports",
            "at least one port is required (give number, name and protocol, e.g. {number: 443, name: https, protocol: TLS})",
        );
    }
    let mut names = BTreeSet::new();
    let mut numbers = BTreeSet::new();
    for (i, port) in se.ports.iter().enumerate() {
        let field = format!("spec.ports[{i}]");
        check_istio_port(&field, port, true, e);
        if !port.name.is_empty() && !names.insert(port.name.as_str()) {
            e.add(
                format!("{field}.name"),
                format!(
                    "port name {:?} is used twice (give each port a unique name)",
                    port.name
                ),
            );
        }
        if !numbers.insert(port.number) {
            e.add(
                format!("{field}.number"),
                format!("port {} is listed twice (list each port once)", port.number),
            );
        }
    }
    if !se.endpoints.is_empty() && se.workload_selector.is_some() {
        e.add(
            "spec.workloadSelector",
            "endpoints and workloadSelector are mutually exclusive (keep one of them)",
        );
    }
    if let Some(sel) = &se.workload_selector {
        check_selector("spec.workloadSelector", sel, e);
    }
    match se.resolution {
        Resolution::Static if se.endpoints.is_empty() && se.workload_selector.is_none() => e.add(
            "spec.resolution",
            "STATIC resolution needs endpoints or a workloadSelector (list the endpoint IPs, or use DNS or NONE)",
        ),
        Resolution::Dns | Resolution::DnsRoundRobin if se.endpoints.is_empty() => {
            for (i, host) in se.hosts.iter().enumerate() {
                if host.starts_with('*') {
                    e.add(
                        format!("spec.hosts[{i}]"),
                        format!(
                            "{host:?} cannot be resolved by DNS (use resolution NONE for wildcard hosts, or list endpoints)"
                        ),
                    );
                }
            }
        }
        Resolution::DnsRoundRobin if se.endpoints.len() > 1 => e.add(
            "spec.endpoints",
            "DNS_ROUND_ROBIN resolution allows at most one endpoint (use DNS for several)",
        ),
        _ => {}
    }
    let port_names: BTreeSet<&str> = se.ports.iter().map(|p| p.name.as_str()).collect();
    for (i, ep) in se.endpoints.iter().enumerate() {
        let field = format!("spec.endpoints[{i}]");
        workload_entry(&field, ep, Some(&port_names), e);
        if se.resolution == Resolution::Static
            && !ep.address.is_empty()
            && ep.address.parse::<IpAddr>().is_err()
            && !ep.address.starts_with("unix://")
        {
            e.add(
                format!("{field}.address"),
                format!(
                    "{:?} is not an IP address, which STATIC resolution needs (use an IP, or resolution DNS for host names)",
                    ep.address
                ),
            );
        }
    }
    check_export_to("spec.exportTo", &se.export_to, e);
    for (i, san) in se.subject_alt_names.iter().enumerate() {
        if san.is_empty() {
            e.add(
                format!("spec.subjectAltNames[{i}]"),
                "is empty (remove it or give an identity such as spiffe://cluster.local/ns/default/sa/api)",
            );
        }
    }
}

fn workload_entry(
    field: &str,
    we: &WorkloadEntry,
    port_names: Option<&BTreeSet<&str>>,
    e: &mut Errors,
) {
    if we.address.is_empty() {
        if we.network.is_empty() {
            e.add(
                format!("{field}.address"),
                "is required (give the workload's IP address or host name)",
            );
        }
    } else if we.address.parse::<IpAddr>().is_err()
        && !we.address.starts_with("unix://")
        && !is_hostname(&we.address)
    {
        e.add(
            format!("{field}.address"),
            format!(
                "{:?} is not an IP address, host name or unix:// path",
                we.address
            ),
        );
    }
    for (name, number) in &we.ports {
        check_port(&format!("{field}.ports.{name}"), *number, e);
        if let Some(names) = port_names
            && !names.contains(name.as_str())
        {
            e.add(
                format!("{field}.ports.{name}"),
                format!(
                    "names no port of this ServiceEntry (use one of: {})",
                    names.iter().copied().collect::<Vec<_>>().join(", ")
                ),
            );
        }
    }
    if let Some(w) = we.weight
        && w == 0
    {
        e.add(
            format!("{field}.weight"),
            "must be at least 1 (leave it out for the default weight)",
        );
    }
}

// ---------------------------------------------------------------------------
// Sidecar and PeerAuthentication

fn sidecar(sc: &Sidecar, e: &mut Errors) {
    if let Some(sel) = &sc.workload_selector {
        check_selector("spec.workloadSelector", sel, e);
    }
    let mut catch_all = 0;
    for (i, eg) in sc.egress.iter().enumerate() {
        let field = format!("spec.egress[{i}]");
        match &eg.port {
            Some(p) => check_istio_port(&format!("{field}.port"), p, false, e),
            None => catch_all += 1,
        }
        if !eg.bind.is_empty()
            && eg.bind.parse::<IpAddr>().is_err()
            && !eg.bind.starts_with("unix://")
        {
            e.add(
                format!("{field}.bind"),
                format!("{:?} is not an IP address or unix:// path", eg.bind),
            );
        }
        if eg.hosts.is_empty() {
            e.add(
                format!("{field}.hosts"),
                "at least one host is required (e.g. ./* for this namespace, istio-system/*)",
            );
        }
        for (j, host) in eg.hosts.iter().enumerate() {
            if let Err(msg) = check_egress_host(host) {
                e.add(format!("{field}.hosts[{j}]"), msg);
            }
        }
    }
    if catch_all > 1 {
        e.add(
            "spec.egress",
            "only one egress listener may leave out the port (merge the catch-all listeners)",
        );
    }
    for (i, ing) in sc.ingress.iter().enumerate() {
        let field = format!("spec.ingress[{i}]");
        check_istio_port(&format!("{field}.port"), &ing.port, false, e);
        if !ing.default_endpoint.is_empty() && !valid_default_endpoint(&ing.default_endpoint) {
            e.add(
                format!("{field}.defaultEndpoint"),
                format!(
                    "{:?} is not a valid default endpoint (use 127.0.0.1:PORT, 0.0.0.0:PORT, [::1]:PORT, [::]:PORT or unix:///path)",
                    ing.default_endpoint
                ),
            );
        }
    }
    if let Some(otp) = &sc.outbound_traffic_policy
        && let Some(proxy) = &otp.egress_proxy
    {
        let field = "spec.outboundTrafficPolicy.egressProxy";
        destination(field, proxy, e);
        // Istio's rules: the egress proxy takes what ALLOW_ANY would pass
        // through, at a port of the proxy's service.
        if otp.mode != super::istio::OutboundMode::AllowAny {
            e.add(
                field,
                "is only used with mode ALLOW_ANY (set mode: ALLOW_ANY, or remove egressProxy)",
            );
        }
        if proxy.port.is_none() {
            e.add(
                format!("{field}.port"),
                "is required (the egress proxy's service port, e.g. {number: 3128})",
            );
        }
    }
}

/// `namespace/host`, where the namespace is `*`, `.`, `~` or a name, and the
/// host is `*`, `*.<suffix>` or a name.
fn check_egress_host(host: &str) -> Result<(), String> {
    let Some((ns, name)) = host.split_once('/') else {
        return Err(format!(
            "{host:?} is not of the form namespace/host (e.g. ./*, istio-system/*, */{host})"
        ));
    };
    if ns.is_empty() || !(ns == "*" || ns == "." || ns == "~" || is_dns1123_label(ns)) {
        return Err(format!(
            "{ns:?} in {host:?} is not a namespace (use a namespace name, * for any, . for the Sidecar's own, ~ for none)"
        ));
    }
    if name.is_empty() {
        return Err(format!(
            "{host:?} has no host after the / (use * for every host)"
        ));
    }
    if name != "*" {
        let mut e = Errors::default();
        check_host("", name, &mut e);
        if let Some(err) = e.0.into_iter().next() {
            return Err(err.message);
        }
    }
    Ok(())
}

fn valid_default_endpoint(ep: &str) -> bool {
    if ep.starts_with("unix://") {
        return ep.len() > "unix://".len();
    }
    let Some((host, port)) = ep.rsplit_once(':') else {
        return false;
    };
    matches!(host, "127.0.0.1" | "0.0.0.0" | "[::1]" | "[::]")
        && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p))
}

fn peer_authentication(pa: &PeerAuthentication, e: &mut Errors) {
    if let Some(sel) = &pa.selector {
        check_policy_selector("spec.selector", sel, e);
    }
    if !pa.port_level_mtls.is_empty() && pa.selector.is_none() {
        e.add(
            "spec.portLevelMtls",
            "needs a selector (port-level modes apply to the selected workloads' ports)",
        );
    }
    for port in pa.port_level_mtls.keys() {
        check_port(&format!("spec.portLevelMtls.{port}"), *port, e);
    }
}

// ---------------------------------------------------------------------------
// Kubernetes objects

fn service(svc: &Service, e: &mut Errors) {
    let spec = &svc.spec;
    let mut names = BTreeSet::new();
    for (i, p) in spec.ports.iter().enumerate() {
        let field = format!("spec.ports[{i}]");
        check_port(&format!("{field}.port"), p.port, e);
        if let Some(IntOrString::Int(t)) = p.target_port {
            check_port(&format!("{field}.targetPort"), t, e);
        }
        if spec.ports.len() > 1 && p.name.is_empty() {
            e.add(
                format!("{field}.name"),
                "is required when a Service has several ports (name it, e.g. http or grpc-api)",
            );
        } else if !p.name.is_empty() && !names.insert(p.name.as_str()) {
            e.add(
                format!("{field}.name"),
                format!("port name {:?} is used twice", p.name),
            );
        }
    }
    if let Some(ip) = &spec.cluster_ip
        && !ip.is_empty()
        && ip != "None"
        && ip.parse::<IpAddr>().is_err()
    {
        e.add(
            "spec.clusterIP",
            format!("{ip:?} is not an IP address (use an IP, None for a headless service, or leave it out)"),
        );
    }
    if spec.service_type == ServiceType::ExternalName
        && spec.external_name.as_deref().unwrap_or("").is_empty()
    {
        e.add(
            "spec.externalName",
            "is required for type ExternalName (give the DNS name the service aliases)",
        );
    }
}

fn endpoint_slice(slice: &EndpointSlice, e: &mut Errors) {
    for (i, ep) in slice.endpoints.iter().enumerate() {
        for (j, addr) in ep.addresses.iter().enumerate() {
            let ok = match slice.address_type {
                AddressType::IPv4 => addr.parse::<std::net::Ipv4Addr>().is_ok(),
                AddressType::IPv6 => addr.parse::<std::net::Ipv6Addr>().is_ok(),
                AddressType::Fqdn => is_hostname(addr),
            };
            if !ok {
                e.add(
                    format!("endpoints[{i}].addresses[{j}]"),
                    format!(
                        "{addr:?} is not a valid {:?} address (match addressType)",
                        slice.address_type
                    ),
                );
            }
        }
    }
    for (i, p) in slice.ports.iter().enumerate() {
        if let Some(port) = p.port {
            check_port(&format!("ports[{i}].port"), port, e);
        }
    }
}

fn pod(pod: &Pod, e: &mut Errors) {
    if let Some(ip) = &pod.status.pod_ip
        && !ip.is_empty()
        && ip.parse::<IpAddr>().is_err()
    {
        e.add("status.podIP", format!("{ip:?} is not an IP address"));
    }
}

// ---------------------------------------------------------------------------
// Shared checks

fn check_port(field: &str, port: u32, e: &mut Errors) {
    if !(1..=65535).contains(&port) {
        e.add(
            field,
            format!("{port} is not a valid port (use a number between 1 and 65535)"),
        );
    }
}

fn check_istio_port(field: &str, port: &Port, name_required: bool, e: &mut Errors) {
    check_port(&format!("{field}.number"), port.number, e);
    if let Some(t) = port.target_port {
        check_port(&format!("{field}.targetPort"), t, e);
    }
    if name_required && port.name.is_empty() {
        e.add(
            format!("{field}.name"),
            "is required (name the port, e.g. http or tls-api)",
        );
    }
    if !port.protocol.is_empty() && Protocol::parse(&port.protocol) == Protocol::Unsupported {
        e.add(
            format!("{field}.protocol"),
            format!(
                "{:?} is not a protocol Istio knows (use HTTP, HTTPS, HTTP2, GRPC, GRPC-WEB, TCP, TLS, MONGO, REDIS, MYSQL or UDP)",
                port.protocol
            ),
        );
    }
}

fn non_negative(field: &str, v: Option<i32>, e: &mut Errors) {
    if let Some(v) = v
        && v < 0
    {
        e.add(field, format!("{v} is negative (use 0 or more)"));
    }
}

fn check_min_duration(field: &str, d: Duration, e: &mut Errors) {
    if d < Duration::from_millis(1) {
        e.add(
            field,
            format!(
                "{} is shorter than 1ms (give a longer duration, e.g. 1s)",
                common::duration::format(d)
            ),
        );
    }
}

fn check_percent(field: &str, p: &Percent, e: &mut Errors) {
    if !(0.0..=100.0).contains(&p.value) {
        e.add(
            field,
            format!(
                "{} is out of range (use a percentage between 0 and 100)",
                p.value
            ),
        );
    }
}

fn check_subnets(field: &str, subnets: &[String], e: &mut Errors) {
    for (i, s) in subnets.iter().enumerate() {
        if !is_ip_or_cidr(s) {
            e.add(
                format!("{field}.destinationSubnets[{i}]"),
                format!("{s:?} is not an IP address or CIDR"),
            );
        }
    }
}

fn check_selector(field: &str, sel: &WorkloadSelector, e: &mut Errors) {
    for key in sel.labels.keys() {
        if key.is_empty() {
            e.add(format!("{field}.labels"), "label names cannot be empty");
        }
    }
}

fn check_policy_selector(field: &str, sel: &PolicySelector, e: &mut Errors) {
    for key in sel.match_labels.keys() {
        if key.is_empty() {
            e.add(
                format!("{field}.matchLabels"),
                "label names cannot be empty",
            );
        }
    }
}

fn check_export_to(field: &str, export_to: &[String], e: &mut Errors) {
    let mut seen = BTreeMap::new();
    for (i, ns) in export_to.iter().enumerate() {
        if !(ns == "." || ns == "*" || ns == "~" || is_dns1123_label(ns)) {
            e.add(
                format!("{field}[{i}]"),
                format!(
                    "{ns:?} is not a namespace (use . for this namespace, * for all, ~ for none, or namespace names)"
                ),
            );
        }
        if seen.insert(ns.as_str(), i).is_some() {
            e.add(format!("{field}[{i}]"), format!("{ns:?} is listed twice"));
        }
    }
    if export_to.len() > 1 && export_to.iter().any(|n| n == "~" || n == "*") {
        e.add(
            field,
            "* and ~ cannot be combined with other values (use * alone, ~ alone, or a list of namespaces)",
        );
    }
}

/// A host in a VirtualService, DestinationRule or ServiceEntry: a DNS name,
/// optionally with a leading `*` wildcard label, or a short name.
fn check_host(field: &str, host: &str, e: &mut Errors) {
    if host == "*" {
        return;
    }
    if host.contains('/') {
        e.add(
            field,
            format!("{host:?} is not a host name (hosts are names such as reviews or reviews.default.svc.cluster.local; namespace/host is only for Sidecar egress)"),
        );
        return;
    }
    let name = host.strip_prefix("*.").unwrap_or(host);
    if host.starts_with('*') && !host.starts_with("*.") {
        e.add(
            field,
            format!("{host:?}: a wildcard must be a whole leading label (e.g. *.example.com)"),
        );
        return;
    }
    if host.parse::<IpAddr>().is_ok() {
        return;
    }
    if !is_hostname(name) {
        e.add(
            field,
            format!("{host:?} is not a valid host name (use letters, digits, '-' and '.', labels of at most 63 characters)"),
        );
    }
}

fn is_hostname(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn is_ip_or_cidr(s: &str) -> bool {
    match s.split_once('/') {
        None => s.parse::<IpAddr>().is_ok(),
        Some((ip, bits)) => match (ip.parse::<IpAddr>(), bits.parse::<u8>()) {
            (Ok(IpAddr::V4(_)), Ok(b)) => b <= 32,
            (Ok(IpAddr::V6(_)), Ok(b)) => b <= 128,
            _ => false,
        },
    }
}

/// RFC 1123 label: lower-case alphanumerics and `-`, at most 63 characters.
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain: labels joined by `.`, at most 253 characters.
fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

#[cfg(test)]
mod tests {
    use crate::model::{ConfigError, parse_file};

    const VS: &str = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r, namespace: demo}\n";
    const DR: &str = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: d, namespace: demo}\n";
    const SE: &str = "apiVersion: networking.istio.io/v1beta1\nkind: ServiceEntry\nmetadata: {name: s, namespace: demo}\n";
    const SC: &str = "apiVersion: networking.istio.io/v1alpha3\nkind: Sidecar\nmetadata: {name: default, namespace: demo}\n";
    const PA: &str = "apiVersion: security.istio.io/v1beta1\nkind: PeerAuthentication\nmetadata: {name: p, namespace: demo}\n";

    fn rejected(yaml: &str) -> Vec<ConfigError> {
        match parse_file("mesh/bad.yaml", yaml) {
            Ok(parsed) => panic!("accepted: {parsed:?}"),
            Err(errors) => errors,
        }
    }

    /// Asserts that the document is rejected with an error naming the file,
    /// the object, the field, and containing `needle`.
    #[track_caller]
    fn assert_rejected(yaml: &str, object: &str, field: &str, needle: &str) {
        let errors = rejected(yaml);
        let expected_prefix = format!("mesh/bad.yaml: {object}: {field}: ");
        assert!(
            errors.iter().any(|e| {
                let s = e.to_string();
                e.file() == "mesh/bad.yaml"
                    && e.field() == Some(field)
                    && s.starts_with(&expected_prefix)
                    && s.contains(needle)
            }),
            "expected {expected_prefix}...{needle}...; got:\n{}",
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    #[test]
    fn metadata_name_is_required() {
        assert_rejected(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {namespace: demo}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}]}]}\n",
            "VirtualService/demo/<unnamed>",
            "metadata.name",
            "is required",
        );
        assert_rejected(
            "apiVersion: v1\nkind: Service\nmetadata: {name: Bad_Name, namespace: demo}\n",
            "Service/demo/Bad_Name",
            "metadata.name",
            "not a valid name",
        );
    }

    #[test]
    fn virtual_service_rules() {
        assert_rejected(
            &format!("{VS}spec: {{http: [{{route: [{{destination: {{host: a}}}}]}}]}}\n"),
            "VirtualService/demo/r",
            "spec.hosts",
            "at least one host is required",
        );
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], http: [{{route: [{{destination: {{subset: v1}}}}]}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.http[0].route[0].destination.host",
            "is required (name the service",
        );
        let weights = |a: i32, b: i32| {
            format!(
                "{VS}spec:\n  hosts: [a]\n  http:\n  - route:\n    - destination: {{host: a, subset: v1}}\n      weight: {a}\n    - destination: {{host: a, subset: v2}}\n      weight: {b}\n"
            )
        };
        assert_rejected(
            &weights(80, 10),
            "VirtualService/demo/r",
            "spec.http[0].route[1].weight",
            "add up to 90, not 100",
        );
        assert_rejected(
            &weights(-50, 150),
            "VirtualService/demo/r",
            "spec.http[0].route[1].weight",
            "150 is out of range",
        );
        assert!(parse_file("ok.yaml", &weights(90, 10)).is_ok());
        assert_rejected(
            &format!("{VS}spec: {{hosts: [a], http: [{{name: empty}}]}}\n"),
            "VirtualService/demo/r",
            "spec.http[0]",
            "needs one of route, redirect, directResponse or delegate",
        );
        assert_rejected(
            &format!("{VS}spec: {{hosts: [a]}}\n"),
            "VirtualService/demo/r",
            "spec",
            "no http, tcp or tls routes",
        );
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: ['*'], http: [{{route: [{{destination: {{host: a}}}}]}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.hosts[0]",
            "wildcard host * is not allowed",
        );
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], http: [{{match: [{{uri: {{regex: '(['}}}}], route: [{{destination: {{host: a}}}}]}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.http[0].match[0].uri.regex",
            "not a valid regular expression",
        );
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], http: [{{match: [{{uri: {{exact: /a, prefix: /b}}}}], route: [{{destination: {{host: a}}}}]}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.http[0].match[0].uri",
            "only one of exact, prefix and regex",
        );
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], http: [{{route: [{{destination: {{host: a}}}}], retries: {{attempts: 3, retryOn: 'sometimes'}}}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.http[0].retries.retryOn",
            "\"sometimes\" is not a retry condition",
        );
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], http: [{{route: [{{destination: {{host: a}}}}], fault: {{abort: {{httpStatus: 503, percentage: {{value: 150}}}}}}}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.http[0].fault.abort.percentage.value",
            "out of range",
        );
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], tcp: [{{route: [{{destination: {{host: a, port: {{number: 70000}}}}}}]}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.tcp[0].route[0].destination.port.number",
            "70000 is not a valid port",
        );
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], tls: [{{match: [{{port: 443}}], route: [{{destination: {{host: a}}}}]}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.tls[0].match[0].sniHosts",
            "at least one SNI host",
        );
    }

    #[test]
    fn durations_must_parse() {
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], http: [{{route: [{{destination: {{host: a}}}}], timeout: 5}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.http[0].timeout",
            "invalid duration \"5\"",
        );
        assert_rejected(
            &format!(
                "{DR}spec: {{host: a, trafficPolicy: {{outlierDetection: {{interval: 10x}}}}}}\n"
            ),
            "DestinationRule/demo/d",
            "spec.trafficPolicy.outlierDetection.interval",
            "invalid duration \"10x\"",
        );
    }

    #[test]
    fn unknown_fields_in_spec_are_named() {
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], http: [{{route: [{{destination: {{host: a}}, wieght: 100}}]}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.http[0].route[0].wieght",
            "unknown field `wieght`",
        );
    }

    #[test]
    fn destination_rule_rules() {
        assert_rejected(
            &format!("{DR}spec: {{subsets: [{{name: v1}}]}}\n"),
            "DestinationRule/demo/d",
            "spec.host",
            "is required",
        );
        assert_rejected(
            &format!("{DR}spec: {{host: a, subsets: [{{name: v1}}, {{name: v1}}]}}\n"),
            "DestinationRule/demo/d",
            "spec.subsets[1].name",
            "subset \"v1\" is defined twice",
        );
        assert_rejected(
            &format!("{DR}spec: {{host: a, subsets: [{{labels: {{version: v1}}}}]}}\n"),
            "DestinationRule/demo/d",
            "spec.subsets[0].name",
            "is required",
        );
        assert_rejected(
            &format!(
                "{DR}spec: {{host: a, trafficPolicy: {{tls: {{mode: ISTIO_MUTUAL, clientCertificate: /c.pem}}}}}}\n"
            ),
            "DestinationRule/demo/d",
            "spec.trafficPolicy.tls",
            "ISTIO_MUTUAL uses the workload's Istio certificate",
        );
        assert_rejected(
            &format!("{DR}spec: {{host: a, trafficPolicy: {{tls: {{mode: MUTUAL}}}}}}\n"),
            "DestinationRule/demo/d",
            "spec.trafficPolicy.tls.clientCertificate",
            "is required for MUTUAL",
        );
        assert_rejected(
            &format!(
                "{DR}spec: {{host: a, trafficPolicy: {{loadBalancer: {{consistentHash: {{}}}}}}}}\n"
            ),
            "DestinationRule/demo/d",
            "spec.trafficPolicy.loadBalancer.consistentHash",
            "exactly one of httpHeaderName",
        );
        assert_rejected(
            &format!(
                "{DR}spec: {{host: a, subsets: [{{name: v1, trafficPolicy: {{outlierDetection: {{maxEjectionPercent: 120}}}}}}]}}\n"
            ),
            "DestinationRule/demo/d",
            "spec.subsets[0].trafficPolicy.outlierDetection.maxEjectionPercent",
            "120 is out of range",
        );
        assert_rejected(
            &format!(
                "{DR}spec: {{host: a, trafficPolicy: {{connectionPool: {{http: {{maxRetries: -1}}}}}}}}\n"
            ),
            "DestinationRule/demo/d",
            "spec.trafficPolicy.connectionPool.http.maxRetries",
            "-1 is negative",
        );
        assert_rejected(
            &format!("{DR}spec: {{host: a, exportTo: [., '*']}}\n"),
            "DestinationRule/demo/d",
            "spec.exportTo",
            "* and ~ cannot be combined",
        );
    }

    #[test]
    fn service_entry_rules() {
        assert_rejected(
            &format!("{SE}spec: {{ports: [{{number: 443, name: tls, protocol: TLS}}]}}\n"),
            "ServiceEntry/demo/s",
            "spec.hosts",
            "at least one host is required",
        );
        assert_rejected(
            &format!("{SE}spec: {{hosts: [api.example.com]}}\n"),
            "ServiceEntry/demo/s",
            "spec.ports",
            "at least one port is required",
        );
        assert_rejected(
            &format!(
                "{SE}spec: {{hosts: [api.example.com], ports: [{{number: 0, name: tls, protocol: TLS}}]}}\n"
            ),
            "ServiceEntry/demo/s",
            "spec.ports[0].number",
            "0 is not a valid port",
        );
        assert_rejected(
            &format!(
                "{SE}spec: {{hosts: [api.example.com], ports: [{{number: 443, name: tls, protocol: QUIC}}]}}\n"
            ),
            "ServiceEntry/demo/s",
            "spec.ports[0].protocol",
            "\"QUIC\" is not a protocol Istio knows",
        );
        assert_rejected(
            &format!(
                "{SE}spec: {{hosts: [api.example.com], ports: [{{number: 80, name: http}}], resolution: STATIC}}\n"
            ),
            "ServiceEntry/demo/s",
            "spec.resolution",
            "STATIC resolution needs endpoints or a workloadSelector",
        );
        assert_rejected(
            &format!(
                "{SE}spec: {{hosts: [api.example.com], ports: [{{number: 80, name: http}}], resolution: STATIC, endpoints: [{{address: api.internal}}]}}\n"
            ),
            "ServiceEntry/demo/s",
            "spec.endpoints[0].address",
            "not an IP address, which STATIC resolution needs",
        );
        assert_rejected(
            &format!(
                "{SE}spec: {{hosts: [api.example.com], ports: [{{number: 80, name: http}}], resolution: DNS, endpoints: [{{address: 10.0.0.1, ports: {{grpc: 9090}}}}]}}\n"
            ),
            "ServiceEntry/demo/s",
            "spec.endpoints[0].ports.grpc",
            "names no port of this ServiceEntry",
        );
        assert_rejected(
            &format!(
                "{SE}spec: {{hosts: [api.example.com], ports: [{{number: 80, name: http}}], resolution: MAGIC}}\n"
            ),
            "ServiceEntry/demo/s",
            "spec.resolution",
            "unknown variant `MAGIC`",
        );
    }

    #[test]
    fn peer_authentication_rules() {
        assert_rejected(
            &format!("{PA}spec: {{mtls: {{mode: strict}}}}\n"),
            "PeerAuthentication/demo/p",
            "spec.mtls.mode",
            "expected one of `UNSET`, `DISABLE`, `PERMISSIVE`, `STRICT`",
        );
        assert_rejected(
            &format!("{PA}spec: {{portLevelMtls: {{8080: {{mode: DISABLE}}}}}}\n"),
            "PeerAuthentication/demo/p",
            "spec.portLevelMtls",
            "needs a selector",
        );
    }

    #[test]
    fn sidecar_rules() {
        assert_rejected(
            &format!(
                "{SC}spec: {{egress: [{{hosts: [istio-system/*, httpbin.demo.svc.cluster.local]}}]}}\n"
            ),
            "Sidecar/demo/default",
            "spec.egress[0].hosts[1]",
            "is not of the form namespace/host",
        );
        assert_rejected(
            &format!("{SC}spec: {{egress: [{{hosts: [Demo/*]}}]}}\n"),
            "Sidecar/demo/default",
            "spec.egress[0].hosts[0]",
            "is not a namespace",
        );
        assert_rejected(
            &format!(
                "{SC}spec: {{ingress: [{{port: {{number: 9080, protocol: HTTP, name: http}}, defaultEndpoint: 'localhost:8080'}}], egress: [{{hosts: [./*]}}]}}\n"
            ),
            "Sidecar/demo/default",
            "spec.ingress[0].defaultEndpoint",
            "not a valid default endpoint",
        );
        assert!(
            parse_file(
                "ok.yaml",
                &format!("{SC}spec: {{egress: [{{hosts: [./*, istio-system/*, '*/*.example.com', ~/*]}}], outboundTrafficPolicy: {{mode: REGISTRY_ONLY}}}}\n")
            )
            .is_ok()
        );
    }

    #[test]
    fn kubernetes_object_rules() {
        assert_rejected(
            "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: demo}\nspec: {ports: [{name: http, port: 0}]}\n",
            "Service/demo/s",
            "spec.ports[0].port",
            "0 is not a valid port",
        );
        assert_rejected(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: e, namespace: demo}\naddressType: IPv4\nendpoints: [{addresses: ['fd00::1']}]\n",
            "EndpointSlice/demo/e",
            "endpoints[0].addresses[0]",
            "is not a valid IPv4 address",
        );
    }

    #[test]
    fn every_problem_of_a_file_is_reported_at_once() {
        let yaml = format!(
            "{DR}spec: {{subsets: [{{name: v1}}, {{name: v1}}]}}\n---\n{VS}spec: {{http: [{{route: [{{destination: {{host: a}}}}]}}]}}\n"
        );
        let fields: Vec<String> = rejected(&yaml)
            .iter()
            .map(|e| format!("{} {}", e.object().unwrap(), e.field().unwrap()))
            .collect();
        assert_eq!(
            fields,
            vec![
                "DestinationRule/demo/d spec.host",
                "DestinationRule/demo/d spec.subsets[1].name",
                "VirtualService/demo/r spec.hosts",
            ]
        );
    }
}
