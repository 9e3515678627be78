//! The workload CA: its key material (plug-in or self-signed), the signer, the
//! caller authenticators (client certificate, `JWT_RULE`, Kubernetes
//! TokenReview), the `IstioCertificateService` gRPC server, and on
//! Kubernetes the namespace controller that publishes the root.

pub mod authn;
pub mod authority;
pub mod ca_secret;
pub mod istio_ca;
pub mod kube_jwt;
pub mod material;
pub mod namespace_controller;
pub mod self_signed_root_rotator;
pub(crate) mod server;
pub mod serving_cert;
pub(crate) mod signer;

pub use material::{CaBundle, MaterialError};
pub use signer::{SignError, Signer};
