//! The composition root of `pilot-agent proxy`: builds each part from the
//! `Config`, in Istio's start-up order, and returns what is bound.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::config::Config;
use crate::sds::{SdsServer, bind_uds};
use crate::secret_manager::{SecretManager, SecretWatch};

/// The running agent.
pub struct Bound {
    /// The SDS socket path.
    pub sds_socket: PathBuf,
    /// The workload secret as it is published.
    pub secrets: SecretWatch,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<anyhow::Result<()>>,
}

impl Bound {
    /// Stops the servers.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
    }

    /// Runs until SIGTERM/SIGINT or a server failure.
    pub async fn wait_termination(mut self) -> anyhow::Result<()> {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let result = tokio::select! {
            _ = term.recv() => { tracing::info!("received signal: terminated"); Ok(()) }
            _ = tokio::signal::ctrl_c() => { tracing::info!("received signal: interrupt"); Ok(()) }
            Some(res) = self.tasks.join_next() => match res {
                Ok(Ok(())) => Err(anyhow::anyhow!("a server stopped unexpectedly")),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(anyhow::anyhow!("a server task failed: {e}")),
            },
        };
        self.shutdown().await;
        result
    }
}

/// Starts the agent's parts.
pub async fn build(config: Arc<Config>) -> anyhow::Result<Bound> {
    common::tls::install_crypto_provider();
    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();

    // Istio: a live socket at the well-known path belongs to an external SDS
    // server (e.g. SPIRE); a dead one is stale and removed. A non-default
    // socket name means an external server is required.
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
    let mut rx = shutdown_rx.clone();
    tasks.spawn(async move {
        tonic::transport::Server::builder()
            .add_service(sds)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                async move {
                    let _ = rx.wait_for(|v| *v).await;
                },
            )
            .await
            .context("SDS server")
    });
    tracing::info!(target: "sds", "SDS server for workload certificates started, listening on {:?}", config.sds_socket);

    Ok(Bound {
        sds_socket: config.sds_socket.clone(),
        secrets,
        shutdown,
        tasks,
    })
}
