//! Dynamic admission as the API server runs it on a write
//! (<https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/>):
//! every matching webhook of the `MutatingWebhookConfiguration`s (by
//! configuration name, then in order), then every matching webhook of the
//! `ValidatingWebhookConfiguration`s, each sent an `admission.k8s.io/v1`
//! `AdmissionReview` over HTTPS (HTTP/1.1) and its answer applied: a
//! denial rejects the request, a JSON patch (RFC 6902, applied with the
//! `json-patch` crate) changes the object the next webhook and the store
//! see, warnings go back to the client, and a webhook that cannot be called
//! rejects or admits as its `failurePolicy` says.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{ACCEPT, CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde_json::{Value, json};

use super::resources::{self, ADMISSION_REGISTRATION_GROUP, Resource};
use super::selector::LabelSelector;
use super::status::Status;
use super::store::{ListOptions, Store, meta_str, present};

/// `timeoutSeconds` when a webhook sets none.
const DEFAULT_TIMEOUT_SECONDS: u64 = 10;

/// The user every request is admitted as: the stand-in authenticates no
/// client, so it reports the cluster administrator a kubeconfig of a test
/// cluster names.
fn user_info() -> Value {
    json!({"username": "kubernetes-admin", "groups": ["kubeadm:cluster-admins", "system:authenticated"]})
}

/// The operation being admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// A create (POST, or an apply that creates).
    Create,
    /// An update (PUT or PATCH of an existing object).
    Update,
    /// A delete.
    Delete,
}

impl Operation {
    /// The AdmissionReview's `operation` and the rules' spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }
}

/// What a write asks to do, as admission sees it.
#[derive(Debug, Clone)]
pub struct Attributes {
    /// The resource written.
    pub res: &'static Resource,
    /// The version of the request's path.
    pub version: String,
    /// `status` for the status subresource.
    pub subresource: Option<&'static str>,
    /// The operation.
    pub operation: Operation,
    /// The request's namespace (for a Namespace named on the path, its
    /// name, as the API's request info has it).
    pub namespace: String,
    /// The object's name (empty on a create by `generateName`).
    pub name: String,
    /// The new object (none for a delete).
    pub object: Option<Value>,
    /// The stored object (none for a create).
    pub old_object: Option<Value>,
    /// The request's options object (`CreateOptions`, `UpdateOptions`,
    /// `PatchOptions`, `DeleteOptions`).
    pub options: Value,
}

/// The result of admitting a write that was not rejected.
#[derive(Debug)]
pub struct Admitted {
    /// The object after every mutating webhook.
    pub object: Option<Value>,
    /// Whether any webhook matched (and was called): when none did, the
    /// write goes on exactly as without admission.
    pub called: bool,
}

/// One call of an admission webhook.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionCall {
    /// The configuration's `metadata.name`.
    pub configuration: String,
    /// The webhook's `name`.
    pub webhook: String,
    /// Whether it is a mutating webhook (else validating).
    pub mutating: bool,
    /// The URL posted to, `?timeout=` included (empty when none could be
    /// formed from `clientConfig`).
    pub url: String,
    /// The `request` of the AdmissionReview sent.
    pub request: Value,
    /// What came of it.
    pub outcome: WebhookOutcome,
}

/// What came of one webhook call.
#[derive(Debug, Clone, PartialEq)]
pub enum WebhookOutcome {
    /// The webhook allowed the request.
    Allowed {
        /// The JSON patch it returned and that was applied, if any.
        patch: Option<Value>,
        /// Its `warnings`.
        warnings: Vec<String>,
    },
    /// The webhook denied the request.
    Denied {
        /// The `Status` the client got.
        status: Status,
        /// Its `warnings`.
        warnings: Vec<String>,
    },
    /// The webhook could not be called or answered wrongly.
    Failed {
        /// `failed calling webhook "<name>": ...`.
        error: String,
        /// Whether `failurePolicy: Ignore` admitted the request anyway.
        ignored: bool,
    },
}

/// What admission keeps: where services are, and the calls made.
#[derive(Default)]
pub struct Admission {
    services: Mutex<HashMap<(String, String), SocketAddr>>,
    calls: Mutex<Vec<AdmissionCall>>,
}

impl Admission {
    /// Routes `clientConfig.service` `namespace/name` to `addr`.
    pub fn set_service_address(&self, namespace: &str, name: &str, addr: SocketAddr) {
        self.services
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((namespace.to_string(), name.to_string()), addr);
    }

    fn service_address(&self, namespace: &str, name: &str) -> Option<SocketAddr> {
        self.services
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(namespace.to_string(), name.to_string()))
            .copied()
    }

    /// The calls made so far, in order.
    pub fn calls(&self) -> Vec<AdmissionCall> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Forgets the calls made so far.
    pub fn clear_calls(&self) {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    fn record(&self, call: AdmissionCall) {
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(call);
    }
}

/// One webhook of a configuration.
struct Hook {
    configuration: String,
    webhook: Value,
    mutating: bool,
}

impl Hook {
    fn name(&self) -> &str {
        self.webhook
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }
}

/// The webhooks of every configuration of one kind, by configuration name
/// and then in order.
fn hooks(store: &Store, mutating: bool) -> Vec<Hook> {
    let plural = if mutating {
        "mutatingwebhookconfigurations"
    } else {
        "validatingwebhookconfigurations"
    };
    let Some(res) = resources::find(ADMISSION_REGISTRATION_GROUP, "v1", plural) else {
        return Vec::new();
    };
    let Ok(list) = store.list(res, "v1", None, &ListOptions::default()) else {
        return Vec::new();
    };
    // The list is ordered by name already (the store keeps objects sorted).
    let mut out = Vec::new();
    for config in list["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let configuration = meta_str(config, "name").unwrap_or_default().to_string();
        for webhook in config["webhooks"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            out.push(Hook {
                configuration: configuration.clone(),
                webhook: webhook.clone(),
                mutating,
            });
        }
    }
    out
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Whether one of `rules` covers the request: operation, group, version,
/// resource (`pods` is the main resource only, `pods/status`,
/// `pods/*`, `*`, `*/*`, `*/status`) and scope.
fn rules_match(rules: &Value, a: &Attributes) -> bool {
    let sub = a.subresource.unwrap_or("");
    rules
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .any(|rule| {
            let any_of = |field: &str, want: &str| {
                strings(&rule[field])
                    .iter()
                    .any(|x| *x == "*" || *x == want)
            };
            let resource = strings(&rule["resources"]).iter().any(|r| {
                let (r, s) = r.split_once('/').unwrap_or((r, ""));
                (r == "*" || r == a.res.plural) && (s == "*" || s == sub)
            });
            let scope = match rule.get("scope").and_then(Value::as_str) {
                Some("Namespaced") => a.res.namespaced,
                Some("Cluster") => !a.res.namespaced,
                _ => true,
            };
            any_of("operations", a.operation.as_str())
                && any_of("apiGroups", a.res.group)
                && any_of("apiVersions", &a.version)
                && resource
                && scope
        })
}

/// Whether the webhook's `namespaceSelector` and `objectSelector` select
/// the request. An unparsable selector is an error.
fn selectors_match(store: &Store, webhook: &Value, a: &Attributes) -> Result<bool, String> {
    let parse = |field: &str| {
        LabelSelector::from_object(webhook.get(field).unwrap_or(&Value::Null))
            .map_err(|e| format!("invalid {field}: {e}"))
    };
    let ns_sel = parse("namespaceSelector")?;
    let obj_sel = parse("objectSelector")?;
    let is_namespace = a.res.group.is_empty() && a.res.plural == "namespaces";
    let ns_ok = if is_namespace {
        // A Namespace is selected by its own labels: the new ones on a
        // create or update, the stored ones otherwise.
        let own = match (a.operation, a.subresource) {
            (Operation::Create | Operation::Update, None) => a.object.as_ref(),
            _ => a.old_object.as_ref(),
        };
        ns_sel.is_empty() || own.is_some_and(|o| ns_sel.matches(o))
    } else if !a.res.namespaced {
        // Other cluster-scoped objects are never exempted by it.
        true
    } else {
        let namespace = resources::find("", "v1", "namespaces")
            .and_then(|r| store.get(r, "v1", "", &a.namespace).ok())
            .unwrap_or_else(|| json!({}));
        ns_sel.matches(&namespace)
    };
    let obj_ok = obj_sel.is_empty()
        || [a.object.as_ref(), a.old_object.as_ref()]
            .into_iter()
            .flatten()
            .any(|o| obj_sel.matches(o));
    Ok(ns_ok && obj_ok)
}

fn group_version_kind(res: &Resource, version: &str) -> Value {
    json!({"group": res.group, "version": version, "kind": res.kind})
}

fn group_version_resource(res: &Resource, version: &str) -> Value {
    json!({"group": res.group, "version": version, "resource": res.plural})
}

/// The `request` of the AdmissionReview for `a`.
fn review_request(a: &Attributes, uid: &str) -> Value {
    let with_type = |o: &Option<Value>| {
        o.as_ref()
            .map(|o| present(o, a.res, &a.version))
            .unwrap_or(Value::Null)
    };
    let mut r = json!({
        "uid": uid,
        "kind": group_version_kind(a.res, &a.version),
        "resource": group_version_resource(a.res, &a.version),
        "requestKind": group_version_kind(a.res, &a.version),
        "requestResource": group_version_resource(a.res, &a.version),
        "operation": a.operation.as_str(),
        "userInfo": user_info(),
        "object": with_type(&a.object),
        "oldObject": with_type(&a.old_object),
        "dryRun": false,
        "options": a.options,
    });
    if let Some(sub) = a.subresource {
        r["subResource"] = json!(sub);
        r["requestSubResource"] = json!(sub);
    }
    if !a.name.is_empty() {
        r["name"] = json!(a.name);
    }
    if !a.namespace.is_empty() {
        r["namespace"] = json!(a.namespace);
    }
    r
}

/// Where a webhook is called.
struct Target {
    /// The URL, for messages and the record.
    url: String,
    /// The address connected to.
    addr: SocketAddr,
    /// The name the certificate is verified against.
    server_name: ServerName<'static>,
    /// The `Host` header.
    authority: String,
    /// Path and query sent.
    path_and_query: String,
    /// `clientConfig.caBundle`, decoded (PEM).
    ca_bundle: String,
}

/// The URL and (as far as it can be resolved) the target of `clientConfig`.
async fn target(
    adm: &Admission,
    client_config: &Value,
    timeout: u64,
) -> (String, Result<Target, String>) {
    let ca_bundle = match client_config
        .get("caBundle")
        .and_then(Value::as_str)
        .map(|b| base64::engine::general_purpose::STANDARD.decode(b))
    {
        None => Ok(String::new()),
        Some(Ok(pem)) => Ok(String::from_utf8_lossy(&pem).into_owned()),
        Some(Err(e)) => Err(format!("invalid caBundle: {e}")),
    };
    let query = format!("timeout={timeout}s");
    if let Some(svc) = client_config.get("service") {
        let ns = svc["namespace"].as_str().unwrap_or_default();
        let name = svc["name"].as_str().unwrap_or_default();
        let port = svc["port"].as_u64().unwrap_or(443);
        let path = svc["path"].as_str().unwrap_or("/");
        let host = format!("{name}.{ns}.svc");
        let url = format!("https://{host}:{port}{path}?{query}");
        let target = (|| {
            let addr = adm
                .service_address(ns, name)
                .ok_or_else(|| format!("service \"{name}\" not found"))?;
            Ok(Target {
                url: url.clone(),
                addr,
                server_name: ServerName::try_from(host.clone())
                    .map_err(|e| format!("invalid service name {host:?}: {e}"))?,
                authority: format!("{host}:{port}"),
                path_and_query: format!("{path}?{query}"),
                ca_bundle: ca_bundle?,
            })
        })();
        return (url, target);
    }
    let Some(raw) = client_config.get("url").and_then(Value::as_str) else {
        return (
            String::new(),
            Err("clientConfig has neither url nor service".into()),
        );
    };
    let uri: hyper::Uri = match raw.parse() {
        Ok(u) => u,
        Err(e) => return (raw.to_string(), Err(format!("invalid url {raw:?}: {e}"))),
    };
    let path = uri.path();
    let path_and_query = match uri.query() {
        Some(q) => format!("{path}?{q}&{query}"),
        None => format!("{path}?{query}"),
    };
    let host = uri.host().unwrap_or_default().to_string();
    let port = uri.port_u16().unwrap_or(443);
    let authority = uri
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_else(|| host.clone());
    let url = format!("https://{authority}{path_and_query}");
    if uri.scheme_str() != Some("https") {
        return (url, Err(format!("url {raw:?} is not https")));
    }
    // IPv6 literals come bracketed.
    let bare = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let addr = match bare.parse::<IpAddr>() {
        Ok(ip) => Ok(SocketAddr::new(ip, port)),
        Err(_) => match tokio::net::lookup_host((bare.as_str(), port)).await {
            Ok(mut addrs) => addrs
                .next()
                .ok_or_else(|| format!("dial tcp: lookup {bare}: no such host")),
            Err(e) => Err(format!("dial tcp: lookup {bare}: {e}")),
        },
    };
    let target = (|| {
        Ok(Target {
            url: url.clone(),
            addr: addr?,
            server_name: ServerName::try_from(bare.clone())
                .map_err(|e| format!("invalid host {bare:?}: {e}"))?,
            authority,
            path_and_query,
            ca_bundle: ca_bundle?,
        })
    })();
    (url, target)
}

/// Posts `body` to `t` and reads the JSON answer. The errors read as the
/// API server's: `failed to call webhook: Post "<url>": ...`.
async fn post(t: &Target, body: Vec<u8>) -> Result<Value, String> {
    let fail = |e: String| format!("failed to call webhook: Post {:?}: {e}", t.url);
    if t.ca_bundle.trim().is_empty() {
        return Err(fail(
            "tls: no caBundle (the stand-in has no system trust store to fall back on)".into(),
        ));
    }
    let roots =
        common::tls::root_store("caBundle", &t.ca_bundle).map_err(|e| fail(format!("tls: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| fail(format!("tls: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(t.addr)
        .await
        .map_err(|e| fail(format!("dial tcp {}: {e}", t.addr)))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(t.server_name.clone(), tcp)
        .await
        .map_err(|e| fail(format!("tls: {e}")))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| fail(e.to_string()))?;
    let req = hyper::Request::post(&t.path_and_query)
        .header(HOST, &t.authority)
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "application/json, */*")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| fail(e.to_string()))?;
    let exchange = async {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let code = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| fail(e.to_string()))?
            .to_bytes();
        if !code.is_success() {
            let text = String::from_utf8_lossy(&bytes);
            return Err(fail(format!(
                "the server responded with status code {}: {}",
                code.as_u16(),
                text.chars().take(200).collect::<String>()
            )));
        }
        serde_json::from_slice::<Value>(&bytes)
            .map_err(|e| format!("received invalid webhook response: {e}"))
    };
    // The connection is driven here, not spawned: a call that times out
    // drops it with the exchange.
    let mut exchange = std::pin::pin!(exchange);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        r = &mut exchange => r,
        // Closed: what was read is in the body channel, or the exchange fails.
        _ = &mut conn => exchange.await,
    }
}

/// The `response` of an AdmissionReview answer, checked as the API server
/// checks it.
fn response_of(review: Value, uid: &str, mutating: bool) -> Result<Value, String> {
    let invalid = |m: String| format!("received invalid webhook response: {m}");
    if review.get("apiVersion").and_then(Value::as_str) != Some("admission.k8s.io/v1")
        || review.get("kind").and_then(Value::as_str) != Some("AdmissionReview")
    {
        return Err(invalid(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {}, Kind={}",
            review["apiVersion"].as_str().unwrap_or_default(),
            review["kind"].as_str().unwrap_or_default()
        )));
    }
    let Some(response) = review.get("response").filter(|r| r.is_object()) else {
        return Err(invalid("webhook response was absent".into()));
    };
    let got = response.get("uid").and_then(Value::as_str).unwrap_or("");
    if got != uid {
        return Err(invalid(format!(
            "expected response.uid={uid:?}, got {got:?}"
        )));
    }
    let has_patch = response.get("patch").is_some_and(|p| !p.is_null());
    match response.get("patchType").and_then(Value::as_str) {
        _ if !mutating && has_patch => {
            return Err(invalid("validating webhook may not return a patch".into()));
        }
        None if has_patch => {
            return Err(invalid(
                "webhook returned response.patch but not response.patchType".into(),
            ));
        }
        Some("JSONPatch") | None => {}
        Some(other) => {
            return Err(invalid(format!(
                "webhook returned invalid response.patchType of {other:?}"
            )));
        }
    }
    Ok(response.clone())
}

/// Admits `a`: the mutating webhooks, then the validating ones. Warnings
/// are added to `warnings` whether or not the request is rejected.
pub async fn admit(
    adm: &Admission,
    store: &Store,
    mut a: Attributes,
    warnings: &mut Vec<String>,
) -> Result<Admitted, Status> {
    // The API server does not call webhooks for the webhook configurations
    // themselves, so that a broken webhook can always be removed.
    if a.res.group == ADMISSION_REGISTRATION_GROUP {
        return Ok(Admitted {
            object: a.object,
            called: false,
        });
    }
    let mut called = false;
    for mutating in [true, false] {
        for hook in hooks(store, mutating) {
            if !rules_match(&hook.webhook["rules"], &a) {
                continue;
            }
            let selected = selectors_match(store, &hook.webhook, &a);
            if let Ok(false) = selected {
                continue;
            }
            called = true;
            if let Some(object) = call(adm, &hook, &a, selected.err(), warnings).await? {
                a.object = Some(object);
            }
        }
    }
    Ok(Admitted {
        object: a.object,
        called,
    })
}

/// Calls one webhook (or records why it could not: `pre_error`). Returns
/// the patched object when a mutating webhook patched it.
async fn call(
    adm: &Admission,
    hook: &Hook,
    a: &Attributes,
    pre_error: Option<String>,
    warnings: &mut Vec<String>,
) -> Result<Option<Value>, Status> {
    let name = hook.name().to_string();
    let uid = uuid::Uuid::new_v4().hyphenated().to_string();
    let request = review_request(a, &uid);
    let timeout = hook
        .webhook
        .get("timeoutSeconds")
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    let (url, target) = target(adm, &hook.webhook["clientConfig"], timeout).await;
    let accepts_v1 = hook
        .webhook
        .get("admissionReviewVersions")
        .is_none_or(|v| strings(v).contains(&"v1"));
    let answer = match (pre_error, target) {
        (Some(e), _) | (None, Err(e)) => Err(e),
        (None, Ok(_)) if !accepts_v1 => Err(
            "webhook does not accept v1 AdmissionReview (the only version the stand-in sends)"
                .to_string(),
        ),
        (None, Ok(t)) => {
            let review = json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": request,
            });
            let body = review.to_string().into_bytes();
            match tokio::time::timeout(Duration::from_secs(timeout), post(&t, body)).await {
                Ok(r) => r.and_then(|review| response_of(review, &uid, hook.mutating)),
                Err(_) => Err(format!(
                    "failed to call webhook: Post {url:?}: context deadline exceeded"
                )),
            }
        }
    };
    let record = |outcome: WebhookOutcome| {
        adm.record(AdmissionCall {
            configuration: hook.configuration.clone(),
            webhook: name.clone(),
            mutating: hook.mutating,
            url: url.clone(),
            request: request.clone(),
            outcome,
        });
    };
    let response = match answer {
        Ok(r) => r,
        Err(e) => {
            let error = format!("failed calling webhook {name:?}: {e}");
            let ignored =
                hook.webhook.get("failurePolicy").and_then(Value::as_str) == Some("Ignore");
            record(WebhookOutcome::Failed {
                error: error.clone(),
                ignored,
            });
            return if ignored {
                Ok(None)
            } else {
                Err(Status::internal(error))
            };
        }
    };
    let hook_warnings: Vec<String> = strings(&response["warnings"])
        .into_iter()
        .map(str::to_string)
        .collect();
    for w in &hook_warnings {
        if !warnings.contains(w) {
            warnings.push(w.clone());
        }
    }
    if response.get("allowed").and_then(Value::as_bool) != Some(true) {
        let status = Status::denied(&name, response.get("status"));
        record(WebhookOutcome::Denied {
            status: status.clone(),
            warnings: hook_warnings,
        });
        return Err(status);
    }
    let patch = match response.get("patch").and_then(Value::as_str) {
        Some(p) if !p.is_empty() => {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(p)
                .map_err(|e| Status::internal(format!("webhook {name:?}: invalid patch: {e}")))?;
            Some(
                serde_json::from_slice::<Value>(&raw).map_err(|e| {
                    Status::internal(format!("webhook {name:?}: invalid patch: {e}"))
                })?,
            )
        }
        _ => None,
    };
    record(WebhookOutcome::Allowed {
        patch: patch.clone(),
        warnings: hook_warnings,
    });
    // A patch of a delete has no object to change.
    let (Some(patch), Some(object)) = (patch, a.object.as_ref()) else {
        return Ok(None);
    };
    let ops: json_patch::Patch = serde_json::from_value(patch)
        .map_err(|e| Status::internal(format!("webhook {name:?}: invalid patch: {e}")))?;
    let mut patched = present(object, a.res, &a.version);
    json_patch::patch(&mut patched, &ops).map_err(|e| {
        Status::internal(format!(
            "webhook {name:?}: the patch cannot be applied: {e}"
        ))
    })?;
    Ok(Some(patched))
}

/// The `Warning` header value of one admission warning:
/// `299 - "<text>"`, quotes and backslashes escaped, control characters
/// as spaces.
pub fn warning_header(text: &str) -> String {
    let mut out = String::from("299 - \"");
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_api::resources::find;

    fn attrs(plural: &str, sub: Option<&'static str>, op: Operation) -> Attributes {
        let res = find("", "v1", plural).unwrap();
        Attributes {
            res,
            version: "v1".into(),
            subresource: sub,
            operation: op,
            namespace: "ns".into(),
            name: "a".into(),
            object: Some(json!({"metadata": {"name": "a", "labels": {"app": "web"}}})),
            old_object: None,
            options: json!({}),
        }
    }

    #[test]
    fn rules_distinguish_resources_subresources_and_operations() {
        let pods = attrs("pods", None, Operation::Create);
        let status = attrs("pods", Some("status"), Operation::Update);
        let rule = |ops: &[&str], res: &[&str]| json!([{"operations": ops, "apiGroups": [""], "apiVersions": ["v1"], "resources": res}]);
        assert!(rules_match(&rule(&["CREATE"], &["pods"]), &pods));
        assert!(rules_match(&rule(&["*"], &["*"]), &pods));
        assert!(!rules_match(&rule(&["UPDATE"], &["pods"]), &pods));
        assert!(!rules_match(&rule(&["*"], &["pods"]), &status));
        assert!(!rules_match(&rule(&["*"], &["*"]), &status));
        assert!(rules_match(&rule(&["*"], &["pods/status"]), &status));
        assert!(rules_match(&rule(&["*"], &["pods/*"]), &status));
        assert!(rules_match(&rule(&["*"], &["*/*"]), &status));
        assert!(rules_match(&rule(&["*"], &["*/status"]), &status));
        assert!(!rules_match(&rule(&["*"], &["services"]), &pods));
        let cluster = json!([{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "scope": "Cluster"}]);
        assert!(!rules_match(&cluster, &pods));
        assert!(rules_match(
            &cluster,
            &attrs("namespaces", None, Operation::Create)
        ));
        let other_group = json!([{"operations": ["*"], "apiGroups": ["apps"], "apiVersions": ["*"], "resources": ["*"]}]);
        assert!(!rules_match(&other_group, &pods));
    }

    #[test]
    fn warnings_are_quoted_as_the_api_quotes_them() {
        assert_eq!(
            warning_header(r#"say "hi" \ now"#),
            r#"299 - "say \"hi\" \\ now""#
        );
        assert_eq!(warning_header("a\nb"), "299 - \"a b\"");
    }
}
