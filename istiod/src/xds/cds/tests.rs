#![allow(clippy::unwrap_used)]

use prost::Message;

use super::*;

const HTTPBIN: &str = "outbound|8000||httpbin.demo.svc.cluster.local";

const MESH: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: httpbin, namespace: demo}
spec:
  clusterIP: 198.19.0.10
  selector: {app: httpbin}
  ports: [{name: http, port: 8000, targetPort: 8080}]
"#;

fn cluster(extra: &str, name: &str) -> Cluster {
    let ctx = crate::pushctx::context::context_of_yaml(&format!("{MESH}\n---\n{extra}"));
    let proxy = Proxy {
        proxy_type: common::ProxyType::Sidecar,
        ip: "198.18.0.2".into(),
        ips: vec!["198.18.0.2".into()],
        namespace: "demo".into(),
        ..Default::default()
    };
    let r = build(&ctx, &proxy)
        .into_iter()
        .find(|r| r.name == name)
        .unwrap();
    Cluster::decode(r.resource.value.as_slice()).unwrap()
}

fn peer_auth(ns: &str, mode: &str, selector: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {{name: pa-{ns}, namespace: {ns}}}\nspec:\n  {selector}\n  mtls: {{mode: {mode}}}\n"
    )
}

/// The transport socket match names of a cluster (auto mTLS when present).
fn auto_mtls(c: &Cluster) -> Vec<String> {
    c.transport_socket_matches
        .iter()
        .map(|m| m.name.clone())
        .collect()
}

#[test]
fn auto_mtls_follows_the_services_inferred_peer_authentication_mode() {
    let auto = ["tlsMode-istio", "tlsMode-disabled"];
    // No policy: PERMISSIVE, auto mTLS by the endpoints' labels.
    assert_eq!(auto_mtls(&cluster("", HTTPBIN)), auto);
    assert_eq!(
        auto_mtls(&cluster(&peer_auth("demo", "STRICT", ""), HTTPBIN)),
        auto
    );
    // DISABLE for the namespace: plain text, no TLS at all.
    let c = cluster(&peer_auth("demo", "DISABLE", ""), HTTPBIN);
    assert!(auto_mtls(&c).is_empty(), "{c:?}");
    assert!(c.transport_socket.is_none());
    // ... or mesh-wide, unless the namespace says otherwise.
    let mesh_disable = peer_auth("istio-system", "DISABLE", "");
    assert!(auto_mtls(&cluster(&mesh_disable, HTTPBIN)).is_empty());
    let both = format!("{mesh_disable}---\n{}", peer_auth("demo", "PERMISSIVE", ""));
    assert_eq!(auto_mtls(&cluster(&both, HTTPBIN)), auto);
    // A workload-level policy makes the mode unknown: the labels decide.
    let selected = peer_auth("demo", "DISABLE", "selector: {matchLabels: {app: httpbin}}");
    assert_eq!(auto_mtls(&cluster(&selected, HTTPBIN)), auto);
    // A DestinationRule's ISTIO_MUTUAL wins over DISABLE, as in Istio.
    let dr = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: d, namespace: demo}\nspec:\n  host: httpbin\n  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}\n";
    let c = cluster(
        &format!("{}---\n{dr}", peer_auth("demo", "DISABLE", "")),
        HTTPBIN,
    );
    assert!(c.transport_socket.is_some());
    assert!(auto_mtls(&c).is_empty());
}

#[test]
fn simple_and_mutual_rules_originate_tls_on_the_cluster() {
    use proto::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
    let dr = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: d, namespace: demo}\nspec:\n  host: httpbin\n  trafficPolicy: {tls: {mode: MUTUAL, clientCertificate: /c.pem, privateKey: /k.pem, caCertificates: /ca.pem, sni: api.example}}\n";
    let c = cluster(dr, HTTPBIN);
    assert!(auto_mtls(&c).is_empty(), "no auto mTLS under a user's TLS");
    let ts = c.transport_socket.unwrap();
    assert_eq!(ts.name, "envoy.transport_sockets.tls");
    let Some(proto::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(a)) =
        ts.config_type
    else {
        panic!()
    };
    let ctx = UpstreamTlsContext::decode(a.value.as_slice()).unwrap();
    assert_eq!(ctx.sni, "api.example");
    assert_eq!(ctx.common_tls_context.unwrap().tls_certificates.len(), 1);
}

#[test]
fn sidecar_connection_pools_set_the_inbound_clusters() {
    let sidecar = r#"apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: demo}
spec:
  inboundConnectionPool: {tcp: {maxConnections: 11}}
  ingress:
  - port: {number: 9080, protocol: HTTP, name: http}
    defaultEndpoint: 127.0.0.1:8080
    connectionPool:
      tcp: {maxConnections: 7, connectTimeout: 3s}
      http: {http1MaxPendingRequests: 5, idleTimeout: 30s}
  - port: {number: 9090, protocol: TCP, name: tcp}
    defaultEndpoint: 127.0.0.1:9090
"#;
    let breakers = |c: &Cluster| {
        let t = &c.circuit_breakers.as_ref().unwrap().thresholds[0];
        (
            t.max_connections.map(|v| v.value),
            t.max_pending_requests.map(|v| v.value),
        )
    };
    // The listener's own pool, over `inboundConnectionPool`.
    let c = cluster(sidecar, "inbound|9080||");
    assert_eq!(breakers(&c), (Some(7), Some(5)));
    assert_eq!(c.connect_timeout.unwrap().seconds, 3);
    let options = c.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS].clone();
    let options = HttpProtocolOptions::decode(options.value.as_slice()).unwrap();
    assert_eq!(
        options
            .common_http_protocol_options
            .unwrap()
            .idle_timeout
            .unwrap()
            .seconds,
        30
    );
    // `inboundConnectionPool` for the others.
    let c = cluster(sidecar, "inbound|9090||");
    assert_eq!(breakers(&c).0, Some(11));
    assert_eq!(c.connect_timeout.unwrap().seconds, 10);
    // Without them, Istio's unlimited breakers.
    let plain = sidecar.replace("  inboundConnectionPool: {tcp: {maxConnections: 11}}\n", "");
    let c = cluster(&plain, "inbound|9090||");
    assert_eq!(breakers(&c).0, Some(u32::MAX));
}

#[test]
fn hashing_locality_and_proxy_protocol_reach_the_cluster() {
    let dr = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: d, namespace: demo}\nspec:\n  host: httpbin\n  trafficPolicy:\n    loadBalancer: {consistentHash: {httpCookie: {name: s, ttl: 60s}, maglev: {tableSize: 65537}}, localityLbSetting: {failover: [{from: r1, to: r2}]}}\n    outlierDetection: {consecutive5xxErrors: 3}\n    proxyProtocol: {version: V2}\n";
    let c = cluster(dr, HTTPBIN);
    assert_eq!(c.lb_policy, i32::from(cluster::LbPolicy::Maglev));
    assert!(matches!(
        c.common_lb_config.unwrap().locality_config_specifier,
        Some(cluster::common_lb_config::LocalityConfigSpecifier::LocalityWeightedLbConfig(_))
    ));
    // Auto mTLS's sockets, each wrapped in the PROXY protocol.
    for m in &c.transport_socket_matches {
        assert_eq!(
            m.transport_socket.as_ref().unwrap().name,
            "envoy.transport_sockets.upstream_proxy_protocol",
            "{}",
            m.name
        );
    }
    assert_eq!(c.transport_socket_matches.len(), 2);
    // Istio's default locality setting without failover rules: no
    // locality-weighted balancing (priorities alone do the failover).
    let plain = cluster(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: d, namespace: demo}\nspec:\n  host: httpbin\n  trafficPolicy: {outlierDetection: {consecutive5xxErrors: 3}}\n",
        HTTPBIN,
    );
    assert!(
        plain
            .common_lb_config
            .is_none_or(|c| c.locality_config_specifier.is_none())
    );
}

/// The outside service `tls.example` on port 443, a rule without selector
/// (SIMPLE with a CA file) and, for `app: sleep`, one with `selector_tls`.
fn selector_rules(selector_tls: &str) -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: ext, namespace: demo}}
spec:
  hosts: [tls.example]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{{number: 443, name: https, protocol: HTTPS}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: all, namespace: demo}}
spec:
  host: tls.example
  trafficPolicy: {{tls: {{mode: SIMPLE, caCertificates: /ca.pem}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: sleep-only, namespace: demo}}
spec:
  host: tls.example
  workloadSelector: {{matchLabels: {{app: sleep}}}}
  trafficPolicy: {{tls: {selector_tls}}}
"#
    )
}

const EXT: &str = "outbound|443||tls.example";

fn sidecar(app: &str) -> Proxy {
    Proxy {
        proxy_type: common::ProxyType::Sidecar,
        ip: "198.18.0.7".into(),
        ips: vec!["198.18.0.7".into()],
        namespace: "demo".into(),
        labels: [("app".to_string(), app.to_string())].into(),
        ..Default::default()
    }
}

fn cluster_for(ctx: &IstioContext, proxy: &Proxy, name: &str) -> Cluster {
    let r = build(ctx, proxy)
        .into_iter()
        .find(|r| r.name == name)
        .unwrap();
    Cluster::decode(r.resource.value.as_slice()).unwrap()
}

fn upstream_tls(c: &Cluster) -> UpstreamTlsContext {
    let socket = c.transport_socket.as_ref().expect("a TLS socket");
    match socket.config_type.as_ref().unwrap() {
        proto::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(a) => {
            UpstreamTlsContext::decode(a.value.as_slice()).unwrap()
        }
    }
}

#[test]
fn a_selector_rule_applies_to_the_workloads_it_selects_and_the_others_share_the_namespace_rule() {
    let ctx = crate::pushctx::context::context_of_yaml(&selector_rules(
        "{mode: MUTUAL, credentialName: client-cred, sni: tls.example}",
    ));
    // The selected sidecar: its client certificate and the server's CA
    // from the Secret, over SDS on the ADS stream.
    let tls = upstream_tls(&cluster_for(&ctx, &sidecar("sleep"), EXT));
    let common = tls.common_tls_context.unwrap();
    let names: Vec<&str> = common
        .tls_certificate_sds_secret_configs
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(names, ["kubernetes://client-cred"]);
    assert!(common.tls_certificates.is_empty());
    match common.validation_context_type.unwrap() {
        common_tls_context::ValidationContextType::CombinedValidationContext(c) => {
            let sds = c.validation_context_sds_secret_config.unwrap();
            assert_eq!(sds.name, "kubernetes://client-cred-cacert");
            assert!(matches!(
                sds.sds_config.unwrap().config_source_specifier,
                Some(
                    proto::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier::Ads(
                        _
                    )
                )
            ));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(tls.sni, "tls.example");
    // Another workload of the namespace: the rule without selector.
    let other = upstream_tls(&cluster_for(&ctx, &sidecar("httpbin"), EXT));
    let common = other.common_tls_context.unwrap();
    assert!(common.tls_certificate_sds_secret_configs.is_empty());
    assert!(matches!(
        common.validation_context_type,
        Some(common_tls_context::ValidationContextType::ValidationContext(_))
    ));
    // Proxies no selector rule picks share one scope (and its clusters);
    // a selected one has its own.
    let scope = |app: &str| ctx.scope(&sidecar(app));
    assert!(Arc::ptr_eq(&scope("httpbin"), &scope("web")));
    assert!(!Arc::ptr_eq(&scope("httpbin"), &scope("sleep")));
    assert_eq!(scope("httpbin").destination_rules, Vec::<usize>::new());
    assert_eq!(scope("sleep").destination_rules.len(), 1);
}

#[test]
fn selector_rules_stay_in_their_namespace_and_shadow_as_in_istio() {
    // Only the selector rule in the client's namespace: an unselected
    // client has no rule for the host (Istio's `SidecarScope.DestinationRule`),
    // not the exported one of the root namespace.
    let only_selector = selector_rules("{mode: SIMPLE, sni: sel.example}")
        .replace("namespace: demo}\nspec:\n  host: tls.example\n  trafficPolicy: {tls: {mode: SIMPLE, caCertificates: /ca.pem}}", "namespace: istio-system}\nspec:\n  host: tls.example\n  trafficPolicy: {tls: {mode: SIMPLE, caCertificates: /ca.pem}}");
    let ctx = crate::pushctx::context::context_of_yaml(&only_selector);
    assert!(
        cluster_for(&ctx, &sidecar("httpbin"), EXT)
            .transport_socket
            .is_none()
    );
    assert_eq!(
        upstream_tls(&cluster_for(&ctx, &sidecar("sleep"), EXT)).sni,
        "sel.example"
    );
    // A client of another namespace with the same labels: the root
    // namespace's rule (a selector rule is never exported).
    let mut elsewhere = sidecar("sleep");
    elsewhere.namespace = "other".into();
    let tls = upstream_tls(&cluster_for(&ctx, &elsewhere, EXT));
    assert_eq!(tls.sni, "");
    assert!(
        tls.common_tls_context
            .unwrap()
            .tls_certificate_sds_secret_configs
            .is_empty()
    );
}

#[test]
fn the_mesh_connect_timeout_and_dns_refresh_rate_reach_every_cluster() {
    let entry = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: ext, namespace: demo}\nspec:\n  hosts: [dns.example]\n  location: MESH_EXTERNAL\n  resolution: DNS\n  ports: [{number: 80, name: http, protocol: HTTP}]\n";
    let ctx = |mesh: &str| {
        crate::pushctx::context::context_of_yaml(&format!("{MESH}\n---\n{entry}"))
            .with_mesh(crate::mesh::Mesh::parse(mesh).unwrap().config)
    };
    let seconds = |c: &Cluster| c.connect_timeout.as_ref().unwrap().seconds;
    #[allow(deprecated)]
    let refresh = |c: &Cluster| {
        (
            c.dns_refresh_rate.as_ref().unwrap().seconds,
            c.respect_dns_ttl,
        )
    };
    // Istio's defaults.
    let plain = ctx("");
    let httpbin = cluster_for(&plain, &sidecar("sleep"), HTTPBIN);
    assert_eq!(seconds(&httpbin), 10);
    let dns = cluster_for(&plain, &sidecar("sleep"), "outbound|80||dns.example");
    assert_eq!(refresh(&dns), (60, true));
    // The mesh's, on outbound, DNS and built-in clusters alike; a
    // DestinationRule's connectTimeout still wins for its host.
    let tuned = ctx("connectTimeout: 3s\ndnsRefreshRate: 20s\n");
    for name in [HTTPBIN, "PassthroughCluster", "BlackHoleCluster"] {
        assert_eq!(
            seconds(&cluster_for(&tuned, &sidecar("sleep"), name)),
            3,
            "{name}"
        );
    }
    let dns = cluster_for(&tuned, &sidecar("sleep"), "outbound|80||dns.example");
    assert_eq!(refresh(&dns), (20, true));
    let with_rule = crate::pushctx::context::context_of_yaml(&format!(
        "{MESH}\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: h, namespace: demo}}\nspec:\n  host: httpbin\n  trafficPolicy: {{connectionPool: {{tcp: {{connectTimeout: 1s}}}}}}\n"
    ))
    .with_mesh(crate::mesh::Mesh::parse("connectTimeout: 3s\n").unwrap().config);
    assert_eq!(
        seconds(&cluster_for(&with_rule, &sidecar("sleep"), HTTPBIN)),
        1
    );
}
