//! Gateway validation: Istio's rules (`ValidateGateway`), and a refusal
//! naming the field for every part this istiod does not serve yet
//! (protocols other than HTTP, HTTP2, GRPC and HTTPS, `bind`,
//! `defaultEndpoint`; for `tls` see [`super::gateway_tls`]), so that
//! nothing is accepted and then ignored.

use std::collections::BTreeSet;

use super::{Errors, check_egress_host, check_host, check_port, gateway_tcp, gateway_tls};
use crate::model::gateway::{Gateway, Server};
use crate::model::service::Protocol;

pub(super) fn gateway(gw: &Gateway, e: &mut Errors) {
    if gw.servers.is_empty() {
        e.add("spec.servers", "gateway must have at least one server");
    }
    let mut names = BTreeSet::new();
    for (i, s) in gw.servers.iter().enumerate() {
        let field = format!("spec.servers[{i}]");
        server(&field, s, e);
        if !s.name.is_empty() && !names.insert(s.name.as_str()) {
            e.add(
                format!("{field}.name"),
                format!(
                    "server name {:?} is not unique (give each server its own name)",
                    s.name
                ),
            );
        }
    }
}

fn server(field: &str, s: &Server, e: &mut Errors) {
    match &s.port {
        None => e.add(
            format!("{field}.port"),
            "is required (e.g. {number: 80, name: http, protocol: HTTP})",
        ),
        Some(p) => {
            check_port(&format!("{field}.port.number"), p.number, e);
            if p.name.is_empty() {
                e.add(
                    format!("{field}.port.name"),
                    "is required (name the port, e.g. http)",
                );
            }
            let protocol = Protocol::parse(&p.protocol);
            if p.protocol.is_empty() || protocol == Protocol::Unsupported {
                e.add(
                    format!("{field}.port.protocol"),
                    format!(
                        "invalid protocol {:?} (use HTTP, HTTPS, HTTP2, GRPC, TCP, TLS or MONGO)",
                        p.protocol
                    ),
                );
            } else if !matches!(
                protocol,
                Protocol::Http | Protocol::Http2 | Protocol::Grpc | Protocol::Https
            ) && !gateway_tcp::serves(protocol, s)
            {
                e.add(
                    format!("{field}.port.protocol"),
                    format!("{:?} servers are not supported by this istiod yet (use HTTP, HTTP2, GRPC, HTTPS, TCP or TLS)", p.protocol),
                );
            }
        }
    }
    if s.hosts.is_empty() {
        e.add(
            format!("{field}.hosts"),
            "server config must contain at least one host",
        );
    }
    for (i, host) in s.hosts.iter().enumerate() {
        check_server_host(&format!("{field}.hosts[{i}]"), host, e);
    }
    let protocol = s.port.as_ref().map(|p| Protocol::parse(&p.protocol));
    let tls_field = format!("{field}.tls");
    match protocol {
        // TCP, TLS and HTTPS PASSTHROUGH: forwarded without terminating.
        Some(p) if gateway_tcp::serves(p, s) => {
            if !gateway_tcp::server_tls(field, s, p, e) {
                e.add(
                    tls_field,
                    "terminating TLS on TCP or TLS servers is not supported by this istiod yet (use protocol HTTPS to terminate, or mode PASSTHROUGH to route by SNI)",
                );
            }
        }
        Some(Protocol::Https) => gateway_tls::https_server_tls(&tls_field, s.tls.as_ref(), e),
        _ => {
            if let Some(tls) = &s.tls {
                gateway_tls::plain_server_tls(&tls_field, tls, e);
            }
        }
    }
    if !s.bind.is_empty() {
        e.add(
            format!("{field}.bind"),
            "is not supported by this istiod yet (leave it out: the gateway listens on 0.0.0.0)",
        );
    }
    if !s.default_endpoint.is_empty() {
        e.add(
            format!("{field}.defaultEndpoint"),
            "is not supported by this istiod yet (leave it out)",
        );
    }
}

/// A server host: `host`, `*`, `*.suffix`, or with a namespace part
/// (`ns/host`, `./host`, `*/host`); Istio's
/// `validateNamespaceSlashWildcardHostname`.
fn check_server_host(field: &str, host: &str, e: &mut Errors) {
    if host.contains('/') {
        if let Some(ns) = host.split('/').next()
            && ns == "~"
        {
            e.add(field, format!("{host:?}: ~ is not a namespace for a gateway host (use ., * or a namespace name)"));
            return;
        }
        if let Err(message) = check_egress_host(host) {
            e.add(field, message.to_string());
        }
        return;
    }
    check_host(field, host, e);
}

#[cfg(test)]
mod tests {
    use super::super::test_support;

    const GW: &str = "apiVersion: networking.istio.io/v1beta1\nkind: Gateway\nmetadata: {name: ingress, namespace: istio-system}\n";

    /// The errors for `spec`, as `field: message` strings.
    fn errors(spec: &str) -> Vec<String> {
        test_support::errors("mesh/gw.yaml", GW, spec)
    }

    #[track_caller]
    fn refused(spec: &str, field: &str, needle: &str) {
        test_support::refused(&errors(spec), field, needle);
    }

    #[test]
    fn http_servers_with_istio_host_forms_are_accepted() {
        for hosts in [
            "['*']",
            "[httpbin.example.com]",
            "['*.example.com']",
            "[demo/httpbin.example.com]",
            "['./*']",
            "['*/httpbin.example.com']",
        ] {
            let spec = format!(
                "{{selector: {{istio: ingressgateway}}, servers: [{{port: {{number: 8080, name: http, protocol: HTTP}}, hosts: {hosts}}}]}}"
            );
            assert!(errors(&spec).is_empty(), "{hosts}: {:?}", errors(&spec));
        }
        assert!(errors("{servers: [{port: {number: 80, name: h2, protocol: HTTP2}, hosts: ['*'], name: a}, {port: {number: 81, name: grpc, protocol: grpc}, hosts: ['*'], name: b}]}").is_empty());
    }

    #[test]
    fn what_is_not_served_yet_is_refused_by_field() {
        refused(
            "{servers: [{port: {number: 443, name: https, protocol: HTTPS}, hosts: ['*']}]}",
            "spec.servers[0].tls",
            "must have TLS settings",
        );
        {
            refused(
                "{servers: [{port: {number: 1, name: p, protocol: MONGO}, hosts: ['*']}]}",
                "spec.servers[0].port.protocol",
                "not supported",
            );
        }
        refused(
            "{servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*'], bind: 10.0.0.1}]}",
            "spec.servers[0].bind",
            "not supported",
        );
        refused(
            "{servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*'], defaultEndpoint: '127.0.0.1:80'}]}",
            "spec.servers[0].defaultEndpoint",
            "not supported",
        );
    }

    #[test]
    fn istio_rules_apply() {
        refused("{servers: []}", "spec.servers", "at least one server");
        refused(
            "{servers: [{port: {number: 80, name: http, protocol: HTTP}}]}",
            "spec.servers[0].hosts",
            "at least one host",
        );
        refused(
            "{servers: [{hosts: ['*']}]}",
            "spec.servers[0].port",
            "is required",
        );
        refused(
            "{servers: [{port: {number: 80, name: http, protocol: BOGUS}, hosts: ['*']}]}",
            "spec.servers[0].port.protocol",
            "invalid protocol",
        );
        refused(
            "{servers: [{port: {number: 0, name: http, protocol: HTTP}, hosts: ['*']}]}",
            "spec.servers[0].port.number",
            "not a valid port",
        );
        refused(
            "{servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['a/b/c']}]}",
            "spec.servers[0].hosts[0]",
            "",
        );
        refused(
            "{servers: [{port: {number: 80, name: a, protocol: HTTP}, hosts: ['*'], name: s}, {port: {number: 81, name: b, protocol: HTTP}, hosts: ['*'], name: s}]}",
            "spec.servers[1].name",
            "not unique",
        );
    }
}
