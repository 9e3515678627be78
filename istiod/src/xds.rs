//! The xDS server: ADS over gRPC, state of the world and delta, with Istio's
//! ACK/NACK/nonce rules. Generation is behind the [`PushContext`] trait so the
//! protocol is independent of how configuration is built.

pub(crate) mod ads;
pub(crate) mod authn;
pub(crate) mod authz;
pub(crate) mod cds;
mod connection;
mod delta;
pub mod drain;
pub(crate) mod eds;
pub(crate) mod envoyfilter;
pub(crate) mod gateway;
pub(crate) mod generator;
pub(crate) mod istio_stats;
pub mod lds;
pub(crate) mod locality;
pub(crate) mod metadata_encoding;
pub(crate) mod nds;
pub(crate) mod outbox;
pub(crate) mod policy_attachment;
pub(crate) mod rate_limit;
pub(crate) mod rds;
pub(crate) mod requests;
pub(crate) mod sds;
pub(crate) mod security;
pub mod server;
#[cfg(test)]
mod service_shapes_tests;
mod sotw;
pub(crate) mod statusgen;
pub(crate) mod telemetry;
pub(crate) mod util;
pub(crate) mod wire;

/// The type URLs istiod serves (CDS, EDS, LDS, RDS, NDS), defined once in
/// `common` with the agent's.
pub use common::xds::{
    CLUSTER_TYPE, ENDPOINT_TYPE, EXTENSION_CONFIGURATION_TYPE, LISTENER_TYPE, NAME_TABLE_TYPE,
    ROUTE_TYPE, SECRET_TYPE,
};

/// Server-driven pushes send types in Istio's `PushOrder`.
pub const PUSH_ORDER: [&str; 6] = [
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
    SECRET_TYPE,
    NAME_TABLE_TYPE,
];

/// Istio's short name of a type (`CDS`, `EDS`, ...), used in logs and metric labels.
pub fn short_name(type_url: &str) -> &'static str {
    match type_url {
        CLUSTER_TYPE => "CDS",
        ENDPOINT_TYPE => "EDS",
        LISTENER_TYPE => "LDS",
        ROUTE_TYPE => "RDS",
        NAME_TABLE_TYPE => "NDS",
        SECRET_TYPE => "SDS",
        EXTENSION_CONFIGURATION_TYPE => "ECDS",
        _ => "UNKNOWN",
    }
}

/// Whether a type is subscribed as a whole (CDS, LDS) rather than by name.
pub fn is_wildcard(type_url: &str) -> bool {
    matches!(type_url, CLUSTER_TYPE | LISTENER_TYPE | NAME_TABLE_TYPE)
}
