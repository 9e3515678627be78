//! CDS for sidecars, with Istio's names: `outbound|<port>|<subset>|<host>`
//! EDS clusters (DestinationRule policy, auto mTLS), `inbound|<port>||`,
//! `BlackHoleCluster`, `PassthroughCluster`, `InboundPassthroughCluster`.

use std::collections::BTreeSet;
use std::time::Duration;

use proto::pb::envoy::config::cluster::v3::{
    CircuitBreakers, Cluster, OutlierDetection as EnvoyOutlier, circuit_breakers, cluster,
};
use proto::pb::envoy::config::core::v3::{
    BindConfig, Http2ProtocolOptions, RoutingPriority, SocketAddress, socket_address,
};
use proto::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use proto::pb::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer;
use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, SubjectAltNameMatcher, UpstreamTlsContext,
    common_tls_context, subject_alt_name_matcher,
};
use proto::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions, http_protocol_options,
};
use proto::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};

use super::context::IstioContext;
use super::util::{ads_source, any, duration, sds, socket, struct_of, transport_socket, u32v};
use super::{Proxy, Resource};
use crate::model::istio::{SimpleLb, Subset, TlsMode, TrafficPolicy};
use crate::model::service::{Service, ServicePort, ServiceResolution};

/// Istio's mesh default `connectTimeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Istio's "unlimited" circuit-breaker threshold.
const UNLIMITED: u32 = u32::MAX;

/// `outbound|<port>|<subset>|<host>`.
pub fn outbound_name(port: u16, subset: &str, host: &str) -> String {
    format!("outbound|{port}|{subset}|{host}")
}

/// `inbound|<port>||`.
pub fn inbound_name(port: u16) -> String {
    format!("inbound|{port}||")
}

fn resource(c: Cluster) -> Resource {
    Resource {
        name: c.name.clone(),
        resource: any(&c),
    }
}

fn kind(t: cluster::DiscoveryType) -> Option<cluster::ClusterDiscoveryType> {
    Some(cluster::ClusterDiscoveryType::Type(t.into()))
}

/// The clusters of one proxy.
pub fn build(ctx: &IstioContext, proxy: &Proxy) -> Vec<Resource> {
    let mut out = Vec::new();
    for svc in ctx.services_for(proxy) {
        if svc.resolution == ServiceResolution::Passthrough {
            continue;
        }
        let dr = ctx.destination_rule(&proxy.namespace, svc);
        for port in &svc.ports {
            let policy = dr.and_then(|d| d.spec.traffic_policy.as_ref());
            out.push(resource(outbound(ctx, svc, port, "", policy)));
            for subset in dr.map(|d| d.spec.subsets.as_slice()).unwrap_or_default() {
                out.push(resource(outbound(
                    ctx,
                    svc,
                    port,
                    &subset.name,
                    merged(policy, subset).as_ref(),
                )));
            }
        }
    }
    let mut inbound_ports = BTreeSet::new();
    for (_, _, target) in ctx.inbound_for(proxy) {
        if inbound_ports.insert(target) {
            out.push(resource(inbound(target)));
        }
    }
    // Sidecar ingress listeners (captureMode NONE) reach the app through these too.
    if let Some(sc) = ctx.sidecar_for(proxy) {
        for ing in &sc.spec.ingress {
            let target = ing
                .default_endpoint
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse().ok())
                .unwrap_or(ing.port.number as u16);
            if inbound_ports.insert(target) {
                out.push(resource(inbound(target)));
            }
        }
    }
    out.push(resource(Cluster {
        name: "BlackHoleCluster".into(),
        cluster_discovery_type: kind(cluster::DiscoveryType::Static),
        connect_timeout: Some(duration(CONNECT_TIMEOUT)),
        ..Default::default()
    }));
    out.push(resource(Cluster {
        name: "PassthroughCluster".into(),
        cluster_discovery_type: kind(cluster::DiscoveryType::OriginalDst),
        lb_policy: cluster::LbPolicy::ClusterProvided.into(),
        connect_timeout: Some(duration(CONNECT_TIMEOUT)),
        circuit_breakers: Some(unlimited_breakers()),
        ..Default::default()
    }));
    out.push(resource(Cluster {
        name: "InboundPassthroughCluster".into(),
        cluster_discovery_type: kind(cluster::DiscoveryType::OriginalDst),
        lb_policy: cluster::LbPolicy::ClusterProvided.into(),
        connect_timeout: Some(duration(CONNECT_TIMEOUT)),
        // Istio's inbound source address, excluded from interception.
        upstream_bind_config: Some(BindConfig {
            source_address: Some(SocketAddress {
                address: "127.0.0.6".into(),
                port_specifier: Some(socket_address::PortSpecifier::PortValue(0)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }));
    out
}

/// A subset's policy overrides the rule's top-level policy field by field.
fn merged(top: Option<&TrafficPolicy>, subset: &Subset) -> Option<TrafficPolicy> {
    match (top, &subset.traffic_policy) {
        (None, None) => None,
        (Some(t), None) => Some(t.clone()),
        (None, Some(s)) => Some(s.clone()),
        (Some(t), Some(s)) => Some(TrafficPolicy {
            load_balancer: s.load_balancer.clone().or_else(|| t.load_balancer.clone()),
            connection_pool: s
                .connection_pool
                .clone()
                .or_else(|| t.connection_pool.clone()),
            outlier_detection: s
                .outlier_detection
                .clone()
                .or_else(|| t.outlier_detection.clone()),
            tls: s.tls.clone().or_else(|| t.tls.clone()),
            ..t.clone()
        }),
    }
}

fn unlimited_breakers() -> CircuitBreakers {
    CircuitBreakers {
        thresholds: vec![circuit_breakers::Thresholds {
            priority: RoutingPriority::Default.into(),
            max_connections: Some(u32v(UNLIMITED)),
            max_pending_requests: Some(u32v(UNLIMITED)),
            max_requests: Some(u32v(UNLIMITED)),
            max_retries: Some(u32v(UNLIMITED)),
            track_remaining: true,
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn positive(v: Option<i32>) -> Option<u32> {
    v.filter(|v| *v > 0).map(|v| v as u32)
}

fn outbound(
    ctx: &IstioContext,
    svc: &Service,
    port: &ServicePort,
    subset: &str,
    policy: Option<&TrafficPolicy>,
) -> Cluster {
    let name = outbound_name(port.port, subset, &svc.hostname);
    let mut c = Cluster {
        name: name.clone(),
        connect_timeout: Some(duration(
            policy
                .and_then(|p| p.connection_pool.as_ref())
                .and_then(|cp| cp.tcp.as_ref())
                .and_then(|t| t.connect_timeout)
                .unwrap_or(CONNECT_TIMEOUT),
        )),
        // Istio's default load balancer is LEAST_REQUEST.
        lb_policy: match policy
            .and_then(|p| p.load_balancer.as_ref())
            .and_then(|l| l.simple)
        {
            Some(SimpleLb::RoundRobin) => cluster::LbPolicy::RoundRobin,
            Some(SimpleLb::Random) => cluster::LbPolicy::Random,
            _ => cluster::LbPolicy::LeastRequest,
        }
        .into(),
        circuit_breakers: Some(unlimited_breakers()),
        ..Default::default()
    };
    match svc.resolution {
        ServiceResolution::DnsLb | ServiceResolution::DnsRoundRobinLb => {
            c.cluster_discovery_type = kind(if svc.resolution == ServiceResolution::DnsLb {
                cluster::DiscoveryType::StrictDns
            } else {
                cluster::DiscoveryType::LogicalDns
            });
            c.load_assignment = Some(ClusterLoadAssignment {
                cluster_name: name.clone(),
                endpoints: vec![LocalityLbEndpoints {
                    lb_endpoints: svc
                        .endpoints_for(port.port)
                        .map(|e| LbEndpoint {
                            host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(
                                Endpoint {
                                    address: Some(socket(&e.address, e.port.into())),
                                    ..Default::default()
                                },
                            )),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }],
                ..Default::default()
            });
        }
        _ => {
            c.cluster_discovery_type = kind(cluster::DiscoveryType::Eds);
            c.eds_cluster_config = Some(cluster::EdsClusterConfig {
                eds_config: Some(ads_source()),
                service_name: name.clone(),
            });
        }
    }
    if let Some(cp) = policy.and_then(|p| p.connection_pool.as_ref()) {
        let t = &mut c
            .circuit_breakers
            .get_or_insert_with(unlimited_breakers)
            .thresholds[0];
        if let Some(v) = cp.tcp.as_ref().and_then(|t| positive(t.max_connections)) {
            t.max_connections = Some(u32v(v));
        }
        if let Some(h) = &cp.http {
            if let Some(v) = positive(h.http1_max_pending_requests) {
                t.max_pending_requests = Some(u32v(v));
            }
            if let Some(v) = positive(h.http2_max_requests) {
                t.max_requests = Some(u32v(v));
            }
            if let Some(v) = positive(h.max_retries) {
                t.max_retries = Some(u32v(v));
            }
        }
    }
    if let Some(od) = policy.and_then(|p| p.outlier_detection.as_ref()) {
        c.outlier_detection = Some(EnvoyOutlier {
            consecutive_5xx: od.consecutive_5xx_errors.map(u32v),
            consecutive_gateway_failure: od.consecutive_gateway_errors.map(u32v),
            enforcing_consecutive_gateway_failure: od.consecutive_gateway_errors.map(|_| u32v(100)),
            interval: od.interval.map(duration),
            base_ejection_time: od.base_ejection_time.map(duration),
            max_ejection_percent: od.max_ejection_percent.map(|v| u32v(v.max(0) as u32)),
            ..Default::default()
        });
    }
    if port.protocol.is_http2() {
        c.typed_extension_protocol_options.insert(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".into(),
            any(&HttpProtocolOptions {
                upstream_protocol_options: Some(http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                    http_protocol_options::ExplicitHttpConfig {
                        protocol_config: Some(http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                            Http2ProtocolOptions::default(),
                        )),
                    },
                )),
                ..Default::default()
            }),
        );
    }
    let tls_mode = policy.and_then(|p| p.tls.as_ref()).map(|t| t.mode);
    let sans: Vec<String> = match policy
        .and_then(|p| p.tls.as_ref())
        .filter(|t| !t.subject_alt_names.is_empty())
    {
        Some(t) => t.subject_alt_names.clone(),
        None if !svc.subject_alt_names.is_empty() => svc.subject_alt_names.clone(),
        None => svc.identities().into_iter().collect(),
    };
    let sni = format!("outbound_.{}_.{}_.{}", port.port, subset, svc.hostname);
    match tls_mode {
        Some(TlsMode::IstioMutual) => {
            c.transport_socket = Some(transport_socket(
                "envoy.transport_sockets.tls",
                &istio_mutual(&sans, &sni),
            ));
        }
        None if !svc.mesh_external => {
            // Auto mTLS: endpoints labelled tlsMode=istio get mutual TLS.
            c.transport_socket_matches = vec![
                cluster::TransportSocketMatch {
                    name: "tlsMode-istio".into(),
                    r#match: Some(struct_of(&[("tlsMode", "istio")])),
                    transport_socket: Some(transport_socket(
                        "envoy.transport_sockets.tls",
                        &istio_mutual(&sans, &sni),
                    )),
                },
                cluster::TransportSocketMatch {
                    name: "tlsMode-disabled".into(),
                    r#match: Some(struct_of(&[])),
                    transport_socket: Some(transport_socket(
                        "envoy.transport_sockets.raw_buffer",
                        &RawBuffer {},
                    )),
                },
            ];
        }
        // DISABLE, and SIMPLE/MUTUAL with files, send plain text here.
        _ => {}
    }
    let _ = ctx;
    c
}

/// Istio's `ISTIO_MUTUAL` upstream TLS: the workload certificate and root
/// from the agent's SDS, the peer's SPIFFE identity verified.
pub fn istio_mutual(sans: &[String], sni: &str) -> UpstreamTlsContext {
    UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_sds_secret_configs: vec![sds("default")],
            validation_context_type: Some(
                common_tls_context::ValidationContextType::CombinedValidationContext(
                    common_tls_context::CombinedCertificateValidationContext {
                        default_validation_context: Some(CertificateValidationContext {
                            match_typed_subject_alt_names: sans
                                .iter()
                                .map(|s| SubjectAltNameMatcher {
                                    san_type: subject_alt_name_matcher::SanType::Uri.into(),
                                    matcher: Some(StringMatcher {
                                        match_pattern: Some(string_matcher::MatchPattern::Exact(
                                            s.clone(),
                                        )),
                                        ..Default::default()
                                    }),
                                    ..Default::default()
                                })
                                .collect(),
                            ..Default::default()
                        }),
                        validation_context_sds_secret_config: Some(sds("ROOTCA")),
                        ..Default::default()
                    },
                ),
            ),
            alpn_protocols: vec!["istio-peer-exchange".into(), "istio".into()],
            ..Default::default()
        }),
        sni: sni.to_string(),
        ..Default::default()
    }
}

fn inbound(target_port: u16) -> Cluster {
    let name = inbound_name(target_port);
    Cluster {
        name: name.clone(),
        cluster_discovery_type: kind(cluster::DiscoveryType::Static),
        connect_timeout: Some(duration(CONNECT_TIMEOUT)),
        circuit_breakers: Some(unlimited_breakers()),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name,
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: Some(socket("127.0.0.1", target_port.into())),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}
