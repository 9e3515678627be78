//! What every part of istiod that talks to the Kubernetes API shares (Istio's
//! `pkg/kube`): the client ([`client`]), one way to run a watcher
//! ([`run_watcher`]) and Istio's `HasSynced` ([`Synced`]). The config
//! source, the CA's namespace controller and the webhooks all build on it;
//! it depends on none of them.

mod client;

use std::fmt::Debug;

use ::kube::api::Api;
use ::kube::runtime::{WatchStreamExt, watcher};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

pub use client::{ClientError, KubeConnection, client};

/// Istio's `HasSynced`: whether a source has completed its first full load.
#[derive(Debug, Clone)]
pub struct Synced {
    tx: watch::Sender<bool>,
}

impl Default for Synced {
    fn default() -> Self {
        Self::new()
    }
}

impl Synced {
    /// Not synced yet.
    pub fn new() -> Self {
        Self {
            tx: watch::channel(false).0,
        }
    }

    /// Marks the first full load as done.
    pub fn mark(&self) {
        self.tx.send_if_modified(|s| !std::mem::replace(s, true));
    }

    /// Whether the first full load is done.
    pub fn has_synced(&self) -> bool {
        *self.tx.borrow()
    }

    /// Waits until the first full load is done.
    pub async fn wait(&self) {
        let mut rx = self.tx.subscribe();
        // The sender lives in `self`, so this cannot fail while we wait.
        let _ = rx.wait_for(|s| *s).await;
    }
}

/// Runs kube-runtime's watcher on `api` until `shutdown`, sending what `map`
/// makes of each event to `tx`. Errors are logged and retried with the
/// watcher's backoff. A watch the API refuses with `410 Gone` (its resource
/// version is compacted away) restarts the watcher, which relists.
pub async fn run_watcher<K, T>(
    what: String,
    api: Api<K>,
    config: watcher::Config,
    tx: &mpsc::Sender<T>,
    mut map: impl FnMut(watcher::Event<K>) -> Option<T>,
    mut shutdown: watch::Receiver<bool>,
) where
    K: ::kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    loop {
        let mut stream = watcher(api.clone(), config.clone())
            .default_backoff()
            .boxed();
        loop {
            let next = tokio::select! {
                next = stream.next() => next,
                _ = shutdown.wait_for(|s| *s) => return,
            };
            match next {
                None => break,
                Some(Ok(event)) => {
                    if let Some(out) = map(event)
                        && tx.send(out).await.is_err()
                    {
                        return;
                    }
                }
                Some(Err(e)) => {
                    let gone = matches!(
                        &e,
                        watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 410
                    );
                    tracing::warn!(target: "kube", "{what}: {e}");
                    if gone {
                        tracing::info!(target: "kube", "{what}: resource version expired; relisting");
                        break;
                    }
                }
            }
        }
    }
}
