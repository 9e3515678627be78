//! Config sources: where objects come from before they reach the
//! [`ConfigStore`](crate::model::ConfigStore): the file source (`--configDir`,
//! Istio's `pilot/pkg/config/kube/file`) and the Kubernetes source (the API
//! server, with `--kubeconfig` or in a cluster). Both can run at once; each
//! writes its own slice of the one store, so neither deletes the other's
//! objects, and the file's object wins when both define the same one.

pub mod file;
pub mod kube;

pub use file::{DEBOUNCE, DEBOUNCE_MAX, FileSource, SourceError};

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use self::kube::{KubeSource, kubemesh};
use crate::config::Config;
use crate::kube::Synced;
use crate::mesh::Mesh;
use crate::model::service::RegistryOptions;
use crate::model::store::ConfigStore;
use crate::push::Trigger;
use crate::xds::cache::XdsCache;

/// What the push pipeline reads from the sources.
pub struct Sources {
    /// Builds push contexts from the store the sources write.
    pub builder: crate::push::Builder,
    /// The store's change batches, and the mesh config and JWKS triggers.
    pub inputs: crate::push::Inputs,
    /// True once every source has loaded.
    pub synced: watch::Receiver<bool>,
    /// The current configuration and rejected objects as JSON (`/debug/configz`).
    pub configz: Arc<dyn Fn() -> Value + Send + Sync>,
    /// The mesh config in force (the file's, or the `istio` ConfigMap's).
    pub mesh: watch::Receiver<Arc<Mesh>>,
    /// Marked once `mesh` holds the mesh config istiod runs with (at once
    /// from a file; after the first read of the `istio` ConfigMap).
    pub mesh_synced: Synced,
}

/// Starts the configured sources: the `--configDir` directory (watched),
/// the Kubernetes API when istiod has a client, both, or nothing (an empty
/// mesh). On Kubernetes without a `--meshConfig` file, the mesh config is
/// the `istio` ConfigMap's, applied live.
pub async fn start(
    config: &Config,
    kube: Option<::kube::Client>,
    shutdown: watch::Receiver<bool>,
    rejected: prometheus::IntCounterVec,
    cache: Arc<XdsCache>,
) -> anyhow::Result<Sources> {
    let store = ConfigStore::new();
    let options = RegistryOptions {
        domain: config.domain.clone(),
        trust_domain: config.trust_domain.clone(),
    };
    let (tx, triggers) = mpsc::channel(16);
    let (synced_tx, synced) = watch::channel(false);
    let (mesh_tx, mesh) = watch::channel(Arc::new(Mesh {
        trust_domain: Some(config.trust_domain.clone()),
        config: config.mesh.clone(),
        discovery_selectors: config.discovery_selectors.clone(),
        injection: config.mesh_injection.clone(),
    }));

    // The file slice is created first: a file's object wins over the API's.
    let source = config
        .config_dir
        .as_ref()
        .map(|dir| FileSource::with_metrics(dir.clone(), store.slice("file"), rejected.clone()));
    if let Some(fs) = &source {
        let fs = fs.clone();
        // The first full read, before anything is served.
        tokio::task::spawn_blocking(move || fs.reload()).await??;
        let fs2 = source.clone();
        if let Some(fs2) = fs2 {
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                if let Err(e) = fs2.watch(shutdown).await {
                    tracing::error!(target: "config", "watching the config directory stopped: {e}");
                }
            });
        }
        for e in source.as_ref().map(|s| s.errors()).unwrap_or_default() {
            tracing::warn!(target: "validation", "{e}");
        }
    }

    let mut mesh_synced = Synced::new();
    let kube_source = match kube {
        None => {
            mesh_synced.mark();
            let _ = synced_tx.send(true);
            None
        }
        Some(client) => {
            if config.mesh_file_found {
                mesh_synced.mark();
            } else {
                tracing::info!(target: "mesh", "no mesh config file: using ConfigMap {}/{}", config.namespace, crate::mesh::MESH_CONFIGMAP);
                mesh_synced = kubemesh::watch_configmap(
                    client.clone(),
                    &config.namespace,
                    &config.trust_domain,
                    mesh_tx,
                    shutdown.clone(),
                );
            }
            let ks = KubeSource::start(
                client,
                store.slice(self::kube::SLICE),
                mesh.clone(),
                shutdown.clone(),
            );
            let (waiting, mesh_waiting) = (ks.clone(), mesh_synced.clone());
            tokio::spawn(async move {
                mesh_waiting.wait().await;
                waiting.wait_synced().await;
                let _ = synced_tx.send(true);
            });
            Some(ks)
        }
    };

    // A changed mesh config changes what every proxy gets: a full push.
    {
        let mut mesh = mesh.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut applied = mesh.borrow_and_update().config.clone();
            while mesh.changed().await.is_ok() {
                let current = mesh.borrow_and_update().config.clone();
                if current == applied {
                    continue;
                }
                applied = current;
                if tx.send(Trigger::Mesh).await.is_err() {
                    return;
                }
            }
        });
    }

    // RequestAuthentication's `jwksUri` keys, fetched in the background; a
    // change of keys is a full push (Istio's `JwksResolver.PushFunc`).
    let jwks = Arc::new(crate::jwks::JwksResolver::new());
    {
        let refresh = crate::jwks::resolver::refresh_interval(&common::env::ProcessEnv)?;
        let tx = tx.clone();
        let on_change = move || {
            if let Err(e) = tx.try_send(Trigger::Jwks) {
                tracing::warn!(target: "authn", "cannot queue the push for changed JWT public keys: {e}");
            }
        };
        tokio::spawn(jwks.clone().run(refresh, on_change, shutdown.clone()));
    }

    let batches = store.subscribe();
    let configz_store = store.clone();
    let configz: Arc<dyn Fn() -> Value + Send + Sync> = Arc::new(move || {
        let snapshot = configz_store.snapshot();
        let mut errors: Vec<String> = source
            .as_ref()
            .map(|s| s.errors().iter().map(ToString::to_string).collect())
            .unwrap_or_default();
        errors.extend(kube_source.iter().flat_map(KubeSource::errors));
        let kinds = crate::model::meta::Kind::ALL;
        // Istio configuration of kinds this istiod does not implement: kept
        // out of the store, so listed here rather than lost from sight.
        let unimplemented: Vec<Value> = source
            .as_ref()
            .map(FileSource::unimplemented)
            .unwrap_or_default()
            .into_iter()
            .map(|(file, k)| json!({"file": file, "apiVersion": k.api_version, "kind": k.kind}))
            .collect();
        json!({
            "version": snapshot.version(),
            "objects": kinds.iter().flat_map(|k| snapshot.objects(*k).map(|o| o.key().to_string()).collect::<Vec<_>>()).collect::<Vec<_>>(),
            "errors": errors,
            "unimplemented": unimplemented,
        })
    });
    let builder = crate::push::Builder::new(store, options, mesh.clone(), jwks, cache);
    Ok(Sources {
        builder,
        inputs: crate::push::Inputs { batches, triggers },
        synced,
        configz,
        mesh,
        mesh_synced,
    })
}
