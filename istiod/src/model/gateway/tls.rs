//! A Gateway server's TLS settings (Istio's `ServerTLSSettings`, defined
//! with the Gateway), which a Sidecar's ingress listeners use too; below
//! both, naming neither.

use serde::{Deserialize, Serialize};

/// A Gateway server's TLS settings (Istio's `ServerTLSSettings`), every
/// field of the CRD so that each one is either applied or refused by name.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ServerTlsSettings {
    /// Answer plain HTTP on this server with a 301 to https.
    pub https_redirect: bool,
    /// How connections are secured (`PASSTHROUGH` when empty, as in Istio's enum).
    pub mode: ServerTlsMode,
    /// A file with the server certificate (file-mounted credentials).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub server_certificate: String,
    /// A file with the server's private key.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub private_key: String,
    /// A file with the CA certificates that verify client certificates.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub ca_certificates: String,
    /// A file with the certificate revocation list.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub ca_crl: String,
    /// The Secret with the server's key, certificate and (optionally) CA.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub credential_name: String,
    /// One or two Secrets (e.g. an RSA and an ECDSA certificate).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub credential_names: Vec<String>,
    /// The Secret (or ConfigMap) holding only the CA for client certificates.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub ca_cert_credential_name: String,
    /// Inline file-mounted certificate pairs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tls_certificates: Vec<serde_json::Value>,
    /// Names a client certificate's SAN must match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<String>,
    /// Base64 SHA-256 SPKI hashes a client certificate must match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub verify_certificate_spki: Vec<String>,
    /// Hex SHA-256 certificate hashes a client certificate must match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub verify_certificate_hash: Vec<String>,
    /// Minimum TLS version.
    pub min_protocol_version: TlsProtocolVersion,
    /// Maximum TLS version.
    pub max_protocol_version: TlsProtocolVersion,
    /// Cipher suites (Envoy's names).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cipher_suites: Vec<String>,
    /// ECDH curves.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ecdh_curves: Vec<String>,
    /// Skip verifying the client certificate (MUTUAL only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
}

/// Istio's `ServerTLSSettings.TLSmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ServerTlsMode {
    /// Forward the TLS connection by SNI without terminating it (the enum's zero value).
    #[default]
    Passthrough,
    /// Terminate TLS with the server's certificate.
    Simple,
    /// Terminate TLS and require a client certificate.
    Mutual,
    /// Forward by SNI to the cluster the SNI names (multi-network gateways).
    AutoPassthrough,
    /// Terminate Istio mTLS with the gateway's workload certificate.
    IstioMutual,
    /// Terminate TLS, verifying a client certificate when one is sent.
    OptionalMutual,
}

/// Istio's `ServerTLSSettings.TLSProtocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
pub enum TlsProtocolVersion {
    /// Envoy's default.
    #[default]
    #[serde(rename = "TLS_AUTO")]
    Auto,
    /// TLS 1.0.
    #[serde(rename = "TLSV1_0")]
    V1_0,
    /// TLS 1.1.
    #[serde(rename = "TLSV1_1")]
    V1_1,
    /// TLS 1.2.
    #[serde(rename = "TLSV1_2")]
    V1_2,
    /// TLS 1.3.
    #[serde(rename = "TLSV1_3")]
    V1_3,
}
