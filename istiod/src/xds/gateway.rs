//! The Gateways of a router proxy, merged by port as Istio's
//! `MergedGateway` does (`pilot/pkg/model/gateway.go`): the Gateways whose
//! `selector` matches the proxy's labels, in any namespace (Istio's default,
//! `PILOT_SCOPE_GATEWAY_TO_NAMESPACE=false`), with their servers grouped by
//! port, and which VirtualServices bind to them.

use std::collections::BTreeMap;

use crate::model::gateway::{Gateway, Server, ServerTlsMode, split_host};
use crate::model::istio::VirtualService;
use crate::model::service::Protocol;
use crate::pushctx::Proxy;
use crate::pushctx::context::IstioContext;
use crate::pushctx::named::Named;

/// One server of one Gateway.
#[derive(Debug, Clone, Copy)]
pub struct BoundServer<'a> {
    /// The Gateway.
    pub gateway: &'a Named<Gateway>,
    /// Its server.
    pub server: &'a Server,
    /// The port the gateway listens on for it: the server's port, or the
    /// target port of the gateway's Service port of that number.
    pub port: u16,
}

/// The Gateways that select `proxy` (empty for proxies that are no router).
/// An empty selector selects every gateway workload, as in Istio.
pub fn gateways_for<'a>(ctx: &'a IstioContext, proxy: &Proxy) -> Vec<&'a Named<Gateway>> {
    if proxy.proxy_type != common::ProxyType::Router {
        return Vec::new();
    }
    ctx.gateways
        .iter()
        .filter(|g| {
            g.spec
                .selector
                .iter()
                .all(|(k, v)| proxy.labels.get(k) == Some(v))
        })
        .collect()
}

impl BoundServer<'_> {
    /// Whether the server terminates TLS and serves HTTP: an `HTTPS` server
    /// that is not PASSTHROUGH (Istio's `IsHTTPServer` for HTTPS).
    pub fn is_https(&self) -> bool {
        terminates_tls(self.server)
    }

    /// Whether the server serves HTTP (Istio's `IsHTTPServer`): a plain
    /// HTTP, HTTP2 or GRPC server, or one that terminates TLS.
    pub fn is_http(&self) -> bool {
        protocol(self.server).is_http() || self.is_https()
    }

    /// Istio's `gatewayRDSRouteName`: `http.<port>` for plain HTTP servers
    /// (shared by every such server on the port),
    /// `https.<port>.<portName>.<gateway>.<namespace>` for HTTPS servers.
    pub fn route_name(&self) -> String {
        let port = self.port;
        if self.is_https() {
            let port_name = self.server.port.as_ref().map_or("", |p| p.name.as_str());
            format!(
                "https.{port}.{port_name}.{}.{}",
                self.gateway.name, self.gateway.namespace
            )
        } else {
            route_name(port)
        }
    }
}

/// Whether a server terminates TLS: `HTTPS`, not PASSTHROUGH.
pub fn terminates_tls(server: &Server) -> bool {
    protocol(server) == Protocol::Https
        && !server.tls.as_ref().is_some_and(|t| {
            matches!(
                t.mode,
                ServerTlsMode::Passthrough | ServerTlsMode::AutoPassthrough
            )
        })
}

/// Istio's `IsTLSServer`: TLS settings on a server that is not plain HTTP
/// (terminating or forwarding by SNI).
pub fn is_tls_server(server: &Server) -> bool {
    server.tls.is_some() && !protocol(server).is_http()
}

fn protocol(server: &Server) -> Protocol {
    server
        .port
        .as_ref()
        .map_or(Protocol::Unsupported, |p| Protocol::parse(&p.protocol))
}

/// The servers of the proxy's Gateways by port: servers of several
/// Gateways on one port share its listener (and, for plain HTTP, its route
/// configuration). As in Istio's `MergedGateway`, a port is either plain
/// text or TLS: the first server on it decides, and a server of the other
/// kind is left out (with a warning).
pub fn servers_by_port<'a>(
    ctx: &'a IstioContext,
    proxy: &Proxy,
) -> BTreeMap<u16, Vec<BoundServer<'a>>> {
    let mut out: BTreeMap<u16, Vec<BoundServer<'a>>> = BTreeMap::new();
    let gateways = gateways_for(ctx, proxy);
    let targets: Vec<(u16, u16)> = if gateways.is_empty() {
        Vec::new()
    } else {
        ctx.inbound_for(proxy)
            .into_iter()
            .map(|(_, service_port, target)| (service_port, target))
            .collect()
    };
    for gateway in gateways {
        for server in &gateway.spec.servers {
            let port = listen_port(server.port_number(), &targets);
            if port == 0 {
                continue;
            }
            let list = out.entry(port).or_default();
            let bound = BoundServer {
                gateway,
                server,
                port,
            };
            if let Some(first) = list.first()
                && conflicts(first.server, server)
            {
                let kind = |s: &Server| {
                    if is_tls_server(s) {
                        "TLS".to_string()
                    } else {
                        format!("plain text {}", protocol(s).as_str())
                    }
                };
                tracing::warn!(
                    target: "model",
                    "gateway {}/{}: a {} server on port {port} conflicts with the {} server of {}/{} there: skipped",
                    gateway.namespace,
                    gateway.name,
                    kind(server),
                    kind(first.server),
                    first.gateway.namespace,
                    first.gateway.name,
                );
                continue;
            }
            if is_tls_server(server)
                && let Some(first) = list
                    .iter()
                    .find(|b| is_tls_server(b.server) && sni_hosts(b.server) == sni_hosts(server))
            {
                // Envoy refuses two chains with the same match: the first wins.
                tracing::warn!(
                    target: "model",
                    "gateway {}/{}: a TLS server on port {port} with the SNI hosts of a server of {}/{}: skipped",
                    gateway.namespace,
                    gateway.name,
                    first.gateway.namespace,
                    first.gateway.name,
                );
                continue;
            }
            list.push(bound);
        }
    }
    out
}

/// The port a gateway listens on for a server port, as Istio's
/// `resolvePorts` for Gateways that select their workload by labels: the
/// target port of the first Service port of that number among the Services
/// that select the gateway's Pod (Istio's ingress gateway Service maps 80 to
/// 8080 and 443 to 8443, so that Envoy need not bind privileged ports), else
/// the server's port itself.
fn listen_port(server_port: u16, targets: &[(u16, u16)]) -> u16 {
    targets
        .iter()
        .find(|(service_port, target)| *service_port == server_port && *target != 0)
        .map_or(server_port, |(_, target)| *target)
}

/// Istio's merge rule for a second server on a port: plain text servers
/// merge only when both are HTTP of the same protocol; TLS servers merge
/// with TLS servers (told apart by SNI); plain text and TLS do not.
fn conflicts(first: &Server, next: &Server) -> bool {
    match (is_tls_server(first), is_tls_server(next)) {
        (false, false) => {
            let (a, b) = (protocol(first), protocol(next));
            a != b || !a.is_http()
        }
        (true, true) => false,
        _ => true,
    }
}

/// Istio's `getSNIHostsForServer`: the host parts, sorted and unique; none
/// when one is `*` (the chain then matches any SNI, and none).
pub fn sni_hosts(server: &Server) -> Vec<String> {
    let hosts: std::collections::BTreeSet<&str> =
        server.hosts.iter().map(|h| split_host(h).1).collect();
    if hosts.contains("*") {
        Vec::new()
    } else {
        hosts.into_iter().map(String::from).collect()
    }
}

/// The servers whose route configuration is `name` (`http.<port>` or
/// `https.<port>...`, the port being the one listened on), and their
/// Gateway port.
pub fn servers_for_route<'a>(
    ctx: &'a IstioContext,
    proxy: &Proxy,
    name: &str,
) -> Option<(u16, Vec<BoundServer<'a>>)> {
    let port: u16 = name.split('.').nth(1)?.parse().ok()?;
    let servers: Vec<BoundServer<'a>> = servers_by_port(ctx, proxy)
        .remove(&port)?
        .into_iter()
        .filter(|b| b.route_name() == name)
        .collect();
    // Routes match on the Gateway's own port number (`match.port`), not on
    // the target port the gateway listens on.
    let server_port = servers.first()?.server.port_number();
    Some((server_port, servers))
}

/// Whether a VirtualService of `vs_ns` binds to the Gateway `gw_ns/gw_name`
/// through `gateways:` (`<name>` is in the VirtualService's namespace).
pub fn binds(vs: &VirtualService, vs_ns: &str, gw_ns: &str, gw_name: &str) -> bool {
    names_gateway(&vs.gateways, vs_ns, gw_ns, gw_name)
}

/// Whether a list of gateway references of a VirtualService of `vs_ns`
/// (its `gateways:`, or a match's) names the Gateway `gw_ns/gw_name`.
pub fn names_gateway(gateways: &[String], vs_ns: &str, gw_ns: &str, gw_name: &str) -> bool {
    gateways.iter().any(|g| match g.split_once('/') {
        Some((ns, name)) => ns == gw_ns && name == gw_name,
        None => g != "mesh" && vs_ns == gw_ns && g == gw_name,
    })
}

/// Whether a server host's namespace part admits a VirtualService of
/// `vs_ns` (`.` is the Gateway's namespace, `*` any), and its host part.
pub fn server_host_for<'s>(host: &'s str, vs_ns: &str, gw_ns: &str) -> Option<&'s str> {
    let (ns, name) = split_host(host);
    let admits = match ns {
        "*" => true,
        "." => vs_ns == gw_ns,
        ns => vs_ns == ns,
    };
    admits.then_some(name)
}

/// Istio's host intersection of a VirtualService host and a server host:
/// the more specific of the two when one matches the other.
pub fn intersect(vs_host: &str, server_host: &str) -> Option<String> {
    use crate::model::service::host_matches;
    if host_matches(server_host, vs_host) {
        Some(vs_host.to_string())
    } else if host_matches(vs_host, server_host) {
        Some(server_host.to_string())
    } else {
        None
    }
}

/// Istio's gateway route configuration name for an HTTP port.
pub fn route_name(port: u16) -> String {
    format!("http.{port}")
}

/// Istio's gateway listener name for a port.
pub fn listener_name(port: u16) -> String {
    format!("0.0.0.0_{port}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeSet;

    use prost::Message;
    use proto::pb::envoy::config::listener::v3::Listener;
    use proto::pb::envoy::config::route::v3::{RouteConfiguration, route};

    use super::*;

    const CONFIG: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: httpbin, namespace: demo}
spec:
  clusterIP: 198.19.0.10
  selector: {app: httpbin}
  ports: [{name: http, port: 8000, targetPort: 8080}]
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: other, namespace: demo}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["./echo.example.com"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: in, namespace: demo}
spec:
  hosts: [httpbin]
  gateways: [istio-system/ingress]
  http:
  - route:
    - destination: {host: httpbin}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: demo}
spec:
  hosts: [echo.example.com]
  gateways: [other, mesh]
  http:
  - route:
    - destination: {host: httpbin}
"#;

    fn context() -> IstioContext {
        crate::pushctx::context::context_of_yaml(CONFIG)
    }

    fn proxy(proxy_type: common::ProxyType, labels: &[(&str, &str)]) -> Proxy {
        Proxy {
            proxy_type,
            ip: "198.18.0.20".into(),
            ips: vec!["198.18.0.20".into()],
            namespace: "istio-system".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn listener_names(ctx: &IstioContext, p: &Proxy) -> Vec<String> {
        crate::xds::lds::build(ctx, p)
            .iter()
            .map(|r| Listener::decode(r.resource.value.as_slice()).unwrap().name)
            .collect()
    }

    #[test]
    fn a_router_gets_one_listener_per_port_and_merged_virtual_hosts() {
        let ctx = context();
        let router = proxy(common::ProxyType::Router, &[("istio", "ingressgateway")]);
        assert_eq!(listener_names(&ctx, &router), ["0.0.0.0_8080"]);
        let names = crate::xds::lds::route_names(&ctx, &router);
        assert_eq!(names, BTreeSet::from(["http.8080".to_string()]));
        let r = crate::xds::rds::build(&ctx, &router, &names).remove(0);
        let rc = RouteConfiguration::decode(r.resource.value.as_slice()).unwrap();
        assert_eq!(rc.name, "http.8080");
        let hosts: Vec<(&str, &[String])> = rc
            .virtual_hosts
            .iter()
            .map(|v| (v.name.as_str(), v.domains.as_slice()))
            .collect();
        assert_eq!(
            hosts,
            [
                (
                    "echo.example.com:8080",
                    &["echo.example.com".to_string()][..]
                ),
                (
                    "httpbin.demo.svc.cluster.local:8080",
                    &["httpbin.demo.svc.cluster.local".to_string()][..]
                ),
            ]
        );
        let Some(route::Action::Route(action)) = &rc.virtual_hosts[1].routes[0].action else {
            panic!("{rc:#?}");
        };
        assert_eq!(
            action.cluster_specifier,
            Some(
                proto::pb::envoy::config::route::v3::route_action::ClusterSpecifier::Cluster(
                    "outbound|8000||httpbin.demo.svc.cluster.local".into()
                )
            )
        );
    }

    #[test]
    fn a_server_port_of_the_gateway_service_listens_on_its_target_port() {
        // Istio's ingress gateway Service: 80 -> 8080, selecting the Pod
        // (its EndpointSlice holds the router's address).
        let extra = r#"
apiVersion: v1
kind: Service
metadata: {name: istio-ingressgateway, namespace: istio-system}
spec:
  clusterIP: 198.19.0.20
  selector: {istio: ingressgateway}
  ports: [{name: http2, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: istio-ingressgateway-1
  namespace: istio-system
  labels: {kubernetes.io/service-name: istio-ingressgateway}
addressType: IPv4
ports: [{name: http2, port: 8080}]
endpoints: [{addresses: [198.18.0.20]}]
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: public, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: ["*"]
  - port: {number: 9090, name: other, protocol: HTTP}
    hosts: ["*"]
"#;
        let ctx = crate::pushctx::context::context_of_yaml(&format!("{CONFIG}---\n{extra}"));
        let router = proxy(common::ProxyType::Router, &[("istio", "ingressgateway")]);
        // Port 80 merges into 8080 with the server already there; 9090 is
        // no Service port and is bound as written.
        assert_eq!(
            listener_names(&ctx, &router),
            ["0.0.0.0_8080", "0.0.0.0_9090"]
        );
        let names = crate::xds::lds::route_names(&ctx, &router);
        assert_eq!(
            names,
            BTreeSet::from(["http.8080".to_string(), "http.9090".to_string()])
        );
    }

    #[test]
    fn sidecars_and_unselected_routers_get_no_gateway_listener() {
        let ctx = context();
        let other = proxy(common::ProxyType::Router, &[("istio", "egressgateway")]);
        assert!(listener_names(&ctx, &other).is_empty());
        let sidecar = proxy(common::ProxyType::Sidecar, &[("istio", "ingressgateway")]);
        assert!(!listener_names(&ctx, &sidecar).contains(&"0.0.0.0_8080".to_string()));
        // The VirtualService bound only to the gateway is not the sidecars'.
        assert!(
            ctx.virtual_services_for("demo", "httpbin.demo.svc.cluster.local")
                .is_empty()
        );
        assert_eq!(
            ctx.virtual_services_for("demo", "echo.example.com").len(),
            1
        );
    }

    #[test]
    fn a_port_no_virtual_service_reaches_answers_404() {
        let mut ctx = context();
        ctx.virtual_services.clear();
        let router = proxy(common::ProxyType::Router, &[("istio", "ingressgateway")]);
        let names = BTreeSet::from(["http.8080".to_string()]);
        let r = crate::xds::rds::build(&ctx, &router, &names).remove(0);
        let rc = RouteConfiguration::decode(r.resource.value.as_slice()).unwrap();
        assert_eq!(rc.virtual_hosts.len(), 1);
        assert_eq!(rc.virtual_hosts[0].name, "blackhole:8080");
        assert!(matches!(
            &rc.virtual_hosts[0].routes[0].action,
            Some(route::Action::DirectResponse(d)) if d.status == 404
        ));
    }

    #[test]
    fn hosts_intersect_to_the_more_specific() {
        assert_eq!(
            intersect("a.example.com", "*").as_deref(),
            Some("a.example.com")
        );
        assert_eq!(
            intersect("*", "*.example.com").as_deref(),
            Some("*.example.com")
        );
        assert_eq!(
            intersect("a.example.com", "*.example.com").as_deref(),
            Some("a.example.com")
        );
        assert_eq!(intersect("a.example.com", "b.example.com"), None);
    }

    #[test]
    fn server_host_namespaces_admit_virtual_services() {
        assert_eq!(server_host_for("*", "demo", "gw"), Some("*"));
        assert_eq!(server_host_for("*/a.com", "demo", "gw"), Some("a.com"));
        assert_eq!(server_host_for("./a.com", "demo", "gw"), None);
        assert_eq!(server_host_for("./a.com", "gw", "gw"), Some("a.com"));
        assert_eq!(server_host_for("demo/a.com", "demo", "gw"), Some("a.com"));
        assert_eq!(server_host_for("other/a.com", "demo", "gw"), None);
    }

    #[test]
    fn gateways_are_named_from_the_virtual_service_namespace() {
        let vs = VirtualService {
            gateways: vec!["ingress".into(), "istio-system/main".into(), "mesh".into()],
            ..Default::default()
        };
        assert!(binds(&vs, "demo", "demo", "ingress"));
        assert!(!binds(&vs, "demo", "istio-system", "ingress"));
        assert!(binds(&vs, "demo", "istio-system", "main"));
        assert!(!binds(&vs, "demo", "demo", "mesh"));
    }

    const EGRESS_TASK: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: istio-egressgateway, namespace: istio-system}
spec:
  clusterIP: 198.19.0.30
  selector: {istio: egressgateway}
  ports: [{name: http, port: 80}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: cnn, namespace: demo}
spec:
  hosts: [edition.cnn.com]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: DNS
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: istio-egressgateway, namespace: demo}
spec:
  selector: {istio: egressgateway}
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: [edition.cnn.com]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: direct-cnn-through-egress-gateway, namespace: demo}
spec:
  hosts: [edition.cnn.com]
  gateways: [istio-egressgateway, mesh]
  http:
  - match: [{gateways: [mesh], port: 80}]
    route:
    - destination: {host: istio-egressgateway.istio-system.svc.cluster.local, port: {number: 80}}
  - match: [{gateways: [istio-egressgateway], port: 80}]
    route:
    - destination: {host: edition.cnn.com, port: {number: 80}}
"#;

    #[test]
    fn match_gateways_pick_the_routes_of_a_gateway_as_in_istios_egress_task() {
        let ctx = crate::pushctx::context::context_of_yaml(EGRESS_TASK);
        let router = proxy(common::ProxyType::Router, &[("istio", "egressgateway")]);
        let names = BTreeSet::from(["http.80".to_string()]);
        let r = crate::xds::rds::build(&ctx, &router, &names).remove(0);
        let rc = RouteConfiguration::decode(r.resource.value.as_slice()).unwrap();
        assert_eq!(rc.virtual_hosts.len(), 1, "{rc:#?}");
        let routes = &rc.virtual_hosts[0].routes;
        assert_eq!(routes.len(), 1, "only the egress gateway's match: {rc:#?}");
        let Some(route::Action::Route(action)) = &routes[0].action else {
            panic!("{rc:#?}");
        };
        assert_eq!(
            action.cluster_specifier,
            Some(
                proto::pb::envoy::config::route::v3::route_action::ClusterSpecifier::Cluster(
                    "outbound|80||edition.cnn.com".into()
                )
            )
        );
    }
}
