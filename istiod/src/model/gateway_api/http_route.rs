//! One HTTPRoute rule as an Istio HTTP route (Istio's `convertHTTPRoute`
//! in `conversion.go`): matches, filters, backends and timeouts.
//!
//! Backends are `<svc>.<ns>.svc.<domain>` at their port and weight; a
//! backend whose Service does not exist keeps its share and answers 500
//! (the VirtualService's `gateway_semantics`), with `ResolvedRefs=False`
//! `BackendNotFound`, as in Istio.

use super::conditions::Condition;
use super::references::{RefFrom, RefTo, ReferenceGrants};
use super::route_types::{BackendObjectReference, CorsFilter, HttpRouteRetry};
use super::{HttpRoute, HttpRouteFilter, HttpRouteMatch, HttpRouteRule};
use crate::model::istio::{
    CorsPolicy, Destination, HeaderOperations, Headers, HttpDirectResponse, HttpMatchRequest,
    HttpMirrorPolicy, HttpRedirect, HttpRetry, HttpRewrite, HttpRouteDestination, Percent,
    PortSelector, RegexRewrite, ServiceEntry, StringMatch,
};
use crate::model::kube::Service;
use crate::model::store::{Snapshot, Typed};

/// The VirtualService routes of an HTTPRoute (one per rule and match) and
/// its `ResolvedRefs` condition.
pub(super) fn rules(
    r: &Typed<'_, HttpRoute>,
    domain: &str,
    snapshot: &Snapshot,
    grants: &ReferenceGrants,
    enforce_grants: bool,
) -> (Vec<crate::model::istio::HttpRoute>, Condition) {
    let ns = r.object.metadata.namespace.as_str();
    let mut backends = Backends::new("HTTPRoute", ns, domain, snapshot, grants);
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

/// A rule's route name as Istio names it: the rule's own, else
/// `<ns>.<route>.<rule index>`.
pub(super) fn rule_name(name: Option<&str>, ns: &str, route: &str, index: usize) -> String {
    name.map_or_else(|| format!("{ns}.{route}.{index}"), str::to_string)
}

/// A rule's routes into `out`: `base` named `name`, once per match; a rule
/// without matches matches everything (one route without a match, sorted
/// last).
pub(super) fn per_match(
    mut base: crate::model::istio::HttpRoute,
    name: String,
    matches: Vec<HttpMatchRequest>,
    out: &mut Vec<crate::model::istio::HttpRoute>,
) {
    base.name = name;
    if matches.is_empty() {
        out.push(base);
        return;
    }
    for m in matches {
        let mut h = base.clone();
        h.r#match = vec![m];
        out.push(h);
    }
}

/// A rule's action: its filters, retries, timeouts and backends, without
/// the match.
fn rule_route(rule: &HttpRouteRule, backends: &mut Backends<'_>) -> crate::model::istio::HttpRoute {
    let mut h = crate::model::istio::HttpRoute::default();
    for f in &rule.filters {
        apply_filter(&mut h, f, backends);
    }
    if let Some(r) = &rule.retry {
        h.retries = Some(retry(r));
    }
    if let Some(t) = &rule.timeouts {
        if let Some(d) = t.request.filter(|d| !d.is_zero()) {
            h.timeout = Some(d);
        }
        // As in Istio: the backend request timeout is each retry's
        // timeout, or without retries the route's (winning over `request`).
        if let Some(d) = t.backend_request.filter(|d| !d.is_zero()) {
            match &mut h.retries {
                Some(r) => r.per_try_timeout = Some(d),
                None => h.timeout = Some(d),
            }
        }
    }
    let weight_sum: u64 = rule
        .backend_refs
        .iter()
        .map(|b| u64::from(b.weight.unwrap_or(1)))
        .sum();
    if weight_sum == 0 {
        if h.redirect.is_none() {
            // No backend (or only zero weights): the Gateway API's 500.
            h.direct_response = Some(HttpDirectResponse {
                status: 500,
                body: None,
            });
        }
        return h;
    }
    for b in &rule.backend_refs {
        let weight = b.weight.unwrap_or(1);
        if weight == 0 {
            continue;
        }
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
        // The backend's own header modifiers, on its destination (Istio's
        // `buildHTTPDestination`; validation refuses other types).
        let mut own = crate::model::istio::HttpRoute::default();
        for f in &b.filters {
            apply_filter(&mut own, f, backends);
        }
        h.route.push(HttpRouteDestination {
            destination,
            weight: Some(i32::try_from(weight).unwrap_or(i32::MAX)),
            headers: own.headers,
        });
    }
    if let [only] = h.route.as_mut_slice() {
        // One destination takes every request: Istio leaves its weight out.
        only.weight = None;
    }
    h
}

/// A rule's `retry` as Istio maps it: connection errors always retried,
/// plus the listed status codes; 2 attempts by default.
fn retry(r: &HttpRouteRetry) -> HttpRetry {
    let attempts = i32::try_from(r.attempts.unwrap_or(2)).unwrap_or(i32::MAX);
    let mut on: Vec<String> = [
        "connect-failure",
        "refused-stream",
        "unavailable",
        "cancelled",
    ]
    .map(String::from)
    .to_vec();
    on.extend(r.codes.iter().map(u32::to_string));
    HttpRetry {
        attempts,
        // No attempts: a retry condition would be invalid.
        retry_on: if attempts == 0 {
            String::new()
        } else {
            on.join(",")
        },
        backoff: r.backoff,
        ..Default::default()
    }
}

/// Why a backend reference does not resolve: the `ResolvedRefs` reason
/// (`BackendNotFound`, `RefNotPermitted`, `InvalidKind`) and message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub(super) struct BackendError {
    reason: &'static str,
    message: String,
}

impl BackendError {
    fn new(reason: &'static str, message: String) -> Self {
        Self { reason, message }
    }
}

/// Resolves backend references of one route, collecting the
/// `ResolvedRefs` errors as Istio reports them.
pub(super) struct Backends<'a> {
    kind: &'static str,
    ns: &'a str,
    domain: &'a str,
    snapshot: &'a Snapshot,
    grants: &'a ReferenceGrants,
    /// Whether another namespace's backend needs a grant (gateway routes;
    /// mesh routes do not).
    pub(super) enforce_grants: bool,
    /// The last error (Istio reports the last), and a mirror's.
    error: Option<BackendError>,
    mirror_error: Option<BackendError>,
}

impl<'a> Backends<'a> {
    /// For routes of `kind` in namespace `ns`.
    pub(super) fn new(
        kind: &'static str,
        ns: &'a str,
        domain: &'a str,
        snapshot: &'a Snapshot,
        grants: &'a ReferenceGrants,
    ) -> Self {
        Self {
            kind,
            ns,
            domain,
            snapshot,
            grants,
            enforce_grants: true,
            error: None,
            mirror_error: None,
        }
    }

    /// A backend's destination (Istio's `buildDestination`): a Service of
    /// this or, with a ReferenceGrant, another namespace, or a ServiceEntry
    /// host (`networking.istio.io` `Hostname`). A missing one still has its
    /// destination, with `BackendNotFound`; a refused one has none.
    pub(super) fn destination(&mut self, b: &BackendObjectReference) -> Option<Destination> {
        let r = self.resolve(b);
        match r {
            Ok((d, None)) => Some(d),
            Ok((d, Some(e))) => {
                self.error = Some(e);
                Some(d)
            }
            Err(e) => {
                self.error = Some(e);
                None
            }
        }
    }

    fn resolve(
        &self,
        b: &BackendObjectReference,
    ) -> Result<(Destination, Option<BackendError>), BackendError> {
        let group = b.group.as_deref().unwrap_or("");
        let kind = b.kind.as_deref().unwrap_or("Service");
        let ns = b.namespace.as_deref().unwrap_or(self.ns);
        if self.enforce_grants && ns != self.ns {
            let from = RefFrom {
                group: super::GROUP,
                kind: self.kind,
                namespace: self.ns,
            };
            let to = RefTo {
                group,
                kind,
                namespace: ns,
                name: &b.name,
            };
            if !self.grants.allowed(from, to) {
                return Err(BackendError::new(
                    "RefNotPermitted",
                    format!(
                        "backendRef {}/{ns} not accessible to a {} in namespace {:?} (missing a ReferenceGrant?)",
                        b.name, self.kind, self.ns
                    ),
                ));
            }
        }
        let (host, exists) = match (group, kind) {
            ("", "Service") => (
                format!("{}.{ns}.svc.{}", b.name, self.domain),
                self.snapshot.get_typed::<Service>(ns, &b.name).is_some(),
            ),
            ("networking.istio.io", "Hostname") => (
                b.name.clone(),
                self.snapshot.list::<ServiceEntry>().any(|se| {
                    se.spec.hosts.iter().any(|h| h == &b.name)
                        && crate::model::service::is_exported_to(
                            &se.spec.export_to,
                            &se.object.metadata.namespace,
                            self.ns,
                        )
                }),
            ),
            _ => {
                return Err(BackendError::new(
                    "InvalidKind",
                    format!("referencing unsupported backendRef: group {group:?} kind {kind:?}"),
                ));
            }
        };
        let destination = Destination {
            host: host.clone(),
            port: b.port.map(|number| PortSelector { number }),
            ..Default::default()
        };
        let error = (!exists)
            .then(|| BackendError::new("BackendNotFound", format!("backend({host}) not found")));
        Ok((destination, error))
    }

    /// The `ResolvedRefs` condition.
    pub(super) fn resolved(&self) -> Condition {
        let errors: Vec<&BackendError> =
            self.error.iter().chain(self.mirror_error.iter()).collect();
        match errors.first() {
            None => Condition::ok("ResolvedRefs", "All references resolved"),
            Some(first) => Condition::new(
                "ResolvedRefs",
                false,
                first.reason,
                errors
                    .iter()
                    .map(|e| e.message.as_str())
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
        }
    }
}

/// Applies one rule filter to a route (Istio's filter cases of
/// `convertHTTPRoute`, shared with GRPCRoute's).
pub(super) fn apply_filter(
    h: &mut crate::model::istio::HttpRoute,
    f: &HttpRouteFilter,
    backends: &mut Backends<'_>,
) {
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
        h.redirect = Some(redirect(r));
    }
    if let Some(rw) = &f.url_rewrite {
        h.rewrite = rewrite(rw);
    }
    if let Some(m) = &f.request_mirror {
        let r = backends.resolve(&m.backend_ref);
        match r {
            Ok((destination, error)) => {
                if let Some(e) = error {
                    backends.mirror_error = Some(e);
                }
                let percentage = match (&m.fraction, m.percent) {
                    (Some(fr), _) => Some(Percent {
                        value: 100.0 * f64::from(fr.numerator)
                            / f64::from(fr.denominator.unwrap_or(100)),
                    }),
                    (None, Some(p)) => Some(Percent {
                        value: f64::from(p),
                    }),
                    (None, None) => None,
                };
                h.mirrors.push(HttpMirrorPolicy {
                    destination,
                    percentage,
                });
            }
            Err(e) => backends.mirror_error = Some(e),
        }
    }
    if let Some(c) = &f.cors {
        h.cors_policy = Some(cors(c));
    }
}

/// `RequestRedirect` (Istio's `createRedirectFilter`).
pub(super) fn redirect(r: &super::RequestRedirect) -> HttpRedirect {
    // "When empty, the port of the request is used": Istio derives it
    // from the request, or from the scheme when one is set.
    let derive = match (r.port, &r.scheme) {
        (Some(_), _) => String::new(),
        (None, Some(_)) => "FROM_PROTOCOL_DEFAULT".into(),
        (None, None) => "FROM_REQUEST_PORT".into(),
    };
    let path = r.path.as_ref();
    HttpRedirect {
        uri: path
            .filter(|p| p.r#type == "ReplaceFullPath")
            .and_then(|p| p.replace_full_path.clone())
            .unwrap_or_default(),
        prefix_rewrite: path
            .filter(|p| p.r#type == "ReplacePrefixMatch")
            .and_then(|p| p.replace_prefix_match.clone())
            .unwrap_or_default(),
        authority: r.hostname.clone().unwrap_or_default(),
        port: r.port,
        derive_port: derive,
        scheme: r.scheme.clone().unwrap_or_default(),
        redirect_code: r.status_code,
    }
}

/// `URLRewrite` (Istio's `createRewriteFilter`): a prefix replacement
/// without its trailing `/` (`/` removes the prefix), a full path as a
/// regex rewrite of the whole path.
fn rewrite(rw: &super::UrlRewrite) -> Option<HttpRewrite> {
    let mut out = HttpRewrite {
        authority: rw.hostname.clone().unwrap_or_default(),
        ..Default::default()
    };
    if let Some(p) = &rw.path {
        match p.r#type.as_str() {
            "ReplacePrefixMatch" => {
                let v = p.replace_prefix_match.as_deref().unwrap_or("");
                let v = v.strip_suffix('/').unwrap_or(v);
                out.uri = if v.is_empty() { "/".into() } else { v.into() };
            }
            _ => {
                out.uri_regex_rewrite = p.replace_full_path.clone().map(|path| RegexRewrite {
                    r#match: "/.*".into(),
                    rewrite: path,
                });
            }
        }
    }
    (!out.uri.is_empty() || out.uri_regex_rewrite.is_some() || !out.authority.is_empty())
        .then_some(out)
}

/// `CORS` (Istio's `createCorsFilter`): `*` is any well-formed origin, a
/// trailing `*` a prefix, other wildcards a regex; unmatched preflights
/// are ignored (passed on).
fn cors(c: &CorsFilter) -> CorsPolicy {
    let allow_origins = c
        .allow_origins
        .iter()
        .filter(|o| !o.is_empty())
        .map(|o| {
            if o == "*" {
                StringMatch {
                    regex: Some(r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s?#]+$".into()),
                    ..Default::default()
                }
            } else if !o.contains('*') {
                exact(o)
            } else if o.matches('*').count() == 1 && o.ends_with('*') {
                StringMatch {
                    prefix: Some(o.trim_end_matches('*').into()),
                    ..Default::default()
                }
            } else {
                StringMatch {
                    regex: Some(format!("^{}$", regex::escape(o).replace(r"\*", ".*"))),
                    ..Default::default()
                }
            }
        })
        .collect();
    CorsPolicy {
        allow_origins,
        allow_methods: c.allow_methods.clone(),
        allow_headers: c.allow_headers.clone(),
        expose_headers: c.expose_headers.clone(),
        max_age: c
            .max_age
            .filter(|s| *s > 0)
            .map(|s| std::time::Duration::from_secs(u64::from(s))),
        allow_credentials: c.allow_credentials.filter(|b| *b),
        unmatched_preflights: "IGNORE".into(),
    }
}

pub(super) fn exact(v: &str) -> StringMatch {
    StringMatch {
        exact: Some(v.to_string()),
        ..Default::default()
    }
}

pub(super) fn typed_match(t: Option<&str>, v: &str) -> StringMatch {
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
