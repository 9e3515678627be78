//! The agent's configuration: the flags Istio's injection template passes to
//! `pilot-agent proxy` and the environment variables the agent reads, with
//! Istio's names and defaults. Every invalid value is reported at once.

use std::path::PathBuf;
use std::time::Duration;

use common::Identity;
use common::env::{Env, Reader};
use common::pki::KeyType;

/// `POD_NAME`.
pub const ENV_POD_NAME: &str = "POD_NAME";
/// `POD_NAMESPACE`: the workload's namespace (identity, node id).
pub const ENV_POD_NAMESPACE: &str = "POD_NAMESPACE";
/// `SERVICE_ACCOUNT`: the workload's service account (identity).
pub const ENV_SERVICE_ACCOUNT: &str = "SERVICE_ACCOUNT";
/// `TRUST_DOMAIN`: SPIFFE trust domain (`cluster.local`).
pub const ENV_TRUST_DOMAIN: &str = "TRUST_DOMAIN";
/// `CA_ADDR`: the CA endpoint; defaults to the discovery address.
pub const ENV_CA_ADDR: &str = "CA_ADDR";
/// `ISTIOD_SAN`: TLS server name to verify for istiod.
pub const ENV_ISTIOD_SAN: &str = "ISTIOD_SAN";
/// `CA_ROOT_CA`: root for the CA connection (`SYSTEM` = OS roots).
pub const ENV_CA_ROOT_CA: &str = "CA_ROOT_CA";
/// `PILOT_CERT_PROVIDER`: `istiod` (default), `custom` or `none`.
pub const ENV_PILOT_CERT_PROVIDER: &str = "PILOT_CERT_PROVIDER";
/// `PROV_CERT`: directory of provisioning certificates (VMs).
pub const ENV_PROV_CERT: &str = "PROV_CERT";
/// `ISTIO_META_CLUSTER_ID`: sent as the `ClusterID` header.
pub const ENV_CLUSTER_ID: &str = "ISTIO_META_CLUSTER_ID";
/// `ISTIO_META_CERT_SIGNER`: CSR metadata `CertSigner`.
pub const ENV_CERT_SIGNER: &str = "ISTIO_META_CERT_SIGNER";
/// `CA_HEADER_<NAME>`: extra gRPC metadata on CSR calls.
pub const ENV_CA_HEADER_PREFIX: &str = "CA_HEADER_";
/// `SECRET_TTL`: requested certificate lifetime (24h).
pub const ENV_SECRET_TTL: &str = "SECRET_TTL";
/// `SECRET_GRACE_PERIOD_RATIO`: rotate when this share of the lifetime remains (0.5).
pub const ENV_SECRET_GRACE_PERIOD_RATIO: &str = "SECRET_GRACE_PERIOD_RATIO";
/// `SECRET_GRACE_PERIOD_RATIO_JITTER`: random spread on the ratio (0.01).
pub const ENV_SECRET_GRACE_PERIOD_RATIO_JITTER: &str = "SECRET_GRACE_PERIOD_RATIO_JITTER";
/// `WORKLOAD_RSA_KEY_SIZE`: RSA key size (2048).
pub const ENV_WORKLOAD_RSA_KEY_SIZE: &str = "WORKLOAD_RSA_KEY_SIZE";
/// `ECC_SIGNATURE_ALGORITHM`: `ECDSA` selects an EC key.
pub const ENV_ECC_SIGNATURE_ALGORITHM: &str = "ECC_SIGNATURE_ALGORITHM";
/// `ECC_CURVE`: `P256` (default) or `P384`.
pub const ENV_ECC_CURVE: &str = "ECC_CURVE";
/// `OUTPUT_CERTS`: directory to write `key.pem`, `cert-chain.pem`, `root-cert.pem`.
pub const ENV_OUTPUT_CERTS: &str = "OUTPUT_CERTS";
/// `FILE_MOUNTED_CERTS`: serve `./etc/certs/*` instead of asking the CA.
pub const ENV_FILE_MOUNTED_CERTS: &str = "FILE_MOUNTED_CERTS";
/// `WORKLOAD_IDENTITY_SOCKET_FILE`: SDS socket file name (`socket`).
pub const ENV_WORKLOAD_IDENTITY_SOCKET_FILE: &str = "WORKLOAD_IDENTITY_SOCKET_FILE";
/// `KUBERNETES_SERVICE_HOST`: set in a cluster; output files are then 0644.
pub const ENV_KUBERNETES_SERVICE_HOST: &str = "KUBERNETES_SERVICE_HOST";

/// `INSTANCE_IP`: the Pod IP (node id, app probes).
pub const ENV_INSTANCE_IP: &str = "INSTANCE_IP";
/// `HOST_IP`: the node IP, substituted for `$(HOST_IP)`.
pub const ENV_HOST_IP: &str = "HOST_IP";
/// `PROXY_CONFIG`: ProxyConfig YAML/JSON merged over the mesh default.
pub const ENV_PROXY_CONFIG: &str = "PROXY_CONFIG";
/// `ISTIO_BOOTSTRAP_OVERRIDE`: a YAML/JSON file passed to Envoy as `--config-yaml`.
pub const ENV_BOOTSTRAP_OVERRIDE: &str = "ISTIO_BOOTSTRAP_OVERRIDE";
/// `ENVOY_STATUS_PORT`: Envoy's readiness listener (15021).
pub const ENV_ENVOY_STATUS_PORT: &str = "ENVOY_STATUS_PORT";
/// `ENVOY_PROMETHEUS_PORT`: Envoy's Prometheus listener (15090).
pub const ENV_ENVOY_PROMETHEUS_PORT: &str = "ENVOY_PROMETHEUS_PORT";
/// `ENVOY_SECURE_METRICS_PORT`: mTLS Envoy-only stats listener (0 = off).
pub const ENV_ENVOY_SECURE_METRICS_PORT: &str = "ENVOY_SECURE_METRICS_PORT";
/// `ENVOY_SECURE_MERGED_METRICS_PORT`: mTLS merged stats listener (0 = off).
pub const ENV_ENVOY_SECURE_MERGED_METRICS_PORT: &str = "ENVOY_SECURE_MERGED_METRICS_PORT";
/// `MINIMUM_DRAIN_DURATION`: wait before polling connections (5s).
pub const ENV_MINIMUM_DRAIN_DURATION: &str = "MINIMUM_DRAIN_DURATION";
/// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`: drain until no connection is open.
pub const ENV_EXIT_ON_ZERO_ACTIVE_CONNECTIONS: &str = "EXIT_ON_ZERO_ACTIVE_CONNECTIONS";
/// `ENVOY_SKIP_DEPRECATED_LOGS`: `--skip-deprecated-logs` (true).
pub const ENV_ENVOY_SKIP_DEPRECATED_LOGS: &str = "ENVOY_SKIP_DEPRECATED_LOGS";
/// `ISTIO_ENVOY_ENABLE_CORE_DUMP`: `--enable-core-dump`.
pub const ENV_ENVOY_ENABLE_CORE_DUMP: &str = "ISTIO_ENVOY_ENABLE_CORE_DUMP";
/// `ISTIO_DELTA_XDS`: Delta ADS in the bootstrap (true).
pub const ENV_DELTA_XDS: &str = "ISTIO_DELTA_XDS";
/// `ISTIO_CPU_LIMIT`: concurrency when ProxyConfig sets none.
pub const ENV_CPU_LIMIT: &str = "ISTIO_CPU_LIMIT";
/// `ISTIO_KUBE_APP_PROBERS`: rewritten application probes (JSON).
pub const ENV_KUBE_APP_PROBERS: &str = "ISTIO_KUBE_APP_PROBERS";
/// `ISTIO_PROMETHEUS_ANNOTATIONS`: the application's scrape target (JSON).
pub const ENV_PROMETHEUS_ANNOTATIONS: &str = "ISTIO_PROMETHEUS_ANNOTATIONS";

/// `XDS_ROOT_CA`: root for the istiod xDS connection (`SYSTEM` = OS roots).
pub const ENV_XDS_ROOT_CA: &str = "XDS_ROOT_CA";
/// `XDS_HEADER_<NAME>`: extra gRPC metadata on the upstream xDS stream.
pub const ENV_XDS_HEADER_PREFIX: &str = "XDS_HEADER_";

/// `ISTIO_META_DNS_CAPTURE`: run the DNS proxy (sidecars).
pub const ENV_DNS_CAPTURE: &str = "ISTIO_META_DNS_CAPTURE";
/// `DNS_PROXY_ADDR`: where the DNS proxy listens (`localhost:15053`).
pub const ENV_DNS_PROXY_ADDR: &str = "DNS_PROXY_ADDR";

/// Istio's discovery address default.
pub const DEFAULT_DISCOVERY_ADDRESS: &str = "istiod.istio-system.svc:15012";
/// Istio's projected token path.
pub const TOKEN_PATH: &str = "./var/run/secrets/tokens/istio-token";
/// The `istio-ca-root-cert` ConfigMap mount.
pub const DEFAULT_ROOT_CERT_PATH: &str = "./var/run/secrets/istio/root-cert.pem";
/// The SDS socket directory.
pub const SDS_SOCKET_DIR: &str = "./var/run/secrets/workload-spiffe-uds";
/// File-mounted certificates directory.
pub const FILE_CERTS_DIR: &str = "./etc/certs";
/// Workload certificate files that switch the agent to file mode when all present.
pub const WORKLOAD_CREDENTIALS_DIR: &str = "./var/run/secrets/workload-spiffe-credentials";

/// OS CA bundles, first existing wins (Istio's list).
const SYSTEM_ROOTS: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The flags of `pilot-agent proxy`, as Istio's injection template passes them.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ProxyArgs {
    /// Proxy type: `sidecar` (default) or `router`.
    #[arg(default_value = "sidecar")]
    pub proxy_type: String,
    /// DNS domain suffix; `${POD_NAMESPACE}.svc.cluster.local` when empty.
    #[arg(long = "domain", default_value = "")]
    pub domain: String,
    /// Mesh config file; only `defaultConfig` matters.
    #[arg(long = "meshConfig", default_value = "./etc/istio/config/mesh")]
    pub mesh_config: PathBuf,
    /// STS port (metadata only).
    #[arg(long = "stsPort", default_value = "0")]
    pub sts_port: u16,
    /// Accepted, unused (as in Istio).
    #[arg(long = "tokenManagerPlugin", default_value = "")]
    pub token_manager_plugin: String,
    /// Deprecated service cluster name.
    #[arg(long = "serviceCluster", default_value = "istio-proxy")]
    pub service_cluster: String,
    /// Envoy log level, optionally with `component:level` pairs.
    #[arg(long = "proxyLogLevel", default_value = "warning")]
    pub proxy_log_level: String,
    /// Envoy component log levels.
    #[arg(long = "proxyComponentLogLevel", default_value = "")]
    pub proxy_component_log_level: String,
    /// Envoy worker threads (legacy override).
    #[arg(long = "concurrency", default_value = "0")]
    pub concurrency: u32,
    /// Bootstrap template path.
    #[arg(long = "templateFile", default_value = "")]
    pub template_file: String,
    /// Outlier detection log path.
    #[arg(long = "outlierLogPath", default_value = "")]
    pub outlier_log_path: String,
    /// Serve profiling on the status port (accepted for compatibility).
    #[arg(long = "profiling", default_value = "true", num_args = 0..=1, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub profiling: bool,
}

/// Where the agent's workload certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum CertSource {
    /// CSRs to istiod's CA.
    Ca,
    /// Files, watched for changes: chain, key, root.
    Files {
        /// Certificate chain file.
        cert_chain: PathBuf,
        /// Private key file.
        key: PathBuf,
        /// Root bundle file.
        root: PathBuf,
    },
}

/// The agent's effective configuration.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// `sidecar` or `router`.
    pub proxy_type: String,
    /// `POD_NAME`.
    pub pod_name: String,
    /// `POD_NAMESPACE`.
    pub pod_namespace: String,
    /// `SERVICE_ACCOUNT`.
    pub service_account: String,
    /// The workload's SPIFFE identity.
    pub identity: String,
    /// `TRUST_DOMAIN`.
    pub trust_domain: String,
    /// `ISTIO_META_CLUSTER_ID`.
    pub cluster_id: String,
    /// ProxyConfig `discoveryAddress`.
    pub discovery_address: String,
    /// The CA address (`CA_ADDR` or the discovery address).
    pub ca_addr: String,
    /// TLS server name verified for the CA.
    pub ca_server_name: String,
    /// Root bundle file for the CA connection; `None` for plaintext (`:15010`).
    pub ca_root_path: Option<PathBuf>,
    /// Extra CSR metadata headers (`CA_HEADER_*`).
    pub ca_headers: Vec<(String, String)>,
    /// `ISTIO_META_CERT_SIGNER`.
    pub cert_signer: Option<String>,
    /// Projected token path.
    pub token_path: PathBuf,
    /// `SECRET_TTL`.
    #[serde(serialize_with = "common::duration::serialize")]
    pub secret_ttl: Duration,
    /// `SECRET_GRACE_PERIOD_RATIO`.
    pub grace_period_ratio: f64,
    /// `SECRET_GRACE_PERIOD_RATIO_JITTER`.
    pub grace_period_ratio_jitter: f64,
    /// Workload key type.
    pub key_type: KeyType,
    /// `OUTPUT_CERTS`.
    pub output_certs: Option<PathBuf>,
    /// Mode for files written to `OUTPUT_CERTS`.
    pub output_mode: u32,
    /// Certificate source.
    pub cert_source: CertSource,
    /// SDS socket path.
    pub sds_socket: PathBuf,
    /// Whether the SDS socket name is Istio's default.
    pub sds_socket_default_name: bool,
    /// `WORKLOAD_IDENTITY_SOCKET_FILE`.
    pub sds_socket_file: String,
    /// The effective ProxyConfig.
    pub proxy: crate::proxy_config::ProxyConfig,
    /// The Pod's IPs, `INSTANCE_IP` first.
    pub ips: Vec<String>,
    /// `HOST_IP`.
    pub host_ip: String,
    /// DNS domain (`<ns>.svc.cluster.local` by default).
    pub domain: String,
    /// Envoy node id, `TYPE~IP~POD.NS~DOMAIN`.
    pub node_id: String,
    /// Pod labels (downward API).
    pub labels: std::collections::BTreeMap<String, String>,
    /// Pod annotations (downward API).
    pub annotations: std::collections::BTreeMap<String, String>,
    /// The environment the node metadata is built from (`ISTIO_META_*`, `ISTIO_METAJSON_*`, `POD_*`, ...).
    #[serde(skip)]
    pub metadata_env: Vec<(String, String)>,
    /// `ENVOY_STATUS_PORT`.
    pub envoy_status_port: u16,
    /// `ENVOY_PROMETHEUS_PORT`.
    pub envoy_prometheus_port: u16,
    /// `ENVOY_SECURE_METRICS_PORT`.
    pub envoy_secure_metrics_port: u16,
    /// `ENVOY_SECURE_MERGED_METRICS_PORT`.
    pub envoy_secure_merged_metrics_port: u16,
    /// `MINIMUM_DRAIN_DURATION`.
    #[serde(serialize_with = "common::duration::serialize")]
    pub minimum_drain_duration: Duration,
    /// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`.
    pub exit_on_zero_active_connections: bool,
    /// Envoy's command-line options.
    #[serde(skip)]
    pub envoy: crate::envoy::EnvoyOptions,
    /// `ISTIO_DELTA_XDS`.
    pub delta_xds: bool,
    /// `ISTIO_KUBE_APP_PROBERS`.
    pub app_probers: Option<String>,
    /// `ISTIO_PROMETHEUS_ANNOTATIONS`.
    pub prometheus_annotations: Option<String>,
    /// `--outlierLogPath`.
    pub outlier_log_path: String,
    /// `--stsPort`.
    pub sts_port: u16,
    /// `--serviceCluster`.
    pub service_cluster_flag: String,
    /// TLS server name verified for istiod's xDS (`ISTIOD_SAN`, else the
    /// discovery host, `localhost` meaning `istiod.istio-system.svc`).
    pub xds_server_name: String,
    /// Root bundle for the xDS connection; `None` for plaintext (`controlPlaneAuthPolicy: NONE`).
    pub xds_root_path: Option<PathBuf>,
    /// Extra upstream xDS headers (`XDS_HEADER_*`).
    pub xds_headers: Vec<(String, String)>,
    /// The xDS proxy's socket (`<configPath>/XDS`).
    pub xds_socket: PathBuf,
    /// Whether the DNS proxy runs (`ISTIO_META_DNS_CAPTURE` on a sidecar).
    pub dns_capture: bool,
    /// The DNS proxy's address.
    pub dns_proxy_addr: std::net::SocketAddr,
}

fn host_of(addr: &str) -> String {
    if let Some(rest) = addr.strip_prefix('[')
        && let Some((h, _)) = rest.split_once(']')
    {
        return h.to_string();
    }
    match addr.rsplit_once(':') {
        Some((h, _)) => h.to_string(),
        None => addr.to_string(),
    }
}

fn all_exist(dir: &str, files: &[&str]) -> bool {
    files.iter().all(|f| PathBuf::from(dir).join(f).is_file())
}

/// Non-loopback, non-link-local addresses of this host's interfaces, as
/// Istio's agent discovers the Pod IPs when `INSTANCE_IP` is unset.
fn interface_ips() -> Vec<String> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for a in addrs {
        let Some(addr) = a.address else { continue };
        let ip: std::net::IpAddr = if let Some(v4) = addr.as_sockaddr_in() {
            std::net::IpAddr::V4(v4.ip())
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            std::net::IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        let link_local = match ip {
            std::net::IpAddr::V4(v4) => v4.is_link_local(),
            std::net::IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
        };
        if ip.is_loopback() || ip.is_unspecified() || link_local {
            continue;
        }
        let s = ip.to_string();
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

impl Config {
    /// Builds the configuration from the command line and environment.
    pub fn from_env(args: &ProxyArgs, env: &dyn Env) -> Result<Self, String> {
        let mut r = Reader::new(env);
        if !matches!(args.proxy_type.as_str(), "sidecar" | "router") {
            r.error(format!(
                "invalid proxy Type {:?}: use sidecar or router",
                args.proxy_type
            ));
        }
        let pod_name = r.string(ENV_POD_NAME, "");
        let pod_namespace = r.string(ENV_POD_NAMESPACE, "");
        let service_account = r.string(ENV_SERVICE_ACCOUNT, "");
        let trust_domain = r.string(ENV_TRUST_DOMAIN, common::identity::DEFAULT_TRUST_DOMAIN);
        let cluster_id = r.string(ENV_CLUSTER_ID, "");
        let read_map = |path: &str| {
            std::fs::read_to_string(path)
                .map(|t| crate::proxy_config::parse_downward_api(&t))
                .unwrap_or_default()
        };
        let labels = read_map(crate::proxy_config::LABELS_FILE);
        let annotations = read_map(crate::proxy_config::ANNOTATIONS_FILE);
        let proxy_config_env = r.opt_string(ENV_PROXY_CONFIG);
        let proxy = match crate::proxy_config::construct(
            &args.mesh_config,
            proxy_config_env.as_deref(),
            &annotations,
        ) {
            Ok(p) => p,
            Err(e) => {
                r.error(e.to_string());
                crate::proxy_config::ProxyConfig::defaults()
            }
        };
        let discovery_address = proxy
            .discovery_address
            .clone()
            .unwrap_or_else(|| DEFAULT_DISCOVERY_ADDRESS.to_string());
        let ca_addr_env = r.opt_string(ENV_CA_ADDR);
        let istiod_san = r.opt_string(ENV_ISTIOD_SAN);
        let ca_addr = ca_addr_env
            .clone()
            .unwrap_or_else(|| discovery_address.clone());
        // Istio: the host of CA_ADDR when it is set; otherwise ISTIOD_SAN, else
        // the discovery address host.
        let ca_server_name = match (&ca_addr_env, &istiod_san) {
            (Some(a), _) => host_of(a),
            (None, Some(san)) => san.clone(),
            (None, None) => host_of(&discovery_address),
        };
        let cert_provider = r.string(ENV_PILOT_CERT_PROVIDER, "istiod");
        let prov_cert = r.opt_string(ENV_PROV_CERT);
        let ca_root_path = if ca_addr.ends_with(":15010") {
            None
        } else if let Some(root) = r.opt_string(ENV_CA_ROOT_CA) {
            if root == "SYSTEM" {
                match SYSTEM_ROOTS.iter().find(|p| PathBuf::from(p).is_file()) {
                    Some(p) => Some(PathBuf::from(p)),
                    None => {
                        r.error(format!(
                            "{ENV_CA_ROOT_CA}=SYSTEM but no OS CA bundle was found"
                        ));
                        None
                    }
                }
            } else {
                Some(PathBuf::from(root))
            }
        } else if cert_provider == "custom" {
            Some(PathBuf::from(FILE_CERTS_DIR).join("root-cert.pem"))
        } else if let Some(p) = &prov_cert {
            Some(PathBuf::from(p).join("root-cert.pem"))
        } else if cert_provider == "none" {
            r.error(format!(
                "{ENV_PILOT_CERT_PROVIDER}=none but a root certificate is needed for {ca_addr}; set {ENV_CA_ROOT_CA}"
            ));
            None
        } else {
            Some(PathBuf::from(DEFAULT_ROOT_CERT_PATH))
        };
        let ca_headers = r
            .prefixed(ENV_CA_HEADER_PREFIX)
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect();
        let cert_signer = r.opt_string(ENV_CERT_SIGNER);
        let secret_ttl = r.duration(ENV_SECRET_TTL, Duration::from_secs(24 * 3600));
        if secret_ttl.is_zero() {
            r.error(format!("{ENV_SECRET_TTL} must be longer than 0s"));
        }
        let grace_period_ratio: f64 = r.parse(ENV_SECRET_GRACE_PERIOD_RATIO, 0.5);
        let grace_period_ratio_jitter: f64 = r.parse(ENV_SECRET_GRACE_PERIOD_RATIO_JITTER, 0.01);
        let rsa_bits: usize = r.parse(ENV_WORKLOAD_RSA_KEY_SIZE, 2048);
        let key_type = match r.opt_string(ENV_ECC_SIGNATURE_ALGORITHM).as_deref() {
            None => KeyType::Rsa(rsa_bits),
            Some("ECDSA") => match r.string(ENV_ECC_CURVE, "P256").as_str() {
                "P256" => KeyType::EcdsaP256,
                "P384" => KeyType::EcdsaP384,
                other => {
                    r.error(format!("{ENV_ECC_CURVE}={other:?}: use P256 or P384"));
                    KeyType::EcdsaP256
                }
            },
            Some(other) => {
                r.error(format!(
                    "{ENV_ECC_SIGNATURE_ALGORITHM}={other:?}: the only supported value is ECDSA"
                ));
                KeyType::Rsa(rsa_bits)
            }
        };
        if rsa_bits < common::pki::MIN_RSA_KEY_SIZE {
            r.error(format!(
                "{ENV_WORKLOAD_RSA_KEY_SIZE}={rsa_bits}: the minimum is {}",
                common::pki::MIN_RSA_KEY_SIZE
            ));
        }
        let output_certs = r.opt_string(ENV_OUTPUT_CERTS).map(PathBuf::from);
        let output_mode = if r.opt_string(ENV_KUBERNETES_SERVICE_HOST).is_some() {
            0o644
        } else {
            0o600
        };
        let file_mounted = r.bool(ENV_FILE_MOUNTED_CERTS, false);
        let cert_files = ["cert-chain.pem", "key.pem", "root-cert.pem"];
        let cert_source = if file_mounted
            || (all_exist(FILE_CERTS_DIR, &cert_files)
                && output_certs.as_deref() != Some(std::path::Path::new(FILE_CERTS_DIR)))
        {
            let d = PathBuf::from(FILE_CERTS_DIR);
            CertSource::Files {
                cert_chain: d.join("cert-chain.pem"),
                key: d.join("key.pem"),
                root: d.join("root-cert.pem"),
            }
        } else if all_exist(WORKLOAD_CREDENTIALS_DIR, &cert_files) {
            let d = PathBuf::from(WORKLOAD_CREDENTIALS_DIR);
            CertSource::Files {
                cert_chain: d.join("cert-chain.pem"),
                key: d.join("key.pem"),
                root: d.join("root-cert.pem"),
            }
        } else {
            CertSource::Ca
        };
        let socket_file = r.string(ENV_WORKLOAD_IDENTITY_SOCKET_FILE, "socket");
        if socket_file.contains('/') {
            r.error(format!(
                "{ENV_WORKLOAD_IDENTITY_SOCKET_FILE}={socket_file:?} must be a bare file name, not a path"
            ));
        }
        if cert_source == CertSource::Ca {
            if pod_namespace.is_empty() {
                r.error(format!(
                    "{ENV_POD_NAMESPACE} is not set: the workload identity needs it"
                ));
            }
            if service_account.is_empty() {
                r.error(format!(
                    "{ENV_SERVICE_ACCOUNT} is not set: the workload identity needs it"
                ));
            }
        }
        let identity = Identity::new(&trust_domain, &pod_namespace, &service_account).to_string();

        // Node identity (Istio's ServiceNode).
        let instance_ip = r.string(ENV_INSTANCE_IP, "");
        let mut ips = Vec::new();
        if !instance_ip.is_empty() {
            ips.push(instance_ip.clone());
        }
        for ip in interface_ips() {
            if !ips.contains(&ip) {
                ips.push(ip);
            }
        }
        if ips.is_empty() {
            ips = vec!["127.0.0.1".to_string(), "::1".to_string()];
        }
        let host_ip = r.string(ENV_HOST_IP, "");
        let domain = if args.domain.is_empty() {
            format!("{pod_namespace}.svc.cluster.local")
        } else {
            args.domain.clone()
        };
        let node_id = format!(
            "{}~{}~{}.{}~{}",
            args.proxy_type, ips[0], pod_name, pod_namespace, domain
        );
        let ipv6 = ips.iter().all(|ip| ip.contains(':'));

        let envoy_status_port = r.parse(ENV_ENVOY_STATUS_PORT, 15021u16);
        let envoy_prometheus_port = r.parse(ENV_ENVOY_PROMETHEUS_PORT, 15090u16);
        let envoy_secure_metrics_port = r.parse(ENV_ENVOY_SECURE_METRICS_PORT, 0u16);
        let envoy_secure_merged_metrics_port = r.parse(ENV_ENVOY_SECURE_MERGED_METRICS_PORT, 0u16);
        let minimum_drain_duration = r.duration(ENV_MINIMUM_DRAIN_DURATION, Duration::from_secs(5));
        let exit_on_zero_active_connections = r.bool(ENV_EXIT_ON_ZERO_ACTIVE_CONNECTIONS, false);
        let delta_xds = r.bool(ENV_DELTA_XDS, true);
        let cpu_limit: u32 = r.parse(ENV_CPU_LIMIT, 0);
        let concurrency = if args.concurrency > 0 {
            args.concurrency
        } else {
            proxy.concurrency.filter(|c| *c > 0).unwrap_or(cpu_limit)
        };
        let config_yaml = match r.opt_string(ENV_BOOTSTRAP_OVERRIDE) {
            None => None,
            Some(path) => {
                match crate::envoy::read_bootstrap_override(std::path::Path::new(&path), &host_ip) {
                    Ok(json) => Some(json),
                    Err(e) => {
                        r.error(e.to_string());
                        None
                    }
                }
            }
        };
        let envoy = crate::envoy::EnvoyOptions {
            binary: proxy.binary_path().to_string(),
            config_file: PathBuf::from(proxy.config_path()).join("envoy-rev.json"),
            drain_duration: proxy.drain_duration(),
            ipv6,
            file_flush_interval: proxy
                .file_flush_interval
                .map(|d| d.0)
                .unwrap_or(Duration::from_secs(1)),
            file_flush_min_size_kb: proxy.file_flush_min_size_kb.unwrap_or(0),
            log_level: args.proxy_log_level.clone(),
            component_log_level: args.proxy_component_log_level.clone(),
            skip_deprecated_logs: r.bool(ENV_ENVOY_SKIP_DEPRECATED_LOGS, true),
            enable_core_dump: r.bool(ENV_ENVOY_ENABLE_CORE_DUMP, false),
            config_yaml,
            concurrency,
        };
        let mut metadata_env: Vec<(String, String)> = Vec::new();
        for prefix in ["ISTIO_META_", "ISTIO_METAJSON_"] {
            for (k, v) in r.prefixed(prefix) {
                metadata_env.push((format!("{prefix}{k}"), v));
            }
        }
        for key in [
            ENV_POD_NAME,
            ENV_POD_NAMESPACE,
            ENV_SERVICE_ACCOUNT,
            "DNS_PROXY_ADDR",
            ENV_INSTANCE_IP,
        ] {
            if let Some(v) = env.get(key) {
                metadata_env.push((key.to_string(), v));
            }
        }
        let discovery_host = host_of(&discovery_address);
        let xds_server_name = match &istiod_san {
            Some(san) => san.clone(),
            None if discovery_host.contains("localhost") => "istiod.istio-system.svc".to_string(),
            None => discovery_host,
        };
        let xds_root_path = if proxy.control_plane_auth_policy.as_deref() == Some("NONE") {
            None
        } else if let Some(root) = r.opt_string(ENV_XDS_ROOT_CA) {
            if root == "SYSTEM" {
                SYSTEM_ROOTS
                    .iter()
                    .find(|p| PathBuf::from(p).is_file())
                    .map(PathBuf::from)
            } else {
                Some(PathBuf::from(root))
            }
        } else if PathBuf::from(FILE_CERTS_DIR)
            .join("root-cert.pem")
            .is_file()
        {
            Some(PathBuf::from(FILE_CERTS_DIR).join("root-cert.pem"))
        } else if let Some(p) = &prov_cert {
            Some(PathBuf::from(p).join("root-cert.pem"))
        } else {
            Some(PathBuf::from(DEFAULT_ROOT_CERT_PATH))
        };
        let xds_headers = r
            .prefixed(ENV_XDS_HEADER_PREFIX)
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect();
        let xds_socket = PathBuf::from(proxy.config_path()).join("XDS");
        let dns_capture = r.bool(ENV_DNS_CAPTURE, false) && args.proxy_type == "sidecar";
        let dns_addr =
            r.string(ENV_DNS_PROXY_ADDR, "localhost:15053")
                .replacen("localhost:", "127.0.0.1:", 1);
        let dns_proxy_addr = match dns_addr.parse() {
            Ok(a) => a,
            Err(_) => {
                r.error(format!(
                    "{ENV_DNS_PROXY_ADDR}={dns_addr:?} is not an IP:port address"
                ));
                std::net::SocketAddr::from(([127, 0, 0, 1], 15053))
            }
        };
        let app_probers = r.opt_string(ENV_KUBE_APP_PROBERS);
        let prometheus_annotations = r.opt_string(ENV_PROMETHEUS_ANNOTATIONS);
        r.finish()?;
        Ok(Self {
            proxy_type: args.proxy_type.clone(),
            pod_name,
            pod_namespace,
            service_account,
            identity,
            trust_domain,
            cluster_id,
            discovery_address,
            ca_addr,
            ca_server_name,
            ca_root_path,
            ca_headers,
            cert_signer,
            token_path: PathBuf::from(TOKEN_PATH),
            secret_ttl,
            grace_period_ratio: grace_period_ratio.clamp(0.0, 1.0),
            grace_period_ratio_jitter,
            key_type,
            output_certs,
            output_mode,
            cert_source,
            sds_socket: PathBuf::from(SDS_SOCKET_DIR).join(&socket_file),
            sds_socket_default_name: socket_file == "socket",
            sds_socket_file: socket_file,
            proxy,
            ips,
            host_ip,
            domain,
            node_id,
            labels,
            annotations,
            metadata_env,
            envoy_status_port,
            envoy_prometheus_port,
            envoy_secure_metrics_port,
            envoy_secure_merged_metrics_port,
            minimum_drain_duration,
            exit_on_zero_active_connections,
            envoy,
            delta_xds,
            app_probers,
            prometheus_annotations,
            outlier_log_path: args.outlier_log_path.clone(),
            sts_port: args.sts_port,
            service_cluster_flag: args.service_cluster.clone(),
            xds_server_name,
            xds_root_path,
            xds_headers,
            xds_socket,
            dns_capture,
            dns_proxy_addr,
        })
    }

    /// The workload identity.
    pub fn workload_identity(&self) -> Identity {
        Identity::new(
            &self.trust_domain,
            &self.pod_namespace,
            &self.service_account,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::env::MapEnv;

    fn args() -> ProxyArgs {
        ProxyArgs {
            proxy_type: "sidecar".into(),
            ..Default::default()
        }
    }

    #[test]
    fn istio_defaults() {
        let env = MapEnv::from_pairs([("POD_NAMESPACE", "ns"), ("SERVICE_ACCOUNT", "sa")]);
        let c = Config::from_env(&args(), &env).unwrap();
        assert_eq!(c.ca_addr, "istiod.istio-system.svc:15012");
        assert_eq!(c.ca_server_name, "istiod.istio-system.svc");
        assert_eq!(
            c.ca_root_path,
            Some(PathBuf::from("./var/run/secrets/istio/root-cert.pem"))
        );
        assert_eq!(c.key_type, KeyType::Rsa(2048));
        assert_eq!(c.secret_ttl, Duration::from_secs(86400));
        assert_eq!(c.identity, "spiffe://cluster.local/ns/ns/sa/sa");
        assert_eq!(
            c.sds_socket,
            PathBuf::from("./var/run/secrets/workload-spiffe-uds/socket")
        );
    }

    #[test]
    fn ca_addr_sets_server_name_and_plaintext() {
        let env = MapEnv::from_pairs([
            ("POD_NAMESPACE", "ns"),
            ("SERVICE_ACCOUNT", "sa"),
            ("CA_ADDR", "localhost:15012"),
            ("ISTIOD_SAN", "ignored.when.ca.addr.set"),
            ("ECC_SIGNATURE_ALGORITHM", "ECDSA"),
            ("CA_HEADER_X_Foo", "bar"),
        ]);
        let c = Config::from_env(&args(), &env).unwrap();
        assert_eq!(c.ca_server_name, "localhost");
        assert_eq!(c.key_type, KeyType::EcdsaP256);
        assert_eq!(c.ca_headers, vec![("x_foo".to_string(), "bar".to_string())]);
        let env = MapEnv::from_pairs([
            ("POD_NAMESPACE", "ns"),
            ("SERVICE_ACCOUNT", "sa"),
            ("CA_ADDR", "istiod:15010"),
        ]);
        assert_eq!(Config::from_env(&args(), &env).unwrap().ca_root_path, None);
    }

    #[test]
    fn reports_every_bad_value() {
        let env = MapEnv::from_pairs([
            ("SECRET_TTL", "soon"),
            ("ECC_CURVE", "P999"),
            ("ECC_SIGNATURE_ALGORITHM", "ECDSA"),
            ("WORKLOAD_IDENTITY_SOCKET_FILE", "a/b"),
        ]);
        let err = Config::from_env(&args(), &env).unwrap_err();
        for want in [
            "SECRET_TTL",
            "ECC_CURVE",
            "WORKLOAD_IDENTITY_SOCKET_FILE",
            "POD_NAMESPACE",
            "SERVICE_ACCOUNT",
        ] {
            assert!(err.contains(want), "{want} missing from {err}");
        }
    }
}
