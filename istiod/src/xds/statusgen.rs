//! Istio's debug types over ADS (`pilot/pkg/xds/statusgen.go`): a request
//! of `istio.io/debug/syncz` is answered with one Envoy CSDS
//! `ClientConfig` per connected proxy, and `istio.io/debug/config_dump`
//! (resource name = proxy ID) with that proxy's configuration as Envoy
//! admin config dumps. They never create watches. The HTTP `/debug/syncz`
//! and `/debug/config_dump` read the same [`sync_status`] and
//! [`dump_resources`], so both ways agree.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use prost::{Message, Name};
use proto::pb::envoy::admin::v3 as admin;
use proto::pb::envoy::config::core::v3::{DataSource, Node, data_source};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::{Secret, secret};
use proto::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
use proto::pb::envoy::service::status::v3::{ClientConfig, ConfigStatus};
use proto::pb::google::protobuf::Any;

use super::server::{ConnectionStatus, DiscoveryServer, TypeStatus};
use super::{
    CLUSTER_TYPE, ENDPOINT_TYPE, EXTENSION_CONFIGURATION_TYPE, LISTENER_TYPE, ROUTE_TYPE,
    SECRET_TYPE, short_name,
};
use crate::pushctx::{Proxy, PushRequest, Resource};
use common::xds::{DEBUG_CONFIG_DUMP_TYPE, DEBUG_SYNCZ_TYPE};

/// The types syncz reports, in Istio's order.
pub const SYNCZ_TYPES: [&str; 5] = [
    LISTENER_TYPE,
    ROUTE_TYPE,
    ENDPOINT_TYPE,
    CLUSTER_TYPE,
    EXTENSION_CONFIGURATION_TYPE,
];

/// The types a config dump is generated from (Istio's `connectionConfigDump`).
const DUMP_TYPES: [&str; 6] = [
    CLUSTER_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
    SECRET_TYPE,
    ENDPOINT_TYPE,
    EXTENSION_CONFIGURATION_TYPE,
];

/// Why a debug request is refused; each is the stream's gRPC status.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DebugError {
    /// A caller of another namespace asked about a proxy not in its own.
    #[error(
        "the debug info of {proxy} is not available for an identity of namespace {namespace:?}"
    )]
    Forbidden {
        /// The proxy asked about.
        proxy: String,
        /// The caller's namespace.
        namespace: String,
    },
    /// `istio.io/debug/<path>` without a verified identity (the plaintext port).
    #[error(
        "authentication required: istio.io/debug/<path> is served on the authenticated port only"
    )]
    Unauthenticated,
    /// `istio.io/debug/<path>` names not exactly one path.
    #[error("exactly one debug path is required as resource name, got {0}")]
    Paths(usize),
    /// A path a caller of another namespace may not read.
    #[error("the debug info {path:?} is not available for an identity of namespace {namespace:?}")]
    PathForbidden {
        /// The path asked for.
        path: String,
        /// The caller's namespace.
        namespace: String,
    },
    /// The HTTP debug endpoints are not there (istiod still starting).
    #[error("the debug endpoints are not available yet")]
    NoMux,
}

impl From<DebugError> for tonic::Status {
    fn from(e: DebugError) -> Self {
        match e {
            DebugError::Forbidden { .. } | DebugError::PathForbidden { .. } => {
                tonic::Status::permission_denied(e.to_string())
            }
            DebugError::Unauthenticated => tonic::Status::unauthenticated(e.to_string()),
            DebugError::Paths(_) => tonic::Status::invalid_argument(e.to_string()),
            DebugError::NoMux => tonic::Status::unavailable(e.to_string()),
        }
    }
}

/// Istio's `debugSyncStatus`: nothing sent is NOT_SENT, the last response
/// ACKed is SYNCED, anything else (not yet ACKed, or NACKed: the ACKed
/// nonce stays the older one) STALE. A type never watched is NOT_SENT.
pub fn config_status(t: Option<&TypeStatus>) -> ConfigStatus {
    match t {
        None => ConfigStatus::NotSent,
        Some(t) if t.sent_nonce.is_empty() => ConfigStatus::NotSent,
        Some(t) if t.acked_nonce == t.sent_nonce => ConfigStatus::Synced,
        Some(_) => ConfigStatus::Stale,
    }
}

/// The connections, by proxy ID, of `namespace` only when given: what the
/// HTTP `/debug/syncz` lists (every connection, as Istio's `Syncz`) and the
/// xDS answer is built from (proxies only, see [`generate`]).
pub fn sync_status(server: &DiscoveryServer, namespace: Option<&str>) -> Vec<ConnectionStatus> {
    let mut list: Vec<ConnectionStatus> = server
        .connections()
        .into_iter()
        .filter(|c| namespace.is_none_or(|ns| c.proxy.namespace == ns))
        .collect();
    list.sort_by(|a, b| (&a.proxy_id, &a.connection_id).cmp(&(&b.proxy_id, &b.connection_id)));
    list
}

/// One proxy's CSDS `ClientConfig`: its node (ID, and the `CLUSTER_ID`,
/// `NAMESPACE`, `ISTIO_VERSION` metadata Istio sends) and each of
/// [`SYNCZ_TYPES`] with its [`config_status`]; a NACK's message is its
/// `error_state`.
pub fn client_config(c: &ConnectionStatus) -> ClientConfig {
    let metadata = common::NodeMetadata {
        cluster_id: Some(c.proxy.cluster_id.clone()).filter(|s| !s.is_empty()),
        namespace: Some(c.proxy.namespace.clone()),
        istio_version: Some(c.istio_version.clone()).filter(|s| !s.is_empty()),
        ..Default::default()
    };
    let generic_xds_configs = SYNCZ_TYPES
        .iter()
        .map(|t| {
            let status = c.types.get(short_name(t));
            GenericXdsConfig {
                type_url: t.to_string(),
                config_status: config_status(status) as i32,
                error_state: status.and_then(|s| {
                    s.last_error.as_ref().map(|e| admin::UpdateFailureState {
                        details: e.clone(),
                        version_info: s.sent_version.clone(),
                        ..Default::default()
                    })
                }),
                ..Default::default()
            }
        })
        .collect();
    ClientConfig {
        node: Some(Node {
            id: c.proxy_id.clone(),
            metadata: Some(metadata.to_struct()),
            ..Default::default()
        }),
        generic_xds_configs,
        ..Default::default()
    }
}

/// What `proxy_id` names (Istio's `getProxyConnection`: the first
/// connection whose ID contains it).
pub fn find_connection(server: &DiscoveryServer, proxy_id: &str) -> Option<ConnectionStatus> {
    if proxy_id.is_empty() {
        return None;
    }
    server
        .connections()
        .into_iter()
        .find(|c| c.connection_id.contains(proxy_id))
}

/// The resources istiod would send `c` now, of each type it watches,
/// for the names it watches; secrets' private keys redacted.
pub fn dump_resources(
    push: &PushRequest,
    c: &ConnectionStatus,
) -> BTreeMap<&'static str, Vec<Arc<Resource>>> {
    let mut out = BTreeMap::new();
    for t in DUMP_TYPES {
        let Some(watch) = c.types.get(short_name(t)) else {
            continue;
        };
        match push.ctx.generate(&c.proxy, t, &watch.names) {
            Ok(rs) => {
                let rs = if t == SECRET_TYPE {
                    rs.iter()
                        .map(|r| Arc::new(Resource::new(r.name.clone(), redacted(&r.resource))))
                        .collect()
                } else {
                    rs
                };
                out.insert(t, rs);
            }
            Err(e) => {
                tracing::warn!(target: "ads", "config dump of {}: {}: {e}", c.proxy_id, short_name(t));
            }
        }
    }
    out
}

/// A secret with its private key replaced by `[redacted]`.
fn redacted(r: &Any) -> Any {
    let Ok(mut s) = Secret::decode(r.value.as_slice()) else {
        return r.clone();
    };
    if let Some(secret::Type::TlsCertificate(cert)) = &mut s.r#type
        && cert.private_key.is_some()
    {
        cert.private_key = Some(DataSource {
            specifier: Some(data_source::Specifier::InlineBytes(b"[redacted]".to_vec())),
            ..Default::default()
        });
    }
    any(&s)
}

fn any<M: Message + Name>(m: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: m.encode_to_vec(),
    }
}

/// Istio's `connectionConfigDump` without EDS: bootstrap (empty),
/// clusters, listeners, scoped routes (empty), routes, secrets and
/// extension configs, each an admin config dump at the push's version.
pub fn config_dump(push: &PushRequest, c: &ConnectionStatus) -> admin::ConfigDump {
    let version = push.ctx.version().to_string();
    let mut dump = dump_resources(push, c);
    let mut take = |t: &str| dump.remove(t).unwrap_or_default().into_iter();
    let clusters = admin::ClustersConfigDump {
        version_info: version.clone(),
        dynamic_active_clusters: take(CLUSTER_TYPE)
            .map(|c| admin::clusters_config_dump::DynamicCluster {
                cluster: Some(c.resource.clone()),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let listeners = admin::ListenersConfigDump {
        version_info: version.clone(),
        dynamic_listeners: take(LISTENER_TYPE)
            .map(|l| admin::listeners_config_dump::DynamicListener {
                name: l.name.clone(),
                active_state: Some(admin::listeners_config_dump::DynamicListenerState {
                    version_info: version.clone(),
                    listener: Some(l.resource.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let routes = admin::RoutesConfigDump {
        dynamic_route_configs: take(ROUTE_TYPE)
            .map(|r| admin::routes_config_dump::DynamicRouteConfig {
                version_info: version.clone(),
                route_config: Some(r.resource.clone()),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let secrets = admin::SecretsConfigDump {
        dynamic_active_secrets: take(SECRET_TYPE)
            .map(|s| admin::secrets_config_dump::DynamicSecret {
                name: s.name.clone(),
                version_info: version.clone(),
                secret: Some(s.resource.clone()),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let ecds = admin::EcdsConfigDump {
        ecds_filters: take(EXTENSION_CONFIGURATION_TYPE)
            .map(|e| admin::ecds_config_dump::EcdsFilterConfig {
                version_info: version.clone(),
                ecds_filter: Some(e.resource.clone()),
                ..Default::default()
            })
            .collect(),
    };
    admin::ConfigDump {
        configs: vec![
            any(&admin::BootstrapConfigDump::default()),
            any(&clusters),
            any(&listeners),
            any(&admin::ScopedRoutesConfigDump::default()),
            any(&routes),
            any(&secrets),
            any(&ecds),
        ],
    }
}

/// Whether `caller` may see `target`'s debug info: any caller on the
/// plaintext port, a caller of istiod's namespace, or one of the proxy's
/// own namespace (Istio's debug authorization).
fn allowed(server: &DiscoveryServer, caller: &Proxy, target_namespace: &str) -> bool {
    !caller.verified
        || caller.namespace == server.system_namespace()
        || caller.namespace == target_namespace
}

/// The answer to any debug request (a type [`common::xds::is_debug_type`]
/// accepts) of `type_url` for `names` from `caller`.
pub(super) async fn answer(
    server: &DiscoveryServer,
    push: &PushRequest,
    caller: &Proxy,
    type_url: &str,
    names: &BTreeSet<String>,
) -> Result<Vec<Arc<Resource>>, DebugError> {
    if type_url == common::xds::DEBUG_TYPE {
        debug_path(server, caller, names).await
    } else {
        generate(server, push, caller, type_url, names)
    }
}

/// The answer to `istio.io/debug/syncz` or `istio.io/debug/config_dump`.
pub(super) fn generate(
    server: &DiscoveryServer,
    push: &PushRequest,
    caller: &Proxy,
    type_url: &str,
    names: &BTreeSet<String>,
) -> Result<Vec<Arc<Resource>>, DebugError> {
    match type_url {
        DEBUG_SYNCZ_TYPE => {
            let scope = (caller.verified && caller.namespace != server.system_namespace())
                .then_some(caller.namespace.as_str());
            // Istio's `isProxy`: debug clients (istioctl) are left out.
            Ok(sync_status(server, scope)
                .iter()
                .filter(|c| c.is_proxy)
                .map(|c| Arc::new(Resource::new(c.proxy_id.clone(), any(&client_config(c)))))
                .collect())
        }
        DEBUG_CONFIG_DUMP_TYPE => {
            // Istio answers a malformed or unknown proxy with nothing.
            let [proxy_id] = names.iter().collect::<Vec<_>>()[..] else {
                tracing::info!(target: "ads", "{DEBUG_CONFIG_DUMP_TYPE} with {} resource names", names.len());
                return Ok(Vec::new());
            };
            let Some(conn) = find_connection(server, proxy_id) else {
                tracing::info!(target: "ads", "{DEBUG_CONFIG_DUMP_TYPE}: no connection for proxy {proxy_id:?}");
                return Ok(Vec::new());
            };
            if !allowed(server, caller, &conn.proxy.namespace) {
                return Err(DebugError::Forbidden {
                    proxy: conn.proxy_id,
                    namespace: caller.namespace.clone(),
                });
            }
            Ok(config_dump(push, &conn)
                .configs
                .into_iter()
                .map(|a| Arc::new(Resource::new(String::new(), a)))
                .collect())
        }
        // Istio has no generator for other debug types: nothing.
        _ => Ok(Vec::new()),
    }
}

/// The debug paths a caller of another namespace than istiod's may read
/// (Istio's `activeNamespaceDebuggers`), for proxies of its own namespace.
const NAMESPACE_DEBUGGERS: [&str; 3] = ["config_dump", "ndsz", "edsz"];

/// Istio's `DebugGen`: type `istio.io/debug` with one resource name, a debug
/// path (`syncz`, `config_dump?proxyID=...`), answered with that HTTP
/// endpoint's body as one resource of type `istio.io/debug`. Only for a
/// verified caller; one of another namespace than istiod's reads only
/// [`NAMESPACE_DEBUGGERS`], about proxies of its namespace.
pub(super) async fn debug_path(
    server: &DiscoveryServer,
    caller: &Proxy,
    names: &BTreeSet<String>,
) -> Result<Vec<Arc<Resource>>, DebugError> {
    if !caller.verified {
        return Err(DebugError::Unauthenticated);
    }
    let [name] = names.iter().collect::<Vec<_>>()[..] else {
        return Err(DebugError::Paths(names.len()));
    };
    let (path, query) = name.split_once('?').unwrap_or((name.as_str(), ""));
    if caller.namespace != server.system_namespace() {
        let proxy_ns = form_urlencoded_proxy(query)
            .and_then(|id| find_connection(server, &id))
            .map(|c| c.proxy.namespace);
        if !NAMESPACE_DEBUGGERS.contains(&path) || proxy_ns.as_deref() != Some(&caller.namespace) {
            return Err(DebugError::PathForbidden {
                path: name.clone(),
                namespace: caller.namespace.clone(),
            });
        }
    }
    let mux = server.debug_mux().ok_or(DebugError::NoMux)?;
    let body = mux(format!("/debug/{name}")).await;
    Ok(vec![Arc::new(Resource::new(
        name.clone(),
        Any {
            type_url: common::xds::DEBUG_TYPE.to_string(),
            value: body,
        },
    ))])
}

/// The `proxyID` of a query string.
fn form_urlencoded_proxy(query: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == "proxyID").then(|| v.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(sent: &str, acked: &str, error: Option<&str>) -> TypeStatus {
        TypeStatus {
            sent_nonce: sent.into(),
            acked_nonce: acked.into(),
            last_error: error.map(String::from),
            ..Default::default()
        }
    }

    #[test]
    fn status_mapping_is_istios_debug_sync_status() {
        assert_eq!(config_status(None), ConfigStatus::NotSent);
        assert_eq!(
            config_status(Some(&status("", "", None))),
            ConfigStatus::NotSent
        );
        assert_eq!(
            config_status(Some(&status("n1", "n1", None))),
            ConfigStatus::Synced
        );
        // Sent, not ACKed yet.
        assert_eq!(
            config_status(Some(&status("n2", "n1", None))),
            ConfigStatus::Stale
        );
        assert_eq!(
            config_status(Some(&status("n1", "", None))),
            ConfigStatus::Stale
        );
        // A NACK keeps the older ACK: STALE, as Istio reports it.
        assert_eq!(
            config_status(Some(&status("n2", "n1", Some("bad listener")))),
            ConfigStatus::Stale
        );
    }

    fn node(id: &str, ns: &str, proxy_config: bool) -> Node {
        let meta = common::NodeMetadata {
            namespace: Some(ns.into()),
            istio_version: Some("1.28.0".into()),
            cluster_id: Some("Kubernetes".into()),
            proxy_config: proxy_config.then(serde_json::Map::new),
            ..Default::default()
        };
        Node {
            id: format!("sidecar~10.0.0.1~{id}~{ns}.svc.cluster.local"),
            metadata: Some(meta.to_struct()),
            ..Default::default()
        }
    }

    fn connection(id: &str, ns: &str, types: &[(&str, TypeStatus)]) -> ConnectionStatus {
        let proxy = Proxy::from_node(&node(id, ns, true)).unwrap();
        ConnectionStatus {
            proxy_id: proxy.id.clone(),
            connection_id: format!("{}-1", proxy.id),
            node_id: proxy.node_id.clone(),
            istio_version: proxy.istio_version.clone(),
            delta: false,
            types: types
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            connected_at: 0,
            is_proxy: true,
            proxy,
        }
    }

    #[test]
    fn client_config_lists_every_type_in_istios_order_with_its_status() {
        let c = connection(
            "sleep-1.demo",
            "demo",
            &[
                ("CDS", status("c", "c", None)),
                ("LDS", status("l2", "l1", Some("rejected"))),
                ("EDS", status("e", "", None)),
            ],
        );
        let cc = client_config(&c);
        let node = cc.node.as_ref().unwrap();
        assert_eq!(node.id, "sleep-1.demo");
        let meta = common::NodeMetadata::from_struct(node.metadata.as_ref().unwrap());
        assert_eq!(meta.namespace.as_deref(), Some("demo"));
        assert_eq!(meta.cluster_id.as_deref(), Some("Kubernetes"));
        assert_eq!(meta.istio_version.as_deref(), Some("1.28.0"));
        let got: Vec<(&str, ConfigStatus)> = cc
            .generic_xds_configs
            .iter()
            .map(|g| (short_name(&g.type_url), g.config_status()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("LDS", ConfigStatus::Stale),
                ("RDS", ConfigStatus::NotSent),
                ("EDS", ConfigStatus::Stale),
                ("CDS", ConfigStatus::Synced),
                ("ECDS", ConfigStatus::NotSent),
            ]
        );
        let lds = &cc.generic_xds_configs[0];
        assert_eq!(lds.error_state.as_ref().unwrap().details, "rejected");
        assert!(cc.generic_xds_configs[3].error_state.is_none());
    }

    #[test]
    fn secrets_in_a_dump_have_their_private_key_redacted() {
        use proto::pb::envoy::extensions::transport_sockets::tls::v3::TlsCertificate;
        let key = DataSource {
            specifier: Some(data_source::Specifier::InlineBytes(b"PRIVATE".to_vec())),
            ..Default::default()
        };
        let s = Secret {
            name: "kubernetes://cred".into(),
            r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
                private_key: Some(key),
                ..Default::default()
            })),
        };
        let out = redacted(&any(&s));
        let back = Secret::decode(out.value.as_slice()).unwrap();
        let Some(secret::Type::TlsCertificate(cert)) = back.r#type else {
            panic!("not a certificate")
        };
        assert_eq!(
            cert.private_key.unwrap().specifier,
            Some(data_source::Specifier::InlineBytes(b"[redacted]".to_vec()))
        );
        assert!(!out.value.windows(7).any(|w| w == b"PRIVATE"));
    }
}
