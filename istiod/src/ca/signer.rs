//! Signs workload certificates as Istio's CA does (`security/pkg/pki/ca`): the
//! SANs are the caller's authenticated identities, never what the CSR asks for.

use std::time::Duration;

use common::{Identity, pki};
use rcgen::{
    CertificateParams, DistinguishedName, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyUsagePurpose,
    SanType,
};
use tonic::Code;

use super::material::{CaBundle, random_serial};

/// Why a CSR was not signed; each maps to Istio's gRPC code.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The CSR does not parse or its signature is wrong (`CSR_ERROR`).
    #[error("CSR: {0}")]
    Csr(String),
    /// The requested lifetime is over the maximum (`TTL_ERROR`).
    #[error("requested TTL {requested}s is greater than the max allowed TTL {max}s")]
    Ttl {
        /// Requested seconds.
        requested: u64,
        /// Allowed seconds.
        max: u64,
    },
    /// The signing certificate is no longer valid.
    #[error("the CA signing certificate has expired")]
    CaExpired,
    /// Certificate generation failed (`CERT_GEN_ERROR`).
    #[error("certificate generation: {0}")]
    CertGen(String),
}

impl SignError {
    /// The gRPC code Istio returns for this error.
    pub fn code(&self) -> Code {
        match self {
            SignError::Csr(_) | SignError::Ttl { .. } => Code::InvalidArgument,
            SignError::CaExpired | SignError::CertGen(_) => Code::Internal,
        }
    }

    /// The `error` label of `citadel_server_csr_sign_err_count`.
    pub fn label(&self) -> &'static str {
        match self {
            SignError::Csr(_) => "CSR_ERROR",
            SignError::Ttl { .. } => "TTL_ERROR",
            SignError::CaExpired | SignError::CertGen(_) => "CERT_GEN_ERROR",
        }
    }
}

/// The CA signer.
pub struct Signer {
    bundle: CaBundle,
    default_ttl: Duration,
    max_ttl: Duration,
    signing_not_after: time::OffsetDateTime,
    chain_pem: Vec<String>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("bundle", &self.bundle)
            .field("default_ttl", &self.default_ttl)
            .field("max_ttl", &self.max_ttl)
            .finish()
    }
}

impl Signer {
    /// A signer with Istio's TTL rules (`DEFAULT_WORKLOAD_CERT_TTL`, `MAX_WORKLOAD_CERT_TTL`).
    pub fn new(
        bundle: CaBundle,
        default_ttl: Duration,
        max_ttl: Duration,
    ) -> Result<Self, SignError> {
        let info =
            pki::cert_info(&bundle.signing_cert).map_err(|e| SignError::CertGen(e.to_string()))?;
        let secs = info
            .not_after
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs() as i64;
        let signing_not_after = time::OffsetDateTime::from_unix_timestamp(secs)
            .map_err(|e| SignError::CertGen(e.to_string()))?;
        let chain_pem = bundle
            .chain
            .iter()
            .map(|c| pki::to_pem(std::slice::from_ref(c)))
            .collect();
        Ok(Self {
            bundle,
            default_ttl,
            max_ttl,
            signing_not_after,
            chain_pem,
        })
    }

    /// The root bundle PEM workloads should trust.
    pub fn root_pem(&self) -> &str {
        &self.bundle.root_pem
    }

    /// The CA material.
    pub fn bundle(&self) -> &CaBundle {
        &self.bundle
    }

    /// Signs `csr_pem` for `identities` with lifetime `ttl` (0 = default) and
    /// returns Istio's response chain: `[leaf, intermediates..., root bundle]`.
    pub fn sign_workload(
        &self,
        csr_pem: &str,
        identities: &[Identity],
        ttl: Duration,
    ) -> Result<Vec<String>, SignError> {
        let sans: Vec<SanType> = identities
            .iter()
            .map(|id| {
                id.to_string()
                    .try_into()
                    .map(SanType::URI)
                    .map_err(|e: rcgen::Error| SignError::CertGen(e.to_string()))
            })
            .collect::<Result<_, _>>()?;
        let leaf = self.sign(csr_pem, sans, ttl)?;
        let mut out = Vec::with_capacity(2 + self.chain_pem.len());
        out.push(leaf);
        out.extend(self.chain_pem.iter().cloned());
        out.push(self.bundle.root_pem.clone());
        Ok(out)
    }

    /// Signs a CSR for the given SANs; returns the leaf PEM.
    pub fn sign(
        &self,
        csr_pem: &str,
        sans: Vec<SanType>,
        ttl: Duration,
    ) -> Result<String, SignError> {
        let csr = pki::parse_csr(csr_pem).map_err(|e| SignError::Csr(e.to_string()))?;
        let ttl = if ttl.is_zero() { self.default_ttl } else { ttl };
        if ttl > self.max_ttl {
            return Err(SignError::Ttl {
                requested: ttl.as_secs(),
                max: self.max_ttl.as_secs(),
            });
        }
        self.issue(&csr.params.public_key, sans, ttl)
    }

    /// Issues a leaf for `public_key` with `sans`, capped at the signing certificate's expiry.
    fn issue(
        &self,
        public_key: &impl rcgen::PublicKeyData,
        sans: Vec<SanType>,
        ttl: Duration,
    ) -> Result<String, SignError> {
        let now = time::OffsetDateTime::now_utc();
        if now >= self.signing_not_after {
            return Err(SignError::CaExpired);
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = sans;
        params.serial_number = Some(random_serial());
        // Istio back-dates two minutes for clock skew.
        params.not_before = now - time::Duration::minutes(2);
        params.not_after = std::cmp::min(now + ttl, self.signing_not_after);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let issuer = Issuer::from_ca_cert_der(&self.bundle.signing_cert, &self.bundle.signing_key)
            .map_err(|e| SignError::CertGen(e.to_string()))?;
        let cert = params
            .signed_by(public_key, &issuer)
            .map_err(|e| SignError::CertGen(e.to_string()))?;
        Ok(cert.pem())
    }

    /// Issues a server certificate with DNS/IP SANs (istiod's own serving certificate).
    pub fn sign_server_cert(
        &self,
        names: &[String],
        ttl: Duration,
    ) -> Result<(String, rcgen::KeyPair), SignError> {
        let key = pki::generate_key(pki::KeyType::EcdsaP256)
            .map_err(|e| SignError::CertGen(e.to_string()))?;
        let sans = names
            .iter()
            .map(|n| match n.parse::<std::net::IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => n
                    .clone()
                    .try_into()
                    .map(SanType::DnsName)
                    .map_err(|e: rcgen::Error| SignError::CertGen(format!("SAN {n:?}: {e}"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let leaf = self.issue(&key, sans, ttl)?;
        let mut chain = leaf;
        for c in &self.chain_pem {
            chain.push_str(c);
        }
        Ok((chain, key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::material::{SelfSignedOptions, load_or_create_self_signed};
    use common::pki::KeyType;

    pub(crate) fn test_signer(dir: &std::path::Path) -> Signer {
        let bundle = load_or_create_self_signed(
            dir,
            &SelfSignedOptions {
                trust_domain: "cluster.local".into(),
                ttl: Duration::from_secs(3650 * 86400),
                rsa_key_size: 2048,
            },
        )
        .unwrap();
        Signer::new(
            bundle,
            Duration::from_secs(86400),
            Duration::from_secs(90 * 86400),
        )
        .unwrap()
    }

    #[test]
    fn leaf_has_caller_identity_and_istio_usages() {
        let dir = tempfile::tempdir().unwrap();
        let signer = test_signer(dir.path());
        let key = pki::generate_key(KeyType::EcdsaP256).unwrap();
        let asked = Identity::new("cluster.local", "other", "admin");
        let csr = pki::csr_pem(&asked, &key).unwrap();
        let caller = Identity::new("cluster.local", "mine", "app");
        let chain = signer
            .sign_workload(&csr, std::slice::from_ref(&caller), Duration::ZERO)
            .unwrap();
        assert_eq!(chain.len(), 2, "leaf then root");
        assert_eq!(chain[1], signer.root_pem());
        let leaf = pki::pem_certs("leaf", &chain[0]).unwrap().remove(0);
        let info = pki::cert_info(&leaf).unwrap();
        assert_eq!(info.uri_sans, vec![caller.to_string()]);
        assert!(!info.is_ca);
        let lifetime = info.lifetime().as_secs();
        assert!(
            (86400 + 120 - 5..=86400 + 120 + 5).contains(&lifetime),
            "{lifetime}"
        );
        let root = pki::pem_certs("root", signer.root_pem()).unwrap().remove(0);
        assert!(pki::signed_by(&leaf, &root));
    }

    #[test]
    fn ttl_over_max_and_bad_csrs_are_invalid_argument() {
        let dir = tempfile::tempdir().unwrap();
        let signer = test_signer(dir.path());
        let key = pki::generate_key(KeyType::EcdsaP256).unwrap();
        let id = Identity::new("cluster.local", "a", "b");
        let csr = pki::csr_pem(&id, &key).unwrap();
        let err = signer
            .sign_workload(
                &csr,
                std::slice::from_ref(&id),
                Duration::from_secs(91 * 86400),
            )
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert_eq!(err.label(), "TTL_ERROR");
        let err = signer
            .sign_workload("not a csr", std::slice::from_ref(&id), Duration::ZERO)
            .unwrap_err();
        assert_eq!(err.label(), "CSR_ERROR");
    }

    #[test]
    fn restart_keeps_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let first = test_signer(dir.path()).root_pem().to_string();
        let second = test_signer(dir.path()).root_pem().to_string();
        assert_eq!(first, second);
    }
}
