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

/// The agent's configuration from its environment as the injection
/// template sets it, with `extra` added: every invalid value is an error,
/// never a panic.
fn config_with(
    extra: &[(&str, &str)],
) -> Result<crate::config::Config, crate::config::ConfigErrors> {
    let env: std::collections::BTreeMap<String, String> = [
        ("POD_NAME", "sleep-1"),
        ("POD_NAMESPACE", "demo"),
        ("SERVICE_ACCOUNT", "sleep"),
        ("INSTANCE_IP", "198.18.0.2"),
    ]
    .iter()
    .chain(extra)
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let args = crate::config::ProxyArgs {
        proxy_type: "sidecar".into(),
        mesh_config: "/nonexistent/mesh".into(),
        ..Default::default()
    };
    crate::config::Config::from_env(&args, &common::env::MapEnv(env))
}

/// ProxyConfig from each place it comes from, by the first byte: 0 the
/// `PROXY_CONFIG` environment variable (then the whole agent configuration
/// and the Envoy bootstrap it renders), 1 the mesh config file's
/// `defaultConfig`, 2 the Pod's annotations file (downward API) with its
/// `proxy.istio.io/config`. Must never panic.
pub fn proxy_config(data: &[u8]) {
    let _ = proxy_config_accepted(data);
}

/// [`proxy_config`]: whether the input was accepted (for mode 0, as far
/// as a rendered bootstrap).
pub fn proxy_config_accepted(data: &[u8]) -> bool {
    use crate::proxy_config::{ProxyConfig, mesh_config_text_layer, parse_downward_api};
    let Some((&mode, rest)) = data.split_first() else {
        return false;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return false;
    };
    match mode % 3 {
        0 => {
            let Ok(config) = config_with(&[("PROXY_CONFIG", text)]) else {
                return false;
            };
            let Ok(options) = crate::agent_bootstrap::options(&config, false) else {
                return false;
            };
            let bootstrap = crate::bootstrap::render(&options);
            assert!(bootstrap.is_object(), "the bootstrap is a JSON object");
            true
        }
        1 => match mesh_config_text_layer("fuzz mesh config", text) {
            Ok(Some(layer)) => {
                ProxyConfig::merged(&[("mesh config defaultConfig".into(), layer)]).is_ok()
            }
            Ok(None) => true,
            Err(_) => false,
        },
        _ => {
            let annotations = parse_downward_api(text);
            annotations.get("proxy.istio.io/config").is_some_and(|pc| {
                ProxyConfig::parse_layer("proxy.istio.io/config", pc)
                    .and_then(|layer| ProxyConfig::merged(&[("annotation".into(), layer)]))
                    .is_ok()
            })
        }
    }
}

/// The status server's outside inputs, by the first byte: 0
/// `ISTIO_KUBE_APP_PROBERS` (the injector's rewritten probes), 1
/// `ISTIO_PROMETHEUS_ANNOTATIONS` (the application's scrape target), 2 a
/// redirect `Location` an application answers a probe with. Must never
/// panic; a probe path that is accepted is one the status server routes.
pub fn app_probers(data: &[u8]) {
    let _ = app_probers_accepted(data);
}

/// [`app_probers`]: whether the input was accepted.
pub fn app_probers_accepted(data: &[u8]) -> bool {
    let Some((&mode, rest)) = data.split_first() else {
        return false;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return false;
    };
    match mode % 3 {
        0 => {
            let Ok(config) = config_with(&[(crate::config::ENV_KUBE_APP_PROBERS, text)]) else {
                return false;
            };
            for path in config.status.app_probers.keys() {
                assert!(
                    crate::status::is_probe_path(path),
                    "accepted prober {path:?} is not a probe path"
                );
            }
            !config.status.app_probers.is_empty()
        }
        1 => config_with(&[("ISTIO_PROMETHEUS_ANNOTATIONS", text)]).is_ok(),
        _ => crate::status::redirect_target(text).is_ok(),
    }
}

/// The SDS server (Envoy's secrets over the agent's Unix socket): one
/// stream's request body, raw off the wire (bit 1 of the first byte clear)
/// or `u16`-length-prefixed request messages framed here; bit 0 picks
/// `DeltaSecrets` (unimplemented, answered so) over `StreamSecrets`. The
/// stream ends once its requests end; nothing may panic.
pub fn sds_requests(data: &[u8]) {
    let _ = sds_response(data);
}

/// What [`sds_requests`] gets back: the response body's bytes and the
/// final `grpc-status`, if any (`None` for an empty input).
pub fn sds_response(data: &[u8]) -> Option<(Vec<u8>, Option<String>)> {
    use common::grpc_stream::{DriveError, chunks, drive, frames};
    let (&mode, rest) = data.split_first()?;
    let path = if mode & 1 == 1 {
        "/envoy.service.secret.v3.SecretDiscoveryService/DeltaSecrets"
    } else {
        "/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets"
    };
    let body = if mode & 2 == 0 {
        rest.to_vec()
    } else {
        frames(chunks(rest))
    };
    let f = sds_fixture();
    let answer = f.runtime.block_on(async {
        let mut service = f.server.clone().into_service();
        match drive(&mut service, path, body, std::time::Duration::from_secs(20)).await {
            Err(e @ DriveError::Hung(_)) => panic!("{e}"),
            Err(_) => (Vec::new(), None),
            Ok(answer) => answer,
        }
    });
    Some(answer)
}

/// A runtime and an SDS server with a workload secret to serve.
struct SdsFixture {
    runtime: tokio::runtime::Runtime,
    server: crate::sds::SdsServer,
    _secrets:
        tokio::sync::watch::Sender<Option<std::sync::Arc<crate::secret_manager::WorkloadSecret>>>,
}

fn sds_fixture() -> &'static SdsFixture {
    use crate::secret_manager::WorkloadSecret;
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};
    static FIXTURE: OnceLock<SdsFixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let secret = WorkloadSecret {
            cert_chain_pem: "-----BEGIN CERTIFICATE-----\nfuzz\n-----END CERTIFICATE-----\n".into(),
            key_pem: "-----BEGIN PRIVATE KEY-----\nfuzz\n-----END PRIVATE KEY-----\n".into(),
            root_pem: "-----BEGIN CERTIFICATE-----\nroot\n-----END CERTIFICATE-----\n".into(),
            serial: "1".into(),
            created: SystemTime::now(),
            expires: SystemTime::now() + Duration::from_secs(86400),
        };
        let (tx, rx) = tokio::sync::watch::channel(Some(Arc::new(secret)));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("a runtime: {e}"));
        SdsFixture {
            runtime,
            server: crate::sds::SdsServer::new(rx),
            _secrets: tx,
        }
    })
}
