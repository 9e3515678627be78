//! istiod's admission webhooks on `--httpsAddr` (`:15017`, the `istiod`
//! Service's port 443), as Istio serves them: `/inject` and `/inject/...`
//! (sidecar injection, [`inject`]), `/validate` and `/validate/...` (config
//! validation, [`validation`]) and `/ready`, over TLS with istiod's own
//! serving certificate (`istiod.<namespace>.svc`, signed by its CA).
//!
//! On Kubernetes, [`patcher`] writes the CA root into the `caBundle` of the
//! webhook configurations of this revision, so the API server trusts the
//! serving certificate.

pub mod inject;
pub(crate) mod patcher;
pub mod review;
pub mod server;
pub mod validation;

use std::net::SocketAddr;
use std::path::PathBuf;

use common::env::Reader;

/// `REVISION`: the control-plane revision (`default`).
pub const ENV_REVISION: &str = "REVISION";
/// `INJECT_ENABLED`: serve the injection webhook (true).
pub const ENV_INJECT_ENABLED: &str = "INJECT_ENABLED";
/// `INJECTION_WEBHOOK_CONFIG_NAME`: the MutatingWebhookConfiguration whose
/// `caBundle` istiod keeps current (`istio-sidecar-injector`).
pub const ENV_INJECTION_WEBHOOK_CONFIG_NAME: &str = "INJECTION_WEBHOOK_CONFIG_NAME";
/// `VALIDATION_WEBHOOK_CONFIG_NAME`: the ValidatingWebhookConfiguration
/// whose `caBundle` istiod keeps current (`istio-validator-<namespace>`; Istio's
/// default, `istio-istio-system`, names no configuration its chart installs:
/// its chart sets the variable or relies on the revision label, as we do).
pub const ENV_VALIDATION_WEBHOOK_CONFIG_NAME: &str = "VALIDATION_WEBHOOK_CONFIG_NAME";
/// `ENABLE_NATIVE_SIDECARS`: run `istio-proxy` as a Kubernetes native sidecar.
pub const ENV_ENABLE_NATIVE_SIDECARS: &str = "ENABLE_NATIVE_SIDECARS";
/// `COMPLIANCE_POLICY`: passed to injected proxies (`fips-140-3`).
pub const ENV_COMPLIANCE_POLICY: &str = "COMPLIANCE_POLICY";
/// Where Istio's chart mounts the `istio-sidecar-injector` ConfigMap
/// (`config` and `values`), relative to the working directory as Istio's
/// `--injectionPath` default is.
pub const DEFAULT_INJECTION_DIR: &str = "./var/lib/istio/inject";
/// The injector ConfigMap's name (a revision adds `-<revision>`).
pub const INJECTOR_CONFIGMAP: &str = "istio-sidecar-injector";

/// `ENABLE_NATIVE_SIDECARS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeSidecars {
    /// `true`.
    On,
    /// `false`.
    Off,
    /// `auto` (Istio's default): on where the cluster supports native
    /// sidecars. Every Kubernetes version this istiod's client supports
    /// (1.29 and later) does, so `auto` is on.
    Auto,
}

impl NativeSidecars {
    /// Whether injected pods run `istio-proxy` as a native sidecar.
    pub fn enabled(self) -> bool {
        !matches!(self, Self::Off)
    }
}

/// The webhooks' settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    /// `--httpsAddr`; `None` serves no webhook.
    pub https_addr: Option<SocketAddr>,
    /// `REVISION`.
    pub revision: String,
    /// `INJECT_ENABLED`.
    pub inject_enabled: bool,
    /// The injector's `config` and `values` files, when they exist.
    pub injection_dir: PathBuf,
    /// The injector ConfigMap read on Kubernetes when the files do not exist.
    pub injector_configmap: String,
    /// `INJECTION_WEBHOOK_CONFIG_NAME`.
    pub injection_webhook_config_name: String,
    /// `VALIDATION_WEBHOOK_CONFIG_NAME`.
    pub validation_webhook_config_name: String,
    /// `ENABLE_NATIVE_SIDECARS`.
    pub native_sidecars: NativeSidecars,
    /// `COMPLIANCE_POLICY`.
    pub compliance_policy: Option<String>,
}

impl WebhookConfig {
    /// Reads the webhooks' environment; errors are added to `r`.
    pub fn read(https_addr: Option<SocketAddr>, namespace: &str, r: &mut Reader<'_>) -> Self {
        let revision = r.string(ENV_REVISION, "default");
        let suffix = if revision == "default" || revision.is_empty() {
            String::new()
        } else {
            format!("-{revision}")
        };
        let native_sidecars = match r.string(ENV_ENABLE_NATIVE_SIDECARS, "auto").as_str() {
            "auto" => NativeSidecars::Auto,
            "true" | "1" => NativeSidecars::On,
            "false" | "0" => NativeSidecars::Off,
            other => {
                r.error(format!(
                    "{ENV_ENABLE_NATIVE_SIDECARS}={other:?} is not one of auto, true, false"
                ));
                NativeSidecars::Auto
            }
        };
        Self {
            https_addr,
            inject_enabled: r.bool(ENV_INJECT_ENABLED, true),
            injection_dir: PathBuf::from(DEFAULT_INJECTION_DIR),
            injector_configmap: format!("{INJECTOR_CONFIGMAP}{suffix}"),
            injection_webhook_config_name: r.string(
                ENV_INJECTION_WEBHOOK_CONFIG_NAME,
                &format!("{INJECTOR_CONFIGMAP}{suffix}"),
            ),
            validation_webhook_config_name: r.string(
                ENV_VALIDATION_WEBHOOK_CONFIG_NAME,
                &format!("istio-validator{suffix}-{namespace}"),
            ),
            native_sidecars,
            compliance_policy: r
                .opt_string(ENV_COMPLIANCE_POLICY)
                .filter(|p| !p.is_empty()),
            revision: if revision.is_empty() {
                "default".into()
            } else {
                revision
            },
        }
    }
}
