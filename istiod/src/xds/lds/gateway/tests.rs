#![allow(clippy::unwrap_used)]

use prost::Message;
use proto::pb::envoy::config::listener::v3::{Filter, Listener, filter};
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;

use crate::pushctx::Proxy;
use crate::pushctx::context::IstioContext;

const CONFIG: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: a, namespace: demo}
spec:
  hosts: [a.example.com]
  ports: [{number: 443, name: tls, protocol: TLS}, {number: 9000, name: tcp, protocol: TCP}, {number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  location: MESH_EXTERNAL
  endpoints: [{address: 198.18.0.60}]
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
metadata: {name: all, namespace: demo}
spec:
  hosts: ["a.example.com"]
  gateways: [istio-system/edge]
  http: [{route: [{destination: {host: a.example.com, port: {number: 80}}}]}]
  tcp: [{match: [{port: 31400}], route: [{destination: {host: a.example.com, port: {number: 9000}}}]}]
  tls: [{match: [{sniHosts: [a.example.com]}], route: [{destination: {host: a.example.com, port: {number: 443}}}]}]
"#;

const DENY_BY_SELECTOR: &str = r#"
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny, namespace: istio-system}
spec:
  selector: {matchLabels: {istio: ingressgateway}}
  action: DENY
  rules: [{from: [{source: {ipBlocks: [203.0.113.0/24]}}]}]
"#;

fn router(labels: &[(&str, &str)]) -> Proxy {
    Proxy {
        proxy_type: common::ProxyType::Router,
        ip: "198.18.0.20".into(),
        ips: vec!["198.18.0.20".into()],
        namespace: "istio-system".into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

fn ingress() -> Proxy {
    router(&[("istio", "ingressgateway")])
}

fn listeners(ctx: &IstioContext, proxy: &Proxy) -> Vec<Listener> {
    crate::xds::lds::build(ctx, proxy)
        .iter()
        .map(|r| Listener::decode(r.resource.value.as_slice()).unwrap())
        .collect()
}

fn listener(ctx: &IstioContext, proxy: &Proxy, name: &str) -> Listener {
    listeners(ctx, proxy)
        .into_iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no listener {name}"))
}

fn hcm(f: &Filter) -> HttpConnectionManager {
    assert_eq!(f.name, "envoy.filters.network.http_connection_manager");
    let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        panic!("{f:?}");
    };
    HttpConnectionManager::decode(any.value.as_slice()).unwrap()
}

fn names(filters: &[Filter]) -> Vec<&str> {
    filters.iter().map(|f| f.name.as_str()).collect()
}

fn http_filter_names(ctx: &IstioContext, proxy: &Proxy) -> Vec<String> {
    let l = listener(ctx, proxy, "0.0.0.0_8080");
    hcm(&l.filter_chains[0].filters[0])
        .http_filters
        .iter()
        .map(|f| f.name.clone())
        .collect()
}

#[test]
fn a_policy_selecting_the_gateway_is_on_every_chain() {
    let ctx = crate::pushctx::context::context_of_yaml(&format!("{CONFIG}{DENY_BY_SELECTOR}"));
    let gw = ingress();
    assert_eq!(
        http_filter_names(&ctx, &gw),
        [
            "envoy.filters.http.rbac",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "envoy.filters.http.router"
        ]
    );
    let tcp = listener(&ctx, &gw, "0.0.0.0_31400");
    assert_eq!(
        names(&tcp.filter_chains[0].filters),
        [
            "envoy.filters.network.rbac",
            "envoy.filters.network.tcp_proxy"
        ]
    );
    let tls = listener(&ctx, &gw, "0.0.0.0_8443");
    assert!(!tls.filter_chains.is_empty());
    for chain in &tls.filter_chains {
        assert_eq!(
            names(&chain.filters),
            [
                "envoy.filters.network.rbac",
                "envoy.filters.network.tcp_proxy"
            ]
        );
    }
    // Another gateway's Pods are not selected.
    let egress = router(&[("istio", "egressgateway")]);
    let plain = crate::pushctx::context::context_of_yaml(
        &CONFIG.replace("istio: ingressgateway", "istio: egressgateway"),
    );
    let with_policy =
        crate::pushctx::context::context_of_yaml(&format!("{CONFIG}{DENY_BY_SELECTOR}").replacen(
            "istio: ingressgateway",
            "istio: egressgateway",
            1,
        ));
    assert_eq!(
        http_filter_names(&plain, &egress),
        http_filter_names(&with_policy, &egress)
    );
}

#[test]
fn request_authentication_precedes_authorization_on_gateways() {
    let ra = r#"
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: jwt, namespace: istio-system}
spec:
  selector: {matchLabels: {istio: ingressgateway}}
  jwtRules: [{issuer: "https://edge.example", jwks: '{"keys":[]}'}]
"#;
    let ctx = crate::pushctx::context::context_of_yaml(&format!("{CONFIG}{DENY_BY_SELECTOR}{ra}"));
    assert_eq!(
        http_filter_names(&ctx, &ingress())[..2],
        ["envoy.filters.http.jwt_authn", "envoy.filters.http.rbac"]
    );
}

#[test]
fn target_refs_attach_to_the_named_gateway_api_gateway_only() {
    let policy = r#"
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny, namespace: istio-system}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: edge-api}]
  action: DENY
  rules: [{}]
"#;
    let ctx = crate::pushctx::context::context_of_yaml(&format!(
        "{}{policy}",
        CONFIG.replace(
            "selector: {istio: ingressgateway}",
            "selector: {gateway.networking.k8s.io/gateway-name: edge-api}"
        )
    ));
    let named = router(&[("gateway.networking.k8s.io/gateway-name", "edge-api")]);
    assert_eq!(
        http_filter_names(&ctx, &named)[0],
        "envoy.filters.http.rbac"
    );
    // The classic gateway Pod with the same Gateway servers is not an
    // instance of `edge-api`.
    let ctx = crate::pushctx::context::context_of_yaml(&format!(
        "{}{policy}",
        CONFIG.replace("selector: {istio: ingressgateway}", "selector: {app: edge}")
    ));
    let other = router(&[("app", "edge")]);
    assert_eq!(
        http_filter_names(&ctx, &other)[0],
        "envoy.filters.http.fault"
    );
}

#[test]
fn gateway_topology_comes_from_the_proxy_else_the_mesh() {
    use common::gateway_topology::{ForwardClientCertDetails, GatewayTopology};
    let mut ctx = crate::pushctx::context::context_of_yaml(CONFIG);
    let mut gw = ingress();
    // Istio's defaults: no trusted hop, SANITIZE_SET with the current
    // certificate's details.
    let l = listener(&ctx, &gw, "0.0.0.0_8080");
    let m = hcm(&l.filter_chains[0].filters[0]);
    assert_eq!(m.xff_num_trusted_hops, 0);
    assert_eq!(m.forward_client_cert_details, 3);
    assert!(m.set_current_client_cert_details.is_some());
    assert!(l.listener_filters.is_empty());

    ctx.mesh.default_gateway_topology = GatewayTopology {
        num_trusted_proxies: 2,
        ..Default::default()
    };
    let m = hcm(&listener(&ctx, &gw, "0.0.0.0_8080").filter_chains[0].filters[0]);
    assert_eq!(m.xff_num_trusted_hops, 2, "the mesh's defaultConfig");

    gw.gateway_topology = Some(GatewayTopology {
        num_trusted_proxies: 1,
        forward_client_cert_details: ForwardClientCertDetails::Sanitize,
        proxy_protocol: Some(Default::default()),
    });
    let l = listener(&ctx, &gw, "0.0.0.0_8080");
    let m = hcm(&l.filter_chains[0].filters[0]);
    assert_eq!(m.xff_num_trusted_hops, 1, "the proxy's ProxyConfig wins");
    assert_eq!(m.forward_client_cert_details, 0);
    assert!(m.set_current_client_cert_details.is_none());
    assert_eq!(
        l.listener_filters
            .iter()
            .map(|f| f.name.as_str())
            .collect::<Vec<_>>(),
        ["envoy.filters.listener.proxy_protocol"]
    );
    let tls = listener(&ctx, &gw, "0.0.0.0_8443");
    assert_eq!(
        tls.listener_filters
            .iter()
            .map(|f| f.name.as_str())
            .collect::<Vec<_>>(),
        [
            "envoy.filters.listener.proxy_protocol",
            "envoy.filters.listener.tls_inspector"
        ]
    );
}

#[test]
fn a_service_reference_attaches_to_the_routers_behind_the_service() {
    // The gateway's Service, its endpoint the router's address with no Pod
    // object behind it (the router keeps its own labels then).
    let service = r#"
---
apiVersion: v1
kind: Service
metadata: {name: edge, namespace: istio-system}
spec:
  clusterIP: 198.19.0.20
  selector: {istio: ingressgateway}
  ports: [{name: http, port: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: edge-1, namespace: istio-system, labels: {kubernetes.io/service-name: edge}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [198.18.0.20]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny, namespace: istio-system}
spec:
  targetRefs: [{kind: Service, group: "", name: edge}]
  action: DENY
  rules: [{}]
"#;
    let ctx = crate::pushctx::context::context_of_yaml(&format!("{CONFIG}{service}"));
    assert_eq!(
        http_filter_names(&ctx, &ingress())[0],
        "envoy.filters.http.rbac"
    );
    // A router at another address is not behind the Service.
    let mut elsewhere = ingress();
    elsewhere.ips = vec!["198.18.0.29".into()];
    elsewhere.ip = "198.18.0.29".into();
    assert_eq!(
        http_filter_names(&ctx, &elsewhere)[0],
        "envoy.filters.http.fault"
    );
}
