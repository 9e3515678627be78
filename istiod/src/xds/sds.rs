//! SDS for gateways and sidecars over ADS, as Istio's `SecretGen` (`pilot/pkg/xds/sds.go`):
//! the Envoy `Secret`s a gateway's listeners name (`kubernetes://<name>`,
//! `kubernetes://<namespace>/<name>`, and `…-cacert` for the CA that
//! verifies client certificates), built from Kubernetes Secrets in the
//! config sources, inline; sidecars ask for them for a DestinationRule's
//! `credentialName`. The workload certificate (`default`, `ROOTCA`) is the
//! agent's, not istiod's.
//!
//! Authorization, as Istio's default: only a proxy that proved its
//! identity, and only Secrets of its own namespace (gateways and sidecars
//! alike: Istio's `proxyAuthorizedForSecret`). The Gateway API's
//! `kubernetes-gateway://<namespace>/<name>` names (Istio's
//! `KubernetesGatewaySecretType`) are served to gateways of the Secret's
//! namespace, and to gateways of another namespace when a `ReferenceGrant`
//! in the Secret's namespace lets that namespace's Gateways refer to it
//! (Istio's `VerifiedCertificateReferences`). `configmap://<namespace>/<name>`
//! (a BackendTLSPolicy's or frontendValidation's CA) is served to any
//! verified proxy, as Istio does. A refused or missing resource is left out of the response
//! and logged (warn, scope `ads`) naming the proxy and the resource.

use std::collections::BTreeSet;
use std::sync::Arc;

use proto::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, DataSource, config_source, data_source,
};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, SdsSecretConfig, Secret as EnvoySecret, TlsCertificate, secret,
};

use crate::model::secret::{CA_SUFFIX, CredentialError, Secret};
use crate::pushctx::context::IstioContext;
use crate::pushctx::{Proxy, Resource};

/// Istio's resource name prefix for Kubernetes Secrets (`KubernetesSecretTypeURI`).
pub const KUBERNETES_PREFIX: &str = "kubernetes://";

/// Istio's resource name prefix for a CA in a ConfigMap
/// (`KubernetesConfigMapTypeURI`), named by the Gateway API.
pub const CONFIGMAP_PREFIX: &str = crate::model::gateway_api::backend_policies::CONFIGMAP_PREFIX;

/// Istio's resource name prefix for Secrets named by the Gateway API.
pub const KUBERNETES_GATEWAY_PREFIX: &str =
    crate::model::gateway_api::listener_tls::KUBERNETES_GATEWAY_PREFIX;

/// A resource name resolved for one proxy (Istio's `SecretResource`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretResource {
    /// The Secret's namespace (the proxy's when the name has none).
    pub namespace: String,
    /// The name after the prefix and namespace, `-cacert` kept.
    pub name: String,
    /// Named by the Gateway API (`kubernetes-gateway://`).
    pub gateway_api: bool,
    /// A ConfigMap's CA (`configmap://`), not a Secret.
    pub config_map: bool,
}

impl SecretResource {
    /// Whether only the CA is asked for.
    pub fn ca_only(&self) -> bool {
        self.name.ends_with(CA_SUFFIX)
    }

    /// `namespace/name` of the Secret this resource is read from first.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The Secrets a change of which alters this resource (`namespace/name`):
    /// a CA resource also reads the Secret without the suffix.
    pub fn depends_on(&self, secret: &str) -> bool {
        secret == self.key()
            || (self.ca_only()
                && self
                    .name
                    .strip_suffix(CA_SUFFIX)
                    .is_some_and(|base| secret == format!("{}/{base}", self.namespace)))
    }
}

/// Why a resource is not served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SdsError {
    /// Not a `kubernetes://` name, or too many parts.
    #[error(
        "invalid resource name {0:?}: expected kubernetes://<name>, kubernetes://<namespace>/<name>, kubernetes-gateway://<namespace>/<name> or configmap://<namespace>/<name>"
    )]
    InvalidName(String),
    /// The connection proved no identity (the plaintext port).
    #[error(
        "proxy is not authorized to receive credentials: connect over the TLS port (15012) and authenticate"
    )]
    NotVerified,
    /// A Gateway API Secret of another namespace that no ReferenceGrant
    /// lets the proxy's namespace refer to.
    #[error(
        "secret {secret_namespace}/{name} is not accessible to Gateways of namespace {proxy_namespace:?} (missing a ReferenceGrant in {secret_namespace:?}?)"
    )]
    NotGranted {
        /// The Secret's namespace.
        secret_namespace: String,
        /// Its name.
        name: String,
        /// The proxy's.
        proxy_namespace: String,
    },
    /// A Secret of another namespace.
    #[error(
        "secret is in namespace {secret_namespace:?}, the proxy in {proxy_namespace:?}: a gateway may only read Secrets of its own namespace"
    )]
    OtherNamespace {
        /// The Secret's namespace.
        secret_namespace: String,
        /// The proxy's.
        proxy_namespace: String,
    },
    /// No such Secret.
    #[error("secret {0} not found")]
    NotFound(String),
    /// No such ConfigMap.
    #[error("configmap {0} not found")]
    ConfigMapNotFound(String),
    /// The ConfigMap holds no CA.
    #[error("configmap {config_map}: {error}")]
    ConfigMapCa {
        /// `namespace/name`.
        config_map: String,
        /// What is missing.
        error: crate::model::config_map::ConfigMapCaError,
    },
    /// The Secret holds no credential of the asked kind.
    #[error("secret {secret}: {error}")]
    Credential {
        /// `namespace/name`.
        secret: String,
        /// What is missing.
        error: CredentialError,
    },
}

/// Istio's `ParseResourceName`: `kubernetes://<name>` is in the proxy's
/// namespace, `kubernetes://<namespace>/<name>` names its namespace.
/// `kubernetes-gateway://<namespace>/<name>` always names its namespace.
pub fn parse_resource_name(resource: &str, proxy_ns: &str) -> Result<SecretResource, SdsError> {
    let invalid = || SdsError::InvalidName(resource.to_string());
    let config_map = resource.starts_with(CONFIGMAP_PREFIX);
    let (rest, gateway_api) = match resource.strip_prefix(KUBERNETES_GATEWAY_PREFIX) {
        Some(rest) => (rest, true),
        None => (
            resource
                .strip_prefix(KUBERNETES_PREFIX)
                .or_else(|| resource.strip_prefix(CONFIGMAP_PREFIX))
                .ok_or_else(invalid)?,
            false,
        ),
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let (namespace, name) = match parts.as_slice() {
        [name] if !gateway_api && !config_map => (proxy_ns, *name),
        [ns, name] => (*ns, *name),
        _ => return Err(invalid()),
    };
    if name.is_empty() || namespace.is_empty() {
        return Err(invalid());
    }
    Ok(SecretResource {
        namespace: namespace.to_string(),
        name: name.to_string(),
        gateway_api,
        config_map,
    })
}

/// The resource name Envoy asks for a gateway `credentialName`: Istio
/// prefixes a bare name with `kubernetes://`, and keeps a prefixed one.
pub fn credential_resource(credential_name: &str) -> String {
    if credential_name.contains("://") {
        credential_name.to_string()
    } else {
        format!("{KUBERNETES_PREFIX}{credential_name}")
    }
}

/// The CA resource of a credential (Istio's `-cacert` companion).
pub fn ca_resource(credential_name: &str) -> String {
    format!("{}{CA_SUFFIX}", credential_resource(credential_name))
}

/// An SDS reference to istiod's credentials over the ADS stream (Istio's
/// `SDSAdsConfig`: Envoy's default initial fetch timeout, so a listener or
/// cluster whose certificate never comes still starts, and fails handshakes).
pub fn ads_secret(name: &str) -> SdsSecretConfig {
    SdsSecretConfig {
        name: name.to_string(),
        sds_config: Some(ConfigSource {
            resource_api_version: ApiVersion::V3.into(),
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
                AggregatedConfigSource {},
            )),
            ..Default::default()
        }),
    }
}

/// Of the watched resource names, those that read one of the `changed`
/// Secrets (`namespace/name`), for a proxy of `proxy_ns`.
pub fn watching(
    names: &BTreeSet<String>,
    proxy_ns: &str,
    changed: &BTreeSet<String>,
) -> BTreeSet<String> {
    names
        .iter()
        .filter(|n| {
            parse_resource_name(n, proxy_ns)
                .is_ok_and(|sr| changed.iter().any(|c| sr.depends_on(c)))
        })
        .cloned()
        .collect()
}

/// The resources of `names` that `proxy` may have.
pub fn build(ctx: &IstioContext, proxy: &Proxy, names: &BTreeSet<String>) -> Vec<Arc<Resource>> {
    names
        .iter()
        // Istio's `invalid://` (a BackendTLSPolicy whose CA cannot be
        // used) is never served, by design: its status says why.
        .filter(|name| {
            !name.starts_with(crate::model::gateway_api::backend_policies::INVALID_CREDENTIAL)
        })
        .filter_map(|name| match generate(ctx, proxy, name) {
            Ok(secret) => Some(Arc::new(Resource::encode(name.clone(), &secret))),
            Err(e) => {
                tracing::warn!(
                    target: "ads",
                    "requested secret {name} not accessible for proxy {}: {e}",
                    proxy.id
                );
                None
            }
        })
        .collect()
}

/// Whether `proxy` may read `sr` (Istio's `proxyAuthorizedForSecret` with
/// the default, same-namespace, policy; for Gateway API names, a gateway
/// of another namespace with a ReferenceGrant).
fn authorize(ctx: &IstioContext, proxy: &Proxy, sr: &SecretResource) -> Result<(), SdsError> {
    if !proxy.verified {
        return Err(SdsError::NotVerified);
    }
    if sr.config_map {
        // Istio serves any ConfigMap's CA to any proxy: only `ca.crt` is
        // read, which is not private, and the client reads the server's CA
        // (so no namespace rule can hold).
        return Ok(());
    }
    if sr.gateway_api && sr.namespace != proxy.namespace {
        use crate::model::gateway_api::references::{RefFrom, RefTo};
        let name = sr.name.strip_suffix(CA_SUFFIX).unwrap_or(&sr.name);
        let router = proxy.proxy_type == common::ProxyType::Router;
        if router
            && ctx.reference_grants.granted(
                RefFrom::gateway(&proxy.namespace),
                RefTo::secret(&sr.namespace, name),
            )
        {
            return Ok(());
        }
        return Err(SdsError::NotGranted {
            secret_namespace: sr.namespace.clone(),
            name: name.to_string(),
            proxy_namespace: proxy.namespace.clone(),
        });
    }
    if sr.namespace != proxy.namespace {
        return Err(SdsError::OtherNamespace {
            secret_namespace: sr.namespace.clone(),
            proxy_namespace: proxy.namespace.clone(),
        });
    }
    Ok(())
}

fn generate(ctx: &IstioContext, proxy: &Proxy, name: &str) -> Result<EnvoySecret, SdsError> {
    let sr = parse_resource_name(name, &proxy.namespace)?;
    authorize(ctx, proxy, &sr)?;
    let lookup = |secret_name: &str| -> Option<(&Secret, String)> {
        ctx.secret(&sr.namespace, secret_name)
            .map(|s| (s, format!("{}/{secret_name}", sr.namespace)))
    };
    let credential =
        |secret: String| move |error: CredentialError| SdsError::Credential { secret, error };
    let kind = if sr.config_map {
        // Istio's `GetConfigMapCaCert`: the CA, asked for with or without
        // the `-cacert` suffix.
        let base = sr.name.strip_suffix(CA_SUFFIX).unwrap_or(&sr.name);
        let key = format!("{}/{base}", sr.namespace);
        let cm = ctx
            .config_map(&sr.namespace, base)
            .ok_or_else(|| SdsError::ConfigMapNotFound(key.clone()))?;
        let ca = cm.ca().map_err(|error| SdsError::ConfigMapCa {
            config_map: key,
            error,
        })?;
        secret::Type::ValidationContext(CertificateValidationContext {
            trusted_ca: Some(inline(ca)),
            ..Default::default()
        })
    } else if sr.ca_only() {
        // Istio's `GetCaCert`: the `-cacert` Secret, else the Secret
        // without the suffix.
        let base = sr.name.strip_suffix(CA_SUFFIX).unwrap_or(&sr.name);
        let (secret, key) = lookup(&sr.name)
            .or_else(|| lookup(base))
            .ok_or_else(|| SdsError::NotFound(format!("{}/{base}", sr.namespace)))?;
        let ca = secret.ca().map_err(credential(key))?;
        secret::Type::ValidationContext(CertificateValidationContext {
            trusted_ca: Some(inline(ca)),
            ..Default::default()
        })
    } else {
        let (secret, key) = lookup(&sr.name).ok_or_else(|| SdsError::NotFound(sr.key()))?;
        let ck = secret.cert_and_key().map_err(credential(key))?;
        secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: Some(inline(&ck.cert)),
            private_key: Some(inline(&ck.key)),
            ..Default::default()
        })
    };
    Ok(EnvoySecret {
        name: name.to_string(),
        r#type: Some(kind),
    })
}

fn inline(bytes: &[u8]) -> DataSource {
    DataSource {
        specifier: Some(data_source::Specifier::InlineBytes(bytes.to_vec())),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
