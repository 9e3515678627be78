//! Requests per second and p99 latency through the ingress gateway
//! (`pilot-agent proxy router`, configured by istiod from the Gateway and
//! VirtualService of `istiod/samples/ingress/`), against the same Envoy
//! binary in the same Pod configured by a static file with the same route:
//! one listener, a virtual host for `httpbin.example.com`, a route to the two
//! httpbin Pods with the gateway's own upstream mTLS settings (copied from
//! its generated cluster, certificates from the same agent over SDS) and
//! only the router filter. The client is a Pod outside the mesh; keep-alive
//! connections, one request in flight each.
//!
//! The same gateway Pod is also measured configured by the Gateway API: the
//! sample's Istio `Gateway` and `VirtualService` are taken out of the config
//! directory and a `Gateway` (class `istio`, bound to the sample gateway's
//! Service by a `Hostname` address, one listener on the same port and
//! hostname) with an `HTTPRoute` carrying the same route are put in. Each
//! round starts once the gateway's config dump shows that configuration
//! (and the route answers 200). The Istio-config round runs first and again
//! last, so drift in the machine's load shows.
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
use tests::load::{Target, machine_load, pct, table, warm_round};
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

/// The sample file holding the Istio `Gateway` and `VirtualService`.
const SAMPLE_FILE: &str = "ingress.yaml";
/// The Gateway API objects, in their own file of the config directory.
const GATEWAY_API_FILE: &str = "gateway-api.yaml";
/// The sample's route as the Gateway API writes it: the listener on the
/// sample Gateway's port and host, bound to the sample gateway's Service.
const GATEWAY_API: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: httpbin-gateway, namespace: istio-system}
spec:
  gatewayClassName: istio
  addresses: [{type: Hostname, value: istio-ingressgateway.istio-system.svc.cluster.local}]
  listeners:
  - name: http
    port: 80
    protocol: HTTP
    hostname: httpbin.example.com
    allowedRoutes: {namespaces: {from: All}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: httpbin, namespace: demo}
spec:
  parentRefs: [{name: httpbin-gateway, namespace: istio-system, sectionName: http}]
  hostnames: [httpbin.example.com]
  rules:
  - matches: [{path: {type: PathPrefix, value: /}}]
    backendRefs: [{name: httpbin, port: 8000}]
"#;
/// The prefix of the Envoy route names istiod gives the HTTPRoute's rules
/// (`<namespace>.<name>.<rule>.<match>`); the VirtualService's are unnamed.
const GATEWAY_API_ROUTE: &str = "demo.httpbin.";

/// Which objects configure the gateway.
#[derive(Clone, Copy, PartialEq)]
enum Config {
    /// The sample's Istio `Gateway` + `VirtualService`.
    Istio,
    /// [`GATEWAY_API`].
    GatewayApi,
}

/// Puts `config` in the config directory, taking the other out.
fn configure(mesh: &LocalMesh, config: Config) {
    let sample =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../istiod/samples/ingress/ingress.yaml");
    let sample = std::fs::read_to_string(sample).unwrap();
    let api_file = mesh.config_dir.join(GATEWAY_API_FILE);
    match config {
        Config::Istio => {
            tests::write_atomically(&mesh.config_dir.join(SAMPLE_FILE), &sample);
            if api_file.exists() {
                std::fs::remove_file(api_file).unwrap();
            }
        }
        Config::GatewayApi => {
            tests::write_atomically(&api_file, GATEWAY_API);
            let without: Vec<&str> = sample
                .split("\n---\n")
                .filter(|doc| {
                    !doc.contains("kind: Gateway\n") && !doc.contains("kind: VirtualService\n")
                })
                .collect();
            assert_eq!(without.len() + 2, sample.split("\n---\n").count());
            tests::write_atomically(&mesh.config_dir.join(SAMPLE_FILE), &without.join("\n---\n"));
        }
    }
}

/// The names of the gateway Envoy's routes in the sample host's virtual host.
fn sample_host_routes(gw: &GatewayPod) -> Vec<String> {
    let dump = gateway_admin(gw, "/config_dump");
    let configs = dump["configs"].as_array().unwrap();
    let Some(routes) = configs.iter().find(|c| {
        c["@type"]
            .as_str()
            .unwrap_or("")
            .ends_with(".RoutesConfigDump")
    }) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    for rc in routes["dynamic_route_configs"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for vh in rc["route_config"]["virtual_hosts"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if vh["domains"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|d| d == HOST)
            {
                for r in vh["routes"].as_array().into_iter().flatten() {
                    names.push(r["name"].as_str().unwrap_or("").to_string());
                }
            }
        }
    }
    names
}

/// Switches the gateway to `config` and waits until its Envoy has exactly
/// that configuration's routes for the sample host and they answer 200.
fn switch(mesh: &LocalMesh, gw: &GatewayPod, client: &tests::netns::Netns, config: Config) {
    configure(mesh, config);
    let what = match config {
        Config::Istio => "the gateway's routes from the Istio Gateway and VirtualService",
        Config::GatewayApi => "the gateway's routes from the Gateway API Gateway and HTTPRoute",
    };
    let mut seen = None;
    wait_for(what, Duration::from_secs(60), || {
        let names = sample_host_routes(gw);
        if seen.as_ref() != Some(&names) {
            println!("routes for {HOST} at the gateway: {names:?}");
            seen = Some(names.clone());
        }
        let api = names
            .iter()
            .filter(|n| n.starts_with(GATEWAY_API_ROUTE))
            .count();
        let applied = match config {
            Config::Istio => !names.is_empty() && api == 0,
            Config::GatewayApi => !names.is_empty() && api == names.len(),
        };
        applied.then_some(())
    });
    let gateway: SocketAddr = format!("{GATEWAY_IP}:{GATEWAY_PORT}").parse().unwrap();
    wait_serving(client, gateway, what);
}

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
    for (name, addr, config) in [
        (
            "gateway (istiod, Istio Gateway + VirtualService)",
            gateway,
            Some(Config::Istio),
        ),
        ("static file", baseline, None),
        (
            "gateway (istiod, Gateway API Gateway + HTTPRoute)",
            gateway,
            Some(Config::GatewayApi),
        ),
        (
            "gateway (istiod, Istio Gateway + VirtualService), again",
            gateway,
            Some(Config::Istio),
        ),
    ] {
        if let Some(config) = config {
            switch(&mesh, &gw, &client.ns, config);
        }
        let target = Target::Plain(addr);
        let r = warm_round(&client.ns, &target, HOST, "/", CONNECTIONS, length);
        rows.push((name.to_string(), r));
    }
    static_envoy.terminate(Duration::from_secs(5));
    println!("load average at end: {}", machine_load());
    println!("\n{}", table("HTTP through", "÷ static", &rows, 1));
    println!("{}", table("HTTP through", "÷ Istio config", &rows, 0));
    let p99 = |i: usize| pct(&rows[i].1.latencies, 0.99).as_secs_f64();
    println!(
        "Gateway API ÷ mean of the two Istio-config rounds: requests/s {:.2}, p99 {:.2}",
        rows[2].1.rps / ((rows[0].1.rps + rows[3].1.rps) / 2.0),
        p99(2) / ((p99(0) + p99(3)) / 2.0)
    );
}
