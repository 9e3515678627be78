//! One listener routes may attach to: a Gateway's own, or one of a
//! ListenerSet that joined a Gateway (Istio's `parentInfo`), with how a
//! route's parent reference names it and the namespaces it admits routes
//! from.

use super::conditions::Condition;
use super::{FromNamespaces, GENERATED_SUFFIX, Listener};
use crate::model::ObjectKey;
use crate::model::kube::Namespace;
use crate::model::store::Typed;

/// One listener of one of Istio's Gateways (or of a ListenerSet attached
/// to one), ready for routes to attach.
pub(super) struct ParentListener<'a> {
    /// The owner's kind: `Gateway` or `ListenerSet`.
    pub(super) kind: &'static str,
    /// Whether routes may attach (a conflicted listener is kept for its
    /// status only).
    pub(super) routable: bool,
    /// The owner's namespace.
    pub(super) gw_namespace: &'a str,
    /// The owner's name.
    pub(super) gw_name: &'a str,
    /// The listener (a ListenerSet's with its port defaulted).
    pub(super) listener: std::borrow::Cow<'a, Listener>,
    /// The generated Istio Gateway's name.
    pub(super) internal: String,
    /// Namespaces whose routes may attach (`None`: all).
    pub(super) allowed: Option<Vec<String>>,
    /// How many routes attached.
    pub(super) attached: u32,
    /// The route kinds it takes.
    pub(super) kinds: Vec<&'static str>,
    /// Its conditions (Istio's `buildListener`).
    pub(super) conditions: Vec<Condition>,
}

impl ParentListener<'_> {
    /// The generated Istio Gateway as routes name it (`<ns>/<name>`).
    pub(super) fn internal_ref(&self) -> String {
        format!("{}/{}", self.gw_namespace, self.internal)
    }

    /// Whether a route's parent reference (from namespace `route_ns`)
    /// names this listener's owner.
    pub(super) fn owned_by(&self, p: &super::ParentReference, route_ns: &str) -> bool {
        self.routable
            && self.gw_namespace == p.namespace.as_deref().unwrap_or(route_ns)
            && self.gw_name == p.name
            && p.group.as_deref().unwrap_or(super::GROUP) == super::GROUP
            && p.kind.as_deref().unwrap_or("Gateway") == self.kind
    }
}

/// The object a route's parent reference names, when it is a Gateway or a
/// ListenerSet.
pub(super) fn parent_key(p: &super::ParentReference, route_ns: &str) -> Option<ObjectKey> {
    if p.group.as_deref().unwrap_or(super::GROUP) != super::GROUP {
        return None;
    }
    let kind = match p.kind.as_deref().unwrap_or("Gateway") {
        "Gateway" => crate::model::Kind::KubernetesGateway,
        "ListenerSet" => crate::model::Kind::ListenerSet,
        _ => return None,
    };
    Some(ObjectKey::new(
        kind,
        p.namespace.as_deref().unwrap_or(route_ns),
        &p.name,
    ))
}

/// The name of the Istio Gateway generated for a listener (Istio's
/// `InternalGatewayName`).
pub fn internal_gateway_name(gateway: &str, listener: &str) -> String {
    format!("{gateway}~{GENERATED_SUFFIX}~{listener}")
}

/// The namespaces whose routes a listener admits: `None` for all.
pub(super) fn allowed_namespaces(
    l: &Listener,
    gw_ns: &str,
    namespaces: &[Typed<'_, Namespace>],
) -> Option<Vec<String>> {
    let from = l
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref());
    match from.and_then(|n| n.from).unwrap_or_default() {
        FromNamespaces::Same => Some(vec![gw_ns.to_string()]),
        FromNamespaces::All => None,
        FromNamespaces::Selector => {
            let selector = from.and_then(|n| n.selector.as_ref());
            Some(
                namespaces
                    .iter()
                    .filter(|n| selector.is_some_and(|s| s.matches(&n.object.metadata.labels)))
                    .map(|n| n.object.metadata.name.clone())
                    .collect(),
            )
        }
    }
}
