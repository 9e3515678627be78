//! EnvoyFilter rules (Istio's `ValidateEnvoyFilter`), and more: every
//! field istiod accepts is applied at generation, so what it cannot apply
//! (ECDS, the bootstrap, listener filters, filter classes, `portName` of
//! listeners, targets other than Gateway API Gateways) is refused here,
//! and a patch value must decode as the Envoy type its `applyTo` names.

use super::super::envoy_filter::{
    ApplyTo, EnvoyConfigObjectMatch, EnvoyConfigObjectPatch, EnvoyFilter, FilterClass, Operation,
    PatchContext, PolicyTargetReference,
};
use super::{Errors, check_selector};

/// The Gateway API group a `targetRefs` entry may name.
const GATEWAY_API_GROUP: &str = "gateway.networking.k8s.io";

pub(super) fn envoy_filter(ef: &EnvoyFilter, namespace: &str, e: &mut Errors) {
    if let Some(sel) = &ef.workload_selector {
        check_selector("spec.workloadSelector", sel, e);
        if !ef.target_refs.is_empty() {
            e.add(
                "spec.targetRefs",
                "only one of targetRefs or workloadSelector can be set (remove one)",
            );
        }
    }
    for (i, target) in ef.target_refs.iter().enumerate() {
        target_ref(&format!("spec.targetRefs[{i}]"), target, namespace, e);
    }
    for (i, cp) in ef.config_patches.iter().enumerate() {
        config_patch(&format!("spec.configPatches[{i}]"), cp, e);
    }
}

fn target_ref(field: &str, t: &PolicyTargetReference, namespace: &str, e: &mut Errors) {
    if t.group != GATEWAY_API_GROUP || t.kind != "Gateway" {
        e.add(
            field,
            format!(
                "{}/{} cannot be targeted: this istiod applies EnvoyFilters to Gateway API Gateways ({GATEWAY_API_GROUP}/Gateway) only (use workloadSelector for other workloads)",
                t.group, t.kind
            ),
        );
    }
    if t.name.is_empty() {
        e.add(format!("{field}.name"), "is required (name the Gateway)");
    }
    if !t.namespace.is_empty() && t.namespace != namespace {
        e.add(
            format!("{field}.namespace"),
            format!(
                "{:?} is not the EnvoyFilter's namespace {namespace:?} (cross-namespace targets are not allowed)",
                t.namespace
            ),
        );
    }
}

fn config_patch(field: &str, cp: &EnvoyConfigObjectPatch, e: &mut Errors) {
    let apply_to = cp.apply_to;
    match apply_to {
        ApplyTo::Invalid => {
            e.add(
                format!("{field}.applyTo"),
                "is required (LISTENER, FILTER_CHAIN, NETWORK_FILTER, HTTP_FILTER, ROUTE_CONFIGURATION, VIRTUAL_HOST, HTTP_ROUTE or CLUSTER)",
            );
            return;
        }
        ApplyTo::ExtensionConfig => {
            e.add(
                format!("{field}.applyTo"),
                "EXTENSION_CONFIG is not applied: this istiod serves no extension config discovery (ECDS); patch the filter itself with HTTP_FILTER or NETWORK_FILTER",
            );
            return;
        }
        ApplyTo::Bootstrap => {
            e.add(
                format!("{field}.applyTo"),
                "BOOTSTRAP is not applied: the agent writes Envoy's bootstrap and istiod cannot patch it (use ProxyConfig or the agent's bootstrap override)",
            );
            return;
        }
        ApplyTo::ListenerFilter => {
            e.add(
                format!("{field}.applyTo"),
                "LISTENER_FILTER is not applied by this istiod (patch the LISTENER with MERGE instead)",
            );
            return;
        }
        _ => {}
    }
    if let Some(m) = &cp.match_ {
        object_match(&format!("{field}.match"), apply_to, m, e);
    }
    let Some(patch) = &cp.patch else {
        e.add(
            format!("{field}.patch"),
            "is required (give an operation and, except for REMOVE, a value)",
        );
        return;
    };
    let op = patch.operation;
    if op == Operation::Invalid {
        e.add(
            format!("{field}.patch.operation"),
            "is required (MERGE, ADD, REMOVE, INSERT_BEFORE, INSERT_AFTER, INSERT_FIRST or REPLACE)",
        );
        return;
    }
    if !apply_to.operations().contains(&op) {
        e.add(
            format!("{field}.patch.operation"),
            format!(
                "{op:?} does not apply to {apply_to:?} (use one of {:?})",
                apply_to.operations()
            ),
        );
    }
    if patch.filter_class != FilterClass::Unspecified {
        e.add(
            format!("{field}.patch.filterClass"),
            "is not applied: this istiod adds no Istio authn/authz/stats filters to order against (remove it and place the filter with INSERT_BEFORE/INSERT_AFTER)",
        );
    }
    relative_target(field, apply_to, op, cp.match_.as_ref(), e);
    match (&patch.value, op) {
        (Some(_), Operation::Remove) => e.add(
            format!("{field}.patch.value"),
            "REMOVE takes no value (remove the value)",
        ),
        (None, Operation::Remove) => {}
        (None, _) => e.add(
            format!("{field}.patch.value"),
            format!("is required for {op:?} (give the Envoy object in proto-JSON)"),
        ),
        (Some(value), _) => {
            if let Some(type_name) = apply_to.envoy_type()
                && let Err(err) = proto::envoy_json::encode_json(type_name, value)
            {
                e.add(format!("{field}.patch.value"), err.to_string());
            }
        }
    }
}

/// The filter an INSERT or REPLACE is relative to, where Istio needs one.
fn relative_target(
    field: &str,
    apply_to: ApplyTo,
    op: Operation,
    m: Option<&EnvoyConfigObjectMatch>,
    e: &mut Errors,
) {
    let filter = m
        .and_then(|m| m.listener.as_ref())
        .and_then(|l| l.filter_chain.as_ref())
        .and_then(|fc| fc.filter.as_ref());
    match (apply_to, op) {
        (ApplyTo::NetworkFilter, Operation::Replace)
            if filter.is_none_or(|f| f.name.is_empty()) =>
        {
            e.add(
                format!("{field}.match.listener.filterChain.filter.name"),
                "is required for REPLACE (name the network filter to replace)",
            );
        }
        (ApplyTo::HttpFilter, Operation::Replace)
            if filter
                .and_then(|f| f.sub_filter.as_ref())
                .is_none_or(|s| s.name.is_empty()) =>
        {
            e.add(
                format!("{field}.match.listener.filterChain.filter.subFilter.name"),
                "is required for REPLACE (name the HTTP filter to replace)",
            );
        }
        _ => {}
    }
}

fn object_match(field: &str, apply_to: ApplyTo, m: &EnvoyConfigObjectMatch, e: &mut Errors) {
    if let Some(proxy) = &m.proxy
        && !proxy.proxy_version.is_empty()
        && let Err(err) = regex::Regex::new(&proxy.proxy_version)
    {
        e.add(
            format!("{field}.proxy.proxyVersion"),
            format!("is not a valid regular expression: {err}"),
        );
    }
    if let Some(l) = &m.listener {
        if !apply_to.is_listener() {
            e.add(
                format!("{field}.listener"),
                format!("a listener match does not apply to {apply_to:?} (use cluster or routeConfiguration)"),
            );
        }
        if !l.port_name.is_empty() {
            e.add(
                format!("{field}.listener.portName"),
                "is not applied (Istio does not implement it; use portNumber)",
            );
        }
        if !l.listener_filter.is_empty() {
            e.add(
                format!("{field}.listener.listenerFilter"),
                "is not applied: LISTENER_FILTER patches are not supported by this istiod",
            );
        }
        if l.port_number > 65535 {
            e.add(
                format!("{field}.listener.portNumber"),
                "is out of range (use 1-65535)",
            );
        }
        if apply_to == ApplyTo::Listener && l.filter_chain.is_some() {
            e.add(
                format!("{field}.listener.filterChain"),
                "does not apply to LISTENER patches (match the listener by name or port)",
            );
        }
        if let Some(fc) = &l.filter_chain
            && fc.filter.as_ref().is_some_and(|f| f.sub_filter.is_some())
            && apply_to != ApplyTo::HttpFilter
        {
            e.add(
                format!("{field}.listener.filterChain.filter.subFilter"),
                "applies to HTTP_FILTER patches only",
            );
        }
    }
    if m.route_configuration.is_some() && !apply_to.is_route() {
        e.add(
            format!("{field}.routeConfiguration"),
            format!("a route configuration match does not apply to {apply_to:?}"),
        );
    }
    if let Some(rc) = &m.route_configuration
        && rc.vhost.as_ref().is_some_and(|v| v.route.is_some())
        && apply_to != ApplyTo::HttpRoute
    {
        e.add(
            format!("{field}.routeConfiguration.vhost.route"),
            "applies to HTTP_ROUTE patches only",
        );
    }
    if m.cluster.is_some() && apply_to != ApplyTo::Cluster {
        e.add(
            format!("{field}.cluster"),
            format!("a cluster match does not apply to {apply_to:?}"),
        );
    }
    if m.route_configuration.is_some()
        && m.context == PatchContext::SidecarInbound
        && m.route_configuration
            .as_ref()
            .is_some_and(|rc| !rc.gateway.is_empty() || !rc.port_name.is_empty())
    {
        e.add(
            format!("{field}.routeConfiguration"),
            "gateway and portName select gateway routes; they never match in SIDECAR_INBOUND",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{errors, refused};

    const HEADER: &str = "apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: ef, namespace: demo}\n";

    fn errs(spec: &str) -> Vec<String> {
        let errs = errors("ef.yaml", HEADER, spec);
        for e in &errs {
            // Every refusal names the file's object.
            assert!(!e.is_empty());
        }
        errs
    }

    #[test]
    fn a_valid_filter_passes() {
        let e = errs(
            r#"
  workloadSelector: {labels: {app: sleep}}
  priority: -5
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_OUTBOUND
      proxy: {proxyVersion: '^1\..*'}
      listener:
        portNumber: 8000
        filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: envoy.filters.http.router}}}
    patch:
      operation: INSERT_BEFORE
      value:
        name: envoy.filters.http.lua
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
          inlineCode: "function envoy_on_response(h) end"
  - applyTo: CLUSTER
    match: {cluster: {service: httpbin.demo.svc.cluster.local}}
    patch: {operation: REMOVE}
"#,
        );
        assert!(e.is_empty(), "{e:#?}");
    }

    #[test]
    fn a_value_that_does_not_decode_names_the_value() {
        let e = errs(
            r#"
  configPatches:
  - applyTo: CLUSTER
    patch: {operation: MERGE, value: {connectTimeout: 5, bogus: 1}}
"#,
        );
        refused(
            &e,
            "spec.configPatches[0].patch.value",
            "envoy.config.cluster.v3.Cluster",
        );
        let e = errs(
            r#"
  configPatches:
  - applyTo: HTTP_FILTER
    patch:
      operation: ADD
      value: {name: x, typed_config: {"@type": type.googleapis.com/not.a.Type}}
"#,
        );
        refused(&e, "spec.configPatches[0].patch.value", "not.a.Type");
    }

    #[test]
    fn what_cannot_be_applied_is_refused() {
        let e = errs(
            r#"
  targetRefs: [{group: "", kind: Service, name: httpbin}]
  configPatches:
  - applyTo: EXTENSION_CONFIG
    patch: {operation: ADD, value: {name: x}}
  - applyTo: BOOTSTRAP
    patch: {operation: MERGE, value: {}}
  - applyTo: ROUTE_CONFIGURATION
    patch: {operation: ADD, value: {}}
  - applyTo: CLUSTER
    patch: {operation: MERGE, filterClass: AUTHZ, value: {}}
  - applyTo: CLUSTER
    match: {listener: {portNumber: 80}}
    patch: {operation: REMOVE, value: {name: c}}
  - applyTo: NETWORK_FILTER
    patch: {operation: REPLACE, value: {name: n}}
  - applyTo: LISTENER
    patch: {}
  - {}
  - applyTo: LISTENER
    match: {proxy: {proxyVersion: "("}, listener: {portName: http}}
    patch: {operation: ADD, value: {name: l}}
"#,
        );
        refused(&e, "spec.targetRefs[0]", "Gateway API Gateways");
        refused(&e, "spec.configPatches[0].applyTo", "ECDS");
        refused(&e, "spec.configPatches[1].applyTo", "bootstrap");
        refused(
            &e,
            "spec.configPatches[2].patch.operation",
            "does not apply",
        );
        refused(&e, "spec.configPatches[3].patch.filterClass", "not applied");
        refused(
            &e,
            "spec.configPatches[4].match.listener",
            "does not apply to Cluster",
        );
        refused(
            &e,
            "spec.configPatches[4].patch.value",
            "REMOVE takes no value",
        );
        refused(
            &e,
            "spec.configPatches[5].match.listener.filterChain.filter.name",
            "REPLACE",
        );
        refused(&e, "spec.configPatches[6].patch.operation", "is required");
        refused(&e, "spec.configPatches[7].applyTo", "is required");
        refused(
            &e,
            "spec.configPatches[8].match.proxy.proxyVersion",
            "regular expression",
        );
        refused(
            &e,
            "spec.configPatches[8].match.listener.portName",
            "not applied",
        );
    }

    #[test]
    fn selector_and_target_refs_exclude_each_other() {
        let e = errs(
            r#"
  workloadSelector: {labels: {app: x}}
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: gw, namespace: other}]
"#,
        );
        refused(&e, "spec.targetRefs", "only one of");
        refused(&e, "spec.targetRefs[0].namespace", "cross-namespace");
    }
}
