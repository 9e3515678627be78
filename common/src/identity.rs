//! SPIFFE workload identity, `spiffe://<trust-domain>/ns/<ns>/sa/<sa>`, as Istio spells it.

use std::fmt;
use std::str::FromStr;

/// Istio's default trust domain.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

/// A workload identity in Istio's SPIFFE form.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    /// The trust domain, `cluster.local` by default.
    pub trust_domain: String,
    /// The Kubernetes namespace.
    pub namespace: String,
    /// The Kubernetes service account.
    pub service_account: String,
}

/// Why a string is not an Istio SPIFFE identity.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "{input:?} is not a SPIFFE identity of the form spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>"
)]
pub struct IdentityError {
    input: String,
}

impl Identity {
    /// Builds an identity from its parts.
    pub fn new(trust_domain: &str, namespace: &str, service_account: &str) -> Self {
        Self {
            trust_domain: trust_domain.to_string(),
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
        }
    }

    /// Parses a Kubernetes token subject, `system:serviceaccount:<ns>:<sa>`.
    pub fn from_k8s_subject(trust_domain: &str, sub: &str) -> Option<Self> {
        let rest = sub.strip_prefix("system:serviceaccount:")?;
        let (ns, sa) = rest.split_once(':')?;
        if ns.is_empty() || sa.is_empty() || sa.contains(':') {
            return None;
        }
        Some(Self::new(trust_domain, ns, sa))
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

impl FromStr for Identity {
    type Err = IdentityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || IdentityError {
            input: s.to_string(),
        };
        let rest = s.strip_prefix("spiffe://").ok_or_else(err)?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            [td, "ns", ns, "sa", sa] if !td.is_empty() && !ns.is_empty() && !sa.is_empty() => {
                Ok(Self::new(td, ns, sa))
            }
            _ => Err(err()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let id: Identity = "spiffe://cluster.local/ns/default/sa/bookinfo"
            .parse()
            .unwrap();
        assert_eq!(id, Identity::new("cluster.local", "default", "bookinfo"));
        assert_eq!(
            id.to_string(),
            "spiffe://cluster.local/ns/default/sa/bookinfo"
        );
    }

    #[test]
    fn rejects_other_shapes() {
        for bad in [
            "spiffe://cluster.local/ns/default",
            "http://cluster.local/ns/a/sa/b",
            "spiffe:///ns/a/sa/b",
            "spiffe://td/ns//sa/b",
            "spiffe://td/ns/a/sa/b/extra",
        ] {
            assert!(bad.parse::<Identity>().is_err(), "{bad}");
        }
    }

    #[test]
    fn k8s_subject() {
        assert_eq!(
            Identity::from_k8s_subject("td", "system:serviceaccount:ns1:sa1"),
            Some(Identity::new("td", "ns1", "sa1"))
        );
        assert_eq!(
            Identity::from_k8s_subject("td", "system:serviceaccount:ns1"),
            None
        );
        assert_eq!(Identity::from_k8s_subject("td", "user:alice"), None);
    }
}
