//! One ADS stream's life, for either protocol: its requests answered as
//! they come, and pushes taken from the latest [`PushRequest`] (Istio's
//! `pushConnection`). A push is planned for the stream's proxy first (a
//! change it cannot see costs it nothing, not even a turn); then the stream
//! waits for a turn under the push throttle, takes along any push
//! published meanwhile, sends what the plan names and keeps the turn until
//! the transport has taken it all.

use std::future::Future;

use tonic::Streaming;

use super::outbox::{Closed, Outbox};
use super::server::{DiscoveryServer, Ended};
use super::{Proxy, PushPlan, PushRequest};

/// What the protocols (state of the world, delta) do for the driver.
pub(super) trait Protocol: Send {
    /// The protocol's request message.
    type Request: Send + 'static;
    /// A response a request asked for.
    type Reply: Send;

    /// The connection id (`<proxyID>-<counter>`).
    fn id(&self) -> &str;
    /// The proxy.
    fn proxy(&self) -> &Proxy;
    /// The stream's outbox.
    fn outbox(&self) -> &Outbox;
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

/// Serves a stream whose first request was `first`, until the peer or
/// istiod ends it.
pub(super) async fn serve<P: Protocol>(
    server: &DiscoveryServer,
    conn: &mut P,
    inbound: &mut Streaming<P::Request>,
    first: P::Request,
) -> Result<(), Ended> {
    let mut pushes = server.pushes();
    let mut seen = pushes
        .borrow_and_update()
        .as_ref()
        .map(|p| p.seq)
        .unwrap_or(0);
    let mut next = Some(first);
    loop {
        if let Some(req) = next.take() {
            let (Some(reply), Some(ctx)) = (conn.on_request(&req), server.current()) else {
                continue;
            };
            let _turn = server.throttle().await;
            let id = conn.id().to_string();
            server
                .write(&id, async {
                    conn.reply(reply, &ctx).await?;
                    conn.outbox().drained().await
                })
                .await?;
            continue;
        }
        tokio::select! {
            req = inbound.message() => match req {
                Ok(Some(r)) => next = Some(r),
                Ok(None) => return Ok(()),
                Err(e) => {
                    tracing::debug!(target: "ads", "ADS: {} terminated: {e}", conn.id());
                    return Ok(());
                }
            },
            changed = pushes.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                let Some(latest) = pushes.borrow_and_update().clone() else { continue };
                push(server, conn, &mut pushes, &mut seen, latest).await?;
            }
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
    if server.plan(conn.proxy(), *seen, &latest).is_empty() {
        tracing::debug!(target: "ads", "Skipping push to {}, no updates required", conn.id());
        *seen = latest.seq;
        return Ok(());
    }
    let _turn = server.throttle().await;
    // Pushes published while this one waited for its turn go with it.
    let req = match pushes.has_changed() {
        Ok(true) => pushes.borrow_and_update().clone().unwrap_or(latest),
        _ => latest,
    };
    let plan = server.plan(conn.proxy(), *seen, &req);
    *seen = req.seq;
    if plan.is_empty() {
        return Ok(());
    }
    let id = conn.id().to_string();
    server
        .write(&id, async {
            conn.push(&req, &plan).await?;
            conn.outbox().drained().await
        })
        .await?;
    server
        .metrics()
        .convergence
        .observe(req.start.elapsed().as_secs_f64());
    Ok(())
}
