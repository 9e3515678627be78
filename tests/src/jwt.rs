//! End-user JWTs for the RequestAuthentication tests: ES256 keys made per
//! test, their JSON Web Key Set, and tokens signed with them.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::{Jwk, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

/// An ES256 signing key and its public JWK.
pub struct Signer {
    key: EncodingKey,
    kid: String,
}

impl Signer {
    /// A new key named `kid`.
    pub fn new(kid: &str) -> Signer {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("test key");
        Signer {
            key: EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).expect("test key"),
            kid: kid.to_string(),
        }
    }

    /// The public key as a JWK.
    pub fn jwk(&self) -> Jwk {
        let mut jwk = Jwk::from_encoding_key(&self.key, Algorithm::ES256).expect("test key");
        jwk.common.key_id = Some(self.kid.clone());
        jwk.common.public_key_use = Some(PublicKeyUse::Signature);
        jwk
    }

    /// A token of `claims` signed by this key, naming it.
    pub fn sign(&self, claims: &Value) -> String {
        self.sign_as(&self.kid, claims)
    }

    /// A token naming key `kid` but signed by this key (a forgery when
    /// `kid` is another signer's).
    pub fn sign_as(&self, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(kid.to_string());
        jsonwebtoken::encode(&header, claims, &self.key).expect("test key")
    }
}

/// The JSON Web Key Set of `signers`.
pub fn jwks(signers: &[&Signer]) -> String {
    serde_json::to_string(&JwkSet {
        keys: signers.iter().map(|s| s.jwk()).collect(),
    })
    .expect("test key")
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("test key")
        .as_secs()
}

/// Claims valid for an hour, plus `extra`.
pub fn claims(iss: &str, sub: &str, extra: Value) -> Value {
    let mut c = json!({"iss": iss, "sub": sub, "iat": now(), "exp": now() + 3600});
    if let (Some(c), Value::Object(extra)) = (c.as_object_mut(), extra) {
        c.extend(extra);
    }
    c
}
