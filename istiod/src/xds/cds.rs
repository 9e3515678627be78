//! CDS for sidecars, with Istio's names: `outbound|<port>|<subset>|<host>`
//! EDS clusters (DestinationRule policy, auto mTLS), and in [`inbound`]
//! `inbound|<port>||`, `BlackHoleCluster`, `PassthroughCluster` and
//! `InboundPassthroughCluster`.

mod inbound;

use std::time::Duration;

use proto::pb::envoy::config::cluster::v3::{
    CircuitBreakers, Cluster, OutlierDetection as EnvoyOutlier, circuit_breakers, cluster,
};
use proto::pb::envoy::config::core::v3::{
    Http1ProtocolOptions, Http2ProtocolOptions, HttpProtocolOptions as CommonHttpOptions,
    RoutingPriority,
};
use proto::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use proto::pb::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer;
use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, SubjectAltNameMatcher, TlsParameters,
    UpstreamTlsContext, common_tls_context, subject_alt_name_matcher, tls_parameters,
};
use proto::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions, http_protocol_options,
};
use proto::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};

use super::context::IstioContext;
use super::util::{
    ads_source, any, delimited, duration, sds, socket, struct_of, transport_socket, u32v,
};
use super::{Proxy, Resource};
use crate::model::istio::{SimpleLb, Subset, TlsMode, TrafficPolicy};
use crate::model::service::{Protocol, Service, ServicePort, ServiceResolution};

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
    out.extend(inbound::clusters(ctx, proxy).into_iter().map(resource));
    out.extend(inbound::builtin(proxy).into_iter().map(resource));
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
        alt_stat_name: delimited(&name),
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
    if let Some(options) = upstream_protocol(port.protocol) {
        c.typed_extension_protocol_options
            .insert(HTTP_PROTOCOL_OPTIONS.into(), any(&options));
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
                &istio_mutual(&sans, &sni, port.protocol),
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
                        &istio_mutual(&sans, &sni, port.protocol),
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

/// The key of a cluster's HTTP protocol options.
const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

/// Istio's upstream protocol for a port: HTTP/2 for `http2`/`grpc`, the
/// downstream's protocol for ports whose protocol is detected.
fn upstream_protocol(protocol: Protocol) -> Option<HttpProtocolOptions> {
    use http_protocol_options::UpstreamProtocolOptions;
    let upstream = if protocol.is_http2() {
        UpstreamProtocolOptions::ExplicitHttpConfig(http_protocol_options::ExplicitHttpConfig {
            protocol_config: Some(
                http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                    Http2ProtocolOptions::default(),
                ),
            ),
        })
    } else if protocol.is_unsupported() {
        use_downstream_protocol()
    } else {
        return None;
    };
    Some(HttpProtocolOptions {
        upstream_protocol_options: Some(upstream),
        ..Default::default()
    })
}

/// HTTP/1 or HTTP/2 upstream, as the downstream spoke.
fn use_downstream_protocol() -> http_protocol_options::UpstreamProtocolOptions {
    http_protocol_options::UpstreamProtocolOptions::UseDownstreamProtocolConfig(
        http_protocol_options::UseDownstreamHttpConfig {
            http_protocol_options: Some(Http1ProtocolOptions::default()),
            http2_protocol_options: Some(Http2ProtocolOptions::default()),
            ..Default::default()
        },
    )
}

/// The passthrough clusters' protocol options: the downstream's protocol,
/// idle connections closed after five minutes.
fn passthrough_protocol_options() -> HttpProtocolOptions {
    HttpProtocolOptions {
        common_http_protocol_options: Some(CommonHttpOptions {
            idle_timeout: Some(duration(Duration::from_secs(300))),
            ..Default::default()
        }),
        upstream_protocol_options: Some(use_downstream_protocol()),
        ..Default::default()
    }
}

/// The ALPN our `ISTIO_MUTUAL` clients offer: Istio's set without metadata
/// exchange (`istio`, plus `h2` for HTTP/2 ports). Upstream Envoy has no
/// `istio.metadata_exchange` filter, so offering `istio-peer-exchange` would
/// let an Istio server start an exchange this client cannot answer.
pub const ALPN_IN_MESH: &[&str] = &["istio"];
/// [`ALPN_IN_MESH`] for HTTP/2 ports.
pub const ALPN_IN_MESH_H2: &[&str] = &["istio", "h2"];

/// Istio's TLS versions for mesh mTLS: 1.2 to 1.3.
pub fn mesh_tls_params(cipher_suites: &[&str]) -> TlsParameters {
    TlsParameters {
        tls_minimum_protocol_version: tls_parameters::TlsProtocol::TlSv12.into(),
        tls_maximum_protocol_version: tls_parameters::TlsProtocol::TlSv13.into(),
        cipher_suites: cipher_suites.iter().map(|c| c.to_string()).collect(),
        ..Default::default()
    }
}

/// Istio's `ISTIO_MUTUAL` upstream TLS: the workload certificate and root
/// from the agent's SDS, the peer's SPIFFE identity verified.
pub fn istio_mutual(sans: &[String], sni: &str, protocol: Protocol) -> UpstreamTlsContext {
    let alpn = if protocol.is_http2() {
        ALPN_IN_MESH_H2
    } else {
        ALPN_IN_MESH
    };
    UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_params: Some(mesh_tls_params(&[])),
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
            alpn_protocols: alpn.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        }),
        sni: sni.to_string(),
        ..Default::default()
    }
}
