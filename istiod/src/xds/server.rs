//! The discovery server: what every ADS stream shares. Admission (ready,
//! the new-stream rate limit, authentication), the connected proxies and
//! their per-type status (`/debug/syncz`), the push throttle
//! (`PILOT_PUSH_THROTTLE`) and send timeout (`PILOT_XDS_SEND_TIMEOUT`), and
//! each push's plan for one proxy (Istio's `ProxyNeedsPush`). The
//! protocols (`sotw`, `delta`) and the gRPC service (`ads`) are above it.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use common::metrics::{MetricsError, build};
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};
use tokio::sync::{Semaphore, SemaphorePermit, watch};
use tonic::{Request, Status};

use super::outbox::Closed;
use super::rate_limit::StreamLimiter;
use super::short_name;
use crate::ca::authn::Authenticators;
use crate::pushctx::{Proxy, PushPlan, PushRequest};

/// The xDS metrics, with Istio's names.
#[derive(Clone)]
pub struct XdsMetrics {
    /// `pilot_xds{version}`: connected proxies.
    pub connections: IntGaugeVec,
    /// `pilot_xds_pushes{type}`: responses sent.
    pub pushes: IntCounterVec,
    /// `pilot_total_xds_rejects{type}`: NACKs.
    pub rejects: IntCounterVec,
    /// `pilot_xds_expired_nonce{type}`: stale nonces ignored.
    pub expired_nonce: IntCounterVec,
    /// `pilot_proxy_convergence_time`: from the first change to a proxy having its push.
    pub convergence: Histogram,
    /// `pilot_xds_write_timeout`: pushes not written within `PILOT_XDS_SEND_TIMEOUT`.
    pub write_timeouts: IntCounter,
    /// `pilot_xds_config_size_bytes{type}`: the size of each response.
    pub config_size: prometheus::HistogramVec,
}

impl XdsMetrics {
    /// Registers the metrics.
    pub fn new(r: &Registry) -> Result<Self, MetricsError> {
        Ok(Self {
            connections: build(r, "pilot_xds", IntGaugeVec::new(Opts::new("pilot_xds", "Number of endpoints connected to this pilot using XDS."), &["version"]))?,
            pushes: build(r, "pilot_xds_pushes", IntCounterVec::new(Opts::new("pilot_xds_pushes", "Pilot build and send errors for lds, rds, cds and eds."), &["type"]))?,
            rejects: build(r, "pilot_total_xds_rejects", IntCounterVec::new(Opts::new("pilot_total_xds_rejects", "Total number of XDS responses from pilot rejected by proxy."), &["type"]))?,
            expired_nonce: build(r, "pilot_xds_expired_nonce", IntCounterVec::new(Opts::new("pilot_xds_expired_nonce", "Total number of XDS requests with an expired nonce."), &["type"]))?,
            convergence: build(
                r,
                "pilot_proxy_convergence_time",
                Histogram::with_opts(
                    HistogramOpts::new("pilot_proxy_convergence_time", "Delay in seconds between config change and a proxy receiving all required configuration.")
                        .buckets(vec![0.1, 0.5, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0]),
                ),
            )?,
            write_timeouts: build(r, "pilot_xds_write_timeout", IntCounter::new("pilot_xds_write_timeout", "Pilot XDS response write timeouts."))?,
            config_size: build(
                r,
                "pilot_xds_config_size_bytes",
                prometheus::HistogramVec::new(
                    HistogramOpts::new("pilot_xds_config_size_bytes", "Distribution of configuration sizes pushed to clients")
                        .buckets(vec![1.0, 10_000.0, 1_000_000.0, 4_000_000.0, 10_000_000.0, 40_000_000.0]),
                    &["type"],
                ),
            )?,
        })
    }
}

/// What `/debug/syncz` reports for one type of one connection.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TypeStatus {
    /// Version of the last response.
    pub sent_version: String,
    /// Nonce of the last response.
    pub sent_nonce: String,
    /// Nonce of the last ACK.
    pub acked_nonce: String,
    /// The proxy's last NACK message, until the next ACK.
    pub last_error: Option<String>,
    /// Resources in the last response.
    pub resources: usize,
    /// The names the proxy watches (empty: all of a wildcard type), for
    /// config dumps.
    #[serde(skip)]
    pub names: Arc<BTreeSet<String>>,
}

/// One connected proxy, for debug endpoints.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConnectionStatus {
    /// `<pod>.<ns>`.
    pub proxy_id: String,
    /// The connection id, `<proxyID>-<counter>`.
    pub connection_id: String,
    /// The node id.
    pub node_id: String,
    /// The proxy's Istio version.
    pub istio_version: String,
    /// Whether the stream is delta.
    pub delta: bool,
    /// Per short type name (`CDS`, ...).
    pub types: BTreeMap<String, TypeStatus>,
    /// Seconds since the epoch when the connection started.
    pub connected_at: u64,
    /// Whether the node is a proxy (Istio's `isProxy`: its metadata has
    /// `PROXY_CONFIG`); debug clients such as `istioctl` are not, and the
    /// `istio.io/debug/syncz` answer leaves them out.
    pub is_proxy: bool,
    /// The proxy, as parsed from its node.
    #[serde(skip)]
    pub proxy: Proxy,
}

struct Inner {
    ready: watch::Receiver<bool>,
    pushes: watch::Receiver<Option<PushRequest>>,
    metrics: XdsMetrics,
    connections: Mutex<BTreeMap<String, ConnectionStatus>>,
    throttle: Semaphore,
    send_timeout: Duration,
    /// istiod's namespace: callers of other namespaces see only their own
    /// namespace's proxies in debug answers.
    system_namespace: String,
    /// The `control_plane.identifier` of debug answers (Istio's JSON
    /// `IstioControlPlaneInstance`, which `istioctl` shows as ISTIOD).
    control_plane: String,
    /// istiod's HTTP debug endpoints, for `istio.io/debug/<path>`.
    debug_mux: std::sync::OnceLock<DebugMux>,
    counter: AtomicU64,
    /// Subscribed name sets, shared by the streams that subscribe the same.
    names: Mutex<NameSets>,
    /// WorkloadEntry auto-registration and health, when enabled.
    autoregistration: Option<Arc<crate::autoregistration::Controller>>,
    /// Drain and connection age (see [`crate::xds::drain`]).
    drain: super::drain::Drain,
}

/// A digest of a set of names (see [`names_digest`]).
pub(super) type NamesDigest = (u64, u64, usize);

/// Interned subscriptions: proxies of one Sidecar scope ask for the same
/// thousand cluster names; each stream holds a pointer to one shared set.
#[derive(Default)]
struct NameSets {
    sets: std::collections::HashMap<NamesDigest, std::sync::Weak<BTreeSet<String>>>,
    inserts: usize,
}

/// An order-independent digest of names: two sums of keyed hashes and
/// the count. Equal sets have equal digests; two different sets colliding
/// in all 128 bits and the count are not a practical concern.
pub(super) fn names_digest<'a>(names: impl IntoIterator<Item = &'a str>) -> NamesDigest {
    use std::hash::{Hash, Hasher};
    let one = |salt: u8, n: &str| {
        let mut h = std::hash::DefaultHasher::new();
        (salt, n).hash(&mut h);
        h.finish()
    };
    names.into_iter().fold((0, 0, 0), |(a, b, c), n| {
        (a.wrapping_add(one(0, n)), b.wrapping_add(one(1, n)), c + 1)
    })
}

/// istiod's HTTP debug endpoints called in-process: the body of a GET of
/// the path (with query) given.
pub type DebugMux =
    Arc<dyn Fn(String) -> std::pin::Pin<Box<dyn Future<Output = Vec<u8>> + Send>> + Send + Sync>;

/// The discovery service; clone one per listener (`authn` differs between
/// the plaintext :15010 and the TLS :15012 server).
#[derive(Clone)]
pub struct DiscoveryServer {
    inner: Arc<Inner>,
    authn: Option<Authenticators>,
    /// New streams' rate limit, shared by every port's server.
    limiter: Option<Arc<StreamLimiter>>,
}

/// The outcome of authentication: `None` on the plaintext port.
pub(super) type Identities = Option<Vec<common::Identity>>;

impl DiscoveryServer {
    /// A server that serves once `ready` is true, generating from the latest push.
    pub fn new(
        ready: watch::Receiver<bool>,
        pushes: watch::Receiver<Option<PushRequest>>,
        metrics: XdsMetrics,
        push_throttle: usize,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                ready,
                pushes,
                metrics,
                connections: Mutex::new(BTreeMap::new()),
                throttle: Semaphore::new(push_throttle.max(1)),
                send_timeout: Duration::ZERO,
                system_namespace: "istio-system".into(),
                control_plane: control_plane_identifier("istiod"),
                debug_mux: std::sync::OnceLock::new(),
                counter: AtomicU64::new(0),
                names: Mutex::default(),
                autoregistration: None,
                drain: super::drain::Drain::default(),
            }),
            authn: None,
            limiter: None,
        }
    }

    /// The same server, admitting new streams at most `per_second` a second
    /// (`PILOT_MAX_REQUESTS_PER_SECOND`); servers cloned from it afterwards
    /// share the limit.
    pub fn with_stream_limit(self, per_second: f64) -> Self {
        Self {
            limiter: Some(Arc::new(StreamLimiter::new(per_second))),
            ..self
        }
    }

    /// The same server, authenticating callers (the TLS port).
    pub fn with_authn(&self, authn: Authenticators) -> Self {
        Self {
            inner: self.inner.clone(),
            authn: Some(authn),
            limiter: self.limiter.clone(),
        }
    }

    /// The same server, closing a stream whose push is not written within
    /// `timeout` (`PILOT_XDS_SEND_TIMEOUT`; zero: no limit). Only before the
    /// server is cloned.
    pub fn with_send_timeout(mut self, timeout: Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.send_timeout = timeout;
        }
        self
    }

    /// The same server, ending streams as `drain` says (istiod shutting
    /// down; a stream older than the maximum connection age). Only before
    /// the server is cloned.
    pub fn with_drain(mut self, drain: super::drain::Drain) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.drain = drain;
        }
        self
    }

    pub(super) fn drain(&self) -> &super::drain::Drain {
        &self.inner.drain
    }

    /// The same server, with istiod's namespace and instance ID (its pod
    /// name) for the debug types. Only before the server is cloned.
    pub fn with_instance(mut self, system_namespace: &str, id: &str) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.system_namespace = system_namespace.to_string();
            inner.control_plane = control_plane_identifier(id);
        }
        self
    }

    /// The same server, registering WorkloadEntries of proxies that
    /// connect with `AUTO_REGISTER_GROUP` and taking their health reports.
    /// Only before the server is cloned.
    pub fn with_autoregistration(
        mut self,
        controller: Option<Arc<crate::autoregistration::Controller>>,
    ) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.autoregistration = controller;
        }
        self
    }

    /// The autoregistration controller, when enabled.
    pub(super) fn autoregistration(&self) -> Option<&Arc<crate::autoregistration::Controller>> {
        self.inner.autoregistration.as_ref()
    }

    /// istiod's namespace.
    pub fn system_namespace(&self) -> &str {
        &self.inner.system_namespace
    }

    /// Gives `istio.io/debug/<path>` istiod's HTTP debug endpoints (once).
    pub fn set_debug_mux(&self, mux: DebugMux) {
        let _ = self.inner.debug_mux.set(mux);
    }

    /// The HTTP debug endpoints, once set.
    pub(super) fn debug_mux(&self) -> Option<&DebugMux> {
        self.inner.debug_mux.get()
    }

    /// The `control_plane.identifier` of debug answers.
    pub(super) fn control_plane(&self) -> &str {
        &self.inner.control_plane
    }

    /// Every connected proxy's status.
    pub fn connections(&self) -> Vec<ConnectionStatus> {
        self.inner
            .connections
            .lock()
            .map(|c| c.values().cloned().collect())
            .unwrap_or_default()
    }

    pub(super) async fn admit<T>(&self, request: &Request<T>) -> Result<Identities, Status> {
        if !*self.inner.ready.borrow() {
            return Err(Status::unavailable(
                "server is not ready to serve discovery information",
            ));
        }
        if self.inner.drain.closing() {
            return Err(Status::unavailable("istiod is shutting down"));
        }
        if let Some(limiter) = &self.limiter
            && let Err(e) = limiter.admit().await
        {
            let peer = request
                .remote_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            tracing::warn!(target: "ads", "ADS: {peer:?} exceeded rate limit: {e}");
            return Err(Status::resource_exhausted(e.to_string()));
        }
        match &self.authn {
            None => Ok(None),
            Some(authn) => {
                let certs = request.peer_certs();
                let caller = authn
                    .authenticate(request.metadata(), certs.as_deref().map(Vec::as_slice))
                    .await
                    .map_err(|e| {
                        tracing::warn!(target: "ads", "xDS connection rejected: {e}");
                        Status::unauthenticated(e.to_string())
                    })?;
                Ok(Some(caller.identities))
            }
        }
    }

    pub(super) fn register(&self, proxy: &Proxy, delta: bool, is_proxy: bool) -> String {
        let n = self.inner.counter.fetch_add(1, Ordering::Relaxed) + 1;
        let id = format!("{}-{n}", proxy.id);
        let status = ConnectionStatus {
            proxy_id: proxy.id.clone(),
            connection_id: id.clone(),
            node_id: proxy.node_id.clone(),
            istio_version: proxy.istio_version.clone(),
            delta,
            types: BTreeMap::new(),
            connected_at: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default(),
            is_proxy,
            proxy: proxy.clone(),
        };
        if let Ok(mut c) = self.inner.connections.lock() {
            c.insert(id.clone(), status);
        }
        self.inner
            .metrics
            .connections
            .with_label_values(&[&proxy.istio_version])
            .inc();
        id
    }

    pub(super) fn unregister(&self, id: &str, proxy: &Proxy) {
        if let Ok(mut c) = self.inner.connections.lock() {
            c.remove(id);
        }
        self.inner
            .metrics
            .connections
            .with_label_values(&[&proxy.istio_version])
            .dec();
    }

    pub(super) fn update_status(&self, id: &str, type_url: &str, f: impl FnOnce(&mut TypeStatus)) {
        if let Ok(mut c) = self.inner.connections.lock()
            && let Some(conn) = c.get_mut(id)
        {
            f(conn
                .types
                .entry(short_name(type_url).to_string())
                .or_default());
        }
    }

    /// The latest push (its context generates any proxy's configuration).
    pub fn current(&self) -> Option<PushRequest> {
        self.inner.pushes.borrow().clone()
    }

    /// The shared set with `digest`, else `build()`'s, shared from now on.
    pub(super) fn intern_names(
        &self,
        digest: NamesDigest,
        build: impl FnOnce() -> Arc<BTreeSet<String>>,
    ) -> Arc<BTreeSet<String>> {
        let mut names = self
            .inner
            .names
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(set) = names.sets.get(&digest).and_then(std::sync::Weak::upgrade) {
            return set;
        }
        let set = build();
        names.sets.insert(digest, Arc::downgrade(&set));
        names.inserts += 1;
        if names.inserts.is_multiple_of(1024) {
            names.sets.retain(|_, s| s.strong_count() > 0);
        }
        set
    }

    pub(super) fn metrics(&self) -> &XdsMetrics {
        &self.inner.metrics
    }

    /// Counts one response of `type_url`, `bytes` long
    /// (`pilot_xds_pushes`, `pilot_xds_config_size_bytes`).
    pub(super) fn count_response(&self, type_url: &str, bytes: usize) {
        let short = short_name(type_url).to_lowercase();
        let m = &self.inner.metrics;
        m.pushes.with_label_values(&[&short]).inc();
        m.config_size
            .with_label_values(&[&short])
            .observe(bytes as f64);
    }

    /// A receiver of pushes, at the latest.
    pub(super) fn pushes(&self) -> watch::Receiver<Option<PushRequest>> {
        self.inner.pushes.clone()
    }

    /// Waits for a turn to write (Istio's `PILOT_PUSH_THROTTLE`).
    pub(super) async fn throttle(&self) -> Option<SemaphorePermit<'_>> {
        self.inner.throttle.acquire().await.ok()
    }

    /// What `req` means for `proxy`, which has seen pushes up to `seen`:
    /// everything when some of the pushes in between are no longer known.
    pub(super) fn plan(&self, proxy: &Proxy, seen: u64, req: &PushRequest) -> PushPlan {
        match req.updates_since(seen) {
            None => PushPlan::everything(),
            Some(u) if u.is_empty() => PushPlan::default(),
            Some(u) => req.ctx.plan_push(proxy, &u),
        }
    }

    /// Runs one write (responses queued and taken by the transport) within
    /// `PILOT_XDS_SEND_TIMEOUT`; a write that takes longer ends the stream
    /// with `DeadlineExceeded`, as Istio's send does.
    pub(super) async fn write<F>(&self, id: &str, write: F) -> Result<(), Ended>
    where
        F: Future<Output = Result<(), Closed>>,
    {
        let timeout = self.inner.send_timeout;
        if timeout.is_zero() {
            return write.await.map_err(|_| Ended::Closed);
        }
        match tokio::time::timeout(timeout, write).await {
            Ok(r) => r.map_err(|_| Ended::Closed),
            Err(_) => {
                self.inner.metrics.write_timeouts.inc();
                tracing::info!(target: "ads", "ADS: {id} timeout sending: closing the stream");
                Err(Ended::Status(Status::deadline_exceeded("timeout sending")))
            }
        }
    }
}

/// Why a stream ends early.
#[derive(Debug)]
pub(super) enum Ended {
    /// The peer went away.
    Closed,
    /// istiod ends it with this status.
    Status(Status),
}

/// Validates the first request's node and the caller's identity.
pub(super) fn init_proxy(
    node: Option<&proto::pb::envoy::config::core::v3::Node>,
    identities: &Identities,
) -> Result<Proxy, Status> {
    let node = node.ok_or_else(|| Status::invalid_argument("missing node information"))?;
    let mut proxy = Proxy::from_node(node).map_err(|e| Status::invalid_argument(e.to_string()))?;
    if let Some(ids) = identities {
        let id = proxy
            .authorize(ids)
            .map_err(|e| Status::permission_denied(e.to_string()))?;
        proxy.verified = true;
        proxy.verified_identity = Some(id);
    }
    Ok(proxy)
}

/// Istio's `IstioControlPlaneInstance` JSON for `id`.
fn control_plane_identifier(id: &str) -> String {
    serde_json::json!({
        "Component": "istiod",
        "ID": id,
        "Info": {"version": crate::VERSION},
    })
    .to_string()
}

pub(super) fn nonce() -> String {
    uuid::Uuid::new_v4().to_string()
}
