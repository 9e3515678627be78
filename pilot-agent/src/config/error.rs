//! The configuration's errors: one typed value per invalid setting, each
//! naming the variable, flag or file it came from, all reported together.

use std::fmt;

use common::duration::DurationError;

use super::status::{AppProberError, ScrapeConfigError};
use super::{ENV_KUBE_APP_PROBERS, ENV_PROMETHEUS_ANNOTATIONS};

/// One invalid value of the agent's configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The positional proxy type is not one the agent runs as.
    #[error("invalid proxy Type {0:?}: use sidecar or router")]
    ProxyType(String),
    /// A boolean variable is not one of Go's `strconv.ParseBool` spellings.
    #[error("{var}={value:?} is not a boolean (use true or false)")]
    NotBool {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// A duration variable is not a Go duration.
    #[error("{var}: {source}")]
    Duration {
        /// The variable.
        var: &'static str,
        /// Why.
        source: DurationError,
    },
    /// A numeric variable does not parse.
    #[error("{var}={value:?}: {reason}")]
    NotNumber {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// The parser's message.
        reason: String,
    },
    /// A variable parses but its value cannot be used.
    #[error("{var}={value:?}: {reason}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong and what to use instead.
        reason: String,
    },
    /// A variable the configuration needs is unset.
    #[error("{var} is not set: {needed_by}")]
    Missing {
        /// The variable.
        var: &'static str,
        /// What needs it.
        needed_by: &'static str,
    },
    /// `CA_ROOT_CA=SYSTEM` on a host without an OS CA bundle.
    #[error("{var}=SYSTEM but no OS CA bundle was found")]
    NoSystemRoots {
        /// The variable.
        var: &'static str,
    },
    /// `PILOT_CERT_PROVIDER=none` leaves the CA connection without a root.
    #[error(
        "{provider}=none but a root certificate is needed for {ca_addr}; set {root}",
        provider = super::ENV_PILOT_CERT_PROVIDER,
        root = super::ENV_CA_ROOT_CA
    )]
    NoCaRoot {
        /// The CA address that needs a root.
        ca_addr: String,
    },
    /// A ProxyConfig layer (mesh config, `PROXY_CONFIG`, annotation) is
    /// invalid; the message names the layer and the field.
    #[error(transparent)]
    ProxyConfig(#[from] crate::proxy_config::ProxyConfigError),
    /// `ISTIO_BOOTSTRAP_OVERRIDE` cannot be read.
    #[error(transparent)]
    BootstrapOverride(#[from] crate::envoy::EnvoyError),
    /// `ISTIO_KUBE_APP_PROBERS` is invalid.
    #[error("{ENV_KUBE_APP_PROBERS}: {0}")]
    AppProber(#[from] AppProberError),
    /// ProxyConfig `readinessProbe` cannot be run.
    #[error(transparent)]
    HealthCheck(#[from] crate::health_check::HealthCheckError),
    /// `ISTIO_PROMETHEUS_ANNOTATIONS` is invalid.
    #[error("{ENV_PROMETHEUS_ANNOTATIONS}: {0}")]
    Scrape(#[from] ScrapeConfigError),
}

/// Every invalid value found, in the order they were read; displayed one
/// per line.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}
