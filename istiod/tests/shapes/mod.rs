//! Helpers for the generated-shape tests: a push context from YAML, a
//! proxy, and the generated resources decoded by name.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use istiod::mesh::MeshConfig;
use istiod::model::{ConfigStore, RegistryOptions, Update, parse_file};
use istiod::pushctx::context::IstioContext;
use istiod::pushctx::{Proxy, PushContext};
use istiod::xds::{CLUSTER_TYPE, LISTENER_TYPE, ROUTE_TYPE};
use prost::Message;
use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::core::v3::{address, socket_address};
use proto::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use proto::pb::envoy::config::route::v3::RouteConfiguration;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager,
};
use proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    DownstreamTlsContext, UpstreamTlsContext,
};
use proto::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use proto::pb::google::protobuf::Any;

/// The workload under test: `httpbin` in `demo`, Pod 198.18.0.3, behind a
/// Service with an HTTP port (8000 -> 8080), a TCP port (9000) and a port
/// whose protocol is detected (`data`, 7070); and the client `sleep`.
pub const MESH: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: httpbin, namespace: demo}
spec:
  clusterIP: 198.19.0.10
  selector: {app: httpbin}
  ports:
  - {name: http, port: 8000, targetPort: 8080}
  - {name: tcp-echo, port: 9000, targetPort: 9000}
  - {name: data, port: 7070, targetPort: 7070}
---
apiVersion: v1
kind: Pod
metadata:
  name: httpbin-v1
  namespace: demo
  labels: {app: httpbin, version: v1, security.istio.io/tlsMode: istio}
spec:
  serviceAccountName: httpbin
  containers: [{name: httpbin, image: httpbin}]
status: {phase: Running, podIP: 198.18.0.3}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: httpbin-1
  namespace: demo
  labels: {kubernetes.io/service-name: httpbin}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
- {name: tcp-echo, port: 9000, protocol: TCP}
- {name: data, port: 7070, protocol: TCP}
endpoints:
- addresses: [198.18.0.3]
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: demo, name: httpbin-v1}
---
apiVersion: v1
kind: Service
metadata: {name: sleep, namespace: demo}
spec:
  clusterIP: 198.19.0.20
  selector: {app: sleep}
  ports:
  - {name: http, port: 80, targetPort: 8080}
---
apiVersion: v1
kind: Pod
metadata:
  name: sleep-1
  namespace: demo
  labels: {app: sleep, security.istio.io/tlsMode: istio}
spec:
  serviceAccountName: sleep
  containers: [{name: sleep, image: curl}]
status: {phase: Running, podIP: 198.18.0.2}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: sleep-1
  namespace: demo
  labels: {kubernetes.io/service-name: sleep}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- addresses: [198.18.0.2]
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: demo, name: sleep-1}
"#;

/// A push context of `MESH` plus `extra`, with mesh config `mesh`.
pub fn ctx_with(extra: &str, mesh: MeshConfig) -> IstioContext {
    let store = ConfigStore::new();
    let text = format!("{MESH}\n---\n{extra}");
    let parsed = parse_file("test.yaml", &text).unwrap();
    store.apply(
        parsed
            .objects
            .into_iter()
            .map(|o| Update::Upsert(std::sync::Arc::new(o))),
    );
    IstioContext::new(
        "test/1".into(),
        &store.snapshot(),
        &RegistryOptions::default(),
    )
    .with_mesh(mesh)
}

/// A push context of `MESH` plus `extra`, with the default mesh config.
pub fn ctx(extra: &str) -> IstioContext {
    ctx_with(extra, MeshConfig::default())
}

/// A sidecar in `demo` with these IPs and labels.
pub fn proxy(ips: &[&str], labels: &[(&str, &str)]) -> Proxy {
    Proxy {
        proxy_type: common::ProxyType::Sidecar,
        ip: ips[0].into(),
        ips: ips.iter().map(|s| s.to_string()).collect(),
        id: "pod.demo".into(),
        node_id: format!("sidecar~{}~pod.demo~demo.svc.cluster.local", ips[0]),
        namespace: "demo".into(),
        domain: "demo.svc.cluster.local".into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        interception_mode: common::InterceptionMode::Redirect,
        ..Default::default()
    }
}

/// The httpbin Pod's proxy.
pub fn httpbin() -> Proxy {
    proxy(&["198.18.0.3"], &[("app", "httpbin"), ("version", "v1")])
}

/// The sleep Pod's proxy.
pub fn sleep() -> Proxy {
    proxy(&["198.18.0.2"], &[("app", "sleep")])
}

fn generate<M: Message + Default>(
    ctx: &IstioContext,
    p: &Proxy,
    type_url: &str,
) -> BTreeMap<String, M> {
    ctx.generate(p, type_url, &BTreeSet::new())
        .unwrap()
        .into_iter()
        .map(|r| {
            (
                r.name.clone(),
                M::decode(r.resource.value.as_slice()).unwrap(),
            )
        })
        .collect()
}

/// Listeners by name.
pub fn listeners(ctx: &IstioContext, p: &Proxy) -> BTreeMap<String, Listener> {
    generate(ctx, p, LISTENER_TYPE)
}

/// Clusters by name.
pub fn clusters(ctx: &IstioContext, p: &Proxy) -> BTreeMap<String, Cluster> {
    generate(ctx, p, CLUSTER_TYPE)
}

/// Route configurations by name (every name the listeners use).
pub fn routes(ctx: &IstioContext, p: &Proxy) -> BTreeMap<String, RouteConfiguration> {
    generate(ctx, p, ROUTE_TYPE)
}

pub fn decode<M: Message + Default>(a: &Any) -> M {
    M::decode(a.value.as_slice()).unwrap()
}

fn typed(f: &Filter) -> &Any {
    match &f.config_type {
        Some(filter::ConfigType::TypedConfig(a)) => a,
        _ => panic!("filter {} has no typed config", f.name),
    }
}

/// The cluster a chain's last filter sends to: TCP proxy, or the HTTP
/// connection manager's inline route.
pub fn chain_cluster(c: &FilterChain) -> String {
    let f = c.filters.last().unwrap();
    match f.name.as_str() {
        "envoy.filters.network.tcp_proxy" => tcp(c).1,
        "envoy.filters.network.http_connection_manager" => {
            let h = hcm(c);
            match h.route_specifier {
                Some(http_connection_manager::RouteSpecifier::RouteConfig(rc)) => {
                    let r = &rc.virtual_hosts[0].routes[0];
                    match &r.action {
                        Some(proto::pb::envoy::config::route::v3::route::Action::Route(a)) => {
                            match &a.cluster_specifier {
                                Some(proto::pb::envoy::config::route::v3::route_action::ClusterSpecifier::Cluster(c)) => c.clone(),
                                _ => panic!("no cluster"),
                            }
                        }
                        _ => panic!("no route"),
                    }
                }
                Some(http_connection_manager::RouteSpecifier::Rds(rds)) => {
                    format!("rds:{}", rds.route_config_name)
                }
                _ => panic!("no routes"),
            }
        }
        other => panic!("unexpected filter {other}"),
    }
}

/// (stat prefix, cluster) of a chain's TCP proxy.
pub fn tcp(c: &FilterChain) -> (String, String) {
    let f = c.filters.last().unwrap();
    assert_eq!(f.name, "envoy.filters.network.tcp_proxy");
    let t: TcpProxy = decode(typed(f));
    match t.cluster_specifier {
        Some(tcp_proxy::ClusterSpecifier::Cluster(c)) => (t.stat_prefix, c),
        _ => panic!("tcp_proxy without a cluster"),
    }
}

/// A chain's HTTP connection manager.
pub fn hcm(c: &FilterChain) -> HttpConnectionManager {
    let f = c.filters.last().unwrap();
    assert_eq!(f.name, "envoy.filters.network.http_connection_manager");
    decode(typed(f))
}

/// A chain's server TLS context, if it terminates TLS.
pub fn downstream_tls(c: &FilterChain) -> Option<DownstreamTlsContext> {
    c.transport_socket.as_ref().map(|t| match &t.config_type {
        Some(proto::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(a)) => {
            decode(a)
        }
        None => panic!("transport socket without config"),
    })
}

/// The upstream TLS context of a cluster (its transport socket, or the
/// `tlsMode-istio` match).
pub fn upstream_tls(c: &Cluster) -> UpstreamTlsContext {
    let ts = c.transport_socket.clone().unwrap_or_else(|| {
        c.transport_socket_matches[0]
            .transport_socket
            .clone()
            .unwrap()
    });
    match ts.config_type {
        Some(proto::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(a)) => {
            decode(&a)
        }
        None => panic!("no TLS config"),
    }
}

/// (transport protocol, ALPN) of a chain's match.
pub fn chain_match(c: &FilterChain) -> (String, Vec<String>) {
    let m = c.filter_chain_match.clone().unwrap_or_default();
    (m.transport_protocol, m.application_protocols)
}

/// The chains of a listener matching destination port `port` (0: none).
pub fn chains_for(l: &Listener, port: u32) -> Vec<&FilterChain> {
    l.filter_chains
        .iter()
        .filter(|c| {
            c.filter_chain_match
                .as_ref()
                .and_then(|m| m.destination_port)
                .map(|p| p.value)
                .unwrap_or(0)
                == port
        })
        .collect()
}

/// `ip:port` of an address.
pub fn addr(a: &Option<proto::pb::envoy::config::core::v3::Address>) -> String {
    match a.as_ref().and_then(|a| a.address.as_ref()) {
        Some(address::Address::SocketAddress(s)) => match s.port_specifier {
            Some(socket_address::PortSpecifier::PortValue(p)) => format!("{}:{p}", s.address),
            _ => s.address.clone(),
        },
        Some(address::Address::Pipe(p)) => format!("unix://{}", p.path),
        _ => String::new(),
    }
}

/// The HTTP protocol options of a cluster.
pub fn protocol_options(c: &Cluster) -> Option<HttpProtocolOptions> {
    c.typed_extension_protocol_options
        .get("envoy.extensions.upstreams.http.v3.HttpProtocolOptions")
        .map(decode)
}

/// Strings from `&str`s.
pub fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}
