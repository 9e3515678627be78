//! CSR signing throughput: istiod's real `CreateCertificate` endpoint (TLS,
//! HTTP/2, bearer JWT, the CA server's blocking pool) against calling the same
//! `Signer` directly, measured in one run on the same CA key.
//!
//! `cargo bench -p istiod --bench ca_signing`. Prints a table; asserts nothing
//! about speed, only that every answer is a `[leaf, root]` chain.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use clap::Parser;
use common::Identity;
use common::env::MapEnv;
use common::pki::{self, KeyType};
use istiod::ca::Signer;
use istiod::ca::authn::JwtAuthenticator;
use istiod::ca::material::{SelfSignedOptions, load_or_create_self_signed};
use istiod::config::{Config, DiscoveryArgs};
use istiod::token::{Issuer, MintOptions};
use proto::istio_ca::IstioCertificateRequest;
use proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient;
use tonic::transport::Channel;

/// CSRs per pass.
const N: usize = 300;
/// Passes per measurement; the median is reported.
const PASSES: usize = 3;
/// A pass stops here even if it has not signed all N.
const PASS_CAP: Duration = Duration::from_secs(15);
/// Concurrent in-flight requests in the concurrent gRPC measurement.
const CONCURRENCY: usize = 8;
/// Distinct RSA workload keys (generation is slow); the N CSRs cycle over them.
const RSA_KEYS: usize = 4;
/// The name on istiod's serving certificate the client checks.
const ISTIOD_SAN: &str = "istiod.istio-system.svc";

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: DiscoveryArgs,
}

/// One timed pass: how many were signed in how long.
#[derive(Clone, Copy)]
struct Pass {
    done: usize,
    elapsed: Duration,
    /// CPU time of the whole process (client and server alike) during the pass.
    cpu: Duration,
}

impl Pass {
    fn rate(&self) -> f64 {
        self.done as f64 / self.elapsed.as_secs_f64()
    }

    fn cpu_ms_each(&self) -> f64 {
        self.cpu.as_secs_f64() * 1000.0 / self.done as f64
    }
}

/// User plus system CPU time of this process so far, from `/proc/self/stat`
/// (in clock ticks of 1/100 s, Linux's fixed `USER_HZ`).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses: state is
    // field 3, utime 14 and stime 15.
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

/// The median pass by rate, and the lowest and highest rates.
fn summarize(mut passes: Vec<Pass>) -> (Pass, f64, f64) {
    passes.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
    let lo = passes[0].rate();
    let hi = passes[passes.len() - 1].rate();
    (passes[passes.len() / 2], lo, hi)
}

fn check_chain(chain: &[String], root: &str) -> anyhow::Result<()> {
    ensure!(
        chain.len() == 2,
        "expected [leaf, root], got {} certificates",
        chain.len()
    );
    ensure!(chain[1] == root, "the last certificate is not the CA root");
    Ok(())
}

/// Signs CSRs directly on `threads` OS threads.
fn raw_pass(
    signer: &Signer,
    ids: &[Identity],
    csrs: &[String],
    threads: usize,
) -> anyhow::Result<Pass> {
    let next = AtomicUsize::new(0);
    let cpu = cpu_time();
    let start = Instant::now();
    let results: Vec<anyhow::Result<usize>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut done = 0;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= csrs.len() || start.elapsed() > PASS_CAP {
                            return Ok(done);
                        }
                        let chain = signer.sign_workload(&csrs[i], ids, Duration::ZERO)?;
                        check_chain(&chain, signer.root_pem())?;
                        done += 1;
                    }
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let elapsed = start.elapsed();
    let cpu = cpu_time().saturating_sub(cpu);
    let mut done = 0;
    for r in results {
        done += r?;
    }
    Ok(Pass { done, elapsed, cpu })
}

fn request(csr: &str, token: &str) -> tonic::Request<IstioCertificateRequest> {
    let mut r = tonic::Request::new(IstioCertificateRequest {
        csr: csr.to_string(),
        validity_duration: 0,
        metadata: None,
    });
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

/// Sends the CSRs through `CreateCertificate` with at most `concurrency` in flight
/// (one HTTP/2 connection, as an agent has).
async fn grpc_pass(
    client: &IstioCertificateServiceClient<Channel>,
    token: &str,
    root: &str,
    csrs: &Arc<Vec<String>>,
    concurrency: usize,
) -> anyhow::Result<Pass> {
    let next = Arc::new(AtomicUsize::new(0));
    let cpu = cpu_time();
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (mut client, token, root, csrs, next) = (
            client.clone(),
            token.to_string(),
            root.to_string(),
            csrs.clone(),
            next.clone(),
        );
        workers.spawn(async move {
            let mut done = 0;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= csrs.len() || start.elapsed() > PASS_CAP {
                    return anyhow::Ok(done);
                }
                let chain = client
                    .create_certificate(request(&csrs[i], &token))
                    .await
                    .context("CreateCertificate")?
                    .into_inner()
                    .cert_chain;
                check_chain(&chain, &root)?;
                done += 1;
            }
        });
    }
    let mut done = 0;
    while let Some(r) = workers.join_next().await {
        done += r??;
    }
    Ok(Pass {
        done,
        elapsed: start.elapsed(),
        cpu: cpu_time().saturating_sub(cpu),
    })
}

struct Row {
    key: KeyType,
    path: String,
    pass: Pass,
    lo: f64,
    hi: f64,
    /// (label of the baseline, its rate)
    baseline: Option<(&'static str, f64)>,
}

/// The 1, 5 and 15 minute load averages: other work on the machine skews every figure.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let load_before = loadavg();
    let tmp = tempfile::tempdir()?;
    let ca_dir = tmp.path().join("istio-ca-secret");
    let issuer = Issuer::create(
        &tmp.path().join("issuer"),
        "https://kubernetes.default.svc.cluster.local",
    )?;
    let env = MapEnv::from_pairs([
        ("JWT_RULE", issuer.jwt_rule().as_str()),
        ("ISTIOD_CUSTOM_HOST", "127.0.0.1"),
        (
            "ISTIO_SELF_SIGNED_CA_DIR",
            ca_dir.to_str().context("temp dir is not UTF-8")?,
        ),
        // Keep a stray ./etc/cacerts in the working directory from being used.
        (
            "ROOT_CA_DIR",
            tmp.path()
                .join("no-cacerts")
                .to_str()
                .context("temp dir is not UTF-8")?,
        ),
    ]);
    let cli = Cli::try_parse_from([
        "istiod",
        "--secureGRPCAddr=127.0.0.1:0",
        "--httpAddr=",
        "--monitoringAddr=",
        "--grpcAddr=",
        "--httpsAddr=",
        "--meshConfig=/nonexistent",
    ])?;
    let config = Arc::new(Config::from_args(&cli.args, &env).map_err(anyhow::Error::msg)?);
    let bound = istiod::app::build(config.clone()).await?;
    let addr = bound.secure_grpc_addr.context("no secure gRPC address")?;

    // The baseline signs with the very key and certificate istiod loaded.
    let bundle = load_or_create_self_signed(
        &ca_dir,
        &SelfSignedOptions {
            trust_domain: config.mesh.trust_domain.clone(),
            ttl: config.ca.self_signed_ca_ttl,
            rsa_key_size: config.ca.self_signed_ca_rsa_key_size,
        },
    )?;
    ensure!(
        bundle.root_pem == bound.root_pem,
        "the baseline must use istiod's own CA"
    );
    let signer = Signer::new(bundle, config.ca.default_cert_ttl, config.ca.max_cert_ttl)?;
    let root = bound.root_pem.clone();

    common::tls::install_crypto_provider();
    let source: common::tls::ClientConfigSource = Arc::new({
        let root = root.clone();
        move || {
            let store = common::tls::root_store("root", &root)?;
            Ok(Arc::new(common::tls::grpc_client_config(store, None)?))
        }
    });
    let name = rustls::pki_types::ServerName::try_from(ISTIOD_SAN)?;
    let channel = common::tls::grpc_channel(
        &addr.to_string(),
        Some((source, name)),
        Duration::from_secs(5),
    )?;
    let client = IstioCertificateServiceClient::new(channel);
    let token = issuer.mint(&MintOptions {
        namespace: "default".into(),
        service_account: "sleep".into(),
        audience: "istio-ca".into(),
        ttl: Duration::from_secs(3600),
        issuer_override: None,
        expired: false,
    })?;
    let id = Identity::new(&config.mesh.trust_domain, "default", "sleep");
    let ids = std::slice::from_ref(&id);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());

    let mut rows = Vec::new();
    for key_type in [KeyType::EcdsaP256, KeyType::Rsa(2048)] {
        // Keys and CSRs are made before any timing.
        let keys = match key_type {
            KeyType::Rsa(_) => RSA_KEYS,
            _ => N,
        };
        let keys: Vec<_> = (0..keys)
            .map(|_| pki::generate_key(key_type))
            .collect::<Result<_, _>>()?;
        let csrs: Vec<String> = (0..N)
            .map(|i| pki::csr_pem(&id, &keys[i % keys.len()]))
            .collect::<Result<_, _>>()?;
        let csrs = Arc::new(csrs);

        // Warm-up: the connection, the TLS session, the JWKS cache.
        let warm = Arc::new(csrs[..CONCURRENCY].to_vec());
        grpc_pass(&client, &token, &root, &warm, CONCURRENCY).await?;
        raw_pass(&signer, ids, &warm, 1)?;

        let mut raw1 = Vec::new();
        let mut rawn = Vec::new();
        let mut grpc1 = Vec::new();
        let mut grpcn = Vec::new();
        // Interleaved, so drift on a shared machine hits every path alike.
        for _ in 0..PASSES {
            raw1.push(tokio::task::block_in_place(|| {
                raw_pass(&signer, ids, &csrs, 1)
            })?);
            rawn.push(tokio::task::block_in_place(|| {
                raw_pass(&signer, ids, &csrs, cores)
            })?);
            grpc1.push(grpc_pass(&client, &token, &root, &csrs, 1).await?);
            grpcn.push(grpc_pass(&client, &token, &root, &csrs, CONCURRENCY).await?);
        }
        let (raw1, lo, hi) = summarize(raw1);
        let raw1_rate = raw1.rate();
        rows.push(Row {
            key: key_type,
            path: "raw Signer, 1 thread".into(),
            pass: raw1,
            lo,
            hi,
            baseline: None,
        });
        let (rawn, lo, hi) = summarize(rawn);
        let rawn_rate = rawn.rate();
        rows.push(Row {
            key: key_type,
            path: format!("raw Signer, {cores} threads"),
            pass: rawn,
            lo,
            hi,
            baseline: Some(("raw 1 thread", raw1_rate)),
        });
        let (g1, lo, hi) = summarize(grpc1);
        rows.push(Row {
            key: key_type,
            path: "gRPC, concurrency 1".into(),
            pass: g1,
            lo,
            hi,
            baseline: Some(("raw 1 thread", raw1_rate)),
        });
        let (gn, lo, hi) = summarize(grpcn);
        rows.push(Row {
            key: key_type,
            path: format!("gRPC, concurrency {CONCURRENCY}"),
            pass: gn,
            lo,
            hi,
            baseline: Some(("raw all threads", rawn_rate)),
        });
    }
    bound.shutdown().await;

    // One part of the gRPC path on its own: the bearer token check each call makes.
    let rule = config.ca.jwt_rule.clone().context("no JWT_RULE")?;
    let jwt = JwtAuthenticator::new(rule, &config.mesh.trust_domain);
    jwt.authenticate(&token).await.map_err(anyhow::Error::msg)?;
    let cpu = cpu_time();
    let start = Instant::now();
    for _ in 0..N {
        jwt.authenticate(&token).await.map_err(anyhow::Error::msg)?;
    }
    let jwt_pass = Pass {
        done: N,
        elapsed: start.elapsed(),
        cpu: cpu_time().saturating_sub(cpu),
    };

    println!();
    println!(
        "CSR signing, CA key RSA-{} (self-signed root), {N} CSRs per pass, median of {PASSES} passes, {cores} CPUs",
        config.ca.self_signed_ca_rsa_key_size
    );
    println!("gRPC = TLS + HTTP/2 + bearer JWT (ES256) to an in-process istiod, one connection");
    println!(
        "CPU ms = process CPU time per signing (gRPC rows include the client's share); CPU x raw against raw 1 thread"
    );
    println!("load average before {load_before}, after {}", loadavg());
    println!();
    println!(
        "{:<11} {:<25} {:>7} {:>11} {:>17} {:>7} {:>9}  rate ratio",
        "CSR key", "path", "signed", "signings/s", "(min..max)", "CPU ms", "CPU x raw"
    );
    let mut capped = false;
    let mut raw_cpu = 0.0;
    for r in &rows {
        if r.baseline.is_none() {
            raw_cpu = r.pass.cpu_ms_each();
        }
        capped |= r.pass.done < N;
        let ratio = match r.baseline {
            Some((label, base)) => format!("{:.2} x {label}", r.pass.rate() / base),
            None => "baseline".to_string(),
        };
        println!(
            "{:<11} {:<25} {:>7} {:>11.1} {:>17} {:>7.2} {:>9.2}  {}",
            r.key.to_string(),
            r.path,
            r.pass.done,
            r.pass.rate(),
            format!("({:.0}..{:.0})", r.lo, r.hi),
            r.pass.cpu_ms_each(),
            r.pass.cpu_ms_each() / raw_cpu,
            ratio
        );
    }
    println!(
        "JWT check alone (JwtAuthenticator::authenticate, cached JWKS): {:.1} checks/s, {:.2} CPU ms each",
        jwt_pass.rate(),
        jwt_pass.cpu_ms_each()
    );
    if capped {
        println!("(a pass stopped at the {PASS_CAP:?} cap: its rate is over fewer than {N} CSRs)");
    }
    Ok(())
}
