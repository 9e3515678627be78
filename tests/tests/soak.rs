//! The soak's short form (the long one is `target/debug/soak`, see
//! `tests/src/bin/soak.rs`): the local mesh for about 75 s under steady
//! traffic while certificates rotate every 10 s and the VirtualService's
//! weights are edited every 20 s. No request may fail, and every Pod's Envoy
//! must show new certificates and sleep's Envoy every edit.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tests::soak::{SoakConfig, run};

/// Over a minute, resident memory still moves with allocator warm-up and
/// the moment a reading falls on (a rotation, a push), so only a runaway
/// growth is caught here; the 5 % bound is the long soak's.
const LOOSE_RSS_LIMIT_PCT: f64 = 50.0;

#[test]
fn a_short_soak_loses_no_request_while_certificates_rotate_and_weights_change() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = SoakConfig::new(tmp.path().to_path_buf());
    cfg.warmup = Duration::from_secs(15);
    cfg.duration = Duration::from_secs(60);
    let report = run(cfg, |line| eprintln!("soak: {line}"));
    let text = report.render();
    eprintln!("{text}");
    assert!(report.sent > 100, "traffic flowed:\n{text}");
    assert!(report.failures.is_empty(), "no request may fail:\n{text}");
    for (pod, n) in &report.rotations {
        assert!(
            *n >= 4,
            "{pod}'s Envoy served {n} new certificates:\n{text}"
        );
    }
    assert!(report.edits.len() >= 3, "edits made:\n{text}");
    assert_eq!(
        report.edits_seen(),
        report.edits.len(),
        "every edit reached sleep's Envoy:\n{text}"
    );
    // The split followed the weights: v2 answered most while it had 90.
    let while_v2_heavy: (u64, u64) = report
        .edits
        .iter()
        .filter(|e| e.weights == (10, 90))
        .fold((0, 0), |(a, b), e| (a + e.answered.0, b + e.answered.1));
    assert!(
        while_v2_heavy.1 > while_v2_heavy.0,
        "v2 answered most while weighted 90:\n{text}"
    );
    let grown = report.grown(LOOSE_RSS_LIMIT_PCT);
    assert!(grown.is_empty(), "runaway memory growth:\n{text}");
}
