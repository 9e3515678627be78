//! `istio-iptables` dry runs against Istio's own expected rules
//! (`testdata/iptables/*.golden`, see the README there): each case parses the
//! flags Istio's test used with the binary's parser, sets the two host facts
//! (name servers, IPv6) through the configuration's seam, and must print
//! exactly the `iptables-restore` lines of the golden file.

use std::path::PathBuf;
use std::process::Command;

use common::env::MapEnv;
use pilot_agent::iptables::{self, Config, HostFacts, INJECTION_TEMPLATE_ARGS};

/// Istio's test defaults (also the injection template's values).
const DEFAULTS: &[&str] = &[
    "-p", "15001", "-z", "15006", "-e", "15008", "-u", "1337", "-g", "1337", "-t", "1337", "-r",
    "133",
];

struct Case {
    name: &'static str,
    flags: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    dns: &'static [&'static str],
    ipv6: bool,
}

const fn case(name: &'static str, flags: &'static [&'static str]) -> Case {
    Case {
        name,
        flags,
        env: &[],
        dns: &[],
        ipv6: false,
    }
}

const fn with_env(mut c: Case, env: &'static [(&'static str, &'static str)]) -> Case {
    c.env = env;
    c
}

const fn with_dns(mut c: Case, dns: &'static [&'static str]) -> Case {
    c.dns = dns;
    c
}

const fn ipv6(mut c: Case) -> Case {
    c.ipv6 = true;
    c
}

const UID_GID: &[&str] = &["--redirect-dns", "-g", "1,2", "-u", "3,4"];
const V6_NETS: &[&str] = &[
    "-b",
    "4000,5000",
    "-d",
    "6000,7000,",
    "-k",
    "eth0,eth1",
    "-x",
    "2001:db8::/32",
    "-i",
    "2001:db8::/32",
];

fn cases() -> Vec<Case> {
    let groups = [("ISTIO_OUTBOUND_OWNER_GROUPS", "java,202")];
    let groups_exclude = [("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "888,ftp")];
    let local_dns: &[&str] = &["127.0.0.53"];
    vec![
        case("empty", &[]),
        case("ipnets", &["-i", "10.0.0.0/8"]),
        case("kube-virt-interfaces", &["-k", "eth1,eth2", "-i", "*"]),
        case(
            "ipnets-with-kube-virt-interfaces",
            &["-k", "eth1,eth2", "-i", "10.0.0.0/8"],
        ),
        case("inbound-ports-wildcard", &["-b", "*"]),
        case(
            "inbound-ports-tproxy",
            &["-b", "32000,31000", "-m", "TPROXY"],
        ),
        case(
            "inbound-ports-wildcard-tproxy",
            &["-b", "*", "-m", "TPROXY"],
        ),
        with_env(case("outbound-owner-groups", &[]), leak(&groups)),
        with_env(
            case("outbound-owner-groups-exclude", &[]),
            leak(&groups_exclude),
        ),
        with_env(
            case("host-ipv4-loopback-cidr", &[]),
            &[("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.1/8")],
        ),
        with_dns(
            case(
                "ip-range",
                &[
                    "-x",
                    "1.1.0.0/16",
                    "-i",
                    "9.9.0.0/16",
                    "--redirect-dns",
                    "-g",
                    "1,2",
                    "-u",
                    "3,4",
                ],
            ),
            local_dns,
        ),
        with_dns(
            case(
                "loopback-outbound-iprange",
                &[
                    "-i",
                    "127.1.2.3/32",
                    "--redirect-dns",
                    "-g",
                    "1,2",
                    "-u",
                    "3,4",
                ],
            ),
            local_dns,
        ),
        ipv6(with_dns(
            case(
                "tproxy",
                &[
                    "-m",
                    "TPROXY",
                    "-b",
                    "*",
                    "-x",
                    "1.1.0.0/16",
                    "-i",
                    "9.9.0.0/16",
                    "--redirect-dns",
                    "-c",
                    "not-istio-nic",
                ],
            ),
            local_dns,
        )),
        ipv6(with_dns(
            case("dns-uid-gid", UID_GID),
            &["127.0.0.53", "::127.0.0.53"],
        )),
        ipv6(case("ipv6-empty-inbound-ports", &[])),
        ipv6(case("ipv6-inbound-ports", &["-b", "4000,5000"])),
        ipv6(case(
            "ipv6-virt-interfaces",
            &["-b", "4000,5000", "-k", "eth0,eth1"],
        )),
        ipv6(case("ipv6-ipnets", V6_NETS)),
        ipv6(case(
            "ipv6-uid-gid",
            &[
                "-b",
                "4000,5000",
                "-d",
                "6000,7000",
                "-k",
                "eth0,eth1",
                "-g",
                "1,2",
                "-u",
                "3,4",
                "-x",
                "2001:db8::/32",
                "-i",
                "2001:db8::/32",
            ],
        )),
        ipv6(case("ipv6-outbound-ports", &["-q", "32000,31000"])),
        ipv6(case("ipv6-dns-uid-gid", UID_GID)),
        ipv6(with_env(
            case("ipv6-dns-outbound-owner-groups", &["--redirect-dns"]),
            leak(&groups),
        )),
        ipv6(with_env(
            case(
                "ipv6-dns-outbound-owner-groups-exclude",
                &["--redirect-dns"],
            ),
            leak(&groups_exclude),
        )),
    ]
}

fn leak(pairs: &[(&'static str, &'static str)]) -> &'static [(&'static str, &'static str)] {
    Box::leak(pairs.to_vec().into_boxed_slice())
}

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/testdata/iptables")
        .join(format!("{name}.golden"))
}

/// The golden's `iptables-restore` input: every line but the save commands.
fn restore_lines(golden: &str) -> Vec<String> {
    golden
        .lines()
        .filter(|l| *l != "iptables-save" && *l != "ip6tables-save")
        .map(str::to_string)
        .collect()
}

fn config_for(c: &Case) -> Config {
    let mut argv = vec!["istio-iptables"];
    argv.extend_from_slice(DEFAULTS);
    argv.extend_from_slice(c.flags);
    let args = iptables::parse_args(&argv).unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let mut env = vec![
        ("ISTIO_OUTBOUND_OWNER_GROUPS", "*"),
        ("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.1/32"),
    ];
    env.extend_from_slice(c.env);
    let mut cfg = Config::from_args(&args, &MapEnv::from_pairs(env))
        .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let (v4, v6): (Vec<&str>, Vec<&str>) = c.dns.iter().partition(|s| !s.contains(':'));
    cfg.host = HostFacts {
        host_ip: None,
        enable_ipv6: c.ipv6,
        dns_servers_v4: v4.into_iter().map(String::from).collect(),
        dns_servers_v6: v6.into_iter().map(String::from).collect(),
    };
    cfg
}

#[test]
fn dry_run_matches_every_istio_golden() {
    let cases = cases();
    let goldens = std::fs::read_dir(testdata("x").parent().unwrap())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "golden")
        })
        .count();
    assert_eq!(cases.len(), 23);
    assert_eq!(goldens, cases.len(), "one case per golden file");
    let mut failures = Vec::new();
    for c in &cases {
        let golden =
            std::fs::read_to_string(testdata(c.name)).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let want = restore_lines(&golden);
        let got: Vec<String> = iptables::dry_run_output(&config_for(c))
            .lines()
            .map(str::to_string)
            .collect();
        if got != want {
            failures.push(format!(
                "{}:\n--- want\n{}\n--- got\n{}",
                c.name,
                want.join("\n"),
                got.join("\n")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The rules of Istio's injection template (`istio-init`), IPv4.
const INJECTION_TEMPLATE_V4: &str = "* nat
-N ISTIO_INBOUND
-N ISTIO_REDIRECT
-N ISTIO_IN_REDIRECT
-N ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15021 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN
-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_OUTPUT -j ISTIO_REDIRECT
COMMIT
";

#[test]
fn binary_dry_run_prints_only_the_rules_on_stdout() {
    let out = Command::new(env!("CARGO_BIN_EXE_pilot-agent"))
        .args(INJECTION_TEMPLATE_ARGS)
        .arg("-n")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}\n{stderr}", out.status);
    // The host decides whether IPv6 rules follow; the IPv4 ones come first.
    assert!(
        stdout.starts_with(INJECTION_TEMPLATE_V4),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let rest = &stdout[INJECTION_TEMPLATE_V4.len()..];
    assert!(rest.is_empty() || rest.starts_with("* nat\n"), "{rest}");
    assert!(stderr.contains("dry-run mode"), "{stderr}");
    assert!(
        !stdout.contains("info\t"),
        "logs leaked to stdout:\n{stdout}"
    );
}

#[test]
fn bad_values_name_their_flag_and_exit_1() {
    let out = Command::new(env!("CARGO_BIN_EXE_pilot-agent"))
        .args([
            "istio-iptables",
            "-n",
            "-p",
            "abc",
            "-m",
            "NAT",
            "-u",
            "1337",
        ])
        .env_clear()
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--envoy-port (-p) \"abc\""), "{stderr}");
    assert!(
        stderr.contains("--istio-inbound-interception-mode (-m) \"NAT\""),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn clean_dry_run_lists_the_commands_for_both_families() {
    let args = iptables::parse_clean_args(["istio-clean-iptables", "-n", "-u", "1337"]).unwrap();
    let env = MapEnv::default();
    let cfg = iptables::load_clean_config(&args, &env).unwrap();
    let mut out = Vec::new();
    iptables::run_istio_clean_iptables(&cfg, &mut out).unwrap();
    let out = String::from_utf8(out).unwrap();
    for line in [
        "iptables -t nat -D OUTPUT -j ISTIO_OUTPUT",
        "iptables -t nat -X ISTIO_OUTPUT",
        "ip6tables -t nat -X ISTIO_IN_REDIRECT",
    ] {
        assert!(out.lines().any(|l| l == line), "{line} missing in\n{out}");
    }
}
