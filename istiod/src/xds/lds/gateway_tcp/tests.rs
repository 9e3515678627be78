#![allow(clippy::unwrap_used)]

use prost::Message;
use proto::pb::envoy::config::listener::v3::{Filter, Listener, filter};
use proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};

use crate::pushctx::Proxy;
use crate::pushctx::context::IstioContext;

const CONFIG: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: a, namespace: demo}
spec:
  hosts: [a.example.com]
  ports: [{number: 443, name: tls, protocol: TLS}]
  resolution: STATIC
  location: MESH_EXTERNAL
  endpoints: [{address: 198.18.0.60}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: echo, namespace: demo}
spec:
  hosts: [echo.example.com]
  ports: [{number: 9000, name: tcp, protocol: TCP}]
  resolution: STATIC
  location: MESH_EXTERNAL
  endpoints: [{address: 198.18.0.61}]
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: edge, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 31400, name: tcp, protocol: TCP}
    hosts: ["*"]
  - port: {number: 8443, name: tls, protocol: TLS}
    hosts: ["demo/*.example.com"]
    tls: {mode: PASSTHROUGH}
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: tcp, namespace: demo}
spec:
  hosts: ["*"]
  gateways: [istio-system/edge]
  tcp:
  - match: [{port: 9999}]
    route: [{destination: {host: a.example.com}}]
  - match: [{port: 31400, gateways: [istio-system/edge]}]
    route:
    - destination: {host: echo.example.com}
      weight: 100
    - destination: {host: a.example.com}
      weight: 0
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: sni, namespace: demo}
spec:
  hosts: ["*.example.com"]
  gateways: [istio-system/edge]
  tls:
  - match: [{sniHosts: [a.example.com]}]
    route: [{destination: {host: a.example.com}}]
  - match: [{sniHosts: [b.example.com, a.example.com]}, {sniHosts: [c.example.com], port: 8443}]
    route:
    - destination: {host: a.example.com}
      weight: 50
    - destination: {host: echo.example.com, port: {number: 9000}}
      weight: 50
"#;

fn context(extra: &str) -> IstioContext {
    crate::pushctx::context::context_of_yaml(&format!("{CONFIG}{extra}"))
}

fn router() -> Proxy {
    Proxy {
        proxy_type: common::ProxyType::Router,
        ip: "198.18.0.20".into(),
        ips: vec!["198.18.0.20".into()],
        namespace: "istio-system".into(),
        labels: [("istio".to_string(), "ingressgateway".to_string())]
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

fn listeners(ctx: &IstioContext) -> Vec<Listener> {
    crate::xds::lds::build(ctx, &router())
        .iter()
        .map(|r| Listener::decode(r.resource.value.as_slice()).unwrap())
        .collect()
}

fn listener(ctx: &IstioContext, name: &str) -> Listener {
    listeners(ctx)
        .into_iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no listener {name}"))
}

fn tcp(f: &Filter) -> TcpProxy {
    assert_eq!(f.name, "envoy.filters.network.tcp_proxy");
    let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        panic!("{f:?}");
    };
    TcpProxy::decode(any.value.as_slice()).unwrap()
}

#[test]
fn a_tcp_server_forwards_by_the_first_applying_tcp_route() {
    let ctx = context("");
    let l = listener(&ctx, "0.0.0.0_31400");
    assert!(l.listener_filters.is_empty(), "no SNI: no TLS inspector");
    assert_eq!(l.filter_chains.len(), 1);
    assert!(l.filter_chains[0].filter_chain_match.is_none());
    let p = tcp(&l.filter_chains[0].filters[0]);
    // Two destinations: weighted, named after the VirtualService, without
    // the destination of weight 0.
    assert_eq!(p.stat_prefix, "tcp.demo");
    let Some(tcp_proxy::ClusterSpecifier::WeightedClusters(w)) = p.cluster_specifier else {
        panic!("{p:?}");
    };
    let clusters: Vec<(&str, u32)> = w
        .clusters
        .iter()
        .map(|c| (c.name.as_str(), c.weight))
        .collect();
    assert_eq!(clusters, [("outbound|9000||echo.example.com", 100)]);
    // The TCP port has no route configuration; the HTTP port keeps its own.
    let names = crate::xds::lds::route_names(&ctx, &router());
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["http.8080"]);
}

#[test]
fn a_passthrough_server_routes_by_sni_without_terminating() {
    let ctx = context("");
    let l = listener(&ctx, "0.0.0.0_8443");
    assert_eq!(
        l.listener_filters
            .iter()
            .map(|f| f.name.as_str())
            .collect::<Vec<_>>(),
        ["envoy.filters.listener.tls_inspector"]
    );
    // a.example.com once (the second match repeating it is skipped, as
    // Istio skips duplicate SNI hosts), then c.example.com.
    let chains: Vec<(Vec<String>, String)> = l
        .filter_chains
        .iter()
        .map(|c| {
            let m = c.filter_chain_match.as_ref().unwrap();
            assert_eq!(m.transport_protocol, "tls");
            assert!(c.transport_socket.is_none(), "passthrough: no TLS context");
            (m.server_names.clone(), tcp(&c.filters[0]).stat_prefix)
        })
        .collect();
    assert_eq!(
        chains,
        [
            (
                vec!["a.example.com".to_string()],
                "outbound|443||a.example.com".to_string()
            ),
            (vec!["c.example.com".to_string()], "sni.demo".to_string()),
        ]
    );
    let p = tcp(&l.filter_chains[0].filters[0]);
    assert_eq!(
        p.cluster_specifier,
        Some(tcp_proxy::ClusterSpecifier::Cluster(
            "outbound|443||a.example.com".into()
        ))
    );
}

#[test]
fn a_destination_rule_limits_the_connection_duration() {
    let ctx = context(
        "---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: a, namespace: istio-system}\nspec:\n  host: a.example.com\n  trafficPolicy: {connectionPool: {tcp: {maxConnectionDuration: 30s}}}\n",
    );
    let l = listener(&ctx, "0.0.0.0_8443");
    let p = tcp(&l.filter_chains[0].filters[0]);
    assert_eq!(p.max_downstream_connection_duration.unwrap().seconds, 30);
}

#[test]
fn a_port_no_route_reaches_gets_no_listener() {
    let mut ctx = context("");
    ctx.virtual_services.clear();
    let names: Vec<String> = listeners(&ctx).into_iter().map(|l| l.name).collect();
    assert_eq!(names, ["0.0.0.0_8080"]);
}

#[test]
fn matches_for_other_gateways_or_ports_do_not_apply() {
    let ctx = context(
        "---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: other, namespace: demo}\nspec:\n  selector: {istio: ingressgateway}\n  servers:\n  - port: {number: 31401, name: tcp, protocol: TCP}\n    hosts: ['*']\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: other, namespace: demo}\nspec:\n  hosts: ['*']\n  gateways: [other]\n  tcp:\n  - match: [{gateways: [istio-system/edge]}]\n    route: [{destination: {host: a.example.com}}]\n  - match: [{gateways: [other], port: 31401}]\n    route: [{destination: {host: echo.example.com}}]\n",
    );
    let l = listener(&ctx, "0.0.0.0_31401");
    let p = tcp(&l.filter_chains[0].filters[0]);
    assert_eq!(p.stat_prefix, "outbound|9000||echo.example.com");
}

#[test]
fn an_https_passthrough_server_is_forwarded_as_tls() {
    // Istio's "ingress gateway without TLS termination" task: HTTPS with
    // tls.mode PASSTHROUGH, routed by a VirtualService tls route.
    let ctx = context(
        "---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: https, namespace: istio-system}\nspec:\n  selector: {istio: ingressgateway}\n  servers:\n  - port: {number: 443, name: https, protocol: HTTPS}\n    hosts: [a.example.com]\n    tls: {mode: PASSTHROUGH}\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: https, namespace: demo}\nspec:\n  hosts: [a.example.com]\n  gateways: [istio-system/https]\n  tls:\n  - match: [{sniHosts: [a.example.com], port: 443}]\n    route: [{destination: {host: a.example.com}}]\n",
    );
    let l = listener(&ctx, "0.0.0.0_443");
    assert_eq!(l.filter_chains.len(), 1);
    let m = l.filter_chains[0].filter_chain_match.as_ref().unwrap();
    assert_eq!(m.server_names, ["a.example.com"]);
    assert_eq!(
        tcp(&l.filter_chains[0].filters[0]).stat_prefix,
        "outbound|443||a.example.com"
    );
    assert!(!crate::xds::lds::route_names(&ctx, &router()).contains("http.443"));
}
