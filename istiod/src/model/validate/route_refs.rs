//! What a VirtualService's routes refer to, checked the same way for the
//! HTTP routes (`virtual_service.rs`) and the TCP and TLS routes
//! (`virtual_service_tcp.rs`): gateway references and destinations with
//! their weights.

use super::super::istio::Destination;
use super::{Errors, check_host, check_port, is_dns1123_label, is_dns1123_subdomain};

/// A gateway reference: `mesh` (the sidecars), `<name>` (a Gateway in the
/// VirtualService's namespace) or `<namespace>/<name>`.
pub(super) fn gateway(field: &str, gw: &str, e: &mut Errors) {
    let valid = match gw.split_once('/') {
        _ if gw == "mesh" => true,
        Some((ns, name)) => is_dns1123_label(ns) && is_dns1123_subdomain(name),
        None => is_dns1123_subdomain(gw),
    };
    if !valid {
        e.add(
            field,
            format!("{gw:?} is not a gateway reference (use mesh, <name> or <namespace>/<name>)"),
        );
    }
}

/// Destinations and weights: each weight 0-100, summing to 100 when there
/// are several destinations.
pub(super) fn destinations(field: &str, dests: &[(&Destination, Option<i32>)], e: &mut Errors) {
    let mut total: i64 = 0;
    for (i, (dest, weight)) in dests.iter().enumerate() {
        destination(&format!("{field}[{i}].destination"), dest, e);
        let w = weight.unwrap_or(0);
        if !(0..=100).contains(&w) {
            e.add(
                format!("{field}[{i}].weight"),
                format!("{w} is out of range (use a weight between 0 and 100)"),
            );
        }
        total += i64::from(w);
    }
    if dests.len() > 1 && total != 100 {
        e.add(
            format!("{field}[{}].weight", dests.len() - 1),
            format!(
                "the weights of the {} destinations add up to {total}, not 100 (adjust them so they add up to 100)",
                dests.len()
            ),
        );
    }
}

pub(super) fn destination(field: &str, d: &Destination, e: &mut Errors) {
    if d.host.is_empty() {
        e.add(
            format!("{field}.host"),
            "is required (name the service to send traffic to, e.g. reviews)",
        );
    } else {
        check_host(&format!("{field}.host"), &d.host, e);
    }
    if !d.subset.is_empty() && !is_dns1123_label(&d.subset) {
        e.add(
            format!("{field}.subset"),
            format!(
                "{:?} is not a valid subset name (use the name of a subset in the host's DestinationRule)",
                d.subset
            ),
        );
    }
    if let Some(p) = &d.port {
        check_port(&format!("{field}.port.number"), p.number, e);
    }
}
