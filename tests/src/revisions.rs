//! Control-plane revisions on the Kubernetes API stand-in: the install of
//! the default revision (`manifests/istiod`) and of the `canary` overlay
//! (`manifests/revisions/canary`, rendered with `kubectl kustomize`), and
//! an istiod of a given `REVISION` that reads its mesh config, injector
//! ConfigMap and configuration from the API; and [`MeshRevision`], such an
//! istiod beside the sample mesh, with its own address on the hub that
//! Pods resolve `istiod-<revision>.istio-system.svc` to.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::kube_api::KubeApi;
use crate::mesh::{LocalMesh, PodNet};
use crate::{Istiod, Proc, bin, free_port, http_get, wait_for};

/// The repository's root.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests sits in the workspace")
        .to_path_buf()
}

/// The objects of `path` (a file, relative to the repository), as
/// `kubectl apply -f` reads them.
pub fn manifest_file(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(repo_root().join(path))
        .unwrap_or_else(|e| panic!("reading {path}: {e}"));
    istiod::inject::parse_yaml_documents(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `kubectl kustomize <dir>` (relative to the repository), as objects.
pub fn kustomize(dir: &str) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(repo_root().join(dir))
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run kubectl ({e}): install Debian's kubectl (scripts/setup.sh does)")
        });
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    istiod::inject::parse_yaml_documents(&String::from_utf8_lossy(&out.stdout))
        .unwrap_or_else(|e| panic!("kubectl kustomize {dir}: {e}"))
}

/// What istiod reads of a revision's install: its mesh and injector
/// ConfigMaps and its webhook configurations (the Deployment, Service and
/// RBAC have no meaning to the stand-in).
pub fn revision_objects(revision: &str) -> Vec<Value> {
    let docs = if revision == "default" {
        kustomize("manifests/istiod")
    } else {
        kustomize(&format!("manifests/revisions/{revision}"))
    };
    docs.into_iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some(
                    "ConfigMap" | "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration"
                )
            )
        })
        .collect()
}

/// An istiod of one revision on the stand-in: `--kubeconfig`, no mesh
/// config file (so the revision's `istio[-<rev>]` ConfigMap is read), and
/// `REVISION`.
pub struct RevisionIstiod {
    /// The process.
    pub proc: Proc,
    /// `REVISION`.
    pub revision: String,
    /// `--httpAddr` (`/ready`, `/debug/configz`).
    pub http: SocketAddr,
    /// `--httpsAddr` (the webhooks).
    pub https: SocketAddr,
}

impl RevisionIstiod {
    /// Starts istiod of `revision` in `dir` against `api`, and waits for
    /// `/ready`.
    pub fn start(api: &KubeApi, dir: &Path, revision: &str) -> RevisionIstiod {
        std::fs::create_dir_all(dir).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        api.kubeconfig(&kubeconfig);
        let addr = || -> SocketAddr { format!("127.0.0.1:{}", free_port()).parse().unwrap() };
        let (http, https, secure, monitoring) = (addr(), addr(), addr(), addr());
        let mut cmd = Command::new(bin("istiod"));
        cmd.current_dir(dir)
            .arg("discovery")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!(
                "--meshConfig={}",
                dir.join("no-mesh-file").display()
            ))
            .arg(format!("--httpAddr={http}"))
            .arg(format!("--httpsAddr={https}"))
            .arg(format!("--secureGRPCAddr={secure}"))
            .arg(format!("--monitoringAddr={monitoring}"))
            .arg("--grpcAddr=")
            .env("POD_NAMESPACE", "istio-system")
            .env("REVISION", revision)
            .env("PILOT_DEBOUNCE_AFTER", "20ms");
        let mut proc = Proc::spawn(
            &format!("istiod-{revision}"),
            cmd,
            &dir.join(format!("istiod-{revision}.log")),
        );
        wait_for(
            &format!("istiod {revision} /ready"),
            Duration::from_secs(60),
            || {
                assert!(proc.alive(), "istiod {revision} exited:\n{}", proc.log());
                matches!(http_get(http, "/ready"), Ok((200, _))).then_some(())
            },
        );
        RevisionIstiod {
            proc,
            revision: revision.to_string(),
            http,
            https,
        }
    }

    /// The keys (`Kind/namespace/name`) of the objects in istiod's store,
    /// from `/debug/configz`.
    pub fn config_keys(&self) -> Vec<String> {
        let Ok((200, body)) = http_get(self.http, "/debug/configz") else {
            return Vec::new();
        };
        let c: Value = serde_json::from_str(&body).unwrap_or_default();
        c["objects"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|o| o.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits until istiod's store holds every key of `present` and none of
    /// `absent`.
    pub fn wait_config(&self, present: &[String], absent: &[String]) {
        wait_for(
            &format!(
                "istiod {} to hold {present:?} and not {absent:?}",
                self.revision
            ),
            Duration::from_secs(30),
            || {
                let keys = self.config_keys();
                let has = |k: &String| keys.contains(k);
                (present.iter().all(has) && !absent.iter().any(has)).then_some(())
            },
        );
    }
}

/// An istiod of another revision beside a [`LocalMesh`] on the stand-in
/// (started after the mesh's, so it reads the mesh's `istio-ca-secret`
/// and both share the root): in its own network namespace on the hub with
/// its own address, which Pods created afterwards resolve
/// `istiod-<revision>.istio-system.svc` to, as the revision's Service.
pub struct MeshRevision {
    /// The istiod.
    pub istiod: Istiod,
    /// Its network namespace.
    pub net: PodNet,
    /// `REVISION`.
    pub revision: String,
}

impl MeshRevision {
    /// Starts istiod with `REVISION=revision` at `ip` on the mesh's hub,
    /// reading the mesh's API with the mesh's token issuer.
    pub fn start(mesh: &mut LocalMesh, revision: &str, ip: &str) -> MeshRevision {
        let name = format!("istiod-{revision}");
        let net = mesh.hub.pod(&name, ip);
        let dir = mesh.dir.join(&name);
        crate::replicas::copy_dir(&mesh.istiod.issuer_dir, &dir.join("issuer"));
        let kubeconfig = mesh.dir.join("kubeconfig").display().to_string();
        let pod_name = format!("{name}-0");
        let istiod = Istiod::start_full(
            &dir,
            "0.0.0.0:15012".parse().expect("an address"),
            &[
                ("TEST_ISTIOD_KUBECONFIG", &kubeconfig),
                ("REVISION", revision),
                ("POD_NAME", &pod_name),
            ],
            Some(net.ns.name.clone()),
        );
        mesh.hub
            .extra_hosts
            .push(format!("{ip} {}", Self::service_host(revision)));
        MeshRevision {
            istiod,
            net,
            revision: revision.to_string(),
        }
    }

    /// The revision's Service name, as its injection gives it to proxies.
    pub fn service_host(revision: &str) -> String {
        format!("istiod-{revision}.istio-system.svc")
    }

    /// The proxies connected to this istiod (its `/debug/adsz`).
    pub fn clients(&self) -> Vec<String> {
        adsz_clients(Some(&self.net.ns.name), self.istiod.http)
    }
}

/// The proxy IDs in `/debug/adsz` of the istiod whose HTTP address is
/// `http` in network namespace `netns`; empty when it does not answer.
pub fn adsz_clients(netns: Option<&str>, http: SocketAddr) -> Vec<String> {
    let Ok((200, body)) = crate::netns::run_in(netns, move || http_get(http, "/debug/adsz")) else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&body).unwrap_or_default();
    v["clients"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c["proxy"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}
