//! Istio's standard metrics without Istio's Envoy filters: upstream Envoy has
//! no `istio.stats` filter, so every HTTP connection manager and TCP proxy
//! of a sidecar or gateway streams one entry per request (and per
//! connection open, period and close) to its own agent over the gRPC access
//! log service; the agent keeps the `istio_*` families. The log name carries
//! the reporter (`source` for sidecar outbound and gateways, `destination`
//! for sidecar inbound, as Istio reports); custom tags carry what Istio's
//! stats filter reads from metadata: the upstream host's `istio.workload`,
//! the cluster's `istio.services`, and the upstream connection's
//! certificates.
//!
//! This module also writes that metadata where Istio writes it: the
//! endpoints' `istio.workload` and the clusters' `istio.services`.

use std::time::Duration;

use common::istio_stats::{
    ALS_CLUSTER, CUSTOM_TAGS, LOGGED_REQUEST_HEADERS, LOGGED_RESPONSE_HEADERS, Reporter,
};
use prost::Message;
use proto::pb::envoy::config::accesslog::v3::{AccessLog, access_log};
use proto::pb::envoy::config::core::v3::{ApiVersion, GrpcService, Metadata, grpc_service};
use proto::pb::envoy::config::listener::v3::{Filter, Listener, filter};
use proto::pb::envoy::extensions::access_loggers::grpc::v3::{
    CommonGrpcAccessLogConfig, HttpGrpcAccessLogConfig, TcpGrpcAccessLogConfig,
};
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use proto::pb::envoy::r#type::tracing::v3::{CustomTag, custom_tag};
use proto::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};

use super::util::{any, duration, string_value};
use crate::model::istio::Labels;
use crate::model::service::Endpoint;
use crate::pushctx::names::ServiceRef;

/// The HTTP access logger Envoy registers for gRPC access logs.
pub const HTTP_GRPC_LOGGER: &str = "envoy.access_loggers.http_grpc";
/// The TCP access logger Envoy registers for gRPC access logs.
pub const TCP_GRPC_LOGGER: &str = "envoy.access_loggers.tcp_grpc";
const HCM_FILTER: &str = "envoy.filters.network.http_connection_manager";
const TCP_PROXY_FILTER: &str = "envoy.filters.network.tcp_proxy";

/// How long Envoy buffers entries before it sends them to the agent: short,
/// so a scrape right after a request sees it.
const BUFFER_FLUSH_INTERVAL: Duration = Duration::from_millis(100);
/// How often a long TCP connection reports the bytes it moved so far.
const TCP_FLUSH_INTERVAL: Duration = Duration::from_secs(5);

/// The `istio` filter metadata key, on endpoints and clusters (Istio's
/// `util.IstioMetadataKey`).
pub const ISTIO_METADATA_KEY: &str = "istio";

/// Which reporters emit metrics (what a Telemetry `metrics` resolution
/// decides; Istio reports on both sides by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reporting {
    /// The client side (`source`: sidecar outbound, gateways).
    pub client: bool,
    /// The server side (`destination`: sidecar inbound).
    pub server: bool,
}

impl Default for Reporting {
    fn default() -> Self {
        Self {
            client: true,
            server: true,
        }
    }
}

impl From<crate::model::telemetry::MetricsReporting> for Reporting {
    fn from(m: crate::model::telemetry::MetricsReporting) -> Self {
        Self {
            client: m.client,
            server: m.server,
        }
    }
}

impl Reporting {
    /// Whether `reporter` emits metrics.
    pub fn enabled(self, reporter: Reporter) -> bool {
        match reporter {
            Reporter::Source => self.client,
            Reporter::Destination => self.server,
        }
    }
}

fn common_config(log_name: &str) -> CommonGrpcAccessLogConfig {
    CommonGrpcAccessLogConfig {
        log_name: log_name.into(),
        grpc_service: Some(GrpcService {
            target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                grpc_service::EnvoyGrpc {
                    cluster_name: ALS_CLUSTER.into(),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
        transport_api_version: ApiVersion::V3.into(),
        buffer_flush_interval: Some(duration(BUFFER_FLUSH_INTERVAL)),
        custom_tags: CUSTOM_TAGS
            .iter()
            .map(|(tag, format)| CustomTag {
                tag: (*tag).into(),
                r#type: Some(custom_tag::Type::Value((*format).into())),
            })
            .collect(),
        ..Default::default()
    }
}

/// The HTTP access log of `reporter`'s requests.
pub fn http_access_log(reporter: Reporter) -> AccessLog {
    let names = |h: &[&str]| h.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let config = HttpGrpcAccessLogConfig {
        common_config: Some(common_config(reporter.http_log_name())),
        additional_request_headers_to_log: names(LOGGED_REQUEST_HEADERS),
        additional_response_headers_to_log: names(LOGGED_RESPONSE_HEADERS),
        additional_response_trailers_to_log: names(LOGGED_RESPONSE_HEADERS),
    };
    AccessLog {
        name: HTTP_GRPC_LOGGER.into(),
        filter: None,
        config_type: Some(access_log::ConfigType::TypedConfig(any(&config))),
    }
}

/// The TCP access log of `reporter`'s connections.
pub fn tcp_access_log(reporter: Reporter) -> AccessLog {
    let config = TcpGrpcAccessLogConfig {
        common_config: Some(common_config(reporter.tcp_log_name())),
    };
    AccessLog {
        name: TCP_GRPC_LOGGER.into(),
        filter: None,
        config_type: Some(access_log::ConfigType::TypedConfig(any(&config))),
    }
}

/// Adds `reporter`'s access logs to every HTTP connection manager and TCP
/// proxy of `listener`, when `enabled`; TCP proxies also report when the
/// upstream connection opens and periodically while it lasts.
pub fn apply(listener: &mut Listener, reporter: Reporter, enabled: bool) {
    if !enabled {
        return;
    }
    let chains = listener
        .filter_chains
        .iter_mut()
        .chain(listener.default_filter_chain.as_mut());
    for chain in chains {
        for f in &mut chain.filters {
            add_to_filter(f, reporter);
        }
    }
}

fn add_to_filter(f: &mut Filter, reporter: Reporter) {
    let Some(filter::ConfigType::TypedConfig(typed)) = &mut f.config_type else {
        return;
    };
    match f.name.as_str() {
        HCM_FILTER => {
            let Ok(mut hcm) = HttpConnectionManager::decode(typed.value.as_slice()) else {
                return;
            };
            hcm.access_log.push(http_access_log(reporter));
            typed.value = hcm.encode_to_vec();
        }
        TCP_PROXY_FILTER => {
            let Ok(mut tcp) = TcpProxy::decode(typed.value.as_slice()) else {
                return;
            };
            tcp.access_log.push(tcp_access_log(reporter));
            tcp.access_log_options = Some(tcp_proxy::TcpAccessLogOptions {
                access_log_flush_interval: Some(duration(TCP_FLUSH_INTERVAL)),
                flush_access_log_on_connected: true,
                ..Default::default()
            });
            typed.value = tcp.encode_to_vec();
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------
// Metadata

/// Istio's cluster metadata: `istio: {services: [{host, name, namespace}]}`
/// (with `default_original_port` on outbound clusters).
pub fn cluster_metadata(services: &[ServiceRef], original_port: Option<u16>) -> Metadata {
    let list = services
        .iter()
        .map(|s| Value {
            kind: Some(Kind::StructValue(Struct {
                fields: [
                    ("host".to_string(), string_value(&s.host)),
                    ("name".to_string(), string_value(&s.name)),
                    ("namespace".to_string(), string_value(&s.namespace)),
                ]
                .into(),
            })),
        })
        .collect();
    let mut fields = std::collections::BTreeMap::from([(
        "services".to_string(),
        Value {
            kind: Some(Kind::ListValue(ListValue { values: list })),
        },
    )]);
    if let Some(port) = original_port {
        fields.insert(
            "default_original_port".into(),
            Value {
                kind: Some(Kind::NumberValue(f64::from(port))),
            },
        );
    }
    let mut metadata = Metadata::default();
    metadata.filter_metadata.insert(
        ISTIO_METADATA_KEY.into(),
        Struct {
            fields: fields.into_iter().collect(),
        },
    );
    metadata
}

/// The canonical service of a workload (Istio's `labels.CanonicalService`):
/// `service.istio.io/canonical-name`, `app.kubernetes.io/name`, `app`, else
/// the workload name; the revision likewise from
/// `service.istio.io/canonical-revision`, `app.kubernetes.io/version`,
/// `version`, else `latest`.
pub fn canonical_service(labels: &Labels, workload: &str) -> (String, String) {
    let first = |keys: &[&str]| keys.iter().find_map(|k| labels.get(*k).cloned());
    let name = first(&[
        "service.istio.io/canonical-name",
        "app.kubernetes.io/name",
        "app",
    ])
    .unwrap_or_else(|| workload.to_string());
    let revision = first(&[
        "service.istio.io/canonical-revision",
        "app.kubernetes.io/version",
        "version",
    ])
    .unwrap_or_else(|| "latest".to_string());
    (name, revision)
}

/// The workload a Pod belongs to: its Deployment when the Pod carries
/// `pod-template-hash` and is named `<deployment>-<hash>-<suffix>`, else the
/// Pod (or WorkloadEntry) itself.
pub fn workload_name(object_name: &str, labels: &Labels) -> String {
    if let Some(hash) = labels.get("pod-template-hash")
        && let Some((prefix, _suffix)) = object_name.rsplit_once('-')
        && let Some(deployment) = prefix.strip_suffix(&format!("-{hash}"))
    {
        return deployment.to_string();
    }
    object_name.to_string()
}

/// The endpoint's `istio.workload` metadata as Istio writes it:
/// `<workload>;<namespace>;<canonical name>;<canonical revision>;<cluster>`;
/// `None` when the endpoint's workload is unknown.
pub fn endpoint_workload(ep: &Endpoint, cluster_id: &str) -> Option<String> {
    let workload = ep.workload.as_ref()?;
    let name = workload_name(&workload.name, &ep.labels);
    let (canonical, revision) = canonical_service(&ep.labels, &name);
    Some(format!(
        "{name};{};{canonical};{revision};{cluster_id}",
        workload.namespace
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::envoy::config::listener::v3::FilterChain;

    fn decode_log<M: Message + Default>(log: &AccessLog) -> M {
        let Some(access_log::ConfigType::TypedConfig(a)) = &log.config_type else {
            panic!("typed config");
        };
        M::decode(a.value.as_slice()).unwrap()
    }

    #[test]
    fn http_logger_streams_to_the_agent_with_the_reporter_and_tags() {
        let log = http_access_log(Reporter::Destination);
        assert_eq!(log.name, "envoy.access_loggers.http_grpc");
        let c: HttpGrpcAccessLogConfig = decode_log(&log);
        let common = c.common_config.unwrap();
        assert_eq!(common.log_name, "istio-stats-http-destination");
        assert_eq!(common.transport_api_version, ApiVersion::V3 as i32);
        match common.grpc_service.unwrap().target_specifier.unwrap() {
            grpc_service::TargetSpecifier::EnvoyGrpc(g) => assert_eq!(g.cluster_name, ALS_CLUSTER),
            other => panic!("{other:?}"),
        }
        let tags: Vec<(String, String)> = common
            .custom_tags
            .iter()
            .map(|t| match &t.r#type {
                Some(custom_tag::Type::Value(v)) => (t.tag.clone(), v.clone()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(tags.contains(&(
            "istio.upstream_workload".into(),
            "%UPSTREAM_METADATA(istio:workload)%".into()
        )));
        assert!(tags.contains(&(
            "istio.cluster_services".into(),
            "%CLUSTER_METADATA(istio:services)%".into()
        )));
        assert_eq!(c.additional_request_headers_to_log, ["content-type"]);
        assert_eq!(c.additional_response_trailers_to_log, ["grpc-status"]);
        assert!(common.buffer_flush_interval.is_some());
    }

    fn listener_with(filters: Vec<Filter>) -> Listener {
        Listener {
            name: "l".into(),
            filter_chains: vec![FilterChain {
                filters,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn filter_of<M: Message + prost::Name>(name: &str, m: &M) -> Filter {
        Filter {
            name: name.into(),
            config_type: Some(filter::ConfigType::TypedConfig(any(m))),
        }
    }

    fn decoded<M: Message + Default>(f: &Filter) -> M {
        let Some(filter::ConfigType::TypedConfig(a)) = &f.config_type else {
            panic!("typed config");
        };
        M::decode(a.value.as_slice()).unwrap()
    }

    #[test]
    fn apply_adds_logs_to_connection_managers_and_tcp_proxies() {
        let mut l = listener_with(vec![filter_of(
            HCM_FILTER,
            &HttpConnectionManager {
                stat_prefix: "x".into(),
                ..Default::default()
            },
        )]);
        l.default_filter_chain = Some(FilterChain {
            filters: vec![filter_of(TCP_PROXY_FILTER, &TcpProxy::default())],
            ..Default::default()
        });
        apply(&mut l, Reporter::Source, true);
        let hcm: HttpConnectionManager = decoded(&l.filter_chains[0].filters[0]);
        assert_eq!(hcm.stat_prefix, "x");
        assert_eq!(hcm.access_log.len(), 1);
        let c: HttpGrpcAccessLogConfig = decode_log(&hcm.access_log[0]);
        assert_eq!(c.common_config.unwrap().log_name, "istio-stats-http-source");
        let tcp: TcpProxy = decoded(&l.default_filter_chain.as_ref().unwrap().filters[0]);
        assert_eq!(tcp.access_log[0].name, "envoy.access_loggers.tcp_grpc");
        let c: TcpGrpcAccessLogConfig = decode_log(&tcp.access_log[0]);
        assert_eq!(c.common_config.unwrap().log_name, "istio-stats-tcp-source");
        let options = tcp.access_log_options.unwrap();
        assert!(options.flush_access_log_on_connected);
        assert!(options.access_log_flush_interval.is_some());
    }

    #[test]
    fn apply_leaves_a_disabled_reporter_alone() {
        let mut l = listener_with(vec![filter_of(TCP_PROXY_FILTER, &TcpProxy::default())]);
        let before = l.clone();
        apply(
            &mut l,
            Reporter::Destination,
            Reporting {
                client: true,
                server: false,
            }
            .enabled(Reporter::Destination),
        );
        assert_eq!(l, before);
    }

    #[test]
    fn workload_metadata_follows_istio() {
        let labels: Labels = [
            ("app".to_string(), "httpbin".to_string()),
            ("version".to_string(), "v1".to_string()),
            ("pod-template-hash".to_string(), "5d9f8".to_string()),
        ]
        .into();
        assert_eq!(workload_name("httpbin-5d9f8-abcde", &labels), "httpbin");
        assert_eq!(workload_name("httpbin-v1", &labels), "httpbin-v1");
        let ep = Endpoint {
            address: "10.0.0.1".into(),
            port: 8080,
            service_port: 8000,
            service_port_name: "http".into(),
            labels,
            identity: None,
            tls_mode: common::TlsMode::Istio,
            healthy: true,
            network: String::new(),
            locality: String::new(),
            weight: 1,
            workload: Some(crate::model::ObjectKey::new(
                crate::model::Kind::Pod,
                "demo",
                "httpbin-5d9f8-abcde",
            )),
            hostname: String::new(),
            subdomain: String::new(),
        };
        assert_eq!(
            endpoint_workload(&ep, "Kubernetes").as_deref(),
            Some("httpbin;demo;httpbin;v1;Kubernetes")
        );
        let bare: Labels = Default::default();
        assert_eq!(
            canonical_service(&bare, "w"),
            ("w".to_string(), "latest".to_string())
        );
    }

    #[test]
    fn cluster_metadata_lists_services() {
        let m = cluster_metadata(
            &[ServiceRef {
                host: "httpbin.demo.svc.cluster.local".into(),
                name: "httpbin".into(),
                namespace: "demo".into(),
            }],
            Some(8000),
        );
        let istio = &m.filter_metadata["istio"];
        let Some(Kind::ListValue(list)) = &istio.fields["services"].kind else {
            panic!("a list");
        };
        let Some(Kind::StructValue(s)) = &list.values[0].kind else {
            panic!("a struct");
        };
        assert_eq!(
            s.fields["host"].kind,
            Some(Kind::StringValue("httpbin.demo.svc.cluster.local".into()))
        );
        assert_eq!(
            istio.fields["default_original_port"].kind,
            Some(Kind::NumberValue(8000.0))
        );
    }
}
