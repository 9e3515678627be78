//! The composition root of `pilot-agent proxy`: builds each part from the
//! `Config` in Istio's start-up order (status server, SDS and certificates,
//! bootstrap, Envoy), then supervises until Envoy exits or the Pod stops.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::config::Config;
use crate::envoy::{DrainSettings, Ended, Stop};
use crate::lifecycle::Lifecycle;
use crate::sds::{SdsServer, bind_uds};
use crate::secret_manager::{SecretManager, SecretWatch};
use crate::status::{StatusOptions, StatusState};

/// How the agent runs, beyond its `Config`.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// `--log_as_json` (also Envoy's log format).
    pub log_as_json: bool,
}

struct EnvoyRun {
    stops: mpsc::Sender<Stop>,
    done: JoinHandle<Ended>,
    bootstrap: Option<PathBuf>,
    drained: Arc<AtomicBool>,
    admin_port: u16,
}

/// The running agent.
pub struct Bound {
    /// The SDS socket path.
    pub sds_socket: PathBuf,
    /// The workload secret as it is published.
    pub secrets: SecretWatch,
    /// The status server's address.
    pub status_addr: SocketAddr,
    /// Readiness conditions, drain and quit requests, termination.
    pub lifecycle: Arc<Lifecycle>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<anyhow::Result<()>>,
    envoy: EnvoyRun,
}

impl Bound {
    /// Stops the agent's own servers.
    async fn stop_servers(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
    }

    /// Runs until Envoy exits or the Pod is stopped (SIGTERM/SIGINT, or
    /// `/quitquitquit`), draining Envoy as Istio does. Exits cleanly in every
    /// case Istio's agent exits 0.
    pub async fn wait_termination(mut self) -> anyhow::Result<()> {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        let lifecycle = self.lifecycle.clone();
        let mut drain_handled = false;
        let mut quit_handled = false;
        let ended = loop {
            tokio::select! {
                ended = &mut self.envoy.done => break ended.unwrap_or(Ended::Stopped),
                _ = term.recv() => self.stop_envoy(Stop::Terminate("received signal: terminated".into())).await,
                _ = int.recv() => self.stop_envoy(Stop::Terminate("received signal: interrupt".into())).await,
                _ = lifecycle.quit_requested(), if !quit_handled => {
                    quit_handled = true;
                    self.stop_envoy(Stop::Quit).await;
                }
                _ = lifecycle.drain_requested(), if !drain_handled => {
                    drain_handled = true;
                    // The native sidecar's preStop: drain now, keep running, and
                    // stop Envoy at once on the SIGTERM that follows.
                    self.envoy.drained.store(true, Ordering::SeqCst);
                    if let Err(e) = crate::envoy::drain_listeners(self.envoy.admin_port, true, true).await {
                        tracing::warn!(target: "envoy", "drain requested, but draining failed: {e}");
                    }
                }
                Some(res) = self.tasks.join_next() => {
                    let err = match res {
                        Ok(Ok(())) => anyhow::anyhow!("a server stopped unexpectedly"),
                        Ok(Err(e)) => e,
                        Err(e) => anyhow::anyhow!("a server task failed: {e}"),
                    };
                    tracing::error!("{err:#}; stopping");
                    self.stop_envoy(Stop::Terminate(format!("{err:#}"))).await;
                }
            }
        };
        if let Ended::Exited(_) = ended {
            lifecycle.terminate("Envoy exited");
        }
        if let Some(path) = self.envoy.bootstrap.take() {
            let _ = std::fs::remove_file(&path);
        }
        self.stop_servers().await;
        tracing::info!("agent has successfully terminated");
        Ok(())
    }

    async fn stop_envoy(&mut self, stop: Stop) {
        if let Stop::Terminate(cause) = &stop {
            self.lifecycle.terminate(cause.clone());
        }
        let _ = self.envoy.stops.send(stop).await;
    }
}

/// Starts the agent's parts and Envoy.
pub async fn build(config: Arc<Config>, run: RunOptions) -> anyhow::Result<Bound> {
    common::tls::install_crypto_provider();
    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let shutdown_signal = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };

    // 1. The status server first, so /healthz/ready answers 503 meanwhile.
    let lifecycle = Arc::new(Lifecycle::new());
    let status = Arc::new(
        StatusState::new(
            StatusOptions {
                status_port: config.proxy.status_port(),
                admin_port: config.proxy.admin_port(),
                envoy_prometheus_port: config.envoy_prometheus_port,
                instance_ip: config.ips.first().cloned().unwrap_or_default(),
                ipv6: crate::bootstrap::all_ipv6(&config.ips),
                kube_app_probers: config.app_probers.clone().unwrap_or_default(),
                prometheus_annotations: config.prometheus_annotations.clone(),
                sidecar: config.proxy_type == "sidecar",
                started_at: Some(std::time::Instant::now()),
                ..Default::default()
            },
            lifecycle.clone(),
        )
        .context("status server configuration")?,
    );
    let status_listener =
        tokio::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], config.proxy.status_port())))
            .await
            .with_context(|| {
                format!(
                    "cannot listen on the status port {}",
                    config.proxy.status_port()
                )
            })?;
    let status_addr = status_listener.local_addr()?;
    {
        let rx = shutdown_rx.clone();
        // Istio closes :15020 as soon as the agent terminates, so kubelet's
        // probes through Envoy's :15021 fail from then on.
        let terminated = {
            let lifecycle = lifecycle.clone();
            async move {
                tokio::select! {
                    _ = lifecycle.terminated() => {}
                    _ = shutdown_signal(rx) => {}
                }
            }
        };
        tasks.spawn(async move {
            crate::status::serve(status_listener, status, terminated)
                .await
                .context("status server")
        });
    }

    // 2. SDS: an external SDS server on the well-known socket is not supported;
    // a dead socket is stale and removed.
    if config.sds_socket.exists() {
        let live = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            tokio::net::UnixStream::connect(&config.sds_socket),
        )
        .await
        .is_ok_and(|r| r.is_ok());
        if live {
            anyhow::bail!(
                "an SDS server is already listening on {}; serving workload certificates from an external SDS server is not supported by this agent",
                config.sds_socket.display()
            );
        }
        tracing::info!(target: "sds", "removing stale SDS socket {}", config.sds_socket.display());
    } else if !config.sds_socket_default_name {
        anyhow::bail!(
            "WORKLOAD_IDENTITY_SOCKET_FILE names {} but no SDS server listens there",
            config.sds_socket.display()
        );
    }
    let manager = SecretManager::start(config.clone()).context("starting the secret manager")?;
    let secrets = manager.watch();
    let listener = bind_uds(&config.sds_socket).with_context(|| {
        format!(
            "cannot listen on the SDS socket {}",
            config.sds_socket.display()
        )
    })?;
    let sds = SdsServer::new(secrets.clone()).into_service();
    let rx = shutdown_rx.clone();
    tasks.spawn(async move {
        tonic::transport::Server::builder()
            .add_service(sds)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                shutdown_signal(rx),
            )
            .await
            .context("SDS server")
    });
    tracing::info!(target: "sds", "SDS server for workload certificates started, listening on {:?}", config.sds_socket);

    // The DNS proxy, fed by the name table the xDS proxy takes from istiod.
    let mut nds: Option<crate::xds_proxy::NdsHandler> = None;
    if config.dns_capture {
        let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        let guard = lifecycle.readiness_pending(
            "istio DNS capture is turned ON and DNS lookup table is not ready yet",
        );
        let dns = crate::dns::DnsProxy::new(
            &config.pod_namespace,
            crate::dns::upstreams_from(&resolv),
            Some(guard),
        );
        let udp = tokio::net::UdpSocket::bind(config.dns_proxy_addr)
            .await
            .with_context(|| format!("cannot listen for DNS (UDP) on {}", config.dns_proxy_addr))?;
        let tcp = tokio::net::TcpListener::bind(config.dns_proxy_addr)
            .await
            .with_context(|| format!("cannot listen for DNS (TCP) on {}", config.dns_proxy_addr))?;
        tokio::spawn(dns.clone().serve_udp(udp));
        tokio::spawn(dns.clone().serve_tcp(tcp));
        tracing::info!(target: "dns", "DNS proxy listening on {} (UDP and TCP)", config.dns_proxy_addr);
        nds = Some(Arc::new(move |any| dns.update(any)));
    }

    // 3. The xDS proxy Envoy connects to.
    let xds_listener = bind_uds(&config.xds_socket).with_context(|| {
        format!(
            "cannot listen on the xDS proxy socket {}",
            config.xds_socket.display()
        )
    })?;
    let xds = crate::xds_proxy::XdsProxy::new(config.clone(), secrets.clone(), nds).into_service();
    let rx = shutdown_rx.clone();
    tasks.spawn(async move {
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(std::time::Duration::from_secs(10)))
            .add_service(xds)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(xds_listener),
                shutdown_signal(rx),
            )
            .await
            .context("xDS proxy")
    });
    tracing::info!(target: "xdsproxy", "xDS proxy listening on {:?}, forwarding to {}", config.xds_socket, config.discovery_address);

    // 4. The bootstrap, then Envoy.
    let bootstrap = crate::agent_bootstrap::write(&config, run.log_as_json)?;
    let generated = config
        .proxy
        .custom_config_file
        .as_deref()
        .is_none_or(str::is_empty);
    let mut envoy_options = config.envoy.clone();
    envoy_options.config_file = bootstrap.clone();
    let child = crate::envoy::spawn(&envoy_options)?;
    crate::envoy::spawn_zombie_reaper(child.id());
    let (stops, stop_rx) = mpsc::channel(4);
    let drained = Arc::new(AtomicBool::new(false));
    let settings = DrainSettings {
        admin_port: config.proxy.admin_port(),
        inbound_only: config.proxy_type == "sidecar",
        termination_drain_duration: config.proxy.termination_drain_duration(),
        exit_on_zero_active_connections: config.exit_on_zero_active_connections,
        minimum_drain_duration: config.minimum_drain_duration,
        excluded_ports: vec![
            config.envoy_status_port,
            config.envoy_prometheus_port,
            config.envoy_secure_metrics_port,
            config.envoy_secure_merged_metrics_port,
        ],
    };
    let done = tokio::spawn(crate::envoy::supervise(
        child,
        settings,
        stop_rx,
        drained.clone(),
    ));
    tokio::spawn(release_memory_after_work(secrets.clone()));

    Ok(Bound {
        sds_socket: config.sds_socket.clone(),
        secrets,
        status_addr,
        lifecycle,
        shutdown,
        tasks,
        envoy: EnvoyRun {
            stops,
            done,
            bootstrap: generated.then_some(bootstrap),
            drained,
            admin_port: config.proxy.admin_port(),
        },
    })
}

/// How long after a certificate is published the agent gives back the memory
/// that work touched: long enough for Envoy to take it over SDS and for the
/// xDS proxy's first exchange, which follow start-up.
const RELEASE_DELAY: std::time::Duration = std::time::Duration::from_secs(5);

/// After start-up (the first certificate) and after each rotation, gives
/// back the pages that work touched and the steady agent does not
/// ([`crate::footprint`]).
async fn release_memory_after_work(mut secrets: SecretWatch) {
    while secrets.changed().await.is_ok() {
        tokio::time::sleep(RELEASE_DELAY).await;
        match tokio::task::spawn_blocking(crate::footprint::release).await {
            Ok(Ok(r)) => tracing::debug!(
                "released {} KiB of read-only mappings ({} mappings) and trimmed the heap",
                r.file_kib,
                r.mappings
            ),
            Ok(Err(e)) => tracing::debug!("cannot release memory: {e}"),
            Err(e) => tracing::debug!("releasing memory failed: {e}"),
        }
    }
}
