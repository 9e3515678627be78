//! Where the CA's signing key and certificates come from, in Istio's order:
//! a plug-in CA in `ROOT_CA_DIR` (`./etc/cacerts`, Istio's file names, the
//! mount of the `cacerts` Secret) wins; on Kubernetes without those files,
//! the `cacerts` Secret read from the API (same keys); otherwise a
//! self-signed root kept in a directory (the file form of Istio's
//! `istio-ca-secret` Secret) so that a restart keeps the same root.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::pki::{self, KeyType};
use rcgen::{CertificateParams, KeyPair, SerialNumber};
use rustls_pki_types::CertificateDer;

/// Istio's plug-in CA file names.
pub const CA_CERT_FILE: &str = "ca-cert.pem";
/// The signing key of the plug-in CA.
pub const CA_KEY_FILE: &str = "ca-key.pem";
/// The chain from the signing certificate up to (not necessarily including) the root.
pub const CERT_CHAIN_FILE: &str = "cert-chain.pem";
/// The root bundle.
pub const ROOT_CERT_FILE: &str = "root-cert.pem";

/// Why the CA material could not be loaded or created.
#[derive(Debug, thiserror::Error)]
pub enum MaterialError {
    /// A plug-in bundle lacks a file.
    #[error(
        "plug-in CA in {dir} is incomplete: {missing} is missing (a plug-in CA needs {CA_CERT_FILE}, {CA_KEY_FILE}, {CERT_CHAIN_FILE} and {ROOT_CERT_FILE}; remove the directory's files to use a self-signed root)"
    )]
    Incomplete {
        /// The directory.
        dir: String,
        /// The missing file.
        missing: String,
    },
    /// A plug-in Secret lacks a key.
    #[error(
        "plug-in CA in Secret {secret} is incomplete: key {missing} is missing (a plug-in CA needs {CA_CERT_FILE}, {CA_KEY_FILE}, {CERT_CHAIN_FILE} and {ROOT_CERT_FILE}; complete the Secret or delete it to use a self-signed root)"
    )]
    IncompleteSecret {
        /// The Secret, `namespace/name`.
        secret: String,
        /// The missing key.
        missing: String,
    },
    /// The self-signed CA's Secret lacks a key.
    #[error(
        "the self-signed CA in Secret {secret} is incomplete: key {missing} is missing (it needs {CA_CERT_FILE} and {CA_KEY_FILE}; delete the Secret to have istiod make a new root, which every workload must then be given)"
    )]
    IncompleteCaSecret {
        /// The Secret, `namespace/name`.
        secret: String,
        /// The missing key.
        missing: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file's content is unusable.
    #[error(transparent)]
    Pki(#[from] pki::PkiError),
    /// The files do not belong together.
    #[error("{path}: {reason}")]
    Mismatch {
        /// The offending file.
        path: String,
        /// What does not match.
        reason: String,
    },
    /// rcgen failed.
    #[error("creating the self-signed root: {0}")]
    Rcgen(#[from] rcgen::Error),
}

/// The CA's signing material.
pub struct CaBundle {
    /// The key that signs workload certificates.
    pub signing_key: KeyPair,
    /// The signing certificate (the root itself when self-signed).
    pub signing_cert: CertificateDer<'static>,
    /// Certificates between the signing certificate and the root, signing certificate first.
    /// Empty for a self-signed root.
    pub chain: Vec<CertificateDer<'static>>,
    /// The root bundle as PEM (what workloads trust).
    pub root_pem: String,
    /// The root bundle, parsed.
    pub roots: Vec<CertificateDer<'static>>,
    /// Where the material came from, for logs.
    pub source: String,
}

impl std::fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaBundle")
            .field("source", &self.source)
            .field("chain_len", &self.chain.len())
            .field("roots", &self.roots.len())
            .finish_non_exhaustive()
    }
}

/// Options for the self-signed root (Istio's `CITADEL_SELF_SIGNED_*` variables).
#[derive(Debug, Clone)]
pub struct SelfSignedOptions {
    /// The trust domain, written as the root's Organization.
    pub trust_domain: String,
    /// Root lifetime (`CITADEL_SELF_SIGNED_CA_CERT_TTL`, 10 years).
    pub ttl: Duration,
    /// RSA key size (`CITADEL_SELF_SIGNED_CA_RSA_KEY_SIZE`, 2048).
    pub rsa_key_size: usize,
}

fn read(path: &Path) -> Result<String, MaterialError> {
    fs::read_to_string(path).map_err(|source| MaterialError::Io {
        path: path.display().to_string(),
        source,
    })
}

fn write(path: &Path, contents: &str, mode: u32) -> Result<(), MaterialError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| MaterialError::Io {
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut f = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io)?;
    f.write_all(contents.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    fs::rename(&tmp, path).map_err(io)
}

/// Whether `dir` holds any plug-in CA file (then it must hold all of them).
pub fn has_plugin_ca(dir: &Path) -> bool {
    [CA_CERT_FILE, CA_KEY_FILE, CERT_CHAIN_FILE, ROOT_CERT_FILE]
        .iter()
        .any(|f| dir.join(f).exists())
}

/// Loads a complete plug-in CA bundle from `dir`, checking that it belongs together.
pub fn load_plugin(dir: &Path) -> Result<CaBundle, MaterialError> {
    for f in [CA_CERT_FILE, CA_KEY_FILE, CERT_CHAIN_FILE, ROOT_CERT_FILE] {
        if !dir.join(f).exists() {
            return Err(MaterialError::Incomplete {
                dir: dir.display().to_string(),
                missing: f.to_string(),
            });
        }
    }
    load_files(dir, true, &format!("plug-in CA {}", dir.display()))
}

/// Loads a plug-in bundle from the data of the `cacerts` Secret (`secret`
/// names it, `namespace/name`): the same keys and checks as the directory.
pub fn load_plugin_secret(
    secret: &str,
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<CaBundle, MaterialError> {
    let text = |key: &str| -> Result<String, MaterialError> {
        let bytes = data
            .get(key)
            .ok_or_else(|| MaterialError::IncompleteSecret {
                secret: secret.to_string(),
                missing: key.to_string(),
            })?;
        String::from_utf8(bytes.clone()).map_err(|_| MaterialError::Mismatch {
            path: format!("Secret {secret} key {key}"),
            reason: "is not PEM text".into(),
        })
    };
    let pems = Pems {
        cert: text(CA_CERT_FILE)?,
        key: text(CA_KEY_FILE)?,
        chain: text(CERT_CHAIN_FILE)?,
        root: text(ROOT_CERT_FILE)?,
    };
    load_pems(
        pems,
        &|key| format!("Secret {secret} key {key}"),
        &format!("plug-in CA from Secret {secret}"),
    )
}

/// Loads the self-signed CA kept in Istio's `istio-ca-secret` (`secret`
/// names it): the root and its key in `ca-cert.pem` and `ca-key.pem`; the
/// trust bundle is `ca-cert.pem` followed by any other root in
/// `root-cert.pem` (after a rotation, the previous root).
pub fn load_ca_secret(
    secret: &str,
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<CaBundle, MaterialError> {
    let text = |key: &str, required: bool| -> Result<String, MaterialError> {
        match data.get(key) {
            None if !required => Ok(String::new()),
            None => Err(MaterialError::IncompleteCaSecret {
                secret: secret.to_string(),
                missing: key.to_string(),
            }),
            Some(bytes) => String::from_utf8(bytes.clone()).map_err(|_| MaterialError::Mismatch {
                path: format!("Secret {secret} key {key}"),
                reason: "is not PEM text".into(),
            }),
        }
    };
    let cert = text(CA_CERT_FILE, true)?;
    let name = |key: &str| format!("Secret {secret} key {key}");
    let mut roots = pki::pem_certs(&name(CA_CERT_FILE), &cert)?;
    let listed = text(ROOT_CERT_FILE, false)?;
    if !listed.trim().is_empty() {
        roots = merge_roots(&roots, &pki::pem_certs(&name(ROOT_CERT_FILE), &listed)?);
    }
    load_pems(
        Pems {
            cert,
            key: text(CA_KEY_FILE, true)?,
            chain: String::new(),
            root: pki::to_pem(&roots),
        },
        &name,
        &format!("self-signed root in Secret {secret}"),
    )
}

/// A bundle's PEM texts.
struct Pems {
    cert: String,
    key: String,
    chain: String,
    root: String,
}

fn load_files(dir: &Path, chain_required: bool, source: &str) -> Result<CaBundle, MaterialError> {
    let p = |f: &str| dir.join(f);
    let cert_pem = read(&p(CA_CERT_FILE))?;
    let key_pem = read(&p(CA_KEY_FILE))?;
    let root_pem = read(&p(ROOT_CERT_FILE))?;
    let chain_pem = if chain_required || p(CERT_CHAIN_FILE).exists() {
        read(&p(CERT_CHAIN_FILE))?
    } else {
        String::new()
    };
    load_pems(
        Pems {
            cert: cert_pem,
            key: key_pem,
            chain: chain_pem,
            root: root_pem,
        },
        &|f| p(f).display().to_string(),
        source,
    )
}

/// Checks that a bundle belongs together; `path_str` names each part in errors.
fn load_pems(
    pems: Pems,
    path_str: &dyn Fn(&str) -> String,
    source: &str,
) -> Result<CaBundle, MaterialError> {
    let Pems {
        cert: cert_pem,
        key: key_pem,
        chain: chain_pem,
        root: root_pem,
    } = pems;

    let signing_cert = pki::pem_certs(&path_str(CA_CERT_FILE), &cert_pem)?
        .into_iter()
        .next()
        .ok_or_else(|| MaterialError::Mismatch {
            path: path_str(CA_CERT_FILE),
            reason: "holds no certificate".into(),
        })?;
    let signing_key = pki::key_from_pem(&path_str(CA_KEY_FILE), &key_pem)?;
    let roots = pki::pem_certs(&path_str(ROOT_CERT_FILE), &root_pem)?;
    let chain = if chain_pem.trim().is_empty() {
        Vec::new()
    } else {
        pki::pem_certs(&path_str(CERT_CHAIN_FILE), &chain_pem)?
    };

    let info = pki::cert_info(&signing_cert)?;
    if !info.is_ca {
        return Err(MaterialError::Mismatch {
            path: path_str(CA_CERT_FILE),
            reason: "is not a CA certificate (basicConstraints CA:TRUE is required)".into(),
        });
    }
    // The key must be the certificate's key: sign something and verify it
    // against the certificate.
    let probe = CertificateParams::new(vec!["probe.invalid".to_string()])?;
    let issuer = rcgen::Issuer::from_ca_cert_der(&signing_cert, &signing_key)?;
    let probe_key = pki::generate_key(KeyType::EcdsaP256)?;
    let probe_cert = probe.signed_by(&probe_key, &issuer)?;
    if !pki::signed_by(probe_cert.der(), &signing_cert) {
        return Err(MaterialError::Mismatch {
            path: path_str(CA_KEY_FILE),
            reason: format!(
                "does not match the public key of {}",
                path_str(CA_CERT_FILE)
            ),
        });
    }
    // The signing certificate must lead to one of the roots, through the chain.
    let mut current = signing_cert.clone();
    let mut steps = 0;
    let chains_to_root = loop {
        if roots.iter().any(|r| r.as_ref() == current.as_ref())
            || roots.iter().any(|r| pki::signed_by(&current, r))
        {
            break true;
        }
        match chain
            .iter()
            .find(|c| c.as_ref() != current.as_ref() && pki::signed_by(&current, c))
        {
            Some(next) if steps < 8 => {
                current = next.clone();
                steps += 1;
            }
            _ => break false,
        }
    };
    if !chains_to_root {
        return Err(MaterialError::Mismatch {
            path: path_str(CA_CERT_FILE),
            reason: format!(
                "does not chain to {} (through {})",
                path_str(ROOT_CERT_FILE),
                path_str(CERT_CHAIN_FILE)
            ),
        });
    }

    // Istio's cert-chain.pem may repeat the root; the root is sent once, last.
    let chain = chain
        .into_iter()
        .filter(|c| !roots.iter().any(|r| r.as_ref() == c.as_ref()))
        .collect();
    Ok(CaBundle {
        signing_key,
        signing_cert,
        chain,
        root_pem,
        roots,
        source: source.to_string(),
    })
}

/// Loads the self-signed root from `dir`, creating and saving one if absent.
pub fn load_or_create_self_signed(
    dir: &Path,
    opts: &SelfSignedOptions,
) -> Result<CaBundle, MaterialError> {
    if dir.join(CA_CERT_FILE).exists() {
        return load_files(
            dir,
            false,
            &format!("self-signed root in {}", dir.display()),
        );
    }
    fs::create_dir_all(dir).map_err(|source| MaterialError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let key = pki::generate_key(KeyType::Rsa(opts.rsa_key_size))?;
    let cert_pem = self_signed_root(&key, opts)?;
    write(&dir.join(CA_KEY_FILE), &key.serialize_pem(), 0o600)?;
    write(&dir.join(CA_CERT_FILE), &cert_pem, 0o644)?;
    write(&dir.join(ROOT_CERT_FILE), &cert_pem, 0o644)?;
    write(&dir.join(CERT_CHAIN_FILE), "", 0o644)?;
    tracing::info!(target: "ca", dir = %dir.display(), "created a self-signed root CA");
    load_files(
        dir,
        false,
        &format!("self-signed root in {}", dir.display()),
    )
}

/// A new self-signed root for `key` (PEM), valid for `opts.ttl` from now
/// (back-dated two minutes for clock skew, as Istio does).
pub fn self_signed_root(key: &KeyPair, opts: &SelfSignedOptions) -> Result<String, MaterialError> {
    let now = time::OffsetDateTime::now_utc();
    let mut params = pki::root_ca_params(
        &opts.trust_domain,
        now - time::Duration::minutes(2),
        now + opts.ttl,
    );
    params.serial_number = Some(random_serial());
    Ok(params.self_signed(key)?.pem())
}

/// A random positive 128-bit serial number, as Istio's CA uses.
pub fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01; // keep the full length so the encoding never shrinks
    SerialNumber::from_slice(&bytes)
}

/// The default directory for the self-signed root.
pub fn default_self_signed_dir() -> PathBuf {
    PathBuf::from("./etc/istio-ca-secret")
}

/// `roots` then every `extra` root not already in it, in order, once each.
pub fn merge_roots(
    roots: &[CertificateDer<'static>],
    extra: &[CertificateDer<'static>],
) -> Vec<CertificateDer<'static>> {
    let mut out: Vec<CertificateDer<'static>> = Vec::with_capacity(roots.len() + extra.len());
    for c in roots.iter().chain(extra) {
        if !out.iter().any(|o| o.as_ref() == c.as_ref()) {
            out.push(c.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::Signer;
    use common::Identity;
    use rcgen::{BasicConstraints, DnType, IsCa, Issuer, KeyUsagePurpose};

    fn ca_params(name: &str) -> CertificateParams {
        let mut p = CertificateParams::default();
        p.distinguished_name.push(DnType::OrganizationName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        p
    }

    /// Writes a plug-in bundle: root, and an intermediate signed by it.
    fn write_bundle(dir: &Path) -> (String, String) {
        fs::create_dir_all(dir).unwrap();
        let root_key = pki::generate_key(KeyType::EcdsaP256).unwrap();
        let root = ca_params("root").self_signed(&root_key).unwrap();
        let int_key = pki::generate_key(KeyType::Rsa(2048)).unwrap();
        let issuer = Issuer::from_ca_cert_der(root.der(), &root_key).unwrap();
        let int = ca_params("intermediate")
            .signed_by(&int_key, &issuer)
            .unwrap();
        fs::write(dir.join(CA_CERT_FILE), int.pem()).unwrap();
        fs::write(dir.join(CA_KEY_FILE), int_key.serialize_pem()).unwrap();
        fs::write(
            dir.join(CERT_CHAIN_FILE),
            format!("{}{}", int.pem(), root.pem()),
        )
        .unwrap();
        fs::write(dir.join(ROOT_CERT_FILE), root.pem()).unwrap();
        (int.pem(), root.pem())
    }

    #[test]
    fn plugin_intermediate_signs_and_sends_the_chain() {
        let dir = tempfile::tempdir().unwrap();
        let (int_pem, root_pem) = write_bundle(dir.path());
        assert!(has_plugin_ca(dir.path()));
        let bundle = load_plugin(dir.path()).unwrap();
        let signer =
            Signer::new(bundle, Duration::from_secs(3600), Duration::from_secs(7200)).unwrap();
        let key = pki::generate_key(KeyType::EcdsaP256).unwrap();
        let id = Identity::new("cluster.local", "a", "b");
        let chain = signer
            .sign_workload(&pki::csr_pem(&id, &key).unwrap(), &[id], Duration::ZERO)
            .unwrap();
        // [leaf, intermediate, root]: the root repeated in cert-chain.pem is sent once.
        assert_eq!(chain.len(), 3);
        assert_eq!(chain[1], int_pem);
        assert_eq!(chain[2], root_pem);
    }

    #[test]
    fn the_cacerts_secret_is_read_like_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let (int_pem, root_pem) = write_bundle(dir.path());
        let mut data: BTreeMap<String, Vec<u8>> =
            [CA_CERT_FILE, CA_KEY_FILE, CERT_CHAIN_FILE, ROOT_CERT_FILE]
                .iter()
                .map(|f| (f.to_string(), fs::read(dir.path().join(f)).unwrap()))
                .collect();
        let bundle = load_plugin_secret("istio-system/cacerts", &data).unwrap();
        assert_eq!(bundle.root_pem, root_pem);
        assert_eq!(bundle.source, "plug-in CA from Secret istio-system/cacerts");
        assert_eq!(
            pki::pem_certs("int", &int_pem).unwrap()[0].as_ref(),
            bundle.signing_cert.as_ref()
        );
        let other = pki::generate_key(KeyType::EcdsaP256).unwrap();
        data.insert(CA_KEY_FILE.into(), other.serialize_pem().into_bytes());
        let err = load_plugin_secret("istio-system/cacerts", &data)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("Secret istio-system/cacerts key ca-key.pem")
                && err.contains("does not match"),
            "{err}"
        );
        data.remove(CERT_CHAIN_FILE);
        let err = load_plugin_secret("istio-system/cacerts", &data)
            .unwrap_err()
            .to_string();
        assert!(err.contains("key cert-chain.pem is missing"), "{err}");
    }

    #[test]
    fn incomplete_plugin_names_the_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        write_bundle(dir.path());
        fs::remove_file(dir.path().join(CERT_CHAIN_FILE)).unwrap();
        let err = load_plugin(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("incomplete") && err.contains("cert-chain.pem is missing"),
            "{err}"
        );
    }

    #[test]
    fn mismatched_key_names_the_key_file() {
        let dir = tempfile::tempdir().unwrap();
        write_bundle(dir.path());
        let other = pki::generate_key(KeyType::Rsa(2048)).unwrap();
        fs::write(dir.path().join(CA_KEY_FILE), other.serialize_pem()).unwrap();
        let err = load_plugin(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("ca-key.pem") && err.contains("does not match"),
            "{err}"
        );
    }

    #[test]
    fn foreign_root_names_the_certificate() {
        let dir = tempfile::tempdir().unwrap();
        write_bundle(dir.path());
        let other_key = pki::generate_key(KeyType::EcdsaP256).unwrap();
        let other_root = ca_params("other").self_signed(&other_key).unwrap();
        fs::write(dir.path().join(ROOT_CERT_FILE), other_root.pem()).unwrap();
        fs::write(dir.path().join(CERT_CHAIN_FILE), "").unwrap();
        let err = load_plugin(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("ca-cert.pem") && err.contains("does not chain"),
            "{err}"
        );
    }

    #[test]
    fn pkcs1_rsa_keys_are_accepted() {
        // Istio's sample plug-in keys are PKCS#1 ("RSA PRIVATE KEY").
        use rsa::pkcs1::EncodeRsaPrivateKey;
        use rsa::pkcs8::DecodePrivateKey;
        let dir = tempfile::tempdir().unwrap();
        write_bundle(dir.path());
        let pem = fs::read_to_string(dir.path().join(CA_KEY_FILE)).unwrap();
        let key = rsa::PrivateKey::from_pkcs8_pem(&pem).unwrap();
        let pkcs1 = key.to_pkcs1_pem(rsa::pkcs1::LineEnding::LF).unwrap();
        assert!(pkcs1.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
        fs::write(dir.path().join(CA_KEY_FILE), pkcs1.as_bytes()).unwrap();
        load_plugin(dir.path()).unwrap();
    }
}
