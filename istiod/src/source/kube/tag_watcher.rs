//! Istio's revision tag watcher (`pkg/revisions/tag_watcher.go`): learns
//! which revision tags point at this istiod's revision from the
//! MutatingWebhookConfigurations labelled `istio.io/tag` (what
//! `istioctl tag set` writes: `istio-revision-tag-<tag>`, labelled
//! `istio.io/tag=<tag>` and `istio.io/rev=<revision>`).
//!
//! Config and namespaces labelled `istio.io/rev=<tag>` are then this
//! revision's ([`crate::model::revision`]). Istio also reads tags from
//! Services labelled `istio.io/tag` (its tag Services for ambient); those
//! are not watched here.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::{mpsc, watch};

use crate::kube::run_watcher;
use crate::model::revision::{REVISION_LABEL, TAG_LABEL};

/// The tags pointing at this istiod's revision, as the watcher publishes them.
pub type Tags = watch::Receiver<BTreeSet<String>>;

/// The tags whose webhook names `revision`, from the webhooks' labels.
pub fn tags_of<'a>(
    revision: &str,
    webhooks: impl IntoIterator<Item = &'a BTreeMap<String, String>>,
) -> BTreeSet<String> {
    webhooks
        .into_iter()
        .filter(|labels| labels.get(REVISION_LABEL).map(String::as_str) == Some(revision))
        .filter_map(|labels| labels.get(TAG_LABEL))
        .filter(|tag| !tag.is_empty())
        .cloned()
        .collect()
}

/// One change of the tag webhooks, by name.
enum TagEvent {
    Init,
    Seen(String, BTreeMap<String, String>),
    InitDone,
    Gone(String),
}

fn event(e: watcher::Event<MutatingWebhookConfiguration>) -> Option<TagEvent> {
    let named = |w: MutatingWebhookConfiguration| {
        let name = w.metadata.name.unwrap_or_default();
        (name, w.metadata.labels.unwrap_or_default())
    };
    Some(match e {
        watcher::Event::Init => TagEvent::Init,
        watcher::Event::InitApply(w) | watcher::Event::Apply(w) => {
            let (name, labels) = named(w);
            TagEvent::Seen(name, labels)
        }
        watcher::Event::InitDone => TagEvent::InitDone,
        watcher::Event::Delete(w) => TagEvent::Gone(named(w).0),
    })
}

/// Starts watching the tag webhooks for `revision`; the receiver holds the
/// tags pointing at it (empty until the first list, and for ever when
/// `revision` is empty: an istiod without a revision takes every object).
pub fn start(client: kube::Client, revision: &str, shutdown: watch::Receiver<bool>) -> Tags {
    let (tags_tx, tags) = watch::channel(BTreeSet::new());
    if revision.is_empty() {
        return tags;
    }
    let revision = revision.to_string();
    let (tx, mut rx) = mpsc::channel::<TagEvent>(16);
    let api: Api<MutatingWebhookConfiguration> = Api::all(client);
    let config = watcher::Config::default().labels(TAG_LABEL);
    tokio::spawn(async move {
        let what = format!("MutatingWebhookConfigurations labelled {TAG_LABEL}");
        run_watcher(what, api, config, &tx, event, shutdown).await;
    });
    tokio::spawn(async move {
        let mut webhooks: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        let mut listing: Option<BTreeMap<String, BTreeMap<String, String>>> = None;
        while let Some(e) = rx.recv().await {
            match e {
                TagEvent::Init => listing = Some(BTreeMap::new()),
                TagEvent::Seen(name, labels) => match listing.as_mut() {
                    Some(l) => {
                        l.insert(name, labels);
                    }
                    None => {
                        webhooks.insert(name, labels);
                    }
                },
                TagEvent::InitDone => webhooks = listing.take().unwrap_or_default(),
                TagEvent::Gone(name) => {
                    webhooks.remove(&name);
                }
            }
            if listing.is_some() {
                continue;
            }
            let now = tags_of(&revision, webhooks.values());
            tags_tx.send_if_modified(|tags| {
                if *tags == now {
                    return false;
                }
                tracing::info!(target: "tag-watcher", "revision {revision}: tags now {now:?}");
                *tags = now;
                true
            });
        }
    });
    tags
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(rev: &str, tag: Option<&str>) -> BTreeMap<String, String> {
        let mut m = BTreeMap::from([(REVISION_LABEL.to_string(), rev.to_string())]);
        if let Some(t) = tag {
            m.insert(TAG_LABEL.to_string(), t.to_string());
        }
        m
    }

    #[test]
    fn only_tags_naming_this_revision_are_its_own() {
        let hooks = [
            labels("canary", Some("prod")),
            labels("canary", Some("default")),
            labels("stable", Some("old")),
            labels("canary", None),
        ];
        let tags = tags_of("canary", hooks.iter());
        assert_eq!(
            tags,
            BTreeSet::from(["default".to_string(), "prod".to_string()])
        );
        assert!(tags_of("other", hooks.iter()).is_empty());
    }
}
