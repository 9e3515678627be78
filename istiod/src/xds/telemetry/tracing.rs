//! The HTTP connection manager's `tracing` for the tracing a workload's
//! Telemetry puts in force: Envoy's Zipkin tracer (JSON v2 to the
//! provider's outbound cluster) or OpenTelemetry tracer (OTLP over gRPC or
//! HTTP), the sampling percentage and custom tags; with tracing enabled
//! in the mesh config and no provider, Istio's sampling without a tracer.

use proto::pb::envoy::config::core::v3::{GrpcService, HttpService, HttpUri, grpc_service, http_uri};
use proto::pb::envoy::config::trace::v3::tracing::{Http as TypedExtensionConfig, http};
use proto::pb::envoy::config::trace::v3::{OpenTelemetryConfig, ZipkinConfig, zipkin_config};
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing;
use proto::pb::envoy::r#type::tracing::v3::{CustomTag, custom_tag};
use proto::pb::envoy::r#type::v3::Percent;

use crate::mesh::{ExtensionProviderKind, MeshConfig};
use crate::model::telemetry::{self, TracingSpec};

use super::super::util::{any, u32v};
use super::ProviderError;
use crate::pushctx::Proxy;
use crate::pushctx::context::IstioContext;

/// Istio's sampling percentage when neither Telemetry nor the proxy's
/// ProxyConfig (`tracing.sampling`, from the Pod or the mesh's
/// `defaultConfig`) sets one (`PILOT_TRACE_SAMPLING`).
const DEFAULT_SAMPLING: f64 = 1.0;
/// The Zipkin collector path Istio uses.
const ZIPKIN_PATH: &str = "/api/v2/spans";

/// The HCM's tracing for `spec` (or the mesh's legacy tracing without a
/// provider when `spec` is `None` and `enableTracing` is true).
pub fn hcm_tracing(
    ctx: &IstioContext,
    proxy: &Proxy,
    spec: Option<&TracingSpec>,
) -> Option<Tracing> {
    let mesh = &ctx.mesh;
    let sampling = spec
        .and_then(|s| s.random_sampling_percentage)
        .or(proxy.tracing_sampling)
        .or(mesh.telemetry.default_sampling)
        .unwrap_or(DEFAULT_SAMPLING);
    let Some(spec) = spec else {
        return (mesh.telemetry.enable_tracing == Some(true)).then(|| tracing(sampling, None));
    };
    let provider = match provider(ctx, proxy, mesh, &spec.provider) {
        Ok(p) => p,
        Err(why) => {
            tracing::warn!(target: "telemetry", provider = %spec.provider, "tracing provider not applied: {why}");
            return None;
        }
    };
    let mut t = tracing(
        sampling,
        (!spec.disable_span_reporting).then_some(provider.config),
    );
    t.max_path_tag_length = provider.max_tag_length.map(u32v);
    t.custom_tags = spec
        .custom_tags
        .iter()
        .filter_map(|(name, tag)| custom(name, tag))
        .collect();
    Some(t)
}

fn tracing(sampling: f64, provider: Option<TypedExtensionConfig>) -> Tracing {
    let percent = |value| Some(Percent { value });
    Tracing {
        client_sampling: percent(100.0),
        random_sampling: percent(sampling),
        overall_sampling: percent(100.0),
        provider,
        ..Default::default()
    }
}

struct Provider {
    config: TypedExtensionConfig,
    max_tag_length: Option<u32>,
}

/// A provider's `service` as a host name (`<ns>/<host>` or the host).
fn service_host(service: &str, domain: &str) -> String {
    match service.split_once('/') {
        Some((ns, host)) if !host.contains('.') => format!("{host}.{ns}.svc.{domain}"),
        Some((_, host)) => host.to_string(),
        None => service.to_string(),
    }
}

fn provider(
    ctx: &IstioContext,
    proxy: &Proxy,
    mesh: &MeshConfig,
    name: &str,
) -> Result<Provider, ProviderError> {
    let p = mesh
        .extension_providers
        .iter()
        .find(|p| p.name == name)
        .ok_or(ProviderError::NotFound)?;
    let (service, port) = match &p.kind {
        ExtensionProviderKind::Zipkin(z) => (&z.service, z.port),
        ExtensionProviderKind::OpenTelemetry(o) => (&o.service, o.port),
        other => {
            return Err(ProviderError::WrongKind {
                kind: other.key().to_string(),
                wanted: "zipkin and opentelemetry",
                section: "tracing",
            });
        }
    };
    let host = service_host(service, &ctx.domain);
    // The collector's cluster must be one the proxy has, or Envoy rejects
    // the listener: a sidecar's Sidecar scope must see the service.
    let visible = if proxy.proxy_type == common::ProxyType::Router {
        ctx.registry.by_hostname(&host).next().is_some()
    } else {
        ctx.scope(proxy).service(&host).is_some()
    };
    if !visible {
        return Err(ProviderError::NotVisible(host));
    }
    let cluster = crate::pushctx::names::outbound_name(port as u16, "", &host);
    Ok(match &p.kind {
        ExtensionProviderKind::Zipkin(z) => Provider {
            config: TypedExtensionConfig {
                name: "envoy.tracers.zipkin".into(),
                config_type: Some(http::ConfigType::TypedConfig(any(&ZipkinConfig {
                    collector_cluster: cluster,
                    collector_endpoint: z.path.clone().unwrap_or_else(|| ZIPKIN_PATH.into()),
                    trace_id_128bit: !z.enable64bit_trace_id,
                    shared_span_context: Some(proto::pb::google::protobuf::BoolValue {
                        value: false,
                    }),
                    collector_endpoint_version: zipkin_config::CollectorEndpointVersion::HttpJson
                        as i32,
                    collector_hostname: host,
                    ..Default::default()
                }))),
            },
            max_tag_length: z.max_tag_length,
        },
        ExtensionProviderKind::OpenTelemetry(o) => {
            let mut config = OpenTelemetryConfig {
                service_name: service_name(proxy),
                ..Default::default()
            };
            let timeout = |d: Option<std::time::Duration>| d.map(super::super::util::duration);
            match &o.http {
                Some(http) => {
                    config.http_service = Some(HttpService {
                        http_uri: Some(HttpUri {
                            uri: format!("http://{host}:{port}{}", http.path),
                            timeout: Some(super::super::util::duration(
                                http.timeout.unwrap_or(std::time::Duration::from_secs(1)),
                            )),
                            http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(cluster)),
                        }),
                        ..Default::default()
                    });
                }
                None => {
                    config.grpc_service = Some(GrpcService {
                        timeout: timeout(o.grpc.as_ref().and_then(|g| g.timeout)),
                        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                            grpc_service::EnvoyGrpc {
                                cluster_name: cluster,
                                authority: host,
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    });
                }
            }
            Provider {
                config: TypedExtensionConfig {
                    name: "envoy.tracers.opentelemetry".into(),
                    config_type: Some(http::ConfigType::TypedConfig(any(&config))),
                },
                max_tag_length: o.max_tag_length,
            }
        }
        _ => unreachable!("refused above"),
    })
}

/// Istio's service name for spans: the workload's canonical service and
/// namespace.
pub fn service_name(proxy: &Proxy) -> String {
    let l = &proxy.labels;
    let canonical = l
        .get("service.istio.io/canonical-name")
        .or_else(|| l.get("app.kubernetes.io/name"))
        .or_else(|| l.get("app"))
        .cloned()
        .unwrap_or_else(|| proxy.id.split('.').next().unwrap_or_default().to_string());
    format!("{canonical}.{}", proxy.namespace)
}

fn custom(name: &str, tag: &telemetry::CustomTag) -> Option<CustomTag> {
    let r#type = if let Some(l) = &tag.literal {
        custom_tag::Type::Literal(custom_tag::Literal {
            value: l.value.clone(),
        })
    } else if let Some(e) = &tag.environment {
        custom_tag::Type::Environment(custom_tag::Environment {
            name: e.name.clone(),
            default_value: e.default_value.clone(),
        })
    } else if let Some(h) = &tag.header {
        custom_tag::Type::RequestHeader(custom_tag::Header {
            name: h.name.clone(),
            default_value: h.default_value.clone(),
        })
    } else {
        return None;
    };
    Some(CustomTag {
        tag: name.into(),
        r#type: Some(r#type),
    })
}
