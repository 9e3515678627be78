//! Config sources feeding the push pipeline, and the push context that
//! generates each proxy's configuration from them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use crate::config::Config;
use crate::mesh::Mesh;
use crate::model::service::{RegistryOptions, ServiceRegistry};
use crate::model::store::ConfigStore;
use crate::push::Change;
use crate::source::Synced;
use crate::source::file::FileSource;
use crate::source::kube::{KubeSource, kubemesh};
use crate::xds::PushContext;
use crate::xds::context::IstioContext;

/// What the push pipeline reads from the sources.
pub struct Sources {
    /// Builds a new push context from the current state.
    pub builder: Box<dyn FnMut(String) -> Arc<dyn PushContext> + Send>,
    /// Changes as they happen.
    pub changes: mpsc::Receiver<Change>,
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

/// Endpoints per host, to tell which hosts an endpoint-only change touched.
fn endpoint_index(registry: &ServiceRegistry) -> BTreeMap<String, String> {
    registry
        .services()
        .iter()
        .map(|s| (s.hostname.clone(), format!("{:?}", s.endpoints)))
        .collect()
}

/// Starts the configured sources: the `--configDir` directory (watched),
/// the Kubernetes API when istiod has a client, both, or nothing (an empty
/// mesh). On Kubernetes without a `--meshConfig` file, the mesh config is
/// the `istio` ConfigMap's, applied live.
pub async fn start_sources(
    config: &Config,
    kube: Option<kube::Client>,
    shutdown: watch::Receiver<bool>,
    rejected: prometheus::IntCounterVec,
) -> anyhow::Result<Sources> {
    let store = ConfigStore::new();
    let options = RegistryOptions {
        domain: config.domain.clone(),
        trust_domain: config.trust_domain.clone(),
    };
    let (tx, changes) = mpsc::channel(1024);
    let (synced_tx, synced) = watch::channel(false);
    let mut batches = store.subscribe();
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
                store.slice(crate::source::kube::SLICE),
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
                let change = Change {
                    key: "MeshConfig".into(),
                    endpoint_only: false,
                    hosts: BTreeSet::new(),
                };
                if tx.send(change).await.is_err() {
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
            let change = Change {
                key: "JWKS".into(),
                endpoint_only: false,
                hosts: BTreeSet::new(),
            };
            if let Err(e) = tx.try_send(change) {
                tracing::warn!(target: "authn", "cannot queue the push for changed JWT public keys: {e}");
            }
        };
        tokio::spawn(jwks.clone().run(refresh, on_change, shutdown.clone()));
    }

    // Store batches become push changes; endpoint-only batches name the
    // hosts whose endpoints changed, for incremental EDS.
    {
        let options = options.clone();
        let store = store.clone();
        tokio::spawn(async move {
            let mut previous = endpoint_index(&ServiceRegistry::build(&store.snapshot(), &options));
            loop {
                let batch = match batches.recv().await {
                    Ok(b) => b,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return,
                };
                let current = endpoint_index(&ServiceRegistry::build(&batch.snapshot, &options));
                let hosts: BTreeSet<String> = current
                    .iter()
                    .filter(|(h, e)| previous.get(*h) != Some(*e))
                    .map(|(h, _)| h.clone())
                    .chain(
                        previous
                            .keys()
                            .filter(|h| !current.contains_key(*h))
                            .cloned(),
                    )
                    .collect();
                previous = current;
                let endpoint_only = batch.endpoints_only();
                for event in batch.events.iter() {
                    tracing::info!(target: "config", "{event}");
                }
                let key = batch
                    .events
                    .first()
                    .map(|e| e.key.to_string())
                    .unwrap_or_default();
                if tx
                    .send(Change {
                        key,
                        endpoint_only,
                        hosts,
                    })
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }

    let builder_store = store.clone();
    let builder_mesh = mesh.clone();
    let builder: Box<dyn FnMut(String) -> Arc<dyn PushContext> + Send> = Box::new(move |version| {
        let mesh = builder_mesh.borrow().config.clone();
        Arc::new(
            IstioContext::new(version, &builder_store.snapshot(), &options)
                .with_mesh(mesh)
                .with_jwks(jwks.clone()),
        ) as Arc<dyn PushContext>
    });
    let configz: Arc<dyn Fn() -> Value + Send + Sync> = Arc::new(move || {
        let snapshot = store.snapshot();
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
    Ok(Sources {
        builder,
        changes,
        synced,
        configz,
        mesh,
        mesh_synced,
    })
}
