use std::time::{Duration, SystemTime};

use super::*;
use crate::model::parse_file;

const GROUP: &str = r#"apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata: {name: vm, namespace: demo, uid: "1234"}
spec:
  metadata:
    labels: {app: vm, version: v1}
    annotations: {team: a}
  template: {serviceAccount: vm-sa, ports: {http: 8080}}
  probe: {httpGet: {port: 8080}}
"#;

fn registrant(ip: &str) -> Registrant {
    Registrant {
        id: "vm-1.demo".into(),
        namespace: "demo".into(),
        ip: ip.into(),
        group: Some("vm".into()),
        labels: [("version".to_string(), "v2".to_string())].into(),
        locality: "r/z/s".into(),
        reports_health: true,
        identity: Some(common::Identity::new("cluster.local", "demo", "vm-sa")),
        ..Registrant::default()
    }
}

fn store_with_group() -> ConfigStore {
    let store = ConfigStore::new();
    let objects = parse_file("wg.yaml", GROUP).unwrap().objects;
    store.apply(objects.into_iter().map(|o| Update::Upsert(Arc::new(o))));
    store
}

use crate::model::Update;

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

#[test]
fn names_entries_as_istio() {
    let r = registrant("10.0.0.5");
    assert_eq!(entry_name(&r, "vm").unwrap(), "vm-10.0.0.5");
    let v6 = registrant("fd00::5");
    assert_eq!(entry_name(&v6, "vm").unwrap(), "vm-fd00--5");
    let long = "g".repeat(260);
    let name = entry_name(&r, &long).unwrap();
    assert_eq!(name.len(), 253);
    assert!(name.ends_with("-10.0.0.5"));
    let mut no_ip = registrant("");
    assert!(entry_name(&no_ip, "vm").is_err());
    no_ip.ip = "10.0.0.5".into();
    no_ip.network = "net1".into();
    let e = entry_name(&no_ip, "vm").unwrap_err().to_string();
    assert!(e.contains("NETWORK"), "{e}");
}

#[test]
fn builds_the_entry_from_the_group_template_and_the_proxy() {
    let store = store_with_group();
    let snapshot = store.snapshot();
    let group = snapshot
        .get(&ObjectKey::new(Kind::WorkloadGroup, "demo", "vm"))
        .unwrap();
    let entry = entry_from_group(
        "vm-10.0.0.5",
        &registrant("10.0.0.5"),
        group,
        "istiod-1",
        at(0),
    );
    let m = &entry.metadata;
    assert_eq!(
        (m.namespace.as_str(), m.name.as_str()),
        ("demo", "vm-10.0.0.5")
    );
    // The proxy's labels win over the group's.
    assert_eq!(m.labels["version"], "v2");
    assert_eq!(m.labels["app"], "vm");
    assert_eq!(m.annotations[ANNOTATION_GROUP], "vm");
    assert_eq!(m.annotations["team"], "a");
    assert_eq!(m.annotations[ANNOTATION_CONTROLLER], "istiod-1");
    assert_eq!(
        m.annotations[ANNOTATION_CONNECTED_AT],
        "2023-11-14T22:13:20Z"
    );
    assert_eq!(m.annotations[HEALTH_CHECK_ANNOTATION], "true");
    assert_eq!(m.owner_references.len(), 1);
    let owner = &m.owner_references[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("WorkloadGroup", "vm", "1234")
    );
    assert_eq!(owner.controller, Some(true));
    let Spec::WorkloadEntry(we) = &entry.spec else {
        panic!("not an entry")
    };
    assert_eq!(we.address, "10.0.0.5");
    assert_eq!(we.service_account, "vm-sa");
    assert_eq!(we.ports["http"], 8080);
    assert_eq!(we.locality, "r/z/s");
    // A proxy without a readiness probe is not health-checked.
    let mut r = registrant("10.0.0.5");
    r.reports_health = false;
    let entry = entry_from_group("vm-10.0.0.5", &r, group, "istiod-1", at(0));
    assert!(
        !entry
            .metadata
            .annotations
            .contains_key(HEALTH_CHECK_ANNOTATION)
    );
    // The entry reads back through the decoder (what the API would hold).
    let yaml = serde_json::to_string(&entry).unwrap();
    let back = parse_file("we.json", &yaml).unwrap().objects;
    assert_eq!(back[0], entry);
}

#[test]
fn identity_must_match_the_template() {
    let r = registrant("10.0.0.5");
    assert!(ensure_can_control(&r, "demo", "vm-sa").is_ok());
    assert!(ensure_can_control(&r, "demo", "").is_ok());
    let e = ensure_can_control(&r, "demo", "other").unwrap_err();
    assert!(matches!(e, RegistrationError::ServiceAccount { .. }), "{e}");
    let e = ensure_can_control(&r, "prod", "vm-sa").unwrap_err();
    assert!(matches!(e, RegistrationError::Namespace { .. }), "{e}");
    let mut plain = r.clone();
    plain.identity = None;
    let e = ensure_can_control(&plain, "demo", "vm-sa").unwrap_err();
    assert!(matches!(e, RegistrationError::Unverified), "{e}");
    assert_eq!(tonic::Status::from(e).code(), tonic::Code::PermissionDenied);
}

#[test]
fn connect_and_disconnect_times_decide_as_istio() {
    let a = |pairs: &[(&str, String)]| -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    };
    let ours = ("istio.io/workloadController", "istiod-1".to_string());
    let connected = a(&[ours.clone(), (ANNOTATION_CONNECTED_AT, format_time(at(10)))]);
    // A newer connection takes the entry; the same or an older one does not.
    assert!(should_mark_connected(&connected, "istiod-1", at(11)));
    assert!(!should_mark_connected(&connected, "istiod-1", at(10)));
    assert!(!should_mark_connected(&connected, "istiod-2", at(9)));
    assert!(should_mark_connected(&connected, "istiod-2", at(10)));
    let gone = a(&[
        ours.clone(),
        (ANNOTATION_DISCONNECTED_AT, format_time(at(20))),
    ]);
    assert!(!should_mark_connected(&gone, "istiod-1", at(19)));
    assert!(should_mark_connected(&gone, "istiod-1", at(21)));

    // Only the controller's latest connection marks it disconnected.
    assert!(should_mark_disconnected(
        &connected,
        "istiod-1",
        at(10),
        at(30)
    ));
    assert!(!should_mark_disconnected(
        &connected,
        "istiod-2",
        at(10),
        at(30)
    ));
    assert!(!should_mark_disconnected(
        &connected,
        "istiod-1",
        at(5),
        at(30)
    ));
}

#[test]
fn cleanup_waits_for_the_grace_period_and_spares_connected_entries() {
    let grace = Duration::from_secs(10);
    let mut a: Labels = [(ANNOTATION_GROUP.to_string(), "vm".to_string())].into();
    a.insert(ANNOTATION_DISCONNECTED_AT.into(), format_time(at(100)));
    assert!(!should_cleanup(&a, at(105), grace, None));
    assert!(should_cleanup(&a, at(110), grace, None));
    // Not auto-registered: never.
    let mut manual = a.clone();
    manual.remove(ANNOTATION_GROUP);
    assert!(!should_cleanup(&manual, at(500), grace, None));
    // Connected: only past the max connection age.
    a.remove(ANNOTATION_DISCONNECTED_AT);
    a.insert(ANNOTATION_CONNECTED_AT.into(), format_time(at(100)));
    assert!(!should_cleanup(&a, at(10_000), grace, None));
    assert!(!should_cleanup(
        &a,
        at(150),
        grace,
        Some(Duration::from_secs(60))
    ));
    assert!(should_cleanup(
        &a,
        at(161),
        grace,
        Some(Duration::from_secs(60))
    ));
}

#[test]
fn health_conditions_keep_the_newest_probe() {
    let sick = health_condition(
        &HealthEvent {
            healthy: false,
            message: "connection refused".into(),
        },
        at(10),
    );
    assert_eq!(sick.status, "False");
    assert_eq!(sick.message, "connection refused");
    let merged = merge_condition(&[], &sick).unwrap();
    let well = health_condition(
        &HealthEvent {
            healthy: true,
            message: "ignored".into(),
        },
        at(5),
    );
    // An older probe does not replace a newer one.
    assert!(merge_condition(&merged, &well).is_none());
    let sick_again = health_condition(
        &HealthEvent {
            healthy: false,
            message: "x".into(),
        },
        at(20),
    );
    let merged2 = merge_condition(&merged, &sick_again).unwrap();
    assert_eq!(merged2.len(), 1);
    // Same status: the transition time stays.
    assert_eq!(merged2[0].last_transition_time, format_time(at(10)));
    assert_eq!(merged2[0].last_probe_time, format_time(at(20)));
    assert!(!crate::model::istio::is_healthy(
        &[(HEALTH_CHECK_ANNOTATION.to_string(), "true".to_string())].into(),
        &merged2
    ));
}

#[test]
fn times_round_trip_in_go_rfc3339_nano() {
    let t = at(0) + Duration::from_nanos(120_000_000);
    assert_eq!(format_time(t), "2023-11-14T22:13:20.12Z");
    assert_eq!(parse_time(&format_time(t)), Some(t));
    assert_eq!(parse_time("2023-11-14T22:13:20Z"), Some(at(0)));
    assert_eq!(parse_time("yesterday"), None);
}

async fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    for _ in 0..200 {
        if let Some(v) = f() {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn registers_reports_health_and_removes_after_the_grace_period_in_memory() {
    let store = store_with_group();
    let (_stop, shutdown) = watch::channel(false);
    let settings = Settings {
        grace_period: Duration::from_millis(300),
        instance_id: "istiod-1".into(),
        ..Settings::default()
    };
    let c = Controller::start(settings, store.clone(), Writer::memory(&store), shutdown).unwrap();
    let r = registrant("10.0.0.5");
    let reg = c.on_connect(&r, SystemTime::now()).await.unwrap().unwrap();
    assert_eq!(reg.name, "vm-10.0.0.5");
    let entry = |s: &ConfigStore| {
        s.snapshot()
            .get_typed::<WorkloadEntry>("demo", "vm-10.0.0.5")
            .map(|we| (we.object.metadata.annotations.clone(), we.spec.clone()))
    };
    let (annotations, _) = entry(&store).expect("the entry is registered");
    assert_eq!(annotations[ANNOTATION_CONTROLLER], "istiod-1");

    // Health: written as the Healthy condition.
    c.on_health(
        &reg,
        &HealthEvent {
            healthy: false,
            message: "refused".into(),
        },
        SystemTime::now(),
    );
    let conditions = wait_for("Healthy=False", || {
        entry(&store)
            .map(|(_, we)| we.status_conditions)
            .filter(|c| c.iter().any(|c| c.status == "False"))
    })
    .await;
    assert_eq!(conditions[0].message, "refused");

    // A second connection of the same proxy: the first one's end keeps it.
    let reg2 = c
        .on_connect(&r, SystemTime::now() + Duration::from_millis(1))
        .await
        .unwrap()
        .unwrap();
    let key = (reg.namespace.clone(), reg.name.clone());
    c.on_disconnect(reg, SystemTime::now());
    // The controller still counts the second connection, so nothing was
    // started that could mark or remove the entry.
    assert_eq!(c.lock().get(&key), Some(&1), "one connection left");
    let (annotations, _) = entry(&store).expect("kept while a connection remains");
    assert!(!annotations.contains_key(ANNOTATION_DISCONNECTED_AT));

    // The last one's end: marked disconnected, then removed.
    c.on_disconnect(reg2, SystemTime::now() + Duration::from_millis(2));
    wait_for("disconnectedAt", || {
        entry(&store).filter(|(a, _)| a.contains_key(ANNOTATION_DISCONNECTED_AT))
    })
    .await;
    wait_for("the entry gone", || entry(&store).is_none().then_some(())).await;
}

#[tokio::test]
async fn refuses_a_missing_group_and_a_foreign_identity() {
    let store = store_with_group();
    let (_stop, shutdown) = watch::channel(false);
    let c = Controller::start(
        Settings::default(),
        store.clone(),
        Writer::memory(&store),
        shutdown,
    )
    .unwrap();
    let mut r = registrant("10.0.0.6");
    r.group = Some("nope".into());
    let e = c.on_connect(&r, SystemTime::now()).await.unwrap_err();
    assert!(matches!(e, RegistrationError::GroupNotFound { .. }), "{e}");
    let mut r = registrant("10.0.0.6");
    r.identity = Some(common::Identity::new("cluster.local", "demo", "intruder"));
    let e = c.on_connect(&r, SystemTime::now()).await.unwrap_err();
    assert!(matches!(e, RegistrationError::ServiceAccount { .. }), "{e}");
    assert!(
        store.snapshot().list::<WorkloadEntry>().next().is_none(),
        "nothing registered"
    );
    // Without a group: nothing to do.
    let mut r = registrant("10.0.0.6");
    r.group = None;
    assert_eq!(c.on_connect(&r, SystemTime::now()).await.unwrap(), None);
    // Disabled: nothing either.
    let (_stop, shutdown) = watch::channel(false);
    let off = Controller::start(
        Settings {
            auto_registration: false,
            ..Settings::default()
        },
        store.clone(),
        Writer::memory(&store),
        shutdown,
    )
    .unwrap();
    assert_eq!(
        off.on_connect(&registrant("10.0.0.6"), SystemTime::now())
            .await
            .unwrap(),
        None
    );
}
