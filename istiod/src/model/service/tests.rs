//! The registry's unit tests.

use super::*;
use crate::model::{ConfigStore, parse_file};

fn registry(yaml: &str) -> ServiceRegistry {
    let store = ConfigStore::new();
    let objects = parse_file("t.yaml", yaml).unwrap().objects;
    store.replace(objects.into_iter().map(Arc::new));
    ServiceRegistry::build(&store.snapshot(), &RegistryOptions::default())
}

fn sample() -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/mesh");
    ["namespace.yaml", "sleep.yaml", "httpbin.yaml", "istio.yaml"]
        .iter()
        .map(|f| std::fs::read_to_string(dir.join(f)).unwrap())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

#[test]
fn endpoints_take_the_locality_of_their_node_or_pod_label() {
    let reg = registry(
        r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec: {clusterIP: 198.19.0.9, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [198.18.0.1], targetRef: {kind: Pod, name: a}}
- {addresses: [198.18.0.2], targetRef: {kind: Pod, name: b}}
- {addresses: [198.18.0.3], targetRef: {kind: Pod, name: c}}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: demo}
spec: {nodeName: node-1}
status: {podIP: 198.18.0.1}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: demo, labels: {istio-locality: eu.eu-b.rack1}}
spec: {nodeName: node-1}
status: {podIP: 198.18.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: c, namespace: demo}
spec: {nodeName: unlabelled}
status: {podIP: 198.18.0.3}
---
apiVersion: v1
kind: Node
metadata:
  name: node-1
  labels: {topology.kubernetes.io/region: us-east1, topology.kubernetes.io/zone: us-east1-b}
---
apiVersion: v1
kind: Node
metadata: {name: unlabelled}
"#,
    );
    let web = reg
        .by_hostname("web.demo.svc.cluster.local")
        .next()
        .unwrap();
    let localities: Vec<_> = web
        .endpoints
        .iter()
        .map(|e| (e.address.as_str(), e.locality.as_str()))
        .collect();
    assert_eq!(
        localities,
        vec![
            ("198.18.0.1", "us-east1/us-east1-b/"),
            ("198.18.0.2", "eu/eu-b/rack1"),
            ("198.18.0.3", ""),
        ]
    );
}

#[test]
fn kubernetes_services_join_slices_with_pods() {
    let reg = registry(&sample());
    let hosts: Vec<&str> = reg.services().iter().map(|s| s.hostname.as_str()).collect();
    assert_eq!(
        hosts,
        vec![
            "httpbin.demo.svc.cluster.local",
            "sleep.demo.svc.cluster.local"
        ]
    );
    let httpbin = reg
        .by_hostname("httpbin.demo.svc.cluster.local")
        .next()
        .unwrap();
    assert_eq!(httpbin.addresses, vec!["198.19.0.10"]);
    assert_eq!(httpbin.resolution, ServiceResolution::ClientSideLb);
    assert_eq!(
        httpbin.ports,
        vec![ServicePort {
            name: "http".into(),
            port: 8000,
            protocol: Protocol::Http
        }]
    );
    let eps: Vec<_> = httpbin.endpoints_for(8000).collect();
    assert_eq!(eps.len(), 2);
    assert_eq!(
        eps.iter()
            .map(|e| (e.address.as_str(), e.port, e.labels["version"].as_str()))
            .collect::<Vec<_>>(),
        vec![("198.18.0.3", 8080, "v1"), ("198.18.0.4", 8080, "v2")]
    );
    assert!(
        eps.iter()
            .all(|e| e.tls_mode == EndpointTlsMode::Istio && e.healthy)
    );
    assert_eq!(
        httpbin.identities().into_iter().collect::<Vec<_>>(),
        vec!["spiffe://cluster.local/ns/demo/sa/httpbin"]
    );
    assert_eq!(
        eps[0].workload,
        Some(ObjectKey::new(Kind::Pod, "demo", "httpbin-v1"))
    );
}

#[test]
fn unready_headless_and_external_name_services() {
    let reg = registry(
        r#"
apiVersion: v1
kind: Service
metadata: {name: db, namespace: data, annotations: {networking.istio.io/exportTo: "."}}
spec: {clusterIP: None, ports: [{name: tcp-db, port: 5432}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: db-1, namespace: data, labels: {kubernetes.io/service-name: db}}
addressType: IPv4
ports: [{name: tcp-db, port: 5432}]
endpoints:
- addresses: [10.244.1.5]
  conditions: {ready: false}
---
apiVersion: v1
kind: Pod
metadata: {name: db-0, namespace: data, labels: {app: db}}
spec: {}
status: {podIP: 10.244.1.5}
---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: data}
spec: {type: ExternalName, externalName: api.example.com, ports: [{name: https, port: 443}]}
"#,
    );
    let db = reg.by_hostname("db.data.svc.cluster.local").next().unwrap();
    assert_eq!(db.resolution, ServiceResolution::Passthrough);
    assert!(db.addresses.is_empty());
    assert_eq!(db.ports[0].protocol, Protocol::Tcp);
    let ep = &db.endpoints[0];
    assert!(!ep.healthy);
    // Joined by IP: the Pod's default service account, no tlsMode label.
    assert_eq!(
        ep.identity.as_ref().map(ToString::to_string).as_deref(),
        Some("spiffe://cluster.local/ns/data/sa/default")
    );
    assert_eq!(ep.tls_mode, EndpointTlsMode::Disabled);
    assert!(db.export_to.is_visible_to("data"));
    assert!(!db.export_to.is_visible_to("demo"));
    assert_eq!(reg.visible_to("demo").count(), 1);

    let ext = reg
        .by_hostname("ext.data.svc.cluster.local")
        .next()
        .unwrap();
    assert_eq!(ext.resolution, ServiceResolution::DnsLb);
    assert!(ext.mesh_external);
    assert_eq!(ext.endpoints[0].address, "api.example.com");
    assert_eq!(ext.ports[0].protocol, Protocol::Https);
}

#[test]
fn service_entries_with_endpoints_and_workload_selectors() {
    let reg = registry(
        r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: external, namespace: demo}
spec:
  hosts: [api.example.com, api2.example.com]
  addresses: [240.0.0.1]
  ports: [{number: 443, name: https, protocol: TLS}]
  resolution: STATIC
  endpoints:
  - {address: 10.1.0.1}
  - {address: 10.1.0.2, ports: {https: 8443}, labels: {security.istio.io/tlsMode: istio}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: vms, namespace: demo}
spec:
  hosts: [vm.demo.internal]
  location: MESH_INTERNAL
  ports: [{number: 80, name: http, protocol: http, targetPort: 8080}]
  resolution: STATIC
  workloadSelector: {labels: {app: vm}}
  exportTo: [demo, other]
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: vm-1, namespace: demo}
spec: {address: 10.2.0.1, labels: {app: vm, security.istio.io/tlsMode: istio}, serviceAccount: vm, weight: 3}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: other, namespace: demo}
spec: {address: 10.2.0.9, labels: {app: other}}
"#,
    );
    let api: Vec<_> = reg
        .services()
        .iter()
        .filter(|s| s.source_object.name == "external")
        .collect();
    assert_eq!(api.len(), 2, "one service per host");
    let api = api[0];
    assert_eq!(api.hostname, "api.example.com");
    assert!(api.mesh_external);
    assert_eq!(api.addresses, vec!["240.0.0.1"]);
    assert_eq!(api.ports[0].protocol, Protocol::Tls);
    let eps: Vec<_> = api
        .endpoints
        .iter()
        .map(|e| (e.address.as_str(), e.port, e.tls_mode))
        .collect();
    // MESH_EXTERNAL endpoints never get Istio mTLS.
    assert_eq!(
        eps,
        vec![
            ("10.1.0.1", 443, EndpointTlsMode::Disabled),
            ("10.1.0.2", 8443, EndpointTlsMode::Disabled)
        ]
    );

    let vm = reg.by_hostname("vm.demo.internal").next().unwrap();
    assert!(!vm.mesh_external);
    assert_eq!(vm.ports[0].protocol, Protocol::Http);
    assert_eq!(vm.endpoints.len(), 1);
    let ep = &vm.endpoints[0];
    assert_eq!(
        (ep.address.as_str(), ep.port, ep.weight),
        ("10.2.0.1", 8080, 3)
    );
    assert_eq!(ep.network, "");
    assert_eq!(ep.tls_mode, EndpointTlsMode::Istio);
    assert_eq!(
        ep.identity.as_ref().map(ToString::to_string).as_deref(),
        Some("spiffe://cluster.local/ns/demo/sa/vm")
    );
    assert!(vm.export_to.is_visible_to("other"));
    assert!(!vm.export_to.is_visible_to("istio-system"));
}

#[test]
fn kubernetes_port_protocols_follow_istio() {
    let p = Protocol::from_kube_port;
    assert_eq!(p(80, "http", None, None), Protocol::Http);
    assert_eq!(p(80, "http-web", None, None), Protocol::Http);
    assert_eq!(p(80, "HTTP2-x", None, None), Protocol::Http2);
    assert_eq!(p(80, "grpc-web-api", None, None), Protocol::GrpcWeb);
    assert_eq!(p(80, "grpc", None, None), Protocol::Grpc);
    assert_eq!(p(80, "web", None, None), Protocol::Unsupported);
    assert_eq!(p(80, "web", None, Some("http")), Protocol::Http);
    assert_eq!(
        p(80, "tcp", None, Some("kubernetes.io/h2c")),
        Protocol::Http2
    );
    assert_eq!(p(80, "", None, Some("kubernetes.io/ws")), Protocol::Http);
    assert_eq!(p(443, "", None, Some("kubernetes.io/wss")), Protocol::Https);
    assert_eq!(p(3306, "db", None, None), Protocol::Tcp);
    assert_eq!(p(53, "dns", Some("UDP"), None), Protocol::Udp);
    assert_eq!(p(53, "dns", Some("TCP"), None), Protocol::Tcp);
}

#[test]
fn export_to_and_sidecar_egress_hosts() {
    let v = |list: &[&str], owner: &str, client: &str| {
        let list: Vec<String> = list.iter().map(|s| s.to_string()).collect();
        is_exported_to(&list, owner, client)
    };
    assert!(v(&[], "a", "b"));
    assert!(v(&["*"], "a", "b"));
    assert!(v(&["."], "a", "a"));
    assert!(!v(&["."], "a", "b"));
    assert!(!v(&["~"], "a", "a"));
    assert!(v(&["b", "c"], "a", "c"));
    assert!(!v(&["b", "c"], "a", "a"));

    let m = egress_host_matches;
    assert!(m("./*", "demo", "demo", "httpbin.demo.svc.cluster.local"));
    assert!(!m("./*", "demo", "other", "x.other.svc.cluster.local"));
    assert!(m(
        "istio-system/*",
        "demo",
        "istio-system",
        "istiod.istio-system.svc.cluster.local"
    ));
    assert!(m("*/*.example.com", "demo", "x", "api.example.com"));
    assert!(!m("*/*.example.com", "demo", "x", "example.com"));
    assert!(m("*/api.example.com", "demo", "x", "api.example.com"));
    assert!(!m("~/*", "demo", "demo", "a"));
}
