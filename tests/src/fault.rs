//! Shared parts of the fault-injection tests and the soak: steady traffic
//! in the background with every outcome kept, and the recovery figures a
//! fault is judged by.

pub mod control_plane;
pub mod pod;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One request's outcome, as the client saw it.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// When the request was sent.
    pub at: Instant,
    /// `Ok(status)` or the transport error.
    pub result: Result<u16, String>,
}

impl Outcome {
    /// A 200.
    pub fn ok(&self) -> bool {
        matches!(self.result, Ok(200))
    }
}

/// Requests sent one after another from a background thread until
/// [`Traffic::stop`] (or drop), at most one per `pace`.
pub struct Traffic {
    stop: Arc<AtomicBool>,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    thread: Option<JoinHandle<()>>,
}

impl Traffic {
    /// Starts calling `request` (returning the HTTP status or an error)
    /// every `pace`, for at most `limit` (every loop is bounded).
    pub fn start(
        pace: Duration,
        limit: Duration,
        mut request: impl FnMut() -> Result<u16, String> + Send + 'static,
    ) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, outcomes) = (stop.clone(), outcomes.clone());
            std::thread::spawn(move || {
                let begun = Instant::now();
                while !stop.load(Ordering::Relaxed) && begun.elapsed() < limit {
                    let at = Instant::now();
                    let result = request();
                    outcomes
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(Outcome { at, result });
                    if let Some(rest) = pace.checked_sub(at.elapsed()) {
                        std::thread::sleep(rest);
                    }
                }
            })
        };
        Traffic {
            stop,
            outcomes,
            thread: Some(thread),
        }
    }

    /// The outcomes so far.
    pub fn outcomes(&self) -> Vec<Outcome> {
        self.outcomes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Waits until `n` requests sent at or after `since` have succeeded
    /// (a bounded poll of the outcomes; panics after `limit`).
    pub fn wait_successes(&self, n: usize, since: Instant, limit: Duration) {
        crate::wait_for(
            &format!("{n} successful requests sent after the mark"),
            limit,
            || {
                let ok = self
                    .outcomes()
                    .iter()
                    .filter(|o| o.at >= since && o.ok())
                    .count();
                (ok >= n).then_some(())
            },
        );
    }

    /// Stops the traffic and returns every outcome.
    pub fn stop(mut self) -> Vec<Outcome> {
        self.halt();
        self.outcomes()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The failed outcomes (anything but a 200), described.
pub fn failures(outcomes: &[Outcome]) -> Vec<String> {
    outcomes
        .iter()
        .filter(|o| !o.ok())
        .map(|o| match &o.result {
            Ok(code) => format!("HTTP {code}"),
            Err(e) => e.clone(),
        })
        .collect()
}

/// The first successful request sent at or after `since`: how long after
/// `since` it was sent.
pub fn first_success_after(outcomes: &[Outcome], since: Instant) -> Option<Duration> {
    outcomes
        .iter()
        .find(|o| o.at >= since && o.ok())
        .map(|o| o.at - since)
}

/// How one fault went, as BENCHMARKS.md and the tests report it.
#[derive(Clone, Debug)]
pub struct Recovery {
    /// The fault's name.
    pub fault: &'static str,
    /// Requests sent on the unchanged route during the fault and recovery.
    pub sent: usize,
    /// Of those, failed.
    pub failed: usize,
    /// From the fault's end to the first successful request.
    pub to_first_success: Option<Duration>,
    /// From the fault's end to the last proxy's ACK of current config.
    pub to_last_ack: Option<Duration>,
    /// The bound the test holds the recovery to.
    pub bound: Duration,
}

impl Recovery {
    /// One Markdown table row: fault, sent, failed, first success, last ACK, bound.
    pub fn row(&self) -> String {
        let d = |d: Option<Duration>| d.map_or("-".to_string(), crate::load::ms);
        format!(
            "| {} | {} | {} | {} | {} | {} |",
            self.fault,
            self.sent,
            self.failed,
            d(self.to_first_success),
            d(self.to_last_ack),
            crate::load::ms(self.bound)
        )
    }
}
