//! Istio's `JwksResolver`: the keys of every `(issuer, jwksUri)` the
//! generators asked for, fetched by istiod, cached, refreshed every
//! `PILOT_JWT_PUB_KEY_REFRESH_INTERVAL`, a change of keys triggering a full
//! push.
//!
//! Generation never waits for the network: [`JwksResolver::local_jwks`]
//! answers from the cache, and on a miss returns [`FAKE_JWKS`] (a key no
//! token is signed with, so tokens are refused with 401 rather than let
//! through) and wakes [`JwksResolver::run`], which fetches in the background
//! and pushes when the keys arrive. Istio instead fetches once inline on a
//! miss (no retry), blocking that push; the outcome a proxy ends up with is
//! the same. No lock is held across a fetch.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::{FetchError, check_jwks, fetch};

/// `PILOT_JWT_PUB_KEY_REFRESH_INTERVAL`: how often cached keys are fetched again.
pub const ENV_REFRESH_INTERVAL: &str = "PILOT_JWT_PUB_KEY_REFRESH_INTERVAL";
/// Istio's default refresh interval (20m).
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(20 * 60);
/// Istio's `JwtPubKeyRefreshIntervalOnFailure`: the interval after a failed
/// refresh (doubled while failures last).
pub const REFRESH_INTERVAL_ON_FAILURE: Duration = Duration::from_secs(60);
/// Istio's `JwtPubKeyRefreshIntervalOnFailureResetThreshold`: the longest
/// interval failures back off to.
const REFRESH_INTERVAL_ON_FAILURE_CAP: Duration = Duration::from_secs(60 * 60);
/// Istio's `JwtPubKeyEvictionDuration`: keys unused, or not refreshed, for
/// this long are dropped.
pub const EVICTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Istio's fetch timeout when `JwtRule.timeout` is unset (5s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Istio's `networkFetchRetryCountOnRefreshFlow`.
const REFRESH_RETRIES: usize = 7;
/// Istio's `JwtPubKeyRetryInterval`.
const RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// OpenID discovery: where an issuer publishes its `jwks_uri`.
const OPENID_DISCOVERY_SUFFIX: &str = "/.well-known/openid-configuration";

/// The JWKS inlined while a rule's keys are not fetched yet, or cannot be:
/// one RSA public key whose private key was discarded when it was made, so
/// no token validates against it and Envoy answers 401 for any token. It is
/// fixed, so a failing fetch does not change the config pushed. Istio's
/// `FakeJwks` plays the same part but publishes its private key with it;
/// this one deliberately does not.
pub const FAKE_JWKS: &str = r#"{"keys":[{"kty":"RSA","e":"AQAB","kid":"istiod-jwks-not-fetched","n":"st6kCjAgsjnrIuTYbNmRKIM36woiLN5Nf7pJSDGM3b_GELF93wNm588-nFLNvvxxmbrIEUAo0WYkqFmKO6f2YOs20gSABo6lgNb6O3GLpJZViJItm_ZXUujtjpui9uAhLp8Gq6lZCRcXaxvlnP9N8W8x_XRxLEjL3F_h-fEHiNtt1jm21w_KaiiAjigC4r_1crv_qxjwb34QwTCgE_ApF3NG3MziTd9A7_OZqAKXbzasC2wBGQ2r6p-tRJTYhGCzkTAb0GyjTatC9lMshNnZX9RdEtLHoyx51Ii1eJ3kk40Bbz7foooBXPKKNmK3dlmw-Y2RwJY5c724cTxPKrKFfw"}]}"#;

/// An invalid resolver setting in the environment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SettingsError(String);

/// `PILOT_JWT_PUB_KEY_REFRESH_INTERVAL` from `env` (Go duration syntax;
/// must be positive).
pub fn refresh_interval(env: &dyn common::env::Env) -> Result<Duration, SettingsError> {
    let mut r = common::env::Reader::new(env);
    let d = r.duration(ENV_REFRESH_INTERVAL, DEFAULT_REFRESH_INTERVAL);
    if d.is_zero() {
        r.error(format!(
            "{ENV_REFRESH_INTERVAL}: must be a positive duration such as 20m"
        ));
    }
    r.finish()
        .map(|()| d)
        .map_err(|e| SettingsError(e.to_string()))
}

/// A cache key: Istio's `jwtKey`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    issuer: String,
    /// Empty: found by OpenID discovery from the issuer.
    jwks_uri: String,
}

impl Key {
    fn describe(&self) -> String {
        if self.jwks_uri.is_empty() {
            format!("{}{OPENID_DISCOVERY_SUFFIX}", self.issuer)
        } else {
            self.jwks_uri.clone()
        }
    }
}

#[derive(Debug)]
struct Entry {
    /// The JWKS as fetched; `None` until a fetch succeeds.
    keys: Option<String>,
    last_used: Instant,
    last_refreshed: Instant,
    /// When the fetch whose keys are stored started: an older fetch that
    /// ends later (a first fetch and a round overlapping) must not put its
    /// keys back over newer ones.
    fetch_started: Option<Instant>,
    timeout: Duration,
}

/// What one refresh round found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Outcome {
    changed: bool,
    failed: bool,
}

/// The JWKS cache the generators read and [`JwksResolver::run`] fills.
#[derive(Debug, Default)]
pub struct JwksResolver {
    entries: Mutex<BTreeMap<Key, Entry>>,
    wake: Notify,
}

impl JwksResolver {
    /// An empty resolver; nothing is fetched until [`Self::run`] runs.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<Key, Entry>> {
        // The map stays consistent at every await-free step; a panic in
        // another holder leaves nothing half-done.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached keys of `(issuer, jwks_uri)`, or `None` (a fetch is then
    /// scheduled). An empty `jwks_uri` is found by OpenID discovery from
    /// the issuer, as Istio does. Never waits for the network.
    pub fn keys(&self, issuer: &str, jwks_uri: &str, timeout: Duration) -> Option<String> {
        let key = Key {
            issuer: issuer.to_string(),
            jwks_uri: jwks_uri.to_string(),
        };
        let now = Instant::now();
        let mut entries = self.lock();
        if let Some(e) = entries.get_mut(&key) {
            e.last_used = now;
            e.timeout = timeout;
            return e.keys.clone();
        }
        entries.insert(
            key,
            Entry {
                keys: None,
                last_used: now,
                last_refreshed: now,
                fetch_started: None,
                timeout,
            },
        );
        drop(entries);
        self.wake.notify_one();
        None
    }

    /// The JWKS to inline for a rule: the cached keys, else [`FAKE_JWKS`].
    pub fn local_jwks(&self, issuer: &str, jwks_uri: &str, timeout: Duration) -> String {
        self.keys(issuer, jwks_uri, timeout).unwrap_or_else(|| {
            tracing::info!(target: "authn", "The JWKS key is not yet fetched for issuer {issuer} ({jwks_uri}), using a fake JWKS for now");
            FAKE_JWKS.to_string()
        })
    }

    /// Fetches what the generators asked for as they ask, and refreshes
    /// every cached entry every `refresh` (backing off as Istio does while
    /// fetches fail); calls `on_change` when any entry's keys changed.
    /// First fetches run alongside a refresh round, so a JWKS that hangs
    /// through a round's retries does not hold up another issuer's keys.
    pub async fn run(
        self: Arc<Self>,
        refresh: Duration,
        on_change: impl Fn() + Send + Sync + 'static,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let on_failure = REFRESH_INTERVAL_ON_FAILURE.min(refresh);
        // A failed first fetch brings the next round forward.
        let soon = Notify::new();
        let first_fetches = async {
            loop {
                self.wake.notified().await;
                let outcome = self.refresh(true, 0).await;
                // Istio retries a failed first fetch in the background;
                // here the next round comes no later than the failure
                // interval.
                if outcome.failed {
                    soon.notify_one();
                }
                if outcome.changed {
                    on_change();
                }
            }
        };
        let rounds = async {
            let mut interval = refresh;
            let mut last_failed = false;
            let mut next = Instant::now() + interval;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(next) => {}
                    _ = soon.notified() => {
                        next = next.min(Instant::now() + on_failure);
                        continue;
                    }
                }
                let outcome = self.refresh(false, REFRESH_RETRIES).await;
                interval = match (outcome.failed, last_failed) {
                    (false, _) => refresh,
                    (true, false) => on_failure,
                    (true, true) => {
                        (interval * 2).min(REFRESH_INTERVAL_ON_FAILURE_CAP.max(refresh))
                    }
                };
                last_failed = outcome.failed;
                next = Instant::now() + interval;
                if outcome.changed {
                    on_change();
                }
            }
        };
        let stopped = async {
            while shutdown.changed().await.is_ok() {
                if *shutdown.borrow() {
                    return;
                }
            }
        };
        tokio::select! {
            () = first_fetches => {}
            () = rounds => {}
            () = stopped => {}
        }
    }

    /// One round: every entry (or only those never fetched), fetched
    /// concurrently with no lock held. What is needed is copied out under
    /// the lock; the results are stored under it again, compared with what
    /// the entry holds then (another fetch may have stored keys meanwhile,
    /// or the entry may be gone).
    async fn refresh(&self, missing_only: bool, retries: usize) -> Outcome {
        let now = Instant::now();
        let jobs: Vec<(Key, Duration)> = {
            let mut entries = self.lock();
            entries.retain(|k, e| {
                let keep = now.duration_since(e.last_used) < EVICTION
                    && now.duration_since(e.last_refreshed) < EVICTION;
                if !keep {
                    tracing::info!(target: "authn", "Removed cached JWT public key of issuer {} ({})", k.issuer, k.describe());
                }
                keep
            });
            entries
                .iter()
                .filter(|(_, e)| !missing_only || e.keys.is_none())
                .map(|(k, e)| (k.clone(), e.timeout))
                .collect()
        };
        if jobs.is_empty() {
            return Outcome::default();
        }
        let results = futures::future::join_all(
            jobs.iter()
                .map(|(key, timeout)| fetch_keys(key, *timeout, retries)),
        )
        .await;
        let mut outcome = Outcome::default();
        let mut entries = self.lock();
        for ((key, _), result) in jobs.into_iter().zip(results) {
            match result {
                Ok(body) => {
                    // Evicted while fetching: nobody asks for it any more.
                    let Some(e) = entries.get_mut(&key) else {
                        continue;
                    };
                    if e.fetch_started.is_some_and(|t| t > now) {
                        // A fetch that started after this one already stored its keys.
                        continue;
                    }
                    let changed = e.keys.as_deref().is_none_or(|old| jwks_differ(old, &body));
                    if changed {
                        tracing::info!(target: "authn", "Updated cached JWT public key from {}", key.describe());
                        outcome.changed = true;
                    }
                    e.keys = Some(body);
                    e.fetch_started = Some(now);
                    e.last_refreshed = Instant::now();
                }
                Err(e) => {
                    outcome.failed = true;
                    tracing::error!(target: "authn", "Failed to refresh JWT public key of issuer {:?}: {e}", key.issuer);
                }
            }
        }
        outcome
    }
}

/// Fetches one entry's JWKS (after OpenID discovery when it has no URI).
async fn fetch_keys(key: &Key, timeout: Duration, retries: usize) -> Result<String, FetchError> {
    let uri = if key.jwks_uri.is_empty() {
        discover(&key.issuer, timeout, retries).await?
    } else {
        key.jwks_uri.clone()
    };
    let body = fetch_with_retry(&uri, timeout, retries).await?;
    check_jwks(&body).map_err(|reason| FetchError::Body {
        uri: uri.clone(),
        reason: format!("not a JSON Web Key Set: {reason}"),
    })?;
    Ok(body)
}

/// The `jwks_uri` of the issuer's OpenID discovery document.
async fn discover(issuer: &str, timeout: Duration, retries: usize) -> Result<String, FetchError> {
    let uri = format!("{}{OPENID_DISCOVERY_SUFFIX}", issuer.trim_end_matches('/'));
    let body = fetch_with_retry(&uri, timeout, retries).await?;
    let doc: serde_json::Value = serde_json::from_str(&body).map_err(|e| FetchError::Body {
        uri: uri.clone(),
        reason: format!("not JSON: {e}"),
    })?;
    doc.get("jwks_uri")
        .and_then(|u| u.as_str())
        .map(str::to_string)
        .ok_or_else(|| FetchError::Body {
            uri,
            reason: "no jwks_uri in the OpenID discovery configuration".into(),
        })
}

async fn fetch_with_retry(
    uri: &str,
    timeout: Duration,
    retries: usize,
) -> Result<String, FetchError> {
    let mut attempt = 0;
    loop {
        match fetch(uri, timeout, false).await {
            Ok(body) => return Ok(body),
            Err(e) if attempt < retries => {
                tracing::warn!(target: "authn", "Failed to GET {e}. Retry in {RETRY_INTERVAL:?}");
                attempt += 1;
                tokio::time::sleep(RETRY_INTERVAL).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Istio's `compareJWKSResponse`: the same keys in another order are no
/// change; anything unparseable as before is.
fn jwks_differ(old: &str, new: &str) -> bool {
    if old == new {
        return false;
    }
    let sorted = |text: &str| -> Option<Vec<serde_json::Value>> {
        let value: serde_json::Value = serde_json::from_str(text).ok()?;
        let mut keys = value.get("keys")?.as_array()?.clone();
        keys.sort_by_key(|k| k.to_string());
        Some(keys)
    };
    match (sorted(old), sorted(new)) {
        (Some(a), Some(b)) => a != b,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::Router;
    use axum::routing::get;

    /// A JWKS server whose answer the test changes; counts requests.
    struct Server {
        uri: String,
        body: Arc<Mutex<(u16, String)>>,
        hits: Arc<AtomicUsize>,
    }

    async fn server() -> Server {
        let body = Arc::new(Mutex::new((
            200u16,
            r#"{"keys":[{"kty":"RSA","kid":"a","n":"AQAB","e":"AQAB"}]}"#.to_string(),
        )));
        let hits = Arc::new(AtomicUsize::new(0));
        let (b, h) = (body.clone(), hits.clone());
        let app = Router::new().route(
            "/jwks",
            get(move || {
                let (b, h) = (b.clone(), h.clone());
                async move {
                    h.fetch_add(1, Ordering::SeqCst);
                    let (status, text) = b.lock().unwrap().clone();
                    (axum::http::StatusCode::from_u16(status).unwrap(), text)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Server {
            uri: format!("http://{addr}/jwks"),
            body,
            hits,
        }
    }

    async fn wait(
        mut rx: tokio::sync::mpsc::UnboundedReceiver<()>,
    ) -> tokio::sync::mpsc::UnboundedReceiver<()> {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("no change reported within 10s")
            .expect("resolver stopped");
        rx
    }

    #[tokio::test]
    async fn miss_answers_fake_then_fetches_and_reports_a_change() {
        let srv = server().await;
        let resolver = Arc::new(JwksResolver::new());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (_stop, stop_rx) = watch::channel(false);
        tokio::spawn(resolver.clone().run(
            Duration::from_millis(300),
            move || {
                let _ = tx.send(());
            },
            stop_rx,
        ));
        assert_eq!(
            resolver.local_jwks("iss", &srv.uri, DEFAULT_TIMEOUT),
            FAKE_JWKS
        );
        let rx = wait(rx).await;
        let keys = resolver.local_jwks("iss", &srv.uri, DEFAULT_TIMEOUT);
        assert!(keys.contains(r#""kid":"a""#), "{keys}");

        // Rotation: the next refresh sees the new key and reports it.
        srv.body.lock().unwrap().1 =
            r#"{"keys":[{"kty":"RSA","kid":"b","n":"AQAB","e":"AQAB"}]}"#.into();
        let _rx = wait(rx).await;
        let keys = resolver.local_jwks("iss", &srv.uri, DEFAULT_TIMEOUT);
        assert!(keys.contains(r#""kid":"b""#), "{keys}");
        assert!(srv.hits.load(Ordering::SeqCst) >= 2);
    }

    #[tokio::test]
    async fn a_hanging_jwks_does_not_hold_up_another_first_fetch() {
        let srv = server().await;
        // Connections are queued, never accepted: every fetch times out.
        let black_hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let slow = format!("http://{}/jwks", black_hole.local_addr().unwrap());
        let resolver = Arc::new(JwksResolver::new());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (_stop, stop_rx) = watch::channel(false);
        tokio::spawn(resolver.clone().run(
            Duration::from_millis(300),
            move || {
                let _ = tx.send(());
            },
            stop_rx,
        ));
        let timeout = Duration::from_millis(500);
        assert!(resolver.keys("slow", &slow, timeout).is_none());
        // The first fetch fails at 0.5s and a round of retries (8 attempts
        // of 0.5s, 1s apart) starts at 0.8s.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(resolver.keys("good", &srv.uri, DEFAULT_TIMEOUT).is_none());
        tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .expect("the good JWKS is fetched while the slow one's round goes on")
            .unwrap();
        assert!(resolver.keys("good", &srv.uri, DEFAULT_TIMEOUT).is_some());
        assert!(resolver.keys("slow", &slow, timeout).is_none());
        drop(black_hole);
    }

    #[tokio::test]
    async fn failed_refresh_keeps_the_previous_keys() {
        let srv = server().await;
        let resolver = Arc::new(JwksResolver::new());
        assert!(resolver.keys("iss", &srv.uri, DEFAULT_TIMEOUT).is_none());
        assert!(resolver.refresh(true, 0).await.changed);
        // Nothing missing: nothing fetched.
        assert_eq!(resolver.refresh(true, 0).await, Outcome::default());
        *srv.body.lock().unwrap() = (500, "down".into());
        assert_eq!(
            resolver.refresh(false, 0).await,
            Outcome {
                changed: false,
                failed: true
            }
        );
        let keys = resolver.keys("iss", &srv.uri, DEFAULT_TIMEOUT).unwrap();
        assert!(keys.contains(r#""kid":"a""#));
    }

    #[tokio::test]
    async fn fetch_failure_and_non_jwks_are_failures() {
        let srv = server().await;
        *srv.body.lock().unwrap() = (200, "<html>".into());
        let resolver = JwksResolver::new();
        assert!(resolver.keys("iss", &srv.uri, DEFAULT_TIMEOUT).is_none());
        assert_eq!(
            resolver.refresh(true, 0).await,
            Outcome {
                changed: false,
                failed: true
            }
        );
        *srv.body.lock().unwrap() = (404, "nope".into());
        let e = fetch_keys(
            &Key {
                issuer: "iss".into(),
                jwks_uri: srv.uri.clone(),
            },
            DEFAULT_TIMEOUT,
            0,
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("status 404"), "{e}");
        assert!(e.to_string().contains(&srv.uri), "{e}");
    }

    #[tokio::test]
    async fn openid_discovery_when_no_uri() {
        let srv = server().await;
        let jwks = srv.uri.clone();
        let app = Router::new().route(
            "/issuer/.well-known/openid-configuration",
            get(move || {
                let jwks = jwks.clone();
                async move { format!(r#"{{"jwks_uri":"{jwks}"}}"#) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let key = Key {
            issuer: format!("http://{addr}/issuer/"),
            jwks_uri: String::new(),
        };
        let body = fetch_keys(&key, DEFAULT_TIMEOUT, 0).await.unwrap();
        assert!(body.contains(r#""kid":"a""#));
    }

    /// A JWKS server whose first answer (key "old") takes `first_delay`
    /// and whose later answers (key "new") come at once.
    async fn slow_first_server(first_delay: Duration) -> (String, Arc<AtomicUsize>) {
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        let app = Router::new().route(
            "/jwks",
            get(move || {
                let h = h.clone();
                async move {
                    if h.fetch_add(1, Ordering::SeqCst) == 0 {
                        tokio::time::sleep(first_delay).await;
                        r#"{"keys":[{"kty":"RSA","kid":"old","n":"AQAB","e":"AQAB"}]}"#
                    } else {
                        r#"{"keys":[{"kty":"RSA","kid":"new","n":"AQAB","e":"AQAB"}]}"#
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{addr}/jwks"), hits)
    }

    async fn wait_hits(hits: &AtomicUsize, n: usize) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while hits.load(Ordering::SeqCst) < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the JWKS server was asked in time");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readers_are_not_blocked_while_a_fetch_is_in_flight() {
        let (slow, hits) = slow_first_server(Duration::from_secs(2)).await;
        let resolver = Arc::new(JwksResolver::new());
        assert!(resolver.keys("slow", &slow, DEFAULT_TIMEOUT).is_none());
        let round = tokio::spawn({
            let resolver = resolver.clone();
            async move { resolver.refresh(true, 0).await }
        });
        wait_hits(&hits, 1).await;
        // The generators read the cache from synchronous code: with the
        // lock held across the fetch these calls would block for its length.
        let reader = tokio::task::spawn_blocking({
            let resolver = resolver.clone();
            let slow = slow.clone();
            move || {
                (
                    resolver.local_jwks("slow", &slow, DEFAULT_TIMEOUT),
                    resolver.keys("other", "http://127.0.0.1:1/jwks", DEFAULT_TIMEOUT),
                )
            }
        });
        let (slow_keys, other) = tokio::time::timeout(Duration::from_millis(500), reader)
            .await
            .expect("a reader is not held up by the fetch")
            .unwrap();
        assert_eq!(slow_keys, FAKE_JWKS);
        assert!(other.is_none());
        assert!(!round.is_finished(), "the fetch was still under way");
        assert!(round.await.unwrap().changed);
        let keys = resolver.keys("slow", &slow, DEFAULT_TIMEOUT).unwrap();
        assert!(keys.contains(r#""kid":"old""#), "{keys}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_older_fetch_ending_later_does_not_put_back_older_keys() {
        let (uri, hits) = slow_first_server(Duration::from_secs(1)).await;
        let resolver = Arc::new(JwksResolver::new());
        assert!(resolver.keys("iss", &uri, DEFAULT_TIMEOUT).is_none());
        // A first fetch (slow, answering "old")...
        let first = tokio::spawn({
            let resolver = resolver.clone();
            async move { resolver.refresh(true, 0).await }
        });
        wait_hits(&hits, 1).await;
        // ...overtaken by a refresh round (fast, answering "new").
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(resolver.refresh(false, 0).await.changed);
        let keys = resolver.keys("iss", &uri, DEFAULT_TIMEOUT).unwrap();
        assert!(keys.contains(r#""kid":"new""#), "{keys}");
        assert_eq!(
            first.await.unwrap(),
            Outcome::default(),
            "the late, older answer is dropped: no change, no push"
        );
        let keys = resolver.keys("iss", &uri, DEFAULT_TIMEOUT).unwrap();
        assert!(keys.contains(r#""kid":"new""#), "{keys}");
    }

    #[test]
    fn reordered_keys_are_no_change() {
        let a = r#"{"keys":[{"kid":"1","kty":"RSA"},{"kid":"2","kty":"RSA"}]}"#;
        let b = r#"{"keys":[{"kid":"2","kty":"RSA"},{"kid":"1","kty":"RSA"}]}"#;
        let c = r#"{"keys":[{"kid":"3","kty":"RSA"}]}"#;
        assert!(!jwks_differ(a, b));
        assert!(jwks_differ(a, c));
        assert!(jwks_differ("x", c));
    }

    #[test]
    fn refresh_interval_from_env() {
        let env = |v: &str| common::env::MapEnv::from_pairs([(ENV_REFRESH_INTERVAL, v)]);
        assert_eq!(
            refresh_interval(&common::env::MapEnv::from_pairs([])).unwrap(),
            DEFAULT_REFRESH_INTERVAL
        );
        assert_eq!(
            refresh_interval(&env("2s")).unwrap(),
            Duration::from_secs(2)
        );
        for bad in ["0s", "soon"] {
            let e = refresh_interval(&env(bad)).unwrap_err().to_string();
            assert!(e.contains(ENV_REFRESH_INTERVAL), "{e}");
        }
    }

    #[test]
    fn fake_jwks_is_a_jwks() {
        check_jwks(FAKE_JWKS).unwrap();
    }
}
