//! WorkloadEntry auto-registration and health, as Istio's
//! `pilot/pkg/autoregistration` controller does them: a proxy that connects
//! with node metadata `AUTO_REGISTER_GROUP=<group>` gets a WorkloadEntry
//! `<group>-<ip>[-<network>]` in its namespace, built from the group's
//! template and metadata, owned by the group and annotated with the
//! controlling istiod and the connection time; when its last connection
//! ends the entry is marked disconnected and deleted after
//! `PILOT_WORKLOAD_ENTRY_GRACE_PERIOD` unless the proxy came back. The
//! proxy's agent reports the workload's health (`istio.io/health`
//! requests); it becomes the entry's `Healthy` condition, which decides
//! whether its endpoints are healthy.
//!
//! The controller reads the store (both sources feed it) and writes through
//! a [`Writer`]: the Kubernetes API, or istiod's own store in file mode.
//! It sits between the model and the xDS server, which calls it on
//! connect, disconnect and health requests with what it knows of the proxy
//! ([`Registrant`]).

pub mod writer;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};

use crate::model::istio::{
    CONDITION_HEALTHY, HEALTH_CHECK_ANNOTATION, IstioCondition, Labels, WorkloadEntry,
    WorkloadGroup,
};
use crate::model::meta::OwnerReference;
use crate::model::{ConfigStore, Kind, Object, ObjectKey, ObjectMeta, Spec, Typed};
pub use writer::{WriteError, Writer};

/// `PILOT_ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION` (true).
pub const ENV_AUTOREGISTRATION: &str = "PILOT_ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION";
/// `PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS` (true).
pub const ENV_HEALTH_CHECKS: &str = "PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS";
/// `PILOT_WORKLOAD_ENTRY_GRACE_PERIOD` (10s): how long a disconnected
/// auto-registered entry stays.
pub const ENV_GRACE_PERIOD: &str = "PILOT_WORKLOAD_ENTRY_GRACE_PERIOD";
/// Istio's default grace period.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(10);

/// Names the group an entry was registered from.
pub const ANNOTATION_GROUP: &str = "istio.io/autoRegistrationGroup";
/// Names the istiod whose connection controls the entry.
pub const ANNOTATION_CONTROLLER: &str = "istio.io/workloadController";
/// When the controlling connection started.
pub const ANNOTATION_CONNECTED_AT: &str = "istio.io/connectedAt";
/// When the last connection ended.
pub const ANNOTATION_DISCONNECTED_AT: &str = "istio.io/disconnectedAt";
/// Istio's `istio.io/tlsMode`-free locality label the proxy's labels lose.
const LOCALITY_LABEL: &str = "istio-locality";

/// Attempts at a health update whose entry is not in the store yet (the
/// Kubernetes source brings a just-created entry back a moment later).
const HEALTH_ATTEMPTS: u32 = 5;
const HEALTH_RETRY: Duration = Duration::from_millis(200);

/// The controller's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `PILOT_ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION`.
    pub auto_registration: bool,
    /// `PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS`.
    pub health_checks: bool,
    /// `PILOT_WORKLOAD_ENTRY_GRACE_PERIOD`.
    pub grace_period: Duration,
    /// Connections older than this (1.5 x the server's max connection age)
    /// no longer protect their entry from the periodic cleanup.
    pub max_connection_age: Option<Duration>,
    /// This istiod (its Pod name), written as the entries' controller.
    pub instance_id: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            auto_registration: true,
            health_checks: true,
            grace_period: DEFAULT_GRACE_PERIOD,
            max_connection_age: None,
            instance_id: "istiod".into(),
        }
    }
}

/// The connecting proxy, as the controller needs it.
#[derive(Debug, Clone, Default)]
pub struct Registrant {
    /// The proxy's id, for messages.
    pub id: String,
    /// Its namespace (metadata `NAMESPACE`).
    pub namespace: String,
    /// Its first IP.
    pub ip: String,
    /// Metadata `AUTO_REGISTER_GROUP`.
    pub group: Option<String>,
    /// Metadata `NETWORK`.
    pub network: String,
    /// Metadata `LABELS`.
    pub labels: Labels,
    /// `node.locality` as `region/zone/subzone` (empty when unset).
    pub locality: String,
    /// Whether its ProxyConfig has a `readinessProbe`.
    pub reports_health: bool,
    /// The identity its credentials proved (`None` on the plaintext port).
    pub identity: Option<common::Identity>,
}

/// Why a proxy is not registered; the connection is refused with it.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// The group does not exist.
    #[error(
        "auto-registration WorkloadEntry of {proxy} failed: cannot find WorkloadGroup {namespace}/{group}"
    )]
    GroupNotFound {
        /// The proxy.
        proxy: String,
        /// Its namespace.
        namespace: String,
        /// The group it named.
        group: String,
    },
    /// The proxy proved no identity (plaintext port).
    #[error(
        "registration of WorkloadEntry requires a verified identity (connect to istiod's authenticated port)"
    )]
    Unverified,
    /// The identity is of another namespace.
    #[error("registration of WorkloadEntry namespace mismatch: {identity:?} vs {entry:?}")]
    Namespace {
        /// The identity's namespace.
        identity: String,
        /// The entry's.
        entry: String,
    },
    /// The identity is of another service account.
    #[error("registration of WorkloadEntry service account mismatch: {identity:?} vs {entry:?}")]
    ServiceAccount {
        /// The identity's service account.
        identity: String,
        /// The template's.
        entry: String,
    },
    /// The proxy cannot be registered as it is.
    #[error("auto-registration of {proxy} failed: {reason}")]
    Invalid {
        /// The proxy.
        proxy: String,
        /// Why.
        reason: String,
    },
    /// Writing the entry failed.
    #[error("auto-registration WorkloadEntry {key} failed: {source}")]
    Write {
        /// The entry.
        key: String,
        /// The error.
        #[source]
        source: WriteError,
    },
}

impl From<RegistrationError> for tonic::Status {
    fn from(e: RegistrationError) -> Self {
        let message = e.to_string();
        match e {
            RegistrationError::GroupNotFound { .. } => tonic::Status::failed_precondition(message),
            RegistrationError::Unverified
            | RegistrationError::Namespace { .. }
            | RegistrationError::ServiceAccount { .. } => tonic::Status::permission_denied(message),
            RegistrationError::Invalid { .. } => tonic::Status::invalid_argument(message),
            RegistrationError::Write { .. } => tonic::Status::unavailable(message),
        }
    }
}

/// The entry a connection controls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The entry's namespace.
    pub namespace: String,
    /// The entry's name.
    pub name: String,
    /// When the connection started.
    pub connected_at: SystemTime,
}

/// What an agent reported (Istio's `HealthEvent`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthEvent {
    /// Whether the probe passed.
    pub healthy: bool,
    /// Why not.
    pub message: String,
}

impl HealthEvent {
    /// The health an `istio.io/health` request reports (`None` for any
    /// other type): unhealthy with the error's message when it has one.
    pub fn of_request(
        type_url: &str,
        error: Option<&proto::pb::google::rpc::Status>,
    ) -> Option<Self> {
        (type_url == common::xds::HEALTH_INFO_TYPE).then(|| HealthEvent {
            healthy: error.is_none(),
            message: error.map(|e| e.message.clone()).unwrap_or_default(),
        })
    }
}

struct HealthWork {
    namespace: String,
    name: String,
    condition: IstioCondition,
}

/// The running controller. Shared by every ADS stream.
pub struct Controller {
    settings: Settings,
    store: ConfigStore,
    writer: Writer,
    /// Live connections per entry (Istio's `adsConnections`).
    connections: Mutex<HashMap<(String, String), usize>>,
    health: mpsc::UnboundedSender<HealthWork>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Controller {
    /// Starts the controller (its health queue and periodic cleanup), or
    /// `None` when both auto-registration and health checks are off.
    pub fn start(
        settings: Settings,
        store: ConfigStore,
        writer: Writer,
        shutdown: watch::Receiver<bool>,
    ) -> Option<Arc<Self>> {
        if !settings.auto_registration && !settings.health_checks {
            return None;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let c = Arc::new(Self {
            settings,
            store,
            writer,
            connections: Mutex::default(),
            health: tx,
        });
        tokio::spawn(c.clone().run_health(rx, shutdown.clone()));
        tokio::spawn(c.clone().run_cleanup(shutdown));
        Some(c)
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// A proxy connected (Istio's `OnConnect`): registers (or takes over)
    /// its entry when it names a group. `Err` refuses the connection.
    pub async fn on_connect(
        &self,
        r: &Registrant,
        now: SystemTime,
    ) -> Result<Option<Registration>, RegistrationError> {
        if !self.settings.auto_registration {
            return Ok(None);
        }
        let Some(group) = r.group.as_deref() else {
            return Ok(None);
        };
        let name = entry_name(r, group)?;
        self.register(r, group, &name, now).await?;
        *self
            .lock()
            .entry((r.namespace.clone(), name.clone()))
            .or_default() += 1;
        tracing::info!(target: "wle", "auto-registered WorkloadEntry {}/{name} for {}", r.namespace, r.id);
        Ok(Some(Registration {
            namespace: r.namespace.clone(),
            name,
            connected_at: now,
        }))
    }

    async fn register(
        &self,
        r: &Registrant,
        group: &str,
        name: &str,
        now: SystemTime,
    ) -> Result<(), RegistrationError> {
        let snapshot = self.store.snapshot();
        let key = format!("{}/{name}", r.namespace);
        let write_err = |source| RegistrationError::Write {
            key: key.clone(),
            source,
        };
        if let Some(existing) = snapshot.get_typed::<WorkloadEntry>(&r.namespace, name) {
            ensure_can_control(r, existing.namespace(), &existing.spec.service_account)?;
            return self.mark_connected(existing, now).await.map_err(write_err);
        }
        let group_key = ObjectKey::new(Kind::WorkloadGroup, &r.namespace, group);
        let Some(group_obj) = snapshot.get(&group_key) else {
            return Err(RegistrationError::GroupNotFound {
                proxy: r.id.clone(),
                namespace: r.namespace.clone(),
                group: group.to_string(),
            });
        };
        let entry = entry_from_group(name, r, group_obj, &self.settings.instance_id, now);
        let sa = match &entry.spec {
            Spec::WorkloadEntry(we) => we.service_account.clone(),
            _ => String::new(),
        };
        ensure_can_control(r, &r.namespace, &sa)?;
        match self.writer.create(entry).await {
            Ok(()) => Ok(()),
            // Created a moment ago and not in the store yet: take it over.
            Err(WriteError::AlreadyExists(_)) => self
                .writer
                .annotate(
                    &r.namespace,
                    name,
                    &connected(&self.settings.instance_id, now),
                )
                .await
                .map_err(write_err),
            Err(e) => Err(write_err(e)),
        }
    }

    async fn mark_connected(
        &self,
        existing: Typed<'_, WorkloadEntry>,
        now: SystemTime,
    ) -> Result<(), WriteError> {
        let annotations = &existing.object.metadata.annotations;
        if !should_mark_connected(annotations, &self.settings.instance_id, now) {
            return Ok(());
        }
        self.writer
            .annotate(
                existing.namespace(),
                existing.name(),
                &connected(&self.settings.instance_id, now),
            )
            .await
    }

    /// A connection ended (Istio's `OnDisconnect`): when it was the entry's
    /// last, the entry is marked disconnected and, after the grace period,
    /// deleted unless the proxy came back.
    pub fn on_disconnect(self: &Arc<Self>, reg: Registration, now: SystemTime) {
        {
            let mut conns = self.lock();
            let key = (reg.namespace.clone(), reg.name.clone());
            let left = conns.get(&key).copied().unwrap_or(1).saturating_sub(1);
            if left > 0 {
                conns.insert(key, left);
                return;
            }
            conns.remove(&key);
        }
        let c = self.clone();
        tokio::spawn(async move {
            if let Err(e) = c.unregister(&reg, now).await {
                tracing::warn!(target: "wle", "disconnect of WorkloadEntry {}/{}: {e}", reg.namespace, reg.name);
            }
        });
    }

    async fn unregister(&self, reg: &Registration, now: SystemTime) -> Result<(), WriteError> {
        let snapshot = self.store.snapshot();
        let Some(entry) = snapshot.get_typed::<WorkloadEntry>(&reg.namespace, &reg.name) else {
            return Ok(());
        };
        let annotations = &entry.object.metadata.annotations;
        if !should_mark_disconnected(
            annotations,
            &self.settings.instance_id,
            reg.connected_at,
            now,
        ) {
            return Ok(());
        }
        let mut changes = BTreeMap::new();
        changes.insert(ANNOTATION_CONNECTED_AT.to_string(), None);
        changes.insert(
            ANNOTATION_DISCONNECTED_AT.to_string(),
            Some(format_time(now)),
        );
        self.writer
            .annotate(&reg.namespace, &reg.name, &changes)
            .await?;
        tracing::info!(target: "wle", "updated auto-registered WorkloadEntry {}/{} as disconnected", reg.namespace, reg.name);
        // A little past the grace period, so the check below sees it over.
        tokio::time::sleep(self.settings.grace_period + Duration::from_millis(50)).await;
        let snapshot = self.store.snapshot();
        if let Some(entry) = snapshot.get_typed::<WorkloadEntry>(&reg.namespace, &reg.name)
            && self.should_cleanup(&entry.object.metadata.annotations, SystemTime::now())
        {
            self.writer.delete(&reg.namespace, &reg.name).await?;
            tracing::info!(target: "wle", "cleaned up auto-registered WorkloadEntry {}/{}", reg.namespace, reg.name);
        }
        Ok(())
    }

    /// Whether an entry is to be deleted (Istio's `shouldCleanupEntry`, for
    /// auto-registered entries).
    pub fn should_cleanup(&self, annotations: &Labels, now: SystemTime) -> bool {
        should_cleanup(
            annotations,
            now,
            self.settings.grace_period,
            self.settings.max_connection_age,
        )
    }

    /// An agent reported its workload's health (Istio's
    /// `QueueWorkloadEntryHealth`): queued, written as the entry's
    /// `Healthy` condition.
    pub fn on_health(&self, reg: &Registration, event: &HealthEvent, now: SystemTime) {
        if !self.settings.health_checks {
            return;
        }
        let _ = self.health.send(HealthWork {
            namespace: reg.namespace.clone(),
            name: reg.name.clone(),
            condition: health_condition(event, now),
        });
    }

    async fn run_health(
        self: Arc<Self>,
        mut rx: mpsc::UnboundedReceiver<HealthWork>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            let work = tokio::select! {
                w = rx.recv() => match w { Some(w) => w, None => return },
                _ = shutdown.wait_for(|s| *s) => return,
            };
            for attempt in 1..=HEALTH_ATTEMPTS {
                match self.update_health(&work).await {
                    Ok(()) => break,
                    Err(e) if attempt == HEALTH_ATTEMPTS => {
                        tracing::warn!(target: "wle", "health of WorkloadEntry {}/{} not written: {e}", work.namespace, work.name);
                    }
                    Err(_) => tokio::time::sleep(HEALTH_RETRY).await,
                }
            }
        }
    }

    /// Istio's `UpdateHealth`: only the controlling istiod writes, and an
    /// older probe never replaces a newer one.
    async fn update_health(&self, work: &HealthWork) -> Result<(), WriteError> {
        let snapshot = self.store.snapshot();
        let Some(entry) = snapshot.get_typed::<WorkloadEntry>(&work.namespace, &work.name) else {
            return Err(WriteError::NotFound(format!(
                "{}/{}",
                work.namespace, work.name
            )));
        };
        let annotations = &entry.object.metadata.annotations;
        if annotations.get(ANNOTATION_CONTROLLER) != Some(&self.settings.instance_id) {
            return Ok(());
        }
        let Some(conditions) = merge_condition(&entry.spec.status_conditions, &work.condition)
        else {
            return Ok(());
        };
        self.writer
            .set_conditions(&work.namespace, &work.name, &conditions)
            .await?;
        tracing::info!(target: "wle", "WorkloadEntry {}/{}: Healthy={}", work.namespace, work.name, work.condition.status);
        Ok(())
    }

    /// Istio's `periodicWorkloadEntryCleanup`: every ten grace periods,
    /// auto-registered entries disconnected for longer than the grace
    /// period (left by an istiod that stopped) are deleted.
    async fn run_cleanup(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let period = (self.settings.grace_period * 10).max(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
            let snapshot = self.store.snapshot();
            let now = SystemTime::now();
            let stale: Vec<(String, String)> = snapshot
                .list::<WorkloadEntry>()
                .filter(|we| {
                    let a = &we.object.metadata.annotations;
                    a.contains_key(ANNOTATION_GROUP) && self.should_cleanup(a, now)
                })
                .map(|we| (we.namespace().to_string(), we.name().to_string()))
                .collect();
            for (ns, name) in stale {
                match self.writer.delete(&ns, &name).await {
                    Ok(()) => {
                        tracing::info!(target: "wle", "cleaned up auto-registered WorkloadEntry {ns}/{name} periodic:true")
                    }
                    Err(e) => {
                        tracing::warn!(target: "wle", "cleaning up WorkloadEntry {ns}/{name}: {e}")
                    }
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), usize>> {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Istio's `autoregisteredWorkloadEntryName`: `<group>-<ip>[-<network>]`,
/// `:` of an IPv6 address as `-`, cut from the front to 253 characters.
pub fn entry_name(r: &Registrant, group: &str) -> Result<String, RegistrationError> {
    let invalid = |reason: &str| RegistrationError::Invalid {
        proxy: r.id.clone(),
        reason: reason.to_string(),
    };
    if r.ip.is_empty() {
        return Err(invalid("missing IP addresses"));
    }
    if r.namespace.is_empty() {
        return Err(invalid("missing namespace"));
    }
    if !r.network.is_empty() {
        // The entry would carry `network`, which this istiod refuses.
        return Err(invalid(
            "metadata NETWORK is set, and multi-network meshes are not supported by this istiod (unset ISTIO_META_NETWORK)",
        ));
    }
    let mut parts = vec![group.to_string(), r.ip.replace(':', "-")];
    if !r.network.is_empty() {
        parts.push(r.network.clone());
    }
    let name = parts.join("-");
    Ok(match name.len().checked_sub(253) {
        Some(cut) if cut > 0 => name[cut..].to_string(),
        _ => name,
    })
}

/// Istio's `ensureProxyCanControlEntry` (`PILOT_...VALIDATE_WORKLOAD_ENTRY_IDENTITY`
/// on, its default): the proxy's verified identity is of the entry's
/// namespace and, when the entry names one, its service account.
pub fn ensure_can_control(
    r: &Registrant,
    namespace: &str,
    service_account: &str,
) -> Result<(), RegistrationError> {
    let Some(id) = &r.identity else {
        return Err(RegistrationError::Unverified);
    };
    if id.namespace != namespace {
        return Err(RegistrationError::Namespace {
            identity: id.namespace.clone(),
            entry: namespace.to_string(),
        });
    }
    if !service_account.is_empty() && id.service_account != service_account {
        return Err(RegistrationError::ServiceAccount {
            identity: id.service_account.clone(),
            entry: service_account.to_string(),
        });
    }
    Ok(())
}

/// Istio's `workloadEntryFromGroup` (with `setConnectMeta`): the group's
/// template at the proxy's IP, the group's and then the proxy's labels,
/// the group's annotations, the proxy's locality, owned by the group.
pub fn entry_from_group(
    name: &str,
    r: &Registrant,
    group: &Object,
    instance_id: &str,
    now: SystemTime,
) -> Object {
    let spec = match &group.spec {
        Spec::WorkloadGroup(g) => g.clone(),
        _ => WorkloadGroup::default(),
    };
    let mut entry = spec.template.clone().unwrap_or_default();
    entry.address = r.ip.clone();
    entry.status_conditions.clear();
    if let Some(m) = &spec.metadata {
        entry
            .labels
            .extend(m.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    entry
        .labels
        .extend(r.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    entry.labels.remove(LOCALITY_LABEL);
    let mut annotations =
        BTreeMap::from([(ANNOTATION_GROUP.to_string(), group.metadata.name.clone())]);
    if let Some(m) = &spec.metadata {
        annotations.extend(m.annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    if !r.network.is_empty() {
        entry.network = r.network.clone();
    }
    if !r.locality.is_empty() {
        entry.locality = r.locality.clone();
    }
    if r.reports_health {
        annotations.insert(HEALTH_CHECK_ANNOTATION.to_string(), "true".into());
    }
    for (k, v) in connected(instance_id, now) {
        if let Some(v) = v {
            annotations.insert(k, v);
        }
    }
    Object {
        api_version: Kind::WorkloadEntry.api_version(),
        metadata: ObjectMeta {
            name: name.to_string(),
            namespace: r.namespace.clone(),
            labels: entry.labels.clone(),
            annotations,
            owner_references: vec![OwnerReference {
                api_version: group.api_version.clone(),
                kind: Kind::WorkloadGroup.as_str().to_string(),
                name: group.metadata.name.clone(),
                uid: group.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
            }],
            ..ObjectMeta::default()
        },
        spec: Spec::WorkloadEntry(entry),
    }
}

/// Istio's `setConnectMeta`, as annotation changes (`None` removes).
pub fn connected(instance_id: &str, now: SystemTime) -> BTreeMap<String, Option<String>> {
    BTreeMap::from([
        (
            ANNOTATION_CONTROLLER.to_string(),
            Some(instance_id.to_string()),
        ),
        (ANNOTATION_CONNECTED_AT.to_string(), Some(format_time(now))),
        (ANNOTATION_DISCONNECTED_AT.to_string(), None),
    ])
}

/// Istio's `changeWorkloadEntryStateToConnected` test: a connection older
/// than the entry's last disconnect or connect changes nothing, nor does
/// the same istiod's connection that is not newer.
pub fn should_mark_connected(annotations: &Labels, instance_id: &str, con: SystemTime) -> bool {
    let time = |k: &str| annotations.get(k).and_then(|t| parse_time(t));
    if time(ANNOTATION_DISCONNECTED_AT).is_some_and(|d| con < d) {
        return false;
    }
    let last = time(ANNOTATION_CONNECTED_AT);
    if last.is_some_and(|l| con < l) {
        return false;
    }
    !(annotations.get(ANNOTATION_CONTROLLER).map(String::as_str) == Some(instance_id)
        && last.is_some_and(|l| con <= l))
}

/// Istio's `changeWorkloadEntryStateToDisconnected` test: only the
/// controlling istiod, only for the latest connection, only after it.
pub fn should_mark_disconnected(
    annotations: &Labels,
    instance_id: &str,
    original_connection: SystemTime,
    disconnected: SystemTime,
) -> bool {
    let connected = annotations
        .get(ANNOTATION_CONNECTED_AT)
        .and_then(|t| parse_time(t));
    if connected.is_some_and(|c| c > original_connection) {
        return false;
    }
    if annotations.get(ANNOTATION_CONTROLLER).map(String::as_str) != Some(instance_id) {
        return false;
    }
    connected.is_none_or(|c| disconnected >= c)
}

/// Istio's `shouldCleanupEntry` for an auto-registered entry: connected
/// ones only when the connection is older than the max connection age;
/// disconnected ones once the grace period is over.
pub fn should_cleanup(
    annotations: &Labels,
    now: SystemTime,
    grace: Duration,
    max_connection_age: Option<Duration>,
) -> bool {
    if !annotations.contains_key(ANNOTATION_GROUP) {
        return false;
    }
    if let Some(c) = annotations.get(ANNOTATION_CONNECTED_AT) {
        return match (parse_time(c), max_connection_age) {
            (Some(at), Some(max)) => now.duration_since(at).is_ok_and(|age| age > max),
            _ => false,
        };
    }
    let Some(d) = annotations.get(ANNOTATION_DISCONNECTED_AT) else {
        return false;
    };
    match parse_time(d) {
        Some(at) => now.duration_since(at).is_ok_and(|since| since >= grace),
        None => true,
    }
}

/// Istio's `transformHealthEvent`.
pub fn health_condition(event: &HealthEvent, now: SystemTime) -> IstioCondition {
    let t = format_time(now);
    IstioCondition {
        type_: CONDITION_HEALTHY.to_string(),
        status: if event.healthy { "True" } else { "False" }.to_string(),
        last_probe_time: t.clone(),
        last_transition_time: t,
        reason: String::new(),
        message: if event.healthy {
            String::new()
        } else {
            event.message.clone()
        },
    }
}

/// The conditions with `new` in place of the `Healthy` one, or `None` when
/// the current one was probed later (Istio's `UpdateHealth` check). The
/// transition time stays when the status does not change.
pub fn merge_condition(
    current: &[IstioCondition],
    new: &IstioCondition,
) -> Option<Vec<IstioCondition>> {
    let old = current.iter().find(|c| c.type_ == new.type_);
    let mut new = new.clone();
    if let Some(old) = old {
        if let (Some(o), Some(n)) = (
            parse_time(&old.last_probe_time),
            parse_time(&new.last_probe_time),
        ) && o > n
        {
            return None;
        }
        if old.status == new.status {
            new.last_transition_time
                .clone_from(&old.last_transition_time);
        }
    }
    let mut out: Vec<IstioCondition> = current
        .iter()
        .filter(|c| c.type_ != new.type_)
        .cloned()
        .collect();
    out.push(new);
    Some(out)
}

/// Go's `time.RFC3339Nano` in UTC (fraction without trailing zeros).
pub fn format_time(t: SystemTime) -> String {
    common::clock::rfc3339_nano(t)
}

/// Parses what [`format_time`] writes (and RFC 3339 in UTC generally).
pub fn parse_time(s: &str) -> Option<SystemTime> {
    let s = s.strip_suffix('Z')?;
    let (date, clock) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(str::parse::<i32>);
    let (year, month, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = match clock.split_once('.') {
        Some((hms, frac)) => (hms, frac),
        None => (clock, ""),
    };
    let mut c = hms.splitn(3, ':').map(str::parse::<u8>);
    let (h, m, sec) = (c.next()?.ok()?, c.next()?.ok()?, c.next()?.ok()?);
    let nanos = if frac.is_empty() {
        0
    } else if frac.len() <= 9 && frac.bytes().all(|b| b.is_ascii_digit()) {
        format!("{frac:0<9}").parse::<u32>().ok()?
    } else {
        return None;
    };
    let date = time::Date::from_calendar_date(
        year,
        time::Month::try_from(u8::try_from(month).ok()?).ok()?,
        u8::try_from(day).ok()?,
    )
    .ok()?;
    let clock = time::Time::from_hms_nano(h, m, sec, nanos).ok()?;
    Some(SystemTime::from(
        time::PrimitiveDateTime::new(date, clock).assume_utc(),
    ))
}
