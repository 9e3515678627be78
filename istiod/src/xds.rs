//! The xDS server: ADS over gRPC, state of the world and delta, with Istio's
//! ACK/NACK/nonce rules. Generation is behind the [`PushContext`] trait so the
//! protocol is independent of how configuration is built.

pub mod ads;
pub mod authn;
pub mod authz;
pub mod cds;
mod connection;
mod delta;
pub mod eds;
pub mod envoyfilter;
pub mod gateway;
pub mod generator;
pub mod istio_stats;
pub mod lds;
pub mod locality;
pub mod metadata_encoding;
pub mod nds;
pub mod outbox;
pub mod policy_attachment;
pub mod rate_limit;
pub mod rds;
pub mod requests;
pub mod sds;
pub mod security;
pub mod server;
#[cfg(test)]
mod service_shapes_tests;
mod sotw;
pub mod statusgen;
pub mod telemetry;
pub mod util;
pub mod wire;

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
