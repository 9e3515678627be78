//! The Gateways of a router proxy, merged by port as Istio's
//! `MergedGateway` does (`pilot/pkg/model/gateway.go`): the Gateways whose
//! `selector` matches the proxy's labels, in any namespace (Istio's default,
//! `PILOT_SCOPE_GATEWAY_TO_NAMESPACE=false`), with their servers grouped by
//! port, and which VirtualServices bind to them.

use std::collections::BTreeMap;

use super::Proxy;
use super::context::{IstioContext, Named};
use crate::model::gateway::{Gateway, Server, split_host};
use crate::model::istio::VirtualService;

/// One server of one Gateway.
#[derive(Debug, Clone, Copy)]
pub struct BoundServer<'a> {
    /// The Gateway.
    pub gateway: &'a Named<Gateway>,
    /// Its server.
    pub server: &'a Server,
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

/// The servers of the proxy's Gateways by port: servers of several
/// Gateways on one port share its listener and route configuration.
pub fn servers_by_port<'a>(
    ctx: &'a IstioContext,
    proxy: &Proxy,
) -> BTreeMap<u16, Vec<BoundServer<'a>>> {
    let mut out: BTreeMap<u16, Vec<BoundServer<'a>>> = BTreeMap::new();
    for gateway in gateways_for(ctx, proxy) {
        for server in &gateway.spec.servers {
            let port = server.port_number();
            if port != 0 {
                out.entry(port)
                    .or_default()
                    .push(BoundServer { gateway, server });
            }
        }
    }
    out
}

/// Whether a VirtualService of `vs_ns` binds to the Gateway `gw_ns/gw_name`
/// through `gateways:` (`<name>` is in the VirtualService's namespace).
pub fn binds(vs: &VirtualService, vs_ns: &str, gw_ns: &str, gw_name: &str) -> bool {
    vs.gateways.iter().any(|g| match g.split_once('/') {
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
    use super::*;

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
}
