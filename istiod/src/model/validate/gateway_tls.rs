//! Validation of a Gateway server's `tls` (Istio's `validateTLSOptions` and
//! `validateServer` rules), and of a Sidecar ingress listener's (the same
//! settings, terminated by a sidecar), plus a refusal naming the field for each part
//! this istiod does not apply: PASSTHROUGH and AUTO_PASSTHROUGH,
//! `tlsCertificates`, `caCrl`, and settings that would reach Envoy with no
//! effect in the mode chosen.

use super::Errors;
use crate::model::gateway::{ServerTlsMode, ServerTlsSettings, TlsProtocolVersion};

/// The cipher suites Envoy (BoringSSL) accepts on a server (Istio's
/// `ValidCipherSuites`).
const VALID_CIPHER_SUITES: &[&str] = &[
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-GCM-SHA256",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
    "ECDHE-ECDSA-AES128-SHA",
    "ECDHE-RSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA",
    "ECDHE-RSA-AES256-SHA",
    "AES128-SHA",
    "AES256-SHA",
    "DES-CBC3-SHA",
];

/// The ECDH curves Envoy accepts.
const VALID_ECDH_CURVES: &[&str] = &["X25519", "P-256", "P-384", "P-521", "X25519MLKEM768"];

/// The `tls` of a plain HTTP server: only `httpsRedirect`.
pub(super) fn plain_server_tls(field: &str, tls: &ServerTlsSettings, e: &mut Errors) {
    let only_redirect = ServerTlsSettings {
        https_redirect: tls.https_redirect,
        ..Default::default()
    };
    if *tls != only_redirect {
        e.add(
            field,
            "server cannot have TLS settings for plain text HTTP ports (only httpsRedirect; use protocol HTTPS to terminate TLS)",
        );
    }
}

/// A Sidecar `ingress[].tls`: built only under Istio's
/// `ENABLE_TLS_ON_SIDECAR_INGRESS` (`enabled`), then as a gateway's HTTPS
/// server TLS, in the modes a sidecar terminates itself.
pub(super) fn sidecar_ingress_tls(
    field: &str,
    tls: &ServerTlsSettings,
    enabled: bool,
    e: &mut Errors,
) {
    if !enabled {
        e.add(
            field,
            "TLS termination on Sidecar ingress is off: Istio applies it only with ENABLE_TLS_ON_SIDECAR_INGRESS=true (on ports whose PeerAuthentication mode is DISABLE); start istiod with that flag, or remove it (inbound traffic then uses the mesh's mutual TLS per PeerAuthentication)",
        );
        return;
    }
    if matches!(
        tls.mode,
        ServerTlsMode::IstioMutual | ServerTlsMode::Passthrough | ServerTlsMode::AutoPassthrough
    ) {
        e.add(
            format!("{field}.mode"),
            format!(
                "{:?}: a Sidecar ingress terminates SIMPLE, MUTUAL or OPTIONAL_MUTUAL TLS (mesh mutual TLS comes from PeerAuthentication)",
                tls.mode
            ),
        );
        return;
    }
    if tls.https_redirect {
        e.add(
            format!("{field}.httpsRedirect"),
            "applies to Gateway servers only (remove it)",
        );
    }
    https_server_tls(field, Some(tls), e);
}

/// The `tls` of an HTTPS server.
pub(super) fn https_server_tls(field: &str, tls: Option<&ServerTlsSettings>, e: &mut Errors) {
    let Some(tls) = tls else {
        e.add(
            field,
            "server must have TLS settings for HTTPS/TLS protocols (e.g. {mode: SIMPLE, credentialName: <secret>})",
        );
        return;
    };
    let f = |name: &str| format!("{field}.{name}");
    match tls.mode {
        ServerTlsMode::Passthrough | ServerTlsMode::AutoPassthrough => {
            e.add(
                f("mode"),
                format!(
                    "{:?} on HTTPS servers is not supported by this istiod yet (use SIMPLE, MUTUAL, OPTIONAL_MUTUAL or ISTIO_MUTUAL)",
                    tls.mode
                ),
            );
            return;
        }
        ServerTlsMode::IstioMutual => istio_mutual(field, tls, e),
        ServerTlsMode::Simple | ServerTlsMode::Mutual | ServerTlsMode::OptionalMutual => {
            credentials(field, tls, e);
            parameters(field, tls, e);
        }
    }
    if !tls.tls_certificates.is_empty() {
        e.add(
            f("tlsCertificates"),
            "is not supported by this istiod yet (use credentialNames, or serverCertificate and privateKey)",
        );
    }
    if !tls.ca_crl.is_empty() {
        e.add(
            f("caCrl"),
            "is not supported by this istiod yet (leave it out)",
        );
    }
    if tls.insecure_skip_verify.is_some() {
        e.add(
            f("insecureSkipVerify"),
            "is not supported by this istiod (leave it out)",
        );
    }
}

/// ISTIO_MUTUAL: the workload certificate and mesh root, nothing else.
fn istio_mutual(field: &str, tls: &ServerTlsSettings, e: &mut Errors) {
    let present = [
        ("credentialName", !tls.credential_name.is_empty()),
        ("credentialNames", !tls.credential_names.is_empty()),
        (
            "caCertCredentialName",
            !tls.ca_cert_credential_name.is_empty(),
        ),
        ("serverCertificate", !tls.server_certificate.is_empty()),
        ("privateKey", !tls.private_key.is_empty()),
        ("caCertificates", !tls.ca_certificates.is_empty()),
    ];
    for (name, set) in present {
        if set {
            e.add(
                format!("{field}.{name}"),
                "ISTIO_MUTUAL TLS cannot have associated credentials (it uses the gateway's workload certificate)",
            );
        }
    }
    // Istio applies no TLS parameters or pins to ISTIO_MUTUAL servers.
    let unapplied = [
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
            tls.min_protocol_version != TlsProtocolVersion::Auto,
        ),
        (
            "maxProtocolVersion",
            tls.max_protocol_version != TlsProtocolVersion::Auto,
        ),
        ("cipherSuites", !tls.cipher_suites.is_empty()),
        ("ecdhCurves", !tls.ecdh_curves.is_empty()),
    ];
    for (name, set) in unapplied {
        if set {
            e.add(
                format!("{field}.{name}"),
                "is not applied to ISTIO_MUTUAL servers (mesh TLS settings apply; leave it out)",
            );
        }
    }
}

/// SIMPLE, MUTUAL, OPTIONAL_MUTUAL: Secrets or files, and client checks.
fn credentials(field: &str, tls: &ServerTlsSettings, e: &mut Errors) {
    let f = |name: &str| format!("{field}.{name}");
    let mutual = tls.mode != ServerTlsMode::Simple;
    let by_secret = !tls.credential_name.is_empty() || !tls.credential_names.is_empty();
    if !tls.credential_name.is_empty() && !tls.credential_names.is_empty() {
        e.add(
            f("credentialNames"),
            "only one of credentialName and credentialNames can be set",
        );
    }
    if tls.credential_names.len() > 2 {
        e.add(
            f("credentialNames"),
            "can have at most 2 entries (e.g. an RSA and an ECDSA certificate)",
        );
    }
    for (i, n) in tls.credential_names.iter().enumerate() {
        if n.is_empty() {
            e.add(f(&format!("credentialNames[{i}]")), "must not be empty");
        }
    }
    if by_secret {
        for (name, value) in [
            ("serverCertificate", &tls.server_certificate),
            ("privateKey", &tls.private_key),
            ("caCertificates", &tls.ca_certificates),
        ] {
            if !value.is_empty() {
                e.add(
                    f(name),
                    "cannot be combined with credentialName(s): the certificates come from the Secret",
                );
            }
        }
    } else {
        let mode = format!("{:?}", tls.mode).to_uppercase();
        if tls.server_certificate.is_empty() {
            e.add(
                f("serverCertificate"),
                format!("{mode} TLS requires a server certificate (or set credentialName)"),
            );
        }
        if tls.private_key.is_empty() {
            e.add(
                f("privateKey"),
                format!("{mode} TLS requires a private key (or set credentialName)"),
            );
        }
        if mutual && tls.ca_certificates.is_empty() {
            e.add(
                f("caCertificates"),
                format!("{mode} TLS requires a client CA bundle (or set credentialName)"),
            );
        }
        if !mutual && !tls.ca_certificates.is_empty() {
            e.add(
                f("caCertificates"),
                "applies to MUTUAL and OPTIONAL_MUTUAL only (SIMPLE verifies no client)",
            );
        }
    }
    if !tls.ca_cert_credential_name.is_empty() && (!mutual || !by_secret) {
        e.add(
            f("caCertCredentialName"),
            "applies to MUTUAL and OPTIONAL_MUTUAL servers with credentialName(s) only",
        );
    }
    if !mutual {
        for (name, set) in [
            ("subjectAltNames", !tls.subject_alt_names.is_empty()),
            (
                "verifyCertificateSpki",
                !tls.verify_certificate_spki.is_empty(),
            ),
            (
                "verifyCertificateHash",
                !tls.verify_certificate_hash.is_empty(),
            ),
        ] {
            if set {
                e.add(
                    f(name),
                    "checks client certificates: it applies to MUTUAL and OPTIONAL_MUTUAL only",
                );
            }
        }
    }
}

/// Protocol versions, cipher suites and curves Envoy accepts.
fn parameters(field: &str, tls: &ServerTlsSettings, e: &mut Errors) {
    let (min, max) = (tls.min_protocol_version, tls.max_protocol_version);
    if min != TlsProtocolVersion::Auto
        && max != TlsProtocolVersion::Auto
        && (min as u8) > (max as u8)
    {
        e.add(
            format!("{field}.minProtocolVersion"),
            "is greater than maxProtocolVersion",
        );
    }
    for (i, c) in tls.cipher_suites.iter().enumerate() {
        if !VALID_CIPHER_SUITES.contains(&c.as_str()) {
            e.add(
                format!("{field}.cipherSuites[{i}]"),
                format!("unknown cipher suite {c:?} (use one of {VALID_CIPHER_SUITES:?})"),
            );
        }
    }
    for (i, c) in tls.ecdh_curves.iter().enumerate() {
        if !VALID_ECDH_CURVES.contains(&c.as_str()) {
            e.add(
                format!("{field}.ecdhCurves[{i}]"),
                format!("unknown ECDH curve {c:?} (use one of {VALID_ECDH_CURVES:?})"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support;

    const GW: &str = "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: ingress, namespace: istio-system}\n";

    fn errors(tls: &str) -> Vec<String> {
        test_support::errors(
            "mesh/gw.yaml",
            GW,
            &format!(
                "{{servers: [{{port: {{number: 443, name: https, protocol: HTTPS}}, hosts: ['*'], tls: {tls}}}]}}"
            ),
        )
    }

    #[track_caller]
    fn refused(tls: &str, field: &str, needle: &str) {
        test_support::refused(
            &errors(tls),
            &format!("spec.servers[0].tls.{field}"),
            needle,
        );
    }

    /// `sidecar_ingress_tls` with the flag as given: `field: message`.
    fn sidecar_errors(tls: &str, enabled: bool) -> Vec<String> {
        let tls: crate::model::gateway::ServerTlsSettings = serde_yaml_ng::from_str(tls).unwrap();
        let mut e = super::super::Errors::default();
        super::sidecar_ingress_tls("spec.ingress[0].tls", &tls, enabled, &mut e);
        e.0.iter()
            .map(|f| format!("{}: {}", f.field, f.message))
            .collect()
    }

    #[test]
    fn sidecar_ingress_tls_needs_the_flag_and_a_terminating_mode() {
        let off = sidecar_errors("{mode: SIMPLE, credentialName: c}", false);
        assert!(
            off.len() == 1
                && off[0].starts_with("spec.ingress[0].tls: ")
                && off[0].contains("ENABLE_TLS_ON_SIDECAR_INGRESS=true"),
            "{off:?}"
        );
        for tls in [
            "{mode: SIMPLE, credentialName: c}",
            "{mode: MUTUAL, credentialName: c, subjectAltNames: [client.example]}",
            "{mode: SIMPLE, serverCertificate: /c, privateKey: /k}",
        ] {
            assert!(
                sidecar_errors(tls, true).is_empty(),
                "{tls}: {:?}",
                sidecar_errors(tls, true)
            );
        }
        let istio = sidecar_errors("{mode: ISTIO_MUTUAL}", true);
        assert!(
            istio[0].starts_with("spec.ingress[0].tls.mode: "),
            "{istio:?}"
        );
        let redirect = sidecar_errors(
            "{mode: SIMPLE, credentialName: c, httpsRedirect: true}",
            true,
        );
        assert!(
            redirect[0].starts_with("spec.ingress[0].tls.httpsRedirect: "),
            "{redirect:?}"
        );
    }

    #[test]
    fn what_is_applied_is_accepted() {
        for tls in [
            "{mode: SIMPLE, credentialName: c}",
            "{mode: SIMPLE, credentialName: ns/c, minProtocolVersion: TLSV1_2, maxProtocolVersion: TLSV1_3, cipherSuites: [ECDHE-RSA-AES128-GCM-SHA256], ecdhCurves: [P-256]}",
            "{mode: SIMPLE, credentialNames: [a, b]}",
            "{mode: MUTUAL, credentialName: c, subjectAltNames: [a.example.com], verifyCertificateSpki: [x], verifyCertificateHash: [y]}",
            "{mode: MUTUAL, credentialName: c, caCertCredentialName: ca}",
            "{mode: OPTIONAL_MUTUAL, credentialName: c}",
            "{mode: SIMPLE, serverCertificate: /c, privateKey: /k}",
            "{mode: MUTUAL, serverCertificate: /c, privateKey: /k, caCertificates: /ca}",
            "{mode: ISTIO_MUTUAL, subjectAltNames: ['spiffe://cluster.local/ns/a/sa/b']}",
            "{mode: SIMPLE, credentialName: c, httpsRedirect: true}",
        ] {
            assert!(errors(tls).is_empty(), "{tls}: {:?}", errors(tls));
        }
        // A plain server may only redirect.
        let plain = test_support::errors(
            "mesh/gw.yaml",
            GW,
            "{servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*'], tls: {httpsRedirect: true}}]}",
        );
        assert!(plain.is_empty(), "{plain:?}");
    }

    #[test]
    fn what_is_not_applied_is_refused_by_field() {
        refused("{mode: AUTO_PASSTHROUGH}", "mode", "not supported");
        refused(
            "{mode: SIMPLE, credentialName: c, tlsCertificates: [{serverCertificate: /a}]}",
            "tlsCertificates",
            "not supported",
        );
        refused(
            "{mode: SIMPLE, credentialName: c, caCrl: /crl}",
            "caCrl",
            "not supported",
        );
        refused(
            "{mode: SIMPLE, credentialName: c, subjectAltNames: [a]}",
            "subjectAltNames",
            "MUTUAL",
        );
        refused(
            "{mode: SIMPLE, credentialName: c, verifyCertificateHash: [a]}",
            "verifyCertificateHash",
            "MUTUAL",
        );
        refused(
            "{mode: SIMPLE, credentialName: c, caCertCredentialName: ca}",
            "caCertCredentialName",
            "MUTUAL",
        );
        refused(
            "{mode: ISTIO_MUTUAL, credentialName: c}",
            "credentialName",
            "cannot have associated credentials",
        );
        refused(
            "{mode: ISTIO_MUTUAL, cipherSuites: [AES128-SHA]}",
            "cipherSuites",
            "not applied",
        );
        refused(
            "{mode: ISTIO_MUTUAL, minProtocolVersion: TLSV1_3}",
            "minProtocolVersion",
            "not applied",
        );
        let plain = test_support::errors(
            "mesh/gw.yaml",
            GW,
            "{servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*'], tls: {mode: SIMPLE, credentialName: c}}]}",
        );
        test_support::refused(&plain, "spec.servers[0].tls", "plain text");
    }

    #[test]
    fn istio_rules_apply() {
        refused(
            "{mode: SIMPLE}",
            "serverCertificate",
            "requires a server certificate",
        );
        refused(
            "{mode: SIMPLE, serverCertificate: /c}",
            "privateKey",
            "requires a private key",
        );
        refused(
            "{mode: MUTUAL, serverCertificate: /c, privateKey: /k}",
            "caCertificates",
            "client CA bundle",
        );
        refused(
            "{mode: SIMPLE, serverCertificate: /c, privateKey: /k, caCertificates: /ca}",
            "caCertificates",
            "MUTUAL",
        );
        refused(
            "{mode: SIMPLE, credentialName: a, credentialNames: [b]}",
            "credentialNames",
            "only one of",
        );
        refused(
            "{mode: SIMPLE, credentialNames: [a, b, c]}",
            "credentialNames",
            "at most 2",
        );
        refused(
            "{mode: SIMPLE, credentialName: a, privateKey: /k}",
            "privateKey",
            "cannot be combined",
        );
        refused(
            "{mode: SIMPLE, credentialName: a, minProtocolVersion: TLSV1_3, maxProtocolVersion: TLSV1_2}",
            "minProtocolVersion",
            "greater",
        );
        refused(
            "{mode: SIMPLE, credentialName: a, cipherSuites: [BOGUS]}",
            "cipherSuites[0]",
            "unknown cipher suite",
        );
        refused(
            "{mode: SIMPLE, credentialName: a, ecdhCurves: [P-1]}",
            "ecdhCurves[0]",
            "unknown ECDH curve",
        );
    }
}
