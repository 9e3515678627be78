//! NDS: the DNS name table for proxies that capture DNS (`DNS_CAPTURE`
//! metadata), as Istio's `BuildNameTable` makes it: every visible service
//! host with its addresses (a ServiceEntry without `addresses`: the ones IP
//! auto-allocation gave it); a headless Service (or ServiceEntry NONE) with
//! every ready endpoint's address, and each Pod with a `subdomain` under
//! `<hostname>.<subdomain>.<ns>.svc.<domain>`. Kubernetes services also
//! carry their short name and namespace so the agent answers `name`,
//! `name.ns` and `name.ns.svc` inside the namespace.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use prost::Message;
use proto::nds::NameTable;
use proto::nds::name_table::NameInfo;
use proto::pb::google::protobuf::Any;

use super::NAME_TABLE_TYPE;
use super::lds::uses_auto_addresses;
use super::util::IpMode;
use crate::model::service::{Service, ServiceSource};
use crate::pushctx::context::IstioContext;
use crate::pushctx::{Proxy, Resource};

/// The registry name Istio writes for Kubernetes services.
const KUBERNETES: &str = "Kubernetes";

/// The name table of one proxy (empty unless it captures DNS).
pub fn build(ctx: &IstioContext, proxy: &Proxy) -> Vec<Arc<Resource>> {
    if !proxy.dns_capture {
        return Vec::new();
    }
    vec![Arc::new(Resource::new(
        String::new(),
        Any {
            type_url: NAME_TABLE_TYPE.into(),
            value: name_table(ctx, proxy).encode_to_vec(),
        },
    ))]
}

/// The table itself.
pub fn name_table(ctx: &IstioContext, proxy: &Proxy) -> NameTable {
    let mut table = NameTable::default();
    let scope = ctx.scope(proxy);
    let (v4, v6) = IpMode::of(&proxy.ips).families();
    let auto = uses_auto_addresses(proxy);
    for svc in scope.services() {
        if svc.hostname.contains('*') {
            continue;
        }
        let kube = svc.source == ServiceSource::Kubernetes;
        let mut ips: Vec<String> = svc
            .addresses_for(auto, v4, v6)
            .into_iter()
            .filter(|a| a.parse::<IpAddr>().is_ok())
            .map(str::to_string)
            .collect();
        if ips.is_empty() && svc.is_passthrough() && !svc.ports.is_empty() {
            ips = headless(svc, kube, &mut table);
        }
        if ips.is_empty() {
            continue;
        }
        match table.table.get_mut(&svc.hostname) {
            None => {
                table
                    .table
                    .insert(svc.hostname.clone(), name_info(svc, ips));
            }
            // A Kubernetes Service wins over a ServiceEntry of its host;
            // ServiceEntries of one host merge their addresses.
            Some(existing) if existing.registry != KUBERNETES => {
                if kube {
                    *existing = name_info(svc, ips);
                } else {
                    existing.ips.extend(ips);
                }
            }
            Some(_) => {}
        }
    }
    table
}

fn name_info(svc: &Service, ips: Vec<String>) -> NameInfo {
    let kube = svc.source == ServiceSource::Kubernetes;
    let shortname = if kube {
        svc.hostname
            .split('.')
            .next()
            .unwrap_or_default()
            .to_string()
    } else {
        String::new()
    };
    NameInfo {
        ips,
        registry: if kube {
            KUBERNETES.into()
        } else {
            String::new()
        },
        shortname,
        namespace: if kube {
            svc.namespace.clone()
        } else {
            String::new()
        },
        alt_hosts: Vec::new(),
    }
}

/// A passthrough service's ready endpoint addresses (each once), as
/// Kubernetes DNS answers for a headless Service; each endpoint Pod with a
/// `subdomain` is added to `table` as `<hostname>.<subdomain>.<rest of the
/// service's host>`.
fn headless(svc: &Service, kube: bool, table: &mut NameTable) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut ips = Vec::new();
    let mut pods: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    let rest = svc.hostname.split_once('.').map(|(_, r)| r);
    for e in &svc.endpoints {
        if !e.healthy || e.address.parse::<IpAddr>().is_err() || !seen.insert(&e.address) {
            continue;
        }
        if !e.subdomain.is_empty()
            && let Some(rest) = rest
        {
            let short = format!("{}.{}", e.hostname, e.subdomain);
            pods.entry(format!("{short}.{rest}"))
                .or_insert_with(|| (short, Vec::new()))
                .1
                .push(e.address.clone());
        }
        ips.push(e.address.clone());
    }
    for (host, (short, addrs)) in pods {
        table.table.insert(
            host,
            NameInfo {
                ips: addrs,
                registry: if kube {
                    KUBERNETES.into()
                } else {
                    String::new()
                },
                shortname: short,
                namespace: svc.namespace.clone(),
                alt_hosts: Vec::new(),
            },
        );
    }
    ips
}
