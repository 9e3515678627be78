//! Istio's `networking.istio.io/v1beta1` ProxyConfig and the merge Istio
//! applies to it (`pilot/pkg/model/proxy_config.go`, `EffectiveProxyConfig`):
//! mesh `defaultConfig` < the root namespace's ProxyConfig < the workload's
//! namespace's ProxyConfig < (the Pod's `proxy.istio.io/config` annotation <
//! the ProxyConfig selecting the workload). In each namespace the oldest
//! object without a selector is the namespace-wide one, and the oldest whose
//! selector matches the workload's labels is the workload's one.
//!
//! A ProxyConfig sets three fields of the mesh's `ProxyConfig`: `concurrency`,
//! `environmentVariables` (as `proxyMetadata`) and `image`. The injector
//! applies the result (the `PROXY_CONFIG` the agent reads, the proxy's
//! environment and image), as Istio's does.

use serde_json::{Map, Value};

use super::ROOT_NAMESPACE;
use super::istio::Labels;
use super::store::{Snapshot, Typed};

pub mod spec;

pub use spec::ProxyConfig;

/// The ProxyConfig objects of a snapshot that apply to one workload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadProxyConfig {
    /// The root namespace's and then the workload namespace's namespace-wide
    /// objects, merged (they go under the Pod's annotation).
    pub namespace: Map<String, Value>,
    /// The object selecting the workload (it goes over the Pod's annotation).
    pub workload: Map<String, Value>,
}

impl WorkloadProxyConfig {
    /// The ProxyConfig objects in `snapshot` for a workload in `namespace`
    /// with `labels`.
    pub fn lookup(snapshot: &Snapshot, namespace: &str, labels: &Labels) -> Self {
        let mut by_age: Vec<Typed<'_, ProxyConfig>> = snapshot.list::<ProxyConfig>().collect();
        // Istio's `sortConfigByCreationTime`: oldest first, then by name.
        by_age.sort_by(|a, b| {
            let key = |t: &Typed<'_, ProxyConfig>| {
                (
                    t.object.metadata.creation_timestamp.is_none(),
                    t.object.metadata.creation_timestamp.clone(),
                    t.name().to_string(),
                    t.namespace().to_string(),
                )
            };
            key(a).cmp(&key(b))
        });
        let namespace_wide = |ns: &str| {
            by_age
                .iter()
                .find(|t| t.namespace() == ns && t.spec.is_namespace_wide())
                .map(|t| t.spec.to_mesh_proxy_config())
        };
        let mut merged = Value::Object(Map::new());
        if let Some(root) = namespace_wide(ROOT_NAMESPACE) {
            deep_merge(&mut merged, &Value::Object(root));
        }
        if namespace != ROOT_NAMESPACE
            && let Some(ns) = namespace_wide(namespace)
        {
            deep_merge(&mut merged, &Value::Object(ns));
        }
        let workload = by_age
            .iter()
            .find(|t| t.namespace() == namespace && t.spec.selects(labels))
            .map(|t| t.spec.to_mesh_proxy_config())
            .unwrap_or_default();
        Self {
            namespace: match merged {
                Value::Object(m) => m,
                _ => Map::new(),
            },
            workload,
        }
    }

    /// The effective ProxyConfig: `default_config` (the mesh's), the
    /// namespace-wide objects, `annotation` (the Pod's
    /// `proxy.istio.io/config`, already parsed) and the workload's object, each
    /// merged over the one before.
    pub fn effective(
        &self,
        default_config: &Map<String, Value>,
        annotation: Option<&Value>,
    ) -> Map<String, Value> {
        let mut pc = Value::Object(default_config.clone());
        deep_merge(&mut pc, &Value::Object(self.namespace.clone()));
        if let Some(a) = annotation {
            deep_merge(&mut pc, a);
        }
        deep_merge(&mut pc, &Value::Object(self.workload.clone()));
        match pc {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }
}

/// Merges `overlay` over `target` as a ProxyConfig merge does: messages and
/// maps (`proxyMetadata`) field by field, other values replaced.
pub fn deep_merge(target: &mut Value, overlay: &Value) {
    match (target, overlay) {
        (Value::Object(t), Value::Object(o)) => {
            for (k, v) in o {
                match t.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        deep_merge(existing, v)
                    }
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (t, o) => *t = o.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ConfigStore, Update, parse_file};
    use serde_json::json;
    use std::sync::Arc;

    fn snapshot(yaml: &str) -> Arc<Snapshot> {
        let parsed = parse_file("pc.yaml", yaml).unwrap();
        let store = ConfigStore::new();
        store.apply(
            parsed
                .objects
                .into_iter()
                .map(|o| Update::Upsert(Arc::new(o))),
        );
        store.snapshot()
    }

    const OBJECTS: &str = "\
apiVersion: networking.istio.io/v1beta1
kind: ProxyConfig
metadata: {name: mesh, namespace: istio-system}
spec: {concurrency: 4, environmentVariables: {A: root, B: root}}
---
apiVersion: networking.istio.io/v1beta1
kind: ProxyConfig
metadata: {name: ns, namespace: demo}
spec: {concurrency: 3, environmentVariables: {B: ns}, image: {imageType: debug}}
---
apiVersion: networking.istio.io/v1beta1
kind: ProxyConfig
metadata: {name: one, namespace: demo, creationTimestamp: '2024-01-01T00:00:00Z'}
spec: {selector: {matchLabels: {app: sleep}}, concurrency: 1}
---
apiVersion: networking.istio.io/v1beta1
kind: ProxyConfig
metadata: {name: two, namespace: demo, creationTimestamp: '2025-01-01T00:00:00Z'}
spec: {selector: {matchLabels: {app: sleep}}, concurrency: 2}
";

    fn labels(app: &str) -> Labels {
        Labels::from([("app".to_string(), app.to_string())])
    }

    #[test]
    fn root_then_namespace_then_annotation_then_workload() {
        let snap = snapshot(OBJECTS);
        let default =
            json!({"concurrency": 8, "proxyMetadata": {"M": "mesh"}, "drainDuration": "5s"});
        let default = default.as_object().unwrap();

        // The selected workload: the oldest matching object wins, and it is
        // above the annotation.
        let pc = WorkloadProxyConfig::lookup(&snap, "demo", &labels("sleep"));
        let annotation = json!({"concurrency": 7, "image": {"imageType": "distroless"}});
        let eff = pc.effective(default, Some(&annotation));
        assert_eq!(eff["concurrency"], 1);
        assert_eq!(eff["image"]["imageType"], "distroless");
        assert_eq!(
            eff["proxyMetadata"],
            json!({"M": "mesh", "A": "root", "B": "ns"})
        );
        assert_eq!(eff["drainDuration"], "5s");

        // Another workload of the namespace: the namespace's object, then
        // the annotation over it.
        let pc = WorkloadProxyConfig::lookup(&snap, "demo", &labels("httpbin"));
        assert_eq!(pc.effective(default, None)["concurrency"], 3);
        assert_eq!(pc.effective(default, Some(&annotation))["concurrency"], 7);

        // Another namespace: the root's.
        let pc = WorkloadProxyConfig::lookup(&snap, "other", &labels("sleep"));
        let eff = pc.effective(default, None);
        assert_eq!(eff["concurrency"], 4);
        assert!(eff.get("image").is_none());
    }

    #[test]
    fn nothing_applies_without_objects() {
        let snap = snapshot("apiVersion: v1\nkind: Namespace\nmetadata: {name: demo}\n");
        let pc = WorkloadProxyConfig::lookup(&snap, "demo", &labels("sleep"));
        assert_eq!(pc, WorkloadProxyConfig::default());
        let default = json!({"concurrency": 2});
        assert_eq!(
            pc.effective(default.as_object().unwrap(), None)["concurrency"],
            2
        );
    }
}
