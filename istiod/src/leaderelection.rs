//! Leader election on Istio's locks (`pilot/pkg/leaderelection`): every
//! writer that must run in one istiod at a time runs while this replica
//! holds its lock; the others keep watching and take over when the holder
//! stops renewing.
//!
//! As Istio: the identity is the Pod name (`POD_NAME`), the key the
//! revision; the lease lasts 30 s, the holder must renew within 15 s and
//! every attempt is 7.5 s apart (Istio fixes these; no setting changes
//! them). A lock held by another is taken only after it went unrenewed for a
//! whole lease, as client-go judges it (by when this replica last saw the
//! record change), except that the default revision takes a lock from any
//! other revision (Istio's prioritized election; not for per-revision locks).
//! On graceful shutdown the holder releases the lock (holder emptied, lease
//! 1 s, as client-go's `ReleaseOnCancel`), so another takes it at its next
//! attempt. `ENABLE_LEADER_ELECTION=false` makes every lock held at once.

mod default_watcher;
pub mod lock;

use std::time::{Duration, SystemTime};

use tokio::sync::watch;

pub use default_watcher::DefaultRevision;
use lock::{Lock, LockKind, Record};

/// The namespace controller (`istio-ca-root-cert`) lock: a ConfigMap.
pub const NAMESPACE_CONTROLLER: &str = "istio-namespace-controller-election";
/// The Ingress status lock, Istio's legacy name: a ConfigMap.
pub const INGRESS_CONTROLLER: &str = "istio-leader";
/// The Gateway API status lock: per revision, a Lease
/// (`istio-gateway-status-leader-<revision>`).
pub const GATEWAY_STATUS_CONTROLLER: &str = "istio-gateway-status-leader";
/// The Istio status lock: a Lease shared by the revisions (prioritized).
pub const STATUS_CONTROLLER: &str = "istio-status-leader";
/// The Gateway deployment controller lock: per revision, a Lease.
pub const GATEWAY_DEPLOYMENT_CONTROLLER: &str = "istio-gateway-deployment";
/// The ServiceEntry IP auto-allocation lock: a ConfigMap (Istio's
/// `NewLeaderElection` for this controller).
pub const IP_AUTOALLOCATE_CONTROLLER: &str = "istio-ip-autoallocate";

/// `ENABLE_LEADER_ELECTION` (Istio's, default true): when false every lock
/// counts as held, without touching the API.
pub const ENV_ENABLE_LEADER_ELECTION: &str = "ENABLE_LEADER_ELECTION";

/// Istio's lease (its fixed 30 s ttl).
pub const LEASE_DURATION: Duration = Duration::from_secs(30);
/// Istio's renew deadline (ttl / 2).
pub const RENEW_DEADLINE: Duration = Duration::from_secs(15);
/// Istio's retry period (ttl / 4).
pub const RETRY_PERIOD: Duration = Duration::from_millis(7500);
/// client-go's jitter on acquire attempts (`JitterFactor`).
const JITTER_FACTOR: f64 = 1.2;
/// The prefix of a remote istiod's key (Istio's `remoteIstiodPrefix`).
const REMOTE_PREFIX: &str = "^";

/// Why an election attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// The API refused or could not be reached.
    #[error("leader election: {0}")]
    Api(#[from] kube::Error),
    /// The lock holds a record that cannot be read or written.
    #[error("leader election lock {lock}: bad record: {reason}")]
    Record {
        /// `namespace/name`.
        lock: String,
        /// What is wrong.
        reason: String,
    },
}

/// Which lock, as Istio's constructors choose it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Election {
    /// The lock's object name (with `-<revision>` for per-revision ones).
    pub name: String,
    /// ConfigMap or Lease.
    pub kind: LockKind,
    /// Whether the default revision may take it from another revision.
    pub prioritized: bool,
}

impl Election {
    /// Istio's `NewLeaderElection`: a ConfigMap shared by every revision,
    /// the default revision preferred.
    pub fn configmap(id: &str) -> Self {
        Self {
            name: id.to_string(),
            kind: LockKind::ConfigMap,
            prioritized: true,
        }
    }

    /// Istio's `NewLeaseLeaderElection`: a Lease shared by every revision,
    /// the default revision preferred.
    pub fn lease(id: &str) -> Self {
        Self {
            name: id.to_string(),
            kind: LockKind::Lease,
            prioritized: true,
        }
    }

    /// Istio's `NewPerRevisionLeaderElection`: one Lease per revision,
    /// named `<id>-<revision>`, no priority and no key.
    pub fn per_revision(id: &str, revision: &str) -> Self {
        Self {
            name: format!("{id}-{}", revision_or_default(revision)),
            kind: LockKind::Lease,
            prioritized: false,
        }
    }
}

fn revision_or_default(revision: &str) -> &str {
    if revision.is_empty() {
        "default"
    } else {
        revision
    }
}

/// Who takes part, and where the locks live.
#[derive(Clone)]
pub struct Candidate {
    /// The API.
    pub client: kube::Client,
    /// istiod's namespace.
    pub namespace: String,
    /// The identity (`POD_NAME`).
    pub identity: String,
    /// This istiod's revision (`default` when empty).
    pub revision: String,
    /// Which revision is the default (for prioritized locks).
    pub default_revision: DefaultRevision,
}

/// Whether this replica holds a lock, as it changes.
#[derive(Clone)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
}

impl Leadership {
    /// Always held: istiod without Kubernetes, or with
    /// `ENABLE_LEADER_ELECTION=false`.
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        // Keep the value: a closed channel still reads `true`.
        drop(tx);
        Self { rx }
    }

    /// Whether the lock is held now.
    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    /// The receiver, to wait on changes.
    pub fn receiver(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }

    /// Waits until the lock is held; false when shutdown came first.
    pub async fn acquired(&mut self, shutdown: &mut watch::Receiver<bool>) -> bool {
        let held = tokio::select! {
            r = self.rx.wait_for(|l| *l) => r.is_ok(),
            _ = shutdown.wait_for(|s| *s) => return false,
        };
        held || self.is_leader()
    }

    /// Waits until the lock is lost (never, when the channel is closed
    /// while held).
    pub async fn lost(&mut self) {
        if self.rx.wait_for(|l| !*l).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Runs `body` each time the lock is held, cancelled when it is lost or at
/// shutdown: Istio's `AddRunFunction`. `body` gets its own shutdown signal
/// (true once leadership or istiod ends), so it can stop cleanly.
pub async fn run_while_leader<F, Fut>(
    what: &str,
    mut leadership: Leadership,
    mut shutdown: watch::Receiver<bool>,
    mut body: F,
) where
    F: FnMut(watch::Receiver<bool>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    loop {
        if !leadership.acquired(&mut shutdown).await {
            return;
        }
        tracing::info!(target: "leader", "starting {what}: this replica holds its lock");
        let (stop_tx, stop_rx) = watch::channel(false);
        let run = body(stop_rx);
        tokio::pin!(run);
        let ended = tokio::select! {
            _ = &mut run => true,
            _ = leadership.lost() => false,
            _ = shutdown.wait_for(|s| *s) => { let _ = stop_tx.send(true); return }
        };
        let _ = stop_tx.send(true);
        if ended {
            tracing::info!(target: "leader", "{what} stopped");
            // Ended while leading: wait for leadership to end first.
            leadership.lost().await;
        } else {
            tracing::info!(target: "leader", "stopping {what}: the lock was lost");
        }
    }
}

/// What this replica has seen of a lock (client-go's observed record).
#[derive(Default)]
struct Observed {
    record: Record,
    raw: Option<String>,
    at: Option<tokio::time::Instant>,
}

/// One elector: tries to hold one lock for as long as istiod runs.
pub struct Elector {
    election: Election,
    candidate: Candidate,
    lock: Lock,
    observed: Observed,
    tx: watch::Sender<bool>,
}

/// Now as `metav1.Time` (ConfigMap locks) or `metav1.MicroTime` (Leases).
fn timestamp(kind: LockKind) -> String {
    match kind {
        LockKind::ConfigMap => common::clock::now_rfc3339(),
        LockKind::Lease => {
            let now = time::OffsetDateTime::from(SystemTime::now());
            format!(
                "{}.{:06}Z",
                common::clock::rfc3339(now).trim_end_matches('Z'),
                now.microsecond()
            )
        }
    }
}

/// Istio's `LocationPrioritizedComparison` for a local istiod: whether
/// `ours` may take a lock held with key `theirs` before it expires.
pub fn takes_over(ours: &str, theirs: &str, default_revision: &str) -> bool {
    let (theirs, remote) = match theirs.strip_prefix(REMOTE_PREFIX) {
        Some(rev) => (rev, true),
        None => (theirs, false),
    };
    if ours != theirs && !default_revision.is_empty() && default_revision == ours {
        return true;
    }
    ours == theirs && remote
}

impl Elector {
    /// An elector for `election`, and whether it holds the lock.
    pub fn new(election: Election, candidate: Candidate) -> (Self, Leadership) {
        let lock = Lock::new(
            candidate.client.clone(),
            election.kind,
            &candidate.namespace,
            &election.name,
        );
        let (tx, rx) = watch::channel(false);
        let elector = Self {
            election,
            candidate,
            lock,
            observed: Observed::default(),
            tx,
        };
        (elector, Leadership { rx })
    }

    fn key(&self) -> String {
        if self.election.prioritized {
            revision_or_default(&self.candidate.revision).to_string()
        } else {
            String::new()
        }
    }

    fn holds(&self) -> bool {
        self.observed.record.holder_identity == self.candidate.identity
    }

    /// client-go's `tryAcquireOrRenew`: one attempt to take or keep the lock.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, ElectionError> {
        let now = tokio::time::Instant::now();
        let stamp = timestamp(self.election.kind);
        let mut record = Record {
            holder_identity: self.candidate.identity.clone(),
            holder_key: self.key(),
            lease_duration_seconds: LEASE_DURATION.as_secs() as i64,
            acquire_time: stamp.clone(),
            renew_time: stamp,
            leader_transitions: 0,
        };
        let Some((old, raw)) = self.lock.get().await? else {
            if !self.lock.create(&record).await? {
                return Ok(false);
            }
            self.observe(record, None, now);
            return Ok(true);
        };
        if self.observed.raw.as_deref() != Some(raw.as_str()) {
            self.observe(old.clone(), Some(raw), now);
        }
        let unexpired = self.observed.at.is_some_and(|at| at + LEASE_DURATION > now);
        if !old.holder_identity.is_empty() && unexpired && !self.holds() {
            let default = self.candidate.default_revision.get();
            let ours = revision_or_default(&self.candidate.revision);
            if !(self.election.prioritized && takes_over(ours, &old.holder_key, &default)) {
                return Ok(false);
            }
            tracing::info!(target: "leader", "{}: held by {} (revision {}), taken by the default revision {ours}", self.lock.describe(), old.holder_identity, old.holder_key);
        }
        if self.holds() {
            record.acquire_time = old.acquire_time.clone();
            record.leader_transitions = old.leader_transitions;
        } else {
            record.leader_transitions = old.leader_transitions + 1;
        }
        if !self.lock.update(&record).await? {
            return Ok(false);
        }
        self.observe(record, None, now);
        Ok(true)
    }

    fn observe(&mut self, record: Record, raw: Option<String>, at: tokio::time::Instant) {
        // A record we wrote: the next read's raw form differs, and counts
        // as a change seen now, which is when we wrote it.
        self.observed = Observed {
            record,
            raw,
            at: Some(at),
        };
    }

    async fn attempt(&mut self) -> bool {
        match self.try_acquire_or_renew().await {
            Ok(ok) => ok,
            Err(e) => {
                tracing::warn!(target: "leader", "{}: {e}", self.lock.describe());
                false
            }
        }
    }

    /// Waits for the lock (attempts `RETRY_PERIOD` apart, jittered); false
    /// at shutdown.
    async fn acquire(&mut self, shutdown: &mut watch::Receiver<bool>) -> bool {
        tracing::info!(target: "leader", "attempting to acquire leader lease {}...", self.lock.describe());
        loop {
            if *shutdown.borrow() {
                return false;
            }
            if self.attempt().await {
                tracing::info!(target: "leader", "successfully acquired lease {}", self.lock.describe());
                return true;
            }
            let jitter = rand::random::<f64>() * (JITTER_FACTOR - 1.0);
            let wait = RETRY_PERIOD.mul_f64(1.0 + jitter);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.wait_for(|s| *s) => return false,
            }
        }
    }

    /// Renews every `RETRY_PERIOD` until a renewal fails for
    /// `RENEW_DEADLINE` (lost: returns false) or shutdown (true).
    async fn renew(&mut self, shutdown: &mut watch::Receiver<bool>) -> bool {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(RETRY_PERIOD) => {}
                _ = shutdown.wait_for(|s| *s) => return true,
            }
            let deadline = tokio::time::Instant::now() + RENEW_DEADLINE;
            loop {
                let renewed = tokio::select! {
                    r = tokio::time::timeout_at(deadline, self.attempt()) => r.unwrap_or(false),
                    _ = shutdown.wait_for(|s| *s) => return true,
                };
                if renewed {
                    break;
                }
                if tokio::time::Instant::now() + RETRY_PERIOD > deadline {
                    tracing::info!(target: "leader", "failed to renew lease {}: deadline passed", self.lock.describe());
                    return false;
                }
                tokio::select! {
                    _ = tokio::time::sleep(RETRY_PERIOD) => {}
                    _ = shutdown.wait_for(|s| *s) => return true,
                }
            }
        }
    }

    /// client-go's `release`: empties the holder, lease 1 s.
    async fn release(&mut self) {
        if !self.holds() {
            return;
        }
        let stamp = timestamp(self.election.kind);
        let record = Record {
            leader_transitions: self.observed.record.leader_transitions,
            lease_duration_seconds: 1,
            acquire_time: stamp.clone(),
            renew_time: stamp,
            ..Default::default()
        };
        match self.lock.update(&record).await {
            Ok(true) => {
                tracing::info!(target: "leader", "released leader lease {}", self.lock.describe())
            }
            Ok(false) => {
                tracing::warn!(target: "leader", "cannot release {}: it changed meanwhile", self.lock.describe())
            }
            Err(e) => {
                tracing::warn!(target: "leader", "cannot release {}: {e}", self.lock.describe())
            }
        }
        self.observed.record = record;
    }

    /// Runs the election until `shutdown`, then releases the lock if held.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut cycle = 0u32;
        loop {
            if !self.acquire(&mut shutdown).await {
                return;
            }
            cycle += 1;
            tracing::info!(target: "leader", "leader election lock obtained: {}", self.election.name);
            let _ = self.tx.send(true);
            let stopping = self.renew(&mut shutdown).await;
            let _ = self.tx.send(false);
            tracing::info!(target: "leader", "leader election lock lost: {}", self.election.name);
            if stopping {
                self.release().await;
                return;
            }
            tracing::info!(target: "leader", "leader election cycle {cycle} lost; trying again");
        }
    }
}

/// The elections of one istiod, started on demand; released together.
pub struct Elections {
    candidate: Option<Candidate>,
    shutdown: watch::Receiver<bool>,
    running: tokio::task::JoinSet<()>,
    started: std::collections::BTreeMap<String, Leadership>,
}

impl Elections {
    /// Elections for `candidate`; `None` (no Kubernetes, or
    /// `ENABLE_LEADER_ELECTION=false`): every lock is held.
    pub fn new(candidate: Option<Candidate>, shutdown: watch::Receiver<bool>) -> Self {
        Self {
            candidate,
            shutdown,
            running: tokio::task::JoinSet::new(),
            started: Default::default(),
        }
    }

    /// The leadership of `election`, starting its elector on first use.
    pub fn join(&mut self, election: Election) -> Leadership {
        let Some(candidate) = &self.candidate else {
            return Leadership::always();
        };
        if let Some(l) = self.started.get(&election.name) {
            return l.clone();
        }
        tracing::info!(target: "leader", "joining leader election for {} in {} as {}", election.name, candidate.namespace, candidate.identity);
        let name = election.name.clone();
        let (elector, leadership) = Elector::new(election, candidate.clone());
        self.running.spawn(elector.run(self.shutdown.clone()));
        self.started.insert(name, leadership.clone());
        leadership
    }

    fn revision(&self) -> &str {
        self.candidate
            .as_ref()
            .map(|c| c.revision.as_str())
            .unwrap_or_default()
    }

    /// The namespace controller's lock (`istio-ca-root-cert` writes).
    pub fn namespace_controller(&mut self) -> Leadership {
        self.join(Election::configmap(NAMESPACE_CONTROLLER))
    }

    /// The Gateway API status writer's lock (per revision, as Istio).
    pub fn gateway_status(&mut self) -> Leadership {
        let e = Election::per_revision(GATEWAY_STATUS_CONTROLLER, self.revision());
        self.join(e)
    }

    /// The Gateway deployment controller's lock (per revision, as Istio).
    pub fn gateway_deployment(&mut self) -> Leadership {
        let e = Election::per_revision(GATEWAY_DEPLOYMENT_CONTROLLER, self.revision());
        self.join(e)
    }

    /// The ServiceEntry IP auto-allocation controller's lock.
    pub fn ip_autoallocate(&mut self) -> Leadership {
        self.join(Election::configmap(IP_AUTOALLOCATE_CONTROLLER))
    }

    /// Waits for every elector to end (after shutdown: each releases its
    /// lock), at most `limit`.
    pub async fn released(mut self, limit: Duration) {
        let all = async { while self.running.join_next().await.is_some() {} };
        if tokio::time::timeout(limit, all).await.is_err() {
            tracing::warn!(target: "leader", "releasing the leader locks took longer than {limit:?}");
        }
    }
}

/// The candidate istiod runs as: on Kubernetes with
/// `ENABLE_LEADER_ELECTION` on, its `POD_NAME`, namespace and revision;
/// otherwise none (every lock held).
pub fn candidate(
    namespace: &str,
    pod_name: &str,
    revision: &str,
    client: Option<&kube::Client>,
    shutdown: watch::Receiver<bool>,
) -> Result<Option<Candidate>, common::env::ConfigErrors> {
    let Some(client) = client else {
        return Ok(None);
    };
    if !enabled(&common::env::ProcessEnv)? {
        tracing::info!(target: "leader", "{ENV_ENABLE_LEADER_ELECTION}=false: bypassing leader election");
        return Ok(None);
    }
    Ok(Some(Candidate {
        default_revision: DefaultRevision::watch(client.clone(), namespace, shutdown),
        client: client.clone(),
        namespace: namespace.to_string(),
        identity: pod_name.to_string(),
        revision: revision.to_string(),
    }))
}

/// Whether leader election is on (`ENABLE_LEADER_ELECTION`, default true).
pub fn enabled(env: &dyn common::env::Env) -> Result<bool, common::env::ConfigErrors> {
    let mut r = common::env::Reader::new(env);
    let on = r.bool(ENV_ENABLE_LEADER_ELECTION, true);
    r.finish().map(|()| on)
}

#[cfg(test)]
mod tests;
