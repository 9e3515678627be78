//! Traffic capture: `pilot-agent istio-iptables` writes Istio's iptables rules
//! into the Pod's network namespace (the `istio-init` container), and
//! `pilot-agent istio-clean-iptables` removes them. Rooms follow Istio's
//! `tools/istio-iptables`: `args` (the command lines), `config` (flags and
//! environment), `host` (what the Pod's interfaces and resolv.conf say),
//! `builder` (rules to restore input), `capture` (which rules), `dep`
//! (running iptables and choosing its variant), `apply`, `cleanup`, `tproxy`
//! (routes) and `validation` (`--run-validation`).
//!
//! Exit codes are Istio's: 0 on success, 1 for a bad configuration or a
//! failed iptables step, 126 when validation fails. A dry run (`-n`) prints
//! the `iptables-restore` input (IPv4 tables, then IPv6 when it is on) on
//! standard output; logs go to standard error.

/// A `Vec<String>` of iptables arguments from anything printable.
macro_rules! ipt_args {
    ($($x:expr),* $(,)?) => { vec![$($x.to_string()),*] };
}

/// The `istio-init` container's arguments in Istio's injection template
/// (REDIRECT mode), verbatim: what a Pod's init step runs.
pub const INJECTION_TEMPLATE_ARGS: &[&str] = &[
    "istio-iptables",
    "-p",
    "15001",
    "-z",
    "15006",
    "-u",
    "1337",
    "-m",
    "REDIRECT",
    "-i",
    "*",
    "-x",
    "",
    "-b",
    "*",
    "-d",
    "15090,15021,15020",
    "--log_output_level=default:info",
];

pub(crate) mod apply;
pub(crate) mod args;
pub(crate) mod builder;
pub(crate) mod capture;
pub(crate) mod cleanup;
pub(crate) mod config;
pub(crate) mod dep;
mod error;
pub(crate) mod host;
pub(crate) mod tproxy;
pub(crate) mod validation;

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

use clap::{Args, FromArgMatches};
use common::env::{Env, ProcessEnv};

pub use config::{CleanArgs, Config, ConfigError, HostFacts, IptablesArgs};
pub use validation::{VALIDATION_ERROR_CODE, VALIDATION_FAILED_MESSAGE};

/// Why `istio-iptables` or `istio-clean-iptables` failed.
#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    /// Flags, environment or host facts.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An iptables command.
    #[error(transparent)]
    Iptables(#[from] dep::DepError),
    /// An `ip` command for TPROXY or the `::6` address.
    #[error(transparent)]
    Routes(#[from] tproxy::RouteError),
    /// Capture does not work (Istio's message; the cause is logged before).
    #[error("{VALIDATION_FAILED_MESSAGE}")]
    Validation(#[source] validation::ValidationError),
    /// The dry-run output could not be written.
    #[error("cannot write the dry-run output: {0}")]
    Output(#[source] std::io::Error),
}

impl IptablesError {
    /// Istio's exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Validation(_) => VALIDATION_ERROR_CODE,
            _ => 1,
        }
    }
}

/// Parses `istio-iptables` flags (`argv[0]` is the command name) with the
/// parser the binary uses.
pub fn parse_args<I, T>(argv: I) -> Result<IptablesArgs, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cmd = IptablesArgs::augment_args(clap::Command::new("istio-iptables"));
    IptablesArgs::from_arg_matches(&cmd.try_get_matches_from(argv)?)
}

/// Parses `istio-clean-iptables` flags (`argv[0]` is the command name).
pub fn parse_clean_args<I, T>(argv: I) -> Result<CleanArgs, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cmd = CleanArgs::augment_args(clap::Command::new("istio-clean-iptables"));
    CleanArgs::from_arg_matches(&cmd.try_get_matches_from(argv)?)
}

/// What a dry run prints: the restore input of IPv4, then of IPv6 when on.
pub fn dry_run_output(cfg: &Config) -> String {
    let rb = capture::build(cfg);
    let mut out = rb.build_v4_restore();
    if cfg.host.enable_ipv6 {
        out.push_str(&rb.build_v6_restore());
    }
    out
}

/// Istio's `ProgramIptables` and validation, for a configuration whose host
/// facts are filled in. Dry-run output goes to `out`.
pub fn run_istio_iptables(cfg: &Config, out: &mut dyn Write) -> Result<(), IptablesError> {
    tracing::info!("Istio config:\n{}", cfg.summary());
    if !cfg.skip_rule_apply {
        if cfg.dry_run {
            tracing::info!("running iptables in dry-run mode, no rule changes will be made");
            let text = if cfg.cleanup_only {
                let mut buf = Vec::new();
                cleanup::write_dry_run(&capture::build(cfg), cfg.host.enable_ipv6, &mut buf)
                    .map_err(IptablesError::Output)?;
                String::from_utf8_lossy(&buf).into_owned()
            } else {
                dry_run_output(cfg)
            };
            out.write_all(text.as_bytes())
                .map_err(IptablesError::Output)?;
            out.flush().map_err(IptablesError::Output)?;
        } else {
            let backends = dep::Backends::detect(cfg)?;
            let rb = capture::build(cfg);
            let result = apply::execute(cfg, &rb, &backends);
            apply::log_final_state(&backends, cfg.host.enable_ipv6);
            result?;
        }
        tproxy::configure_routes(cfg)?;
    }
    if cfg.run_validation {
        let validator = validation::Validator::new(cfg);
        if let Err(e) = validator.run_blocking() {
            tracing::error!("Validation failed: {e}");
            return Err(IptablesError::Validation(e));
        }
    }
    Ok(())
}

/// `istio-clean-iptables`: removes Istio's rules and chains from both
/// families. Dry-run output (the commands) goes to `out`.
pub fn run_istio_clean_iptables(cfg: &Config, out: &mut dyn Write) -> Result<(), IptablesError> {
    let rb = capture::build(cfg);
    if cfg.dry_run {
        return cleanup::write_dry_run(&rb, cfg.host.enable_ipv6, out)
            .and_then(|()| out.flush())
            .map_err(IptablesError::Output);
    }
    let backends = dep::Backends::detect(cfg)?;
    cleanup::clean(&rb, &backends);
    if cfg.interception_mode != config::InterceptionMode::Tproxy {
        // TPROXY's marks in built-in chains carry no ISTIO_ name for the
        // sweep to find: undo them too, in case the rules were made with -m TPROXY.
        let mut tproxy = cfg.clone();
        tproxy.interception_mode = config::InterceptionMode::Tproxy;
        tproxy.inbound_ports_include = "*".to_string();
        cleanup::clean(&capture::build(&tproxy), &backends);
    }
    apply::log_final_state(&backends, true);
    Ok(())
}

/// The configuration of a real `istio-iptables` run: flags, environment and
/// the host's addresses and resolv.conf.
pub fn load_config(args: &IptablesArgs, env: &dyn Env) -> Result<Config, IptablesError> {
    let mut cfg = Config::from_args(args, env)?;
    cfg.host = HostFacts::detect(cfg.dual_stack, cfg.redirect_dns && !cfg.capture_all_dns)?;
    Ok(cfg)
}

/// The configuration of `istio-clean-iptables`: its flags over
/// `istio-iptables`' defaults, with IPv6 on so both families are cleaned.
pub fn load_clean_config(args: &CleanArgs, env: &dyn Env) -> Result<Config, IptablesError> {
    let mut cfg = Config::from_args(&args.to_iptables_args(env), env)?;
    cfg.host = HostFacts {
        enable_ipv6: true,
        ..HostFacts::default()
    };
    Ok(cfg)
}

fn exit(result: Result<(), IptablesError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// `pilot-agent istio-iptables`, from parsed flags to exit code.
pub fn main_istio_iptables(args: &IptablesArgs) -> ExitCode {
    exit(
        load_config(args, &ProcessEnv)
            .and_then(|cfg| run_istio_iptables(&cfg, &mut std::io::stdout().lock())),
    )
}

/// `pilot-agent istio-clean-iptables`, from parsed flags to exit code.
pub fn main_istio_clean_iptables(args: &CleanArgs) -> ExitCode {
    exit(
        load_clean_config(args, &ProcessEnv)
            .and_then(|cfg| run_istio_clean_iptables(&cfg, &mut std::io::stdout().lock())),
    )
}

/// Logging for these commands: Istio's format and levels, written to
/// standard error so standard output carries only the dry-run rules.
pub fn init_logging(spec: &str, as_json: bool) -> Result<(), common::log::LogLevelError> {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(common::log::filter(spec)?)
        .with_ansi(false)
        .with_writer(std::io::stderr);
    let _ = if as_json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.event_format(common::log::IstioFormat).try_init()
    };
    Ok(())
}
