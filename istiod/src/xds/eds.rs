//! EDS: one `ClusterLoadAssignment` per `outbound|<port>|<subset>|<host>`
//! cluster, endpoints grouped by locality, subset labels applied, and the
//! `tlsMode` metadata auto mTLS matches on.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use proto::pb::envoy::config::core::v3::{HealthStatus, Locality, Metadata};
use proto::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};

use super::cache::{Dependency, KeyBuilder};
use super::context::IstioContext;
use super::util::{socket, struct_of, u32v};
use super::{Proxy, Resource};
use crate::model::service::{EndpointTlsMode, Service, ServiceResolution};
use crate::model::{Kind, ObjectKey};

/// Splits `outbound|<port>|<subset>|<host>`.
pub fn parse_cluster(name: &str) -> Option<(u16, &str, &str)> {
    let mut parts = name.splitn(4, '|');
    if parts.next()? != "outbound" {
        return None;
    }
    let port = parts.next()?.parse().ok()?;
    Some((port, parts.next()?, parts.next()?))
}

/// Load assignments for `names` (every EDS cluster of the proxy when empty).
/// Each comes from the XDS cache when a proxy with the same view of its
/// service and subset built it already.
pub fn build(ctx: &IstioContext, proxy: &Proxy, names: &BTreeSet<String>) -> Vec<Arc<Resource>> {
    let wanted: Vec<String> = if names.is_empty() {
        super::cds::build(ctx, proxy)
            .into_iter()
            .map(|r| r.name.clone())
            .filter(|n| n.starts_with("outbound|"))
            .collect()
    } else {
        names.iter().cloned().collect()
    };
    // The proxy's visible services; the first service of a host name wins,
    // as in the registry's order.
    let scope = ctx.scope(proxy);
    let mut out = Vec::new();
    for name in wanted {
        let Some((port, subset, host)) = parse_cluster(&name) else {
            continue;
        };
        let Some(svc) = scope.service(host) else {
            // Unknown now: an empty assignment keeps Envoy from waiting.
            let empty = ClusterLoadAssignment {
                cluster_name: name.clone(),
                ..Default::default()
            };
            out.push(Arc::new(Resource::encode(name, &empty)));
            continue;
        };
        if svc.resolution != ServiceResolution::ClientSideLb {
            continue;
        }
        let dr = (!subset.is_empty())
            .then(|| ctx.destination_rule(&proxy.namespace, svc))
            .flatten();
        let key = KeyBuilder::new("EDS", &name)
            .with((&svc.hostname, &svc.namespace, svc.revision))
            .with(dr.map(|d| (&d.namespace, &d.name)))
            .key();
        let dependencies = || {
            let mut d = vec![Dependency::Service(svc.hostname.clone())];
            if let Some(dr) = dr {
                d.push(Dependency::Config(ObjectKey::new(
                    Kind::DestinationRule,
                    &dr.namespace,
                    &dr.name,
                )));
            }
            d
        };
        let labels = dr
            .and_then(|dr| dr.spec.subsets.iter().find(|s| s.name == subset))
            .map(|s| &s.labels);
        let built = ctx
            .cache
            .get_or_build(key, &name, ctx.seq, dependencies, || {
                let cla = load_assignment(&name, svc, port, labels);
                Resource::encode(name.clone(), &cla)
            });
        out.push(built);
    }
    out
}

/// The endpoints of one service port (those with the subset's labels),
/// grouped by locality.
fn load_assignment(
    name: &str,
    svc: &Service,
    port: u16,
    labels: Option<&BTreeMap<String, String>>,
) -> ClusterLoadAssignment {
    let mut by_locality: BTreeMap<String, Vec<LbEndpoint>> = BTreeMap::new();
    for ep in svc.endpoints_for(port) {
        if let Some(want) = labels
            && !want.iter().all(|(k, v)| ep.labels.get(k) == Some(v))
        {
            continue;
        }
        let mut metadata = Metadata::default();
        if ep.tls_mode == EndpointTlsMode::Istio {
            metadata.filter_metadata.insert(
                "envoy.transport_socket_match".into(),
                struct_of(&[("tlsMode", "istio")]),
            );
        }
        by_locality
            .entry(ep.locality.clone())
            .or_default()
            .push(LbEndpoint {
                host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                    address: Some(socket(&ep.address, ep.port.into())),
                    ..Default::default()
                })),
                health_status: if ep.healthy {
                    HealthStatus::Healthy
                } else {
                    HealthStatus::Unhealthy
                }
                .into(),
                metadata: Some(metadata),
                load_balancing_weight: Some(u32v(ep.weight.max(1))),
            });
    }
    let endpoints = by_locality
        .into_iter()
        .map(|(loc, eps)| {
            let mut parts = loc.splitn(3, '/');
            LocalityLbEndpoints {
                locality: Some(Locality {
                    region: parts.next().unwrap_or_default().to_string(),
                    zone: parts.next().unwrap_or_default().to_string(),
                    sub_zone: parts.next().unwrap_or_default().to_string(),
                }),
                load_balancing_weight: Some(u32v(eps.len() as u32)),
                lb_endpoints: eps,
                ..Default::default()
            }
        })
        .collect();
    ClusterLoadAssignment {
        cluster_name: name.to_string(),
        endpoints,
        ..Default::default()
    }
}
