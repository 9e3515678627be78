//! Where the controller writes WorkloadEntries: the Kubernetes API (create,
//! merge patches of annotations and of the `status` subresource, delete),
//! or, in file mode, istiod's own store slice, which `/debug/configz` lists.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::model::istio::{IstioCondition, WorkloadEntry};
use crate::model::{ConfigStore, Kind, Object, ObjectKey, Spec, Update};

/// The store slice auto-registered entries live in, in file mode.
pub const SLICE: &str = "autoregistration";
/// The field manager of istiod's writes.
const FIELD_MANAGER: &str = "istiod";

/// A write that failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Creating what exists.
    #[error("WorkloadEntry {0} already exists")]
    AlreadyExists(String),
    /// Changing what does not exist.
    #[error("WorkloadEntry {0} not found")]
    NotFound(String),
    /// The object does not serialize as the API expects.
    #[error("WorkloadEntry {0} does not encode: {1}")]
    Encode(String, serde_json::Error),
    /// The API refused or failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[source] kube::Error),
}

/// Where entries are written.
#[derive(Clone)]
pub enum Writer {
    /// istiod's store (file mode): the slice [`SLICE`].
    Memory(ConfigStore),
    /// The Kubernetes API.
    Kube(kube::Client),
}

impl Writer {
    /// A writer to `store`'s [`SLICE`].
    pub fn memory(store: &ConfigStore) -> Self {
        Writer::Memory(store.slice(SLICE))
    }

    fn api(client: &kube::Client, namespace: &str) -> Api<DynamicObject> {
        let resource = crate::source::kube::api_resource(
            Kind::WorkloadEntry,
            Kind::WorkloadEntry.versions()[0],
        );
        Api::namespaced_with(client.clone(), namespace, &resource)
    }

    fn kube_err(key: String, e: kube::Error) -> WriteError {
        match &e {
            kube::Error::Api(s) if s.code == 409 => WriteError::AlreadyExists(key),
            kube::Error::Api(s) if s.code == 404 => WriteError::NotFound(key),
            _ => WriteError::Kube(e),
        }
    }

    /// Creates an entry.
    pub async fn create(&self, entry: Object) -> Result<(), WriteError> {
        let key = format!("{}/{}", entry.metadata.namespace, entry.metadata.name);
        match self {
            Writer::Memory(store) => {
                if store.snapshot().get(&entry.key()).is_some() {
                    return Err(WriteError::AlreadyExists(key));
                }
                store.apply([Update::Upsert(Arc::new(entry))]);
                Ok(())
            }
            Writer::Kube(client) => {
                let value =
                    serde_json::to_value(&entry).map_err(|e| WriteError::Encode(key.clone(), e))?;
                let object: DynamicObject = serde_json::from_value(value)
                    .map_err(|e| WriteError::Encode(key.clone(), e))?;
                Self::api(client, &entry.metadata.namespace)
                    .create(
                        &PostParams {
                            field_manager: Some(FIELD_MANAGER.into()),
                            ..Default::default()
                        },
                        &object,
                    )
                    .await
                    .map(|_| ())
                    .map_err(|e| Self::kube_err(key, e))
            }
        }
    }

    /// Sets (`Some`) or removes (`None`) annotations of an entry.
    pub async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        changes: &BTreeMap<String, Option<String>>,
    ) -> Result<(), WriteError> {
        match self {
            Writer::Memory(store) => Self::edit(store, namespace, name, |o| {
                for (k, v) in changes {
                    match v {
                        Some(v) => o.metadata.annotations.insert(k.clone(), v.clone()),
                        None => o.metadata.annotations.remove(k),
                    };
                }
            }),
            Writer::Kube(client) => {
                let annotations: serde_json::Map<String, Value> = changes
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone().map_or(Value::Null, Value::String)))
                    .collect();
                Self::api(client, namespace)
                    .patch(
                        name,
                        &PatchParams {
                            field_manager: Some(FIELD_MANAGER.into()),
                            ..Default::default()
                        },
                        &Patch::Merge(json!({ "metadata": { "annotations": annotations } })),
                    )
                    .await
                    .map(|_| ())
                    .map_err(|e| Self::kube_err(format!("{namespace}/{name}"), e))
            }
        }
    }

    /// Replaces an entry's `status.conditions`.
    pub async fn set_conditions(
        &self,
        namespace: &str,
        name: &str,
        conditions: &[IstioCondition],
    ) -> Result<(), WriteError> {
        match self {
            Writer::Memory(store) => Self::edit(store, namespace, name, |o| {
                if let Spec::WorkloadEntry(we) = &mut o.spec {
                    we.status_conditions = conditions.to_vec();
                }
            }),
            Writer::Kube(client) => Self::api(client, namespace)
                .patch_status(
                    name,
                    &PatchParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    },
                    &Patch::Merge(json!({ "status": { "conditions": conditions } })),
                )
                .await
                .map(|_| ())
                .map_err(|e| Self::kube_err(format!("{namespace}/{name}"), e)),
        }
    }

    /// Deletes an entry (one already gone is no error).
    pub async fn delete(&self, namespace: &str, name: &str) -> Result<(), WriteError> {
        match self {
            Writer::Memory(store) => {
                store.apply([Update::Delete(ObjectKey::new(
                    Kind::WorkloadEntry,
                    namespace,
                    name,
                ))]);
                Ok(())
            }
            Writer::Kube(client) => {
                match Self::api(client, namespace)
                    .delete(name, &DeleteParams::default())
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(e) => match Self::kube_err(format!("{namespace}/{name}"), e) {
                        WriteError::NotFound(_) => Ok(()),
                        e => Err(e),
                    },
                }
            }
        }
    }

    fn edit(
        store: &ConfigStore,
        namespace: &str,
        name: &str,
        f: impl FnOnce(&mut Object),
    ) -> Result<(), WriteError> {
        let key = ObjectKey::new(Kind::WorkloadEntry, namespace, name);
        let Some(current) = store
            .slice_objects()
            .into_iter()
            .find(|o| o.key() == key && o.spec_as::<WorkloadEntry>().is_some())
        else {
            return Err(WriteError::NotFound(format!("{namespace}/{name}")));
        };
        let mut next = Object::clone(&current);
        f(&mut next);
        store.apply([Update::Upsert(Arc::new(next))]);
        Ok(())
    }
}
