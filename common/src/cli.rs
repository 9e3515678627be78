//! Istio's binaries tolerate flags they do not know (cobra's
//! `FParseErrWhitelist.UnknownFlags`), so a newer injection template or chart
//! never crashes an older binary. clap has no such switch, so unknown flags
//! are removed before parsing, with a warning for each.

use clap::Command;

/// Removes flags `cmd` (or the subcommand named in `args`) does not define.
/// Returns the remaining arguments and one warning per dropped flag.
///
/// As in pflag, an unknown `--flag value` drops the value too when the next
/// argument does not start with `-`.
pub fn strip_unknown_flags(cmd: &Command, args: Vec<String>) -> (Vec<String>, Vec<String>) {
    let mut out = Vec::with_capacity(args.len());
    let mut warnings = Vec::new();
    let mut iter = args.into_iter().peekable();
    if let Some(bin) = iter.next() {
        out.push(bin);
    }
    let mut current = cmd.clone();
    let global: Vec<clap::Arg> = cmd
        .get_arguments()
        .filter(|a| a.is_global_set())
        .cloned()
        .collect();
    while let Some(arg) = iter.next() {
        if arg == "--" {
            out.push(arg);
            out.extend(iter);
            break;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, has_value) = match long.split_once('=') {
                Some((n, _)) => (n, true),
                None => (long, false),
            };
            let known = current
                .get_arguments()
                .chain(global.iter())
                .find(|a| {
                    a.get_long() == Some(name)
                        || a.get_all_aliases().is_some_and(|al| al.contains(&name))
                })
                .cloned();
            let builtin = matches!(name, "help" | "version");
            match known {
                Some(a) => {
                    let takes_value = a.get_action().takes_values()
                        && a.get_num_args().is_none_or(|n| n.min_values() > 0);
                    out.push(arg.clone());
                    if takes_value
                        && !has_value
                        && let Some(v) = iter.next()
                    {
                        out.push(v);
                    }
                }
                None if builtin => out.push(arg.clone()),
                None => {
                    let mut dropped = arg.clone();
                    if !has_value
                        && let Some(next) = iter.peek()
                        && !next.starts_with('-')
                        && current.get_subcommands().all(|s| s.get_name() != next)
                    {
                        dropped = format!("{arg} {next}");
                        iter.next();
                    }
                    warnings.push(format!("ignoring unknown flag {dropped}"));
                }
            }
            continue;
        }
        if !arg.starts_with('-')
            && let Some(sub) = current.find_subcommand(&arg)
        {
            current = sub.clone();
        }
        out.push(arg);
    }
    (out, warnings)
}

/// A flag or variable value that is none of Go's `strconv.ParseBool`
/// spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a boolean (use true or false)")]
pub struct NotBool(pub String);

/// Parses a Go-style bool flag value (`--profile=false`).
pub fn parse_go_bool(s: &str) -> Result<bool, NotBool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(NotBool(s.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction};

    fn cmd() -> Command {
        Command::new("bin")
            .arg(Arg::new("log").long("log_output_level").global(true))
            .subcommand(
                Command::new("proxy")
                    .arg(Arg::new("domain").long("domain"))
                    .arg(Arg::new("type").num_args(0..=1)),
            )
            .subcommand(
                Command::new("wait")
                    .arg(Arg::new("t").long("timeoutSeconds").action(ArgAction::Set)),
            )
    }

    fn strip(args: &[&str]) -> (Vec<String>, Vec<String>) {
        strip_unknown_flags(&cmd(), args.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn keeps_known_and_drops_unknown() {
        let (args, warn) = strip(&[
            "bin",
            "proxy",
            "sidecar",
            "--domain",
            "ns.svc",
            "--newFlag",
            "x",
            "--other=1",
            "--log_output_level=default:debug",
        ]);
        assert_eq!(
            args,
            [
                "bin",
                "proxy",
                "sidecar",
                "--domain",
                "ns.svc",
                "--log_output_level=default:debug"
            ]
        );
        assert_eq!(
            warn,
            [
                "ignoring unknown flag --newFlag x",
                "ignoring unknown flag --other=1"
            ]
        );
    }

    #[test]
    fn unknown_bool_before_flag_keeps_next_flag() {
        let (args, warn) = strip(&["bin", "proxy", "--newBool", "--domain", "d"]);
        assert_eq!(args, ["bin", "proxy", "--domain", "d"]);
        assert_eq!(warn.len(), 1);
    }

    #[test]
    fn go_bools_parse_and_others_are_refused_by_value() {
        assert_eq!(parse_go_bool("T"), Ok(true));
        assert_eq!(parse_go_bool("0"), Ok(false));
        let err = parse_go_bool("yes").unwrap_err();
        assert_eq!(err, NotBool("yes".into()));
        assert_eq!(
            err.to_string(),
            r#""yes" is not a boolean (use true or false)"#
        );
    }
}
