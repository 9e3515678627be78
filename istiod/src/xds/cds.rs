//! CDS for sidecars, with Istio's names: `outbound|<port>|<subset>|<host>`
//! EDS clusters (DestinationRule policy, auto mTLS), `ORIGINAL_DST` ones for
//! headless Services and ServiceEntries of resolution NONE (EDS on
//! gateways, which cannot forward to an original destination: Istio's
//! `convertResolution`), and in [`inbound`]
//! `inbound|<port>||`, `BlackHoleCluster`, `PassthroughCluster` and
//! `InboundPassthroughCluster`.

mod inbound;
pub(super) mod policy;
#[cfg(test)]
mod tests;
pub(crate) mod tls;

use std::time::Duration;

use proto::pb::envoy::config::cluster::v3::{CircuitBreakers, Cluster, circuit_breakers, cluster};
use proto::pb::envoy::config::core::v3::{
    Http1ProtocolOptions, Http2ProtocolOptions, HttpProtocolOptions as CommonHttpOptions,
    RoutingPriority, UpstreamHttpProtocolOptions,
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

use std::sync::Arc;

use super::util::{
    ads_source, any, delimited, duration, sds, socket, struct_of, transport_socket, u32v,
};
use crate::model::istio::{
    ConnectionPoolSettings, H2UpgradePolicy, MtlsMode, TlsMode, TrafficPolicy,
};
use crate::model::service::{EndpointTlsMode, Protocol, Service, ServicePort, ServiceResolution};
use crate::model::{Kind, ObjectKey};
use crate::pushctx::cache::{Dependency, KeyBuilder};
use crate::pushctx::context::IstioContext;
use crate::pushctx::scope::SidecarScope;
use crate::pushctx::{Proxy, Resource};

/// Istio's mesh default `connectTimeout`.
/// Istio's "unlimited" circuit-breaker threshold.
const UNLIMITED: u32 = u32::MAX;

use crate::pushctx::names::{inbound_name, outbound_name};

fn resource(c: Cluster) -> Arc<Resource> {
    Arc::new(Resource::new(
        c.name.clone(),
        super::metadata_encoding::cluster(&c),
    ))
}

fn kind(t: cluster::DiscoveryType) -> Option<cluster::ClusterDiscoveryType> {
    Some(cluster::ClusterDiscoveryType::Type(t.into()))
}

/// The clusters of one proxy: its scope's outbound clusters, built once
/// per push context for every proxy with the scope, then its inbound and
/// built-in clusters.
pub fn build(ctx: &IstioContext, proxy: &Proxy) -> Vec<Arc<Resource>> {
    let scope = ctx.scope(proxy);
    let mut out: Vec<Arc<Resource>> = outbound_clusters(ctx, &scope).to_vec();
    if proxy.proxy_type == common::ProxyType::Router {
        // Passthrough services' clusters are EDS on a gateway.
        let passthrough: Vec<&Arc<Service>> = scope
            .services()
            .iter()
            .filter(|s| s.is_passthrough())
            .collect();
        if !passthrough.is_empty() {
            out.retain(|c| {
                crate::pushctx::names::parse_cluster(&c.name)
                    .is_none_or(|(_, _, host)| !passthrough.iter().any(|s| s.hostname == host))
            });
            for svc in passthrough {
                out.extend(service_clusters(ctx, &scope, svc, true));
            }
        }
    } else {
        // A gateway has no inbound side: its listeners route outbound only.
        out.extend(inbound::clusters(ctx, proxy).into_iter().map(resource));
    }
    out.extend(
        inbound::builtin(proxy, ctx.mesh.connect_timeout)
            .into_iter()
            .map(resource),
    );
    out
}

/// The outbound clusters of a Sidecar scope. Each comes from the XDS cache
/// when an earlier push context built it from the same inputs.
pub fn outbound_clusters(ctx: &IstioContext, scope: &SidecarScope) -> Arc<[Arc<Resource>]> {
    let mut built = false;
    let clusters = scope
        .outbound_clusters
        .get_or_init(|| {
            built = true;
            build_outbound(ctx, scope).into()
        })
        .clone();
    if !built {
        ctx.cache.count_shared(clusters.len());
    }
    clusters
}

fn build_outbound(ctx: &IstioContext, scope: &SidecarScope) -> Vec<Arc<Resource>> {
    scope
        .services()
        .iter()
        .flat_map(|svc| service_clusters(ctx, scope, svc, false))
        .collect()
}

/// The clusters of one service: one per port and subset; `router` builds a
/// passthrough service's as EDS.
fn service_clusters(
    ctx: &IstioContext,
    scope: &SidecarScope,
    svc: &Service,
    router: bool,
) -> Vec<Arc<Resource>> {
    let mut out = Vec::new();
    let dr = ctx.destination_rule(scope, svc);
    let top = dr.and_then(|d| d.spec.traffic_policy.as_ref());
    // What an outbound cluster is built from, besides its name: the
    // service, the DestinationRule chosen for this proxy, and the mTLS
    // mode the service's PeerAuthentications imply.
    let inputs = KeyBuilder::new("CDS", "")
        .with((&svc.hostname, &svc.namespace, svc.revision))
        .with(dr.map(|d| (&d.namespace, &d.name)))
        .with(ctx.service_mtls_mode(svc))
        .with(router && svc.is_passthrough())
        .key();
    let dependencies = || dependencies(svc, dr);
    let with_selector = dr.is_some_and(|d| d.spec.workload_selector.is_some());
    let subsets = dr.map(|d| d.spec.subsets.as_slice()).unwrap_or_default();
    for port in &svc.ports {
        for subset in std::iter::once(None).chain(subsets.iter().map(Some)) {
            let subset_name = subset.map(|s| s.name.as_str()).unwrap_or("");
            let name = outbound_name(port.port, subset_name, &svc.hostname);
            let key = KeyBuilder::new("CDS", &name).with(inputs).key();
            out.push(
                ctx.cache
                    .get_or_build(key, &name, ctx.seq, dependencies, || {
                        let policy = policy::effective(top, subset, port.port);
                        let c = outbound(
                            ctx,
                            svc,
                            port,
                            (subset_name, policy.as_ref(), with_selector),
                            router,
                        );
                        Resource::new(name.clone(), super::metadata_encoding::cluster(&c))
                    }),
            );
        }
    }
    out
}

/// What a cluster or load assignment of `svc` is invalidated by: the
/// service, and the DestinationRule chosen for it.
pub(super) fn dependencies(
    svc: &Service,
    dr: Option<&crate::pushctx::named::Named<crate::model::istio::DestinationRule>>,
) -> Vec<Dependency> {
    let mut d = vec![Dependency::Service(svc.hostname.clone())];
    if let Some(dr) = dr {
        d.push(Dependency::Config(ObjectKey::new(
            Kind::DestinationRule,
            &dr.namespace,
            &dr.name,
        )));
    }
    d
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

/// One outbound cluster of `svc`'s `port`, for a subset (empty: none)
/// with the traffic policy that applies to it, from a DestinationRule with
/// a `workloadSelector` or not (a `credentialName` needs one on sidecars).
fn outbound(
    ctx: &IstioContext,
    svc: &Service,
    port: &ServicePort,
    (subset, policy, with_selector): (&str, Option<&TrafficPolicy>, bool),
    router: bool,
) -> Cluster {
    let original_dst = svc.is_passthrough() && !router;
    let name = outbound_name(port.port, subset, &svc.hostname);
    let mut c = Cluster {
        name: name.clone(),
        alt_stat_name: delimited(&name),
        connect_timeout: Some(duration(
            policy
                .and_then(|p| p.connection_pool.as_ref())
                .and_then(|cp| cp.tcp.as_ref())
                .and_then(|t| t.connect_timeout)
                .unwrap_or(ctx.mesh.connect_timeout),
        )),
        circuit_breakers: Some(unlimited_breakers()),
        metadata: Some(super::istio_stats::cluster_metadata(
            &[crate::pushctx::names::ServiceRef::of(svc)],
            Some(port.port),
        )),
        ..Default::default()
    };
    match svc.resolution {
        ServiceResolution::DnsLb | ServiceResolution::DnsRoundRobinLb => {
            c.cluster_discovery_type = kind(if svc.resolution == ServiceResolution::DnsLb {
                cluster::DiscoveryType::StrictDns
            } else {
                cluster::DiscoveryType::LogicalDns
            });
            // Istio's DNS settings: answers keep their TTL, failed lookups
            // retry at the mesh's `dnsRefreshRate`. Envoy deprecates both
            // fields for its DNS cluster extension; Istio still sets them,
            // and Envoy 1.40 applies them.
            #[allow(deprecated)]
            {
                c.dns_refresh_rate = Some(duration(ctx.mesh.dns_refresh_rate));
                c.respect_dns_ttl = true;
            }
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
        // The connection goes where the client sent it (Istio's
        // `Cluster_ORIGINAL_DST` with `CLUSTER_PROVIDED` balancing).
        _ if original_dst => {
            c.cluster_discovery_type = kind(cluster::DiscoveryType::OriginalDst);
        }
        _ => {
            c.cluster_discovery_type = kind(cluster::DiscoveryType::Eds);
            c.eds_cluster_config = Some(cluster::EdsClusterConfig {
                eds_config: Some(ads_source()),
                service_name: name.clone(),
            });
        }
    }
    let lb = policy.and_then(|p| p.load_balancer.as_ref());
    policy::apply_load_balancer(&mut c, lb);
    if original_dst {
        // The destination is the client's: no balancer settings apply
        // (Istio's `applyLoadBalancer` stops here too).
        c.lb_policy = cluster::LbPolicy::ClusterProvided.into();
        c.lb_config = None;
    }
    let pool = policy.and_then(|p| p.connection_pool.as_ref());
    if let Some(cp) = pool {
        policy::apply_connection_pool(&mut c, cp);
    }
    if let Some(od) = policy.and_then(|p| p.outlier_detection.as_ref()) {
        policy::apply_outlier_detection(&mut c, od);
    }
    // Locality priorities and weights go into EDS, per proxy; a DNS
    // cluster's endpoints (in the cluster, shared by every proxy of the
    // scope) have no locality to weigh.
    if let Some(setting) = crate::pushctx::locality::effective(
        ctx.mesh.locality_lb_setting.as_ref(),
        lb.and_then(|l| l.locality_lb_setting.as_ref()),
    ) && c.eds_cluster_config.is_some()
    {
        super::locality::apply_to_cluster(&mut c, setting);
    }
    let user_tls = policy.and_then(|p| p.tls.as_ref());
    let http2 = upstream_is_http2(port.protocol, pool);
    let mut auto_sni = tls::AutoSni::default();
    if let Some(t) = user_tls
        && let Some((context, auto)) =
            tls::originate(t, &svc.subject_alt_names, http2, with_selector)
    {
        c.transport_socket = Some(transport_socket("envoy.transport_sockets.tls", &context));
        auto_sni = auto;
    }
    if let Some(options) = http_options(port.protocol, pool, auto_sni) {
        c.typed_extension_protocol_options
            .insert(HTTP_PROTOCOL_OPTIONS.into(), any(&options));
    }
    let tls_mode = user_tls.map(|t| t.mode);
    let sans: Vec<String> = match user_tls.filter(|t| !t.subject_alt_names.is_empty()) {
        Some(t) => t.subject_alt_names.clone(),
        None if !svc.subject_alt_names.is_empty() => svc.subject_alt_names.clone(),
        None => svc.identities().into_iter().collect(),
    };
    // ISTIO_MUTUAL sends the rule's `sni` when given, else Istio's own.
    let sni = match user_tls.filter(|t| t.mode == TlsMode::IstioMutual && !t.sni.is_empty()) {
        Some(t) => t.sni.clone(),
        None => format!("outbound_.{}_.{}_.{}", port.port, subset, svc.hostname),
    };
    match tls_mode {
        Some(TlsMode::IstioMutual) => {
            c.transport_socket = Some(transport_socket(
                "envoy.transport_sockets.tls",
                &istio_mutual(&sans, &sni, port.protocol),
            ));
        }
        // Auto mTLS (Istio's `buildAutoMtlsSettings`): not for services
        // outside the mesh, nor for those whose PeerAuthentication says
        // DISABLE (their servers would refuse the handshake); an unknown
        // mode (a workload-level policy) is left to the endpoints' labels.
        // An original-destination cluster has no endpoints whose labels a
        // match could read: Istio sets the mutual TLS socket itself when
        // the service's mode is known (`applyUpstreamTLSSettings`); when a
        // workload-level policy leaves it unknown, the endpoints' labels
        // decide for all of them.
        None if original_dst => {
            let mtls = match ctx.service_mtls_mode(svc) {
                _ if svc.mesh_external => false,
                Some(MtlsMode::Disable) => false,
                Some(_) => true,
                None => {
                    svc.endpoints
                        .iter()
                        .any(|e| e.tls_mode == EndpointTlsMode::Istio)
                        && svc
                            .endpoints
                            .iter()
                            .all(|e| e.tls_mode == EndpointTlsMode::Istio)
                }
            };
            if mtls {
                c.transport_socket = Some(transport_socket(
                    "envoy.transport_sockets.tls",
                    &istio_mutual(&sans, &sni, port.protocol),
                ));
            }
        }
        None if !svc.mesh_external && ctx.service_mtls_mode(svc) != Some(MtlsMode::Disable) => {
            // Endpoints labelled tlsMode=istio get mutual TLS.
            c.transport_socket_matches = vec![
                cluster::TransportSocketMatch {
                    name: "tlsMode-istio".into(),
                    r#match: Some(struct_of(&[("tlsMode", common::TlsMode::Istio.as_str())])),
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
        // DISABLE sends plain text, even to mesh endpoints (no auto mTLS
        // for a user's setting); SIMPLE/MUTUAL got their socket above;
        // mesh-external services and DISABLE ones without a policy get
        // plain text.
        _ => {}
    }
    if let Some(pp) = policy.and_then(|p| p.proxy_protocol.as_ref()) {
        policy::apply_proxy_protocol(&mut c, pp);
    }
    c
}

/// The key of a cluster's HTTP protocol options.
const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

/// Whether the cluster speaks HTTP/2 upstream: `http2`/`grpc` ports, and
/// HTTP ports a DestinationRule upgrades (`h2UpgradePolicy: UPGRADE`, not
/// with `useClientProtocol`).
fn upstream_is_http2(protocol: Protocol, pool: Option<&ConnectionPoolSettings>) -> bool {
    let http = pool.and_then(|p| p.http.as_ref());
    let client_protocol = http.and_then(|h| h.use_client_protocol) == Some(true);
    protocol.is_http2()
        || (!client_protocol
            && protocol.is_http()
            && http.and_then(|h| h.h2_upgrade_policy) == Some(H2UpgradePolicy::Upgrade))
}

/// A cluster's HTTP protocol options, as Istio's `applyConnectionPool`,
/// `applyH2Upgrade` and `setAutoSniAndAutoSanValidation` build them: the
/// upstream protocol, the pool's HTTP limits (`maxRequestsPerConnection`,
/// `idleTimeout`, `tcp.maxConnectionDuration`, `maxConcurrentStreams`), and
/// Envoy's automatic SNI and SAN checks of TLS origination.
fn http_options(
    protocol: Protocol,
    pool: Option<&ConnectionPoolSettings>,
    auto: tls::AutoSni,
) -> Option<HttpProtocolOptions> {
    use http_protocol_options::UpstreamProtocolOptions;
    use http_protocol_options::explicit_http_config::ProtocolConfig;
    let http = pool.and_then(|p| p.http.as_ref());
    let http2_options = || Http2ProtocolOptions {
        max_concurrent_streams: http
            .and_then(|h| h.max_concurrent_streams)
            .filter(|v| *v > 0)
            .map(|v| u32v(v as u32)),
        ..Default::default()
    };
    let client_protocol = http.and_then(|h| h.use_client_protocol) == Some(true);
    let upstream = if client_protocol || protocol.is_unsupported() {
        Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(
            http_protocol_options::UseDownstreamHttpConfig {
                http_protocol_options: Some(Http1ProtocolOptions::default()),
                http2_protocol_options: Some(http2_options()),
                ..Default::default()
            },
        ))
    } else if upstream_is_http2(protocol, pool) {
        Some(UpstreamProtocolOptions::ExplicitHttpConfig(
            http_protocol_options::ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(http2_options())),
            },
        ))
    } else {
        None
    };
    let common = CommonHttpOptions {
        idle_timeout: http.and_then(|h| h.idle_timeout).map(duration),
        max_connection_duration: pool
            .and_then(|p| p.tcp.as_ref())
            .and_then(|t| t.max_connection_duration)
            .map(duration),
        max_requests_per_connection: http
            .and_then(|h| h.max_requests_per_connection)
            .filter(|v| *v > 0)
            .map(|v| u32v(v as u32)),
        ..Default::default()
    };
    let has_common = common != CommonHttpOptions::default();
    let has_auto = auto.sni || auto.san_validation;
    if upstream.is_none() && !has_common && !has_auto {
        return None;
    }
    Some(HttpProtocolOptions {
        common_http_protocol_options: has_common.then_some(common),
        upstream_http_protocol_options: has_auto.then(|| UpstreamHttpProtocolOptions {
            auto_sni: auto.sni,
            auto_san_validation: auto.san_validation,
            ..Default::default()
        }),
        // Envoy requires a protocol choice: HTTP/1.1 unless one was made.
        upstream_protocol_options: Some(upstream.unwrap_or_else(|| {
            UpstreamProtocolOptions::ExplicitHttpConfig(http_protocol_options::ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::HttpProtocolOptions(
                    Http1ProtocolOptions::default(),
                )),
            })
        })),
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
            tls_certificate_sds_secret_configs: vec![sds(common::xds::SDS_WORKLOAD_SECRET)],
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
                        validation_context_sds_secret_config: Some(sds(
                            common::xds::SDS_ROOT_SECRET,
                        )),
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
