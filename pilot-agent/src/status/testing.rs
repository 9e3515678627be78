//! What the status server's tests share: fake upstreams (Envoy's admin,
//! applications), a running server on an ephemeral port and a client.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::http::request::Parts;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::upstream::{Upstream, send_request};
use super::{DEFAULT_STATUS_PORT, StatusError, StatusOptions, StatusState, serve};
use crate::lifecycle::Lifecycle;

/// Every wait in these tests is bounded by this.
pub(super) const WAIT: Duration = Duration::from_secs(10);

pub(super) const LIVE_STATS: &str = "cluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: 1\nserver.state: 0\nlistener_manager.workers_started: 1";

pub(super) type Handler = dyn Fn(&Parts, SocketAddr) -> Response<Full<Bytes>> + Send + Sync;

/// A fake HTTP/1 server on 127.0.0.1; the handler sees the peer address.
pub(super) async fn fake_http(
    handler: impl Fn(&Parts, SocketAddr) -> Response<Full<Bytes>> + Send + Sync + 'static,
) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let handler: Arc<Handler> = Arc::new(handler);
    tokio::spawn(async move {
        while let Ok((stream, peer)) = listener.accept().await {
            let handler = handler.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let (parts, _) = req.into_parts();
                    let resp = handler(&parts, peer);
                    async move { Ok::<_, Infallible>(resp) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    port
}

pub(super) fn reply(status: u16, headers: &[(&str, &str)], body: &str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap();
    for (k, v) in headers {
        resp.headers_mut().insert(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    resp
}

/// A fake Envoy admin serving `/stats`; `None` answers 503.
pub(super) async fn fake_admin(stats: Option<&str>) -> (u16, Arc<Mutex<Option<String>>>) {
    let shared = Arc::new(Mutex::new(stats.map(str::to_string)));
    let stats = shared.clone();
    let port = fake_http(
        move |parts, _| match (parts.uri.path(), &*stats.lock().unwrap()) {
            ("/stats", Some(body)) => reply(200, &[], body),
            _ => reply(503, &[], ""),
        },
    )
    .await;
    (port, shared)
}

/// A port nothing listens on.
pub(super) fn dead_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

pub(super) fn options(admin_port: u16) -> StatusOptions {
    StatusOptions {
        admin_port,
        instance_ip: "127.0.0.1".to_string(),
        ..StatusOptions::default()
    }
}

pub(super) fn new_state(options: StatusOptions) -> Arc<StatusState> {
    Arc::new(StatusState::new(options, Arc::new(Lifecycle::new())).unwrap())
}

pub(super) struct Running {
    pub(super) addr: SocketAddr,
    pub(super) state: Arc<StatusState>,
    pub(super) stop: oneshot::Sender<()>,
    pub(super) task: tokio::task::JoinHandle<Result<(), StatusError>>,
}

pub(super) async fn start(mut options: StatusOptions) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    options.status_port = addr.port();
    let state = new_state(options);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, state.clone(), stopped));
    Running {
        addr,
        state,
        stop,
        task,
    }
}

pub(super) async fn call(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, String) {
    let mut map = HeaderMap::new();
    let mut authority = addr.to_string();
    for (k, v) in headers {
        if k.eq_ignore_ascii_case("host") {
            authority = v.to_string();
        } else {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
    }
    let upstream = Upstream {
        host: "127.0.0.1",
        port: addr.port(),
        tls: None,
        bind_source: false,
    };
    let resp = tokio::time::timeout(
        WAIT,
        send_request(&upstream, method, path, &authority, &map),
    )
    .await
    .unwrap()
    .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = tokio::time::timeout(WAIT, resp.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    (status, headers, String::from_utf8(body.to_vec()).unwrap())
}

pub(super) async fn get(addr: SocketAddr, path: &str) -> (StatusCode, String) {
    let (status, _, body) = call(addr, Method::GET, path, &[]).await;
    (status, body)
}

pub(super) fn metrics_options(envoy_port: u16, app_ports: &[u16]) -> StatusOptions {
    let annotations = match app_ports {
        [] => None,
        [port] => Some(format!(
            r#"{{"scrape":"true","path":"/metrics","port":"{port}"}}"#
        )),
        ports => Some(format!(
            r#"{{"scrape":"true","targets":[{}]}}"#,
            ports
                .iter()
                .map(|p| format!(r#"{{"port":"{p}","path":"/metrics"}}"#))
                .collect::<Vec<_>>()
                .join(",")
        )),
    };
    // As the configuration parses `ISTIO_PROMETHEUS_ANNOTATIONS` for a sidecar.
    let scrape_targets =
        crate::config::parse_scrape_targets(annotations.as_deref(), DEFAULT_STATUS_PORT, true)
            .unwrap();
    StatusOptions {
        envoy_prometheus_port: envoy_port,
        scrape_targets,
        ..options(dead_port())
    }
}
