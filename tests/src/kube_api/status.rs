//! The API's failure answer: a `meta/v1` `Status` object with the HTTP code,
//! the machine-readable `reason` and the message the API server writes for
//! each kind of failure.

use serde_json::{Value, json};

use super::resources::Resource;

/// A failed request, as the API server reports it in a `Status` object
/// (also the `object` of a watch `ERROR` event).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct Status {
    /// The HTTP status code (`404`, `409`, `410`, ...).
    pub code: u16,
    /// The `reason` (`NotFound`, `AlreadyExists`, `Conflict`, `Expired`, ...).
    pub reason: &'static str,
    /// The human-readable message.
    pub message: String,
    /// `details`: the object's name, group and resource, where there is one.
    pub details: Option<Value>,
}

impl Status {
    fn new(code: u16, reason: &'static str, message: String) -> Status {
        Status {
            code,
            reason,
            message,
            details: None,
        }
    }

    fn with_object(mut self, res: &Resource, name: &str) -> Status {
        let mut d = json!({"name": name, "kind": res.plural});
        if !res.group.is_empty() {
            d["group"] = json!(res.group);
        }
        self.details = Some(d);
        self
    }

    /// 404 for a missing object: `services "x" not found`.
    pub fn not_found(res: &Resource, name: &str) -> Status {
        Status::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", res.qualified()),
        )
        .with_object(res, name)
    }

    /// 404 for a path that names no resource the server serves.
    pub fn no_route(path: &str) -> Status {
        Status::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 409 `AlreadyExists` for a create of an existing name.
    pub fn already_exists(res: &Resource, name: &str) -> Status {
        Status::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", res.qualified()),
        )
        .with_object(res, name)
    }

    /// 409 `Conflict` for a write whose resourceVersion (or uid) precondition
    /// no longer holds.
    pub fn conflict(res: &Resource, name: &str) -> Status {
        Status::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                res.qualified()
            ),
        )
        .with_object(res, name)
    }

    /// 410 `Expired`: a watch or exact list from a resourceVersion older
    /// than the kept history.
    pub fn expired(requested: u64, oldest: u64) -> Status {
        Status::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// 410 `Expired` for a continue token whose snapshot was compacted.
    pub fn continue_expired() -> Status {
        Status::new(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.".to_string(),
        )
    }

    /// 400 `BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Status {
        Status::new(400, "BadRequest", message.into())
    }

    /// 422 `Invalid` for the object `kind "name"`.
    pub fn invalid(kind: &str, name: &str, cause: impl Into<String>) -> Status {
        Status::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {}", cause.into()),
        )
    }

    /// 405 `MethodNotAllowed`: the resource does not support the verb.
    pub fn method_not_allowed(verb: &str, res: &str) -> Status {
        Status::new(
            405,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource ({verb} {res})"
            ),
        )
    }

    /// 415 `UnsupportedMediaType` for a patch or body type not served.
    pub fn unsupported_media_type(content_type: &str) -> Status {
        Status::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {content_type:?})"
            ),
        )
    }

    /// 504 `Timeout` for a resourceVersion newer than the server's.
    pub fn too_large_resource_version(requested: u64, current: u64) -> Status {
        let mut s = Status::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        );
        s.details = Some(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1
        }));
        s
    }

    /// 500 `InternalError`, as the API reports a webhook it could not call
    /// (or whose patch it could not apply): `Internal error occurred: ...`.
    pub fn internal(message: impl Into<String>) -> Status {
        let message = message.into();
        let mut s = Status::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
        );
        s.details = Some(json!({"causes": [{"message": message}]}));
        s
    }

    /// The rejection of a request by admission webhook `webhook`, from the
    /// `status` it answered (absent: none), as the API server builds it: a
    /// code below 400 becomes 400, the message is prefixed with
    /// `admission webhook "<name>" denied the request`.
    pub fn denied(webhook: &str, result: Option<&Value>) -> Status {
        let result = result.cloned().unwrap_or(Value::Null);
        let code = result
            .get("code")
            .and_then(Value::as_u64)
            .and_then(|c| u16::try_from(c).ok())
            .filter(|c| *c >= 400)
            .unwrap_or(400);
        let reason = result.get("reason").and_then(Value::as_str).unwrap_or("");
        let message = result.get("message").and_then(Value::as_str).unwrap_or("");
        let denied_by = format!("admission webhook {webhook:?} denied the request");
        let message = if !message.is_empty() {
            format!("{denied_by}: {message}")
        } else if !reason.is_empty() {
            format!("{denied_by}: {reason}")
        } else {
            format!("{denied_by} without explanation")
        };
        let mut s = Status::new(code, known_reason(reason), message);
        s.details = result.get("details").cloned();
        s
    }

    /// The `Status` object as the API server writes it.
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        // As Go's `omitempty`: a webhook's rejection may carry no reason.
        if !self.reason.is_empty() {
            v["reason"] = json!(self.reason);
        }
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

/// `reason` as one of the API's `StatusReason` values; any other (a
/// webhook may answer anything) is dropped.
fn known_reason(reason: &str) -> &'static str {
    const REASONS: &[&str] = &[
        "Unauthorized",
        "Forbidden",
        "NotFound",
        "AlreadyExists",
        "Conflict",
        "Gone",
        "Invalid",
        "ServerTimeout",
        "StoreReadError",
        "Timeout",
        "TooManyRequests",
        "BadRequest",
        "MethodNotAllowed",
        "NotAcceptable",
        "RequestEntityTooLarge",
        "UnsupportedMediaType",
        "InternalError",
        "Expired",
        "ServiceUnavailable",
    ];
    REASONS
        .iter()
        .find(|r| **r == reason)
        .copied()
        .unwrap_or("")
}
