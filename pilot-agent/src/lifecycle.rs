//! The agent's lifecycle: what every part shares about being ready, draining
//! and stopping, with no HTTP in it.
//!
//! - Readiness conditions: parts that must finish something before the Pod
//!   may take traffic hold a [`ReadinessGuard`] (the DNS proxy until its first
//!   name table) or register a check; the status server's `/healthz/ready`
//!   asks [`Lifecycle::check_ready`] after Envoy's own probe, as Istio's status
//!   server runs its additional probers after `ready.Probe`.
//! - Termination: the first cause wins (Istio cancels the agent's context with
//!   a cause: `received signal: terminated`, `/quitquitquit called`); parts
//!   await [`Lifecycle::terminated`].
//! - Drain and quit requests (`POST /drain` is Istio's `DrainNow`,
//!   `POST /quitquitquit` its `DisableDraining` plus cancel), which the agent
//!   awaits to stop Envoy.
//!
//! The status server routes HTTP to this; `app` wires it to the other parts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// The termination cause of `/quitquitquit`, Istio's wording.
pub const QUIT_CAUSE: &str = "/quitquitquit called";

/// Why the Pod is not ready: the text `/healthz/ready` answers with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotReady(pub String);

impl From<String> for NotReady {
    fn from(reason: String) -> Self {
        NotReady(reason)
    }
}

impl From<&str> for NotReady {
    fn from(reason: &str) -> Self {
        NotReady(reason.to_string())
    }
}

type CheckFn = Arc<dyn Fn() -> Result<(), NotReady> + Send + Sync>;

struct ReadinessEntry {
    id: u64,
    name: String,
    /// `None` for a [`ReadinessGuard`]: not ready while it lives.
    check: Option<CheckFn>,
}

#[derive(Default)]
struct ReadinessChecks {
    next_id: AtomicU64,
    entries: Mutex<Vec<ReadinessEntry>>,
}

impl ReadinessChecks {
    fn add(&self, name: String, check: Option<CheckFn>) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.entries).push(ReadinessEntry { id, name, check });
        id
    }

    fn remove(&self, id: u64) {
        lock(&self.entries).retain(|e| e.id != id);
    }

    /// The first failing check's message, in registration order.
    fn check(&self) -> Result<(), NotReady> {
        // Run the checks outside the lock: a check may take its time.
        let entries: Vec<(String, Option<CheckFn>)> = lock(&self.entries)
            .iter()
            .map(|e| (e.name.clone(), e.check.clone()))
            .collect();
        for (name, check) in entries {
            match check {
                None => return Err(NotReady(name)),
                Some(check) => check().inspect_err(|e| {
                    tracing::debug!(target: "status", "readiness check {name} failed: {e}");
                })?,
            }
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock cannot leave the list inconsistent.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Keeps readiness failing with its reason until dropped. Returned by
/// [`Lifecycle::readiness_pending`].
#[must_use = "readiness is blocked only while the guard lives"]
pub struct ReadinessGuard {
    checks: Arc<ReadinessChecks>,
    id: u64,
}

impl ReadinessGuard {
    /// Marks the condition as met (the same as dropping the guard).
    pub fn ready(self) {}
}

impl Drop for ReadinessGuard {
    fn drop(&mut self) {
        self.checks.remove(self.id);
    }
}

/// Readiness conditions, drain and quit requests and the termination cause,
/// shared by the agent's parts in an `Arc`.
pub struct Lifecycle {
    termination: watch::Sender<Option<String>>,
    drain: watch::Sender<bool>,
    quit: watch::Sender<bool>,
    checks: Arc<ReadinessChecks>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self::new()
    }
}

impl Lifecycle {
    /// A lifecycle with no condition pending, not terminating.
    pub fn new() -> Self {
        Self {
            termination: watch::channel(None).0,
            drain: watch::channel(false).0,
            quit: watch::channel(false).0,
            checks: Arc::default(),
        }
    }

    /// Marks the agent as terminating (Istio cancels the agent context with
    /// this cause): Envoy's readiness fails with `server is terminated:
    /// <cause>` from now on. The first cause wins; returns whether this call
    /// set it.
    pub fn terminate(&self, cause: impl Into<String>) -> bool {
        let cause = cause.into();
        self.termination.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            *current = Some(cause);
            true
        })
    }

    /// Why the agent is terminating, once it is.
    pub fn termination_cause(&self) -> Option<String> {
        self.termination.borrow().clone()
    }

    /// Waits until [`terminate`](Self::terminate) is called (SIGTERM or
    /// `/quitquitquit`) and returns the cause.
    pub async fn terminated(&self) -> String {
        let mut rx = self.termination.subscribe();
        // Take the value out before awaiting again: the watch guard is not Send.
        let cause = rx
            .wait_for(Option::is_some)
            .await
            .map(|c| c.clone().unwrap_or_default());
        match cause {
            Ok(cause) => cause,
            // The sender lives in `self`, so this cannot happen.
            Err(_) => std::future::pending().await,
        }
    }

    /// Asks the agent to drain Envoy's listeners now (Istio's `DrainNow`:
    /// `POST /drain`, the native sidecar's preStop hook).
    pub fn request_drain(&self) {
        self.drain.send_replace(true);
    }

    /// Whether a drain was requested.
    pub fn is_drain_requested(&self) -> bool {
        *self.drain.borrow()
    }

    /// Waits until a drain is requested; returns at once if it already was.
    pub async fn drain_requested(&self) {
        let mut rx = self.drain.subscribe();
        if rx.wait_for(|v| *v).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Asks the agent to exit (`POST /quitquitquit`): sets the quit flag, then
    /// terminates with the cause [`QUIT_CAUSE`].
    pub fn request_quit(&self) {
        self.quit.send_replace(true);
        self.terminate(QUIT_CAUSE);
    }

    /// Whether `/quitquitquit` was called.
    pub fn is_quit_requested(&self) -> bool {
        *self.quit.borrow()
    }

    /// Waits until `/quitquitquit` is called; returns at once if it was.
    pub async fn quit_requested(&self) {
        let mut rx = self.quit.subscribe();
        if rx.wait_for(|v| *v).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Whether termination should skip draining and kill Envoy at once:
    /// true after `/quitquitquit` (Istio's `DisableDraining`) or `/drain`
    /// (already drained).
    pub fn skip_drain(&self) -> bool {
        self.is_quit_requested() || self.is_drain_requested()
    }

    /// Adds a readiness condition checked after Envoy's, in registration
    /// order; its error text is `/healthz/ready`'s answer (e.g. Istio's
    /// `istio DNS capture is turned ON and DNS lookup table is not ready yet`).
    pub fn add_readiness_check(
        &self,
        name: impl Into<String>,
        check: impl Fn() -> Result<(), NotReady> + Send + Sync + 'static,
    ) {
        self.checks.add(name.into(), Some(Arc::new(check)));
    }

    /// Keeps readiness failing with `reason` until the guard is dropped.
    pub fn readiness_pending(&self, reason: impl Into<String>) -> ReadinessGuard {
        let id = self.checks.add(reason.into(), None);
        ReadinessGuard {
            checks: self.checks.clone(),
            id,
        }
    }

    /// The registered conditions, in registration order; the first one not
    /// met is the answer.
    pub fn check_ready(&self) -> Result<(), NotReady> {
        self.checks.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    const WAIT: Duration = Duration::from_secs(10);

    #[test]
    fn conditions_answer_in_registration_order() {
        let lifecycle = Lifecycle::new();
        assert_eq!(lifecycle.check_ready(), Ok(()));
        let first = lifecycle.readiness_pending("waiting for the first NDS push");
        let flag = Arc::new(AtomicBool::new(false));
        let seen = flag.clone();
        lifecycle.add_readiness_check("dns", move || {
            if seen.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err("DNS lookup table is not ready yet".into())
            }
        });
        assert_eq!(
            lifecycle.check_ready(),
            Err(NotReady("waiting for the first NDS push".to_string()))
        );
        first.ready();
        assert_eq!(
            lifecycle.check_ready(),
            Err(NotReady("DNS lookup table is not ready yet".to_string()))
        );
        flag.store(true, Ordering::SeqCst);
        assert_eq!(lifecycle.check_ready(), Ok(()));
        drop(lifecycle.readiness_pending("dropped at once"));
        assert_eq!(lifecycle.check_ready(), Ok(()));
    }

    #[tokio::test]
    async fn the_first_termination_cause_wins() {
        let lifecycle = Lifecycle::new();
        assert_eq!(lifecycle.termination_cause(), None);
        assert!(lifecycle.terminate("received signal: terminated"));
        assert!(!lifecycle.terminate("something else"));
        let cause = tokio::time::timeout(WAIT, lifecycle.terminated())
            .await
            .unwrap();
        assert_eq!(cause, "received signal: terminated");
    }

    #[tokio::test]
    async fn drain_keeps_running_and_quit_terminates() {
        let lifecycle = Lifecycle::new();
        assert!(!lifecycle.skip_drain());
        lifecycle.request_drain();
        tokio::time::timeout(WAIT, lifecycle.drain_requested())
            .await
            .unwrap();
        assert!(lifecycle.skip_drain() && !lifecycle.is_quit_requested());
        assert_eq!(lifecycle.termination_cause(), None);
        lifecycle.request_quit();
        tokio::time::timeout(WAIT, lifecycle.quit_requested())
            .await
            .unwrap();
        assert_eq!(lifecycle.termination_cause().as_deref(), Some(QUIT_CAUSE));
    }
}
