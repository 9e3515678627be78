//! Istio's standard metrics on each Pod's merged `:15020/stats/prometheus`,
//! kept by the agent from the access log entries its Envoy streams: requests
//! from sleep to httpbin counted on both sides with Istio's labels, a 503
//! under its own code, and a TCP service's connections and bytes.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tests::gateway_pod::GatewaySpec;
use tests::mesh::{HTTPBIN_VIP, LocalMesh, http_request};

const SLEEP: &str = "spiffe://cluster.local/ns/demo/sa/sleep";
const HTTPBIN: &str = "spiffe://cluster.local/ns/demo/sa/httpbin";
const HTTPBIN_HOST: &str = "httpbin.demo.svc.cluster.local";
const ECHO_HOST: &str = "echo.demo.svc.cluster.local";
const ECHO_VIP: &str = "198.19.0.30";
const HTTPBIN_PODS: [&str; 2] = ["httpbin-v1", "httpbin-v2"];

/// A TCP service in front of an echo server on httpbin-v1's port 9000.
const ECHO_YAML: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: demo}
spec:
  clusterIP: 198.19.0.30
  selector: {app: httpbin, version: v1}
  ports: [{name: tcp, port: 9000, targetPort: 9000}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-1
  namespace: demo
  labels: {kubernetes.io/service-name: echo}
addressType: IPv4
ports: [{name: tcp, port: 9000, protocol: TCP}]
endpoints:
- addresses: [198.18.0.3]
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: demo, name: httpbin-v1}
"#;

/// One sample line of the Prometheus text format.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses `name{k="v",...} value`, with the format's escapes in values.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let bad = || format!("not a sample line: {line:?}");
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => return Err(bad()),
    };
    let mut labels = BTreeMap::new();
    let mut rest = rest;
    if let Some(mut s) = rest.strip_prefix('{') {
        loop {
            if let Some(after) = s.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, after) = s.split_once("=\"").ok_or_else(bad)?;
            let mut value = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next().ok_or_else(bad)? {
                    (_, '\\') => match chars.next().ok_or_else(bad)?.1 {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    (i, '"') => break i,
                    (_, c) => value.push(c),
                }
            };
            if labels.insert(key.to_string(), value).is_some() {
                return Err(format!("label {key} twice: {line:?}"));
            }
            s = &after[end + 1..];
            s = s.strip_prefix(',').unwrap_or(s);
        }
    }
    let value = rest.split_whitespace().next().ok_or_else(bad)?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().map_err(|_| bad())?,
    };
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Parses a whole scrape, refusing what Prometheus refuses: a family typed
/// twice, a line that is not a sample.
fn parse(text: &str) -> Result<Vec<Sample>, String> {
    let mut typed = HashSet::new();
    let mut samples = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let name = t.split_whitespace().next().unwrap_or_default().to_string();
            if !typed.insert(name.clone()) {
                return Err(format!("TYPE of {name} twice"));
            }
        } else if !line.starts_with('#') {
            samples.push(parse_sample(line)?);
        }
    }
    Ok(samples)
}

/// A Pod's merged metrics, parsed.
fn scrape(mesh: &LocalMesh, pod: &str) -> Vec<Sample> {
    scrape_ns(&mesh.pod(pod).ns, pod)
}

/// The merged metrics of the Pod in `ns`, parsed.
fn scrape_ns(ns: &tests::netns::Netns, pod: &str) -> Vec<Sample> {
    let (code, body) = ns
        .run(|| {
            tests::http_get(
                SocketAddr::from(([127, 0, 0, 1], 15020)),
                "/stats/prometheus",
            )
        })
        .unwrap_or_else(|e| panic!("scrape {pod}: {e}"));
    assert_eq!(code, 200, "{pod}'s /stats/prometheus: {body}");
    parse(&body).unwrap_or_else(|e| panic!("{pod}'s metrics are not valid Prometheus text: {e}"))
}

fn matches(s: &Sample, name: &str, pairs: &[(&str, &str)]) -> bool {
    s.name == name
        && pairs
            .iter()
            .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
}

/// The sum of the series of `name` with every label pair, over `pods`.
fn sum(mesh: &LocalMesh, pods: &[&str], name: &str, pairs: &[(&str, &str)]) -> f64 {
    pods.iter()
        .flat_map(|p| scrape(mesh, p))
        .filter(|s| matches(s, name, pairs))
        .map(|s| s.value)
        .sum()
}

/// Polls until the sum is `want`, then checks it stays there (nothing
/// counted twice); panics with the last value after 30 seconds.
fn expect_sum(mesh: &LocalMesh, pods: &[&str], name: &str, pairs: &[(&str, &str)], want: f64) {
    let start = Instant::now();
    let mut last = f64::NAN;
    for _ in 0..300 {
        last = sum(mesh, pods, name, pairs);
        if last == want {
            std::thread::sleep(Duration::from_millis(500));
            let again = sum(mesh, pods, name, pairs);
            assert_eq!(again, want, "{name}{pairs:?} on {pods:?} moved on");
            return;
        }
        if start.elapsed() > Duration::from_secs(30) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{name}{pairs:?} on {pods:?}: {last}, want {want}");
}

/// The labels of one series of `name` with the pairs (on any of `pods`).
fn series(
    mesh: &LocalMesh,
    pods: &[&str],
    name: &str,
    pairs: &[(&str, &str)],
) -> BTreeMap<String, String> {
    pods.iter()
        .flat_map(|p| scrape(mesh, p))
        .find(|s| matches(s, name, pairs))
        .map(|s| s.labels)
        .unwrap_or_else(|| panic!("no {name}{pairs:?} on {pods:?}"))
}

fn call(mesh: &LocalMesh, path: &str) -> u16 {
    let addr: SocketAddr = format!("{HTTPBIN_VIP}:8000").parse().unwrap();
    http_request(&mesh.pod("sleep-1").ns, addr, "httpbin:8000", path)
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
        .0
}

#[test]
fn requests_are_counted_on_both_sides_with_istio_labels() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);

    let ok_source = [
        ("reporter", "source"),
        ("destination_service", HTTPBIN_HOST),
        ("response_code", "200"),
    ];
    let ok_destination = [
        ("reporter", "destination"),
        ("destination_service", HTTPBIN_HOST),
        ("response_code", "200"),
        ("source_principal", SLEEP),
        ("connection_security_policy", "mutual_tls"),
    ];
    let families = [
        "istio_requests_total",
        "istio_request_duration_milliseconds_count",
        "istio_request_bytes_count",
        "istio_response_bytes_count",
    ];
    let before_source: Vec<f64> = families
        .iter()
        .map(|f| sum(&mesh, &["sleep-1"], f, &ok_source))
        .collect();
    let before_destination = sum(
        &mesh,
        &HTTPBIN_PODS,
        "istio_requests_total",
        &ok_destination,
    );

    const N: usize = 20;
    for i in 0..N {
        assert_eq!(call(&mesh, "/headers"), 200, "request {i}");
    }
    for (family, before) in families.iter().zip(&before_source) {
        expect_sum(&mesh, &["sleep-1"], family, &ok_source, before + N as f64);
    }
    expect_sum(
        &mesh,
        &HTTPBIN_PODS,
        "istio_requests_total",
        &ok_destination,
        before_destination + N as f64,
    );

    // Istio's labels, from what each side knows.
    let s = series(&mesh, &["sleep-1"], "istio_requests_total", &ok_source);
    for (k, v) in [
        ("source_workload_namespace", "demo"),
        ("source_app", "sleep"),
        ("source_canonical_service", "sleep"),
        ("source_cluster", "Kubernetes"),
        ("source_principal", SLEEP),
        ("destination_principal", HTTPBIN),
        ("destination_workload_namespace", "demo"),
        ("destination_app", "httpbin"),
        ("destination_canonical_service", "httpbin"),
        ("destination_service_name", "httpbin"),
        ("destination_service_namespace", "demo"),
        ("destination_cluster", "Kubernetes"),
        ("request_protocol", "http"),
        ("grpc_response_status", ""),
        ("response_flags", "-"),
        ("connection_security_policy", "unknown"),
    ] {
        assert_eq!(s.get(k).map(String::as_str), Some(v), "{k} in {s:?}");
    }
    assert!(
        HTTPBIN_PODS.contains(&s["destination_workload"].as_str()),
        "{s:?}"
    );
    assert_eq!(s.len(), 25, "Istio's label set: {s:?}");
    let d = series(
        &mesh,
        &HTTPBIN_PODS,
        "istio_requests_total",
        &ok_destination,
    );
    for (k, v) in [
        ("destination_principal", HTTPBIN),
        ("destination_workload_namespace", "demo"),
        ("destination_app", "httpbin"),
        ("destination_service_name", "httpbin"),
        ("destination_service_namespace", "demo"),
        // Known only through Istio's metadata exchange.
        ("source_workload", "unknown"),
        ("source_app", "unknown"),
    ] {
        assert_eq!(d.get(k).map(String::as_str), Some(v), "{k} in {d:?}");
    }

    // A 503 from the server shows under its own code.
    let failed_source = [
        ("reporter", "source"),
        ("destination_service", HTTPBIN_HOST),
        ("response_code", "503"),
    ];
    let failed_destination = [
        ("reporter", "destination"),
        ("destination_service", HTTPBIN_HOST),
        ("response_code", "503"),
        ("source_principal", SLEEP),
    ];
    let before = sum(&mesh, &["sleep-1"], "istio_requests_total", &failed_source);
    let before_destination = sum(
        &mesh,
        &HTTPBIN_PODS,
        "istio_requests_total",
        &failed_destination,
    );
    const M: usize = 3;
    for _ in 0..M {
        assert_eq!(call(&mesh, "/status/503"), 503);
    }
    expect_sum(
        &mesh,
        &["sleep-1"],
        "istio_requests_total",
        &failed_source,
        before + M as f64,
    );
    // The server counts every attempt the client's retry policy made.
    let start = Instant::now();
    while sum(
        &mesh,
        &HTTPBIN_PODS,
        "istio_requests_total",
        &failed_destination,
    ) < before_destination + M as f64
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "httpbin never counted the 503s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The 200s did not move.
    expect_sum(
        &mesh,
        &["sleep-1"],
        "istio_requests_total",
        &ok_source,
        before_source[0] + N as f64,
    );
}

/// Echoes what it reads on `0.0.0.0:9000` inside httpbin-v1's namespace.
fn serve_echo(mesh: &LocalMesh) {
    use std::io::{Read, Write};
    let listener = mesh
        .pod("httpbin-v1")
        .ns
        .run(|| std::net::TcpListener::bind("0.0.0.0:9000").unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming().take(1000) {
            let Ok(mut c) = conn else { continue };
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(60)));
                let mut buf = [0u8; 4096];
                for _ in 0..100_000 {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if c.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
}

/// A connection from sleep to the echo service that sent `data` and read
/// it back; returned open.
fn echo(mesh: &LocalMesh, data: &[u8]) -> std::io::Result<std::net::TcpStream> {
    use std::io::{Read, Write};
    let data = data.to_vec();
    mesh.pod("sleep-1").ns.run(move || {
        let addr: SocketAddr = format!("{ECHO_VIP}:9000").parse().unwrap();
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(&data)?;
        let mut back = vec![0u8; data.len()];
        s.read_exact(&mut back)?;
        if back != data {
            return Err(std::io::Error::other("echoed something else"));
        }
        Ok(s)
    })
}

#[test]
fn tcp_connections_and_bytes_are_counted_on_both_sides() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    serve_echo(&mesh);
    std::fs::write(mesh.config_dir.join("echo.yaml"), ECHO_YAML).unwrap();

    let source = [("reporter", "source"), ("destination_service", ECHO_HOST)];
    let destination = [
        ("reporter", "destination"),
        ("destination_service", ECHO_HOST),
        ("source_principal", SLEEP),
        ("connection_security_policy", "mutual_tls"),
    ];
    // Until both sides have the service: a connection through it shows up
    // as the echo service's on both sides.
    let start = Instant::now();
    loop {
        if let Ok(s) = echo(&mesh, b"ping") {
            drop(s);
            std::thread::sleep(Duration::from_millis(300));
            if sum(
                &mesh,
                &["sleep-1"],
                "istio_tcp_connections_closed_total",
                &source,
            ) > 0.0
                && sum(
                    &mesh,
                    &["httpbin-v1"],
                    "istio_tcp_connections_closed_total",
                    &destination,
                ) > 0.0
            {
                break;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the echo service never reached both sides' metrics"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let families = [
        "istio_tcp_connections_opened_total",
        "istio_tcp_connections_closed_total",
        "istio_tcp_received_bytes_total",
        "istio_tcp_sent_bytes_total",
    ];
    let before_source: Vec<f64> = families
        .iter()
        .map(|f| sum(&mesh, &["sleep-1"], f, &source))
        .collect();
    let before_destination: Vec<f64> = families
        .iter()
        .map(|f| sum(&mesh, &["httpbin-v1"], f, &destination))
        .collect();

    const K: usize = 1000;
    let data: Vec<u8> = (0..K).map(|i| b'a' + (i % 26) as u8).collect();
    let conn = echo(&mesh, &data).unwrap();
    // Open: counted as opened (when the upstream connected), not closed.
    expect_sum(
        &mesh,
        &["sleep-1"],
        families[0],
        &source,
        before_source[0] + 1.0,
    );
    expect_sum(&mesh, &["sleep-1"], families[1], &source, before_source[1]);
    drop(conn);

    let k = K as f64;
    let want = [1.0, 1.0, k, k];
    for ((family, before), delta) in families.iter().zip(&before_source).zip(want) {
        expect_sum(&mesh, &["sleep-1"], family, &source, before + delta);
    }
    for ((family, before), delta) in families.iter().zip(&before_destination).zip(want) {
        expect_sum(&mesh, &["httpbin-v1"], family, &destination, before + delta);
    }
    let s = series(&mesh, &["sleep-1"], families[0], &source);
    for (k, v) in [
        ("request_protocol", "tcp"),
        ("destination_workload", "httpbin-v1"),
        ("destination_service_name", "echo"),
        ("source_principal", SLEEP),
        ("destination_principal", HTTPBIN),
    ] {
        assert_eq!(s.get(k).map(String::as_str), Some(v), "{k} in {s:?}");
    }
    assert!(!s.contains_key("response_code"), "{s:?}");
}

const GATEWAY_IP: &str = "198.18.0.20";
const CLIENT_IP: &str = "198.18.0.31";
const GATEWAY_ID: &str = "spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway";
const GATEWAY_YAML: &str = r#"apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: httpbin-ingress, namespace: demo}
spec:
  hosts: [httpbin.demo.svc.cluster.local]
  gateways: [istio-system/ingress]
  http:
  - route:
    - destination:
        host: httpbin.demo.svc.cluster.local
        subset: v2
        port: {number: 8000}
"#;

#[test]
fn a_gateway_reports_as_the_source() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    std::fs::write(mesh.config_dir.join("gateway.yaml"), GATEWAY_YAML).unwrap();
    let mut gw = mesh.start_gateway(&GatewaySpec::ingress(GATEWAY_IP));
    let client = mesh.plain_pod(CLIENT_IP);
    let gateway: SocketAddr = format!("{GATEWAY_IP}:8080").parse().unwrap();
    tests::wait_for(
        "httpbin through the gateway",
        Duration::from_secs(60),
        || {
            gw.assert_alive();
            match http_request(&client.ns, gateway, HTTPBIN_HOST, "/headers") {
                Ok((200, _)) => Some(()),
                _ => None,
            }
        },
    );
    let at_gateway = [
        ("reporter", "source"),
        ("destination_service", HTTPBIN_HOST),
        ("destination_workload", "httpbin-v2"),
        ("response_code", "200"),
        ("source_workload_namespace", "istio-system"),
        ("source_app", "istio-ingressgateway"),
        ("source_principal", GATEWAY_ID),
        ("destination_principal", HTTPBIN),
    ];
    let at_httpbin = [
        ("reporter", "destination"),
        ("destination_service", HTTPBIN_HOST),
        ("response_code", "200"),
        ("source_principal", GATEWAY_ID),
        ("connection_security_policy", "mutual_tls"),
    ];
    let gateway_sum = |pairs: &[(&str, &str)]| -> f64 {
        scrape_ns(&gw.net.ns, "gateway")
            .iter()
            .filter(|s| matches(s, "istio_requests_total", pairs))
            .map(|s| s.value)
            .sum()
    };
    // The one request that answered 200 above is counted on both sides
    // (its entries reach the agents a moment later).
    let start = Instant::now();
    while gateway_sum(&at_gateway) < 1.0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the gateway never counted its first request"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    expect_sum(
        &mesh,
        &["httpbin-v2"],
        "istio_requests_total",
        &at_httpbin,
        1.0,
    );
    let before = gateway_sum(&at_gateway);
    let before_httpbin = 1.0;
    const N: usize = 5;
    for _ in 0..N {
        let (code, _) = http_request(&client.ns, gateway, HTTPBIN_HOST, "/headers").unwrap();
        assert_eq!(code, 200);
    }
    let start = Instant::now();
    let mut last = before;
    while last != before + N as f64 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the gateway counted {} of {N} requests",
            last - before
        );
        std::thread::sleep(Duration::from_millis(100));
        last = gateway_sum(&at_gateway);
    }
    expect_sum(
        &mesh,
        &["httpbin-v2"],
        "istio_requests_total",
        &at_httpbin,
        before_httpbin + N as f64,
    );
    gw.assert_alive();
}

#[test]
fn the_sample_parser_refuses_what_prometheus_refuses() {
    assert!(parse("# TYPE a counter\na 1\n# TYPE a counter\na 2\n").is_err());
    assert!(parse("a{b=\"c\" 1\n").is_err());
    let s = parse("# TYPE a counter\na{b=\"x\\\"y\",c=\"\"} 3\n").unwrap();
    assert_eq!(s[0].labels["b"], "x\"y");
    assert_eq!(s[0].labels["c"], "");
    assert_eq!(s[0].value, 3.0);
}
