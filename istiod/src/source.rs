//! Config sources: where objects come from before they reach the
//! [`ConfigStore`](crate::model::ConfigStore): the file source (`--configDir`,
//! Istio's `pilot/pkg/config/kube/file`) and the Kubernetes source (the API
//! server, with `--kubeconfig` or in a cluster). Both can run at once; each
//! writes its own slice of the one store, so neither deletes the other's
//! objects, and the file's object wins when both define the same one.

pub mod file;
pub mod kube;

pub use file::{DEBOUNCE, DEBOUNCE_MAX, FileSource, SourceError};

use tokio::sync::watch;

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
