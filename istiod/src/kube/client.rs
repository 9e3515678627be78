//! The Kubernetes client istiod uses for everything on the API (the config
//! source, TokenReview, the namespace controller, the `cacerts` Secret):
//! from `--kubeconfig` (its current context), or the in-cluster
//! configuration of istiod's Pod (`KUBERNETES_SERVICE_HOST`, the service
//! account's token and CA), as Istio's `kube.BuildClientConfig` does.

use std::path::PathBuf;

/// How istiod reaches the Kubernetes API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeConnection {
    /// `--kubeconfig`: a kubeconfig file (its current context).
    Kubeconfig(PathBuf),
    /// In a Pod: `KUBERNETES_SERVICE_HOST`/`_PORT` and the service account's
    /// token and CA under `/var/run/secrets/kubernetes.io/serviceaccount`.
    InCluster,
}

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file is unreadable or invalid.
    #[error(
        "--kubeconfig {path}: {reason} (point --kubeconfig at a valid kubeconfig, or drop it to use the in-cluster configuration)"
    )]
    Kubeconfig {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The in-cluster configuration is incomplete.
    #[error(
        "in-cluster Kubernetes configuration: {0} (KUBERNETES_SERVICE_HOST is set, so the service account token and CA must be mounted under /var/run/secrets/kubernetes.io/serviceaccount)"
    )]
    InCluster(String),
    /// The client could not be built from the configuration.
    #[error("Kubernetes client: {0}")]
    Client(String),
}

/// Builds the client for `connection`.
pub async fn client(connection: &KubeConnection) -> Result<kube::Client, ClientError> {
    common::tls::install_crypto_provider();
    let config = match connection {
        KubeConnection::Kubeconfig(path) => {
            let kubeconfig_error = |e: &dyn std::fmt::Display| ClientError::Kubeconfig {
                path: path.display().to_string(),
                reason: e.to_string(),
            };
            let kubeconfig =
                kube::config::Kubeconfig::read_from(path).map_err(|e| kubeconfig_error(&e))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| kubeconfig_error(&e))?
        }
        KubeConnection::InCluster => {
            kube::Config::incluster().map_err(|e| ClientError::InCluster(e.to_string()))?
        }
    };
    tracing::info!(target: "kube", "using the Kubernetes API at {}", config.cluster_url);
    kube::Client::try_from(config).map_err(|e| ClientError::Client(e.to_string()))
}
