//! Access logs and tracing, configured by the mesh config and the Telemetry
//! API, as a user of the mesh sees them: the lines Envoy writes to the
//! Pod's output, and the spans a Zipkin collector receives.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tests::gateway_pod::GatewaySpec;
use tests::mesh::{HTTPBIN_VIP, LocalMesh, http_request_with};
use tests::netns::Netns;

const HTTPBIN_CLUSTER: &str = "outbound|8000||httpbin.demo.svc.cluster.local";
/// The collector Pod (no sidecar) behind Service `zipkin.istio-system`.
const ZIPKIN_IP: &str = "198.18.0.9";

fn serial() -> std::sync::MutexGuard<'static, ()> {
    tests::mesh::one_mesh_at_a_time()
}

/// Starts the sample mesh with `mesh_config` as istiod's mesh config.
fn start(dir: &std::path::Path, mesh_config: &str) -> LocalMesh {
    std::fs::create_dir_all(dir.join("istiod")).unwrap();
    std::fs::write(dir.join("istiod/mesh.yaml"), mesh_config).unwrap();
    LocalMesh::start(dir, &[])
}

fn write_config(mesh: &LocalMesh, file: &str, text: &str) {
    let tmp = mesh.config_dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, mesh.config_dir.join(file)).unwrap();
}

/// Drops the sample's canary VirtualService (requests then go to the
/// Service's own cluster, `outbound|8000||httpbin...`) and waits until
/// sleep's access log shows it.
fn route_to_the_service(mesh: &LocalMesh) {
    let istio = mesh.config_dir.join("istio.yaml");
    let text = std::fs::read_to_string(&istio).unwrap();
    let kept: Vec<&str> = text
        .split("\n---")
        .filter(|doc| !doc.contains("kind: VirtualService"))
        .collect();
    write_config(mesh, "istio.yaml", &kept.join("\n---"));
    let mut k = 0;
    poll("the service's own cluster", Duration::from_secs(30), || {
        k += 1;
        let path = format!("/route-{k}");
        assert_eq!(call(mesh, &path, &[]), 200);
        // The path ends at a space (TEXT) or a quote (JSON).
        let this = |l: &String| l.contains(&format!("{path} ")) || l.contains(&format!("{path}\""));
        poll("sleep to log", Duration::from_secs(10), || {
            let l: Vec<String> = lines_with(mesh, "sleep-1", &path)
                .into_iter()
                .filter(this)
                .collect();
            (!l.is_empty()).then_some(l)
        })
        .iter()
        .any(|l| l.contains(HTTPBIN_CLUSTER))
        .then_some(())
    });
}

/// The listeners istiod gave `pod`'s Envoy, from its config dump, as JSON.
fn dynamic_listeners(mesh: &LocalMesh, pod: &str) -> Option<String> {
    listeners_in(&mesh.pod(pod).ns)
}

/// The listeners istiod gave the Envoy of network namespace `ns`.
fn listeners_in(ns: &Netns) -> Option<String> {
    let (_, dump) = ns
        .run(|| tests::http_get(SocketAddr::from(([127, 0, 0, 1], 15000)), "/config_dump"))
        .ok()?;
    let dump: serde_json::Value = serde_json::from_str(&dump).ok()?;
    let listeners = dump["configs"]
        .as_array()?
        .iter()
        .find(|c| c.get("dynamic_listeners").is_some())?;
    Some(listeners.to_string())
}

/// What a Pod's agent and Envoy wrote to their output.
fn output(mesh: &LocalMesh, pod: &str) -> String {
    mesh.pods.iter().find(|p| p.0 == pod).unwrap().3.log()
}

/// The lines of `pod`'s output that mention `marker`.
fn lines_with(mesh: &LocalMesh, pod: &str, marker: &str) -> Vec<String> {
    output(mesh, pod)
        .lines()
        .filter(|l| l.contains(marker))
        .map(str::to_string)
        .collect()
}

/// A request from sleep's app to httpbin (through sleep's sidecar) for
/// `path`, with `headers`; returns the status.
fn call(mesh: &LocalMesh, path: &str, headers: &[(&str, &str)]) -> u16 {
    let addr: SocketAddr = format!("{HTTPBIN_VIP}:8000").parse().unwrap();
    http_request_with(&mesh.pod("sleep-1").ns, addr, "httpbin:8000", path, headers)
        .map(|(code, _)| code)
        .unwrap_or(0)
}

/// Polls `f` every 200ms until it returns `Some`, for at most `limit`.
fn poll<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn access_log_file_logs_each_request_in_istios_format_and_telemetry_turns_it_off_per_workload() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = start(tmp.path(), "accessLogFile: /dev/stdout\n");
    route_to_the_service(&mesh);
    const N: usize = 5;
    for i in 0..N {
        assert_eq!(call(&mesh, &format!("/text-{i}"), &[]), 200);
    }
    // One line per request on the client, in Istio's default TEXT format.
    let lines = poll("sleep's access log lines", Duration::from_secs(20), || {
        let l = lines_with(&mesh, "sleep-1", "/text-");
        (l.len() >= N).then_some(l)
    });
    assert_eq!(lines.len(), N, "{lines:#?}");
    for (i, line) in lines.iter().enumerate() {
        assert!(line.starts_with('['), "{line}");
        assert!(
            line.contains(&format!("\"GET /text-{i} HTTP/1.1\" 200 ")),
            "{line}"
        );
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert!(fields.contains(&HTTPBIN_CLUSTER), "{line}");
        assert!(fields.contains(&"\"httpbin:8000\""), "authority: {line}");
    }
    // The server side logs the requests it received too.
    let inbound = poll(
        "httpbin's access log lines",
        Duration::from_secs(20),
        || {
            let l: Vec<String> = ["httpbin-v1", "httpbin-v2"]
                .iter()
                .flat_map(|p| lines_with(&mesh, p, "/text-"))
                .collect();
            (l.len() >= N).then_some(l)
        },
    );
    assert_eq!(inbound.len(), N, "{inbound:#?}");
    assert!(
        inbound.iter().all(|l| l.contains("inbound|8080||")),
        "{inbound:#?}"
    );

    // A Telemetry for sleep only turns its access log off.
    write_config(
        &mesh,
        "telemetry.yaml",
        "apiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: quiet-sleep, namespace: demo}\nspec:\n  selector: {matchLabels: {app: sleep}}\n  accessLogging: [{disabled: true}]\n",
    );
    let server_logged = |marker: &str| {
        ["httpbin-v1", "httpbin-v2"]
            .iter()
            .any(|p| !lines_with(&mesh, p, marker).is_empty())
    };
    // Envoy writes its access log in batches: wait until sleep's Envoy
    // has the config without its logger, then call.
    poll(
        "sleep's access logger to go",
        Duration::from_secs(30),
        || {
            let listeners = dynamic_listeners(&mesh, "sleep-1")?;
            (!listeners.contains("envoy.access_loggers.file")).then_some(())
        },
    );
    for i in 0..3 {
        assert_eq!(call(&mesh, &format!("/quiet-{i}"), &[]), 200);
    }
    for i in 0..3 {
        let marker = format!("/quiet-{i} ");
        poll("httpbin to log", Duration::from_secs(10), || {
            server_logged(&marker).then_some(())
        });
    }
    assert!(lines_with(&mesh, "sleep-1", "/quiet-").is_empty());

    // An ingress gateway logs what it forwards, with the same format.
    write_config(&mesh, "gateway.yaml", GATEWAY);
    let mut gw = mesh.start_gateway(&GatewaySpec::ingress(GATEWAY_IP));
    let client = mesh.plain_pod(CLIENT_IP);
    let gateway: SocketAddr = format!("{GATEWAY_IP}:8080").parse().unwrap();
    poll(
        "httpbin through the gateway",
        Duration::from_secs(60),
        || {
            gw.assert_alive();
            let r = http_request_with(&client.ns, gateway, "httpbin.example.com", "/ingress", &[]);
            matches!(r, Ok((200, _))).then_some(())
        },
    );
    let line = poll("the gateway's access log", Duration::from_secs(20), || {
        gw.agent
            .log()
            .lines()
            .find(|l| l.contains("\"GET /ingress HTTP/1.1\" 200 "))
            .map(str::to_string)
    });
    assert!(line.contains(HTTPBIN_CLUSTER), "{line}");
    assert!(line.contains("\"httpbin.example.com\""), "{line}");

    // A filter expression: the gateway logs only what failed.
    write_config(
        &mesh,
        "gateway-telemetry.yaml",
        "apiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: errors-only, namespace: istio-system}\nspec:\n  selector: {matchLabels: {istio: ingressgateway}}\n  accessLogging: [{filter: {expression: 'response.code >= 400'}}]\n",
    );
    poll("the gateway's filter", Duration::from_secs(30), || {
        listeners_in(&gw.net.ns)?
            .contains("envoy.access_loggers.extension_filters.cel")
            .then_some(())
    });
    let ok = http_request_with(
        &client.ns,
        gateway,
        "httpbin.example.com",
        "/filtered-ok",
        &[],
    );
    assert!(matches!(ok, Ok((200, _))), "{ok:?}");
    let missing = http_request_with(
        &client.ns,
        gateway,
        "nowhere.example.com",
        "/filtered-404",
        &[],
    );
    assert!(matches!(missing, Ok((404, _))), "{missing:?}");
    poll(
        "the 404 in the gateway's log",
        Duration::from_secs(20),
        || {
            gw.agent
                .log()
                .contains("\"GET /filtered-404 HTTP/1.1\" 404 ")
                .then_some(())
        },
    );
    assert!(!gw.agent.log().contains("/filtered-ok"), "a 200 was logged");
}

const GATEWAY_IP: &str = "198.18.0.20";
const CLIENT_IP: &str = "198.18.0.30";
const GATEWAY: &str = r#"apiVersion: networking.istio.io/v1
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
  hosts: [httpbin.example.com]
  gateways: [istio-system/ingress]
  http:
  - route:
    - destination: {host: httpbin.demo.svc.cluster.local, port: {number: 8000}}
"#;

/// The spans a Zipkin-compatible collector received: one JSON object per
/// span, from every `POST /api/v2/spans`.
type Spans = Arc<Mutex<Vec<serde_json::Value>>>;

/// A Zipkin collector: accepts `POST /api/v2/spans` (a JSON array of
/// spans, HTTP/1.1, fixed length or chunked), answers 202.
fn zipkin_collector(ns: &Netns, addr: SocketAddr) -> Spans {
    let listener = ns.run(move || std::net::TcpListener::bind(addr).unwrap());
    let spans: Spans = Arc::default();
    let record = spans.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(10_000) {
            let Ok(mut c) = conn else { continue };
            let record = record.clone();
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(60)));
                let mut buf = Vec::new();
                for _ in 0..100_000 {
                    let Some((head, body)) = read_request(&mut c, &mut buf) else {
                        return;
                    };
                    if head.starts_with("post /api/v2/spans")
                        && let Ok(serde_json::Value::Array(list)) =
                            serde_json::from_slice::<serde_json::Value>(&body)
                    {
                        record.lock().unwrap().extend(list);
                    }
                    let ok = "HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n";
                    if c.write_all(ok.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    spans
}

/// Reads one request (head, lower-cased, and body) from `c`; `None` at
/// the end.
fn read_request(c: &mut std::net::TcpStream, buf: &mut Vec<u8>) -> Option<(String, Vec<u8>)> {
    let mut chunk = [0u8; 8192];
    let mut fill = |buf: &mut Vec<u8>| match c.read(&mut chunk) {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    };
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if !fill(buf) {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    buf.drain(..end);
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim().to_string())
        })
    };
    let body = if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                if !fill(buf) {
                    return None;
                }
            };
            let size_line = String::from_utf8_lossy(&buf[..line_end]).to_string();
            let size = usize::from_str_radix(size_line.split(';').next()?.trim(), 16).ok()?;
            while buf.len() < line_end + 2 + size + 2 {
                if !fill(buf) {
                    return None;
                }
            }
            body.extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
            buf.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break body;
            }
        }
    } else {
        let len: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        while buf.len() < len {
            if !fill(buf) {
                return None;
            }
        }
        buf.drain(..len).collect()
    };
    Some((head, body))
}

/// The trace IDs of spans whose tags mention `marker` (the request's path).
fn traces_with(spans: &Spans, marker: &str) -> BTreeSet<String> {
    spans
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s["tags"].to_string().contains(marker))
        .filter_map(|s| s["traceId"].as_str().map(str::to_string))
        .collect()
}

const ZIPKIN_SERVICE: &str = "apiVersion: v1
kind: Service
metadata: {name: zipkin, namespace: istio-system}
spec:
  clusterIP: 198.19.0.50
  ports:
  - {name: http-zipkin, port: 9411, targetPort: 9411}
  - {name: grpc-otlp, port: 4317, targetPort: 4317}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: zipkin-1
  namespace: istio-system
  labels: {kubernetes.io/service-name: zipkin}
addressType: IPv4
ports:
- {name: http-zipkin, port: 9411, protocol: TCP}
- {name: grpc-otlp, port: 4317, protocol: TCP}
endpoints:
- addresses: [198.18.0.9]
  conditions: {ready: true}
";

fn mesh_tracing(percentage: u32) -> String {
    format!(
        "apiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {{name: mesh-default, namespace: istio-system}}\nspec:\n  tracing:\n  - providers: [{{name: zipkin}}]\n    randomSamplingPercentage: {percentage}\n    customTags: {{suite: {{literal: {{value: telemetry-e2e}}}}}}\n"
    )
}

#[test]
fn json_access_logs_and_zipkin_spans_follow_the_sampling_percentage() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = start(
        tmp.path(),
        "accessLogFile: /dev/stdout\naccessLogEncoding: JSON\nextensionProviders:\n- name: zipkin\n  zipkin: {service: zipkin.istio-system.svc.cluster.local, port: 9411}\n- name: otel\n  opentelemetry: {service: zipkin.istio-system.svc.cluster.local, port: 4317, maxTagLength: 100, grpc: {timeout: 2s}}\n",
    );
    let collector_pod = mesh.plain_pod(ZIPKIN_IP);
    let spans = zipkin_collector(
        &collector_pod.ns,
        format!("{ZIPKIN_IP}:9411").parse().unwrap(),
    );
    write_config(&mesh, "zipkin.yaml", ZIPKIN_SERVICE);
    route_to_the_service(&mesh);

    // JSON access logs: one valid JSON object per request, Istio's keys.
    const N: usize = 4;
    for i in 0..N {
        assert_eq!(call(&mesh, &format!("/json-{i}"), &[]), 200);
    }
    let lines = poll(
        "sleep's JSON access log lines",
        Duration::from_secs(20),
        || {
            let l = lines_with(&mesh, "sleep-1", "/json-");
            (l.len() >= N).then_some(l)
        },
    );
    assert_eq!(lines.len(), N, "{lines:#?}");
    for (i, line) in lines.iter().enumerate() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert_eq!(v["method"], "GET", "{v}");
        assert_eq!(v["path"], format!("/json-{i}"), "{v}");
        assert!(
            v["response_code"] == 200 || v["response_code"] == "200",
            "{v}"
        );
        assert_eq!(v["upstream_cluster"], HTTPBIN_CLUSTER, "{v}");
        assert_eq!(v["authority"], "httpbin:8000", "{v}");
        for key in ["start_time", "duration", "request_id", "upstream_host"] {
            assert!(v.get(key).is_some(), "{key} missing: {v}");
        }
    }

    // Tracing at 100%: every request's trace reaches the collector.
    write_config(&mesh, "telemetry.yaml", &mesh_tracing(100));
    let mut k = 0;
    poll("the first span", Duration::from_secs(40), || {
        k += 1;
        assert_eq!(call(&mesh, &format!("/warmup-{k}"), &[]), 200);
        std::thread::sleep(Duration::from_millis(500));
        (!traces_with(&spans, "/warmup-").is_empty()).then_some(())
    });
    for i in 0..N {
        assert_eq!(call(&mesh, &format!("/traced-{i}"), &[]), 200);
    }
    let traced = poll("a trace per request", Duration::from_secs(30), || {
        let t = traces_with(&spans, "/traced-");
        (t.len() >= N).then_some(t)
    });
    assert_eq!(traced.len(), N, "{traced:?}");
    {
        let all = spans.lock().unwrap();
        let ours = all
            .iter()
            .find(|s| s["tags"].to_string().contains("/traced-0"))
            .unwrap();
        assert_eq!(ours["tags"]["suite"], "telemetry-e2e", "custom tag: {ours}");
    }

    // At 0%: no request is traced; a request the client asks to trace
    // (x-client-trace-id, client sampling 100%) is the marker that spans
    // still flow.
    write_config(&mesh, "telemetry.yaml", &mesh_tracing(0));
    poll("sampling to drop to 0", Duration::from_secs(30), || {
        let l = dynamic_listeners(&mesh, "sleep-1")?;
        (l.contains("\"random_sampling\":{}") && !l.contains("\"random_sampling\":{\"value\""))
            .then_some(())
    });
    for i in 0..N {
        assert_eq!(call(&mesh, &format!("/unsampled-{i}"), &[]), 200);
    }
    assert_eq!(
        call(&mesh, "/marker", &[("x-client-trace-id", "marker-1")]),
        200
    );
    poll("the marker's span", Duration::from_secs(30), || {
        (!traces_with(&spans, "/marker").is_empty()).then_some(())
    });
    assert!(
        traces_with(&spans, "/unsampled-").is_empty(),
        "requests were traced at 0%"
    );

    // An OpenTelemetry provider for httpbin only: its Envoy takes the
    // tracer (a rejected listener would stay on the previous config), and
    // requests still flow.
    write_config(
        &mesh,
        "otel.yaml",
        "apiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: otel, namespace: demo}\nspec:\n  selector: {matchLabels: {app: httpbin}}\n  tracing: [{providers: [{name: otel}], randomSamplingPercentage: 100}]\n",
    );
    poll(
        "httpbin's OpenTelemetry tracer",
        Duration::from_secs(30),
        || {
            let l = dynamic_listeners(&mesh, "httpbin-v1")?;
            let v: serde_json::Value = serde_json::from_str(&l).ok()?;
            let active: Vec<String> = v["dynamic_listeners"]
                .as_array()?
                .iter()
                .map(|d| d["active_state"].to_string())
                .collect();
            let errors = v["dynamic_listeners"]
                .as_array()?
                .iter()
                .filter(|d| d.get("error_state").is_some())
                .count();
            assert_eq!(errors, 0, "httpbin rejected a listener: {l}");
            active
                .iter()
                .any(|a| a.contains("envoy.tracers.opentelemetry"))
                .then_some(())
        },
    );
    assert_eq!(call(&mesh, "/after-otel", &[]), 200);
}
