//! Generation for services in every shape: a headless StatefulSet's
//! `ORIGINAL_DST` clusters, per-Pod listeners and DNS names; ServiceEntries
//! of resolution NONE; auto-allocated ServiceEntry addresses in listeners
//! and the name table.

#![allow(clippy::unwrap_used)]

use prost::Message;
use proto::pb::envoy::config::cluster::v3::{Cluster, cluster};
use proto::pb::envoy::config::listener::v3::Listener;

use super::{cds, eds, lds, nds};
use crate::pushctx::Proxy;
use crate::pushctx::context::{IstioContext, context_of_yaml};

/// A three-Pod StatefulSet `web` behind a headless Service (HTTP 8080, TCP
/// 9000) under STRICT mTLS, a ServiceEntry NONE without endpoints and two
/// TCP ServiceEntries on 3306 without addresses.
const MESH: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  clusterIP: None
  selector: {app: web}
  ports: [{name: http, port: 8080}, {name: tcp-echo, port: 9000}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-abc, namespace: demo, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: tcp-echo, port: 9000}]
endpoints:
- {addresses: [198.18.1.10], targetRef: {kind: Pod, name: web-0}}
- {addresses: [198.18.1.11], targetRef: {kind: Pod, name: web-1}}
- {addresses: [198.18.1.12], targetRef: {kind: Pod, name: web-2}}
---
apiVersion: v1
kind: Pod
metadata: {name: web-0, namespace: demo, labels: {app: web, security.istio.io/tlsMode: istio}}
spec: {serviceAccountName: web, hostname: web-0, subdomain: web}
status: {podIP: 198.18.1.10}
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: demo, labels: {app: web, security.istio.io/tlsMode: istio}}
spec: {serviceAccountName: web, subdomain: web}
status: {podIP: 198.18.1.11}
---
apiVersion: v1
kind: Pod
metadata: {name: web-2, namespace: demo, labels: {app: web, security.istio.io/tlsMode: istio}}
spec: {serviceAccountName: web}
status: {podIP: 198.18.1.12}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: strict, namespace: demo}
spec: {mtls: {mode: STRICT}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: anything, namespace: demo}
spec:
  hosts: [db.partner.example]
  ports: [{number: 5432, name: tcp-pg, protocol: TCP}]
  location: MESH_EXTERNAL
  resolution: NONE
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: mysql-a, namespace: demo}
spec:
  hosts: [mysql-a.example]
  ports: [{number: 3306, name: tcp, protocol: TCP}]
  location: MESH_EXTERNAL
  resolution: STATIC
  endpoints: [{address: 198.18.2.1}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: mysql-b, namespace: demo}
spec:
  hosts: [mysql-b.example]
  ports: [{number: 3306, name: tcp, protocol: TCP}]
  location: MESH_EXTERNAL
  resolution: STATIC
  endpoints: [{address: 198.18.2.2}]
"#;

const WEB: &str = "web.demo.svc.cluster.local";

fn sidecar(ip: &str, dns_capture: bool) -> Proxy {
    Proxy {
        proxy_type: common::ProxyType::Sidecar,
        ip: ip.into(),
        ips: vec![ip.into()],
        namespace: "demo".into(),
        dns_capture,
        ..Default::default()
    }
}

fn clusters(ctx: &IstioContext, proxy: &Proxy) -> Vec<Cluster> {
    cds::build(ctx, proxy)
        .iter()
        .map(|r| Cluster::decode(r.resource.value.as_slice()).unwrap())
        .collect()
}

fn listeners(ctx: &IstioContext, proxy: &Proxy) -> Vec<Listener> {
    lds::build(ctx, proxy)
        .iter()
        .map(|r| Listener::decode(r.resource.value.as_slice()).unwrap())
        .collect()
}

fn discovery_type(c: &Cluster) -> cluster::DiscoveryType {
    match c.cluster_discovery_type {
        Some(cluster::ClusterDiscoveryType::Type(t)) => {
            cluster::DiscoveryType::try_from(t).unwrap()
        }
        _ => panic!("{c:?}"),
    }
}

/// The TCP proxy cluster of a listener's only chain.
fn tcp_cluster(l: &Listener) -> String {
    use proto::pb::envoy::config::listener::v3::filter::ConfigType;
    use proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
    let chain = l.filter_chains.first().unwrap();
    let Some(ConfigType::TypedConfig(a)) = &chain.filters[0].config_type else {
        panic!()
    };
    match TcpProxy::decode(a.value.as_slice())
        .unwrap()
        .cluster_specifier
    {
        Some(tcp_proxy::ClusterSpecifier::Cluster(c)) => c,
        other => panic!("{other:?}"),
    }
}

#[test]
fn headless_service_clusters_forward_to_the_original_destination_over_mtls() {
    use proto::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
    let ctx = context_of_yaml(MESH);
    let all = clusters(&ctx, &sidecar("198.18.0.2", true));
    for port in [8080, 9000] {
        let name = format!("outbound|{port}||{WEB}");
        let c = all.iter().find(|c| c.name == name).unwrap();
        assert_eq!(discovery_type(c), cluster::DiscoveryType::OriginalDst);
        assert_eq!(c.lb_policy, cluster::LbPolicy::ClusterProvided as i32);
        assert!(c.eds_cluster_config.is_none());
        // STRICT: mutual TLS to every Pod, without a socket match (the
        // original destination's hosts carry no labels).
        assert!(c.transport_socket_matches.is_empty());
        let Some(proto::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(a)) =
            c.transport_socket.as_ref().unwrap().config_type.as_ref()
        else {
            panic!()
        };
        let tls = UpstreamTlsContext::decode(a.value.as_slice()).unwrap();
        assert_eq!(tls.sni, format!("outbound_.{port}_._.{WEB}"));
        let sans = format!("{:?}", tls.common_tls_context.unwrap());
        assert!(
            sans.contains("spiffe://cluster.local/ns/demo/sa/web"),
            "{sans}"
        );
    }
    // A ServiceEntry NONE: passthrough too, plain text (outside the mesh).
    let pg = all
        .iter()
        .find(|c| c.name == "outbound|5432||db.partner.example")
        .unwrap();
    assert_eq!(discovery_type(pg), cluster::DiscoveryType::OriginalDst);
    assert!(pg.transport_socket.is_none() && pg.transport_socket_matches.is_empty());
}

#[test]
fn gateways_reach_headless_services_through_eds() {
    let ctx = context_of_yaml(MESH);
    let mut gw = sidecar("198.18.0.9", false);
    gw.proxy_type = common::ProxyType::Router;
    let all = clusters(&ctx, &gw);
    let name = format!("outbound|8080||{WEB}");
    let c: Vec<_> = all.iter().filter(|c| c.name == name).collect();
    assert_eq!(c.len(), 1, "one cluster of the name");
    assert_eq!(discovery_type(c[0]), cluster::DiscoveryType::Eds);
    let assignment = eds::build(&ctx, &gw, &[name.clone()].into());
    let cla = proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment::decode(
        assignment[0].resource.value.as_slice(),
    )
    .unwrap();
    let n: usize = cla.endpoints.iter().map(|l| l.lb_endpoints.len()).sum();
    assert_eq!(n, 3, "every Pod: {cla:?}");
}

#[test]
fn tcp_ports_of_a_headless_service_get_a_listener_per_pod_but_its_own() {
    let ctx = context_of_yaml(MESH);
    let names = |ip: &str| -> Vec<String> {
        listeners(&ctx, &sidecar(ip, true))
            .iter()
            .map(|l| l.name.clone())
            .filter(|n| n.ends_with("_9000") || n.ends_with("_8080"))
            .collect()
    };
    assert_eq!(
        names("198.18.0.2"),
        [
            "0.0.0.0_8080",
            "198.18.1.10_9000",
            "198.18.1.11_9000",
            "198.18.1.12_9000"
        ],
        "HTTP on the wildcard (routed by host), TCP per Pod address"
    );
    // A Pod of the set does not send its own traffic outbound.
    assert_eq!(
        names("198.18.1.11"),
        ["0.0.0.0_8080", "198.18.1.10_9000", "198.18.1.12_9000"]
    );
    let all = listeners(&ctx, &sidecar("198.18.0.2", true));
    let web1 = all.iter().find(|l| l.name == "198.18.1.11_9000").unwrap();
    assert_eq!(tcp_cluster(web1), format!("outbound|9000||{WEB}"));
    // The NONE entry without endpoints listens on the wildcard.
    let pg = all.iter().find(|l| l.name == "0.0.0.0_5432").unwrap();
    assert_eq!(tcp_cluster(pg), "outbound|5432||db.partner.example");
}

#[test]
fn auto_allocated_addresses_route_two_tcp_services_on_one_port_apart() {
    let ctx = context_of_yaml(MESH);
    let all = listeners(&ctx, &sidecar("198.18.0.2", true));
    let mysql: Vec<(String, String)> = all
        .iter()
        .filter(|l| l.name.ends_with("_3306"))
        .map(|l| (l.name.clone(), tcp_cluster(l)))
        .collect();
    assert_eq!(mysql.len(), 2, "{mysql:?}");
    for (name, cluster) in &mysql {
        assert!(name.starts_with("240.240."), "{name}");
        assert!(cluster.ends_with("mysql-a.example") || cluster.ends_with("mysql-b.example"));
    }
    assert_ne!(mysql[0].1, mysql[1].1);
    // The name table answers each host with its own address.
    let table = nds::name_table(&ctx, &sidecar("198.18.0.2", true));
    for (name, cluster) in &mysql {
        let host = cluster.rsplit('|').next().unwrap();
        let ip = name.trim_end_matches("_3306");
        assert_eq!(table.table[host].ips, [ip], "{host}");
    }
    // A proxy that does not capture DNS cannot use them: its apps reach
    // the hosts' own addresses, through the catch-all.
    let plain = listeners(&ctx, &sidecar("198.18.0.2", false));
    assert!(!plain.iter().any(|l| l.name.ends_with("_3306")));
}

#[test]
fn the_name_table_answers_a_headless_service_with_every_pod_and_each_pod_by_name() {
    let ctx = context_of_yaml(MESH);
    let table = nds::name_table(&ctx, &sidecar("198.18.0.2", true));
    let web = &table.table[WEB];
    assert_eq!(web.ips, ["198.18.1.10", "198.18.1.11", "198.18.1.12"]);
    assert_eq!(
        (web.shortname.as_str(), web.namespace.as_str()),
        ("web", "demo")
    );
    // spec.hostname, or the Pod's name, under its subdomain; a Pod without
    // a subdomain has no name of its own.
    let web0 = &table.table["web-0.web.demo.svc.cluster.local"];
    assert_eq!(web0.ips, ["198.18.1.10"]);
    assert_eq!(web0.shortname, "web-0.web");
    assert_eq!(
        table.table["web-1.web.demo.svc.cluster.local"].ips,
        ["198.18.1.11"]
    );
    assert!(!table.table.contains_key("web-2.web.demo.svc.cluster.local"));
    // A NONE entry without endpoints has no address to answer with.
    assert!(!table.table.contains_key("db.partner.example"));
}
