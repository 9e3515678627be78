//! Kubernetes `networking.k8s.io/v1` Ingress and IngressClass as istiod
//! reads them: the types of the objects, below the object vocabulary
//! (`meta.rs`) that names them; their translation is the parent's.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The annotation naming an Ingress's class (deprecated by Kubernetes, still
/// read first by Istio).
pub const CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
/// The mesh's default `ingressClass`.
pub const ISTIO_CLASS: &str = "istio";
/// A `networking.k8s.io/v1` Ingress (its `spec`; `status` is not read).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Ingress {
    /// The spec.
    pub spec: IngressSpec,
}

/// `Ingress.spec`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IngressSpec {
    /// The IngressClass serving it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingress_class_name: Option<String>,
    /// The backend for requests no rule matches (Istio does not route it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_backend: Option<IngressBackend>,
    /// TLS termination on 443.
    pub tls: Vec<IngressTls>,
    /// Host rules.
    pub rules: Vec<IngressRule>,
}

/// `Ingress.spec.tls[]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IngressTls {
    /// Hosts of the certificate (`*` when empty).
    pub hosts: Vec<String>,
    /// The Secret with `tls.crt` and `tls.key`, in the gateway's namespace.
    pub secret_name: String,
}

/// `Ingress.spec.rules[]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IngressRule {
    /// The host (every host when empty).
    pub host: String,
    /// The paths; a rule without them routes nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpIngressRuleValue>,
}

/// `Ingress.spec.rules[].http`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpIngressRuleValue {
    /// Paths, each to a backend.
    pub paths: Vec<HttpIngressPath>,
}

/// `Ingress.spec.rules[].http.paths[]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpIngressPath {
    /// The path.
    pub path: String,
    /// `Exact`, `Prefix` or `ImplementationSpecific`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_type: Option<String>,
    /// Where matching requests go.
    pub backend: IngressBackend,
}

/// An Ingress backend.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IngressBackend {
    /// A Service of the Ingress's namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<IngressServiceBackend>,
    /// Another kind of object (Istio does not route to it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<serde_json::Value>,
}

/// `IngressBackend.service`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IngressServiceBackend {
    /// The Service's name.
    pub name: String,
    /// Its port, by number or name.
    pub port: ServiceBackendPort,
}

/// `IngressServiceBackend.port`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceBackendPort {
    /// The port's name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The port's number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub number: Option<u32>,
}

/// A `networking.k8s.io/v1` IngressClass (cluster-scoped).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IngressClass {
    /// The spec.
    pub spec: IngressClassSpec,
}

/// `IngressClass.spec`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IngressClassSpec {
    /// The controller serving the class (`istio.io/ingress-controller`).
    pub controller: String,
    /// Controller-specific parameters (Istio reads none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<serde_json::Value>,
}

impl Ingress {
    /// Whether it names Istio's class outright (annotation or
    /// `ingressClassName: istio`), as validation reads it.
    pub fn names_istio_class(&self, annotations: &BTreeMap<String, String>) -> bool {
        match annotations.get(CLASS_ANNOTATION) {
            Some(class) => class == ISTIO_CLASS,
            None => self.spec.ingress_class_name.as_deref() == Some(ISTIO_CLASS),
        }
    }
}
