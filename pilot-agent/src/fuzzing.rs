//! The input boundaries the fuzz targets (`fuzz/`) drive, one function
//! each; the corpus regression test (`tests/fuzz_corpus.rs`) runs every
//! corpus file through the same functions on stable.

use std::sync::OnceLock;

use crate::dns::DnsProxy;

/// A DNS proxy of namespace `demo` knowing the sample mesh's names.
fn dns_proxy() -> &'static DnsProxy {
    static PROXY: OnceLock<DnsProxy> = OnceLock::new();
    PROXY.get_or_init(|| {
        use prost::Message;
        use proto::nds::NameTable;
        use proto::nds::name_table::NameInfo;
        let info = |ips: &[&str], short: &str| NameInfo {
            ips: ips.iter().map(|s| s.to_string()).collect(),
            registry: "Kubernetes".into(),
            shortname: short.into(),
            namespace: "demo".into(),
            ..Default::default()
        };
        let table = NameTable {
            table: [
                (
                    "httpbin.demo.svc.cluster.local".to_string(),
                    info(&["10.96.0.10"], "httpbin"),
                ),
                (
                    "sleep.demo.svc.cluster.local".to_string(),
                    info(&["10.96.0.11", "fd00::11"], "sleep"),
                ),
            ]
            .into_iter()
            .collect(),
        };
        let proxy = DnsProxy::new("demo", Vec::new(), None);
        let any = proto::pb::google::protobuf::Any {
            type_url: common::xds::NAME_TABLE_TYPE.into(),
            value: table.encode_to_vec(),
        };
        if let Err(e) = proxy.update(&any) {
            panic!("the fuzz name table does not load: {e}");
        }
        proxy
    })
}

/// The DNS proxy's handling of one query message, as it arrives over UDP
/// (or TCP, after its length prefix): answered from the name table, an
/// error message, or left to the upstream (not contacted here). Must never
/// panic, whatever the bytes.
pub fn dns_message(data: &[u8]) {
    let _ = dns_answer(data);
}

/// What [`dns_message`] computes: the local answer, `None` for the upstream.
pub fn dns_answer(data: &[u8]) -> Option<Vec<u8>> {
    dns_proxy().handle_locally(data)
}

/// The `istio-iptables` flag parser and the rules it leads to: the bytes
/// are the arguments, separated by NUL or newline. Must never panic.
pub fn iptables_flags(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let argv =
        std::iter::once("istio-iptables").chain(text.split(['\0', '\n']).filter(|a| !a.is_empty()));
    let Ok(args) = crate::iptables::parse_args(argv) else {
        return;
    };
    let env = common::env::MapEnv(Default::default());
    if let Ok(cfg) = crate::iptables::config::Config::from_args(&args, &env) {
        let _ = crate::iptables::dry_run_output(&cfg);
    }
}
