//! Registering Prometheus metrics under Istio's names. A name that does not
//! parse or is registered twice is a programming error found by the first
//! start of any test, so registration panics naming the metric.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

/// Registers `c` in `registry`, panicking with the metric's name if it is
/// already there.
pub fn register<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    name: &str,
    c: C,
) -> C {
    registry
        .register(Box::new(c.clone()))
        .unwrap_or_else(|e| panic!("metric {name} registered twice: {e}"));
    c
}

/// A counter `name` registered in `registry`.
pub fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(registry, name, c)
}

/// A counter `name` with `labels`, registered in `registry`.
pub fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(registry, name, c)
}
