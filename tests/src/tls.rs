//! A TLS client that reports the certificate a server presents, verified
//! against a given root as a mesh peer would (SPIFFE identity, no DNS name).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use common::pki::{self, CertInfo};

/// Connects to `addr`, verifies the served chain against `root_pem` and an
/// optional expected identity, sends one HTTP request and returns the leaf's
/// details and the response body.
pub fn probe(
    addr: SocketAddr,
    root_pem: &str,
    expect_identity: Option<&str>,
) -> Result<(CertInfo, String), String> {
    common::tls::install_crypto_provider();
    let roots = common::tls::root_store("root", root_pem).map_err(|e| e.to_string())?;
    let allowed = expect_identity
        .map(|s| vec![s.to_string()])
        .unwrap_or_default();
    let config =
        common::tls::spiffe_client_config(roots, allowed, None).map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("workload.mesh.invalid")
        .map_err(|e| e.to_string())?;
    let mut conn =
        rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let mut sock = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect: {e}"))?;
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    sock.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut tls = rustls::Stream::new(&mut conn, &mut sock);
    tls.write_all(b"GET / HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("TLS handshake or write: {e}"))?;
    // Read one response by its Content-Length: Envoy waits for the client to
    // close first (delayed_close_timeout), so reading to EOF would stall.
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let body = loop {
        let n = tls.read(&mut chunk).map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            break String::from_utf8_lossy(&buf).into_owned();
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse::<usize>().ok());
            if len.is_some_and(|len| body.len() >= len) {
                break text;
            }
        }
    };
    let leaf = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or("no peer certificate")?;
    let info = pki::cert_info(leaf.as_ref()).map_err(|e| e.to_string())?;
    Ok((info, body))
}

/// One HTTPS request as an API server sends it to a webhook: TLS verified
/// against `root_pem` for `server_name` (a DNS name), HTTP/1.1, body as
/// given, `Connection: close`. Returns (status, body), or what failed.
pub fn https_post(
    addr: SocketAddr,
    server_name: &str,
    root_pem: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> Result<(u16, String), String> {
    common::tls::install_crypto_provider();
    let roots = common::tls::root_store("root", root_pem).map_err(|e| e.to_string())?;
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string())
        .map_err(|e| e.to_string())?;
    let request = hyper::Request::post(path)
        .header(hyper::header::HOST, server_name)
        .header(hyper::header::CONTENT_TYPE, content_type)
        .header(hyper::header::CONNECTION, "close")
        .body(http_body_util::Full::new(
            hyper::body::Bytes::copy_from_slice(body),
        ))
        .map_err(|e| e.to_string())?;
    let exchange = async move {
        let sock =
            tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
                .await
                .map_err(|_| "connect: timed out".to_string())?
                .map_err(|e| format!("connect: {e}"))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, sock)
            .await
            .map_err(|e| format!("TLS handshake or write: {e}"))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .map_err(|e| format!("TLS handshake or write: {e}"))?;
        tokio::spawn(conn);
        let resp = sender
            .send_request(request)
            .await
            .map_err(|e| format!("read: {e}"))?;
        let status = resp.status().as_u16();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .map_err(|e| format!("read: {e}"))?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    crate::block_on_own_thread(|| async move {
        tokio::time::timeout(Duration::from_secs(12), exchange)
            .await
            .map_err(|_| "read: timed out".to_string())?
    })
}
