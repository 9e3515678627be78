//! Kubernetes `v1` ConfigMaps, as Istio's gateway controller and SDS read
//! them (`pilot/pkg/credentials/kube`): only for the CA certificates they
//! carry, named by a BackendTLSPolicy's `caCertificateRefs` or a Gateway's
//! `frontendValidation.caCertificateRefs` and served over SDS as
//! `configmap://<namespace>/<name>` (Istio's `KubernetesConfigMapTypeURI`).
//!
//! Istio's gateway controller watches ConfigMaps cluster-wide; so does this
//! istiod, and of each it keeps the CA keys' values (`cacert`, then
//! `ca.crt`, as Istio's `ExtractRoot` reads them) and the names of the other
//! keys (for Istio's "found: ..." message), nothing else. Values are never
//! logged or shown: dumps list the keys with their sizes.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::secret::{GENERIC_CA, TLS_CA};

/// A ConfigMap: its CA data, and the names of its other keys.
#[derive(Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(from = "ConfigMapWire")]
pub struct ConfigMap {
    /// `cacert` and `ca.crt`, when present.
    pub ca: BTreeMap<String, Vec<u8>>,
    /// Every key of `data`, sorted (`binaryData` is accepted and not read,
    /// as in Istio).
    pub keys: Vec<String>,
}

/// A ConfigMap as written.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct ConfigMapWire {
    data: BTreeMap<String, String>,
    binary_data: BTreeMap<String, serde_json::Value>,
    #[allow(dead_code)]
    immutable: Option<bool>,
}

impl From<ConfigMapWire> for ConfigMap {
    fn from(w: ConfigMapWire) -> Self {
        let _ = w.binary_data;
        let keys: Vec<String> = w.data.keys().cloned().collect();
        let ca = w
            .data
            .into_iter()
            .filter(|(k, _)| k == GENERIC_CA || k == TLS_CA)
            .map(|(k, v)| (k, v.into_bytes()))
            .collect();
        ConfigMap { ca, keys }
    }
}

/// Why a ConfigMap holds no CA, in Istio's words (its `ExtractRoot`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigMapCaError {
    /// A CA key that is empty.
    #[error("found key {0:?}, but it was empty")]
    Empty(&'static str),
    /// No CA key at all.
    #[error("found secret, but didn't have expected keys {GENERIC_CA} or {TLS_CA}; found: {0}")]
    Missing(String),
}

impl ConfigMap {
    /// The CA certificates: `cacert`, else `ca.crt` (Istio's order).
    pub fn ca(&self) -> Result<&[u8], ConfigMapCaError> {
        for key in [GENERIC_CA, TLS_CA] {
            if let Some(v) = self.ca.get(key).filter(|v| !v.is_empty()) {
                return Ok(v);
            }
        }
        for key in [GENERIC_CA, TLS_CA] {
            if self.ca.contains_key(key) {
                return Err(ConfigMapCaError::Empty(key));
            }
        }
        // Istio's `truncatedKeysMessage`: at most three names.
        let shown = if self.keys.len() < 3 {
            self.keys.join(", ")
        } else {
            format!(
                "{}, and {} more...",
                self.keys[..3].join(", "),
                self.keys.len() - 3
            )
        };
        Err(ConfigMapCaError::Missing(shown))
    }
}

impl fmt::Debug for ConfigMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigMap")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

/// Serialized (for `/debug/configz` and dumps) as its keys, the CA values
/// by size only.
impl Serialize for ConfigMap {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let data: BTreeMap<&str, String> = self
            .keys
            .iter()
            .map(|k| {
                let shown = match self.ca.get(k) {
                    Some(v) => format!("<{} bytes>", v.len()),
                    None => "<not read>".to_string(),
                };
                (k.as_str(), shown)
            })
            .collect();
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("data", &data)?;
        map.end()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn cm(yaml: &str) -> ConfigMap {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn keeps_only_the_ca_and_reports_as_istio() {
        let c = cm("{data: {ca.crt: PEM, mesh: 'secret: x'}}");
        assert_eq!(c.ca().unwrap(), b"PEM");
        assert_eq!(c.keys, ["ca.crt", "mesh"]);
        assert!(!format!("{c:?}").contains("secret: x"));
        let shown = serde_json::to_string(&c).unwrap();
        assert!(
            !shown.contains("PEM") && !shown.contains("secret: x"),
            "{shown}"
        );
        assert_eq!(
            cm("{data: {not-ca.crt: hello}}")
                .ca()
                .unwrap_err()
                .to_string(),
            "found secret, but didn't have expected keys cacert or ca.crt; found: not-ca.crt"
        );
        assert_eq!(
            cm("{data: {ca.crt: ''}}").ca().unwrap_err(),
            ConfigMapCaError::Empty("ca.crt")
        );
        assert_eq!(cm("{data: {cacert: A, ca.crt: B}}").ca().unwrap(), b"A");
    }
}
