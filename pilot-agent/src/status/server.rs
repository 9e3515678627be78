//! The status server itself: hyper's HTTP/1 server on `:15020` and its
//! routes, as Istio's `server.go` muxes them. Each route hands over to the
//! room that does the work: readiness to [`StatusState::check_ready`],
//! metrics to the merger, probes to the probers, drain and quit to the
//! [`Lifecycle`].

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::{Body, StatusError, StatusState, empty, full, prober, text};
use crate::lifecycle::Lifecycle;

/// The readiness path.
pub const READY_PATH: &str = "/healthz/ready";
/// The path that makes the agent exit.
pub const QUIT_PATH: &str = "/quitquitquit";
/// The path that starts draining Envoy's listeners.
pub const DRAIN_PATH: &str = "/drain";

/// How long open connections may finish their request after shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Serves the status endpoints on `listener` until `shutdown` completes, then
/// stops accepting, lets open requests finish (up to 5 s) and returns.
///
/// Istio closes the status port when the agent terminates, so the kubelet's
/// probes through Envoy fail; pass `async move { lifecycle.terminated().await }`
/// as `shutdown` to do the same. Transient accept errors (e.g. out of file
/// descriptors) are retried with backoff; any other is returned, and the
/// agent should then terminate since it can never become ready.
pub async fn serve(
    listener: TcpListener,
    state: Arc<StatusState>,
    shutdown: impl Future,
) -> Result<(), StatusError> {
    let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
    tracing::info!(target: "status", "Opening status port {port}");
    let (stop, stopped) = watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut backoff = Duration::ZERO;
    tokio::pin!(shutdown);
    let result = loop {
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, remote)) => {
                    backoff = Duration::ZERO;
                    connections.spawn(serve_connection(stream, remote, state.clone(), stopped.clone()));
                }
                Err(e) if is_transient_accept_error(&e) => {
                    // Go's http.Serve backoff.
                    backoff = (backoff * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
                    tracing::warn!(target: "status", "status server: accept error: {e}; retrying in {backoff:?}");
                    tokio::time::sleep(backoff).await;
                }
                Err(e) => {
                    tracing::error!(target: "status", "status server: accept failed: {e}");
                    break Err(StatusError::Accept(e));
                }
            },
        }
    };
    drop(listener);
    stop.send_replace(true);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(target: "status", "closing {} status connections still busy after {SHUTDOWN_GRACE:?}", connections.len());
        connections.abort_all();
    }
    tracing::info!(target: "status", "Status server has successfully terminated");
    result
}

fn is_transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::TimedOut
            | io::ErrorKind::OutOfMemory
    ) || matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EPROTO)
    )
}

async fn serve_connection(
    stream: TcpStream,
    remote: SocketAddr,
    state: Arc<StatusState>,
    mut stopped: watch::Receiver<bool>,
) {
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(route(&state, req, remote).await) }
    });
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    // The watch guard must not live across the awaits below.
    let stop = async move {
        let _ = stopped.wait_for(|v| *v).await;
    };
    tokio::select! {
        res = conn.as_mut() => {
            if let Err(e) = res {
                tracing::debug!(target: "status", "status connection from {remote}: {e}");
            }
        }
        () = stop => {
            conn.as_mut().graceful_shutdown();
            if let Err(e) = conn.await {
                tracing::debug!(target: "status", "status connection from {remote}: {e}");
            }
        }
    }
}

/// Dispatches one request. The body is never read: every endpoint is a GET
/// or an empty POST.
async fn route<B>(state: &Arc<StatusState>, req: Request<B>, remote: SocketAddr) -> Response<Body> {
    let (parts, body) = req.into_parts();
    drop(body);
    let path = parts.uri.path();
    match path {
        READY_PATH => handle_ready(state).await,
        "/metrics" | "/stats/prometheus" => {
            if state.options.metrics_localhost_only && !is_localhost(remote) {
                return forbidden();
            }
            state.merger.handle(&parts).await
        }
        QUIT_PATH => handle_quit(&state.lifecycle, &parts.method, remote),
        DRAIN_PATH => handle_drain(&state.lifecycle, &parts.method, remote),
        p if prober::is_probe_path(p) => state.probers.handle(p, &parts.headers).await,
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

/// Loopback, including IPv4-mapped IPv6 loopback (as Go's `IsLoopback`).
fn is_localhost(remote: SocketAddr) -> bool {
    remote.ip().to_canonical().is_loopback()
}

fn forbidden() -> Response<Body> {
    text(
        StatusCode::FORBIDDEN,
        "Only requests from localhost are allowed\n",
    )
}

async fn handle_ready(state: &StatusState) -> Response<Body> {
    match state.check_ready().await {
        Ok(()) => {
            if !state.last_probe_successful.swap(true, Ordering::AcqRel) {
                tracing::info!(target: "status", "Envoy proxy is ready");
            }
            empty(StatusCode::OK)
        }
        Err(e) => {
            state.last_probe_successful.store(false, Ordering::Release);
            tracing::warn!(target: "status", "Envoy proxy is NOT ready: {e}");
            text(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
    }
}

fn handle_quit(lifecycle: &Lifecycle, method: &Method, remote: SocketAddr) -> Response<Body> {
    if !is_localhost(remote) {
        return forbidden();
    }
    if *method != Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n");
    }
    tracing::info!(target: "status", "handling {QUIT_PATH}, notifying pilot-agent to exit");
    lifecycle.request_quit();
    full(StatusCode::OK, "OK")
}

fn handle_drain(lifecycle: &Lifecycle, method: &Method, remote: SocketAddr) -> Response<Body> {
    if !is_localhost(remote) {
        return forbidden();
    }
    if *method != Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n");
    }
    tracing::info!(target: "status", "handling {DRAIN_PATH}, starting drain");
    lifecycle.request_drain();
    full(StatusCode::OK, "OK")
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;

    use super::super::StatusOptions;
    use super::super::testing::{
        LIVE_STATS, WAIT, call, dead_port, fake_admin, get, metrics_options, new_state, options,
        start,
    };
    use super::*;

    #[tokio::test]
    async fn ready_endpoint_answers_503_with_the_reason_then_200() {
        let (port, stats) = fake_admin(Some("")).await;
        let server = start(options(port)).await;
        let (status, body) = get(server.addr, READY_PATH).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body.starts_with("config not received from XDS server"),
            "{body}"
        );

        *stats.lock().unwrap() = Some(LIVE_STATS.to_string());
        assert_eq!(get(server.addr, READY_PATH).await.0, StatusCode::OK);

        // Extra conditions are AND-ed after Envoy's, with their own message.
        let guard = server
            .state
            .lifecycle()
            .readiness_pending("waiting for the first NDS push");
        assert_eq!(
            get(server.addr, READY_PATH).await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "waiting for the first NDS push".to_string()
            )
        );
        guard.ready();
        assert_eq!(get(server.addr, READY_PATH).await.0, StatusCode::OK);

        let dns_ready = Arc::new(AtomicBool::new(false));
        let flag = dns_ready.clone();
        server
            .state
            .lifecycle()
            .add_readiness_check("dns", move || {
                if flag.load(Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err(
                        "istio DNS capture is turned ON and DNS lookup table is not ready yet"
                            .into(),
                    )
                }
            });
        assert_eq!(
            get(server.addr, READY_PATH).await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "istio DNS capture is turned ON and DNS lookup table is not ready yet".to_string()
            )
        );
        dns_ready.store(true, Ordering::SeqCst);
        assert_eq!(get(server.addr, READY_PATH).await.0, StatusCode::OK);

        server
            .state
            .lifecycle()
            .terminate("received signal: terminated");
        assert_eq!(
            get(server.addr, READY_PATH).await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "server is terminated: received signal: terminated".to_string()
            )
        );
    }

    #[tokio::test]
    async fn metrics_localhost_only() {
        let state = new_state(StatusOptions {
            metrics_localhost_only: true,
            ..metrics_options(dead_port(), &[])
        });
        let req = Request::get("/stats/prometheus")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = route(&state, req, "10.0.0.1:5555".parse().unwrap()).await;
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    }

    // TestHandleQuit.

    #[tokio::test]
    async fn quit_and_drain_from_localhost() {
        let server = start(StatusOptions {
            envoy: false,
            ..options(dead_port())
        })
        .await;
        let state = server.state.lifecycle();
        for path in [QUIT_PATH, DRAIN_PATH] {
            let (status, _, body) = call(server.addr, Method::GET, path, &[]).await;
            assert_eq!(
                (status, body.as_str()),
                (StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n")
            );
        }
        assert!(!state.skip_drain());
        assert_eq!(state.termination_cause(), None);

        let (status, _, body) = call(server.addr, Method::POST, DRAIN_PATH, &[]).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "OK"));
        tokio::time::timeout(WAIT, state.drain_requested())
            .await
            .unwrap();
        assert!(state.is_drain_requested() && state.skip_drain());
        assert!(!state.is_quit_requested());
        assert_eq!(
            state.termination_cause(),
            None,
            "draining does not terminate"
        );

        let (status, _, body) = call(server.addr, Method::POST, QUIT_PATH, &[]).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "OK"));
        tokio::time::timeout(WAIT, state.quit_requested())
            .await
            .unwrap();
        assert!(state.is_quit_requested());
        let cause = tokio::time::timeout(WAIT, state.terminated())
            .await
            .unwrap();
        assert_eq!(cause, "/quitquitquit called");
    }

    #[tokio::test]
    async fn quit_and_drain_refuse_other_hosts() {
        let state = new_state(options(dead_port()));
        for path in [QUIT_PATH, DRAIN_PATH] {
            let post = || Request::post(path).body(Empty::<Bytes>::new()).unwrap();
            let resp = route(&state, post(), "10.1.2.3:4567".parse().unwrap()).await;
            assert_eq!(resp.status(), StatusCode::FORBIDDEN);
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"Only requests from localhost are allowed\n");
            assert!(!state.lifecycle().skip_drain());
            // Even a GET from elsewhere is refused before the method is checked.
            let get = Request::get(path).body(Empty::<Bytes>::new()).unwrap();
            let resp = route(&state, get, "10.1.2.3:4567".parse().unwrap()).await;
            assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        }
        let resp = route(
            &state,
            Request::post(DRAIN_PATH)
                .body(Empty::<Bytes>::new())
                .unwrap(),
            "[::1]:1".parse().unwrap(),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let resp = route(
            &state,
            Request::post(QUIT_PATH)
                .body(Empty::<Bytes>::new())
                .unwrap(),
            "[::ffff:127.0.0.1]:1".parse().unwrap(),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(state.lifecycle().is_quit_requested());
    }

    #[tokio::test]
    async fn serve_stops_when_shutdown_completes() {
        let server = start(options(dead_port())).await;
        assert_eq!(get(server.addr, "/nope").await.0, StatusCode::NOT_FOUND);
        server.stop.send(()).unwrap();
        let result = tokio::time::timeout(WAIT, server.task)
            .await
            .unwrap()
            .unwrap();
        assert!(result.is_ok());
        assert!(
            TcpStream::connect(server.addr).await.is_err(),
            "the port is closed"
        );
    }
}
