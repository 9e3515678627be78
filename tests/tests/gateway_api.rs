//! The Kubernetes Gateway API: the routing of `gateway.rs` expressed as a
//! Gateway API `Gateway` + `HTTPRoute`, translated by istiod as Istio's
//! gateway controller does. Through the file source, a client outside the
//! mesh reaches httpbin through the gateway Pod (a `router` labelled
//! `gateway.networking.k8s.io/gateway-name`), which speaks mTLS with its own
//! SPIFFE identity; a header and path match, a 90/10 split, a missing
//! backend's 500 and an unknown host's 404 behave as in Istio. Policies
//! attached to the Gateway by `targetRefs` (the Gateway, or its Service)
//! are enforced at its Pod, and those naming another Gateway are not. On
//! the Kubernetes source, istiod writes the routes' and Gateway's status
//! back.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use tests::gateway_pod::GatewaySpec;
use tests::jwt::{Signer, claims, jwks};
use tests::kube_api::KubeApi;
use tests::mesh::{LocalMesh, http_request, http_request_with};
use tests::{Proc, bin, free_port, http_get, wait_for};

const WAIT: Duration = Duration::from_secs(60);

/// The gateway Pod's address on the hub.
const GATEWAY_IP: &str = "198.18.0.21";
/// A client outside the mesh.
const CLIENT_IP: &str = "198.18.0.31";
/// The gateway's identity: the service account Istio's automated
/// deployment gives a Gateway `ingress` (`<name>-istio`).
const GATEWAY_ID: &str = "spiffe://cluster.local/ns/istio-system/sa/ingress-istio";
const HOST: &str = "httpbin.example.com";

const GATEWAY: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: ingress, namespace: istio-system}
spec:
  gatewayClassName: istio
  listeners:
  - name: http
    port: 8080
    protocol: HTTP
    allowedRoutes: {namespaces: {from: All}}
"#;

const ROUTE: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: httpbin, namespace: demo}
spec:
  parentRefs: [{name: ingress, namespace: istio-system, sectionName: http}]
  hostnames: [httpbin.example.com]
  rules:
  - matches:
    - path: {type: PathPrefix, value: /headers}
      headers: [{name: x-version, value: v2}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-via, value: gateway-api}]}
    backendRefs: [{name: httpbin-v2, port: 8000}]
  - matches: [{path: {type: Exact, value: /missing}}]
    backendRefs: [{name: nonexistent, port: 8000}]
  - backendRefs:
    - {name: httpbin-v1, port: 8000, weight: 90}
    - {name: httpbin-v2, port: 8000, weight: 10}
"#;

fn line<'a>(body: &'a str, key: &str) -> &'a str {
    body.lines().find_map(|l| l.strip_prefix(key)).unwrap_or("")
}

#[test]
fn a_gateway_api_gateway_routes_outside_clients_into_the_mesh() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    tests::write_atomically(
        &mesh.config_dir.join("versions.yaml"),
        tests::mesh::HTTPBIN_VERSION_SERVICES,
    );
    tests::write_atomically(
        &mesh.config_dir.join("gateway-api.yaml"),
        &format!("{GATEWAY}---\n{ROUTE}"),
    );

    // The gateway Pod, labelled as Istio's automated deployment labels it.
    let mut gw = mesh.start_gateway(&GatewaySpec::gateway_api_ingress(GATEWAY_IP));

    let client = mesh.plain_pod(CLIENT_IP);
    let gateway: SocketAddr = format!("{GATEWAY_IP}:8080").parse().unwrap();
    let matched = [("x-version", "v2")];
    let body = wait_for("httpbin v2 through the Gateway API route", WAIT, || {
        assert!(
            gw.agent.alive(),
            "the gateway's agent exited:\n{}",
            gw.agent.log()
        );
        match http_request_with(&client.ns, gateway, HOST, "/headers", &matched) {
            Ok((200, body)) if line(&body, "version=") == "v2" => Some(body),
            _ => None,
        }
    });
    assert!(
        body.lines()
            .any(|l| l.eq_ignore_ascii_case("header=x-via: gateway-api")),
        "the rule's RequestHeaderModifier set the header: {body}"
    );
    let xfcc = line(&body, "xfcc=");
    assert!(
        xfcc.contains(&format!("URI={GATEWAY_ID}")),
        "httpbin's sidecar saw the gateway's identity over mTLS: {xfcc}"
    );

    // The header without the path prefix (segment-wise: /headersx is not
    // under /headers) falls to the split, which never sets the header.
    let (code, body) = http_request_with(&client.ns, gateway, HOST, "/headersx", &matched).unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(!body.to_ascii_lowercase().contains("x-via"), "{body}");

    // 90/10 between the two Services. With n = 200 and p = 0.1, v2's count
    // is 20 on average with a standard deviation of about 4.2: [4, 44]
    // holds with overwhelming probability, and a broken split (0, 50/50,
    // all v1) falls outside it.
    let (mut v1, mut v2) = (0u32, 0u32);
    for _ in 0..200 {
        let (code, body) = http_request(&client.ns, gateway, HOST, "/ip").unwrap();
        assert_eq!(code, 200, "{body}");
        match line(&body, "version=") {
            "v1" => v1 += 1,
            "v2" => v2 += 1,
            other => panic!("unexpected version {other:?}: {body}"),
        }
    }
    assert!(v1 > 0 && v2 > 0, "both versions served: v1={v1} v2={v2}");
    assert!((4..=44).contains(&v2), "about 10% to v2: v1={v1} v2={v2}");

    // A backend whose Service does not exist: Istio's 500 for its share.
    let (code, _) = http_request(&client.ns, gateway, HOST, "/missing").unwrap();
    assert_eq!(code, 500);
    // A host no route names: 404 from the gateway.
    let (code, _) = http_request(&client.ns, gateway, "unknown.example.com", "/").unwrap();
    assert_eq!(code, 404);

    // The file source has no status to write: /debug/configz shows it.
    let (_, configz) = mesh
        .hub
        .ns
        .run({
            let http = mesh.istiod.http;
            move || http_get(http, "/debug/configz")
        })
        .unwrap();
    let configz: Value = serde_json::from_str(&configz).unwrap();
    let route = configz["gatewayApiStatus"]["HTTPRoute/demo/httpbin"].to_string();
    assert!(
        route.contains("ResolvedRefs=False (BackendNotFound): backend(nonexistent.demo.svc.cluster.local) not found"),
        "{configz:#}"
    );
    assert!(route.contains("Accepted=True (Accepted)"), "{route}");

    attached_policies_are_enforced(&mesh, &client.ns, gateway);

    // The route goes: so do its virtual hosts (the listener stays, 404s).
    tests::write_atomically(&mesh.config_dir.join("gateway-api.yaml"), GATEWAY);
    wait_for("the route removed from the gateway", WAIT, || {
        matches!(http_request(&client.ns, gateway, HOST, "/ip"), Ok((404, _))).then_some(())
    });
    assert!(gw.agent.alive(), "{}", gw.agent.log());
}

/// The gateway's Service, as Istio's automated deployment makes it, with
/// the gateway Pod as its endpoint.
const GATEWAY_SERVICE: &str = r#"apiVersion: v1
kind: Service
metadata: {name: ingress-istio, namespace: istio-system}
spec:
  clusterIP: 198.19.0.20
  selector: {gateway.networking.k8s.io/gateway-name: ingress}
  ports: [{name: http, port: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ingress-istio-abc, namespace: istio-system, labels: {kubernetes.io/service-name: ingress-istio}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [198.18.0.21]
  conditions: {ready: true}
"#;

/// Polls until five requests in a row to `path` through the gateway answer
/// `code` with a body for which `ok` holds (a policy change reaches Envoy
/// as a listener update; connections accepted before finish under the old
/// one).
fn expect_through(
    what: &str,
    ns: &tests::netns::Netns,
    gateway: SocketAddr,
    headers: &[(&str, &str)],
    code: u16,
    ok: impl Fn(&str) -> bool,
) {
    let start = std::time::Instant::now();
    let mut streak = 0;
    loop {
        let got = http_request_with(ns, gateway, HOST, "/ip", headers);
        match &got {
            Ok((c, body)) if *c == code && ok(body) => {
                streak += 1;
                if streak == 5 {
                    return;
                }
                continue;
            }
            _ => streak = 0,
        }
        assert!(
            start.elapsed() < WAIT,
            "{what}: expected {code} five times in a row within {WAIT:?}, last got {got:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An ALLOW by `requestPrincipals` and its RequestAuthentication attached
/// to the Gateway by `targetRefs`, beside a DENY-everything attached to
/// another Gateway; then a DENY attached to the gateway's Service.
fn attached_policies_are_enforced(mesh: &LocalMesh, ns: &tests::netns::Netns, gateway: SocketAddr) {
    let served = |b: &str| !line(b, "version=").is_empty();
    let reply = |r: &'static str| move |b: &str| b.trim() == r;
    let issuer = "https://edge.example";
    let key = Signer::new("edge-key");
    let policies = mesh.config_dir.join("gateway-api-policy.yaml");
    let target = |name: &str| {
        format!("targetRefs: [{{group: gateway.networking.k8s.io, kind: Gateway, name: {name}}}]")
    };
    tests::write_atomically(
        &policies,
        &format!(
            r#"apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: edge-jwt, namespace: istio-system}}
spec:
  {ingress}
  jwtRules: [{{issuer: "{issuer}", jwks: '{keys}'}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: require-jwt, namespace: istio-system}}
spec:
  {ingress}
  rules: [{{from: [{{source: {{requestPrincipals: ["{issuer}/*"]}}}}]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: deny-other, namespace: istio-system}}
spec:
  {other}
  action: DENY
  rules: [{{}}]
"#,
            ingress = target("ingress"),
            other = target("other"),
            keys = jwks(&[&key])
        ),
    );
    let good = format!("Bearer {}", key.sign(&claims(issuer, "alice", json!({}))));
    let bad = format!(
        "Bearer {}",
        Signer::new("edge-key").sign(&claims(issuer, "alice", json!({})))
    );
    expect_through(
        "no token",
        ns,
        gateway,
        &[],
        403,
        reply("RBAC: access denied"),
    );
    expect_through(
        "a forged token",
        ns,
        gateway,
        &[("authorization", &bad)],
        401,
        reply("Jwt verification fails"),
    );
    expect_through(
        "a good token (the other Gateway's DENY does not reach this one)",
        ns,
        gateway,
        &[("authorization", &good)],
        200,
        served,
    );

    // A DENY attached to the gateway's Service.
    tests::write_atomically(
        &policies,
        &format!(
            r#"{GATEWAY_SERVICE}---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: deny-ip, namespace: istio-system}}
spec:
  targetRefs: [{{kind: Service, group: "", name: ingress-istio}}]
  action: DENY
  rules: [{{to: [{{operation: {{paths: [/ip]}}}}]}}]
"#
        ),
    );
    expect_through(
        "/ip denied by the Service's policy",
        ns,
        gateway,
        &[],
        403,
        reply("RBAC: access denied"),
    );
    let (code, body) = http_request_with(ns, gateway, HOST, "/headers", &[]).unwrap();
    assert_eq!(code, 200, "other paths pass: {body}");

    // The policies go: access as before.
    tests::write_atomically(&policies, "");
    expect_through("no policy", ns, gateway, &[], 200, served);
}

/// istiod against the API stand-in, with the Gateway API kinds.
struct Cluster {
    api: KubeApi,
    _istiod: Proc,
    _tmp: tempfile::TempDir,
}

fn start_cluster() -> Cluster {
    let api = KubeApi::start_local();
    for ns in ["istio-system", "demo", "other"] {
        api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .unwrap();
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().join("istiod");
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    api.kubeconfig(&kubeconfig);
    let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let port = || format!("127.0.0.1:{}", free_port());
    let mut cmd = Command::new(bin("istiod"));
    cmd.current_dir(&dir)
        .arg("discovery")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--meshConfig={}", dir.join("mesh").display()))
        .arg(format!("--httpAddr={http}"))
        .arg(format!("--grpcAddr={}", port()))
        .arg(format!("--secureGRPCAddr={}", port()))
        .arg(format!("--monitoringAddr={}", port()))
        .arg(format!("--httpsAddr={}", port()))
        .env("POD_NAMESPACE", "istio-system")
        .env("PILOT_DEBOUNCE_AFTER", "20ms");
    let mut istiod = Proc::spawn("istiod", cmd, &tmp.path().join("istiod.log"));
    wait_for("istiod /ready", WAIT, || {
        assert!(istiod.alive(), "istiod exited:\n{}", istiod.log());
        matches!(http_get(http, "/ready"), Ok((200, _))).then_some(())
    });
    Cluster {
        api,
        _istiod: istiod,
        _tmp: tmp,
    }
}

fn condition<'a>(conditions: &'a Value, r#type: &str) -> &'a Value {
    conditions
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == r#type))
        .unwrap_or(&Value::Null)
}

#[test]
fn istiod_writes_gateway_api_status_back_on_kubernetes() {
    let c = start_cluster();
    let yaml = |s: &str| -> Value { serde_yaml_ng::from_str(s).unwrap() };
    c.api
        .create(yaml(
            "apiVersion: v1\nkind: Service\nmetadata: {name: httpbin, namespace: demo}\nspec: {clusterIP: 198.19.0.10, selector: {app: httpbin}, ports: [{name: http, port: 8000}]}\n",
        ))
        .unwrap();
    // Istio's automated deployment's Service: Programmed=True.
    c.api
        .create(yaml(
            "apiVersion: v1\nkind: Service\nmetadata: {name: ingress-istio, namespace: istio-system}\nspec: {clusterIP: 198.19.0.20, selector: {gateway.networking.k8s.io/gateway-name: ingress}, ports: [{name: http, port: 8080}]}\n",
        ))
        .unwrap();
    c.api.create(yaml(GATEWAY)).unwrap();
    let good = yaml(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: good, namespace: demo}
spec:
  parentRefs: [{name: ingress, namespace: istio-system}]
  rules: [{backendRefs: [{name: httpbin, port: 8000}]}]
"#,
    );
    c.api.create(good).unwrap();
    let orphan = yaml(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: orphan, namespace: demo}
spec:
  parentRefs: [{name: nowhere}]
  rules: [{backendRefs: [{name: httpbin, port: 8000}]}]
"#,
    );
    c.api.create(orphan).unwrap();
    let status_of = |kind: &str, ns: &str, name: &str| -> Value {
        c.api
            .get("gateway.networking.k8s.io/v1", kind, ns, name)
            .map(|o| o["status"].clone())
            .unwrap_or(Value::Null)
    };

    let parent = wait_for("the good route's status", WAIT, || {
        let s = status_of("HTTPRoute", "demo", "good");
        let p = s["parents"].get(0)?.clone();
        (condition(&p["conditions"], "Accepted")["status"] == "True").then_some(p)
    });
    assert_eq!(parent["controllerName"], "istio.io/gateway-controller");
    assert_eq!(parent["parentRef"]["name"], "ingress");
    let resolved = condition(&parent["conditions"], "ResolvedRefs");
    assert_eq!(resolved["status"], "True", "{parent:#}");
    assert_eq!(
        condition(&parent["conditions"], "Accepted")["observedGeneration"],
        1
    );

    let orphan = wait_for("the orphan route's status", WAIT, || {
        status_of("HTTPRoute", "demo", "orphan")["parents"]
            .get(0)
            .cloned()
    });
    let accepted = condition(&orphan["conditions"], "Accepted");
    assert_eq!(accepted["status"], "False", "{orphan:#}");
    assert_eq!(accepted["reason"], "NoMatchingParent");

    let gw = wait_for("the Gateway's status", WAIT, || {
        let s = status_of("Gateway", "istio-system", "ingress");
        (s["listeners"][0]["attachedRoutes"] == 1).then_some(s)
    });
    assert_eq!(
        condition(&gw["conditions"], "Accepted")["status"],
        "True",
        "{gw:#}"
    );
    assert_eq!(
        condition(&gw["conditions"], "Programmed")["status"],
        "True",
        "{gw:#}"
    );

    // The Gateway stops admitting other namespaces' routes: the route is
    // refused with Istio's reason, its observed generation unchanged.
    let mut same = yaml(GATEWAY);
    same["spec"]["listeners"][0]["allowedRoutes"] = json!({"namespaces": {"from": "Same"}});
    c.api.update(same).unwrap();
    let refused = wait_for("the good route refused", WAIT, || {
        let s = status_of("HTTPRoute", "demo", "good");
        let p = s["parents"].get(0)?.clone();
        (condition(&p["conditions"], "Accepted")["status"] == "False").then_some(p)
    });
    assert_eq!(
        condition(&refused["conditions"], "Accepted")["reason"],
        "NotAllowedByListeners",
        "{refused:#}"
    );
}
