//! A listener's TLS as Istio's gateway controller builds it (`buildTLS` in
//! `pilot/pkg/config/kube/gateway/conversion.go`): `Terminate` is a
//! `SIMPLE` server whose `credentialName` is
//! `kubernetes-gateway://<namespace>/<secret>` for each `certificateRefs`
//! entry (two become `credentialNames`); the Gateway's
//! `spec.tls.frontend` validation makes it `MUTUAL` with a
//! `caCertCredentialName`; `Passthrough` is `PASSTHROUGH`.
//!
//! A reference to another namespace is authorized before the target is
//! looked at (so status never tells whether it exists), by a
//! `ReferenceGrant`; a missing or unusable Secret is `InvalidCertificateRef`.
//! A listener with such an error is not programmed: Istio emits no Istio
//! Gateway for it, so nothing is served on it.

use super::listener_protocol::ListenerProtocol;
use super::references::{RefFrom, RefTo, ReferenceGrants};
use super::tls_types::{ListenerTls, ObjectReference, SecretObjectReference, TlsConfig};
use super::{KubernetesGateway, Listener};
use crate::model::gateway::{ServerTlsMode, ServerTlsSettings};
use crate::model::secret::{PemKind, Secret, check_pem};
use crate::model::store::Snapshot;

/// Istio's resource prefix for Secrets named by the Gateway API
/// (`credentials.KubernetesGatewaySecretType`).
pub const KUBERNETES_GATEWAY_PREFIX: &str = "kubernetes-gateway://";
/// Istio's resource prefix for ConfigMaps holding a CA (`KubernetesConfigMapType`).
pub const CONFIGMAP_PREFIX: &str = "configmap://";
/// The option choosing another terminate mode (`gateway.istio.io/tls-terminate-mode`).
pub const TERMINATE_MODE_OPTION: &str = "gateway.istio.io/tls-terminate-mode";
/// The option restricting cipher suites (`gateway.istio.io/tls-cipher-suites`).
pub const CIPHER_SUITES_OPTION: &str = "gateway.istio.io/tls-cipher-suites";

/// Why a listener's TLS is not usable: its `ResolvedRefs` reason and message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct TlsError {
    /// `InvalidCertificateRef`, `RefNotPermitted`, `InvalidCACertificateRef`, ...
    pub reason: &'static str,
    /// Istio's message.
    pub message: String,
    /// Whether the CA side failed (the listener is then also not
    /// `Accepted`, reason `NoValidCACertificate`).
    pub ca: bool,
}

impl TlsError {
    fn new(reason: &'static str, message: String) -> Self {
        Self {
            reason,
            message,
            ca: false,
        }
    }
}

/// The credential name Istio writes for a Gateway API Secret reference.
pub fn gateway_credential(namespace: &str, name: &str) -> String {
    format!("{KUBERNETES_GATEWAY_PREFIX}{namespace}/{name}")
}

fn ref_string(r: &SecretObjectReference) -> String {
    // `group/kind/name.namespace`, unset parts empty, as Istio's
    // `secretObjectReferenceString` prints it.
    let opt = |o: &Option<String>| o.clone().unwrap_or_default();
    format!(
        "{}/{}/{}.{}",
        opt(&r.group),
        opt(&r.kind),
        r.name,
        opt(&r.namespace)
    )
}

/// The frontend settings that apply to `port` (Istio's `resolveGatewayTLS`).
fn frontend(gw: &KubernetesGateway, port: u32) -> Option<&TlsConfig> {
    let f = gw.tls.as_ref()?.frontend.as_ref()?;
    Some(
        f.per_port
            .iter()
            .find(|p| p.port == port)
            .map_or(&f.default, |p| &p.tls),
    )
}

/// The server TLS of listener `l` of Gateway `gw` (namespace `ns`);
/// `Ok(None)` without `tls`. On error, the listener serves nothing.
pub fn build(
    snapshot: &Snapshot,
    grants: &ReferenceGrants,
    gw: &KubernetesGateway,
    ns: &str,
    l: &Listener,
) -> Result<Option<ServerTlsSettings>, TlsError> {
    build_as(snapshot, grants, gw, "Gateway", ns, l)
}

/// [`build`] for a listener owned by an object of kind `owner` (`Gateway`,
/// or `ListenerSet` for its listeners): cross-namespace references are
/// held to the ReferenceGrants from that kind, as Istio holds them.
pub fn build_as(
    snapshot: &Snapshot,
    grants: &ReferenceGrants,
    gw: &KubernetesGateway,
    owner: &str,
    ns: &str,
    l: &Listener,
) -> Result<Option<ServerTlsSettings>, TlsError> {
    let Some(tls) = l.tls.as_ref() else {
        return Ok(None);
    };
    let mut out = ServerTlsSettings::default();
    match tls.mode.as_deref().unwrap_or("Terminate") {
        "Passthrough" => {
            out.mode = ServerTlsMode::Passthrough;
        }
        _ => {
            out.mode = ServerTlsMode::Simple;
            match tls.options.get(TERMINATE_MODE_OPTION).map(String::as_str) {
                Some("MUTUAL") => out.mode = ServerTlsMode::Mutual,
                Some("OPTIONAL_MUTUAL") => out.mode = ServerTlsMode::OptionalMutual,
                Some("ISTIO_MUTUAL") => {
                    out.mode = ServerTlsMode::IstioMutual;
                    return Ok(Some(out));
                }
                _ => {}
            }
            terminate(snapshot, grants, owner, ns, tls, &mut out)?;
            if let Some(v) = frontend(gw, l.port).and_then(|f| f.validation.as_ref())
                && !v.ca_certificate_refs.is_empty()
            {
                validation(snapshot, grants, owner, ns, tls, v, &mut out)?;
            }
        }
    }
    if let Some(c) = tls.options.get(CIPHER_SUITES_OPTION) {
        out.cipher_suites = c
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
    }
    Ok(Some(out))
}

/// The server certificates of a `Terminate` listener.
fn terminate(
    snapshot: &Snapshot,
    grants: &ReferenceGrants,
    owner: &str,
    ns: &str,
    tls: &ListenerTls,
    out: &mut ServerTlsSettings,
) -> Result<(), TlsError> {
    if tls.certificate_refs.len() > 2 {
        return Err(TlsError::new(
            "InvalidCertificateRef",
            "TLS mode can only support up to 2 server certificates".into(),
        ));
    }
    let mut names = Vec::new();
    let mut errors: Vec<TlsError> = Vec::new();
    for r in &tls.certificate_refs {
        let cred_ns = r.namespace.as_deref().unwrap_or(ns);
        if cred_ns != ns
            && !grants.granted(
                RefFrom {
                    group: super::GROUP,
                    kind: owner,
                    namespace: ns,
                },
                RefTo::secret(cred_ns, &r.name),
            )
        {
            // Istio reports a reference not permitted as it does a CA's:
            // the listener is not accepted either.
            errors.push(TlsError {
                reason: "RefNotPermitted",
                message: format!(
                    "certificateRef {}/{cred_ns} not accessible to a Gateway in namespace {ns:?} (missing a ReferenceGrant?)",
                    r.name
                ),
                ca: true,
            });
            continue;
        }
        match secret_reference(snapshot, r, cred_ns) {
            Ok(n) => names.push(n),
            Err(e) => errors.push(e),
        }
    }
    match names.len() {
        0 => Err(join(errors).unwrap_or_else(|| {
            TlsError::new(
                "InvalidCertificateRef",
                "no certificateRefs (a Terminate listener needs a certificate)".into(),
            )
        })),
        1 => {
            out.credential_name = names.remove(0);
            Ok(())
        }
        _ => {
            out.credential_names = names;
            Ok(())
        }
    }
}

/// Errors joined as Istio's `joinErrors`: the first reason, the messages
/// joined.
fn join(errors: Vec<TlsError>) -> Option<TlsError> {
    let first = errors.first()?.clone();
    let message = errors
        .iter()
        .map(|e| e.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    Some(TlsError { message, ..first })
}

/// A Secret reference checked as Istio's `buildSecretReference`: a Secret
/// that exists and holds a parsable certificate and key.
fn secret_reference(
    snapshot: &Snapshot,
    r: &SecretObjectReference,
    cred_ns: &str,
) -> Result<String, TlsError> {
    let invalid = |m: String| TlsError::new("InvalidCertificateRef", m);
    let group = r.group.as_deref().unwrap_or("");
    let kind = r.kind.as_deref().unwrap_or("Secret");
    if !(group.is_empty() || group == "core") || kind != "Secret" {
        return Err(invalid(format!(
            "invalid certificate reference {}, only secret is allowed",
            ref_string(r)
        )));
    }
    let Some(secret) = snapshot.get_typed::<Secret>(cred_ns, &r.name) else {
        return Err(invalid(format!(
            "invalid certificate reference {}, secret {cred_ns}/{} not found",
            ref_string(r),
            r.name
        )));
    };
    let ck = secret.spec.cert_and_key().map_err(|e| {
        invalid(format!(
            "invalid certificate reference {}, {e}",
            ref_string(r)
        ))
    })?;
    check_pem(&ck.cert, PemKind::Certificates)
        .and_then(|()| check_pem(&ck.key, PemKind::PrivateKey))
        .map_err(|e| {
            invalid(format!(
                "invalid certificate reference {}, the certificate is malformed: {e}",
                ref_string(r)
            ))
        })?;
    Ok(gateway_credential(cred_ns, &r.name))
}

/// `frontend.validation`: the CA that verifies clients, making the server
/// `MUTUAL` (or `OPTIONAL_MUTUAL` with `AllowInsecureFallback`).
fn validation(
    snapshot: &Snapshot,
    grants: &ReferenceGrants,
    owner: &str,
    ns: &str,
    tls: &ListenerTls,
    v: &super::tls_types::FrontendValidation,
    out: &mut ServerTlsSettings,
) -> Result<(), TlsError> {
    let ca_err = |reason, message| TlsError {
        reason,
        message,
        ca: true,
    };
    if v.ca_certificate_refs.len() > 1 {
        return Err(ca_err(
            "InvalidCACertificateRef",
            "only one caCertificateRef is supported".into(),
        ));
    }
    let r: &ObjectReference = &v.ca_certificate_refs[0];
    let ca_ns = r.namespace.as_deref().unwrap_or(ns);
    let secret = matches!(r.group.as_str(), "" | "core") && r.kind == "Secret";
    let to = RefTo {
        group: "",
        kind: if secret { "Secret" } else { r.kind.as_str() },
        namespace: ca_ns,
        name: &r.name,
    };
    if ca_ns != ns
        && !grants.granted(
            RefFrom {
                group: super::GROUP,
                kind: owner,
                namespace: ns,
            },
            to,
        )
    {
        return Err(ca_err(
            "RefNotPermitted",
            format!(
                "caCertificateRef {ca_ns}/{} not accessible to a Gateway in namespace {ns:?} (missing a ReferenceGrant?)",
                r.name
            ),
        ));
    }
    let configmap = matches!(r.group.as_str(), "" | "core") && r.kind == "ConfigMap";
    // Go's `%v` of the reference, as Istio's messages print it.
    let shown = format!(
        "{}/{}/{}.{}",
        r.group,
        r.kind,
        r.name,
        r.namespace.as_deref().unwrap_or("")
    );
    if !secret && !configmap {
        return Err(ca_err(
            "InvalidCACertificateKind",
            format!(
                "invalid CA certificate reference {shown}, only secret and configmap are allowed"
            ),
        ));
    }
    let (found, prefix) = if configmap {
        // A ConfigMap's CA, served as `configmap://<ns>/<name>-cacert`
        // (Istio's `buildCaCertificateReference`).
        let found = snapshot
            .get_typed::<crate::model::config_map::ConfigMap>(ca_ns, &r.name)
            .ok_or_else(|| format!("configmap {ca_ns}/{} not found", r.name))
            .and_then(|c| {
                let ca = c.spec.ca().map_err(|e| e.to_string())?;
                crate::model::secret::check_pem(ca, crate::model::secret::PemKind::Certificates)
                    .map_err(|_| "the bundle is malformed".to_string())
            });
        (
            found,
            format!(
                "{}{ca_ns}/{}",
                super::backend_policies::CONFIGMAP_PREFIX,
                r.name
            ),
        )
    } else {
        let found = snapshot
            .get_typed::<Secret>(ca_ns, &r.name)
            .ok_or_else(|| format!("secret {ca_ns}/{} not found", r.name))
            .and_then(|s| s.spec.ca().map(|_| ()).map_err(|e| e.to_string()));
        (found, gateway_credential(ca_ns, &r.name))
    };
    if let Err(e) = found {
        return Err(ca_err(
            "InvalidCACertificateRef",
            format!("invalid CA certificate reference {shown}, {e}"),
        ));
    }
    out.ca_cert_credential_name = format!("{prefix}{}", crate::model::secret::CA_SUFFIX);
    out.mode = ServerTlsMode::Mutual;
    out.insecure_skip_verify = Some(false);
    if v.mode.as_deref() == Some("AllowInsecureFallback") {
        out.mode = ServerTlsMode::OptionalMutual;
        out.insecure_skip_verify = Some(true);
    }
    match tls.options.get(TERMINATE_MODE_OPTION).map(String::as_str) {
        Some("MUTUAL") => {
            out.mode = ServerTlsMode::Mutual;
            out.insecure_skip_verify = Some(false);
        }
        Some("OPTIONAL_MUTUAL") => {
            out.mode = ServerTlsMode::OptionalMutual;
            out.insecure_skip_verify = Some(false);
        }
        _ => {}
    }
    Ok(())
}

/// The Istio protocol of a listener and whether it is supported.
pub fn protocol(l: &Listener) -> Option<ListenerProtocol> {
    ListenerProtocol::parse(&l.protocol)
}

/// Whether a Gateway API Gateway (or ListenerSet) of `snapshot` names
/// Secret `ns/name` as a certificate or CA (a change of it changes the
/// Gateway's translation).
pub fn references_secret(snapshot: &Snapshot, ns: &str, name: &str) -> bool {
    let in_sets = snapshot
        .list::<super::listener_set::ListenerSet>()
        .any(|s| {
            let set_ns = s.object.metadata.namespace.as_str();
            s.spec
                .listeners
                .iter()
                .filter_map(|l| l.tls.as_ref())
                .flat_map(|t| &t.certificate_refs)
                .any(|r| r.name == name && r.namespace.as_deref().unwrap_or(set_ns) == ns)
        });
    in_sets
        || snapshot.list::<KubernetesGateway>().any(|g| {
            let gw_ns = g.object.metadata.namespace.as_str();
            let certs = g
                .spec
                .listeners
                .iter()
                .filter_map(|l| l.tls.as_ref())
                .flat_map(|t| &t.certificate_refs)
                .any(|r| r.name == name && r.namespace.as_deref().unwrap_or(gw_ns) == ns);
            let cas = g
                .spec
                .tls
                .as_ref()
                .and_then(|t| t.frontend.as_ref())
                .into_iter()
                .flat_map(|f| std::iter::once(&f.default).chain(f.per_port.iter().map(|p| &p.tls)))
                .filter_map(|c| c.validation.as_ref())
                .flat_map(|v| &v.ca_certificate_refs)
                .any(|r| r.name == name && r.namespace.as_deref().unwrap_or(gw_ns) == ns);
            certs || cas
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use super::*;
    use crate::model::{ConfigStore, Update, parse_file};

    fn snapshot(yaml: &str) -> Arc<crate::model::store::Snapshot> {
        let store = ConfigStore::new();
        let parsed = parse_file("t.yaml", yaml).unwrap();
        store.apply(
            parsed
                .objects
                .into_iter()
                .map(|o| Update::Upsert(Arc::new(o))),
        );
        store.snapshot()
    }

    fn secret(ns: &str, name: &str) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["a.example.com".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let block = |pem: &str| {
            pem.lines()
                .map(|l| format!("    {l}\n"))
                .collect::<String>()
        };
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {ns}}}\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}  ca.crt: |\n{}",
            block(&cert.pem()),
            block(&key.serialize_pem()),
            block(&cert.pem())
        )
    }

    const GATEWAY: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: istio-system}
spec:
  gatewayClassName: istio
  tls:
    frontend:
      default:
        validation:
          caCertificateRefs: [{group: "", kind: Secret, name: client-ca, namespace: ca}]
      perPort:
      - port: 8444
        tls: {}
  listeners:
  - name: mtls
    port: 8443
    protocol: HTTPS
    tls: {certificateRefs: [{name: server}]}
  - name: simple
    port: 8444
    protocol: HTTPS
    tls: {certificateRefs: [{name: server}]}
"#;

    const CA_GRANT: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata: {name: g, namespace: ca}
spec:
  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: istio-system}]
  to: [{group: "", kind: Secret}]
"#;

    fn built(yaml: &str, listener: usize) -> Result<Option<ServerTlsSettings>, TlsError> {
        let s = snapshot(yaml);
        let gw = s
            .get_typed::<KubernetesGateway>("istio-system", "gw")
            .unwrap();
        let grants = ReferenceGrants::new(&s);
        build(
            &s,
            &grants,
            gw.spec,
            "istio-system",
            &gw.spec.listeners[listener],
        )
    }

    #[test]
    fn frontend_validation_makes_the_server_mutual_with_the_granted_ca() {
        let base = format!(
            "{}---\n{}---\n{GATEWAY}",
            secret("istio-system", "server"),
            secret("ca", "client-ca")
        );
        // Without a grant for the CA's namespace: refused, the listener not accepted.
        let e = built(&base, 0).unwrap_err();
        assert_eq!(e.reason, "RefNotPermitted");
        assert!(e.ca, "{e:?}");
        let tls = built(&format!("{base}---\n{CA_GRANT}"), 0)
            .unwrap()
            .unwrap();
        assert_eq!(tls.mode, ServerTlsMode::Mutual);
        assert_eq!(
            tls.credential_name,
            "kubernetes-gateway://istio-system/server"
        );
        assert_eq!(
            tls.ca_cert_credential_name,
            "kubernetes-gateway://ca/client-ca-cacert"
        );
        assert_eq!(tls.insecure_skip_verify, Some(false));
        // The port with its own (empty) settings stays SIMPLE.
        let tls = built(&format!("{base}---\n{CA_GRANT}"), 1)
            .unwrap()
            .unwrap();
        assert_eq!(tls.mode, ServerTlsMode::Simple);
        assert!(tls.ca_cert_credential_name.is_empty());
    }

    #[test]
    fn a_missing_or_unusable_secret_is_an_invalid_certificate_ref() {
        let e = built(GATEWAY, 1).unwrap_err();
        assert_eq!(e.reason, "InvalidCertificateRef");
        assert!(
            e.message.contains("secret istio-system/server not found"),
            "{e:?}"
        );
        let no_key = "apiVersion: v1\nkind: Secret\nmetadata: {name: server, namespace: istio-system}\nstringData: {other: x}\n";
        let e = built(&format!("{no_key}---\n{GATEWAY}"), 1).unwrap_err();
        assert_eq!(e.reason, "InvalidCertificateRef");
        assert!(references_secret(
            &snapshot(GATEWAY),
            "istio-system",
            "server"
        ));
        assert!(references_secret(&snapshot(GATEWAY), "ca", "client-ca"));
        assert!(!references_secret(&snapshot(GATEWAY), "ca", "server"));
    }
}
