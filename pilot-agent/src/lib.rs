//! pilot-agent: the agent in every injected Pod. `app` wires the parts; each
//! module is named for the Istio capability it implements.

pub mod agent_bootstrap;
pub mod app;
pub mod bootstrap;
pub mod ca_client;
pub mod config;
pub mod dns;
pub mod envoy;
pub mod footprint;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod health_check;
mod http_client;
pub mod iptables;
pub mod lifecycle;
pub mod proxy_config;
pub mod sds;
pub mod secret_manager;
pub mod status;
pub mod telemetry;
#[cfg(test)]
mod test_support;
pub mod xds_proxy;

/// The agent's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
