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
/// Ambient workloads (`istio.workload.Workload`), forwarded to Envoy by the
/// agent's xDS proxy.
pub const WORKLOAD_TYPE: &str = "type.googleapis.com/istio.workload.Workload";

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Name;
    use proto::pb::envoy::config::cluster::v3::Cluster;
    use proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use proto::pb::envoy::config::listener::v3::Listener;
    use proto::pb::envoy::config::route::v3::RouteConfiguration;
    use proto::pb::envoy::extensions::transport_sockets::tls::v3::Secret;

    #[test]
    fn constants_match_the_generated_messages() {
        assert_eq!(CLUSTER_TYPE, Cluster::type_url());
        assert_eq!(ENDPOINT_TYPE, ClusterLoadAssignment::type_url());
        assert_eq!(LISTENER_TYPE, Listener::type_url());
        assert_eq!(ROUTE_TYPE, RouteConfiguration::type_url());
        assert_eq!(SECRET_TYPE, Secret::type_url());
        for t in [
            CLUSTER_TYPE,
            ENDPOINT_TYPE,
            LISTENER_TYPE,
            ROUTE_TYPE,
            SECRET_TYPE,
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
}
