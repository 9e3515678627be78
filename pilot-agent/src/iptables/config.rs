//! Flags and environment of `istio-iptables` and `istio-clean-iptables`, with
//! Istio's names (`tools/istio-iptables/pkg/cmd/root.go`,
//! `tools/common/config/config.go`).
//!
//! As in Istio, most flags also read an environment variable named after the
//! flag (`--proxy-uid` reads `PROXY_UID`); a flag on the command line wins over
//! the variable, and a few flags read a second, older variable that wins over
//! the first (`ISTIO_META_DNS_CAPTURE` for `--redirect-dns`). Unlike Istio, a
//! value that cannot be used is an error naming its flag or variable, not
//! something silently ignored or passed on to `iptables`.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use common::env::Env;

pub use super::args::{CleanArgs, IptablesArgs};
pub use super::error::ConfigError;
pub use super::host::HostFacts;

/// `ISTIO_OUTBOUND_OWNER_GROUPS`: groups whose outbound traffic is captured (`*`). Env only.
pub const ENV_OWNER_GROUPS_INCLUDE: &str = "ISTIO_OUTBOUND_OWNER_GROUPS";
/// `ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE`: groups whose outbound traffic is not captured. Env only.
pub const ENV_OWNER_GROUPS_EXCLUDE: &str = "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE";
/// `ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`: the loopback range kept for the app (`127.0.0.1/32`). Env only.
pub const ENV_HOST_IPV4_LOOPBACK_CIDR: &str = "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR";
/// `ENVOY_USER`: the user whose uid is the default `--proxy-uid` (`istio-proxy`).
pub const ENV_ENVOY_USER: &str = "ENVOY_USER";

/// Istio's `ENVOY_USER` default.
pub const DEFAULT_ENVOY_USER: &str = "istio-proxy";
/// Istio's `DefaultProxyUID`, used when `ENVOY_USER` is not a known user.
pub const DEFAULT_PROXY_UID: &str = "1337";
/// Istio's default `--iptables-probe-port`.
pub const DEFAULT_PROBE_PORT: u16 = 15002;
/// Istio's default `--probe-timeout`.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Istio's limit on `ISTIO_OUTBOUND_OWNER_GROUPS` entries (they form one rule).
pub const MAX_OWNER_GROUPS_INCLUDE: usize = 64;

/// A flag's names: long, short, and the environment variables it reads.
#[derive(Debug, Clone, Copy)]
struct Flag {
    long: &'static str,
    short: Option<char>,
    /// The variable `BindEnv` derives from the long name, when Istio binds one.
    env: Option<&'static str>,
    /// A second variable that wins over `env` (Istio's `AdditionalEnv`).
    extra_env: Option<&'static str>,
}

impl Flag {
    const fn new(long: &'static str, short: Option<char>, env: Option<&'static str>) -> Self {
        Self {
            long,
            short,
            env,
            extra_env: None,
        }
    }

    const fn extra(mut self, name: &'static str) -> Self {
        self.extra_env = Some(name);
        self
    }
}

impl fmt::Display for Flag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.short {
            Some(s) => write!(f, "--{} (-{s})", self.long),
            None => write!(f, "--{}", self.long),
        }
    }
}

const ENVOY_PORT: Flag = Flag::new("envoy-port", Some('p'), None);
const INBOUND_CAPTURE_PORT: Flag = Flag::new(
    "inbound-capture-port",
    Some('z'),
    Some("INBOUND_CAPTURE_PORT"),
);
const INBOUND_TUNNEL_PORT: Flag = Flag::new(
    "inbound-tunnel-port",
    Some('e'),
    Some("INBOUND_TUNNEL_PORT"),
);
const PROXY_UID: Flag = Flag::new("proxy-uid", Some('u'), Some("PROXY_UID"));
const PROXY_GID: Flag = Flag::new("proxy-gid", Some('g'), Some("PROXY_GID"));
const INTERCEPTION_MODE: Flag = Flag::new(
    "istio-inbound-interception-mode",
    Some('m'),
    Some("ISTIO_INBOUND_INTERCEPTION_MODE"),
);
const INBOUND_PORTS: Flag = Flag::new(
    "istio-inbound-ports",
    Some('b'),
    Some("ISTIO_INBOUND_PORTS"),
);
const LOCAL_EXCLUDE_PORTS: Flag = Flag::new(
    "istio-local-exclude-ports",
    Some('d'),
    Some("ISTIO_LOCAL_EXCLUDE_PORTS"),
);
const EXCLUDE_INTERFACES: Flag = Flag::new(
    "istio-exclude-interfaces",
    Some('c'),
    Some("ISTIO_EXCLUDE_INTERFACES"),
);
const SERVICE_CIDR: Flag = Flag::new("istio-service-cidr", Some('i'), Some("ISTIO_SERVICE_CIDR"));
const SERVICE_EXCLUDE_CIDR: Flag = Flag::new(
    "istio-service-exclude-cidr",
    Some('x'),
    Some("ISTIO_SERVICE_EXCLUDE_CIDR"),
);
const OUTBOUND_PORTS: Flag = Flag::new(
    "istio-outbound-ports",
    Some('q'),
    Some("ISTIO_OUTBOUND_PORTS"),
);
const LOCAL_OUTBOUND_PORTS_EXCLUDE: Flag = Flag::new(
    "istio-local-outbound-ports-exclude",
    Some('o'),
    Some("ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE"),
);
const KUBE_VIRT_INTERFACES: Flag = Flag::new(
    "kube-virt-interfaces",
    Some('k'),
    Some("KUBE_VIRT_INTERFACES"),
);
const TPROXY_MARK: Flag = Flag::new(
    "istio-inbound-tproxy-mark",
    Some('t'),
    Some("ISTIO_INBOUND_TPROXY_MARK"),
);
const TPROXY_ROUTE_TABLE: Flag = Flag::new(
    "istio-inbound-tproxy-route-table",
    Some('r'),
    Some("ISTIO_INBOUND_TPROXY_ROUTE_TABLE"),
);
const DRY_RUN: Flag = Flag::new("dry-run", Some('n'), Some("DRY_RUN"));
const PROBE_PORT: Flag = Flag::new("iptables-probe-port", None, Some("IPTABLES_PROBE_PORT"));
const PROBE_TIMEOUT: Flag = Flag::new("probe-timeout", None, Some("PROBE_TIMEOUT"));
const SKIP_RULE_APPLY: Flag = Flag::new("skip-rule-apply", None, Some("SKIP_RULE_APPLY"));
const RUN_VALIDATION: Flag = Flag::new("run-validation", None, Some("RUN_VALIDATION"));
const REDIRECT_DNS: Flag =
    Flag::new("redirect-dns", None, Some("REDIRECT_DNS")).extra("ISTIO_META_DNS_CAPTURE");
const DROP_INVALID: Flag =
    Flag::new("drop-invalid", None, Some("DROP_INVALID")).extra("INVALID_DROP");
const DUAL_STACK: Flag =
    Flag::new("dual-stack", None, Some("DUAL_STACK")).extra("ISTIO_DUAL_STACK");
const CAPTURE_ALL_DNS: Flag = Flag::new("capture-all-dns", None, Some("CAPTURE_ALL_DNS"));
const NETWORK_NAMESPACE: Flag = Flag::new("network-namespace", None, Some("NETWORK_NAMESPACE"));
const CNI_MODE: Flag = Flag::new("cni-mode", None, Some("CNI_MODE"));
const RECONCILE: Flag = Flag::new("reconcile", None, Some("RECONCILE"));
const CLEANUP_ONLY: Flag = Flag::new("cleanup-only", None, Some("CLEANUP_ONLY"));
const FORCE_APPLY: Flag = Flag::new("force-apply", None, Some("FORCE_APPLY"));
const NATIVE_NFTABLES: Flag = Flag::new("native-nftables", None, Some("NATIVE_NFTABLES"));
const FORCE_IPTABLES_BINARY: Flag =
    Flag::new("force-iptables-binary", None, Some("FORCE_IPTABLES_BINARY"));

/// How inbound connections reach Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InterceptionMode {
    /// NAT `REDIRECT` (Istio's default).
    #[default]
    Redirect,
    /// `TPROXY` in the mangle table, keeping the original source address.
    Tproxy,
}

/// Which iptables variant `--force-iptables-binary` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `iptables-legacy` (x_tables).
    Legacy,
    /// `iptables-nft` (nf_tables).
    Nft,
}

/// An IP prefix as Go's `netip.Prefix` prints it (the address as given).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    /// The address part.
    pub addr: IpAddr,
    /// The prefix length.
    pub bits: u8,
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

impl Cidr {
    /// Parses `addr/bits` as Go's `netip.ParsePrefix`; an IPv4-mapped IPv6
    /// address stays IPv6.
    pub fn parse(s: &str) -> Option<Self> {
        let (addr, bits) = s.split_once('/')?;
        let addr: IpAddr = addr.parse().ok()?;
        if bits.is_empty() || !bits.bytes().all(|b| b.is_ascii_digit()) || bits.len() > 3 {
            return None;
        }
        let bits: u8 = bits.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (bits <= max).then_some(Self { addr, bits })
    }
}

/// One IP family's share of a CIDR list (Istio's `NetworkRange`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkRange {
    /// The list was `*`.
    pub is_wildcard: bool,
    /// The prefixes of this family, in the order given.
    pub cidrs: Vec<Cidr>,
    /// One of them is a loopback address.
    pub has_loopback: bool,
}

/// A CIDR list split into IPv4 and IPv6 (Istio's `SeparateV4V6`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpRanges {
    /// IPv4 prefixes.
    pub v4: NetworkRange,
    /// IPv6 prefixes.
    pub v6: NetworkRange,
}

impl IpRanges {
    fn parse(list: &str) -> Result<Self, ItemError> {
        if list == "*" {
            let all = NetworkRange {
                is_wildcard: true,
                ..NetworkRange::default()
            };
            return Ok(Self {
                v4: all.clone(),
                v6: all,
            });
        }
        let mut out = Self::default();
        for item in split(list) {
            let cidr = Cidr::parse(item).ok_or_else(|| ItemError::Cidr(item.to_string()))?;
            let range = if cidr.addr.is_ipv4() {
                &mut out.v4
            } else {
                &mut out.v6
            };
            range.has_loopback |= cidr.addr.is_loopback();
            range.cidrs.push(cidr);
        }
        Ok(out)
    }
}

/// The resolved configuration of one `istio-iptables` run.
#[derive(Debug, Clone)]
pub struct Config {
    /// `-p`: Envoy's outbound listener.
    pub proxy_port: u16,
    /// `-z`: Envoy's inbound listener.
    pub inbound_capture_port: u16,
    /// `-e`: the HBONE tunnel port, never captured.
    pub inbound_tunnel_port: u16,
    /// `-u`: comma-separated uids whose traffic is not captured.
    pub proxy_uid: String,
    /// `-g`: comma-separated gids whose traffic is not captured.
    pub proxy_gid: String,
    /// `-m`.
    pub interception_mode: InterceptionMode,
    /// `-t`.
    pub inbound_tproxy_mark: u32,
    /// `-r`.
    pub inbound_tproxy_route_table: u32,
    /// `-b`: `*`, a port list, or empty (no inbound capture).
    pub inbound_ports_include: String,
    /// `-d`: ports left alone when `-b` is `*`.
    pub inbound_ports_exclude: String,
    /// `ISTIO_OUTBOUND_OWNER_GROUPS`.
    pub owner_groups_include: String,
    /// `ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE`.
    pub owner_groups_exclude: String,
    /// `-q`.
    pub outbound_ports_include: String,
    /// `-o`.
    pub outbound_ports_exclude: String,
    /// `-i`, split by family.
    pub outbound_ip_ranges_include: IpRanges,
    /// `-x`, split by family.
    pub outbound_ip_ranges_exclude: IpRanges,
    /// `-k`.
    pub reroute_virtual_interfaces: String,
    /// `-c`.
    pub exclude_interfaces: String,
    /// `--iptables-probe-port`.
    pub iptables_probe_port: u16,
    /// `--probe-timeout`.
    pub probe_timeout: Duration,
    /// `-n`.
    pub dry_run: bool,
    /// `--skip-rule-apply`.
    pub skip_rule_apply: bool,
    /// `--run-validation`.
    pub run_validation: bool,
    /// `--redirect-dns`.
    pub redirect_dns: bool,
    /// `--drop-invalid`.
    pub drop_invalid: bool,
    /// `--capture-all-dns`.
    pub capture_all_dns: bool,
    /// `--dual-stack`.
    pub dual_stack: bool,
    /// `--network-namespace` (accepted; rules go to the namespace the command runs in).
    pub network_namespace: String,
    /// `--cni-mode` (accepted; no pod-scoped xtables lock is needed with nft).
    pub cni_mode: bool,
    /// `--reconcile`.
    pub reconcile: bool,
    /// `--cleanup-only`.
    pub cleanup_only: bool,
    /// `--force-apply`.
    pub force_apply: bool,
    /// `--force-iptables-binary`.
    pub force_iptables_binary: Option<Backend>,
    /// `ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`.
    pub host_ipv4_loopback_cidr: String,
    /// Facts from the host (interfaces, resolv.conf).
    pub host: HostFacts,
}

/// Istio's `config.Split`: comma-separated, empty items dropped.
pub fn split(s: &str) -> Vec<&str> {
    s.split(',').filter(|p| !p.is_empty()).collect()
}

/// Collects values with their origin and every problem found.
struct Reader<'a> {
    env: &'a dyn Env,
    problems: Vec<String>,
}

impl Reader<'_> {
    fn env_value(&self, name: Option<&'static str>) -> Option<(String, &'static str)> {
        let name = name?;
        let v = self.env.get(name).filter(|v| !v.is_empty())?;
        Some((v, name))
    }

    /// The flag's value and where it came from: the command line wins, then
    /// the additional variable, then the flag's own variable.
    fn string(&self, cli: &Option<String>, flag: Flag) -> Option<(String, String)> {
        if let Some(v) = cli {
            return Some((v.clone(), flag.to_string()));
        }
        self.env_value(flag.extra_env)
            .or_else(|| self.env_value(flag.env))
            .map(|(v, name)| (v, format!("{name} (for {flag})")))
    }

    fn text(&self, cli: &Option<String>, flag: Flag, default: &str) -> String {
        self.string(cli, flag)
            .map(|(v, _)| v)
            .unwrap_or_else(|| default.to_string())
    }

    fn bool(&mut self, cli: Option<bool>, flag: Flag) -> bool {
        if let Some(v) = cli {
            return v;
        }
        match self.string(&None, flag) {
            None => false,
            Some((v, origin)) => common::cli::parse_go_bool(&v).unwrap_or_else(|e| {
                self.problems.push(format!("{origin}: {e}"));
                false
            }),
        }
    }

    fn number<T: std::str::FromStr>(
        &mut self,
        cli: &Option<String>,
        flag: Flag,
        default: T,
        what: &str,
    ) -> T {
        match self.string(cli, flag) {
            None => default,
            Some((v, origin)) => v.trim().parse().unwrap_or_else(|_| {
                self.problems.push(format!("{origin} {v:?}: not {what}"));
                default
            }),
        }
    }

    /// A comma list whose every item passes `check`; returns the text as given.
    fn list(
        &mut self,
        cli: &Option<String>,
        flag: Flag,
        default: &str,
        wildcard: bool,
        check: fn(&str) -> Result<(), ItemError>,
    ) -> String {
        let Some((v, origin)) = self.string(cli, flag) else {
            return default.to_string();
        };
        if wildcard && v == "*" {
            return v;
        }
        for item in split(&v) {
            if let Err(e) = check(item) {
                self.problems.push(format!("{origin} {v:?}: {e}"));
                break;
            }
        }
        v
    }
}

/// Why one item of a comma list of flag or variable values is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ItemError {
    /// Not `address/prefix`.
    #[error("{0:?} is not an IP range in CIDR form (e.g. 10.0.0.0/8)")]
    Cidr(String),
    /// Not a port or `a:b` range.
    #[error("{0:?} is not a port (0-65535) or a port range (a:b)")]
    Port(String),
    /// Not a uid/gid or a user/group name.
    #[error("{0:?} is not a numeric id or a user/group name")]
    Owner(String),
    /// Not a network interface name.
    #[error("{0:?} is not a network interface name")]
    Interface(String),
}

/// Why `ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR` is refused (Istio's words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoopbackCidrError {
    /// Not a CIDR.
    #[error("failed to parse CIDR {0}")]
    Parse(String),
    /// Not an IPv4 loopback address.
    #[error("expected valid IPv4 loopback address in CIDR {cidr}; found {addr}")]
    NotLoopback {
        /// The value.
        cidr: String,
        /// Its address.
        addr: IpAddr,
    },
    /// A mask outside 8..=32.
    #[error("expected CIDR {cidr} to have mask in range [8, 32]; found {bits}")]
    Mask {
        /// The value.
        cidr: String,
        /// Its prefix length.
        bits: u8,
    },
}

fn check_port(item: &str) -> Result<(), ItemError> {
    let ok = |p: &str| {
        !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok()
    };
    let valid = match item.split_once(':') {
        Some((a, b)) => ok(a) && ok(b),
        None => ok(item),
    };
    if valid {
        Ok(())
    } else {
        Err(ItemError::Port(item.to_string()))
    }
}

fn check_owner(item: &str) -> Result<(), ItemError> {
    let valid = item
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'$'));
    if valid && !item.is_empty() {
        Ok(())
    } else {
        Err(ItemError::Owner(item.to_string()))
    }
}

fn check_interface(item: &str) -> Result<(), ItemError> {
    let valid = item.len() <= 15
        && !item.is_empty()
        && !item.contains('/')
        && !item.chars().any(char::is_whitespace);
    if valid {
        Ok(())
    } else {
        Err(ItemError::Interface(item.to_string()))
    }
}

impl Config {
    /// Resolves flags and environment as Istio does, reporting every bad value
    /// at once. Reads `/etc/passwd` only when no `--proxy-uid` is given (to
    /// look up `ENVOY_USER`). The host facts are left empty: see
    /// [`HostFacts::detect`].
    pub fn from_args(args: &IptablesArgs, env: &dyn Env) -> Result<Self, ConfigError> {
        let mut r = Reader {
            env,
            problems: Vec::new(),
        };
        let port = "a port number (0-65535)";
        let proxy_port = r.number(&args.envoy_port, ENVOY_PORT, 15001u16, port);
        let inbound_capture_port = r.number(
            &args.inbound_capture_port,
            INBOUND_CAPTURE_PORT,
            15006u16,
            port,
        );
        let inbound_tunnel_port = r.number(
            &args.inbound_tunnel_port,
            INBOUND_TUNNEL_PORT,
            15008u16,
            port,
        );
        let (proxy_uid, proxy_gid) = r.owners(args);
        let interception_mode = r.interception_mode(args);
        let mark = "a packet mark (a number)";
        let inbound_tproxy_mark = r.number(&args.inbound_tproxy_mark, TPROXY_MARK, 1337u32, mark);
        let inbound_tproxy_route_table = r.number(
            &args.inbound_tproxy_route_table,
            TPROXY_ROUTE_TABLE,
            133u32,
            "a routing table number",
        );
        let inbound_ports_include =
            r.list(&args.inbound_ports, INBOUND_PORTS, "", true, check_port);
        let inbound_ports_exclude = r.list(
            &args.local_exclude_ports,
            LOCAL_EXCLUDE_PORTS,
            "",
            false,
            check_port,
        );
        let outbound_ports_include =
            r.list(&args.outbound_ports, OUTBOUND_PORTS, "", false, check_port);
        let outbound_ports_exclude = r.list(
            &args.local_outbound_ports_exclude,
            LOCAL_OUTBOUND_PORTS_EXCLUDE,
            "",
            false,
            check_port,
        );
        let reroute_virtual_interfaces = r.list(
            &args.kube_virt_interfaces,
            KUBE_VIRT_INTERFACES,
            "",
            false,
            check_interface,
        );
        let exclude_interfaces = r.list(
            &args.exclude_interfaces,
            EXCLUDE_INTERFACES,
            "",
            false,
            check_interface,
        );
        let outbound_ip_ranges_include = r.ranges(&args.service_cidr, SERVICE_CIDR, false);
        let outbound_ip_ranges_exclude =
            r.ranges(&args.service_exclude_cidr, SERVICE_EXCLUDE_CIDR, true);
        let iptables_probe_port = r.number(
            &args.iptables_probe_port,
            PROBE_PORT,
            DEFAULT_PROBE_PORT,
            port,
        );
        let probe_timeout = r.probe_timeout(args);
        let force_iptables_binary = r.force_binary(args);
        let (owner_groups_include, owner_groups_exclude) = r.owner_groups();
        let host_ipv4_loopback_cidr = r.loopback_cidr();
        let cfg = Config {
            proxy_port,
            inbound_capture_port,
            inbound_tunnel_port,
            proxy_uid,
            proxy_gid,
            interception_mode,
            inbound_tproxy_mark,
            inbound_tproxy_route_table,
            inbound_ports_include,
            inbound_ports_exclude,
            owner_groups_include,
            owner_groups_exclude,
            outbound_ports_include,
            outbound_ports_exclude,
            outbound_ip_ranges_include,
            outbound_ip_ranges_exclude,
            reroute_virtual_interfaces,
            exclude_interfaces,
            iptables_probe_port,
            probe_timeout,
            dry_run: r.bool(args.dry_run, DRY_RUN),
            skip_rule_apply: r.bool(args.skip_rule_apply, SKIP_RULE_APPLY),
            run_validation: r.bool(args.run_validation, RUN_VALIDATION),
            redirect_dns: r.bool(args.redirect_dns, REDIRECT_DNS),
            drop_invalid: r.bool(args.drop_invalid, DROP_INVALID),
            capture_all_dns: r.bool(args.capture_all_dns, CAPTURE_ALL_DNS),
            dual_stack: r.bool(args.dual_stack, DUAL_STACK),
            network_namespace: r.text(&args.network_namespace, NETWORK_NAMESPACE, ""),
            cni_mode: r.bool(args.cni_mode, CNI_MODE),
            reconcile: r.bool(args.reconcile, RECONCILE),
            cleanup_only: r.bool(args.cleanup_only, CLEANUP_ONLY),
            force_apply: r.bool(args.force_apply, FORCE_APPLY),
            force_iptables_binary,
            host_ipv4_loopback_cidr,
            host: HostFacts::default(),
        };
        if r.bool(args.native_nftables, NATIVE_NFTABLES) {
            r.problems.push(format!(
                "{NATIVE_NFTABLES}: native nftables rules are not supported by this pilot-agent; drop the flag to use iptables"
            ));
        }
        if r.problems.is_empty() {
            Ok(cfg)
        } else {
            Err(ConfigError::Invalid(r.problems))
        }
    }

    /// The values Istio's `Config.Print` logs, one `NAME=value` per line.
    pub fn summary(&self) -> String {
        let mode = match self.interception_mode {
            InterceptionMode::Redirect => "REDIRECT",
            InterceptionMode::Tproxy => "TPROXY",
        };
        let h = &self.host;
        [
            format!("PROXY_PORT={}", self.proxy_port),
            format!("PROXY_INBOUND_CAPTURE_PORT={}", self.inbound_capture_port),
            format!("PROXY_TUNNEL_PORT={}", self.inbound_tunnel_port),
            format!("PROXY_UID={}", self.proxy_uid),
            format!("PROXY_GID={}", self.proxy_gid),
            format!("INBOUND_INTERCEPTION_MODE={mode}"),
            format!("INBOUND_TPROXY_MARK={}", self.inbound_tproxy_mark),
            format!(
                "INBOUND_TPROXY_ROUTE_TABLE={}",
                self.inbound_tproxy_route_table
            ),
            format!("INBOUND_PORTS_INCLUDE={}", self.inbound_ports_include),
            format!("INBOUND_PORTS_EXCLUDE={}", self.inbound_ports_exclude),
            format!(
                "OUTBOUND_OWNER_GROUPS_INCLUDE={}",
                self.owner_groups_include
            ),
            format!(
                "OUTBOUND_OWNER_GROUPS_EXCLUDE={}",
                self.owner_groups_exclude
            ),
            format!("OUTBOUND_PORTS_INCLUDE={}", self.outbound_ports_include),
            format!("OUTBOUND_PORTS_EXCLUDE={}", self.outbound_ports_exclude),
            format!("KUBE_VIRT_INTERFACES={}", self.reroute_virtual_interfaces),
            format!("ENABLE_INBOUND_IPV6={}", h.enable_ipv6),
            format!("DUAL_STACK={}", self.dual_stack),
            format!("DNS_CAPTURE={}", self.redirect_dns),
            format!("DROP_INVALID={}", self.drop_invalid),
            format!("CAPTURE_ALL_DNS={}", self.capture_all_dns),
            format!("DNS_SERVERS={:?},{:?}", h.dns_servers_v4, h.dns_servers_v6),
            format!("NETWORK_NAMESPACE={}", self.network_namespace),
            format!("CNI_MODE={}", self.cni_mode),
            format!("EXCLUDE_INTERFACES={}", self.exclude_interfaces),
            format!("RECONCILE={}", self.reconcile),
            format!("CLEANUP_ONLY={}", self.cleanup_only),
            format!("FORCE_APPLY={}", self.force_apply),
        ]
        .join("\n")
    }
}

impl Reader<'_> {
    /// `-u` (default: `ENVOY_USER`'s uid, else 1337) and `-g` (default: `-u`).
    fn owners(&mut self, args: &IptablesArgs) -> (String, String) {
        let mut uid = self.list(&args.proxy_uid, PROXY_UID, "", false, check_owner);
        if uid.is_empty() {
            let user = self
                .env
                .get(ENV_ENVOY_USER)
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| DEFAULT_ENVOY_USER.to_string());
            uid = super::host::lookup_uid(&user).unwrap_or_else(|| DEFAULT_PROXY_UID.to_string());
        }
        let mut gid = self.list(&args.proxy_gid, PROXY_GID, "", false, check_owner);
        if gid.is_empty() {
            gid = uid.clone();
        }
        (uid, gid)
    }

    fn interception_mode(&mut self, args: &IptablesArgs) -> InterceptionMode {
        let Some((v, origin)) = self.string(&args.inbound_interception_mode, INTERCEPTION_MODE)
        else {
            return InterceptionMode::Redirect;
        };
        match v.as_str() {
            "REDIRECT" => InterceptionMode::Redirect,
            "TPROXY" => InterceptionMode::Tproxy,
            _ => {
                self.problems
                    .push(format!("{origin} {v:?}: use REDIRECT or TPROXY"));
                InterceptionMode::Redirect
            }
        }
    }

    fn probe_timeout(&mut self, args: &IptablesArgs) -> Duration {
        let Some((v, origin)) = self.string(&args.probe_timeout, PROBE_TIMEOUT) else {
            return DEFAULT_PROBE_TIMEOUT;
        };
        common::duration::parse(&v).unwrap_or_else(|e| {
            self.problems.push(format!("{origin}: {e}"));
            DEFAULT_PROBE_TIMEOUT
        })
    }

    fn force_binary(&mut self, args: &IptablesArgs) -> Option<Backend> {
        let (v, origin) = self.string(&args.force_iptables_binary, FORCE_IPTABLES_BINARY)?;
        match v.as_str() {
            "legacy" => Some(Backend::Legacy),
            "nft" => Some(Backend::Nft),
            _ => {
                self.problems.push(format!(
                    "{origin}: invalid FORCE_IPTABLES_BINARY value {v:?} (use legacy or nft)"
                ));
                None
            }
        }
    }

    /// `ISTIO_OUTBOUND_OWNER_GROUPS` (`*`) and `..._EXCLUDE`, checked as Istio's `ValidateOwnerGroups`.
    fn owner_groups(&mut self) -> (String, String) {
        let include = self
            .env
            .get(ENV_OWNER_GROUPS_INCLUDE)
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "*".to_string());
        let exclude = self.env.get(ENV_OWNER_GROUPS_EXCLUDE).unwrap_or_default();
        check_owner_groups(&include, &exclude, &mut self.problems);
        (include, exclude)
    }

    /// `ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR` (`127.0.0.1/32`).
    fn loopback_cidr(&mut self) -> String {
        let cidr = self
            .env
            .get(ENV_HOST_IPV4_LOOPBACK_CIDR)
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "127.0.0.1/32".to_string());
        if let Err(e) = check_ipv4_loopback_cidr(&cidr) {
            self.problems
                .push(format!("{ENV_HOST_IPV4_LOOPBACK_CIDR}: {e}"));
        }
        cidr
    }

    fn ranges(&mut self, cli: &Option<String>, flag: Flag, exclude: bool) -> IpRanges {
        let Some((v, origin)) = self.string(cli, flag) else {
            return IpRanges::default();
        };
        if exclude && v == "*" {
            // Istio: "invalid value for OUTBOUND_IP_RANGES_EXCLUDE".
            self.problems.push(format!(
                "{origin} \"*\": invalid value for OUTBOUND_IP_RANGES_EXCLUDE (a wildcard cannot be excluded)"
            ));
            return IpRanges::default();
        }
        IpRanges::parse(&v).unwrap_or_else(|e| {
            self.problems.push(format!("{origin} {v:?}: {e}"));
            IpRanges::default()
        })
    }
}

/// Istio's `ValidateOwnerGroups`.
fn check_owner_groups(include: &str, exclude: &str, problems: &mut Vec<String>) {
    if include != "*" {
        let values = split(include);
        if values.len() > MAX_OWNER_GROUPS_INCLUDE {
            problems.push(format!(
                "{ENV_OWNER_GROUPS_INCLUDE}: number of owner groups whose outgoing traffic should be redirected to Envoy cannot exceed {MAX_OWNER_GROUPS_INCLUDE}, got {}: {values:?}",
                values.len()
            ));
        }
    }
    for (name, list) in [
        (ENV_OWNER_GROUPS_INCLUDE, include),
        (ENV_OWNER_GROUPS_EXCLUDE, exclude),
    ] {
        if list == "*" {
            continue;
        }
        for item in split(list) {
            if let Err(e) = check_owner(item) {
                problems.push(format!("{name}: {e}"));
            }
        }
    }
}

/// Istio's `ValidateIPv4LoopbackCidr`.
fn check_ipv4_loopback_cidr(cidr: &str) -> Result<(), LoopbackCidrError> {
    let p = Cidr::parse(cidr).ok_or_else(|| LoopbackCidrError::Parse(cidr.to_string()))?;
    if !p.addr.is_ipv4() || !p.addr.is_loopback() {
        return Err(LoopbackCidrError::NotLoopback {
            cidr: cidr.to_string(),
            addr: p.addr,
        });
    }
    if !(8..=32).contains(&p.bits) {
        return Err(LoopbackCidrError::Mask {
            cidr: cidr.to_string(),
            bits: p.bits,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::env::MapEnv;

    fn args(f: impl FnOnce(&mut IptablesArgs)) -> IptablesArgs {
        let mut a = IptablesArgs {
            proxy_uid: Some("1337".into()),
            ..IptablesArgs::default()
        };
        f(&mut a);
        a
    }

    #[test]
    fn every_bad_value_is_reported_with_its_flag() {
        let a = args(|a| {
            a.envoy_port = Some("abc".into());
            a.inbound_interception_mode = Some("NAT".into());
            a.service_cidr = Some("10.0.0.0".into());
            a.inbound_ports = Some("80,http".into());
        });
        let env = MapEnv::from_pairs([("PROBE_TIMEOUT", "soon")]);
        let err = Config::from_args(&a, &env).unwrap_err().to_string();
        for needle in [
            "--envoy-port (-p) \"abc\"",
            "--istio-inbound-interception-mode (-m) \"NAT\"",
            "--istio-service-cidr (-i)",
            "--istio-inbound-ports (-b)",
            "PROBE_TIMEOUT (for --probe-timeout)",
        ] {
            assert!(err.contains(needle), "{needle} missing in {err}");
        }
    }

    #[test]
    fn flag_wins_over_env_and_extra_env_over_env() {
        let env = MapEnv::from_pairs([
            ("INBOUND_CAPTURE_PORT", "16006"),
            ("REDIRECT_DNS", "false"),
            ("ISTIO_META_DNS_CAPTURE", "true"),
        ]);
        let cfg = Config::from_args(&args(|_| {}), &env).unwrap();
        assert_eq!(cfg.inbound_capture_port, 16006);
        assert!(cfg.redirect_dns);
        let cfg = Config::from_args(
            &args(|a| a.inbound_capture_port = Some("17006".into())),
            &env,
        )
        .unwrap();
        assert_eq!(cfg.inbound_capture_port, 17006);
        assert_eq!(cfg.proxy_gid, "1337");
    }

    #[test]
    fn list_items_and_the_loopback_cidr_fail_by_kind() {
        assert_eq!(check_port("8080:x"), Err(ItemError::Port("8080:x".into())));
        assert_eq!(check_owner(""), Err(ItemError::Owner(String::new())));
        assert_eq!(
            check_interface("a/b"),
            Err(ItemError::Interface("a/b".into()))
        );
        assert_eq!(
            IpRanges::parse("10.0.0.0/8,x"),
            Err(ItemError::Cidr("x".into()))
        );
        let err = check_ipv4_loopback_cidr("10.0.0.1/8").unwrap_err();
        assert!(
            matches!(err, LoopbackCidrError::NotLoopback { .. }),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "expected valid IPv4 loopback address in CIDR 10.0.0.1/8; found 10.0.0.1"
        );
        assert!(matches!(
            check_ipv4_loopback_cidr("127.0.0.1/4"),
            Err(LoopbackCidrError::Mask { bits: 4, .. })
        ));
    }
}
