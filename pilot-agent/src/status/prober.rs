//! The application's probes, as Istio's status server proxies them: the
//! injector rewrites each container's `httpGet`, `tcpSocket` and `grpc`
//! probes (and lifecycle hooks) to `/app-health/<container>/<kind>` and
//! `/app-lifecycle/<container>/<kind>` on the status port and stores the
//! originals in `ISTIO_KUBE_APP_PROBERS`, which the configuration validates
//! (Istio's `validateAppKubeProber`). This module runs a probe per request,
//! from `127.0.0.6` so the iptables rules let it through to the
//! application, with the kubelet's rules for redirects, bodies and timeouts.

use std::io;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use common::tls::HandshakeSignatures;
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::http::uri::{Authority, PathAndQuery};
use hyper::{Method, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};

use super::upstream::{
    FetchError, LocationError, MAX_REDIRECTS, Upstream, read_at_most, send_request,
};
use super::{Body, StatusOptions, empty, full, text};
use crate::config::{APP_PROBER_PREFIXES, AppProbe, AppProbes};
use crate::http_client::{dial, host_port};

/// How much of an application probe's response body is passed back.
const MAX_PROBE_BODY: usize = 10 * 1024;
const GRPC_HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// Request headers never forwarded to a probed application.
const HOP_BY_HOP: [&str; 7] = [
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
];

/// Whether `path` is routed to the probers (valid or not: an unknown probe
/// answers 400, as Istio's does).
pub(crate) fn is_probe_path(path: &str) -> bool {
    APP_PROBER_PREFIXES
        .iter()
        .any(|prefix| path.starts_with(prefix))
}

// ---------------------------------------------------------------------------
// Running probes

/// The validated probes and where they go.
pub(super) struct AppProbers {
    probes: AppProbes,
    /// Where application probes go: `INSTANCE_IP` or `localhost`.
    probe_host: String,
    /// The status port, replaced by the application's in a forwarded `Host`.
    status_port: u16,
    tls: Arc<ClientConfig>,
}

impl AppProbers {
    pub(super) fn new(probes: AppProbes, options: &StatusOptions) -> Result<Self, rustls::Error> {
        let probe_host = if options.probe_localhost || options.instance_ip.is_empty() {
            "localhost".to_string()
        } else {
            options.instance_ip.clone()
        };
        Ok(Self {
            probes,
            probe_host,
            status_port: options.status_port,
            tls: Arc::new(insecure_client_config(options.http2_probing)?),
        })
    }

    /// Runs the probe registered for `path` and answers as the kubelet
    /// expects: the application's status (3xx as 200), or 500 when it could
    /// not be reached.
    pub(super) async fn handle(&self, path: &str, headers: &HeaderMap) -> Response<Body> {
        let Some(probe) = self.probes.get(path) else {
            tracing::error!(target: "status", "Prober does not exists url {path}");
            return text(
                StatusCode::BAD_REQUEST,
                format!("app prober config does not exists for {path}"),
            );
        };
        match probe {
            AppProbe::Http {
                path: app_path,
                port,
                https,
                timeout,
            } => {
                self.probe_http(path, app_path, *port, *https, *timeout, headers)
                    .await
            }
            AppProbe::Tcp { port, timeout } => self.probe_tcp(*port, *timeout).await,
            AppProbe::Grpc {
                port,
                service,
                timeout,
            } => self.probe_grpc(*port, service, *timeout, headers).await,
        }
    }

    /// The `Host` to send: the kubelet's, with the status port replaced by
    /// the application's.
    fn forwarded_host(&self, incoming: &HeaderMap, app_port: u16) -> Option<String> {
        let host = incoming.get(header::HOST)?.to_str().ok()?;
        match Authority::from_str(host) {
            Ok(a) if a.port_u16() == Some(self.status_port) => {
                Some(format!("{}:{app_port}", a.host()))
            }
            _ => Some(host.to_string()),
        }
    }

    async fn probe_http(
        &self,
        probe_path: &str,
        app_path: &str,
        port: u16,
        https: bool,
        timeout: Option<Duration>,
        incoming: &HeaderMap,
    ) -> Response<Body> {
        let authority = self
            .forwarded_host(incoming, port)
            .unwrap_or_else(|| host_port(&self.probe_host, port));
        // The kubelet already applied the probe's httpHeaders; forward what it sent.
        let mut headers = incoming.clone();
        for name in HOP_BY_HOP {
            headers.remove(name);
        }
        // As the kubelet: no keep-alive, so idle timeouts cannot fail probes.
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        let url = ProbeUrl {
            https,
            host: self.probe_host.clone(),
            port,
            path: app_path.to_string(),
        };
        let run = async {
            let resp = self.follow_redirects(url, authority, &headers).await?;
            let status = resp.status();
            if status.is_redirection() {
                // A 3xx without a followable Location: kubelet counts it a success.
                return Ok((StatusCode::OK, Bytes::new()));
            }
            Ok::<_, FetchError>((status, read_at_most(resp.into_body(), MAX_PROBE_BODY).await))
        };
        let result = match timeout {
            Some(t) => tokio::time::timeout(t, run)
                .await
                .unwrap_or_else(|_| Err(FetchError::Timeout(t))),
            None => run.await,
        };
        match result {
            Ok((status, body)) => full(status, body),
            Err(e) => {
                tracing::error!(target: "probes", "Request to probe app failed: {e}, original URL path = {probe_path}\napp URL path = {app_path}");
                empty(StatusCode::INTERNAL_SERVER_ERROR)
            }
        }
    }

    /// Kubelet's redirect rules: follow redirects to the same host (up to 10
    /// requests); a redirect elsewhere is returned as it is.
    async fn follow_redirects(
        &self,
        mut url: ProbeUrl,
        mut authority: String,
        headers: &HeaderMap,
    ) -> Result<Response<Incoming>, FetchError> {
        let original_host = url.host.clone();
        let mut requests = 0;
        loop {
            let upstream = Upstream {
                host: &url.host,
                port: url.port,
                tls: url.https.then_some(&self.tls),
                bind_source: true,
            };
            let resp = send_request(&upstream, Method::GET, &url.path, &authority, headers).await?;
            requests += 1;
            let followable = matches!(resp.status().as_u16(), 301 | 302 | 303 | 307 | 308);
            let location = resp
                .headers()
                .get(header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .filter(|l| followable && !l.is_empty());
            let Some(location) = location else {
                return Ok(resp);
            };
            let (next, next_authority) = url.resolve(location)?;
            if !next.host.eq_ignore_ascii_case(&original_host) {
                return Ok(resp);
            }
            if requests >= MAX_REDIRECTS {
                return Err(FetchError::TooManyRedirects);
            }
            if let Some(a) = next_authority {
                authority = a;
            }
            url = next;
        }
    }

    async fn probe_tcp(&self, port: u16, timeout: Option<Duration>) -> Response<Body> {
        let connect = dial(&self.probe_host, port, true);
        let result = match timeout {
            Some(t) => tokio::time::timeout(t, connect)
                .await
                .unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, "timeout"))),
            None => connect.await,
        };
        match result {
            Ok(_) => empty(StatusCode::OK),
            Err(e) => {
                tracing::debug!(target: "probes", "tcp probe of {} failed: {e}", host_port(&self.probe_host, port));
                empty(StatusCode::INTERNAL_SERVER_ERROR)
            }
        }
    }

    /// `grpc.health.v1.Health/Check`, as the kubelet's gRPC probe.
    async fn probe_grpc(
        &self,
        port: u16,
        service: &str,
        timeout: Option<Duration>,
        incoming: &HeaderMap,
    ) -> Response<Body> {
        let user_agent = incoming
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let host = self.probe_host.clone();
        let run = async move {
            let mut endpoint = tonic::transport::Endpoint::from_shared(format!(
                "http://{}",
                host_port(&host, port)
            ))
            .map_err(|e| GrpcProbeError::Connect(e.to_string()))?;
            if let Some(ua) = user_agent {
                endpoint = endpoint
                    .user_agent(ua)
                    .map_err(|e| GrpcProbeError::Connect(e.to_string()))?;
            }
            let connector = tower::service_fn(move |_: Uri| {
                let host = host.clone();
                async move { dial(&host, port, true).await.map(TokioIo::new) }
            });
            let channel = endpoint
                .connect_with_connector(connector)
                .await
                .map_err(|e| GrpcProbeError::Connect(e.to_string()))?;
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready()
                .await
                .map_err(|e| GrpcProbeError::Connect(e.to_string()))?;
            let request = tonic::Request::new(HealthCheckRequest {
                service: service.to_string(),
            });
            let response: tonic::Response<HealthCheckResponse> = grpc
                .unary(
                    request,
                    PathAndQuery::from_static(GRPC_HEALTH_CHECK),
                    tonic_prost::ProstCodec::default(),
                )
                .await
                .map_err(GrpcProbeError::Rpc)?;
            Ok::<_, GrpcProbeError>(response.into_inner().status)
        };
        let result = match timeout {
            Some(t) => tokio::time::timeout(t, run).await.unwrap_or_else(|_| {
                Err(GrpcProbeError::Rpc(tonic::Status::deadline_exceeded(
                    "timeout",
                )))
            }),
            None => run.await,
        };
        match result {
            Ok(SERVING) => empty(StatusCode::OK),
            Ok(status) => {
                tracing::debug!(target: "probes", "grpc probe: service {service:?} status {status}");
                empty(StatusCode::INTERNAL_SERVER_ERROR)
            }
            Err(GrpcProbeError::Connect(e)) => {
                tracing::error!(target: "probes", "Failed to create grpc connection to probe app: {e}");
                empty(StatusCode::INTERNAL_SERVER_ERROR)
            }
            Err(GrpcProbeError::Rpc(status)) => {
                match status.code() {
                    tonic::Code::Unimplemented => {
                        tracing::error!(target: "probes", "server does not implement the grpc health protocol (grpc.health.v1.Health): {status}")
                    }
                    tonic::Code::DeadlineExceeded => {
                        tracing::error!(target: "probes", "grpc request not finished within timeout: {status}")
                    }
                    _ => tracing::error!(target: "probes", "grpc probe failed: {status}"),
                }
                empty(StatusCode::INTERNAL_SERVER_ERROR)
            }
        }
    }
}

enum GrpcProbeError {
    Connect(String),
    Rpc(tonic::Status),
}

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

/// `grpc.health.v1.HealthCheckResponse`; `status` is the `ServingStatus` enum.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

/// `ServingStatus.SERVING`.
const SERVING: i32 = 1;

/// Follows one redirect `Location` (the application writes it) from an
/// HTTP probe of `http://127.0.0.1:8080/app/ready?verbose`, as the prober
/// does: the next host, port and path, or why it cannot be followed. Only
/// the fuzz entry points call it.
#[cfg(feature = "fuzzing")]
pub(crate) fn redirect_target(location: &str) -> Result<(String, u16, String), LocationError> {
    let probe = ProbeUrl {
        https: false,
        host: "127.0.0.1".into(),
        port: 8080,
        path: "/app/ready?verbose".into(),
    };
    probe
        .resolve(location)
        .map(|(next, _)| (next.host, next.port, next.path))
}

/// Where a probe request goes, possibly after redirects.
#[derive(Debug, Clone, PartialEq)]
struct ProbeUrl {
    https: bool,
    host: String,
    port: u16,
    path: String,
}

impl ProbeUrl {
    /// Resolves a `Location`; the authority is returned for absolute ones.
    fn resolve(&self, location: &str) -> Result<(ProbeUrl, Option<String>), LocationError> {
        let lower = location.to_ascii_lowercase();
        let absolute = if lower.starts_with("http://") || lower.starts_with("https://") {
            Some(location.to_string())
        } else if location.starts_with("//") {
            Some(format!(
                "{}:{location}",
                if self.https { "https" } else { "http" }
            ))
        } else {
            None
        };
        if let Some(absolute) = absolute {
            let uri = Uri::from_str(&absolute).map_err(|source| LocationError::Parse {
                location: location.to_string(),
                source,
            })?;
            let https = uri.scheme_str() == Some("https");
            let authority = uri.authority().ok_or_else(|| LocationError::NoHost {
                location: location.to_string(),
            })?;
            let host = authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
            let path = uri
                .path_and_query()
                .map(PathAndQuery::as_str)
                .filter(|p| !p.is_empty())
                .unwrap_or("/")
                .to_string();
            let next = ProbeUrl {
                https,
                host,
                port,
                path,
            };
            return Ok((next, Some(authority.as_str().to_string())));
        }
        let path = if location.starts_with('/') {
            location.to_string()
        } else {
            let current = self.path.split('?').next().unwrap_or_default();
            let dir = current.rfind('/').map_or("/", |i| &current[..=i]);
            format!("{dir}{location}")
        };
        Ok((
            ProbeUrl {
                path,
                ..self.clone()
            },
            None,
        ))
    }
}

// ---------------------------------------------------------------------------
// HTTPS probes

/// A TLS client that accepts any server certificate, as the kubelet's HTTPS
/// probes do (`InsecureSkipVerify`); handshake signatures are still checked.
fn insecure_client_config(http2: bool) -> Result<ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(SkipServerVerification(
            HandshakeSignatures::new(provider),
        )))
        .with_no_client_auth();
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(config)
}

#[derive(Debug)]
struct SkipServerVerification(HandshakeSignatures);

impl ServerCertVerifier for SkipServerVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Mutex;

    use http_body_util::{BodyExt, Full, StreamBody};
    use hyper::Request;
    use hyper::body::{Frame, Incoming};
    use hyper::server::conn::{http1, http2};
    use hyper::service::service_fn;
    use hyper_util::rt::TokioExecutor;
    use prost::Message;
    use rustls::pki_types::PrivateKeyDer;
    use tokio::net::TcpListener;

    use super::super::testing::{Running, WAIT, call, dead_port, fake_http, options, reply, start};
    use super::*;

    // TestAppProbe, TestHttpsAppProbe, TestGRPCAppProbe.

    async fn fake_app() -> u16 {
        fake_http(|parts, peer| {
            let header = |name: &str| {
                parts
                    .headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string()
            };
            let path = parts.uri.path();
            match path {
                "/hello" => reply(200, &[], "welcome, it works"),
                "/redirect" => reply(301, &[("location", "/hello")], ""),
                "/redirect-loop" => reply(301, &[("location", "/redirect-loop")], ""),
                "/remote-redirect" => reply(301, &[("location", "http://example.com/foo")], ""),
                "/relative-redirect" => reply(302, &[("location", "hello")], ""),
                "/header" => {
                    if header("host") == "test.com:9999" && header("some-header") == "some-value" {
                        reply(200, &[], "")
                    } else {
                        reply(400, &[], "")
                    }
                }
                "/host" => reply(200, &[], &header("host")),
                "/connection" => reply(200, &[], &header("connection")),
                "/source" => reply(200, &[], &peer.ip().to_string()),
                "/big" => reply(200, &[], &"x".repeat(3 * MAX_PROBE_BODY)),
                p if p.starts_with("/status/") => {
                    let code: u16 = p["/status/".len()..].parse().unwrap();
                    reply(code, &[("location", "/hello")], "")
                }
                _ => reply(404, &[], ""),
            }
        })
        .await
    }

    /// The probes the configuration parses from `ISTIO_KUBE_APP_PROBERS`
    /// holding these entries.
    fn probers(entries: &[(&str, String)]) -> AppProbes {
        let fields: Vec<String> = entries
            .iter()
            .map(|(path, probe)| format!("{path:?}: {probe}"))
            .collect();
        crate::config::parse_app_probers(&format!("{{{}}}", fields.join(","))).unwrap()
    }

    fn http_get(path: &str, port: u16) -> String {
        format!(r#"{{"httpGet": {{"path": "{path}", "port": {port}}}, "timeoutSeconds": 5}}"#)
    }

    async fn probe(server: &Running, path: &str, headers: &[(&str, &str)]) -> (StatusCode, String) {
        let (status, _, body) = call(server.addr, Method::GET, path, headers).await;
        (status, body)
    }

    #[tokio::test]
    async fn http_probes_pass_the_application_answer_through() {
        let app = fake_app().await;
        let dead = dead_port();
        let paths = [
            "hello",
            "redirect",
            "redirect-loop",
            "remote-redirect",
            "relative-redirect",
            "header",
            "host",
            "connection",
            "source",
            "big",
            "status/503",
            "status/404",
            "status/302",
            "status/304",
            "status/511",
        ];
        let mut entries: Vec<(String, String)> = paths
            .iter()
            .map(|p| {
                let container = p.replace('/', "-");
                (
                    format!("/app-health/{container}/livez"),
                    http_get(&format!("/{p}"), app),
                )
            })
            .collect();
        entries.push(("/app-health/relative/readyz".into(), http_get("hello", app)));
        entries.push((
            "/app-lifecycle/hello/prestopz".into(),
            http_get("/hello", app),
        ));
        entries.push(("/app-health/dead/readyz".into(), http_get("/hello", dead)));
        let entries: Vec<(&str, String)> = entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        let server = start(StatusOptions {
            app_probers: probers(&entries),
            ..options(dead_port())
        })
        .await;

        let ok = (StatusCode::OK, "welcome, it works".to_string());
        assert_eq!(probe(&server, "/app-health/hello/livez", &[]).await, ok);
        assert_eq!(probe(&server, "/app-health/relative/readyz", &[]).await, ok);
        assert_eq!(
            probe(&server, "/app-lifecycle/hello/prestopz", &[]).await,
            ok
        );
        assert_eq!(probe(&server, "/app-health/redirect/livez", &[]).await, ok);
        assert_eq!(
            probe(&server, "/app-health/relative-redirect/livez", &[]).await,
            ok
        );
        assert_eq!(
            probe(&server, "/app-health/status-302/livez", &[]).await,
            ok
        );
        // Redirects elsewhere and unfollowable 3xx count as success, as for the kubelet.
        assert_eq!(
            probe(&server, "/app-health/remote-redirect/livez", &[]).await,
            (StatusCode::OK, String::new())
        );
        assert_eq!(
            probe(&server, "/app-health/status-304/livez", &[]).await.0,
            StatusCode::OK
        );
        assert_eq!(
            probe(&server, "/app-health/redirect-loop/livez", &[])
                .await
                .0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        for (path, code) in [
            ("/app-health/status-503/livez", 503),
            ("/app-health/status-404/livez", 404),
            ("/app-health/status-511/livez", 511),
        ] {
            assert_eq!(probe(&server, path, &[]).await.0.as_u16(), code, "{path}");
        }
        // The kubelet's headers (which carry the probe's httpHeaders) are forwarded.
        assert_eq!(
            probe(
                &server,
                "/app-health/header/livez",
                &[("host", "test.com:9999"), ("some-header", "some-value")]
            )
            .await
            .0,
            StatusCode::OK
        );
        // A Host naming the status port is rewritten to the application's port.
        let status_host = format!("10.1.2.3:{}", server.addr.port());
        assert_eq!(
            probe(&server, "/app-health/host/livez", &[("host", &status_host)]).await,
            (StatusCode::OK, format!("10.1.2.3:{app}"))
        );
        assert_eq!(
            probe(
                &server,
                "/app-health/connection/livez",
                &[("connection", "keep-alive")]
            )
            .await,
            (StatusCode::OK, "close".to_string())
        );
        // Sent from 127.0.0.6, which iptables lets through to the application.
        assert_eq!(
            probe(&server, "/app-health/source/livez", &[]).await,
            (StatusCode::OK, "127.0.0.6".to_string())
        );
        let (status, body) = probe(&server, "/app-health/big/livez", &[]).await;
        assert_eq!((status, body.len()), (StatusCode::OK, MAX_PROBE_BODY));
        assert_eq!(
            probe(&server, "/app-health/dead/readyz", &[]).await.0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(
            probe(&server, "/app-health/unknown/readyz", &[]).await,
            (
                StatusCode::BAD_REQUEST,
                "app prober config does not exists for /app-health/unknown/readyz".to_string()
            )
        );
        assert_eq!(
            probe(&server, "/bad-path-should-be-404", &[]).await.0,
            StatusCode::NOT_FOUND
        );
    }

    #[tokio::test]
    async fn http_probe_times_out() {
        // Accepts and never answers.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let _silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let probe_json =
            format!(r#"{{"httpGet": {{"path": "/", "port": {port}}}, "timeoutSeconds": 1}}"#);
        let server = start(StatusOptions {
            app_probers: probers(&[("/app-health/slow/readyz", probe_json)]),
            ..options(dead_port())
        })
        .await;
        let started = std::time::Instant::now();
        assert_eq!(
            probe(&server, "/app-health/slow/readyz", &[]).await.0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert!(started.elapsed() < WAIT);
    }

    #[tokio::test]
    async fn tcp_probes() {
        let app = fake_app().await;
        let tcp = |port: u16| format!(r#"{{"tcpSocket": {{"port": {port}}}}}"#);
        let json = probers(&[
            ("/app-health/up/livez", tcp(app)),
            ("/app-health/down/livez", tcp(dead_port())),
        ]);
        for instance_ip in ["127.0.0.1", "localhost", ""] {
            let server = start(StatusOptions {
                app_probers: json.clone(),
                instance_ip: instance_ip.to_string(),
                ..options(dead_port())
            })
            .await;
            assert_eq!(
                probe(&server, "/app-health/up/livez", &[]).await.0,
                StatusCode::OK,
                "{instance_ip:?}"
            );
            assert_eq!(
                probe(&server, "/app-health/down/livez", &[]).await.0,
                StatusCode::INTERNAL_SERVER_ERROR
            );
        }
        // Istio's "tcp-livez-wrapped-ipv6": a bracketed INSTANCE_IP cannot be dialled.
        let server = start(StatusOptions {
            app_probers: json,
            instance_ip: "[::1]".to_string(),
            ..options(dead_port())
        })
        .await;
        assert_eq!(
            probe(&server, "/app-health/up/livez", &[]).await.0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    async fn fake_https(alpn: &[&str]) -> u16 {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let cert = certified.cert.der().clone();
        let key = PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
        config.alpn_protocols = alpn.iter().map(|a| a.as_bytes().to_vec()).collect();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
                    let svc = service_fn(|req: Request<Incoming>| async move {
                        let version = format!("{:?}", req.version());
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(version))))
                    });
                    let io = TokioIo::new(tls);
                    if h2 {
                        let _ = http2::Builder::new(TokioExecutor::new())
                            .serve_connection(io, svc)
                            .await;
                    } else {
                        let _ = http1::Builder::new().serve_connection(io, svc).await;
                    }
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn https_probes_negotiate_the_protocol() {
        for (alpn, http2_probing, want) in [
            (&[][..], true, "HTTP/1.1"),
            (&["http/1.1"][..], true, "HTTP/1.1"),
            (&["h2"][..], true, "HTTP/2.0"),
            (&["h2", "http/1.1"][..], true, "HTTP/2.0"),
            (&["h2", "http/1.1"][..], false, "HTTP/1.1"),
        ] {
            let app = fake_https(alpn).await;
            let probe_json = format!(
                r#"{{"httpGet": {{"path": "/hello", "port": {app}, "scheme": "HTTPS"}}, "timeoutSeconds": 5}}"#
            );
            let server = start(StatusOptions {
                app_probers: probers(&[("/app-health/tls/readyz", probe_json)]),
                http2_probing,
                ..options(dead_port())
            })
            .await;
            assert_eq!(
                probe(
                    &server,
                    "/app-health/tls/readyz",
                    &[("host", "127.0.0.1:15020")]
                )
                .await,
                (StatusCode::OK, want.to_string()),
                "{alpn:?} {http2_probing}"
            );
        }
        // No protocol in common: the handshake fails.
        let app = fake_https(&["foo"]).await;
        let probe_json = format!(
            r#"{{"httpGet": {{"path": "/hello", "port": {app}, "scheme": "HTTPS"}}, "timeoutSeconds": 5}}"#
        );
        let server = start(StatusOptions {
            app_probers: probers(&[("/app-health/tls/readyz", probe_json)]),
            ..options(dead_port())
        })
        .await;
        assert_eq!(
            probe(&server, "/app-health/tls/readyz", &[]).await.0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    /// A fake `grpc.health.v1.Health` over h2c: "" and "foo" are SERVING,
    /// "sick" NOT_SERVING, anything else NOT_FOUND.
    async fn fake_grpc_health() -> (u16, Arc<Mutex<Option<String>>>) {
        let user_agent = Arc::new(Mutex::new(None));
        let seen = user_agent.clone();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let seen = seen.clone();
                        async move {
                            *seen.lock().unwrap() = req
                                .headers()
                                .get(header::USER_AGENT)
                                .map(|v| v.to_str().unwrap().to_string());
                            let path = req.uri().path().to_string();
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let (status, grpc_status) = if path == GRPC_HEALTH_CHECK {
                                let request = HealthCheckRequest::decode(&body[5..]).unwrap();
                                match request.service.as_str() {
                                    "" | "foo" => (Some(SERVING), "0"),
                                    "sick" => (Some(2), "0"),
                                    _ => (None, "5"),
                                }
                            } else {
                                (None, "12")
                            };
                            let mut frames = Vec::new();
                            if let Some(status) = status {
                                let message = HealthCheckResponse { status }.encode_to_vec();
                                let mut data = vec![0u8];
                                data.extend_from_slice(&(message.len() as u32).to_be_bytes());
                                data.extend_from_slice(&message);
                                frames.push(Ok::<_, Infallible>(Frame::data(Bytes::from(data))));
                            }
                            let mut trailers = HeaderMap::new();
                            trailers.insert("grpc-status", HeaderValue::from_static(grpc_status));
                            frames.push(Ok(Frame::trailers(trailers)));
                            let mut resp =
                                Response::new(StreamBody::new(futures::stream::iter(frames)));
                            resp.headers_mut().insert(
                                header::CONTENT_TYPE,
                                HeaderValue::from_static("application/grpc"),
                            );
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        (port, user_agent)
    }

    #[tokio::test]
    async fn grpc_probes() {
        let (app, user_agent) = fake_grpc_health().await;
        let grpc = |port: u16, service: &str| {
            format!(r#"{{"gRPC": {{"port": {port}, "service": {service}}}, "timeoutSeconds": 5}}"#)
        };
        let server = start(StatusOptions {
            app_probers: probers(&[
                ("/app-health/default/readyz", grpc(app, "null")),
                ("/app-health/foo/readyz", grpc(app, r#""foo""#)),
                ("/app-health/sick/readyz", grpc(app, r#""sick""#)),
                ("/app-health/missing/readyz", grpc(app, r#""missing""#)),
                ("/app-health/dead/readyz", grpc(dead_port(), r#""foo""#)),
            ]),
            ..options(dead_port())
        })
        .await;
        let kubelet = [("user-agent", "kube-probe/1.30")];
        assert_eq!(
            probe(&server, "/app-health/default/readyz", &kubelet)
                .await
                .0,
            StatusCode::OK
        );
        let ua = user_agent.lock().unwrap().clone().unwrap();
        assert!(ua.starts_with("kube-probe/1.30"), "{ua}");
        assert_eq!(
            probe(&server, "/app-health/foo/readyz", &[]).await.0,
            StatusCode::OK
        );
        for path in [
            "/app-health/sick/readyz",
            "/app-health/missing/readyz",
            "/app-health/dead/readyz",
        ] {
            assert_eq!(
                probe(&server, path, &[]).await.0,
                StatusCode::INTERNAL_SERVER_ERROR,
                "{path}"
            );
        }
    }

    #[test]
    fn resolves_redirects() {
        let url = ProbeUrl {
            https: false,
            host: "10.0.0.1".to_string(),
            port: 8080,
            path: "/a/b?x=1".to_string(),
        };
        let (next, authority) = url.resolve("/c").unwrap();
        assert_eq!((next.path.as_str(), authority), ("/c", None));
        assert_eq!(url.resolve("c").unwrap().0.path, "/a/c");
        let (next, authority) = url.resolve("https://10.0.0.1:9443/d").unwrap();
        assert_eq!(
            next,
            ProbeUrl {
                https: true,
                host: "10.0.0.1".to_string(),
                port: 9443,
                path: "/d".to_string(),
            }
        );
        assert_eq!(authority.as_deref(), Some("10.0.0.1:9443"));
        let (next, _) = url.resolve("//example.com").unwrap();
        assert_eq!(
            (next.host.as_str(), next.port, next.path.as_str()),
            ("example.com", 80, "/")
        );
        assert_eq!(url.resolve("http://[::1]:81/").unwrap().0.host, "::1");
        let err = url.resolve("http://a b/").unwrap_err();
        assert!(
            matches!(&err, LocationError::Parse { location, .. } if location == "http://a b/"),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .starts_with(r#"failed to parse Location header "http://a b/": "#),
            "{err}"
        );
    }
}
