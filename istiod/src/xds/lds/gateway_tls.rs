//! The TLS a gateway server terminates, as Istio's
//! `BuildListenerTLSContext` (`pilot/pkg/networking/core/tls.go`) and
//! `ApplyCredentialSDSToServerCommonTLSContext` build it:
//!
//! - `credentialName`/`credentialNames`: certificates from istiod over SDS
//!   on the ADS stream (`kubernetes://<name>`); for MUTUAL and
//!   OPTIONAL_MUTUAL the client CA from `kubernetes://<name>-cacert` (or
//!   `caCertCredentialName`), with `subjectAltNames`,
//!   `verifyCertificateSpki`/`Hash`;
//! - ISTIO_MUTUAL: the gateway's workload certificate (`default`) and the
//!   mesh root (`ROOTCA`) from the agent's SDS, as a sidecar's inbound;
//! - file-mounted `serverCertificate`/`privateKey`/`caCertificates`: the
//!   paths inline in the TLS context, as Istio did before it handed them to
//!   the agent as SDS resources (Envoy reads them when the listener is
//!   built; a changed file is read when the listener is next pushed).
//!
//! SIMPLE, MUTUAL and OPTIONAL_MUTUAL apply `min`/`maxProtocolVersion`,
//! `cipherSuites` and `ecdhCurves`; ALPN is `h2, http/1.1`.

use proto::pb::envoy::config::core::v3::{DataSource, data_source};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SdsSecretConfig,
    SubjectAltNameMatcher, TlsCertificate, TlsParameters, common_tls_context,
    subject_alt_name_matcher, tls_parameters::TlsProtocol,
};
use proto::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use proto::pb::google::protobuf::BoolValue;

use super::super::sds::{ads_secret, ca_resource, credential_resource};
use super::super::util::sds;
use crate::model::gateway::{ServerTlsMode, ServerTlsSettings, TlsProtocolVersion};

/// Istio's `ALPNHttp` for gateway HTTPS servers.
const ALPN_HTTP: &[&str] = &["h2", "http/1.1"];

/// The downstream TLS context of a server (validation admits only the
/// terminating modes and the fields applied here).
pub fn downstream_tls_context(tls: &ServerTlsSettings) -> DownstreamTlsContext {
    let require_client_certificate =
        matches!(tls.mode, ServerTlsMode::Mutual | ServerTlsMode::IstioMutual);
    let mut common = CommonTlsContext {
        alpn_protocols: ALPN_HTTP.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    };
    let verifies_clients = matches!(
        tls.mode,
        ServerTlsMode::Mutual | ServerTlsMode::OptionalMutual
    );
    if tls.mode == ServerTlsMode::IstioMutual {
        common.tls_certificate_sds_secret_configs = vec![sds(common::xds::SDS_WORKLOAD_SECRET)];
        common.validation_context_type = Some(combined(
            validation(tls, false),
            sds(common::xds::SDS_ROOT_SECRET),
        ));
    } else if !credential_names(tls).is_empty() {
        common.tls_certificate_sds_secret_configs = credential_names(tls)
            .into_iter()
            .map(|n| ads_secret(&credential_resource(n)))
            .collect();
        if verifies_clients {
            let ca = if tls.ca_cert_credential_name.is_empty() {
                ca_resource(credential_names(tls)[0])
            } else if tls
                .ca_cert_credential_name
                .ends_with(crate::model::secret::CA_SUFFIX)
            {
                // Already a CA resource (the Gateway API's, e.g.
                // `configmap://<ns>/<name>-cacert`): as it is, as Istio uses it.
                credential_resource(&tls.ca_cert_credential_name)
            } else {
                ca_resource(&tls.ca_cert_credential_name)
            };
            common.validation_context_type = Some(combined(validation(tls, true), ads_secret(&ca)));
        }
    } else {
        common.tls_certificates = vec![TlsCertificate {
            certificate_chain: Some(file(&tls.server_certificate)),
            private_key: Some(file(&tls.private_key)),
            ..Default::default()
        }];
        if verifies_clients {
            let mut v = validation(tls, true);
            v.trusted_ca = Some(file(&tls.ca_certificates));
            common.validation_context_type =
                Some(common_tls_context::ValidationContextType::ValidationContext(v));
        }
    }
    if tls.mode != ServerTlsMode::IstioMutual {
        common.tls_params = tls_params(tls);
    }
    DownstreamTlsContext {
        common_tls_context: Some(common),
        require_client_certificate: Some(BoolValue {
            value: require_client_certificate,
        }),
        ..Default::default()
    }
}

/// `credentialNames`, else `credentialName` (validation admits one of them).
fn credential_names(tls: &ServerTlsSettings) -> Vec<&str> {
    if tls.credential_names.is_empty() {
        Some(tls.credential_name.as_str())
            .filter(|n| !n.is_empty())
            .into_iter()
            .collect()
    } else {
        tls.credential_names.iter().map(String::as_str).collect()
    }
}

fn combined(
    default: CertificateValidationContext,
    sds_config: SdsSecretConfig,
) -> common_tls_context::ValidationContextType {
    common_tls_context::ValidationContextType::CombinedValidationContext(
        common_tls_context::CombinedCertificateValidationContext {
            default_validation_context: Some(default),
            validation_context_sds_secret_config: Some(sds_config),
            ..Default::default()
        },
    )
}

/// The client certificate checks of a server: `subjectAltNames` (exact),
/// and for credentials and files `verifyCertificateSpki`/`Hash`.
fn validation(tls: &ServerTlsSettings, pins: bool) -> CertificateValidationContext {
    CertificateValidationContext {
        match_typed_subject_alt_names: tls.subject_alt_names.iter().map(|s| san(s)).collect(),
        verify_certificate_spki: if pins {
            tls.verify_certificate_spki.clone()
        } else {
            Vec::new()
        },
        verify_certificate_hash: if pins {
            tls.verify_certificate_hash.clone()
        } else {
            Vec::new()
        },
        ..Default::default()
    }
}

/// A SAN matched exactly, typed by its form (Istio uses Envoy's untyped,
/// deprecated matcher, which tries every type).
fn san(name: &str) -> SubjectAltNameMatcher {
    use subject_alt_name_matcher::SanType;
    let san_type = if name.contains("://") {
        SanType::Uri
    } else if name.parse::<std::net::IpAddr>().is_ok() {
        SanType::IpAddress
    } else if name.contains('@') {
        SanType::Email
    } else {
        SanType::Dns
    };
    SubjectAltNameMatcher {
        san_type: san_type.into(),
        matcher: Some(StringMatcher {
            match_pattern: Some(string_matcher::MatchPattern::Exact(name.to_string())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Istio's `applyServerTLSSettings`: parameters only when one is set.
fn tls_params(tls: &ServerTlsSettings) -> Option<TlsParameters> {
    let set = !tls.cipher_suites.is_empty()
        || !tls.ecdh_curves.is_empty()
        || tls.min_protocol_version != TlsProtocolVersion::Auto
        || tls.max_protocol_version != TlsProtocolVersion::Auto;
    set.then(|| TlsParameters {
        tls_minimum_protocol_version: protocol(tls.min_protocol_version).into(),
        tls_maximum_protocol_version: protocol(tls.max_protocol_version).into(),
        cipher_suites: tls.cipher_suites.clone(),
        ecdh_curves: tls.ecdh_curves.clone(),
        ..Default::default()
    })
}

fn protocol(v: TlsProtocolVersion) -> TlsProtocol {
    match v {
        TlsProtocolVersion::Auto => TlsProtocol::TlsAuto,
        TlsProtocolVersion::V1_0 => TlsProtocol::TlSv10,
        TlsProtocolVersion::V1_1 => TlsProtocol::TlSv11,
        TlsProtocolVersion::V1_2 => TlsProtocol::TlSv12,
        TlsProtocolVersion::V1_3 => TlsProtocol::TlSv13,
    }
}

fn file(path: &str) -> DataSource {
    DataSource {
        specifier: Some(data_source::Specifier::Filename(path.to_string())),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
