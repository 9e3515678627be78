//! Where istiod serves (Istio's `DiscoveryServerOptions`, keepalive and
//! shutdown options) and the names and certificate it serves with.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use common::env::Reader;

use super::args::DiscoveryArgs;

/// `ISTIOD_CUSTOM_HOST`: extra names (comma-separated) for istiod's serving certificate.
pub const ENV_ISTIOD_CUSTOM_HOST: &str = "ISTIOD_CUSTOM_HOST";
/// `POD_NAME`: istiod's instance ID (else the host name).
pub const ENV_POD_NAME: &str = "POD_NAME";

/// A listen address flag that is not one of Go's forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag}={value:?} is not a listen address (use :PORT or IP:PORT)")]
pub struct ListenAddrError {
    /// The flag, without its dashes.
    pub flag: String,
    /// Its value.
    pub value: String,
}

/// Why the serving flags cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServingError {
    /// A listen address does not parse.
    #[error(transparent)]
    ListenAddr(#[from] ListenAddrError),
    /// One of the custom serving certificate and key is given without the other.
    #[error("--tlsCertFile and --tlsKeyFile must be given together")]
    TlsFilesPair,
    /// `--caCertFile`: Istio hands the root of a custom serving certificate
    /// to its webhooks' `caBundle` and watches it; neither is built here.
    #[error(
        "--caCertFile is not supported: the root of a custom serving certificate is not distributed (webhook caBundle, proxies); sign istiod's certificate from the mesh root instead"
    )]
    CaCertFile,
}

/// Istio's `--tlsCertFile` and `--tlsKeyFile`: a serving
/// certificate istiod uses instead of one its CA signs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomTls {
    /// The certificate chain (PEM).
    pub cert: PathBuf,
    /// The key (PEM).
    pub key: PathBuf,
}

/// Where and how istiod serves.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Plaintext gRPC listen address; `None` disables it.
    pub grpc_addr: Option<SocketAddr>,
    /// TLS gRPC (xDS + CA) listen address; `None` disables it.
    pub secure_grpc_addr: Option<SocketAddr>,
    /// HTTP (readiness, debug) listen address.
    pub http_addr: Option<SocketAddr>,
    /// Monitoring listen address.
    pub monitoring_addr: Option<SocketAddr>,
    /// gRPC keepalive interval.
    pub keepalive_interval: Duration,
    /// gRPC keepalive timeout.
    pub keepalive_timeout: Duration,
    /// Maximum server connection age.
    pub max_connection_age: Option<Duration>,
    /// Graceful shutdown limit.
    pub shutdown_duration: Duration,
    /// Names on istiod's serving certificate.
    pub istiod_sans: Vec<String>,
    /// Custom serving certificate, key and root files.
    pub custom_tls: Option<CustomTls>,
    /// istiod's instance ID for debug answers (`POD_NAME`, else the host
    /// name; Istio's `IstioControlPlaneInstance.ID`).
    pub pod_name: String,
}

/// Parses Go's listen address forms: `:15012`, `host:port`, `""` (disabled).
pub fn parse_listen_addr(flag: &str, s: &str) -> Result<Option<SocketAddr>, ListenAddrError> {
    if s.is_empty() {
        return Ok(None);
    }
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else if let Some(rest) = s.strip_prefix("localhost:") {
        format!("127.0.0.1:{rest}")
    } else {
        s.to_string()
    };
    full.parse().map(Some).map_err(|_| ListenAddrError {
        flag: flag.to_string(),
        value: s.to_string(),
    })
}

/// A listen address flag; an invalid one is reported and disabled.
pub(super) fn listen(flag: &str, value: &str, r: &mut Reader<'_>) -> Option<SocketAddr> {
    parse_listen_addr(flag, value).unwrap_or_else(|e| {
        r.error(ServingError::from(e).to_string());
        None
    })
}

/// Reads where and how istiod serves.
pub(super) fn parse(args: &DiscoveryArgs, r: &mut Reader<'_>) -> ServerConfig {
    let grpc_addr = listen("grpcAddr", &args.grpc_addr, r);
    let secure_grpc_addr = listen("secureGRPCAddr", &args.secure_grpc_addr, r);
    let http_addr = listen("httpAddr", &args.http_addr, r);
    let monitoring_addr = listen("monitoringAddr", &args.monitoring_addr, r);
    ServerConfig {
        grpc_addr,
        secure_grpc_addr,
        http_addr,
        monitoring_addr,
        keepalive_interval: args.keepalive_interval,
        keepalive_timeout: args.keepalive_timeout,
        max_connection_age: (!args.keepalive_max_server_connection_age.is_zero())
            .then_some(args.keepalive_max_server_connection_age),
        shutdown_duration: args.shutdown_duration,
        istiod_sans: istiod_sans(args, r),
        custom_tls: custom_tls(args, r),
        pod_name: pod_name(r),
    }
}

/// The names of istiod's Services in its namespace, and `ISTIOD_CUSTOM_HOST`.
fn istiod_sans(args: &DiscoveryArgs, r: &mut Reader<'_>) -> Vec<String> {
    let ns = &args.namespace;
    let mut sans = vec![
        format!("istiod.{ns}.svc"),
        format!("istiod-remote.{ns}.svc"),
        format!("istio-pilot.{ns}.svc"),
    ];
    if !args.domain.is_empty() {
        sans.push(format!("istiod.{ns}.svc.{}", args.domain));
    }
    // A revision's own Service, `istiod-<revision>` (Istio's getDNSNames).
    if let Some(rev) = r
        .opt_string(crate::webhooks::ENV_REVISION)
        .filter(|rev| !rev.is_empty() && rev != "default")
    {
        sans.push(format!("istiod-{rev}.{ns}.svc"));
    }
    if let Some(extra) = r.opt_string(ENV_ISTIOD_CUSTOM_HOST) {
        sans.extend(
            extra
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from),
        );
    }
    sans
}

fn custom_tls(args: &DiscoveryArgs, r: &mut Reader<'_>) -> Option<CustomTls> {
    if !args.ca_cert_file.is_empty() {
        r.error(ServingError::CaCertFile.to_string());
    }
    match (args.tls_cert_file.as_str(), args.tls_key_file.as_str()) {
        ("", "") => None,
        (c, k) if !c.is_empty() && !k.is_empty() => Some(CustomTls {
            cert: PathBuf::from(c),
            key: PathBuf::from(k),
        }),
        _ => {
            r.error(ServingError::TlsFilesPair.to_string());
            None
        }
    }
}

fn pod_name(r: &mut Reader<'_>) -> String {
    r.opt_string(ENV_POD_NAME)
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| "istiod".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_take_go_forms() {
        assert_eq!(
            parse_listen_addr("grpcAddr", ":15010"),
            Ok(Some("0.0.0.0:15010".parse().unwrap()))
        );
        assert_eq!(
            parse_listen_addr("httpAddr", "localhost:8080"),
            Ok(Some("127.0.0.1:8080".parse().unwrap()))
        );
        assert_eq!(parse_listen_addr("httpsAddr", ""), Ok(None));
        let err = parse_listen_addr("httpAddr", "8080").unwrap_err();
        assert_eq!(
            err,
            ListenAddrError {
                flag: "httpAddr".into(),
                value: "8080".into()
            }
        );
        assert_eq!(
            err.to_string(),
            "--httpAddr=\"8080\" is not a listen address (use :PORT or IP:PORT)"
        );
    }
}
