//! What both binaries share: SPIFFE identity, PKI and TLS helpers, Istio-style
//! logging, environment parsing, Go durations and backoff, and the vocabulary
//! that crosses the wire between them (node metadata, xDS type URLs, proxy
//! type, interception mode, TLS mode).

pub mod backoff;
pub mod cli;
pub mod clock;
pub mod duration;
pub mod env;
pub mod fuzz_corpus;
pub mod gateway_topology;
pub mod grpc_stream;
pub mod identity;
pub mod istio_stats;
pub mod log;
pub mod memory;
pub mod metrics;
pub mod model;
#[cfg(feature = "testing")]
pub mod module_graph;
pub mod node_metadata;
pub mod pki;
pub mod proxy_config_fields;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;
pub mod xds;

pub use identity::Identity;
pub use model::{AuthenticationPolicy, InterceptionMode, ProxyType, TlsMode};
pub use node_metadata::NodeMetadata;
