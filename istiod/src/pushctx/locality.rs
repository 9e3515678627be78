//! The locality of proxies and endpoints, as the push context knows it:
//! Istio's topology labels, the effective `localityLbSetting` of a
//! cluster (the DestinationRule's, else the mesh config's, else Istio's
//! default `enabled: true`) and whether its load assignment differs per
//! proxy. The generators apply it (`xds::locality`).

use proto::pb::envoy::config::core::v3::Locality;

use crate::model::istio::{Labels, LocalityLbSetting};
use crate::model::kube::{REGION_LABEL, SUBZONE_LABEL, ZONE_LABEL};

/// Istio's network label, which Istio adds to proxies' and endpoints'
/// labels (with the region, zone, sub-zone and cluster) for
/// `failoverPriority`.
pub const NETWORK_LABEL: &str = "topology.istio.io/network";
/// The cluster label.
pub const CLUSTER_LABEL: &str = "topology.istio.io/cluster";

/// Istio's mesh default: locality load balancing on.
pub(crate) static MESH_DEFAULT: LocalityLbSetting = LocalityLbSetting {
    distribute: Vec::new(),
    failover: Vec::new(),
    failover_priority: Vec::new(),
    enabled: Some(true),
};

/// Istio's `GetEffectiveLbSetting`: the rule's setting when it has one
/// (`enabled: false` turns locality load balancing off), else the mesh's;
/// `None` when off.
pub fn effective<'a>(
    mesh: Option<&'a LocalityLbSetting>,
    rule: Option<&'a LocalityLbSetting>,
) -> Option<&'a LocalityLbSetting> {
    let s = rule.or(mesh).unwrap_or(&MESH_DEFAULT);
    (s.enabled != Some(false)).then_some(s)
}

/// How one cluster's load assignment is made for each proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalityPlan {
    /// The effective setting.
    pub setting: LocalityLbSetting,
    /// Whether the cluster has outlier detection (failover needs it).
    pub outlier_detection: bool,
}

/// Whether a load assignment depends on the proxy's locality: weights to
/// distribute, or failover (which needs outlier detection).
pub fn per_proxy(setting: &LocalityLbSetting, outlier_detection: bool) -> bool {
    !setting.distribute.is_empty() || outlier_detection
}

/// The proxy a load assignment is built for: its locality and its labels
/// (with Istio's topology labels added).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ProxyLocality {
    /// `region/zone/subzone`.
    pub locality: String,
    /// Workload labels, topology labels included.
    pub labels: Labels,
}

/// `region/zone/subzone` as Envoy's locality.
pub fn parse(locality: &str) -> Locality {
    let mut parts = locality.splitn(3, '/');
    let mut next = || parts.next().unwrap_or_default().to_string();
    Locality {
        region: next(),
        zone: next(),
        sub_zone: next(),
    }
}

/// `labels` with Istio's topology labels (`AugmentLabels`): region, zone
/// and sub-zone from the locality, the network and the cluster.
pub fn augment(labels: &Labels, locality: &str, network: &str, cluster_id: &str) -> Labels {
    let mut out = labels.clone();
    let l = parse(locality);
    for (k, v) in [
        (REGION_LABEL, l.region.as_str()),
        (ZONE_LABEL, l.zone.as_str()),
        (SUBZONE_LABEL, l.sub_zone.as_str()),
        (NETWORK_LABEL, network),
        (CLUSTER_LABEL, cluster_id),
    ] {
        if !v.is_empty() {
            out.entry(k.to_string()).or_insert_with(|| v.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_setting_rule_then_mesh_then_default() {
        let off = LocalityLbSetting {
            enabled: Some(false),
            ..Default::default()
        };
        let on = LocalityLbSetting::default();
        assert_eq!(effective(None, None), Some(&MESH_DEFAULT));
        assert_eq!(effective(Some(&off), None), None);
        assert_eq!(effective(Some(&off), Some(&on)), Some(&on));
        assert_eq!(effective(None, Some(&off)), None);
    }
}
