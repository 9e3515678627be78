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

use super::{CLUSTER_TYPE, LISTENER_TYPE, ROUTE_TYPE};
use crate::model::envoy_filter::{ApplyTo, Operation};
use crate::pushctx::context::IstioContext;
use crate::pushctx::envoyfilter::{PatchError, PatchWrapper, Patches};
use crate::pushctx::{Proxy, Resource};

pub use metrics::register as register_metrics;

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
