//! Consistent hashing on routes: a DestinationRule's
//! `loadBalancer.consistentHash` makes its clusters RING_HASH or MAGLEV
//! (see CDS), and every route to them carries the hash key, as Istio's
//! `ConsistentHashToHashPolicy` builds it: a header, a cookie (with `path`
//! and `ttl`, Envoy setting it when absent), the source IP, or a query
//! parameter. Which `consistentHash` applies follows Istio's
//! `HashForHTTPDestination`: the subset's port-level settings, the
//! subset's, the rule's port-level settings, then the rule's. TCP proxies
//! hash on the source IP when the rule says `useSourceIp`
//! (`maybeSetHashPolicy`).

use proto::pb::envoy::config::route::v3::route_action::{HashPolicy, hash_policy};
use proto::pb::envoy::r#type::v3::HashPolicy as TcpHashPolicy;
use proto::pb::envoy::r#type::v3::hash_policy as tcp_hash_policy;

use crate::model::istio::{ConsistentHashLb, DestinationRule, TrafficPolicy};
use crate::xds::util::duration;

/// The port-level `consistentHash` of `tp` for `port`.
fn port_level(tp: &TrafficPolicy, port: u16) -> Option<&ConsistentHashLb> {
    tp.port_level_settings
        .iter()
        .find(|p| p.port.as_ref().is_some_and(|s| s.number == u32::from(port)))
        .and_then(|p| p.load_balancer.as_ref())
        .and_then(|lb| lb.consistent_hash.as_ref())
}

fn top_level(tp: &TrafficPolicy) -> Option<&ConsistentHashLb> {
    tp.load_balancer
        .as_ref()
        .and_then(|lb| lb.consistent_hash.as_ref())
}

/// Istio's `HashForHTTPDestination`: the `consistentHash` for a route to
/// `port` and `subset` (empty for none) of the rule's host.
pub(crate) fn for_destination<'a>(
    dr: &'a DestinationRule,
    port: u16,
    subset: &str,
) -> Option<&'a ConsistentHashLb> {
    let top = dr.traffic_policy.as_ref();
    let sub = dr
        .subsets
        .iter()
        .find(|s| !subset.is_empty() && s.name == subset)
        .and_then(|s| s.traffic_policy.as_ref());
    sub.and_then(|t| port_level(t, port))
        .or_else(|| sub.and_then(top_level))
        .or_else(|| top.and_then(|t| port_level(t, port)))
        .or_else(|| top.and_then(top_level))
}

/// Istio's `ConsistentHashToHashPolicy`.
pub(crate) fn hash_policy(ch: &ConsistentHashLb) -> Option<HashPolicy> {
    use hash_policy::PolicySpecifier;
    let specifier = if let Some(h) = &ch.http_header_name {
        PolicySpecifier::Header(hash_policy::Header {
            header_name: h.clone(),
            ..Default::default()
        })
    } else if let Some(c) = &ch.http_cookie {
        PolicySpecifier::Cookie(hash_policy::Cookie {
            name: c.name.clone(),
            ttl: c.ttl.map(duration),
            path: c.path.clone(),
            ..Default::default()
        })
    } else if let Some(source_ip) = ch.use_source_ip {
        PolicySpecifier::ConnectionProperties(hash_policy::ConnectionProperties { source_ip })
    } else if let Some(q) = &ch.http_query_parameter_name {
        PolicySpecifier::QueryParameter(hash_policy::QueryParameter { name: q.clone() })
    } else {
        return None;
    };
    Some(HashPolicy {
        policy_specifier: Some(specifier),
        terminal: false,
    })
}

/// Istio's `maybeSetHashPolicy`: a TCP proxy to `subset` (empty for none)
/// hashes on the source IP when the rule's `consistentHash` says
/// `useSourceIp` and the subset's load balancer does not say otherwise.
pub(crate) fn tcp_hash_policy(dr: &DestinationRule, subset: &str) -> Vec<TcpHashPolicy> {
    let mut source_ip = dr
        .traffic_policy
        .as_ref()
        .and_then(top_level)
        .and_then(|ch| ch.use_source_ip)
        == Some(true);
    if let Some(lb) = dr
        .subsets
        .iter()
        .find(|s| s.name == subset)
        .and_then(|s| s.traffic_policy.as_ref())
        .and_then(|t| t.load_balancer.as_ref())
    {
        source_ip = lb.consistent_hash.as_ref().and_then(|c| c.use_source_ip) == Some(true);
    }
    if !source_ip {
        return Vec::new();
    }
    vec![TcpHashPolicy {
        policy_specifier: Some(tcp_hash_policy::PolicySpecifier::SourceIp(
            tcp_hash_policy::SourceIp {},
        )),
    }]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dr(yaml: &str) -> DestinationRule {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn subset_port_then_subset_then_port_then_rule() {
        let rule = dr(r#"
host: a
trafficPolicy:
  loadBalancer: {consistentHash: {httpHeaderName: top}}
  portLevelSettings:
  - port: {number: 9000}
    loadBalancer: {consistentHash: {httpHeaderName: top-port}}
subsets:
- name: v1
  labels: {version: v1}
  trafficPolicy:
    loadBalancer: {consistentHash: {httpHeaderName: sub}}
    portLevelSettings:
    - port: {number: 9000}
      loadBalancer: {consistentHash: {httpHeaderName: sub-port}}
- name: v2
  labels: {version: v2}
"#);
        let header = |port, subset| {
            for_destination(&rule, port, subset)
                .and_then(|c| c.http_header_name.clone())
                .unwrap()
        };
        assert_eq!(header(8000, ""), "top");
        assert_eq!(header(9000, ""), "top-port");
        assert_eq!(header(8000, "v1"), "sub");
        assert_eq!(header(9000, "v1"), "sub-port");
        assert_eq!(header(8000, "v2"), "top");
    }

    #[test]
    fn every_hash_key_becomes_envoys() {
        use hash_policy::PolicySpecifier;
        let policy = |yaml: &str| {
            let ch: ConsistentHashLb = serde_yaml_ng::from_str(yaml).unwrap();
            hash_policy(&ch).unwrap().policy_specifier.unwrap()
        };
        assert!(matches!(
            policy("{httpHeaderName: x-user}"),
            PolicySpecifier::Header(h) if h.header_name == "x-user"
        ));
        assert!(matches!(
            policy("{httpCookie: {name: s, path: /p, ttl: 30s}}"),
            PolicySpecifier::Cookie(c) if c.name == "s" && c.path == "/p" && c.ttl.unwrap().seconds == 30
        ));
        assert!(matches!(
            policy("{useSourceIp: true}"),
            PolicySpecifier::ConnectionProperties(c) if c.source_ip
        ));
        assert!(matches!(
            policy("{httpQueryParameterName: u}"),
            PolicySpecifier::QueryParameter(q) if q.name == "u"
        ));
    }

    #[test]
    fn tcp_hashes_on_the_source_ip_unless_the_subset_says_otherwise() {
        let rule = dr(r#"
host: a
trafficPolicy: {loadBalancer: {consistentHash: {useSourceIp: true}}}
subsets:
- {name: v1, labels: {version: v1}, trafficPolicy: {loadBalancer: {simple: RANDOM}}}
- {name: v2, labels: {version: v2}}
"#);
        assert_eq!(tcp_hash_policy(&rule, "").len(), 1);
        assert_eq!(tcp_hash_policy(&rule, "v2").len(), 1);
        assert!(tcp_hash_policy(&rule, "v1").is_empty());
    }

    /// httpbin (8000, its rule hashing on `x-user`) and echo (9090, a
    /// VirtualService splitting it between echo and httpbin).
    const MESH: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: httpbin, namespace: demo}
spec: {clusterIP: 198.19.0.10, selector: {app: httpbin}, ports: [{name: http, port: 8000, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: demo}
spec: {clusterIP: 198.19.0.11, selector: {app: echo}, ports: [{name: http, port: 9090, targetPort: 8080}]}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: httpbin, namespace: demo}
spec:
  host: httpbin
  trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x-user}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: demo}
spec:
  hosts: [echo]
  http:
  - route:
    - {destination: {host: echo}, weight: 50}
    - {destination: {host: httpbin}, weight: 50}
"#;

    fn route_action(port: &str, vhost: &str) -> proto::pb::envoy::config::route::v3::RouteAction {
        use prost::Message;
        use proto::pb::envoy::config::route::v3::{RouteConfiguration, route};
        let ctx = crate::pushctx::context::context_of_yaml(MESH);
        let proxy = crate::pushctx::Proxy {
            proxy_type: common::ProxyType::Sidecar,
            ip: "198.18.0.2".into(),
            ips: vec!["198.18.0.2".into()],
            namespace: "demo".into(),
            ..Default::default()
        };
        let names = [port.to_string()].into();
        let r = super::super::build(&ctx, &proxy, &names).remove(0);
        let rc = RouteConfiguration::decode(r.resource.value.as_slice()).unwrap();
        let vh = rc
            .virtual_hosts
            .into_iter()
            .find(|v| v.name == vhost)
            .unwrap();
        match vh.routes[0].action.clone().unwrap() {
            route::Action::Route(a) => a,
            other => panic!("not a route: {other:?}"),
        }
    }

    #[test]
    fn routes_to_a_hashed_service_carry_its_hash_policy() {
        use hash_policy::PolicySpecifier;
        let header = |a: &proto::pb::envoy::config::route::v3::RouteAction| -> Vec<String> {
            a.hash_policy
                .iter()
                .map(|h| match &h.policy_specifier {
                    Some(PolicySpecifier::Header(h)) => h.header_name.clone(),
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        // The default route (no VirtualService), with Istio's default
        // retries.
        let default = route_action("8000", "httpbin.demo.svc.cluster.local:8000");
        assert_eq!(header(&default), ["x-user"]);
        assert_eq!(default.retry_policy.unwrap().retry_host_predicate.len(), 1);
        // A split whose one destination hashes: its policy, and retries
        // stay on the hashed host.
        let split = route_action("9090", "echo.demo.svc.cluster.local:9090");
        assert_eq!(header(&split), ["x-user"]);
        assert!(split.retry_policy.unwrap().retry_host_predicate.is_empty());
    }
}
