//! The xDS server: ADS over gRPC, state of the world and delta, with Istio's
//! ACK/NACK/nonce rules. Generation is behind the [`PushContext`] trait so the
//! protocol is independent of how configuration is built.

pub mod ads;
pub mod authn;
pub mod authz;
pub mod cache;
pub mod cds;
mod connection;
pub mod context;
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
pub mod proxy;
pub mod proxy_dependencies;
pub mod push_request;
pub mod rate_limit;
pub mod rds;
pub mod requests;
pub mod scope;
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

use std::collections::BTreeSet;
use std::sync::Arc;

use proto::pb::google::protobuf::Any;

pub use proxy::Proxy;
pub use push_request::{PushPlan, PushRequest, Types, Updates};

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

/// One generated resource, encoded. Shared by reference (`Arc`) between the
/// XDS cache and every response that carries it.
#[derive(Debug, Clone)]
pub struct Resource {
    /// Its name (cluster name, listener name, ...).
    pub name: String,
    /// The encoded resource.
    pub resource: Any,
    /// [`Resource::version`], computed once.
    version: std::sync::OnceLock<String>,
    /// [`name_hash`] of the name.
    name_hash: u64,
}

/// A hash of a resource name, as streams index what a client holds.
pub fn name_hash(name: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    h.finish()
}

impl PartialEq for Resource {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.resource == other.resource
    }
}

impl Resource {
    /// A resource named `name`.
    pub fn new(name: String, resource: Any) -> Self {
        Self {
            name_hash: name_hash(&name),
            name,
            resource,
            version: std::sync::OnceLock::new(),
        }
    }

    /// [`name_hash`] of its name, computed once.
    pub fn name_hash(&self) -> u64 {
        self.name_hash
    }

    /// The resource `m` encoded, named `name`.
    pub fn encode<M: prost::Message + prost::Name>(name: String, m: &M) -> Self {
        Self::new(name, util::any(m))
    }

    /// A stable version of the resource's content, for delta xDS.
    pub fn version(&self) -> &str {
        self.version.get_or_init(|| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            self.resource.type_url.hash(&mut h);
            self.resource.value.hash(&mut h);
            format!("{:016x}", h.finish())
        })
    }
}

/// An immutable snapshot of everything needed to generate configuration for
/// any proxy (Istio's `PushContext`).
pub trait PushContext: Send + Sync + 'static {
    /// The push version (`<RFC3339>/<counter>`).
    fn version(&self) -> &str;
    /// Generates `type_url` resources for `proxy`. For named types, `names`
    /// restricts the result; wildcard types ignore it.
    fn generate(
        &self,
        proxy: &Proxy,
        type_url: &str,
        names: &BTreeSet<String>,
    ) -> Result<Vec<Arc<Resource>>, generator::GenerateError>;

    /// What `proxy` needs from a push with these updates (Istio's
    /// `ProxyNeedsPush`): the types to send, nothing when no change reaches
    /// it. Without scopes, every change reaches every proxy.
    fn plan_push(&self, _proxy: &Proxy, updates: &[Arc<Updates>]) -> PushPlan {
        push_request::plan_without_scopes(updates)
    }
}

/// Istio's outbound cluster name, `outbound|<port>|<subset>|<host>`.
pub fn outbound_name(port: u16, subset: &str, host: &str) -> String {
    format!("outbound|{port}|{subset}|{host}")
}

/// Istio's inbound cluster name, `inbound|<port>||`.
pub fn inbound_name(port: u16) -> String {
    format!("inbound|{port}||")
}

/// The service host an EDS cluster name (`outbound|port|subset|host`) refers to.
pub fn cluster_host(cluster: &str) -> &str {
    cluster.rsplit('|').next().unwrap_or(cluster)
}
