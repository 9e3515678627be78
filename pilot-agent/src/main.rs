//! `pilot-agent`: parses the command line, sets up logging and runs the library.

use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use pilot_agent::config::{Config, ProxyArgs};

#[derive(Parser)]
#[command(name = "pilot-agent", about = "Istio sidecar agent", version = pilot_agent::VERSION)]
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
    /// Run the sidecar or gateway agent.
    Proxy(Box<ProxyArgs>),
    /// Print the version.
    Version,
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
        return ExitCode::from(255);
    }
    for w in warnings {
        tracing::warn!("{w}");
    }
    match cli.command {
        Command::Version => {
            println!("pilot-agent version {}", pilot_agent::VERSION);
            ExitCode::SUCCESS
        }
        Command::Proxy(args) => {
            let config = match Config::from_env(&args, &common::env::ProcessEnv) {
                Ok(c) => Arc::new(c),
                Err(e) => {
                    tracing::error!("invalid configuration:\n{e}");
                    // Istio's agent exits with os.Exit(-1) on start-up errors.
                    return ExitCode::from(255);
                }
            };
            match serde_json::to_string(&*config) {
                Ok(json) => tracing::info!("Effective config: {json}"),
                Err(_) => tracing::info!("Effective config: {config:?}"),
            }
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!("cannot start the runtime: {e}");
                    return ExitCode::from(255);
                }
            };
            let result = runtime.block_on(async move {
                let bound = pilot_agent::app::build(config).await?;
                bound.wait_termination().await
            });
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    ExitCode::from(255)
                }
            }
        }
    }
}
