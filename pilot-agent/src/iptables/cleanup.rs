//! Removing Istio's rules: `istio-clean-iptables` and the sweep behind
//! `--cleanup-only` / `--reconcile`.
//!
//! Istio removed its `istio-clean-iptables` in favour of
//! `istio-iptables --cleanup-only`, which undoes the rules its flags describe.
//! Here both do that and then sweep what `iptables-save` still shows: every
//! jump into an `ISTIO_` chain and every `ISTIO_` chain (Istio's CNI
//! `cleanupIstioLeftovers`), so nothing named `ISTIO_` is left even when the
//! flags differ from the ones the rules were made with. Rules without an
//! `ISTIO_` name in built-in chains (`-c`/`-k` short cuts, TPROXY marks) go
//! only when the flags describe them, as in Istio; `istio-clean-iptables`
//! also undoes the TPROXY marks when run without `-m TPROXY`.

use std::io::Write;

use super::builder::{self, RuleBuilder};
use super::dep::{self, Backends, IptablesVersion, Tool};

/// Removes Istio chains and the jumps into them that `ver` still shows.
pub fn remove_leftovers(ver: &IptablesVersion) {
    let Ok(save) = dep::run(ver, Tool::Save, &[], None) else {
        return;
    };
    let leftovers = builder::istio_leftovers(&builder::state_from_save(&save));
    if leftovers.is_empty() {
        return;
    }
    tracing::info!(
        "Detected Istio iptables artifacts in {}; removing them",
        ver.command(Tool::Save)
    );
    tracing::debug!("Istio iptables artifacts identified for cleanup: {leftovers:?}");
    dep::run_ignoring_errors(ver, &builder::build_cleanup_from_state(&leftovers));
}

/// `istio-clean-iptables`: undo `rb`'s rules and sweep, in both families
/// where a working binary exists.
pub fn clean(rb: &RuleBuilder, backends: &Backends) {
    tracing::info!("Removing Istio iptables rules and chains");
    dep::run_ignoring_errors(&backends.v4, &rb.build_cleanup_v4());
    remove_leftovers(&backends.v4);
    if let Some(v6) = &backends.v6 {
        dep::run_ignoring_errors(v6, &rb.build_cleanup_v6());
        remove_leftovers(v6);
    }
}

/// What a dry run of the cleanup would execute, one command per line in
/// Istio's stub format (`iptables -t nat -D ...`).
pub fn write_dry_run(rb: &RuleBuilder, ipv6: bool, out: &mut dyn Write) -> std::io::Result<()> {
    for c in rb.build_cleanup_v4() {
        writeln!(out, "iptables {}", c.join(" "))?;
    }
    if ipv6 {
        for c in rb.build_cleanup_v6() {
            writeln!(out, "ip6tables {}", c.join(" "))?;
        }
    }
    Ok(())
}
