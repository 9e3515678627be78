//! istiod's pushes as ADS clients of the real binary see them, on its
//! plaintext port with a `--configDir` mesh written by the load tool:
//! proxies with the same view share bytes built once (the XDS cache's
//! `xds_cache_reads`), a change reaches only the proxies that can see it
//! with only the types it alters, and a client that stops reading costs
//! istiod one push and slows nobody else beyond its throttle slot, until
//! `PILOT_XDS_SEND_TIMEOUT` closes its stream.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use pilot_load::client::{Ack, ClientSettings, Event, ProxySpec, run_proxy};
use pilot_load::mesh::{MeshDir, Revision, Shape};
use pilot_load::run::proxy_specs;
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::service::discovery::v3::DiscoveryRequest;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use tests::{Istiod, free_port, http_get};
use tokio::sync::{mpsc, watch};
use tonic::transport::{Channel, Endpoint};

const CDS: usize = 0;
const EDS: usize = 1;
const RDS: usize = 3;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// istiod serving `mesh` on a plaintext port, with `env`.
fn istiod(dir: &Path, mesh: &Path, env: &[(&str, &str)]) -> (Istiod, String) {
    let plaintext = format!("127.0.0.1:{}", free_port());
    let config = mesh.display().to_string();
    let mut all = vec![
        ("TEST_ISTIOD_CONFIG_DIR", config.as_str()),
        ("TEST_ISTIOD_PLAINTEXT_ADDR", plaintext.as_str()),
    ];
    all.extend_from_slice(env);
    let istiod = Istiod::start(&dir.join("istiod"), &all);
    (istiod, format!("http://{plaintext}"))
}

fn metric(istiod: &Istiod, name: &str) -> f64 {
    let (_, body) = http_get(istiod.monitoring, "/metrics").unwrap();
    body.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

async fn channel(addr: &str) -> Channel {
    Endpoint::from_shared(addr.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Simulated proxies reporting every ACK with resource names and hashes.
struct Proxies {
    events: mpsc::UnboundedReceiver<Event>,
    acks: Vec<Ack>,
    _stop: watch::Sender<bool>,
}

impl Proxies {
    async fn start(addr: &str, specs: Vec<ProxySpec>) -> Proxies {
        let (tx, events) = mpsc::unbounded_channel();
        let (stop, stop_rx) = watch::channel(false);
        let (_reconnect, reconnect_rx) = watch::channel(0);
        let settings = ClientSettings {
            record_names: true,
            ..Default::default()
        };
        for spec in specs {
            tokio::spawn(run_proxy(
                spec,
                channel(addr).await,
                settings.clone(),
                tx.clone(),
                reconnect_rx.clone(),
                stop_rx.clone(),
            ));
        }
        Proxies {
            events,
            acks: Vec::new(),
            _stop: stop,
        }
    }

    /// The first ACK matching `f`, among those seen or to come (waiting at
    /// most 60 s); every ACK is kept.
    async fn wait(&mut self, what: &str, f: impl Fn(&Ack) -> bool) -> Ack {
        if let Some(a) = self.acks.iter().find(|a| f(a)) {
            return a.clone();
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some(Event::Ack(a))) => {
                    self.acks.push(a.clone());
                    if f(&a) {
                        return a;
                    }
                }
                Ok(Some(Event::Ended { proxy, error })) => {
                    panic!("proxy {proxy}'s stream ended while waiting for {what}: {error}")
                }
                Ok(None) | Err(_) => {
                    panic!("no ACK for {what} within 60 s; seen: {:?}", self.summary())
                }
            }
        }
    }

    async fn synced(&mut self, proxy: usize) -> Ack {
        self.wait(&format!("proxy {proxy} synced"), |a| {
            a.proxy == proxy && a.synced
        })
        .await
    }

    fn summary(&self) -> Vec<(usize, usize, String, usize)> {
        self.acks
            .iter()
            .map(|a| (a.proxy, a.kind, a.version.to_string(), a.resources))
            .collect()
    }

    /// What `proxy` last received of `kind`: name -> content hash.
    fn holds(&self, proxy: usize, kind: usize) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for a in self
            .acks
            .iter()
            .filter(|a| a.proxy == proxy && a.kind == kind)
        {
            if kind == CDS || kind == 2 {
                out.clear();
            }
            out.extend(a.names.iter().cloned());
        }
        out
    }
}

fn seq(a: &Ack) -> u64 {
    a.version.rsplit('/').next().unwrap().parse().unwrap()
}

fn small_mesh(dir: &Path, sidecars: bool) -> MeshDir {
    let shape = Shape {
        services: 12,
        namespaces: 2,
        pods_per_service: 2,
        virtual_service_every: 1,
        destination_rule_every: 3,
        sidecars,
    };
    MeshDir::write(&dir.join("mesh"), &shape).unwrap()
}

#[test]
fn proxies_with_the_same_view_receive_the_same_bytes_built_once() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = small_mesh(dir.path(), false);
    let (istiod, addr) = istiod(dir.path(), &mesh.dir, &[("PILOT_XDS_CACHE_STATS", "true")]);
    runtime().block_on(async {
        // Pods 0 and 4 are svc-0's and svc-2's first pods, both in ns-0.
        let specs = proxy_specs(&mesh, 5, 0);
        let (a, b) = (specs[0].clone(), specs[4].clone());
        assert_eq!(a.namespace, b.namespace);
        let mut proxies = Proxies::start(&addr, vec![a]).await;
        proxies.synced(0).await;
        let (hits, misses) = (
            metric(&istiod, "xds_cache_reads{type=\"hit\"}"),
            metric(&istiod, "xds_cache_reads{type=\"miss\"}"),
        );
        assert!(misses > 0.0, "the first proxy's resources were built");
        let mut second = Proxies::start(&addr, vec![b]).await;
        second.synced(4).await;
        let hits_after = metric(&istiod, "xds_cache_reads{type=\"hit\"}");
        let misses_after = metric(&istiod, "xds_cache_reads{type=\"miss\"}");
        assert_eq!(
            misses_after, misses,
            "nothing was built again for the second proxy"
        );

        let outbound = |m: BTreeMap<String, u64>| -> BTreeMap<String, u64> {
            m.into_iter()
                .filter(|(n, _)| n.starts_with("outbound|"))
                .collect()
        };
        let (ca, cb) = (
            outbound(proxies.holds(0, CDS)),
            outbound(second.holds(4, CDS)),
        );
        assert_eq!(ca.len(), 12, "one cluster a service (no subsets)");
        assert_eq!(ca, cb, "the same clusters, byte for byte");
        assert_eq!(
            proxies.holds(0, EDS),
            second.holds(4, EDS),
            "the same load assignments"
        );
        assert_eq!(
            proxies.holds(0, RDS),
            second.holds(4, RDS),
            "the same route configuration"
        );
        let shared = ca.len() + proxies.holds(0, EDS).len() + proxies.holds(0, RDS).len();
        assert!(
            hits_after - hits >= shared as f64,
            "every shared resource came from the cache: {} hits for {shared}",
            hits_after - hits
        );
    });
}

#[test]
fn a_change_reaches_only_the_proxies_that_see_it_and_an_endpoint_only_its_clusters() {
    let dir = tempfile::tempdir().unwrap();
    // Each namespace's Sidecar limits its proxies to their namespace.
    let mesh = small_mesh(dir.path(), true);
    let (_istiod, addr) = istiod(dir.path(), &mesh.dir, &[]);
    runtime().block_on(async {
        let specs = proxy_specs(&mesh, 4, 0);
        // Pod 0: svc-0 in ns-0; pod 2: svc-1 in ns-1.
        let (y, x) = (specs[0].clone(), specs[2].clone());
        assert_eq!(
            (y.namespace.as_str(), x.namespace.as_str()),
            ("ns-0", "ns-1")
        );
        let mut p = Proxies::start(&addr, vec![y, x]).await;
        p.synced(0).await;
        let synced = p.synced(2).await;
        let base = p.acks.iter().map(seq).max().unwrap();
        let x_before = p.acks.len();

        // A VirtualService in ns-0 changes: RDS for ns-0's proxy.
        mesh.write_service(
            0,
            Revision {
                timeout: 7,
                ..Default::default()
            },
        )
        .unwrap();
        let vs = p
            .wait("ns-0's RDS push", |a| {
                a.proxy == 0 && a.kind == RDS && seq(a) > base
            })
            .await;
        // An endpoint of svc-3 (ns-1) moves, twice; the second push is a
        // fence: anything the first two pushes sent proxy 2 came before it.
        mesh.write_service(
            3,
            Revision {
                moved_to: Some(500),
                ..Default::default()
            },
        )
        .unwrap();
        let first = p
            .wait("ns-1's EDS push", |a| {
                a.proxy == 2 && a.kind == EDS && seq(a) > seq(&vs)
            })
            .await;
        mesh.write_service(
            3,
            Revision {
                moved_to: Some(501),
                ..Default::default()
            },
        )
        .unwrap();
        p.wait("the fence", |a| {
            a.proxy == 2 && a.kind == EDS && seq(a) > seq(&first)
        })
        .await;

        let x_after: Vec<&Ack> = p.acks[x_before..].iter().filter(|a| a.proxy == 2).collect();
        assert!(seq(&synced) <= base);
        assert!(
            x_after.iter().all(|a| seq(a) != seq(&vs)),
            "ns-1's proxy got nothing of ns-0's change: {x_after:?}"
        );
        for a in &x_after {
            assert_eq!(a.kind, EDS, "an endpoint change is EDS only: {a:?}");
            let names: BTreeSet<&str> = a.names.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(
                names,
                BTreeSet::from(["outbound|8000||svc-3.ns-1.svc.cluster.local"]),
                "only the moved service's clusters"
            );
        }
        assert_eq!(x_after.len(), 2, "one response per endpoint change");
    });
}

/// A state-of-the-world client that asks for clusters and listeners and
/// then reads nothing; its HTTP/2 window (64 KiB) fills with the first
/// response. Returns the response stream, to read later.
async fn stuck_client(
    addr: &str,
    spec: &ProxySpec,
) -> (
    tonic::Streaming<proto::pb::envoy::service::discovery::v3::DiscoveryResponse>,
    mpsc::UnboundedSender<DiscoveryRequest>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(DiscoveryRequest {
        node: Some(Node {
            id: spec.node_id.clone(),
            ..Default::default()
        }),
        type_url: pilot_load::client::CLUSTER.into(),
        ..Default::default()
    })
    .unwrap();
    // Envoy's smallest windows, so the first response fills them.
    let channel = Endpoint::from_shared(addr.to_string())
        .unwrap()
        .initial_stream_window_size(Some(65_535))
        .initial_connection_window_size(Some(65_535))
        .connect()
        .await
        .unwrap();
    let mut client =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(usize::MAX);
    let stream = client
        .stream_aggregated_resources(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (stream, tx)
}

fn big_mesh(dir: &Path) -> MeshDir {
    let shape = Shape {
        services: 400,
        namespaces: 4,
        pods_per_service: 1,
        virtual_service_every: 0,
        destination_rule_every: 0,
        sidecars: false,
    };
    MeshDir::write(&dir.join("mesh"), &shape).unwrap()
}

fn syncz(istiod: &Istiod, proxy: &str) -> serde_json::Value {
    let (_, body) = http_get(istiod.http, "/debug/syncz").unwrap();
    let all: serde_json::Value = serde_json::from_str(&body).unwrap();
    all.as_array()
        .unwrap()
        .iter()
        .find(|c| c["proxy"] == proxy)
        .cloned()
        .unwrap_or_default()
}

#[test]
fn a_client_that_stops_reading_holds_one_push_and_slows_nobody_else() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = big_mesh(dir.path());
    // Two pushes at a time: the stuck client can take one turn, never both.
    let (istiod, addr) = istiod(dir.path(), &mesh.dir, &[("PILOT_PUSH_THROTTLE", "2")]);
    runtime().block_on(async {
        let specs = proxy_specs(&mesh, 4, 0);
        let (mut stuck, _requests) = stuck_client(&addr, &specs[3]).await;
        let stuck_id = "svc-3-0.ns-3";
        tests::wait_for(
            "the stuck client's first push",
            Duration::from_secs(30),
            || {
                let s = syncz(&istiod, stuck_id);
                (!s["cluster_version"].as_str().unwrap_or_default().is_empty()).then_some(())
            },
        );
        let first_version = syncz(&istiod, stuck_id)["cluster_version"].clone();
        let mut p = Proxies::start(&addr, specs[..3].to_vec()).await;
        for i in 0..3 {
            p.synced(i).await;
        }
        let mut last = p.acks.iter().map(seq).max().unwrap();
        for rev in 1..=10 {
            let started = Instant::now();
            mesh.write_service(
                0,
                Revision {
                    label: rev,
                    ..Default::default()
                },
            )
            .unwrap();
            for i in 0..3 {
                let a = p
                    .wait("the others' push", |a| {
                        a.proxy == i && a.kind == CDS && seq(a) > last
                    })
                    .await;
                assert!(a.resources > 400, "the whole mesh");
            }
            last = p.acks.iter().map(seq).max().unwrap();
            eprintln!("push {rev} reached the others in {:?}", started.elapsed());
        }
        // istiod did not queue the pushes the stuck client missed.
        assert_eq!(
            syncz(&istiod, stuck_id)["cluster_version"],
            first_version,
            "nothing more was queued for the stuck client"
        );
        let rss = std::fs::read_to_string(format!("/proc/{}/status", istiod.proc.pid())).unwrap();
        eprintln!(
            "istiod {}",
            rss.lines().find(|l| l.starts_with("VmRSS")).unwrap()
        );

        // Reading again, it gets its first response, then the latest push
        // only (the ten it missed were merged), not ten pushes.
        let first = stuck.message().await.unwrap().unwrap();
        assert_eq!(
            serde_json::Value::String(first.version_info.clone()),
            first_version
        );
        let latest = tokio::time::timeout(Duration::from_secs(30), stuck.message())
            .await
            .expect("the merged push")
            .unwrap()
            .unwrap();
        let latest_seq: u64 = latest
            .version_info
            .rsplit('/')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(latest_seq, last, "the latest push, in one");
        let none = tokio::time::timeout(Duration::from_secs(2), stuck.message()).await;
        assert!(none.is_err(), "no queue of older pushes follows: {none:?}");
    });
}

#[test]
fn a_push_not_written_within_the_send_timeout_closes_its_stream() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = big_mesh(dir.path());
    // One push at a time: the stuck client blocks everyone until the timeout.
    let (istiod, addr) = istiod(
        dir.path(),
        &mesh.dir,
        &[
            ("PILOT_PUSH_THROTTLE", "1"),
            ("PILOT_XDS_SEND_TIMEOUT", "2s"),
        ],
    );
    runtime().block_on(async {
        let specs = proxy_specs(&mesh, 2, 0);
        let (mut stuck, _requests) = stuck_client(&addr, &specs[1]).await;
        tests::wait_for("the stuck client's turn", Duration::from_secs(30), || {
            let s = syncz(&istiod, "svc-1-0.ns-1");
            (!s["cluster_version"].as_str().unwrap_or_default().is_empty()).then_some(())
        });
        let mut p = Proxies::start(&addr, specs[..1].to_vec()).await;
        p.synced(0).await;
        assert_eq!(metric(&istiod, "pilot_xds_write_timeout"), 1.0);
        // The stuck client, reading at last, finds its stream ended by istiod.
        let status = loop {
            match stuck.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the stream ended without a status"),
                Err(status) => break status,
            }
        };
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        assert_eq!(status.message(), "timeout sending");
    });
}
