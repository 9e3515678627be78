//! Which revision is the default, for prioritized elections: the
//! `istio.io/rev` label of the MutatingWebhookConfiguration
//! `istio-revision-tag-default` (`istio-revision-tag-default-<namespace>`
//! when istiod's namespace is not `istio-system`), as Istio's
//! `revisions.DefaultWatcher` reads it. Empty while there is none.

use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Api;
use kube::runtime::watcher;
use tokio::sync::{mpsc, watch};

use crate::inject::policy::REVISION_LABEL;

/// The default tag's webhook name (Istio's `defaultTagWebhookName`).
pub const DEFAULT_TAG_WEBHOOK: &str = "istio-revision-tag-default";

/// The default revision, as last seen.
#[derive(Clone, Default)]
pub struct DefaultRevision {
    current: Option<Arc<watch::Receiver<String>>>,
}

/// The webhook name Istio watches for `namespace`.
pub fn webhook_name(namespace: &str) -> String {
    if namespace.is_empty() || namespace == "istio-system" {
        DEFAULT_TAG_WEBHOOK.to_string()
    } else {
        format!("{DEFAULT_TAG_WEBHOOK}-{namespace}")
    }
}

impl DefaultRevision {
    /// A fixed value (tests, and istiod without Kubernetes).
    pub fn fixed(revision: &str) -> Self {
        let (tx, rx) = watch::channel(revision.to_string());
        drop(tx);
        Self {
            current: Some(Arc::new(rx)),
        }
    }

    /// The default revision now (empty when unknown).
    pub fn get(&self) -> String {
        self.current
            .as_ref()
            .map(|rx| rx.borrow().clone())
            .unwrap_or_default()
    }

    /// Watches the default tag's webhook until `shutdown`.
    pub fn watch(client: kube::Client, namespace: &str, shutdown: watch::Receiver<bool>) -> Self {
        let name = webhook_name(namespace);
        let (value_tx, value_rx) = watch::channel(String::new());
        let (tx, mut rx) = mpsc::channel(16);
        let api: Api<MutatingWebhookConfiguration> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        tokio::spawn(async move {
            crate::kube::run_watcher(
                format!("MutatingWebhookConfiguration {name}"),
                api,
                config,
                &tx,
                |e| match e {
                    watcher::Event::Apply(w) | watcher::Event::InitApply(w) => Some(
                        w.metadata
                            .labels
                            .and_then(|l| l.get(REVISION_LABEL).cloned())
                            .unwrap_or_default(),
                    ),
                    watcher::Event::Delete(_) => Some(String::new()),
                    _ => None,
                },
                shutdown,
            )
            .await
        });
        tokio::spawn(async move {
            while let Some(rev) = rx.recv().await {
                value_tx.send_if_modified(|v| {
                    let changed = *v != rev;
                    if changed {
                        tracing::info!(target: "leader", "default revision: {rev:?}");
                        *v = rev;
                    }
                    changed
                });
            }
        });
        Self {
            current: Some(Arc::new(value_rx)),
        }
    }
}
