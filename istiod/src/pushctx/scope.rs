//! Istio's `SidecarScope`: what the outbound side of one proxy can see, computed
//! once per push context for every (namespace, Sidecar) pair and shared by
//! every proxy with that pair. Generators read the services from here rather
//! than filtering the registry per proxy, the cache keys route configurations
//! by it, and push scoping asks it whether a change is visible.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::model::istio::{DestinationRule, IstioEgressListener, Sidecar};
use crate::model::service::{
    ExportTo, Service, ServiceRegistry, egress_host_matches, host_matches,
};

use super::Resource;
use super::named::Named;

/// The services one egress scope of a Sidecar admits (or, without a
/// Sidecar or without egress listeners, the implicit catch-all).
#[derive(Debug)]
pub struct EgressServices {
    /// The listener's index in the Sidecar's `egress`; `None` for the catch-all.
    pub listener: Option<usize>,
    /// Indices into [`SidecarScope::services`].
    pub services: Vec<usize>,
}

/// One proxy namespace seen through one Sidecar (or none).
#[derive(Debug)]
pub struct SidecarScope {
    /// The proxies' namespace.
    pub namespace: String,
    /// The Sidecar's index in the push context's list, if one applies.
    pub sidecar: Option<usize>,
    /// The Sidecar's `namespace/name`, for cache keys; empty without one.
    pub sidecar_key: String,
    /// The DestinationRules with a `workloadSelector` that select the
    /// scope's proxies (indices into the push context's list): they win
    /// over the namespace's other rules for these proxies.
    pub destination_rules: Vec<usize>,
    /// Visible services (exported to the namespace and allowed by an egress
    /// listener of the Sidecar), in registry order.
    services: Vec<Arc<Service>>,
    /// The first visible service of each host name.
    by_host: HashMap<String, usize>,
    /// Per egress scope, in the Sidecar's order.
    egress: Vec<EgressServices>,
    /// The namespaces the visible services are defined in.
    namespaces: HashSet<String>,
    /// The egress hosts of the Sidecar (`ns/host`), to decide whether a
    /// service that is not in the registry now (deleted) was visible.
    egress_hosts: Vec<(String, Vec<String>)>,
    /// The outbound clusters of every proxy with this scope, built (or
    /// taken from the XDS cache) by the first proxy that asks.
    pub(crate) outbound_clusters: OnceLock<Arc<[Arc<Resource>]>>,
    /// The load assignments of those clusters, by name, likewise.
    pub(crate) load_assignments: OnceLock<HashMap<String, Arc<Resource>>>,
    /// The EDS clusters whose load assignment depends on each proxy's
    /// locality, with the locality setting that applies.
    pub(crate) locality_plans: OnceLock<HashMap<String, super::locality::LocalityPlan>>,
    /// The outbound listeners, by what else they depend on (the proxy's IP
    /// families and interception mode).
    outbound_listeners: Mutex<HashMap<String, Arc<[Arc<Resource>]>>>,
    /// Route configurations by name, when no VirtualService the scope sees
    /// matches on `sourceLabels` (they are then the same for every proxy).
    routes: Mutex<HashMap<String, Arc<Resource>>>,
    /// Whether a VirtualService exported here matches on `sourceLabels`.
    pub(crate) routes_need_labels: OnceLock<bool>,
    /// Whether a VirtualService exported here matches `tcp`/`tls` routes
    /// on `sourceLabels` (outbound listeners then differ by labels).
    pub(crate) listeners_need_labels: OnceLock<bool>,
}

fn admitted(listener: &IstioEgressListener, sidecar_ns: &str, svc: &Service) -> bool {
    listener
        .hosts
        .iter()
        .any(|h| egress_host_matches(h, sidecar_ns, &svc.namespace, &svc.hostname))
}

impl SidecarScope {
    /// Computes the scope of proxies in `namespace` under `sidecar`.
    pub fn new(
        registry: &ServiceRegistry,
        namespace: &str,
        sidecar: Option<(usize, &Named<Sidecar>)>,
        selected_rules: &[(usize, &Named<DestinationRule>)],
    ) -> Self {
        let listeners: Vec<&IstioEgressListener> = sidecar
            .map(|(_, sc)| sc.spec.egress.iter().collect())
            .unwrap_or_default();
        let sidecar_ns = sidecar.map(|(_, sc)| sc.namespace.as_str()).unwrap_or("");
        let mut services = Vec::new();
        let mut egress: Vec<EgressServices> = if listeners.is_empty() {
            vec![EgressServices {
                listener: None,
                services: Vec::new(),
            }]
        } else {
            (0..listeners.len())
                .map(|i| EgressServices {
                    listener: Some(i),
                    services: Vec::new(),
                })
                .collect()
        };
        for svc in registry.visible_to(namespace) {
            let mut seen = false;
            for e in egress.iter_mut() {
                let admits = e
                    .listener
                    .is_none_or(|i| admitted(listeners[i], sidecar_ns, svc));
                if admits {
                    if !seen {
                        services.push(svc.clone());
                        seen = true;
                    }
                    e.services.push(services.len() - 1);
                }
            }
        }
        let mut by_host = HashMap::new();
        for (i, svc) in services.iter().enumerate() {
            by_host.entry(svc.hostname.clone()).or_insert(i);
        }
        let namespaces = services.iter().map(|s| s.namespace.clone()).collect();
        let egress_hosts = listeners
            .iter()
            .map(|l| (sidecar_ns.to_string(), l.hosts.clone()))
            .collect();
        Self {
            namespace: namespace.to_string(),
            sidecar: sidecar.map(|(i, _)| i),
            sidecar_key: sidecar
                .map(|(_, sc)| format!("{}/{}", sc.namespace, sc.name))
                .unwrap_or_default(),
            destination_rules: selected_rules.iter().map(|(i, _)| *i).collect(),
            services,
            by_host,
            egress,
            namespaces,
            egress_hosts,
            outbound_clusters: OnceLock::new(),
            load_assignments: OnceLock::new(),
            locality_plans: OnceLock::new(),
            outbound_listeners: Mutex::default(),
            routes: Mutex::default(),
            routes_need_labels: OnceLock::new(),
            listeners_need_labels: OnceLock::new(),
        }
    }

    /// The visible services, in registry order.
    pub fn services(&self) -> &[Arc<Service>] {
        &self.services
    }

    /// The first visible service named `host`.
    pub fn service(&self, host: &str) -> Option<&Arc<Service>> {
        self.by_host.get(host).map(|i| &self.services[*i])
    }

    /// The services of one egress scope (see [`EgressServices::listener`]).
    pub fn egress_services(&self, listener: Option<usize>) -> Vec<&Arc<Service>> {
        self.egress
            .iter()
            .find(|e| e.listener == listener)
            .map(|e| e.services.iter().map(|i| &self.services[*i]).collect())
            .unwrap_or_default()
    }

    /// Whether some visible service's host matches `pattern` (a host or a
    /// `*.` wildcard, as VirtualService and DestinationRule hosts are).
    pub fn sees_host(&self, pattern: &str) -> bool {
        if pattern == "*" {
            return !self.services.is_empty();
        }
        if !pattern.contains('*') {
            return self.by_host.contains_key(pattern);
        }
        self.services
            .iter()
            .any(|s| host_matches(pattern, &s.hostname))
    }

    /// Whether a service defined in `namespace` as `hostname` with
    /// `export_to` would be visible here, whether or not the registry holds
    /// it now (push scoping asks about deleted services too).
    pub fn admits(&self, namespace: &str, hostname: &str, export_to: &ExportTo) -> bool {
        if !export_to.is_visible_to(&self.namespace) {
            return false;
        }
        self.egress_hosts.is_empty()
            || self.egress_hosts.iter().any(|(sidecar_ns, hosts)| {
                hosts
                    .iter()
                    .any(|h| egress_host_matches(h, sidecar_ns, namespace, hostname))
            })
    }

    /// The outbound listeners for `key`, built by the first proxy that asks.
    pub(crate) fn outbound_listeners(
        &self,
        key: &str,
        build: impl FnOnce() -> Vec<Arc<Resource>>,
    ) -> Arc<[Arc<Resource>]> {
        let mut memo = self
            .outbound_listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        memo.entry(key.to_string())
            .or_insert_with(|| build().into())
            .clone()
    }

    /// The route configuration `name` if an earlier proxy of the scope built it.
    pub(crate) fn route(&self, name: &str) -> Option<Arc<Resource>> {
        self.routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// Keeps a route configuration for the scope's other proxies.
    pub(crate) fn keep_route(&self, r: Arc<Resource>) {
        self.routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(r.name.clone(), r);
    }

    /// Whether a visible service is defined in `namespace`.
    pub fn sees_namespace(&self, namespace: &str) -> bool {
        self.namespaces.contains(namespace)
    }
}
