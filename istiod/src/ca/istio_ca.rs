//! Which CA material istiod signs with, and what keeps it current (Istio's
//! `pilot/pkg/bootstrap/istio_ca.go`):
//!
//! 1. a plug-in CA in `ROOT_CA_DIR` (the `cacerts` Secret's mount in Istio's
//!    charts) wins;
//! 2. on Kubernetes without those files, the `cacerts` Secret read from the
//!    API (what the mount would hold);
//! 3. on Kubernetes, the self-signed CA in `istio-ca-secret`, created by the
//!    first istiod (the others read the winner's) and rotated by the
//!    self-signed root rotator;
//! 4. without Kubernetes, a self-signed root kept in a local directory.
//!
//! A plug-in CA is reloaded while istiod runs (Istio always does this since
//! it dropped `AUTO_RELOAD_PLUGIN_CERTS`): the directory's files are polled
//! every [`PLUGIN_POLL_INTERVAL`], the `cacerts` Secret is watched. The new
//! material signs from then on; the previous roots stay trusted (see
//! [`Authority`]'s overlap). Istio refuses a plug-in change of root unless
//! `MULTI_ROOT_MESH` is on and one bundle contains the other; here a new
//! root is taken up and the previous one is kept in the bundle for the
//! overlap instead.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::watcher;
use tokio::sync::{mpsc, watch};

use super::authority::Authority;
use super::ca_secret::{self, KubeSecrets};
use super::material::{
    self, CA_CERT_FILE, CA_KEY_FILE, CERT_CHAIN_FILE, CaBundle, ROOT_CERT_FILE, SelfSignedOptions,
};
use super::self_signed_root_rotator::{self, RotatorSettings};

/// The plug-in CA Secret Istio reads (`cacerts`, in istiod's namespace).
pub const CACERTS_SECRET: &str = "cacerts";

/// How often the plug-in files in `ROOT_CA_DIR` are compared with the
/// material in use.
pub const PLUGIN_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Where the material in use came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaSource {
    /// Plug-in files in `ROOT_CA_DIR`.
    PluginDir(PathBuf),
    /// The `cacerts` Secret.
    PluginSecret,
    /// `istio-ca-secret`.
    CaSecret,
    /// The local self-signed directory (no Kubernetes).
    LocalDir(PathBuf),
}

/// Istio's order of preference, from what exists.
pub fn choose(
    plugin_files: bool,
    on_kube: bool,
    cacerts_secret: bool,
    root_ca_dir: &Path,
    self_signed_dir: &Path,
) -> CaSource {
    match (plugin_files, on_kube, cacerts_secret) {
        (true, _, _) => CaSource::PluginDir(root_ca_dir.to_path_buf()),
        (false, true, true) => CaSource::PluginSecret,
        (false, true, false) => CaSource::CaSecret,
        (false, false, _) => CaSource::LocalDir(self_signed_dir.to_path_buf()),
    }
}

fn secret_data(s: Secret) -> BTreeMap<String, Vec<u8>> {
    s.data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect()
}

/// The data of the `cacerts` Secret, `None` when there is none. Waits (and
/// says so) while the API cannot answer: istiod cannot choose its CA before.
async fn cacerts_secret(
    client: &kube::Client,
    namespace: &str,
) -> Option<BTreeMap<String, Vec<u8>>> {
    let api: kube::Api<Secret> = kube::Api::namespaced(client.clone(), namespace);
    let mut delay = Duration::from_millis(500);
    loop {
        match api.get_opt(CACERTS_SECRET).await {
            Ok(secret) => return secret.map(secret_data),
            Err(e) => {
                tracing::warn!(target: "ca", "cannot read Secret {namespace}/{CACERTS_SECRET}: {e}; retrying in {delay:?}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// What choosing and keeping the CA material reads from istiod's config
/// (built by `Config::ca_settings`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// istiod's namespace, where `cacerts` and `istio-ca-secret` live.
    pub namespace: String,
    /// The plug-in CA directory (`ROOT_CA_DIR`).
    pub root_ca_dir: PathBuf,
    /// The self-signed root's directory when not on Kubernetes.
    pub self_signed_ca_dir: PathBuf,
    /// The self-signed root's trust domain, lifetime and key size.
    pub self_signed: SelfSignedOptions,
    /// `CITADEL_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL`.
    pub root_cert_check_interval: Duration,
    /// `CITADEL_SELF_SIGNED_ROOT_CERT_GRACE_PERIOD_PERCENTILE`.
    pub root_cert_grace_percentile: u32,
    /// `CITADEL_ENABLE_JITTER_FOR_ROOT_CERT_ROTATOR`.
    pub root_cert_rotator_jitter: bool,
}

/// Loads (or creates) the CA material in Istio's order.
pub async fn load(
    config: &Settings,
    kube: Option<&kube::Client>,
) -> anyhow::Result<(CaBundle, CaSource)> {
    let namespace = &config.namespace;
    let plugin_files = material::has_plugin_ca(&config.root_ca_dir);
    let cacerts = match (plugin_files, kube) {
        (false, Some(client)) => cacerts_secret(client, namespace).await,
        _ => None,
    };
    let source = choose(
        plugin_files,
        kube.is_some(),
        cacerts.is_some(),
        &config.root_ca_dir,
        &config.self_signed_ca_dir,
    );
    let bundle = match (&source, kube) {
        (CaSource::PluginSecret, _) => {
            let name = format!("{namespace}/{CACERTS_SECRET}");
            let data = cacerts.unwrap_or_default();
            tokio::task::spawn_blocking(move || material::load_plugin_secret(&name, &data))
                .await??
        }
        (CaSource::CaSecret, Some(client)) => {
            let store = KubeSecrets::new(client.clone(), namespace);
            let qualified = store.qualified(ca_secret::CA_SECRET);
            ca_secret::load_or_create(&store, &qualified, &config.self_signed).await?
        }
        (CaSource::PluginDir(dir), _) => {
            let dir = dir.clone();
            tokio::task::spawn_blocking(move || material::load_plugin(&dir)).await??
        }
        (_, _) => {
            let dir = config.self_signed_ca_dir.clone();
            let opts = config.self_signed.clone();
            tokio::task::spawn_blocking(move || material::load_or_create_self_signed(&dir, &opts))
                .await??
        }
    };
    tracing::info!(target: "ca", "using the {}", bundle.source);
    Ok((bundle, source))
}

/// Starts what keeps `source`'s material current: the plug-in reloaders or
/// the self-signed root rotator.
pub fn keep_current(
    source: &CaSource,
    config: &Settings,
    kube: Option<&kube::Client>,
    authority: &Arc<Authority>,
    shutdown: watch::Receiver<bool>,
) {
    match (source, kube) {
        (CaSource::PluginDir(dir), _) => {
            tokio::spawn(poll_plugin_dir(dir.clone(), authority.clone(), shutdown));
        }
        (CaSource::PluginSecret, Some(client)) => {
            tokio::spawn(watch_cacerts(
                client.clone(),
                config.namespace.clone(),
                authority.clone(),
                shutdown,
            ));
        }
        (CaSource::CaSecret, Some(client)) => {
            let store = KubeSecrets::new(client.clone(), &config.namespace);
            let qualified = store.qualified(ca_secret::CA_SECRET);
            let settings = RotatorSettings {
                check_interval: config.root_cert_check_interval,
                grace_percentile: config.root_cert_grace_percentile,
                jitter: config.root_cert_rotator_jitter,
                root: config.self_signed.clone(),
            };
            tokio::spawn(self_signed_root_rotator::run(
                store,
                qualified,
                authority.clone(),
                settings,
                shutdown,
            ));
        }
        _ => {}
    }
}

/// The plug-in files' contents, for change detection (`None` if unreadable).
fn plugin_fingerprint(dir: &Path) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    for f in [CA_CERT_FILE, CA_KEY_FILE, CERT_CHAIN_FILE, ROOT_CERT_FILE] {
        out.extend(std::fs::read(dir.join(f)).ok()?);
        out.push(0);
    }
    Some(out)
}

/// Whether `bundle` is what `authority` signs with already.
fn same_material(authority: &Authority, bundle: &CaBundle) -> bool {
    let current = authority.signer();
    let current = current.bundle();
    current.signing_cert == bundle.signing_cert
        && current.chain == bundle.chain
        && bundle.roots.iter().all(|r| current.roots.contains(r))
}

/// Takes up `material` if it differs from what was last taken up.
fn take_up(
    authority: &Authority,
    what: &str,
    last: &mut Option<Vec<u8>>,
    fingerprint: Vec<u8>,
    load: impl FnOnce() -> Result<CaBundle, material::MaterialError>,
) {
    if last.as_ref() == Some(&fingerprint) {
        return;
    }
    let result = load().map_err(|e| e.to_string()).and_then(|bundle| {
        if same_material(authority, &bundle) {
            return Ok(false);
        }
        authority
            .replace(bundle)
            .map(|()| true)
            .map_err(|e| e.to_string())
    });
    match result {
        Ok(changed) => {
            if changed {
                tracing::info!(target: "ca", "istiod has taken up the changed plug-in CA in {what}");
            }
            *last = Some(fingerprint);
        }
        // A half-written update: the next poll or event tries again.
        Err(e) => {
            tracing::warn!(target: "ca", "the changed plug-in CA in {what} is not usable yet: {e}")
        }
    }
}

async fn poll_plugin_dir(
    dir: PathBuf,
    authority: Arc<Authority>,
    mut shutdown: watch::Receiver<bool>,
) {
    let what = dir.display().to_string();
    // The first poll compares the files with the material in use.
    let mut last = None;
    let mut tick = tokio::time::interval(PLUGIN_POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.wait_for(|v| *v) => return,
        }
        if let Some(fp) = plugin_fingerprint(&dir) {
            take_up(&authority, &what, &mut last, fp, || {
                material::load_plugin(&dir)
            });
        }
        if let Err(e) = authority.prune() {
            tracing::error!(target: "ca", "cannot drop expired previous roots: {e}");
        }
    }
}

fn data_fingerprint(data: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in data {
        out.extend(k.as_bytes());
        out.push(0);
        out.extend(v);
        out.push(0);
    }
    out
}

async fn watch_cacerts(
    client: kube::Client,
    namespace: String,
    authority: Arc<Authority>,
    shutdown: watch::Receiver<bool>,
) {
    let api: kube::Api<Secret> = kube::Api::namespaced(client, &namespace);
    let what = format!("Secret {namespace}/{CACERTS_SECRET}");
    let (tx, mut rx) = mpsc::channel::<BTreeMap<String, Vec<u8>>>(4);
    let config = watcher::Config::default().fields(&format!("metadata.name={CACERTS_SECRET}"));
    let watch = {
        let what = what.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            crate::kube::run_watcher(
                what,
                api,
                config,
                &tx,
                |event| match event {
                    watcher::Event::InitApply(s) | watcher::Event::Apply(s)
                        if s.metadata.name.as_deref() == Some(CACERTS_SECRET) =>
                    {
                        Some(secret_data(s))
                    }
                    _ => None,
                },
                shutdown,
            )
            .await
        })
    };
    let mut last = None;
    let mut prune = tokio::time::interval(Duration::from_secs(60));
    let mut shutdown = shutdown;
    loop {
        tokio::select! {
            data = rx.recv() => {
                let Some(data) = data else { break };
                let fp = data_fingerprint(&data);
                take_up(&authority, &what, &mut last, fp, || material::load_plugin_secret(&what, &data));
            }
            _ = prune.tick() => {
                if let Err(e) = authority.prune() {
                    tracing::error!(target: "ca", "cannot drop expired previous roots: {e}");
                }
            }
            _ = shutdown.wait_for(|v| *v) => break,
        }
    }
    watch.abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_choice_follows_istios_order() {
        let (dir, own) = (
            Path::new("/etc/cacerts"),
            Path::new("./etc/istio-ca-secret"),
        );
        // Plug-in files win over everything.
        assert_eq!(
            choose(true, true, true, dir, own),
            CaSource::PluginDir(dir.into())
        );
        assert_eq!(
            choose(true, false, false, dir, own),
            CaSource::PluginDir(dir.into())
        );
        // On Kubernetes: the cacerts Secret, else istio-ca-secret.
        assert_eq!(choose(false, true, true, dir, own), CaSource::PluginSecret);
        assert_eq!(choose(false, true, false, dir, own), CaSource::CaSecret);
        // Without Kubernetes: the local directory.
        assert_eq!(
            choose(false, false, false, dir, own),
            CaSource::LocalDir(own.into())
        );
    }

    #[tokio::test]
    async fn changed_plugin_files_are_taken_up_and_the_old_root_stays_trusted() {
        use common::pki::{self, KeyType};
        let write = |dir: &Path| {
            let key = pki::generate_key(KeyType::EcdsaP256).unwrap();
            let opts = SelfSignedOptions {
                trust_domain: "cluster.local".into(),
                ttl: Duration::from_secs(86400),
                rsa_key_size: 2048,
            };
            let cert = material::self_signed_root(&key, &opts).unwrap();
            std::fs::write(dir.join(CA_CERT_FILE), &cert).unwrap();
            std::fs::write(dir.join(CA_KEY_FILE), key.serialize_pem()).unwrap();
            std::fs::write(dir.join(CERT_CHAIN_FILE), "").unwrap();
            std::fs::write(dir.join(ROOT_CERT_FILE), &cert).unwrap();
            pki::pem_certs("root", &cert).unwrap().remove(0)
        };
        let dir = tempfile::tempdir().unwrap();
        let old = write(dir.path());
        let authority = Arc::new(
            Authority::new(
                material::load_plugin(dir.path()).unwrap(),
                Duration::from_secs(3600),
                Duration::from_secs(7200),
            )
            .unwrap(),
        );
        let (_stop, shutdown) = watch::channel(false);
        let mut roots = authority.subscribe();
        tokio::spawn(poll_plugin_dir(
            dir.path().into(),
            authority.clone(),
            shutdown,
        ));
        let new = write(dir.path());
        tokio::time::timeout(Duration::from_secs(10), roots.changed())
            .await
            .expect("the change is taken up within the poll")
            .unwrap();
        let bundle = pki::pem_certs("bundle", &roots.borrow()).unwrap();
        assert_eq!(bundle, vec![new.clone(), old]);
        assert_eq!(authority.signer().bundle().signing_cert, new);
    }
}
