//! A simulated proxy: an ADS client that subscribes as Envoy does and ACKs
//! every response at once. State of the world: CDS and LDS as wildcards,
//! then EDS for the EDS clusters it was sent and RDS for the route
//! configurations its listeners name. Delta: the same subscriptions, kept
//! up to date from what each response adds and removes. Responses are not
//! decoded beyond what choosing the next subscription needs.
//!
//! A stream refused for the rate limit (`RESOURCE_EXHAUSTED`) or ended by
//! istiod is retried with a jittered backoff, as Envoy retries.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::NodeMetadata;
use prost::Message;
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::config::listener::v3::Listener;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager,
};
use proto::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::wire::{DeltaResponse, RawAny, Request, Response};

const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// CDS.
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// EDS.
pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// LDS.
pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// RDS.
pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";

/// The four types, by index (`Ack::kind`).
pub const TYPES: [&str; 4] = [CLUSTER, ENDPOINT, LISTENER, ROUTE];

/// Who a simulated proxy is.
#[derive(Debug, Clone)]
pub struct ProxySpec {
    /// Its index in the run.
    pub index: usize,
    /// Its xDS node id (`sidecar~<ip>~<pod>.<ns>~<ns>.svc.cluster.local`).
    pub node_id: String,
    /// Its namespace.
    pub namespace: String,
    /// Its IP.
    pub ip: String,
    /// Its workload labels.
    pub labels: Vec<(String, String)>,
    /// Its service account.
    pub service_account: String,
    /// Delta xDS rather than state of the world.
    pub delta: bool,
}

impl ProxySpec {
    fn node(&self) -> Node {
        // What pilot-agent sends for a sidecar, in the shared typed metadata.
        let metadata = NodeMetadata {
            namespace: Some(self.namespace.clone()),
            instance_ips: Some(vec![self.ip.clone()]),
            service_account: Some(self.service_account.clone()),
            istio_version: Some("1.28.0".into()),
            cluster_id: Some("Kubernetes".into()),
            labels: Some(self.labels.iter().cloned().collect()),
            // A proxy, not a debug client (Istio's `isProxy`).
            proxy_config: Some(serde_json::Map::new()),
            ..Default::default()
        };
        Node {
            id: self.node_id.clone(),
            metadata: Some(metadata.to_struct()),
            ..Default::default()
        }
    }
}

/// What a proxy reports.
#[derive(Debug, Clone)]
pub enum Event {
    /// It ACKed a response.
    Ack(Ack),
    /// Its stream ended (it will retry).
    Ended {
        /// The proxy.
        proxy: usize,
        /// Why.
        error: String,
    },
}

/// One ACK.
#[derive(Debug, Clone)]
pub struct Ack {
    /// The proxy.
    pub proxy: usize,
    /// The index of the type in [`TYPES`].
    pub kind: usize,
    /// The response's version (`version_info` or `system_version_info`).
    pub version: Arc<str>,
    /// Resources in the response.
    pub resources: usize,
    /// Bytes of the resources.
    pub bytes: usize,
    /// The stream generation (see [`run_proxy`]'s `reconnect`).
    pub generation: u64,
    /// When the ACK was sent.
    pub at: Instant,
    /// Whether the proxy now has every type it subscribed to.
    pub synced: bool,
    /// Each resource's name and a hash of its bytes, when the settings ask
    /// for them (tests).
    pub names: Vec<(String, u64)>,
}

/// Reads a varint at `*i`.
fn varint(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*i)?;
        *i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// One top-level field of a protobuf message.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Other,
}

/// The top-level fields of an encoded message, in order; stops at the
/// first malformed one.
fn fields(b: &[u8]) -> impl Iterator<Item = (u64, Field<'_>)> {
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= b.len() {
            return None;
        }
        let key = varint(b, &mut i)?;
        let field = match key & 7 {
            0 => Field::Varint(varint(b, &mut i)?),
            1 => {
                i += 8;
                Field::Other
            }
            2 => {
                let len = varint(b, &mut i)? as usize;
                let end = i.checked_add(len)?;
                let bytes = b.get(i..end)?;
                i = end;
                Field::Bytes(bytes)
            }
            5 => {
                i += 4;
                Field::Other
            }
            _ => return None,
        };
        Some((key >> 3, field))
    })
}

/// A cluster's name and whether it is an EDS cluster, from its top-level
/// fields only (`name` 1, `type` 2: EDS is 3).
pub fn cluster_summary(b: &[u8]) -> Option<(String, bool)> {
    let (mut name, mut eds) = (None, false);
    for (n, f) in fields(b) {
        match (n, f) {
            (1, Field::Bytes(v)) => name = Some(String::from_utf8_lossy(v).to_string()),
            (2, Field::Varint(t)) => eds = t == 3,
            _ => {}
        }
    }
    Some((name?, eds))
}

/// A resource's name: field 1 of a cluster, listener or route
/// configuration, and a load assignment's `cluster_name`.
fn resource_name(value: &[u8]) -> String {
    fields(value)
        .find_map(|(n, f)| match (n, f) {
            (1, Field::Bytes(v)) => Some(String::from_utf8_lossy(v).to_string()),
            _ => None,
        })
        .unwrap_or_default()
}

/// The route configurations a listener's HTTP connection managers name.
pub fn route_names(listener: &[u8], out: &mut BTreeSet<String>) {
    let Ok(l) = Listener::decode(listener) else {
        return;
    };
    let chains = l.filter_chains.iter().chain(l.default_filter_chain.iter());
    for f in chains.flat_map(|c| &c.filters) {
        use proto::pb::envoy::config::listener::v3::filter::ConfigType;
        let Some(ConfigType::TypedConfig(tc)) = &f.config_type else {
            continue;
        };
        if tc.type_url != HCM {
            continue;
        }
        if let Ok(hcm) = HttpConnectionManager::decode(tc.value.as_slice())
            && let Some(http_connection_manager::RouteSpecifier::Rds(rds)) = hcm.route_specifier
        {
            out.insert(rds.route_config_name);
        }
    }
}

fn status_text(s: tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

fn type_index(type_url: &str) -> Option<usize> {
    TYPES.iter().position(|t| *t == type_url)
}

/// What one proxy holds and wants.
#[derive(Default)]
struct State {
    eds: BTreeSet<String>,
    rds: BTreeSet<String>,
    /// `eds` and `rds` as the requests carry them.
    eds_names: Arc<Vec<String>>,
    rds_names: Arc<Vec<String>>,
    acked: [bool; 4],
    /// Delta: the clusters held, and which are EDS.
    clusters: HashMap<String, bool>,
    listeners: HashMap<String, BTreeSet<String>>,
}

impl State {
    fn synced(&self) -> bool {
        self.acked[0]
            && self.acked[2]
            && (self.eds.is_empty() || self.acked[1])
            && (self.rds.is_empty() || self.acked[3])
    }
}

/// Settings shared by every proxy of a run.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// Largest response accepted.
    pub max_message: usize,
    /// Report each resource's name and content hash with its ACK.
    pub record_names: bool,
}

impl Default for ClientSettings {
    fn default() -> Self {
        Self {
            max_message: 256 * 1024 * 1024,
            record_names: false,
        }
    }
}

fn content_hash(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// Runs one proxy until `stop` is set: connects, syncs, ACKs, and
/// reconnects on failure or whenever `reconnect` changes (a reconnect storm).
pub async fn run_proxy(
    spec: ProxySpec,
    channel: Channel,
    settings: ClientSettings,
    events: mpsc::UnboundedSender<Event>,
    mut reconnect: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(250);
    loop {
        if *stop.borrow() {
            return;
        }
        let generation = *reconnect.borrow_and_update();
        let attempt = stream(&spec, channel.clone(), &settings, &events, generation);
        // A run that drops its reconnect sender asks for no more reconnects.
        let reconnected = async {
            if reconnect.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let outcome = tokio::select! {
            r = attempt => r,
            _ = reconnected => Err("reconnect".to_string()),
            _ = stop.changed() => return,
        };
        let wait = match outcome {
            Ok(()) => {
                backoff = Duration::from_millis(250);
                Duration::from_millis(100)
            }
            Err(e) if e == "reconnect" => Duration::ZERO,
            Err(error) => {
                let _ = events.send(Event::Ended {
                    proxy: spec.index,
                    error,
                });
                backoff = (backoff * 2).min(Duration::from_secs(4));
                backoff.mul_f64(0.5 + rand::random::<f64>() / 2.0)
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
    }
}

async fn stream(
    spec: &ProxySpec,
    channel: Channel,
    settings: &ClientSettings,
    events: &mpsc::UnboundedSender<Event>,
    generation: u64,
) -> Result<(), String> {
    let client = tonic::client::Grpc::new(channel).max_decoding_message_size(settings.max_message);
    if spec.delta {
        delta(spec, client, settings, events, generation).await
    } else {
        sotw(spec, client, settings, events, generation).await
    }
}

/// One response as the ACK reports it.
struct Received<'a> {
    kind: usize,
    version: &'a str,
    resources: &'a [RawAny],
    /// The names, for delta responses (state of the world decodes them).
    names: Option<Vec<String>>,
}

fn ack_event(
    spec: &ProxySpec,
    settings: &ClientSettings,
    r: Received<'_>,
    state: &State,
    generation: u64,
) -> Event {
    let names = if settings.record_names {
        r.resources
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let name = match &r.names {
                    Some(n) => n.get(i).cloned().unwrap_or_default(),
                    None => resource_name(&a.value),
                };
                (name, content_hash(&a.value))
            })
            .collect()
    } else {
        Vec::new()
    };
    Event::Ack(Ack {
        proxy: spec.index,
        kind: r.kind,
        version: r.version.into(),
        resources: r.resources.len(),
        bytes: r.resources.iter().map(|a| a.value.len()).sum(),
        generation,
        at: Instant::now(),
        synced: state.synced(),
        names,
    })
}

type Grpc = tonic::client::Grpc<Channel>;

/// Opens a stream on `path` with the light messages.
async fn open<Req, Resp>(
    client: &mut Grpc,
    path: &'static str,
    requests: impl tokio_stream::Stream<Item = Req> + Send + 'static,
) -> Result<tonic::Streaming<Resp>, String>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    client
        .ready()
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    Ok(client
        .streaming(tonic::Request::new(requests), path, codec)
        .await
        .map_err(status_text)?
        .into_inner())
}

async fn sotw(
    spec: &ProxySpec,
    mut client: Grpc,
    settings: &ClientSettings,
    events: &mpsc::UnboundedSender<Event>,
    generation: u64,
) -> Result<(), String> {
    let (tx, rx) = mpsc::unbounded_channel::<Request>();
    let send = |r: Request| tx.send(r).map_err(|e| e.to_string());
    send(Request {
        node: Some(spec.node()),
        type_url: CLUSTER.into(),
        ..Default::default()
    })?;
    send(Request {
        type_url: LISTENER.into(),
        ..Default::default()
    })?;
    let mut inbound: tonic::Streaming<Response> = open(
        &mut client,
        SOTW_PATH,
        tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
    )
    .await?;
    let mut state = State::default();
    let mut last: HashMap<String, (String, String)> = HashMap::new();
    while let Some(resp) = inbound.message().await.map_err(status_text)? {
        let Response {
            version_info,
            resources,
            type_url,
            nonce,
        } = resp;
        let Some(kind) = type_index(&type_url) else {
            continue;
        };
        let mut follow_up = None;
        match kind {
            0 => {
                let eds: BTreeSet<String> = resources
                    .iter()
                    .filter_map(|r| cluster_summary(&r.value))
                    .filter(|(_, eds)| *eds)
                    .map(|(n, _)| n)
                    .collect();
                if eds != state.eds {
                    state.eds_names = Arc::new(eds.iter().cloned().collect());
                    state.eds = eds;
                    follow_up = Some(ENDPOINT);
                }
            }
            2 => {
                let mut rds = BTreeSet::new();
                for r in &resources {
                    route_names(&r.value, &mut rds);
                }
                if rds != state.rds {
                    state.rds_names = Arc::new(rds.iter().cloned().collect());
                    state.rds = rds;
                    follow_up = Some(ROUTE);
                }
            }
            _ => {}
        }
        state.acked[kind] = true;
        let names = |t: &str, s: &State| -> Arc<Vec<String>> {
            match t {
                ENDPOINT => s.eds_names.clone(),
                ROUTE => s.rds_names.clone(),
                _ => Arc::default(),
            }
        };
        send(Request {
            type_url: type_url.clone(),
            version_info: version_info.clone(),
            response_nonce: nonce.clone(),
            resource_names: names(&type_url, &state),
            ..Default::default()
        })?;
        last.insert(type_url.clone(), (version_info.clone(), nonce));
        if let Some(t) = follow_up {
            let (version, nonce) = last.get(t).cloned().unwrap_or_default();
            state.acked[type_index(t).unwrap_or(0)] = false;
            send(Request {
                type_url: t.into(),
                version_info: version,
                response_nonce: nonce,
                resource_names: names(t, &state),
                ..Default::default()
            })?;
        }
        let received = Received {
            kind,
            version: &version_info,
            resources: &resources,
            names: None,
        };
        let _ = events.send(ack_event(spec, settings, received, &state, generation));
    }
    Ok(())
}

async fn delta(
    spec: &ProxySpec,
    mut client: Grpc,
    settings: &ClientSettings,
    events: &mpsc::UnboundedSender<Event>,
    generation: u64,
) -> Result<(), String> {
    let (tx, rx) = mpsc::channel::<DeltaDiscoveryRequest>(64);
    tx.send(DeltaDiscoveryRequest {
        node: Some(spec.node()),
        type_url: CLUSTER.into(),
        ..Default::default()
    })
    .await
    .map_err(|e| e.to_string())?;
    tx.send(DeltaDiscoveryRequest {
        type_url: LISTENER.into(),
        ..Default::default()
    })
    .await
    .map_err(|e| e.to_string())?;
    let mut inbound: tonic::Streaming<DeltaResponse> =
        open(&mut client, DELTA_PATH, ReceiverStream::new(rx)).await?;
    let mut state = State::default();
    while let Some(resp) = inbound.message().await.map_err(status_text)? {
        let DeltaResponse {
            system_version_info,
            resources,
            type_url,
            nonce,
            removed_resources,
        } = resp;
        let Some(kind) = type_index(&type_url) else {
            continue;
        };
        let anys: Vec<RawAny> = resources
            .iter()
            .filter_map(|r| r.resource.clone())
            .collect();
        let mut subscribe = Vec::new();
        let mut unsubscribe = Vec::new();
        match kind {
            0 => {
                for r in &resources {
                    let eds = r
                        .resource
                        .as_ref()
                        .and_then(|a| cluster_summary(&a.value))
                        .is_some_and(|(_, eds)| eds);
                    state.clusters.insert(r.name.clone(), eds);
                }
                for n in &removed_resources {
                    state.clusters.remove(n);
                }
                let eds: BTreeSet<String> = state
                    .clusters
                    .iter()
                    .filter(|(_, e)| **e)
                    .map(|(n, _)| n.clone())
                    .collect();
                subscribe = eds.difference(&state.eds).cloned().collect();
                unsubscribe = state.eds.difference(&eds).cloned().collect();
                state.eds = eds;
            }
            2 => {
                for r in &resources {
                    let mut names = BTreeSet::new();
                    if let Some(a) = &r.resource {
                        route_names(&a.value, &mut names);
                    }
                    state.listeners.insert(r.name.clone(), names);
                }
                for n in &removed_resources {
                    state.listeners.remove(n);
                }
                let rds: BTreeSet<String> = state.listeners.values().flatten().cloned().collect();
                subscribe = rds.difference(&state.rds).cloned().collect();
                unsubscribe = state.rds.difference(&rds).cloned().collect();
                state.rds = rds;
            }
            _ => {}
        }
        state.acked[kind] = true;
        tx.send(DeltaDiscoveryRequest {
            type_url: type_url.clone(),
            response_nonce: nonce,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
        if !subscribe.is_empty() || !unsubscribe.is_empty() {
            let t = if kind == 0 { ENDPOINT } else { ROUTE };
            if !subscribe.is_empty() {
                state.acked[type_index(t).unwrap_or(0)] = false;
            }
            tx.send(DeltaDiscoveryRequest {
                type_url: t.into(),
                resource_names_subscribe: subscribe,
                resource_names_unsubscribe: unsubscribe,
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        }
        let received = Received {
            kind,
            version: &system_version_info,
            resources: &anys,
            names: Some(resources.iter().map(|r| r.name.clone()).collect()),
        };
        let _ = events.send(ack_event(spec, settings, received, &state, generation));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::envoy::config::cluster::v3::{Cluster, cluster};

    #[test]
    fn cluster_summaries_read_the_name_and_the_eds_type() {
        let c = Cluster {
            name: "outbound|8000||svc-1.ns-1.svc.cluster.local".into(),
            cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
                cluster::DiscoveryType::Eds.into(),
            )),
            alt_stat_name: "x".into(),
            ..Default::default()
        };
        assert_eq!(
            cluster_summary(&c.encode_to_vec()),
            Some((c.name.clone(), true))
        );
        let static_cluster = Cluster {
            name: "BlackHoleCluster".into(),
            ..Default::default()
        };
        assert_eq!(
            cluster_summary(&static_cluster.encode_to_vec()),
            Some(("BlackHoleCluster".into(), false))
        );
    }
}
