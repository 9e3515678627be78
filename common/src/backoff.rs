//! Exponential backoff with jitter, Istio's generic defaults (`pkg/backoff`):
//! 500 ms initial, x1.5, up to 60 s, +-50 % randomisation, never giving up.

use std::time::Duration;

/// An unbounded exponential backoff.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    multiplier: f64,
    randomization: f64,
    current: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(500), Duration::from_secs(60))
    }
}

impl Backoff {
    /// A backoff from `initial` to `max` with Istio's multiplier and jitter.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            multiplier: 1.5,
            randomization: 0.5,
            current: initial,
        }
    }

    /// The next delay to wait.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.current.as_secs_f64();
        let delta = base * self.randomization;
        let jittered = base - delta + rand::random::<f64>() * 2.0 * delta;
        self.current =
            Duration::from_secs_f64((base * self.multiplier).min(self.max.as_secs_f64()));
        Duration::from_secs_f64(jittered.min(self.max.as_secs_f64()))
    }

    /// Starts again from the initial delay.
    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_max_with_jitter() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let first = b.next_delay();
        assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(150));
        for _ in 0..20 {
            assert!(b.next_delay() <= Duration::from_secs(1));
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(150));
    }
}
