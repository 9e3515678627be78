//! Turns the agent's `Config` into the bootstrap renderer's inputs and writes
//! `<configPath>/envoy-rev.json`, as Istio's `bootstrap.New(...).CreateFile()`.

use std::path::PathBuf;

use common::AuthenticationPolicy;
use serde_json::{Map, Value};

use crate::bootstrap::{
    self, BootstrapOptions, ClientTls, ClusterName, HostPort, MetadataInputs, RemoteService,
    StatsInclusion, TlsMode, TracingServiceName, XdsApiType,
};
use crate::config::Config;

/// Why the bootstrap could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// An input was unusable.
    #[error("bootstrap: {0}")]
    Input(String),
    /// The file could not be written.
    #[error("writing the Envoy bootstrap {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

fn remote_service(
    what: &'static str,
    s: &crate::proxy_config::RemoteService,
) -> Result<Option<RemoteService>, WriteError> {
    if s.address.is_empty() {
        return Ok(None);
    }
    let address =
        HostPort::parse(what, &s.address).map_err(|e| WriteError::Input(e.to_string()))?;
    let tls = s.tls_settings.as_ref().map(|t| {
        let field = |k: &str| {
            t.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        ClientTls {
            mode: match field("mode").as_str() {
                "SIMPLE" => TlsMode::Simple,
                "MUTUAL" => TlsMode::Mutual,
                "ISTIO_MUTUAL" => TlsMode::IstioMutual,
                _ => TlsMode::Disable,
            },
            client_certificate: field("clientCertificate"),
            private_key: field("privateKey"),
            ca_certificates: field("caCertificates"),
            sni: field("sni"),
            subject_alt_names: t
                .get("subjectAltNames")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default(),
        }
    });
    Ok(Some(RemoteService { address, tls }))
}

/// The renderer's inputs for this agent.
pub fn options(config: &Config, log_as_json: bool) -> Result<BootstrapOptions, WriteError> {
    let pc = &config.envoy.proxy_config;
    let (pod, envoy, ports) = (&config.pod, &config.envoy, &config.envoy.ports);
    let discovery_address = &config.xds_proxy.discovery_address;
    let proxy_config = match serde_json::to_value(pc) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let discovery_host = discovery_address
        .rsplit_once(':')
        .map(|(h, _)| h)
        .unwrap_or(discovery_address);
    let pilot_san = if pc.control_plane_auth_policy == Some(AuthenticationPolicy::None) {
        Vec::new()
    } else if discovery_host.contains("localhost") {
        vec!["istiod.istio-system.svc".to_string()]
    } else {
        vec![discovery_host.to_string()]
    };
    let metadata = bootstrap::build_node_metadata(&MetadataInputs {
        env: pod.metadata_env.clone(),
        proxy_metadata: pc.proxy_metadata.clone(),
        proxy_config,
        istio_version: crate::VERSION.to_string(),
        instance_ips: pod.ips.clone(),
        sts_port: envoy.sts_port,
        envoy_status_port: ports.status,
        envoy_prometheus_port: ports.prometheus,
        envoy_secure_metrics_port: ports.secure_metrics,
        envoy_secure_merged_metrics_port: ports.secure_merged_metrics,
        exit_on_zero_active_connections: envoy.drain.exit_on_zero_active_connections,
        metadata_discovery: false,
        envoy_skip_deprecated_logs: envoy.options.skip_deprecated_logs,
        workload_identity_socket_file: config.identity.sds_socket_file.clone(),
        pod_labels: (!pod.labels.is_empty()).then(|| pod.labels.clone()),
        annotations: pod.annotations.clone(),
        pilot_san,
        outlier_log_path: envoy.outlier_log_path.clone(),
        credential_socket_exists: false,
    });
    let service_cluster = pc
        .service_cluster
        .clone()
        .filter(|s| s != "istio-proxy")
        .unwrap_or_else(|| envoy.service_cluster_flag.clone());
    let cluster_name = match pc.tracing_service_name.as_deref() {
        Some("CANONICAL_NAME_ONLY") => {
            ClusterName::TracingServiceName(TracingServiceName::CanonicalNameOnly)
        }
        Some("CANONICAL_NAME_AND_NAMESPACE") => {
            ClusterName::TracingServiceName(TracingServiceName::CanonicalNameAndNamespace)
        }
        _ => ClusterName::ServiceCluster(service_cluster),
    };
    let cluster = bootstrap::service_cluster(&cluster_name, &metadata);
    let locality = bootstrap::node_locality(&metadata).unwrap_or_default();
    let zipkin_address = pc
        .tracing
        .as_ref()
        .and_then(|t| t.get("zipkin"))
        .and_then(|z| z.get("address"))
        .and_then(Value::as_str)
        .map(|a| {
            HostPort::parse(
                "tracing.zipkin.address",
                &a.replace("$(HOST_IP)", &pod.host_ip),
            )
        })
        .transpose()
        .map_err(|e| WriteError::Input(e.to_string()))?;
    let statsd_address = pc
        .statsd_udp_address
        .as_deref()
        .filter(|a| !a.is_empty())
        .map(|a| HostPort::parse("statsdUdpAddress", a))
        .transpose()
        .map_err(|e| WriteError::Input(e.to_string()))?;
    let matcher = pc.proxy_stats_matcher.clone().unwrap_or_default();
    Ok(BootstrapOptions {
        node_id: pod.node_id.clone(),
        cluster,
        locality,
        global_downstream_max_connections: bootstrap::global_downstream_max_connections(
            None,
            &pc.proxy_metadata,
            &pc.runtime_values,
        ),
        metadata: metadata.to_json_object(),
        proxy_admin_port: pc.admin_port(),
        status_port: pc.status_port(),
        envoy_status_port: ports.status,
        envoy_prometheus_port: ports.prometheus,
        envoy_secure_metrics_port: ports.secure_metrics,
        envoy_secure_merged_metrics_port: ports.secure_merged_metrics,
        config_path: PathBuf::from(pc.config_path()),
        workload_identity_socket_file: config.identity.sds_socket_file.clone(),
        xds_api_type: XdsApiType::from_delta(config.xds_proxy.delta),
        all_ipv6: pod.all_ipv6(),
        outlier_log_path: envoy.outlier_log_path.clone(),
        statsd_address,
        zipkin_address,
        envoy_metrics_service: pc
            .envoy_metrics_service
            .as_ref()
            .map(|s| remote_service("envoyMetricsService.address", s))
            .transpose()?
            .flatten(),
        envoy_access_log_service: pc
            .envoy_access_log_service
            .as_ref()
            .map(|s| remote_service("envoyAccessLogService.address", s))
            .transpose()?
            .flatten(),
        stats_inclusion: StatsInclusion {
            prefixes: matcher.inclusion_prefixes,
            suffixes: matcher.inclusion_suffixes,
            regexps: matcher.inclusion_regexps,
        },
        extra_stat_tags: pc.extra_stat_tags.clone(),
        exit_on_zero_active_connections: envoy.drain.exit_on_zero_active_connections,
        runtime_values: pc.runtime_values.clone(),
        stats_compression: true,
        log_as_json,
    })
}

/// Renders and writes the bootstrap; returns the file's path. A
/// `customConfigFile` is used as it is, as in Istio.
pub fn write(config: &Config, log_as_json: bool) -> Result<PathBuf, WriteError> {
    if let Some(custom) = config
        .envoy
        .proxy_config
        .custom_config_file
        .as_deref()
        .filter(|c| !c.is_empty())
    {
        return Ok(PathBuf::from(custom));
    }
    let opts = options(config, log_as_json)?;
    let json = bootstrap::render(&opts);
    let dir = PathBuf::from(config.envoy.proxy_config.config_path());
    let io = |path: &std::path::Path| {
        let path = path.display().to_string();
        move |source| WriteError::Io { path, source }
    };
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io(&dir))?;
    }
    let path = dir.join("envoy-rev.json");
    let text = serde_json::to_string_pretty(&json).map_err(|e| WriteError::Input(e.to_string()))?;
    std::fs::write(&path, text).map_err(io(&path))?;
    Ok(path)
}
