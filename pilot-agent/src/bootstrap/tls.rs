//! Upstream TLS for the telemetry services Envoy connects to
//! (`ProxyConfig.envoyMetricsService`, `envoyAccessLogService`): Istio's
//! `ClientTLSSettings` as an `UpstreamTlsContext` whose secrets the agent's
//! SDS serves.

use common::NodeMetadata;
use prost::Name;
use proto::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
use serde_json::{Map, Value, json};

use super::HostPort;
use common::xds::{SDS_ROOT_SECRET, SDS_WORKLOAD_SECRET};

/// The static cluster of the agent's SDS socket.
pub(super) const SDS_CLUSTER: &str = "sds-grpc";

/// `ClientTLSSettings.mode` for the connections Envoy opens to telemetry services.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// Plaintext.
    #[default]
    Disable,
    /// TLS, verifying the server against `ca_certificates`.
    Simple,
    /// Mutual TLS with the given client certificate and key.
    Mutual,
    /// Mutual TLS with the workload certificate (`default`/`ROOTCA` over SDS).
    IstioMutual,
}

/// `ClientTLSSettings` of a telemetry service (`ProxyConfig.envoyMetricsService.tlsSettings`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// TLS mode.
    pub mode: TlsMode,
    /// Client certificate chain file (`Mutual`).
    pub client_certificate: String,
    /// Client private key file (`Mutual`).
    pub private_key: String,
    /// CA bundle file verifying the server (`Simple`, `Mutual`).
    pub ca_certificates: String,
    /// SNI; for `IstioMutual` the cluster name when empty.
    pub sni: String,
    /// Server SANs to accept (exact match); any when empty.
    pub subject_alt_names: Vec<String>,
}

/// A gRPC telemetry service Envoy connects to (`ProxyConfig.envoyMetricsService`,
/// `envoyAccessLogService`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteService {
    /// The service address.
    pub address: HostPort,
    /// TLS settings; `None` (or mode `Disable`) for plaintext.
    pub tls: Option<ClientTls>,
}

/// An SDS secret served by the agent over `sds-grpc`.
pub(super) fn sds_secret(name: &str) -> Value {
    json!({
        "name": name,
        "sds_config": {
            "api_config_source": {
                "api_type": "GRPC",
                "grpc_services": [{"envoy_grpc": {"cluster_name": SDS_CLUSTER}}],
                "set_node_on_first_message_only": true,
                "transport_api_version": "V3"
            },
            "resource_api_version": "V3"
        }
    })
}

/// A non-empty metadata override, else `default`.
fn or<'a>(value: &'a Option<String>, default: &'a str) -> &'a str {
    value
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or(default)
}

/// Istio's `tlsContextConvert` for a telemetry cluster (gRPC, so ALPN `h2`).
/// Files are served by the agent's SDS as `file-cert:`/`file-root:` secrets;
/// `ISTIO_META_TLS_CLIENT_*` metadata overrides the file paths.
pub(super) fn upstream_tls(
    tls: &ClientTls,
    cluster: &str,
    metadata: &NodeMetadata,
) -> Option<Value> {
    let ca = or(&metadata.tls_client_root_cert, &tls.ca_certificates);
    let root_secret = |name: Option<String>| {
        let mut validation = json!({
            "default_validation_context": if tls.subject_alt_names.is_empty() {
                json!({})
            } else {
                json!({"match_subject_alt_names": tls.subject_alt_names.iter().map(|s| json!({"exact": s})).collect::<Vec<_>>()})
            }
        });
        if let (Some(name), Some(obj)) = (name, validation.as_object_mut()) {
            obj.insert(
                "validation_context_sds_secret_config".into(),
                sds_secret(&name),
            );
        }
        validation
    };
    let file_root = (!ca.is_empty()).then(|| format!("file-root:{ca}"));
    let mut common = Map::new();
    let mut sni = tls.sni.clone();
    match tls.mode {
        TlsMode::Disable => return None,
        TlsMode::Simple => {
            common.insert("combined_validation_context".into(), root_secret(file_root));
            common.insert("alpn_protocols".into(), json!(["h2"]));
        }
        TlsMode::Mutual => {
            let cert = or(&metadata.tls_client_cert_chain, &tls.client_certificate);
            let key = or(&metadata.tls_client_key, &tls.private_key);
            if !cert.is_empty() && !key.is_empty() {
                common.insert(
                    "tls_certificate_sds_secret_configs".into(),
                    json!([sds_secret(&format!("file-cert:{cert}~{key}"))]),
                );
            }
            common.insert("combined_validation_context".into(), root_secret(file_root));
            common.insert("alpn_protocols".into(), json!(["h2"]));
        }
        TlsMode::IstioMutual => {
            common.insert(
                "tls_certificate_sds_secret_configs".into(),
                json!([sds_secret(SDS_WORKLOAD_SECRET)]),
            );
            common.insert(
                "combined_validation_context".into(),
                root_secret(Some(SDS_ROOT_SECRET.to_string())),
            );
            common.insert("alpn_protocols".into(), json!(["istio", "h2"]));
            if sni.is_empty() {
                sni = cluster.to_string();
            }
        }
    }
    let mut context = Map::new();
    context.insert("@type".into(), json!(UpstreamTlsContext::type_url()));
    context.insert("common_tls_context".into(), Value::Object(common));
    if !sni.is_empty() {
        context.insert("sni".into(), Value::String(sni));
    }
    Some(json!({"name": "envoy.transport_sockets.tls", "typed_config": context}))
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::*;

    #[test]
    fn istio_mutual_telemetry_uses_workload_certificate() {
        let v = render(&BootstrapOptions {
            envoy_access_log_service: Some(RemoteService {
                address: HostPort::parse("als", "als:9000").unwrap(),
                tls: Some(ClientTls {
                    mode: TlsMode::IstioMutual,
                    subject_alt_names: vec!["spiffe://td/ns/x/sa/y".into()],
                    ..Default::default()
                }),
            }),
            ..Default::default()
        });
        let cluster = v["static_resources"]["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "envoy_accesslog_service")
            .expect("the access log service's cluster");
        let ctx = &cluster["transport_socket"]["typed_config"];
        assert_eq!(ctx["sni"], "envoy_accesslog_service");
        let common = &ctx["common_tls_context"];
        assert_eq!(common["alpn_protocols"], json!(["istio", "h2"]));
        assert_eq!(
            common["tls_certificate_sds_secret_configs"][0]["name"],
            "default"
        );
        let cvc = &common["combined_validation_context"];
        assert_eq!(
            cvc["validation_context_sds_secret_config"]["name"],
            "ROOTCA"
        );
        assert_eq!(
            cvc["default_validation_context"]["match_subject_alt_names"],
            json!([{"exact": "spiffe://td/ns/x/sa/y"}])
        );
        // No sink for an access log service: istiod configures the logger.
        assert!(v.get("stats_sinks").is_none());
    }
}
