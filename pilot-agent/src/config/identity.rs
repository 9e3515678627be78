//! The workload identity: the SPIFFE name, where its certificate comes from
//! (istiod's CA or mounted files), how it is requested and rotated, and the
//! SDS socket it is served to Envoy on.

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::Identity;
use common::pki::KeyType;

use super::error::ConfigError;
use super::pod::PodConfig;
use super::vars::Vars;
use super::*;

/// OS CA bundles, first existing wins (Istio's list).
pub(super) const SYSTEM_ROOTS: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The SDS socket file name Istio's injected Envoy expects.
const DEFAULT_SDS_SOCKET_FILE: &str = "socket";

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

impl CertSource {
    fn files_in(dir: &str) -> Self {
        let d = PathBuf::from(dir);
        CertSource::Files {
            cert_chain: d.join("cert-chain.pem"),
            key: d.join("key.pem"),
            root: d.join("root-cert.pem"),
        }
    }
}

/// How the workload certificate is obtained, rotated and served.
#[derive(Debug, Clone, serde::Serialize)]
pub struct IdentityConfig {
    /// The workload's SPIFFE identity (`TRUST_DOMAIN`, `POD_NAMESPACE`,
    /// `SERVICE_ACCOUNT`).
    #[serde(serialize_with = "super::serialize_display")]
    pub workload: Identity,
    /// The CA address (`CA_ADDR` or the discovery address).
    pub ca_addr: String,
    /// TLS server name verified for the CA.
    pub ca_server_name: String,
    /// Root bundle file for the CA connection; `None` for plaintext (`:15010`).
    pub ca_root_path: Option<PathBuf>,
    /// Extra CSR metadata headers (`CA_HEADER_*`), names lowercased.
    pub ca_headers: Vec<(String, String)>,
    /// `ISTIO_META_CERT_SIGNER`: CSR metadata `CertSigner`.
    pub cert_signer: Option<String>,
    /// The projected token sent to the CA and istiod.
    pub token_path: PathBuf,
    /// `SECRET_TTL`: the requested certificate lifetime.
    #[serde(serialize_with = "common::duration::serialize")]
    pub secret_ttl: Duration,
    /// `SECRET_GRACE_PERIOD_RATIO`, clamped to 0..=1.
    pub grace_period_ratio: f64,
    /// `SECRET_GRACE_PERIOD_RATIO_JITTER`.
    pub grace_period_ratio_jitter: f64,
    /// The workload key type (`WORKLOAD_RSA_KEY_SIZE`, `ECC_*`).
    pub key_type: KeyType,
    /// `OUTPUT_CERTS`: where the certificate is also written.
    pub output_certs: Option<PathBuf>,
    /// Mode of the files written to `OUTPUT_CERTS` (0644 in a cluster).
    pub output_mode: u32,
    /// Where the certificate comes from.
    pub cert_source: CertSource,
    /// The SDS socket path.
    pub sds_socket: PathBuf,
    /// `WORKLOAD_IDENTITY_SOCKET_FILE`: the socket's file name.
    pub sds_socket_file: String,
}

impl IdentityConfig {
    /// Whether the SDS socket has Istio's default name (another name means
    /// an external SDS server is expected there).
    pub fn sds_socket_is_default(&self) -> bool {
        self.sds_socket_file == DEFAULT_SDS_SOCKET_FILE
    }
}

fn all_exist(dir: &str, files: &[&str]) -> bool {
    files.iter().all(|f| PathBuf::from(dir).join(f).is_file())
}

/// The host of `host:port` or `[v6]:port`.
pub(super) fn host_of(addr: &str) -> String {
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

/// Reads the identity settings; the CA defaults to `discovery_address`.
pub(super) fn parse(v: &mut Vars<'_>, pod: &PodConfig, discovery_address: &str) -> IdentityConfig {
    let trust_domain = v.string(ENV_TRUST_DOMAIN, common::identity::DEFAULT_TRUST_DOMAIN);
    let ca_addr_env = v.opt_string(ENV_CA_ADDR);
    let istiod_san = v.opt_string(ENV_ISTIOD_SAN);
    let ca_addr = ca_addr_env
        .clone()
        .unwrap_or_else(|| discovery_address.to_string());
    // Istio: the host of CA_ADDR when it is set; otherwise ISTIOD_SAN, else
    // the discovery address host.
    let ca_server_name = match (&ca_addr_env, istiod_san) {
        (Some(a), _) => host_of(a),
        (None, Some(san)) => san,
        (None, None) => host_of(discovery_address),
    };
    let ca_root_path = ca_root(v, &ca_addr);
    let ca_headers = v
        .prefixed(ENV_CA_HEADER_PREFIX)
        .into_iter()
        .map(|(k, value)| (k.to_ascii_lowercase(), value))
        .collect();
    let cert_signer = v.opt_string(ENV_CERT_SIGNER);
    let secret_ttl = v.duration(ENV_SECRET_TTL, Duration::from_secs(24 * 3600));
    if secret_ttl.is_zero() {
        v.error(ConfigError::Invalid {
            var: ENV_SECRET_TTL,
            value: common::duration::format(secret_ttl),
            reason: "must be longer than 0s".into(),
        });
    }
    let grace_period_ratio: f64 = v.parse(ENV_SECRET_GRACE_PERIOD_RATIO, 0.5);
    let grace_period_ratio_jitter: f64 = v.parse(ENV_SECRET_GRACE_PERIOD_RATIO_JITTER, 0.01);
    let key_type = key_type(v);
    let output_certs = v.opt_string(ENV_OUTPUT_CERTS).map(PathBuf::from);
    let output_mode = if v.opt_string(ENV_KUBERNETES_SERVICE_HOST).is_some() {
        0o644
    } else {
        0o600
    };
    let cert_source = cert_source(v, output_certs.as_deref());
    let sds_socket_file = v.string(ENV_WORKLOAD_IDENTITY_SOCKET_FILE, DEFAULT_SDS_SOCKET_FILE);
    if sds_socket_file.contains('/') {
        v.error(ConfigError::Invalid {
            var: ENV_WORKLOAD_IDENTITY_SOCKET_FILE,
            value: sds_socket_file.clone(),
            reason: "must be a bare file name, not a path".into(),
        });
    }
    if cert_source == CertSource::Ca {
        for (var, value) in [
            (ENV_POD_NAMESPACE, &pod.namespace),
            (ENV_SERVICE_ACCOUNT, &pod.service_account),
        ] {
            if value.is_empty() {
                v.error(ConfigError::Missing {
                    var,
                    needed_by: "the workload identity needs it",
                });
            }
        }
    }
    IdentityConfig {
        workload: Identity::new(&trust_domain, &pod.namespace, &pod.service_account),
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
        sds_socket: PathBuf::from(SDS_SOCKET_DIR).join(&sds_socket_file),
        sds_socket_file,
    }
}

/// The root the CA connection is verified with, by Istio's precedence.
fn ca_root(v: &mut Vars<'_>, ca_addr: &str) -> Option<PathBuf> {
    let cert_provider = v.string(ENV_PILOT_CERT_PROVIDER, "istiod");
    let prov_cert = v.opt_string(ENV_PROV_CERT);
    if ca_addr.ends_with(":15010") {
        None
    } else if let Some(root) = v.opt_string(ENV_CA_ROOT_CA) {
        if root == "SYSTEM" {
            let found = system_roots();
            if found.is_none() {
                v.error(ConfigError::NoSystemRoots {
                    var: ENV_CA_ROOT_CA,
                });
            }
            found
        } else {
            Some(PathBuf::from(root))
        }
    } else if cert_provider == "custom" {
        Some(PathBuf::from(FILE_CERTS_DIR).join("root-cert.pem"))
    } else if let Some(p) = prov_cert {
        Some(PathBuf::from(p).join("root-cert.pem"))
    } else if cert_provider == "none" {
        v.error(ConfigError::NoCaRoot {
            ca_addr: ca_addr.to_string(),
        });
        None
    } else {
        Some(PathBuf::from(DEFAULT_ROOT_CERT_PATH))
    }
}

/// The first OS CA bundle present.
pub(super) fn system_roots() -> Option<PathBuf> {
    SYSTEM_ROOTS.iter().map(PathBuf::from).find(|p| p.is_file())
}

fn key_type(v: &mut Vars<'_>) -> KeyType {
    let rsa_bits: usize = v.parse(ENV_WORKLOAD_RSA_KEY_SIZE, 2048);
    let key_type = match v.opt_string(ENV_ECC_SIGNATURE_ALGORITHM) {
        None => KeyType::Rsa(rsa_bits),
        Some(algorithm) if algorithm == "ECDSA" => match v.string(ENV_ECC_CURVE, "P256").as_str() {
            "P256" => KeyType::EcdsaP256,
            "P384" => KeyType::EcdsaP384,
            other => {
                v.error(ConfigError::Invalid {
                    var: ENV_ECC_CURVE,
                    value: other.to_string(),
                    reason: "use P256 or P384".into(),
                });
                KeyType::EcdsaP256
            }
        },
        Some(other) => {
            v.error(ConfigError::Invalid {
                var: ENV_ECC_SIGNATURE_ALGORITHM,
                value: other,
                reason: "the only supported value is ECDSA".into(),
            });
            KeyType::Rsa(rsa_bits)
        }
    };
    if rsa_bits < common::pki::MIN_RSA_KEY_SIZE {
        v.error(ConfigError::Invalid {
            var: ENV_WORKLOAD_RSA_KEY_SIZE,
            value: rsa_bits.to_string(),
            reason: format!("the minimum is {}", common::pki::MIN_RSA_KEY_SIZE),
        });
    }
    key_type
}

/// Mounted certificates win over the CA, as in Istio: `FILE_MOUNTED_CERTS`
/// or a complete `./etc/certs` (unless that is where `OUTPUT_CERTS` writes),
/// then a complete workload credentials directory.
fn cert_source(v: &mut Vars<'_>, output_certs: Option<&Path>) -> CertSource {
    let file_mounted = v.bool(ENV_FILE_MOUNTED_CERTS, false);
    let cert_files = ["cert-chain.pem", "key.pem", "root-cert.pem"];
    if file_mounted
        || (all_exist(FILE_CERTS_DIR, &cert_files)
            && output_certs != Some(Path::new(FILE_CERTS_DIR)))
    {
        CertSource::files_in(FILE_CERTS_DIR)
    } else if all_exist(WORKLOAD_CREDENTIALS_DIR, &cert_files) {
        CertSource::files_in(WORKLOAD_CREDENTIALS_DIR)
    } else {
        CertSource::Ca
    }
}
