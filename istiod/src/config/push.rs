//! Push tuning: how changes are debounced into pushes, how many pushes are
//! generated at once, how fast new xDS streams are admitted, and how long a
//! push may take to be written.

use std::time::Duration;

use common::env::Reader;

use crate::push::{DEFAULT_DEBOUNCE_AFTER, DEFAULT_DEBOUNCE_MAX};

/// `PILOT_DEBOUNCE_AFTER`: quiet time before a push (100ms).
pub const ENV_DEBOUNCE_AFTER: &str = "PILOT_DEBOUNCE_AFTER";
/// `PILOT_DEBOUNCE_MAX`: longest a push waits for quiet (10s).
pub const ENV_DEBOUNCE_MAX: &str = "PILOT_DEBOUNCE_MAX";
/// `PILOT_PUSH_THROTTLE`: pushes generated at once (0: Istio's
/// `min(15 + 5 x CPUs, 100)`).
pub const ENV_PUSH_THROTTLE: &str = "PILOT_PUSH_THROTTLE";
/// `PILOT_MAX_REQUESTS_PER_SECOND`: new xDS streams admitted a second (0:
/// Istio's formula from the CPUs).
pub const ENV_MAX_REQUESTS_PER_SECOND: &str = "PILOT_MAX_REQUESTS_PER_SECOND";
/// `PILOT_XDS_SEND_TIMEOUT`: how long one push may take to be written (0: no limit).
pub const ENV_XDS_SEND_TIMEOUT: &str = "PILOT_XDS_SEND_TIMEOUT";

/// Why the push tuning cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PushConfigError {
    /// `PILOT_MAX_REQUESTS_PER_SECOND` is negative or not finite.
    #[error(
        "{ENV_MAX_REQUESTS_PER_SECOND}={0}: must be a rate of 0 or more (0 picks Istio's default from the CPUs)"
    )]
    MaxRequestsPerSecond(f64),
}

/// Push tuning.
#[derive(Debug, Clone)]
pub struct PushConfig {
    /// `PILOT_DEBOUNCE_AFTER`.
    pub debounce_after: Duration,
    /// `PILOT_DEBOUNCE_MAX`.
    pub debounce_max: Duration,
    /// `PILOT_PUSH_THROTTLE`, resolved (never 0).
    pub throttle: usize,
    /// `PILOT_MAX_REQUESTS_PER_SECOND`, resolved (never 0).
    pub max_requests_per_second: f64,
    /// `PILOT_XDS_SEND_TIMEOUT`: how long one push may take to be written to
    /// a proxy before its stream is closed (0: no limit, Istio's default).
    pub send_timeout: Duration,
}

/// Istio's rate from the CPUs, for a throttle or rate left at 0.
fn default_rate() -> f64 {
    crate::xds::rate_limit::default_rate(
        std::thread::available_parallelism().map_or(1, usize::from),
    )
}

/// Reads the push tuning.
pub(super) fn parse(r: &mut Reader<'_>) -> PushConfig {
    let debounce_after = r.duration(ENV_DEBOUNCE_AFTER, DEFAULT_DEBOUNCE_AFTER);
    let debounce_max = r.duration(ENV_DEBOUNCE_MAX, DEFAULT_DEBOUNCE_MAX);
    // Istio's PILOT_PUSH_THROTTLE: 0 picks min(15 + 5 x CPUs, 100).
    let throttle: usize = match r.parse(ENV_PUSH_THROTTLE, 0) {
        0 => default_rate() as usize,
        n => n,
    };
    let send_timeout = r.duration(ENV_XDS_SEND_TIMEOUT, Duration::ZERO);
    let max_requests_per_second: f64 = r.parse(ENV_MAX_REQUESTS_PER_SECOND, 0.0);
    if max_requests_per_second < 0.0 || !max_requests_per_second.is_finite() {
        r.error(PushConfigError::MaxRequestsPerSecond(max_requests_per_second).to_string());
    }
    let max_requests_per_second = if max_requests_per_second > 0.0 {
        max_requests_per_second
    } else {
        default_rate()
    };
    PushConfig {
        debounce_after,
        debounce_max,
        throttle,
        max_requests_per_second,
        send_timeout,
    }
}

#[cfg(test)]
mod tests {
    use common::env::MapEnv;

    use super::*;

    #[test]
    fn defaults_resolve_and_a_negative_rate_is_refused() {
        let env = MapEnv::default();
        let mut r = Reader::new(&env);
        let c = parse(&mut r);
        r.finish().unwrap();
        assert_eq!(c.debounce_after, DEFAULT_DEBOUNCE_AFTER);
        assert!(c.throttle > 0 && c.max_requests_per_second > 0.0);
        assert_eq!(c.send_timeout, Duration::ZERO);

        let env = MapEnv::from_pairs([(ENV_MAX_REQUESTS_PER_SECOND, "-1")]);
        let mut r = Reader::new(&env);
        parse(&mut r);
        let errors = r.finish().unwrap_err().0;
        assert_eq!(
            errors,
            [PushConfigError::MaxRequestsPerSecond(-1.0).to_string()]
        );
        assert!(
            errors[0].starts_with("PILOT_MAX_REQUESTS_PER_SECOND=-1: "),
            "{errors:?}"
        );
    }
}
