//! Istio's `EnvoyFilter` (`networking.istio.io/v1alpha3`): patches applied
//! to the Envoy config istiod generates, as the last step of generation.
//! Patch values are Envoy protos in proto-JSON, kept as JSON here and read
//! as the Envoy type their `applyTo` names (see [`ApplyTo::envoy_type`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::istio::WorkloadSelector;

/// An EnvoyFilter's `spec`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EnvoyFilter {
    /// The workloads (by Pod labels) the patches apply to; none means every
    /// workload of the namespace (of the mesh, in the root namespace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<WorkloadSelector>,
    /// Gateway API Gateways the patches apply to (instead of a selector).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<PolicyTargetReference>,
    /// The patches, applied in order.
    pub config_patches: Vec<EnvoyConfigObjectPatch>,
    /// Order among EnvoyFilters: lower first (then creation time, then name).
    pub priority: i32,
}

/// `targetRefs[]`: Istio's `PolicyTargetReference`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PolicyTargetReference {
    /// API group of the target (`gateway.networking.k8s.io`).
    pub group: String,
    /// Kind of the target (`Gateway`).
    pub kind: String,
    /// Name of the target.
    pub name: String,
    /// Namespace of the target (must be the EnvoyFilter's own).
    pub namespace: String,
}

/// `configPatches[]`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EnvoyConfigObjectPatch {
    /// What the patch applies to.
    pub apply_to: ApplyTo,
    /// Which objects of that kind.
    #[serde(rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_: Option<EnvoyConfigObjectMatch>,
    /// What to do to them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<Patch>,
}

/// `applyTo`: the kind of Envoy object a patch changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ApplyTo {
    /// Not set (refused).
    #[default]
    Invalid,
    /// A listener.
    Listener,
    /// A filter chain of a listener.
    FilterChain,
    /// A network filter of a filter chain.
    NetworkFilter,
    /// An HTTP filter of an HTTP connection manager.
    HttpFilter,
    /// A route configuration (RDS).
    RouteConfiguration,
    /// A virtual host of a route configuration.
    VirtualHost,
    /// A route of a virtual host.
    HttpRoute,
    /// A cluster (CDS).
    Cluster,
    /// An extension configuration served over ECDS.
    ExtensionConfig,
    /// Envoy's bootstrap.
    Bootstrap,
    /// A listener filter.
    ListenerFilter,
}

impl ApplyTo {
    /// The Envoy message a patch value of this kind is read as.
    pub fn envoy_type(self) -> Option<&'static str> {
        Some(match self {
            ApplyTo::Listener => "envoy.config.listener.v3.Listener",
            ApplyTo::FilterChain => "envoy.config.listener.v3.FilterChain",
            ApplyTo::NetworkFilter => "envoy.config.listener.v3.Filter",
            ApplyTo::HttpFilter => {
                "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter"
            }
            ApplyTo::RouteConfiguration => "envoy.config.route.v3.RouteConfiguration",
            ApplyTo::VirtualHost => "envoy.config.route.v3.VirtualHost",
            ApplyTo::HttpRoute => "envoy.config.route.v3.Route",
            ApplyTo::Cluster => "envoy.config.cluster.v3.Cluster",
            ApplyTo::ExtensionConfig => "envoy.config.core.v3.TypedExtensionConfig",
            ApplyTo::Bootstrap => "envoy.config.bootstrap.v3.Bootstrap",
            ApplyTo::ListenerFilter => "envoy.config.listener.v3.ListenerFilter",
            ApplyTo::Invalid => return None,
        })
    }

    /// Whether the patch changes listeners (LDS).
    pub fn is_listener(self) -> bool {
        matches!(
            self,
            ApplyTo::Listener | ApplyTo::FilterChain | ApplyTo::NetworkFilter | ApplyTo::HttpFilter
        )
    }

    /// Whether the patch changes route configurations (RDS).
    pub fn is_route(self) -> bool {
        matches!(
            self,
            ApplyTo::RouteConfiguration | ApplyTo::VirtualHost | ApplyTo::HttpRoute
        )
    }

    /// The operations Istio applies for this kind; others are refused.
    pub fn operations(self) -> &'static [Operation] {
        use Operation::*;
        match self {
            ApplyTo::Listener | ApplyTo::FilterChain | ApplyTo::Cluster | ApplyTo::VirtualHost => {
                &[Merge, Add, Remove]
            }
            ApplyTo::NetworkFilter | ApplyTo::HttpFilter => &[
                Merge,
                Add,
                Remove,
                InsertBefore,
                InsertAfter,
                InsertFirst,
                Replace,
            ],
            ApplyTo::HttpRoute => &[Merge, Add, Remove, InsertBefore, InsertAfter, InsertFirst],
            ApplyTo::RouteConfiguration => &[Merge],
            _ => &[],
        }
    }
}

/// `match`: which objects a patch applies to.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EnvoyConfigObjectMatch {
    /// Sidecar inbound, sidecar outbound, gateway, or any.
    pub context: PatchContext,
    /// Proxy version and metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyMatch>,
    /// A listener (for listener, filter chain and filter patches).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listener: Option<ListenerMatch>,
    /// A route configuration (for route configuration, vhost and route patches).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route_configuration: Option<RouteConfigurationMatch>,
    /// A cluster (for cluster patches).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterMatch>,
}

/// `match.context`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PatchContext {
    /// Every context.
    #[default]
    Any,
    /// A sidecar's inbound listeners, routes and clusters.
    SidecarInbound,
    /// A sidecar's outbound listeners, routes and clusters.
    SidecarOutbound,
    /// A gateway's.
    Gateway,
}

/// `match.proxy`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ProxyMatch {
    /// A regular expression the proxy's `ISTIO_VERSION` must match.
    pub proxy_version: String,
    /// Node metadata values the proxy must have (all of them).
    pub metadata: BTreeMap<String, String>,
}

/// `match.listener`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ListenerMatch {
    /// The listener's port (on `virtualInbound`: its filter chains' destination port).
    pub port_number: u32,
    /// Not implemented by Istio (refused).
    pub port_name: String,
    /// A filter chain of the listener.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter_chain: Option<FilterChainMatch>,
    /// A listener filter (for LISTENER_FILTER patches, refused).
    pub listener_filter: String,
    /// The listener's name.
    pub name: String,
}

/// `match.listener.filterChain`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FilterChainMatch {
    /// The chain's name.
    pub name: String,
    /// A server name the chain matches.
    pub sni: String,
    /// `raw_buffer` or `tls`.
    pub transport_protocol: String,
    /// Comma-separated application protocols, one of which the chain matches.
    pub application_protocols: String,
    /// A network filter in the chain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<FilterMatch>,
    /// The chain's destination port.
    pub destination_port: u32,
}

/// `match.listener.filterChain.filter`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FilterMatch {
    /// The network filter's name.
    pub name: String,
    /// An HTTP filter of the connection manager.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sub_filter: Option<SubFilterMatch>,
}

/// `match.listener.filterChain.filter.subFilter`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SubFilterMatch {
    /// The HTTP filter's name.
    pub name: String,
}

/// `match.routeConfiguration`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RouteConfigurationMatch {
    /// The port the route configuration serves.
    pub port_number: u32,
    /// The gateway server port's name (gateways).
    pub port_name: String,
    /// The gateway, `namespace/name` (gateways).
    pub gateway: String,
    /// A virtual host of the route configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vhost: Option<VirtualHostMatch>,
    /// The route configuration's name.
    pub name: String,
}

/// `match.routeConfiguration.vhost`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct VirtualHostMatch {
    /// The virtual host's name.
    pub name: String,
    /// A domain the virtual host serves.
    pub domain_name: String,
    /// A route of the virtual host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<RouteMatch>,
}

/// `match.routeConfiguration.vhost.route`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RouteMatch {
    /// The route's name.
    pub name: String,
    /// What the route does.
    pub action: RouteAction,
}

/// `match.routeConfiguration.vhost.route.action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RouteAction {
    /// Any route.
    #[default]
    Any,
    /// A route that forwards to a cluster.
    Route,
    /// A redirect.
    Redirect,
    /// A direct response.
    DirectResponse,
}

/// `match.cluster`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ClusterMatch {
    /// The service port of the cluster.
    pub port_number: u32,
    /// The service host of the cluster.
    pub service: String,
    /// The DestinationRule subset of the cluster.
    pub subset: String,
    /// The cluster's name.
    pub name: String,
}

/// `patch`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Patch {
    /// The operation.
    pub operation: Operation,
    /// The Envoy object (proto-JSON) the operation uses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
    /// Where an added HTTP filter goes relative to Istio's (refused unless unset).
    pub filter_class: FilterClass,
}

/// `patch.operation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Operation {
    /// Not set (refused).
    #[default]
    Invalid,
    /// Proto-merge the value into each matched object.
    Merge,
    /// Append the value to the list the match selects.
    Add,
    /// Remove each matched object.
    Remove,
    /// Insert the value before the matched element (first when none is named).
    InsertBefore,
    /// Insert the value after the matched element (last when none is named).
    InsertAfter,
    /// Insert the value first in the list.
    InsertFirst,
    /// Replace the matched filter with the value.
    Replace,
}

/// `patch.filterClass`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FilterClass {
    /// Not set.
    #[default]
    Unspecified,
    /// After Istio's authentication filters.
    Authn,
    /// After Istio's authorization filters.
    Authz,
    /// Before Istio's stats filters.
    Stats,
}
