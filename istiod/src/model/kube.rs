//! The Kubernetes objects the service registry is built from, with the fields
//! istiod uses. Unlike Istio's CRDs, unknown fields are accepted and ignored:
//! real manifests carry much that the mesh does not read (containers, probes,
//! status conditions), and the API server, not istiod, validates them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The label an EndpointSlice names its Service with.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The Service annotation that restricts its visibility (Istio's `exportTo`).
pub const EXPORT_TO_ANNOTATION: &str = "networking.istio.io/exportTo";
/// The Pod label that sets its locality outright (`region.zone.subzone`:
/// label values cannot hold `/`); it wins over the Node's labels.
pub const LOCALITY_LABEL: &str = "istio-locality";
/// The Node label naming its region.
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
/// The Node label naming its zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Istio's Node label naming its subzone.
pub const SUBZONE_LABEL: &str = "topology.istio.io/subzone";
/// The deprecated region label, read when the GA one is absent.
pub const LEGACY_REGION_LABEL: &str = "failure-domain.beta.kubernetes.io/region";
/// The deprecated zone label, read when the GA one is absent.
pub const LEGACY_ZONE_LABEL: &str = "failure-domain.beta.kubernetes.io/zone";

/// A Kubernetes Service (its `spec`; the metadata is in [`super::ObjectMeta`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Service {
    /// The spec.
    pub spec: ServiceSpec,
    /// The status: the load balancer's addresses, once it has them.
    #[serde(skip_serializing_if = "ServiceStatus::is_empty")]
    pub status: ServiceStatus,
}

/// `Service.status`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceStatus {
    /// `status.loadBalancer`.
    pub load_balancer: LoadBalancerStatus,
}

impl ServiceStatus {
    fn is_empty(&self) -> bool {
        self.load_balancer.ingress.is_empty()
    }

    /// The load balancer's addresses (`ip`, else `hostname`, of each
    /// `ingress`): what Istio calls the Service's external addresses.
    pub fn external_addresses(&self) -> Vec<String> {
        self.load_balancer
            .ingress
            .iter()
            .filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
            .collect()
    }
}

/// `Service.status.loadBalancer`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LoadBalancerStatus {
    /// The load balancer's ingress points.
    pub ingress: Vec<LoadBalancerIngress>,
}

/// One ingress point of a load balancer.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LoadBalancerIngress {
    /// Its IP address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Its DNS name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// `Service.spec`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceSpec {
    /// The ports.
    pub ports: Vec<ServicePort>,
    /// Pods (and WorkloadEntries) backing the service.
    pub selector: BTreeMap<String, String>,
    /// The virtual IP; `None` for a headless service.
    #[serde(rename = "clusterIP", skip_serializing_if = "Option::is_none")]
    pub cluster_ip: Option<String>,
    /// The service type.
    #[serde(rename = "type")]
    pub service_type: ServiceType,
    /// The DNS name of an `ExternalName` service.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_name: Option<String>,
}

/// `Service.spec.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
pub enum ServiceType {
    /// A virtual IP inside the cluster (the default).
    #[default]
    ClusterIP,
    /// Also a port on every node.
    NodePort,
    /// Also an external load balancer.
    LoadBalancer,
    /// A DNS alias (`externalName`).
    ExternalName,
}

/// A port of a Service.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServicePort {
    /// The port name; its prefix gives the protocol (`http-web` is HTTP).
    pub name: String,
    /// The service port.
    pub port: u32,
    /// The port on the Pods, a number or a container port name (defaults to `port`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_port: Option<IntOrString>,
    /// `TCP` (default), `UDP` or `SCTP`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// The application protocol; wins over the name prefix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
}

/// Kubernetes' int-or-string (`targetPort`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum IntOrString {
    /// A port number.
    Int(u32),
    /// A container port name.
    String(String),
}

/// A Kubernetes `discovery.k8s.io/v1` EndpointSlice (its top-level fields).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EndpointSlice {
    /// The address family.
    pub address_type: AddressType,
    /// The endpoints.
    pub endpoints: Vec<Endpoint>,
    /// The ports every endpoint serves.
    pub ports: Vec<EndpointPort>,
}

/// `EndpointSlice.addressType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
pub enum AddressType {
    /// IPv4 addresses.
    #[default]
    IPv4,
    /// IPv6 addresses.
    IPv6,
    /// Host names.
    #[serde(rename = "FQDN")]
    Fqdn,
}

/// One endpoint of a slice.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Endpoint {
    /// Its addresses (consumers use the first).
    pub addresses: Vec<String>,
    /// Readiness.
    pub conditions: EndpointConditions,
    /// The object behind the endpoint (usually a Pod).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<ObjectReference>,
    /// The node it runs on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The zone it runs in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Its host name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// `EndpointSlice.endpoints[].conditions`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EndpointConditions {
    /// Ready; unset means ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// Serving.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serving: Option<bool>,
    /// Terminating.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terminating: Option<bool>,
}

/// A reference to another object.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectReference {
    /// Its kind (`Pod`).
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// A port of an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EndpointPort {
    /// The Service port name it belongs to (empty for an unnamed port).
    pub name: String,
    /// The port on the endpoints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// `TCP`, `UDP` or `SCTP`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// The application protocol.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
}

/// A Kubernetes Pod: the parts of `spec` and `status` istiod uses.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Pod {
    /// The spec.
    pub spec: PodSpec,
    /// The status.
    pub status: PodStatus,
}

/// `Pod.spec`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodSpec {
    /// The service account (its SPIFFE identity); `default` when empty.
    pub service_account_name: String,
    /// The node it runs on.
    pub node_name: String,
    /// Containers, for their named ports.
    pub containers: Vec<Container>,
    /// The Pod's host name (a StatefulSet's Pods: their name).
    pub hostname: String,
    /// With it, the Pod is `<hostname>.<subdomain>.<ns>.svc.<domain>` in DNS
    /// (a StatefulSet's Pods: the set's `serviceName`).
    pub subdomain: String,
}

/// A container, for its ports.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Container {
    /// The container name.
    pub name: String,
    /// Its ports.
    pub ports: Vec<ContainerPort>,
}

/// A container port.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerPort {
    /// The name a Service's `targetPort` may use.
    pub name: String,
    /// The port.
    pub container_port: u32,
    /// `TCP`, `UDP` or `SCTP`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

/// `Pod.status`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodStatus {
    /// The Pod's IP.
    #[serde(rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    /// All its IPs (dual stack).
    #[serde(rename = "podIPs")]
    pub pod_ips: Vec<PodIp>,
    /// `Pending`, `Running`, `Succeeded`, `Failed` or `Unknown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

/// One of `Pod.status.podIPs`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodIp {
    /// The IP.
    pub ip: String,
}

/// A Kubernetes Namespace; what istiod uses (labels) is in the metadata.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
pub struct Namespace {}

/// A Kubernetes Node; what istiod uses (its topology labels) is in the metadata.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
pub struct Node {}

/// The locality (`region/zone/subzone`) a Node's topology labels give its
/// Pods, as Istio's Kubernetes registry reads them; empty when it has none.
pub fn node_locality(labels: &BTreeMap<String, String>) -> String {
    let get = |ga: &str, legacy: Option<&str>| {
        labels
            .get(ga)
            .or_else(|| legacy.and_then(|l| labels.get(l)))
            .map(String::as_str)
            .unwrap_or_default()
    };
    let region = get(REGION_LABEL, Some(LEGACY_REGION_LABEL));
    let zone = get(ZONE_LABEL, Some(LEGACY_ZONE_LABEL));
    let subzone = get(SUBZONE_LABEL, None);
    if region.is_empty() && zone.is_empty() && subzone.is_empty() {
        return String::new();
    }
    format!("{region}/{zone}/{subzone}")
}

/// A Pod's `istio-locality` label as a locality (`.` becomes `/`).
pub fn pod_locality_label(labels: &BTreeMap<String, String>) -> Option<String> {
    labels
        .get(LOCALITY_LABEL)
        .filter(|l| !l.is_empty())
        .map(|l| l.replace('.', "/"))
}

impl Pod {
    /// The service account, `default` when the spec names none (as Kubernetes does).
    pub fn service_account(&self) -> &str {
        if self.spec.service_account_name.is_empty() {
            "default"
        } else {
            &self.spec.service_account_name
        }
    }

    /// Whether the Pod is running or may run (not `Succeeded` or `Failed`);
    /// Istio ignores finished Pods.
    pub fn is_active(&self) -> bool {
        !matches!(self.status.phase.as_deref(), Some("Succeeded" | "Failed"))
    }
}

/// A Kubernetes label selector (`matchLabels` and `matchExpressions`), as
/// mesh config `discoverySelectors` spells it. An empty selector matches
/// everything, as in Kubernetes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct LabelSelector {
    /// Labels that must be present with these values.
    pub match_labels: BTreeMap<String, String>,
    /// Requirements that must all hold.
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One of `matchExpressions`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelectorRequirement {
    /// The label key.
    pub key: String,
    /// How the label relates to `values`.
    pub operator: SelectorOperator,
    /// The values (`In`, `NotIn`); empty for `Exists` and `DoesNotExist`.
    #[serde(default)]
    pub values: Vec<String>,
}

/// `matchExpressions[].operator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum SelectorOperator {
    /// The label's value is one of `values`.
    In,
    /// The label is absent or its value is none of `values`.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

impl LabelSelector {
    /// Whether `labels` satisfy the selector.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator {
                    SelectorOperator::In => value.is_some_and(|v| r.values.contains(v)),
                    SelectorOperator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                    SelectorOperator::Exists => value.is_some(),
                    SelectorOperator::DoesNotExist => value.is_none(),
                }
            })
    }

    /// What Kubernetes refuses in a selector: `In`/`NotIn` without values,
    /// `Exists`/`DoesNotExist` with values. `at` names the selector.
    pub fn validate(&self, at: &str) -> Result<(), SelectorError> {
        for (i, r) in self.match_expressions.iter().enumerate() {
            let needs_values = matches!(r.operator, SelectorOperator::In | SelectorOperator::NotIn);
            let at = || format!("{at}.matchExpressions[{i}]");
            if needs_values && r.values.is_empty() {
                return Err(SelectorError::NeedsValues {
                    at: at(),
                    operator: r.operator,
                });
            }
            if !needs_values && !r.values.is_empty() {
                return Err(SelectorError::TakesNoValues {
                    at: at(),
                    operator: r.operator,
                });
            }
        }
        Ok(())
    }
}

/// What Kubernetes refuses in a label selector's `matchExpressions`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// `In` or `NotIn` without values.
    #[error("{at}: operator {operator:?} needs values")]
    NeedsValues {
        /// The expression (`discoverySelectors[0].matchExpressions[1]`).
        at: String,
        /// Its operator.
        operator: SelectorOperator,
    },
    /// `Exists` or `DoesNotExist` with values.
    #[error("{at}: operator {operator:?} takes no values")]
    TakesNoValues {
        /// The expression.
        at: String,
        /// Its operator.
        operator: SelectorOperator,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selectors_match_as_in_kubernetes() {
        let sel: LabelSelector = serde_yaml_ng::from_str(
            "matchLabels: {env: prod}\nmatchExpressions:\n- {key: team, operator: In, values: [a, b]}\n- {key: legacy, operator: DoesNotExist}\n",
        )
        .unwrap();
        assert!(sel.matches(&labels(&[("env", "prod"), ("team", "a")])));
        assert!(!sel.matches(&labels(&[("env", "prod"), ("team", "c")])));
        assert!(!sel.matches(&labels(&[("env", "dev"), ("team", "a")])));
        assert!(!sel.matches(&labels(&[("env", "prod"), ("team", "a"), ("legacy", "")])));
        let not_in: LabelSelector =
            serde_yaml_ng::from_str("matchExpressions: [{key: t, operator: NotIn, values: [x]}]")
                .unwrap();
        assert!(not_in.matches(&labels(&[])));
        assert!(!not_in.matches(&labels(&[("t", "x")])));
        let exists: LabelSelector =
            serde_yaml_ng::from_str("matchExpressions: [{key: t, operator: Exists}]").unwrap();
        assert!(exists.matches(&labels(&[("t", "")])));
        assert!(LabelSelector::default().matches(&labels(&[])));
        let bad: LabelSelector =
            serde_yaml_ng::from_str("matchExpressions: [{key: t, operator: In}]").unwrap();
        let err = bad.validate("discoverySelectors[0]").unwrap_err();
        assert_eq!(
            err,
            SelectorError::NeedsValues {
                at: "discoverySelectors[0].matchExpressions[0]".into(),
                operator: SelectorOperator::In,
            }
        );
        assert_eq!(
            err.to_string(),
            "discoverySelectors[0].matchExpressions[0]: operator In needs values"
        );
    }

    #[test]
    fn node_labels_give_the_locality() {
        assert_eq!(
            node_locality(&labels(&[
                (REGION_LABEL, "r"),
                (ZONE_LABEL, "z"),
                (SUBZONE_LABEL, "s")
            ])),
            "r/z/s"
        );
        assert_eq!(
            node_locality(&labels(&[
                (LEGACY_REGION_LABEL, "r"),
                (LEGACY_ZONE_LABEL, "z")
            ])),
            "r/z/"
        );
        assert_eq!(node_locality(&labels(&[("other", "x")])), "");
        assert_eq!(
            pod_locality_label(&labels(&[(LOCALITY_LABEL, "r.z.s")])).as_deref(),
            Some("r/z/s")
        );
    }
}
