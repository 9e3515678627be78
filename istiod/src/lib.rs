//! istiod: the control plane that configures every sidecar and signs its
//! workload certificate. `app` wires the parts; each module is named for the
//! Istio capability it implements.
//!
//! The public surface is for the `istiod` binary, the `tests` crate, the benches and
//! `tests/`; every other module is `pub(crate)`. `fuzzing` (the fuzz entry points) builds only
//! with the `fuzzing` feature: for /fuzz, and for this crate's tests through its dev-dependency.
//!
//! The walk of a change, one room at a time, each passed once:
//! 1. `source` (files, the Kubernetes API) parses and validates an object
//!    (`model::validate`) and writes it to its slice of `model::store`.
//! 2. The store publishes a snapshot and a batch of change events.
//! 3. `push` debounces batches (`PILOT_DEBOUNCE_AFTER`/`_MAX`) into one.
//! 4. `push::builder` builds the immutable push context (`pushctx::context`)
//!    from the snapshot, the mesh config and the JWKS.
//! 5. `push::updates` resolves what the batch reaches (proxies, types) and
//!    clears those entries of the XDS cache (`pushctx::cache`).
//! 6. The push request (`pushctx::push_request`) goes to every stream
//!    (`xds::server`, `xds::connection`, `xds::sotw`, `xds::delta`).
//! 7. Each stream asks the generators (`xds::generator`: cds, eds, lds, rds,
//!    sds, nds) for its proxy, reading the context and the cache.
//! 8. `xds::wire` frames the shared resources; `xds::outbox` sends them.

pub mod app;
pub(crate) mod autoregistration;
pub mod ca;
pub mod config;
pub(crate) mod debug;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub(crate) mod grpc;
pub mod inject;
pub(crate) mod jwks;
pub mod kube;
pub mod leaderelection;
pub mod mesh;
pub(crate) mod metrics;
pub mod model;
pub mod push;
pub mod pushctx;
pub(crate) mod scavenger;
pub mod source;
pub mod token;
pub mod webhooks;
pub mod xds;

/// The version reported by `/version` and `istiod version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
