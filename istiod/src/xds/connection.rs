//! One ADS stream's life, for either protocol: its requests answered as
//! they come, and pushes taken from the latest [`PushRequest`] (Istio's
//! `pushConnection`). A push is planned for the stream's proxy first (a
//! change it cannot see costs it nothing, not even a turn); then the stream
//! waits for a turn under the push throttle, takes along any push
//! published meanwhile, sends what the plan names and keeps the turn until
//! the transport has taken it all.

use std::future::Future;

use super::requests::Requests;
use proto::pb::envoy::config::core::v3::Node;

use super::outbox::{Closed, Outbox};
use super::server::{DiscoveryServer, Ended, Identities, init_proxy};
use crate::autoregistration::{HealthEvent, Registration};
use crate::pushctx::{Proxy, PushPlan, PushRequest};

/// What every stream has, whatever its protocol.
pub(super) struct Stream {
    /// The server it belongs to.
    pub server: DiscoveryServer,
    /// The proxy at the other end.
    pub proxy: Proxy,
    /// The connection id (`<proxyID>-<counter>`).
    pub id: String,
    /// Where its responses go.
    pub outbox: Outbox,
    /// The WorkloadEntry the connection controls (auto-registration).
    pub registration: Option<Registration>,
}

impl Stream {
    /// A NACK of `type_url`: counted in `pilot_total_xds_rejects` by type and
    /// kept as the stream's last error for `/debug/syncz`.
    pub fn nacked(&self, type_url: &str, message: &str) {
        let short = super::short_name(type_url);
        self.server
            .metrics()
            .rejects
            .with_label_values(&[&short.to_lowercase()])
            .inc();
        tracing::warn!(target: "ads", "ADS:{}: ACK ERROR {} {}", short, self.id, message);
        let msg = message.to_string();
        self.server
            .update_status(&self.id, type_url, |s| s.last_error = Some(msg));
    }
}

/// What the protocols (state of the world, delta) do for the driver.
pub(super) trait Protocol: Send {
    /// The protocol's request message.
    type Request: prost::Message + Default + Send + 'static;
    /// Whether this is delta xDS (for logs and `/debug/adsz`).
    const DELTA: bool;

    /// The node a request carries (the first request's says who connects).
    fn node(req: &Self::Request) -> Option<&Node>;
    /// The health an agent reports, when the request is an
    /// `istio.io/health` one (Istio's `handleWorkloadHealthcheck`).
    fn health(req: &Self::Request) -> Option<HealthEvent>;
    /// A response a request asked for.
    type Reply: Send;

    /// The stream's common part.
    fn stream(&self) -> &Stream;
    /// Applies a request (ACK, NACK, subscription); the response it needs, if any.
    fn on_request(&mut self, req: &Self::Request) -> Option<Self::Reply>;
    /// Sends the response a request asked for, from `ctx`.
    fn reply(
        &mut self,
        reply: Self::Reply,
        ctx: &PushRequest,
    ) -> impl Future<Output = Result<(), Closed>> + Send;
    /// Sends what `plan` names from `req`.
    fn push(
        &mut self,
        req: &PushRequest,
        plan: &PushPlan,
    ) -> impl Future<Output = Result<(), Closed>> + Send;
}

/// Serves one stream: its first request names the proxy, which must be
/// one the caller may speak for; `open` makes the connection's state.
pub(super) async fn run<P: Protocol>(
    server: DiscoveryServer,
    identities: Identities,
    mut inbound: Requests<P::Request>,
    outbox: Outbox,
    open: impl FnOnce(Stream) -> P,
) {
    let kind = if P::DELTA {
        "delta connection"
    } else {
        "connection"
    };
    let first = match inbound.message().await {
        Ok(Some(r)) => r,
        _ => return,
    };
    let proxy = match init_proxy(P::node(&first), &identities) {
        Ok(p) => p,
        Err(status) => {
            tracing::warn!(target: "ads", "ADS: {kind} rejected: {}", status.message());
            outbox.end(status);
            return;
        }
    };
    // Istio's `isProxy`: a node with `PROXY_CONFIG` metadata.
    let is_proxy = P::node(&first)
        .and_then(|n| n.metadata.as_ref())
        .is_some_and(|m| common::NodeMetadata::from_struct(m).proxy_config.is_some());
    let id = server.register(&proxy, P::DELTA, is_proxy);
    tracing::info!(target: "ads", "ADS: new {kind} for node:{id}");
    // Istio's `initializeProxy`: the WorkloadEntry first, a refusal ends
    // the stream.
    let connected_at = std::time::SystemTime::now();
    let registration = match server.autoregistration() {
        Some(c) => match c.on_connect(&proxy.registrant(), connected_at).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(target: "ads", "ADS: {id} refused: {e}");
                outbox.end(e.into());
                server.unregister(&id, &proxy);
                return;
            }
        },
        None => None,
    };
    let mut conn = open(Stream {
        server: server.clone(),
        proxy,
        id: id.clone(),
        outbox,
        registration,
    });
    if let Err(Ended::Status(status)) = serve(&server, &mut conn, &mut inbound, first).await {
        conn.stream().outbox.end(status);
    }
    tracing::info!(target: "ads", "ADS: {id} terminated");
    server.unregister(&id, &conn.stream().proxy);
    if let (Some(c), Some(reg)) = (server.autoregistration(), &conn.stream().registration) {
        c.on_disconnect(reg.clone(), std::time::SystemTime::now());
    }
}

/// Serves a stream whose first request was `first`, until the peer or
/// istiod ends it.
async fn serve<P: Protocol>(
    server: &DiscoveryServer,
    conn: &mut P,
    inbound: &mut Requests<P::Request>,
    first: P::Request,
) -> Result<(), Ended> {
    let mut pushes = server.pushes();
    let mut seen = pushes
        .borrow_and_update()
        .as_ref()
        .map(|p| p.seq)
        .unwrap_or(0);
    let mut next = Some(first);
    let ended = server.drain().clone().stream_ended();
    tokio::pin!(ended);
    // Whether pushes can still come: the push pipeline stops first at
    // shutdown, and a draining stream then waits for the drain to close it.
    let mut pushes_open = true;
    loop {
        if let Some(req) = next.take() {
            if let Some(event) = P::health(&req) {
                health(server, conn.stream(), &event);
                continue;
            }
            let (Some(reply), Some(ctx)) = (conn.on_request(&req), server.current()) else {
                continue;
            };
            let _turn = server.throttle().await;
            let id = conn.stream().id.clone();
            server
                .write(&id, async {
                    conn.reply(reply, &ctx).await?;
                    conn.stream().outbox.drained().await
                })
                .await?;
            continue;
        }
        tokio::select! {
            why = &mut ended => {
                tracing::info!(target: "ads", "ADS: {} closed: {why}", conn.stream().id);
                return Err(Ended::Status(tonic::Status::unavailable(why)));
            }
            req = inbound.message() => match req {
                Ok(Some(r)) => next = Some(r),
                Ok(None) => return Ok(()),
                Err(e) => {
                    tracing::debug!(target: "ads", "ADS: {} terminated: {e}", conn.stream().id);
                    return Ok(());
                }
            },
            changed = pushes.changed(), if pushes_open => {
                if changed.is_err() {
                    if !server.drain().drains() {
                        return Ok(());
                    }
                    pushes_open = false;
                    continue;
                }
                let Some(latest) = pushes.borrow_and_update().clone() else { continue };
                push(server, conn, &mut pushes, &mut seen, latest).await?;
            }
        }
    }
}

/// An agent's health report: to the controller, for the stream's entry.
fn health(server: &DiscoveryServer, stream: &Stream, event: &HealthEvent) {
    match (server.autoregistration(), &stream.registration) {
        (Some(c), Some(reg)) => c.on_health(reg, event, std::time::SystemTime::now()),
        _ => {
            tracing::debug!(target: "ads", "ADS: {} health report ignored (no WorkloadEntry controlled)", stream.id)
        }
    }
}

async fn push<P: Protocol>(
    server: &DiscoveryServer,
    conn: &mut P,
    pushes: &mut tokio::sync::watch::Receiver<Option<PushRequest>>,
    seen: &mut u64,
    latest: PushRequest,
) -> Result<(), Ended> {
    if server.plan(&conn.stream().proxy, *seen, &latest).is_empty() {
        tracing::debug!(target: "ads", "Skipping push to {}, no updates required", conn.stream().id);
        *seen = latest.seq;
        return Ok(());
    }
    let _turn = server.throttle().await;
    // Pushes published while this one waited for its turn go with it.
    let req = match pushes.has_changed() {
        Ok(true) => pushes.borrow_and_update().clone().unwrap_or(latest),
        _ => latest,
    };
    let plan = server.plan(&conn.stream().proxy, *seen, &req);
    *seen = req.seq;
    if plan.is_empty() {
        return Ok(());
    }
    let id = conn.stream().id.clone();
    server
        .write(&id, async {
            conn.push(&req, &plan).await?;
            conn.stream().outbox.drained().await
        })
        .await?;
    server
        .metrics()
        .convergence
        .observe(req.start.elapsed().as_secs_f64());
    Ok(())
}
