//! Where a Gateway is exposed, as Istio's `ResolveGatewayInstances`
//! (`pilot/pkg/config/kube/gatewaycommon/context.go`) and
//! `reportGatewayStatus` resolve it: each of the Gateway's Services (the
//! automated deployment's, or each `Hostname` address), looked up by host
//! name in the Gateway's namespace (a Kubernetes Service or a
//! ServiceEntry), with the listeners' ports it has; from that the
//! Gateway's `Programmed` condition and its `status.addresses`.
//!
//! Istio counts a port as served when the Service has endpoints on it;
//! here a port the Service declares stands for its endpoints.

use std::collections::BTreeSet;

use super::conditions::{Condition, GatewayAddress};
use crate::model::istio::ServiceEntry;
use crate::model::kube::{IntOrString, Service, ServiceType};
use crate::model::store::Snapshot;

/// What the Gateway's Services resolved to.
#[derive(Debug, Default)]
pub(super) struct Instances {
    /// `host:port` of each port found, sorted as strings (as Istio's).
    internal: Vec<String>,
    /// The load balancers' addresses of the Services found.
    external: BTreeSet<String>,
    /// LoadBalancer Services still without an address.
    pending: BTreeSet<String>,
    /// What could not be resolved, sorted.
    warnings: Vec<String>,
    /// Whether every warning is only a pending address.
    all_usable: bool,
}

/// A Service's ports and, for a Kubernetes Service, its type and load
/// balancer addresses.
struct Found {
    ports: Vec<u32>,
    /// (service port, target port number) of a Kubernetes Service's ports.
    target_ports: Vec<(u32, u32)>,
    load_balancer: bool,
    external: Vec<String>,
}

/// The Service (or ServiceEntry) of host name `host` in `namespace`.
fn lookup(snapshot: &Snapshot, namespace: &str, host: &str, domain: &str) -> Option<Found> {
    let kube = host
        .strip_suffix(&format!(".svc.{domain}"))
        .and_then(|n| n.split_once('.'))
        .filter(|(_, ns)| *ns == namespace)
        .and_then(|(name, ns)| snapshot.get_typed::<Service>(ns, name));
    if let Some(svc) = kube {
        return Some(Found {
            ports: svc.spec.spec.ports.iter().map(|p| p.port).collect(),
            target_ports: svc
                .spec
                .spec
                .ports
                .iter()
                .filter_map(|p| match p.target_port {
                    Some(IntOrString::Int(t)) => Some((p.port, t)),
                    _ => None,
                })
                .collect(),
            load_balancer: svc.spec.spec.service_type == ServiceType::LoadBalancer,
            external: svc.spec.status.external_addresses(),
        });
    }
    snapshot
        .list::<ServiceEntry>()
        .find(|se| {
            se.object.metadata.namespace == namespace && se.spec.hosts.iter().any(|h| h == host)
        })
        .map(|se| Found {
            ports: se.spec.ports.iter().map(|p| p.number).collect(),
            target_ports: Vec::new(),
            load_balancer: false,
            external: Vec::new(),
        })
}

/// Istio's warning for a host name with no Service in the Gateway's
/// namespace, naming the namespaces that have it.
fn not_found(snapshot: &Snapshot, namespace: &str, host: &str, domain: &str) -> String {
    let mut elsewhere: BTreeSet<String> = snapshot
        .list::<ServiceEntry>()
        .filter(|se| se.spec.hosts.iter().any(|h| h == host))
        .map(|se| se.object.metadata.namespace.clone())
        .collect();
    if let Some((name, ns)) = host
        .strip_suffix(&format!(".svc.{domain}"))
        .and_then(|n| n.split_once('.'))
        && snapshot.get_typed::<Service>(ns, name).is_some()
    {
        elsewhere.insert(ns.to_string());
    }
    elsewhere.remove(namespace);
    if elsewhere.is_empty() {
        format!("hostname {host:?} not found")
    } else {
        let list: Vec<String> = elsewhere.iter().map(|n| format!("\"{n}\"")).collect();
        format!(
            "hostname {host:?} not found in namespace {namespace:?}, but it was found in namespace(s) {}",
            list.join(", ")
        )
    }
}

/// Resolves the Gateway's Services `services` (host names) in
/// `namespace` for the listeners' `ports`.
pub(super) fn resolve(
    snapshot: &Snapshot,
    namespace: &str,
    services: &[String],
    ports: &BTreeSet<u32>,
    domain: &str,
) -> Instances {
    let mut internal = BTreeSet::new();
    let mut out = Instances::default();
    let mut unusable = false;
    for host in services {
        let Some(found) = lookup(snapshot, namespace, host, domain) else {
            out.warnings
                .push(not_found(snapshot, namespace, host, domain));
            unusable = true;
            continue;
        };
        for port in ports {
            if !found.ports.contains(port) {
                // The workload's port named instead of the Service's:
                // Istio hints at the Service ports that lead to it.
                let hint: BTreeSet<String> = found
                    .target_ports
                    .iter()
                    .filter(|(_, t)| t == port)
                    .map(|(p, _)| p.to_string())
                    .collect();
                out.warnings.push(if hint.is_empty() {
                    format!("port {port} not found for hostname {host:?}")
                } else {
                    format!(
                        "port {port} not found for hostname {host:?} (hint: the service port should be specified, not the workload port. Did you mean one of these ports: [{}]?)",
                        hint.into_iter().collect::<Vec<_>>().join(" ")
                    )
                });
                unusable = true;
                continue;
            }
            internal.insert(format!("{host}:{port}"));
            if !found.external.is_empty() {
                out.external.extend(found.external.iter().cloned());
            } else if found.load_balancer && out.pending.insert(host.clone()) {
                out.warnings
                    .push(format!("address pending for hostname {host:?}"));
            }
        }
    }
    out.warnings.sort();
    out.internal = internal.into_iter().collect();
    out.all_usable = !unusable;
    out
}

impl Instances {
    /// The Gateway's `Programmed` condition (Istio's
    /// `SetProgrammedCondition`).
    pub(super) fn programmed(&self, services: &[String]) -> Condition {
        let internal = human_join(&self.internal);
        if services.is_empty() {
            return Condition::new(
                "Programmed",
                false,
                "UnsupportedAddress",
                "Failed to assign to any requested addresses",
            );
        }
        if self.warnings.is_empty() {
            let message = if internal.is_empty() {
                "Resource programmed".to_string()
            } else {
                format!("Resource programmed, assigned to service(s) {internal}")
            };
            return Condition::ok("Programmed", message);
        }
        let warnings = self.warnings.join("; ");
        let message = if internal.is_empty() {
            format!("Failed to assign to any requested addresses: {warnings}")
        } else {
            format!(
                "Assigned to service(s) {internal}, but failed to assign to all requested addresses: {warnings}"
            )
        };
        let reason = if self.all_usable {
            "AddressNotAssigned"
        } else {
            "AddressNotUsable"
        };
        Condition::new("Programmed", false, reason, message)
    }

    /// The Gateway's `status.addresses`: the load balancers' addresses,
    /// else (Istio's class reports host names) the host name of each
    /// Service found that is not pending. Empty until there is one; the
    /// status writer keeps addresses once reported, as Istio does.
    pub(super) fn addresses(&self) -> Vec<GatewayAddress> {
        if !self.external.is_empty() {
            return self
                .external
                .iter()
                .map(|a| GatewayAddress::of(a))
                .collect();
        }
        let mut out: Vec<GatewayAddress> = Vec::new();
        for hostport in &self.internal {
            let host = hostport
                .rsplit_once(':')
                .map_or(hostport.as_str(), |(h, _)| h);
            if !self.pending.contains(host) && !out.iter().any(|a| a.value == host) {
                out.push(GatewayAddress::of(host));
            }
        }
        out
    }
}

/// `a`, `a and b`, `a, b, and c` (Istio's `HumanReadableJoin`).
pub(super) fn human_join(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [a] => a.clone(),
        [a, b] => format!("{a} and {b}"),
        [rest @ .., last] => format!("{}, and {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instances(internal: &[&str], warnings: &[&str], all_usable: bool) -> Instances {
        Instances {
            internal: internal.iter().map(|s| s.to_string()).collect(),
            warnings: warnings.iter().map(|s| s.to_string()).collect(),
            all_usable,
            ..Default::default()
        }
    }

    #[test]
    fn programmed_reads_as_istio_writes_it() {
        let svc = vec!["gw.ns.svc.cluster.local".to_string()];
        let ok = instances(
            &["gw.ns.svc.cluster.local:443", "gw.ns.svc.cluster.local:80"],
            &[],
            true,
        );
        let c = ok.programmed(&svc);
        assert!(c.status);
        assert_eq!(
            c.message,
            "Resource programmed, assigned to service(s) gw.ns.svc.cluster.local:443 and gw.ns.svc.cluster.local:80"
        );
        let pending = instances(&["a:80"], &["address pending for hostname \"a\""], true);
        let c = pending.programmed(&svc);
        assert_eq!((c.status, c.reason.as_str()), (false, "AddressNotAssigned"));
        assert_eq!(
            c.message,
            "Assigned to service(s) a:80, but failed to assign to all requested addresses: address pending for hostname \"a\""
        );
        let missing = instances(&[], &["hostname \"b\" not found"], false);
        let c = missing.programmed(&svc);
        assert_eq!((c.status, c.reason.as_str()), (false, "AddressNotUsable"));
        assert_eq!(
            c.message,
            "Failed to assign to any requested addresses: hostname \"b\" not found"
        );
    }

    #[test]
    fn an_address_once_written_stays_while_none_is_resolved() {
        use super::super::conditions::ObjectStatus;
        let status = |addresses: Vec<GatewayAddress>| ObjectStatus::Gateway {
            conditions: Vec::new(),
            listeners: Vec::new(),
            addresses,
            attached_listener_sets: 0,
        };
        let null = serde_json::Value::Null;
        assert!(status(Vec::new()).to_json(None, "t", &null, Vec::new())["addresses"].is_null());
        let first =
            status(vec![GatewayAddress::of("1.2.3.4")]).to_json(None, "t", &null, Vec::new());
        assert_eq!(
            first["addresses"],
            serde_json::json!([{"type": "IPAddress", "value": "1.2.3.4"}])
        );
        let later = status(Vec::new()).to_json(None, "t", &first, Vec::new());
        assert_eq!(later["addresses"], first["addresses"]);
    }

    #[test]
    fn addresses_are_external_else_host_names_not_pending() {
        let mut i = instances(&["a.x:80", "a.x:8080", "b.x:80"], &[], true);
        i.pending.insert("b.x".into());
        assert_eq!(i.addresses(), vec![GatewayAddress::of("a.x")]);
        assert_eq!(GatewayAddress::of("a.x").r#type, "Hostname");
        i.external.insert("1.2.3.4".into());
        assert_eq!(
            i.addresses(),
            vec![GatewayAddress {
                r#type: "IPAddress",
                value: "1.2.3.4".into()
            }]
        );
    }
}
