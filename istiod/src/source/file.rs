//! The file config source (`--configDir`): a directory of Kubernetes-style
//! YAML, read recursively and re-read when anything in it changes, as Istio's
//! file controller does (`.yaml`/`.yml` only, multi-document, unknown kinds
//! ignored, every object validated, 250 ms debounce).
//!
//! A file that fails to parse or validate is rejected as a whole: its errors
//! are logged and kept for [`FileSource::errors`], and the objects it defined
//! before keep serving until it is fixed. Other files apply normally. Entries
//! whose names start with `.` are skipped, so a Kubernetes ConfigMap mount
//! (`..data` and timestamped directories behind symlinks) is read once.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::Synced;
use prometheus::IntCounterVec;

use crate::model::revision::InRevision;
use crate::model::{
    ConfigBatch, ConfigError, ConfigStore, IgnoredKind, Object, ObjectKey, parse_file,
};

/// Quiet time after the last change before the directory is re-read (Istio's 250 ms).
pub const DEBOUNCE: Duration = Duration::from_millis(250);
/// Longest a directory that never stops changing delays a re-read.
pub const DEBOUNCE_MAX: Duration = Duration::from_secs(5);

/// Why the directory cannot be used at all.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The directory is missing or unreadable.
    #[error("config directory {dir}: {reason} (create it, or correct --configDir)")]
    Dir {
        /// The directory.
        dir: String,
        /// What is wrong.
        reason: String,
    },
    /// The directory cannot be watched.
    #[error(
        "cannot watch config directory {dir}: {reason} (if the inotify limit is reached, raise fs.inotify.max_user_watches or max_user_instances)"
    )]
    Watch {
        /// The directory.
        dir: String,
        /// The watcher's error.
        reason: String,
    },
    /// The blocking reload task failed.
    #[error("re-reading {dir} failed: {reason}")]
    Task {
        /// The directory.
        dir: String,
        /// The task's error.
        reason: String,
    },
}

/// What one file last contributed.
#[derive(Debug, Clone, Default)]
struct FileState {
    /// Hash of the content last parsed (unchanged files are not re-parsed).
    hash: Option<u64>,
    /// The objects of the last content that was valid.
    objects: Vec<Arc<Object>>,
    /// Why the current content is rejected (empty when it is valid).
    errors: Vec<ConfigError>,
    /// Documents of kinds istiod does not read, in the last parsed content.
    ignored: Vec<IgnoredKind>,
}

#[derive(Debug, Default)]
struct State {
    files: BTreeMap<PathBuf, FileState>,
    /// Errors not tied to one file's content (unreadable directory, duplicates).
    other_errors: Vec<ConfigError>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    store: ConfigStore,
    state: Mutex<State>,
    /// Serialises reloads; `state` is only held to read or swap.
    reload: Mutex<()>,
    synced: Synced,
    /// `pilot_total_rejected_configs{type,name}`, when istiod exports it.
    rejected: Option<IntCounterVec>,
    /// This istiod's revision: config of another is not stored.
    revision: Mutex<InRevision>,
}

/// The file source. Cheap to clone; clones share state.
#[derive(Debug, Clone)]
pub struct FileSource {
    inner: Arc<Inner>,
}

impl FileSource {
    /// A source for `dir` that writes to `store`. Nothing is read until
    /// [`reload`](Self::reload) or [`watch`](Self::watch).
    pub fn new(dir: impl Into<PathBuf>, store: ConfigStore) -> Self {
        Self {
            inner: Arc::new(Inner {
                dir: dir.into(),
                store,
                state: Mutex::new(State::default()),
                reload: Mutex::new(()),
                synced: Synced::new(),
                rejected: None,
                revision: Mutex::new(InRevision::default()),
            }),
        }
    }

    /// The source, counting what it rejects or ignores in `rejected`
    /// (Istio's `pilot_total_rejected_configs{type,name}`).
    pub fn with_metrics(
        dir: impl Into<PathBuf>,
        store: ConfigStore,
        rejected: IntCounterVec,
    ) -> Self {
        let mut source = Self::new(dir, store);
        if let Some(inner) = Arc::get_mut(&mut source.inner) {
            inner.rejected = Some(rejected);
        }
        source
    }

    /// Keeps only config of `revision` (and its tags) from the next
    /// [`reload`](Self::reload) on.
    pub fn set_revision(&self, revision: InRevision) {
        *self
            .inner
            .revision
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = revision;
    }

    /// The documents whose kind this istiod does not implement although it
    /// is Istio configuration (WasmPlugin, BackendTLSPolicy, ...), with
    /// their file: stored nowhere and applied to nothing, so reported.
    pub fn unimplemented(&self) -> Vec<(String, IgnoredKind)> {
        let state = self
            .inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state
            .files
            .iter()
            .flat_map(|(path, f)| {
                f.ignored
                    .iter()
                    .filter(|k| k.is_unimplemented_config())
                    .map(move |k| (path.display().to_string(), k.clone()))
            })
            .collect()
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The store this source writes to.
    pub fn store(&self) -> &ConfigStore {
        &self.inner.store
    }

    /// Whether the first full load is done.
    pub fn has_synced(&self) -> bool {
        self.inner.synced.has_synced()
    }

    /// Waits until the first full load is done.
    pub async fn wait_synced(&self) {
        self.inner.synced.wait().await
    }

    /// The current errors: every rejected file's problems (their previous
    /// objects keep serving), duplicate definitions, an unreadable directory.
    /// Empty when everything in the directory is applied.
    pub fn errors(&self) -> Vec<ConfigError> {
        let state = self
            .inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state
            .files
            .values()
            .flat_map(|f| f.errors.iter().cloned())
            .chain(state.other_errors.iter().cloned())
            .collect()
    }

    /// Reads the directory now (blocking I/O) and applies what changed to the
    /// store; returns the batch of changes, if any. Fails only when the
    /// directory itself cannot be read, which leaves every object serving.
    pub fn reload(&self) -> Result<Option<ConfigBatch>, SourceError> {
        let _serial = self
            .inner
            .reload
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let dir = &self.inner.dir;
        let previous = {
            let state = self
                .inner
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            state.files.clone()
        };
        let listed = match list_yaml_files(dir) {
            Ok(listed) => listed,
            Err(e) => {
                tracing::warn!(target: "config", "{e}; keeping the objects already loaded");
                let mut state = self
                    .inner
                    .state
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                state.other_errors = vec![ConfigError::Read {
                    file: dir.display().to_string(),
                    reason: e.to_string(),
                }];
                return Err(e);
            }
        };

        let mut files = BTreeMap::new();
        let mut other_errors = listed.errors;
        for path in listed.files {
            let old = previous.get(&path).cloned().unwrap_or_default();
            files.insert(
                path.clone(),
                read_file(&path, old, self.inner.rejected.as_ref()),
            );
        }
        for gone in previous.keys().filter(|p| !files.contains_key(*p)) {
            tracing::info!(target: "config", "{} was removed; its objects are deleted", gone.display());
        }

        // The first file (in path order) that defines an object wins.
        let mut objects: BTreeMap<ObjectKey, (Arc<Object>, &Path)> = BTreeMap::new();
        let revision = self
            .inner
            .revision
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for (path, file) in &files {
            for object in file.objects.iter().filter(|o| revision.admits(o)) {
                let key = object.key();
                if let Some((_, first)) = objects.get(&key) {
                    let e = ConfigError::Duplicate {
                        file: path.display().to_string(),
                        object: key,
                        first: first.display().to_string(),
                    };
                    tracing::warn!(target: "config", "{e}");
                    other_errors.push(e);
                } else {
                    objects.insert(key, (object.clone(), path));
                }
            }
        }
        let batch = self
            .inner
            .store
            .replace(objects.into_values().map(|(o, _)| o));
        if let Some(batch) = &batch {
            let count = |c| batch.events.iter().filter(|e| e.change == c).count();
            tracing::info!(
                target: "config",
                "applied {}: {} added, {} updated, {} deleted ({} objects in total)",
                dir.display(),
                count(crate::model::Change::Add),
                count(crate::model::Change::Update),
                count(crate::model::Change::Delete),
                batch.snapshot.len()
            );
        }
        {
            let mut state = self
                .inner
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            state.files = files;
            state.other_errors = other_errors;
        }
        self.inner.synced.mark();
        Ok(batch)
    }

    /// Watches the directory and re-reads it after every change (debounced
    /// by [`DEBOUNCE`]) until `shutdown` becomes true. Does a full read once
    /// the watch is in place, so nothing that changed before is missed.
    pub async fn watch(self, mut shutdown: watch::Receiver<bool>) -> Result<(), SourceError> {
        let dir = self.inner.dir.clone();
        if !dir.is_dir() {
            return Err(SourceError::Dir {
                dir: dir.display().to_string(),
                reason: "not a directory".into(),
            });
        }
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            match res {
                Ok(event) if is_change(&event.kind) => {
                    let _ = tx.send(());
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(target: "config", "file watch error: {e}");
                    // Re-read anyway: an overflowed queue means lost events.
                    let _ = tx.send(());
                }
            }
        })
        .map_err(|e| SourceError::Watch {
            dir: dir.display().to_string(),
            reason: e.to_string(),
        })?;
        watcher
            .watch(&dir, RecursiveMode::Recursive)
            .map_err(|e| SourceError::Watch {
                dir: dir.display().to_string(),
                reason: e.to_string(),
            })?;
        tracing::info!(target: "config", "watching {} for config changes", dir.display());
        self.reload_in_background().await?;
        debounce(&mut rx, &mut shutdown, DEBOUNCE, DEBOUNCE_MAX, || async {
            // A failed read was logged and leaves every object serving.
            let _ = self.reload_in_background().await;
        })
        .await;
        drop(watcher);
        Ok(())
    }

    async fn reload_in_background(&self) -> Result<Option<ConfigBatch>, SourceError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.reload())
            .await
            .map_err(|e| SourceError::Task {
                dir: self.inner.dir.display().to_string(),
                reason: e.to_string(),
            })?
    }
}

/// Whether a watch event can change what the directory holds. Our own reads
/// produce open/close events, which must not trigger another read.
fn is_change(kind: &EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// Waits for a first event, then for `quiet` without events (at most `max`
/// after the first), then calls `fire`; until `shutdown` becomes true or the
/// event channel closes.
async fn debounce<F, Fut>(
    rx: &mut mpsc::UnboundedReceiver<()>,
    shutdown: &mut watch::Receiver<bool>,
    quiet: Duration,
    max: Duration,
    mut fire: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    loop {
        if *shutdown.borrow() {
            return;
        }
        tokio::select! {
            ev = rx.recv() => if ev.is_none() { return },
            r = shutdown.changed() => if r.is_err() || *shutdown.borrow() { return } else { continue },
        }
        let first = Instant::now();
        let mut deadline = first + quiet;
        loop {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some(()) => deadline = (Instant::now() + quiet).min(first + max),
                    None => break,
                },
                _ = tokio::time::sleep_until(deadline) => break,
                r = shutdown.changed() => if r.is_err() || *shutdown.borrow() { return },
            }
        }
        fire().await;
    }
}

struct Listed {
    files: Vec<PathBuf>,
    errors: Vec<ConfigError>,
}

/// Every `.yaml`/`.yml` regular file (or symlink to one) under `dir`,
/// sorted, skipping entries whose names start with `.`.
fn list_yaml_files(dir: &Path) -> Result<Listed, SourceError> {
    let meta = std::fs::metadata(dir).map_err(|e| SourceError::Dir {
        dir: dir.display().to_string(),
        reason: e.to_string(),
    })?;
    if !meta.is_dir() {
        return Err(SourceError::Dir {
            dir: dir.display().to_string(),
            reason: "not a directory".into(),
        });
    }
    let mut files = Vec::new();
    let mut errors = Vec::new();
    let walk = walkdir::WalkDir::new(dir)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| e.depth() == 0 || !e.file_name().to_string_lossy().starts_with('.'));
    for entry in walk {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                let file = e
                    .path()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| dir.display().to_string());
                tracing::warn!(target: "config", "{file}: {e}");
                errors.push(ConfigError::Read {
                    file,
                    reason: e.to_string(),
                });
                continue;
            }
        };
        let path = entry.path();
        let is_yaml = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        );
        if !is_yaml {
            continue;
        }
        let is_file = entry.file_type().is_file()
            || (entry.file_type().is_symlink() && path.metadata().is_ok_and(|m| m.is_file()));
        if is_file {
            files.push(path.to_path_buf());
        }
    }
    files.sort();
    Ok(Listed { files, errors })
}

/// Reads and parses one file; on any error keeps `old`'s objects. Kinds it
/// holds that istiod does not implement are reported when the content is read.
fn read_file(path: &Path, old: FileState, rejected: Option<&IntCounterVec>) -> FileState {
    let name = path.display().to_string();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            let error = ConfigError::Read {
                file: name,
                reason: e.to_string(),
            };
            tracing::warn!(target: "config", "{error}; keeping the {} objects it defined before", old.objects.len());
            return FileState {
                hash: None,
                objects: old.objects,
                errors: vec![error],
                ignored: old.ignored,
            };
        }
    };
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    let hash = hasher.finish();
    if old.hash == Some(hash) {
        return old;
    }
    match parse_file(&name, &text) {
        Ok(parsed) => {
            tracing::debug!(target: "config", "{name}: {} objects", parsed.objects.len());
            for kind in parsed
                .ignored
                .iter()
                .filter(|k| k.is_unimplemented_config())
            {
                tracing::warn!(
                    target: "config",
                    "{name}: {} ({}) is not implemented by this istiod: its objects are not applied",
                    kind.kind,
                    kind.api_version
                );
                if let Some(counter) = rejected {
                    counter
                        .with_label_values(&[kind.kind.as_str(), name.as_str()])
                        .inc();
                }
            }
            FileState {
                hash: Some(hash),
                objects: parsed.objects.into_iter().map(Arc::new).collect(),
                errors: Vec::new(),
                ignored: parsed.ignored,
            }
        }
        Err(errors) => {
            for e in &errors {
                tracing::warn!(target: "config", "rejected: {e}");
                if let Some(counter) = rejected {
                    let kind = e.object().map_or("", |k| k.kind.as_str());
                    counter.with_label_values(&[kind, name.as_str()]).inc();
                }
            }
            tracing::warn!(
                target: "config",
                "{name} is rejected; the {} objects it defined before keep serving until it is fixed",
                old.objects.len()
            );
            FileState {
                hash: Some(hash),
                objects: old.objects,
                errors,
                ignored: old.ignored,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use tokio::sync::broadcast;

    use super::*;
    use crate::model::{Kind, ServiceRegistry, istio::VirtualService};

    fn write(dir: &Path, rel: &str, content: &str) {
        let path = dir.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    fn vs(name: &str, host: &str) -> String {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: demo}}\nspec:\n  hosts: [{host}]\n  http: [{{route: [{{destination: {{host: {host}}}}}]}}]\n"
        )
    }

    fn dr(name: &str, host: &str) -> String {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: demo}}\nspec: {{host: {host}}}\n"
        )
    }

    fn keys(source: &FileSource) -> Vec<String> {
        let snap = source.store().snapshot();
        Kind::ALL
            .iter()
            .flat_map(|k| snap.objects(*k))
            .map(|o| o.key().to_string())
            .collect()
    }

    fn vs_host(source: &FileSource, name: &str) -> String {
        let snap = source.store().snapshot();
        snap.get_typed::<VirtualService>("demo", name)
            .map(|v| v.spec.hosts[0].clone())
            .unwrap_or_default()
    }

    fn events(batch: &ConfigBatch) -> Vec<String> {
        batch.events.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn loads_yaml_files_recursively_with_several_documents() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write(
            dir,
            "a.yaml",
            &format!("{}---\n{}", vs("a", "a"), dr("a", "a")),
        );
        write(dir, "nested/deeper/b.yml", &vs("b", "b"));
        write(
            dir,
            "nested/filter.yaml",
            "apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata: {name: g, namespace: demo}\nspec: {}\n",
        );
        // Not YAML by name, hidden, or an editor's backup: not read.
        write(dir, "c.json", &vs("c", "c"));
        write(dir, "notes.txt", "not config");
        write(dir, ".hidden/d.yaml", &vs("d", "d"));
        write(dir, "a.yaml~", &vs("e", "e"));

        let source = FileSource::new(dir, ConfigStore::new());
        assert!(!source.has_synced());
        let batch = source.reload().unwrap().unwrap();
        assert!(source.has_synced());
        assert_eq!(
            events(&batch),
            vec![
                "add VirtualService/demo/a",
                "add VirtualService/demo/b",
                "add DestinationRule/demo/a"
            ]
        );
        assert_eq!(
            keys(&source),
            vec![
                "VirtualService/demo/a",
                "VirtualService/demo/b",
                "DestinationRule/demo/a"
            ]
        );
        assert!(source.errors().is_empty(), "{:?}", source.errors());
        // Nothing changed: nothing is published.
        assert!(source.reload().unwrap().is_none());
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("nope");
        let source = FileSource::new(&missing, ConfigStore::new());
        let err = source.reload().unwrap_err().to_string();
        assert!(err.contains(&missing.display().to_string()), "{err}");
        assert!(err.contains("correct --configDir"), "{err}");
        assert!(!source.has_synced());
    }

    #[test]
    fn a_bad_file_keeps_its_previous_objects_while_other_files_update() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write(
            dir,
            "a.yaml",
            &format!("{}---\n{}", vs("a", "old"), vs("a2", "a2")),
        );
        write(dir, "b.yaml", &vs("b", "old"));
        let source = FileSource::new(dir, ConfigStore::new());
        source.reload().unwrap();

        // a.yaml: a changed host, a new object, and weights that do not add up.
        let bad = format!(
            "{}---\n{}---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: split, namespace: demo}}\nspec:\n  hosts: [s]\n  http:\n  - route:\n    - destination: {{host: s, subset: v1}}\n      weight: 80\n    - destination: {{host: s, subset: v2}}\n      weight: 30\n",
            vs("a", "new"),
            vs("a2", "a2")
        );
        write(dir, "a.yaml", &bad);
        write(dir, "b.yaml", &vs("b", "new"));
        let batch = source.reload().unwrap().unwrap();
        assert_eq!(events(&batch), vec!["update VirtualService/demo/b"]);
        assert_eq!(
            vs_host(&source, "a"),
            "old",
            "a.yaml's last good state serves"
        );
        assert_eq!(vs_host(&source, "a2"), "a2");
        assert_eq!(vs_host(&source, "b"), "new");
        assert_eq!(vs_host(&source, "split"), "");

        let errors = source.errors();
        assert_eq!(errors.len(), 1, "{errors:?}");
        let file = dir.join("a.yaml").display().to_string();
        assert_eq!(errors[0].file(), file);
        assert_eq!(
            errors[0].to_string(),
            format!(
                "{file}: VirtualService/demo/split: spec.http[0].route[1].weight: the weights of the 2 destinations add up to 110, not 100 (adjust them so they add up to 100)"
            )
        );

        // Unparseable YAML is rejected the same way.
        write(dir, "a.yaml", "apiVersion: v1\nkind: [\n");
        assert!(source.reload().unwrap().is_none());
        assert_eq!(vs_host(&source, "a"), "old");
        assert!(source.errors()[0].to_string().contains("invalid YAML"));

        // Fixed: applied, and the error is gone.
        write(dir, "a.yaml", &vs("a", "new"));
        let batch = source.reload().unwrap().unwrap();
        assert_eq!(
            events(&batch),
            vec![
                "update VirtualService/demo/a",
                "delete VirtualService/demo/a2"
            ]
        );
        assert!(source.errors().is_empty());
    }

    #[test]
    fn emptied_and_removed_files_delete_their_objects() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write(dir, "a.yaml", &vs("a", "a"));
        write(dir, "b.yaml", &dr("b", "b"));
        let source = FileSource::new(dir, ConfigStore::new());
        source.reload().unwrap();
        write(dir, "a.yaml", "");
        fs::remove_file(dir.join("b.yaml")).unwrap();
        let batch = source.reload().unwrap().unwrap();
        assert_eq!(
            events(&batch),
            vec![
                "delete VirtualService/demo/a",
                "delete DestinationRule/demo/b"
            ]
        );
        assert!(keys(&source).is_empty());
    }

    #[test]
    fn config_of_another_revision_is_not_loaded_and_is_no_error() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let labelled = |name: &str, rev: &str| {
            vs(name, name).replace(
                "namespace: demo}",
                &format!("namespace: demo, labels: {{istio.io/rev: {rev}}}}}"),
            )
        };
        write(
            dir,
            "a.yaml",
            &format!(
                "{}---\n{}---\n{}",
                labelled("mine", "canary"),
                labelled("theirs", "default"),
                vs("global", "global")
            ),
        );
        let source = FileSource::new(dir, ConfigStore::new());
        source.set_revision(InRevision::new("canary"));
        source.reload().unwrap();
        assert_eq!(
            keys(&source),
            vec!["VirtualService/demo/global", "VirtualService/demo/mine"]
        );
        assert!(source.errors().is_empty(), "{:?}", source.errors());
        // The default revision's tag `stable` now points here.
        source.set_revision(InRevision::new("canary").with_tags(["default".to_string()].into()));
        source.reload().unwrap();
        assert_eq!(keys(&source).len(), 3);
    }

    #[test]
    fn an_object_defined_twice_comes_from_the_first_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write(dir, "1.yaml", &vs("a", "first"));
        write(dir, "2.yaml", &vs("a", "second"));
        let source = FileSource::new(dir, ConfigStore::new());
        source.reload().unwrap();
        assert_eq!(vs_host(&source, "a"), "first");
        let errors = source.errors();
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0]
                .to_string()
                .contains("VirtualService/demo/a is already defined in"),
            "{errors:?}"
        );
    }

    #[test]
    fn the_sample_mesh_loads_without_errors() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/mesh");
        let source = FileSource::new(&dir, ConfigStore::new());
        source.reload().unwrap();
        assert!(source.errors().is_empty(), "{:?}", source.errors());
        assert_eq!(
            keys(&source),
            vec![
                "VirtualService/demo/httpbin",
                "DestinationRule/demo/httpbin",
                "PeerAuthentication/demo/default",
                "Service/demo/httpbin",
                "Service/demo/sleep",
                "EndpointSlice/demo/httpbin-4c5d6",
                "EndpointSlice/demo/sleep-1a2b3",
                "Pod/demo/httpbin-v1",
                "Pod/demo/httpbin-v2",
                "Pod/demo/sleep-1",
                "Namespace/demo",
            ]
        );
        let snap = source.store().snapshot();
        let vs = snap.get_typed::<VirtualService>("demo", "httpbin").unwrap();
        let weights: Vec<_> = vs.spec.http[0]
            .route
            .iter()
            .map(|r| (r.destination.subset.as_str(), r.weight))
            .collect();
        assert_eq!(weights, vec![("v1", Some(90)), ("v2", Some(10))]);
        let reg = ServiceRegistry::build(&snap, &Default::default());
        let sleep = reg
            .by_hostname("sleep.demo.svc.cluster.local")
            .next()
            .unwrap();
        assert_eq!(sleep.endpoints[0].address, "198.18.0.2");
    }

    async fn next_batch(
        rx: &mut broadcast::Receiver<ConfigBatch>,
        want: impl Fn(&[String]) -> bool,
    ) -> Vec<String> {
        let wait = async {
            loop {
                let batch = rx.recv().await.unwrap();
                let ev = events(&batch);
                if want(&ev) {
                    return ev;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("no matching change within 10s")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watching_publishes_add_update_delete_on_file_edits() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        write(&dir, "a.yaml", &vs("a", "a"));
        let store = ConfigStore::new();
        let mut rx = store.subscribe();
        let source = FileSource::new(&dir, store);
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let task = tokio::spawn(source.clone().watch(shutdown_rx));
        tokio::time::timeout(Duration::from_secs(10), source.wait_synced())
            .await
            .expect("not synced within 10s");
        assert_eq!(
            next_batch(&mut rx, |_| true).await,
            vec!["add VirtualService/demo/a"]
        );

        write(&dir, "sub/b.yaml", &dr("b", "b"));
        next_batch(&mut rx, |e| e == ["add DestinationRule/demo/b"]).await;
        write(&dir, "a.yaml", &vs("a", "changed"));
        next_batch(&mut rx, |e| e == ["update VirtualService/demo/a"]).await;
        assert_eq!(vs_host(&source, "a"), "changed");
        fs::remove_file(dir.join("a.yaml")).unwrap();
        next_batch(&mut rx, |e| e == ["delete VirtualService/demo/a"]).await;

        // A bad edit is reported and changes nothing.
        write(
            &dir,
            "sub/b.yaml",
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: b, namespace: demo}\nspec: {}\n",
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while source.errors().is_empty() {
            assert!(Instant::now() < deadline, "the bad edit was not reported");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(source.errors()[0].field(), Some("spec.host"));
        assert_eq!(keys(&source), vec!["DestinationRule/demo/b"]);

        shutdown_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the watch did not stop")
            .unwrap()
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn debounce_waits_for_quiet_and_caps_the_delay() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (shutdown_tx, mut shutdown) = watch::channel(false);
        let (fired_tx, mut fired) = mpsc::unbounded_channel();
        let start = Instant::now();
        let task = tokio::spawn(async move {
            debounce(&mut rx, &mut shutdown, DEBOUNCE, DEBOUNCE_MAX, || {
                let _ = fired_tx.send(start.elapsed());
                async {}
            })
            .await
        });
        let ms = Duration::from_millis;

        // A burst: one reload, 250ms after the last event.
        for _ in 0..3 {
            tx.send(()).unwrap();
            tokio::time::sleep(ms(100)).await;
        }
        assert_eq!(fired.recv().await, Some(ms(450)));

        // Events every 200ms for 8s: reloads every DEBOUNCE_MAX, not never.
        let burst_start = start.elapsed();
        for _ in 0..40 {
            tx.send(()).unwrap();
            tokio::time::sleep(ms(200)).await;
        }
        assert_eq!(fired.recv().await, Some(burst_start + DEBOUNCE_MAX));

        shutdown_tx.send(true).unwrap();
        task.await.unwrap();
    }
}
