//! Fetching JSON Web Key Sets: the one HTTP(S) fetch both the CA's
//! `JWT_RULE` authenticator and RequestAuthentication's resolver use, the
//! CA's on-demand key cache ([`cache`]), and the resolver itself
//! ([`resolver`], Istio's `JwksResolver` with
//! `PILOT_JWT_ENABLE_REMOTE_JWKS=false`: istiod fetches `jwksUri` and the
//! generators inline the keys). Neither holds a lock across a fetch.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

pub mod cache;
pub mod resolver;

pub use cache::{KeySetCache, KeySetError};
pub use resolver::JwksResolver;

/// Why a JWKS (or an OpenID discovery document) could not be fetched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The URI's scheme is neither `http`, `https` nor (where allowed) `file`.
    #[error("{uri}: unsupported scheme (use http:// or https://)")]
    Scheme {
        /// The URI.
        uri: String,
    },
    /// The HTTP client could not be built.
    #[error("{uri}: cannot build an HTTP client: {reason}")]
    Client {
        /// The URI.
        uri: String,
        /// The client's error.
        reason: String,
    },
    /// The request failed (connection, TLS, timeout, reading the body).
    #[error("{uri}: {reason}")]
    Request {
        /// The URI.
        uri: String,
        /// What went wrong.
        reason: String,
    },
    /// The server answered with a status other than 2xx.
    #[error("{uri}: status {status}, message {message:?}")]
    Status {
        /// The URI.
        uri: String,
        /// The HTTP status.
        status: u16,
        /// The start of the body (at most 100 characters), as Istio logs it.
        message: String,
    },
    /// A local file could not be read.
    #[error("{uri}: {reason}")]
    File {
        /// The URI.
        uri: String,
        /// The I/O error.
        reason: String,
    },
    /// The body is not what was expected (not a JWKS, no `jwks_uri`).
    #[error("{uri}: {reason}")]
    Body {
        /// The URI.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// One shared client: TLS with the platform's roots (reqwest's platform
/// verifier), no proxy settings beyond reqwest's own.
fn client(uri: &str) -> Result<&'static reqwest::Client, FetchError> {
    static CLIENT: OnceLock<Result<reqwest::Client, reqwest::Error>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            common::tls::install_crypto_provider();
            reqwest::Client::builder().build()
        })
        .as_ref()
        .map_err(|e| FetchError::Client {
            uri: uri.to_string(),
            reason: e.to_string(),
        })
}

/// Fetches `uri` (`http://`, `https://`, or `file://` when `allow_file`)
/// within `timeout` and returns its body.
pub async fn fetch(uri: &str, timeout: Duration, allow_file: bool) -> Result<String, FetchError> {
    if let Some(path) = uri.strip_prefix("file://") {
        if !allow_file {
            return Err(FetchError::Scheme { uri: uri.into() });
        }
        return tokio::fs::read_to_string(PathBuf::from(path))
            .await
            .map_err(|e| FetchError::File {
                uri: uri.into(),
                reason: e.to_string(),
            });
    }
    let lower = uri.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return Err(FetchError::Scheme { uri: uri.into() });
    }
    let request = |e: reqwest::Error| FetchError::Request {
        uri: uri.into(),
        reason: error_chain(&e),
    };
    let resp = client(uri)?
        .get(uri)
        .timeout(timeout)
        .send()
        .await
        .map_err(request)?;
    let status = resp.status();
    let body = resp.text().await.map_err(request)?;
    if !status.is_success() {
        return Err(FetchError::Status {
            uri: uri.into(),
            status: status.as_u16(),
            message: body.chars().take(100).collect(),
        });
    }
    Ok(body)
}

/// reqwest's error with its sources, which say what actually failed
/// (refused, DNS, certificate).
fn error_chain(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Why a text is not a JSON Web Key Set as Envoy reads one.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    /// It does not parse as JSON.
    #[error("not JSON: {0}")]
    NotJson(#[from] serde_json::Error),
    /// There is no `keys` array.
    #[error("no \"keys\" array")]
    NoKeys,
    /// A key has no (or an empty) `kty`.
    #[error("keys[{0}] has no \"kty\"")]
    NoKeyType(usize),
}

/// Checks that `text` is a JSON Web Key Set as Envoy reads one: an object
/// with a `keys` array of objects, each with a `kty`.
pub fn check_jwks(text: &str) -> Result<(), JwksError> {
    let value: serde_json::Value = serde_json::from_str(text)?;
    let keys = value
        .get("keys")
        .and_then(|k| k.as_array())
        .ok_or(JwksError::NoKeys)?;
    for (i, key) in keys.iter().enumerate() {
        match key.get("kty").and_then(|k| k.as_str()) {
            Some(kty) if !kty.is_empty() => {}
            _ => return Err(JwksError::NoKeyType(i)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwks_shape() {
        assert!(check_jwks(r#"{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}]}"#).is_ok());
        assert!(check_jwks(r#"{"keys":[]}"#).is_ok());
        let err = check_jwks("nope").unwrap_err();
        assert!(matches!(err, JwksError::NotJson(_)), "{err:?}");
        assert!(err.to_string().starts_with("not JSON: "), "{err}");
        let err = check_jwks("{}").unwrap_err();
        assert!(matches!(err, JwksError::NoKeys), "{err:?}");
        assert_eq!(err.to_string(), r#"no "keys" array"#);
        let err = check_jwks(r#"{"keys":[{"n":"x"}]}"#).unwrap_err();
        assert!(matches!(err, JwksError::NoKeyType(0)), "{err:?}");
        assert_eq!(err.to_string(), r#"keys[0] has no "kty""#);
    }

    #[tokio::test]
    async fn refuses_other_schemes() {
        let e = fetch("ftp://x/jwks", Duration::from_secs(1), false)
            .await
            .unwrap_err();
        assert!(matches!(e, FetchError::Scheme { .. }), "{e}");
        let e = fetch("file:///etc/hostname", Duration::from_secs(1), false)
            .await
            .unwrap_err();
        assert!(matches!(e, FetchError::Scheme { .. }), "{e}");
    }
}
