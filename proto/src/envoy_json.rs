//! Envoy's protos in proto-JSON, read by type name at run time: what
//! EnvoyFilter patch values are written in (with `typed_config` as an `Any`
//! whose `@type` names the message). The descriptors of Envoy's protos are
//! compiled from the `.proto` files `envoy-types` ships (see `build.rs`);
//! a value is read into a dynamic message, encoded, and decoded as the
//! `envoy-types` type, so every consumer works with the generated types.

use std::sync::OnceLock;

use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage};

/// The encoded `FileDescriptorSet` of Envoy's protos.
const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy_descriptors.bin"));

/// Why a proto-JSON value could not be read as an Envoy message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    /// The descriptor set built into the binary did not load (a build fault).
    #[error("Envoy's proto descriptors do not load: {0}")]
    Descriptors(String),
    /// No message of that name is among Envoy's protos.
    #[error("{0} is not an Envoy message type")]
    UnknownType(String),
    /// The value does not decode as the message (unknown field, wrong
    /// type, unknown `@type`, ...).
    #[error("does not decode as {type_name}: {message}")]
    Invalid {
        /// The message type asked for.
        type_name: String,
        /// What is wrong, with the path of the field when known.
        message: String,
    },
    /// The dynamic message's bytes did not decode as the generated type.
    #[error("{type_name} encodes differently than envoy-types expects: {message}")]
    Mismatch {
        /// The message type asked for.
        type_name: String,
        /// The decoder's message.
        message: String,
    },
}

/// Every Envoy message's descriptor, loaded once.
pub fn pool() -> Result<&'static DescriptorPool, JsonError> {
    static POOL: OnceLock<Result<DescriptorPool, String>> = OnceLock::new();
    POOL.get_or_init(|| DescriptorPool::decode(DESCRIPTORS).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| JsonError::Descriptors(e.clone()))
}

/// Reads `value` (proto-JSON: camelCase or snake_case field names, `Any`
/// with `@type`) as the message `type_name` (e.g.
/// `envoy.config.cluster.v3.Cluster`), strictly: unknown fields are errors.
/// Returns its binary encoding.
pub fn encode_json(type_name: &str, value: &serde_json::Value) -> Result<Vec<u8>, JsonError> {
    let pool = pool()?;
    let desc = pool
        .get_message_by_name(type_name)
        .ok_or_else(|| JsonError::UnknownType(type_name.to_string()))?;
    let options = DeserializeOptions::new().deny_unknown_fields(true);
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(value, &mut track);
    match DynamicMessage::deserialize_with_options(desc, de, &options) {
        Ok(message) => Ok(prost::Message::encode_to_vec(&message)),
        Err(e) => {
            let path = track.path().to_string();
            let message = if path == "." || path.is_empty() {
                e.to_string()
            } else {
                format!("{path}: {e}")
            };
            Err(JsonError::Invalid {
                type_name: type_name.to_string(),
                message,
            })
        }
    }
}

/// Reads `value` as `M` (see [`encode_json`]).
pub fn from_json<M: prost::Message + prost::Name + Default>(
    value: &serde_json::Value,
) -> Result<M, JsonError> {
    let type_name = M::full_name();
    let bytes = encode_json(&type_name, value)?;
    M::decode(bytes.as_slice()).map_err(|e| JsonError::Mismatch {
        type_name,
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::envoy::config::cluster::v3::Cluster;
    use crate::pb::envoy::config::listener::v3::Filter;
    use crate::pb::envoy::extensions::filters::http::lua::v3::Lua;
    use serde_json::json;

    #[test]
    fn reads_any_typed_configs_of_extensions() {
        let f: Filter = from_json(&json!({
            "name": "envoy.filters.http.lua",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                "inlineCode": "function envoy_on_response(h) end"
            }
        }))
        .unwrap();
        assert_eq!(f.name, "envoy.filters.http.lua");
        let Some(crate::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any)) =
            f.config_type
        else {
            panic!("no typed config")
        };
        assert_eq!(
            any.type_url,
            "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"
        );
        #[allow(deprecated)]
        let lua: Lua = prost::Message::decode(any.value.as_slice()).unwrap();
        #[allow(deprecated)]
        let code = lua.inline_code;
        assert_eq!(code, "function envoy_on_response(h) end");
    }

    #[test]
    fn refuses_unknown_fields_naming_them() {
        let err = from_json::<Cluster>(&json!({"name": "c", "connectTimeout": "1s", "bogus": 1}))
            .unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
        let err = from_json::<Cluster>(&json!({"connectTimeout": 5})).unwrap_err();
        assert!(err.to_string().contains("connectTimeout"), "{err}");
        let err = encode_json("envoy.Nope", &json!({})).unwrap_err();
        assert_eq!(err, JsonError::UnknownType("envoy.Nope".into()));
    }
}

#[cfg(test)]
mod coverage {
    #[test]
    fn the_extensions_envoy_filters_name_are_known() {
        let pool = super::pool().unwrap();
        for t in [
            "envoy.config.bootstrap.v3.Bootstrap",
            "envoy.extensions.filters.http.lua.v3.Lua",
            "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
            "envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
            "envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
            "envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
            "envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "envoy.extensions.filters.network.local_ratelimit.v3.LocalRateLimit",
            "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "envoy.extensions.tracers.opentelemetry.samplers.v3.AlwaysOnSamplerConfig",
            "envoy.extensions.clusters.dns.v3.DnsCluster",
            "envoy.extensions.filters.http.dynamic_forward_proxy.v3.FilterConfig",
        ] {
            assert!(pool.get_message_by_name(t).is_some(), "{t}");
        }
        let extensions = pool
            .files()
            .filter(|f| f.name().starts_with("envoy/extensions/"))
            .count();
        assert!(extensions > 330, "{extensions} extension protos");
    }
}
