//! A listener's protocol and the route kinds it takes, as Istio's
//! `GenerateGatewaySupportedKinds` (`gatewaycommon/conversion.go`):
//! HTTP and HTTPS take HTTPRoute and GRPCRoute, TCP takes TCPRoute, TLS
//! takes TLSRoute (and TCPRoute when it terminates); `allowedRoutes.kinds`
//! narrows that, and a kind named there that the protocol does not take
//! makes the listener's `ResolvedRefs` `InvalidRouteKinds`.

use super::{GROUP, Listener, RouteGroupKind};

/// The protocols Istio's gateway controller serves on a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerProtocol {
    /// `HTTP`.
    Http,
    /// `HTTPS` (terminated; the routes are HTTP).
    Https,
    /// `TLS` (terminated or passed through; the routes are TLS or TCP).
    Tls,
    /// `TCP`.
    Tcp,
}

impl ListenerProtocol {
    /// The protocol of a listener; `None` for others (UDP, lower case, ...).
    pub fn parse(p: &str) -> Option<Self> {
        match p {
            "HTTP" => Some(Self::Http),
            "HTTPS" => Some(Self::Https),
            "TLS" => Some(Self::Tls),
            "TCP" => Some(Self::Tcp),
            _ => None,
        }
    }

    /// The Istio Gateway server protocol.
    pub fn istio(self) -> &'static str {
        match self {
            Self::Http => "HTTP",
            Self::Https => "HTTPS",
            Self::Tls => "TLS",
            Self::Tcp => "TCP",
        }
    }
}

/// The route kinds a listener takes, and whether every kind its
/// `allowedRoutes.kinds` names is among them.
pub fn supported_kinds(l: &Listener) -> (Vec<&'static str>, bool) {
    let mut supported: Vec<&'static str> = match ListenerProtocol::parse(&l.protocol) {
        Some(ListenerProtocol::Http | ListenerProtocol::Https) => vec!["HTTPRoute", "GRPCRoute"],
        Some(ListenerProtocol::Tcp) => vec!["TCPRoute"],
        Some(ListenerProtocol::Tls) => {
            let terminate = l
                .tls
                .as_ref()
                .is_some_and(|t| t.mode.as_deref() == Some("Terminate"));
            if terminate {
                vec!["TLSRoute", "TCPRoute"]
            } else {
                vec!["TLSRoute"]
            }
        }
        None => Vec::new(),
    };
    let kinds: &[RouteGroupKind] = l.allowed_routes.as_ref().map_or(&[], |a| &a.kinds);
    if kinds.is_empty() {
        return (supported, true);
    }
    supported.retain(|s| {
        kinds
            .iter()
            .any(|k| k.group.as_deref().unwrap_or(GROUP) == GROUP && k.kind == *s)
    });
    let all = supported.len() == kinds.len();
    (supported, all)
}

/// Whether a route of `kind` may attach to listener `l`.
pub fn takes(l: &Listener, kind: &str) -> bool {
    supported_kinds(l).0.contains(&kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(yaml: &str) -> Listener {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn kinds_follow_the_protocol_and_allowed_routes() {
        let http = listener("{name: a, port: 80, protocol: HTTP}");
        assert_eq!(
            supported_kinds(&http),
            (vec!["HTTPRoute", "GRPCRoute"], true)
        );
        let pass = listener("{name: a, port: 443, protocol: TLS, tls: {mode: Passthrough}}");
        assert_eq!(supported_kinds(&pass), (vec!["TLSRoute"], true));
        let term = listener("{name: a, port: 443, protocol: TLS, tls: {mode: Terminate}}");
        assert!(takes(&term, "TCPRoute"));
        let narrowed = listener(
            "{name: a, port: 80, protocol: HTTP, allowedRoutes: {kinds: [{kind: GRPCRoute}, {kind: TCPRoute}]}}",
        );
        assert_eq!(supported_kinds(&narrowed), (vec!["GRPCRoute"], false));
        assert!(!takes(&narrowed, "HTTPRoute"));
    }
}
