//! A stream's responses on their way to the transport, bounded in bytes.
//!
//! The connection queues [`Encoded`] responses with [`Outbox::send`], which
//! waits while more than [`STREAM_QUEUE_BYTES`] are queued and not yet taken
//! by HTTP/2. The [`ResponseBody`] hands them to hyper chunk by chunk; hyper
//! asks for the next chunk only once the stream's flow-control window has
//! room, so a response's bytes count as queued until the peer has taken
//! all but a window's worth of them. [`Outbox::drained`] waits until nothing
//! is queued: a push holds its throttle permit until then, as Istio's push
//! holds it through gRPC's blocking `Send`. A client that stops reading
//! holds at most one push's worth of bytes, and stalls only itself.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tonic::Status;

use super::wire::{Chunks, Encoded};

/// How many bytes of responses one stream may have queued.
pub const STREAM_QUEUE_BYTES: usize = 4 * 1024 * 1024;

/// The stream was closed by the peer (or istiod is shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the stream is closed")]
pub struct Closed;

enum Outgoing {
    Message(Encoded, OwnedSemaphorePermit),
    End(Status),
}

/// The sending side.
pub struct Outbox {
    tx: mpsc::UnboundedSender<Outgoing>,
    budget: Arc<Semaphore>,
    capacity: u32,
}

impl Outbox {
    /// An outbox of `capacity` bytes and the response body it feeds.
    pub fn new(capacity: usize) -> (Outbox, ResponseBody) {
        let capacity = u32::try_from(capacity.max(1)).unwrap_or(u32::MAX);
        let (tx, rx) = mpsc::unbounded_channel();
        let outbox = Outbox {
            tx,
            budget: Arc::new(Semaphore::new(capacity as usize)),
            capacity,
        };
        let body = ResponseBody {
            rx,
            current: None,
            done: false,
        };
        (outbox, body)
    }

    /// Queues a response, waiting while the stream has its fill queued. A
    /// response larger than the whole budget waits for an empty queue.
    pub async fn send(&self, msg: Encoded) -> Result<(), Closed> {
        let n = u32::try_from(msg.len())
            .unwrap_or(u32::MAX)
            .clamp(1, self.capacity);
        let permit = self
            .budget
            .clone()
            .acquire_many_owned(n)
            .await
            .map_err(|_| Closed)?;
        self.tx
            .send(Outgoing::Message(msg, permit))
            .map_err(|_| Closed)
    }

    /// Ends the stream with `status` after what is queued.
    pub fn end(&self, status: Status) {
        let _ = self.tx.send(Outgoing::End(status));
    }

    /// Waits until every queued response has been taken by the transport.
    pub async fn drained(&self) -> Result<(), Closed> {
        let all = self
            .budget
            .acquire_many(self.capacity)
            .await
            .map_err(|_| Closed)?;
        drop(all);
        if self.tx.is_closed() {
            return Err(Closed);
        }
        Ok(())
    }

    /// Bytes queued and not yet taken (tests).
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.capacity as usize - self.budget.available_permits()
    }
}

/// The HTTP/2 response body of one ADS stream: gRPC frames, then trailers.
pub struct ResponseBody {
    rx: mpsc::UnboundedReceiver<Outgoing>,
    current: Option<(Chunks, OwnedSemaphorePermit)>,
    done: bool,
}

fn trailers(status: &Status) -> HeaderMap {
    let mut map = HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        map.insert("grpc-status", http::HeaderValue::from_static("13"));
    }
    map
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        loop {
            if let Some((chunks, _permit)) = &mut this.current {
                if let Some(chunk) = chunks.next() {
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                // Taken in full: its bytes leave the budget.
                this.current = None;
            }
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(Outgoing::Message(msg, permit))) => {
                    this.current = Some((msg.chunks(), permit));
                }
                Poll::Ready(Some(Outgoing::End(status))) => {
                    this.done = true;
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)))));
                }
                Poll::Ready(None) => {
                    this.done = true;
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers(&Status::ok(""))))));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pushctx::Resource;
    use http_body_util::BodyExt;
    use proto::pb::google::protobuf::Any;

    fn msg(size: usize) -> Encoded {
        let r = Arc::new(Resource::new(
            "r".into(),
            Any {
                type_url: "t".into(),
                value: vec![1; size],
            },
        ));
        Encoded::sotw("v", "t", "n", vec![r])
    }

    #[tokio::test]
    async fn sends_wait_while_the_stream_has_its_fill_queued() {
        let (outbox, mut body) = Outbox::new(1000);
        outbox.send(msg(600)).await.unwrap();
        assert!(outbox.queued() > 600);
        // A second response does not fit until the first is taken.
        let second =
            tokio::time::timeout(std::time::Duration::from_millis(50), outbox.send(msg(600)));
        assert!(second.await.is_err(), "the queue is full");
        // The transport takes the first response, then asks for more.
        let frame = body.frame().await.unwrap().unwrap();
        assert!(frame.is_data());
        let pending = tokio::time::timeout(std::time::Duration::from_millis(50), body.frame());
        assert!(pending.await.is_err(), "nothing else is queued");
        assert_eq!(
            outbox.queued(),
            0,
            "taken in full, its bytes left the queue"
        );
        outbox.send(msg(600)).await.unwrap();
        drop(outbox);
        assert!(body.frame().await.unwrap().unwrap().is_data());
        let end = body.frame().await.unwrap().unwrap();
        let trailers = end.into_trailers().unwrap();
        assert_eq!(trailers.get("grpc-status").unwrap(), "0");
        assert!(body.frame().await.is_none());
    }

    #[tokio::test]
    async fn drained_waits_for_the_transport_and_fails_once_the_peer_is_gone() {
        let (outbox, mut body) = Outbox::new(10_000);
        outbox.send(msg(100)).await.unwrap();
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), outbox.drained());
        assert!(waiting.await.is_err(), "queued, not yet taken");
        let _ = body.frame().await;
        // Asking for the next frame releases the first one's bytes.
        let taker = tokio::spawn(async move { body.frame().await.is_some() });
        outbox.drained().await.unwrap();
        taker.abort();
        let _ = taker.await;
        assert_eq!(outbox.drained().await, Err(Closed));
        assert_eq!(outbox.send(msg(1)).await, Err(Closed));
    }

    #[tokio::test]
    async fn an_end_status_becomes_the_trailers() {
        let (outbox, mut body) = Outbox::new(10);
        outbox.end(Status::deadline_exceeded("timeout sending"));
        let t = body
            .frame()
            .await
            .unwrap()
            .unwrap()
            .into_trailers()
            .unwrap();
        assert_eq!(t.get("grpc-status").unwrap(), "4");
    }
}
