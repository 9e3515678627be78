//! `--run-validation`: Istio's check that traffic capture works
//! (`tools/istio-iptables/pkg/validation`), run by the `istio-validation`
//! init container of CNI installs.
//!
//! It listens where Envoy would (`127.0.0.1` on the outbound and inbound
//! capture ports, `::1` for an IPv6 Pod) and connects, from the loopback
//! address, to `127.0.0.6` (`::6`) on the probe port, where nothing listens.
//! Only the capture rules can bring that connection to one of the listeners;
//! the listener reads the original destination (`SO_ORIGINAL_DST`) and passes
//! when it is the probe port. As in Istio the client retries every second
//! until `--probe-timeout`.
//!
//! The connection is captured by the `--uid-owner`/`--gid-owner` rules on the
//! loopback interface, so, as Istio's `istio-validation` container, this must
//! run as the proxy's uid or gid (1337); as any other user the rules return
//! loopback traffic untouched and the validation fails.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;

use super::config::Config;
use super::host::loopback;

/// Istio's exit code for a failed validation.
pub const VALIDATION_ERROR_CODE: u8 = 126;

/// Istio's message for a failed validation.
pub const VALIDATION_FAILED_MESSAGE: &str = "iptables validation failed; workload is not ready for Istio.
When using Istio CNI, this can occur if a pod is scheduled before the node is ready.

If installed with 'cni.repair.deletePods=true', this pod should automatically be deleted and retry.
Otherwise, this pod will need to be manually removed so that it is scheduled on a node with istio-cni running, allowing iptables rules to be established.
";

/// Why the validation did not pass.
#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    /// No connection arrived through the capture rules in time.
    #[error("validation timeout")]
    Timeout,
    /// None of the listen addresses could be bound.
    #[error("no listener available: {0}")]
    NoListener(String),
    /// The async runtime could not start.
    #[error("cannot start the validation runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// Where the validator listens and what it connects to.
#[derive(Debug, Clone)]
pub struct Validator {
    /// Loopback on Envoy's outbound and inbound capture ports.
    pub listen: Vec<SocketAddr>,
    /// `127.0.0.6` (or `::6`) on the probe port.
    pub original: SocketAddr,
    /// How long to wait.
    pub timeout: Duration,
}

impl Validator {
    /// Istio's `NewValidator`: the family follows the Pod's address.
    pub fn new(cfg: &Config) -> Self {
        let ipv6 = cfg.host.host_ip.is_some_and(|ip| ip.is_ipv6());
        let listen_ip = loopback(ipv6);
        let server_ip = if ipv6 {
            IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6))
        } else {
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6))
        };
        Self {
            listen: [cfg.proxy_port, cfg.inbound_capture_port]
                .into_iter()
                .map(|p| SocketAddr::new(listen_ip, p))
                .collect(),
            original: SocketAddr::new(server_ip, cfg.iptables_probe_port),
            timeout: cfg.probe_timeout,
        }
    }

    /// Runs the check on a runtime of its own.
    pub fn run_blocking(&self) -> Result<(), ValidationError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ValidationError::Runtime)?;
        rt.block_on(self.run())
    }

    /// Passes when a connection to the probe address reaches a listener with
    /// the probe port as its original destination.
    pub async fn run(&self) -> Result<(), ValidationError> {
        tracing::info!(
            "Starting iptables validation. This check verifies that iptables rules are properly established for the network."
        );
        let deadline = tokio::time::sleep(self.timeout);
        tokio::pin!(deadline);
        let (done_tx, mut done_rx) = mpsc::channel::<()>(2);
        let mut listening = 0;
        let mut tasks = Vec::new();
        for addr in &self.listen {
            tracing::info!("Listening on {addr}");
            match listen(*addr) {
                Ok(l) => {
                    listening += 1;
                    let port = self.original.port();
                    tasks.push(tokio::spawn(serve(l, port, done_tx.clone())));
                }
                Err(e) => tracing::error!("Error on listening: {e}"),
            }
        }
        if listening == 0 {
            let addrs: Vec<String> = self.listen.iter().map(ToString::to_string).collect();
            return Err(ValidationError::NoListener(addrs.join(",")));
        }
        tasks.push(tokio::spawn(probe(self.original)));
        let result = tokio::select! {
            _ = &mut deadline => Err(ValidationError::Timeout),
            _ = done_rx.recv() => {
                tracing::info!("Validation passed, iptables rules established");
                Ok(())
            }
        };
        for t in tasks {
            t.abort();
        }
        result
    }
}

fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(128)
}

/// The original destination port the capture rules recorded.
fn original_port(conn: &TcpStream) -> std::io::Result<u16> {
    use nix::sys::socket::{getsockopt, sockopt};
    let port = if conn.peer_addr()?.is_ipv4() {
        getsockopt(conn, sockopt::OriginalDst)?.sin_port
    } else {
        getsockopt(conn, sockopt::Ip6tOriginalDst)?.sin6_port
    };
    Ok(u16::from_be(port))
}

async fn serve(listener: TcpListener, probe_port: u16, done: mpsc::Sender<()>) {
    loop {
        let mut conn = match listener.accept().await {
            Ok((c, _)) => c,
            Err(e) => {
                tracing::error!("Listener failed to accept connection: {e}");
                continue;
            }
        };
        let port = match original_port(&conn) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!("Error getting original dst: {e}");
                continue;
            }
        };
        tracing::info!("Local addr {:?}", conn.local_addr().ok());
        tracing::info!(
            "Original addr {:?}: {port}",
            conn.peer_addr().ok().map(|a| a.ip())
        );
        // The port is echoed for debugging, as Istio does.
        let _ = conn.write_all(port.to_string().as_bytes()).await;
        let _ = conn.shutdown().await;
        if port == probe_port {
            let _ = done.send(()).await;
            return;
        }
    }
}

/// Connects to the probe address every second from the loopback address.
async fn probe(original: SocketAddr) {
    let local = SocketAddr::new(loopback(original.is_ipv6()), 0);
    loop {
        let attempt = async {
            let socket = if local.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            socket.bind(local)?;
            socket.connect(original).await
        };
        if let Err(e) = attempt.await {
            tracing::error!("Error connecting to {original}: {e}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
