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

/// What an HTTPS request to a gateway got.
#[derive(Debug, Clone)]
pub struct HttpsResponse {
    /// The server's leaf certificate, DER.
    pub leaf: Vec<u8>,
    /// The status code.
    pub status: u16,
    /// The body.
    pub body: String,
}

/// Why an HTTPS request failed, as a client observes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpsError {
    /// The TCP connection failed (`ConnectionRefused`, ...).
    Connect(std::io::ErrorKind),
    /// The server sent this TLS alert.
    Alert(rustls::AlertDescription),
    /// Another TLS error.
    Tls(String),
    /// The connection failed after connecting without an alert (`UnexpectedEof`,
    /// `ConnectionReset`, ...).
    Io(std::io::ErrorKind),
    /// The response did not parse.
    Http(String),
}

/// One HTTP/1.1 request over TLS with SNI `sni`, the server verified against
/// `root_pem` for that DNS name, optionally with a client certificate
/// (`(cert_pem, key_pem)`), from the calling thread's network namespace.
pub fn https_request(
    addr: SocketAddr,
    sni: &str,
    root_pem: &str,
    client: Option<(&str, &str)>,
    path: &str,
) -> Result<HttpsResponse, HttpsError> {
    use rustls::pki_types::pem::PemObject;
    common::tls::install_crypto_provider();
    let tls_err = |e: &dyn std::fmt::Display| HttpsError::Tls(e.to_string());
    let roots = common::tls::root_store("root", root_pem).map_err(|e| tls_err(&e))?;
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = pki::pem_certs("client", cert).map_err(|e| tls_err(&e))?;
            let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes())
                .map_err(|e| tls_err(&e))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| tls_err(&e))?
        }
    };
    let name = rustls::pki_types::ServerName::try_from(sni.to_string()).map_err(|e| tls_err(&e))?;
    let mut conn =
        rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| tls_err(&e))?;
    let mut sock = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| HttpsError::Connect(e.kind()))?;
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| HttpsError::Io(e.kind()))?;
    let io_err =
        |e: std::io::Error| match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            Some(rustls::Error::AlertReceived(a)) => HttpsError::Alert(*a),
            Some(other) => HttpsError::Tls(other.to_string()),
            None => HttpsError::Io(e.kind()),
        };
    let mut tls = rustls::Stream::new(&mut conn, &mut sock);
    let request = format!("GET {path} HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).map_err(io_err)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let text = loop {
        let n = tls.read(&mut chunk).map_err(io_err)?;
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
        .map(|c| c.as_ref().to_vec())
        .ok_or_else(|| HttpsError::Tls("no peer certificate".into()))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| HttpsError::Http(format!("no response head in {text:?}")))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| HttpsError::Http(format!("no status in {head:?}")))?;
    Ok(HttpsResponse {
        leaf,
        status,
        body: body.to_string(),
    })
}
