#![allow(clippy::unwrap_used)]

use prost::Message;

use super::*;

const WEB: &str = "outbound|8000||web.demo.svc.cluster.local";

/// Nodes in zones `r1/zone-a` and `r1/zone-b`; Pods sleep (node-a) and
/// sleep-b (node-b), clients; Service web with a Pod in each zone.
const MESH: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/region: r1, topology.kubernetes.io/zone: zone-a}}
---
apiVersion: v1
kind: Node
metadata: {name: node-b, labels: {topology.kubernetes.io/region: r1, topology.kubernetes.io/zone: zone-b}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec: {clusterIP: 198.19.0.20, selector: {app: web}, ports: [{name: http, port: 8000, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: sleep, namespace: demo}
spec: {clusterIP: 198.19.0.21, selector: {app: sleep}, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web-a, namespace: demo, labels: {app: web, version: v1}}
spec: {nodeName: node-a, containers: [{name: web, image: web}]}
status: {phase: Running, podIP: 198.18.0.21}
---
apiVersion: v1
kind: Pod
metadata: {name: web-b, namespace: demo, labels: {app: web, version: v2}}
spec: {nodeName: node-b, containers: [{name: web, image: web}]}
status: {phase: Running, podIP: 198.18.0.22}
---
apiVersion: v1
kind: Pod
metadata: {name: sleep, namespace: demo, labels: {app: sleep, version: v2}}
spec: {nodeName: node-a, containers: [{name: sleep, image: sleep}]}
status: {phase: Running, podIP: 198.18.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: sleep-b, namespace: demo, labels: {app: sleep}}
spec: {nodeName: node-b, containers: [{name: sleep, image: sleep}]}
status: {phase: Running, podIP: 198.18.0.3}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [198.18.0.21], conditions: {ready: true}, targetRef: {kind: Pod, namespace: demo, name: web-a}}
- {addresses: [198.18.0.22], conditions: {ready: true}, targetRef: {kind: Pod, namespace: demo, name: web-b}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sleep-1, namespace: demo, labels: {kubernetes.io/service-name: sleep}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [198.18.0.2], conditions: {ready: true}, targetRef: {kind: Pod, namespace: demo, name: sleep}}
- {addresses: [198.18.0.3], conditions: {ready: true}, targetRef: {kind: Pod, namespace: demo, name: sleep-b}}
"#;

fn proxy(ip: &str) -> Proxy {
    Proxy {
        proxy_type: common::ProxyType::Sidecar,
        ip: ip.into(),
        ips: vec![ip.into()],
        namespace: "demo".into(),
        ..Default::default()
    }
}

/// web's load assignment for the proxy at `ip` under a rule with
/// `traffic_policy`: (zone, priority, weight) of each locality.
fn web_localities(traffic_policy: &str, ip: &str) -> Vec<(String, u32, u32)> {
    let dr = format!(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: web, namespace: demo}}\nspec:\n  host: web\n  trafficPolicy: {traffic_policy}\n"
    );
    let ctx = crate::pushctx::context::context_of_yaml(&format!("{MESH}---\n{dr}"));
    let r = build(&ctx, &proxy(ip), &BTreeSet::from([WEB.to_string()])).remove(0);
    let cla = ClusterLoadAssignment::decode(r.resource.value.as_slice()).unwrap();
    cla.endpoints
        .iter()
        .filter(|e| !e.lb_endpoints.is_empty())
        .map(|e| {
            (
                e.locality.clone().unwrap().zone,
                e.priority,
                e.load_balancing_weight.unwrap().value,
            )
        })
        .collect()
}

#[test]
fn outlier_detection_turns_on_failover_by_the_proxys_zone() {
    let od = "{outlierDetection: {consecutive5xxErrors: 1}}";
    assert_eq!(
        web_localities(od, "198.18.0.2"),
        [("zone-a".into(), 0, 1), ("zone-b".into(), 1, 1)]
    );
    // The same scope, another zone: the other order.
    assert_eq!(
        web_localities(od, "198.18.0.3"),
        [("zone-a".into(), 1, 1), ("zone-b".into(), 0, 1)]
    );
    // No outlier detection, or locality load balancing off: one priority.
    assert_eq!(
        web_localities("{connectionPool: {tcp: {maxConnections: 5}}}", "198.18.0.2"),
        [("zone-a".into(), 0, 1), ("zone-b".into(), 0, 1)]
    );
    assert_eq!(
        web_localities(
            "{outlierDetection: {consecutive5xxErrors: 1}, loadBalancer: {localityLbSetting: {enabled: false}}}",
            "198.18.0.2"
        ),
        [("zone-a".into(), 0, 1), ("zone-b".into(), 0, 1)]
    );
}

#[test]
fn distribute_weights_and_failover_priority_labels() {
    let distribute = "{loadBalancer: {localityLbSetting: {distribute: [{from: r1/zone-a/*, to: {r1/zone-a: 70, r1/zone-b: 30}}]}}}";
    assert_eq!(
        web_localities(distribute, "198.18.0.2"),
        [("zone-a".into(), 0, 70), ("zone-b".into(), 0, 30)]
    );
    // sleep-b is not from zone-a: Envoy's own balancing.
    assert_eq!(
        web_localities(distribute, "198.18.0.3"),
        [("zone-a".into(), 0, 1), ("zone-b".into(), 0, 1)]
    );
    // failoverPriority by version: sleep (version v2) prefers web-b (v2)
    // although it is in the other zone.
    let by_version = "{outlierDetection: {consecutive5xxErrors: 1}, loadBalancer: {localityLbSetting: {failoverPriority: [version]}}}";
    assert_eq!(
        web_localities(by_version, "198.18.0.2"),
        [("zone-a".into(), 1, 1), ("zone-b".into(), 0, 1)]
    );
}
