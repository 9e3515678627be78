//! What the translation produces: the derived Istio objects with their
//! `internal.istio.io/*` annotations, and the status of the Gateway API
//! objects.

use std::collections::BTreeMap;

use super::conditions::ObjectStatus;
use crate::model::ObjectKey;
use crate::model::gateway::Gateway;
use crate::model::istio::{DestinationRule, VirtualService};

/// The routes (`Kind/name.ns`, comma-separated) or listener
/// (`Gateway/name/listener.ns`) an object was derived from (Istio's
/// `constants.InternalParentNames`).
pub const PARENTS_ANNOTATION: &str = "internal.istio.io/parents";
/// Marks a VirtualService with the Gateway API's semantics (Istio's
/// `constants.InternalRouteSemantics`).
pub const ROUTE_SEMANTICS_ANNOTATION: &str = "internal.istio.io/route-semantics";
/// Marks a Gateway with the Gateway API's semantics (Istio's
/// `constants.InternalGatewaySemantics`).
pub const GATEWAY_SEMANTICS_ANNOTATION: &str = "internal.istio.io/gateway-semantics";
/// The Service of the gateway serving a generated Gateway (Istio's
/// `constants.InternalGatewayServiceAnnotation`).
pub const GATEWAY_SERVICE_ANNOTATION: &str = "internal.istio.io/gateway-service";
/// The gateway's service account (Istio's
/// `constants.InternalServiceAccount`).
pub const SERVICE_ACCOUNT_ANNOTATION: &str = "internal.istio.io/service-account-name";
/// The parent Gateway's namespace, on the Gateways of a ListenerSet's
/// listeners (`constants.InternalParentNamespace`).
pub const PARENT_NAMESPACE_ANNOTATION: &str = "internal.istio.io/parent-namespace";

/// A generated Istio object.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated<T> {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its annotations (Istio's `internal.istio.io/*`).
    pub annotations: BTreeMap<String, String>,
    /// The spec.
    pub spec: T,
}

/// What the Gateway API objects of a snapshot become.
#[derive(Debug, Default)]
pub struct Output {
    /// One Istio Gateway per listener of Istio's Gateways.
    pub gateways: Vec<Generated<Gateway>>,
    /// The routes, bound to those Gateways.
    pub virtual_services: Vec<Generated<VirtualService>>,
    /// One per BackendTLSPolicy target and host (by `backend_policies.rs`).
    pub destination_rules: Vec<Generated<DestinationRule>>,
    /// The status of every object of Istio's classes and of every route
    /// with a parent there (or no parent at all).
    pub status: BTreeMap<ObjectKey, ObjectStatus>,
}

impl Output {
    /// The derived Istio objects as Kubernetes-style documents
    /// (`apiVersion`, `kind`, `metadata`, `spec`), Gateways first: what
    /// `/debug/configz` lists next to the stored objects, as Istio's config
    /// store holds its gateway controller's output.
    pub fn documents(&self) -> Vec<serde_json::Value> {
        fn doc<T: serde::Serialize>(kind: &str, g: &Generated<T>) -> serde_json::Value {
            serde_json::json!({
                "apiVersion": "networking.istio.io/v1",
                "kind": kind,
                "metadata": {
                    "name": g.name,
                    "namespace": g.namespace,
                    "annotations": g.annotations,
                },
                "spec": g.spec,
            })
        }
        self.gateways
            .iter()
            .map(|g| doc("Gateway", g))
            .chain(
                self.virtual_services
                    .iter()
                    .map(|v| doc("VirtualService", v)),
            )
            .chain(
                self.destination_rules
                    .iter()
                    .map(|d| doc("DestinationRule", d)),
            )
            .collect()
    }
}
