//! Config sources: where objects come from before they reach the
//! [`ConfigStore`](crate::model::ConfigStore): the file source (`--configDir`,
//! Istio's `pilot/pkg/config/kube/file`) and the Kubernetes source (the API
//! server, with `--kubeconfig` or in a cluster). Both can run at once; each
//! writes its own slice of the one store, so neither deletes the other's
//! objects, and the file's object wins when both define the same one.

pub(crate) mod file;
pub mod kube;

pub use file::{DEBOUNCE, DEBOUNCE_MAX, FileSource, SourceError};

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

use self::kube::{KubeSource, kubemesh};
use crate::kube::Synced;
use crate::mesh::Mesh;
use crate::model::revision::InRevision;
use crate::model::store::{ConfigBatch, ConfigStore};

/// What the sources read from istiod's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--configDir`, if set.
    pub config_dir: Option<PathBuf>,
    /// istiod's namespace, where the `istio` ConfigMap is.
    pub namespace: String,
    /// The SPIFFE trust domain in force (the mesh config file's, or the default).
    pub trust_domain: String,
    /// The mesh config istiod starts with: the `--meshConfig` file's, or
    /// Istio's defaults without one.
    pub mesh: Mesh,
    /// The DNS domain of services (`cluster.local`).
    pub domain: String,
    /// Whether the `--meshConfig` file exists; when it does not, istiod on
    /// Kubernetes watches the `istio` ConfigMap instead, as Istio does.
    pub mesh_file_found: bool,
    /// `REVISION` as set (Istio's `PilotArgs.Revision`; empty when unset):
    /// config labelled `istio.io/rev` for another revision is not read.
    pub revision: String,
}

/// What the sources publish: the store they write and what the rest of
/// istiod reads from them.
pub struct Sources {
    /// The store the sources write.
    pub store: ConfigStore,
    /// The store's change batches, subscribed once every source has started.
    pub batches: broadcast::Receiver<ConfigBatch>,
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
    config: Settings,
    kube: Option<::kube::Client>,
    shutdown: watch::Receiver<bool>,
    rejected: prometheus::IntCounterVec,
    elections: &mut crate::leaderelection::Elections,
) -> anyhow::Result<Sources> {
    let store = ConfigStore::new();
    let (synced_tx, synced) = watch::channel(false);
    let (mesh_tx, mesh) = watch::channel(Arc::new(config.mesh));
    let in_revision = InRevision::new(config.revision.clone());
    let tags = kube
        .as_ref()
        .map(|c| self::kube::tag_watcher::start(c.clone(), &config.revision, shutdown.clone()));

    // The file slice is created first: a file's object wins over the API's.
    let source = config
        .config_dir
        .as_ref()
        .map(|dir| FileSource::with_metrics(dir.clone(), store.slice("file"), rejected.clone()));
    if let Some(fs) = &source {
        fs.set_revision(in_revision.clone());
        if let Some(tags) = tags.clone() {
            tokio::spawn(refilter_on_tag_change(
                fs.clone(),
                in_revision.clone(),
                tags,
            ));
        }
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
                let name = crate::model::revision::revisioned_name(
                    crate::mesh::MESH_CONFIGMAP,
                    &config.revision,
                );
                tracing::info!(target: "mesh", "no mesh config file: using ConfigMap {}/{name}", config.namespace);
                mesh_synced = kubemesh::watch_configmap(
                    client.clone(),
                    &config.namespace,
                    &name,
                    &config.trust_domain,
                    mesh_tx,
                    shutdown.clone(),
                );
            }
            // The Gateway API's status, written back as Istio's gateway
            // controller does.
            tokio::spawn(self::kube::status::run(
                client.clone(),
                store.slice(self::kube::SLICE),
                config.domain.clone(),
                elections.gateway_status(),
                shutdown.clone(),
            ));
            // ServiceEntry addresses, written back as Istio's IP
            // auto-allocation controller does.
            tokio::spawn(self::kube::ip_allocate::run(
                client.clone(),
                store.slice(self::kube::SLICE),
                elections.ip_autoallocate(),
                shutdown.clone(),
            ));
            let ks = KubeSource::start(
                client,
                store.slice(self::kube::SLICE),
                mesh.clone(),
                (
                    in_revision.clone(),
                    tags.clone()
                        .unwrap_or_else(|| watch::channel(Default::default()).1),
                ),
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

    let batches = store.subscribe();
    let configz_store = store.clone();
    let domain = config.domain.clone();
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
        // The Gateway API's status (written back on Kubernetes; a file has
        // no status to write, so this is where its conditions show).
        let derived = crate::model::gateway_api::convert::convert(&snapshot, &domain);
        let gateway_api: serde_json::Map<String, Value> = derived
            .status
            .iter()
            .map(|(k, s)| (k.to_string(), json!(s.lines())))
            .collect();
        json!({
            "version": snapshot.version(),
            "gatewayApiStatus": gateway_api,
            // The Gateway API's derived Istio objects, as in Istio's store.
            "derived": derived.documents(),
            "objects": kinds.iter().flat_map(|k| snapshot.objects(*k).map(|o| o.key().to_string()).collect::<Vec<_>>()).collect::<Vec<_>>(),
            "errors": errors,
            "unimplemented": unimplemented,
        })
    });
    Ok(Sources {
        store,
        batches,
        synced,
        configz,
        mesh,
        mesh_synced,
    })
}

/// Reloads the file source with the tags pointing at this revision each
/// time they change, so file config labelled with a tag follows the tag.
async fn refilter_on_tag_change(
    fs: FileSource,
    revision: InRevision,
    mut tags: watch::Receiver<std::collections::BTreeSet<String>>,
) {
    while tags.changed().await.is_ok() {
        fs.set_revision(revision.with_tags(tags.borrow_and_update().clone()));
        let fs = fs.clone();
        match tokio::task::spawn_blocking(move || fs.reload()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(target: "config", "reloading after a tag change: {e}"),
            Err(e) => tracing::warn!(target: "config", "reloading after a tag change: {e}"),
        }
    }
}
