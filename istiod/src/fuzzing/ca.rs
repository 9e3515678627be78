//! The CA's input boundary: the CSR a workload sends (PEM, or the DER
//! inside it), and how the caller is authenticated first (a bearer JWT
//! under `JWT_RULE`, a client certificate, a TokenReview's answer, the
//! `JWT_RULE` setting itself).

use std::sync::OnceLock;
use std::time::Duration;

use base64::Engine;
use common::{Identity, pki};
use rustls_pki_types::CertificateDer;

use crate::ca::authn::{Authenticators, JwtAuthenticator, JwtRule};
use crate::ca::material::{SelfSignedOptions, load_or_create_self_signed};
use crate::ca::signer::Signer;

struct Fixture {
    runtime: tokio::runtime::Runtime,
    signer: Signer,
    jwt: Authenticators,
    certs: Authenticators,
    /// Holds the CA's and the token issuer's files.
    _dir: TempDir,
}

/// A directory removed when the fixture goes (at exit, for a static).
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("istiod-fuzz-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("a fixture directory: {e}"));
        let bundle = load_or_create_self_signed(
            &dir,
            &SelfSignedOptions {
                trust_domain: "cluster.local".into(),
                ttl: Duration::from_secs(3650 * 86400),
                rsa_key_size: 2048,
            },
        );
        let bundle = bundle.unwrap_or_else(|e| panic!("a CA: {e}"));
        let signer = Signer::new(
            bundle,
            Duration::from_secs(86400),
            Duration::from_secs(90 * 86400),
        )
        .unwrap_or_else(|e| panic!("a CA: {e}"));
        crate::token::Issuer::create(&dir, "https://issuer.fuzz")
            .unwrap_or_else(|e| panic!("a token issuer: {e}"));
        let rule = JwtRule {
            issuer: "https://issuer.fuzz".into(),
            jwks_uri: format!("file://{}", dir.join("jwks.json").display()),
            audiences: vec![],
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("a runtime: {e}"));
        Fixture {
            runtime,
            signer,
            jwt: Authenticators {
                client_cert: false,
                jwt: Some(std::sync::Arc::new(JwtAuthenticator::new(
                    rule,
                    "cluster.local",
                ))),
                kube: None,
            },
            certs: Authenticators {
                client_cert: true,
                jwt: None,
                kube: None,
            },
            _dir: TempDir(dir),
        }
    })
}

/// The CA's inputs, by the first byte: 0 a CSR PEM, 1 a CSR's DER, 2 a
/// bearer token, 3 a client certificate's DER, 4 a `JWT_RULE`, 5 a
/// TokenReview status (JSON). Nothing may panic, and a certificate issued
/// for any CSR names the caller's identity and nothing else.
pub fn ca_csr(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 6 {
        0 | 1 => {
            ca_csr_issued(data);
        }
        2 => authenticate_token(rest),
        3 => {
            let f = fixture();
            let chain = [CertificateDer::from(rest.to_vec())];
            let metadata = tonic::metadata::MetadataMap::new();
            let _ = f
                .runtime
                .block_on(f.certs.authenticate(&metadata, Some(&chain)));
        }
        4 => {
            if let Ok(json) = std::str::from_utf8(rest) {
                let _ = JwtRule::parse(json);
            }
        }
        _ => {
            if let Ok(status) = serde_json::from_slice(rest) {
                let audiences = ["istio-ca".to_string()];
                let _ = crate::ca::kube_jwt::review_identity(
                    Some(&status),
                    Some(&audiences),
                    "cluster.local",
                );
            }
        }
    }
}

/// [`ca_csr`] of a CSR (first byte 0: PEM, 1: DER): whether a
/// certificate was issued (checked to name the caller only).
pub fn ca_csr_issued(data: &[u8]) -> bool {
    match data.split_first() {
        Some((0, rest)) => std::str::from_utf8(rest).is_ok_and(sign),
        Some((1, rest)) => {
            let b64 = base64::engine::general_purpose::STANDARD.encode(rest);
            sign(&format!(
                "-----BEGIN CERTIFICATE REQUEST-----\n{b64}\n-----END CERTIFICATE REQUEST-----\n"
            ))
        }
        _ => false,
    }
}

fn sign(csr_pem: &str) -> bool {
    let caller = Identity::new("cluster.local", "demo", "sleep");
    let Ok(chain) =
        fixture()
            .signer
            .sign_workload(csr_pem, std::slice::from_ref(&caller), Duration::ZERO)
    else {
        return false;
    };
    let leaf = pki::pem_certs("leaf", &chain[0])
        .ok()
        .and_then(|c| c.into_iter().next())
        .unwrap_or_else(|| panic!("the CA issued an unreadable leaf: {}", chain[0]));
    let info = pki::cert_info(&leaf).unwrap_or_else(|e| panic!("the issued leaf: {e}"));
    assert_eq!(
        info.uri_sans,
        vec![caller.to_string()],
        "the leaf's URI SANs"
    );
    assert!(
        info.dns_sans.is_empty(),
        "the leaf has DNS SANs: {:?}",
        info.dns_sans
    );
    assert!(!info.is_ca, "the CA issued a CA certificate");
    true
}

fn authenticate_token(token: &[u8]) {
    let Ok(token) = std::str::from_utf8(token) else {
        return;
    };
    let Ok(value) = format!("Bearer {token}").parse() else {
        return;
    };
    let mut metadata = tonic::metadata::MetadataMap::new();
    metadata.insert("authorization", value);
    let f = fixture();
    let _ = f.runtime.block_on(f.jwt.authenticate(&metadata, None));
}
