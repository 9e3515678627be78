//! The Kubernetes source's view of the API, as Istio's informer caches and
//! `DiscoveryNamespacesFilter` keep it, without I/O: the last good object of
//! every watched kind in every namespace, and what of it the store holds.
//!
//! Every method takes one watch event and returns the store updates it
//! causes, so the store ends equal to the API's state:
//! - a relist (`Init` .. `InitDone`) replaces a kind's objects at once, and
//!   an object the new list lacks is deleted (nothing survives a missed
//!   delete, nothing is listed twice);
//! - an object the validator rejects keeps its last good version serving;
//! - with mesh config `discoverySelectors`, only objects in selected
//!   namespaces (and the selected Namespaces) reach the store; a Namespace's
//!   labels or the selectors changing adds or deletes whole namespaces;
//! - only config of this istiod's revision (or of a tag pointing at it)
//!   reaches the store ([`InRevision`]); a tag moving adds or deletes it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::mesh::Mesh;
use crate::model::revision::InRevision;
use crate::model::{FieldError, Kind, Object, ObjectKey, Update};

/// One object as a watch delivered it, decoded and validated.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// A valid object.
    Object(Arc<Object>),
    /// An object the validator rejected.
    Rejected {
        /// The object.
        key: ObjectKey,
        /// Every problem found.
        errors: Vec<FieldError>,
    },
}

/// The informers' state: see the module documentation.
#[derive(Debug)]
pub struct Informers {
    /// Last good object of every key, per kind, in every namespace.
    objects: BTreeMap<Kind, BTreeMap<ObjectKey, Arc<Object>>>,
    /// Objects whose current version is rejected, with why.
    rejected: BTreeMap<ObjectKey, Vec<FieldError>>,
    /// Items listed since a kind's last `Init`.
    listing: BTreeMap<Kind, Vec<Item>>,
    /// What the store's slice holds.
    published: BTreeMap<ObjectKey, Arc<Object>>,
    mesh: Arc<Mesh>,
    /// This istiod's revision and tags.
    revision: InRevision,
    synced: BTreeSet<Kind>,
}

impl Informers {
    /// Empty caches, filtering with `mesh`'s `discoverySelectors`.
    pub fn new(mesh: Arc<Mesh>) -> Self {
        Self {
            objects: BTreeMap::new(),
            rejected: BTreeMap::new(),
            listing: BTreeMap::new(),
            published: BTreeMap::new(),
            mesh,
            revision: InRevision::default(),
            synced: BTreeSet::new(),
        }
    }

    /// The same caches, keeping only config of `revision`.
    pub fn with_revision(mut self, revision: InRevision) -> Self {
        self.revision = revision;
        self
    }

    /// The tags pointing at this revision changed: config labelled with a
    /// tag that arrived or left is added or deleted.
    pub fn set_revision(&mut self, revision: InRevision) -> Vec<Update> {
        if revision == self.revision {
            return Vec::new();
        }
        self.revision = revision;
        self.reconcile(None)
    }

    /// Whether `kind` has completed its first list.
    pub fn has_synced(&self, kind: Kind) -> bool {
        self.synced.contains(&kind)
    }

    /// The objects rejected now, one line per problem.
    pub fn rejected(&self) -> Vec<String> {
        self.rejected
            .iter()
            .flat_map(|(key, errors)| {
                errors
                    .iter()
                    .map(move |e| format!("Kubernetes: {key}: {e}"))
            })
            .collect()
    }

    /// A (re)list of `kind` starts.
    pub fn init(&mut self, kind: Kind) {
        self.listing.insert(kind, Vec::new());
    }

    /// An object of the list in progress.
    pub fn init_apply(&mut self, kind: Kind, item: Item) {
        self.listing.entry(kind).or_default().push(item);
    }

    /// The list of `kind` is complete: its objects are replaced by the
    /// listed ones in one batch of updates.
    pub fn init_done(&mut self, kind: Kind) -> Vec<Update> {
        let listed = self.listing.remove(&kind).unwrap_or_default();
        let old = self.objects.remove(&kind).unwrap_or_default();
        let mut objects = BTreeMap::new();
        self.rejected.retain(|key, _| key.kind != kind);
        for item in listed {
            match item {
                Item::Object(o) => {
                    self.rejected.remove(&o.key());
                    objects.insert(o.key(), o);
                }
                Item::Rejected { key, errors } => {
                    log_rejected(&key, &errors, old.contains_key(&key));
                    if let Some(good) = old.get(&key) {
                        objects.insert(key.clone(), good.clone());
                    }
                    self.rejected.insert(key, errors);
                }
            }
        }
        let count = objects.len();
        self.objects.insert(kind, objects);
        if self.synced.insert(kind) {
            tracing::info!(target: "kube", "{kind}: initial list synced ({count} objects)");
        } else {
            tracing::info!(target: "kube", "{kind}: relisted ({count} objects)");
        }
        if kind == Kind::Namespace {
            self.reconcile(None)
        } else {
            self.reconcile(Some(kind))
        }
    }

    /// An object was added or changed.
    pub fn apply(&mut self, item: Item) -> Vec<Update> {
        let object = match item {
            Item::Object(o) => o,
            Item::Rejected { key, errors } => {
                let has_good = self
                    .objects
                    .get(&key.kind)
                    .is_some_and(|m| m.contains_key(&key));
                log_rejected(&key, &errors, has_good);
                self.rejected.insert(key, errors);
                return Vec::new();
            }
        };
        let key = object.key();
        self.rejected.remove(&key);
        self.objects
            .entry(key.kind)
            .or_default()
            .insert(key.clone(), object.clone());
        if key.kind == Kind::Namespace && !self.mesh.discovery_selectors.is_empty() {
            // The Namespace's labels may select or drop everything in it.
            return self.reconcile(None);
        }
        if self.is_visible(&object) {
            self.published.insert(key, object.clone());
            vec![Update::Upsert(object)]
        } else {
            self.unpublish(key)
        }
    }

    /// An object was deleted.
    pub fn delete(&mut self, key: ObjectKey) -> Vec<Update> {
        self.rejected.remove(&key);
        if let Some(m) = self.objects.get_mut(&key.kind) {
            m.remove(&key);
        }
        if key.kind == Kind::Namespace && !self.mesh.discovery_selectors.is_empty() {
            return self.reconcile(None);
        }
        self.unpublish(key)
    }

    /// The mesh config changed: a change of `discoverySelectors` adds and
    /// deletes whole namespaces.
    pub fn set_mesh(&mut self, mesh: Arc<Mesh>) -> Vec<Update> {
        let selectors_changed = mesh.discovery_selectors != self.mesh.discovery_selectors;
        self.mesh = mesh;
        if selectors_changed {
            self.reconcile(None)
        } else {
            Vec::new()
        }
    }

    fn unpublish(&mut self, key: ObjectKey) -> Vec<Update> {
        match self.published.remove(&key) {
            Some(_) => vec![Update::Delete(key)],
            None => Vec::new(),
        }
    }

    /// Whether the namespace `name` is one istiod uses.
    fn namespace_selected(&self, name: &str) -> bool {
        if self.mesh.discovery_selectors.is_empty() {
            return true;
        }
        self.objects
            .get(&Kind::Namespace)
            .and_then(|m| m.get(&ObjectKey::new(Kind::Namespace, "", name)))
            .is_some_and(|ns| self.mesh.selects_namespace(&ns.metadata.labels))
    }

    fn is_visible(&self, object: &Object) -> bool {
        if !self.revision.admits(object) {
            return false;
        }
        match object.kind() {
            Kind::Namespace => self.namespace_selected(&object.metadata.name),
            kind if kind.is_namespaced() => self.namespace_selected(&object.metadata.namespace),
            _ => true,
        }
    }

    /// Makes the published objects of `kind` (of every kind for `None`)
    /// equal to the visible cached ones; returns the difference.
    fn reconcile(&mut self, kind: Option<Kind>) -> Vec<Update> {
        let in_scope = |k: Kind| kind.is_none_or(|want| want == k);
        let desired: BTreeMap<ObjectKey, Arc<Object>> = self
            .objects
            .iter()
            .filter(|(k, _)| in_scope(**k))
            .flat_map(|(_, m)| m.iter())
            .filter(|(_, o)| self.is_visible(o))
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect();
        let mut updates: Vec<Update> = self
            .published
            .keys()
            .filter(|k| in_scope(k.kind) && !desired.contains_key(*k))
            .cloned()
            .map(Update::Delete)
            .collect();
        for key in updates.iter().filter_map(|u| match u {
            Update::Delete(k) => Some(k.clone()),
            Update::Upsert(_) => None,
        }) {
            self.published.remove(&key);
        }
        for (key, object) in desired {
            if self.published.get(&key) != Some(&object) {
                self.published.insert(key, object.clone());
                updates.push(Update::Upsert(object));
            }
        }
        updates
    }
}

fn log_rejected(key: &ObjectKey, errors: &[FieldError], has_good: bool) {
    for e in errors {
        tracing::warn!(target: "config", "rejected: Kubernetes {key}: {e}");
    }
    if has_good {
        tracing::warn!(target: "config", "{key} is rejected; its last good version keeps serving until it is fixed");
    } else {
        tracing::warn!(target: "config", "{key} is rejected and not used until it is fixed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ConfigStore, parse_file};

    fn obj(yaml: &str) -> Arc<Object> {
        Arc::new(parse_file("t.yaml", yaml).unwrap().objects.remove(0))
    }

    fn svc(ns: &str, name: &str, port: u16) -> Item {
        Item::Object(obj(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{ports: [{{name: http, port: {port}}}]}}\n"
        )))
    }

    fn ns(name: &str, labels: &str) -> Item {
        Item::Object(obj(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {name}, labels: {{{labels}}}}}\n"
        )))
    }

    fn key(kind: Kind, ns: &str, name: &str) -> ObjectKey {
        ObjectKey::new(kind, ns, name)
    }

    /// Lists `items` as one relist of `kind` and applies the result.
    fn relist(
        inf: &mut Informers,
        store: &ConfigStore,
        kind: Kind,
        items: Vec<Item>,
    ) -> Vec<String> {
        inf.init(kind);
        for i in items {
            inf.init_apply(kind, i);
        }
        apply(store, inf.init_done(kind))
    }

    fn apply(store: &ConfigStore, updates: Vec<Update>) -> Vec<String> {
        store
            .apply(updates)
            .map(|b| b.events.iter().map(ToString::to_string).collect())
            .unwrap_or_default()
    }

    fn keys(store: &ConfigStore) -> Vec<String> {
        let snap = store.snapshot();
        Kind::ALL
            .iter()
            .flat_map(|k| snap.objects(*k).map(|o| o.key().to_string()))
            .collect()
    }

    #[test]
    fn a_relist_deletes_what_vanished_and_updates_what_changed() {
        let store = ConfigStore::new();
        let mut inf = Informers::new(Arc::default());
        assert!(!inf.has_synced(Kind::Service));
        let events = relist(
            &mut inf,
            &store,
            Kind::Service,
            vec![svc("demo", "a", 80), svc("demo", "b", 80)],
        );
        assert!(inf.has_synced(Kind::Service));
        assert_eq!(events, vec!["add Service/demo/a", "add Service/demo/b"]);

        // Deleted while the watch was down, "b" changed and "c" was added:
        // the relist says so in one batch, and nothing is listed twice.
        let events = relist(
            &mut inf,
            &store,
            Kind::Service,
            vec![
                svc("demo", "b", 81),
                svc("demo", "c", 80),
                svc("demo", "c", 80),
            ],
        );
        assert_eq!(
            events,
            vec![
                "delete Service/demo/a",
                "update Service/demo/b",
                "add Service/demo/c"
            ]
        );
        assert_eq!(keys(&store), vec!["Service/demo/b", "Service/demo/c"]);
        // The same list again changes nothing.
        let events = relist(
            &mut inf,
            &store,
            Kind::Service,
            vec![svc("demo", "b", 81), svc("demo", "c", 80)],
        );
        assert!(events.is_empty());
        // A relist of another kind leaves Services alone.
        assert!(relist(&mut inf, &store, Kind::Pod, vec![]).is_empty());
        assert_eq!(keys(&store).len(), 2);
    }

    #[test]
    fn watch_events_add_update_and_delete() {
        let store = ConfigStore::new();
        let mut inf = Informers::new(Arc::default());
        relist(&mut inf, &store, Kind::Service, vec![]);
        assert_eq!(
            apply(&store, inf.apply(svc("demo", "a", 80))),
            vec!["add Service/demo/a"]
        );
        assert_eq!(
            apply(&store, inf.apply(svc("demo", "a", 81))),
            vec!["update Service/demo/a"]
        );
        assert_eq!(
            apply(&store, inf.delete(key(Kind::Service, "demo", "a"))),
            vec!["delete Service/demo/a"]
        );
        // A delete of what is not there is no change.
        assert!(inf.delete(key(Kind::Service, "demo", "a")).is_empty());
    }

    #[test]
    fn a_rejected_version_keeps_the_last_good_one() {
        let store = ConfigStore::new();
        let mut inf = Informers::new(Arc::default());
        relist(&mut inf, &store, Kind::Service, vec![svc("demo", "a", 80)]);
        let bad = Item::Rejected {
            key: key(Kind::Service, "demo", "a"),
            errors: vec![FieldError::new("spec.ports[0].port", "must be 1-65535")],
        };
        assert!(inf.apply(bad.clone()).is_empty());
        assert_eq!(
            inf.rejected(),
            vec!["Kubernetes: Service/demo/a: spec.ports[0].port: must be 1-65535"]
        );
        // Still rejected after a relist: the last good version stays.
        assert!(relist(&mut inf, &store, Kind::Service, vec![bad]).is_empty());
        assert_eq!(keys(&store), vec!["Service/demo/a"]);
        // Fixed: applied, and no longer reported.
        assert_eq!(
            apply(&store, inf.apply(svc("demo", "a", 81))),
            vec!["update Service/demo/a"]
        );
        assert!(inf.rejected().is_empty());
        // A rejected new object is not used at all.
        let new_bad = Item::Rejected {
            key: key(Kind::Service, "demo", "new"),
            errors: vec![FieldError::new("spec", "bad")],
        };
        assert!(
            relist(
                &mut inf,
                &store,
                Kind::Service,
                vec![svc("demo", "a", 81), new_bad]
            )
            .is_empty()
        );
        assert_eq!(keys(&store), vec!["Service/demo/a"]);
        assert_eq!(inf.rejected().len(), 1);
    }

    #[test]
    fn discovery_selectors_filter_namespaces_and_follow_their_labels() {
        let store = ConfigStore::new();
        let mesh = Mesh::parse("discoverySelectors: [{matchLabels: {mesh: \"on\"}}]").unwrap();
        let mut inf = Informers::new(Arc::new(mesh));
        // Objects listed before their Namespace: held back until it is known.
        assert!(
            relist(
                &mut inf,
                &store,
                Kind::Service,
                vec![svc("demo", "a", 80), svc("other", "b", 80)]
            )
            .is_empty()
        );
        let events = relist(
            &mut inf,
            &store,
            Kind::Namespace,
            vec![ns("demo", "mesh: \"on\""), ns("other", "")],
        );
        assert_eq!(events, vec!["add Service/demo/a", "add Namespace/demo"]);
        assert!(inf.apply(svc("other", "c", 80)).is_empty());

        // "other" gets the label: everything in it appears.
        let events = apply(&store, inf.apply(ns("other", "mesh: \"on\"")));
        assert_eq!(
            events,
            vec![
                "add Service/other/b",
                "add Service/other/c",
                "add Namespace/other"
            ]
        );
        // "demo" loses it: everything in it goes.
        let events = apply(&store, inf.apply(ns("demo", "")));
        assert_eq!(
            events,
            vec!["delete Service/demo/a", "delete Namespace/demo"]
        );

        // No selectors: every namespace.
        let events = apply(&store, inf.set_mesh(Arc::default()));
        assert_eq!(events, vec!["add Service/demo/a", "add Namespace/demo"]);
        // The same selectors again: nothing to do.
        assert!(inf.set_mesh(Arc::default()).is_empty());
    }

    #[test]
    fn cluster_scoped_kinds_are_not_filtered() {
        let store = ConfigStore::new();
        let mesh = Mesh::parse("discoverySelectors: [{matchLabels: {mesh: \"on\"}}]").unwrap();
        let mut inf = Informers::new(Arc::new(mesh));
        let node = Item::Object(obj(
            "apiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {topology.kubernetes.io/zone: z}}\n",
        ));
        assert_eq!(
            relist(&mut inf, &store, Kind::Node, vec![node]),
            vec!["add Node/n1 (endpoints only)"]
        );
    }

    fn vs(name: &str, rev: &str) -> Item {
        Item::Object(obj(&format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: demo, labels: {{istio.io/rev: {rev}}}}}\nspec: {{hosts: [a], http: [{{route: [{{destination: {{host: a}}}}]}}]}}\n"
        )))
    }

    #[test]
    fn config_of_another_revision_stays_out_until_a_tag_brings_it() {
        let store = ConfigStore::new();
        let canary = InRevision::new("canary");
        let mut inf = Informers::new(Arc::default()).with_revision(canary.clone());
        let events = relist(
            &mut inf,
            &store,
            Kind::VirtualService,
            vec![
                vs("mine", "canary"),
                vs("tagged", "prod"),
                vs("old", "default"),
            ],
        );
        assert_eq!(events, vec!["add VirtualService/demo/mine"]);
        // The tag `prod` now points at canary.
        let tagged = canary.with_tags(["prod".to_string()].into());
        assert_eq!(
            apply(&store, inf.set_revision(tagged.clone())),
            vec!["add VirtualService/demo/tagged"]
        );
        assert!(inf.set_revision(tagged).is_empty());
        // Relabelled to another revision: it leaves.
        assert_eq!(
            apply(&store, inf.apply(vs("mine", "default"))),
            vec!["delete VirtualService/demo/mine"]
        );
        // The tag moves away.
        assert_eq!(
            apply(&store, inf.set_revision(canary)),
            vec!["delete VirtualService/demo/tagged"]
        );
    }
}
