//! One GRPCRoute rule as Istio HTTP routes (Istio's `convertGRPCRoute` in
//! `conversion.go`): a method match becomes a path match on
//! `/<service>/<method>` (exact, a `/<service>/` prefix, or a regex when a
//! part is missing or the match is a regular expression), header matches
//! keep their names, the filters are the header modifiers and mirrors, and
//! the backends resolve as an HTTPRoute's do, each with its own header
//! modifiers.

use super::HttpRouteFilter;
use super::conditions::Condition;
use super::grpc_types::{
    GrpcMethodMatch, GrpcRoute, GrpcRouteFilter, GrpcRouteMatch, GrpcRouteRule,
};
use super::http_route::{Backends, apply_filter, exact, per_match, rule_name, typed_match};
use super::references::ReferenceGrants;
use super::route_types::BackendObjectReference;
use crate::model::istio::{
    HttpDirectResponse, HttpMatchRequest, HttpRouteDestination, StringMatch,
};
use crate::model::store::{Snapshot, Typed};

/// The VirtualService routes of a GRPCRoute (one per rule and match) and
/// its `ResolvedRefs` condition.
pub(super) fn rules(
    r: &Typed<'_, GrpcRoute>,
    domain: &str,
    snapshot: &Snapshot,
    grants: &ReferenceGrants,
    enforce_grants: bool,
) -> (Vec<crate::model::istio::HttpRoute>, Condition) {
    let ns = r.object.metadata.namespace.as_str();
    let mut backends = Backends::new("GRPCRoute", ns, domain, snapshot, grants);
    backends.enforce_grants = enforce_grants;
    let mut out = Vec::new();
    for (i, rule) in r.spec.rules.iter().enumerate() {
        per_match(
            rule_route(rule, &mut backends),
            rule_name(rule.name.as_deref(), ns, &r.object.metadata.name, i),
            rule.matches.iter().map(match_request).collect(),
            &mut out,
        );
    }
    (out, backends.resolved())
}

/// A GRPCRoute filter as the HTTPRoute filter of the same type.
fn as_http_filter(f: &GrpcRouteFilter) -> HttpRouteFilter {
    HttpRouteFilter {
        r#type: f.r#type.clone(),
        request_header_modifier: f.request_header_modifier.clone(),
        response_header_modifier: f.response_header_modifier.clone(),
        request_mirror: f.request_mirror.clone(),
        ..Default::default()
    }
}

/// A rule's action: its filters and backends, without the match.
fn rule_route(rule: &GrpcRouteRule, backends: &mut Backends<'_>) -> crate::model::istio::HttpRoute {
    let mut h = crate::model::istio::HttpRoute::default();
    for f in &rule.filters {
        apply_filter(&mut h, &as_http_filter(f), backends);
    }
    let weight_sum: u64 = rule
        .backend_refs
        .iter()
        .map(|b| u64::from(b.weight.unwrap_or(1)))
        .sum();
    if weight_sum == 0 {
        // No backend (or only zero weights): the Gateway API's 500.
        h.direct_response = Some(HttpDirectResponse {
            status: 500,
            body: None,
        });
        return h;
    }
    for b in rule.backend_refs.iter().filter(|b| b.weight != Some(0)) {
        let target = BackendObjectReference {
            group: b.group.clone(),
            kind: b.kind.clone(),
            name: b.name.clone(),
            namespace: b.namespace.clone(),
            port: b.port,
        };
        // An unresolved backend keeps its share with no host: it answers
        // 500 (gateway semantics).
        let destination = backends.destination(&target).unwrap_or_default();
        // The backend's own header modifiers (validation refuses others).
        let mut own = crate::model::istio::HttpRoute::default();
        for f in &b.filters {
            apply_filter(&mut own, &as_http_filter(f), backends);
        }
        h.route.push(HttpRouteDestination {
            destination,
            weight: Some(i32::try_from(b.weight.unwrap_or(1)).unwrap_or(i32::MAX)),
            headers: own.headers,
        });
    }
    if let [only] = h.route.as_mut_slice() {
        // One destination takes every request: Istio leaves its weight out.
        only.weight = None;
    }
    h
}

/// One GRPCRoute match as an Istio match (Istio's `createGRPCURIMatch`
/// and `createGRPCHeadersMatch`).
fn match_request(m: &GrpcRouteMatch) -> HttpMatchRequest {
    HttpMatchRequest {
        uri: m.method.as_ref().and_then(method_uri),
        headers: m
            .headers
            .iter()
            .map(|h| (h.name.clone(), typed_match(h.r#type.as_deref(), &h.value)))
            .collect(),
        ..Default::default()
    }
}

/// The path match of a method condition; none when it names neither a
/// service nor a method (validation refuses that).
fn method_uri(m: &GrpcMethodMatch) -> Option<StringMatch> {
    let regex = |r: String| StringMatch {
        regex: Some(r),
        ..Default::default()
    };
    let regular = m.r#type.as_deref() == Some("RegularExpression");
    Some(match (m.service.as_deref(), m.method.as_deref(), regular) {
        (None, None, _) => return None,
        (Some(s), None, false) => StringMatch {
            prefix: Some(format!("/{s}/")),
            ..Default::default()
        },
        (Some(s), None, true) => regex(format!("/{s}/.+")),
        (None, Some(method), _) => regex(format!("/[^/]+/{method}")),
        (Some(s), Some(method), false) => exact(&format!("/{s}/{method}")),
        (Some(s), Some(method), true) => regex(format!("/{s}/{method}")),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::gateway_api::convert::{Output, convert};
    use crate::model::{ConfigStore, Kind, ObjectKey, Update, parse_file};

    fn output(extra: &str) -> Output {
        let base = crate::model::gateway_api::convert::tests::BASE;
        let store = ConfigStore::new();
        let parsed = parse_file("test.yaml", &format!("{base}---\n{extra}")).unwrap();
        store.apply(
            parsed
                .objects
                .into_iter()
                .map(|o| Update::Upsert(Arc::new(o))),
        );
        convert(&store.snapshot(), "cluster.local")
    }

    const ECHO: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: echo, namespace: demo}
spec:
  parentRefs:
  - {name: ingress, sectionName: http}
  - {group: "", kind: Service, name: httpbin-v1, port: 8000}
  rules:
  - matches: [{method: {service: echo.Echo, method: A}, headers: [{name: x-tenant, value: a}]}]
    filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {add: [{name: x-rule, value: "1"}]}}]
    backendRefs:
    - {name: httpbin-v1, port: 8000, weight: 3}
    - name: httpbin-v2
      port: 8000
      weight: 1
      filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-b, value: "1"}]}}]
  - backendRefs: [{name: missing, port: 8000}]
"#;

    #[test]
    fn a_grpcroute_routes_on_its_gateway_and_for_the_mesh() {
        let out = output(ECHO);
        let gw = out
            .virtual_services
            .iter()
            .find(|v| v.spec.gateways != ["mesh"])
            .unwrap();
        assert_eq!(
            gw.spec.gateways,
            ["demo/ingress~istio-autogenerated-k8s-gateway~http"]
        );
        let [a, rest] = gw.spec.http.as_slice() else {
            panic!("{:?}", gw.spec.http)
        };
        assert_eq!(a.name, "demo.echo.0");
        let m = &a.r#match[0];
        assert_eq!(
            m.uri.as_ref().unwrap().exact.as_deref(),
            Some("/echo.Echo/A")
        );
        assert_eq!(m.headers["x-tenant"].exact.as_deref(), Some("a"));
        let weights: Vec<Option<i32>> = a.route.iter().map(|d| d.weight).collect();
        assert_eq!(weights, [Some(3), Some(1)]);
        assert_eq!(
            a.route[1].destination.host,
            "httpbin-v2.demo.svc.cluster.local"
        );
        let own = a.route[1]
            .headers
            .as_ref()
            .unwrap()
            .request
            .as_ref()
            .unwrap();
        assert_eq!(own.set["x-b"], "1", "the backend's own header");
        assert!(a.route[0].headers.is_none());
        let rule = a.headers.as_ref().unwrap().response.as_ref().unwrap();
        assert_eq!(rule.add["x-rule"], "1", "the rule's filter");
        // A rule without matches matches every call, sorted last.
        assert_eq!(rest.name, "demo.echo.1");
        assert!(rest.r#match.is_empty());
        assert_eq!(
            rest.route[0].destination.host,
            "missing.demo.svc.cluster.local"
        );

        // The Service parent: the same rules for sidecars calling it, on
        // the parent's port.
        let mesh = out
            .virtual_services
            .iter()
            .find(|v| v.spec.gateways == ["mesh"])
            .unwrap();
        assert_eq!(mesh.spec.hosts, ["httpbin-v1.demo.svc.cluster.local"]);
        assert_eq!(mesh.name, "demo~8000~httpbin-v1.demo.svc.cluster.local");
        assert!(
            mesh.spec
                .http
                .iter()
                .all(|h| h.r#match[0].port == Some(8000))
        );

        let status = out.status[&ObjectKey::new(Kind::GrpcRoute, "demo", "echo")].lines();
        assert_eq!(
            status
                .iter()
                .filter(|l| l.contains("Accepted=True (Accepted)"))
                .count(),
            2,
            "{status:?}"
        );
        assert!(
            status
                .iter()
                .any(|l| l.contains("ResolvedRefs=False (BackendNotFound)")
                    && l.contains("missing.demo.svc.cluster.local")),
            "{status:?}"
        );
    }

    fn uri(yaml: &str) -> Option<StringMatch> {
        let m: GrpcMethodMatch = serde_yaml_ng::from_str(yaml).unwrap();
        method_uri(&m)
    }

    #[test]
    fn method_matches_become_path_matches_as_istio_writes_them() {
        assert_eq!(
            uri("{service: echo.Echo, method: A}")
                .unwrap()
                .exact
                .as_deref(),
            Some("/echo.Echo/A")
        );
        assert_eq!(
            uri("{service: echo.Echo}").unwrap().prefix.as_deref(),
            Some("/echo.Echo/")
        );
        assert_eq!(
            uri("{method: A}").unwrap().regex.as_deref(),
            Some("/[^/]+/A")
        );
        assert_eq!(
            uri("{type: RegularExpression, service: 'echo\\..*'}")
                .unwrap()
                .regex
                .as_deref(),
            Some("/echo\\..*/.+")
        );
        assert_eq!(
            uri("{type: RegularExpression, service: e.*, method: 'A|B'}")
                .unwrap()
                .regex
                .as_deref(),
            Some("/e.*/A|B")
        );
        assert_eq!(uri("{type: Exact}"), None);
    }
}
