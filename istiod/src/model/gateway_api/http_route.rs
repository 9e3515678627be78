//! One HTTPRoute rule as an Istio HTTP route (Istio's `convertHTTPRoute`
//! in `conversion.go`): matches, filters, backends and timeouts.
//!
//! Backends are `<svc>.<ns>.svc.<domain>` at their port and weight; a
//! backend whose Service does not exist keeps its share and answers 500
//! (the VirtualService's `gateway_semantics`), with `ResolvedRefs=False`
//! `BackendNotFound`, as in Istio.

use super::conditions::Condition;
use super::{HttpRoute, HttpRouteFilter, HttpRouteMatch, HttpRouteRule};
use crate::model::istio::{
    Destination, HeaderOperations, Headers, HttpDirectResponse, HttpMatchRequest, HttpRedirect,
    HttpRewrite, HttpRouteDestination, PortSelector, RegexRewrite, StringMatch,
};
use crate::model::kube::Service;
use crate::model::store::{Snapshot, Typed};

/// The VirtualService routes of an HTTPRoute (one per rule and match) and
/// its `ResolvedRefs` condition.
pub(super) fn rules(
    r: &Typed<'_, HttpRoute>,
    domain: &str,
    snapshot: &Snapshot,
) -> (Vec<crate::model::istio::HttpRoute>, Condition) {
    let ns = r.object.metadata.namespace.as_str();
    let mut missing: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for (i, rule) in r.spec.rules.iter().enumerate() {
        let mut base = rule_route(rule, ns, domain, snapshot, &mut missing);
        // Istio's names: the rule's own, else `<ns>.<route>.<rule index>`.
        base.name = rule
            .name
            .clone()
            .unwrap_or_else(|| format!("{ns}.{}.{i}", r.object.metadata.name));
        // One route per match; a rule without matches matches everything
        // (a route without a match, sorted last).
        if rule.matches.is_empty() {
            out.push(base);
            continue;
        }
        for m in &rule.matches {
            let mut h = base.clone();
            h.r#match = vec![match_request(m)];
            out.push(h);
        }
    }
    let resolved = if missing.is_empty() {
        Condition::ok("ResolvedRefs", "All references resolved")
    } else {
        Condition::new("ResolvedRefs", false, "BackendNotFound", missing.join("; "))
    };
    (out, resolved)
}

/// A rule's action: its filters and backends, without the match.
fn rule_route(
    rule: &HttpRouteRule,
    ns: &str,
    domain: &str,
    snapshot: &Snapshot,
    missing: &mut Vec<String>,
) -> crate::model::istio::HttpRoute {
    let mut h = crate::model::istio::HttpRoute::default();
    for f in &rule.filters {
        apply_filter(&mut h, f);
    }
    if let Some(t) = &rule.timeouts {
        if let Some(d) = t.request.filter(|d| !d.is_zero()) {
            h.timeout = Some(d);
        }
        // As in Istio: without retries, the backend request timeout is the
        // route's timeout (and wins over `request`).
        if let Some(d) = t.backend_request.filter(|d| !d.is_zero()) {
            h.timeout = Some(d);
        }
    }
    if h.redirect.is_some() {
        return h;
    }
    for b in &rule.backend_refs {
        let host = format!("{}.{ns}.svc.{domain}", b.name);
        if snapshot.get_typed::<Service>(ns, &b.name).is_none() {
            let message = format!("backend({host}) not found");
            if !missing.contains(&message) {
                missing.push(message);
            }
        }
        let weight = b.weight.unwrap_or(1);
        if weight == 0 {
            continue;
        }
        h.route.push(HttpRouteDestination {
            destination: Destination {
                host,
                port: b.port.map(|number| PortSelector { number }),
                ..Default::default()
            },
            weight: Some(i32::try_from(weight).unwrap_or(i32::MAX)),
            headers: None,
        });
    }
    if let [only] = h.route.as_mut_slice() {
        // One destination takes every request: Istio leaves its weight out.
        only.weight = None;
    }
    if h.route.is_empty() {
        // No backend (or only zero weights): the Gateway API's 500.
        h.direct_response = Some(HttpDirectResponse {
            status: 500,
            body: None,
        });
    }
    h
}

fn apply_filter(h: &mut crate::model::istio::HttpRoute, f: &HttpRouteFilter) {
    let ops = |m: &super::HeaderFilter| HeaderOperations {
        set: m
            .set
            .iter()
            .map(|x| (x.name.clone(), x.value.clone()))
            .collect(),
        add: m
            .add
            .iter()
            .map(|x| (x.name.clone(), x.value.clone()))
            .collect(),
        remove: m.remove.clone(),
    };
    if let Some(m) = &f.request_header_modifier {
        h.headers.get_or_insert_with(Headers::default).request = Some(ops(m));
    }
    if let Some(m) = &f.response_header_modifier {
        h.headers.get_or_insert_with(Headers::default).response = Some(ops(m));
    }
    if let Some(r) = &f.request_redirect {
        // "When empty, the port of the request is used": Istio derives it
        // from the request, or from the scheme when one is set.
        let derive = match (r.port, &r.scheme) {
            (Some(_), _) => String::new(),
            (None, Some(_)) => "FROM_PROTOCOL_DEFAULT".into(),
            (None, None) => "FROM_REQUEST_PORT".into(),
        };
        h.redirect = Some(HttpRedirect {
            uri: r
                .path
                .as_ref()
                .and_then(|p| p.replace_full_path.clone())
                .unwrap_or_default(),
            authority: r.hostname.clone().unwrap_or_default(),
            port: r.port,
            derive_port: derive,
            scheme: r.scheme.clone().unwrap_or_default(),
            redirect_code: r.status_code,
        });
    }
    if let Some(rw) = &f.url_rewrite {
        h.rewrite = Some(HttpRewrite {
            authority: rw.hostname.clone().unwrap_or_default(),
            uri_regex_rewrite: rw
                .path
                .as_ref()
                .and_then(|p| p.replace_full_path.clone())
                .map(|path| RegexRewrite {
                    r#match: "/.*".into(),
                    rewrite: path,
                }),
            ..Default::default()
        });
    }
}

fn exact(v: &str) -> StringMatch {
    StringMatch {
        exact: Some(v.to_string()),
        ..Default::default()
    }
}

fn typed_match(t: Option<&str>, v: &str) -> StringMatch {
    match t {
        Some("RegularExpression") => StringMatch {
            regex: Some(v.to_string()),
            ..Default::default()
        },
        _ => exact(v),
    }
}

/// One Gateway API match as an Istio match (Istio's `createURIMatch` and
/// friends): a missing path is the CRD's default, `PathPrefix /`; a
/// prefix's trailing `/` is ignored; header names are lower-cased.
fn match_request(m: &HttpRouteMatch) -> HttpMatchRequest {
    let path = m.path.clone().unwrap_or_default();
    let value = path.value.as_deref().unwrap_or("/");
    let uri = match path.r#type.as_deref().unwrap_or("PathPrefix") {
        "Exact" => exact(value),
        "RegularExpression" => typed_match(Some("RegularExpression"), value),
        _ => StringMatch {
            prefix: Some(if value == "/" {
                "/".to_string()
            } else {
                value.trim_end_matches('/').to_string()
            }),
            ..Default::default()
        },
    };
    HttpMatchRequest {
        uri: Some(uri),
        method: m.method.as_deref().map(exact),
        headers: m
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    typed_match(h.r#type.as_deref(), &h.value),
                )
            })
            .collect(),
        query_params: m
            .query_params
            .iter()
            .map(|q| (q.name.clone(), typed_match(q.r#type.as_deref(), &q.value)))
            .collect(),
        ..Default::default()
    }
}
