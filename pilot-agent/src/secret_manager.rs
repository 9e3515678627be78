//! Holds the workload's certificate and keeps it fresh. One task owns it and
//! publishes each new secret through a `watch` channel; the SDS server (and
//! anything else) subscribes.
//!
//! Unlike Istio's agent, rotation does not wait for an SDS client to ask
//! again: the certificate is renewed on schedule whoever is watching (Istio's
//! behaviour means `OUTPUT_CERTS` without Envoy never rotates, istio#53118).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::backoff::Backoff;
use common::pki::{self, KeyType};
use tokio::sync::watch;

use crate::ca_client::CaClient;
use crate::config::{CertSource, Config};

/// The workload's key, certificate chain and root, as Envoy gets them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadSecret {
    /// PEM chain: leaf first, then intermediates (the root excluded).
    pub cert_chain_pem: String,
    /// PEM private key.
    pub key_pem: String,
    /// PEM root bundle (the last element of the CA's answer).
    pub root_pem: String,
    /// The leaf's serial, lower-case hex.
    pub serial: String,
    /// When the agent obtained it (Istio's `CreatedTime`, the rotation baseline).
    pub created: SystemTime,
    /// The leaf's expiry.
    pub expires: SystemTime,
}

/// The latest secret, `None` until the first one arrives.
pub type SecretWatch = watch::Receiver<Option<Arc<WorkloadSecret>>>;

/// Why a secret could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The CSR failed.
    #[error(transparent)]
    Ca(#[from] crate::ca_client::CaClientError),
    /// Keys or certificates could not be made or read.
    #[error(transparent)]
    Pki(#[from] pki::PkiError),
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// When to rotate: `expires - (ratio ± U[0, jitter]) * (expires - created)`,
/// as Istio's `rotateTime`, returned as a delay from `now` (zero if past).
pub fn rotation_delay(
    created: SystemTime,
    expires: SystemTime,
    ratio: f64,
    jitter: f64,
    now: SystemTime,
) -> Duration {
    let lifetime = expires
        .duration_since(created)
        .unwrap_or_default()
        .as_secs_f64();
    let spread = if jitter > 0.0 {
        (rand::random::<f64>() * 2.0 - 1.0) * jitter
    } else {
        0.0
    };
    let ratio = (ratio + spread).clamp(0.0, 1.0);
    let grace = Duration::from_secs_f64(lifetime * ratio);
    let rotate_at = expires.checked_sub(grace).unwrap_or(created);
    rotate_at.duration_since(now).unwrap_or_default()
}

/// Splits the CA's answer into (chain without root, root), joining elements
/// with newlines where one lacks it (Istio's `concatCerts`).
pub fn split_chain(chain: &[String]) -> (String, String) {
    let concat = |items: &[String]| {
        let mut out = String::new();
        for item in items {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(item);
        }
        out
    };
    match chain.split_last() {
        Some((root, rest)) => (concat(rest), root.clone()),
        None => (String::new(), String::new()),
    }
}

fn secret_from_pems(
    cert_chain_pem: String,
    key_pem: String,
    root_pem: String,
) -> Result<WorkloadSecret, SecretError> {
    let certs = pki::pem_certs("workload certificate chain", &cert_chain_pem)?;
    let info = pki::cert_info(&certs[0])?;
    pki::pem_certs("root certificate", &root_pem)?;
    Ok(WorkloadSecret {
        cert_chain_pem,
        key_pem,
        root_pem,
        serial: info.serial,
        created: SystemTime::now(),
        expires: info.not_after,
    })
}

/// Generates a key and CSR and asks the CA.
async fn fetch_from_ca(client: &CaClient, config: &Config) -> Result<WorkloadSecret, SecretError> {
    let identity = config.identity.workload.clone();
    let key_type: KeyType = config.identity.key_type;
    // RSA key generation takes a while: keep it off the async workers.
    let (key_pem, csr) = tokio::task::spawn_blocking(move || -> Result<_, pki::PkiError> {
        let key = pki::generate_key(key_type)?;
        let csr = pki::csr_pem(&identity, &key)?;
        Ok((key.serialize_pem(), csr))
    })
    .await
    .map_err(|e| pki::PkiError::KeyGen {
        kind: key_type.to_string(),
        reason: e.to_string(),
    })??;
    let chain = client.sign(&csr).await?;
    let (cert_chain_pem, root_pem) = split_chain(&chain);
    secret_from_pems(cert_chain_pem, key_pem, root_pem)
}

/// Reads a certificate or key file without blocking the async workers (the
/// files are polled every half second).
async fn read(path: &Path) -> Result<String, SecretError> {
    tokio::fs::read_to_string(path)
        .await
        .map_err(|source| SecretError::Io {
            path: path.display().to_string(),
            source,
        })
}

async fn load_files(
    cert_chain: &Path,
    key: &Path,
    root: &Path,
) -> Result<WorkloadSecret, SecretError> {
    let key_pem = read(key).await?;
    pki::key_from_pem(&key.display().to_string(), &key_pem)?;
    secret_from_pems(read(cert_chain).await?, key_pem, read(root).await?)
}

/// Writes the secret to `OUTPUT_CERTS` atomically, only when changed.
fn write_output(dir: &Path, secret: &WorkloadSecret, mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir)?;
    for (name, content) in [
        ("key.pem", &secret.key_pem),
        ("cert-chain.pem", &secret.cert_chain_pem),
        ("root-cert.pem", &secret.root_pem),
    ] {
        let path = dir.join(name);
        if std::fs::read_to_string(&path).is_ok_and(|c| &c == content) {
            continue;
        }
        let tmp = dir.join(format!(".{name}.tmp"));
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(content.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(())
}

/// The last failure to obtain a certificate, kept until one arrives: what
/// readiness reports once the current certificate has expired.
pub type LastError = Arc<std::sync::Mutex<Option<String>>>;

/// Why the workload certificate no longer serves (see
/// [`SecretManager::check_certificate`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertificateError {
    /// The certificate's life ended and no new one came.
    #[error(
        "workload certificate expired {ago} ago (serial {serial}) and no new one could be obtained: {cause}"
    )]
    Expired {
        /// How long ago it expired.
        ago: String,
        /// Its serial.
        serial: String,
        /// The last failure (the CA's error), or that renewal is pending.
        cause: String,
    },
}

/// Readiness of the workload certificate: failing once the published one has
/// expired, with the last error met while renewing it. Istio's readiness
/// checks only Envoy (and DNS): an agent whose CA is unreachable stays
/// ready while Envoy's certificate expires and mTLS fails. Here it says so.
pub fn check_certificate(
    secret: Option<&WorkloadSecret>,
    last_error: Option<&str>,
    now: SystemTime,
) -> Result<(), CertificateError> {
    let Some(secret) = secret else {
        // Before the first certificate, Envoy's own readiness is not met.
        return Ok(());
    };
    match now.duration_since(secret.expires) {
        Err(_) => Ok(()),
        Ok(ago) => Err(CertificateError::Expired {
            ago: common::duration::format(Duration::from_secs(ago.as_secs())),
            serial: secret.serial.clone(),
            cause: last_error
                .map(|e| format!("CA unreachable: {e}"))
                .unwrap_or_else(|| "renewal pending".to_string()),
        }),
    }
}

/// The longest wait between two CSRs while the CA fails: a quarter of the
/// current certificate's remaining life (between 1 s and the generic 60 s),
/// and [`RETRY_MAX_WITHOUT_CERTIFICATE`] once it has expired or before the
/// first one, so the agent recovers soon after the CA returns. (Istio's
/// retries are the CSR interceptor's five attempts, then Envoy's SDS
/// re-requests and the pre-warm loop's backoff, up to 60 s.)
pub fn ca_retry_cap(secret: Option<&WorkloadSecret>, now: SystemTime) -> Duration {
    match secret.and_then(|s| s.expires.duration_since(now).ok()) {
        Some(left) => (left / 4).clamp(Duration::from_secs(1), Duration::from_secs(60)),
        None => RETRY_MAX_WITHOUT_CERTIFICATE,
    }
}

/// See [`ca_retry_cap`].
pub const RETRY_MAX_WITHOUT_CERTIFICATE: Duration = Duration::from_secs(5);

/// The handle of the running secret manager.
#[derive(Clone)]
pub struct SecretManager {
    rx: SecretWatch,
    last_error: LastError,
}

impl SecretManager {
    /// Starts the manager for `config`'s certificate source.
    pub fn start(config: Arc<Config>) -> Result<Self, SecretError> {
        let (tx, rx) = watch::channel(None);
        let last_error = LastError::default();
        match config.identity.cert_source.clone() {
            CertSource::Ca => {
                let client = CaClient::new(&config)?;
                tokio::spawn(run_ca(client, config, tx, last_error.clone()));
            }
            CertSource::Files {
                cert_chain,
                key,
                root,
            } => {
                tokio::spawn(run_files(
                    cert_chain,
                    key,
                    root,
                    config,
                    tx,
                    last_error.clone(),
                ));
            }
        }
        Ok(Self { rx, last_error })
    }

    /// [`check_certificate`] for the published certificate, now.
    pub fn check_certificate(&self) -> Result<(), CertificateError> {
        let secret = self.rx.borrow().clone();
        let last_error = lock(&self.last_error).clone();
        check_certificate(secret.as_deref(), last_error.as_deref(), SystemTime::now())
    }

    /// Subscribes to the secret.
    pub fn watch(&self) -> SecretWatch {
        self.rx.clone()
    }
}

async fn publish(
    tx: &watch::Sender<Option<Arc<WorkloadSecret>>>,
    secret: WorkloadSecret,
    config: &Config,
) {
    let secret = Arc::new(secret);
    if let Some(dir) = &config.identity.output_certs {
        // File writes and fsyncs: on the blocking pool.
        let (dir, written, mode) = (dir.clone(), secret.clone(), config.identity.output_mode);
        let result = tokio::task::spawn_blocking(move || {
            write_output(&dir, &written, mode).map_err(|e| (dir, e))
        })
        .await;
        match result {
            Ok(Ok(())) => {}
            Ok(Err((dir, e))) => {
                tracing::warn!(target: "cache", "cannot write certificates to {}: {e}", dir.display())
            }
            Err(e) => tracing::warn!(target: "cache", "writing certificates: {e}"),
        }
    }
    let root_changed = tx
        .borrow()
        .as_ref()
        .is_none_or(|old| old.root_pem != secret.root_pem);
    if root_changed {
        tracing::info!(target: "cache", "root certificate updated");
    }
    tx.send_replace(Some(secret));
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Holds a plain value: a panic elsewhere cannot leave it inconsistent.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn run_ca(
    client: CaClient,
    config: Arc<Config>,
    tx: watch::Sender<Option<Arc<WorkloadSecret>>>,
    last_error: LastError,
) {
    let mut backoff = Backoff::default();
    loop {
        match fetch_from_ca(&client, &config).await {
            Ok(secret) => {
                backoff.reset();
                *lock(&last_error) = None;
                let delay = rotation_delay(
                    secret.created,
                    secret.expires,
                    config.identity.grace_period_ratio,
                    config.identity.grace_period_ratio_jitter,
                    SystemTime::now(),
                );
                tracing::info!(
                    target: "cache",
                    "generated new workload certificate for {} serial={} expires in {}; rotating in {}",
                    config.identity.workload,
                    secret.serial,
                    common::duration::format(secret.expires.duration_since(SystemTime::now()).unwrap_or_default()),
                    common::duration::format(delay),
                );
                publish(&tx, secret, &config).await;
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(delay).await;
            }
            Err(e) => {
                *lock(&last_error) = Some(e.to_string());
                let current = tx.borrow().clone();
                let delay = backoff
                    .next_delay()
                    .min(ca_retry_cap(current.as_deref(), SystemTime::now()));
                let still_valid = current
                    .as_ref()
                    .and_then(|s| s.expires.duration_since(SystemTime::now()).ok());
                match still_valid {
                    Some(left) => tracing::warn!(
                        target: "cache",
                        "{e}; keeping the current certificate (valid for {} more), retrying in {}",
                        common::duration::format(left),
                        common::duration::format(delay)
                    ),
                    None => tracing::warn!(
                        target: "cache",
                        "{e}; no workload certificate yet, retrying in {}",
                        common::duration::format(delay)
                    ),
                }
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// File-mounted certificates: load, then reload when the files change. The
/// files are polled by content; Kubernetes secret volumes swap symlinks, which
/// a content check follows without special cases.
async fn run_files(
    cert_chain: PathBuf,
    key: PathBuf,
    root: PathBuf,
    config: Arc<Config>,
    tx: watch::Sender<Option<Arc<WorkloadSecret>>>,
    last_error: LastError,
) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
    let mut last: Option<(String, String)> = None;
    let mut ticker = tokio::time::interval(Duration::from_millis(500));
    loop {
        ticker.tick().await;
        if tx.is_closed() {
            return;
        }
        // The key alone changing does not push, as in Istio (only the cert and root are watched).
        let current = match (read(&cert_chain).await, read(&root).await) {
            (Ok(c), Ok(r)) => (c, r),
            (Err(e), _) | (_, Err(e)) => {
                if last.is_none() {
                    tracing::warn!(target: "cache", "{e}; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
                continue;
            }
        };
        if last.as_ref() == Some(&current) {
            continue;
        }
        match load_files(&cert_chain, &key, &root).await {
            Ok(secret) => {
                tracing::info!(target: "cache", "loaded workload certificate from {} serial={}", cert_chain.display(), secret.serial);
                last = Some(current);
                backoff.reset();
                *lock(&last_error) = None;
                publish(&tx, secret, &config).await;
            }
            Err(e) => {
                *lock(&last_error) = Some(e.to_string());
                tracing::warn!(target: "cache", "{e}; keeping the previous certificate");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn rotation_time_matches_istio_without_jitter() {
        // A one-hour certificate (TestRotateTimeNoJitter).
        let (c, e) = (at(0), at(3600));
        assert_eq!(
            rotation_delay(c, e, 0.5, 0.0, at(0)),
            Duration::from_secs(1800)
        );
        assert_eq!(
            rotation_delay(c, e, 0.25, 0.0, at(0)),
            Duration::from_secs(2700)
        );
        assert_eq!(
            rotation_delay(c, e, 0.75, 0.0, at(0)),
            Duration::from_secs(900)
        );
        assert_eq!(rotation_delay(c, e, 1.0, 0.0, at(0)), Duration::ZERO);
        assert_eq!(
            rotation_delay(c, e, 0.0, 0.0, at(0)),
            Duration::from_secs(3600)
        );
        assert_eq!(
            rotation_delay(c, e, 0.5, 0.0, at(4000)),
            Duration::ZERO,
            "expired"
        );
    }

    fn secret_expiring(at_secs: u64) -> WorkloadSecret {
        WorkloadSecret {
            cert_chain_pem: String::new(),
            key_pem: String::new(),
            root_pem: String::new(),
            serial: "ab12".into(),
            created: at(0),
            expires: at(at_secs),
        }
    }

    #[test]
    fn certificate_readiness_fails_once_expired_with_the_ca_error() {
        let s = secret_expiring(100);
        assert_eq!(check_certificate(None, Some("down"), at(500)), Ok(()));
        assert_eq!(check_certificate(Some(&s), Some("down"), at(99)), Ok(()));
        let err = check_certificate(
            Some(&s),
            Some("CSR to istiod:15012 failed: Unavailable: refused"),
            at(112),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("expired 12s ago"), "{err}");
        assert!(err.contains("serial ab12"), "{err}");
        assert!(
            err.contains("CA unreachable: CSR to istiod:15012 failed: Unavailable: refused"),
            "{err}"
        );
        let pending = check_certificate(Some(&s), None, at(100)).unwrap_err();
        assert!(pending.to_string().contains("renewal pending"), "{pending}");
    }

    #[test]
    fn ca_retries_are_bounded_by_the_remaining_life() {
        let s = secret_expiring(3600 * 24);
        assert_eq!(ca_retry_cap(Some(&s), at(0)), Duration::from_secs(60));
        let s = secret_expiring(20);
        assert_eq!(ca_retry_cap(Some(&s), at(0)), Duration::from_secs(5));
        assert_eq!(ca_retry_cap(Some(&s), at(18)), Duration::from_secs(1));
        assert_eq!(
            ca_retry_cap(Some(&s), at(30)),
            RETRY_MAX_WITHOUT_CERTIFICATE
        );
        assert_eq!(ca_retry_cap(None, at(0)), RETRY_MAX_WITHOUT_CERTIFICATE);
    }

    #[test]
    fn rotation_jitter_stays_in_range() {
        let (c, e) = (at(0), at(3600));
        for _ in 0..1000 {
            let d = rotation_delay(c, e, 0.5, 0.01, at(0)).as_secs_f64();
            assert!((1800.0 - 36.0..=1800.0 + 36.0).contains(&d), "{d}");
        }
    }

    mod rotation {
        //! The CA loop against the fake CA over an in-memory channel, with
        //! tokio's clock paused: hours of certificate life in milliseconds.

        use std::time::Duration;

        use common::testing::Transport;
        use common::testing::ca::FakeCa;
        use tokio::time::{Instant, sleep_until};

        use super::*;

        const HOUR: Duration = Duration::from_secs(3600);

        struct Rotating {
            ca: FakeCa,
            rx: SecretWatch,
            /// When the first certificate was published.
            start: Instant,
            task: tokio::task::JoinHandle<()>,
            dir: tempfile::TempDir,
        }

        /// Runs the CA loop for one-hour certificates rotating at `ratio`
        /// (± `jitter`) and waits for the first one.
        async fn rotating(ratio: f64, jitter: f64) -> Rotating {
            let ca = FakeCa::start(Transport::Plaintext).await.unwrap();
            let dir = tempfile::tempdir().unwrap();
            let token = dir.path().join("istio-token");
            std::fs::write(&token, "token").unwrap();
            let out = dir.path().join("out");
            let config = crate::test_support::config(|c| {
                c.identity.secret_ttl = HOUR;
                c.identity.grace_period_ratio = ratio;
                c.identity.grace_period_ratio_jitter = jitter;
                c.identity.key_type = KeyType::EcdsaP256;
                c.identity.token_path = token;
                c.identity.output_certs = Some(out);
            });
            let client = CaClient::with_channel(&config, ca.in_memory_channel()).unwrap();
            let (tx, mut rx) = watch::channel(None);
            let task = tokio::spawn(run_ca(client, config, tx, LastError::default()));
            rx.wait_for(Option::is_some).await.unwrap();
            Rotating {
                ca,
                rx,
                start: Instant::now(),
                task,
                dir,
            }
        }

        impl Rotating {
            /// The CSRs the CA has seen at `at` after the first certificate.
            async fn calls_at(&self, at: Duration) -> usize {
                sleep_until(self.start + at).await;
                self.ca.calls()
            }

            fn serial(&self) -> String {
                self.rx.borrow().as_ref().unwrap().serial.clone()
            }
        }

        impl Drop for Rotating {
            fn drop(&mut self) {
                self.task.abort();
            }
        }

        #[tokio::test(start_paused = true)]
        async fn the_certificate_is_renewed_when_the_grace_period_ratio_of_its_life_remains() {
            let r = rotating(0.5, 0.0).await;
            assert_eq!(r.ca.calls(), 1);
            let first = r.serial();
            // Half of an hour: renewed at 30 minutes, then every 30 minutes.
            let s = Duration::from_secs;
            assert_eq!(r.calls_at(s(1790)).await, 1);
            assert_eq!(r.serial(), first);
            assert_eq!(r.calls_at(s(1810)).await, 2);
            let second = r.serial();
            assert_ne!(second, first, "the renewed certificate is published");
            assert_eq!(r.calls_at(s(3590)).await, 2);
            assert_eq!(r.calls_at(s(3610)).await, 3);
            assert_ne!(r.serial(), second);
            // OUTPUT_CERTS follows each renewal.
            let written = std::fs::read_to_string(r.dir.path().join("out/cert-chain.pem")).unwrap();
            assert_eq!(written, r.rx.borrow().as_ref().unwrap().cert_chain_pem);
        }

        #[tokio::test(start_paused = true)]
        async fn a_lower_ratio_renews_later() {
            // Renew when a quarter of the life remains: at 45 minutes.
            let r = rotating(0.25, 0.0).await;
            let s = Duration::from_secs;
            assert_eq!(r.calls_at(s(2690)).await, 1);
            assert_eq!(r.calls_at(s(2710)).await, 2);
        }

        #[tokio::test(start_paused = true)]
        async fn jitter_moves_the_renewal_within_its_bounds() {
            // Istio's default jitter, 0.01 of the ratio: 30 minutes ± 36 s.
            let r = rotating(0.5, 0.01).await;
            let s = Duration::from_secs;
            assert_eq!(r.calls_at(s(1800 - 37)).await, 1);
            assert_eq!(r.calls_at(s(1800 + 37)).await, 2);
        }

        #[tokio::test(start_paused = true)]
        async fn a_failed_renewal_keeps_the_certificate_and_retries_with_backoff() {
            let r = rotating(0.5, 0.0).await;
            let first = r.serial();
            r.ca.fail_next(2, tonic::Code::Unavailable, "istiod is restarting");
            let s = Duration::from_secs;
            assert_eq!(r.calls_at(s(1799)).await, 1);
            // The renewal (due between 1799.5 s and 1800 s: the expiry is
            // whole seconds) fails twice, retried after Istio's backoff
            // (0.5 s, then 0.75 s, each ± 50 %): the third attempt comes
            // between 0.625 s and 1.875 s after the first.
            let calls = r.calls_at(Duration::from_millis(1_800_100)).await;
            assert!((2..=3).contains(&calls), "{calls} CSRs");
            assert_eq!(r.serial(), first, "the current certificate is kept");
            assert_eq!(r.calls_at(s(1802)).await, 4);
            assert_ne!(r.serial(), first);
        }

        #[tokio::test(start_paused = true)]
        async fn a_new_root_from_the_ca_is_published_at_the_next_renewal() {
            let r = rotating(0.5, 0.0).await;
            let old_root = r.ca.root_pem();
            assert_eq!(r.rx.borrow().as_ref().unwrap().root_pem, old_root);
            let new_root = r.ca.rotate_root().unwrap();
            // Nothing changes before the renewal...
            assert_eq!(r.calls_at(Duration::from_secs(1790)).await, 1);
            assert_eq!(r.rx.borrow().as_ref().unwrap().root_pem, old_root);
            // ...and the renewed secret carries the new root as its bundle.
            assert_eq!(r.calls_at(Duration::from_secs(1810)).await, 2);
            assert_eq!(r.rx.borrow().as_ref().unwrap().root_pem, new_root);
            let written = std::fs::read_to_string(r.dir.path().join("out/root-cert.pem")).unwrap();
            assert_eq!(written, new_root);
        }
    }

    #[test]
    fn concat_like_istio() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(split_chain(&s(&["a", "r"])), ("a".into(), "r".into()));
        assert_eq!(
            split_chain(&s(&["a", "b", "r"])),
            ("a\nb".into(), "r".into())
        );
        assert_eq!(
            split_chain(&s(&["a\n", "b", "r"])),
            ("a\nb".into(), "r".into())
        );
    }
}
