//! Helpers shared by the unit tests: a configuration built as `from_env`
//! builds it, then adjusted field by field.

use std::sync::Arc;

use common::env::MapEnv;

use crate::config::{Config, ProxyArgs};

/// The agent's configuration for Pod `ns/sa` with Istio's defaults, changed by `f`.
pub fn config(f: impl FnOnce(&mut Config)) -> Arc<Config> {
    let args = ProxyArgs {
        proxy_type: "sidecar".into(),
        ..Default::default()
    };
    let env = MapEnv::from_pairs([("POD_NAMESPACE", "ns"), ("SERVICE_ACCOUNT", "sa")]);
    let mut config = Config::from_env(&args, &env).expect("the defaults are valid");
    f(&mut config);
    Arc::new(config)
}
