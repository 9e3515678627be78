#![allow(clippy::unwrap_used)]

use prost::Message;
use proto::pb::envoy::config::listener::v3::{FilterChain, Listener, filter};
use proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};

use crate::pushctx::Proxy;
use crate::pushctx::context::context_of_yaml;

/// An entry `name.example` on `port` with `protocol` at `address`.
fn entry(name: &str, port: u16, protocol: &str, address: &str) -> String {
    format!(
        "---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: demo}}\nspec:\n  hosts: [{name}.example]\n  addresses: [{address}]\n  ports: [{{number: {port}, name: p, protocol: {protocol}}}]\n  location: MESH_EXTERNAL\n  resolution: STATIC\n  endpoints: [{{address: 198.18.5.1}}]\n"
    )
}

fn vs(spec: &str) -> String {
    format!(
        "---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: r, namespace: demo}}\nspec: {spec}\n"
    )
}

fn sleep(labels: &[(&str, &str)]) -> Proxy {
    Proxy {
        proxy_type: common::ProxyType::Sidecar,
        ip: "198.18.0.2".into(),
        ips: vec!["198.18.0.2".into()],
        namespace: "demo".into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

fn listener(ctx: &crate::pushctx::context::IstioContext, proxy: &Proxy, name: &str) -> Listener {
    crate::xds::lds::build(ctx, proxy)
        .iter()
        .map(|r| Listener::decode(r.resource.value.as_slice()).unwrap())
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no listener {name}"))
}

fn tcp_proxy_of(chain: &FilterChain) -> TcpProxy {
    let Some(filter::ConfigType::TypedConfig(a)) = &chain.filters[0].config_type else {
        panic!("{chain:?}")
    };
    TcpProxy::decode(a.value.as_slice()).unwrap()
}

/// A chain's SNI names and where it sends them.
type SniChain = (Vec<String>, Vec<(String, u32)>);

/// The clusters a chain sends to, with their weights (100 for one).
fn targets(chain: &FilterChain) -> Vec<(String, u32)> {
    match tcp_proxy_of(chain).cluster_specifier.unwrap() {
        tcp_proxy::ClusterSpecifier::Cluster(c) => vec![(c, 100)],
        tcp_proxy::ClusterSpecifier::WeightedClusters(w) => {
            w.clusters.into_iter().map(|c| (c.name, c.weight)).collect()
        }
    }
}

fn names(l: &Listener) -> Vec<String> {
    l.listener_filters.iter().map(|f| f.name.clone()).collect()
}

#[test]
fn a_tcp_route_by_port_splits_by_weight_on_the_services_listener() {
    let yaml = [
        entry("echo", 9000, "TCP", "240.0.0.5"),
        entry("v1", 9000, "TCP", "240.0.0.6"),
        entry("v2", 9000, "TCP", "240.0.0.7"),
        vs(
            "{hosts: [echo.example], tcp: [{match: [{port: 8000}], route: [{destination: {host: v2.example}}]}, {match: [{port: 9000}], route: [{destination: {host: v1.example}, weight: 80}, {destination: {host: v2.example}, weight: 20}]}]}",
        ),
    ]
    .concat();
    let ctx = context_of_yaml(&yaml);
    let l = listener(&ctx, &sleep(&[]), "240.0.0.5_9000");
    assert_eq!(l.filter_chains.len(), 1, "{l:#?}");
    assert!(l.filter_chains[0].filter_chain_match.is_none());
    assert_eq!(
        targets(&l.filter_chains[0]),
        [
            ("outbound|9000||v1.example".to_string(), 80),
            ("outbound|9000||v2.example".to_string(), 20)
        ]
    );
    assert_eq!(tcp_proxy_of(&l.filter_chains[0]).stat_prefix, "r.demo");
    // The other entries keep their own default chain.
    let v1 = listener(&ctx, &sleep(&[]), "240.0.0.6_9000");
    assert_eq!(
        targets(&v1.filter_chains[0]),
        [("outbound|9000||v1.example".to_string(), 100)]
    );
}

#[test]
fn destination_subnets_become_prefix_ranges_before_the_default() {
    let yaml = [
        entry("echo", 9000, "TCP", "240.0.0.5"),
        entry("v2", 9000, "TCP", "240.0.0.7"),
        vs(
            "{hosts: [echo.example], tcp: [{match: [{destinationSubnets: [240.0.0.0/24, 10.1.2.3]}], route: [{destination: {host: v2.example}}]}]}",
        ),
    ]
    .concat();
    let ctx = context_of_yaml(&yaml);
    let l = listener(&ctx, &sleep(&[]), "240.0.0.5_9000");
    assert_eq!(l.filter_chains.len(), 1, "{l:#?}");
    let m = l.filter_chains[0].filter_chain_match.as_ref().unwrap();
    let ranges: Vec<(String, u32)> = m
        .prefix_ranges
        .iter()
        .map(|r| (r.address_prefix.clone(), r.prefix_len.unwrap().value))
        .collect();
    assert_eq!(
        ranges,
        [("240.0.0.0".to_string(), 24), ("10.1.2.3".to_string(), 32)]
    );
    assert_eq!(
        targets(&l.filter_chains[0]),
        [("outbound|9000||v2.example".to_string(), 100)]
    );
    let default = l.default_filter_chain.as_ref().unwrap();
    assert_eq!(
        targets(default),
        [("outbound|9000||echo.example".to_string(), 100)],
        "what no subnet matches goes to the service itself"
    );
}

#[test]
fn tls_routes_select_by_sni_with_the_tls_inspector() {
    let yaml = [
        entry("secure", 443, "TLS", "240.0.0.9"),
        entry("backend", 443, "TLS", "240.0.0.10"),
        vs(
            "{hosts: [secure.example, '*.secure.example'], tls: [{match: [{sniHosts: [secure.example], port: 443}], route: [{destination: {host: backend.example}}]}, {match: [{sniHosts: [secure.example]}], route: [{destination: {host: secure.example}}]}, {match: [{sniHosts: [a.secure.example], gateways: [some-gateway]}], route: [{destination: {host: secure.example}}]}]}",
        ),
    ]
    .concat();
    let ctx = context_of_yaml(&yaml);
    let l = listener(&ctx, &sleep(&[]), "240.0.0.9_443");
    assert_eq!(names(&l), ["envoy.filters.listener.tls_inspector"]);
    assert_eq!(
        l.filter_chains.len(),
        1,
        "a repeated SNI and a gateway-only match add nothing: {l:#?}"
    );
    let m = l.filter_chains[0].filter_chain_match.as_ref().unwrap();
    assert_eq!(m.server_names, ["secure.example"]);
    assert_eq!(
        targets(&l.filter_chains[0]),
        [("outbound|443||backend.example".to_string(), 100)]
    );
    // Another SNI takes no route's chain: the outbound policy's catch-all.
    assert_eq!(
        l.default_filter_chain.as_ref().unwrap().name,
        "PassthroughFilterChain"
    );
    // A TLS port without routes keeps one plain chain, no inspector.
    let plain = listener(&ctx, &sleep(&[]), "240.0.0.10_443");
    assert!(names(&plain).is_empty());
    assert_eq!(
        targets(&plain.filter_chains[0]),
        [("outbound|443||backend.example".to_string(), 100)]
    );
}

#[test]
fn source_labels_and_namespace_pick_the_proxies_a_route_applies_to() {
    let yaml = [
        entry("echo", 9000, "TCP", "240.0.0.5"),
        entry("v2", 9000, "TCP", "240.0.0.7"),
        entry("v3", 9000, "TCP", "240.0.0.8"),
        vs(
            "{hosts: [echo.example], tcp: [{match: [{sourceLabels: {app: canary}}], route: [{destination: {host: v2.example}}]}, {match: [{sourceNamespace: other}], route: [{destination: {host: v3.example}}]}]}",
        ),
    ]
    .concat();
    let ctx = context_of_yaml(&yaml);
    let canary = listener(&ctx, &sleep(&[("app", "canary")]), "240.0.0.5_9000");
    assert_eq!(
        targets(&canary.filter_chains[0]),
        [("outbound|9000||v2.example".to_string(), 100)]
    );
    // Same context and scope, other labels: its own listeners.
    let plain = listener(&ctx, &sleep(&[("app", "sleep")]), "240.0.0.5_9000");
    assert_eq!(
        targets(&plain.filter_chains[0]),
        [("outbound|9000||echo.example".to_string(), 100)],
        "neither route applies to sleep in demo"
    );
}

/// TLS entries without addresses, for a proxy that does not capture DNS
/// (no allocated addresses): Istio's `0.0.0.0_443`, one chain per host by
/// SNI, a `tls` route taking its own SNI's chain.
#[test]
fn tls_services_without_addresses_share_the_wildcard_listener_by_sni() {
    let entry = |name: &str| {
        format!(
            "---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: demo}}\nspec:\n  hosts: [{name}.example]\n  ports: [{{number: 443, name: tls, protocol: TLS}}]\n  location: MESH_EXTERNAL\n  resolution: DNS\n"
        )
    };
    let yaml = [
        entry("a"),
        entry("b"),
        entry("egress"),
        vs(
            "{hosts: [a.example], tls: [{match: [{sniHosts: [a.example]}], route: [{destination: {host: egress.example, port: {number: 443}}}]}]}",
        ),
    ]
    .concat();
    let ctx = context_of_yaml(&yaml);
    let l = listener(&ctx, &sleep(&[]), "0.0.0.0_443");
    assert_eq!(names(&l), ["envoy.filters.listener.tls_inspector"]);
    let by_sni: Vec<SniChain> = l
        .filter_chains
        .iter()
        .map(|c| {
            (
                c.filter_chain_match.as_ref().unwrap().server_names.clone(),
                targets(c),
            )
        })
        .collect();
    let one = |sni: &str, cluster: &str| {
        (
            vec![sni.to_string()],
            vec![(format!("outbound|443||{cluster}"), 100)],
        )
    };
    assert_eq!(
        by_sni,
        [
            one("a.example", "egress.example"),
            one("b.example", "b.example"),
            one("egress.example", "egress.example"),
        ]
    );
    assert_eq!(
        l.default_filter_chain.as_ref().unwrap().name,
        "PassthroughFilterChain"
    );
}

/// Istio's egress gateway task for TLS (`egress-gateway` with SNI): one
/// VirtualService bound to the egress Gateway and to `mesh`; sidecars take
/// the `mesh` match, sending the still encrypted connection to the egress
/// gateway's Service, and leave the gateway's match to the gateway.
#[test]
fn the_egress_tls_task_sends_sidecar_connections_to_the_egress_gateway_by_sni() {
    let yaml = [
        "---\napiVersion: v1\nkind: Service\nmetadata: {name: istio-egressgateway, namespace: istio-system}\nspec:\n  clusterIP: 198.19.0.50\n  selector: {istio: egressgateway}\n  ports: [{name: tls, port: 443, targetPort: 8443}]\n".to_string(),
        "---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: cnn, namespace: demo}\nspec:\n  hosts: [edition.cnn.com]\n  ports: [{number: 443, name: tls, protocol: TLS}]\n  resolution: DNS\n".to_string(),
        vs(
            "{hosts: [edition.cnn.com], gateways: [istio-system/istio-egressgateway, mesh], tls: [{match: [{gateways: [mesh], port: 443, sniHosts: [edition.cnn.com]}], route: [{destination: {host: istio-egressgateway.istio-system.svc.cluster.local, port: {number: 443}}}]}, {match: [{gateways: [istio-system/istio-egressgateway], port: 443, sniHosts: [edition.cnn.com]}], route: [{destination: {host: edition.cnn.com, port: {number: 443}}}]}]}",
        ),
    ]
    .concat();
    let ctx = context_of_yaml(&yaml);
    let l = listener(&ctx, &sleep(&[]), "0.0.0.0_443");
    let chain = l
        .filter_chains
        .iter()
        .find(|c| c.filter_chain_match.as_ref().unwrap().server_names == ["edition.cnn.com"])
        .unwrap();
    assert_eq!(
        targets(chain),
        [(
            "outbound|443||istio-egressgateway.istio-system.svc.cluster.local".to_string(),
            100
        )]
    );
}
