//! The xDS proxy: where istiod is, how its TLS is verified, what extra
//! metadata goes upstream, the socket Envoy connects to, and whether Envoy
//! speaks Delta xDS to it.

use std::path::PathBuf;

use common::AuthenticationPolicy;

use super::identity::{host_of, system_roots};
use super::vars::Vars;
use super::*;
use crate::proxy_config::ProxyConfig;

/// How the xDS proxy reaches istiod and serves Envoy.
#[derive(Debug, Clone, serde::Serialize)]
pub struct XdsProxyConfig {
    /// ProxyConfig `discoveryAddress`.
    pub discovery_address: String,
    /// TLS server name verified for istiod (`ISTIOD_SAN`, else the
    /// discovery host, `localhost` meaning `istiod.istio-system.svc`).
    pub server_name: String,
    /// Root bundle for the connection; `None` for plaintext
    /// (`controlPlaneAuthPolicy: NONE`).
    pub root_path: Option<PathBuf>,
    /// Extra upstream metadata (`XDS_HEADER_*`), names lowercased.
    pub headers: Vec<(String, String)>,
    /// The socket Envoy connects to (`<configPath>/XDS`).
    pub socket: PathBuf,
    /// `ISTIO_DELTA_XDS`: Envoy uses Delta ADS (the bootstrap's API type).
    pub delta: bool,
    /// `GRPC_KEEPALIVE_INTERVAL` and `GRPC_KEEPALIVE_TIMEOUT`: the upstream
    /// connection's keepalive (a dead link to istiod is noticed after about
    /// their sum) and the downstream server's, as Istio's `pkg/keepalive`.
    pub keepalive: common::tls::GrpcKeepalive,
    /// ProxyConfig `readinessProbe`: the application's health, probed and
    /// reported to istiod (a VM registered through a WorkloadGroup).
    pub health_check: Option<crate::health_check::HealthCheckConfig>,
}

/// Reads the xDS proxy's settings from the environment and the ProxyConfig.
pub(super) fn parse(v: &mut Vars<'_>, proxy_config: &ProxyConfig, pod_ip: &str) -> XdsProxyConfig {
    let health_check = proxy_config
        .readiness_probe
        .as_ref()
        .filter(|p| !p.is_null())
        .and_then(|p| {
            crate::health_check::HealthCheckConfig::parse(p, pod_ip)
                .map_err(|e| v.error(e))
                .ok()
        });
    let discovery_address = proxy_config
        .discovery_address
        .clone()
        .unwrap_or_else(|| DEFAULT_DISCOVERY_ADDRESS.to_string());
    let delta = v.bool(ENV_DELTA_XDS, true);
    let discovery_host = host_of(&discovery_address);
    let server_name = match v.opt_string(ENV_ISTIOD_SAN) {
        Some(san) => san,
        None if discovery_host.contains("localhost") => "istiod.istio-system.svc".to_string(),
        None => discovery_host,
    };
    let file_root = PathBuf::from(FILE_CERTS_DIR).join("root-cert.pem");
    let root_path = if proxy_config.control_plane_auth_policy == Some(AuthenticationPolicy::None) {
        None
    } else if let Some(root) = v.opt_string(ENV_XDS_ROOT_CA) {
        if root == "SYSTEM" {
            // Unlike CA_ROOT_CA, a missing OS bundle is not an error here;
            // it leaves the connection without TLS.
            system_roots()
        } else {
            Some(PathBuf::from(root))
        }
    } else if file_root.is_file() {
        Some(file_root)
    } else if let Some(p) = v.opt_string(ENV_PROV_CERT) {
        Some(PathBuf::from(p).join("root-cert.pem"))
    } else {
        Some(PathBuf::from(DEFAULT_ROOT_CERT_PATH))
    };
    let default_keepalive = common::tls::GrpcKeepalive::default();
    let keepalive = common::tls::GrpcKeepalive {
        interval: v.duration(ENV_GRPC_KEEPALIVE_INTERVAL, default_keepalive.interval),
        timeout: v.duration(ENV_GRPC_KEEPALIVE_TIMEOUT, default_keepalive.timeout),
    };
    let headers = v
        .prefixed(ENV_XDS_HEADER_PREFIX)
        .into_iter()
        .map(|(k, value)| (k.to_ascii_lowercase(), value))
        .collect();
    XdsProxyConfig {
        discovery_address,
        server_name,
        root_path,
        headers,
        socket: PathBuf::from(proxy_config.config_path()).join("XDS"),
        delta,
        keepalive,
        health_check,
    }
}
