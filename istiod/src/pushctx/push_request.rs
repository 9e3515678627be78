//! What a push tells the streams (Istio's `PushRequest`): the new push
//! context, and what changed, each change with the proxies it can reach
//! and the xDS types it can alter (Istio's `ConfigsUpdated` with the
//! generators' `…NeedsPush` tables). A stream turns that into a
//! [`PushPlan`] for its proxy: which types to send, and for EDS whether
//! only some hosts' clusters.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use common::xds::{
    CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, NAME_TABLE_TYPE, ROUTE_TYPE, SECRET_TYPE,
};

use super::PushContext;
use crate::model::service::ExportTo;

/// A set of the xDS types a push can send.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Types(u8);

impl Types {
    /// Nothing.
    pub const NONE: Types = Types(0);
    /// Clusters.
    pub const CDS: Types = Types(1);
    /// Load assignments.
    pub const EDS: Types = Types(2);
    /// Listeners.
    pub const LDS: Types = Types(4);
    /// Route configurations.
    pub const RDS: Types = Types(8);
    /// The DNS name table.
    pub const NDS: Types = Types(16);
    /// Gateway credentials (SDS over ADS).
    pub const SDS: Types = Types(32);
    /// Every type.
    pub const ALL: Types = Types(63);

    /// The bit of one type URL (none for types no generator serves).
    pub fn of(type_url: &str) -> Types {
        match type_url {
            CLUSTER_TYPE => Types::CDS,
            ENDPOINT_TYPE => Types::EDS,
            LISTENER_TYPE => Types::LDS,
            ROUTE_TYPE => Types::RDS,
            NAME_TABLE_TYPE => Types::NDS,
            SECRET_TYPE => Types::SDS,
            _ => Types::NONE,
        }
    }

    /// Whether the set holds `type_url`. Types no generator knows are
    /// pushed with everything else.
    pub fn has(self, type_url: &str) -> bool {
        match Types::of(type_url) {
            Types::NONE => self == Types::ALL,
            t => self.0 & t.0 != 0,
        }
    }

    /// Whether the set holds every type of `other`.
    pub fn contains(self, other: Types) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for Types {
    type Output = Types;
    fn bitor(self, rhs: Types) -> Types {
        Types(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for Types {
    fn bitor_assign(&mut self, rhs: Types) {
        self.0 |= rhs.0;
    }
}

/// A service as a change saw it (before or after), enough to tell who
/// could see it even once it is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    /// Its host name.
    pub hostname: String,
    /// The namespace that defines it.
    pub namespace: String,
    /// Its visibility.
    pub export_to: ExportTo,
}

/// Which proxies a change reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Audience {
    /// Every proxy.
    All,
    /// The proxies in this namespace.
    Namespace(String),
    /// The proxies that can see one of these services.
    Services(Vec<ServiceRef>),
    /// The proxies that can see a service defined in this namespace (a
    /// PeerAuthentication's effect on clients' auto mTLS).
    ServiceNamespace(String),
    /// The proxies a config object of `namespace` is exported to that can
    /// see a service matching one of its hosts (VirtualService,
    /// DestinationRule).
    Hosts {
        /// The config's namespace.
        namespace: String,
        /// Its `exportTo`.
        export_to: Vec<String>,
        /// Its hosts, resolved to full names (wildcards kept).
        hosts: Vec<String>,
    },
    /// The proxies at these IPs: their own workload changed.
    Workloads(BTreeSet<String>),
    /// Every gateway (`router` proxy): a Gateway, or a VirtualService
    /// that binds to gateways.
    Routers,
    /// The proxies allowed to read this Secret (those of its namespace,
    /// Istio's default authorization); of them, only those that watch it
    /// get it (see [`PushPlan::secrets`]).
    Secret {
        /// The Secret's namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
}

/// One change of a push: who it reaches and what it alters there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// What changed, for logs (`Kind/namespace/name`).
    pub reason: String,
    /// The proxies it reaches.
    pub audience: Audience,
    /// The types it alters.
    pub types: Types,
    /// For EDS, only these hosts' clusters; `None`: every cluster.
    pub eds_hosts: Option<BTreeSet<String>>,
}

/// What one push is about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Updates {
    /// Anything may have changed (mesh config, a Namespace, a lost event):
    /// every proxy gets every type (Istio's forced push).
    pub everything: bool,
    /// The changes, when not everything.
    pub changes: Vec<Change>,
}

impl Updates {
    /// A push of everything to everyone.
    pub fn everything() -> Self {
        Self {
            everything: true,
            changes: Vec::new(),
        }
    }

    /// An endpoint-only push for `hosts`, reaching every proxy (tests, and
    /// push contexts that do not know scopes).
    pub fn eds(hosts: impl IntoIterator<Item = String>) -> Self {
        Self {
            everything: false,
            changes: vec![Change {
                reason: "endpoints".into(),
                audience: Audience::All,
                types: Types::EDS,
                eds_hosts: Some(hosts.into_iter().collect()),
            }],
        }
    }
}

/// What one proxy gets from a push.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushPlan {
    /// The types to send.
    pub types: Types,
    /// For EDS, only the clusters of these hosts; `None`: every cluster.
    pub eds_hosts: Option<BTreeSet<String>>,
    /// For SDS, only the watched resources naming these Secrets
    /// (`namespace/name`); `None`: every watched resource.
    pub secrets: Option<BTreeSet<String>>,
}

impl PushPlan {
    /// Every type, in full.
    pub fn everything() -> Self {
        Self {
            types: Types::ALL,
            eds_hosts: None,
            secrets: None,
        }
    }

    /// Adds a change of one Secret (`namespace/name`): SDS, for the
    /// resources naming it only (unless every resource is sent already).
    pub fn add_secret(&mut self, secret: String) {
        self.secrets = match (self.types.contains(Types::SDS), self.secrets.take()) {
            (false, _) => Some(BTreeSet::from([secret])),
            (true, None) => None,
            (true, Some(mut set)) => {
                set.insert(secret);
                Some(set)
            }
        };
        self.types |= Types::SDS;
    }

    /// Adds one change's effect. Changed clusters take their endpoints
    /// with them: a cluster updated by CDS warms until EDS sends its
    /// endpoints again (envoy#13009), so CDS brings all of EDS.
    pub fn add(&mut self, types: Types, eds_hosts: Option<&BTreeSet<String>>) {
        let mut types = types;
        let mut eds_hosts = eds_hosts;
        if types.contains(Types::CDS) {
            types |= Types::EDS;
            eds_hosts = None;
        }
        if types.contains(Types::SDS) {
            self.secrets = None;
        }
        if types.contains(Types::EDS) {
            self.eds_hosts = match (self.types.contains(Types::EDS), &self.eds_hosts, eds_hosts) {
                (false, _, hosts) => hosts.cloned(),
                (true, None, _) | (true, _, None) => None,
                (true, Some(a), Some(b)) => Some(a.union(b).cloned().collect()),
            };
        }
        self.types |= types;
    }

    /// Whether nothing is sent.
    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }

    /// Whether this is only some hosts' endpoints (`PUSH INC` in logs).
    pub fn incremental(&self) -> bool {
        self.types == Types::EDS && self.eds_hosts.is_some()
    }
}

/// The plan of a push context that cannot tell who sees what: every change
/// reaches every proxy.
pub fn plan_without_scopes(updates: &[Arc<Updates>]) -> PushPlan {
    let mut plan = PushPlan::default();
    for u in updates {
        if u.everything {
            return PushPlan::everything();
        }
        for c in &u.changes {
            match &c.audience {
                Audience::Secret { namespace, name } => {
                    plan.add_secret(format!("{namespace}/{name}"))
                }
                _ => plan.add(c.types, c.eds_hosts.as_ref()),
            }
        }
    }
    plan
}

/// How many recent pushes a stream can catch up with; one further behind
/// gets everything.
pub const HISTORY: usize = 64;

/// A push, as published to every stream.
#[derive(Clone)]
pub struct PushRequest {
    /// Monotonic push sequence number.
    pub seq: u64,
    /// The context to generate from.
    pub ctx: Arc<dyn PushContext>,
    /// What changed in this push.
    pub updates: Arc<Updates>,
    /// The updates of the last [`HISTORY`] pushes, this one included, oldest first.
    recent: Arc<VecDeque<(u64, Arc<Updates>)>>,
    /// When the first change of this push happened (for convergence time).
    pub start: Instant,
}

impl PushRequest {
    /// A push with no history before it (the first, or a test's).
    pub fn new(seq: u64, ctx: Arc<dyn PushContext>, updates: Updates, start: Instant) -> Self {
        let updates = Arc::new(updates);
        Self {
            seq,
            ctx,
            recent: Arc::new(VecDeque::from([(seq, updates.clone())])),
            updates,
            start,
        }
    }

    /// The next push after `self`, remembering `self`'s history.
    pub fn next(
        &self,
        seq: u64,
        ctx: Arc<dyn PushContext>,
        updates: Updates,
        start: Instant,
    ) -> Self {
        let updates = Arc::new(updates);
        let mut recent = (*self.recent).clone();
        recent.push_back((seq, updates.clone()));
        while recent.len() > HISTORY {
            recent.pop_front();
        }
        Self {
            seq,
            ctx,
            updates,
            recent: Arc::new(recent),
            start,
        }
    }

    /// The updates of every push after `seen` up to this one; `None` when
    /// some are no longer known (the stream must take everything).
    pub fn updates_since(&self, seen: u64) -> Option<Vec<Arc<Updates>>> {
        if seen >= self.seq {
            return Some(Vec::new());
        }
        let first = self.recent.front().map(|(s, _)| *s)?;
        if first > seen + 1 {
            return None;
        }
        Some(
            self.recent
                .iter()
                .filter(|(s, _)| *s > seen)
                .map(|(_, u)| u.clone())
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(h: &[&str]) -> BTreeSet<String> {
        h.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn plans_merge_endpoint_hosts_and_cds_brings_all_endpoints() {
        let mut p = PushPlan::default();
        p.add(Types::EDS, Some(&hosts(&["a"])));
        p.add(Types::EDS, Some(&hosts(&["b"])));
        assert!(p.incremental());
        assert_eq!(p.eds_hosts, Some(hosts(&["a", "b"])));
        p.add(Types::RDS, None);
        assert!(!p.incremental());
        assert_eq!(p.eds_hosts, Some(hosts(&["a", "b"])));
        p.add(Types::CDS, None);
        assert!(p.types.contains(Types::CDS | Types::EDS | Types::RDS));
        assert_eq!(p.eds_hosts, None);
        // Once every cluster, always every cluster.
        p.add(Types::EDS, Some(&hosts(&["c"])));
        assert_eq!(p.eds_hosts, None);
    }

    #[test]
    fn types_outside_the_generators_go_with_everything_only() {
        assert!(Types::ALL.has("type.googleapis.com/other"));
        assert!(!(Types::CDS | Types::EDS).has("type.googleapis.com/other"));
        assert!((Types::CDS | Types::EDS).has(ENDPOINT_TYPE));
        assert!(!Types::EDS.has(CLUSTER_TYPE));
    }

    #[test]
    fn secrets_narrow_sds_until_everything_is_sent() {
        let mut p = PushPlan::default();
        p.add_secret("ns/a".into());
        p.add_secret("ns/b".into());
        assert_eq!(p.types, Types::SDS);
        assert_eq!(p.secrets, Some(hosts(&["ns/a", "ns/b"])));
        p.add(Types::ALL, None);
        assert_eq!(p.secrets, None);
        p.add_secret("ns/c".into());
        assert_eq!(
            p.secrets, None,
            "once every resource, always every resource"
        );
        assert!(Types::SDS.has(SECRET_TYPE) && !Types::SDS.has(CLUSTER_TYPE));
    }
}
