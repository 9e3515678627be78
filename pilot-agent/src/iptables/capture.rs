//! Istio's sidecar capture rules computed from the configuration
//! (`tools/istio-iptables/pkg/capture/run.go`), rule for rule and in the same
//! order, so the restore input matches Istio's byte for byte.

use super::builder::{IP_VERSION_SPECIFIC as IPV, RuleBuilder, chain};
use super::config::{Config, InterceptionMode, NetworkRange, split};

/// The agent's DNS proxy port.
pub const DNS_LISTENER_PORT: &str = "15053";
/// Istio's `OutboundMark`: Envoy's outbound traffic to the app in TPROXY mode.
pub const OUTBOUND_MARK: &str = "1338";

/// Which owners' traffic is captured (Istio's `InterceptFilter`).
struct OwnerFilter<'a> {
    values: Vec<&'a str>,
    except: bool,
}

fn owner_filter<'a>(include: &'a str, exclude: &'a str) -> OwnerFilter<'a> {
    if include == "*" {
        OwnerFilter {
            values: split(exclude),
            except: true,
        }
    } else {
        OwnerFilter {
            values: split(include),
            except: false,
        }
    }
}

/// All of Istio's rules for `cfg` (Istio's `IptablesConfigurator.Run`, up to
/// executing them).
pub fn build(cfg: &Config) -> RuleBuilder {
    let mut b = RuleBuilder::new(cfg.host.enable_ipv6);
    let mut redirect_dns = cfg.redirect_dns;
    if redirect_dns
        && !cfg.capture_all_dns
        && cfg.host.dns_servers_v4.is_empty()
        && cfg.host.dns_servers_v6.is_empty()
    {
        tracing::warn!(
            "REDIRECT_DNS is set, but CAPTURE_ALL_DNS is false, and no DNS servers provided. DNS capture disabled."
        );
        redirect_dns = false;
    }
    short_circuit_exclude_interfaces(&mut b, cfg);
    for iface in split(&cfg.reroute_virtual_interfaces) {
        b.insert(
            "PREROUTING",
            "nat",
            1,
            ipt_args!["-i", iface, "-j", "RETURN"],
        );
    }
    if cfg.drop_invalid {
        b.append(
            "PREROUTING",
            "mangle",
            ipt_args!["-m", "conntrack", "--ctstate", "INVALID", "-j", chain::DROP],
        );
        b.append(chain::DROP, "mangle", ipt_args!["-j", "DROP"]);
    }
    b.append(
        chain::INBOUND,
        "nat",
        ipt_args![
            "-p",
            "tcp",
            "--dport",
            cfg.inbound_tunnel_port,
            "-j",
            "RETURN"
        ],
    );
    b.append(
        chain::REDIRECT,
        "nat",
        ipt_args!["-p", "tcp", "-j", "REDIRECT", "--to-ports", cfg.proxy_port],
    );
    b.append(
        chain::IN_REDIRECT,
        "nat",
        ipt_args![
            "-p",
            "tcp",
            "-j",
            "REDIRECT",
            "--to-ports",
            cfg.inbound_capture_port
        ],
    );
    inbound_ports(&mut b, cfg);
    b.append("OUTPUT", "nat", ipt_args!["-j", chain::OUTPUT]);
    for port in split(&cfg.outbound_ports_exclude) {
        b.append(
            chain::OUTPUT,
            "nat",
            ipt_args!["-p", "tcp", "--dport", port, "-j", "RETURN"],
        );
        b.append(
            chain::OUTPUT,
            "nat",
            ipt_args!["-p", "udp", "--dport", port, "-j", "RETURN"],
        );
    }
    // 127.0.0.6/::6 is the source of Envoy's inbound passthrough connections.
    b.append_versioned(
        "127.0.0.6/32",
        "::6/128",
        chain::OUTPUT,
        "nat",
        ipt_args!["-o", "lo", "-s", IPV, "-j", "RETURN"],
    );
    owner_rules(&mut b, cfg, redirect_dns);
    let groups = owner_filter(&cfg.owner_groups_include, &cfg.owner_groups_exclude);
    capture_by_owner_group(&mut b, &groups);
    if redirect_dns {
        dns_redirect(&mut b, cfg);
    }
    // Traffic to localhost (Envoy-aware apps, container to container) stays.
    b.append_versioned(
        &cfg.host_ipv4_loopback_cidr,
        "::1/128",
        chain::OUTPUT,
        "nat",
        ipt_args!["-d", IPV, "-j", "RETURN"],
    );
    for cidr in &cfg.outbound_ip_ranges_exclude.v4.cidrs {
        b.append_v4(chain::OUTPUT, "nat", ipt_args!["-d", cidr, "-j", "RETURN"]);
    }
    for cidr in &cfg.outbound_ip_ranges_exclude.v6.cidrs {
        b.append_v6(chain::OUTPUT, "nat", ipt_args!["-d", cidr, "-j", "RETURN"]);
    }
    for port in split(&cfg.outbound_ports_include) {
        b.append(
            chain::OUTPUT,
            "nat",
            ipt_args!["-p", "tcp", "--dport", port, "-j", chain::REDIRECT],
        );
    }
    outbound_include(&mut b, cfg, &cfg.outbound_ip_ranges_include.v4, false);
    outbound_include(&mut b, cfg, &cfg.outbound_ip_ranges_include.v6, true);
    if cfg.interception_mode == InterceptionMode::Tproxy {
        tproxy_marks(&mut b, cfg);
    }
    b
}

fn short_circuit_exclude_interfaces(b: &mut RuleBuilder, cfg: &Config) {
    let ifaces = split(&cfg.exclude_interfaces);
    for iface in &ifaces {
        b.append("PREROUTING", "nat", ipt_args!["-i", iface, "-j", "RETURN"]);
        b.append("OUTPUT", "nat", ipt_args!["-o", iface, "-j", "RETURN"]);
    }
    if cfg.interception_mode == InterceptionMode::Tproxy {
        for iface in &ifaces {
            b.append(
                "PREROUTING",
                "mangle",
                ipt_args!["-i", iface, "-j", "RETURN"],
            );
            b.append("OUTPUT", "mangle", ipt_args!["-o", iface, "-j", "RETURN"]);
        }
    }
}

/// Istio's `handleInboundPortsInclude`.
fn inbound_ports(b: &mut RuleBuilder, cfg: &Config) {
    if cfg.inbound_ports_include.is_empty() {
        return;
    }
    let tproxy = cfg.interception_mode == InterceptionMode::Tproxy;
    let mark = cfg.inbound_tproxy_mark.to_string();
    let table = if tproxy {
        // Marked packets are routed to loopback, where TPROXY hands them to Envoy.
        b.append(
            chain::DIVERT,
            "mangle",
            ipt_args!["-j", "MARK", "--set-mark", mark],
        );
        b.append(chain::DIVERT, "mangle", ipt_args!["-j", "ACCEPT"]);
        b.append_versioned(
            &cfg.host_ipv4_loopback_cidr,
            "::1/128",
            chain::TPROXY,
            "mangle",
            ipt_args![
                "!",
                "-d",
                IPV,
                "-p",
                "tcp",
                "-j",
                "TPROXY",
                "--tproxy-mark",
                format!("{mark}/0xffffffff"),
                "--on-port",
                cfg.inbound_capture_port
            ],
        );
        "mangle"
    } else {
        "nat"
    };
    b.append(
        "PREROUTING",
        table,
        ipt_args!["-p", "tcp", "-j", chain::INBOUND],
    );
    if cfg.inbound_ports_include == "*" {
        for port in split(&cfg.inbound_ports_exclude) {
            b.append(
                chain::INBOUND,
                table,
                ipt_args!["-p", "tcp", "--dport", port, "-j", "RETURN"],
            );
        }
        if tproxy {
            b.append(
                chain::INBOUND,
                "mangle",
                ipt_args![
                    "-p",
                    "tcp",
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "RELATED,ESTABLISHED",
                    "-j",
                    chain::DIVERT
                ],
            );
            b.append(
                chain::INBOUND,
                "mangle",
                ipt_args!["-p", "tcp", "-j", chain::TPROXY],
            );
        } else {
            b.append(
                chain::INBOUND,
                "nat",
                ipt_args!["-p", "tcp", "-j", chain::IN_REDIRECT],
            );
        }
        return;
    }
    for port in split(&cfg.inbound_ports_include) {
        if tproxy {
            b.append(
                chain::INBOUND,
                "mangle",
                ipt_args![
                    "-p",
                    "tcp",
                    "--dport",
                    port,
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "RELATED,ESTABLISHED",
                    "-j",
                    chain::DIVERT
                ],
            );
            b.append(
                chain::INBOUND,
                "mangle",
                ipt_args!["-p", "tcp", "--dport", port, "-j", chain::TPROXY],
            );
        } else {
            b.append(
                chain::INBOUND,
                "nat",
                ipt_args!["-p", "tcp", "--dport", port, "-j", chain::IN_REDIRECT],
            );
        }
    }
}

/// The per-uid and per-gid rules of `ISTIO_OUTPUT`.
fn owner_rules(b: &mut RuleBuilder, cfg: &Config, redirect_dns: bool) {
    let loopback_listed = cfg.outbound_ip_ranges_include.v4.has_loopback
        || cfg.outbound_ip_ranges_include.v6.has_loopback;
    let tunnel = cfg.inbound_tunnel_port;
    let lo = cfg.host_ipv4_loopback_cidr.as_str();
    for (kind, ids) in [
        ("--uid-owner", &cfg.proxy_uid),
        ("--gid-owner", &cfg.proxy_gid),
    ] {
        for id in split(ids) {
            // App calls back to itself through a Service VIP go app -> Envoy
            // (outbound) -> Envoy (inbound) -> app. With DNS capture, port 53
            // skips the inbound hop (only for uids, as in Istio).
            let ports = if redirect_dns && kind == "--uid-owner" {
                ipt_args!["-m", "multiport", "!", "--dports", format!("53,{tunnel}")]
            } else {
                ipt_args!["!", "--dport", tunnel]
            };
            let mut params = ipt_args!["-o", "lo", "!", "-d", IPV, "-p", "tcp"];
            params.extend(ports);
            params.extend(ipt_args!["-m", "owner", kind, id, "-j", chain::IN_REDIRECT]);
            b.append_versioned(lo, "::1/128", chain::OUTPUT, "nat", params);
            // App to itself over loopback by endpoint address stays, unless
            // loopback was asked for in -i.
            if !loopback_listed {
                if redirect_dns {
                    // TCP DNS to a server on localhost is still captured.
                    b.append(
                        chain::OUTPUT,
                        "nat",
                        ipt_args![
                            "-o", "lo", "-p", "tcp", "!", "--dport", "53", "-m", "owner", "!",
                            kind, id, "-j", "RETURN"
                        ],
                    );
                } else {
                    b.append(
                        chain::OUTPUT,
                        "nat",
                        ipt_args!["-o", "lo", "-m", "owner", "!", kind, id, "-j", "RETURN"],
                    );
                }
            }
            // Envoy's own traffic is never captured (any protocol).
            b.append(
                chain::OUTPUT,
                "nat",
                ipt_args!["-m", "owner", kind, id, "-j", "RETURN"],
            );
        }
    }
}

/// Istio's `handleCaptureByOwnerGroup`.
fn capture_by_owner_group(b: &mut RuleBuilder, filter: &OwnerFilter<'_>) {
    if filter.except {
        for group in &filter.values {
            b.append(
                chain::OUTPUT,
                "nat",
                ipt_args!["-m", "owner", "--gid-owner", group, "-j", "RETURN"],
            );
        }
    } else {
        let mut params = Vec::new();
        for group in &filter.values {
            params.extend(ipt_args!["-m", "owner", "!", "--gid-owner", group]);
        }
        params.extend(ipt_args!["-j", "RETURN"]);
        b.append(chain::OUTPUT, "nat", params);
    }
}

/// Istio's `SetupDNSRedir`: DNS to the name servers (or all DNS) goes to the
/// agent's DNS proxy, in its own conntrack zones.
fn dns_redirect(b: &mut RuleBuilder, cfg: &Config) {
    let (v4, v6) = (&cfg.host.dns_servers_v4, &cfg.host.dns_servers_v6);
    let all = cfg.capture_all_dns;
    b.append("OUTPUT", "raw", ipt_args!["-j", chain::OUTPUT_DNS]);
    if all || !v4.is_empty() {
        b.append_v4(chain::OUTPUT, "nat", ipt_args!["-j", chain::OUTPUT_DNS]);
    }
    if all || !v6.is_empty() {
        b.append_v6(chain::OUTPUT, "nat", ipt_args!["-j", chain::OUTPUT_DNS]);
    }
    let redirect = |proto: &str, dest: Option<String>| {
        let mut p = ipt_args!["-p", proto, "--dport", "53"];
        if let Some(d) = dest {
            p.extend(ipt_args!["-d", d]);
        }
        // Istio spells the UDP target's option in the singular.
        let to = if proto == "tcp" {
            "--to-ports"
        } else {
            "--to-port"
        };
        p.extend(ipt_args!["-j", "REDIRECT", to, DNS_LISTENER_PORT]);
        p
    };
    for proto in ["tcp", "udp"] {
        if all {
            b.append(chain::OUTPUT_DNS, "nat", redirect(proto, None));
        } else {
            for s in v4 {
                b.append_v4(
                    chain::OUTPUT_DNS,
                    "nat",
                    redirect(proto, Some(format!("{s}/32"))),
                );
            }
            for s in v6 {
                b.append_v6(
                    chain::OUTPUT_DNS,
                    "nat",
                    redirect(proto, Some(format!("{s}/128"))),
                );
            }
        }
    }
    dns_conntrack_zones(b, cfg);
}

/// Istio's `addDNSConntrackZones`: agent <-> upstream in zone 1, app <-> agent
/// in zone 2, so the two UDP flows never share conntrack entries.
fn dns_conntrack_zones(b: &mut RuleBuilder, cfg: &Config) {
    for (kind, ids) in [
        ("--uid-owner", &cfg.proxy_uid),
        ("--gid-owner", &cfg.proxy_gid),
    ] {
        for id in split(ids) {
            b.append(
                chain::OUTPUT_DNS,
                "raw",
                ipt_args![
                    "-p", "udp", "--dport", "53", "-m", "owner", kind, id, "-j", "CT", "--zone",
                    "1"
                ],
            );
            b.append(
                chain::OUTPUT_DNS,
                "raw",
                ipt_args![
                    "-p", "udp", "--sport", "15053", "-m", "owner", kind, id, "-j", "CT", "--zone",
                    "2"
                ],
            );
        }
    }
    if cfg.capture_all_dns {
        b.append("PREROUTING", "raw", ipt_args!["-j", chain::INBOUND]);
        b.append(
            chain::OUTPUT_DNS,
            "raw",
            ipt_args!["-p", "udp", "--dport", "53", "-j", "CT", "--zone", "2"],
        );
        b.append(
            chain::INBOUND,
            "raw",
            ipt_args!["-p", "udp", "--sport", "53", "-j", "CT", "--zone", "1"],
        );
        return;
    }
    let (v4, v6) = (&cfg.host.dns_servers_v4, &cfg.host.dns_servers_v6);
    if !v4.is_empty() {
        b.append_v4("PREROUTING", "raw", ipt_args!["-j", chain::INBOUND]);
    }
    for s in v4 {
        let d = format!("{s}/32");
        b.append_v4(
            chain::OUTPUT_DNS,
            "raw",
            ipt_args![
                "-p", "udp", "--dport", "53", "-d", d, "-j", "CT", "--zone", "2"
            ],
        );
        b.append_v4(
            chain::INBOUND,
            "raw",
            ipt_args![
                "-p", "udp", "--sport", "53", "-s", d, "-j", "CT", "--zone", "1"
            ],
        );
    }
    if !v6.is_empty() {
        b.append_v6("PREROUTING", "raw", ipt_args!["-j", chain::INBOUND]);
    }
    for s in v6 {
        let d = format!("{s}/128");
        b.append_v6(
            chain::OUTPUT_DNS,
            "raw",
            ipt_args![
                "-p", "udp", "--dport", "53", "-d", d, "-j", "CT", "--zone", "2"
            ],
        );
        b.append_v6(
            chain::INBOUND,
            "raw",
            ipt_args![
                "-p", "udp", "--sport", "53", "-s", d, "-j", "CT", "--zone", "1"
            ],
        );
    }
}

/// Istio's `handleOutboundIncludeRules` for one family.
fn outbound_include(b: &mut RuleBuilder, cfg: &Config, range: &NetworkRange, v6: bool) {
    let ifaces = split(&cfg.reroute_virtual_interfaces);
    let append = |b: &mut RuleBuilder, p: Vec<String>| {
        if v6 {
            b.append_v6(chain::OUTPUT, "nat", p)
        } else {
            b.append_v4(chain::OUTPUT, "nat", p)
        }
    };
    let insert = |b: &mut RuleBuilder, p: Vec<String>| {
        if v6 {
            b.insert_v6("PREROUTING", "nat", 1, p)
        } else {
            b.insert_v4("PREROUTING", "nat", 1, p)
        }
    };
    if range.is_wildcard {
        append(b, ipt_args!["-j", chain::REDIRECT]);
        for iface in &ifaces {
            insert(b, ipt_args!["-i", iface, "-j", chain::REDIRECT]);
        }
    } else {
        for cidr in &range.cidrs {
            for iface in &ifaces {
                insert(b, ipt_args!["-i", iface, "-d", cidr, "-j", chain::REDIRECT]);
            }
            append(b, ipt_args!["-d", cidr, "-j", chain::REDIRECT]);
        }
    }
}

/// The mangle rules TPROXY needs around its marks.
fn tproxy_marks(b: &mut RuleBuilder, cfg: &Config) {
    let mark = cfg.inbound_tproxy_mark.to_string();
    let lo = cfg.host_ipv4_loopback_cidr.as_str();
    // Keep the mark Envoy's original_src listener filter sets as the connection's.
    b.append(
        "PREROUTING",
        "mangle",
        ipt_args![
            "-p",
            "tcp",
            "-m",
            "mark",
            "--mark",
            mark,
            "-j",
            "CONNMARK",
            "--save-mark"
        ],
    );
    // Already marked (Envoy -> app): leave it.
    b.append(
        "OUTPUT",
        "mangle",
        ipt_args![
            "-p", "tcp", "-o", "lo", "-m", "mark", "--mark", mark, "-j", "RETURN"
        ],
    );
    for (kind, ids) in [
        ("--uid-owner", &cfg.proxy_uid),
        ("--gid-owner", &cfg.proxy_gid),
    ] {
        for id in split(ids) {
            // Envoy outbound -> Envoy inbound by Pod IP is marked 1338.
            b.append_versioned(
                lo,
                "::1/128",
                "OUTPUT",
                "mangle",
                ipt_args![
                    "!",
                    "-d",
                    IPV,
                    "-p",
                    "tcp",
                    "-o",
                    "lo",
                    "-m",
                    "owner",
                    kind,
                    id,
                    "-j",
                    "MARK",
                    "--set-mark",
                    OUTBOUND_MARK
                ],
            );
        }
    }
    b.append(
        "OUTPUT",
        "mangle",
        ipt_args![
            "-p",
            "tcp",
            "-m",
            "connmark",
            "--mark",
            mark,
            "-j",
            "CONNMARK",
            "--restore-mark"
        ],
    );
    b.insert(
        chain::INBOUND,
        "mangle",
        1,
        ipt_args!["-p", "tcp", "-m", "mark", "--mark", mark, "-j", "RETURN"],
    );
    b.insert_v4(
        chain::INBOUND,
        "mangle",
        2,
        ipt_args![
            "-p",
            "tcp",
            "-s",
            "127.0.0.6/32",
            "-i",
            "lo",
            "-j",
            "RETURN"
        ],
    );
    b.insert_v6(
        chain::INBOUND,
        "mangle",
        2,
        ipt_args!["-p", "tcp", "-s", "::6/128", "-i", "lo", "-j", "RETURN"],
    );
    b.insert(
        chain::INBOUND,
        "mangle",
        3,
        ipt_args![
            "-p",
            "tcp",
            "-i",
            "lo",
            "-m",
            "mark",
            "!",
            "--mark",
            OUTBOUND_MARK,
            "-j",
            "RETURN"
        ],
    );
}
