//! VirtualService delegation, as Istio's `MergeHTTPRoutes`
//! (`pilot/pkg/model/virtualservice.go`): a root's HTTP route with
//! `delegate` is replaced by the delegate VirtualService's routes, each with
//! its matches merged into the root route's (a delegate match must fall
//! within one of the root's, or the delegate route is dropped), and the
//! root's `rewrite`, `directResponse`, `timeout`, `retries`, `fault`,
//! `mirror(s)`, `mirrorPercentage`, `corsPolicy` and `headers` filling in
//! what the delegate route leaves unset. The collection-level step (which
//! VirtualServices are delegates, `exportTo`, short names) is the push
//! context's.

use std::collections::BTreeMap;

use super::istio::{HttpMatchRequest, HttpRoute, Matcher, StringMatch};

/// A root route merged with the delegate's routes: one route per delegate
/// route whose matches fit the root's; conflicting ones are left out.
pub fn merge_http_routes(root: &HttpRoute, delegate: &[HttpRoute]) -> Vec<HttpRoute> {
    delegate
        .iter()
        .filter_map(|d| merge_http_route(root, d))
        .collect()
}

/// Istio's `mergeHTTPRoute`: `None` when the matches conflict.
fn merge_http_route(root: &HttpRoute, delegate: &HttpRoute) -> Option<HttpRoute> {
    let Some(matches) = merge_matches(&root.r#match, &delegate.r#match) else {
        tracing::warn!(target: "model", root = %root.name, delegate = %delegate.name, "HTTPMatchRequests conflict: the delegate route is left out");
        return None;
    };
    let mut out = delegate.clone();
    out.r#match = matches;
    out.delegate = None;
    out.name = joined(&root.name, &delegate.name);
    fill(&mut out.rewrite, &root.rewrite);
    fill(&mut out.direct_response, &root.direct_response);
    fill(&mut out.timeout, &root.timeout);
    fill(&mut out.retries, &root.retries);
    fill(&mut out.fault, &root.fault);
    fill(&mut out.mirror, &root.mirror);
    fill(&mut out.mirror_percentage, &root.mirror_percentage);
    fill(&mut out.cors_policy, &root.cors_policy);
    fill(&mut out.headers, &root.headers);
    if out.mirrors.is_empty() {
        out.mirrors = root.mirrors.clone();
    }
    Some(out)
}

fn fill<T: Clone>(field: &mut Option<T>, root: &Option<T>) {
    if field.is_none() {
        *field = root.clone();
    }
}

/// Istio's name joining: the delegate's, prefixed with the root's.
fn joined(root: &str, delegate: &str) -> String {
    match (root.is_empty(), delegate.is_empty()) {
        (_, true) => root.to_string(),
        (true, false) => delegate.to_string(),
        (false, false) => format!("{root}-{delegate}"),
    }
}

/// Istio's `mergeHTTPMatchRequests`: every delegate match must fit at least
/// one root match (merged with each it fits); `None` on a conflict.
fn merge_matches(
    root: &[HttpMatchRequest],
    delegate: &[HttpMatchRequest],
) -> Option<Vec<HttpMatchRequest>> {
    if root.is_empty() {
        return Some(delegate.to_vec());
    }
    if delegate.is_empty() {
        return Some(root.to_vec());
    }
    let mut out = Vec::new();
    for sub in delegate {
        let before = out.len();
        out.extend(
            root.iter()
                .filter(|r| !has_conflict(r, sub))
                .map(|r| merge_match(r, sub)),
        );
        if out.len() == before {
            return None;
        }
    }
    Some(out)
}

fn merge_maps<V: Clone>(
    root: &BTreeMap<String, V>,
    leaf: &BTreeMap<String, V>,
) -> BTreeMap<String, V> {
    let mut out = root.clone();
    out.extend(leaf.iter().map(|(k, v)| (k.clone(), v.clone())));
    out
}

/// Istio's `mergeHTTPMatchRequest`: the delegate's match, with the root's
/// conditions where the delegate sets none (maps merged, delegate's keys
/// winning).
fn merge_match(root: &HttpMatchRequest, leaf: &HttpMatchRequest) -> HttpMatchRequest {
    let mut out = leaf.clone();
    out.name = joined(&root.name, &leaf.name);
    fill(&mut out.uri, &root.uri);
    fill(&mut out.scheme, &root.scheme);
    fill(&mut out.method, &root.method);
    fill(&mut out.authority, &root.authority);
    out.headers = merge_maps(&root.headers, &leaf.headers);
    out.without_headers = merge_maps(&root.without_headers, &leaf.without_headers);
    out.query_params = merge_maps(&root.query_params, &leaf.query_params);
    fill(&mut out.port, &root.port);
    out.source_labels = merge_maps(&root.source_labels, &leaf.source_labels);
    if out.source_namespace.is_empty() {
        out.source_namespace = root.source_namespace.clone();
    }
    if out.gateways.is_empty() {
        out.gateways = root.gateways.clone();
    }
    if out.stat_prefix.is_empty() {
        out.stat_prefix = root.stat_prefix.clone();
    }
    out
}

/// Istio's `hasConflict`: whether the delegate's match can select requests
/// the root's cannot.
fn has_conflict(root: &HttpMatchRequest, leaf: &HttpMatchRequest) -> bool {
    let pairs = [
        (&root.uri, &leaf.uri),
        (&root.scheme, &leaf.scheme),
        (&root.method, &leaf.method),
        (&root.authority, &leaf.authority),
    ];
    if pairs
        .iter()
        .any(|(r, l)| string_match_conflict(r.as_ref(), l.as_ref()))
    {
        return true;
    }
    let maps = [
        (&root.headers, &leaf.headers),
        (&root.without_headers, &leaf.without_headers),
        (&root.query_params, &leaf.query_params),
    ];
    for (r, l) in maps {
        if l.iter()
            .any(|(k, v)| string_match_conflict(r.get(k), Some(v)))
        {
            return true;
        }
    }
    if root.ignore_uri_case != leaf.ignore_uri_case {
        return true;
    }
    if let (Some(r), Some(l)) = (root.port, leaf.port)
        && r != l
    {
        return true;
    }
    if !root.source_namespace.is_empty() && leaf.source_namespace != root.source_namespace {
        return true;
    }
    if leaf
        .source_labels
        .iter()
        .any(|(k, v)| root.source_labels.get(k).is_some_and(|rv| rv != v))
    {
        return true;
    }
    if !root.gateways.is_empty() && !leaf.gateways.is_empty() {
        return root.gateways.len() < leaf.gateways.len()
            || leaf.gateways.iter().any(|g| !root.gateways.contains(g));
    }
    false
}

/// Istio's `stringMatchConflict`: no conflict when either side is unset;
/// regex only against nothing; an exact root admits the same exact value;
/// a prefix root admits prefixes and exact values under it.
fn string_match_conflict(root: Option<&StringMatch>, leaf: Option<&StringMatch>) -> bool {
    let (Some(root), Some(leaf)) = (root, leaf) else {
        return false;
    };
    let (r, l) = (root.matcher(), leaf.matcher());
    match (r, l) {
        (Some(Matcher::Regex(_)), Some(_)) | (Some(_), Some(Matcher::Regex(_))) => true,
        (Some(Matcher::Exact(e)), l) => l != Some(Matcher::Exact(e)),
        (Some(Matcher::Prefix(p)), Some(Matcher::Prefix(v) | Matcher::Exact(v))) => {
            !v.starts_with(p)
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(yaml: &str) -> HttpRoute {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn delegate_matches_within_the_root_merge_and_the_rest_are_dropped() {
        let root = route(
            "{name: r, match: [{uri: {prefix: /productpage}, headers: {x-a: {exact: '1'}}}], timeout: 3s, retries: {attempts: 5}, delegate: {name: d}}",
        );
        let delegate = [
            route(
                "{name: v2, match: [{uri: {prefix: /productpage/v2}}], route: [{destination: {host: p, subset: v2}}], retries: {attempts: 1}}",
            ),
            route(
                "{name: other, match: [{uri: {prefix: /other}}], route: [{destination: {host: p}}]}",
            ),
            route("{route: [{destination: {host: p, subset: v1}}]}"),
        ];
        let merged = merge_http_routes(&root, &delegate);
        assert_eq!(merged.len(), 2, "/other is outside the root: {merged:#?}");
        let v2 = &merged[0];
        assert_eq!(v2.name, "r-v2");
        assert!(v2.delegate.is_none());
        assert_eq!(
            v2.r#match[0].uri.as_ref().unwrap().prefix.as_deref(),
            Some("/productpage/v2")
        );
        assert_eq!(
            v2.r#match[0].headers["x-a"].exact.as_deref(),
            Some("1"),
            "root's header condition carried over"
        );
        assert_eq!(v2.retries.as_ref().unwrap().attempts, 1, "delegate's own");
        assert_eq!(
            v2.timeout,
            Some(std::time::Duration::from_secs(3)),
            "root's"
        );
        // No match in the delegate: the root's matches.
        let v1 = &merged[1];
        assert_eq!(v1.name, "r");
        assert_eq!(v1.r#match, root.r#match);
        assert_eq!(v1.retries.as_ref().unwrap().attempts, 5);
    }

    #[test]
    fn string_conflicts_follow_istio() {
        let sm = |y: &str| -> StringMatch { serde_yaml_ng::from_str(y).unwrap() };
        let c = |r: &str, l: &str| string_match_conflict(Some(&sm(r)), Some(&sm(l)));
        assert!(!c("{prefix: /a}", "{prefix: /a/b}"));
        assert!(c("{prefix: /a/b}", "{prefix: /a}"));
        assert!(!c("{prefix: /a}", "{exact: /a/x}"));
        assert!(c("{exact: /a}", "{prefix: /a}"));
        assert!(!c("{exact: /a}", "{exact: /a}"));
        assert!(c("{exact: /a}", "{exact: /b}"));
        assert!(c("{regex: /a.*}", "{prefix: /a}"));
        assert!(c("{prefix: /a}", "{regex: /a.*}"));
        assert!(!string_match_conflict(None, Some(&sm("{exact: /x}"))));
        let m = |y: &str| -> HttpMatchRequest { serde_yaml_ng::from_str(y).unwrap() };
        assert!(has_conflict(&m("{port: 80}"), &m("{port: 81}")));
        assert!(has_conflict(
            &m("{sourceNamespace: a}"),
            &m("{sourceNamespace: b}")
        ));
        assert!(has_conflict(
            &m("{gateways: [g]}"),
            &m("{gateways: [g, h]}")
        ));
        assert!(!has_conflict(
            &m("{gateways: [g, h]}"),
            &m("{gateways: [g]}")
        ));
        assert!(has_conflict(&m("{ignoreUriCase: true}"), &m("{}")));
    }
}
