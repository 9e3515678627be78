//! The Gateway API's `BackendTLSPolicy` (`gateway.networking.k8s.io/v1`,
//! the version of Istio's goldens; the experimental `v1alpha3` carries the
//! same fields): how a gateway or a sidecar originates TLS to a Service or
//! ServiceEntry. Every field of the CRD is typed; the schema's and CEL's
//! rules that a file bypasses are checked here ([`validate`]), and the one
//! field Istio does not read (`options`) is refused rather than ignored.
//! `backend_policies.rs` translates the policies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::FieldError;

/// A BackendTLSPolicy's `spec`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct BackendTlsPolicy {
    /// The Services (or ServiceEntries) it applies to, optionally one port
    /// each (`sectionName`, the port's name).
    pub target_refs: Vec<PolicyTargetReference>,
    /// How the backend's certificate is verified.
    pub validation: BackendTlsValidation,
    /// Implementation options: Istio reads none, so any is refused.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, String>,
}

/// `targetRefs` entry (`LocalPolicyTargetReferenceWithSectionName`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PolicyTargetReference {
    /// `""` for a Service, `networking.istio.io` for a ServiceEntry.
    pub group: String,
    /// `Service` or `ServiceEntry`.
    pub kind: String,
    /// The target's name, in the policy's namespace.
    pub name: String,
    /// A port's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
}

/// `validation`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct BackendTlsValidation {
    /// The CA certificates (ConfigMaps, key `ca.crt`); Istio uses the first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ca_certificate_refs: Vec<LocalObjectReference>,
    /// `System`: the proxy's trust store.
    #[serde(
        rename = "wellKnownCACertificates",
        skip_serializing_if = "Option::is_none"
    )]
    pub well_known_ca_certificates: Option<String>,
    /// The SNI sent, and the name the certificate must carry when no
    /// `subjectAltNames` are given.
    pub hostname: String,
    /// Names the certificate must carry (any one of them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<SubjectAltName>,
}

/// A local object reference (`caCertificateRefs` entry).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LocalObjectReference {
    /// `""` (core) for a ConfigMap.
    pub group: String,
    /// `ConfigMap` (other kinds are refused in status, as Istio does).
    pub kind: String,
    /// The name, in the policy's namespace.
    pub name: String,
}

/// `subjectAltNames` entry.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SubjectAltName {
    /// `Hostname` or `URI`.
    pub r#type: String,
    /// For `Hostname`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// For `URI`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
}

/// The CRD's schema and CEL rules, and the refusal of `options`.
pub fn validate(p: &BackendTlsPolicy) -> Vec<FieldError> {
    let mut e = Vec::new();
    let mut add = |f: String, m: &str| e.push(FieldError::new(f, m.to_string()));
    if p.target_refs.is_empty() || p.target_refs.len() > 16 {
        add(
            "spec.targetRefs".into(),
            "must name 1 to 16 targets (a Service or ServiceEntry, by name)",
        );
    }
    for (i, t) in p.target_refs.iter().enumerate() {
        if t.name.is_empty() || t.kind.is_empty() {
            add(
                format!("spec.targetRefs[{i}]"),
                "kind and name are required",
            );
        }
    }
    let v = &p.validation;
    let has_refs = !v.ca_certificate_refs.is_empty();
    if has_refs == v.well_known_ca_certificates.is_some() {
        add(
            "spec.validation".into(),
            "set exactly one of caCertificateRefs and wellKnownCACertificates",
        );
    }
    if v.ca_certificate_refs.len() > 8 {
        add(
            "spec.validation.caCertificateRefs".into(),
            "at most 8 references",
        );
    }
    if v.hostname.is_empty() {
        add(
            "spec.validation.hostname".into(),
            "is required (the SNI sent to the backend)",
        );
    }
    if v.subject_alt_names.len() > 5 {
        add("spec.validation.subjectAltNames".into(), "at most 5 names");
    }
    for (i, san) in v.subject_alt_names.iter().enumerate() {
        let ok = match san.r#type.as_str() {
            "Hostname" => {
                san.hostname.as_deref().is_some_and(|h| !h.is_empty()) && san.uri.is_none()
            }
            "URI" => san.uri.as_deref().is_some_and(|u| !u.is_empty()) && san.hostname.is_none(),
            _ => false,
        };
        if !ok {
            add(
                format!("spec.validation.subjectAltNames[{i}]"),
                "type Hostname takes hostname, type URI takes uri (and nothing else)",
            );
        }
    }
    if !p.options.is_empty() {
        add(
            "spec.options".into(),
            "is not read by Istio's gateway controller, so it is refused here rather than ignored (remove it)",
        );
    }
    e
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn errors(yaml: &str) -> Vec<String> {
        let p: BackendTlsPolicy = serde_yaml_ng::from_str(yaml).unwrap();
        validate(&p).into_iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn the_crd_rules_and_options_are_checked() {
        let ok = "{targetRefs: [{group: '', kind: Service, name: echo}], validation: {hostname: a.example, wellKnownCACertificates: System}}";
        assert!(errors(ok).is_empty());
        let both = "{targetRefs: [{group: '', kind: Service, name: echo}], validation: {hostname: a.example, wellKnownCACertificates: System, caCertificateRefs: [{group: '', kind: ConfigMap, name: ca}]}}";
        assert!(
            errors(both)[0].contains("exactly one"),
            "{:?}",
            errors(both)
        );
        let opts = "{targetRefs: [{group: '', kind: Service, name: echo}], validation: {hostname: a.example, wellKnownCACertificates: System}, options: {a: b}}";
        assert!(errors(opts)[0].contains("spec.options"));
        let san = "{targetRefs: [{group: '', kind: Service, name: echo}], validation: {hostname: a.example, wellKnownCACertificates: System, subjectAltNames: [{type: URI, hostname: x}]}}";
        assert!(errors(san)[0].contains("subjectAltNames[0]"));
    }
}
