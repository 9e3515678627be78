//! istiod's CA (certificate lifetimes, the plug-in and self-signed roots)
//! and how it authenticates its callers (`JWT_POLICY`, `TOKEN_AUDIENCES`,
//! `JWT_RULE`, `XDS_AUTH`).

use std::path::PathBuf;
use std::time::Duration;

use common::env::Reader;

use crate::ca::authn::{DEFAULT_AUDIENCE, JwtRule, JwtRuleError};
use crate::ca::kube_jwt::{JwtPolicy, UnknownJwtPolicy};

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
/// `CITADEL_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL`: how often the self-signed
/// root is checked (and rotated when in its grace period); 1h, 0 disables.
pub const ENV_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL: &str =
    "CITADEL_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL";
/// `CITADEL_SELF_SIGNED_ROOT_CERT_GRACE_PERIOD_PERCENTILE`: the share of the
/// root's lifetime before its expiry in which a new root is made (20).
pub const ENV_SELF_SIGNED_ROOT_CERT_GRACE_PERIOD_PERCENTILE: &str =
    "CITADEL_SELF_SIGNED_ROOT_CERT_GRACE_PERIOD_PERCENTILE";
/// `CITADEL_ENABLE_JITTER_FOR_ROOT_CERT_ROTATOR`: start the rotator after a
/// random delay below the check interval, so replicas do not check together (true).
pub const ENV_ENABLE_JITTER_FOR_ROOT_CERT_ROTATOR: &str =
    "CITADEL_ENABLE_JITTER_FOR_ROOT_CERT_ROTATOR";
/// `ROOT_CA_DIR`: the plug-in CA directory (`./etc/cacerts`, the `cacerts` Secret's mount).
pub const ENV_ROOT_CA_DIR: &str = "ROOT_CA_DIR";
/// Where the self-signed root is kept between restarts. Istio keeps it in the
/// `istio-ca-secret` Secret; without Kubernetes this directory plays that part.
pub const ENV_SELF_SIGNED_CA_DIR: &str = "ISTIO_SELF_SIGNED_CA_DIR";
/// `XDS_AUTH`: authenticate CA and xDS callers (true).
pub const ENV_XDS_AUTH: &str = "XDS_AUTH";
/// `JWT_POLICY`: how workload tokens are reviewed by the Kubernetes API
/// (`third-party-jwt`, Istio's default: audience `istio-ca`; or `first-party-jwt`).
pub const ENV_JWT_POLICY: &str = "JWT_POLICY";
/// `TOKEN_AUDIENCES`: the audiences a third-party token is reviewed for (`istio-ca`).
pub const ENV_TOKEN_AUDIENCES: &str = "TOKEN_AUDIENCES";

/// Default for `DEFAULT_WORKLOAD_CERT_TTL`.
pub const DEFAULT_WORKLOAD_CERT_TTL: Duration = Duration::from_secs(24 * 3600);
/// Default for `MAX_WORKLOAD_CERT_TTL`.
pub const DEFAULT_MAX_WORKLOAD_CERT_TTL: Duration = Duration::from_secs(90 * 24 * 3600);
/// Default for `CITADEL_SELF_SIGNED_CA_CERT_TTL`.
pub const DEFAULT_SELF_SIGNED_CA_CERT_TTL: Duration = Duration::from_secs(3650 * 24 * 3600);

/// Default for `CITADEL_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL`.
pub const DEFAULT_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL: Duration = Duration::from_secs(3600);
/// Default for `CITADEL_SELF_SIGNED_ROOT_CERT_GRACE_PERIOD_PERCENTILE`.
pub const DEFAULT_ROOT_CERT_GRACE_PERIOD_PERCENTILE: u32 = 20;

/// Why the CA's settings cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaConfigError {
    /// `JWT_POLICY` is not a policy.
    #[error("{ENV_JWT_POLICY}={0}")]
    JwtPolicy(#[from] UnknownJwtPolicy),
    /// `JWT_RULE` does not parse.
    #[error(transparent)]
    JwtRule(#[from] JwtRuleError),
    /// The default lifetime is longer than the longest allowed.
    #[error(
        "{ENV_DEFAULT_WORKLOAD_CERT_TTL} ({}) is longer than {ENV_MAX_WORKLOAD_CERT_TTL} ({})",
        common::duration::format(*default),
        common::duration::format(*max)
    )]
    CertTtlOrder {
        /// `DEFAULT_WORKLOAD_CERT_TTL`.
        default: Duration,
        /// `MAX_WORKLOAD_CERT_TTL`.
        max: Duration,
    },
}

/// The CA and its authenticators.
#[derive(Debug, Clone)]
pub struct CaConfig {
    /// `DEFAULT_WORKLOAD_CERT_TTL`.
    pub default_cert_ttl: Duration,
    /// `MAX_WORKLOAD_CERT_TTL`.
    pub max_cert_ttl: Duration,
    /// `CITADEL_SELF_SIGNED_CA_CERT_TTL`.
    pub self_signed_ca_ttl: Duration,
    /// `CITADEL_SELF_SIGNED_CA_RSA_KEY_SIZE`.
    pub self_signed_ca_rsa_key_size: usize,
    /// `CITADEL_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL` (zero: no rotator).
    pub root_cert_check_interval: Duration,
    /// `CITADEL_SELF_SIGNED_ROOT_CERT_GRACE_PERIOD_PERCENTILE`, 0..=100.
    pub root_cert_grace_percentile: u32,
    /// `CITADEL_ENABLE_JITTER_FOR_ROOT_CERT_ROTATOR`.
    pub root_cert_rotator_jitter: bool,
    /// `ROOT_CA_DIR`.
    pub root_ca_dir: PathBuf,
    /// Self-signed root directory.
    pub self_signed_ca_dir: PathBuf,
    /// `JWT_POLICY`.
    pub jwt_policy: JwtPolicy,
    /// `TOKEN_AUDIENCES`.
    pub token_audiences: Vec<String>,
    /// `JWT_RULE`, if set.
    pub jwt_rule: Option<JwtRule>,
    /// `XDS_AUTH`.
    pub xds_auth: bool,
}

/// Reads the CA's settings.
pub(super) fn parse(r: &mut Reader<'_>) -> CaConfig {
    let jwt_policy = match r.opt_string(ENV_JWT_POLICY) {
        None => JwtPolicy::default(),
        Some(p) => p.parse().unwrap_or_else(|e: UnknownJwtPolicy| {
            r.error(CaConfigError::from(e).to_string());
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
    let jwt_rule = r
        .opt_string(ENV_JWT_RULE)
        .and_then(|json| match JwtRule::parse(&json) {
            Ok(rule) => Some(rule),
            Err(e) => {
                r.error(CaConfigError::from(e).to_string());
                None
            }
        });
    let xds_auth = r.bool(ENV_XDS_AUTH, true);
    let default_cert_ttl = r.duration(ENV_DEFAULT_WORKLOAD_CERT_TTL, DEFAULT_WORKLOAD_CERT_TTL);
    let max_cert_ttl = r.duration(ENV_MAX_WORKLOAD_CERT_TTL, DEFAULT_MAX_WORKLOAD_CERT_TTL);
    if default_cert_ttl > max_cert_ttl {
        r.error(
            CaConfigError::CertTtlOrder {
                default: default_cert_ttl,
                max: max_cert_ttl,
            }
            .to_string(),
        );
    }
    let self_signed_ca_ttl =
        r.duration(ENV_SELF_SIGNED_CA_CERT_TTL, DEFAULT_SELF_SIGNED_CA_CERT_TTL);
    let self_signed_ca_rsa_key_size = r.parse(ENV_SELF_SIGNED_CA_RSA_KEY_SIZE, 2048usize);
    let root_cert_check_interval = r.duration(
        ENV_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL,
        DEFAULT_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL,
    );
    let root_cert_grace_percentile = r.parse(
        ENV_SELF_SIGNED_ROOT_CERT_GRACE_PERIOD_PERCENTILE,
        DEFAULT_ROOT_CERT_GRACE_PERIOD_PERCENTILE,
    );
    if root_cert_grace_percentile > 100 {
        r.error(format!(
            "{ENV_SELF_SIGNED_ROOT_CERT_GRACE_PERIOD_PERCENTILE}={root_cert_grace_percentile}: a percentile is at most 100"
        ));
    }
    let root_cert_rotator_jitter = r.bool(ENV_ENABLE_JITTER_FOR_ROOT_CERT_ROTATOR, true);
    let root_ca_dir = PathBuf::from(r.string(ENV_ROOT_CA_DIR, "./etc/cacerts"));
    let self_signed_ca_dir = PathBuf::from(
        r.string(
            ENV_SELF_SIGNED_CA_DIR,
            &crate::ca::material::default_self_signed_dir()
                .display()
                .to_string(),
        ),
    );
    CaConfig {
        default_cert_ttl,
        max_cert_ttl,
        self_signed_ca_ttl,
        self_signed_ca_rsa_key_size,
        root_cert_check_interval,
        root_cert_grace_percentile,
        root_cert_rotator_jitter,
        root_ca_dir,
        self_signed_ca_dir,
        jwt_policy,
        token_audiences,
        jwt_rule,
        xds_auth,
    }
}

#[cfg(test)]
mod tests {
    use common::env::MapEnv;

    use super::*;

    #[test]
    fn a_default_lifetime_longer_than_the_longest_is_refused() {
        let env = MapEnv::from_pairs([
            (ENV_DEFAULT_WORKLOAD_CERT_TTL, "48h"),
            (ENV_MAX_WORKLOAD_CERT_TTL, "24h"),
        ]);
        let mut r = Reader::new(&env);
        let c = parse(&mut r);
        assert_eq!(c.max_cert_ttl, Duration::from_secs(24 * 3600));
        let errors = r.finish().unwrap_err().0;
        let expected = CaConfigError::CertTtlOrder {
            default: Duration::from_secs(48 * 3600),
            max: Duration::from_secs(24 * 3600),
        };
        assert_eq!(errors, [expected.to_string()]);
        assert!(
            errors[0].starts_with("DEFAULT_WORKLOAD_CERT_TTL ("),
            "{errors:?}"
        );
    }
}
