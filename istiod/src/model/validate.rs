//! Istio's validation rules (`pkg/config/validation`) for the kinds istiod
//! reads: a selection of the rules that catch real mistakes, each with a
//! message that says what to do. Type errors (unknown fields, bad enum values,
//! durations) are caught earlier, when the object is decoded.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use super::error::FieldError;
use super::istio::{
    PeerAuthentication, Percent, PolicySelector, Port, ServiceEntry, Sidecar, WorkloadEntry,
    WorkloadSelector,
};
use super::kube::{AddressType, EndpointSlice, IntOrString, Pod, Service, ServiceType};
use super::meta::{Object, Spec};
use super::service::Protocol;

mod authn;
mod authz;
mod destination_rule;
mod envoy_filter;
mod gateway;
mod gateway_api;
mod gateway_api_grpc;
mod gateway_api_l4;
mod gateway_api_listener_set;
mod gateway_tcp;
mod gateway_tls;
mod ingress;
mod proxy_config;
mod route_refs;
mod telemetry;
#[cfg(test)]
mod test_support;
mod virtual_service;
mod virtual_service_tcp;
mod workload_group;

use destination_rule::destination_rule;
use route_refs::destination;
use virtual_service::virtual_service;

#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError::new(field, message));
    }
}

/// The problems of a mesh config `localityLbSetting` (Istio's
/// `ValidateLocalityLbSetting`, as for a DestinationRule's).
pub fn locality_lb_setting(
    field: &str,
    setting: &super::istio::LocalityLbSetting,
) -> Vec<FieldError> {
    let mut e = Errors::default();
    destination_rule::locality_lb_setting(field, setting, &mut e);
    e.0
}

/// Validates an object; returns every problem found (empty when valid).
pub fn validate(object: &Object) -> Vec<FieldError> {
    let mut e = Errors::default();
    validate_metadata(object, &mut e);
    match &object.spec {
        Spec::VirtualService(vs) => virtual_service(vs, &mut e),
        Spec::DestinationRule(dr) => destination_rule(dr, &object.metadata.namespace, &mut e),
        Spec::ServiceEntry(se) => service_entry(se, &mut e),
        Spec::WorkloadEntry(we) => workload_entry("spec", we, None, &mut e),
        Spec::WorkloadGroup(wg) => workload_group::workload_group(wg, &mut e),
        Spec::Sidecar(sc) => sidecar(sc, &mut e),
        Spec::Gateway(gw) => gateway::gateway(gw, &mut e),
        Spec::EnvoyFilter(ef) => envoy_filter::envoy_filter(ef, &object.metadata.namespace, &mut e),
        Spec::PeerAuthentication(pa) => peer_authentication(pa, &mut e),
        Spec::AuthorizationPolicy(ap) => authz::authorization_policy(ap, &mut e),
        Spec::RequestAuthentication(ra) => authn::request_authentication(ra, &mut e),
        Spec::Service(svc) => service(svc, &mut e),
        Spec::EndpointSlice(slice) => endpoint_slice(slice, &mut e),
        Spec::Pod(pod) => self::pod(pod, &mut e),
        Spec::Secret(secret) => self::secret(secret, &mut e),
        Spec::Namespace(_) | Spec::Node(_) => {}
        Spec::GatewayClass(gc) => gateway_api::gateway_class(gc, &mut e),
        Spec::KubernetesGateway(gw) => {
            gateway_api::gateway(gw, &mut e);
            if let Some(a) = &gw.allowed_listeners {
                gateway_api_listener_set::allowed_listeners(a, &mut e);
            }
        }
        Spec::HttpRoute(r) => gateway_api::http_route(r, &object.metadata.namespace, &mut e),
        Spec::Telemetry(t) => telemetry::telemetry(t, &mut e),
        Spec::ProxyConfig(pc) => proxy_config::proxy_config(pc, &mut e),
        Spec::Ingress(i) => ingress::ingress(i, &object.metadata.annotations, &mut e),
        Spec::IngressClass(_) => {}
        Spec::ReferenceGrant(g) => gateway_api_l4::reference_grant(g, &mut e),
        Spec::TcpRoute(r) => gateway_api_l4::tcp_route(r, &mut e),
        Spec::TlsRoute(r) => gateway_api_l4::tls_route(r, &mut e),
        Spec::GrpcRoute(r) => gateway_api_grpc::grpc_route(r, &object.metadata.namespace, &mut e),
        Spec::BackendTlsPolicy(p) => {
            e.0.extend(super::gateway_api::backend_tls_policy::validate(p));
        }
        Spec::ConfigMap(_) => {}
        Spec::ListenerSet(l) => gateway_api_listener_set::listener_set(l, &mut e),
    }
    e.0
}

/// The credentials of a Secret parse as PEM (Istio finds out when a
/// gateway asks for them; here the Secret is reported, naming its key, and
/// the last good version stays served).
fn secret(s: &super::secret::Secret, e: &mut Errors) {
    for (key, kind) in s.pem_keys() {
        if let Err(reason) = super::secret::check_pem(&s.data[key], kind) {
            e.add(format!("data.{key}"), reason.to_string());
        }
    }
}

fn validate_metadata(object: &Object, e: &mut Errors) {
    let meta = &object.metadata;
    if meta.name.is_empty() {
        e.add(
            "metadata.name",
            "is required (give the object a name, unique for its kind in its namespace)",
        );
    } else if !is_dns1123_subdomain(&meta.name) {
        e.add(
            "metadata.name",
            format!(
                "{:?} is not a valid name (use lower-case letters, digits, '-' and '.', starting and ending with a letter or digit)",
                meta.name
            ),
        );
    }
    if object.kind().is_namespaced() && !is_dns1123_label(&meta.namespace) {
        e.add(
            "metadata.namespace",
            format!(
                "{:?} is not a valid namespace (use lower-case letters, digits and '-', at most 63 characters)",
                meta.namespace
            ),
        );
    }
}

// ---------------------------------------------------------------------------
// ServiceEntry and WorkloadEntry

fn service_entry(se: &ServiceEntry, e: &mut Errors) {
    use super::istio::Resolution;
    if se.hosts.is_empty() {
        e.add(
            "spec.hosts",
            "at least one host is required (list the host names of the service, e.g. api.example.com)",
        );
    }
    for (i, host) in se.hosts.iter().enumerate() {
        let field = format!("spec.hosts[{i}]");
        if host == "*" {
            e.add(
                field,
                "a ServiceEntry cannot be for every host (*); name the hosts, or use *.<domain>",
            );
        } else {
            check_host(&field, host, e);
        }
    }
    // A CIDR needs Istio's wildcard listener with per-range filter chains
    // for TCP ports, which this istiod does not build; HTTP ports route by
    // host and take it.
    let tcp_port = se.ports.iter().any(|p| {
        let p = super::service::Protocol::parse(&p.protocol);
        !p.is_http() && p != super::service::Protocol::Udp
    });
    for (i, addr) in se.addresses.iter().enumerate() {
        if !is_ip_or_cidr(addr) {
            e.add(
                format!("spec.addresses[{i}]"),
                format!("{addr:?} is not an IP address or CIDR (e.g. 10.1.2.3 or 10.1.0.0/16)"),
            );
        } else if tcp_port && addr.contains('/') {
            e.add(
                format!("spec.addresses[{i}]"),
                format!("{addr:?}: CIDR addresses with TCP, TLS or undeclared-protocol ports are not supported by this istiod yet (list single IPs, or leave addresses out to have one allocated)"),
            );
        }
    }
    if se.ports.is_empty() {
        e.add(
            "spec.ports",
            "at least one port is required (give number, name and protocol, e.g. {number: 443, name: https, protocol: TLS})",
        );
    }
    let mut names = BTreeSet::new();
    let mut numbers = BTreeSet::new();
    for (i, port) in se.ports.iter().enumerate() {
        let field = format!("spec.ports[{i}]");
        check_istio_port(&field, port, true, e);
        if !port.name.is_empty() && !names.insert(port.name.as_str()) {
            e.add(
                format!("{field}.name"),
                format!(
                    "port name {:?} is used twice (give each port a unique name)",
                    port.name
                ),
            );
        }
        if !numbers.insert(port.number) {
            e.add(
                format!("{field}.number"),
                format!("port {} is listed twice (list each port once)", port.number),
            );
        }
    }
    if !se.endpoints.is_empty() && se.workload_selector.is_some() {
        e.add(
            "spec.workloadSelector",
            "endpoints and workloadSelector are mutually exclusive (keep one of them)",
        );
    }
    if let Some(sel) = &se.workload_selector {
        check_selector("spec.workloadSelector", sel, e);
    }
    match se.resolution {
        Resolution::DynamicDns => e.add(
            "spec.resolution",
            "DYNAMIC_DNS is not supported by this istiod (use DNS, or NONE for wildcard hosts)",
        ),
        Resolution::Static if se.endpoints.is_empty() && se.workload_selector.is_none() => e.add(
            "spec.resolution",
            "STATIC resolution needs endpoints or a workloadSelector (list the endpoint IPs, or use DNS or NONE)",
        ),
        Resolution::Dns | Resolution::DnsRoundRobin if se.endpoints.is_empty() => {
            for (i, host) in se.hosts.iter().enumerate() {
                if host.starts_with('*') {
                    e.add(
                        format!("spec.hosts[{i}]"),
                        format!(
                            "{host:?} cannot be resolved by DNS (use resolution NONE for wildcard hosts, or list endpoints)"
                        ),
                    );
                }
            }
        }
        Resolution::DnsRoundRobin if se.endpoints.len() > 1 => e.add(
            "spec.endpoints",
            "DNS_ROUND_ROBIN resolution allows at most one endpoint (use DNS for several)",
        ),
        _ => {}
    }
    let port_names: BTreeSet<&str> = se.ports.iter().map(|p| p.name.as_str()).collect();
    for (i, ep) in se.endpoints.iter().enumerate() {
        let field = format!("spec.endpoints[{i}]");
        workload_entry(&field, ep, Some(&port_names), e);
        if se.resolution == Resolution::Static
            && !ep.address.is_empty()
            && ep.address.parse::<IpAddr>().is_err()
            && !ep.address.starts_with("unix://")
        {
            e.add(
                format!("{field}.address"),
                format!(
                    "{:?} is not an IP address, which STATIC resolution needs (use an IP, or resolution DNS for host names)",
                    ep.address
                ),
            );
        }
    }
    check_export_to("spec.exportTo", &se.export_to, e);
    for (i, san) in se.subject_alt_names.iter().enumerate() {
        if san.is_empty() {
            e.add(
                format!("spec.subjectAltNames[{i}]"),
                "is empty (remove it or give an identity such as spiffe://cluster.local/ns/default/sa/api)",
            );
        }
    }
}

fn workload_entry(
    field: &str,
    we: &WorkloadEntry,
    port_names: Option<&BTreeSet<&str>>,
    e: &mut Errors,
) {
    if we.address.is_empty() {
        if we.network.is_empty() {
            e.add(
                format!("{field}.address"),
                "is required (give the workload's IP address or host name)",
            );
        }
    } else if we.address.parse::<IpAddr>().is_err()
        && !we.address.starts_with("unix://")
        && !is_hostname(&we.address)
    {
        e.add(
            format!("{field}.address"),
            format!(
                "{:?} is not an IP address, host name or unix:// path",
                we.address
            ),
        );
    }
    if !we.network.is_empty() {
        e.add(
            format!("{field}.network"),
            "multi-network meshes are not supported by this istiod (leave network empty; every endpoint is reached directly)",
        );
    }
    for (name, number) in &we.ports {
        check_port(&format!("{field}.ports.{name}"), *number, e);
        if let Some(names) = port_names
            && !names.contains(name.as_str())
        {
            e.add(
                format!("{field}.ports.{name}"),
                format!(
                    "names no port of this ServiceEntry (use one of: {})",
                    names.iter().copied().collect::<Vec<_>>().join(", ")
                ),
            );
        }
    }
    if let Some(w) = we.weight
        && w == 0
    {
        e.add(
            format!("{field}.weight"),
            "must be at least 1 (leave it out for the default weight)",
        );
    }
}

// ---------------------------------------------------------------------------
// Sidecar and PeerAuthentication

fn sidecar(sc: &Sidecar, e: &mut Errors) {
    if let Some(sel) = &sc.workload_selector {
        check_selector("spec.workloadSelector", sel, e);
    }
    let mut catch_all = 0;
    for (i, eg) in sc.egress.iter().enumerate() {
        let field = format!("spec.egress[{i}]");
        match &eg.port {
            Some(p) => check_istio_port(&format!("{field}.port"), p, false, e),
            None => catch_all += 1,
        }
        if !eg.bind.is_empty()
            && eg.bind.parse::<IpAddr>().is_err()
            && !eg.bind.starts_with("unix://")
        {
            e.add(
                format!("{field}.bind"),
                format!("{:?} is not an IP address or unix:// path", eg.bind),
            );
        }
        if eg.hosts.is_empty() {
            e.add(
                format!("{field}.hosts"),
                "at least one host is required (e.g. ./* for this namespace, istio-system/*)",
            );
        }
        for (j, host) in eg.hosts.iter().enumerate() {
            if let Err(msg) = check_egress_host(host) {
                e.add(format!("{field}.hosts[{j}]"), msg.to_string());
            }
        }
    }
    if catch_all > 1 {
        e.add(
            "spec.egress",
            "only one egress listener may leave out the port (merge the catch-all listeners)",
        );
    }
    for (i, ing) in sc.ingress.iter().enumerate() {
        let field = format!("spec.ingress[{i}]");
        check_istio_port(&format!("{field}.port"), &ing.port, false, e);
        if let Some(tls) = &ing.tls {
            gateway_tls::sidecar_ingress_tls(
                &format!("{field}.tls"),
                tls,
                super::features::published().enable_tls_on_sidecar_ingress,
                e,
            );
        }
        if let Some(cp) = &ing.connection_pool {
            destination_rule::connection_pool(&format!("{field}.connectionPool"), cp, e);
        }
        if !ing.default_endpoint.is_empty() && !valid_default_endpoint(&ing.default_endpoint) {
            e.add(
                format!("{field}.defaultEndpoint"),
                format!(
                    "{:?} is not a valid default endpoint (use 127.0.0.1:PORT, 0.0.0.0:PORT, [::1]:PORT, [::]:PORT or unix:///path)",
                    ing.default_endpoint
                ),
            );
        }
    }
    if let Some(cp) = &sc.inbound_connection_pool {
        destination_rule::connection_pool("spec.inboundConnectionPool", cp, e);
    }
    if let Some(otp) = &sc.outbound_traffic_policy
        && let Some(proxy) = &otp.egress_proxy
    {
        let field = "spec.outboundTrafficPolicy.egressProxy";
        destination(field, proxy, e);
        // Istio's rules: the egress proxy takes what ALLOW_ANY would pass
        // through, at a port of the proxy's service.
        if otp.mode != super::istio::OutboundMode::AllowAny {
            e.add(
                field,
                "is only used with mode ALLOW_ANY (set mode: ALLOW_ANY, or remove egressProxy)",
            );
        }
        if proxy.port.is_none() {
            e.add(
                format!("{field}.port"),
                "is required (the egress proxy's service port, e.g. {number: 3128})",
            );
        }
    }
}

/// Why a Sidecar egress or Gateway host is not `namespace/host`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EgressHostError {
    /// There is no `/`.
    #[error("{host:?} is not of the form namespace/host (e.g. ./*, istio-system/*, */{host})")]
    NotNamespaced {
        /// The host as written.
        host: String,
    },
    /// The part before the `/` is not a namespace.
    #[error(
        "{ns:?} in {host:?} is not a namespace (use a namespace name, * for any, . for the Sidecar's own, ~ for none)"
    )]
    BadNamespace {
        /// The namespace part.
        ns: String,
        /// The host as written.
        host: String,
    },
    /// Nothing follows the `/`.
    #[error("{host:?} has no host after the / (use * for every host)")]
    NoHost {
        /// The host as written.
        host: String,
    },
    /// The host after the `/` is not a host name (the message says why).
    #[error("{0}")]
    BadHost(String),
}

/// `namespace/host`, where the namespace is `*`, `.`, `~` or a name, and the
/// host is `*`, `*.<suffix>` or a name.
fn check_egress_host(host: &str) -> Result<(), EgressHostError> {
    let Some((ns, name)) = host.split_once('/') else {
        return Err(EgressHostError::NotNamespaced {
            host: host.to_string(),
        });
    };
    if ns.is_empty() || !(ns == "*" || ns == "." || ns == "~" || is_dns1123_label(ns)) {
        return Err(EgressHostError::BadNamespace {
            ns: ns.to_string(),
            host: host.to_string(),
        });
    }
    if name.is_empty() {
        return Err(EgressHostError::NoHost {
            host: host.to_string(),
        });
    }
    if name != "*" {
        let mut e = Errors::default();
        check_host("", name, &mut e);
        if let Some(err) = e.0.into_iter().next() {
            return Err(EgressHostError::BadHost(err.message));
        }
    }
    Ok(())
}

fn valid_default_endpoint(ep: &str) -> bool {
    if ep.starts_with("unix://") {
        return ep.len() > "unix://".len();
    }
    let Some((host, port)) = ep.rsplit_once(':') else {
        return false;
    };
    matches!(host, "127.0.0.1" | "0.0.0.0" | "[::1]" | "[::]")
        && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p))
}

fn peer_authentication(pa: &PeerAuthentication, e: &mut Errors) {
    if let Some(sel) = &pa.selector {
        check_policy_selector("spec.selector", sel, e);
    }
    // As Istio's validation: a namespace- or mesh-wide policy (no selector,
    // or one without labels) cannot carry port-level modes.
    let selects_workloads = pa
        .selector
        .as_ref()
        .is_some_and(|s| !s.match_labels.is_empty());
    if !pa.port_level_mtls.is_empty() && !selects_workloads {
        e.add(
            "spec.portLevelMtls",
            "needs a selector with matchLabels (port-level modes apply to the selected workloads' ports)",
        );
    }
    for port in pa.port_level_mtls.keys() {
        check_port(&format!("spec.portLevelMtls.{port}"), *port, e);
    }
}

// ---------------------------------------------------------------------------
// Kubernetes objects

fn service(svc: &Service, e: &mut Errors) {
    let spec = &svc.spec;
    let mut names = BTreeSet::new();
    for (i, p) in spec.ports.iter().enumerate() {
        let field = format!("spec.ports[{i}]");
        check_port(&format!("{field}.port"), p.port, e);
        if let Some(IntOrString::Int(t)) = p.target_port {
            check_port(&format!("{field}.targetPort"), t, e);
        }
        if spec.ports.len() > 1 && p.name.is_empty() {
            e.add(
                format!("{field}.name"),
                "is required when a Service has several ports (name it, e.g. http or grpc-api)",
            );
        } else if !p.name.is_empty() && !names.insert(p.name.as_str()) {
            e.add(
                format!("{field}.name"),
                format!("port name {:?} is used twice", p.name),
            );
        }
    }
    if let Some(ip) = &spec.cluster_ip
        && !ip.is_empty()
        && ip != "None"
        && ip.parse::<IpAddr>().is_err()
    {
        e.add(
            "spec.clusterIP",
            format!("{ip:?} is not an IP address (use an IP, None for a headless service, or leave it out)"),
        );
    }
    if spec.service_type == ServiceType::ExternalName
        && spec.external_name.as_deref().unwrap_or("").is_empty()
    {
        e.add(
            "spec.externalName",
            "is required for type ExternalName (give the DNS name the service aliases)",
        );
    }
}

fn endpoint_slice(slice: &EndpointSlice, e: &mut Errors) {
    for (i, ep) in slice.endpoints.iter().enumerate() {
        for (j, addr) in ep.addresses.iter().enumerate() {
            let ok = match slice.address_type {
                AddressType::IPv4 => addr.parse::<std::net::Ipv4Addr>().is_ok(),
                AddressType::IPv6 => addr.parse::<std::net::Ipv6Addr>().is_ok(),
                AddressType::Fqdn => is_hostname(addr),
            };
            if !ok {
                e.add(
                    format!("endpoints[{i}].addresses[{j}]"),
                    format!(
                        "{addr:?} is not a valid {:?} address (match addressType)",
                        slice.address_type
                    ),
                );
            }
        }
    }
    for (i, p) in slice.ports.iter().enumerate() {
        if let Some(port) = p.port {
            check_port(&format!("ports[{i}].port"), port, e);
        }
    }
}

fn pod(pod: &Pod, e: &mut Errors) {
    if let Some(ip) = &pod.status.pod_ip
        && !ip.is_empty()
        && ip.parse::<IpAddr>().is_err()
    {
        e.add("status.podIP", format!("{ip:?} is not an IP address"));
    }
}

// ---------------------------------------------------------------------------
// Shared checks

fn check_port(field: &str, port: u32, e: &mut Errors) {
    if !(1..=65535).contains(&port) {
        e.add(
            field,
            format!("{port} is not a valid port (use a number between 1 and 65535)"),
        );
    }
}

fn check_istio_port(field: &str, port: &Port, name_required: bool, e: &mut Errors) {
    check_port(&format!("{field}.number"), port.number, e);
    if let Some(t) = port.target_port {
        check_port(&format!("{field}.targetPort"), t, e);
    }
    if name_required && port.name.is_empty() {
        e.add(
            format!("{field}.name"),
            "is required (name the port, e.g. http or tls-api)",
        );
    }
    if !port.protocol.is_empty() && Protocol::parse(&port.protocol) == Protocol::Unsupported {
        e.add(
            format!("{field}.protocol"),
            format!(
                "{:?} is not a protocol Istio knows (use HTTP, HTTPS, HTTP2, GRPC, GRPC-WEB, TCP, TLS, MONGO, REDIS, MYSQL or UDP)",
                port.protocol
            ),
        );
    }
}

fn non_negative(field: &str, v: Option<i32>, e: &mut Errors) {
    if let Some(v) = v
        && v < 0
    {
        e.add(field, format!("{v} is negative (use 0 or more)"));
    }
}

fn check_min_duration(field: &str, d: Duration, e: &mut Errors) {
    if d < Duration::from_millis(1) {
        e.add(
            field,
            format!(
                "{} is shorter than 1ms (give a longer duration, e.g. 1s)",
                common::duration::format(d)
            ),
        );
    }
}

fn check_percent(field: &str, p: &Percent, e: &mut Errors) {
    if !(0.0..=100.0).contains(&p.value) {
        e.add(
            field,
            format!(
                "{} is out of range (use a percentage between 0 and 100)",
                p.value
            ),
        );
    }
}

fn check_selector(field: &str, sel: &WorkloadSelector, e: &mut Errors) {
    for key in sel.labels.keys() {
        if key.is_empty() {
            e.add(format!("{field}.labels"), "label names cannot be empty");
        }
    }
}

fn check_policy_selector(field: &str, sel: &PolicySelector, e: &mut Errors) {
    for key in sel.match_labels.keys() {
        if key.is_empty() {
            e.add(
                format!("{field}.matchLabels"),
                "label names cannot be empty",
            );
        }
    }
}

fn check_export_to(field: &str, export_to: &[String], e: &mut Errors) {
    let mut seen = BTreeMap::new();
    for (i, ns) in export_to.iter().enumerate() {
        if !(ns == "." || ns == "*" || ns == "~" || is_dns1123_label(ns)) {
            e.add(
                format!("{field}[{i}]"),
                format!(
                    "{ns:?} is not a namespace (use . for this namespace, * for all, ~ for none, or namespace names)"
                ),
            );
        }
        if seen.insert(ns.as_str(), i).is_some() {
            e.add(format!("{field}[{i}]"), format!("{ns:?} is listed twice"));
        }
    }
    if export_to.len() > 1 && export_to.iter().any(|n| n == "~" || n == "*") {
        e.add(
            field,
            "* and ~ cannot be combined with other values (use * alone, ~ alone, or a list of namespaces)",
        );
    }
}

/// A host in a VirtualService, DestinationRule or ServiceEntry: a DNS name,
/// optionally with a leading `*` wildcard label, or a short name.
fn check_host(field: &str, host: &str, e: &mut Errors) {
    if host == "*" {
        return;
    }
    if host.contains('/') {
        e.add(
            field,
            format!("{host:?} is not a host name (hosts are names such as reviews or reviews.default.svc.cluster.local; namespace/host is only for Sidecar egress)"),
        );
        return;
    }
    let name = host.strip_prefix("*.").unwrap_or(host);
    if host.starts_with('*') && !host.starts_with("*.") {
        e.add(
            field,
            format!("{host:?}: a wildcard must be a whole leading label (e.g. *.example.com)"),
        );
        return;
    }
    if host.parse::<IpAddr>().is_ok() {
        return;
    }
    if !is_hostname(name) {
        e.add(
            field,
            format!("{host:?} is not a valid host name (use letters, digits, '-' and '.', labels of at most 63 characters)"),
        );
    }
}

fn is_hostname(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn is_ip_or_cidr(s: &str) -> bool {
    match s.split_once('/') {
        None => s.parse::<IpAddr>().is_ok(),
        Some((ip, bits)) => match (ip.parse::<IpAddr>(), bits.parse::<u8>()) {
            (Ok(IpAddr::V4(_)), Ok(b)) => b <= 32,
            (Ok(IpAddr::V6(_)), Ok(b)) => b <= 128,
            _ => false,
        },
    }
}

/// RFC 1123 label: lower-case alphanumerics and `-`, at most 63 characters.
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain: labels joined by `.`, at most 253 characters.
fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

#[cfg(test)]
mod tests {
    use crate::model::{ConfigError, parse_file};

    const VS: &str = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r, namespace: demo}\n";
    const DR: &str = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: d, namespace: demo}\n";
    const SE: &str = "apiVersion: networking.istio.io/v1beta1\nkind: ServiceEntry\nmetadata: {name: s, namespace: demo}\n";
    const SC: &str = "apiVersion: networking.istio.io/v1alpha3\nkind: Sidecar\nmetadata: {name: default, namespace: demo}\n";
    const PA: &str = "apiVersion: security.istio.io/v1beta1\nkind: PeerAuthentication\nmetadata: {name: p, namespace: demo}\n";

    fn rejected(yaml: &str) -> Vec<ConfigError> {
        match parse_file("mesh/bad.yaml", yaml) {
            Ok(parsed) => panic!("accepted: {parsed:?}"),
            Err(errors) => errors,
        }
    }

    /// Asserts that the document is rejected with an error naming the file,
    /// the object, the field, and containing `needle`.
    #[track_caller]
    fn assert_rejected(yaml: &str, object: &str, field: &str, needle: &str) {
        let errors = rejected(yaml);
        let expected_prefix = format!("mesh/bad.yaml: {object}: {field}: ");
        assert!(
            errors.iter().any(|e| {
                let s = e.to_string();
                e.file() == "mesh/bad.yaml"
                    && e.field() == Some(field)
                    && s.starts_with(&expected_prefix)
                    && s.contains(needle)
            }),
            "expected {expected_prefix}...{needle}...; got:\n{}",
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    #[test]
    fn metadata_name_is_required() {
        assert_rejected(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {namespace: demo}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}]}]}\n",
            "VirtualService/demo/<unnamed>",
            "metadata.name",
            "is required",
        );
        assert_rejected(
            "apiVersion: v1\nkind: Service\nmetadata: {name: Bad_Name, namespace: demo}\n",
            "Service/demo/Bad_Name",
            "metadata.name",
            "not a valid name",
        );
    }

    #[test]
    fn virtual_service_rules() {
        // Without hosts, a delegate: HTTP routes only.
        assert!(
            parse_file(
                "d.yaml",
                &format!("{VS}spec: {{http: [{{route: [{{destination: {{host: a}}}}]}}]}}\n")
            )
            .is_ok()
        );
        assert_rejected(
            &format!("{VS}spec: {{tcp: [{{route: [{{destination: {{host: a}}}}]}}]}}\n"),
            "VirtualService/demo/r",
            "spec.tcp",
            "delegate VirtualService",
        );
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], http: [{{route: [{{destination: {{subset: v1}}}}]}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.http[0].route[0].destination.host",
            "is required (name the service",
        );
        let weights = |a: i32, b: i32| {
            format!(
                "{VS}spec:\n  hosts: [a]\n  http:\n  - route:\n    - destination: {{host: a, subset: v1}}\n      weight: {a}\n    - destination: {{host: a, subset: v2}}\n      weight: {b}\n"
            )
        };
        assert_rejected(
            &weights(80, 10),
            "VirtualService/demo/r",
            "spec.http[0].route[1].weight",
            "add up to 90, not 100",
        );
        assert_rejected(
            &weights(-50, 150),
            "VirtualService/demo/r",
            "spec.http[0].route[1].weight",
            "150 is out of range",
        );
        assert!(parse_file("ok.yaml", &weights(90, 10)).is_ok());
        assert_rejected(
            &format!("{VS}spec: {{hosts: [a], http: [{{name: empty}}]}}\n"),
            "VirtualService/demo/r",
            "spec.http[0]",
            "needs one of route, redirect, directResponse or delegate",
        );
        assert_rejected(
            &format!("{VS}spec: {{hosts: [a]}}\n"),
            "VirtualService/demo/r",
            "spec",
            "no http, tcp or tls routes",
        );
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: ['*'], http: [{{route: [{{destination: {{host: a}}}}]}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.hosts[0]",
            "wildcard host * is not allowed",
        );
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], http: [{{match: [{{uri: {{regex: '(['}}}}], route: [{{destination: {{host: a}}}}]}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.http[0].match[0].uri.regex",
            "not a valid regular expression",
        );
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], http: [{{match: [{{uri: {{exact: /a, prefix: /b}}}}], route: [{{destination: {{host: a}}}}]}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.http[0].match[0].uri",
            "only one of exact, prefix and regex",
        );
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], http: [{{route: [{{destination: {{host: a}}}}], retries: {{attempts: 3, retryOn: 'sometimes'}}}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.http[0].retries.retryOn",
            "\"sometimes\" is not a retry condition",
        );
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], http: [{{route: [{{destination: {{host: a}}}}], fault: {{abort: {{httpStatus: 503, percentage: {{value: 150}}}}}}}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.http[0].fault.abort.percentage.value",
            "out of range",
        );
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], tcp: [{{route: [{{destination: {{host: a, port: {{number: 70000}}}}}}]}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.tcp[0].route[0].destination.port.number",
            "70000 is not a valid port",
        );
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], tls: [{{match: [{{port: 443}}], route: [{{destination: {{host: a}}}}]}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.tls[0].match[0].sniHosts",
            "at least one SNI host",
        );
    }

    #[test]
    fn durations_must_parse() {
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], http: [{{route: [{{destination: {{host: a}}}}], timeout: 5}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.http[0].timeout",
            "invalid duration \"5\"",
        );
        assert_rejected(
            &format!(
                "{DR}spec: {{host: a, trafficPolicy: {{outlierDetection: {{interval: 10x}}}}}}\n"
            ),
            "DestinationRule/demo/d",
            "spec.trafficPolicy.outlierDetection.interval",
            "invalid duration \"10x\"",
        );
    }

    #[test]
    fn unknown_fields_in_spec_are_named() {
        assert_rejected(
            &format!(
                "{VS}spec: {{hosts: [a], http: [{{route: [{{destination: {{host: a}}, wieght: 100}}]}}]}}\n"
            ),
            "VirtualService/demo/r",
            "spec.http[0].route[0].wieght",
            "unknown field `wieght`",
        );
    }

    #[test]
    fn destination_rule_rules() {
        assert_rejected(
            &format!("{DR}spec: {{subsets: [{{name: v1}}]}}\n"),
            "DestinationRule/demo/d",
            "spec.host",
            "is required",
        );
        assert_rejected(
            &format!("{DR}spec: {{host: a, subsets: [{{name: v1}}, {{name: v1}}]}}\n"),
            "DestinationRule/demo/d",
            "spec.subsets[1].name",
            "subset \"v1\" is defined twice",
        );
        assert_rejected(
            &format!("{DR}spec: {{host: a, subsets: [{{labels: {{version: v1}}}}]}}\n"),
            "DestinationRule/demo/d",
            "spec.subsets[0].name",
            "is required",
        );
        assert_rejected(
            &format!(
                "{DR}spec: {{host: a, trafficPolicy: {{tls: {{mode: ISTIO_MUTUAL, clientCertificate: /c.pem}}}}}}\n"
            ),
            "DestinationRule/demo/d",
            "spec.trafficPolicy.tls.clientCertificate",
            "ISTIO_MUTUAL uses the workload's Istio certificate",
        );
        assert_rejected(
            &format!("{DR}spec: {{host: a, trafficPolicy: {{tls: {{mode: MUTUAL}}}}}}\n"),
            "DestinationRule/demo/d",
            "spec.trafficPolicy.tls.clientCertificate",
            "is required for MUTUAL",
        );
        assert_rejected(
            &format!(
                "{DR}spec: {{host: a, trafficPolicy: {{loadBalancer: {{consistentHash: {{}}}}}}}}\n"
            ),
            "DestinationRule/demo/d",
            "spec.trafficPolicy.loadBalancer.consistentHash",
            "exactly one of httpHeaderName",
        );
        assert_rejected(
            &format!(
                "{DR}spec: {{host: a, subsets: [{{name: v1, trafficPolicy: {{outlierDetection: {{maxEjectionPercent: 120}}}}}}]}}\n"
            ),
            "DestinationRule/demo/d",
            "spec.subsets[0].trafficPolicy.outlierDetection.maxEjectionPercent",
            "120 is out of range",
        );
        assert_rejected(
            &format!(
                "{DR}spec: {{host: a, trafficPolicy: {{connectionPool: {{http: {{maxRetries: -1}}}}}}}}\n"
            ),
            "DestinationRule/demo/d",
            "spec.trafficPolicy.connectionPool.http.maxRetries",
            "-1 is negative",
        );
        assert_rejected(
            &format!("{DR}spec: {{host: a, exportTo: [., '*']}}\n"),
            "DestinationRule/demo/d",
            "spec.exportTo",
            "* and ~ cannot be combined",
        );
    }

    #[test]
    fn service_entry_rules() {
        assert_rejected(
            &format!(
                "{SE}spec: {{hosts: [db.example.com], addresses: [10.1.0.0/16], ports: [{{number: 3306, name: tcp, protocol: TCP}}]}}\n"
            ),
            "ServiceEntry/demo/s",
            "spec.addresses[0]",
            "CIDR addresses with TCP",
        );
        // HTTP ports route by host: a CIDR is taken there.
        parse_file(
            "mesh/ok.yaml",
            &format!(
                "{SE}spec: {{hosts: [web.example.com], addresses: [10.1.0.0/16], ports: [{{number: 80, name: http, protocol: HTTP}}]}}\n"
            ),
        )
        .unwrap();
        assert_rejected(
            &format!("{SE}spec: {{ports: [{{number: 443, name: tls, protocol: TLS}}]}}\n"),
            "ServiceEntry/demo/s",
            "spec.hosts",
            "at least one host is required",
        );
        assert_rejected(
            &format!("{SE}spec: {{hosts: [api.example.com]}}\n"),
            "ServiceEntry/demo/s",
            "spec.ports",
            "at least one port is required",
        );
        assert_rejected(
            &format!(
                "{SE}spec: {{hosts: [api.example.com], ports: [{{number: 0, name: tls, protocol: TLS}}]}}\n"
            ),
            "ServiceEntry/demo/s",
            "spec.ports[0].number",
            "0 is not a valid port",
        );
        assert_rejected(
            &format!(
                "{SE}spec: {{hosts: [api.example.com], ports: [{{number: 443, name: tls, protocol: QUIC}}]}}\n"
            ),
            "ServiceEntry/demo/s",
            "spec.ports[0].protocol",
            "\"QUIC\" is not a protocol Istio knows",
        );
        assert_rejected(
            &format!(
                "{SE}spec: {{hosts: [api.example.com], ports: [{{number: 80, name: http}}], resolution: STATIC}}\n"
            ),
            "ServiceEntry/demo/s",
            "spec.resolution",
            "STATIC resolution needs endpoints or a workloadSelector",
        );
        assert_rejected(
            &format!(
                "{SE}spec: {{hosts: [api.example.com], ports: [{{number: 80, name: http}}], resolution: STATIC, endpoints: [{{address: api.internal}}]}}\n"
            ),
            "ServiceEntry/demo/s",
            "spec.endpoints[0].address",
            "not an IP address, which STATIC resolution needs",
        );
        assert_rejected(
            &format!(
                "{SE}spec: {{hosts: [api.example.com], ports: [{{number: 80, name: http}}], resolution: DNS, endpoints: [{{address: 10.0.0.1, ports: {{grpc: 9090}}}}]}}\n"
            ),
            "ServiceEntry/demo/s",
            "spec.endpoints[0].ports.grpc",
            "names no port of this ServiceEntry",
        );
        assert_rejected(
            &format!(
                "{SE}spec: {{hosts: [api.example.com], ports: [{{number: 80, name: http}}], resolution: MAGIC}}\n"
            ),
            "ServiceEntry/demo/s",
            "spec.resolution",
            "unknown variant `MAGIC`",
        );
    }

    #[test]
    fn peer_authentication_rules() {
        assert_rejected(
            &format!("{PA}spec: {{mtls: {{mode: strict}}}}\n"),
            "PeerAuthentication/demo/p",
            "spec.mtls.mode",
            "expected one of `UNSET`, `DISABLE`, `PERMISSIVE`, `STRICT`",
        );
        assert_rejected(
            &format!("{PA}spec: {{portLevelMtls: {{8080: {{mode: DISABLE}}}}}}\n"),
            "PeerAuthentication/demo/p",
            "spec.portLevelMtls",
            "needs a selector",
        );
    }

    #[test]
    fn sidecar_rules() {
        assert_rejected(
            &format!(
                "{SC}spec: {{egress: [{{hosts: [istio-system/*, httpbin.demo.svc.cluster.local]}}]}}\n"
            ),
            "Sidecar/demo/default",
            "spec.egress[0].hosts[1]",
            "is not of the form namespace/host",
        );
        assert_rejected(
            &format!("{SC}spec: {{egress: [{{hosts: [Demo/*]}}]}}\n"),
            "Sidecar/demo/default",
            "spec.egress[0].hosts[0]",
            "is not a namespace",
        );
        assert_rejected(
            &format!(
                "{SC}spec: {{ingress: [{{port: {{number: 9080, protocol: HTTP, name: http}}, defaultEndpoint: 'localhost:8080'}}], egress: [{{hosts: [./*]}}]}}\n"
            ),
            "Sidecar/demo/default",
            "spec.ingress[0].defaultEndpoint",
            "not a valid default endpoint",
        );
        assert_rejected(
            &format!(
                "{SC}spec: {{inboundConnectionPool: {{tcp: {{maxConnections: -1}}}}, ingress: [{{port: {{number: 9080, protocol: HTTP, name: http}}, connectionPool: {{http: {{idleTimeout: 1ns}}}}}}]}}\n"
            ),
            "Sidecar/demo/default",
            "spec.inboundConnectionPool.tcp.maxConnections",
            "",
        );
        assert_rejected(
            &format!(
                "{SC}spec: {{ingress: [{{port: {{number: 9080, protocol: HTTP, name: http}}, connectionPool: {{http: {{idleTimeout: 1ns}}}}}}]}}\n"
            ),
            "Sidecar/demo/default",
            "spec.ingress[0].connectionPool.http.idleTimeout",
            "",
        );
        assert_rejected(
            &format!(
                "{SC}spec: {{ingress: [{{port: {{number: 9080, protocol: HTTP, name: http}}, tls: {{mode: SIMPLE, credentialName: c}}}}]}}\n"
            ),
            "Sidecar/demo/default",
            "spec.ingress[0].tls",
            "ENABLE_TLS_ON_SIDECAR_INGRESS",
        );
        assert!(
            parse_file(
                "ok.yaml",
                &format!("{SC}spec: {{egress: [{{hosts: [./*, istio-system/*, '*/*.example.com', ~/*]}}], outboundTrafficPolicy: {{mode: REGISTRY_ONLY}}}}\n")
            )
            .is_ok()
        );
    }

    #[test]
    fn kubernetes_object_rules() {
        assert_rejected(
            "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: demo}\nspec: {ports: [{name: http, port: 0}]}\n",
            "Service/demo/s",
            "spec.ports[0].port",
            "0 is not a valid port",
        );
        assert_rejected(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: e, namespace: demo}\naddressType: IPv4\nendpoints: [{addresses: ['fd00::1']}]\n",
            "EndpointSlice/demo/e",
            "endpoints[0].addresses[0]",
            "is not a valid IPv4 address",
        );
    }

    #[test]
    fn every_problem_of_a_file_is_reported_at_once() {
        let yaml = format!(
            "{DR}spec: {{subsets: [{{name: v1}}, {{name: v1}}]}}\n---\n{VS}spec: {{tcp: [{{route: [{{destination: {{host: a}}}}]}}]}}\n"
        );
        let fields: Vec<String> = rejected(&yaml)
            .iter()
            .map(|e| format!("{} {}", e.object().unwrap(), e.field().unwrap()))
            .collect();
        assert_eq!(
            fields,
            vec![
                "DestinationRule/demo/d spec.host",
                "DestinationRule/demo/d spec.subsets[1].name",
                "VirtualService/demo/r spec.tcp",
            ]
        );
    }
}
