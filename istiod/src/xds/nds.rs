//! NDS: the DNS name table for proxies that capture DNS (`DNS_CAPTURE`
//! metadata): every visible service host with its addresses; Kubernetes
//! services also carry their short name and namespace so the agent answers
//! `name`, `name.ns` and `name.ns.svc` inside the namespace.

use std::sync::Arc;

use prost::Message;
use proto::nds::NameTable;
use proto::nds::name_table::NameInfo;
use proto::pb::google::protobuf::Any;

use super::context::IstioContext;
use super::{NAME_TABLE_TYPE, Proxy, Resource};
use crate::model::service::ServiceSource;

/// The name table of one proxy (empty unless it captures DNS).
pub fn build(ctx: &IstioContext, proxy: &Proxy) -> Vec<Arc<Resource>> {
    if !proxy.dns_capture {
        return Vec::new();
    }
    let mut table = NameTable::default();
    let scope = ctx.scope(proxy);
    for svc in scope.services() {
        let ips: Vec<String> = svc
            .addresses
            .iter()
            .filter(|a| a.as_str() != "0.0.0.0")
            .cloned()
            .collect();
        if ips.is_empty() || svc.hostname.contains('*') {
            continue;
        }
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
        table.table.insert(
            svc.hostname.clone(),
            NameInfo {
                ips,
                registry: if kube {
                    "Kubernetes".into()
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
            },
        );
    }
    vec![Arc::new(Resource::new(
        String::new(),
        Any {
            type_url: NAME_TABLE_TYPE.into(),
            value: table.encode_to_vec(),
        },
    ))]
}
