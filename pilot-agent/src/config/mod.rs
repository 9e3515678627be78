//! The agent's configuration: the flags Istio's injection template passes to
//! `pilot-agent proxy` and the environment variables the agent reads, with
//! Istio's names and defaults.
//!
//! [`Config`] is nested by part, as linkerd2-proxy nests its own: the Pod
//! ([`PodConfig`]), the workload identity ([`IdentityConfig`]), Envoy
//! ([`EnvoyConfig`]), the xDS proxy ([`XdsProxyConfig`]), the status server
//! ([`StatusConfig`]) and the DNS proxy ([`DnsConfig`]), each read and
//! validated by its own module here. Every part's parser pushes into one
//! list, so [`Config::from_env`] reports every invalid value at once, each
//! naming its variable.

mod dns;
mod envoy;
mod error;
mod identity;
mod pod;
mod status;
mod vars;
mod xds_proxy;

use std::path::PathBuf;

use common::ProxyType;
use common::env::Env;

pub use dns::DnsConfig;
pub use envoy::{EnvoyConfig, EnvoyPorts};
pub use error::{AppProberError, ConfigError, ConfigErrors, ScrapeConfigError};
pub use identity::{CertSource, IdentityConfig};
pub use pod::{PodConfig, all_ipv6};
pub use status::{
    APP_PROBER_PREFIXES, AppProbe, AppProbes, ScrapeTarget, StatusConfig, parse_app_probers,
    parse_scrape_targets,
};
pub use xds_proxy::XdsProxyConfig;

/// `POD_NAME`.
pub const ENV_POD_NAME: &str = "POD_NAME";
/// `POD_NAMESPACE`: the workload's namespace (identity, node id).
pub const ENV_POD_NAMESPACE: &str = "POD_NAMESPACE";
/// `SERVICE_ACCOUNT`: the workload's service account (identity).
pub const ENV_SERVICE_ACCOUNT: &str = "SERVICE_ACCOUNT";
/// `TRUST_DOMAIN`: SPIFFE trust domain (`cluster.local`).
pub const ENV_TRUST_DOMAIN: &str = "TRUST_DOMAIN";
/// `CA_ADDR`: the CA endpoint; defaults to the discovery address.
pub const ENV_CA_ADDR: &str = "CA_ADDR";
/// `ISTIOD_SAN`: TLS server name to verify for istiod.
pub const ENV_ISTIOD_SAN: &str = "ISTIOD_SAN";
/// `CA_ROOT_CA`: root for the CA connection (`SYSTEM` = OS roots).
pub const ENV_CA_ROOT_CA: &str = "CA_ROOT_CA";
/// `PILOT_CERT_PROVIDER`: `istiod` (default), `custom` or `none`.
pub const ENV_PILOT_CERT_PROVIDER: &str = "PILOT_CERT_PROVIDER";
/// `PROV_CERT`: directory of provisioning certificates (VMs).
pub const ENV_PROV_CERT: &str = "PROV_CERT";
/// `ISTIO_META_CLUSTER_ID`: sent as the `ClusterID` header.
pub const ENV_CLUSTER_ID: &str = "ISTIO_META_CLUSTER_ID";
/// `ISTIO_META_CERT_SIGNER`: CSR metadata `CertSigner`.
pub const ENV_CERT_SIGNER: &str = "ISTIO_META_CERT_SIGNER";
/// `CA_HEADER_<NAME>`: extra gRPC metadata on CSR calls.
pub const ENV_CA_HEADER_PREFIX: &str = "CA_HEADER_";
/// `SECRET_TTL`: requested certificate lifetime (24h).
pub const ENV_SECRET_TTL: &str = "SECRET_TTL";
/// `SECRET_GRACE_PERIOD_RATIO`: rotate when this share of the lifetime remains (0.5).
pub const ENV_SECRET_GRACE_PERIOD_RATIO: &str = "SECRET_GRACE_PERIOD_RATIO";
/// `SECRET_GRACE_PERIOD_RATIO_JITTER`: random spread on the ratio (0.01).
pub const ENV_SECRET_GRACE_PERIOD_RATIO_JITTER: &str = "SECRET_GRACE_PERIOD_RATIO_JITTER";
/// `WORKLOAD_RSA_KEY_SIZE`: RSA key size (2048).
pub const ENV_WORKLOAD_RSA_KEY_SIZE: &str = "WORKLOAD_RSA_KEY_SIZE";
/// `ECC_SIGNATURE_ALGORITHM`: `ECDSA` selects an EC key.
pub const ENV_ECC_SIGNATURE_ALGORITHM: &str = "ECC_SIGNATURE_ALGORITHM";
/// `ECC_CURVE`: `P256` (default) or `P384`.
pub const ENV_ECC_CURVE: &str = "ECC_CURVE";
/// `OUTPUT_CERTS`: directory to write `key.pem`, `cert-chain.pem`, `root-cert.pem`.
pub const ENV_OUTPUT_CERTS: &str = "OUTPUT_CERTS";
/// `FILE_MOUNTED_CERTS`: serve `./etc/certs/*` instead of asking the CA.
pub const ENV_FILE_MOUNTED_CERTS: &str = "FILE_MOUNTED_CERTS";
/// `WORKLOAD_IDENTITY_SOCKET_FILE`: SDS socket file name (`socket`).
pub const ENV_WORKLOAD_IDENTITY_SOCKET_FILE: &str = "WORKLOAD_IDENTITY_SOCKET_FILE";
/// `KUBERNETES_SERVICE_HOST`: set in a cluster; output files are then 0644.
pub const ENV_KUBERNETES_SERVICE_HOST: &str = "KUBERNETES_SERVICE_HOST";

/// `INSTANCE_IP`: the Pod IP (node id, app probes).
pub const ENV_INSTANCE_IP: &str = "INSTANCE_IP";
/// `HOST_IP`: the node IP, substituted for `$(HOST_IP)`.
pub const ENV_HOST_IP: &str = "HOST_IP";
/// `PROXY_CONFIG`: ProxyConfig YAML/JSON merged over the mesh default.
pub const ENV_PROXY_CONFIG: &str = "PROXY_CONFIG";
/// `ISTIO_BOOTSTRAP_OVERRIDE`: a YAML/JSON file passed to Envoy as `--config-yaml`.
pub const ENV_BOOTSTRAP_OVERRIDE: &str = "ISTIO_BOOTSTRAP_OVERRIDE";
/// `ENVOY_STATUS_PORT`: Envoy's readiness listener (15021).
pub const ENV_ENVOY_STATUS_PORT: &str = "ENVOY_STATUS_PORT";
/// `ENVOY_PROMETHEUS_PORT`: Envoy's Prometheus listener (15090).
pub const ENV_ENVOY_PROMETHEUS_PORT: &str = "ENVOY_PROMETHEUS_PORT";
/// `ENVOY_SECURE_METRICS_PORT`: mTLS Envoy-only stats listener (0 = off).
pub const ENV_ENVOY_SECURE_METRICS_PORT: &str = "ENVOY_SECURE_METRICS_PORT";
/// `ENVOY_SECURE_MERGED_METRICS_PORT`: mTLS merged stats listener (0 = off).
pub const ENV_ENVOY_SECURE_MERGED_METRICS_PORT: &str = "ENVOY_SECURE_MERGED_METRICS_PORT";
/// `MINIMUM_DRAIN_DURATION`: wait before polling connections (5s).
pub const ENV_MINIMUM_DRAIN_DURATION: &str = "MINIMUM_DRAIN_DURATION";
/// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`: drain until no connection is open.
pub const ENV_EXIT_ON_ZERO_ACTIVE_CONNECTIONS: &str = "EXIT_ON_ZERO_ACTIVE_CONNECTIONS";
/// `ENVOY_SKIP_DEPRECATED_LOGS`: `--skip-deprecated-logs` (true).
pub const ENV_ENVOY_SKIP_DEPRECATED_LOGS: &str = "ENVOY_SKIP_DEPRECATED_LOGS";
/// `ISTIO_ENVOY_ENABLE_CORE_DUMP`: `--enable-core-dump`.
pub const ENV_ENVOY_ENABLE_CORE_DUMP: &str = "ISTIO_ENVOY_ENABLE_CORE_DUMP";
/// `ISTIO_DELTA_XDS`: Delta ADS in the bootstrap (true).
pub const ENV_DELTA_XDS: &str = "ISTIO_DELTA_XDS";
/// `ISTIO_CPU_LIMIT`: concurrency when ProxyConfig sets none.
pub const ENV_CPU_LIMIT: &str = "ISTIO_CPU_LIMIT";
/// `ISTIO_KUBE_APP_PROBERS`: rewritten application probes (JSON).
pub const ENV_KUBE_APP_PROBERS: &str = "ISTIO_KUBE_APP_PROBERS";
/// `ISTIO_PROMETHEUS_ANNOTATIONS`: the application's scrape target (JSON).
pub const ENV_PROMETHEUS_ANNOTATIONS: &str = "ISTIO_PROMETHEUS_ANNOTATIONS";

/// `XDS_ROOT_CA`: root for the istiod xDS connection (`SYSTEM` = OS roots).
pub const ENV_XDS_ROOT_CA: &str = "XDS_ROOT_CA";
/// `XDS_HEADER_<NAME>`: extra gRPC metadata on the upstream xDS stream.
pub const ENV_XDS_HEADER_PREFIX: &str = "XDS_HEADER_";
/// `GRPC_KEEPALIVE_INTERVAL`: idle time before a gRPC keepalive PING (30s).
pub const ENV_GRPC_KEEPALIVE_INTERVAL: &str = "GRPC_KEEPALIVE_INTERVAL";
/// `GRPC_KEEPALIVE_TIMEOUT`: how long a keepalive PING may go unanswered (10s).
pub const ENV_GRPC_KEEPALIVE_TIMEOUT: &str = "GRPC_KEEPALIVE_TIMEOUT";

/// `ISTIO_META_DNS_CAPTURE`: run the DNS proxy (sidecars).
pub const ENV_DNS_CAPTURE: &str = "ISTIO_META_DNS_CAPTURE";
/// `DNS_PROXY_ADDR`: where the DNS proxy listens (`localhost:15053`).
pub const ENV_DNS_PROXY_ADDR: &str = "DNS_PROXY_ADDR";

/// Istio's discovery address default.
pub const DEFAULT_DISCOVERY_ADDRESS: &str = "istiod.istio-system.svc:15012";
/// Istio's projected token path.
pub const TOKEN_PATH: &str = "./var/run/secrets/tokens/istio-token";
/// The `istio-ca-root-cert` ConfigMap mount.
pub const DEFAULT_ROOT_CERT_PATH: &str = "./var/run/secrets/istio/root-cert.pem";
/// The SDS socket directory.
pub const SDS_SOCKET_DIR: &str = "./var/run/secrets/workload-spiffe-uds";
/// File-mounted certificates directory.
pub const FILE_CERTS_DIR: &str = "./etc/certs";
/// Workload certificate files that switch the agent to file mode when all present.
pub const WORKLOAD_CREDENTIALS_DIR: &str = "./var/run/secrets/workload-spiffe-credentials";

/// The flags of `pilot-agent proxy`, as Istio's injection template passes them.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ProxyArgs {
    /// Proxy type: `sidecar` (default) or `router`.
    #[arg(default_value = "sidecar")]
    pub proxy_type: String,
    /// DNS domain suffix; `${POD_NAMESPACE}.svc.cluster.local` when empty.
    #[arg(long = "domain", default_value = "")]
    pub domain: String,
    /// Mesh config file; only `defaultConfig` matters.
    #[arg(long = "meshConfig", default_value = "./etc/istio/config/mesh")]
    pub mesh_config: PathBuf,
    /// STS port (metadata only).
    #[arg(long = "stsPort", default_value = "0")]
    pub sts_port: u16,
    /// Accepted, unused (as in Istio).
    #[arg(long = "tokenManagerPlugin", default_value = "")]
    pub token_manager_plugin: String,
    /// Deprecated service cluster name.
    #[arg(long = "serviceCluster", default_value = "istio-proxy")]
    pub service_cluster: String,
    /// Envoy log level, optionally with `component:level` pairs.
    #[arg(long = "proxyLogLevel", default_value = "warning")]
    pub proxy_log_level: String,
    /// Envoy component log levels.
    #[arg(long = "proxyComponentLogLevel", default_value = "")]
    pub proxy_component_log_level: String,
    /// Envoy worker threads (legacy override).
    #[arg(long = "concurrency", default_value = "0")]
    pub concurrency: u32,
    /// Bootstrap template path.
    #[arg(long = "templateFile", default_value = "")]
    pub template_file: String,
    /// Outlier detection log path.
    #[arg(long = "outlierLogPath", default_value = "")]
    pub outlier_log_path: String,
    /// `--profiling`: Istio serves Go's pprof on the status port with it.
    /// Accepted so that Istio's arguments start the agent; Go's profiles
    /// have no equivalent here.
    #[arg(long = "profiling", default_value = "true", num_args = 0..=1, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub profiling: bool,
}

/// The agent's effective configuration, by part.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The positional proxy type: `sidecar` or `router`.
    pub proxy_type: ProxyType,
    /// The Pod the agent runs in.
    pub pod: PodConfig,
    /// The workload identity and its certificate.
    pub identity: IdentityConfig,
    /// Envoy: ProxyConfig, command line, ports, drain.
    pub envoy: EnvoyConfig,
    /// The xDS proxy between Envoy and istiod.
    pub xds_proxy: XdsProxyConfig,
    /// The status server.
    pub status: StatusConfig,
    /// The DNS proxy.
    pub dns: DnsConfig,
}

impl Config {
    /// Builds the configuration from the command line and environment;
    /// every invalid value is reported in one [`ConfigErrors`].
    pub fn from_env(args: &ProxyArgs, env: &dyn Env) -> Result<Self, ConfigErrors> {
        let mut v = vars::Vars::new(env);
        // Istio's agent runs as a sidecar or a gateway (`router`) only.
        let proxy_type = match args.proxy_type.parse() {
            Ok(t @ (ProxyType::Sidecar | ProxyType::Router)) => t,
            _ => {
                v.error(ConfigError::ProxyType(args.proxy_type.clone()));
                ProxyType::Sidecar
            }
        };
        // Istio flags whose features are not built: refused when set.
        for (flag, value, reason) in [
            (
                "--templateFile",
                &args.template_file,
                "custom bootstrap templates are not supported; the agent writes Istio's bootstrap",
            ),
            (
                "--tokenManagerPlugin",
                &args.token_manager_plugin,
                "token exchange plugins (GoogleTokenExchange) are not built",
            ),
        ] {
            if !value.is_empty() {
                v.error(ConfigError::Invalid {
                    var: flag,
                    value: value.clone(),
                    reason: reason.into(),
                });
            }
        }
        let pod = pod::parse(&mut v, args);
        let envoy = envoy::parse(&mut v, args, proxy_type, &pod);
        let pod_ip = pod.ips.first().map_or("localhost", String::as_str);
        let xds_proxy = xds_proxy::parse(&mut v, &envoy.proxy_config, pod_ip);
        let identity = identity::parse(&mut v, &pod, &xds_proxy.discovery_address);
        let status = status::parse(&mut v, proxy_type, envoy.proxy_config.status_port());
        let dns = dns::parse(&mut v, proxy_type);
        let errors = v.into_errors();
        if !errors.is_empty() {
            return Err(ConfigErrors(errors));
        }
        Ok(Self {
            proxy_type,
            pod,
            identity,
            envoy,
            xds_proxy,
            status,
            dns,
        })
    }
}

/// Serialises a value by its `Display` form (the SPIFFE identity) for the
/// logged configuration.
fn serialize_display<T: std::fmt::Display, S: serde::Serializer>(
    value: &T,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_str(value)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use common::env::MapEnv;
    use common::pki::KeyType;

    use super::*;

    fn args() -> ProxyArgs {
        ProxyArgs {
            proxy_type: "sidecar".into(),
            ..Default::default()
        }
    }

    #[test]
    fn istio_defaults() {
        let env = MapEnv::from_pairs([("POD_NAMESPACE", "ns"), ("SERVICE_ACCOUNT", "sa")]);
        let c = Config::from_env(&args(), &env).unwrap();
        assert_eq!(c.identity.ca_addr, "istiod.istio-system.svc:15012");
        assert_eq!(c.identity.ca_server_name, "istiod.istio-system.svc");
        assert_eq!(
            c.identity.ca_root_path,
            Some(PathBuf::from("./var/run/secrets/istio/root-cert.pem"))
        );
        assert_eq!(c.identity.key_type, KeyType::Rsa(2048));
        assert_eq!(c.identity.secret_ttl, Duration::from_secs(86400));
        assert_eq!(
            c.identity.workload.to_string(),
            "spiffe://cluster.local/ns/ns/sa/sa"
        );
        assert_eq!(
            c.identity.sds_socket,
            PathBuf::from("./var/run/secrets/workload-spiffe-uds/socket")
        );
    }

    #[test]
    fn ca_addr_sets_server_name_and_plaintext() {
        let env = MapEnv::from_pairs([
            ("POD_NAMESPACE", "ns"),
            ("SERVICE_ACCOUNT", "sa"),
            ("CA_ADDR", "localhost:15012"),
            ("ISTIOD_SAN", "ignored.when.ca.addr.set"),
            ("ECC_SIGNATURE_ALGORITHM", "ECDSA"),
            ("CA_HEADER_X_Foo", "bar"),
        ]);
        let c = Config::from_env(&args(), &env).unwrap();
        assert_eq!(c.identity.ca_server_name, "localhost");
        assert_eq!(c.identity.key_type, KeyType::EcdsaP256);
        assert_eq!(
            c.identity.ca_headers,
            vec![("x_foo".to_string(), "bar".to_string())]
        );
        let env = MapEnv::from_pairs([
            ("POD_NAMESPACE", "ns"),
            ("SERVICE_ACCOUNT", "sa"),
            ("CA_ADDR", "istiod:15010"),
        ]);
        assert_eq!(
            Config::from_env(&args(), &env)
                .unwrap()
                .identity
                .ca_root_path,
            None
        );
    }

    #[test]
    fn grpc_keepalive_comes_from_istios_variables() {
        let base = [("POD_NAMESPACE", "ns"), ("SERVICE_ACCOUNT", "sa")];
        let config = Config::from_env(&args(), &MapEnv::from_pairs(base)).unwrap();
        assert_eq!(
            config.xds_proxy.keepalive,
            common::tls::GrpcKeepalive::default()
        );
        let env = MapEnv::from_pairs(base.into_iter().chain([
            ("GRPC_KEEPALIVE_INTERVAL", "2s"),
            ("GRPC_KEEPALIVE_TIMEOUT", "500ms"),
        ]));
        let keepalive = Config::from_env(&args(), &env).unwrap().xds_proxy.keepalive;
        assert_eq!(keepalive.interval, std::time::Duration::from_secs(2));
        assert_eq!(keepalive.timeout, std::time::Duration::from_millis(500));
        let env = MapEnv::from_pairs(base.into_iter().chain([("GRPC_KEEPALIVE_TIMEOUT", "x")]));
        let err = Config::from_env(&args(), &env).unwrap_err().to_string();
        assert!(err.contains("GRPC_KEEPALIVE_TIMEOUT"), "{err}");
    }

    #[test]
    fn reports_every_bad_value() {
        let env = MapEnv::from_pairs([
            ("SECRET_TTL", "soon"),
            ("ECC_CURVE", "P999"),
            ("ECC_SIGNATURE_ALGORITHM", "ECDSA"),
            ("WORKLOAD_IDENTITY_SOCKET_FILE", "a/b"),
        ]);
        let err = Config::from_env(&args(), &env).unwrap_err().to_string();
        for want in [
            "SECRET_TTL",
            "ECC_CURVE",
            "WORKLOAD_IDENTITY_SOCKET_FILE",
            "POD_NAMESPACE",
            "SERVICE_ACCOUNT",
        ] {
            assert!(err.contains(want), "{want} missing from {err}");
        }
    }

    #[test]
    fn flags_of_features_that_are_not_built_are_refused() {
        let a = ProxyArgs {
            template_file: "/etc/istio/custom-bootstrap/envoy.json".into(),
            token_manager_plugin: "GoogleTokenExchange".into(),
            ..args()
        };
        let err = Config::from_env(&a, &MapEnv::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("--templateFile=\"/etc/istio/custom-bootstrap/envoy.json\": custom bootstrap templates"), "{err}");
        assert!(
            err.contains("--tokenManagerPlugin=\"GoogleTokenExchange\""),
            "{err}"
        );
    }

    #[test]
    fn a_bad_prober_scrape_target_and_duration_are_reported_together() {
        let env = MapEnv::from_pairs([
            ("POD_NAMESPACE", "ns"),
            ("SERVICE_ACCOUNT", "sa"),
            ("ISTIO_KUBE_APP_PROBERS", "{not json"),
            ("ISTIO_PROMETHEUS_ANNOTATIONS", r#"{"port":"15090"}"#),
            ("SECRET_TTL", "x"),
        ]);
        let err = Config::from_env(&args(), &env).unwrap_err();
        assert_eq!(err.0.len(), 3, "{err}");
        assert!(
            err.0
                .iter()
                .any(|e| matches!(e, ConfigError::AppProber(AppProberError::Decode { .. }))),
            "{err}"
        );
        assert!(
            err.0.iter().any(|e| matches!(
                e,
                ConfigError::Scrape(ScrapeConfigError::ReservedPort { .. })
            )),
            "{err}"
        );
        assert!(
            err.0.iter().any(|e| matches!(
                e,
                ConfigError::Duration {
                    var: ENV_SECRET_TTL,
                    ..
                }
            )),
            "{err}"
        );
        // One line each, naming the variable.
        let text = err.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("ISTIO_KUBE_APP_PROBERS: failed to decode app prober")),
            "{text}"
        );
        assert!(
            lines.iter().any(|l| l.starts_with(
                "ISTIO_PROMETHEUS_ANNOTATIONS: invalid prometheus scrape configuration: target port 15090 is reserved"
            )),
            "{text}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(r#"SECRET_TTL: invalid duration "x""#)),
            "{text}"
        );
    }

    #[test]
    fn every_invalid_probe_and_scrape_target_is_reported() {
        let env = MapEnv::from_pairs([
            ("POD_NAMESPACE", "ns"),
            ("SERVICE_ACCOUNT", "sa"),
            (
                "ISTIO_KUBE_APP_PROBERS",
                r#"{"/bad": {"tcpSocket": {"port": 1}}}"#,
            ),
            ("ISTIO_PROMETHEUS_ANNOTATIONS", r#"{"port":"15090"}"#),
        ]);
        let err = Config::from_env(&args(), &env).unwrap_err();
        assert_eq!(err.0.len(), 2, "{err}");
    }

    #[test]
    fn parts_hold_the_parsed_values() {
        let env = MapEnv::from_pairs([
            ("POD_NAMESPACE", "ns"),
            ("SERVICE_ACCOUNT", "sa"),
            ("INSTANCE_IP", "10.0.0.1"),
            (
                "ISTIO_KUBE_APP_PROBERS",
                r#"{"/app-health/app/readyz": {"tcpSocket": {"port": 8080}}}"#,
            ),
            ("ISTIO_PROMETHEUS_ANNOTATIONS", r#"{"port":"9090"}"#),
            ("ISTIO_META_DNS_CAPTURE", "true"),
        ]);
        let c = Config::from_env(&args(), &env).unwrap();
        assert_eq!(c.proxy_type, ProxyType::Sidecar);
        assert!(
            c.pod
                .node_id
                .starts_with("sidecar~10.0.0.1~.ns~ns.svc.cluster.local")
        );
        assert_eq!(
            c.status.app_probers["/app-health/app/readyz"],
            AppProbe::Tcp {
                port: 8080,
                timeout: None
            }
        );
        assert_eq!(
            c.status.scrape_targets,
            vec![ScrapeTarget {
                port: 9090,
                path: "/metrics".into()
            }]
        );
        assert!(c.dns.capture);
        assert!(c.envoy.drain.inbound_only);
        assert_eq!(c.envoy.drain.admin.to_string(), "127.0.0.1:15000");
        // The effective config is logged as JSON.
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["proxy_type"], "sidecar");
        assert_eq!(
            json["identity"]["workload"],
            "spiffe://cluster.local/ns/ns/sa/sa"
        );
        assert_eq!(
            json["envoy"]["proxy_config"]["controlPlaneAuthPolicy"],
            "MUTUAL_TLS"
        );

        // A gateway neither captures DNS nor merges application metrics.
        let router = ProxyArgs {
            proxy_type: "router".into(),
            ..Default::default()
        };
        let c = Config::from_env(&router, &env).unwrap();
        assert!(!c.dns.capture && c.status.scrape_targets.is_empty());
        assert!(!c.envoy.drain.inbound_only);
        let err = Config::from_env(
            &ProxyArgs {
                proxy_type: "waypoint".into(),
                ..Default::default()
            },
            &env,
        )
        .unwrap_err();
        assert!(matches!(err.0[..], [ConfigError::ProxyType(_)]), "{err}");
    }
}
