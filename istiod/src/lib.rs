//! istiod: the control plane that configures every sidecar and signs its
//! workload certificate. `app` wires the parts; each module is named for the
//! Istio capability it implements.

pub mod app;
pub mod autoregistration;
pub mod ca;
pub mod config;
pub mod debug;
pub mod fuzzing;
pub mod grpc;
pub mod inject;
pub mod jwks;
pub mod kube;
pub mod mesh;
pub mod metrics;
pub mod model;
pub mod push;
pub mod scavenger;
pub mod source;
pub mod token;
pub mod webhooks;
pub mod xds;

/// The version reported by `/version` and `istiod version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
