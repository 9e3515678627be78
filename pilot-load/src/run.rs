//! One load run against a running istiod: every simulated proxy connects
//! (the initial sync), then each change is applied to the config directory
//! and timed from the moment its file is written to the last ACK of the
//! push it causes, with the bytes sent and istiod's CPU and memory read
//! from `/proc`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::sync::{mpsc, watch};
use tonic::transport::{Channel, Endpoint};

use crate::client::{ClientSettings, Event, ProxySpec, run_proxy};
use crate::mesh::{MeshDir, Revision, pod_ip};
use crate::procfs::{self, Reading};

/// A change a run applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// A label on one Service (a full push for every proxy that sees it).
    ServiceLabel,
    /// One VirtualService's route timeout.
    VirtualService,
    /// One endpoint of one service moves to another IP (its Pod restarted).
    Endpoint,
    /// Every proxy drops its stream and reconnects at once.
    Reconnect,
}

impl std::str::FromStr for ChangeKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "label" => ChangeKind::ServiceLabel,
            "vs" | "virtualservice" => ChangeKind::VirtualService,
            "endpoint" => ChangeKind::Endpoint,
            "reconnect" => ChangeKind::Reconnect,
            _ => return Err(format!("{s:?}: one of label, vs, endpoint, reconnect")),
        })
    }
}

/// How a run goes.
#[derive(Debug, Clone)]
pub struct Options {
    /// istiod's plaintext xDS address (`http://127.0.0.1:15010`).
    pub addr: String,
    /// Simulated proxies (each one of the mesh's pods).
    pub proxies: usize,
    /// Every n-th proxy speaks delta xDS (0: none).
    pub delta_every: usize,
    /// HTTP/2 connections the proxies share.
    pub connections: usize,
    /// istiod's process id, for CPU and memory.
    pub istiod_pid: Option<u32>,
    /// A push is over once no ACK came for this long.
    pub quiet: Duration,
    /// The longest a phase may take.
    pub cap: Duration,
    /// The changes, in order.
    pub changes: Vec<ChangeKind>,
}

/// What one phase measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Phase {
    /// The phase.
    pub name: String,
    /// Proxies that received the push (or synced).
    pub proxies: usize,
    /// Of how many.
    pub of: usize,
    /// Per proxy, the change to its last ACK: median, 99th percentile, max (ms).
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Slowest.
    pub max_ms: f64,
    /// Responses ACKed.
    pub responses: u64,
    /// Resource bytes received.
    pub bytes: u64,
    /// Streams refused or ended and retried.
    pub retries: u64,
    /// istiod's CPU seconds during the phase.
    pub cpu_s: f64,
    /// istiod's resident memory at the end (MiB).
    pub rss_mib: f64,
    /// istiod's largest resident memory seen during the phase (MiB, sampled every 50 ms).
    pub rss_peak_mib: f64,
    /// istiod's VmHWM at the end (MiB).
    pub hwm_mib: f64,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// The push sequence of an Istio version (`<time>/<n>`).
fn version_seq(v: &str) -> u64 {
    v.rsplit('/')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Samples istiod's `/proc` every 50 ms.
struct Sampler {
    samples: Arc<Mutex<Vec<(Instant, Reading)>>>,
}

impl Sampler {
    fn start(pid: Option<u32>) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        if let Some(pid) = pid {
            let s = samples.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(50));
                loop {
                    tick.tick().await;
                    let Some(r) = procfs::read(pid) else { return };
                    if let Ok(mut v) = s.lock() {
                        v.push((Instant::now(), r));
                    }
                }
            });
        }
        Self { samples }
    }

    /// CPU used, resident memory at the end and at most, and VmHWM, between `from` and now.
    fn window(
        &self,
        pid: Option<u32>,
        from: Instant,
        cpu_at_start: Option<Reading>,
    ) -> (f64, f64, f64, f64) {
        let now = pid.and_then(procfs::read).unwrap_or_default();
        let peak = self
            .samples
            .lock()
            .map(|v| {
                v.iter()
                    .filter(|(t, _)| *t >= from)
                    .map(|(_, r)| r.rss_mib)
                    .fold(now.rss_mib, f64::max)
            })
            .unwrap_or(now.rss_mib);
        let cpu = cpu_at_start
            .map(|s| now.cpu.saturating_sub(s.cpu).as_secs_f64())
            .unwrap_or(0.0);
        (cpu, now.rss_mib, peak, now.hwm_mib)
    }
}

/// The proxies of a run: proxy `i` is pod `i` of the mesh.
pub fn proxy_specs(mesh: &MeshDir, n: usize, delta_every: usize) -> Vec<ProxySpec> {
    let shape = &mesh.shape;
    (0..n)
        .map(|i| {
            let pod = i % shape.pods().max(1);
            let (s, e) = shape.pod_service(pod);
            let ns = shape.namespace(s);
            let ip = pod_ip(pod).to_string();
            ProxySpec {
                index: i,
                node_id: format!("sidecar~{ip}~svc-{s}-{e}.{ns}~{ns}.svc.cluster.local"),
                namespace: ns,
                ip,
                labels: vec![
                    ("app".into(), format!("svc-{s}")),
                    ("version".into(), "v1".into()),
                ],
                service_account: format!("svc-{s}"),
                delta: delta_every > 0 && i % delta_every == delta_every - 1,
            }
        })
        .collect()
}

async fn channels(addr: &str, n: usize) -> anyhow::Result<Vec<Channel>> {
    let mut out = Vec::new();
    for _ in 0..n.max(1) {
        let ch = Endpoint::from_shared(addr.to_string())?
            .initial_stream_window_size(Some(16 * 1024 * 1024))
            .initial_connection_window_size(Some(64 * 1024 * 1024))
            .http2_keep_alive_interval(Duration::from_secs(30))
            .connect()
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        out.push(ch);
    }
    Ok(out)
}

/// A run in progress.
struct Run {
    opts: Options,
    mesh: MeshDir,
    events: mpsc::UnboundedReceiver<Event>,
    reconnect: watch::Sender<u64>,
    stop: watch::Sender<bool>,
    sampler: Sampler,
    /// The highest push sequence any proxy ACKed.
    seen_seq: u64,
    revision: HashMap<usize, Revision>,
    next_pod: usize,
}

impl Run {
    fn reading(&self) -> Option<Reading> {
        self.opts.istiod_pid.and_then(procfs::read)
    }

    fn finish(
        &self,
        name: &str,
        of: usize,
        times: Vec<Duration>,
        counts: (u64, u64, u64),
        from: Instant,
        start: Option<Reading>,
    ) -> Phase {
        let mut times = times;
        times.sort();
        let (cpu, rss, peak, hwm) = self.sampler.window(self.opts.istiod_pid, from, start);
        Phase {
            name: name.to_string(),
            proxies: times.len(),
            of,
            p50_ms: ms(percentile(&times, 0.5)),
            p99_ms: ms(percentile(&times, 0.99)),
            max_ms: ms(times.last().copied().unwrap_or_default()),
            responses: counts.0,
            bytes: counts.1,
            retries: counts.2,
            cpu_s: (cpu * 100.0).round() / 100.0,
            rss_mib: rss.round(),
            rss_peak_mib: peak.round(),
            hwm_mib: hwm.round(),
        }
    }

    /// Waits until every proxy has synced in `generation`.
    async fn sync(
        &mut self,
        name: &str,
        generation: u64,
        t0: Instant,
        start: Option<Reading>,
    ) -> anyhow::Result<Phase> {
        let n = self.opts.proxies;
        let mut synced: HashMap<usize, Duration> = HashMap::new();
        let (mut responses, mut bytes, mut retries) = (0, 0, 0);
        let deadline = tokio::time::Instant::from_std(t0 + self.opts.cap);
        while synced.len() < n {
            let ev = match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some(ev)) => ev,
                Ok(None) => bail!("every proxy stopped"),
                Err(_) => bail!(
                    "{name}: only {} of {n} proxies synced within {:?}",
                    synced.len(),
                    self.opts.cap
                ),
            };
            match ev {
                Event::Ack(a) => {
                    self.seen_seq = self.seen_seq.max(version_seq(&a.version));
                    if a.generation != generation {
                        continue;
                    }
                    responses += 1;
                    bytes += a.bytes as u64;
                    if a.synced {
                        synced
                            .entry(a.proxy)
                            .or_insert(a.at.saturating_duration_since(t0));
                    }
                }
                Event::Ended { .. } => retries += 1,
            }
        }
        Ok(self.finish(
            name,
            n,
            synced.into_values().collect(),
            (responses, bytes, retries),
            t0,
            start,
        ))
    }

    /// Applies a config change and waits for its push to go quiet.
    async fn change(&mut self, kind: ChangeKind) -> anyhow::Result<Phase> {
        let shape = self.mesh.shape.clone();
        let (name, s) = match kind {
            ChangeKind::ServiceLabel => ("service label", 0),
            ChangeKind::VirtualService => (
                "VirtualService edit",
                self.mesh
                    .virtual_service_in(1)
                    .or_else(|| self.mesh.virtual_service_in(0))
                    .context("the mesh has no VirtualService")?,
            ),
            ChangeKind::Endpoint => ("endpoint move", 2 % shape.services.max(1)),
            ChangeKind::Reconnect => unreachable!("not a config change"),
        };
        let mut rev = self.revision.get(&s).copied().unwrap_or_default();
        match kind {
            ChangeKind::ServiceLabel => rev.label += 1,
            ChangeKind::VirtualService => rev.timeout = rev.timeout.max(1) + 1,
            ChangeKind::Endpoint => {
                rev.moved_to = Some(shape.pods() + self.next_pod);
                self.next_pod += 1;
            }
            ChangeKind::Reconnect => {}
        }
        self.revision.insert(s, rev);
        let baseline = self.seen_seq;
        let start = self.reading();
        let t0 = Instant::now();
        self.mesh.write_service(s, rev)?;
        let mut last: HashMap<usize, Duration> = HashMap::new();
        let (mut responses, mut bytes, mut retries) = (0, 0, 0);
        let mut last_event: Option<Instant> = None;
        let cap = t0 + self.opts.cap;
        loop {
            let until = match last_event {
                Some(t) => (t + self.opts.quiet).min(cap),
                None => cap,
            };
            match tokio::time::timeout_at(tokio::time::Instant::from_std(until), self.events.recv())
                .await
            {
                Ok(Some(Event::Ack(a))) => {
                    let seq = version_seq(&a.version);
                    self.seen_seq = self.seen_seq.max(seq);
                    if seq <= baseline {
                        continue;
                    }
                    responses += 1;
                    bytes += a.bytes as u64;
                    last.insert(a.proxy, a.at.saturating_duration_since(t0));
                    last_event = Some(Instant::now());
                }
                Ok(Some(Event::Ended { .. })) => retries += 1,
                Ok(None) => bail!("every proxy stopped"),
                Err(_) => break,
            }
        }
        let name = format!("{name} (svc-{s})");
        Ok(self.finish(
            &name,
            self.opts.proxies,
            last.into_values().collect(),
            (responses, bytes, retries),
            t0,
            start,
        ))
    }
}

/// Runs the load: connects the proxies, then applies each change.
pub async fn run(
    mesh: MeshDir,
    opts: Options,
    mut report: impl FnMut(&Phase),
) -> anyhow::Result<Vec<Phase>> {
    raise_fd_limit();
    let channels = channels(&opts.addr, opts.connections).await?;
    let (tx, events) = mpsc::unbounded_channel();
    let (reconnect, reconnect_rx) = watch::channel(0u64);
    let (stop, stop_rx) = watch::channel(false);
    let mut run = Run {
        sampler: Sampler::start(opts.istiod_pid),
        opts: opts.clone(),
        mesh,
        events,
        reconnect,
        stop,
        seen_seq: 0,
        revision: HashMap::new(),
        next_pod: 0,
    };
    let start = run.reading();
    let t0 = Instant::now();
    for spec in proxy_specs(&run.mesh, opts.proxies, opts.delta_every) {
        let ch = channels[spec.index % channels.len()].clone();
        tokio::spawn(run_proxy(
            spec,
            ch,
            ClientSettings::default(),
            tx.clone(),
            reconnect_rx.clone(),
            stop_rx.clone(),
        ));
    }
    drop(tx);
    let mut phases = Vec::new();
    let p = run.sync("initial sync", 0, t0, start).await?;
    report(&p);
    phases.push(p);
    let mut generation = 0;
    for kind in opts.changes.clone() {
        // Let the previous phase's stragglers settle.
        tokio::time::sleep(Duration::from_millis(500)).await;
        while let Ok(ev) = run.events.try_recv() {
            if let Event::Ack(a) = ev {
                run.seen_seq = run.seen_seq.max(version_seq(&a.version));
            }
        }
        let p = if kind == ChangeKind::Reconnect {
            generation += 1;
            let start = run.reading();
            let t0 = Instant::now();
            run.reconnect.send_replace(generation);
            run.sync("reconnect of every proxy", generation, t0, start)
                .await?
        } else {
            run.change(kind).await?
        };
        report(&p);
        phases.push(p);
    }
    run.stop.send_replace(true);
    Ok(phases)
}

/// Raises the open-file limit to its hard limit (one connection per proxy).
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_give_their_push_sequence() {
        assert_eq!(version_seq("2026-12-02T10:00:00Z/17"), 17);
        assert_eq!(version_seq("garbage"), 0);
    }

    #[test]
    fn percentiles_of_sorted_times() {
        let t: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&t, 0.5), Duration::from_millis(51));
        assert_eq!(percentile(&t, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }
}
