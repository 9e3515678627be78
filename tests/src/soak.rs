//! The soak: the local mesh under steady traffic (sleep -> httpbin) while
//! workload certificates rotate and an operator keeps editing the
//! VirtualService's weights; what it sent and lost, how many rotations and
//! edits reached the Envoys, and the resident memory of istiod, each agent
//! and each Envoy after a warm-up and at the end.
//!
//! Shared by `target/debug/soak` (the long run) and `tests/tests/soak.rs`
//! (its short form in CI). Every observation is a user-visible one: HTTP
//! statuses and bodies, the serial numbers Envoy's admin `/certs` shows and
//! the weights in Envoy's route configuration (`/config_dump`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::fault::{Outcome, Traffic};
use crate::mesh::{HTTPBIN_VIP, LocalMesh};

/// Envoy's admin address inside each Pod.
const ENVOY_ADMIN: ([u8; 4], u16) = ([127, 0, 0, 1], 15000);
/// The sample's VirtualService weights (v1, v2) in `istio.yaml`.
const SAMPLE_WEIGHTS: (u32, u32) = (90, 10);
/// The weights the edits alternate between, first the one after the sample's.
const EDIT_WEIGHTS: [(u32, u32); 2] = [(10, 90), (90, 10)];
/// How long an edit may take to show in sleep's route configuration before
/// the soak calls it lost.
const EDIT_LIMIT: Duration = Duration::from_secs(15);
/// How often each Envoy's `/certs` is read.
const CERTS_EVERY: Duration = Duration::from_secs(2);
/// How often resident memory is sampled.
const RSS_EVERY: Duration = Duration::from_secs(1);
/// The longest window of samples the start and end figures are taken over.
const RSS_WINDOW: Duration = Duration::from_secs(60);
/// The main loop's tick.
const TICK: Duration = Duration::from_millis(250);
/// The subset cluster of each version, as Istio names outbound clusters.
const V1_CLUSTER: &str = "outbound|8000|v1|httpbin.demo.svc.cluster.local";
const V2_CLUSTER: &str = "outbound|8000|v2|httpbin.demo.svc.cluster.local";

/// What to run.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    /// How long traffic, rotations and edits run after the warm-up.
    pub duration: Duration,
    /// How long they run before the start reading of resident memory.
    pub warmup: Duration,
    /// At most one request per `pace`.
    pub pace: Duration,
    /// The agents' `SECRET_TTL`; they rotate at half of it
    /// (`SECRET_GRACE_PERIOD_RATIO` 0.5).
    pub secret_ttl: Duration,
    /// A VirtualService weight edit every `edit_every`.
    pub edit_every: Duration,
    /// Where the mesh lives.
    pub dir: PathBuf,
}

impl SoakConfig {
    /// The soak's defaults: 30 minutes after a 2-minute warm-up, a request
    /// every 50 ms, certificates rotating every 10 s, an edit every 20 s.
    pub fn new(dir: PathBuf) -> SoakConfig {
        SoakConfig {
            duration: Duration::from_secs(30 * 60),
            warmup: Duration::from_secs(120),
            pace: Duration::from_millis(50),
            secret_ttl: Duration::from_secs(20),
            edit_every: Duration::from_secs(20),
            dir,
        }
    }
}

/// Resident memory (VmRSS, KiB) of one process.
#[derive(Clone, Debug)]
pub struct Rss {
    /// `istiod`, `agent sleep-1`, `envoy sleep-1`, ...
    pub label: String,
    /// The process id.
    pub pid: u32,
    /// Whether its growth decides the soak (istiod and agents; not Envoy).
    pub judged: bool,
    /// The first reading after the warm-up.
    pub start_kib: u64,
    /// The last reading.
    pub end_kib: u64,
    /// Mean and highest reading over the start window (a reading a second
    /// from the end of the warm-up, for [`SoakReport::rss_window`]).
    pub start_window: (u64, u64),
    /// Mean and highest reading over the last window before the end.
    pub end_window: (u64, u64),
}

fn pct(from: u64, to: u64) -> f64 {
    (to as f64 - from as f64) * 100.0 / from.max(1) as f64
}

impl Rss {
    /// Growth from the first to the last reading, in percent.
    pub fn point_growth_pct(&self) -> f64 {
        pct(self.start_kib, self.end_kib)
    }

    /// Growth of the window mean, in percent.
    pub fn mean_growth_pct(&self) -> f64 {
        pct(self.start_window.0, self.end_window.0)
    }

    /// Growth of the window peak, in percent.
    pub fn peak_growth_pct(&self) -> f64 {
        pct(self.start_window.1, self.end_window.1)
    }

    /// The growth the soak is judged by: the larger of the window mean's and
    /// the window peak's. Single readings swing with where they fall in a
    /// rotation cycle (the agent hands memory back a few seconds after each
    /// one), so windows spanning several cycles are compared.
    pub fn growth_pct(&self) -> f64 {
        self.mean_growth_pct().max(self.peak_growth_pct())
    }
}

/// One weight edit and when sleep's Envoy showed it.
#[derive(Clone, Debug)]
pub struct Edit {
    /// The (v1, v2) weights written.
    pub weights: (u32, u32),
    /// From the rename to the route configuration showing them (`None`:
    /// not seen within [`EDIT_LIMIT`]).
    pub seen_after: Option<Duration>,
    /// Requests answered by (v1, v2) while these weights were in force.
    pub answered: (u64, u64),
}

/// What a soak did and saw.
#[derive(Clone, Debug)]
pub struct SoakReport {
    /// The configuration it ran with.
    pub config: SoakConfig,
    /// Warm-up plus duration, as measured.
    pub elapsed: Duration,
    /// Requests sent (warm-up included).
    pub sent: usize,
    /// Failed requests: anything but a 200, described with when (seconds
    /// from the start of traffic).
    pub failures: Vec<String>,
    /// Per Pod: distinct workload certificate serial numbers its Envoy
    /// served, minus the first (the rotations seen).
    pub rotations: BTreeMap<String, usize>,
    /// Every weight edit.
    pub edits: Vec<Edit>,
    /// Resident memory per process.
    pub rss: Vec<Rss>,
    /// The length of the start and end windows of [`Rss`].
    pub rss_window: Duration,
}

impl SoakReport {
    /// Edits that reached sleep's Envoy.
    pub fn edits_seen(&self) -> usize {
        self.edits.iter().filter(|e| e.seen_after.is_some()).count()
    }

    /// The judged processes whose resident memory grew by `limit_pct` or more.
    pub fn grown(&self, limit_pct: f64) -> Vec<&Rss> {
        self.rss
            .iter()
            .filter(|r| r.judged && r.growth_pct() >= limit_pct)
            .collect()
    }

    /// The report as the soak prints it.
    pub fn render(&self) -> String {
        let c = &self.config;
        let d = common::duration::format;
        let mut out = String::new();
        let mut line = |s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        line(format!(
            "duration: {} of traffic after a {} warm-up ({} in all); a request every {}, SECRET_TTL {} (rotation at half of it), a weight edit every {}",
            d(c.duration),
            d(c.warmup),
            d(Duration::from_secs(self.elapsed.as_secs())),
            d(c.pace),
            d(c.secret_ttl),
            d(c.edit_every)
        ));
        line(format!(
            "requests: {} sent, {} failed",
            self.sent,
            self.failures.len()
        ));
        for f in self.failures.iter().take(5) {
            line(format!("  failure: {f}"));
        }
        let rot: Vec<String> = self
            .rotations
            .iter()
            .map(|(p, n)| format!("{p} {n}"))
            .collect();
        line(format!(
            "rotations (new serial numbers in Envoy /certs): {}",
            rot.join(", ")
        ));
        let delays: Vec<Duration> = self.edits.iter().filter_map(|e| e.seen_after).collect();
        let max = delays.iter().max().copied().unwrap_or_default();
        line(format!(
            "weight edits: {} done, {} seen in sleep-1's route config (slowest {} ms)",
            self.edits.len(),
            self.edits_seen(),
            max.as_millis()
        ));
        for w in EDIT_WEIGHTS {
            let (a, b) = self
                .edits
                .iter()
                .filter(|e| e.weights == w)
                .fold((0, 0), |(a, b), e| (a + e.answered.0, b + e.answered.1));
            let share = a as f64 * 100.0 / (a + b).max(1) as f64;
            line(format!(
                "  while {}/{}: v1 answered {a}, v2 {b} (v1 {share:.1} %)",
                w.0, w.1
            ));
        }
        line(format!(
            "resident memory (VmRSS from /proc/<pid>/status, KiB, read every {}): start = first reading after the {} warm-up, end = last reading; mean and peak over the {} after the warm-up and the {} before the end; judged growth = the larger of the mean's and the peak's",
            d(RSS_EVERY),
            d(c.warmup),
            d(self.rss_window),
            d(self.rss_window)
        ));
        line(format!(
            "  {:<17} {:>7} {:>9} {:>9} {:>8} {:>10} {:>10} {:>8} {:>10} {:>10} {:>8} {:>8}",
            "process",
            "pid",
            "start",
            "end",
            "growth",
            "start mean",
            "end mean",
            "growth",
            "start peak",
            "end peak",
            "growth",
            "judged"
        ));
        for r in &self.rss {
            line(format!(
                "  {:<17} {:>7} {:>9} {:>9} {:>7.2}% {:>10} {:>10} {:>7.2}% {:>10} {:>10} {:>7.2}% {:>8}",
                r.label,
                r.pid,
                r.start_kib,
                r.end_kib,
                r.point_growth_pct(),
                r.start_window.0,
                r.end_window.0,
                r.mean_growth_pct(),
                r.start_window.1,
                r.end_window.1,
                r.peak_growth_pct(),
                if r.judged {
                    format!("{:.2}%", r.growth_pct())
                } else {
                    "info".to_string()
                }
            ));
        }
        out
    }
}

/// VmRSS of `pid` in KiB (0 if it is gone).
pub fn vm_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The first child of `pid` (the Envoy an agent started).
fn child_of(pid: u32) -> Option<u32> {
    crate::first_child(pid)
}

/// A GET to the Envoy admin of Pod `pod`.
fn admin_get(mesh: &LocalMesh, pod: &str, path: &'static str) -> Option<String> {
    mesh.pod(pod)
        .ns
        .run(move || crate::http_get(SocketAddr::from(ENVOY_ADMIN), path).ok())
        .filter(|(code, _)| *code == 200)
        .map(|(_, body)| body)
}

/// The serial numbers of the workload certificates (SPIFFE SAN) in an
/// Envoy's `/certs` answer.
pub fn workload_serials(certs_json: &str) -> BTreeSet<String> {
    let v: serde_json::Value = serde_json::from_str(certs_json).unwrap_or_default();
    let mut out = BTreeSet::new();
    for cert in v["certificates"].as_array().into_iter().flatten() {
        for c in cert["cert_chain"].as_array().into_iter().flatten() {
            let spiffe = c["subject_alt_names"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| {
                    s["uri"]
                        .as_str()
                        .is_some_and(|u| u.starts_with("spiffe://"))
                });
            if spiffe && let Some(serial) = c["serial_number"].as_str() {
                out.insert(serial.to_string());
            }
        }
    }
    out
}

/// The (v1, v2) weights of the httpbin route in a `/config_dump` of route
/// configurations, if one route splits between the two subsets.
pub fn route_weights(config_dump: &str) -> Option<(u32, u32)> {
    fn walk(v: &serde_json::Value, found: &mut Option<(u32, u32)>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(clusters) = m
                    .get("weighted_clusters")
                    .and_then(|w| w["clusters"].as_array())
                {
                    let weight = |name: &str| {
                        clusters
                            .iter()
                            .find(|c| c["name"] == name)
                            .and_then(|c| c["weight"].as_u64())
                    };
                    if let (Some(a), Some(b)) = (weight(V1_CLUSTER), weight(V2_CLUSTER)) {
                        *found = Some((a as u32, b as u32));
                    }
                }
                m.values().for_each(|x| walk(x, found));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, found)),
            _ => {}
        }
    }
    let v: serde_json::Value = serde_json::from_str(config_dump).ok()?;
    let mut found = None;
    walk(&v, &mut found);
    found
}

/// The sample's `istio.yaml` with the VirtualService's weights set.
fn with_weights(template: &str, (v1, v2): (u32, u32)) -> String {
    // Both weights are found in the sample before either is written, so a
    // new v1 weight equal to the sample's v2 weight is not taken for it.
    let (a, b) = (
        format!("weight: {}", SAMPLE_WEIGHTS.0),
        format!("weight: {}", SAMPLE_WEIGHTS.1),
    );
    let (Some(i), Some(j)) = (template.find(&a), template.find(&b)) else {
        return template.to_string();
    };
    let mut spans = [(i, a.len(), v1), (j, b.len(), v2)];
    spans.sort_by_key(|s| std::cmp::Reverse(s.0));
    let mut out = template.to_string();
    for (at, len, w) in spans {
        out.replace_range(at..at + len, &format!("weight: {w}"));
    }
    out
}

/// Answers per version, counted by the traffic thread.
#[derive(Default)]
struct Split {
    v1: AtomicU64,
    v2: AtomicU64,
}

impl Split {
    fn read(&self) -> (u64, u64) {
        (
            self.v1.load(Ordering::Relaxed),
            self.v2.load(Ordering::Relaxed),
        )
    }
}

/// Steady traffic from sleep's network (as its app would call
/// `http://httpbin:8000/`), a fresh connection per request.
fn start_traffic(mesh: &LocalMesh, cfg: &SoakConfig, split: Arc<Split>) -> Traffic {
    let ns_path = format!("/var/run/netns/{}", mesh.pod("sleep-1").ns.name);
    let addr: SocketAddr = format!("{HTTPBIN_VIP}:8000").parse().expect("an address");
    let mut entered = false;
    let limit = cfg.warmup + cfg.duration + Duration::from_secs(60);
    Traffic::start(cfg.pace, limit, move || {
        if !entered {
            // The traffic thread joins sleep's network once.
            let file = std::fs::File::open(&ns_path).map_err(|e| e.to_string())?;
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| e.to_string())?;
            entered = true;
        }
        let (code, body) = one_request(addr).map_err(|e| e.to_string())?;
        if code == 200 {
            match body.lines().find_map(|l| l.strip_prefix("version=")) {
                Some("v1") => split.v1.fetch_add(1, Ordering::Relaxed),
                Some("v2") => split.v2.fetch_add(1, Ordering::Relaxed),
                _ => return Err(format!("200 without a version: {body}")),
            };
        }
        Ok(code)
    })
}

/// One `GET /headers` to httpbin, as `curl http://httpbin:8000/headers`.
fn one_request(addr: SocketAddr) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_nodelay(true)?;
    s.write_all(b"GET /headers HTTP/1.1\r\nHost: httpbin:8000\r\nConnection: close\r\n\r\n")?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    Ok(crate::mesh::split_response(&buf))
}

/// The processes watched: (label, pid, judged).
fn processes(mesh: &LocalMesh) -> Vec<(String, u32, bool)> {
    let mut out = vec![("istiod".to_string(), mesh.istiod.proc.pid(), true)];
    for (name, _, _, agent) in &mesh.pods {
        out.push((format!("agent {name}"), agent.pid(), true));
        if let Some(envoy) = child_of(agent.pid()) {
            out.push((format!("envoy {name}"), envoy, false));
        }
    }
    out
}

/// The edit in flight: its index in the report and when it was written.
struct Pending {
    index: usize,
    at: Instant,
}

/// Starts the mesh and runs the soak; `progress` gets a line now and then.
pub fn run(cfg: SoakConfig, mut progress: impl FnMut(&str)) -> SoakReport {
    let mesh = LocalMesh::start(
        &cfg.dir,
        &[("SECRET_TTL", &common::duration::format(cfg.secret_ttl))],
    );
    progress("mesh ready; traffic, rotations and edits start");
    let vs_file = mesh.config_dir.join("istio.yaml");
    let template = std::fs::read_to_string(&vs_file).expect("the sample's istio.yaml");
    let split = Arc::new(Split::default());
    let traffic = start_traffic(&mesh, &cfg, split.clone());
    let watched = processes(&mesh);
    let pods: Vec<String> = mesh.pods.iter().map(|p| p.0.clone()).collect();
    let mut serials: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut edits: Vec<Edit> = Vec::new();
    let mut pending: Option<Pending> = None;
    let mut split_mark = split.read();
    // (time since the start, VmRSS of each watched process), after the warm-up.
    let mut samples: Vec<(Duration, Vec<u64>)> = Vec::new();
    let begun = Instant::now();
    let end = cfg.warmup + cfg.duration;
    let (mut next_certs, mut next_edit, mut next_rss) =
        (Duration::ZERO, cfg.edit_every, Duration::ZERO);
    let mut last_minute = 0;
    let ticks = (end.as_millis() / TICK.as_millis()) as usize + 10;
    for _ in 0..ticks {
        let now = begun.elapsed();
        if now >= end {
            break;
        }
        if now >= next_certs {
            next_certs = now + CERTS_EVERY;
            for pod in &pods {
                if let Some(body) = admin_get(&mesh, pod, "/certs") {
                    serials
                        .entry(pod.clone())
                        .or_default()
                        .extend(workload_serials(&body));
                }
            }
        }
        if let Some(p) = &pending {
            let want = edits[p.index].weights;
            let seen = admin_get(
                &mesh,
                "sleep-1",
                "/config_dump?resource=dynamic_route_configs",
            )
            .and_then(|b| route_weights(&b));
            if seen == Some(want) {
                edits[p.index].seen_after = Some(p.at.elapsed());
                pending = None;
            } else if p.at.elapsed() > EDIT_LIMIT {
                progress(&format!("edit to {want:?} not seen in sleep-1's routes"));
                pending = None;
            }
        }
        if now >= next_edit && pending.is_none() {
            next_edit = now + cfg.edit_every;
            // The answers since the last edit belong to the weights before it.
            let counts = split.read();
            if let Some(last) = edits.last_mut() {
                last.answered = (counts.0 - split_mark.0, counts.1 - split_mark.1);
            }
            split_mark = counts;
            let weights = EDIT_WEIGHTS[edits.len() % EDIT_WEIGHTS.len()];
            write_edit(&vs_file, &with_weights(&template, weights));
            edits.push(Edit {
                weights,
                seen_after: None,
                answered: (0, 0),
            });
            pending = Some(Pending {
                index: edits.len() - 1,
                at: Instant::now(),
            });
        }
        if now >= cfg.warmup && now >= next_rss {
            if samples.is_empty() {
                progress("warm-up over: RSS readings start");
            }
            next_rss = now + RSS_EVERY;
            let kib = watched.iter().map(|(_, pid, _)| vm_rss_kib(*pid)).collect();
            samples.push((now, kib));
        }
        let minute = now.as_secs() / 60;
        if minute > last_minute {
            last_minute = minute;
            let outcomes = traffic.outcomes();
            progress(&format!(
                "{minute} min: {} sent, {} failed, {} edits",
                outcomes.len(),
                crate::fault::failures(&outcomes).len(),
                edits.len()
            ));
        }
        std::thread::sleep(TICK);
    }
    let elapsed = begun.elapsed();
    samples.push((
        elapsed,
        watched.iter().map(|(_, pid, _)| vm_rss_kib(*pid)).collect(),
    ));
    let outcomes = traffic.stop();
    let counts = split.read();
    if let Some(last) = edits.last_mut() {
        last.answered = (counts.0 - split_mark.0, counts.1 - split_mark.1);
    }
    // Windows of at most a quarter of the run each, so they never overlap.
    let window = RSS_WINDOW.min(cfg.duration / 4);
    let rss = rss_figures(
        &watched,
        &samples,
        (cfg.warmup, cfg.warmup + window),
        (elapsed.saturating_sub(window), elapsed),
    );
    SoakReport {
        config: cfg,
        elapsed,
        sent: outcomes.len(),
        failures: describe_failures(&outcomes, begun),
        rotations: pods
            .iter()
            .map(|p| {
                let n = serials.get(p).map_or(0, BTreeSet::len);
                (p.clone(), n.saturating_sub(1))
            })
            .collect(),
        edits,
        rss,
        rss_window: window,
    }
}

/// Writes `text` over `file` as an operator's tool does: whole, to a
/// temporary file in the same directory, then renamed into place.
fn write_edit(file: &Path, text: &str) {
    let tmp = file.with_file_name(".istio.yaml.tmp");
    std::fs::write(&tmp, text).expect("write the edit");
    std::fs::rename(&tmp, file).expect("rename the edit into place");
}

/// Each watched process's figures from the readings (`samples`: time since
/// the start and each process's VmRSS), with the start and end windows.
fn rss_figures(
    watched: &[(String, u32, bool)],
    samples: &[(Duration, Vec<u64>)],
    start: (Duration, Duration),
    end: (Duration, Duration),
) -> Vec<Rss> {
    watched
        .iter()
        .enumerate()
        .map(|(i, (label, pid, judged))| {
            let stats = |(from, to): (Duration, Duration)| {
                let v: Vec<u64> = samples
                    .iter()
                    .filter(|(t, _)| *t >= from && *t <= to)
                    .map(|(_, kib)| kib[i])
                    .collect();
                let mean = v.iter().sum::<u64>() / (v.len().max(1) as u64);
                (mean, v.iter().max().copied().unwrap_or(0))
            };
            Rss {
                label: label.clone(),
                pid: *pid,
                judged: *judged,
                start_kib: samples.first().map_or(0, |s| s.1[i]),
                end_kib: samples.last().map_or(0, |s| s.1[i]),
                start_window: stats(start),
                end_window: stats(end),
            }
        })
        .collect()
}

/// Each failed request with when it was sent.
fn describe_failures(outcomes: &[Outcome], begun: Instant) -> Vec<String> {
    outcomes
        .iter()
        .filter(|o| !o.ok())
        .map(|o| {
            let at = o.at.saturating_duration_since(begun).as_secs_f64();
            match &o.result {
                Ok(code) => format!("at {at:.1} s: HTTP {code}"),
                Err(e) => format!("at {at:.1} s: {e}"),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serials_are_read_from_the_workload_certificates_only() {
        let certs = r#"{"certificates":[{"ca_cert":[{"serial_number":"01","subject_alt_names":[]}],
            "cert_chain":[{"serial_number":"abc","subject_alt_names":[{"uri":"spiffe://cluster.local/ns/demo/sa/sleep"}]}]},
            {"cert_chain":[{"serial_number":"def","subject_alt_names":[{"dns":"x"}]}]}]}"#;
        assert_eq!(
            workload_serials(certs).into_iter().collect::<Vec<_>>(),
            vec!["abc"]
        );
    }

    #[test]
    fn route_weights_are_found_by_subset_cluster() {
        let dump = format!(
            r#"{{"configs":[{{"dynamic_route_configs":[{{"route_config":{{"virtual_hosts":[{{"routes":[{{"route":{{"weighted_clusters":{{"clusters":[{{"name":"{V1_CLUSTER}","weight":10}},{{"name":"{V2_CLUSTER}","weight":90}}]}}}}}}]}}]}}}}]}}]}}"#
        );
        assert_eq!(route_weights(&dump), Some((10, 90)));
        assert_eq!(route_weights("{}"), None);
    }

    #[test]
    fn weights_are_written_into_the_sample() {
        let sample = "a\n      weight: 90\nb\n      weight: 10\n";
        assert_eq!(
            with_weights(sample, (10, 90)),
            "a\n      weight: 10\nb\n      weight: 90\n"
        );
    }
}
