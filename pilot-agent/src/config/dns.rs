//! The DNS proxy: whether it runs and where it listens.

use std::net::SocketAddr;

use common::ProxyType;

use super::error::ConfigError;
use super::vars::Vars;
use super::{ENV_DNS_CAPTURE, ENV_DNS_PROXY_ADDR};

/// Istio's `DNS_PROXY_ADDR` default, `localhost` spelled as the IP it binds.
const DEFAULT_DNS_PROXY_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 15053);

/// The DNS proxy's settings.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DnsConfig {
    /// Whether the DNS proxy runs (`ISTIO_META_DNS_CAPTURE` on a sidecar).
    pub capture: bool,
    /// `DNS_PROXY_ADDR`: where it listens.
    pub addr: SocketAddr,
}

/// Reads the DNS proxy's settings; only sidecars capture DNS.
pub(super) fn parse(v: &mut Vars<'_>, proxy_type: ProxyType) -> DnsConfig {
    let capture = v.bool(ENV_DNS_CAPTURE, false) && proxy_type == ProxyType::Sidecar;
    let addr =
        v.string(ENV_DNS_PROXY_ADDR, "localhost:15053")
            .replacen("localhost:", "127.0.0.1:", 1);
    let addr = match addr.parse() {
        Ok(a) => a,
        Err(_) => {
            v.error(ConfigError::Invalid {
                var: ENV_DNS_PROXY_ADDR,
                value: addr,
                reason: "not an IP:port address".into(),
            });
            DEFAULT_DNS_PROXY_ADDR
        }
    };
    DnsConfig { capture, addr }
}
