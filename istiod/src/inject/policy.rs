//! Whether a pod gets a sidecar: the webhook configuration's selectors (namespace label
//! `istio-injection` / `istio.io/rev`, pod label `sidecar.istio.io/inject`) and, once the
//! webhook is called, Istio's `injectRequired` (host network, ignored namespaces, the pod's
//! own opt-in/opt-out, `neverInjectSelector`/`alwaysInjectSelector`, the global policy).

use std::collections::BTreeMap;

use serde::Deserialize;

/// Istio's `sidecar.istio.io/inject` label and annotation.
pub const INJECT_KEY: &str = "sidecar.istio.io/inject";
/// The namespace label that enables injection for the default revision.
pub const NAMESPACE_INJECTION_LABEL: &str = "istio-injection";
/// The label that selects a control-plane revision.
pub const REVISION_LABEL: &str = "istio.io/rev";
/// Namespaces never injected (Istio's `IgnoredNamespaces`).
pub const IGNORED_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "local-path-storage"];

/// The injector's `policy` (`values.global.proxy.autoInject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Inject unless the pod opts out.
    Enabled,
    /// Inject only when the pod opts in.
    Disabled,
}

/// A Kubernetes `LabelSelector` (`matchLabels` and `matchExpressions`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels that must all be present with these values.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements that must all hold.
    #[serde(default)]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` entry.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct LabelSelectorRequirement {
    /// The label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    /// The values for `In`/`NotIn`.
    #[serde(default)]
    pub values: Vec<String>,
}

impl LabelSelector {
    /// True when the selector has no requirement (Kubernetes' `selector.Empty()`).
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    /// Whether `labels` satisfy every requirement. An unknown operator matches nothing.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let got = labels.get(&r.key);
                match r.operator.as_str() {
                    "In" => got.is_some_and(|v| r.values.contains(v)),
                    "NotIn" => got.is_none_or(|v| !r.values.contains(v)),
                    "Exists" => got.is_some(),
                    "DoesNotExist" => got.is_none(),
                    _ => false,
                }
            })
    }
}

/// What `injectRequired` needs to know about the pod.
#[derive(Clone, Debug)]
pub struct PodFacts<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// The pod's labels.
    pub labels: &'a BTreeMap<String, String>,
    /// The pod's annotations.
    pub annotations: &'a BTreeMap<String, String>,
    /// `spec.hostNetwork`.
    pub host_network: bool,
}

/// Why a pod is or is not injected; `Inject` is the only outcome that injects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Inject the sidecar.
    Inject,
    /// Skip: the pod uses the host's network namespace.
    HostNetwork,
    /// Skip: the namespace is a Kubernetes system namespace.
    IgnoredNamespace,
    /// Skip: the pod, a selector or the policy says no.
    NotRequired,
}

/// Istio's `injectRequired`: the decision once the webhook has been called for a pod.
pub fn inject_required(
    pod: &PodFacts<'_>,
    policy: Policy,
    never_inject: &[LabelSelector],
    always_inject: &[LabelSelector],
) -> Decision {
    if pod.host_network {
        return Decision::HostNetwork;
    }
    if IGNORED_NAMESPACES.contains(&pod.namespace) {
        return Decision::IgnoredNamespace;
    }
    // The label is the newer API and wins over the annotation.
    let selector = pod
        .labels
        .get(INJECT_KEY)
        .or_else(|| pod.annotations.get(INJECT_KEY))
        .map(|s| s.to_ascii_lowercase())
        .unwrap_or_default();
    let mut use_default = false;
    let mut inject = false;
    match selector.as_str() {
        "y" | "yes" | "true" | "on" => inject = true,
        "" => use_default = true,
        _ => {}
    }
    if use_default
        && never_inject
            .iter()
            .any(|s| !s.is_empty() && s.matches(pod.labels))
    {
        inject = false;
        use_default = false;
    }
    if use_default
        && always_inject
            .iter()
            .any(|s| !s.is_empty() && s.matches(pod.labels))
    {
        inject = true;
        use_default = false;
    }
    let required = match (policy, use_default) {
        (Policy::Enabled, true) => true,
        (Policy::Disabled, true) => false,
        (_, false) => inject,
    };
    if required {
        Decision::Inject
    } else {
        Decision::NotRequired
    }
}

/// Whether the default `istio-sidecar-injector` webhook configuration sends this pod to the
/// injector of `revision` (`"default"` for the default one) at all: its four webhooks'
/// namespace and object selectors.
pub fn webhook_selects(
    revision: &str,
    namespace_labels: &BTreeMap<String, String>,
    pod_labels: &BTreeMap<String, String>,
) -> bool {
    let ns_injection = namespace_labels.get(NAMESPACE_INJECTION_LABEL);
    let ns_rev = namespace_labels.get(REVISION_LABEL);
    let pod_inject = pod_labels.get(INJECT_KEY).map(String::as_str);
    let pod_rev = pod_labels.get(REVISION_LABEL);
    let pod_not_false = pod_inject != Some("false");
    let is_default = revision == "default";
    // namespace.sidecar-injector.istio.io: `istio-injection=enabled` on the namespace.
    if is_default && ns_injection.map(String::as_str) == Some("enabled") && pod_not_false {
        return true;
    }
    if ns_injection.is_some() {
        return false;
    }
    // rev.namespace: the namespace names this revision.
    if ns_rev.map(String::as_str) == Some(revision) && pod_not_false {
        return true;
    }
    if ns_rev.is_some() {
        return false;
    }
    // rev.object: the pod names this revision.
    if pod_rev.map(String::as_str) == Some(revision) && pod_not_false {
        return true;
    }
    // object.sidecar-injector.istio.io: the pod opts in with no revision.
    is_default && pod_rev.is_none() && pod_inject == Some("true")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn pod_opt_in_and_out() {
        let empty = m(&[]);
        let off = m(&[(INJECT_KEY, "false")]);
        let on = m(&[(INJECT_KEY, "true")]);
        let facts = |labels, annotations| PodFacts {
            namespace: "default",
            labels,
            annotations,
            host_network: false,
        };
        assert_eq!(
            inject_required(&facts(&empty, &empty), Policy::Enabled, &[], &[]),
            Decision::Inject
        );
        assert_eq!(
            inject_required(&facts(&empty, &off), Policy::Enabled, &[], &[]),
            Decision::NotRequired
        );
        assert_eq!(
            inject_required(&facts(&empty, &empty), Policy::Disabled, &[], &[]),
            Decision::NotRequired
        );
        assert_eq!(
            inject_required(&facts(&on, &off), Policy::Disabled, &[], &[]),
            Decision::Inject
        );
        let app = m(&[("app", "x")]);
        let sel = LabelSelector {
            match_labels: app.clone(),
            ..Default::default()
        };
        assert_eq!(
            inject_required(
                &facts(&app, &empty),
                Policy::Enabled,
                std::slice::from_ref(&sel),
                &[]
            ),
            Decision::NotRequired
        );
        assert_eq!(
            inject_required(&facts(&app, &empty), Policy::Disabled, &[], &[sel]),
            Decision::Inject
        );
        let host = PodFacts {
            host_network: true,
            ..facts(&empty, &empty)
        };
        assert_eq!(
            inject_required(&host, Policy::Enabled, &[], &[]),
            Decision::HostNetwork
        );
        let system = PodFacts {
            namespace: "kube-system",
            ..facts(&empty, &empty)
        };
        assert_eq!(
            inject_required(&system, Policy::Enabled, &[], &[]),
            Decision::IgnoredNamespace
        );
    }

    #[test]
    fn webhook_selectors() {
        let enabled = m(&[(NAMESPACE_INJECTION_LABEL, "enabled")]);
        let none = m(&[]);
        let off = m(&[(INJECT_KEY, "false")]);
        let on = m(&[(INJECT_KEY, "true")]);
        assert!(webhook_selects("default", &enabled, &none));
        assert!(!webhook_selects("default", &enabled, &off));
        assert!(!webhook_selects("default", &none, &none));
        assert!(webhook_selects("default", &none, &on));
        let rev = m(&[(REVISION_LABEL, "canary")]);
        assert!(webhook_selects("canary", &rev, &none));
        assert!(!webhook_selects("default", &rev, &on));
        assert!(webhook_selects("canary", &none, &rev));
        assert!(!webhook_selects("canary", &enabled, &rev));
    }
}
