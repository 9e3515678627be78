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
