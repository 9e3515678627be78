//! The one client for Envoy's admin API (`127.0.0.1:15000`, or `[::1]` in
//! IPv6 Pods), used by the supervisor to drain Envoy and count its
//! connections, by the readiness probe for Envoy's stats, and by `pilot-agent
//! wait` and `pilot-agent request`, which also reach the agent's and
//! Envoy's other loopback ports with it.
//!
//! Each call is one HTTP/1.1 request on a fresh connection, bounded as a
//! whole (connect, request and body) by the client's timeout, as Istio's
//! `pkg/http` helpers are. Nothing is pooled: these calls are rare.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::Method;
use hyper::StatusCode;
use hyper::body::Bytes;
use hyper::header::{self, HeaderMap, HeaderValue};

use crate::http_client;

/// A request's bound when none is given: Istio's admin calls use a few
/// seconds (drain 5 s, connection counts 2 s, readiness 3 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why an admin call got no answer.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// Nothing accepted the connection (Envoy not started, or gone); Go's
    /// wording, as Istio's messages show it.
    #[error("dial tcp {addr}: {source}")]
    Connect {
        /// `host:port`.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The path cannot be sent as it is (hyper rejects it).
    #[error("invalid request {path:?}: {reason}")]
    InvalidRequest {
        /// The path and query.
        path: String,
        /// Why.
        reason: String,
    },
    /// The connection failed mid-request or the answer was not HTTP.
    #[error("{0}")]
    Http(#[from] hyper::Error),
    /// No whole answer within the client's timeout.
    #[error("context deadline exceeded (timeout {0:?})")]
    Timeout(Duration),
}

/// An admin answer, whatever its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminResponse {
    /// The HTTP status.
    pub status: StatusCode,
    /// The whole body.
    pub body: Bytes,
}

impl AdminResponse {
    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A client of one loopback HTTP endpoint, by default Envoy's admin port on
/// `127.0.0.1`.
#[derive(Debug, Clone)]
pub struct AdminClient {
    host: String,
    port: u16,
    timeout: Duration,
}

impl AdminClient {
    /// Envoy's admin on `127.0.0.1:<port>`.
    pub fn new(port: u16) -> Self {
        Self::at_ip(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
    }

    /// The endpoint on `ip:port` (`::1` in IPv6 Pods).
    pub fn at_ip(ip: IpAddr, port: u16) -> Self {
        Self::at_host(ip.to_string(), port)
    }

    /// The endpoint on `addr`.
    pub fn at(addr: SocketAddr) -> Self {
        Self::at_ip(addr.ip(), addr.port())
    }

    /// The endpoint on `host:port`; a name is resolved on each call (as for
    /// `pilot-agent wait --url`).
    pub fn at_host(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Bounds each call by `timeout` instead of [`DEFAULT_TIMEOUT`].
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// `http://host:port<path>`, as Istio's messages name the request.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.authority())
    }

    fn authority(&self) -> String {
        http_client::host_port(&self.host, self.port)
    }

    /// `GET path` (path and query, sent as given).
    pub async fn get(&self, path: &str) -> Result<AdminResponse, AdminError> {
        self.request(Method::GET, path, Bytes::new()).await
    }

    /// `POST path` with an empty body (Envoy's admin mutations).
    pub async fn post(&self, path: &str) -> Result<AdminResponse, AdminError> {
        self.request(Method::POST, path, Bytes::new()).await
    }

    /// Any method, with a body.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<AdminResponse, AdminError> {
        tokio::time::timeout(self.timeout, self.exchange(method, path, body))
            .await
            .map_err(|_| AdminError::Timeout(self.timeout))?
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<AdminResponse, AdminError> {
        let authority = self.authority();
        let stream = http_client::dial(&self.host, self.port, false)
            .await
            .map_err(|source| AdminError::Connect {
                addr: authority.clone(),
                source,
            })?;
        let mut headers = HeaderMap::new();
        // One request per connection: let the server close it.
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        let req =
            http_client::build_request(method, path, &authority, &headers, false, Full::new(body))
                .map_err(|e| AdminError::InvalidRequest {
                    path: path.to_string(),
                    reason: e.0,
                })?;
        let resp = http_client::send_h1(stream, req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok(AdminResponse { status, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};

    use hyper::body::Incoming;
    use hyper::service::service_fn;
    use hyper::{Request, Response};
    use hyper_util::rt::TokioIo;
    use tokio::net::TcpListener;

    type Seen = Arc<Mutex<Vec<(Method, String, String, String)>>>;

    /// A fake admin answering `/chunked` in chunks and everything else with
    /// its method and body; it records what it was sent.
    async fn fake_admin() -> (u16, Seen) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen: Seen = Arc::default();
        let record = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let record = record.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let record = record.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body.collect().await.unwrap().to_bytes();
                            let body = String::from_utf8(body.to_vec()).unwrap();
                            let host = parts.headers[header::HOST].to_str().unwrap().to_string();
                            let target = parts.uri.to_string();
                            record.lock().unwrap().push((
                                parts.method.clone(),
                                target.clone(),
                                host,
                                body.clone(),
                            ));
                            let resp = match target.as_str() {
                                "/missing" => Response::builder()
                                    .status(404)
                                    .body(http_body_util::Either::Left(Full::new(Bytes::new()))),
                                "/chunked" => {
                                    let frames = ["cluster_manager", ".cds: 1\n"].map(|s| {
                                        Ok::<_, Infallible>(hyper::body::Frame::data(
                                            Bytes::from_static(s.as_bytes()),
                                        ))
                                    });
                                    Response::builder().body(http_body_util::Either::Right(
                                        http_body_util::StreamBody::new(futures::stream::iter(
                                            frames,
                                        )),
                                    ))
                                }
                                _ => Response::builder().body(http_body_util::Either::Left(
                                    Full::new(Bytes::from(format!("{} {body}", parts.method))),
                                )),
                            };
                            Ok::<_, Infallible>(resp.unwrap())
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        (port, seen)
    }

    #[tokio::test]
    async fn get_and_post_return_status_and_body() {
        let (port, seen) = fake_admin().await;
        let admin = AdminClient::new(port);
        let resp = admin
            .get(r"/stats?usedonly&filter=^(server\.state|x)$")
            .await
            .unwrap();
        assert_eq!(
            (resp.status, resp.text().as_str()),
            (StatusCode::OK, "GET ")
        );
        let resp = admin.post("/drain_listeners?graceful").await.unwrap();
        assert_eq!(resp.text(), "POST ");
        let resp = admin
            .request(Method::POST, "/logging", Bytes::from_static(b"level=debug"))
            .await
            .unwrap();
        assert_eq!(resp.text(), "POST level=debug");
        // A status other than 200 is an answer, not an error.
        assert_eq!(
            admin.get("/missing").await.unwrap().status,
            StatusCode::NOT_FOUND
        );
        // A chunked answer is read whole.
        assert_eq!(
            admin.get("/chunked").await.unwrap().text(),
            "cluster_manager.cds: 1\n"
        );
        let seen = seen.lock().unwrap();
        assert_eq!(
            seen[0].1, r"/stats?usedonly&filter=^(server\.state|x)$",
            "the query is sent as given"
        );
        assert_eq!(seen[0].2, format!("127.0.0.1:{port}"));
        assert_eq!(seen[1].0, Method::POST);
        assert_eq!(
            admin.url("/ready"),
            format!("http://127.0.0.1:{port}/ready")
        );
    }

    #[tokio::test]
    async fn errors_say_what_failed() {
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = dead.local_addr().unwrap().port();
        drop(dead);
        let err = AdminClient::new(port).get("/stats").await.unwrap_err();
        assert!(matches!(err, AdminError::Connect { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with(&format!("dial tcp 127.0.0.1:{port}: ")),
            "{err}"
        );

        // Accepts and never answers.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let err = AdminClient::new(port)
            .with_timeout(Duration::from_millis(200))
            .get("/stats")
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "context deadline exceeded (timeout 200ms)");

        let err = AdminClient::new(port).get("/a b").await.unwrap_err();
        assert!(matches!(err, AdminError::InvalidRequest { .. }), "{err}");
    }

    #[test]
    fn names_ipv6_endpoints_in_brackets() {
        let admin = AdminClient::at_ip("::1".parse().unwrap(), 15000);
        assert_eq!(admin.url("/stats"), "http://[::1]:15000/stats");
        let admin = AdminClient::at("127.0.0.1:15020".parse().unwrap());
        assert_eq!(admin.url("/drain"), "http://127.0.0.1:15020/drain");
    }
}
