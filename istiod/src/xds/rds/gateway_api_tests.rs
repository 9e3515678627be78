//! What a router gets over RDS from Gateway API objects (translated in
//! `model::gateway_api`): segment prefixes, weights, and Istio's 500 for a
//! missing backend.

#![allow(clippy::unwrap_used)]

use crate::model::gateway_api::GATEWAY_NAME_LABEL;
use crate::model::gateway_api::convert::tests::{BASE, SPLIT};

/// What a router labelled for the Gateway receives over RDS.
#[test]
fn the_router_gets_segment_prefixes_weights_and_500_for_missing_backends() {
    use prost::Message;
    use proto::pb::envoy::config::route::v3::{
        RouteConfiguration, route, route_action, route_match,
    };
    let ctx = crate::pushctx::context::context_of_yaml(&format!("{BASE}---\n{SPLIT}"));
    let router = crate::pushctx::Proxy {
        proxy_type: common::ProxyType::Router,
        ip: "198.18.0.20".into(),
        ips: vec!["198.18.0.20".into()],
        namespace: "demo".into(),
        labels: [(GATEWAY_NAME_LABEL.to_string(), "ingress".to_string())].into(),
        ..Default::default()
    };
    let names = crate::xds::lds::route_names(&ctx, &router);
    assert_eq!(
        names.iter().map(String::as_str).collect::<Vec<_>>(),
        ["http.8080", "http.8081"]
    );
    let r = crate::xds::rds::build(&ctx, &router, &names).remove(0);
    let rc = RouteConfiguration::decode(r.resource.value.as_slice()).unwrap();
    assert_eq!(rc.virtual_hosts.len(), 1, "{rc:#?}");
    assert_eq!(rc.virtual_hosts[0].domains, ["*"]);
    let routes = &rc.virtual_hosts[0].routes;
    let action = |i: usize| match &routes[i].action {
        Some(route::Action::Route(a)) => a.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        action(0).cluster_specifier,
        Some(route_action::ClusterSpecifier::Cluster(
            "outbound|8000||missing.demo.svc.cluster.local".into()
        ))
    );
    assert_eq!(
        action(0).cluster_not_found_response_code,
        route_action::ClusterNotFoundResponseCode::InternalServerError as i32
    );
    assert_eq!(
        routes[1].r#match.as_ref().unwrap().path_specifier,
        Some(route_match::PathSpecifier::PathSeparatedPrefix(
            "/v2".into()
        ))
    );
    let Some(route_action::ClusterSpecifier::WeightedClusters(w)) = action(2).cluster_specifier
    else {
        panic!("{:?}", action(2))
    };
    let weights: Vec<(String, u32)> = w
        .clusters
        .iter()
        .map(|c| (c.name.clone(), c.weight.as_ref().unwrap().value))
        .collect();
    assert_eq!(
        weights,
        [
            (
                "outbound|8000||httpbin-v1.demo.svc.cluster.local".into(),
                90
            ),
            (
                "outbound|8000||httpbin-v2.demo.svc.cluster.local".into(),
                10
            ),
        ]
    );
    // A sidecar sees none of it.
    assert!(
        ctx.virtual_services_for("demo", "httpbin-v1.demo.svc.cluster.local")
            .is_empty()
    );
}

/// A mesh route (an HTTPRoute whose parent is a Service) reaches sidecars:
/// the route configuration for the Service's port splits by weight.
#[test]
fn a_sidecar_gets_the_weighted_split_of_a_mesh_route() {
    use prost::Message;
    use proto::pb::envoy::config::route::v3::{RouteConfiguration, route, route_action};
    let mesh = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: split-mesh, namespace: demo}
spec:
  parentRefs: [{group: "", kind: Service, name: httpbin-v1}]
  rules:
  - backendRefs:
    - {name: httpbin-v1, port: 8000, weight: 90}
    - {name: httpbin-v2, port: 8000, weight: 10}
"#;
    let ctx = crate::pushctx::context::context_of_yaml(&format!("{BASE}---\n{mesh}"));
    let sidecar = crate::pushctx::Proxy {
        proxy_type: common::ProxyType::Sidecar,
        ip: "198.18.0.30".into(),
        ips: vec!["198.18.0.30".into()],
        namespace: "demo".into(),
        ..Default::default()
    };
    let r = crate::xds::rds::build(&ctx, &sidecar, &["8000".to_string()].into()).remove(0);
    let rc = RouteConfiguration::decode(r.resource.value.as_slice()).unwrap();
    let vh = rc
        .virtual_hosts
        .iter()
        .find(|v| {
            v.domains
                .iter()
                .any(|d| d == "httpbin-v1.demo.svc.cluster.local")
        })
        .unwrap_or_else(|| panic!("{rc:#?}"));
    let Some(route::Action::Route(action)) = &vh.routes[0].action else {
        panic!("{vh:#?}")
    };
    let Some(route_action::ClusterSpecifier::WeightedClusters(w)) = &action.cluster_specifier
    else {
        panic!("{action:?}")
    };
    let weights: Vec<(String, u32)> = w
        .clusters
        .iter()
        .map(|c| (c.name.clone(), c.weight.as_ref().unwrap().value))
        .collect();
    assert_eq!(
        weights,
        [
            (
                "outbound|8000||httpbin-v1.demo.svc.cluster.local".into(),
                90
            ),
            (
                "outbound|8000||httpbin-v2.demo.svc.cluster.local".into(),
                10
            ),
        ]
    );
}
