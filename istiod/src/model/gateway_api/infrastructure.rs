//! A Gateway's `spec.infrastructure`, as Istio reads it: labels and
//! annotations for what the automated deployment generates, and the
//! `parametersRef` ConfigMap of customizations. Types only; the
//! deployment renders them, validation checks their shape, the
//! translation reports a `parametersRef` of another kind in status.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A Gateway's `spec.infrastructure`, as Istio reads it.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Infrastructure {
    /// Labels for the generated objects (keys under
    /// `gateway.networking.k8s.io/` are ignored, as Istio ignores them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations for the generated objects (same rule).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// The ConfigMap of customizations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters_ref: Option<ParametersRef>,
}

/// `infrastructure.parametersRef`: only a ConfigMap of the core group.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ParametersRef {
    /// `""` (core).
    pub group: String,
    /// `ConfigMap`.
    pub kind: String,
    /// The ConfigMap's name, in the Gateway's namespace.
    pub name: String,
}

impl Infrastructure {
    /// Why this infrastructure cannot be honoured, if it cannot.
    pub fn problem(&self) -> Option<String> {
        let p = self.parameters_ref.as_ref()?;
        (!(p.group.is_empty() && p.kind == "ConfigMap")).then(|| {
            format!(
                "unknown infrastructure parameters type {}/{} (only a core ConfigMap)",
                p.group, p.kind
            )
        })
    }

    /// The Gateway's `Accepted=False` (`InvalidParameters`) message for a
    /// `parametersRef` that is not a ConfigMap, as Istio's
    /// `validateParametersRef` words it.
    pub fn invalid_parameters(&self) -> Option<String> {
        let p = self.parameters_ref.as_ref()?;
        (!(p.group.is_empty() && p.kind == "ConfigMap")).then(|| {
            format!(
                "Unsupported parametersRef group/kind {}/{}, only ConfigMap is supported",
                p.group, p.kind
            )
        })
    }
}
