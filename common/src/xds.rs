//! The xDS type URLs istiod serves and pilot-agent handles, in one place
//! (Istio's `pilot/pkg/xds/v3/model.go`).
//!
//! They are `&str` constants, not `prost::Name::type_url()` calls, so they
//! can be matched on; the tests check each against the generated message's
//! own name where the generated code carries one (`envoy-types` does; the
//! name table and workload types are Istio's, without one).

/// The response stream of an xDS service's streaming methods (ADS, SDS): a
/// boxed stream of messages or gRPC statuses, as tonic's generated servers
/// take it.
pub type ResponseStream<T> = tonic::codegen::BoxStream<T>;

/// The SDS secret with the workload's key and certificate chain, as the
/// agent serves it and istiod's clusters and listeners name it (Istio's
/// `default`).
pub const SDS_WORKLOAD_SECRET: &str = "default";
/// The SDS secret with the mesh's trust bundle (Istio's `ROOTCA`).
pub const SDS_ROOT_SECRET: &str = "ROOTCA";

/// What every type URL starts with (Go's `resource.APITypePrefix`).
pub const TYPE_URL_PREFIX: &str = "type.googleapis.com/";
/// The prefix of Envoy's own types, which the agent's xDS proxy forwards
/// to Envoy (Istio's `envoyTypePrefix`).
pub const ENVOY_TYPE_PREFIX: &str = "type.googleapis.com/envoy.";

/// CDS: `envoy.config.cluster.v3.Cluster`.
pub const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// EDS: `envoy.config.endpoint.v3.ClusterLoadAssignment`.
pub const ENDPOINT_TYPE: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// LDS: `envoy.config.listener.v3.Listener`.
pub const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// RDS: `envoy.config.route.v3.RouteConfiguration`.
pub const ROUTE_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
/// SDS: `envoy.extensions.transport_sockets.tls.v3.Secret` (the agent's
/// SDS server to Envoy).
pub const SECRET_TYPE: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
/// NDS: the DNS name table istiod sends the agent's DNS proxy
/// (`istio.networking.nds.v1.NameTable`).
pub const NAME_TABLE_TYPE: &str = "type.googleapis.com/istio.networking.nds.v1.NameTable";
/// ECDS: `envoy.config.core.v3.TypedExtensionConfig` (Istio's
/// `ExtensionConfigurationType`; `/debug/syncz` reports it per proxy).
pub const EXTENSION_CONFIGURATION_TYPE: &str =
    "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";
/// Istio's debug type over ADS (`v3.DebugType`), also the prefix of the
/// others: a request of one is answered once and never creates a watch.
/// With this type itself the resource name is a debug path (`syncz`,
/// `config_dump?proxyID=...`), answered with that HTTP endpoint's body.
pub const DEBUG_TYPE: &str = "istio.io/debug";

/// Istio's `HealthInfoType`: an agent's report of its workload's health
/// (a request, never answered; `error_detail` set when unhealthy).
pub const HEALTH_INFO_TYPE: &str = "istio.io/health";
/// `istio.io/debug/syncz`: every connected proxy's sync state, one Envoy
/// CSDS `ClientConfig` per proxy (Istio's `TypeDebugSyncronization`, what
/// `istioctl proxy-status` asks for).
pub const DEBUG_SYNCZ_TYPE: &str = "istio.io/debug/syncz";
/// `istio.io/debug/config_dump`, resource name = proxy ID: that proxy's
/// configuration as Envoy admin config dumps (Istio's `TypeDebugConfigDump`).
pub const DEBUG_CONFIG_DUMP_TYPE: &str = "istio.io/debug/config_dump";
/// The resources of a syncz answer: `envoy.service.status.v3.ClientConfig`.
pub const CLIENT_CONFIG_TYPE: &str = "type.googleapis.com/envoy.service.status.v3.ClientConfig";

/// Whether `type_url` is one of Istio's debug types (`istio.io/debug...`).
pub fn is_debug_type(type_url: &str) -> bool {
    type_url == DEBUG_TYPE
        || type_url
            .strip_prefix(DEBUG_TYPE)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Ambient workloads (`istio.workload.Workload`), forwarded to Envoy by the
/// agent's xDS proxy.
pub const WORKLOAD_TYPE: &str = "type.googleapis.com/istio.workload.Workload";

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Name;
    use proto::pb::envoy::config::cluster::v3::Cluster;
    use proto::pb::envoy::config::core::v3::TypedExtensionConfig;
    use proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use proto::pb::envoy::config::listener::v3::Listener;
    use proto::pb::envoy::config::route::v3::RouteConfiguration;
    use proto::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
    use proto::pb::envoy::service::status::v3::ClientConfig;

    #[test]
    fn constants_match_the_generated_messages() {
        assert_eq!(CLUSTER_TYPE, Cluster::type_url());
        assert_eq!(ENDPOINT_TYPE, ClusterLoadAssignment::type_url());
        assert_eq!(LISTENER_TYPE, Listener::type_url());
        assert_eq!(ROUTE_TYPE, RouteConfiguration::type_url());
        assert_eq!(SECRET_TYPE, Secret::type_url());
        assert_eq!(
            EXTENSION_CONFIGURATION_TYPE,
            TypedExtensionConfig::type_url()
        );
        assert_eq!(CLIENT_CONFIG_TYPE, ClientConfig::type_url());
        for t in [
            CLUSTER_TYPE,
            ENDPOINT_TYPE,
            LISTENER_TYPE,
            ROUTE_TYPE,
            SECRET_TYPE,
            EXTENSION_CONFIGURATION_TYPE,
            CLIENT_CONFIG_TYPE,
        ] {
            assert!(t.starts_with(ENVOY_TYPE_PREFIX), "{t}");
        }
        for t in [NAME_TABLE_TYPE, WORKLOAD_TYPE] {
            assert!(
                t.starts_with(TYPE_URL_PREFIX) && !t.starts_with(ENVOY_TYPE_PREFIX),
                "{t}"
            );
        }
    }

    #[test]
    fn debug_types_are_the_istio_debug_prefix_and_a_path() {
        assert!(is_debug_type(DEBUG_SYNCZ_TYPE));
        assert!(is_debug_type(DEBUG_CONFIG_DUMP_TYPE));
        assert!(is_debug_type("istio.io/debug/adsz"));
        assert!(is_debug_type(DEBUG_TYPE));
        assert!(!is_debug_type("istio.io/debugger"));
        assert!(!is_debug_type(CLUSTER_TYPE));
    }
}
