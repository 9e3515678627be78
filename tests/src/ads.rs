//! A small ADS server of the tests' own (state of the world and delta) that
//! hands Envoy a fixed set of clusters and listeners, for testing the agent's
//! Envoy lifecycle before istiod's generators are involved.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use common::xds::ResponseStream;
use prost::Message;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use proto::pb::google::protobuf::Any;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// Cluster type URL.
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Listener type URL.
pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

/// A fixed set of resources: (type URL, name, encoded resource).
#[derive(Clone, Default)]
pub struct Resources(pub Vec<(String, String, Any)>);

impl Resources {
    fn of(&self, type_url: &str) -> Vec<(String, Any)> {
        self.0
            .iter()
            .filter(|(t, _, _)| t == type_url)
            .map(|(_, n, a)| (n.clone(), a.clone()))
            .collect()
    }
}

#[derive(Clone)]
struct Ads(Arc<Resources>);

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ResponseStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = ResponseStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        req: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(8);
        let res = self.0.clone();
        tokio::spawn(async move {
            let mut answered = HashSet::new();
            while let Ok(Some(r)) = inbound.message().await {
                if r.response_nonce.is_empty() || answered.insert(r.type_url.clone()) {
                    let resources = res.of(&r.type_url).into_iter().map(|(_, a)| a).collect();
                    let resp = DiscoveryResponse {
                        version_info: "1".into(),
                        resources,
                        type_url: r.type_url.clone(),
                        nonce: format!("n-{}", r.type_url.len()),
                        ..Default::default()
                    };
                    answered.insert(r.type_url.clone());
                    if tx.send(Ok(resp)).await.is_err() {
                        break;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        req: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(8);
        let res = self.0.clone();
        tokio::spawn(async move {
            let mut answered = HashSet::new();
            while let Ok(Some(r)) = inbound.message().await {
                // ACKs and NACKs carry the nonce; only first requests get resources.
                if !r.response_nonce.is_empty() || !answered.insert(r.type_url.clone()) {
                    continue;
                }
                let resources = res
                    .of(&r.type_url)
                    .into_iter()
                    .map(|(name, any)| Resource {
                        name,
                        version: "1".into(),
                        resource: Some(any),
                        ..Default::default()
                    })
                    .collect();
                let resp = DeltaDiscoveryResponse {
                    system_version_info: "1".into(),
                    resources,
                    type_url: r.type_url.clone(),
                    nonce: format!("n-{}", r.type_url.len()),
                    ..Default::default()
                };
                if tx.send(Ok(resp)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Serves `resources` on the Unix socket `path` until the runtime ends.
pub fn serve_uds(path: &Path, resources: Resources) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AggregatedDiscoveryServiceServer::new(Ads(Arc::new(
                resources,
            ))))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    Ok(())
}

/// Packs a message as `Any`.
pub fn any<M: Message + prost::Name>(m: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: m.encode_to_vec(),
    }
}

/// An inbound HTTP listener on `port` routing everything to `cluster`, marked
/// INBOUND so that Istio's `drain_listeners?inboundonly` drains it, and a
/// STATIC cluster to `127.0.0.1:app_port`.
pub fn inbound_http(port: u16, app_port: u16) -> Resources {
    use proto::pb::envoy::config::cluster::v3::{Cluster, cluster};
    use proto::pb::envoy::config::core::v3::{
        Address, SocketAddress, TrafficDirection, address, socket_address,
    };
    use proto::pb::envoy::config::endpoint::v3::{
        ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
    };
    use proto::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
    use proto::pb::envoy::config::route::v3::{
        Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route, route_action,
        route_match,
    };
    use proto::pb::envoy::extensions::filters::http::router::v3::Router;
    use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpConnectionManager, HttpFilter, http_connection_manager, http_filter,
    };
    let addr = |ip: &str, port: u16| Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ip.into(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(port.into())),
            ..Default::default()
        })),
    };
    let cluster_name = format!("inbound|{app_port}||");
    let cluster = Cluster {
        name: cluster_name.clone(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Static.into(),
        )),
        connect_timeout: Some(proto::pb::google::protobuf::Duration {
            seconds: 1,
            nanos: 0,
        }),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: cluster_name.clone(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: Some(addr("127.0.0.1", app_port)),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let hcm = HttpConnectionManager {
        stat_prefix: format!("inbound_{port}"),
        route_specifier: Some(http_connection_manager::RouteSpecifier::RouteConfig(
            RouteConfiguration {
                name: format!("inbound|{port}"),
                virtual_hosts: vec![VirtualHost {
                    name: "inbound".into(),
                    domains: vec!["*".into()],
                    routes: vec![Route {
                        r#match: Some(RouteMatch {
                            path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                            ..Default::default()
                        }),
                        action: Some(route::Action::Route(RouteAction {
                            cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
                                cluster_name.clone(),
                            )),
                            timeout: Some(proto::pb::google::protobuf::Duration {
                                seconds: 30,
                                nanos: 0,
                            }),
                            ..Default::default()
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            },
        )),
        http_filters: vec![HttpFilter {
            name: "envoy.filters.http.router".into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(
                any(&Router::default()),
            )),
            ..Default::default()
        }],
        ..Default::default()
    };
    let listener = Listener {
        name: format!("0.0.0.0_{port}"),
        address: Some(addr("0.0.0.0", port)),
        traffic_direction: TrafficDirection::Inbound.into(),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.http_connection_manager".into(),
                config_type: Some(filter::ConfigType::TypedConfig(any(&hcm))),
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    Resources(vec![
        (CLUSTER.into(), cluster_name, any(&cluster)),
        (LISTENER.into(), listener.name.clone(), any(&listener)),
    ])
}

/// A TLS listener on `port` whose certificate and trust bundle come from the
/// agent's SDS (`default`, `ROOTCA` over Istio's `sds-grpc` bootstrap
/// cluster), answering every request with `hello`.
pub fn sds_tls_listener(port: u16) -> Resources {
    use proto::pb::envoy::config::core::v3::{
        Address, ApiConfigSource, ConfigSource, GrpcService, SocketAddress, TransportSocket,
        address, api_config_source, config_source, grpc_service, socket_address, transport_socket,
    };
    use proto::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
    use proto::pb::envoy::config::route::v3::{
        DirectResponseAction, Route, RouteConfiguration, RouteMatch, VirtualHost, route,
        route_match,
    };
    use proto::pb::envoy::extensions::filters::http::router::v3::Router;
    use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpConnectionManager, HttpFilter, http_connection_manager, http_filter,
    };
    use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
        CommonTlsContext, DownstreamTlsContext, SdsSecretConfig, common_tls_context,
    };
    let sds = |name: &str| SdsSecretConfig {
        name: name.into(),
        sds_config: Some(ConfigSource {
            resource_api_version: 2, // V3
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::ApiConfigSource(
                ApiConfigSource {
                    api_type: api_config_source::ApiType::Grpc.into(),
                    transport_api_version: 2, // V3
                    grpc_services: vec![GrpcService {
                        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                            grpc_service::EnvoyGrpc {
                                cluster_name: "sds-grpc".into(),
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
    };
    let tls = DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_sds_secret_configs: vec![sds("default")],
            validation_context_type: Some(
                common_tls_context::ValidationContextType::ValidationContextSdsSecretConfig(sds(
                    "ROOTCA",
                )),
            ),
            ..Default::default()
        }),
        require_client_certificate: Some(proto::pb::google::protobuf::BoolValue { value: false }),
        ..Default::default()
    };
    let hcm = HttpConnectionManager {
        stat_prefix: "tls".into(),
        route_specifier: Some(http_connection_manager::RouteSpecifier::RouteConfig(RouteConfiguration {
            virtual_hosts: vec![VirtualHost {
                name: "all".into(),
                domains: vec!["*".into()],
                routes: vec![Route {
                    r#match: Some(RouteMatch {
                        path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                        ..Default::default()
                    }),
                    action: Some(route::Action::DirectResponse(DirectResponseAction {
                        status: 200,
                        body: Some(proto::pb::envoy::config::core::v3::DataSource {
                            specifier: Some(proto::pb::envoy::config::core::v3::data_source::Specifier::InlineString(
                                "hello".into(),
                            )),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        })),
        http_filters: vec![HttpFilter {
            name: "envoy.filters.http.router".into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(any(&Router::default()))),
            ..Default::default()
        }],
        ..Default::default()
    };
    let listener = Listener {
        name: format!("0.0.0.0_{port}"),
        address: Some(Address {
            address: Some(address::Address::SocketAddress(SocketAddress {
                address: "0.0.0.0".into(),
                port_specifier: Some(socket_address::PortSpecifier::PortValue(port.into())),
                ..Default::default()
            })),
        }),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.http_connection_manager".into(),
                config_type: Some(filter::ConfigType::TypedConfig(any(&hcm))),
            }],
            transport_socket: Some(TransportSocket {
                name: "envoy.transport_sockets.tls".into(),
                config_type: Some(transport_socket::ConfigType::TypedConfig(any(&tls))),
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    Resources(vec![(
        LISTENER.into(),
        listener.name.clone(),
        any(&listener),
    )])
}

/// Serves `resources` on a TCP listener (made inside a Pod's network with
/// [`crate::netns::Netns::run`]), as a plaintext upstream for the agent's xDS
/// proxy (`discoveryAddress` on it with `controlPlaneAuthPolicy: NONE`).
pub fn serve_tcp(listener: std::net::TcpListener, resources: Resources) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AggregatedDiscoveryServiceServer::new(Ads(Arc::new(
                resources,
            ))))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    Ok(())
}

/// The port the tests' ADS server listens on inside a Pod (Istio's plaintext xDS port).
pub const ADS_PORT: u16 = 15010;

/// The ProxyConfig fields that point the agent at the tests' ADS server.
pub const PROXY_CONFIG_FIELDS: &str =
    r#""discoveryAddress": "127.0.0.1:15010", "controlPlaneAuthPolicy": "NONE""#;
