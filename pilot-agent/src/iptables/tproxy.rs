//! The routing Istio sets up beside the rules (`tools/common/tproxy`): the
//! `::6` address on loopback when IPv6 is on, and for TPROXY the policy rule
//! and local route that deliver marked packets to Envoy. Istio uses netlink;
//! this runs the equivalent `ip` commands, and treats "File exists" as done so
//! a re-run changes nothing.

use std::process::Command;

use super::config::{Config, InterceptionMode};

/// An `ip` command that failed.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// `ip` could not be started.
    #[error("failed to run `ip {args}`: {source}")]
    Spawn {
        /// The arguments.
        args: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `ip` exited non-zero.
    #[error("failed to configure routes: `ip {args}`: {stderr}")]
    Failed {
        /// The arguments.
        args: String,
        /// What `ip` said.
        stderr: String,
    },
}

/// Runs `ip args`; "File exists" counts as success. Returns standard output.
fn ip(args: &[&str]) -> Result<String, RouteError> {
    let joined = args.join(" ");
    tracing::debug!("Running command: ip {joined}");
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|source| RouteError::Spawn {
            args: joined.clone(),
            source,
        })?;
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if out.status.success() || stderr.to_lowercase().contains("file exists") {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    Err(RouteError::Failed {
        args: joined,
        stderr,
    })
}

/// Whether `ip rule show` output has `fwmark <mark> lookup <table>`. `ip rule
/// add` adds a duplicate rather than failing, so the rule is looked for first.
fn has_mark_rule(rules: &str, mark: u32, table: &str) -> bool {
    let hex = format!("{mark:#x}");
    rules.lines().any(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        let after = |key: &str| {
            words
                .iter()
                .position(|w| *w == key)
                .and_then(|i| words.get(i + 1))
                .copied()
        };
        let mark_ok =
            after("fwmark").is_some_and(|m| m == hex || m.starts_with(&format!("{hex}/")));
        mark_ok && after("lookup") == Some(table)
    })
}

/// Istio's `ConfigureRoutes`.
pub fn configure_routes(cfg: &Config) -> Result<(), RouteError> {
    if cfg.dry_run {
        tracing::info!("skipping configuring routes due to dry run mode");
        return Ok(());
    }
    let ipv6 = cfg.host.enable_ipv6;
    if ipv6 {
        // The source of Envoy's inbound passthrough connections over IPv6.
        ip(&["-6", "addr", "add", "::6/128", "dev", "lo"])?;
        tracing::info!("Added ::6 address on the loopback iface");
    }
    if cfg.inbound_ports_include.is_empty() || cfg.interception_mode != InterceptionMode::Tproxy {
        return Ok(());
    }
    let mark = cfg.inbound_tproxy_mark.to_string();
    let table = cfg.inbound_tproxy_route_table.to_string();
    let mut families = vec![("-4", "0.0.0.0/0")];
    if ipv6 {
        families.push(("-6", "::/0"));
    }
    // Packets marked in ISTIO_DIVERT use the TPROXY table ...
    for (family, _) in &families {
        let rules = ip(&[family, "rule", "show"])?;
        if !has_mark_rule(&rules, cfg.inbound_tproxy_mark, &table) {
            ip(&[family, "rule", "add", "fwmark", &mark, "lookup", &table])?;
        }
    }
    // ... whose one route delivers everything locally through loopback.
    for (family, all) in &families {
        ip(&[
            family, "route", "add", "local", all, "dev", "lo", "table", &table,
        ])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_mark_rule_as_ip_prints_it() {
        let rules = "0:\tfrom all lookup local\n32765:\tfrom all fwmark 0x539 lookup 133\n32766:\tfrom all lookup main\n";
        assert!(has_mark_rule(rules, 1337, "133"));
        assert!(!has_mark_rule(rules, 1337, "134"));
        assert!(!has_mark_rule(rules, 1338, "133"));
        assert!(has_mark_rule(
            "1: from all fwmark 0x539/0xffffffff lookup 133",
            1337,
            "133"
        ));
    }
}
