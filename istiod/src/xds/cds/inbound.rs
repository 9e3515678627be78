//! The clusters for captured traffic, in Istio's shapes: `inbound|<port>||`
//! to the workload (the original destination, from `127.0.0.6` so iptables
//! lets the hop through; a Sidecar ingress `defaultEndpoint` instead when
//! set), and the built-in `BlackHoleCluster`, `PassthroughCluster` and
//! `InboundPassthroughCluster`. A Sidecar's `ingress[].connectionPool` or
//! `inboundConnectionPool` sets the inbound cluster's circuit breakers,
//! connect timeout and HTTP options, as on the client side.

use std::time::Duration;

use proto::pb::envoy::config::cluster::v3::{Cluster, cluster};
use proto::pb::envoy::config::core::v3::{
    Address, BindConfig, ExtraSourceAddress, Pipe, SocketAddress, address, socket_address,
};
use proto::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};

use super::super::util::{
    INBOUND_PASSTHROUGH_BIND_V6, INBOUND_PASSTHROUGH_CLUSTER, IpMode, any, delimited, duration,
    socket,
};
use super::{
    HTTP_PROTOCOL_OPTIONS, http_options, inbound_name, kind, passthrough_protocol_options,
    unlimited_breakers,
};
use crate::pushctx::Proxy;
use crate::pushctx::context::{InboundPort, IstioContext};
use crate::pushctx::names::{BLACKHOLE_CLUSTER, PASSTHROUGH_CLUSTER};

/// Istio's cleanup interval for inbound ORIGINAL_DST clusters: the longest a
/// Go duration holds (about 292 years), so hosts are never cleaned up.
const NEVER: Duration = Duration::from_secs(9_223_372_035);

/// The workload's inbound clusters, one per inbound port.
pub(super) fn clusters(ctx: &IstioContext, proxy: &Proxy) -> Vec<Cluster> {
    let ip = IpMode::of(&proxy.ips);
    ctx.inbound_ports(proxy)
        .iter()
        .map(|p| inbound(proxy, ip, p, ctx.mesh.connect_timeout))
        .collect()
}

/// Where a Sidecar ingress `defaultEndpoint` sends traffic (Istio's
/// `buildInboundClustersFromSidecar`): `127.0.0.1`/`[::1]` is localhost,
/// `0.0.0.0`/`[::]` the Pod's own address of that family, `unix://` a
/// socket. `None`: the original destination.
fn default_endpoint(endpoint: &str, proxy: &Proxy, ip: IpMode) -> Option<Address> {
    if let Some(path) = endpoint.strip_prefix("unix://") {
        return Some(Address {
            address: Some(address::Address::Pipe(Pipe {
                path: path.to_string(),
                mode: 0,
            })),
        });
    }
    let (host, port) = endpoint.rsplit_once(':')?;
    let port: u32 = port.parse().ok()?;
    let pod_ip = |v6: bool| {
        proxy
            .ips
            .iter()
            .find(|a| {
                a.parse::<std::net::IpAddr>()
                    .is_ok_and(|a| a.is_ipv6() == v6)
            })
            .cloned()
    };
    let host = match host {
        "127.0.0.1" => ip.localhost().to_string(),
        "[::1]" if ip == IpMode::V4 => "127.0.0.1".to_string(),
        "[::1]" => "::1".to_string(),
        "0.0.0.0" => pod_ip(false).unwrap_or_else(|| "127.0.0.1".into()),
        "[::]" => pod_ip(true).unwrap_or_else(|| "::1".into()),
        _ => return None,
    };
    Some(socket(&host, port))
}

fn is_localhost(a: &Address) -> bool {
    match &a.address {
        Some(address::Address::SocketAddress(s)) => s.address == "127.0.0.1" || s.address == "::1",
        // A socket has no source address to bind.
        Some(address::Address::Pipe(_)) => true,
        _ => false,
    }
}

fn source(ip: &str) -> SocketAddress {
    SocketAddress {
        address: ip.to_string(),
        port_specifier: Some(socket_address::PortSpecifier::PortValue(0)),
        ..Default::default()
    }
}

/// `inbound|<port>||`: ORIGINAL_DST (Envoy connects to the Pod address and
/// port the client dialled, from `127.0.0.6`), or STATIC to a Sidecar
/// ingress `defaultEndpoint`, from `127.0.0.6` unless that is localhost.
fn inbound(proxy: &Proxy, ip: IpMode, p: &InboundPort, connect_timeout: Duration) -> Cluster {
    let name = inbound_name(p.port);
    let endpoint = default_endpoint(&p.default_endpoint, proxy, ip);
    let pool = p.connection_pool.as_ref();
    let mut c = Cluster {
        name: name.clone(),
        alt_stat_name: delimited(&name),
        connect_timeout: Some(duration(
            pool.and_then(|cp| cp.tcp.as_ref())
                .and_then(|t| t.connect_timeout)
                .unwrap_or(connect_timeout),
        )),
        circuit_breakers: Some(unlimited_breakers()),
        metadata: Some(super::super::istio_stats::cluster_metadata(
            &p.services,
            None,
        )),
        ..Default::default()
    };
    // The Sidecar's connection pool, so that the server side has the
    // capacity its clients are given (Istio's `buildInboundClusterForPortOrUDS`).
    if let Some(cp) = pool {
        super::policy::apply_connection_pool(&mut c, cp);
    }
    if endpoint.as_ref().is_none_or(|a| !is_localhost(a)) {
        c.upstream_bind_config = Some(BindConfig {
            source_address: Some(source(ip.passthrough_bind())),
            ..Default::default()
        });
    }
    match endpoint {
        Some(address) => {
            c.cluster_discovery_type = kind(cluster::DiscoveryType::Static);
            c.lb_policy = cluster::LbPolicy::LeastRequest.into();
            c.load_assignment = Some(ClusterLoadAssignment {
                cluster_name: name,
                endpoints: vec![LocalityLbEndpoints {
                    lb_endpoints: vec![LbEndpoint {
                        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                            address: Some(address),
                            ..Default::default()
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            });
        }
        None => {
            c.cluster_discovery_type = kind(cluster::DiscoveryType::OriginalDst);
            c.lb_policy = cluster::LbPolicy::ClusterProvided.into();
            c.cleanup_interval = Some(duration(NEVER));
        }
    }
    if let Some(options) = http_options(p.protocol, pool, super::tls::AutoSni::default()) {
        c.typed_extension_protocol_options
            .insert(HTTP_PROTOCOL_OPTIONS.into(), any(&options));
    }
    c
}

/// `BlackHoleCluster`, `PassthroughCluster` and `InboundPassthroughCluster`.
pub(super) fn builtin(proxy: &Proxy, connect_timeout: Duration) -> Vec<Cluster> {
    let blackhole = Cluster {
        name: BLACKHOLE_CLUSTER.into(),
        alt_stat_name: delimited(BLACKHOLE_CLUSTER),
        cluster_discovery_type: kind(cluster::DiscoveryType::Static),
        connect_timeout: Some(duration(connect_timeout)),
        lb_policy: cluster::LbPolicy::RoundRobin.into(),
        ..Default::default()
    };
    let passthrough = Cluster {
        name: PASSTHROUGH_CLUSTER.into(),
        alt_stat_name: delimited(PASSTHROUGH_CLUSTER),
        cluster_discovery_type: kind(cluster::DiscoveryType::OriginalDst),
        lb_policy: cluster::LbPolicy::ClusterProvided.into(),
        connect_timeout: Some(duration(connect_timeout)),
        circuit_breakers: Some(unlimited_breakers()),
        typed_extension_protocol_options: [(
            HTTP_PROTOCOL_OPTIONS.to_string(),
            any(&passthrough_protocol_options()),
        )]
        .into(),
        ..Default::default()
    };
    // The passthrough source by the workload's IP families: `::6` as well
    // for dual stack, so Envoy can reach either family.
    let ip = IpMode::of(&proxy.ips);
    let inbound_passthrough = Cluster {
        name: INBOUND_PASSTHROUGH_CLUSTER.into(),
        alt_stat_name: delimited(INBOUND_PASSTHROUGH_CLUSTER),
        upstream_bind_config: Some(BindConfig {
            source_address: Some(source(ip.passthrough_bind())),
            extra_source_addresses: if ip == IpMode::Dual {
                vec![ExtraSourceAddress {
                    address: Some(source(INBOUND_PASSTHROUGH_BIND_V6)),
                    ..Default::default()
                }]
            } else {
                Vec::new()
            },
            ..Default::default()
        }),
        ..passthrough.clone()
    };
    vec![blackhole, passthrough, inbound_passthrough]
}
