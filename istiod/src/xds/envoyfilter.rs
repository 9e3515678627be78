//! EnvoyFilter patches (Istio's `pilot/pkg/networking/core/envoyfilter`),
//! applied to a proxy's listeners, route configurations and clusters as
//! the last step of their generation, after the XDS cache: cached output
//! is never patched in place, so a patch reaches only the proxies it
//! selects, and a changed EnvoyFilter needs no cache clearing.
//!
//! The EnvoyFilters of the root namespace and of the proxy's namespace that
//! select it (by `workloadSelector`, or a Gateway API Gateway in
//! `targetRefs`) apply ordered by priority, then creation time, then name
//! (Istio's order; ties cannot remain), each patch in the order written.
//! Values are decoded once per push context. A patch that cannot apply
//! (a MERGE whose `typed_config` is of another type than the object's, a
//! value that does not decode) is logged under the `envoyfilter` scope and
//! counted in `pilot_envoy_filter_status{result="error"}`; the rest of the
//! config goes out as generated.

mod cluster_patch;
mod listener_patch;
mod metrics;
mod route_patch;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use prost::Message;
use proto::pb::google::protobuf::Any;

use super::context::IstioContext;
use super::{CLUSTER_TYPE, LISTENER_TYPE, Proxy, ROUTE_TYPE, Resource};
use crate::model::ROOT_NAMESPACE;
use crate::model::envoy_filter::{
    ApplyTo, ClusterMatch, EnvoyFilter, ListenerMatch, Operation, PatchContext,
    RouteConfigurationMatch,
};
use crate::model::istio::Labels;
use crate::model::store::Snapshot;

pub use metrics::register as register_metrics;

/// The label Gateway API deployments carry: what a Gateway `targetRefs`
/// entry selects.
const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";

/// Why a patch did not apply.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The value did not decode as the type `applyTo` names.
    #[error("the value does not decode as {type_name}: {message}")]
    Value {
        /// The Envoy type.
        type_name: &'static str,
        /// The decoder's message.
        message: String,
    },
    /// A MERGE of a `typed_config` into one of another type.
    #[error(
        "MERGE of a typed_config of type {patch} into {name:?}, whose typed_config is {current} (the types must be the same)"
    )]
    TypeMismatch {
        /// The patched object's name.
        name: String,
        /// The object's type URL.
        current: String,
        /// The patch's type URL.
        patch: String,
    },
    /// An object did not decode (before or after a merge).
    #[error("{what} does not decode: {source}")]
    Decode {
        /// What was decoded.
        what: String,
        /// The decoder's error.
        source: prost::DecodeError,
    },
}

/// One EnvoyFilter, ready to apply.
#[derive(Debug)]
pub struct EnvoyFilterWrapper {
    /// `namespace/name`: the metric's and the log's name for it.
    pub key: String,
    namespace: String,
    name: String,
    priority: i32,
    creation: String,
    selector: Option<Labels>,
    patches: Vec<PatchWrapper>,
}

/// One patch, its value decoded to bytes of its Envoy type.
#[derive(Debug)]
pub struct PatchWrapper {
    apply_to: ApplyTo,
    context: PatchContext,
    proxy_version: Option<regex::Regex>,
    metadata: BTreeMap<String, String>,
    listener: Option<ListenerMatch>,
    route: Option<RouteConfigurationMatch>,
    cluster: Option<ClusterMatch>,
    operation: Operation,
    /// The value's encoding, or why it does not decode.
    value: Result<Vec<u8>, String>,
}

impl PatchWrapper {
    /// The value decoded as `M`.
    fn value<M: Message + Default>(&self) -> Result<M, PatchError> {
        let type_name = self.apply_to.envoy_type().unwrap_or("?");
        let bytes = self.value.as_ref().map_err(|m| PatchError::Value {
            type_name,
            message: m.clone(),
        })?;
        M::decode(bytes.as_slice()).map_err(|e| PatchError::Value {
            type_name,
            message: e.to_string(),
        })
    }

    /// The value's encoding (for merges).
    fn bytes(&self) -> Result<&[u8], PatchError> {
        self.value.as_deref().map_err(|m| PatchError::Value {
            type_name: self.apply_to.envoy_type().unwrap_or("?"),
            message: m.clone(),
        })
    }

    /// Istio's `commonConditionMatch` for the object's context (the proxy
    /// conditions were checked when the patch was selected).
    fn context_matches(&self, context: PatchContext) -> bool {
        self.context == PatchContext::Any || self.context == context
    }

    fn proxy_matches(&self, proxy: &Proxy) -> bool {
        if let Some(re) = &self.proxy_version
            && (proxy.istio_version.is_empty() || !re.is_match(&proxy.istio_version))
        {
            return false;
        }
        self.metadata
            .iter()
            .all(|(k, v)| proxy.metadata.get(k) == Some(v))
    }
}

/// The EnvoyFilters of a push context, in Istio's order.
#[derive(Debug, Default)]
pub struct EnvoyFilters {
    filters: Vec<Arc<EnvoyFilterWrapper>>,
}

impl EnvoyFilters {
    /// Reads and orders the snapshot's EnvoyFilters, decoding their values.
    pub fn new(snapshot: &Snapshot) -> Self {
        let mut filters: Vec<Arc<EnvoyFilterWrapper>> = snapshot
            .objects(crate::model::Kind::EnvoyFilter)
            .filter_map(|o| {
                let spec: &EnvoyFilter = o.spec_as()?;
                Some(Arc::new(wrap(
                    &o.metadata.namespace,
                    &o.metadata.name,
                    o.metadata.creation_timestamp.clone().unwrap_or_default(),
                    spec,
                )))
            })
            .collect();
        // Istio's order: priority, creation time, then `name.namespace`.
        filters.sort_by_cached_key(|f| {
            (
                f.priority,
                f.creation.clone(),
                format!("{}.{}", f.name, f.namespace),
            )
        });
        Self { filters }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }

    /// The filters that apply to `proxy` (whose labels are its workload's),
    /// in order, with only the patches whose proxy conditions it meets.
    pub fn for_proxy(&self, proxy: &Proxy) -> Vec<Selected<'_>> {
        self.filters
            .iter()
            .filter(|f| {
                (f.namespace == ROOT_NAMESPACE || f.namespace == proxy.namespace)
                    && f.selector
                        .as_ref()
                        .is_none_or(|sel| sel.iter().all(|(k, v)| proxy.labels.get(k) == Some(v)))
            })
            .map(|f| Selected {
                filter: f,
                patches: f
                    .patches
                    .iter()
                    .filter(|p| p.proxy_matches(proxy))
                    .collect(),
            })
            .filter(|s| !s.patches.is_empty())
            .collect()
    }
}

/// One filter's patches that apply to a proxy.
pub struct Selected<'a> {
    filter: &'a EnvoyFilterWrapper,
    patches: Vec<&'a PatchWrapper>,
}

/// The patches of one kind, in order, each with its filter's key.
pub(crate) struct Patches<'a> {
    list: Vec<(&'a str, &'a PatchWrapper)>,
}

impl<'a> Patches<'a> {
    fn of(selected: &[Selected<'a>], apply_to: &[ApplyTo]) -> Self {
        Self {
            list: selected
                .iter()
                .flat_map(|s| {
                    s.patches
                        .iter()
                        .filter(|p| apply_to.contains(&p.apply_to))
                        .map(|p| (s.filter.key.as_str(), *p))
                })
                .collect(),
        }
    }

    fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The patches of `apply_to` for objects in `context`.
    fn iter(
        &self,
        apply_to: ApplyTo,
        context: PatchContext,
    ) -> impl Iterator<Item = (&'a str, &'a PatchWrapper)> + '_ {
        self.list
            .iter()
            .copied()
            .filter(move |(_, p)| p.apply_to == apply_to && p.context_matches(context))
    }
}

impl<'a> Patches<'a> {
    /// The ADD patches of `apply_to` for a proxy: once each, whatever
    /// context of the proxy's kind they name (Istio patches inbound and
    /// outbound separately; a value added twice would clash by name).
    fn adds(
        &self,
        apply_to: ApplyTo,
        gateway: bool,
    ) -> impl Iterator<Item = (&'a str, &'a PatchWrapper)> + '_ {
        self.list.iter().copied().filter(move |(_, p)| {
            p.apply_to == apply_to
                && p.operation == Operation::Add
                && match p.context {
                    PatchContext::Any => true,
                    PatchContext::Gateway => gateway,
                    PatchContext::SidecarInbound | PatchContext::SidecarOutbound => !gateway,
                }
        })
    }
}

fn wrap(namespace: &str, name: &str, creation: String, spec: &EnvoyFilter) -> EnvoyFilterWrapper {
    let mut selector = spec.workload_selector.as_ref().map(|s| s.labels.clone());
    if let Some(t) = spec.target_refs.first() {
        // Validation admits Gateway API Gateways of the same namespace only.
        selector = Some(Labels::from([(
            GATEWAY_NAME_LABEL.to_string(),
            t.name.clone(),
        )]));
    }
    let key = format!("{namespace}/{name}");
    let patches = spec
        .config_patches
        .iter()
        .filter_map(|cp| {
            let patch = cp.patch.as_ref()?;
            let m = cp.match_.clone().unwrap_or_default();
            let proxy = m.proxy.unwrap_or_default();
            let value = match (&patch.value, cp.apply_to.envoy_type()) {
                (Some(v), Some(t)) => {
                    proto::envoy_json::encode_json(t, v).map_err(|e| e.to_string())
                }
                _ => Ok(Vec::new()),
            };
            Some(PatchWrapper {
                apply_to: cp.apply_to,
                context: m.context,
                proxy_version: (!proxy.proxy_version.is_empty())
                    .then(|| regex::Regex::new(&proxy.proxy_version).ok())
                    .flatten(),
                metadata: proxy.metadata,
                listener: m.listener,
                route: m.route_configuration,
                cluster: m.cluster,
                operation: patch.operation,
                value,
            })
        })
        .collect();
    EnvoyFilterWrapper {
        key,
        namespace: namespace.to_string(),
        name: name.to_string(),
        priority: spec.priority,
        creation,
        selector,
        patches,
    }
}

/// Applies the proxy's EnvoyFilters to generated resources of `type_url`
/// (listeners, route configurations or clusters); other types, and proxies
/// no filter selects, get `resources` back as they are.
pub fn apply(
    ctx: &IstioContext,
    proxy: &Proxy,
    type_url: &str,
    resources: Vec<Arc<Resource>>,
) -> Vec<Arc<Resource>> {
    if ctx.envoy_filters.is_empty() {
        return resources;
    }
    let kinds: &[ApplyTo] = match type_url {
        LISTENER_TYPE => &[
            ApplyTo::Listener,
            ApplyTo::FilterChain,
            ApplyTo::NetworkFilter,
            ApplyTo::HttpFilter,
            // Inbound routes are inline in the listeners.
            ApplyTo::RouteConfiguration,
            ApplyTo::VirtualHost,
            ApplyTo::HttpRoute,
        ],
        ROUTE_TYPE => &[
            ApplyTo::RouteConfiguration,
            ApplyTo::VirtualHost,
            ApplyTo::HttpRoute,
        ],
        CLUSTER_TYPE => &[ApplyTo::Cluster],
        _ => return resources,
    };
    let selected = ctx.envoy_filters.for_proxy(proxy);
    let patches = Patches::of(&selected, kinds);
    if patches.is_empty() {
        return resources;
    }
    let gateway = proxy.proxy_type == common::ProxyType::Router;
    match type_url {
        LISTENER_TYPE => listener_patch::apply(&patches, gateway, resources),
        ROUTE_TYPE => route_patch::apply_resources(&patches, gateway, resources),
        _ => cluster_patch::apply(&patches, gateway, &inbound_hosts(ctx, proxy), resources),
    }
}

/// The service hosts of the proxy's inbound ports (target port), which
/// Istio matches inbound clusters' `service` against.
fn inbound_hosts(ctx: &IstioContext, proxy: &Proxy) -> BTreeMap<u32, Vec<String>> {
    let mut out: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    if proxy.proxy_type != common::ProxyType::Router {
        for (svc, _, target) in ctx.inbound_for(proxy) {
            out.entry(target.into())
                .or_default()
                .push(svc.hostname.clone());
        }
    }
    out
}

/// Decodes a generated resource.
fn decode<M: Message + Default>(r: &Resource) -> Result<M, PatchError> {
    M::decode(r.resource.value.as_slice()).map_err(|source| PatchError::Decode {
        what: r.name.clone(),
        source,
    })
}

/// Proto merge of `patch` (an encoding of `M`) into `target`: the
/// concatenation of two encodings decodes as their merge.
fn merge<M: Message + Default>(target: &M, patch: &[u8], what: &str) -> Result<M, PatchError> {
    let mut bytes = target.encode_to_vec();
    bytes.extend_from_slice(patch);
    M::decode(bytes.as_slice()).map_err(|source| PatchError::Decode {
        what: what.to_string(),
        source,
    })
}

/// Istio's merge of two `typed_config`s of one type (`MergeAnyWithAny`).
fn merge_any(current: &Any, patch: &Any, name: &str) -> Result<Any, PatchError> {
    if current.type_url != patch.type_url {
        return Err(PatchError::TypeMismatch {
            name: name.to_string(),
            current: current.type_url.clone(),
            patch: patch.type_url.clone(),
        });
    }
    let mut value = current.value.clone();
    value.extend_from_slice(&patch.value);
    Ok(Any {
        type_url: current.type_url.clone(),
        value,
    })
}

/// Records a patch's result, logging failures.
fn report(key: &str, kind: metrics::PatchType, result: Result<(), PatchError>) {
    match result {
        Ok(()) => metrics::record(key, kind, true),
        Err(e) => {
            tracing::warn!(target: "envoyfilter", envoy_filter = key, patch = kind.as_str(), "patch not applied: {e}");
            metrics::record(key, kind, false);
        }
    }
}

/// Istio's list operations on named elements: the index an INSERT puts
/// the value at, given the first matching element (`None`: none matches,
/// `Some(None)`: the patch names no element).
fn insert_position(op: Operation, len: usize, found: Option<Option<usize>>) -> Option<usize> {
    match (op, found) {
        (Operation::InsertFirst, _) | (Operation::InsertBefore, Some(None)) => Some(0),
        (Operation::Add, _) | (Operation::InsertAfter, Some(None)) => Some(len),
        (Operation::InsertBefore, Some(Some(i))) => Some(i),
        (Operation::InsertAfter, Some(Some(i))) => Some(i + 1),
        _ => None,
    }
}
