#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use prost::Message;
use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::listener::v3::{Listener, filter};
use proto::pb::envoy::config::route::v3::RouteConfiguration;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager,
};

use super::metrics::{self, PatchType};
use crate::pushctx::context::{IstioContext, context_of_yaml};
use crate::pushctx::{Proxy, PushContext};
use crate::xds::{CLUSTER_TYPE, LISTENER_TYPE, ROUTE_TYPE};

const HTTPBIN: &str = "httpbin.demo.svc.cluster.local";
const HCM: &str = "envoy.filters.network.http_connection_manager";

/// The sample mesh (sleep, httpbin v1/v2 in demo) with `extra` objects.
fn ctx(extra: &str) -> IstioContext {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/mesh");
    let mut yaml = String::new();
    for f in ["namespace.yaml", "sleep.yaml", "httpbin.yaml", "istio.yaml"] {
        yaml.push_str(&std::fs::read_to_string(dir.join(f)).unwrap());
        yaml.push_str("\n---\n");
    }
    yaml.push_str(extra);
    context_of_yaml(&yaml)
}

fn sidecar(ip: &str, namespace: &str) -> Proxy {
    Proxy {
        proxy_type: common::ProxyType::Sidecar,
        ip: ip.into(),
        ips: vec![ip.into()],
        namespace: namespace.into(),
        interception_mode: common::InterceptionMode::Redirect,
        istio_version: "1.28.0".into(),
        ..Default::default()
    }
}

fn sleep() -> Proxy {
    sidecar("198.18.0.2", "demo")
}

fn httpbin() -> Proxy {
    sidecar("198.18.0.3", "demo")
}

fn listeners(ctx: &IstioContext, proxy: &Proxy) -> Vec<Listener> {
    ctx.generate(proxy, LISTENER_TYPE, &BTreeSet::new())
        .unwrap()
        .iter()
        .map(|r| Listener::decode(r.resource.value.as_slice()).unwrap())
        .collect()
}

fn listener(ctx: &IstioContext, proxy: &Proxy, name: &str) -> Option<Listener> {
    listeners(ctx, proxy).into_iter().find(|l| l.name == name)
}

fn routes(ctx: &IstioContext, proxy: &Proxy, name: &str) -> RouteConfiguration {
    let names = BTreeSet::from([name.to_string()]);
    let r = ctx.generate(proxy, ROUTE_TYPE, &names).unwrap().remove(0);
    RouteConfiguration::decode(r.resource.value.as_slice()).unwrap()
}

fn clusters(ctx: &IstioContext, proxy: &Proxy) -> Vec<Cluster> {
    ctx.generate(proxy, CLUSTER_TYPE, &BTreeSet::new())
        .unwrap()
        .iter()
        .map(|r| Cluster::decode(r.resource.value.as_slice()).unwrap())
        .collect()
}

/// The connection managers of a listener's chains (with the chain's
/// destination port).
fn hcms(l: &Listener) -> Vec<(u32, HttpConnectionManager)> {
    l.filter_chains
        .iter()
        .flat_map(|fc| {
            let port = fc
                .filter_chain_match
                .as_ref()
                .and_then(|m| m.destination_port)
                .map(|p| p.value)
                .unwrap_or(0);
            fc.filters.iter().filter(|f| f.name == HCM).map(move |f| {
                let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
                    panic!("no typed config")
                };
                (
                    port,
                    HttpConnectionManager::decode(any.value.as_slice()).unwrap(),
                )
            })
        })
        .collect()
}

fn http_filter_names(h: &HttpConnectionManager) -> Vec<&str> {
    h.http_filters.iter().map(|f| f.name.as_str()).collect()
}

fn vhost_header(rc: &RouteConfiguration, vhost: &str) -> Vec<String> {
    rc.virtual_hosts
        .iter()
        .find(|v| v.name == vhost)
        .unwrap()
        .response_headers_to_add
        .iter()
        .filter_map(|h| h.header.as_ref().map(|h| h.key.clone()))
        .collect()
}

const VHOST_MERGE: &str = r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: vhost-header, namespace: demo}
spec:
  workloadSelector: {labels: {app: sleep}}
  configPatches:
  - applyTo: VIRTUAL_HOST
    match:
      context: SIDECAR_OUTBOUND
      routeConfiguration: {portNumber: 8000, vhost: {name: "httpbin.demo.svc.cluster.local:8000"}}
    patch:
      operation: MERGE
      value:
        response_headers_to_add: [{header: {key: x-envoy-filter, value: sleep}}]
"#;

#[test]
fn vhost_merge_reaches_the_selected_workload_only() {
    let ctx = ctx(VHOST_MERGE);
    let vhost = format!("{HTTPBIN}:8000");
    let rc = routes(&ctx, &sleep(), "8000");
    assert_eq!(vhost_header(&rc, &vhost), vec!["x-envoy-filter"]);
    // Other virtual hosts of the route configuration are untouched.
    assert!(
        rc.virtual_hosts
            .iter()
            .filter(|v| v.name != vhost)
            .all(|v| v.response_headers_to_add.is_empty())
    );
    // httpbin (app=httpbin) is not selected.
    let rc = routes(&ctx, &httpbin(), "8000");
    assert!(vhost_header(&rc, &vhost).is_empty());
    assert_eq!(
        metrics::value("demo/vhost-header", PatchType::VirtualHost, "applied"),
        1
    );
}

#[test]
fn http_route_merge_remove_and_inserts() {
    let ctx = ctx(r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: routes, namespace: demo}
spec:
  configPatches:
  - applyTo: HTTP_ROUTE
    match:
      context: SIDECAR_OUTBOUND
      routeConfiguration: {vhost: {name: "httpbin.demo.svc.cluster.local:8000", route: {action: ROUTE}}}
    patch: {operation: MERGE, value: {request_headers_to_remove: [x-secret]}}
  - applyTo: HTTP_ROUTE
    match:
      context: SIDECAR_OUTBOUND
      routeConfiguration: {vhost: {name: "httpbin.demo.svc.cluster.local:8000"}}
    patch:
      operation: INSERT_FIRST
      value: {name: first, match: {prefix: /first}, direct_response: {status: 418}}
  - applyTo: HTTP_ROUTE
    match:
      context: SIDECAR_OUTBOUND
      routeConfiguration: {vhost: {name: "httpbin.demo.svc.cluster.local:8000", route: {name: first}}}
    patch:
      operation: INSERT_AFTER
      value: {name: second, match: {prefix: /second}, direct_response: {status: 419}}
  - applyTo: HTTP_ROUTE
    match:
      context: SIDECAR_OUTBOUND
      routeConfiguration: {vhost: {name: "httpbin.demo.svc.cluster.local:8000", route: {name: absent}}}
    patch:
      operation: INSERT_BEFORE
      value: {name: never, match: {prefix: /never}, direct_response: {status: 420}}
  - applyTo: HTTP_ROUTE
    match:
      context: SIDECAR_OUTBOUND
      routeConfiguration: {vhost: {name: "httpbin.demo.svc.cluster.local:8000", route: {name: second}}}
    patch: {operation: REMOVE}
"#);
    let rc = routes(&ctx, &sleep(), "8000");
    let vh = rc
        .virtual_hosts
        .iter()
        .find(|v| v.name == format!("{HTTPBIN}:8000"))
        .unwrap();
    let names: Vec<&str> = vh.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names[0], "first", "{names:?}");
    assert!(
        !names.contains(&"second") && !names.contains(&"never"),
        "{names:?}"
    );
    // The MERGE reached the forwarding routes, not the direct response.
    for r in &vh.routes {
        let forwards = matches!(
            r.action,
            Some(proto::pb::envoy::config::route::v3::route::Action::Route(_))
        );
        assert_eq!(
            r.request_headers_to_remove == ["x-secret"],
            forwards,
            "{r:?}"
        );
    }
}

#[test]
fn http_filter_insert_before_router_on_outbound_port() {
    let ctx = ctx(r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: lua, namespace: istio-system}
spec:
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener:
        portNumber: 8000
        filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: envoy.filters.http.router}}}
    patch:
      operation: INSERT_BEFORE
      value:
        name: envoy.filters.http.lua
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
          default_source_code: {inline_string: "function envoy_on_response(h) h:headers():add('x-lua', '1') end"}
"#);
    // Root namespace: every workload, sleep and httpbin alike.
    for proxy in [sleep(), httpbin()] {
        let l = listener(&ctx, &proxy, "0.0.0.0_8000").unwrap();
        for (_, h) in hcms(&l) {
            let names = http_filter_names(&h);
            let lua = names.iter().position(|n| *n == "envoy.filters.http.lua");
            let router = names.iter().position(|n| *n == "envoy.filters.http.router");
            assert_eq!(lua.map(|i| i + 1), router, "{names:?}");
        }
        // Inbound listeners are another context.
        let inbound = listener(&ctx, &proxy, "virtualInbound").unwrap();
        for (_, h) in hcms(&inbound) {
            assert!(!http_filter_names(&h).contains(&"envoy.filters.http.lua"));
        }
    }
}

#[test]
fn inbound_port_selects_virtual_inbound_chains_and_inline_routes() {
    let ctx = ctx(r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: inbound, namespace: demo}
spec:
  workloadSelector: {labels: {app: httpbin}}
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_INBOUND
      listener: {portNumber: 8080, filterChain: {filter: {name: envoy.filters.network.http_connection_manager}}}
    patch:
      operation: INSERT_FIRST
      value:
        name: envoy.filters.http.header_mutation
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
          mutations: {response_mutations: [{append: {header: {key: x-inbound, value: "1"}}}]}
  - applyTo: ROUTE_CONFIGURATION
    match: {context: SIDECAR_INBOUND, routeConfiguration: {portNumber: 8080}}
    patch: {operation: MERGE, value: {response_headers_to_add: [{header: {key: x-rc, value: "1"}}]}}
"#);
    let l = listener(&ctx, &httpbin(), "virtualInbound").unwrap();
    let all = hcms(&l);
    assert!(all.iter().any(|(p, _)| *p == 8080));
    for (port, h) in all {
        let first = http_filter_names(&h)[0] == "envoy.filters.http.header_mutation";
        assert_eq!(
            first,
            port == 8080,
            "port {port}: {:?}",
            http_filter_names(&h)
        );
        if let Some(http_connection_manager::RouteSpecifier::RouteConfig(rc)) = &h.route_specifier
            && port == 8080
        {
            assert_eq!(
                rc.response_headers_to_add[0].header.as_ref().unwrap().key,
                "x-rc"
            );
        }
    }
    // sleep is not selected.
    let l = listener(&ctx, &sleep(), "virtualInbound").unwrap();
    for (_, h) in hcms(&l) {
        assert_ne!(
            http_filter_names(&h)[0],
            "envoy.filters.http.header_mutation"
        );
    }
}

#[test]
fn network_filter_merge_of_another_type_is_reported_and_the_rest_applies() {
    let ctx = ctx(r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: broken, namespace: demo}
spec:
  configPatches:
  - applyTo: NETWORK_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener: {portNumber: 8000, filterChain: {filter: {name: envoy.filters.network.http_connection_manager}}}
    patch:
      operation: MERGE
      value:
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: wrong
---
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: fine, namespace: demo}
spec:
  configPatches:
  - applyTo: NETWORK_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener: {portNumber: 8000, filterChain: {filter: {name: envoy.filters.network.http_connection_manager}}}
    patch:
      operation: MERGE
      value:
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          server_name: patched
"#);
    let l = listener(&ctx, &sleep(), "0.0.0.0_8000").unwrap();
    let all = hcms(&l);
    assert!(!all.is_empty());
    for (_, h) in all {
        assert_eq!(h.server_name, "patched");
        // The merge kept what was generated.
        assert!(http_filter_names(&h).contains(&"envoy.filters.http.router"));
    }
    assert_eq!(
        metrics::value("demo/broken", PatchType::NetworkFilter, "error"),
        1
    );
    assert_eq!(
        metrics::value("demo/fine", PatchType::NetworkFilter, "applied"),
        1
    );
}

#[test]
fn network_filter_insert_replace_and_remove() {
    let ctx = ctx(r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: nf, namespace: demo}
spec:
  configPatches:
  - applyTo: NETWORK_FILTER
    match:
      listener: {portNumber: 8000, filterChain: {filter: {name: envoy.filters.network.http_connection_manager}}}
    patch:
      operation: INSERT_BEFORE
      value:
        name: envoy.filters.network.connection_limit
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.connection_limit.v3.ConnectionLimit
          stat_prefix: a
          max_connections: 100
  - applyTo: NETWORK_FILTER
    match:
      listener: {portNumber: 8000, filterChain: {filter: {name: envoy.filters.network.connection_limit}}}
    patch:
      operation: REPLACE
      value:
        name: envoy.filters.network.connection_limit
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.connection_limit.v3.ConnectionLimit
          stat_prefix: replaced
          max_connections: 7
  - applyTo: NETWORK_FILTER
    match:
      listener: {portNumber: 8000, filterChain: {filter: {name: envoy.filters.network.http_connection_manager}}}
    patch:
      operation: INSERT_AFTER
      value: {name: after-hcm}
  - applyTo: NETWORK_FILTER
    match:
      listener: {portNumber: 8000, filterChain: {filter: {name: after-hcm}}}
    patch: {operation: REMOVE}
"#);
    let l = listener(&ctx, &sleep(), "0.0.0.0_8000").unwrap();
    for fc in &l.filter_chains {
        let names: Vec<&str> = fc.filters.iter().map(|f| f.name.as_str()).collect();
        if !names.contains(&HCM) {
            continue;
        }
        assert_eq!(names, ["envoy.filters.network.connection_limit", HCM]);
        let Some(filter::ConfigType::TypedConfig(any)) = &fc.filters[0].config_type else {
            panic!()
        };
        let cl = proto::pb::envoy::extensions::filters::network::connection_limit::v3::ConnectionLimit::decode(any.value.as_slice()).unwrap();
        assert_eq!(cl.stat_prefix, "replaced");
    }
}

#[test]
fn listener_and_filter_chain_patches() {
    let ctx = ctx(r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: listeners, namespace: demo}
spec:
  workloadSelector: {labels: {app: sleep}}
  configPatches:
  - applyTo: LISTENER
    match: {context: SIDECAR_OUTBOUND, listener: {portNumber: 8000}}
    patch: {operation: MERGE, value: {per_connection_buffer_limit_bytes: 4096}}
  - applyTo: LISTENER
    match: {context: SIDECAR_OUTBOUND}
    patch:
      operation: ADD
      value:
        name: extra
        address: {socket_address: {address: 127.0.0.1, port_value: 9999}}
  - applyTo: FILTER_CHAIN
    match: {listener: {name: extra}}
    patch:
      operation: ADD
      value:
        name: added-chain
        filters:
        - name: envoy.filters.network.tcp_proxy
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
            stat_prefix: x
            cluster: BlackHoleCluster
  - applyTo: FILTER_CHAIN
    match: {listener: {name: virtualOutbound, filterChain: {name: virtualOutbound-blackhole}}}
    patch: {operation: REMOVE}
  - applyTo: LISTENER
    match: {listener: {name: virtualInbound}}
    patch: {operation: REMOVE}
"#);
    let all = listeners(&ctx, &sleep());
    let find = |n: &str| all.iter().find(|l| l.name == n);
    assert_eq!(
        find("0.0.0.0_8000")
            .unwrap()
            .per_connection_buffer_limit_bytes
            .map(|v| v.value),
        Some(4096)
    );
    // The ADD happens once, though the patch is for outbound and the
    // proxy has inbound listeners too.
    assert_eq!(all.iter().filter(|l| l.name == "extra").count(), 1);
    // Listeners added earlier are not patched by later patches (Istio
    // patches generated listeners, then adds).
    assert!(find("extra").unwrap().filter_chains.is_empty());
    assert!(find("virtualInbound").is_none());
    let vo = find("virtualOutbound").unwrap();
    assert!(
        vo.filter_chains
            .iter()
            .all(|fc| fc.name != "virtualOutbound-blackhole")
    );
    assert!(!vo.filter_chains.is_empty());
}

#[test]
fn cluster_remove_merge_and_add() {
    let ctx = ctx(r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: clusters, namespace: demo}
spec:
  workloadSelector: {labels: {app: sleep}}
  configPatches:
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND, cluster: {service: httpbin.demo.svc.cluster.local, subset: v2}}
    patch: {operation: REMOVE}
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND, cluster: {portNumber: 8000, service: "*.demo.svc.cluster.local"}}
    patch: {operation: MERGE, value: {connect_timeout: 7s}}
  - applyTo: CLUSTER
    patch:
      operation: ADD
      value: {name: added, type: STATIC, connect_timeout: 1s}
  - applyTo: CLUSTER
    match: {context: SIDECAR_INBOUND, cluster: {service: sleep.demo.svc.cluster.local}}
    patch: {operation: MERGE, value: {connect_timeout: 3s}}
"#);
    let all = clusters(&ctx, &sleep());
    let find = |n: &str| all.iter().find(|c| c.name == n);
    assert!(find(&format!("outbound|8000|v2|{HTTPBIN}")).is_none());
    let v1 = find(&format!("outbound|8000|v1|{HTTPBIN}")).unwrap();
    assert_eq!(v1.connect_timeout.unwrap().seconds, 7);
    // The merge kept the generated transport socket (ISTIO_MUTUAL).
    assert!(v1.transport_socket.is_some());
    assert_eq!(all.iter().filter(|c| c.name == "added").count(), 1);
    // Inbound clusters match their service by the workload's services.
    let inbound = find("inbound|8080||").unwrap();
    assert_eq!(inbound.connect_timeout.unwrap().seconds, 3);
    // httpbin is not selected: all its clusters stay.
    let theirs = clusters(&ctx, &httpbin());
    assert!(
        theirs
            .iter()
            .any(|c| c.name == format!("outbound|8000|v2|{HTTPBIN}"))
    );
    assert!(theirs.iter().all(|c| c.name != "added"));
}

#[test]
fn order_is_priority_then_creation_then_name() {
    let insert = |name: &str, ns: &str, priority: i32, created: &str| {
        format!(
            r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {{name: {name}, namespace: {ns}, creationTimestamp: "{created}"}}
spec:
  priority: {priority}
  configPatches:
  - applyTo: HTTP_FILTER
    match: {{context: SIDECAR_OUTBOUND, listener: {{portNumber: 8000}}}}
    patch: {{operation: INSERT_FIRST, value: {{name: {name}}}}}
---
"#
        )
    };
    let ctx = ctx(&[
        insert("late", "demo", 0, "2024-01-02T00:00:00Z"),
        insert("early", "demo", 0, "2024-01-01T00:00:00Z"),
        insert("root-high", "istio-system", 10, "2023-01-01T00:00:00Z"),
        insert("low", "demo", -1, "2025-01-01T00:00:00Z"),
        insert("other-ns", "other", -100, "2020-01-01T00:00:00Z"),
    ]
    .concat());
    let l = listener(&ctx, &sleep(), "0.0.0.0_8000").unwrap();
    let (_, h) = hcms(&l).remove(0);
    // INSERT_FIRST: the last applied is first.
    assert_eq!(
        http_filter_names(&h)[..4],
        ["root-high", "late", "early", "low"]
    );
}

#[test]
fn proxy_version_and_metadata_select_proxies() {
    let ctx = ctx(r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: versioned, namespace: demo}
spec:
  configPatches:
  - applyTo: CLUSTER
    match: {proxy: {proxyVersion: '^1\.28.*', metadata: {ROLE: edge}}}
    patch: {operation: ADD, value: {name: versioned, type: STATIC}}
"#);
    let mut proxy = sleep();
    assert!(clusters(&ctx, &proxy).iter().all(|c| c.name != "versioned"));
    proxy.metadata.insert("ROLE".into(), "edge".into());
    assert!(clusters(&ctx, &proxy).iter().any(|c| c.name == "versioned"));
    proxy.istio_version = "1.27.1".into();
    assert!(clusters(&ctx, &proxy).iter().all(|c| c.name != "versioned"));
}

#[test]
fn gateway_routes_match_port_name_and_gateway() {
    use super::route_patch::route_configuration_matches;
    use crate::model::envoy_filter::{PatchContext, RouteConfigurationMatch};
    let p = |m: RouteConfigurationMatch| super::PatchWrapper {
        apply_to: crate::model::envoy_filter::ApplyTo::RouteConfiguration,
        context: PatchContext::Gateway,
        proxy_version: None,
        metadata: Default::default(),
        listener: None,
        route: Some(m),
        cluster: None,
        operation: crate::model::envoy_filter::Operation::Merge,
        value: Ok(Vec::new()),
    };
    let name = "https.443.https-port.gw.istio-system";
    let m = |port: u32, port_name: &str, gateway: &str| RouteConfigurationMatch {
        port_number: port,
        port_name: port_name.into(),
        gateway: gateway.into(),
        ..Default::default()
    };
    assert!(route_configuration_matches(
        PatchContext::Gateway,
        name,
        &p(m(443, "https-port", "istio-system/gw"))
    ));
    assert!(!route_configuration_matches(
        PatchContext::Gateway,
        name,
        &p(m(80, "", ""))
    ));
    assert!(!route_configuration_matches(
        PatchContext::Gateway,
        name,
        &p(m(0, "", "demo/gw"))
    ));
    assert!(route_configuration_matches(
        PatchContext::Gateway,
        "http.8080",
        &p(m(8080, "", ""))
    ));
    assert!(route_configuration_matches(
        PatchContext::SidecarOutbound,
        "httpbin.demo:8000",
        &p(m(8000, "", ""))
    ));
    assert!(route_configuration_matches(
        PatchContext::SidecarInbound,
        "inbound|8080||",
        &p(m(8080, "", ""))
    ));
}

#[test]
fn gateway_target_refs_select_the_gateway_deployment() {
    let ctx = ctx(r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: gw, namespace: demo}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: edge}]
  configPatches:
  - applyTo: CLUSTER
    patch: {operation: ADD, value: {name: for-edge, type: STATIC}}
"#);
    let mut proxy = sleep();
    assert!(clusters(&ctx, &proxy).iter().all(|c| c.name != "for-edge"));
    // A proxy no Service names yet keeps its own labels.
    proxy.ips = vec!["198.18.9.9".into()];
    proxy.labels.insert(
        crate::pushctx::envoyfilter::GATEWAY_NAME_LABEL.into(),
        "edge".into(),
    );
    assert!(clusters(&ctx, &proxy).iter().any(|c| c.name == "for-edge"));
}

#[test]
fn listeners_no_patch_selects_stay_shared() {
    let ctx = ctx(r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: one-port, namespace: demo}
spec:
  configPatches:
  - applyTo: LISTENER
    match: {context: SIDECAR_OUTBOUND, listener: {portNumber: 8000}}
    patch: {operation: MERGE, value: {per_connection_buffer_limit_bytes: 4096}}
"#);
    let none = BTreeSet::new();
    let a = ctx.generate(&sleep(), LISTENER_TYPE, &none).unwrap();
    let b = ctx.generate(&sleep(), LISTENER_TYPE, &none).unwrap();
    let mut shared = 0;
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.name, y.name);
        if x.name == "0.0.0.0_8000" {
            // Patched per proxy: a copy of its own.
            assert!(!std::sync::Arc::ptr_eq(x, y));
        } else if x.name == "virtualOutbound" {
            // The Sidecar scope's encoding, passed on untouched.
            assert!(std::sync::Arc::ptr_eq(x, y));
            shared += 1;
        }
    }
    assert_eq!(shared, 1);
}
