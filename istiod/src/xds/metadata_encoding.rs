//! Deterministic encoding of resources that carry `Metadata`: prost encodes
//! a `HashMap` (`Metadata.filter_metadata`, `Struct.fields`) in its random
//! iteration order, and an unchanged resource must give unchanged bytes
//! (the XDS cache, delta versions and "nothing changed" pushes compare
//! them). The metadata is written here with its map entries in key order
//! and appended to the rest of the message, which prost encodes as usual:
//! a field may come anywhere in a message, and repeated fields keep their
//! order.

use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint};
use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::core::v3::Metadata;
use proto::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, LbEndpoint, LocalityLbEndpoints,
};
use proto::pb::google::protobuf::{Any, Struct, Value, value::Kind};

/// `Cluster.metadata`.
const CLUSTER_METADATA: u32 = 25;
/// `LbEndpoint.metadata`.
const LB_ENDPOINT_METADATA: u32 = 3;
/// `LocalityLbEndpoints.lb_endpoints`.
const LOCALITY_LB_ENDPOINTS: u32 = 2;
/// `ClusterLoadAssignment.endpoints`.
const CLA_ENDPOINTS: u32 = 2;

fn field(tag: u32, bytes: &[u8], out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// A map entry (`key` = 1, `value` = 2) of a string-keyed map at `tag`.
fn map_entry(tag: u32, key: &str, value: &[u8], out: &mut Vec<u8>) {
    let mut entry = Vec::with_capacity(key.len() + value.len() + 8);
    field(1, key.as_bytes(), &mut entry);
    field(2, value, &mut entry);
    field(tag, &entry, out);
}

fn value_bytes(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    match &v.kind {
        Some(Kind::StructValue(s)) => field(5, &struct_bytes(s), &mut out),
        Some(Kind::ListValue(l)) => {
            let mut list = Vec::new();
            for item in &l.values {
                field(1, &value_bytes(item), &mut list);
            }
            field(6, &list, &mut out);
        }
        _ => out = v.encode_to_vec(),
    }
    out
}

/// A `Struct` with its fields in key order.
pub fn struct_bytes(s: &Struct) -> Vec<u8> {
    let mut keys: Vec<&String> = s.fields.keys().collect();
    keys.sort();
    let mut out = Vec::new();
    for k in keys {
        map_entry(1, k, &value_bytes(&s.fields[k]), &mut out);
    }
    out
}

/// `Metadata` with its namespaces (and their fields) in key order.
pub fn metadata_bytes(m: &Metadata) -> Vec<u8> {
    let mut out = Vec::new();
    let mut keys: Vec<&String> = m.filter_metadata.keys().collect();
    keys.sort();
    for k in keys {
        map_entry(1, k, &struct_bytes(&m.filter_metadata[k]), &mut out);
    }
    let mut typed: Vec<(&String, &Any)> = m.typed_filter_metadata.iter().collect();
    typed.sort_by_key(|(k, _)| *k);
    for (k, a) in typed {
        map_entry(2, k, &a.encode_to_vec(), &mut out);
    }
    out
}

fn any_of<M: prost::Name>(value: Vec<u8>) -> Any {
    Any {
        type_url: M::type_url(),
        value,
    }
}

/// A cluster, its metadata in key order.
pub fn cluster(c: &Cluster) -> Any {
    let Some(metadata) = &c.metadata else {
        return super::util::any(c);
    };
    let mut bare = c.clone();
    bare.metadata = None;
    let mut out = bare.encode_to_vec();
    field(CLUSTER_METADATA, &metadata_bytes(metadata), &mut out);
    any_of::<Cluster>(out)
}

fn lb_endpoint(e: &LbEndpoint, out: &mut Vec<u8>) {
    let mut bytes = match &e.metadata {
        Some(_) => LbEndpoint {
            metadata: None,
            ..e.clone()
        }
        .encode_to_vec(),
        None => e.encode_to_vec(),
    };
    if let Some(m) = &e.metadata {
        field(LB_ENDPOINT_METADATA, &metadata_bytes(m), &mut bytes);
    }
    field(LOCALITY_LB_ENDPOINTS, &bytes, out);
}

/// A load assignment, each endpoint's metadata in key order.
pub fn load_assignment(cla: &ClusterLoadAssignment) -> Any {
    let mut out = ClusterLoadAssignment {
        endpoints: Vec::new(),
        ..cla.clone()
    }
    .encode_to_vec();
    for locality in &cla.endpoints {
        let mut bytes = LocalityLbEndpoints {
            lb_endpoints: Vec::new(),
            ..locality.clone()
        }
        .encode_to_vec();
        for e in &locality.lb_endpoints {
            lb_endpoint(e, &mut bytes);
        }
        field(CLA_ENDPOINTS, &bytes, &mut out);
    }
    any_of::<ClusterLoadAssignment>(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::util::struct_of;

    fn metadata() -> Metadata {
        let mut m = Metadata::default();
        for ns in ["b", "a", "c", "envoy.transport_socket_match", "istio"] {
            m.filter_metadata.insert(
                ns.into(),
                struct_of(&[("z", "1"), ("y", "2"), ("x", "3"), ("w", "4")]),
            );
        }
        m
    }

    #[test]
    fn equal_metadata_encodes_to_equal_bytes_and_decodes_back() {
        let c = Cluster {
            name: "outbound|80||a".into(),
            metadata: Some(metadata()),
            ..Default::default()
        };
        let first = cluster(&c);
        for _ in 0..20 {
            let again = Cluster {
                metadata: Some(metadata()),
                ..c.clone()
            };
            assert_eq!(cluster(&again), first);
        }
        assert_eq!(Cluster::decode(first.value.as_slice()).unwrap(), c);
    }

    #[test]
    fn load_assignments_keep_endpoint_order_and_metadata() {
        let ep = |n: u32| LbEndpoint {
            metadata: Some(metadata()),
            load_balancing_weight: Some(crate::xds::util::u32v(n)),
            ..Default::default()
        };
        let make = || ClusterLoadAssignment {
            cluster_name: "c".into(),
            endpoints: vec![
                LocalityLbEndpoints {
                    lb_endpoints: vec![ep(1), ep(2)],
                    ..Default::default()
                },
                LocalityLbEndpoints {
                    lb_endpoints: vec![ep(3)],
                    priority: 1,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let first = load_assignment(&make());
        for _ in 0..20 {
            assert_eq!(load_assignment(&make()), first);
        }
        assert_eq!(
            ClusterLoadAssignment::decode(first.value.as_slice()).unwrap(),
            make()
        );
    }
}
