//! Istio's automated gateway deployment on the Kubernetes API stand-in: a
//! Gateway of class `istio` gets, from istiod, its ServiceAccount,
//! Deployment and Service (server-side applied, owned by the Gateway). The
//! harness runs the Deployment's Pod template as a kubelet would
//! (`tests::injected`, nothing added), and a client outside the mesh
//! reaches httpbin through it; the Gateway's status shows the Service's
//! load balancer address; deleting the Gateway removes all three (the
//! API's garbage collection by owner references).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tests::mesh::{HUB_IP, LocalMesh, http_request};
use tests::wait_for;

const WAIT: Duration = Duration::from_secs(60);
/// The gateway Pod's address on the hub.
const GATEWAY_POD_IP: &str = "198.18.0.24";
/// A client outside the mesh.
const CLIENT_IP: &str = "198.18.0.34";
const HOST: &str = "httpbin.example.com";
const GW_API: &str = "gateway.networking.k8s.io/v1";

fn manifest(name: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../manifests/istiod")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    istiod::inject::parse_yaml_documents(&text).unwrap()
}

fn yaml(s: &str) -> Value {
    serde_yaml_ng::from_str(s).unwrap()
}

const GATEWAY: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: ingress, namespace: demo}
spec:
  gatewayClassName: istio
  infrastructure:
    labels: {team: edge}
  listeners:
  - {name: http, port: 80, protocol: HTTP, hostname: httpbin.example.com}
"#;

const ROUTE: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: httpbin, namespace: demo}
spec:
  parentRefs: [{name: ingress}]
  hostnames: [httpbin.example.com]
  rules: [{backendRefs: [{name: httpbin, port: 8000}]}]
"#;

/// The Pod a ReplicaSet makes of the Deployment's template.
fn pod_of(deployment: &Value) -> Value {
    let t = &deployment["spec"]["template"];
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "ingress-istio-5d7c9b-x2k4p",
            "namespace": deployment["metadata"]["namespace"],
            "labels": t["metadata"]["labels"],
            "annotations": t["metadata"]["annotations"],
        },
        "spec": t["spec"],
    })
}

#[test]
fn a_gateway_gets_its_deployment_and_service_and_loses_them_with_it() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start_kube(tmp.path());
    let api = mesh.kube_api.as_ref().unwrap();
    // The injector's settings: the template's values come from them.
    for o in manifest("31-configmap-injector.yaml") {
        api.create(o).unwrap();
    }
    let gateway = api.create(yaml(GATEWAY)).unwrap();
    api.create(yaml(ROUTE)).unwrap();
    let uid = gateway["metadata"]["uid"].as_str().unwrap().to_string();

    let get = |api_version: &str, kind: &str| api.get(api_version, kind, "demo", "ingress-istio");
    let deployment = wait_for("the Gateway's Deployment", WAIT, || {
        get("apps/v1", "Deployment")
    });
    let service = wait_for("the Gateway's Service", WAIT, || get("v1", "Service"));
    let account = wait_for("the Gateway's ServiceAccount", WAIT, || {
        get("v1", "ServiceAccount")
    });
    for o in [&deployment, &service, &account] {
        let owner = &o["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "Gateway", "{o:#}");
        assert_eq!(owner["name"], "ingress");
        assert_eq!(owner["uid"], uid.as_str());
        let labels = &o["metadata"]["labels"];
        assert_eq!(
            labels["gateway.istio.io/managed"],
            "istio.io-gateway-controller"
        );
        assert_eq!(labels["gateway.networking.k8s.io/gateway-name"], "ingress");
        assert_eq!(labels["team"], "edge", "infrastructure labels: {o:#}");
    }
    let proxy = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(proxy["args"][0], "proxy");
    assert_eq!(proxy["args"][1], "router");
    assert_eq!(service["spec"]["type"], "LoadBalancer");
    let ports: Vec<(String, u64)> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["port"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [("status-port".to_string(), 15021), ("http".to_string(), 80)]
    );
    let applied = api.requests().into_iter().any(|r| {
        r.method == "PATCH"
            && r.path.ends_with("/deployments/ingress-istio")
            && r.content_type
                .as_deref()
                .is_some_and(|c| c.contains("apply-patch"))
            && r.query
                .contains("fieldManager=istio.io%2Fgateway-controller")
            && r.query.contains("force=true")
    });
    assert!(applied, "server-side applied as Istio's controller");

    // Run the Deployment's Pod from its template alone.
    let root_cm = api
        .get("v1", "ConfigMap", "demo", "istio-ca-root-cert")
        .expect("istiod publishes istio-ca-root-cert in every namespace");
    let configmaps: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::from([(
        "istio-ca-root-cert".to_string(),
        serde_json::from_value(root_cm["data"].clone()).unwrap(),
    )]);
    let token = mesh.istiod.token("demo", "ingress-istio");
    let facts = tests::injected::PodFacts {
        ip: GATEWAY_POD_IP.into(),
        node_name: "node-1".into(),
        host_ip: HUB_IP.into(),
        configmaps,
        token: Box::new(move |audience| {
            assert_eq!(
                audience, "istio-ca",
                "the template asks for Istio's audience"
            );
            token.clone()
        }),
    };
    let pilot_agent = tests::mesh::runnable_by_proxy(&tests::bin("pilot-agent"), tmp.path());
    let mut running = tests::injected::run(
        &mesh.hub,
        &pod_of(&deployment),
        &facts,
        &pilot_agent,
        &tmp.path().join("ingress-istio"),
    );

    // A cloud's load balancer controller publishes the Service's address
    // (here the Pod's); the Gateway's status follows.
    let mut with_lb = api.get("v1", "Service", "demo", "ingress-istio").unwrap();
    with_lb["status"] = json!({"loadBalancer": {"ingress": [{"ip": GATEWAY_POD_IP}]}});
    api.update(with_lb).unwrap();
    let addresses = wait_for("the Gateway's status addresses", WAIT, || {
        let gw = api.get(GW_API, "Gateway", "demo", "ingress")?;
        let a = gw["status"]["addresses"].clone();
        a.is_array().then_some(a)
    });
    assert_eq!(
        addresses,
        json!([{"type": "IPAddress", "value": GATEWAY_POD_IP}])
    );

    // A client outside the mesh, through the gateway, to httpbin.
    let client = mesh.plain_pod(CLIENT_IP);
    let target: SocketAddr = format!("{GATEWAY_POD_IP}:80").parse().unwrap();
    let (code, body) = wait_for("httpbin through the deployed gateway", WAIT, || {
        let agent = running.container("istio-proxy");
        assert!(
            agent.alive(),
            "the gateway's agent exited:\n{}",
            agent.log()
        );
        http_request(&client.ns, target, HOST, "/headers")
            .ok()
            .filter(|(c, _)| *c == 200)
    });
    assert_eq!(code, 200);
    assert!(
        body.contains("spiffe://cluster.local/ns/demo/sa/ingress-istio"),
        "httpbin saw the gateway's identity over mTLS: {body}"
    );

    // Only the holder of the per-revision Lease writes.
    let lease = api
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            "istio-system",
            "istio-gateway-deployment-default",
        )
        .expect("the controller's Lease");
    assert!(
        lease["spec"]["holderIdentity"]
            .as_str()
            .is_some_and(|h| !h.is_empty()),
        "{lease:#}"
    );

    // A generated object deleted by hand comes back.
    api.delete("apps/v1", "Deployment", "demo", "ingress-istio")
        .unwrap();
    wait_for("the Deployment applied again", WAIT, || {
        get("apps/v1", "Deployment")
    });

    customized_and_manual_gateways(api);

    // Deleting the Gateway deletes what it owns.
    api.delete(GW_API, "Gateway", "demo", "ingress").unwrap();
    wait_for("the Gateway's objects removed", WAIT, || {
        (get("apps/v1", "Deployment").is_none()
            && get("v1", "Service").is_none()
            && get("v1", "ServiceAccount").is_none())
        .then_some(())
    });
}

/// A Gateway customized by annotation and `parametersRef` ConfigMap, and
/// one deployed by hand (a `Hostname` address), which gets nothing.
fn customized_and_manual_gateways(api: &tests::kube_api::KubeApi) {
    // Class-wide customizations, in istiod's namespace.
    api.create(yaml(
        r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: istio-class-defaults
  namespace: istio-system
  labels: {gateway.istio.io/defaults-for-class: istio}
data:
  serviceAccount: |
    metadata:
      annotations: {example.com/from: class-defaults}
"#,
    ))
    .unwrap();
    api.create(yaml(
        r#"apiVersion: v1
kind: ConfigMap
metadata: {name: gw-options, namespace: demo}
data:
  deployment: |
    spec:
      replicas: 2
  service: |
    metadata:
      annotations: {example.com/lb: internal}
"#,
    ))
    .unwrap();
    api.create(yaml(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: manual, namespace: demo}
spec:
  gatewayClassName: istio
  addresses: [{type: Hostname, value: httpbin.demo.svc.cluster.local}]
  listeners: [{name: http, port: 8081, protocol: HTTP}]
"#,
    ))
    .unwrap();
    api.create(yaml(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: custom
  namespace: demo
  annotations: {networking.istio.io/service-type: ClusterIP}
spec:
  gatewayClassName: istio
  infrastructure:
    parametersRef: {group: "", kind: ConfigMap, name: gw-options}
  listeners: [{name: web, port: 8080, protocol: HTTP}]
"#,
    ))
    .unwrap();
    let deployment = wait_for("the customized Deployment", WAIT, || {
        api.get("apps/v1", "Deployment", "demo", "custom-istio")
    });
    assert_eq!(deployment["spec"]["replicas"], 2, "{deployment:#}");
    let service = wait_for("the customized Service", WAIT, || {
        api.get("v1", "Service", "demo", "custom-istio")
    });
    assert_eq!(service["spec"]["type"], "ClusterIP");
    let account = wait_for("the class defaults on the ServiceAccount", WAIT, || {
        api.get("v1", "ServiceAccount", "demo", "custom-istio")
            .filter(|a| a["metadata"]["annotations"]["example.com/from"] == "class-defaults")
    });
    assert_eq!(
        account["metadata"]["labels"]["gateway.istio.io/managed"],
        "istio.io-gateway-controller"
    );
    assert_eq!(
        service["metadata"]["annotations"]["example.com/lb"],
        "internal"
    );
    // Not a load balancer: the status reports the Service's host name.
    let addresses = wait_for("the customized Gateway's addresses", WAIT, || {
        let a = api.get(GW_API, "Gateway", "demo", "custom")?["status"]["addresses"].clone();
        a.is_array().then_some(a)
    });
    assert_eq!(
        addresses,
        json!([{"type": "Hostname", "value": "custom-istio.demo.svc.cluster.local"}])
    );
    // Both Gateways were reconciled in the same passes: the manual one got
    // nothing.
    assert!(
        api.get("apps/v1", "Deployment", "demo", "manual-istio")
            .is_none()
    );
    assert!(api.get("v1", "Service", "demo", "manual-istio").is_none());
}
