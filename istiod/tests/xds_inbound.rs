//! The inbound side of captured traffic, as Istio shapes it: `virtualInbound`
//! chains per PeerAuthentication mode (STRICT, PERMISSIVE, DISABLE) and port
//! protocol (HTTP, TCP, detected), the passthrough chains, inspectors only
//! where chains need them, `inbound|<port>||` clusters to the original
//! destination from 127.0.0.6, and Sidecar ingress listeners.

#![allow(clippy::unwrap_used)]

mod shapes;

use proto::pb::envoy::config::cluster::v3::{Cluster, cluster};
use proto::pb::envoy::config::listener::v3::{
    Listener, ListenerFilterChainMatchPredicate, listener_filter_chain_match_predicate::Rule,
};
use proto::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::UpstreamProtocolOptions;
use shapes::*;

const ALL_ISTIO: &[&str] = &[
    "istio",
    "istio-peer-exchange",
    "istio-http/1.0",
    "istio-http/1.1",
    "istio-h2",
];
const MTLS_HTTP: &[&str] = &["istio-http/1.0", "istio-http/1.1", "istio-h2"];
const MTLS_TCP: &[&str] = &["istio-peer-exchange", "istio"];
const PLAIN_HTTP: &[&str] = &["http/1.1", "h2c"];

const STRICT: &str = r#"
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: demo}
spec: {mtls: {mode: STRICT}}
"#;

const DISABLE: &str = r#"
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: demo}
spec: {mtls: {mode: DISABLE}}
"#;

fn virtual_inbound(extra: &str) -> Listener {
    let ctx = ctx(extra);
    listeners(&ctx, &httpbin())
        .remove("virtualInbound")
        .unwrap()
}

/// (name, transport, ALPN, terminates TLS, cluster) of each chain on `port`.
fn summary(l: &Listener, port: u32) -> Vec<(String, String, Vec<String>, bool, String)> {
    chains_for(l, port)
        .into_iter()
        .map(|c| {
            let (transport, alpn) = chain_match(c);
            (
                c.name.clone(),
                transport,
                alpn,
                c.transport_socket.is_some(),
                chain_cluster(c),
            )
        })
        .collect()
}

fn row(
    name: &str,
    transport: &str,
    alpn: &[&str],
    tls: bool,
    cluster: &str,
) -> (String, String, Vec<String>, bool, String) {
    (
        name.into(),
        transport.into(),
        strings(alpn),
        tls,
        cluster.into(),
    )
}

/// Ports a predicate matches: one range, or an `or` of ranges; negated.
fn ports(p: &ListenerFilterChainMatchPredicate) -> (bool, Vec<i32>) {
    match p.rule.as_ref().unwrap() {
        Rule::DestinationPortRange(r) => {
            assert_eq!(r.end, r.start + 1);
            (false, vec![r.start])
        }
        Rule::OrMatch(set) => (false, set.rules.iter().flat_map(|r| ports(r).1).collect()),
        Rule::NotMatch(inner) => (true, ports(inner).1),
        other => panic!("unexpected predicate {other:?}"),
    }
}

/// Ports a listener filter is disabled on (`true`: all but these).
type Disabled = Option<(bool, Vec<i32>)>;

/// Listener filter names, each with the ports it is disabled on.
fn filters(l: &Listener) -> Vec<(String, Disabled)> {
    l.listener_filters
        .iter()
        .map(|f| (f.name.clone(), f.filter_disabled.as_ref().map(ports)))
        .collect()
}

#[test]
fn virtual_inbound_is_istios_listener() {
    let l = virtual_inbound("");
    assert_eq!(addr(&l.address), "0.0.0.0:15006");
    assert!(l.continue_on_listener_filters_timeout);
    assert_eq!(l.listener_filters_timeout.unwrap().seconds, 0);
    assert_eq!(
        summary(&l, 15006),
        vec![row(
            "virtualInbound-blackhole",
            "",
            &[],
            false,
            "BlackHoleCluster"
        )]
    );
    assert_eq!(tcp(chains_for(&l, 15006)[0]).0, "BlackHoleCluster");
}

#[test]
fn permissive_http_port_takes_mesh_mtls_and_plain_text() {
    let l = virtual_inbound("");
    assert_eq!(
        summary(&l, 8080),
        vec![
            row("0.0.0.0_8080", "tls", ALL_ISTIO, true, "inbound|8080||"),
            row("0.0.0.0_8080", "raw_buffer", &[], false, "inbound|8080||"),
        ]
    );
    let h = hcm(chains_for(&l, 8080)[0]);
    assert_eq!(h.stat_prefix, "inbound_0.0.0.0_8080;");
    // Istio's server TLS: ALPN h2/http1.1 (never "istio"), client certs required.
    let tls = downstream_tls(chains_for(&l, 8080)[0]).unwrap();
    assert!(tls.require_client_certificate.unwrap().value);
    let common = tls.common_tls_context.unwrap();
    assert_eq!(common.alpn_protocols, strings(&["h2", "http/1.1"]));
    assert_eq!(common.tls_certificate_sds_secret_configs[0].name, "default");
    assert_eq!(common.tls_params.unwrap().cipher_suites.len(), 6);
}

#[test]
fn permissive_tcp_port_passes_non_mesh_tls_to_the_app() {
    let l = virtual_inbound("");
    assert_eq!(
        summary(&l, 9000),
        vec![
            row("0.0.0.0_9000", "tls", ALL_ISTIO, true, "inbound|9000||"),
            row("0.0.0.0_9000", "tls", &[], false, "inbound|9000||"),
            row("0.0.0.0_9000", "raw_buffer", &[], false, "inbound|9000||"),
        ]
    );
    assert_eq!(tcp(chains_for(&l, 9000)[0]).0, "inbound|9000||");
    let tls = downstream_tls(chains_for(&l, 9000)[0]).unwrap();
    assert_eq!(
        tls.common_tls_context.unwrap().alpn_protocols,
        strings(&["h2", "http/1.1"])
    );
}

#[test]
fn permissive_detected_port_has_istios_five_chains() {
    let l = virtual_inbound("");
    let c = "inbound|7070||";
    assert_eq!(
        summary(&l, 7070),
        vec![
            row("0.0.0.0_7070", "tls", MTLS_HTTP, true, c),
            row("0.0.0.0_7070", "raw_buffer", PLAIN_HTTP, false, c),
            row("0.0.0.0_7070", "tls", MTLS_TCP, true, c),
            row("0.0.0.0_7070", "raw_buffer", &[], false, c),
            row("0.0.0.0_7070", "tls", &[], false, c),
        ]
    );
    // The passthrough: the same five, to InboundPassthroughCluster.
    let p = "InboundPassthroughCluster";
    assert_eq!(
        summary(&l, 0),
        vec![
            row("virtualInbound-catchall-http", "tls", MTLS_HTTP, true, p),
            row(
                "virtualInbound-catchall-http",
                "raw_buffer",
                PLAIN_HTTP,
                false,
                p
            ),
            row("virtualInbound", "tls", MTLS_TCP, true, p),
            row("virtualInbound", "raw_buffer", &[], false, p),
            row("virtualInbound", "tls", &[], false, p),
        ]
    );
    let passthrough_http = hcm(chains_for(&l, 0)[1]);
    assert_eq!(passthrough_http.stat_prefix, "InboundPassthroughCluster;");
}

#[test]
fn permissive_inspectors_run_only_where_chains_need_them() {
    let l = virtual_inbound("");
    assert_eq!(
        filters(&l),
        vec![
            ("envoy.filters.listener.original_dst".into(), None),
            // TLS everywhere but the loop guard.
            (
                "envoy.filters.listener.tls_inspector".into(),
                Some((false, vec![15006]))
            ),
            // HTTP detection only for the passthrough and the detected port.
            (
                "envoy.filters.listener.http_inspector".into(),
                Some((false, vec![8080, 9000, 15006]))
            ),
        ]
    );
}

#[test]
fn strict_takes_mesh_mtls_only() {
    let l = virtual_inbound(STRICT);
    assert_eq!(
        summary(&l, 8080),
        vec![row("0.0.0.0_8080", "tls", &[], true, "inbound|8080||")]
    );
    assert_eq!(
        summary(&l, 9000),
        vec![row("0.0.0.0_9000", "tls", &[], true, "inbound|9000||")]
    );
    assert_eq!(
        summary(&l, 7070),
        vec![
            row("0.0.0.0_7070", "tls", MTLS_HTTP, true, "inbound|7070||"),
            row("0.0.0.0_7070", "tls", &[], true, "inbound|7070||"),
        ]
    );
    assert_eq!(summary(&l, 0).len(), 2);
    assert!(summary(&l, 0).iter().all(|r| r.1 == "tls" && r.3));
    // No plain-text HTTP chain anywhere: no HTTP inspector.
    assert_eq!(
        filters(&l),
        vec![
            ("envoy.filters.listener.original_dst".into(), None),
            (
                "envoy.filters.listener.tls_inspector".into(),
                Some((false, vec![15006]))
            ),
        ]
    );
}

#[test]
fn disable_takes_plain_text_only() {
    let l = virtual_inbound(DISABLE);
    assert_eq!(
        summary(&l, 8080),
        vec![row(
            "0.0.0.0_8080",
            "raw_buffer",
            &[],
            false,
            "inbound|8080||"
        )]
    );
    assert_eq!(
        summary(&l, 9000),
        vec![row(
            "0.0.0.0_9000",
            "raw_buffer",
            &[],
            false,
            "inbound|9000||"
        )]
    );
    assert_eq!(
        summary(&l, 7070),
        vec![
            row(
                "0.0.0.0_7070",
                "raw_buffer",
                PLAIN_HTTP,
                false,
                "inbound|7070||"
            ),
            row("0.0.0.0_7070", "raw_buffer", &[], false, "inbound|7070||"),
        ]
    );
    assert!(l.filter_chains.iter().all(|c| c.transport_socket.is_none()));
    assert_eq!(
        filters(&l),
        vec![
            ("envoy.filters.listener.original_dst".into(), None),
            (
                "envoy.filters.listener.http_inspector".into(),
                Some((false, vec![8080, 9000, 15006]))
            ),
        ]
    );
}

#[test]
fn port_level_modes_and_their_passthrough_chains() {
    let l = virtual_inbound(
        r#"
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: httpbin, namespace: demo}
spec:
  selector: {matchLabels: {app: httpbin}}
  mtls: {mode: DISABLE}
  portLevelMtls:
    8080: {mode: STRICT}
    9999: {mode: STRICT}
"#,
    );
    assert_eq!(
        summary(&l, 8080),
        vec![row("0.0.0.0_8080", "tls", &[], true, "inbound|8080||")]
    );
    assert_eq!(summary(&l, 9000)[0].1, "raw_buffer");
    // 9999 is no Service's port: passthrough chains of its own, STRICT.
    let p = "InboundPassthroughCluster";
    assert_eq!(
        summary(&l, 9999),
        vec![
            row("virtualInbound-catchall-http", "tls", MTLS_HTTP, true, p),
            row("virtualInbound", "tls", &[], true, p),
        ]
    );
    // The TLS inspector is off by default (plain-text passthrough) and on
    // for the ports with TLS chains.
    let tls = &filters(&l)[1];
    assert_eq!(tls.0, "envoy.filters.listener.tls_inspector");
    assert_eq!(tls.1, Some((true, vec![8080, 9999])));
}

fn inbound_cluster(c: &Cluster) -> (i32, i32, String, bool) {
    let kind = match c.cluster_discovery_type {
        Some(cluster::ClusterDiscoveryType::Type(t)) => t,
        _ => panic!("no type"),
    };
    let bind = c
        .upstream_bind_config
        .as_ref()
        .map(|b| {
            addr(&Some(proto::pb::envoy::config::core::v3::Address {
                address: Some(
                    proto::pb::envoy::config::core::v3::address::Address::SocketAddress(
                        b.source_address.clone().unwrap(),
                    ),
                ),
            }))
        })
        .unwrap_or_default();
    (kind, c.lb_policy, bind, c.cleanup_interval.is_some())
}

#[test]
fn inbound_clusters_reach_the_original_destination_from_127_0_0_6() {
    let ctx = ctx("");
    let cs = clusters(&ctx, &httpbin());
    for port in [8080, 9000, 7070] {
        let c = &cs[&format!("inbound|{port}||")];
        assert_eq!(
            inbound_cluster(c),
            (
                cluster::DiscoveryType::OriginalDst as i32,
                cluster::LbPolicy::ClusterProvided as i32,
                "127.0.0.6:0".into(),
                true
            ),
            "inbound|{port}||"
        );
        assert!(c.load_assignment.is_none());
        assert_eq!(c.alt_stat_name, format!("inbound|{port}||;"));
    }
    // The detected port speaks whatever the client spoke.
    let detected = protocol_options(&cs["inbound|7070||"]).unwrap();
    assert!(matches!(
        detected.upstream_protocol_options,
        Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(_))
    ));
    assert!(protocol_options(&cs["inbound|8080||"]).is_none());
    let ip = &cs["InboundPassthroughCluster"];
    assert_eq!(
        inbound_cluster(ip),
        (
            cluster::DiscoveryType::OriginalDst as i32,
            cluster::LbPolicy::ClusterProvided as i32,
            "127.0.0.6:0".into(),
            false
        )
    );
}

#[test]
fn the_passthrough_source_follows_the_ip_family() {
    let ctx = ctx("");
    let v6 = proxy(&["fd00::3"], &[]);
    let cs = clusters(&ctx, &v6);
    let b = cs["InboundPassthroughCluster"]
        .upstream_bind_config
        .clone()
        .unwrap();
    assert_eq!(b.source_address.unwrap().address, "::6");
    assert!(b.extra_source_addresses.is_empty());
    assert_eq!(
        addr(&listeners(&ctx, &v6)["virtualInbound"].address),
        ":::15006"
    );
    let dual = proxy(&["198.18.0.9", "fd00::9"], &[]);
    let b = clusters(&ctx, &dual)["InboundPassthroughCluster"]
        .upstream_bind_config
        .clone()
        .unwrap();
    assert_eq!(b.source_address.unwrap().address, "127.0.0.6");
    assert_eq!(
        b.extra_source_addresses[0]
            .address
            .as_ref()
            .unwrap()
            .address,
        "::6"
    );
}

const SIDECAR_INGRESS: &str = r#"
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: httpbin, namespace: demo}
spec:
  workloadSelector: {labels: {app: httpbin}}
  ingress:
  - port: {number: 8080, protocol: HTTP, name: http}
    bind: 0.0.0.0
    captureMode: NONE
    defaultEndpoint: 127.0.0.1:9080
  - port: {number: 9000, protocol: TCP, name: tcp}
"#;

#[test]
fn sidecar_ingress_default_endpoint_is_static_and_capture_none_binds() {
    let ctx = ctx(&format!("{STRICT}---\n{SIDECAR_INGRESS}"));
    let p = httpbin();
    let cs = clusters(&ctx, &p);
    // defaultEndpoint: STATIC to it, no bind (localhost is not captured).
    let c = &cs["inbound|8080||"];
    assert_eq!(
        inbound_cluster(c),
        (
            cluster::DiscoveryType::Static as i32,
            cluster::LbPolicy::LeastRequest as i32,
            String::new(),
            false
        )
    );
    let ep = &c.load_assignment.as_ref().unwrap().endpoints[0].lb_endpoints[0];
    let Some(proto::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(e)) =
        &ep.host_identifier
    else {
        panic!("no endpoint")
    };
    assert_eq!(addr(&e.address), "127.0.0.1:9080");
    // No defaultEndpoint: the original destination.
    assert_eq!(
        inbound_cluster(&cs["inbound|9000||"]).0,
        cluster::DiscoveryType::OriginalDst as i32
    );
    // The Sidecar's ingress replaces the Service's ports.
    assert!(!cs.contains_key("inbound|7070||"));

    let ls = listeners(&ctx, &p);
    let bound = &ls["0.0.0.0_8080"];
    assert_eq!(addr(&bound.address), "0.0.0.0:8080");
    assert!(bound.bind_to_port.is_none(), "binds its port");
    assert_eq!(
        summary(bound, 8080),
        vec![row("0.0.0.0_8080", "tls", &[], true, "inbound|8080||")]
    );
    assert!(
        !bound
            .listener_filters
            .iter()
            .any(|f| f.name == "envoy.filters.listener.original_dst")
    );
    let vi = &ls["virtualInbound"];
    assert!(summary(vi, 8080).is_empty());
    assert_eq!(
        summary(vi, 9000),
        vec![row("0.0.0.0_9000", "tls", &[], true, "inbound|9000||")]
    );
}

#[test]
fn no_interception_means_no_virtual_listeners() {
    let ctx = ctx("");
    let mut p = httpbin();
    p.interception_mode = common::InterceptionMode::None;
    let ls = listeners(&ctx, &p);
    assert!(!ls.contains_key("virtualInbound"));
    assert!(!ls.contains_key("virtualOutbound"));
    assert!(!clusters(&ctx, &p).keys().any(|c| c.starts_with("inbound|")));
    // Outbound listeners bind on localhost.
    let l = &ls["127.0.0.1_8000"];
    assert!(l.bind_to_port.is_none());
}

#[test]
fn tproxy_listeners_are_transparent_and_keep_the_source() {
    let ctx = ctx("");
    let mut p = httpbin();
    p.interception_mode = common::InterceptionMode::Tproxy;
    let ls = listeners(&ctx, &p);
    let vi = &ls["virtualInbound"];
    assert!(vi.transparent.unwrap().value);
    assert_eq!(
        vi.listener_filters[1].name,
        "envoy.filters.listener.original_src"
    );
    assert!(ls["virtualOutbound"].transparent.unwrap().value);
}

/// A Sidecar terminating TLS on its HTTPS ingress port 8443 with a Secret,
/// port 9000 (TLS) with files.
const SIDECAR_INGRESS_TLS: &str = r#"
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: demo}
spec:
  ingress:
  - port: {number: 8443, protocol: HTTPS, name: https}
    tls: {mode: SIMPLE, credentialName: app-cert}
  - port: {number: 9000, protocol: TLS, name: tls}
    tls: {mode: MUTUAL, serverCertificate: /c.pem, privateKey: /k.pem, caCertificates: /ca.pem}
"#;

#[test]
fn sidecar_ingress_tls_terminates_with_the_flag_where_mtls_is_disabled() {
    // The flag as istiod publishes it at start-up (validation reads it),
    // and as the push context is built with it.
    istiod::model::features::publish(istiod::model::features::Features {
        enable_tls_on_sidecar_ingress: true,
    });
    let mut disabled = ctx(&format!("{DISABLE}---\n{SIDECAR_INGRESS_TLS}"));
    disabled.features.enable_tls_on_sidecar_ingress = true;
    let l = listeners(&disabled, &httpbin())
        .remove("virtualInbound")
        .unwrap();
    // One chain per port, on TLS, terminated with the user's certificate
    // and serving the protocol after termination.
    assert_eq!(
        summary(&l, 8443),
        vec![row("0.0.0.0_8443", "tls", &[], true, "inbound|8443||")]
    );
    let https = chains_for(&l, 8443)[0];
    assert_eq!(
        https.filters[0].name,
        "envoy.filters.network.http_connection_manager"
    );
    let common = downstream_tls(https).unwrap().common_tls_context.unwrap();
    let sds: Vec<&str> = common
        .tls_certificate_sds_secret_configs
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(sds, ["kubernetes://app-cert"]);
    let tcp = chains_for(&l, 9000)[0];
    assert_eq!(
        tcp.filters.last().unwrap().name,
        "envoy.filters.network.tcp_proxy"
    );
    let files = downstream_tls(tcp).unwrap();
    assert!(files.require_client_certificate.unwrap().value);
    assert_eq!(files.common_tls_context.unwrap().tls_certificates.len(), 1);
    assert!(
        l.listener_filters
            .iter()
            .any(|f| f.name == "envoy.filters.listener.tls_inspector")
    );

    // Under STRICT the mesh's mutual TLS stays (Istio's rule).
    let mut strict = ctx(&format!("{STRICT}---\n{SIDECAR_INGRESS_TLS}"));
    strict.features.enable_tls_on_sidecar_ingress = true;
    let l = listeners(&strict, &httpbin())
        .remove("virtualInbound")
        .unwrap();
    let c = chains_for(&l, 8443)[0];
    let sds: Vec<String> = downstream_tls(c)
        .unwrap()
        .common_tls_context
        .unwrap()
        .tls_certificate_sds_secret_configs
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(sds, ["default"], "the workload certificate");

    // Without the flag in the push context: mesh chains (plain text under
    // DISABLE).
    let off = ctx(&format!("{DISABLE}---\n{SIDECAR_INGRESS_TLS}"));
    let l = listeners(&off, &httpbin())
        .remove("virtualInbound")
        .unwrap();
    assert!(
        chains_for(&l, 8443)
            .iter()
            .all(|c| c.transport_socket.is_none())
    );
}
