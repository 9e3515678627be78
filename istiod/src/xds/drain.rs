//! When istiod ends an xDS stream itself, so its proxy reconnects (to
//! another replica, when there is one):
//!
//! - at shutdown: once the servers stopped accepting connections and sent
//!   GOAWAY on the open ones, after a short delay every stream is closed
//!   (`UNAVAILABLE`) and new ones are refused;
//! - at the maximum connection age (`--keepaliveMaxServerConnectionAge`,
//!   Istio's chart sets 30m): the connection gets a GOAWAY at that age (the
//!   gRPC server's `max_connection_age`) and, as grpc-go closes the
//!   connection `MaxServerConnectionAgeGrace` (10 s) later (the server's
//!   `max_connection_age_grace`), the stream is closed then too. grpc-go
//!   spreads ages by ±10 %, so the stream's own limit is spread that way
//!   (the connection's is not), and whichever comes first ends it.
//!
//! At shutdown the push pipeline stops with the rest of istiod; the open
//! streams stay until the close above (their proxies meanwhile got the
//! GOAWAY), then end with `UNAVAILABLE`.

use std::time::Duration;

use tokio::sync::watch;

/// grpc-go's `MaxConnectionAgeGrace` as Istio sets it
/// (`keepalive.DefaultOption`).
pub const MAX_CONNECTION_AGE_GRACE: Duration = Duration::from_secs(10);

/// How long after the servers stopped accepting the open streams are
/// closed: long enough for the GOAWAY to reach the proxies, so they dial
/// anew rather than reuse the closing connection.
pub const CLOSE_DELAY: Duration = Duration::from_secs(1);

/// How streams end; the default never ends them.
#[derive(Clone, Default)]
pub struct Drain {
    closing: Option<watch::Receiver<bool>>,
    max_age: Option<Duration>,
}

impl Drain {
    /// Streams close when `closing` becomes true, or `max_age` (+ grace)
    /// after they opened.
    pub fn new(closing: watch::Receiver<bool>, max_age: Option<Duration>) -> Self {
        Self {
            closing: Some(closing),
            max_age,
        }
    }

    /// Whether istiod closes its streams at shutdown (else a stream ends
    /// when the push pipeline stops).
    pub fn drains(&self) -> bool {
        self.closing.is_some()
    }

    /// Whether istiod is closing its streams (new ones are refused).
    pub fn closing(&self) -> bool {
        self.closing.as_ref().is_some_and(|rx| *rx.borrow())
    }

    /// Resolves when a stream opened now must end, saying why.
    pub async fn stream_ended(self) -> &'static str {
        let age = async {
            match self.max_age {
                Some(age) => {
                    let spread = 0.9 + rand::random::<f64>() * 0.2;
                    tokio::time::sleep(age.mul_f64(spread) + MAX_CONNECTION_AGE_GRACE).await
                }
                None => std::future::pending().await,
            }
        };
        let close = async {
            match self.closing {
                Some(mut rx) => {
                    if rx.wait_for(|c| *c).await.is_err() {
                        std::future::pending::<()>().await
                    }
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = age => "the maximum connection age was reached",
            _ = close => "istiod is shutting down",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn streams_end_at_shutdown() {
        let (tx, rx) = watch::channel(false);
        let drain = Drain::new(rx, None);
        assert!(!drain.closing());
        let ended = tokio::spawn(drain.clone().stream_ended());
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!ended.is_finished());
        tx.send(true).unwrap();
        assert_eq!(ended.await.unwrap(), "istiod is shutting down");
        assert!(drain.closing());
    }

    #[tokio::test(start_paused = true)]
    async fn streams_end_after_the_maximum_age_and_grace() {
        let (_tx, rx) = watch::channel(false);
        let age = Duration::from_secs(100);
        let start = tokio::time::Instant::now();
        let why = Drain::new(rx, Some(age)).stream_ended().await;
        assert_eq!(why, "the maximum connection age was reached");
        let took = start.elapsed();
        assert!(
            took >= Duration::from_secs(90) + MAX_CONNECTION_AGE_GRACE,
            "{took:?}"
        );
        assert!(
            took <= Duration::from_secs(110) + MAX_CONNECTION_AGE_GRACE,
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_default_never_ends_a_stream() {
        let ended = tokio::spawn(Drain::default().stream_ended());
        tokio::time::sleep(Duration::from_secs(86_400)).await;
        assert!(!ended.is_finished());
    }
}
