//! Several istiods on one Kubernetes API stand-in, as a Deployment with
//! replicas runs them: each in its own network namespace cabled to the hub
//! bridge (its own address, Istio's ports), each with its own `POD_NAME`
//! (`istiod-<i>`) and its own bearer token for the API (so the stand-in's
//! request record tells who wrote what).
//!
//! Pods find them as a cluster's DNS would hand out a headless Service's
//! addresses: `istiod.istio-system.svc` has one hosts line per replica.
//! glibc's `getaddrinfo` returns every line, and the agent's connector
//! (tokio's `TcpStream::connect` on `host:port`) tries them in order until
//! one accepts: while `istiod-0` runs every Pod uses it, and when it is gone
//! (its address refuses) they reconnect to the next. That is the failover
//! this harness tests; spreading load over replicas (kube-proxy's random
//! DNAT) is not modelled.
//!
//! The replicas share the CA root and the token issuer: `istiod-0` starts
//! first and creates `istio-ca-secret`, which the others read from the API;
//! they start from a copy of its token issuer (a cluster has one).

use std::path::Path;
use std::time::Duration;

use crate::mesh::{Hub, LocalMesh, PodNet};
use crate::{Istiod, wait_for};

/// Replica `i`'s address on the hub bridge.
pub fn replica_ip(i: usize) -> String {
    format!("198.18.254.{}", i + 1)
}

/// Replica `i`'s Pod name (its `POD_NAME`: its leader election identity).
pub fn replica_name(i: usize) -> String {
    format!("istiod-{i}")
}

/// The bearer token replica `i` sends to the API.
pub fn replica_bearer(i: usize) -> String {
    format!("{}-{}", crate::kube_api::TOKEN, replica_name(i))
}

/// The replicas beyond the first (which is [`LocalMesh::istiod`]), and
/// every replica's network.
pub struct Replicas {
    /// Replica `i`'s network namespace (index 0: the first replica's).
    pub nets: Vec<PodNet>,
    /// Replicas 1..n.
    pub others: Vec<Istiod>,
}

pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create a replica's directory");
    for e in std::fs::read_dir(from)
        .expect("read a directory to copy")
        .flatten()
    {
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy a file");
        }
    }
}

/// Starts `n` istiods reading the API of `kubeconfig`; Pods created on
/// `hub` afterwards resolve istiod to all of them.
pub fn start(hub: &mut Hub, kubeconfig: &Path, dir: &Path, n: usize) -> (Istiod, Replicas) {
    assert!(n >= 1, "at least one istiod");
    hub.istiod_ips = (0..n).map(replica_ip).collect();
    let text = std::fs::read_to_string(kubeconfig).expect("the API's kubeconfig");
    let mut nets = Vec::new();
    let mut istiods = Vec::new();
    let first_dir = dir.join(replica_name(0));
    for i in 0..n {
        let net = hub.pod(&replica_name(i), &replica_ip(i));
        let d = dir.join(replica_name(i));
        std::fs::create_dir_all(&d).expect("a replica's directory");
        if i > 0 {
            copy_dir(&first_dir.join("issuer"), &d.join("issuer"));
        }
        let kc = d.join("kubeconfig");
        let own = text.replace(crate::kube_api::TOKEN, &replica_bearer(i));
        std::fs::write(&kc, own).expect("write a replica's kubeconfig");
        let kc = kc.display().to_string();
        let name = replica_name(i);
        let istiod = Istiod::start_full(
            &d,
            "0.0.0.0:15012".parse().expect("an address"),
            &[("TEST_ISTIOD_KUBECONFIG", &kc), ("POD_NAME", &name)],
            Some(net.ns.name.clone()),
        );
        nets.push(net);
        istiods.push(istiod);
    }
    let mut istiods = istiods.into_iter();
    let first = istiods.next().expect("one istiod");
    (
        first,
        Replicas {
            nets,
            others: istiods.collect(),
        },
    )
}

/// Kills `istiod` with SIGKILL (no shutdown of any kind) and waits until
/// it is gone.
pub fn kill(istiod: &mut Istiod) {
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(istiod.proc.pid() as i32, libc::SIGKILL);
    }
    let proc = &mut istiod.proc;
    wait_for("the killed istiod to exit", Duration::from_secs(10), || {
        (!proc.alive()).then_some(())
    });
}

/// The proxies connected to `istiod`, which runs in `net` (its
/// `/debug/adsz`); empty when it does not answer.
pub fn clients(net: &PodNet, istiod: &Istiod) -> Vec<String> {
    let http = istiod.http;
    let answer = crate::netns::run_in(Some(&net.ns.name), move || {
        crate::http_get(http, "/debug/adsz")
    });
    let Ok((200, body)) = answer else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["clients"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c["proxy"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

impl LocalMesh {
    /// Replica `i` (0 is [`LocalMesh::istiod`]).
    pub fn replica(&mut self, i: usize) -> &mut Istiod {
        if i == 0 {
            return &mut self.istiod;
        }
        &mut self.replicas.as_mut().expect("a mesh with replicas").others[i - 1]
    }

    /// Replica `i`'s network.
    pub fn replica_net(&self, i: usize) -> &PodNet {
        &self.replicas.as_ref().expect("a mesh with replicas").nets[i]
    }

    /// How many istiods run (or ran) in this mesh.
    pub fn replica_count(&self) -> usize {
        1 + self.replicas.as_ref().map(|r| r.others.len()).unwrap_or(0)
    }

    /// Kills replica `i` with SIGKILL.
    pub fn kill_replica(&mut self, i: usize) {
        kill(self.replica(i));
    }

    /// The proxies connected to replica `i`.
    pub fn replica_clients(&mut self, i: usize) -> Vec<String> {
        let net = &self.replicas.as_ref().expect("a mesh with replicas").nets[i];
        let istiod = if i == 0 {
            &self.istiod
        } else {
            &self.replicas.as_ref().expect("a mesh with replicas").others[i - 1]
        };
        clients(net, istiod)
    }
}
