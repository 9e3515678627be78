//! Outbound listeners (Istio's `buildSidecarOutboundListeners`): one per
//! bind and port, built from the proxy's egress scopes. HTTP ports share
//! `0.0.0.0_<port>` (HTTP inspector, RDS `"<port>"`, the rest through
//! `PassthroughFilterChain`); TCP ports get `<vip>_<port>`; ports whose
//! protocol is detected get `<vip>_<port>` with an HTTP chain (RDS
//! `"<host>:<port>"`) beside the TCP one. Conflicts on one listener merge as
//! Istio merges them. `virtualOutbound` (15001) takes what iptables captured.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proto::pb::envoy::config::core::v3::TrafficDirection;
use proto::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};
use proto::pb::google::protobuf::BoolValue;

use super::super::util::{
    IpMode, PASSTHROUGH_FILTER_CHAIN, VIRTUAL_OUTBOUND, VIRTUAL_OUTBOUND_PORT, delimited, duration,
    socket, u32v,
};
use super::{
    PLAINTEXT_HTTP_ALPNS, http_inspector, no_interception, outbound_hcm, tcp_proxy_to,
    tls_inspector, tproxy,
};
use crate::model::istio::CaptureMode;
use crate::model::service::{Protocol, Service, ServiceSource};
use crate::pushctx::Proxy;
use crate::pushctx::context::{EgressScope, IstioContext};
use crate::pushctx::names::BLACKHOLE_CLUSTER;
use crate::pushctx::names::outbound_name;

const VIRTUAL_OUTBOUND_BLACKHOLE: &str = "virtualOutbound-blackhole";
const VIRTUAL_OUTBOUND_CATCHALL_TCP: &str = "virtualOutbound-catchall-tcp";

/// A listener's protocol (Istio's `le.protocol`): detected once it holds
/// both an HTTP and a TCP chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Http,
    Tcp,
    Detect,
}

impl Class {
    fn of(p: Protocol) -> Option<Class> {
        if p.is_http() {
            Some(Class::Http)
        } else if p.is_unsupported() {
            Some(Class::Detect)
        } else if p == Protocol::Udp {
            None
        } else {
            Some(Class::Tcp)
        }
    }
}

/// The HTTP chain of a listener.
#[derive(Debug, Clone)]
struct HttpChain {
    route: String,
    /// Matches plain-text HTTP found by the HTTP inspector; else matches all.
    sniffed: bool,
}

/// The service port whose `tcp`/`tls` routes (or default cluster) make a
/// listener's TCP chains.
#[derive(Debug, Clone)]
struct TcpChains {
    host: String,
    cluster: String,
    /// `TLS` or `HTTPS`: chains by SNI.
    tls: bool,
    /// On the wildcard address (a TLS port of a service without one): the
    /// default chain too is selected by SNI, the host name, so that the
    /// services on the port share the listener.
    by_sni: bool,
}

/// One listener being planned (Istio's `outboundListenerEntry`).
#[derive(Debug, Clone)]
struct Entry {
    class: Class,
    bind_to_port: bool,
    http: Option<HttpChain>,
    /// The service ports of the TCP chains: one per listener (a second
    /// would conflict, and the first kept wins as in Istio), except
    /// services told apart by SNI on the wildcard address.
    tcp: Vec<TcpChains>,
    /// Built before the catch-all scope (for a port-specific Sidecar egress
    /// listener): the catch-all adds nothing to it.
    locked: bool,
}

impl Entry {
    /// Adds chains without replacing any (Istio's `mergeTCPFilterChains`).
    fn merge(&mut self, other: Entry) {
        let by_sni = |t: &[TcpChains]| !t.is_empty() && t.iter().all(|c| c.by_sni);
        if self.tcp.is_empty() {
            self.tcp = other.tcp;
        } else if by_sni(&self.tcp) && by_sni(&other.tcp) {
            for t in other.tcp {
                if !self.tcp.iter().any(|c| c.host == t.host) {
                    self.tcp.push(t);
                }
            }
        }
        if self.http.is_none() {
            self.http = other.http;
        }
    }
}

/// The listeners planned so far, by bind address and port.
struct Plan {
    ip: IpMode,
    /// Whether the proxy uses auto-allocated ServiceEntry addresses (it
    /// captures DNS, so its apps resolve hosts to them).
    auto_addresses: bool,
    /// The proxy's own first IP: a headless service's endpoint there gets
    /// no listener (traffic to itself does not go outbound).
    own_ip: Option<String>,
    entries: BTreeMap<(String, u16), Entry>,
}

/// How a scope's listeners bind.
struct Binding {
    /// The Sidecar's `bind`, localhost when binding without one, else empty
    /// (the service VIP for TCP, the wildcard for HTTP).
    bind: String,
    bind_to_port: bool,
}

impl Plan {
    /// The addresses TCP listeners of `svc`'s `port` bind to, as Istio's
    /// `buildSidecarOutboundListeners` picks them: the service's address
    /// (its own, else an auto-allocated one for a proxy that captures DNS);
    /// without one, each endpoint's IP for a passthrough service (a headless
    /// Service; a ServiceEntry NONE with endpoints), else the wildcard for
    /// a NONE entry (whose cluster forwards to the original destination,
    /// as the catch-all would). Istio also gives none to a NONE entry with
    /// a `workloadSelector` that selects nothing yet; here that one gets the
    /// wildcard. Other services without an address get no TCP listener
    /// here (their connections take the catch-all), except on TLS ports:
    /// the wildcard, where Istio tells them apart by SNI.
    fn tcp_binds(&self, svc: &Service, port: u16, tls: bool) -> Vec<String> {
        let (v4, v6) = self.ip.families();
        if let Some(vip) = svc.addresses_for(self.auto_addresses, v4, v6).first() {
            return vec![vip.to_string()];
        }
        let per_endpoint = svc.is_passthrough()
            && (svc.source == ServiceSource::Kubernetes
                || svc.endpoints_for(port).next().is_some());
        if !per_endpoint {
            return if svc.is_passthrough() || tls {
                vec![self.ip.wildcard().to_string()]
            } else {
                Vec::new()
            };
        }
        let mut binds: Vec<String> = svc
            .endpoints_for(port)
            .filter(|e| e.address.parse::<std::net::IpAddr>().is_ok())
            .filter(|e| self.own_ip.as_deref() != Some(e.address.as_str()))
            .map(|e| e.address.clone())
            .collect();
        binds.dedup();
        binds
    }

    /// Istio's `buildSidecarOutboundListener` for one service port.
    fn add(&mut self, b: &Binding, svc: &Service, port: u16, protocol: Protocol) {
        let Some(class) = Class::of(protocol) else {
            return;
        };
        let tls = matches!(protocol, Protocol::Tls | Protocol::Https);
        let binds = match class {
            _ if !b.bind.is_empty() => vec![b.bind.clone()],
            Class::Http => vec![self.ip.wildcard().to_string()],
            Class::Tcp | Class::Detect => self.tcp_binds(svc, port, tls),
        };
        for bind in binds {
            self.add_bound(b, bind, svc, port, class, tls);
        }
    }

    /// One listener of a service port, at `bind`.
    fn add_bound(
        &mut self,
        b: &Binding,
        bind: String,
        svc: &Service,
        port: u16,
        class: Class,
        tls: bool,
    ) {
        let wildcard = self.ip.wildcard();
        let by_sni = tls && bind == wildcard;
        let tcp = || {
            vec![TcpChains {
                host: svc.hostname.clone(),
                cluster: outbound_name(port, "", &svc.hostname),
                tls,
                by_sni,
            }]
        };
        let key = (bind.clone(), port);
        let existing = self.entries.get(&key).map(|e| (e.class, e.locked));
        if existing.is_some_and(|(_, locked)| locked) {
            return;
        }
        let entry = match class {
            Class::Http => {
                if existing.is_some_and(|(c, _)| c != Class::Tcp) {
                    return;
                }
                let sniffed = bind == wildcard;
                Entry {
                    class: if sniffed { Class::Detect } else { Class::Http },
                    bind_to_port: b.bind_to_port,
                    http: Some(HttpChain {
                        route: port.to_string(),
                        sniffed,
                    }),
                    tcp: Vec::new(),
                    locked: false,
                }
            }
            Class::Tcp => Entry {
                class,
                bind_to_port: b.bind_to_port,
                http: None,
                tcp: tcp(),
                locked: false,
            },
            Class::Detect => {
                let route = if bind != wildcard {
                    format!("{}:{port}", svc.hostname)
                } else {
                    port.to_string()
                };
                let over_detect = existing.is_some_and(|(c, _)| c == Class::Detect);
                Entry {
                    class,
                    bind_to_port: b.bind_to_port,
                    // Over a detected listener only the TCP chain is merged.
                    http: (!over_detect).then_some(HttpChain {
                        route,
                        sniffed: true,
                    }),
                    tcp: tcp(),
                    locked: false,
                }
            }
        };
        match (existing.map(|(c, _)| c), class) {
            // New, or detection replacing an HTTP listener.
            (None, _) | (Some(Class::Http), Class::Detect) => {
                self.entries.insert(key, entry);
            }
            (Some(current), _) => {
                let Some(e) = self.entries.get_mut(&key) else {
                    return;
                };
                // HTTP and TCP on one listener: detect which by inspection.
                if current != class || class == Class::Detect {
                    e.class = Class::Detect;
                }
                e.merge(entry);
            }
        }
    }
}

/// Whether a proxy uses auto-allocated ServiceEntry addresses (Istio's
/// `nodeUsesAutoallocatedIPs` with `PILOT_ENABLE_IP_AUTOALLOCATE` on): one
/// whose agent captures DNS, so its apps resolve the hosts to them.
pub fn uses_auto_addresses(proxy: &Proxy) -> bool {
    proxy.dns_capture
}

/// What of the proxy itself its outbound listeners depend on, beyond its
/// Sidecar scope, IP families and interception mode: whether it uses
/// auto-allocated addresses, its IP when it is an endpoint of a
/// passthrough service (whose per-endpoint listeners leave it out), and its
/// labels when a `tcp`/`tls` route matches on `sourceLabels`.
pub fn listener_key(
    ctx: &IstioContext,
    scope: &crate::pushctx::scope::SidecarScope,
    proxy: &Proxy,
) -> String {
    let labels = *scope
        .listeners_need_labels
        .get_or_init(|| super::outbound_l4::labels_matter(ctx, &proxy.namespace));
    let own = proxy.ips.first().filter(|ip| {
        scope
            .services()
            .iter()
            .any(|s| s.is_passthrough() && s.endpoints.iter().any(|e| &e.address == *ip))
    });
    format!(
        "{}/{}/{}",
        uses_auto_addresses(proxy),
        own.map(String::as_str).unwrap_or(""),
        if labels {
            format!("{:?}", proxy.labels)
        } else {
            String::new()
        }
    )
}

/// The listener plan of a proxy, from its egress scopes in order.
fn plan(ctx: &IstioContext, proxy: &Proxy) -> Plan {
    let ip = IpMode::of(&proxy.ips);
    let mut plan = Plan {
        ip,
        auto_addresses: uses_auto_addresses(proxy),
        own_ip: proxy.ips.first().cloned(),
        entries: BTreeMap::new(),
    };
    let sidecar_scope = ctx.scope(proxy);
    for scope in ctx.egress_scopes(proxy) {
        let l = scope.listener;
        let capture_none = l.is_some_and(|l| l.capture_mode == CaptureMode::None);
        let bind = l.map(|l| l.bind.as_str()).unwrap_or_default();
        if bind.starts_with("unix://") {
            // Unix domain socket listeners are not generated.
            continue;
        }
        let bind_to_port = no_interception(proxy) || capture_none;
        let binding = Binding {
            bind: match bind {
                "" if bind_to_port => ip.localhost().to_string(),
                b => b.to_string(),
            },
            bind_to_port,
        };
        add_scope(
            &mut plan,
            &binding,
            scope,
            &sidecar_scope.egress_services(scope.index),
        );
    }
    plan
}

fn add_scope(
    plan: &mut Plan,
    binding: &Binding,
    scope: EgressScope<'_>,
    services: &[&std::sync::Arc<Service>],
) {
    match scope
        .listener
        .and_then(|l| l.port.as_ref())
        .filter(|p| p.number != 0)
    {
        // A port-specific listener: the services with that port, with the
        // listener's protocol.
        Some(port) => {
            let number = port.number as u16;
            let protocol = Protocol::parse(&port.protocol);
            for svc in services.iter().filter(|s| s.port(number).is_some()) {
                plan.add(binding, svc, number, protocol);
            }
        }
        // The catch-all: every port of every service, where the listeners
        // of port-specific scopes left it free.
        None => {
            for e in plan.entries.values_mut() {
                e.locked = true;
            }
            for svc in services {
                for p in &svc.ports {
                    plan.add(binding, svc, p.port, p.protocol);
                }
            }
        }
    }
}

/// The catch-all chain's TCP proxy: Istio's `PassthroughFilterChain` and
/// `virtualOutbound-catchall-tcp` filters.
fn catch_all(ctx: &IstioContext, proxy: &Proxy) -> proto::pb::envoy::config::listener::v3::Filter {
    tcp_proxy_to(&ctx.outbound_policy(proxy).cluster)
}

/// Istio's `buildListenerFromEntry`.
fn listener(ctx: &IstioContext, proxy: &Proxy, bind: &str, port: u16, e: &Entry) -> Listener {
    let name = format!("{bind}_{port}");
    let mut chains = Vec::new();
    let mut default = None;
    let mut inspect_tls = false;
    let mut matches = Vec::new();
    for tcp in &e.tcp {
        let l4 = super::outbound_l4::Port {
            host: &tcp.host,
            port,
            tls: tcp.tls,
            by_sni: tcp.by_sni,
            cluster: &tcp.cluster,
        };
        for chain in super::outbound_l4::chains(ctx, proxy, &l4) {
            match &chain.filter_chain_match {
                None => default = Some(chain),
                // Envoy refuses two chains with one match: the first wins.
                Some(m) if matches.contains(m) => {}
                Some(m) => {
                    inspect_tls |= !m.server_names.is_empty();
                    matches.push(m.clone());
                    chains.push(chain);
                }
            }
        }
    }
    let mut inspect = false;
    if let Some(h) = &e.http {
        let chain = FilterChain {
            filters: vec![outbound_hcm(
                &delimited(&format!("outbound_{name}")),
                &h.route,
                ctx.mesh.path_normalization,
            )],
            ..Default::default()
        };
        if h.sniffed {
            inspect = true;
            chains.push(FilterChain {
                filter_chain_match: Some(FilterChainMatch {
                    transport_protocol: "raw_buffer".into(),
                    application_protocols: PLAINTEXT_HTTP_ALPNS
                        .iter()
                        .map(|a| a.to_string())
                        .collect(),
                    ..Default::default()
                }),
                ..chain
            });
        } else {
            default = Some(chain);
        }
    }
    // A lone match-all chain is the listener's only chain; without one, what
    // no chain takes goes where the outbound traffic policy says.
    let default_filter_chain = match default {
        Some(d) if chains.is_empty() => {
            chains.push(d);
            None
        }
        Some(d) => Some(d),
        None => Some(FilterChain {
            name: PASSTHROUGH_FILTER_CHAIN.into(),
            filter_chain_match: Some(FilterChainMatch::default()),
            filters: vec![catch_all(ctx, proxy)],
            ..Default::default()
        }),
    };
    Listener {
        name,
        address: Some(socket(bind, port.into())),
        bind_to_port: (!e.bind_to_port).then_some(BoolValue { value: false }),
        traffic_direction: TrafficDirection::Outbound.into(),
        continue_on_listener_filters_timeout: true,
        listener_filters: inspect_tls
            .then(tls_inspector)
            .into_iter()
            .chain(inspect.then(http_inspector))
            .collect(),
        listener_filters_timeout: Some(duration(Duration::ZERO)),
        filter_chains: chains,
        default_filter_chain,
        ..Default::default()
    }
}

/// The outbound per-port listeners of a proxy.
pub(super) fn listeners(ctx: &IstioContext, proxy: &Proxy) -> Vec<Listener> {
    plan(ctx, proxy)
        .entries
        .iter()
        .map(|((bind, port), e)| listener(ctx, proxy, bind, *port, e))
        .collect()
}

/// The RDS names the outbound listeners of a proxy use: `"<port>"`, and
/// `"<host>:<port>"` for detected-protocol listeners on a service address.
pub fn route_names(ctx: &IstioContext, proxy: &Proxy) -> BTreeSet<String> {
    plan(ctx, proxy)
        .entries
        .values()
        .filter_map(|e| e.http.as_ref().map(|h| h.route.clone()))
        .collect()
}

/// `virtualOutbound`: where iptables sends outbound connections. Each goes
/// to the listener of its original destination (`use_original_dst`); the
/// rest to `virtualOutbound-catchall-tcp`, except connections to 15001
/// itself, which would loop (`virtualOutbound-blackhole`).
pub(super) fn virtual_outbound(ctx: &IstioContext, proxy: &Proxy) -> Option<Listener> {
    if no_interception(proxy) {
        return None;
    }
    let ip = IpMode::of(&proxy.ips);
    Some(Listener {
        name: VIRTUAL_OUTBOUND.into(),
        address: Some(socket(ip.wildcard(), VIRTUAL_OUTBOUND_PORT.into())),
        use_original_dst: Some(BoolValue { value: true }),
        transparent: tproxy(proxy).then_some(BoolValue { value: true }),
        traffic_direction: TrafficDirection::Outbound.into(),
        filter_chains: vec![
            FilterChain {
                name: VIRTUAL_OUTBOUND_BLACKHOLE.into(),
                filter_chain_match: Some(FilterChainMatch {
                    destination_port: Some(u32v(VIRTUAL_OUTBOUND_PORT.into())),
                    ..Default::default()
                }),
                filters: vec![tcp_proxy_to(BLACKHOLE_CLUSTER)],
                ..Default::default()
            },
            FilterChain {
                name: VIRTUAL_OUTBOUND_CATCHALL_TCP.into(),
                filters: vec![catch_all(ctx, proxy)],
                ..Default::default()
            },
        ],
        ..Default::default()
    })
}
