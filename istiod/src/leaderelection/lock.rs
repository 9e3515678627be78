//! The two kinds of lock object Istio's elections use, read and written as
//! client-go's resource locks do: a ConfigMap carrying the record as JSON in
//! the annotation `control-plane.alpha.kubernetes.io/leader`, or a
//! `coordination.k8s.io/v1` Lease whose spec is the record (the holder's
//! priority key in the annotation `leader.istio.io/holder-key`). Every
//! update carries the `resourceVersion` last read, so of two writers racing
//! for the lock the API lets one through and answers the other 409.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use serde::{Deserialize, Serialize};

use super::ElectionError;

/// The ConfigMap annotation holding the record (client-go's
/// `LeaderElectionRecordAnnotationKey`).
pub const RECORD_ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";
/// The Lease annotation holding the holder's key (Istio's `LeaseHolderKey`).
pub const HOLDER_KEY_ANNOTATION: &str = "leader.istio.io/holder-key";

/// The lock's content, as client-go's `LeaderElectionRecord` (JSON field
/// names included: the ConfigMap annotation is this, serialized).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Record {
    /// Who holds the lock; empty when released.
    pub holder_identity: String,
    /// The holder's priority key (its revision).
    pub holder_key: String,
    /// How long the lock is valid after `renew_time`.
    pub lease_duration_seconds: i64,
    /// When the holder acquired it.
    pub acquire_time: String,
    /// When the holder last renewed it.
    pub renew_time: String,
    /// How many times the holder changed.
    pub leader_transitions: i64,
}

/// Which object a lock is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// A ConfigMap (Istio's elections shared by every revision).
    ConfigMap,
    /// A `coordination.k8s.io/v1` Lease.
    Lease,
}

/// The lock object as last read: what the next update starts from.
#[derive(Debug, Clone)]
enum Held {
    ConfigMap(Box<ConfigMap>),
    Lease(Box<Lease>),
}

/// One lock object in the API.
pub struct Lock {
    kind: LockKind,
    namespace: String,
    name: String,
    client: kube::Client,
    held: Option<Held>,
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

impl Lock {
    /// The lock `namespace/name` of `kind`.
    pub fn new(client: kube::Client, kind: LockKind, namespace: &str, name: &str) -> Self {
        Self {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
            client,
            held: None,
        }
    }

    /// `namespace/name`, as client-go describes a lock.
    pub fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The record and its raw form (what changes tell a live holder), or
    /// `None` when the object does not exist.
    pub async fn get(&mut self) -> Result<Option<(Record, String)>, ElectionError> {
        let got = match self.kind {
            LockKind::ConfigMap => {
                let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
                api.get_opt(&self.name).await?.map(|cm| {
                    let raw = cm
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(RECORD_ANNOTATION))
                        .cloned()
                        .unwrap_or_default();
                    (Held::ConfigMap(Box::new(cm)), raw)
                })
            }
            LockKind::Lease => {
                let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
                api.get_opt(&self.name).await?.map(|lease| {
                    let raw = serde_json::to_string(&lease_record(&lease)).unwrap_or_default();
                    (Held::Lease(Box::new(lease)), raw)
                })
            }
        };
        let Some((held, raw)) = got else {
            self.held = None;
            return Ok(None);
        };
        let record = match &held {
            Held::ConfigMap(_) if raw.is_empty() => Record::default(),
            Held::ConfigMap(_) => {
                serde_json::from_str(&raw).map_err(|e| ElectionError::Record {
                    lock: self.describe(),
                    reason: e.to_string(),
                })?
            }
            Held::Lease(lease) => lease_record(lease),
        };
        self.held = Some(held);
        Ok(Some((record, raw)))
    }

    /// Creates the lock object holding `record`; `Ok(false)` when another
    /// created it first (409).
    pub async fn create(&mut self, record: &Record) -> Result<bool, ElectionError> {
        let meta = ObjectMeta {
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            ..Default::default()
        };
        let pp = PostParams::default();
        let created = match self.kind {
            LockKind::ConfigMap => {
                let mut cm = ConfigMap {
                    metadata: meta,
                    ..Default::default()
                };
                set_configmap_record(&mut cm, record)?;
                let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
                api.create(&pp, &cm)
                    .await
                    .map(|cm| Held::ConfigMap(Box::new(cm)))
            }
            LockKind::Lease => {
                let mut lease = Lease {
                    metadata: meta,
                    ..Default::default()
                };
                set_lease_record(&mut lease, record)?;
                let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
                api.create(&pp, &lease)
                    .await
                    .map(|l| Held::Lease(Box::new(l)))
            }
        };
        match created {
            Ok(held) => {
                self.held = Some(held);
                Ok(true)
            }
            Err(e) if is_status(&e, 409) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Replaces the record of the object last read; `Ok(false)` when it
    /// changed meanwhile (409: another writer won) or is gone.
    pub async fn update(&mut self, record: &Record) -> Result<bool, ElectionError> {
        let pp = PostParams::default();
        let updated = match self.held.take() {
            None => return Ok(false),
            Some(Held::ConfigMap(mut cm)) => {
                set_configmap_record(&mut cm, record)?;
                let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
                api.replace(&self.name, &pp, &cm)
                    .await
                    .map(|cm| Held::ConfigMap(Box::new(cm)))
            }
            Some(Held::Lease(mut lease)) => {
                set_lease_record(&mut lease, record)?;
                let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
                api.replace(&self.name, &pp, &lease)
                    .await
                    .map(|l| Held::Lease(Box::new(l)))
            }
        };
        match updated {
            Ok(held) => {
                self.held = Some(held);
                Ok(true)
            }
            Err(e) if is_status(&e, 409) || is_status(&e, 404) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

fn set_configmap_record(cm: &mut ConfigMap, record: &Record) -> Result<(), ElectionError> {
    let json = serde_json::to_string(record).map_err(|e| ElectionError::Record {
        lock: cm.metadata.name.clone().unwrap_or_default(),
        reason: e.to_string(),
    })?;
    cm.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(RECORD_ANNOTATION.to_string(), json);
    Ok(())
}

/// A Lease's spec read as a record (client-go's `LeaseToLeaderElectionRecord`).
pub fn lease_record(lease: &Lease) -> Record {
    let spec = lease
        .spec
        .as_ref()
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or_default();
    let text = |k: &str| spec[k].as_str().unwrap_or_default().to_string();
    Record {
        holder_identity: text("holderIdentity"),
        holder_key: lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(HOLDER_KEY_ANNOTATION))
            .cloned()
            .unwrap_or_default(),
        lease_duration_seconds: spec["leaseDurationSeconds"].as_i64().unwrap_or_default(),
        acquire_time: text("acquireTime"),
        renew_time: text("renewTime"),
        leader_transitions: spec["leaseTransitions"].as_i64().unwrap_or_default(),
    }
}

fn set_lease_record(lease: &mut Lease, record: &Record) -> Result<(), ElectionError> {
    let spec = serde_json::json!({
        "holderIdentity": record.holder_identity,
        "leaseDurationSeconds": record.lease_duration_seconds,
        "acquireTime": record.acquire_time,
        "renewTime": record.renew_time,
        "leaseTransitions": record.leader_transitions,
    });
    lease.spec = Some(
        serde_json::from_value(spec).map_err(|e| ElectionError::Record {
            lock: lease.metadata.name.clone().unwrap_or_default(),
            reason: e.to_string(),
        })?,
    );
    let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
    if record.holder_key.is_empty() {
        annotations.remove(HOLDER_KEY_ANNOTATION);
    } else {
        annotations.insert(HOLDER_KEY_ANNOTATION.to_string(), record.holder_key.clone());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_is_client_go_json() {
        let r = Record {
            holder_identity: "istiod-a".into(),
            holder_key: "default".into(),
            lease_duration_seconds: 30,
            acquire_time: "2026-12-07T12:00:00Z".into(),
            renew_time: "2026-12-07T12:00:05Z".into(),
            leader_transitions: 2,
        };
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["holderIdentity"], "istiod-a");
        assert_eq!(v["holderKey"], "default");
        assert_eq!(v["leaseDurationSeconds"], 30);
        assert_eq!(v["leaderTransitions"], 2);
        let back: Record = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn a_lease_carries_the_record_and_the_key() {
        let mut lease = Lease::default();
        let r = Record {
            holder_identity: "istiod-b".into(),
            holder_key: "canary".into(),
            lease_duration_seconds: 30,
            acquire_time: "2026-12-07T12:00:00.000000Z".into(),
            renew_time: "2026-12-07T12:00:07.500000Z".into(),
            leader_transitions: 1,
        };
        set_lease_record(&mut lease, &r).unwrap();
        assert_eq!(
            lease.metadata.annotations.as_ref().unwrap()[HOLDER_KEY_ANNOTATION],
            "canary"
        );
        assert_eq!(lease_record(&lease), r);
    }
}
