//! `admission.k8s.io/v1` AdmissionReview, as the API server sends it to a
//! webhook and reads the answer back
//! (<https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#request>).
//!
//! Only the fields a webhook of istiod reads are typed; the rest of the
//! request is ignored, as a webhook must ignore fields it does not know.

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The only `apiVersion` istiod's webhooks accept (Istio's MutatingWebhookConfiguration
/// lists `admissionReviewVersions: [v1]`; `v1beta1` is long gone from the API).
pub const API_VERSION: &str = "admission.k8s.io/v1";

/// Why a body is not an AdmissionReview istiod can answer.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The body is not JSON, or not an AdmissionReview.
    #[error("could not decode body: {0}")]
    Decode(#[from] serde_json::Error),
    /// The AdmissionReview has another `apiVersion` or `kind`.
    #[error(
        "unsupported AdmissionReview {api_version:?}/{kind:?} (want admission.k8s.io/v1 AdmissionReview)"
    )]
    Version {
        /// The `apiVersion` sent.
        api_version: String,
        /// The `kind` sent.
        kind: String,
    },
    /// The review carries no `request`.
    #[error("AdmissionReview has no request")]
    NoRequest,
}

/// The group, version and kind (or resource) of the object under review.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GroupVersionKind {
    /// The API group (`""` for the core group).
    #[serde(default)]
    pub group: String,
    /// The version.
    #[serde(default)]
    pub version: String,
    /// The kind.
    #[serde(default)]
    pub kind: String,
}

/// The group, version and resource (plural) of the object under review.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GroupVersionResource {
    /// The API group.
    #[serde(default)]
    pub group: String,
    /// The version.
    #[serde(default)]
    pub version: String,
    /// The resource (`pods`, `virtualservices`).
    #[serde(default)]
    pub resource: String,
}

/// `request` of an AdmissionReview.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// Echoed in the response so the API server can match it.
    pub uid: String,
    /// The object's kind.
    #[serde(default)]
    pub kind: GroupVersionKind,
    /// The object's resource.
    #[serde(default)]
    pub resource: GroupVersionResource,
    /// The object's name (empty on CREATE with `generateName`).
    #[serde(default)]
    pub name: String,
    /// The object's namespace (a Pod being created often has none in its metadata).
    #[serde(default)]
    pub namespace: String,
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    #[serde(default)]
    pub operation: String,
    /// The object as it would be stored.
    #[serde(default)]
    pub object: Value,
    /// The object before an UPDATE or DELETE.
    #[serde(default)]
    pub old_object: Value,
    /// Whether nothing will be stored.
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionReview {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    request: Option<AdmissionRequest>,
}

/// Decodes a webhook request body.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest, ReviewError> {
    let review: AdmissionReview = serde_json::from_slice(body)?;
    if review.api_version != API_VERSION || review.kind != "AdmissionReview" {
        return Err(ReviewError::Version {
            api_version: review.api_version,
            kind: review.kind,
        });
    }
    review.request.ok_or(ReviewError::NoRequest)
}

/// A webhook's answer.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    /// The request's uid.
    pub uid: String,
    /// Whether the request is admitted.
    pub allowed: bool,
    /// Why not (shown to the user as `admission webhook "..." denied the request: <message>`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    /// A base64 RFC 6902 JSON patch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// `JSONPatch` when `patch` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<&'static str>,
    /// Warnings shown to the client (kubectl prints them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl AdmissionResponse {
    /// Admits the request unchanged.
    pub fn allow(uid: &str) -> Self {
        Self {
            uid: uid.to_string(),
            allowed: true,
            ..Self::default()
        }
    }

    /// Refuses the request with a message (Istio's `toAdmissionResponse`: a
    /// `Status` carrying only the message).
    pub fn deny(uid: &str, message: impl Into<String>) -> Self {
        Self {
            uid: uid.to_string(),
            allowed: false,
            status: Some(json!({"message": message.into()})),
            ..Self::default()
        }
    }

    /// Admits the request with a JSON patch (omitted when it is empty).
    pub fn patched(uid: &str, ops: &[Value]) -> Self {
        let mut r = Self::allow(uid);
        if !ops.is_empty() {
            let bytes = serde_json::to_vec(ops).unwrap_or_default();
            r.patch = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
            r.patch_type = Some("JSONPatch");
        }
        r
    }

    /// The response as the body of an `admission.k8s.io/v1` AdmissionReview.
    pub fn into_review(self) -> Value {
        json!({
            "apiVersion": API_VERSION,
            "kind": "AdmissionReview",
            "response": self,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_v1_review_and_refuses_others() {
        let body = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "namespace": "default", "operation": "CREATE", "object": {"kind": "Pod"},
                "userInfo": {"username": "x"}}
        });
        let r = parse(body.to_string().as_bytes()).unwrap();
        assert_eq!((r.uid.as_str(), r.kind.kind.as_str()), ("u1", "Pod"));
        let v1beta1 = json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "u"}});
        assert!(matches!(
            parse(v1beta1.to_string().as_bytes()),
            Err(ReviewError::Version { .. })
        ));
        assert!(matches!(parse(b"{"), Err(ReviewError::Decode(_))));
        let none = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
        assert!(matches!(
            parse(none.to_string().as_bytes()),
            Err(ReviewError::NoRequest)
        ));
    }

    #[test]
    fn a_patch_is_base64_json_and_an_empty_one_is_omitted() {
        let ops = vec![json!({"op": "add", "path": "/a", "value": 1})];
        let r = AdmissionResponse::patched("u", &ops).into_review();
        let patch = r["response"]["patch"].as_str().unwrap();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&decoded).unwrap(),
            json!(ops)
        );
        assert_eq!(r["response"]["patchType"], "JSONPatch");
        let r = AdmissionResponse::patched("u", &[]).into_review();
        assert!(r["response"].get("patch").is_none());
        assert_eq!(r["response"]["allowed"], true);
    }
}
