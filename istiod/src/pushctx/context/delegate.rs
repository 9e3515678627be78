//! Istio's `mergeVirtualServices` (`pilot/pkg/model/virtualservice_controller.go`):
//! a VirtualService without `hosts` is a delegate, never served on its own;
//! a root's HTTP route with `delegate` becomes the delegate's routes merged
//! into it ([`crate::model::delegate`]), when the delegate exists and is
//! exported to the root's namespace, else the route is left out. The
//! delegate's short host names are its own namespace's, as Istio resolves
//! them before merging.

use std::collections::BTreeMap;

use super::{Named, resolve_host};
use crate::model::delegate::merge_http_routes;
use crate::model::istio::{HttpRoute, VirtualService};
use crate::model::service::is_exported_to;

/// A VirtualService's (namespace, name).
pub type VsKey = (String, String);

/// The served VirtualServices (roots merged, delegates left out) and, by
/// root, the delegates it names (found or not, so that creating one pushes
/// its roots).
pub(crate) fn merge(
    all: Vec<Named<VirtualService>>,
    domain: &str,
) -> (Vec<Named<VirtualService>>, BTreeMap<VsKey, Vec<VsKey>>) {
    let (delegates, served): (Vec<_>, Vec<_>) =
        all.into_iter().partition(|vs| vs.spec.hosts.is_empty());
    let by_key: BTreeMap<VsKey, &Named<VirtualService>> = delegates
        .iter()
        .map(|d| ((d.namespace.clone(), d.name.clone()), d))
        .collect();
    let mut uses = BTreeMap::new();
    let served = served
        .into_iter()
        .map(|mut root| {
            if root.spec.http.iter().all(|r| r.delegate.is_none()) {
                return root;
            }
            let mut named = Vec::new();
            let mut http = Vec::new();
            for r in std::mem::take(&mut root.spec.http) {
                let Some(d) = &r.delegate else {
                    http.push(r);
                    continue;
                };
                let ns = if d.namespace.is_empty() {
                    root.namespace.clone()
                } else {
                    d.namespace.clone()
                };
                let key = (ns, d.name.clone());
                named.push(key.clone());
                match by_key.get(&key) {
                    None => {
                        tracing::warn!(target: "model", delegate = %format!("{}/{}", key.0, key.1), root = %format!("{}/{}", root.namespace, root.name), "delegate virtual service not found; its root route is left out");
                    }
                    Some(dvs) if !is_exported_to(&dvs.spec.export_to, &dvs.namespace, &root.namespace) => {
                        tracing::warn!(target: "model", delegate = %format!("{}/{}", key.0, key.1), root = %format!("{}/{}", root.namespace, root.name), "delegate virtual service is not exported to the root's namespace; its root route is left out");
                    }
                    Some(dvs) => {
                        let resolved: Vec<HttpRoute> = dvs
                            .spec
                            .http
                            .iter()
                            .map(|h| resolved(h, &dvs.namespace, domain))
                            .collect();
                        http.extend(merge_http_routes(&r, &resolved));
                    }
                }
            }
            root.spec.http = http;
            uses.insert((root.namespace.clone(), root.name.clone()), named);
            root
        })
        .collect();
    (served, uses)
}

/// A delegate's route with its short names made absolute in its own
/// namespace (destination and mirror hosts, match gateways), as Istio's
/// `ResolveVirtualServiceShortnames` does before merging.
fn resolved(r: &HttpRoute, ns: &str, domain: &str) -> HttpRoute {
    let mut r = r.clone();
    let host = |h: &mut String| *h = resolve_host(h, ns, domain);
    for d in &mut r.route {
        host(&mut d.destination.host);
    }
    if let Some(m) = &mut r.mirror {
        host(&mut m.host);
    }
    for m in &mut r.mirrors {
        host(&mut m.destination.host);
    }
    for m in &mut r.r#match {
        for g in &mut m.gateways {
            if g != "mesh" && !g.contains('/') {
                *g = format!("{ns}/{g}");
            }
        }
    }
    r
}
