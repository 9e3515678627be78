//! One Gateway API test body on either of istiod's config sources: the
//! file source (a config directory istiod watches; status in
//! `/debug/configz`) or Kubernetes (the API stand-in; status written back
//! onto each object by istiod, as on a cluster). A test names its objects by
//! a file key: on files the key is a YAML file in the config directory, on
//! Kubernetes the objects of that YAML, created, merged or deleted through
//! the API as `kubectl apply -f` and `kubectl delete -f` would.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::kube_api::KubeApi;
use crate::mesh::LocalMesh;

/// Where istiod reads its config from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Files in a watched config directory.
    Files,
    /// The Kubernetes API (the stand-in), through `--kubeconfig`.
    Kube,
}

/// An object's place in the API: (apiVersion, kind, namespace, name).
type ObjectKey = (String, String, String, String);

/// The mesh and how its config is changed and its status read.
pub struct GatewayApiMesh {
    /// The running mesh.
    pub mesh: LocalMesh,
    /// The source it reads.
    pub source: Source,
    /// The objects applied under each file key (Kubernetes only).
    applied: RefCell<BTreeMap<String, Vec<ObjectKey>>>,
}

/// Istio's controller name: the route parents istiod writes.
const CONTROLLER_NAME: &str = "istio.io/gateway-controller";

fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("\n---")
        .map(|doc| serde_yaml_ng::from_str::<Value>(doc).expect("a YAML object"))
        .filter(|v| !v.is_null())
        .collect()
}

fn key_of(o: &Value) -> ObjectKey {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let ns = match o["metadata"]["namespace"].as_str() {
        Some(ns) => ns.to_string(),
        None if o["kind"] == "Namespace" => String::new(),
        None => "default".to_string(),
    };
    (
        s(&o["apiVersion"]),
        s(&o["kind"]),
        ns,
        s(&o["metadata"]["name"]),
    )
}

/// `Type=Status (Reason): message` per condition, with `prefix`.
fn condition_lines(prefix: &str, conditions: &Value, out: &mut Vec<String>) {
    for c in conditions.as_array().into_iter().flatten() {
        out.push(format!(
            "{prefix}{}={} ({}): {}",
            c["type"].as_str().unwrap_or_default(),
            c["status"].as_str().unwrap_or_default(),
            c["reason"].as_str().unwrap_or_default(),
            c["message"].as_str().unwrap_or_default(),
        ));
    }
}

/// The lines `/debug/configz` shows for an object's status, made from the
/// `status` istiod wrote onto it on Kubernetes, as a JSON array.
pub fn status_lines(status: &Value) -> String {
    let mut out = Vec::new();
    condition_lines("", &status["conditions"], &mut out);
    for l in status["listeners"].as_array().into_iter().flatten() {
        let prefix = format!(
            "listener {} ({} routes): ",
            l["name"].as_str().unwrap_or_default(),
            l["attachedRoutes"]
        );
        condition_lines(&prefix, &l["conditions"], &mut out);
    }
    for p in status["parents"].as_array().into_iter().flatten() {
        if p["controllerName"] != CONTROLLER_NAME {
            continue;
        }
        let r = &p["parentRef"];
        let ns = r["namespace"]
            .as_str()
            .map(|n| format!("{n}/"))
            .unwrap_or_default();
        let section = r["sectionName"]
            .as_str()
            .map(|s| format!(".{s}"))
            .unwrap_or_default();
        let prefix = format!(
            "parent {ns}{}{section}: ",
            r["name"].as_str().unwrap_or_default()
        );
        condition_lines(&prefix, &p["conditions"], &mut out);
    }
    serde_json::to_string(&out).unwrap_or_default()
}

impl GatewayApiMesh {
    /// Starts the sample mesh with istiod on `source`.
    pub fn start(source: Source, dir: &Path) -> GatewayApiMesh {
        let mesh = match source {
            Source::Files => LocalMesh::start(dir, &[]),
            Source::Kube => LocalMesh::start_kube(dir),
        };
        GatewayApiMesh {
            mesh,
            source,
            applied: RefCell::new(BTreeMap::new()),
        }
    }

    fn api(&self) -> &KubeApi {
        self.mesh.kube_api.as_ref().expect("istiod on Kubernetes")
    }

    /// Applies the objects of `yaml` under `file`: the file (re)written on
    /// files; on Kubernetes each object created or merged, and those the
    /// key held before but `yaml` no longer has deleted.
    pub fn apply(&self, file: &str, yaml: &str) {
        match self.source {
            Source::Files => crate::write_atomically(&self.mesh.config_dir.join(file), yaml),
            Source::Kube => {
                let objects = documents(yaml);
                let keys: Vec<ObjectKey> = objects.iter().map(key_of).collect();
                // Namespaces first, as `kubectl apply` orders them.
                let mut ordered: Vec<&Value> = objects.iter().collect();
                ordered.sort_by_key(|o| o["kind"] != "Namespace");
                for o in ordered {
                    self.api().apply(o.clone()).unwrap_or_else(|e| {
                        panic!("apply {:?}: {e:?}", key_of(o));
                    });
                }
                let before = self
                    .applied
                    .borrow_mut()
                    .insert(file.to_string(), keys.clone())
                    .unwrap_or_default();
                for gone in before.iter().filter(|k| !keys.contains(k)) {
                    self.delete(gone);
                }
            }
        }
    }

    fn delete(&self, (api_version, kind, ns, name): &ObjectKey) {
        self.api()
            .delete(api_version, kind, ns, name)
            .unwrap_or_else(|e| panic!("delete {kind} {ns}/{name}: {e:?}"));
    }

    /// Removes what `file` applied: the file, or its objects.
    pub fn remove(&self, file: &str) {
        match self.source {
            Source::Files => std::fs::remove_file(self.mesh.config_dir.join(file))
                .unwrap_or_else(|e| panic!("remove {file}: {e}")),
            Source::Kube => {
                let keys = self.applied.borrow_mut().remove(file).unwrap_or_default();
                for k in &keys {
                    self.delete(k);
                }
            }
        }
    }

    /// Removes every object of `kind` the sample holds (the files that
    /// carry them rewritten without them, or the objects deleted from the
    /// API): how many went.
    pub fn remove_sample_kind(&self, api_version: &str, kind: &str) -> usize {
        match self.source {
            Source::Files => {
                let mut removed = 0;
                let mut files: Vec<_> = std::fs::read_dir(&self.mesh.config_dir)
                    .expect("the config directory")
                    .flatten()
                    .map(|e| e.path())
                    .collect();
                files.sort();
                for path in files {
                    let text = std::fs::read_to_string(&path).expect("a config file");
                    let docs: Vec<&str> = text.split("\n---").collect();
                    let kept: Vec<&str> = docs
                        .iter()
                        .copied()
                        .filter(|doc| {
                            serde_yaml_ng::from_str::<Value>(doc)
                                .map_or(true, |v| v["kind"] != kind)
                        })
                        .collect();
                    if kept.len() != docs.len() {
                        removed += docs.len() - kept.len();
                        crate::write_atomically(&path, &kept.join("\n---"));
                    }
                }
                removed
            }
            Source::Kube => {
                let all = self.api().list(api_version, kind, None);
                for o in &all {
                    self.delete(&key_of(o));
                }
                all.len()
            }
        }
    }

    /// The status of `key` (`Kind/namespace/name`) as `/debug/configz`
    /// lines, JSON: from configz on files, from the object's `status` on
    /// Kubernetes.
    pub fn status(&self, key: &str) -> String {
        match self.source {
            Source::Files => self.mesh.gateway_api_status(key),
            Source::Kube => {
                let mut parts = key.splitn(3, '/');
                let (kind, ns, name) = (
                    parts.next().unwrap_or_default(),
                    parts.next().unwrap_or_default(),
                    parts.next().unwrap_or_default(),
                );
                let api_version = self
                    .applied
                    .borrow()
                    .values()
                    .flatten()
                    .find(|k| k.1 == kind && k.2 == ns && k.3 == name)
                    .map(|k| k.0.clone())
                    .unwrap_or_else(|| "gateway.networking.k8s.io/v1".to_string());
                let status = self
                    .api()
                    .get(&api_version, kind, ns, name)
                    .map(|o| o["status"].clone())
                    .unwrap_or(Value::Null);
                status_lines(&status)
            }
        }
    }

    /// Waits until the status of `key` holds every one of `expected`
    /// (istiod writes status after it translates; on Kubernetes a write
    /// is a request of its own): the status then.
    pub fn expect_status(&self, key: &str, expected: &[&str], wait: Duration) -> String {
        let start = std::time::Instant::now();
        loop {
            let status = self.status(key);
            if expected.iter().all(|e| status.contains(e)) {
                return status;
            }
            assert!(
                start.elapsed() < wait,
                "{key} ({:?}): expected {expected:?} within {wait:?}, status: {status}",
                self.source
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_status_reads_as_configz_lines() {
        let status = serde_json::json!({
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "ok"}],
            "listeners": [{"name": "https", "attachedRoutes": 1, "conditions": [
                {"type": "ResolvedRefs", "status": "False", "reason": "RefNotPermitted", "message": "m \"x\""}
            ]}],
        });
        let lines: Vec<String> = serde_json::from_str(&status_lines(&status)).unwrap();
        assert_eq!(
            lines,
            [
                "Accepted=True (Accepted): ok",
                "listener https (1 routes): ResolvedRefs=False (RefNotPermitted): m \"x\""
            ]
        );
        let route = serde_json::json!({"parents": [
            {"controllerName": "other.example/controller", "parentRef": {"name": "x"},
             "conditions": [{"type": "Accepted", "status": "True", "reason": "A", "message": ""}]},
            {"controllerName": CONTROLLER_NAME,
             "parentRef": {"name": "ingress", "namespace": "istio-system", "sectionName": "tls"},
             "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "fine"}]},
        ]});
        let lines: Vec<String> = serde_json::from_str(&status_lines(&route)).unwrap();
        assert_eq!(
            lines,
            ["parent istio-system/ingress.tls: Accepted=True (Accepted): fine"]
        );
    }
}
