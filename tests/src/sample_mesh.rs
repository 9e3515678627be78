//! istiod on its sample mesh (`istiod/samples/mesh`) with the `sleep` Pod's
//! agent and Envoy in one network namespace: the setup the tests of istiod's
//! pushes through the agent share.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::netns::Netns;
use crate::{Istiod, PodDir, Proc, http_get, wait_for};

/// The running sample mesh; dropping it stops istiod, the agent and Envoy.
///
/// Fields drop in declaration order: the network namespace first, then the
/// processes, then the files they used.
pub struct SampleMesh {
    /// The network namespace istiod and the Pod share.
    pub ns: Netns,
    /// istiod, watching `config`.
    pub istiod: Istiod,
    /// istiod's config directory, a copy of the sample mesh a test may change.
    pub config: PathBuf,
    /// The `sleep` Pod's filesystem.
    pub pod: PodDir,
    /// The `sleep` Pod's agent (which runs its Envoy).
    pub agent: Proc,
    /// Holds the config, istiod's and the Pod's directories.
    _tmp: tempfile::TempDir,
}

/// Copies the files directly in `from` into `to` (created if missing).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

impl SampleMesh {
    /// Starts istiod on a copy of the sample mesh and the `sleep` Pod's agent
    /// in a new network namespace named after `netns_prefix`, and waits until
    /// Envoy is ready with istiod's config.
    pub fn start(netns_prefix: &str) -> SampleMesh {
        Self::start_with(netns_prefix, &[])
    }

    /// [`SampleMesh::start`] with extra environment for istiod (say
    /// `TEST_ISTIOD_PLAINTEXT_ADDR` to open the plaintext xDS port).
    pub fn start_with(netns_prefix: &str, istiod_env: &[(&str, &str)]) -> SampleMesh {
        let tmp = tempfile::tempdir().unwrap();
        let config = tmp.path().join("config");
        copy_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../istiod/samples/mesh"),
            &config,
        );
        let ns = Netns::new(netns_prefix);
        let istiod = Istiod::start_with_config(
            &ns,
            &tmp.path().join("istiod"),
            &config,
            &[&[("ISTIOD_CUSTOM_HOST", "127.0.0.1")], istiod_env].concat(),
        );
        let pod = PodDir::new(
            &tmp.path().join("sleep"),
            &istiod.token("demo", "sleep"),
            Some(&istiod.root_pem()),
        );
        let addr = istiod.grpc.to_string();
        let agent = pod.start_agent_with(
            &ns,
            &[
                ("POD_NAME", "sleep-1"),
                ("POD_NAMESPACE", "demo"),
                ("SERVICE_ACCOUNT", "sleep"),
                ("INSTANCE_IP", "198.18.0.2"),
                ("CA_ADDR", &addr),
            ],
            &format!(r#""discoveryAddress": "{addr}""#),
        );
        let mesh = SampleMesh {
            ns,
            istiod,
            config,
            pod,
            agent,
            _tmp: tmp,
        };
        wait_for(
            "Envoy ready with istiod's config",
            Duration::from_secs(60),
            || mesh.get(15021, "/healthz/ready").filter(|(c, _)| *c == 200),
        );
        mesh
    }

    /// A GET on one of the Pod's local ports (Envoy's admin, its readiness),
    /// `None` while it does not answer.
    pub fn get(&self, port: u16, path: &'static str) -> Option<(u16, String)> {
        self.ns
            .run(move || http_get(SocketAddr::from(([127, 0, 0, 1], port)), path).ok())
    }
}
