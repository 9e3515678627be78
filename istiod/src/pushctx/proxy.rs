//! The connecting proxy, as Istio parses it from the xDS node
//! (`node.id` = `<type>~<ip>~<pod>.<namespace>~<namespace>.svc.<domain>`).

use std::collections::BTreeMap;

use common::{InterceptionMode, NodeMetadata, ProxyType};
use proto::pb::envoy::config::core::v3::Node;

/// A proxy connected over xDS.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Proxy {
    /// `sidecar`, `router`, ...: the node id's first field.
    pub proxy_type: ProxyType,
    /// The first IP (`INSTANCE_IPS` wins over the node id's).
    pub ip: String,
    /// All IPs.
    pub ips: Vec<String>,
    /// `<pod>.<namespace>`: what `?proxyID=` selects.
    pub id: String,
    /// The full node id.
    pub node_id: String,
    /// Config namespace: metadata `NAMESPACE`, else the DNS domain's first label.
    pub namespace: String,
    /// DNS domain.
    pub domain: String,
    /// Metadata `SERVICE_ACCOUNT`.
    pub service_account: Option<String>,
    /// Metadata `LABELS`.
    pub labels: BTreeMap<String, String>,
    /// Metadata `ISTIO_VERSION`.
    pub istio_version: String,
    /// The node metadata's string values, by key (what EnvoyFilter
    /// `match.proxy.metadata` compares).
    pub metadata: BTreeMap<String, String>,
    /// Metadata `CLUSTER_ID`.
    pub cluster_id: String,
    /// `node.locality` as `region/zone/subzone` (empty parts kept), what
    /// the proxy says of itself; the registry's locality of its workload
    /// wins (see `IstioContext::proxy_locality`).
    pub locality: String,
    /// Metadata `INTERCEPTION_MODE` (`REDIRECT` when absent or unknown, as
    /// Istio's `GetInterceptionMode`).
    pub interception_mode: InterceptionMode,
    /// Metadata `DNS_CAPTURE`.
    pub dns_capture: bool,
    /// Metadata `DNS_AUTO_ALLOCATE`.
    pub dns_auto_allocate: bool,
    /// Whether the connection proved an identity of the proxy's namespace
    /// (Istio's `VerifiedIdentity`): set on the authenticated port only,
    /// where [`Proxy::authorize`] passed. Credentials are served only then.
    pub verified: bool,
    /// `PROXY_CONFIG.gatewayTopology`: `None` when the node sent no
    /// ProxyConfig (the mesh's `defaultConfig` applies then, as Istio's
    /// `ProxyConfigOrDefault`), else its value (the default when unset).
    pub gateway_topology: Option<common::gateway_topology::GatewayTopology>,
    /// `PROXY_CONFIG.tracing.sampling`: the percentage of requests traced
    /// when no Telemetry sets one (the agent merges the mesh's
    /// `defaultConfig` and the Pod's `proxy.istio.io/config` into it).
    pub tracing_sampling: Option<f64>,
    /// The authenticated identity that matched the proxy (Istio's
    /// `VerifiedIdentity`), on the authenticated port.
    pub verified_identity: Option<common::Identity>,
    /// Metadata `AUTO_REGISTER_GROUP`: the WorkloadGroup to register with.
    pub auto_register_group: Option<String>,
    /// Metadata `NETWORK`.
    pub network: String,
    /// Whether `PROXY_CONFIG` has a `readinessProbe`: the agent reports the
    /// workload's health (Istio marks the entry health-checked).
    pub reports_health: bool,
}

/// The string values of a node's metadata.
fn string_metadata(node: &Node) -> BTreeMap<String, String> {
    use proto::pb::google::protobuf::value::Kind;
    node.metadata
        .iter()
        .flat_map(|m| &m.fields)
        .filter_map(|(k, v)| match &v.kind {
            Some(Kind::StringValue(s)) => Some((k.clone(), s.clone())),
            _ => None,
        })
        .collect()
}

/// A ProxyConfig's `gatewayTopology`, read leniently as the rest of the
/// node: a value that does not parse is logged and left at its default.
fn gateway_topology(
    pc: &serde_json::Map<String, serde_json::Value>,
) -> common::gateway_topology::GatewayTopology {
    pc.get("gatewayTopology")
        .and_then(|t| {
            serde_json::from_value(t.clone())
                .inspect_err(|e| tracing::warn!(%e, "PROXY_CONFIG.gatewayTopology ignored"))
                .ok()
        })
        .unwrap_or_default()
}

/// Why an xDS node is refused (`InvalidArgument` on the wire).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    /// The request has no node id.
    #[error("missing node information")]
    Missing,
    /// The id is not `<type>~<ip>~<pod>.<namespace>~<domain>`.
    #[error(
        "node id {0:?} does not have 4 parts separated by ~ (<type>~<ip>~<pod>.<namespace>~<domain>)"
    )]
    Shape(String),
    /// The id's first part is not a proxy type.
    #[error("invalid node type {kind:?} in node id {id:?}")]
    Type {
        /// The first part.
        kind: String,
        /// The node id.
        id: String,
    },
}

/// Why a proxy may not connect as itself (`PermissionDenied` on the wire).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "authorization failed: no identity of {identities:?} matches namespace {namespace:?} and service account {service_account:?}"
)]
pub struct AuthorizeError {
    /// The caller's authenticated identities.
    pub identities: Vec<String>,
    /// The proxy's namespace.
    pub namespace: String,
    /// The proxy's service account (empty when it sent none).
    pub service_account: String,
}

impl Proxy {
    /// Parses an xDS node. Errors say what is wrong, for `InvalidArgument`.
    pub fn from_node(node: &Node) -> Result<Self, NodeError> {
        if node.id.is_empty() {
            return Err(NodeError::Missing);
        }
        let parts: Vec<&str> = node.id.split('~').collect();
        let [proxy_type, ip, id, domain] = parts.as_slice() else {
            return Err(NodeError::Shape(node.id.clone()));
        };
        let Ok(proxy_type) = proxy_type.parse::<ProxyType>() else {
            return Err(NodeError::Type {
                kind: proxy_type.to_string(),
                id: node.id.clone(),
            });
        };
        // Read leniently: a value that does not fit its field is left out
        // (the field's default below), not a reason to refuse the node.
        let meta = node
            .metadata
            .as_ref()
            .map(NodeMetadata::from_struct)
            .unwrap_or_default();
        let ips: Vec<String> = meta
            .instance_ips
            .iter()
            .flatten()
            .map(|x| x.trim().to_string())
            .filter(|x| !x.is_empty())
            .collect();
        let ips = if ips.is_empty() {
            vec![ip.to_string()]
        } else {
            ips
        };
        let namespace = meta
            .namespace
            .filter(|n| !n.is_empty())
            .or_else(|| domain.split('.').next().map(String::from))
            .unwrap_or_default();
        Ok(Self {
            proxy_type,
            ip: ips[0].clone(),
            ips,
            id: id.to_string(),
            node_id: node.id.clone(),
            namespace,
            domain: domain.to_string(),
            service_account: meta.service_account.filter(|s| !s.is_empty()),
            labels: meta.labels.unwrap_or_default(),
            istio_version: meta.istio_version.unwrap_or_default(),
            metadata: string_metadata(node),
            cluster_id: meta.cluster_id.unwrap_or_default(),
            locality: node
                .locality
                .as_ref()
                .filter(|l| !(l.region.is_empty() && l.zone.is_empty() && l.sub_zone.is_empty()))
                .map(|l| format!("{}/{}/{}", l.region, l.zone, l.sub_zone))
                .unwrap_or_default(),
            interception_mode: meta.interception_mode.unwrap_or_default(),
            dns_capture: meta.dns_capture.unwrap_or_default(),
            dns_auto_allocate: meta.dns_auto_allocate.unwrap_or_default(),
            verified: false,
            tracing_sampling: meta
                .proxy_config
                .as_ref()
                .and_then(|pc| pc.get("tracing")?.get("sampling")?.as_f64())
                .filter(|p| (0.0..=100.0).contains(p)),
            gateway_topology: meta.proxy_config.as_ref().map(gateway_topology),
            verified_identity: None,
            auto_register_group: meta.auto_register_group.filter(|g| !g.is_empty()),
            network: meta.network.unwrap_or_default(),
            reports_health: meta
                .proxy_config
                .as_ref()
                .is_some_and(|pc| pc.get("readinessProbe").is_some_and(|p| !p.is_null())),
        })
    }

    /// What the autoregistration controller needs of the proxy.
    pub fn registrant(&self) -> crate::autoregistration::Registrant {
        crate::autoregistration::Registrant {
            id: self.id.clone(),
            namespace: self.namespace.clone(),
            ip: self.ip.clone(),
            group: self.auto_register_group.clone(),
            network: self.network.clone(),
            labels: self.labels.clone(),
            locality: self.locality.clone(),
            reports_health: self.reports_health,
            identity: self.verified_identity.clone(),
        }
    }

    /// Istio's identity check on :15012: some authenticated identity must be
    /// of the proxy's namespace and (when set) service account.
    /// Returns the identity that matched.
    pub fn authorize(
        &self,
        identities: &[common::Identity],
    ) -> Result<common::Identity, AuthorizeError> {
        let found = identities.iter().find(|id| {
            id.namespace == self.namespace
                && self
                    .service_account
                    .as_ref()
                    .is_none_or(|sa| &id.service_account == sa)
        });
        if let Some(id) = found {
            Ok(id.clone())
        } else {
            Err(AuthorizeError {
                identities: identities.iter().map(ToString::to_string).collect(),
                namespace: self.namespace.clone(),
                service_account: self.service_account.clone().unwrap_or_default(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::google::protobuf::{Struct, Value, value::Kind};

    fn node(id: &str, meta: &[(&str, &str)]) -> Node {
        Node {
            id: id.into(),
            metadata: Some(Struct {
                fields: meta
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.to_string(),
                            Value {
                                kind: Some(Kind::StringValue(v.to_string())),
                            },
                        )
                    })
                    .collect(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn parses_istio_node_ids() {
        let p = Proxy::from_node(&node(
            "sidecar~10.1.2.3~reviews-v1-abc.default~default.svc.cluster.local",
            &[
                ("SERVICE_ACCOUNT", "reviews"),
                ("INSTANCE_IPS", "10.1.2.3,fd00::1"),
            ],
        ))
        .unwrap();
        assert_eq!(p.id, "reviews-v1-abc.default");
        assert_eq!(p.namespace, "default");
        assert_eq!(p.ips, ["10.1.2.3", "fd00::1"]);
        assert_eq!(
            Proxy::from_node(&node("bad", &[])).unwrap_err(),
            NodeError::Shape("bad".into())
        );
        assert_eq!(
            Proxy::from_node(&node("", &[])).unwrap_err(),
            NodeError::Missing
        );
    }

    #[test]
    fn metadata_read_typed_and_leniently() {
        let id = "router~10.0.0.1~gw.ns~ns.svc.cluster.local";
        let p = Proxy::from_node(&node(
            id,
            &[
                ("INTERCEPTION_MODE", "TPROXY"),
                ("DNS_CAPTURE", "true"),
                ("DNS_AUTO_ALLOCATE", "yes"),
                ("ISTIO_VERSION", "1.28"),
                ("CLUSTER_ID", "Kubernetes"),
                ("INSTANCE_IPS", " 10.0.0.1 ,,fd00::1"),
                ("ENVOY_STATUS_PORT", "not a port"),
            ],
        ))
        .unwrap();
        assert_eq!(p.proxy_type, ProxyType::Router);
        assert_eq!(p.interception_mode, InterceptionMode::Tproxy);
        assert!(p.dns_capture);
        assert!(!p.dns_auto_allocate, "only true/false are booleans");
        assert_eq!(
            (p.istio_version.as_str(), p.cluster_id.as_str()),
            ("1.28", "Kubernetes")
        );
        assert_eq!(p.ips, ["10.0.0.1", "fd00::1"]);
        // Unknown or missing modes are REDIRECT, as in Istio.
        for mode in [&[("INTERCEPTION_MODE", "SOMETHING")][..], &[]] {
            let p = Proxy::from_node(&node(id, mode)).unwrap();
            assert_eq!(p.interception_mode, InterceptionMode::Redirect);
        }
        // What the agent writes, read back through the protobuf Struct.
        let meta = NodeMetadata {
            namespace: Some("ns".into()),
            labels: Some(BTreeMap::from([("app".into(), "gw".into())])),
            dns_capture: Some(true),
            envoy_status_port: Some(15021),
            ..Default::default()
        };
        let p = Proxy::from_node(&Node {
            id: id.into(),
            metadata: Some(meta.to_struct()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(p.labels["app"], "gw");
        assert!(p.dns_capture);
        let e = Proxy::from_node(&node("gateway~1.1.1.1~a.ns~ns.svc", &[])).unwrap_err();
        assert!(
            matches!(&e, NodeError::Type { kind, .. } if kind == "gateway"),
            "{e}"
        );
        assert!(
            e.to_string().starts_with("invalid node type \"gateway\""),
            "{e}"
        );
    }

    #[test]
    fn identity_check_like_istio() {
        let p = Proxy::from_node(&node(
            "sidecar~1.1.1.1~a.ns~ns.svc.cluster.local",
            &[("NAMESPACE", "ns"), ("SERVICE_ACCOUNT", "sa")],
        ))
        .unwrap();
        let id = |ns: &str, sa: &str| common::Identity::new("cluster.local", ns, sa);
        assert!(p.authorize(&[id("ns", "sa")]).is_ok(), "single match");
        assert!(
            p.authorize(&[id("x", "y"), id("ns", "sa")]).is_ok(),
            "second match"
        );
        let e = p.authorize(&[id("other", "sa")]).unwrap_err();
        assert_eq!(
            (e.namespace.as_str(), e.service_account.as_str()),
            ("ns", "sa"),
            "no match namespace"
        );
        assert!(
            p.authorize(&[id("ns", "other")]).is_err(),
            "no match service account"
        );
    }
}
