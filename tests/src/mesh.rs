//! A mesh on one machine: a hub network namespace with a bridge (istiod
//! lives there) and one network namespace per Pod, cabled to the bridge with
//! a veth pair, its address from the sample mesh. Each Pod resolves
//! `istiod.istio-system.svc` through its own hosts file, as a cluster's DNS
//! would. Everything is removed on drop.

use std::path::PathBuf;
use std::process::Command;

use crate::netns::Netns;

static VETH_COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// istiod's address on the hub bridge.
pub const HUB_IP: &str = "198.18.255.254";

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

/// The hub: a namespace with a bridge and istiod's address.
pub struct Hub {
    /// The hub namespace.
    pub ns: Netns,
    counter: std::cell::Cell<u32>,
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
            counter: std::cell::Cell::new(0),
        }
    }

    /// A Pod namespace with `pod_ip` on `eth0`, cabled to the bridge.
    pub fn pod(&self, name: &str, pod_ip: &str) -> PodNet {
        let ns = Netns::new(name);
        // Veth names live in the root namespace for a moment: unique per process.
        let n = VETH_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.counter.set(self.counter.get() + 1);
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
        // The Pod's own hosts file and resolver (`ip netns exec` mounts them).
        let etc = PathBuf::from("/etc/netns").join(&ns.name);
        std::fs::create_dir_all(&etc).expect("create /etc/netns/<pod>");
        std::fs::write(
            etc.join("hosts"),
            format!("127.0.0.1 localhost\n::1 localhost\n{HUB_IP} istiod.istio-system.svc\n"),
        )
        .expect("write the Pod's hosts file");
        std::fs::write(
            etc.join("resolv.conf"),
            "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
        )
        .expect("write the Pod's resolv.conf");
        PodNet {
            ns,
            etc,
            ip: pod_ip.to_string(),
        }
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
    etc: PathBuf,
}

impl Drop for PodNet {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.etc);
    }
}

/// A small HTTP application inside a Pod: answers every request on
/// `127.0.0.1:port` with its version and the `X-Forwarded-Client-Cert`
/// header its sidecar added (who called, as the server side saw it).
pub fn serve_app(ns: &Netns, port: u16, version: &str) {
    use std::io::{Read, Write};
    let listener = ns.run(move || {
        std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind the app's port")
    });
    let version = version.to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(100_000) {
            let Ok(mut c) = conn else { continue };
            let version = version.clone();
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(10)));
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // One request per connection is enough here; Envoy opens more as needed.
                loop {
                    match c.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                let req = String::from_utf8_lossy(&buf);
                let xfcc = req
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("x-forwarded-client-cert")
                            .then(|| v.trim().to_string())
                    })
                    .unwrap_or_default();
                let body = format!("version={version}\nxfcc={xfcc}\n");
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
}

/// The sample mesh running: istiod in the hub with the sample config, and
/// `sleep-1`, `httpbin-v1`, `httpbin-v2` Pods each with pilot-agent and Envoy.
pub struct LocalMesh {
    /// istiod.
    pub istiod: crate::Istiod,
    /// The config directory istiod watches (a copy of the sample; edit it live).
    pub config_dir: PathBuf,
    /// The Pods: (name, network, filesystem, agent).
    pub pods: Vec<(String, PodNet, crate::PodDir, crate::Proc)>,
    /// The hub.
    pub hub: Hub,
    /// Where everything lives.
    pub dir: PathBuf,
}

impl LocalMesh {
    /// Starts the mesh in `dir` and waits until every Pod's Envoy is ready.
    pub fn start(dir: &std::path::Path, extra_agent_env: &[(&str, &str)]) -> LocalMesh {
        let config_dir = dir.join("config");
        std::fs::create_dir_all(&config_dir).expect("config dir");
        let sample =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../istiod/samples/mesh");
        for e in std::fs::read_dir(&sample)
            .expect("the sample mesh")
            .flatten()
        {
            std::fs::copy(e.path(), config_dir.join(e.file_name())).expect("copy the sample");
        }
        let hub = Hub::new();
        let istiod = crate::Istiod::start_hub(&hub.ns, &dir.join("istiod"), &config_dir);
        let root = istiod.root_pem();
        let mut pods = Vec::new();
        for (name, ip, sa, app) in [
            ("sleep-1", "198.18.0.2", "sleep", None),
            ("httpbin-v1", "198.18.0.3", "httpbin", Some("v1")),
            ("httpbin-v2", "198.18.0.4", "httpbin", Some("v2")),
        ] {
            let net = hub.pod("pod", ip);
            if let Some(version) = app {
                serve_app(&net.ns, 9080, version);
            }
            let pod_dir =
                crate::PodDir::new(&dir.join(name), &istiod.token("demo", sa), Some(&root));
            let app = if sa == "sleep" { "sleep" } else { "httpbin" };
            pod_dir.write_labels(&[("app", app), ("version", app_version_label(name))]);
            let mut env = vec![
                ("POD_NAME", name),
                ("POD_NAMESPACE", "demo"),
                ("SERVICE_ACCOUNT", sa),
                ("INSTANCE_IP", ip),
                ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
            ];
            env.extend_from_slice(extra_agent_env);
            let agent = pod_dir.start_agent_with(&net.ns, &env, r#""statusPort": 15020"#);
            pods.push((name.to_string(), net, pod_dir, agent));
        }
        for (name, net, _, agent) in &mut pods {
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
        LocalMesh {
            istiod,
            config_dir,
            pods,
            hub,
            dir: dir.to_path_buf(),
        }
    }

    /// Adds a Pod to the running mesh: its network, app, agent and Envoy
    /// (its Kubernetes objects are the caller's to write).
    pub fn add_pod(&mut self, name: &str, ip: &str, sa: &str, app_version: &str) {
        let net = self.hub.pod("pod", ip);
        serve_app(&net.ns, 9080, app_version);
        let root = self.istiod.root_pem();
        let pod_dir = crate::PodDir::new(
            &self.dir.join(name),
            &self.istiod.token("demo", sa),
            Some(&root),
        );
        pod_dir.write_labels(&[("app", sa), ("version", app_version_label(name))]);
        let env = [
            ("POD_NAME", name),
            ("POD_NAMESPACE", "demo"),
            ("SERVICE_ACCOUNT", sa),
            ("INSTANCE_IP", ip),
            ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
        ];
        let mut agent = pod_dir.start_agent_with(&net.ns, &env, r#""statusPort": 15020"#);
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
        self.pods.push((name.to_string(), net, pod_dir, agent));
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
    pub fn call_httpbin(&self) -> std::io::Result<(u16, String)> {
        self.pod("sleep-1").ns.run(|| {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect_timeout(
                &std::net::SocketAddr::from(([127, 0, 0, 1], 8000)),
                std::time::Duration::from_secs(2),
            )?;
            s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
            s.set_nodelay(true)?;
            write!(
                s,
                "GET /headers HTTP/1.1\r\nHost: httpbin:8000\r\nConnection: close\r\n\r\n"
            )?;
            let mut buf = String::new();
            s.read_to_string(&mut buf)?;
            let status = buf
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let body = buf
                .split_once("\r\n\r\n")
                .map(|(_, b)| b.to_string())
                .unwrap_or_default();
            Ok((status, body))
        })
    }
}

/// The `version` label of a sample Pod (`httpbin-v1b` is a second v1 replica).
fn app_version_label(pod: &str) -> &'static str {
    if pod.contains("v2") { "v2" } else { "v1" }
}
