//! The push pipeline: config and endpoint changes are debounced
//! (`PILOT_DEBOUNCE_AFTER`, `PILOT_DEBOUNCE_MAX`), merged, turned into one new
//! immutable push context and published to every connection. A batch made
//! only of endpoint changes becomes an incremental EDS push for the affected
//! hosts (Istio's "PUSH INC").

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, IntCounter, Registry};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::xds::{PushContext, PushRequest};

/// `PILOT_DEBOUNCE_AFTER`.
pub const DEFAULT_DEBOUNCE_AFTER: Duration = Duration::from_millis(100);
/// `PILOT_DEBOUNCE_MAX`.
pub const DEFAULT_DEBOUNCE_MAX: Duration = Duration::from_secs(10);

/// One change that may need a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// `Kind/namespace/name`, for logs.
    pub key: String,
    /// Only endpoints changed (EndpointSlice, WorkloadEntry, Pod IPs).
    pub endpoint_only: bool,
    /// Service hosts whose endpoints changed (for incremental EDS).
    pub hosts: BTreeSet<String>,
}

/// The push metrics.
#[derive(Clone)]
pub struct PushMetrics {
    /// `pilot_debounce_time`: first change to push published, context build included.
    pub debounce_time: Histogram,
    /// `pilot_push_triggers`-like count of pushes published.
    pub pushes_published: IntCounter,
    /// `pilot_eds_no_instances`-style count of incremental pushes.
    pub incremental_pushes: IntCounter,
}

impl PushMetrics {
    /// Registers the metrics.
    pub fn new(r: &Registry) -> Result<Self, prometheus::Error> {
        let debounce_time = Histogram::with_opts(
            HistogramOpts::new("pilot_debounce_time", "Delay in seconds between the first config enters debouncing and the merged push request is pushed into the push queue.")
                .buckets(vec![0.01, 0.1, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0]),
        )?;
        let pushes_published = IntCounter::new(
            "pilot_push_context_builds",
            "Push contexts built and published.",
        )?;
        let incremental_pushes = IntCounter::new(
            "pilot_eds_incremental_pushes",
            "Endpoint-only pushes published.",
        )?;
        for c in [
            Box::new(debounce_time.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(pushes_published.clone()),
            Box::new(incremental_pushes.clone()),
        ] {
            r.register(c)?;
        }
        Ok(Self {
            debounce_time,
            pushes_published,
            incremental_pushes,
        })
    }
}

/// Builds a push context from the current state; called once per push.
pub trait ContextBuilder: Send + 'static {
    /// A new immutable context with the given push version.
    fn build(&mut self, version: String) -> Arc<dyn PushContext>;
}

impl<F: FnMut(String) -> Arc<dyn PushContext> + Send + 'static> ContextBuilder for F {
    fn build(&mut self, version: String) -> Arc<dyn PushContext> {
        self(version)
    }
}

/// Istio's push version: `<RFC3339 now>/<counter>`.
pub fn push_version(counter: u64) -> String {
    let t = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z/{counter}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Runs the debounce loop until `changes` closes. The first context is built
/// and published at once (the initial push); later ones after debouncing.
pub async fn run(
    mut changes: mpsc::Receiver<Change>,
    mut builder: impl ContextBuilder,
    pushes: watch::Sender<Option<PushRequest>>,
    after: Duration,
    max: Duration,
    metrics: PushMetrics,
) {
    let mut seq = pushes.borrow().as_ref().map(|p| p.seq).unwrap_or(0);
    loop {
        // Wait for the first change of a batch.
        let Some(first) = changes.recv().await else {
            return;
        };
        let start = Instant::now();
        let mut last = start;
        let mut count = 1usize;
        let mut endpoint_only = first.endpoint_only;
        let mut hosts = first.hosts.clone();
        let first_key = first.key.clone();
        let mut closed = false;
        loop {
            let quiet_deadline = last + after;
            let max_deadline = start + max;
            let deadline = quiet_deadline.min(max_deadline);
            tokio::select! {
                c = changes.recv() => match c {
                    Some(c) => {
                        count += 1;
                        last = Instant::now();
                        endpoint_only &= c.endpoint_only;
                        hosts.extend(c.hosts);
                    }
                    None => { closed = true; break; }
                },
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        seq += 1;
        let version = push_version(seq);
        tracing::info!(
            target: "ads",
            "Push debounce stable[{seq}] {count} for config {first_key} and {} more configs: {:?} since last change, {:?} since first change",
            count - 1,
            last.elapsed(),
            start.elapsed()
        );
        // Building walks every object of the store: off the async runtime,
        // so streams keep being served meanwhile.
        let (back, ctx) = match tokio::task::spawn_blocking(move || {
            let ctx = builder.build(version);
            (builder, ctx)
        })
        .await
        {
            Ok(built) => built,
            // A panic while building is a bug: it stays one, as before.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled: the runtime is shutting down.
            Err(_) => return,
        };
        builder = back;
        let eds_only = endpoint_only.then_some(hosts);
        if eds_only.is_some() {
            metrics.incremental_pushes.inc();
        }
        metrics.pushes_published.inc();
        pushes.send_replace(Some(PushRequest {
            seq,
            ctx,
            eds_only,
            start: start.into_std(),
        }));
        metrics.debounce_time.observe(start.elapsed().as_secs_f64());
        if closed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::{Proxy, Resource};

    struct V(String);
    impl PushContext for V {
        fn version(&self) -> &str {
            &self.0
        }
        fn generate(
            &self,
            _: &Proxy,
            _: &str,
            _: &BTreeSet<String>,
        ) -> Result<Vec<Arc<Resource>>, crate::xds::generator::GenerateError> {
            Ok(vec![])
        }
    }

    fn change(key: &str, endpoint_only: bool, host: &str) -> Change {
        Change {
            key: key.into(),
            endpoint_only,
            hosts: [host.to_string()].into(),
        }
    }

    fn setup() -> (
        mpsc::Sender<Change>,
        watch::Receiver<Option<PushRequest>>,
        tokio::task::JoinHandle<()>,
    ) {
        let (tx, rx) = mpsc::channel(64);
        let (ptx, prx) = watch::channel(None);
        let metrics = PushMetrics::new(&Registry::new()).unwrap();
        let builder = |v: String| Arc::new(V(v)) as Arc<dyn PushContext>;
        let h = tokio::spawn(run(
            rx,
            builder,
            ptx,
            DEFAULT_DEBOUNCE_AFTER,
            DEFAULT_DEBOUNCE_MAX,
            metrics,
        ));
        (tx, prx, h)
    }

    #[tokio::test(start_paused = true)]
    async fn changes_within_debounce_after_merge_into_one_push() {
        let (tx, mut prx, _h) = setup();
        for i in 0..5 {
            tx.send(change(&format!("VirtualService/default/vs{i}"), false, "a"))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        prx.changed().await.unwrap();
        let p = prx.borrow_and_update().clone().unwrap();
        assert_eq!(p.seq, 1);
        assert!(p.eds_only.is_none(), "a config change is a full push");
        // Nothing else is pending.
        assert!(
            tokio::time::timeout(Duration::from_secs(1), prx.changed())
                .await
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn debounce_max_bounds_a_stream_of_changes() {
        let (tx, mut prx, _h) = setup();
        let started = Instant::now();
        let sender = tokio::spawn(async move {
            for i in 0..300 {
                if tx
                    .send(change(&format!("ServiceEntry/default/s{i}"), false, "a"))
                    .await
                    .is_err()
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        prx.changed().await.unwrap();
        let waited = started.elapsed();
        assert!(
            waited >= DEFAULT_DEBOUNCE_MAX
                && waited < DEFAULT_DEBOUNCE_MAX + Duration::from_millis(200),
            "{waited:?}"
        );
        sender.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn endpoint_only_batches_are_incremental_and_mixed_ones_full() {
        let (tx, mut prx, _h) = setup();
        tx.send(change(
            "EndpointSlice/default/a-1",
            true,
            "a.default.svc.cluster.local",
        ))
        .await
        .unwrap();
        tx.send(change(
            "EndpointSlice/default/b-1",
            true,
            "b.default.svc.cluster.local",
        ))
        .await
        .unwrap();
        prx.changed().await.unwrap();
        let p = prx.borrow_and_update().clone().unwrap();
        let hosts: Vec<String> = p.eds_only.clone().unwrap().into_iter().collect();
        assert_eq!(
            hosts,
            ["a.default.svc.cluster.local", "b.default.svc.cluster.local"]
        );
        tx.send(change("EndpointSlice/default/a-1", true, "a"))
            .await
            .unwrap();
        tx.send(change("DestinationRule/default/a", false, "a"))
            .await
            .unwrap();
        prx.changed().await.unwrap();
        let p = prx.borrow_and_update().clone().unwrap();
        assert!(p.eds_only.is_none());
        assert_eq!(p.seq, 2);
        assert!(p.ctx.version().ends_with("/2"));
    }
}
