//! Small constructors for the Envoy protos the generators build.

use std::time::Duration;

use prost::Message;
use proto::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, ConfigSource, DataSource, GrpcService,
    SocketAddress, TransportSocket, address, api_config_source, config_source, data_source,
    grpc_service, socket_address, transport_socket,
};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::SdsSecretConfig;
use proto::pb::google::protobuf::{self as pb, Any, Struct, Value, value::Kind};

/// Packs a message as `Any`.
pub fn any<M: Message + prost::Name>(m: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: m.encode_to_vec(),
    }
}

/// A protobuf duration.
pub fn duration(d: Duration) -> pb::Duration {
    pb::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// A `UInt32Value`.
pub fn u32v(v: u32) -> pb::UInt32Value {
    pb::UInt32Value { value: v }
}

/// A socket address.
pub fn socket(ip: &str, port: u32) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ip.to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

/// Config source `ads: {}` with API v3, as Istio's generated config uses.
pub fn ads_source() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3.into(),
        initial_fetch_timeout: Some(duration(Duration::ZERO)),
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
            AggregatedConfigSource {},
        )),
        ..Default::default()
    }
}

/// An SDS reference to the agent's `sds-grpc` bootstrap cluster.
pub fn sds(name: &str) -> SdsSecretConfig {
    SdsSecretConfig {
        name: name.to_string(),
        sds_config: Some(ConfigSource {
            resource_api_version: ApiVersion::V3.into(),
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::ApiConfigSource(
                proto::pb::envoy::config::core::v3::ApiConfigSource {
                    api_type: api_config_source::ApiType::Grpc.into(),
                    set_node_on_first_message_only: true,
                    transport_api_version: ApiVersion::V3.into(),
                    grpc_services: vec![GrpcService {
                        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                            grpc_service::EnvoyGrpc {
                                cluster_name: "sds-grpc".into(),
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
    }
}

/// A transport socket with a typed config.
pub fn transport_socket<M: Message + prost::Name>(name: &str, m: &M) -> TransportSocket {
    TransportSocket {
        name: name.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(any(m))),
    }
}

/// A string `Value`.
pub fn string_value(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

/// A `Struct` of string fields.
pub fn struct_of(fields: &[(&str, &str)]) -> Struct {
    Struct {
        fields: fields
            .iter()
            .map(|(k, v)| (k.to_string(), string_value(v)))
            .collect(),
    }
}

/// An inline string data source.
pub fn inline(s: &str) -> DataSource {
    DataSource {
        specifier: Some(data_source::Specifier::InlineString(s.to_string())),
        ..Default::default()
    }
}
