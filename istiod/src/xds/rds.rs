//! RDS for sidecars: one route configuration per outbound HTTP port, named by
//! the port (`"8000"`), with a `<host>:<port>` virtual host per service and
//! Istio's catch-all last (`allow_any` to `PassthroughCluster` under
//! `ALLOW_ANY`, `block_all` answering 502 under `REGISTRY_ONLY`); and one per
//! detected-protocol listener on a service address (`"<host>:<port>"`), with
//! that service's virtual host only. Domains follow Istio's sidecar rules:
//! host, absolute host, short names relative to the client's namespace and
//! VIPs, without ports, matched with `ignore_port_in_host_matching`. Routes
//! come from VirtualServices ([`translate`]: matches, weighted destinations,
//! retries, timeouts, rewrites, faults, mirrors; [`ops`]: redirects, direct
//! responses, header operations, CORS), else one default route to
//! `outbound|<port>||<host>`.

mod gateway;
#[cfg(test)]
mod gateway_api_tests;
pub(crate) mod hash;
pub(crate) mod ops;
#[cfg(test)]
mod tests;
pub(crate) mod translate;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use proto::pb::envoy::config::route::v3::{
    Decorator, DirectResponseAction, Route, RouteConfiguration, VirtualHost, route, route_action,
};
use proto::pb::google::protobuf::BoolValue;

use translate::Clusters;

use self::translate::{default_retries, route_match, source_matches, timed, vs_route};
use super::util::u32v;
use crate::model::istio::{HttpMatchRequest, VirtualService};
use crate::model::route::MAX_DIRECT_RESPONSE_BODY_BYTES;
use crate::model::service::{Service, ServiceResolution, ServiceSource};
use crate::model::{Kind, ObjectKey};
use crate::pushctx::cache::{Dependency, KeyBuilder};
use crate::pushctx::context::{IstioContext, OutboundPolicy, resolve_host};
use crate::pushctx::named::Named;
use crate::pushctx::names::outbound_name;
use crate::pushctx::scope::SidecarScope;
use crate::pushctx::{Proxy, Resource};

/// Istio's virtual host domains for a service, seen from a sidecar in
/// `client_ns` (`generateVirtualHostDomains` with sidecars' port-less hosts):
/// the host, the absolute host, for a Kubernetes service `name`,
/// `name.ns.svc` and `name.ns` in the client's namespace (`name.ns` and
/// `name.ns.svc` from elsewhere), `*.` forms for headless services, and the
/// VIPs.
fn domains(svc: &Service, client_ns: &str, domain: &str) -> Vec<String> {
    let mut out = vec![svc.hostname.clone()];
    if svc.hostname.parse::<std::net::IpAddr>().is_err() {
        out.push(format!("{}.", svc.hostname));
    }
    if let Some(name_ns) = svc.hostname.strip_suffix(&format!(".svc.{domain}"))
        && let Some((name, ns)) = name_ns.split_once('.')
    {
        if ns == client_ns {
            out.extend([
                name.to_string(),
                format!("{name_ns}.svc"),
                name_ns.to_string(),
            ]);
        } else {
            out.extend([name_ns.to_string(), format!("{name_ns}.svc")]);
        }
    }
    if svc.resolution == ServiceResolution::Passthrough && svc.source == ServiceSource::Kubernetes {
        let wildcards: Vec<String> = out.iter().map(|d| format!("*.{d}")).collect();
        out.extend(wildcards);
    }
    for vip in svc.addresses.iter().filter(|a| a.as_str() != "0.0.0.0") {
        out.push(match vip.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(_)) => format!("[{vip}]"),
            _ => vip.clone(),
        });
    }
    out
}

/// Istio's last virtual host of a port's routes: `allow_any` to the
/// passthrough (or the Sidecar's egress proxy), or `block_all`, which
/// answers 502 with no body.
fn catch_all(policy: &OutboundPolicy) -> VirtualHost {
    let (name, action) = if policy.allow_any {
        let mut to = timed(Duration::ZERO);
        to.cluster_specifier = Some(route_action::ClusterSpecifier::Cluster(
            policy.cluster.clone(),
        ));
        ("allow_any", route::Action::Route(to))
    } else {
        (
            "block_all",
            route::Action::DirectResponse(DirectResponseAction {
                status: 502,
                ..Default::default()
            }),
        )
    };
    VirtualHost {
        name: name.into(),
        domains: vec!["*".into()],
        routes: vec![Route {
            name: name.into(),
            r#match: Some(route_match(None)),
            action: Some(action),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The virtual host of one service port: its VirtualService routes, else
/// Istio's default route.
fn virtual_host(
    ctx: &IstioContext,
    proxy: &Proxy,
    svc: &Service,
    port: u16,
    virtual_services: &[&Named<VirtualService>],
) -> VirtualHost {
    let mut routes = Vec::new();
    for vs in virtual_services {
        let clusters = Clusters {
            ctx,
            vs_ns: &vs.namespace,
            client: proxy,
            port,
            gateway_semantics: false,
        };
        for r in &vs.spec.http {
            let applies = |m: &&HttpMatchRequest| {
                m.port.is_none_or(|p| p == u32::from(port)) && source_matches(m, proxy)
            };
            if r.r#match.is_empty() {
                routes.push(vs_route(&clusters, &svc.hostname, r, None));
            } else {
                for m in r.r#match.iter().filter(applies) {
                    routes.push(vs_route(&clusters, &svc.hostname, r, Some(m)));
                }
            }
        }
    }
    if routes.is_empty() {
        let mut action = timed(Duration::ZERO);
        action.cluster_specifier = Some(route_action::ClusterSpecifier::Cluster(outbound_name(
            port,
            "",
            &svc.hostname,
        )));
        action.retry_policy = Some(default_retries());
        // Istio's `hashForService`: the rule's (port-level) consistent hash.
        action.hash_policy = ctx
            .destination_rule(proxy, svc)
            .and_then(|dr| hash::for_destination(&dr.spec, port, ""))
            .and_then(hash::hash_policy)
            .into_iter()
            .collect();
        routes.push(Route {
            name: "default".into(),
            r#match: Some(route_match(None)),
            action: Some(route::Action::Route(action)),
            decorator: Some(Decorator {
                operation: format!("{}:{port}/*", svc.hostname),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    VirtualHost {
        name: format!("{}:{port}", svc.hostname),
        domains: domains(svc, &proxy.namespace, &ctx.domain),
        routes,
        ..Default::default()
    }
}

/// What one route configuration is built from: the services with a virtual
/// host in it, each with its VirtualServices, and the catch-all's policy.
struct RoutePlan<'a> {
    name: &'a str,
    services: Vec<(&'a Arc<Service>, Vec<&'a Named<VirtualService>>)>,
    catch_all: Option<OutboundPolicy>,
}

impl RoutePlan<'_> {
    /// The XDS cache key: the plan, the destinations' services (their ports
    /// pick cluster names), the proxy's namespace and Sidecar (domains and
    /// `exportTo`), and its labels when a match asks for `sourceLabels`.
    fn key(&self, ctx: &IstioContext, proxy: &Proxy, scope: &SidecarScope) -> KeyBuilder {
        let mut key = KeyBuilder::new("RDS", self.name)
            .with(&proxy.namespace)
            .with(&scope.sidecar_key)
            .with(&self.catch_all);
        let mut source_labels = false;
        // The DestinationRules of the destinations: their consistent hash
        // goes into the routes.
        let dr = |svc: &Service| {
            ctx.destination_rule(proxy, svc)
                .map(|d| (d.namespace.clone(), d.name.clone()))
        };
        for (svc, vss) in &self.services {
            key.add((&svc.hostname, &svc.namespace, svc.revision));
            key.add(dr(svc));
            for vs in vss {
                key.add((&vs.namespace, &vs.name));
                for host in vs.spec.destination_hosts() {
                    let host = resolve_host(host, &vs.namespace, &ctx.domain);
                    let dest = ctx.registry.by_hostname(&host).next();
                    key.add(dest.map(|s| s.revision));
                    key.add(dest.and_then(|s| dr(s)));
                }
                source_labels |= vs
                    .spec
                    .http
                    .iter()
                    .flat_map(|r| &r.r#match)
                    .any(|m| !m.source_labels.is_empty());
            }
        }
        if source_labels {
            key.add(&proxy.labels);
        }
        key
    }

    fn dependencies(&self, ctx: &IstioContext, scope: &SidecarScope) -> Vec<Dependency> {
        let mut out = Vec::new();
        if !scope.sidecar_key.is_empty()
            && let Some((ns, name)) = scope.sidecar_key.split_once('/')
        {
            out.push(Dependency::Config(ObjectKey::new(Kind::Sidecar, ns, name)));
        }
        let dr = |svc: &Service| {
            ctx.destination_rule(scope, svc).map(|d| {
                Dependency::Config(ObjectKey::new(Kind::DestinationRule, &d.namespace, &d.name))
            })
        };
        for (svc, vss) in &self.services {
            out.push(Dependency::Service(svc.hostname.clone()));
            out.extend(dr(svc));
            for vs in vss {
                out.push(Dependency::Config(ObjectKey::new(
                    Kind::VirtualService,
                    &vs.namespace,
                    &vs.name,
                )));
                for host in vs.spec.destination_hosts() {
                    let host = resolve_host(host, &vs.namespace, &ctx.domain);
                    out.extend(ctx.registry.by_hostname(&host).next().and_then(|s| dr(s)));
                    out.push(Dependency::Service(host));
                }
            }
        }
        out.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        out.dedup();
        out
    }

    fn build(&self, ctx: &IstioContext, proxy: &Proxy, port: u16) -> RouteConfiguration {
        let mut vhosts: Vec<VirtualHost> = self
            .services
            .iter()
            .map(|(s, vss)| virtual_host(ctx, proxy, s, port, vss))
            .collect();
        vhosts.sort_by(|a, b| a.name.cmp(&b.name));
        vhosts.dedup_by(|a, b| a.name == b.name);
        if let Some(policy) = &self.catch_all {
            vhosts.push(catch_all(policy));
        }
        RouteConfiguration {
            name: self.name.to_string(),
            virtual_hosts: vhosts,
            validate_clusters: Some(BoolValue { value: false }),
            max_direct_response_body_size_bytes: Some(u32v(MAX_DIRECT_RESPONSE_BODY_BYTES)),
            ignore_port_in_host_matching: true,
            ..Default::default()
        }
    }
}

/// One route configuration: `"<port>"`, or `"<host>:<port>"` for a
/// detected-protocol listener. `None` for a name no listener of this proxy
/// could use.
fn route_config(ctx: &IstioContext, proxy: &Proxy, name: &str) -> Option<Arc<Resource>> {
    let (host, port) = match name.rsplit_once(':') {
        Some((host, port)) => (Some(host), port.parse::<u16>().ok()?),
        None => (None, name.parse::<u16>().ok()?),
    };
    // Istio's `GetEgressListenerForRDS`: the Sidecar's listener for this
    // port, else its catch-all (always the catch-all for detected ports).
    let scopes = ctx.egress_scopes(proxy);
    let port_of = |s: &&crate::pushctx::context::EgressScope<'_>| {
        s.listener
            .and_then(|l| l.port.as_ref())
            .map(|p| p.number)
            .unwrap_or(0)
    };
    let catch_all_scope = scopes.iter().find(|s| port_of(s) == 0);
    let scope = match host {
        Some(_) => catch_all_scope,
        None => scopes
            .iter()
            .find(|s| port_of(s) == u32::from(port))
            .or(catch_all_scope),
    }?;
    let sidecar_scope = ctx.scope(proxy);
    let shared = !*sidecar_scope
        .routes_need_labels
        .get_or_init(|| source_labels_matter(ctx, &proxy.namespace));
    if shared && let Some(r) = sidecar_scope.route(name) {
        ctx.cache.count_shared(1);
        return Some(r);
    }
    let plan = RoutePlan {
        name,
        services: sidecar_scope
            .egress_services(scope.index)
            .into_iter()
            .filter(|s| host.is_none_or(|h| s.hostname == h))
            .filter(|s| {
                s.port(port)
                    .is_some_and(|p| p.protocol.is_http() || p.protocol.is_unsupported())
            })
            .map(|s| (s, ctx.virtual_services_for(&proxy.namespace, &s.hostname)))
            .collect(),
        catch_all: host.is_none().then(|| ctx.outbound_policy(proxy)),
    };
    let key = plan.key(ctx, proxy, &sidecar_scope).key();
    let built = ctx.cache.get_or_build(
        key,
        name,
        ctx.seq,
        || plan.dependencies(ctx, &sidecar_scope),
        || Resource::encode(name.to_string(), &plan.build(ctx, proxy, port)),
    );
    if shared {
        sidecar_scope.keep_route(built.clone());
    }
    Some(built)
}

/// Whether a VirtualService exported to `namespace` matches on
/// `sourceLabels`: then route configurations depend on each proxy's labels.
fn source_labels_matter(ctx: &IstioContext, namespace: &str) -> bool {
    ctx.virtual_services.iter().any(|vs| {
        crate::model::service::is_exported_to(&vs.spec.export_to, &vs.namespace, namespace)
            && vs
                .spec
                .http
                .iter()
                .flat_map(|r| &r.r#match)
                .any(|m| !m.source_labels.is_empty())
    })
}

/// Route configurations for `names` (every name the proxy's listeners use
/// when empty).
pub fn build(ctx: &IstioContext, proxy: &Proxy, names: &BTreeSet<String>) -> Vec<Arc<Resource>> {
    let all;
    let names = if names.is_empty() {
        all = super::lds::route_names(ctx, proxy);
        &all
    } else {
        names
    };
    names
        .iter()
        .filter_map(|n| {
            if proxy.proxy_type == common::ProxyType::Router {
                let rc = gateway::route_config(ctx, proxy, n)?;
                Some(Arc::new(Resource::encode(n.clone(), &rc)))
            } else {
                route_config(ctx, proxy, n)
            }
        })
        .collect()
}
