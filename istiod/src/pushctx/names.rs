//! Istio's names of the clusters routes point at: `outbound|port|subset|host`,
//! `inbound|port||`, and the passthrough and black-hole clusters; and a
//! service as cluster metadata names it.

use crate::model::service::{Service, ServiceSource};

/// The cluster for traffic to destinations outside the registry (`ALLOW_ANY`).
pub const PASSTHROUGH_CLUSTER: &str = "PassthroughCluster";
/// The cluster that drops traffic (`REGISTRY_ONLY`, loops, unknown hosts).
pub const BLACKHOLE_CLUSTER: &str = "BlackHoleCluster";

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

/// Splits `outbound|<port>|<subset>|<host>`.
pub fn parse_cluster(name: &str) -> Option<(u16, &str, &str)> {
    let mut parts = name.splitn(4, '|');
    if parts.next()? != "outbound" {
        return None;
    }
    let port = parts.next()?.parse().ok()?;
    Some((port, parts.next()?, parts.next()?))
}

/// A service as the `istio.services` cluster metadata lists it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceRef {
    /// The host name.
    pub host: String,
    /// The service's name (the Kubernetes Service's; a ServiceEntry's host).
    pub name: String,
    /// Its namespace.
    pub namespace: String,
}

impl ServiceRef {
    /// The reference to `svc`.
    pub fn of(svc: &Service) -> Self {
        let name = match svc.source {
            ServiceSource::Kubernetes => svc.source_object.name.clone(),
            _ => svc.hostname.clone(),
        };
        Self {
            host: svc.hostname.clone(),
            name,
            namespace: svc.namespace.clone(),
        }
    }
}
