//! pilot-agent: the agent in every injected Pod. `app` wires the parts; each
//! module is named for the Istio capability it implements.

pub mod app;
pub mod ca_client;
pub mod config;
pub mod sds;
pub mod secret_manager;
pub mod status;

/// The agent's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
