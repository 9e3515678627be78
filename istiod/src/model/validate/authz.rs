//! Validation of AuthorizationPolicy, with the rules of Istio's
//! `ValidateAuthorizationPolicy`, and the policy scope both request-level
//! security kinds share.

use super::super::security::attributes::{is_path_template, known_when_key, parse_cidr};
use super::super::security::{
    AuthorizationAction, AuthorizationPolicy, Condition, Operation, PolicyTargetReference, Rule,
    Source,
};
use super::{Errors, check_policy_selector};

/// Shared by both kinds: `selector` and `targetRef(s)` are exclusive, and
/// a reference names a Gateway API `Gateway` or a Kubernetes `Service` of
/// the policy's own namespace (Istio's `validatePolicyTargetReference`).
/// Istio also admits `GatewayClass` and `ServiceEntry`, which attach to
/// waypoints only: this istiod serves none, so they are refused rather than
/// accepted and never applied.
pub(super) fn scope(
    selector: bool,
    target_ref: Option<&PolicyTargetReference>,
    target_refs: &[PolicyTargetReference],
    e: &mut Errors,
) {
    if selector && (target_ref.is_some() || !target_refs.is_empty()) {
        e.add(
            "spec.targetRef",
            "selector and targetRef(s) are mutually exclusive (keep one of them)",
        );
    }
    if target_ref.is_some() && !target_refs.is_empty() {
        e.add(
            "spec.targetRef",
            "only one of targetRef or targetRefs can be set (use targetRefs)",
        );
    }
    if let Some(r) = target_ref {
        target_reference("spec.targetRef", r, e);
    }
    for (i, r) in target_refs.iter().enumerate() {
        target_reference(&format!("spec.targetRefs[{i}]"), r, e);
    }
}

fn target_reference(field: &str, r: &PolicyTargetReference, e: &mut Errors) {
    if r.name.is_empty() {
        e.add(format!("{field}.name"), "must be set");
    }
    if !r.namespace.is_empty() {
        e.add(
            format!("{field}.namespace"),
            "must not be set; cross namespace referencing is not supported",
        );
    }
    if r.names_gateway() || r.names_service() {
        return;
    }
    let reason = match r.kind.as_str() {
        "GatewayClass" | "ServiceEntry" => format!(
            "{}/{} attaches the policy to waypoints, which this istiod does not serve (name a gateway.networking.k8s.io/Gateway or a Service)",
            r.group, r.kind
        ),
        _ => format!(
            "must be to one of gateway.networking.k8s.io/Gateway or core/Service but was {}/{}",
            r.group, r.kind
        ),
    };
    e.add(field, reason);
}

pub(super) fn authorization_policy(ap: &AuthorizationPolicy, e: &mut Errors) {
    if let Some(sel) = &ap.selector {
        check_policy_selector("spec.selector", sel, e);
    }
    scope(
        ap.selector.is_some(),
        ap.target_ref.as_ref(),
        &ap.target_refs,
        e,
    );
    match (ap.action, &ap.provider) {
        (AuthorizationAction::Custom, None) => e.add(
            "spec.provider",
            "is required with action CUSTOM (name one of the mesh config's extensionProviders)",
        ),
        (AuthorizationAction::Custom, Some(p)) if p.name.is_empty() => e.add(
            "spec.provider.name",
            "is required (one of the mesh config's extensionProviders)",
        ),
        (AuthorizationAction::Custom, _) | (_, None) => {}
        (_, Some(_)) => e.add(
            "spec.provider",
            "is only allowed with action CUSTOM (remove it, or set action: CUSTOM)",
        ),
    }
    for (i, rule) in ap.rules.iter().enumerate() {
        self::rule(&format!("spec.rules[{i}]"), rule, e);
    }
}

fn rule(field: &str, r: &Rule, e: &mut Errors) {
    for (i, from) in r.from.iter().enumerate() {
        let f = format!("{field}.from[{i}].source");
        match &from.source {
            None => e.add(f, "is required in a from entry"),
            Some(s) if *s == Source::default() => {
                e.add(f, "must not be empty (set at least one field)")
            }
            Some(s) => source(&f, s, e),
        }
    }
    for (i, to) in r.to.iter().enumerate() {
        let f = format!("{field}.to[{i}].operation");
        match &to.operation {
            None => e.add(f, "is required in a to entry"),
            Some(o) if *o == Operation::default() => {
                e.add(f, "must not be empty (set at least one field)")
            }
            Some(o) => operation(&f, o, e),
        }
    }
    for (i, c) in r.when.iter().enumerate() {
        condition(&format!("{field}.when[{i}]"), c, e);
    }
}

/// Istio's wildcard rule: `*` alone, or once at the start or the end.
fn wildcards(field: &str, values: &[String], e: &mut Errors) {
    for (i, v) in values.iter().enumerate() {
        if v.is_empty() {
            e.add(format!("{field}[{i}]"), "must not be empty");
        } else if v != "*"
            && v.trim_start_matches('*')
                .trim_end_matches('*')
                .contains('*')
            || v.starts_with("**")
            || v.ends_with("**")
            || (v.len() > 1 && v.starts_with('*') && v.ends_with('*'))
        {
            e.add(
                format!("{field}[{i}]"),
                format!("{v:?}: `*` is only allowed alone, as a prefix or as a suffix"),
            );
        }
    }
}

fn ips(field: &str, values: &[String], e: &mut Errors) {
    for (i, v) in values.iter().enumerate() {
        if parse_cidr(v).is_none() {
            e.add(
                format!("{field}[{i}]"),
                format!("{v:?} is not an IP address or CIDR (e.g. 10.0.0.1 or 10.0.0.0/16)"),
            );
        }
    }
}

fn ports(field: &str, values: &[String], e: &mut Errors) {
    for (i, v) in values.iter().enumerate() {
        if !matches!(v.parse::<u16>(), Ok(1..)) {
            e.add(
                format!("{field}[{i}]"),
                format!("{v:?} is not a port (1-65535)"),
            );
        }
    }
}

fn source(f: &str, s: &Source, e: &mut Errors) {
    for (name, values) in [
        ("principals", &s.principals),
        ("notPrincipals", &s.not_principals),
        ("requestPrincipals", &s.request_principals),
        ("notRequestPrincipals", &s.not_request_principals),
        ("namespaces", &s.namespaces),
        ("notNamespaces", &s.not_namespaces),
    ] {
        wildcards(&format!("{f}.{name}"), values, e);
    }
    for (name, values) in [
        ("serviceAccounts", &s.service_accounts),
        ("notServiceAccounts", &s.not_service_accounts),
    ] {
        for (i, v) in values.iter().enumerate() {
            let ok = match v.split_once('/') {
                Some((ns, sa)) => !ns.is_empty() && !sa.is_empty() && !sa.contains('/'),
                None => !v.is_empty(),
            };
            if !ok || v.contains('*') {
                e.add(
                    format!("{f}.{name}[{i}]"),
                    format!("{v:?} is not a service account (<namespace>/<name>, no wildcards)"),
                );
            }
        }
    }
    for (name, values) in [
        ("ipBlocks", &s.ip_blocks),
        ("notIpBlocks", &s.not_ip_blocks),
        ("remoteIpBlocks", &s.remote_ip_blocks),
        ("notRemoteIpBlocks", &s.not_remote_ip_blocks),
    ] {
        ips(&format!("{f}.{name}"), values, e);
    }
}

fn paths(field: &str, values: &[String], e: &mut Errors) {
    for (i, v) in values.iter().enumerate() {
        let f = format!("{field}[{i}]");
        if !is_path_template(v) {
            wildcards(field, std::slice::from_ref(v), e);
            continue;
        }
        // Istio's path template rules: a path of `/` segments, each literal
        // or one `{*}` / `{**}`, `{**}` only as the last operator.
        let segments: Vec<&str> = v.split('/').collect();
        let bad_segment = segments.iter().any(|s| {
            (s.contains('{') || s.contains('}') || s.contains('*')) && *s != "{*}" && *s != "{**}"
        });
        let last_double = segments.iter().rposition(|s| *s == "{**}");
        let last_op = segments.iter().rposition(|s| *s == "{*}" || *s == "{**}");
        if !v.starts_with('/') || bad_segment || (last_double.is_some() && last_double != last_op) {
            e.add(
                f,
                format!(
                    "{v:?} is not a path template: start with /, use {{*}} or {{**}} as whole segments, {{**}} only as the last operator"
                ),
            );
        }
    }
}

fn operation(f: &str, o: &Operation, e: &mut Errors) {
    for (name, values) in [("hosts", &o.hosts), ("notHosts", &o.not_hosts)] {
        wildcards(&format!("{f}.{name}"), values, e);
    }
    for (name, values) in [("methods", &o.methods), ("notMethods", &o.not_methods)] {
        wildcards(&format!("{f}.{name}"), values, e);
    }
    for (name, values) in [("ports", &o.ports), ("notPorts", &o.not_ports)] {
        ports(&format!("{f}.{name}"), values, e);
    }
    for (name, values) in [("paths", &o.paths), ("notPaths", &o.not_paths)] {
        paths(&format!("{f}.{name}"), values, e);
    }
}

fn condition(f: &str, c: &Condition, e: &mut Errors) {
    if !known_when_key(&c.key) {
        e.add(
            format!("{f}.key"),
            format!(
                "{:?} is not a known key (request.headers[<name>], source.ip, remote.ip, source.namespace, source.principal, source.serviceAccount, request.auth.principal, request.auth.audiences, request.auth.presenter, request.auth.claims[<claim>], destination.ip, destination.port, connection.sni, experimental.envoy.filters.<filter>[<key>])",
                c.key
            ),
        );
        return;
    }
    if c.values.is_empty() && c.not_values.is_empty() {
        e.add(f, format!("key {:?} needs values or notValues", c.key));
    }
    for (name, values) in [("values", &c.values), ("notValues", &c.not_values)] {
        let vf = format!("{f}.{name}");
        match c.key.as_str() {
            "source.ip" | "remote.ip" | "destination.ip" => ips(&vf, values, e),
            "destination.port" => ports(&vf, values, e),
            "source.serviceAccount" => {
                for (i, v) in values.iter().enumerate() {
                    if v.is_empty() || v.contains('*') || v.matches('/').count() > 1 {
                        e.add(
                            format!("{vf}[{i}]"),
                            format!("{v:?} is not a service account (<namespace>/<name>)"),
                        );
                    }
                }
            }
            k if k.starts_with("experimental.envoy.filters.") => {}
            _ => wildcards(&vf, values, e),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::model::parse_file;

    fn errors(spec: &str) -> Vec<String> {
        let yaml = format!(
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: p, namespace: demo}}\nspec:\n{spec}\n"
        );
        match parse_file("bad.yaml", &yaml) {
            Ok(_) => Vec::new(),
            Err(errs) => errs.iter().map(ToString::to_string).collect(),
        }
    }

    #[track_caller]
    fn refused(spec: &str, field: &str, needle: &str) {
        let errs = errors(spec);
        assert!(
            errs.iter()
                .any(|e| e.contains(&format!("{field}: ")) && e.contains(needle)),
            "expected {field}: ...{needle}...; got {errs:?}"
        );
    }

    #[test]
    fn accepts_istio_examples() {
        for spec in [
            "  rules: [{}]",
            "  {}",
            "  action: DENY\n  rules: [{from: [{source: {notNamespaces: [\"*-system\"]}}], to: [{operation: {paths: [\"/admin*\", \"/v1/{*}/x/{**}\"]}}]}]",
            "  action: CUSTOM\n  provider: {name: ext}\n  rules: [{to: [{operation: {hosts: [\"*.example.com\"]}}]}]",
            "  rules: [{when: [{key: \"request.auth.claims[groups][a]\", values: [x]}, {key: source.ip, notValues: [10.0.0.0/8]}, {key: destination.port, values: [\"80\"]}, {key: \"experimental.envoy.filters.network.mysql_proxy[db.table]\", values: [\"[update]\"]}]}]",
            "  rules: [{from: [{source: {serviceAccounts: [demo/sleep], requestPrincipals: [\"iss/*\"]}}]}]",
            "  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: edge}]\n  rules: [{}]",
            "  targetRef: {group: \"\", kind: Service, name: istio-ingressgateway}\n  rules: [{}]",
        ] {
            assert_eq!(errors(spec), Vec::<String>::new(), "{spec}");
        }
    }

    #[test]
    fn refuses_target_references_it_cannot_attach() {
        refused(
            "  targetRefs: [{group: gateway.networking.k8s.io, kind: GatewayClass, name: istio-waypoint}]",
            "spec.targetRefs[0]",
            "waypoints",
        );
        refused(
            "  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: r}]",
            "spec.targetRefs[0]",
            "must be to one of",
        );
        refused(
            "  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: edge, namespace: other}]",
            "spec.targetRefs[0].namespace",
            "cross namespace",
        );
        refused(
            "  selector: {matchLabels: {app: a}}\n  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: edge}]",
            "spec.targetRef",
            "mutually exclusive",
        );
    }

    #[test]
    fn refuses_with_messages() {
        refused(
            "  action: CUSTOM",
            "spec.provider",
            "is required with action CUSTOM",
        );
        refused(
            "  provider: {name: x}",
            "spec.provider",
            "only allowed with action CUSTOM",
        );
        refused(
            "  rules: [{from: [{}]}]",
            "spec.rules[0].from[0].source",
            "is required",
        );
        refused(
            "  rules: [{from: [{source: {}}]}]",
            "spec.rules[0].from[0].source",
            "must not be empty",
        );
        refused(
            "  rules: [{to: [{operation: {}}]}]",
            "spec.rules[0].to[0].operation",
            "must not be empty",
        );
        refused(
            "  rules: [{when: [{key: request.foo, values: [x]}]}]",
            "spec.rules[0].when[0].key",
            "not a known key",
        );
        refused(
            "  rules: [{when: [{key: \"request.headers[x]\"}]}]",
            "spec.rules[0].when[0]",
            "needs values or notValues",
        );
        refused(
            "  rules: [{when: [{key: source.ip, values: [1.2.3]}]}]",
            "spec.rules[0].when[0].values[0]",
            "not an IP address",
        );
        refused(
            "  rules: [{from: [{source: {ipBlocks: [10.0.0.0/40]}}]}]",
            "spec.rules[0].from[0].source.ipBlocks[0]",
            "not an IP address",
        );
        refused(
            "  rules: [{to: [{operation: {ports: [\"70000\"]}}]}]",
            "spec.rules[0].to[0].operation.ports[0]",
            "not a port",
        );
        refused(
            "  rules: [{from: [{source: {principals: [\"a*b\"]}}]}]",
            "spec.rules[0].from[0].source.principals[0]",
            "only allowed alone, as a prefix or as a suffix",
        );
        refused(
            "  rules: [{to: [{operation: {paths: [\"/a/{**}/b/{*}\"]}}]}]",
            "spec.rules[0].to[0].operation.paths[0]",
            "not a path template",
        );
        refused(
            "  rules: [{from: [{source: {serviceAccounts: [\"a/b/c\"]}}]}]",
            "spec.rules[0].from[0].source.serviceAccounts[0]",
            "not a service account",
        );
    }
}
