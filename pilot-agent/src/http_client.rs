//! Connection-level HTTP plumbing shared by the agent's HTTP clients: Envoy's
//! admin client, the application probes and the metrics scrapes.
//!
//! Every request gets a connection of its own, dialled here and driven by
//! hyper's connection-level client: probes must bind their source address
//! and send `Connection: close`, which pooled clients do not allow, and the
//! others talk to a loopback endpoint a few times a second at most.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use hyper::body::{Body, Incoming};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpSocket, TcpStream};

/// Istio's `InboundPassthroughBindIpv4`: iptables passes traffic from this
/// address to the application instead of redirecting it into Envoy, so
/// application probes are sent from it.
const INBOUND_PASSTHROUGH_V4: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6));
/// Istio's `InboundPassthroughBindIpv6`.
const INBOUND_PASSTHROUGH_V6: IpAddr = IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6));

/// A request that cannot be written (a path or header hyper rejects).
#[derive(Debug, thiserror::Error)]
#[error("invalid request: {0}")]
pub(crate) struct InvalidRequest(pub(crate) String);

/// `host:port`, bracketing IPv6 literals.
pub(crate) fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Connects to each address of `host` in turn. With `passthrough_source`,
/// the connection is made from `127.0.0.6` (or `::6`), as application probes
/// are.
pub(crate) async fn dial(host: &str, port: u16, passthrough_source: bool) -> io::Result<TcpStream> {
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        match dial_addr(addr, passthrough_source).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, format!("no address for {host}"))
    }))
}

async fn dial_addr(addr: SocketAddr, passthrough_source: bool) -> io::Result<TcpStream> {
    let (socket, source) = if addr.is_ipv4() {
        (TcpSocket::new_v4()?, INBOUND_PASSTHROUGH_V4)
    } else {
        (TcpSocket::new_v6()?, INBOUND_PASSTHROUGH_V6)
    };
    if passthrough_source && let Err(e) = socket.bind(SocketAddr::new(source, 0)) {
        // `::6` exists only where the Pod's network setup adds it to `lo`.
        tracing::debug!(target: "probes", "cannot bind probe source {source}: {e}; using the default source address");
    }
    let stream = socket.connect(addr).await?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Sends one HTTP/1.1 request on `io`; the connection is driven by a task
/// of its own until the response body has been read or dropped.
pub(crate) async fn send_h1<T, B>(
    io: T,
    req: Request<B>,
) -> Result<Response<Incoming>, hyper::Error>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await
}

/// A request for `path_and_query` on `authority`. HTTP/1 requests carry the
/// authority in `Host`; HTTP/2 ones in the URI (`:authority`), without
/// connection-specific headers.
pub(crate) fn build_request<B>(
    method: Method,
    path_and_query: &str,
    authority: &str,
    headers: &HeaderMap,
    h2: bool,
    body: B,
) -> Result<Request<B>, InvalidRequest> {
    let bad = |e: &dyn std::fmt::Display| InvalidRequest(e.to_string());
    let uri = if h2 {
        format!("https://{authority}{path_and_query}")
    } else {
        path_and_query.to_string()
    };
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .body(body)
        .map_err(|e| bad(&e))?;
    *req.headers_mut() = headers.clone();
    if h2 {
        req.headers_mut().remove(header::HOST);
        req.headers_mut().remove(header::CONNECTION);
    } else {
        let host = HeaderValue::from_str(authority).map_err(|e| bad(&e))?;
        req.headers_mut().insert(header::HOST, host);
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_brackets_ipv6() {
        assert_eq!(host_port("127.0.0.1", 15000), "127.0.0.1:15000");
        assert_eq!(host_port("::1", 15000), "[::1]:15000");
        assert_eq!(host_port("localhost", 80), "localhost:80");
    }

    #[test]
    fn requests_carry_the_authority_where_the_protocol_wants_it() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        let h1 = build_request(
            Method::GET,
            "/ready?x=1",
            "10.0.0.1:80",
            &headers,
            false,
            (),
        )
        .unwrap();
        assert_eq!(h1.uri(), "/ready?x=1");
        assert_eq!(h1.headers()[header::HOST], "10.0.0.1:80");
        assert_eq!(h1.headers()[header::CONNECTION], "close");
        let h2 = build_request(Method::GET, "/ready", "10.0.0.1:443", &headers, true, ()).unwrap();
        assert_eq!(h2.uri(), "https://10.0.0.1:443/ready");
        assert!(h2.headers().get(header::HOST).is_none());
        assert!(h2.headers().get(header::CONNECTION).is_none());
        assert!(build_request(Method::GET, "/a b", "x:1", &headers, false, ()).is_err());
    }
}
