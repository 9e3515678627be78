//! The Envoy process: Istio's command line (`pkg/envoy/proxy.go`), launch,
//! supervision, and the admin calls used to drain it (`pkg/envoy/agent.go`),
//! made with the one admin client in [`admin`].

pub mod admin;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::process::{Child, Command};

use admin::{AdminClient, AdminError};

use crate::lifecycle::Lifecycle;

/// Why Envoy could not be started or driven.
#[derive(Debug, thiserror::Error)]
pub enum EnvoyError {
    /// The binary is missing.
    #[error("Envoy binary {0} does not exist: install Envoy there or set ProxyConfig binaryPath")]
    MissingBinary(String),
    /// Spawning failed.
    #[error("starting Envoy {binary}: {source}")]
    Spawn {
        /// The binary.
        binary: String,
        /// The error.
        source: std::io::Error,
    },
    /// An admin call got no answer.
    #[error("Envoy admin {path}: {source}")]
    Admin {
        /// The admin path.
        path: String,
        /// Why.
        source: AdminError,
    },
    /// An admin call was refused.
    #[error("Envoy admin {path}: HTTP {status}: {body}")]
    AdminStatus {
        /// The admin path.
        path: String,
        /// The HTTP status.
        status: u16,
        /// The answer, trimmed.
        body: String,
    },
    /// `ISTIO_BOOTSTRAP_OVERRIDE` could not be read.
    #[error("ISTIO_BOOTSTRAP_OVERRIDE {path}: {reason}")]
    Override {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// Everything Envoy's command line is built from.
#[derive(Debug, Clone, Default)]
pub struct EnvoyOptions {
    /// ProxyConfig `binaryPath`.
    pub binary: String,
    /// The bootstrap file.
    pub config_file: PathBuf,
    /// ProxyConfig `drainDuration`.
    pub drain_duration: Duration,
    /// Whether every node IP is IPv6.
    pub ipv6: bool,
    /// ProxyConfig `fileFlushInterval` (1s).
    pub file_flush_interval: Duration,
    /// ProxyConfig `fileFlushMinSizeKb`.
    pub file_flush_min_size_kb: u32,
    /// `--proxyLogLevel`.
    pub log_level: String,
    /// `--proxyComponentLogLevel`.
    pub component_log_level: String,
    /// `ENVOY_SKIP_DEPRECATED_LOGS` (true).
    pub skip_deprecated_logs: bool,
    /// `ISTIO_ENVOY_ENABLE_CORE_DUMP`.
    pub enable_core_dump: bool,
    /// `ISTIO_BOOTSTRAP_OVERRIDE`, already read and converted to JSON.
    pub config_yaml: Option<String>,
    /// Worker threads; 0 leaves Envoy's default.
    pub concurrency: u32,
}

/// Splits `--proxyLogLevel` (`info,misc:warn`) into `-l` and
/// `--component-log-level`, as Istio's `splitComponentLog`: the last plain level
/// wins, entries with more than one `:` are dropped.
pub fn split_component_log(level: &str) -> (Option<String>, Vec<String>) {
    let mut plain = None;
    let mut components = Vec::new();
    for part in level.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.matches(':').count() {
            0 => plain = Some(part.to_string()),
            1 => components.push(part.to_string()),
            _ => {}
        }
    }
    (plain, components)
}

/// Istio's Envoy argument list, in Istio's order.
pub fn args(o: &EnvoyOptions) -> Vec<String> {
    let mut a = vec![
        "-c".to_string(),
        o.config_file.display().to_string(),
        "--drain-time-s".into(),
        o.drain_duration.as_secs().to_string(),
        "--drain-strategy".into(),
        "immediate".into(),
        "--local-address-ip-version".into(),
        if o.ipv6 { "v6" } else { "v4" }.into(),
        "--file-flush-interval-msec".into(),
        o.file_flush_interval.as_millis().to_string(),
        "--disable-hot-restart".into(),
        "--allow-unknown-static-fields".into(),
    ];
    if o.file_flush_min_size_kb > 0 {
        a.push("--file-flush-min-size-kb".into());
        a.push(o.file_flush_min_size_kb.to_string());
    }
    let (level, mut components) = split_component_log(&o.log_level);
    if let Some(l) = level {
        a.push("-l".into());
        a.push(l);
    }
    if components.is_empty() && !o.component_log_level.is_empty() {
        components.push(o.component_log_level.clone());
    }
    if !components.is_empty() {
        a.push("--component-log-level".into());
        a.push(components.join(","));
    }
    if o.skip_deprecated_logs {
        a.push("--skip-deprecated-logs".into());
    }
    if o.enable_core_dump {
        a.push("--enable-core-dump".into());
    }
    if let Some(y) = &o.config_yaml {
        a.push("--config-yaml".into());
        a.push(y.clone());
    }
    if o.concurrency > 0 {
        a.push("--concurrency".into());
        a.push(o.concurrency.to_string());
    }
    a
}

/// Reads `ISTIO_BOOTSTRAP_OVERRIDE`, substitutes `$(HOST_IP)` (bracketing IPv6)
/// and returns it as JSON for `--config-yaml`.
pub fn read_bootstrap_override(path: &Path, host_ip: &str) -> Result<String, EnvoyError> {
    let err = |reason: String| EnvoyError::Override {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let ip = if host_ip.contains(':') {
        format!("[{host_ip}]")
    } else {
        host_ip.to_string()
    };
    let text = text
        .replace("[$(HOST_IP)]", "$(HOST_IP)")
        .replace("$(HOST_IP)", &ip);
    let value: serde_json::Value =
        serde_yaml_ng::from_str(&text).map_err(|e| err(format!("not valid YAML or JSON: {e}")))?;
    serde_json::to_string(&value).map_err(|e| err(e.to_string()))
}

/// Starts Envoy with Istio's arguments; its output goes to the agent's.
pub fn spawn(o: &EnvoyOptions) -> Result<Child, EnvoyError> {
    if !Path::new(&o.binary).is_file() {
        return Err(EnvoyError::MissingBinary(o.binary.clone()));
    }
    let args = args(o);
    tracing::info!(target: "envoy", "Envoy command: {:?}", args);
    let mut cmd = Command::new(&o.binary);
    cmd.args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    // Envoy must not outlive the agent. In a container the agent is PID 1 and
    // its death takes Envoy along; outside one (tests, the local demo) the
    // kernel's parent-death signal does the same.
    #[allow(unsafe_code)]
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    cmd.spawn().map_err(|source| EnvoyError::Spawn {
        binary: o.binary.clone(),
        source,
    })
}

/// Describes how Envoy ended, as Istio's agent logs it.
pub fn describe_exit(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal() {
        // Go's spelling of the signal, as Istio's agent prints it.
        let name = match nix::sys::signal::Signal::try_from(sig) {
            Ok(nix::sys::signal::Signal::SIGKILL) => "killed".to_string(),
            Ok(nix::sys::signal::Signal::SIGTERM) => "terminated".to_string(),
            Ok(nix::sys::signal::Signal::SIGINT) => "interrupt".to_string(),
            Ok(nix::sys::signal::Signal::SIGSEGV) => "segmentation fault".to_string(),
            Ok(nix::sys::signal::Signal::SIGABRT) => "aborted".to_string(),
            Ok(nix::sys::signal::Signal::SIGBUS) => "bus error".to_string(),
            Ok(s) => s.as_str().to_string(),
            Err(_) => sig.to_string(),
        };
        let mut msg = format!("Envoy exited with error: signal: {name}");
        if sig == libc_sigkill() {
            msg.push_str(
                "; Envoy may have been out of memory killed. Check memory usage and limits.",
            );
        }
        msg
    } else if status.success() {
        "Envoy exited normally".to_string()
    } else {
        format!(
            "Envoy exited with error: exit status {}",
            status.code().unwrap_or(-1)
        )
    }
}

fn libc_sigkill() -> i32 {
    nix::sys::signal::Signal::SIGKILL as i32
}

/// Starts draining listeners gracefully (`/drain_listeners` on the admin
/// address). Sidecars drain inbound listeners only; `skip_exit` keeps Envoy
/// running afterwards (`/drain`).
pub async fn drain_listeners(
    admin: SocketAddr,
    inbound_only: bool,
    skip_exit: bool,
) -> Result<(), EnvoyError> {
    let mut path = "/drain_listeners?".to_string();
    if inbound_only {
        path.push_str("inboundonly&");
    }
    path.push_str("graceful");
    if skip_exit {
        path.push_str("&skip_exit");
    }
    let resp = AdminClient::at(admin)
        .with_timeout(Duration::from_secs(5))
        .post(&path)
        .await;
    let resp = match resp {
        Ok(resp) => resp,
        Err(source) => return Err(EnvoyError::Admin { path, source }),
    };
    if resp.status != hyper::StatusCode::OK {
        return Err(EnvoyError::AdminStatus {
            path,
            status: resp.status.as_u16(),
            body: resp.text().trim().to_string(),
        });
    }
    Ok(())
}

/// Sums `downstream_cx_active` over the application's listeners, as Istio's
/// `activeProxyConnections` does; -1 when Envoy reports no such stats.
pub fn sum_active_connections(stats: &str, excluded_ports: &[u16]) -> i64 {
    if stats.trim().is_empty() {
        return -1;
    }
    let excluded: Vec<String> = excluded_ports
        .iter()
        .map(|p| format!("listener.0.0.0.0_{p}."))
        .collect();
    let mut total = 0;
    for line in stats.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        if !name.starts_with("listener.")
            || name.contains("worker_")
            || name.starts_with("listener.envoy_internal_")
            || name == "listener.admin.downstream_cx_active"
            || name == "listener.admin.main_thread.downstream_cx_active"
            || excluded.iter().any(|e| name.starts_with(e))
        {
            continue;
        }
        total += value.trim().parse::<i64>().unwrap_or(0);
    }
    total
}

/// Asks Envoy's admin at `admin` how many application connections are open.
pub async fn active_connections(
    admin: SocketAddr,
    excluded_ports: &[u16],
) -> Result<i64, EnvoyError> {
    let path = "/stats?usedonly&filter=downstream_cx_active$";
    // The body is summed whatever the status (Istio's `DoHTTPGetWithTimeout`
    // would count a non-200 answer as an error).
    let resp = AdminClient::at(admin)
        .with_timeout(Duration::from_secs(2))
        .get(path)
        .await
        .map_err(|source| EnvoyError::Admin {
            path: path.to_string(),
            source,
        })?;
    Ok(sum_active_connections(&resp.text(), excluded_ports))
}

/// Why the agent stops Envoy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM/SIGINT: drain, wait, then stop Envoy.
    Terminate(String),
    /// `POST /quitquitquit`: stop Envoy at once.
    Quit,
}

/// How Envoy is drained on termination (Istio's `terminate`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct DrainSettings {
    /// Envoy's admin address: `127.0.0.1`, or `[::1]` in IPv6-only Pods,
    /// and ProxyConfig `proxyAdminPort`.
    pub admin: SocketAddr,
    /// Sidecars drain inbound listeners only.
    pub inbound_only: bool,
    /// ProxyConfig `terminationDrainDuration` (5s).
    #[serde(serialize_with = "common::duration::serialize")]
    pub termination_drain_duration: Duration,
    /// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`.
    pub exit_on_zero_active_connections: bool,
    /// `MINIMUM_DRAIN_DURATION` (5s).
    #[serde(serialize_with = "common::duration::serialize")]
    pub minimum_drain_duration: Duration,
    /// Istio's own listener ports, left out of the connection count (15021, 15090, ...).
    pub excluded_ports: Vec<u16>,
}

/// How the supervised Envoy ended.
#[derive(Debug)]
pub enum Ended {
    /// Envoy exited by itself (crash, kill, its own /quitquitquit).
    Exited(ExitStatus),
    /// The agent stopped it after a drain or a quit.
    Stopped,
}

async fn kill_and_wait(child: &mut Child) {
    let _ = child.start_kill();
    let _ = child.wait().await;
}

/// Waits for Envoy to exit or for a stop request, then drains and stops it
/// as Istio's agent does. After `POST /drain` (the native sidecar preStop,
/// recorded in `lifecycle`) Envoy is already drained: a later SIGTERM then
/// stops it without draining and waiting again.
pub async fn supervise(
    mut child: Child,
    settings: DrainSettings,
    mut stops: tokio::sync::mpsc::Receiver<Stop>,
    lifecycle: Arc<Lifecycle>,
) -> Ended {
    let stop = tokio::select! {
        status = child.wait() => {
            return match status {
                Ok(s) => {
                    let msg = describe_exit(&s);
                    if s.success() { tracing::info!(target: "envoy", "{msg}") } else { tracing::warn!(target: "envoy", "{msg}") }
                    Ended::Exited(s)
                }
                Err(e) => {
                    tracing::error!(target: "envoy", "waiting for Envoy failed: {e}");
                    Ended::Stopped
                }
            };
        }
        stop = stops.recv() => stop.unwrap_or(Stop::Quit),
    };
    match stop {
        Stop::Quit => {
            tracing::info!(target: "envoy", "quit requested: stopping Envoy now");
            kill_and_wait(&mut child).await;
        }
        Stop::Terminate(cause) if lifecycle.is_drain_requested() => {
            tracing::info!(target: "envoy", "{cause}; Envoy was already drained, stopping it now");
            kill_and_wait(&mut child).await;
        }
        Stop::Terminate(cause) => {
            tracing::info!(target: "envoy", "{cause}; draining Envoy's listeners");
            if let Err(e) = drain_listeners(settings.admin, settings.inbound_only, false).await {
                tracing::warn!(target: "envoy", "draining failed, stopping Envoy anyway: {e}");
            } else if settings.exit_on_zero_active_connections {
                wait_for_zero_connections(&mut child, &settings).await;
            } else {
                tracing::info!(
                    target: "envoy",
                    "graceful termination period is {}, starting...",
                    common::duration::format(settings.termination_drain_duration)
                );
                tokio::select! {
                    _ = tokio::time::sleep(settings.termination_drain_duration) => {}
                    _ = child.wait() => {}
                }
                tracing::info!(target: "envoy", "graceful termination period complete, terminating remaining proxies.");
            }
            kill_and_wait(&mut child).await;
            tracing::info!(target: "envoy", "Envoy aborted normally");
        }
    }
    Ended::Stopped
}

async fn wait_for_zero_connections(child: &mut Child, settings: &DrainSettings) {
    tokio::select! {
        _ = tokio::time::sleep(settings.minimum_drain_duration) => {}
        _ = child.wait() => return,
    }
    let mut errors = 0;
    loop {
        match active_connections(settings.admin, &settings.excluded_ports).await {
            Ok(n) if n <= 0 => {
                tracing::info!(target: "envoy", "there are no more active connections. terminating proxy...");
                return;
            }
            Ok(n) => {
                errors = 0;
                tracing::info!(target: "envoy", "there are still {n} active connections");
            }
            Err(e) => {
                errors += 1;
                tracing::warn!(target: "envoy", "cannot count active connections: {e}");
                if errors >= 5 {
                    return;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = child.wait() => return,
        }
    }
}

/// When the agent is PID 1 (the container's entrypoint), orphaned processes
/// are re-parented to it and must be reaped. Peeks at exited children without
/// reaping (`WNOWAIT`), so Envoy's own exit status stays for its waiter.
pub fn spawn_zombie_reaper(envoy_pid: Option<u32>) {
    if std::process::id() != 1 {
        return;
    }
    tokio::spawn(async move {
        use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
        let Ok(mut sigchld) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
        else {
            return;
        };
        loop {
            tokio::select! {
                _ = sigchld.recv() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            loop {
                let peek = waitid(
                    Id::All,
                    WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
                );
                let pid = match peek {
                    Ok(WaitStatus::Exited(pid, _)) | Ok(WaitStatus::Signaled(pid, _, _)) => pid,
                    _ => break,
                };
                if Some(pid.as_raw() as u32) == envoy_pid {
                    break;
                }
                let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
                tracing::debug!(target: "envoy", "reaped orphaned process {pid}");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoy_args_in_istios_order() {
        let o = EnvoyOptions {
            binary: "/usr/local/bin/envoy".into(),
            config_file: "./etc/istio/proxy/envoy-rev.json".into(),
            drain_duration: Duration::from_secs(45),
            file_flush_interval: Duration::from_secs(1),
            log_level: "warning".into(),
            component_log_level: "misc:error".into(),
            skip_deprecated_logs: true,
            config_yaml: Some(r#"{"key":"value"}"#.into()),
            concurrency: 8,
            ..Default::default()
        };
        assert_eq!(
            args(&o).join(" "),
            "-c ./etc/istio/proxy/envoy-rev.json --drain-time-s 45 --drain-strategy immediate \
             --local-address-ip-version v4 --file-flush-interval-msec 1000 --disable-hot-restart \
             --allow-unknown-static-fields -l warning --component-log-level misc:error \
             --skip-deprecated-logs --config-yaml {\"key\":\"value\"} --concurrency 8"
        );
    }

    #[test]
    fn component_log_split_like_istio() {
        assert_eq!(split_component_log("info"), (Some("info".into()), vec![]));
        assert_eq!(
            split_component_log("info,warn"),
            (Some("warn".into()), vec![])
        );
        assert_eq!(
            split_component_log("misc:warn,info,upstream:debug"),
            (
                Some("info".into()),
                vec!["misc:warn".to_string(), "upstream:debug".to_string()]
            )
        );
        assert_eq!(
            split_component_log("a:b:c,info"),
            (Some("info".into()), vec![])
        );
    }

    #[test]
    fn active_connections_like_istio() {
        assert_eq!(sum_active_connections("", &[15021, 15090]), -1);
        let stats = "listener.0.0.0.0_15001.downstream_cx_active: 7\n\
            listener.0.0.0.0_15006.downstream_cx_active: 12\n\
            listener.0.0.0.0_15006.worker_0.downstream_cx_active: 12\n\
            listener.0.0.0.0_15021.downstream_cx_active: 3\n\
            listener.0.0.0.0_15090.downstream_cx_active: 2\n\
            listener.admin.downstream_cx_active: 1\n\
            listener.admin.main_thread.downstream_cx_active: 1\n\
            listener.envoy_internal_x.downstream_cx_active: 4\n";
        assert_eq!(sum_active_connections(stats, &[15021, 15090]), 19);
    }

    #[test]
    fn bootstrap_override_substitutes_host_ip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.yaml");
        std::fs::write(&p, "tracing:\n  address: $(HOST_IP):9411\n").unwrap();
        assert_eq!(
            read_bootstrap_override(&p, "10.0.0.1").unwrap(),
            r#"{"tracing":{"address":"10.0.0.1:9411"}}"#
        );
        std::fs::write(&p, "a: \"[$(HOST_IP)]:1\"\nb: \"$(HOST_IP)\"\n").unwrap();
        assert_eq!(
            read_bootstrap_override(&p, "fd00::1").unwrap(),
            r#"{"a":"[fd00::1]:1","b":"[fd00::1]"}"#
        );
    }

    #[test]
    fn missing_binary_is_one_clear_line() {
        let o = EnvoyOptions {
            binary: "/nonexistent/envoy".into(),
            ..Default::default()
        };
        let e = spawn(&o).unwrap_err().to_string();
        assert_eq!(e.lines().count(), 1);
        assert!(
            e.contains("/nonexistent/envoy") && e.contains("binaryPath"),
            "{e}"
        );
    }
}
