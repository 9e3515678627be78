//! ProxyConfig `gatewayTopology` (Istio's `meshconfig.Topology`): how many
//! proxies in front of a gateway are trusted to set `X-Forwarded-For`, how
//! the client certificate is forwarded, and whether connections arrive with
//! a PROXY protocol header. The agent carries it in its ProxyConfig (mesh
//! `defaultConfig`, `PROXY_CONFIG`, the Pod's `proxy.istio.io/config`) and
//! sends it in the node metadata's `PROXY_CONFIG`; istiod applies it to
//! the router's listeners.

use serde::{Deserialize, Serialize};

/// `gatewayTopology`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GatewayTopology {
    /// Trusted proxies in front of the gateway: Envoy's
    /// `xff_num_trusted_hops`, so the client address (what
    /// `remoteIpBlocks` matches) is read that far back in
    /// `X-Forwarded-For`.
    pub num_trusted_proxies: u32,
    /// What the gateway does with `X-Forwarded-Client-Cert`
    /// (`SANITIZE_SET` when undefined, as Istio).
    #[serde(skip_serializing_if = "ForwardClientCertDetails::is_undefined")]
    pub forward_client_cert_details: ForwardClientCertDetails,
    /// Present: every gateway listener expects a PROXY protocol header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<ProxyProtocolConfiguration>,
}

/// `gatewayTopology.proxyProtocol`: an empty message, present or not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyProtocolConfiguration {}

/// `gatewayTopology.forwardClientCertDetails`, Istio's enum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ForwardClientCertDetails {
    /// Not set: Istio's default for gateways, `SANITIZE_SET`, applies.
    #[default]
    Undefined,
    /// Do not send the header to the next hop.
    Sanitize,
    /// Forward the header only when the connection is mTLS.
    ForwardOnly,
    /// Append the client certificate's details when mTLS.
    AppendForward,
    /// Replace the header with the client certificate's details when mTLS.
    SanitizeSet,
    /// Always forward the header.
    AlwaysForwardOnly,
}

impl ForwardClientCertDetails {
    fn is_undefined(&self) -> bool {
        *self == Self::Undefined
    }

    /// Envoy's `HttpConnectionManager.ForwardClientCertDetails` value
    /// (Istio's `MeshConfigToEnvoyForwardClientCertDetails`), with
    /// `SANITIZE_SET` for undefined.
    pub fn envoy_value(self) -> i32 {
        match self {
            Self::Sanitize => 0,
            Self::ForwardOnly => 1,
            Self::AppendForward => 2,
            Self::Undefined | Self::SanitizeSet => 3,
            Self::AlwaysForwardOnly => 4,
        }
    }

    /// Whether Envoy should also set the current client certificate's
    /// details (only for `APPEND_FORWARD` and `SANITIZE_SET`, as Istio).
    pub fn sets_current_details(self) -> bool {
        matches!(
            self,
            Self::AppendForward | Self::SanitizeSet | Self::Undefined
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_istio_spelling_and_refuses_unknown_fields() {
        let t: GatewayTopology = serde_json::from_str(
            r#"{"numTrustedProxies": 2, "forwardClientCertDetails": "APPEND_FORWARD", "proxyProtocol": {}}"#,
        )
        .unwrap();
        assert_eq!(t.num_trusted_proxies, 2);
        assert_eq!(t.forward_client_cert_details.envoy_value(), 2);
        assert!(t.proxy_protocol.is_some());
        assert!(serde_json::from_str::<GatewayTopology>(r#"{"numTrustedProxy": 1}"#).is_err());
        let d = GatewayTopology::default();
        assert_eq!(d.forward_client_cert_details.envoy_value(), 3);
        assert!(d.forward_client_cert_details.sets_current_details());
        assert!(!ForwardClientCertDetails::Sanitize.sets_current_details());
    }
}
