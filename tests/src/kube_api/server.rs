//! The HTTP side: connections (cut while unreachable), routing of the API's
//! paths to the store's verbs, watch streams with bookmarks, TokenReview.

use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::admission::{self, Admission, Attributes, Operation};
use super::resources::{self, AUTHENTICATION_GROUP, Resource};
use super::selector::{FieldSelector, LabelSelector};
use super::status::Status;
use super::store::{
    ListOptions, PatchKind, Scope, Store, Watch, WatchOptions, check_type, merge_patch, meta_str,
};
use super::{RequestRecord, TokenReviewAnswer, TokenReviewFn, TokenReviewRecord};

type Body = BoxBody<Bytes, std::io::Error>;

/// State shared by the server and the test's handle.
pub struct Shared {
    pub addr: SocketAddr,
    pub store: Store,
    pub latency: Mutex<Duration>,
    pub bookmark_interval: Mutex<Duration>,
    /// `true` while new connections and requests are refused.
    pub unreachable: watch::Sender<bool>,
    /// Bumped each time the server becomes unreachable: connections and
    /// watches opened before are cut, even if it is reachable again before
    /// they look (a level alone could flip back unseen).
    pub cuts: watch::Sender<u64>,
    /// Bumped to end every open watch stream.
    pub breaks: watch::Sender<u64>,
    pub token_review: Mutex<TokenReviewFn>,
    pub requests: Mutex<Vec<RequestRecord>>,
    pub token_reviews: Mutex<Vec<TokenReviewRecord>>,
    pub open_watches: AtomicUsize,
    /// Service addresses for webhooks, and the webhook calls made.
    pub admission: Admission,
}

impl Shared {
    pub fn new(addr: SocketAddr, store: Store) -> Shared {
        Shared {
            addr,
            store,
            latency: Mutex::new(Duration::ZERO),
            bookmark_interval: Mutex::new(Duration::from_secs(1)),
            unreachable: watch::channel(false).0,
            cuts: watch::channel(0).0,
            breaks: watch::channel(0).0,
            token_review: Mutex::new(Arc::new(|_, _| {
                TokenReviewAnswer::Unauthenticated("invalid bearer token".into())
            })),
            requests: Mutex::new(Vec::new()),
            token_reviews: Mutex::new(Vec::new()),
            open_watches: AtomicUsize::new(0),
            admission: Admission::default(),
        }
    }

    fn latency(&self) -> Duration {
        *self.latency.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bookmark_interval(&self) -> Duration {
        *self
            .bookmark_interval
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// Accepts connections until the runtime is dropped.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(_) => {
                // Out of descriptors or the like: try again shortly.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Read before the level: a cut in between still reaches this
        // connection through the generation.
        let cut_at = *shared.cuts.borrow();
        if *shared.unreachable.borrow() {
            if let Ok(s) = stream.into_std() {
                let _ = s.shutdown(Shutdown::Both);
            }
            continue;
        }
        tokio::spawn(connection(stream, shared.clone(), cut_at));
    }
}

/// Serves one connection; cuts it when the server becomes unreachable
/// (generation `cut_at` no longer current).
async fn connection(stream: TcpStream, shared: Arc<Shared>, cut_at: u64) {
    // A second descriptor of the socket, to shut it down under hyper.
    let Ok(dup) = stream
        .as_fd()
        .try_clone_to_owned()
        .map(std::net::TcpStream::from)
    else {
        return;
    };
    let mut cuts = shared.cuts.subscribe();
    let svc_shared = shared.clone();
    let svc = hyper::service::service_fn(move |req| handle(svc_shared.clone(), req, cut_at));
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
    tokio::select! {
        _ = conn => {}
        _ = cuts.wait_for(|g| *g != cut_at) => {
            let _ = dup.shutdown(Shutdown::Both);
        }
    }
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(v.to_string()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::OK);
    r.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn header(req: &Request<Incoming>, name: hyper::header::HeaderName) -> Option<String> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Answers one request. An `Err` makes hyper drop the connection without an
/// answer: what a client sees of a server that became unreachable.
async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    cut_at: u64,
) -> Result<Response<Body>, std::io::Error> {
    let record = RequestRecord {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        query: req.uri().query().unwrap_or_default().to_string(),
        content_type: header(&req, CONTENT_TYPE),
        bearer: header(&req, AUTHORIZATION)
            .and_then(|a| a.strip_prefix("Bearer ").map(str::to_string)),
        status: None,
    };
    let (method, path) = (record.method.clone(), record.path.clone());
    let index = {
        let mut requests = shared.requests.lock().unwrap_or_else(|e| e.into_inner());
        requests.push(record);
        requests.len() - 1
    };
    let latency = shared.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let cut = || *shared.cuts.borrow() != cut_at || *shared.unreachable.borrow();
    let unreachable = || std::io::Error::other("the API server is unreachable");
    if cut() {
        return Err(unreachable());
    }
    let mut warnings = Vec::new();
    let mut response = match route(&shared, req, &mut warnings).await {
        Ok(r) => r,
        Err(status) => json_response(status.code, &status.to_json()),
    };
    // Admission warnings go back whether or not the request succeeded.
    for w in &warnings {
        if let Ok(v) =
            hyper::header::HeaderValue::from_bytes(admission::warning_header(w).as_bytes())
        {
            response
                .headers_mut()
                .append(hyper::header::HeaderName::from_static("warning"), v);
        }
    }
    if cut() {
        return Err(unreachable());
    }
    // `clear_requests` may have emptied the record meanwhile: the entry at
    // `index` is this request's only if it is still unanswered and the same.
    if let Some(r) = shared
        .requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_mut(index)
        .filter(|r| r.status.is_none() && r.method == method && r.path == path)
    {
        r.status = Some(response.status().as_u16());
    }
    Ok(response)
}

/// Query parameters.
pub type Query = HashMap<String, String>;

fn parse_query(q: Option<&str>) -> Query {
    form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn flag(q: &Query, name: &str) -> bool {
    matches!(q.get(name).map(String::as_str), Some("1" | "true"))
}

async fn route(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    warnings: &mut Vec<String>,
) -> Result<Response<Body>, Status> {
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let doc = |v: Option<Value>| {
        v.map(|v| json_response(200, &v))
            .ok_or_else(|| Status::no_route(&path))
    };
    if let (["api" | "apis"], Some(v)) =
        (segs.as_slice(), aggregated(header(&req, ACCEPT).as_deref()))
    {
        let mut r = json_response(200, &resources::aggregated_discovery(segs[0] == "api", v));
        let ct = format!("application/json;g=apidiscovery.k8s.io;v={v};as=APIGroupDiscoveryList");
        if let Ok(ct) = hyper::header::HeaderValue::from_str(&ct) {
            r.headers_mut().insert(CONTENT_TYPE, ct);
        }
        return Ok(r);
    }
    match segs.as_slice() {
        ["version"] => doc(Some(resources::version_info())),
        ["healthz" | "livez" | "readyz"] => Ok(Response::new(
            Full::new(Bytes::from_static(b"ok"))
                .map_err(|never| match never {})
                .boxed(),
        )),
        ["api"] => doc(Some(resources::api_versions(&shared.addr.to_string()))),
        ["api", "v1"] => doc(resources::api_resource_list("", "v1")),
        ["apis"] => doc(Some(resources::api_group_list())),
        ["apis", g] => doc(resources::api_group_doc(g)),
        ["apis", g, v] => doc(resources::api_resource_list(g, v)),
        ["apis", AUTHENTICATION_GROUP, "v1", "tokenreviews"] => {
            if req.method() != Method::POST {
                return Err(Status::method_not_allowed(
                    req.method().as_str(),
                    "tokenreviews",
                ));
            }
            token_review(shared, req).await
        }
        ["api", "v1", rest @ ..] => {
            let rest: Vec<String> = rest.iter().map(|s| s.to_string()).collect();
            resource(shared, "", "v1", &rest, req, warnings).await
        }
        ["apis", g, v, rest @ ..] => {
            let (g, v) = (g.to_string(), v.to_string());
            let rest: Vec<String> = rest.iter().map(|s| s.to_string()).collect();
            resource(shared, &g, &v, &rest, req, warnings).await
        }
        _ => Err(Status::no_route(&path)),
    }
}

/// What a resource path names.
enum Target {
    /// A collection: one namespace, or all (and cluster-scoped ones).
    Collection { ns: Option<String> },
    /// One object, maybe its `status`.
    Object {
        ns: String,
        name: String,
        status: bool,
    },
}

fn target(
    group: &str,
    version: &str,
    rest: &[String],
    path: &str,
) -> Result<(&'static Resource, Target), Status> {
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    let none = || Status::no_route(path);
    let sub = |s: Option<&str>, res: &Resource| match s {
        None => Ok(false),
        Some("status") if res.status => Ok(true),
        Some(_) => Err(none()),
    };
    if let ["namespaces", ns, plural, tail @ ..] = rest.as_slice()
        && let Some(res) = resources::find(group, version, plural).filter(|r| r.namespaced)
    {
        let ns = ns.to_string();
        return Ok(match tail {
            [] => (res, Target::Collection { ns: Some(ns) }),
            [name] | [name, _] => (
                res,
                Target::Object {
                    ns,
                    name: name.to_string(),
                    status: sub(tail.get(1).copied(), res)?,
                },
            ),
            _ => return Err(none()),
        });
    }
    let [plural, tail @ ..] = rest.as_slice() else {
        return Err(none());
    };
    let res = resources::find(group, version, plural).ok_or_else(none)?;
    match tail {
        [] => Ok((res, Target::Collection { ns: None })),
        [name] | [name, _] if !res.namespaced => Ok((
            res,
            Target::Object {
                ns: String::new(),
                name: name.to_string(),
                status: sub(tail.get(1).copied(), res)?,
            },
        )),
        _ => Err(none()),
    }
}

async fn body_bytes(req: Request<Incoming>) -> Result<Bytes, Status> {
    req.into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| Status::bad_request(format!("cannot read the request body: {e}")))
}

/// A body as JSON (YAML for YAML content types, which JSON also is).
fn decode(content_type: &str, body: &[u8]) -> Result<Value, Status> {
    if content_type.contains("protobuf") || content_type.contains("cbor") {
        return Err(Status::unsupported_media_type(content_type));
    }
    let r = if content_type.contains("yaml") {
        serde_yaml_ng::from_slice(body).map_err(|e| e.to_string())
    } else {
        serde_json::from_slice(body).map_err(|e| e.to_string())
    };
    r.map_err(|e| Status::bad_request(format!("the body of the request could not be decoded: {e}")))
}

fn selectors(res: &Resource, q: &Query) -> Result<(LabelSelector, FieldSelector), Status> {
    let labels = LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| Status::bad_request(e.to_string()))?;
    let fields = FieldSelector::parse(
        q.get("fieldSelector").map_or("", String::as_str),
        res.fields,
    )
    .map_err(|e| Status::bad_request(e.to_string()))?;
    Ok((labels, fields))
}

/// The aggregated discovery version (`v2`, `v2beta1`) the first acceptable
/// media type of `Accept` asks for, if it asks for one before plain JSON.
fn aggregated(accept: Option<&str>) -> Option<&'static str> {
    for media in accept?.split(',') {
        let params: Vec<&str> = media.split(';').map(str::trim).collect();
        let has = |p: &str| params.contains(&p);
        if has("g=apidiscovery.k8s.io") && has("as=APIGroupDiscoveryList") {
            if has("v=v2") {
                return Some("v2");
            }
            if has("v=v2beta1") {
                return Some("v2beta1");
            }
        } else if params
            .first()
            .is_some_and(|m| *m == "application/json" || *m == "*/*")
        {
            return None;
        }
    }
    None
}

/// `Accept: ...;as=PartialObjectMetadata[List]`: only metadata is served.
fn metadata_only(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("as=PartialObjectMetadata"))
}

fn partial(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

fn partial_list(list: &Value) -> Value {
    let items: Vec<Value> = list
        .get("items")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(partial).collect())
        .unwrap_or_default();
    json!({
        "kind": "PartialObjectMetadataList",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list.get("metadata").cloned().unwrap_or_else(|| json!({})),
        "items": items,
    })
}

async fn resource(
    shared: &Arc<Shared>,
    group: &str,
    version: &str,
    rest: &[String],
    req: Request<Incoming>,
    warnings: &mut Vec<String>,
) -> Result<Response<Body>, Status> {
    let path = req.uri().path().to_string();
    let (res, target) = target(group, version, rest, &path)?;
    let q = parse_query(req.uri().query());
    let method = req.method().clone();
    let accept = header(&req, ACCEPT);
    let content_type = header(&req, CONTENT_TYPE).unwrap_or_else(|| "application/json".into());
    let meta_only = metadata_only(accept.as_deref());
    let write = !matches!(method, Method::GET | Method::HEAD);
    if write && !res.writable {
        return Err(Status::method_not_allowed(method.as_str(), res.plural));
    }
    if write && q.contains_key("dryRun") {
        return Err(Status::bad_request(
            "dryRun is not supported by this API server stand-in",
        ));
    }
    let store = &shared.store;
    let one = |v: Value| {
        if meta_only { partial(&v) } else { v }
    };
    match (method, target) {
        (Method::GET, Target::Collection { ns }) if flag(&q, "watch") => {
            let (labels, fields) = selectors(res, &q)?;
            let opts = WatchOptions {
                labels,
                fields,
                resource_version: q.get("resourceVersion").cloned(),
                version_match: q.get("resourceVersionMatch").cloned(),
                send_initial_events: q.get("sendInitialEvents").map(|v| v == "true" || v == "1"),
                bookmarks: flag(&q, "allowWatchBookmarks"),
            };
            let timeout = match q.get("timeoutSeconds") {
                Some(t) => Some(Duration::from_secs(t.parse().map_err(|_| {
                    Status::bad_request(format!("invalid timeoutSeconds: {t:?}"))
                })?)),
                None => None,
            };
            let stream = StreamOptions {
                timeout,
                bookmarks: opts.bookmarks,
                meta_only,
                breaks_at: *shared.breaks.borrow(),
                cuts_at: *shared.cuts.borrow(),
            };
            let w = store.watch(res, version, ns.as_deref(), opts)?;
            Ok(watch_response(shared.clone(), w, stream))
        }
        (Method::GET, Target::Collection { ns }) => {
            let (labels, fields) = selectors(res, &q)?;
            let limit = match q.get("limit") {
                Some(l) => Some(
                    l.parse()
                        .map_err(|_| Status::bad_request(format!("invalid limit: {l:?}")))?,
                ),
                None => None,
            };
            let opts = ListOptions {
                labels,
                fields,
                resource_version: q.get("resourceVersion").cloned(),
                version_match: q.get("resourceVersionMatch").cloned(),
                limit,
                continue_token: q.get("continue").cloned().filter(|c| !c.is_empty()),
            };
            let list = store.list(res, version, ns.as_deref(), &opts)?;
            Ok(json_response(
                200,
                &if meta_only { partial_list(&list) } else { list },
            ))
        }
        (Method::POST, Target::Collection { ns }) => {
            let ns = match (ns, res.namespaced) {
                (Some(ns), true) => ns,
                (None, false) => String::new(),
                _ => return Err(Status::no_route(&path)),
            };
            if res.namespaced && !store.namespace_exists(&ns) {
                return Err(namespace_missing(&ns));
            }
            let obj = decode(&content_type, &body_bytes(req).await?)?;
            let created = create_admitted(shared, res, version, &ns, obj, &q, warnings).await?;
            Ok(json_response(201, &one(created)))
        }
        (Method::DELETE, Target::Collection { ns }) => {
            let (labels, fields) = selectors(res, &q)?;
            let opts = ListOptions {
                labels,
                fields,
                ..Default::default()
            };
            let list = store.list(res, version, ns.as_deref(), &opts)?;
            let mut deleted = Vec::new();
            for item in list["items"].as_array().cloned().unwrap_or_default() {
                let ns = meta_str(&item, "namespace").unwrap_or_default();
                let name = meta_str(&item, "name").unwrap_or_default();
                // Already gone is fine: another writer got there first.
                if let Ok(d) = store.delete(res, version, ns, name, &Value::Null) {
                    deleted.push(d);
                }
            }
            let rv = store.resource_version().to_string();
            Ok(json_response(
                200,
                &json!({"kind": format!("{}List", res.kind), "apiVersion": res.api_version(version),
                        "metadata": {"resourceVersion": rv}, "items": deleted}),
            ))
        }
        (Method::GET, Target::Object { ns, name, .. }) => Ok(json_response(
            200,
            &one(store.get(res, version, &ns, &name)?),
        )),
        (Method::PUT, Target::Object { ns, name, status }) => {
            let mut obj = decode(&content_type, &body_bytes(req).await?)?;
            let scope = if status { Scope::Status } else { Scope::Main };
            // A missing object is the store's 404, before admission.
            if let Ok(old) = store.get(res, version, &ns, &name)
                && check_type(res, &obj).is_ok()
            {
                let attrs = Attributes {
                    res,
                    version: version.to_string(),
                    subresource: status.then_some("status"),
                    operation: Operation::Update,
                    namespace: request_namespace(res, &ns, &name),
                    name: name.clone(),
                    object: Some(obj.clone()),
                    old_object: Some(old),
                    options: options("UpdateOptions", &q),
                };
                if let Some(o) = admission::admit(&shared.admission, store, attrs, warnings)
                    .await?
                    .object
                {
                    obj = o;
                }
            }
            let updated = store.update(res, version, &ns, &name, obj, scope)?;
            Ok(json_response(200, &one(updated)))
        }
        (Method::PATCH, Target::Object { ns, name, status }) => {
            let ct = content_type.split(';').next().unwrap_or_default().trim();
            let kind = match ct {
                "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                    PatchKind::Merge
                }
                "application/apply-patch+yaml" => PatchKind::Apply,
                _ => return Err(Status::unsupported_media_type(&content_type)),
            };
            if kind == PatchKind::Apply && q.get("fieldManager").is_none_or(|m| m.is_empty()) {
                return Err(Status::invalid(
                    "PatchOptions.meta.k8s.io",
                    "",
                    "fieldManager: Required value: is required for apply patch",
                ));
            }
            let patch = decode(ct, &body_bytes(req).await?)?;
            if kind == PatchKind::Apply
                && res.namespaced
                && store.get(res, version, &ns, &name).is_err()
                && !store.namespace_exists(&ns)
            {
                return Err(namespace_missing(&ns));
            }
            let scope = if status { Scope::Status } else { Scope::Main };
            let target = PatchTarget {
                res,
                version,
                ns: &ns,
                name: &name,
                status,
            };
            let (obj, created) =
                patch_admitted(shared, &target, kind, patch, scope, &q, warnings).await?;
            Ok(json_response(if created { 201 } else { 200 }, &one(obj)))
        }
        (
            Method::DELETE,
            Target::Object {
                ns,
                name,
                status: false,
            },
        ) => {
            let body = body_bytes(req).await?;
            let opts = if body.is_empty() {
                Value::Null
            } else {
                decode(&content_type, &body)?
            };
            let pre = opts.get("preconditions").cloned().unwrap_or(Value::Null);
            let orphan = opts["propagationPolicy"] == "Orphan"
                || q.get("propagationPolicy").is_some_and(|p| p == "Orphan");
            if let Ok(old) = store.get(res, version, &ns, &name) {
                let mut delete_options = opts.clone();
                if !delete_options.is_object() {
                    delete_options = options("DeleteOptions", &q);
                }
                let attrs = Attributes {
                    res,
                    version: version.to_string(),
                    subresource: None,
                    operation: Operation::Delete,
                    namespace: request_namespace(res, &ns, &name),
                    name: name.clone(),
                    object: None,
                    old_object: Some(old),
                    options: delete_options,
                };
                admission::admit(&shared.admission, store, attrs, warnings).await?;
            }
            Ok(json_response(
                200,
                &one(store.delete_with(res, version, &ns, &name, &pre, orphan)?),
            ))
        }
        (m, _) => Err(Status::method_not_allowed(m.as_str(), res.plural)),
    }
}

/// A CREATE as over HTTP (the namespace, if any, known to exist): the
/// body's namespace filled in from the path, the object admitted, then
/// stored.
pub async fn create_admitted(
    shared: &Shared,
    res: &'static Resource,
    version: &str,
    ns: &str,
    mut obj: Value,
    q: &Query,
    warnings: &mut Vec<String>,
) -> Result<Value, Status> {
    check_type(res, &obj)?;
    let body_ns = meta_str(&obj, "namespace").unwrap_or_default();
    // A mismatched namespace is refused by the store, before any webhook
    // would see the object.
    if !res.namespaced || body_ns.is_empty() || body_ns == ns {
        if res.namespaced {
            obj["metadata"]["namespace"] = json!(ns);
        }
        let attrs = Attributes {
            res,
            version: version.to_string(),
            subresource: None,
            operation: Operation::Create,
            namespace: ns.to_string(),
            name: meta_str(&obj, "name").unwrap_or_default().to_string(),
            object: Some(obj.clone()),
            old_object: None,
            options: options("CreateOptions", q),
        };
        if let Some(o) = admission::admit(&shared.admission, &shared.store, attrs, warnings)
            .await?
            .object
        {
            obj = o;
        }
    }
    shared.store.create(res, version, ns, obj, Scope::Main)
}

/// The request's namespace as the API's request info has it: a Namespace
/// named on the path is its own.
fn request_namespace(res: &Resource, ns: &str, name: &str) -> String {
    if res.group.is_empty() && res.plural == "namespaces" {
        name.to_string()
    } else {
        ns.to_string()
    }
}

/// The options object of a write, as admission reports it.
fn options(kind: &str, q: &Query) -> Value {
    let mut o = json!({"kind": kind, "apiVersion": "meta.k8s.io/v1"});
    if let Some(m) = q.get("fieldManager") {
        o["fieldManager"] = json!(m);
    }
    o
}

/// How often a PATCH is admitted again when the object changed while its
/// webhooks were called, as the API server retries a patch on a conflict.
const PATCH_ATTEMPTS: usize = 5;

/// The object a PATCH is for.
struct PatchTarget<'a> {
    res: &'static Resource,
    version: &'a str,
    ns: &'a str,
    name: &'a str,
    status: bool,
}

/// A PATCH with admission: the patch is applied to the stored object, the
/// result admitted as an UPDATE (an apply that creates as a CREATE), and
/// the admitted object written if the stored one has not changed meanwhile
/// (else all again). With no webhook to call, the store patches as before.
async fn patch_admitted(
    shared: &Arc<Shared>,
    t: &PatchTarget<'_>,
    kind: PatchKind,
    patch: Value,
    scope: Scope,
    q: &Query,
    warnings: &mut Vec<String>,
) -> Result<(Value, bool), Status> {
    let store = &shared.store;
    let (res, version, ns, name) = (t.res, t.version, t.ns, t.name);
    let plain = || store.patch(res, version, ns, name, kind, patch.clone(), scope);
    if !patch.is_object() || check_type(res, &patch).is_err() {
        return plain();
    }
    let pinned = meta_str(&patch, "resourceVersion").is_some_and(|r| !r.is_empty());
    for _ in 0..PATCH_ATTEMPTS {
        let old = store.get(res, version, ns, name).ok();
        let (operation, object, opts) = match &old {
            None if kind == PatchKind::Apply && !t.status => {
                if meta_str(&patch, "name").is_some_and(|n| n != name) {
                    return plain();
                }
                let mut obj = patch.clone();
                obj["metadata"]["name"] = json!(name);
                if res.namespaced {
                    obj["metadata"]["namespace"] = json!(ns);
                }
                (Operation::Create, obj, "CreateOptions")
            }
            None => return plain(),
            Some(old) => {
                let mut new = old.clone();
                merge_patch(&mut new, &patch);
                (Operation::Update, new, "PatchOptions")
            }
        };
        let attrs = Attributes {
            res,
            version: version.to_string(),
            subresource: t.status.then_some("status"),
            operation,
            namespace: request_namespace(res, ns, name),
            name: name.to_string(),
            object: Some(object.clone()),
            old_object: old.clone(),
            options: options(opts, q),
        };
        let admitted = admission::admit(&shared.admission, store, attrs, warnings).await?;
        if !admitted.called {
            return plain();
        }
        let mut obj = admitted.object.unwrap_or(object);
        let Some(old) = old else {
            // Created meanwhile: merged into it as an apply does.
            return store.patch(res, version, ns, name, PatchKind::Apply, obj, scope);
        };
        obj["metadata"]["resourceVersion"] = json!(meta_str(&old, "resourceVersion"));
        match store.update(res, version, ns, name, obj, scope) {
            Err(s) if s.code == 409 && !pinned => continue,
            r => return r.map(|o| (o, false)),
        }
    }
    Err(Status::conflict(res, name))
}

/// 404 for a namespace that does not exist.
pub fn namespace_missing(ns: &str) -> Status {
    let namespaces = resources::find("", "v1", "namespaces").expect("namespaces are served");
    Status::not_found(namespaces, ns)
}

async fn token_review(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Status> {
    let ct = header(&req, CONTENT_TYPE).unwrap_or_else(|| "application/json".into());
    let review = decode(&ct, &body_bytes(req).await?)?;
    let token = review
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if token.is_empty() {
        return Err(Status::bad_request(
            "token is required for TokenReview in authentication",
        ));
    }
    let audiences: Vec<String> = review
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    shared
        .token_reviews
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(TokenReviewRecord {
            token: token.clone(),
            audiences: audiences.clone(),
        });
    let answer = shared
        .token_review
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let status = match answer(&token, &audiences) {
        TokenReviewAnswer::Authenticated(u) => json!({
            "authenticated": true,
            "user": {"username": u.username, "uid": u.uid, "groups": u.groups, "extra": u.extra},
            "audiences": u.audiences,
        }),
        TokenReviewAnswer::Unauthenticated(error) => json!({"user": {}, "error": error}),
    };
    Ok(json_response(
        201,
        &json!({
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "spec": review.get("spec").cloned().unwrap_or_else(|| json!({})),
            "status": status,
        }),
    ))
}

type Chunk = Result<Frame<Bytes>, std::io::Error>;

/// How a watch stream is sent.
struct StreamOptions {
    /// `timeoutSeconds`.
    timeout: Option<Duration>,
    /// `allowWatchBookmarks`.
    bookmarks: bool,
    /// Only `PartialObjectMetadata` is sent.
    meta_only: bool,
    /// The `breaks` generation when the watch was asked for.
    breaks_at: u64,
    /// The `cuts` generation when the watch was asked for.
    cuts_at: u64,
}

fn watch_response(shared: Arc<Shared>, w: Watch, opts: StreamOptions) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Chunk>(64);
    shared.open_watches.fetch_add(1, Ordering::SeqCst);
    tokio::spawn(async move {
        run_watch(&shared, w, &tx, opts).await;
        shared.open_watches.fetch_sub(1, Ordering::SeqCst);
    });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(ReceiverStream::new(rx))));
    r.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// Why a watch stream stopped sending.
enum Stop {
    /// The client went away, or the stream ended as it should.
    Done,
    /// Cut mid-stream (broken by the test, or the watcher fell too far
    /// behind).
    Abort,
}

struct Sender<'a> {
    shared: &'a Shared,
    tx: &'a mpsc::Sender<Chunk>,
    meta_only: bool,
    /// The `breaks` generation when the watch was asked for.
    breaks_at: u64,
    /// The `cuts` generation when the watch was asked for.
    cuts_at: u64,
}

impl Sender<'_> {
    /// Whether the stream must be cut: checked before every event, so that
    /// nothing committed after `break_watches` or `set_unreachable` returned
    /// reaches the client on this stream.
    fn cut(&self) -> bool {
        *self.shared.cuts.borrow() != self.cuts_at || *self.shared.breaks.borrow() != self.breaks_at
    }

    async fn send(&self, mut event: Value) -> Result<(), Stop> {
        if self.cut() {
            return Err(Stop::Abort);
        }
        if self.meta_only && event["type"] != "ERROR" && event["type"] != "BOOKMARK" {
            event["object"] = partial(&event["object"]);
        }
        let line = Bytes::from(format!("{event}\n"));
        self.tx
            .send(Ok(Frame::data(line)))
            .await
            .map_err(|_| Stop::Done)
    }
}

async fn run_watch(shared: &Shared, mut w: Watch, tx: &mpsc::Sender<Chunk>, opts: StreamOptions) {
    let mut breaks = shared.breaks.subscribe();
    let out = Sender {
        shared,
        tx,
        meta_only: opts.meta_only,
        breaks_at: opts.breaks_at,
        cuts_at: opts.cuts_at,
    };
    let stop = if out.cut() {
        Stop::Abort
    } else {
        stream_events(
            shared,
            &mut w,
            &out,
            &mut breaks,
            opts.timeout,
            opts.bookmarks,
        )
        .await
    };
    if let Stop::Abort = stop {
        // An error in the body makes hyper drop the connection without the
        // last chunk: the client sees the stream cut, not ended.
        let _ = tx
            .send(Err(std::io::Error::other("watch stream cut")))
            .await;
    }
}

async fn stream_events(
    shared: &Shared,
    w: &mut Watch,
    out: &Sender<'_>,
    breaks: &mut watch::Receiver<u64>,
    timeout: Option<Duration>,
    bookmarks: bool,
) -> Stop {
    macro_rules! send {
        ($v:expr) => {
            if let Err(stop) = out.send($v).await {
                return stop;
            }
        };
    }
    if let Some(status) = &w.expired {
        send!(json!({"type": "ERROR", "object": status.to_json()}));
        return Stop::Done;
    }
    for ev in std::mem::take(&mut w.initial) {
        if let Some(v) = w.filter.view(&ev) {
            send!(v);
        }
    }
    // Everything up to here is sent: bookmarks never go below it.
    let mut sent_rv = w.start;
    if let Some(end) = w.initial_end {
        send!(w.filter.bookmark(end, true));
    }
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut next_bookmark = Instant::now() + shared.bookmark_interval();
    loop {
        tokio::select! {
            _ = out.tx.closed() => return Stop::Done,
            _ = async { tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)).await }, if deadline.is_some() => {
                if bookmarks {
                    send!(w.filter.bookmark(sent_rv.max(shared.store.resource_version()), false));
                }
                return Stop::Done;
            }
            _ = breaks.changed() => return Stop::Abort,
            ev = w.live.recv() => match ev {
                Ok(ev) => {
                    sent_rv = sent_rv.max(ev.rv);
                    if let Some(v) = w.filter.view(&ev) {
                        send!(v);
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => return Stop::Abort,
                Err(broadcast::error::RecvError::Closed) => return Stop::Done,
            },
            _ = tokio::time::sleep_until(next_bookmark), if bookmarks => {
                // Every event up to `rv` is already queued (they are queued
                // as they commit): send them before saying so.
                let rv = shared.store.resource_version();
                loop {
                    match w.live.try_recv() {
                        Ok(ev) => {
                            sent_rv = sent_rv.max(ev.rv);
                            if let Some(v) = w.filter.view(&ev) {
                                send!(v);
                            }
                        }
                        Err(broadcast::error::TryRecvError::Empty) => break,
                        Err(broadcast::error::TryRecvError::Lagged(_)) => return Stop::Abort,
                        Err(broadcast::error::TryRecvError::Closed) => return Stop::Done,
                    }
                }
                sent_rv = sent_rv.max(rv);
                send!(w.filter.bookmark(sent_rv, false));
                next_bookmark = Instant::now() + shared.bookmark_interval();
            }
        }
    }
}
