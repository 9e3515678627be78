//! ADS streams (`StreamAggregatedResources`, `DeltaAggregatedResources`): one
//! task per connection, per-type watches with Istio's nonce/ACK/NACK rules
//! (`pkg/xds/server.go ShouldRespond`, `pilot/pkg/xds/delta.go`), and pushes
//! taken from the latest [`PushRequest`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use futures::Stream;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Opts, Registry};
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    Resource as DeltaResource,
};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::rate_limit::StreamLimiter;
use super::{
    CLUSTER_TYPE, ENDPOINT_TYPE, PUSH_ORDER, Proxy, PushRequest, Resource, cluster_host,
    is_wildcard, short_name,
};
use crate::ca::authn::Authenticators;

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
}

fn register<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> T {
    if let Err(e) = r.register(Box::new(c.clone())) {
        tracing::warn!(target: "ads", "metric registration: {e}");
    }
    c
}

impl XdsMetrics {
    /// Registers the metrics.
    pub fn new(r: &Registry) -> Result<Self, prometheus::Error> {
        Ok(Self {
            connections: register(r, IntGaugeVec::new(Opts::new("pilot_xds", "Number of endpoints connected to this pilot using XDS."), &["version"])?),
            pushes: register(r, IntCounterVec::new(Opts::new("pilot_xds_pushes", "Pilot build and send errors for lds, rds, cds and eds."), &["type"])?),
            rejects: register(r, IntCounterVec::new(Opts::new("pilot_total_xds_rejects", "Total number of XDS responses from pilot rejected by proxy."), &["type"])?),
            expired_nonce: register(r, IntCounterVec::new(Opts::new("pilot_xds_expired_nonce", "Total number of XDS requests with an expired nonce."), &["type"])?),
            convergence: register(
                r,
                Histogram::with_opts(
                    HistogramOpts::new("pilot_proxy_convergence_time", "Delay in seconds between config change and a proxy receiving all required configuration.")
                        .buckets(vec![0.1, 0.5, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0]),
                )?,
            ),
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
    counter: AtomicU64,
}

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
type Identities = Option<Vec<common::Identity>>;

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
                counter: AtomicU64::new(0),
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

    /// The tonic service.
    pub fn into_service(self) -> AggregatedDiscoveryServiceServer<Self> {
        AggregatedDiscoveryServiceServer::new(self)
            .max_decoding_message_size(4 * 1024 * 1024)
            .max_encoding_message_size(usize::MAX)
    }

    /// Every connected proxy's status.
    pub fn connections(&self) -> Vec<ConnectionStatus> {
        self.inner
            .connections
            .lock()
            .map(|c| c.values().cloned().collect())
            .unwrap_or_default()
    }

    async fn admit<T>(&self, request: &Request<T>) -> Result<Identities, Status> {
        if !*self.inner.ready.borrow() {
            return Err(Status::unavailable(
                "server is not ready to serve discovery information",
            ));
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

    fn register(&self, proxy: &Proxy, delta: bool) -> String {
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

    fn unregister(&self, id: &str, proxy: &Proxy) {
        if let Ok(mut c) = self.inner.connections.lock() {
            c.remove(id);
        }
        self.inner
            .metrics
            .connections
            .with_label_values(&[&proxy.istio_version])
            .dec();
    }

    fn update_status(&self, id: &str, type_url: &str, f: impl FnOnce(&mut TypeStatus)) {
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
}

/// Validates the first request's node and the caller's identity.
fn init_proxy(
    node: Option<&proto::pb::envoy::config::core::v3::Node>,
    identities: &Identities,
) -> Result<Proxy, Status> {
    let node = node.ok_or_else(|| Status::invalid_argument("missing node information"))?;
    let proxy = Proxy::from_node(node).map_err(Status::invalid_argument)?;
    if let Some(ids) = identities {
        proxy.authorize(ids).map_err(Status::permission_denied)?;
    }
    Ok(proxy)
}

fn nonce() -> String {
    uuid::Uuid::new_v4().to_string()
}

// === State of the world ===

#[derive(Default)]
struct Watch {
    names: BTreeSet<String>,
    nonce_sent: Option<String>,
    always_respond: bool,
}

struct SotwConn {
    server: DiscoveryServer,
    proxy: Proxy,
    id: String,
    watches: HashMap<String, Watch>,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    last_seq: u64,
}

impl SotwConn {
    /// Applies a request; returns the names to answer with (`None` = no response).
    fn should_respond(&mut self, req: &DiscoveryRequest) -> Option<BTreeSet<String>> {
        let t = req.type_url.as_str();
        let metrics = &self.server.inner.metrics;
        if let Some(err) = &req.error_detail {
            metrics
                .rejects
                .with_label_values(&[&short_name(t).to_lowercase()])
                .inc();
            tracing::warn!(target: "ads", "ADS:{}: ACK ERROR {} {}", short_name(t), self.id, err.message);
            let msg = err.message.clone();
            self.server
                .update_status(&self.id, t, |s| s.last_error = Some(msg));
            return None;
        }
        let names: BTreeSet<String> = req.resource_names.iter().cloned().collect();
        if !is_wildcard(t) && names.is_empty() {
            // Unsubscribe from a named type.
            self.watches.remove(t);
            return None;
        }
        let w = self.watches.get(t);
        if req.response_nonce.is_empty() || w.is_none() {
            // Initial request, or a reconnect to this istiod: respond in full.
            self.watches.insert(
                t.to_string(),
                Watch {
                    names: names.clone(),
                    ..Default::default()
                },
            );
            if t == CLUSTER_TYPE
                && let Some(eds) = self.watches.get_mut(ENDPOINT_TYPE)
            {
                // Envoy re-requests EDS while warming new clusters (envoy#13009).
                eds.always_respond = true;
            }
            return Some(names);
        }
        let w = self.watches.get_mut(t)?;
        if w.nonce_sent.as_deref() != Some(req.response_nonce.as_str()) {
            metrics
                .expired_nonce
                .with_label_values(&[&short_name(t).to_lowercase()])
                .inc();
            tracing::debug!(target: "ads", "ADS:{}: REQ {} expired nonce received {}", short_name(t), self.id, req.response_nonce);
            return None;
        }
        let nonce = req.response_nonce.clone();
        self.server.update_status(&self.id, t, |s| {
            s.acked_nonce = nonce;
            s.last_error = None;
        });
        if std::mem::take(&mut w.always_respond) {
            w.names = names.clone();
            return Some(names);
        }
        if w.names == names {
            return None;
        }
        let added: BTreeSet<String> = names.difference(&w.names).cloned().collect();
        w.names = names.clone();
        if is_wildcard(t) {
            Some(names)
        } else if added.is_empty() {
            None
        } else {
            Some(added)
        }
    }

    async fn respond(
        &mut self,
        ctx: &PushRequest,
        type_url: &str,
        names: &BTreeSet<String>,
        incremental: bool,
    ) -> Result<(), ()> {
        let resources: Vec<Arc<Resource>> = match ctx.ctx.generate(&self.proxy, type_url, names) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(target: "ads", "{}: generation failed for {}: {e}", short_name(type_url), self.id);
                return Ok(());
            }
        };
        let nonce = nonce();
        let version = ctx.ctx.version().to_string();
        let size: usize = resources.iter().map(|r| r.resource.value.len()).sum();
        tracing::info!(
            target: "ads",
            "{}: PUSH{} for node:{} resources:{} size:{}",
            short_name(type_url),
            if incremental { " INC" } else { "" },
            self.proxy.id,
            resources.len(),
            size
        );
        let count = resources.len();
        let response = DiscoveryResponse {
            version_info: version.clone(),
            resources: resources.iter().map(|r| r.resource.clone()).collect(),
            type_url: type_url.to_string(),
            nonce: nonce.clone(),
            ..Default::default()
        };
        if let Some(w) = self.watches.get_mut(type_url) {
            w.nonce_sent = Some(nonce.clone());
        }
        self.server.update_status(&self.id, type_url, |s| {
            s.sent_version = version;
            s.sent_nonce = nonce;
            s.resources = count;
        });
        self.server
            .inner
            .metrics
            .pushes
            .with_label_values(&[&short_name(type_url).to_lowercase()])
            .inc();
        self.tx.send(Ok(response)).await.map_err(|_| ())
    }

    async fn push(&mut self, req: PushRequest) -> Result<(), ()> {
        // A skipped push (coalesced while this connection was busy) may have
        // carried other changes: treat it as full.
        let eds_only = if req.seq == self.last_seq + 1 {
            req.eds_only.clone()
        } else {
            None
        };
        self.last_seq = req.seq;
        let inner = self.server.inner.clone();
        let _permit = inner.throttle.acquire().await;
        for t in PUSH_ORDER {
            let Some(w) = self.watches.get(t) else {
                continue;
            };
            let names = match &eds_only {
                None => w.names.clone(),
                Some(hosts) if t == ENDPOINT_TYPE => w
                    .names
                    .iter()
                    .filter(|n| hosts.contains(cluster_host(n)))
                    .cloned()
                    .collect(),
                Some(_) => continue,
            };
            if !is_wildcard(t) && names.is_empty() {
                continue;
            }
            self.respond(&req, t, &names, eds_only.is_some()).await?;
        }
        self.server
            .inner
            .metrics
            .convergence
            .observe(req.start.elapsed().as_secs_f64());
        Ok(())
    }
}

async fn run_sotw(
    server: DiscoveryServer,
    identities: Identities,
    mut inbound: Streaming<DiscoveryRequest>,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
) {
    let first = match inbound.message().await {
        Ok(Some(r)) => r,
        _ => return,
    };
    let proxy = match init_proxy(first.node.as_ref(), &identities) {
        Ok(p) => p,
        Err(status) => {
            tracing::warn!(target: "ads", "ADS: connection rejected: {}", status.message());
            let _ = tx.send(Err(status)).await;
            return;
        }
    };
    let id = server.register(&proxy, false);
    tracing::info!(target: "ads", "ADS: new connection for node:{id}");
    let mut pushes = server.inner.pushes.clone();
    let last_seq = pushes
        .borrow_and_update()
        .as_ref()
        .map(|p| p.seq)
        .unwrap_or(0);
    let mut conn = SotwConn {
        server: server.clone(),
        proxy,
        id: id.clone(),
        watches: HashMap::new(),
        tx,
        last_seq,
    };
    let mut next = Some(first);
    loop {
        if let Some(req) = next.take() {
            if let Some(names) = conn.should_respond(&req) {
                let Some(ctx) = server.current() else {
                    continue;
                };
                if conn
                    .respond(&ctx, &req.type_url, &names, false)
                    .await
                    .is_err()
                {
                    break;
                }
            }
            continue;
        }
        tokio::select! {
            req = inbound.message() => match req {
                Ok(Some(r)) => next = Some(r),
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(target: "ads", "ADS: {id} terminated: {e}");
                    break;
                }
            },
            changed = pushes.changed() => {
                if changed.is_err() { break; }
                let Some(req) = pushes.borrow_and_update().clone() else { continue };
                if conn.push(req).await.is_err() { break; }
            }
        }
    }
    tracing::info!(target: "ads", "ADS: {id} terminated");
    server.unregister(&id, &conn.proxy);
}

// === Delta ===

#[derive(Default)]
struct DeltaWatch {
    wildcard: bool,
    subscribed: BTreeSet<String>,
    /// What the client has: name -> version.
    sent: HashMap<String, String>,
    nonce_sent: Option<String>,
}

struct DeltaConn {
    server: DiscoveryServer,
    proxy: Proxy,
    id: String,
    watches: HashMap<String, DeltaWatch>,
    tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
    last_seq: u64,
}

enum DeltaAction {
    None,
    /// Respond; `force` names are sent even if unchanged; `always` sends an empty response too.
    Respond {
        force: BTreeSet<String>,
        always: bool,
    },
}

impl DeltaConn {
    fn on_request(&mut self, req: &DeltaDiscoveryRequest) -> DeltaAction {
        let t = req.type_url.as_str();
        let metrics = &self.server.inner.metrics;
        if let Some(err) = &req.error_detail {
            metrics
                .rejects
                .with_label_values(&[&short_name(t).to_lowercase()])
                .inc();
            tracing::warn!(target: "ads", "ADS:{}: ACK ERROR {} {}", short_name(t), self.id, err.message);
            let msg = err.message.clone();
            self.server
                .update_status(&self.id, t, |s| s.last_error = Some(msg));
            return DeltaAction::None;
        }
        let sub: BTreeSet<String> = req.resource_names_subscribe.iter().cloned().collect();
        let unsub: BTreeSet<String> = req.resource_names_unsubscribe.iter().cloned().collect();
        if !self.watches.contains_key(t) {
            let wildcard = sub.contains("*") || (sub.is_empty() && is_wildcard(t));
            let mut w = DeltaWatch {
                wildcard: wildcard && !unsub.contains("*"),
                subscribed: sub.iter().filter(|n| *n != "*").cloned().collect(),
                ..Default::default()
            };
            // On reconnect the client says what it has; only differences are sent.
            for (name, version) in &req.initial_resource_versions {
                w.sent.insert(name.clone(), version.clone());
                if !w.wildcard {
                    w.subscribed.insert(name.clone());
                }
            }
            self.watches.insert(t.to_string(), w);
            return DeltaAction::Respond {
                force: BTreeSet::new(),
                always: true,
            };
        }
        let Some(w) = self.watches.get_mut(t) else {
            return DeltaAction::None;
        };
        if !req.response_nonce.is_empty()
            && w.nonce_sent.as_deref() != Some(req.response_nonce.as_str())
        {
            metrics
                .expired_nonce
                .with_label_values(&[&short_name(t).to_lowercase()])
                .inc();
            return DeltaAction::None;
        }
        if !req.response_nonce.is_empty() {
            let nonce = req.response_nonce.clone();
            self.server.update_status(&self.id, t, |s| {
                s.acked_nonce = nonce;
                s.last_error = None;
            });
        }
        if sub.is_empty() && unsub.is_empty() {
            return DeltaAction::None;
        }
        if sub.contains("*") {
            w.wildcard = true;
        }
        if unsub.contains("*") {
            w.wildcard = false;
        }
        for n in &unsub {
            w.subscribed.remove(n);
            w.sent.remove(n);
        }
        let mut force = BTreeSet::new();
        for n in sub.iter().filter(|n| *n != "*") {
            if w.subscribed.insert(n.clone()) {
                force.insert(n.clone());
            }
            // A (re)subscribed name is sent even if the client had it.
            w.sent.remove(n);
        }
        DeltaAction::Respond {
            force,
            always: !sub.is_empty(),
        }
    }

    async fn respond(
        &mut self,
        ctx: &PushRequest,
        type_url: &str,
        only: Option<&BTreeSet<String>>,
        always: bool,
    ) -> Result<(), ()> {
        let Some(w) = self.watches.get(type_url) else {
            return Ok(());
        };
        let names: BTreeSet<String> = match only {
            Some(o) => o.clone(),
            None if w.wildcard => BTreeSet::new(),
            None => w.subscribed.clone(),
        };
        if !w.wildcard && names.is_empty() && !always {
            return Ok(());
        }
        let generated = match ctx.ctx.generate(&self.proxy, type_url, &names) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(target: "ads", "{}: generation failed for {}: {e}", short_name(type_url), self.id);
                return Ok(());
            }
        };
        let Some(w) = self.watches.get_mut(type_url) else {
            return Ok(());
        };
        let mut changed = Vec::new();
        let mut present = BTreeSet::new();
        for r in generated {
            if !w.wildcard && !w.subscribed.contains(&r.name) {
                continue;
            }
            present.insert(r.name.clone());
            let v = r.version().to_string();
            if w.sent.get(&r.name) != Some(&v) {
                changed.push((r, v));
            }
        }
        // Removals: what the client has that no longer exists (in scope).
        let scope: Vec<String> = match (only, w.wildcard) {
            (Some(o), _) => o.iter().cloned().collect(),
            (None, true) => w.sent.keys().cloned().collect(),
            (None, false) => w.subscribed.iter().cloned().collect(),
        };
        let removed: Vec<String> = scope
            .into_iter()
            .filter(|n| !present.contains(n) && (w.sent.contains_key(n) || !w.wildcard))
            .filter(|n| w.sent.contains_key(n))
            .collect();
        if changed.is_empty() && removed.is_empty() && !always {
            return Ok(());
        }
        for n in &removed {
            w.sent.remove(n);
        }
        for (r, v) in &changed {
            w.sent.insert(r.name.clone(), v.clone());
        }
        let nonce = nonce();
        w.nonce_sent = Some(nonce.clone());
        let version = ctx.ctx.version().to_string();
        tracing::info!(
            target: "ads",
            "{}: PUSH{} for node:{} resources:{} removed:{}",
            short_name(type_url),
            if only.is_some() { " INC" } else { "" },
            self.proxy.id,
            changed.len(),
            removed.len()
        );
        let count = changed.len();
        let response = DeltaDiscoveryResponse {
            system_version_info: version.clone(),
            resources: changed
                .into_iter()
                .map(|(r, v)| DeltaResource {
                    name: r.name.clone(),
                    version: v,
                    resource: Some(r.resource.clone()),
                    ..Default::default()
                })
                .collect(),
            type_url: type_url.to_string(),
            removed_resources: removed,
            nonce: nonce.clone(),
            ..Default::default()
        };
        self.server.update_status(&self.id, type_url, |s| {
            s.sent_version = version;
            s.sent_nonce = nonce;
            s.resources = count;
        });
        self.server
            .inner
            .metrics
            .pushes
            .with_label_values(&[&short_name(type_url).to_lowercase()])
            .inc();
        self.tx.send(Ok(response)).await.map_err(|_| ())
    }

    async fn push(&mut self, req: PushRequest) -> Result<(), ()> {
        let eds_only = if req.seq == self.last_seq + 1 {
            req.eds_only.clone()
        } else {
            None
        };
        self.last_seq = req.seq;
        let inner = self.server.inner.clone();
        let _permit = inner.throttle.acquire().await;
        for t in PUSH_ORDER {
            let Some(w) = self.watches.get(t) else {
                continue;
            };
            match &eds_only {
                None if t == CLUSTER_TYPE => {
                    let before = w.sent.clone();
                    self.respond(&req, t, None, false).await?;
                    // Istio's forceEDSPush (envoy#33607): a changed EDS
                    // cluster warms until its endpoints are sent again.
                    let changed: Vec<String> = self
                        .watches
                        .get(t)
                        .map(|w| {
                            w.sent
                                .iter()
                                .filter(|(n, v)| before.get(*n) != Some(*v))
                                .map(|(n, _)| n.clone())
                                .collect()
                        })
                        .unwrap_or_default();
                    if let Some(eds) = self.watches.get_mut(ENDPOINT_TYPE) {
                        for n in &changed {
                            eds.sent.remove(n);
                        }
                    }
                }
                None => self.respond(&req, t, None, false).await?,
                Some(hosts) if t == ENDPOINT_TYPE => {
                    let names: BTreeSet<String> = w
                        .subscribed
                        .iter()
                        .filter(|n| hosts.contains(cluster_host(n)))
                        .cloned()
                        .collect();
                    if !names.is_empty() {
                        self.respond(&req, t, Some(&names), false).await?;
                    }
                }
                Some(_) => {}
            }
        }
        self.server
            .inner
            .metrics
            .convergence
            .observe(req.start.elapsed().as_secs_f64());
        Ok(())
    }
}

async fn run_delta(
    server: DiscoveryServer,
    identities: Identities,
    mut inbound: Streaming<DeltaDiscoveryRequest>,
    tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
) {
    let first = match inbound.message().await {
        Ok(Some(r)) => r,
        _ => return,
    };
    let proxy = match init_proxy(first.node.as_ref(), &identities) {
        Ok(p) => p,
        Err(status) => {
            tracing::warn!(target: "ads", "ADS: delta connection rejected: {}", status.message());
            let _ = tx.send(Err(status)).await;
            return;
        }
    };
    let id = server.register(&proxy, true);
    tracing::info!(target: "ads", "ADS: new delta connection for node:{id}");
    let mut pushes = server.inner.pushes.clone();
    let last_seq = pushes
        .borrow_and_update()
        .as_ref()
        .map(|p| p.seq)
        .unwrap_or(0);
    let mut conn = DeltaConn {
        server: server.clone(),
        proxy,
        id: id.clone(),
        watches: HashMap::new(),
        tx,
        last_seq,
    };
    let mut next = Some(first);
    loop {
        if let Some(req) = next.take() {
            if let DeltaAction::Respond { force, always } = conn.on_request(&req) {
                let Some(ctx) = server.current() else {
                    continue;
                };
                let only = (!force.is_empty()
                    && !conn.watches.get(&req.type_url).is_some_and(|w| w.wildcard))
                .then_some(&force);
                if conn
                    .respond(&ctx, &req.type_url, only, always)
                    .await
                    .is_err()
                {
                    break;
                }
                if req.type_url == CLUSTER_TYPE && conn.watches.contains_key(ENDPOINT_TYPE) {
                    // Istio's forceEDSPush (envoy#33607): warming clusters need EDS again.
                    if let Some(w) = conn.watches.get_mut(ENDPOINT_TYPE) {
                        w.sent.clear();
                    }
                    if conn
                        .respond(&ctx, ENDPOINT_TYPE, None, false)
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
            continue;
        }
        tokio::select! {
            req = inbound.message() => match req {
                Ok(Some(r)) => next = Some(r),
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(target: "ads", "ADS: {id} terminated: {e}");
                    break;
                }
            },
            changed = pushes.changed() => {
                if changed.is_err() { break; }
                let Some(req) = pushes.borrow_and_update().clone() else { continue };
                if conn.push(req).await.is_err() { break; }
            }
        }
    }
    tracing::info!(target: "ads", "ADS: {id} terminated");
    server.unregister(&id, &conn.proxy);
}

type Out<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for DiscoveryServer {
    type StreamAggregatedResourcesStream = Out<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Out<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let identities = self.admit(&request).await?;
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(run_sotw(self.clone(), identities, request.into_inner(), tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let identities = self.admit(&request).await?;
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(run_delta(
            self.clone(),
            identities,
            request.into_inner(),
            tx,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
