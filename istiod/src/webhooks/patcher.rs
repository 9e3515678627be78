//! Keeps the `caBundle` of this revision's webhook configurations equal to
//! istiod's CA root, as Istio's webhook certificate patcher and validation
//! controller do: the configurations labelled `istio.io/rev=<revision>` are
//! watched, and every webhook of them that calls istiod gets the root (in a
//! MutatingWebhookConfiguration, the webhooks named `*sidecar-injector.istio.io`;
//! in a ValidatingWebhookConfiguration, all of them). A configuration someone
//! resets is patched again on the next event.
//!
//! The validating webhooks are installed failing open (`failurePolicy:
//! Ignore`, as Istio's chart does) and set to `Fail` together with the CA
//! bundle. Istio's validation controller flips them after a dry-run create
//! proves the API server reaches the webhook; we flip them once istiod's
//! webhook server is listening (the patcher starts after it binds), without
//! that round trip.

use std::fmt::Debug;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::Api;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

use crate::inject::policy::REVISION_LABEL;

/// The suffix of the injection webhooks' names in Istio's configuration.
const INJECTOR_WEBHOOK_SUFFIX: &str = "sidecar-injector.istio.io";

/// Sets `ca_bundle` on the webhooks `select` picks; returns whether anything changed.
fn set_bundle<'a>(
    bundles: impl Iterator<Item = (&'a str, &'a mut Option<ByteString>)>,
    root: &[u8],
    select: impl Fn(&str) -> bool,
) -> bool {
    let mut changed = false;
    for (name, bundle) in bundles {
        if !select(name) {
            continue;
        }
        if bundle.as_ref().map(|b| b.0.as_slice()) != Some(root) {
            *bundle = Some(ByteString(root.to_vec()));
            changed = true;
        }
    }
    changed
}

/// Patches a MutatingWebhookConfiguration in place; true when it changed.
pub fn patch_mutating(config: &mut MutatingWebhookConfiguration, root: &[u8]) -> bool {
    let hooks = config.webhooks.iter_mut().flatten();
    set_bundle(
        hooks.map(|w| (w.name.as_str(), &mut w.client_config.ca_bundle)),
        root,
        |name| name.ends_with(INJECTOR_WEBHOOK_SUFFIX),
    )
}

/// Patches a ValidatingWebhookConfiguration in place (CA bundle, and
/// `failurePolicy: Fail`); true when it changed.
pub fn patch_validating(config: &mut ValidatingWebhookConfiguration, root: &[u8]) -> bool {
    let mut changed = false;
    for w in config.webhooks.iter_mut().flatten() {
        if w.failure_policy.as_deref() != Some("Fail") {
            w.failure_policy = Some("Fail".into());
            changed = true;
        }
    }
    let hooks = config.webhooks.iter_mut().flatten();
    set_bundle(
        hooks.map(|w| (w.name.as_str(), &mut w.client_config.ca_bundle)),
        root,
        |_| true,
    ) || changed
}

/// Watches the configurations of kind `K` for `revision` and patches each
/// with `patch`; runs until shutdown.
async fn run<K>(
    client: kube::Client,
    revision: String,
    mut root: watch::Receiver<String>,
    patch: fn(&mut K, &[u8]) -> bool,
    shutdown: watch::Receiver<bool>,
) where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::all(client);
    let kind = K::kind(&()).to_string();
    let config = watcher::Config::default().labels(&format!("{REVISION_LABEL}={revision}"));
    let (tx, mut rx) = mpsc::channel::<K>(16);
    let writer = {
        let api = api.clone();
        let kind = kind.clone();
        tokio::spawn(async move {
            // The last seen version of each object: a new root re-patches them all.
            let mut seen: std::collections::BTreeMap<String, K> = Default::default();
            loop {
                let batch: Vec<K> = tokio::select! {
                    obj = rx.recv() => match obj {
                        Some(obj) => {
                            seen.insert(obj.meta().name.clone().unwrap_or_default(), obj.clone());
                            vec![obj]
                        }
                        None => break,
                    },
                    changed = root.changed() => match changed {
                        Ok(()) => seen.values().cloned().collect(),
                        Err(_) => break,
                    },
                };
                let current = root.borrow_and_update().as_bytes().to_vec();
                for mut obj in batch {
                    if !patch(&mut obj, &current) {
                        continue;
                    }
                    let name = obj.meta().name.clone().unwrap_or_default();
                    match api.replace(&name, &Default::default(), &obj).await {
                        Ok(_) => {
                            tracing::info!(target: "webhook", "patched the caBundle of {kind} {name}")
                        }
                        // A conflict means a newer version is on its way as an event.
                        Err(e) => {
                            tracing::warn!(target: "webhook", "cannot patch the caBundle of {kind} {name}: {e}")
                        }
                    }
                }
            }
        })
    };
    crate::kube::run_watcher(
        format!("{kind}s labelled {REVISION_LABEL}={revision}"),
        api,
        config,
        &tx,
        |event| match event {
            watcher::Event::InitApply(obj) | watcher::Event::Apply(obj) => Some(obj),
            _ => None,
        },
        shutdown,
    )
    .await;
    drop(tx);
    let _ = writer.await;
}

/// Starts patching this revision's webhook configurations with the root
/// bundle `root` holds, again whenever it changes.
///
/// Not under leader election, as in Istio (its injection patcher runs in
/// every replica: "different istiod revisions will patch their own cert"):
/// a configuration is written only when its bundle differs from this
/// replica's root, so replicas sharing a root write it once and the others
/// find it done; a write that loses a race gets 409 and the next event
/// settles it.
pub fn start(
    client: kube::Client,
    revision: &str,
    root: watch::Receiver<String>,
    shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(run::<MutatingWebhookConfiguration>(
        client.clone(),
        revision.to_string(),
        root.clone(),
        patch_mutating,
        shutdown.clone(),
    ));
    tokio::spawn(run::<ValidatingWebhookConfiguration>(
        client,
        revision.to_string(),
        root,
        patch_validating,
        shutdown,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_the_injector_webhooks_get_the_root_and_a_second_patch_changes_nothing() {
        let mut mwc: MutatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": "istio-sidecar-injector"},
            "webhooks": [
                {"name": "rev.namespace.sidecar-injector.istio.io", "clientConfig": {"service": {"name": "istiod", "namespace": "istio-system"}},
                 "sideEffects": "None", "admissionReviewVersions": ["v1"]},
                {"name": "other.example.com", "clientConfig": {"url": "https://x"},
                 "sideEffects": "None", "admissionReviewVersions": ["v1"]}]
        }))
        .unwrap();
        assert!(patch_mutating(&mut mwc, b"ROOT"));
        let hooks = mwc.webhooks.as_ref().unwrap();
        assert_eq!(
            hooks[0].client_config.ca_bundle.as_ref().unwrap().0,
            b"ROOT"
        );
        assert!(hooks[1].client_config.ca_bundle.is_none());
        assert!(!patch_mutating(&mut mwc, b"ROOT"));
        // The API carries the bundle base64-encoded.
        let v = serde_json::to_value(&mwc).unwrap();
        assert_eq!(v["webhooks"][0]["clientConfig"]["caBundle"], "Uk9PVA==");
    }

    #[test]
    fn validating_webhooks_stop_failing_open_once_patched() {
        let mut vwc: ValidatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": "istio-validator-istio-system"},
            "webhooks": [{"name": "rev.validation.istio.io", "failurePolicy": "Ignore",
                "clientConfig": {"service": {"name": "istiod", "namespace": "istio-system"}},
                "sideEffects": "None", "admissionReviewVersions": ["v1"]}]
        }))
        .unwrap();
        assert!(patch_validating(&mut vwc, b"ROOT"));
        let hook = &vwc.webhooks.as_ref().unwrap()[0];
        assert_eq!(hook.failure_policy.as_deref(), Some("Fail"));
        assert!(!patch_validating(&mut vwc, b"ROOT"));
    }
}
