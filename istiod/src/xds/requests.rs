//! A stream's requests, decoded from its gRPC frames. Unlike tonic's
//! decoder, the buffer does not keep the size of the largest request ever
//! received (an EDS request names every cluster, tens of KiB, on each ACK):
//! once a request is decoded and nothing is left over, a large buffer is
//! let go, so an idle stream holds a few bytes rather than its peak.

use bytes::{Buf, BytesMut};
use http_body_util::BodyExt;
use tonic::Status;
use tonic::body::Body;

/// Larger than this, the buffer is dropped once empty.
const KEEP_BYTES: usize = 8 * 1024;
/// gRPC's frame header: a compression flag and the message length.
const HEADER: usize = 5;

/// The requests of one stream.
pub struct Requests<M> {
    body: Body,
    buf: BytesMut,
    max: usize,
    done: bool,
    _message: std::marker::PhantomData<fn() -> M>,
}

impl<M: prost::Message + Default> Requests<M> {
    /// Requests from `body`, each at most `max` bytes.
    pub fn new(body: Body, max: usize) -> Self {
        Self {
            body,
            buf: BytesMut::new(),
            max,
            done: false,
            _message: std::marker::PhantomData,
        }
    }

    /// A whole message at the front of the buffer, if one is there.
    fn take(&mut self) -> Result<Option<M>, Status> {
        if self.buf.len() < HEADER {
            return Ok(None);
        }
        if self.buf[0] != 0 {
            return Err(Status::unimplemented(
                "compressed messages are not supported (send grpc-encoding identity)",
            ));
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > self.max {
            return Err(Status::resource_exhausted(format!(
                "message of {len} bytes is larger than the limit of {} bytes",
                self.max
            )));
        }
        if self.buf.len() < HEADER + len {
            self.buf.reserve(HEADER + len - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(HEADER);
        let message = self.buf.split_to(len).freeze();
        let decoded = M::decode(message)
            .map_err(|e| Status::internal(format!("cannot decode the request: {e}")))?;
        if self.buf.is_empty() && self.buf.capacity() > KEEP_BYTES {
            self.buf = BytesMut::new();
        }
        Ok(Some(decoded))
    }

    /// The next request; `None` once the peer has ended its side.
    pub async fn message(&mut self) -> Result<Option<M>, Status> {
        loop {
            if let Some(m) = self.take()? {
                return Ok(Some(m));
            }
            if self.done {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(Status::internal("the stream ended inside a message"))
                };
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(status)) => return Err(status),
                None => self.done = true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use proto::pb::envoy::service::discovery::v3::DiscoveryRequest;

    fn framed(m: &DiscoveryRequest) -> Vec<u8> {
        let body = m.encode_to_vec();
        let mut out = vec![0];
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    fn body(chunks: Vec<Vec<u8>>) -> Body {
        let frames = chunks
            .into_iter()
            .map(|c| Ok::<_, Status>(http_body::Frame::data(bytes::Bytes::from(c))));
        Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            frames,
        )))
    }

    fn request(names: usize) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: "t".into(),
            resource_names: (0..names)
                .map(|i| format!("outbound|80||svc-{i}.ns.svc.cluster.local"))
                .collect(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn messages_split_across_frames_decode_and_a_large_buffer_is_let_go() {
        let (big, small) = (request(2000), request(1));
        let mut wire = framed(&big);
        wire.extend(framed(&small));
        // Cut into uneven frames, one boundary inside the header.
        let cut = [3, 4000, wire.len() - 3];
        let mut chunks = Vec::new();
        let mut at = 0;
        for c in cut {
            chunks.push(wire[at..c].to_vec());
            at = c;
        }
        chunks.push(wire[at..].to_vec());
        let mut r = Requests::<DiscoveryRequest>::new(body(chunks), 4 << 20);
        assert_eq!(r.message().await.unwrap(), Some(big));
        assert_eq!(r.message().await.unwrap(), Some(small));
        assert!(r.buf.capacity() <= KEEP_BYTES, "{}", r.buf.capacity());
        assert_eq!(r.message().await.unwrap(), None);
    }

    #[tokio::test]
    async fn oversized_and_truncated_messages_are_errors() {
        let wire = framed(&request(100));
        let mut r = Requests::<DiscoveryRequest>::new(body(vec![wire.clone()]), 100);
        assert_eq!(
            r.message().await.unwrap_err().code(),
            tonic::Code::ResourceExhausted
        );
        let mut r = Requests::<DiscoveryRequest>::new(body(vec![wire[..20].to_vec()]), 4 << 20);
        assert_eq!(r.message().await.unwrap_err().code(), tonic::Code::Internal);
    }
}
