//! Istio's `networking.istio.io/v1beta1` ProxyConfig as istiod reads it:
//! the type of the object, below the object vocabulary (`meta.rs`) that
//! names it; the merge over a snapshot is the parent's.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::super::istio::{Labels, PolicySelector};

/// A `networking.istio.io/v1beta1` ProxyConfig.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// The workloads it applies to; unset applies to the whole namespace
    /// (the whole mesh in the root namespace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<PolicySelector>,
    /// Envoy's worker threads (`--concurrency`); 0 means one per core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<i32>,
    /// Environment variables of the proxy (Istio's `proxyMetadata`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub environment_variables: BTreeMap<String, String>,
    /// The proxy image's variant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<ProxyImage>,
}

/// `ProxyConfig.image`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ProxyImage {
    /// `default`, `debug` or `distroless` (the tag's suffix).
    pub image_type: String,
}

impl ProxyConfig {
    /// The fields this object sets, as the mesh `ProxyConfig`'s camelCase
    /// JSON (Istio's `toMeshConfigProxyConfig`).
    pub fn to_mesh_proxy_config(&self) -> Map<String, Value> {
        let mut m = Map::new();
        if let Some(c) = self.concurrency {
            m.insert("concurrency".into(), json!(c));
        }
        if !self.environment_variables.is_empty() {
            m.insert("proxyMetadata".into(), json!(self.environment_variables));
        }
        if let Some(image) = &self.image {
            m.insert("image".into(), json!({"imageType": image.image_type}));
        }
        m
    }

    pub(super) fn selects(&self, labels: &Labels) -> bool {
        self.selector.as_ref().is_some_and(|s| {
            !s.match_labels.is_empty()
                && s.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
        })
    }

    pub(super) fn is_namespace_wide(&self) -> bool {
        self.selector.is_none()
    }
}
