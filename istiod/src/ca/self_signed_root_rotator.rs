//! Istio's self-signed root rotator: every
//! `CITADEL_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL` it reads `istio-ca-secret`;
//! if the root there is in its grace period (the last
//! `CITADEL_SELF_SIGNED_ROOT_CERT_GRACE_PERIOD_PERCENTILE` percent of its
//! life) it makes a new root from the same key (so certificates signed under
//! the old root still verify), writes it to the Secret with `root-cert.pem`
//! listing the new and the old root, and signs with it; if the root there
//! differs from the one in memory (another replica rotated), it loads it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::pki;
use tokio::sync::watch;

use super::authority::Authority;
use super::ca_secret::{CA_SECRET, CaSecretError, SecretStore, Stored, WriteError, secret_data};
use super::material::{self, CA_CERT_FILE, CA_KEY_FILE, MaterialError, SelfSignedOptions};

/// The rotator's settings.
#[derive(Debug, Clone)]
pub struct RotatorSettings {
    /// `CITADEL_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL`.
    pub check_interval: Duration,
    /// `CITADEL_SELF_SIGNED_ROOT_CERT_GRACE_PERIOD_PERCENTILE`.
    pub grace_percentile: u32,
    /// `CITADEL_ENABLE_JITTER_FOR_ROOT_CERT_ROTATOR`.
    pub jitter: bool,
    /// The new root's subject and lifetime (`CITADEL_SELF_SIGNED_CA_CERT_TTL`).
    pub root: SelfSignedOptions,
}

/// What one check did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The root is outside its grace period and is the one in use.
    Unchanged,
    /// Another replica's root was loaded from the Secret.
    Reloaded,
    /// A new root was made and written.
    Rotated,
    /// The Secret is absent; nothing to check.
    NoSecret,
}

/// Whether a certificate valid `not_before..not_after` is, at `now`, within
/// the last `percentile` percent of its life (Istio's `GetWaitTime` <= 0).
pub fn in_grace_period(
    not_before: SystemTime,
    not_after: SystemTime,
    now: SystemTime,
    percentile: u32,
) -> bool {
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    let grace = lifetime.mul_f64(f64::from(percentile.min(100)) / 100.0);
    match not_after.duration_since(now) {
        Ok(left) => left <= grace,
        Err(_) => true,
    }
}

fn text(stored: &Stored, key: &str) -> String {
    String::from_utf8_lossy(stored.data.get(key).map(Vec::as_slice).unwrap_or_default())
        .into_owned()
}

/// One check, as Istio's `checkAndRotateRootCert`.
pub async fn check_and_rotate<S: SecretStore>(
    store: &S,
    qualified: &str,
    authority: &Authority,
    settings: &RotatorSettings,
    now: SystemTime,
) -> Result<Outcome, CaSecretError> {
    let api = |source| CaSecretError::Api {
        secret: qualified.to_string(),
        source,
    };
    let Some(mut stored) = store.get(CA_SECRET).await.map_err(api)? else {
        tracing::error!(target: "rootcertrotator", "Secret {qualified} is absent; skipping the root check");
        return Ok(Outcome::NoSecret);
    };
    let cert_pem = text(&stored, CA_CERT_FILE);
    let cert = pki::pem_certs(&format!("Secret {qualified} key {CA_CERT_FILE}"), &cert_pem)
        .map_err(MaterialError::from)?
        .into_iter()
        .next()
        .ok_or_else(|| MaterialError::Mismatch {
            path: format!("Secret {qualified} key {CA_CERT_FILE}"),
            reason: "holds no certificate".into(),
        })?;
    let info = pki::cert_info(&cert).map_err(MaterialError::from)?;
    if !in_grace_period(
        info.not_before,
        info.not_after,
        now,
        settings.grace_percentile,
    ) {
        if authority.signer().bundle().signing_cert.as_ref() == cert.as_ref() {
            return Ok(Outcome::Unchanged);
        }
        tracing::warn!(target: "rootcertrotator", "the root in Secret {qualified} differs from the one in use; loading it");
        let bundle = material::load_ca_secret(qualified, &stored.data)?;
        authority
            .replace(bundle)
            .map_err(|e| MaterialError::Mismatch {
                path: qualified.to_string(),
                reason: e.to_string(),
            })?;
        return Ok(Outcome::Reloaded);
    }

    tracing::info!(target: "rootcertrotator", "the root in Secret {qualified} is in its grace period; making a new root");
    let key_pem = text(&stored, CA_KEY_FILE);
    let key = pki::key_from_pem(&format!("Secret {qualified} key {CA_KEY_FILE}"), &key_pem)
        .map_err(MaterialError::from)?;
    let new_cert = material::self_signed_root(&key, &settings.root)?;
    let roots = pki::to_pem(&super::authority::merge_roots(
        &pki::pem_certs("new root", &new_cert).map_err(MaterialError::from)?,
        std::slice::from_ref(&cert),
    ));
    stored.data = secret_data(&new_cert, &key_pem, &roots);
    match store.update(CA_SECRET, &stored).await {
        Ok(()) => {}
        // Another replica wrote first: the next check loads its root.
        Err(WriteError::Conflict) => {
            tracing::info!(target: "rootcertrotator", "Secret {qualified} changed while rotating; the next check loads it");
            return Ok(Outcome::Unchanged);
        }
        Err(WriteError::Api(e)) => return Err(api(e)),
    }
    let bundle = material::load_ca_secret(qualified, &stored.data)?;
    authority
        .replace(bundle)
        .map_err(|e| MaterialError::Mismatch {
            path: qualified.to_string(),
            reason: e.to_string(),
        })?;
    tracing::info!(target: "rootcertrotator", "root certificate rotation is complete");
    Ok(Outcome::Rotated)
}

/// Runs the rotator until shutdown (a zero interval disables it, as Istio).
pub async fn run<S: SecretStore>(
    store: S,
    qualified: String,
    authority: Arc<Authority>,
    settings: RotatorSettings,
    mut shutdown: watch::Receiver<bool>,
) {
    if settings.check_interval.is_zero() {
        tracing::info!(target: "rootcertrotator", "the self-signed root check is disabled");
        return;
    }
    if settings.jitter {
        let wait = settings.check_interval.mul_f64(rand::random::<f64>());
        tracing::info!(target: "rootcertrotator", "starting the root rotator in {wait:?} (jitter)");
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|v| *v) => return,
        }
    }
    let mut ticker = tokio::time::interval(settings.check_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.wait_for(|v| *v) => return,
        }
        tracing::debug!(target: "rootcertrotator", "checking the root certificate");
        match check_and_rotate(&store, &qualified, &authority, &settings, SystemTime::now()).await {
            Ok(outcome) => tracing::debug!(target: "rootcertrotator", "root check: {outcome:?}"),
            Err(e) => tracing::error!(target: "rootcertrotator", "root check failed: {e}"),
        }
        if let Err(e) = authority.prune() {
            tracing::error!(target: "ca", "cannot drop expired previous roots: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::ca_secret::tests::{MemorySecrets, opts, root_data};

    const H: Duration = Duration::from_secs(3600);

    #[test]
    fn the_grace_period_is_the_last_percentile_of_the_life() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let end = start + 100 * H;
        assert!(!in_grace_period(start, end, start + 79 * H, 20));
        assert!(in_grace_period(start, end, start + 80 * H, 20));
        assert!(in_grace_period(start, end, end + H, 20), "expired");
        assert!(!in_grace_period(start, end, start + 99 * H, 0));
        assert!(in_grace_period(start, end, start, 100));
    }

    fn settings(ttl: Duration) -> RotatorSettings {
        RotatorSettings {
            check_interval: H,
            grace_percentile: 20,
            jitter: false,
            root: opts(ttl),
        }
    }

    fn store_with(data: std::collections::BTreeMap<String, Vec<u8>>) -> MemorySecrets {
        let store = MemorySecrets::default();
        store.secrets.lock().unwrap().insert(
            CA_SECRET.into(),
            Stored {
                data,
                resource_version: Some("1".into()),
            },
        );
        store
    }

    fn authority(store: &MemorySecrets) -> Authority {
        let data = store.secrets.lock().unwrap()[CA_SECRET].data.clone();
        let bundle = material::load_ca_secret("ns/istio-ca-secret", &data).unwrap();
        Authority::new(bundle, H, 2 * H).unwrap()
    }

    #[tokio::test]
    async fn a_root_in_its_grace_period_is_replaced_by_one_with_the_same_key() {
        let store = store_with(root_data(10 * H));
        let authority = authority(&store);
        let old = store.secrets.lock().unwrap()[CA_SECRET].clone();
        let old_root = pki::pem_certs("old", &text(&old, CA_CERT_FILE))
            .unwrap()
            .remove(0);
        // 9 of 10 hours gone: inside the 20% grace.
        let now = SystemTime::now() + 9 * H;
        let outcome = check_and_rotate(
            &store,
            "ns/istio-ca-secret",
            &authority,
            &settings(100 * H),
            now,
        )
        .await
        .unwrap();
        assert_eq!(outcome, Outcome::Rotated);
        let new = store.secrets.lock().unwrap()[CA_SECRET].clone();
        assert_eq!(
            new.data[CA_KEY_FILE], old.data[CA_KEY_FILE],
            "the key is reused"
        );
        let new_root = pki::pem_certs("new", &text(&new, CA_CERT_FILE))
            .unwrap()
            .remove(0);
        assert_ne!(new_root, old_root);
        let listed = pki::pem_certs("roots", &text(&new, "root-cert.pem")).unwrap();
        assert_eq!(listed, vec![new_root.clone(), old_root.clone()]);
        // In use and published: both roots; a leaf signed now verifies under either.
        let published = pki::pem_certs("bundle", &authority.root_pem()).unwrap();
        assert_eq!(published, vec![new_root.clone(), old_root.clone()]);
        let names = vec!["istiod.istio-system.svc".to_string()];
        let (leaf, _) = authority.signer().sign_server_cert(&names, H).unwrap();
        let leaf = pki::pem_certs("leaf", &leaf).unwrap().remove(0);
        assert!(pki::signed_by(&leaf, &new_root) && pki::signed_by(&leaf, &old_root));
    }

    #[tokio::test]
    async fn a_root_outside_its_grace_period_is_kept_and_another_replicas_root_is_loaded() {
        let store = store_with(root_data(10 * H));
        let authority = authority(&store);
        let now = SystemTime::now() + 7 * H;
        let outcome = check_and_rotate(
            &store,
            "ns/istio-ca-secret",
            &authority,
            &settings(10 * H),
            now,
        )
        .await
        .unwrap();
        assert_eq!(outcome, Outcome::Unchanged);
        // Another replica replaced the root.
        let other = root_data(10 * H);
        store
            .secrets
            .lock()
            .unwrap()
            .get_mut(CA_SECRET)
            .unwrap()
            .data = other.clone();
        let outcome = check_and_rotate(
            &store,
            "ns/istio-ca-secret",
            &authority,
            &settings(10 * H),
            SystemTime::now(),
        )
        .await
        .unwrap();
        assert_eq!(outcome, Outcome::Reloaded);
        assert_eq!(
            authority.signer().bundle().signing_cert.as_ref(),
            pki::pem_certs("other", std::str::from_utf8(&other[CA_CERT_FILE]).unwrap()).unwrap()[0]
                .as_ref()
        );
    }
}
