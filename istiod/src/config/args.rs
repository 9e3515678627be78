//! The flags of `pilot-discovery discovery`, Istio's spelling and defaults.

use std::path::PathBuf;
use std::time::Duration;

use common::duration::DurationError;

/// The flags of `istiod discovery`, Istio's spelling.
#[derive(Debug, Clone, clap::Args)]
pub struct DiscoveryArgs {
    /// Discovery service gRPC address, plaintext (`:15010`).
    #[arg(long = "grpcAddr", default_value = ":15010")]
    pub grpc_addr: String,
    /// Discovery service and CA gRPC address over TLS (`:15012`).
    #[arg(long = "secureGRPCAddr", default_value = ":15012")]
    pub secure_grpc_addr: String,
    /// Readiness and debug HTTP address (`:8080`).
    #[arg(long = "httpAddr", default_value = ":8080")]
    pub http_addr: String,
    /// Webhook HTTPS address (`:15017`).
    #[arg(long = "httpsAddr", default_value = ":15017")]
    pub https_addr: String,
    /// Prometheus metrics address (`:15014`).
    #[arg(long = "monitoringAddr", default_value = ":15014")]
    pub monitoring_addr: String,
    /// DNS domain suffix.
    #[arg(long = "domain", default_value = "cluster.local")]
    pub domain: String,
    /// Mesh config file.
    #[arg(long = "meshConfig", default_value = "./etc/istio/config/mesh")]
    pub mesh_config: PathBuf,
    /// Mesh networks file.
    #[arg(
        long = "networksConfig",
        default_value = "./etc/istio/config/meshNetworks"
    )]
    pub networks_config: PathBuf,
    /// Directory of Kubernetes-style YAML config (the file source).
    #[arg(long = "configDir", default_value = "")]
    pub config_dir: String,
    /// Service registries.
    #[arg(
        long = "registries",
        value_delimiter = ',',
        default_value = "Kubernetes"
    )]
    pub registries: Vec<String>,
    /// System namespace.
    #[arg(
        short = 'n',
        long = "namespace",
        env = "POD_NAMESPACE",
        default_value = "istio-system"
    )]
    pub namespace: String,
    /// Cluster ID.
    #[arg(long = "clusterID", env = "CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,
    /// Kubeconfig file (out of cluster).
    #[arg(long = "kubeconfig", default_value = "")]
    pub kubeconfig: String,
    /// Custom serving certificate chain (PEM).
    #[arg(long = "tlsCertFile", default_value = "")]
    pub tls_cert_file: String,
    /// Custom serving key (PEM).
    #[arg(long = "tlsKeyFile", default_value = "")]
    pub tls_key_file: String,
    /// Root of the custom serving certificate.
    #[arg(long = "caCertFile", default_value = "")]
    pub ca_cert_file: String,
    /// gRPC server keepalive interval (its default from
    /// `GRPC_KEEPALIVE_INTERVAL`, as Istio's `pkg/keepalive`).
    #[arg(long = "keepaliveInterval", env = "GRPC_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub keepalive_interval: Duration,
    /// gRPC server keepalive timeout (its default from `GRPC_KEEPALIVE_TIMEOUT`).
    #[arg(long = "keepaliveTimeout", env = "GRPC_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub keepalive_timeout: Duration,
    /// Maximum connection age (Helm sets 30m); 0 means unlimited.
    #[arg(long = "keepaliveMaxServerConnectionAge", default_value = "0s", value_parser = parse_duration)]
    pub keepalive_max_server_connection_age: Duration,
    /// How long a graceful shutdown may take.
    #[arg(long = "shutdownDuration", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_duration: Duration,
    /// `--profile`: Istio serves Go's pprof under `/debug/pprof/` with it.
    /// Accepted so that Istio's arguments start istiod; Go's profiles have
    /// no equivalent here (the README says so).
    #[arg(long = "profile", default_value = "true", num_args = 0..=1, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub profile: bool,
}

/// Parses a duration flag (Go's spelling: `30s`, `1h30m`); clap names the
/// flag in front of the error.
fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    common::duration::parse(s)
}
