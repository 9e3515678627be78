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
