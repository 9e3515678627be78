//! `pilot-agent`: parses the command line, sets up logging and runs the library.

use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use pilot_agent::config::{Config, ProxyArgs};
use pilot_agent::envoy::admin::AdminClient;

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
    /// Wait until a URL answers 200 (the proxy's readiness), for `postStart` hooks.
    Wait(WaitArgs),
    /// Send an HTTP request to a local proxy or agent port and print the answer.
    Request(RequestArgs),
    /// Set up iptables rules for Istio Sidecar (Istio's `istio-iptables`).
    IstioIptables(Box<pilot_agent::iptables::IptablesArgs>),
    /// Clean up iptables rules for Istio Sidecar.
    IstioCleanIptables(pilot_agent::iptables::CleanArgs),
    /// Print the version.
    Version,
}

#[derive(clap::Args)]
struct WaitArgs {
    /// The URL to poll.
    #[arg(long = "url", default_value = "http://localhost:15021/healthz/ready")]
    url: String,
    /// How long to wait in total.
    #[arg(long = "timeoutSeconds", default_value = "60")]
    timeout_seconds: u64,
    /// Time between polls.
    #[arg(long = "periodMillis", default_value = "500")]
    period_millis: u64,
    /// Timeout of each poll.
    #[arg(long = "requestTimeoutMillis", default_value = "500")]
    request_timeout_millis: u64,
}

#[derive(clap::Args)]
struct RequestArgs {
    /// HTTP method.
    method: String,
    /// Path on the debug port.
    path: String,
    /// Request body.
    body: Option<String>,
    /// The local port: 15000 (Envoy admin), 15020, 15021 or 15004.
    #[arg(long = "debug-port", default_value = "15000")]
    debug_port: u16,
}

/// Why `wait` or `request` failed (printed as Istio's `Error: ...`).
#[derive(Debug, thiserror::Error)]
enum CommandError {
    /// `--url` is not `http://`.
    #[error("--url {0:?}: only http:// URLs are supported")]
    NotHttp(String),
    /// `--url`'s host and port do not parse.
    #[error("--url {url:?}: {source}")]
    BadAuthority {
        url: String,
        source: hyper::http::uri::InvalidUri,
    },
    /// The URL never answered 200 in time.
    #[error("timeout waiting for Envoy proxy to become ready. Last error: {last}")]
    Timeout { last: String },
    /// A port `request` may not talk to.
    #[error("debug port {0} is not allowed: use 15000, 15020, 15021 or 15004")]
    PortNotAllowed(u16),
    /// Not an HTTP method.
    #[error("method {method:?}: {source}")]
    Method {
        method: String,
        source: hyper::http::method::InvalidMethod,
    },
    /// The request did not complete.
    #[error(transparent)]
    Admin(#[from] pilot_agent::envoy::admin::AdminError),
    /// The port answered with an error status.
    #[error("received unsuccessful status code {code}: {body}")]
    Status { code: u16, body: String },
}

/// Splits `http://host[:port]/path` into host, port (80 when absent) and
/// path; `localhost` is dialled as `127.0.0.1`.
fn split_url(url: &str) -> Result<(String, u16, String), CommandError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| CommandError::NotHttp(url.to_string()))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let authority: hyper::http::uri::Authority =
        authority
            .parse()
            .map_err(|source| CommandError::BadAuthority {
                url: url.to_string(),
                source,
            })?;
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    Ok((
        host.to_string(),
        authority.port_u16().unwrap_or(80),
        path.to_string(),
    ))
}

async fn run_wait(a: WaitArgs) -> Result<(), CommandError> {
    let (host, port, path) = split_url(&a.url)?;
    let period = std::time::Duration::from_millis(a.period_millis);
    let client = AdminClient::at_host(host, port)
        .with_timeout(std::time::Duration::from_millis(a.request_timeout_millis));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(a.timeout_seconds);
    println!(
        "Waiting for Envoy proxy to be ready (timeout: {} seconds)...",
        a.timeout_seconds
    );
    loop {
        // Istio probes after one period, not at once.
        tokio::time::sleep(period).await;
        let last = match client.get(&path).await {
            Ok(resp) if resp.status == StatusCode::OK => {
                println!("Envoy is ready!");
                return Ok(());
            }
            Ok(resp) => format!(
                "HTTP status code {}: {}",
                resp.status.as_u16(),
                resp.text().trim()
            ),
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(CommandError::Timeout { last });
        }
    }
}

async fn run_request(a: RequestArgs) -> Result<(), CommandError> {
    if ![15000, 15020, 15021, 15004].contains(&a.debug_port) {
        return Err(CommandError::PortNotAllowed(a.debug_port));
    }
    let method = Method::from_bytes(a.method.to_uppercase().as_bytes()).map_err(|source| {
        CommandError::Method {
            method: a.method.clone(),
            source,
        }
    })?;
    let path = format!("/{}", a.path.trim_start_matches('/'));
    let body = Bytes::from(a.body.unwrap_or_default());
    let resp = AdminClient::new(a.debug_port)
        .with_timeout(std::time::Duration::from_secs(60))
        .request(method, &path, body)
        .await?;
    let (code, body) = (resp.status.as_u16(), resp.text());
    if code > 399 && code != 404 {
        return Err(CommandError::Status { code, body });
    }
    print!("{body}");
    Ok(())
}

/// At most this many threads run the agent's blocking work at once.
const MAX_BLOCKING_THREADS: usize = 4;

fn run_small(fut: impl std::future::Future<Output = Result<(), CommandError>>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: {e}");
            return ExitCode::from(255);
        }
    };
    match rt.block_on(fut) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e}");
            // Istio's agent exits with os.Exit(-1).
            ExitCode::from(255)
        }
    }
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
    // The iptables commands log to stderr: their stdout is the dry-run output.
    let logging = match cli.command {
        Command::IstioIptables(_) | Command::IstioCleanIptables(_) => {
            pilot_agent::iptables::init_logging(&cli.log_output_level, cli.log_as_json)
        }
        _ => common::log::init(&cli.log_output_level, cli.log_as_json),
    };
    if let Err(e) = logging {
        eprintln!("{e}");
        return ExitCode::from(255);
    }
    for w in warnings {
        tracing::warn!("{w}");
    }
    match cli.command {
        Command::Wait(a) => run_small(run_wait(a)),
        Command::Request(a) => run_small(run_request(a)),
        Command::IstioIptables(a) => pilot_agent::iptables::main_istio_iptables(&a),
        Command::IstioCleanIptables(a) => pilot_agent::iptables::main_istio_clean_iptables(&a),
        Command::Version => {
            println!("pilot-agent version {}", pilot_agent::VERSION);
            ExitCode::SUCCESS
        }
        Command::Proxy(args) => {
            let log_as_json = cli.log_as_json;
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
            // One thread drives the agent: its work is a few sockets and a
            // timer (Envoy carries the traffic), as linkerd2-proxy runs on a
            // current-thread runtime when given one core. Blocking work (file
            // reads, name resolution) goes to tokio's blocking pool, whose
            // threads exit when idle.
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .max_blocking_threads(MAX_BLOCKING_THREADS)
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!("cannot start the runtime: {e}");
                    return ExitCode::from(255);
                }
            };
            let result = runtime.block_on(async move {
                let bound =
                    pilot_agent::app::build(config, pilot_agent::app::RunOptions { log_as_json })
                        .await?;
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
