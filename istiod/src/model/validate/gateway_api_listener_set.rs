//! `ListenerSet` validation, and the Gateway's `allowedListeners`: the
//! CRDs' rules a file bypasses, and the parts this istiod does not read
//! refused by name.

use std::collections::BTreeSet;

use super::Errors;
use crate::model::gateway_api::listener_set::{
    AllowedListeners, FROM_VALUES, ListenerSet, entry_port,
};

pub(super) fn allowed_listeners(a: &AllowedListeners, e: &mut Errors) {
    let Some(n) = &a.namespaces else { return };
    let field = "spec.allowedListeners.namespaces";
    let from = n.from.as_deref().unwrap_or("None");
    if !FROM_VALUES.contains(&from) {
        e.add(
            format!("{field}.from"),
            format!("unknown value {from:?} (use All, Same, None or Selector)"),
        );
    }
    match (from, &n.selector) {
        ("Selector", None) => e.add(
            format!("{field}.selector"),
            "is required when from is Selector (a label selector of Namespaces)",
        ),
        ("Selector", Some(_)) => {}
        (_, Some(_)) => e.add(
            format!("{field}.selector"),
            "is only read when from is Selector (set from: Selector or remove it)",
        ),
        (_, None) => {}
    }
}

pub(super) fn listener_set(ls: &ListenerSet, e: &mut Errors) {
    let p = &ls.parent_ref;
    if !p.is_gateway() {
        e.add(
            "spec.parentRef.kind",
            format!(
                "parent {}/{} is not implemented by this istiod (a Gateway of gateway.networking.k8s.io)",
                p.group.as_deref().unwrap_or(""),
                p.kind.as_deref().unwrap_or("")
            ),
        );
    }
    if p.name.is_empty() {
        e.add("spec.parentRef.name", "is required (the Gateway's name)");
    }
    if ls.listeners.is_empty() {
        e.add(
            "spec.listeners",
            "a ListenerSet needs at least one listener",
        );
    }
    let mut names = BTreeSet::new();
    for (i, l) in ls.listeners.iter().enumerate() {
        let field = format!("spec.listeners[{i}]");
        let Some(port) = entry_port(l) else {
            e.add(
                format!("{field}.port"),
                format!(
                    "is required for protocol {:?} (only HTTP and HTTPS have a default)",
                    l.protocol
                ),
            );
            continue;
        };
        let mut l = l.clone();
        l.port = port;
        super::gateway_api::listener(&field, &l, e);
        if !names.insert(l.name.clone()) {
            e.add(
                format!("{field}.name"),
                format!(
                    "listener name {:?} is not unique (give each listener its own name)",
                    l.name
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn errors(yaml: &str) -> Vec<String> {
        let ls: ListenerSet = serde_yaml_ng::from_str(yaml).unwrap();
        let mut e = Errors::default();
        listener_set(&ls, &mut e);
        e.0.iter()
            .map(|x| format!("{}: {}", x.field, x.message))
            .collect()
    }

    #[test]
    fn listener_sets_are_checked_by_field() {
        assert!(
            errors("{parentRef: {name: gw}, listeners: [{name: a, protocol: HTTP}, {name: b, protocol: HTTPS, tls: {certificateRefs: [{name: c}]}}]}")
                .is_empty()
        );
        let e = errors(
            "{parentRef: {name: gw, kind: Service, group: \"\"}, listeners: [{name: a, protocol: TCP}, {name: b, protocol: HTTP, port: 8080}, {name: b, protocol: HTTP, port: 8081}]}",
        );
        for want in [
            "spec.parentRef.kind",
            "spec.listeners[0].port",
            "spec.listeners[2].name",
        ] {
            assert!(e.iter().any(|l| l.starts_with(want)), "{want}: {e:?}");
        }
        let mut e = Errors::default();
        let a: AllowedListeners =
            serde_yaml_ng::from_str("{namespaces: {from: Selector}}").unwrap();
        allowed_listeners(&a, &mut e);
        assert_eq!(e.0[0].field, "spec.allowedListeners.namespaces.selector");
    }
}
