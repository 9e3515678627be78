//! The CA whose material can change while istiod runs (Istio's
//! `KeyCertBundle` behind `IstioCA`): the current signer, swapped whole when
//! the self-signed root rotates or the plug-in CA changes, and the trust
//! bundle (every root workloads must trust) published on a `watch` channel
//! to everything that hands the root out: the namespace controller
//! (`istio-ca-root-cert`), the webhook `caBundle` patcher, the CSR responses
//! (the agents' `ROOTCA`) and the :15012 client-certificate verifier.
//!
//! Overlap: when the material changes, roots of the previous material that
//! the new one does not carry stay in the published bundle for
//! `MAX_WORKLOAD_CERT_TTL` (the longest a certificate signed by the previous
//! material can live), so certificates issued before the change keep
//! verifying until they are renewed. Istio itself only serves the roots in
//! the new material (a plug-in change of root must list both roots in
//! `root-cert.pem` under `MULTI_ROOT_MESH`); the overlap here is kept in
//! memory only, so a restart during it ends it.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use common::pki;
use rustls_pki_types::CertificateDer;
use tokio::sync::watch;

use super::material::CaBundle;
use super::signer::{SignError, Signer};

/// A root kept after the material that carried it was replaced.
#[derive(Debug, Clone)]
struct Retired {
    cert: CertificateDer<'static>,
    until: Instant,
}

/// The current CA material and its published trust bundle.
pub struct Authority {
    current: RwLock<Arc<Signer>>,
    retired: Mutex<Vec<Retired>>,
    root_tx: watch::Sender<String>,
    default_ttl: Duration,
    max_ttl: Duration,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("signer", &self.signer())
            .finish_non_exhaustive()
    }
}

pub use super::material::merge_roots;

/// `bundle` with its root set widened by `extra` (its own roots first).
fn with_roots(mut bundle: CaBundle, extra: &[CertificateDer<'static>]) -> CaBundle {
    let merged = merge_roots(&bundle.roots, extra);
    if merged.len() != bundle.roots.len() {
        bundle.root_pem = pki::to_pem(&merged);
        bundle.roots = merged;
    }
    bundle
}

impl Authority {
    /// An authority signing with `bundle`, Istio's TTL rules applying.
    pub fn new(
        bundle: CaBundle,
        default_ttl: Duration,
        max_ttl: Duration,
    ) -> Result<Self, SignError> {
        let signer = Signer::new(bundle, default_ttl, max_ttl)?;
        let (root_tx, _) = watch::channel(signer.root_pem().to_string());
        Ok(Self {
            current: RwLock::new(Arc::new(signer)),
            retired: Mutex::new(Vec::new()),
            root_tx,
            default_ttl,
            max_ttl,
        })
    }

    /// The signer in use now.
    pub fn signer(&self) -> Arc<Signer> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The trust bundle (PEM) now, as `istio-ca-root-cert` carries it.
    pub fn root_pem(&self) -> String {
        self.root_tx.borrow().clone()
    }

    /// Follows the trust bundle (PEM).
    pub fn subscribe(&self) -> watch::Receiver<String> {
        self.root_tx.subscribe()
    }

    /// Signs from now on with `bundle`. Roots of the previous material that
    /// `bundle` lacks are kept trusted for `MAX_WORKLOAD_CERT_TTL`.
    pub fn replace(&self, bundle: CaBundle) -> Result<(), SignError> {
        let previous = self.signer();
        let until = Instant::now() + self.max_ttl;
        let extra = {
            let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
            for root in &previous.bundle().roots {
                if !bundle.roots.iter().any(|r| r.as_ref() == root.as_ref())
                    && !retired.iter().any(|r| r.cert.as_ref() == root.as_ref())
                {
                    retired.push(Retired {
                        cert: root.clone(),
                        until,
                    });
                }
            }
            retired.retain(|r| !bundle.roots.iter().any(|b| b.as_ref() == r.cert.as_ref()));
            retired.iter().map(|r| r.cert.clone()).collect::<Vec<_>>()
        };
        self.install(with_roots(bundle, &extra))
    }

    /// Swaps in `bundle` as is and publishes its roots.
    fn install(&self, bundle: CaBundle) -> Result<(), SignError> {
        let signer = Signer::new(bundle, self.default_ttl, self.max_ttl)?;
        let root_pem = signer.root_pem().to_string();
        tracing::info!(target: "ca", "the CA now signs with the {}; {} root(s) trusted", signer.bundle().source, signer.bundle().roots.len());
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(signer);
        self.root_tx.send_if_modified(|current| {
            let changed = *current != root_pem;
            *current = root_pem;
            changed
        });
        Ok(())
    }

    /// Stops trusting retired roots whose overlap is over; true if any went.
    pub fn prune(&self) -> Result<bool, SignError> {
        let now = Instant::now();
        let gone = {
            let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
            let before = retired.len();
            let (keep, gone): (Vec<_>, Vec<_>) = retired.drain(..).partition(|r| r.until > now);
            *retired = keep;
            debug_assert!(before >= gone.len());
            gone
        };
        if gone.is_empty() {
            return Ok(false);
        }
        let signer = self.signer();
        let bundle = signer.bundle();
        let roots: Vec<_> = bundle
            .roots
            .iter()
            .filter(|r| !gone.iter().any(|g| g.cert.as_ref() == r.as_ref()))
            .cloned()
            .collect();
        let pruned = CaBundle {
            signing_key: pki::key_from_pem("the CA key", &bundle.signing_key.serialize_pem())
                .map_err(|e| SignError::CertGen(e.to_string()))?,
            signing_cert: bundle.signing_cert.clone(),
            chain: bundle.chain.clone(),
            root_pem: pki::to_pem(&roots),
            roots,
            source: bundle.source.clone(),
        };
        self.install(pruned)?;
        tracing::info!(target: "ca", "{} previous root(s) are no longer trusted", gone.len());
        Ok(true)
    }

    /// Shortens the overlap of every retired root to `left` (tests).
    #[cfg(test)]
    fn expire_retired_in(&self, left: Duration) {
        let until = Instant::now() + left;
        for r in self.retired.lock().unwrap().iter_mut() {
            r.until = until;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::material::{SelfSignedOptions, load_or_create_self_signed};

    fn self_signed(dir: &std::path::Path) -> CaBundle {
        load_or_create_self_signed(
            dir,
            &SelfSignedOptions {
                trust_domain: "cluster.local".into(),
                ttl: Duration::from_secs(86400),
                rsa_key_size: 2048,
            },
        )
        .unwrap()
    }

    #[test]
    fn merged_roots_keep_order_and_drop_repeats() {
        let a = CertificateDer::from(vec![1u8]);
        let b = CertificateDer::from(vec![2u8]);
        let c = CertificateDer::from(vec![3u8]);
        let merged = merge_roots(&[b.clone(), a.clone()], &[a.clone(), c.clone(), b.clone()]);
        assert_eq!(merged, vec![b, a, c]);
    }

    #[test]
    fn a_replaced_root_stays_trusted_until_its_overlap_ends() {
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let first = self_signed(d1.path());
        let old_root = first.roots[0].clone();
        let second = self_signed(d2.path());
        let new_root = second.roots[0].clone();
        let authority =
            Authority::new(first, Duration::from_secs(3600), Duration::from_secs(7200)).unwrap();
        let mut rx = authority.subscribe();
        authority.replace(second).unwrap();
        assert!(rx.has_changed().unwrap(), "the new bundle is published");
        let published = pki::pem_certs("bundle", &rx.borrow_and_update()).unwrap();
        assert_eq!(published, vec![new_root.clone(), old_root.clone()]);
        // CSR responses carry the same bundle as their last element.
        assert_eq!(authority.signer().root_pem(), authority.root_pem());
        assert!(!authority.prune().unwrap(), "the overlap has not ended");
        authority.expire_retired_in(Duration::ZERO);
        assert!(authority.prune().unwrap());
        let published = pki::pem_certs("bundle", &rx.borrow_and_update()).unwrap();
        assert_eq!(published, vec![new_root]);
    }
}
