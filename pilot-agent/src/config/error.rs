//! The configuration's errors: one typed value per invalid setting, each
//! naming the variable, flag or file it came from, all reported together.

use std::fmt;

use common::duration::DurationError;

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

/// The form of `ISTIO_KUBE_APP_PROBERS` keys, as Istio's error message shows it.
const APP_PROBER_PATTERN: &str =
    r"^/(app-health|app-lifecycle)/[^/]+/(livez|readyz|startupz|prestopz|poststartz)$";

/// One invalid entry of `ISTIO_KUBE_APP_PROBERS`.
#[derive(Debug, thiserror::Error)]
pub enum AppProberError {
    /// Not the JSON map the injector writes.
    #[error("failed to decode app prober err = {reason}, json string = {json}")]
    Decode {
        /// The JSON error.
        reason: String,
        /// The value.
        json: String,
    },
    /// A key is not a probe path.
    #[error("invalid path {path:?}, must be in form of regex pattern {APP_PROBER_PATTERN}")]
    InvalidPath {
        /// The key.
        path: String,
    },
    /// A probe has none or several of `httpGet`, `tcpSocket` and `grpc`.
    #[error("invalid prober type for {path}, must be one of type httpGet, tcpSocket or gRPC")]
    InvalidType {
        /// The key.
        path: String,
    },
    /// A probe names its port (`"http"`): the injector resolves names to numbers.
    #[error("invalid prober config for {path}, the port must be int type, not {port:?}")]
    PortNotInt {
        /// The key.
        path: String,
        /// The port name given.
        port: String,
    },
    /// A probe's port is not a TCP port.
    #[error("invalid prober config for {path}, the port {port} is not in 1-65535")]
    PortOutOfRange {
        /// The key.
        path: String,
        /// The port given.
        port: i64,
    },
}

/// One invalid value of `ISTIO_PROMETHEUS_ANNOTATIONS`.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeConfigError {
    /// Not valid JSON of the expected shape.
    #[error("failed to unmarshal ISTIO_PROMETHEUS_ANNOTATIONS: {reason}")]
    Decode {
        /// The JSON error.
        reason: String,
    },
    /// The legacy `port` is the status port itself, which would scrape itself.
    #[error(
        "invalid prometheus scrape configuration: application port is the same as agent port, which may lead to a recursive loop. Ensure pod does not have prometheus.io/port={status_port} label, or that injection is not happening multiple times"
    )]
    PortIsStatusPort {
        /// The status port.
        status_port: u16,
    },
    /// A target port is not a number in 1..65535.
    #[error("invalid prometheus scrape configuration: invalid target port {port:?}")]
    InvalidPort {
        /// The port given.
        port: String,
    },
    /// A target port is the status port.
    #[error(
        "invalid prometheus scrape configuration: target port {port} is the same as agent port, which may lead to a recursive loop"
    )]
    TargetIsStatusPort {
        /// The port given.
        port: String,
    },
    /// A target port belongs to the Istio data plane.
    #[error(
        "invalid prometheus scrape configuration: target port {port} is reserved for Istio ({reason}) and cannot be scraped"
    )]
    ReservedPort {
        /// The port given.
        port: String,
        /// What uses it.
        reason: &'static str,
    },
}
