//! Which fields of Istio's `ProxyConfig` (`mesh/v1alpha1/proxy.proto`) this
//! mesh applies, so that none is accepted and left unapplied. The agent
//! checks the ProxyConfig it merges, istiod the mesh config's `defaultConfig`
//! and a Pod's `proxy.istio.io/config` at injection; each refuses a field
//! that is set and not built, naming it.
//!
//! Applied: by the agent (bootstrap, Envoy's command line, drain, status
//! port, statistics), by istiod (`gatewayTopology`, `tracing.sampling`), by
//! the agent and istiod together
//! (`readinessProbe`: the agent probes, istiod writes a registered
//! WorkloadEntry's health) or by the injector (`concurrency`, `image`,
//! `holdApplicationUntilProxyStarts`, `proxyMetadata`). Accepted without
//! effect, as in Istio: the deprecated `discoveryRefreshDelay`,
//! `zipkinAddress` (applied as the zipkin tracer), `envoyMetricsServiceAddress`,
//! `availabilityZone`, `sds`, `parentShutdownDuration`, and `statNameLength`
//! and `meshId`, which Istio's agent and istiod no longer read.

use serde_json::{Map, Value};

/// Fields that are refused whenever they are set, with the reason.
const REFUSED: &[(&str, &str)] = &[
    (
        "proxyBootstrapTemplatePath",
        "the agent writes its own bootstrap; custom bootstrap templates are not supported (customConfigFile replaces the whole Envoy config)",
    ),
    (
        "privateKeyProvider",
        "the CryptoMB and QAT private key providers are not in upstream Envoy",
    ),
    (
        "caCertificatesPem",
        "extra trust roots are not added to the workload's root certificates",
    ),
    (
        "proxyHeaders",
        "per-proxy header settings (server, x-request-id, attempt count, forwarded client certificate, debug headers) are not built",
    ),
];

/// `tracing` settings the mesh applies: the zipkin tracer's address (agent)
/// and the sampling percentage (istiod).
const TRACING_APPLIED: &[&str] = &["zipkin", "sampling"];

/// One refused field: its path in the ProxyConfig and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unapplied {
    /// The field's path (`proxyHeaders`, `tracing.datadog`).
    pub field: String,
    /// Why it is not applied.
    pub reason: &'static str,
}

impl std::fmt::Display for Unapplied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is not supported: {}", self.field, self.reason)
    }
}

fn set(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::String(s) => !s.is_empty(),
        _ => true,
    }
}

/// Every field of `pc` (a ProxyConfig as JSON) that is set and not applied.
pub fn unapplied(pc: &Map<String, Value>) -> Vec<Unapplied> {
    let mut out: Vec<Unapplied> = REFUSED
        .iter()
        .filter(|(name, _)| pc.get(*name).is_some_and(set))
        .map(|(name, reason)| Unapplied {
            field: (*name).to_string(),
            reason,
        })
        .collect();
    if let Some(Value::Object(tracing)) = pc.get("tracing") {
        out.extend(
            tracing
                .iter()
                .filter(|(k, v)| !TRACING_APPLIED.contains(&k.as_str()) && set(v))
                .map(|(k, _)| Unapplied {
                    field: format!("tracing.{k}"),
                    reason: "only the zipkin tracer and sampling are built from ProxyConfig; configure other tracers with the Telemetry API and extensionProviders",
                }),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(pc: Value) -> Vec<String> {
        let Value::Object(pc) = pc else {
            panic!("not an object")
        };
        unapplied(&pc).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn applied_and_deprecated_fields_pass() {
        let out = check(serde_json::json!({
            "concurrency": 2, "discoveryAddress": "istiod.istio-system.svc:15012",
            "tracing": {"zipkin": {"address": "zipkin:9411"}, "sampling": 10},
            "statNameLength": 189, "meshId": "m", "availabilityZone": "z",
            "caCertificatesPem": [], "proxyHeaders": {}
        }));
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn set_fields_that_are_not_built_are_named() {
        let out = check(serde_json::json!({
            "proxyHeaders": {"server": {"disabled": true}},
            "privateKeyProvider": {"cryptomb": {}},
            "tracing": {"datadog": {"address": "dd:8126"}, "customTags": {"a": {"literal": {"value": "b"}}}}
        }));
        assert_eq!(
            out.iter()
                .map(|e| e.split(' ').next().unwrap())
                .collect::<Vec<_>>(),
            [
                "privateKeyProvider",
                "proxyHeaders",
                "tracing.customTags",
                "tracing.datadog"
            ],
            "{out:?}"
        );
    }
}
