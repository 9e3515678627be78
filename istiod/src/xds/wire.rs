//! Responses on the wire: a `DiscoveryResponse` or `DeltaDiscoveryResponse`
//! is written as its gRPC frame straight from the shared resources, in
//! chunks of about [`CHUNK`] bytes, so a response never exists as one
//! buffer and no per-stream encoder buffer grows to the largest response.
//! Only the small fields are encoded per response; every resource's bytes
//! are copied once, from the XDS cache into the chunk being written.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};

use crate::pushctx::Resource;

/// The size chunks are cut at (a resource larger than this is one chunk).
pub const CHUNK: usize = 64 * 1024;

/// gRPC's frame header: a compression flag and the message length.
#[cfg(test)]
const GRPC_HEADER: usize = 5;

fn len_field(tag: u32, len: usize) -> usize {
    prost::encoding::key_len(tag) + encoded_len_varint(len as u64) + len
}

fn put_len_prefix(buf: &mut BytesMut, tag: u32, len: usize) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

fn put_bytes(buf: &mut BytesMut, tag: u32, value: &[u8]) {
    put_len_prefix(buf, tag, value.len());
    buf.put_slice(value);
}

/// The encoded length of a resource's `google.protobuf.Any`.
fn any_len(r: &Resource) -> usize {
    let t = r.resource.type_url.len();
    let v = r.resource.value.len();
    (if t > 0 { len_field(1, t) } else { 0 }) + (if v > 0 { len_field(2, v) } else { 0 })
}

fn put_any(buf: &mut BytesMut, r: &Resource) {
    if !r.resource.type_url.is_empty() {
        put_bytes(buf, 1, r.resource.type_url.as_bytes());
    }
    if !r.resource.value.is_empty() {
        put_bytes(buf, 2, &r.resource.value);
    }
}

/// `envoy.service.discovery.v3.Resource` fields: version 1, resource 2, name 3.
fn delta_entry_len(r: &Resource) -> usize {
    let version = r.version().len();
    len_field(1, version) + len_field(2, any_len(r)) + len_field(3, r.name.len())
}

/// One response, ready to be written.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// Fields before the resources.
    head: Bytes,
    resources: Vec<Arc<Resource>>,
    delta: bool,
    /// Fields after the resources.
    tail: Bytes,
    /// The message's encoded length.
    len: usize,
}

/// A string field, skipped when empty as protobuf does.
fn put_string(buf: &mut BytesMut, tag: u32, s: &str) {
    if !s.is_empty() {
        put_bytes(buf, tag, s.as_bytes());
    }
}

impl Encoded {
    /// A state-of-the-world response (`version_info` 1, `resources` 2,
    /// `type_url` 4, `nonce` 5).
    pub fn sotw(version: &str, type_url: &str, nonce: &str, resources: Vec<Arc<Resource>>) -> Self {
        Self::sotw_from(version, type_url, nonce, resources, "")
    }

    /// A state-of-the-world response naming the control plane
    /// (`control_plane` 6, its `identifier` 1), as debug answers do.
    pub fn sotw_from(
        version: &str,
        type_url: &str,
        nonce: &str,
        resources: Vec<Arc<Resource>>,
        control_plane: &str,
    ) -> Self {
        let mut head = BytesMut::new();
        put_string(&mut head, 1, version);
        let mut tail = BytesMut::new();
        put_string(&mut tail, 4, type_url);
        put_string(&mut tail, 5, nonce);
        if !control_plane.is_empty() {
            put_len_prefix(&mut tail, 6, len_field(1, control_plane.len()));
            put_string(&mut tail, 1, control_plane);
        }
        let body: usize = resources.iter().map(|r| len_field(2, any_len(r))).sum();
        Self::new(head, resources, false, tail, body)
    }

    /// A delta response (`system_version_info` 1, `resources` 2, `type_url`
    /// 4, `nonce` 5, `removed_resources` 6); each resource carries its
    /// name and version.
    pub fn delta(
        system_version: &str,
        type_url: &str,
        nonce: &str,
        resources: Vec<Arc<Resource>>,
        removed: &[String],
    ) -> Self {
        let mut head = BytesMut::new();
        put_string(&mut head, 1, system_version);
        let mut tail = BytesMut::new();
        put_string(&mut tail, 4, type_url);
        put_string(&mut tail, 5, nonce);
        for name in removed {
            put_bytes(&mut tail, 6, name.as_bytes());
        }
        let body: usize = resources
            .iter()
            .map(|r| len_field(2, delta_entry_len(r)))
            .sum();
        Self::new(head, resources, true, tail, body)
    }

    fn new(
        head: BytesMut,
        resources: Vec<Arc<Resource>>,
        delta: bool,
        tail: BytesMut,
        body: usize,
    ) -> Self {
        let len = head.len() + body + tail.len();
        Self {
            head: head.freeze(),
            resources,
            delta,
            tail: tail.freeze(),
            len,
        }
    }

    /// The encoded message's length (without gRPC's frame header).
    pub fn len(&self) -> usize {
        self.len
    }

    /// The gRPC frame, chunk by chunk.
    pub fn chunks(self) -> Chunks {
        Chunks {
            msg: self,
            next: 0,
            started: false,
            tail_done: false,
        }
    }

    fn put_resource(&self, buf: &mut BytesMut, r: &Resource) {
        if self.delta {
            put_len_prefix(buf, 2, delta_entry_len(r));
            put_bytes(buf, 1, r.version().as_bytes());
            put_len_prefix(buf, 2, any_len(r));
            put_any(buf, r);
            put_bytes(buf, 3, r.name.as_bytes());
        } else {
            put_len_prefix(buf, 2, any_len(r));
            put_any(buf, r);
        }
    }
}

/// The chunks of one response's gRPC frame.
pub struct Chunks {
    msg: Encoded,
    next: usize,
    started: bool,
    tail_done: bool,
}

impl Iterator for Chunks {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if self.tail_done {
            return None;
        }
        let mut buf = BytesMut::with_capacity(CHUNK + 64);
        if !self.started {
            self.started = true;
            buf.put_u8(0);
            buf.put_u32(self.msg.len as u32);
            buf.put_slice(&self.msg.head);
        }
        while self.next < self.msg.resources.len() && buf.len() < CHUNK {
            let r = self.msg.resources[self.next].clone();
            self.msg.put_resource(&mut buf, &r);
            self.next += 1;
        }
        if self.next == self.msg.resources.len() && buf.len() < CHUNK {
            buf.put_slice(&self.msg.tail);
            self.tail_done = true;
        }
        Some(buf.freeze())
    }
}

/// The whole frame as one buffer (tests).
#[cfg(test)]
fn frame(msg: Encoded) -> Vec<u8> {
    let mut out = Vec::with_capacity(GRPC_HEADER + msg.len());
    for c in msg.chunks() {
        out.extend_from_slice(&c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use proto::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse, Resource as DeltaResource,
    };
    use proto::pb::google::protobuf::Any;

    fn resources(n: usize, size: usize) -> Vec<Arc<Resource>> {
        (0..n)
            .map(|i| {
                Arc::new(Resource::new(
                    format!("outbound|80||svc-{i}.ns.svc.cluster.local"),
                    Any {
                        type_url: crate::xds::CLUSTER_TYPE.into(),
                        value: vec![i as u8; size],
                    },
                ))
            })
            .collect()
    }

    fn message(frame: &[u8]) -> &[u8] {
        assert_eq!(frame[0], 0, "uncompressed");
        let len = u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]) as usize;
        assert_eq!(
            len,
            frame.len() - GRPC_HEADER,
            "the header's length is the message's"
        );
        &frame[GRPC_HEADER..]
    }

    #[test]
    fn sotw_frames_decode_to_the_response_prost_would_build() {
        for (n, size) in [(0, 0), (1, 0), (3, 10), (200, 1500), (2, CHUNK * 2)] {
            let rs = resources(n, size);
            let encoded = Encoded::sotw("2026-12-02T00:00:00Z/7", "t", "nonce-1", rs.clone());
            let chunks: Vec<Bytes> = encoded.clone().chunks().collect();
            assert!(
                chunks.iter().all(|c| c.len() <= CHUNK + size + 128),
                "a chunk stops at the first resource past CHUNK"
            );
            let frame = frame(encoded);
            let got = DiscoveryResponse::decode(message(&frame)).unwrap();
            let want = DiscoveryResponse {
                version_info: "2026-12-02T00:00:00Z/7".into(),
                resources: rs.iter().map(|r| r.resource.clone()).collect(),
                type_url: "t".into(),
                nonce: "nonce-1".into(),
                ..Default::default()
            };
            assert_eq!(got, want, "{n} resources of {size} bytes");
            assert_eq!(message(&frame), want.encode_to_vec().as_slice());
        }
    }

    #[test]
    fn a_control_plane_identifier_is_encoded_as_prost_would() {
        let rs = resources(2, 10);
        let id = r#"{"Component":"istiod","ID":"istiod-1"}"#;
        let frame = frame(Encoded::sotw_from("v", "t", "n", rs.clone(), id));
        let want = DiscoveryResponse {
            version_info: "v".into(),
            resources: rs.iter().map(|r| r.resource.clone()).collect(),
            type_url: "t".into(),
            nonce: "n".into(),
            control_plane: Some(proto::pb::envoy::config::core::v3::ControlPlane {
                identifier: id.into(),
            }),
            ..Default::default()
        };
        assert_eq!(message(&frame), want.encode_to_vec().as_slice());
    }

    #[test]
    fn delta_frames_carry_names_versions_and_removals() {
        let rs = resources(50, 3000);
        let removed = vec!["gone-1".to_string(), "gone-2".to_string()];
        let frame = frame(Encoded::delta("v9", "t", "n", rs.clone(), &removed));
        let got = DeltaDiscoveryResponse::decode(message(&frame)).unwrap();
        let want = DeltaDiscoveryResponse {
            system_version_info: "v9".into(),
            resources: rs
                .iter()
                .map(|r| DeltaResource {
                    name: r.name.clone(),
                    version: r.version().to_string(),
                    resource: Some(r.resource.clone()),
                    ..Default::default()
                })
                .collect(),
            type_url: "t".into(),
            removed_resources: removed,
            nonce: "n".into(),
            ..Default::default()
        };
        assert_eq!(got, want);
    }
}
