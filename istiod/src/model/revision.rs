//! Which configuration belongs to this control-plane revision, as Istio's
//! config filtering decides it (`pkg/config/model.go`: `LabelsInRevision`,
//! `LabelsInRevisionOrTags`; applied by `crdclient` to every kind it reads).
//!
//! The rule, for an object of a [filtered kind](is_revision_filtered):
//! - no `istio.io/rev` label: the object is global and every revision takes
//!   it (Istio does not give unlabelled config to the default revision only);
//! - this istiod has no revision (`REVISION` unset or empty): it takes
//!   everything;
//! - otherwise the label must name this istiod's revision, or a revision tag
//!   that points at it (the tags come from the tag watcher,
//!   `source/kube/tag_watcher.rs`).
//!
//! Istio's `crdclient` compares the label with the revision only; its
//! Gateway API, ingress and deployment controllers also accept the tags.
//! Here every filtered kind accepts the tags, so config labelled with a tag
//! follows the tag as a namespace labelled with it does.
//!
//! An object of another revision is not an error: it is left out of the
//! store (so `/debug/configz` does not list it, as Istio's does not) and
//! said at debug level.

use std::collections::{BTreeMap, BTreeSet};

use super::meta::{Kind, Object};

/// The label naming the revision (or tag) an object, namespace or webhook
/// belongs to (Istio's `label.IoIstioRev`).
pub const REVISION_LABEL: &str = "istio.io/rev";
/// The label naming the tag of a revision-tag webhook (Istio's `label.IoIstioTag`).
pub const TAG_LABEL: &str = "istio.io/tag";
/// The prefix of a revision tag's MutatingWebhookConfiguration, as
/// `istioctl tag` names it: `istio-revision-tag-<tag>`.
pub const TAG_WEBHOOK_PREFIX: &str = "istio-revision-tag-";

/// The name Istio's chart and istiod give an object of `revision`:
/// `base` for the default revision (or none), `base-<revision>` otherwise
/// (the mesh ConfigMap `istio-canary`, as Istio's `getMeshConfigMapName`;
/// the Service and Deployment `istiod-canary`).
pub fn revisioned_name(base: &str, revision: &str) -> String {
    match revision {
        "" | "default" => base.to_string(),
        rev => format!("{base}-{rev}"),
    }
}

/// Whether objects of `kind` are filtered by revision: the kinds Istio reads
/// through its `crdclient` (Istio's CRDs, the Gateway API's but `Gateway`,
/// and `Ingress`). Kubernetes' own registry kinds (Service, EndpointSlice,
/// Pod, Namespace, Node, Secret, IngressClass) and the Gateway API's
/// `Gateway` (whose revision Istio's gateway controllers decide) are not.
pub fn is_revision_filtered(kind: Kind) -> bool {
    match kind {
        Kind::KubernetesGateway => false,
        Kind::Ingress => true,
        k => k.is_istio() || k.is_gateway_api(),
    }
}

/// Istio's `LabelsInRevisionOrTags`: whether labels `labels` put an object
/// in `revision` (empty: no revision, everything is in) or one of `tags`.
pub fn labels_in_revision(
    labels: &BTreeMap<String, String>,
    revision: &str,
    tags: &BTreeSet<String>,
) -> bool {
    match labels.get(REVISION_LABEL) {
        None => true,
        Some(_) if revision.is_empty() => true,
        Some(rev) => rev == revision || tags.contains(rev),
    }
}

/// This istiod's revision and the tags pointing at it: the filter both
/// config sources apply before an object reaches the store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InRevision {
    /// `REVISION` as set (empty when unset: every object is taken).
    revision: String,
    /// The tags whose webhook names this revision.
    tags: BTreeSet<String>,
}

impl InRevision {
    /// The filter of `revision` with no tags yet.
    pub fn new(revision: impl Into<String>) -> Self {
        Self {
            revision: revision.into(),
            tags: BTreeSet::new(),
        }
    }

    /// The same revision with `tags` pointing at it.
    pub fn with_tags(&self, tags: BTreeSet<String>) -> Self {
        Self {
            revision: self.revision.clone(),
            tags,
        }
    }

    /// This istiod's revision (empty when none is set).
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// The tags pointing at this revision.
    pub fn tags(&self) -> &BTreeSet<String> {
        &self.tags
    }

    /// Whether `object` is this revision's; an object of another revision
    /// is said at debug level.
    pub fn admits(&self, object: &Object) -> bool {
        let kind = object.kind();
        if !is_revision_filtered(kind)
            || labels_in_revision(&object.metadata.labels, &self.revision, &self.tags)
        {
            return true;
        }
        tracing::debug!(
            target: "config",
            "ignoring {}: labelled {REVISION_LABEL}={}, not this istiod's revision {:?} or its tags {:?}",
            object.key(),
            object.metadata.labels.get(REVISION_LABEL).map(String::as_str).unwrap_or_default(),
            self.revision,
            self.tags,
        );
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Decoded, decode};

    fn object(kind: &str, api_version: &str, rev: Option<&str>) -> Object {
        let labels = rev
            .map(|r| format!("\n  labels:\n    {REVISION_LABEL}: {r}"))
            .unwrap_or_default();
        let spec = match kind {
            "VirtualService" => {
                "spec:\n  hosts: [a]\n  http:\n  - route:\n    - destination:\n        host: a\n"
            }
            "Service" => "spec:\n  ports:\n  - port: 80\n",
            _ => "spec: {}\n",
        };
        let yaml = format!(
            "apiVersion: {api_version}\nkind: {kind}\nmetadata:\n  name: x\n  namespace: ns{labels}\n{spec}"
        );
        let value: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
        match decode(value).unwrap() {
            Decoded::Object(o) => o,
            other => panic!("not an object: {other:?}"),
        }
    }

    fn vs(rev: Option<&str>) -> Object {
        object("VirtualService", "networking.istio.io/v1", rev)
    }

    fn tags(t: &[&str]) -> BTreeSet<String> {
        t.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_object_of_another_revision_is_ignored() {
        assert!(!InRevision::new("default").admits(&vs(Some("canary"))));
        assert!(!InRevision::new("canary").admits(&vs(Some("default"))));
    }

    #[test]
    fn the_own_revision_and_its_tags_are_taken() {
        let canary = InRevision::new("canary");
        assert!(canary.admits(&vs(Some("canary"))));
        assert!(!canary.admits(&vs(Some("prod"))));
        let tagged = canary.with_tags(tags(&["prod"]));
        assert!(tagged.admits(&vs(Some("prod"))));
        assert!(!tagged.admits(&vs(Some("stable"))));
    }

    #[test]
    fn unlabelled_objects_are_global_as_istio_has_them() {
        assert!(InRevision::new("default").admits(&vs(None)));
        assert!(InRevision::new("canary").admits(&vs(None)));
    }

    #[test]
    fn an_istiod_without_a_revision_takes_everything() {
        assert!(InRevision::new("").admits(&vs(Some("canary"))));
        assert!(InRevision::new("").admits(&vs(None)));
    }

    #[test]
    fn the_default_revision_keeps_the_plain_names() {
        assert_eq!(revisioned_name("istio", ""), "istio");
        assert_eq!(revisioned_name("istio", "default"), "istio");
        assert_eq!(revisioned_name("istio", "canary"), "istio-canary");
    }

    #[test]
    fn kubernetes_registry_kinds_are_not_filtered() {
        let svc = object("Service", "v1", Some("canary"));
        assert!(InRevision::new("default").admits(&svc));
        assert!(!is_revision_filtered(Kind::KubernetesGateway));
        assert!(!is_revision_filtered(Kind::Pod));
        assert!(is_revision_filtered(Kind::HttpRoute));
        assert!(is_revision_filtered(Kind::Ingress));
        assert!(is_revision_filtered(Kind::PeerAuthentication));
    }
}
