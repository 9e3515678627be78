//! Locality load balancing, as Istio's `networking/core/loadbalancer`
//! applies it: the effective `localityLbSetting` (the DestinationRule's,
//! else the mesh config's, else Istio's default `enabled: true`); on the
//! cluster, Envoy's locality-weighted balancing when `distribute` is set or
//! failover is configured; in each proxy's load assignment, `distribute`
//! as locality weights, or, when the cluster has outlier detection,
//! priorities: `failoverPriority` labels first, then region, zone and
//! sub-zone relative to the proxy's own locality (`failover` naming the
//! region to fall back to).

use std::collections::{BTreeMap, BTreeSet};

use proto::pb::envoy::config::cluster::v3::{Cluster, cluster};
use proto::pb::envoy::config::core::v3::Locality;
use proto::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, LocalityLbEndpoints};

use super::util::u32v;
use crate::model::istio::{Labels, LocalityLbSetting};
use crate::pushctx::locality::{NETWORK_LABEL, ProxyLocality, parse};

/// Istio's `LocalityLBSettings.ApplyToCluster` for EDS clusters: Envoy's
/// locality-weighted balancing when weights are distributed, or when
/// failover is configured and outlier detection is on.
pub fn apply_to_cluster(c: &mut Cluster, setting: &LocalityLbSetting) {
    let failover = c.outlier_detection.is_some()
        && (!setting.failover.is_empty() || !setting.failover_priority.is_empty());
    if failover || !setting.distribute.is_empty() {
        c.common_lb_config
            .get_or_insert_with(Default::default)
            .locality_config_specifier = Some(
            cluster::common_lb_config::LocalityConfigSpecifier::LocalityWeightedLbConfig(
                cluster::common_lb_config::LocalityWeightedLbConfig {},
            ),
        );
    }
}

/// Istio's `ApplyLocalityLoadBalancer`. `endpoint_labels[i][j]` are the
/// (topology-augmented) labels of `cla.endpoints[i].lb_endpoints[j]`.
pub fn apply_to_load_assignment(
    cla: &mut ClusterLoadAssignment,
    endpoint_labels: &[Vec<Labels>],
    proxy: &ProxyLocality,
    setting: &LocalityLbSetting,
    outlier_detection: bool,
) {
    let locality = parse(&proxy.locality);
    if !setting.distribute.is_empty() {
        apply_weights(&locality, cla, setting);
    } else if outlier_detection {
        if !setting.failover_priority.is_empty() {
            apply_failover_priorities(
                cla,
                endpoint_labels,
                &proxy.labels,
                &setting.failover_priority,
            );
            if !setting.failover.is_empty() {
                apply_failover(&locality, cla, setting);
            }
        } else {
            apply_failover(&locality, cla, setting);
        }
    }
}

/// Istio's `util.LocalityMatch`: `rule` is `region[/zone[/subzone]]`, `*`
/// matching any value, a missing part matching any.
fn locality_match(l: &Locality, rule: &str) -> bool {
    let mut parts = rule.splitn(3, '/');
    let region = parts.next().unwrap_or_default();
    let zone = parts.next().unwrap_or_default();
    let sub_zone = parts.next().unwrap_or_default();
    (region == "*" || l.region == region)
        && (zone == "*" || zone.is_empty() || l.zone == zone)
        && (sub_zone == "*" || sub_zone.is_empty() || l.sub_zone == sub_zone)
}

/// Istio's `applyLocalityWeights`: the first `distribute` entry whose
/// `from` matches the proxy weights the localities its `to` names (a
/// wildcard's weight shared by the localities it matches, in proportion to
/// their own weights); localities it does not name get no traffic.
fn apply_weights(
    locality: &Locality,
    cla: &mut ClusterLoadAssignment,
    setting: &LocalityLbSetting,
) {
    let Some(rule) = setting
        .distribute
        .iter()
        .find(|d| locality_match(locality, &d.from))
    else {
        return;
    };
    let mut unmatched: BTreeSet<usize> = (0..cla.endpoints.len()).collect();
    for (to, weight) in &rule.to {
        let matched: BTreeMap<usize, u32> = cla
            .endpoints
            .iter()
            .enumerate()
            .filter(|(i, e)| {
                unmatched.contains(i)
                    && locality_match(e.locality.as_ref().unwrap_or(&Locality::default()), to)
            })
            .map(|(i, e)| (i, e.load_balancing_weight.map_or(1, |w| w.value)))
            .collect();
        let total: u32 = matched.values().sum();
        for (i, original) in matched {
            unmatched.remove(&i);
            let w = f64::from(original) * f64::from(*weight) / f64::from(total);
            if w > 0.0 {
                cla.endpoints[i].load_balancing_weight = Some(u32v(w.ceil() as u32));
            }
        }
    }
    for i in unmatched {
        cla.endpoints[i].lb_endpoints.clear();
    }
}

/// Istio's `util.LbPriority`: 0 for the proxy's sub-zone, 1 its zone, 2
/// its region, 3 elsewhere.
fn lb_priority(proxy: &Locality, ep: &Locality) -> u32 {
    match (
        proxy.region == ep.region,
        proxy.zone == ep.zone,
        proxy.sub_zone == ep.sub_zone,
    ) {
        (true, true, true) => 0,
        (true, true, false) => 1,
        (true, false, _) => 2,
        _ => 3,
    }
}

/// Renumbers priorities 0..N without gaps, keeping their order.
fn compact(endpoints: &mut [LocalityLbEndpoints]) {
    let used: BTreeSet<u32> = endpoints.iter().map(|e| e.priority).collect();
    let rank: BTreeMap<u32, u32> = used.into_iter().zip(0..).collect();
    for e in endpoints {
        e.priority = rank[&e.priority];
    }
}

/// Istio's `applyLocalityFailover`: priority by region/zone/sub-zone
/// match, a region other than a `failover` rule's `to` (for the proxy's
/// region) last; composed with priorities already set (times 5).
fn apply_failover(
    locality: &Locality,
    cla: &mut ClusterLoadAssignment,
    setting: &LocalityLbSetting,
) {
    for e in &mut cla.endpoints {
        let ep = e.locality.clone().unwrap_or_default();
        let mut p = lb_priority(locality, &ep);
        if p == 3
            && let Some(rule) = setting.failover.iter().find(|f| f.from == locality.region)
            && ep.region != rule.to
        {
            p = 4;
        }
        e.priority = e.priority * 5 + p;
    }
    compact(&mut cla.endpoints);
}

/// Istio's `applyFailoverPriorities`: each locality's endpoints split by
/// how many of the `failoverPriority` labels (in order) they share with the
/// proxy (`label=value` compares with that value instead); the network
/// label first is ignored when it differs, putting the endpoint after the
/// others.
fn apply_failover_priorities(
    cla: &mut ClusterLoadAssignment,
    endpoint_labels: &[Vec<Labels>],
    proxy_labels: &Labels,
    priorities: &[String],
) {
    if proxy_labels.is_empty() || endpoint_labels.is_empty() {
        return;
    }
    let lowest = priorities.len();
    let includes_network = priorities.first().is_some_and(|p| p == NETWORK_LABEL);
    let rules: Vec<(&str, Option<&str>)> = priorities
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (p.as_str(), None),
        })
        .collect();
    let mut out = Vec::new();
    for (group, labels) in cla.endpoints.iter().zip(endpoint_labels) {
        let mut by_priority: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, ep_labels) in labels.iter().enumerate() {
            let mut priority = 0;
            let mut adjust = 0;
            for (j, (label, fixed)) in rules.iter().enumerate() {
                let want = fixed.or_else(|| proxy_labels.get(*label).map(String::as_str));
                if want != ep_labels.get(*label).map(String::as_str) {
                    if j == 0 && includes_network {
                        adjust = lowest;
                        continue;
                    }
                    priority = lowest - j;
                    break;
                }
            }
            by_priority.entry(priority + adjust).or_default().push(i);
        }
        for (priority, members) in by_priority {
            let lb_endpoints: Vec<_> = members
                .iter()
                .map(|i| group.lb_endpoints[*i].clone())
                .collect();
            let weight = lb_endpoints
                .iter()
                .map(|e| e.load_balancing_weight.map_or(0, |w| w.value))
                .sum();
            out.push(LocalityLbEndpoints {
                lb_endpoints,
                priority: priority as u32,
                load_balancing_weight: Some(u32v(weight)),
                ..group.clone()
            });
        }
    }
    compact(&mut out);
    cla.endpoints = out;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::istio::{LocalityDistribute, LocalityFailover};
    use crate::pushctx::locality::{MESH_DEFAULT, augment};
    use proto::pb::envoy::config::endpoint::v3::LbEndpoint;

    fn group(locality: &str, n: usize) -> LocalityLbEndpoints {
        LocalityLbEndpoints {
            locality: Some(parse(locality)),
            lb_endpoints: vec![
                LbEndpoint {
                    load_balancing_weight: Some(u32v(1)),
                    ..Default::default()
                };
                n
            ],
            load_balancing_weight: Some(u32v(n as u32)),
            ..Default::default()
        }
    }

    fn cla(localities: &[&str]) -> ClusterLoadAssignment {
        ClusterLoadAssignment {
            endpoints: localities.iter().map(|l| group(l, 1)).collect(),
            ..Default::default()
        }
    }

    fn proxy(locality: &str) -> ProxyLocality {
        ProxyLocality {
            locality: locality.into(),
            labels: augment(&Labels::new(), locality, "", ""),
        }
    }

    fn priorities(c: &ClusterLoadAssignment) -> Vec<u32> {
        c.endpoints.iter().map(|e| e.priority).collect()
    }

    #[test]
    fn default_failover_orders_by_sub_zone_zone_region() {
        let mut c = cla(&["r1/z1/s1", "r1/z1/s2", "r1/z2", "r2/z9", "r1/z1/s1"]);
        apply_to_load_assignment(&mut c, &[], &proxy("r1/z1/s1"), &MESH_DEFAULT, true);
        assert_eq!(priorities(&c), vec![0, 1, 2, 3, 0]);
        // Without outlier detection Envoy could never leave priority 0:
        // nothing is set.
        let mut c = cla(&["r1/z1/s1", "r2/z9"]);
        apply_to_load_assignment(&mut c, &[], &proxy("r1/z1/s1"), &MESH_DEFAULT, false);
        assert_eq!(priorities(&c), vec![0, 0]);
    }

    #[test]
    fn failover_names_the_next_region() {
        let setting = LocalityLbSetting {
            failover: vec![LocalityFailover {
                from: "r1".into(),
                to: "r3".into(),
            }],
            ..Default::default()
        };
        let mut c = cla(&["r2/z", "r3/z", "r1/z"]);
        apply_to_load_assignment(&mut c, &[], &proxy("r1/z"), &setting, true);
        assert_eq!(priorities(&c), vec![2, 1, 0]);
    }

    #[test]
    fn distribute_weights_named_localities_and_drops_the_rest() {
        let setting = LocalityLbSetting {
            distribute: vec![LocalityDistribute {
                from: "r1/z1/*".into(),
                to: [("r1/z1".to_string(), 80), ("r1/z2".to_string(), 20)].into(),
            }],
            ..Default::default()
        };
        let mut c = cla(&["r1/z1", "r1/z2", "r2/z1"]);
        apply_to_load_assignment(&mut c, &[], &proxy("r1/z1"), &setting, false);
        let weights: Vec<u32> = c
            .endpoints
            .iter()
            .map(|e| e.load_balancing_weight.unwrap().value)
            .collect();
        assert_eq!(weights[..2], [80, 20]);
        assert!(c.endpoints[2].lb_endpoints.is_empty());
        // A proxy the rule is not from: untouched.
        let mut c = cla(&["r1/z1", "r1/z2"]);
        apply_to_load_assignment(&mut c, &[], &proxy("r9/z1"), &setting, false);
        assert_eq!(c.endpoints[1].lb_endpoints.len(), 1);
    }

    #[test]
    fn failover_priority_splits_by_labels() {
        let setting = LocalityLbSetting {
            failover_priority: vec!["version".into(), "tier=gold".into()],
            ..Default::default()
        };
        let mut c = ClusterLoadAssignment {
            endpoints: vec![group("r/z", 3)],
            ..Default::default()
        };
        let label = |v: &str, t: &str| -> Labels {
            [
                ("version".to_string(), v.to_string()),
                ("tier".to_string(), t.to_string()),
            ]
            .into()
        };
        let labels = vec![vec![
            label("v1", "gold"),
            label("v2", "gold"),
            label("v1", "tin"),
        ]];
        let p = ProxyLocality {
            locality: "r/z".into(),
            labels: label("v1", "tin"),
        };
        apply_to_load_assignment(&mut c, &labels, &p, &setting, true);
        // v1+gold first, v1 (tier differs) next, v2 last.
        let split: Vec<(u32, usize)> = c
            .endpoints
            .iter()
            .map(|e| (e.priority, e.lb_endpoints.len()))
            .collect();
        assert_eq!(split, vec![(0, 1), (1, 1), (2, 1)]);
    }
}
