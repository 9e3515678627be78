//! Kubernetes `v1` Secrets, as istiod reads them for gateway credentials
//! (Istio's `pilot/pkg/credentials/kube`): the key/certificate layouts it
//! accepts, and redaction, so that a Secret's data never reaches a log, a
//! debug endpoint or a dump of the store.
//!
//! Layouts, as Istio's `extractKeyAndCert` and `extractRoot` read them:
//! - generic: `cert` and `key`, optionally `cacert` (checked first);
//! - `kubernetes.io/tls`: `tls.crt` and `tls.key`, optionally `ca.crt`;
//! - a CA alone (`<name>-cacert` Secrets): `ca.crt` or `cacert`.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine;
use serde::{Deserialize, Serialize};

/// Istio's generic layout: the certificate chain.
pub const GENERIC_CERT: &str = "cert";
/// Istio's generic layout: the private key.
pub const GENERIC_KEY: &str = "key";
/// Istio's generic layout: the CA certificates.
pub const GENERIC_CA: &str = "cacert";
/// `kubernetes.io/tls`: the certificate chain.
pub const TLS_CERT: &str = "tls.crt";
/// `kubernetes.io/tls`: the private key.
pub const TLS_KEY: &str = "tls.key";
/// `kubernetes.io/tls`: the CA certificates (Istio's addition).
pub const TLS_CA: &str = "ca.crt";
/// The suffix of a resource (and Secret) name holding only a CA (Istio's `SdsCaSuffix`).
pub const CA_SUFFIX: &str = "-cacert";

/// A Kubernetes Secret: its type and its data, decoded (`data` is base64
/// in the API, `stringData` plain text and wins over `data`, as the API
/// server merges them).
#[derive(Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(try_from = "SecretWire")]
pub struct Secret {
    /// `type` (`Opaque`, `kubernetes.io/tls`, ...).
    pub secret_type: String,
    /// The data by key.
    pub data: BTreeMap<String, Vec<u8>>,
}

/// A Secret as written.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[derive(Default)]
struct SecretWire {
    #[serde(rename = "type")]
    secret_type: String,
    data: BTreeMap<String, String>,
    string_data: BTreeMap<String, String>,
    #[allow(dead_code)]
    immutable: Option<bool>,
}

/// Why a Secret's `data` does not decode.
#[derive(Debug, thiserror::Error)]
#[error(
    "data.{key}: is not valid base64 (Secret data is base64-encoded; use stringData for plain text)"
)]
pub struct NotBase64 {
    key: String,
}

impl TryFrom<SecretWire> for Secret {
    type Error = NotBase64;
    fn try_from(w: SecretWire) -> Result<Self, NotBase64> {
        let engine = base64::engine::general_purpose::STANDARD;
        let mut data = BTreeMap::new();
        for (key, value) in w.data {
            // The API server accepts base64 with line breaks in YAML.
            let compact: String = value.split_whitespace().collect();
            let bytes = engine
                .decode(compact.as_bytes())
                .map_err(|_| NotBase64 { key: key.clone() })?;
            data.insert(key, bytes);
        }
        for (key, value) in w.string_data {
            data.insert(key, value.into_bytes());
        }
        Ok(Secret {
            secret_type: w.secret_type,
            data,
        })
    }
}

/// The data is never shown: only its keys and sizes.
impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("secret_type", &self.secret_type)
            .field("data", &Redacted(&self.data))
            .finish()
    }
}

struct Redacted<'a>(&'a BTreeMap<String, Vec<u8>>);

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.0
                    .iter()
                    .map(|(k, v)| (k, format!("<redacted, {} bytes>", v.len()))),
            )
            .finish()
    }
}

/// Serialized (for `/debug/configz` and dumps) with every value redacted.
impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        if !self.secret_type.is_empty() {
            map.serialize_entry("type", &self.secret_type)?;
        }
        let data: BTreeMap<&str, String> = self
            .data
            .iter()
            .map(|(k, v)| (k.as_str(), format!("<redacted, {} bytes>", v.len())))
            .collect();
        map.serialize_entry("data", &data)?;
        map.end()
    }
}

/// A server certificate and key, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct CertAndKey {
    /// The certificate chain.
    pub cert: Vec<u8>,
    /// The private key.
    pub key: Vec<u8>,
}

impl fmt::Debug for CertAndKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CertAndKey(<redacted>)")
    }
}

/// Why a Secret holds no usable credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// Neither layout's pair is there.
    #[error(
        "found keys {found:?}, expected {TLS_CERT:?} and {TLS_KEY:?} (kubernetes.io/tls) or {GENERIC_CERT:?} and {GENERIC_KEY:?}"
    )]
    NoCertificate {
        /// The keys the Secret has.
        found: Vec<String>,
    },
    /// No CA key.
    #[error("found keys {found:?}, expected {TLS_CA:?} or {GENERIC_CA:?}")]
    NoCa {
        /// The keys the Secret has.
        found: Vec<String>,
    },
}

impl Secret {
    fn has(&self, key: &str) -> bool {
        self.data.get(key).is_some_and(|v| !v.is_empty())
    }

    /// The certificate and key, generic layout first (Istio's `extractKeyAndCert`).
    pub fn cert_and_key(&self) -> Result<CertAndKey, CredentialError> {
        for (cert, key) in [(GENERIC_CERT, GENERIC_KEY), (TLS_CERT, TLS_KEY)] {
            if self.has(cert) && self.has(key) {
                return Ok(CertAndKey {
                    cert: self.data[cert].clone(),
                    key: self.data[key].clone(),
                });
            }
        }
        Err(CredentialError::NoCertificate {
            found: self.data.keys().cloned().collect(),
        })
    }

    /// The CA certificates (Istio's `extractRoot`: `cacert`, else `ca.crt`).
    pub fn ca(&self) -> Result<&[u8], CredentialError> {
        [GENERIC_CA, TLS_CA]
            .into_iter()
            .find(|k| self.has(k))
            .map(|k| self.data[k].as_slice())
            .ok_or_else(|| CredentialError::NoCa {
                found: self.data.keys().cloned().collect(),
            })
    }

    /// The keys holding PEM this istiod would serve: checked when the
    /// Secret is read, so that an unparsable one is reported there and not
    /// served. Generic keys only when the generic layout is meant (both
    /// `cert` and `key`, or `cacert`): other Secrets may use these names.
    pub fn pem_keys(&self) -> Vec<(&str, PemKind)> {
        let mut out = Vec::new();
        let mut push = |key: &'static str, kind: PemKind| {
            if self.data.contains_key(key) {
                out.push((key, kind));
            }
        };
        push(TLS_CERT, PemKind::Certificates);
        push(TLS_KEY, PemKind::PrivateKey);
        push(TLS_CA, PemKind::Certificates);
        if self.has(GENERIC_CERT) && self.has(GENERIC_KEY) {
            push(GENERIC_CERT, PemKind::Certificates);
            push(GENERIC_KEY, PemKind::PrivateKey);
        }
        push(GENERIC_CA, PemKind::Certificates);
        out
    }
}

/// What a PEM value must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PemKind {
    /// One or more certificates.
    Certificates,
    /// One private key.
    PrivateKey,
}

/// Why a Secret's key does not hold what its name says; the messages never
/// quote the data itself.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    /// The bytes are not UTF-8.
    #[error("is not PEM text")]
    NotText,
    /// No certificate block, or a block that is not base64.
    #[error(transparent)]
    Certificates(#[from] common::pki::PkiError),
    /// A certificate block that is not an X.509 certificate.
    #[error("certificate {index} does not parse: {reason}")]
    BadCertificate {
        /// Its position in the bundle.
        index: usize,
        /// The parser's words.
        reason: String,
    },
    /// No private key block.
    #[error("no PEM private key found ({0})")]
    NoPrivateKey(rustls_pki_types::pem::Error),
}

/// Checks that `pem` holds what `kind` says; the reason when it does not
/// (never the data itself).
pub fn check_pem(pem: &[u8], kind: PemKind) -> Result<(), PemError> {
    use rustls_pki_types::pem::PemObject;
    let text = std::str::from_utf8(pem).map_err(|_| PemError::NotText)?;
    match kind {
        PemKind::Certificates => {
            let certs = common::pki::pem_certs("certificate", text)?;
            for (index, c) in certs.iter().enumerate() {
                x509_parser::parse_x509_certificate(c.as_ref()).map_err(|e| {
                    PemError::BadCertificate {
                        index,
                        reason: e.to_string(),
                    }
                })?;
            }
            Ok(())
        }
        PemKind::PrivateKey => rustls_pki_types::PrivateKeyDer::from_pem_slice(text.as_bytes())
            .map(|_| ())
            .map_err(PemError::NoPrivateKey),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn secret(yaml: &str) -> Secret {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn data_is_base64_and_string_data_wins() {
        let s = secret("{type: Opaque, data: {a: aGVsbG8=, b: eA==}, stringData: {b: plain}}");
        assert_eq!(s.data["a"], b"hello");
        assert_eq!(s.data["b"], b"plain");
        let err = serde_yaml_ng::from_str::<Secret>("{data: {tls.crt: '!!'}}")
            .unwrap_err()
            .to_string();
        assert!(err.contains("data.tls.crt"), "{err}");
    }

    #[test]
    fn layouts_as_istio_reads_them() {
        let s = secret("{stringData: {tls.crt: C, tls.key: K, ca.crt: A}}");
        let ck = s.cert_and_key().unwrap();
        assert_eq!(
            (ck.cert.as_slice(), ck.key.as_slice()),
            (&b"C"[..], &b"K"[..])
        );
        assert_eq!(s.ca().unwrap(), b"A");
        // The generic layout wins when both are there.
        let s = secret("{stringData: {tls.crt: C, tls.key: K, cert: C2, key: K2, cacert: A2}}");
        assert_eq!(s.cert_and_key().unwrap().cert, b"C2");
        assert_eq!(s.ca().unwrap(), b"A2");
        let s = secret("{stringData: {other: x}}");
        assert!(matches!(
            s.cert_and_key(),
            Err(CredentialError::NoCertificate { .. })
        ));
        assert!(matches!(s.ca(), Err(CredentialError::NoCa { .. })));
    }

    #[test]
    fn data_is_never_shown() {
        let s = secret("{stringData: {tls.key: TOPSECRET}}");
        let debug = format!("{s:?}");
        let json = serde_json::to_string(&s).unwrap();
        for shown in [debug, json] {
            assert!(!shown.contains("TOPSECRET"), "{shown}");
            assert!(shown.contains("tls.key"), "{shown}");
        }
    }

    #[test]
    fn pem_is_checked_by_kind() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["a.example.com".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        assert!(check_pem(cert.pem().as_bytes(), PemKind::Certificates).is_ok());
        assert!(check_pem(key.serialize_pem().as_bytes(), PemKind::PrivateKey).is_ok());
        assert!(matches!(
            check_pem(b"garbage", PemKind::Certificates),
            Err(PemError::Certificates(_))
        ));
        assert!(matches!(
            check_pem(cert.pem().as_bytes(), PemKind::PrivateKey),
            Err(PemError::NoPrivateKey(_))
        ));
        assert!(matches!(
            check_pem(&[0xff, 0xfe], PemKind::Certificates),
            Err(PemError::NotText)
        ));
    }

    #[test]
    fn unparsable_pem_is_reported_by_namespace_name_and_key() {
        let yaml = "apiVersion: v1\nkind: Secret\nmetadata: {name: cred, namespace: gw}\ntype: kubernetes.io/tls\nstringData: {tls.crt: not-pem, tls.key: not-pem}\n";
        let errors = crate::model::parse_file("s.yaml", yaml).unwrap_err();
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 2, "{text:?}");
        assert!(
            text[0].contains("Secret/gw/cred") && text[0].contains("data.tls.crt"),
            "{text:?}"
        );
        assert!(text[1].contains("data.tls.key"), "{text:?}");
        assert!(!text.iter().any(|t| t.contains("not-pem")), "{text:?}");
        // Generic keys of a Secret that is no credential are not checked.
        let other = "apiVersion: v1\nkind: Secret\nmetadata: {name: api, namespace: gw}\nstringData: {key: abc}\n";
        assert!(crate::model::parse_file("s.yaml", other).is_ok());
    }
}
