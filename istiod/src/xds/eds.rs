//! EDS: one `ClusterLoadAssignment` per `outbound|<port>|<subset>|<host>`
//! cluster, endpoints grouped by locality, subset labels applied, and the
//! `tlsMode` metadata auto mTLS matches on.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use proto::pb::envoy::config::core::v3::{HealthStatus, Metadata};
use proto::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};

use super::locality::apply_to_load_assignment;
use super::util::{socket, struct_of, u32v};
use crate::model::istio::Labels;
use crate::model::service::{EndpointTlsMode, Service, ServiceResolution};
use crate::pushctx::cache::KeyBuilder;
use crate::pushctx::context::IstioContext;
use crate::pushctx::locality::{self, LocalityPlan, ProxyLocality};
use crate::pushctx::names::parse_cluster;
use crate::pushctx::scope::SidecarScope;
use crate::pushctx::{Proxy, Resource};

/// Load assignments for `names` (every EDS cluster of the proxy when empty),
/// from its scope's, built once per push context for every proxy with the
/// scope; a name outside the scope gets an empty assignment.
pub fn build(ctx: &IstioContext, proxy: &Proxy, names: &BTreeSet<String>) -> Vec<Arc<Resource>> {
    let scope = ctx.scope(proxy);
    let mut built = false;
    let all = scope.load_assignments.get_or_init(|| {
        built = true;
        build_scope(ctx, &scope)
    });
    let plans = scope
        .locality_plans
        .get_or_init(|| locality_plans(ctx, &scope));
    let out: Vec<Arc<Resource>> = if names.is_empty() {
        let mut out: Vec<Arc<Resource>> = all.values().cloned().collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    } else {
        names
            .iter()
            .filter_map(|name| match all.get(name) {
                Some(r) => Some(r.clone()),
                None => unknown(ctx, &scope, name),
            })
            .collect()
    };
    if !built {
        let shared = out.iter().filter(|r| all.contains_key(&r.name)).count();
        ctx.cache.count_shared(shared);
    }
    if plans.is_empty() {
        return out;
    }
    // Locality priorities and weights are the proxy's own.
    let locality = ctx.proxy_locality(proxy);
    out.into_iter()
        .map(|r| match plans.get(&r.name) {
            Some(plan) => for_locality(ctx, &scope, &r.name, plan, &locality).unwrap_or(r),
            None => r,
        })
        .collect()
}

/// The scope's EDS clusters whose load assignment depends on the proxy's
/// locality (Istio's default failover with outlier detection, or a
/// `localityLbSetting`), with the setting that applies.
fn locality_plans(ctx: &IstioContext, scope: &SidecarScope) -> HashMap<String, LocalityPlan> {
    let mut out = HashMap::new();
    for (cluster, port, subset, svc) in eds_clusters(ctx, scope) {
        let dr = ctx.destination_rule(scope, svc);
        let subset = dr.and_then(|d| d.spec.subsets.iter().find(|s| s.name == subset));
        let policy = super::cds::policy::effective(
            dr.and_then(|d| d.spec.traffic_policy.as_ref()),
            subset,
            port,
        );
        let rule = policy
            .as_ref()
            .and_then(|p| p.load_balancer.as_ref())
            .and_then(|l| l.locality_lb_setting.as_ref());
        let Some(setting) = locality::effective(ctx.mesh.locality_lb_setting.as_ref(), rule) else {
            continue;
        };
        let outlier_detection = policy
            .as_ref()
            .is_some_and(|p| p.outlier_detection.is_some());
        if locality::per_proxy(setting, outlier_detection) {
            out.insert(
                cluster.name.clone(),
                LocalityPlan {
                    setting: setting.clone(),
                    outlier_detection,
                },
            );
        }
    }
    out
}

/// One load assignment with the proxy's locality priorities or weights,
/// from the XDS cache when a proxy of the same locality (and labels, when
/// `failoverPriority` compares them) asked in this or an earlier push.
fn for_locality(
    ctx: &IstioContext,
    scope: &SidecarScope,
    name: &str,
    plan: &LocalityPlan,
    proxy: &ProxyLocality,
) -> Option<Arc<Resource>> {
    let (port, subset, host) = parse_cluster(name)?;
    let svc = scope.service(host)?;
    let dr = ctx.destination_rule(scope, svc);
    let mut key = KeyBuilder::new("EDS", name)
        .with((&svc.hostname, &svc.namespace, svc.revision))
        .with(dr.map(|d| (&d.namespace, &d.name)))
        .with(&proxy.locality)
        .with(&plan.setting.failover_priority);
    if !plan.setting.failover_priority.is_empty() {
        key.add(&proxy.labels);
    }
    let dependencies = || super::cds::dependencies(svc, dr);
    let labels = dr
        .and_then(|dr| dr.spec.subsets.iter().find(|s| s.name == subset))
        .map(|s| &s.labels);
    Some(
        ctx.cache
            .get_or_build(key.key(), name, ctx.seq, dependencies, || {
                let (mut cla, endpoint_labels) = grouped(
                    name,
                    svc,
                    port,
                    labels,
                    &ctx.cluster_id,
                    !plan.setting.failover_priority.is_empty(),
                );
                apply_to_load_assignment(
                    &mut cla,
                    &endpoint_labels,
                    proxy,
                    &plan.setting,
                    plan.outlier_detection,
                );
                Resource::new(
                    name.to_string(),
                    super::metadata_encoding::load_assignment(&cla),
                )
            }),
    )
}

/// A requested name the scope has no EDS cluster of: an empty assignment
/// keeps Envoy from waiting for a host it cannot know now; a DNS cluster's
/// name gets nothing (its endpoints are in the cluster).
fn unknown(ctx: &IstioContext, scope: &SidecarScope, name: &str) -> Option<Arc<Resource>> {
    let (port, subset, host) = parse_cluster(name)?;
    if let Some(svc) = scope.service(host) {
        // Passthrough services' clusters are EDS only on gateways, which
        // alone ask for them.
        if !matches!(
            svc.resolution,
            ServiceResolution::ClientSideLb | ServiceResolution::Passthrough
        ) {
            return None;
        }
        // A port or subset the service has no cluster for: computed as any.
        return Some(load_assignment_of(ctx, scope, svc, name, port, subset));
    }
    let empty = ClusterLoadAssignment {
        cluster_name: name.to_string(),
        ..Default::default()
    };
    Some(Arc::new(Resource::encode(name.to_string(), &empty)))
}

/// Every EDS cluster's load assignment for one scope, by cluster name.
fn build_scope(ctx: &IstioContext, scope: &SidecarScope) -> HashMap<String, Arc<Resource>> {
    let mut out = HashMap::new();
    for (cluster, port, subset, svc) in eds_clusters(ctx, scope) {
        let r = load_assignment_of(ctx, scope, svc, &cluster.name, port, &subset);
        out.insert(cluster.name.clone(), r);
    }
    out
}

/// The scope's outbound clusters whose endpoints come over EDS (services
/// balanced by the client), each with its port, subset and service.
fn eds_clusters<'a>(
    ctx: &'a IstioContext,
    scope: &'a SidecarScope,
) -> Vec<(Arc<Resource>, u16, String, &'a Arc<Service>)> {
    let mut out = Vec::new();
    for cluster in super::cds::outbound_clusters(ctx, scope).iter() {
        let Some((port, subset, host)) = parse_cluster(&cluster.name) else {
            continue;
        };
        let Some(svc) = scope.service(host) else {
            continue;
        };
        if svc.resolution == ServiceResolution::ClientSideLb {
            out.push((cluster.clone(), port, subset.to_string(), svc));
        }
    }
    out
}

/// One load assignment, from the XDS cache when an earlier push context
/// built it from the same service and DestinationRule.
fn load_assignment_of(
    ctx: &IstioContext,
    scope: &SidecarScope,
    svc: &Service,
    name: &str,
    port: u16,
    subset: &str,
) -> Arc<Resource> {
    let dr = (!subset.is_empty())
        .then(|| ctx.destination_rule(scope, svc))
        .flatten();
    let key = KeyBuilder::new("EDS", name)
        .with((&svc.hostname, &svc.namespace, svc.revision))
        .with(dr.map(|d| (&d.namespace, &d.name)))
        .key();
    let dependencies = || super::cds::dependencies(svc, dr);
    let labels = dr
        .and_then(|dr| dr.spec.subsets.iter().find(|s| s.name == subset))
        .map(|s| &s.labels);
    ctx.cache
        .get_or_build(key, name, ctx.seq, dependencies, || {
            Resource::new(
                name.to_string(),
                super::metadata_encoding::load_assignment(&load_assignment(
                    name,
                    svc,
                    port,
                    labels,
                    &ctx.cluster_id,
                )),
            )
        })
}

/// The endpoints of one service port (those with the subset's labels),
/// grouped by locality.
fn load_assignment(
    name: &str,
    svc: &Service,
    port: u16,
    labels: Option<&BTreeMap<String, String>>,
    cluster_id: &str,
) -> ClusterLoadAssignment {
    grouped(name, svc, port, labels, cluster_id, false).0
}

/// [`load_assignment`], and with `with_labels` each endpoint's labels
/// with Istio's topology labels added (what `failoverPriority` compares),
/// in the order of the assignment's endpoints.
fn grouped(
    name: &str,
    svc: &Service,
    port: u16,
    labels: Option<&BTreeMap<String, String>>,
    cluster_id: &str,
    with_labels: bool,
) -> (ClusterLoadAssignment, Vec<Vec<Labels>>) {
    let mut by_locality: BTreeMap<String, (Vec<LbEndpoint>, Vec<Labels>)> = BTreeMap::new();
    for ep in svc.endpoints_for(port) {
        if let Some(want) = labels
            && !want.iter().all(|(k, v)| ep.labels.get(k) == Some(v))
        {
            continue;
        }
        // Istio's default (`PILOT_SEND_UNHEALTHY_ENDPOINTS` off): an
        // unhealthy endpoint (an unready Pod, a WorkloadEntry whose probe
        // fails) is left out, so Envoy's panic threshold cannot send to it.
        if !ep.healthy {
            continue;
        }
        let mut metadata = Metadata::default();
        if ep.tls_mode == EndpointTlsMode::Istio {
            metadata.filter_metadata.insert(
                "envoy.transport_socket_match".into(),
                struct_of(&[("tlsMode", common::TlsMode::Istio.as_str())]),
            );
        }
        // Istio's `istio.workload`, which the standard metrics read as the
        // destination workload.
        if let Some(workload) = super::istio_stats::endpoint_workload(ep, cluster_id) {
            metadata.filter_metadata.insert(
                super::istio_stats::ISTIO_METADATA_KEY.into(),
                struct_of(&[("workload", &workload)]),
            );
        }
        let group = by_locality.entry(ep.locality.clone()).or_default();
        if with_labels {
            group.1.push(locality::augment(
                &ep.labels,
                &ep.locality,
                &ep.network,
                cluster_id,
            ));
        }
        group.0.push(LbEndpoint {
            host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                address: Some(socket(&ep.address, ep.port.into())),
                ..Default::default()
            })),
            health_status: HealthStatus::Healthy.into(),
            metadata: Some(metadata),
            load_balancing_weight: Some(u32v(ep.weight.max(1))),
        });
    }
    let mut endpoint_labels = Vec::new();
    let endpoints = by_locality
        .into_iter()
        .map(|(loc, (eps, labels))| {
            endpoint_labels.push(labels);
            LocalityLbEndpoints {
                locality: Some(locality::parse(&loc)),
                load_balancing_weight: Some(u32v(eps.len() as u32)),
                lb_endpoints: eps,
                ..Default::default()
            }
        })
        .collect();
    let cla = ClusterLoadAssignment {
        cluster_name: name.to_string(),
        endpoints,
        ..Default::default()
    };
    (cla, endpoint_labels)
}

#[cfg(test)]
mod tests;
