//! Gateway API routes beyond the gateway's HTTPRoute (`gateway_api.rs`),
//! in one mesh per config source (istiod on files, then on Kubernetes: the
//! API stand-in, status read back from the objects as istiod writes it):
//! - a mesh route (GAMMA): an HTTPRoute whose parent is the Service
//!   `httpbin` splits sidecar-to-service traffic from sleep 90/10 between
//!   the Services of httpbin's two versions, within a binomial bound, and
//!   its status says `Accepted`;
//! - a `GRPCRoute` on a Gateway API gateway sends each gRPC method to its
//!   own backend: a client speaking HTTP/2 with prior knowledge calls
//!   `/echo.Echo/A` and `/echo.Echo/B` and sees the backend each reached,
//!   with `grpc-status: 0`.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tests::gateway_api_source::{GatewayApiMesh, Source};
use tests::gateway_pod::GatewaySpec;
use tests::mesh::{HTTPBIN_VIP, http_request};
use tests::netns::Netns;
use tests::wait_for;

const WAIT: Duration = Duration::from_secs(60);

/// The gateway Pod's address on the hub.
const GATEWAY_IP: &str = "198.18.0.23";
/// A client outside the mesh.
const CLIENT_IP: &str = "198.18.0.33";
/// The gRPC backends outside the mesh (Services `grpc-a`, `grpc-b`).
const GRPC_A_IP: &str = "198.18.0.65";
const GRPC_B_IP: &str = "198.18.0.66";
const GRPC_PORT: u16 = 9000;
const GRPC_HOST: &str = "grpc.example.com";

/// The mesh route: sidecars calling httpbin split 90/10 between its
/// versions' Services, and mark the requests (so the test knows the route,
/// not the Service's own balancing, answered).
const MESH_ROUTE: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: httpbin-split, namespace: demo}
spec:
  parentRefs: [{group: "", kind: Service, name: httpbin}]
  rules:
  - filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-route, value: gamma}]}
    backendRefs:
    - {name: httpbin-v1, port: 8000, weight: 90}
    - {name: httpbin-v2, port: 8000, weight: 10}
"#;

const GRPC_GATEWAY: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: ingress, namespace: istio-system}
spec:
  gatewayClassName: istio
  listeners:
  - name: http
    port: 8080
    protocol: HTTP
    allowedRoutes: {namespaces: {from: All}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: echo, namespace: demo}
spec:
  parentRefs: [{name: ingress, namespace: istio-system, sectionName: http}]
  hostnames: [grpc.example.com]
  rules:
  - matches: [{method: {service: echo.Echo, method: A}}]
    backendRefs: [{name: grpc-a, port: 9000}]
  - matches: [{method: {service: echo.Echo, method: B}}]
    backendRefs: [{name: grpc-b, port: 9000}]
"#;

/// The gRPC backends: Services (port named `grpc`, so Envoy speaks HTTP/2
/// to them) whose endpoints are Pods outside the mesh.
const GRPC_BACKENDS: &str = r#"apiVersion: v1
kind: Service
metadata: {name: grpc-a, namespace: demo}
spec:
  clusterIP: 198.19.0.65
  ports: [{name: grpc, port: 9000, targetPort: 9000}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: grpc-a-1, namespace: demo, labels: {kubernetes.io/service-name: grpc-a}}
addressType: IPv4
ports: [{name: grpc, port: 9000, protocol: TCP}]
endpoints:
- addresses: [198.18.0.65]
  conditions: {ready: true}
---
apiVersion: v1
kind: Service
metadata: {name: grpc-b, namespace: demo}
spec:
  clusterIP: 198.19.0.66
  ports: [{name: grpc, port: 9000, targetPort: 9000}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: grpc-b-1, namespace: demo, labels: {kubernetes.io/service-name: grpc-b}}
addressType: IPv4
ports: [{name: grpc, port: 9000, protocol: TCP}]
endpoints:
- addresses: [198.18.0.66]
  conditions: {ready: true}
"#;

fn line<'a>(body: &'a str, key: &str) -> &'a str {
    body.lines().find_map(|l| l.strip_prefix(key)).unwrap_or("")
}

/// Whether httpbin's answer shows the mesh route's header.
fn routed(body: &str) -> bool {
    body.lines()
        .any(|l| l.eq_ignore_ascii_case("header=x-route: gamma"))
}

#[test]
fn gateway_api_routes_on_files() {
    mesh_and_grpc_routes(Source::Files);
}

#[test]
fn gateway_api_routes_on_kubernetes() {
    mesh_and_grpc_routes(Source::Kube);
}

/// One mesh for both routes: the mesh route on sidecars, then the
/// GRPCRoute on a gateway.
fn mesh_and_grpc_routes(source: Source) {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let m = GatewayApiMesh::start(source, tmp.path());
    an_httproute_on_a_service_splits_sidecar_traffic(&m);
    a_grpcroute_sends_each_method_to_its_backend(&m);
}

fn an_httproute_on_a_service_splits_sidecar_traffic(m: &GatewayApiMesh) {
    let mesh = &m.mesh;
    // The sample's own 90/10 VirtualService for httpbin goes, so that only
    // the HTTPRoute can split (the DestinationRule and mTLS stay).
    assert_eq!(
        m.remove_sample_kind("networking.istio.io/v1", "VirtualService"),
        1
    );
    m.apply("versions.yaml", tests::mesh::HTTPBIN_VERSION_SERVICES);
    m.apply("mesh-route.yaml", MESH_ROUTE);

    let sleep = &mesh.pod("sleep-1").ns;
    let httpbin: SocketAddr = format!("{HTTPBIN_VIP}:8000").parse().unwrap();
    let call = || http_request(sleep, httpbin, "httpbin:8000", "/headers");
    wait_for(
        "sleep's sidecar routing httpbin by the HTTPRoute",
        WAIT,
        || matches!(call(), Ok((200, body)) if routed(&body)).then_some(()),
    );

    // n = 200 at p = 0.1: v2's count has mean 20 and a standard deviation
    // of sqrt(200 * 0.1 * 0.9) ~ 4.24; 4 sigma either side holds with
    // overwhelming probability, and a split the route did not make (50/50
    // by the Service, all to one version) falls outside.
    let n = 200u32;
    let (mut v1, mut v2) = (0u32, 0u32);
    for _ in 0..n {
        let (code, body) = call().unwrap();
        assert_eq!(code, 200, "{body}");
        assert!(routed(&body), "every request went by the route: {body}");
        match line(&body, "version=") {
            "v1" => v1 += 1,
            "v2" => v2 += 1,
            other => panic!("unexpected version {other:?}: {body}"),
        }
    }
    let mean = f64::from(n) * 0.1;
    let sigma = (f64::from(n) * 0.1 * 0.9).sqrt();
    let (low, high) = (mean - 4.0 * sigma, mean + 4.0 * sigma);
    assert!(
        (low..=high).contains(&f64::from(v2)),
        "v2's share within 4 sigma of 10% ({low:.1}..={high:.1} of {n}): v1={v1} v2={v2}"
    );

    m.expect_status(
        "HTTPRoute/demo/httpbin-split",
        &["Accepted=True (Accepted)", "ResolvedRefs=True"],
        WAIT,
    );
}

/// What a gRPC call got back.
#[derive(Debug)]
struct GrpcAnswer {
    /// The HTTP status.
    status: u16,
    /// The backend's `x-backend` header.
    backend: Option<String>,
    /// `grpc-status`, from the trailers (or the headers of a
    /// trailers-only answer).
    grpc_status: Option<String>,
    /// The response's data: length-prefixed messages.
    data: Vec<u8>,
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// One unary gRPC call from `ns` over HTTP/2 with prior knowledge (h2c),
/// with an empty message: what came back.
fn grpc_call(
    ns: &Netns,
    addr: SocketAddr,
    authority: &str,
    path: &str,
) -> Result<GrpcAnswer, String> {
    let uri = format!("http://{authority}{path}");
    ns.run(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let call = async move {
                let tcp = tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
                let (mut sender, conn) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                        .await
                        .map_err(|e| format!("handshake: {e}"))?;
                tokio::spawn(conn);
                let request = Request::post(uri)
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
                    .map_err(|e| e.to_string())?;
                let response = sender
                    .send_request(request)
                    .await
                    .map_err(|e| format!("request: {e}"))?;
                let status = response.status().as_u16();
                let backend = header(response.headers(), "x-backend");
                let early_status = header(response.headers(), "grpc-status");
                let body = response
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| format!("body: {e}"))?;
                let grpc_status = body
                    .trailers()
                    .and_then(|t| header(t, "grpc-status"))
                    .or(early_status);
                Ok(GrpcAnswer {
                    status,
                    backend,
                    grpc_status,
                    data: body.to_bytes().to_vec(),
                })
            };
            tokio::time::timeout(Duration::from_secs(10), call)
                .await
                .map_err(|_| "timed out".to_string())?
        })
    })
}

type Frames =
    StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

/// A gRPC backend's answer to any call: an empty message, `x-backend:
/// <name>` and `grpc-status: 0`; a request that is not gRPC gets 415.
async fn grpc_answer(
    req: Request<Incoming>,
    name: &'static str,
) -> Result<Response<Frames>, Infallible> {
    let grpc = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    let path = req.uri().path().to_string();
    // The request's message is read and ignored.
    let _ = req.into_body().collect().await;
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let frames = vec![
        Ok(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]))),
        Ok(Frame::trailers(trailers)),
    ];
    let response = Response::builder()
        .status(if grpc { 200 } else { 415 })
        .header("content-type", "application/grpc")
        .header("x-backend", name)
        .header("x-path", path)
        .body(StreamBody::new(futures::stream::iter(frames)))
        .unwrap();
    Ok(response)
}

/// A minimal h2c gRPC server named `name` on `addr` in `ns`.
fn grpc_backend(ns: &Netns, addr: SocketAddr, name: &'static str) {
    let listener = ns.run(move || std::net::TcpListener::bind(addr).unwrap());
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            for _ in 0..10_000 {
                let Ok((sock, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| grpc_answer(req, name));
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(sock), service)
                        .await;
                });
            }
        });
    });
}

fn a_grpcroute_sends_each_method_to_its_backend(m: &GatewayApiMesh) {
    let mesh = &m.mesh;
    m.apply("grpc-backends.yaml", GRPC_BACKENDS);
    m.apply("gateway-api.yaml", GRPC_GATEWAY);

    let a = mesh.plain_pod(GRPC_A_IP);
    grpc_backend(
        &a.ns,
        format!("{GRPC_A_IP}:{GRPC_PORT}").parse().unwrap(),
        "a",
    );
    let b = mesh.plain_pod(GRPC_B_IP);
    grpc_backend(
        &b.ns,
        format!("{GRPC_B_IP}:{GRPC_PORT}").parse().unwrap(),
        "b",
    );

    // The gateway Pod, labelled as Istio's automated deployment labels it.
    let mut gw = mesh.start_gateway(&GatewaySpec::gateway_api_ingress(GATEWAY_IP));
    let client = mesh.plain_pod(CLIENT_IP);
    let gateway: SocketAddr = format!("{GATEWAY_IP}:8080").parse().unwrap();

    let first = wait_for("/echo.Echo/A through the GRPCRoute", WAIT, || {
        assert!(
            gw.agent.alive(),
            "the gateway's agent exited:\n{}",
            gw.agent.log()
        );
        grpc_call(&client.ns, gateway, GRPC_HOST, "/echo.Echo/A")
            .ok()
            // Until the route is served, Envoy answers itself (a gRPC
            // error in a trailers-only answer): wait for a backend's.
            .filter(|r| r.backend.is_some())
    });
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.backend.as_deref(), Some("a"), "{first:?}");
    assert_eq!(first.grpc_status.as_deref(), Some("0"), "{first:?}");
    assert_eq!(first.data, [0, 0, 0, 0, 0], "one empty message: {first:?}");

    // Each method, several times (new connections each): its own backend.
    for _ in 0..5 {
        for (method, backend) in [("/echo.Echo/A", "a"), ("/echo.Echo/B", "b")] {
            let r = grpc_call(&client.ns, gateway, GRPC_HOST, method).unwrap();
            assert_eq!(r.status, 200, "{method}: {r:?}");
            assert_eq!(r.backend.as_deref(), Some(backend), "{method}: {r:?}");
            assert_eq!(r.grpc_status.as_deref(), Some("0"), "{method}: {r:?}");
        }
    }
    // A method no rule matches reaches no backend: Envoy's 404, which it
    // gives a gRPC caller as grpc-status 12 (UNIMPLEMENTED).
    let r = grpc_call(&client.ns, gateway, GRPC_HOST, "/echo.Echo/C").unwrap();
    assert_eq!(r.backend, None, "{r:?}");
    assert_eq!(r.grpc_status.as_deref(), Some("12"), "{r:?}");

    m.expect_status(
        "GRPCRoute/demo/echo",
        &["Accepted=True (Accepted)", "ResolvedRefs=True"],
        WAIT,
    );
    assert!(gw.agent.alive(), "{}", gw.agent.log());
}
