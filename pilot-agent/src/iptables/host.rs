//! What `istio-iptables` learns from the host rather than from flags, as
//! Istio's `FillConfigFromEnvironment` does: whether the Pod is IPv6 (from
//! its interfaces' addresses), the name servers in `/etc/resolv.conf`, and
//! the uid of `ENVOY_USER`. [`HostFacts`] is the seam tests set directly.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::error::ConfigError;

/// What the host says, beside the flags: Istio reads these from the Pod's
/// interfaces and `/etc/resolv.conf`. [`HostFacts::detect`] reads them in
/// real runs; tests build them directly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// The Pod's address Istio picked (first non-loopback, non-link-local).
    pub host_ip: Option<IpAddr>,
    /// Istio's `EnableIPv6`: the Pod address is IPv6 (with `--dual-stack`: any is).
    pub enable_ipv6: bool,
    /// IPv4 name servers, as Go prints them.
    pub dns_servers_v4: Vec<String>,
    /// IPv6 name servers, as Go prints them.
    pub dns_servers_v6: Vec<String>,
}

impl HostFacts {
    /// Reads what Istio's `FillConfigFromEnvironment` reads: the interfaces'
    /// addresses (is the Pod IPv6?) and, when DNS is captured per server, the
    /// name servers in `/etc/resolv.conf`. `dual_stack` is `--dual-stack`;
    /// `dns_per_server` is DNS captured per name server (`--redirect-dns`
    /// without `--capture-all-dns`), which needs the name servers.
    pub fn detect(dual_stack: bool, dns_per_server: bool) -> Result<Self, ConfigError> {
        let addrs: Vec<IpAddr> = nix::ifaddrs::getifaddrs()
            .map_err(ConfigError::Interfaces)?
            .filter_map(|ifa| {
                let a = ifa.address?;
                if let Some(v4) = a.as_sockaddr_in() {
                    Some(IpAddr::V4(v4.ip()))
                } else {
                    a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
                }
            })
            .collect();
        let (host_ip, enable_ipv6) = local_ip(&addrs, dual_stack)?;
        let mut facts = HostFacts {
            host_ip: Some(host_ip),
            enable_ipv6,
            ..HostFacts::default()
        };
        if dns_per_server {
            let conf =
                std::fs::read_to_string("/etc/resolv.conf").map_err(ConfigError::ResolvConf)?;
            (facts.dns_servers_v4, facts.dns_servers_v6) = name_servers(&conf);
        }
        Ok(facts)
    }
}

/// Istio's `getLocalIP`: the first address that is not loopback or
/// link-local decides; with dual stack, any IPv6 address turns IPv6 on.
pub fn local_ip(addrs: &[IpAddr], dual_stack: bool) -> Result<(IpAddr, bool), ConfigError> {
    let mut found = Vec::new();
    let mut is_ipv6 = false;
    for a in addrs {
        let a = unmap(*a);
        if a.is_loopback() || is_link_local_unicast(a) || is_link_local_multicast(a) {
            continue;
        }
        is_ipv6 = a.is_ipv6();
        if !dual_stack {
            return Ok((a, is_ipv6));
        }
        found.push(a);
        if is_ipv6 {
            break;
        }
    }
    found
        .first()
        .map(|a| (*a, is_ipv6))
        .ok_or(ConfigError::NoLocalIp)
}

fn unmap(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

fn is_link_local_unicast(a: IpAddr) -> bool {
    match a {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

fn is_link_local_multicast(a: IpAddr) -> bool {
    match a {
        IpAddr::V4(v4) => v4.octets()[..3] == [224, 0, 0],
        IpAddr::V6(v6) => {
            let o = v6.octets();
            o[0] == 0xff && (o[1] & 0x0f) == 0x02
        }
    }
}

/// The `nameserver` lines of a resolv.conf, split by family and printed as Go
/// prints addresses (Istio's `IPsSplitV4V6`); unparsable entries are skipped.
pub fn name_servers(conf: &str) -> (Vec<String>, Vec<String>) {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for line in conf.lines() {
        let mut f = line.split_whitespace();
        if f.next() != Some("nameserver") {
            continue;
        }
        match f.next().map(str::parse::<IpAddr>) {
            Some(Ok(IpAddr::V4(a))) => v4.push(a.to_string()),
            Some(Ok(IpAddr::V6(a))) => v6.push(a.to_string()),
            _ => {}
        }
    }
    (v4, v6)
}

/// The loopback address of the Pod's family (the validator listens there).
pub fn loopback(ipv6: bool) -> IpAddr {
    if ipv6 {
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }
}

/// The uid of `user` in `/etc/passwd` (Go's pure `os/user.Lookup`, which
/// Istio's static build uses).
pub(crate) fn lookup_uid(user: &str) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut f = line.split(':');
        (f.next()? == user).then_some(())?;
        f.next()?;
        Some(f.next()?.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_ip_follows_istio() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let ll: IpAddr = "fe80::1".parse().unwrap();
        let v4: IpAddr = "10.0.0.5".parse().unwrap();
        let v6: IpAddr = "fd00::5".parse().unwrap();
        assert!(matches!(
            local_ip(&[lo, ll], false),
            Err(ConfigError::NoLocalIp)
        ));
        assert_eq!(local_ip(&[lo, v4, v6], false).unwrap(), (v4, false));
        assert_eq!(local_ip(&[lo, v4, v6], true).unwrap(), (v4, true));
        assert_eq!(local_ip(&[v6, v4], false).unwrap(), (v6, true));
    }

    #[test]
    fn name_servers_split_by_family() {
        let (v4, v6) =
            name_servers("search x\nnameserver 10.96.0.10\nnameserver fd00::a\nnameserver bad\n");
        assert_eq!(v4, ["10.96.0.10"]);
        assert_eq!(v6, ["fd00::a"]);
    }
}
