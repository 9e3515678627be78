//! The objects the stand-in serves, as etcd and the API server's registry
//! keep them: one global resourceVersion counter, a bounded history of
//! change events (the watch window), and the create/update/patch/delete
//! semantics of the API (preconditions, no-op writes, server-set metadata).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use base64::Engine;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::resources::Resource;
use super::selector::{FieldSelector, LabelSelector};
use super::status::Status;

/// Events kept for watches to resume from, unless changed with
/// `set_history_limit`.
pub const DEFAULT_HISTORY: usize = 10_000;

/// Events a watcher may fall behind by before its stream is closed, as the
/// API server closes the watches of clients that do not keep up.
const WATCH_BUFFER: usize = 16_384;

/// The kind of a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Removed.
    Deleted,
}

impl EventType {
    /// The watch event `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One committed change.
#[derive(Debug)]
pub struct Event {
    /// The resourceVersion the change was committed at.
    pub rv: u64,
    /// What happened.
    pub ty: EventType,
    /// The resource of the object.
    pub res: &'static Resource,
    /// The object after the change (for a deletion: its last state, at the
    /// deletion's resourceVersion).
    pub obj: Value,
    /// The object before the change (none for a creation), so that a watch
    /// with a selector can tell an object entering or leaving it.
    pub prev: Option<Value>,
}

/// Which part of an object a write may set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The main resource over HTTP: `status` of a resource with a status
    /// subresource is kept as it was (dropped on create); a
    /// `resourceVersion` on create is refused.
    Main,
    /// The `/status` subresource: only `status` changes.
    Status,
    /// A test's direct write: the whole object as given.
    Whole,
}

/// How a PATCH body is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// JSON merge patch (RFC 7386); strategic merge patch is applied as this.
    Merge,
    /// Server-side apply: create if missing, else merged as a merge patch.
    Apply,
}

/// LIST parameters.
#[derive(Debug, Default)]
pub struct ListOptions {
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
    /// `resourceVersion`.
    pub resource_version: Option<String>,
    /// `resourceVersionMatch`.
    pub version_match: Option<String>,
    /// `limit`.
    pub limit: Option<usize>,
    /// `continue`.
    pub continue_token: Option<String>,
}

/// WATCH parameters.
#[derive(Debug, Default)]
pub struct WatchOptions {
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
    /// `resourceVersion`.
    pub resource_version: Option<String>,
    /// `resourceVersionMatch`.
    pub version_match: Option<String>,
    /// `sendInitialEvents`.
    pub send_initial_events: Option<bool>,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
}

/// What a watch sees of the events: one resource, maybe one namespace,
/// the selectors.
#[derive(Debug)]
pub struct Filter {
    res: &'static Resource,
    version: String,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn selects(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// The watch event this watch sends for `ev`, if any. An update that
    /// moves an object into the selection is `ADDED`, out of it `DELETED`.
    pub fn view(&self, ev: &Event) -> Option<Value> {
        if ev.res != self.res {
            return None;
        }
        if let Some(ns) = &self.namespace
            && meta_str(&ev.obj, "namespace") != Some(ns.as_str())
        {
            return None;
        }
        let now = self.selects(&ev.obj);
        let before = ev.prev.as_ref().is_some_and(|p| self.selects(p));
        let ty = match ev.ty {
            EventType::Added => now.then_some(EventType::Added),
            EventType::Deleted => now.then_some(EventType::Deleted),
            EventType::Modified => match (before, now) {
                (true, true) => Some(EventType::Modified),
                (false, true) => Some(EventType::Added),
                (true, false) => Some(EventType::Deleted),
                (false, false) => None,
            },
        }?;
        Some(json!({"type": ty.as_str(), "object": present(&ev.obj, self.res, &self.version)}))
    }

    /// A `BOOKMARK` event at `rv`: only kind, apiVersion and
    /// metadata.resourceVersion, plus the `k8s.io/initial-events-end`
    /// annotation that ends the initial events of a streaming list.
    pub fn bookmark(&self, rv: u64, initial_events_end: bool) -> Value {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_events_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        json!({"type": "BOOKMARK", "object": {
            "kind": self.res.kind,
            "apiVersion": self.res.api_version(&self.version),
            "metadata": meta,
        }})
    }
}

/// A started watch: the events to send first, then the live ones.
pub struct Watch {
    /// What the watch selects.
    pub filter: Filter,
    /// Synthetic `ADDED` events of the current state, or the history
    /// replayed after the requested resourceVersion.
    pub initial: Vec<Arc<Event>>,
    /// For `sendInitialEvents=true`: the resourceVersion of the bookmark
    /// that ends the initial events.
    pub initial_end: Option<u64>,
    /// Set when the requested resourceVersion is older than the history:
    /// the watch sends this as an `ERROR` event and ends.
    pub expired: Option<Status>,
    /// Live events committed after the watch started.
    pub live: broadcast::Receiver<Arc<Event>>,
    /// The resourceVersion the stream is complete up to once `initial` is
    /// sent: bookmarks never say less.
    pub start: u64,
}

type Key = (String, String);

mod gc;

struct State {
    rv: u64,
    objects: HashMap<(&'static str, &'static str), BTreeMap<Key, Value>>,
    history: VecDeque<Arc<Event>>,
    /// Watches and exact lists from a resourceVersion at or after this are
    /// served from `history`; older ones are gone (410).
    history_start: u64,
    history_limit: usize,
}

/// The objects and their history.
pub struct Store {
    state: Mutex<State>,
    events: broadcast::Sender<Arc<Event>>,
}

/// `metadata.<field>` as a string.
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    let Some(o) = obj.as_object_mut() else {
        unreachable!("objects are checked to be JSON objects before they are stored")
    };
    let m = o.entry("metadata").or_insert_with(|| json!({}));
    if !m.is_object() {
        *m = json!({});
    }
    match m {
        Value::Object(m) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

/// `obj` as served under `version`: apiVersion and kind set.
pub fn present(obj: &Value, res: &Resource, version: &str) -> Value {
    let mut o = obj.clone();
    o["apiVersion"] = json!(res.api_version(version));
    o["kind"] = json!(res.kind);
    o
}

fn key_of(obj: &Value) -> Key {
    (
        meta_str(obj, "namespace").unwrap_or_default().to_string(),
        meta_str(obj, "name").unwrap_or_default().to_string(),
    )
}

fn rv_of(obj: &Value) -> u64 {
    meta_str(obj, "resourceVersion")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The 5-character suffix `generateName` gets, from the API's alphabet.
fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4().as_bytes()[..5]
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

/// Applies an RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// `obj` without what the server owns, to compare two states of an object.
fn content(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    o
}

/// `obj` without metadata and status: what a generation counts changes of.
fn spec_part(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        for k in ["metadata", "status", "apiVersion", "kind"] {
            m.remove(k);
        }
    }
    o
}

fn parse_rv(s: &str) -> Result<u64, Status> {
    s.parse()
        .map_err(|_| Status::bad_request(format!("invalid resource version: {s:?}")))
}

/// Refuses a body that is not an object of `res` (kind and apiVersion, when
/// given, must be the resource's).
pub fn check_type(res: &Resource, obj: &Value) -> Result<(), Status> {
    if !obj.is_object() {
        return Err(Status::bad_request(
            "the body of the request is not a JSON object",
        ));
    }
    if let Some(kind) = obj.get("kind").and_then(Value::as_str)
        && kind != res.kind
    {
        return Err(Status::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            res.kind
        )));
    }
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && !res.versions.iter().any(|v| res.api_version(v) == av)
    {
        return Err(Status::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({})",
            res.api_version(res.storage)
        )));
    }
    Ok(())
}

fn continue_token(rv: u64, last: &Key) -> String {
    let token =
        json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{}/{}\u{0}", last.0, last.1)});
    base64::engine::general_purpose::STANDARD.encode(token.to_string())
}

fn parse_continue(token: &str) -> Result<(u64, Key), Status> {
    let bad = || Status::bad_request(format!("continue key is not valid: {token:?}"));
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
    let start = v.get("start").and_then(Value::as_str).ok_or_else(bad)?;
    let (ns, name) = start
        .trim_end_matches('\u{0}')
        .split_once('/')
        .ok_or_else(bad)?;
    Ok((rv, (ns.to_string(), name.to_string())))
}

impl Store {
    /// An empty store at resourceVersion 1.
    pub fn new() -> Store {
        Store {
            state: Mutex::new(State {
                rv: 1,
                objects: HashMap::new(),
                history: VecDeque::new(),
                history_start: 1,
                history_limit: DEFAULT_HISTORY,
            }),
            events: broadcast::channel(WATCH_BUFFER).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not wedge the server for the others.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// Drops the history: every resourceVersion before now is gone (410).
    pub fn compact(&self) {
        let mut st = self.lock();
        st.history.clear();
        st.history_start = st.rv;
    }

    /// Keeps at most `n` events (at least 1).
    pub fn set_history_limit(&self, n: usize) {
        let mut st = self.lock();
        st.history_limit = n.max(1);
        Self::trim(&mut st);
    }

    fn trim(st: &mut State) {
        while st.history.len() > st.history_limit {
            if let Some(e) = st.history.pop_front() {
                st.history_start = e.rv;
            }
        }
    }

    /// Commits one change at the next resourceVersion and tells the watches.
    fn commit(
        &self,
        st: &mut State,
        res: &'static Resource,
        ty: EventType,
        mut obj: Value,
        prev: Option<Value>,
    ) -> Value {
        st.rv += 1;
        let rv = st.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        let coll = st.objects.entry((res.group, res.plural)).or_default();
        if ty == EventType::Deleted {
            coll.remove(&key_of(&obj));
        } else {
            coll.insert(key_of(&obj), obj.clone());
        }
        let ev = Arc::new(Event {
            rv,
            ty,
            res,
            obj: obj.clone(),
            prev,
        });
        st.history.push_back(ev.clone());
        Self::trim(st);
        // No receiver is not an error: nobody is watching.
        let _ = self.events.send(ev);
        obj
    }

    fn current(st: &State, res: &Resource, key: &Key) -> Option<Value> {
        st.objects.get(&(res.group, res.plural))?.get(key).cloned()
    }

    /// GET of one object.
    pub fn get(
        &self,
        res: &'static Resource,
        version: &str,
        ns: &str,
        name: &str,
    ) -> Result<Value, Status> {
        let st = self.lock();
        Self::current(&st, res, &(ns.to_string(), name.to_string()))
            .map(|o| present(&o, res, version))
            .ok_or_else(|| Status::not_found(res, name))
    }

    /// Whether namespace `ns` exists.
    pub fn namespace_exists(&self, ns: &str) -> bool {
        let st = self.lock();
        st.objects
            .get(&("", "namespaces"))
            .is_some_and(|c| c.contains_key(&(String::new(), ns.to_string())))
    }

    /// CREATE (POST) of `obj` in namespace `ns` (`""` when cluster-scoped).
    pub fn create(
        &self,
        res: &'static Resource,
        version: &str,
        ns: &str,
        obj: Value,
        scope: Scope,
    ) -> Result<Value, Status> {
        let mut st = self.lock();
        self.create_locked(&mut st, res, version, ns, obj, scope)
    }

    fn create_locked(
        &self,
        st: &mut State,
        res: &'static Resource,
        version: &str,
        ns: &str,
        mut obj: Value,
        scope: Scope,
    ) -> Result<Value, Status> {
        check_type(res, &obj)?;
        let meta = meta_mut(&mut obj);
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if name.is_empty() {
            match meta.get("generateName").and_then(Value::as_str) {
                Some(prefix) if !prefix.is_empty() => name = format!("{prefix}{}", name_suffix()),
                _ => {
                    return Err(Status::invalid(
                        res.kind,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ));
                }
            }
        }
        if res.namespaced {
            if let Some(body_ns) = meta.get("namespace").and_then(Value::as_str)
                && !body_ns.is_empty()
                && body_ns != ns
            {
                return Err(Status::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta.insert("namespace".into(), json!(ns));
        } else {
            meta.remove("namespace");
        }
        if scope == Scope::Main
            && meta
                .get("resourceVersion")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
        {
            return Err(Status::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        for k in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "generation",
            "deletionTimestamp",
            "managedFields",
        ] {
            meta.remove(k);
        }
        meta.insert("name".into(), json!(name));
        meta.insert(
            "uid".into(),
            json!(uuid::Uuid::new_v4().hyphenated().to_string()),
        );
        meta.insert(
            "creationTimestamp".into(),
            json!(common::clock::now_rfc3339()),
        );
        if res.generation {
            meta.insert("generation".into(), json!(1));
        }
        if scope == Scope::Main
            && res.status
            && let Some(o) = obj.as_object_mut()
        {
            o.remove("status");
        }
        if res.plural == "namespaces" && res.group.is_empty() {
            // The namespace strategy's defaults.
            let labels = meta_mut(&mut obj)
                .entry("labels")
                .or_insert_with(|| json!({}));
            labels["kubernetes.io/metadata.name"] = json!(name);
            if obj.pointer("/spec/finalizers").is_none() {
                obj["spec"] = json!({"finalizers": ["kubernetes"]});
            }
            if obj.pointer("/status/phase").is_none() {
                obj["status"] = json!({"phase": "Active"});
            }
        }
        obj["apiVersion"] = json!(res.api_version(res.storage));
        obj["kind"] = json!(res.kind);
        let key = (ns.to_string(), name.clone());
        if Self::current(st, res, &key).is_some() {
            return Err(Status::already_exists(res, &name));
        }
        let stored = self.commit(st, res, EventType::Added, obj, None);
        Ok(present(&stored, res, version))
    }

    /// The object that replaces `old` when a write proposes `new`; `None`
    /// when nothing would change (the API then writes nothing).
    fn next_state(
        res: &Resource,
        old: &Value,
        mut new: Value,
        scope: Scope,
    ) -> Result<Option<Value>, Status> {
        check_type(res, &new)?;
        let name = meta_str(old, "name").unwrap_or_default();
        if let Some(n) = meta_str(&new, "name")
            && n != name
        {
            return Err(Status::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        if let Some(n) = meta_str(&new, "namespace")
            && !n.is_empty()
            && Some(n) != meta_str(old, "namespace")
        {
            return Err(Status::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        match scope {
            Scope::Status => {
                let mut o = old.clone();
                match new.get("status") {
                    Some(s) => o["status"] = s.clone(),
                    None => {
                        if let Some(m) = o.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
                new = o;
            }
            Scope::Main if res.status => match old.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("status");
                    }
                }
            },
            Scope::Main | Scope::Whole => {}
        }
        let old_meta = old.get("metadata").cloned().unwrap_or_else(|| json!({}));
        let meta = meta_mut(&mut new);
        meta.remove("resourceVersion");
        for k in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "generation",
        ] {
            match old_meta.get(k) {
                Some(v) => meta.insert(k.into(), v.clone()),
                None => meta.remove(k),
            };
        }
        new["apiVersion"] = json!(res.api_version(res.storage));
        new["kind"] = json!(res.kind);
        if res.generation && spec_part(&new) != spec_part(old) {
            let g = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut new).insert("generation".into(), json!(g + 1));
        }
        Ok((content(&new) != content(old)).then_some(new))
    }

    /// UPDATE (PUT): 409 Conflict when the body's resourceVersion is not
    /// the stored one; an empty one updates unconditionally.
    pub fn update(
        &self,
        res: &'static Resource,
        version: &str,
        ns: &str,
        name: &str,
        obj: Value,
        scope: Scope,
    ) -> Result<Value, Status> {
        let mut st = self.lock();
        let old = Self::current(&st, res, &(ns.to_string(), name.to_string()))
            .ok_or_else(|| Status::not_found(res, name))?;
        if let Some(rv) = meta_str(&obj, "resourceVersion")
            && !rv.is_empty()
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(Status::conflict(res, name));
        }
        if meta_str(&obj, "name").is_none() && scope == Scope::Main {
            return Err(Status::bad_request(format!(
                "the name of the object () does not match the name on the URL ({name})"
            )));
        }
        let stored = match Self::next_state(res, &old, obj, scope)? {
            Some(new) => self.commit(&mut st, res, EventType::Modified, new, Some(old)),
            None => old,
        };
        Ok(present(&stored, res, version))
    }

    /// PATCH. Returns the object and whether it was created (apply only).
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        res: &'static Resource,
        version: &str,
        ns: &str,
        name: &str,
        kind: PatchKind,
        patch: Value,
        scope: Scope,
    ) -> Result<(Value, bool), Status> {
        if !patch.is_object() {
            return Err(Status::bad_request("the patch is not a JSON object"));
        }
        let mut st = self.lock();
        let Some(old) = Self::current(&st, res, &(ns.to_string(), name.to_string())) else {
            if kind == PatchKind::Apply && scope != Scope::Status {
                if let Some(n) = meta_str(&patch, "name")
                    && n != name
                {
                    return Err(Status::bad_request(format!(
                        "the name of the object ({n}) does not match the name on the URL ({name})"
                    )));
                }
                let mut obj = patch;
                meta_mut(&mut obj).insert("name".into(), json!(name));
                let created = self.create_locked(&mut st, res, version, ns, obj, scope)?;
                return Ok((created, true));
            }
            return Err(Status::not_found(res, name));
        };
        if let Some(rv) = meta_str(&patch, "resourceVersion")
            && !rv.is_empty()
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(Status::conflict(res, name));
        }
        let mut new = old.clone();
        merge_patch(&mut new, &patch);
        let stored = match Self::next_state(res, &old, new, scope)? {
            Some(new) => self.commit(&mut st, res, EventType::Modified, new, Some(old)),
            None => old,
        };
        Ok((present(&stored, res, version), false))
    }

    /// DELETE, with the optional uid and resourceVersion preconditions;
    /// the object's dependents are garbage collected ([`gc`]).
    pub fn delete(
        &self,
        res: &'static Resource,
        version: &str,
        ns: &str,
        name: &str,
        preconditions: &Value,
    ) -> Result<Value, Status> {
        self.delete_with(res, version, ns, name, preconditions, false)
    }

    /// DELETE; `orphan` (`propagationPolicy: Orphan`) leaves the
    /// dependents.
    pub fn delete_with(
        &self,
        res: &'static Resource,
        version: &str,
        ns: &str,
        name: &str,
        preconditions: &Value,
        orphan: bool,
    ) -> Result<Value, Status> {
        let mut st = self.lock();
        let old = Self::current(&st, res, &(ns.to_string(), name.to_string()))
            .ok_or_else(|| Status::not_found(res, name))?;
        for k in ["uid", "resourceVersion"] {
            if let Some(want) = preconditions.get(k).and_then(Value::as_str)
                && Some(want) != meta_str(&old, k)
            {
                return Err(Status::conflict(res, name));
            }
        }
        let stored = self.commit(&mut st, res, EventType::Deleted, old.clone(), Some(old));
        if !orphan && let Some(uid) = meta_str(&stored, "uid") {
            let uid = uid.to_string();
            self.collect_dependents(&mut st, &uid);
        }
        Ok(present(&stored, res, version))
    }

    /// The objects of `res` as of `rv`: the current ones with the history
    /// after `rv` undone. `None` when `rv` is older than the history.
    fn snapshot(st: &State, res: &Resource, rv: u64) -> Option<BTreeMap<Key, Value>> {
        let mut objs = st
            .objects
            .get(&(res.group, res.plural))
            .cloned()
            .unwrap_or_default();
        if rv >= st.rv {
            return Some(objs);
        }
        if rv < st.history_start {
            return None;
        }
        for ev in st.history.iter().rev().take_while(|e| e.rv > rv) {
            if ev.res != res {
                continue;
            }
            let key = key_of(&ev.obj);
            match (&ev.ty, &ev.prev) {
                (EventType::Added, _) => {
                    objs.remove(&key);
                }
                (_, Some(prev)) => {
                    objs.insert(key, prev.clone());
                }
                (_, None) => {}
            }
        }
        Some(objs)
    }

    /// LIST, with the API's resourceVersion semantics: unset or `0` is the
    /// current state; `NotOlderThan` (or no match without a limit) the
    /// current state unless it is older than asked (504); `Exact` (or no
    /// match with a limit) the state at that version, 410 once compacted.
    pub fn list(
        &self,
        res: &'static Resource,
        version: &str,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Result<Value, Status> {
        let st = self.lock();
        let rv_param = opts.resource_version.as_deref().filter(|s| !s.is_empty());
        let (at, start) = if let Some(token) = &opts.continue_token {
            if rv_param.is_some() {
                return Err(Status::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            let (rv, start) = parse_continue(token)?;
            (rv, Some(start))
        } else {
            match (rv_param, opts.version_match.as_deref()) {
                (None, Some(_)) => {
                    return Err(Status::invalid(
                        "ListOptions.meta.k8s.io",
                        "",
                        "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
                    ));
                }
                (None, None) | (Some("0"), None | Some("NotOlderThan")) => (st.rv, None),
                (Some("0"), Some("Exact")) => {
                    return Err(Status::invalid(
                        "ListOptions.meta.k8s.io",
                        "",
                        "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                    ));
                }
                (Some(r), m) => {
                    let r = parse_rv(r)?;
                    if r > st.rv {
                        return Err(Status::too_large_resource_version(r, st.rv));
                    }
                    match m {
                        Some("Exact") => (r, None),
                        None if opts.limit.is_some() => (r, None),
                        None | Some("NotOlderThan") => (st.rv, None),
                        Some(other) => {
                            return Err(Status::invalid(
                                "ListOptions.meta.k8s.io",
                                "",
                                format!(
                                    "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
                                ),
                            ));
                        }
                    }
                }
            }
        };
        let objs = Self::snapshot(&st, res, at).ok_or_else(|| {
            if start.is_some() {
                Status::continue_expired()
            } else {
                Status::expired(at, st.history_start)
            }
        })?;
        let selected: Vec<(&Key, &Value)> = objs
            .iter()
            .filter(|(k, _)| start.as_ref().is_none_or(|s| *k > s))
            .filter(|(k, _)| ns.is_none_or(|n| k.0 == n))
            .filter(|(_, o)| opts.labels.matches(o) && opts.fields.matches(o))
            .collect();
        let limit = opts.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let page: Vec<Value> = selected
            .iter()
            .take(limit)
            .map(|(_, o)| present(o, res, version))
            .collect();
        let mut meta = json!({"resourceVersion": at.to_string()});
        if selected.len() > page.len()
            && let Some((last, _)) = selected.get(page.len() - 1)
        {
            meta["continue"] = json!(continue_token(at, last));
            meta["remainingItemCount"] = json!(selected.len() - page.len());
        }
        Ok(json!({
            "kind": format!("{}List", res.kind),
            "apiVersion": res.api_version(version),
            "metadata": meta,
            "items": page,
        }))
    }

    /// Starts a WATCH: `resourceVersion` unset or `0` begins with synthetic
    /// `ADDED` events of the current state; `R` replays the events after R
    /// from the history (410 `Expired` once R is older than the history);
    /// `sendInitialEvents=true` sends the state and then a bookmark marked
    /// `k8s.io/initial-events-end`.
    pub fn watch(
        &self,
        res: &'static Resource,
        version: &str,
        ns: Option<&str>,
        opts: WatchOptions,
    ) -> Result<Watch, Status> {
        let invalid = |m: &str| Status::invalid("ListOptions.meta.k8s.io", "", m.to_string());
        match (opts.send_initial_events, opts.version_match.as_deref()) {
            (Some(true), Some("NotOlderThan")) if !opts.bookmarks => {
                return Err(invalid(
                    "allowWatchBookmarks: Required value: allowWatchBookmarks must be true when sendInitialEvents is set",
                ));
            }
            (Some(_), Some("NotOlderThan")) | (None, None) => {}
            (Some(_), _) => {
                return Err(invalid(
                    "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless resourceVersionMatch is set to \"NotOlderThan\"",
                ));
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
        }
        let rv = match opts.resource_version.as_deref().filter(|s| !s.is_empty()) {
            None | Some("0") => None,
            Some(r) => Some(parse_rv(r)?),
        };
        let st = self.lock();
        // Subscribed under the lock: nothing committed between the initial
        // events and the live ones is lost or sent twice.
        let live = self.events.subscribe();
        let current = |st: &State| -> Vec<Arc<Event>> {
            st.objects
                .get(&(res.group, res.plural))
                .map(|c| {
                    c.values()
                        .map(|o| {
                            Arc::new(Event {
                                rv: rv_of(o),
                                ty: EventType::Added,
                                res,
                                obj: o.clone(),
                                prev: None,
                            })
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let (initial, initial_end, expired) = match (opts.send_initial_events, rv) {
            (Some(true), _) => (current(&st), Some(st.rv), None),
            (Some(false), _) => (Vec::new(), None, None),
            (None, None) => (current(&st), None, None),
            (None, Some(r)) if r < st.history_start => {
                (Vec::new(), None, Some(Status::expired(r, st.history_start)))
            }
            (None, Some(r)) => (
                st.history
                    .iter()
                    .filter(|e| e.rv > r && e.res == res)
                    .cloned()
                    .collect(),
                None,
                None,
            ),
        };
        let start = rv.unwrap_or(0).max(st.rv);
        Ok(Watch {
            start,
            filter: Filter {
                res,
                version: version.to_string(),
                namespace: ns.map(str::to_string),
                labels: opts.labels,
                fields: opts.fields,
            },
            initial,
            initial_end,
            expired,
            live,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_api::resources::find;

    fn cm(name: &str, data: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": data}})
    }

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}, "l": [3]}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}, "l": [3]}));
    }

    #[test]
    fn exact_list_sees_the_past_until_compacted() {
        let s = Store::new();
        let res = find("", "v1", "configmaps").unwrap();
        let a = s
            .create(res, "v1", "ns", cm("a", "1"), Scope::Main)
            .unwrap();
        let at = rv_of(&a);
        s.update(res, "v1", "ns", "a", cm("a", "2"), Scope::Main)
            .unwrap();
        s.create(res, "v1", "ns", cm("b", "1"), Scope::Main)
            .unwrap();
        let opts = ListOptions {
            resource_version: Some(at.to_string()),
            version_match: Some("Exact".into()),
            ..Default::default()
        };
        let past = s.list(res, "v1", None, &opts).unwrap();
        assert_eq!(past["items"].as_array().unwrap().len(), 1);
        assert_eq!(past["items"][0]["data"]["k"], "1");
        s.compact();
        assert_eq!(s.list(res, "v1", None, &opts).unwrap_err().code, 410);
    }

    #[test]
    fn noop_update_writes_nothing() {
        let s = Store::new();
        let res = find("", "v1", "configmaps").unwrap();
        let a = s
            .create(res, "v1", "ns", cm("a", "1"), Scope::Main)
            .unwrap();
        let again = s
            .update(res, "v1", "ns", "a", cm("a", "1"), Scope::Main)
            .unwrap();
        assert_eq!(
            a["metadata"]["resourceVersion"],
            again["metadata"]["resourceVersion"]
        );
    }
}
