//! Envoy: the effective ProxyConfig, Envoy's command line, the ports its
//! bootstrap opens for Istio, how it is drained on termination, and the
//! deprecated flags that only reach its bootstrap.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::ProxyType;

use super::pod::PodConfig;
use super::vars::Vars;
use super::*;
use crate::envoy::{DrainSettings, EnvoyOptions};
use crate::proxy_config::ProxyConfig;

/// The listeners Istio's bootstrap gives Envoy besides the application's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct EnvoyPorts {
    /// `ENVOY_STATUS_PORT`: readiness (15021).
    pub status: u16,
    /// `ENVOY_PROMETHEUS_PORT`: Prometheus (15090).
    pub prometheus: u16,
    /// `ENVOY_SECURE_METRICS_PORT`: mTLS Envoy-only stats (0 = off).
    pub secure_metrics: u16,
    /// `ENVOY_SECURE_MERGED_METRICS_PORT`: mTLS merged stats (0 = off).
    pub secure_merged_metrics: u16,
}

/// Everything about running Envoy.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EnvoyConfig {
    /// The effective ProxyConfig.
    pub proxy_config: ProxyConfig,
    /// Envoy's command-line options (the bootstrap path is set at start).
    #[serde(skip)]
    pub options: EnvoyOptions,
    /// Istio's own listener ports.
    pub ports: EnvoyPorts,
    /// How Envoy is drained on termination.
    pub drain: DrainSettings,
    /// `--outlierLogPath`.
    pub outlier_log_path: String,
    /// `--stsPort` (node metadata only).
    pub sts_port: u16,
    /// `--serviceCluster`.
    pub service_cluster_flag: String,
}

/// Reads the ProxyConfig layers and Envoy's settings.
pub(super) fn parse(
    v: &mut Vars<'_>,
    args: &ProxyArgs,
    proxy_type: ProxyType,
    pod: &PodConfig,
) -> EnvoyConfig {
    let proxy_config_env = v.opt_string(ENV_PROXY_CONFIG);
    let proxy_config = match crate::proxy_config::construct(
        &args.mesh_config,
        proxy_config_env.as_deref(),
        &pod.annotations,
    ) {
        Ok(p) => p,
        Err(e) => {
            v.error(e);
            ProxyConfig::defaults()
        }
    };
    let ports = EnvoyPorts {
        status: v.parse(ENV_ENVOY_STATUS_PORT, 15021u16),
        prometheus: v.parse(ENV_ENVOY_PROMETHEUS_PORT, 15090u16),
        secure_metrics: v.parse(ENV_ENVOY_SECURE_METRICS_PORT, 0u16),
        secure_merged_metrics: v.parse(ENV_ENVOY_SECURE_MERGED_METRICS_PORT, 0u16),
    };
    let minimum_drain_duration = v.duration(ENV_MINIMUM_DRAIN_DURATION, Duration::from_secs(5));
    let exit_on_zero_active_connections = v.bool(ENV_EXIT_ON_ZERO_ACTIVE_CONNECTIONS, false);
    // Envoy's admin listens on the bootstrap's `localhost`: `::1` when every
    // Pod IP is IPv6.
    let admin_ip = if pod.all_ipv6() {
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    };
    let drain = DrainSettings {
        admin: SocketAddr::new(admin_ip, proxy_config.admin_port()),
        inbound_only: proxy_type == ProxyType::Sidecar,
        termination_drain_duration: proxy_config.termination_drain_duration(),
        exit_on_zero_active_connections,
        minimum_drain_duration,
        excluded_ports: vec![
            ports.status,
            ports.prometheus,
            ports.secure_metrics,
            ports.secure_merged_metrics,
        ],
    };
    let options = options(v, args, &proxy_config, pod);
    EnvoyConfig {
        proxy_config,
        options,
        ports,
        drain,
        outlier_log_path: args.outlier_log_path.clone(),
        sts_port: args.sts_port,
        service_cluster_flag: args.service_cluster.clone(),
    }
}

/// Envoy's command line, from the flags, the ProxyConfig and the environment.
fn options(
    v: &mut Vars<'_>,
    args: &ProxyArgs,
    proxy_config: &ProxyConfig,
    pod: &PodConfig,
) -> EnvoyOptions {
    let cpu_limit: u32 = v.parse(ENV_CPU_LIMIT, 0);
    let concurrency = if args.concurrency > 0 {
        args.concurrency
    } else {
        proxy_config
            .concurrency
            .filter(|c| *c > 0)
            .unwrap_or(cpu_limit)
    };
    let config_yaml = v.opt_string(ENV_BOOTSTRAP_OVERRIDE).and_then(|path| {
        crate::envoy::read_bootstrap_override(Path::new(&path), &pod.host_ip)
            .map_err(|e| v.error(e))
            .ok()
    });
    EnvoyOptions {
        binary: proxy_config.binary_path().to_string(),
        config_file: PathBuf::from(proxy_config.config_path()).join("envoy-rev.json"),
        drain_duration: proxy_config.drain_duration(),
        ipv6: pod.ips.iter().all(|ip| ip.contains(':')),
        file_flush_interval: proxy_config
            .file_flush_interval
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(1)),
        file_flush_min_size_kb: proxy_config.file_flush_min_size_kb.unwrap_or(0),
        log_level: args.proxy_log_level.clone(),
        component_log_level: args.proxy_component_log_level.clone(),
        skip_deprecated_logs: v.bool(ENV_ENVOY_SKIP_DEPRECATED_LOGS, true),
        enable_core_dump: v.bool(ENV_ENVOY_ENABLE_CORE_DUMP, false),
        config_yaml,
        concurrency,
    }
}
