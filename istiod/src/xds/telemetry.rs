//! Telemetry applied to what Envoy receives (Istio's `configureTracing`
//! and `setHTTPAccessLog` / `setTCPAccessLog`): the access loggers and
//! tracing a workload's Telemetry and the mesh config put in force, added
//! to every HTTP connection manager and TCP proxy of its listeners, with
//! the `CLIENT` settings on outbound and gateway listeners and the `SERVER`
//! ones on inbound listeners.

mod access_log;
mod tracing;

pub use access_log::{CEL_FILTER, DEFAULT_JSON_LABELS, DEFAULT_TEXT_FORMAT, FILE_ACCESS_LOG};

use prost::Message;
use proto::pb::envoy::config::accesslog::v3::AccessLog;
use proto::pb::envoy::config::listener::v3::{Filter, Listener, filter};
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing;
use proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;

use crate::model::telemetry::{self as model, Applicable, WorkloadMode};

use super::Proxy;
use super::context::IstioContext;
use super::util::any;

const HCM: &str = "envoy.filters.network.http_connection_manager";
const TCP_PROXY: &str = "envoy.filters.network.tcp_proxy";

/// What one side of a workload's traffic gets.
#[derive(Debug, Clone, Default)]
pub struct SideTelemetry {
    access_logs: Vec<AccessLog>,
    tracing: Option<Tracing>,
    /// What the listeners built with this depend on (a cache key part).
    pub key: String,
}

/// The telemetry of one proxy's outbound (client) and inbound (server) side.
#[derive(Debug, Clone, Default)]
pub struct ProxyTelemetry {
    /// Outbound and gateway listeners.
    pub client: SideTelemetry,
    /// Inbound listeners.
    pub server: SideTelemetry,
}

/// Resolves the Telemetry and mesh config in force for `proxy`.
pub fn for_proxy(ctx: &IstioContext, proxy: &Proxy) -> ProxyTelemetry {
    let applicable = Applicable::find(&ctx.telemetries, &proxy.namespace, &proxy.labels);
    ProxyTelemetry {
        client: side(ctx, proxy, &applicable, WorkloadMode::Client),
        server: side(ctx, proxy, &applicable, WorkloadMode::Server),
    }
}

fn side(
    ctx: &IstioContext,
    proxy: &Proxy,
    applicable: &Applicable<'_>,
    mode: WorkloadMode,
) -> SideTelemetry {
    let t = &ctx.mesh.telemetry;
    let providers = model::access_logging(
        applicable,
        &t.default_providers,
        !t.access_log_file.is_empty(),
        mode,
    );
    let spec = model::tracing(applicable, &t.default_providers, mode);
    let access_logs = access_log::access_logs(&ctx.mesh, &providers);
    let tracing = tracing::hcm_tracing(ctx, proxy, spec.as_ref());
    let mut key = format!("{providers:?}/{spec:?}");
    if let Some(t) = &tracing {
        // The OpenTelemetry tracer names the workload.
        if t.provider
            .as_ref()
            .is_some_and(|p| p.name.contains("opentelemetry"))
        {
            key.push_str(&tracing::service_name(proxy));
        }
    }
    SideTelemetry {
        access_logs,
        tracing,
        key,
    }
}

/// Adds `side`'s access loggers to every HTTP connection manager and TCP
/// proxy of `listeners`, and its tracing to every HTTP connection manager.
pub fn apply(side: &SideTelemetry, listeners: &mut [Listener]) {
    if side.access_logs.is_empty() && side.tracing.is_none() {
        return;
    }
    for l in listeners {
        let chains = l
            .filter_chains
            .iter_mut()
            .chain(l.default_filter_chain.iter_mut());
        for chain in chains {
            for f in &mut chain.filters {
                patch(side, f);
            }
        }
    }
}

fn patch(side: &SideTelemetry, f: &mut Filter) {
    let Some(filter::ConfigType::TypedConfig(typed)) = &mut f.config_type else {
        return;
    };
    match f.name.as_str() {
        HCM => {
            let Ok(mut hcm) = HttpConnectionManager::decode(typed.value.as_slice()) else {
                return;
            };
            hcm.access_log.extend(side.access_logs.iter().cloned());
            if hcm.tracing.is_none() {
                hcm.tracing.clone_from(&side.tracing);
            }
            *typed = any(&hcm);
        }
        TCP_PROXY if !side.access_logs.is_empty() => {
            let Ok(mut tcp) = TcpProxy::decode(typed.value.as_slice()) else {
                return;
            };
            tcp.access_log.extend(side.access_logs.iter().cloned());
            *typed = any(&tcp);
        }
        _ => {}
    }
}
