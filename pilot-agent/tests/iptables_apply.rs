//! `istio-iptables` and `istio-clean-iptables` against the real iptables,
//! each test in a network namespace of its own (`ip netns add`), never the
//! host's. Needs root, `ip`, `iptables` and `setpriv`; without them the tests
//! skip with a message, except under `CI=true`, where they fail.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Istio's injection template's `istio-init` arguments, verbatim.
const TEMPLATE: &[&str] = pilot_agent::iptables::INJECTION_TEMPLATE_ARGS;

/// Istio's message for a failed validation (first line).
const VALIDATION_FAILED: &str = "iptables validation failed; workload is not ready for Istio.";

/// Every command is bounded by this (seconds), through coreutils' `timeout`.
const COMMAND_TIMEOUT: &str = "60";

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
}

/// Opts out of these tests on a machine that cannot run them (not root, no
/// iptables): with `MESH_TEST_OPT_OUT_IPTABLES=1` they return without
/// running, saying so; without it a missing piece fails the test.
const OPT_OUT: &str = "MESH_TEST_OPT_OUT_IPTABLES";

/// Whether the run opted out of these tests by [`OPT_OUT`].
fn opted_out(why: &str) -> bool {
    let out = std::env::var(OPT_OUT).is_ok_and(|v| v == "1");
    if out {
        eprintln!("opted out by {OPT_OUT}=1: {why}");
    }
    out
}

/// Whether this machine can run these tests: a missing piece fails, unless
/// the run opted out by [`OPT_OUT`].
fn available() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let missing: Vec<&str> = [
        "ip",
        "iptables",
        "iptables-save",
        "ip6tables",
        "setpriv",
        "timeout",
    ]
    .into_iter()
    .filter(|b| !on_path(b))
    .collect();
    if root && missing.is_empty() {
        return true;
    }
    let why = format!(
        "iptables tests need root, ip, iptables and setpriv (root: {root}, missing: {missing:?})"
    );
    if opted_out(&why) {
        return false;
    }
    panic!("{why}; run scripts/setup.sh as root, or set {OPT_OUT}=1 to opt out");
}

fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_pilot-agent")
}

/// A network namespace with loopback up and a Pod-like `eth0` address,
/// deleted when dropped (also when the test panics).
struct Netns {
    name: String,
}

impl Netns {
    fn new(tag: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "pa-ipt-{}-{}-{tag}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let ns = Self { name };
        run_ok(Command::new("ip").args(["netns", "add", &ns.name]));
        ns.exec_ok(&["ip", "link", "set", "lo", "up"]);
        // Istio needs a non-loopback address to decide the Pod's IP family.
        ns.exec_ok(&[
            "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p",
        ]);
        ns.exec_ok(&["ip", "addr", "add", "10.244.0.5/24", "dev", "eth0"]);
        ns.exec_ok(&["ip", "link", "set", "eth0", "up"]);
        ns
    }

    /// `ip netns exec NAME args...`, bounded in time.
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("timeout");
        c.args([COMMAND_TIMEOUT, "ip", "netns", "exec", &self.name]);
        c.args(args);
        c
    }

    fn exec(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run ip netns exec")
    }

    fn exec_ok(&self, args: &[&str]) -> String {
        run_ok(&mut self.command(args))
    }

    /// `pilot-agent ARGS` inside the namespace.
    fn agent(&self, args: &[&str]) -> Output {
        let mut all = vec![binary()];
        all.extend_from_slice(args);
        self.exec(&all)
    }

    fn agent_ok(&self, args: &[&str]) {
        let out = self.agent(args);
        assert!(
            out.status.success(),
            "pilot-agent {args:?} failed: {:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The rule and chain lines of `iptables-save` (no comments or counters).
    fn save(&self, tool: &str) -> Vec<String> {
        self.exec_ok(&[tool])
            .lines()
            .filter(|l| l.starts_with("-A") || l.starts_with(':') || l.starts_with('*'))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn rules(save: &[String]) -> Vec<&String> {
    save.iter().filter(|l| l.starts_with("-A")).collect()
}

fn assert_no_duplicates(save: &[String]) {
    let mut seen = std::collections::HashSet::new();
    for r in rules(save) {
        assert!(
            seen.insert(r),
            "rule present twice: {r}\n{}",
            save.join("\n")
        );
    }
}

fn istio_lines(save: &[String]) -> Vec<&String> {
    save.iter().filter(|l| l.contains("ISTIO_")).collect()
}

/// The rules `iptables-save` prints for the injection template.
const TEMPLATE_RULES: &[&str] = &[
    "-A PREROUTING -p tcp -j ISTIO_INBOUND",
    "-A OUTPUT -j ISTIO_OUTPUT",
    "-A ISTIO_INBOUND -p tcp -m tcp --dport 15008 -j RETURN",
    "-A ISTIO_INBOUND -p tcp -m tcp --dport 15090 -j RETURN",
    "-A ISTIO_INBOUND -p tcp -m tcp --dport 15021 -j RETURN",
    "-A ISTIO_INBOUND -p tcp -m tcp --dport 15020 -j RETURN",
    "-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT",
    "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006",
    "-A ISTIO_OUTPUT -s 127.0.0.6/32 -o lo -j RETURN",
    "-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -p tcp -m tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT",
    "-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN",
    "-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN",
    "-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN",
    "-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN",
    "-A ISTIO_OUTPUT -j ISTIO_REDIRECT",
    "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001",
];

#[test]
fn template_rules_apply_once_and_clean_up() {
    if !available() {
        return;
    }
    let ns = Netns::new("apply");
    ns.agent_ok(TEMPLATE);
    let first = ns.save("iptables-save");
    for want in TEMPLATE_RULES {
        assert!(
            first.iter().any(|l| l == want),
            "missing {want:?} in\n{}",
            first.join("\n")
        );
    }
    for chain in [
        "ISTIO_INBOUND",
        "ISTIO_REDIRECT",
        "ISTIO_IN_REDIRECT",
        "ISTIO_OUTPUT",
    ] {
        assert!(
            first.iter().any(|l| l.starts_with(&format!(":{chain} "))),
            "no chain {chain}"
        );
    }
    assert_no_duplicates(&first);

    ns.agent_ok(TEMPLATE);
    let second = ns.save("iptables-save");
    assert_eq!(
        rules(&first).len(),
        rules(&second).len(),
        "re-run changed the rules"
    );
    assert_no_duplicates(&second);

    ns.agent_ok(&["istio-clean-iptables"]);
    for tool in ["iptables-save", "ip6tables-save"] {
        let after = ns.save(tool);
        assert!(
            istio_lines(&after).is_empty(),
            "{tool} after clean:\n{}",
            after.join("\n")
        );
    }
    // Safe when nothing is there.
    ns.agent_ok(&["istio-clean-iptables"]);
}

#[test]
fn reconcile_replaces_changed_rules_and_cleanup_only_removes_all() {
    if !available() {
        return;
    }
    let ns = Netns::new("reconcile");
    ns.agent_ok(TEMPLATE);
    let mut changed: Vec<&str> = TEMPLATE.to_vec();
    changed[10] = "10.96.0.0/12"; // -i
    changed.push("--reconcile");
    ns.agent_ok(&changed);
    let save = ns.save("iptables-save");
    assert!(
        save.iter()
            .any(|l| l == "-A ISTIO_OUTPUT -d 10.96.0.0/12 -j ISTIO_REDIRECT")
    );
    assert!(
        !save
            .iter()
            .any(|l| l == "-A ISTIO_OUTPUT -j ISTIO_REDIRECT"),
        "{}",
        save.join("\n")
    );
    assert_no_duplicates(&save);
    // No guardrail is left behind.
    assert!(
        !save.iter().any(|l| l.ends_with("-j DROP")),
        "{}",
        save.join("\n")
    );

    // Different flags: the sweep still finds every Istio chain and jump.
    ns.agent_ok(&[
        "istio-iptables",
        "--cleanup-only",
        "-u",
        "1337",
        "-b",
        "8080",
    ]);
    let after = ns.save("iptables-save");
    assert!(istio_lines(&after).is_empty(), "{}", after.join("\n"));
}

#[test]
fn tproxy_adds_marks_and_routes_once() {
    if !available() {
        return;
    }
    let ns = Netns::new("tproxy");
    let args = [
        "istio-iptables",
        "-p",
        "15001",
        "-z",
        "15006",
        "-u",
        "1337",
        "-m",
        "TPROXY",
        "-i",
        "*",
        "-b",
        "*",
    ];
    ns.agent_ok(&args);
    ns.agent_ok(&args);
    let save = ns.save("iptables-save");
    assert!(
        save.iter()
            .any(|l| l.starts_with("-A ISTIO_TPROXY ") && l.contains("--on-port 15006")),
        "{}",
        save.join("\n")
    );
    assert_no_duplicates(&save);
    let ip_rules = ns.exec_ok(&["ip", "rule", "show"]);
    assert_eq!(
        ip_rules.matches("fwmark 0x539 lookup 133").count(),
        1,
        "{ip_rules}"
    );
    let routes = ns.exec_ok(&["ip", "route", "show", "table", "133"]);
    assert!(routes.contains("local default dev lo"), "{routes}");

    ns.agent_ok(&["istio-clean-iptables"]);
    let after = ns.save("iptables-save");
    assert!(istio_lines(&after).is_empty(), "{}", after.join("\n"));
    assert!(
        rules(&after).is_empty(),
        "left behind:\n{}",
        after.join("\n")
    );
}

/// A copy of the binary that uid 1337 can execute wherever the build is.
fn binary_for_proxy_user() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod the directory");
    let path = dir.path().join("pilot-agent");
    std::fs::copy(binary(), &path).expect("copy the binary");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .expect("chmod the binary");
    (dir, path)
}

/// `--run-validation --skip-rule-apply` as Istio's `istio-validation`
/// container runs it: as the proxy's uid and gid.
fn validate_as_proxy(ns: &Netns, bin: &Path, timeout: &str) -> Output {
    let bin = bin.to_str().expect("a UTF-8 temporary path");
    let mut args = vec![
        "setpriv",
        "--reuid=1337",
        "--regid=1337",
        "--clear-groups",
        bin,
    ];
    args.extend_from_slice(TEMPLATE);
    args.extend(["--run-validation", "--skip-rule-apply"]);
    let timeout = format!("--probe-timeout={timeout}");
    args.push(&timeout);
    ns.exec(&args)
}

#[test]
fn validation_passes_with_rules_and_fails_without() {
    if !available() {
        return;
    }
    let (_dir, bin) = binary_for_proxy_user();

    let with_rules = Netns::new("valid");
    with_rules.agent_ok(TEMPLATE);
    let out = validate_as_proxy(&with_rules, &bin, "10s");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stderr}", out.status);
    assert!(
        stderr.contains("Validation passed, iptables rules established"),
        "{stderr}"
    );

    let without = Netns::new("novalid");
    let out = validate_as_proxy(&without, &bin, "2s");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(126), "{stderr}");
    assert!(stderr.contains(VALIDATION_FAILED), "{stderr}");
}

#[test]
fn rules_in_legacy_stay_in_legacy() {
    if !available() {
        return;
    }
    if !on_path("iptables-legacy") {
        let why = "no iptables-legacy (Debian's iptables package installs it)";
        if opted_out(why) {
            return;
        }
        panic!("{why}; run scripts/setup.sh, or set {OPT_OUT}=1 to opt out");
    }
    let ns = Netns::new("legacy");
    let mut forced: Vec<&str> = TEMPLATE.to_vec();
    forced.push("--force-iptables-binary=legacy");
    ns.agent_ok(&forced);
    let first = ns.save("iptables-legacy-save");
    assert!(!istio_lines(&first).is_empty(), "{}", first.join("\n"));
    // Istio's detection: legacy already holds rules, so it is chosen again.
    ns.agent_ok(TEMPLATE);
    let second = ns.save("iptables-legacy-save");
    assert_eq!(rules(&first).len(), rules(&second).len());
    assert_no_duplicates(&second);
    assert!(istio_lines(&ns.save("iptables-nft-save")).is_empty());
    ns.agent_ok(&["istio-clean-iptables"]);
    assert!(istio_lines(&ns.save("iptables-legacy-save")).is_empty());
}
