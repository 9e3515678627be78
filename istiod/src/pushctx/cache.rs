//! Istio's XDS cache (`pilot/pkg/model/typed_xds_cache.go`): generated
//! clusters, load assignments and route configurations, encoded once and
//! shared by reference with every proxy whose output would be the same.
//!
//! An entry is keyed by its resource name and a hash of what the output was
//! built from (the service's revision, the DestinationRule or
//! VirtualServices chosen, the proxy properties that matter for it), and
//! records the configs it depends on. A push clears exactly the entries that
//! depend on what changed ([`XdsCache::clear`]); a push that may have changed
//! anything clears all ([`XdsCache::clear_all`]). Nothing expires by time. A
//! write made from a push context older than the last clear is dropped, so a
//! slow generator cannot bring back what a clear removed (Istio's token).
//! The cache holds at most `PILOT_XDS_CACHE_SIZE` entries, the least recently
//! used going first.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use common::metrics::{MetricsError, build};
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

use super::Resource;
use crate::model::ObjectKey;

/// Istio's `PILOT_XDS_CACHE_SIZE` default.
pub const DEFAULT_CACHE_SIZE: usize = 60_000;
/// Locks the entries are spread over, so concurrent pushes rarely wait.
const SHARDS: usize = 16;

/// What a cached resource was built from, for invalidation (Istio's
/// `ConfigKey`; a service is named by its host, as Istio names services
/// `ServiceEntry/<namespace>/<host>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Dependency {
    /// A config object (DestinationRule, VirtualService, Sidecar, ...).
    Config(ObjectKey),
    /// A service, by host name.
    Service(String),
}

impl Dependency {
    fn hash64(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }
}

/// A cache key: the resource's type, name and what its output depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// The short type (`CDS`, `EDS`, `RDS`), for `/debug/cachez`.
    pub kind: &'static str,
    name: u64,
    inputs: u64,
}

/// Builds a [`CacheKey`] from the inputs of one resource.
pub struct KeyBuilder {
    kind: &'static str,
    name: u64,
    inputs: DefaultHasher,
}

impl KeyBuilder {
    /// A key for the resource `name` of `kind` (`CDS`, `EDS`, `RDS`).
    pub fn new(kind: &'static str, name: &str) -> Self {
        let mut h = DefaultHasher::new();
        name.hash(&mut h);
        Self {
            kind,
            name: h.finish(),
            inputs: DefaultHasher::new(),
        }
    }

    /// Adds one input the output depends on.
    pub fn with(mut self, input: impl Hash) -> Self {
        input.hash(&mut self.inputs);
        self
    }

    /// Adds one input in place.
    pub fn add(&mut self, input: impl Hash) {
        input.hash(&mut self.inputs);
    }

    /// The key.
    pub fn key(&self) -> CacheKey {
        CacheKey {
            kind: self.kind,
            name: self.name,
            inputs: self.inputs.finish(),
        }
    }
}

/// Which resource types are cached (`PILOT_ENABLE_XDS_CACHE`,
/// `PILOT_ENABLE_CDS_CACHE`, `PILOT_ENABLE_RDS_CACHE`), how many entries at
/// most (`PILOT_XDS_CACHE_SIZE`), and whether the `xds_cache_*` metrics are
/// exported (`PILOT_XDS_CACHE_STATS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSettings {
    /// `PILOT_ENABLE_XDS_CACHE` (EDS, and the switch for the others).
    pub enabled: bool,
    /// `PILOT_ENABLE_CDS_CACHE`.
    pub cds: bool,
    /// `PILOT_ENABLE_RDS_CACHE`.
    pub rds: bool,
    /// `PILOT_XDS_CACHE_SIZE`.
    pub size: usize,
    /// `PILOT_XDS_CACHE_STATS`.
    pub stats: bool,
}

impl Default for CacheSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            cds: true,
            rds: true,
            size: DEFAULT_CACHE_SIZE,
            stats: false,
        }
    }
}

/// Istio's cache metrics (`xds_cache_reads{type=hit|miss}`,
/// `xds_cache_evictions{type=clear|size}`, `xds_cache_size`,
/// `xds_cache_dependent_config_size`), exported with `PILOT_XDS_CACHE_STATS`.
#[derive(Clone)]
pub struct CacheMetrics {
    reads: IntCounterVec,
    evictions: IntCounterVec,
    size: IntGauge,
    dependent_config_size: IntGauge,
}

impl CacheMetrics {
    /// The metrics, registered in `r`.
    pub fn new(r: &Registry) -> Result<Self, MetricsError> {
        Ok(Self {
            reads: build(
                r,
                "xds_cache_reads",
                IntCounterVec::new(
                    Opts::new(
                        "xds_cache_reads",
                        "Total number of xds cache xdsCacheReads.",
                    ),
                    &["type"],
                ),
            )?,
            evictions: build(
                r,
                "xds_cache_evictions",
                IntCounterVec::new(
                    Opts::new(
                        "xds_cache_evictions",
                        "Total number of xds cache evictions.",
                    ),
                    &["type"],
                ),
            )?,
            size: build(
                r,
                "xds_cache_size",
                IntGauge::new("xds_cache_size", "Current size of xds cache"),
            )?,
            dependent_config_size: build(
                r,
                "xds_cache_dependent_config_size",
                IntGauge::new(
                    "xds_cache_dependent_config_size",
                    "Current size of dependent configs",
                ),
            )?,
        })
    }
}

struct Entry {
    value: Arc<Resource>,
    dependencies: Box<[u64]>,
    used: u64,
}

#[derive(Default)]
struct Shard {
    entries: HashMap<CacheKey, Entry>,
    /// Dependency hash -> the keys that depend on it.
    index: HashMap<u64, HashSet<CacheKey>>,
}

impl Shard {
    fn unindex(&mut self, key: &CacheKey, dependencies: &[u64]) {
        for d in dependencies {
            if let Some(keys) = self.index.get_mut(d) {
                keys.remove(key);
                if keys.is_empty() {
                    self.index.remove(d);
                }
            }
        }
    }

    fn remove(&mut self, key: &CacheKey) -> bool {
        match self.entries.remove(key) {
            Some(e) => {
                self.unindex(key, &e.dependencies);
                true
            }
            None => false,
        }
    }

    /// Drops the least recently used tenth (at least one) of the entries.
    fn evict_oldest(&mut self) -> usize {
        let n = (self.entries.len() / 10).max(1);
        let mut by_age: Vec<(u64, CacheKey)> =
            self.entries.iter().map(|(k, e)| (e.used, *k)).collect();
        by_age.select_nth_unstable_by_key(n - 1, |(used, _)| *used);
        by_age.truncate(n);
        for (_, k) in &by_age {
            self.remove(k);
        }
        n
    }
}

/// Counts kept whether or not the metrics are exported (`/debug/cachez`,
/// tests).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Reads that found an entry.
    pub hits: u64,
    /// Reads that did not.
    pub misses: u64,
    /// Entries removed because a dependency changed (or all were cleared).
    pub evictions_clear: u64,
    /// Entries removed to stay within the size.
    pub evictions_size: u64,
    /// Entries held now.
    pub size: u64,
}

/// The cache (one per istiod, shared by every push context).
pub struct XdsCache {
    settings: CacheSettings,
    shards: Box<[Mutex<Shard>]>,
    /// The push sequence of the last clear: older writes are dropped.
    token: AtomicU64,
    /// Recency clock for the LRU.
    clock: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions_clear: AtomicU64,
    evictions_size: AtomicU64,
    metrics: Option<CacheMetrics>,
}

impl std::fmt::Debug for XdsCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdsCache")
            .field("settings", &self.settings)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for XdsCache {
    fn default() -> Self {
        Self::new(CacheSettings::default(), None)
    }
}

impl XdsCache {
    /// An empty cache; `metrics` when `PILOT_XDS_CACHE_STATS` is on.
    pub fn new(settings: CacheSettings, metrics: Option<CacheMetrics>) -> Self {
        Self {
            settings,
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            token: AtomicU64::new(0),
            clock: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions_clear: AtomicU64::new(0),
            evictions_size: AtomicU64::new(0),
            metrics,
        }
    }

    /// A cache that holds nothing (`PILOT_ENABLE_XDS_CACHE=false`).
    pub fn disabled() -> Self {
        Self::new(
            CacheSettings {
                enabled: false,
                ..CacheSettings::default()
            },
            None,
        )
    }

    /// Whether resources of `kind` (`CDS`, `EDS`, `RDS`) are cached.
    pub fn caches(&self, kind: &str) -> bool {
        self.settings.enabled
            && match kind {
                "CDS" => self.settings.cds,
                "RDS" => self.settings.rds,
                _ => true,
            }
    }

    fn shard(&self, key: &CacheKey) -> &Mutex<Shard> {
        let i = (key.name ^ key.inputs) as usize % SHARDS;
        &self.shards[i]
    }

    fn lock<'a>(m: &'a Mutex<Shard>) -> std::sync::MutexGuard<'a, Shard> {
        m.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count_read(&self, hit: bool) {
        let (counter, label) = if hit {
            (&self.hits, "hit")
        } else {
            (&self.misses, "miss")
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = &self.metrics {
            m.reads.with_label_values(&[label]).inc();
        }
    }

    /// Counts `n` reads served from a Sidecar scope's share of the cache
    /// (the resources every proxy of the scope takes as one list).
    pub fn count_shared(&self, n: usize) {
        if !self.settings.enabled || n == 0 {
            return;
        }
        self.hits.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(m) = &self.metrics {
            m.reads.with_label_values(&["hit"]).inc_by(n as u64);
        }
    }

    /// The entry for `key`, if it holds a resource named `name`.
    pub fn get(&self, key: &CacheKey, name: &str) -> Option<Arc<Resource>> {
        if !self.caches(key.kind) {
            return None;
        }
        let used = self.clock.fetch_add(1, Ordering::Relaxed);
        let found = {
            let mut shard = Self::lock(self.shard(key));
            shard.entries.get_mut(key).and_then(|e| {
                // The name is compared, not only its hash.
                (e.value.name == name).then(|| {
                    e.used = used;
                    e.value.clone()
                })
            })
        };
        self.count_read(found.is_some());
        found
    }

    /// Stores `value` for `key`, unless the cache was cleared by a push newer
    /// than `token` (the push context that generated it).
    pub fn insert(
        &self,
        key: CacheKey,
        dependencies: &[Dependency],
        value: Arc<Resource>,
        token: u64,
    ) {
        if !self.caches(key.kind) || token < self.token.load(Ordering::Acquire) {
            return;
        }
        let dependencies: Box<[u64]> = dependencies.iter().map(Dependency::hash64).collect();
        let used = self.clock.fetch_add(1, Ordering::Relaxed);
        let per_shard = (self.settings.size / SHARDS).max(1);
        let mut evicted = 0;
        {
            let mut shard = Self::lock(self.shard(&key));
            shard.remove(&key);
            for d in dependencies.iter() {
                shard.index.entry(*d).or_default().insert(key);
            }
            shard.entries.insert(
                key,
                Entry {
                    value,
                    dependencies,
                    used,
                },
            );
            if shard.entries.len() > per_shard {
                evicted = shard.evict_oldest();
            }
        }
        if evicted > 0 {
            self.evictions_size
                .fetch_add(evicted as u64, Ordering::Relaxed);
            if let Some(m) = &self.metrics {
                m.evictions
                    .with_label_values(&["size"])
                    .inc_by(evicted as u64);
            }
        }
        self.record_size();
    }

    /// The cached resource for `key`, else `build()`'s, stored with its
    /// dependencies.
    pub fn get_or_build(
        &self,
        key: CacheKey,
        name: &str,
        token: u64,
        dependencies: impl FnOnce() -> Vec<Dependency>,
        build: impl FnOnce() -> Resource,
    ) -> Arc<Resource> {
        if let Some(hit) = self.get(&key, name) {
            return hit;
        }
        let value = Arc::new(build());
        if self.caches(key.kind) {
            self.insert(key, &dependencies(), value.clone(), token);
        }
        value
    }

    fn advance(&self, token: u64) {
        self.token.fetch_max(token, Ordering::AcqRel);
    }

    /// Removes every entry that depends on one of `changed`; writes from push
    /// contexts older than `token` are dropped from now on.
    pub fn clear(&self, changed: &[Dependency], token: u64) {
        self.advance(token);
        let hashes: Vec<u64> = changed.iter().map(Dependency::hash64).collect();
        let mut removed = 0u64;
        for shard in self.shards.iter() {
            let mut shard = Self::lock(shard);
            for h in &hashes {
                let Some(keys) = shard.index.remove(h) else {
                    continue;
                };
                for k in keys {
                    if shard.remove(&k) {
                        removed += 1;
                    }
                }
            }
        }
        self.count_clear(removed);
    }

    /// Removes every entry (Istio's `ClearAll`, on pushes that may have
    /// changed anything).
    pub fn clear_all(&self, token: u64) {
        self.advance(token);
        let mut removed = 0u64;
        for shard in self.shards.iter() {
            let mut shard = Self::lock(shard);
            removed += shard.entries.len() as u64;
            *shard = Shard::default();
        }
        self.count_clear(removed);
    }

    fn count_clear(&self, removed: u64) {
        self.evictions_clear.fetch_add(removed, Ordering::Relaxed);
        if let Some(m) = &self.metrics
            && removed > 0
        {
            m.evictions.with_label_values(&["clear"]).inc_by(removed);
        }
        self.record_size();
    }

    fn record_size(&self) {
        if let Some(m) = &self.metrics {
            let (size, deps) = self.sizes();
            m.size.set(size as i64);
            m.dependent_config_size.set(deps as i64);
        }
    }

    /// (entries, dependency index entries).
    fn sizes(&self) -> (usize, usize) {
        self.shards.iter().fold((0, 0), |(e, d), s| {
            let s = Self::lock(s);
            (
                e + s.entries.len(),
                d + s.index.values().map(HashSet::len).sum::<usize>(),
            )
        })
    }

    /// The counts so far.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions_clear: self.evictions_clear.load(Ordering::Relaxed),
            evictions_size: self.evictions_size.load(Ordering::Relaxed),
            size: self.sizes().0 as u64,
        }
    }

    /// Entries per type (`/debug/cachez`).
    pub fn sizes_by_kind(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let mut out = std::collections::BTreeMap::new();
        for s in self.shards.iter() {
            for k in Self::lock(s).entries.keys() {
                *out.entry(k.kind).or_default() += 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::meta::Kind;
    use proto::pb::google::protobuf::Any;

    fn resource(name: &str, body: &str) -> Resource {
        Resource::new(
            name.to_string(),
            Any {
                type_url: "t".into(),
                value: body.as_bytes().to_vec(),
            },
        )
    }

    fn dr(name: &str) -> Dependency {
        Dependency::Config(ObjectKey::new(Kind::DestinationRule, "demo", name))
    }

    #[test]
    fn a_hit_shares_the_stored_bytes_and_is_counted() {
        let cache = XdsCache::default();
        let key = KeyBuilder::new("CDS", "c1").with(1u64).key();
        let first = cache.get_or_build(key, "c1", 1, Vec::new, || resource("c1", "a"));
        let second = cache.get_or_build(key, "c1", 1, Vec::new, || resource("c1", "b"));
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(second.resource.value, b"a");
        let s = cache.stats();
        assert_eq!((s.hits, s.misses, s.size), (1, 1, 1));
    }

    #[test]
    fn clear_removes_only_dependents_and_drops_older_writes() {
        let cache = XdsCache::default();
        let a = KeyBuilder::new("CDS", "a").key();
        let b = KeyBuilder::new("CDS", "b").key();
        cache.insert(a, &[dr("x")], Arc::new(resource("a", "1")), 1);
        cache.insert(b, &[dr("y")], Arc::new(resource("b", "1")), 1);
        cache.clear(&[dr("x")], 2);
        assert!(cache.get(&a, "a").is_none());
        assert!(cache.get(&b, "b").is_some());
        // A generator still working from push 1 cannot bring `a` back.
        cache.insert(a, &[dr("x")], Arc::new(resource("a", "1")), 1);
        assert!(cache.get(&a, "a").is_none());
        cache.insert(a, &[dr("x")], Arc::new(resource("a", "2")), 2);
        assert_eq!(cache.get(&a, "a").unwrap().resource.value, b"2");
        assert_eq!(cache.stats().evictions_clear, 1);
        cache.clear_all(3);
        assert_eq!(cache.stats().size, 0);
    }

    #[test]
    fn a_name_hash_collision_is_a_miss() {
        let cache = XdsCache::default();
        let key = KeyBuilder::new("EDS", "a").key();
        cache.insert(key, &[], Arc::new(resource("a", "1")), 1);
        assert!(cache.get(&key, "not-a").is_none());
    }

    #[test]
    fn the_size_bound_evicts_the_least_recently_used() {
        let cache = XdsCache::new(
            CacheSettings {
                size: SHARDS * 10,
                ..CacheSettings::default()
            },
            None,
        );
        for i in 0..SHARDS * 40 {
            let name = format!("c{i}");
            let key = KeyBuilder::new("CDS", &name).key();
            cache.insert(key, &[dr(&name)], Arc::new(resource(&name, "x")), 1);
        }
        let s = cache.stats();
        assert!(s.size <= (SHARDS * 10) as u64, "{s:?}");
        assert!(s.evictions_size > 0);
        // The index forgets evicted entries too.
        assert!(cache.sizes().1 <= (SHARDS * 10));
    }

    #[test]
    fn disabled_types_are_built_every_time() {
        let cache = XdsCache::new(
            CacheSettings {
                rds: false,
                ..CacheSettings::default()
            },
            None,
        );
        let key = KeyBuilder::new("RDS", "80").key();
        let a = cache.get_or_build(key, "80", 1, Vec::new, || resource("80", "a"));
        let b = cache.get_or_build(key, "80", 1, Vec::new, || resource("80", "b"));
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!(cache.stats().size, 0);
    }
}
