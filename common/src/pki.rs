//! Keys, CSRs and certificates: generation with rcgen (ring) and the `rsa`
//! crate (ring cannot generate RSA keys), parsing with x509-parser.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DistinguishedName, KeyPair, SanType,
    SignatureAlgorithm,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use crate::Identity;

/// The smallest RSA key Istio accepts (`pkiutil.MinimumRsaKeySize`).
pub const MIN_RSA_KEY_SIZE: usize = 2048;

/// Errors from key, CSR and certificate handling.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// A key could not be generated.
    #[error("generating a {kind} key: {reason}")]
    KeyGen {
        /// The key kind.
        kind: String,
        /// Why.
        reason: String,
    },
    /// A private key could not be read.
    #[error(
        "{what}: not a usable private key: {reason} (expected a PEM PKCS#8 'PRIVATE KEY' or PKCS#1 'RSA PRIVATE KEY')"
    )]
    BadKey {
        /// Where the key came from.
        what: String,
        /// Why.
        reason: String,
    },
    /// A certificate could not be read.
    #[error("{what}: not a usable certificate: {reason}")]
    BadCert {
        /// Where the certificate came from.
        what: String,
        /// Why.
        reason: String,
    },
    /// rcgen failed.
    #[error("{0}")]
    Rcgen(#[from] rcgen::Error),
}

/// The kind of workload key the agent generates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum KeyType {
    /// RSA with the given modulus size (Istio's default, 2048).
    Rsa(usize),
    /// ECDSA on P-256 (`ECC_SIGNATURE_ALGORITHM=ECDSA`).
    EcdsaP256,
    /// ECDSA on P-384 (`ECC_CURVE=P384`).
    EcdsaP384,
}

impl std::fmt::Display for KeyType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyType::Rsa(bits) => write!(f, "RSA-{bits}"),
            KeyType::EcdsaP256 => f.write_str("ECDSA-P256"),
            KeyType::EcdsaP384 => f.write_str("ECDSA-P384"),
        }
    }
}

/// Generates a private key.
pub fn generate_key(kind: KeyType) -> Result<KeyPair, PkiError> {
    let keygen = |reason: String| PkiError::KeyGen {
        kind: kind.to_string(),
        reason,
    };
    match kind {
        KeyType::Rsa(bits) => {
            use rsa::pkcs8::EncodePrivateKey;
            if bits < MIN_RSA_KEY_SIZE {
                return Err(keygen(format!(
                    "RSA keys must have at least {MIN_RSA_KEY_SIZE} bits"
                )));
            }
            let key = rsa::PrivateKey::new(&mut crypto_common::getrandom::SysRng, bits)
                .map_err(|e| keygen(e.to_string()))?;
            let der = key.to_pkcs8_der().map_err(|e| keygen(e.to_string()))?;
            let der = PrivatePkcs8KeyDer::from(der.as_bytes().to_vec());
            Ok(KeyPair::from_pkcs8_der_and_sign_algo(
                &der,
                &rcgen::PKCS_RSA_SHA256,
            )?)
        }
        KeyType::EcdsaP256 => Ok(KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?),
        KeyType::EcdsaP384 => Ok(KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384)?),
    }
}

/// The certificate template of a self-signed root as Istio's CA makes it:
/// the trust domain as organisation, an unconstrained CA, allowed to sign
/// certificates and CRLs, valid from `not_before` to `not_after`.
pub fn root_ca_params(
    org: &str,
    not_before: time::OffsetDateTime,
    not_after: time::OffsetDateTime,
) -> rcgen::CertificateParams {
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, org);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = not_before;
    params.not_after = not_after;
    params
}

/// Reads a PEM private key: PKCS#8 of any kind, or PKCS#1 RSA (what `openssl genrsa`
/// and Istio's sample `ca-key.pem` hold).
pub fn key_from_pem(what: &str, pem: &str) -> Result<KeyPair, PkiError> {
    let bad = |reason: String| PkiError::BadKey {
        what: what.to_string(),
        reason,
    };
    let der = PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| bad(e.to_string()))?;
    match der {
        PrivateKeyDer::Pkcs8(p8) => KeyPair::try_from(&PrivateKeyDer::Pkcs8(p8))
            .map_err(|e| bad(e.to_string())),
        PrivateKeyDer::Pkcs1(p1) => {
            use rsa::pkcs1::DecodeRsaPrivateKey;
            use rsa::pkcs8::EncodePrivateKey;
            let key = rsa::PrivateKey::from_pkcs1_der(p1.secret_pkcs1_der())
                .map_err(|e| bad(e.to_string()))?;
            let der = key.to_pkcs8_der().map_err(|e| bad(e.to_string()))?;
            let der = PrivatePkcs8KeyDer::from(der.as_bytes().to_vec());
            KeyPair::from_pkcs8_der_and_sign_algo(&der, &rcgen::PKCS_RSA_SHA256)
                .map_err(|e| bad(e.to_string()))
        }
        PrivateKeyDer::Sec1(_) => Err(bad(
            "SEC1 'EC PRIVATE KEY' is not supported; convert it with `openssl pkcs8 -topk8 -nocrypt`"
                .into(),
        )),
        _ => Err(bad("unknown key encoding".into())),
    }
}

/// Builds the CSR Istio's agent sends: an empty subject and a single URI SAN
/// (critical, since the subject is empty) with the workload's SPIFFE identity.
pub fn csr_pem(identity: &Identity, key: &KeyPair) -> Result<String, PkiError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = vec![SanType::URI(identity.to_string().try_into()?)];
    Ok(params.serialize_request(key)?.pem()?)
}

/// A parsed, verified CSR.
pub struct Csr {
    /// The requested parameters (ignored by the CA except for the key).
    pub params: CertificateSigningRequestParams,
}

/// Parses a PEM CSR and verifies its self-signature.
pub fn parse_csr(pem: &str) -> Result<Csr, rcgen::Error> {
    Ok(Csr {
        params: CertificateSigningRequestParams::from_pem(pem)?,
    })
}

/// The signature algorithm that fits a key, for rcgen.
pub fn algorithm_of(key: &KeyPair) -> &'static SignatureAlgorithm {
    key.algorithm()
}

/// Splits a PEM bundle into DER certificates; errors if there is none.
pub fn pem_certs(what: &str, pem: &str) -> Result<Vec<CertificateDer<'static>>, PkiError> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(pem.as_bytes()).collect();
    let certs = certs.map_err(|e| PkiError::BadCert {
        what: what.to_string(),
        reason: e.to_string(),
    })?;
    if certs.is_empty() {
        return Err(PkiError::BadCert {
            what: what.to_string(),
            reason: "no PEM CERTIFICATE block found".into(),
        });
    }
    Ok(certs)
}

/// Encodes DER certificates as PEM, each block ending in a newline.
pub fn to_pem(certs: &[CertificateDer<'_>]) -> String {
    use base64::Engine;
    let mut out = String::new();
    for c in certs {
        let b64 = base64::engine::general_purpose::STANDARD.encode(c.as_ref());
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        for chunk in b64.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out
}

/// The facts about a certificate the mesh cares about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Serial number, lower-case hex.
    pub serial: String,
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
    /// URI SANs, e.g. the SPIFFE identity.
    pub uri_sans: Vec<String>,
    /// DNS SANs.
    pub dns_sans: Vec<String>,
    /// Whether the certificate is a CA.
    pub is_ca: bool,
    /// The subject, as a string.
    pub subject: String,
    /// The issuer, as a string.
    pub issuer: String,
}

impl CertInfo {
    /// The certificate's lifetime.
    pub fn lifetime(&self) -> Duration {
        self.not_after
            .duration_since(self.not_before)
            .unwrap_or_default()
    }
}

fn to_system_time(t: x509_parser::time::ASN1Time) -> SystemTime {
    let secs = t.timestamp();
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64)
    } else {
        UNIX_EPOCH
    }
}

/// Parses a DER certificate.
pub fn cert_info(der: &[u8]) -> Result<CertInfo, PkiError> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| PkiError::BadCert {
        what: "certificate".into(),
        reason: e.to_string(),
    })?;
    let mut uri_sans = Vec::new();
    let mut dns_sans = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::URI(u) => uri_sans.push(u.to_string()),
                GeneralName::DNSName(d) => dns_sans.push(d.to_string()),
                _ => {}
            }
        }
    }
    let is_ca = cert
        .basic_constraints()
        .ok()
        .flatten()
        .map(|bc| bc.value.ca)
        .unwrap_or(false);
    Ok(CertInfo {
        serial: cert.tbs_certificate.raw_serial_as_string().replace(':', ""),
        not_before: to_system_time(cert.validity().not_before),
        not_after: to_system_time(cert.validity().not_after),
        uri_sans,
        dns_sans,
        is_ca,
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
    })
}

/// Whether `cert` is signed by `issuer`'s key (signature check only).
pub fn signed_by(cert: &[u8], issuer: &[u8]) -> bool {
    let (Ok((_, c)), Ok((_, i))) = (
        X509Certificate::from_der(cert),
        X509Certificate::from_der(issuer),
    ) else {
        return false;
    };
    c.verify_signature(Some(i.public_key())).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csr_carries_only_the_identity() {
        let key = generate_key(KeyType::EcdsaP256).unwrap();
        let id = Identity::new("cluster.local", "ns", "sa");
        let pem = csr_pem(&id, &key).unwrap();
        let csr = parse_csr(&pem).unwrap();
        assert_eq!(
            csr.params.params.subject_alt_names,
            vec![SanType::URI(
                "spiffe://cluster.local/ns/ns/sa/sa".try_into().unwrap()
            )]
        );
    }

    #[test]
    fn rsa_keys_round_trip_through_pem() {
        let key = generate_key(KeyType::Rsa(2048)).unwrap();
        let again = key_from_pem("test", &key.serialize_pem()).unwrap();
        assert_eq!(again.public_key_raw(), key.public_key_raw());
        assert!(generate_key(KeyType::Rsa(1024)).is_err());
    }

    #[test]
    fn bad_pem_names_its_source() {
        let err = key_from_pem("ca-key.pem", "garbage")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("ca-key.pem:"), "{err}");
        let err = pem_certs("root-cert.pem", "").unwrap_err().to_string();
        assert!(err.contains("root-cert.pem"), "{err}");
    }
}
