//! Validation of a VirtualService's `tcp` and `tls` routes, as Istio's
//! `validateTCPRoute` and `validateTLSRoute` (a TLS route needs matches,
//! each with SNI hosts within the VirtualService's hosts; every route needs
//! destinations). They are applied on gateways and on sidecars (`mesh`).
//! The match fields only sidecars apply (`sourceLabels`, `sourceNamespace`,
//! `destinationSubnets`; Istio ignores them on gateways) are refused on a
//! match that can only apply to gateways, rather than accepted and ignored.

use super::super::istio::{Destination, L4MatchAttributes, TlsMatchAttributes, VirtualService};
use super::route_refs::{destinations, gateway};
use super::{Errors, check_port, is_dns1123_label};
use crate::model::security::attributes::parse_cidr;
use crate::model::service::host_matches;

pub(super) fn l4_routes(vs: &VirtualService, mesh_bound: bool, e: &mut Errors) {
    for (i, r) in vs.tcp.iter().enumerate() {
        let field = format!("spec.tcp[{i}]");
        for (j, m) in r.r#match.iter().enumerate() {
            l4_match(&format!("{field}.match[{j}]"), &l4_of_tcp(m), mesh_bound, e);
        }
        route(&field, "TCP", &r.route, e);
    }
    for (i, r) in vs.tls.iter().enumerate() {
        let field = format!("spec.tls[{i}]");
        if r.r#match.is_empty() {
            e.add(
                format!("{field}.match"),
                "TLS route must have at least one match condition (match the SNI hosts, e.g. match: [{sniHosts: [a.example.com]}])",
            );
        }
        for (j, m) in r.r#match.iter().enumerate() {
            let mf = format!("{field}.match[{j}]");
            tls_match(&mf, m, vs, e);
            l4_match(&mf, &l4_of_tls(m), mesh_bound, e);
        }
        route(&field, "TLS", &r.route, e);
    }
}

/// A TLS match's SNI hosts (Istio's `validateSniHost`).
fn tls_match(field: &str, m: &TlsMatchAttributes, vs: &VirtualService, e: &mut Errors) {
    if m.sni_hosts.is_empty() {
        e.add(
            format!("{field}.sniHosts"),
            "TLS match must have at least one SNI host",
        );
    }
    for (k, sni) in m.sni_hosts.iter().enumerate() {
        let sf = format!("{field}.sniHosts[{k}]");
        if sni.parse::<std::net::IpAddr>().is_ok() {
            continue;
        }
        let len = e.0.len();
        super::check_host(&sf, sni, e);
        if e.0.len() == len && !vs.hosts.iter().any(|h| host_matches(h, sni)) {
            e.add(
                sf,
                format!(
                    "SNI host {sni:?} is not a compatible subset of any of the virtual service hosts: [{}]",
                    vs.hosts.join(", ")
                ),
            );
        }
    }
}

/// The match fields TCP and TLS matches share.
struct L4<'a> {
    port: Option<u32>,
    gateways: &'a [String],
    source_labels: bool,
    source_namespace: &'a str,
    destination_subnets: &'a [String],
}

fn l4_of_tcp(m: &L4MatchAttributes) -> L4<'_> {
    L4 {
        port: m.port,
        gateways: &m.gateways,
        source_labels: !m.source_labels.is_empty(),
        source_namespace: &m.source_namespace,
        destination_subnets: &m.destination_subnets,
    }
}

fn l4_of_tls(m: &TlsMatchAttributes) -> L4<'_> {
    L4 {
        port: m.port,
        gateways: &m.gateways,
        source_labels: !m.source_labels.is_empty(),
        source_namespace: &m.source_namespace,
        destination_subnets: &m.destination_subnets,
    }
}

fn l4_match(field: &str, m: &L4<'_>, mesh_bound: bool, e: &mut Errors) {
    if let Some(p) = m.port {
        check_port(&format!("{field}.port"), p, e);
    }
    for (k, gw) in m.gateways.iter().enumerate() {
        gateway(&format!("{field}.gateways[{k}]"), gw, e);
    }
    if !m.source_namespace.is_empty() && !is_dns1123_label(m.source_namespace) {
        e.add(
            format!("{field}.sourceNamespace"),
            format!("{:?} is not a namespace name", m.source_namespace),
        );
    }
    for (k, subnet) in m.destination_subnets.iter().enumerate() {
        if parse_cidr(subnet).is_none() {
            e.add(
                format!("{field}.destinationSubnets[{k}]"),
                format!("{subnet:?} is not an IP address or CIDR (e.g. 10.0.0.0/8)"),
            );
        }
    }
    // The match applies to sidecars when it names mesh, or names no
    // gateway in a VirtualService bound to mesh.
    let for_mesh = if m.gateways.is_empty() {
        mesh_bound
    } else {
        m.gateways.iter().any(|g| g == "mesh")
    };
    if for_mesh {
        return;
    }
    for (name, set) in [
        ("sourceLabels", m.source_labels),
        ("sourceNamespace", !m.source_namespace.is_empty()),
        ("destinationSubnets", !m.destination_subnets.is_empty()),
    ] {
        if set {
            e.add(
                format!("{field}.{name}"),
                "is not applied on gateways (Istio ignores it there; it applies to sidecars): bind the match to mesh, or remove it",
            );
        }
    }
}

fn route(field: &str, kind: &str, route: &[super::super::istio::RouteDestination], e: &mut Errors) {
    if route.is_empty() {
        e.add(
            format!("{field}.route"),
            format!("{kind} route is required (add a destination)"),
        );
    }
    let dests: Vec<(&Destination, Option<i32>)> =
        route.iter().map(|d| (&d.destination, d.weight)).collect();
    destinations(&format!("{field}.route"), &dests, e);
}

#[cfg(test)]
mod tests {
    use super::super::test_support;

    const VS: &str = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r, namespace: demo}\n";

    fn errors(spec: &str) -> Vec<String> {
        test_support::errors("mesh/vs.yaml", VS, spec)
    }

    #[track_caller]
    fn refused(spec: &str, field: &str, needle: &str) {
        test_support::refused(&errors(spec), field, needle);
    }

    #[test]
    fn gateway_bound_tcp_and_tls_routes_are_accepted() {
        for spec in [
            "{hosts: ['*'], gateways: [istio-system/gw], tcp: [{match: [{port: 31400}], route: [{destination: {host: echo, port: {number: 9000}}}]}]}",
            "{hosts: ['*.example.com'], gateways: [gw], tls: [{match: [{sniHosts: [a.example.com], port: 443, gateways: [gw]}], route: [{destination: {host: a.example.com}}]}]}",
            "{hosts: [a.example.com], gateways: [gw], tcp: [{route: [{destination: {host: a}, weight: 60}, {destination: {host: b}, weight: 40}]}]}",
        ] {
            assert!(errors(spec).is_empty(), "{spec}: {:?}", errors(spec));
        }
    }

    #[test]
    fn mesh_routes_are_accepted_with_the_fields_sidecars_apply() {
        for spec in [
            "{hosts: [a], tcp: [{match: [{port: 9000, sourceLabels: {app: x}, sourceNamespace: demo}], route: [{destination: {host: b}, weight: 80}, {destination: {host: c}, weight: 20}]}]}",
            "{hosts: [a.com], gateways: [gw, mesh], tls: [{match: [{sniHosts: [a.com], destinationSubnets: [10.0.0.0/8, 10.1.2.3]}], route: [{destination: {host: b}}]}]}",
            "{hosts: [a.com], gateways: [gw], tls: [{match: [{sniHosts: [a.com], gateways: [mesh], sourceLabels: {app: x}}], route: [{destination: {host: b}}]}]}",
        ] {
            assert!(errors(spec).is_empty(), "{spec}: {:?}", errors(spec));
        }
    }

    #[test]
    fn sidecar_only_fields_on_gateway_matches_are_refused_by_field() {
        refused(
            "{hosts: [a], gateways: [gw], tcp: [{match: [{sourceLabels: {app: x}}], route: [{destination: {host: b}}]}]}",
            "spec.tcp[0].match[0].sourceLabels",
            "not applied on gateways",
        );
        refused(
            "{hosts: [a.com], gateways: [gw], tls: [{match: [{sniHosts: [a.com], destinationSubnets: [10.0.0.0/8]}], route: [{destination: {host: b}}]}]}",
            "spec.tls[0].match[0].destinationSubnets",
            "not applied on gateways",
        );
        refused(
            "{hosts: [a], gateways: [gw, mesh], tcp: [{match: [{gateways: [gw], sourceNamespace: demo}], route: [{destination: {host: b}}]}]}",
            "spec.tcp[0].match[0].sourceNamespace",
            "not applied on gateways",
        );
        refused(
            "{hosts: [a], tcp: [{match: [{destinationSubnets: [10.0.0.0/40]}], route: [{destination: {host: b}}]}]}",
            "spec.tcp[0].match[0].destinationSubnets[0]",
            "not an IP address or CIDR",
        );
    }

    #[test]
    fn istio_rules_apply() {
        refused(
            "{hosts: [a.com], gateways: [gw], tls: [{route: [{destination: {host: b}}]}]}",
            "spec.tls[0].match",
            "at least one match",
        );
        refused(
            "{hosts: [a.com], gateways: [gw], tls: [{match: [{port: 443}], route: [{destination: {host: b}}]}]}",
            "spec.tls[0].match[0].sniHosts",
            "at least one SNI host",
        );
        refused(
            "{hosts: ['*.example.com'], gateways: [gw], tls: [{match: [{sniHosts: [b.other.com]}], route: [{destination: {host: b}}]}]}",
            "spec.tls[0].match[0].sniHosts[0]",
            "not a compatible subset",
        );
        refused(
            "{hosts: [a.com], gateways: [gw], tls: [{match: [{sniHosts: [a.com]}]}]}",
            "spec.tls[0].route",
            "TLS route is required",
        );
        refused(
            "{hosts: [a.com], gateways: [gw], tcp: [{match: [{port: 0}], route: []}]}",
            "spec.tcp[0].route",
            "TCP route is required",
        );
        refused(
            "{hosts: [a.com], gateways: [gw], tcp: [{route: [{destination: {host: a}, weight: 60}, {destination: {host: b}, weight: 60}]}]}",
            "spec.tcp[0].route[1].weight",
            "add up to 120",
        );
        refused(
            "{hosts: [a.com], gateways: [gw], tcp: [{match: [{gateways: ['a/b/c']}], route: [{destination: {host: b}}]}]}",
            "spec.tcp[0].match[0].gateways[0]",
            "not a gateway reference",
        );
    }
}
