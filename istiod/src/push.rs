//! The push pipeline, one way: the store's change batches (and the mesh
//! config and JWKS triggers) are debounced once (`PILOT_DEBOUNCE_AFTER`,
//! `PILOT_DEBOUNCE_MAX`), a new immutable push context is built from the
//! store's snapshot off the async runtime ([`builder`]), what the batch
//! changed is resolved into who needs which types ([`updates`]), the XDS
//! cache drops what the batch invalidated, and the push is published to
//! every stream. Only one context is built at a time; changes that arrive
//! meanwhile wait for the next push, as Istio's debounce does.

pub(crate) mod builder;
pub(crate) mod updates;

use std::sync::Arc;
use std::time::Duration;

use common::metrics::{MetricsError, build};
use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts, Registry};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;

use crate::model::{ConfigBatch, Kind};
use crate::pushctx::{PushContext, PushRequest, Updates};

pub use builder::Builder;
pub use updates::Pending;

/// `PILOT_DEBOUNCE_AFTER`.
pub const DEFAULT_DEBOUNCE_AFTER: Duration = Duration::from_millis(100);
/// `PILOT_DEBOUNCE_MAX`.
pub const DEFAULT_DEBOUNCE_MAX: Duration = Duration::from_secs(10);

/// A reason to push that does not come from the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The mesh config changed: everything may have.
    Mesh,
    /// RequestAuthentication public keys changed (Istio's `JwksResolver.PushFunc`).
    Jwks,
}

/// The push metrics, with Istio's names.
#[derive(Clone)]
pub struct PushMetrics {
    /// `pilot_debounce_time`: first change to push published, context build included.
    pub debounce_time: Histogram,
    /// `pilot_pushcontext_init_seconds`: building one push context.
    pub init_time: Histogram,
    /// `pilot_push_triggers{type}`: pushes by what triggered them.
    pub triggers: IntCounterVec,
}

impl PushMetrics {
    /// Registers the metrics.
    pub fn new(r: &Registry) -> Result<Self, MetricsError> {
        let debounce_time = build(r, "pilot_debounce_time", Histogram::with_opts(
            HistogramOpts::new("pilot_debounce_time", "Delay in seconds between the first config enters debouncing and the merged push request is pushed into the push queue.")
                .buckets(vec![0.01, 0.1, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0]),
        ))?;
        let init_time = build(
            r,
            "pilot_pushcontext_init_seconds",
            Histogram::with_opts(
                HistogramOpts::new(
                    "pilot_pushcontext_init_seconds",
                    "Total time in seconds Pilot takes to init pushContext.",
                )
                .buckets(vec![0.01, 0.1, 0.5, 1.0, 3.0, 5.0]),
            ),
        )?;
        let triggers = build(
            r,
            "pilot_push_triggers",
            IntCounterVec::new(
                Opts::new(
                    "pilot_push_triggers",
                    "Total number of times a push was triggered, labeled by reason for the push.",
                ),
                &["type"],
            ),
        )?;
        Ok(Self {
            debounce_time,
            init_time,
            triggers,
        })
    }

    /// Counts one push under each of Istio's trigger reasons it has.
    fn count(&self, pending: &Pending) {
        let mut reasons = std::collections::BTreeSet::new();
        if pending.everything {
            reasons.insert("global");
        }
        if pending.jwks {
            reasons.insert("config");
        }
        for (key, endpoint_only) in &pending.objects {
            reasons.insert(match key.kind {
                _ if *endpoint_only => "endpoint",
                Kind::Service | Kind::ServiceEntry => "service",
                Kind::Namespace => "namespace",
                _ => "config",
            });
        }
        for r in reasons {
            self.triggers.with_label_values(&[r]).inc();
        }
    }
}

/// Istio's push version: `<RFC3339 now>/<counter>`.
pub fn push_version(counter: u64) -> String {
    format!("{}/{counter}", common::clock::now_rfc3339())
}

/// A store batch as debouncing merges it; each event is logged as Istio's
/// config controller logs it.
fn pending_of(batch: &ConfigBatch) -> Pending {
    for event in batch.events.iter() {
        tracing::info!(target: "config", "{event}");
    }
    Pending::from_batch(batch)
}

fn pending_of_trigger(t: Trigger) -> Pending {
    Pending {
        everything: t == Trigger::Mesh,
        jwks: t == Trigger::Jwks,
        first: match t {
            Trigger::Mesh => "MeshConfig".into(),
            Trigger::Jwks => "JWKS".into(),
        },
        count: 1,
        ..Default::default()
    }
}

/// Where the pipeline's input comes from.
pub struct Inputs {
    /// The store's change batches.
    pub batches: broadcast::Receiver<ConfigBatch>,
    /// Mesh config and JWKS changes.
    pub triggers: mpsc::Receiver<Trigger>,
}

impl Inputs {
    /// The next trigger; `None` once the sources are gone.
    async fn next(&mut self) -> Option<Pending> {
        tokio::select! {
            b = self.batches.recv() => match b {
                Ok(batch) => Some(pending_of(&batch)),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(target: "ads", "{n} config batches were missed: pushing everything");
                    Some(Pending { everything: true, first: "lost events".into(), count: 1, ..Default::default() })
                }
                Err(broadcast::error::RecvError::Closed) => None,
            },
            t = self.triggers.recv() => t.map(pending_of_trigger),
        }
    }

    /// Drops the batches the snapshot of `version` already holds.
    fn skip_until(&mut self, version: u64) -> Option<Pending> {
        let mut kept = Pending::default();
        loop {
            match self.batches.try_recv() {
                Ok(b) if b.snapshot.version() <= version => {}
                Ok(b) => kept.merge(pending_of(&b)),
                Err(broadcast::error::TryRecvError::Lagged(_)) => {
                    kept.merge(Pending {
                        everything: true,
                        count: 1,
                        ..Default::default()
                    });
                }
                Err(_) => break,
            }
        }
        (kept.count > 0).then_some(kept)
    }
}

/// Waits for the first trigger, then for `after` of quiet (at most `max`
/// in all), merging what arrives. `None` once the inputs are gone.
async fn debounce(
    inputs: &mut Inputs,
    carried: Option<Pending>,
    after: Duration,
    max: Duration,
) -> Option<(Pending, Instant, bool)> {
    let mut pending = match carried {
        Some(p) => p,
        None => inputs.next().await?,
    };
    let start = Instant::now();
    let mut last = start;
    loop {
        let deadline = (last + after).min(start + max);
        tokio::select! {
            next = inputs.next() => match next {
                Some(p) => {
                    pending.merge(p);
                    last = Instant::now();
                }
                None => return Some((pending, start, true)),
            },
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    tracing::info!(
        target: "ads",
        "Push debounce stable {} for config {} and {} more configs: {:?} since last change, {:?} since first change",
        pending.count,
        pending.first,
        pending.count.saturating_sub(1),
        last.elapsed(),
        start.elapsed()
    );
    Some((pending, start, false))
}

/// The pipeline's settings.
pub struct Settings {
    /// `PILOT_DEBOUNCE_AFTER`.
    pub after: Duration,
    /// `PILOT_DEBOUNCE_MAX`.
    pub max: Duration,
    /// The metrics.
    pub metrics: PushMetrics,
}

/// Builds off the async runtime: a builder panic is a bug and stays one.
async fn build_blocking(
    mut builder: Builder,
    seq: u64,
    pending: Option<Pending>,
) -> Option<(Builder, Arc<dyn PushContext>, Updates)> {
    let built = tokio::task::spawn_blocking(move || {
        let (ctx, updates) = match &pending {
            None => (builder.initial(seq), Updates::everything()),
            Some(p) => builder.build(seq, p),
        };
        (builder, ctx as Arc<dyn PushContext>, updates)
    })
    .await;
    match built {
        Ok(b) => Some(b),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Cancelled: the runtime is shutting down.
        Err(_) => None,
    }
}

/// Runs the pipeline: once `synced`, the first push context is built and
/// published and `ready` set (no stream is served before); then a push per
/// debounced batch, until the inputs close.
pub async fn run(
    mut inputs: Inputs,
    builder: Builder,
    mut synced: watch::Receiver<bool>,
    ready: watch::Sender<bool>,
    pushes: watch::Sender<Option<PushRequest>>,
    settings: Settings,
) {
    // Istio serves no xDS until its caches are synced and the first push
    // context exists.
    let _ = synced.wait_for(|s| *s).await;
    let started = std::time::Instant::now();
    let Some((mut builder, ctx, updates)) = build_blocking(builder, 1, None).await else {
        return;
    };
    settings
        .metrics
        .init_time
        .observe(started.elapsed().as_secs_f64());
    let mut last = PushRequest::new(1, ctx, updates, started);
    pushes.send_replace(Some(last.clone()));
    let _ = ready.send(true);
    tracing::info!(target: "ads", "caches synced and first push context built: serving xDS");
    let mut carried = inputs.skip_until(builder.snapshot_version());
    loop {
        let Some((pending, start, closed)) =
            debounce(&mut inputs, carried.take(), settings.after, settings.max).await
        else {
            return;
        };
        let seq = last.seq + 1;
        settings.metrics.count(&pending);
        let building = std::time::Instant::now();
        let Some((back, ctx, updates)) = build_blocking(builder, seq, Some(pending)).await else {
            return;
        };
        builder = back;
        settings
            .metrics
            .init_time
            .observe(building.elapsed().as_secs_f64());
        last = last.next(seq, ctx, updates, start.into_std());
        pushes.send_replace(Some(last.clone()));
        settings
            .metrics
            .debounce_time
            .observe(start.elapsed().as_secs_f64());
        if closed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::Mesh;
    use crate::model::{ConfigStore, RegistryOptions, Update, parse_file};
    use crate::pushctx::cache::XdsCache;
    use crate::pushctx::push_request::{Audience, Types};

    struct Pipeline {
        store: ConfigStore,
        pushes: watch::Receiver<Option<PushRequest>>,
        triggers: mpsc::Sender<Trigger>,
        _ready: watch::Receiver<bool>,
    }

    fn start(after: Duration, max: Duration) -> Pipeline {
        let store = ConfigStore::new();
        let (_m, mesh) = watch::channel(Arc::new(Mesh::default()));
        let builder = Builder::new(
            store.clone(),
            RegistryOptions::default(),
            mesh,
            Arc::default(),
            Arc::new(XdsCache::default()),
        );
        let (tx, triggers) = mpsc::channel(16);
        let inputs = Inputs {
            batches: store.subscribe(),
            triggers,
        };
        let (_synced, synced) = watch::channel(true);
        let (ready_tx, ready) = watch::channel(false);
        let (push_tx, pushes) = watch::channel(None);
        let metrics = PushMetrics::new(&Registry::new()).unwrap();
        tokio::spawn(run(
            inputs,
            builder,
            synced,
            ready_tx,
            push_tx,
            Settings {
                after,
                max,
                metrics,
            },
        ));
        Pipeline {
            store,
            pushes,
            triggers: tx,
            _ready: ready,
        }
    }

    impl Pipeline {
        fn apply(&self, yaml: &str) {
            let objects = parse_file("t.yaml", yaml).unwrap().objects;
            self.store
                .apply(objects.into_iter().map(|o| Update::Upsert(Arc::new(o))));
        }

        async fn next(&mut self) -> PushRequest {
            tokio::time::timeout(Duration::from_secs(10), self.pushes.changed())
                .await
                .expect("a push")
                .unwrap();
            self.pushes.borrow_and_update().clone().unwrap()
        }
    }

    fn vs(name: &str) -> String {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: demo}}\nspec: {{hosts: [a], http: [{{route: [{{destination: {{host: a}}}}]}}]}}\n"
        )
    }

    fn service(ip: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: a, namespace: demo}}\nspec: {{clusterIP: 198.19.0.1, selector: {{app: a}}, ports: [{{name: http, port: 80}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: a-1, namespace: demo, labels: {{kubernetes.io/service-name: a}}}}\naddressType: IPv4\nports: [{{name: http, port: 80}}]\nendpoints: [{{addresses: [{ip}], conditions: {{ready: true}}}}]\n"
        )
    }

    #[tokio::test]
    async fn changes_within_debounce_after_make_one_push_with_all_of_them() {
        let mut p = start(Duration::from_millis(200), Duration::from_secs(10));
        let first = p.next().await;
        assert_eq!(first.seq, 1);
        for i in 0..5 {
            p.apply(&vs(&format!("vs{i}")));
        }
        let push = p.next().await;
        assert_eq!(push.seq, 2);
        let reasons: std::collections::BTreeSet<&str> = push
            .updates
            .changes
            .iter()
            .map(|c| c.reason.as_str())
            .collect();
        assert_eq!(reasons.len(), 5, "one push for the five: {reasons:?}");
        assert!(push.updates.changes.iter().all(|c| c.types == Types::RDS));
        assert!(
            tokio::time::timeout(Duration::from_millis(600), p.pushes.changed())
                .await
                .is_err(),
            "nothing else is pending"
        );
    }

    #[tokio::test]
    async fn debounce_max_bounds_a_stream_of_changes() {
        let mut p = start(Duration::from_millis(100), Duration::from_millis(400));
        p.next().await;
        let store = p.store.clone();
        let writer = tokio::spawn(async move {
            for i in 0..100 {
                let objects = parse_file("t.yaml", &vs(&format!("s{i}"))).unwrap().objects;
                store.apply(objects.into_iter().map(|o| Update::Upsert(Arc::new(o))));
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        });
        // Changes never pause for 100 ms, yet pushes come, each within the max.
        let second = p.next().await;
        assert!(!writer.is_finished(), "pushed while changes kept coming");
        let third = p.next().await;
        assert_eq!(third.seq, second.seq + 1);
        writer.abort();
    }

    #[tokio::test]
    async fn endpoint_changes_are_incremental_and_a_mesh_change_is_everything() {
        let mut p = start(Duration::from_millis(50), Duration::from_secs(10));
        p.next().await;
        p.apply(&service("198.18.0.1"));
        let push = p.next().await;
        assert!(push.updates.changes.iter().any(|c| c.types == Types::ALL));
        p.apply(&service("198.18.0.2"));
        let push = p.next().await;
        let eds: Vec<_> = push
            .updates
            .changes
            .iter()
            .filter(|c| matches!(c.audience, Audience::Services(_)))
            .collect();
        assert_eq!(eds.len(), 1);
        assert_eq!(eds[0].types, Types::EDS);
        assert_eq!(
            eds[0].eds_hosts,
            Some(["a.demo.svc.cluster.local".to_string()].into())
        );
        // The endpoint's old and new IPs are workloads of their own.
        assert!(push.updates.changes.iter().any(|c| matches!(
            &c.audience,
            Audience::Workloads(ips) if ips.contains("198.18.0.1") && ips.contains("198.18.0.2")
        )));
        p.triggers.send(Trigger::Mesh).await.unwrap();
        assert!(p.next().await.updates.everything);
    }

    #[tokio::test]
    async fn a_gateway_change_reaches_routers_only() {
        let mut p = start(Duration::from_millis(50), Duration::from_secs(10));
        p.next().await;
        p.apply(
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: g, namespace: istio-system}\nspec: {servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]}\n",
        );
        let push = p.next().await;
        let audiences: Vec<(&Audience, Types)> = push
            .updates
            .changes
            .iter()
            .map(|c| (&c.audience, c.types))
            .collect();
        assert_eq!(audiences, [(&Audience::Routers, Types::LDS | Types::RDS)]);
    }

    #[tokio::test]
    async fn routers_get_listeners_for_gateway_virtual_services_and_destination_rules() {
        let mut p = start(Duration::from_millis(50), Duration::from_secs(10));
        p.next().await;
        p.apply(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: t, namespace: demo}\nspec: {hosts: ['*'], gateways: [istio-system/g], tcp: [{route: [{destination: {host: a}}]}]}\n",
        );
        let push = p.next().await;
        assert!(
            push.updates
                .changes
                .iter()
                .any(|c| c.audience == Audience::Routers && c.types == Types::LDS | Types::RDS)
        );
        p.apply(
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: a, namespace: demo}\nspec: {host: a, trafficPolicy: {connectionPool: {tcp: {maxConnectionDuration: 30s}}}}\n",
        );
        let push = p.next().await;
        assert!(
            push.updates
                .changes
                .iter()
                .any(|c| c.audience == Audience::Routers && c.types == Types::LDS)
        );
    }

    #[tokio::test]
    async fn a_secret_change_reaches_its_resources_only() {
        let mut p = start(Duration::from_millis(50), Duration::from_secs(10));
        p.next().await;
        p.apply("apiVersion: v1\nkind: Secret\nmetadata: {name: cred, namespace: istio-system}\nstringData: {other: x}\n");
        let push = p.next().await;
        let audiences: Vec<(&Audience, Types)> = push
            .updates
            .changes
            .iter()
            .map(|c| (&c.audience, c.types))
            .collect();
        let secret = Audience::Secret {
            namespace: "istio-system".into(),
            name: "cred".into(),
        };
        assert_eq!(audiences, [(&secret, Types::SDS)]);
        let plan =
            crate::pushctx::push_request::plan_without_scopes(std::slice::from_ref(&push.updates));
        assert_eq!(plan.types, Types::SDS);
        assert_eq!(
            plan.secrets,
            Some(std::collections::BTreeSet::from([
                "istio-system/cred".to_string()
            ]))
        );
    }
}
