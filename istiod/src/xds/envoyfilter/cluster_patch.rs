//! CLUSTER patches (Istio's `cluster_patch.go`): MERGE and REMOVE on the
//! clusters a match selects (by name, or by the port, subset and service
//! of Istio's `direction|port|subset|host` names), ADD appended once.
//! Only clusters a MERGE selects are decoded; the others pass by reference.

use std::collections::BTreeMap;
use std::sync::Arc;

use proto::pb::envoy::config::cluster::v3::Cluster;

use super::metrics::PatchType;
use super::{PatchError, PatchWrapper, Patches, decode, merge, merge_any, report};
use crate::model::envoy_filter::{ApplyTo, Operation, PatchContext};
use crate::pushctx::Resource;

/// Applies CLUSTER patches to a proxy's clusters.
pub(super) fn apply(
    patches: &Patches<'_>,
    gateway: bool,
    inbound_hosts: &BTreeMap<u32, Vec<String>>,
    resources: Vec<Arc<Resource>>,
) -> Vec<Arc<Resource>> {
    let mut out = Vec::with_capacity(resources.len());
    for r in resources {
        let context = context_of(&r.name, gateway);
        let mut current: Option<Cluster> = None;
        let mut removed = false;
        for (key, p) in patches.iter(ApplyTo::Cluster, context) {
            if !cluster_matches(&r.name, p, inbound_hosts) {
                continue;
            }
            match p.operation {
                Operation::Remove => {
                    removed = true;
                    report(key, PatchType::Cluster, Ok(()));
                }
                Operation::Merge => {
                    let result = match current.take().map_or_else(|| decode(&r), Ok) {
                        Ok(c) => match merge_cluster(&c, p) {
                            Ok(merged) => {
                                current = Some(merged);
                                Ok(())
                            }
                            Err(e) => {
                                current = Some(c);
                                Err(e)
                            }
                        },
                        Err(e) => Err(e),
                    };
                    report(key, PatchType::Cluster, result);
                }
                _ => {}
            }
            if removed {
                break;
            }
        }
        if removed {
            continue;
        }
        match current {
            Some(c) => out.push(Arc::new(Resource::new(
                c.name.clone(),
                crate::xds::metadata_encoding::cluster(&c),
            ))),
            None => out.push(r),
        }
    }
    for (key, p) in patches.adds(ApplyTo::Cluster, gateway) {
        let result = p.value::<Cluster>().map(|c| {
            out.push(Arc::new(Resource::new(
                c.name.clone(),
                crate::xds::metadata_encoding::cluster(&c),
            )));
        });
        report(key, PatchType::Cluster, result);
    }
    out
}

/// A cluster's patch context: a gateway's are GATEWAY; a sidecar's are
/// inbound or outbound by name.
pub(super) fn context_of(name: &str, gateway: bool) -> PatchContext {
    if gateway {
        PatchContext::Gateway
    } else if name.starts_with("inbound|") {
        PatchContext::SidecarInbound
    } else {
        PatchContext::SidecarOutbound
    }
}

/// Istio's `clusterMatch`.
fn cluster_matches(
    name: &str,
    p: &PatchWrapper,
    inbound_hosts: &BTreeMap<u32, Vec<String>>,
) -> bool {
    let Some(m) = &p.cluster else {
        return true;
    };
    if !m.name.is_empty() {
        return m.name == name;
    }
    // `direction|port|subset|host`; names of other shapes have none.
    let mut parts = name.splitn(4, '|');
    let direction = parts.next().unwrap_or_default();
    let port: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let subset = parts.next().unwrap_or_default();
    let host = parts.next().unwrap_or_default();
    if !m.subset.is_empty() && m.subset != subset {
        return false;
    }
    if !m.service.is_empty() {
        let hosts: Vec<&str> = if direction == "inbound" {
            inbound_hosts
                .get(&port)
                .map(|h| h.iter().map(String::as_str).collect())
                .unwrap_or_default()
        } else {
            vec![host]
        };
        if !hosts.iter().any(|h| host_contains(h, &m.service)) {
            return false;
        }
    }
    m.port_number == 0 || m.port_number == port
}

/// Whether `pattern` (a host, possibly `*.suffix`) covers `host`.
fn host_contains(host: &str, pattern: &str) -> bool {
    match pattern.strip_prefix('*') {
        Some(suffix) => host.ends_with(suffix),
        None => host == pattern,
    }
}

/// MERGE of a cluster; a transport socket of the same type is merged
/// field by field, as Istio's `mergeTransportSocketCluster` does.
fn merge_cluster(c: &Cluster, p: &PatchWrapper) -> Result<Cluster, PatchError> {
    use proto::pb::envoy::config::core::v3::transport_socket::ConfigType;
    let patch: Cluster = p.value()?;
    let mut merged = merge(c, p.bytes()?, &c.name)?;
    if let (Some(cur), Some(new)) = (&c.transport_socket, &patch.transport_socket)
        && let (Some(ConfigType::TypedConfig(a)), Some(ConfigType::TypedConfig(b))) =
            (&cur.config_type, &new.config_type)
        && a.type_url == b.type_url
        && let Some(ts) = merged.transport_socket.as_mut()
    {
        ts.config_type = Some(ConfigType::TypedConfig(merge_any(a, b, &c.name)?));
    }
    Ok(merged)
}
