//! Gateway API validation: the rules of the v1 CRDs' schemas and CEL that a
//! file bypasses (the API server applies them for the Kubernetes source),
//! and a refusal naming the field for every part this istiod does not
//! translate yet (TLS listeners, non-HTTP protocols, mirrors, CORS,
//! extension filters, retries, cross-namespace backends, ...), so that
//! nothing is accepted and then ignored.

use std::collections::BTreeSet;

use super::{Errors, check_port, is_dns1123_label, is_dns1123_subdomain};
use crate::model::gateway_api::{
    GatewayClass, HeaderFilter, HttpBackendRef, HttpRoute, HttpRouteFilter, HttpRouteMatch,
    HttpRouteRule, KubernetesGateway, Listener, PathModifier,
};

const NOT_YET: &str = "is not implemented by this istiod yet (remove it)";

pub(super) fn refuse_if<T>(field: &str, value: &Option<T>, e: &mut Errors) {
    if value.is_some() {
        e.add(field, NOT_YET);
    }
}

pub(super) fn gateway_class(gc: &GatewayClass, e: &mut Errors) {
    if gc.controller_name.is_empty() {
        e.add(
            "spec.controllerName",
            format!(
                "is required (Istio's is {})",
                crate::model::gateway_api::CONTROLLER_NAME
            ),
        );
    }
    refuse_if("spec.parametersRef", &gc.parameters_ref, e);
}

pub(super) fn gateway(gw: &KubernetesGateway, e: &mut Errors) {
    if gw.gateway_class_name.is_empty() {
        e.add(
            "spec.gatewayClassName",
            "is required (Istio's built-in class is istio)",
        );
    }
    // Honoured by the automated deployment (inject::kube_gateway); a
    // `parametersRef` that is not a ConfigMap is reported in the Gateway's
    // status (`InvalidParameters`) and not deployed, as Istio does.
    if let Some(infra) = &gw.infrastructure
        && let Err(err) = serde_json::from_value::<
            crate::model::gateway_api::infrastructure::Infrastructure,
        >(infra.clone())
    {
        e.add("spec.infrastructure", err.to_string());
    }
    // `allowedListeners` is checked with ListenerSets (validate.rs).
    if let Some(tls) = &gw.tls {
        super::gateway_api_l4::gateway_tls(tls, e);
    }
    refuse_if("spec.defaultScope", &gw.default_scope, e);
    for (i, a) in gw.addresses.iter().enumerate() {
        let field = format!("spec.addresses[{i}]");
        match a.r#type.as_deref().unwrap_or("IPAddress") {
            "Hostname" => {
                if !is_dns1123_subdomain(&a.value) {
                    e.add(
                        format!("{field}.value"),
                        format!("{:?} is not a host name", a.value),
                    );
                }
            }
            other => e.add(
                format!("{field}.type"),
                format!("{other:?} addresses are not implemented by this istiod yet (use type: Hostname naming the gateway's Service, or no addresses)"),
            ),
        }
    }
    // A Gateway may leave its listeners to ListenerSets it allows.
    if gw.listeners.is_empty() && gw.allowed_listeners.is_none() {
        e.add(
            "spec.listeners",
            "a Gateway needs at least one listener (or allowedListeners, for ListenerSets)",
        );
    }
    let mut names = BTreeSet::new();
    for (i, l) in gw.listeners.iter().enumerate() {
        let field = format!("spec.listeners[{i}]");
        listener(&field, l, e);
        if !names.insert(l.name.as_str()) {
            e.add(
                format!("{field}.name"),
                format!(
                    "listener name {:?} is not unique (give each listener its own name)",
                    l.name
                ),
            );
        }
    }
}

pub(super) fn listener(field: &str, l: &Listener, e: &mut Errors) {
    if !is_dns1123_label(&l.name) {
        e.add(
            format!("{field}.name"),
            format!("{:?} is not a valid listener name (a DNS label)", l.name),
        );
    }
    check_port(&format!("{field}.port"), l.port, e);
    super::gateway_api_l4::listener_tls(field, l, e);
    if let Some(h) = &l.hostname {
        check_hostname(&format!("{field}.hostname"), h, e);
    }
    if let Some(ar) = &l.allowed_routes {
        for (k, kind) in ar.kinds.iter().enumerate() {
            let group = kind
                .group
                .as_deref()
                .unwrap_or(crate::model::gateway_api::GROUP);
            let known = ["HTTPRoute", "GRPCRoute", "TCPRoute", "TLSRoute"];
            if group != crate::model::gateway_api::GROUP || !known.contains(&kind.kind.as_str()) {
                e.add(
                    format!("{field}.allowedRoutes.kinds[{k}]"),
                    format!(
                        "route kind {group}/{} is not implemented by this istiod (HTTPRoute, GRPCRoute, TCPRoute or TLSRoute)",
                        kind.kind
                    ),
                );
            }
        }
        if let Some(ns) = &ar.namespaces {
            use crate::model::gateway_api::FromNamespaces;
            let sel_field = format!("{field}.allowedRoutes.namespaces.selector");
            match (ns.from.unwrap_or_default(), &ns.selector) {
                (FromNamespaces::Selector, None) => e.add(
                    sel_field,
                    "is required when from is Selector (a label selector of Namespaces)",
                ),
                (FromNamespaces::Selector, Some(s)) => {
                    for (j, r) in s.match_expressions.iter().enumerate() {
                        if !matches!(
                            r.operator.as_str(),
                            "In" | "NotIn" | "Exists" | "DoesNotExist"
                        ) {
                            e.add(
                                format!("{sel_field}.matchExpressions[{j}].operator"),
                                format!(
                                    "unknown operator {:?} (use In, NotIn, Exists or DoesNotExist)",
                                    r.operator
                                ),
                            );
                        }
                    }
                }
                (_, Some(_)) => e.add(
                    sel_field,
                    "is only read when from is Selector (set from: Selector or remove it)",
                ),
                (_, None) => {}
            }
        }
    }
}

/// A Gateway API hostname: a DNS name, optionally with a leading `*.`
/// label; no IP address, no port.
pub(super) fn check_hostname(field: &str, host: &str, e: &mut Errors) {
    let name = host.strip_prefix("*.").unwrap_or(host);
    if host.parse::<std::net::IpAddr>().is_ok() || !is_dns1123_subdomain(name) {
        e.add(
            field,
            format!("{host:?} is not a valid hostname (a DNS name, optionally starting with *.; no IP address)"),
        );
    }
}

pub(super) fn http_route(r: &HttpRoute, namespace: &str, e: &mut Errors) {
    refuse_if("spec.useDefaultGateways", &r.use_default_gateways, e);
    for (i, h) in r.hostnames.iter().enumerate() {
        check_hostname(&format!("spec.hostnames[{i}]"), h, e);
    }
    parent_refs(&r.parent_refs, e);
    for (i, rule) in r.rules.iter().enumerate() {
        http_rule(&format!("spec.rules[{i}]"), rule, namespace, e);
    }
}

/// The `parentRefs` of an HTTPRoute or GRPCRoute: Gateways, or core
/// Services for mesh routes.
pub(super) fn parent_refs(refs: &[crate::model::gateway_api::ParentReference], e: &mut Errors) {
    for (i, p) in refs.iter().enumerate() {
        let field = format!("spec.parentRefs[{i}]");
        let service = p.group.as_deref() == Some("") && p.kind.as_deref() == Some("Service");
        if !p.is_gateway() && !p.is_listener_set() && !service {
            e.add(
                format!("{field}.kind"),
                format!(
                    "parent {}/{} is not implemented by this istiod (only Gateways and ListenerSets of gateway.networking.k8s.io, or core Services for mesh routes)",
                    p.group.as_deref().unwrap_or(""),
                    p.kind.as_deref().unwrap_or("")
                ),
            );
        }
        if p.name.is_empty() {
            e.add(format!("{field}.name"), "is required (the Gateway's name)");
        }
        if let Some(port) = p.port {
            check_port(&format!("{field}.port"), port, e);
        }
    }
}

fn http_rule(field: &str, rule: &HttpRouteRule, namespace: &str, e: &mut Errors) {
    refuse_if(
        &format!("{field}.sessionPersistence"),
        &rule.session_persistence,
        e,
    );
    for (i, m) in rule.matches.iter().enumerate() {
        http_match(&format!("{field}.matches[{i}]"), m, e);
    }
    let mut redirect = false;
    let mut rewrite = false;
    let mut seen = BTreeSet::new();
    for (i, f) in rule.filters.iter().enumerate() {
        let ff = format!("{field}.filters[{i}]");
        filter(&ff, f, e);
        redirect |= f.r#type == "RequestRedirect";
        rewrite |= f.r#type == "URLRewrite";
        // A rule may mirror to several backends.
        if f.r#type != "RequestMirror" && !seen.insert(f.r#type.as_str()) {
            e.add(
                format!("{ff}.type"),
                format!(
                    "{} appears twice in one rule (the Gateway API allows each of these filters once)",
                    f.r#type
                ),
            );
        }
    }
    if redirect && rewrite {
        e.add(
            format!("{field}.filters"),
            "RequestRedirect and URLRewrite cannot be used in one rule (keep one of them)",
        );
    }
    if redirect && !rule.backend_refs.is_empty() {
        e.add(
            format!("{field}.backendRefs"),
            "a rule with RequestRedirect sends no request to a backend (remove the backendRefs or the redirect)",
        );
    }
    for (i, b) in rule.backend_refs.iter().enumerate() {
        backend_ref(&format!("{field}.backendRefs[{i}]"), b, namespace, e);
    }
}

fn http_match(field: &str, m: &HttpRouteMatch, e: &mut Errors) {
    if let Some(p) = &m.path {
        let value = p.value.as_deref().unwrap_or("/");
        let t = p.r#type.as_deref().unwrap_or("PathPrefix");
        match t {
            "Exact" | "PathPrefix" => {
                if !value.starts_with('/') {
                    e.add(
                        format!("{field}.path.value"),
                        format!("{value:?} must be an absolute path (start with /)"),
                    );
                }
            }
            "RegularExpression" => check_regex(&format!("{field}.path.value"), value, e),
            other => e.add(
                format!("{field}.path.type"),
                format!(
                    "unknown path match type {other:?} (use Exact, PathPrefix or RegularExpression)"
                ),
            ),
        }
    }
    for (kind, list) in [("headers", &m.headers), ("queryParams", &m.query_params)] {
        let mut names = BTreeSet::new();
        for (i, h) in list.iter().enumerate() {
            let hf = format!("{field}.{kind}[{i}]");
            if h.name.is_empty() {
                e.add(format!("{hf}.name"), "is required");
            }
            let key = if kind == "headers" {
                h.name.to_ascii_lowercase()
            } else {
                h.name.clone()
            };
            if !names.insert(key) {
                e.add(
                    format!("{hf}.name"),
                    format!("{:?} is matched twice (match each name once)", h.name),
                );
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
    if let Some(method) = &m.method
        && !matches!(
            method.as_str(),
            "GET" | "HEAD" | "POST" | "PUT" | "DELETE" | "CONNECT" | "OPTIONS" | "TRACE" | "PATCH"
        )
    {
        e.add(
            format!("{field}.method"),
            format!("unknown method {method:?} (use GET, HEAD, POST, PUT, DELETE, CONNECT, OPTIONS, TRACE or PATCH)"),
        );
    }
}

pub(super) fn check_regex(field: &str, re: &str, e: &mut Errors) {
    if let Err(err) = regex::Regex::new(re) {
        e.add(field, format!("invalid regular expression {re:?}: {err}"));
    }
}

pub(super) fn filter(field: &str, f: &HttpRouteFilter, e: &mut Errors) {
    let (wanted, present) = match f.r#type.as_str() {
        "RequestHeaderModifier" => ("requestHeaderModifier", f.request_header_modifier.is_some()),
        "ResponseHeaderModifier" => (
            "responseHeaderModifier",
            f.response_header_modifier.is_some(),
        ),
        "RequestRedirect" => ("requestRedirect", f.request_redirect.is_some()),
        "URLRewrite" => ("urlRewrite", f.url_rewrite.is_some()),
        "RequestMirror" => ("requestMirror", f.request_mirror.is_some()),
        "CORS" => ("cors", f.cors.is_some()),
        "ExtensionRef" | "ExternalAuth" => {
            e.add(
                format!("{field}.type"),
                format!(
                    "{} filters are not implemented by this istiod yet (remove the filter)",
                    f.r#type
                ),
            );
            return;
        }
        other => {
            e.add(
                format!("{field}.type"),
                format!("unknown filter type {other:?}"),
            );
            return;
        }
    };
    if !present {
        e.add(
            format!("{field}.{wanted}"),
            format!("is required for type {}", f.r#type),
        );
    }
    // The field of another type must not be set (the CRD's CEL rule).
    let set = [
        ("requestHeaderModifier", f.request_header_modifier.is_some()),
        (
            "responseHeaderModifier",
            f.response_header_modifier.is_some(),
        ),
        ("requestRedirect", f.request_redirect.is_some()),
        ("urlRewrite", f.url_rewrite.is_some()),
        ("requestMirror", f.request_mirror.is_some()),
        ("extensionRef", f.extension_ref.is_some()),
        ("cors", f.cors.is_some()),
        ("externalAuth", f.external_auth.is_some()),
    ];
    for (name, is_set) in set {
        if is_set && name != wanted {
            e.add(
                format!("{field}.{name}"),
                format!("must not be set for type {} (remove it)", f.r#type),
            );
        }
    }
    for (name, h) in [
        ("requestHeaderModifier", &f.request_header_modifier),
        ("responseHeaderModifier", &f.response_header_modifier),
    ] {
        if let Some(h) = h {
            header_filter(&format!("{field}.{name}"), h, e);
        }
    }
    if let Some(r) = &f.request_redirect {
        let rf = format!("{field}.requestRedirect");
        if let Some(s) = &r.scheme
            && s != "http"
            && s != "https"
        {
            e.add(format!("{rf}.scheme"), format!("{s:?} (use http or https)"));
        }
        if let Some(code) = r.status_code
            && code != 301
            && code != 302
        {
            e.add(
                format!("{rf}.statusCode"),
                format!("{code} (use 301 or 302)"),
            );
        }
        if let Some(p) = r.port {
            check_port(&format!("{rf}.port"), p, e);
        }
        if let Some(h) = &r.hostname {
            check_hostname(&format!("{rf}.hostname"), h, e);
        }
        if let Some(p) = &r.path {
            path_modifier(&format!("{rf}.path"), p, e);
        }
    }
    if let Some(m) = &f.request_mirror {
        let mf = format!("{field}.requestMirror");
        backend_object(&format!("{mf}.backendRef"), &m.backend_ref, "", e);
        if m.percent.is_some() && m.fraction.is_some() {
            e.add(
                format!("{mf}.percent"),
                "percent and fraction are exclusive (keep one)",
            );
        }
        if let Some(p) = m.percent
            && p > 100
        {
            e.add(format!("{mf}.percent"), format!("{p} is above 100"));
        }
        if let Some(fr) = &m.fraction
            && (fr.denominator == Some(0) || fr.numerator > fr.denominator.unwrap_or(100))
        {
            e.add(
                format!("{mf}.fraction"),
                "the numerator must not exceed a denominator above 0",
            );
        }
    }
    if let Some(r) = &f.url_rewrite {
        if let Some(h) = &r.hostname {
            check_hostname(&format!("{field}.urlRewrite.hostname"), h, e);
        }
        if let Some(p) = &r.path {
            path_modifier(&format!("{field}.urlRewrite.path"), p, e);
        }
    }
}

/// A backend reference: a core Service (another namespace's needs a
/// ReferenceGrant, checked when routes are translated) or, as Istio
/// reads it, a `networking.istio.io` `Hostname` (a ServiceEntry host).
fn backend_object(
    field: &str,
    b: &crate::model::gateway_api::route_types::BackendObjectReference,
    _namespace: &str,
    e: &mut Errors,
) {
    let group = b.group.as_deref().unwrap_or("");
    let kind = b.kind.as_deref().unwrap_or("Service");
    match (group, kind) {
        ("", "Service") => {
            if b.name.is_empty() || b.name.contains('.') {
                e.add(
                    format!("{field}.name"),
                    format!("{:?}: name the Service (not its host name)", b.name),
                );
            }
        }
        ("networking.istio.io", "Hostname") => {
            if b.namespace.is_some() {
                e.add(
                    format!("{field}.namespace"),
                    "may not be set with kind Hostname (remove it)",
                );
            }
            check_hostname(&format!("{field}.name"), &b.name, e);
        }
        _ => e.add(
            format!("{field}.kind"),
            format!(
                "backend {group}/{kind} is not implemented by this istiod (core Services, or networking.istio.io Hostname)"
            ),
        ),
    }
    match b.port {
        None => e.add(
            format!("{field}.port"),
            "is required for a Service or Hostname backend",
        ),
        Some(p) => check_port(&format!("{field}.port"), p, e),
    }
}

fn path_modifier(field: &str, p: &PathModifier, e: &mut Errors) {
    match p.r#type.as_str() {
        "ReplaceFullPath" => match &p.replace_full_path {
            Some(v) if v.starts_with('/') => {}
            Some(v) => e.add(
                format!("{field}.replaceFullPath"),
                format!("{v:?} must start with /"),
            ),
            None => e.add(
                format!("{field}.replaceFullPath"),
                "is required for type ReplaceFullPath",
            ),
        },
        // Empty removes the matched prefix.
        "ReplacePrefixMatch" => match &p.replace_prefix_match {
            Some(v) if v.is_empty() || v.starts_with('/') => {}
            Some(v) => e.add(
                format!("{field}.replacePrefixMatch"),
                format!("{v:?} must start with /"),
            ),
            None => e.add(
                format!("{field}.replacePrefixMatch"),
                "is required for type ReplacePrefixMatch",
            ),
        },
        other => e.add(
            format!("{field}.type"),
            format!("unknown path modifier {other:?} (use ReplaceFullPath or ReplacePrefixMatch)"),
        ),
    }
}

pub(super) fn header_filter(field: &str, h: &HeaderFilter, e: &mut Errors) {
    let mut names = BTreeSet::new();
    for (kind, list) in [("set", &h.set), ("add", &h.add)] {
        for (i, hv) in list.iter().enumerate() {
            let name = hv.name.to_ascii_lowercase();
            if hv.name.is_empty() || name.starts_with(':') || name == "host" {
                e.add(
                    format!("{field}.{kind}[{i}].name"),
                    format!(
                        "{:?} cannot be modified (use a regular header name)",
                        hv.name
                    ),
                );
            }
            if !names.insert(name) {
                e.add(
                    format!("{field}.{kind}[{i}].name"),
                    format!("{:?} appears twice (name each header once)", hv.name),
                );
            }
        }
    }
    for (i, name) in h.remove.iter().enumerate() {
        if name.is_empty() || name.starts_with(':') {
            e.add(
                format!("{field}.remove[{i}]"),
                format!("{name:?} cannot be removed"),
            );
        }
    }
}

pub(super) fn backend_ref(field: &str, b: &HttpBackendRef, namespace: &str, e: &mut Errors) {
    let target = crate::model::gateway_api::route_types::BackendObjectReference {
        group: b.group.clone(),
        kind: b.kind.clone(),
        name: b.name.clone(),
        namespace: b.namespace.clone(),
        port: b.port,
    };
    backend_object(field, &target, namespace, e);
    if let Some(w) = b.weight
        && w > 1_000_000
    {
        e.add(
            format!("{field}.weight"),
            format!("{w} is above the maximum 1000000"),
        );
    }
    // Istio applies a backend's header modifiers to its destination and
    // refuses every other filter type there (`InvalidFilter`).
    let mut seen = std::collections::BTreeSet::new();
    for (i, f) in b.filters.iter().enumerate() {
        let ff = format!("{field}.filters[{i}]");
        match f.r#type.as_str() {
            "RequestHeaderModifier" | "ResponseHeaderModifier" => {
                if !seen.insert(f.r#type.as_str()) {
                    e.add(
                        format!("{ff}.type"),
                        format!("{} appears twice (the Gateway API allows it once)", f.r#type),
                    );
                }
                filter(&ff, f, e);
            }
            other => e.add(
                format!("{ff}.type"),
                format!(
                    "{other:?} on a backend is not applied by Istio (only RequestHeaderModifier and ResponseHeaderModifier are; put it on the rule)"
                ),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{errors, refused};

    const GW: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: demo}\n";
    const ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: HTTPRoute\nmetadata: {name: r, namespace: demo}\n";

    #[test]
    fn a_plain_http_gateway_and_route_are_valid() {
        assert!(
            errors(
                "gw.yaml",
                GW,
                "{gatewayClassName: istio, listeners: [{name: http, port: 8080, protocol: HTTP, hostname: '*.example.com', allowedRoutes: {namespaces: {from: All}, kinds: [{kind: HTTPRoute}]}}]}"
            )
            .is_empty()
        );
        assert!(
            errors(
                "r.yaml",
                ROUTE,
                r#"{parentRefs: [{name: gw, sectionName: http}], hostnames: [a.example.com], rules: [{matches: [{path: {type: Exact, value: /a}, headers: [{name: x, value: "1"}], queryParams: [{type: RegularExpression, name: q, value: "a.*"}], method: GET}], filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-a, value: b}], remove: [x-b]}}], backendRefs: [{name: httpbin, port: 8000, weight: 90}], timeouts: {request: 10s}}]}"#
            )
            .is_empty()
        );
    }

    #[test]
    fn infrastructure_is_accepted_as_istio_reads_it() {
        let listeners = "listeners: [{name: h, port: 80, protocol: HTTP}]";
        assert!(
            errors(
                "gw.yaml",
                GW,
                &format!("{{gatewayClassName: istio, {listeners}, infrastructure: {{labels: {{a: b}}, annotations: {{c: d}}, parametersRef: {{group: '', kind: ConfigMap, name: opts}}}}}}")
            )
            .is_empty()
        );
        let e = errors(
            "gw.yaml",
            GW,
            &format!(
                "{{gatewayClassName: istio, {listeners}, infrastructure: {{parametersRef: {{group: example.com, kind: Params, name: p}}}}}}"
            ),
        );
        // Another kind is Istio's `InvalidParameters` in status, not a
        // refusal.
        assert_eq!(e, Vec::<String>::new());
        let e = errors(
            "gw.yaml",
            GW,
            &format!("{{gatewayClassName: istio, {listeners}, infrastructure: {{bogus: 1}}}}"),
        );
        refused(&e, "spec.infrastructure", "unknown field");
    }

    #[test]
    fn listener_protocols_and_tls_follow_the_crd_rules() {
        let ok = errors(
            "gw.yaml",
            GW,
            "{gatewayClassName: istio, listeners: [{name: https, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: cert}]}}, {name: tcp, port: 9000, protocol: TCP}, {name: tls, port: 9443, protocol: TLS, tls: {mode: Passthrough}}]}",
        );
        assert!(ok.is_empty(), "{ok:?}");
        let e = errors(
            "gw.yaml",
            GW,
            "{gatewayClassName: istio, listeners: [{name: https, port: 443, protocol: HTTPS}, {name: tcp, port: 9000, protocol: TCP, hostname: a.example.com, tls: {mode: Passthrough}}, {name: u, port: 53, protocol: UDP}, {name: p, port: 8443, protocol: TLS, tls: {mode: Passthrough, certificateRefs: [{name: c}]}}, {name: t, port: 7443, protocol: TLS, tls: {mode: Terminate}}]}",
        );
        refused(
            &e,
            "spec.listeners[0].tls",
            "is required for protocol HTTPS",
        );
        refused(
            &e,
            "spec.listeners[1].tls",
            "must not be set for protocol TCP",
        );
        refused(
            &e,
            "spec.listeners[1].hostname",
            "must not be set for protocol TCP",
        );
        refused(
            &e,
            "spec.listeners[2].protocol",
            "UDP listeners are not implemented",
        );
        refused(
            &e,
            "spec.listeners[3].tls.certificateRefs",
            "must be empty when mode is Passthrough",
        );
        refused(
            &e,
            "spec.listeners[4].tls.certificateRefs",
            "is required when mode is Terminate",
        );
        let e = errors(
            "gw.yaml",
            GW,
            "{gatewayClassName: istio, listeners: [{name: h, port: 80, protocol: HTTP, allowedRoutes: {kinds: [{kind: UDPRoute}]}}], addresses: [{value: 10.0.0.1}]}",
        );
        refused(&e, "spec.listeners[0].allowedRoutes.kinds[0]", "UDPRoute");
        refused(&e, "spec.addresses[0].type", "not implemented");
        let e = errors(
            "gw.yaml",
            GW,
            "{gatewayClassName: istio, listeners: [{name: h, port: 80, protocol: HTTP, bogus: 1}]}",
        );
        refused(&e, "spec.listeners[0].bogus", "unknown field");
    }

    #[test]
    fn unimplemented_route_parts_are_refused_by_name() {
        let e = errors(
            "r.yaml",
            ROUTE,
            r#"{parentRefs: [{name: gw, kind: ServiceEntry, group: networking.istio.io}], rules: [{filters: [{type: RequestMirror, requestMirror: {backendRef: {name: m, port: 80}, percent: 50}}, {type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /}}}, {type: ExtensionRef, extensionRef: {group: x, kind: y, name: z}}], backendRefs: [{name: a, namespace: other, port: 80}, {name: b}, {name: c, port: 80, filters: [{type: RequestMirror, requestMirror: {backendRef: {name: m, port: 80}}}, {type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: x-b, value: "1"}]}}]}, {group: networking.istio.io, kind: Hostname, name: example.com, namespace: other, port: 80}], retry: {attempts: 2, codes: [503]}}]}"#,
        );
        refused(&e, "spec.parentRefs[0].kind", "only Gateways");
        refused(&e, "spec.rules[0].filters[2].type", "ExtensionRef filters");
        refused(&e, "spec.rules[0].backendRefs[1].port", "is required");
        refused(
            &e,
            "spec.rules[0].backendRefs[2].filters[0].type",
            "on a backend is not applied by Istio",
        );
        // A backend's header modifiers are applied (to its destination).
        assert!(
            !e.iter()
                .any(|x| x.starts_with("spec.rules[0].backendRefs[2].filters[1]")),
            "{e:#?}"
        );
        refused(&e, "spec.rules[0].backendRefs[3].namespace", "Hostname");
        // Mirrors, prefix rewrites, retries and backends of another
        // namespace (granted or not at translation) are served.
        for field in [
            "spec.rules[0].filters[0]",
            "spec.rules[0].filters[1]",
            "spec.rules[0].retry",
            "spec.rules[0].backendRefs[0]",
        ] {
            assert!(
                !e.iter().any(|x| x.starts_with(field)),
                "{field} refused: {e:?}"
            );
        }
    }

    #[test]
    fn bad_values_name_the_field() {
        let e = errors(
            "r.yaml",
            ROUTE,
            r#"{parentRefs: [{name: gw}], hostnames: ["10.0.0.1"], rules: [{matches: [{path: {type: RegularExpression, value: "(["}, method: FETCH}], filters: [{type: RequestRedirect, requestRedirect: {statusCode: 307}}], backendRefs: [{name: a, port: 80}]}]}"#,
        );
        refused(&e, "spec.hostnames[0]", "not a valid hostname");
        refused(
            &e,
            "spec.rules[0].matches[0].path.value",
            "invalid regular expression",
        );
        refused(&e, "spec.rules[0].matches[0].method", "unknown method");
        refused(
            &e,
            "spec.rules[0].filters[0].requestRedirect.statusCode",
            "301 or 302",
        );
        refused(&e, "spec.rules[0].backendRefs", "sends no request");
        let e = errors(
            "gc.yaml",
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: c}\n",
            "{controllerName: example.com/x, parametersRef: {group: g, kind: k, name: n}}",
        );
        refused(&e, "spec.parametersRef", "not implemented");
    }
}
