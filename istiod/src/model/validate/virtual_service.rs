//! Validation of VirtualService, with the rules of Istio's
//! `ValidateVirtualService` for the parts sidecars use, and refusals of what
//! this istiod accepts in Istio's schema but does not apply (each names the
//! field and says what to use instead).

use super::super::istio::{Destination, Headers, HttpRoute, StringMatch, VirtualService};
use super::super::route::{MAX_DIRECT_RESPONSE_BODY_BYTES, grpc_code};
use super::route_refs::{destination, destinations, gateway};
use super::{
    Errors, check_export_to, check_host, check_min_duration, check_percent, check_port,
    is_dns1123_label, is_dns1123_subdomain,
};

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

pub(super) fn virtual_service(vs: &VirtualService, e: &mut Errors) {
    // Without hosts, a delegate (Istio's rules for one): only HTTP routes,
    // bound through its roots, never to gateways of its own.
    let is_delegate = vs.hosts.is_empty();
    if is_delegate {
        for (name, set) in [
            ("gateways", !vs.gateways.is_empty()),
            ("tls", !vs.tls.is_empty()),
            ("tcp", !vs.tcp.is_empty()),
        ] {
            if set {
                e.add(
                    format!("spec.{name}"),
                    format!(
                        "a delegate VirtualService (one without hosts) must have no {name} (bind and route through the root VirtualService that delegates to it, or add hosts)"
                    ),
                );
            }
        }
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
        gateway(&format!("spec.gateways[{i}]"), gw, e);
    }
    check_export_to("spec.exportTo", &vs.export_to, e);
    if vs.http.is_empty() && vs.tcp.is_empty() && vs.tls.is_empty() {
        e.add(
            "spec",
            "the rule has no http, tcp or tls routes (add at least one route)",
        );
    }
    for (i, route) in vs.http.iter().enumerate() {
        let field = format!("spec.http[{i}]");
        http_route(&field, route, e);
        if let Some(d) = &route.delegate {
            delegate(&format!("{field}.delegate"), d, is_delegate, e);
        }
    }
    super::virtual_service_tcp::l4_routes(vs, mesh_bound, e);
}

/// A root route's `delegate`: a VirtualService name (and namespace); a
/// delegate cannot delegate further (Istio's "delegate HTTP route cannot
/// contain delegate").
fn delegate(field: &str, d: &super::super::istio::Delegate, in_delegate: bool, e: &mut Errors) {
    if in_delegate {
        e.add(
            field,
            "delegate HTTP route cannot contain delegate (a delegate VirtualService cannot delegate again; write the routes here)",
        );
    }
    if !is_dns1123_subdomain(&d.name) {
        e.add(
            format!("{field}.name"),
            format!(
                "{:?} is not a VirtualService name (name the delegate VirtualService)",
                d.name
            ),
        );
    }
    if !d.namespace.is_empty() && !is_dns1123_label(&d.namespace) {
        e.add(
            format!("{field}.namespace"),
            format!("{:?} is not a namespace name", d.namespace),
        );
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
        for (k, gw) in m.gateways.iter().enumerate() {
            gateway(&format!("{mf}.gateways[{k}]"), gw, e);
        }
        if !m.source_namespace.is_empty() && !is_dns1123_label(&m.source_namespace) {
            e.add(
                format!("{mf}.sourceNamespace"),
                format!("{:?} is not a namespace name", m.source_namespace),
            );
        }
    }
    let dests: Vec<(&Destination, Option<i32>)> =
        r.route.iter().map(|d| (&d.destination, d.weight)).collect();
    destinations(&format!("{field}.route"), &dests, e);
    redirect_and_direct_response(field, r, e);
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
    if let Some(h) = &r.headers {
        headers(&format!("{field}.headers"), h, e);
    }
    for (i, d) in r.route.iter().enumerate() {
        if let Some(h) = &d.headers {
            headers(&format!("{field}.route[{i}].headers"), h, e);
        }
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
        if let Some(t) = retries.backoff {
            check_min_duration(&format!("{rf}.backoff"), t, e);
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
            if let Some(g) = &abort.grpc_status
                && grpc_code(g).is_none()
            {
                e.add(
                    format!("{ff}.abort.grpcStatus"),
                    format!(
                        "{g:?} is not a gRPC status (use a name such as UNAVAILABLE or DEADLINE_EXCEEDED)"
                    ),
                );
            }
            if abort.http_status.is_some() && abort.grpc_status.is_some() {
                e.add(
                    format!("{ff}.abort"),
                    "httpStatus and grpcStatus are mutually exclusive (keep one of them)",
                );
            }
            if let Some(p) = &abort.percentage {
                check_percent(&format!("{ff}.abort.percentage.value"), p, e);
            }
        }
    }
    mirrors_and_cors(field, r, e);
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

/// The redirect codes Envoy's `RedirectAction` can send.
pub(crate) const REDIRECT_CODES: &[u32] = &[301, 302, 303, 307, 308];

/// `redirect` and `directResponse`, as Istio checks them, with what Envoy
/// can express.
fn redirect_and_direct_response(field: &str, r: &HttpRoute, e: &mut Errors) {
    if let Some(redirect) = &r.redirect {
        let rf = format!("{field}.redirect");
        if let Some(code) = redirect.redirect_code
            && !REDIRECT_CODES.contains(&code)
        {
            e.add(
                format!("{rf}.redirectCode"),
                format!(
                    "{code} is not a redirect status Envoy can send (use 301, 302, 303, 307 or 308)"
                ),
            );
        }
        if let Some(p) = redirect.port {
            check_port(&format!("{rf}.port"), p, e);
        }
        if !redirect.scheme.is_empty()
            && !redirect
                .scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        {
            e.add(
                format!("{rf}.scheme"),
                format!(
                    "{:?} is not a URI scheme (use http or https)",
                    redirect.scheme
                ),
            );
        }
        match redirect.derive_port.as_str() {
            "" | "FROM_PROTOCOL_DEFAULT" => {}
            "FROM_REQUEST_PORT" if redirect.port.is_some() => e.add(
                format!("{rf}.derivePort"),
                "port and derivePort are mutually exclusive (keep one of them)",
            ),
            "FROM_REQUEST_PORT" => {}
            other => e.add(
                format!("{rf}.derivePort"),
                format!(
                    "{other:?} is not a derivePort (use FROM_PROTOCOL_DEFAULT or FROM_REQUEST_PORT)"
                ),
            ),
        }
        if redirect.uri.is_empty()
            && redirect.authority.is_empty()
            && redirect.port.is_none()
            && redirect.derive_port.is_empty()
            && redirect.scheme.is_empty()
        {
            e.add(
                &rf,
                "a redirect must set uri, authority, port, derivePort or scheme (say where to send the client)",
            );
        }
        if r.rewrite.is_some() {
            e.add(
                format!("{field}.rewrite"),
                "rewrite and redirect are mutually exclusive (keep one of them)",
            );
        }
    }
    if let Some(dr) = &r.direct_response {
        let df = format!("{field}.directResponse");
        if !(200..=599).contains(&dr.status) {
            e.add(
                format!("{df}.status"),
                format!(
                    "{} is not an HTTP status (use a code between 200 and 599)",
                    dr.status
                ),
            );
        }
        if let Some(body) = &dr.body {
            let len = match (&body.string, &body.bytes) {
                (Some(_), Some(_)) => {
                    e.add(
                        format!("{df}.body"),
                        "string and bytes are mutually exclusive (keep one of them)",
                    );
                    0
                }
                (Some(s), None) => s.len(),
                (None, Some(b)) => {
                    use base64::Engine as _;
                    match base64::engine::general_purpose::STANDARD.decode(b) {
                        Ok(v) => v.len(),
                        Err(err) => {
                            e.add(
                                format!("{df}.body.bytes"),
                                format!(
                                    "is not base64 ({err}); encode the body with standard base64"
                                ),
                            );
                            0
                        }
                    }
                }
                (None, None) => 0,
            };
            if len > MAX_DIRECT_RESPONSE_BODY_BYTES as usize {
                e.add(
                    format!("{df}.body"),
                    format!(
                        "is {len} bytes, over the {} bytes Envoy sends in a direct response (shorten it)",
                        MAX_DIRECT_RESPONSE_BODY_BYTES
                    ),
                );
            }
        }
    }
}

fn mirrors_and_cors(field: &str, r: &HttpRoute, e: &mut Errors) {
    if let Some(m) = &r.mirror {
        destination(&format!("{field}.mirror"), m, e);
    }
    if let Some(p) = &r.mirror_percentage {
        check_percent(&format!("{field}.mirrorPercentage.value"), p, e);
    }
    if r.mirror.is_some() && !r.mirrors.is_empty() {
        e.add(
            format!("{field}.mirrors"),
            "mirror and mirrors are mutually exclusive (move mirror into mirrors)",
        );
    }
    if r.mirror_percentage.is_some() && r.mirror.is_none() {
        e.add(
            format!("{field}.mirrorPercentage"),
            "applies to mirror, which is not set (set mirror, or give each of mirrors a percentage)",
        );
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
        if !matches!(
            cors.unmatched_preflights.as_str(),
            "" | "UNSPECIFIED" | "FORWARD" | "IGNORE"
        ) {
            e.add(
                format!("{field}.corsPolicy.unmatchedPreflights"),
                format!(
                    "{:?} is not a preflight policy (use FORWARD or IGNORE)",
                    cors.unmatched_preflights
                ),
            );
        }
    }
}

/// Header operations: names Envoy lets a route change (not pseudo-headers,
/// not `host`, which `rewrite.authority` sets).
fn headers(field: &str, h: &Headers, e: &mut Errors) {
    for (side, ops) in [("request", &h.request), ("response", &h.response)] {
        let Some(ops) = ops else { continue };
        let names = ops
            .set
            .keys()
            .map(|k| ("set", k.as_str()))
            .chain(ops.add.keys().map(|k| ("add", k.as_str())))
            .chain(ops.remove.iter().map(|k| ("remove", k.as_str())));
        for (op, name) in names {
            let nf = format!("{field}.{side}.{op}.{name}");
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
                e.add(
                    nf,
                    "is not a header name Envoy can change (pseudo-headers such as :path and names with spaces are not allowed)",
                );
            } else if name.eq_ignore_ascii_case("host") {
                e.add(
                    nf,
                    "the host header cannot be changed here (use rewrite.authority)",
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support;

    const VS: &str = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r, namespace: demo}\n";

    /// The errors for `spec`, as `field: message` strings.
    fn errors(spec: &str) -> Vec<String> {
        test_support::errors("mesh/vs.yaml", VS, spec)
    }

    #[track_caller]
    fn refused(spec: &str, field: &str, needle: &str) {
        test_support::refused(&errors(spec), field, needle);
    }

    #[test]
    fn route_actions_are_accepted() {
        for http in [
            "{redirect: {uri: /new, redirectCode: 302}}",
            "{directResponse: {status: 418, body: {string: teapot}}}",
            "{directResponse: {status: 200, body: {bytes: aGk=}}}",
            "{route: [{destination: {host: b}, headers: {request: {set: {x-a: b}}}}], mirror: {host: m}, mirrorPercentage: {value: 50}}",
            "{route: [{destination: {host: b}}], mirrors: [{destination: {host: m}, percentage: {value: 5}}], corsPolicy: {allowOrigins: [{exact: 'https://a'}], unmatchedPreflights: IGNORE}}",
            "{route: [{destination: {host: b}}], headers: {response: {add: {x-b: c}, remove: [server]}}}",
        ] {
            let errs = errors(&format!("{{hosts: [a], http: [{http}]}}"));
            assert!(errs.is_empty(), "{http}: {errs:#?}");
        }
    }

    #[test]
    fn what_envoy_cannot_do_is_refused() {
        for (http, field, needle) in [
            (
                "{redirect: {uri: /x, redirectCode: 305}}",
                "spec.http[0].redirect.redirectCode",
                "301, 302, 303, 307 or 308",
            ),
            (
                "{redirect: {redirectCode: 302}}",
                "spec.http[0].redirect",
                "must set uri",
            ),
            (
                "{redirect: {port: 8080, derivePort: FROM_REQUEST_PORT}}",
                "spec.http[0].redirect.derivePort",
                "mutually exclusive",
            ),
            (
                "{directResponse: {status: 200, body: {bytes: '***'}}}",
                "spec.http[0].directResponse.body.bytes",
                "not base64",
            ),
            (
                "{route: [{destination: {host: b}}], mirror: {host: m}, mirrors: [{destination: {host: n}}]}",
                "spec.http[0].mirrors",
                "mutually exclusive",
            ),
            (
                "{route: [{destination: {host: b}}], mirrorPercentage: {value: 5}}",
                "spec.http[0].mirrorPercentage",
                "mirror, which is not set",
            ),
            (
                "{route: [{destination: {host: b}}], headers: {request: {set: {host: x}}}}",
                "spec.http[0].headers.request.set.host",
                "rewrite.authority",
            ),
            (
                "{route: [{destination: {host: b, }, headers: {response: {remove: [':status']}}}]}",
                "spec.http[0].route[0].headers.response.remove.:status",
                "pseudo-headers",
            ),
            (
                "{route: [{destination: {host: b}}], corsPolicy: {unmatchedPreflights: DROP}}",
                "spec.http[0].corsPolicy.unmatchedPreflights",
                "FORWARD or IGNORE",
            ),
            (
                "{route: [{destination: {host: b}}], fault: {abort: {grpcStatus: NOPE}}}",
                "spec.http[0].fault.abort.grpcStatus",
                "not a gRPC status",
            ),
        ] {
            refused(&format!("{{hosts: [a], http: [{http}]}}"), field, needle);
        }
    }

    #[test]
    fn delegation_follows_istio_rules() {
        for spec in [
            "{hosts: [a], http: [{match: [{uri: {prefix: /r}}], delegate: {name: d, namespace: other}, timeout: 2s}]}",
            "{hosts: [a], gateways: [gw], http: [{delegate: {name: d}}]}",
            "{http: [{match: [{uri: {prefix: /r/v2}}], route: [{destination: {host: b}}]}]}",
            "{http: [{route: [{destination: {host: b}}]}], exportTo: [demo]}",
        ] {
            assert!(errors(spec).is_empty(), "{spec}: {:?}", errors(spec));
        }
        refused(
            "{http: [{delegate: {name: e}}]}",
            "spec.http[0].delegate",
            "cannot contain delegate",
        );
        refused(
            "{gateways: [gw], http: [{route: [{destination: {host: b}}]}]}",
            "spec.gateways",
            "delegate VirtualService",
        );
        refused(
            "{tcp: [{route: [{destination: {host: b}}]}]}",
            "spec.tcp",
            "delegate VirtualService",
        );
        refused(
            "{hosts: [a], http: [{delegate: {name: d}, route: [{destination: {host: b}}]}]}",
            "spec.http[0]",
            "mutually exclusive",
        );
        refused(
            "{hosts: [a], http: [{delegate: {name: 'D_1'}}]}",
            "spec.http[0].delegate.name",
            "not a VirtualService name",
        );
    }

    #[test]
    fn gateways_are_references_in_the_rule_and_in_matches() {
        for gws in ["[istio-system/ingress]", "[ingress, mesh]", "[mesh]"] {
            let spec = format!(
                "{{hosts: [a], gateways: {gws}, http: [{{route: [{{destination: {{host: b}}}}]}}]}}"
            );
            assert!(errors(&spec).is_empty(), "{gws}: {:?}", errors(&spec));
        }
        assert!(
            errors(
                "{hosts: ['*'], gateways: [ingress], http: [{route: [{destination: {host: b}}]}]}"
            )
            .is_empty()
        );
        refused(
            "{hosts: [a], gateways: [a/b/c], http: [{route: [{destination: {host: b}}]}]}",
            "spec.gateways[0]",
            "is not a gateway reference",
        );
        // Istio's egress gateway task: one rule, its matches per gateway.
        assert!(
            errors("{hosts: [a.com], gateways: [egress, mesh], http: [{match: [{gateways: [mesh], port: 80}], route: [{destination: {host: egress.istio-system.svc.cluster.local}}]}, {match: [{gateways: [egress]}], route: [{destination: {host: a.com}}]}]}")
                .is_empty()
        );
        refused(
            "{hosts: [a], http: [{match: [{gateways: ['a/b/c']}], route: [{destination: {host: b}}]}]}",
            "spec.http[0].match[0].gateways[0]",
            "is not a gateway reference",
        );
        assert!(
            errors("{hosts: [a], gateways: [mesh], http: [{match: [{gateways: [mesh], sourceLabels: {app: x}, sourceNamespace: demo}], route: [{destination: {host: b}}]}]}")
                .is_empty()
        );
        refused(
            "{hosts: [a], http: [{match: [{sourceNamespace: Demo_1}], route: [{destination: {host: b}}]}]}",
            "spec.http[0].match[0].sourceNamespace",
            "not a namespace",
        );
        refused(
            "{hosts: [a], http: [{redirect: {scheme: 'ht tp'}}]}",
            "spec.http[0].redirect.scheme",
            "not a URI scheme",
        );
    }
}
