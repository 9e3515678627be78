//! Gateway validation of the servers that forward connections without
//! terminating them: `TCP` servers (no `tls`) and `TLS` servers in
//! `PASSTHROUGH` mode (routed by SNI), and `HTTPS` servers in `PASSTHROUGH`
//! mode, which Istio forwards the same way. Istio's rule that a TLS server has
//! TLS settings applies; on a passthrough server every other TLS field is
//! refused by name (Envoy never sees them: the gateway does not terminate).

use super::Errors;
use crate::model::gateway::{Server, ServerTlsMode, ServerTlsSettings};
use crate::model::service::Protocol;

/// Whether this file serves the server: `TCP`, `TLS`, or `HTTPS` in
/// `PASSTHROUGH` mode (which Istio forwards as TLS, its "ingress gateway
/// without TLS termination" task).
pub(super) fn serves(protocol: Protocol, s: &Server) -> bool {
    match protocol {
        Protocol::Tcp | Protocol::Tls => true,
        Protocol::Https => s
            .tls
            .as_ref()
            .is_some_and(|t| t.mode == ServerTlsMode::Passthrough),
        _ => false,
    }
}

/// Checks the `tls` of a server whose protocol this file serves; `false`
/// when the settings are not for this file (a terminating mode), so that
/// the caller refuses them.
pub(super) fn server_tls(field: &str, s: &Server, protocol: Protocol, e: &mut Errors) -> bool {
    let Some(tls) = &s.tls else {
        if protocol == Protocol::Tls {
            // Istio's `validateServer`: "server must have TLS settings for
            // HTTPS/TLS protocols".
            e.add(
                format!("{field}.tls"),
                "server must have TLS settings for HTTPS/TLS protocols (add tls: {mode: PASSTHROUGH} to route by SNI)",
            );
        }
        return true;
    };
    if !matches!(protocol, Protocol::Tls | Protocol::Https) {
        return false;
    }
    match tls.mode {
        ServerTlsMode::Passthrough => {
            passthrough_fields(&format!("{field}.tls"), tls, e);
            true
        }
        ServerTlsMode::AutoPassthrough => {
            e.add(
                format!("{field}.tls.mode"),
                "AUTO_PASSTHROUGH is not supported by this istiod yet (use PASSTHROUGH with VirtualService tls routes)",
            );
            true
        }
        _ => false,
    }
}

/// A passthrough server's other TLS fields: each refused by name.
fn passthrough_fields(field: &str, tls: &ServerTlsSettings, e: &mut Errors) {
    let set = [
        ("httpsRedirect", tls.https_redirect),
        ("serverCertificate", !tls.server_certificate.is_empty()),
        ("privateKey", !tls.private_key.is_empty()),
        ("caCertificates", !tls.ca_certificates.is_empty()),
        ("caCrl", !tls.ca_crl.is_empty()),
        ("credentialName", !tls.credential_name.is_empty()),
        ("credentialNames", !tls.credential_names.is_empty()),
        (
            "caCertCredentialName",
            !tls.ca_cert_credential_name.is_empty(),
        ),
        ("tlsCertificates", !tls.tls_certificates.is_empty()),
        ("subjectAltNames", !tls.subject_alt_names.is_empty()),
        (
            "verifyCertificateSpki",
            !tls.verify_certificate_spki.is_empty(),
        ),
        (
            "verifyCertificateHash",
            !tls.verify_certificate_hash.is_empty(),
        ),
        (
            "minProtocolVersion",
            tls.min_protocol_version != Default::default(),
        ),
        (
            "maxProtocolVersion",
            tls.max_protocol_version != Default::default(),
        ),
        ("cipherSuites", !tls.cipher_suites.is_empty()),
        ("ecdhCurves", !tls.ecdh_curves.is_empty()),
        ("insecureSkipVerify", tls.insecure_skip_verify.is_some()),
    ];
    for (name, _) in set.iter().filter(|(_, set)| *set) {
        e.add(
            format!("{field}.{name}"),
            "has no effect in PASSTHROUGH mode: the gateway forwards the TLS connection without terminating it (remove it, or terminate TLS with another mode)",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support;

    const GW: &str = "apiVersion: networking.istio.io/v1beta1\nkind: Gateway\nmetadata: {name: gw, namespace: istio-system}\n";

    fn errors(spec: &str) -> Vec<String> {
        test_support::errors("mesh/gw.yaml", GW, spec)
    }

    #[test]
    fn tcp_and_tls_passthrough_servers_are_accepted() {
        for spec in [
            "{servers: [{port: {number: 31400, name: tcp, protocol: TCP}, hosts: ['*']}]}",
            "{servers: [{port: {number: 443, name: tls, protocol: TLS}, hosts: ['*.example.com'], tls: {mode: PASSTHROUGH}}]}",
            "{servers: [{port: {number: 443, name: tls, protocol: tls}, hosts: ['demo/a.example.com'], tls: {}}]}",
            "{servers: [{port: {number: 443, name: https, protocol: HTTPS}, hosts: [a.example.com], tls: {mode: PASSTHROUGH}}]}",
        ] {
            assert!(errors(spec).is_empty(), "{spec}: {:?}", errors(spec));
        }
    }

    #[test]
    fn what_passthrough_cannot_apply_is_refused_by_field() {
        test_support::refused(
            &errors("{servers: [{port: {number: 443, name: tls, protocol: TLS}, hosts: ['*']}]}"),
            "spec.servers[0].tls",
            "must have TLS settings",
        );
        for (tls, field) in [
            ("{mode: PASSTHROUGH, credentialName: c}", "credentialName"),
            (
                "{mode: PASSTHROUGH, minProtocolVersion: TLSV1_2}",
                "minProtocolVersion",
            ),
            ("{httpsRedirect: true}", "httpsRedirect"),
            ("{subjectAltNames: [a]}", "subjectAltNames"),
        ] {
            test_support::refused(
                &errors(&format!(
                    "{{servers: [{{port: {{number: 443, name: tls, protocol: TLS}}, hosts: ['*'], tls: {tls}}}]}}"
                )),
                &format!("spec.servers[0].tls.{field}"),
                "PASSTHROUGH",
            );
        }
        test_support::refused(
            &errors(
                "{servers: [{port: {number: 15443, name: tls, protocol: TLS}, hosts: ['*.local'], tls: {mode: AUTO_PASSTHROUGH}}]}",
            ),
            "spec.servers[0].tls.mode",
            "AUTO_PASSTHROUGH",
        );
        // TLS on a TCP server is termination: not served here.
        test_support::refused(
            &errors(
                "{servers: [{port: {number: 31400, name: tcp, protocol: TCP}, hosts: ['*'], tls: {mode: PASSTHROUGH}}]}",
            ),
            "spec.servers[0].tls",
            "not supported",
        );
    }
}
