//! istiod's debug endpoints (Istio's `pilot/pkg/xds/debug.go`) on the HTTP
//! port: `/debug/syncz` (what `istioctl proxy-status` reads), `/debug/adsz`,
//! `/debug/config_dump?proxyID=`, `/debug/configz`, and `/ready`.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::xds::server::DiscoveryServer;
use crate::xds::statusgen;
use crate::xds::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE, SECRET_TYPE};

/// What the debug handlers read.
#[derive(Clone)]
pub struct DebugState {
    /// The xDS server.
    pub xds: DiscoveryServer,
    /// Whether istiod is ready (sources synced, first push built).
    pub ready: watch::Receiver<bool>,
    /// The current configuration, as JSON, for `/debug/configz`.
    pub configz: Arc<dyn Fn() -> Value + Send + Sync>,
}

/// The HTTP router of `--httpAddr`.
pub fn router(state: DebugState) -> Router {
    Router::new()
        .route("/ready", get(ready))
        .route("/debug/syncz", get(syncz))
        .route("/debug/adsz", get(adsz))
        .route("/debug/config_dump", get(config_dump))
        .route("/debug/configz", get(configz))
        .with_state(state)
}

/// The router as `istio.io/debug` calls it: the body of a GET of a path
/// (Istio's `DebugGen` serving its debug mux in-process).
pub fn mux(router: Router) -> crate::xds::server::DebugMux {
    std::sync::Arc::new(move |path: String| {
        let router = router.clone();
        Box::pin(async move {
            use http_body_util::BodyExt;
            use tower::ServiceExt;
            let Ok(req) = axum::http::Request::get(path.as_str()).body(axum::body::Body::empty())
            else {
                return format!("invalid debug path {path:?}\n").into_bytes();
            };
            let Ok(response) = router.oneshot(req).await;
            match response.into_body().collect().await {
                Ok(b) => b.to_bytes().to_vec(),
                Err(e) => format!("{e}\n").into_bytes(),
            }
        })
    })
}

async fn ready(State(s): State<DebugState>) -> impl IntoResponse {
    if *s.ready.borrow() {
        (StatusCode::OK, "")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "discovery: not ready to serve discovery information\n",
        )
    }
}

#[derive(serde::Deserialize)]
struct NamespaceQuery {
    namespace: Option<String>,
}

/// Istio's `SyncStatus` list, one entry per connected proxy (of
/// `?namespace=` when given), from the same status the
/// `istio.io/debug/syncz` xDS answer is built from.
async fn syncz(State(s): State<DebugState>, Query(q): Query<NamespaceQuery>) -> impl IntoResponse {
    let list: Vec<Value> = statusgen::sync_status(&s.xds, q.namespace.as_deref())
        .into_iter()
        .map(|c| {
            let t = |name: &str| c.types.get(name).cloned().unwrap_or_default();
            let (cds, eds, lds, rds, ecds) = (t("CDS"), t("EDS"), t("LDS"), t("RDS"), t("ECDS"));
            json!({
                "cluster_id": c.proxy.cluster_id,
                "proxy": c.proxy_id,
                "proxy_type": c.proxy.proxy_type,
                "istio_version": c.istio_version,
                "cluster_sent": cds.sent_nonce, "cluster_acked": cds.acked_nonce,
                "endpoint_sent": eds.sent_nonce, "endpoint_acked": eds.acked_nonce,
                "listener_sent": lds.sent_nonce, "listener_acked": lds.acked_nonce,
                "route_sent": rds.sent_nonce, "route_acked": rds.acked_nonce,
                "extensionconfig_sent": ecds.sent_nonce, "extensionconfig_acked": ecds.acked_nonce,
                "cluster_version": cds.sent_version, "listener_version": lds.sent_version,
                "route_version": rds.sent_version, "endpoint_version": eds.sent_version,
                "errors": c.types.iter().filter_map(|(k, v)| v.last_error.as_ref().map(|e| json!({"type": k, "error": e}))).collect::<Vec<_>>(),
            })
        })
        .collect();
    Json(Value::Array(list))
}

async fn adsz(State(s): State<DebugState>) -> impl IntoResponse {
    let conns = s.xds.connections();
    Json(json!({
        "totalClients": conns.len(),
        "clients": conns.iter().map(|c| json!({
            "connectionId": c.connection_id,
            "proxy": c.proxy_id,
            "node": c.node_id,
            "delta": c.delta,
            "connectedAt": c.connected_at,
            "watches": c.types,
        })).collect::<Vec<_>>(),
    }))
}

#[derive(serde::Deserialize)]
struct ProxyQuery {
    #[serde(rename = "proxyID")]
    proxy_id: Option<String>,
}

/// The configuration istiod would send a proxy now, from the same
/// resources as the `istio.io/debug/config_dump` xDS answer: names and
/// sizes per type, load assignments included (Envoy's own `/config_dump`
/// shows the full protos).
async fn config_dump(
    State(s): State<DebugState>,
    Query(q): Query<ProxyQuery>,
) -> impl IntoResponse {
    let Some(id) = q.proxy_id.filter(|id| !id.is_empty()) else {
        return (
            StatusCode::BAD_REQUEST,
            "You must provide a proxyID in the query string\n",
        )
            .into_response();
    };
    let Some(conn) = statusgen::find_connection(&s.xds, &id) else {
        return (
            StatusCode::NOT_FOUND,
            format!("Proxy not connected to this Pilot instance: {id}\n"),
        )
            .into_response();
    };
    let Some(push) = s.xds.current() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "no push context yet\n").into_response();
    };
    let mut out = serde_json::Map::new();
    out.insert("version".into(), json!(push.ctx.version()));
    let dump = statusgen::dump_resources(&push, &conn);
    for (label, t) in [
        ("clusters", CLUSTER_TYPE),
        ("endpoints", ENDPOINT_TYPE),
        ("listeners", LISTENER_TYPE),
        ("routes", ROUTE_TYPE),
        ("secrets", SECRET_TYPE),
    ] {
        let entries: Vec<Value> = dump
            .get(t)
            .into_iter()
            .flatten()
            .map(|r| json!({"name": r.name, "bytes": r.resource.value.len()}))
            .collect();
        out.insert(label.into(), Value::Array(entries));
    }
    Json(Value::Object(out)).into_response()
}

async fn configz(State(s): State<DebugState>) -> impl IntoResponse {
    Json((s.configz)())
}
