//! Small constructors for the Envoy protos the generators build, and the
//! names Istio gives the built-in resources.

use std::time::Duration;

use prost::Message;
use proto::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, ConfigSource, GrpcService, SocketAddress,
    TransportSocket, address, api_config_source, config_source, grpc_service, socket_address,
    transport_socket,
};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::SdsSecretConfig;
use proto::pb::google::protobuf::{self as pb, Any, Struct, Value, value::Kind};

/// The cluster for inbound traffic to Pod ports no Service names.
pub const INBOUND_PASSTHROUGH_CLUSTER: &str = "InboundPassthroughCluster";
/// The outbound listener iptables redirects to (`ProxyListenPort`).
pub const VIRTUAL_OUTBOUND: &str = "virtualOutbound";
/// The inbound listener iptables redirects to (`ProxyInboundListenPort`).
pub const VIRTUAL_INBOUND: &str = "virtualInbound";
/// `virtualOutbound`'s port.
pub const VIRTUAL_OUTBOUND_PORT: u16 = 15001;
/// `virtualInbound`'s port.
pub const VIRTUAL_INBOUND_PORT: u16 = 15006;
/// The default chain of outbound port listeners, for what no chain matches.
pub const PASSTHROUGH_FILTER_CHAIN: &str = "PassthroughFilterChain";
/// Source address of Envoy's connections to its own workload, which the
/// iptables rule `-o lo -s 127.0.0.6/32 -j RETURN` keeps from being captured.
pub const INBOUND_PASSTHROUGH_BIND_V4: &str = "127.0.0.6";
/// The IPv6 form of [`INBOUND_PASSTHROUGH_BIND_V4`].
pub const INBOUND_PASSTHROUGH_BIND_V6: &str = "::6";

/// The IP families of a proxy's workload (Istio's `IPMode`, from the node's
/// `INSTANCE_IPS`): it picks wildcards, localhost and the passthrough source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpMode {
    /// IPv4 only (also when no address parses).
    V4,
    /// IPv6 only.
    V6,
    /// Both.
    Dual,
}

impl IpMode {
    /// The mode of these addresses.
    pub fn of(ips: &[String]) -> Self {
        let parsed: Vec<std::net::IpAddr> = ips.iter().filter_map(|i| i.parse().ok()).collect();
        let v4 = parsed.iter().any(std::net::IpAddr::is_ipv4);
        let v6 = parsed.iter().any(std::net::IpAddr::is_ipv6);
        match (v4, v6) {
            (true, true) => IpMode::Dual,
            (false, true) => IpMode::V6,
            _ => IpMode::V4,
        }
    }

    /// Whether the workload has (IPv4, IPv6) addresses.
    pub fn families(self) -> (bool, bool) {
        match self {
            IpMode::V4 => (true, false),
            IpMode::V6 => (false, true),
            IpMode::Dual => (true, true),
        }
    }

    /// The wildcard listeners bind (`0.0.0.0`, `::` for IPv6 only).
    pub fn wildcard(self) -> &'static str {
        match self {
            IpMode::V6 => "::",
            _ => "0.0.0.0",
        }
    }

    /// Localhost (`127.0.0.1`, `::1` for IPv6 only).
    pub fn localhost(self) -> &'static str {
        match self {
            IpMode::V6 => "::1",
            _ => "127.0.0.1",
        }
    }

    /// The passthrough source address (`127.0.0.6`, `::6` for IPv6 only).
    pub fn passthrough_bind(self) -> &'static str {
        match self {
            IpMode::V6 => INBOUND_PASSTHROUGH_BIND_V6,
            _ => INBOUND_PASSTHROUGH_BIND_V4,
        }
    }
}

/// Istio's stat prefix delimiter: `<prefix>;` lets the bootstrap's stats
/// tags extract names that contain dots.
pub fn delimited(prefix: &str) -> String {
    format!("{prefix};")
}

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
