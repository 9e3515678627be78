//! LISTENER, FILTER_CHAIN, NETWORK_FILTER and HTTP_FILTER patches (Istio's
//! `listener_patch.go`), and the route patches of the route configurations
//! inbound listeners carry inline. Per listener: listener patches, then
//! filter chain patches, then network filter patches per chain, then HTTP
//! filter (and inline route) patches per HTTP connection manager; listener
//! ADDs last. Each patch applies in turn to the list as the ones before it
//! left it.

use std::sync::Arc;

use proto::pb::envoy::config::core::v3::{address, socket_address};
use proto::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_connection_manager, http_filter,
};
use proto::pb::google::protobuf::Any;

use super::metrics::PatchType;
use super::route_patch;
use super::{PatchError, PatchWrapper, Patches, decode, insert_position, merge, merge_any, report};
use crate::model::envoy_filter::{ApplyTo, Operation, PatchContext};
use crate::pushctx::Resource;

const HCM: &str = "envoy.filters.network.http_connection_manager";
const VIRTUAL_INBOUND: &str = "virtualInbound";
const VIRTUAL_OUTBOUND: &str = "virtualOutbound";

/// Applies listener patches to a proxy's listeners.
pub(super) fn apply(
    patches: &Patches<'_>,
    gateway: bool,
    resources: Vec<Arc<Resource>>,
) -> Vec<Arc<Resource>> {
    let mut out = Vec::with_capacity(resources.len());
    for r in resources {
        // Listeners no patch can select pass by reference, undecoded.
        if let Ok(head) = <ListenerHead as prost::Message>::decode(r.resource.value.as_slice())
            && !may_patch(patches, &head, gateway)
        {
            out.push(r);
            continue;
        }
        let mut l: Listener = match decode(&r) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(target: "envoyfilter", listener = %r.name, "listener not patched: {e}");
                out.push(r);
                continue;
            }
        };
        if patch_listener(patches, context_of(&l, gateway), &mut l) {
            out.push(Arc::new(Resource::encode(l.name.clone(), &l)));
        }
    }
    for (key, p) in patches.adds(ApplyTo::Listener, gateway) {
        let result = p.value::<Listener>().map(|l| {
            out.push(Arc::new(Resource::encode(l.name.clone(), &l)));
        });
        report(key, PatchType::Listener, result);
    }
    out
}

/// What selects a listener (its name, address and direction), decoded
/// without its filter chains: the other fields' bytes are skipped.
#[derive(Clone, PartialEq, prost::Message)]
struct ListenerHead {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "2")]
    address: Option<proto::pb::envoy::config::core::v3::Address>,
    #[prost(int32, tag = "16")]
    traffic_direction: i32,
}

/// Whether a patch may select the listener (or, inbound, its inline routes).
fn may_patch(patches: &Patches<'_>, head: &ListenerHead, gateway: bool) -> bool {
    let context = context_of_parts(&head.name, head.traffic_direction, gateway);
    let port = port_of(head.address.as_ref());
    let listener_kinds = [
        ApplyTo::Listener,
        ApplyTo::FilterChain,
        ApplyTo::NetworkFilter,
        ApplyTo::HttpFilter,
    ];
    let route_kinds = [
        ApplyTo::RouteConfiguration,
        ApplyTo::VirtualHost,
        ApplyTo::HttpRoute,
    ];
    listener_kinds.into_iter().any(|kind| {
        patches
            .iter(kind, context)
            .any(|(_, p)| listener_matches_parts(&head.name, port, p))
    }) || (context == PatchContext::SidecarInbound
        && route_kinds
            .into_iter()
            .any(|kind| patches.iter(kind, context).next().is_some()))
}

/// A listener's patch context.
pub(super) fn context_of(l: &Listener, gateway: bool) -> PatchContext {
    context_of_parts(&l.name, l.traffic_direction, gateway)
}

fn context_of_parts(name: &str, traffic_direction: i32, gateway: bool) -> PatchContext {
    use proto::pb::envoy::config::core::v3::TrafficDirection;
    if gateway {
        PatchContext::Gateway
    } else if name == VIRTUAL_INBOUND || traffic_direction == TrafficDirection::Inbound as i32 {
        PatchContext::SidecarInbound
    } else {
        PatchContext::SidecarOutbound
    }
}

/// Patches one listener; false when a patch removed it.
pub(super) fn patch_listener(
    patches: &Patches<'_>,
    context: PatchContext,
    l: &mut Listener,
) -> bool {
    for (key, p) in patches.iter(ApplyTo::Listener, context) {
        if !listener_matches(l, p) {
            continue;
        }
        match p.operation {
            Operation::Remove => {
                report(key, PatchType::Listener, Ok(()));
                return false;
            }
            Operation::Merge => {
                let result = p
                    .bytes()
                    .and_then(|b| merge(&*l, b, &l.name))
                    .map(|m| *l = m);
                report(key, PatchType::Listener, result);
            }
            _ => {}
        }
    }
    for (key, p) in patches.iter(ApplyTo::FilterChain, context) {
        if !listener_matches(l, p) {
            continue;
        }
        let result = patch_filter_chains(l, p);
        report(key, PatchType::FilterChain, result);
    }
    for (key, p) in patches.iter(ApplyTo::NetworkFilter, context) {
        if !listener_matches(l, p) {
            continue;
        }
        let mut result = Ok(());
        let name = l.name.clone();
        for fc in chains(l).filter(|fc| chain_matches(&name, fc, p)) {
            if let Err(e) = patch_list(&mut fc.filters, p, network_filter_matches, merge_filter) {
                result = Err(e);
            }
        }
        report(key, PatchType::NetworkFilter, result);
    }
    let http = patches.iter(ApplyTo::HttpFilter, context).next().is_some();
    let routes = context == PatchContext::SidecarInbound
        && [
            ApplyTo::RouteConfiguration,
            ApplyTo::VirtualHost,
            ApplyTo::HttpRoute,
        ]
        .into_iter()
        .any(|kind| patches.iter(kind, context).next().is_some());
    if http || routes {
        let name = l.name.clone();
        for fc in chains(l) {
            // The chain's identity, for matching while its filters change.
            let chain = FilterChain {
                name: fc.name.clone(),
                filter_chain_match: fc.filter_chain_match.clone(),
                ..Default::default()
            };
            for f in fc.filters.iter_mut().filter(|f| f.name == HCM) {
                patch_hcm(patches, context, &name, &chain, f);
            }
        }
    }
    true
}

/// The listener's filter chains, the default one last.
fn chains(l: &mut Listener) -> impl Iterator<Item = &mut FilterChain> {
    l.filter_chains
        .iter_mut()
        .chain(l.default_filter_chain.as_mut())
}

/// One FILTER_CHAIN patch.
fn patch_filter_chains(l: &mut Listener, p: &PatchWrapper) -> Result<(), PatchError> {
    let name = l.name.clone();
    let selects = |fc: &FilterChain| {
        chain_matches(&name, fc, p) && fc.filters.iter().any(|f| network_filter_matches(f, p))
    };
    match p.operation {
        Operation::Remove => {
            l.filter_chains.retain(|fc| !selects(fc));
            if l.default_filter_chain.as_ref().is_some_and(selects) {
                l.default_filter_chain = None;
            }
            Ok(())
        }
        Operation::Merge => {
            let patch: FilterChain = p.value()?;
            let bytes = p.bytes()?;
            for fc in l
                .filter_chains
                .iter_mut()
                .chain(l.default_filter_chain.as_mut())
            {
                if selects(fc) {
                    *fc = merge_filter_chain(fc, &patch, bytes)?;
                }
            }
            Ok(())
        }
        Operation::Add => {
            l.filter_chains.push(p.value()?);
            Ok(())
        }
        _ => Ok(()),
    }
}

/// MERGE of a filter chain; a transport socket of the same type is merged
/// field by field (Istio's `mergeTransportSocketListener`).
fn merge_filter_chain(
    fc: &FilterChain,
    patch: &FilterChain,
    bytes: &[u8],
) -> Result<FilterChain, PatchError> {
    use proto::pb::envoy::config::core::v3::transport_socket::ConfigType;
    let mut merged = merge(fc, bytes, &fc.name)?;
    if let (Some(cur), Some(new)) = (&fc.transport_socket, &patch.transport_socket)
        && let (Some(ConfigType::TypedConfig(a)), Some(ConfigType::TypedConfig(b))) =
            (&cur.config_type, &new.config_type)
        && a.type_url == b.type_url
        && let Some(ts) = merged.transport_socket.as_mut()
    {
        ts.config_type = Some(ConfigType::TypedConfig(merge_any(a, b, &fc.name)?));
    }
    Ok(merged)
}

/// HTTP_FILTER patches, and inline route patches, on one connection manager.
fn patch_hcm(
    patches: &Patches<'_>,
    context: PatchContext,
    listener: &str,
    fc: &FilterChain,
    f: &mut Filter,
) {
    let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        return;
    };
    let http: Vec<_> = patches
        .iter(ApplyTo::HttpFilter, context)
        .filter(|(_, p)| chain_matches(listener, fc, p) && network_filter_matches(f, p))
        .collect();
    let inline_name = |hcm: &HttpConnectionManager| match &hcm.route_specifier {
        Some(http_connection_manager::RouteSpecifier::RouteConfig(rc)) => Some(rc.name.clone()),
        _ => None,
    };
    let Ok(mut hcm) = <HttpConnectionManager as prost::Message>::decode(any.value.as_slice())
    else {
        return;
    };
    let routes = context == PatchContext::SidecarInbound
        && inline_name(&hcm).is_some_and(|n| route_patch::may_apply(patches, context, &n));
    if http.is_empty() && !routes {
        return;
    }
    for (key, p) in http {
        let result = patch_list(
            &mut hcm.http_filters,
            p,
            http_filter_matches,
            merge_http_filter,
        );
        report(key, PatchType::HttpFilter, result);
    }
    if routes
        && let Some(http_connection_manager::RouteSpecifier::RouteConfig(rc)) =
            hcm.route_specifier.as_mut()
    {
        route_patch::apply(patches, context, rc);
    }
    f.config_type = Some(filter::ConfigType::TypedConfig(crate::xds::util::any(&hcm)));
}

/// One list operation (Istio's `doNetworkFilterListOperation` and
/// `doHttpFilterListOperation`): REMOVE and MERGE on every element that
/// matches, INSERT_BEFORE/AFTER around the first match (first/last when
/// the patch names none, nothing when the named one is absent), REPLACE
/// of the first match, INSERT_FIRST and ADD at the ends.
fn patch_list<T: prost::Message + Default>(
    list: &mut Vec<T>,
    p: &PatchWrapper,
    matches: fn(&T, &PatchWrapper) -> bool,
    merge_one: fn(&T, &PatchWrapper) -> Result<T, PatchError>,
) -> Result<(), PatchError> {
    let named = match p.apply_to {
        ApplyTo::HttpFilter => sub_filter_name(p).is_some(),
        _ => filter_name(p).is_some(),
    };
    match p.operation {
        Operation::Remove => {
            list.retain(|f| !matches(f, p));
            Ok(())
        }
        Operation::Merge => {
            for item in list.iter_mut() {
                if matches(item, p) {
                    *item = merge_one(item, p)?;
                }
            }
            Ok(())
        }
        Operation::Replace => {
            if let Some(i) = list.iter().position(|f| matches(f, p)).filter(|_| named) {
                list[i] = p.value()?;
            }
            Ok(())
        }
        op => {
            let found = if named {
                list.iter().position(|f| matches(f, p)).map(Some)
            } else {
                Some(None)
            };
            if let Some(at) = insert_position(op, list.len(), found) {
                list.insert(at, p.value()?);
            }
            Ok(())
        }
    }
}

fn filter_name(p: &PatchWrapper) -> Option<&str> {
    p.listener
        .as_ref()?
        .filter_chain
        .as_ref()?
        .filter
        .as_ref()
        .map(|f| f.name.as_str())
        .filter(|n| !n.is_empty())
}

fn sub_filter_name(p: &PatchWrapper) -> Option<&str> {
    p.listener
        .as_ref()?
        .filter_chain
        .as_ref()?
        .filter
        .as_ref()?
        .sub_filter
        .as_ref()
        .map(|f| f.name.as_str())
        .filter(|n| !n.is_empty())
}

/// Istio's `networkFilterMatch`.
fn network_filter_matches(f: &Filter, p: &PatchWrapper) -> bool {
    filter_name(p).is_none_or(|n| n == f.name)
}

/// Istio's `httpFilterMatch`.
fn http_filter_matches(f: &HttpFilter, p: &PatchWrapper) -> bool {
    sub_filter_name(p).is_none_or(|n| n == f.name)
}

/// MERGE of a network filter: its fields proto-merged, its `typed_config`
/// merged with one of the same type (Istio's `MergeAnyWithAny`).
fn merge_filter(f: &Filter, p: &PatchWrapper) -> Result<Filter, PatchError> {
    let patch: Filter = p.value()?;
    let mut merged = merge(f, p.bytes()?, &f.name)?;
    if let (Some(filter::ConfigType::TypedConfig(a)), Some(filter::ConfigType::TypedConfig(b))) =
        (&f.config_type, &patch.config_type)
    {
        merged.config_type = Some(filter::ConfigType::TypedConfig(merge_any(a, b, &f.name)?));
    }
    Ok(merged)
}

/// MERGE of an HTTP filter, as [`merge_filter`].
fn merge_http_filter(f: &HttpFilter, p: &PatchWrapper) -> Result<HttpFilter, PatchError> {
    let patch: HttpFilter = p.value()?;
    let mut merged = merge(f, p.bytes()?, &f.name)?;
    if let (
        Some(http_filter::ConfigType::TypedConfig(a)),
        Some(http_filter::ConfigType::TypedConfig(b)),
    ) = (&f.config_type, &patch.config_type)
    {
        let any: Any = merge_any(a, b, &f.name)?;
        merged.config_type = Some(http_filter::ConfigType::TypedConfig(any));
    }
    Ok(merged)
}

/// Istio's `listenerMatch`.
fn listener_matches(l: &Listener, p: &PatchWrapper) -> bool {
    listener_matches_parts(&l.name, port_of(l.address.as_ref()), p)
}

fn listener_matches_parts(name: &str, port: Option<u32>, p: &PatchWrapper) -> bool {
    let Some(m) = &p.listener else {
        return true;
    };
    if !m.name.is_empty() && m.name != name {
        return false;
    }
    // The virtual listeners' port is matched on their chains' destination port.
    if p.apply_to != ApplyTo::Listener && (name == VIRTUAL_INBOUND || name == VIRTUAL_OUTBOUND) {
        return true;
    }
    m.port_number == 0 || port == Some(m.port_number)
}

fn port_of(address: Option<&proto::pb::envoy::config::core::v3::Address>) -> Option<u32> {
    match address?.address.as_ref()? {
        address::Address::SocketAddress(sa) => match sa.port_specifier {
            Some(socket_address::PortSpecifier::PortValue(p)) => Some(p),
            _ => None,
        },
        _ => None,
    }
}

/// Istio's `filterChainMatch`.
fn chain_matches(listener: &str, fc: &FilterChain, p: &PatchWrapper) -> bool {
    let Some(lm) = &p.listener else {
        return true;
    };
    let fcm = fc.filter_chain_match.as_ref();
    let dest_port = fcm.and_then(|m| m.destination_port).map(|p| p.value);
    if lm.port_number > 0
        && (listener == VIRTUAL_INBOUND || listener == VIRTUAL_OUTBOUND)
        && dest_port != Some(lm.port_number)
    {
        return false;
    }
    let Some(m) = &lm.filter_chain else {
        return true;
    };
    if !m.name.is_empty() && m.name != fc.name {
        return false;
    }
    if !m.sni.is_empty() && !fcm.is_some_and(|f| f.server_names.contains(&m.sni)) {
        return false;
    }
    if !m.transport_protocol.is_empty()
        && fcm.is_none_or(|f| f.transport_protocol != m.transport_protocol)
    {
        return false;
    }
    if !m.application_protocols.is_empty() {
        let have = fcm
            .map(|f| f.application_protocols.as_slice())
            .unwrap_or_default();
        let all = m
            .application_protocols
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .all(|p| have.iter().any(|h| h == p));
        if !all {
            return false;
        }
    }
    m.destination_port == 0 || dest_port == Some(m.destination_port)
}
