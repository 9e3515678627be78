//! IP auto-allocation written back on Kubernetes, as Istio's controller
//! does (`pilot/pkg/controllers/ipallocate`): whenever the store changes,
//! the addresses [`crate::model::ip_allocate::allocate`] gives each
//! qualifying ServiceEntry of the Kubernetes source go to its
//! `status.addresses` (a merge patch of the `status` subresource), and an
//! entry that stopped qualifying (resolution NONE, its own `addresses`, the
//! opt-out label) has its stale addresses cleared. The registry reads them
//! back from the status, so they survive restarts and are shared by every
//! replica; until the status is written, every replica derives the same
//! ones from the objects.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;
use tokio::sync::watch;

use crate::model::ip_allocate::{allocate, should_allocate};
use crate::model::istio::{ServiceEntry, ServiceEntryAddress};
use crate::model::{ConfigStore, Kind, ObjectKey};

/// How long changes gather before addresses are worked out again.
const SETTLE: Duration = Duration::from_millis(100);

/// The field manager of the writes.
const FIELD_MANAGER: &str = "istiod";

/// Writes ServiceEntry addresses for `store`'s (the Kubernetes slice's)
/// objects while this replica holds Istio's `istio-ip-autoallocate` lock,
/// until `shutdown`.
pub async fn run(
    client: kube::Client,
    store: ConfigStore,
    leadership: crate::leaderelection::Leadership,
    shutdown: watch::Receiver<bool>,
) {
    crate::leaderelection::run_while_leader(
        "IP autoallocate controller",
        leadership,
        shutdown,
        |stop| write_while(client.clone(), store.clone(), stop),
    )
    .await
}

/// Writes addresses until `shutdown`; the first pass at once.
async fn write_while(
    client: kube::Client,
    store: ConfigStore,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut snapshots = store.watch();
    snapshots.mark_changed();
    // What was last written, so an entry is not patched again while the
    // watch has not brought the new status back yet.
    let mut written: HashMap<ObjectKey, Vec<ServiceEntryAddress>> = HashMap::new();
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
            .filter(|o| o.kind() == Kind::ServiceEntry)
            .map(|o| o.key())
            .collect();
        written.retain(|k, _| ours.contains(k));
        let allocations = allocate(&snapshot);
        for se in snapshot.list::<ServiceEntry>() {
            let key = se.object.key();
            if !ours.contains(&key) {
                continue;
            }
            let desired = if should_allocate(&se.object.metadata, se.spec) {
                allocations.status_of(&key)
            } else {
                Vec::new()
            };
            if desired == se.spec.status_addresses || written.get(&key) == Some(&desired) {
                continue;
            }
            match write(&client, &key, &desired).await {
                Ok(()) => {
                    let shown: Vec<&str> = desired.iter().map(|a| a.value.as_str()).collect();
                    tracing::info!(target: "model", "{key}: status.addresses written: [{}]", shown.join(", "));
                    written.insert(key, desired);
                }
                Err(e) => {
                    tracing::warn!(target: "model", "{key}: writing its addresses failed: {e}; retrying on the next change");
                    written.remove(&key);
                }
            }
        }
    }
}

async fn write(
    client: &kube::Client,
    key: &ObjectKey,
    addresses: &[ServiceEntryAddress],
) -> Result<(), kube::Error> {
    let resource = super::api_resource(key.kind, key.kind.versions()[0]);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &key.namespace, &resource);
    api.patch_status(
        &key.name,
        &PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        },
        &Patch::Merge(json!({ "status": { "addresses": addresses } })),
    )
    .await?;
    Ok(())
}
