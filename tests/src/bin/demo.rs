//! The local mesh demo (the README's first command): istiod on the sample
//! config, three Pods (sleep, httpbin v1 and v2) each with pilot-agent and a
//! real Envoy in a network namespace of its own, captured by Istio's
//! iptables rules as `istio-init` writes them; sleep's app (curl, as an
//! ordinary user) calls `http://httpbin:8000/` as if there were no mesh, and
//! both Envoys carry it over mutual TLS. A summary says what happened.
//!
//! An ingress gateway Pod (`pilot-agent proxy router`, Istio's
//! `istio: ingressgateway`) takes `httpbin.example.com` into the mesh from
//! the Gateway and VirtualService of `istiod/samples/ingress/`; it is
//! published on the machine's loopback (as a NodePort or `kubectl
//! port-forward` would), and `curl` on the machine calls it too.
//!
//! `--seconds N` sets how long requests flow (default 20); `--keep` leaves
//! the mesh running until Ctrl-C so the config directory can be edited live;
//! `--ingress-port P` is the loopback port of the ingress (default 8080).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tests::gateway_pod::{GatewayPod, GatewaySpec};
use tests::mesh::{LocalMesh, host_curl};

/// The ingress gateway Pod's address on the hub.
const INGRESS_IP: &str = "198.18.0.20";
/// The port its Gateway listens on.
const INGRESS_POD_PORT: u16 = 8080;
/// The host the sample Gateway admits.
const INGRESS_HOST: &str = "httpbin.example.com";

/// What the requests of one path (sleep's sidecar, or the ingress) got.
#[derive(Default)]
struct Tally {
    by_version: BTreeMap<String, usize>,
    client_ids: BTreeMap<String, usize>,
    server_ids: BTreeMap<String, usize>,
    failed: usize,
}

impl Tally {
    fn record(&mut self, result: Result<(u16, String), String>) -> Option<String> {
        let Ok((200, body)) = result else {
            self.failed += 1;
            return None;
        };
        let v = field(&body, "version=").to_string();
        *self.by_version.entry(v.clone()).or_default() += 1;
        for part in field(&body, "xfcc=").split(';') {
            if let Some(uri) = part.strip_prefix("URI=") {
                *self.client_ids.entry(uri.to_string()).or_insert(0) += 1;
            }
            if let Some(by) = part.strip_prefix("By=") {
                *self.server_ids.entry(by.to_string()).or_insert(0) += 1;
            }
        }
        Some(v)
    }

    fn answered(&self) -> usize {
        self.by_version.values().sum()
    }

    fn print(&self, what: &str) {
        let total = self.answered();
        println!("  {what}: {total} answered, {} failed", self.failed);
        for (v, n) in &self.by_version {
            println!(
                "    httpbin {v}: {n} ({:.1}%)",
                *n as f64 * 100.0 / total.max(1) as f64
            );
        }
        for (id, n) in &self.client_ids {
            println!("    client identity as the server saw it (XFCC URI): {id} ({n} requests)");
        }
        for (id, n) in &self.server_ids {
            println!(
                "    server identity as its sidecar presented it (XFCC By): {id} ({n} requests)"
            );
        }
    }
}

/// Starts the ingress gateway, publishes it on `127.0.0.1:<port>` and waits
/// until `curl` on the machine gets httpbin through it.
fn start_ingress(mesh: &LocalMesh, port: u16) -> (GatewayPod, String) {
    mesh.apply_sample("ingress");
    let mut gw = mesh.start_gateway(&GatewaySpec::ingress(INGRESS_IP));
    let target = format!("{INGRESS_IP}:{INGRESS_POD_PORT}").parse().unwrap();
    let local = gw
        .net
        .ns
        .forward_from(format!("127.0.0.1:{port}").parse().unwrap(), target)
        .unwrap_or_else(|e| {
            panic!("cannot publish the ingress on 127.0.0.1:{port}: {e} (choose another with --ingress-port)")
        });
    let url = format!("http://{local}/headers");
    tests::wait_for("the ingress gateway", Duration::from_secs(60), || {
        gw.assert_alive();
        matches!(ingress_curl(&url), Ok((200, _))).then_some(())
    });
    println!(
        "  Pod {:<11} {INGRESS_IP:<11} pilot-agent proxy router, pid {}: the ingress gateway, published on the machine at {local}",
        "ingress",
        gw.agent.pid()
    );
    (gw, url)
}

fn ingress_curl(url: &str) -> Result<(u16, String), String> {
    host_curl(&["-H", &format!("Host: {INGRESS_HOST}")], url)
}

fn field<'a>(body: &'a str, key: &str) -> &'a str {
    body.lines().find_map(|l| l.strip_prefix(key)).unwrap_or("")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds: u64 = args
        .iter()
        .skip_while(|a| *a != "--seconds")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let keep = args.iter().any(|a| a == "--keep");
    let ingress_port: u16 = args
        .iter()
        .skip_while(|a| *a != "--ingress-port")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(8080);
    // Ctrl-C ends the request loop, so the Pods and namespaces are cleaned up.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let _ = tokio::signal::ctrl_c().await;
            });
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
        });
    }
    let tmp = tempfile::Builder::new()
        .prefix("mesh-demo.")
        .tempdir()
        .unwrap();
    println!("Starting the local mesh in {} ...", tmp.path().display());
    let mesh = LocalMesh::start(tmp.path(), &[("SECRET_TTL", "1h")]);
    println!(
        "istiod: hub namespace {}, config from {}",
        mesh.hub.ns.name,
        mesh.config_dir.display()
    );
    for (name, net, dir, agent) in &mesh.pods {
        println!(
            "  Pod {name:<11} {:<11} pilot-agent pid {} (Envoy bootstrap {})",
            net.ip,
            agent.pid(),
            dir.dir.join("etc/istio/proxy/envoy-rev.json").display()
        );
    }
    let (_ingress, ingress_url) = start_ingress(&mesh, ingress_port);
    let rules = mesh
        .pod("sleep-1")
        .iptables_save()
        .lines()
        .filter(|l| l.starts_with("-A ISTIO_") || l.contains("-j ISTIO_"))
        .count();
    println!(
        "  each Pod: `pilot-agent istio-iptables` wrote Istio's rules ({rules} in sleep-1); pilot-agent and Envoy run as uid 1337, sleep's curl as uid 1000"
    );
    if keep {
        println!(
            "Edit {} to change the split; Ctrl-C to stop.",
            mesh.config_dir.join("istio.yaml").display()
        );
    }
    println!(
        "sleep-1's app runs `curl http://httpbin:8000/headers` for {seconds}s (VirtualService: 90% v1, 10% v2),\n\
         and every fifth time the machine runs `curl -H 'Host: {INGRESS_HOST}' {ingress_url}` ..."
    );

    let mut mesh_calls = Tally::default();
    let mut ingress_calls = Tally::default();
    let mut window: BTreeMap<String, usize> = BTreeMap::new();
    let start = Instant::now();
    let mut last_report = Instant::now();
    let mut i = 0u64;
    while (start.elapsed() < Duration::from_secs(seconds) || keep)
        && !stop.load(std::sync::atomic::Ordering::SeqCst)
    {
        if let Some(v) = mesh_calls.record(mesh.app_curl("sleep-1", "http://httpbin:8000/headers"))
        {
            *window.entry(v).or_default() += 1;
        }
        if i.is_multiple_of(5) {
            ingress_calls.record(ingress_curl(&ingress_url));
        }
        i += 1;
        if last_report.elapsed() >= Duration::from_secs(5) {
            println!(
                "  t={:>3}s  last 5s: {:?}",
                start.elapsed().as_secs(),
                window
            );
            window.clear();
            last_report = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("\nSummary");
    mesh_calls.print("sleep -> httpbin (sidecar to sidecar)");
    ingress_calls.print("machine -> ingress gateway -> httpbin");
    println!(
        "\nTo watch the split change live: run `scripts/demo.sh --keep`, then edit the weights in\n  {} (VirtualService httpbin) while it runs; istiod pushes the change within a second. Ctrl-C stops it.",
        mesh.config_dir.join("istio.yaml").display()
    );
    let ok = |t: &Tally| t.failed == 0 && t.answered() > 0;
    if !ok(&mesh_calls) || !ok(&ingress_calls) {
        std::process::exit(1);
    }
}
