//! Requests per second and p99 latency through the ingress gateway
//! (`pilot-agent proxy router`, configured by istiod from the Gateway and
//! VirtualService of `istiod/samples/ingress/`), against the same Envoy
//! binary in the same Pod configured by a static file with the same route:
//! one listener, a virtual host for `httpbin.example.com`, a route to the two
//! httpbin Pods with the gateway's own upstream mTLS settings (copied from
//! its generated cluster, certificates from the same agent over SDS) and
//! only the router filter. The client is a Pod outside the mesh; keep-alive
//! connections, one request in flight each. The gateway round runs first
//! and again last, so drift in the machine's load shows.
//!
//! What the ratio measures: what istiod's generated listener, routes and
//! filters (fault, CORS, Istio's stats prefixes, XFCC and
//! `use_remote_address`) cost at the data plane, not xDS delivery (both are
//! measured after they are configured).
//!
//! `cargo build --release --workspace --bins && target/release/bench_gateway [SECONDS]`
//! (needs root, iproute2 and iptables). Prints a table; asserts nothing about speed.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tests::gateway_pod::{GatewayPod, GatewaySpec};
use tests::load::{Target, machine_load, table, warm_round};
use tests::mesh::{LocalMesh, http_request};
use tests::{Proc, envoy_bin, http_get, wait_for};

/// Client connections, each with one request in flight.
const CONNECTIONS: usize = 4;
const GATEWAY_IP: &str = "198.18.0.20";
const CLIENT_IP: &str = "198.18.0.30";
const HOST: &str = "httpbin.example.com";
/// The gateway's listener (the sample Gateway's port) and the static Envoy's.
const GATEWAY_PORT: u16 = 8080;
const STATIC_PORT: u16 = 9080;
const STATIC_ADMIN_PORT: u16 = 9901;
/// The cluster istiod generates for the route's destination.
const HTTPBIN_CLUSTER: &str = "outbound|8000||httpbin.demo.svc.cluster.local";
/// The sample's httpbin Pods and their port (`istiod/samples/mesh/`).
const HTTPBIN_PODS: [&str; 2] = ["198.18.0.3", "198.18.0.4"];
const HTTPBIN_POD_PORT: u16 = 8080;

/// The gateway Envoy's admin API, from inside its Pod.
fn gateway_admin(gw: &GatewayPod, path: &'static str) -> Value {
    let (code, body) = gw
        .net
        .ns
        .run(move || http_get("127.0.0.1:15000".parse().unwrap(), path))
        .unwrap();
    assert_eq!(code, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// From the gateway's config dump: its `sds-grpc` bootstrap cluster and the
/// transport socket of its cluster to httpbin.
fn gateway_upstream(gw: &GatewayPod) -> (Value, Value) {
    let dump = gateway_admin(gw, "/config_dump");
    let configs = dump["configs"].as_array().unwrap();
    let of = |suffix: &str| {
        configs
            .iter()
            .find(|c| c["@type"].as_str().unwrap_or("").ends_with(suffix))
            .unwrap()
    };
    let sds = of("BootstrapConfigDump")["bootstrap"]["static_resources"]["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "sds-grpc")
        .unwrap()
        .clone();
    let socket = of("ClustersConfigDump")["dynamic_active_clusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["cluster"])
        .find(|c| c["name"] == HTTPBIN_CLUSTER)
        .unwrap()["transport_socket"]
        .clone();
    (sds, socket)
}

/// The static bootstrap: the same route by hand.
fn static_bootstrap(sds_cluster: Value, upstream_tls: Value) -> Value {
    let endpoints: Vec<Value> = HTTPBIN_PODS
        .iter()
        .map(|ip| {
            json!({"endpoint": {"address": {"socket_address": {"address": ip, "port_value": HTTPBIN_POD_PORT}}}})
        })
        .collect();
    json!({
        "node": {"id": "static-baseline", "cluster": "static-baseline"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": STATIC_ADMIN_PORT}}},
        "static_resources": {
            "listeners": [{
                "name": "static",
                "address": {"socket_address": {"address": "0.0.0.0", "port_value": STATIC_PORT}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "static",
                        "route_config": {"virtual_hosts": [{
                            "name": "httpbin",
                            "domains": [HOST, format!("{HOST}:*")],
                            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "httpbin"}}]
                        }]},
                        "http_filters": [{
                            "name": "envoy.filters.http.router",
                            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
                        }]
                    }
                }]}]
            }],
            "clusters": [
                sds_cluster,
                {
                    "name": "httpbin",
                    "type": "STATIC",
                    "connect_timeout": "10s",
                    "load_assignment": {"cluster_name": "httpbin", "endpoints": [{"lb_endpoints": endpoints}]},
                    "transport_socket": upstream_tls
                }
            ]
        }
    })
}

/// Starts the static Envoy in the gateway's Pod, from its directory (the
/// SDS socket path is relative to it), with the gateway Envoy's concurrency.
fn start_static(gw: &GatewayPod, dir: &Path) -> Proc {
    let (sds, socket) = gateway_upstream(gw);
    let concurrency = gateway_admin(gw, "/server_info")["command_line_options"]["concurrency"]
        .as_u64()
        .unwrap();
    let file = dir.join("static-envoy.json");
    std::fs::write(&file, static_bootstrap(sds, socket).to_string()).unwrap();
    let mut cmd = gw.net.ns.command(envoy_bin());
    cmd.current_dir(&gw.dir.dir).args([
        "-c",
        file.to_str().unwrap(),
        "--concurrency",
        &concurrency.to_string(),
        "--base-id",
        "7",
        "--log-level",
        "warn",
    ]);
    println!("static Envoy: --concurrency {concurrency}, as the gateway's");
    Proc::spawn("static-envoy", cmd, &dir.join("static-envoy.log"))
}

/// Waits until `addr` answers 200 for the sample host.
fn wait_serving(client: &tests::netns::Netns, addr: SocketAddr, what: &str) {
    wait_for(what, Duration::from_secs(60), || {
        matches!(http_request(client, addr, HOST, "/"), Ok((200, _))).then_some(())
    });
}

fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let length = Duration::from_secs(seconds);
    println!("load average at start: {}", machine_load());
    let tmp = tempfile::Builder::new()
        .prefix("bench-gateway.")
        .tempdir()
        .unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[("SECRET_TTL", "1h")]);
    mesh.apply_sample("ingress");
    let gw = mesh.start_gateway(&GatewaySpec::ingress(GATEWAY_IP));
    let client = mesh.plain_pod(CLIENT_IP);
    let gateway: SocketAddr = format!("{GATEWAY_IP}:{GATEWAY_PORT}").parse().unwrap();
    let baseline: SocketAddr = format!("{GATEWAY_IP}:{STATIC_PORT}").parse().unwrap();
    wait_serving(&client.ns, gateway, "the gateway");
    let mut static_envoy = start_static(&gw, tmp.path());
    wait_serving(&client.ns, baseline, "the static Envoy");

    let mut rows = Vec::new();
    for (name, addr) in [
        ("gateway (istiod)", gateway),
        ("static file", baseline),
        ("gateway (istiod), again", gateway),
    ] {
        let target = Target::Plain(addr);
        let r = warm_round(&client.ns, &target, HOST, "/", CONNECTIONS, length);
        rows.push((name.to_string(), r));
    }
    static_envoy.terminate(Duration::from_secs(5));
    println!("load average at end: {}", machine_load());
    println!("\n{}", table("HTTP through", "÷ static", &rows, 1));
}
