//! What a debounced batch of config events means for proxies (Istio's
//! `ConfigsUpdated`, resolved): for each changed object, the proxies it can
//! reach and the types it can alter, worked out from the object itself and
//! from both the previous and the new push context, so that a deleted
//! service or a VirtualService moved to another host still reaches the
//! proxies that saw it. Also the XDS cache entries the batch invalidates.
//!
//! | changed | reaches | types |
//! |---|---|---|
//! | Service, ServiceEntry | proxies that see the service; its endpoints' proxies; proxies that see a VirtualService routing to it (RDS) | all |
//! | endpoints only (EndpointSlice, Pod, WorkloadEntry, Node, ServiceEntry endpoints) | proxies that see the service | EDS for its host (and CDS for DNS services, whose clusters carry endpoints); all for passthrough services (listeners and DNS names per endpoint) |
//! | a Pod or WorkloadEntry, or an endpoint that came, went or changed | the proxy at that IP | all |
//! | VirtualService | proxies it is exported to that see one of its hosts (old or new); for a delegate, those of the roots naming it | RDS (LDS too with tcp/tls routes) |
//! | DestinationRule | proxies it is exported to that see its host (one with a `workloadSelector`: its namespace's, as it decides which rule they get) | CDS, EDS, RDS, LDS |
//! | VirtualService bound to gateways | every router | RDS |
//! | Gateway | every router (sidecars ignore Gateways) | LDS, RDS |
//! | Secret | proxies of its namespace that watch it (gateways, sidecars with a `credentialName`) | SDS, its own resources only |
//! | Sidecar | proxies in its namespace (every proxy from the root namespace) | all |
//! | PeerAuthentication | proxies in its namespace (LDS); proxies that see its namespace's services (CDS, auto mTLS) | LDS, CDS |
//! | AuthorizationPolicy, RequestAuthentication, Telemetry, changed JWKS | proxies in its namespace (every proxy from the root namespace) | LDS |
//! | Namespace, mesh config, lost events | every proxy | all (the cache is cleared) |

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use crate::model::ROOT_NAMESPACE;
use crate::model::istio::{DestinationRule, VirtualService};
use crate::model::kube::Pod;
use crate::model::service::{Service, ServiceResolution};
use crate::model::{Kind, ObjectKey, Snapshot};
use crate::pushctx::cache::Dependency;
use crate::pushctx::context::{IstioContext, resolve_host};
use crate::pushctx::named::Named;
use crate::pushctx::push_request::{Audience, Change, ServiceRef, Types, Updates};

/// The triggers merged by debouncing, for one push.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    /// Changed objects, each `true` while every change of it was
    /// endpoint-only.
    pub objects: BTreeMap<ObjectKey, bool>,
    /// Anything may have changed (mesh config, lost events).
    pub everything: bool,
    /// RequestAuthentication public keys changed.
    pub jwks: bool,
    /// What triggered the push first, and how many triggers were merged.
    pub first: String,
    /// Triggers merged.
    pub count: usize,
}

impl Pending {
    /// A store batch's changes (one trigger).
    pub fn from_batch(batch: &crate::model::ConfigBatch) -> Self {
        let mut p = Pending {
            count: 1,
            ..Default::default()
        };
        for event in batch.events.iter() {
            if p.first.is_empty() {
                p.first = event.key.to_string();
            }
            let e = p.objects.entry(event.key.clone()).or_insert(true);
            *e &= event.endpoint_only;
        }
        p
    }

    /// Merges one more trigger.
    pub fn merge(&mut self, other: Pending) {
        if self.count == 0 {
            self.first = other.first;
        }
        self.count += other.count;
        self.everything |= other.everything;
        self.jwks |= other.jwks;
        for (key, endpoint_only) in other.objects {
            let e = self.objects.entry(key).or_insert(true);
            *e &= endpoint_only;
        }
    }

    /// Whether only endpoints changed.
    pub fn endpoints_only(&self) -> bool {
        !self.everything && !self.jwks && self.objects.values().all(|e| *e)
    }
}

/// Which cache entries a push invalidates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Clear {
    /// Every entry.
    All,
    /// The entries depending on these.
    Some(Vec<Dependency>),
}

/// The contexts and snapshots before and after the batch.
pub struct Views<'a> {
    /// The previous push context.
    pub old: &'a IstioContext,
    /// Its snapshot.
    pub old_snapshot: &'a Snapshot,
    /// The new push context.
    pub new: &'a IstioContext,
    /// Its snapshot.
    pub new_snapshot: &'a Snapshot,
}

/// The updates and cache invalidation of one push.
pub fn resolve(pending: &Pending, views: &Views<'_>) -> (Updates, Clear) {
    if pending.everything || pending.objects.keys().any(|k| k.kind == Kind::Namespace) {
        return (Updates::everything(), Clear::All);
    }
    let mut out = Resolved::default();
    if pending.jwks {
        out.changes.push(change("JWKS", Audience::All, Types::LDS));
    }
    for (key, endpoint_only) in &pending.objects {
        out.object(key, *endpoint_only, views);
    }
    (
        Updates {
            everything: false,
            changes: out.changes,
        },
        Clear::Some(out.clear),
    )
}

fn change(reason: &str, audience: Audience, types: Types) -> Change {
    Change {
        reason: reason.to_string(),
        audience,
        types,
        eds_hosts: None,
    }
}

/// A namespace's proxies, or every proxy for the root namespace.
fn namespace_audience(namespace: &str) -> Audience {
    if namespace == ROOT_NAMESPACE {
        Audience::All
    } else {
        Audience::Namespace(namespace.to_string())
    }
}

fn find<'a, T>(list: &'a [Named<T>], key: &ObjectKey) -> Option<&'a Named<T>> {
    list.iter()
        .find(|n| n.namespace == key.namespace && n.name == key.name)
}

/// The IPs a Pod or WorkloadEntry had in `snapshot`.
fn workload_ips(key: &ObjectKey, snapshot: &Snapshot) -> Vec<String> {
    match key.kind {
        Kind::Pod => snapshot
            .get_typed::<Pod>(&key.namespace, &key.name)
            .map(|p| {
                p.spec
                    .status
                    .pod_ip
                    .iter()
                    .cloned()
                    .chain(p.spec.status.pod_ips.iter().map(|i| i.ip.clone()))
                    .filter(|ip| !ip.is_empty())
                    .collect()
            })
            .unwrap_or_default(),
        Kind::WorkloadEntry => snapshot
            .get_typed::<crate::model::istio::WorkloadEntry>(&key.namespace, &key.name)
            .map(|w| vec![w.spec.address.clone()])
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

fn service_ref(s: &Service) -> ServiceRef {
    ServiceRef {
        hostname: s.hostname.clone(),
        namespace: s.namespace.clone(),
        export_to: s.export_to.clone(),
    }
}

#[derive(Default)]
struct Resolved {
    changes: Vec<Change>,
    clear: Vec<Dependency>,
    /// Whether the Gateway API's mesh routes were compared already (once
    /// per batch, however many routes it changed).
    mesh_routes_compared: bool,
    /// Whether the derived DestinationRules were compared already.
    backend_policies_compared: bool,
}

impl Resolved {
    fn object(&mut self, key: &ObjectKey, endpoint_only: bool, views: &Views<'_>) {
        let reason = key.to_string();
        match key.kind {
            Kind::Service
            | Kind::ServiceEntry
            | Kind::EndpointSlice
            | Kind::Pod
            | Kind::WorkloadEntry
            | Kind::Node => self.services(key, endpoint_only, views),
            Kind::VirtualService => {
                self.virtual_service(key, &reason, views);
                // A delegate is served through the roots that name it (in
                // the old context or the new): their proxies and caches.
                let roots: BTreeSet<ObjectKey> = [views.old, views.new]
                    .iter()
                    .flat_map(|ctx| ctx.roots_of(&key.namespace, &key.name))
                    .map(|vs| ObjectKey::new(Kind::VirtualService, &vs.namespace, &vs.name))
                    .collect();
                for root in roots.iter().filter(|r| *r != key) {
                    self.virtual_service(root, &reason, views);
                }
            }
            Kind::Secret => {
                // Only the Secret's own resources, to the proxies that may
                // read it and watch it (Istio's SDS `needsUpdate`).
                self.changes.push(change(
                    &reason,
                    Audience::Secret {
                        namespace: key.namespace.clone(),
                        name: key.name.clone(),
                    },
                    Types::SDS,
                ));
                // A Gateway API listener naming it is programmed or not
                // with it (Istio recomputes its Gateways on Secrets).
                if [views.old_snapshot, views.new_snapshot].iter().any(|s| {
                    crate::model::gateway_api::listener_tls::references_secret(
                        s,
                        &key.namespace,
                        &key.name,
                    )
                }) {
                    self.changes
                        .push(change(&reason, Audience::Routers, Types::LDS | Types::RDS));
                }
            }
            // BackendTLSPolicies become DestinationRules; a ConfigMap is
            // the CA of some (and of frontendValidation), served over SDS.
            Kind::BackendTlsPolicy | Kind::ConfigMap => {
                if key.kind == Kind::ConfigMap {
                    self.changes.push(change(
                        &reason,
                        Audience::Secret {
                            namespace: key.namespace.clone(),
                            name: key.name.clone(),
                        },
                        Types::SDS,
                    ));
                    self.changes
                        .push(change(&reason, Audience::Routers, Types::LDS | Types::RDS));
                }
                self.derived_destination_rules(views);
            }
            Kind::Gateway => {
                // Sidecars ignore Gateways (Istio's `UnAffectedConfigKinds`).
                self.changes
                    .push(change(&reason, Audience::Routers, Types::LDS | Types::RDS));
                self.clear.push(Dependency::Config(key.clone()));
            }
            Kind::DestinationRule => {
                let domain = &views.new.domain;
                let audiences = [views.old, views.new].map(|ctx| {
                    find(&ctx.destination_rules, key)
                        .map(|dr| destination_rule_audience(dr, domain))
                });
                // Its consistent hash also goes into routes (RDS) and TCP
                // proxies (LDS).
                self.config(
                    key,
                    audiences,
                    Types::CDS | Types::EDS | Types::RDS | Types::LDS,
                );
                // A gateway's tcp_proxy takes `tcp.maxConnectionDuration`
                // from its destination's DestinationRule, as Istio's does.
                self.changes
                    .push(change(&reason, Audience::Routers, Types::LDS));
            }
            Kind::Sidecar => {
                self.changes.push(change(
                    &reason,
                    namespace_audience(&key.namespace),
                    Types::ALL,
                ));
                self.clear.push(Dependency::Config(key.clone()));
            }
            Kind::PeerAuthentication => {
                // Inbound chains of the namespace's workloads, and the auto
                // mTLS of clients of its services (the cluster cache keys by
                // the mode, so nothing is cleared).
                self.changes.push(change(
                    &reason,
                    namespace_audience(&key.namespace),
                    Types::LDS,
                ));
                let clients = if key.namespace == ROOT_NAMESPACE {
                    Audience::All
                } else {
                    Audience::ServiceNamespace(key.namespace.clone())
                };
                self.changes.push(change(&reason, clients, Types::CDS));
            }
            Kind::EnvoyFilter => {
                // Patches are applied after the cache, per proxy: nothing
                // cached is cleared; the proxies of the namespace (all, for
                // the root namespace) get new listeners, routes and clusters.
                self.changes.push(change(
                    &reason,
                    namespace_audience(&key.namespace),
                    Types::LDS | Types::RDS | Types::CDS,
                ));
            }
            Kind::AuthorizationPolicy | Kind::RequestAuthentication | Kind::Telemetry => {
                self.changes.push(change(
                    &reason,
                    namespace_audience(&key.namespace),
                    Types::LDS,
                ));
            }
            // The Gateway API becomes Gateways and VirtualServices bound to
            // them: only routers see them (Istio pushes gateways for these).
            // Ingresses too (Istio's ingress controller feeds Gateways and
            // VirtualServices bound to them).
            Kind::GatewayClass
            | Kind::KubernetesGateway
            | Kind::ReferenceGrant
            | Kind::ListenerSet
            | Kind::Ingress
            | Kind::IngressClass => {
                self.changes
                    .push(change(&reason, Audience::Routers, Types::LDS | Types::RDS));
            }
            // Routes also make mesh routes (a Service parent): the
            // sidecars calling the Service see them as VirtualServices.
            Kind::HttpRoute | Kind::GrpcRoute | Kind::TcpRoute | Kind::TlsRoute => {
                self.changes
                    .push(change(&reason, Audience::Routers, Types::LDS | Types::RDS));
                self.mesh_routes(&reason, views);
            }
            // Handled before: every proxy.
            Kind::Namespace => {}
            // Applied at injection, to the Pods admitted next (Istio's
            // injector reads them the same way): nothing istiod serves
            // over xDS depends on them.
            Kind::ProxyConfig => {}
            // Read by the autoregistration controller when a proxy
            // connects; its WorkloadEntries are what proxies see.
            Kind::WorkloadGroup => {}
        }
    }

    /// A served VirtualService's change: the proxies that see its hosts
    /// (routes; listeners too when it has tcp or tls routes, which are
    /// filter chains), and every router when it binds gateways.
    fn virtual_service(&mut self, key: &ObjectKey, reason: &str, views: &Views<'_>) {
        let domain = &views.new.domain;
        let found = [views.old, views.new].map(|ctx| find(&ctx.virtual_services, key));
        let l4 = found
            .iter()
            .flatten()
            .any(|vs| !vs.spec.tcp.is_empty() || !vs.spec.tls.is_empty());
        let types = if l4 {
            Types::RDS | Types::LDS
        } else {
            Types::RDS
        };
        self.config(
            key,
            found.map(|vs| vs.map(|vs| virtual_service_audience(vs, domain))),
            types,
        );
        // Gateways route VirtualServices bound to them, whatever
        // their hosts: Istio pushes routers for these too (their
        // listeners too: tcp and tls routes are filter chains).
        let for_gateways = found
            .iter()
            .flatten()
            .any(|vs| vs.spec.gateways.iter().any(|g| g != "mesh"));
        if for_gateways {
            self.changes
                .push(change(reason, Audience::Routers, Types::LDS | Types::RDS));
        }
    }

    /// The Gateway API's mesh VirtualServices (generated, so named with
    /// `~`, which no stored object's name holds) that differ between the
    /// old and the new context: changed as VirtualServices do.
    fn mesh_routes(&mut self, reason: &str, views: &Views<'_>) {
        if std::mem::replace(&mut self.mesh_routes_compared, true) {
            return;
        }
        let generated = |ctx: &IstioContext| -> Vec<ObjectKey> {
            ctx.virtual_services
                .iter()
                .filter(|vs| vs.name.contains('~') && vs.spec.gateways == ["mesh"])
                .map(|vs| ObjectKey::new(Kind::VirtualService, &vs.namespace, &vs.name))
                .collect()
        };
        let keys: BTreeSet<ObjectKey> = generated(views.old)
            .into_iter()
            .chain(generated(views.new))
            .collect();
        for key in keys {
            let old = find(&views.old.virtual_services, &key).map(|vs| &vs.spec);
            let new = find(&views.new.virtual_services, &key).map(|vs| &vs.spec);
            if old != new {
                self.virtual_service(&key, reason, views);
            }
        }
    }

    /// The DestinationRules derived from BackendTLSPolicies (generated,
    /// so named with `~`) that differ between the old and the new context:
    /// changed as DestinationRules do.
    fn derived_destination_rules(&mut self, views: &Views<'_>) {
        if std::mem::replace(&mut self.backend_policies_compared, true) {
            return;
        }
        let generated = |ctx: &IstioContext| -> Vec<ObjectKey> {
            ctx.destination_rules
                .iter()
                .filter(|dr| dr.name.contains('~'))
                .map(|dr| ObjectKey::new(Kind::DestinationRule, &dr.namespace, &dr.name))
                .collect()
        };
        let keys: BTreeSet<ObjectKey> = generated(views.old)
            .into_iter()
            .chain(generated(views.new))
            .collect();
        for key in keys {
            let old = find(&views.old.destination_rules, &key).map(|dr| &dr.spec);
            let new = find(&views.new.destination_rules, &key).map(|dr| &dr.spec);
            if old != new {
                self.object(&key, false, views);
            }
        }
    }

    /// A routing config's change, as it was and as it is, and the cache
    /// entries built from it.
    fn config(&mut self, key: &ObjectKey, audiences: [Option<Audience>; 2], types: Types) {
        for audience in audiences.into_iter().flatten() {
            self.changes.push(change(&key.to_string(), audience, types));
        }
        self.clear.push(Dependency::Config(key.clone()));
    }

    /// A change of an object the service registry is built from.
    fn services(&mut self, key: &ObjectKey, endpoint_only: bool, views: &Views<'_>) {
        let reason = key.to_string();
        let old = views.old.registry.services_from(key, views.old_snapshot);
        let new = views.new.registry.services_from(key, views.new_snapshot);
        let hosts: BTreeSet<String> = old
            .iter()
            .chain(new.iter())
            .map(|s| s.hostname.clone())
            .collect();
        let refs: Vec<ServiceRef> = old
            .iter()
            .chain(new.iter())
            .map(|s| service_ref(s))
            .collect();
        // The proxies whose own workload changed: the object's IPs, and
        // endpoints that came, went or changed (their inbound listeners and
        // workload labels come from them).
        let mut ips: BTreeSet<String> = workload_ips(key, views.old_snapshot)
            .into_iter()
            .chain(workload_ips(key, views.new_snapshot))
            .collect();
        ips.extend(changed_endpoint_ips(&old, &new, !endpoint_only));
        if !ips.is_empty() {
            self.changes
                .push(change(&reason, Audience::Workloads(ips), Types::ALL));
        }
        // A passthrough service's endpoints are in its listeners (one per
        // endpoint address) and its DNS names: a full push, as Istio's
        // endpoint controller makes for headless Services.
        let passthrough = old.iter().chain(new.iter()).any(|s| s.is_passthrough());
        if !refs.is_empty() {
            if endpoint_only && !passthrough {
                // DNS services' clusters carry their endpoints.
                let dns = old
                    .iter()
                    .chain(new.iter())
                    .any(|s| s.resolution != ServiceResolution::ClientSideLb);
                let types = if dns {
                    Types::CDS | Types::EDS
                } else {
                    Types::EDS
                };
                self.changes.push(Change {
                    reason: reason.clone(),
                    audience: Audience::Services(refs),
                    types,
                    eds_hosts: Some(hosts.clone()),
                });
            } else {
                self.changes
                    .push(change(&reason, Audience::Services(refs), Types::ALL));
                self.routes_to(&reason, &hosts, views);
            }
        }
        self.clear
            .extend(hosts.into_iter().map(Dependency::Service));
    }

    /// VirtualServices routing to a changed service: their route
    /// configurations (and, for tcp/tls routes, listeners) name its
    /// clusters (by its ports).
    fn routes_to(&mut self, reason: &str, hosts: &BTreeSet<String>, views: &Views<'_>) {
        for ctx in [views.old, views.new] {
            for vs in &ctx.virtual_services {
                let here = |h: &str| hosts.contains(&resolve_host(h, &vs.namespace, &ctx.domain));
                let routes_here = vs.spec.destination_hosts().any(here);
                // tcp and tls routes are listeners' filter chains.
                let l4_here = vs
                    .spec
                    .tcp
                    .iter()
                    .flat_map(|r| &r.route)
                    .chain(vs.spec.tls.iter().flat_map(|r| &r.route))
                    .any(|d| here(&d.destination.host));
                if routes_here || l4_here {
                    let types = if l4_here {
                        Types::RDS | Types::LDS
                    } else {
                        Types::RDS
                    };
                    self.changes.push(change(
                        reason,
                        virtual_service_audience(vs, &ctx.domain),
                        types,
                    ));
                }
            }
        }
    }
}

/// The IPs of endpoints that differ between the old and new services
/// (every endpoint's IP when `all`, e.g. when the ports changed).
fn changed_endpoint_ips(old: &[&Arc<Service>], new: &[&Arc<Service>], all: bool) -> Vec<String> {
    let endpoints =
        |services: &[&Arc<Service>]| -> HashSet<(String, crate::model::service::Endpoint)> {
            services
                .iter()
                .flat_map(|s| s.endpoints.iter().map(|e| (s.hostname.clone(), e.clone())))
                .collect()
        };
    let (before, after) = (endpoints(old), endpoints(new));
    if all {
        return before
            .union(&after)
            .map(|(_, e)| e.address.clone())
            .collect();
    }
    before
        .symmetric_difference(&after)
        .map(|(_, e)| e.address.clone())
        .collect()
}

fn virtual_service_audience(vs: &Named<VirtualService>, domain: &str) -> Audience {
    Audience::Hosts {
        namespace: vs.namespace.clone(),
        export_to: vs.spec.export_to.clone(),
        hosts: vs
            .spec
            .hosts
            .iter()
            .map(|h| resolve_host(h, &vs.namespace, domain))
            .collect(),
    }
}

fn destination_rule_audience(dr: &Named<DestinationRule>, domain: &str) -> Audience {
    // A rule with a selector is not exported (Istio's `setDestinationRules`);
    // it decides for every proxy of its namespace that sees the host which
    // rule applies (the selected ones get it, the others then get the
    // namespace's rule without selector, or none).
    let export_to = if dr.spec.workload_selector.is_some() {
        vec![".".to_string()]
    } else {
        dr.spec.export_to.clone()
    };
    Audience::Hosts {
        namespace: dr.namespace.clone(),
        export_to,
        hosts: vec![resolve_host(&dr.spec.host, &dr.namespace, domain)],
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn snapshot(yaml: &str) -> Arc<Snapshot> {
        let store = crate::model::ConfigStore::new();
        let parsed = crate::model::parse_file("t.yaml", yaml).unwrap();
        store.apply(
            parsed
                .objects
                .into_iter()
                .map(|o| crate::model::Update::Upsert(Arc::new(o))),
        );
        store.snapshot()
    }

    const ROOT: &str = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: root, namespace: demo}\nspec: {hosts: [a], http: [{delegate: {name: d, namespace: team}}]}\n";

    fn delegate(host: &str) -> String {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: d, namespace: team}}\nspec: {{http: [{{route: [{{destination: {{host: {host}}}}}]}}]}}\n"
        )
    }

    /// Editing a delegate alone reaches the proxies of the roots naming it
    /// (their routes) and clears the roots' cached routes.
    #[test]
    fn a_delegate_change_pushes_its_roots() {
        let old_snapshot = snapshot(&format!("{ROOT}---\n{}", delegate("v1")));
        let new_snapshot = snapshot(&format!("{ROOT}---\n{}", delegate("v2")));
        let options = crate::model::RegistryOptions::default();
        let old = IstioContext::new("t/1".into(), &old_snapshot, &options);
        let new = IstioContext::new("t/2".into(), &new_snapshot, &options);
        let key = ObjectKey::new(Kind::VirtualService, "team", "d");
        let pending = Pending {
            objects: BTreeMap::from([(key, false)]),
            count: 1,
            ..Default::default()
        };
        let views = Views {
            old: &old,
            old_snapshot: &old_snapshot,
            new: &new,
            new_snapshot: &new_snapshot,
        };
        let (updates, clear) = resolve(&pending, &views);
        let root_hosts = Audience::Hosts {
            namespace: "demo".into(),
            export_to: Vec::new(),
            hosts: vec!["a.demo.svc.cluster.local".into()],
        };
        assert!(
            updates
                .changes
                .iter()
                .any(|c| c.audience == root_hosts && c.types == Types::RDS),
            "{updates:#?}"
        );
        let Clear::Some(deps) = clear else {
            panic!("scoped")
        };
        assert!(deps.contains(&Dependency::Config(ObjectKey::new(
            Kind::VirtualService,
            "demo",
            "root"
        ))));
    }

    /// A GRPCRoute whose parent is a Service reaches the sidecars calling
    /// the Service (routes, and the mesh VirtualService's cache entries),
    /// not only the gateways.
    #[test]
    fn a_mesh_route_change_pushes_the_sidecars_of_its_service() {
        let route = |method: &str| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {{name: r, namespace: demo}}\nspec:\n  parentRefs: [{{group: \"\", kind: Service, name: echo}}]\n  rules: [{{matches: [{{method: {{service: e.E, method: {method}}}}}]}}]\n"
            )
        };
        let old_snapshot = snapshot(&route("A"));
        let new_snapshot = snapshot(&route("B"));
        let options = crate::model::RegistryOptions::default();
        let old = IstioContext::new("t/1".into(), &old_snapshot, &options);
        let new = IstioContext::new("t/2".into(), &new_snapshot, &options);
        let pending = Pending {
            objects: BTreeMap::from([(ObjectKey::new(Kind::GrpcRoute, "demo", "r"), false)]),
            count: 1,
            ..Default::default()
        };
        let views = Views {
            old: &old,
            old_snapshot: &old_snapshot,
            new: &new,
            new_snapshot: &new_snapshot,
        };
        let (updates, clear) = resolve(&pending, &views);
        let callers = Audience::Hosts {
            namespace: "demo".into(),
            export_to: Vec::new(),
            hosts: vec!["echo.demo.svc.cluster.local".into()],
        };
        assert!(
            updates
                .changes
                .iter()
                .any(|c| c.audience == callers && c.types == Types::RDS),
            "{updates:#?}"
        );
        let Clear::Some(deps) = clear else {
            panic!("scoped")
        };
        assert!(
            deps.contains(&Dependency::Config(ObjectKey::new(
                Kind::VirtualService,
                "demo",
                "demo~echo.demo.svc.cluster.local"
            ))),
            "{deps:?}"
        );
    }
}
