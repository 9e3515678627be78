//! xDS requests as istiod's ADS stream handler sees them: the request
//! body of one `StreamAggregatedResources` or `DeltaAggregatedResources`
//! stream, off the wire, against the sample mesh's push context.

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use common::grpc_stream::{DriveError, chunks, drive, frames};

use crate::model::{ConfigStore, RegistryOptions, Update, parse_file};
use crate::pushctx::context::IstioContext;
use crate::pushctx::{Proxy, PushContext, PushRequest, Updates};
use crate::xds::LISTENER_TYPE;
use crate::xds::server::{DiscoveryServer, XdsMetrics};

const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// How long a stream may take to end once its requests have ended.
const STREAM_END: Duration = Duration::from_secs(20);

/// The sample mesh (`samples/mesh`, `samples/ingress`), as files.
const SAMPLE: [(&str, &str); 5] = [
    (
        "namespace.yaml",
        include_str!("../../samples/mesh/namespace.yaml"),
    ),
    (
        "httpbin.yaml",
        include_str!("../../samples/mesh/httpbin.yaml"),
    ),
    ("sleep.yaml", include_str!("../../samples/mesh/sleep.yaml")),
    ("istio.yaml", include_str!("../../samples/mesh/istio.yaml")),
    (
        "ingress.yaml",
        include_str!("../../samples/ingress/ingress.yaml"),
    ),
];

struct Fixture {
    /// One stream at a time (tests call in parallel), so the connections
    /// left afterwards are this stream's.
    one_at_a_time: std::sync::Mutex<()>,
    runtime: tokio::runtime::Runtime,
    server: DiscoveryServer,
    snapshot: Arc<crate::model::Snapshot>,
    _ready: tokio::sync::watch::Sender<bool>,
    _pushes: tokio::sync::watch::Sender<Option<PushRequest>>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let store = ConfigStore::new();
        let objects = SAMPLE
            .iter()
            .flat_map(|(name, text)| match parse_file(name, text) {
                Ok(f) => f.objects,
                Err(e) => panic!("the sample {name} does not parse: {e:?}"),
            });
        if store
            .apply(objects.map(|o| Update::Upsert(Arc::new(o))))
            .is_none()
        {
            panic!("the sample changes nothing in an empty store");
        }
        let snapshot = store.snapshot();
        let ctx = IstioContext::new("fuzz".into(), &snapshot, &RegistryOptions::default())
            .with_cache(Arc::new(crate::pushctx::cache::XdsCache::disabled()), 0);
        let ctx: Arc<dyn PushContext> = Arc::new(ctx);
        let (ready, ready_rx) = tokio::sync::watch::channel(true);
        let (pushes, push_rx) = tokio::sync::watch::channel(Some(PushRequest::new(
            1,
            ctx,
            Updates::everything(),
            Instant::now(),
        )));
        let metrics = match XdsMetrics::new(&prometheus::Registry::new()) {
            Ok(m) => m,
            Err(e) => panic!("xDS metrics: {e}"),
        };
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => panic!("a runtime: {e}"),
        };
        Fixture {
            one_at_a_time: std::sync::Mutex::new(()),
            runtime,
            server: DiscoveryServer::new(ready_rx, push_rx, metrics, 10),
            snapshot,
            _ready: ready,
            _pushes: pushes,
        }
    })
}

/// One ADS stream: the first byte picks the protocol (bit 0: delta) and
/// whether the rest is the raw request body (bit 1 clear: gRPC frames as
/// they come off the wire) or a sequence of `u16`-length-prefixed request
/// messages framed here. The stream must end once its requests end (a hang
/// panics) and leave no connection registered; nothing may panic.
pub fn xds_requests(data: &[u8]) {
    let _ = xds_response(data);
}

/// What [`xds_requests`] gets back: the response body's bytes and the
/// final `grpc-status`, if any (`None` for an empty input).
pub fn xds_response(data: &[u8]) -> Option<(Vec<u8>, Option<String>)> {
    let (&mode, rest) = data.split_first()?;
    let path = if mode & 1 == 1 { DELTA_PATH } else { SOTW_PATH };
    let body = if mode & 2 == 0 {
        rest.to_vec()
    } else {
        frames(chunks(rest))
    };
    let f = fixture();
    let _one = f
        .one_at_a_time
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let answer = f.runtime.block_on(async {
        let mut service = f.server.clone().into_service();
        let answer = match drive(&mut service, path, body, STREAM_END).await {
            Err(e @ DriveError::Hung(_)) => panic!("{e}"),
            Err(_) => (Vec::new(), None),
            Ok(answer) => answer,
        };
        // The stream's task unregisters it as it ends; let it run.
        for _ in 0..100 {
            if f.server.connections().is_empty() {
                break;
            }
            tokio::task::yield_now().await;
        }
        answer
    });
    let left = f.server.connections();
    assert!(left.is_empty(), "streams left registered: {}", left.len());
    Some(answer)
}

/// A seed for [`xds_requests`]: `mode` and the request messages, encoded.
pub fn xds_seed(mode: u8, messages: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![mode];
    if mode & 2 == 0 {
        out.extend(frames(messages.iter().map(Vec::as_slice)));
    } else {
        for m in messages {
            out.extend_from_slice(&(m.len().min(u16::MAX as usize) as u16).to_be_bytes());
            out.extend_from_slice(m);
        }
    }
    out
}

/// The sample's sleep Pod as its sidecar connects.
fn sleep_proxy() -> &'static Proxy {
    static PROXY: OnceLock<Proxy> = OnceLock::new();
    PROXY.get_or_init(|| {
        let metadata = serde_json::json!({
            "NAMESPACE": "demo",
            "INSTANCE_IPS": "198.18.0.2",
            "LABELS": {"app": "sleep"},
            "DNS_CAPTURE": "true",
        });
        let serde_json::Value::Object(metadata) = metadata else {
            unreachable!("a JSON object literal")
        };
        let node = proto::pb::envoy::config::core::v3::Node {
            id: "sidecar~198.18.0.2~sleep-1.demo~demo.svc.cluster.local".into(),
            metadata: Some(common::node_metadata::json_to_struct(metadata)),
            ..Default::default()
        };
        match Proxy::from_node(&node) {
            Ok(p) => p,
            Err(e) => panic!("the sleep proxy: {e}"),
        }
    })
}

/// The listeners the sample mesh gives its sleep Pod under mesh config
/// `mesh` (what a mesh config edit changes at every proxy).
pub(super) fn listeners_under(mesh: crate::mesh::MeshConfig) {
    let (f, proxy) = (fixture(), sleep_proxy());
    let ctx = IstioContext::new("fuzz".into(), &f.snapshot, &RegistryOptions::default())
        .with_cache(Arc::new(crate::pushctx::cache::XdsCache::disabled()), 0)
        .with_mesh(mesh);
    let _ = ctx.generate(proxy, LISTENER_TYPE, &BTreeSet::new());
}
