//! Every top-level field of Istio's `MeshConfig` (`mesh/v1alpha1/config.proto`)
//! and what this istiod does with it, so that no field is accepted and left
//! unapplied. A field is either applied (parsed in `mesh.rs`), accepted only at
//! the value whose behaviour the generators already build (Istio's default), or
//! one that has no effect on sidecars and gateways in Istio either. Anything
//! else is refused naming the field, as is a key that is not a MeshConfig field.

use serde_json::{Map, Value};

/// What istiod does with one MeshConfig field.
enum Use {
    /// Parsed and applied by `Mesh::parse`, or by what it hands the injector.
    Applied,
    /// Only Istio's default is built: that value (or the field left out) is
    /// accepted, any other is refused with the reason.
    OnlyDefault(Default, &'static str),
    /// Configures ambient mode only (ztunnel, waypoints): Istio's sidecars and
    /// gateways do not read it either, so it is accepted as written.
    AmbientOnly,
}

/// The value a field must keep (besides being left out or null).
enum Default {
    /// A duration of this many seconds (`10s`, `10.0s`, `10000ms`).
    Seconds(u64),
    Bool(bool),
    /// One of these strings (an enum's names, or a name).
    Str(&'static [&'static str]),
    Zero,
    /// An empty list.
    EmptyList,
    /// An empty list or `["*"]`.
    Everywhere,
    /// Left out: no value is built.
    Absent,
}

impl Default {
    fn holds(&self, v: &Value) -> bool {
        if v.is_null() {
            return true;
        }
        match self {
            Default::Seconds(s) => v
                .as_str()
                .and_then(|d| common::duration::parse(d).ok())
                .is_some_and(|d| d == std::time::Duration::from_secs(*s)),
            Default::Bool(b) => v.as_bool() == Some(*b),
            Default::Str(names) => v.as_str().is_some_and(|s| names.contains(&s)),
            Default::Zero => v.as_u64() == Some(0),
            Default::EmptyList => v.as_array().is_some_and(Vec::is_empty),
            Default::Everywhere => v
                .as_array()
                .is_some_and(|a| a.is_empty() || (a.len() == 1 && a[0] == "*")),
            Default::Absent => false,
        }
    }

    fn describe(&self) -> String {
        match self {
            Default::Seconds(s) => format!("{s}s"),
            Default::Bool(b) => b.to_string(),
            Default::Str(names) => names
                .iter()
                .map(|n| format!("{n:?}"))
                .collect::<Vec<_>>()
                .join(" or "),
            Default::Zero => "0".into(),
            Default::EmptyList => "[]".into(),
            Default::Everywhere => "[\"*\"]".into(),
            Default::Absent => "left out".into(),
        }
    }
}

/// Every MeshConfig field, in the proto's order.
const FIELDS: &[(&str, Use)] = &[
    ("proxyListenPort", Use::Applied),
    ("proxyInboundListenPort", Use::Applied),
    (
        "proxyHttpPort",
        Use::OnlyDefault(
            Default::Zero,
            "the sidecar's HTTP proxy listener is not built",
        ),
    ),
    ("connectTimeout", Use::Applied),
    ("hboneIdleTimeout", Use::AmbientOnly),
    (
        "protocolDetectionTimeout",
        Use::OnlyDefault(
            Default::Seconds(0),
            "listeners use Istio's default (no timeout on protocol sniffing)",
        ),
    ),
    (
        "tcpKeepalive",
        Use::OnlyDefault(
            Default::Absent,
            "a mesh-wide keepalive is not built; set connectionPool.tcp.tcpKeepalive in a DestinationRule instead",
        ),
    ),
    (
        "ingressClass",
        Use::OnlyDefault(
            Default::Str(&["istio"]),
            "the Ingress translation serves class istio",
        ),
    ),
    (
        "ingressService",
        Use::OnlyDefault(
            Default::Str(&["istio-ingressgateway"]),
            "the Ingress translation uses Istio's default gateway",
        ),
    ),
    (
        "ingressControllerMode",
        Use::OnlyDefault(
            Default::Str(&["STRICT"]),
            "the Ingress translation serves Istio's STRICT mode: Ingresses naming class istio",
        ),
    ),
    (
        "ingressSelector",
        Use::OnlyDefault(
            Default::Str(&["", "ingressgateway"]),
            "Ingresses are served by the Pods labelled istio: ingressgateway",
        ),
    ),
    ("enableTracing", Use::Applied),
    ("accessLogFile", Use::Applied),
    ("accessLogFormat", Use::Applied),
    ("accessLogEncoding", Use::Applied),
    ("enableEnvoyAccessLogService", Use::Applied),
    (
        "disableEnvoyListenerLog",
        Use::OnlyDefault(
            Default::Bool(false),
            "listener-level access logs are not built, so there is nothing to disable",
        ),
    ),
    ("defaultConfig", Use::Applied),
    ("outboundTrafficPolicy", Use::Applied),
    ("inboundTrafficPolicy", Use::Applied),
    (
        "configSources",
        Use::OnlyDefault(
            Default::EmptyList,
            "istiod reads config from --configDir or the Kubernetes API (--registries); MCP sources are not built",
        ),
    ),
    (
        "enableAutoMtls",
        Use::OnlyDefault(
            Default::Bool(true),
            "clients always choose mTLS for mesh endpoints, as Istio's auto mTLS does",
        ),
    ),
    ("trustDomain", Use::Applied),
    (
        "trustDomainAliases",
        Use::OnlyDefault(
            Default::EmptyList,
            "authorization matches the mesh's own trust domain only",
        ),
    ),
    (
        "caCertificates",
        Use::OnlyDefault(
            Default::EmptyList,
            "extra trust roots for workloads are not distributed",
        ),
    ),
    (
        "defaultServiceExportTo",
        Use::OnlyDefault(
            Default::Everywhere,
            "objects without exportTo are visible everywhere, Istio's default",
        ),
    ),
    (
        "defaultVirtualServiceExportTo",
        Use::OnlyDefault(
            Default::Everywhere,
            "objects without exportTo are visible everywhere, Istio's default",
        ),
    ),
    (
        "defaultDestinationRuleExportTo",
        Use::OnlyDefault(
            Default::Everywhere,
            "objects without exportTo are visible everywhere, Istio's default",
        ),
    ),
    ("rootNamespace", Use::Applied),
    ("localityLbSetting", Use::Applied),
    (
        "zoneAwareLbSetting",
        Use::OnlyDefault(
            Default::Absent,
            "zone-aware balancing settings are not built; use localityLbSetting",
        ),
    ),
    ("dnsRefreshRate", Use::Applied),
    (
        "h2UpgradePolicy",
        Use::OnlyDefault(
            Default::Str(&["DO_NOT_UPGRADE"]),
            "upgrading HTTP/1.1 connections to HTTP/2 is not built; set connectionPool.http.h2UpgradePolicy in a DestinationRule instead",
        ),
    ),
    (
        "inboundClusterStatName",
        Use::OnlyDefault(
            Default::Str(&[""]),
            "clusters keep their own names in statistics",
        ),
    ),
    (
        "outboundClusterStatName",
        Use::OnlyDefault(
            Default::Str(&[""]),
            "clusters keep their own names in statistics",
        ),
    ),
    (
        "certificates",
        Use::OnlyDefault(
            Default::EmptyList,
            "deprecated in Istio; DNS certificates for istiod are not built",
        ),
    ),
    (
        "serviceSettings",
        Use::OnlyDefault(
            Default::EmptyList,
            "its settings (clusterLocal) take effect across several clusters, which this istiod does not serve yet",
        ),
    ),
    ("serviceScopeConfigs", Use::AmbientOnly),
    ("enablePrometheusMerge", Use::Applied),
    (
        "verifyCertificateAtClient",
        Use::OnlyDefault(
            Default::Bool(true),
            "clients always verify the server certificate when a DestinationRule originates TLS",
        ),
    ),
    (
        "ca",
        Use::OnlyDefault(
            Default::Absent,
            "istiod signs workload certificates itself; an external CA is not built",
        ),
    ),
    ("extensionProviders", Use::Applied),
    ("defaultProviders", Use::Applied),
    ("discoverySelectors", Use::Applied),
    ("pathNormalization", Use::Applied),
    (
        "defaultHttpRetryPolicy",
        Use::OnlyDefault(
            Default::Absent,
            "routes use Istio's default retries; set retries in a VirtualService instead",
        ),
    ),
    (
        "meshMTLS",
        Use::OnlyDefault(
            Default::Absent,
            "the mesh's mTLS uses Istio's default TLS versions and ciphers",
        ),
    ),
    (
        "tlsDefaults",
        Use::OnlyDefault(
            Default::Absent,
            "TLS origination uses Istio's default curves and ciphers",
        ),
    ),
    (
        "defaultTrafficPolicy",
        Use::OnlyDefault(
            Default::Absent,
            "a mesh-wide traffic policy is not built; use a DestinationRule in the root namespace",
        ),
    ),
    ("serviceEntryVisibility", Use::AmbientOnly),
];

/// Whether `Mesh::parse` reads this field.
pub(super) fn applied(key: &str) -> bool {
    FIELDS
        .iter()
        .any(|(name, u)| *name == key && matches!(u, Use::Applied))
}

/// Adds an error for each field of `mesh` that is not applied at the value
/// written, and for each key that is not a MeshConfig field.
pub(super) fn check(mesh: &Map<String, Value>, errors: &mut Vec<String>) {
    for (key, value) in mesh {
        match FIELDS.iter().find(|(name, _)| name == key) {
            None => errors.push(format!(
                "{key}: unknown field (not a field of Istio's MeshConfig)"
            )),
            Some((_, Use::OnlyDefault(default, why))) if !default.holds(value) => {
                errors.push(format!(
                    "{key}: {value} is not supported, only {} ({why})",
                    default.describe()
                ));
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(yaml: &str) -> Vec<String> {
        let map: Map<String, Value> = serde_yaml_ng::from_str(yaml).unwrap();
        let mut errors = Vec::new();
        check(&map, &mut errors);
        errors
    }

    #[test]
    fn istios_defaults_written_out_are_accepted() {
        let all = errors(
            "connectTimeout: 10s\nprotocolDetectionTimeout: 0s\ningressClass: istio\ningressService: istio-ingressgateway\ningressControllerMode: STRICT\nenableAutoMtls: true\ntrustDomainAliases: []\ndefaultServiceExportTo: ['*']\ndefaultVirtualServiceExportTo: []\ndnsRefreshRate: 60s\nh2UpgradePolicy: DO_NOT_UPGRADE\ncertificates: []\nserviceSettings: []\nhboneIdleTimeout: 1h\nproxyHttpPort: 0\n",
        );
        assert!(all.is_empty(), "{all:?}");
    }

    #[test]
    fn other_values_are_refused_naming_field_and_reason() {
        let all = errors(
            "protocolDetectionTimeout: 1s\ningressClass: nginx\nenableAutoMtls: false\ntrustDomainAliases: [old.example]\ndefaultServiceExportTo: ['.']\nh2UpgradePolicy: UPGRADE\ndefaultHttpRetryPolicy: {attempts: 5}\nca: {address: ca.example:443}\n",
        );
        assert_eq!(all.len(), 8, "{all:#?}");
        assert!(
            all.iter().any(
                |e| e.starts_with("protocolDetectionTimeout: \"1s\" is not supported, only 0s")
            ),
            "{all:?}"
        );
        assert!(all.iter().any(|e| e.starts_with("ingressClass: \"nginx\"")));
        assert!(all.iter().any(|e| e.starts_with("enableAutoMtls: false")));
        assert!(
            all.iter()
                .any(|e| e.starts_with("defaultHttpRetryPolicy:") && e.contains("only left out"))
        );
    }

    #[test]
    fn keys_that_are_not_mesh_config_fields_are_refused() {
        let all = errors("accesLogFile: /dev/stdout\nmixerCheckServer: x\n");
        assert_eq!(
            all,
            [
                "accesLogFile: unknown field (not a field of Istio's MeshConfig)",
                "mixerCheckServer: unknown field (not a field of Istio's MeshConfig)"
            ]
        );
    }

    #[test]
    fn every_applied_field_is_parsed() {
        // `MeshConfigFile` refuses unknown fields: each field marked applied
        // must be one it reads.
        for (name, use_) in FIELDS {
            if matches!(use_, Use::Applied) {
                let e = super::super::Mesh::parse(&format!("{name}: null\n")).err();
                let e = e.unwrap_or_default().join("; ");
                assert!(!e.contains("unknown field"), "{name}: {e}");
            }
        }
    }
}
