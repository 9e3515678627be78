//! `istiod`: parses the command line, sets up logging and runs the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use istiod::config::{Config, DiscoveryArgs};
use istiod::token::{Issuer, MintOptions};

#[derive(Parser)]
#[command(name = "istiod", about = "Istio control plane: xDS server and workload CA", version = istiod::VERSION)]
struct Cli {
    /// Comma-separated scope:level pairs (levels: debug, info, warn, error, fatal, none).
    #[arg(long = "log_output_level", global = true, default_value = common::log::DEFAULT_LOG_OUTPUT_LEVEL)]
    log_output_level: String,
    /// Log as JSON.
    #[arg(long = "log_as_json", global = true, default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    log_as_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the discovery service and CA (Istio's `pilot-discovery discovery`).
    Discovery(Box<DiscoveryArgs>),
    /// Workload tokens for the local mode (what `kubectl create token` gives in a cluster).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Print the version.
    Version,
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create a token issuer (key.pem, jwks.json) in DIR and print the JWT_RULE that trusts it.
    Issuer {
        /// Directory for the issuer's key and JWKS.
        #[arg(long)]
        dir: PathBuf,
        /// The issuer name (`iss`).
        #[arg(long, default_value = "https://kubernetes.default.svc.cluster.local")]
        issuer: String,
    },
    /// Print the JWT_RULE for an existing issuer directory.
    Rule {
        /// The issuer directory.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Mint a token for a namespace and service account and print it.
    Create {
        /// The issuer directory.
        #[arg(long)]
        dir: PathBuf,
        /// The workload's namespace.
        #[arg(long)]
        namespace: String,
        /// The workload's service account.
        #[arg(long = "service-account")]
        service_account: String,
        /// The token audience.
        #[arg(long, default_value = "istio-ca")]
        audience: String,
        /// How long the token is valid (Go duration; Istio's projected tokens last 12h).
        #[arg(long, default_value = "12h")]
        duration: String,
    },
}

fn run_token(cmd: TokenCommand) -> anyhow::Result<()> {
    match cmd {
        TokenCommand::Issuer { dir, issuer } => {
            let i = Issuer::create(&dir, &issuer)?;
            println!("{}", i.jwt_rule());
        }
        TokenCommand::Rule { dir } => {
            let i = Issuer::load(&dir)?;
            println!("{}", i.jwt_rule());
        }
        TokenCommand::Create {
            dir,
            namespace,
            service_account,
            audience,
            duration,
        } => {
            let ttl: Duration = common::duration::parse(&duration).context("--duration")?;
            let i = Issuer::load(&dir)?;
            let token = i.mint(&MintOptions {
                namespace,
                service_account,
                audience,
                ttl,
                issuer_override: None,
                expired: false,
            })?;
            println!("{token}");
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let (args, warnings) =
        common::cli::strip_unknown_flags(&Cli::command(), std::env::args().collect());
    let cli = match Cli::command()
        .try_get_matches_from(args)
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if let Err(e) = common::log::init(&cli.log_output_level, cli.log_as_json) {
        eprintln!("{e}");
        return ExitCode::from(64);
    }
    for w in warnings {
        tracing::warn!("{w}");
    }
    match cli.command {
        Command::Version => {
            println!("istiod version {}", istiod::VERSION);
            ExitCode::SUCCESS
        }
        Command::Token(cmd) => match run_token(cmd) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Discovery(args) => {
            let config = match Config::from_args(&args, &common::env::ProcessEnv) {
                Ok(c) => Arc::new(c),
                Err(e) => {
                    tracing::error!("invalid configuration:\n{e}");
                    return ExitCode::from(64);
                }
            };
            tracing::info!("effective configuration: {config:?}");
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!("cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let result = runtime.block_on(async move {
                let bound = istiod::app::build(config).await?;
                bound.wait_termination().await
            });
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
