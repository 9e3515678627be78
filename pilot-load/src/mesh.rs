//! The mesh a load run serves: services spread over namespaces, each with
//! its Pods and EndpointSlice, some with a VirtualService and a
//! DestinationRule, optionally a Sidecar per namespace, written as
//! Kubernetes-style YAML into istiod's `--configDir`, one file per service.
//! Changes rewrite one file at a time, atomically (a hidden temporary file
//! renamed over the old one, so istiod never reads half a file).

use std::fmt::Write as _;
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// The mesh's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// Services.
    pub services: usize,
    /// Namespaces the services are spread over (`ns-0`, `ns-1`, ...).
    pub namespaces: usize,
    /// Pods (endpoints) per service.
    pub pods_per_service: usize,
    /// A VirtualService for every n-th service (0: none).
    pub virtual_service_every: usize,
    /// A DestinationRule for every n-th service (0: none).
    pub destination_rule_every: usize,
    /// A Sidecar per namespace limiting each proxy to its namespace and
    /// `istio-system`.
    pub sidecars: bool,
}

impl Shape {
    /// Istio's published load-test shape: 1000 services, 2000 pods.
    pub fn istio_reference() -> Self {
        Self {
            services: 1000,
            namespaces: 10,
            pods_per_service: 2,
            virtual_service_every: 10,
            destination_rule_every: 10,
            sidecars: false,
        }
    }

    /// Every pod of the mesh.
    pub fn pods(&self) -> usize {
        self.services * self.pods_per_service
    }

    /// The namespace of service `s`.
    pub fn namespace(&self, s: usize) -> String {
        format!("ns-{}", s % self.namespaces.max(1))
    }

    /// The service a pod belongs to, and its index there.
    pub fn pod_service(&self, pod: usize) -> (usize, usize) {
        (
            pod / self.pods_per_service.max(1),
            pod % self.pods_per_service.max(1),
        )
    }

    /// Whether service `s` has a VirtualService.
    pub fn has_virtual_service(&self, s: usize) -> bool {
        self.virtual_service_every > 0 && s.is_multiple_of(self.virtual_service_every)
    }

    /// Whether service `s` has a DestinationRule.
    pub fn has_destination_rule(&self, s: usize) -> bool {
        self.destination_rule_every > 0 && s.is_multiple_of(self.destination_rule_every)
    }
}

/// A pod's address: 198.18.0.0/16, set aside for network tests; nothing is
/// ever sent to it.
pub fn pod_ip(pod: usize) -> Ipv4Addr {
    let n = pod as u32 + 1;
    Ipv4Addr::new(198, 18, (n >> 8) as u8, (n & 0xff) as u8)
}

/// A service's ClusterIP, in 198.19.0.0/16.
pub fn service_ip(s: usize) -> Ipv4Addr {
    let n = s as u32 + 1;
    Ipv4Addr::new(198, 19, (n >> 8) as u8, (n & 0xff) as u8)
}

/// What a rewrite of one service's file changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Revision {
    /// The Service's `load/revision` label.
    pub label: u32,
    /// The VirtualService's route timeout, in seconds.
    pub timeout: u32,
    /// Pod 0's IP is this pod index's instead of its own (an endpoint move).
    pub moved_to: Option<usize>,
}

fn service_docs(shape: &Shape, s: usize, rev: Revision) -> Vec<Value> {
    let ns = shape.namespace(s);
    let name = format!("svc-{s}");
    let mut docs = vec![json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {"app": name, "load/revision": rev.label.to_string()}},
        "spec": {"clusterIP": service_ip(s).to_string(),
                 "selector": {"app": name},
                 "ports": [{"name": "http", "port": 8000, "targetPort": 8080}]}
    })];
    let mut endpoints = Vec::new();
    for e in 0..shape.pods_per_service {
        let pod = s * shape.pods_per_service + e;
        let ip = match rev.moved_to {
            Some(m) if e == 0 => pod_ip(m),
            _ => pod_ip(pod),
        };
        let pod_name = format!("{name}-{e}");
        docs.push(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": ns,
                         "labels": {"app": name, "version": "v1",
                                    "security.istio.io/tlsMode": "istio"}},
            "spec": {"serviceAccountName": name,
                     "containers": [{"name": "app", "image": "app",
                                     "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": ip.to_string()}
        }));
        endpoints.push(json!({
            "addresses": [ip.to_string()], "conditions": {"ready": true},
            "targetRef": {"kind": "Pod", "namespace": ns, "name": pod_name}
        }));
    }
    docs.push(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-slice"), "namespace": ns,
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints
    }));
    if shape.has_virtual_service(s) {
        docs.push(json!({
            "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"hosts": [name],
                     "http": [{"route": [{"destination": {"host": name}}],
                               "timeout": format!("{}s", rev.timeout.max(1))}]}
        }));
    }
    if shape.has_destination_rule(s) {
        docs.push(json!({
            "apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"host": name,
                     "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 100}}}}
        }));
    }
    docs
}

fn sidecar_doc(ns: &str) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
        "metadata": {"name": "default", "namespace": ns},
        "spec": {"egress": [{"hosts": ["./*", "istio-system/*"]}]}
    })
}

/// Every object of the mesh at revision 0, as Kubernetes-style JSON
/// (what [`MeshDir::write`] writes, for benchmarks that load it in process).
pub fn documents(shape: &Shape) -> Vec<Value> {
    let mut docs: Vec<Value> = (0..shape.services)
        .flat_map(|s| service_docs(shape, s, Revision::default()))
        .collect();
    if shape.sidecars {
        docs.extend((0..shape.namespaces).map(|n| sidecar_doc(&format!("ns-{n}"))));
    }
    docs
}

/// JSON documents as one YAML stream (JSON is YAML).
fn yaml_stream(docs: &[Value]) -> String {
    let mut out = String::new();
    for d in docs {
        let _ = writeln!(out, "---\n{d}");
    }
    out
}

/// Writes `content` to `path` atomically: a hidden temporary file in the
/// same directory (istiod skips names starting with `.`), then a rename.
pub fn write_atomically(path: &Path, content: &str) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, path)
}

/// The mesh's files in one config directory.
#[derive(Debug, Clone)]
pub struct MeshDir {
    /// The directory.
    pub dir: PathBuf,
    /// The shape written there.
    pub shape: Shape,
}

impl MeshDir {
    /// The file of service `s`.
    pub fn service_file(&self, s: usize) -> PathBuf {
        self.dir
            .join(self.shape.namespace(s))
            .join(format!("svc-{s}.yaml"))
    }

    /// Writes the whole mesh (replacing what `dir` held of it).
    pub fn write(dir: &Path, shape: &Shape) -> io::Result<MeshDir> {
        let mesh = MeshDir {
            dir: dir.to_path_buf(),
            shape: shape.clone(),
        };
        for s in 0..shape.services {
            mesh.write_service(s, Revision::default())?;
        }
        for n in 0..shape.namespaces {
            let path = dir.join(format!("ns-{n}")).join("sidecar.yaml");
            if shape.sidecars {
                write_atomically(&path, &yaml_stream(&[sidecar_doc(&format!("ns-{n}"))]))?;
            } else if path.exists() {
                std::fs::remove_file(&path)?;
            }
        }
        Ok(mesh)
    }

    /// Rewrites service `s`'s file at revision `rev`.
    pub fn write_service(&self, s: usize, rev: Revision) -> io::Result<()> {
        write_atomically(
            &self.service_file(s),
            &yaml_stream(&service_docs(&self.shape, s, rev)),
        )
    }

    /// The first service with a VirtualService in namespace `ns_index`'s
    /// services (for the VirtualService edit), if any.
    pub fn virtual_service_in(&self, ns_index: usize) -> Option<usize> {
        (0..self.shape.services).find(|s| {
            s % self.shape.namespaces.max(1) == ns_index && self.shape.has_virtual_service(*s)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_stay_in_the_test_ranges_and_do_not_collide() {
        let shape = Shape::istio_reference();
        let pods: std::collections::HashSet<_> = (0..shape.pods()).map(pod_ip).collect();
        assert_eq!(pods.len(), shape.pods());
        assert!(pods.iter().all(|ip| ip.octets()[..2] == [198, 18]));
        assert!((0..shape.services).all(|s| service_ip(s).octets()[..2] == [198, 19]));
    }

    #[test]
    fn writes_one_file_per_service_and_a_sidecar_per_namespace() {
        let dir = std::env::temp_dir().join(format!("pilot-load-mesh-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let shape = Shape {
            services: 4,
            namespaces: 2,
            pods_per_service: 2,
            virtual_service_every: 2,
            destination_rule_every: 0,
            sidecars: true,
        };
        let mesh = MeshDir::write(&dir, &shape).unwrap();
        let text = std::fs::read_to_string(mesh.service_file(2)).unwrap();
        assert!(text.contains("\"kind\":\"VirtualService\""));
        assert!(text.contains("\"kind\":\"EndpointSlice\""));
        assert!(dir.join("ns-1/sidecar.yaml").exists());
        assert_eq!(mesh.virtual_service_in(0), Some(0));
        mesh.write_service(
            2,
            Revision {
                moved_to: Some(99),
                ..Default::default()
            },
        )
        .unwrap();
        let moved = std::fs::read_to_string(mesh.service_file(2)).unwrap();
        assert!(moved.contains(&pod_ip(99).to_string()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
