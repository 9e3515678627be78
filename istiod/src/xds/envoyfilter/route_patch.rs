//! ROUTE_CONFIGURATION, VIRTUAL_HOST and HTTP_ROUTE patches (Istio's
//! `route_patch.go`): on the route configurations of RDS (sidecar
//! outbound, gateways) and on the inline route configurations of inbound
//! listeners (SIDECAR_INBOUND). A route configuration is matched by its
//! name (`<port>`, `<host>:<port>`, `inbound|<port>||`, or a gateway's
//! `http.<port>` / `https.<port>.<portName>.<gateway>.<namespace>`).

use std::sync::Arc;

use proto::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost, route};

use super::metrics::PatchType;
use super::{PatchError, PatchWrapper, Patches, decode, insert_position, merge, report};
use crate::model::envoy_filter::{ApplyTo, Operation, PatchContext, RouteAction};
use crate::pushctx::Resource;

/// Applies route patches to RDS resources.
pub(super) fn apply_resources(
    patches: &Patches<'_>,
    gateway: bool,
    resources: Vec<Arc<Resource>>,
) -> Vec<Arc<Resource>> {
    let context = if gateway {
        PatchContext::Gateway
    } else {
        PatchContext::SidecarOutbound
    };
    resources
        .into_iter()
        .map(|r| {
            if !may_apply(patches, context, &r.name) {
                return r;
            }
            match decode::<RouteConfiguration>(&r) {
                Ok(mut rc) => {
                    apply(patches, context, &mut rc);
                    Arc::new(Resource::encode(rc.name.clone(), &rc))
                }
                Err(e) => {
                    tracing::warn!(target: "envoyfilter", route = %r.name, "route configuration not patched: {e}");
                    r
                }
            }
        })
        .collect()
}

/// Whether a patch of `context` matches the route configuration `name`.
pub(super) fn may_apply(patches: &Patches<'_>, context: PatchContext, name: &str) -> bool {
    [
        ApplyTo::RouteConfiguration,
        ApplyTo::VirtualHost,
        ApplyTo::HttpRoute,
    ]
    .into_iter()
    .any(|kind| {
        patches
            .iter(kind, context)
            .any(|(_, p)| route_configuration_matches(context, name, p))
    })
}

/// Applies the route patches of `context` to one route configuration.
pub(super) fn apply(patches: &Patches<'_>, context: PatchContext, rc: &mut RouteConfiguration) {
    for (key, p) in patches.iter(ApplyTo::RouteConfiguration, context) {
        if p.operation != Operation::Merge || !route_configuration_matches(context, &rc.name, p) {
            continue;
        }
        let result = p
            .bytes()
            .and_then(|b| merge(&*rc, b, "route configuration"))
            .map(|m| *rc = m);
        report(key, PatchType::Route, result);
    }
    let name = rc.name.clone();
    for (key, p) in patches.iter(ApplyTo::VirtualHost, context) {
        if !route_configuration_matches(context, &name, p) {
            continue;
        }
        let result = match p.operation {
            Operation::Remove => {
                rc.virtual_hosts.retain(|v| !vhost_matches(v, p));
                Ok(())
            }
            Operation::Merge => merge_each(&mut rc.virtual_hosts, p, vhost_matches),
            Operation::Add => p.value::<VirtualHost>().map(|v| rc.virtual_hosts.push(v)),
            _ => continue,
        };
        report(key, PatchType::VirtualHost, result);
    }
    for (key, p) in patches.iter(ApplyTo::HttpRoute, context) {
        if !route_configuration_matches(context, &name, p) {
            continue;
        }
        let mut result = Ok(());
        for vhost in rc.virtual_hosts.iter_mut().filter(|v| vhost_matches(v, p)) {
            if let Err(e) = patch_routes(&mut vhost.routes, p) {
                result = Err(e);
            }
        }
        report(key, PatchType::Route, result);
    }
}

/// One HTTP_ROUTE patch on a virtual host's routes.
fn patch_routes(routes: &mut Vec<Route>, p: &PatchWrapper) -> Result<(), PatchError> {
    match p.operation {
        Operation::Remove => {
            routes.retain(|r| !route_matches(r, p));
            Ok(())
        }
        Operation::Merge => merge_each(routes, p, route_matches),
        op => {
            let named = p
                .route
                .as_ref()
                .and_then(|m| m.vhost.as_ref())
                .and_then(|v| v.route.as_ref())
                .is_some();
            let found = if named {
                routes.iter().position(|r| route_matches(r, p)).map(Some)
            } else {
                Some(None)
            };
            if let Some(at) = insert_position(op, routes.len(), found) {
                routes.insert(at, p.value::<Route>()?);
            }
            Ok(())
        }
    }
}

/// MERGE of the patch into every element `matches` selects.
fn merge_each<T: prost::Message + Default>(
    list: &mut [T],
    p: &PatchWrapper,
    matches: impl Fn(&T, &PatchWrapper) -> bool,
) -> Result<(), PatchError> {
    let bytes = p.bytes()?;
    for item in list.iter_mut().filter(|i| matches(i, p)) {
        *item = merge(&*item, bytes, "route element")?;
    }
    Ok(())
}

/// Istio's `routeConfigurationMatch`.
pub(super) fn route_configuration_matches(
    context: PatchContext,
    name: &str,
    p: &PatchWrapper,
) -> bool {
    let Some(m) = &p.route else {
        return true;
    };
    if !m.name.is_empty() && m.name != name {
        return false;
    }
    if context == PatchContext::Gateway {
        // `http.<port>` or `https.<port>.<portName>.<gateway>.<namespace>`.
        let parts: Vec<&str> = name.split('.').collect();
        let port: u32 = parts.get(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        let port_name = parts.get(2).copied().unwrap_or_default();
        let gateway = match (parts.get(3), parts.get(4)) {
            (Some(gw), Some(ns)) => format!("{ns}/{gw}"),
            _ => String::new(),
        };
        return (m.port_number == 0 || m.port_number == port)
            && (m.port_name.is_empty() || m.port_name == port_name)
            && (m.gateway.is_empty() || m.gateway == gateway);
    }
    // Sidecars: `<port>`, `<host>:<port>`, or `inbound|<port>||`.
    let port: u32 = match name.strip_prefix("inbound|") {
        Some(rest) => rest.split('|').next().and_then(|p| p.parse().ok()),
        None => name.rsplit(':').next().and_then(|p| p.parse().ok()),
    }
    .unwrap_or(0);
    m.port_number == 0 || m.port_number == port
}

/// Istio's `virtualHostMatch`.
fn vhost_matches(v: &VirtualHost, p: &PatchWrapper) -> bool {
    let Some(m) = p.route.as_ref().and_then(|r| r.vhost.as_ref()) else {
        return true;
    };
    (m.name.is_empty() || m.name == v.name)
        && (m.domain_name.is_empty() || v.domains.contains(&m.domain_name))
}

/// Istio's `routeMatch`.
fn route_matches(r: &Route, p: &PatchWrapper) -> bool {
    let Some(m) = p
        .route
        .as_ref()
        .and_then(|rc| rc.vhost.as_ref())
        .and_then(|v| v.route.as_ref())
    else {
        return true;
    };
    if !m.name.is_empty() && m.name != r.name {
        return false;
    }
    match m.action {
        RouteAction::Any => true,
        RouteAction::Route => matches!(r.action, Some(route::Action::Route(_))),
        RouteAction::Redirect => matches!(r.action, Some(route::Action::Redirect(_))),
        RouteAction::DirectResponse => {
            matches!(r.action, Some(route::Action::DirectResponse(_)))
        }
    }
}
