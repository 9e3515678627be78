//! The mesh istiod serves: the `--meshConfig` file, the `--networksConfig`
//! check, and the names the mesh is known by (domain, trust domain, cluster,
//! system namespace).

use std::path::{Path, PathBuf};

use common::env::Reader;

use super::args::DiscoveryArgs;
use crate::mesh::{Mesh, MeshConfig, MeshInjection};
use crate::model::kube::LabelSelector;

/// `POD_NAMESPACE`: istiod's namespace (`istio-system`), the `--namespace` default.
pub const ENV_POD_NAMESPACE: &str = "POD_NAMESPACE";

/// Why the mesh files cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeshFileError {
    /// A field of the `--meshConfig` file is invalid or not built.
    #[error("--meshConfig {}: {reason}", path.display())]
    MeshConfig {
        /// The file.
        path: PathBuf,
        /// The field and what is wrong with it.
        reason: String,
    },
    /// The `--networksConfig` file is not a mesh of one network.
    #[error("--networksConfig {}: {problem}", path.display())]
    MeshNetworks {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: MeshNetworksError,
    },
}

/// What is wrong with a `--networksConfig` file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeshNetworksError {
    /// The file is not YAML.
    #[error("{0}")]
    Yaml(String),
    /// The document is not a mapping.
    #[error("must be a mapping with a networks field")]
    NotMapping,
    /// A field MeshNetworks does not have.
    #[error("{0}: unknown field (MeshNetworks has networks only)")]
    UnknownField(String),
    /// Named networks: a mesh of several networks is not built.
    #[error(
        "networks is not supported, only {{}} (meshes of several networks, with east-west gateways, are not built)"
    )]
    NamedNetworks,
}

/// The mesh istiod serves.
#[derive(Debug, Clone)]
pub struct MeshSettings {
    /// What the generators apply from the mesh config file.
    pub config: MeshConfig,
    /// Mesh config `discoverySelectors` from the file.
    pub discovery_selectors: Vec<LabelSelector>,
    /// What the sidecar injector reads from the mesh config file.
    pub injection: MeshInjection,
    /// Whether the `--meshConfig` file exists; when it does not, istiod on
    /// Kubernetes watches the `istio` ConfigMap instead, as Istio does.
    pub file_found: bool,
    /// SPIFFE trust domain (mesh config `trustDomain`).
    pub trust_domain: String,
    /// DNS domain.
    pub domain: String,
    /// Cluster ID.
    pub cluster_id: String,
    /// System namespace.
    pub namespace: String,
}

impl MeshSettings {
    /// The mesh config as the config sources start with it.
    pub fn mesh(&self) -> Mesh {
        Mesh {
            trust_domain: Some(self.trust_domain.clone()),
            config: self.config.clone(),
            discovery_selectors: self.discovery_selectors.clone(),
            injection: self.injection.clone(),
        }
    }
}

/// Reads the mesh files and names.
pub(super) fn parse(args: &DiscoveryArgs, r: &mut Reader<'_>) -> MeshSettings {
    let (mesh, file_found) = read_mesh_config(&args.mesh_config, r);
    for problem in check_mesh_networks(&args.networks_config) {
        r.error(
            MeshFileError::MeshNetworks {
                path: args.networks_config.clone(),
                problem,
            }
            .to_string(),
        );
    }
    let trust_domain = mesh
        .trust_domain
        .unwrap_or_else(|| common::identity::DEFAULT_TRUST_DOMAIN.to_string());
    MeshSettings {
        config: mesh.config,
        discovery_selectors: mesh.discovery_selectors,
        injection: mesh.injection,
        file_found,
        trust_domain,
        domain: args.domain.clone(),
        cluster_id: args.cluster_id.clone(),
        namespace: args.namespace.clone(),
    }
}

/// Reads the mesh config file; a missing file is Istio's defaults and
/// `found` false.
fn read_mesh_config(path: &Path, r: &mut Reader<'_>) -> (Mesh, bool) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return (Mesh::default(), false);
    };
    match Mesh::parse(&text) {
        Ok(mesh) => (mesh, true),
        Err(errors) => {
            for reason in errors {
                r.error(
                    MeshFileError::MeshConfig {
                        path: path.to_path_buf(),
                        reason,
                    }
                    .to_string(),
                );
            }
            (Mesh::default(), true)
        }
    }
}

/// Checks the mesh networks file (`--networksConfig`, the `meshNetworks` key
/// of Istio's ConfigMap). A mesh of one network is all this istiod builds,
/// so a file naming networks is refused rather than left unapplied; a
/// missing file is a mesh of one network.
fn check_mesh_networks(path: &Path) -> Vec<MeshNetworksError> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    match serde_yaml_ng::from_str::<Option<serde_json::Value>>(&text) {
        Err(e) => vec![MeshNetworksError::Yaml(e.to_string())],
        Ok(None) => Vec::new(),
        Ok(Some(v)) => {
            let Some(doc) = v.as_object() else {
                return vec![MeshNetworksError::NotMapping];
            };
            let mut problems: Vec<_> = doc
                .keys()
                .filter(|k| *k != "networks")
                .map(|k| MeshNetworksError::UnknownField(k.clone()))
                .collect();
            let named = doc
                .get("networks")
                .and_then(|n| n.as_object())
                .is_some_and(|n| !n.is_empty());
            if named {
                problems.push(MeshNetworksError::NamedNetworks);
            }
            problems
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mesh_networks_problems_are_typed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meshNetworks");
        let check = |text: &str| {
            std::fs::write(&path, text).unwrap();
            check_mesh_networks(&path)
        };
        assert_eq!(check("networks: {}\n"), []);
        assert_eq!(check(""), []);
        assert_eq!(check("[]\n"), [MeshNetworksError::NotMapping]);
        assert_eq!(
            check("networks: {n1: {}}\nextra: 1\n"),
            [
                MeshNetworksError::UnknownField("extra".into()),
                MeshNetworksError::NamedNetworks
            ]
        );
        assert!(check_mesh_networks(&dir.path().join("missing")).is_empty());
    }
}
