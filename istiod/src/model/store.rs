//! The config store: the last good objects keyed by kind, namespace and name,
//! published as immutable snapshots (`Arc<Snapshot>`, over a `watch` channel)
//! and as batches of change events (over a `broadcast` channel) for the push
//! pipeline. Sources (the file source, the Kubernetes source) write to it;
//! generators read only snapshots.
//!
//! Each source writes to its own **slice** ([`ConfigStore::slice`]), as
//! Istio's aggregate config controller keeps one store per source: a source
//! replacing its whole set (a re-read directory, a Kubernetes relist) only
//! adds, updates and deletes its own objects. The snapshot is the union of
//! the slices; when two slices hold the same key, the slice created first
//! wins, and the other's object shows again once the first one deletes it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{broadcast, watch};

use super::istio::ServiceEntry;
use super::meta::{Kind, KindSpec, Object, ObjectKey, Spec};

/// How many batches a slow subscriber may fall behind before it sees
/// `RecvError::Lagged` (and should then do a full push from the snapshot).
pub const EVENT_CHANNEL_CAPACITY: usize = 1024;

type KindMap = BTreeMap<(String, String), Arc<Object>>;

/// An immutable view of every object at one moment.
///
/// Objects of kinds that did not change are shared between successive
/// snapshots, so an EndpointSlice update does not copy the VirtualServices.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    version: u64,
    objects: BTreeMap<Kind, Arc<KindMap>>,
}

/// A typed view of one object in a snapshot.
#[derive(Debug)]
pub struct Typed<'a, T> {
    /// The object (metadata, `apiVersion`).
    pub object: &'a Arc<Object>,
    /// Its typed body.
    pub spec: &'a T,
}

impl<T> Clone for Typed<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Typed<'_, T> {}

impl<T> Typed<'_, T> {
    /// The object's namespace.
    pub fn namespace(&self) -> &str {
        &self.object.metadata.namespace
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.object.metadata.name
    }
}

impl Snapshot {
    /// Increases by one with every change applied to the store (0 when empty
    /// and never changed).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The object with this key.
    pub fn get(&self, key: &ObjectKey) -> Option<&Arc<Object>> {
        self.objects
            .get(&key.kind)?
            .get(&(key.namespace.clone(), key.name.clone()))
    }

    /// Every object of a kind, sorted by namespace then name.
    pub fn objects(&self, kind: Kind) -> impl Iterator<Item = &Arc<Object>> {
        self.objects.get(&kind).into_iter().flat_map(|m| m.values())
    }

    /// Every object of kind `T`, typed: `snapshot.list::<VirtualService>()`.
    pub fn list<T: KindSpec>(&self) -> impl Iterator<Item = Typed<'_, T>> {
        self.objects(T::KIND)
            .filter_map(|object| T::from_spec(&object.spec).map(|spec| Typed { object, spec }))
    }

    /// The object of kind `T` with this namespace and name.
    pub fn get_typed<T: KindSpec>(&self, namespace: &str, name: &str) -> Option<Typed<'_, T>> {
        let object = self
            .objects
            .get(&T::KIND)?
            .get(&(namespace.to_string(), name.to_string()))?;
        T::from_spec(&object.spec).map(|spec| Typed { object, spec })
    }

    /// The number of objects.
    pub fn len(&self) -> usize {
        self.objects.values().map(|m| m.len()).sum()
    }

    /// Whether there are no objects.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn insert(&mut self, object: Arc<Object>) -> Option<Arc<Object>> {
        let map = Arc::make_mut(self.objects.entry(object.kind()).or_default());
        let key = (
            object.metadata.namespace.clone(),
            object.metadata.name.clone(),
        );
        map.insert(key, object)
    }

    fn remove(&mut self, key: &ObjectKey) -> Option<Arc<Object>> {
        let map = self.objects.get_mut(&key.kind)?;
        let k = (key.namespace.clone(), key.name.clone());
        if !map.contains_key(&k) {
            return None;
        }
        let removed = Arc::make_mut(map).remove(&k);
        if map.is_empty() {
            self.objects.remove(&key.kind);
        }
        removed
    }
}

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Change {
    /// It is new.
    Add,
    /// It changed.
    Update,
    /// It is gone.
    Delete,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Change::Add => "add",
            Change::Update => "update",
            Change::Delete => "delete",
        })
    }
}

/// One object's change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigEvent {
    /// Which object (`Kind/namespace/name`).
    pub key: ObjectKey,
    /// Add, update or delete.
    pub change: Change,
    /// Whether only endpoints are affected, so an incremental EDS push is
    /// enough: EndpointSlice and Node changes; Pod and WorkloadEntry changes
    /// that keep the service account; ServiceEntry updates that change only
    /// `endpoints`.
    pub endpoint_only: bool,
}

impl fmt::Display for ConfigEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.change, self.key)?;
        if self.endpoint_only {
            f.write_str(" (endpoints only)")?;
        }
        Ok(())
    }
}

/// The changes applied to the store at once, with the snapshot they produced.
#[derive(Debug, Clone)]
pub struct ConfigBatch {
    /// The changes, sorted by key.
    pub events: Arc<[ConfigEvent]>,
    /// The snapshot after the changes.
    pub snapshot: Arc<Snapshot>,
}

impl ConfigBatch {
    /// Whether every change is endpoint-only (an incremental EDS push suffices).
    pub fn endpoints_only(&self) -> bool {
        self.events.iter().all(|e| e.endpoint_only)
    }
}

/// A change to apply with [`ConfigStore::apply`].
#[derive(Debug, Clone)]
pub enum Update {
    /// Add or replace an object.
    Upsert(Arc<Object>),
    /// Remove an object.
    Delete(ObjectKey),
}

/// One source's objects.
#[derive(Debug, Default)]
struct Slice {
    name: String,
    objects: BTreeMap<ObjectKey, Arc<Object>>,
}

#[derive(Debug)]
struct Shared {
    /// Every source's own objects, in precedence order (first wins). Held
    /// while a change is applied, so slices and snapshot change together.
    slices: Mutex<Vec<Slice>>,
    snapshots: watch::Sender<Arc<Snapshot>>,
    events: broadcast::Sender<ConfigBatch>,
}

/// The store, seen through one source's slice: reads see every slice,
/// writes change only this one. Cheap to clone; clones share the store.
#[derive(Debug, Clone)]
pub struct ConfigStore {
    shared: Arc<Shared>,
    slice: usize,
}

impl Default for ConfigStore {
    fn default() -> Self {
        Self::new()
    }
}

/// The slice [`ConfigStore::new`] returns.
pub const DEFAULT_SLICE: &str = "default";

impl ConfigStore {
    /// An empty store, seen through its first slice ([`DEFAULT_SLICE`]).
    pub fn new() -> Self {
        let (snapshots, _) = watch::channel(Arc::new(Snapshot::default()));
        let (events, _) = broadcast::channel(EVENT_CHANNEL_CAPACITY);
        Self {
            shared: Arc::new(Shared {
                slices: Mutex::new(vec![Slice {
                    name: DEFAULT_SLICE.to_string(),
                    objects: BTreeMap::new(),
                }]),
                snapshots,
                events,
            }),
            slice: 0,
        }
    }

    /// The same store seen through the slice `name`, created (after every
    /// existing slice, so with the lowest precedence) if it does not exist.
    pub fn slice(&self, name: &str) -> ConfigStore {
        let mut slices = self.lock();
        let slice = match slices.iter().position(|s| s.name == name) {
            Some(i) => i,
            None => {
                slices.push(Slice {
                    name: name.to_string(),
                    objects: BTreeMap::new(),
                });
                slices.len() - 1
            }
        };
        ConfigStore {
            shared: self.shared.clone(),
            slice,
        }
    }

    /// The name of the slice this handle writes to.
    pub fn slice_name(&self) -> String {
        self.lock()[self.slice].name.clone()
    }

    /// The objects of this handle's slice (shadowed ones included).
    pub fn slice_objects(&self) -> Vec<Arc<Object>> {
        self.lock()[self.slice].objects.values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Slice>> {
        // A panic while applying leaves whole slices behind (each update is
        // one map operation), so the data is still consistent.
        self.shared
            .slices
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.shared.snapshots.borrow().clone()
    }

    /// Follows the current snapshot.
    pub fn watch(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.shared.snapshots.subscribe()
    }

    /// Receives every batch of changes applied after this call. A receiver
    /// that falls more than [`EVENT_CHANNEL_CAPACITY`] batches behind gets
    /// `RecvError::Lagged` and should treat it as "everything changed".
    pub fn subscribe(&self) -> broadcast::Receiver<ConfigBatch> {
        self.shared.events.subscribe()
    }

    /// Applies changes to this slice; returns (and publishes) the batch of
    /// what the snapshot shows differently, or `None` when nothing visible
    /// changed (an upsert of an equal object, a change to a shadowed key).
    pub fn apply(&self, updates: impl IntoIterator<Item = Update>) -> Option<ConfigBatch> {
        let mut slices = self.lock();
        self.apply_locked(&mut slices, updates)
    }

    fn apply_locked(
        &self,
        slices: &mut [Slice],
        updates: impl IntoIterator<Item = Update>,
    ) -> Option<ConfigBatch> {
        let mut visible = Vec::new();
        for update in updates {
            let key = match update {
                Update::Upsert(object) => {
                    let key = object.key();
                    slices[self.slice].objects.insert(key.clone(), object);
                    key
                }
                Update::Delete(key) => {
                    slices[self.slice].objects.remove(&key);
                    key
                }
            };
            // What the snapshot shows for the key now: the first slice's.
            visible.push(match slices.iter().find_map(|s| s.objects.get(&key)) {
                Some(object) => Update::Upsert(object.clone()),
                None => Update::Delete(key),
            });
        }
        self.publish(visible)
    }

    /// Makes this slice hold exactly these objects (a source that owns
    /// every object of its slice, such as the file source, re-read as a whole).
    pub fn replace(&self, objects: impl IntoIterator<Item = Arc<Object>>) -> Option<ConfigBatch> {
        let wanted: BTreeMap<ObjectKey, Arc<Object>> =
            objects.into_iter().map(|o| (o.key(), o)).collect();
        let mut slices = self.lock();
        let mut updates: Vec<Update> = slices[self.slice]
            .objects
            .keys()
            .filter(|k| !wanted.contains_key(*k))
            .cloned()
            .map(Update::Delete)
            .collect();
        updates.extend(wanted.into_values().map(Update::Upsert));
        self.apply_locked(&mut slices, updates)
    }

    /// Applies what the snapshot shows differently. Called with the slices
    /// locked, so snapshots are published in the order the slices change.
    fn publish(&self, updates: Vec<Update>) -> Option<ConfigBatch> {
        let mut batch = None;
        self.shared.snapshots.send_if_modified(|current| {
            let mut next = Snapshot::clone(current);
            let mut events = BTreeMap::new();
            for update in updates {
                match update {
                    Update::Upsert(object) => {
                        let key = object.key();
                        let old = next.get(&key).cloned();
                        if old.as_deref() == Some(&*object) {
                            continue;
                        }
                        let change = if old.is_some() {
                            Change::Update
                        } else {
                            Change::Add
                        };
                        let endpoint_only = endpoint_only(old.as_deref(), Some(&object));
                        next.insert(object);
                        merge_event(&mut events, key, change, endpoint_only);
                    }
                    Update::Delete(key) => {
                        if let Some(old) = next.remove(&key) {
                            let endpoint_only = endpoint_only(Some(&old), None);
                            merge_event(&mut events, key, Change::Delete, endpoint_only);
                        }
                    }
                }
            }
            if events.is_empty() {
                return false;
            }
            next.version = current.version + 1;
            let snapshot = Arc::new(next);
            *current = snapshot.clone();
            let events: Arc<[ConfigEvent]> = events.into_values().collect();
            for e in events.iter() {
                tracing::debug!(target: "config", "{e}");
            }
            let b = ConfigBatch { events, snapshot };
            // No subscriber is not an error: the snapshot is still current.
            let _ = self.shared.events.send(b.clone());
            batch = Some(b);
            true
        });
        batch
    }
}

/// Within one batch, an add followed by a delete of the same key cancels out
/// and other sequences keep the last change.
fn merge_event(
    events: &mut BTreeMap<ObjectKey, ConfigEvent>,
    key: ObjectKey,
    change: Change,
    endpoint_only: bool,
) {
    let change = match (events.get(&key).map(|e| e.change), change) {
        (Some(Change::Add), Change::Delete) => {
            events.remove(&key);
            return;
        }
        (Some(Change::Add), _) => Change::Add,
        (Some(Change::Delete), Change::Add) => Change::Update,
        (_, c) => c,
    };
    let endpoint_only = endpoint_only && events.get(&key).is_none_or(|e| e.endpoint_only);
    events.insert(
        key.clone(),
        ConfigEvent {
            key,
            change,
            endpoint_only,
        },
    );
}

/// Whether a change affects only endpoints (EDS) and not clusters, listeners
/// or routes.
pub fn endpoint_only(old: Option<&Object>, new: Option<&Object>) -> bool {
    let Some(kind) = old.or(new).map(Object::kind) else {
        return false;
    };
    match kind {
        // A Node's labels are the locality of its Pods' endpoints.
        Kind::EndpointSlice | Kind::Node => true,
        // A changed identity changes the SANs clusters verify: full push.
        Kind::Pod | Kind::WorkloadEntry => match (old, new) {
            (Some(o), Some(n)) => service_account(o) == service_account(n),
            _ => true,
        },
        Kind::ServiceEntry => match (old.map(|o| &o.spec), new.map(|n| &n.spec)) {
            (Some(Spec::ServiceEntry(o)), Some(Spec::ServiceEntry(n))) => {
                old.map(|o| &o.metadata) == new.map(|n| &n.metadata)
                    && without_endpoints(o) == without_endpoints(n)
            }
            _ => false,
        },
        _ => false,
    }
}

fn service_account(o: &Object) -> Option<&str> {
    match &o.spec {
        Spec::Pod(p) => Some(p.service_account()),
        Spec::WorkloadEntry(w) => Some(&w.service_account),
        _ => None,
    }
}

fn without_endpoints(se: &ServiceEntry) -> ServiceEntry {
    ServiceEntry {
        endpoints: Vec::new(),
        ..se.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::istio::VirtualService;
    use crate::model::parse_file;

    fn objects(yaml: &str) -> Vec<Arc<Object>> {
        parse_file("t.yaml", yaml)
            .unwrap()
            .objects
            .into_iter()
            .map(Arc::new)
            .collect()
    }

    fn one(yaml: &str) -> Arc<Object> {
        objects(yaml).remove(0)
    }

    fn vs(name: &str, host: &str) -> Arc<Object> {
        one(&format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: demo}}\nspec: {{hosts: [{host}], http: [{{route: [{{destination: {{host: {host}}}}}]}}]}}\n"
        ))
    }

    fn pod(ip: &str, sa: &str, version: &str) -> Arc<Object> {
        one(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: demo, labels: {{version: {version}}}}}\nspec: {{serviceAccountName: {sa}}}\nstatus: {{podIP: {ip}}}\n"
        ))
    }

    fn events(batch: &ConfigBatch) -> Vec<String> {
        batch.events.iter().map(ToString::to_string).collect()
    }

    #[tokio::test]
    async fn publishes_snapshots_and_events_for_add_update_delete() {
        let store = ConfigStore::new();
        let mut rx = store.subscribe();
        let mut snapshots = store.watch();
        assert!(store.snapshot().is_empty());

        store.apply([Update::Upsert(vs("a", "a"))]).unwrap();
        let batch = rx.recv().await.unwrap();
        assert_eq!(events(&batch), vec!["add VirtualService/demo/a"]);
        assert!(snapshots.has_changed().unwrap());
        let snap = snapshots.borrow_and_update().clone();
        assert_eq!(snap.version(), 1);
        let typed: Vec<_> = snap.list::<VirtualService>().collect();
        assert_eq!(typed[0].name(), "a");
        assert_eq!(typed[0].spec.hosts, vec!["a"]);

        // An equal object is no change: nothing is published.
        assert!(store.apply([Update::Upsert(vs("a", "a"))]).is_none());
        assert!(rx.try_recv().is_err());

        store.apply([Update::Upsert(vs("a", "b"))]).unwrap();
        assert_eq!(
            events(&rx.recv().await.unwrap()),
            vec!["update VirtualService/demo/a"]
        );
        let key = ObjectKey::new(Kind::VirtualService, "demo", "a");
        store.apply([Update::Delete(key.clone())]).unwrap();
        let batch = rx.recv().await.unwrap();
        assert_eq!(events(&batch), vec!["delete VirtualService/demo/a"]);
        assert!(batch.snapshot.get(&key).is_none());
        assert_eq!(batch.snapshot.version(), 3);
        // Deleting what is not there is no change.
        assert!(store.apply([Update::Delete(key)]).is_none());
    }

    #[test]
    fn replace_diffs_against_the_current_objects() {
        let store = ConfigStore::new();
        store.replace([vs("a", "a"), vs("b", "b")]).unwrap();
        let batch = store.replace([vs("b", "changed"), vs("c", "c")]).unwrap();
        assert_eq!(
            events(&batch),
            vec![
                "delete VirtualService/demo/a",
                "update VirtualService/demo/b",
                "add VirtualService/demo/c"
            ]
        );
        assert!(store.replace([vs("b", "changed"), vs("c", "c")]).is_none());
    }

    #[test]
    fn each_slice_replaces_only_its_own_objects() {
        let store = ConfigStore::new();
        let file = store.slice("file");
        let kube = store.slice("kubernetes");
        assert_eq!(kube.slice_name(), "kubernetes");
        file.replace([vs("a", "a")]).unwrap();
        kube.replace([vs("k", "k")]).unwrap();
        // A file re-read without "k" does not delete the Kubernetes object.
        let batch = file.replace([vs("b", "b")]).unwrap();
        assert_eq!(
            events(&batch),
            vec!["delete VirtualService/demo/a", "add VirtualService/demo/b"]
        );
        // A relist without "b" does not delete the file's object.
        assert!(kube.replace([vs("k", "k")]).is_none());
        let names: Vec<String> = store
            .snapshot()
            .list::<VirtualService>()
            .map(|v| v.name().to_string())
            .collect();
        assert_eq!(names, vec!["b", "k"]);
    }

    #[test]
    fn the_first_slice_wins_and_the_other_shows_when_it_goes() {
        let store = ConfigStore::new();
        let file = store.slice("file");
        let kube = store.slice("kubernetes");
        let host = |s: &ConfigStore| {
            s.snapshot()
                .get_typed::<VirtualService>("demo", "a")
                .map(|v| v.spec.hosts[0].clone())
        };
        kube.apply([Update::Upsert(vs("a", "from-kube"))]).unwrap();
        assert_eq!(host(&store).as_deref(), Some("from-kube"));
        file.apply([Update::Upsert(vs("a", "from-file"))]).unwrap();
        assert_eq!(host(&store).as_deref(), Some("from-file"));
        // Changes to a shadowed object are not visible.
        assert!(kube.apply([Update::Upsert(vs("a", "kube-2"))]).is_none());
        let key = ObjectKey::new(Kind::VirtualService, "demo", "a");
        let batch = file.apply([Update::Delete(key.clone())]).unwrap();
        assert_eq!(events(&batch), vec!["update VirtualService/demo/a"]);
        assert_eq!(host(&store).as_deref(), Some("kube-2"));
        let batch = kube.apply([Update::Delete(key)]).unwrap();
        assert_eq!(events(&batch), vec!["delete VirtualService/demo/a"]);
        assert!(store.snapshot().is_empty());
        assert!(kube.slice_objects().is_empty());
    }

    #[test]
    fn unchanged_kinds_are_shared_between_snapshots() {
        let store = ConfigStore::new();
        store.replace([vs("a", "a"), pod("10.244.0.9", "sa", "v1")]);
        let before = store.snapshot();
        store.apply([Update::Upsert(pod("10.244.0.10", "sa", "v1"))]);
        let after = store.snapshot();
        assert!(Arc::ptr_eq(
            &before.objects[&Kind::VirtualService],
            &after.objects[&Kind::VirtualService]
        ));
        assert!(!Arc::ptr_eq(
            &before.objects[&Kind::Pod],
            &after.objects[&Kind::Pod]
        ));
    }

    #[test]
    fn classifies_endpoint_only_changes() {
        let store = ConfigStore::new();
        let slice = |ip: &str| {
            one(&format!(
                "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: s, namespace: demo, labels: {{kubernetes.io/service-name: svc}}}}\naddressType: IPv4\nendpoints: [{{addresses: [{ip}]}}]\n"
            ))
        };
        let se = |ep: &str, port: u32| {
            one(&format!(
                "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: se, namespace: demo}}\nspec: {{hosts: [api.example.com], ports: [{{number: {port}, name: http, protocol: HTTP}}], resolution: STATIC, endpoints: [{{address: {ep}}}]}}\n"
            ))
        };
        let only = |b: Option<ConfigBatch>| b.unwrap().endpoints_only();

        assert!(only(store.apply([Update::Upsert(slice("10.244.0.1"))])));
        assert!(only(store.apply([Update::Upsert(slice("10.244.0.2"))])));
        assert!(only(store.apply([Update::Upsert(pod(
            "10.244.0.2",
            "sa",
            "v1"
        ))])));
        // IP and labels: endpoints only.
        assert!(only(store.apply([Update::Upsert(pod(
            "10.244.0.3",
            "sa",
            "v2"
        ))])));
        // A new service account changes the SANs clusters verify.
        assert!(!only(store.apply([Update::Upsert(pod(
            "10.244.0.3",
            "other",
            "v2"
        ))])));
        assert!(!only(store.apply([Update::Upsert(se("10.1.0.1", 80))])));
        assert!(only(store.apply([Update::Upsert(se("10.1.0.2", 80))])));
        assert!(!only(store.apply([Update::Upsert(se("10.1.0.2", 8080))])));
        assert!(!only(store.apply([Update::Upsert(vs("a", "a"))])));
        // A batch is endpoint-only only if every change is.
        let mixed = store
            .apply([
                Update::Upsert(slice("10.244.0.7")),
                Update::Upsert(vs("a", "b")),
            ])
            .unwrap();
        assert!(!mixed.endpoints_only());
        assert_eq!(
            mixed
                .events
                .iter()
                .map(|e| e.endpoint_only)
                .collect::<Vec<_>>(),
            vec![false, true]
        );
        assert!(only(store.apply([Update::Delete(ObjectKey::new(
            Kind::EndpointSlice,
            "demo",
            "s"
        ))])));
    }
}
