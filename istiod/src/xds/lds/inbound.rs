//! Inbound listeners (Istio's `listener_inbound.go`): `virtualInbound` on
//! 15006 with `virtualInbound-blackhole`, the passthrough chains
//! (`virtualInbound`, `virtualInbound-catchall-http`) and one set of chains
//! per workload port (`<bind>_<port>`), chosen by PeerAuthentication mode and
//! port protocol as Istio's `filterchain_options.go` does; Sidecar ingress
//! ports with `captureMode: NONE` get listeners of their own. A Sidecar
//! ingress port with `tls` (under `ENABLE_TLS_ON_SIDECAR_INGRESS`) whose
//! mTLS mode is DISABLE gets one chain terminating that TLS instead
//! (Istio's `getTLSFilterChainMatchOptions`), serving the protocol after
//! termination (HTTPS as HTTP, TLS as TCP).

use std::collections::BTreeMap;
use std::time::Duration;

use proto::pb::envoy::config::core::v3::{TrafficDirection, TransportSocket};
use proto::pb::envoy::config::listener::v3::{Filter, FilterChain, FilterChainMatch, Listener};
use proto::pb::envoy::config::route::v3::{
    Decorator, RetryPolicy, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route,
    route_action, route_match,
};
use proto::pb::envoy::extensions::filters::http::router::v3::Router;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager,
};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SubjectAltNameMatcher,
    common_tls_context, subject_alt_name_matcher,
};
use proto::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use proto::pb::google::protobuf::BoolValue;

use super::super::cds::mesh_tls_params;
use super::super::security::InboundSecurity;
use super::super::util::{
    INBOUND_PASSTHROUGH_CLUSTER, IpMode, VIRTUAL_INBOUND, VIRTUAL_INBOUND_PORT, delimited,
    duration, sds, socket, transport_socket, u32v,
};
use super::gateway_tls::downstream_tls_context;
use super::{
    PLAINTEXT_HTTP_ALPNS, any_port, http_filter, http_inspector, network_filter, no_interception,
    not_any_port, original_dst, original_src, tcp_proxy_to, tls_inspector, tproxy,
};
use crate::model::gateway::ServerTlsSettings;
use crate::model::istio::MtlsMode;
use crate::model::service::Protocol;
use crate::pushctx::Proxy;
use crate::pushctx::context::{InboundPort, IstioContext};
use crate::pushctx::names::BLACKHOLE_CLUSTER;
use crate::pushctx::names::inbound_name;

/// ALPN of mesh clients that detected HTTP (Istio's `istio.alpn` sets them).
const MTLS_HTTP_ALPNS: &[&str] = &["istio-http/1.0", "istio-http/1.1", "istio-h2"];
/// Every ALPN a mesh client offers (Istio's `allIstioMtlsALPNs`).
const ALL_ISTIO_MTLS_ALPNS: &[&str] = &[
    "istio",
    "istio-peer-exchange",
    "istio-http/1.0",
    "istio-http/1.1",
    "istio-h2",
];
/// ALPN of mesh clients that did not detect HTTP (Istio's `mtlsTCPWithMxcALPNs`).
const MTLS_TCP_ALPNS: &[&str] = &["istio-peer-exchange", "istio"];
/// The server's ALPN for mesh mTLS, HTTP and TCP chains alike: Istio's
/// `ALPNDownstream`, the set it uses without metadata exchange (upstream
/// Envoy has no `istio.metadata_exchange` filter to honour
/// `istio-peer-exchange`). Never `istio`, which would hide h2 from the client.
const ALPN_DOWNSTREAM: &[&str] = &["h2", "http/1.1"];
/// Istio's server cipher suites for mesh mTLS.
const CIPHER_SUITES: &[&str] = &[
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-GCM-SHA256",
];
const TLS: &str = "tls";
const RAW_BUFFER: &str = "raw_buffer";
const VIRTUAL_INBOUND_BLACKHOLE: &str = "virtualInbound-blackhole";
const VIRTUAL_INBOUND_CATCHALL_HTTP: &str = "virtualInbound-catchall-http";

/// What a chain does with a connection (Istio's `ListenerProtocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Serve {
    Http,
    Tcp,
}

/// Istio's `FilterChainMatchOptions`: one chain's match and what it serves.
#[derive(Debug, Clone, Copy)]
struct MatchOption {
    alpn: &'static [&'static str],
    transport: &'static str,
    serve: Serve,
    /// Terminates mesh mTLS.
    mtls: bool,
}

const fn opt(alpn: &'static [&'static str], transport: &'static str, serve: Serve) -> MatchOption {
    MatchOption {
        alpn,
        transport,
        serve,
        mtls: false,
    }
}

const fn mtls(alpn: &'static [&'static str], serve: Serve) -> MatchOption {
    MatchOption {
        alpn,
        transport: TLS,
        serve,
        mtls: true,
    }
}

/// Istio's `getFilterChainMatchOptions`: the chains of one port by mTLS
/// mode and protocol (HTTP, TCP, or detected: `Unsupported`).
fn match_options(mode: MtlsMode, protocol: Protocol) -> Vec<MatchOption> {
    use Serve::{Http, Tcp};
    let strict = mode == MtlsMode::Strict;
    let permissive = matches!(mode, MtlsMode::Permissive | MtlsMode::Unset);
    if protocol.is_http() {
        if strict {
            vec![mtls(&[], Http)]
        } else if permissive {
            vec![mtls(ALL_ISTIO_MTLS_ALPNS, Http), opt(&[], RAW_BUFFER, Http)]
        } else {
            vec![opt(&[], RAW_BUFFER, Http)]
        }
    } else if protocol.is_unsupported() {
        if strict {
            vec![mtls(MTLS_HTTP_ALPNS, Http), mtls(&[], Tcp)]
        } else if permissive {
            vec![
                mtls(MTLS_HTTP_ALPNS, Http),
                opt(PLAINTEXT_HTTP_ALPNS, RAW_BUFFER, Http),
                mtls(MTLS_TCP_ALPNS, Tcp),
                opt(&[], RAW_BUFFER, Tcp),
                // One-way TLS from a client outside the mesh: to the app as is.
                opt(&[], TLS, Tcp),
            ]
        } else {
            vec![
                opt(PLAINTEXT_HTTP_ALPNS, RAW_BUFFER, Http),
                opt(&[], RAW_BUFFER, Tcp),
            ]
        }
    } else if strict {
        vec![mtls(&[], Tcp)]
    } else if permissive {
        vec![
            mtls(ALL_ISTIO_MTLS_ALPNS, Tcp),
            opt(&[], TLS, Tcp),
            opt(&[], RAW_BUFFER, Tcp),
        ]
    } else {
        vec![opt(&[], RAW_BUFFER, Tcp)]
    }
}

/// Istio's `inboundChainConfig`: what the chains of one port are built from.
struct ChainConfig {
    cluster: String,
    /// The destination port matched; 0 matches any (the passthrough).
    port: u16,
    service_port: u16,
    protocol: Protocol,
    hostname: String,
    bind: String,
    passthrough: bool,
}

impl ChainConfig {
    fn from_port(p: &InboundPort, ip: IpMode) -> Self {
        Self {
            cluster: inbound_name(p.port),
            port: p.port,
            service_port: p.service_port,
            protocol: p.protocol,
            hostname: p.hostname.clone(),
            bind: if p.bind.is_empty() {
                ip.wildcard().to_string()
            } else {
                p.bind.clone()
            },
            passthrough: false,
        }
    }

    fn passthrough(port: u16) -> Self {
        Self {
            cluster: INBOUND_PASSTHROUGH_CLUSTER.into(),
            port,
            service_port: 0,
            protocol: Protocol::Unsupported,
            hostname: String::new(),
            bind: String::new(),
            passthrough: true,
        }
    }

    /// `<bind>_<port>`; the passthrough chains have fixed names.
    fn name(&self, serve: Serve) -> String {
        match (self.passthrough, serve) {
            (true, Serve::Http) => VIRTUAL_INBOUND_CATCHALL_HTTP.into(),
            (true, Serve::Tcp) => VIRTUAL_INBOUND.into(),
            (false, _) => format!("{}_{}", self.bind, self.port),
        }
    }

    /// The HTTP connection manager's stat prefix (`inbound_<bind>_<port>;`).
    fn stat_prefix(&self) -> String {
        if self.passthrough {
            delimited(&self.cluster)
        } else {
            delimited(&format!("inbound_{}", self.name(Serve::Http)))
        }
    }

    fn chain_match(&self, o: &MatchOption) -> FilterChainMatch {
        FilterChainMatch {
            destination_port: (self.port > 0).then(|| u32v(self.port.into())),
            transport_protocol: o.transport.into(),
            application_protocols: o.alpn.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        }
    }

    fn chains(
        &self,
        mode: MtlsMode,
        trust_domain: &str,
        security: &InboundSecurity,
    ) -> Vec<FilterChain> {
        match_options(mode, self.protocol)
            .iter()
            .map(|o| FilterChain {
                name: self.name(o.serve),
                filter_chain_match: Some(self.chain_match(o)),
                filters: self.filters(o.serve, security),
                transport_socket: o.mtls.then(|| mesh_mtls(trust_domain)),
                ..Default::default()
            })
            .collect()
    }

    /// The chain of a port terminating the Sidecar ingress `tls` (the
    /// config's protocol is already the one after termination).
    fn terminating_chain(
        &self,
        tls: &ServerTlsSettings,
        security: &InboundSecurity,
    ) -> FilterChain {
        let serve = if self.protocol.is_http() {
            Serve::Http
        } else {
            Serve::Tcp
        };
        FilterChain {
            name: self.name(serve),
            filter_chain_match: Some(self.chain_match(&opt(&[], TLS, serve))),
            filters: self.filters(serve, security),
            transport_socket: Some(transport_socket(
                "envoy.transport_sockets.tls",
                &downstream_tls_context(tls),
            )),
            ..Default::default()
        }
    }

    fn filters(&self, serve: Serve, security: &InboundSecurity) -> Vec<Filter> {
        match serve {
            Serve::Http => vec![self.hcm(security)],
            Serve::Tcp => {
                let mut filters = security.tcp.clone();
                filters.push(tcp_proxy_to(&self.cluster));
                filters
            }
        }
    }

    /// The inbound HTTP connection manager: an inline route to the cluster,
    /// the client's identity in `X-Forwarded-Client-Cert`, the security
    /// filters ahead of the router.
    fn hcm(&self, security: &InboundSecurity) -> Filter {
        let mut http_filters = security.http.clone();
        http_filters.push(http_filter("envoy.filters.http.router", &Router::default()));
        network_filter(
            "envoy.filters.network.http_connection_manager",
            &HttpConnectionManager {
                stat_prefix: self.stat_prefix(),
                route_specifier: Some(http_connection_manager::RouteSpecifier::RouteConfig(
                    self.route_config(),
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
                http2_protocol_options: self.protocol.is_http2().then(Default::default),
                http_filters,
                ..super::normalized(security.path_normalization)
            },
        )
    }

    /// Istio's inbound route: `inbound|<port>||` with one `default` route,
    /// no timeout, retried before the request reached the app (not gRPC).
    fn route_config(&self) -> RouteConfiguration {
        let no_timeout = duration(Duration::ZERO);
        let grpc = matches!(self.protocol, Protocol::Grpc | Protocol::GrpcWeb);
        RouteConfiguration {
            name: self.cluster.clone(),
            virtual_hosts: vec![VirtualHost {
                name: format!("inbound|http|{}", self.service_port),
                domains: vec!["*".into()],
                routes: vec![Route {
                    name: "default".into(),
                    r#match: Some(RouteMatch {
                        path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                        ..Default::default()
                    }),
                    action: Some(route::Action::Route(RouteAction {
                        cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
                            self.cluster.clone(),
                        )),
                        timeout: Some(no_timeout),
                        max_stream_duration: Some(route_action::MaxStreamDuration {
                            max_stream_duration: Some(no_timeout),
                            grpc_timeout_header_max: Some(no_timeout),
                            ..Default::default()
                        }),
                        retry_policy: (!grpc).then(|| RetryPolicy {
                            retry_on: "reset-before-request".into(),
                            num_retries: Some(u32v(2)),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })),
                    decorator: Some(Decorator {
                        operation: format!("{}:{}/*", self.hostname, self.service_port),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            validate_clusters: Some(BoolValue { value: false }),
            ..Default::default()
        }
    }
}

/// Istio's server side of mesh mTLS: the workload certificate, a client
/// certificate required from the mesh root with a SPIFFE identity in the
/// trust domain, TLS 1.2 to 1.3 with Istio's cipher suites.
fn mesh_mtls(trust_domain: &str) -> TransportSocket {
    transport_socket(
        "envoy.transport_sockets.tls",
        &DownstreamTlsContext {
            common_tls_context: Some(CommonTlsContext {
                tls_params: Some(mesh_tls_params(CIPHER_SUITES)),
                tls_certificate_sds_secret_configs: vec![sds(common::xds::SDS_WORKLOAD_SECRET)],
                validation_context_type: Some(
                    common_tls_context::ValidationContextType::CombinedValidationContext(
                        common_tls_context::CombinedCertificateValidationContext {
                            default_validation_context: Some(CertificateValidationContext {
                                match_typed_subject_alt_names: vec![SubjectAltNameMatcher {
                                    san_type: subject_alt_name_matcher::SanType::Uri.into(),
                                    matcher: Some(StringMatcher {
                                        match_pattern: Some(string_matcher::MatchPattern::Prefix(
                                            format!("spiffe://{trust_domain}/"),
                                        )),
                                        ..Default::default()
                                    }),
                                    ..Default::default()
                                }],
                                ..Default::default()
                            }),
                            validation_context_sds_secret_config: Some(sds(
                                common::xds::SDS_ROOT_SECRET,
                            )),
                            ..Default::default()
                        },
                    ),
                ),
                alpn_protocols: ALPN_DOWNSTREAM.iter().map(|a| a.to_string()).collect(),
                ..Default::default()
            }),
            require_client_certificate: Some(BoolValue { value: true }),
            ..Default::default()
        },
    )
}

/// Istio's `AfterTLSTermination`: what a terminated port serves.
fn after_tls_termination(p: Protocol) -> Protocol {
    match p {
        Protocol::Https => Protocol::Http,
        Protocol::Tls => Protocol::Tcp,
        other => other,
    }
}

/// `virtualInbound-blackhole`: connections made to 15006 itself would loop.
fn blackhole_chain() -> FilterChain {
    FilterChain {
        name: VIRTUAL_INBOUND_BLACKHOLE.into(),
        filter_chain_match: Some(FilterChainMatch {
            destination_port: Some(u32v(VIRTUAL_INBOUND_PORT.into())),
            ..Default::default()
        }),
        filters: vec![tcp_proxy_to(BLACKHOLE_CLUSTER)],
        ..Default::default()
    }
}

/// The passthrough chains (Istio's `buildInboundPassthroughChains`): the
/// black hole, then detected-protocol chains to `InboundPassthroughCluster`
/// for any port, and for each port with its own PeerAuthentication mode
/// that no inbound port covers.
fn passthrough_chains(
    ctx: &IstioContext,
    proxy: &Proxy,
    ports: &[InboundPort],
    security: &InboundSecurity,
) -> Vec<FilterChain> {
    let mut chains = vec![blackhole_chain()];
    let mut modes = vec![(0, ctx.mtls_mode(proxy, 0))];
    for p in ctx.port_level_mtls_ports(proxy) {
        if !ports.iter().any(|q| q.port == p) {
            modes.push((p, ctx.mtls_mode(proxy, p)));
        }
    }
    for (port, mode) in modes {
        chains.extend(ChainConfig::passthrough(port).chains(mode, &ctx.trust_domain, security));
    }
    chains
}

/// Istio's `populateListenerFilters`: `original_dst` for redirected
/// traffic (`original_src` too under TPROXY), then the TLS and HTTP
/// inspectors only on the destination ports whose chains need them.
fn listener_filters(
    proxy: &Proxy,
    chains: &[FilterChain],
    bind_to_port: bool,
) -> Vec<proto::pb::envoy::config::listener::v3::ListenerFilter> {
    let mut out = Vec::new();
    if !bind_to_port {
        out.push(original_dst());
        if tproxy(proxy) {
            out.push(original_src());
        }
    }
    // Destination port (0: any) -> (needs TLS inspection, needs HTTP inspection).
    let mut need: BTreeMap<u32, (bool, bool)> = BTreeMap::new();
    for fc in chains {
        let m = fc.filter_chain_match.clone().unwrap_or_default();
        let port = m.destination_port.map(|p| p.value).unwrap_or(0);
        let entry = need.entry(port).or_default();
        entry.0 |= m.transport_protocol == TLS;
        entry.1 |= m
            .application_protocols
            .iter()
            .any(|a| PLAINTEXT_HTTP_ALPNS.contains(&a.as_str()));
    }
    if need.values().any(|n| n.0) {
        let mut f = tls_inspector();
        let default_on = need.get(&0).is_some_and(|n| n.0);
        // On for every port but those without TLS chains, or only on those with.
        let ports: Vec<u32> = need
            .iter()
            .filter(|(p, n)| **p != 0 && n.0 != default_on)
            .map(|(p, _)| *p)
            .collect();
        if !ports.is_empty() {
            f.filter_disabled = Some(if default_on {
                any_port(&ports)
            } else {
                not_any_port(&ports)
            });
        }
        out.push(f);
    }
    // After the TLS inspector: it only inspects what is not TLS.
    if need.values().any(|n| n.1) {
        let mut f = http_inspector();
        let ports: Vec<u32> = need.iter().filter(|(_, n)| !n.1).map(|(p, _)| *p).collect();
        if !ports.is_empty() {
            f.filter_disabled = Some(any_port(&ports));
        }
        out.push(f);
    }
    out
}

fn inbound_listener(
    proxy: &Proxy,
    name: String,
    bind: &str,
    port: u16,
    bind_to_port: bool,
    chains: Vec<FilterChain>,
) -> Listener {
    Listener {
        name,
        address: Some(socket(bind, port.into())),
        traffic_direction: TrafficDirection::Inbound.into(),
        continue_on_listener_filters_timeout: true,
        // Istio's mesh default `protocolDetectionTimeout`: no timeout.
        listener_filters_timeout: Some(duration(Duration::ZERO)),
        transparent: (!bind_to_port && tproxy(proxy)).then_some(BoolValue { value: true }),
        listener_filters: listener_filters(proxy, &chains, bind_to_port),
        filter_chains: chains,
        ..Default::default()
    }
}

/// `virtualInbound` (unless the proxy has no interception) and the
/// listeners of Sidecar ingress ports that bind their own port.
pub(super) fn listeners(ctx: &IstioContext, proxy: &Proxy) -> Vec<Listener> {
    let ip = IpMode::of(&proxy.ips);
    let ports = ctx.inbound_ports(proxy);
    let security = InboundSecurity::build(ctx, proxy);
    let mut out = Vec::new();
    let mut virtual_chains = Vec::new();
    for p in &ports {
        let mut cc = ChainConfig::from_port(p, ip);
        let mode = ctx.mtls_mode(proxy, p.port);
        let chains = match &p.tls {
            // Istio's rule: the user's TLS only where mesh mTLS is off.
            Some(tls) if mode == MtlsMode::Disable => {
                cc.protocol = after_tls_termination(cc.protocol);
                vec![cc.terminating_chain(tls, &security)]
            }
            _ => cc.chains(mode, &ctx.trust_domain, &security),
        };
        if p.bind_to_port {
            out.push(inbound_listener(
                proxy,
                cc.name(Serve::Tcp),
                &cc.bind,
                p.port,
                true,
                chains,
            ));
        } else {
            virtual_chains.extend(chains);
        }
    }
    if !no_interception(proxy) {
        let mut chains = passthrough_chains(ctx, proxy, &ports, &security);
        chains.extend(virtual_chains);
        out.insert(
            0,
            inbound_listener(
                proxy,
                VIRTUAL_INBOUND.into(),
                ip.wildcard(),
                VIRTUAL_INBOUND_PORT,
                false,
                chains,
            ),
        );
    }
    out
}
