//! Garbage collection by owner references, as the API's garbage collector
//! does with background propagation: once an owner is deleted, every
//! object naming it in `metadata.ownerReferences` whose owners are now all
//! gone is deleted too, and so on down (each deletion a `DELETED` event
//! after the owner's). `propagationPolicy: Orphan` leaves them.

use serde_json::Value;

use super::{EventType, State, Store, meta_str};
use crate::kube_api::resources::{RESOURCES, Resource};

fn owner_uids(obj: &Value) -> Vec<&str> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| refs.iter().filter_map(|r| r["uid"].as_str()).collect())
        .unwrap_or_default()
}

fn resource_of(group: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.plural == plural)
}

impl Store {
    /// Deletes the dependents of the deleted object `uid`, transitively.
    /// Bounded: each round deletes at least one object or stops.
    pub(super) fn collect_dependents(&self, st: &mut State, uid: &str) {
        let mut gone = vec![uid.to_string()];
        while let Some(owner) = gone.pop() {
            let exists = |st: &State, u: &str| {
                st.objects
                    .values()
                    .flat_map(|c| c.values())
                    .any(|o| meta_str(o, "uid") == Some(u))
            };
            let dependents: Vec<(&'static Resource, Value)> = st
                .objects
                .iter()
                .flat_map(|((group, plural), coll)| {
                    coll.values()
                        .filter(|o| owner_uids(o).contains(&owner.as_str()))
                        .filter_map(|o| Some((resource_of(group, plural)?, o.clone())))
                })
                .collect();
            for (res, dep) in dependents {
                if owner_uids(&dep).iter().any(|u| exists(st, u)) {
                    continue;
                }
                if let Some(u) = meta_str(&dep, "uid") {
                    gone.push(u.to_string());
                }
                self.commit(st, res, EventType::Deleted, dep.clone(), Some(dep));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::Scope;
    use super::*;
    use crate::kube_api::resources::by_kind;

    fn make(store: &Store, kind: &str, api_version: &str, name: &str, owners: &[&str]) -> String {
        let (res, version) = by_kind(api_version, kind).unwrap();
        let refs: Vec<Value> = owners
            .iter()
            .map(|u| json!({"apiVersion": "v1", "kind": "X", "name": "x", "uid": u}))
            .collect();
        let obj = json!({"apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "namespace": "demo", "ownerReferences": refs}});
        let created = store
            .create(res, version, "demo", obj, Scope::Whole)
            .unwrap();
        meta_str(&created, "uid").unwrap().to_string()
    }

    fn exists(store: &Store, api_version: &str, kind: &str, name: &str) -> bool {
        let (res, version) = by_kind(api_version, kind).unwrap();
        store.get(res, version, "demo", name).is_ok()
    }

    #[test]
    fn deleting_an_owner_deletes_its_dependents_down_the_chain() {
        let store = Store::new();
        let owner = make(&store, "ConfigMap", "v1", "owner", &[]);
        let other = make(&store, "ConfigMap", "v1", "other-owner", &[]);
        let dep = make(&store, "Deployment", "apps/v1", "dep", &[&owner]);
        make(&store, "Service", "v1", "grandchild", &[&dep]);
        make(&store, "ServiceAccount", "v1", "shared", &[&owner, &other]);
        make(&store, "ServiceAccount", "v1", "kept", &[&owner]);
        let (res, version) = by_kind("v1", "ConfigMap").unwrap();
        store
            .delete(res, version, "demo", "owner", &Value::Null)
            .unwrap();
        assert!(!exists(&store, "apps/v1", "Deployment", "dep"));
        assert!(!exists(&store, "v1", "Service", "grandchild"));
        assert!(!exists(&store, "v1", "ServiceAccount", "kept"));
        // Another owner remains.
        assert!(exists(&store, "v1", "ServiceAccount", "shared"));

        let again = make(&store, "ConfigMap", "v1", "owner", &[]);
        make(&store, "Deployment", "apps/v1", "orphaned", &[&again]);
        store
            .delete_with(res, version, "demo", "owner", &Value::Null, true)
            .unwrap();
        assert!(exists(&store, "apps/v1", "Deployment", "orphaned"));
    }
}
