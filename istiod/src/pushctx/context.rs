//! Istio's push context: one immutable snapshot of services, endpoints and
//! Istio config per push, with the per-proxy lookups the generators use
//! (Sidecar scope, `exportTo`, DestinationRule and VirtualService selection,
//! PeerAuthentication mode, outbound traffic policy, inbound ports).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use crate::mesh::MeshConfig;
use crate::model::ROOT_NAMESPACE;
use crate::model::istio::{
    CaptureMode, DestinationRule, IstioEgressListener, Labels, MtlsMode, OutboundMode,
    PeerAuthentication, PolicySelector, Sidecar, VirtualService, WorkloadSelector,
};
use crate::model::security::{AuthorizationPolicy, RequestAuthentication};
use crate::model::service::{Protocol, Service, ServiceRegistry, host_matches, is_exported_to};
use crate::model::store::Snapshot;

use super::Proxy;
use super::cache::XdsCache;
use super::named::Named;
use super::scope::SidecarScope;

mod delegate;

/// The push context.
pub struct IstioContext {
    pub(crate) version: String,
    /// Services and endpoints.
    pub registry: ServiceRegistry,
    /// DNS domain (`cluster.local`).
    pub domain: String,
    /// SPIFFE trust domain.
    pub trust_domain: String,
    /// The registry's cluster (`CLUSTER_ID`), in endpoint metadata.
    pub cluster_id: String,
    /// DestinationRules.
    pub destination_rules: Vec<Named<DestinationRule>>,
    /// VirtualServices as served: roots merged with their delegates, the
    /// delegates themselves left out.
    pub virtual_services: Vec<Named<VirtualService>>,
    /// The delegates each root VirtualService names, by (namespace, name).
    delegate_uses: std::collections::BTreeMap<delegate::VsKey, Vec<delegate::VsKey>>,
    /// PeerAuthentications.
    pub peer_authentications: Vec<Named<PeerAuthentication>>,
    /// Sidecars.
    pub sidecars: Vec<Named<Sidecar>>,
    /// Gateways (for router proxies only).
    pub gateways: Vec<Named<crate::model::gateway::Gateway>>,
    /// AuthorizationPolicies.
    pub authorization_policies: Vec<Named<AuthorizationPolicy>>,
    /// RequestAuthentications.
    pub request_authentications: Vec<Named<RequestAuthentication>>,
    /// Telemetry resources.
    pub telemetries: Vec<crate::model::telemetry::NamedTelemetry>,
    /// Secrets by (namespace, name), for gateway credentials (SDS).
    pub secrets: HashMap<(String, String), Arc<crate::model::Object>>,
    /// ConfigMaps by (namespace, name), for Gateway API CAs (SDS).
    pub config_maps: HashMap<(String, String), Arc<crate::model::Object>>,
    /// The Gateway API's ReferenceGrants (SDS of Secrets of other namespaces).
    pub reference_grants: crate::model::gateway_api::references::ReferenceGrants,
    /// Pod labels by Pod IP, for proxies whose Pod no Service lists yet.
    pub pod_labels: std::collections::HashMap<String, Labels>,
    /// What the generators apply from the mesh config.
    pub mesh: MeshConfig,
    /// Istio's feature flags.
    pub features: crate::model::features::Features,
    /// The JWKS of RequestAuthentication `jwksUri`s, fetched by istiod.
    pub jwks: Arc<crate::jwks::JwksResolver>,
    /// EnvoyFilters, in Istio's order, applied after generation.
    pub envoy_filters: super::envoyfilter::EnvoyFilters,
    /// Generated resources shared across proxies and pushes.
    pub cache: Arc<XdsCache>,
    /// The push sequence this context was built for (the cache's token).
    pub seq: u64,
    /// Lookups built once per context.
    index: Index,
    /// Sidecar scopes by (proxy namespace, Sidecar index, selecting
    /// DestinationRules), computed on first use.
    scopes: Mutex<HashMap<ScopeKey, Arc<SidecarScope>>>,
}

/// A proxy namespace, the index of the Sidecar that applies there, and the
/// DestinationRules with a `workloadSelector` that select the proxy (most
/// proxies have none, and share the scope of their namespace and Sidecar).
type ScopeKey = (String, Option<usize>, Vec<usize>);

/// Who asks which DestinationRule applies (Istio's
/// `SidecarScope.DestinationRule` with the proxy): a proxy, whose
/// workload labels pick the rules with a `workloadSelector` of its
/// namespace, or a Sidecar scope, which knows the rules that select its
/// proxies.
#[derive(Clone, Copy)]
pub enum DrClient<'a> {
    /// A proxy (its labels are its workload's: see `workload_labels`).
    Proxy(&'a Proxy),
    /// The scope of the proxies asking.
    Scope(&'a SidecarScope),
}

impl<'a> From<&'a Proxy> for DrClient<'a> {
    fn from(p: &'a Proxy) -> Self {
        DrClient::Proxy(p)
    }
}

impl<'a> From<&'a SidecarScope> for DrClient<'a> {
    fn from(s: &'a SidecarScope) -> Self {
        DrClient::Scope(s)
    }
}

impl DrClient<'_> {
    fn namespace(&self) -> &str {
        match self {
            DrClient::Proxy(p) => &p.namespace,
            DrClient::Scope(s) => &s.namespace,
        }
    }

    /// Whether the rule at `index` (with a selector, of the client's
    /// namespace) selects the client.
    fn selected_by(&self, index: usize, dr: &Named<DestinationRule>) -> bool {
        match self {
            DrClient::Proxy(p) => dr_selects(&dr.spec.workload_selector, &p.labels),
            DrClient::Scope(s) => s.destination_rules.contains(&index),
        }
    }
}

/// The push context's lookups, built with it: VirtualServices by host,
/// DestinationRules by namespace, and workloads by IP, so a generator's
/// question costs a map lookup rather than a scan of every object.
#[derive(Debug, Default)]
struct Index {
    /// VirtualServices for sidecars (`mesh`) by resolved exact host.
    vs_by_host: HashMap<String, Vec<usize>>,
    /// VirtualServices for sidecars with a wildcard host: (host, index).
    vs_wildcards: Vec<(String, usize)>,
    /// DestinationRules by namespace, with their resolved host.
    dr_by_namespace: HashMap<String, Vec<(String, usize)>>,
    /// DestinationRules with a `workloadSelector`, by namespace.
    dr_selectors_by_namespace: HashMap<String, Vec<usize>>,
    /// (service index, endpoint index, service port, target port) of every
    /// endpoint by IP, in registry order.
    inbound_by_ip: HashMap<String, Vec<(usize, usize, u16, u16)>>,
}

impl Index {
    fn new(
        domain: &str,
        registry: &ServiceRegistry,
        virtual_services: &[Named<VirtualService>],
        destination_rules: &[Named<DestinationRule>],
    ) -> Self {
        let mut index = Index::default();
        for (i, vs) in virtual_services.iter().enumerate() {
            let for_mesh =
                vs.spec.gateways.is_empty() || vs.spec.gateways.iter().any(|g| g == "mesh");
            if !for_mesh {
                continue;
            }
            for h in &vs.spec.hosts {
                let host = resolve_host(h, &vs.namespace, domain);
                if host.contains('*') {
                    index.vs_wildcards.push((host, i));
                } else {
                    let list = index.vs_by_host.entry(host).or_default();
                    if list.last() != Some(&i) {
                        list.push(i);
                    }
                }
            }
        }
        for (i, dr) in destination_rules.iter().enumerate() {
            index
                .dr_by_namespace
                .entry(dr.namespace.clone())
                .or_default()
                .push((resolve_host(&dr.spec.host, &dr.namespace, domain), i));
            if dr.spec.workload_selector.is_some() {
                index
                    .dr_selectors_by_namespace
                    .entry(dr.namespace.clone())
                    .or_default()
                    .push(i);
            }
        }
        // Rules with a selector first, as Istio sorts them
        // (`sortConfigBySelectorAndCreationTime`): a lookup that meets a
        // rule without one has seen every selector rule before it.
        for list in index.dr_by_namespace.values_mut() {
            list.sort_by_key(|(_, i)| destination_rules[*i].spec.workload_selector.is_none());
        }
        for (s, svc) in registry.services().iter().enumerate() {
            for (e, ep) in svc.endpoints.iter().enumerate() {
                index
                    .inbound_by_ip
                    .entry(ep.address.clone())
                    .or_default()
                    .push((s, e, ep.service_port, ep.port));
            }
        }
        index
    }
}

/// The PeerAuthentications that decide one workload's modes.
struct PeerPolicies<'a> {
    workload: Option<&'a PeerAuthentication>,
    namespace: Option<&'a PeerAuthentication>,
    mesh: Option<&'a PeerAuthentication>,
}

/// Where a proxy's traffic to destinations outside the registry goes
/// (Istio's `SidecarScope.OutboundTrafficPolicy`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OutboundPolicy {
    /// `ALLOW_ANY` (else `REGISTRY_ONLY`).
    pub allow_any: bool,
    /// `PassthroughCluster`, the Sidecar's `egressProxy` cluster under
    /// `ALLOW_ANY`, or `BlackHoleCluster` under `REGISTRY_ONLY`.
    pub cluster: String,
}

/// One inbound port of a proxy's workload (Istio's `inboundChainConfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboundPort {
    /// The port traffic arrives on, which names the chain and the cluster
    /// (`inbound|<port>||`): the endpoint's target port, or a Sidecar
    /// ingress port.
    pub port: u16,
    /// The service port (the inbound virtual host is `inbound|http|<port>`).
    pub service_port: u16,
    /// The protocol, which picks the chains.
    pub protocol: Protocol,
    /// The host in trace decorators: the service's, or `<sidecar>.<namespace>`.
    pub hostname: String,
    /// A Sidecar ingress `bind`; empty for the wildcard.
    pub bind: String,
    /// A listener of its own bound to the port (Sidecar `captureMode: NONE`,
    /// or a proxy without interception) instead of a `virtualInbound` chain.
    pub bind_to_port: bool,
    /// A Sidecar ingress `defaultEndpoint`; empty: the original destination.
    pub default_endpoint: String,
    /// The services that send traffic to the port (the inbound cluster's
    /// `istio.services` metadata).
    pub services: Vec<super::names::ServiceRef>,
    /// The Sidecar's connection pool for the port (Istio's
    /// `InboundConnectionPoolForPort`): its ingress listener's, else its
    /// `inboundConnectionPool`.
    pub connection_pool: Option<crate::model::istio::ConnectionPoolSettings>,
    /// The TLS its Sidecar ingress listener terminates
    /// (`ENABLE_TLS_ON_SIDECAR_INGRESS` only; applied when the port's mTLS
    /// mode is DISABLE).
    pub tls: Option<crate::model::gateway::ServerTlsSettings>,
}

/// One egress scope of a proxy: a Sidecar egress listener, or the implicit
/// catch-all (every visible host, every port) when there is none.
#[derive(Debug, Clone, Copy)]
pub struct EgressScope<'a> {
    /// The Sidecar's listener; `None` for the implicit catch-all.
    pub listener: Option<&'a IstioEgressListener>,
    /// The listener's index in the Sidecar's `egress`.
    pub index: Option<usize>,
    /// The Sidecar's namespace (resolves `.` in hosts).
    pub namespace: &'a str,
}

fn collect<T: crate::model::meta::KindSpec + Clone>(snapshot: &Snapshot) -> Vec<Named<T>> {
    snapshot
        .list::<T>()
        .map(|t| Named {
            namespace: t.object.metadata.namespace.clone(),
            name: t.object.metadata.name.clone(),
            spec: t.spec.clone(),
        })
        .collect()
}

/// Every object of a kind, oldest first (by `creationTimestamp`, then
/// namespace and name), the order in which Istio lets the oldest of
/// conflicting policies win.
fn oldest_first<T: crate::model::meta::KindSpec + Clone>(snapshot: &Snapshot) -> Vec<Named<T>> {
    let mut typed: Vec<_> = snapshot.list::<T>().collect();
    // RFC 3339 timestamps in UTC, as the API server writes them, sort as
    // strings; objects without one (files) come after those with one.
    typed.sort_by(|a, b| {
        let key = |t: &crate::model::store::Typed<'_, T>| {
            (
                t.object.metadata.creation_timestamp.is_none(),
                t.object.metadata.creation_timestamp.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    typed
        .into_iter()
        .map(|t| Named {
            namespace: t.object.metadata.namespace.clone(),
            name: t.object.metadata.name.clone(),
            spec: t.spec.clone(),
        })
        .collect()
}

fn selects(selector: &Option<WorkloadSelector>, labels: &Labels) -> bool {
    selector
        .as_ref()
        .is_none_or(|s| s.labels.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// Whether a DestinationRule's `workloadSelector.matchLabels` picks the
/// workload (Istio's `SubsetOf`: an empty selector picks every workload).
fn dr_selects(selector: &Option<PolicySelector>, labels: &Labels) -> bool {
    selector
        .as_ref()
        .is_some_and(|s| s.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// Whether a security policy's `selector.matchLabels` picks the workload:
/// only a non-empty selector picks a workload (an empty one is namespace-wide).
pub fn policy_selects(selector: &Option<PolicySelector>, labels: &Labels) -> bool {
    selector.as_ref().is_some_and(|s| {
        !s.match_labels.is_empty() && s.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
    })
}

/// Istio's short-name resolution: a host without a dot is a service in `ns`.
pub fn resolve_host(host: &str, ns: &str, domain: &str) -> String {
    if host.contains('.') || host == "*" {
        host.to_string()
    } else {
        format!("{host}.{ns}.svc.{domain}")
    }
}

impl IstioContext {
    /// Builds a context from a snapshot.
    pub fn new(
        version: String,
        snapshot: &Snapshot,
        options: &crate::model::service::RegistryOptions,
    ) -> Self {
        let registry = ServiceRegistry::build(snapshot, options);
        // Oldest first, as Istio orders them (`sortConfigBySelectorAndCreationTime`;
        // rules with a selector are preferred at lookup).
        let mut destination_rules = oldest_first(snapshot);
        // The Gateway API's Gateways and HTTPRoutes join Istio's own, as
        // Istio's gateway controller feeds its config store.
        let mut gateway_api =
            crate::model::gateway_api::convert::convert(snapshot, &options.domain);
        // So do the DestinationRules of BackendTLSPolicies; they carry no
        // creation time (Go's zero time in Istio, the oldest), so first.
        destination_rules.splice(
            0..0,
            std::mem::take(&mut gateway_api.destination_rules)
                .into_iter()
                .map(|g| Named {
                    namespace: g.namespace,
                    name: g.name,
                    spec: g.spec,
                }),
        );
        let named = |g: crate::model::gateway_api::convert::Generated<_>| Named {
            namespace: g.namespace,
            name: g.name,
            spec: g.spec,
        };
        // So do the Ingresses of Istio's class, as its ingress controller's.
        let ingress = crate::model::ingress::convert(snapshot, &options.domain);
        let (mut virtual_services, delegate_uses) =
            delegate::merge(collect(snapshot), &options.domain);
        virtual_services.extend(gateway_api.virtual_services.into_iter().map(named));
        virtual_services.extend(ingress.virtual_services.into_iter().map(named));
        let mut gateways: Vec<Named<crate::model::gateway::Gateway>> = collect(snapshot);
        gateways.extend(
            gateway_api
                .gateways
                .into_iter()
                .chain(ingress.gateways)
                .map(|g| Named {
                    namespace: g.namespace,
                    name: g.name,
                    spec: g.spec,
                }),
        );
        let index = Index::new(
            &options.domain,
            &registry,
            &virtual_services,
            &destination_rules,
        );
        Self {
            version,
            registry,
            domain: options.domain.clone(),
            features: options.features,
            trust_domain: options.trust_domain.clone(),
            cluster_id: options.cluster_id.clone(),
            destination_rules,
            virtual_services,
            delegate_uses,
            index,
            envoy_filters: super::envoyfilter::EnvoyFilters::new(snapshot),
            cache: Arc::default(),
            seq: 0,
            scopes: Mutex::default(),
            peer_authentications: oldest_first(snapshot),
            sidecars: collect(snapshot),
            gateways,
            authorization_policies: collect(snapshot),
            request_authentications: collect(snapshot),
            telemetries: collect::<crate::model::telemetry::Telemetry>(snapshot)
                .into_iter()
                .map(|t| crate::model::telemetry::NamedTelemetry {
                    namespace: t.namespace,
                    name: t.name,
                    spec: t.spec,
                })
                .collect(),
            secrets: snapshot
                .objects(crate::model::Kind::Secret)
                .map(|o| {
                    (
                        (o.metadata.namespace.clone(), o.metadata.name.clone()),
                        o.clone(),
                    )
                })
                .collect(),
            config_maps: snapshot
                .objects(crate::model::Kind::ConfigMap)
                .map(|o| {
                    (
                        (o.metadata.namespace.clone(), o.metadata.name.clone()),
                        o.clone(),
                    )
                })
                .collect(),
            reference_grants: crate::model::gateway_api::references::ReferenceGrants::new(snapshot),
            pod_labels: snapshot
                .list::<crate::model::kube::Pod>()
                .filter_map(|p| {
                    Some((
                        p.spec.status.pod_ip.clone()?,
                        p.object.metadata.labels.clone(),
                    ))
                })
                .collect(),
            mesh: MeshConfig::default(),
            jwks: Arc::default(),
        }
    }

    /// The ConfigMap `namespace/name` (its CA keys), if there is one.
    pub fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<&crate::model::config_map::ConfigMap> {
        self.config_maps
            .get(&(namespace.to_string(), name.to_string()))
            .and_then(|o| o.spec_as())
    }

    /// The Secret `namespace/name`, if there is one.
    pub fn secret(&self, namespace: &str, name: &str) -> Option<&crate::model::secret::Secret> {
        self.secrets
            .get(&(namespace.to_string(), name.to_string()))
            .and_then(|o| o.spec_as())
    }

    /// The context with this JWKS resolver (shared by every push context).
    pub fn with_jwks(mut self, jwks: Arc<crate::jwks::JwksResolver>) -> Self {
        self.jwks = jwks;
        self
    }

    /// The context with the shared XDS cache, built for push `seq`.
    pub fn with_cache(mut self, cache: Arc<XdsCache>, seq: u64) -> Self {
        self.cache = cache;
        self.seq = seq;
        self
    }

    /// The context with these mesh config settings.
    pub fn with_mesh(mut self, mesh: MeshConfig) -> Self {
        self.mesh = mesh;
        self
    }

    /// Istio's outbound traffic policy for `proxy`: its Sidecar's
    /// `outboundTrafficPolicy` when set, else the mesh config's mode.
    pub fn outbound_policy(&self, proxy: &Proxy) -> OutboundPolicy {
        let blackhole = || OutboundPolicy {
            allow_any: false,
            cluster: super::names::BLACKHOLE_CLUSTER.into(),
        };
        let passthrough = |cluster: String| OutboundPolicy {
            allow_any: true,
            cluster,
        };
        let sidecar = self.sidecar_for(proxy);
        match sidecar.and_then(|s| s.spec.outbound_traffic_policy.as_ref()) {
            Some(p) if p.mode == OutboundMode::RegistryOnly => blackhole(),
            Some(p) => passthrough(match (&p.egress_proxy, sidecar) {
                (Some(dest), Some(sc)) => {
                    let host = resolve_host(&dest.host, &sc.namespace, &self.domain);
                    let port = dest.port.as_ref().map(|p| p.number as u16).unwrap_or(0);
                    super::names::outbound_name(port, &dest.subset, &host)
                }
                _ => super::names::PASSTHROUGH_CLUSTER.into(),
            }),
            None => match self.mesh.outbound_traffic_policy {
                OutboundMode::RegistryOnly => blackhole(),
                OutboundMode::AllowAny => passthrough(super::names::PASSTHROUGH_CLUSTER.into()),
            },
        }
    }

    /// The proxy's egress scopes in order: its Sidecar's egress listeners,
    /// or one catch-all when it has none.
    pub fn egress_scopes<'a>(&'a self, proxy: &'a Proxy) -> Vec<EgressScope<'a>> {
        match self.sidecar_for(proxy) {
            Some(sc) if !sc.spec.egress.is_empty() => sc
                .spec
                .egress
                .iter()
                .enumerate()
                .map(|(i, l)| EgressScope {
                    listener: Some(l),
                    index: Some(i),
                    namespace: &sc.namespace,
                })
                .collect(),
            _ => vec![EgressScope {
                listener: None,
                index: None,
                namespace: &proxy.namespace,
            }],
        }
    }

    /// The proxy's Sidecar scope: its namespace seen through the Sidecar
    /// that applies to it, computed once per context and shared.
    pub fn scope(&self, proxy: &Proxy) -> Arc<SidecarScope> {
        let sidecar = self.sidecar_index(proxy);
        let selected = self.selecting_destination_rules(proxy);
        let key = (proxy.namespace.clone(), sidecar, selected);
        let mut scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(scope) = scopes.get(&key) {
            return scope.clone();
        }
        let selected: Vec<(usize, &Named<DestinationRule>)> = key
            .2
            .iter()
            .map(|i| (*i, &self.destination_rules[*i]))
            .collect();
        let scope = Arc::new(SidecarScope::new(
            &self.registry,
            &proxy.namespace,
            sidecar.map(|i| (i, &self.sidecars[i])),
            &selected,
        ));
        scopes.insert(key, scope.clone());
        scope
    }

    /// The DestinationRules of the proxy's namespace whose
    /// `workloadSelector` matches its labels, in the push context's order.
    fn selecting_destination_rules(&self, proxy: &Proxy) -> Vec<usize> {
        self.index
            .dr_selectors_by_namespace
            .get(&proxy.namespace)
            .map(|list| {
                list.iter()
                    .copied()
                    .filter(|i| {
                        dr_selects(
                            &self.destination_rules[*i].spec.workload_selector,
                            &proxy.labels,
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The workload's inbound ports, sorted: its Sidecar's `ingress` when it
    /// has any, else the target ports of the services that select it (the
    /// first service wins a shared port), none for a proxy without
    /// interception and without Sidecar ingress (Istio's rule).
    pub fn inbound_ports(&self, proxy: &Proxy) -> Vec<InboundPort> {
        let none_mode = proxy.interception_mode == common::InterceptionMode::None;
        let mut ports: Vec<InboundPort> = Vec::new();
        let mut push = |p: InboundPort| {
            if p.protocol == Protocol::Udp {
                return;
            }
            match ports.iter_mut().find(|q| q.port == p.port) {
                Some(q) => {
                    for svc in p.services {
                        if !q.services.contains(&svc) {
                            q.services.push(svc);
                        }
                    }
                }
                None => ports.push(p),
            }
        };
        let sidecar = self.sidecar_for(proxy);
        let sidecar_pool = sidecar.and_then(|s| s.spec.inbound_connection_pool.clone());
        match sidecar.filter(|s| !s.spec.ingress.is_empty()) {
            Some(sc) => {
                for ing in &sc.spec.ingress {
                    let port = ing.port.number as u16;
                    push(InboundPort {
                        port,
                        service_port: port,
                        protocol: Protocol::parse(&ing.port.protocol),
                        hostname: format!("{}.{}", sc.name, sc.namespace),
                        bind: ing.bind.clone(),
                        bind_to_port: match ing.capture_mode {
                            CaptureMode::Default => none_mode,
                            CaptureMode::None => true,
                            CaptureMode::Iptables => false,
                        },
                        default_endpoint: ing.default_endpoint.clone(),
                        services: Vec::new(),
                        connection_pool: ing
                            .connection_pool
                            .clone()
                            .or_else(|| sidecar_pool.clone()),
                        tls: ing
                            .tls
                            .clone()
                            .filter(|_| self.features.enable_tls_on_sidecar_ingress),
                    });
                }
            }
            None if none_mode => {}
            None => {
                for (svc, service_port, target) in self.inbound_for(proxy) {
                    push(InboundPort {
                        port: target,
                        service_port,
                        protocol: svc
                            .port(service_port)
                            .map(|p| p.protocol)
                            .unwrap_or(Protocol::Unsupported),
                        hostname: svc.hostname.clone(),
                        bind: String::new(),
                        bind_to_port: false,
                        default_endpoint: String::new(),
                        services: vec![super::names::ServiceRef::of(svc)],
                        connection_pool: sidecar_pool.clone(),
                        tls: None,
                    });
                }
            }
        }
        ports.sort_by_key(|p| p.port);
        ports
    }

    /// Ports with their own mode in the workload's PeerAuthentication
    /// (Istio's `PortLevelSetting`): unnamed by any inbound port, they get
    /// passthrough chains of their own.
    pub fn port_level_mtls_ports(&self, proxy: &Proxy) -> Vec<u16> {
        self.peer_policies(proxy)
            .workload
            .map(|pa| {
                pa.port_level_mtls
                    .keys()
                    .filter_map(|p| u16::try_from(*p).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The Sidecar resource that applies to `proxy`: selector match in its
    /// namespace, else its namespace's default, else the root namespace's.
    pub fn sidecar_for(&self, proxy: &Proxy) -> Option<&Named<Sidecar>> {
        self.sidecar_index(proxy).map(|i| &self.sidecars[i])
    }

    fn sidecar_index(&self, proxy: &Proxy) -> Option<usize> {
        // Sidecar resources do not apply to gateways (Istio gives routers
        // the default scope).
        if proxy.proxy_type == common::ProxyType::Router {
            return None;
        }
        let ns = proxy.namespace.as_str();
        let sidecars = &self.sidecars;
        sidecars
            .iter()
            .position(|s| {
                s.namespace == ns
                    && s.spec.workload_selector.is_some()
                    && selects(&s.spec.workload_selector, &proxy.labels)
            })
            .or_else(|| {
                sidecars
                    .iter()
                    .position(|s| s.namespace == ns && s.spec.workload_selector.is_none())
            })
            .or_else(|| {
                sidecars.iter().position(|s| {
                    s.namespace == ROOT_NAMESPACE && s.spec.workload_selector.is_none()
                })
            })
    }

    /// The DestinationRule for `service` as `client` sees it (Istio's
    /// `PushContext.destinationRule` with `SidecarScope.DestinationRule`):
    /// the client's namespace first, where a rule with a `workloadSelector`
    /// that selects the client wins over one without; then the rules
    /// exported by the service's namespace, then by the root namespace
    /// (rules with a selector are never exported). As in Istio, when the
    /// client's namespace has rules for the host but none applies to the
    /// client (only other workloads' selector rules), the client has no rule.
    pub fn destination_rule<'c>(
        &self,
        client: impl Into<DrClient<'c>>,
        service: &Service,
    ) -> Option<&Named<DestinationRule>> {
        let client = client.into();
        let client_ns = client.namespace();
        if let Some(local) = self.index.dr_by_namespace.get(client_ns) {
            // Selector rules come first in the list (see `Index::new`).
            let mut found = false;
            for (host, i) in local {
                let dr = &self.destination_rules[*i];
                if !host_matches(host, &service.hostname) {
                    continue;
                }
                if dr.spec.workload_selector.is_some() {
                    found = true;
                    if client.selected_by(*i, dr) {
                        return Some(dr);
                    }
                } else if is_exported_to(&dr.spec.export_to, &dr.namespace, client_ns) {
                    return Some(dr);
                }
            }
            if found {
                return None;
            }
        }
        [service.namespace.as_str(), ROOT_NAMESPACE]
            .iter()
            .find_map(|ns| {
                self.index
                    .dr_by_namespace
                    .get(*ns)?
                    .iter()
                    .map(|(host, i)| (host, &self.destination_rules[*i]))
                    .find(|(host, dr)| {
                        dr.spec.workload_selector.is_none()
                            && host_matches(host, &service.hostname)
                            && is_exported_to(&dr.spec.export_to, &dr.namespace, client_ns)
                    })
                    .map(|(_, dr)| dr)
            })
    }

    /// VirtualServices for sidecars (`mesh` gateway) visible to `client_ns`
    /// whose hosts include `hostname`.
    pub fn virtual_services_for(
        &self,
        client_ns: &str,
        hostname: &str,
    ) -> Vec<&Named<VirtualService>> {
        let mut indices: Vec<usize> = self
            .index
            .vs_by_host
            .get(hostname)
            .map(|v| v.to_vec())
            .unwrap_or_default();
        indices.extend(
            self.index
                .vs_wildcards
                .iter()
                .filter(|(h, _)| host_matches(h, hostname))
                .map(|(_, i)| *i),
        );
        // The order of the VirtualServices, as before the index.
        indices.sort_unstable();
        indices.dedup();
        indices
            .into_iter()
            .map(|i| &self.virtual_services[i])
            .filter(|vs| is_exported_to(&vs.spec.export_to, &vs.namespace, client_ns))
            .collect()
    }

    /// The root VirtualServices that name the delegate `namespace/name`
    /// (whether or not it exists or is exported to them).
    pub fn roots_of(&self, namespace: &str, name: &str) -> Vec<&Named<VirtualService>> {
        self.delegate_uses
            .iter()
            .filter(|(_, used)| used.iter().any(|(n, m)| n == namespace && m == name))
            .filter_map(|((ns, root), _)| {
                self.virtual_services
                    .iter()
                    .find(|vs| &vs.namespace == ns && &vs.name == root)
            })
            .collect()
    }

    /// The PeerAuthentications that decide `proxy`'s modes, as Istio's
    /// `GetPoliciesForWorkload` picks them: the oldest whose selector
    /// matches the workload in its namespace, the oldest namespace-wide one
    /// (no selector, or an empty one), and the oldest mesh-wide one (in the
    /// root namespace, without selector).
    fn peer_policies(&self, proxy: &Proxy) -> PeerPolicies<'_> {
        let namespace_wide = |pa: &&Named<PeerAuthentication>| {
            pa.spec
                .selector
                .as_ref()
                .is_none_or(|s| s.match_labels.is_empty())
        };
        // `peer_authentications` is ordered oldest first.
        let in_namespace = || {
            self.peer_authentications
                .iter()
                .filter(|p| p.namespace == proxy.namespace)
        };
        PeerPolicies {
            workload: in_namespace()
                .find(|pa| policy_selects(&pa.spec.selector, &proxy.labels))
                .map(|pa| &pa.spec),
            namespace: in_namespace().find(namespace_wide).map(|pa| &pa.spec),
            mesh: self
                .peer_authentications
                .iter()
                .filter(|p| p.namespace == ROOT_NAMESPACE)
                .find(namespace_wide)
                .map(|pa| &pa.spec),
        }
    }

    /// The mTLS mode of a workload's inbound port (the port traffic arrives
    /// on; 0 for the workload as a whole), composed as Istio's
    /// `ComposePeerAuthentication` does: PERMISSIVE, overridden by the
    /// mesh-wide mode, then the namespace's, then the workload's, each only
    /// where it is set; a port-level mode (from the workload's policy only)
    /// wins for its port, and an UNSET one inherits the workload's.
    pub fn mtls_mode(&self, proxy: &Proxy, port: u16) -> MtlsMode {
        let policies = self.peer_policies(proxy);
        let set = |pa: Option<&PeerAuthentication>| {
            pa.and_then(|pa| pa.mtls.as_ref())
                .map(|m| m.mode)
                .filter(|m| *m != MtlsMode::Unset)
        };
        let mut mode = MtlsMode::Permissive;
        for level in [policies.mesh, policies.namespace, policies.workload] {
            if let Some(m) = set(level) {
                mode = m;
            }
        }
        if let Some(m) = policies
            .workload
            .and_then(|pa| pa.port_level_mtls.get(&u32::from(port)))
            .map(|m| m.mode)
            .filter(|m| *m != MtlsMode::Unset && port != 0)
        {
            mode = m;
        }
        mode
    }

    /// The mode a client should expect from `svc`'s workloads, Istio's
    /// `BestEffortInferServiceMTLSMode`: `None` (unknown: decide by the
    /// endpoints' `tlsMode` labels) when a workload-level policy in the
    /// service's namespace could change it, else the namespace's or the
    /// mesh's mode.
    pub fn service_mtls_mode(&self, svc: &Service) -> Option<MtlsMode> {
        let ns = svc.namespace.as_str();
        let in_namespace = || {
            self.peer_authentications
                .iter()
                .filter(move |p| p.namespace == ns)
        };
        if in_namespace().any(|pa| {
            pa.spec
                .selector
                .as_ref()
                .is_some_and(|s| !s.match_labels.is_empty())
        }) {
            return None;
        }
        let namespace_wide = |pa: &&Named<PeerAuthentication>| {
            pa.spec
                .selector
                .as_ref()
                .is_none_or(|s| s.match_labels.is_empty())
        };
        let set = |pa: Option<&Named<PeerAuthentication>>| {
            pa.and_then(|pa| pa.spec.mtls.as_ref())
                .map(|m| m.mode)
                .filter(|m| *m != MtlsMode::Unset)
        };
        let mesh = self
            .peer_authentications
            .iter()
            .filter(|p| p.namespace == ROOT_NAMESPACE)
            .find(namespace_wide);
        let namespace = in_namespace().find(namespace_wide);
        Some(set(namespace).or(set(mesh)).unwrap_or(MtlsMode::Permissive))
    }

    /// The services this proxy's workload serves, with the matching target ports:
    /// (service, service port, target port).
    pub fn inbound_for<'a>(&'a self, proxy: &'a Proxy) -> Vec<(&'a Arc<Service>, u16, u16)> {
        let services = self.registry.services();
        let mut found: Vec<(usize, usize, u16, u16)> = proxy
            .ips
            .iter()
            .filter_map(|ip| self.index.inbound_by_ip.get(ip))
            .flatten()
            .copied()
            .collect();
        // Registry order, then endpoint order, as a scan of the registry finds them.
        found.sort_unstable_by_key(|(s, e, _, _)| (*s, *e));
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        for (s, _, service_port, port) in found {
            let svc = &services[s];
            if seen.insert((svc.hostname.clone(), service_port)) {
                out.push((svc, service_port, port));
            }
        }
        out
    }

    /// The registry's endpoint of the proxy's workload, if it serves any.
    fn workload_endpoint(&self, proxy: &Proxy) -> Option<&crate::model::service::Endpoint> {
        let services = self.registry.services();
        let first = proxy
            .ips
            .iter()
            .filter_map(|ip| self.index.inbound_by_ip.get(ip))
            .flatten()
            .map(|(s, _, _, _)| *s)
            .min()?;
        services[first]
            .endpoints
            .iter()
            .find(|e| proxy.ips.contains(&e.address))
    }

    /// The proxy's workload labels from the registry (Pod labels), or its
    /// metadata when no Pod backs its endpoint.
    pub fn workload_labels(&self, proxy: &Proxy) -> Labels {
        self.workload_endpoint(proxy)
            // An endpoint joined with no Pod carries no labels: the proxy's
            // own are the workload's then (Istio falls back to the node
            // metadata's when the registry has no Pod for the proxy).
            .filter(|e| !e.labels.is_empty())
            .map(|e| e.labels.clone())
            .unwrap_or_else(|| proxy.labels.clone())
    }

    /// The proxy's locality and labels as Istio's `setTopologyLabels` sets
    /// them: the registry's locality of its workload (its Node's topology
    /// labels, or its `istio-locality` label), else the node's own
    /// `locality`; its labels with the topology labels added.
    pub fn proxy_locality(&self, proxy: &Proxy) -> super::locality::ProxyLocality {
        let ep = self.workload_endpoint(proxy);
        let locality = ep
            .map(|e| e.locality.clone())
            .filter(|l| !l.is_empty())
            .unwrap_or_else(|| proxy.locality.clone());
        let labels = ep.map_or(&proxy.labels, |e| &e.labels);
        let network = ep.map(|e| e.network.as_str()).unwrap_or_default();
        let cluster = if proxy.cluster_id.is_empty() {
            &self.cluster_id
        } else {
            &proxy.cluster_id
        };
        super::locality::ProxyLocality {
            labels: super::locality::augment(labels, &locality, network, cluster),
            locality,
        }
    }
}

/// The push context of some YAML config, as the unit tests build it.
#[cfg(test)]
pub(crate) fn context_of_yaml(yaml: &str) -> IstioContext {
    let store = crate::model::ConfigStore::new();
    let parsed = crate::model::parse_file("test.yaml", yaml).expect("the test config parses");
    store.apply(
        parsed
            .objects
            .into_iter()
            .map(|o| crate::model::Update::Upsert(Arc::new(o))),
    );
    IstioContext::new(
        "t/1".into(),
        &store.snapshot(),
        &crate::model::RegistryOptions::default(),
    )
}
