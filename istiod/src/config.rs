//! istiod's configuration: the flags of `pilot-discovery discovery` (Istio's
//! names and defaults) and the environment variables it reads.
//!
//! [`Config`] is nested by part, as the agent's is: where istiod serves
//! ([`ServerConfig`]), the mesh it serves ([`MeshSettings`]), where config
//! and services come from ([`RegistryConfig`]), the CA and its
//! authenticators ([`CaConfig`]), the webhooks ([`WebhookConfig`]), push
//! tuning ([`PushConfig`]), the XDS cache, WorkloadEntry auto-registration
//! and Istio's feature flags, each read and validated by its own module
//! here. Every part reports into one [`Reader`], so [`Config::from_args`]
//! reports every invalid flag and variable at once, one line each, naming
//! it.

mod args;
mod autoregistration;
mod ca;
mod features;
mod mesh;
mod push;
mod registry;
mod serving;
mod xds_cache;

use common::env::{ConfigErrors, Env, Reader};

pub use args::DiscoveryArgs;
pub use ca::{
    CaConfig, CaConfigError, DEFAULT_MAX_WORKLOAD_CERT_TTL, DEFAULT_SELF_SIGNED_CA_CERT_TTL,
    DEFAULT_WORKLOAD_CERT_TTL, ENV_DEFAULT_WORKLOAD_CERT_TTL, ENV_JWT_POLICY, ENV_JWT_RULE,
    ENV_MAX_WORKLOAD_CERT_TTL, ENV_ROOT_CA_DIR, ENV_SELF_SIGNED_CA_CERT_TTL,
    ENV_SELF_SIGNED_CA_DIR, ENV_SELF_SIGNED_CA_RSA_KEY_SIZE, ENV_TOKEN_AUDIENCES, ENV_XDS_AUTH,
};
pub use features::ENV_ENABLE_TLS_ON_SIDECAR_INGRESS;
pub use mesh::{ENV_POD_NAMESPACE, MeshFileError, MeshNetworksError, MeshSettings};
pub use push::{
    ENV_DEBOUNCE_AFTER, ENV_DEBOUNCE_MAX, ENV_MAX_REQUESTS_PER_SECOND, ENV_PUSH_THROTTLE,
    ENV_XDS_SEND_TIMEOUT, PushConfig, PushConfigError,
};
pub use registry::{ENV_KUBERNETES_SERVICE_HOST, RegistryConfig, RegistryError};
pub use serving::{
    CustomTls, ENV_ISTIOD_CUSTOM_HOST, ENV_POD_NAME, ListenAddrError, ServerConfig, ServingError,
    parse_listen_addr,
};
pub use xds_cache::{
    ENV_ENABLE_CDS_CACHE, ENV_ENABLE_RDS_CACHE, ENV_ENABLE_XDS_CACHE, ENV_XDS_CACHE_SIZE,
    ENV_XDS_CACHE_STATS,
};

use crate::webhooks::WebhookConfig;

/// istiod's effective configuration, by part.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where and how istiod serves.
    pub server: ServerConfig,
    /// The mesh istiod serves.
    pub mesh: MeshSettings,
    /// Where config and services come from.
    pub registry: RegistryConfig,
    /// The CA and how it authenticates its callers.
    pub ca: CaConfig,
    /// The webhooks on `--httpsAddr`.
    pub webhooks: WebhookConfig,
    /// Push tuning.
    pub push: PushConfig,
    /// The XDS cache (`PILOT_ENABLE_XDS_CACHE`, `PILOT_ENABLE_CDS_CACHE`,
    /// `PILOT_ENABLE_RDS_CACHE`, `PILOT_XDS_CACHE_SIZE`, `PILOT_XDS_CACHE_STATS`).
    pub xds_cache: crate::pushctx::cache::CacheSettings,
    /// WorkloadEntry auto-registration and health.
    pub autoregistration: crate::autoregistration::Settings,
    /// Istio's feature flags (`ENABLE_TLS_ON_SIDECAR_INGRESS`).
    pub features: crate::model::features::Features,
}

impl Config {
    /// Builds the configuration, reporting every invalid value at once.
    pub fn from_args(args: &DiscoveryArgs, env: &dyn Env) -> Result<Self, ConfigErrors> {
        let mut r = Reader::new(env);
        let server = serving::parse(args, &mut r);
        let https_addr = serving::listen("httpsAddr", &args.https_addr, &mut r);
        let webhooks = WebhookConfig::read(https_addr, &args.namespace, &mut r);
        let mesh = mesh::parse(args, &mut r);
        let registry = registry::parse(args, &mut r);
        let ca = ca::parse(&mut r);
        let features = features::parse(&mut r);
        let push = push::parse(&mut r);
        let xds_cache = xds_cache::parse(&mut r);
        let autoregistration =
            autoregistration::parse(&mut r, server.max_connection_age, &server.pod_name);
        r.finish()?;
        Ok(Self {
            server,
            mesh,
            registry,
            ca,
            webhooks,
            push,
            xds_cache,
            autoregistration,
            features,
        })
    }

    /// What the CA reads: where its material may come from, the self-signed
    /// root's options and the root rotator's.
    pub fn ca_settings(&self) -> crate::ca::istio_ca::Settings {
        crate::ca::istio_ca::Settings {
            namespace: self.mesh.namespace.clone(),
            root_ca_dir: self.ca.root_ca_dir.clone(),
            self_signed_ca_dir: self.ca.self_signed_ca_dir.clone(),
            self_signed: crate::ca::material::SelfSignedOptions {
                trust_domain: self.mesh.trust_domain.clone(),
                ttl: self.ca.self_signed_ca_ttl,
                rsa_key_size: self.ca.self_signed_ca_rsa_key_size,
            },
            root_cert_check_interval: self.ca.root_cert_check_interval,
            root_cert_grace_percentile: self.ca.root_cert_grace_percentile,
            root_cert_rotator_jitter: self.ca.root_cert_rotator_jitter,
        }
    }

    /// What the config sources read: the mesh config istiod starts with
    /// and where else config comes from.
    pub fn source_settings(&self) -> crate::source::Settings {
        crate::source::Settings {
            config_dir: self.registry.config_dir.clone(),
            namespace: self.mesh.namespace.clone(),
            trust_domain: self.mesh.trust_domain.clone(),
            mesh: self.mesh.mesh(),
            domain: self.mesh.domain.clone(),
            mesh_file_found: self.mesh.file_found,
            revision: self.registry.revision.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::ca::kube_jwt::JwtPolicy;
    use crate::kube::KubeConnection;
    use crate::mesh::MeshConfig;
    use crate::model::istio::OutboundMode;
    use clap::Parser;
    use common::env::MapEnv;

    #[derive(clap::Parser)]
    struct T {
        #[command(flatten)]
        a: DiscoveryArgs,
    }

    #[test]
    fn defaults_match_istio() {
        let t = T::parse_from(["istiod", "--meshConfig", "/nonexistent"]);
        let c = Config::from_args(&t.a, &MapEnv::default()).unwrap();
        assert_eq!(
            c.server.secure_grpc_addr,
            Some("0.0.0.0:15012".parse().unwrap())
        );
        assert_eq!(c.mesh.trust_domain, "cluster.local");
        assert_eq!(c.ca.default_cert_ttl, DEFAULT_WORKLOAD_CERT_TTL);
        assert!(
            c.server
                .istiod_sans
                .contains(&"istiod.istio-system.svc".to_string())
        );
    }

    /// The configuration with `yaml` as the mesh config file; its errors
    /// as the one text istiod prints.
    fn with_mesh(yaml: &str) -> Result<Config, MeshConfigText> {
        with_mesh_typed(yaml).map_err(|e| MeshConfigText(e.to_string()))
    }

    /// The printed form of start-up errors, for assertions on their text.
    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct MeshConfigText(String);

    impl std::ops::Deref for MeshConfigText {
        type Target = str;
        fn deref(&self) -> &str {
            &self.0
        }
    }

    fn with_mesh_typed(yaml: &str) -> Result<Config, common::env::ConfigErrors> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mesh");
        std::fs::write(&path, yaml).unwrap();
        let t = T::parse_from(["istiod", "--meshConfig", path.to_str().unwrap()]);
        Config::from_args(&t.a, &MapEnv::default())
    }

    #[test]
    fn outbound_traffic_policy_comes_from_the_mesh_config() {
        let c = with_mesh("trustDomain: example.org\n").unwrap();
        assert_eq!(c.mesh.trust_domain, "example.org");
        assert_eq!(
            c.mesh.config.outbound_traffic_policy,
            OutboundMode::AllowAny
        );
        let c = with_mesh("outboundTrafficPolicy: {mode: REGISTRY_ONLY}\n").unwrap();
        assert_eq!(
            c.mesh.config.outbound_traffic_policy,
            OutboundMode::RegistryOnly
        );
        let c = with_mesh("outboundTrafficPolicy: {}\n").unwrap();
        assert_eq!(
            c.mesh.config.outbound_traffic_policy,
            OutboundMode::AllowAny
        );
        let c = with_mesh("").unwrap();
        assert_eq!(c.mesh.config, MeshConfig::default());
    }

    #[test]
    fn unsupported_outbound_traffic_policies_are_refused() {
        let err = with_mesh("outboundTrafficPolicy: {mode: ALLOW_ANY_DYNAMIC_DNS}\n").unwrap_err();
        assert!(
            err.contains("ALLOW_ANY_DYNAMIC_DNS is not supported"),
            "{err}"
        );
        let err = with_mesh("outboundTrafficPolicy: {mode: DENY}\n").unwrap_err();
        assert!(err.contains("\"DENY\" is not a mode"), "{err}");
        let err = with_mesh("outboundTrafficPolicy: {mode: ALLOW_ANY, egressProxy: {host: x}}\n")
            .unwrap_err();
        assert!(err.contains("egressProxy"), "{err}");
    }

    #[test]
    fn kubernetes_is_used_with_a_kubeconfig_or_in_a_pod() {
        let t = T::parse_from(["istiod", "--meshConfig", "/nonexistent"]);
        let c = Config::from_args(&t.a, &MapEnv::default()).unwrap();
        assert_eq!(c.registry.kube, None);
        assert!(!c.mesh.file_found);
        assert_eq!(c.ca.jwt_policy, JwtPolicy::ThirdParty);
        assert_eq!(c.ca.token_audiences, vec!["istio-ca"]);
        let env = MapEnv::from_pairs([("KUBERNETES_SERVICE_HOST", "10.96.0.1")]);
        let c = Config::from_args(&t.a, &env).unwrap();
        assert_eq!(c.registry.kube, Some(KubeConnection::InCluster));
        let t = T::parse_from([
            "istiod",
            "--meshConfig",
            "/nonexistent",
            "--kubeconfig",
            "/k/config",
        ]);
        let env = MapEnv::from_pairs([
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("JWT_POLICY", "first-party-jwt"),
        ]);
        let c = Config::from_args(&t.a, &env).unwrap();
        assert_eq!(
            c.registry.kube,
            Some(KubeConnection::Kubeconfig(PathBuf::from("/k/config")))
        );
        assert_eq!(c.ca.jwt_policy, JwtPolicy::FirstParty);
        let env = MapEnv::from_pairs([("JWT_POLICY", "none")]);
        let err = Config::from_args(&t.a, &env).unwrap_err().to_string();
        assert!(err.contains("JWT_POLICY=\"none\""), "{err}");
    }

    #[test]
    fn discovery_selectors_come_from_the_mesh_config() {
        let c =
            with_mesh("discoverySelectors: [{matchLabels: {istio-discovery: enabled}}]\n").unwrap();
        assert!(c.mesh.file_found);
        assert_eq!(c.mesh.discovery_selectors.len(), 1);
        assert!(
            with_mesh("discoverySelectors: [{matchExpressions: [{key: a, operator: In}]}]\n")
                .unwrap_err()
                .contains("needs values")
        );
    }

    #[test]
    fn registries_other_than_kubernetes_are_refused() {
        let t = T::parse_from([
            "istiod",
            "--meshConfig",
            "/nonexistent",
            "--registries",
            "Kubernetes,Mock",
        ]);
        let err = Config::from_args(&t.a, &MapEnv::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--registries \"Mock\" is not supported"),
            "{err}"
        );
    }

    #[test]
    fn mesh_networks_of_one_network_are_accepted_and_named_networks_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meshNetworks");
        let parse = |text: &str| {
            std::fs::write(&path, text).unwrap();
            let t = T::parse_from([
                "istiod",
                "--meshConfig",
                "/nonexistent",
                "--networksConfig",
                path.to_str().unwrap(),
            ]);
            Config::from_args(&t.a, &MapEnv::default())
        };
        // The chart's default ConfigMap key.
        assert!(parse("networks: {}\n").is_ok());
        let err = parse(
            "networks:\n  network1:\n    endpoints: [{fromRegistry: Kubernetes}]\n    gateways: [{address: 198.18.0.9, port: 15443}]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("--networksConfig") && err.contains("networks is not supported"),
            "{err}"
        );
    }

    #[test]
    fn mesh_fields_that_are_not_built_stop_istiod_naming_the_field() {
        let err = with_mesh(
            "protocolDetectionTimeout: 1s\ndefaultConfig: {proxyHeaders: {server: {disabled: true}}}\n",
        )
        .unwrap_err();
        assert!(
            err.contains("protocolDetectionTimeout: \"1s\" is not supported"),
            "{err}"
        );
        assert!(
            err.contains("defaultConfig.proxyHeaders is not supported"),
            "{err}"
        );
        assert!(with_mesh("connectTimeout: 10s\nenableAutoMtls: true\n").is_ok());
    }

    #[test]
    fn every_bad_value_is_reported() {
        let t = T::parse_from([
            "istiod",
            "--secureGRPCAddr",
            "nonsense",
            "--meshConfig",
            "/nonexistent",
        ]);
        let env = MapEnv::from_pairs([("JWT_RULE", "{bad"), ("MAX_WORKLOAD_CERT_TTL", "90x")]);
        let common::env::ConfigErrors(errors) = Config::from_args(&t.a, &env).unwrap_err();
        // One line each, every one in one run.
        let named = |what: &str| errors.iter().filter(|e| e.contains(what)).count();
        assert_eq!(errors.len(), 3, "{errors:#?}");
        for what in ["secureGRPCAddr", "JWT_RULE", "MAX_WORKLOAD_CERT_TTL"] {
            assert_eq!(named(what), 1, "{what}: {errors:#?}");
        }
    }

    #[test]
    fn one_bad_value_in_every_part_is_reported_in_one_run() {
        let dir = tempfile::tempdir().unwrap();
        let mesh = dir.path().join("mesh");
        std::fs::write(&mesh, "protocolDetectionTimeout: 1s\n").unwrap();
        let t = T::parse_from([
            "istiod",
            "--grpcAddr",
            "15010",
            "--meshConfig",
            mesh.to_str().unwrap(),
            "--registries",
            "Mock",
        ]);
        let env = MapEnv::from_pairs([
            ("ENABLE_NATIVE_SIDECARS", "maybe"),
            ("JWT_POLICY", "none"),
            ("ENABLE_TLS_ON_SIDECAR_INGRESS", "yes"),
            ("PILOT_DEBOUNCE_AFTER", "soon"),
            ("PILOT_XDS_CACHE_SIZE", "many"),
            ("PILOT_WORKLOAD_ENTRY_GRACE_PERIOD", "later"),
        ]);
        let ConfigErrors(errors) = Config::from_args(&t.a, &env).unwrap_err();
        let parts = [
            "--grpcAddr",
            "ENABLE_NATIVE_SIDECARS",
            "--meshConfig",
            "--registries",
            "JWT_POLICY",
            "ENABLE_TLS_ON_SIDECAR_INGRESS",
            "PILOT_DEBOUNCE_AFTER",
            "PILOT_XDS_CACHE_SIZE",
            "PILOT_WORKLOAD_ENTRY_GRACE_PERIOD",
        ];
        assert_eq!(errors.len(), parts.len(), "{errors:#?}");
        for what in parts {
            let named = errors.iter().filter(|e| e.starts_with(what)).count();
            assert_eq!(named, 1, "{what}: {errors:#?}");
        }
    }

    #[test]
    fn a_custom_certificate_needs_its_key() {
        let t = T::parse_from([
            "istiod",
            "--meshConfig",
            "/nonexistent",
            "--tlsCertFile",
            "/c/cert.pem",
        ]);
        let ConfigErrors(errors) = Config::from_args(&t.a, &MapEnv::default()).unwrap_err();
        assert_eq!(errors, [ServingError::TlsFilesPair.to_string()]);
        let t = T::parse_from([
            "istiod",
            "--meshConfig",
            "/nonexistent",
            "--tlsCertFile",
            "/c/cert.pem",
            "--tlsKeyFile",
            "/c/key.pem",
        ]);
        let c = Config::from_args(&t.a, &MapEnv::default()).unwrap();
        assert_eq!(
            c.server.custom_tls,
            Some(CustomTls {
                cert: PathBuf::from("/c/cert.pem"),
                key: PathBuf::from("/c/key.pem"),
            })
        );
        // Istio's --caCertFile is not built: refused, naming the flag.
        let t = T::parse_from([
            "istiod",
            "--meshConfig",
            "/nonexistent",
            "--caCertFile",
            "/c/ca.pem",
        ]);
        let errors = Config::from_args(&t.a, &MapEnv::default()).unwrap_err();
        assert_eq!(errors.to_string().lines().count(), 1, "{errors}");
        assert!(
            errors
                .to_string()
                .starts_with("--caCertFile is not supported"),
            "{errors}"
        );
    }

    #[test]
    fn a_bad_duration_flag_is_refused_by_the_parser_naming_the_value() {
        let err = T::try_parse_from(["istiod", "--shutdownDuration", "10"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("--shutdownDuration") && err.contains("invalid duration \"10\""),
            "{err}"
        );
    }
}
