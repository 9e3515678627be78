//! What both binaries share: SPIFFE identity, PKI and TLS helpers, Istio-style
//! logging, environment parsing, Go durations and backoff.

pub mod backoff;
pub mod cli;
pub mod duration;
pub mod env;
pub mod identity;
pub mod log;
pub mod pki;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;

pub use identity::Identity;
