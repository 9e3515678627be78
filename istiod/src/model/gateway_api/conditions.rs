//! The status Istio's gateway controller reports for the Gateway API kinds
//! (`pilot/pkg/config/kube/gateway/conditions.go`): the conditions of a
//! GatewayClass, of a Gateway and its listeners, and of each parent of an
//! HTTPRoute, with Istio's types, reasons and messages; and their JSON, as
//! written to the `status` subresource.

use serde_json::{Value, json};

use super::{CONTROLLER_NAME, GROUP, ParentReference};

/// One condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// `Accepted`, `Programmed`, `ResolvedRefs`, ...
    pub r#type: &'static str,
    /// `True` or `False`.
    pub status: bool,
    /// The machine-readable reason.
    pub reason: String,
    /// The human-readable message.
    pub message: String,
}

impl Condition {
    /// A condition.
    pub fn new(
        r#type: &'static str,
        status: bool,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            r#type,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// A condition that holds, with its type as reason (Istio's usual form).
    pub fn ok(r#type: &'static str, message: impl Into<String>) -> Self {
        Self::new(r#type, true, r#type, message)
    }
}

/// One entry of a Gateway's `status.addresses`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayAddress {
    /// `IPAddress` or `Hostname`.
    pub r#type: &'static str,
    /// The address.
    pub value: String,
}

impl GatewayAddress {
    /// `value`, typed `IPAddress` when it parses as one, else `Hostname`.
    pub fn of(value: &str) -> Self {
        let r#type = if value.parse::<std::net::IpAddr>().is_ok() {
            "IPAddress"
        } else {
            "Hostname"
        };
        Self {
            r#type,
            value: value.to_string(),
        }
    }
}

/// A listener's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerStatus {
    /// The listener's name.
    pub name: String,
    /// How many routes attach to it.
    pub attached_routes: u32,
    /// The route kinds it takes (`supportedKinds`).
    pub supported_kinds: Vec<&'static str>,
    /// Its conditions.
    pub conditions: Vec<Condition>,
}

/// One parent of a route, as the route's status lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteParentStatus {
    /// The reference, as the route wrote it.
    pub parent_ref: ParentReference,
    /// `Accepted` and `ResolvedRefs`.
    pub conditions: Vec<Condition>,
}

/// One ancestor of a policy (`status.ancestors` entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AncestorStatus {
    /// The Service, ServiceEntry or Gateway.
    pub ancestor_ref: ParentReference,
    /// `istio.io/mesh-controller` or `istio.io/gateway-controller`.
    pub controller: &'static str,
    /// `Accepted` and `ResolvedRefs`.
    pub conditions: Vec<Condition>,
}

/// The status of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectStatus {
    /// A GatewayClass of Istio's controller.
    GatewayClass(Vec<Condition>),
    /// A Gateway of one of Istio's classes, or a ListenerSet (same shape).
    Gateway {
        /// `Accepted`, `Programmed`.
        conditions: Vec<Condition>,
        /// One per listener.
        listeners: Vec<ListenerStatus>,
        /// `status.addresses` (none until the Gateway's Service has one).
        addresses: Vec<GatewayAddress>,
        /// The ListenerSets attached (a Gateway's; written when not 0).
        attached_listener_sets: u32,
    },
    /// An HTTPRoute with at least one parent of Istio's.
    HttpRoute(Vec<RouteParentStatus>),
    /// A policy (BackendTLSPolicy): one entry per ancestor.
    Policy(Vec<AncestorStatus>),
}

fn condition_json(c: &Condition, generation: Option<i64>, now: &str, before: &Value) -> Value {
    let status = if c.status { "True" } else { "False" };
    // The transition time stays while the status does (the API's rule).
    let since = before
        .as_array()
        .and_then(|old| {
            old.iter()
                .find(|o| o["type"] == c.r#type && o["status"] == status)
        })
        .and_then(|o| o["lastTransitionTime"].as_str())
        .unwrap_or(now);
    let mut out = json!({
        "type": c.r#type,
        "status": status,
        "reason": c.reason,
        "message": c.message,
        "lastTransitionTime": since,
    });
    if let Some(g) = generation {
        out["observedGeneration"] = json!(g);
    }
    out
}

fn conditions_json(cs: &[Condition], generation: Option<i64>, now: &str, before: &Value) -> Value {
    Value::Array(
        cs.iter()
            .map(|c| condition_json(c, generation, now, before))
            .collect(),
    )
}

impl ObjectStatus {
    /// The `status` object: conditions with `observedGeneration` (the
    /// object's `metadata.generation`) and `lastTransitionTime` (`now`, or
    /// the time in `before`, the status as last written, when a condition
    /// kept its status). For a route, only Istio's own parents: `others`
    /// are the parents other controllers wrote, kept as they are.
    pub fn to_json(
        &self,
        generation: Option<i64>,
        now: &str,
        before: &Value,
        others: Vec<Value>,
    ) -> Value {
        match self {
            ObjectStatus::GatewayClass(cs) => {
                json!({"conditions": conditions_json(cs, generation, now, &before["conditions"])})
            }
            ObjectStatus::Gateway {
                conditions,
                listeners,
                addresses,
                attached_listener_sets,
            } => {
                let listeners: Vec<Value> = listeners
                    .iter()
                    .map(|l| {
                        let old = before["listeners"]
                            .as_array()
                            .and_then(|ls| ls.iter().find(|o| o["name"] == l.name.as_str()))
                            .map(|o| o["conditions"].clone())
                            .unwrap_or(Value::Null);
                        json!({
                            "name": l.name,
                            "attachedRoutes": l.attached_routes,
                            "supportedKinds": l.supported_kinds.iter().map(|k| json!({"group": GROUP, "kind": k})).collect::<Vec<_>>(),
                            "conditions": conditions_json(&l.conditions, generation, now, &old),
                        })
                    })
                    .collect();
                let mut status = json!({
                    "conditions": conditions_json(conditions, generation, now, &before["conditions"]),
                    "listeners": listeners,
                });
                // Istio reports no address until there is one, and once
                // there is, never removes it.
                let addresses: Vec<Value> = addresses
                    .iter()
                    .map(|a| json!({"type": a.r#type, "value": a.value}))
                    .collect();
                if !addresses.is_empty() {
                    status["addresses"] = Value::Array(addresses);
                } else if before["addresses"].is_array() {
                    status["addresses"] = before["addresses"].clone();
                }
                if *attached_listener_sets > 0 {
                    status["attachedListenerSets"] = json!(attached_listener_sets);
                }
                status
            }
            ObjectStatus::HttpRoute(parents) => {
                let mut out = others;
                for p in parents {
                    let parent_ref = serde_json::to_value(&p.parent_ref).unwrap_or(Value::Null);
                    let old = before["parents"]
                        .as_array()
                        .and_then(|ps| {
                            ps.iter().find(|o| {
                                o["controllerName"] == CONTROLLER_NAME
                                    && o["parentRef"] == parent_ref
                            })
                        })
                        .map(|o| o["conditions"].clone())
                        .unwrap_or(Value::Null);
                    out.push(json!({
                        "parentRef": parent_ref,
                        "controllerName": CONTROLLER_NAME,
                        "conditions": conditions_json(&p.conditions, generation, now, &old),
                    }));
                }
                json!({"parents": out})
            }
            ObjectStatus::Policy(ancestors) => {
                let mut out = others;
                for a in ancestors {
                    let ancestor_ref = serde_json::to_value(&a.ancestor_ref).unwrap_or(Value::Null);
                    let old = before["ancestors"]
                        .as_array()
                        .and_then(|ps| {
                            ps.iter().find(|o| {
                                o["controllerName"] == a.controller
                                    && o["ancestorRef"] == ancestor_ref
                            })
                        })
                        .map(|o| o["conditions"].clone())
                        .unwrap_or(Value::Null);
                    out.push(json!({
                        "ancestorRef": ancestor_ref,
                        "controllerName": a.controller,
                        "conditions": conditions_json(&a.conditions, generation, now, &old),
                    }));
                }
                json!({"ancestors": out})
            }
        }
    }

    /// One line per condition, `Type=Status (Reason): message`, prefixed by
    /// the listener or parent it is about, for logs and `/debug/configz`.
    pub fn lines(&self) -> Vec<String> {
        let show = |prefix: &str, c: &Condition| {
            format!(
                "{prefix}{}={} ({}): {}",
                c.r#type,
                if c.status { "True" } else { "False" },
                c.reason,
                c.message
            )
        };
        match self {
            ObjectStatus::GatewayClass(cs) => cs.iter().map(|c| show("", c)).collect(),
            ObjectStatus::Gateway {
                conditions,
                listeners,
                ..
            } => conditions
                .iter()
                .map(|c| show("", c))
                .chain(listeners.iter().flat_map(|l| {
                    l.conditions.iter().map(move |c| {
                        show(
                            &format!("listener {} ({} routes): ", l.name, l.attached_routes),
                            c,
                        )
                    })
                }))
                .collect(),
            ObjectStatus::HttpRoute(parents) => parents
                .iter()
                .flat_map(|p| {
                    let ns = p
                        .parent_ref
                        .namespace
                        .as_deref()
                        .map(|n| format!("{n}/"))
                        .unwrap_or_default();
                    let section = p
                        .parent_ref
                        .section_name
                        .as_deref()
                        .map(|s| format!(".{s}"))
                        .unwrap_or_default();
                    let prefix = format!("parent {ns}{}{section}: ", p.parent_ref.name);
                    p.conditions.iter().map(move |c| show(&prefix, c))
                })
                .collect(),
            ObjectStatus::Policy(ancestors) => ancestors
                .iter()
                .flat_map(|a| {
                    let section = a
                        .ancestor_ref
                        .section_name
                        .as_deref()
                        .map(|s| format!(".{s}"))
                        .unwrap_or_default();
                    let prefix = format!(
                        "ancestor {}/{}{section}: ",
                        a.ancestor_ref.kind.as_deref().unwrap_or(""),
                        a.ancestor_ref.name
                    );
                    a.conditions.iter().map(move |c| show(&prefix, c))
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_times_stay_while_the_status_does() {
        let s = ObjectStatus::GatewayClass(vec![Condition::ok(
            "Accepted",
            "Handled by Istio controller",
        )]);
        let first = s.to_json(Some(3), "2026-01-01T00:00:00Z", &Value::Null, Vec::new());
        assert_eq!(first["conditions"][0]["observedGeneration"], 3);
        assert_eq!(first["conditions"][0]["status"], "True");
        let again = s.to_json(Some(4), "2026-01-02T00:00:00Z", &first, Vec::new());
        assert_eq!(
            again["conditions"][0]["lastTransitionTime"],
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(again["conditions"][0]["observedGeneration"], 4);
        let refused = ObjectStatus::GatewayClass(vec![Condition::new(
            "Accepted",
            false,
            "InvalidParameters",
            "x",
        )]);
        let changed = refused.to_json(Some(4), "2026-01-02T00:00:00Z", &first, Vec::new());
        assert_eq!(
            changed["conditions"][0]["lastTransitionTime"],
            "2026-01-02T00:00:00Z"
        );
    }

    #[test]
    fn routes_keep_other_controllers_parents() {
        let s = ObjectStatus::HttpRoute(vec![RouteParentStatus {
            parent_ref: ParentReference {
                name: "gw".into(),
                ..Default::default()
            },
            conditions: vec![Condition::ok("Accepted", "Route was valid")],
        }]);
        let other = json!({"parentRef": {"name": "x"}, "controllerName": "example.com/c", "conditions": []});
        let out = s.to_json(None, "t", &Value::Null, vec![other.clone()]);
        assert_eq!(out["parents"][0], other);
        assert_eq!(out["parents"][1]["controllerName"], CONTROLLER_NAME);
        assert_eq!(out["parents"][1]["parentRef"], json!({"name": "gw"}));
    }
}
