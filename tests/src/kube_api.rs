//! A Kubernetes API server stand-in for end-to-end tests: istiod (or any
//! kube-rs client) is pointed at it through a kubeconfig, and the test
//! shapes the cluster and the failures it sees.
//!
//! It follows the API's published semantics
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/>):
//!
//! - Plain HTTP/1.1 on a listener the caller binds (127.0.0.1:0, or inside a
//!   network namespace), served by its own tokio runtime; stops on drop.
//! - Core `v1` namespaces, nodes, services, endpoints, pods, configmaps,
//!   secrets, serviceaccounts; `discovery.k8s.io/v1` endpointslices;
//!   `admissionregistration.k8s.io/v1` mutatingwebhookconfigurations and
//!   validatingwebhookconfigurations;
//!   `apiextensions.k8s.io/v1` customresourcedefinitions (read-only, one per
//!   Istio resource, established); the Istio resources at the versions
//!   Istio's CRDs serve (`networking.istio.io` v1/v1beta1/v1alpha3,
//!   envoyfilters v1alpha3 only, proxyconfigs v1beta1 only;
//!   `security.istio.io` v1/v1beta1; `telemetry.istio.io` v1/v1alpha1;
//!   `extensions.istio.io` wasmplugins v1alpha1). An object written under
//!   one version is served under every version of its resource, only
//!   `apiVersion` rewritten (a CRD's conversion `None`).
//! - Discovery: `/api`, `/api/v1`, `/apis`, `/apis/{group}`,
//!   `/apis/{group}/{version}`, `/version`; aggregated discovery
//!   (`apidiscovery.k8s.io` v2 and v2beta1) on `/api` and `/apis` when
//!   `Accept` asks for it; `/healthz`, `/livez`, `/readyz`.
//! - One global resourceVersion; the server sets `resourceVersion`, `uid`,
//!   `creationTimestamp`, `generation` (on Istio resources, CRDs and
//!   EndpointSlices, bumped when anything but metadata and status changes),
//!   `metadata.namespace` from the path, and a Namespace's
//!   `kubernetes.io/metadata.name` label, `spec.finalizers` and
//!   `status.phase: Active`.
//! - GET, LIST (`labelSelector` with `=`, `==`, `!=`, `in`, `notin`, exists,
//!   `!`; `fieldSelector` on `metadata.name`, `metadata.namespace` and the
//!   per-type fields the API supports for pods, services, secrets, nodes and
//!   namespaces; `limit` and `continue` from a consistent snapshot;
//!   `resourceVersion` + `resourceVersionMatch` as the API has them:
//!   `Exact` older than the history is 410, newer than the server 504),
//!   WATCH (`watch=1|true`, `resourceVersion`, `allowWatchBookmarks`,
//!   `timeoutSeconds`, `sendInitialEvents` with the
//!   `k8s.io/initial-events-end` bookmark; newline-delimited
//!   `{"type","object"}` events; a version older than the history gets an
//!   `ERROR` event with a 410 `Expired` Status; objects moving into or out
//!   of a selector are `ADDED`/`DELETED`; periodic bookmarks), CREATE (409
//!   `AlreadyExists`, `generateName`, 404 when the namespace does not
//!   exist), UPDATE (409 `Conflict` on a stale resourceVersion), PATCH
//!   (merge; strategic merge applied as merge; server-side apply as
//!   create-or-merge, `fieldManager` required), DELETE (404 when missing,
//!   uid/resourceVersion preconditions), DELETE of a collection, the
//!   `/status` subresource of the types that have one (writes to the main
//!   resource leave status alone). A write that changes nothing commits
//!   nothing. Errors are `Status` objects with the API's code, reason and
//!   message.
//! - Dynamic admission
//!   (<https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/>)
//!   on every CREATE, UPDATE (PUT, PATCH, `/status` as subresource `status`)
//!   and DELETE of one object over HTTP: the webhooks of every
//!   MutatingWebhookConfiguration (configurations by name, webhooks in
//!   order), then those of every ValidatingWebhookConfiguration, each where
//!   its `rules` (operations, groups, versions, resources with `*` and
//!   subresources, scope), `namespaceSelector` (a Namespace's own labels for
//!   a Namespace) and `objectSelector` (new or old object) match. Each is
//!   sent an `admission.k8s.io/v1` AdmissionReview (`uid`, `kind`,
//!   `resource`, `subResource`, `requestKind`, `requestResource`, `name`,
//!   `namespace`, `operation`, `userInfo`, `object`, `oldObject`, `dryRun`,
//!   `options`) as an HTTP/1.1 POST over TLS to `clientConfig.url` or to
//!   `clientConfig.service` (at the address [`KubeApi::set_service_address`]
//!   gives it; server name `<name>.<namespace>.svc`), verified against
//!   `caBundle`, within `timeoutSeconds` (default 10), `?timeout=<n>s`
//!   appended as the API does. A denial rejects the request with the
//!   webhook's status (`admission webhook "<name>" denied the request:
//!   <message>`, code 400 unless it gives one of 400 or more); a mutating
//!   webhook's `JSONPatch` (RFC 6902) changes the object the next webhooks
//!   and the store see; `warnings` become `Warning: 299 - "<text>"` headers;
//!   a webhook that cannot be called or answers wrongly rejects the request
//!   with a 500 `failed calling webhook "<name>": ...` unless its
//!   `failurePolicy` is `Ignore`. A PATCH is admitted as the object it
//!   makes (an apply that creates as a CREATE) and written only if the
//!   stored object did not change meanwhile (else admitted again, up to 5
//!   times). Webhook configurations themselves are never admitted, as in
//!   the API. Every call is listed by [`KubeApi::admission_calls`].
//! - `POST /apis/authentication.k8s.io/v1/tokenreviews`, answered by a
//!   function the test sets.
//! - Test controls: direct writes with the same events as over HTTP (but
//!   no admission: they are the test's hand in the store, as a write to
//!   etcd would be; [`KubeApi::create_admitted`] creates as over HTTP,
//!   admission included),
//!   `break_watches`, `compact`, latency, unreachability, a request log.
//!
//! ```no_run
//! use serde_json::json;
//! use tests::kube_api::KubeApi;
//!
//! let api = KubeApi::start_local(); // or KubeApi::start(listener bound in a netns)
//! api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}))
//!     .unwrap();
//! let dir = tempfile::tempdir().unwrap();
//! api.kubeconfig(&dir.path().join("kubeconfig")); // istiod discovery --kubeconfig=<that path>
//! ```
//!
//! What it does NOT do:
//!
//! - No TLS, no HTTP/2, no protobuf or CBOR (JSON only; YAML accepted in
//!   request bodies), no `Table` output; `Accept` is honoured only for
//!   `PartialObjectMetadata(List)` and aggregated discovery.
//! - No authentication or authorization of clients: any bearer token, or
//!   none, is accepted (it is recorded); no RBAC, no impersonation.
//! - No admission plugins but the webhooks above and the namespace-exists
//!   check on create (no defaulting beyond the fields listed above, no
//!   quota, limit ranges or pod security). Of webhook admission: no
//!   admission on the test's direct writes (but `create_admitted`) or on
//!   DELETE of a collection;
//!   `reinvocationPolicy` is ignored (no webhook is called twice);
//!   `matchConditions` are ignored (every condition taken as true);
//!   `matchPolicy: Equivalent` is treated as `Exact` (no conversion to a
//!   version a rule names); validating webhooks are called one after the
//!   other, not in parallel, and the first denial ends the request; a
//!   webhook's patch of a DELETE is ignored; only `admission.k8s.io/v1`
//!   reviews are sent; an empty `caBundle` fails verification (no system
//!   trust store); a service's `port` is not mapped to a target port (the
//!   address set for the service is called); `userInfo` is a fixed cluster
//!   administrator (clients are not authenticated); the configurations are
//!   not validated when written (an unparsable selector fails the call as
//!   its `failurePolicy` says); webhooks see the object before the server
//!   sets `uid`, `creationTimestamp` or a generated name.
//! - No schema validation: objects are stored as any JSON; names are not
//!   checked against DNS rules; no CRD schemas, no CRD registration (the
//!   resource set is fixed), no conversion webhooks.
//! - No JSON patch (`application/json-patch+json` is 415), no strategic
//!   merge semantics (list merge keys, `$patch` directives: lists are
//!   replaced), no field managers: apply does not track `managedFields`,
//!   never conflicts, and cannot remove fields it set before.
//! - No `dryRun` (refused with 400, rather than silently persisted).
//! - No garbage collection, owner references, finalizers or graceful
//!   deletion: DELETE removes the object at once; deleting a Namespace
//!   leaves the objects in it.
//! - No controllers: no Endpoints/EndpointSlices from Pods, no ClusterIP
//!   allocation, no `kube-root-ca.crt` ConfigMaps, no default
//!   ServiceAccounts; Namespaces `default`, `kube-system`, `kube-public` and
//!   `kube-node-lease` exist at start.
//! - No OpenAPI documents (`/openapi/v2`, `/openapi/v3`), no `/logs`,
//!   `exec`, `proxy`, `scale`, `eviction` or other subresources than
//!   `status`.
//! - GET ignores `resourceVersion` (always the current object); the
//!   legacy `/api/v1/watch/...` paths are not served.
//! - A watch has no server-side time limit unless `timeoutSeconds` asks
//!   for one (the API picks one of 30 to 60 minutes); a watch from a
//!   resourceVersion newer than the server's is not refused but waits for
//!   it; a watcher more than 16,384 events behind is cut, as the API cuts
//!   slow watchers.
//! - `set_unreachable` does not refuse connections (the listener stays
//!   bound): each is accepted and shut down at once, and open ones are cut.
//! - Lists include `kind` and `apiVersion` in every item (the API omits them
//!   for built-in types; clients accept both).

mod admission;
mod resources;
mod selector;
mod server;
mod status;
mod store;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::Value;

pub use admission::{AdmissionCall, WebhookOutcome};
pub use resources::{RESOURCES, Resource};
pub use status::Status;
use store::{Scope, Store};

/// One HTTP request the server received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path, e.g. `/api/v1/namespaces/istio-system/configmaps`.
    pub path: String,
    /// The raw query string (empty when none).
    pub query: String,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// The bearer token the client sent, if any.
    pub bearer: Option<String>,
    /// The status code answered; `None` when the connection was cut
    /// without an answer (or the answer is still being made).
    pub status: Option<u16>,
}

impl RequestRecord {
    /// The decoded value of query parameter `name`.
    pub fn param(&self, name: &str) -> Option<String> {
        form_urlencoded::parse(self.query.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    }

    /// Whether this was a WATCH.
    pub fn is_watch(&self) -> bool {
        self.method == "GET" && matches!(self.param("watch").as_deref(), Some("1" | "true"))
    }

    /// Whether this was a LIST (a GET of a collection that is not a watch):
    /// `resource` is the plural name the path ends with.
    pub fn is_list_of(&self, resource: &str) -> bool {
        self.method == "GET" && !self.is_watch() && self.path.ends_with(&format!("/{resource}"))
    }
}

/// The user a token authenticates as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenUser {
    /// `system:serviceaccount:<ns>:<sa>` for a service account.
    pub username: String,
    /// The user's uid.
    pub uid: String,
    /// Groups.
    pub groups: Vec<String>,
    /// The audiences (of those asked for) the token is valid for.
    pub audiences: Vec<String>,
    /// Extra attributes (e.g. `authentication.kubernetes.io/pod-name`).
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The answer to a TokenReview.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenReviewAnswer {
    /// The token is valid for this user.
    Authenticated(TokenUser),
    /// The token is not valid; the message is `status.error`.
    Unauthenticated(String),
}

impl TokenReviewAnswer {
    /// A service account's token valid for `audiences`, with the groups the
    /// API gives service accounts.
    pub fn service_account(namespace: &str, name: &str, audiences: &[String]) -> Self {
        TokenReviewAnswer::Authenticated(TokenUser {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            uid: uuid::Uuid::new_v4().hyphenated().to_string(),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
            audiences: audiences.to_vec(),
            extra: BTreeMap::new(),
        })
    }
}

/// A TokenReview the server answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenReviewRecord {
    /// `spec.token`.
    pub token: String,
    /// `spec.audiences`.
    pub audiences: Vec<String>,
}

/// Answers TokenReviews: (token, audiences asked for) to the answer.
pub type TokenReviewFn = Arc<dyn Fn(&str, &[String]) -> TokenReviewAnswer + Send + Sync>;

/// The running stand-in. Stops (closing every connection) on drop.
pub struct KubeApi {
    shared: Arc<server::Shared>,
    rt: Option<tokio::runtime::Runtime>,
}

/// The bearer token [`KubeApi::kubeconfig`] writes.
pub const TOKEN: &str = "kube-api-stand-in-token";

/// The Namespaces that exist at start, as in a new cluster.
const INITIAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

fn resolve(api_version: &str, kind: &str) -> Result<(&'static Resource, &'static str), Status> {
    resources::by_kind(api_version, kind).ok_or_else(|| {
        Status::no_route(&format!(
            "no matches for kind {kind:?} in version {api_version:?}"
        ))
    })
}

/// The resource, version, namespace and name of a test's object.
fn place(obj: &Value) -> Result<(&'static Resource, &'static str, String), Status> {
    let av = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    let (res, version) = resolve(av, kind)?;
    let ns = if res.namespaced {
        store::meta_str(obj, "namespace")
            .filter(|s| !s.is_empty())
            .unwrap_or("default")
            .to_string()
    } else {
        String::new()
    };
    Ok((res, version, ns))
}

impl KubeApi {
    /// Serves on `listener` (made non-blocking here) from a runtime thread of
    /// its own. Bind the listener where the clients can reach it: inside a
    /// network namespace, bind it on a thread that entered the namespace.
    pub fn start(listener: std::net::TcpListener) -> KubeApi {
        let addr = listener.local_addr().expect("the listener has an address");
        listener
            .set_nonblocking(true)
            .expect("the listener can be made non-blocking");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kube-api")
            .enable_all()
            .build()
            .expect("a tokio runtime for the API server stand-in");
        let shared = Arc::new(server::Shared::new(addr, Store::new()));
        for ns in INITIAL_NAMESPACES {
            shared
                .store
                .create(
                    resources::by_kind("v1", "Namespace")
                        .expect("Namespace is served")
                        .0,
                    "v1",
                    "",
                    serde_json::json!({"metadata": {"name": ns}}),
                    Scope::Whole,
                )
                .expect("a new store has no namespaces");
        }
        let crd_res = resources::by_kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
            .expect("CRDs are served")
            .0;
        for crd in resources::crds() {
            shared
                .store
                .create(crd_res, "v1", "", crd, Scope::Whole)
                .expect("a new store has no CRDs");
        }
        let listener = {
            let _guard = rt.enter();
            tokio::net::TcpListener::from_std(listener).expect("the listener joins the runtime")
        };
        rt.spawn(server::serve(listener, shared.clone()));
        KubeApi {
            shared,
            rt: Some(rt),
        }
    }

    /// Serves on 127.0.0.1 on a free port.
    pub fn start_local() -> KubeApi {
        KubeApi::start(std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0"))
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// Writes a kubeconfig for this server (one cluster `http://<addr>`, a
    /// user with bearer token [`TOKEN`], the current context naming both,
    /// namespace `default`), as `kubectl` and kube-rs's
    /// `Config::from_custom_kubeconfig` read it.
    pub fn kubeconfig(&self, path: &Path) {
        let text = format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: stand-in\n  cluster:\n    server: {url}\n\
             users:\n\
             - name: stand-in\n  user:\n    token: {TOKEN}\n\
             contexts:\n\
             - name: stand-in\n  context:\n    cluster: stand-in\n    user: stand-in\n    namespace: default\n\
             current-context: stand-in\n\
             preferences: {{}}\n",
            url = self.url()
        );
        std::fs::write(path, text)
            .unwrap_or_else(|e| panic!("cannot write kubeconfig {}: {e}", path.display()));
    }

    /// Creates `obj` (its `apiVersion`, `kind`, `metadata.namespace`,
    /// default `default`), status included: 409 if it exists.
    pub fn create(&self, obj: Value) -> Result<Value, Status> {
        let (res, version, ns) = place(&obj)?;
        self.shared
            .store
            .create(res, version, &ns, obj, Scope::Whole)
    }

    /// Creates `obj` as a client over HTTP would (`POST`): the namespace
    /// must exist, `status` is dropped, and the admission webhooks are
    /// called, so the object stored (and returned) is the admitted one. Runs
    /// on the stand-in's runtime, so it can be awaited from any runtime, or
    /// from a plain thread with `futures::executor::block_on`.
    pub async fn create_admitted(&self, obj: Value) -> Result<Value, Status> {
        let (res, version, ns) = place(&obj)?;
        let shared = self.shared.clone();
        let rt = self.rt.as_ref().expect("the runtime runs until drop");
        let task = rt.spawn(async move {
            if res.namespaced && !shared.store.namespace_exists(&ns) {
                return Err(server::namespace_missing(&ns));
            }
            let q = server::Query::new();
            server::create_admitted(&shared, res, version, &ns, obj, &q, &mut Vec::new()).await
        });
        task.await
            .unwrap_or_else(|e| Err(Status::internal(format!("the create was cut: {e}"))))
    }

    /// Creates `obj`, or merges it into the existing object (as a merge
    /// patch, status included).
    pub fn apply(&self, obj: Value) -> Result<Value, Status> {
        let (res, version, ns) = place(&obj)?;
        let name = store::meta_str(&obj, "name")
            .unwrap_or_default()
            .to_string();
        self.shared
            .store
            .patch(
                res,
                version,
                &ns,
                &name,
                store::PatchKind::Apply,
                obj,
                Scope::Whole,
            )
            .map(|(o, _)| o)
    }

    /// Replaces `obj` (409 if it carries a stale `resourceVersion`; none
    /// replaces unconditionally), status included.
    pub fn update(&self, obj: Value) -> Result<Value, Status> {
        let (res, version, ns) = place(&obj)?;
        let name = store::meta_str(&obj, "name")
            .unwrap_or_default()
            .to_string();
        self.shared
            .store
            .update(res, version, &ns, &name, obj, Scope::Whole)
    }

    /// Deletes an object (`namespace` is `""` for cluster-scoped kinds).
    pub fn delete(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Value, Status> {
        let (res, version) = resolve(api_version, kind)?;
        self.shared
            .store
            .delete(res, version, namespace, name, &Value::Null)
    }

    /// The object, as served under `api_version`.
    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let (res, version) = resolve(api_version, kind).ok()?;
        self.shared.store.get(res, version, namespace, name).ok()
    }

    /// The objects of a kind, in one namespace or (`None`) all.
    pub fn list(&self, api_version: &str, kind: &str, namespace: Option<&str>) -> Vec<Value> {
        let Ok((res, version)) = resolve(api_version, kind) else {
            return Vec::new();
        };
        self.shared
            .store
            .list(res, version, namespace, &store::ListOptions::default())
            .ok()
            .and_then(|l| l.get("items").and_then(Value::as_array).cloned())
            .unwrap_or_default()
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.resource_version()
    }

    /// Ends every open watch stream at once, mid-stream (the chunked body is
    /// cut without its last chunk), as a restarting API server or a dropped
    /// connection does.
    pub fn break_watches(&self) {
        self.shared.breaks.send_modify(|n| *n += 1);
    }

    /// Drops the event history: a watch or exact list from any earlier
    /// resourceVersion is then 410 Gone, as after etcd's compaction.
    pub fn compact(&self) {
        self.shared.store.compact();
    }

    /// Keeps at most `n` events for watches to resume from (default
    /// 10,000).
    pub fn set_history_limit(&self, n: usize) {
        self.shared.store.set_history_limit(n);
    }

    /// How often a watch that allows bookmarks gets one (default 1 s).
    pub fn set_bookmark_interval(&self, d: Duration) {
        *self.shared.bookmark_interval.lock().expect("not poisoned") = d;
    }

    /// Delays every answer (and the start of every watch) by `d`.
    pub fn set_latency(&self, d: Duration) {
        *self.shared.latency.lock().expect("not poisoned") = d;
    }

    /// While `true`, every connection, open or new, is cut. Anything
    /// committed after this returns reaches no client until it is `false`
    /// again, however soon.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.shared.unreachable.send_replace(unreachable);
        if unreachable {
            self.shared.cuts.send_modify(|g| *g += 1);
        }
    }

    /// Sets how TokenReviews are answered (by default every token is
    /// invalid): `Arc::new(|token: &str, audiences: &[String]| ...)`.
    pub fn set_token_review(&self, f: TokenReviewFn) {
        *self.shared.token_review.lock().expect("not poisoned") = f;
    }

    /// The TokenReviews answered so far.
    pub fn token_reviews(&self) -> Vec<TokenReviewRecord> {
        self.shared
            .token_reviews
            .lock()
            .expect("not poisoned")
            .clone()
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.requests.lock().expect("not poisoned").clone()
    }

    /// Forgets the requests received so far.
    pub fn clear_requests(&self) {
        self.shared.requests.lock().expect("not poisoned").clear();
    }

    /// Routes admission webhooks' `clientConfig.service` `namespace/name` to
    /// `addr` (the endpoint: the service's `port` is not mapped, whatever it
    /// says, the call goes to `addr`). The certificate is still verified
    /// for `<name>.<namespace>.svc`. Webhooks are called from the network
    /// namespace [`KubeApi::start`] was called in.
    pub fn set_service_address(&self, namespace: &str, name: &str, addr: SocketAddr) {
        self.shared
            .admission
            .set_service_address(namespace, name, addr);
    }

    /// Every admission webhook call made so far, in order.
    pub fn admission_calls(&self) -> Vec<AdmissionCall> {
        self.shared.admission.calls()
    }

    /// Forgets the admission webhook calls made so far.
    pub fn clear_admission_calls(&self) {
        self.shared.admission.clear_calls();
    }

    /// The number of watch streams open now.
    pub fn watch_count(&self) -> usize {
        self.shared.open_watches.load(Ordering::SeqCst)
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            // Not `drop(rt)`: that blocks, and panics inside an async test.
            rt.shutdown_background();
        }
    }
}
