//! Sidecar injection webhook latency: `POST /inject` on istiod's real webhook
//! stack (`TlsListener`, axum, `webhooks::server::router`, the injector with
//! the chart's values) against `POST /echo`, a route merged into the same
//! router on the same listener that answers the request body back, so the
//! difference is what injection adds to an HTTPS round trip.
//!
//! `cargo bench -p istiod --bench webhook_latency`. The same AdmissionReview
//! (a Deployment-owned Pod with two containers, probes and ports) is sent
//! 1000 times per route at concurrency 1 and 16, each worker one keep-alive
//! HTTPS/1.1 connection sending sequentially, after a warm-up. Every answer is
//! checked (echo: the same bytes; inject: allowed, the request's uid, a
//! non-empty JSON patch); a failed request is counted and printed, and left
//! out of the percentiles. Prints a table; asserts nothing about speed.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use axum::Router;
use axum::body::Bytes;
use axum::http::header::{CONTENT_TYPE, HOST};
use axum::http::{Request, StatusCode};
use axum::routing::post;
use base64::Engine;
use common::env::{MapEnv, Reader};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use istiod::ca::Signer;
use istiod::ca::material::{SelfSignedOptions, load_or_create_self_signed};
use istiod::mesh::Mesh;
use istiod::webhooks::WebhookConfig;
use istiod::webhooks::inject::{InjectMetrics, Injector, InjectorState};
use istiod::webhooks::review;
use istiod::webhooks::server::{self, TlsListener};
use istiod::webhooks::validation::{ValidationMetrics, Validator};
use rustls::pki_types::PrivateKeyDer;
use serde_json::{Value, json};
use tokio::sync::watch;

/// Timed requests per route and concurrency.
const N: usize = 1000;
/// Untimed requests per route and concurrency before the timed ones.
const WARMUP: usize = 200;
/// The concurrencies measured: keep-alive connections, each sequential.
const CONCURRENCIES: [usize; 2] = [1, 16];
/// The name on istiod's serving certificate, as the API server checks it.
const ISTIOD_SAN: &str = "istiod.istio-system.svc";
/// The injector ConfigMap's `config`.
const INJECTOR_CONFIG: &str = "policy: enabled\nalwaysInjectSelector: []\nneverInjectSelector: []\ninjectedAnnotations: {}\ndefaultTemplates: [sidecar]\n";
/// The ConfigMap's `values`: the chart's defaults.
const VALUES: &str = include_str!("../tests/testdata/inject/istio-discovery-values.yaml");
/// A request that takes longer than this fails (and is counted as failed).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The 1, 5 and 15 minute load averages: other work on the machine skews every figure.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The Pod a ReplicaSet's controller creates, as the API server sends it to
/// a mutating webhook: `generateName` but no name yet, no namespace in the
/// metadata, defaults applied.
fn admission_review() -> Value {
    let probe = |path: &str, port: &str| {
        json!({
            "httpGet": {"path": path, "port": port, "scheme": "HTTP"},
            "initialDelaySeconds": 5, "periodSeconds": 10, "timeoutSeconds": 1,
            "successThreshold": 1, "failureThreshold": 3
        })
    };
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "reviews-v1-5b4c8f7d9-",
            "labels": {
                "app": "reviews",
                "version": "v1",
                "pod-template-hash": "5b4c8f7d9"
            },
            "annotations": {
                "kubectl.kubernetes.io/restartedAt": "2026-11-30T10:00:00Z"
            },
            "ownerReferences": [{
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "reviews-v1-5b4c8f7d9",
                "uid": "8f0c4c2e-5a7e-4a8e-9d3b-2f1e6c7b9a01",
                "controller": true,
                "blockOwnerDeletion": true
            }]
        },
        "spec": {
            "serviceAccountName": "bookinfo-reviews",
            "serviceAccount": "bookinfo-reviews",
            "containers": [
                {
                    "name": "reviews",
                    "image": "docker.io/istio/examples-bookinfo-reviews-v1:1.20.2",
                    "imagePullPolicy": "IfNotPresent",
                    "ports": [
                        {"name": "http", "containerPort": 9080, "protocol": "TCP"},
                        {"name": "admin", "containerPort": 9081, "protocol": "TCP"}
                    ],
                    "env": [
                        {"name": "LOG_DIR", "value": "/tmp/logs"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}
                    ],
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                        "limits": {"cpu": "500m", "memory": "512Mi"}
                    },
                    "livenessProbe": probe("/health", "admin"),
                    "readinessProbe": probe("/ready", "http"),
                    "startupProbe": {
                        "tcpSocket": {"port": 9080},
                        "periodSeconds": 2, "failureThreshold": 30,
                        "timeoutSeconds": 1, "successThreshold": 1
                    },
                    "volumeMounts": [
                        {"name": "tmp", "mountPath": "/tmp"},
                        {"name": "wlp-output", "mountPath": "/opt/ibm/wlp/output"},
                        {"name": "kube-api-access-7xk2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}
                    ],
                    "securityContext": {"runAsUser": 1000, "allowPrivilegeEscalation": false},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File"
                },
                {
                    "name": "log-shipper",
                    "image": "docker.io/fluent/fluent-bit:3.1",
                    "imagePullPolicy": "IfNotPresent",
                    "ports": [{"name": "http-metrics", "containerPort": 2020, "protocol": "TCP"}],
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                    "livenessProbe": probe("/", "http-metrics"),
                    "readinessProbe": probe("/api/v1/health", "http-metrics"),
                    "volumeMounts": [
                        {"name": "tmp", "mountPath": "/var/log/app", "readOnly": true},
                        {"name": "kube-api-access-7xk2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}
                    ],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File"
                }
            ],
            "volumes": [
                {"name": "tmp", "emptyDir": {}},
                {"name": "wlp-output", "emptyDir": {}},
                {"name": "kube-api-access-7xk2p", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
                ]}}
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority",
            "priority": 0,
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ]
        },
        "status": {}
    });
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "d4f7b1e2-3c5a-4e8f-9a6b-0c1d2e3f4a5b",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "bookinfo",
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "6a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]
            },
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

/// Checks an `/inject` answer: allowed, for this uid, with a non-empty JSON patch.
fn check_inject(body: &[u8], uid: &str) -> anyhow::Result<()> {
    let v: Value = serde_json::from_slice(body).context("answer is not JSON")?;
    let r = v.get("response").context("no response in the answer")?;
    ensure!(
        r["allowed"] == json!(true),
        "not allowed: {}",
        r.get("status").unwrap_or(&Value::Null)
    );
    ensure!(
        r["uid"] == json!(uid),
        "uid {} is not the request's",
        r["uid"]
    );
    ensure!(r["patchType"] == json!("JSONPatch"), "no JSONPatch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(r["patch"].as_str().context("no patch")?)
        .context("patch is not base64")?;
    let ops: Vec<Value> = serde_json::from_slice(&patch).context("patch is not a JSON array")?;
    ensure!(!ops.is_empty(), "empty patch");
    Ok(())
}

/// One client connection: TLS to the server's address under istiod's
/// certificate name, HTTP/1.1 kept alive, one request at a time (as each of
/// the API server's connections to a webhook carries one call at a time).
type Conn = Arc<tokio::sync::Mutex<SendRequest<Full<Bytes>>>>;

async fn connect(addr: SocketAddr, tls: Arc<rustls::ClientConfig>) -> anyhow::Result<Conn> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = rustls::pki_types::ServerName::try_from(ISTIOD_SAN)?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await?;
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(Arc::new(tokio::sync::Mutex::new(send)))
}

/// Sends `body` to `path` on `conn` and reads the whole answer.
async fn call(conn: &Conn, path: &str, body: &Bytes) -> anyhow::Result<(StatusCode, Bytes)> {
    let mut send = conn.lock().await;
    send.ready().await?;
    let req = Request::post(path)
        .header(HOST, ISTIOD_SAN)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(body.clone()))?;
    let resp = send.send_request(req).await?;
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((status, bytes))
}

/// Checks one answer's body.
type Check = Arc<dyn Fn(&[u8]) -> anyhow::Result<()> + Send + Sync>;

/// What one route at one concurrency gave.
struct Pass {
    /// Latencies of the successful requests, sorted.
    latencies: Vec<Duration>,
    failures: usize,
    first_failure: Option<String>,
    elapsed: Duration,
    /// CPU time of the whole process (client and server) during the pass.
    cpu: Duration,
}

impl Pass {
    /// Nearest-rank percentile.
    fn pct(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((p / 100.0) * self.latencies.len() as f64).ceil() as usize;
        self.latencies[rank.clamp(1, self.latencies.len()) - 1]
    }

    fn max(&self) -> Duration {
        self.latencies.last().copied().unwrap_or_default()
    }
}

/// Sends `n` requests to `path`, at most one in flight per client.
async fn pass(conns: &[Conn], path: &'static str, body: &Bytes, n: usize, check: Check) -> Pass {
    let next = Arc::new(AtomicUsize::new(0));
    let cpu = cpu_time();
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for c in conns {
        let (c, body, next, check) = (c.clone(), body.clone(), next.clone(), check.clone());
        workers.spawn(async move {
            let mut lat = Vec::new();
            let mut failures = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < n {
                let t = Instant::now();
                let answer = tokio::time::timeout(REQUEST_TIMEOUT, call(&c, path, &body))
                    .await
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer in {REQUEST_TIMEOUT:?}")));
                let elapsed = t.elapsed();
                let verdict = answer.and_then(|(status, bytes)| {
                    ensure!(
                        status.is_success(),
                        "HTTP {status}: {}",
                        String::from_utf8_lossy(&bytes)
                    );
                    check(&bytes)
                });
                match verdict {
                    Ok(()) => lat.push(elapsed),
                    Err(e) => failures.push(format!("{e:#}")),
                }
            }
            (lat, failures)
        });
    }
    let mut latencies = Vec::with_capacity(n);
    let mut failures = Vec::new();
    while let Some(r) = workers.join_next().await {
        match r {
            Ok((l, f)) => {
                latencies.extend(l);
                failures.extend(f);
            }
            Err(e) => failures.push(format!("worker task failed: {e}")),
        }
    }
    let elapsed = start.elapsed();
    let cpu = cpu_time().saturating_sub(cpu);
    latencies.sort();
    Pass {
        latencies,
        failures: failures.len(),
        first_failure: failures.into_iter().next(),
        elapsed,
        cpu,
    }
}

/// `f` timed `N` times in a row on this thread, with no HTTP.
fn time_direct(mut f: impl FnMut()) -> Pass {
    let mut latencies: Vec<Duration> = (0..N)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    latencies.sort();
    Pass {
        latencies,
        failures: 0,
        first_failure: None,
        elapsed: Duration::ZERO,
        cpu: Duration::ZERO,
    }
}

/// User plus system CPU time of this process so far, from `/proc/self/stat`
/// (in clock ticks of 1/100 s, Linux's fixed `USER_HZ`).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses: state is
    // field 3, utime 14 and stime 15.
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

/// Established TCP connections whose local port is `port` (the server's side),
/// from `/proc/net/tcp`: shows how many keep-alive connections a pass used.
fn server_connections(port: u16) -> usize {
    let want = format!(":{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].ends_with(&want) && f[3] == "01"
        })
        .count()
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let load_before = loadavg();
    common::tls::install_crypto_provider();

    // istiod's serving certificate, signed by a self-signed root as app.rs does.
    let tmp = tempfile::tempdir()?;
    let bundle = load_or_create_self_signed(
        tmp.path(),
        &SelfSignedOptions {
            trust_domain: "cluster.local".into(),
            ttl: Duration::from_secs(3600),
            rsa_key_size: 2048,
        },
    )?;
    let root_pem = bundle.root_pem.clone();
    let ttl = Duration::from_secs(3600);
    let signer = Signer::new(bundle, ttl, ttl)?;
    let (chain_pem, key) = signer.sign_server_cert(&[ISTIOD_SAN.to_string()], ttl)?;
    let chain = common::pki::pem_certs("serving certificate", &chain_pem)?;
    let key = PrivateKeyDer::Pkcs8(key.serialize_der().into());

    // The injector with the chart's values, the validator, the real router.
    let registry = prometheus::Registry::new();
    let env = MapEnv::default();
    let mut reader = Reader::new(&env);
    let settings = WebhookConfig::read(Some("127.0.0.1:0".parse()?), "istio-system", &mut reader);
    reader.finish().map_err(anyhow::Error::msg)?;
    let state = InjectorState::from_texts(INJECTOR_CONFIG, VALUES, &Mesh::default(), &settings)
        .context("the injector's state from the chart's values")?;
    let (_state_tx, state_rx) = watch::channel(Some(Arc::new(state)));
    let injector = Arc::new(Injector::new(
        state_rx,
        InjectMetrics::new(&registry).expect("fresh registry"),
    ));
    let validator = Arc::new(Validator::new(
        "default",
        ValidationMetrics::new(&registry).expect("fresh registry"),
    ));
    let (_ready_tx, ready_rx) = watch::channel(true);
    let app =
        server::router(Some(injector.clone()), validator, ready_rx).merge(Router::new().route(
            "/echo",
            post(|body: Bytes| async move { ([(CONTENT_TYPE, "application/json")], body) }),
        ));
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let tls = server::tls_config(chain, key)?;
    let listener = TlsListener::new(tcp, tokio_rustls::TlsAcceptor::from(Arc::new(tls)))?;
    let addr = axum::serve::Listener::local_addr(&listener)?;
    tokio::spawn(async move { axum::serve(listener, app).await });

    let review = admission_review();
    let uid = review["request"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let body = Bytes::from(serde_json::to_vec(&review)?);
    let roots = common::tls::root_store("root", &root_pem)?;
    let mut client_tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    client_tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let client_tls = Arc::new(client_tls);
    let echo_check: Check = {
        let body = body.clone();
        Arc::new(move |b: &[u8]| {
            ensure!(b == &body[..], "echo answered other bytes");
            Ok(())
        })
    };
    let inject_check: Check = Arc::new(move |b: &[u8]| check_inject(b, &uid));

    // The injection alone, with no HTTP: what the route adds beyond the handler.
    let req = review::parse(&body)?;
    let no_envs = BTreeMap::new();
    let sample = injector.inject(&req, &no_envs).into_review();
    check_inject(&serde_json::to_vec(&sample)?, &req.uid)?;
    let patch_len = sample["response"]["patch"].as_str().map_or(0, str::len);
    let direct = time_direct(|| {
        std::hint::black_box(injector.inject(&req, &no_envs));
    });
    // The server's whole handler without HTTP: decode, inject, encode.
    let handler = time_direct(|| {
        let req = review::parse(&body).unwrap();
        let answer = injector.inject(&req, &no_envs).into_review();
        std::hint::black_box(serde_json::to_vec(&answer).unwrap());
    });
    // The client's check of an answer: its CPU counts in the passes' CPU
    // column, not in their latencies.
    let answer = serde_json::to_vec(&sample)?;
    let check = time_direct(|| check_inject(&answer, &req.uid).unwrap());

    println!(
        "webhook latency: {N} requests per row after {WARMUP} warm-up, request body {} bytes, \
         inject patch {patch_len} bytes (base64); server {addr}",
        body.len()
    );
    println!(
        "| concurrency | route | p50 ms | p99 ms | max ms | req/s | CPU ms/req | failed | p50 × echo | p99 × echo |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, p) in [
        ("`Injector::inject` direct, 1 thread", &direct),
        ("parse + inject + encode direct, 1 thread", &handler),
        ("client's check of an answer, 1 thread", &check),
    ] {
        println!(
            "| – | {name} | {} | {} | {} | – | – | 0 | – | – |",
            ms(p.pct(50.0)),
            ms(p.pct(99.0)),
            ms(p.max()),
        );
    }
    let mut notes = Vec::new();
    for c in CONCURRENCIES {
        let lingering = server_connections(addr.port());
        let mut clients = Vec::with_capacity(c);
        for _ in 0..c {
            clients.push(connect(addr, client_tls.clone()).await?);
        }
        for (url, check) in [("/echo", &echo_check), ("/inject", &inject_check)] {
            let warm = pass(&clients, url, &body, WARMUP, check.clone()).await;
            if warm.failures > 0 {
                notes.push(format!(
                    "warm-up {url} at concurrency {c}: {} failed, first: {}",
                    warm.failures,
                    warm.first_failure.unwrap_or_default()
                ));
            }
        }
        let echo = pass(&clients, "/echo", &body, N, echo_check.clone()).await;
        let inject = pass(&clients, "/inject", &body, N, inject_check.clone()).await;
        let conns = server_connections(addr.port());
        for (name, p) in [("echo (baseline)", &echo), ("inject", &inject)] {
            let ratio = |q: f64| {
                if std::ptr::eq(p, &echo) {
                    "1.00".to_string()
                } else {
                    format!(
                        "**{:.2}**",
                        p.pct(q).as_secs_f64() / echo.pct(q).as_secs_f64()
                    )
                }
            };
            println!(
                "| {c} | {name} | {} | {} | {} | {:.0} | {:.3} | {} | {} | {} |",
                ms(p.pct(50.0)),
                ms(p.pct(99.0)),
                ms(p.max()),
                p.latencies.len() as f64 / p.elapsed.as_secs_f64(),
                p.cpu.as_secs_f64() * 1000.0 / N as f64,
                p.failures,
                ratio(50.0),
                ratio(99.0),
            );
            if let Some(f) = &p.first_failure {
                notes.push(format!("{name} at concurrency {c}: first failure: {f}"));
            }
        }
        notes.push(format!(
            "concurrency {c}: {conns} server connections established after the passes \
             ({lingering} before its clients connected)"
        ));
        drop(clients);
        // Let the dropped connections close before the next pass counts its own.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for n in notes {
        println!("{n}");
    }
    println!(
        "load average before {load_before}, after {}; {} CPUs",
        loadavg(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    Ok(())
}
