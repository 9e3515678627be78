//! Istio's `networking.istio.io` Gateway: the ports, protocols and hosts a
//! gateway workload (a `router` proxy chosen by `selector`) listens for.

use serde::{Deserialize, Serialize};

use super::istio::Labels;

pub(super) mod tls;

pub use tls::{ServerTlsMode, ServerTlsSettings, TlsProtocolVersion};

/// A `networking.istio.io` Gateway.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Gateway {
    /// The gateway workloads it applies to, by their labels (in any
    /// namespace, as Istio with `PILOT_SCOPE_GATEWAY_TO_NAMESPACE=false`).
    pub selector: Labels,
    /// What the gateway listens for.
    pub servers: Vec<Server>,
}

/// One server of a Gateway: a port and the hosts it serves there.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Server {
    /// The port the gateway listens on (required).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<ServerPort>,
    /// The address to bind to; not served yet (validation refuses it).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub bind: String,
    /// Hosts, `[namespace/]host`, the namespace `*`, `.` or a name.
    pub hosts: Vec<String>,
    /// TLS settings of the server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<ServerTlsSettings>,
    /// Unix domain socket or loopback address to forward to; not served yet.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub default_endpoint: String,
    /// An optional name, unique among the Gateway's servers.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
}

/// A Gateway server's port.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ServerPort {
    /// The port number (1-65535).
    pub number: u32,
    /// `HTTP`, `HTTPS`, `GRPC`, `HTTP2`, `MONGO`, `TCP`, `TLS` (case-insensitive).
    pub protocol: String,
    /// The port's name (required).
    pub name: String,
    /// Deprecated in Istio and ignored by it for gateways.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_port: Option<u32>,
}

impl Server {
    /// The server's port number, 0 when it has no port (validation refuses that).
    pub fn port_number(&self) -> u16 {
        self.port
            .as_ref()
            .and_then(|p| u16::try_from(p.number).ok())
            .unwrap_or(0)
    }
}

/// A Gateway server host split into its namespace part and host part, as
/// Istio reads them: no `/` means any namespace (`*`).
pub fn split_host(host: &str) -> (&str, &str) {
    host.split_once('/').unwrap_or(("*", host))
}
