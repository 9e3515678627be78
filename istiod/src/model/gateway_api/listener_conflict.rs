//! Listener conflicts on one Gateway, its ListenerSets' listeners merged
//! in, as Istio's `listener_conflict.go` computes them: the Gateway's own
//! listeners first, then each admitted ListenerSet's (oldest first, then by
//! namespace and name); a listener that is not distinct from an earlier
//! winner is conflicted (`HostnameConflict` or `ProtocolConflict`) and
//! frees no slot.

use std::collections::BTreeMap;

use super::Listener;
use super::conditions::Condition;

/// Who owns a listener: `(kind, namespace, name)`, the kind `Gateway` or
/// `ListenerSet` (a Gateway and a ListenerSet may share a name).
pub type Owner = (&'static str, String, String);

/// The conflicted listeners, by owner and listener name, with the reason.
pub type Conflicts = BTreeMap<(Owner, String), &'static str>;

/// The message Istio gives every conflicted listener.
const MESSAGE: &str = "Listener has a conflict with another listener attached to the same Gateway";

/// The conflicts among `merged`, in precedence order: each listener with
/// its owner and its effective port.
pub fn compute(merged: &[(Owner, &Listener, u32)]) -> Conflicts {
    let mut out = Conflicts::new();
    let mut accepted: Vec<(&Listener, u32)> = Vec::new();
    for (owner, l, port) in merged {
        match accepted
            .iter()
            .find(|(prior, prior_port)| !distinct((l, *port), (prior, *prior_port)))
        {
            Some((prior, _)) => {
                out.insert((owner.clone(), l.name.clone()), reason(l, prior));
            }
            None => accepted.push((l, *port)),
        }
    }
    out
}

/// The conditions of a conflicted listener (Istio writes these three only).
pub fn conditions(reason: &'static str) -> Vec<Condition> {
    vec![
        Condition::new("Accepted", false, reason, MESSAGE),
        Condition::new("Conflicted", true, reason, MESSAGE),
        Condition::new("Programmed", false, reason, MESSAGE),
    ]
}

fn l4(p: &str) -> bool {
    matches!(p, "TCP" | "UDP")
}

fn http_like(p: &str) -> bool {
    matches!(p, "HTTP" | "HTTPS" | "TLS")
}

fn hostname(l: &Listener) -> &str {
    match l.hostname.as_deref() {
        None | Some("") => "*",
        Some(h) => h,
    }
}

/// Whether two listeners can share a Gateway (Istio's `listenersDistinct`).
fn distinct((a, a_port): (&Listener, u32), (b, b_port): (&Listener, u32)) -> bool {
    if a_port != b_port {
        return true;
    }
    let (pa, pb) = (a.protocol.as_str(), b.protocol.as_str());
    if (l4(pa) && http_like(pb)) || (http_like(pa) && l4(pb)) || (l4(pa) && l4(pb)) {
        return false;
    }
    if http_like(pa) && http_like(pb) {
        return hostname(a) != hostname(b);
    }
    pa != pb
}

fn reason(a: &Listener, b: &Listener) -> &'static str {
    if (l4(&a.protocol) && l4(&b.protocol)) || a.protocol != b.protocol {
        "ProtocolConflict"
    } else {
        "HostnameConflict"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(name: &str, protocol: &str, host: Option<&str>) -> Listener {
        Listener {
            name: name.into(),
            protocol: protocol.into(),
            hostname: host.map(String::from),
            port: 80,
            ..Default::default()
        }
    }

    #[test]
    fn later_listeners_lose_to_earlier_winners() {
        let gw: Owner = ("Gateway", "ns".into(), "gw".into());
        let set: Owner = ("ListenerSet", "ns".into(), "gw".into());
        let a = l("a", "HTTP", Some("a.com"));
        let same_host = l("b", "HTTP", Some("a.com"));
        let tcp = l("c", "TCP", None);
        let other = l("d", "HTTP", Some("d.com"));
        let merged = vec![
            (gw.clone(), &a, 80),
            (set.clone(), &same_host, 80),
            (set.clone(), &tcp, 80),
            (set.clone(), &other, 80),
        ];
        let c = compute(&merged);
        assert_eq!(c.get(&(set.clone(), "b".into())), Some(&"HostnameConflict"));
        assert_eq!(c.get(&(set.clone(), "c".into())), Some(&"ProtocolConflict"));
        assert_eq!(c.get(&(set, "d".into())), None);
        assert_eq!(c.get(&(gw, "a".into())), None);
    }
}
