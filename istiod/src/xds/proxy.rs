//! The connecting proxy, as Istio parses it from the xDS node
//! (`node.id` = `<type>~<ip>~<pod>.<namespace>~<namespace>.svc.<domain>`).

use std::collections::BTreeMap;

use proto::pb::envoy::config::core::v3::Node;
use proto::pb::google::protobuf::{Struct, Value, value::Kind};

/// A proxy connected over xDS.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Proxy {
    /// `sidecar`, `router`, ...
    pub proxy_type: String,
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
    /// Metadata `CLUSTER_ID`.
    pub cluster_id: String,
    /// Metadata `INTERCEPTION_MODE` (`REDIRECT` by default).
    pub interception_mode: String,
    /// Metadata `DNS_CAPTURE`.
    pub dns_capture: bool,
    /// Metadata `DNS_AUTO_ALLOCATE`.
    pub dns_auto_allocate: bool,
}

fn string(v: &Value) -> Option<String> {
    match &v.kind {
        Some(Kind::StringValue(s)) => Some(s.clone()),
        Some(Kind::NumberValue(n)) => Some(n.to_string()),
        Some(Kind::BoolValue(b)) => Some(b.to_string()),
        _ => None,
    }
}

fn get(meta: &Option<Struct>, key: &str) -> Option<String> {
    meta.as_ref()?.fields.get(key).and_then(string)
}

impl Proxy {
    /// Parses an xDS node. Errors say what is wrong, for `InvalidArgument`.
    pub fn from_node(node: &Node) -> Result<Self, String> {
        if node.id.is_empty() {
            return Err("missing node information".into());
        }
        let parts: Vec<&str> = node.id.split('~').collect();
        let [proxy_type, ip, id, domain] = parts.as_slice() else {
            return Err(format!(
                "node id {:?} does not have 4 parts separated by ~ (<type>~<ip>~<pod>.<namespace>~<domain>)",
                node.id
            ));
        };
        if !matches!(*proxy_type, "sidecar" | "router" | "waypoint" | "ztunnel") {
            return Err(format!(
                "invalid node type {proxy_type:?} in node id {:?}",
                node.id
            ));
        }
        let meta = &node.metadata;
        let ips: Vec<String> = get(meta, "INSTANCE_IPS")
            .map(|s| {
                s.split(',')
                    .map(|x| x.trim().to_string())
                    .filter(|x| !x.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let ips = if ips.is_empty() {
            vec![ip.to_string()]
        } else {
            ips
        };
        let namespace = get(meta, "NAMESPACE")
            .filter(|n| !n.is_empty())
            .or_else(|| domain.split('.').next().map(String::from))
            .unwrap_or_default();
        let labels = meta
            .as_ref()
            .and_then(|m| m.fields.get("LABELS"))
            .and_then(|v| match &v.kind {
                Some(Kind::StructValue(s)) => Some(
                    s.fields
                        .iter()
                        .filter_map(|(k, v)| string(v).map(|v| (k.clone(), v)))
                        .collect(),
                ),
                _ => None,
            })
            .unwrap_or_default();
        let flag = |k: &str| get(meta, k).is_some_and(|v| v == "true");
        Ok(Self {
            proxy_type: proxy_type.to_string(),
            ip: ips[0].clone(),
            ips,
            id: id.to_string(),
            node_id: node.id.clone(),
            namespace,
            domain: domain.to_string(),
            service_account: get(meta, "SERVICE_ACCOUNT").filter(|s| !s.is_empty()),
            labels,
            istio_version: get(meta, "ISTIO_VERSION").unwrap_or_default(),
            cluster_id: get(meta, "CLUSTER_ID").unwrap_or_default(),
            interception_mode: get(meta, "INTERCEPTION_MODE").unwrap_or_else(|| "REDIRECT".into()),
            dns_capture: flag("DNS_CAPTURE"),
            dns_auto_allocate: flag("DNS_AUTO_ALLOCATE"),
        })
    }

    /// Istio's identity check on :15012: some authenticated identity must be
    /// of the proxy's namespace and (when set) service account.
    pub fn authorize(&self, identities: &[common::Identity]) -> Result<(), String> {
        let ok = identities.iter().any(|id| {
            id.namespace == self.namespace
                && self
                    .service_account
                    .as_ref()
                    .is_none_or(|sa| &id.service_account == sa)
        });
        if ok {
            Ok(())
        } else {
            Err(format!(
                "authorization failed: no identity of {:?} matches namespace {:?} and service account {:?}",
                identities
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>(),
                self.namespace,
                self.service_account.as_deref().unwrap_or("")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(Proxy::from_node(&node("bad", &[])).is_err());
        assert!(
            Proxy::from_node(&node("", &[]))
                .unwrap_err()
                .contains("missing node information")
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
        assert!(
            p.authorize(&[id("other", "sa")]).is_err(),
            "no match namespace"
        );
        assert!(
            p.authorize(&[id("ns", "other")]).is_err(),
            "no match service account"
        );
    }
}
