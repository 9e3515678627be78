//! The service registry derived from a [`Snapshot`]: services from
//! ServiceEntries and Kubernetes Services, and their endpoints from
//! EndpointSlices joined with Pods, WorkloadEntries and ServiceEntry
//! endpoints. This is what generators read for clusters, listeners, routes
//! and load assignments. Istio's rules are in `pilot/pkg/serviceregistry`
//! (`kube/conversion.go`, `serviceentry/conversion.go`).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use common::identity::Identity;

use super::istio::{self, Labels, Location};
use super::kube::{self, EXPORT_TO_ANNOTATION, IntOrString, SERVICE_NAME_LABEL, ServiceType};
use super::meta::{Kind, ObjectKey};
use super::store::{Snapshot, Typed};

/// Istio's `constants.UnspecifiedIP`: a service without an address.
pub const UNSPECIFIED_IP: &str = "0.0.0.0";

/// Istio's default DNS domain suffix (`--domain`).
pub const DEFAULT_DOMAIN: &str = "cluster.local";

/// An application protocol, as Istio's `protocol.Instance`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// `GRPC`.
    Grpc,
    /// `GRPC-Web`.
    GrpcWeb,
    /// `HTTP`.
    Http,
    /// `HTTP_PROXY`.
    HttpProxy,
    /// `HTTP2`.
    Http2,
    /// `HTTPS`.
    Https,
    /// `TCP`.
    Tcp,
    /// `TLS`.
    Tls,
    /// `UDP` (ignored by sidecar generation).
    Udp,
    /// `Mongo`.
    Mongo,
    /// `Redis`.
    Redis,
    /// `MySQL`.
    MySql,
    /// Not declared: detected from the traffic ("sniffing").
    Unsupported,
}

impl Protocol {
    /// Parses a protocol name, case-insensitively (`protocol.Parse`); anything
    /// else is [`Protocol::Unsupported`].
    pub fn parse(s: &str) -> Protocol {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            "grpc" => Protocol::Grpc,
            "grpc-web" => Protocol::GrpcWeb,
            "http" => Protocol::Http,
            "http_proxy" => Protocol::HttpProxy,
            "http2" => Protocol::Http2,
            "https" => Protocol::Https,
            "tls" => Protocol::Tls,
            "mongo" => Protocol::Mongo,
            "redis" => Protocol::Redis,
            "mysql" => Protocol::MySql,
            _ => Protocol::Unsupported,
        }
    }

    /// Istio's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "GRPC",
            Protocol::GrpcWeb => "GRPC-Web",
            Protocol::Http => "HTTP",
            Protocol::HttpProxy => "HTTP_PROXY",
            Protocol::Http2 => "HTTP2",
            Protocol::Https => "HTTPS",
            Protocol::Tcp => "TCP",
            Protocol::Tls => "TLS",
            Protocol::Udp => "UDP",
            Protocol::Mongo => "Mongo",
            Protocol::Redis => "Redis",
            Protocol::MySql => "MySQL",
            Protocol::Unsupported => "UnsupportedProtocol",
        }
    }

    /// Served by an HTTP connection manager.
    pub fn is_http(self) -> bool {
        matches!(
            self,
            Protocol::Http
                | Protocol::Http2
                | Protocol::Grpc
                | Protocol::GrpcWeb
                | Protocol::HttpProxy
        )
    }

    /// HTTP/2 upstream (`http2`, `grpc`).
    pub fn is_http2(self) -> bool {
        matches!(self, Protocol::Http2 | Protocol::Grpc)
    }

    /// Plain TCP proxying (including TLS passthrough and the TCP-based ones).
    pub fn is_tcp(self) -> bool {
        matches!(
            self,
            Protocol::Tcp
                | Protocol::Https
                | Protocol::Tls
                | Protocol::Mongo
                | Protocol::Redis
                | Protocol::MySql
        )
    }

    /// Protocol detection applies.
    pub fn is_unsupported(self) -> bool {
        self == Protocol::Unsupported
    }

    /// The protocol of a Kubernetes Service port (`kube.ConvertProtocol`):
    /// UDP stays UDP; then `appProtocol` (with the `kubernetes.io/h2c|ws|wss`
    /// names); then the port name's prefix before `-` (`grpc-web` first);
    /// unknown names on well-known TCP ports (25, 53, 3306, 27017) are TCP.
    pub fn from_kube_port(
        port: u32,
        name: &str,
        protocol: Option<&str>,
        app_protocol: Option<&str>,
    ) -> Protocol {
        if protocol == Some("UDP") {
            return Protocol::Udp;
        }
        if let Some(app) = app_protocol {
            match app {
                "kubernetes.io/h2c" => return Protocol::Http2,
                "kubernetes.io/ws" => return Protocol::Http,
                "kubernetes.io/wss" => return Protocol::Https,
                _ => {}
            }
            let p = Protocol::parse(app);
            if p != Protocol::Unsupported {
                return p;
            }
        }
        let lower = name.to_ascii_lowercase();
        if lower.starts_with("grpc-web") {
            return Protocol::GrpcWeb;
        }
        let prefix = lower.split('-').next().unwrap_or("");
        match Protocol::parse(prefix) {
            Protocol::Unsupported if matches!(port, 25 | 53 | 3306 | 27017) => Protocol::Tcp,
            p => p,
        }
    }
}

/// How a service's endpoints are found (Istio's `model.Resolution`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServiceResolution {
    /// Endpoints known to istiod, sent over EDS.
    ClientSideLb,
    /// Endpoints resolved by Envoy with DNS, all addresses (`STRICT_DNS`).
    DnsLb,
    /// Endpoints resolved by Envoy with DNS, first address (`LOGICAL_DNS`).
    DnsRoundRobinLb,
    /// Forward to the original destination (headless, ServiceEntry NONE).
    Passthrough,
    /// Dynamic forward proxy.
    DynamicDns,
}

/// Where a service came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServiceSource {
    /// A Kubernetes Service.
    Kubernetes,
    /// A ServiceEntry.
    ServiceEntry,
}

/// One port of a service.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServicePort {
    /// The port name (may be empty for a single-port Kubernetes Service).
    pub name: String,
    /// The service port.
    pub port: u16,
    /// The protocol.
    pub protocol: Protocol,
}

/// Visibility of a config or service across namespaces (`exportTo`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ExportTo {
    /// Every namespace (`*`, and the mesh default).
    All,
    /// No namespace (`~`).
    None,
    /// These namespaces (`.` already resolved to the owner's).
    Namespaces(BTreeSet<String>),
}

impl ExportTo {
    /// Resolves an `exportTo` list for an object in `owner_ns`; an empty list
    /// is the mesh default, `*` (Istio's `defaultServiceExportTo` etc.).
    pub fn parse(export_to: &[String], owner_ns: &str) -> ExportTo {
        if export_to.is_empty() || export_to.iter().any(|n| n == "*") {
            return ExportTo::All;
        }
        let namespaces: BTreeSet<String> = export_to
            .iter()
            .filter(|n| *n != "~")
            .map(|n| {
                if n == "." {
                    owner_ns.to_string()
                } else {
                    n.clone()
                }
            })
            .collect();
        if namespaces.is_empty() {
            ExportTo::None
        } else {
            ExportTo::Namespaces(namespaces)
        }
    }

    /// Whether a proxy in `client_ns` sees it.
    pub fn is_visible_to(&self, client_ns: &str) -> bool {
        match self {
            ExportTo::All => true,
            ExportTo::None => false,
            ExportTo::Namespaces(ns) => ns.contains(client_ns),
        }
    }
}

/// Whether a proxy in `client_ns` sees an object in `owner_ns` with this
/// `exportTo` list (empty means the mesh default, visible everywhere).
pub fn is_exported_to(export_to: &[String], owner_ns: &str, client_ns: &str) -> bool {
    ExportTo::parse(export_to, owner_ns).is_visible_to(client_ns)
}

/// Whether a Sidecar egress host entry (`ns/host`) selects a service with
/// `hostname` in `service_ns`, for a Sidecar in `sidecar_ns`.
pub fn egress_host_matches(
    entry: &str,
    sidecar_ns: &str,
    service_ns: &str,
    hostname: &str,
) -> bool {
    let Some((ns, host)) = entry.split_once('/') else {
        return false;
    };
    let ns_ok = match ns {
        "*" => true,
        "." => service_ns == sidecar_ns,
        "~" => false,
        other => other == service_ns,
    };
    ns_ok && host_matches(host, hostname)
}

/// Istio's host matching: `*` matches everything, `*.suffix` matches names
/// ending in `.suffix`, anything else matches exactly.
pub fn host_matches(pattern: &str, hostname: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    match pattern.strip_prefix('*') {
        Some(suffix) => hostname.ends_with(suffix) && hostname.len() > suffix.len(),
        None => pattern == hostname,
    }
}

/// Istio's `security.istio.io/tlsMode` of an endpoint: the label value the
/// injector writes on Pods, typed once in `common` (named for the endpoint
/// here, apart from a DestinationRule's TLS mode).
pub use common::TlsMode as EndpointTlsMode;

/// One endpoint of one service port (Istio's `IstioEndpoint`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// IP address or host name (DNS services).
    pub address: String,
    /// The port on the endpoint (the target port).
    pub port: u16,
    /// The service port this endpoint serves.
    pub service_port: u16,
    /// The service port's name.
    pub service_port_name: String,
    /// The workload's labels (subset selection).
    pub labels: Labels,
    /// The workload's identity, from its service account.
    pub identity: Option<Identity>,
    /// Whether the endpoint speaks Istio mTLS.
    pub tls_mode: EndpointTlsMode,
    /// Ready (unready endpoints are sent as UNHEALTHY).
    pub healthy: bool,
    /// The network.
    pub network: String,
    /// `region/zone/subzone`.
    pub locality: String,
    /// Load-balancing weight (1 by default).
    pub weight: u32,
    /// The Pod or WorkloadEntry behind the endpoint, if known.
    pub workload: Option<ObjectKey>,
    /// The Pod's DNS host name (`spec.hostname`, else its name) when it has
    /// a `spec.subdomain`: Istio's `HostName`, for
    /// `<hostname>.<subdomain>.<ns>.svc.<domain>` names of headless services.
    pub hostname: String,
    /// The Pod's `spec.subdomain` (a StatefulSet's `serviceName`).
    pub subdomain: String,
}

/// A service, as generators see it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Service {
    /// The fully qualified host name (`<name>.<ns>.svc.<domain>` or a ServiceEntry host).
    pub hostname: String,
    /// The namespace of the object that defines it.
    pub namespace: String,
    /// The object that defines it.
    pub source_object: ObjectKey,
    /// Kubernetes Service or ServiceEntry.
    pub source: ServiceSource,
    /// Virtual IPs (ClusterIP, ServiceEntry addresses).
    pub addresses: Vec<String>,
    /// Addresses IP auto-allocation gave a ServiceEntry host without
    /// `addresses` (IPv4 first): used by proxies that capture DNS, as
    /// Istio's `GetAddressForProxy` does.
    pub auto_addresses: Vec<String>,
    /// The ports.
    pub ports: Vec<ServicePort>,
    /// How endpoints are found.
    pub resolution: ServiceResolution,
    /// Outside the mesh (ServiceEntry MESH_EXTERNAL, ExternalName): no auto-mTLS.
    pub mesh_external: bool,
    /// Visibility.
    pub export_to: ExportTo,
    /// Identities the endpoints' certificates must carry (ServiceEntry `subjectAltNames`).
    pub subject_alt_names: Vec<String>,
    /// The endpoints of every port.
    pub endpoints: Vec<Endpoint>,
    /// A hash of everything above, set when the registry is built: two
    /// services with the same host, namespace and revision generate the
    /// same configuration (the XDS cache keys by it).
    pub revision: u64,
}

impl Service {
    /// The content hash [`Service::revision`] holds.
    pub fn content_hash(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        // Every field but the revision itself (a new field belongs here).
        let Service {
            hostname,
            namespace,
            source_object,
            source,
            addresses,
            auto_addresses,
            ports,
            resolution,
            mesh_external,
            export_to,
            subject_alt_names,
            endpoints,
            revision: _,
        } = self;
        (hostname, namespace, source_object, source, addresses, ports).hash(&mut h);
        auto_addresses.hash(&mut h);
        (
            resolution,
            mesh_external,
            export_to,
            subject_alt_names,
            endpoints,
        )
            .hash(&mut h);
        h.finish()
    }

    /// The addresses a proxy uses for the service: its own, else (for a
    /// proxy that consumes auto-allocated addresses: one capturing DNS) the
    /// allocated ones, of the proxy's IP families.
    pub fn addresses_for(&self, auto_allocated: bool, v4: bool, v6: bool) -> Vec<&str> {
        let own: Vec<&str> = self
            .addresses
            .iter()
            .map(String::as_str)
            .filter(|a| *a != UNSPECIFIED_IP)
            .collect();
        if !own.is_empty() || !auto_allocated {
            return own;
        }
        self.auto_addresses
            .iter()
            .map(String::as_str)
            .filter(|a| if a.contains(':') { v6 } else { v4 })
            .collect()
    }

    /// Whether this is a headless Kubernetes Service or a ServiceEntry of
    /// resolution NONE: clients reach the address they asked for.
    pub fn is_passthrough(&self) -> bool {
        self.resolution == ServiceResolution::Passthrough
    }

    /// The port with this number.
    pub fn port(&self, number: u16) -> Option<&ServicePort> {
        self.ports.iter().find(|p| p.port == number)
    }

    /// The endpoints of one service port.
    pub fn endpoints_for(&self, service_port: u16) -> impl Iterator<Item = &Endpoint> {
        self.endpoints
            .iter()
            .filter(move |e| e.service_port == service_port)
    }

    /// The endpoints' distinct identities (default SANs for ISTIO_MUTUAL).
    pub fn identities(&self) -> BTreeSet<String> {
        self.endpoints
            .iter()
            .filter_map(|e| e.identity.as_ref().map(ToString::to_string))
            .collect()
    }
}

/// Settings the registry needs from the mesh and the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryOptions {
    /// DNS domain suffix (`--domain`, `cluster.local`).
    pub domain: String,
    /// SPIFFE trust domain (mesh `trustDomain`, `cluster.local`).
    pub trust_domain: String,
    /// The cluster the registry's workloads run in (`CLUSTER_ID`,
    /// `Kubernetes`), as endpoint metadata names it.
    pub cluster_id: String,
    /// The feature flags the generators follow.
    pub features: super::features::Features,
}

/// Istio's default `CLUSTER_ID`.
pub const DEFAULT_CLUSTER_ID: &str = "Kubernetes";

impl Default for RegistryOptions {
    fn default() -> Self {
        Self {
            domain: DEFAULT_DOMAIN.to_string(),
            trust_domain: common::identity::DEFAULT_TRUST_DOMAIN.to_string(),
            cluster_id: DEFAULT_CLUSTER_ID.to_string(),
            features: super::features::Features::default(),
        }
    }
}

/// Every service of a snapshot with its endpoints, sorted by host name then
/// namespace. Built once per push context.
#[derive(Debug, Clone, Default)]
pub struct ServiceRegistry {
    services: Vec<Arc<Service>>,
    /// The services each object contributes to: the Service or ServiceEntry
    /// that defines them, and the Pods and WorkloadEntries behind their
    /// endpoints.
    by_source: HashMap<ObjectKey, Vec<usize>>,
}

impl ServiceRegistry {
    /// Builds the registry from a snapshot.
    pub fn build(snapshot: &Snapshot, options: &RegistryOptions) -> Self {
        let index = JoinIndex::new(snapshot);
        let allocations = super::ip_allocate::allocate(snapshot);
        let mut services: Vec<Arc<Service>> = Vec::new();
        let mut add = |mut svc: Service| {
            svc.revision = svc.content_hash();
            services.push(Arc::new(svc));
        };
        for svc in snapshot.list::<kube::Service>() {
            add(kube_service(snapshot, &index, svc, options));
        }
        for se in snapshot.list::<istio::ServiceEntry>() {
            for svc in service_entry_services(snapshot, se, &allocations, options) {
                add(svc);
            }
        }
        services.sort_by(|a, b| {
            (a.hostname.as_str(), a.namespace.as_str())
                .cmp(&(b.hostname.as_str(), b.namespace.as_str()))
        });
        let mut by_source: HashMap<ObjectKey, Vec<usize>> = HashMap::new();
        for (i, svc) in services.iter().enumerate() {
            let workloads = svc.endpoints.iter().filter_map(|e| e.workload.as_ref());
            for key in std::iter::once(&svc.source_object).chain(workloads) {
                let list = by_source.entry(key.clone()).or_default();
                if list.last() != Some(&i) {
                    list.push(i);
                }
            }
        }
        Self {
            services,
            by_source,
        }
    }

    /// The services a change of the object `key` can change: those it
    /// defines (Service, ServiceEntry) or stands behind an endpoint of (Pod,
    /// WorkloadEntry); an EndpointSlice's Service (its
    /// `kubernetes.io/service-name` label in `snapshot`); the services of
    /// the Pods on a Node.
    pub fn services_from<'a>(
        &'a self,
        key: &ObjectKey,
        snapshot: &Snapshot,
    ) -> Vec<&'a Arc<Service>> {
        let of =
            |k: &ObjectKey| -> Vec<usize> { self.by_source.get(k).cloned().unwrap_or_default() };
        let mut found: Vec<usize> = match key.kind {
            Kind::EndpointSlice => snapshot
                .get(key)
                .and_then(|o| o.metadata.labels.get(SERVICE_NAME_LABEL))
                .map(|svc| of(&ObjectKey::new(Kind::Service, &key.namespace, svc)))
                .unwrap_or_default(),
            Kind::Node => snapshot
                .list::<kube::Pod>()
                .filter(|p| p.spec.spec.node_name == key.name)
                .flat_map(|p| of(&p.object.key()))
                .collect(),
            _ => of(key),
        };
        found.sort_unstable();
        found.dedup();
        found.into_iter().map(|i| &self.services[i]).collect()
    }

    /// Every service.
    pub fn services(&self) -> &[Arc<Service>] {
        &self.services
    }

    /// Services with this host name (one per defining namespace).
    pub fn by_hostname<'a>(&'a self, hostname: &'a str) -> impl Iterator<Item = &'a Arc<Service>> {
        self.services.iter().filter(move |s| s.hostname == hostname)
    }

    /// Services a proxy in `client_ns` may see (`exportTo`).
    pub fn visible_to<'a>(&'a self, client_ns: &'a str) -> impl Iterator<Item = &'a Arc<Service>> {
        self.services
            .iter()
            .filter(move |s| s.export_to.is_visible_to(client_ns))
    }
}

/// Pods by namespace/name and by IP, and EndpointSlices by the
/// namespace/name of their Service, for joining endpoints with workloads.
struct JoinIndex<'a> {
    snapshot: &'a Snapshot,
    by_name: HashMap<(&'a str, &'a str), Typed<'a, kube::Pod>>,
    by_ip: HashMap<&'a str, Typed<'a, kube::Pod>>,
    slices: HashMap<(&'a str, &'a str), Vec<Typed<'a, kube::EndpointSlice>>>,
}

impl<'a> JoinIndex<'a> {
    fn new(snapshot: &'a Snapshot) -> Self {
        let mut by_name = HashMap::new();
        let mut by_ip = HashMap::new();
        for pod in snapshot.list::<kube::Pod>() {
            let meta = &pod.object.metadata;
            by_name.insert((meta.namespace.as_str(), meta.name.as_str()), pod);
            if pod.spec.is_active() {
                for ip in pod_ips(pod.spec) {
                    by_ip.insert(ip, pod);
                }
            }
        }
        let mut slices: HashMap<_, Vec<_>> = HashMap::new();
        for slice in snapshot.list::<kube::EndpointSlice>() {
            let meta = &slice.object.metadata;
            if let Some(service) = meta.labels.get(SERVICE_NAME_LABEL) {
                slices
                    .entry((meta.namespace.as_str(), service.as_str()))
                    .or_default()
                    .push(slice);
            }
        }
        Self {
            snapshot,
            by_name,
            by_ip,
            slices,
        }
    }
}

/// A Pod's locality, as Istio's Kubernetes registry finds it: its
/// `istio-locality` label, else the topology labels of its Node.
fn pod_locality(snapshot: &Snapshot, pod: Typed<'_, kube::Pod>) -> String {
    kube::pod_locality_label(&pod.object.metadata.labels)
        .unwrap_or_else(|| node_locality(snapshot, &pod.spec.spec.node_name))
}

/// The locality the topology labels of the Node `name` give (empty when
/// the Node is unknown or unlabelled).
fn node_locality(snapshot: &Snapshot, name: &str) -> String {
    if name.is_empty() {
        return String::new();
    }
    snapshot
        .get_typed::<kube::Node>("", name)
        .map(|n| kube::node_locality(&n.object.metadata.labels))
        .unwrap_or_default()
}

/// A Pod's DNS host name and subdomain, as Istio's endpoint builder takes
/// them: with a `spec.subdomain`, `spec.hostname` or else the Pod's name (a
/// StatefulSet's Pods carry their name and the set's `serviceName` there).
fn pod_dns_name(pod: Typed<'_, kube::Pod>) -> (String, String) {
    let spec = &pod.spec.spec;
    if spec.subdomain.is_empty() {
        return (String::new(), String::new());
    }
    let hostname = if spec.hostname.is_empty() {
        pod.object.metadata.name.clone()
    } else {
        spec.hostname.clone()
    };
    (hostname, spec.subdomain.clone())
}

fn pod_ips(pod: &kube::Pod) -> impl Iterator<Item = &str> {
    pod.status
        .pod_ip
        .as_deref()
        .into_iter()
        .chain(pod.status.pod_ips.iter().map(|p| p.ip.as_str()))
        .filter(|ip| !ip.is_empty())
}

fn labels_match(selector: &Labels, labels: &Labels) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn tls_mode(labels: &Labels) -> EndpointTlsMode {
    EndpointTlsMode::from_labels(labels)
}

fn identity(options: &RegistryOptions, namespace: &str, service_account: &str) -> Option<Identity> {
    (!service_account.is_empty())
        .then(|| Identity::new(&options.trust_domain, namespace, service_account))
}

fn kube_service(
    snapshot: &Snapshot,
    pods: &JoinIndex<'_>,
    svc: Typed<'_, kube::Service>,
    options: &RegistryOptions,
) -> Service {
    let meta = &svc.object.metadata;
    let spec = &svc.spec.spec;
    let ports: Vec<ServicePort> = spec
        .ports
        .iter()
        .filter_map(|p| {
            Some(ServicePort {
                name: p.name.clone(),
                port: u16::try_from(p.port).ok()?,
                protocol: Protocol::from_kube_port(
                    p.port,
                    &p.name,
                    p.protocol.as_deref(),
                    p.app_protocol.as_deref(),
                ),
            })
        })
        .collect();
    let external = spec.service_type == ServiceType::ExternalName;
    let headless = spec.cluster_ip.as_deref() == Some("None");
    let resolution = if external {
        ServiceResolution::DnsLb
    } else if headless {
        ServiceResolution::Passthrough
    } else {
        ServiceResolution::ClientSideLb
    };
    let addresses = match spec.cluster_ip.as_deref() {
        Some(ip) if !ip.is_empty() && ip != "None" && !external => vec![ip.to_string()],
        _ => Vec::new(),
    };
    let export_to: Vec<String> = meta
        .annotations
        .get(EXPORT_TO_ANNOTATION)
        .map(|v| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();

    let mut endpoints = Vec::new();
    if external {
        if let Some(name) = &spec.external_name {
            for p in &ports {
                endpoints.push(Endpoint {
                    address: name.clone(),
                    port: p.port,
                    service_port: p.port,
                    service_port_name: p.name.clone(),
                    labels: Labels::new(),
                    identity: None,
                    tls_mode: EndpointTlsMode::Disabled,
                    healthy: true,
                    network: String::new(),
                    locality: String::new(),
                    weight: 1,
                    workload: None,
                    hostname: String::new(),
                    subdomain: String::new(),
                });
            }
        }
    } else {
        slice_endpoints(pods, svc, &ports, options, &mut endpoints);
        workload_entry_endpoints(snapshot, svc, &ports, options, &mut endpoints);
    }

    Service {
        hostname: format!("{}.{}.svc.{}", meta.name, meta.namespace, options.domain),
        namespace: meta.namespace.clone(),
        source_object: svc.object.key(),
        source: ServiceSource::Kubernetes,
        addresses,
        auto_addresses: Vec::new(),
        ports,
        resolution,
        mesh_external: external,
        export_to: ExportTo::parse(&export_to, &meta.namespace),
        subject_alt_names: Vec::new(),
        revision: 0,
        endpoints,
    }
}

/// Endpoints of a Kubernetes Service from its EndpointSlices (label
/// `kubernetes.io/service-name`), each joined with its Pod (by `targetRef`,
/// else by IP) for labels, identity and TLS mode.
fn slice_endpoints(
    pods: &JoinIndex<'_>,
    svc: Typed<'_, kube::Service>,
    ports: &[ServicePort],
    options: &RegistryOptions,
    out: &mut Vec<Endpoint>,
) {
    let meta = &svc.object.metadata;
    let slices = pods
        .slices
        .get(&(meta.namespace.as_str(), meta.name.as_str()))
        .map(Vec::as_slice)
        .unwrap_or_default();
    for slice in slices {
        let smeta = &slice.object.metadata;
        for ep in &slice.spec.endpoints {
            let Some(address) = ep.addresses.first() else {
                continue;
            };
            let pod = ep
                .target_ref
                .as_ref()
                .filter(|r| r.kind == "Pod")
                .and_then(|r| {
                    let ns = if r.namespace.is_empty() {
                        smeta.namespace.as_str()
                    } else {
                        r.namespace.as_str()
                    };
                    pods.by_name.get(&(ns, r.name.as_str()))
                })
                .or_else(|| pods.by_ip.get(address.as_str()))
                .copied();
            let labels = pod
                .map(|p| p.object.metadata.labels.clone())
                .unwrap_or_default();
            let ident = pod.and_then(|p| {
                identity(
                    options,
                    &p.object.metadata.namespace,
                    p.spec.service_account(),
                )
            });
            let locality = match pod {
                Some(p) => pod_locality(pods.snapshot, p),
                None => node_locality(pods.snapshot, ep.node_name.as_deref().unwrap_or_default()),
            };
            let (hostname, subdomain) = pod.map(pod_dns_name).unwrap_or_default();
            for sp in ports {
                let Some(slice_port) = slice.spec.ports.iter().find(|p| p.name == sp.name) else {
                    continue;
                };
                let Some(port) = slice_port.port.and_then(|p| u16::try_from(p).ok()) else {
                    continue;
                };
                out.push(Endpoint {
                    address: address.clone(),
                    port,
                    service_port: sp.port,
                    service_port_name: sp.name.clone(),
                    tls_mode: tls_mode(&labels),
                    labels: labels.clone(),
                    identity: ident.clone(),
                    healthy: ep.conditions.ready.unwrap_or(true),
                    network: String::new(),
                    locality: locality.clone(),
                    weight: 1,
                    workload: pod.map(|p| p.object.key()),
                    hostname: hostname.clone(),
                    subdomain: subdomain.clone(),
                });
            }
        }
    }
}

/// WorkloadEntries in the Service's namespace whose labels match its selector
/// are endpoints too (Istio selects VMs for Kubernetes Services this way).
fn workload_entry_endpoints(
    snapshot: &Snapshot,
    svc: Typed<'_, kube::Service>,
    ports: &[ServicePort],
    options: &RegistryOptions,
    out: &mut Vec<Endpoint>,
) {
    let meta = &svc.object.metadata;
    let spec = &svc.spec.spec;
    if spec.selector.is_empty() {
        return;
    }
    for we in snapshot.list::<istio::WorkloadEntry>() {
        if we.object.metadata.namespace != meta.namespace
            || !labels_match(&spec.selector, &we.spec.labels)
        {
            continue;
        }
        for (sp, kp) in ports.iter().zip(&spec.ports) {
            let target = match &kp.target_port {
                Some(IntOrString::Int(n)) => *n,
                Some(IntOrString::String(name)) => {
                    we.spec.ports.get(name).copied().unwrap_or(kp.port)
                }
                None => kp.port,
            };
            let port = we.spec.ports.get(&sp.name).copied().unwrap_or(target);
            if let Some(ep) = workload_endpoint(
                we.spec,
                &we.object.metadata.namespace,
                Some(we.object.key()),
                sp,
                port,
                options,
            ) {
                out.push(entry_object_endpoint(ep, we));
            }
        }
    }
}

fn workload_endpoint(
    we: &istio::WorkloadEntry,
    namespace: &str,
    workload: Option<ObjectKey>,
    sp: &ServicePort,
    port: u32,
    options: &RegistryOptions,
) -> Option<Endpoint> {
    if we.address.is_empty() {
        return None;
    }
    Some(Endpoint {
        address: we.address.clone(),
        port: u16::try_from(port).ok()?,
        service_port: sp.port,
        service_port_name: sp.name.clone(),
        labels: we.labels.clone(),
        identity: identity(options, namespace, &we.service_account),
        tls_mode: tls_mode(&we.labels),
        healthy: true,
        network: we.network.clone(),
        locality: we.locality.clone(),
        weight: we.weight.unwrap_or(1),
        workload,
        hostname: String::new(),
        subdomain: String::new(),
    })
}

/// What a WorkloadEntry object adds to its endpoint (Istio's
/// `convertWorkloadEntryToServiceInstances`): its health (an entry whose
/// agent reports health is unhealthy until its `Healthy` condition is
/// `True`), and Istio mTLS when it has a service account and no
/// `security.istio.io/tlsMode` label (`getTLSModeFromWorkloadEntry`).
fn entry_object_endpoint(mut ep: Endpoint, we: Typed<'_, istio::WorkloadEntry>) -> Endpoint {
    ep.healthy = istio::is_healthy(&we.object.metadata.annotations, &we.spec.status_conditions);
    if !we.spec.labels.contains_key(EndpointTlsMode::LABEL) && !we.spec.service_account.is_empty() {
        ep.tls_mode = EndpointTlsMode::Istio;
    }
    ep
}

/// One service per ServiceEntry host, with endpoints from `endpoints`, or
/// from WorkloadEntries and Pods matching `workloadSelector`.
fn service_entry_services(
    snapshot: &Snapshot,
    se: Typed<'_, istio::ServiceEntry>,
    allocations: &super::ip_allocate::Allocations,
    options: &RegistryOptions,
) -> Vec<Service> {
    let meta = &se.object.metadata;
    let spec = se.spec;
    let ports: Vec<(ServicePort, Option<u32>)> = spec
        .ports
        .iter()
        .filter_map(|p| {
            Some((
                ServicePort {
                    name: p.name.clone(),
                    port: u16::try_from(p.number).ok()?,
                    protocol: Protocol::parse(&p.protocol),
                },
                p.target_port,
            ))
        })
        .collect();
    let resolution = match spec.resolution {
        istio::Resolution::None => ServiceResolution::Passthrough,
        istio::Resolution::Static => ServiceResolution::ClientSideLb,
        istio::Resolution::Dns => ServiceResolution::DnsLb,
        istio::Resolution::DnsRoundRobin => ServiceResolution::DnsRoundRobinLb,
        istio::Resolution::DynamicDns => ServiceResolution::DynamicDns,
    };
    let mesh_external = spec.location == Location::MeshExternal;

    let mut endpoints = Vec::new();
    for (sp, target) in &ports {
        let default_port = target.unwrap_or(u32::from(sp.port));
        for ep in &spec.endpoints {
            let port = ep.ports.get(&sp.name).copied().unwrap_or(default_port);
            if let Some(mut e) = workload_endpoint(ep, &meta.namespace, None, sp, port, options) {
                if mesh_external {
                    e.tls_mode = EndpointTlsMode::Disabled;
                }
                endpoints.push(e);
            }
        }
        if let Some(sel) = &spec.workload_selector {
            for we in snapshot.list::<istio::WorkloadEntry>() {
                if we.object.metadata.namespace != meta.namespace
                    || !labels_match(&sel.labels, &we.spec.labels)
                {
                    continue;
                }
                let port = we.spec.ports.get(&sp.name).copied().unwrap_or(default_port);
                if let Some(e) = workload_endpoint(
                    we.spec,
                    &meta.namespace,
                    Some(we.object.key()),
                    sp,
                    port,
                    options,
                ) {
                    endpoints.push(entry_object_endpoint(e, we));
                }
            }
            for pod in snapshot.list::<kube::Pod>() {
                let pmeta = &pod.object.metadata;
                if pmeta.namespace != meta.namespace
                    || !pod.spec.is_active()
                    || !labels_match(&sel.labels, &pmeta.labels)
                {
                    continue;
                }
                let Some(ip) = pod_ips(pod.spec).next() else {
                    continue;
                };
                let Ok(port) = u16::try_from(default_port) else {
                    continue;
                };
                endpoints.push(Endpoint {
                    address: ip.to_string(),
                    port,
                    service_port: sp.port,
                    service_port_name: sp.name.clone(),
                    labels: pmeta.labels.clone(),
                    identity: identity(options, &pmeta.namespace, pod.spec.service_account()),
                    tls_mode: tls_mode(&pmeta.labels),
                    healthy: true,
                    network: String::new(),
                    locality: pod_locality(snapshot, pod),
                    weight: 1,
                    workload: Some(pod.object.key()),
                    hostname: String::new(),
                    subdomain: String::new(),
                });
            }
        }
    }

    spec.hosts
        .iter()
        .map(|host| Service {
            hostname: host.clone(),
            namespace: meta.namespace.clone(),
            source_object: se.object.key(),
            source: ServiceSource::ServiceEntry,
            addresses: spec.addresses.clone(),
            auto_addresses: allocations
                .addresses(&se.object.key(), host)
                .iter()
                .map(ToString::to_string)
                .collect(),
            ports: ports.iter().map(|(p, _)| p.clone()).collect(),
            resolution,
            mesh_external,
            export_to: ExportTo::parse(&spec.export_to, &meta.namespace),
            subject_alt_names: spec.subject_alt_names.clone(),
            revision: 0,
            endpoints: endpoints.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests;
