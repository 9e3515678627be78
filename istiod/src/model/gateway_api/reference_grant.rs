//! The `ReferenceGrant` kind's spec (`gateway.networking.k8s.io` v1 and
//! v1beta1), types only: the index that answers "is this reference
//! allowed" is the ReferenceGrant index, which reads the store.

use serde::{Deserialize, Serialize};

/// A `ReferenceGrant`'s `spec`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ReferenceGrant {
    /// Who may refer.
    pub from: Vec<ReferenceGrantFrom>,
    /// To what, in the grant's own namespace.
    pub to: Vec<ReferenceGrantTo>,
}

/// One `from` entry: a kind in a namespace.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ReferenceGrantFrom {
    /// The group (`""` is the core group).
    pub group: String,
    /// The kind.
    pub kind: String,
    /// The namespace.
    pub namespace: String,
}

/// One `to` entry: a kind, optionally one object of it.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ReferenceGrantTo {
    /// The group (`""` is the core group).
    pub group: String,
    /// The kind.
    pub kind: String,
    /// One object's name; every object of the kind when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}
