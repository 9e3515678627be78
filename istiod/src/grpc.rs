//! istiod's gRPC listeners: TLS is terminated here with our own rustls config
//! (`ca::serving_cert`: optional client certificates verified against the CA roots) and the
//! streams are handed to tonic, which exposes the verified peer chain to
//! handlers through `Request::peer_certs`.

use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

/// How long a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts TCP connections and yields completed TLS streams; failed handshakes
/// are logged and dropped without disturbing other clients.
pub fn tls_incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
) -> ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(128);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(target: "grpc", "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            if tx.is_closed() {
                break;
            }
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => {
                        tracing::info!(target: "grpc", %peer, "TLS handshake failed: {e}")
                    }
                    Err(_) => tracing::info!(target: "grpc", %peer, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
