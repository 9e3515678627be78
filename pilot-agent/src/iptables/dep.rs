//! Running `iptables`, `iptables-save` and `iptables-restore`, and choosing
//! between the legacy and nft variants as Istio's `DetectIptablesVersion`
//! does (`tools/istio-iptables/pkg/dependencies`): a variant is usable when
//! its `-save` runs and it can add a no-op rule; legacy is chosen when it
//! already holds rules in this network namespace, else nft, else the plain
//! `iptables` name.
//!
//! One difference: Istio counts any `-save` output of three lines or more as
//! "existing rules", which includes the empty `nat` table its own usability
//! probe leaves behind in the legacy variant, so a second run in the same
//! namespace would switch to legacy. Here only rules or user chains count, so
//! a re-run keeps the variant its rules are in.

use std::io::Write;
use std::process::{Command, Stdio};

use super::config::{Backend, Config};

/// The no-op rule used to probe a variant (protocol 255 matches nothing).
const TEST_RULE: &[&str] = &["-t", "nat", "-A", "INPUT", "-p", "255", "-j", "RETURN"];

/// Istio waits up to 30 s for the legacy xtables lock.
const LOCK_WAIT: &str = "--wait=30";

/// IPv4 or IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `iptables`.
    V4,
    /// `ip6tables`.
    V6,
}

/// Which of the three tools to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// `iptables` itself (single rule commands).
    Iptables,
    /// `iptables-save`.
    Save,
    /// `iptables-restore`.
    Restore,
}

/// The chosen variant of one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IptablesVersion {
    /// e.g. `iptables-nft`.
    pub binary: String,
    /// (major, minor, patch) from `-save --version`.
    pub version: (u32, u32, u32),
    /// x_tables (legacy) rather than nf_tables.
    pub legacy: bool,
    /// This variant already holds rules in this network namespace.
    pub existing_rules: bool,
}

impl IptablesVersion {
    /// The binary for `tool`.
    pub fn command(&self, tool: Tool) -> String {
        match tool {
            Tool::Iptables => self.binary.clone(),
            Tool::Save => format!("{}-save", self.binary),
            Tool::Restore => format!("{}-restore", self.binary),
        }
    }

    /// Legacy 1.6.2 and later take the xtables lock and need `--wait`.
    fn needs_lock(&self) -> bool {
        self.legacy && self.version >= (1, 6, 2)
    }
}

/// A failed iptables step.
#[derive(Debug, thiserror::Error)]
pub enum DepError {
    /// The binary could not be started.
    #[error("failed to execute {binary}: {source}")]
    Spawn {
        /// The binary.
        binary: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The command exited non-zero.
    #[error("{command} failed (exit code {code}): {message}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit code (-1 when killed by a signal).
        code: i32,
        /// xtables' error, as Istio words it (`xtables parameter problem: ...`).
        message: String,
    },
    /// No variant of the family works here.
    #[error("iptables binary {binary} cannot be used: {reason}")]
    Unusable {
        /// The binary.
        binary: String,
        /// Why.
        reason: String,
    },
}

/// Istio's `transformToXTablesErrorMessage`.
fn xtables_message(code: i32, stderr: &str) -> String {
    let kind = match code {
        1 => "xtables other problem",
        2 => "xtables parameter problem",
        3 => "xtables version problem",
        4 => "xtables resource problem",
        _ => return stderr.trim().to_string(),
    };
    let detail = stderr.split_once(':').map_or(stderr, |(_, rest)| rest);
    format!("{kind}: {}", detail.trim())
}

/// Runs `binary args` with optional standard input; returns standard output.
fn exec(binary: &str, args: &[String], stdin: Option<&str>) -> Result<String, DepError> {
    let mut cmd = Command::new(binary);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let spawn_err = |source| DepError::Spawn {
        binary: binary.to_string(),
        source,
    };
    let mut child = cmd.spawn().map_err(spawn_err)?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes()).map_err(spawn_err)?;
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        let code = out.status.code().unwrap_or(-1);
        return Err(DepError::Failed {
            command: format!("{binary} {}", args.join(" ")),
            code,
            message: xtables_message(code, &stderr),
        });
    }
    if !stderr.trim().is_empty() {
        tracing::debug!("{binary} stderr: {}", stderr.trim());
    }
    Ok(stdout)
}

/// Runs one tool of the chosen variant, adding `--wait` where the legacy
/// lock needs it (writes only, as Istio).
pub fn run(
    ver: &IptablesVersion,
    tool: Tool,
    args: &[String],
    stdin: Option<&str>,
) -> Result<String, DepError> {
    let binary = ver.command(tool);
    let mut args = args.to_vec();
    if tool != Tool::Save && ver.needs_lock() {
        args.push(LOCK_WAIT.to_string());
    }
    tracing::debug!("Running command: {binary} {}", args.join(" "));
    exec(&binary, &args, stdin)
}

/// Runs each command, ignoring failures (cleanup of what may not exist).
pub fn run_ignoring_errors(ver: &IptablesVersion, commands: &[Vec<String>]) {
    for c in commands {
        if let Err(e) = run(ver, Tool::Iptables, c, None) {
            tracing::debug!("Ignoring iptables command error: {e}");
        }
    }
}

/// Runs each command, stopping at the first failure.
pub fn run_all(ver: &IptablesVersion, commands: &[Vec<String>]) -> Result<(), DepError> {
    for c in commands {
        run(ver, Tool::Iptables, c, None)?;
    }
    Ok(())
}

fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let start = text.find(" v")? + 2;
    let rest = &text[start..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let mut parts = rest[..end].split('.').map(|p| p.parse::<u32>().ok());
    let major = parts.next()??;
    let minor = parts.next()??;
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

/// Whether a `-save` dump holds any rule or user-defined chain.
fn has_rules(dump: &str) -> bool {
    dump.lines().any(|l| {
        l.starts_with("-A ")
            || (l.starts_with(':')
                && !matches!(
                    l[1..].split(' ').next(),
                    Some("INPUT" | "OUTPUT" | "FORWARD" | "PREROUTING" | "POSTROUTING")
                ))
    })
}

/// Istio's `shouldUseBinaryForCurrentContext` for one binary name.
fn probe(binary: &str) -> Result<IptablesVersion, DepError> {
    let save = format!("{binary}-save");
    let dump = exec(&save, &[], None)?;
    // Very old `-save` binaries reject `--version`: then assume old legacy.
    let version_out = exec(&save, &["--version".to_string()], None).unwrap_or_default();
    let (version, legacy) = match parse_version(&version_out) {
        Some(v) => (v, !version_out.contains("nf_tables")),
        None => {
            tracing::warn!(
                "found iptables binary {save}, but it does not appear to support the '--version' flag, assuming very old legacy version"
            );
            ((0, 0, 0), true)
        }
    };
    let ver = IptablesVersion {
        binary: binary.to_string(),
        version,
        legacy,
        existing_rules: has_rules(&dump),
    };
    // The kernel must support this variant: add and remove a no-op rule.
    let add: Vec<String> = TEST_RULE.iter().map(|s| s.to_string()).collect();
    run(&ver, Tool::Iptables, &add, None).map_err(|e| DepError::Unusable {
        binary: binary.to_string(),
        reason: format!("no loaded kernel support: {e}"),
    })?;
    let mut del = add;
    del[2] = "-D".to_string();
    let _ = run(&ver, Tool::Iptables, &del, None);
    if ver.existing_rules {
        tracing::debug!("found existing rules for {save}");
    }
    Ok(ver)
}

/// Istio's `DetectIptablesVersion`.
pub fn detect(family: Family, force: Option<Backend>) -> Result<IptablesVersion, DepError> {
    let (plain, legacy, nft) = match family {
        Family::V4 => ("iptables", "iptables-legacy", "iptables-nft"),
        Family::V6 => ("ip6tables", "ip6tables-legacy", "ip6tables-nft"),
    };
    match force {
        Some(Backend::Legacy) => return probe(legacy),
        Some(Backend::Nft) => return probe(nft),
        None => {}
    }
    match probe(legacy) {
        Ok(v) if v.existing_rules => return Ok(v),
        Ok(_) => {}
        Err(e) => tracing::debug!("did not find (or cannot use) iptables binary {legacy}: {e}"),
    }
    match probe(nft) {
        Ok(v) => return Ok(v),
        Err(e) => tracing::debug!("did not find (or cannot use) iptables binary {nft}: {e}"),
    }
    probe(plain)
}

/// The variants chosen for this namespace.
#[derive(Debug, Clone)]
pub struct Backends {
    /// IPv4.
    pub v4: IptablesVersion,
    /// IPv6, when a working `ip6tables` exists.
    pub v6: Option<IptablesVersion>,
}

impl Backends {
    /// Istio's detection for both families; a missing `ip6tables` is only an
    /// error when IPv6 is on.
    pub fn detect(cfg: &Config) -> Result<Self, DepError> {
        let v4 = detect(Family::V4, cfg.force_iptables_binary)?;
        let v6 = match detect(Family::V6, cfg.force_iptables_binary) {
            Ok(v) => Some(v),
            Err(e) if !cfg.host.enable_ipv6 => {
                tracing::warn!(
                    "Failed to detect a working ip6tables binary; continuing because IPv6 support is disabled (ENABLE_INBOUND_IPV6=false): {e}"
                );
                None
            }
            Err(e) => return Err(e),
        };
        tracing::info!(
            "Using {} (IPv4) and {} (IPv6)",
            v4.binary,
            v6.as_ref().map_or("none", |v| v.binary.as_str())
        );
        Ok(Self { v4, v6 })
    }

    /// The IPv6 variant when IPv6 is on.
    pub(super) fn v6_if(&self, enabled: bool) -> Option<&IptablesVersion> {
        self.v6.as_ref().filter(|_| enabled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_errors_read_as_istio() {
        assert_eq!(
            parse_version("iptables-save v1.8.9 (nf_tables)"),
            Some((1, 8, 9))
        );
        assert_eq!(parse_version("iptables-save v1.6.1"), Some((1, 6, 1)));
        assert_eq!(
            xtables_message(
                2,
                "iptables v1.8.9 (nf_tables): Couldn't load target `ISTIO_X'\n"
            ),
            "xtables parameter problem: Couldn't load target `ISTIO_X'"
        );
    }

    #[test]
    fn empty_tables_are_not_existing_rules() {
        let empty = "# Generated\n*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\nCOMMIT\n";
        assert!(!has_rules(empty));
        assert!(has_rules("*nat\n:ISTIO_OUTPUT - [0:0]\nCOMMIT\n"));
        assert!(has_rules("*filter\n-A INPUT -j ACCEPT\nCOMMIT\n"));
    }
}
