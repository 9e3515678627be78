//! One JWKS URI's keys for a caller that checks tokens on demand (the CA's
//! `JWT_RULE` authenticator): fetched when stale, or when a token names a key
//! id the set lacks (at most every `min_refetch`), with no lock held across
//! the fetch. One fetch runs at a time; while it runs, callers whose key is
//! in the set go on with it, and only callers that need the fetch's answer
//! (no keys yet, or an unknown key id) wait for it.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use jsonwebtoken::jwk::JwkSet;
use tokio::sync::watch;
use tokio::time::Instant;

use super::fetch;

/// Why no signing keys could be had (and none were cached).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeySetError {
    /// The key set could not be fetched.
    #[error("fetching JWKS {0}")]
    Fetch(#[from] super::FetchError),
    /// What was fetched is not a JSON Web Key Set.
    #[error("JWKS {uri} is not a JSON Web Key Set: {reason}")]
    NotJwks {
        /// The `jwks_uri`.
        uri: String,
        /// The parser's message.
        reason: String,
    },
}

#[derive(Debug, Default)]
struct State {
    keys: Option<JwkSet>,
    /// When the last successful fetch ended.
    fetched: Option<Instant>,
    /// Whether a fetch is under way.
    in_flight: bool,
}

/// What a caller does after looking at the cache.
enum Next {
    Use(JwkSet),
    Fetch(Option<JwkSet>),
    Wait(watch::Receiver<u64>),
}

/// The keys of one JWKS URI, fetched on demand.
#[derive(Debug)]
pub struct KeySetCache {
    uri: String,
    refresh: Duration,
    min_refetch: Duration,
    timeout: Duration,
    state: Mutex<State>,
    /// Bumped each time a fetch ends, for the callers waiting on it.
    done: watch::Sender<u64>,
}

/// Ends the fetch on every path, the caller's future being dropped included,
/// so waiters never wait on a fetch nobody runs.
struct InFlight<'a>(&'a KeySetCache);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.lock().in_flight = false;
        self.0.done.send_modify(|n| *n += 1);
    }
}

impl KeySetCache {
    /// Keys from `uri` (`file://` allowed), trusted for `refresh`, fetched
    /// again for an unknown key id at most every `min_refetch`, each fetch
    /// taking at most `timeout`.
    pub fn new(uri: &str, refresh: Duration, min_refetch: Duration, timeout: Duration) -> Self {
        Self {
            uri: uri.to_string(),
            refresh,
            min_refetch,
            timeout,
            state: Mutex::new(State::default()),
            done: watch::channel(0).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is a few field stores: nothing is half-done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn next(&self, kid: Option<&str>) -> Next {
        let mut state = self.lock();
        let age = state.fetched.map(|t| t.elapsed());
        let stale = age.is_none_or(|a| a > self.refresh);
        let unknown_kid = match (&state.keys, kid) {
            (Some(set), Some(kid)) => set.find(kid).is_none(),
            _ => false,
        };
        let refetch = stale || (unknown_kid && age.is_none_or(|a| a > self.min_refetch));
        match (&state.keys, refetch, state.in_flight) {
            (Some(keys), false, _) => Next::Use(keys.clone()),
            // Someone is fetching: a caller whose key is known goes on.
            (Some(keys), true, true) if !unknown_kid => Next::Use(keys.clone()),
            (_, _, true) => Next::Wait(self.done.subscribe()),
            (_, _, false) => {
                state.in_flight = true;
                Next::Fetch(state.keys.clone())
            }
        }
    }

    /// The key set, fetched first when stale or when `kid` is not in it.
    /// A failed fetch keeps the previous keys (with a warning); it is an
    /// error only when there are none.
    pub async fn keys(&self, kid: Option<&str>) -> Result<JwkSet, KeySetError> {
        loop {
            let cached = match self.next(kid) {
                Next::Use(keys) => return Ok(keys),
                Next::Wait(mut done) => {
                    // Subscribed under the lock while the fetch was under
                    // way: its end is a change this sees.
                    let _ = done.changed().await;
                    continue;
                }
                Next::Fetch(cached) => cached,
            };
            let in_flight = InFlight(self);
            let result = self.fetch().await;
            let answer = match result {
                Ok(set) => {
                    let mut state = self.lock();
                    state.keys = Some(set.clone());
                    state.fetched = Some(Instant::now());
                    Ok(set)
                }
                Err(e) => match cached {
                    Some(keys) => {
                        tracing::warn!(target: "authn", "keeping the previous JWKS: {e}");
                        Ok(keys)
                    }
                    None => Err(e),
                },
            };
            drop(in_flight);
            return answer;
        }
    }

    async fn fetch(&self) -> Result<JwkSet, KeySetError> {
        let body = fetch(&self.uri, self.timeout, true).await?;
        serde_json::from_str(&body).map_err(|e| KeySetError::NotJwks {
            uri: self.uri.clone(),
            reason: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    use axum::Router;
    use axum::routing::get;

    use super::*;

    fn jwks(kid: &str) -> String {
        format!(r#"{{"keys":[{{"kty":"RSA","kid":"{kid}","n":"AQAB","e":"AQAB","alg":"RS256"}}]}}"#)
    }

    /// A JWKS server answering `kid` after `delay_ms`; counts requests.
    struct Server {
        uri: String,
        kid: Arc<Mutex<String>>,
        delay_ms: Arc<AtomicU64>,
        hits: Arc<AtomicUsize>,
    }

    async fn server() -> Server {
        let kid = Arc::new(Mutex::new("a".to_string()));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let hits = Arc::new(AtomicUsize::new(0));
        let (k, d, h) = (kid.clone(), delay_ms.clone(), hits.clone());
        let app = Router::new().route(
            "/jwks",
            get(move || {
                let (k, d, h) = (k.clone(), d.clone(), h.clone());
                async move {
                    h.fetch_add(1, Ordering::SeqCst);
                    let body = jwks(&k.lock().unwrap());
                    tokio::time::sleep(Duration::from_millis(d.load(Ordering::SeqCst))).await;
                    body
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Server {
            uri: format!("http://{addr}/jwks"),
            kid,
            delay_ms,
            hits,
        }
    }

    fn kids(set: &JwkSet) -> Vec<String> {
        set.keys
            .iter()
            .filter_map(|k| k.common.key_id.clone())
            .collect()
    }

    async fn wait_hits(srv: &Server, n: usize) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while srv.hits.load(Ordering::SeqCst) < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the JWKS server was asked in time");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reader_with_a_known_key_is_not_held_up_by_a_slow_fetch() {
        let srv = server().await;
        let cache = Arc::new(KeySetCache::new(
            &srv.uri,
            Duration::from_secs(300),
            Duration::ZERO,
            Duration::from_secs(10),
        ));
        assert_eq!(kids(&cache.keys(Some("a")).await.unwrap()), ["a"]);

        // The issuer rotates to key "b"; its server has become slow.
        *srv.kid.lock().unwrap() = "b".into();
        srv.delay_ms.store(1500, Ordering::SeqCst);
        let rotating = tokio::spawn({
            let cache = cache.clone();
            async move { cache.keys(Some("b")).await }
        });
        wait_hits(&srv, 2).await;

        // While that fetch is under way, a token signed with "a" is checked
        // at once against the keys at hand.
        let known = tokio::time::timeout(Duration::from_millis(500), cache.keys(Some("a")))
            .await
            .expect("a caller with a known key does not wait for the fetch")
            .unwrap();
        assert_eq!(kids(&known), ["a"]);

        // A second token with the new key waits for that same fetch.
        let waiting = tokio::time::timeout(Duration::from_secs(5), cache.keys(Some("b")))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(kids(&waiting), ["b"]);
        assert_eq!(kids(&rotating.await.unwrap().unwrap()), ["b"]);
        assert_eq!(srv.hits.load(Ordering::SeqCst), 2, "one fetch for both");
    }

    #[tokio::test]
    async fn a_dropped_fetch_does_not_strand_its_waiters() {
        let srv = server().await;
        srv.delay_ms.store(60_000, Ordering::SeqCst);
        let cache = Arc::new(KeySetCache::new(
            &srv.uri,
            Duration::from_secs(300),
            Duration::ZERO,
            Duration::from_secs(120),
        ));
        let first = tokio::spawn({
            let cache = cache.clone();
            async move { cache.keys(None).await }
        });
        wait_hits(&srv, 1).await;
        let second = tokio::spawn({
            let cache = cache.clone();
            async move { cache.keys(None).await }
        });
        tokio::task::yield_now().await;
        srv.delay_ms.store(0, Ordering::SeqCst);
        // The first caller goes away mid-fetch (its request was cancelled).
        first.abort();
        let keys = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .expect("the waiter fetches for itself")
            .unwrap()
            .unwrap();
        assert_eq!(kids(&keys), ["a"]);
    }

    #[tokio::test]
    async fn a_failed_fetch_keeps_the_keys_it_had() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, jwks("a")).unwrap();
        let cache = KeySetCache::new(
            &format!("file://{}", path.display()),
            Duration::ZERO,
            Duration::ZERO,
            Duration::from_secs(1),
        );
        assert_eq!(kids(&cache.keys(None).await.unwrap()), ["a"]);
        std::fs::write(&path, "not json").unwrap();
        // Stale at once (no refresh interval): fetched again, and kept.
        assert_eq!(kids(&cache.keys(None).await.unwrap()), ["a"]);
        let empty = KeySetCache::new(
            &format!("file://{}", path.display()),
            Duration::ZERO,
            Duration::ZERO,
            Duration::from_secs(1),
        );
        let e = empty.keys(None).await.unwrap_err();
        assert!(matches!(e, KeySetError::NotJwks { .. }), "{e}");
        assert!(e.to_string().contains("not a JSON Web Key Set"), "{e}");
    }
}
