//! Faults that hit one Pod: its network link cut for longer than the xDS
//! keepalive, and istiod's CA out of its reach for longer than its
//! certificate's life. Each scenario runs the whole local mesh, injects the
//! fault, lets it heal, and returns what a user would have seen; the tests
//! (`tests/tests/fault_pod.rs`) judge it and `bench_faults_pod` tabulates it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use super::{Outcome, Recovery, Traffic, failures, first_success_after};
use crate::mesh::{HTTPBIN_VIP, HUB_IP, LocalMesh};
use crate::netns::Netns;

/// The gRPC keepalive the link test gives istiod and every agent
/// (`GRPC_KEEPALIVE_INTERVAL`, `GRPC_KEEPALIVE_TIMEOUT`): a dead link is
/// noticed about 4 s after its last sign of life.
pub const KEEPALIVE_ENV: &[(&str, &str)] = &[
    ("GRPC_KEEPALIVE_INTERVAL", "2s"),
    ("GRPC_KEEPALIVE_TIMEOUT", "2s"),
];

/// How long the link stays down at least: well past the keepalive's 4 s.
pub const LINK_OUTAGE: Duration = Duration::from_secs(12);

/// The bound of the link fault's recovery (first success and last ACK
/// after the link returns): Envoy's reconnection backoff to its agent (500
/// ms doubling, 30 s cap) after a 12 s outage, plus the exchange.
pub const LINK_BOUND: Duration = Duration::from_secs(45);

/// The certificate life the CA test's Pod asks for (`SECRET_TTL`).
pub const SHORT_TTL: &str = "20s";

/// The bound of the CA fault's recovery (readiness 200, a fresh certificate
/// at Envoy, a successful request after the CA returns): the agent's
/// retry cap without a valid certificate (5 s) plus a CSR and an SDS push.
pub const CA_BOUND: Duration = Duration::from_secs(20);

/// How long the CA stays away after readiness reported the expiry: past
/// the agent's retry cap without a valid certificate (5 s).
pub const RETRY_HOLD: Duration = Duration::from_secs(8);

/// The port the CA relay listens on in the hub.
pub const CA_RELAY_PORT: u16 = 15112;

/// Traffic pace.
const PACE: Duration = Duration::from_millis(100);

/// The longest any scenario's traffic may run.
const TRAFFIC_LIMIT: Duration = Duration::from_secs(240);

/// One request from `ns` to httpbin's Service as its app would send it
/// (captured by the Pod's iptables into its Envoy), with short timeouts so
/// a request sent into a dead link does not hide the moment it heals:
/// (status, body).
pub fn quick_request(ns: &Netns, path: &str) -> std::io::Result<(u16, String)> {
    quick_request_in(&ns.name, path)
}

/// [`quick_request`] from the namespace named `ns`.
fn quick_request_in(ns: &str, path: &str) -> std::io::Result<(u16, String)> {
    let addr: SocketAddr = format!("{HTTPBIN_VIP}:8000").parse().expect("an address");
    let path = path.to_string();
    crate::netns::run_in(Some(ns), move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        s.set_nodelay(true)?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: httpbin:8000\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes())?;
        let mut buf = String::new();
        s.read_to_string(&mut buf)?;
        Ok(crate::mesh::split_response(&buf))
    })
}

/// Background requests from Pod `pod` to httpbin.
fn traffic_from(mesh: &LocalMesh, pod: &str) -> Traffic {
    let ns = mesh.pod(pod).ns.name.clone();
    Traffic::start(PACE, TRAFFIC_LIMIT, move || {
        quick_request_in(&ns, "/get")
            .map(|(code, _)| code)
            .map_err(|e| e.to_string())
    })
}

/// Takes the hub's end of Pod `pod`'s veth down or up.
pub fn set_link(mesh: &LocalMesh, pod: &str, up: bool) {
    let link = mesh.pod(pod).hub_link.clone();
    let out = mesh
        .hub
        .ns
        .command("ip")
        .args(["link", "set", &link, if up { "up" } else { "down" }])
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip link set {link}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One proxy connection as istiod's HTTP `/debug/syncz` lists it.
#[derive(Clone, Debug)]
pub struct SynczEntry {
    /// `<pod>.<namespace>`.
    pub proxy: String,
    /// Every type sent has been ACKed with the nonce last sent (SYNCED or
    /// NOT_SENT in istioctl's words).
    pub synced: bool,
    /// The version of the routes last sent.
    pub route_version: String,
}

/// istiod's `/debug/syncz`, proxies only (not debug clients).
pub fn syncz(mesh: &LocalMesh) -> Vec<SynczEntry> {
    let http = mesh.istiod.http;
    let Ok((200, body)) = mesh
        .hub
        .ns
        .run(move || crate::http_get(http, "/debug/syncz"))
    else {
        return Vec::new();
    };
    let list: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap_or_default();
    list.iter()
        .filter(|e| !e["proxy"].as_str().unwrap_or("").starts_with("istioctl."))
        .map(|e| {
            let field = |k: String| e[k].as_str().unwrap_or("").to_string();
            let synced = [
                "cluster",
                "listener",
                "endpoint",
                "route",
                "extensionconfig",
            ]
            .iter()
            .all(|t| {
                let sent = field(format!("{t}_sent"));
                sent.is_empty() || sent == field(format!("{t}_acked"))
            });
            SynczEntry {
                proxy: field("proxy".into()),
                synced,
                route_version: field("route_version".into()),
            }
        })
        .collect()
}

/// istiod's connection ID for `proxy` (`/debug/adsz`), if connected.
pub fn connection_id(mesh: &LocalMesh, proxy: &str) -> Option<String> {
    let http = mesh.istiod.http;
    let (_, body) = mesh
        .hub
        .ns
        .run(move || crate::http_get(http, "/debug/adsz"))
        .ok()?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["clients"]
        .as_array()?
        .iter()
        .find(|c| c["proxy"] == proxy)
        .and_then(|c| c["connectionId"].as_str().map(String::from))
}

/// Every proxy SYNCED, each listed once, and `proxy` on the routes of the
/// version `reference` has (the current push).
pub fn synced_on_current(mesh: &LocalMesh, proxy: &str, reference: &str) -> bool {
    let list = syncz(mesh);
    let one = |p: &str| {
        let mut it = list.iter().filter(|e| e.proxy == p);
        match (it.next(), it.next()) {
            (Some(e), None) => Some(e.clone()),
            _ => None,
        }
    };
    let (Some(p), Some(r)) = (one(proxy), one(reference)) else {
        return false;
    };
    list.iter().all(|e| e.synced) && p.route_version == r.route_version
}

/// The VirtualService the link test switches to while the link is down:
/// every request to v2, tagged with a header the app echoes.
const ALL_TO_V2: &str = r#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: httpbin
  namespace: demo
spec:
  hosts:
  - httpbin.demo.svc.cluster.local
  http:
  - name: canary
    headers:
      request:
        set: {x-mesh-epoch: "2"}
    route:
    - destination:
        host: httpbin.demo.svc.cluster.local
        subset: v2
        port: {number: 8000}
      weight: 100
"#;

/// The header [`ALL_TO_V2`] sets, as the app echoes it.
const EPOCH_HEADER: &str = "x-mesh-epoch: 2";

/// Replaces the sample's VirtualService `httpbin` with [`ALL_TO_V2`], the
/// file swapped in one rename so istiod never reads half of it.
fn route_all_to_v2(mesh: &LocalMesh) {
    let file = mesh.config_dir.join("istio.yaml");
    let text = std::fs::read_to_string(&file).expect("the sample's istio.yaml");
    let docs: Vec<String> = text
        .split("\n---")
        .map(|d| {
            if d.contains("kind: VirtualService") {
                format!("\n{ALL_TO_V2}")
            } else {
                d.to_string()
            }
        })
        .collect();
    let tmp = mesh.config_dir.join(".istio.yaml.tmp");
    std::fs::write(&tmp, docs.join("\n---")).expect("write the new config");
    std::fs::rename(&tmp, &file).expect("swap the config in");
}

/// Whether a response shows [`ALL_TO_V2`] in effect.
fn shows_change(body: &str) -> bool {
    body.contains("version=v2") && body.to_ascii_lowercase().contains(EPOCH_HEADER)
}

/// What the link fault showed.
#[derive(Debug)]
pub struct LinkReport {
    /// The figures: requests on the routes that do not cross the cut link
    /// (httpbin-v1's app calling httpbin), first success at the cut-off Pod
    /// and its SYNCED state on the current push, after the link returns.
    pub recovery: Recovery,
    /// How long the link was down.
    pub outage: Duration,
    /// The failures on routes not crossing the cut link.
    pub bystander_failures: Vec<String>,
    /// istiod dropped the cut-off Pod's connection during the outage
    /// (its keepalive noticed).
    pub dropped_by_istiod: bool,
    /// The connection before and after (they differ: the agent reconnected).
    pub connections: (Option<String>, Option<String>),
    /// The cut-off Pod's first response after the link returned, and the
    /// first one showing the change made while it was down (time after the
    /// link returned).
    pub change_seen_after: Option<Duration>,
    /// Five responses in a row at the cut-off Pod once the change was seen.
    pub responses_after: Vec<(u16, String)>,
}

/// The link fault: the mesh with short keepalives; `sleep-1`'s veth (the
/// hub's end) goes down for [`LINK_OUTAGE`] and past istiod dropping its
/// connection; meanwhile the VirtualService changes so every request goes
/// to v2 with a header; then the link comes back.
///
/// Why `sleep-1`'s link: it is a client only, so no other Pod's route
/// crosses it, and the change concerns it (its outbound routes to
/// httpbin). Cutting a server's link would break every client's route to
/// it. The routes that must not fail: `httpbin-v1`'s app calling httpbin
/// (v1 and v2 Pods, over their own links).
pub fn link_down(dir: &Path) -> LinkReport {
    let mesh = LocalMesh::start_tuned(dir, KEEPALIVE_ENV, KEEPALIVE_ENV);
    let victim = "sleep-1.demo";
    crate::wait_for("every proxy SYNCED", Duration::from_secs(30), || {
        synced_on_current(&mesh, victim, "httpbin-v1.demo").then_some(())
    });
    let before = connection_id(&mesh, victim);
    let bystander = traffic_from(&mesh, "httpbin-v1");
    let cut_off = traffic_from(&mesh, "sleep-1");
    crate::wait_for("traffic flowing", Duration::from_secs(20), || {
        (bystander.outcomes().iter().any(Outcome::ok) && cut_off.outcomes().iter().any(Outcome::ok))
            .then_some(())
    });
    let reference_before = syncz(&mesh)
        .into_iter()
        .find(|e| e.proxy == "httpbin-v1.demo")
        .map(|e| e.route_version)
        .unwrap_or_default();

    let down = Instant::now();
    set_link(&mesh, "sleep-1", false);
    // istiod's keepalive notices the silent peer and drops its stream.
    let dropped_by_istiod = (0..400).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        !syncz(&mesh).iter().any(|e| e.proxy == victim)
    });
    route_all_to_v2(&mesh);
    crate::wait_for(
        "httpbin-v1 SYNCED on the new routes",
        Duration::from_secs(30),
        || {
            syncz(&mesh)
                .into_iter()
                .find(|e| e.proxy == "httpbin-v1.demo")
                .filter(|e| e.synced && e.route_version != reference_before)
        },
    );
    if let Some(rest) = LINK_OUTAGE.checked_sub(down.elapsed()) {
        std::thread::sleep(rest);
    }
    set_link(&mesh, "sleep-1", true);
    let up = Instant::now();
    let outage = up - down;

    crate::wait_for("sleep-1 SYNCED on the current push", LINK_BOUND * 2, || {
        synced_on_current(&mesh, victim, "httpbin-v1.demo").then_some(())
    });
    let to_last_ack = up.elapsed();
    let sleep_ns = &mesh.pod("sleep-1").ns;
    let change_seen_after = (0..600)
        .find(|_| {
            let seen =
                quick_request(sleep_ns, "/get").is_ok_and(|(c, b)| c == 200 && shows_change(&b));
            if !seen {
                std::thread::sleep(Duration::from_millis(100));
            }
            seen
        })
        .map(|_| up.elapsed());
    let responses_after = (0..5)
        .map(|_| quick_request(sleep_ns, "/get").unwrap_or((0, String::new())))
        .collect();
    // Traffic a little longer: the healed state holds.
    std::thread::sleep(Duration::from_secs(2));
    let cut_off = cut_off.stop();
    let bystander = bystander.stop();
    let after = connection_id(&mesh, victim);
    LinkReport {
        recovery: Recovery {
            fault: "Pod link down past the xDS keepalive",
            sent: bystander.iter().filter(|o| o.at >= down).count(),
            failed: failures(&bystander).len(),
            to_first_success: first_success_after(&cut_off, up),
            to_last_ack: Some(to_last_ack),
            bound: LINK_BOUND,
        },
        outage,
        bystander_failures: failures(&bystander),
        dropped_by_istiod,
        connections: (before, after),
        change_seen_after,
        responses_after,
    }
}

/// A TCP relay in the hub from `HUB_IP:CA_RELAY_PORT` to istiod's `:15012`:
/// the one Pod's way to the CA. Stopped, its port refuses connections and
/// the ones open are closed, as a CA that went away.
pub struct CaRelay {
    up: Arc<AtomicBool>,
    quit: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<JoinHandle<()>>,
}

impl CaRelay {
    /// Starts the relay in `hub`.
    pub fn start(hub: &Netns) -> CaRelay {
        let up = Arc::new(AtomicBool::new(true));
        let quit = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::<TcpStream>::new()));
        let listen: SocketAddr = format!("{HUB_IP}:{CA_RELAY_PORT}")
            .parse()
            .expect("address");
        let target: SocketAddr = format!("{HUB_IP}:15012").parse().expect("address");
        let bind = move || {
            let l = TcpListener::bind(listen).expect("bind the CA relay");
            l.set_nonblocking(true).expect("non-blocking listener");
            l
        };
        let first = hub.run(bind);
        let thread = {
            let (up, quit, open) = (up.clone(), quit.clone(), open.clone());
            hub.spawn(move || {
                let mut listener = Some(first);
                // Bounded: at most ~10 minutes of polling.
                for _ in 0..30_000 {
                    if quit.load(Ordering::Relaxed) {
                        return;
                    }
                    match (up.load(Ordering::Relaxed), listener.is_some()) {
                        (false, true) => {
                            listener = None;
                            for s in lock(&open).drain(..) {
                                let _ = s.shutdown(std::net::Shutdown::Both);
                            }
                        }
                        (true, false) => listener = Some(bind()),
                        _ => {}
                    }
                    if let Some(l) = &listener {
                        while let Ok((client, _)) = l.accept() {
                            let _ = client.set_nonblocking(false);
                            if let Ok(server) = TcpStream::connect(target) {
                                relay(client, server, &open);
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        CaRelay {
            up,
            quit,
            open,
            thread: Some(thread),
        }
    }

    /// Opens or closes the way to the CA.
    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
        // The relay thread applies it within its poll period.
        std::thread::sleep(Duration::from_millis(100));
    }

    /// `istiod.istio-system.svc:<relay port>`: the Pod's `CA_ADDR` (the name
    /// its hosts file maps to the hub, and istiod's certificate carries).
    pub fn ca_addr() -> String {
        format!("istiod.istio-system.svc:{CA_RELAY_PORT}")
    }
}

impl Drop for CaRelay {
    fn drop(&mut self) {
        self.quit.store(true, Ordering::Relaxed);
        for s in lock(&self.open).drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Copies both ways between `a` and `b` on two threads, keeping clones to
/// close them when the relay stops.
fn relay(a: TcpStream, b: TcpStream, open: &Mutex<Vec<TcpStream>>) {
    let (Ok(a2), Ok(b2), Ok(a3), Ok(b3)) =
        (a.try_clone(), b.try_clone(), a.try_clone(), b.try_clone())
    else {
        return;
    };
    lock(open).extend([a3, b3]);
    let pipe = |mut from: TcpStream, mut to: TcpStream| {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(std::net::Shutdown::Write);
        })
    };
    pipe(a, b2);
    pipe(b, a2);
}

/// The earliest expiry of the certificates Envoy in `ns` holds for its
/// workload (admin `/certs`, `cert_chain` entries).
pub fn envoy_cert_expiry(ns: &Netns) -> Option<SystemTime> {
    let (_, body) = ns
        .run(|| crate::http_get(SocketAddr::from(([127, 0, 0, 1], 15000)), "/certs"))
        .ok()?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["certificates"]
        .as_array()?
        .iter()
        .flat_map(|c| c["cert_chain"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| {
            let at = c["expiration_time"].as_str()?;
            let t = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
                .ok()?;
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(t.unix_timestamp().max(0) as u64))
        })
        .min()
}

/// The Pod's readiness as the kubelet reads it (`:15021/healthz/ready`
/// through Envoy): (status, body).
pub fn readiness(ns: &Netns) -> (u16, String) {
    ns.run(|| crate::http_get(SocketAddr::from(([127, 0, 0, 1], 15021)), "/healthz/ready"))
        .unwrap_or((0, String::new()))
}

/// What the CA fault showed.
#[derive(Debug)]
pub struct CaReport {
    /// The figures: requests from `sleep-1` (its CA reachable) to httpbin;
    /// first success at the cut-off Pod and every proxy SYNCED, after the
    /// CA returns.
    pub recovery: Recovery,
    /// How long the CA was unreachable.
    pub outage: Duration,
    /// The failures on routes whose certificates stayed fresh.
    pub bystander_failures: Vec<String>,
    /// The cut-off Pod's requests sent while its certificate was valid
    /// (more than a second before its expiry), and the failed ones.
    pub while_valid: (usize, Vec<String>),
    /// The cut-off Pod's readiness after its certificate expired.
    pub expired_readiness: (u16, String),
    /// Readiness after the CA returned: how long until 200.
    pub ready_after: Duration,
    /// A certificate at Envoy newer than the expired one: how long after the
    /// CA returned.
    pub new_cert_after: Duration,
    /// The cut-off Pod's requests that failed in all.
    pub cut_off_failures: Vec<String>,
}

/// The CA fault: a Pod `sleep-2` (identity `demo/sleep`) whose agent asks
/// for [`SHORT_TTL`] certificates through a relay ([`CaRelay`]) while its
/// xDS goes straight to istiod; the relay stops until its certificate has
/// expired and readiness said so, then returns.
///
/// Why a relay rather than iptables in the Pod: the CA and xDS share
/// istiod's `:15012`, so a rule matching the CA's traffic would cut xDS too;
/// a separate `CA_ADDR` through a relay takes only the CA away (as a CA
/// outside istiod would go away), and the test can stop and restart it.
pub fn ca_unreachable(dir: &Path) -> CaReport {
    let mut mesh = LocalMesh::start(dir, &[]);
    let relay = CaRelay::start(&mesh.hub.ns);
    let ca_addr = CaRelay::ca_addr();
    mesh.add_pod_with_env(
        "sleep-2",
        "198.18.0.5",
        "sleep",
        None,
        &[("CA_ADDR", &ca_addr), ("SECRET_TTL", SHORT_TTL)],
    );
    let bystander = traffic_from(&mesh, "sleep-1");
    let cut_off = traffic_from(&mesh, "sleep-2");
    crate::wait_for("traffic flowing", Duration::from_secs(20), || {
        (bystander.outcomes().iter().any(Outcome::ok) && cut_off.outcomes().iter().any(Outcome::ok))
            .then_some(())
    });
    let ns = &mesh.pod("sleep-2").ns;

    let down = Instant::now();
    relay.set_up(false);
    // A renewal may have landed just before: read what Envoy holds after.
    std::thread::sleep(Duration::from_millis(500));
    let expiry = crate::wait_for("Envoy's certificate", Duration::from_secs(10), || {
        envoy_cert_expiry(ns)
    });
    let expiry_instant =
        Instant::now() + expiry.duration_since(SystemTime::now()).unwrap_or_default();
    let limit = expiry_instant.saturating_duration_since(Instant::now()) + Duration::from_secs(30);
    let expired_readiness = crate::wait_for("readiness to fail on expiry", limit, || {
        Some(readiness(ns)).filter(|(c, _)| *c == 503)
    });
    // Past the agent's longest wait between CSRs without a valid
    // certificate, so recovery is held to that bound and not luck.
    std::thread::sleep(RETRY_HOLD);
    assert_eq!(readiness(ns).0, 503, "still not ready while the CA is away");
    relay.set_up(true);
    let back = Instant::now();
    crate::wait_for("readiness 200 again", CA_BOUND * 2, || {
        (readiness(ns).0 == 200).then_some(())
    });
    let ready_after = back.elapsed();
    crate::wait_for("a new certificate at Envoy", CA_BOUND * 2, || {
        envoy_cert_expiry(ns).filter(|e| *e > expiry)
    });
    let new_cert_after = back.elapsed();
    crate::wait_for(
        "a request from sleep-2 after the CA returned",
        CA_BOUND * 2,
        || {
            cut_off
                .outcomes()
                .iter()
                .any(|o| o.at >= back && o.ok())
                .then_some(())
        },
    );
    crate::wait_for("every proxy SYNCED", CA_BOUND * 2, || {
        let list = syncz(&mesh);
        (!list.is_empty() && list.iter().all(|e| e.synced)).then_some(())
    });
    let to_last_ack = back.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    let cut_off = cut_off.stop();
    let bystander = bystander.stop();
    let valid: Vec<Outcome> = cut_off
        .iter()
        .filter(|o| o.at + Duration::from_secs(1) < expiry_instant)
        .cloned()
        .collect();
    CaReport {
        recovery: Recovery {
            fault: "CA unreachable past the certificate's expiry",
            sent: bystander.iter().filter(|o| o.at >= down).count(),
            failed: failures(&bystander).len(),
            to_first_success: first_success_after(&cut_off, back),
            to_last_ack: Some(to_last_ack),
            bound: CA_BOUND,
        },
        outage: back - down,
        bystander_failures: failures(&bystander),
        while_valid: (valid.len(), failures(&valid)),
        expired_readiness,
        ready_after,
        new_cert_after,
        cut_off_failures: failures(&cut_off),
    }
}
