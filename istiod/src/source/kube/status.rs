//! Status written back for the Gateway API, as Istio's gateway controller
//! does through its status manager (`pilot/pkg/status`): whenever the
//! store changes, the Gateway API objects are translated again
//! ([`convert`]), and every GatewayClass, Gateway and HTTPRoute of the
//! Kubernetes source whose status differs from what was last written gets
//! it through the `status` subresource (a merge patch).
//!
//! An HTTPRoute's `status.parents` keeps the entries of other controllers
//! as they were when istiod first wrote the route's status. Only the
//! Kubernetes source's own objects get a status (a file's objects have none
//! to write: `/debug/configz` shows theirs).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::model::gateway_api::CONTROLLER_NAME;
use crate::model::gateway_api::conditions::ObjectStatus;
use crate::model::gateway_api::convert::convert;
use crate::model::{ConfigStore, ObjectKey};

/// How long changes gather before statuses are computed again.
const SETTLE: Duration = Duration::from_millis(100);

/// The field manager of istiod's status writes.
const FIELD_MANAGER: &str = "istiod";

/// Writes the Gateway API status of `store`'s (the Kubernetes slice's)
/// objects while this replica holds Istio's per-revision
/// `istio-gateway-status-leader-<revision>` Lease, until `shutdown`.
pub async fn run(
    client: kube::Client,
    store: ConfigStore,
    domain: String,
    leadership: crate::leaderelection::Leadership,
    shutdown: watch::Receiver<bool>,
) {
    crate::leaderelection::run_while_leader("gateway status writer", leadership, shutdown, |stop| {
        write_while(client.clone(), store.clone(), domain.clone(), stop)
    })
    .await
}

/// Writes statuses until `shutdown`; the first pass at once (a new leader
/// compares everything with what the API holds).
async fn write_while(
    client: kube::Client,
    store: ConfigStore,
    domain: String,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut snapshots = store.watch();
    snapshots.mark_changed();
    let mut written: HashMap<ObjectKey, Value> = HashMap::new();
    loop {
        tokio::select! {
            changed = snapshots.changed() => if changed.is_err() { return },
            _ = shutdown.wait_for(|s| *s) => return,
        }
        tokio::time::sleep(SETTLE).await;
        let snapshot = snapshots.borrow_and_update().clone();
        let ours: BTreeSet<ObjectKey> = store
            .slice_objects()
            .iter()
            .filter(|o| o.kind().is_gateway_api())
            .map(|o| o.key())
            .collect();
        written.retain(|k, _| ours.contains(k));
        let out = convert(&snapshot, &domain);
        for (key, status) in &out.status {
            if !ours.contains(key) {
                continue;
            }
            let Some(object) = snapshot.get(key) else {
                continue;
            };
            let generation = object.metadata.generation;
            if let Err(e) = write(&client, key, status, generation, &mut written).await {
                tracing::warn!(target: "model", "{key}: writing its status failed: {e}; retrying on the next change");
                written.remove(key);
            }
        }
    }
}

fn api(client: &kube::Client, key: &ObjectKey) -> Api<DynamicObject> {
    let resource = super::api_resource(key.kind, key.kind.versions()[0]);
    if key.kind.is_namespaced() {
        Api::namespaced_with(client.clone(), &key.namespace, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    }
}

/// Writes one object's status when it differs from what was last written.
async fn write(
    client: &kube::Client,
    key: &ObjectKey,
    status: &ObjectStatus,
    generation: Option<i64>,
    written: &mut HashMap<ObjectKey, Value>,
) -> Result<(), kube::Error> {
    let api = api(client, key);
    let before = match written.get(key) {
        Some(v) => v.clone(),
        // First write: what the API holds (transition times, and the
        // parents other controllers wrote).
        None => api.get_status(&key.name).await?.data["status"].clone(),
    };
    // A policy's ancestors of other controllers are kept the same way.
    let mesh = crate::model::gateway_api::backend_policies::MESH_CONTROLLER_NAME;
    let others: Vec<Value> = before["parents"]
        .as_array()
        .or(before["ancestors"].as_array())
        .map(|ps| {
            ps.iter()
                .filter(|p| p["controllerName"] != CONTROLLER_NAME && p["controllerName"] != mesh)
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let desired = status.to_json(generation, &common::clock::now_rfc3339(), &before, others);
    if desired == before {
        written.insert(key.clone(), desired);
        return Ok(());
    }
    api.patch_status(
        &key.name,
        &PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        },
        &Patch::Merge(json!({ "status": desired })),
    )
    .await?;
    tracing::info!(target: "model", "{key}: status written: {}", status.lines().join("; "));
    written.insert(key.clone(), desired);
    Ok(())
}
