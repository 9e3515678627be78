//! Rewriting the application's HTTP/TCP/gRPC probes and lifecycle hooks to the agent's status
//! port (`/app-health/<container>/{livez,readyz,startupz}`, `/app-lifecycle/...`), with the
//! original targets handed to the agent in `ISTIO_KUBE_APP_PROBERS` (Istio's `applyRewrite`).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::PROXY_CONTAINER;

/// Rewrites the probes of every app container in `spec` to `status_port` and returns the
/// `ISTIO_KUBE_APP_PROBERS` value, or `None` when nothing was rewritten.
pub(crate) fn rewrite(spec: &mut Value, status_port: i64) -> Option<String> {
    let mut probers: BTreeMap<String, String> = BTreeMap::new();
    for list in ["containers", "initContainers"] {
        let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in containers.iter_mut() {
            // Of the init containers, only native sidecars keep running and get probed.
            if list == "initContainers"
                && c.get("restartPolicy").and_then(Value::as_str) != Some("Always")
            {
                continue;
            }
            let name = c
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            if name == PROXY_CONTAINER {
                continue;
            }
            let ports = c.get("ports").cloned().unwrap_or(Value::Null);
            for (field, suffix) in [
                ("livenessProbe", "livez"),
                ("readinessProbe", "readyz"),
                ("startupProbe", "startupz"),
            ] {
                let path = format!("/app-health/{name}/{suffix}");
                if let Some(probe) = c.get_mut(field)
                    && let Some(prober) = convert(probe, &path, status_port, &ports)
                {
                    probers.insert(path, prober);
                }
            }
            if let Some(lc) = c.get_mut("lifecycle") {
                for (field, suffix) in [("postStart", "poststartz"), ("preStop", "prestopz")] {
                    let path = format!("/app-lifecycle/{name}/{suffix}");
                    if let Some(handler) = lc.get_mut(field)
                        && let Some(prober) = convert(handler, &path, status_port, &ports)
                    {
                        probers.insert(path, prober);
                    }
                }
            }
        }
    }
    if probers.is_empty() {
        return None;
    }
    let body: Vec<String> = probers
        .iter()
        .map(|(k, v)| format!("{}:{v}", json!(k)))
        .collect();
    Some(format!("{{{}}}", body.join(",")))
}

/// Resolves a named port against the container's ports.
fn resolve_port(port: &Value, ports: &Value) -> Option<Value> {
    match port {
        Value::Number(_) => Some(port.clone()),
        Value::String(s) => {
            if let Ok(n) = s.parse::<i64>() {
                return Some(json!(n));
            }
            ports.as_array()?.iter().find_map(|p| {
                (p.get("name").and_then(Value::as_str) == Some(s.as_str()))
                    .then(|| p.get("containerPort").cloned())
                    .flatten()
            })
        }
        _ => None,
    }
}

/// Rewrites one probe or lifecycle handler in place; returns the agent's prober JSON
/// (Istio's `Prober`, Go field order) for it.
fn convert(probe: &mut Value, path: &str, status_port: i64, ports: &Value) -> Option<String> {
    let obj = probe.as_object_mut()?;
    let timeout = obj
        .get("timeoutSeconds")
        .and_then(Value::as_i64)
        .filter(|t| *t != 0);
    let prober = if let Some(http) = obj.get_mut("httpGet").and_then(Value::as_object_mut) {
        let port = resolve_port(http.get("port")?, ports)?;
        let mut fields = Vec::new();
        if let Some(p) = http.get("path").filter(|p| p.as_str() != Some("")) {
            fields.push(format!("\"path\":{p}"));
        }
        fields.push(format!("\"port\":{port}"));
        for key in ["host", "scheme", "httpHeaders"] {
            if let Some(v) = http
                .get(key)
                .filter(|v| !v.is_null() && v.as_str() != Some(""))
            {
                fields.push(format!("{}:{v}", json!(key)));
            }
        }
        http.insert("path".into(), json!(path));
        http.insert("port".into(), json!(status_port));
        if http.get("scheme").and_then(Value::as_str) == Some("HTTPS") {
            http.insert("scheme".into(), json!("HTTP"));
        }
        format!("\"httpGet\":{{{}}}", fields.join(","))
    } else if let Some(tcp) = obj.get("tcpSocket").and_then(Value::as_object) {
        let port = resolve_port(tcp.get("port")?, ports)?;
        let mut s = format!("\"tcpSocket\":{{\"port\":{port}");
        if let Some(h) = tcp
            .get("host")
            .filter(|h| h.as_str().is_some_and(|s| !s.is_empty()))
        {
            s.push_str(&format!(",\"host\":{h}"));
        }
        s.push('}');
        obj.remove("tcpSocket");
        obj.insert("httpGet".into(), json!({"path": path, "port": status_port}));
        s
    } else if let Some(grpc) = obj.get("grpc").and_then(Value::as_object) {
        let mut s = format!("\"grpc\":{{\"port\":{}", grpc.get("port")?);
        if let Some(svc) = grpc.get("service").filter(|v| !v.is_null()) {
            s.push_str(&format!(",\"service\":{svc}"));
        }
        s.push('}');
        obj.remove("grpc");
        obj.insert("httpGet".into(), json!({"path": path, "port": status_port}));
        s
    } else {
        return None;
    };
    Some(match timeout {
        Some(t) => format!("{{{prober},\"timeoutSeconds\":{t}}}"),
        None => format!("{{{prober}}}"),
    })
}
