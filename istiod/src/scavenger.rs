//! Hands the heap's free pages back to the kernel now and then, as the Go
//! runtime's background scavenger does for Istio's istiod. Without it, a
//! burst of short-lived state (a thousand connections opened and dropped,
//! a large push) leaves istiod's resident memory at its high-water mark:
//! glibc's allocator only shrinks the top of its heaps by itself, and the
//! freed buffers of many connections sit in the middle of them.

use std::time::Duration;

use tokio::sync::watch;

/// Between two returns of free memory (the Go scavenger paces itself in the
/// background; this is coarser and cheap: one pass over free chunks).
pub const INTERVAL: Duration = Duration::from_secs(10);

/// Returns free heap pages every `interval` until `shutdown`.
pub async fn run(interval: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        // The pass takes the allocator's locks briefly: off the workers.
        let _ = tokio::task::spawn_blocking(common::memory::release_free_heap).await;
    }
}
