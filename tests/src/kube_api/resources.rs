//! The resources the stand-in serves and the discovery documents that
//! describe them (`/api`, `/apis`, `/apis/{group}/{version}`, `/version`),
//! with the versions Istio's CRDs serve (istio/api
//! `kubernetes/customresourcedefinitions.gen.yaml`).

use serde_json::{Value, json};

/// One resource type (a REST collection).
#[derive(Debug, PartialEq, Eq)]
pub struct Resource {
    /// API group, `""` for core.
    pub group: &'static str,
    /// Served versions; every one serves the same objects (as a CRD with
    /// conversion `None` does), `apiVersion` rewritten.
    pub versions: &'static [&'static str],
    /// The storage version.
    pub storage: &'static str,
    /// Plural name, the path segment.
    pub plural: &'static str,
    /// Singular name.
    pub singular: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Whether the resource has a `/status` subresource, so that writes to
    /// the main resource leave `status` as it was.
    pub status: bool,
    /// Whether the server sets and bumps `metadata.generation` (CRDs and the
    /// built-in types whose strategies do so).
    pub generation: bool,
    /// Whether writes are allowed (`false`: get, list and watch only).
    pub writable: bool,
    /// Short names for discovery.
    pub short_names: &'static [&'static str],
    /// Field selector keys beyond `metadata.name` and `metadata.namespace`.
    pub fields: &'static [&'static str],
}

impl Resource {
    /// `plural` for core, `plural.group` otherwise, as the API's messages
    /// name a resource.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `v1` for core, `group/version` otherwise.
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// Whether `version` is served.
    pub fn serves(&self, version: &str) -> bool {
        self.versions.contains(&version)
    }

    /// Whether a CustomResourceDefinition serves this (Istio's or the
    /// Gateway API's).
    fn is_custom(&self) -> bool {
        self.group.ends_with(".istio.io") || self.group == GATEWAY_API_GROUP
    }

    /// The CRD's categories.
    fn categories(&self) -> Vec<String> {
        if self.group == GATEWAY_API_GROUP {
            vec!["gateway-api".into()]
        } else {
            vec!["istio-io".into(), self.group.replace('.', "-")]
        }
    }

    fn verbs(&self) -> Value {
        if self.writable {
            json!([
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch"
            ])
        } else {
            json!(["get", "list", "watch"])
        }
    }
}

const CORE: &[&str] = &["v1"];
const ISTIO_NETWORKING: &[&str] = &["v1", "v1alpha3", "v1beta1"];
const ISTIO_SECURITY: &[&str] = &["v1", "v1beta1"];
const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

const fn core(
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    status: bool,
    short_names: &'static [&'static str],
    fields: &'static [&'static str],
) -> Resource {
    Resource {
        group: "",
        versions: CORE,
        storage: "v1",
        plural,
        singular,
        kind,
        namespaced,
        status,
        generation: false,
        writable: true,
        short_names,
        fields,
    }
}

const fn istio(
    group: &'static str,
    versions: &'static [&'static str],
    storage: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    short_names: &'static [&'static str],
) -> Resource {
    Resource {
        group,
        versions,
        storage,
        plural,
        singular,
        kind,
        namespaced: true,
        status: true,
        generation: true,
        writable: true,
        short_names,
        fields: &[],
    }
}

/// The Kubernetes Gateway API's group.
pub const GATEWAY_API_GROUP: &str = "gateway.networking.k8s.io";

/// A Gateway API resource (v1.6 CRDs: v1 stored, v1beta1 served too), with
/// a `/status` subresource and `generation` as every CRD has.
const fn gateway_api(
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
) -> Resource {
    Resource {
        group: GATEWAY_API_GROUP,
        versions: &["v1", "v1beta1"],
        storage: "v1",
        plural,
        singular,
        kind,
        namespaced,
        status: true,
        generation: true,
        writable: true,
        short_names,
        fields: &[],
    }
}

/// A namespaced Gateway API kind served at `versions` (the first stored).
const fn gateway_api_versions(
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    versions: &'static [&'static str],
    short_names: &'static [&'static str],
) -> Resource {
    Resource {
        versions,
        ..gateway_api(plural, singular, kind, true, short_names)
    }
}

/// The admission webhook configurations' group.
pub const ADMISSION_REGISTRATION_GROUP: &str = "admissionregistration.k8s.io";

/// `admissionregistration.k8s.io/v1` webhook configurations: cluster-scoped,
/// no status, `generation` bumped when the webhooks change.
const fn webhook_configurations(
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
) -> Resource {
    Resource {
        group: ADMISSION_REGISTRATION_GROUP,
        versions: CORE,
        storage: "v1",
        plural,
        singular,
        kind,
        namespaced: false,
        status: false,
        generation: true,
        writable: true,
        short_names: &[],
        fields: &[],
    }
}

/// A built-in workload resource of `group`/`version`: namespaced, a
/// `/status` subresource, `generation` bumped on spec changes.
const fn workload(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    status: bool,
    short_names: &'static [&'static str],
) -> Resource {
    Resource {
        group,
        versions: match version.as_bytes() {
            b"v2" => &["v2"],
            _ => &["v1"],
        },
        storage: version,
        plural,
        singular,
        kind,
        namespaced: true,
        status,
        generation: true,
        writable: true,
        short_names,
        fields: &[],
    }
}

/// Every resource served (TokenReview is handled apart: it is create-only
/// and stores nothing).
pub static RESOURCES: &[Resource] = &[
    core(
        "namespaces",
        "namespace",
        "Namespace",
        false,
        true,
        &["ns"],
        &["status.phase"],
    ),
    core(
        "nodes",
        "node",
        "Node",
        false,
        true,
        &["no"],
        &["spec.unschedulable"],
    ),
    core(
        "services",
        "service",
        "Service",
        true,
        true,
        &["svc"],
        &["spec.clusterIP", "spec.type"],
    ),
    core(
        "endpoints",
        "endpoints",
        "Endpoints",
        true,
        false,
        &["ep"],
        &[],
    ),
    core("pods", "pod", "Pod", true, true, &["po"], POD_FIELDS),
    core(
        "configmaps",
        "configmap",
        "ConfigMap",
        true,
        false,
        &["cm"],
        &[],
    ),
    core("secrets", "secret", "Secret", true, false, &[], &["type"]),
    core(
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
        false,
        &["sa"],
        &[],
    ),
    // What Istio's gateway deployment controller applies.
    workload(
        "apps",
        "v1",
        "deployments",
        "deployment",
        "Deployment",
        true,
        &["deploy"],
    ),
    workload(
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
        "horizontalpodautoscaler",
        "HorizontalPodAutoscaler",
        true,
        &["hpa"],
    ),
    workload(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
        &["pdb"],
    ),
    Resource {
        group: "discovery.k8s.io",
        versions: &["v1"],
        storage: "v1",
        plural: "endpointslices",
        singular: "endpointslice",
        kind: "EndpointSlice",
        namespaced: true,
        status: false,
        generation: true,
        writable: true,
        short_names: &[],
        fields: &[],
    },
    Resource {
        group: "networking.k8s.io",
        versions: &["v1"],
        storage: "v1",
        plural: "ingresses",
        singular: "ingress",
        kind: "Ingress",
        namespaced: true,
        status: true,
        generation: true,
        writable: true,
        short_names: &["ing"],
        fields: &[],
    },
    Resource {
        group: "networking.k8s.io",
        versions: &["v1"],
        storage: "v1",
        plural: "ingressclasses",
        singular: "ingressclass",
        kind: "IngressClass",
        namespaced: false,
        status: false,
        generation: true,
        writable: true,
        short_names: &[],
        fields: &[],
    },
    // Leader election locks (client-go's and Istio's Lease locks).
    Resource {
        group: "coordination.k8s.io",
        versions: &["v1"],
        storage: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        status: false,
        generation: false,
        writable: true,
        short_names: &[],
        fields: &[],
    },
    Resource {
        group: "apiextensions.k8s.io",
        versions: &["v1"],
        storage: "v1",
        plural: "customresourcedefinitions",
        singular: "customresourcedefinition",
        kind: "CustomResourceDefinition",
        namespaced: false,
        status: true,
        generation: true,
        writable: false,
        short_names: &["crd", "crds"],
        fields: &[],
    },
    webhook_configurations(
        "mutatingwebhookconfigurations",
        "mutatingwebhookconfiguration",
        "MutatingWebhookConfiguration",
    ),
    webhook_configurations(
        "validatingwebhookconfigurations",
        "validatingwebhookconfiguration",
        "ValidatingWebhookConfiguration",
    ),
    istio(
        "networking.istio.io",
        ISTIO_NETWORKING,
        "v1",
        "virtualservices",
        "virtualservice",
        "VirtualService",
        &["vs"],
    ),
    istio(
        "networking.istio.io",
        ISTIO_NETWORKING,
        "v1",
        "destinationrules",
        "destinationrule",
        "DestinationRule",
        &["dr"],
    ),
    istio(
        "networking.istio.io",
        ISTIO_NETWORKING,
        "v1",
        "gateways",
        "gateway",
        "Gateway",
        &["gw"],
    ),
    istio(
        "networking.istio.io",
        ISTIO_NETWORKING,
        "v1",
        "serviceentries",
        "serviceentry",
        "ServiceEntry",
        &["se"],
    ),
    istio(
        "networking.istio.io",
        ISTIO_NETWORKING,
        "v1",
        "sidecars",
        "sidecar",
        "Sidecar",
        &[],
    ),
    istio(
        "networking.istio.io",
        ISTIO_NETWORKING,
        "v1",
        "workloadentries",
        "workloadentry",
        "WorkloadEntry",
        &["we"],
    ),
    istio(
        "networking.istio.io",
        ISTIO_NETWORKING,
        "v1",
        "workloadgroups",
        "workloadgroup",
        "WorkloadGroup",
        &["wg"],
    ),
    istio(
        "networking.istio.io",
        &["v1alpha3"],
        "v1alpha3",
        "envoyfilters",
        "envoyfilter",
        "EnvoyFilter",
        &[],
    ),
    istio(
        "networking.istio.io",
        &["v1beta1"],
        "v1beta1",
        "proxyconfigs",
        "proxyconfig",
        "ProxyConfig",
        &[],
    ),
    istio(
        "security.istio.io",
        ISTIO_SECURITY,
        "v1",
        "peerauthentications",
        "peerauthentication",
        "PeerAuthentication",
        &["pa"],
    ),
    istio(
        "security.istio.io",
        ISTIO_SECURITY,
        "v1",
        "authorizationpolicies",
        "authorizationpolicy",
        "AuthorizationPolicy",
        &["ap"],
    ),
    istio(
        "security.istio.io",
        ISTIO_SECURITY,
        "v1",
        "requestauthentications",
        "requestauthentication",
        "RequestAuthentication",
        &["ra"],
    ),
    gateway_api(
        "gatewayclasses",
        "gatewayclass",
        "GatewayClass",
        false,
        &["gc"],
    ),
    gateway_api("gateways", "gateway", "Gateway", true, &["gtw"]),
    gateway_api("httproutes", "httproute", "HTTPRoute", true, &[]),
    gateway_api_versions(
        "referencegrants",
        "referencegrant",
        "ReferenceGrant",
        &["v1", "v1beta1"],
        &["refgrant"],
    ),
    gateway_api_versions(
        "tcproutes",
        "tcproute",
        "TCPRoute",
        &["v1", "v1alpha2"],
        &[],
    ),
    gateway_api_versions(
        "tlsroutes",
        "tlsroute",
        "TLSRoute",
        &["v1", "v1alpha3", "v1alpha2"],
        &[],
    ),
    gateway_api_versions("grpcroutes", "grpcroute", "GRPCRoute", &["v1"], &[]),
    gateway_api_versions(
        "backendtlspolicies",
        "backendtlspolicy",
        "BackendTLSPolicy",
        &["v1", "v1alpha3"],
        &["btlspolicy"],
    ),
    gateway_api_versions(
        "listenersets",
        "listenerset",
        "ListenerSet",
        &["v1"],
        &["lset"],
    ),
    istio(
        "telemetry.istio.io",
        &["v1", "v1alpha1"],
        "v1alpha1",
        "telemetries",
        "telemetry",
        "Telemetry",
        &["telemetry"],
    ),
    istio(
        "extensions.istio.io",
        &["v1alpha1"],
        "v1alpha1",
        "wasmplugins",
        "wasmplugin",
        "WasmPlugin",
        &[],
    ),
];

/// The TokenReview API's group.
pub const AUTHENTICATION_GROUP: &str = "authentication.k8s.io";

/// The resource at `group/version/plural`, if served.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.plural == plural && r.serves(version))
}

/// The resource of `apiVersion` + `kind`, with the version, if served.
pub fn by_kind(api_version: &str, kind: &str) -> Option<(&'static Resource, &'static str)> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    RESOURCES.iter().find_map(|r| {
        let v = r.versions.iter().find(|v| **v == version)?;
        (r.group == group && r.kind == kind).then_some((r, *v))
    })
}

/// Orders versions as Kubernetes does: GA before beta before alpha, higher
/// numbers first.
fn version_priority(v: &str) -> (u8, std::cmp::Reverse<u32>, std::cmp::Reverse<u32>) {
    let rest = v.strip_prefix('v').unwrap_or(v);
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let major = digits.parse().unwrap_or(0);
    let tail = &rest[digits.len()..];
    let (rank, minor) = if let Some(n) = tail.strip_prefix("beta") {
        (1, n.parse().unwrap_or(0))
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (2, n.parse().unwrap_or(0))
    } else {
        (0, 0)
    };
    (rank, std::cmp::Reverse(major), std::cmp::Reverse(minor))
}

/// The versions served in `group`, preferred first.
fn group_versions(group: &str) -> Vec<&'static str> {
    let mut vs: Vec<&'static str> = if group == AUTHENTICATION_GROUP {
        vec!["v1"]
    } else {
        RESOURCES
            .iter()
            .filter(|r| r.group == group)
            .flat_map(|r| r.versions.iter().copied())
            .collect()
    };
    vs.sort_by_key(|v| version_priority(v));
    vs.dedup();
    vs
}

/// The API groups served (not core), in table order.
fn groups() -> Vec<&'static str> {
    let mut gs: Vec<&'static str> = Vec::new();
    for g in RESOURCES
        .iter()
        .map(|r| r.group)
        .chain([AUTHENTICATION_GROUP])
    {
        if !g.is_empty() && !gs.contains(&g) {
            gs.push(g);
        }
    }
    gs
}

fn api_group(group: &str) -> Value {
    let versions: Vec<Value> = group_versions(group)
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({
        "name": group,
        "versions": versions,
        "preferredVersion": versions.first().cloned().unwrap_or(Value::Null),
    })
}

/// `/api`: APIVersions.
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

/// `/apis`: APIGroupList.
pub fn api_group_list() -> Value {
    let groups: Vec<Value> = groups().iter().map(|g| api_group(g)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/{group}`: APIGroup, if served.
pub fn api_group_doc(group: &str) -> Option<Value> {
    groups().contains(&group).then(|| {
        let mut g = api_group(group);
        g["kind"] = json!("APIGroup");
        g["apiVersion"] = json!("v1");
        g
    })
}

/// `/api/v1` or `/apis/{group}/{version}`: APIResourceList, if served.
pub fn api_resource_list(group: &str, version: &str) -> Option<Value> {
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let mut resources = Vec::new();
    if group == AUTHENTICATION_GROUP && version == "v1" {
        resources.push(json!({
            "name": "tokenreviews", "singularName": "tokenreview", "namespaced": false,
            "kind": "TokenReview", "verbs": ["create"],
        }));
    }
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.serves(version))
    {
        let mut entry = json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": r.verbs(),
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if r.is_custom() {
            entry["categories"] = json!(r.categories());
        }
        resources.push(entry);
        if r.status {
            resources.push(json!({
                "name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced,
                "kind": r.kind, "verbs": ["get", "patch", "update"],
            }));
        }
    }
    (!resources.is_empty()).then(|| {
        json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        })
    })
}

/// The aggregated discovery document (`apidiscovery.k8s.io/{api_version}`
/// `APIGroupDiscoveryList`) of `/api` (`core`) or `/apis`.
pub fn aggregated_discovery(core: bool, api_version: &str) -> Value {
    let groups = if core { vec![""] } else { groups() };
    let items: Vec<Value> = groups
        .iter()
        .map(|g| {
            let versions: Vec<Value> = if g.is_empty() {
                vec!["v1"]
            } else {
                group_versions(g)
            }
            .iter()
            .map(|v| {
                let mut resources = Vec::new();
                if *g == AUTHENTICATION_GROUP && *v == "v1" {
                    resources.push(json!({
                        "resource": "tokenreviews", "singularResource": "tokenreview",
                        "responseKind": {"group": g, "version": v, "kind": "TokenReview"},
                        "scope": "Cluster", "verbs": ["create"],
                    }));
                }
                for r in RESOURCES.iter().filter(|r| r.group == *g && r.serves(v)) {
                    let kind = json!({"group": g, "version": v, "kind": r.kind});
                    let mut entry = json!({
                        "resource": r.plural, "singularResource": r.singular,
                        "responseKind": kind,
                        "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                        "verbs": r.verbs(), "shortNames": r.short_names,
                    });
                    if r.is_custom() {
                        entry["categories"] = json!(r.categories());
                    }
                    if r.status {
                        entry["subresources"] = json!([{
                            "subresource": "status", "responseKind": kind,
                            "verbs": ["get", "patch", "update"],
                        }]);
                    }
                    resources.push(entry);
                }
                json!({"version": v, "resources": resources, "freshness": "Current"})
            })
            .collect();
            let mut meta = json!({"creationTimestamp": null});
            if !g.is_empty() {
                meta["name"] = json!(g);
            }
            json!({"metadata": meta, "versions": versions})
        })
        .collect();
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{api_version}"),
        "metadata": {},
        "items": items,
    })
}

/// `/version`: the server's version.Info.
pub fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-04-23T00:00:00Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// The CustomResourceDefinition objects of the Istio resources, so that a
/// client checking for the CRDs finds them installed and established.
pub fn crds() -> Vec<Value> {
    RESOURCES
        .iter()
        .filter(|r| r.is_custom())
        .map(|r| {
            let names = json!({
                "plural": r.plural, "singular": r.singular, "kind": r.kind,
                "listKind": format!("{}List", r.kind), "shortNames": r.short_names,
                "categories": r.categories(),
            });
            let versions: Vec<Value> = r
                .versions
                .iter()
                .map(|v| {
                    json!({
                        "name": v, "served": true, "storage": *v == r.storage,
                        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                        "subresources": {"status": {}},
                    })
                })
                .collect();
            json!({
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": format!("{}.{}", r.plural, r.group)},
                "spec": {
                    "group": r.group, "names": names, "scope": "Namespaced",
                    "versions": versions, "conversion": {"strategy": "None"},
                },
                "status": {
                    "acceptedNames": names,
                    "storedVersions": [r.storage],
                    "conditions": [
                        {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
                        {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"},
                    ],
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_in_kubernetes_priority_order() {
        assert_eq!(
            group_versions("networking.istio.io"),
            ["v1", "v1beta1", "v1alpha3"]
        );
        assert_eq!(group_versions("telemetry.istio.io"), ["v1", "v1alpha1"]);
    }

    #[test]
    fn envoy_filter_only_under_v1alpha3() {
        assert!(find("networking.istio.io", "v1alpha3", "envoyfilters").is_some());
        assert!(find("networking.istio.io", "v1", "envoyfilters").is_none());
        assert_eq!(
            by_kind("networking.istio.io/v1beta1", "Gateway").map(|(r, v)| (r.plural, v)),
            Some(("gateways", "v1beta1"))
        );
    }
}
