//! `istioctl proxy-status` against istiod's xDS port: asks for
//! `istio.io/debug/syncz` and prints NAME, CLUSTER, CDS, LDS, EDS, RDS, ECDS,
//! ISTIOD, VERSION per connected proxy.
//!
//! ```text
//! proxy_status [--addr HOST:PORT] [--namespace NS] [--service-account SA]
//!              [--root ROOT.pem [--cert CHAIN.pem --key KEY.pem]]
//! ```
//!
//! Without `--root` it speaks plaintext (istiod's :15010, default
//! `127.0.0.1:15010`); with it, TLS verified against `ROOT.pem` for the name
//! `istiod.istio-system.svc` (:15012), authenticated by the client
//! certificate (a workload certificate of `--namespace`). The node is a debug client of
//! `--namespace` (default `istio-system`) and `--service-account`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tests::proxy_status::{debug_node, rows, syncz, table};

#[derive(Default)]
struct Args {
    addr: Option<String>,
    namespace: Option<String>,
    service_account: Option<String>,
    root: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let slot = match flag.as_str() {
            "--addr" => &mut a.addr,
            "--namespace" => &mut a.namespace,
            "--service-account" => &mut a.service_account,
            "--root" => &mut a.root,
            "--cert" => &mut a.cert,
            "--key" => &mut a.key,
            other => return Err(format!("unknown flag {other}")),
        };
        *slot = Some(value);
    }
    Ok(a)
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))
}

fn channel(a: &Args, addr: &str) -> Result<tonic::transport::Channel, String> {
    common::tls::install_crypto_provider();
    let tls = match &a.root {
        None => None,
        Some(root) => {
            let root = read(root)?;
            let client = match (&a.cert, &a.key) {
                (Some(c), Some(k)) => {
                    let chain = common::pki::pem_certs(c, &read(c)?).map_err(|e| e.to_string())?;
                    let key = <rustls_pki_types::PrivateKeyDer<'_> as rustls_pki_types::pem::PemObject>::from_pem_slice(read(k)?.as_bytes())
                        .map_err(|e| format!("{k}: {e}"))?;
                    Some((chain, key))
                }
                _ => None,
            };
            let source: common::tls::ClientConfigSource = Arc::new(move || {
                let store = common::tls::root_store("root", &root)?;
                Ok(Arc::new(common::tls::grpc_client_config(
                    store,
                    client.as_ref().map(|(c, k)| (c.clone(), k.clone_key())),
                )?))
            });
            let name = rustls_pki_types::ServerName::try_from(tests::ISTIOD_SAN)
                .map_err(|e| e.to_string())?;
            Some((source, name))
        }
    };
    common::tls::grpc_channel(addr, tls, Duration::from_secs(5)).map_err(|e| e.to_string())
}

async fn run(a: Args) -> Result<String, String> {
    let addr = a.addr.clone().unwrap_or_else(|| "127.0.0.1:15010".into());
    let ch = channel(&a, &addr)?;
    let node = debug_node(
        a.namespace.as_deref().unwrap_or("istio-system"),
        a.service_account.as_deref().unwrap_or("default"),
    );
    let answer = syncz(ch, node).await.map_err(|e| e.to_string())?;
    let rows = rows(&answer).map_err(|e| e.to_string())?;
    Ok(table(&rows))
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("proxy_status: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("proxy_status: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(t) => {
            print!("{t}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("proxy_status: {e}");
            ExitCode::FAILURE
        }
    }
}
