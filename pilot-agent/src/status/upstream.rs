//! The requests the status server makes on the kubelet's and Prometheus'
//! behalf: application probes (from `127.0.0.6`, over TLS for HTTPS probes,
//! HTTP/2 when ALPN picks it) and metrics scrapes. Each is one request on a
//! connection of its own, built from the agent's shared HTTP plumbing.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::Method;
use hyper::Response;
use hyper::body::{Bytes, Incoming};
use hyper::header::HeaderMap;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;

use crate::http_client::{self, InvalidRequest, build_request, host_port};

/// Kubelet's redirect limit.
pub(super) const MAX_REDIRECTS: usize = 10;

/// Why an upstream request failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum FetchError {
    #[error("dial tcp {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    #[error("TLS handshake: {0}")]
    Tls(io::Error),
    #[error("server name {host}: {source}")]
    ServerName {
        host: String,
        source: rustls::pki_types::InvalidDnsNameError,
    },
    #[error(transparent)]
    Redirect(#[from] LocationError),
    #[error(transparent)]
    InvalidRequest(#[from] InvalidRequest),
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("context deadline exceeded (timeout {0:?})")]
    Timeout(Duration),
    #[error("stopped after {MAX_REDIRECTS} redirects")]
    TooManyRedirects,
    #[error("response exceeds {0} bytes")]
    TooLarge(usize),
}

/// Why a redirect's `Location` cannot be followed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LocationError {
    /// It does not parse as a URI.
    #[error("failed to parse Location header {location:?}: {source}")]
    Parse {
        location: String,
        source: hyper::http::uri::InvalidUri,
    },
    /// An absolute `Location` without a host.
    #[error("failed to parse Location header {location:?}: no host")]
    NoHost { location: String },
}

/// Where to send a request.
pub(super) struct Upstream<'a> {
    pub(super) host: &'a str,
    pub(super) port: u16,
    pub(super) tls: Option<&'a Arc<ClientConfig>>,
    /// Bind `127.0.0.6` / `::6` (application probes).
    pub(super) bind_source: bool,
}

/// One request on a new connection; HTTPS negotiates HTTP/2 through ALPN.
pub(super) async fn send_request(
    upstream: &Upstream<'_>,
    method: Method,
    path_and_query: &str,
    authority: &str,
    headers: &HeaderMap,
) -> Result<Response<Incoming>, FetchError> {
    let stream = http_client::dial(upstream.host, upstream.port, upstream.bind_source)
        .await
        .map_err(|source| FetchError::Connect {
            addr: host_port(upstream.host, upstream.port),
            source,
        })?;
    let Some(tls) = upstream.tls else {
        let req = build_request(method, path_and_query, authority, headers, false, empty())?;
        return Ok(http_client::send_h1(stream, req).await?);
    };
    let name = ServerName::try_from(upstream.host.to_string()).map_err(|source| {
        FetchError::ServerName {
            host: upstream.host.to_string(),
            source,
        }
    })?;
    let stream = tokio_rustls::TlsConnector::from(tls.clone())
        .connect(name, stream)
        .await
        .map_err(FetchError::Tls)?;
    if stream.get_ref().1.alpn_protocol() == Some(b"h2".as_slice()) {
        let req = build_request(method, path_and_query, authority, headers, true, empty())?;
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender.send_request(req).await?)
    } else {
        let req = build_request(method, path_and_query, authority, headers, false, empty())?;
        Ok(http_client::send_h1(stream, req).await?)
    }
}

fn empty() -> Empty<Bytes> {
    Empty::new()
}

/// Reads a whole body, failing beyond `cap` bytes.
pub(super) async fn read_capped(mut body: Incoming, cap: usize) -> Result<Bytes, FetchError> {
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            if buf.len() + data.len() > cap {
                return Err(FetchError::TooLarge(cap));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(buf))
}

/// Reads up to `cap` bytes of a body; errors end it early.
pub(super) async fn read_at_most(mut body: Incoming, cap: usize) -> Bytes {
    let mut buf = Vec::new();
    while buf.len() < cap {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    let take = data.len().min(cap - buf.len());
                    buf.extend_from_slice(&data[..take]);
                }
            }
            _ => break,
        }
    }
    Bytes::from(buf)
}
