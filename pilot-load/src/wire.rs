//! The simulated proxies' ADS messages, lighter than the generated ones:
//! responses keep each resource's bytes as a slice of the received buffer
//! (no copy, no `type_url` string per resource), and a state-of-the-world
//! request shares its resource names (an EDS ACK repeats a thousand of
//! them) instead of cloning them. They are wire-compatible with
//! `envoy.service.discovery.v3`'s messages: the fields used keep their
//! numbers, the others are skipped on decoding and never encoded.

use std::sync::Arc;

use ::bytes::{Buf, BufMut, Bytes};
use prost::encoding::{DecodeContext, WireType, bytes, message, skip_field, string};
use prost::{DecodeError, Message};
use proto::pb::envoy::config::core::v3::Node;

/// A `google.protobuf.Any`'s value only (field 2).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RawAny {
    /// The resource's encoding.
    pub value: Bytes,
}

impl Message for RawAny {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.value.is_empty() {
            bytes::encode(2, &self.value, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            2 => bytes::merge(wire_type, &mut self.value, buf, ctx),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        if self.value.is_empty() {
            0
        } else {
            prost::encoding::bytes::encoded_len(2, &self.value)
        }
    }

    fn clear(&mut self) {
        self.value.clear();
    }
}

/// Decoding only: encoding a response is istiod's job.
macro_rules! decode_only {
    () => {
        fn encode_raw(&self, _: &mut impl BufMut) {}

        fn encoded_len(&self) -> usize {
            0
        }

        fn clear(&mut self) {
            *self = Self::default();
        }
    };
}

/// `DiscoveryResponse`: version 1, resources 2, type 4, nonce 5.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Response {
    /// `version_info`.
    pub version_info: String,
    /// `resources`.
    pub resources: Vec<RawAny>,
    /// `type_url`.
    pub type_url: String,
    /// `nonce`.
    pub nonce: String,
}

impl Message for Response {
    decode_only!();

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => string::merge(wire_type, &mut self.version_info, buf, ctx),
            2 => message::merge_repeated(wire_type, &mut self.resources, buf, ctx),
            4 => string::merge(wire_type, &mut self.type_url, buf, ctx),
            5 => string::merge(wire_type, &mut self.nonce, buf, ctx),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }
}

/// `discovery.v3.Resource`: name 3, resource 2.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct DeltaResource {
    /// `name`.
    pub name: String,
    /// `resource`.
    pub resource: Option<RawAny>,
}

impl Message for DeltaResource {
    decode_only!();

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            3 => string::merge(wire_type, &mut self.name, buf, ctx),
            2 => message::merge(
                wire_type,
                self.resource.get_or_insert_with(RawAny::default),
                buf,
                ctx,
            ),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }
}

/// `DeltaDiscoveryResponse`: version 1, resources 2, type 4, nonce 5,
/// removed 6.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct DeltaResponse {
    /// `system_version_info`.
    pub system_version_info: String,
    /// `resources`.
    pub resources: Vec<DeltaResource>,
    /// `type_url`.
    pub type_url: String,
    /// `nonce`.
    pub nonce: String,
    /// `removed_resources`.
    pub removed_resources: Vec<String>,
}

impl Message for DeltaResponse {
    decode_only!();

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => string::merge(wire_type, &mut self.system_version_info, buf, ctx),
            2 => message::merge_repeated(wire_type, &mut self.resources, buf, ctx),
            4 => string::merge(wire_type, &mut self.type_url, buf, ctx),
            5 => string::merge(wire_type, &mut self.nonce, buf, ctx),
            6 => string::merge_repeated(wire_type, &mut self.removed_resources, buf, ctx),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }
}

/// `DiscoveryRequest`: version 1, node 2, names 3, type 4, nonce 5.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Request {
    /// `version_info`.
    pub version_info: String,
    /// `node` (the first request's).
    pub node: Option<Node>,
    /// `resource_names`, shared between the requests that repeat them.
    pub resource_names: Arc<Vec<String>>,
    /// `type_url`.
    pub type_url: String,
    /// `response_nonce`.
    pub response_nonce: String,
}

impl Message for Request {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.version_info.is_empty() {
            string::encode(1, &self.version_info, buf);
        }
        if let Some(node) = &self.node {
            message::encode(2, node, buf);
        }
        for n in self.resource_names.iter() {
            string::encode(3, n, buf);
        }
        if !self.type_url.is_empty() {
            string::encode(4, &self.type_url, buf);
        }
        if !self.response_nonce.is_empty() {
            string::encode(5, &self.response_nonce, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        // Sending only.
        skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        let s = |tag: u32, v: &String| {
            if v.is_empty() {
                0
            } else {
                string::encoded_len(tag, v)
            }
        };
        s(1, &self.version_info)
            + self.node.as_ref().map_or(0, |n| message::encoded_len(2, n))
            + string::encoded_len_repeated(3, &self.resource_names)
            + s(4, &self.type_url)
            + s(5, &self.response_nonce)
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
    };
    use proto::pb::google::protobuf::Any;

    fn any(i: u8) -> Any {
        Any {
            type_url: "type.googleapis.com/x".into(),
            value: vec![i; 40],
        }
    }

    #[test]
    fn responses_decode_as_the_generated_messages_do() {
        let full = DiscoveryResponse {
            version_info: "v/3".into(),
            resources: vec![any(1), any(2)],
            type_url: "t".into(),
            nonce: "n".into(),
            ..Default::default()
        };
        let light = Response::decode(full.encode_to_vec().as_slice()).unwrap();
        assert_eq!(light.version_info, "v/3");
        assert_eq!(light.nonce, "n");
        assert_eq!(light.type_url, "t");
        assert_eq!(light.resources[1].value.as_ref(), any(2).value.as_slice());
        let delta = DeltaDiscoveryResponse {
            system_version_info: "v/4".into(),
            resources: vec![Resource {
                name: "c".into(),
                version: "1".into(),
                resource: Some(any(3)),
                ..Default::default()
            }],
            type_url: "t".into(),
            nonce: "m".into(),
            removed_resources: vec!["gone".into()],
            ..Default::default()
        };
        let light = DeltaResponse::decode(delta.encode_to_vec().as_slice()).unwrap();
        assert_eq!(light.resources[0].name, "c");
        assert_eq!(
            light.resources[0].resource.as_ref().unwrap().value.as_ref(),
            any(3).value.as_slice()
        );
        assert_eq!(light.removed_resources, ["gone"]);
    }

    #[test]
    fn requests_encode_as_the_generated_message_does() {
        let light = Request {
            version_info: "v".into(),
            node: Some(Node {
                id: "sidecar~1~a.b~b.svc.cluster.local".into(),
                ..Default::default()
            }),
            resource_names: Arc::new(vec!["a".into(), "b".into()]),
            type_url: "t".into(),
            response_nonce: "n".into(),
        };
        let bytes = light.encode_to_vec();
        assert_eq!(bytes.len(), light.encoded_len());
        let full = DiscoveryRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(full.resource_names, ["a", "b"]);
        assert_eq!(full.node.unwrap().id, "sidecar~1~a.b~b.svc.cluster.local");
        assert_eq!(
            (full.type_url.as_str(), full.response_nonce.as_str()),
            ("t", "n")
        );
    }
}
