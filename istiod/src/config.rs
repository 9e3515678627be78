//! istiod's configuration: the flags of `pilot-discovery discovery` (Istio's
//! names and defaults) and the environment variables it reads.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use common::env::{Env, Reader};

use crate::ca::authn::{DEFAULT_AUDIENCE, JwtRule};
use crate::ca::kube_jwt::JwtPolicy;
use crate::kube::KubeConnection;
use crate::mesh::{Mesh, MeshConfig};
use crate::model::kube::LabelSelector;

/// `JWT_RULE`: a JSON `{"issuer","jwks_uri","audiences"}` trusted for CA and xDS callers.
pub const ENV_JWT_RULE: &str = "JWT_RULE";
/// `DEFAULT_WORKLOAD_CERT_TTL`: lifetime when a CSR asks for none (24h).
pub const ENV_DEFAULT_WORKLOAD_CERT_TTL: &str = "DEFAULT_WORKLOAD_CERT_TTL";
/// `MAX_WORKLOAD_CERT_TTL`: longest lifetime a CSR may ask for (90 days).
pub const ENV_MAX_WORKLOAD_CERT_TTL: &str = "MAX_WORKLOAD_CERT_TTL";
/// `CITADEL_SELF_SIGNED_CA_CERT_TTL`: self-signed root lifetime (10 years).
pub const ENV_SELF_SIGNED_CA_CERT_TTL: &str = "CITADEL_SELF_SIGNED_CA_CERT_TTL";
/// `CITADEL_SELF_SIGNED_CA_RSA_KEY_SIZE`: self-signed root key size (2048).
pub const ENV_SELF_SIGNED_CA_RSA_KEY_SIZE: &str = "CITADEL_SELF_SIGNED_CA_RSA_KEY_SIZE";
/// `ROOT_CA_DIR`: the plug-in CA directory (`./etc/cacerts`, the `cacerts` Secret's mount).
pub const ENV_ROOT_CA_DIR: &str = "ROOT_CA_DIR";
/// Where the self-signed root is kept between restarts. Istio keeps it in the
/// `istio-ca-secret` Secret; without Kubernetes this directory plays that part.
pub const ENV_SELF_SIGNED_CA_DIR: &str = "ISTIO_SELF_SIGNED_CA_DIR";
/// `ISTIOD_CUSTOM_HOST`: extra names (comma-separated) for istiod's serving certificate.
pub const ENV_ISTIOD_CUSTOM_HOST: &str = "ISTIOD_CUSTOM_HOST";
/// `POD_NAMESPACE`: istiod's namespace (`istio-system`).
pub const ENV_POD_NAMESPACE: &str = "POD_NAMESPACE";
/// `XDS_AUTH`: authenticate CA and xDS callers (true).
pub const ENV_XDS_AUTH: &str = "XDS_AUTH";
/// Istio's `ENABLE_TLS_ON_SIDECAR_INGRESS` (default false): Sidecar
/// `ingress[].tls` terminates TLS on ports whose mTLS mode is DISABLE;
/// without it such a Sidecar is refused.
pub const ENV_ENABLE_TLS_ON_SIDECAR_INGRESS: &str = "ENABLE_TLS_ON_SIDECAR_INGRESS";
/// `JWT_POLICY`: how workload tokens are reviewed by the Kubernetes API
/// (`third-party-jwt`, Istio's default: audience `istio-ca`; or `first-party-jwt`).
pub const ENV_JWT_POLICY: &str = "JWT_POLICY";
/// `TOKEN_AUDIENCES`: the audiences a third-party token is reviewed for (`istio-ca`).
pub const ENV_TOKEN_AUDIENCES: &str = "TOKEN_AUDIENCES";
/// Set by the kubelet in every Pod: istiod runs in a cluster and uses its
/// in-cluster client configuration when `--kubeconfig` is not given.
pub const ENV_KUBERNETES_SERVICE_HOST: &str = "KUBERNETES_SERVICE_HOST";

/// `PILOT_DEBOUNCE_AFTER`: quiet time before a push (100ms).
pub const ENV_DEBOUNCE_AFTER: &str = "PILOT_DEBOUNCE_AFTER";
/// `PILOT_DEBOUNCE_MAX`: longest a push waits for quiet (10s).
pub const ENV_DEBOUNCE_MAX: &str = "PILOT_DEBOUNCE_MAX";
/// `PILOT_PUSH_THROTTLE`: pushes generated at once (0: Istio's
/// `min(15 + 5 x CPUs, 100)`).
pub const ENV_PUSH_THROTTLE: &str = "PILOT_PUSH_THROTTLE";
/// `PILOT_MAX_REQUESTS_PER_SECOND`: new xDS streams admitted a second (0:
/// Istio's formula from the CPUs).
pub const ENV_MAX_REQUESTS_PER_SECOND: &str = "PILOT_MAX_REQUESTS_PER_SECOND";

/// Default for `DEFAULT_WORKLOAD_CERT_TTL`.
pub const DEFAULT_WORKLOAD_CERT_TTL: Duration = Duration::from_secs(24 * 3600);
/// Default for `MAX_WORKLOAD_CERT_TTL`.
pub const DEFAULT_MAX_WORKLOAD_CERT_TTL: Duration = Duration::from_secs(90 * 24 * 3600);
/// Default for `CITADEL_SELF_SIGNED_CA_CERT_TTL`.
pub const DEFAULT_SELF_SIGNED_CA_CERT_TTL: Duration = Duration::from_secs(3650 * 24 * 3600);

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

fn parse_duration(s: &str) -> Result<Duration, String> {
    common::duration::parse(s).map_err(|e| e.to_string())
}

/// istiod's effective configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Plaintext gRPC listen address; `None` disables it.
    pub grpc_addr: Option<SocketAddr>,
    /// TLS gRPC (xDS + CA) listen address; `None` disables it.
    pub secure_grpc_addr: Option<SocketAddr>,
    /// HTTP (readiness, debug) listen address.
    pub http_addr: Option<SocketAddr>,
    /// Monitoring listen address.
    pub monitoring_addr: Option<SocketAddr>,
    /// DNS domain.
    pub domain: String,
    /// System namespace.
    pub namespace: String,
    /// Cluster ID.
    pub cluster_id: String,
    /// SPIFFE trust domain (mesh config `trustDomain`).
    pub trust_domain: String,
    /// What the generators apply from the mesh config file.
    pub mesh: MeshConfig,
    /// Mesh config `discoverySelectors` from the file.
    pub discovery_selectors: Vec<LabelSelector>,
    /// What the sidecar injector reads from the mesh config file.
    pub mesh_injection: crate::mesh::MeshInjection,
    /// The webhooks on `--httpsAddr`.
    pub webhooks: crate::webhooks::WebhookConfig,
    /// Whether the `--meshConfig` file exists; when it does not, istiod on
    /// Kubernetes watches the `istio` ConfigMap instead, as Istio does.
    pub mesh_file_found: bool,
    /// How to reach the Kubernetes API, if istiod uses it.
    pub kube: Option<KubeConnection>,
    /// `JWT_POLICY`.
    pub jwt_policy: JwtPolicy,
    /// `TOKEN_AUDIENCES`.
    pub token_audiences: Vec<String>,
    /// `JWT_RULE`, if set.
    pub jwt_rule: Option<JwtRule>,
    /// `XDS_AUTH`.
    pub xds_auth: bool,
    /// Istio's feature flags (`ENABLE_TLS_ON_SIDECAR_INGRESS`).
    pub features: crate::model::features::Features,
    /// `DEFAULT_WORKLOAD_CERT_TTL`.
    pub default_cert_ttl: Duration,
    /// `MAX_WORKLOAD_CERT_TTL`.
    pub max_cert_ttl: Duration,
    /// `CITADEL_SELF_SIGNED_CA_CERT_TTL`.
    pub self_signed_ca_ttl: Duration,
    /// `CITADEL_SELF_SIGNED_CA_RSA_KEY_SIZE`.
    pub self_signed_ca_rsa_key_size: usize,
    /// `ROOT_CA_DIR`.
    pub root_ca_dir: PathBuf,
    /// Self-signed root directory.
    pub self_signed_ca_dir: PathBuf,
    /// Names on istiod's serving certificate.
    pub istiod_sans: Vec<String>,
    /// Custom serving certificate, key and root files.
    pub custom_tls: Option<(PathBuf, PathBuf, Option<PathBuf>)>,
    /// gRPC keepalive interval.
    pub keepalive_interval: Duration,
    /// gRPC keepalive timeout.
    pub keepalive_timeout: Duration,
    /// Maximum server connection age.
    pub max_connection_age: Option<Duration>,
    /// Graceful shutdown limit.
    pub shutdown_duration: Duration,
    /// `PILOT_DEBOUNCE_AFTER`.
    pub debounce_after: Duration,
    /// `PILOT_DEBOUNCE_MAX`.
    pub debounce_max: Duration,
    /// `PILOT_PUSH_THROTTLE`.
    pub push_throttle: usize,
    /// `PILOT_MAX_REQUESTS_PER_SECOND`, resolved (never 0).
    pub max_requests_per_second: f64,
    /// `--configDir`, if set.
    pub config_dir: Option<PathBuf>,
    /// The XDS cache (`PILOT_ENABLE_XDS_CACHE`, `PILOT_ENABLE_CDS_CACHE`,
    /// `PILOT_ENABLE_RDS_CACHE`, `PILOT_XDS_CACHE_SIZE`, `PILOT_XDS_CACHE_STATS`).
    pub xds_cache: crate::pushctx::cache::CacheSettings,
    /// `PILOT_XDS_SEND_TIMEOUT`: how long one push may take to be written to
    /// a proxy before its stream is closed (0: no limit, Istio's default).
    pub xds_send_timeout: Duration,
    /// istiod's instance ID for debug answers (`POD_NAME`, else the host
    /// name; Istio's `IstioControlPlaneInstance.ID`).
    pub pod_name: String,
    /// WorkloadEntry auto-registration and health
    /// (`PILOT_ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION`,
    /// `PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS`,
    /// `PILOT_WORKLOAD_ENTRY_GRACE_PERIOD`).
    pub autoregistration: crate::autoregistration::Settings,
}

/// Parses Go's listen address forms: `:15012`, `host:port`, `""` (disabled).
pub fn parse_listen_addr(flag: &str, s: &str) -> Result<Option<SocketAddr>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else if let Some(rest) = s.strip_prefix("localhost:") {
        format!("127.0.0.1:{rest}")
    } else {
        s.to_string()
    };
    full.parse()
        .map(Some)
        .map_err(|_| format!("--{flag}={s:?} is not a listen address (use :PORT or IP:PORT)"))
}

/// Reads the mesh config file; a missing file is Istio's defaults and
/// `found` false.
fn read_mesh_config(path: &std::path::Path, r: &mut Reader<'_>) -> (Mesh, bool) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return (Mesh::default(), false);
    };
    match Mesh::parse(&text) {
        Ok(mesh) => (mesh, true),
        Err(errors) => {
            for e in errors {
                r.error(format!("--meshConfig {}: {e}", path.display()));
            }
            (Mesh::default(), true)
        }
    }
}

/// Reads the mesh networks file (`--networksConfig`, the `meshNetworks` key
/// of Istio's ConfigMap). A mesh of one network is all this istiod builds,
/// so a file naming networks is refused rather than left unapplied.
fn check_mesh_networks(path: &std::path::Path, r: &mut Reader<'_>) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let flag = format!("--networksConfig {}", path.display());
    match serde_yaml_ng::from_str::<Option<serde_json::Value>>(&text) {
        Err(e) => r.error(format!("{flag}: {e}")),
        Ok(None) => {}
        Ok(Some(v)) => {
            let Some(doc) = v.as_object() else {
                r.error(format!("{flag}: must be a mapping with a networks field"));
                return;
            };
            for key in doc.keys().filter(|k| *k != "networks") {
                r.error(format!(
                    "{flag}: {key}: unknown field (MeshNetworks has networks only)"
                ));
            }
            let named = doc
                .get("networks")
                .and_then(|n| n.as_object())
                .is_some_and(|n| !n.is_empty());
            if named {
                r.error(format!(
                    "{flag}: networks is not supported, only {{}} (meshes of several networks, with east-west gateways, are not built)"
                ));
            }
        }
    }
}

impl Config {
    /// Builds the configuration, reporting every invalid value at once.
    pub fn from_args(
        args: &DiscoveryArgs,
        env: &dyn Env,
    ) -> Result<Self, common::env::ConfigErrors> {
        let mut r = Reader::new(env);
        let addr = |flag: &str, v: &str, r: &mut Reader<'_>| match parse_listen_addr(flag, v) {
            Ok(a) => a,
            Err(e) => {
                r.error(e);
                None
            }
        };
        let grpc_addr = addr("grpcAddr", &args.grpc_addr, &mut r);
        let secure_grpc_addr = addr("secureGRPCAddr", &args.secure_grpc_addr, &mut r);
        let http_addr = addr("httpAddr", &args.http_addr, &mut r);
        let monitoring_addr = addr("monitoringAddr", &args.monitoring_addr, &mut r);
        let https_addr = addr("httpsAddr", &args.https_addr, &mut r);
        let webhooks = crate::webhooks::WebhookConfig::read(https_addr, &args.namespace, &mut r);

        let (mesh, mesh_file_found) = read_mesh_config(&args.mesh_config, &mut r);
        // Istio's registries other than Kubernetes (Mock, Consul before it
        // was removed) are not built; the file source is `--configDir`.
        for reg in args.registries.iter().filter(|r| !r.is_empty()) {
            if reg != "Kubernetes" {
                r.error(format!(
                    "--registries {reg:?} is not supported (use Kubernetes, or --configDir for files)"
                ));
            }
        }
        check_mesh_networks(&args.networks_config, &mut r);
        let trust_domain = mesh
            .trust_domain
            .clone()
            .unwrap_or_else(|| common::identity::DEFAULT_TRUST_DOMAIN.to_string());
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
        let jwt_policy = match r.opt_string(ENV_JWT_POLICY) {
            None => JwtPolicy::default(),
            Some(p) => p.parse().unwrap_or_else(|e| {
                r.error(format!("{ENV_JWT_POLICY}={e}"));
                JwtPolicy::default()
            }),
        };
        let token_audiences: Vec<String> = r
            .string(ENV_TOKEN_AUDIENCES, DEFAULT_AUDIENCE)
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(String::from)
            .collect();

        let jwt_rule = match r.opt_string(ENV_JWT_RULE) {
            None => None,
            Some(json) => match JwtRule::parse(&json) {
                Ok(rule) => Some(rule),
                Err(e) => {
                    r.error(e.to_string());
                    None
                }
            },
        };
        let xds_auth = r.bool(ENV_XDS_AUTH, true);
        let features = crate::model::features::Features {
            enable_tls_on_sidecar_ingress: r.bool(ENV_ENABLE_TLS_ON_SIDECAR_INGRESS, false),
        };
        let default_cert_ttl = r.duration(ENV_DEFAULT_WORKLOAD_CERT_TTL, DEFAULT_WORKLOAD_CERT_TTL);
        let max_cert_ttl = r.duration(ENV_MAX_WORKLOAD_CERT_TTL, DEFAULT_MAX_WORKLOAD_CERT_TTL);
        let self_signed_ca_ttl =
            r.duration(ENV_SELF_SIGNED_CA_CERT_TTL, DEFAULT_SELF_SIGNED_CA_CERT_TTL);
        let self_signed_ca_rsa_key_size = r.parse(ENV_SELF_SIGNED_CA_RSA_KEY_SIZE, 2048usize);
        let root_ca_dir = PathBuf::from(r.string(ENV_ROOT_CA_DIR, "./etc/cacerts"));
        let self_signed_ca_dir = PathBuf::from(
            r.string(
                ENV_SELF_SIGNED_CA_DIR,
                &crate::ca::material::default_self_signed_dir()
                    .display()
                    .to_string(),
            ),
        );
        let ns = &args.namespace;
        let mut istiod_sans = vec![
            format!("istiod.{ns}.svc"),
            format!("istiod-remote.{ns}.svc"),
            format!("istio-pilot.{ns}.svc"),
        ];
        if !args.domain.is_empty() {
            istiod_sans.push(format!("istiod.{ns}.svc.{}", args.domain));
        }
        if let Some(extra) = r.opt_string(ENV_ISTIOD_CUSTOM_HOST) {
            istiod_sans.extend(
                extra
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from),
            );
        }
        if default_cert_ttl > max_cert_ttl {
            r.error(format!(
                "{ENV_DEFAULT_WORKLOAD_CERT_TTL} ({}) is longer than {ENV_MAX_WORKLOAD_CERT_TTL} ({})",
                common::duration::format(default_cert_ttl),
                common::duration::format(max_cert_ttl)
            ));
        }
        let custom_tls = match (args.tls_cert_file.as_str(), args.tls_key_file.as_str()) {
            ("", "") => None,
            (c, k) if !c.is_empty() && !k.is_empty() => Some((
                PathBuf::from(c),
                PathBuf::from(k),
                (!args.ca_cert_file.is_empty()).then(|| PathBuf::from(&args.ca_cert_file)),
            )),
            _ => {
                r.error("--tlsCertFile and --tlsKeyFile must be given together");
                None
            }
        };
        let debounce_after = r.duration(ENV_DEBOUNCE_AFTER, crate::push::DEFAULT_DEBOUNCE_AFTER);
        let debounce_max = r.duration(ENV_DEBOUNCE_MAX, crate::push::DEFAULT_DEBOUNCE_MAX);
        // Istio's PILOT_PUSH_THROTTLE: 0 picks min(15 + 5 x CPUs, 100).
        let push_throttle: usize = match r.parse(ENV_PUSH_THROTTLE, 0) {
            0 => crate::xds::rate_limit::default_rate(
                std::thread::available_parallelism().map_or(1, usize::from),
            ) as usize,
            n => n,
        };
        let xds_cache = crate::pushctx::cache::CacheSettings {
            enabled: r.bool("PILOT_ENABLE_XDS_CACHE", true),
            cds: r.bool("PILOT_ENABLE_CDS_CACHE", true),
            rds: r.bool("PILOT_ENABLE_RDS_CACHE", true),
            size: r.parse(
                "PILOT_XDS_CACHE_SIZE",
                crate::pushctx::cache::DEFAULT_CACHE_SIZE,
            ),
            stats: r.bool("PILOT_XDS_CACHE_STATS", false),
        };
        let xds_send_timeout = r.duration("PILOT_XDS_SEND_TIMEOUT", Duration::ZERO);
        let pod_name = r
            .opt_string("POD_NAME")
            .filter(|n| !n.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
            })
            .unwrap_or_else(|| "istiod".into());
        let max_requests_per_second: f64 = r.parse(ENV_MAX_REQUESTS_PER_SECOND, 0.0);
        if max_requests_per_second < 0.0 || !max_requests_per_second.is_finite() {
            r.error(format!(
                "{ENV_MAX_REQUESTS_PER_SECOND}={max_requests_per_second}: must be a rate of 0 or more (0 picks Istio's default from the CPUs)"
            ));
        }
        let max_requests_per_second = if max_requests_per_second > 0.0 {
            max_requests_per_second
        } else {
            crate::xds::rate_limit::default_rate(
                std::thread::available_parallelism().map_or(1, usize::from),
            )
        };
        let max_connection_age = (!args.keepalive_max_server_connection_age.is_zero())
            .then_some(args.keepalive_max_server_connection_age);
        let autoregistration = crate::autoregistration::Settings {
            auto_registration: r.bool(crate::autoregistration::ENV_AUTOREGISTRATION, true),
            health_checks: r.bool(crate::autoregistration::ENV_HEALTH_CHECKS, true),
            grace_period: r.duration(
                crate::autoregistration::ENV_GRACE_PERIOD,
                crate::autoregistration::DEFAULT_GRACE_PERIOD,
            ),
            // Istio's controller: 1.5 x the max connection age.
            max_connection_age: max_connection_age.map(|a| a + a / 2),
            instance_id: pod_name.clone(),
        };
        r.finish()?;
        Ok(Self {
            grpc_addr,
            secure_grpc_addr,
            http_addr,
            monitoring_addr,
            domain: args.domain.clone(),
            namespace: args.namespace.clone(),
            cluster_id: args.cluster_id.clone(),
            trust_domain,
            mesh: mesh.config,
            discovery_selectors: mesh.discovery_selectors,
            mesh_injection: mesh.injection,
            webhooks,
            mesh_file_found,
            kube,
            jwt_policy,
            token_audiences,
            jwt_rule,
            xds_auth,
            features,
            default_cert_ttl,
            max_cert_ttl,
            self_signed_ca_ttl,
            self_signed_ca_rsa_key_size,
            root_ca_dir,
            self_signed_ca_dir,
            istiod_sans,
            custom_tls,
            keepalive_interval: args.keepalive_interval,
            keepalive_timeout: args.keepalive_timeout,
            max_connection_age: (!args.keepalive_max_server_connection_age.is_zero())
                .then_some(args.keepalive_max_server_connection_age),
            shutdown_duration: args.shutdown_duration,
            debounce_after,
            debounce_max,
            push_throttle,
            max_requests_per_second,
            config_dir: (!args.config_dir.is_empty()).then(|| PathBuf::from(&args.config_dir)),
            xds_cache,
            xds_send_timeout,
            pod_name,
            autoregistration,
        })
    }

    /// What the config sources read: the mesh config istiod starts with
    /// and where else config comes from.
    pub fn source_settings(&self) -> crate::source::Settings {
        crate::source::Settings {
            config_dir: self.config_dir.clone(),
            namespace: self.namespace.clone(),
            trust_domain: self.trust_domain.clone(),
            mesh: Mesh {
                trust_domain: Some(self.trust_domain.clone()),
                config: self.mesh.clone(),
                discovery_selectors: self.discovery_selectors.clone(),
                injection: self.mesh_injection.clone(),
            },
            domain: self.domain.clone(),
            mesh_file_found: self.mesh_file_found,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::istio::OutboundMode;
    use clap::Parser;
    use common::env::MapEnv;

    #[derive(clap::Parser)]
    struct T {
        #[command(flatten)]
        a: DiscoveryArgs,
    }

    #[test]
    fn defaults_match_istio() {
        let t = T::parse_from(["istiod", "--meshConfig", "/nonexistent"]);
        let c = Config::from_args(&t.a, &MapEnv::default()).unwrap();
        assert_eq!(c.secure_grpc_addr, Some("0.0.0.0:15012".parse().unwrap()));
        assert_eq!(c.trust_domain, "cluster.local");
        assert_eq!(c.default_cert_ttl, DEFAULT_WORKLOAD_CERT_TTL);
        assert!(
            c.istiod_sans
                .contains(&"istiod.istio-system.svc".to_string())
        );
    }

    fn with_mesh(yaml: &str) -> Result<Config, String> {
        with_mesh_typed(yaml).map_err(|e| e.to_string())
    }

    fn with_mesh_typed(yaml: &str) -> Result<Config, common::env::ConfigErrors> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mesh");
        std::fs::write(&path, yaml).unwrap();
        let t = T::parse_from(["istiod", "--meshConfig", path.to_str().unwrap()]);
        Config::from_args(&t.a, &MapEnv::default())
    }

    #[test]
    fn outbound_traffic_policy_comes_from_the_mesh_config() {
        let c = with_mesh("trustDomain: example.org\n").unwrap();
        assert_eq!(c.trust_domain, "example.org");
        assert_eq!(c.mesh.outbound_traffic_policy, OutboundMode::AllowAny);
        let c = with_mesh("outboundTrafficPolicy: {mode: REGISTRY_ONLY}\n").unwrap();
        assert_eq!(c.mesh.outbound_traffic_policy, OutboundMode::RegistryOnly);
        let c = with_mesh("outboundTrafficPolicy: {}\n").unwrap();
        assert_eq!(c.mesh.outbound_traffic_policy, OutboundMode::AllowAny);
        let c = with_mesh("").unwrap();
        assert_eq!(c.mesh, MeshConfig::default());
    }

    #[test]
    fn unsupported_outbound_traffic_policies_are_refused() {
        let err = with_mesh("outboundTrafficPolicy: {mode: ALLOW_ANY_DYNAMIC_DNS}\n").unwrap_err();
        assert!(
            err.contains("ALLOW_ANY_DYNAMIC_DNS is not supported"),
            "{err}"
        );
        let err = with_mesh("outboundTrafficPolicy: {mode: DENY}\n").unwrap_err();
        assert!(err.contains("\"DENY\" is not a mode"), "{err}");
        let err = with_mesh("outboundTrafficPolicy: {mode: ALLOW_ANY, egressProxy: {host: x}}\n")
            .unwrap_err();
        assert!(err.contains("egressProxy"), "{err}");
    }

    #[test]
    fn kubernetes_is_used_with_a_kubeconfig_or_in_a_pod() {
        let t = T::parse_from(["istiod", "--meshConfig", "/nonexistent"]);
        let c = Config::from_args(&t.a, &MapEnv::default()).unwrap();
        assert_eq!(c.kube, None);
        assert!(!c.mesh_file_found);
        assert_eq!(c.jwt_policy, JwtPolicy::ThirdParty);
        assert_eq!(c.token_audiences, vec!["istio-ca"]);
        let env = MapEnv::from_pairs([("KUBERNETES_SERVICE_HOST", "10.96.0.1")]);
        let c = Config::from_args(&t.a, &env).unwrap();
        assert_eq!(c.kube, Some(KubeConnection::InCluster));
        let t = T::parse_from([
            "istiod",
            "--meshConfig",
            "/nonexistent",
            "--kubeconfig",
            "/k/config",
        ]);
        let env = MapEnv::from_pairs([
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("JWT_POLICY", "first-party-jwt"),
        ]);
        let c = Config::from_args(&t.a, &env).unwrap();
        assert_eq!(
            c.kube,
            Some(KubeConnection::Kubeconfig(PathBuf::from("/k/config")))
        );
        assert_eq!(c.jwt_policy, JwtPolicy::FirstParty);
        let env = MapEnv::from_pairs([("JWT_POLICY", "none")]);
        let err = Config::from_args(&t.a, &env).unwrap_err().to_string();
        assert!(err.contains("JWT_POLICY=\"none\""), "{err}");
    }

    #[test]
    fn discovery_selectors_come_from_the_mesh_config() {
        let c =
            with_mesh("discoverySelectors: [{matchLabels: {istio-discovery: enabled}}]\n").unwrap();
        assert!(c.mesh_file_found);
        assert_eq!(c.discovery_selectors.len(), 1);
        assert!(
            with_mesh("discoverySelectors: [{matchExpressions: [{key: a, operator: In}]}]\n")
                .unwrap_err()
                .contains("needs values")
        );
    }

    #[test]
    fn registries_other_than_kubernetes_are_refused() {
        let t = T::parse_from([
            "istiod",
            "--meshConfig",
            "/nonexistent",
            "--registries",
            "Kubernetes,Mock",
        ]);
        let err = Config::from_args(&t.a, &MapEnv::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--registries \"Mock\" is not supported"),
            "{err}"
        );
    }

    #[test]
    fn mesh_networks_of_one_network_are_accepted_and_named_networks_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meshNetworks");
        let parse = |text: &str| {
            std::fs::write(&path, text).unwrap();
            let t = T::parse_from([
                "istiod",
                "--meshConfig",
                "/nonexistent",
                "--networksConfig",
                path.to_str().unwrap(),
            ]);
            Config::from_args(&t.a, &MapEnv::default())
        };
        // The chart's default ConfigMap key.
        assert!(parse("networks: {}\n").is_ok());
        let err = parse(
            "networks:\n  network1:\n    endpoints: [{fromRegistry: Kubernetes}]\n    gateways: [{address: 198.18.0.9, port: 15443}]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("--networksConfig") && err.contains("networks is not supported"),
            "{err}"
        );
    }

    #[test]
    fn mesh_fields_that_are_not_built_stop_istiod_naming_the_field() {
        let err = with_mesh(
            "protocolDetectionTimeout: 1s\ndefaultConfig: {proxyHeaders: {server: {disabled: true}}}\n",
        )
        .unwrap_err();
        assert!(
            err.contains("protocolDetectionTimeout: \"1s\" is not supported"),
            "{err}"
        );
        assert!(
            err.contains("defaultConfig.proxyHeaders is not supported"),
            "{err}"
        );
        assert!(with_mesh("connectTimeout: 10s\nenableAutoMtls: true\n").is_ok());
    }

    #[test]
    fn every_bad_value_is_reported() {
        let t = T::parse_from([
            "istiod",
            "--secureGRPCAddr",
            "nonsense",
            "--meshConfig",
            "/nonexistent",
        ]);
        let env = MapEnv::from_pairs([("JWT_RULE", "{bad"), ("MAX_WORKLOAD_CERT_TTL", "90x")]);
        let common::env::ConfigErrors(errors) = Config::from_args(&t.a, &env).unwrap_err();
        // One line each, every one in one run.
        let named = |what: &str| errors.iter().filter(|e| e.contains(what)).count();
        assert_eq!(errors.len(), 3, "{errors:#?}");
        for what in ["secureGRPCAddr", "JWT_RULE", "MAX_WORKLOAD_CERT_TTL"] {
            assert_eq!(named(what), 1, "{what}: {errors:#?}");
        }
    }
}
