//! Validation of Telemetry, with the rules of Istio's `validateTelemetry`,
//! plus refusals of what this istiod cannot apply to upstream Envoy:
//! `targetRef(s)`, `tracing[].useRequestIdForTraceSampling`,
//! `tracing[].enableIstioTags`, custom tag `formatter`, metrics
//! `tagOverrides`, per-metric overrides other than `ALL_METRICS`, and
//! `reportingInterval`.

use super::super::telemetry::{CustomTag, Telemetry};
use super::{Errors, check_policy_selector};

pub(super) fn telemetry(t: &Telemetry, e: &mut Errors) {
    if let Some(sel) = &t.selector {
        check_policy_selector("spec.selector", sel, e);
    }
    if t.target_ref.is_some() {
        e.add(
            "spec.targetRef",
            "is not supported: this istiod applies Telemetry to sidecars and gateways by namespace and spec.selector (use selector.matchLabels)",
        );
    }
    if !t.target_refs.is_empty() {
        e.add(
            "spec.targetRefs",
            "is not supported: this istiod applies Telemetry to sidecars and gateways by namespace and spec.selector (use selector.matchLabels)",
        );
    }
    for (i, tr) in t.tracing.iter().enumerate() {
        let f = format!("spec.tracing[{i}]");
        if tr.providers.len() > 1 {
            e.add(
                format!("{f}.providers"),
                "at most one tracing provider is supported (Istio uses one; name a single provider)",
            );
        }
        providers_named(&f, tr.providers.iter().map(|p| p.name.as_str()), e);
        if let Some(p) = tr.random_sampling_percentage
            && !(0.0..=100.0).contains(&p)
        {
            e.add(
                format!("{f}.randomSamplingPercentage"),
                format!("{p} is not a percentage (use 0.0 to 100.0)"),
            );
        }
        if tr.use_request_id_for_trace_sampling.is_some() {
            e.add(
                format!("{f}.useRequestIdForTraceSampling"),
                "is not supported (remove it; Envoy's default, sampling by request ID, applies)",
            );
        }
        if tr.enable_istio_tags.is_some() {
            e.add(
                format!("{f}.enableIstioTags"),
                "is not supported: Istio's own span tags need its node metadata filters (remove it)",
            );
        }
        for (name, tag) in &tr.custom_tags {
            custom_tag(&format!("{f}.customTags.{name}"), tag, e);
        }
    }
    for (i, al) in t.access_logging.iter().enumerate() {
        let f = format!("spec.accessLogging[{i}]");
        providers_named(&f, al.providers.iter().map(|p| p.name.as_str()), e);
        if let Some(filter) = &al.filter
            && filter.expression.trim().is_empty()
        {
            e.add(
                format!("{f}.filter.expression"),
                "must not be empty (give a CEL expression, e.g. response.code >= 400, or remove filter)",
            );
        } else if let Some(filter) = &al.filter
            && let Err(why) = balanced(&filter.expression)
        {
            e.add(
                format!("{f}.filter.expression"),
                format!("is not a CEL expression: {why}"),
            );
        }
    }
    for (i, m) in t.metrics.iter().enumerate() {
        let f = format!("spec.metrics[{i}]");
        providers_named(&f, m.providers.iter().map(|p| p.name.as_str()), e);
        if m.reporting_interval.is_some() {
            e.add(
                format!("{f}.reportingInterval"),
                "is not supported (remove it; metrics are read when Prometheus scrapes)",
            );
        }
        for (j, o) in m.overrides.iter().enumerate() {
            let of = format!("{f}.overrides[{j}]");
            if !o.tag_overrides.is_empty() {
                e.add(
                    format!("{of}.tagOverrides"),
                    "is not supported: the standard metrics' labels are fixed (remove it)",
                );
            }
            let Some(sel) = &o.match_ else { continue };
            if sel.custom_metric.is_some() {
                e.add(
                    format!("{of}.match.customMetric"),
                    "is not supported: overrides apply to ALL_METRICS only (remove it)",
                );
            }
            if let Some(metric) = sel.metric.as_deref()
                && metric != "ALL_METRICS"
            {
                e.add(
                    format!("{of}.match.metric"),
                    format!(
                        "{metric:?} is not supported: overrides apply to ALL_METRICS only (use ALL_METRICS or remove match.metric)"
                    ),
                );
            }
        }
    }
}

/// Why a CEL expression's brackets or quotes do not pair up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Unbalanced {
    /// A closing bracket without its opening one.
    #[error("unexpected {0:?}")]
    Unexpected(char),
    /// A quote is not closed.
    #[error("a string is not closed")]
    OpenString,
    /// An opening bracket is not closed.
    #[error("{0:?} is not closed")]
    Open(char),
}

/// A first check of a CEL expression (Envoy parses it, and would reject
/// the whole listener update): brackets and quotes must pair up.
fn balanced(expr: &str) -> Result<(), Unbalanced> {
    let mut open: Vec<char> = Vec::new();
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in expr.chars() {
        if let Some(q) = quote {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                _ if c == q => quote = None,
                _ => {}
            }
            continue;
        }
        match c {
            '\'' | '"' => quote = Some(c),
            '(' | '[' | '{' => open.push(c),
            ')' | ']' | '}' => {
                let want = match c {
                    ')' => '(',
                    ']' => '[',
                    _ => '{',
                };
                if open.pop() != Some(want) {
                    return Err(Unbalanced::Unexpected(c));
                }
            }
            _ => {}
        }
    }
    if quote.is_some() {
        return Err(Unbalanced::OpenString);
    }
    match open.last() {
        Some(c) => Err(Unbalanced::Open(*c)),
        None => Ok(()),
    }
}

fn providers_named<'a>(field: &str, names: impl Iterator<Item = &'a str>, e: &mut Errors) {
    for (i, n) in names.enumerate() {
        if n.is_empty() {
            e.add(
                format!("{field}.providers[{i}].name"),
                "is required (an extensionProviders[].name of the mesh config)",
            );
        }
    }
}

fn custom_tag(field: &str, tag: &CustomTag, e: &mut Errors) {
    if tag.formatter.is_some() {
        e.add(
            format!("{field}.formatter"),
            "is not supported (use literal, environment or header)",
        );
    }
    let set = [
        tag.literal.is_some(),
        tag.environment.is_some(),
        tag.header.is_some(),
        tag.formatter.is_some(),
    ]
    .into_iter()
    .filter(|s| *s)
    .count();
    if set != 1 {
        e.add(
            field,
            "must have exactly one of literal, environment or header",
        );
    }
    for (kind, named) in [("environment", &tag.environment), ("header", &tag.header)] {
        if named.as_ref().is_some_and(|n| n.name.is_empty()) {
            e.add(format!("{field}.{kind}.name"), "is required");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{errors, refused};

    const T: &str = "apiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: t, namespace: demo}\n";

    #[test]
    fn accepts_what_is_applied() {
        let errs = errors(
            "t.yaml",
            T,
            "{selector: {matchLabels: {app: sleep}}, accessLogging: [{providers: [{name: envoy}], disabled: false, match: {mode: CLIENT}}], tracing: [{providers: [{name: zipkin}], randomSamplingPercentage: 50, disableSpanReporting: false, customTags: {a: {literal: {value: v}}, b: {environment: {name: POD_NAME, defaultValue: x}}, c: {header: {name: x-c}}}}], metrics: [{providers: [{name: prometheus}], overrides: [{match: {metric: ALL_METRICS, mode: SERVER}, disabled: true}]}]}",
        );
        assert!(errs.is_empty(), "{errs:#?}");
        let v1alpha1 = "apiVersion: telemetry.istio.io/v1alpha1\nkind: Telemetry\nmetadata: {name: t, namespace: demo}\n";
        assert!(errors("t.yaml", v1alpha1, "{accessLogging: [{}]}").is_empty());
    }

    #[test]
    fn refuses_what_cannot_be_applied() {
        let errs = errors(
            "t.yaml",
            T,
            "{targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: gw}], tracing: [{providers: [{name: a}, {name: b}], randomSamplingPercentage: 101, useRequestIdForTraceSampling: true, customTags: {f: {formatter: {value: '%X%'}}, e: {}}}], metrics: [{reportingInterval: 5s, overrides: [{match: {metric: REQUEST_COUNT}, disabled: true}, {match: {customMetric: m}, tagOverrides: {x: {operation: REMOVE}}}]}], accessLogging: [{providers: [{name: ''}], filter: {expression: ''}}]}",
        );
        refused(&errs, "spec.targetRefs", "not supported");
        refused(&errs, "spec.tracing[0].providers", "at most one");
        refused(&errs, "spec.tracing[0].randomSamplingPercentage", "101");
        refused(
            &errs,
            "spec.tracing[0].useRequestIdForTraceSampling",
            "not supported",
        );
        refused(
            &errs,
            "spec.tracing[0].customTags.f.formatter",
            "not supported",
        );
        refused(&errs, "spec.tracing[0].customTags.e", "exactly one");
        refused(&errs, "spec.metrics[0].reportingInterval", "not supported");
        refused(
            &errs,
            "spec.metrics[0].overrides[0].match.metric",
            "REQUEST_COUNT",
        );
        refused(
            &errs,
            "spec.metrics[0].overrides[1].match.customMetric",
            "not supported",
        );
        refused(
            &errs,
            "spec.metrics[0].overrides[1].tagOverrides",
            "not supported",
        );
        refused(&errs, "spec.accessLogging[0].providers[0].name", "required");
        refused(&errs, "spec.accessLogging[0].filter.expression", "empty");
        let errs = errors(
            "t.yaml",
            T,
            "{accessLogging: [{filter: {expression: \"has(request.headers['x'] && response.code >= 400\"}}]}",
        );
        refused(
            &errs,
            "spec.accessLogging[0].filter.expression",
            "not closed",
        );
        let ok = errors(
            "t.yaml",
            T,
            "{accessLogging: [{filter: {expression: \"request.headers['x-a)'] == 'b' || response.code >= 400\"}}]}",
        );
        assert!(ok.is_empty(), "{ok:?}");
        // Unknown fields and modes are decode errors naming the field.
        let errs = errors("t.yaml", T, "{accessLogging: [{match: {mode: BOTH}}]}");
        assert!(!errs.is_empty());
    }
}
