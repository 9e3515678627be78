//! The injector's own configuration: the `config` key of Istio's `istio-sidecar-injector`
//! ConfigMap (Istio's `inject.Config`), as the istio-discovery chart renders it:
//!
//! ```yaml
//! defaultTemplates: [sidecar]
//! policy: enabled
//! alwaysInjectSelector: []
//! neverInjectSelector: []
//! injectedAnnotations:
//!   "example.com/owner": "mesh"
//! template: "{{ Template_Version_And_Istio_Version_Mismatched_Check_Installation }}"
//! templates:
//!   sidecar: |
//!     ...
//! ```
//!
//! The templates' text is kept as given, for reporting; injection renders only the built-in
//! templates ([`super::Template`]), whatever text the ConfigMap holds for their names. The
//! legacy single `template` key is ignored, as Istio ignores it when `templates` is set.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::InjectError;
use super::policy::{self, LabelSelector};

/// The parsed `config` key of the `istio-sidecar-injector` ConfigMap.
#[derive(Clone, Debug, PartialEq)]
pub struct InjectorConfig {
    /// `policy`: inject unless a pod opts out (`enabled`), or only when it opts in
    /// (`disabled`).
    pub policy: policy::Policy,
    /// `alwaysInjectSelector`: pods whose labels match any of these are injected even when
    /// the policy is `disabled`.
    pub always_inject_selector: Vec<LabelSelector>,
    /// `neverInjectSelector`: pods whose labels match any of these are never injected.
    pub never_inject_selector: Vec<LabelSelector>,
    /// `injectedAnnotations`: added to every injected pod
    /// (see [`super::InjectionConfig::injected_annotations`]).
    pub injected_annotations: BTreeMap<String, String>,
    /// `defaultTemplates`: the templates of pods without `inject.istio.io/templates`;
    /// `[sidecar]` when the key is absent or empty, as Istio defaults it.
    pub default_templates: Vec<String>,
    /// `templates`: each template's Go-template text by name (not interpreted).
    pub templates: BTreeMap<String, String>,
}

/// The YAML as written; absent keys take Istio's defaults.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    policy: Option<policy::Policy>,
    #[serde(default)]
    always_inject_selector: Option<Vec<LabelSelector>>,
    #[serde(default)]
    never_inject_selector: Option<Vec<LabelSelector>>,
    #[serde(default)]
    injected_annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    default_templates: Option<Vec<String>>,
    #[serde(default)]
    templates: Option<BTreeMap<String, String>>,
}

impl InjectorConfig {
    /// Parses the ConfigMap's `config` value. A missing `policy` is `enabled`, missing lists
    /// and maps are empty, missing or empty `defaultTemplates` is `[sidecar]`.
    pub fn parse(yaml: &str) -> Result<Self, InjectError> {
        let raw: Option<Raw> = serde_yaml_ng::from_str(yaml).map_err(|e| InjectError::Parse {
            what: "istio-sidecar-injector config".into(),
            reason: e.to_string(),
        })?;
        let Some(raw) = raw else {
            return Ok(Self::default());
        };
        let default_templates = raw
            .default_templates
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| vec![super::Template::Sidecar.name().to_string()]);
        Ok(Self {
            policy: raw.policy.unwrap_or(policy::Policy::Enabled),
            always_inject_selector: raw.always_inject_selector.unwrap_or_default(),
            never_inject_selector: raw.never_inject_selector.unwrap_or_default(),
            injected_annotations: raw.injected_annotations.unwrap_or_default(),
            default_templates,
            templates: raw.templates.unwrap_or_default(),
        })
    }
}

impl Default for InjectorConfig {
    /// Istio's defaults: `enabled`, no selectors or annotations, `[sidecar]`, no templates.
    fn default() -> Self {
        Self {
            policy: policy::Policy::Enabled,
            always_inject_selector: Vec::new(),
            never_inject_selector: Vec::new(),
            injected_annotations: BTreeMap::new(),
            default_templates: vec![super::Template::Sidecar.name().to_string()],
            templates: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chart's `config` key rendered with its default values, templates shortened.
    const RENDERED_DEFAULT: &str = include_str!("../../tests/testdata/inject/injector-config.yaml");

    #[test]
    fn parses_the_chart_rendered_config() {
        let c = InjectorConfig::parse(RENDERED_DEFAULT).expect("parses");
        assert_eq!(c.policy, policy::Policy::Enabled);
        assert_eq!(c.default_templates, ["sidecar"]);
        assert!(c.always_inject_selector.is_empty());
        assert!(c.never_inject_selector.is_empty());
        assert!(c.injected_annotations.is_empty());
        assert_eq!(
            c.templates.keys().map(String::as_str).collect::<Vec<_>>(),
            [
                "agentgateway",
                "agentgateway-waypoint",
                "gateway",
                "grpc-agent",
                "grpc-simple",
                "kube-gateway",
                "sidecar",
                "waypoint"
            ]
        );
        assert!(c.templates["sidecar"].contains("istio-proxy"));
    }

    #[test]
    fn parses_selectors_annotations_and_templates() {
        let c = InjectorConfig::parse(
            r#"
defaultTemplates:
- sidecar
- gateway
policy: disabled
alwaysInjectSelector:
  - matchExpressions:
    - {key: app, operator: In, values: [always]}
neverInjectSelector:
  - matchLabels:
      openshift.io/build.name: x
injectedAnnotations:
  "example.com/owner": "mesh"
template: "{{ Template_Version_And_Istio_Version_Mismatched_Check_Installation }}"
templates: {}
"#,
        )
        .expect("parses");
        assert_eq!(c.policy, policy::Policy::Disabled);
        assert_eq!(c.default_templates, ["sidecar", "gateway"]);
        assert_eq!(c.always_inject_selector[0].match_expressions[0].key, "app");
        assert_eq!(
            c.never_inject_selector[0].match_labels["openshift.io/build.name"],
            "x"
        );
        assert_eq!(c.injected_annotations["example.com/owner"], "mesh");
    }

    #[test]
    fn defaults_and_errors() {
        assert_eq!(
            InjectorConfig::parse("").expect("empty"),
            InjectorConfig::default()
        );
        let c = InjectorConfig::parse("defaultTemplates: []\npolicy: enabled").expect("parses");
        assert_eq!(c.default_templates, ["sidecar"]);
        let err = InjectorConfig::parse("policy: sometimes").expect_err("bad policy");
        assert!(
            err.to_string().contains("istio-sidecar-injector config"),
            "{err}"
        );
    }
}
