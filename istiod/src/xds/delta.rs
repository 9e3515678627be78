//! Delta ADS (`DeltaAggregatedResources`, Istio's `pilot/pkg/xds/delta.go`):
//! subscriptions by name or wildcard, and per resource what the client
//! holds, so only changed resources and removals are sent.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use super::requests::Requests;
use proto::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;

use proto::pb::envoy::config::core::v3::Node;

use super::connection::{self, Protocol, Stream};
use super::outbox::{Closed, Outbox};
use super::server::{DiscoveryServer, Identities, names_digest, nonce};
use super::wire::Encoded;
use super::{
    CLUSTER_TYPE, ENDPOINT_TYPE, PUSH_ORDER, SECRET_TYPE, is_wildcard, sds, short_name, statusgen,
};
use crate::pushctx::names::cluster_host;
use crate::pushctx::{PushPlan, PushRequest, Resource, name_hash};

/// One resource the client holds.
enum Held {
    /// Sent on this stream (shared with the XDS cache).
    Sent(Arc<Resource>),
    /// Reported by the client when it reconnected.
    Known { name: String, version: String },
}

impl Held {
    fn name(&self) -> &str {
        match self {
            Held::Sent(r) => &r.name,
            Held::Known { name, .. } => name,
        }
    }

    fn version(&self) -> &str {
        match self {
            Held::Sent(r) => r.version(),
            Held::Known { version, .. } => version,
        }
    }
}

/// Whether a client holds a resource.
enum Holding {
    /// Not at all.
    No,
    /// This very content.
    Same,
    /// Another version.
    Other,
}

/// Keys that are hashes already.
#[derive(Default)]
struct PreHashed(u64);

impl Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// What the client holds of one type, by name. Sent resources are kept by
/// reference, so a thousand clients holding the same clusters cost a
/// pointer each, not a copy of every name and version.
#[derive(Default)]
struct Holdings(HashMap<u64, Held, BuildHasherDefault<PreHashed>>);

impl Holdings {
    fn get(&self, name: &str) -> Option<&Held> {
        self.0.get(&name_hash(name)).filter(|h| h.name() == name)
    }

    /// Whether the client has `r`: the same shared resource (no name or
    /// version compared), the same version, or another.
    fn holding(&self, r: &Arc<Resource>) -> Holding {
        match self.0.get(&r.name_hash()) {
            Some(Held::Sent(s)) if Arc::ptr_eq(s, r) => Holding::Same,
            Some(h) if h.name() == r.name => {
                if h.version() == r.version() {
                    Holding::Same
                } else {
                    Holding::Other
                }
            }
            _ => Holding::No,
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn insert_sent(&mut self, r: Arc<Resource>) {
        self.0.insert(r.name_hash(), Held::Sent(r));
    }

    fn insert_known(&mut self, name: &str, version: &str) {
        self.0.insert(
            name_hash(name),
            Held::Known {
                name: name.to_string(),
                version: version.to_string(),
            },
        );
    }

    fn remove(&mut self, name: &str) {
        if self.contains(name) {
            self.0.remove(&name_hash(name));
        }
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.0.values().map(Held::name)
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// The shared copy of a subscription (proxies of one scope subscribe the
/// same names).
fn intern(server: &DiscoveryServer, names: &Arc<BTreeSet<String>>) -> Arc<BTreeSet<String>> {
    let digest = names_digest(names.iter().map(String::as_str));
    server.intern_names(digest, || names.clone())
}

#[derive(Default)]
struct DeltaWatch {
    wildcard: bool,
    /// Shared with the pushes that generate them (copied on change).
    subscribed: Arc<BTreeSet<String>>,
    /// What the client has.
    sent: Holdings,
    nonce_sent: Option<String>,
}

struct DeltaConn {
    stream: Stream,
    watches: HashMap<String, DeltaWatch>,
}

enum DeltaAction {
    None,
    /// Respond; `force` names are sent even if unchanged; `always` sends an empty response too.
    Respond {
        force: BTreeSet<String>,
        always: bool,
    },
}

/// A response a request asked for.
pub(super) struct Reply {
    type_url: String,
    only: Option<BTreeSet<String>>,
    always: bool,
}

impl DeltaConn {
    fn action(&mut self, req: &DeltaDiscoveryRequest) -> DeltaAction {
        let t = req.type_url.as_str();
        let metrics = self.stream.server.metrics();
        if let Some(err) = &req.error_detail {
            self.stream.nacked(t, &err.message);
            return DeltaAction::None;
        }
        let sub: BTreeSet<String> = req.resource_names_subscribe.iter().cloned().collect();
        let unsub: BTreeSet<String> = req.resource_names_unsubscribe.iter().cloned().collect();
        if !self.watches.contains_key(t) {
            let wildcard = sub.contains("*") || (sub.is_empty() && is_wildcard(t));
            let mut w = DeltaWatch {
                wildcard: wildcard && !unsub.contains("*"),
                subscribed: Arc::new(sub.iter().filter(|n| *n != "*").cloned().collect()),
                ..Default::default()
            };
            // On reconnect the client says what it has; only differences are sent.
            for (name, version) in &req.initial_resource_versions {
                w.sent.insert_known(name, version);
                if !w.wildcard {
                    Arc::make_mut(&mut w.subscribed).insert(name.clone());
                }
            }
            w.subscribed = intern(&self.stream.server, &w.subscribed);
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
            self.stream.server.update_status(&self.stream.id, t, |s| {
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
            Arc::make_mut(&mut w.subscribed).remove(n);
            w.sent.remove(n);
        }
        let mut force = BTreeSet::new();
        for n in sub.iter().filter(|n| *n != "*") {
            if Arc::make_mut(&mut w.subscribed).insert(n.clone()) {
                force.insert(n.clone());
            }
            // A (re)subscribed name is sent even if the client had it.
            w.sent.remove(n);
        }
        w.subscribed = intern(&self.stream.server, &w.subscribed);
        DeltaAction::Respond {
            force,
            always: !sub.is_empty(),
        }
    }

    /// Sends what changed of `type_url` (`only` these names, else the
    /// whole subscription); returns the names sent.
    async fn respond(
        &mut self,
        ctx: &PushRequest,
        type_url: &str,
        only: Option<&BTreeSet<String>>,
        always: bool,
    ) -> Result<Vec<String>, Closed> {
        let Some(w) = self.watches.get(type_url) else {
            return Ok(Vec::new());
        };
        let names: Arc<BTreeSet<String>> = match only {
            Some(o) => Arc::new(o.clone()),
            None if w.wildcard => Arc::default(),
            None => w.subscribed.clone(),
        };
        if !w.wildcard && names.is_empty() && !always {
            return Ok(Vec::new());
        }
        let generated = match ctx.ctx.generate(&self.stream.proxy, type_url, &names) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(target: "ads", "{}: generation failed for {}: {e}", short_name(type_url), self.stream.id);
                return Ok(Vec::new());
            }
        };
        let Some(w) = self.watches.get_mut(type_url) else {
            return Ok(Vec::new());
        };
        let mut changed = Vec::new();
        let (mut present, mut held) = (0usize, 0usize);
        let in_scope = |r: &Arc<Resource>| w.wildcard || w.subscribed.contains(&r.name);
        for r in generated.iter().filter(|r| in_scope(r)) {
            present += 1;
            match w.sent.holding(r) {
                Holding::Same => held += 1,
                Holding::Other => {
                    held += 1;
                    changed.push(r.clone());
                }
                Holding::No => changed.push(r.clone()),
            }
        }
        // Removals: what the client has that no longer exists (in scope).
        // When everything it holds (or asked for) was generated, nothing is.
        let complete = match (only, w.wildcard) {
            (Some(o), _) => present == o.len(),
            (None, true) => held == w.sent.len(),
            (None, false) => present == w.subscribed.len(),
        };
        let removed: Vec<String> = if complete {
            Vec::new()
        } else {
            let generated: HashSet<&str> = generated
                .iter()
                .filter(|r| in_scope(r))
                .map(|r| r.name.as_str())
                .collect();
            let scope: Vec<String> = match (only, w.wildcard) {
                (Some(o), _) => o.iter().cloned().collect(),
                (None, true) => w.sent.names().map(str::to_string).collect(),
                (None, false) => w.subscribed.iter().cloned().collect(),
            };
            scope
                .into_iter()
                .filter(|n| !generated.contains(n.as_str()) && w.sent.contains(n))
                .collect()
        };
        if changed.is_empty() && removed.is_empty() && !always {
            return Ok(Vec::new());
        }
        for n in &removed {
            w.sent.remove(n);
        }
        let sent: Vec<String> = changed.iter().map(|r| r.name.clone()).collect();
        for r in &changed {
            w.sent.insert_sent(r.clone());
        }
        let nonce = nonce();
        w.nonce_sent = Some(nonce.clone());
        let version = ctx.ctx.version().to_string();
        tracing::info!(
            target: "ads",
            "{}: PUSH{} for node:{} resources:{} removed:{}",
            short_name(type_url),
            if only.is_some() { " INC" } else { "" },
            self.stream.proxy.id,
            changed.len(),
            removed.len()
        );
        let count = changed.len();
        let watched = w.subscribed.clone();
        let response = Encoded::delta(&version, type_url, &nonce, changed, &removed);
        self.stream
            .server
            .update_status(&self.stream.id, type_url, |s| {
                s.sent_version = version;
                s.sent_nonce = nonce;
                s.resources = count;
                s.names = watched;
            });
        self.stream.server.count_response(type_url, response.len());
        self.stream.outbox.send(response).await?;
        Ok(sent)
    }

    /// Istio's forceEDSPush (envoy#33607): an updated EDS cluster warms
    /// until its endpoints are sent again, so they are treated as unsent.
    fn forget_endpoints(&mut self, clusters: &[String]) {
        if let Some(eds) = self.watches.get_mut(ENDPOINT_TYPE) {
            for n in clusters {
                eds.sent.remove(n);
            }
        }
    }
}

impl DeltaConn {
    /// Answers a debug request ([`statusgen`]); a refused one ends the
    /// stream with its status.
    async fn debug(
        &mut self,
        ctx: &PushRequest,
        type_url: &str,
        names: &BTreeSet<String>,
    ) -> Result<(), Closed> {
        let server = &self.stream.server;
        match statusgen::answer(server, ctx, &self.stream.proxy, type_url, names).await {
            Ok(resources) => {
                let response =
                    Encoded::delta(ctx.ctx.version(), type_url, &nonce(), resources, &[]);
                self.stream.outbox.send(response).await
            }
            Err(e) => {
                tracing::warn!(target: "ads", "{type_url}: refused for {}: {e}", self.stream.id);
                self.stream.outbox.end(e.into());
                Err(Closed)
            }
        }
    }
}

impl Protocol for DeltaConn {
    type Request = DeltaDiscoveryRequest;
    type Reply = Reply;
    const DELTA: bool = true;

    fn health(req: &DeltaDiscoveryRequest) -> Option<crate::autoregistration::HealthEvent> {
        crate::autoregistration::HealthEvent::of_request(&req.type_url, req.error_detail.as_ref())
    }

    fn node(req: &DeltaDiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }

    fn stream(&self) -> &Stream {
        &self.stream
    }

    fn on_request(&mut self, req: &DeltaDiscoveryRequest) -> Option<Reply> {
        if common::xds::is_debug_type(&req.type_url) {
            // Answered once; never a watch (Istio's StatusGen.GenerateDeltas).
            return Some(Reply {
                type_url: req.type_url.clone(),
                only: Some(req.resource_names_subscribe.iter().cloned().collect()),
                always: true,
            });
        }
        let DeltaAction::Respond { force, always } = self.action(req) else {
            return None;
        };
        let wildcard = self.watches.get(&req.type_url).is_some_and(|w| w.wildcard);
        Some(Reply {
            type_url: req.type_url.clone(),
            only: (!force.is_empty() && !wildcard).then_some(force),
            always,
        })
    }

    async fn reply(&mut self, reply: Reply, ctx: &PushRequest) -> Result<(), Closed> {
        if common::xds::is_debug_type(&reply.type_url) {
            let names = reply.only.unwrap_or_default();
            return self.debug(ctx, &reply.type_url, &names).await;
        }
        self.respond(ctx, &reply.type_url, reply.only.as_ref(), reply.always)
            .await?;
        if reply.type_url == CLUSTER_TYPE && self.watches.contains_key(ENDPOINT_TYPE) {
            // After any CDS request every watched load assignment is sent again.
            if let Some(w) = self.watches.get_mut(ENDPOINT_TYPE) {
                w.sent.clear();
            }
            self.respond(ctx, ENDPOINT_TYPE, None, false).await?;
        }
        Ok(())
    }

    async fn push(&mut self, req: &PushRequest, plan: &PushPlan) -> Result<(), Closed> {
        for t in PUSH_ORDER {
            if !plan.types.has(t) {
                continue;
            }
            let Some(w) = self.watches.get(t) else {
                continue;
            };
            match (&plan.eds_hosts, t) {
                (_, CLUSTER_TYPE) => {
                    let changed = self.respond(req, t, None, false).await?;
                    self.forget_endpoints(&changed);
                }
                (_, SECRET_TYPE) => {
                    // Only the resources naming a changed Secret (delta
                    // would leave the others out as unchanged anyway).
                    let subscribed: BTreeSet<String> = w.subscribed.iter().cloned().collect();
                    let names = match &plan.secrets {
                        Some(changed) => {
                            sds::watching(&subscribed, &self.stream.proxy.namespace, changed)
                        }
                        None => subscribed,
                    };
                    if !names.is_empty() {
                        self.respond(req, t, Some(&names), false).await?;
                    }
                }
                (Some(hosts), ENDPOINT_TYPE) => {
                    let names: BTreeSet<String> = if w.wildcard {
                        w.sent.names().map(str::to_string).collect()
                    } else {
                        w.subscribed.iter().cloned().collect()
                    };
                    let names: BTreeSet<String> = names
                        .into_iter()
                        .filter(|n| hosts.contains(cluster_host(n)))
                        .collect();
                    if !names.is_empty() {
                        self.respond(req, t, Some(&names), false).await?;
                    }
                }
                _ => {
                    self.respond(req, t, None, false).await?;
                }
            }
        }
        Ok(())
    }
}

/// Serves one delta stream.
pub(super) async fn run(
    server: DiscoveryServer,
    identities: Identities,
    inbound: Requests<DeltaDiscoveryRequest>,
    outbox: Outbox,
) {
    connection::run(server, identities, inbound, outbox, |stream| DeltaConn {
        stream,
        watches: HashMap::new(),
    })
    .await;
}
