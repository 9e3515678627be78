//! State-of-the-world ADS (`StreamAggregatedResources`): per-type watches
//! with Istio's nonce/ACK/NACK rules (`pkg/xds/server.go ShouldRespond`),
//! each response the full set of a wildcard type or the named resources.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::requests::Requests;
use proto::pb::envoy::service::discovery::v3::DiscoveryRequest;

use proto::pb::envoy::config::core::v3::Node;

use super::connection::{self, Protocol, Stream};
use super::outbox::{Closed, Outbox};
use super::server::{DiscoveryServer, Identities, NamesDigest, names_digest, nonce};
use super::wire::Encoded;
use super::{
    CLUSTER_TYPE, ENDPOINT_TYPE, PUSH_ORDER, SECRET_TYPE, is_wildcard, sds, short_name, statusgen,
};
use crate::pushctx::names::cluster_host;
use crate::pushctx::{PushPlan, PushRequest};

#[derive(Default)]
struct Watch {
    /// The subscribed names, shared with the pushes that generate them.
    names: Arc<BTreeSet<String>>,
    /// [`names_digest`] of `names`: an ACK that repeats them (Envoy sends
    /// every EDS name with every ACK) is told apart without a new set.
    digest: NamesDigest,
    nonce_sent: Option<String>,
    always_respond: bool,
}

struct SotwConn {
    stream: Stream,
    watches: HashMap<String, Watch>,
}

impl SotwConn {
    /// Applies a request; returns the names to answer with (`None` = no response).
    fn should_respond(&mut self, req: &DiscoveryRequest) -> Option<Arc<BTreeSet<String>>> {
        let t = req.type_url.as_str();
        let metrics = self.stream.server.metrics();
        if let Some(err) = &req.error_detail {
            self.stream.nacked(t, &err.message);
            return None;
        }
        if !is_wildcard(t) && req.resource_names.is_empty() {
            // Unsubscribe from a named type.
            self.watches.remove(t);
            return None;
        }
        let digest = names_digest(req.resource_names.iter().map(String::as_str));
        let server = self.stream.server.clone();
        let set = || -> Arc<BTreeSet<String>> {
            server.intern_names(digest, || {
                Arc::new(req.resource_names.iter().cloned().collect())
            })
        };
        if req.response_nonce.is_empty() || !self.watches.contains_key(t) {
            // Initial request, or a reconnect to this istiod: respond in full.
            let names = set();
            self.watches.insert(
                t.to_string(),
                Watch {
                    names: names.clone(),
                    digest,
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
            tracing::debug!(target: "ads", "ADS:{}: REQ {} expired nonce received {}", short_name(t), self.stream.id, req.response_nonce);
            return None;
        }
        let nonce = req.response_nonce.clone();
        self.stream.server.update_status(&self.stream.id, t, |s| {
            s.acked_nonce = nonce;
            s.last_error = None;
        });
        let unchanged = w.digest == digest;
        if !unchanged {
            w.digest = digest;
        }
        if std::mem::take(&mut w.always_respond) {
            if !unchanged {
                w.names = set();
            }
            return Some(w.names.clone());
        }
        if unchanged {
            return None;
        }
        let names = set();
        let added: BTreeSet<String> = names.difference(&w.names).cloned().collect();
        w.names = names.clone();
        if is_wildcard(t) {
            Some(names)
        } else if added.is_empty() {
            None
        } else {
            Some(Arc::new(added))
        }
    }

    async fn respond(
        &mut self,
        ctx: &PushRequest,
        type_url: &str,
        names: &BTreeSet<String>,
        incremental: bool,
    ) -> Result<(), Closed> {
        let resources = match ctx.ctx.generate(&self.stream.proxy, type_url, names) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(target: "ads", "{}: generation failed for {}: {e}", short_name(type_url), self.stream.id);
                return Ok(());
            }
        };
        let nonce = nonce();
        let version = ctx.ctx.version().to_string();
        let count = resources.len();
        let response = Encoded::sotw(&version, type_url, &nonce, resources);
        tracing::info!(
            target: "ads",
            "{}: PUSH{} for node:{} resources:{} size:{}",
            short_name(type_url),
            if incremental { " INC" } else { "" },
            self.stream.proxy.id,
            count,
            response.len()
        );
        let watched = self.watches.get_mut(type_url).map(|w| {
            w.nonce_sent = Some(nonce.clone());
            w.names.clone()
        });
        self.stream
            .server
            .update_status(&self.stream.id, type_url, |s| {
                s.sent_version = version;
                s.sent_nonce = nonce;
                s.resources = count;
                if let Some(names) = watched {
                    s.names = names;
                }
            });
        self.stream.server.count_response(type_url, response.len());
        self.stream.outbox.send(response).await
    }
}

impl SotwConn {
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
                tracing::debug!(target: "ads", "{type_url}: answering {} with {} resources", self.stream.id, resources.len());
                let response = Encoded::sotw_from(
                    ctx.ctx.version(),
                    type_url,
                    &nonce(),
                    resources,
                    server.control_plane(),
                );
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

impl Protocol for SotwConn {
    type Request = DiscoveryRequest;
    type Reply = (String, Arc<BTreeSet<String>>);
    const DELTA: bool = false;

    fn node(req: &DiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }

    fn health(req: &DiscoveryRequest) -> Option<crate::autoregistration::HealthEvent> {
        crate::autoregistration::HealthEvent::of_request(&req.type_url, req.error_detail.as_ref())
    }

    fn stream(&self) -> &Stream {
        &self.stream
    }

    fn on_request(&mut self, req: &DiscoveryRequest) -> Option<Self::Reply> {
        if common::xds::is_debug_type(&req.type_url) {
            // Answered once; never a watch (Istio's processRequest).
            let names = req.resource_names.iter().cloned().collect();
            return Some((req.type_url.clone(), Arc::new(names)));
        }
        self.should_respond(req)
            .map(|names| (req.type_url.clone(), names))
    }

    async fn reply(&mut self, reply: Self::Reply, ctx: &PushRequest) -> Result<(), Closed> {
        let (type_url, names) = reply;
        if common::xds::is_debug_type(&type_url) {
            return self.debug(ctx, &type_url, &names).await;
        }
        self.respond(ctx, &type_url, &names, false).await
    }

    async fn push(&mut self, req: &PushRequest, plan: &PushPlan) -> Result<(), Closed> {
        for t in PUSH_ORDER {
            if !plan.types.has(t) {
                continue;
            }
            let Some(w) = self.watches.get(t) else {
                continue;
            };
            let names: Arc<BTreeSet<String>> = match (&plan.eds_hosts, t) {
                (Some(hosts), ENDPOINT_TYPE) => Arc::new(
                    w.names
                        .iter()
                        .filter(|n| hosts.contains(cluster_host(n)))
                        .cloned()
                        .collect(),
                ),
                (_, SECRET_TYPE) => match &plan.secrets {
                    Some(changed) => Arc::new(sds::watching(
                        &w.names,
                        &self.stream.proxy.namespace,
                        changed,
                    )),
                    None => w.names.clone(),
                },
                _ => w.names.clone(),
            };
            if !is_wildcard(t) && names.is_empty() {
                continue;
            }
            let incremental = t == ENDPOINT_TYPE && plan.eds_hosts.is_some();
            self.respond(req, t, &names, incremental).await?;
        }
        Ok(())
    }
}

/// Serves one state-of-the-world stream.
pub(super) async fn run(
    server: DiscoveryServer,
    identities: Identities,
    inbound: Requests<DiscoveryRequest>,
    outbox: Outbox,
) {
    connection::run(server, identities, inbound, outbox, |stream| SotwConn {
        stream,
        watches: HashMap::new(),
    })
    .await;
}
