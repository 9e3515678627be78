//! `pilot-load mesh` writes a mesh into a config directory for istiod's
//! `--configDir`; `pilot-load run` connects simulated proxies to a running
//! istiod serving that directory, applies changes and reports each push.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use pilot_load::mesh::{MeshDir, Shape};
use pilot_load::run::{ChangeKind, Options, Phase};

#[derive(Parser)]
#[command(
    name = "pilot-load",
    about = "Load for istiod: a mesh, simulated proxies, timed changes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Writes the mesh into a config directory.
    Mesh(MeshArgs),
    /// Connects proxies to istiod, applies changes, reports.
    Run(RunArgs),
}

#[derive(Args)]
struct MeshArgs {
    /// The config directory (istiod's `--configDir`).
    #[arg(long)]
    dir: PathBuf,
    /// Services.
    #[arg(long, default_value_t = 1000)]
    services: usize,
    /// Namespaces the services are spread over.
    #[arg(long, default_value_t = 10)]
    namespaces: usize,
    /// Pods (endpoints) per service.
    #[arg(long, default_value_t = 2)]
    pods_per_service: usize,
    /// A VirtualService for every n-th service (0: none).
    #[arg(long, default_value_t = 10)]
    virtual_service_every: usize,
    /// A DestinationRule for every n-th service (0: none).
    #[arg(long, default_value_t = 10)]
    destination_rule_every: usize,
    /// A Sidecar per namespace: each proxy sees its namespace and istio-system.
    #[arg(long)]
    sidecars: bool,
}

#[derive(Args)]
struct RunArgs {
    /// The config directory `pilot-load mesh` wrote.
    #[arg(long)]
    dir: PathBuf,
    /// istiod's plaintext xDS address.
    #[arg(long, default_value = "http://127.0.0.1:15010")]
    addr: String,
    /// Simulated proxies.
    #[arg(long, default_value_t = 2000)]
    proxies: usize,
    /// Every n-th proxy speaks delta xDS (0: none; 2: half).
    #[arg(long, default_value_t = 2)]
    delta_every: usize,
    /// HTTP/2 connections (default: one per proxy, as Envoys connect).
    #[arg(long)]
    connections: Option<usize>,
    /// istiod's pid, for its CPU and memory.
    #[arg(long)]
    istiod_pid: Option<u32>,
    /// Changes, in order: label, vs, endpoint, reconnect.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "label,vs,endpoint,reconnect"
    )]
    changes: Vec<ChangeKind>,
    /// A push is over once no ACK came for this long (ms).
    #[arg(long, default_value_t = 2000)]
    quiet_ms: u64,
    /// The longest one phase may take (s).
    #[arg(long, default_value_t = 600)]
    cap_secs: u64,
    /// Also write the phases as JSON lines here.
    #[arg(long)]
    json: Option<PathBuf>,
}

const SHAPE_FILE: &str = ".pilot-load-shape.json";

fn shape_of(args: &MeshArgs) -> Shape {
    Shape {
        services: args.services,
        namespaces: args.namespaces,
        pods_per_service: args.pods_per_service,
        virtual_service_every: args.virtual_service_every,
        destination_rule_every: args.destination_rule_every,
        sidecars: args.sidecars,
    }
}

fn print_phase(p: &Phase) {
    println!(
        "{:<36} {:>5}/{:<5} p50 {:>9.1} ms  p99 {:>9.1} ms  max {:>9.1} ms  {:>7} responses {:>10.1} MiB  retries {:>5}  istiod CPU {:>6.2} s  RSS {:>6} MiB (peak {:>6}, HWM {:>6})",
        p.name,
        p.proxies,
        p.of,
        p.p50_ms,
        p.p99_ms,
        p.max_ms,
        p.responses,
        p.bytes as f64 / (1024.0 * 1024.0),
        p.retries,
        p.cpu_s,
        p.rss_mib,
        p.rss_peak_mib,
        p.hwm_mib
    );
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Mesh(args) => {
            let shape = shape_of(&args);
            MeshDir::write(&args.dir, &shape)
                .with_context(|| format!("writing the mesh into {}", args.dir.display()))?;
            let saved = serde_json::json!({
                "services": shape.services, "namespaces": shape.namespaces,
                "podsPerService": shape.pods_per_service,
                "virtualServiceEvery": shape.virtual_service_every,
                "destinationRuleEvery": shape.destination_rule_every,
                "sidecars": shape.sidecars,
            });
            std::fs::write(args.dir.join(SHAPE_FILE), saved.to_string())?;
            println!(
                "wrote {} services, {} pods in {} namespaces to {}",
                shape.services,
                shape.pods(),
                shape.namespaces,
                args.dir.display()
            );
            Ok(())
        }
        Command::Run(args) => {
            let saved: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(args.dir.join(SHAPE_FILE)).with_context(|| {
                    format!("{}: run `pilot-load mesh` first", args.dir.display())
                })?,
            )?;
            let n = |k: &str| saved[k].as_u64().unwrap_or(0) as usize;
            let shape = Shape {
                services: n("services"),
                namespaces: n("namespaces"),
                pods_per_service: n("podsPerService"),
                virtual_service_every: n("virtualServiceEvery"),
                destination_rule_every: n("destinationRuleEvery"),
                sidecars: saved["sidecars"].as_bool().unwrap_or(false),
            };
            let mesh = MeshDir {
                dir: args.dir.clone(),
                shape,
            };
            let opts = Options {
                addr: args.addr,
                proxies: args.proxies,
                delta_every: args.delta_every,
                connections: args.connections.unwrap_or(args.proxies),
                istiod_pid: args.istiod_pid,
                quiet: Duration::from_millis(args.quiet_ms),
                cap: Duration::from_secs(args.cap_secs),
                changes: args.changes,
            };
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let mut json = match &args.json {
                Some(p) => Some(std::fs::File::create(p)?),
                None => None,
            };
            runtime.block_on(pilot_load::run::run(mesh, opts, |p| {
                print_phase(p);
                if let Some(f) = &mut json {
                    use std::io::Write;
                    let _ = writeln!(f, "{}", serde_json::to_string(p).unwrap_or_default());
                }
            }))?;
            Ok(())
        }
    }
}
