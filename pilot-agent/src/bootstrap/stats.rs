//! Envoy's stats config: Istio's tag extraction rules, the inclusion list
//! (what Envoy keeps beyond Istio's required stats), and the stats sinks.

use std::collections::BTreeSet;

use common::NodeMetadata;
use prost::Name;
use proto::pb::envoy::config::metrics::v3::{MetricsServiceConfig, StatsdSink};
use serde_json::{Value, json};

use super::BootstrapOptions;

/// Stats names Envoy keeps beyond Istio's required ones (annotations
/// `sidecar.istio.io/statsInclusion{Prefixes,Suffixes,Regexps}`, else
/// `ProxyConfig.proxyStatsMatcher`). `{pod_ip}` is expanded for each instance IP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsInclusion {
    /// Extra prefixes.
    pub prefixes: Vec<String>,
    /// Extra suffixes.
    pub suffixes: Vec<String>,
    /// Extra RE2 regular expressions.
    pub regexps: Vec<String>,
}

/// Istio's stats tags, in the template's order; `extra` tags go after `mongo_prefix`.
fn stats_tags(extra: &[String]) -> Vec<Value> {
    let tag = |name: &str, regex: &str| json!({"tag_name": name, "regex": regex});
    let mut tags = vec![
        tag("cluster_name", r"^cluster(\.(.+);)"),
        tag(
            "http_conn_manager_prefix",
            r"^http\.(((?:[_.[:digit:]\w]*|[_\[\]aAbBcCdDeEfF[:digit:]\w\:]*));\.)",
        ),
        tag("thread_name", r"^server(\.(.+))\.watchdog"),
        tag("tcp_prefix", r"^tcp\.((.*?)\.)\w+?$"),
        tag("response_code", r"_rq(_(\d{3}))$"),
        tag("response_code_class", r"_rq(_(\dxx))$"),
        tag(
            "http_conn_manager_listener_prefix",
            r"^listener(?=\.).*?\.http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)",
        ),
        tag(
            "listener_address",
            r"^listener\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)",
        ),
        tag(
            "mongo_prefix",
            r"^mongo\.(.+?)\.(collection|cmd|cx_|op_|delays_|decoding_)(.*?)$",
        ),
    ];
    let mut seen = BTreeSet::new();
    for name in extra {
        if !name.is_empty() && seen.insert(name.as_str()) {
            tags.push(tag(name, &format!(r"({name}=\.=(.*?);\.;)")));
        }
    }
    tags.extend([
        tag("cache", r"(cache\.(.+?)\.)"),
        tag("component", r"(component\.(.+?)\.)"),
        tag("tag", r"(tag\.(.+?);\.)"),
        tag("wasm_filter", r"(wasm_filter\.(.+?)\.)"),
        tag("authz_enforce_result", r"rbac(\.(allowed|denied))"),
        tag("authz_dry_run_action", r"(\.istio_dry_run_(allow|deny)_)"),
        tag("authz_dry_run_result", r"(\.shadow_(allowed|denied))"),
    ]);
    tags
}

/// Extra patterns followed by the required ones, `{pod_ip}` expanded per IP
/// (Istio's `parseOption` + `substituteValues`).
fn inclusion(extra: &[String], required: &[&str], ips: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for pattern in extra
        .iter()
        .map(String::as_str)
        .chain(required.iter().copied())
    {
        if pattern.contains("{pod_ip}") {
            out.extend(ips.iter().map(|ip| pattern.replace("{pod_ip}", ip)));
        } else {
            out.push(pattern.to_string());
        }
    }
    out
}

/// `stats_config`; `metadata` gives the instance IPs `{pod_ip}` expands to.
pub(super) fn stats_config(opts: &BootstrapOptions, metadata: &NodeMetadata) -> Value {
    let ips: Vec<&str> = metadata
        .instance_ips
        .iter()
        .flatten()
        .map(String::as_str)
        .filter(|ip| !ip.is_empty())
        .collect();
    // Readiness reads these stats.
    const REQUIRED_PREFIXES: &[&str] = &[
        "cluster_manager",
        "listener_manager",
        "server",
        "cluster.xds-grpc",
        "wasm",
    ];
    let mut required_suffixes = vec![
        "rbac.allowed",
        "rbac.denied",
        "shadow_allowed",
        "shadow_denied",
    ];
    if opts.exit_on_zero_active_connections {
        // Draining polls the active connection count.
        required_suffixes.push("downstream_cx_active");
    }
    // Route-level metrics named by a VirtualService `stat_prefix`.
    const REQUIRED_REGEXPS: &[&str] = &[r"vhost\..*\.route\..*"];

    let extra = &opts.stats_inclusion;
    let mut patterns = vec![json!({"prefix": "reporter="})];
    patterns.extend(
        inclusion(&extra.prefixes, REQUIRED_PREFIXES, &ips)
            .into_iter()
            .map(|p| json!({"prefix": p})),
    );
    patterns.extend(
        inclusion(&extra.suffixes, &required_suffixes, &ips)
            .into_iter()
            .map(|s| json!({"suffix": s})),
    );
    patterns.extend(
        inclusion(&extra.regexps, REQUIRED_REGEXPS, &ips)
            .into_iter()
            .map(|r| json!({"safe_regex": {"regex": r}})),
    );
    patterns.push(json!({"prefix": "component"}));
    patterns.push(json!({"prefix": "istio"}));
    json!({
        "use_all_default_tags": false,
        "stats_tags": stats_tags(&opts.extra_stat_tags),
        "stats_matcher": {"inclusion_list": {"patterns": patterns}}
    })
}

pub(super) fn stats_sinks(opts: &BootstrapOptions) -> Vec<Value> {
    let mut sinks = Vec::new();
    if opts.envoy_metrics_service.is_some() {
        sinks.push(json!({
            "name": "envoy.stat_sinks.metrics_service",
            "typed_config": {
                "@type": MetricsServiceConfig::type_url(),
                "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": "envoy_metrics_service"}}
            }
        }));
    }
    if let Some(statsd) = &opts.statsd_address {
        sinks.push(json!({
            "name": "envoy.stat_sinks.statsd",
            "typed_config": {
                "@type": StatsdSink::type_url(),
                "address": {"socket_address": statsd.socket_address()}
            }
        }));
    }
    sinks
}

#[cfg(test)]
mod tests {
    use super::super::*;

    #[test]
    fn stats_inclusion_expands_pod_ip_and_keeps_required() {
        let mut metadata = Map::new();
        metadata.insert("INSTANCE_IPS".into(), json!("10.0.0.1,10.0.0.2"));
        let v = render(&BootstrapOptions {
            metadata,
            stats_inclusion: StatsInclusion {
                prefixes: vec!["http.{pod_ip}_".into()],
                suffixes: vec!["upstream_rq_timeout".into()],
                regexps: vec![r"http\.[0-9.]+_8080\..*".into()],
            },
            exit_on_zero_active_connections: true,
            extra_stat_tags: vec!["dest".into(), "dest".into(), String::new()],
            ..Default::default()
        });
        let patterns = v["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"]
            .as_array()
            .unwrap()
            .clone();
        let want = [
            json!({"prefix": "reporter="}),
            json!({"prefix": "http.10.0.0.1_"}),
            json!({"prefix": "http.10.0.0.2_"}),
            json!({"prefix": "cluster_manager"}),
        ];
        assert_eq!(patterns[..4], want);
        assert!(patterns.contains(&json!({"suffix": "upstream_rq_timeout"})));
        assert!(patterns.contains(&json!({"suffix": "downstream_cx_active"})));
        assert!(patterns.contains(&json!({"safe_regex": {"regex": r"http\.[0-9.]+_8080\..*"}})));
        let tags = v["stats_config"]["stats_tags"].as_array().unwrap();
        assert_eq!(tags.iter().filter(|t| t["tag_name"] == "dest").count(), 1);
        assert_eq!(
            tags[9],
            json!({"tag_name": "dest", "regex": r"(dest=\.=(.*?);\.;)"})
        );
    }
}
