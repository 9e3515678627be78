//! Registering Prometheus metrics under Istio's names. A name that does not
//! parse or is registered twice is a programming error, but it is reported
//! as a [`MetricsError`] up to the binary's start-up, which exits non-zero
//! naming the metric, as it does for a bad flag.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

/// Why a metric could not be created or registered.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The metric's name, help or labels were refused when it was built.
    #[error("metric {name}: {source}")]
    Invalid {
        /// The metric.
        name: String,
        /// What `prometheus` said.
        source: prometheus::Error,
    },
    /// A metric of the same name (or descriptor) is already in the registry.
    #[error("metric {name} registered twice: {source}")]
    AlreadyRegistered {
        /// The metric.
        name: String,
        /// What `prometheus` said.
        source: prometheus::Error,
    },
    /// The registry refused the metric for another reason (a descriptor
    /// inconsistent with one already registered).
    #[error("metric {name} refused by the registry: {source}")]
    Refused {
        /// The metric.
        name: String,
        /// What `prometheus` said.
        source: prometheus::Error,
    },
}

impl MetricsError {
    /// For `map_err` on a metric's constructor: the metric `name` was refused.
    pub fn invalid(name: &str) -> impl FnOnce(prometheus::Error) -> Self + '_ {
        move |source| Self::Invalid {
            name: name.to_string(),
            source,
        }
    }

    /// The metric this error is about.
    pub fn name(&self) -> &str {
        match self {
            Self::Invalid { name, .. }
            | Self::AlreadyRegistered { name, .. }
            | Self::Refused { name, .. } => name,
        }
    }
}

/// Registers `c` in `registry` under `name` (used in the error only).
pub fn register<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    name: &str,
    c: C,
) -> Result<C, MetricsError> {
    match registry.register(Box::new(c.clone())) {
        Ok(()) => Ok(c),
        Err(source @ prometheus::Error::AlreadyReg) => Err(MetricsError::AlreadyRegistered {
            name: name.to_string(),
            source,
        }),
        Err(source) => Err(MetricsError::Refused {
            name: name.to_string(),
            source,
        }),
    }
}

/// Builds a metric named `name` with `new` and registers it in `registry`.
pub fn build<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    name: &str,
    new: Result<C, prometheus::Error>,
) -> Result<C, MetricsError> {
    register(registry, name, new.map_err(MetricsError::invalid(name))?)
}

/// A counter `name` registered in `registry`.
pub fn counter(registry: &Registry, name: &str, help: &str) -> Result<IntCounter, MetricsError> {
    build(registry, name, IntCounter::new(name, help))
}

/// A counter `name` with `labels`, registered in `registry`.
pub fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, MetricsError> {
    build(
        registry,
        name,
        IntCounterVec::new(Opts::new(name, help), labels),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_registered_twice_is_an_error_naming_it() {
        let registry = Registry::new();
        counter(&registry, "pilot_things", "Things.").unwrap();
        let err = counter(&registry, "pilot_things", "Things.").unwrap_err();
        assert!(
            matches!(&err, MetricsError::AlreadyRegistered { name, .. } if name == "pilot_things"),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .starts_with("metric pilot_things registered twice"),
            "{err}"
        );
    }

    #[test]
    fn a_name_reused_with_labels_is_registered_twice() {
        let registry = Registry::new();
        counter(&registry, "pilot_things", "Things.").unwrap();
        let err = counter_vec(&registry, "pilot_things", "Things.", &["type"]).unwrap_err();
        assert!(
            matches!(err, MetricsError::AlreadyRegistered { .. }),
            "{err:?}"
        );
        assert_eq!(err.name(), "pilot_things");
    }

    #[test]
    fn a_bad_name_is_invalid() {
        let err = counter(&Registry::new(), "bad name", "Bad.").unwrap_err();
        assert!(matches!(err, MetricsError::Invalid { .. }), "{err:?}");
    }
}
