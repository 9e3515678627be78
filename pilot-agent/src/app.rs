//! The composition root of `pilot-agent proxy`: starts each part from its
//! part of the `Config` in Istio's start-up order (status server, SDS and
//! certificates, DNS proxy, xDS proxy, bootstrap and Envoy), one function
//! each, then supervises until Envoy exits or the Pod stops.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio_stream::wrappers::UnixListenerStream;

use crate::config::Config;
use crate::envoy::{Ended, Stop};
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
    /// Envoy's admin address, for `POST /drain`.
    admin: SocketAddr,
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
    servers: Servers,
    envoy: EnvoyRun,
}

impl Bound {
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
                    // stop Envoy at once on the SIGTERM that follows (the
                    // supervisor reads the request from the lifecycle).
                    if let Err(e) = crate::envoy::drain_listeners(self.envoy.admin, true, true).await {
                        tracing::warn!(target: "envoy", "drain requested, but draining failed: {e}");
                    }
                }
                Some(res) = self.servers.tasks.join_next() => {
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
        self.servers.stop().await;
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

/// The agent's own servers (status, SDS, xDS proxy): their tasks, and the
/// signal that stops them all.
struct Servers {
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<anyhow::Result<()>>,
}

impl Servers {
    fn new() -> Self {
        Self {
            shutdown: watch::channel(false).0,
            tasks: JoinSet::new(),
        }
    }

    /// Completes when the servers are told to stop.
    fn stopping(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.shutdown.subscribe();
        async move {
            let _ = rx.wait_for(|v| *v).await;
        }
    }

    fn spawn(&mut self, server: impl Future<Output = anyhow::Result<()>> + Send + 'static) {
        self.tasks.spawn(server);
    }

    /// Tells every server to stop and waits for them.
    async fn stop(mut self) {
        self.shutdown.send_replace(true);
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Starts the agent's parts and Envoy, in Istio's order: the status server
/// (so `/healthz/ready` answers 503 meanwhile), SDS and the workload
/// certificate, the DNS proxy, the xDS proxy, then the bootstrap and Envoy.
pub async fn build(config: Arc<Config>, run: RunOptions) -> anyhow::Result<Bound> {
    common::tls::install_crypto_provider();
    let mut servers = Servers::new();
    let lifecycle = Arc::new(Lifecycle::new());
    let (status_addr, registry) = start_status(&config, &lifecycle, &mut servers).await?;
    let secrets = start_sds(&config, &lifecycle, &mut servers).await?;
    start_telemetry(&config, &run, &registry, &mut servers)?;
    let nds = start_dns(&config, &lifecycle).await?;
    start_xds_proxy(&config, secrets.clone(), nds, &mut servers)?;
    let envoy = start_envoy(&config, &run, &lifecycle)?;
    tokio::spawn(release_memory_after_work(secrets.clone()));
    Ok(Bound {
        sds_socket: config.identity.sds_socket.clone(),
        secrets,
        status_addr,
        lifecycle,
        servers,
        envoy,
    })
}

/// Step 1: the status server on `statusPort`; returns its address and the
/// registry it merges into `/stats/prometheus`.
async fn start_status(
    config: &Config,
    lifecycle: &Arc<Lifecycle>,
    servers: &mut Servers,
) -> anyhow::Result<(SocketAddr, prometheus::Registry)> {
    let status = Arc::new(
        StatusState::new(
            StatusOptions {
                status_port: config.status.port,
                admin_port: config.envoy.proxy_config.admin_port(),
                envoy_prometheus_port: config.envoy.ports.prometheus,
                instance_ip: config.pod.ips.first().cloned().unwrap_or_default(),
                ipv6: config.pod.all_ipv6(),
                app_probers: config.status.app_probers.clone(),
                scrape_targets: config.status.scrape_targets.clone(),
                started_at: Some(std::time::Instant::now()),
                ..Default::default()
            },
            lifecycle.clone(),
        )
        .context("status server configuration")?,
    );
    let port = config.status.port;
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port)))
        .await
        .with_context(|| format!("cannot listen on the status port {port}"))?;
    let addr = listener.local_addr()?;
    // Istio closes :15020 as soon as the agent terminates, so kubelet's
    // probes through Envoy's :15021 fail from then on.
    let terminated = {
        let (lifecycle, stopping) = (lifecycle.clone(), servers.stopping());
        async move {
            tokio::select! {
                _ = lifecycle.terminated() => {}
                _ = stopping => {}
            }
        }
    };
    let registry = status.registry().clone();
    servers.spawn(async move {
        crate::status::serve(listener, status, terminated)
            .await
            .context("status server")
    });
    Ok((addr, registry))
}

/// Step 2b: the access log service Envoy streams requests and connections
/// to; Istio's standard metrics it keeps are merged on `/stats/prometheus`.
fn start_telemetry(
    config: &Config,
    run: &RunOptions,
    registry: &prometheus::Registry,
    servers: &mut Servers,
) -> anyhow::Result<()> {
    let options = crate::agent_bootstrap::options(config, run.log_as_json)?;
    let metadata = common::NodeMetadata::from_json_object(options.metadata);
    let local = crate::telemetry::labels::Peer::local(&metadata);
    let metrics = Arc::new(
        crate::telemetry::StandardMetrics::register(registry, local).context("standard metrics")?,
    );
    let socket = Path::new(common::istio_stats::ALS_SOCKET);
    let listener = bind_uds(socket).with_context(|| {
        format!(
            "cannot listen on the access log socket {}",
            socket.display()
        )
    })?;
    let als = crate::telemetry::AlsServer::new(metrics).into_service();
    let stopping = servers.stopping();
    servers.spawn(async move {
        tonic::transport::Server::builder()
            .add_service(als)
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stopping)
            .await
            .context("access log service")
    });
    tracing::info!(target: "telemetry", "access log service for standard metrics listening on {:?}", socket);
    Ok(())
}

/// Step 2: the secret manager and the SDS server Envoy takes certificates from;
/// returns the published workload secret.
/// Readiness fails once the workload certificate has expired, with the CA's
/// last error ([`crate::secret_manager::check_certificate`]).
async fn start_sds(
    config: &Arc<Config>,
    lifecycle: &Lifecycle,
    servers: &mut Servers,
) -> anyhow::Result<SecretWatch> {
    let socket = &config.identity.sds_socket;
    // An external SDS server on the well-known socket is not supported; a
    // dead socket is stale and removed.
    if socket.exists() {
        if sds_socket_is_live(socket).await {
            anyhow::bail!(
                "an SDS server is already listening on {}; serving workload certificates from an external SDS server is not supported by this agent",
                socket.display()
            );
        }
        tracing::info!(target: "sds", "removing stale SDS socket {}", socket.display());
    } else if !config.identity.sds_socket_is_default() {
        anyhow::bail!(
            "WORKLOAD_IDENTITY_SOCKET_FILE names {} but no SDS server listens there",
            socket.display()
        );
    }
    let manager = SecretManager::start(config.clone()).context("starting the secret manager")?;
    let secrets = manager.watch();
    let health = manager.clone();
    lifecycle.add_readiness_check("workload certificate", move || {
        health
            .check_certificate()
            .map_err(|e| crate::lifecycle::NotReady(e.to_string()))
    });
    let listener = bind_uds(socket)
        .with_context(|| format!("cannot listen on the SDS socket {}", socket.display()))?;
    let sds = SdsServer::new(secrets.clone()).into_service();
    let stopping = servers.stopping();
    servers.spawn(async move {
        tonic::transport::Server::builder()
            .add_service(sds)
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stopping)
            .await
            .context("SDS server")
    });
    tracing::info!(target: "sds", "SDS server for workload certificates started, listening on {:?}", socket);
    Ok(secrets)
}

/// Whether something accepts connections on the SDS socket within a second.
async fn sds_socket_is_live(socket: &Path) -> bool {
    tokio::time::timeout(
        std::time::Duration::from_secs(1),
        tokio::net::UnixStream::connect(socket),
    )
    .await
    .is_ok_and(|r| r.is_ok())
}

/// Step 3: the DNS proxy (`ISTIO_META_DNS_CAPTURE`), fed by the name table the
/// xDS proxy takes from istiod; returns the xDS proxy's handler for it.
async fn start_dns(
    config: &Config,
    lifecycle: &Lifecycle,
) -> anyhow::Result<Option<crate::xds_proxy::NdsHandler>> {
    if !config.dns.capture {
        return Ok(None);
    }
    let addr = config.dns.addr;
    let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let guard = lifecycle
        .readiness_pending("istio DNS capture is turned ON and DNS lookup table is not ready yet");
    let dns = crate::dns::DnsProxy::new(
        &config.pod.namespace,
        crate::dns::upstreams_from(&resolv),
        Some(guard),
    );
    let udp = tokio::net::UdpSocket::bind(addr)
        .await
        .with_context(|| format!("cannot listen for DNS (UDP) on {addr}"))?;
    let tcp = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for DNS (TCP) on {addr}"))?;
    tokio::spawn(dns.clone().serve_udp(udp));
    tokio::spawn(dns.clone().serve_tcp(tcp));
    tracing::info!(target: "dns", "DNS proxy listening on {addr} (UDP and TCP)");
    Ok(Some(Arc::new(move |any| dns.update(any))))
}

/// Step 4: the xDS proxy Envoy connects to.
fn start_xds_proxy(
    config: &Arc<Config>,
    secrets: SecretWatch,
    nds: Option<crate::xds_proxy::NdsHandler>,
    servers: &mut Servers,
) -> anyhow::Result<()> {
    let socket = &config.xds_proxy.socket;
    let listener = bind_uds(socket)
        .with_context(|| format!("cannot listen on the xDS proxy socket {}", socket.display()))?;
    let mut xds = crate::xds_proxy::XdsProxy::new(config.clone(), secrets, nds);
    if let Some(check) = &config.xds_proxy.health_check {
        let (tx, rx) = tokio::sync::watch::channel(None);
        tokio::spawn(crate::health_check::run(check.clone(), tx));
        xds = xds.with_health(rx);
    }
    let xds = xds.into_service();
    let stopping = servers.stopping();
    let keepalive = config.xds_proxy.keepalive;
    servers.spawn(async move {
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(keepalive.interval))
            .http2_keepalive_timeout(Some(keepalive.timeout))
            .add_service(xds)
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stopping)
            .await
            .context("xDS proxy")
    });
    tracing::info!(target: "xdsproxy", "xDS proxy listening on {:?}, forwarding to {}", socket, config.xds_proxy.discovery_address);
    Ok(())
}

/// Step 5: the bootstrap, then Envoy under supervision.
fn start_envoy(
    config: &Config,
    run: &RunOptions,
    lifecycle: &Arc<Lifecycle>,
) -> anyhow::Result<EnvoyRun> {
    let bootstrap = crate::agent_bootstrap::write(config, run.log_as_json)?;
    let generated = config
        .envoy
        .proxy_config
        .custom_config_file
        .as_deref()
        .is_none_or(str::is_empty);
    let mut options = config.envoy.options.clone();
    options.config_file = bootstrap.clone();
    let child = crate::envoy::spawn(&options)?;
    crate::envoy::spawn_zombie_reaper(child.id());
    let (stops, stop_rx) = mpsc::channel(4);
    let drain = config.envoy.drain.clone();
    let admin = drain.admin;
    let done = tokio::spawn(crate::envoy::supervise(
        child,
        drain,
        stop_rx,
        lifecycle.clone(),
    ));
    Ok(EnvoyRun {
        stops,
        done,
        bootstrap: generated.then_some(bootstrap),
        admin,
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
