//! Envoy's readiness, as Istio's `status/ready/probe.go` checks it through
//! the admin API: configuration received from the XDS server (CDS and LDS
//! updated once), then the server LIVE with its workers started. Both are
//! cached once true, as Istio does, so a loaded Envoy stays ready.

use std::sync::atomic::{AtomicBool, Ordering};

use hyper::StatusCode;
use prometheus::Gauge;

use crate::envoy::admin::AdminClient;
use crate::lifecycle::{Lifecycle, NotReady};

/// Envoy admin queries of the readiness probe (`status/util/stats.go`); sent
/// unescaped, as Go's client sends them.
const UPDATE_STATS_PATH: &str = r"/stats?usedonly&filter=^(cluster_manager\.cds|listener_manager\.lds)\.(update_success|update_rejected)$";
const READY_STATS_PATH: &str =
    r"/stats?usedonly&filter=^(server\.state|listener_manager\.workers_started)";
const STAT_CDS_SUCCESS: &str = "cluster_manager.cds.update_success";
const STAT_CDS_REJECTED: &str = "cluster_manager.cds.update_rejected";
const STAT_LDS_SUCCESS: &str = "listener_manager.lds.update_success";
const STAT_LDS_REJECTED: &str = "listener_manager.lds.update_rejected";
const STAT_SERVER_STATE: &str = "server.state";
const STAT_WORKERS_STARTED: &str = "listener_manager.workers_started";

/// Istio's `ready.Probe` for Envoy.
pub(super) struct EnvoyProbe {
    /// Envoy's admin, bounded by the readiness timeout.
    admin: AdminClient,
    /// `istio_agent_startup_duration_seconds`, set when Envoy is first ready.
    startup_duration: Gauge,
    /// When the agent started.
    started_at: std::time::Instant,
    /// Envoy has had CDS and LDS once (cached, as Istio does).
    config_received: AtomicBool,
    /// Envoy has been LIVE with workers started once (cached, as Istio does).
    envoy_ready_once: AtomicBool,
}

impl EnvoyProbe {
    pub(super) fn new(
        admin: AdminClient,
        startup_duration: Gauge,
        started_at: std::time::Instant,
    ) -> Self {
        Self {
            admin,
            startup_duration,
            started_at,
            config_received: AtomicBool::new(false),
            envoy_ready_once: AtomicBool::new(false),
        }
    }

    /// Istio's `ready.Probe.Check`: configuration first, then termination
    /// (Istio checks its context between the two), then LIVE.
    pub(super) async fn check(&self, lifecycle: &Lifecycle) -> Result<(), NotReady> {
        if !self.config_received.load(Ordering::Acquire) {
            self.check_config().await?;
            self.config_received.store(true, Ordering::Release);
        }
        if let Some(cause) = lifecycle.termination_cause() {
            return Err(NotReady(format!("server is terminated: {cause}")));
        }
        // LIVE and workers started do not go back during Envoy's life.
        if self.envoy_ready_once.load(Ordering::Acquire) {
            return Ok(());
        }
        self.check_envoy_live().await?;
        if !self.envoy_ready_once.swap(true, Ordering::AcqRel) {
            self.startup_duration
                .set(self.started_at.elapsed().as_secs_f64());
        }
        Ok(())
    }

    /// Istio's `checkConfigStatus`: CDS and LDS both updated at least once.
    async fn check_config(&self) -> Result<(), NotReady> {
        let body = self.admin_get(UPDATE_STATS_PATH).await?;
        let [cds_success, cds_rejected, lds_success, lds_rejected] = parse_stats(
            &body,
            [
                STAT_CDS_SUCCESS,
                STAT_CDS_REJECTED,
                STAT_LDS_SUCCESS,
                STAT_LDS_REJECTED,
            ],
        )?;
        let summary = format!(
            "cds updates: {cds_success} successful, {cds_rejected} rejected; lds updates: {lds_success} successful, {lds_rejected} rejected"
        );
        let reason = match (cds_success > 0, lds_success > 0) {
            (true, true) => return Ok(()),
            (false, false) => {
                format!("config not received from XDS server (is Istiod running?): {summary}")
            }
            _ if cds_rejected > 0 || lds_rejected > 0 => {
                format!("config received from XDS server, but was rejected: {summary}")
            }
            _ => format!("config not fully received from XDS server: {summary}"),
        };
        Err(NotReady(reason))
    }

    /// Istio's `checkEnvoyStats`.
    async fn check_envoy_live(&self) -> Result<(), NotReady> {
        let failed =
            |e: &dyn std::fmt::Display| NotReady(format!("failed to get readiness stats: {e}"));
        let body = self
            .admin_get(READY_STATS_PATH)
            .await
            .map_err(|e| failed(&e))?;
        for stat in [STAT_SERVER_STATE, STAT_WORKERS_STARTED] {
            if !body.contains(stat) {
                return Err(failed(&format!("{stat} is not yet updated: {body}")));
            }
        }
        let [state, workers] = parse_stats(&body, [STAT_SERVER_STATE, STAT_WORKERS_STARTED])
            .map_err(|e| failed(&e))?;
        if state != 0 {
            return Err(NotReady(format!(
                "server is not live, current state is: {}",
                server_state_name(state)
            )));
        }
        if workers != 1 {
            return Err("workers have not yet started".into());
        }
        Ok(())
    }

    /// GET on Envoy's admin, named as Go's client names a failed request.
    async fn admin_get(&self, path: &str) -> Result<String, NotReady> {
        let failed =
            |e: &dyn std::fmt::Display| NotReady(format!("Get \"{}\": {e}", self.admin.url(path)));
        let resp = self.admin.get(path).await.map_err(|e| failed(&e))?;
        if resp.status != StatusCode::OK {
            return Err(failed(&format!(
                "unexpected status {}",
                resp.status.as_u16()
            )));
        }
        Ok(resp.text())
    }
}

/// Istio's `parseStats`: the first line starting with each name, `name: value`.
/// Missing stats are 0.
fn parse_stats<const N: usize>(body: &str, names: [&str; N]) -> Result<[u64; N], NotReady> {
    let mut values = [0u64; N];
    let mut found = [false; N];
    let mut errors = Vec::new();
    for line in body.lines() {
        for (i, name) in names.iter().enumerate() {
            if found[i] || !line.starts_with(name) {
                continue;
            }
            found[i] = true;
            let parts: Vec<&str> = line.split(':').collect();
            if parts.len() != 2 {
                errors.push(format!("envoy stat {name} missing separator. line:{line}"));
                continue;
            }
            match parts[1].trim().parse::<u64>() {
                Ok(v) => values[i] = v,
                Err(e) => errors.push(format!(
                    "failed parsing Envoy stat {name} (error: {e}) line: {line}"
                )),
            }
        }
    }
    if errors.is_empty() {
        Ok(values)
    } else {
        Err(NotReady(errors.join("; ")))
    }
}

/// Envoy's `ServerInfo.State` names.
fn server_state_name(state: u64) -> String {
    match state {
        0 => "LIVE".to_string(),
        1 => "DRAINING".to_string(),
        2 => "PRE_INITIALIZING".to_string(),
        3 => "INITIALIZING".to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::StatusOptions;
    use super::super::testing::{LIVE_STATS, WAIT, dead_port, fake_admin, new_state, options};
    use super::*;

    // ready.TestEnvoyStats and friends.

    #[tokio::test]
    async fn envoy_stats_error_strings() {
        let cases = [
            (
                "only lds",
                "listener_manager.lds.update_success: 1",
                "config not fully received from XDS server: cds updates: 0 successful, 0 rejected; lds updates: 1 successful, 0 rejected",
            ),
            (
                "only cds",
                "cluster_manager.cds.update_success: 1",
                "config not fully received from XDS server: cds updates: 1 successful, 0 rejected; lds updates: 0 successful, 0 rejected",
            ),
            (
                "reject CDS",
                "cluster_manager.cds.update_rejected: 1\nlistener_manager.lds.update_success: 1",
                "config received from XDS server, but was rejected: cds updates: 0 successful, 1 rejected; lds updates: 1 successful, 0 rejected",
            ),
            (
                "no config",
                "",
                "config not received from XDS server (is Istiod running?): cds updates: 0 successful, 0 rejected; lds updates: 0 successful, 0 rejected",
            ),
            (
                "workers not started",
                "\ncluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: 1\nlistener_manager.workers_started: 0\nserver.state: 0",
                "workers have not yet started",
            ),
            (
                "not live",
                "cluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: 1\nlistener_manager.workers_started: 1\nserver.state: 2",
                "server is not live, current state is: PRE_INITIALIZING",
            ),
            (
                "draining",
                "cluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: 1\nlistener_manager.workers_started: 1\nserver.state: 1",
                "server is not live, current state is: DRAINING",
            ),
            (
                "initializing without workers stat (TestEnvoyInitializing)",
                "cluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: 1\nserver.state: 2",
                "failed to get readiness stats: listener_manager.workers_started is not yet updated: cluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: 1\nserver.state: 2",
            ),
            (
                "only server stats (TestEnvoyNoClusterManagerStats)",
                "server.state: 0",
                "config not received from XDS server (is Istiod running?): cds updates: 0 successful, 0 rejected; lds updates: 0 successful, 0 rejected",
            ),
            (
                "unparsable stat",
                "cluster_manager.cds.update_success: x\nlistener_manager.lds.update_success: 1",
                "failed parsing Envoy stat cluster_manager.cds.update_success (error: invalid digit found in string) line: cluster_manager.cds.update_success: x",
            ),
        ];
        for (name, stats, want) in cases {
            let (port, _) = fake_admin(Some(stats)).await;
            let state = new_state(options(port));
            assert_eq!(
                state.check_ready().await,
                Err(NotReady(want.to_string())),
                "{name}"
            );
        }
        let (port, _) = fake_admin(Some(&format!("\n{LIVE_STATS}"))).await;
        assert_eq!(new_state(options(port)).check_ready().await, Ok(()), "full");
    }

    #[tokio::test]
    async fn envoy_admin_unreachable() {
        let port = dead_port();
        let err = new_state(options(port)).check_ready().await.unwrap_err().0;
        let url = format!("Get \"http://127.0.0.1:{port}/stats?usedonly&filter=");
        assert!(err.starts_with(&url), "{err}");
        assert!(err.contains("dial tcp 127.0.0.1:"), "{err}");

        let (port, _) = fake_admin(None).await;
        let err = new_state(options(port)).check_ready().await.unwrap_err().0;
        assert!(err.ends_with("unexpected status 503"), "{err}");
    }

    #[tokio::test]
    async fn readiness_is_cached_once_ready() {
        // TestEnvoyReadinessCache: once ready, Envoy's stats are not read again.
        let (port, stats) = fake_admin(Some("")).await;
        let state = new_state(options(port));
        assert!(state.check_ready().await.is_err());
        assert!(state.check_ready().await.is_err());
        assert_eq!(state.metrics().startup_duration_seconds.get(), 0.0);

        *stats.lock().unwrap() = Some(LIVE_STATS.to_string());
        assert_eq!(state.check_ready().await, Ok(()));
        assert!(state.metrics().startup_duration_seconds.get() > 0.0);

        *stats.lock().unwrap() = Some(String::new());
        assert_eq!(state.check_ready().await, Ok(()));
        *stats.lock().unwrap() = None;
        assert_eq!(state.check_ready().await, Ok(()));
    }

    #[tokio::test]
    async fn terminated_fails_readiness_even_when_cached() {
        let (port, _) = fake_admin(Some(LIVE_STATS)).await;
        let state = new_state(options(port));
        assert_eq!(state.check_ready().await, Ok(()));
        assert!(state.lifecycle().terminate("received signal: terminated"));
        assert!(
            !state.lifecycle().terminate("something else"),
            "the first cause wins"
        );
        assert_eq!(
            state.check_ready().await,
            Err(NotReady(
                "server is terminated: received signal: terminated".to_string()
            ))
        );
        let cause = tokio::time::timeout(WAIT, state.lifecycle().terminated())
            .await
            .unwrap();
        assert_eq!(cause, "received signal: terminated");
    }

    #[tokio::test]
    async fn without_envoy_readiness_skips_envoy() {
        let state = new_state(StatusOptions {
            envoy: false,
            ..options(dead_port())
        });
        assert_eq!(state.check_ready().await, Ok(()));
    }
}
