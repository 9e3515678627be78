//! The Pod the agent runs in: its names, addresses, downward-API labels and
//! annotations, the environment the node metadata is built from, and the
//! Envoy node id (Istio's `ServiceNode`).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr};

use super::vars::Vars;
use super::{
    ENV_CLUSTER_ID, ENV_DNS_PROXY_ADDR, ENV_HOST_IP, ENV_INSTANCE_IP, ENV_POD_NAME,
    ENV_POD_NAMESPACE, ENV_SERVICE_ACCOUNT, ProxyArgs,
};
use crate::proxy_config::{ANNOTATIONS_FILE, LABELS_FILE, parse_downward_api};

/// The Pod's identity and addresses.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PodConfig {
    /// `POD_NAMESPACE`.
    pub namespace: String,
    /// `SERVICE_ACCOUNT`.
    pub service_account: String,
    /// `ISTIO_META_CLUSTER_ID`, sent to istiod and the CA as `ClusterID`.
    pub cluster_id: String,
    /// The Pod's IPs, `INSTANCE_IP` first.
    pub ips: Vec<String>,
    /// `HOST_IP`: the node's IP, substituted for `$(HOST_IP)`.
    pub host_ip: String,
    /// Envoy's node id, `TYPE~IP~POD.NS~DOMAIN`.
    pub node_id: String,
    /// Pod labels (downward API).
    pub labels: BTreeMap<String, String>,
    /// Pod annotations (downward API).
    pub annotations: BTreeMap<String, String>,
    /// The environment the node metadata is built from (`ISTIO_META_*`,
    /// `ISTIO_METAJSON_*`, `POD_*`, ...); left out of the logged config.
    #[serde(skip)]
    pub metadata_env: Vec<(String, String)>,
}

impl PodConfig {
    /// Whether every Pod IP is IPv6: Envoy binds and is reached on `::1`.
    pub fn all_ipv6(&self) -> bool {
        all_ipv6(&self.ips)
    }
}

/// Whether every IP is IPv6 (IPv4-mapped addresses count as IPv4); false for
/// none, so an agent without IPs gets IPv4 loopback and wildcard, as in Istio.
pub fn all_ipv6(ips: &[String]) -> bool {
    !ips.is_empty()
        && ips.iter().all(|ip| {
            ip.parse::<Ipv6Addr>()
                .is_ok_and(|a| a.to_ipv4_mapped().is_none())
        })
}

/// Reads the Pod's settings; `POD_NAME` and `--domain` only go into the node id.
pub(super) fn parse(v: &mut Vars<'_>, args: &ProxyArgs) -> PodConfig {
    let pod_name = v.string(ENV_POD_NAME, "");
    let namespace = v.string(ENV_POD_NAMESPACE, "");
    let service_account = v.string(ENV_SERVICE_ACCOUNT, "");
    let cluster_id = v.string(ENV_CLUSTER_ID, "");
    let read_map = |path: &str| {
        std::fs::read_to_string(path)
            .map(|t| parse_downward_api(&t))
            .unwrap_or_default()
    };
    let labels = read_map(LABELS_FILE);
    let annotations = read_map(ANNOTATIONS_FILE);

    let instance_ip = v.string(ENV_INSTANCE_IP, "");
    let mut ips = Vec::new();
    if !instance_ip.is_empty() {
        ips.push(instance_ip);
    }
    for ip in interface_ips() {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    if ips.is_empty() {
        ips = vec!["127.0.0.1".to_string(), "::1".to_string()];
    }
    let host_ip = v.string(ENV_HOST_IP, "");
    let domain = if args.domain.is_empty() {
        format!("{namespace}.svc.cluster.local")
    } else {
        args.domain.clone()
    };
    let node_id = format!(
        "{}~{}~{}.{}~{}",
        args.proxy_type, ips[0], pod_name, namespace, domain
    );

    let mut metadata_env: Vec<(String, String)> = Vec::new();
    for prefix in ["ISTIO_META_", "ISTIO_METAJSON_"] {
        for (k, value) in v.prefixed(prefix) {
            metadata_env.push((format!("{prefix}{k}"), value));
        }
    }
    for key in [
        ENV_POD_NAME,
        ENV_POD_NAMESPACE,
        ENV_SERVICE_ACCOUNT,
        ENV_DNS_PROXY_ADDR,
        ENV_INSTANCE_IP,
    ] {
        if let Some(value) = v.raw(key) {
            metadata_env.push((key.to_string(), value));
        }
    }

    PodConfig {
        namespace,
        service_account,
        cluster_id,
        ips,
        host_ip,
        node_id,
        labels,
        annotations,
        metadata_env,
    }
}

/// Non-loopback, non-link-local addresses of this host's interfaces, as
/// Istio's agent discovers the Pod IPs when `INSTANCE_IP` is unset.
fn interface_ips() -> Vec<String> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for a in addrs {
        let Some(addr) = a.address else { continue };
        let ip: IpAddr = if let Some(v4) = addr.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        let link_local = match ip {
            IpAddr::V4(v4) => v4.is_link_local(),
            IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
        };
        if ip.is_loopback() || ip.is_unspecified() || link_local {
            continue;
        }
        let s = ip.to_string();
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}
