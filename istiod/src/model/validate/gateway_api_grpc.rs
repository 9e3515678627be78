//! Gateway API validation of `GRPCRoute`: the rules of the v1 CRD's schema
//! and CEL that a file bypasses (method names and match types, header
//! matches, the filter types a GRPCRoute takes, unique rule names), and a
//! refusal naming the field for what this istiod does not translate
//! (extension filters, session persistence, default gateways).

use std::collections::BTreeSet;

use super::Errors;
use super::gateway_api::{
    backend_ref, check_hostname, check_regex, filter, header_filter, parent_refs, refuse_if,
};
use crate::model::gateway_api::grpc_types::{
    GrpcBackendRef, GrpcMethodMatch, GrpcRoute, GrpcRouteFilter, GrpcRouteMatch, GrpcRouteRule,
};
use crate::model::gateway_api::{HttpBackendRef, HttpRouteFilter};

pub(super) fn grpc_route(r: &GrpcRoute, namespace: &str, e: &mut Errors) {
    refuse_if("spec.useDefaultGateways", &r.use_default_gateways, e);
    for (i, h) in r.hostnames.iter().enumerate() {
        check_hostname(&format!("spec.hostnames[{i}]"), h, e);
    }
    parent_refs(&r.parent_refs, e);
    let mut names = BTreeSet::new();
    for (i, rule) in r.rules.iter().enumerate() {
        let field = format!("spec.rules[{i}]");
        if let Some(name) = &rule.name
            && !names.insert(name.as_str())
        {
            e.add(
                format!("{field}.name"),
                format!("{name:?}: rule names must be unique within the route"),
            );
        }
        grpc_rule(&field, rule, namespace, e);
    }
    let matches: usize = r.rules.iter().map(|r| r.matches.len()).sum();
    if matches > 128 {
        e.add(
            "spec.rules",
            format!("{matches} matches in all: at most 128 across the rules of one route"),
        );
    }
}

fn grpc_rule(field: &str, rule: &GrpcRouteRule, namespace: &str, e: &mut Errors) {
    refuse_if(
        &format!("{field}.sessionPersistence"),
        &rule.session_persistence,
        e,
    );
    for (i, m) in rule.matches.iter().enumerate() {
        grpc_match(&format!("{field}.matches[{i}]"), m, e);
    }
    filters(field, &rule.filters, true, e);
    for (i, b) in rule.backend_refs.iter().enumerate() {
        grpc_backend_ref(&format!("{field}.backendRefs[{i}]"), b, namespace, e);
    }
}

/// A rule's (or, without mirrors, a backend's) filters: each header
/// modifier at most once.
fn filters(field: &str, list: &[GrpcRouteFilter], rule: bool, e: &mut Errors) {
    let mut seen = BTreeSet::new();
    for (i, f) in list.iter().enumerate() {
        let ff = format!("{field}.filters[{i}]");
        match f.r#type.as_str() {
            "RequestHeaderModifier" | "ResponseHeaderModifier" => {
                if !seen.insert(f.r#type.as_str()) {
                    e.add(
                        format!("{ff}.type"),
                        format!(
                            "{} appears twice (the Gateway API allows it once)",
                            f.r#type
                        ),
                    );
                }
            }
            "RequestMirror" if rule => {}
            "RequestMirror" => {
                e.add(
                    format!("{ff}.type"),
                    "RequestMirror on a backend is not applied by Istio (put it on the rule)",
                );
                continue;
            }
            "ExtensionRef" => {
                e.add(
                    format!("{ff}.type"),
                    "ExtensionRef filters are not implemented by this istiod yet (remove the filter)",
                );
                continue;
            }
            other => {
                e.add(
                    format!("{ff}.type"),
                    format!(
                        "unknown GRPCRoute filter type {other:?} (use RequestHeaderModifier, ResponseHeaderModifier or RequestMirror)"
                    ),
                );
                continue;
            }
        }
        let as_http = HttpRouteFilter {
            r#type: f.r#type.clone(),
            request_header_modifier: f.request_header_modifier.clone(),
            response_header_modifier: f.response_header_modifier.clone(),
            request_mirror: f.request_mirror.clone(),
            extension_ref: f.extension_ref.clone(),
            ..Default::default()
        };
        filter(&ff, &as_http, e);
    }
}

fn grpc_match(field: &str, m: &GrpcRouteMatch, e: &mut Errors) {
    if let Some(method) = &m.method {
        method_match(&format!("{field}.method"), method, e);
    }
    let mut names = BTreeSet::new();
    for (i, h) in m.headers.iter().enumerate() {
        let hf = format!("{field}.headers[{i}]");
        if h.name.is_empty() {
            e.add(format!("{hf}.name"), "is required");
        }
        if !names.insert(h.name.to_ascii_lowercase()) {
            e.add(
                format!("{hf}.name"),
                format!("{:?} is matched twice (match each name once)", h.name),
            );
        }
        if h.value.is_empty() {
            e.add(format!("{hf}.value"), "is required");
        }
        match h.r#type.as_deref().unwrap_or("Exact") {
            "Exact" => {}
            "RegularExpression" => check_regex(&format!("{hf}.value"), &h.value, e),
            other => e.add(
                format!("{hf}.type"),
                format!("unknown match type {other:?} (use Exact or RegularExpression)"),
            ),
        }
    }
}

/// The CRD's rules of a method match: a service or a method; for `Exact`,
/// a protobuf service name and method name; for `RegularExpression`, valid
/// expressions.
fn method_match(field: &str, m: &GrpcMethodMatch, e: &mut Errors) {
    if m.service.is_none() && m.method.is_none() {
        e.add(field, "one or both of service and method must be set");
    }
    match m.r#type.as_deref().unwrap_or("Exact") {
        "Exact" => {
            if let Some(s) = &m.service
                && !is_service_name(s)
            {
                e.add(
                    format!("{field}.service"),
                    format!("{s:?} is not a gRPC service name (like package.Service)"),
                );
            }
            if let Some(method) = &m.method
                && !is_identifier(method)
            {
                e.add(
                    format!("{field}.method"),
                    format!("{method:?} is not a gRPC method name (letters, digits and _)"),
                );
            }
        }
        "RegularExpression" => {
            for (name, v) in [("service", &m.service), ("method", &m.method)] {
                if let Some(v) = v {
                    check_regex(&format!("{field}.{name}"), v, e);
                }
            }
        }
        other => e.add(
            format!("{field}.type"),
            format!("unknown method match type {other:?} (use Exact or RegularExpression)"),
        ),
    }
}

/// `^[A-Za-z_][A-Za-z_0-9]*$`.
fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `^(?i)\.?[a-z_][a-z_0-9]*(\.[a-z_][a-z_0-9]*)*$`.
fn is_service_name(s: &str) -> bool {
    let s = s.strip_prefix('.').unwrap_or(s);
    s.split('.').all(is_identifier)
}

fn grpc_backend_ref(field: &str, b: &GrpcBackendRef, namespace: &str, e: &mut Errors) {
    let as_http = HttpBackendRef {
        group: b.group.clone(),
        kind: b.kind.clone(),
        name: b.name.clone(),
        namespace: b.namespace.clone(),
        port: b.port,
        weight: b.weight,
        filters: Vec::new(),
    };
    backend_ref(field, &as_http, namespace, e);
    filters(field, &b.filters, false, e);
    for (i, f) in b.filters.iter().enumerate() {
        for (name, h) in [
            ("requestHeaderModifier", &f.request_header_modifier),
            ("responseHeaderModifier", &f.response_header_modifier),
        ] {
            if let Some(h) = h {
                header_filter(&format!("{field}.filters[{i}].{name}"), h, e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{errors, refused};

    const ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: r, namespace: demo}\n";

    fn route(spec: &str) -> Vec<String> {
        errors("r.yaml", ROUTE, &format!("\n{spec}"))
    }

    #[test]
    fn a_route_by_method_with_headers_and_weights_is_accepted() {
        let r = route(
            "  parentRefs: [{name: gw}]\n  hostnames: [grpc.example.com]\n  rules:\n  - matches:\n    - method: {service: echo.Echo, method: A}\n      headers: [{name: x-tenant, value: a}]\n    - method: {type: RegularExpression, service: 'echo\\..*'}\n    filters:\n    - type: RequestHeaderModifier\n      requestHeaderModifier: {set: [{name: x-a, value: '1'}]}\n    backendRefs:\n    - {name: a, port: 9000, weight: 9}\n    - name: b\n      port: 9000\n      weight: 1\n      filters:\n      - type: ResponseHeaderModifier\n        responseHeaderModifier: {add: [{name: x-b, value: '1'}]}\n",
        );
        assert_eq!(r, Vec::<String>::new());
    }

    #[test]
    fn crd_rules_are_applied_and_unimplemented_parts_refused() {
        for (spec, field, needle) in [
            (
                "  parentRefs: [{name: gw}]\n  rules:\n  - matches: [{method: {type: Exact}}]\n",
                "spec.rules[0].matches[0].method",
                "",
            ),
            (
                "  parentRefs: [{name: gw}]\n  rules:\n  - matches: [{method: {service: 'echo/Echo'}}]\n",
                "spec.rules[0].matches[0].method.service",
                "",
            ),
            (
                "  parentRefs: [{name: gw}]\n  rules:\n  - matches: [{method: {method: 'A-b'}}]\n",
                "spec.rules[0].matches[0].method.method",
                "",
            ),
            (
                "  parentRefs: [{name: gw}]\n  rules:\n  - matches: [{method: {type: RegularExpression, method: '('}}]\n",
                "spec.rules[0].matches[0].method.method",
                "",
            ),
            (
                "  parentRefs: [{name: gw}]\n  rules:\n  - matches: [{method: {type: Prefix, method: A}}]\n",
                "spec.rules[0].matches[0].method.type",
                "",
            ),
            (
                "  parentRefs: [{name: gw}]\n  rules:\n  - filters: [{type: URLRewrite}]\n",
                "spec.rules[0].filters[0].type",
                "",
            ),
            (
                "  parentRefs: [{name: gw}]\n  rules:\n  - filters: [{type: ExtensionRef, extensionRef: {group: g, kind: k, name: n}}]\n",
                "spec.rules[0].filters[0].type",
                "",
            ),
            (
                "  parentRefs: [{name: gw}]\n  rules:\n  - backendRefs: [{name: a, port: 1, filters: [{type: RequestMirror, requestMirror: {backendRef: {name: m, port: 1}}}]}]\n",
                "spec.rules[0].backendRefs[0].filters[0].type",
                "",
            ),
            (
                "  parentRefs: [{name: gw}]\n  rules:\n  - {name: x}\n  - {name: x}\n",
                "spec.rules[1].name",
                "",
            ),
            (
                "  parentRefs: [{name: gw}]\n  rules:\n  - sessionPersistence: {sessionName: s}\n",
                "spec.rules[0].sessionPersistence",
                "",
            ),
            (
                "  parentRefs: [{name: gw}]\n  rules:\n  - backendRefs: [{name: a}]\n",
                "spec.rules[0].backendRefs[0].port",
                "",
            ),
        ] {
            refused(&route(spec), field, needle);
        }
    }
}
