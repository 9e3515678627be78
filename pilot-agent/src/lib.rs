//! pilot-agent: the agent in every injected Pod. `app` wires the parts; each
//! module is named for the Istio capability it implements.
//!
//! The public surface is for the `pilot-agent` binary, the `tests` crate and `tests/`; every
//! other module is `pub(crate)`. `fuzzing` (the fuzz entry points) builds only with the
//! `fuzzing` feature: for /fuzz, and for this crate's tests through its dev-dependency.

pub(crate) mod agent_bootstrap;
pub mod app;
pub mod bootstrap;
pub(crate) mod ca_client;
pub mod config;
pub(crate) mod dns;
pub mod envoy;
pub(crate) mod footprint;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub(crate) mod health_check;
mod http_client;
pub mod iptables;
pub(crate) mod lifecycle;
pub(crate) mod proxy_config;
pub(crate) mod sds;
pub(crate) mod secret_manager;
pub(crate) mod status;
pub(crate) mod telemetry;
#[cfg(test)]
mod test_support;
pub(crate) mod xds_proxy;

/// The agent's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
