//! A generated resource, encoded once and shared by reference between the
//! XDS cache and every response that carries it.

use proto::pb::google::protobuf::Any;

/// One generated resource, encoded. Shared by reference (`Arc`) between the
/// XDS cache and every response that carries it.
#[derive(Debug, Clone)]
pub struct Resource {
    /// Its name (cluster name, listener name, ...).
    pub name: String,
    /// The encoded resource.
    pub resource: Any,
    /// [`Resource::version`], computed once.
    version: std::sync::OnceLock<String>,
    /// [`name_hash`] of the name.
    name_hash: u64,
}

/// A hash of a resource name, as streams index what a client holds.
pub fn name_hash(name: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    h.finish()
}

impl PartialEq for Resource {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.resource == other.resource
    }
}

impl Resource {
    /// A resource named `name`.
    pub fn new(name: String, resource: Any) -> Self {
        Self {
            name_hash: name_hash(&name),
            name,
            resource,
            version: std::sync::OnceLock::new(),
        }
    }

    /// [`name_hash`] of its name, computed once.
    pub fn name_hash(&self) -> u64 {
        self.name_hash
    }

    /// The resource `m` encoded, named `name`.
    pub fn encode<M: prost::Message + prost::Name>(name: String, m: &M) -> Self {
        Self::new(
            name,
            Any {
                type_url: M::type_url(),
                value: prost::Message::encode_to_vec(m),
            },
        )
    }

    /// A stable version of the resource's content, for delta xDS.
    pub fn version(&self) -> &str {
        self.version.get_or_init(|| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            self.resource.type_url.hash(&mut h);
            self.resource.value.hash(&mut h);
            format!("{:016x}", h.finish())
        })
    }
}
