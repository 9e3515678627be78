//! The outbound side of captured traffic, as Istio shapes it:
//! `virtualOutbound` (loop guard and catch-all), per-port listeners for
//! HTTP, TCP and detected ports, the RDS catch-all (`allow_any` or
//! `block_all`), Istio's virtual host domains, the passthrough clusters,
//! the ALPN our mTLS clients offer, and `outboundTrafficPolicy` from the
//! mesh config with a Sidecar's override.

#![allow(clippy::unwrap_used)]

mod shapes;

use istiod::mesh::MeshConfig;
use istiod::model::istio::OutboundMode;
use proto::pb::envoy::config::cluster::v3::cluster;
use proto::pb::envoy::config::listener::v3::Listener;
use proto::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost, route, route_action};
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager;
use proto::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::UpstreamProtocolOptions;
use shapes::*;

const HTTPBIN: &str = "httpbin.demo.svc.cluster.local";

fn registry_only() -> MeshConfig {
    MeshConfig {
        outbound_traffic_policy: OutboundMode::RegistryOnly,
        ..MeshConfig::default()
    }
}

fn sidecar_policy(mode: &str) -> String {
    format!(
        r#"
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: default, namespace: demo}}
spec:
  outboundTrafficPolicy: {{mode: {mode}}}
"#
    )
}

/// (name, stat prefix, cluster) of virtualOutbound's chains.
fn virtual_outbound(l: &Listener) -> Vec<(String, String, String)> {
    l.filter_chains
        .iter()
        .map(|c| {
            let (stat, cluster) = tcp(c);
            (c.name.clone(), stat, cluster)
        })
        .collect()
}

fn vo_chains(catch_all: &str) -> Vec<(String, String, String)> {
    vec![
        (
            "virtualOutbound-blackhole".into(),
            "BlackHoleCluster".into(),
            "BlackHoleCluster".into(),
        ),
        (
            "virtualOutbound-catchall-tcp".into(),
            catch_all.into(),
            catch_all.into(),
        ),
    ]
}

#[test]
fn virtual_outbound_passes_unknown_traffic_under_allow_any() {
    let ctx = ctx("");
    let l = listeners(&ctx, &sleep()).remove("virtualOutbound").unwrap();
    assert_eq!(addr(&l.address), "0.0.0.0:15001");
    assert!(l.use_original_dst.unwrap().value);
    assert_eq!(virtual_outbound(&l), vo_chains("PassthroughCluster"));
    // The loop guard matches connections to 15001 itself.
    let m = l.filter_chains[0].filter_chain_match.clone().unwrap();
    assert_eq!(m.destination_port.unwrap().value, 15001);
    assert!(l.filter_chains[1].filter_chain_match.is_none());
    assert!(l.listener_filters.is_empty());
}

#[test]
fn outbound_traffic_policy_mesh_config_and_sidecar_override() {
    let vo = |extra: &str, mesh: MeshConfig| {
        let ctx = ctx_with(extra, mesh);
        virtual_outbound(&listeners(&ctx, &sleep())["virtualOutbound"])
    };
    assert_eq!(vo("", registry_only()), vo_chains("BlackHoleCluster"));
    assert_eq!(
        vo(&sidecar_policy("REGISTRY_ONLY"), MeshConfig::default()),
        vo_chains("BlackHoleCluster")
    );
    assert_eq!(
        vo(&sidecar_policy("ALLOW_ANY"), registry_only()),
        vo_chains("PassthroughCluster")
    );
    // An egress proxy takes what would pass through.
    let egress = r#"
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: demo}
spec:
  outboundTrafficPolicy:
    mode: ALLOW_ANY
    egressProxy: {host: squid.demo.svc.cluster.local, port: {number: 3128}}
"#;
    let proxy_cluster = "outbound|3128||squid.demo.svc.cluster.local";
    assert_eq!(vo(egress, registry_only()), vo_chains(proxy_cluster));
    let ctx = ctx_with(egress, registry_only());
    let allow = routes(&ctx, &sleep()).remove("8000").unwrap();
    assert_eq!(
        catch_all(&allow),
        ("allow_any".into(), Some(proxy_cluster.into()))
    );
}

/// (name, cluster or None for a direct response) of the last virtual host.
fn catch_all(rc: &RouteConfiguration) -> (String, Option<String>) {
    let vh = rc.virtual_hosts.last().unwrap();
    assert_eq!(vh.domains, strings(&["*"]));
    assert_eq!(vh.routes[0].name, vh.name);
    let cluster = match vh.routes[0].action.as_ref().unwrap() {
        route::Action::Route(a) => match &a.cluster_specifier {
            Some(route_action::ClusterSpecifier::Cluster(c)) => Some(c.clone()),
            _ => panic!("no cluster"),
        },
        route::Action::DirectResponse(d) => {
            assert_eq!(d.status, 502);
            assert!(d.body.is_none());
            None
        }
        other => panic!("unexpected action {other:?}"),
    };
    (vh.name.clone(), cluster)
}

#[test]
fn route_catch_all_is_allow_any_or_block_all() {
    let ctx = ctx("");
    let rc = routes(&ctx, &sleep()).remove("8000").unwrap();
    assert_eq!(
        catch_all(&rc),
        ("allow_any".into(), Some("PassthroughCluster".into()))
    );
    let route::Action::Route(a) = rc.virtual_hosts.last().unwrap().routes[0]
        .action
        .clone()
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(a.timeout.unwrap().seconds, 0);
    assert!(rc.ignore_port_in_host_matching);
    assert!(!rc.validate_clusters.unwrap().value);

    let ctx = ctx_with("", registry_only());
    let rc = routes(&ctx, &sleep()).remove("8000").unwrap();
    assert_eq!(catch_all(&rc), ("block_all".into(), None));
    let ctx = ctx_with(&sidecar_policy("REGISTRY_ONLY"), MeshConfig::default());
    let rc = routes(&ctx, &sleep()).remove("8000").unwrap();
    assert_eq!(catch_all(&rc), ("block_all".into(), None));
}

fn vhost<'a>(rc: &'a RouteConfiguration, name: &str) -> &'a VirtualHost {
    rc.virtual_hosts.iter().find(|v| v.name == name).unwrap()
}

#[test]
fn virtual_hosts_carry_istios_domains() {
    let ctx = ctx("");
    let rc = routes(&ctx, &sleep()).remove("8000").unwrap();
    assert_eq!(
        vhost(&rc, &format!("{HTTPBIN}:8000")).domains,
        strings(&[
            HTTPBIN,
            "httpbin.demo.svc.cluster.local.",
            "httpbin",
            "httpbin.demo.svc",
            "httpbin.demo",
            "198.19.0.10",
        ])
    );
    // From another namespace: no bare name.
    let mut other = sleep();
    other.namespace = "other".into();
    let rc = routes(&ctx, &other).remove("8000").unwrap();
    assert_eq!(
        vhost(&rc, &format!("{HTTPBIN}:8000")).domains,
        strings(&[
            HTTPBIN,
            "httpbin.demo.svc.cluster.local.",
            "httpbin.demo",
            "httpbin.demo.svc",
            "198.19.0.10",
        ])
    );
}

#[test]
fn http_port_listener_detects_http_and_passes_the_rest() {
    let ctx = ctx("");
    let l = listeners(&ctx, &sleep()).remove("0.0.0.0_8000").unwrap();
    assert!(!l.bind_to_port.unwrap().value);
    assert_eq!(l.listener_filters.len(), 1);
    assert_eq!(
        l.listener_filters[0].name,
        "envoy.filters.listener.http_inspector"
    );
    assert_eq!(l.filter_chains.len(), 1);
    assert_eq!(
        chain_match(&l.filter_chains[0]),
        ("raw_buffer".into(), strings(&["http/1.1", "h2c"]))
    );
    let h = hcm(&l.filter_chains[0]);
    assert_eq!(h.stat_prefix, "outbound_0.0.0.0_8000;");
    let Some(http_connection_manager::RouteSpecifier::Rds(rds)) = h.route_specifier else {
        panic!("RDS")
    };
    assert_eq!(rds.route_config_name, "8000");
    let d = l.default_filter_chain.unwrap();
    assert_eq!(d.name, "PassthroughFilterChain");
    assert_eq!(
        tcp(&d),
        ("PassthroughCluster".into(), "PassthroughCluster".into())
    );

    let ctx = ctx_with("", registry_only());
    let l = listeners(&ctx, &sleep()).remove("0.0.0.0_8000").unwrap();
    assert_eq!(tcp(&l.default_filter_chain.unwrap()).1, "BlackHoleCluster");
}

#[test]
fn tcp_and_detected_ports_listen_on_the_service_address() {
    let ctx = ctx("");
    let ls = listeners(&ctx, &sleep());
    let tcp_l = &ls["198.19.0.10_9000"];
    assert!(!tcp_l.bind_to_port.unwrap().value);
    assert!(tcp_l.listener_filters.is_empty());
    assert!(tcp_l.default_filter_chain.is_none());
    let cluster = format!("outbound|9000||{HTTPBIN}");
    assert_eq!(tcp(&tcp_l.filter_chains[0]), (cluster.clone(), cluster));

    let auto = &ls["198.19.0.10_7070"];
    assert_eq!(
        auto.listener_filters[0].name,
        "envoy.filters.listener.http_inspector"
    );
    assert_eq!(
        chain_match(&auto.filter_chains[0]),
        ("raw_buffer".into(), strings(&["http/1.1", "h2c"]))
    );
    assert_eq!(
        chain_cluster(&auto.filter_chains[0]),
        format!("rds:{HTTPBIN}:7070")
    );
    assert_eq!(
        tcp(auto.default_filter_chain.as_ref().unwrap()).1,
        format!("outbound|7070||{HTTPBIN}")
    );
    // Its route configuration has the service alone, no catch-all.
    let rs = routes(&ctx, &sleep());
    let rc = &rs[&format!("{HTTPBIN}:7070")];
    assert_eq!(rc.virtual_hosts.len(), 1);
    assert_eq!(rc.virtual_hosts[0].name, format!("{HTTPBIN}:7070"));
    assert_eq!(
        rs.keys().cloned().collect::<Vec<_>>(),
        strings(&["80", "8000", &format!("{HTTPBIN}:7070")])
    );
    // Detected ports' clusters use the downstream's protocol.
    let c = &clusters(&ctx, &sleep())[&format!("outbound|7070||{HTTPBIN}")];
    assert!(matches!(
        protocol_options(c).unwrap().upstream_protocol_options,
        Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(_))
    ));
}

#[test]
fn sidecar_egress_capture_none_binds_only_its_port() {
    let ctx = ctx(r#"
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: sleep, namespace: demo}
spec:
  workloadSelector: {labels: {app: sleep}}
  egress:
  - port: {number: 8000, protocol: HTTP, name: http}
    bind: 127.0.0.1
    captureMode: NONE
    hosts: ["./*"]
"#);
    let ls = listeners(&ctx, &sleep());
    assert_eq!(
        ls.keys().cloned().collect::<Vec<_>>(),
        strings(&["127.0.0.1_8000", "virtualInbound", "virtualOutbound"])
    );
    let l = &ls["127.0.0.1_8000"];
    assert!(l.bind_to_port.is_none(), "binds its port");
    assert!(l.listener_filters.is_empty());
    assert!(l.default_filter_chain.is_none());
    assert_eq!(chain_cluster(&l.filter_chains[0]), "rds:8000");
    assert_eq!(
        hcm(&l.filter_chains[0]).stat_prefix,
        "outbound_127.0.0.1_8000;"
    );
    let rs = routes(&ctx, &sleep());
    assert_eq!(rs.keys().cloned().collect::<Vec<_>>(), strings(&["8000"]));
}

#[test]
fn passthrough_and_blackhole_clusters_have_istios_shape() {
    let ctx = ctx("");
    let cs = clusters(&ctx, &sleep());
    let p = &cs["PassthroughCluster"];
    assert_eq!(
        p.cluster_discovery_type,
        Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::OriginalDst as i32
        ))
    );
    assert_eq!(p.lb_policy, cluster::LbPolicy::ClusterProvided as i32);
    assert_eq!(p.alt_stat_name, "PassthroughCluster;");
    assert!(p.upstream_bind_config.is_none());
    let o = protocol_options(p).unwrap();
    assert!(matches!(
        o.upstream_protocol_options,
        Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(_))
    ));
    assert_eq!(
        o.common_http_protocol_options
            .unwrap()
            .idle_timeout
            .unwrap()
            .seconds,
        300
    );
    let b = &cs["BlackHoleCluster"];
    assert_eq!(
        b.cluster_discovery_type,
        Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Static as i32
        ))
    );
    assert!(b.load_assignment.is_none());
    assert_eq!(b.alt_stat_name, "BlackHoleCluster;");
}

/// Every ALPN value a PERMISSIVE server's mTLS chains accept, by port.
fn accepted_alpns(server: &Listener, port: u32) -> Vec<Vec<String>> {
    chains_for(server, port)
        .into_iter()
        .filter(|c| c.transport_socket.is_some())
        .map(|c| chain_match(c).1)
        .collect()
}

#[test]
fn mesh_clients_alpn_reaches_the_servers_mtls_chains() {
    let mesh = ctx(r#"
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: httpbin, namespace: demo}
spec:
  host: httpbin.demo.svc.cluster.local
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}
"#);
    let cs = clusters(&mesh, &sleep());
    let server = listeners(&mesh, &httpbin())
        .remove("virtualInbound")
        .unwrap();
    for (port, target) in [(8000, 8080), (9000, 9000), (7070, 7070)] {
        let tls = upstream_tls(&cs[&format!("outbound|{port}||{HTTPBIN}")]);
        let common = tls.common_tls_context.unwrap();
        // Istio's ALPN without metadata exchange.
        assert_eq!(common.alpn_protocols, strings(&["istio"]), "port {port}");
        assert_eq!(tls.sni, format!("outbound_.{port}_._.{HTTPBIN}"));
        // Some mTLS chain of the server's port takes what the client offers.
        let accepted = accepted_alpns(&server, target);
        assert!(
            accepted
                .iter()
                .any(|alpn| alpn.is_empty()
                    || common.alpn_protocols.iter().any(|a| alpn.contains(a))),
            "port {port}: {accepted:?}"
        );
    }
    // HTTP/2 ports add h2.
    let grpc = ctx(r#"
apiVersion: v1
kind: Service
metadata: {name: grpc, namespace: demo}
spec:
  clusterIP: 198.19.0.30
  selector: {app: grpc}
  ports:
  - {name: grpc, port: 7443}
"#);
    let c = &clusters(&grpc, &sleep())["outbound|7443||grpc.demo.svc.cluster.local"];
    let alpn = upstream_tls(c).common_tls_context.unwrap().alpn_protocols;
    assert_eq!(alpn, strings(&["istio", "h2"]));
}

#[test]
fn an_egress_proxy_needs_allow_any_and_a_port() {
    let sidecar = |policy: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: s, namespace: demo}}\nspec:\n  outboundTrafficPolicy: {policy}\n"
        )
    };
    let errors = |policy: &str| {
        istiod::model::parse_file("s.yaml", &sidecar(policy))
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let e = errors(
        "{mode: REGISTRY_ONLY, egressProxy: {host: squid.demo.svc.cluster.local, port: {number: 3128}}}",
    );
    assert!(e.contains("only used with mode ALLOW_ANY"), "{e}");
    let e = errors("{mode: ALLOW_ANY, egressProxy: {host: squid.demo.svc.cluster.local}}");
    assert!(e.contains("egressProxy.port"), "{e}");
    assert!(
        istiod::model::parse_file(
            "s.yaml",
            &sidecar("{mode: ALLOW_ANY, egressProxy: {host: squid.demo.svc.cluster.local, port: {number: 3128}}}")
        )
        .is_ok()
    );
}
