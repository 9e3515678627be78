//! Telemetry applied to what Envoy receives (Istio's `configureTracing`
//! and `setHTTPAccessLog` / `setTCPAccessLog`): the access loggers and
//! tracing a workload's Telemetry and the mesh config put in force, added
//! to every HTTP connection manager and TCP proxy of its listeners, with
//! the `CLIENT` settings on outbound and gateway listeners and the `SERVER`
//! ones on inbound listeners.

mod access_log;
mod tracing;

use prost::Message;
use proto::pb::envoy::config::accesslog::v3::AccessLog;
use proto::pb::envoy::config::listener::v3::{Filter, Listener, filter};
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing;
use proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;

use crate::model::telemetry::{self as model, Applicable, WorkloadMode};

use super::util::any;
use crate::pushctx::Proxy;
use crate::pushctx::context::IstioContext;

/// Why a provider a Telemetry names is left out (logged, as Istio does).
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// No `extensionProviders` entry has the name.
    #[error("no extensionProviders entry has this name (add one to the mesh config)")]
    NotFound,
    /// The provider is of a kind this use does not take.
    #[error("it is a {kind} provider; this istiod applies {wanted} providers to {section}")]
    WrongKind {
        /// The provider's kind.
        kind: String,
        /// The kinds that apply.
        wanted: &'static str,
        /// `accessLogging` or `tracing`.
        section: &'static str,
    },
    /// The collector's service is not one the proxy has a cluster for.
    #[error(
        "no service {0} in the registry visible to this proxy (check the provider's service and the Sidecar's egress hosts)"
    )]
    NotVisible(String),
}

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
    let mut key = format!("{providers:?}/{spec:?}/{:?}", proxy.tracing_sampling);
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

/// Whether `proxy`'s standard metrics are reported, per side (Istio's
/// default: both), for the generator of the `istio_*` metrics.
pub fn metrics_reporting(ctx: &IstioContext, proxy: &Proxy) -> model::MetricsReporting {
    let applicable = Applicable::find(&ctx.telemetries, &proxy.namespace, &proxy.labels);
    let prometheus: Vec<String> = ctx
        .mesh
        .extension_providers
        .iter()
        .filter(|p| p.kind == crate::mesh::ExtensionProviderKind::Prometheus)
        .map(|p| p.name.clone())
        .collect();
    model::metrics_reporting(
        &applicable,
        &ctx.mesh.telemetry.default_providers,
        &prometheus,
    )
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

#[cfg(test)]
mod tests {
    use proto::pb::envoy::config::listener::v3::FilterChain;
    use proto::pb::envoy::config::trace::v3::ZipkinConfig;
    use proto::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog;

    use super::access_log::{CEL_FILTER, DEFAULT_JSON_LABELS};
    use super::*;
    use crate::mesh::Mesh;

    const SAMPLE: &str = include_str!("../../samples/mesh/httpbin.yaml");
    const ZIPKIN: &str = "---\napiVersion: v1\nkind: Service\nmetadata: {name: zipkin, namespace: istio-system}\nspec:\n  clusterIP: 198.19.0.50\n  ports: [{name: http, port: 9411}]\n";

    fn ctx(extra: &str, mesh: &str) -> IstioContext {
        crate::pushctx::context::context_of_yaml(&format!("{SAMPLE}{ZIPKIN}{extra}"))
            .with_mesh(Mesh::parse(mesh).unwrap().config)
    }

    fn proxy(app: &str) -> Proxy {
        Proxy {
            id: format!("{app}-1.demo"),
            namespace: "demo".into(),
            labels: [("app".to_string(), app.to_string())].into(),
            ..Default::default()
        }
    }

    fn listener() -> Listener {
        let hcm = HttpConnectionManager {
            stat_prefix: "x".into(),
            ..Default::default()
        };
        let tcp = TcpProxy {
            stat_prefix: "y".into(),
            ..Default::default()
        };
        let chain = |name: &str, cfg| FilterChain {
            filters: vec![Filter {
                name: name.into(),
                config_type: Some(filter::ConfigType::TypedConfig(cfg)),
            }],
            ..Default::default()
        };
        Listener {
            filter_chains: vec![chain(HCM, any(&hcm))],
            default_filter_chain: Some(chain(TCP_PROXY, any(&tcp))),
            ..Default::default()
        }
    }

    fn decoded(l: &Listener) -> (HttpConnectionManager, TcpProxy) {
        let typed = |c: &proto::pb::envoy::config::listener::v3::FilterChain| match &c.filters[0]
            .config_type
        {
            Some(filter::ConfigType::TypedConfig(a)) => a.value.clone(),
            _ => Vec::new(),
        };
        (
            HttpConnectionManager::decode(typed(&l.filter_chains[0]).as_slice()).unwrap(),
            TcpProxy::decode(typed(l.default_filter_chain.as_ref().unwrap()).as_slice()).unwrap(),
        )
    }

    fn file_log(a: &AccessLog) -> FileAccessLog {
        match &a.config_type {
            Some(proto::pb::envoy::config::accesslog::v3::access_log::ConfigType::TypedConfig(
                t,
            )) => FileAccessLog::decode(t.value.as_slice()).unwrap(),
            None => panic!("no config"),
        }
    }

    #[test]
    fn the_mesh_access_log_file_goes_on_every_hcm_and_tcp_proxy_until_a_telemetry_disables_it() {
        let off = "---\napiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: off, namespace: demo}\nspec:\n  selector: {matchLabels: {app: sleep}}\n  accessLogging: [{match: {mode: CLIENT}, disabled: true}]\n";
        let ctx = ctx(off, "accessLogFile: /dev/stdout\n");
        let httpbin = for_proxy(&ctx, &proxy("httpbin"));
        let mut l = vec![listener()];
        apply(&httpbin.client, &mut l);
        let (hcm, tcp) = decoded(&l[0]);
        assert_eq!(hcm.access_log.len(), 1);
        assert_eq!(tcp.access_log.len(), 1);
        let f = file_log(&hcm.access_log[0]);
        assert_eq!(f.path, "/dev/stdout");
        assert!(format!("{f:?}").contains("%UPSTREAM_CLUSTER_RAW%"));
        assert!(hcm.tracing.is_none());
        // sleep's client side is off, its server side still logs.
        let sleep = for_proxy(&ctx, &proxy("sleep"));
        let mut l = vec![listener()];
        apply(&sleep.client, &mut l);
        assert!(decoded(&l[0]).0.access_log.is_empty());
        assert_eq!(sleep.server.access_logs.len(), 1);
        assert_ne!(sleep.client.key, httpbin.client.key);
    }

    #[test]
    fn json_encoding_uses_istios_labels_and_a_filter_becomes_a_cel_filter() {
        let filtered = "---\napiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: errors, namespace: demo}\nspec:\n  accessLogging: [{filter: {expression: 'response.code >= 400'}}]\n";
        let ctx = ctx(
            filtered,
            "accessLogFile: /tmp/access.log\naccessLogEncoding: JSON\n",
        );
        let t = for_proxy(&ctx, &proxy("sleep"));
        let log = &t.client.access_logs[0];
        let f = file_log(log);
        assert_eq!(f.path, "/tmp/access.log");
        let text = format!("{f:?}");
        for (k, _) in DEFAULT_JSON_LABELS {
            assert!(text.contains(k), "{k} missing");
        }
        let filter = format!("{:?}", log.filter);
        assert!(
            filter.contains(CEL_FILTER) && filter.contains("ExpressionFilter"),
            "{filter}"
        );
    }

    #[test]
    fn a_zipkin_provider_traces_to_the_services_outbound_cluster() {
        let tracing = "---\napiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: mesh, namespace: istio-system}\nspec:\n  tracing:\n  - providers: [{name: zipkin}]\n    randomSamplingPercentage: 42\n    customTags: {env: {environment: {name: POD_NAME}}, h: {header: {name: x-h, defaultValue: none}}}\n";
        let mesh = "extensionProviders:\n- name: zipkin\n  zipkin: {service: zipkin.istio-system.svc.cluster.local, port: 9411, maxTagLength: 99}\n";
        let ctx = ctx(tracing, mesh);
        let t = for_proxy(&ctx, &proxy("sleep"));
        let tr = t.server.tracing.as_ref().unwrap();
        assert_eq!(tr.random_sampling.as_ref().unwrap().value, 42.0);
        assert_eq!(tr.max_path_tag_length.as_ref().unwrap().value, 99);
        assert_eq!(tr.custom_tags.len(), 2);
        let p = tr.provider.as_ref().unwrap();
        assert_eq!(p.name, "envoy.tracers.zipkin");
        let Some(proto::pb::envoy::config::trace::v3::tracing::http::ConfigType::TypedConfig(a)) =
            &p.config_type
        else {
            panic!("no zipkin config")
        };
        let z = ZipkinConfig::decode(a.value.as_slice()).unwrap();
        assert_eq!(
            z.collector_cluster,
            "outbound|9411||zipkin.istio-system.svc.cluster.local"
        );
        assert_eq!(z.collector_endpoint, "/api/v2/spans");
        assert!(t.client.access_logs.is_empty());
        // Without a Telemetry or a default provider there is no tracing;
        // enableTracing alone gives Istio's 1% sampling without a tracer.
        let plain = for_proxy(&self::ctx("", mesh), &proxy("sleep"));
        assert!(plain.client.tracing.is_none());
        let legacy = for_proxy(&self::ctx("", "enableTracing: true\n"), &proxy("sleep"));
        let tr = legacy.client.tracing.unwrap();
        assert_eq!(tr.random_sampling.unwrap().value, 1.0);
        assert!(tr.provider.is_none());
        // The proxy's own ProxyConfig (`tracing.sampling` in PROXY_CONFIG)
        // wins over the mesh's default, as Istio's.
        let mut own = proxy("sleep");
        own.tracing_sampling = Some(25.0);
        let ctx = self::ctx(
            "",
            "enableTracing: true\ndefaultConfig: {tracing: {sampling: 5}}\n",
        );
        let tr = for_proxy(&ctx, &own).client.tracing.unwrap();
        assert_eq!(tr.random_sampling.unwrap().value, 25.0);
        let tr = for_proxy(&ctx, &proxy("sleep")).client.tracing.unwrap();
        assert_eq!(tr.random_sampling.unwrap().value, 5.0);
    }

    #[test]
    fn one_mesh_wide_telemetry_turns_access_logs_and_metrics_off_and_on() {
        let shape = |disabled: bool| {
            format!(
                "---\napiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {{name: mesh-default, namespace: istio-system}}\nspec:\n  accessLogging:\n  - providers: [{{name: envoy}}]\n    disabled: {disabled}\n  metrics:\n  - providers: [{{name: prometheus}}]\n    overrides:\n    - match: {{metric: ALL_METRICS, mode: CLIENT_AND_SERVER}}\n      disabled: {disabled}\n"
            )
        };
        for disabled in [true, false] {
            let ctx = ctx(&shape(disabled), "");
            let t = for_proxy(&ctx, &proxy("sleep"));
            assert_eq!(t.client.access_logs.is_empty(), disabled, "client logs");
            assert_eq!(t.server.access_logs.is_empty(), disabled, "server logs");
            let m = metrics_reporting(&ctx, &proxy("sleep"));
            assert_eq!((m.client, m.server), (!disabled, !disabled), "metrics");
        }
    }

    #[test]
    fn a_collector_outside_the_sidecar_scope_is_left_out() {
        let config = "---\napiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: default, namespace: demo}\nspec:\n  egress: [{hosts: [\"./*\"]}]\n---\napiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: mesh, namespace: istio-system}\nspec:\n  tracing: [{providers: [{name: zipkin}]}]\n";
        let mesh = "extensionProviders:\n- name: zipkin\n  zipkin: {service: istio-system/zipkin, port: 9411}\n";
        let t = for_proxy(&ctx(config, mesh), &proxy("sleep"));
        assert!(t.client.tracing.is_none());
        let visible = for_proxy(&ctx(&config.replace("./*", "*/*"), mesh), &proxy("sleep"));
        assert!(visible.client.tracing.is_some());
    }

    #[test]
    fn metrics_reporting_follows_telemetry_overrides() {
        let off = "---\napiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: m, namespace: istio-system}\nspec:\n  metrics: [{overrides: [{match: {mode: SERVER}, disabled: true}]}]\n";
        let r = metrics_reporting(&ctx(off, ""), &proxy("sleep"));
        assert!(r.client && !r.server);
        let r = metrics_reporting(&ctx("", ""), &proxy("sleep"));
        assert!(r.client && r.server);
    }
}
