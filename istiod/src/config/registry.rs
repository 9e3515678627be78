//! Where istiod's config and services come from (Istio's `RegistryOptions`):
//! the Kubernetes API, or a directory of files.

use std::path::PathBuf;

use common::env::Reader;

use super::args::DiscoveryArgs;
use crate::kube::KubeConnection;

/// Set by the kubelet in every Pod: istiod runs in a cluster and uses its
/// in-cluster client configuration when `--kubeconfig` is not given.
pub const ENV_KUBERNETES_SERVICE_HOST: &str = "KUBERNETES_SERVICE_HOST";

/// Why the registry flags cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// Istio's registries other than Kubernetes (Mock, Consul before it was
    /// removed) are not built; the file source is `--configDir`.
    #[error("--registries {0:?} is not supported (use Kubernetes, or --configDir for files)")]
    Unsupported(String),
}

/// Where config and services come from.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// `--configDir`, if set.
    pub config_dir: Option<PathBuf>,
    /// How to reach the Kubernetes API, if istiod uses it.
    pub kube: Option<KubeConnection>,
    /// `REVISION` as the config sources read it (Istio's `PilotArgs.Revision`,
    /// empty when unset: then every object is this istiod's).
    pub revision: String,
}

/// Reads the registry flags.
pub(super) fn parse(args: &DiscoveryArgs, r: &mut Reader<'_>) -> RegistryConfig {
    for reg in args.registries.iter().filter(|r| !r.is_empty()) {
        if reg != "Kubernetes" {
            r.error(RegistryError::Unsupported(reg.clone()).to_string());
        }
    }
    let kube = if !args.kubeconfig.is_empty() {
        Some(KubeConnection::Kubeconfig(PathBuf::from(&args.kubeconfig)))
    } else if r
        .opt_string(ENV_KUBERNETES_SERVICE_HOST)
        .is_some_and(|h| !h.is_empty())
    {
        Some(KubeConnection::InCluster)
    } else {
        None
    };
    RegistryConfig {
        config_dir: (!args.config_dir.is_empty()).then(|| PathBuf::from(&args.config_dir)),
        kube,
        revision: r.string(crate::webhooks::ENV_REVISION, ""),
    }
}
