//! Workload tokens for the local mode, where no Kubernetes API server mints
//! them: an issuer key pair with its JWKS (what `JWT_RULE` trusts), and tokens
//! shaped like Kubernetes projected service-account tokens, as
//! `kubectl create token --audience istio-ca` would give a Pod.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::{Jwk, JwkSet, ThumbprintHash};
use jsonwebtoken::{Algorithm, EncodingKey, Header};

/// The issuer's private key file in its directory.
pub const KEY_FILE: &str = "key.pem";
/// The public keys, a JSON Web Key Set (`JWT_RULE`'s `jwks_uri` points here).
pub const JWKS_FILE: &str = "jwks.json";
/// The issuer name, one line.
pub const ISSUER_FILE: &str = "issuer";

/// Why a token could not be minted.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A key could not be used.
    #[error("{0}")]
    Key(String),
}

/// A token issuer: an ES256 key in a directory.
pub struct Issuer {
    name: String,
    key: EncodingKey,
    kid: String,
    dir: PathBuf,
}

/// What to put in a token.
#[derive(Debug, Clone)]
pub struct MintOptions {
    /// The Pod's namespace.
    pub namespace: String,
    /// The Pod's service account.
    pub service_account: String,
    /// The audience (`istio-ca` for Istio's CA).
    pub audience: String,
    /// How long the token is valid.
    pub ttl: Duration,
    /// Use another `iss` (tests of a wrong issuer).
    pub issuer_override: Option<String>,
    /// Mint a token that expired an hour ago (tests).
    pub expired: bool,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TokenError + '_ {
    move |source| TokenError::Io {
        path: path.display().to_string(),
        source,
    }
}

impl Issuer {
    /// Creates a new issuer in `dir` (key, JWKS and issuer name files).
    pub fn create(dir: &Path, name: &str) -> Result<Self, TokenError> {
        use std::os::unix::fs::PermissionsExt;
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| TokenError::Key(e.to_string()))?;
        let key_path = dir.join(KEY_FILE);
        fs::write(&key_path, key.serialize_pem()).map_err(io_err(&key_path))?;
        fs::set_permissions(&key_path, fs::Permissions::from_mode(0o600))
            .map_err(io_err(&key_path))?;
        let issuer_path = dir.join(ISSUER_FILE);
        fs::write(&issuer_path, format!("{name}\n")).map_err(io_err(&issuer_path))?;
        let issuer = Self::load(dir)?;
        let jwks = JwkSet {
            keys: vec![issuer.public_jwk()?],
        };
        let jwks_path = dir.join(JWKS_FILE);
        let json =
            serde_json::to_string_pretty(&jwks).map_err(|e| TokenError::Key(e.to_string()))?;
        fs::write(&jwks_path, json).map_err(io_err(&jwks_path))?;
        Ok(issuer)
    }

    /// Loads an issuer created by [`Issuer::create`].
    pub fn load(dir: &Path) -> Result<Self, TokenError> {
        let key_path = dir.join(KEY_FILE);
        let pem = fs::read(&key_path).map_err(io_err(&key_path))?;
        let key = EncodingKey::from_ec_pem(&pem)
            .map_err(|e| TokenError::Key(format!("{}: {e}", key_path.display())))?;
        let issuer_path = dir.join(ISSUER_FILE);
        let name = fs::read_to_string(&issuer_path)
            .map_err(io_err(&issuer_path))?
            .trim()
            .to_string();
        let jwk = Jwk::from_encoding_key(&key, Algorithm::ES256)
            .map_err(|e| TokenError::Key(e.to_string()))?;
        let kid = jwk
            .thumbprint(ThumbprintHash::SHA256)
            .map_err(|e| TokenError::Key(e.to_string()))?;
        Ok(Self {
            name,
            key,
            kid,
            dir: dir.to_path_buf(),
        })
    }

    fn public_jwk(&self) -> Result<Jwk, TokenError> {
        let mut jwk = Jwk::from_encoding_key(&self.key, Algorithm::ES256)
            .map_err(|e| TokenError::Key(e.to_string()))?;
        jwk.common.key_id = Some(self.kid.clone());
        jwk.common.public_key_use = Some(jsonwebtoken::jwk::PublicKeyUse::Signature);
        Ok(jwk)
    }

    /// The issuer name (`iss`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `JWT_RULE` value that makes istiod trust this issuer.
    pub fn jwt_rule(&self) -> String {
        let abs = fs::canonicalize(&self.dir).unwrap_or_else(|_| self.dir.clone());
        serde_json::json!({
            "issuer": self.name,
            "jwks_uri": format!("file://{}", abs.join(JWKS_FILE).display()),
            "audiences": [crate::ca::authn::DEFAULT_AUDIENCE],
        })
        .to_string()
    }

    /// Mints a token for `system:serviceaccount:<ns>:<sa>`.
    pub fn mint(&self, o: &MintOptions) -> Result<String, TokenError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let (iat, exp) = if o.expired {
            (now - 7200, now - 3600)
        } else {
            (now, now + o.ttl.as_secs())
        };
        let claims = serde_json::json!({
            "iss": o.issuer_override.as_deref().unwrap_or(&self.name),
            "sub": format!("system:serviceaccount:{}:{}", o.namespace, o.service_account),
            "aud": [o.audience],
            "iat": iat,
            "nbf": iat,
            "exp": exp,
            "kubernetes.io": {
                "namespace": o.namespace,
                "serviceaccount": {"name": o.service_account},
            },
        });
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, &claims, &self.key)
            .map_err(|e| TokenError::Key(e.to_string()))
    }
}
