//! A Pod's network: a network namespace of the test's own, with loopback up,
//! so every Envoy and agent keeps Istio's standard ports. Removed on drop.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A network namespace.
pub struct Netns {
    /// Its name (`ip netns` name).
    pub name: String,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl Netns {
    /// Creates a namespace with loopback up.
    pub fn new(prefix: &str) -> Netns {
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let ok = Command::new("ip").args(["netns", "add", &name]).status();
        assert!(
            ok.is_ok_and(|s| s.success()),
            "cannot create network namespace {name}: end-to-end tests need root (or an unprivileged user+net namespace) and iproute2"
        );
        let ns = Netns { name };
        let lo = Command::new("ip")
            .args(["netns", "exec", &ns.name, "ip", "link", "set", "lo", "up"])
            .status();
        assert!(
            lo.is_ok_and(|s| s.success()),
            "cannot bring up loopback in {}",
            ns.name
        );
        ns
    }

    /// A command that runs `program` inside the namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// Runs `f` on a thread that has entered the namespace: sockets it opens
    /// (and servers it runs) live in the Pod's network.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.spawn(f)
            .join()
            .expect("thread inside the namespace panicked")
    }

    /// Like [`Netns::run`] but returns the thread's handle.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("entering {path}: {e}"));
            f()
        })
    }
}

impl Netns {
    /// Forwards TCP connections accepted on 127.0.0.1 of the test's own
    /// network to `target` inside this namespace, as a Service's cluster IP
    /// reaches a Pod: returns the local address. Each connection is spliced
    /// in both directions until either side closes; the forwarder lives as
    /// long as the process.
    pub fn forward_to(&self, target: std::net::SocketAddr) -> std::net::SocketAddr {
        self.forward_from("127.0.0.1:0".parse().expect("an address"), target)
            .expect("bind a forwarder")
    }

    /// [`Netns::forward_to`] from a given local address (as a NodePort or
    /// `kubectl port-forward` publishes a Pod on the machine).
    pub fn forward_from(
        &self,
        local: std::net::SocketAddr,
        target: std::net::SocketAddr,
    ) -> std::io::Result<std::net::SocketAddr> {
        let listener = std::net::TcpListener::bind(local)?;
        let local = listener.local_addr()?;
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            for conn in listener.incoming().take(1_000_000) {
                let Ok(client) = conn else { continue };
                let path = path.clone();
                std::thread::spawn(move || {
                    let Ok(file) = std::fs::File::open(&path) else {
                        return;
                    };
                    if nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).is_err() {
                        return;
                    }
                    let Ok(server) = std::net::TcpStream::connect(target) else {
                        return;
                    };
                    splice(client, server);
                });
            }
        });
        Ok(local)
    }
}

/// Copies bytes both ways between two connections until both directions end.
fn splice(a: std::net::TcpStream, b: std::net::TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let one = std::thread::spawn(move || {
        let (mut from, to) = (a, b2);
        let _ = std::io::copy(&mut from, &mut &to);
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
    let (mut from, to) = (b, a2);
    let _ = std::io::copy(&mut from, &mut &to);
    let _ = to.shutdown(std::net::Shutdown::Write);
    let _ = one.join();
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Runs `f` in the named namespace, or right here when `name` is `None`.
pub fn run_in<T: Send + 'static>(name: Option<&str>, f: impl FnOnce() -> T + Send + 'static) -> T {
    match name {
        None => f(),
        Some(name) => {
            let path = format!("/var/run/netns/{name}");
            std::thread::spawn(move || {
                let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
                nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .unwrap_or_else(|e| panic!("entering {path}: {e}"));
                f()
            })
            .join()
            .expect("thread inside the namespace panicked")
        }
    }
}
