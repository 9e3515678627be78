//! LDS for sidecars, with Istio's names: `virtualOutbound` (15001) and
//! `virtualInbound` (15006) for iptables interception, `0.0.0.0_<port>`
//! (HTTP, RDS) and `<vip>_<port>` (TCP) outbound listeners reached through
//! `virtualOutbound`, and Sidecar `captureMode: NONE` listeners bound to
//! explicit addresses. Inbound chains follow PeerAuthentication: STRICT
//! accepts mutual TLS only, PERMISSIVE both, DISABLE plain text.
//!
//! Istio-proxy-only filters (`istio.metadata_exchange`, `istio.stats`,
//! `istio_authn`) are left out: upstream Envoy does not have them.

use std::collections::BTreeSet;
use std::time::Duration;

use proto::pb::envoy::config::core::v3::TrafficDirection;
use proto::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter, filter, listener_filter,
};
use proto::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route, route_action,
    route_match,
};
use proto::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use proto::pb::envoy::extensions::filters::http::router::v3::Router;
use proto::pb::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use proto::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager, http_filter,
};
use proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, common_tls_context,
};
use proto::pb::google::protobuf::BoolValue;

use super::cds::{inbound_name, outbound_name};
use super::context::IstioContext;
use super::util::{ads_source, any, duration, sds, socket, transport_socket};
use super::{Proxy, Resource};
use crate::model::istio::{CaptureMode, MtlsMode, OutboundMode};

fn resource(l: Listener) -> Resource {
    Resource {
        name: l.name.clone(),
        resource: any(&l),
    }
}

fn network_filter<M: prost::Message + prost::Name>(name: &str, m: &M) -> Filter {
    Filter {
        name: name.into(),
        config_type: Some(filter::ConfigType::TypedConfig(any(m))),
    }
}

fn http_filter<M: prost::Message + prost::Name>(name: &str, m: &M) -> HttpFilter {
    HttpFilter {
        name: name.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(m))),
        ..Default::default()
    }
}

fn tcp_proxy_to(stat_prefix: &str, cluster: &str) -> Filter {
    network_filter(
        "envoy.filters.network.tcp_proxy",
        &TcpProxy {
            stat_prefix: stat_prefix.into(),
            cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(cluster.into())),
            ..Default::default()
        },
    )
}

/// The outbound HTTP connection manager: routes by RDS name (the port).
fn outbound_hcm(stat_prefix: &str, route_name: &str) -> Filter {
    network_filter(
        "envoy.filters.network.http_connection_manager",
        &HttpConnectionManager {
            stat_prefix: stat_prefix.into(),
            route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
                config_source: Some(ads_source()),
                route_config_name: route_name.into(),
            })),
            // The fault filter serves VirtualService fault injection.
            http_filters: vec![
                http_filter("envoy.filters.http.fault", &HttpFault::default()),
                http_filter("envoy.filters.http.router", &Router::default()),
            ],
            ..Default::default()
        },
    )
}

/// The inbound HTTP connection manager: to the local app, with the client's
/// identity in `X-Forwarded-Client-Cert` as Istio's sidecars set it.
fn inbound_hcm(target_port: u16) -> Filter {
    let cluster = inbound_name(target_port);
    network_filter(
        "envoy.filters.network.http_connection_manager",
        &HttpConnectionManager {
            stat_prefix: format!("inbound_0.0.0.0_{target_port}"),
            route_specifier: Some(http_connection_manager::RouteSpecifier::RouteConfig(
                RouteConfiguration {
                    name: cluster.clone(),
                    virtual_hosts: vec![VirtualHost {
                        name: format!("inbound|http|{target_port}"),
                        domains: vec!["*".into()],
                        routes: vec![Route {
                            name: "default".into(),
                            r#match: Some(RouteMatch {
                                path_specifier: Some(route_match::PathSpecifier::Prefix(
                                    "/".into(),
                                )),
                                ..Default::default()
                            }),
                            action: Some(route::Action::Route(RouteAction {
                                cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
                                    cluster.clone(),
                                )),
                                timeout: Some(duration(Duration::ZERO)),
                                ..Default::default()
                            })),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }],
                    validate_clusters: Some(BoolValue { value: false }),
                    ..Default::default()
                },
            )),
            forward_client_cert_details:
                http_connection_manager::ForwardClientCertDetails::AppendForward.into(),
            set_current_client_cert_details: Some(
                http_connection_manager::SetCurrentClientCertDetails {
                    subject: Some(BoolValue { value: true }),
                    dns: true,
                    uri: true,
                    ..Default::default()
                },
            ),
            http_filters: vec![http_filter("envoy.filters.http.router", &Router::default())],
            ..Default::default()
        },
    )
}

/// Istio's inbound mTLS server context: the workload certificate, peers
/// verified against the mesh root.
fn inbound_tls() -> proto::pb::envoy::config::core::v3::TransportSocket {
    transport_socket(
        "envoy.transport_sockets.tls",
        &DownstreamTlsContext {
            common_tls_context: Some(CommonTlsContext {
                tls_certificate_sds_secret_configs: vec![sds("default")],
                validation_context_type: Some(
                    common_tls_context::ValidationContextType::CombinedValidationContext(
                        common_tls_context::CombinedCertificateValidationContext {
                            default_validation_context: Some(
                                CertificateValidationContext::default(),
                            ),
                            validation_context_sds_secret_config: Some(sds("ROOTCA")),
                            ..Default::default()
                        },
                    ),
                ),
                alpn_protocols: vec!["h2".into(), "http/1.1".into()],
                ..Default::default()
            }),
            require_client_certificate: Some(BoolValue { value: true }),
            ..Default::default()
        },
    )
}

/// Filter chains for one inbound port, per its mTLS mode.
fn inbound_chains(
    mode: MtlsMode,
    port: Option<u16>,
    target_port: u16,
    http: bool,
) -> Vec<FilterChain> {
    let app = if http {
        inbound_hcm(target_port)
    } else {
        tcp_proxy_to(&inbound_name(target_port), &inbound_name(target_port))
    };
    let chain_match = |tls: bool| FilterChainMatch {
        destination_port: port.map(|p| super::util::u32v(p.into())),
        transport_protocol: if tls {
            "tls".into()
        } else {
            "raw_buffer".into()
        },
        ..Default::default()
    };
    let tls = FilterChain {
        name: format!("{}-mtls", inbound_name(target_port)),
        filter_chain_match: Some(chain_match(true)),
        filters: vec![app.clone()],
        transport_socket: Some(inbound_tls()),
        ..Default::default()
    };
    let plain = FilterChain {
        name: inbound_name(target_port),
        filter_chain_match: Some(chain_match(false)),
        filters: vec![app],
        ..Default::default()
    };
    match mode {
        MtlsMode::Strict => vec![tls],
        MtlsMode::Disable => vec![plain],
        _ => vec![tls, plain],
    }
}

fn listener_filters(original_dst: bool) -> Vec<ListenerFilter> {
    let mut f = Vec::new();
    if original_dst {
        f.push(ListenerFilter {
            name: "envoy.filters.listener.original_dst".into(),
            config_type: Some(listener_filter::ConfigType::TypedConfig(any(
                &OriginalDst {},
            ))),
            ..Default::default()
        });
    }
    f.push(ListenerFilter {
        name: "envoy.filters.listener.tls_inspector".into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(any(
            &TlsInspector::default(),
        ))),
        ..Default::default()
    });
    f
}

/// The listeners of one proxy.
pub fn build(ctx: &IstioContext, proxy: &Proxy) -> Vec<Resource> {
    let mut out = Vec::new();
    let sidecar = ctx.sidecar_for(proxy);
    let registry_only = sidecar
        .and_then(|s| s.spec.outbound_traffic_policy.as_ref())
        .is_some_and(|p| p.mode == OutboundMode::RegistryOnly);
    let catch_all = if registry_only {
        "BlackHoleCluster"
    } else {
        "PassthroughCluster"
    };
    let services = ctx.services_for(proxy);

    // virtualOutbound: iptables sends outbound traffic here; per-port
    // listeners take it by original destination, the rest passes through.
    out.push(resource(Listener {
        name: "virtualOutbound".into(),
        address: Some(socket("0.0.0.0", 15001)),
        use_original_dst: Some(BoolValue { value: true }),
        traffic_direction: TrafficDirection::Outbound.into(),
        filter_chains: vec![FilterChain {
            name: "PassthroughFilterChain".into(),
            filters: vec![tcp_proxy_to(catch_all, catch_all)],
            ..Default::default()
        }],
        ..Default::default()
    }));

    // Per-port outbound listeners (not bound: reached through virtualOutbound).
    let mut http_ports = BTreeSet::new();
    for svc in &services {
        for port in &svc.ports {
            if port.protocol.is_http() {
                if http_ports.insert(port.port) {
                    out.push(resource(Listener {
                        name: format!("0.0.0.0_{}", port.port),
                        address: Some(socket("0.0.0.0", port.port.into())),
                        bind_to_port: Some(BoolValue { value: false }),
                        traffic_direction: TrafficDirection::Outbound.into(),
                        filter_chains: vec![FilterChain {
                            filters: vec![outbound_hcm(
                                &format!("outbound_0.0.0.0_{}", port.port),
                                &port.port.to_string(),
                            )],
                            ..Default::default()
                        }],
                        ..Default::default()
                    }));
                }
            } else if let Some(vip) = svc.addresses.first() {
                out.push(resource(Listener {
                    name: format!("{vip}_{}", port.port),
                    address: Some(socket(vip, port.port.into())),
                    bind_to_port: Some(BoolValue { value: false }),
                    traffic_direction: TrafficDirection::Outbound.into(),
                    filter_chains: vec![FilterChain {
                        filters: vec![tcp_proxy_to(
                            &outbound_name(port.port, "", &svc.hostname),
                            &outbound_name(port.port, "", &svc.hostname),
                        )],
                        ..Default::default()
                    }],
                    ..Default::default()
                }));
            }
        }
    }

    // virtualInbound: iptables sends inbound traffic here.
    let mut chains = Vec::new();
    let mut seen = BTreeSet::new();
    for (svc, service_port, target) in ctx.inbound_for(proxy) {
        if !seen.insert(target) {
            continue;
        }
        let http = svc.port(service_port).is_some_and(|p| p.protocol.is_http());
        chains.extend(inbound_chains(
            ctx.mtls_mode(proxy, target),
            Some(target),
            target,
            http,
        ));
    }
    chains.push(FilterChain {
        name: "virtualInbound-catchall".into(),
        filters: vec![tcp_proxy_to(
            "InboundPassthroughCluster",
            "InboundPassthroughCluster",
        )],
        ..Default::default()
    });
    out.push(resource(Listener {
        name: "virtualInbound".into(),
        address: Some(socket("0.0.0.0", 15006)),
        traffic_direction: TrafficDirection::Inbound.into(),
        listener_filters: listener_filters(true),
        filter_chains: chains,
        ..Default::default()
    }));

    // Sidecar listeners with captureMode NONE: bound where the app connects.
    if let Some(sc) = sidecar {
        for eg in sc
            .spec
            .egress
            .iter()
            .filter(|e| e.capture_mode == CaptureMode::None)
        {
            let Some(port) = &eg.port else { continue };
            let bind = if eg.bind.is_empty() {
                "127.0.0.1"
            } else {
                eg.bind.as_str()
            };
            let number = port.number as u16;
            let protocol = crate::model::service::Protocol::parse(&port.protocol);
            let filter = if protocol.is_http() {
                outbound_hcm(&format!("outbound_{bind}_{number}"), &number.to_string())
            } else {
                match services.iter().find(|s| s.port(number).is_some()) {
                    Some(svc) => tcp_proxy_to(
                        &outbound_name(number, "", &svc.hostname),
                        &outbound_name(number, "", &svc.hostname),
                    ),
                    None => tcp_proxy_to(catch_all, catch_all),
                }
            };
            out.push(resource(Listener {
                name: format!("{bind}_{number}"),
                address: Some(socket(bind, number.into())),
                traffic_direction: TrafficDirection::Outbound.into(),
                filter_chains: vec![FilterChain {
                    filters: vec![filter],
                    ..Default::default()
                }],
                ..Default::default()
            }));
        }
        for ing in sc
            .spec
            .ingress
            .iter()
            .filter(|i| i.capture_mode == CaptureMode::None)
        {
            let port = &ing.port;
            let bind = if ing.bind.is_empty() {
                "0.0.0.0"
            } else {
                ing.bind.as_str()
            };
            let number = port.number as u16;
            let target = ing
                .default_endpoint
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse().ok())
                .unwrap_or(number);
            let http = crate::model::service::Protocol::parse(&port.protocol).is_http();
            out.push(resource(Listener {
                name: format!("{bind}_{number}"),
                address: Some(socket(bind, number.into())),
                traffic_direction: TrafficDirection::Inbound.into(),
                listener_filters: listener_filters(false),
                filter_chains: inbound_chains(ctx.mtls_mode(proxy, number), None, target, http),
                ..Default::default()
            }));
        }
    }
    out
}
