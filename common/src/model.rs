//! The small enums whose spellings cross between pilot-agent, istiod and the
//! Pods they configure, typed once with Istio's spellings (Istio's
//! `pkg/model/proxy.go` `NodeType` and `TrafficInterceptionMode`, the
//! `security.istio.io/tlsMode` label values of `pilot/pkg/model`, and
//! `meshconfig.AuthenticationPolicy`).
//!
//! Each enum parses with [`std::str::FromStr`] and serialises with serde in
//! Istio's spelling, so a value read from a node id, a label or the node
//! metadata is compared as a variant, never as a string.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A value that is not one of an enum's spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a valid {what}; use one of {allowed}")]
pub struct ParseError {
    /// What was being parsed (`proxy type`, `interception mode`, ...).
    pub what: &'static str,
    /// The value as given.
    pub value: String,
    /// The accepted spellings, for the message.
    pub allowed: String,
}

/// Implements `as_str`, `Display` and `FromStr` from one table of spellings.
macro_rules! spellings {
    ($ty:ident, $what:literal, { $($variant:ident => $s:literal),+ $(,)? }) => {
        impl $ty {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// Istio's spelling.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $s),+
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = ParseError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($s => Ok($ty::$variant),)+
                    _ => Err(ParseError {
                        what: $what,
                        value: s.to_string(),
                        allowed: Self::ALL
                            .iter()
                            .map(|v| v.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                    }),
                }
            }
        }
    };
}

/// The kind of proxy, the first field of the xDS node id
/// (`<type>~<ip>~<pod>.<namespace>~<domain>`); Istio's `model.NodeType`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyType {
    /// A sidecar next to an application (`sidecar`).
    #[default]
    Sidecar,
    /// A standalone gateway (`router`).
    Router,
    /// An ambient waypoint (`waypoint`).
    Waypoint,
    /// The ambient node proxy (`ztunnel`).
    Ztunnel,
}

spellings!(ProxyType, "proxy type", {
    Sidecar => "sidecar",
    Router => "router",
    Waypoint => "waypoint",
    Ztunnel => "ztunnel",
});

/// How the workload's traffic reaches Envoy: node metadata
/// `INTERCEPTION_MODE`, annotation `sidecar.istio.io/interceptionMode`,
/// `ProxyConfig.interceptionMode`; Istio's `model.TrafficInterceptionMode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum InterceptionMode {
    /// iptables NAT `REDIRECT` (Istio's default, also for a missing value).
    #[default]
    #[serde(rename = "REDIRECT")]
    Redirect,
    /// iptables `TPROXY`: transparent listeners keep the original source.
    #[serde(rename = "TPROXY")]
    Tproxy,
    /// No capture: the application addresses Envoy's listeners itself.
    #[serde(rename = "NONE")]
    None,
}

spellings!(InterceptionMode, "interception mode", {
    Redirect => "REDIRECT",
    Tproxy => "TPROXY",
    None => "NONE",
});

/// A workload's `security.istio.io/tlsMode` label: whether its sidecar
/// accepts Istio mTLS. The injector sets it to `istio`; anything else,
/// or no label, means plain text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// Istio mTLS (Istio's `IstioMutualTLSModeLabel`, `istio`).
    Istio,
    /// Plain text (Istio's `DisabledTLSModeLabel`, `disabled`).
    Disabled,
}

spellings!(TlsMode, "TLS mode", {
    Istio => "istio",
    Disabled => "disabled",
});

impl TlsMode {
    /// The label that carries the mode on Pods and WorkloadEntries.
    pub const LABEL: &'static str = "security.istio.io/tlsMode";

    /// The mode a workload's labels declare: `istio` only when the label
    /// says exactly that, as Istio reads it.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Self {
        match labels.get(Self::LABEL).map(String::as_str) {
            Some("istio") => Self::Istio,
            _ => Self::Disabled,
        }
    }
}

/// `ProxyConfig.controlPlaneAuthPolicy`: how the proxy authenticates istiod
/// (Istio's `meshconfig.AuthenticationPolicy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AuthenticationPolicy {
    /// Plain text to istiod (the proto's zero value).
    #[default]
    #[serde(rename = "NONE")]
    None,
    /// TLS to istiod, verified against the mesh root (what Istio's injected Pods use).
    #[serde(rename = "MUTUAL_TLS")]
    MutualTls,
    /// Take the mesh-wide setting.
    #[serde(rename = "INHERIT")]
    Inherit,
}

spellings!(AuthenticationPolicy, "authentication policy", {
    None => "NONE",
    MutualTls => "MUTUAL_TLS",
    Inherit => "INHERIT",
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip_through_str_and_serde() {
        fn check<T>(all: &[T])
        where
            T: Copy + PartialEq + fmt::Debug + fmt::Display + FromStr + Serialize,
            T: for<'de> Deserialize<'de>,
            <T as FromStr>::Err: fmt::Debug,
        {
            for v in all {
                let s = v.to_string();
                assert_eq!(s.parse::<T>().unwrap(), *v);
                let json = serde_json::to_value(v).unwrap();
                assert_eq!(json, serde_json::Value::String(s));
                assert_eq!(serde_json::from_value::<T>(json).unwrap(), *v);
            }
        }
        check(ProxyType::ALL);
        check(InterceptionMode::ALL);
        check(TlsMode::ALL);
        check(AuthenticationPolicy::ALL);
    }

    #[test]
    fn unknown_values_name_the_choices() {
        let err = "gateway".parse::<ProxyType>().unwrap_err().to_string();
        assert_eq!(
            err,
            r#""gateway" is not a valid proxy type; use one of sidecar, router, waypoint, ztunnel"#
        );
        assert!(
            "redirect".parse::<InterceptionMode>().is_err(),
            "case matters"
        );
        assert_eq!(InterceptionMode::default(), InterceptionMode::Redirect);
    }

    #[test]
    fn tls_mode_from_labels() {
        let labels = |v: &str| BTreeMap::from([(TlsMode::LABEL.to_string(), v.to_string())]);
        assert_eq!(TlsMode::from_labels(&labels("istio")), TlsMode::Istio);
        assert_eq!(TlsMode::from_labels(&labels("disabled")), TlsMode::Disabled);
        assert_eq!(TlsMode::from_labels(&labels("ISTIO")), TlsMode::Disabled);
        assert_eq!(TlsMode::from_labels(&BTreeMap::new()), TlsMode::Disabled);
    }
}
