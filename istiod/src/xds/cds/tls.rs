//! TLS origination for DestinationRule `tls.mode: SIMPLE` and `MUTUAL`, as
//! Istio's `constructUpstreamTLS` builds it: TLS 1.2 to 1.3, the configured
//! SNI (else Envoy's `auto_sni` from the request's host), the server
//! verified against `caCertificates` (else the system's trust store, as
//! Istio's default `VERIFY_CERTIFICATE_AT_CLIENT=true` does) and
//! `subjectAltNames` (else `auto_san_validation` against the host), an
//! optional CRL, and for MUTUAL the client certificate and key.
//!
//! `credentialName` (Istio's `ApplyCustomSDSToClientCommonTLSContext`): the
//! client certificate and key of MUTUAL from istiod over SDS on the ADS
//! stream (`kubernetes://<name>`), the CA that verifies the server from
//! `kubernetes://<name>-cacert`, with `subjectAltNames`. Istio builds it for
//! a sidecar only from a rule with a `workloadSelector` (other sidecars
//! would wait for credentials they may not read); a rule without one gives
//! sidecars no TLS at all (validation refuses such a rule here).
//!
//! Where we differ: Istio hands the files to the agent as SDS resources
//! (`file-cert:<cert>~<key>`, `file-root:<ca>`), which reloads them when they
//! change; our agent serves only the workload certificate over SDS, so Envoy
//! reads the files itself (read at connection setup of each new cluster
//! version; a changed file is picked up when the cluster is next pushed).

use proto::pb::envoy::config::core::v3::{DataSource, data_source};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, SubjectAltNameMatcher, TlsCertificate,
    UpstreamTlsContext, common_tls_context, subject_alt_name_matcher,
};
use proto::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};

use super::super::sds::{ads_secret, ca_resource, credential_resource};
use super::mesh_tls_params;
use crate::model::istio::{ClientTlsSettings, TlsMode};

/// The trust store Istio's agent resolves `caCertificates: ""` to (its
/// `file-root:system` resource) in Istio's Debian-based proxy image, and the
/// one our sidecar image (Debian with `ca-certificates`) carries: istiod
/// cannot look at the proxy's file system, so the path is fixed here.
pub const SYSTEM_ROOT_CERTS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// ALPN for TLS origination to an HTTP/2 cluster (Istio's `ALPNH2Only`).
const ALPN_H2_ONLY: &[&str] = &["h2"];

fn file(path: &str) -> DataSource {
    DataSource {
        specifier: Some(data_source::Specifier::Filename(path.to_string())),
        ..Default::default()
    }
}

/// A subject alternative name matcher of the SAN's type: `spiffe://` (and
/// other URIs) as URI, IP addresses as IP, the rest as DNS names. Istio
/// uses Envoy's untyped (deprecated) matcher, which tries every type.
fn san_matcher(san: &str) -> SubjectAltNameMatcher {
    use subject_alt_name_matcher::SanType;
    let san_type = if san.contains("://") {
        SanType::Uri
    } else if san.parse::<std::net::IpAddr>().is_ok() {
        SanType::IpAddress
    } else {
        SanType::Dns
    };
    SubjectAltNameMatcher {
        san_type: san_type.into(),
        matcher: Some(StringMatcher {
            match_pattern: Some(string_matcher::MatchPattern::Exact(san.to_string())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What the cluster's HTTP protocol options must add for this TLS:
/// Envoy's `auto_sni` and `auto_san_validation`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AutoSni {
    /// SNI from the request's host (no `sni` configured).
    pub sni: bool,
    /// Server certificate checked against the request's host (no `sni`,
    /// no `subjectAltNames`, verification on).
    pub san_validation: bool,
}

/// The upstream TLS context of a SIMPLE or MUTUAL policy (`None` for other
/// modes, and for a `credentialName` of a rule without `workloadSelector`,
/// `with_selector` false, as Istio's sidecars). `default_sans` are the
/// ServiceEntry's `subjectAltNames`, used when the policy gives none
/// (Istio's behaviour for external services).
pub fn originate(
    tls: &ClientTlsSettings,
    default_sans: &[String],
    http2: bool,
    with_selector: bool,
) -> Option<(UpstreamTlsContext, AutoSni)> {
    if !matches!(tls.mode, TlsMode::Simple | TlsMode::Mutual) {
        return None;
    }
    let credential = !tls.credential_name.is_empty();
    // A ConfigMap's CA (a BackendTLSPolicy's) is no privileged credential:
    // Istio gives it to sidecars of rules without a selector too. Nor is
    // the never-served `invalid://` of a BackendTLSPolicy whose CA cannot
    // be used: its TLS blocks the traffic on every proxy. (Istio leaves a
    // sidecar's cluster plain text then, and blocks on gateways; here the
    // outbound clusters of a scope are shared by gateways and sidecars, so
    // both block, the safer side.)
    let privileged = credential
        && !tls
            .credential_name
            .starts_with(crate::xds::sds::CONFIGMAP_PREFIX)
        && !tls
            .credential_name
            .starts_with(crate::model::gateway_api::backend_policies::INVALID_CREDENTIAL);
    if privileged && !with_selector {
        return None;
    }
    let skip_verify = tls.insecure_skip_verify == Some(true);
    let sans = if tls.subject_alt_names.is_empty() {
        default_sans
    } else {
        &tls.subject_alt_names
    };
    let auto = AutoSni {
        sni: tls.sni.is_empty(),
        san_validation: tls.sni.is_empty() && tls.subject_alt_names.is_empty() && !skip_verify,
    };
    let matchers = || sans.iter().map(|s| san_matcher(s)).collect();
    let validation = if credential {
        if skip_verify {
            None
        } else {
            Some(
                common_tls_context::ValidationContextType::CombinedValidationContext(
                    common_tls_context::CombinedCertificateValidationContext {
                        default_validation_context: Some(CertificateValidationContext {
                            match_typed_subject_alt_names: matchers(),
                            ..Default::default()
                        }),
                        validation_context_sds_secret_config: Some(ads_secret(&ca_resource(
                            &tls.credential_name,
                        ))),
                        ..Default::default()
                    },
                ),
            )
        }
    } else if skip_verify {
        Some(
            common_tls_context::ValidationContextType::ValidationContext(
                CertificateValidationContext::default(),
            ),
        )
    } else {
        let ca = if tls.ca_certificates.is_empty() {
            SYSTEM_ROOT_CERTS
        } else {
            &tls.ca_certificates
        };
        Some(
            common_tls_context::ValidationContextType::ValidationContext(
                CertificateValidationContext {
                    trusted_ca: Some(file(ca)),
                    match_typed_subject_alt_names: matchers(),
                    crl: (!tls.ca_crl.is_empty()).then(|| file(&tls.ca_crl)),
                    ..Default::default()
                },
            ),
        )
    };
    let mutual = tls.mode == TlsMode::Mutual;
    let tls_certificate_sds_secret_configs = if mutual && credential {
        vec![ads_secret(&credential_resource(&tls.credential_name))]
    } else {
        Vec::new()
    };
    let tls_certificates = if mutual && !credential {
        vec![TlsCertificate {
            certificate_chain: Some(file(&tls.client_certificate)),
            private_key: Some(file(&tls.private_key)),
            ..Default::default()
        }]
    } else {
        Vec::new()
    };
    let context = UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_params: Some(mesh_tls_params(&[])),
            tls_certificates,
            tls_certificate_sds_secret_configs,
            validation_context_type: validation,
            alpn_protocols: if http2 {
                ALPN_H2_ONLY.iter().map(|a| a.to_string()).collect()
            } else {
                Vec::new()
            },
            ..Default::default()
        }),
        sni: tls.sni.clone(),
        ..Default::default()
    };
    Some((context, auto))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validation(c: &UpstreamTlsContext) -> &CertificateValidationContext {
        match c
            .common_tls_context
            .as_ref()
            .unwrap()
            .validation_context_type
            .as_ref()
            .unwrap()
        {
            common_tls_context::ValidationContextType::ValidationContext(v) => v,
            other => panic!("{other:?}"),
        }
    }

    fn filename(d: &Option<DataSource>) -> Option<&str> {
        match d.as_ref()?.specifier.as_ref()? {
            data_source::Specifier::Filename(f) => Some(f),
            _ => None,
        }
    }

    #[test]
    fn simple_verifies_with_the_ca_file_sni_and_sans() {
        let tls = ClientTlsSettings {
            mode: TlsMode::Simple,
            ca_certificates: "/etc/certs/ca.pem".into(),
            sni: "api.example.com".into(),
            subject_alt_names: vec!["api.example.com".into(), "spiffe://td/ns/a/sa/b".into()],
            ca_crl: "/etc/certs/crl.pem".into(),
            ..Default::default()
        };
        let (c, auto) = originate(&tls, &[], false, false).unwrap();
        assert_eq!(c.sni, "api.example.com");
        assert_eq!(auto, AutoSni::default());
        let v = validation(&c);
        assert_eq!(filename(&v.trusted_ca), Some("/etc/certs/ca.pem"));
        assert_eq!(filename(&v.crl), Some("/etc/certs/crl.pem"));
        let types: Vec<i32> = v
            .match_typed_subject_alt_names
            .iter()
            .map(|m| m.san_type)
            .collect();
        assert_eq!(
            types,
            [
                subject_alt_name_matcher::SanType::Dns as i32,
                subject_alt_name_matcher::SanType::Uri as i32
            ]
        );
        let common = c.common_tls_context.as_ref().unwrap();
        assert!(
            common.tls_certificates.is_empty(),
            "SIMPLE sends no client certificate"
        );
        assert!(common.alpn_protocols.is_empty());
    }

    #[test]
    fn empty_ca_uses_the_system_store_and_auto_sni() {
        let tls = ClientTlsSettings {
            mode: TlsMode::Simple,
            ..Default::default()
        };
        let (c, auto) = originate(&tls, &["se-san".into()], true, false).unwrap();
        let v = validation(&c);
        assert_eq!(filename(&v.trusted_ca), Some(SYSTEM_ROOT_CERTS));
        assert_eq!(
            v.match_typed_subject_alt_names.len(),
            1,
            "the ServiceEntry's SANs"
        );
        assert_eq!(
            auto,
            AutoSni {
                sni: true,
                san_validation: true
            }
        );
        assert_eq!(c.common_tls_context.unwrap().alpn_protocols, ["h2"]);
    }

    #[test]
    fn mutual_presents_the_files_and_skip_verify_drops_validation() {
        let tls = ClientTlsSettings {
            mode: TlsMode::Mutual,
            client_certificate: "/c.pem".into(),
            private_key: "/k.pem".into(),
            insecure_skip_verify: Some(true),
            ..Default::default()
        };
        let (c, auto) = originate(&tls, &[], false, false).unwrap();
        let common = c.common_tls_context.as_ref().unwrap();
        assert_eq!(
            filename(&common.tls_certificates[0].certificate_chain),
            Some("/c.pem")
        );
        assert_eq!(
            filename(&common.tls_certificates[0].private_key),
            Some("/k.pem")
        );
        assert_eq!(validation(&c), &CertificateValidationContext::default());
        assert!(auto.sni && !auto.san_validation);
    }

    #[test]
    fn other_modes_originate_nothing() {
        for mode in [TlsMode::Disable, TlsMode::IstioMutual] {
            let tls = ClientTlsSettings {
                mode,
                ..Default::default()
            };
            assert!(originate(&tls, &[], false, false).is_none());
        }
    }

    #[test]
    fn a_configmap_ca_is_fetched_over_sds_even_on_sidecars() {
        // A BackendTLSPolicy's CA: a ConfigMap credential, which a sidecar
        // (no workloadSelector) may use; a Secret credential it may not.
        let tls = ClientTlsSettings {
            mode: TlsMode::Simple,
            credential_name: "configmap://demo/ca".into(),
            sni: "a.example".into(),
            ..Default::default()
        };
        let (c, _) = originate(&tls, &[], false, false).unwrap();
        assert_eq!(c.sni, "a.example");
        let common = c.common_tls_context.unwrap();
        let Some(common_tls_context::ValidationContextType::CombinedValidationContext(v)) =
            common.validation_context_type
        else {
            panic!("no combined validation context");
        };
        assert_eq!(
            v.validation_context_sds_secret_config.unwrap().name,
            "configmap://demo/ca-cacert"
        );
        let secret = ClientTlsSettings {
            credential_name: "client-cred".into(),
            ..tls
        };
        assert!(originate(&secret, &[], false, false).is_none());
    }
}
