//! `ReferenceGrant` (`gateway.networking.k8s.io` v1 and v1beta1): the
//! consent a namespace gives for objects of other namespaces to refer to
//! its own, and the index Istio's gateway controller consults
//! (`gatewaycommon/references.go`): a Gateway's `certificateRefs` to a
//! Secret, a route's `backendRefs` to a Service, across namespaces, are
//! allowed only when a grant in the target's namespace names the source's
//! kind and namespace and the target's kind (and name, when it names one).
//!
//! As in Istio, grants whose `from` or `to` kind Istio does not handle are
//! skipped (they may be for another controller), not refused.

use super::GROUP;
pub use super::reference_grant::{ReferenceGrant, ReferenceGrantFrom, ReferenceGrantTo};
use crate::model::store::Snapshot;

/// The kinds that may refer across namespaces, as Istio indexes them.
const FROM_KINDS: [(&str, &str); 6] = [
    (GROUP, "Gateway"),
    (GROUP, "HTTPRoute"),
    (GROUP, "GRPCRoute"),
    (GROUP, "TLSRoute"),
    (GROUP, "TCPRoute"),
    (GROUP, "ListenerSet"),
];

/// The kinds that may be referred to, as Istio indexes them.
const TO_KINDS: [(&str, &str); 5] = [
    ("", "ConfigMap"),
    ("", "Secret"),
    ("", "Service"),
    ("gateway.networking.x-k8s.io", "XBackend"),
    ("inference.networking.k8s.io", "InferencePool"),
];

/// The referring side: a kind (`group`, `kind`) in a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefFrom<'a> {
    /// The group.
    pub group: &'a str,
    /// The kind.
    pub kind: &'a str,
    /// The referring object's namespace.
    pub namespace: &'a str,
}

/// The referred side: one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefTo<'a> {
    /// The group (`""` for core).
    pub group: &'a str,
    /// The kind.
    pub kind: &'a str,
    /// Its namespace.
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
}

impl RefFrom<'_> {
    /// A Gateway API `Gateway` of `namespace`.
    pub fn gateway(namespace: &str) -> RefFrom<'_> {
        RefFrom {
            group: GROUP,
            kind: "Gateway",
            namespace,
        }
    }
}

impl<'a> RefTo<'a> {
    /// A core `Secret`.
    pub fn secret(namespace: &'a str, name: &'a str) -> Self {
        RefTo {
            group: "",
            kind: "Secret",
            namespace,
            name,
        }
    }

    /// A core `Service`.
    pub fn service(namespace: &'a str, name: &'a str) -> Self {
        RefTo {
            group: "",
            kind: "Service",
            namespace,
            name,
        }
    }
}

/// One permission: (from kind, from namespace) -> (to kind, to namespace,
/// name or every name).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Grant {
    from: (String, String, String),
    to: (String, String, String),
    name: Option<String>,
}

/// Every grant of a snapshot, flattened (Istio's `ReferenceGrants`).
#[derive(Debug, Clone, Default)]
pub struct ReferenceGrants {
    grants: Vec<Grant>,
}

/// The group as Istio normalises it: `core` and `v1` spellings are `""`.
fn group(g: &str) -> &str {
    match g {
        "core" | "v1" => "",
        g => g,
    }
}

impl ReferenceGrants {
    /// The grants of `snapshot`.
    pub fn new(snapshot: &Snapshot) -> Self {
        let mut grants = Vec::new();
        for g in snapshot.list::<ReferenceGrant>() {
            let ns = g.object.metadata.namespace.as_str();
            grants.extend(Self::flatten(ns, g.spec));
        }
        Self { grants }
    }

    /// The grants one object gives (namespace `ns`).
    fn flatten(ns: &str, spec: &ReferenceGrant) -> Vec<Grant> {
        let mut out = Vec::new();
        for f in &spec.from {
            let fk = (group(&f.group), f.kind.as_str());
            if !FROM_KINDS.contains(&fk) {
                continue;
            }
            for t in &spec.to {
                let tk = (group(&t.group), t.kind.as_str());
                if !TO_KINDS.contains(&tk) {
                    continue;
                }
                out.push(Grant {
                    from: (fk.0.into(), fk.1.into(), f.namespace.clone()),
                    to: (tk.0.into(), tk.1.into(), ns.to_string()),
                    name: t.name.clone(),
                });
            }
        }
        out
    }

    /// Whether `from` may refer to `to`: always within a namespace, else
    /// only with a grant.
    pub fn allowed(&self, from: RefFrom<'_>, to: RefTo<'_>) -> bool {
        if from.namespace == to.namespace {
            return true;
        }
        self.granted(from, to)
    }

    /// Whether a grant allows `from` to refer to `to` (whatever the
    /// namespaces).
    pub fn granted(&self, from: RefFrom<'_>, to: RefTo<'_>) -> bool {
        self.grants.iter().any(|g| {
            g.from.0 == group(from.group)
                && g.from.1 == from.kind
                && g.from.2 == from.namespace
                && g.to.0 == group(to.group)
                && g.to.1 == to.kind
                && g.to.2 == to.namespace
                && g.name.as_deref().is_none_or(|n| n == to.name)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grants(ns: &str, yaml: &str) -> ReferenceGrants {
        let spec: ReferenceGrant = serde_yaml_ng::from_str(yaml).unwrap();
        ReferenceGrants {
            grants: ReferenceGrants::flatten(ns, &spec),
        }
    }

    #[test]
    fn a_grant_allows_only_its_kind_namespace_and_name() {
        let g = grants(
            "cert",
            r#"
from:
- {group: gateway.networking.k8s.io, kind: Gateway, namespace: istio-system}
to:
- {group: "", kind: Secret, name: cert}
"#,
        );
        let gw = RefFrom::gateway("istio-system");
        assert!(g.allowed(gw, RefTo::secret("cert", "cert")));
        assert!(!g.allowed(gw, RefTo::secret("cert", "other")));
        assert!(!g.allowed(gw, RefTo::secret("elsewhere", "cert")));
        assert!(!g.allowed(RefFrom::gateway("default"), RefTo::secret("cert", "cert")));
        assert!(!g.allowed(gw, RefTo::service("cert", "cert")));
        // Within a namespace no grant is needed.
        assert!(g.allowed(RefFrom::gateway("x"), RefTo::secret("x", "y")));
    }

    #[test]
    fn a_grant_without_name_allows_every_object_and_unknown_kinds_are_skipped() {
        let g = grants(
            "backend",
            r#"
from:
- {group: gateway.networking.k8s.io, kind: TCPRoute, namespace: default}
- {group: example.com, kind: Thing, namespace: default}
to:
- {group: "", kind: Service}
- {group: example.com, kind: Other}
"#,
        );
        assert_eq!(g.grants.len(), 1);
        let from = RefFrom {
            group: GROUP,
            kind: "TCPRoute",
            namespace: "default",
        };
        assert!(g.allowed(from, RefTo::service("backend", "a")));
        assert!(g.allowed(from, RefTo::service("backend", "b")));
        assert!(!g.allowed(
            RefFrom {
                kind: "HTTPRoute",
                ..from
            },
            RefTo::service("backend", "a")
        ));
    }
}
