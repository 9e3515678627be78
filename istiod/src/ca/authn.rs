//! Authenticates CA and xDS callers in Istio's order: a client certificate
//! that chains to the CA (certificate renewal), then a bearer JWT checked
//! against `JWT_RULE`, then the same token reviewed by the Kubernetes API
//! ([`super::kube_jwt`]). The caller's identity is what the CA signs for.

use std::sync::Arc;
use std::time::Duration;

use common::{Identity, pki};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use rustls_pki_types::CertificateDer;
use tonic::metadata::MetadataMap;

use super::kube_jwt::KubeJwtAuthenticator;
use crate::jwks::KeySetCache;

/// Istio's default audience for workload tokens (`TOKEN_AUDIENCES`).
pub const DEFAULT_AUDIENCE: &str = "istio-ca";

/// How long fetched signing keys are trusted before they are fetched again.
const JWKS_REFRESH: Duration = Duration::from_secs(300);
/// How long one fetch of the keys may take.
const JWKS_FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The shortest gap between fetches forced by an unknown key id.
const JWKS_MIN_REFETCH: Duration = Duration::from_secs(5);

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The identities the caller proved.
    pub identities: Vec<Identity>,
    /// `ClientCertAuthenticator`, `JwtAuthenticator` or
    /// `KubeJWTAuthenticator`, as Istio names them.
    pub authenticator: &'static str,
}

/// Why a caller was not authenticated; always `Unauthenticated` on the wire.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("request authenticate failure: {0}")]
pub struct AuthnError(pub String);

/// `JWT_RULE`: `{"issuer": ..., "jwks_uri": ..., "audiences": [...]}`.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct JwtRule {
    /// Required `iss`.
    pub issuer: String,
    /// Where the signing keys are: `file://`, `https://` (or `http://`).
    pub jwks_uri: String,
    /// Accepted `aud` values; Istio's `istio-ca` when empty.
    #[serde(default)]
    pub audiences: Vec<String>,
}

/// Why `JWT_RULE` is unusable.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum JwtRuleError {
    /// Not the JSON object Istio reads.
    #[error(
        "JWT_RULE is not valid JSON of the form {{\"issuer\":...,\"jwks_uri\":...,\"audiences\":[...]}}: {0}"
    )]
    Json(String),
    /// `issuer` is empty.
    #[error("JWT_RULE: issuer must not be empty")]
    NoIssuer,
    /// `jwks_uri` has a scheme keys cannot be read from.
    #[error("JWT_RULE: jwks_uri {0:?} must start with file://, https:// or http://")]
    JwksUri(String),
}

impl JwtRule {
    /// Parses `JWT_RULE`.
    pub fn parse(json: &str) -> Result<Self, JwtRuleError> {
        let rule: JwtRule =
            serde_json::from_str(json).map_err(|e| JwtRuleError::Json(e.to_string()))?;
        if rule.issuer.is_empty() {
            return Err(JwtRuleError::NoIssuer);
        }
        if !(rule.jwks_uri.starts_with("file://")
            || rule.jwks_uri.starts_with("https://")
            || rule.jwks_uri.starts_with("http://"))
        {
            return Err(JwtRuleError::JwksUri(rule.jwks_uri));
        }
        Ok(rule)
    }
}

/// Why a bearer token was not accepted by the `JWT_RULE` authenticator.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum TokenError {
    /// Not a JWT.
    #[error("malformed JWT: {0}")]
    Malformed(String),
    /// The signing keys could not be had.
    #[error(transparent)]
    Keys(#[from] crate::jwks::KeySetError),
    /// No key of the set has the token's key id.
    #[error("no key in {uri} matches the token's key id {kid:?}")]
    NoKey {
        /// The rule's `jwks_uri`.
        uri: String,
        /// The token's `kid`.
        kid: Option<String>,
    },
    /// Signed with a shared secret, which a key set cannot verify.
    #[error("HMAC-signed tokens are not accepted")]
    Hmac,
    /// A key of the set cannot verify anything.
    #[error("unusable key in JWKS: {0}")]
    UnusableKey(String),
    /// Past `exp`.
    #[error("token has expired")]
    Expired,
    /// `iss` is not the rule's.
    #[error("token issuer is not {0:?}")]
    Issuer(String),
    /// `aud` names none of the accepted audiences.
    #[error("token audience is not one of {0:?}")]
    Audience(Vec<String>),
    /// No key's signature matches.
    #[error("token signature is invalid")]
    Signature,
    /// Before `nbf`.
    #[error("token is not valid yet")]
    NotYetValid,
    /// A required claim is missing.
    #[error("token lacks the {0:?} claim")]
    MissingClaim(String),
    /// Any other reason the library gives.
    #[error("invalid token: {0}")]
    Invalid(String),
    /// `sub` is not a Kubernetes service account.
    #[error("token subject {0:?} is not system:serviceaccount:<namespace>:<name>")]
    Subject(String),
}

#[derive(Debug, serde::Deserialize)]
struct Claims {
    sub: String,
}

/// Verifies bearer tokens against one `JWT_RULE`.
pub struct JwtAuthenticator {
    rule: JwtRule,
    audiences: Vec<String>,
    trust_domain: String,
    /// The rule's keys; no lock is held while they are fetched.
    keys: KeySetCache,
}

impl std::fmt::Debug for JwtAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtAuthenticator")
            .field("rule", &self.rule)
            .finish()
    }
}

impl JwtAuthenticator {
    /// An authenticator for `rule`, mapping subjects into `trust_domain`.
    pub fn new(rule: JwtRule, trust_domain: &str) -> Self {
        let audiences = if rule.audiences.is_empty() {
            vec![DEFAULT_AUDIENCE.to_string()]
        } else {
            rule.audiences.clone()
        };
        Self {
            audiences,
            keys: KeySetCache::new(
                &rule.jwks_uri,
                JWKS_REFRESH,
                JWKS_MIN_REFETCH,
                JWKS_FETCH_TIMEOUT,
            ),
            rule,
            trust_domain: trust_domain.to_string(),
        }
    }

    /// Verifies `token` and returns the caller's identity.
    pub async fn authenticate(&self, token: &str) -> Result<Identity, TokenError> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| TokenError::Malformed(e.to_string()))?;
        let set = self.keys.keys(header.kid.as_deref()).await?;
        let candidates: Vec<_> = match &header.kid {
            Some(kid) => set.find(kid).into_iter().collect(),
            None => set.keys.iter().collect(),
        };
        if candidates.is_empty() {
            return Err(TokenError::NoKey {
                uri: self.rule.jwks_uri.clone(),
                kid: header.kid,
            });
        }
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.rule.issuer]);
        validation.set_audience(&self.audiences);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.leeway = 60;
        if matches!(
            header.alg,
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512
        ) {
            return Err(TokenError::Hmac);
        }
        let mut last = TokenError::Signature;
        for jwk in candidates {
            let key = match DecodingKey::from_jwk(jwk) {
                Ok(k) => k,
                Err(e) => {
                    last = TokenError::UnusableKey(e.to_string());
                    continue;
                }
            };
            match jsonwebtoken::decode::<Claims>(token, &key, &validation) {
                Ok(data) => {
                    return Identity::from_k8s_subject(&self.trust_domain, &data.claims.sub)
                        .ok_or(TokenError::Subject(data.claims.sub));
                }
                Err(e) => last = describe_jwt_error(&e, &self.rule.issuer, &self.audiences),
            }
        }
        Err(last)
    }
}

fn describe_jwt_error(
    e: &jsonwebtoken::errors::Error,
    issuer: &str,
    audiences: &[String],
) -> TokenError {
    use jsonwebtoken::errors::ErrorKind;
    match e.kind() {
        ErrorKind::ExpiredSignature => TokenError::Expired,
        ErrorKind::InvalidIssuer => TokenError::Issuer(issuer.to_string()),
        ErrorKind::InvalidAudience => TokenError::Audience(audiences.to_vec()),
        ErrorKind::InvalidSignature => TokenError::Signature,
        ErrorKind::ImmatureSignature => TokenError::NotYetValid,
        ErrorKind::MissingRequiredClaim(c) => TokenError::MissingClaim(c.clone()),
        _ => TokenError::Invalid(e.to_string()),
    }
}

/// The authenticators of a gRPC server, tried in Istio's order.
#[derive(Debug, Clone)]
pub struct Authenticators {
    /// Whether verified client certificates authenticate callers.
    pub client_cert: bool,
    /// The `JWT_RULE` authenticator, if configured.
    pub jwt: Option<Arc<JwtAuthenticator>>,
    /// The Kubernetes TokenReview authenticator, when istiod has a
    /// Kubernetes client.
    pub kube: Option<Arc<KubeJwtAuthenticator>>,
}

impl Authenticators {
    /// Authenticates a request from its metadata and verified peer chain.
    pub async fn authenticate(
        &self,
        metadata: &MetadataMap,
        peer_certs: Option<&[CertificateDer<'static>]>,
    ) -> Result<Caller, AuthnError> {
        let mut reasons = Vec::new();
        if self.client_cert {
            match peer_certs.and_then(|c| c.first()) {
                Some(leaf) => match cert_identities(leaf) {
                    Ok(ids) => {
                        return Ok(Caller {
                            identities: ids,
                            authenticator: "ClientCertAuthenticator",
                        });
                    }
                    Err(e) => reasons.push(format!("client certificate: {e}")),
                },
                None => reasons.push("no client certificate".to_string()),
            }
        }
        let token = match bearer_token(metadata) {
            Ok(token) => token,
            Err(e) => {
                reasons.push(e.to_string());
                return Err(AuthnError(reasons.join("; ")));
            }
        };
        if self.jwt.is_none() && self.kube.is_none() {
            reasons.push(
                "a bearer token was sent but neither JWT_RULE nor a Kubernetes API is configured to verify it"
                    .into(),
            );
        }
        if let Some(jwt) = &self.jwt {
            match jwt.authenticate(token).await {
                Ok(id) => {
                    return Ok(Caller {
                        identities: vec![id],
                        authenticator: "JwtAuthenticator",
                    });
                }
                Err(e) => reasons.push(format!("JWT: {e}")),
            }
        }
        if let Some(kube) = &self.kube {
            match kube.authenticate(token).await {
                Ok(id) => {
                    return Ok(Caller {
                        identities: vec![id],
                        authenticator: "KubeJWTAuthenticator",
                    });
                }
                Err(e) => reasons.push(format!("Kubernetes: {e}")),
            }
        }
        Err(AuthnError(reasons.join("; ")))
    }
}

/// Why a request's credentials could not even be read.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CredentialError {
    /// The client certificate does not parse.
    #[error("{0}")]
    Certificate(String),
    /// The client certificate names no SPIFFE identity.
    #[error("certificate has no SPIFFE URI SAN")]
    NoSpiffeId,
    /// No `authorization` header.
    #[error("no HTTP authorization header exists")]
    NoAuthorization,
    /// The header's value is not ASCII.
    #[error("authorization header is not ASCII")]
    NotAscii,
    /// The header is not `Bearer <token>`.
    #[error("authorization header is not a Bearer token")]
    NotBearer,
    /// `Bearer` with nothing after it.
    #[error("empty bearer token")]
    EmptyToken,
}

fn cert_identities(leaf: &CertificateDer<'_>) -> Result<Vec<Identity>, CredentialError> {
    let info = pki::cert_info(leaf).map_err(|e| CredentialError::Certificate(e.to_string()))?;
    let ids: Vec<Identity> = info
        .uri_sans
        .iter()
        .filter_map(|u| u.parse().ok())
        .collect();
    if ids.is_empty() {
        Err(CredentialError::NoSpiffeId)
    } else {
        Ok(ids)
    }
}

fn bearer_token(metadata: &MetadataMap) -> Result<&str, CredentialError> {
    let value = metadata
        .get("authorization")
        .ok_or(CredentialError::NoAuthorization)?;
    let value = value.to_str().map_err(|_| CredentialError::NotAscii)?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .ok_or(CredentialError::NotBearer)?
        .trim();
    if token.is_empty() {
        return Err(CredentialError::EmptyToken);
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::{Issuer, MintOptions};

    fn setup(dir: &std::path::Path) -> (Issuer, JwtAuthenticator) {
        let issuer = Issuer::create(dir, "https://issuer.test").unwrap();
        let rule = JwtRule {
            issuer: "https://issuer.test".into(),
            jwks_uri: format!("file://{}", dir.join("jwks.json").display()),
            audiences: vec![],
        };
        (issuer, JwtAuthenticator::new(rule, "cluster.local"))
    }

    fn opts() -> MintOptions {
        MintOptions {
            namespace: "ns1".into(),
            service_account: "sa1".into(),
            audience: DEFAULT_AUDIENCE.into(),
            ttl: Duration::from_secs(3600),
            issuer_override: None,
            expired: false,
        }
    }

    #[tokio::test]
    async fn good_token_gives_spiffe_identity() {
        let dir = tempfile::tempdir().unwrap();
        let (issuer, authn) = setup(dir.path());
        let token = issuer.mint(&opts()).unwrap();
        let id = authn.authenticate(&token).await.unwrap();
        assert_eq!(id.to_string(), "spiffe://cluster.local/ns/ns1/sa/sa1");
    }

    #[tokio::test]
    async fn bad_tokens_say_why() {
        let dir = tempfile::tempdir().unwrap();
        let (issuer, authn) = setup(dir.path());
        let other_dir = tempfile::tempdir().unwrap();
        let other = Issuer::create(other_dir.path(), "https://issuer.test").unwrap();
        let cases = [
            (
                MintOptions {
                    expired: true,
                    ..opts()
                },
                "expired",
                &issuer,
            ),
            (
                MintOptions {
                    audience: "other".into(),
                    ..opts()
                },
                "audience",
                &issuer,
            ),
            (
                MintOptions {
                    issuer_override: Some("https://evil.test".into()),
                    ..opts()
                },
                "issuer",
                &issuer,
            ),
        ];
        for (o, want, iss) in cases {
            let token = iss.mint(&o).unwrap();
            let err = authn.authenticate(&token).await.unwrap_err().to_string();
            assert!(err.contains(want), "{want}: {err}");
        }
        // Signed by a key the JWKS does not hold (same kid shape, other key).
        let token = other.mint(&opts()).unwrap();
        let err = authn.authenticate(&token).await.unwrap_err();
        assert!(
            matches!(err, TokenError::NoKey { .. } | TokenError::Signature),
            "{err}"
        );
        assert!(matches!(
            authn.authenticate("not.a.jwt").await,
            Err(TokenError::Malformed(_))
        ));
    }

    #[tokio::test]
    async fn authenticators_report_every_reason() {
        let dir = tempfile::tempdir().unwrap();
        let (_, authn) = setup(dir.path());
        let a = Authenticators {
            client_cert: true,
            jwt: Some(Arc::new(authn)),
            kube: None,
        };
        let err = a.authenticate(&MetadataMap::new(), None).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "request authenticate failure: no client certificate; no HTTP authorization header exists"
        );
    }

    #[test]
    fn jwt_rule_parses_and_names_mistakes() {
        let r =
            JwtRule::parse(r#"{"issuer":"i","jwks_uri":"file:///x","audiences":["a"]}"#).unwrap();
        assert_eq!(r.audiences, vec!["a"]);
        let e = JwtRule::parse("{").unwrap_err();
        assert!(matches!(e, JwtRuleError::Json(_)), "{e}");
        assert!(
            e.to_string().starts_with("JWT_RULE is not valid JSON"),
            "{e}"
        );
        assert_eq!(
            JwtRule::parse(r#"{"issuer":"i","jwks_uri":"ftp://x"}"#),
            Err(JwtRuleError::JwksUri("ftp://x".into()))
        );
        assert_eq!(
            JwtRule::parse(r#"{"issuer":"","jwks_uri":"file:///x"}"#),
            Err(JwtRuleError::NoIssuer)
        );
    }
}
