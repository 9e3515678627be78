//! The EnvoyFilter index of a push context: the snapshot's EnvoyFilters
//! in Istio's order (priority, creation time, then name), their values
//! decoded once, and which of them select a proxy (by `workloadSelector`,
//! or a Gateway API Gateway in `targetRefs`). Applying the patches is the
//! generators' (`xds::envoyfilter`).

use std::collections::BTreeMap;
use std::sync::Arc;

use prost::Message;

use super::Proxy;
use crate::model::ROOT_NAMESPACE;
use crate::model::envoy_filter::{
    ApplyTo, ClusterMatch, EnvoyFilter, ListenerMatch, Operation, PatchContext,
    RouteConfigurationMatch,
};
use crate::model::istio::Labels;
use crate::model::store::Snapshot;

/// The label Gateway API deployments carry: what a Gateway `targetRefs`
/// entry selects.
pub(crate) const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";

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
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) priority: i32,
    pub(crate) creation: String,
    pub(crate) selector: Option<Labels>,
    pub(crate) patches: Vec<PatchWrapper>,
}

/// One patch, its value decoded to bytes of its Envoy type.
#[derive(Debug)]
pub struct PatchWrapper {
    pub(crate) apply_to: ApplyTo,
    pub(crate) context: PatchContext,
    pub(crate) proxy_version: Option<regex::Regex>,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) listener: Option<ListenerMatch>,
    pub(crate) route: Option<RouteConfigurationMatch>,
    pub(crate) cluster: Option<ClusterMatch>,
    pub(crate) operation: Operation,
    /// The value's encoding, or why it does not decode.
    pub(crate) value: Result<Vec<u8>, proto::envoy_json::JsonError>,
}

impl PatchWrapper {
    /// The value decoded as `M`.
    pub(crate) fn value<M: Message + Default>(&self) -> Result<M, PatchError> {
        let type_name = self.apply_to.envoy_type().unwrap_or("?");
        let bytes = self.value.as_ref().map_err(|e| PatchError::Value {
            type_name,
            message: e.to_string(),
        })?;
        M::decode(bytes.as_slice()).map_err(|e| PatchError::Value {
            type_name,
            message: e.to_string(),
        })
    }

    /// The value's encoding (for merges).
    pub(crate) fn bytes(&self) -> Result<&[u8], PatchError> {
        self.value.as_deref().map_err(|e| PatchError::Value {
            type_name: self.apply_to.envoy_type().unwrap_or("?"),
            message: e.to_string(),
        })
    }

    /// Istio's `commonConditionMatch` for the object's context (the proxy
    /// conditions were checked when the patch was selected).
    pub(crate) fn context_matches(&self, context: PatchContext) -> bool {
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
    pub(crate) filter: &'a EnvoyFilterWrapper,
    pub(crate) patches: Vec<&'a PatchWrapper>,
}

/// The patches of one kind, in order, each with its filter's key.
pub(crate) struct Patches<'a> {
    pub(crate) list: Vec<(&'a str, &'a PatchWrapper)>,
}

impl<'a> Patches<'a> {
    pub(crate) fn of(selected: &[Selected<'a>], apply_to: &[ApplyTo]) -> Self {
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

    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The patches of `apply_to` for objects in `context`.
    pub(crate) fn iter(
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
    pub(crate) fn adds(
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
                (Some(v), Some(t)) => proto::envoy_json::encode_json(t, v),
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
