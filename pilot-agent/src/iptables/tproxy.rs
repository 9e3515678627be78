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

fn ip(args: &[&str]) -> Result<(), RouteError> {
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
        return Ok(());
    }
    Err(RouteError::Failed {
        args: joined,
        stderr,
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
        ip(&[family, "rule", "add", "fwmark", &mark, "lookup", &table])?;
    }
    // ... whose one route delivers everything locally through loopback.
    for (family, all) in &families {
        ip(&[
            family, "route", "add", "local", all, "dev", "lo", "table", &table,
        ])?;
    }
    Ok(())
}
