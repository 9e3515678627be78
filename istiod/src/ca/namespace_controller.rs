//! Istio's namespace controller: the CA root published as the ConfigMap
//! `istio-ca-root-cert` (key `root-cert.pem`, label `istio.io/config: "true"`)
//! in every namespace istiod uses, which injected Pods mount to trust istiod.
//!
//! As in Istio: namespaces outside mesh config `discoverySelectors`, the
//! Kubernetes system namespaces and terminating namespaces are skipped; a
//! ConfigMap that is deleted or edited is put back; a new root is written
//! everywhere; a namespace that leaves the selection keeps its ConfigMap
//! (another control plane may own it). Namespaces and the ConfigMaps of that
//! name are watched; the wanted state is computed by [`plan`] and each
//! difference written with one create or update. A failed write is retried
//! with backoff.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::watcher;
use tokio::sync::{mpsc, watch};

use crate::kube::{Synced, run_watcher};
use crate::mesh::Mesh;

/// The ConfigMap's name (Istio's `PILOT_CA_CERT_CONFIGMAP` default).
pub const CA_ROOT_CONFIGMAP: &str = "istio-ca-root-cert";
/// The key holding the root bundle.
pub const CA_ROOT_KEY: &str = "root-cert.pem";
/// The label Istio puts on the ConfigMap.
pub const CONFIG_LABEL: (&str, &str) = ("istio.io/config", "true");
/// Namespaces Istio never writes to (`inject.IgnoredNamespaces`).
pub const IGNORED_NAMESPACES: [&str; 4] = [
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "local-path-storage",
];

/// A namespace as the controller needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NamespaceInfo {
    /// Its labels (for `discoverySelectors`).
    pub labels: BTreeMap<String, String>,
    /// Whether it is being deleted.
    pub terminating: bool,
}

/// One write the controller has to make.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create the ConfigMap in this namespace.
    Create(String),
    /// Replace this ConfigMap (its root is missing or stale).
    Update(Box<ConfigMap>),
}

impl Action {
    fn namespace(&self) -> &str {
        match self {
            Action::Create(ns) => ns,
            Action::Update(cm) => cm.metadata.namespace.as_deref().unwrap_or_default(),
        }
    }
}

/// What has to be written so every namespace istiod uses holds `root`.
pub fn plan(
    namespaces: &BTreeMap<String, NamespaceInfo>,
    configmaps: &BTreeMap<String, ConfigMap>,
    mesh: &Mesh,
    root: &str,
) -> Vec<Action> {
    namespaces
        .iter()
        .filter(|(name, ns)| {
            !ns.terminating
                && !IGNORED_NAMESPACES.contains(&name.as_str())
                && mesh.selects_namespace(&ns.labels)
        })
        .filter_map(|(name, _)| match configmaps.get(name) {
            None => Some(Action::Create(name.clone())),
            Some(cm) => {
                let current = cm.data.as_ref().and_then(|d| d.get(CA_ROOT_KEY));
                (current.map(String::as_str) != Some(root)).then(|| {
                    let mut cm = cm.clone();
                    cm.data
                        .get_or_insert_default()
                        .insert(CA_ROOT_KEY.to_string(), root.to_string());
                    Action::Update(Box::new(cm))
                })
            }
        })
        .collect()
}

/// The ConfigMap as the controller creates it.
pub fn configmap(namespace: &str, root: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(CA_ROOT_CONFIGMAP.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some([(CONFIG_LABEL.0.to_string(), CONFIG_LABEL.1.to_string())].into()),
            ..Default::default()
        },
        data: Some([(CA_ROOT_KEY.to_string(), root.to_string())].into()),
        ..Default::default()
    }
}

enum Event {
    Namespaces(watcher::Event<Namespace>),
    ConfigMaps(watcher::Event<ConfigMap>),
}

/// The controller's caches of the two watches.
#[derive(Default)]
struct Caches {
    namespaces: BTreeMap<String, NamespaceInfo>,
    namespaces_listing: Option<BTreeMap<String, NamespaceInfo>>,
    namespaces_synced: bool,
    configmaps: BTreeMap<String, ConfigMap>,
    configmaps_listing: Option<BTreeMap<String, ConfigMap>>,
    configmaps_synced: bool,
}

fn namespace_info(ns: &Namespace) -> (String, NamespaceInfo) {
    (
        ns.metadata.name.clone().unwrap_or_default(),
        NamespaceInfo {
            labels: ns.metadata.labels.clone().unwrap_or_default(),
            terminating: ns
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|p| p == "Terminating"),
        },
    )
}

impl Caches {
    fn apply(&mut self, event: Event) {
        match event {
            Event::Namespaces(e) => match e {
                watcher::Event::Init => self.namespaces_listing = Some(BTreeMap::new()),
                watcher::Event::InitApply(ns) => {
                    let (name, info) = namespace_info(&ns);
                    self.namespaces_listing
                        .get_or_insert_default()
                        .insert(name, info);
                }
                watcher::Event::InitDone => {
                    self.namespaces = self.namespaces_listing.take().unwrap_or_default();
                    self.namespaces_synced = true;
                }
                watcher::Event::Apply(ns) => {
                    let (name, info) = namespace_info(&ns);
                    self.namespaces.insert(name, info);
                }
                watcher::Event::Delete(ns) => {
                    self.namespaces
                        .remove(ns.metadata.name.as_deref().unwrap_or_default());
                }
            },
            Event::ConfigMaps(e) => {
                let ours = |cm: &ConfigMap| cm.metadata.name.as_deref() == Some(CA_ROOT_CONFIGMAP);
                let ns_of = |cm: &ConfigMap| cm.metadata.namespace.clone().unwrap_or_default();
                match e {
                    watcher::Event::Init => self.configmaps_listing = Some(BTreeMap::new()),
                    watcher::Event::InitApply(cm) if ours(&cm) => {
                        self.configmaps_listing
                            .get_or_insert_default()
                            .insert(ns_of(&cm), cm);
                    }
                    watcher::Event::InitDone => {
                        self.configmaps = self.configmaps_listing.take().unwrap_or_default();
                        self.configmaps_synced = true;
                    }
                    watcher::Event::Apply(cm) if ours(&cm) => {
                        self.configmaps.insert(ns_of(&cm), cm);
                    }
                    watcher::Event::Delete(cm) if ours(&cm) => {
                        self.configmaps.remove(&ns_of(&cm));
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Runs the controller until `shutdown`: watches Namespaces and the
/// `istio-ca-root-cert` ConfigMaps, and writes the root held by `root` once
/// `mesh_synced` says `mesh` holds the `discoverySelectors` to apply.
pub async fn run(
    client: kube::Client,
    mut root: watch::Receiver<String>,
    mut mesh: watch::Receiver<Arc<Mesh>>,
    mesh_synced: Synced,
    shutdown: watch::Receiver<bool>,
) {
    let (tx, mut rx) = mpsc::channel(256);
    {
        let (tx, shutdown) = (tx.clone(), shutdown.clone());
        let api: Api<Namespace> = Api::all(client.clone());
        tokio::spawn(async move {
            run_watcher(
                "Namespaces (namespace controller)".into(),
                api,
                watcher::Config::default(),
                &tx,
                |e| Some(Event::Namespaces(e)),
                shutdown,
            )
            .await
        });
    }
    {
        let (tx, shutdown) = (tx.clone(), shutdown.clone());
        let api: Api<ConfigMap> = Api::all(client.clone());
        let config =
            watcher::Config::default().fields(&format!("metadata.name={CA_ROOT_CONFIGMAP}"));
        tokio::spawn(async move {
            run_watcher(
                format!("ConfigMaps {CA_ROOT_CONFIGMAP}"),
                api,
                config,
                &tx,
                |e| Some(Event::ConfigMaps(e)),
                shutdown,
            )
            .await
        });
    }
    drop(tx);
    let mut shutdown = shutdown;
    // Before the mesh config is known, any namespace could be the wrong one.
    tokio::select! {
        _ = mesh_synced.wait() => {}
        _ = shutdown.wait_for(|s| *s) => return,
    }
    let mut caches = Caches::default();
    let mut retry: Option<tokio::time::Instant> = None;
    let mut backoff = Duration::from_millis(500);
    let (mut root_open, mut mesh_open) = (true, true);
    loop {
        let retry_at =
            retry.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            event = rx.recv() => match event {
                Some(e) => caches.apply(e),
                None => return,
            },
            // Mark the new value seen; it is read below.
            r = root.changed(), if root_open => match r {
                Ok(()) => { root.borrow_and_update(); }
                Err(_) => { root_open = false; continue }
            },
            m = mesh.changed(), if mesh_open => match m {
                Ok(()) => { mesh.borrow_and_update(); }
                Err(_) => { mesh_open = false; continue }
            },
            _ = tokio::time::sleep_until(retry_at), if retry.is_some() => retry = None,
            _ = shutdown.wait_for(|s| *s) => return,
        }
        if !(caches.namespaces_synced && caches.configmaps_synced) {
            continue;
        }
        let root_pem = root.borrow().clone();
        let mesh_now = mesh.borrow().clone();
        let actions = plan(&caches.namespaces, &caches.configmaps, &mesh_now, &root_pem);
        let mut failed = false;
        for action in actions {
            if let Err(e) = write(&client, &action, &root_pem).await {
                tracing::warn!(target: "ca", "{CA_ROOT_CONFIGMAP} in namespace {}: {e}; retrying in {backoff:?}", action.namespace());
                failed = true;
            }
        }
        if failed {
            retry = Some(tokio::time::Instant::now() + backoff);
            backoff = (backoff * 2).min(Duration::from_secs(30));
        } else {
            backoff = Duration::from_millis(500);
        }
    }
}

async fn write(client: &kube::Client, action: &Action, root: &str) -> Result<(), kube::Error> {
    let ns = action.namespace();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    match action {
        Action::Create(_) => match api
            .create(&PostParams::default(), &configmap(ns, root))
            .await
        {
            Ok(_) => {
                tracing::info!(target: "ca", "created {CA_ROOT_CONFIGMAP} in namespace {ns}");
                Ok(())
            }
            // Created meanwhile: its watch event brings it here.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e),
        },
        Action::Update(cm) => {
            api.replace(CA_ROOT_CONFIGMAP, &PostParams::default(), &**cm)
                .await?;
            tracing::info!(target: "ca", "updated the root in {CA_ROOT_CONFIGMAP} in namespace {ns}");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Labels<'a> = &'a [(&'a str, &'a str)];

    fn namespaces(list: &[(&str, Labels<'_>, bool)]) -> BTreeMap<String, NamespaceInfo> {
        list.iter()
            .map(|(name, labels, terminating)| {
                (
                    name.to_string(),
                    NamespaceInfo {
                        labels: labels
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                        terminating: *terminating,
                    },
                )
            })
            .collect()
    }

    fn names(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .map(|a| match a {
                Action::Create(ns) => format!("create {ns}"),
                Action::Update(cm) => format!(
                    "update {}",
                    cm.metadata.namespace.as_deref().unwrap_or_default()
                ),
            })
            .collect()
    }

    #[test]
    fn every_used_namespace_gets_the_root() {
        let ns = namespaces(&[
            ("demo", &[], false),
            ("kube-system", &[], false),
            ("leaving", &[], true),
            ("istio-system", &[], false),
        ]);
        let mut cms = BTreeMap::new();
        cms.insert(
            "istio-system".to_string(),
            configmap("istio-system", "ROOT"),
        );
        let actions = plan(&ns, &cms, &Mesh::default(), "ROOT");
        assert_eq!(names(&actions), vec!["create demo"]);

        // An edited or stale ConfigMap is updated, keeping its other data.
        let mut edited = configmap("istio-system", "OLD");
        edited
            .data
            .as_mut()
            .unwrap()
            .insert("extra".into(), "kept".into());
        cms.insert("istio-system".into(), edited);
        cms.insert("demo".into(), configmap("demo", "ROOT"));
        let actions = plan(&ns, &cms, &Mesh::default(), "ROOT");
        assert_eq!(names(&actions), vec!["update istio-system"]);
        let Action::Update(cm) = &actions[0] else {
            panic!()
        };
        let data = cm.data.as_ref().unwrap();
        assert_eq!(data[CA_ROOT_KEY], "ROOT");
        assert_eq!(data["extra"], "kept");
        // A new root: every ConfigMap.
        assert_eq!(
            names(&plan(&ns, &cms, &Mesh::default(), "NEW")),
            vec!["update demo", "update istio-system"]
        );
    }

    #[test]
    fn discovery_selectors_choose_the_namespaces() {
        let mesh = Mesh::parse("discoverySelectors: [{matchLabels: {mesh: \"on\"}}]").unwrap();
        let ns = namespaces(&[("in", &[("mesh", "on")], false), ("out", &[], false)]);
        let actions = plan(&ns, &BTreeMap::new(), &mesh, "ROOT");
        assert_eq!(names(&actions), vec!["create in"]);
        let cm = configmap("in", "ROOT");
        assert_eq!(cm.metadata.labels.unwrap()["istio.io/config"], "true");
    }
}
