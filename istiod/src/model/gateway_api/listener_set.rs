//! The Gateway API `ListenerSet` (`gateway.networking.k8s.io/v1`): listeners
//! that join a parent Gateway when the Gateway's `allowedListeners` admits
//! the ListenerSet's namespace, and the Gateway's `allowedListeners`
//! itself, as the API defines them (their translation is in
//! `listener_set_collection.rs`, as Istio's `ListenerSetCollection`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{GROUP, KubernetesGateway, LabelSelector, Listener};

/// The label the API server puts on every Namespace, which Istio adds when
/// a Namespace lacks it before matching a selector.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A `ListenerSet`'s `spec`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ListenerSet {
    /// The Gateway the listeners join.
    pub parent_ref: ParentGatewayReference,
    /// The listeners; a `port` left out is 80 for HTTP and 443 for HTTPS.
    pub listeners: Vec<Listener>,
}

/// A ListenerSet's `parentRef`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ParentGatewayReference {
    /// `gateway.networking.k8s.io` when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `Gateway` when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The Gateway's name.
    pub name: String,
    /// The ListenerSet's namespace when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A Gateway's `allowedListeners`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AllowedListeners {
    /// The namespaces whose ListenerSets may attach (none when unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<ListenerNamespaces>,
}

/// `allowedListeners.namespaces`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ListenerNamespaces {
    /// `None` (the default), `Same`, `All` or `Selector`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The Namespaces' label selector, for `Selector`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// The `from` values the API defines.
pub const FROM_VALUES: [&str; 4] = ["All", "Same", "None", "Selector"];

impl ParentGatewayReference {
    /// Whether it names a Gateway API Gateway (the defaults included).
    pub fn is_gateway(&self) -> bool {
        self.group.as_deref().unwrap_or(GROUP) == GROUP
            && self.kind.as_deref().unwrap_or("Gateway") == "Gateway"
    }
}

/// A ListenerSet listener's port: its own, or the protocol's default
/// (Istio's `ListenerEntryPortNumber`); `None` when it needs one.
pub fn entry_port(l: &Listener) -> Option<u32> {
    match (l.port, l.protocol.as_str()) {
        (0, "HTTP") => Some(80),
        (0, "HTTPS") => Some(443),
        (0, _) => None,
        (p, _) => Some(p),
    }
}

/// Whether `parent`'s `allowedListeners` admits ListenerSets of namespace
/// `ns` whose labels are `labels` (`None`: the Namespace is not known),
/// as Istio's `NamespaceAcceptedByAllowListeners` decides.
pub fn namespace_allowed(
    parent: &KubernetesGateway,
    parent_ns: &str,
    ns: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    let Some(n) = parent
        .allowed_listeners
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
    else {
        return false;
    };
    match n.from.as_deref() {
        Some("All") => true,
        Some("Same") => ns == parent_ns,
        Some("Selector") => {
            let (Some(selector), Some(labels)) = (&n.selector, labels) else {
                return false;
            };
            let mut labels = labels.clone();
            labels
                .entry(NAMESPACE_NAME_LABEL.to_string())
                .or_insert_with(|| ns.to_string());
            selector.matches(&labels)
        }
        // `None`, and `from` left out (the API's default is `None`).
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gateway(from: &str, selector: Option<LabelSelector>) -> KubernetesGateway {
        KubernetesGateway {
            allowed_listeners: Some(AllowedListeners {
                namespaces: Some(ListenerNamespaces {
                    from: Some(from.into()),
                    selector,
                }),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn allowed_listeners_admit_namespaces_as_istio_does() {
        let none = BTreeMap::new();
        assert!(!namespace_allowed(
            &KubernetesGateway::default(),
            "gw",
            "gw",
            Some(&none)
        ));
        assert!(namespace_allowed(&gateway("All", None), "gw", "x", None));
        assert!(namespace_allowed(&gateway("Same", None), "gw", "gw", None));
        assert!(!namespace_allowed(&gateway("Same", None), "gw", "x", None));
        assert!(!namespace_allowed(&gateway("None", None), "gw", "gw", None));
        let by_name = LabelSelector {
            match_labels: BTreeMap::from([(NAMESPACE_NAME_LABEL.into(), "x".into())]),
            ..Default::default()
        };
        let gw = gateway("Selector", Some(by_name));
        assert!(namespace_allowed(&gw, "gw", "x", Some(&none)));
        assert!(!namespace_allowed(&gw, "gw", "y", Some(&none)));
        assert!(!namespace_allowed(&gw, "gw", "x", None));
    }

    #[test]
    fn ports_default_by_protocol() {
        let l = |protocol: &str, port| Listener {
            protocol: protocol.into(),
            port,
            ..Default::default()
        };
        assert_eq!(entry_port(&l("HTTP", 0)), Some(80));
        assert_eq!(entry_port(&l("HTTPS", 0)), Some(443));
        assert_eq!(entry_port(&l("TCP", 0)), None);
        assert_eq!(entry_port(&l("TCP", 9000)), Some(9000));
    }
}
