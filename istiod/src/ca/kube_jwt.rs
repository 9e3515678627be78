//! Istio's `KubeJWTAuthenticator`: a workload's bearer token is sent to the
//! Kubernetes API as a TokenReview (`authentication.k8s.io/v1`), and the
//! caller is the service account the API server says the token belongs to.
//!
//! With `JWT_POLICY=third-party-jwt` (Istio's default) the review asks for
//! the audiences of `TOKEN_AUDIENCES` (`istio-ca`); with `first-party-jwt` it
//! asks for none. Anything but a clear "authenticated service account" from
//! the API server (an error, a 5xx, no answer in time) refuses the caller:
//! no identity is ever granted on doubt.

use std::time::Duration;

use common::Identity;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use kube::api::{Api, PostParams};

/// How long a review may take before the caller is refused.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// The group every service account token's user is in.
const SERVICE_ACCOUNTS_GROUP: &str = "system:serviceaccounts";

/// `JWT_POLICY`: which Kubernetes tokens workloads present.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JwtPolicy {
    /// `third-party-jwt`: projected tokens whose audience is `TOKEN_AUDIENCES`.
    #[default]
    ThirdParty,
    /// `first-party-jwt`: legacy service account tokens, reviewed without audiences.
    FirstParty,
}

/// A `JWT_POLICY` value that is not one of Istio's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a policy (use third-party-jwt or first-party-jwt)")]
pub struct UnknownJwtPolicy(pub String);

impl std::str::FromStr for JwtPolicy {
    type Err = UnknownJwtPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "third-party-jwt" => Ok(Self::ThirdParty),
            "first-party-jwt" => Ok(Self::FirstParty),
            other => Err(UnknownJwtPolicy(other.to_string())),
        }
    }
}

/// Reviews bearer tokens with the Kubernetes API.
#[derive(Clone)]
pub struct KubeJwtAuthenticator {
    client: kube::Client,
    /// The audiences asked for; `None` for first-party tokens.
    audiences: Option<Vec<String>>,
    trust_domain: String,
    timeout: Duration,
}

impl std::fmt::Debug for KubeJwtAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeJwtAuthenticator")
            .field("audiences", &self.audiences)
            .field("trust_domain", &self.trust_domain)
            .finish()
    }
}

impl KubeJwtAuthenticator {
    /// An authenticator reviewing tokens through `client`, mapping service
    /// accounts into `trust_domain`.
    pub fn new(
        client: kube::Client,
        policy: JwtPolicy,
        audiences: Vec<String>,
        trust_domain: &str,
    ) -> Self {
        Self {
            client,
            audiences: match policy {
                JwtPolicy::ThirdParty => Some(audiences),
                JwtPolicy::FirstParty => None,
            },
            trust_domain: trust_domain.to_string(),
            timeout: REVIEW_TIMEOUT,
        }
    }

    /// The same authenticator with another review timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Reviews `token`; the caller's identity, or why it is refused.
    pub async fn authenticate(&self, token: &str) -> Result<Identity, ReviewError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: self.audiences.clone(),
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let reviewed =
            tokio::time::timeout(self.timeout, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| ReviewError::Timeout(self.timeout))?
                .map_err(|e| ReviewError::Api(e.to_string()))?;
        review_identity(
            reviewed.status.as_ref(),
            self.audiences.as_deref(),
            &self.trust_domain,
        )
    }
}

/// Reads a TokenReview's answer as Istio does: no error, authenticated, a
/// service account (`system:serviceaccounts` group, user
/// `system:serviceaccount:<namespace>:<name>`), and, when audiences were
/// asked for, one of them in `status.audiences` (an API server that does not
/// check audiences leaves it empty, which Kubernetes says to treat as "not
/// for this audience").
pub fn review_identity(
    status: Option<&TokenReviewStatus>,
    audiences: Option<&[String]>,
    trust_domain: &str,
) -> Result<Identity, ReviewError> {
    let status = status.ok_or(ReviewError::NoStatus)?;
    if let Some(e) = status.error.as_deref().filter(|e| !e.is_empty()) {
        return Err(ReviewError::Refused(e.to_string()));
    }
    if status.authenticated != Some(true) {
        return Err(ReviewError::NotAuthenticated);
    }
    if let Some(wanted) = audiences.filter(|a| !a.is_empty()) {
        let granted = status.audiences.as_deref().unwrap_or_default();
        if !granted.iter().any(|a| wanted.contains(a)) {
            return Err(ReviewError::Audience {
                wanted: wanted.to_vec(),
                granted: granted.to_vec(),
            });
        }
    }
    let user = status.user.as_ref().ok_or(ReviewError::NoUser)?;
    let in_group = user
        .groups
        .iter()
        .flatten()
        .any(|g| g == SERVICE_ACCOUNTS_GROUP);
    if !in_group {
        return Err(ReviewError::NotServiceAccount);
    }
    let username = user.username.as_deref().unwrap_or_default();
    Identity::from_k8s_subject(trust_domain, username)
        .ok_or_else(|| ReviewError::Username(username.to_string()))
}

/// Why a TokenReview did not give a caller's identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    /// The API server did not answer in time.
    #[error("the Kubernetes API did not answer the TokenReview within {0:?}")]
    Timeout(Duration),
    /// The API call failed.
    #[error("TokenReview failed: {0}")]
    Api(String),
    /// The answer has no status.
    #[error("the TokenReview has no status")]
    NoStatus,
    /// The API server reports an error for the token.
    #[error("the service account authentication returns an error: {0}")]
    Refused(String),
    /// The token is not authenticated.
    #[error("the token is not authenticated")]
    NotAuthenticated,
    /// None of the asked audiences was granted.
    #[error("the token is not for audience {wanted:?} (the review granted {granted:?})")]
    Audience {
        /// What istiod asked for.
        wanted: Vec<String>,
        /// What the review granted.
        granted: Vec<String>,
    },
    /// The answer names no user.
    #[error("the TokenReview names no user")]
    NoUser,
    /// The user is not in `system:serviceaccounts`.
    #[error("the token is not a service account")]
    NotServiceAccount,
    /// The user name is not `system:serviceaccount:<namespace>:<name>`.
    #[error(
        "invalid username {0:?} in the token review result (want system:serviceaccount:<namespace>:<name>)"
    )]
    Username(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;

    fn status(authenticated: bool, audiences: &[&str], username: &str) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(authenticated),
            audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
            error: None,
            user: Some(UserInfo {
                username: Some(username.into()),
                groups: Some(vec![
                    "system:serviceaccounts".into(),
                    "system:authenticated".into(),
                ]),
                ..Default::default()
            }),
        }
    }

    fn ca() -> Vec<String> {
        vec!["istio-ca".to_string()]
    }

    #[test]
    fn an_authenticated_service_account_is_the_caller() {
        let s = status(true, &["istio-ca"], "system:serviceaccount:demo:sleep");
        let id = review_identity(Some(&s), Some(&ca()), "cluster.local").unwrap();
        assert_eq!(id.to_string(), "spiffe://cluster.local/ns/demo/sa/sleep");
        // First-party tokens are reviewed without audiences.
        let s = status(true, &[], "system:serviceaccount:demo:sleep");
        assert!(review_identity(Some(&s), None, "cluster.local").is_ok());
    }

    #[test]
    fn anything_else_is_refused_with_the_reason() {
        let cases = [
            (
                status(false, &["istio-ca"], "system:serviceaccount:demo:sleep"),
                "not authenticated",
            ),
            (
                status(true, &["kubernetes"], "system:serviceaccount:demo:sleep"),
                "not for audience",
            ),
            (
                status(true, &[], "system:serviceaccount:demo:sleep"),
                "not for audience",
            ),
            (status(true, &["istio-ca"], "alice"), "invalid username"),
            (
                status(true, &["istio-ca"], "system:serviceaccount:demo"),
                "invalid username",
            ),
        ];
        for (s, want) in cases {
            let err = review_identity(Some(&s), Some(&ca()), "cluster.local")
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{want}: {err}");
        }
        let mut user = status(true, &["istio-ca"], "system:serviceaccount:demo:sleep");
        user.user.as_mut().unwrap().groups = Some(vec!["system:authenticated".into()]);
        let err = review_identity(Some(&user), Some(&ca()), "cluster.local").unwrap_err();
        assert_eq!(err, ReviewError::NotServiceAccount);
        let mut failed = status(true, &["istio-ca"], "system:serviceaccount:demo:sleep");
        failed.error = Some("token expired".into());
        let err = review_identity(Some(&failed), Some(&ca()), "cluster.local").unwrap_err();
        assert_eq!(err, ReviewError::Refused("token expired".into()));
        assert_eq!(
            review_identity(None, Some(&ca()), "cluster.local"),
            Err(ReviewError::NoStatus)
        );
    }

    /// A stand-in API server answering every TokenReview with `answer`.
    async fn api_server(
        answer: axum::http::StatusCode,
        body: serde_json::Value,
        delay: Duration,
    ) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            axum::routing::post(move |axum::Json(review): axum::Json<serde_json::Value>| {
                let body = body.clone();
                async move {
                    tokio::time::sleep(delay).await;
                    let mut body = body;
                    body["spec"] = review["spec"].clone();
                    (answer, axum::Json(body))
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

    fn authenticator(addr: std::net::SocketAddr) -> KubeJwtAuthenticator {
        common::tls::install_crypto_provider();
        let mut config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        config.default_retry = false;
        let client = kube::Client::try_from(config).unwrap();
        KubeJwtAuthenticator::new(client, JwtPolicy::ThirdParty, ca(), "cluster.local")
            .with_timeout(Duration::from_millis(500))
    }

    fn granted() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "status": {
                "authenticated": true,
                "audiences": ["istio-ca"],
                "user": {
                    "username": "system:serviceaccount:demo:sleep",
                    "groups": ["system:serviceaccounts", "system:serviceaccounts:demo"],
                },
            },
        })
    }

    #[tokio::test]
    async fn a_review_grants_the_service_account() {
        let addr = api_server(axum::http::StatusCode::CREATED, granted(), Duration::ZERO).await;
        let id = authenticator(addr).authenticate("t").await.unwrap();
        assert_eq!(id.to_string(), "spiffe://cluster.local/ns/demo/sa/sleep");
    }

    #[tokio::test]
    async fn api_server_failures_refuse_the_caller() {
        let err = |addr| async move { authenticator(addr).authenticate("t").await.unwrap_err() };
        let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "etcd is down", "reason": "InternalError", "code": 500});
        let addr = api_server(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            status,
            Duration::ZERO,
        )
        .await;
        assert!(matches!(err(addr).await, ReviewError::Api(_)));
        // Slower than the timeout: refused, not waited for.
        let addr = api_server(
            axum::http::StatusCode::CREATED,
            granted(),
            Duration::from_secs(5),
        )
        .await;
        assert!(matches!(err(addr).await, ReviewError::Timeout(_)));
        // Nothing listening.
        let unused = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = unused.local_addr().unwrap();
        drop(unused);
        assert!(matches!(err(addr).await, ReviewError::Api(_)));
    }
}
