//! Builds push contexts (Istio's `initPushContext`): one from the store's
//! snapshot per push, with the mesh config and JWKS in force, sharing the
//! XDS cache. It keeps the previous context and snapshot, so each push
//! knows what its batch changed ([`super::updates::resolve`]) and clears
//! the cache of it before the context is published.

use std::sync::Arc;

use tokio::sync::watch;

use super::updates::{self, Clear, Pending, Views};
use crate::jwks::JwksResolver;
use crate::mesh::Mesh;
use crate::model::service::RegistryOptions;
use crate::model::{ConfigStore, Snapshot};
use crate::pushctx::Updates;
use crate::pushctx::cache::XdsCache;
use crate::pushctx::context::IstioContext;

/// The push context builder.
pub struct Builder {
    store: ConfigStore,
    options: RegistryOptions,
    mesh: watch::Receiver<Arc<Mesh>>,
    jwks: Arc<JwksResolver>,
    cache: Arc<XdsCache>,
    previous: Option<(Arc<IstioContext>, Arc<Snapshot>)>,
}

impl Builder {
    /// A builder reading `store`, with the mesh config from `mesh`.
    pub fn new(
        store: ConfigStore,
        options: RegistryOptions,
        mesh: watch::Receiver<Arc<Mesh>>,
        jwks: Arc<JwksResolver>,
        cache: Arc<XdsCache>,
    ) -> Self {
        Self {
            store,
            options,
            mesh,
            jwks,
            cache,
            previous: None,
        }
    }

    fn context(&self, seq: u64, snapshot: &Snapshot) -> IstioContext {
        let mesh = self.mesh.borrow().config.clone();
        IstioContext::new(super::push_version(seq), snapshot, &self.options)
            .with_mesh(mesh)
            .with_jwks(self.jwks.clone())
            .with_cache(self.cache.clone(), seq)
    }

    /// The version of the snapshot the last context was built from.
    pub fn snapshot_version(&self) -> u64 {
        self.previous
            .as_ref()
            .map(|(_, s)| s.version())
            .unwrap_or(0)
    }

    /// The first context: everything is new, the cache starts empty.
    pub fn initial(&mut self, seq: u64) -> Arc<IstioContext> {
        let snapshot = self.store.snapshot();
        self.cache.clear_all(seq);
        let ctx = Arc::new(self.context(seq, &snapshot));
        self.previous = Some((ctx.clone(), snapshot));
        ctx
    }

    /// The context for push `seq` after the changes in `pending`, and what
    /// they mean for proxies. The cache is cleared of what they
    /// invalidated before the context is returned (and published).
    pub fn build(&mut self, seq: u64, pending: &Pending) -> (Arc<IstioContext>, Updates) {
        let Some((old, old_snapshot)) = self.previous.clone() else {
            return (self.initial(seq), Updates::everything());
        };
        let snapshot = self.store.snapshot();
        let ctx = Arc::new(self.context(seq, &snapshot));
        let (updates, clear) = updates::resolve(
            pending,
            &Views {
                old: &old,
                old_snapshot: &old_snapshot,
                new: &ctx,
                new_snapshot: &snapshot,
            },
        );
        match clear {
            Clear::All => self.cache.clear_all(seq),
            Clear::Some(dependencies) => self.cache.clear(&dependencies, seq),
        }
        self.previous = Some((ctx.clone(), snapshot));
        (ctx, updates)
    }
}
