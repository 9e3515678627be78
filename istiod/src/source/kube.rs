//! The Kubernetes config source: every kind istiod models, listed and
//! watched on the API server with kube-runtime's watcher (resource
//! versions, bookmarks, a relist after `410 Gone` or a broken watch), decoded
//! and validated by the same decoder as the file source
//! ([`crate::model::decode`]), and written to the store's `kubernetes` slice.
//!
//! One watcher task per kind decodes what it receives and hands it to one
//! task that owns the [`informer::Informers`] state and writes the store, so
//! updates reach the store in the order the API server sent them. Istio's
//! kinds are read as `DynamicObject`s at the first version of their group
//! the API serves (`networking.istio.io` v1, then v1beta1, v1alpha3;
//! `security.istio.io` v1, then v1beta1); a kind whose CRD is not installed
//! counts as synced and empty, and is looked for again every minute.
//!
//! The source has synced (Istio's `HasSynced`) once every kind has completed
//! its first list; istiod serves nothing before that.

pub(crate) mod gateway_deployment;
pub(crate) mod informer;
pub(crate) mod ip_allocate;
pub(crate) mod kubemesh;
pub(crate) mod status;
pub(crate) mod tag_watcher;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::runtime::watcher;
use tokio::sync::{mpsc, watch};

use informer::{Informers, Item};

use crate::kube::{Synced, run_watcher};
use crate::mesh::Mesh;
use crate::model::revision::InRevision;
use crate::model::{ConfigStore, Decoded, Kind, ObjectKey, decode, parse::DecodeError};

/// The store slice the Kubernetes source writes to.
pub const SLICE: &str = "kubernetes";

/// How often a kind whose CRD is missing is looked for again.
const CRD_RECHECK: Duration = Duration::from_secs(60);

/// The kinds the source watches: all of them.
pub const KINDS: [Kind; Kind::ALL.len()] = Kind::ALL;

/// The resource name (plural) of a kind.
pub fn plural(kind: Kind) -> &'static str {
    match kind {
        Kind::ServiceEntry => "serviceentries",
        Kind::WorkloadEntry => "workloadentries",
        Kind::WorkloadGroup => "workloadgroups",
        Kind::VirtualService => "virtualservices",
        Kind::DestinationRule => "destinationrules",
        Kind::Sidecar => "sidecars",
        Kind::Gateway => "gateways",
        Kind::EnvoyFilter => "envoyfilters",
        Kind::PeerAuthentication => "peerauthentications",
        Kind::AuthorizationPolicy => "authorizationpolicies",
        Kind::RequestAuthentication => "requestauthentications",
        Kind::Service => "services",
        Kind::EndpointSlice => "endpointslices",
        Kind::Pod => "pods",
        Kind::Namespace => "namespaces",
        Kind::Node => "nodes",
        Kind::GatewayClass => "gatewayclasses",
        Kind::KubernetesGateway => "gateways",
        Kind::HttpRoute => "httproutes",
        Kind::Secret => "secrets",
        Kind::Telemetry => "telemetries",
        Kind::ProxyConfig => "proxyconfigs",
        Kind::Ingress => "ingresses",
        Kind::IngressClass => "ingressclasses",
        Kind::ReferenceGrant => "referencegrants",
        Kind::TcpRoute => "tcproutes",
        Kind::TlsRoute => "tlsroutes",
        Kind::GrpcRoute => "grpcroutes",
        Kind::BackendTlsPolicy => "backendtlspolicies",
        Kind::ConfigMap => "configmaps",
        Kind::ListenerSet => "listenersets",
    }
}

/// The API resource of `kind` at `version` (no discovery needed).
pub fn api_resource(kind: Kind, version: &str) -> ApiResource {
    let group = kind.group();
    ApiResource {
        group: group.to_string(),
        version: version.to_string(),
        api_version: if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.as_str().to_string(),
        plural: plural(kind).to_string(),
    }
}

/// What a watcher task hands the informers' task.
#[derive(Debug)]
enum Event {
    Init(Kind),
    InitApply(Kind, Item),
    InitDone(Kind),
    Apply(Item),
    Delete(ObjectKey),
}

/// The running source. Cheap to clone.
#[derive(Debug, Clone)]
pub struct KubeSource {
    synced: Synced,
    rejected: Arc<Mutex<Vec<String>>>,
}

impl KubeSource {
    /// Starts watching every kind with `client`, writing to `store` (the
    /// source's slice), filtering namespaces with the current mesh config's
    /// `discoverySelectors`, until `shutdown` becomes true. Only config of
    /// `revision`, or of the `tags` pointing at it, reaches the store.
    pub fn start(
        client: kube::Client,
        store: ConfigStore,
        mesh: watch::Receiver<Arc<Mesh>>,
        revision: (InRevision, tag_watcher::Tags),
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let source = Self {
            synced: Synced::new(),
            rejected: Arc::default(),
        };
        let (tx, rx) = mpsc::channel(1024);
        for kind in KINDS {
            tokio::spawn(watch_kind(
                client.clone(),
                kind,
                tx.clone(),
                shutdown.clone(),
            ));
        }
        tokio::spawn(run_informers(
            rx,
            store,
            mesh,
            revision,
            source.clone(),
            shutdown,
        ));
        source
    }

    /// Whether every kind has completed its first list.
    pub fn has_synced(&self) -> bool {
        self.synced.has_synced()
    }

    /// Waits until every kind has completed its first list.
    pub async fn wait_synced(&self) {
        self.synced.wait().await
    }

    /// The objects rejected now, one line per problem (their last good
    /// versions keep serving).
    pub fn errors(&self) -> Vec<String> {
        self.rejected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The most watch events applied to the store as one batch.
const MAX_BATCH: usize = 1000;

fn handle(informers: &mut Informers, event: Event) -> Vec<crate::model::Update> {
    match event {
        Event::Init(kind) => {
            informers.init(kind);
            Vec::new()
        }
        Event::InitApply(kind, item) => {
            informers.init_apply(kind, item);
            Vec::new()
        }
        Event::InitDone(kind) => informers.init_done(kind),
        Event::Apply(item) => informers.apply(item),
        Event::Delete(key) => informers.delete(key),
    }
}

/// The task that owns the informers' state and writes the store.
async fn run_informers(
    mut rx: mpsc::Receiver<Event>,
    store: ConfigStore,
    mut mesh: watch::Receiver<Arc<Mesh>>,
    (revision, mut tags): (InRevision, tag_watcher::Tags),
    source: KubeSource,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut informers = Informers::new(mesh.borrow_and_update().clone())
        .with_revision(revision.with_tags(tags.borrow_and_update().clone()));
    let (mut mesh_open, mut tags_open) = (true, true);
    loop {
        let mut updates = tokio::select! {
            event = rx.recv() => match event {
                None => return,
                Some(event) => handle(&mut informers, event),
            },
            changed = mesh.changed(), if mesh_open => match changed {
                Ok(()) => informers.set_mesh(mesh.borrow_and_update().clone()),
                Err(_) => { mesh_open = false; continue }
            },
            changed = tags.changed(), if tags_open => match changed {
                Ok(()) => informers.set_revision(revision.with_tags(tags.borrow_and_update().clone())),
                Err(_) => { tags_open = false; continue }
            },
            _ = shutdown.wait_for(|s| *s) => return,
        };
        // What else is queued joins this batch: a burst of events (a
        // rollout, a relist) is one store change and one push, in order.
        for _ in 0..MAX_BATCH {
            match rx.try_recv() {
                Ok(event) => updates.extend(handle(&mut informers, event)),
                Err(_) => break,
            }
        }
        if !updates.is_empty() {
            store.apply(updates);
        }
        *source
            .rejected
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = informers.rejected();
        if !source.synced.has_synced() && KINDS.iter().all(|k| informers.has_synced(*k)) {
            tracing::info!(target: "kube", "every kind has completed its initial list");
            source.synced.mark();
        }
    }
}

/// Watches one kind, at the first version the API serves, for ever.
async fn watch_kind(
    client: kube::Client,
    kind: Kind,
    tx: mpsc::Sender<Event>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let version = match served_version(&client, kind, &mut shutdown).await {
            Err(Stopped) => return,
            Ok(Some(v)) => v,
            Ok(None) => {
                tracing::warn!(
                    target: "kube",
                    "{kind}: the API serves none of {} (is Istio's CRD installed?); treating it as empty and checking again every {CRD_RECHECK:?}",
                    kind.versions().iter().map(|v| format!("{}/{v}", kind.group())).collect::<Vec<_>>().join(", ")
                );
                for e in [Event::Init(kind), Event::InitDone(kind)] {
                    if tx.send(e).await.is_err() {
                        return;
                    }
                }
                if sleep_or_stop(CRD_RECHECK, &mut shutdown).await.is_err() {
                    return;
                }
                continue;
            }
        };
        let resource = api_resource(kind, version);
        tracing::info!(target: "kube", "watching {kind} ({})", resource.api_version);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let api_version = resource.api_version.clone();
        run_watcher(
            format!("{kind} ({api_version})"),
            api,
            watcher::Config::default(),
            &tx,
            |event| match event {
                watcher::Event::Init => Some(Event::Init(kind)),
                watcher::Event::InitApply(o) => {
                    decode_item(kind, &api_version, o).map(|i| Event::InitApply(kind, i))
                }
                watcher::Event::InitDone => Some(Event::InitDone(kind)),
                watcher::Event::Apply(o) => decode_item(kind, &api_version, o).map(Event::Apply),
                watcher::Event::Delete(o) => Some(Event::Delete(object_key(kind, &o.metadata))),
            },
            shutdown,
        )
        .await;
        return;
    }
}

/// Shutdown was asked for.
#[derive(Debug)]
pub struct Stopped;

async fn sleep_or_stop(d: Duration, shutdown: &mut watch::Receiver<bool>) -> Result<(), Stopped> {
    tokio::select! {
        _ = tokio::time::sleep(d) => Ok(()),
        _ = shutdown.wait_for(|s| *s) => Err(Stopped),
    }
}

/// The first version of `kind` the API serves: `None` when it serves none
/// (an Istio CRD not installed). Other errors are retried with backoff.
async fn served_version(
    client: &kube::Client,
    kind: Kind,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<&'static str>, Stopped> {
    if !kind.is_custom_resource() {
        return Ok(Some(kind.versions()[0]));
    }
    let mut delay = Duration::from_millis(500);
    'probe: loop {
        for version in kind.versions() {
            let api: Api<DynamicObject> =
                Api::all_with(client.clone(), &api_resource(kind, version));
            match api.list(&ListParams::default().limit(1)).await {
                Ok(_) => return Ok(Some(version)),
                Err(kube::Error::Api(s)) if s.code == 404 => continue,
                Err(e) => {
                    tracing::warn!(target: "kube", "{kind}: cannot reach the API to find its version: {e}; retrying in {delay:?}");
                    sleep_or_stop(delay, shutdown).await?;
                    delay = (delay * 2).min(Duration::from_secs(30));
                    continue 'probe;
                }
            }
        }
        return Ok(None);
    }
}

fn object_key(kind: Kind, meta: &kube::api::ObjectMeta) -> ObjectKey {
    let namespace = if kind.is_namespaced() {
        meta.namespace.as_deref().unwrap_or_default()
    } else {
        ""
    };
    ObjectKey::new(kind, namespace, meta.name.as_deref().unwrap_or_default())
}

/// Decodes and validates one object from the API, exactly as the file
/// source does a document. Objects of Kubernetes kinds lose their
/// `resourceVersion`, so that a change istiod does not read (a Pod's
/// conditions, a Node's heartbeat) is no change to the store.
fn decode_item(kind: Kind, api_version: &str, object: DynamicObject) -> Option<Item> {
    let key = object_key(kind, &object.metadata);
    let mut value = match serde_json::to_value(&object) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(target: "config", "rejected: Kubernetes {key}: {e}");
            return None;
        }
    };
    if let Some(map) = value.as_object_mut() {
        // List items of built-in kinds come without their type.
        map.insert("apiVersion".into(), api_version.into());
        map.insert("kind".into(), kind.as_str().into());
    }
    match decode(value) {
        Ok(Decoded::Object(mut o)) => {
            o.metadata.resource_version = None;
            Some(Item::Object(Arc::new(o)))
        }
        Ok(Decoded::Ignored { .. } | Decoded::Empty) => None,
        Err(DecodeError::Object { key, errors }) => Some(Item::Rejected { key, errors }),
        Err(DecodeError::Document(reason)) => {
            tracing::warn!(target: "config", "rejected: Kubernetes {key}: {reason}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dynamic(json: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn decodes_api_objects_with_the_file_decoder() {
        // A Pod as a list item: no apiVersion or kind.
        let pod = dynamic(serde_json::json!({
            "metadata": {"name": "p", "namespace": "demo", "resourceVersion": "42",
                         "uid": "u", "managedFields": []},
            "spec": {"serviceAccountName": "sleep", "containers": [{"name": "c", "image": "x"}]},
            "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
        }));
        let Some(Item::Object(o)) = decode_item(Kind::Pod, "v1", pod) else {
            panic!("not decoded");
        };
        assert_eq!(o.key().to_string(), "Pod/demo/p");
        assert_eq!(o.metadata.resource_version, None);

        // An invalid VirtualService names its field, as in a file.
        let vs = dynamic(serde_json::json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "VirtualService",
            "metadata": {"name": "r", "namespace": "demo"},
            "spec": {"hosts": ["a"], "http": [{"route": [
                {"destination": {"host": "a", "subset": "v1"}, "weight": 80},
                {"destination": {"host": "a", "subset": "v2"}, "weight": 30}]}]},
        }));
        let Some(Item::Rejected { key, errors }) =
            decode_item(Kind::VirtualService, "networking.istio.io/v1", vs)
        else {
            panic!("not rejected");
        };
        assert_eq!(key.to_string(), "VirtualService/demo/r");
        assert_eq!(errors[0].field, "spec.http[0].route[1].weight");
    }

    #[test]
    fn resources_are_named_as_the_api_serves_them() {
        let r = api_resource(Kind::PeerAuthentication, "v1beta1");
        assert_eq!(r.api_version, "security.istio.io/v1beta1");
        assert_eq!(r.plural, "peerauthentications");
        let r = api_resource(Kind::EndpointSlice, "v1");
        assert_eq!(r.api_version, "discovery.k8s.io/v1");
        assert_eq!(api_resource(Kind::Node, "v1").api_version, "v1");
    }
}
