//! Which request-level policies (AuthorizationPolicy, RequestAuthentication)
//! attach to a proxy, as Istio's `WorkloadPolicyMatcher.ShouldAttachPolicy`
//! decides it:
//!
//! - a policy of the root namespace or of the proxy's own namespace only;
//! - without `targetRef(s)`: when it has no selector (namespace- or
//!   mesh-wide), or its `matchLabels` are a subset of the proxy's labels
//!   (Gateway API gateways too, Istio's default
//!   `ENABLE_SELECTOR_BASED_K8S_GATEWAY_POLICY=true`);
//! - with `targetRef(s)`: only a policy of the proxy's own namespace, and
//!   only when a reference (in that namespace) names
//!   - a Gateway API `Gateway` whose instance the proxy is (its
//!     `gateway.networking.k8s.io/gateway-name` label), or
//!   - a Kubernetes `Service` that the router proxy backs (one of its
//!     addresses is an endpoint of the Service). Istio attaches a Service
//!     reference to waypoints only, which this istiod does not serve; here
//!     it reaches the gateway Pods behind the Service, which is what a
//!     policy naming an ingress gateway's Service means in sidecar mode.
//!
//! A sidecar is never reached by a `targetRef`, as in Istio.

use common::ProxyType;

use crate::model::ROOT_NAMESPACE;
use crate::model::gateway_api::GATEWAY_NAME_LABEL;
use crate::model::istio::PolicySelector;
use crate::model::security::PolicyTargetReference;
use crate::model::service::ServiceSource;
use crate::pushctx::Proxy;
use crate::pushctx::context::IstioContext;

/// A policy's scope: where it lives and how it picks workloads.
pub struct PolicyScope<'a> {
    /// The policy's namespace.
    pub namespace: &'a str,
    /// `selector`.
    pub selector: Option<&'a PolicySelector>,
    /// `targetRef` and `targetRefs` together (Istio's `GetTargetRefs`:
    /// `targetRefs` when set, else the legacy `targetRef`).
    pub target_refs: Vec<&'a PolicyTargetReference>,
}

impl<'a> PolicyScope<'a> {
    /// The scope of a policy with these fields.
    pub fn new(
        namespace: &'a str,
        selector: Option<&'a PolicySelector>,
        target_ref: Option<&'a PolicyTargetReference>,
        target_refs: &'a [PolicyTargetReference],
    ) -> Self {
        let target_refs = if target_refs.is_empty() {
            target_ref.into_iter().collect()
        } else {
            target_refs.iter().collect()
        };
        Self {
            namespace,
            selector,
            target_refs,
        }
    }
}

/// Whether a policy with `scope` attaches to `proxy`.
pub fn attaches(ctx: &IstioContext, proxy: &Proxy, scope: &PolicyScope<'_>) -> bool {
    if scope.namespace != ROOT_NAMESPACE && scope.namespace != proxy.namespace {
        return false;
    }
    if scope.target_refs.is_empty() {
        return scope.selector.is_none_or(|s| {
            s.match_labels
                .iter()
                .all(|(k, v)| proxy.labels.get(k) == Some(v))
        });
    }
    if scope.namespace != proxy.namespace {
        return false;
    }
    scope.target_refs.iter().any(|r| {
        if !(r.namespace.is_empty() || r.namespace == proxy.namespace) {
            return false;
        }
        if r.names_gateway() {
            proxy.labels.get(GATEWAY_NAME_LABEL) == Some(&r.name)
        } else if r.names_service() {
            proxy.proxy_type == ProxyType::Router && backs_service(ctx, proxy, &r.name)
        } else {
            false
        }
    })
}

/// Whether one of `proxy`'s addresses is an endpoint of the Kubernetes
/// Service `name` in its namespace.
fn backs_service(ctx: &IstioContext, proxy: &Proxy, name: &str) -> bool {
    let hostname = format!("{name}.{}.svc.{}", proxy.namespace, ctx.domain);
    ctx.registry.by_hostname(&hostname).any(|svc| {
        svc.source == ServiceSource::Kubernetes
            && svc.namespace == proxy.namespace
            && svc
                .endpoints
                .iter()
                .any(|e| proxy.ips.iter().any(|ip| ip == &e.address))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::security::GATEWAY_API_GROUP;
    use std::collections::BTreeMap;

    fn proxy(ns: &str, labels: &[(&str, &str)], router: bool) -> Proxy {
        Proxy {
            proxy_type: if router {
                ProxyType::Router
            } else {
                ProxyType::Sidecar
            },
            namespace: ns.into(),
            ips: vec!["198.18.0.9".into()],
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn gateway_ref(name: &str) -> PolicyTargetReference {
        PolicyTargetReference {
            group: GATEWAY_API_GROUP.into(),
            kind: "Gateway".into(),
            name: name.into(),
            namespace: String::new(),
        }
    }

    fn selector(labels: &[(&str, &str)]) -> PolicySelector {
        PolicySelector {
            match_labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    #[test]
    fn selectors_pick_gateway_pods_like_any_workload() {
        let ctx = crate::pushctx::context::context_of_yaml("");
        let gw = proxy("istio-system", &[("istio", "ingressgateway")], true);
        let sel = selector(&[("istio", "ingressgateway")]);
        let other = selector(&[("istio", "egressgateway")]);
        assert!(attaches(
            &ctx,
            &gw,
            &PolicyScope::new("istio-system", Some(&sel), None, &[])
        ));
        assert!(!attaches(
            &ctx,
            &gw,
            &PolicyScope::new("istio-system", Some(&other), None, &[])
        ));
        // Another namespace's policy never reaches it.
        assert!(!attaches(
            &ctx,
            &gw,
            &PolicyScope::new("default", None, None, &[])
        ));
    }

    #[test]
    fn gateway_references_reach_only_that_gateways_instances() {
        let ctx = crate::pushctx::context::context_of_yaml("");
        let refs = [gateway_ref("edge")];
        let edge = proxy("web", &[(GATEWAY_NAME_LABEL, "edge")], true);
        let other = proxy("web", &[(GATEWAY_NAME_LABEL, "internal")], true);
        let sidecar = proxy("web", &[("app", "edge")], false);
        let scope = PolicyScope::new("web", None, None, &refs);
        assert!(attaches(&ctx, &edge, &scope));
        assert!(!attaches(&ctx, &other, &scope));
        assert!(!attaches(&ctx, &sidecar, &scope));
        // A root-namespace policy with a reference attaches nowhere else,
        // and a reference into another namespace matches nothing.
        assert!(!attaches(
            &ctx,
            &edge,
            &PolicyScope::new(ROOT_NAMESPACE, None, None, &refs)
        ));
        let mut elsewhere = gateway_ref("edge");
        elsewhere.namespace = "other".into();
        assert!(!attaches(
            &ctx,
            &edge,
            &PolicyScope::new("web", None, Some(&elsewhere), &[])
        ));
    }
}
