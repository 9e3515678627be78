//! Istio's limit on new xDS streams (`PILOT_MAX_REQUESTS_PER_SECOND`): a
//! token bucket holding one token, refilled at the configured rate. A new
//! stream takes the next token, waiting up to a second for it; one that
//! would wait longer is refused at once with `RESOURCE_EXHAUSTED`, so a
//! burst of reconnecting proxies (every proxy after an istiod restart) is
//! admitted at a bounded rate and the rest retry with their back-off.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The longest a new stream waits for its turn (Istio's one second).
pub const MAX_WAIT: Duration = Duration::from_secs(1);

/// Istio's default when `PILOT_MAX_REQUESTS_PER_SECOND` is 0 or unset:
/// `min(15 + 5 × procs, 100)` streams per second, procs being the CPUs
/// the process may use.
pub fn default_rate(procs: usize) -> f64 {
    (15.0 + 5.0 * procs as f64).min(100.0)
}

/// A new stream would wait longer than [`MAX_WAIT`] for its turn.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "request rate limit exceeded: the next turn is {0:?} away (at most {MAX_WAIT:?} is waited)"
)]
pub struct Exhausted(pub Duration);

/// The limiter: a generic cell rate algorithm with a burst of one, which
/// is a token bucket of one token.
#[derive(Debug)]
pub struct StreamLimiter {
    interval: Duration,
    /// When the next token is free.
    next: Mutex<Option<Instant>>,
}

impl StreamLimiter {
    /// A limiter admitting `per_second` streams a second (at least one a
    /// minute, whatever the value).
    pub fn new(per_second: f64) -> Self {
        let per_second = if per_second.is_finite() {
            per_second.max(1.0 / 60.0)
        } else {
            1.0 / 60.0
        };
        Self {
            interval: Duration::from_secs_f64(1.0 / per_second),
            next: Mutex::new(None),
        }
    }

    /// Takes a turn: returns how long to wait for it, or refuses (taking
    /// nothing) when that is longer than [`MAX_WAIT`].
    pub fn reserve(&self, now: Instant) -> Result<Duration, Exhausted> {
        let mut next = self
            .next
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let at = next.map_or(now, |n| n.max(now));
        let wait = at - now;
        if wait > MAX_WAIT {
            return Err(Exhausted(wait));
        }
        *next = Some(at + self.interval);
        Ok(wait)
    }

    /// Waits for a turn, or refuses at once.
    pub async fn admit(&self) -> Result<(), Exhausted> {
        let wait = self.reserve(Instant::now())?;
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_token_then_a_turn_per_interval_and_no_more_than_a_second_ahead() {
        let limiter = StreamLimiter::new(2.0);
        let t0 = Instant::now();
        assert_eq!(limiter.reserve(t0), Ok(Duration::ZERO));
        assert_eq!(limiter.reserve(t0), Ok(Duration::from_millis(500)));
        assert_eq!(limiter.reserve(t0), Ok(Duration::from_secs(1)));
        // A fourth would wait 1.5 s: refused, and it takes no turn.
        assert_eq!(
            limiter.reserve(t0),
            Err(Exhausted(Duration::from_millis(1500)))
        );
        assert_eq!(
            limiter.reserve(t0 + Duration::from_millis(500)),
            Ok(Duration::from_secs(1))
        );
        // Idle time does not bank more than the one token.
        let later = t0 + Duration::from_secs(60);
        assert_eq!(limiter.reserve(later), Ok(Duration::ZERO));
        assert_eq!(limiter.reserve(later), Ok(Duration::from_millis(500)));
    }

    #[test]
    fn istios_default_rate() {
        assert_eq!(default_rate(2), 25.0);
        assert_eq!(default_rate(16), 95.0);
        assert_eq!(default_rate(64), 100.0);
    }
}
