//! The workload CA: its key material (plug-in or self-signed), the signer, the
//! caller authenticators and the `IstioCertificateService` gRPC server.

pub mod authn;
pub mod material;
pub mod server;
pub mod signer;

pub use material::{CaBundle, MaterialError};
pub use signer::{SignError, Signer};
