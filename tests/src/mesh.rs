//! A mesh on one machine: a hub network namespace with a bridge (istiod
//! lives there) and one network namespace per Pod, cabled to the bridge with
//! a veth pair, its address from the sample mesh. Each Pod resolves
//! `istiod.istio-system.svc` through its own hosts file, as a cluster's DNS
//! would. Everything is removed on drop.
//!
//! Pods run as Istio runs them ([`Capture::Iptables`]): the init step
//! (`pilot-agent istio-iptables` with the injection template's arguments)
//! writes Istio's rules into the Pod's namespace, then pilot-agent and Envoy
//! run as Istio's proxy user (uid/gid 1337) while the apps, unaware of the
//! mesh, run as other users: servers listen on their Pod port, clients call
//! `http://httpbin:8000/`, and names resolve through the agent's DNS proxy.
//! [`Capture::None`] keeps the Sidecar `captureMode: NONE` path.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::netns::Netns;

static VETH_COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// istiod's address on the hub bridge.
pub const HUB_IP: &str = "198.18.255.254";
/// Service `httpbin`'s cluster IP in the sample mesh.
pub const HTTPBIN_VIP: &str = "198.19.0.10";
/// Istio's proxy user and group (the injection template's `runAsUser`).
pub const PROXY_UID: u32 = 1337;
/// The user the apps run as: anyone but the proxy.
pub const APP_UID: u32 = 1000;
/// The nameserver in each captured Pod's `resolv.conf`. Nothing listens
/// there: the Pod's DNS redirection hands queries to the agent, so an answer
/// proves it came from the agent.
pub const POD_NAMESERVER: &str = "127.0.0.53";

/// The injection template's `istio-init` arguments (REDIRECT mode).
pub const ISTIO_INIT_ARGS: &[&str] = pilot_agent::iptables::INJECTION_TEMPLATE_ARGS;

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("iproute2 is installed");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// How a Pod's traffic reaches its Envoy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capture {
    /// Istio's default: `istio-iptables` redirects the Pod's traffic.
    Iptables,
    /// No iptables: Sidecar `captureMode: NONE` listeners
    /// (`istiod/samples/capture-none/`); apps call `127.0.0.1:8000`.
    None,
}

/// The hub: a namespace with a bridge and istiod's address.
pub struct Hub {
    /// The hub namespace.
    pub ns: Netns,
    /// The addresses `istiod.istio-system.svc` resolves to in Pods (one
    /// hosts line each, tried in order): the hub's own, or the replicas'
    /// ([`crate::replicas`]).
    pub istiod_ips: Vec<String>,
    /// More hosts lines for Pods created afterwards (`<ip> <name>`): a
    /// revision's `istiod-<rev>.istio-system.svc` ([`crate::revisions`]).
    pub extra_hosts: Vec<String>,
}

impl Hub {
    /// Creates the hub.
    pub fn new() -> Hub {
        let ns = Netns::new("hub");
        ip(&["-n", &ns.name, "link", "add", "br0", "type", "bridge"]);
        ip(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{HUB_IP}/16"),
            "dev",
            "br0",
        ]);
        ip(&["-n", &ns.name, "link", "set", "br0", "up"]);
        Hub {
            ns,
            istiod_ips: vec![HUB_IP.to_string()],
            extra_hosts: Vec::new(),
        }
    }

    /// A Pod namespace with `pod_ip` on `eth0`, cabled to the bridge, its
    /// default route through the hub (which routes nowhere further).
    pub fn pod(&self, name: &str, pod_ip: &str) -> PodNet {
        let ns = Netns::new(name);
        // Veth names live in the root namespace for a moment: unique per process.
        let n = VETH_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("{}{n}", std::process::id() % 100_000);
        let (host_end, pod_end) = (format!("vh{tag}"), format!("vp{tag}"));
        ip(&[
            "link", "add", &host_end, "type", "veth", "peer", "name", &pod_end,
        ]);
        ip(&["link", "set", &host_end, "netns", &self.ns.name]);
        ip(&["link", "set", &pod_end, "netns", &ns.name]);
        ip(&[
            "-n",
            &self.ns.name,
            "link",
            "set",
            &host_end,
            "master",
            "br0",
            "up",
        ]);
        ip(&["-n", &ns.name, "link", "set", &pod_end, "name", "eth0"]);
        ip(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{pod_ip}/16"),
            "dev",
            "eth0",
        ]);
        ip(&["-n", &ns.name, "link", "set", "eth0", "up"]);
        // Service VIPs (198.19.0.0/16) are routed like any address outside
        // the Pod network, as in a cluster; iptables takes them first.
        ip(&["-n", &ns.name, "route", "add", "default", "via", HUB_IP]);
        // The Pod's own hosts file and resolver (`ip netns exec` mounts them).
        let etc = PathBuf::from("/etc/netns").join(&ns.name);
        std::fs::create_dir_all(&etc).expect("create /etc/netns/<pod>");
        let istiods: String = self
            .istiod_ips
            .iter()
            .map(|ip| format!("{ip} istiod.istio-system.svc\n"))
            .chain(self.extra_hosts.iter().map(|l| format!("{l}\n")))
            .collect();
        std::fs::write(
            etc.join("hosts"),
            format!("127.0.0.1 localhost\n::1 localhost\n{istiods}"),
        )
        .expect("write the Pod's hosts file");
        let net = PodNet {
            ns,
            etc,
            ip: pod_ip.to_string(),
            hub_link: host_end,
        };
        net.write_resolv_conf("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n");
        net
    }
}

impl Default for Hub {
    fn default() -> Self {
        Self::new()
    }
}

/// A Pod's network namespace on the hub.
pub struct PodNet {
    /// The namespace.
    pub ns: Netns,
    /// The Pod IP.
    pub ip: String,
    /// The hub's end of the Pod's veth pair (a port of the bridge): taking
    /// it down cuts the Pod off, as a node's failed link would.
    pub hub_link: String,
    etc: PathBuf,
}

impl PodNet {
    /// Replaces the Pod's `/etc/resolv.conf` (what `ip netns exec` mounts).
    pub fn write_resolv_conf(&self, text: &str) {
        std::fs::write(self.etc.join("resolv.conf"), text).expect("write the Pod's resolv.conf");
    }

    /// A command run inside the Pod as `uid`/`gid`, with the Pod's
    /// `/etc/hosts` and `/etc/resolv.conf`: what a container of the Pod
    /// running as that user would do.
    pub fn command_as(&self, uid: u32, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = self.ns.command("setpriv");
        c.args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
            "--pdeathsig=KILL",
            "--",
        ])
        .arg(program);
        c
    }

    /// `iptables-save` inside the Pod.
    pub fn iptables_save(&self) -> String {
        let out = self
            .ns
            .command("iptables-save")
            .output()
            .expect("iptables is installed (scripts/setup.sh)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs the injection template's `istio-init` step in the Pod (plus
    /// `--redirect-dns` when `dns` is set), as the init container does.
    pub fn istio_init(&self, pilot_agent: &Path, dns: bool) {
        let mut cmd = self.ns.command(pilot_agent);
        cmd.args(ISTIO_INIT_ARGS);
        if dns {
            cmd.arg("--redirect-dns");
        }
        let out = cmd.output().expect("run pilot-agent istio-iptables");
        assert!(
            out.status.success(),
            "istio-init in {}: {}{}",
            self.ns.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PodNet {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.etc);
    }
}

/// One Service per version of the sample's httpbin (`httpbin-v1`,
/// `httpbin-v2`, with their EndpointSlices), as the Gateway API splits
/// traffic between Services (it has no subsets).
pub const HTTPBIN_VERSION_SERVICES: &str = r#"apiVersion: v1
kind: Service
metadata: {name: httpbin-v1, namespace: demo}
spec:
  clusterIP: 198.19.0.21
  selector: {app: httpbin, version: v1}
  ports: [{name: http, port: 8000, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: httpbin-v1-abc, namespace: demo, labels: {kubernetes.io/service-name: httpbin-v1}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [198.18.0.3]
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: demo, name: httpbin-v1}
---
apiVersion: v1
kind: Service
metadata: {name: httpbin-v2, namespace: demo}
spec:
  clusterIP: 198.19.0.22
  selector: {app: httpbin, version: v2}
  ports: [{name: http, port: 8000, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: httpbin-v2-abc, namespace: demo, labels: {kubernetes.io/service-name: httpbin-v2}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [198.18.0.4]
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: demo, name: httpbin-v2}
"#;

/// A small HTTP application inside a Pod: answers every request on `addr`
/// with its version, the `X-Forwarded-Client-Cert` header its sidecar added
/// (who called, as the server side saw it), the peer address of the
/// connection it was given, and then each request line and header as
/// `request=<line>` and `header=<name>: <value>` lines (what reached the app).
/// `/status/<code>` answers with that status code, as httpbin does.
pub fn serve_app(ns: &Netns, addr: SocketAddr, version: &str) {
    use std::io::{Read, Write};
    let listener = ns.run(move || std::net::TcpListener::bind(addr).expect("bind the app's port"));
    let version = version.to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(100_000) {
            let Ok(mut c) = conn else { continue };
            let version = version.clone();
            std::thread::spawn(move || {
                // Keep-alive, as real servers do: Envoy reuses its connections
                // to the app instead of opening (from 127.0.0.6) one per request.
                let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(300)));
                let peer = c
                    .peer_addr()
                    .map(|a| a.ip().to_string())
                    .unwrap_or_default();
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                for _ in 0..100_000 {
                    // The requests carry no body: each ends at its blank line.
                    let end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        match c.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head: Vec<u8> = buf.drain(..end).collect();
                    let req = String::from_utf8_lossy(&head);
                    let header = |name: &str| {
                        req.lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
                            })
                            .unwrap_or_default()
                    };
                    let xfcc = header("x-forwarded-client-cert");
                    let close = header("connection").eq_ignore_ascii_case("close");
                    let mut body = format!("version={version}\nxfcc={xfcc}\npeer={peer}\n");
                    let mut lines = req.lines();
                    if let Some(first) = lines.next() {
                        body.push_str(&format!("request={first}\n"));
                    }
                    for l in lines.filter(|l| !l.is_empty()) {
                        body.push_str(&format!("header={l}\n"));
                    }
                    // `/status/<code>` answers with that code, as httpbin does.
                    let status = req
                        .lines()
                        .next()
                        .and_then(|l| l.split_whitespace().nth(1))
                        .and_then(|p| p.strip_prefix("/status/"))
                        .and_then(|c| c.parse::<u16>().ok())
                        .filter(|c| (200..600).contains(c))
                        .unwrap_or(200);
                    let response = format!(
                        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n{}\r\n{body}",
                        if status == 200 { "OK" } else { "Status" },
                        body.len(),
                        if close { "Connection: close\r\n" } else { "" }
                    );
                    if c.write_all(response.as_bytes()).is_err() || close {
                        return;
                    }
                }
            });
        }
    });
}

/// One HTTP/1.1 request on a fresh connection to `addr` from inside `ns`
/// (as the test process's user, root: not the proxy's): (status, body).
pub fn http_request(
    ns: &Netns,
    addr: SocketAddr,
    host: &str,
    path: &str,
) -> std::io::Result<(u16, String)> {
    http_request_with(ns, addr, host, path, &[])
}

/// [`http_request`] with extra request headers.
pub fn http_request_with(
    ns: &Netns,
    addr: SocketAddr,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<(u16, String)> {
    let (host, path) = (host.to_string(), path.to_string());
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    ns.run(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2))?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
        s.set_nodelay(true)?;
        // One write, as HTTP clients send a request: Envoy's HTTP inspector
        // (on Istio's outbound `0.0.0.0_<port>` listeners) can misjudge a
        // request line that arrives in pieces and pass it on as TCP.
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n");
        s.write_all(request.as_bytes())?;
        let mut buf = String::new();
        s.read_to_string(&mut buf)?;
        Ok(crate::mesh::split_response(&buf))
    })
}

/// A binary the proxy user can execute: `path` itself when uid 1337 can
/// reach it, else a copy in `dir` (a checkout under a private home directory
/// A whole HTTP/1.1 response read to its end: (status, body); status 0
/// when the status line is missing.
pub fn split_response(buf: &str) -> (u16, String) {
    let status = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// is out of the proxy user's reach, as it would be in a container).
pub fn runnable_by_proxy(path: &Path, dir: &Path) -> PathBuf {
    let ok = Command::new("setpriv")
        .args([
            &format!("--reuid={PROXY_UID}"),
            &format!("--regid={PROXY_UID}"),
            "--clear-groups",
            "test",
            "-x",
        ])
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return path.to_path_buf();
    }
    let copy = dir.join(path.file_name().expect("a binary's file name"));
    if !copy.exists() {
        std::fs::copy(path, &copy).expect("copy a binary for the proxy user");
    }
    copy
}

/// Makes `dir` (and what is in it) the proxy user's, as a Pod's volumes are.
fn give_to_proxy(dir: &Path) {
    let ok = Command::new("chown")
        .args(["-R", &format!("{PROXY_UID}:{PROXY_UID}")])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "chown {} to the proxy user", dir.display());
}

/// Tests that run a whole mesh (istiod and three Envoys on a two-core
/// machine) take turns: hold the guard for the test's length.
pub fn one_mesh_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The mesh's ProxyConfig: the status port, and Envoy stats beyond Istio's
/// default set that the tests read (what an operator would add with
/// `proxyStatsMatcher` to watch passthrough and refused traffic).
pub const MESH_PROXY_CONFIG: &str = r#""statusPort": 15020, "proxyStatsMatcher": {"inclusionPrefixes": ["cluster.PassthroughCluster", "cluster.BlackHoleCluster", "cluster.outbound|", "cluster.inbound|", "cluster.InboundPassthroughCluster", "listener.", "http."]}"#;

/// How a workload differs from the sample's Pods.
#[derive(Default)]
struct Extra<'a> {
    /// Agent environment on top of the mesh's.
    env: &'a [(&'a str, &'a str)],
    /// The labels file (`app` and `version` from the name when `None`).
    labels: Option<&'a [(&'a str, &'a str)]>,
    /// ProxyConfig fields appended to [`MESH_PROXY_CONFIG`] (`, "k": v`).
    proxy_config: &'a str,
}

/// One running Pod of the mesh.
pub type MeshPod = (String, PodNet, crate::PodDir, crate::Proc);

/// The sample mesh running: istiod in the hub with the sample config, and
/// `sleep-1`, `httpbin-v1`, `httpbin-v2` Pods each with pilot-agent and Envoy.
pub struct LocalMesh {
    /// istiod.
    pub istiod: crate::Istiod,
    /// The config directory istiod watches (a copy of the sample; edit it live).
    pub config_dir: PathBuf,
    /// The Pods: (name, network, filesystem, agent).
    pub pods: Vec<MeshPod>,
    /// The hub.
    pub hub: Hub,
    /// Where everything lives.
    pub dir: PathBuf,
    /// How the Pods' traffic reaches Envoy.
    pub capture: Capture,
    /// The Kubernetes API istiod reads, when it runs on one
    /// ([`LocalMesh::start_kube`]); `config_dir` is then only the sample's copy.
    pub kube_api: Option<crate::kube_api::KubeApi>,
    /// The other istiods and every replica's network, when several run
    /// ([`LocalMesh::start_kube_replicas`]).
    pub replicas: Option<crate::replicas::Replicas>,
    agent_env: Vec<(String, String)>,
    pilot_agent: PathBuf,
}

/// Creates every object of the YAML files in `dir` in the API, Namespaces
/// first, as `kubectl apply -f dir` would.
fn load_into(api: &crate::kube_api::KubeApi, dir: &Path) {
    let mut objects = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("a sample")
        .flatten()
        .collect();
    files.sort_by_key(|e| e.file_name());
    for e in files {
        let text = std::fs::read_to_string(e.path()).expect("read a sample file");
        for doc in text.split("\n---") {
            let v: serde_json::Value = serde_yaml_ng::from_str(doc).expect("a sample object");
            if !v.is_null() {
                objects.push(v);
            }
        }
    }
    objects.sort_by_key(|o| o["kind"] != "Namespace");
    for o in objects {
        api.create(o.clone())
            .unwrap_or_else(|e| panic!("create {}: {e:?}", o["metadata"]["name"]));
    }
}

fn copy_yaml(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).expect("a sample").flatten() {
        if e.path().extension().is_some_and(|x| x == "yaml") {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy the sample");
        }
    }
}

impl LocalMesh {
    /// Starts the mesh as Istio runs it (iptables capture) in `dir` and
    /// waits until every Pod's Envoy is ready.
    pub fn start(dir: &Path, extra_agent_env: &[(&str, &str)]) -> LocalMesh {
        Self::start_with(dir, Capture::Iptables, extra_agent_env)
    }

    /// Starts the mesh with the given capture, in `dir`, istiod reading the
    /// sample from its config directory.
    pub fn start_with(dir: &Path, capture: Capture, extra_agent_env: &[(&str, &str)]) -> LocalMesh {
        Self::start_from(dir, capture, extra_agent_env, &[], None, 1)
    }

    /// [`LocalMesh::start`] with extra environment for istiod too (its
    /// `GRPC_KEEPALIVE_*`, say).
    pub fn start_tuned(
        dir: &Path,
        istiod_env: &[(&str, &str)],
        extra_agent_env: &[(&str, &str)],
    ) -> LocalMesh {
        Self::start_from(dir, Capture::Iptables, extra_agent_env, istiod_env, None, 1)
    }

    /// Starts the mesh (iptables capture) with istiod on Kubernetes: the
    /// API stand-in, inside the hub, holds the sample's objects and istiod
    /// reads them through `--kubeconfig`, with no config directory.
    pub fn start_kube(dir: &Path) -> LocalMesh {
        Self::start_from(dir, Capture::Iptables, &[], &[], Some(&[]), 1)
    }

    /// [`LocalMesh::start_kube`] with `n` istiods on the one API, each in
    /// its own network namespace ([`crate::replicas`]).
    pub fn start_kube_replicas(dir: &Path, n: usize) -> LocalMesh {
        Self::start_from(dir, Capture::Iptables, &[], &[], Some(&[]), n)
    }

    /// [`LocalMesh::start_kube`] with extra agent and istiod environment,
    /// and `objects` created in the API before istiod starts.
    pub fn start_kube_with(
        dir: &Path,
        agent_env: &[(&str, &str)],
        istiod_env: &[(&str, &str)],
        objects: &[serde_json::Value],
    ) -> LocalMesh {
        Self::start_from(
            dir,
            Capture::Iptables,
            agent_env,
            istiod_env,
            Some(objects),
            1,
        )
    }

    fn start_from(
        dir: &Path,
        capture: Capture,
        extra_agent_env: &[(&str, &str)],
        istiod_env: &[(&str, &str)],
        kube: Option<&[serde_json::Value]>,
        istiods: usize,
    ) -> LocalMesh {
        // The proxy user must reach its Pod's files.
        std::fs::create_dir_all(dir).expect("mesh dir");
        std::fs::set_permissions(
            dir,
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
        )
        .expect("open the mesh dir to the proxy user");
        let config_dir = dir.join("config");
        std::fs::create_dir_all(&config_dir).expect("config dir");
        let samples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../istiod/samples");
        copy_yaml(&samples.join("mesh"), &config_dir);
        if capture == Capture::None {
            copy_yaml(&samples.join("capture-none"), &config_dir);
        }
        let mut hub = Hub::new();
        let mut replicas = None;
        let (istiod, kube_api) = if let Some(objects) = kube {
            // Replicas and other revisions' istiods reach the API from
            // their own namespaces.
            let bind = HUB_IP;
            let listener = hub
                .ns
                .run(move || std::net::TcpListener::bind((bind, 0)).expect("bind the API"));
            let api = crate::kube_api::KubeApi::start(listener);
            load_into(&api, &config_dir);
            // istiod's own namespace exists in every cluster (its CA keeps
            // `istio-ca-secret` and its lock objects there).
            if api.get("v1", "Namespace", "", "istio-system").is_none() {
                api.create(serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": "istio-system"}}))
                    .expect("create the istio-system namespace");
            }
            for o in objects {
                api.create(o.clone()).expect("create a seeded object");
            }
            let kubeconfig = dir.join("kubeconfig");
            api.kubeconfig(&kubeconfig);
            let istiod = if istiods > 1 {
                let (first, rest) = crate::replicas::start(&mut hub, &kubeconfig, dir, istiods);
                replicas = Some(rest);
                first
            } else {
                crate::Istiod::start_hub_kube_with(
                    &hub.ns,
                    &dir.join("istiod"),
                    &kubeconfig,
                    istiod_env,
                )
            };
            (istiod, Some(api))
        } else {
            let istiod = crate::Istiod::start_hub_with(
                &hub.ns,
                &dir.join("istiod"),
                &config_dir,
                istiod_env,
            );
            (istiod, None)
        };
        let mut agent_env: Vec<(String, String)> = extra_agent_env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if capture == Capture::Iptables
            && !agent_env.iter().any(|(k, _)| k == "ISTIO_META_DNS_CAPTURE")
        {
            // Without a cluster DNS, names resolve through the agent.
            agent_env.push(("ISTIO_META_DNS_CAPTURE".into(), "true".into()));
        }
        let pilot_agent = runnable_by_proxy(&crate::bin("pilot-agent"), dir);
        let mut mesh = LocalMesh {
            istiod,
            config_dir,
            pods: Vec::new(),
            hub,
            dir: dir.to_path_buf(),
            capture,
            agent_env,
            pilot_agent,
            kube_api,
            replicas,
        };
        for (name, ip, sa, version) in [
            ("sleep-1", "198.18.0.2", "sleep", None),
            ("httpbin-v1", "198.18.0.3", "httpbin", Some("v1")),
            ("httpbin-v2", "198.18.0.4", "httpbin", Some("v2")),
        ] {
            mesh.launch_pod("demo", name, ip, sa, version, &Extra::default());
        }
        for i in 0..mesh.pods.len() {
            mesh.wait_pod_ready(i);
        }
        mesh
    }

    fn dns_capture(&self) -> bool {
        self.agent_env
            .iter()
            .any(|(k, v)| k == "ISTIO_META_DNS_CAPTURE" && v == "true")
    }

    /// Network, init step, app and agent of one Pod (not waiting for it).
    fn launch_pod(
        &mut self,
        namespace: &str,
        name: &str,
        ip: &str,
        sa: &str,
        version: Option<&str>,
        extra: &Extra<'_>,
    ) {
        let pod_env = extra.env;
        let net = self.hub.pod("pod", ip);
        let app_addr: SocketAddr = match self.capture {
            // The app listens on its Pod port, untouched by the mesh.
            Capture::Iptables => "0.0.0.0:8080".parse().expect("an address"),
            Capture::None => "127.0.0.1:9080".parse().expect("an address"),
        };
        if self.capture == Capture::Iptables {
            net.write_resolv_conf(&format!(
                "nameserver {POD_NAMESERVER}\nsearch demo.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5 timeout:1 attempts:1\n"
            ));
            net.istio_init(&self.pilot_agent, self.dns_capture());
        }
        if let Some(version) = version {
            serve_app(&net.ns, app_addr, version);
        }
        let root = self.istiod.root_pem();
        let pod_dir = crate::PodDir::new(
            &self.dir.join(name),
            &self.istiod.token(namespace, sa),
            Some(&root),
        );
        let app = if sa == "sleep" { "sleep" } else { "httpbin" };
        match extra.labels {
            Some(labels) => pod_dir.write_labels(labels),
            None => pod_dir.write_labels(&[("app", app), ("version", app_version_label(name))]),
        }
        let proxy_config = format!("{MESH_PROXY_CONFIG}{}", extra.proxy_config);
        let mut env = vec![
            ("POD_NAME", name),
            ("POD_NAMESPACE", namespace),
            ("SERVICE_ACCOUNT", sa),
            ("INSTANCE_IP", ip),
            ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
        ];
        env.extend(self.agent_env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        env.extend(pod_env.iter().copied());
        let agent = match self.capture {
            Capture::Iptables => {
                env.push(("ISTIO_META_INTERCEPTION_MODE", "REDIRECT"));
                give_to_proxy(&pod_dir.dir);
                pod_dir.start_agent_as_proxy(&net, &self.pilot_agent, &env, &proxy_config)
            }
            Capture::None => pod_dir.start_agent_with(&net.ns, &env, &proxy_config),
        };
        self.pods.push((name.to_string(), net, pod_dir, agent));
    }

    fn wait_pod_ready(&mut self, i: usize) {
        let (name, net, _, agent) = &mut self.pods[i];
        crate::wait_for(
            &format!("{name} ready"),
            std::time::Duration::from_secs(60),
            || {
                assert!(agent.alive(), "{name}'s agent exited:\n{}", agent.log());
                net.ns
                    .run(|| {
                        crate::http_get(
                            std::net::SocketAddr::from(([127, 0, 0, 1], 15021)),
                            "/healthz/ready",
                        )
                        .ok()
                    })
                    .filter(|(c, _)| *c == 200)
            },
        );
    }

    /// Adds a Pod to the running mesh: its network, app, agent and Envoy
    /// (its Kubernetes objects are the caller's to write).
    pub fn add_pod(&mut self, name: &str, ip: &str, sa: &str, app_version: &str) {
        self.add_pod_in("demo", name, ip, sa, app_version);
    }

    /// [`LocalMesh::add_pod`] in Kubernetes namespace `namespace` (its
    /// identity is `<trust domain>/ns/<namespace>/sa/<sa>`).
    pub fn add_pod_in(
        &mut self,
        namespace: &str,
        name: &str,
        ip: &str,
        sa: &str,
        app_version: &str,
    ) {
        self.launch_pod(
            namespace,
            name,
            ip,
            sa,
            Some(app_version),
            &Extra::default(),
        );
        self.wait_pod_ready(self.pods.len() - 1);
    }

    /// Adds a Pod of namespace `demo` whose agent gets `env` on top of the
    /// mesh's (its own `CA_ADDR`, `SECRET_TTL`, ...); with `app_version`,
    /// it serves the app too. Its Kubernetes objects are the caller's.
    pub fn add_pod_with_env(
        &mut self,
        name: &str,
        ip: &str,
        sa: &str,
        app_version: Option<&str>,
        env: &[(&str, &str)],
    ) {
        let extra = Extra {
            env,
            ..Extra::default()
        };
        self.launch_pod("demo", name, ip, sa, app_version, &extra);
        self.wait_pod_ready(self.pods.len() - 1);
    }

    /// Adds a VM-shaped workload of namespace `demo`: its network, app
    /// (`version=vm`), agent and Envoy, with no Kubernetes object; the
    /// agent gets `env` on top of the mesh's, reports `labels` (its node
    /// metadata `LABELS`) and has `proxy_config` (`, "field": ...`) added to
    /// the mesh's ProxyConfig (a WorkloadGroup's `readinessProbe`).
    pub fn add_vm(
        &mut self,
        name: &str,
        ip: &str,
        sa: &str,
        env: &[(&str, &str)],
        labels: &[(&str, &str)],
        proxy_config: &str,
    ) {
        let extra = Extra {
            env,
            labels: Some(labels),
            proxy_config,
        };
        self.launch_pod("demo", name, ip, sa, Some("vm"), &extra);
        self.wait_pod_ready(self.pods.len() - 1);
    }

    /// Applies one of `istiod/samples/<name>/` to the running mesh: copied
    /// into the config directory, or created in the Kubernetes API.
    pub fn apply_sample(&self, name: &str) {
        let sample = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../istiod/samples")
            .join(name);
        match &self.kube_api {
            Some(api) => load_into(api, &sample),
            None => copy_yaml(&sample, &self.config_dir),
        }
    }

    /// A Pod without a sidecar (no init step, no agent): a namespace on the
    /// hub, for clients and servers outside the mesh.
    pub fn plain_pod(&self, ip: &str) -> PodNet {
        self.hub.pod("plain", ip)
    }

    /// A counter from a Pod's Envoy `/stats`.
    pub fn envoy_stat(&self, pod: &str, name: &str) -> u64 {
        let name = name.to_string();
        self.pod(pod).ns.run(move || {
            let (_, body) = crate::http_get(
                std::net::SocketAddr::from(([127, 0, 0, 1], 15000)),
                "/stats",
            )
            .unwrap_or_default();
            body.lines()
                .find_map(|l| {
                    l.strip_prefix(&format!("{name}: "))
                        .and_then(|v| v.trim().parse().ok())
                })
                .unwrap_or(0)
        })
    }

    /// The Pod named `name`.
    pub fn pod(&self, name: &str) -> &PodNet {
        &self
            .pods
            .iter()
            .find(|p| p.0 == name)
            .expect("a Pod of the sample")
            .1
    }

    /// One request from sleep to httpbin through the mesh: (status, body).
    /// Captured, the app calls the Service IP as `http://httpbin:8000/`
    /// would after resolving it; without capture it calls sleep's Envoy on
    /// `127.0.0.1:8000`.
    pub fn call_httpbin(&self) -> std::io::Result<(u16, String)> {
        let addr: SocketAddr = match self.capture {
            Capture::Iptables => format!("{HTTPBIN_VIP}:8000"),
            Capture::None => "127.0.0.1:8000".into(),
        }
        .parse()
        .expect("an address");
        http_request(&self.pod("sleep-1").ns, addr, "httpbin:8000", "/headers")
    }

    /// `n` calls sleep → httpbin ([`LocalMesh::call_httpbin`]), each of
    /// which must answer 200: how many each version answered (the sample
    /// app's `version=` line; `?` without one).
    pub fn httpbin_versions(&self, n: usize) -> std::collections::BTreeMap<String, usize> {
        let mut counts = std::collections::BTreeMap::new();
        for _ in 0..n {
            let (code, body) = self.call_httpbin().expect("calling httpbin");
            assert_eq!(code, 200, "{body}");
            let v = body
                .lines()
                .find_map(|l| l.strip_prefix("version="))
                .unwrap_or("?");
            *counts.entry(v.to_string()).or_default() += 1;
        }
        counts
    }

    /// `curl` run in Pod `pod` as the app user (uid 1000) with the Pod's
    /// resolver: (HTTP status, body), or curl's error.
    pub fn app_curl(&self, pod: &str, url: &str) -> Result<(u16, String), String> {
        self.app_curl_with(pod, &[], url)
    }

    /// [`LocalMesh::app_curl`] with more curl arguments before the URL
    /// (`-X POST`, `-H 'authorization: Bearer ...'`, `-i` for the headers).
    pub fn app_curl_with(
        &self,
        pod: &str,
        args: &[&str],
        url: &str,
    ) -> Result<(u16, String), String> {
        curl(self.pod(pod).command_as(APP_UID, "curl"), args, url)
    }
}

/// `curl` on the machine itself (outside every Pod), as a user of the demo
/// runs it: the status code and body.
pub fn host_curl(args: &[&str], url: &str) -> Result<(u16, String), String> {
    curl(Command::new("curl"), args, url)
}

/// Runs a `curl` command for `url` with `args`: the status code and body.
fn curl(mut cmd: Command, args: &[&str], url: &str) -> Result<(u16, String), String> {
    let out = cmd
        .args(["-sS", "-m", "10", "-w", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .map_err(|e| format!("curl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "curl {url}: exit {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    Ok((code.trim().parse().unwrap_or(0), body.to_string()))
}

/// The `version` label of a sample Pod (`httpbin-v1b` is a second v1 replica).
fn app_version_label(pod: &str) -> &'static str {
    if pod.contains("v2") { "v2" } else { "v1" }
}
