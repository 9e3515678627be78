#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use prost::Message;
use proto::pb::envoy::config::core::v3::{
    HeaderValueOption, data_source, header_value_option::HeaderAppendAction,
};
use proto::pb::envoy::config::route::v3::{
    Route, RouteConfiguration, redirect_action, route, route_action,
};
use proto::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;
use proto::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use proto::pb::envoy::r#type::v3::fractional_percent::DenominatorType;

use super::*;
use crate::xds::rds::ops::CORS_FILTER;

const HTTPBIN: &str = "httpbin.demo.svc.cluster.local";

/// httpbin (port 8000) and a second service `echo` (port 9090), both in demo.
const MESH: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: httpbin, namespace: demo}
spec:
  clusterIP: 198.19.0.10
  selector: {app: httpbin}
  ports: [{name: http, port: 8000, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: demo}
spec:
  clusterIP: 198.19.0.11
  selector: {app: echo}
  ports: [{name: http, port: 9090, targetPort: 8080}]
"#;

fn sleep() -> Proxy {
    Proxy {
        proxy_type: common::ProxyType::Sidecar,
        ip: "198.18.0.2".into(),
        ips: vec!["198.18.0.2".into()],
        namespace: "demo".into(),
        interception_mode: common::InterceptionMode::Redirect,
        ..Default::default()
    }
}

/// The routes of httpbin's virtual host on port 8000 with VirtualService `http`.
fn routes(http: &str) -> Vec<Route> {
    routes_for(http, &sleep())
}

/// [`routes`] as `proxy` sees them.
fn routes_for(http: &str, proxy: &Proxy) -> Vec<Route> {
    let vs = format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: vs, namespace: demo}}\nspec:\n  hosts: [httpbin]\n  http: {http}\n"
    );
    let ctx = crate::pushctx::context::context_of_yaml(&format!("{MESH}\n---\n{vs}"));
    let names = BTreeSet::from(["8000".to_string()]);
    let r = build(&ctx, proxy, &names).remove(0);
    let rc = RouteConfiguration::decode(r.resource.value.as_slice()).unwrap();
    rc.virtual_hosts
        .into_iter()
        .find(|v| v.name == format!("{HTTPBIN}:8000"))
        .unwrap()
        .routes
}

fn one(http: &str) -> Route {
    let mut r = routes(http);
    assert_eq!(r.len(), 1, "{r:#?}");
    r.remove(0)
}

fn action(r: &Route) -> &route_action::ClusterSpecifier {
    match r.action.as_ref().unwrap() {
        route::Action::Route(a) => a.cluster_specifier.as_ref().unwrap(),
        other => panic!("not a route action: {other:?}"),
    }
}

fn route_action(r: &Route) -> &proto::pb::envoy::config::route::v3::RouteAction {
    match r.action.as_ref().unwrap() {
        route::Action::Route(a) => a,
        other => panic!("not a route action: {other:?}"),
    }
}

/// (name, value, append action) of header options.
fn opts(h: &[HeaderValueOption]) -> Vec<(String, String, i32)> {
    h.iter()
        .map(|o| {
            let hv = o.header.as_ref().unwrap();
            (hv.key.clone(), hv.value.clone(), o.append_action)
        })
        .collect()
}

const SET: i32 = HeaderAppendAction::OverwriteIfExistsOrAdd as i32;
const ADD: i32 = HeaderAppendAction::AppendIfExistsOrAdd as i32;

#[test]
fn redirect_becomes_envoys_redirect_action() {
    let r = one("[{redirect: {uri: /new, authority: other.example, scheme: https, port: 8443}}]");
    let Some(route::Action::Redirect(rd)) = &r.action else {
        panic!("{r:?}")
    };
    assert_eq!(rd.host_redirect, "other.example");
    assert_eq!(rd.port_redirect, 8443);
    assert_eq!(
        rd.response_code,
        redirect_action::RedirectResponseCode::MovedPermanently as i32,
        "301 by default"
    );
    assert_eq!(
        rd.path_rewrite_specifier,
        Some(redirect_action::PathRewriteSpecifier::PathRedirect(
            "/new".into()
        ))
    );
    assert_eq!(
        rd.scheme_rewrite_specifier,
        Some(redirect_action::SchemeRewriteSpecifier::SchemeRedirect(
            "https".into()
        ))
    );

    let r = one(
        "[{redirect: {authority: a.example, derivePort: FROM_REQUEST_PORT, redirectCode: 308}}]",
    );
    let Some(route::Action::Redirect(rd)) = &r.action else {
        panic!("{r:?}")
    };
    assert_eq!(rd.port_redirect, 8000, "the port the route serves");
    assert_eq!(
        rd.response_code,
        redirect_action::RedirectResponseCode::PermanentRedirect as i32
    );
    assert_eq!(rd.path_rewrite_specifier, None, "the path is kept");
    for (code, want) in [
        (302, redirect_action::RedirectResponseCode::Found),
        (303, redirect_action::RedirectResponseCode::SeeOther),
        (
            307,
            redirect_action::RedirectResponseCode::TemporaryRedirect,
        ),
    ] {
        let r = one(&format!(
            "[{{redirect: {{uri: /x, redirectCode: {code}}}}}]"
        ));
        let Some(route::Action::Redirect(rd)) = &r.action else {
            panic!("{r:?}")
        };
        assert_eq!(rd.response_code, want as i32, "{code}");
        assert_eq!(rd.port_redirect, 0);
    }
}

#[test]
fn direct_response_sends_status_and_body() {
    let r = one("[{directResponse: {status: 418, body: {string: teapot}}}]");
    let Some(route::Action::DirectResponse(d)) = &r.action else {
        panic!("{r:?}")
    };
    assert_eq!(d.status, 418);
    assert_eq!(
        d.body.as_ref().unwrap().specifier,
        Some(data_source::Specifier::InlineString("teapot".into()))
    );
    let r = one("[{directResponse: {status: 503, body: {bytes: aGk=}}}]");
    let Some(route::Action::DirectResponse(d)) = &r.action else {
        panic!("{r:?}")
    };
    assert_eq!(
        d.body.as_ref().unwrap().specifier,
        Some(data_source::Specifier::InlineBytes(b"hi".to_vec()))
    );
    let r = one("[{directResponse: {status: 204}}]");
    let Some(route::Action::DirectResponse(d)) = &r.action else {
        panic!("{r:?}")
    };
    assert_eq!((d.status, d.body.clone()), (204, None));
}

#[test]
fn mirrors_get_their_cluster_and_share() {
    let r = one(
        "[{route: [{destination: {host: httpbin, subset: v1}}], mirror: {host: httpbin, subset: v2}, mirrorPercentage: {value: 25.5}}]",
    );
    let a = route_action(&r);
    assert_eq!(
        a.cluster_specifier,
        Some(route_action::ClusterSpecifier::Cluster(format!(
            "outbound|8000|v1|{HTTPBIN}"
        )))
    );
    assert_eq!(a.request_mirror_policies.len(), 1);
    let m = &a.request_mirror_policies[0];
    assert_eq!(m.cluster, format!("outbound|8000|v2|{HTTPBIN}"));
    let f = m.runtime_fraction.as_ref().unwrap().default_value.unwrap();
    assert_eq!(
        (f.numerator, f.denominator),
        (255_000, DenominatorType::Million as i32)
    );
    assert!(!m.trace_sampled.unwrap().value);

    // Several mirrors; no percentage is all requests, 0 drops the mirror,
    // another service's only port is its cluster's.
    let r = one(
        "[{route: [{destination: {host: httpbin}}], mirrors: [{destination: {host: echo}}, {destination: {host: httpbin, subset: v2}, percentage: {value: 0}}]}]",
    );
    let a = route_action(&r);
    assert_eq!(a.request_mirror_policies.len(), 1);
    let m = &a.request_mirror_policies[0];
    assert_eq!(m.cluster, "outbound|9090||echo.demo.svc.cluster.local");
    let f = m.runtime_fraction.as_ref().unwrap().default_value.unwrap();
    assert_eq!(
        (f.numerator, f.denominator),
        (100, DenominatorType::Hundred as i32)
    );
}

#[test]
fn cors_policy_is_the_cors_filters_route_config() {
    let r = one(
        "[{route: [{destination: {host: httpbin}}], corsPolicy: {allowOrigins: [{exact: 'https://a.example'}, {regex: 'https://.*\\.b\\.example'}], allowMethods: [GET, POST], allowHeaders: [x-a, x-b], exposeHeaders: [x-c], maxAge: 24h, allowCredentials: true}}]",
    );
    let any = r.typed_per_filter_config.get(CORS_FILTER).unwrap();
    assert_eq!(
        any.type_url,
        "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy"
    );
    let c = CorsPolicy::decode(any.value.as_slice()).unwrap();
    let origins: Vec<_> = c
        .allow_origin_string_match
        .iter()
        .map(|m| m.match_pattern.clone().unwrap())
        .collect();
    assert_eq!(origins[0], MatchPattern::Exact("https://a.example".into()));
    assert!(
        matches!(&origins[1], MatchPattern::SafeRegex(r) if r.regex == "https://.*\\.b\\.example")
    );
    assert_eq!(c.allow_methods, "GET,POST");
    assert_eq!(c.allow_headers, "x-a,x-b");
    assert_eq!(c.expose_headers, "x-c");
    assert_eq!(c.max_age, "86400");
    assert!(c.allow_credentials.unwrap().value);
    let enabled = c.filter_enabled.unwrap().default_value.unwrap();
    assert_eq!((enabled.numerator, enabled.denominator), (100, 0));
    assert!(c.forward_not_matching_preflights.unwrap().value);

    let r = one(
        "[{route: [{destination: {host: httpbin}}], corsPolicy: {allowOrigins: [{prefix: 'https://'}], unmatchedPreflights: IGNORE}}]",
    );
    let c = CorsPolicy::decode(r.typed_per_filter_config[CORS_FILTER].value.as_slice()).unwrap();
    assert!(!c.forward_not_matching_preflights.unwrap().value);
    assert_eq!(c.max_age, "");
    assert_eq!(c.allow_credentials, None);
}

#[test]
fn route_headers_set_add_and_remove() {
    let r = one(
        "[{route: [{destination: {host: httpbin}}], headers: {request: {set: {x-b: '1', x-a: '2'}, add: {x-c: '3'}, remove: [x-drop]}, response: {add: {x-resp: 'yes'}, remove: [server]}}}]",
    );
    assert_eq!(
        opts(&r.request_headers_to_add),
        [
            ("x-a".into(), "2".into(), SET),
            ("x-b".into(), "1".into(), SET),
            ("x-c".into(), "3".into(), ADD)
        ]
    );
    assert_eq!(r.request_headers_to_remove, ["x-drop"]);
    assert_eq!(
        opts(&r.response_headers_to_add),
        [("x-resp".into(), "yes".into(), ADD)]
    );
    assert_eq!(r.response_headers_to_remove, ["server"]);
}

#[test]
fn destination_headers_go_on_the_weighted_cluster_or_join_the_route() {
    let r = one(
        "[{route: [{destination: {host: httpbin, subset: v1}, weight: 70, headers: {request: {set: {x-dest: v1}}}}, {destination: {host: httpbin, subset: v2}, weight: 30, headers: {response: {remove: [x-gone]}}}], headers: {request: {set: {x-route: r}}}}]",
    );
    assert_eq!(
        opts(&r.request_headers_to_add),
        [("x-route".into(), "r".into(), SET)]
    );
    let route_action::ClusterSpecifier::WeightedClusters(w) = action(&r) else {
        panic!("{r:?}")
    };
    assert_eq!(w.clusters[0].name, format!("outbound|8000|v1|{HTTPBIN}"));
    assert_eq!(
        opts(&w.clusters[0].request_headers_to_add),
        [("x-dest".into(), "v1".into(), SET)]
    );
    assert_eq!(w.clusters[1].response_headers_to_remove, ["x-gone"]);

    // One destination: its operations follow the route's, so its set wins.
    let r = one(
        "[{route: [{destination: {host: httpbin}, headers: {request: {set: {x-a: dest}, remove: [x-r]}}}], headers: {request: {set: {x-a: route}}}}]",
    );
    assert_eq!(
        opts(&r.request_headers_to_add),
        [
            ("x-a".into(), "route".into(), SET),
            ("x-a".into(), "dest".into(), SET)
        ]
    );
    assert_eq!(r.request_headers_to_remove, ["x-r"]);
    assert_eq!(
        action(&r),
        &route_action::ClusterSpecifier::Cluster(format!("outbound|8000||{HTTPBIN}"))
    );
    // A weight-0 destination is dropped; the one left is a plain cluster.
    let r = one(
        "[{route: [{destination: {host: httpbin, subset: v1}, weight: 100}, {destination: {host: httpbin, subset: v2}, weight: 0}]}]",
    );
    assert_eq!(
        action(&r),
        &route_action::ClusterSpecifier::Cluster(format!("outbound|8000|v1|{HTTPBIN}"))
    );
}

#[test]
fn headers_apply_to_redirects_and_direct_responses_too() {
    let r = one("[{directResponse: {status: 200}, headers: {response: {set: {x-direct: 'yes'}}}}]");
    assert_eq!(
        opts(&r.response_headers_to_add),
        [("x-direct".into(), "yes".into(), SET)]
    );
}

#[test]
fn match_names_join_the_route_name() {
    let r = routes(
        "[{name: r, match: [{name: m, uri: {prefix: /a}}, {uri: {prefix: /b}}], route: [{destination: {host: httpbin}}]}]",
    );
    let names: Vec<&str> = r.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["r.m", "r"]);
}

#[test]
fn match_conditions_scheme_query_presence_and_stat_prefix() {
    use proto::pb::envoy::config::route::v3::{header_matcher, query_parameter_matcher};
    let r = one(
        "[{match: [{scheme: {exact: https}, queryParams: {v: {prefix: '1'}, flag: {}}, headers: {x-present: {}}, withoutHeaders: {x-absent: {}}, statPrefix: my-route}], route: [{destination: {host: httpbin}}]}]",
    );
    let m = r.r#match.as_ref().unwrap();
    let headers: Vec<(String, bool, header_matcher::HeaderMatchSpecifier)> = m
        .headers
        .iter()
        .map(|h| {
            (
                h.name.clone(),
                h.invert_match,
                h.header_match_specifier.clone().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        headers[..2],
        [
            (
                "x-present".into(),
                false,
                header_matcher::HeaderMatchSpecifier::PresentMatch(true)
            ),
            (
                "x-absent".into(),
                true,
                header_matcher::HeaderMatchSpecifier::PresentMatch(true)
            ),
        ]
    );
    assert_eq!(headers[2].0, ":scheme");
    let q: Vec<_> = m
        .query_parameters
        .iter()
        .map(|q| {
            (
                q.name.as_str(),
                q.query_parameter_match_specifier.clone().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        q[0],
        (
            "flag",
            query_parameter_matcher::QueryParameterMatchSpecifier::PresentMatch(true)
        )
    );
    assert!(
        matches!(&q[1], ("v", query_parameter_matcher::QueryParameterMatchSpecifier::StringMatch(s))
        if s.match_pattern == Some(MatchPattern::Prefix("1".into())))
    );
    assert_eq!(r.stat_prefix, "my-route");
}

#[test]
fn source_labels_namespace_and_the_mesh_gateway_pick_the_sidecars_a_match_applies_to() {
    let http = "[{name: a, match: [{sourceLabels: {app: sleep}}], route: [{destination: {host: httpbin}}]}, {name: b, match: [{sourceNamespace: other}], route: [{destination: {host: httpbin}}]}, {name: d, match: [{gateways: [mesh]}], route: [{destination: {host: httpbin}}]}]";
    let names =
        |p: &Proxy| -> Vec<String> { routes_for(http, p).into_iter().map(|r| r.name).collect() };
    let mut p = sleep();
    assert_eq!(names(&p), ["d"]);
    p.labels.insert("app".into(), "sleep".into());
    assert_eq!(names(&p), ["a", "d"]);
    p.namespace = "other".into();
    assert_eq!(names(&p), ["a", "b", "d"]);
}

#[test]
fn rewrites_retries_and_faults() {
    use proto::pb::envoy::extensions::filters::http::fault::v3::{HttpFault, fault_abort};
    let r = one(
        "[{route: [{destination: {host: httpbin}}], rewrite: {uriRegexRewrite: {match: '^/a/(.*)', rewrite: '/b/\\1'}}, retries: {attempts: 3, retryOn: '503,connect-failure', retryRemoteLocalities: true, retryIgnorePreviousHosts: false, backoff: 50ms}, fault: {delay: {fixedDelay: 1s, percent: 30}, abort: {grpcStatus: UNAVAILABLE}}}]",
    );
    let a = route_action(&r);
    let rr = a.regex_rewrite.as_ref().unwrap();
    assert_eq!(rr.pattern.as_ref().unwrap().regex, "^/a/(.*)");
    assert_eq!(rr.substitution, "/b/\\1");
    let p = a.retry_policy.as_ref().unwrap();
    assert_eq!(p.num_retries.unwrap().value, 3);
    assert_eq!(p.retry_on, "connect-failure,retriable-status-codes");
    assert_eq!(p.retriable_status_codes, [503]);
    assert_eq!(
        p.retry_priority.as_ref().unwrap().name,
        "envoy.retry_priorities.previous_priorities"
    );
    assert!(p.retry_host_predicate.is_empty());
    assert_eq!(
        p.retry_back_off
            .as_ref()
            .unwrap()
            .base_interval
            .unwrap()
            .nanos,
        50_000_000
    );
    let f = HttpFault::decode(
        r.typed_per_filter_config["envoy.filters.http.fault"]
            .value
            .as_slice(),
    )
    .unwrap();
    assert_eq!(f.delay.unwrap().percentage.unwrap().numerator, 300_000);
    assert_eq!(
        f.abort.unwrap().error_type,
        Some(fault_abort::ErrorType::GrpcStatus(14))
    );
}

/// Delegation (Istio's `mergeVirtualServices`): the root's delegating
/// route becomes the delegate's routes under the root's match, with the
/// root's timeout where the delegate sets none; a delegate not exported to
/// the root's namespace, or missing, leaves its root route out; a delegate
/// is not served by itself.
#[test]
fn delegate_routes_are_served_under_their_root() {
    let vs = |ns: &str, name: &str, spec: &str| {
        format!(
            "---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n"
        )
    };
    let yaml = [
        MESH.to_string(),
        vs(
            "demo",
            "root",
            "{hosts: [httpbin], http: [{name: r, match: [{uri: {prefix: /v}}], delegate: {name: d}, timeout: 3s}, {name: hidden, delegate: {name: private, namespace: other}}, {name: gone, delegate: {name: missing}}, {name: rest, route: [{destination: {host: httpbin}}]}]}",
        ),
        vs(
            "demo",
            "d",
            "{http: [{name: v2, match: [{uri: {prefix: /v2}}], route: [{destination: {host: echo}}]}, {name: out, match: [{uri: {prefix: /x}}], route: [{destination: {host: echo}}]}]}",
        ),
        vs(
            "other",
            "private",
            "{exportTo: ['.'], http: [{route: [{destination: {host: echo}}]}]}",
        ),
    ]
    .concat();
    let ctx = crate::pushctx::context::context_of_yaml(&yaml);
    assert!(
        ctx.virtual_services
            .iter()
            .all(|v| !v.spec.hosts.is_empty()),
        "delegates are not served by themselves"
    );
    let names = BTreeSet::from(["8000".to_string()]);
    let r = build(&ctx, &sleep(), &names).remove(0);
    let rc = RouteConfiguration::decode(r.resource.value.as_slice()).unwrap();
    let routes = &rc
        .virtual_hosts
        .iter()
        .find(|v| v.name == format!("{HTTPBIN}:8000"))
        .unwrap()
        .routes;
    let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["r-v2", "rest"], "{routes:#?}");
    let v2 = &routes[0];
    assert_eq!(
        action(v2),
        &route_action::ClusterSpecifier::Cluster(
            "outbound|9090||echo.demo.svc.cluster.local".into()
        )
    );
    assert_eq!(
        route_action(v2).timeout,
        Some(crate::xds::util::duration(std::time::Duration::from_secs(
            3
        ))),
        "the root's timeout"
    );
    assert_eq!(
        ctx.roots_of("demo", "d")
            .iter()
            .map(|v| v.name.as_str())
            .collect::<Vec<_>>(),
        ["root"]
    );
    assert_eq!(ctx.roots_of("demo", "missing").len(), 1, "named, not found");
}
