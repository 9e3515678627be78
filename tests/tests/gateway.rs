//! An ingress gateway: `pilot-agent proxy router` with a real Envoy, in a
//! network namespace of its own without iptables capture (as Istio's
//! gateways run), configured by istiod from an Istio `Gateway` and the
//! VirtualService bound to it. A client outside the mesh reaches httpbin
//! through it; inside the mesh the gateway speaks mTLS with its own SPIFFE
//! identity; the sidecars' routing is untouched by a VirtualService bound
//! only to the gateway; removing the Gateway removes its listener.
//!
//! Request-level policy that selects the gateway Pod is enforced there:
//! a DENY by `remoteIpBlocks` (the client address `X-Forwarded-For` gives
//! behind the gateway's `gatewayTopology.numTrustedProxies`) and by
//! `ipBlocks` (the connection's peer), an ALLOW by `requestPrincipals`
//! with a RequestAuthentication; deleting them restores access.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use tests::gateway_pod::GatewaySpec;
use tests::jwt::{Signer, claims, jwks};
use tests::mesh::{LocalMesh, http_request, http_request_with};
use tests::netns::Netns;
use tests::wait_for;

const WAIT: Duration = Duration::from_secs(60);

/// The gateway Pod's address on the hub.
const GATEWAY_IP: &str = "198.18.0.20";
/// A client outside the mesh.
const CLIENT_IP: &str = "198.18.0.30";
/// A second client outside the mesh.
const OTHER_CLIENT_IP: &str = "198.18.0.31";
/// RBAC's reply to a denied request.
const DENIED: &str = "RBAC: access denied";
/// Envoy's JWT filter's reply to a token it refuses.
const BAD_TOKEN: &str = "Jwt verification fails";
/// The gateway's identity.
const GATEWAY_ID: &str = "spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway";
const HTTPBIN_HOST: &str = "httpbin.demo.svc.cluster.local";

const GATEWAY: &str = r#"apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["*"]
"#;

/// Bound to the gateway only: everything to httpbin v2, marked.
const GATEWAY_ROUTES: &str = r#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: httpbin-ingress, namespace: demo}
spec:
  hosts: [httpbin.demo.svc.cluster.local]
  gateways: [istio-system/ingress]
  http:
  - name: ingress
    match:
    - uri: {prefix: /}
    headers:
      request:
        set: {x-via: ingress}
    route:
    - destination:
        host: httpbin.demo.svc.cluster.local
        subset: v2
        port: {number: 8000}
"#;

fn line<'a>(body: &'a str, key: &str) -> &'a str {
    body.lines().find_map(|l| l.strip_prefix(key)).unwrap_or("")
}

#[test]
fn an_ingress_gateway_routes_outside_clients_into_the_mesh_over_mtls() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);

    // The sample's 90/10 VirtualService goes, so that the sidecars route
    // httpbin by default (both versions): a gateway-only VirtualService
    // applied to them by mistake would show (v2 only, marked).
    let istio_yaml = mesh.config_dir.join("istio.yaml");
    let text = std::fs::read_to_string(&istio_yaml).unwrap();
    let kept: Vec<&str> = text
        .split("\n---\n")
        .filter(|doc| !doc.contains("kind: VirtualService"))
        .collect();
    tests::write_atomically(&istio_yaml, &kept.join("\n---\n"));
    let gateway_file = mesh.config_dir.join("gateway.yaml");
    tests::write_atomically(&gateway_file, &format!("{GATEWAY}---\n{GATEWAY_ROUTES}"));

    // The gateway Pod: no iptables, the agent as `proxy router`.
    let mut gw = mesh.start_gateway(&GatewaySpec::ingress(GATEWAY_IP));

    let client = mesh.plain_pod(CLIENT_IP);
    let gateway: SocketAddr = format!("{GATEWAY_IP}:8080").parse().unwrap();
    let body = wait_for("httpbin through the gateway", WAIT, || {
        gw.assert_alive();
        match http_request(&client.ns, gateway, HTTPBIN_HOST, "/headers") {
            Ok((200, body)) => Some(body),
            _ => None,
        }
    });
    assert_eq!(line(&body, "version="), "v2", "{body}");
    assert!(
        body.lines()
            .any(|l| l.eq_ignore_ascii_case("header=x-via: ingress")),
        "the gateway's route set the header: {body}"
    );
    let xfcc = line(&body, "xfcc=");
    assert!(
        xfcc.contains(&format!("URI={GATEWAY_ID}")),
        "httpbin's sidecar saw the gateway's identity over mTLS: {xfcc}"
    );

    // A host no VirtualService binds: Istio's 404 from the gateway.
    let (code, _) = http_request(&client.ns, gateway, "unknown.example.com", "/").unwrap();
    assert_eq!(code, 404);

    // The sidecars: default routing to both versions, nothing marked.
    let mut versions = std::collections::BTreeSet::new();
    for _ in 0..30 {
        let (code, body) = mesh.call_httpbin().unwrap();
        assert_eq!(code, 200, "{body}");
        assert!(
            !body.to_ascii_lowercase().contains("x-via"),
            "the gateway's VirtualService reached a sidecar: {body}"
        );
        versions.insert(line(&body, "version=").to_string());
    }
    assert_eq!(
        versions.into_iter().collect::<Vec<_>>(),
        ["v1", "v2"],
        "sleep reaches both versions, as without any VirtualService"
    );

    // The Gateway goes (its VirtualService stays): its listener goes with it.
    tests::write_atomically(&gateway_file, GATEWAY_ROUTES);
    wait_for("the gateway's port closed", WAIT, || {
        match http_request(&client.ns, gateway, HTTPBIN_HOST, "/headers") {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(()),
            _ => None,
        }
    });
    gw.assert_alive();
}

/// Calls in a row that must agree before a verdict counts: a policy change
/// reaches the gateway's Envoy as a listener update, and connections
/// accepted under the old listener finish with its filters.
const STREAK: usize = 5;

/// Polls until [`STREAK`] requests in a row from `ns` through the gateway
/// answer `code` with a body for which `body_ok` holds.
fn expect_at_gateway(
    what: &str,
    ns: &Netns,
    headers: &[(&str, &str)],
    code: u16,
    body_ok: impl Fn(&str) -> bool,
) {
    let gateway: SocketAddr = format!("{GATEWAY_IP}:8080").parse().unwrap();
    let start = std::time::Instant::now();
    let mut streak = 0;
    loop {
        let got = http_request_with(ns, gateway, HTTPBIN_HOST, "/headers", headers);
        match &got {
            Ok((c, body)) if *c == code && body_ok(body) => {
                streak += 1;
                if streak == STREAK {
                    return;
                }
                continue;
            }
            _ => streak = 0,
        }
        assert!(
            start.elapsed() < WAIT,
            "{what}: expected {code} {STREAK} times in a row within {WAIT:?}, last got {got:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn is_httpbin(body: &str) -> bool {
    line(body, "version=") == "v2"
}

fn is_reply(reply: &'static str) -> impl Fn(&str) -> bool {
    move |body| body.trim() == reply
}

#[test]
fn policies_selecting_the_ingress_gateway_are_enforced_at_it() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    let gateway_file = mesh.config_dir.join("gateway.yaml");
    tests::write_atomically(&gateway_file, &format!("{GATEWAY}---\n{GATEWAY_ROUTES}"));
    // One trusted proxy in front: the client address is the one before the
    // last in X-Forwarded-For (Envoy appends the peer's).
    let mut gw = mesh.start_gateway_with(
        &GatewaySpec::ingress(GATEWAY_IP),
        r#""gatewayTopology": {"numTrustedProxies": 1}"#,
    );
    let a = mesh.plain_pod(CLIENT_IP);
    let b = mesh.plain_pod(OTHER_CLIENT_IP);
    let from = |ip: &'static str| [("x-forwarded-for", ip)];
    expect_at_gateway("a, before any policy", &a.ns, &[], 200, is_httpbin);
    gw.assert_alive();

    // DENY by remoteIpBlocks: the client address behind the trusted proxy.
    let policy_file = mesh.config_dir.join("gateway-policy.yaml");
    let deny_remote = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-listed, namespace: istio-system}
spec:
  selector: {matchLabels: {istio: ingressgateway}}
  action: DENY
  rules:
  - from: [{source: {remoteIpBlocks: ["203.0.113.7/32"]}}]
"#;
    tests::write_atomically(&policy_file, deny_remote);
    expect_at_gateway(
        "b, forwarded for the listed client",
        &b.ns,
        &from("203.0.113.7"),
        403,
        is_reply(DENIED),
    );
    expect_at_gateway(
        "a, forwarded for another client",
        &a.ns,
        &from("203.0.113.8"),
        200,
        is_httpbin,
    );

    // DENY by ipBlocks: the connection's peer, whatever the header says.
    tests::write_atomically(
        &policy_file,
        &deny_remote.replace(
            "remoteIpBlocks: [\"203.0.113.7/32\"]",
            &format!("ipBlocks: [\"{OTHER_CLIENT_IP}\"]"),
        ),
    );
    expect_at_gateway(
        "b's connection",
        &b.ns,
        &from("203.0.113.8"),
        403,
        is_reply(DENIED),
    );
    expect_at_gateway(
        "a's connection",
        &a.ns,
        &from("203.0.113.7"),
        200,
        is_httpbin,
    );

    // ALLOW by requestPrincipals with a RequestAuthentication on the gateway.
    let issuer = "https://edge.example";
    let key = Signer::new("edge-key");
    let stranger = Signer::new("stranger");
    tests::write_atomically(
        &policy_file,
        &format!(
            r#"apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: edge-jwt, namespace: istio-system}}
spec:
  selector: {{matchLabels: {{istio: ingressgateway}}}}
  jwtRules:
  - issuer: {issuer}
    jwks: '{keys}'
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: require-jwt, namespace: istio-system}}
spec:
  selector: {{matchLabels: {{istio: ingressgateway}}}}
  rules:
  - from: [{{source: {{requestPrincipals: ["{issuer}/*"]}}}}]
"#,
            keys = jwks(&[&key])
        ),
    );
    let good = format!("Bearer {}", key.sign(&claims(issuer, "alice", json!({}))));
    let bad = format!(
        "Bearer {}",
        stranger.sign_as("edge-key", &claims(issuer, "alice", json!({})))
    );
    expect_at_gateway("no token", &a.ns, &[], 403, is_reply(DENIED));
    expect_at_gateway(
        "a forged token",
        &a.ns,
        &[("authorization", &bad)],
        401,
        is_reply(BAD_TOKEN),
    );
    expect_at_gateway(
        "a good token",
        &a.ns,
        &[("authorization", &good)],
        200,
        is_httpbin,
    );

    // The policies go: access as before.
    tests::write_atomically(&policy_file, "");
    expect_at_gateway("no token, no policy", &a.ns, &[], 200, is_httpbin);
    expect_at_gateway("b, no policy", &b.ns, &[], 200, is_httpbin);
    gw.assert_alive();
}
