//! The config validation webhook (`/validate`), as Istio's
//! `pkg/webhooks/validation/server`: an Istio object being created or
//! updated is decoded and validated by exactly the code that reads
//! `--configDir` files and the Kubernetes API, so the webhook refuses what
//! istiod would reject, with the same field-level messages.
//!
//! - CREATE and UPDATE are validated; other operations are admitted.
//! - An object labelled `istio.io/rev` for another revision is admitted
//!   unchecked (its own control plane validates it).
//! - An object of one of Istio's groups that this istiod does not apply yet
//!   is admitted with a warning saying so: it is stored, but nothing
//!   enforces it, and the user must know.
//! - A type outside Istio's groups is refused as `unrecognized type`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use common::metrics::{MetricsError, counter_vec};
use prometheus::{IntCounterVec, Registry};
use serde_json::Value;

use super::review::{self, AdmissionRequest, AdmissionResponse};
use crate::model::{DecodeError, Decoded};

/// The API groups whose objects Istio's validation webhook checks.
const ISTIO_GROUPS: [&str; 4] = [
    "networking.istio.io",
    "security.istio.io",
    "telemetry.istio.io",
    "extensions.istio.io",
];

/// Istio's `galley_validation_*` metrics.
#[derive(Clone)]
pub struct ValidationMetrics {
    passed: IntCounterVec,
    failed: IntCounterVec,
    http_error: IntCounterVec,
}

impl ValidationMetrics {
    /// Registers the metrics in `registry`.
    pub fn new(registry: &Registry) -> Result<Self, MetricsError> {
        Ok(Self {
            passed: counter_vec(
                registry,
                "galley_validation_passed",
                "Resource is valid.",
                &["group", "version", "resource"],
            )?,
            failed: counter_vec(
                registry,
                "galley_validation_failed",
                "Resource validation failed.",
                &["group", "version", "resource", "reason"],
            )?,
            http_error: counter_vec(
                registry,
                "galley_validation_http_error",
                "Resource validation http serve errors.",
                &["status"],
            )?,
        })
    }
}

/// The validation webhook's state.
pub struct Validator {
    revision: String,
    metrics: ValidationMetrics,
}

/// Istio's failure reasons (`reason` label of `galley_validation_failed`).
mod reason {
    pub const UNKNOWN_TYPE: &str = "unknown_type";
    pub const INVALID_CONFIG: &str = "invalid_config";
    pub const YAML_DECODE: &str = "yaml_decode_error";
}

impl Validator {
    /// A validator for `revision` (`default` for the default revision).
    pub fn new(revision: &str, metrics: ValidationMetrics) -> Self {
        Self {
            revision: revision.to_string(),
            metrics,
        }
    }

    /// Answers one admission request.
    pub fn validate(&self, req: &AdmissionRequest) -> AdmissionResponse {
        if req.operation != "CREATE" && req.operation != "UPDATE" {
            return AdmissionResponse::allow(&req.uid);
        }
        let labels = [
            req.kind.group.as_str(),
            req.kind.version.as_str(),
            req.resource.resource.as_str(),
        ];
        let fail = |why: &str, message: String| {
            self.metrics
                .failed
                .with_label_values(&[labels[0], labels[1], labels[2], why])
                .inc();
            AdmissionResponse::deny(&req.uid, message)
        };
        let object = &req.object;
        let (api_version, kind) = (
            object
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default(),
            object
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default(),
        );
        let group = api_version.split_once('/').map(|(g, _)| g).unwrap_or("");
        if !ISTIO_GROUPS.contains(&group) {
            return fail(
                reason::UNKNOWN_TYPE,
                format!("unrecognized type {api_version}, Kind={kind}"),
            );
        }
        let rev = object
            .pointer("/metadata/labels/istio.io~1rev")
            .and_then(Value::as_str)
            .unwrap_or("default");
        if rev != self.revision {
            return AdmissionResponse::allow(&req.uid);
        }
        match crate::model::decode(object.clone()) {
            Ok(Decoded::Object(_)) => {
                self.metrics.passed.with_label_values(&labels).inc();
                AdmissionResponse::allow(&req.uid)
            }
            Ok(Decoded::Ignored { api_version, kind }) => {
                self.metrics.passed.with_label_values(&labels).inc();
                let mut r = AdmissionResponse::allow(&req.uid);
                r.warnings.push(format!(
                    "{kind} ({api_version}) is not applied by this istiod: it is stored, but nothing in the mesh enforces it"
                ));
                r
            }
            Ok(Decoded::Empty) => fail(reason::YAML_DECODE, "the object is empty".into()),
            Err(DecodeError::Document(message)) => fail(reason::YAML_DECODE, message),
            Err(DecodeError::Object { key, errors }) => {
                let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
                fail(
                    reason::INVALID_CONFIG,
                    format!("configuration is invalid: {key}: {}", list.join("; ")),
                )
            }
        }
    }
}

/// Checks what every admission webhook request must be before decoding:
/// a body, JSON. Istio answers these with plain HTTP errors.
pub(super) fn check_request(headers: &HeaderMap, body: &[u8]) -> Result<(), (StatusCode, String)> {
    if body.is_empty() {
        return Err((StatusCode::BAD_REQUEST, "no body found".into()));
    }
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.split(';')
                .next()
                .is_some_and(|m| m.trim() == "application/json")
        });
    if !json {
        return Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid Content-Type, want `application/json`".into(),
        ));
    }
    Ok(())
}

/// `POST /validate`.
pub async fn serve(State(v): State<Arc<Validator>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err((status, message)) = check_request(&headers, &body) {
        v.metrics
            .http_error
            .with_label_values(&[status.as_str()])
            .inc();
        return (status, message).into_response();
    }
    let response = match review::parse(&body) {
        Ok(req) => v.validate(&req),
        Err(e) => {
            v.metrics
                .failed
                .with_label_values(&["", "", "", reason::YAML_DECODE])
                .inc();
            AdmissionResponse::deny("", format!("failed to decode object: {e}"))
        }
    };
    axum::Json(response.into_review()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(object: Value, operation: &str) -> AdmissionRequest {
        serde_json::from_value(json!({
            "uid": "u", "operation": operation, "object": object,
            "kind": {"group": "networking.istio.io", "version": "v1", "kind": "VirtualService"},
            "resource": {"group": "networking.istio.io", "version": "v1", "resource": "virtualservices"},
        }))
        .unwrap()
    }

    fn validator() -> Validator {
        Validator::new("default", ValidationMetrics::new(&Registry::new()).unwrap())
    }

    fn vs(weight: i64) -> Value {
        json!({
            "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "r", "namespace": "default"},
            "spec": {"hosts": ["a"], "http": [{"route": [
                {"destination": {"host": "a"}, "weight": weight},
                {"destination": {"host": "b"}, "weight": 100 - weight}]}]}
        })
    }

    #[test]
    fn a_bad_weight_is_refused_naming_the_field() {
        let r = validator().validate(&request(vs(150), "CREATE"));
        assert!(!r.allowed);
        let message = r.status.unwrap()["message"].as_str().unwrap().to_string();
        assert!(
            message.starts_with("configuration is invalid: VirtualService/default/r: "),
            "{message}"
        );
        assert!(
            message.contains("spec.http[0].route[0].weight"),
            "{message}"
        );
        assert!(validator().validate(&request(vs(30), "CREATE")).allowed);
    }

    #[test]
    fn deletes_other_revisions_and_unapplied_kinds() {
        assert!(validator().validate(&request(vs(150), "DELETE")).allowed);
        let mut other = vs(150);
        other["metadata"]["labels"] = json!({"istio.io/rev": "canary"});
        assert!(validator().validate(&request(other, "CREATE")).allowed);
        let gw = json!({"apiVersion": "extensions.istio.io/v1alpha1", "kind": "WasmPlugin",
            "metadata": {"name": "g"}, "spec": {}});
        let r = validator().validate(&request(gw, "CREATE"));
        assert!(r.allowed);
        assert!(r.warnings[0].contains("not applied"), "{:?}", r.warnings);
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
        let r = validator().validate(&request(pod, "CREATE"));
        assert_eq!(
            r.status.unwrap()["message"],
            "unrecognized type v1, Kind=Pod"
        );
    }
}
