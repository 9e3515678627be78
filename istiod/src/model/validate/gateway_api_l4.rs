//! Gateway API validation of TLS listeners, `ReferenceGrant`, `TCPRoute`
//! and `TLSRoute`: the rules of the CRDs' schemas and CEL that a file
//! bypasses (the API server applies them for the Kubernetes source), and a
//! refusal naming the field for what this istiod does not translate.

use super::{Errors, check_port, is_dns1123_subdomain};
use crate::model::gateway_api::tls_types::{
    BackendRef, GatewayTls, L4RouteRule, TcpRoute, TlsRoute,
};
use crate::model::gateway_api::{Listener, ParentReference, reference_grant::ReferenceGrant};

const NOT_YET: &str = "is not implemented by this istiod yet (remove it)";

/// A listener's protocol and `tls` (the CRD's CEL rules).
pub(super) fn listener_tls(field: &str, l: &Listener, e: &mut Errors) {
    match l.protocol.as_str() {
        "HTTP" | "HTTPS" | "TLS" | "TCP" => {}
        "UDP" => e.add(
            format!("{field}.protocol"),
            "UDP listeners are not implemented by this istiod (Istio does not serve them either; use TCP)",
        ),
        other => e.add(
            format!("{field}.protocol"),
            format!("unknown protocol {other:?} (use HTTP, HTTPS, TLS or TCP)"),
        ),
    }
    let needs_tls = matches!(l.protocol.as_str(), "HTTPS" | "TLS");
    match (&l.tls, needs_tls) {
        (None, true) => e.add(
            format!("{field}.tls"),
            format!(
                "is required for protocol {} (mode Terminate with certificateRefs, or Passthrough)",
                l.protocol
            ),
        ),
        (Some(_), false) => e.add(
            format!("{field}.tls"),
            format!("must not be set for protocol {} (remove it)", l.protocol),
        ),
        _ => {}
    }
    if l.protocol == "TCP" && l.hostname.is_some() {
        e.add(
            format!("{field}.hostname"),
            "must not be set for protocol TCP (TCP has no host to match)",
        );
    }
    let Some(tls) = &l.tls else { return };
    let tf = format!("{field}.tls");
    match tls.mode.as_deref().unwrap_or("Terminate") {
        "Terminate" => {
            if tls.certificate_refs.is_empty()
                && !tls
                    .options
                    .contains_key(crate::model::gateway_api::listener_tls::TERMINATE_MODE_OPTION)
            {
                e.add(
                    format!("{tf}.certificateRefs"),
                    "is required when mode is Terminate (name the Secret with the certificate)",
                );
            }
        }
        "Passthrough" => {
            if l.protocol == "HTTPS" {
                e.add(
                    format!("{tf}.mode"),
                    "an HTTPS listener terminates TLS (use protocol TLS for Passthrough)",
                );
            }
            if !tls.certificate_refs.is_empty() {
                e.add(
                    format!("{tf}.certificateRefs"),
                    "must be empty when mode is Passthrough (the backend presents its own certificate)",
                );
            }
        }
        other => e.add(
            format!("{tf}.mode"),
            format!("unknown mode {other:?} (use Terminate or Passthrough)"),
        ),
    }
    for (k, v) in &tls.options {
        use crate::model::gateway_api::listener_tls::{
            CIPHER_SUITES_OPTION, TERMINATE_MODE_OPTION,
        };
        match k.as_str() {
            TERMINATE_MODE_OPTION => {
                if !matches!(v.as_str(), "SIMPLE" | "MUTUAL" | "OPTIONAL_MUTUAL" | "ISTIO_MUTUAL") {
                    e.add(
                        format!("{tf}.options[{k}]"),
                        format!("unknown mode {v:?} (use SIMPLE, MUTUAL, OPTIONAL_MUTUAL or ISTIO_MUTUAL)"),
                    );
                }
            }
            CIPHER_SUITES_OPTION => {}
            _ => e.add(
                format!("{tf}.options[{k}]"),
                format!("is not an option Istio reads (use {TERMINATE_MODE_OPTION} or {CIPHER_SUITES_OPTION})"),
            ),
        }
    }
}

/// A Gateway's `spec.tls`.
pub(super) fn gateway_tls(tls: &GatewayTls, e: &mut Errors) {
    if tls.backend.is_some() {
        e.add("spec.tls.backend", NOT_YET);
    }
    let Some(f) = &tls.frontend else { return };
    let configs = std::iter::once(("spec.tls.frontend.default".to_string(), &f.default)).chain(
        f.per_port
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("spec.tls.frontend.perPort[{i}].tls"), &p.tls)),
    );
    for (field, c) in configs {
        let Some(v) = &c.validation else { continue };
        if let Some(m) = &v.mode
            && m != "AllowValidOnly"
            && m != "AllowInsecureFallback"
        {
            e.add(
                format!("{field}.validation.mode"),
                format!("unknown mode {m:?} (use AllowValidOnly or AllowInsecureFallback)"),
            );
        }
    }
}

/// A ReferenceGrant (`from` and `to` are required and non-empty).
pub(super) fn reference_grant(g: &ReferenceGrant, e: &mut Errors) {
    if g.from.is_empty() {
        e.add("spec.from", "needs at least one entry (who may refer)");
    }
    if g.to.is_empty() {
        e.add(
            "spec.to",
            "needs at least one entry (what may be referred to)",
        );
    }
    for (i, f) in g.from.iter().enumerate() {
        if f.kind.is_empty() {
            e.add(format!("spec.from[{i}].kind"), "is required");
        }
        if f.namespace.is_empty() {
            e.add(format!("spec.from[{i}].namespace"), "is required");
        }
    }
    for (i, t) in g.to.iter().enumerate() {
        if t.kind.is_empty() {
            e.add(format!("spec.to[{i}].kind"), "is required");
        }
    }
}

/// A TCPRoute.
pub(super) fn tcp_route(r: &TcpRoute, e: &mut Errors) {
    if r.use_default_gateways.is_some() {
        e.add("spec.useDefaultGateways", NOT_YET);
    }
    parents(&r.parent_refs, e);
    rules(&r.rules, e);
}

/// A TLSRoute.
pub(super) fn tls_route(r: &TlsRoute, e: &mut Errors) {
    if r.use_default_gateways.is_some() {
        e.add("spec.useDefaultGateways", NOT_YET);
    }
    for (i, h) in r.hostnames.iter().enumerate() {
        let name = h.strip_prefix("*.").unwrap_or(h);
        if h.parse::<std::net::IpAddr>().is_ok() || !is_dns1123_subdomain(name) {
            e.add(
                format!("spec.hostnames[{i}]"),
                format!("{h:?} is not a valid hostname (a DNS name, optionally starting with *.)"),
            );
        }
    }
    parents(&r.parent_refs, e);
    rules(&r.rules, e);
}

fn parents(refs: &[ParentReference], e: &mut Errors) {
    for (i, p) in refs.iter().enumerate() {
        let field = format!("spec.parentRefs[{i}]");
        let service = p.group.as_deref() == Some("") && p.kind.as_deref() == Some("Service");
        if !p.is_gateway() && !p.is_listener_set() && !service {
            e.add(
                format!("{field}.kind"),
                "only Gateways and ListenerSets of gateway.networking.k8s.io, or core Services for mesh routes, are implemented by this istiod as parents of TCPRoute and TLSRoute",
            );
        }
        if p.name.is_empty() {
            e.add(format!("{field}.name"), "is required (the Gateway's name)");
        }
        if let Some(port) = p.port {
            check_port(&format!("{field}.port"), port, e);
        }
    }
}

fn rules(rules: &[L4RouteRule], e: &mut Errors) {
    // One rule at v1, up to 16 at v1alpha2/v1alpha3 (each becomes one
    // Istio route, in order, as Istio converts them).
    if rules.is_empty() || rules.len() > 16 {
        e.add(
            "spec.rules",
            format!(
                "has {} rules; the CRDs take 1 (v1) to 16 (v1alpha2)",
                rules.len()
            ),
        );
    }
    for (i, r) in rules.iter().enumerate() {
        if r.backend_refs.is_empty() {
            e.add(
                format!("spec.rules[{i}].backendRefs"),
                "needs at least one backend",
            );
        }
        for (j, b) in r.backend_refs.iter().enumerate() {
            backend(&format!("spec.rules[{i}].backendRefs[{j}]"), b, e);
        }
    }
}

fn backend(field: &str, b: &BackendRef, e: &mut Errors) {
    let group = b.group.as_deref().unwrap_or("");
    let kind = b.kind.as_deref().unwrap_or("Service");
    if !(group.is_empty() || group == "core") || kind != "Service" {
        e.add(
            format!("{field}.kind"),
            format!("backend {group}/{kind} is not implemented by this istiod for TCPRoute and TLSRoute (only core Services)"),
        );
    }
    if b.name.is_empty() || b.name.contains('.') {
        e.add(
            format!("{field}.name"),
            format!("{:?}: name the Service (not its host name)", b.name),
        );
    }
    match b.port {
        None => e.add(
            format!("{field}.port"),
            "is required when the backend is a Service",
        ),
        Some(p) => check_port(&format!("{field}.port"), p, e),
    }
    if let Some(w) = b.weight
        && w > 1_000_000
    {
        e.add(
            format!("{field}.weight"),
            format!("{w} is above the maximum 1000000"),
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn errors(f: impl Fn(&mut Errors)) -> Vec<String> {
        let mut e = Errors::default();
        f(&mut e);
        e.0.iter()
            .map(|x| format!("{}: {}", x.field, x.message))
            .collect()
    }

    #[test]
    fn layer_4_routes_and_grants_are_checked_by_field() {
        let r: TlsRoute = serde_yaml_ng::from_str(
            "{parentRefs: [{name: gw, kind: ServiceImport, group: multicluster.x-k8s.io}], hostnames: [\"10.0.0.1\"], rules: [{backendRefs: [{name: a.b, kind: ServiceImport, group: multicluster.x-k8s.io}]}]}",
        )
        .unwrap();
        let e = errors(|e| tls_route(&r, e));
        for want in [
            "spec.parentRefs[0].kind",
            "spec.hostnames[0]",
            "spec.rules[0].backendRefs[0].kind",
            "spec.rules[0].backendRefs[0].name",
            "spec.rules[0].backendRefs[0].port",
        ] {
            assert!(e.iter().any(|l| l.starts_with(want)), "{want}: {e:?}");
        }
        let ok: TcpRoute =
            serde_yaml_ng::from_str("{parentRefs: [{name: gw}, {name: a, kind: Service, group: \"\"}, {name: s, kind: ListenerSet}], rules: [{backendRefs: [{name: a, port: 9000}]}, {backendRefs: [{name: b, port: 9000}]}]}")
                .unwrap();
        assert!(errors(|e| tcp_route(&ok, e)).is_empty());
        let g: ReferenceGrant =
            serde_yaml_ng::from_str("{from: [], to: [{group: \"\", kind: \"\"}]}").unwrap();
        let e = errors(|e| reference_grant(&g, e));
        assert!(e.iter().any(|l| l.starts_with("spec.from:")), "{e:?}");
        assert!(e.iter().any(|l| l.starts_with("spec.to[0].kind")), "{e:?}");
    }
}
