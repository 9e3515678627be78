//! Istio's `kubemesh`: the mesh config from the `mesh` key of the `istio`
//! ConfigMap in istiod's namespace, watched and published live. Used when
//! the `--meshConfig` file does not exist, as Istio does.
//!
//! A ConfigMap whose mesh config does not parse is reported and ignored (the
//! last good mesh config stays); a missing ConfigMap or key is Istio's
//! defaults.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::{mpsc, watch};

use crate::kube::{Synced, run_watcher};
use crate::mesh::{MESH_CONFIGMAP_KEY, Mesh};

/// What one version of the ConfigMap means.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    /// Apply this mesh config (boxed: it is large, the error small).
    Mesh(Box<Mesh>),
    /// Unusable: keep the last good one.
    Invalid(Vec<String>),
}

/// Reads the ConfigMap (`None`: there is none).
pub fn read(configmap: Option<&ConfigMap>) -> Reading {
    let Some(cm) = configmap else {
        return Reading::Mesh(Box::default());
    };
    match cm.data.as_ref().and_then(|d| d.get(MESH_CONFIGMAP_KEY)) {
        None => Reading::Mesh(Box::default()),
        Some(text) => match Mesh::parse(text) {
            Ok(mesh) => Reading::Mesh(Box::new(mesh)),
            Err(errors) => Reading::Invalid(errors.0),
        },
    }
}

/// Watches the ConfigMap `name` in `namespace` and publishes each good mesh config
/// on `mesh`. `trust_domain` is the one istiod runs with: a different one in
/// the ConfigMap needs a restart and is reported. The returned [`Synced`]
/// marks the first complete read.
pub fn watch_configmap(
    client: kube::Client,
    namespace: &str,
    name: &str,
    trust_domain: &str,
    mesh: watch::Sender<Arc<Mesh>>,
    shutdown: watch::Receiver<bool>,
) -> Synced {
    let synced = Synced::new();
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    // Each message is one reading: the ConfigMap, or `None` when there is none.
    let (tx, mut rx) = mpsc::channel::<Option<ConfigMap>>(16);
    let what = format!("ConfigMap {namespace}/{name}");
    let name = name.to_string();
    tokio::spawn({
        let what = what.clone();
        async move {
            // The list in progress: the ConfigMap, if it is in it.
            let mut listed: Option<ConfigMap> = None;
            run_watcher(
                what,
                api,
                config,
                &tx,
                |event| match event {
                    watcher::Event::Init => {
                        listed = None;
                        None
                    }
                    watcher::Event::InitApply(cm) => {
                        if cm.metadata.name.as_deref() == Some(name.as_str()) {
                            listed = Some(cm);
                        }
                        None
                    }
                    watcher::Event::InitDone => Some(listed.take()),
                    watcher::Event::Apply(cm) => {
                        (cm.metadata.name.as_deref() == Some(name.as_str())).then_some(Some(cm))
                    }
                    watcher::Event::Delete(cm) => {
                        (cm.metadata.name.as_deref() == Some(name.as_str())).then_some(None)
                    }
                },
                shutdown,
            )
            .await;
        }
    });
    let trust_domain = trust_domain.to_string();
    let marker = synced.clone();
    tokio::spawn(async move {
        while let Some(configmap) = rx.recv().await {
            match read(configmap.as_ref()) {
                Reading::Mesh(m) => {
                    if let Some(td) = m.trust_domain.as_deref()
                        && td != trust_domain
                    {
                        tracing::warn!(target: "mesh", "{what}: trustDomain {td:?} differs from the running {trust_domain:?}; a trust domain change needs a restart of istiod");
                    }
                    let changed = mesh.send_if_modified(|current| {
                        if **current == *m {
                            return false;
                        }
                        *current = Arc::new((*m).clone());
                        true
                    });
                    if changed {
                        tracing::info!(target: "mesh", "{what}: applied mesh config {m:?}");
                    }
                }
                Reading::Invalid(errors) => {
                    for e in errors {
                        tracing::error!(target: "mesh", "{what}: key {MESH_CONFIGMAP_KEY}: {e}; the last good mesh config stays");
                    }
                }
            }
            marker.mark();
        }
    });
    synced
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::istio::OutboundMode;

    fn cm(mesh: Option<&str>) -> ConfigMap {
        ConfigMap {
            data: mesh.map(|m| [(MESH_CONFIGMAP_KEY.to_string(), m.to_string())].into()),
            ..Default::default()
        }
    }

    #[test]
    fn reads_the_mesh_key() {
        let Reading::Mesh(m) = read(Some(&cm(Some(
            "outboundTrafficPolicy: {mode: REGISTRY_ONLY}\n",
        )))) else {
            panic!()
        };
        assert_eq!(m.config.outbound_traffic_policy, OutboundMode::RegistryOnly);
        assert_eq!(read(None), Reading::Mesh(Box::default()));
        assert_eq!(read(Some(&cm(None))), Reading::Mesh(Box::default()));
        let Reading::Invalid(errors) = read(Some(&cm(Some("outboundTrafficPolicy: {mode: X}"))))
        else {
            panic!()
        };
        assert!(errors[0].contains("\"X\" is not a mode"));
    }
}
