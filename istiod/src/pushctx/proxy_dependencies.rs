//! Istio's `ProxyNeedsPush` (`pilot/pkg/xds/proxy_dependencies.go`): whether
//! a push reaches one proxy, and with which types, decided from the proxy's
//! Sidecar scope in the new push context. A change is described with both
//! its old and its new form (see [`super::push_request::Change`]), so a
//! service that left the scope still reaches the proxies that had it.

use std::sync::Arc;

use super::Proxy;
use super::context::IstioContext;
use super::push_request::{Audience, PushPlan, Updates};
use super::scope::SidecarScope;
use crate::model::service::is_exported_to;

/// What `proxy` needs from the pushes in `updates`.
pub fn plan(ctx: &IstioContext, proxy: &Proxy, updates: &[Arc<Updates>]) -> PushPlan {
    if updates.iter().any(|u| u.everything) {
        return PushPlan::everything();
    }
    let mut proxy = proxy.clone();
    proxy.labels = ctx.workload_labels(&proxy);
    let scope = ctx.scope(&proxy);
    let mut plan = PushPlan::default();
    for change in updates.iter().flat_map(|u| &u.changes) {
        if !reaches(&change.audience, &proxy, &scope) {
            continue;
        }
        match &change.audience {
            Audience::Secret { namespace, name } => plan.add_secret(format!("{namespace}/{name}")),
            _ => plan.add(change.types, change.eds_hosts.as_ref()),
        }
    }
    plan
}

/// Whether a change for `audience` reaches `proxy`.
fn reaches(audience: &Audience, proxy: &Proxy, scope: &SidecarScope) -> bool {
    match audience {
        Audience::All => true,
        Audience::Namespace(ns) => proxy.namespace == *ns,
        Audience::Services(services) => services
            .iter()
            .any(|s| scope.admits(&s.namespace, &s.hostname, &s.export_to)),
        Audience::ServiceNamespace(ns) => scope.sees_namespace(ns),
        Audience::Hosts {
            namespace,
            export_to,
            hosts,
        } => {
            is_exported_to(export_to, namespace, &proxy.namespace)
                && hosts.iter().any(|h| scope.sees_host(h))
        }
        Audience::Workloads(ips) => proxy.ips.iter().any(|ip| ips.contains(ip)),
        Audience::Routers => proxy.proxy_type == common::ProxyType::Router,
        // Routers also read Gateway API Secrets of other namespaces (with a
        // ReferenceGrant); which of them is decided by the names watched.
        Audience::Secret { namespace, .. } => {
            proxy.namespace == *namespace || proxy.proxy_type == common::ProxyType::Router
        }
    }
}
