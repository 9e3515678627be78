//! Admission in the Kubernetes API server stand-in, as a client and a
//! webhook see it: a small HTTPS webhook in the test (its certificate
//! issued by a test CA, given to the configurations as `caBundle`) patches,
//! denies, warns and hangs, and the tests read the API's answers, the
//! stored objects and the reviews the webhook received.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use tests::kube_api::{KubeApi, WebhookOutcome};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where every webhook service of these tests lives.
const SVC_NS: &str = "test-system";
const SVC_NAME: &str = "webhook";

/// A CA and a serving certificate it issued for the webhook's service name
/// and 127.0.0.1.
struct Pki {
    ca_pem: String,
    cert_der: Vec<u8>,
    key_der: Vec<u8>,
}

fn pki() -> Pki {
    pki_named("webhook test CA")
}

fn pki_named(ca_name: &str) -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, ca_name);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec![
        format!("{SVC_NAME}.{SVC_NS}.svc"),
        "127.0.0.1".to_string(),
    ])
    .unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    Pki {
        ca_pem: ca_cert.pem(),
        cert_der: cert.der().to_vec(),
        key_der: key.serialize_der(),
    }
}

fn ca_bundle(pem: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(pem)
}

/// The reviews a webhook received: (path, AdmissionReview).
type Reviews = Arc<Mutex<Vec<(String, Value)>>>;

struct Webhook {
    addr: SocketAddr,
    reviews: Reviews,
}

impl Webhook {
    fn reviews(&self, path: &str) -> Vec<Value> {
        self.reviews
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, r)| r.clone())
            .collect()
    }
}

/// Serves the webhook on 127.0.0.1 until the test's runtime ends.
async fn start_webhook(pki: &Pki) -> Webhook {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(pki.cert_der.clone())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pki.key_der.clone())),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let reviews: Reviews = Arc::default();
    let seen = reviews.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req| serve(req, seen.clone()));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    Webhook { addr, reviews }
}

fn labels_of(obj: &Value) -> serde_json::Map<String, Value> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// The JSON patch of `/patch`: every RFC 6902 operation, and a key that
/// needs JSON Pointer escaping.
fn injection_patch(obj: &Value) -> Value {
    let labels = labels_of(obj);
    let mut ops = Vec::new();
    if obj.pointer("/metadata/labels").is_none() {
        ops.push(json!({"op": "add", "path": "/metadata/labels", "value": {}}));
    }
    ops.push(json!({"op": "add", "path": "/metadata/labels/injected", "value": "true"}));
    if obj.pointer("/metadata/annotations").is_none() {
        ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
    }
    ops.push(
        json!({"op": "add", "path": "/metadata/annotations/example.com~1patched", "value": "yes"}),
    );
    ops.push(json!({"op": "copy", "from": "/metadata/labels/injected", "path": "/metadata/labels/copied"}));
    ops.push(
        json!({"op": "move", "from": "/metadata/labels/copied", "path": "/metadata/labels/moved"}),
    );
    ops.push(json!({"op": "replace", "path": "/metadata/labels/injected", "value": "yes"}));
    ops.push(json!({"op": "test", "path": "/metadata/labels/injected", "value": "yes"}));
    if labels.contains_key("drop-me") {
        ops.push(json!({"op": "remove", "path": "/metadata/labels/drop-me"}));
    }
    Value::Array(ops)
}

/// The webhook: what it answers depends on the path.
async fn serve(
    req: hyper::Request<Incoming>,
    seen: Reviews,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    seen.lock().unwrap().push((path.clone(), review.clone()));
    let uid = review
        .pointer("/request/uid")
        .cloned()
        .unwrap_or(Value::Null);
    let object = match review.pointer("/request/object") {
        Some(o) if !o.is_null() => o.clone(),
        _ => review
            .pointer("/request/oldObject")
            .cloned()
            .unwrap_or(Value::Null),
    };
    let b64 = |v: &Value| base64::engine::general_purpose::STANDARD.encode(v.to_string());
    let response = match path.as_str() {
        "/patch" => json!({"uid": uid, "allowed": true, "patchType": "JSONPatch",
                           "patch": b64(&injection_patch(&object))}),
        "/bad-patch" => json!({"uid": uid, "allowed": true, "patchType": "JSONPatch",
                               "patch": b64(&json!([{"op": "test", "path": "/kind", "value": "Nope"}]))}),
        "/deny" if labels_of(&object).get("deny") == Some(&json!("true")) => json!({
            "uid": uid, "allowed": false,
            "status": {"code": 403, "reason": "Forbidden", "message": "label deny is set"}}),
        "/deny-silently" => json!({"uid": uid, "allowed": false}),
        "/warn" => json!({"uid": uid, "allowed": true,
                          "warnings": ["first warning", "second \"quoted\""]}),
        "/hang" => std::future::pending().await,
        "/bad-uid" => json!({"uid": "not-the-request-uid", "allowed": true}),
        _ => json!({"uid": uid, "allowed": true}),
    };
    let answer = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                        "response": response});
    let mut r = hyper::Response::new(Full::new(Bytes::from(answer.to_string())));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(r)
}

/// An answer of the API server.
#[derive(Debug)]
struct Reply {
    code: u16,
    warnings: Vec<String>,
    body: Value,
}

/// One HTTP/1.1 request to the stand-in, on a connection of its own.
async fn call(api: &KubeApi, method: &str, path: &str, ct: &str, body: Option<&Value>) -> Reply {
    let body = body.map(Value::to_string).unwrap_or_default();
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(api.addr()).await.unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: {ct}\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n",
            api.addr(),
            body.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(body.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        raw
    };
    let raw = tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .expect("the API server answers within 30 s");
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let code = lines.next().unwrap().split_whitespace().nth(1).unwrap();
    let warnings = lines
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| k.eq_ignore_ascii_case("warning"))
        .map(|(_, v)| v.trim().to_string())
        .collect();
    Reply {
        code: code.parse().unwrap(),
        warnings,
        body: serde_json::from_str(body).unwrap_or(Value::Null),
    }
}

async fn post(api: &KubeApi, path: &str, obj: &Value) -> Reply {
    call(api, "POST", path, "application/json", Some(obj)).await
}

fn namespace(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

fn pod(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
           "spec": {"containers": [{"name": "app", "image": "app:1"}]}})
}

fn config_map(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels},
           "data": {"k": "v"}})
}

/// A webhook entry calling `path` on the test's service.
fn webhook(name: &str, path: &str, ca_pem: &str, rules: Value) -> Value {
    json!({
        "name": name,
        "clientConfig": {
            "service": {"namespace": SVC_NS, "name": SVC_NAME, "path": path},
            "caBundle": ca_bundle(ca_pem),
        },
        "rules": rules,
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
    })
}

fn rules(operations: &[&str], resources: &[&str]) -> Value {
    json!([{"operations": operations, "apiGroups": [""], "apiVersions": ["v1"], "resources": resources}])
}

const MUTATING: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations";
const VALIDATING: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";

async fn configure(api: &KubeApi, mutating: bool, name: &str, webhooks: Vec<Value>) {
    let (path, kind) = if mutating {
        (MUTATING, "MutatingWebhookConfiguration")
    } else {
        (VALIDATING, "ValidatingWebhookConfiguration")
    };
    let cfg = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                     "metadata": {"name": name}, "webhooks": webhooks});
    let r = post(api, path, &cfg).await;
    assert_eq!(r.code, 201, "{:?}", r.body);
}

async fn setup(pki: &Pki) -> (KubeApi, Webhook) {
    let hook = start_webhook(pki).await;
    let api = KubeApi::start_local();
    api.set_service_address(SVC_NS, SVC_NAME, hook.addr);
    (api, hook)
}

fn label(obj: &Value, key: &str) -> Option<String> {
    obj.pointer("/metadata/labels")
        .and_then(|l| l.get(key))
        .and_then(Value::as_str)
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_in_a_labelled_namespace_is_patched_then_validated() {
    let pki = pki();
    let (api, hook) = setup(&pki).await;
    let mut inject = webhook(
        "inject.example.com",
        "/patch",
        &pki.ca_pem,
        rules(&["CREATE"], &["pods"]),
    );
    inject["namespaceSelector"] = json!({"matchLabels": {"istio-injection": "enabled"}});
    inject["objectSelector"] = json!({"matchExpressions": [{"key": "sidecar.istio.io/inject", "operator": "NotIn", "values": ["false"]}]});
    configure(&api, true, "injector", vec![inject]).await;
    configure(
        &api,
        false,
        "checker",
        vec![webhook(
            "allow.example.com",
            "/allow",
            &pki.ca_pem,
            rules(&["*"], &["pods"]),
        )],
    )
    .await;
    for (ns, labels) in [
        ("mesh", json!({"istio-injection": "enabled"})),
        ("plain", json!({})),
    ] {
        assert_eq!(
            post(&api, "/api/v1/namespaces", &namespace(ns, labels))
                .await
                .code,
            201
        );
    }

    let r = post(
        &api,
        "/api/v1/namespaces/mesh/pods",
        &pod("web", json!({"app": "web", "drop-me": "x"})),
    )
    .await;
    assert_eq!(r.code, 201, "{:?}", r.body);
    let stored = api.get("v1", "Pod", "mesh", "web").unwrap();
    assert_eq!(stored, r.body);
    assert_eq!(label(&stored, "injected").as_deref(), Some("yes"));
    assert_eq!(label(&stored, "moved").as_deref(), Some("true"));
    assert_eq!(label(&stored, "copied"), None);
    assert_eq!(label(&stored, "drop-me"), None);
    assert_eq!(label(&stored, "app").as_deref(), Some("web"));
    assert_eq!(
        stored["metadata"]["annotations"]["example.com/patched"],
        "yes"
    );

    // What the webhooks were sent, and in which order.
    let calls = api.admission_calls();
    let order: Vec<(&str, bool)> = calls
        .iter()
        .map(|c| (c.webhook.as_str(), c.mutating))
        .collect();
    assert_eq!(
        order,
        [("inject.example.com", true), ("allow.example.com", false)]
    );
    assert_eq!(
        calls[0].url,
        "https://webhook.test-system.svc:443/patch?timeout=10s"
    );
    let sent = &hook.reviews("/patch")[0];
    assert_eq!(sent["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(sent["kind"], "AdmissionReview");
    let req = &sent["request"];
    assert_eq!(req["uid"], calls[0].request["uid"]);
    assert_eq!(req["operation"], "CREATE");
    assert_eq!(req["namespace"], "mesh");
    assert_eq!(req["name"], "web");
    assert_eq!(
        req["kind"],
        json!({"group": "", "version": "v1", "kind": "Pod"})
    );
    assert_eq!(
        req["resource"],
        json!({"group": "", "version": "v1", "resource": "pods"})
    );
    assert_eq!(req["requestResource"], req["resource"]);
    assert_eq!(req["dryRun"], false);
    assert_eq!(req["options"]["kind"], "CreateOptions");
    assert!(req["userInfo"]["username"].is_string());
    assert!(req["oldObject"].is_null());
    assert_eq!(req["object"]["metadata"]["namespace"], "mesh");
    assert_eq!(label(&req["object"], "injected"), None);
    // The validating webhook sees the patched object.
    let validated = &hook.reviews("/allow")[0]["request"]["object"];
    assert_eq!(label(validated, "injected").as_deref(), Some("yes"));
    assert_ne!(hook.reviews("/allow")[0]["request"]["uid"], req["uid"]);

    // Not in a labelled namespace, or opted out: stored as sent.
    api.clear_admission_calls();
    let r = post(
        &api,
        "/api/v1/namespaces/plain/pods",
        &pod("web", json!({})),
    )
    .await;
    assert_eq!(r.code, 201);
    assert_eq!(label(&r.body, "injected"), None);
    let r = post(
        &api,
        "/api/v1/namespaces/mesh/pods",
        &pod("opted-out", json!({"sidecar.istio.io/inject": "false"})),
    )
    .await;
    assert_eq!(r.code, 201);
    assert_eq!(label(&r.body, "injected"), None);
    let webhooks: Vec<String> = api
        .admission_calls()
        .into_iter()
        .map(|c| c.webhook)
        .collect();
    assert_eq!(webhooks, ["allow.example.com", "allow.example.com"]);

    // generateName: the webhook sees no name, the stored Pod has one.
    let mut generated = pod("", json!({}));
    generated["metadata"] = json!({"generateName": "web-"});
    let r = post(&api, "/api/v1/namespaces/mesh/pods", &generated).await;
    assert_eq!(r.code, 201);
    assert!(
        r.body["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("web-")
    );
    assert_eq!(label(&r.body, "injected").as_deref(), Some("yes"));
    assert!(
        hook.reviews("/patch").last().unwrap()["request"]
            .get("name")
            .is_none()
    );

    // Server-side apply that creates is a CREATE; an update is not
    // injected (the rule says CREATE only).
    let applied = pod("applied", json!({}));
    let r = call(
        &api,
        "PATCH",
        "/api/v1/namespaces/mesh/pods/applied?fieldManager=test",
        "application/apply-patch+yaml",
        Some(&applied),
    )
    .await;
    assert_eq!(r.code, 201, "{:?}", r.body);
    assert_eq!(label(&r.body, "injected").as_deref(), Some("yes"));
    let last = hook.reviews("/patch").last().unwrap()["request"].clone();
    assert_eq!(last["operation"], "CREATE");
    assert_eq!(last["name"], "applied");
    let r = call(
        &api,
        "PATCH",
        "/api/v1/namespaces/plain/pods/web",
        "application/merge-patch+json",
        Some(&json!({"metadata": {"labels": {"v": "2"}}})),
    )
    .await;
    assert_eq!(r.code, 200);
    assert_eq!(label(&r.body, "v").as_deref(), Some("2"));
    assert_eq!(label(&r.body, "injected"), None);
    let last = hook.reviews("/allow").last().unwrap()["request"].clone();
    assert_eq!(last["operation"], "UPDATE");
    assert_eq!(last["options"]["kind"], "PatchOptions");
    assert_eq!(label(&last["oldObject"], "v"), None);
    assert_eq!(label(&last["object"], "v").as_deref(), Some("2"));

    // `create_admitted` is a create as over HTTP.
    let mut helper = pod("helper", json!({}));
    helper["metadata"]["namespace"] = json!("mesh");
    let created = api.create_admitted(helper.clone()).await.unwrap();
    assert_eq!(label(&created, "injected").as_deref(), Some("yes"));
    assert_eq!(api.get("v1", "Pod", "mesh", "helper").unwrap(), created);
    helper["metadata"]["namespace"] = json!("nowhere");
    assert_eq!(api.create_admitted(helper).await.unwrap_err().code, 404);

    // Direct writes are the test's hand in the store: no admission.
    api.clear_admission_calls();
    api.create(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "direct", "namespace": "mesh"}})).unwrap();
    assert!(api.admission_calls().is_empty());
    assert_eq!(
        label(&api.get("v1", "Pod", "mesh", "direct").unwrap(), "injected"),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validating_webhook_denies_create_update_patch_and_delete() {
    let pki = pki();
    let (api, _hook) = setup(&pki).await;
    let deny = webhook(
        "deny.example.com",
        "/deny",
        &pki.ca_pem,
        rules(&["CREATE", "UPDATE", "DELETE"], &["configmaps"]),
    );
    configure(&api, false, "guard", vec![deny]).await;
    let cms = "/api/v1/namespaces/default/configmaps";
    let message = "admission webhook \"deny.example.com\" denied the request: label deny is set";

    let r = post(&api, cms, &config_map("bad", json!({"deny": "true"}))).await;
    assert_eq!(r.code, 403);
    assert_eq!(r.body["kind"], "Status");
    assert_eq!(r.body["status"], "Failure");
    assert_eq!(r.body["reason"], "Forbidden");
    assert_eq!(r.body["message"], message);
    assert!(api.get("v1", "ConfigMap", "default", "bad").is_none());
    match &api.admission_calls()[0].outcome {
        WebhookOutcome::Denied { status, .. } => assert_eq!(status.message, message),
        other => panic!("{other:?}"),
    }

    let r = post(&api, cms, &config_map("good", json!({}))).await;
    assert_eq!(r.code, 201);
    let before = api.get("v1", "ConfigMap", "default", "good").unwrap();
    let mut denied = before.clone();
    denied["metadata"]["labels"] = json!({"deny": "true"});
    let r = call(
        &api,
        "PUT",
        &format!("{cms}/good"),
        "application/json",
        Some(&denied),
    )
    .await;
    assert_eq!((r.code, r.body["message"].as_str()), (403, Some(message)));
    let r = call(
        &api,
        "PATCH",
        &format!("{cms}/good"),
        "application/merge-patch+json",
        Some(&json!({"metadata": {"labels": {"deny": "true"}}})),
    )
    .await;
    assert_eq!((r.code, r.body["message"].as_str()), (403, Some(message)));
    assert_eq!(
        api.get("v1", "ConfigMap", "default", "good").unwrap(),
        before
    );

    // DELETE: the webhook sees the stored object as oldObject.
    api.create(json!({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": "kept", "labels": {"deny": "true"}}}))
        .unwrap();
    let r = call(
        &api,
        "DELETE",
        &format!("{cms}/kept"),
        "application/json",
        None,
    )
    .await;
    assert_eq!((r.code, r.body["message"].as_str()), (403, Some(message)));
    assert!(api.get("v1", "ConfigMap", "default", "kept").is_some());
    let last = api.admission_calls().pop().unwrap();
    assert_eq!(last.request["operation"], "DELETE");
    assert!(last.request["object"].is_null());
    assert_eq!(last.request["oldObject"]["metadata"]["name"], "kept");
    assert_eq!(last.request["options"]["kind"], "DeleteOptions");
    let r = call(
        &api,
        "DELETE",
        &format!("{cms}/good"),
        "application/json",
        None,
    )
    .await;
    assert_eq!(r.code, 200);

    // A denial without a status: 400, "without explanation".
    configure(
        &api,
        false,
        "silent",
        vec![webhook(
            "silent.example.com",
            "/deny-silently",
            &pki.ca_pem,
            rules(&["CREATE"], &["secrets"]),
        )],
    )
    .await;
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}});
    let r = post(&api, "/api/v1/namespaces/default/secrets", &secret).await;
    assert_eq!(r.code, 400);
    assert_eq!(
        r.body["message"],
        "admission webhook \"silent.example.com\" denied the request without explanation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_are_selected_by_their_own_labels() {
    let pki = pki();
    let (api, _hook) = setup(&pki).await;
    let mut deny = webhook(
        "deny.example.com",
        "/deny",
        &pki.ca_pem,
        rules(&["CREATE"], &["namespaces"]),
    );
    deny["namespaceSelector"] = json!({"matchLabels": {"guarded": "true"}});
    configure(&api, false, "guard", vec![deny]).await;
    let r = post(
        &api,
        "/api/v1/namespaces",
        &namespace("a", json!({"guarded": "true", "deny": "true"})),
    )
    .await;
    assert_eq!(r.code, 403, "{:?}", r.body);
    let r = post(
        &api,
        "/api/v1/namespaces",
        &namespace("b", json!({"deny": "true"})),
    )
    .await;
    assert_eq!(r.code, 201, "{:?}", r.body);
    assert_eq!(api.admission_calls().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warnings_reach_the_client_as_warning_headers() {
    let pki = pki();
    let (api, _hook) = setup(&pki).await;
    configure(
        &api,
        true,
        "warner",
        vec![webhook(
            "warn.example.com",
            "/warn",
            &pki.ca_pem,
            rules(&["CREATE"], &["configmaps"]),
        )],
    )
    .await;
    let r = post(
        &api,
        "/api/v1/namespaces/default/configmaps",
        &config_map("w", json!({})),
    )
    .await;
    assert_eq!(r.code, 201);
    assert_eq!(
        r.warnings,
        [r#"299 - "first warning""#, r#"299 - "second \"quoted\"""#]
    );
    match &api.admission_calls()[0].outcome {
        WebhookOutcome::Allowed { patch, warnings } => {
            assert_eq!(*patch, None);
            assert_eq!(warnings, &["first warning", "second \"quoted\""]);
        }
        other => panic!("{other:?}"),
    }
}

/// Creates a ConfigMap with only `hook` configured; returns the answer and
/// the outcome recorded.
async fn try_with(api: &KubeApi, name: &str, hook: Value) -> (Reply, WebhookOutcome) {
    configure(api, false, name, vec![hook]).await;
    api.clear_admission_calls();
    let r = post(
        api,
        "/api/v1/namespaces/default/configmaps",
        &config_map(name, json!({})),
    )
    .await;
    let outcome = api
        .admission_calls()
        .pop()
        .expect("the webhook was called")
        .outcome;
    let del = call(
        api,
        "DELETE",
        &format!("{VALIDATING}/{name}"),
        "application/json",
        None,
    )
    .await;
    assert_eq!(del.code, 200);
    (r, outcome)
}

fn internal_error(r: &Reply) -> String {
    assert_eq!(r.code, 500, "{:?}", r.body);
    assert_eq!(r.body["reason"], "InternalError");
    r.body["message"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_policy_decides_when_a_webhook_cannot_be_called() {
    let pki = pki();
    let (api, _hook) = setup(&pki).await;
    let cm_rules = rules(&["CREATE"], &["configmaps"]);

    // A webhook that does not answer in time.
    let mut hang = webhook("hang.example.com", "/hang", &pki.ca_pem, cm_rules.clone());
    hang["timeoutSeconds"] = json!(1);
    let (r, outcome) = try_with(&api, "hang-fail", hang.clone()).await;
    assert_eq!(
        internal_error(&r),
        "Internal error occurred: failed calling webhook \"hang.example.com\": failed to call webhook: \
         Post \"https://webhook.test-system.svc:443/hang?timeout=1s\": context deadline exceeded"
    );
    assert!(matches!(
        outcome,
        WebhookOutcome::Failed { ignored: false, .. }
    ));
    assert!(api.get("v1", "ConfigMap", "default", "hang-fail").is_none());
    hang["failurePolicy"] = json!("Ignore");
    let (r, outcome) = try_with(&api, "hang-ignore", hang).await;
    assert_eq!(r.code, 201, "{:?}", r.body);
    assert!(matches!(
        outcome,
        WebhookOutcome::Failed { ignored: true, .. }
    ));
    assert!(
        api.get("v1", "ConfigMap", "default", "hang-ignore")
            .is_some()
    );

    // A caBundle that did not issue the serving certificate.
    let other_ca = pki_ca_only();
    let wrong = webhook("tls.example.com", "/allow", &other_ca, cm_rules.clone());
    let (r, _) = try_with(&api, "wrong-ca", wrong).await;
    let msg = internal_error(&r);
    assert!(msg.starts_with("Internal error occurred: failed calling webhook \"tls.example.com\": failed to call webhook: Post"), "{msg}");
    assert!(
        msg.contains("tls: invalid peer certificate: UnknownIssuer"),
        "{msg}"
    );

    // Nothing listening.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    api.set_service_address(SVC_NS, "gone", closed);
    let mut refused = webhook(
        "refused.example.com",
        "/allow",
        &pki.ca_pem,
        cm_rules.clone(),
    );
    refused["clientConfig"]["service"]["name"] = json!("gone");
    let (r, _) = try_with(&api, "refused", refused).await;
    assert!(internal_error(&r).contains(&format!("dial tcp {closed}")));

    // A service the cluster does not have.
    let mut missing = webhook(
        "missing.example.com",
        "/allow",
        &pki.ca_pem,
        cm_rules.clone(),
    );
    missing["clientConfig"]["service"]["name"] = json!("missing");
    let (r, _) = try_with(&api, "missing", missing).await;
    assert!(internal_error(&r).ends_with("service \"missing\" not found"));

    // An answer for another request.
    let bad_uid = webhook("uid.example.com", "/bad-uid", &pki.ca_pem, cm_rules.clone());
    let (r, _) = try_with(&api, "bad-uid", bad_uid).await;
    assert!(
        internal_error(&r).contains("received invalid webhook response: expected response.uid=")
    );

    // A patch that cannot be applied is an internal error whatever the
    // policy says.
    let mut bad_patch = webhook(
        "patch.example.com",
        "/bad-patch",
        &pki.ca_pem,
        cm_rules.clone(),
    );
    bad_patch["failurePolicy"] = json!("Ignore");
    let cfg = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                     "metadata": {"name": "bad-patch"}, "webhooks": [bad_patch]});
    assert_eq!(post(&api, MUTATING, &cfg).await.code, 201);
    let r = post(
        &api,
        "/api/v1/namespaces/default/configmaps",
        &config_map("patched", json!({})),
    )
    .await;
    assert!(internal_error(&r).contains("the patch cannot be applied"));
}

/// A CA's PEM that issued nothing the webhook serves.
fn pki_ca_only() -> String {
    pki_named("another CA").ca_pem
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_webhook_is_verified_against_its_host() {
    let pki = pki();
    let (api, hook) = setup(&pki).await;
    let port = hook.addr.port();
    let mut by_ip = webhook(
        "ip.example.com",
        "",
        &pki.ca_pem,
        rules(&["CREATE"], &["configmaps"]),
    );
    by_ip["clientConfig"] = json!({"url": format!("https://127.0.0.1:{port}/patch"), "caBundle": ca_bundle(&pki.ca_pem)});
    configure(&api, true, "by-ip", vec![by_ip]).await;
    let r = post(
        &api,
        "/api/v1/namespaces/default/configmaps",
        &config_map("ip", json!({})),
    )
    .await;
    assert_eq!(r.code, 201, "{:?}", r.body);
    assert_eq!(label(&r.body, "injected").as_deref(), Some("yes"));
    assert_eq!(
        api.admission_calls()[0].url,
        format!("https://127.0.0.1:{port}/patch?timeout=10s")
    );
    let del = call(
        &api,
        "DELETE",
        &format!("{MUTATING}/by-ip"),
        "application/json",
        None,
    )
    .await;
    assert_eq!(del.code, 200);

    // The certificate does not name "localhost".
    let mut by_name = webhook(
        "name.example.com",
        "",
        &pki.ca_pem,
        rules(&["CREATE"], &["configmaps"]),
    );
    by_name["clientConfig"] = json!({"url": format!("https://localhost:{port}/patch"), "caBundle": ca_bundle(&pki.ca_pem)});
    configure(&api, true, "by-name", vec![by_name]).await;
    let r = post(
        &api,
        "/api/v1/namespaces/default/configmaps",
        &config_map("name", json!({})),
    )
    .await;
    let msg = internal_error(&r);
    assert!(
        msg.contains("tls: invalid peer certificate: certificate not valid for name \"localhost\""),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_configurations_are_served_and_never_admitted() {
    let pki = pki();
    let (api, _hook) = setup(&pki).await;
    let r = call(
        &api,
        "GET",
        "/apis/admissionregistration.k8s.io/v1",
        "application/json",
        None,
    )
    .await;
    let names: Vec<&str> = r.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "mutatingwebhookconfigurations",
            "validatingwebhookconfigurations"
        ]
    );
    // A webhook that rejects everything, itself included if it could.
    let all = json!([{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/*"]}]);
    configure(
        &api,
        false,
        "deny-all",
        vec![webhook(
            "all.example.com",
            "/deny-silently",
            &pki.ca_pem,
            all,
        )],
    )
    .await;
    let r = post(
        &api,
        "/api/v1/namespaces/default/configmaps",
        &config_map("x", json!({})),
    )
    .await;
    assert_eq!(r.code, 400);
    // Configurations can still be changed and removed.
    let r = call(
        &api,
        "PATCH",
        &format!("{VALIDATING}/deny-all"),
        "application/merge-patch+json",
        Some(&json!({"metadata": {"labels": {"a": "b"}}})),
    )
    .await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    assert_eq!(r.body["metadata"]["generation"], 1);
    let r = call(&api, "GET", VALIDATING, "application/json", None).await;
    assert_eq!(r.body["items"].as_array().unwrap().len(), 1);
    let r = call(
        &api,
        "DELETE",
        &format!("{VALIDATING}/deny-all"),
        "application/json",
        None,
    )
    .await;
    assert_eq!(r.code, 200);
    let r = post(
        &api,
        "/api/v1/namespaces/default/configmaps",
        &config_map("x", json!({})),
    )
    .await;
    assert_eq!(r.code, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutating_configurations_run_by_name_each_seeing_the_last_patch() {
    let pki = pki();
    let (api, hook) = setup(&pki).await;
    let cm_rules = rules(&["CREATE"], &["configmaps"]);
    // Created out of order: the order is the configurations' names.
    configure(
        &api,
        true,
        "b-second",
        vec![webhook(
            "second.example.com",
            "/allow",
            &pki.ca_pem,
            cm_rules.clone(),
        )],
    )
    .await;
    configure(
        &api,
        true,
        "a-first",
        vec![
            webhook("first.example.com", "/patch", &pki.ca_pem, cm_rules.clone()),
            webhook(
                "first-warn.example.com",
                "/warn",
                &pki.ca_pem,
                cm_rules.clone(),
            ),
        ],
    )
    .await;
    let r = post(
        &api,
        "/api/v1/namespaces/default/configmaps",
        &config_map("c", json!({})),
    )
    .await;
    assert_eq!(r.code, 201, "{:?}", r.body);
    let order: Vec<String> = api
        .admission_calls()
        .into_iter()
        .map(|c| c.webhook)
        .collect();
    assert_eq!(
        order,
        [
            "first.example.com",
            "first-warn.example.com",
            "second.example.com"
        ]
    );
    let seen_last = &hook.reviews("/allow")[0]["request"]["object"];
    assert_eq!(label(seen_last, "injected").as_deref(), Some("yes"));
    assert_eq!(label(&r.body, "injected").as_deref(), Some("yes"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_write_is_admitted_as_the_status_subresource() {
    let pki = pki();
    let (api, hook) = setup(&pki).await;
    configure(
        &api,
        false,
        "status-guard",
        vec![webhook(
            "status.example.com",
            "/deny",
            &pki.ca_pem,
            rules(&["UPDATE"], &["pods/status"]),
        )],
    )
    .await;
    let created = post(
        &api,
        "/api/v1/namespaces/default/pods",
        &pod("p", json!({})),
    )
    .await;
    assert_eq!(created.code, 201);
    assert!(api.admission_calls().is_empty());
    let mut obj = created.body.clone();
    obj["metadata"]["labels"] = json!({"deny": "true"});
    obj["status"] = json!({"phase": "Running"});
    // The main resource is not covered by `pods/status`.
    let r = call(
        &api,
        "PUT",
        "/api/v1/namespaces/default/pods/p",
        "application/json",
        Some(&obj),
    )
    .await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    assert!(api.admission_calls().is_empty());
    let r = call(
        &api,
        "PUT",
        "/api/v1/namespaces/default/pods/p/status",
        "application/json",
        Some(&obj),
    )
    .await;
    assert_eq!(r.code, 403, "{:?}", r.body);
    let req = &hook.reviews("/deny")[0]["request"];
    assert_eq!(req["subResource"], "status");
    assert_eq!(req["requestSubResource"], "status");
    assert_eq!(req["operation"], "UPDATE");
    assert_eq!(req["options"]["kind"], "UpdateOptions");
    assert!(
        api.get("v1", "Pod", "default", "p")
            .unwrap()
            .get("status")
            .is_none()
    );
}
