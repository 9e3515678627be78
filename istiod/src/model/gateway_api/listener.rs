//! One listener as Istio's `buildListener` (`conversion.go`) builds it:
//! its Istio server protocol and TLS, its four conditions (`Accepted`,
//! `Conflicted`, `Programmed`, `ResolvedRefs`, in that order, as Istio
//! writes them), the route kinds it takes, and whether it is programmed
//! (a listener that is not gets no Istio Gateway: nothing is served on it).

use super::conditions::Condition;
use super::listener_protocol::{ListenerProtocol, supported_kinds};
use super::listener_tls;
use super::references::ReferenceGrants;
use super::{KubernetesGateway, Listener};
use crate::model::gateway::ServerTlsSettings;
use crate::model::store::Snapshot;

/// A listener, built.
#[derive(Debug, Clone)]
pub struct BuiltListener {
    /// The Istio server protocol (`HTTP`, `HTTPS`, `TLS`, `TCP`; the
    /// listener's own when unsupported).
    pub protocol: String,
    /// The server's TLS.
    pub tls: Option<ServerTlsSettings>,
    /// The listener's conditions.
    pub conditions: Vec<Condition>,
    /// The route kinds it takes (`supportedKinds`).
    pub kinds: Vec<&'static str>,
    /// Whether its Istio Gateway is generated.
    pub programmed: bool,
    /// Whether it counts as valid for the Gateway's `Accepted`.
    pub valid: bool,
}

const OK: &str = "No errors found";

/// Builds listener `l` of Gateway `gw` (namespace `ns`).
pub fn build(
    snapshot: &Snapshot,
    grants: &ReferenceGrants,
    gw: &KubernetesGateway,
    ns: &str,
    l: &Listener,
) -> BuiltListener {
    build_as(snapshot, grants, gw, "Gateway", ns, l)
}

/// Builds listener `l` owned by an object of kind `owner` in namespace
/// `ns` (a ListenerSet's listeners join Gateway `gw`).
pub fn build_as(
    snapshot: &Snapshot,
    grants: &ReferenceGrants,
    gw: &KubernetesGateway,
    owner: &str,
    ns: &str,
    l: &Listener,
) -> BuiltListener {
    let mut accepted = Condition::ok("Accepted", OK);
    let conflicted = Condition::new("Conflicted", false, "NoConflicts", OK);
    let mut programmed = Condition::ok("Programmed", OK);
    let mut resolved = Condition::ok("ResolvedRefs", OK);
    let mut ok = true;
    let tls = match listener_tls::build_as(snapshot, grants, gw, owner, ns, l) {
        Ok(t) => t,
        Err(e) => {
            tracing::info!(
                target: "gateway",
                "listener {} of Gateway {ns}: {e}",
                l.name
            );
            resolved = Condition::new("ResolvedRefs", false, e.reason, e.message.clone());
            programmed = Condition::new("Programmed", false, "Invalid", "Bad TLS configuration");
            if e.ca {
                accepted = Condition::new("Accepted", false, "NoValidCACertificate", e.message);
            }
            ok = false;
            None
        }
    };
    let protocol = match ListenerProtocol::parse(&l.protocol) {
        Some(p) => p.istio().to_string(),
        None => {
            let upper = l.protocol.to_ascii_uppercase();
            let message = if ListenerProtocol::parse(&upper).is_some() {
                format!(
                    "protocol {:?} is unsupported. hint: {upper:?} (uppercase) may be supported",
                    l.protocol
                )
            } else {
                format!("protocol {:?} is unsupported", l.protocol)
            };
            accepted = Condition::new("Accepted", false, "UnsupportedProtocol", message);
            ok = false;
            l.protocol.clone()
        }
    };
    let (kinds, valid) = supported_kinds(l);
    if !valid {
        resolved = Condition::new(
            "ResolvedRefs",
            false,
            "InvalidRouteKinds",
            "Invalid route kinds",
        );
    }
    // HTTPS or TLS without `tls`: Istio builds no server (validation
    // refuses it first on this istiod).
    let has_server = !(tls.is_none() && matches!(l.protocol.as_str(), "HTTPS" | "TLS"));
    BuiltListener {
        protocol,
        tls,
        conditions: vec![accepted, conflicted, programmed, resolved],
        kinds,
        programmed: ok && has_server,
        valid: ok,
    }
}

/// A Gateway's `Accepted` with some listeners invalid (Istio's
/// `reportGatewayStatus`): still accepted with reason `ListenersNotValid`
/// while one is valid, refused when none is.
pub fn gateway_accepted(conditions: &mut [Condition], valid: usize, total: usize) {
    if total == 0 || valid >= total {
        return;
    }
    let Some(accepted) = conditions.iter_mut().find(|c| c.r#type == "Accepted") else {
        return;
    };
    if !accepted.status {
        return;
    }
    *accepted = if valid == 0 {
        Condition::new(
            "Accepted",
            false,
            "ListenersNotValid",
            "None of the Gateway's listeners are valid",
        )
    } else {
        Condition::new(
            "Accepted",
            true,
            "ListenersNotValid",
            "One or more of the Gateway's listeners are invalid",
        )
    };
}
