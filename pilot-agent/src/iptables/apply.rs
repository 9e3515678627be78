//! Applying the rules as Istio's `executeCommands` does: compare what the
//! namespace holds with what is planned (`VerifyIptablesState`), clean up
//! and re-apply only when they differ and `--reconcile` is set, skip when
//! they are equal, and feed each family's tables to one
//! `iptables-restore --noflush`.

use super::builder::{self, RuleBuilder, State};
use super::cleanup;
use super::config::Config;
use super::dep::{self, Backends, DepError, IptablesVersion, Tool};

/// What [`verify_state`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Rules from an earlier run are present.
    pub residue: bool,
    /// What is present differs from what is planned.
    pub delta: bool,
}

fn is_empty(state: &State) -> bool {
    state.values().all(|chains| chains.is_empty())
}

/// One family's comparison: (residue, delta, rules planned).
fn family_differs(
    ver: &IptablesVersion,
    expected_restore: &str,
    checks: &[Vec<String>],
) -> (bool, bool, bool) {
    let expected = builder::state_from_save(expected_restore);
    let planned = !is_empty(&expected);
    let current = match dep::run(ver, Tool::Save, &[], None) {
        Ok(out) => builder::state_from_save(&out),
        Err(e) => {
            tracing::warn!(
                "{} failed, assuming a clean state: {e}",
                ver.command(Tool::Save)
            );
            return (false, planned, planned);
        }
    };
    let residue = !is_empty(&current);
    if !residue {
        return (false, planned, planned);
    }
    let mut delta = false;
    'outer: for (table, chains) in &expected {
        let Some(cur_chains) = current.get(table) else {
            delta = true;
            break;
        };
        for (chain, rules) in chains {
            match cur_chains.get(chain) {
                Some(cur) if !chain.starts_with("ISTIO_") || cur.len() == rules.len() => {}
                _ => {
                    tracing::debug!(
                        "Mismatching number of rules in chain {chain} (table: {table}) between current and expected state"
                    );
                    delta = true;
                    break 'outer;
                }
            }
        }
    }
    if !delta {
        delta = current.iter().any(|(table, chains)| {
            chains.keys().any(|c| {
                c.starts_with("ISTIO_") && !expected.get(table).is_some_and(|e| e.contains_key(c))
            })
        });
    }
    if !delta {
        delta = checks
            .iter()
            .any(|c| dep::run(ver, Tool::Iptables, c, None).is_err());
    }
    (residue, delta, planned)
}

/// Istio's `VerifyIptablesState`: residue when a family with planned rules
/// already holds rules; delta when any family differs (chains present, Istio
/// chains' rule counts, every planned rule found by `iptables -C`).
pub fn verify_state(rb: &RuleBuilder, backends: &Backends) -> Verdict {
    let mut residue = false;
    let mut delta = false;
    let families = [
        (
            Some(&backends.v4),
            rb.build_v4_restore(),
            rb.build_check_v4(),
            "IPv4",
        ),
        (
            backends.v6.as_ref(),
            rb.build_v6_restore(),
            rb.build_check_v6(),
            "IPv6",
        ),
    ];
    for (ver, restore, checks, name) in families {
        let Some(ver) = ver else { continue };
        let (r, d, planned) = family_differs(ver, &restore, &checks);
        delta |= d;
        if r && planned {
            residue = true;
        } else if r {
            tracing::info!("Ignoring residues because no rules are planned for {name}");
        }
    }
    if !residue {
        tracing::info!("Clean-state detected, new iptables are needed");
        return Verdict {
            residue: false,
            delta: true,
        };
    }
    if delta {
        tracing::info!(
            "Found residues of old iptables rules/chains, reconciliation is recommended"
        );
    } else {
        tracing::info!(
            "Found compatible residues of old iptables rules/chains, reconciliation not needed"
        );
    }
    Verdict { residue, delta }
}

/// Istio's guardrails: TCP and UDP are dropped while old rules are replaced;
/// removed again when this value is dropped, whatever happens in between.
struct Guardrails<'a> {
    installed: Vec<&'a IptablesVersion>,
}

impl Drop for Guardrails<'_> {
    fn drop(&mut self) {
        if self.installed.is_empty() {
            return;
        }
        tracing::info!("Removing guardrails");
        for ver in &self.installed {
            dep::run_ignoring_errors(ver, &builder::build_cleanup_guardrails());
        }
    }
}

/// Istio's `executeCommands`.
pub fn execute(cfg: &Config, rb: &RuleBuilder, backends: &Backends) -> Result<(), DepError> {
    let ipv6 = cfg.host.enable_ipv6;
    let verdict = verify_state(rb, backends);
    if verdict.residue && verdict.delta && !cfg.reconcile {
        tracing::info!(
            "reconcile is recommended but no-reconcile flag is set. Unexpected behavior may occur due to preexisting iptables rules"
        );
    }
    let mut guardrails = Guardrails {
        installed: Vec::new(),
    };
    if (verdict.residue && verdict.delta && cfg.reconcile) || cfg.cleanup_only {
        if !cfg.cleanup_only {
            tracing::info!("Setting up guardrails");
            for ver in std::iter::once(&backends.v4).chain(backends.v6_if(ipv6)) {
                dep::run_ignoring_errors(ver, &builder::build_cleanup_guardrails());
                dep::run_all(ver, &builder::build_guardrails())?;
                guardrails.installed.push(ver);
            }
        }
        tracing::info!("Performing cleanup of existing iptables");
        dep::run_ignoring_errors(&backends.v4, &rb.build_cleanup_v4());
        if let Some(v6) = backends.v6_if(ipv6) {
            dep::run_ignoring_errors(v6, &rb.build_cleanup_v6());
        }
        // As Istio's CNI does on reconcile: a second pass for Istio chains and
        // jumps another configuration left (and, for --cleanup-only, all of them).
        tracing::info!(
            "Performing cleanup of any unexpected leftovers from previous iptables executions"
        );
        for ver in std::iter::once(&backends.v4).chain(backends.v6.as_ref()) {
            cleanup::remove_leftovers(ver);
        }
    }
    if (verdict.delta || cfg.force_apply) && !cfg.cleanup_only {
        tracing::info!("Applying iptables chains and rules");
        restore(&backends.v4, &rb.build_v4_restore())?;
        if let Some(v6) = backends.v6_if(ipv6) {
            restore(v6, &rb.build_v6_restore())?;
        } else if ipv6 {
            tracing::warn!("IPv6 is on but no ip6tables binary works; IPv6 rules were not applied");
        }
    }
    if !verdict.delta && cfg.force_apply {
        tracing::warn!(
            "The forced apply of iptables changes succeeded despite the presence of conflicting rules or chains. If you encounter this message, please consider reporting it as an issue."
        );
    }
    drop(guardrails);
    Ok(())
}

fn restore(ver: &IptablesVersion, data: &str) -> Result<(), DepError> {
    tracing::info!(
        "Running iptables restore with: {} and the following input:\n{}",
        ver.command(Tool::Restore),
        data.trim()
    );
    // --noflush keeps what the tables already hold.
    dep::run(ver, Tool::Restore, &["--noflush".to_string()], Some(data)).map(|_| ())
}

/// Logs each family's final state (best effort, as Istio).
pub fn log_final_state(backends: &Backends, ipv6: bool) {
    if let Ok(state) = dep::run(&backends.v4, Tool::Save, &[], None) {
        tracing::info!("Final iptables state (IPv4):\n{state}");
    }
    if let Some(v6) = backends.v6_if(ipv6)
        && let Ok(state) = dep::run(v6, Tool::Save, &[], None)
    {
        tracing::info!("Final iptables state (IPv6):\n{state}");
    }
}
