//! RequestAuthentication with real Envoys: tokens signed by the test, keys
//! served over HTTP from the hub (where istiod fetches them) or inline, and
//! AuthorizationPolicies that require request principals and claims. What
//! sleep's app sees calling `http://httpbin:8000/` is the verdict: Envoy's
//! 401 for a token it refuses, RBAC's 403 for a request the policy does not
//! admit, and what reached httpbin's app (its `header=` lines).

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use serde_json::json;
use tests::jwt::{Signer, claims, jwks, now};
use tests::mesh::LocalMesh;

const URL: &str = "http://httpbin:8000/headers";
const DENIED: &str = "RBAC: access denied";
/// Envoy's JWT filter, in the config of a Pod a RequestAuthentication applies to.
const JWT_FILTER_NAME: &str = "envoy.filters.http.jwt_authn";
/// How long a policy edit, or a change of keys, may take to reach Envoy.
const CONVERGE: Duration = Duration::from_secs(30);

/// A JWKS endpoint in the hub's namespace (where istiod runs) on
/// `127.0.0.1`, answering every GET with the current (status, body);
/// stopped on drop.
struct JwksServer {
    uri: String,
    answer: Arc<Mutex<(u16, String)>>,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl JwksServer {
    fn start(mesh: &LocalMesh, status: u16, body: &str) -> JwksServer {
        let listener = mesh
            .hub
            .ns
            .run(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
        listener.set_nonblocking(true).unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let answer = Arc::new(Mutex::new((status, body.to_string())));
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, h, s) = (answer.clone(), hits.clone(), stop.clone());
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            while !s.load(Ordering::SeqCst) {
                let Ok((mut c, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let _ = c.set_nonblocking(false);
                let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                let mut req = Vec::new();
                let mut chunk = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&chunk[..n]),
                    }
                }
                h.fetch_add(1, Ordering::SeqCst);
                let (code, body) = a.lock().unwrap().clone();
                let _ = write!(
                    c,
                    "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        JwksServer {
            uri: format!("http://{addr}/jwks"),
            answer,
            hits,
            stop,
        }
    }

    fn serve(&self, status: u16, body: &str) {
        *self.answer.lock().unwrap() = (status, body.to_string());
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Writes `file` into istiod's config directory in one rename.
fn apply(mesh: &LocalMesh, file: &str, yaml: &str) {
    let tmp = mesh.config_dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, yaml).unwrap();
    std::fs::rename(&tmp, mesh.config_dir.join(file)).unwrap();
}

/// The listeners Envoy of Pod `pod` serves new connections with (its config
/// dump without listeners still draining connections of the config before).
fn config_dump(mesh: &LocalMesh, pod: &str) -> String {
    mesh.pod(pod).ns.run(|| {
        tests::http_get(
            SocketAddr::from(([127, 0, 0, 1], 15000)),
            "/config_dump?resource=dynamic_listeners&mask=active_state",
        )
        .map(|(_, body)| body)
        .unwrap_or_default()
    })
}

/// Waits until both httpbin Envoys hold config containing every one of
/// `present` and none of `absent`.
fn wait_for_config(mesh: &LocalMesh, present: &[&str], absent: &[&str]) {
    for pod in ["httpbin-v1", "httpbin-v2"] {
        let what = format!("{pod}'s Envoy to hold {present:?} and not {absent:?}");
        tests::wait_for(&what, CONVERGE, || {
            let dump = config_dump(mesh, pod);
            let ok = present.iter().all(|n| dump.contains(n))
                && !absent.iter().any(|n| dump.contains(n));
            ok.then_some(())
        });
    }
}

/// sleep's app calls httpbin with extra curl arguments: (status, body).
fn call(mesh: &LocalMesh, args: &[&str], url: &str) -> (u16, String) {
    mesh.app_curl_with("sleep-1", args, url)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn bearer(token: &str) -> String {
    format!("authorization: Bearer {token}")
}

/// What the backend received: its `header=<name>: <value>` line for `name`.
fn received_header(body: &str, name: &str) -> Option<String> {
    body.lines().find_map(|l| {
        let (k, v) = l.strip_prefix("header=")?.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
    })
}

/// Calls in a row that must agree before a verdict counts: a policy or key
/// change reaches Envoy as a listener update, and the connection sleep's
/// Envoy already holds to each httpbin Pod serves one more request with the
/// config it was accepted under before it is drained.
const STREAK: usize = 5;

/// Polls until [`STREAK`] calls in a row answer `code` with a body for
/// which `body_ok` holds; returns the last body.
fn expect(
    mesh: &LocalMesh,
    what: &str,
    args: &[&str],
    url: &str,
    code: u16,
    body_ok: impl Fn(&str) -> bool,
) -> String {
    let start = std::time::Instant::now();
    let mut streak = 0;
    loop {
        let (c, body) = call(mesh, args, url);
        if c == code && body_ok(&body) {
            streak += 1;
            if streak == STREAK {
                return body;
            }
            continue;
        }
        streak = 0;
        let mismatch = (c, body);
        assert!(
            start.elapsed() < CONVERGE,
            "{what}: expected {code} {STREAK} times in a row within {CONVERGE:?}, last got {} {}",
            mismatch.0,
            mismatch.1
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// [`expect`] of an exact body (Envoy's and RBAC's local replies).
fn expect_reply(mesh: &LocalMesh, what: &str, args: &[&str], code: u16, body: &str) {
    expect(mesh, what, args, URL, code, |b| b.trim() == body);
}

const ISS_A: &str = "https://a.example";
const ISS_B: &str = "https://b.example";
const ISS_C: &str = "https://c.example";
const ISS_D: &str = "https://d.example";
const AUD: &str = "httpbin-api";

/// Three issuers on httpbin's policy: `a` with keys fetched by istiod from
/// a JWKS URI, an audience, the token removed before the backend and
/// claims copied to headers; `b` with inline keys read from a header with a
/// prefix or a query parameter; `c` inline, the token forwarded; and `d`
/// from a mesh-wide policy in the root namespace. An AuthorizationPolicy
/// admits alice of `a`, anyone of `a` in group `admins`, anyone of `b`,
/// `c` or `d`.
#[test]
fn tokens_are_validated_and_policies_match_principals_claims_and_headers() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    let (a, b, c) = (
        Signer::new("key-a"),
        Signer::new("key-b"),
        Signer::new("key-c"),
    );
    let d = Signer::new("key-d");
    let stranger = Signer::new("key-x");
    let server = JwksServer::start(&mesh, 200, &jwks(&[&a]));

    // Before any policy: tokens are nobody's business.
    let (code, body) = call(&mesh, &[], URL);
    assert_eq!(code, 200, "{body}");

    apply(
        &mesh,
        "jwt.yaml",
        &format!(
            r#"apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: jwt, namespace: demo}}
spec:
  selector: {{matchLabels: {{app: httpbin}}}}
  jwtRules:
  - issuer: {ISS_A}
    jwksUri: {uri}
    audiences: [{AUD}]
    outputClaimToHeaders: [{{header: x-jwt-sub, claim: sub}}]
    outputPayloadToHeader: x-jwt-payload
  - issuer: {ISS_B}
    jwks: '{jwks_b}'
    fromHeaders: [{{name: x-jwt-assertion, prefix: "Token "}}]
    fromParams: [tok]
  - issuer: {ISS_C}
    jwks: '{jwks_c}'
    forwardOriginalToken: true
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: mesh-wide, namespace: istio-system}}
spec:
  jwtRules:
  - issuer: {ISS_D}
    jwks: '{jwks_d}'
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: require-jwt, namespace: demo}}
spec:
  selector: {{matchLabels: {{app: httpbin}}}}
  action: ALLOW
  rules:
  - from: [{{source: {{requestPrincipals: ["{ISS_A}/alice"]}}}}]
  - from: [{{source: {{requestPrincipals: ["{ISS_A}/*"]}}}}]
    when: [{{key: "request.auth.claims[groups]", values: [admins]}}]
  - from: [{{source: {{requestPrincipals: ["{ISS_B}/*", "{ISS_C}/*", "{ISS_D}/*"]}}}}]
"#,
            uri = server.uri,
            jwks_b = jwks(&[&b]),
            jwks_c = jwks(&[&c]),
            jwks_d = jwks(&[&d]),
        ),
    );
    // The fetched key (not the placeholder) and the policy are in place.
    wait_for_config(&mesh, &["key-a", "key-b", "key-c", "key-d", "admins"], &[]);
    assert!(server.hits() >= 1, "istiod fetched {}", server.uri);

    // No token: authentication passes, the policy refuses.
    expect_reply(&mesh, "no token: 403", &[], 403, DENIED);

    // A valid token from the fetched keys.
    let alice = a.sign(&claims(ISS_A, "alice", json!({"aud": AUD})));
    let body = expect(
        &mesh,
        "alice: 200",
        &["-H", &bearer(&alice)],
        URL,
        200,
        |_| true,
    );
    assert_eq!(
        received_header(&body, "x-jwt-sub").as_deref(),
        Some("alice"),
        "outputClaimToHeaders reached the backend: {body}"
    );
    let payload = received_header(&body, "x-jwt-payload").unwrap_or_default();
    let payload = base64::Engine::decode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        payload.trim_end_matches('='),
    )
    .unwrap_or_else(|e| panic!("x-jwt-payload is base64url ({e}): {body}"));
    let payload: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(payload["sub"], "alice", "outputPayloadToHeader: {payload}");
    assert_eq!(
        received_header(&body, "authorization"),
        None,
        "forwardOriginalToken unset: the backend does not see the token: {body}"
    );
    // The same token as the `access_token` query parameter (Envoy's default).
    expect(
        &mesh,
        "alice in access_token: 200",
        &[],
        &format!("{URL}?access_token={alice}"),
        200,
        |_| true,
    );

    // Tokens Envoy refuses, with its reasons.
    let forged = stranger.sign_as("key-a", &claims(ISS_A, "alice", json!({"aud": AUD})));
    let args = ["-H".to_string(), bearer(&forged)];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    expect_reply(
        &mesh,
        "bad signature: 401",
        &args,
        401,
        "Jwt verification fails",
    );
    let mut old = claims(ISS_A, "alice", json!({"aud": AUD}));
    old["iat"] = json!(now() - 7200);
    old["exp"] = json!(now() - 3600);
    let expired = a.sign(&old);
    expect_reply(
        &mesh,
        "expired: 401",
        &["-H", &bearer(&expired)],
        401,
        "Jwt is expired",
    );
    // Envoy answers a token for another audience with 403 and its reason
    // (not RBAC's body).
    let wrong_aud = a.sign(&claims(ISS_A, "alice", json!({"aud": "someone-else"})));
    expect_reply(
        &mesh,
        "wrong audience: 403 from jwt_authn",
        &["-H", &bearer(&wrong_aud)],
        403,
        "Audiences in Jwt are not allowed",
    );
    let unknown_iss = stranger.sign(&claims("https://x.example", "alice", json!({"aud": AUD})));
    expect_reply(
        &mesh,
        "unknown issuer: 401",
        &["-H", &bearer(&unknown_iss)],
        401,
        "Jwt issuer is not configured",
    );

    // request.auth.claims[groups], an array claim.
    let admin = a.sign(&claims(
        ISS_A,
        "bob",
        json!({"aud": AUD, "groups": ["users", "admins"]}),
    ));
    let user = a.sign(&claims(
        ISS_A,
        "bob",
        json!({"aud": AUD, "groups": ["users"]}),
    ));
    let body = expect(
        &mesh,
        "bob in admins: 200",
        &["-H", &bearer(&admin)],
        URL,
        200,
        |_| true,
    );
    assert_eq!(
        received_header(&body, "x-jwt-sub").as_deref(),
        Some("bob"),
        "{body}"
    );
    expect_reply(
        &mesh,
        "bob in users only: 403",
        &["-H", &bearer(&user)],
        403,
        DENIED,
    );

    // Issuer b: inline keys, a header with a prefix, a query parameter.
    let carol = b.sign(&claims(ISS_B, "carol", json!({})));
    let header = format!("x-jwt-assertion: Token {carol}");
    let body = expect(
        &mesh,
        "b in x-jwt-assertion: 200",
        &["-H", &header],
        URL,
        200,
        |_| true,
    );
    assert_eq!(
        received_header(&body, "x-jwt-assertion"),
        None,
        "the token's header is removed (forwardOriginalToken unset): {body}"
    );
    // Without the prefix the header holds no token: a request without one.
    let bare = format!("x-jwt-assertion: {carol}");
    expect_reply(
        &mesh,
        "b without the prefix: 403",
        &["-H", &bare],
        403,
        DENIED,
    );
    expect(
        &mesh,
        "b in ?tok: 200",
        &[],
        &format!("{URL}?tok={carol}"),
        200,
        |_| true,
    );
    let forged_b = stranger.sign_as("key-b", &claims(ISS_B, "carol", json!({})));
    expect(
        &mesh,
        "b forged in ?tok: 401",
        &[],
        &format!("{URL}?tok={forged_b}"),
        401,
        |b| b.trim() == "Jwt verification fails",
    );
    // b's token where only a's and c's are read (Authorization) is refused.
    expect_reply(
        &mesh,
        "b in Authorization: 401",
        &["-H", &bearer(&carol)],
        401,
        "Jwt issuer is not configured",
    );

    // Issuer c: forwardOriginalToken keeps Authorization for the backend.
    let dave = c.sign(&claims(ISS_C, "dave", json!({})));
    let body = expect(&mesh, "c: 200", &["-H", &bearer(&dave)], URL, 200, |_| true);
    assert_eq!(
        received_header(&body, "authorization"),
        Some(format!("Bearer {dave}")),
        "forwardOriginalToken: true: {body}"
    );
    assert_eq!(
        received_header(&body, "x-jwt-sub"),
        None,
        "a's claim header only for a's tokens: {body}"
    );

    // Issuer d, from the root namespace's policy: it applies mesh-wide,
    // merged with the workload's.
    let erin = d.sign(&claims(ISS_D, "erin", json!({})));
    expect(
        &mesh,
        "d (root namespace): 200",
        &["-H", &bearer(&erin)],
        URL,
        200,
        |_| true,
    );
    let forged_d = stranger.sign_as("key-d", &claims(ISS_D, "erin", json!({})));
    expect_reply(
        &mesh,
        "d forged: 401",
        &["-H", &bearer(&forged_d)],
        401,
        "Jwt verification fails",
    );

    // Removing the policies: a bad token is nobody's business again.
    std::fs::remove_file(mesh.config_dir.join("jwt.yaml")).unwrap();
    wait_for_config(&mesh, &[], &[JWT_FILTER_NAME]);
    expect(&mesh, "no policy: forged passes", &args, URL, 200, |_| true);
}

/// An AuthorizationPolicy admitting any request with a validated token.
const POLICY: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: require-jwt, namespace: demo}
spec:
  selector: {matchLabels: {app: httpbin}}
  rules:
  - from: [{source: {requestPrincipals: ["*"]}}]
"#;

/// Keys that istiod cannot fetch leave tokens refused (401, never let
/// through); keys fetched later, rotated, or briefly unavailable reach
/// Envoy with `PILOT_JWT_PUB_KEY_REFRESH_INTERVAL`.
#[test]
fn jwks_uri_keys_are_fetched_refreshed_and_rotated() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mut mesh = LocalMesh::start(tmp.path(), &[]);
    mesh.istiod
        .set_env("PILOT_JWT_PUB_KEY_REFRESH_INTERVAL", "1s");
    mesh.istiod.restart();
    let (old_key, new_key) = (Signer::new("key-old"), Signer::new("key-new"));
    let server = JwksServer::start(&mesh, 503, "not yet");
    const ISS: &str = "https://rotating.example";
    apply(
        &mesh,
        "jwt.yaml",
        &format!(
            r#"apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: jwt, namespace: demo}}
spec:
  jwtRules:
  - issuer: {ISS}
    jwksUri: {uri}
---
{POLICY}"#,
            uri = server.uri
        ),
    );
    let old_token = old_key.sign(&claims(ISS, "erin", json!({})));
    let new_token = new_key.sign(&claims(ISS, "erin", json!({})));
    let (old_h, new_h) = (bearer(&old_token), bearer(&new_token));
    const NO_KEY: &str = "Jwks doesn't have key to match kid or alg from Jwt";

    // Not fetched yet: the placeholder key refuses every token.
    wait_for_config(&mesh, &["istiod-jwks-not-fetched"], &[]);
    expect_reply(&mesh, "not fetched: 401", &["-H", &old_h], 401, NO_KEY);
    expect_reply(&mesh, "not fetched, no token: 403", &[], 403, DENIED);

    // The server comes up: the old key arrives.
    server.serve(200, &jwks(&[&old_key]));
    wait_for_config(&mesh, &["key-old"], &["istiod-jwks-not-fetched"]);
    expect(
        &mesh,
        "old key fetched: 200",
        &["-H", &old_h],
        URL,
        200,
        |_| true,
    );
    expect_reply(
        &mesh,
        "new key unknown yet: 401",
        &["-H", &new_h],
        401,
        NO_KEY,
    );

    // Rotation: only the new key is published.
    server.serve(200, &jwks(&[&new_key]));
    wait_for_config(&mesh, &["key-new"], &["key-old"]);
    expect(
        &mesh,
        "new key after refresh: 200",
        &["-H", &new_h],
        URL,
        200,
        |_| true,
    );
    expect_reply(&mesh, "old key retired: 401", &["-H", &old_h], 401, NO_KEY);

    // The server fails: refreshes fail and the last keys stay.
    server.serve(500, "down");
    let hits = server.hits();
    tests::wait_for("istiod to retry the failing JWKS", CONVERGE, || {
        (server.hits() >= hits + 2).then_some(())
    });
    expect(
        &mesh,
        "keys kept while the JWKS fails: 200",
        &["-H", &new_h],
        URL,
        200,
        |_| true,
    );
    let log = mesh.istiod.proc.log();
    assert!(
        log.contains("Failed to refresh JWT public key") || log.contains("Failed to GET"),
        "istiod logs the failing fetch:\n{log}"
    );

    // A JWKS URI that never answers (istiod's fetch times out, retried on
    // every refresh) must not hold up the first fetch of another issuer's.
    let black_hole = mesh
        .hub
        .ns
        .run(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let slow_uri = format!("http://{}/jwks", black_hole.local_addr().unwrap());
    let late_key = Signer::new("key-late");
    let late_server = JwksServer::start(&mesh, 200, &jwks(&[&late_key]));
    let rules = |extra: &str| {
        format!(
            r#"apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: jwt, namespace: demo}}
spec:
  jwtRules:
  - issuer: {ISS}
    jwksUri: {uri}
  - issuer: https://slow.example
    jwksUri: {slow_uri}
{extra}---
{POLICY}"#,
            uri = server.uri
        )
    };
    apply(&mesh, "jwt.yaml", &rules(""));
    tests::wait_for("the slow JWKS's first fetch to fail", CONVERGE, || {
        let log = mesh.istiod.proc.log();
        log.contains(r#"Failed to refresh JWT public key of issuer "https://slow.example""#)
            .then_some(())
    });
    let late_rule = format!(
        "  - issuer: https://late.example\n    jwksUri: {}\n",
        late_server.uri
    );
    apply(&mesh, "jwt.yaml", &rules(&late_rule));
    let late_token = late_key.sign(&claims("https://late.example", "frank", json!({})));
    expect(
        &mesh,
        "late issuer's keys fetched while another JWKS hangs: 200",
        &["-H", &bearer(&late_token)],
        URL,
        200,
        |_| true,
    );
    drop(black_hole);
}
